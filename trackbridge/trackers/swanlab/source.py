"""SwanLab reader: ``swanlab:LOGDIR[?run=ID]`` -- offline/local runs read from their ``.swanlab`` files, without a
server, an account or ``swanlab sync``.

``LOGDIR`` is the folder given to ``swanlab.init(logdir=...)`` (``./swanlog`` by default), one run folder, or one
``run-<id>.swanlab`` file. Each file is read a block at a time (:func:`~.store.read_payloads`: a file of another
store version is refused with one line; damage ends the read there and is reported as ``file:offset``) and its
records parsed with swanlab's own protobuf classes:

* ``scalar`` records are the points: key, step, and the time the value was logged (nanoseconds) as wall time; they
  become records as in every reader of stored points (:func:`~trackbridge.tracking.source.gather`);
* media records (images, text, audio ...) are reported and skipped;
* the run: ``start`` (project, name, id, tags, group), ``files/config.yaml`` (SwanLab's ``{desc, sort, value}``
  entries) and the last ``finish`` state (``extra["swanlab"]["state"]``); the ``_trackbridge`` config entry, written by
  :class:`~trackbridge.trackers.swanlab.sink.SwanlabSink`, restores the RunInfo and its name map exactly.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

from ...record import Record, RunInfo
from ...tracking import names as _names
from ...tracking.source import RunReader, Source, SourceError, gather, mark_derived
from . import store
from .sink import _read_config


class SwanlabRunReader(RunReader):
    """One ``.swanlab`` run file."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path
        self._pb = store.messages()
        self._info: RunInfo | None = None
        self._restore: dict[str, str] = {}
        self._ours = False

    def _records(self) -> Iterator[Any]:
        record_pb2 = self._pb[0]
        for offset, payload, _end in store.read_payloads(self.path, lambda o, w: self.skip(f"{self.path}:{o}", w)):
            rec = record_pb2.Record()
            try:
                rec.ParseFromString(payload)
            except Exception as exc:  # noqa: BLE001 - one record swanlab's classes cannot parse
                self.skip(f"{self.path}:{offset}", f"not a SwanLab record ({type(exc).__name__})")
                continue
            yield offset, rec

    @property
    def info(self) -> RunInfo:
        if self._info is None:
            self._info = self._read_info()
        return self._info

    def _read_info(self) -> RunInfo:
        start, state = None, None
        for _off, rec in self._records():
            kind = rec.WhichOneof("record_type")
            if kind == "start" and start is None:
                start = rec.start
            elif kind == "finish":
                state = self._pb[1].RunState.Name(rec.finish.state)
        config = _read_config(self.path, self.skip)
        ours = config.pop(store.CONFIG_KEY, None)
        swan = {"state": state, "file": str(self.path)}
        if start is not None:
            swan.update(workspace=start.workspace, description=start.description, job_type=start.job_type)
        if isinstance(ours, dict):
            info = RunInfo.from_json(ours)
            self._restore = dict(info.sanitized or {})
            self._ours = True
            info.extra = {**(info.extra or {}), "swanlab": swan}
            return info
        tags = {t.split("=", 1)[0]: (t.split("=", 1)[1] if "=" in t else "") for t in (start.tags if start else [])}
        if start is not None and start.group:
            tags["group"] = start.group
        return RunInfo(name=start.name if start else None, project=start.project if start else None,
                       run_id=start.id if start else None, config=config, tags=tags, extra={"swanlab": swan})

    def _name(self, key: str) -> str:
        name = self._restore.get(key)
        if name is None:
            name = _names.unescape(key) if self._ours else key
        return name

    def records(self) -> Iterator[Record]:
        return mark_derived(self.info, gather(self._points()))

    def _points(self) -> Iterator[tuple[int | None, float | None, str, Any]]:
        skipped: dict[str, int] = {}
        for offset, rec in self._records():
            kind = rec.WhichOneof("record_type")
            if kind == "scalar":
                s = rec.scalar
                when = s.timestamp.seconds + s.timestamp.nanos / 1e9 if s.HasField("timestamp") else None
                yield s.step, when, self._name(s.key), s.value.number
            elif kind == "media":
                if rec.media.key not in skipped:
                    self.skip(f"{self.path}:{offset}", f"{rec.media.key!r}: media values are not read")
                skipped[rec.media.key] = skipped.get(rec.media.key, 0) + 1


class SwanlabSource(Source):
    """SwanLab runs under a logdir (see the module docstring)."""

    kind = "swanlab"
    option_names = ("run",)

    def runs(self) -> Iterator[RunReader]:
        try:
            store.messages()
        except ImportError:
            raise SourceError("the swanlab reader needs swanlab: pip install 'trackbridge[swanlab]'") from None
        root = Path(self.location).expanduser()
        files = store.run_files(root)
        if not files:
            raise SourceError(f"swanlab:{self.location}: no SwanLab run (run-*/run-*.swanlab)")
        want = self.options.get("run")
        found = 0
        for path in files:
            reader = SwanlabRunReader(path)
            try:
                info = reader.info
            except store.FormatError as exc:
                raise SourceError(str(exc)) from None
            if want and want not in (info.run_id, info.name):
                continue
            found += 1
            yield reader
        if not found:
            raise SourceError(f"swanlab:{self.location}: no run with id or name {want!r}")
