"""Writing the canonical stream (:mod:`trackbridge.stream`): :class:`StreamWriter`, every batch whole or not at all."""
from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any, Iterable

from ..record import Record, RunInfo, dumps, encode_value
from ..record.values import printable
from .lines import Reject, header_json, is_header, parse_line, schema_stamp


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
