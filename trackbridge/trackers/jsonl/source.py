"""``jsonl:PATH`` -- read canonical streams (a ``.jsonl`` file, or a folder of them: one run per file).

The stream's format is :mod:`trackbridge.stream`'s (header line, then one record per line; names of a stream
stamped with an older canonical schema are upgraded there); this reader adds its damage policy (below) and two other
shapes of JSON lines: veRL's ``file`` logger backend (``{"step": N, "data": {...}}``, the same idea without the
header) and plain logged dicts (what ``trackbridge translate`` reads). A plain dict's wall time is ``wall_time`` or
``_timestamp``, else ``timestamp`` or ``time`` when it holds Unix seconds (prime-rl's ``file`` monitor writes
``{"step": N, "time": time.time(), ...}``); a ``time`` that is not a plausible Unix time (a duration in seconds) stays
a metric.

Streaming and damage: the file is read line by line as bytes, so offsets are exact. A line that is not JSON (for
example the partial last line a crash leaves) is skipped and reported as ``file:line N (offset X)``; the lines
around it are still read. Binary junk is not damage: a file whose first line holds NUL bytes or bytes that are not
UTF-8, three unreadable lines in a row one of which is binary (:class:`~trackbridge.tracking.textfiles.JunkGuard`),
or a file whose first 20 non-empty lines are all unreadable, is given up there, with one fatal problem naming the
line and byte offset (what came before is kept). Recorded name sanitization (``RunInfo.sanitized``) is undone.
Option ``run=ID`` keeps only runs whose id or name matches.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterator

from ... import stream
from ...record import Record, RunInfo, decode_value
from ...tracking.source import RunReader, Source, SourceError
from ...tracking.textfiles import JunkGuard, not_text, sniff_binary


class JsonlRunReader(RunReader):
    """One ``.jsonl`` file."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path
        self._info: RunInfo | None = None

    @property
    def info(self) -> RunInfo:
        if self._info is None:
            self._info = self._read_header()
        return self._info

    def _read_header(self) -> RunInfo:
        """The run info: the last header line of the run (a resumed run's, or the closing header written at the end:
        what the run learnt while logging, such as the steps merged without a rank), else the first; a RunInfo named
        after the file when there is none."""
        if sniff_binary(self.path) is None:
            for line in stream.iter_lines(self.path, complete_only=False):
                if line.obj is not None and stream.is_header(line.obj):
                    first = RunInfo.from_json(line.obj)
                    last = _last_header(self.path, line.offset + len(line.raw))
                    return last if last is not None and last.run_id == first.run_id else first
                break
        return RunInfo(name=self.path.stem, run_id=self.path.stem)

    def records(self) -> Iterator[Record]:
        binary = sniff_binary(self.path)
        if binary is not None:
            self.stop(f"{self.path}:line 1", not_text(self.path, *binary, "JSON lines"))
            return
        decoder = stream.RecordDecoder()
        guard = JunkGuard(self, self.path, "JSON lines")
        for line in stream.iter_lines(self.path, complete_only=False):
            lineno, start, raw, obj = line.lineno, line.offset, line.raw, line.obj
            where = f"{self.path}:line {lineno} (offset {start})"
            if obj is None:
                if guard.bad(lineno, start, raw, where, f"{line.error}; skipped"):
                    return
                continue
            if stream.is_header(obj):
                guard.good()
                decoder.header(obj)
                continue
            try:
                rec = self._record(obj, decoder)
            except (TypeError, ValueError, AttributeError) as exc:
                if guard.bad(lineno, start, raw, where, f"not a record ({exc}); skipped"):
                    return
                continue
            guard.good()
            yield rec
        guard.flush()

    @staticmethod
    def _record(obj: dict[str, Any], decoder: stream.RecordDecoder) -> Record:
        if "metrics" not in obj and isinstance(obj.get("data"), dict):   # veRL "file" backend line
            return Record(step=obj.get("step"), wall_time=obj.get("wall_time"),
                          metrics={k: decode_value(v) for k, v in obj["data"].items()})
        if "metrics" not in obj:
            # a plain logged dict per line (what `trackbridge translate` reads): numbers and strings are metrics;
            # `step` / `_step` / `global_step` give the step and `_timestamp` / `wall_time` the wall time
            step = next((obj[k] for k in ("step", "_step", "global_step") if isinstance(obj.get(k), int)), None)
            wall = next((obj[k] for k in ("wall_time", "_timestamp") if isinstance(obj.get(k), (int, float))), None)
            taken = _PLAIN_AXES
            if wall is None:
                # `timestamp` / `time` (prime-rl's file monitor): the wall time only when it reads as Unix seconds
                wall_key = next((k for k in _WALL_COLUMNS if _is_unix_seconds(obj.get(k))), None)
                if wall_key is not None:
                    wall, taken = obj[wall_key], _PLAIN_AXES | {wall_key}
            metrics = {k: decode_value(v) for k, v in obj.items()
                       if k not in taken and (isinstance(v, (int, float, str)) or v is None)}
            return Record(step=step, wall_time=wall, metrics=metrics)
        return decoder.record(obj)


#: how a header line the stream's writer wrote starts (compact JSON, ``type`` first: ``stream.header_json``)
_HEADER_START = b'\n{"type":"run"'


def _last_header(path: Path, after: int) -> RunInfo | None:
    """The last complete header line of ``path`` after byte ``after`` (None: none), found without decoding the
    record lines: a search of the file's bytes for the start of a header line."""
    import mmap
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if size <= after:
                return None
            with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
                at = mm.rfind(_HEADER_START, max(0, after - 1))
                if at < 0:
                    return None
                end = mm.find(b"\n", at + 1)
                if end < 0:             # a header cut off by a crash: not one
                    return None
                obj, _error = stream.parse_line(mm[at + 1:end])
    except (OSError, ValueError):
        return None
    if obj is None or not stream.is_header(obj):
        return None
    try:
        return RunInfo.from_json(obj)
    except (TypeError, ValueError, AttributeError):
        return None


_PLAIN_AXES = {"step", "_step", "global_step", "wall_time", "_timestamp", "_runtime"}
_WALL_COLUMNS = ("timestamp", "time")
# Unix seconds from 2001-09-09 (1e9) to 2100-01-01: a `time` column outside it is some other quantity (a duration)
_UNIX_SECONDS = (1e9, 4102444800.0)


def _is_unix_seconds(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and _UNIX_SECONDS[0] <= v <= _UNIX_SECONDS[1]


class JsonlSource(Source):
    """A ``.jsonl`` file or a folder of them (not recursive). Option: ``run=ID`` (id or name)."""
    text_form = "JSON lines"

    kind = "jsonl"
    option_names = ("run",)

    def __init__(self, location: str, **options: str) -> None:
        super().__init__(location, **options)
        self.path = Path(location).expanduser()
        if not self.path.exists():
            raise SourceError(f"jsonl source: no such file or folder: {location}")

    def files(self) -> list[Path]:
        if self.path.is_file():
            return [self.path]
        found = sorted(p for p in self.path.glob("*.jsonl") if p.is_file())
        if not found:
            raise SourceError(f"jsonl source: no *.jsonl files in {self.path}")
        return found

    def runs(self) -> Iterator[RunReader]:
        want = self.options.get("run")
        for path in self.files():
            reader = JsonlRunReader(path)
            if want and want not in (reader.info.run_id, reader.info.name, path.stem):
                continue
            yield reader
