"""ClearML sink: ``clearml:DIR[?project=NAME]`` -- an offline session (:mod:`.session`) in ``DIR/offline-<id>/``,
ready for ``Task.import_offline_session`` (the folder or the zip written beside it at close).

Why not ``Task.set_offline(True)`` and ``Logger.report_scalar``: ``report_scalar`` takes no timestamp (every point is
stamped when it is reported) and reports NaN as 0.0, and ``Task.init`` spends seconds to minutes detecting the
repository and packages. The session is plain JSON, so this sink writes it itself: ``task.json`` (the run config as
the ``General`` hyperparameters, flattened with ``/``, each value as text with its type, as ``Task.connect`` stores
them; the run info as the configuration item ``trackbridge``; the tags) and one line of events per batch in
``metrics.jsonl``, each scalar with the record's step as ``iter`` and its wall time in milliseconds, under the title
and series of :func:`~.session.split_key`. A resumed run appends to its session (a line cut short by a killed
writer is cut off first).

What ClearML cannot take, said per key (:meth:`Sink.reject`): NaN and infinities (``report_scalar`` would store 0.0),
text (ClearML keeps console text, not text series). Histograms become ``plot`` events, a bar chart over the bucket
right edges as ClearML's ``report_histogram`` draws it, the statistics kept in the chart's ``layout.meta``.
"""
from __future__ import annotations

import json
import math
import os
import uuid
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...record import Histogram, Record, RunInfo
from ...record.values import flat_config, printable
from ...tracking.appender import Appender
from ...tracking.names import NameCache
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
from .session import CONFIG_NAME, METRICS_FILE, PLOT, SCALAR, TASK_FILE, Session, split_key, stored

if TYPE_CHECKING:       # pragma: no cover
    pass

HIST_BINS = 64
STEP_LIMIT = 2 ** 63 - 1




#: what ``json.dumps(ensure_ascii=False)`` leaves as it is and ``str.splitlines`` cuts a line at (the reader of a
#: zipped session splits its text so); only inside JSON strings, where the escape means the same
_LINE_CUTS = {"\u2028": "\\u2028", "\u2029": "\\u2029", "\x85": "\\u0085"}


def _one_line(text: str) -> str:
    """A line of ``metrics.jsonl`` that every line splitter keeps whole: U+2028, U+2029 and U+0085 escaped."""
    if "\u2028" in text or "\u2029" in text or "\x85" in text:
        for ch, esc in _LINE_CUTS.items():
            text = text.replace(ch, esc)
    return text


def _type(v: Any) -> str:
    return {bool: "bool", int: "int", float: "float", str: "str"}.get(type(v), type(v).__name__)


def _safe_id(run_id: str) -> str:
    return "".join(c if c.isalnum() or c in "_-" else "_" for c in run_id)[:96] or "run"


def bar_chart(title: str, series: str, h: Histogram) -> str | None:
    """A histogram as the plotly bar chart ClearML's ``report_histogram`` makes (x: the bucket right edges), with
    its statistics in ``layout.meta.trackbridge``; None when it has nothing to draw."""
    if h.limits is not None and h.counts is not None and len(h.limits) == len(h.counts) and h.limits:
        x, y = [float(v) for v in h.limits], [float(c) for c in h.counts]
    else:
        values = [float(v) for v in (h.values or []) if math.isfinite(v)]
        if not values:
            return None
        lo, hi = min(values), max(values)
        width = (hi - lo) / HIST_BINS or 1.0
        y = [0.0] * HIST_BINS
        for v in values:
            y[min(HIST_BINS - 1, int((v - lo) / width))] += 1.0
        x = [lo + (i + 1) * width for i in range(HIST_BINS)]
        if hi == lo:
            x, y = [hi], [float(len(values))]
    stats = {k: getattr(h, k) for k in ("min", "max", "num", "sum", "sum_squares") if getattr(h, k) is not None}
    return json.dumps({"data": [{"name": series, "x": x, "y": y, "type": "bar"}],
                       "layout": {"title": title, "xaxis": {"title": None}, "yaxis": {"title": None},
                                  "barmode": "group", "bargap": 0.08, "bargroupgap": 0,
                                  "meta": {"trackbridge": {"histogram": True, **stats}}}}, allow_nan=False)


class ClearmlSink(PointStoreSink):
    """Writes one ClearML offline session (see the module docstring)."""

    kind = "clearml"
    option_names = ("project",)
    capabilities = Capabilities(histograms=True, text=False, nan=False, wall_time=True, resolution=(
        "wall times to the millisecond", "NaN and infinities left out (ClearML would store 0.0)",
        "raw histogram samples as 64 buckets"))

    def __init__(self, location: str = "", **options: str) -> None:
        super().__init__(location, **options)
        if not location:
            raise SinkError("clearml sink: no folder given (expected clearml:DIR)")
        self.root = Path(location).expanduser()
        self.folder: Path | None = None
        self.task_id = ""
        self._names = NameCache(lambda n: stored(*split_key(n)))
        self._fh: Appender | None = None
        self._next_step = 0
        self._stale = False          # task.json is to be written again (a write that wrote it failed)

    def open(self, run: RunInfo, *, resume: bool = False) -> None:
        self.run = run
        run_id = str(run.run_id) if run.run_id else uuid.uuid4().hex
        folder = self.root / f"offline-{_safe_id(run_id)}"
        if (folder / TASK_FILE).exists() and not resume:
            run_id = f"{run_id}-{uuid.uuid4().hex[:6]}"        # a new run that reuses an id: its own session
            folder = self.root / f"offline-{_safe_id(run_id)}"
        self.folder, self.task_id = folder, folder.name
        try:
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "data").mkdir(exist_ok=True)
            metrics = folder / METRICS_FILE
            if metrics.exists():
                self._load(metrics)
            self._fh = Appender(metrics)
        except OSError as exc:
            raise SinkError(f"clearml:{self.location}: cannot write {folder}: {exc}") from None
        try:
            self._write_task()
        except SinkError:
            self._fh.close()
            self._fh = None
            raise

    def _load(self, metrics: Path) -> None:
        """An earlier session of the run: its name map, the next step; a last line cut short is cut off."""
        with open(metrics, "rb") as fh:
            data = fh.read()
        end = data.rfind(b"\n") + 1
        if end < len(data):
            with open(metrics, "r+b") as fh:
                fh.truncate(end)
        task = Session(metrics.parent).task() or {}
        ours = self._info_of(task)
        for raw, original in (ours.get("sanitized") or {}).items():
            self._names._cache[original] = raw
            self._names.changed[raw] = original
        last = self.last_step()
        self._next_step = 0 if last is None else last + 1

    @staticmethod
    def _info_of(task: dict[str, Any]) -> dict[str, Any]:
        item = (task.get("configuration") or {}).get(CONFIG_NAME) or {}
        try:
            out = json.loads(item.get("value") or "{}")
        except (json.JSONDecodeError, TypeError):
            return {}
        return out if isinstance(out, dict) else {}

    def _write_task(self) -> None:
        assert self.run is not None and self.folder is not None
        info = self.run.to_json()
        info["sanitized"] = dict(self._names.changed)
        general = {k: {"description": "", "name": k, "section": "General", "type": _type(v),
                       "value": v if isinstance(v, str) else json.dumps(v, default=str)}
                   for k, v in flat_config(self.run.config or {}, "/").items()}
        task = {"id": self.task_id, "name": self.run.name or self.task_id,
                "project_name": self.options.get("project") or self.run.project or "trackbridge",
                "type": "training", "comment": "written by trackbridge",
                "tags": [f"{k}={v}" if v else k for k, v in sorted((self.run.tags or {}).items())],
                "hyperparams": {"General": general} if general else {},
                "configuration": {CONFIG_NAME: {"name": CONFIG_NAME, "type": "json", "description":
                                                "trackbridge's run info (name map, marks)",
                                                "value": json.dumps(info, default=str, ensure_ascii=False)}},
                "execution": {"artifacts": [], "docker_cmd": "", "model": "", "model_desc": {}, "model_labels": {},
                              "parameters": {}},
                "output": {}, "offline_folder": str(self.folder), "offline_output_models": []}
        target = self.folder / TASK_FILE
        tmp = target.with_name(target.name + ".tmp")
        try:
            tmp.write_text(json.dumps(task, indent=1, default=str, ensure_ascii=False), encoding="utf-8")
            os.replace(tmp, target)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise SinkError(f"clearml:{self.location}: cannot write {target}: {exc}") from None

    def write(self, records: list[Record]) -> None:
        if self._fh is None:
            raise SinkError(f"clearml:{self.location}: write() before open() or after close()")
        events: list[dict[str, Any]] = []
        for rec, step, wall in self.points(records, lo=-STEP_LIMIT, hi=STEP_LIMIT,
                                           why="ClearML keeps iterations in 64-bit integers; the record is left out"):
            ms = round(wall * 1000)
            for name, value in rec.metrics.items():
                kind = value_kind(value)
                if kind is NONE:
                    continue
                try:
                    self._names(name)                   # recorded when it reads back otherwise (``loss/loss``)
                    title, series = split_key(name)
                except ValueError as exc:       # two keys that ClearML would file under one title and series
                    self.reject_value(name, step, printable(str(exc))[:200])
                    continue
                if kind is NUMBER:
                    try:
                        number = float(value)
                    except OverflowError:
                        self.reject_value(name, step, "an integer beyond a float")
                        continue
                    if not math.isfinite(number):
                        self.reject_value(name, step, "ClearML stores NaN and infinities as 0.0; left out")
                        continue
                    events.append({"timestamp": ms, "type": SCALAR, "task": self.task_id, "iter": step,
                                   "metric": title, "variant": series, "value": number, "method": "get"})
                elif kind is HISTOGRAM:
                    h = value.finite()
                    chart = bar_chart(title, series, h) if h is not None else None
                    if chart is None:
                        self.reject_value(name, step, "a histogram with nothing finite to draw")
                        continue
                    events.append({"timestamp": ms, "type": PLOT, "task": self.task_id, "iter": step,
                                   "metric": title, "variant": series, "plot_str": chart, "method": "get"})
                elif kind is TEXT:
                    self.reject_value(name, step, "ClearML keeps console text, not text series; not written")
                else:
                    self.reject_value(name, step, not_kept(value))
        new = self._names.take_new()
        if new:
            self.record_sanitized(new)
        if self.note_derived(records) or new or self._stale:       # the task first: a line then fails alone
            self._stale = True
            self._write_task()
            self._stale = False
        if events:
            try:
                self._fh.append((_one_line(json.dumps(events, ensure_ascii=False, allow_nan=False)) + "\n")
                                .encode("utf-8"))
            except (OSError, ValueError) as exc:        # the line is not in the file (taken back): retried whole
                raise SinkError(f"clearml:{self.location}: cannot write {METRICS_FILE}: {exc}") from None
        self.progress += 1

    def close(self) -> None:
        if self._fh is None or self.folder is None:
            return
        try:
            if self.outcome != "finished" and self.run is not None:
                self.run.extra = {**(self.run.extra or {}), "outcome": self.outcome}
            self._write_task()
            self._fh.close()
            self._fh = None
            self._zip()
        finally:
            if self._fh is not None:
                self._fh.close()
            self._fh = None

    def _zip(self) -> None:
        """``offline-<id>.zip`` beside the folder, as ClearML makes it at the end of an offline session."""
        assert self.folder is not None
        target = self.folder.with_name(self.folder.name + ".zip")
        tmp = target.with_name(target.name + ".tmp")
        try:
            with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
                for f in sorted(self.folder.rglob("*")):
                    if f.is_file() and not f.name.endswith(".tmp"):
                        z.write(f, f.relative_to(self.folder).as_posix())
            os.replace(tmp, target)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise SinkError(f"clearml:{self.location}: cannot write {target}: {exc}") from None

    # -- what the session holds ----------------------------------------------------------------------------
    def stored_points(self, since: int | None) -> list[tuple[str, int]] | None:
        """The scalar and histogram events of the session, per key and iteration (None before open)."""
        if self.folder is None:
            return None
        restore = dict(self._names.changed)
        out = []
        for _i, line, complete in Session(self.folder).event_lines():
            if not complete:
                break
            try:
                events = json.loads(line)
            except json.JSONDecodeError:
                continue
            for ev in events if isinstance(events, list) else ():
                if isinstance(ev, dict) and ev.get("type") in (SCALAR, PLOT) and ev.get("task") == self.task_id:
                    step = ev.get("iter")
                    if isinstance(step, int) and (since is None or step >= since):
                        raw = stored(str(ev.get("metric")), str(ev.get("variant")))
                        out.append((restore.get(raw, raw), step))
        return out

    def describe(self) -> str:
        return f"clearml:{self.location}" + (f" ({self.task_id})" if self.task_id else "")
