"""tests/unit imports no tracker package and no framework, so ``pytest -m unit`` runs without them (README, tests).

Two checks: no test file under tests/unit names one of them in an import or an ``importorskip`` (anywhere, also inside
a function), and collecting ``pytest -m unit`` in a fresh interpreter (which imports every unit test module and
conftest, and not the other folders': tests/conftest.py) leaves none of them in sys.modules
(``--check-unit-imports``, which also works on a full ``pytest -m unit`` run)."""
from __future__ import annotations

import ast
import os
import subprocess
import sys

import pytest

from _support import ROOT
from _support.unit_imports import FORBIDDEN

UNIT = ROOT / "tests" / "unit"


def _named(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in (
                "importorskip", "import_module", "__import__") and node.args \
                and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
            names = [node.args[0].value]
        found += [(node.lineno, n) for n in names if n.split(".")[0] in FORBIDDEN]
    return found


@pytest.mark.parametrize("path", sorted(UNIT.rglob("*.py")), ids=lambda p: p.name)
def test_no_unit_test_file_imports_a_tracker_or_framework(path):
    assert _named(ast.parse(path.read_text(encoding="utf-8"))) == []


def test_the_scan_finds_what_it_looks_for():
    code = "import wandb\nfrom mlflow.tracking import MlflowClient\ndef f():\n    pytest.importorskip('torch')\n"
    assert _named(ast.parse(code)) == [(1, "wandb"), (2, "mlflow.tracking"), (4, "torch")]


def test_collecting_the_unit_tests_imports_none_of_them():
    """``pytest -m unit`` from the repository, collection only."""
    r = subprocess.run([sys.executable, "-m", "pytest", "-m", "unit", "--collect-only", "-q",
                        "-p", "no:cacheprovider", "--check-unit-imports"],
                       cwd=str(ROOT), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "UNIT-IMPORTS: no tracker package or framework imported" in r.stdout, r.stdout[-3000:]


def test_a_worker_that_imports_one_fails_the_parallel_run():
    """``make test-quick`` runs on pytest-xdist workers: what a worker imported reaches the controller, which fails
    the session. The conftest plants a package in worker gw1's ``sys.modules`` (TRACKBRIDGE_TEST_PLANT_IMPORT)."""
    r = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "-q", "-p", "no:cacheprovider",
                        "--check-unit-imports", "tests/unit/test_unit_imports.py", "-k", "the_scan_finds"],
                       cwd=str(ROOT), capture_output=True, text=True, timeout=300,
                       env={**os.environ, "TRACKBRIDGE_TEST_PLANT_IMPORT": "gw1:mlflow"})
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-3000:]
    assert "1 passed" in r.stdout and "UNIT-IMPORTS: mlflow" in r.stdout, r.stdout[-3000:]
