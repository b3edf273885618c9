"""Fixtures of the tracker tests (tests/trackers, marked ``tracker`` by tests/conftest.py)."""
from __future__ import annotations

import pytest


@pytest.fixture
def env(tmp_path, monkeypatch):
    """Per-test ledger and wandb cache folders."""
    monkeypatch.setenv("TRACKBRIDGE_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    return tmp_path
