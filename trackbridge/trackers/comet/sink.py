"""Comet sink: ``comet:DIR[?project=NAME&workspace=NAME]`` -- an offline experiment (:mod:`.archive`) per run, as
``comet_ml.OfflineExperiment(offline_directory=DIR)`` leaves it, ready for ``comet upload``.

Why not ``OfflineExperiment.log_metric``: it takes no timestamp (each point is stamped when it is logged), and an
offline experiment cannot be continued after ``end()``. The archive is JSON in a zip, so this sink writes it
itself: the run's config as ``parameter_msg`` messages (nested names joined with ``|``, as comet_ml flattens them),
its name (``log_other`` ``Name``), the run info (``log_other`` ``trackbridge``), and one ``metric_msg`` per value with
the record's step and its wall time in milliseconds (``local_timestamp``); NaN and infinities as Comet writes them
(``"NaN"``, ``"Infinity"``). Every message follows comet_ml 3.58's own JSON Schemas (the tests validate them).

Names: comet_ml's schemas hold metric and parameter names and tags to ``^(.*)$``, which refuses a line break (``comet
upload`` rejects the message), so a line break (``\n``, ``\r``, U+2028, U+2029) in a name is escaped as
``_x0A_`` (:func:`~trackbridge.tracking.names.escape`), said once per name, and recorded in the run info, from which
trackbridge's reader gives the name back.

What Comet's metrics cannot take, said per key (:meth:`Sink.reject`): text (Comet keeps text as uploaded
text samples). Histograms become summary statistics ``<name>/mean``, ``/std``, ``/min``, ``/max``, ``/count`` (Comet's
``histogram3d`` is an uploaded asset in a bucketing of its own), listed in the run info so readers know them.
"""
from __future__ import annotations

import json
import os
import shutil
import time
import uuid
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...record import Record, RunInfo
from ...record.values import flat_config
from ...tracking.appender import Appender
from ...tracking.names import NameCache, escape
from ...tracking.sink import (
    HISTOGRAM,
    NONE,
    NUMBER,
    TEXT,
    Capabilities,
    PointStoreSink,
    SinkError,
    not_kept,
    value_kind,
)
from .archive import (
    EXPERIMENT,
    INFO_KEY,
    MESSAGES,
    METRIC,
    OTHER,
    PARAMETER,
    PARTIAL,
    Archive,
    encode_number,
    experiment_key,
)

if TYPE_CHECKING:       # pragma: no cover
    pass

SUMMARY = ("mean", "std", "min", "max", "count")
STEP_LIMIT = 2 ** 53 - 1        # Comet's steps are JSON numbers
LINE_BREAKS = frozenset("\n\r\u2028\u2029")     # what ``.`` of the schemas' ``^(.*)$`` does not match
WHY_RENAMED = "comet_ml's schema refuses a line break in a name (comet upload would reject it)"


def comet_name(name: str) -> str:
    """``name`` as Comet's schemas take it: line breaks escaped (reversibly), anything else unchanged."""
    if not any(ch in LINE_BREAKS for ch in name):
        return name
    return escape(name, lambda ch: ch not in LINE_BREAKS)


class CometSink(PointStoreSink):
    """Writes one Comet offline experiment (see the module docstring)."""

    kind = "comet"
    option_names = ("project", "workspace")
    capabilities = Capabilities(histograms=False, text=False, nan=True, wall_time=True, resolution=(
        "wall times to the millisecond", "histograms as summary statistics (<name>/mean, /std, /min, /max, /count)"))

    def __init__(self, location: str = "", **options: str) -> None:
        super().__init__(location, **options)
        if not location:
            raise SinkError("comet sink: no folder given (expected comet:DIR)")
        self.root = Path(location).expanduser()
        self.key = ""
        self.work: Path | None = None
        self._fh: Appender | None = None
        self._mid = 0
        self._hist: set[str] = set()
        self._next_step = 0
        self._start = 0
        self._stale = False          # the run info is to be appended again (a batch that had it failed)
        self._names = NameCache(comet_name)

    def open(self, run: RunInfo, *, resume: bool = False) -> None:
        self.run = run
        run_id = str(run.run_id) if run.run_id else uuid.uuid4().hex
        key = experiment_key(run_id)
        done, work = self.root / f"{key}.zip", self.root / f"{key}{PARTIAL}"
        if (done.exists() or work.exists()) and not resume:
            run_id = f"{run_id}-{uuid.uuid4().hex[:6]}"
            key = experiment_key(run_id)
            done, work = self.root / f"{key}.zip", self.root / f"{key}{PARTIAL}"
        self.key, self.work = key, work
        try:
            work.mkdir(parents=True, exist_ok=True)
            if done.exists() and not (work / MESSAGES).exists():
                with zipfile.ZipFile(done) as z:           # continue a finished archive: unpack it to append
                    z.extractall(work)
            self._load()
            self._fh = Appender(work / MESSAGES)
        except (OSError, zipfile.BadZipFile) as exc:
            raise SinkError(f"comet:{self.location}: cannot write {work}: {exc}") from None
        try:
            if self._mid == 0:
                self._begin()
            self._write_experiment()
        except SinkError:
            self._fh.close()
            self._fh = None
            raise

    def _load(self) -> None:
        assert self.work is not None
        target = self.work / MESSAGES
        if not target.exists():
            return
        with open(target, "rb") as fh:
            data = fh.read()
        end = data.rfind(b"\n") + 1
        if end < len(data):                    # a line cut short by a killed writer
            with open(target, "r+b") as fh:
                fh.truncate(end)
        exp = Archive(self.work).experiment() or {}
        self._start = int(exp.get("start_time") or 0)
        for _i, line, _c in Archive(self.work).lines():
            try:
                msg = json.loads(line)
            except json.JSONDecodeError:
                continue
            payload, kind = msg.get("payload") or {}, msg.get("type")
            self._mid = max(self._mid, int(payload.get("message_id") or 0))
            if kind == OTHER and payload.get("key") == INFO_KEY:
                try:
                    ours = json.loads(payload["value"])
                    self._hist.update((ours.get("extra") or {}).get("histogram_summaries") or ())
                    for stored, original in (ours.get("sanitized") or {}).items():
                        self._names(str(original))
                except (json.JSONDecodeError, TypeError, AttributeError, ValueError):
                    pass
            elif kind == METRIC and isinstance((payload.get("metric") or {}).get("step"), int):
                self._next_step = max(self._next_step, payload["metric"]["step"] + 1)

    def _send(self, typ: str, payload: dict[str, Any]) -> str:
        self._mid += 1
        text = json.dumps({"payload": {**payload, "message_id": self._mid}, "type": typ}, ensure_ascii=False,
                          allow_nan=False, default=str)
        # U+2028 and U+2029 stay escaped: only inside strings, where JSON allows either, and a reader that splits
        # lines as str.splitlines() does would cut the message there
        return text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029") if "\u2028" in text or \
            "\u2029" in text else text

    def _begin(self) -> None:
        assert self.run is not None
        now = int(time.time() * 1000)
        self._start = now
        lines = [self._send(OTHER, {"key": "offline_experiment", "value": True}),
                 self._send(OTHER, {"key": "Name", "value": self.run.name or self.key}),
                 self._send(OTHER, {"key": "hasNestedParams", "value": True})]
        for name, value in flat_config(self.run.config or {}, "|").items():
            if comet_name(name) != name:
                self.renamed(name, comet_name(name), WHY_RENAMED)
                name = comet_name(name)
            if not (value is None or isinstance(value, (str, bool, int, float))):
                value = json.dumps(value, default=str)
            elif isinstance(value, float):
                value = encode_number(value)
            lines.append(self._send(PARAMETER, {"local_timestamp": now, "param": {
                "paramName": name, "paramValue": value, "source": "manual", "step": None}}))
        self._append(lines)

    def _info_line(self) -> str:
        assert self.run is not None
        info = self.run.to_json()
        info["extra"] = {**(info.get("extra") or {}), "histogram_summaries": sorted(self._hist)}
        return self._send(OTHER, {"key": INFO_KEY, "value": json.dumps(info, default=str, ensure_ascii=False)})

    def _write_experiment(self, stop: int | None = None) -> None:
        assert self.run is not None and self.work is not None
        exp = {"offline_id": self.key, "project_name": self.options.get("project") or self.run.project,
               "workspace": self.options.get("workspace"), "start_time": self._start or int(time.time() * 1000),
               "stop_time": stop or int(time.time() * 1000),
               "tags": [comet_name(f"{k}={v}" if v else k) for k, v in sorted((self.run.tags or {}).items())],
               "resume_strategy": "create", "customer_error_reported": False, "customer_error_message": None,
               "user_provided_experiment_key": False, "comet_start_sourced": False}
        target = self.work / EXPERIMENT
        tmp = target.with_name(target.name + ".tmp")
        try:
            tmp.write_text(json.dumps(exp, default=str), encoding="utf-8")
            os.replace(tmp, target)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise SinkError(f"comet:{self.location}: cannot write {target}: {exc}") from None

    def _append(self, lines: list[str]) -> None:
        """The lines appended whole, or none of them (an append cut short is taken back, and raises)."""
        if not lines:
            return
        assert self._fh is not None
        try:
            self._fh.append("".join(line + "\n" for line in lines).encode("utf-8"))
        except OSError as exc:
            raise SinkError(f"comet:{self.location}: cannot write {MESSAGES}: {exc}") from None

    def write(self, records: list[Record]) -> None:
        if self._fh is None:
            raise SinkError(f"comet:{self.location}: write() before open() or after close()")
        state = (self._mid, self._next_step, set(self._hist))
        try:
            self._write(records)
        except BaseException:
            # nothing of the batch is in the file (taken back): what the sink knows of the run is as before it
            self._mid, self._next_step, self._hist = state
            raise
        self.progress += 1

    def _write(self, records: list[Record]) -> None:
        lines: list[str] = []
        hist_before = len(self._hist)
        for rec, step, wall in self.points(records, lo=-STEP_LIMIT, hi=STEP_LIMIT,
                                           why="Comet keeps steps as JSON numbers (53 bits); the record is left out"):
            ms = round(wall * 1000)
            for name, value in rec.metrics.items():
                kind = value_kind(value)
                if kind is NUMBER:
                    points = [(self._names(name), value)]
                elif kind is NONE:
                    continue
                elif kind is HISTOGRAM:
                    self._hist.add(name)
                    base = self._names(name)
                    points = [(f"{base}/{k}", v) for k, v in value.summary().items() if k in SUMMARY]
                elif kind is TEXT:
                    self.reject_value(name, step, "Comet keeps text as uploaded text samples; not written")
                    continue
                else:
                    self.reject_value(name, step, not_kept(value))
                    continue
                for key, v in points:
                    try:
                        number = encode_number(float(v))
                    except OverflowError:
                        self.reject_value(key, step, "an integer beyond a float")
                        continue
                    lines.append(self._send(METRIC, {"local_timestamp": ms, "metric": {
                        "metricName": key, "metricValue": number, "step": step, "epoch": None}}))
        new = self._names.take_new()
        if new:
            self.record_sanitized(new)
            for stored, original in new.items():
                self.renamed(original, stored, WHY_RENAMED)
        if self.note_derived(records) or len(self._hist) != hist_before or self._stale or new:
            lines.append(self._info_line())
        self._stale = True              # the run info goes with the next batch if this one fails
        self._append(lines)
        self._stale = False

    def close(self) -> None:
        if self._fh is None or self.work is None:
            return
        try:
            if self.outcome != "finished" and self.run is not None:
                self.run.extra = {**(self.run.extra or {}), "outcome": self.outcome}
            self._append([self._info_line()])
            self._fh.close()
            self._fh = None
            self._write_experiment()
            self._zip()
        finally:
            if self._fh is not None:
                self._fh.close()
            self._fh = None

    def _zip(self) -> None:
        assert self.work is not None
        target = self.root / f"{self.key}.zip"
        tmp = target.with_name(target.name + ".tmp")
        try:
            with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
                for name in (EXPERIMENT, MESSAGES):
                    z.write(self.work / name, name)
            os.replace(tmp, target)
            shutil.rmtree(self.work, ignore_errors=True)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise SinkError(f"comet:{self.location}: cannot write {target}: {exc}") from None

    # -- what the archive holds --------------------------------------------------------------------------
    def stored_points(self, since: int | None) -> list[tuple[str, int]] | None:
        """The metric messages of the run, per name and step (a histogram's summaries count as the histogram;
        None before open)."""
        if self.work is None:
            return None
        src = self.work if (self.work / MESSAGES).exists() else self.root / f"{self.key}.zip"
        if not src.exists():
            return []
        out: list[tuple[str, int]] = []
        seen: set[tuple[str, int]] = set()
        for _i, line, complete in Archive(src).lines():
            if not complete:
                break
            try:
                msg = json.loads(line)
            except json.JSONDecodeError:
                continue
            kind = msg.get("type")
            metric = (msg.get("payload") or {}).get("metric") if kind == METRIC else None
            if not isinstance(metric, dict) or not isinstance(metric.get("step"), int):
                continue
            step, name = metric["step"], str(metric.get("metricName"))
            if since is not None and step < since:
                continue
            base, _, stat = name.rpartition("/")
            base = self._names.changed.get(base, base)
            name = self._names.changed.get(name, name)
            if base in self._hist and stat in SUMMARY:
                if (base, step) not in seen:
                    seen.add((base, step))
                    out.append((base, step))
                continue
            out.append((name, step))
        return out

    def describe(self) -> str:
        return f"comet:{self.location}" + (f" ({self.key})" if self.key else "")
