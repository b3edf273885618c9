"""MLflow reader: ``mlflow:URI[?experiment=NAME&run=RUN_ID&name=RUN_NAME]``.

Chooses runs by ``run`` (one id), else by ``experiment`` (name) and/or ``name`` (run name); with neither option it
reads every run of every experiment in the store. Runs are found with paged ``search_runs``.

Points are streamed per run, in time order (the order they were logged, which keeps a resumed run's repeated
steps where they were). A local SQLite store (``sqlite:///x.db``) is read with plain SQL (the standard library's
``sqlite3``, read-only) from MLflow's own ``metrics`` table -- ``key, value, timestamp, step, is_nan, run_uuid``,
the rows ``log_batch`` and :class:`~.sink.MlflowSink`'s bulk writer write -- with one query over
all keys ``ORDER BY timestamp, step, rowid``, fetched :data:`FETCH` rows at a time: no key's history is ever held,
and two values of one key logged at the same step and millisecond come back as two records, in the order stored.
A tracking server (or any other store) is read through the paged ``get_metric_history`` of the REST API, at most
:data:`PAGE_BUDGET` points in pages across all keys, and the per-key streams are merged on ``(timestamp, step)``,
the server's own order (there, two values of one key at the same step and millisecond come back in value order).

MLflow keeps points, not rows, so they are grouped into records per step and split (see
:mod:`trackbridge.tracking.source`), each point by its own timestamp: points of one step share
a record when their timestamps are equal (one ``log_batch``/``log_metrics`` call, or one record written by
:class:`~trackbridge.trackers.mlflow.sink.MlflowSink`), or when they are of the same split (``eval/``/``eval_``,
``test/``/``test_``, else train; the epoch is of none) and at most
:data:`~trackbridge.tracking.source.WALL_TIME_TOLERANCE` (1 s) after the record's first point, and the record does not
hold that name yet. The record's wall time is its first point's timestamp (MLflow keeps milliseconds). In a run
without a time axis (``extra["time_axis"] == "missing"``: the sink made up one distinct timestamp per record) only
equal timestamps share a record. A training row and an evaluation row of the same step are two records, each with
its own wall time. Memory is the records of the last second, not the run. Text points (the sink's
``trackbridge/text/*.jsonl`` artifacts) are small and are loaded up front, then merged in. The very same point
twice (a rewritten text artifact) is kept once; nothing is doubled.

Names and config: for runs written by :class:`~trackbridge.trackers.mlflow.sink.MlflowSink` (tag
``trackbridge.key_escape``) stored names are restored from the recorded map, then by the escape rule, the
``trackbridge.run`` tag supplies the exact RunInfo, and +-max-double is read back as +-inf. For other runs, names
are kept as stored, config comes from params (JSON-looking values parsed, others kept as strings) and tags are the
run's non-``mlflow.`` tags.
"""
from __future__ import annotations

import heapq
import json
import math
import sqlite3
import tempfile
from collections import deque
from pathlib import Path
from typing import Any, Iterable, Iterator
from urllib.parse import quote

from ...record import Record, RunInfo
from ...tracking import names as _sanitize
from ...tracking.sink import SinkError
from ...tracking.source import WALL_TIME_TOLERANCE, RunReader, Source, SourceError, mark_derived, same_row, splits_of
from .client import (
    TAG_ESCAPE,
    TAG_HIST,
    TAG_NAMES,
    TAG_RUN,
    TEXT_DIR,
    make_client,
    read_chunked,
    restore_inf,
    tracking_uri,
)
from .store import check_sqlite_store

PAGE = 10_000           # points per page of one key's history from a server, at most
PAGE_BUDGET = 100_000   # points held in pages at once across all keys of a run (a server's pages are per key)
FETCH = 5_000           # rows fetched at a time from a local SQLite store
_SQL_COLUMNS = {"key", "value", "timestamp", "step", "is_nan", "run_uuid"}


def _parse_param(text: str) -> Any:
    try:
        return json.loads(text)
    except (json.JSONDecodeError, TypeError):
        return text


class MlflowRunReader(RunReader):
    """One MLflow run."""

    def __init__(self, client: Any, run: Any, experiment_name: str | None, where: str,
                 db_path: Path | None = None) -> None:
        super().__init__()
        self.client = client
        self.db_path = db_path          # a local SQLite store with MLflow's tables: read with plain SQL
        self.mlrun = run
        self.where = where
        tags = dict(run.data.tags)
        self.ours = TAG_ESCAPE in tags
        names = read_chunked(tags, TAG_NAMES)
        self.name_map: dict[str, str] = json.loads(names) if names else {}
        hist = read_chunked(tags, TAG_HIST)
        self.histograms: list[str] = json.loads(hist) if hist else []
        self._info = self._build_info(tags, experiment_name)

    def _build_info(self, tags: dict[str, str], experiment_name: str | None) -> RunInfo:
        r = self.mlrun
        stored = read_chunked(tags, TAG_RUN)
        if stored:
            try:
                info = RunInfo.from_json(json.loads(stored))
            except (json.JSONDecodeError, TypeError) as exc:
                self.skip(f"{self.where} tag {TAG_RUN}", f"unreadable RunInfo ({exc}); using params and tags")
                info = None
            if info is not None:
                info.extra = {**(info.extra or {}), "source_run_id": info.run_id}
                info.run_id = r.info.run_id
                info.sanitized = {**info.sanitized, **self.name_map}
                info.extra["histogram_summaries"] = list(self.histograms)
                info.extra["mlflow"] = self._mlflow_extra()
                return info
        config = {self.restore(k): _parse_param(v) for k, v in r.data.params.items()}
        user_tags = {k: v for k, v in tags.items() if not k.startswith(("mlflow.", "trackbridge."))}
        return RunInfo(name=r.info.run_name, project=experiment_name, run_id=r.info.run_id, config=config,
                       tags=user_tags, sanitized=dict(self.name_map),
                       extra={"histogram_summaries": list(self.histograms), "mlflow": self._mlflow_extra()})

    def _mlflow_extra(self) -> dict[str, Any]:
        i = self.mlrun.info
        return {"experiment_id": i.experiment_id, "run_id": i.run_id, "status": i.status,
                "start_time": i.start_time, "end_time": i.end_time}

    @property
    def info(self) -> RunInfo:
        return self._info

    def restore(self, stored: str) -> str:
        """The original name of a stored key."""
        if stored in self.name_map:
            return self.name_map[stored]
        return _sanitize.unescape(stored) if self.ours else stored

    # -- points ----------------------------------------------------------------------------------------
    def _history(self, key: str, page: int = PAGE) -> Iterator[Any]:
        store = getattr(getattr(self.client, "_tracking_client", None), "store", None)
        run_id = self.mlrun.info.run_id
        if store is None:
            yield from sorted(self.client.get_metric_history(run_id, key), key=lambda m: (m.timestamp, m.step))
            return
        token = None
        first = True
        while True:
            got = store.get_metric_history(run_id, key, max_results=page, page_token=token)
            token = getattr(got, "token", None)
            items = list(got)
            if first and not token:
                items.sort(key=lambda m: (m.timestamp, m.step))   # whole history in one page: order it
            first = False
            yield from items
            if not token:
                return

    def _texts(self) -> list[tuple[int, int, int, str, str]]:
        if not self.ours:
            return []
        run_id = self.mlrun.info.run_id
        try:
            files = [a for a in self.client.list_artifacts(run_id, TEXT_DIR) if a.path.endswith(".jsonl")]
        except Exception as exc:  # noqa: BLE001 - a broken artifact store loses the text, not the run
            self.skip(f"{self.where} artifacts {TEXT_DIR}", f"cannot list text artifacts: {exc}")
            return []
        out = []
        with tempfile.TemporaryDirectory() as tmp:
            for a in files:
                try:
                    path = Path(self.client.download_artifacts(run_id, a.path, tmp))
                    lines = path.read_text(encoding="utf-8").splitlines()
                except Exception as exc:  # noqa: BLE001
                    self.skip(f"{self.where} artifact {a.path}", f"cannot read: {exc}")
                    continue
                for lineno, line in enumerate(lines, 1):
                    try:
                        t = json.loads(line)
                        ms = int(t["timestamp"])
                        out.append((ms, int(t["step"]), 1, t["name"], t["value"]))
                    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
                        self.skip(f"{self.where} artifact {a.path} line {lineno}", f"bad text point: {exc}")
        out.sort(key=lambda x: (x[0], x[1]))
        return out

    def _points(self, key: str, page: int = PAGE) -> Iterator[tuple[int, int, int, str, Any]]:
        name = self.restore(key)
        for m in self._history(key, page):
            yield (m.timestamp, m.step, 0, name, m.value)

    def records(self) -> Iterator[Record]:
        if self.db_path is not None:
            return mark_derived(self.info, self._sql_records())
        return mark_derived(self.info, self._stored_records())

    # -- a local SQLite store: plain SQL -----------------------------------------------------------------
    def _sql_points(self) -> Iterator[tuple[int, int, int, str, Any]]:
        """``(timestamp, step, 0, name, value)`` of every metric row of the run, in ``(timestamp, step, stored)``
        order, read a batch of rows at a time (the connection is read-only and closed when the stream ends)."""
        # check_same_thread=False: a stream left unfinished is closed by the garbage collector in whatever thread
        # it runs (it raised there, said as an unraisable exception); the connection is this generator's alone
        con = sqlite3.connect(f"file:{quote(str(self.db_path))}?mode=ro", uri=True, check_same_thread=False)
        try:
            cur = con.execute("SELECT key, value, timestamp, step, is_nan FROM metrics WHERE run_uuid = ? "
                              "ORDER BY timestamp, step, rowid", (self.mlrun.info.run_id,))
            names: dict[str, str] = {}
            nan = math.nan
            while True:
                rows = cur.fetchmany(FETCH)
                if not rows:
                    return
                for key, value, ts, step, is_nan in rows:
                    name = names.get(key)
                    if name is None:
                        name = names[key] = self.restore(key)
                    yield (ts, step, 0, name, nan if is_nan else value)
        finally:
            con.close()

    def _sql_records(self) -> Iterator[Record]:
        texts = self._texts()
        points: Iterable[tuple[int, int, int, str, Any]] = self._sql_points()
        if texts:
            points = heapq.merge(points, texts, key=lambda x: (x[0], x[1]))
        return self._grouped(points)

    # -- a tracking server (or another store): paged per key, merged in time order ---------------------
    def _stored_records(self) -> Iterator[Record]:
        keys = sorted(self.mlrun.data.metrics)
        page = max(1, min(PAGE, PAGE_BUDGET // max(1, len(keys))))
        streams = []
        for key in keys:
            streams.append(self._points(key, page))
        streams.append(iter(self._texts()))
        return self._grouped(heapq.merge(*streams, key=lambda x: (x[0], x[1])))

    def _grouped(self, points: Iterable[tuple[int, int, int, str, Any]]) -> Iterator[Record]:
        """Records from points ``(timestamp, step, is_text, name, value)`` in time order (see the module
        docstring); memory is the records of the last second."""
        # records still open to more points (first point at most the tolerance ago), oldest first, and the same
        # entries by step; points arrive in timestamp order, so a record is complete once a point is past its
        # tolerance. An entry is [record, its splits, {name: the point's own timestamp}].
        pending: deque[list[Any]] = deque()
        by_step: dict[Any, list[list[Any]]] = {}
        # a run without a time axis (marked by an earlier migration) has made-up timestamps, one per record
        # (MlflowSink: distinct and increasing): only the very same timestamp is one record there
        tolerance = WALL_TIME_TOLERANCE if self.has_wall_time else 0.0
        tol_ms = tolerance * 1000.0
        split_cache: dict[str, frozenset[str]] = {}
        ours = self.ours
        for ts, step, is_text, name, value in points:
            if ours and not is_text:
                value = restore_inf(value)
            while pending and ts - pending[0][0].wall_time * 1000.0 > tol_ms:
                done = pending.popleft()
                same = by_step[done[0].step]
                del same[0]                 # the oldest of its step too (by identity: NaN != NaN)
                if not same:
                    del by_step[done[0].step]
                yield done[0]
            split = split_cache.get(name)
            if split is None:
                split = split_cache[name] = splits_of((name,))
            entry = _place(by_step.setdefault(step, []), step, ts, name, value, split, tolerance)
            if entry is not None:
                pending.append(entry)
        for entry in pending:
            yield entry[0]


def _place(candidates: list[list[Any]], step: Any, ts: int, name: str, value: Any, split: frozenset[str],
           tolerance: float) -> list[Any] | None:
    """Put one point into a record of its step: ``candidates`` are the records of ``step`` still open, as
    ``[record, its splits, {name: the point's own timestamp}]``; a new record is appended to it and returned (else
    None). The very same point twice (a rewritten text artifact, a file store) is kept once, as MLflow's SQL store
    keeps a metric row identical in key, value, timestamp, step."""
    wall = ts / 1000.0
    for e in candidates:
        if e[2].get(name) == ts and _same_value(e[0].metrics[name], value):
            return None
    same = [e for e in candidates if name not in e[0].metrics]
    # a record of this very timestamp first (one logged row), else the oldest one the point may join
    entry = next((e for e in same if e[0].wall_time == wall), None) or next(
        (e for e in same if same_row(e[0].step, e[0].wall_time, e[1], step, wall, split, tolerance)), None)
    if entry is not None:
        entry[0].metrics[name] = value
        entry[1] = entry[1] | split
        entry[2][name] = ts
        return None
    entry = [Record(step=step, wall_time=wall, metrics={name: value}), split, {name: ts}]
    candidates.append(entry)
    return entry


def _same_value(a: Any, b: Any) -> bool:
    return a == b or (isinstance(a, float) and isinstance(b, float) and a != a and b != b)


class MlflowSource(Source):
    """Runs in an MLflow store, filtered by ``experiment``, ``run`` and ``name``."""
    signature = (b"SQLite format 3\x00", "an SQLite database (an MLflow store)")

    kind = "mlflow"
    option_names = ("experiment", "run", "name")

    def runs(self) -> Iterator[RunReader]:
        uri = tracking_uri(self.location)
        local = Path(uri[len("sqlite:///"):]) if uri.startswith("sqlite:///") else (
            Path(uri[len("file://"):]) if uri.startswith("file://") else None)
        if local is not None and not local.exists():     # MLflow would create an empty store: a typo is not a run
            raise SourceError(f"mlflow:{self.location}: no such MLflow store: {local}")
        if uri.startswith("sqlite:///"):
            try:            # a damaged file or not an MLflow store: one line, before SQLAlchemy's long story
                check_sqlite_store(uri)
            except SinkError as exc:
                raise SourceError(str(exc).replace("; refusing to let MLflow write into it", "")) from None
        try:
            client = make_client(self.location)
        except Exception as exc:  # noqa: BLE001
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise SourceError(f"mlflow:{self.location}: cannot open the store: {first}") from exc
        from mlflow.exceptions import MlflowException

        where = f"mlflow:{self.location}"
        db = local if uri.startswith("sqlite:///") and _has_metrics_table(local) else None
        run_id = self.options.get("run")
        exp_name = self.options.get("experiment")
        run_name = self.options.get("name")
        names: dict[str, str] = {}
        if run_id:
            try:
                r = client.get_run(run_id)
            except MlflowException as exc:
                raise SourceError(f"{where}: no run with id {run_id!r} ({exc.message})") from None
            exp = client.get_experiment(r.info.experiment_id)
            if exp_name and exp.name != exp_name:
                raise SourceError(f"{where}: run {run_id!r} is in experiment {exp.name!r}, not {exp_name!r}")
            yield MlflowRunReader(client, r, exp.name, f"{where} run {run_id}", db)
            return
        try:
            if exp_name:
                exp = client.get_experiment_by_name(exp_name)
                if exp is None:
                    known = [e.name for e in client.search_experiments()]
                    raise SourceError(f"{where}: no experiment named {exp_name!r} (experiments: "
                                      f"{', '.join(known) or 'none'})")
                names[exp.experiment_id] = exp.name
            else:
                for e in client.search_experiments():
                    names[e.experiment_id] = e.name
        except MlflowException as exc:
            raise SourceError(f"{where}: cannot list experiments ({exc.message})") from None
        filt = ""
        if run_name:
            filt = "attributes.run_name = '{}'".format(run_name.replace("'", "\\'"))
        found = 0
        token = None
        while names:
            page = client.search_runs(list(names), filter_string=filt, max_results=1000, page_token=token,
                                      order_by=["attributes.start_time ASC"])
            for r in page:
                found += 1
                yield MlflowRunReader(client, r, names.get(r.info.experiment_id),
                                      f"{where} run {r.info.run_id}", db)
            token = page.token
            if not token:
                break
        if not found:
            what = f"named {run_name!r} " if run_name else ""
            scope = f"experiment {exp_name!r}" if exp_name else "any experiment"
            raise SourceError(f"{where}: no run {what}in {scope}")


def _has_metrics_table(path: Path | None) -> bool:
    """Whether ``path`` is an SQLite file whose ``metrics`` table has MLflow's columns (then it is read with plain
    SQL; anything else goes through MLflow's client)."""
    if path is None or not path.is_file():
        return False
    try:
        con = sqlite3.connect(f"file:{quote(str(path))}?mode=ro", uri=True)
        try:
            cols = {row[1] for row in con.execute("PRAGMA table_info(metrics)")}
        finally:
            con.close()
    except sqlite3.Error:
        return False
    return _SQL_COLUMNS <= cols
