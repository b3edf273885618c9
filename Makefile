# Two commands do all the set-up on a fresh machine with Python 3.11 and make:
#   make demo   - create .venv if missing, install, run the demo on the embedded default, print where the output is
#   make test   - create .venv if missing, install (test extras, pinned torch/trl), lint (mappings, ruff, mypy), run the
#                 whole test suite
#   make test-quick - the unit tests alone (no tracker, no framework, no browser; two workers, a few minutes),
#                     installing only what they need: the core, the [tensorboard,plot,pandas] extras and the test
#                     tools (a new venv takes about a minute; the tests of a tracker's package skip, naming it)
#   make lock       - rebuild constraints-lock.txt (every package of the test environment pinned) from a scratch
#                     venv installed with constraints.txt alone; run after changing constraints.txt or the
#                     dependencies, then regenerate the proofs (python tests/_support/fidelity_proofs.py)
#   make smoke      - build the sdist and the wheel, install the wheel into fresh venvs ([all], and the core alone)
#                     and run every command from there (tests/install; make test runs it too)
# Flags: make test PYTEST_ARGS="--skip-integration"   (skip the slow real-TRL tests locally)
#        make test PYTEST_WORKERS=0                    (one process; default 3, pytest-xdist: on two cores a third
#                                                       of the suite's time is spent waiting on servers and
#                                                       child processes, which a third worker fills)
#        make test-quick QUICK_WORKERS=0               (one process; default 2: the unit tests only compute)
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
OUT    ?= out/demo
PYTEST_ARGS ?=
PYTEST_WORKERS ?= 3
QUICK_WORKERS ?= 2
LOCK   ?= constraints-lock.txt
PIP_C  := -c constraints.txt $(if $(LOCK),-c $(LOCK))

.PHONY: demo test test-quick smoke bench docs lint lock clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.demo-installed: $(BIN)/python pyproject.toml
	$(BIN)/pip install -q -e '.[all]'
	touch $@

# what tests/unit needs: it imports no tracker package and no framework (tests/_support/unit_imports.py); the
# tensorboard extra's protobuf writes and reads event files, plot draws the report
QUICK_PKGS := pytest pytest-xdist hypothesis jsonschema colorlog
$(VENV)/.quick-installed: $(BIN)/python pyproject.toml constraints.txt $(LOCK)
	$(BIN)/pip install -q $(PIP_C) -e '.[tensorboard,plot,pandas]' $(QUICK_PKGS)
	touch $@

$(VENV)/.test-installed: $(BIN)/python pyproject.toml constraints.txt $(LOCK) tests/releases.txt
	$(BIN)/pip install -q $(PIP_C) -e '.[dev,trl,lightning]'
	$(BIN)/pip install -q $(PIP_C) ray tensordict omegaconf codetiming hydra-core && $(BIN)/pip install -q --no-deps $(PIP_C) verl==0.9.1 openrlhf==0.11.2 areal==1.0.4 colorlog
	TRACKBRIDGE_RELEASES=$(VENV)/releases $(BIN)/python tests/_support/releases.py install    # older releases, for their proofs
	touch $@ $(VENV)/.demo-installed $(VENV)/.quick-installed

demo: $(VENV)/.demo-installed
	$(BIN)/python -m trackbridge demo --out $(OUT)

test: lint
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) $(PYTEST_ARGS)

test-quick: $(VENV)/.quick-installed
	$(BIN)/python -m pytest -n $(QUICK_WORKERS) -q -m "unit and not browser" --check-unit-imports tests/unit $(PYTEST_ARGS)

smoke: $(VENV)/.test-installed
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) -q tests/install $(PYTEST_ARGS)

bench: $(VENV)/.test-installed
	$(BIN)/python benchmarks/run_all.py

docs: $(VENV)/.demo-installed
	$(BIN)/python -m trackbridge mappings docs --out docs/metrics.md

lint: $(VENV)/.test-installed
	$(BIN)/python -m trackbridge mappings lint --require-reduction     # every shipped entry states its reduction (issue 20)
	$(BIN)/ruff check trackbridge benchmarks tests
	$(BIN)/mypy

lock:
	rm -rf .venv-lock
	$(MAKE) VENV=.venv-lock LOCK= .venv-lock/.test-installed
	{ sed -n '/^#/p' $(LOCK); .venv-lock/bin/pip freeze --exclude-editable | sed -E 's/\+cpu$$//; s/^([A-Za-z0-9_.-]+) @ .*$$/\1/'; } > $(LOCK).new
	mv $(LOCK).new $(LOCK) && rm -rf .venv-lock

clean:
	rm -rf $(VENV) out build *.egg-info
