"""Reading the canonical stream (:mod:`trackbridge.stream`): its records, numbered, from a record number, a cursor or
a step on (:func:`read_stream`), a scan of its header, count and highest step (:func:`scan_stream`), and what it
holds per key and step (:func:`holdings`)."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

from ..record import Record, RunInfo
from .lines import Line, is_header, iter_lines

if TYPE_CHECKING:       # pragma: no cover
    from ..sync.holdings import Holdings




# ---------------------------------------------------------------------------------------------------- records
class RecordDecoder:
    """Turns a stream's lines into records under the names they were logged with: takes header lines
    (:meth:`header`), then decodes each record line (:meth:`record`), upgrading the canonical names of a stream
    stamped with an older schema version and restoring sanitized names."""

    def __init__(self) -> None:
        self.info: RunInfo | None = None         # the first header
        self.schema: str | None = None           # the stamp in force (the last header's)
        self._rename: dict[str, str] = {}
        self._upgrade: Callable[[str], str] | None = None

    def header(self, obj: dict[str, Any]) -> RunInfo:
        info = RunInfo.from_json(obj)
        if self.info is None:
            self.info = info
        self._rename.update(info.sanitized or {})
        if "schema" in obj or self.schema is None:
            self.schema = obj.get("schema") if isinstance(obj.get("schema"), str) else None
            self._upgrade = _upgrader(self.schema, info.names)
        return info

    def record(self, obj: dict[str, Any]) -> Record:
        """The record of a record line; ValueError/TypeError when it is not one."""
        metrics = obj.get("metrics", {})
        if not isinstance(metrics, dict):
            raise ValueError("'metrics' is not an object")
        step = obj.get("step")
        if step is not None and (not isinstance(step, int) or isinstance(step, bool)):
            raise ValueError(f"step {step!r} is not an integer")
        rec = Record.from_json(obj)
        return self.names(rec)

    def names(self, rec: Record) -> Record:
        """``rec`` with its names as logged (sanitized names restored, old canonical names upgraded)."""
        if self._rename:
            rename = self._rename
            rec.metrics = {rename.get(k, k): v for k, v in rec.metrics.items()}
            rec.derived = [rename.get(k, k) for k in rec.derived]
        up = self._upgrade
        if up is not None:
            rec.metrics = {up(k): v for k, v in rec.metrics.items()}
            rec.derived = [up(k) for k in rec.derived]
        return rec


def _upgrader(schema: str | None, names: str | None) -> Callable[[str], str] | None:
    """The name upgrade for a stream of canonical names stamped ``canonical@OLD``; None when nothing is to change
    (no stamp, names not canonical, the current version or a newer one)."""
    if not schema or (names or "canonical") != "canonical":
        return None
    kind, _, version = schema.partition("@")
    if kind != "canonical" or not version:
        return None
    from ..schema.loader import load_registry
    from ..schema.versions import VersionError, version_key
    canon = load_registry().canonical
    try:
        if version_key(version) >= version_key(canon.version):
            return None
    except VersionError:
        return None
    cache: dict[str, str] = {}

    def upgrade(name: str) -> str:
        out = cache.get(name)
        if out is None:
            out = name
            if canon.find(name) is None:
                out = canon.upgrade(name)
                head, sep, rest = name.partition("/")
                if out == name and sep and canon.find(rest) is None:     # a split prefix: eval/OLD -> eval/NEW
                    new = canon.upgrade(rest)
                    out = f"{head}/{new}" if new != rest else name
            cache[name] = out
        return out

    return upgrade


@dataclass
class StreamCursor:
    """Where a :func:`read_stream` stopped (the byte offset after the last line it took, that line's record number
    and the header state), so that the next read of the same stream starting at a later record goes on from there
    instead of decoding the file from its start again (a tracker catching up from a long spool)."""

    offset: int = 0
    lineno: int = 1
    seq: int = -1
    decoder: RecordDecoder = field(default_factory=RecordDecoder)


def read_stream(path: str | os.PathLike[str], *, start: int = 0, stop: int | None = None, since: int | None = None,
                problems: list[str] | None = None, decoder: RecordDecoder | None = None,
                cursor: StreamCursor | None = None) -> Iterator[tuple[int, Record]]:
    """``(seq, record)`` for the stream's records, ``seq`` counting record lines from 0 (complete lines holding a
    JSON object that is not a header; see the module docstring); only ``start <= seq < stop`` and, with ``since``,
    records with a step ``>= since``. Streams the file; lines skipped are reported in ``problems`` as
    ``FILE:LINE: ...``. A missing file holds no record. ``cursor``: start where an earlier read with this cursor
    stopped when that is not past ``start`` (else from the file's start), and leave it where this read stops."""
    p = Path(path)
    probs = problems if problems is not None else []
    if cursor is not None and cursor.seq >= start:
        cursor.offset, cursor.lineno, cursor.seq, cursor.decoder = 0, 1, -1, RecordDecoder()
    dec = cursor.decoder if cursor is not None else (decoder if decoder is not None else RecordDecoder())
    if not p.exists():
        return
    seq = cursor.seq if cursor is not None else -1
    offset, lineno = (cursor.offset, cursor.lineno) if cursor is not None else (0, 1)
    for line in iter_lines(p, start=offset, first_lineno=lineno):
        obj = line.obj
        if obj is None:
            probs.append(f"{p}:{line.lineno}: {line.error}" + ("" if line.partial else "; line skipped"))
            if not line.partial:
                _advance(cursor, line, seq)
            continue
        if is_header(obj):
            dec.header(obj)
            _advance(cursor, line, seq)
            continue
        if stop is not None and seq + 1 >= stop:
            return
        seq += 1
        _advance(cursor, line, seq)
        if seq < start:
            continue
        try:
            rec = dec.record(obj)
        except (TypeError, ValueError, AttributeError) as exc:
            probs.append(f"{p}:{line.lineno}: not a record ({exc}), skipped")
            continue
        if since is not None and (rec.step is None or rec.step < since):
            continue
        yield seq, rec


def _advance(cursor: StreamCursor | None, line: Line, seq: int) -> None:
    if cursor is not None:
        cursor.offset, cursor.lineno, cursor.seq = line.offset + len(line.raw), line.lineno + 1, seq


@dataclass
class StreamScan:
    """What a stream holds: its (last) run header and schema stamp, how many records, the highest step, whether it
    ends with a newline, and the lines skipped."""

    path: Path
    info: RunInfo | None = None
    schema: str | None = None
    records: int = 0
    last_step: int | None = None
    ends_with_newline: bool = True
    problems: list[str] = field(default_factory=list)


def scan_stream(path: str | os.PathLike[str]) -> StreamScan:
    """Read a stream once: header, record count, highest step. A missing file gives an empty scan."""
    p = Path(path)
    scan = StreamScan(path=p)
    if not p.exists():
        return scan
    for line in iter_lines(p):
        obj = line.obj
        if obj is None:
            scan.problems.append(f"{p}:{line.lineno}: {line.error}" + ("" if line.partial else "; line skipped"))
            continue
        if is_header(obj):
            scan.info = RunInfo.from_json(obj)
            if "schema" in obj:
                scan.schema = obj["schema"] if isinstance(obj["schema"], str) else None
            continue
        scan.records += 1
        step = obj.get("step")
        if isinstance(step, int) and not isinstance(step, bool) and (scan.last_step is None or step > scan.last_step):
            scan.last_step = step
    size = p.stat().st_size
    if size:
        with open(p, "rb") as fh:
            fh.seek(size - 1)
            scan.ends_with_newline = fh.read(1) == b"\n"
    return scan


def last_step(path: str | os.PathLike[str]) -> int | None:
    """The highest step of the stream's complete record lines (None: no record has a step)."""
    return scan_stream(path).last_step


def holdings(path: str | os.PathLike[str], since: int | None = None) -> "Holdings":
    """The points the stream holds (complete record lines; steps ``>= since``), per key and step."""
    from ..sync.holdings import Holdings
    return Holdings.from_records(rec for _seq, rec in read_stream(path, since=since))
