#!/usr/bin/env bash
# The installed package works, as a user gets it: build the wheel and the sdist (`python -m build`, in a throwaway
# venv), install the wheel (not editable) into a clean venv that already holds the locked torch, with pip resolving
# the rest from pyproject.toml's ranges (no lock, as in a user's environment), check that pip left that torch in
# place, then, from a directory outside the source tree, run the README's Python example and `aspan demo --quick`.
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

echo "--- build: wheel and sdist"
$PY -m venv "$work/build-env"
"$work/build-env/bin/pip" install -q build
rm -rf "$work/dist"
"$work/build-env/bin/python" -m build --outdir "$work/dist" "$root" > "$work/build.log" 2>&1 || { tail -40 "$work/build.log"; exit 1; }
wheel=$(ls "$work"/dist/aspan-*-py3-none-any.whl)
sdist=$(ls "$work"/dist/aspan-*.tar.gz)
echo "built $(basename "$wheel") ($(du -h "$wheel" | cut -f1)) and $(basename "$sdist")"
# the wheel carries both packages, their py.typed markers, the shipped checkpoint and the licence
"$work/build-env/bin/python" - "$wheel" <<'EOF'
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
need = ["aspan/__init__.py", "aspan/py.typed", "hooks/__init__.py", "hooks/py.typed",
        "aspan/checkpoints/reversal/config.json", "aspan/checkpoints/reversal/model.safetensors"]
missing = [n for n in need if n not in names]
assert not missing, f"the wheel lacks {missing}"
assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names), "the wheel lacks LICENSE"
assert not any(n.startswith(("tests/", "results/", "scripts/")) for n in names), "the wheel carries the repository"
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

echo "--- from outside the source tree: the README's Python example, aspan demo --quick"
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
OMP_NUM_THREADS=1 TQDM_DISABLE=1 "$work/env/bin/aspan" demo --quick --device cpu --out "$run/demo" > "$run/demo.log" 2>&1 \
  || { tail -40 "$run/demo.log"; exit 1; }
test -s "$run/demo/report.html"
echo "demo --quick: $(grep -c . "$run/demo.log") lines of output, report.html $(du -h "$run/demo/report.html" | cut -f1)"
cd "$root"; rm -rf "$run"
echo "the installed wheel works"
