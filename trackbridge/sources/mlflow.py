"""MLflow reader: ``mlflow:URI[?experiment=NAME&run=RUN_ID&name=RUN_NAME]``.

Chooses runs by ``run`` (one id), else by ``experiment`` (name) and/or ``name`` (run name); with neither option it
reads every run of every experiment in the store. Runs are found with paged ``search_runs``.

Points are streamed per run: each metric's history is fetched page by page through the tracking store's paged
``get_metric_history`` (falling back to ``MlflowClient.get_metric_history``), and the per-key streams are merged on
``(timestamp, step)`` -- the SQL store's own order. MLflow keeps points, not rows, so they are grouped into records
per step and split (see :mod:`trackbridge.sources.base`), each point by its own timestamp: points of one step share
a record when their timestamps are equal (one ``log_batch``/``log_metrics`` call, or one record written by
:class:`~trackbridge.sinks.mlflow.MlflowSink`), or when they are of the same split (``eval/``/``eval_``,
``test/``/``test_``, else train; the epoch is of none) and at most
:data:`~trackbridge.sources.base.WALL_TIME_TOLERANCE` (1 s) after the record's first point, and the record does not
hold that name yet. The record's wall time is its first point's timestamp (MLflow keeps milliseconds). In a run
without a time axis (``extra["time_axis"] == "missing"``: the sink made up one distinct timestamp per record) only
equal timestamps share a record. A training row and an evaluation row of the same step are two records, each with
its own wall time. Memory is one page per metric key plus the records of the last second, not the whole run. Text
points (the sink's ``trackbridge/text/*.jsonl`` artifacts) are small and are loaded up front, then merged in.

Names and config: for runs written by :class:`~trackbridge.sinks.mlflow.MlflowSink` (tag
``trackbridge.key_escape``) stored names are restored from the recorded map, then by the escape rule, the
``trackbridge.run`` tag supplies the exact RunInfo, and +-max-double is read back as +-inf. For other runs, names
are kept as stored, config comes from params (JSON-looking values parsed, others kept as strings) and tags are the
run's non-``mlflow.`` tags.
"""
from __future__ import annotations

import heapq
import json
import tempfile
from collections import deque
from pathlib import Path
from typing import Any, Iterator

from ..record import Record, RunInfo
from ..sinks import _sanitize
from ..sinks.mlflow import (TAG_ESCAPE, TAG_HIST, TAG_NAMES, TAG_RUN, TEXT_DIR, make_client, read_chunked,
                            restore_inf, tracking_uri)
from .base import WALL_TIME_TOLERANCE, RunReader, Source, SourceError, mark_derived, same_row, splits_of

PAGE = 10_000


def _parse_param(text: str) -> Any:
    try:
        return json.loads(text)
    except (json.JSONDecodeError, TypeError):
        return text


class MlflowRunReader(RunReader):
    """One MLflow run."""

    def __init__(self, client: Any, run: Any, experiment_name: str | None, where: str) -> None:
        super().__init__()
        self.client = client
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
    def _history(self, key: str) -> Iterator[Any]:
        store = getattr(getattr(self.client, "_tracking_client", None), "store", None)
        run_id = self.mlrun.info.run_id
        if store is None:
            yield from sorted(self.client.get_metric_history(run_id, key), key=lambda m: (m.timestamp, m.step))
            return
        token = None
        first = True
        while True:
            page = store.get_metric_history(run_id, key, max_results=PAGE, page_token=token)
            token = getattr(page, "token", None)
            items = list(page)
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

    def _points(self, key: str) -> Iterator[tuple[int, int, int, str, Any]]:
        name = self.restore(key)
        for m in self._history(key):
            yield (m.timestamp, m.step, 0, name, m.value)

    def records(self) -> Iterator[Record]:
        return mark_derived(self.info, self._stored_records())

    def _stored_records(self) -> Iterator[Record]:
        keys = sorted(self.mlrun.data.metrics)
        streams = []
        for key in keys:
            streams.append(self._points(key))
        streams.append(iter(self._texts()))
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
        for ts, step, is_text, name, value in heapq.merge(*streams, key=lambda x: (x[0], x[1])):
            if not is_text and self.ours:
                value = restore_inf(value)
            while pending and ts - pending[0][0].wall_time * 1000.0 > tol_ms:
                done = pending.popleft()
                same = by_step[done[0].step]
                del same[0]                 # the oldest of its step too (by identity: NaN != NaN)
                if not same:
                    del by_step[done[0].step]
                yield done[0]
            wall = ts / 1000.0
            split = split_cache.get(name)
            if split is None:
                split = split_cache[name] = splits_of((name,))
            candidates = by_step.get(step, ())
            if any(e[2].get(name) == ts and _same_value(e[0].metrics[name], value) for e in candidates):
                continue      # the very same point twice (a rewritten text artifact, a file store): kept once,
                #               as MLflow's SQL store keeps a metric row identical in key, value, timestamp, step
            same = [e for e in candidates if name not in e[0].metrics]
            # a record of this very timestamp first (one logged row), else the oldest one the point may join
            entry = next((e for e in same if e[0].wall_time == wall), None) or next(
                (e for e in same if same_row(e[0].step, e[0].wall_time, e[1], step, wall, split, tolerance)), None)
            if entry is not None:
                entry[0].metrics[name] = value
                entry[1] = entry[1] | split
                entry[2][name] = ts
            else:
                entry = [Record(step=step, wall_time=wall, metrics={name: value}), split, {name: ts}]
                pending.append(entry)
                by_step.setdefault(step, []).append(entry)
        for entry in pending:
            yield entry[0]


def _same_value(a: Any, b: Any) -> bool:
    return a == b or (isinstance(a, float) and isinstance(b, float) and a != a and b != b)


class MlflowSource(Source):
    """Runs in an MLflow store, filtered by ``experiment``, ``run`` and ``name``."""

    kind = "mlflow"

    def runs(self) -> Iterator[RunReader]:
        uri = tracking_uri(self.location)
        local = Path(uri[len("sqlite:///"):]) if uri.startswith("sqlite:///") else (
            Path(uri[len("file://"):]) if uri.startswith("file://") else None)
        if local is not None and not local.exists():     # MLflow would create an empty store: a typo is not a run
            raise SourceError(f"mlflow:{self.location}: no such MLflow store: {local}")
        try:
            client = make_client(self.location)
        except Exception as exc:  # noqa: BLE001
            raise SourceError(f"mlflow:{self.location}: cannot open the store: {exc}") from exc
        from mlflow.exceptions import MlflowException

        where = f"mlflow:{self.location}"
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
            yield MlflowRunReader(client, r, exp.name, f"{where} run {run_id}")
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
                                      f"{where} run {r.info.run_id}")
            token = page.token
            if not token:
                break
        if not found:
            what = f"named {run_name!r} " if run_name else ""
            scope = f"experiment {exp_name!r}" if exp_name else "any experiment"
            raise SourceError(f"{where}: no run {what}in {scope}")
