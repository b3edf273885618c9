"""Test-wide settings: no network, wandb offline, the integration-test switch."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

# Never reach a hub or a hosted tracker from tests.
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("WANDB_DISABLE_GIT", "true")
os.environ.setdefault("WANDB_DISABLE_CODE", "true")
os.environ.setdefault("WANDB_CONSOLE", "off")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("DISABLE_MLFLOW_INTEGRATION", "TRUE")
os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
os.environ.setdefault("GIT_PYTHON_REFRESH", "quiet")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# Keep what trackbridge and wandb-core write outside the test folders (the migration ledger, wandb-core's debug
# logs) out of the home folder too.
_SCRATCH = tempfile.mkdtemp(prefix="trackbridge-tests-")
os.environ.setdefault("TRACKBRIDGE_STATE_DIR", os.path.join(_SCRATCH, "state"))
os.environ.setdefault("XDG_CACHE_HOME", os.path.join(_SCRATCH, "xdg-cache"))

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")   # every fact a test needs (README)
SHARED = DATA      # the public logs and framework inventories, copied into tests/data


def pytest_addoption(parser):
    parser.addoption("--skip-integration", action="store_true", default=False,
                     help="skip tests that run real TRL trainers (also: TRACKBRIDGE_SKIP_INTEGRATION=1)")


def pytest_collection_modifyitems(config, items):
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
    out = os.environ.get("TRACKBRIDGE_FAULT_MATRIX")
    if not out or not FAULT_CELLS:
        return
    lines = ["| cell | tracker | points written | points read back |", "|---|---|---:|---:|"]
    for cell, tracker, written, read_back in FAULT_CELLS:
        lines.append(f"| {cell} | {tracker} | {written:,} | {read_back:,} |")
    Path(out).write_text("\n".join(lines) + "\n", encoding="utf-8")
