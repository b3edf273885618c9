"""A pytest plugin (``-p _support.unit_imports``) that fails the session if a tracker package or a framework was
imported: what ``pytest -m unit`` promises (tests/unit/test_unit_imports.py runs tests/unit with it)."""
from __future__ import annotations

import sys

import pytest

FORBIDDEN = ("wandb", "tensorboard", "tensorboardX", "tbparse", "mlflow", "trackio",
             "torch", "transformers", "trl", "verl", "openrlhf", "deepspeed")


def imported() -> list[str]:
    return sorted({m.split(".")[0] for m in sys.modules} & set(FORBIDDEN))


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus):
    bad = imported()
    if bad:
        sys.stderr.write(f"\nUNIT-IMPORTS: imported during the unit tests: {', '.join(bad)}\n")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    else:
        sys.stderr.write("\nUNIT-IMPORTS: no tracker package or framework imported\n")
