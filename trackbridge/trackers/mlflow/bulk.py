"""Bulk metric writes into a local MLflow SQLite store, the same rows ``MlflowClient.log_batch`` writes, faster.

``log_batch`` goes through the SQLAlchemy ORM one row object at a time (about 70 µs a point here), which makes MLflow
the slowest part of every migration and of a five-tracker run. For a local ``sqlite:`` store this module inserts the
same rows with one ``executemany`` per batch, using MLflow's own table definitions (``SqlMetric``,
``SqlLatestMetric``) and MLflow's own value sanitizer, and keeps MLflow's two rules:

* a row identical to one the run already holds (key, value, timestamp, step, is_nan) is ignored, not duplicated
  (``INSERT OR IGNORE`` on the table's primary key, as ``log_batch`` does on IntegrityError);
* ``latest_metrics`` holds, per key, the row with the greatest ``(step, timestamp, value)``.

It is used only when the store is a local SQLite database and MLflow's tables look as expected; otherwise (a
tracking server, another database, another MLflow layout) the sink uses ``log_batch``. ``?bulk=0`` in the locator
turns it off.
"""
from __future__ import annotations

from typing import Any


class BulkWriter:
    """Metric inserts straight into a local (SQLite) MLflow store's tables, bypassing the ORM (see :meth:`write`)."""

    def __init__(self, store: Any, metric_table: Any, latest_table: Any) -> None:
        self.store = store
        self.metrics = metric_table
        self.latest = latest_table

    @classmethod
    def for_client(cls, client: Any, uri: str) -> "BulkWriter | None":
        """The bulk writer of an ``MlflowClient`` on a SQLite store; None for any other store, or when the installed
        MLflow's tables are not the ones this writer knows (the sink then logs through the client)."""
        if not uri.startswith("sqlite:"):
            return None
        try:
            from mlflow.store.tracking.dbmodels.models import SqlLatestMetric, SqlMetric
            store = client._tracking_client.store
            cols = {c.name for c in SqlMetric.__table__.columns}
            lcols = {c.name for c in SqlLatestMetric.__table__.columns}
            needed = {"key", "value", "timestamp", "step", "is_nan", "run_uuid"}
            if not (needed <= cols and needed <= lcols and callable(getattr(store, "sanitize_metric_value", None))
                    and callable(getattr(store, "ManagedSessionMaker", None))
                    and store.engine.dialect.name == "sqlite"):
                return None
        except Exception:                 # another MLflow layout: log_batch is always right
            return None
        return cls(store, SqlMetric.__table__, SqlLatestMetric.__table__)

    def write(self, run_id: str, metrics: list[Any]) -> None:
        """Insert ``metrics`` (``mlflow.entities.Metric``) for ``run_id`` in one transaction: plain ``executemany``
        on the store's own SQLite connection (the ORM's per-row work held the GIL a training loop needs), into the
        tables and columns MLflow's models name."""
        if not metrics:
            return
        sanitize = self.store.sanitize_metric_value
        rows = []
        newest: dict[str, tuple[Any, ...]] = {}
        for m in metrics:
            is_nan, value = sanitize(m.value)
            row = (m.key, value, m.timestamp, m.step, is_nan, run_id)
            rows.append(row)
            cur = newest.get(m.key)
            if cur is None or (m.step, m.timestamp, value) > (cur[3], cur[2], cur[1]):
                newest[m.key] = row
        mt, lt = self.metrics.name, self.latest.name
        cols = '"key", value, timestamp, step, is_nan, run_uuid'
        with self.store.ManagedSessionMaker() as session:
            db = session.connection().connection.driver_connection
            cur = db.cursor()
            try:
                cur.executemany(f"INSERT OR IGNORE INTO {mt} ({cols}) VALUES (?, ?, ?, ?, ?, ?)", rows)
                keys = sorted(newest)
                held: dict[str, tuple[Any, ...]] = {}
                for i in range(0, len(keys), 500):
                    part = keys[i:i + 500]
                    q = (f'SELECT "key", step, timestamp, value FROM {lt} WHERE run_uuid = ? AND "key" IN '
                         f'({", ".join("?" * len(part))})')
                    for k, step, ts, value in cur.execute(q, [run_id, *part]):
                        held[k] = (step, ts, value)
                inserts, updates = [], []
                for k, row in newest.items():
                    old = held.get(k)
                    if old is None:
                        inserts.append(row)
                    elif (row[3], row[2], row[1]) > old:
                        updates.append((row[1], row[2], row[3], row[4], run_id, k))
                if inserts:
                    cur.executemany(f"INSERT INTO {lt} ({cols}) VALUES (?, ?, ?, ?, ?, ?)", inserts)
                if updates:
                    cur.executemany(f'UPDATE {lt} SET value = ?, timestamp = ?, step = ?, is_nan = ? '
                                    f'WHERE run_uuid = ? AND "key" = ?', updates)
            finally:
                cur.close()
