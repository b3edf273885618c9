"""The canonical stream on disk: the one module that knows its JSON-lines form, for writing and for reading.

One file per run (:func:`stream_file`: ``DIR/<run_id>.jsonl``). The first line is the **header**, the run's
:class:`~trackbridge.record.RunInfo` with ``"type": "run"``, the line format (``"format": "trackbridge.stream/1"``)
and the canonical schema in force when it was written (``"schema": "canonical@1.1.0"``, the ``version:`` of
``mappings/canonical.yaml``). Every other line is one :class:`~trackbridge.record.Record` (``step``, ``wall_time``,
``metrics``, ``derived``, and ``axis`` for a record on an x axis of its own), compact JSON with NaN and
infinities as strings so that the file stays strict JSON. Why
this shape: anyone with ``json`` can read it, it is appended without rewriting, and it is enough to rebuild the run in
any tracker.

Writing (:class:`StreamWriter`): every batch is handed to the operating system before :meth:`StreamWriter.write`
returns (``fsync=True`` also forces it to the disk), whole or not at all: a write the disk cuts short (full) is cut
back to where it started, so a retry neither doubles lines nor glues one onto a torn line. A crash *during* a write
can leave a partial last line; reopening with ``resume=True`` first ends that line, so that new lines are never glued
onto it. A resumed stream written under
another canonical schema version gets a new header line, so every record is read under the schema it was written in.

Reading: :func:`read_stream` (the records, numbered, from a record number or, with a :class:`StreamCursor`, from
where an earlier read stopped; from a step on) and :func:`scan_stream` (header, record count, highest step). They
count records the same way: complete lines only (a last line without its newline may still be being
written), header lines not counted, a line that is not JSON skipped and reported as ``FILE:LINE: ...``. The *last
step* of a stream is its highest step (what resume needs: steps may go back), in :func:`scan_stream` and
:func:`last_step` alike. Streams without a schema stamp (written before it existed) are read as they are; a stream
stamped with an older canonical version has its canonical names upgraded through the ``versions:`` renames of
``canonical.yaml`` (:meth:`~trackbridge.schema.model.CanonicalSchema.upgrade`). Names the writer recorded as
sanitized (``RunInfo.sanitized``) are restored.

:func:`iter_lines` and :class:`RecordDecoder` are the parts a reader with its own damage policy builds on (the
``jsonl`` source, which also reads JSON lines that are not this stream).

Needs nothing but the standard library (the mapping files only to stamp a stream and to upgrade an old one's names).
Longer than 400 lines on purpose: the writer and every reader of the format stay in one module, so that the line
format is known in one place.
"""
from __future__ import annotations

import json
import os
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator

from .record import Record, RunInfo, dumps, encode_value
from .values import printable

if TYPE_CHECKING:       # pragma: no cover
    from .holdings import Holdings

SUFFIX = ".jsonl"
HEADER_TYPE = "run"
_UNSAFE = re.compile(r"[^A-Za-z0-9_.\-]")

Reject = Callable[[str, "int | None", str], None]      # (key, step, why): a value left out of a record


def stream_file(directory: str | os.PathLike[str], run_id: str) -> Path:
    """Where the stream of ``run_id`` lives in ``directory``: the run id with characters unsafe in file names
    replaced by ``_``, plus ``.jsonl``."""
    return Path(directory).expanduser() / (_UNSAFE.sub("_", run_id) + SUFFIX)


def schema_stamp(mappings: list[str] | None = None) -> str:
    """``canonical@<version>``: the canonical schema version of the mapping files in use (read through the
    registry, so ``TRACKBRIDGE_MAPPINGS_DIR`` counts)."""
    from .schema.loader import load_registry
    return f"canonical@{load_registry(mappings or None).canonical.version}"


def is_header(obj: dict[str, Any]) -> bool:
    return obj.get("type") == HEADER_TYPE


def header_json(info: RunInfo, schema: str | None) -> dict[str, Any]:
    """The header line's object: the run info, the line format and the schema stamp."""
    obj = info.to_json()
    if schema:
        obj = {"type": obj.pop("type"), "format": obj.pop("format"), "schema": schema, **obj}
    return obj


#: the run info's ``extra`` entries learnt while a run logs that a closing header carries (:func:`closing_header`)
LEARNT = ("ranks",)


def learnt(info: RunInfo | None) -> str:
    """What the run info learnt while logging (:data:`LEARNT`: ``merge_ranks``' steps merged without a rank), as text
    to compare with what it was when the header was written."""
    extra = (info.extra or {}) if info is not None else {}
    return dumps({k: extra.get(k) for k in LEARNT})


def closing_header(info: RunInfo | None, at_open: str | None, schema: str | None = None) -> bytes | None:
    """The **closing header** of a stream: one more header line at its end, the run info as it stands when the writer
    closes, for what the run learnt while logging and the trackers store with the run when it closes (the steps
    ``merge_ranks`` merged without a rank); None when nothing was learnt since the header written at open
    (``at_open``: :func:`learnt` then). Readers take the last header of a run as its run info (:func:`scan_stream`,
    the stream source)."""
    if info is None or at_open is None or learnt(info) == at_open:
        return None
    return (dumps(header_json(info, schema or schema_stamp())) + "\n").encode("utf-8")


# ---------------------------------------------------------------------------------------------------- lines
@dataclass
class Line:
    """One non-blank line of a stream file: where it is, its bytes, and the JSON object it holds (``obj``) or why it
    holds none (``error``)."""

    lineno: int
    offset: int
    raw: bytes
    obj: dict[str, Any] | None = None
    error: str | None = None
    partial: bool = False           # the last line, without its newline


def parse_line(raw: bytes) -> tuple[dict[str, Any] | None, str | None]:
    """``(object, None)`` for a line holding a JSON object, else ``(None, why not)``."""
    try:
        obj = json.loads(raw)
    except UnicodeDecodeError as exc:
        return None, f"not UTF-8 text ({exc.reason} at byte {exc.start})"
    except json.JSONDecodeError as exc:
        return None, f"not a JSON object ({exc.msg} at column {exc.colno})"
    except ValueError as exc:
        return None, f"not a JSON object ({exc})"
    if not isinstance(obj, dict):
        return None, f"expected a JSON object, got {type(obj).__name__}"
    return obj, None


def iter_lines(path: Path, *, complete_only: bool = True, start: int = 0, first_lineno: int = 1) -> Iterator[Line]:
    """Every non-blank line of ``path`` from byte ``start``, parsed. A last line without its newline is ``partial``:
    with ``complete_only`` it is reported (``error``) and not parsed (its writer may still be writing it); otherwise
    it is parsed, and reported only when it does not parse."""
    offset = start
    with open(path, "rb") as fh:
        if start:
            fh.seek(start)
        for lineno, raw in enumerate(fh, first_lineno):
            here, offset = offset, offset + len(raw)
            if not raw.strip():
                continue
            if not raw.endswith(b"\n"):
                if complete_only:
                    yield Line(lineno, here, raw, None, f"partial last line ({len(raw)} bytes) skipped", True)
                    return
                obj, error = parse_line(raw)
                yield Line(lineno, here, raw, obj, error and "partial last line (the writer stopped mid-line)", True)
                return
            obj, error = parse_line(raw)
            yield Line(lineno, here, raw, obj, error)


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
    from .schema.loader import load_registry
    from .schema.versions import VersionError, version_key
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
    from .holdings import Holdings
    return Holdings.from_records(rec for _seq, rec in read_stream(path, since=since))


# ---------------------------------------------------------------------------------------------------- writing
class StreamWriter:
    """Appends the canonical stream of one run to ``path``: :meth:`open` writes the header (or, resuming, ends a
    partial last line), :meth:`write` a batch of records. ``fsync``: force every batch to the disk. ``schema``: the
    stamp (default: :func:`schema_stamp`). ``reject(key, step, why)`` is told about each value left out because it
    is not strict JSON in UTF-8 (the rest of its record is written)."""

    def __init__(self, path: str | os.PathLike[str], *, fsync: bool = False, schema: str | None = None,
                 reject: Reject | None = None) -> None:
        self.path = Path(path)
        self.fsync = fsync
        self.schema = schema
        self.reject = reject
        self._fh: Any = None
        self._torn = False

    @property
    def is_open(self) -> bool:
        return self._fh is not None

    def open(self, info: RunInfo, *, resume: bool = False, header: bool = False) -> None:
        """Create the file with its header; with ``resume``, append to an existing one (FileExistsError when it
        holds something and ``resume`` is False), with a new header when the schema changed or ``header``."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        exists = self.path.exists() and self.path.stat().st_size > 0
        if exists and not resume:
            raise FileExistsError(f"{self.path} already holds a run")
        stamp = self.schema or schema_stamp()
        head = (dumps(header_json(info, stamp)) + "\n").encode("utf-8")
        if self.path.exists() and not self.path.is_file():
            raise FileExistsError(f"{self.path} is not a regular file")
        if exists and _torn_header(self.path):
            os.truncate(self.path, 0)   # a crash cut the header line itself: nothing of the run is in the file yet
        if not self.path.exists():
            if _create_with(self.path, head):       # the header and the file in one step (see _create_with)
                self._fh = open(self.path, "a+b", buffering=0)
                self.flush()
                return
            if not resume:              # another writer created it between the check and now
                raise FileExistsError(f"{self.path} already holds a run")
        fh = open(self.path, "a+b", buffering=0)      # whole writes, no buffer (see write_bytes); readable (recreate)
        self._fh = fh
        try:
            if os.fstat(fh.fileno()).st_size == 0:      # an empty file (made by someone else): the header first
                self.write_bytes(head)
            else:
                with open(self.path, "rb") as rd:        # end a partial last line left by a crash
                    rd.seek(-1, os.SEEK_END)
                    self._torn = rd.read(1) != b"\n"
                if header or _last_schema(self.path) != stamp:     # records from here on: another schema or info
                    self.write_bytes(head)
        except BaseException:
            self._fh = None
            fh.close()
            raise

    def write(self, records: Iterable[Record]) -> None:
        self.write_bytes(self.encode(records))

    def encode(self, records: Iterable[Record]) -> bytes:
        """The lines of ``records``, one per record (a value that is not strict JSON in UTF-8 is left out and told
        to ``reject``; a record none of whose values can be written keeps its line, without metrics, so that the
        stream's record numbers stay those of the records logged)."""
        records = list(records)
        try:
            return "".join(dumps(r.to_json()) + "\n" for r in records).encode("utf-8")
        except (TypeError, ValueError):      # UnicodeEncodeError is a ValueError: find the values at fault
            return "".join(self._line(r) for r in records).encode("utf-8")

    def write_bytes(self, data: bytes) -> None:
        """Append lines made by :meth:`encode`, whole or not at all: a write that fails part-way (the disk full)
        is cut back to where it started, so that a retry neither doubles lines nor glues them onto a torn one. When
        even that fails, the next write first ends the torn line (readers skip it and say so). Then the file is
        handed to the OS (and with ``fsync`` forced to the disk). Raises the ``OSError`` of the failed write."""
        if self._fh is None:
            raise ValueError(f"{self.path}: write() before open() or after close()")
        if not data:
            return
        fd = self._fh.fileno()
        start = os.lseek(fd, 0, os.SEEK_END)
        try:
            if self._torn:
                _write_all(fd, b"\n")
                self._torn = False
                start += 1
            _write_all(fd, data)
            if self.fsync:
                os.fsync(fd)
        except OSError:
            try:
                os.ftruncate(fd, start)
            except OSError:
                self._torn = os.lseek(fd, 0, os.SEEK_END) != start
            raise

    def replaced(self) -> bool:
        """True when the file this writer appends to is no longer at its path (deleted or replaced meanwhile)."""
        if self._fh is None:
            return False
        try:
            here = os.stat(self.path)
        except OSError:
            return True
        mine = os.fstat(self._fh.fileno())
        return (here.st_dev, here.st_ino) != (mine.st_dev, mine.st_ino)

    def recreate(self) -> int:
        """After :meth:`replaced`: put the stream back at its path with everything written so far (read from the
        file this writer still holds open), then append there. Returns the bytes copied. Raises ``OSError`` (the
        old file stays in use: nothing is lost while the process lives)."""
        assert self._fh is not None
        old = self._fh.fileno()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.recreate")
        size = os.fstat(old).st_size
        try:
            with open(tmp, "wb", buffering=0) as out:
                done = 0
                while done < size:
                    chunk = os.pread(old, min(1 << 20, size - done), done)
                    if not chunk:
                        break
                    _write_all(out.fileno(), chunk)
                    done += len(chunk)
                if self.fsync:
                    os.fsync(out.fileno())
            os.replace(tmp, self.path)
        except OSError:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        fh = open(self.path, "a+b", buffering=0)
        self._fh.close()
        self._fh = fh
        return done

    def _line(self, rec: Record) -> str:
        """One record's line, leaving out each value that is not strict JSON in UTF-8 (told to ``reject``)."""
        try:
            return (dumps(rec.to_json()) + "\n").encode("utf-8").decode("utf-8")
        except (TypeError, ValueError):
            pass
        keep = {}
        for k, v in rec.metrics.items():
            try:
                dumps({k: encode_value(v)}).encode("utf-8")
            except (TypeError, ValueError) as exc:
                self._reject(printable(k), rec.step, f"{type(exc).__name__}: {printable(str(exc))[:200]}")
                continue
            keep[k] = v
        derived = [d for d in rec.derived if d in keep]
        try:
            line = dumps(Record(rec.step, rec.wall_time, keep, derived, rec.axis).to_json()) + "\n"
            return line.encode("utf-8").decode("utf-8")
        except (TypeError, ValueError) as exc:
            self._reject("step", rec.step if isinstance(rec.step, int) else None,
                         f"the record is not JSON ({type(exc).__name__}: {printable(str(exc))[:200]})")
            step = rec.step if isinstance(rec.step, int) and not isinstance(rec.step, bool) else None
            return dumps(Record(step, None, {}).to_json()) + "\n"     # its line kept: record numbers unchanged

    def _reject(self, key: str, step: int | None, why: str) -> None:
        if self.reject is not None:
            self.reject(key, step, why)

    def flush(self) -> None:
        """Nothing is buffered (every write goes to the OS at once); with ``fsync``, force the file to the disk."""
        if self._fh is not None and self.fsync:
            os.fsync(self._fh.fileno())

    def close(self) -> None:
        if self._fh is not None:
            try:
                self.flush()
            finally:
                self._fh.close()
                self._fh = None


def _create_with(path: Path, head: bytes) -> bool:
    """Create ``path`` holding ``head`` (the header line) in one step, so that no reader and no later attempt ever
    sees the file without its whole header (an attempt killed while writing it leaves only a temporary file, which
    the next one replaces). False when ``path`` exists already (another writer made it: the caller resumes it)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with open(tmp, "wb") as fh:
            fh.write(head)
            fh.flush()
        try:
            os.link(tmp, path)          # atomic, and fails when the file exists
        except FileExistsError:
            return False
        except OSError:                 # a file system without hard links: exclusive create, then the header
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                return False
            with os.fdopen(fd, "wb") as out:
                out.write(head)
        return True
    finally:
        try:
            os.unlink(tmp)
        except OSError:
            pass


def _torn_header(path: Path) -> bool:
    """True when ``path`` holds only part of its first line (no newline anywhere): a header cut off by a crash."""
    with open(path, "rb") as fh:
        return b"\n" not in fh.read(1 << 20) and fh.read(1) == b""


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _last_schema(path: Path) -> str | None:
    """The schema stamp of the last header line of ``path`` (None: no stamp). Only lines that can be a header (they
    hold ``"run"``) are parsed, so that resuming a long stream does not decode every record."""
    stamp = None
    with open(path, "rb") as fh:
        for raw in fh:
            if b'"run"' not in raw or not raw.endswith(b"\n"):
                continue
            obj, _error = parse_line(raw)
            if obj is not None and is_header(obj):
                stamp = obj.get("schema")
    return stamp


__all__ = ["LEARNT", "Line", "RecordDecoder", "closing_header", "learnt", "StreamCursor", "StreamScan",
           "StreamWriter", "holdings", "is_header", "iter_lines", "last_step", "parse_line", "read_stream",
           "scan_stream", "schema_stamp", "stream_file"]
