"""Test-wide settings: the folders' markers, no network, wandb offline, the integration-test switch.

tests/unit        no tracker package (wandb, tensorboard, mlflow, trackio) and no framework (TRL, torch, veRL,
                  OpenRLHF) is imported: marked ``unit`` (``pytest -m unit`` is the quick run)
tests/trackers    write to or read from a real tracker: marked ``tracker``
tests/frameworks  run TRL/veRL/OpenRLHF code: marked ``framework``
tests/_support    helpers shared by the folders (imported as ``_support``: this file's folder is on sys.path)
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from _support import DATA

SHARED = DATA      # the public logs and framework inventories, copied into tests/data

FOLDER_MARKS = {"unit": "unit", "trackers": "tracker", "frameworks": "framework"}
MARKERS = [
    "unit: tests/unit: imports no tracker package and no framework (pytest -m unit is the quick run)",
    "tracker: tests/trackers: writes to or reads from a real tracker (wandb, TensorBoard, MLflow, Trackio)",
    "framework: tests/frameworks: runs TRL/veRL/OpenRLHF (or torch) code",
]

# Session-wide environment, set in pytest_configure (not when this file is imported) and restored in
# pytest_unconfigure. It has to be in place before any test module imports a tracker or a framework: wandb, mlflow
# and transformers read these when imported or first used. Never reach a hub or a hosted tracker from tests.
FORCED_ENV = {"WANDB_MODE": "offline", "WANDB_SILENT": "true",
              # the trackers of issue 22: offline, and no error reporting of their own (comet_ml ships Sentry)
              "SWANLAB_MODE": "offline", "CLEARML_OFFLINE_MODE": "1", "COMET_ERROR_TRACKING_ENABLE": "false",
              "COMET_DISABLE_AUTO_LOGGING": "1"}
DEFAULT_ENV = {
    "WANDB_DISABLE_GIT": "true",
    "WANDB_DISABLE_CODE": "true",
    "WANDB_CONSOLE": "off",
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "DISABLE_MLFLOW_INTEGRATION": "TRUE",
    "MLFLOW_ALLOW_FILE_STORE": "true",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "GIT_PYTHON_REFRESH": "quiet",
    "TOKENIZERS_PARALLELISM": "false",
    "VERL_USE_EXTERNAL_PLUGINS": "none",
}
_ENV_PATCH: pytest.MonkeyPatch | None = None


def pytest_configure(config):
    global _ENV_PATCH
    for line in MARKERS:
        config.addinivalue_line("markers", line)
    _ENV_PATCH = pytest.MonkeyPatch()
    for k, v in FORCED_ENV.items():
        _ENV_PATCH.setenv(k, v)
    for k, v in DEFAULT_ENV.items():
        if k not in os.environ:
            _ENV_PATCH.setenv(k, v)
    # Keep what trackbridge, wandb and wandb-core write outside the test folders (the migration ledger, wandb's
    # cache/config/data, wandb-core's debug logs) out of the home folder too.
    scratch = Path(tempfile.mkdtemp(prefix="trackbridge-tests-"))
    for k, sub in (("TRACKBRIDGE_STATE_DIR", "state"), ("XDG_CACHE_HOME", "xdg-cache"),
                   ("WANDB_CONFIG_DIR", "wandb-config"), ("WANDB_DATA_DIR", "wandb-data"),
                   ("WANDB_CACHE_DIR", "wandb-cache"), ("SWANLAB_ROOT", "swanlab"),
                   ("SWANLAB_CONFIG_DIR", "swanlab-config"), ("CLEARML_CACHE_DIR", "clearml-cache"),
                   ("COMET_OFFLINE_DIRECTORY", "comet-offline")):
        if k not in os.environ:
            _ENV_PATCH.setenv(k, str(scratch / sub))


def pytest_unconfigure(config):
    global _ENV_PATCH
    if _ENV_PATCH is not None:
        _ENV_PATCH.undo()
        _ENV_PATCH = None


def pytest_addoption(parser):
    parser.addoption("--skip-integration", action="store_true", default=False,
                     help="skip tests that run real TRL trainers (also: TRACKBRIDGE_SKIP_INTEGRATION=1)")
    parser.addoption("--check-unit-imports", action="store_true", default=False,
                     help="fail the session if a tracker package or a framework was imported (what `pytest -m unit` "
                          "promises; tests/unit/test_unit_imports.py)")


def pytest_ignore_collect(collection_path, config):
    """``-m unit`` does not even import the other folders' modules (they import trackers and frameworks when
    collected): the quick run needs neither."""
    if (config.getoption("markexpr") or "").strip() != "unit":
        return None
    tests = Path(__file__).resolve().parent
    try:
        folder = Path(collection_path).resolve().relative_to(tests).parts[:1]
    except ValueError:
        return None
    return True if folder and folder[0] in ("trackers", "frameworks") else None


def pytest_collection_modifyitems(config, items):
    tests = Path(__file__).resolve().parent
    for item in items:          # unit / tracker / framework, from the folder under tests/ the test lives in
        try:
            folder = Path(str(item.path)).resolve().relative_to(tests).parts[0]
        except ValueError:
            continue
        if folder in FOLDER_MARKS:
            item.add_marker(FOLDER_MARKS[folder])
    skip = config.getoption("--skip-integration") or os.environ.get("TRACKBRIDGE_SKIP_INTEGRATION") == "1"
    if not skip:
        return
    marker = pytest.mark.skip(reason="integration tests skipped (--skip-integration / TRACKBRIDGE_SKIP_INTEGRATION=1)")
    for item in items:
        if "integration" in item.keywords:
            item.add_marker(marker)


@pytest.fixture(scope="session")
def shared_reference():
    """Path of tests/data (the frameworks' inventories and the public logs, with their origin in its README)."""
    return SHARED


@pytest.fixture(scope="module")
def wandb_env(tmp_path_factory):
    """Keep wandb's own cache/config/log files (and anything else under XDG_CACHE_HOME) inside the test's
    temporary folder, for the tests of one module."""
    home = tmp_path_factory.mktemp("wandb-home")
    saved = {k: os.environ.get(k) for k in ("WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR",
                                                 "XDG_CACHE_HOME")}
    for k in saved:
        os.environ[k] = str(home / k.lower())
    yield home
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


# -- the fault matrix (issue 12): cells record points written and points read back; with TRACKBRIDGE_FAULT_MATRIX=FILE
# the session writes them as a Markdown table (the README's table is made this way) -------------------------------
FAULT_CELLS: list[tuple[str, str, int, int]] = []


@pytest.fixture
def fault_cell():
    """``fault_cell(cell, tracker, points_written, points_read_back)``: one cell of the fault matrix."""
    def record(cell: str, tracker: str, written: int, read_back: int) -> None:
        FAULT_CELLS.append((cell, tracker, int(written), int(read_back)))
    return record


def pytest_sessionfinish(session, exitstatus):
    if session.config.getoption("--check-unit-imports"):
        from _support.unit_imports import imported
        bad = imported()
        print(f"\nUNIT-IMPORTS: {', '.join(bad) if bad else 'no tracker package or framework imported'}")
        if bad:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
    out = os.environ.get("TRACKBRIDGE_FAULT_MATRIX")
    if not out or not FAULT_CELLS:
        return
    lines = ["| cell | tracker | points written | points read back |", "|---|---|---:|---:|"]
    for cell, tracker, written, read_back in FAULT_CELLS:
        lines.append(f"| {cell} | {tracker} | {written:,} | {read_back:,} |")
    Path(out).write_text("\n".join(lines) + "\n", encoding="utf-8")
