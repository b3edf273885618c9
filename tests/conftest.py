"""Test-wide settings: the folders' markers, no network, wandb offline, the integration-test switch.

tests/unit        no tracker package (wandb, tensorboard, mlflow, trackio) and no framework (TRL, torch, veRL,
                  OpenRLHF) is imported: marked ``unit`` (``pytest -m unit`` is the quick run)
tests/trackers    write to or read from a real tracker: marked ``tracker``
tests/frameworks  run TRL/veRL/OpenRLHF code: marked ``framework``
tests/install     build the sdist and the wheel and run every command from fresh venvs: marked ``install``
tests/_support    helpers shared by the folders (imported as ``_support``: this file's folder is on sys.path)
"""
from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pytest

from _support import DATA

SHARED = DATA      # the public logs and framework inventories, copied into tests/data

FOLDER_MARKS = {"unit": "unit", "trackers": "tracker", "frameworks": "framework", "install": "install"}
MARKERS = [
    "unit: tests/unit: imports no tracker package and no framework (pytest -m unit is the quick run)",
    "tracker: tests/trackers: writes to or reads from a real tracker (wandb, TensorBoard, MLflow, Trackio)",
    "framework: tests/frameworks: runs TRL/veRL/OpenRLHF (or torch) code",
    "install: tests/install: builds the wheel and runs every command from fresh venvs ([all], and the core alone)",
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
    return True if folder and folder[0] in ("trackers", "frameworks", "install") else None


# -- pytest-xdist (make test: -n 3; --dist loadscope in pyproject.toml) --------------------------------------------
# Each test module runs on one worker, so its module-scoped fixtures (a real MLflow server, a matrix of logged runs,
# a store read by many tests) are built once. (xdist's --dist loadgroup would allow other groupings, but xdist 3.8
# marks the groups in Item._nodeid, which pytest 9.2 no longer reads: every test became its own group.) Modules go to
# the workers in collection order, the ones below first, longest first (measured, README "Tests"): a long module
# started last would leave one worker running it alone at the end. A module missing here is only scheduled later.
LONGEST_FIRST = [
    "trackers/test_logger_writer_faults.py",
    "frameworks/test_integrations_ray.py",
    "frameworks/test_integrations_by_name.py",
    "trackers/test_streaming_memory.py",
    "trackers/test_logger_outages.py",
    "install/test_wheel.py",
    "frameworks/test_integrations_wrappers.py",
    "frameworks/test_integrations_trl.py",
    "trackers/test_logger_outcome.py",
    "trackers/test_logger_poison.py",
    "trackers/test_bad_inputs.py",
    "install/test_core_only.py",
    "trackers/test_migrate_outages.py",
    "trackers/test_one_pipeline.py",
]


def pytest_collection_modifyitems(config, items):
    tests = Path(__file__).resolve().parent
    module: dict[int, str] = {}
    for item in items:          # unit / tracker / framework / install, from the folder under tests/ the test lives in
        try:
            rel = Path(str(item.path)).resolve().relative_to(tests)
        except ValueError:
            continue
        module[id(item)] = rel.as_posix()
        if rel.parts[0] in FOLDER_MARKS:
            item.add_marker(FOLDER_MARKS[rel.parts[0]])
    rank = {m: i for i, m in enumerate(LONGEST_FIRST)}
    order = {id(item): i for i, item in enumerate(items)}
    items.sort(key=lambda it: (rank.get(module.get(id(it), ""), len(rank)), order[id(it)]))
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
# the session writes them as a Markdown table (the README's table is made this way). Under pytest-xdist each worker
# writes its cells to FILE.<worker>.json and the controller merges them, in the order the tests were collected. ----
FAULT_CELLS: list[tuple[int, str, str, int, int]] = []


@pytest.fixture
def fault_cell(request):
    """``fault_cell(cell, tracker, points_written, points_read_back)``: one cell of the fault matrix."""
    def record(cell: str, tracker: str, written: int, read_back: int) -> None:
        order = request.session.items.index(request.node)      # the same in every worker (one collection)
        FAULT_CELLS.append((order, cell, tracker, int(written), int(read_back)))
    return record


WORKER_IMPORTS: set[str] = set()        # --check-unit-imports under pytest-xdist: what the workers imported


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """The controller (pytest-xdist): a worker's forbidden imports, which it sent when its session finished."""
    WORKER_IMPORTS.update(getattr(node, "workeroutput", {}).get("unit_imports", ()))


def pytest_sessionfinish(session, exitstatus):
    # this process's own xdist role (a pytest a test starts inherits the PYTEST_XDIST_WORKER of its worker)
    worker = getattr(session.config, "workerinput", {}).get("workerid")
    if session.config.getoption("--check-unit-imports"):
        from _support.unit_imports import imported
        # WORKER:PACKAGE, for test_unit_imports: the package is put in that worker's sys.modules
        where, _, package = os.environ.get("TRACKBRIDGE_TEST_PLANT_IMPORT", "").partition(":")
        if package and worker == where:
            import types
            sys.modules.setdefault(package, types.ModuleType(package))
        if worker:                          # the tests ran here: the controller judges what every worker imported
            session.config.workeroutput["unit_imports"] = imported()
        else:
            bad = sorted(set(imported()) | WORKER_IMPORTS)
            print(f"\nUNIT-IMPORTS: {', '.join(bad) if bad else 'no tracker package or framework imported'}")
            if bad:
                session.exitstatus = pytest.ExitCode.TESTS_FAILED
    out = os.environ.get("TRACKBRIDGE_FAULT_MATRIX")
    if not out:
        return
    import json
    if worker:                              # a worker: its cells, for the controller to merge
        Path(f"{out}.{worker}.json").write_text(json.dumps(FAULT_CELLS), encoding="utf-8")
        return
    cells = list(FAULT_CELLS)
    for part in sorted(Path(out).parent.glob(Path(out).name + ".gw*.json")):
        cells += [tuple(c) for c in json.loads(part.read_text(encoding="utf-8"))]
        part.unlink()
    if not cells:
        return
    cells.sort(key=lambda c: c[0])          # stable: a test's own cells keep their order
    lines = ["| cell | tracker | points written | points read back |", "|---|---|---:|---:|"]
    for _order, cell, tracker, written, read_back in cells:
        lines.append(f"| {cell} | {tracker} | {written:,} | {read_back:,} |")
    Path(out).write_text("\n".join(lines) + "\n", encoding="utf-8")


def _default_sigint() -> list[str]:
    """SIGINT as a user's shell gives it to a training script: handled (KeyboardInterrupt), not blocked."""
    import signal
    changed = []
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        changed.append("SIGINT ignored")
    if signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, []):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        changed.append("SIGINT blocked")
    return changed


@pytest.fixture(scope="session", autouse=True)
def _sigint_from_the_start():
    """A command started in the background by a non-interactive shell (``bash .ci/run &``, a CI runner) ignores
    SIGINT, and a child process inherits that (an ignored or blocked signal survives exec; a handler does not): every
    training script a test starts would be deaf to Ctrl-C, as no user's is (the Ctrl-C cells of
    test_logger_writer_faults.py then wait 60 s). Each test process starts with SIGINT as a shell gives it."""
    _default_sigint()
    yield


@pytest.fixture(autouse=True)
def _signals_as_a_shell_leaves_them(request):
    """A test that leaves SIGINT ignored or blocked in this process would do the same to every later child: put
    back after each test, and said with the test's name, so that the culprit shows."""
    import warnings
    yield
    try:
        changed = _default_sigint()
    except ValueError:          # not the main thread
        return
    if changed:
        warnings.warn(f"{request.node.nodeid} left {' and '.join(changed)} in the test process (put back)")


@pytest.fixture(autouse=True)
def _no_inherited_wandb_service():
    """wandb.init in this process puts its service's address in ``WANDB_SERVICE``; a child process a later test
    starts (the CLI, a training script, the writer process) would then use this process's wandb-core instead of its
    own, as no user's process does, and hang when that service ends. Each test starts without it."""
    os.environ.pop("WANDB_SERVICE", None)
    yield
