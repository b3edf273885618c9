"""Comet reader: ``comet:DIR[?run=ID]`` -- offline experiments (:mod:`.archive`), read from their zips (or from the
folder of a run still being written) without a server or an account.

* ``metric_msg`` messages are the points: ``step``, ``local_timestamp`` (ms) as the wall time, ``"NaN"`` and
  ``"Infinity"`` back to floats; they become records as in every reader of stored points
  (:func:`~trackbridge.tracking.source.gather`), in message order;
* the run: ``experiment.json`` (project, workspace, tags), ``log_other`` ``Name``, and the parameters (``a|b``
  names nested again); the ``log_other`` entry ``trackbridge`` restores the RunInfo exactly (the last one wins);
* other messages (assets, system details, code, ...) are counted by type and reported once; a line that is not JSON
  is reported with its line number and skipped; an ``experiment.json`` without the fields Comet requires is
  refused (not an offline experiment of the comet_ml 3.58 format).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

from ...record import Record, RunInfo
from ...tracking.source import RunReader, Source, SourceError, gather, mark_derived
from .archive import EXPERIMENT_REQUIRED, INFO_KEY, METRIC, OTHER, PARAMETER, SPECIAL, Archive, archives

_QUIET = {"parameter_msg", "log_other", "metric_msg"}


class CometRunReader(RunReader):
    """One offline experiment."""

    def __init__(self, archive: Archive, experiment: dict[str, Any]) -> None:
        super().__init__()
        self.archive = archive
        self.experiment = experiment
        self._info = self._build_info()

    def _build_info(self) -> RunInfo:
        params: dict[str, Any] = {}
        others: dict[str, Any] = {}
        for msg in self._messages(report=False):
            payload, kind = msg.get("payload") or {}, msg.get("type")
            if kind == PARAMETER and isinstance(payload.get("param"), dict):
                p = payload["param"]
                if p.get("source") != "auto-logged":
                    params[str(p.get("paramName"))] = p.get("paramValue")
            elif kind == OTHER:
                others[str(payload.get("key"))] = payload.get("value")
        extra = {"comet": {"experiment_key": self.archive.key, "path": str(self.archive.path),
                           "workspace": self.experiment.get("workspace"), "finished": not self.archive.partial}}
        ours = others.get(INFO_KEY)
        if isinstance(ours, str):
            try:
                info = RunInfo.from_json(json.loads(ours))
                info.extra = {**(info.extra or {}), **extra}
                return info
            except (json.JSONDecodeError, TypeError):
                self.skip(f"{self.archive.path} log_other {INFO_KEY}", "not the JSON of a run")
        config: dict[str, Any] = {}
        for name, value in params.items():
            parts, d = name.split("|"), config
            for part in parts[:-1]:
                nxt = d.get(part)
                if not isinstance(nxt, dict):
                    nxt = d[part] = {}
                d = nxt
            d[parts[-1]] = SPECIAL.get(value, value) if isinstance(value, str) else value
        tags = {t.split("=", 1)[0]: (t.split("=", 1)[1] if "=" in t else "") for t in self.experiment.get("tags") or []}
        return RunInfo(name=others.get("Name") or self.archive.key, project=self.experiment.get("project_name"),
                       run_id=self.archive.key, config=config, tags=tags, extra=extra)

    @property
    def info(self) -> RunInfo:
        return self._info

    def _messages(self, report: bool = True) -> Iterator[dict[str, Any]]:
        where = f"{self.archive.path}/messages.json"
        for lineno, line, complete in self.archive.lines():
            if not line.strip():
                continue
            if not complete:
                if report:
                    self.skip(f"{where}:{lineno}", f"a line cut short at the end ({len(line)} characters) skipped")
                return
            try:
                msg = json.loads(line)
            except json.JSONDecodeError as exc:
                if report:
                    self.skip(f"{where}:{lineno}", f"not JSON ({exc.msg}); line skipped")
                continue
            if isinstance(msg, dict):
                msg["_line"] = lineno
                yield msg
            elif report:
                self.skip(f"{where}:{lineno}", "not a message object; line skipped")

    def records(self) -> Iterator[Record]:
        return mark_derived(self.info, gather(self._points()))

    def _name(self, stored: str) -> str:
        """A metric's name as logged: a name the sink had to escape (see the sink's module) given back."""
        restore = self.info.sanitized
        if not restore:
            return stored
        if stored in restore:
            return restore[stored]
        base, _, stat = stored.rpartition("/")
        return f"{restore[base]}/{stat}" if base in restore else stored

    def _points(self) -> Iterator[tuple[int | None, float | None, str, Any]]:
        where = f"{self.archive.path}/messages.json"
        told: set[str] = set()
        for msg in self._messages():
            typ = str(msg.get("type"))
            payload = msg.get("payload") or {}
            if typ == METRIC and isinstance(payload.get("metric"), dict):
                m = payload["metric"]
                step, value = m.get("step"), m.get("metricValue")
                if isinstance(value, str):
                    value = SPECIAL.get(value, value)
                if isinstance(step, float) and step.is_integer():
                    step = int(step)
                if not (step is None or isinstance(step, int)) or not isinstance(value, (int, float)):
                    self.skip(f"{where}:{msg['_line']}", f"metric {m.get('metricName')!r}: step {step!r} or value "
                                                         f"{m.get('metricValue')!r} is not a number; skipped")
                    continue
                ms = payload.get("local_timestamp")
                wall = ms / 1000 if isinstance(ms, (int, float)) else None
                yield step, wall, self._name(str(m.get("metricName"))), value
            elif typ not in _QUIET and typ not in told:
                told.add(typ)
                self.skip(f"{where}:{msg['_line']}", f"{typ} messages are not read")


class CometSource(Source):
    """Comet offline experiments (see the module docstring)."""
    signature = (b"PK\x03\x04", "a zip archive (Comet's offline experiment)")

    kind = "comet"
    option_names = ("run",)

    def runs(self) -> Iterator[RunReader]:
        found_any = archives(Path(self.location).expanduser())
        if not found_any:
            raise SourceError(f"comet:{self.location}: no Comet offline experiment (*.zip with messages.json)")
        want = self.options.get("run")
        found = 0
        for a in found_any:
            exp = a.experiment()
            if exp is None or any(k not in exp for k in EXPERIMENT_REQUIRED):
                raise SourceError(f"comet:{a.path}: experiment.json is missing or lacks "
                                  f"{', '.join(k for k in EXPERIMENT_REQUIRED if k not in (exp or {}))}: not an "
                                  f"offline experiment of the comet_ml 3.58 format")
            reader = CometRunReader(a, exp)
            if want and want not in (a.key, reader.info.run_id, reader.info.name):
                continue
            found += 1
            yield reader
        if not found:
            raise SourceError(f"comet:{self.location}: no experiment with key, id or name {want!r}")
