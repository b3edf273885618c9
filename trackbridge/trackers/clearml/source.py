"""ClearML reader: ``clearml:DIR[?run=ID]`` -- offline sessions (:mod:`.session`), read from their folders or zips
without a server.

* ``training_stats_scalar`` events are the points: ``iter`` as the step, ``timestamp`` (ms) as the wall time, the
  key joined from title and series (:func:`~.session.join_key`, or the name map of a session trackbridge wrote);
  they become records as in every reader of stored points (:func:`~trackbridge.tracking.source.gather`);
* ``plot`` events that trackbridge wrote for a histogram are histograms again; other plots, debug images and log
  events are reported and skipped (their type counted once);
* events of another type are reported (a newer ClearML may write them; nothing is guessed);
* the run: ``task.json``'s name, project, tags, and hyperparameters (section ``General`` at the top level, other
  sections nested under their name, values restored from their text by their type); the configuration item
  ``trackbridge`` restores the RunInfo exactly. A line of ``metrics.jsonl`` that is not JSON, or cut short at the
  end, is reported with its line number and skipped.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterator

from ...record import Histogram, Record, RunInfo
from ...tracking.source import RunReader, Source, SourceError, gather, mark_derived, nest_config
from .session import CONFIG_NAME, KNOWN_EVENTS, METRICS_FILE, PLOT, SCALAR, Session, join_key, sessions, stored


def _typed(value: Any, typ: str | None) -> Any:
    if not isinstance(value, str):
        return value
    try:
        if typ == "int":
            return int(value)
        if typ == "float":
            return float(value)
        if typ == "bool":
            return value.strip().lower() in ("true", "1")
        if typ in ("list", "dict", "tuple", "NoneType"):
            return json.loads(value)
    except (ValueError, json.JSONDecodeError):
        return value
    return value


class ClearmlRunReader(RunReader):
    """One offline session."""

    def __init__(self, session: Session, task: dict[str, Any]) -> None:
        super().__init__()
        self.session = session
        self.task = task
        self.task_id = str(task.get("id") or session.path.stem)
        self._restore: dict[str, str] | None = None
        self._info = self._build_info()

    def _build_info(self) -> RunInfo:
        item = (self.task.get("configuration") or {}).get(CONFIG_NAME) or {}
        extra = {"clearml": {"task_id": self.task_id, "path": str(self.session.path), "type": self.task.get("type")}}
        try:
            ours = json.loads(item.get("value") or "null")
        except (json.JSONDecodeError, TypeError):
            ours = None
            self.skip(f"{self.session.path} task.json configuration {CONFIG_NAME}", "not the JSON of a run")
        if isinstance(ours, dict):
            info = RunInfo.from_json(ours)
            self._restore = dict(info.sanitized or {})
            info.extra = {**(info.extra or {}), **extra}
            return info
        flat: dict[str, Any] = {}
        for section, params in (self.task.get("hyperparams") or {}).items():
            for name, p in (params or {}).items():
                if isinstance(p, dict):
                    flat[name if section == "General" else f"{section}/{name}"] = _typed(p.get("value"), p.get("type"))
        tags = {t.split("=", 1)[0]: (t.split("=", 1)[1] if "=" in t else "") for t in self.task.get("tags") or []}
        return RunInfo(name=self.task.get("name"), project=self.task.get("project_name"), run_id=self.task_id,
                       config=nest_config(flat), tags=tags, extra=extra)

    @property
    def info(self) -> RunInfo:
        return self._info

    def _name(self, title: str, series: str) -> str:
        if self._restore is None:
            return join_key(title, series)
        raw = stored(title, series)
        return self._restore.get(raw, raw)

    def records(self) -> Iterator[Record]:
        return mark_derived(self.info, gather(self._points()))

    def _points(self) -> Iterator[tuple[int | None, float | None, str, Any]]:
        where = f"{self.session.path}/metrics.jsonl"
        told: set[str] = set()
        for lineno, line, complete in self.session.event_lines():
            if not line.strip():
                continue
            if not complete:
                self.skip(f"{where}:{lineno}", f"a line cut short at the end of the file ({len(line)} characters) "
                                               f"skipped")
                return
            try:
                events = json.loads(line)
            except json.JSONDecodeError as exc:
                self.skip(f"{where}:{lineno}", f"not JSON ({exc.msg}); line skipped")
                continue
            if not isinstance(events, list):
                self.skip(f"{where}:{lineno}", "not a list of events; line skipped")
                continue
            for ev in events:
                if not isinstance(ev, dict) or ev.get("task", self.task_id) != self.task_id:
                    continue
                typ = ev.get("type")
                step, ms = ev.get("iter"), ev.get("timestamp")
                when = ms / 1000 if isinstance(ms, (int, float)) else None
                if typ == SCALAR:
                    value = ev.get("value")
                    if isinstance(step, int) and isinstance(value, (int, float)):
                        yield step, when, self._name(str(ev.get("metric")), str(ev.get("variant"))), value
                    else:
                        self.skip(f"{where}:{lineno}", f"a scalar event without an integer iter and a number: {ev}")
                    continue
                if typ == PLOT and isinstance(step, int):
                    h = self._histogram(ev.get("plot_str"))
                    if h is not None:
                        yield step, when, self._name(str(ev.get("metric")), str(ev.get("variant"))), h
                        continue
                kind = typ if typ in KNOWN_EVENTS else f"unknown event type {typ!r}"
                if kind not in told:
                    told.add(kind)
                    self.skip(f"{where}:{lineno}", f"{kind} events are not read (first at iter {step})")

    @staticmethod
    def _histogram(plot_str: Any) -> Histogram | None:
        try:
            plot = json.loads(plot_str)
            meta = plot["layout"]["meta"]["trackbridge"]
            bar = plot["data"][0]
        except (TypeError, KeyError, IndexError, json.JSONDecodeError):
            return None
        if not isinstance(meta, dict) or not meta.get("histogram"):
            return None
        stats = {k: meta[k] for k in ("min", "max", "num", "sum", "sum_squares") if k in meta}
        return Histogram(limits=[float(v) for v in bar["x"]], counts=[float(v) for v in bar["y"]], **stats)


class ClearmlSource(Source):
    """ClearML offline sessions (see the module docstring)."""
    signature = (b"PK\x03\x04", "a zip archive (ClearML's offline session)")

    kind = "clearml"
    option_names = ("run",)

    def runs(self) -> Iterator[RunReader]:
        root = Path(self.location).expanduser()
        found_any = sessions(root)
        if not found_any:
            raise SourceError(f"clearml:{self.location}: no ClearML offline session (offline-*/task.json)")
        want = self.options.get("run")
        found = 0
        for s in found_any:
            task = s.task()
            if task is None:
                raise SourceError(f"clearml:{s.path}: task.json is missing or not a JSON object")
            if not isinstance(task.get("id"), str):
                raise SourceError(f"clearml:{s.path}: task.json has no task id: not a ClearML offline session "
                                  f"trackbridge knows (clearml 2.1)")
            if not s.zip:               # the file the points are read from: the one rule, before it is opened
                from ...tracking.inputfile import check_input
                metrics = s.path / METRICS_FILE
                if os.path.lexists(metrics) and not metrics.is_file():
                    check_input(metrics, text="JSON lines")     # a FIFO, /dev/zero: an error naming it
            reader = ClearmlRunReader(s, task)
            if want and want not in (reader.task_id, reader.info.run_id, reader.info.name):
                continue
            found += 1
            yield reader
        if not found:
            raise SourceError(f"clearml:{self.location}: no session with id or name {want!r}")
