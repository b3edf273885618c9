"""The wheel smoke (tests/install, marked ``install``): trackbridge as users install it.

Once per session: ``python -m build`` makes the sdist and, from it, the wheel (so a file the sdist forgets fails
too); the wheel is installed, not editable, into two fresh virtual environments outside the checkout: one with
``[all]`` and one with the core alone (PyYAML). Every command then runs from a scratch folder with a clean
environment (no PYTHONPATH), so nothing of the checkout can be imported by accident; the venvs check that
``trackbridge`` comes from them. Helpers: tests/_support/install.py.

pip installs from its usual index and cache with ``constraints.txt``. Building and installing take about a minute
on an idle machine; ``make smoke`` runs this folder alone. Under xdist each module runs on one worker
(``--dist loadscope``): test_wheel.py builds the ``[all]`` venv, test_core_only.py the core one (each builds the
wheel, a few seconds), so the two run side by side.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from _support.install import Dist, Ran, Venv, build, make_venv


@pytest.fixture(scope="session")
def dist(tmp_path_factory) -> Dist:
    """The sdist and the wheel built from this checkout."""
    return build(tmp_path_factory.mktemp("dist"))


@pytest.fixture(scope="session")
def venv_all(dist, tmp_path_factory) -> Venv:
    """The wheel with ``[all]`` (every tracker and the charts), not editable."""
    return make_venv(tmp_path_factory.mktemp("venv-all"), f"trackbridge[all] @ {dist.wheel.as_uri()}")


@pytest.fixture(scope="session")
def venv_core(dist, tmp_path_factory) -> Venv:
    """The wheel alone: the core, PyYAML and nothing else."""
    return make_venv(tmp_path_factory.mktemp("venv-core"), f"trackbridge @ {dist.wheel.as_uri()}")


@pytest.fixture(scope="session")
def demo_out(venv_all) -> tuple[Path, Ran]:
    """``trackbridge demo`` run once in the ``[all]`` venv: its output folder and the command's result."""
    out = venv_all.work / "demo"
    return out, venv_all.tb("demo", "--out", out, timeout=600)
