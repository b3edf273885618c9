"""Trackio sink: ``trackio:DIR[?project=NAME&run=RUN_ID]``, local only (no Space, no server, no Hub).

Why not ``trackio.init``/``trackio.log``: trackio stamps every point with its own flush time (``log()`` has no
timestamp argument), and it reads its storage folder (``TRACKIO_DIR``) once, at import, into module globals; one
process could then write to one folder only. This sink writes trackio's on-disk format directly instead, for trackio
0.43.0 (schema version 2, ``PRAGMA user_version``):

* the database ``DIR/<canonical project>.db`` (the canonical name keeps ``[A-Za-z0-9_-]``, as trackio's
  ``canonical_project_name``) is created *by trackio itself*: ``SQLiteStorage.init_db`` runs once in a short child
  process with ``TRACKIO_DIR=DIR`` (and remote settings removed, ``HF_HUB_OFFLINE=1``), so the schema is exactly the
  installed trackio's; a database at another schema version is refused with a clear error;
* points go into ``metrics(run_id, run_name, step, timestamp, metrics, log_id)`` with one row per record, the
  record's step and its wall time as an ISO-8601 UTC timestamp, in one transaction per batch, under trackio's own
  process lock file ``DIR/<canonical>.lock`` (``fcntl.flock``, as trackio's ``ProcessLock``);
* ``log_id`` is a hash of (run id, step, timestamp, metrics), inserted with ``INSERT OR IGNORE`` against trackio's
  unique ``log_id`` index -- trackio's own mechanism -- so replaying the same records adds nothing;
* the config goes into ``configs`` as trackio does (the user's config plus ``_Username``, ``_Created``, ``_Group``),
  with one more reserved key, ``_trackbridge``: the RunInfo (name, tags, config, source ...) and the name map, so a
  reader restores everything exactly;
* values: numbers as JSON numbers, NaN/+-inf as the strings ``"NaN"``/``"Infinity"``/``"-Infinity"`` (trackio's
  ``serialize_values``), strings as JSON strings (stored and returned by trackio; its dashboard plots numbers only),
  ``None`` as JSON null, histograms as trackio's own type ``{"_type": "trackio.histogram", "bins": edges,
  "values": counts}`` plus a ``trackbridge`` entry with min/max/num/sum/sum_squares so summaries survive;
* names: trackio's reserved keys (``step``, ``time``, ``timestamp``, ``project``, ``run``, ``metrics``) and keys
  starting with ``__`` get a ``__`` prefix -- trackio's own rule, which is reversible; nothing else is changed.

A string value ``"NaN"``/``"Infinity"`` cannot be told from a number in trackio's format and reads back as a float.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import math
import sqlite3
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...record import Record, RunInfo
from ...record.values import printable
from ...tracking.names import NameCache
from ...tracking.sink import Capabilities, Sink, SinkError
from .schema import CONFIG_KEY, connect, encode, init_db, iso, process_lock, trackio_key, trackio_unkey

if TYPE_CHECKING:       # pragma: no cover
    from ...sync.holdings import Holdings


# -- the sink ---------------------------------------------------------------------------------------------
class TrackioSink(Sink):
    """Writes records to one run of a local Trackio project (see the module docstring)."""

    kind = "trackio"
    option_names = ("project", "run")
    alerts = False          # the logger with init(doctor=True): a live finding is also a row of Trackio's alerts
    capabilities = Capabilities(histograms=True, text=True, nan=True, wall_time=True, resolution=(
        "wall times to the microsecond", "raw histogram samples as 64 buckets"))

    def __init__(self, location: str = "", **options: str) -> None:
        super().__init__(location, **options)
        self.dir = Path(location).expanduser()
        self.project: str | None = None
        self.db: Path | None = None
        self.run_id: str | None = None
        self.run_name: str | None = None
        self._names = NameCache(trackio_key)
        self._created: str | None = None
        self._next_step = 0
        self._closed = False
        self._conn: sqlite3.Connection | None = None
        self._alerts_ok: bool | None = None

    def open(self, run: RunInfo, *, resume: bool = False) -> None:
        self._drop_conn()
        self._closed = False                  # the logger's recovery closes a failed sink and opens it again
        self.run = run
        self.project = self.options.get("project") or run.project or "trackbridge"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.db = init_db(self.dir, self.project)
        # the Trackio run id is trackbridge's run id, so that resume (and replay) find the same run again
        run_id = self.options.get("run") or (str(run.run_id) if run.run_id else None)
        with contextlib.closing(connect(self.db)) as conn:
            row = None
            if run_id:
                row = conn.execute("SELECT run_id, run_name, config, created_at FROM configs WHERE run_id = ?",
                                   (run_id,)).fetchone()
                has_points = conn.execute("SELECT 1 FROM metrics WHERE run_id = ? LIMIT 1", (run_id,)).fetchone()
                if row is None and not has_points and self.options.get("run"):
                    raise SinkError(f"trackio:{self.db}: no run {run_id!r} to resume")
                if (row is not None or has_points) and not resume and not self.options.get("run"):
                    run_id, row = f"{run_id}-{uuid.uuid4().hex[:6]}", None     # a new run that reuses an id
        self.run_id = run_id or uuid.uuid4().hex
        self.run_name = (row["run_name"] if row is not None else None) or run.name or f"trackbridge-{self.run_id[:8]}"
        if row is not None:
            self._created = row["created_at"]
            try:
                old = json.loads(row["config"]).get(CONFIG_KEY) or {}
                for stored, original in (old.get("sanitized") or {}).items():
                    self._names._cache[original] = stored
                    self._names.changed[stored] = original
            except (json.JSONDecodeError, AttributeError):
                pass
        self._write_config()
        last = self.last_step()
        self._next_step = 0 if last is None else last + 1

    def _config(self) -> dict[str, Any]:
        assert self.run is not None
        info = self.run.to_json()
        info["sanitized"] = dict(self._names.changed)
        cfg: dict[str, Any] = {k: v for k, v in (self.run.config or {}).items()}
        cfg["_Username"] = None
        cfg["_Created"] = self._created or datetime.now(timezone.utc).isoformat()
        cfg["_Group"] = (self.run.tags or {}).get("group")
        cfg[CONFIG_KEY] = info
        if (self.run.extra or {}).get("derived"):      # derived (not logged) metrics, visible in the run's config
            cfg["trackbridge_derived"] = list(self.run.extra["derived"])
        return cfg

    def _write_config(self) -> None:
        text = json.dumps(_json_safe(self._config()), ensure_ascii=False, allow_nan=False, default=str)
        now = datetime.now(timezone.utc).isoformat()
        assert self.project is not None and self.db is not None      # set by open()
        with process_lock(self.dir, self.project), contextlib.closing(connect(self.db)) as conn, conn:
            conn.execute("INSERT OR REPLACE INTO configs (run_id, run_name, config, created_at) VALUES (?, ?, ?, ?)",
                         (self.run_id, self.run_name, text, self._created or now))
        self._created = self._created or now

    def write(self, records: list[Record]) -> None:
        if self.db is None or self.run_id is None:
            raise SinkError(f"trackio:{self.location}: write() before open()")
        rows = []
        alerts: list[tuple[Any, ...]] = []
        known = self._names._cache
        for rec, step, wall in self.points(records, why="Trackio keeps steps in signed 64-bit integers; the record "
                                                        "is left out"):
            ts = iso(wall)
            metrics: dict[str, Any] = {}
            for name, value in rec.metrics.items():
                stored = known.get(name)
                if stored is not None and type(value) is float and value - value == 0.0:
                    metrics[stored] = value             # the common case, a finite float under a known name
                    continue
                try:
                    metrics[self._names(name)] = encode(value)
                except (TypeError, ValueError) as exc:     # this key only: the rest of the record is written
                    self.reject_value(name, step, printable(str(exc))[:200])
            try:
                blob = json.dumps(metrics, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
                data = f"{self.run_id}\x00{step}\x00{ts}\x00{blob}".encode("utf-8")
            except (TypeError, ValueError):     # NaN inside a histogram, a lone surrogate ...: find the keys
                blob = self._careful_blob(metrics, step)
                data = f"{self.run_id}\x00{step}\x00{ts}\x00{blob}".encode("utf-8")
            log_id = hashlib.sha1(data).hexdigest()
            rows.append((ts, self.run_id, self.run_name, step, blob, log_id))
            if self.alerts:
                alerts.extend(self._alerts_of(rec, step, ts))
        if rows:
            if self._conn is None:      # kept open for the run: no connect/close per batch
                self._conn = connect(self.db)
            conn = self._conn
            assert self.project is not None
            with process_lock(self.dir, self.project), conn:
                conn.executemany("INSERT OR IGNORE INTO metrics (timestamp, run_id, run_name, step, metrics, log_id) "
                                 "VALUES (?, ?, ?, ?, ?, ?)", rows)
                if alerts and self._has_alerts(conn):
                    conn.executemany("INSERT OR IGNORE INTO alerts (run_id, timestamp, run_name, title, text, level, "
                                     "step, alert_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?)", alerts)
        new = self._names.take_new()
        if new:
            self.record_sanitized(new)
        axes = self.note_axes(records)
        if self.note_derived(records) or new or axes:
            self._write_config()

    def _alerts_of(self, rec: Record, step: int, ts: str) -> list[tuple[Any, ...]]:
        """A live finding (``doctor/<id>``, with ``init(doctor=True)``) as a row of Trackio's own ``alerts`` table,
        what ``trackio.alert`` stores (the dashboard shows it, ``SQLiteStorage.get_alerts`` reads it); its
        ``alert_id`` is a hash of (run, check, step), so a replay adds no second alert."""
        from ...doctor.report import live_alert
        out = []
        for key, value in rec.metrics.items():
            found = live_alert(key, value)
            if found is None:
                continue
            cid, severity, title, text = found
            level = {"critical": "error", "warning": "warn"}.get(severity, "info")
            aid = hashlib.sha1(f"{self.run_id}\x00{cid}\x00{step}".encode("utf-8")).hexdigest()
            out.append((self.run_id, ts, self.run_name, title, text, level, step, aid))
        return out

    def _has_alerts(self, conn: sqlite3.Connection) -> bool:
        """Whether the installed Trackio's schema has alerts with run ids (0.43's), asked once per sink."""
        if self._alerts_ok is None:
            cols = {r[1] for r in conn.execute("PRAGMA table_info(alerts)").fetchall()}
            self._alerts_ok = {"run_id", "alert_id", "title", "level", "step"} <= cols
            if not self._alerts_ok:
                self.reject("doctor", None, "this Trackio's database has no alerts table with run ids: the live "
                                            "findings are logged as text only")
        return self._alerts_ok

    def _careful_blob(self, metrics: dict[str, Any], step: int) -> str:
        """The JSON of ``metrics`` without the keys that are not strict JSON in UTF-8 (each noted with reject)."""
        keep = {}
        for k, v in metrics.items():
            try:
                json.dumps({k: v}, ensure_ascii=False, allow_nan=False).encode("utf-8")
            except (TypeError, ValueError) as exc:
                self.reject(printable(trackio_unkey(k)), step, printable(str(exc))[:200])
                continue
            keep[k] = v
        return json.dumps(keep, ensure_ascii=False, allow_nan=False, separators=(",", ":"))

    def _drop_conn(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except sqlite3.Error:
                pass
            self._conn = None

    def close(self) -> None:
        if self._closed or self.db is None:
            self._closed = True
            self._drop_conn()
            return
        self._closed = True
        try:
            self._write_config()
        finally:
            self._drop_conn()

    def last_step(self) -> int | None:
        if self.db is None or self.run_id is None:
            return None
        with contextlib.closing(connect(self.db)) as conn:
            row = conn.execute("SELECT MAX(step) FROM metrics WHERE run_id = ?", (self.run_id,)).fetchone()
        return row[0] if row and row[0] is not None else None

    def held(self, since: int | None = None) -> Holdings | None:
        """The points of the run's rows in Trackio's SQLite store (one row per record, JSON of its values)."""
        from ...sync.holdings import Holdings
        if self.db is None or self.run_id is None:
            return None
        h = Holdings()
        unkey = dict(self._names.changed)
        with contextlib.closing(connect(self.db)) as conn:
            rows = conn.execute("SELECT step, metrics FROM metrics WHERE run_id = ? AND step >= ? ORDER BY id",
                                (self.run_id, since if since is not None else -(2 ** 63)))
            for step, blob in rows:
                try:
                    keys = json.loads(blob)
                except (TypeError, ValueError):
                    continue
                for stored, value in keys.items():
                    if value is not None:
                        h.add(unkey.get(stored) or trackio_unkey(stored), step)
        return h

    def describe(self) -> str:
        return f"trackio:{self.location}" + (f" (project {self.project}, run {self.run_name})" if self.run_name else "")


def _json_safe(obj: Any) -> Any:
    """Config in trackio's JSON form: NaN/inf as strings, everything else JSON or ``str``."""
    if isinstance(obj, dict):
        return {str(k): _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return encode(obj)
    return obj
