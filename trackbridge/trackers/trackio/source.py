"""Trackio reader: ``trackio:DIR[?project=NAME&run=RUN_ID&name=RUN_NAME]``, straight from trackio's SQLite files.

Why SQL and not trackio's API: trackio's public ``Api`` lists runs but has no metric-history getter, and its
storage class reads ``TRACKIO_DIR`` once per process; the files are plain SQLite (one ``<project>.db`` per project,
one ``metrics`` row per logged step with a JSON blob), documented in :mod:`trackbridge.trackers.trackio.sink`.

Runs come from the ``metrics`` and ``configs`` tables (databases from trackio < 0.24 without a ``run_id`` column are
read by run name). Points are streamed with a cursor in insertion order, one :class:`Record` per row, with the
row's step and its ISO timestamp as wall time (``None`` where trackio's TF importer stored ``''``). Values are
restored as trackio does (``"NaN"``/``"Infinity"`` strings -> floats), ``trackio.histogram`` dicts become
:class:`Histogram`, other media/table objects are skipped and reported. Keys that trackio renamed (``__step`` ...)
get their names back. Config is the ``configs`` row without trackio's ``_Username``/``_Created``/``_Group`` (kept in
``extra``); a ``_trackbridge`` entry, written by :class:`~trackbridge.trackers.trackio.sink.TrackioSink`, restores the
RunInfo exactly.
"""
from __future__ import annotations

import contextlib
import json
import sqlite3
from pathlib import Path
from typing import Any, Iterator

from ...record import Record, RunInfo
from ...tracking.source import RunReader, Source, SourceError, mark_derived
from .schema import CONFIG_KEY, HIST_TYPE, canonical_project_name, parse_iso, trackio_to_histogram, trackio_unkey

_SPECIAL = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}
_TRACKIO_CONFIG = ("_Username", "_Created", "_Group")
FETCH = 2000


def _columns(conn: sqlite3.Connection, table: str) -> set[str]:
    return {r[1] for r in conn.execute(f"PRAGMA table_info({table})").fetchall()}


class TrackioRunReader(RunReader):
    """One run of one trackio project database."""

    def __init__(self, db: Path, project: str, run_key: str, run_col: str, run_name: str,
                 config_text: str | None) -> None:
        super().__init__()
        self.db = db
        self.run_key = run_key          # value of run_col identifying the run
        self.run_col = run_col          # "run_id" (trackio >= 0.24) or "run_name"
        self._info = self._build_info(project, run_name, config_text)

    def _build_info(self, project: str, run_name: str, config_text: str | None) -> RunInfo:
        config: dict[str, Any] = {}
        if config_text:
            try:
                config = json.loads(config_text)
            except json.JSONDecodeError as exc:
                self.skip(f"{self.db} configs run {self.run_key}", f"config is not JSON ({exc.msg})")
        ours = config.pop(CONFIG_KEY, None) if isinstance(config, dict) else None
        trackio_extra = {k: config.pop(k) for k in _TRACKIO_CONFIG if k in config}
        run_id = self.run_key if self.run_col == "run_id" else None
        if isinstance(ours, dict):
            info = RunInfo.from_json(ours)
            info.extra = {**(info.extra or {}), "source_run_id": info.run_id, "trackio": trackio_extra}
            info.run_id = run_id
            return info
        tags = {"group": str(trackio_extra["_Group"])} if trackio_extra.get("_Group") else {}
        return RunInfo(name=run_name, project=project, run_id=run_id, config=config, tags=tags,
                       extra={"trackio": trackio_extra})

    @property
    def info(self) -> RunInfo:
        return self._info

    def _value(self, where: str, key: str, value: Any) -> tuple[bool, Any]:
        if isinstance(value, str) and value in _SPECIAL:
            return True, _SPECIAL[value]
        if isinstance(value, dict):
            if value.get("_type") == HIST_TYPE:
                try:
                    return True, trackio_to_histogram(value)
                except (TypeError, ValueError) as exc:
                    self.skip(where, f"metric {key!r}: bad histogram ({exc})")
                    return False, None
            self.skip(where, f"metric {key!r}: {value.get('_type', 'object')} values are not read")
            return False, None
        if isinstance(value, list):
            self.skip(where, f"metric {key!r}: list values are not read")
            return False, None
        return True, value

    def records(self) -> Iterator[Record]:
        return mark_derived(self.info, self._stored_records())

    def _stored_records(self) -> Iterator[Record]:
        with contextlib.closing(sqlite3.connect(f"file:{self.db}?mode=ro", uri=True, timeout=30.0)) as conn:
            cur = conn.execute(f"SELECT id, step, timestamp, metrics FROM metrics WHERE {self.run_col} = ? "
                               "ORDER BY id", (self.run_key,))
            while True:
                rows = cur.fetchmany(FETCH)
                if not rows:
                    return
                for row_id, step, ts, blob in rows:
                    where = f"{self.db} metrics id {row_id}"
                    try:
                        raw = json.loads(blob)
                    except (json.JSONDecodeError, TypeError) as exc:
                        self.skip(where, f"metrics column is not JSON ({exc})")
                        continue
                    if not isinstance(raw, dict):
                        self.skip(where, "metrics column is not a JSON object")
                        continue
                    metrics: dict[str, Any] = {}
                    for key, value in raw.items():
                        ok, v = self._value(where, key, value)
                        if ok:
                            metrics[trackio_unkey(key)] = v
                    yield Record(step=step, wall_time=parse_iso(ts), metrics=metrics)


class TrackioSource(Source):
    """Every run of every project database in a trackio directory (filtered by ``project``, ``run``, ``name``)."""
    signature = (b"SQLite format 3\x00", "an SQLite database (a Trackio project)")

    kind = "trackio"
    option_names = ("project", "run", "name")

    def _databases(self) -> list[tuple[str, Path]]:
        root = Path(self.location).expanduser()
        if root.is_file() and root.suffix == ".db":
            return [(root.stem, root)]
        if not root.is_dir():
            raise SourceError(f"trackio:{self.location}: no such directory")
        project = self.options.get("project")
        if project:
            db = root / f"{canonical_project_name(project)}.db"
            if not db.exists():
                known = sorted(p.stem for p in root.glob("*.db"))
                raise SourceError(f"trackio:{self.location}: no project {project!r} ({db.name} missing; projects: "
                                  f"{', '.join(known) or 'none'})")
            return [(project, db)]
        dbs = sorted(root.glob("*.db"))
        if not dbs:
            raise SourceError(f"trackio:{self.location}: no trackio project databases (*.db)")
        return [(p.stem, p) for p in dbs]

    def runs(self) -> Iterator[RunReader]:
        want_id = self.options.get("run")
        want_name = self.options.get("name")
        found = 0
        for project, db in self._databases():
            try:
                readers = list(self._runs_in(project, db, want_id, want_name))
            except sqlite3.DatabaseError as exc:
                raise SourceError(f"trackio:{db}: cannot read ({exc})") from None
            for r in readers:
                found += 1
                yield r
        if not found:
            what = f"id {want_id!r}" if want_id else (f"name {want_name!r}" if want_name else "any")
            raise SourceError(f"trackio:{self.location}: no run with {what}")

    def _runs_in(self, project: str, db: Path, want_id: str | None, want_name: str | None) -> Iterator[RunReader]:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30.0)) as conn:
            mcols = _columns(conn, "metrics")
            if not mcols:
                return
            col = "run_id" if "run_id" in mcols else "run_name"
            runs: dict[str, tuple[str, str]] = {}   # key -> (name, first timestamp)
            for key, name, first in conn.execute(
                    f"SELECT {col}, MAX(run_name), MIN(timestamp) FROM metrics GROUP BY {col} ORDER BY MIN(id)"):
                runs[key] = (name, first)
            configs: dict[str, str] = {}
            ccols = _columns(conn, "configs")
            if ccols:
                ccol = "run_id" if "run_id" in ccols else "run_name"
                for key, name, cfg in conn.execute(f"SELECT {ccol}, run_name, config FROM configs ORDER BY id"):
                    configs[key] = cfg
                    runs.setdefault(key, (name, ""))
        for key, (name, _first) in runs.items():
            if want_id and key != want_id:
                continue
            if want_name and name != want_name:
                continue
            yield TrackioRunReader(db, project, key, col, name, configs.get(key))
