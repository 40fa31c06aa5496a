#!/usr/bin/env bash
# The installed package works, as a user gets it: build the wheel and the sdist as the README says (`python -m build`,
# with the `dev` extra's build, in a copy of the tree where `pip wheel .` ran first: it must leave no `build/` behind,
# which would shadow the build package), install the wheel (not editable) into a clean venv that already holds the
# locked torch, with pip resolving the rest from pyproject.toml's ranges (no lock, as in a user's environment), check
# that pip left that torch in place, then, from a directory outside the source tree, run the README's Python example
# and every example of every `--help` (scripts/help_examples.py: shipped configs by name, the tutorials copied out,
# small sizes where an example allows; those that need a GPU, a cluster or SmolLM2 only parse).
# Nothing here touches .venv. Usage: scripts/check_wheel.sh [WORKDIR] (default: a temporary directory, removed).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
PY=${PY:-python3.11}
TORCH=$(grep -E '^torch==' constraints.txt)
work=${1:-}
if [ -z "$work" ]; then work=$(mktemp -d); trap 'rm -rf "$work"' EXIT; fi
mkdir -p "$work"
export PIP_DISABLE_PIP_VERSION_CHECK=1

echo "--- build: wheel and sdist as the README says, after a pip wheel of the same tree"
$PY -m venv "$work/build-env"
dev=$("$work/build-env/bin/python" -c "import tomllib; print(' '.join(tomllib.load(open('pyproject.toml', 'rb'))
  ['project']['optional-dependencies']['dev']))")
case " $dev " in *" build"*) ;; *) echo "the dev extra ($dev) does not name build"; exit 1;; esac
"$work/build-env/bin/pip" install -q $dev  # the dev extra's tools (`pip install -e ".[dev]"` adds aspan itself)
rm -rf "$work/tree" "$work/dist" && mkdir -p "$work/tree"
git ls-files -co --exclude-standard -z | tar --null -T - -cf - | tar -xf - -C "$work/tree"  # tracked and new files
(
  cd "$work/tree"
  "$work/build-env/bin/pip" wheel -q --no-deps -w "$work/pip-wheel" . > "$work/pip-wheel.log" 2>&1 \
    || { tail -40 "$work/pip-wheel.log"; exit 1; }
  if [ -e build ]; then echo "pip wheel left ./build/, which shadows the build package"; exit 1; fi
  "$work/build-env/bin/python" -m build > "$work/build.log" 2>&1 || { tail -40 "$work/build.log"; exit 1; }
)
mv "$work/tree/dist" "$work/dist"
wheel=$(ls "$work"/dist/aspan-*-py3-none-any.whl)
sdist=$(ls "$work"/dist/aspan-*.tar.gz)
echo "built $(basename "$wheel") ($(du -h "$wheel" | cut -f1)) and $(basename "$sdist")"
# the wheel carries both packages, their py.typed markers, the shipped checkpoint, configs and tutorials, the licence
"$work/build-env/bin/python" - "$wheel" "$sdist" <<'EOF'
import pathlib, sys, tarfile, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
configs = sorted(p.relative_to("configs").as_posix() for p in pathlib.Path("configs").rglob("*.toml"))
notebooks = sorted(p.name for p in pathlib.Path("notebooks").glob("*.ipynb"))
need = ["aspan/__init__.py", "aspan/py.typed", "hooks/__init__.py", "hooks/py.typed",
        "aspan/checkpoints/reversal/config.json", "aspan/checkpoints/reversal/model.safetensors",
        *(f"aspan/configs/{c}" for c in configs), *(f"aspan/tutorials/{n}" for n in notebooks)]
missing = [n for n in need if n not in names]
assert not missing, f"the wheel lacks {missing}"
assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names), "the wheel lacks LICENSE"
assert not any(n.startswith(("tests/", "results/", "scripts/")) for n in names), "the wheel carries the repository"
sdist = {n.split("/", 1)[1] for n in tarfile.open(sys.argv[2]).getnames() if "/" in n}
assert {f"configs/{c}" for c in configs} | {f"notebooks/{n}" for n in notebooks} <= sdist, "the sdist lacks them"
print(f"the wheel carries {len(configs)} configs and {len(notebooks)} tutorial notebooks")
EOF

echo "--- install the wheel into a clean venv that already holds $TORCH"
$PY -m venv "$work/env"
"$work/env/bin/pip" install -q "$TORCH"
torch_state() { "$work/env/bin/python" -W ignore -c "import os, torch; print(torch.__version__, torch.__file__, os.stat(torch.__file__).st_mtime_ns)"; }
before=$(torch_state)
"$work/env/bin/pip" install -q "$wheel"
after=$(torch_state)
if [ "$before" != "$after" ]; then echo "pip replaced torch: $before -> $after"; exit 1; fi
echo "torch left in place: $after"
"$work/env/bin/python" -c "from importlib.metadata import version as v; print('installed: aspan', v('aspan'),
  '/ transformer-lens', v('transformer-lens'), '/ transformers', v('transformers'), '/ torch', v('torch'))"

echo "--- from outside the source tree: the README's Python example, every example of every --help"
run=$(mktemp -d)
"$work/env/bin/python" - "$root/README.md" "$run/example.py" <<'EOF'
import re, sys
text = open(sys.argv[1], encoding="utf-8").read()
block = re.search(r"^## Python example\n.*?^```python\n(.*?)^```", text, re.S | re.M)
assert block, "README.md has no Python example"
open(sys.argv[2], "w").write(block[1])
EOF
cd "$run"
where=$("$work/env/bin/python" -P -c "import aspan, hooks; print(aspan.__file__); print(hooks.__file__)")
case "$where" in "$root"*) echo "imported the source tree, not the wheel: $where"; exit 1;; esac
version=$(basename "$wheel" | cut -d- -f2)
test "$("$work/env/bin/aspan" --version)" = "aspan $version" || { echo "aspan --version is not $version"; exit 1; }
OMP_NUM_THREADS=1 "$work/env/bin/python" -P example.py
start=$SECONDS
"$work/env/bin/python" -P "$root/scripts/help_examples.py" --aspan "$work/env/bin/aspan" --dir "$run/examples" \
  > "$run/examples.log" 2>&1 || { grep -v "^ran " "$run/examples.log" | tail -60; exit 1; }
echo "help examples: $(grep -c "^ran " "$run/examples.log") ran, $(grep -c "^parsed " "$run/examples.log") only" \
  "parsed, in $((SECONDS - start)) s"
grep "^parsed " "$run/examples.log"
test -s "$run/examples/runs/demo/report.html"  # the demo's page, and the tutorials copied out
test -s "$run/examples/my-tutorials/01_tasks_and_references.ipynb"
cd "$root"; rm -rf "$run"
echo "the installed wheel works"
