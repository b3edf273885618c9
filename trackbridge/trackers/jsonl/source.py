"""``jsonl:PATH`` -- read canonical streams (a ``.jsonl`` file, or a folder of them: one run per file).

The stream's first line is the run header (``"type": "run"``, a :class:`RunInfo`); every other line is a
:class:`Record`. Later header lines (none are written today) update the run info. Lines from veRL's ``file``
logger backend (``{"step": N, "data": {...}}``) are read too, since that is the same idea without the header.

Streaming and damage: the file is read line by line as bytes, so offsets are exact. A line that is not JSON (for
example the partial last line a crash leaves) is skipped and reported as ``file:line N (offset X)``; the lines
around it are still read. Binary junk is not damage: a file whose first line holds NUL bytes or bytes that are not
UTF-8, three unreadable lines in a row one of which is binary (:class:`~trackbridge.sources._files.JunkGuard`),
or a file whose first 20 non-empty lines are all unreadable, is given up there, with one fatal problem naming the
line and byte offset (what came before is kept). Recorded name sanitization (``RunInfo.sanitized``) is undone. Option
``run=ID`` keeps
only runs whose id or name matches.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

from ...record import Record, RunInfo, decode_value
from ...sources._files import JunkGuard, not_text, sniff_binary
from ...sources.base import RunReader, Source, SourceError


def _parse(raw: bytes) -> Any:
    return json.loads(raw)


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
        """The first header line (the run info), or a RunInfo named after the file when there is none."""
        if sniff_binary(self.path) is not None:
            return RunInfo(name=self.path.stem, run_id=self.path.stem)
        with open(self.path, "rb") as fh:
            for raw in fh:
                if not raw.strip():
                    continue
                try:
                    obj = _parse(raw)
                except ValueError:
                    break
                if isinstance(obj, dict) and obj.get("type") == "run":
                    return RunInfo.from_json(obj)
                break
        return RunInfo(name=self.path.stem, run_id=self.path.stem)

    def records(self) -> Iterator[Record]:
        binary = sniff_binary(self.path)
        if binary is not None:
            self.stop(f"{self.path}:line 1", not_text(self.path, *binary, "JSON lines"))
            return
        info = self.info
        rename = dict(info.sanitized)
        guard = JunkGuard(self, self.path, "JSON lines")
        offset = 0
        with open(self.path, "rb") as fh:
            for lineno, raw in enumerate(fh, 1):
                start, offset = offset, offset + len(raw)
                if not raw.strip():
                    continue
                where = f"{self.path}:line {lineno} (offset {start})"
                if not raw.endswith(b"\n"):
                    # the last line without its newline: complete only if it parses
                    try:
                        obj = _parse(raw)
                    except ValueError:
                        if guard.bad(lineno, start, raw, where,
                                     "partial last line (the writer stopped mid-line); skipped"):
                            return
                        continue
                else:
                    try:
                        obj = _parse(raw)
                    except ValueError as exc:
                        if guard.bad(lineno, start, raw, where, f"not JSON ({getattr(exc, 'msg', exc)}); skipped"):
                            return
                        continue
                if not isinstance(obj, dict):
                    if guard.bad(lineno, start, raw, where, f"a JSON {type(obj).__name__}, not an object; skipped"):
                        return
                    continue
                if obj.get("type") == "run":
                    guard.good()
                    if lineno > 1:
                        later = RunInfo.from_json(obj)
                        rename.update(later.sanitized)
                    continue
                try:
                    rec = self._record(obj)
                except (TypeError, ValueError, AttributeError) as exc:
                    if guard.bad(lineno, start, raw, where, f"not a record ({exc}); skipped"):
                        return
                    continue
                guard.good()
                if rename:
                    rec.metrics = {rename.get(k, k): v for k, v in rec.metrics.items()}
                    rec.derived = [rename.get(k, k) for k in rec.derived]
                yield rec
        guard.flush()

    @staticmethod
    def _record(obj: dict[str, Any]) -> Record:
        if "metrics" not in obj and isinstance(obj.get("data"), dict):   # veRL "file" backend line
            return Record(step=obj.get("step"), wall_time=obj.get("wall_time"),
                          metrics={k: decode_value(v) for k, v in obj["data"].items()})
        if "metrics" not in obj:
            # a plain logged dict per line (what `trackbridge translate` reads): numbers and strings are metrics;
            # `step` / `_step` / `global_step` give the step and `_timestamp` / `wall_time` the wall time
            metrics = {k: decode_value(v) for k, v in obj.items()
                       if k not in _PLAIN_AXES and (isinstance(v, (int, float, str)) or v is None)}
            step = next((obj[k] for k in ("step", "_step", "global_step") if isinstance(obj.get(k), int)), None)
            wall = next((obj[k] for k in ("wall_time", "_timestamp") if isinstance(obj.get(k), (int, float))), None)
            return Record(step=step, wall_time=wall, metrics=metrics)
        if not isinstance(obj.get("metrics", {}), dict):
            raise ValueError("'metrics' is not an object")
        step = obj.get("step")
        if step is not None and not isinstance(step, int):
            raise ValueError(f"step {step!r} is not an integer")
        return Record.from_json(obj)


_PLAIN_AXES = {"step", "_step", "global_step", "wall_time", "_timestamp", "_runtime"}


class JsonlSource(Source):
    """A ``.jsonl`` file or a folder of them (not recursive). Option: ``run=ID`` (id or name)."""

    kind = "jsonl"

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
