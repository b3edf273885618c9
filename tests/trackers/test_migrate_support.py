"""Shared helpers of the migration tests (tests/trackers/test_migrate_*.py), plus a few checks of the helpers
themselves.

* ``env`` fixture: every migration test gets its own ``TRACKBRIDGE_STATE_DIR`` (the ledger), wandb offline with
  ``XDG_CACHE_HOME``/``WANDB_CONFIG_DIR``/``WANDB_DATA_DIR`` in a temporary folder.
* :func:`location`: a fresh destination locator of one tracker kind. Creating an MLflow SQLite database runs
  MLflow's schema migrations (~4 s) and creating a Trackio project runs trackio in a child process (~1 s), so both
  are created once per test session and *copied* for each new location (an initialised, empty store).
* :func:`points`: every point of every run of a locator as ``{(run name, step, wall time, metric): value}``.
"""
from __future__ import annotations

import math
import os
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from trackbridge.record import Histogram, Record, RunInfo

from _support import ROOT

KINDS = ("tensorboard", "wandb", "mlflow", "trackio", "jsonl")
PY = sys.executable

_SESSION_TMP = Path(tempfile.mkdtemp(prefix="tb-migtest-"))
# wandb offline, hubs offline, scratch cache dirs: tests/conftest.py (pytest_configure), set before any
# test module imports a tracker

_TEMPLATES: dict[str, Path] = {}


def _mlflow_template() -> Path:
    if "mlflow" not in _TEMPLATES:
        d = _SESSION_TMP / "template-mlflow"
        d.mkdir(parents=True, exist_ok=True)
        from trackbridge.trackers.mlflow.client import make_client
        make_client(f"sqlite:///{d}/mlflow.db").search_experiments()      # creates the tables
        _TEMPLATES["mlflow"] = d / "mlflow.db"
    return _TEMPLATES["mlflow"]


def _trackio_template(project: str) -> Path:
    key = f"trackio:{project}"
    if key not in _TEMPLATES:
        from trackbridge.trackers.trackio.schema import init_db
        d = _SESSION_TMP / f"template-trackio-{len(_TEMPLATES)}"
        d.mkdir(parents=True, exist_ok=True)
        _TEMPLATES[key] = init_db(d, project)
    return _TEMPLATES[key]


def location(kind: str, folder: Path, *, projects: tuple[str, ...] = ("proj", "trackbridge"),
             experiment: str | None = None) -> str:
    """A new, empty destination of ``kind`` in ``folder`` (created), as a locator."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if kind == "mlflow":
        db = folder / "mlflow.db"
        if not db.exists():
            shutil.copyfile(_mlflow_template(), db)
        return f"mlflow:sqlite:///{db}" + (f"?experiment={experiment}" if experiment else "")
    if kind == "trackio":
        for p in projects:
            src = _trackio_template(p)
            if not (folder / src.name).exists():
                shutil.copyfile(src, folder / src.name)
        return f"trackio:{folder}"
    return f"{kind}:{folder}"


def write_run(dst: str, info: RunInfo, records: list[Record]) -> None:
    """Write one run through trackbridge's own sink (how run A comes to exist)."""
    from trackbridge.trackers import make_sink
    sink = make_sink(dst)
    sink.open(info)
    try:
        sink.write(records)
    finally:
        sink.close()


def read_runs(loc: str) -> list[tuple[Any, list[Record], list]]:
    """``[(RunInfo, records, problems)]`` of every run of ``loc``."""
    from trackbridge.trackers import open_source
    out = []
    for reader in open_source(loc).runs():
        recs = list(reader.records())
        out.append((reader.info, recs, list(reader.problems)))
    return out


def points(loc: str) -> dict[tuple, Any]:
    """Every point of ``loc``: ``{(run name, step, wall time, metric): value}``; a duplicate point fails."""
    out: dict[tuple, Any] = {}
    for info, recs, _ in read_runs(loc):
        for r in recs:
            for k, v in r.metrics.items():
                key = (info.name, r.step, r.wall_time, k)
                assert key not in out, f"point {key} is there twice in {loc}"
                out[key] = v
    return out


def count_points(loc: str) -> int:
    return sum(sum(len(r.metrics) for r in recs) for _, recs, _ in read_runs(loc))


def f32(x: float) -> float:
    return struct.unpack("<f", struct.pack("<f", x))[0]


def same_value(a: Any, b: Any) -> bool:
    """Equal, with NaN equal to NaN and histograms compared field by field (None = not stored)."""
    if isinstance(a, Histogram) or isinstance(b, Histogram):
        if not (isinstance(a, Histogram) and isinstance(b, Histogram)):
            return False
        for f in ("limits", "counts", "min", "max", "num", "sum", "sum_squares"):
            x, y = getattr(a, f), getattr(b, f)
            if isinstance(x, list) and isinstance(y, list):
                if len(x) != len(y) or not all(same_value(float(p), float(q)) for p, q in zip(x, y)):
                    return False
            elif not same_value(x, y):
                return False
        return True
    if isinstance(a, str) or isinstance(b, str) or a is None or b is None:
        return a == b
    fa, fb = float(a), float(b)
    if math.isnan(fa) or math.isnan(fb):
        return math.isnan(fa) and math.isnan(fb)
    return fa == fb


def child_env() -> dict[str, str]:
    """This process's environment for a child, without this process's wandb service (a child must start its own:
    a killed child's open run would otherwise stay open in ours)."""
    env = {k: v for k, v in os.environ.items() if k != "WANDB_SERVICE"}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def run_cli(*args: str, env_extra: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """``python -m trackbridge ARGS`` in a child process (same environment plus ``env_extra``)."""
    env = child_env()
    env.update(env_extra or {})
    return subprocess.run([PY, "-m", "trackbridge", *args], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=str(ROOT))


# -- the helpers themselves ---------------------------------------------------------------------------------
def test_same_value_rules():
    assert same_value(float("nan"), float("nan"))
    assert same_value(1, 1.0)
    assert not same_value(0.1, f32(0.1))
    assert not same_value("1", 1.0)
    h = Histogram(limits=[1.0], counts=[2.0], min=0.0, max=1.0, num=2.0)
    assert same_value(h, Histogram(limits=[1.0], counts=[2.0], min=0.0, max=1.0, num=2.0))
    assert not same_value(h, Histogram(limits=[1.0], counts=[3.0], min=0.0, max=1.0, num=2.0))


@pytest.mark.parametrize("kind", ["mlflow", "trackio"])
def test_location_copies_an_initialised_store(tmp_path, kind):
    loc = location(kind, tmp_path / kind)
    assert loc.startswith(kind + ":")
    files = list((tmp_path / kind).glob("*.db"))
    assert files and all(f.stat().st_size > 0 for f in files)
