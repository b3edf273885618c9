"""What an MLflow run holds, for resume and catch-up: its highest step, and its metric points per key and step."""
from __future__ import annotations

import contextlib
from typing import Any

from ...sync.holdings import Holdings
from .client import tracking_uri

_STATS = ("/std", "/min", "/max", "/mean", "/sum")


def last_step(client: Any, run_id: str) -> int | None:
    """Highest step among the run's latest metric values (MLflow keeps the max-step point per key)."""
    data = client.get_run(run_id).data
    objs = getattr(data, "_metric_objs", None)
    if objs is None:   # public fallback: one history per key
        steps = [m.step for key in data.metrics for m in client.get_metric_history(run_id, key)]
    else:
        steps = [m.step for m in objs]
    return max(steps) if steps else None


def held(client: Any, location: str, run_id: str, *, changed: dict[str, str], hist: set[str],
         since: int | None = None) -> Holdings:
    """The run's metric points (plain SQL on a local SQLite store, the REST API otherwise), under the names the sink
    was given: ``changed`` (stored -> original) restored, a histogram of ``hist`` counted once (its ``/count``)."""
    low = since if since is not None else -(2 ** 63)
    h = Holdings()

    def add(stored: str, step: int) -> None:
        name = changed.get(stored, stored)
        if name.endswith("/count") and name[:-6] in hist:
            name = name[:-6]
        elif name.endswith(_STATS) and name.rsplit("/", 1)[0] in hist:
            return
        h.add(name, step)

    uri = tracking_uri(location)
    if uri.startswith("sqlite:///"):
        import sqlite3
        db = uri[len("sqlite:///"):]
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)) as conn:
            for key, step in conn.execute("SELECT key, step FROM metrics WHERE run_uuid = ? AND step >= ?",
                                          (run_id, low)):
                add(key, step)
        return h
    for key in client.get_run(run_id).data.metrics:
        for m in client.get_metric_history(run_id, key):
            if m.step >= low:
                add(key, m.step)
    return h
