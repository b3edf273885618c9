# Two commands do all the set-up on a fresh machine with Python 3.11 and make:
#   make demo   - create .venv if missing, install, run the demo on the embedded default, print where the output is
#   make test   - create .venv if missing, install (test extras, pinned torch/trl), lint (mappings, ruff, mypy), run the
#                 whole test suite
# Flags: make test PYTEST_ARGS="--skip-integration"   (skip the slow real-TRL tests locally)
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
OUT    ?= out/demo
PYTEST_ARGS ?=

.PHONY: demo test bench docs lint clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.demo-installed: $(BIN)/python pyproject.toml
	$(BIN)/pip install -q -e '.[all]'
	touch $@

$(VENV)/.test-installed: $(BIN)/python pyproject.toml constraints.txt
	$(BIN)/pip install -q -c constraints.txt -e '.[dev,trl]'
	$(BIN)/pip install -q -c constraints.txt ray tensordict omegaconf codetiming && $(BIN)/pip install -q --no-deps -c constraints.txt verl==0.9.1 openrlhf==0.11.2 areal==1.0.4 colorlog
	touch $@ $(VENV)/.demo-installed

demo: $(VENV)/.demo-installed
	$(BIN)/python -m trackbridge demo --out $(OUT)

test: lint
	$(BIN)/python -m pytest $(PYTEST_ARGS)

bench: $(VENV)/.test-installed
	$(BIN)/python benchmarks/run_all.py

docs: $(VENV)/.demo-installed
	$(BIN)/python -m trackbridge mappings docs --out docs/metrics.md

lint: $(VENV)/.test-installed
	$(BIN)/python -m trackbridge mappings lint
	$(BIN)/ruff check trackbridge benchmarks tests
	$(BIN)/mypy

clean:
	rm -rf $(VENV) out build *.egg-info
