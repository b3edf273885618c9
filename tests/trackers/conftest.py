"""Fixtures of the tracker tests (tests/trackers, marked ``tracker`` by tests/conftest.py)."""
from __future__ import annotations

import pytest


@pytest.fixture
def env(tmp_path, monkeypatch):
    """Per-test ledger and wandb cache folders."""
    monkeypatch.setenv("TRACKBRIDGE_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    return tmp_path


@pytest.fixture(scope="module")
def _module_mlflow_server(tmp_path_factory):
    from _support.mlflow_server import MlflowServer
    with MlflowServer(tmp_path_factory.mktemp("mlflow-server")) as srv:
        yield srv


@pytest.fixture
def mlflow_server(_module_mlflow_server):
    """A real ``mlflow server`` (SQLite store) shared by the tests of one module: started once, and running when
    each test starts (restarted if an earlier test killed it). Keep to experiment names or run ids of your own, and
    count what you wrote from what the store held before. ``.url``, ``.db``, ``.kill()``, ``.start()``: see
    tests/_support/mlflow_server.py."""
    return _module_mlflow_server.ensure_running()


@pytest.fixture(scope="module")
def mlflow_template(tmp_path_factory):
    """An empty MLflow SQLite store made once per module: each test copies it (creating one costs seconds)."""
    from trackbridge.trackers.mlflow.store import create_sqlite_store
    db = tmp_path_factory.mktemp("mlflow-template") / "ml.db"
    create_sqlite_store(db)
    return db
