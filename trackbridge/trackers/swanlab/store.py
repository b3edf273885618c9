"""SwanLab's offline run format (swanlab 0.10.x), as ``swanlab/sdk/internal/core_python/store/__init__.py`` and the
``swanlab.proto`` messages of swanlab 0.10.3 define it, and where a run's files are:

* a run folder ``LOGDIR/run-<YYYYmmdd_HHMMSS>-<id>/`` holding ``run-<id>.swanlab`` (the records), ``files/``
  (``config.yaml``: ``{key: {desc, sort, value}}``) and ``media/``;
* the ``.swanlab`` file: a 7-byte header (``:SWL``, magic ``0xE1D6`` little-endian u16, store version u8 = 2), then
  LevelDB log chunks in 32 KiB blocks (leveldb ``doc/log_format.md``: a 7-byte chunk header, CRC32 of the type byte
  and the data, u32 LE; length u16 LE; type u8 FULL=1, FIRST=2, MIDDLE=3, LAST=4; a block tail shorter than 7
  bytes is zero padding), each reassembled payload a ``swanlab.record.v1.Record``: ``start`` (num -1), the config
  ``save`` (num -3), ``column`` (one per key, before its first point), ``scalar`` (``key``, ``step``, ``timestamp``
  = when the value was logged, ``value.number``), ``finish`` (num -2), numbered 1, 2, ... otherwise.

The store keeps no backward compatibility between format versions (its module docstring says so), so both
directions are guarded: :func:`check_version` refuses a swanlab package whose store version or release trackbridge
does not know (the sink writes the format itself, to keep wall times), and a file whose header names another
version is refused with one line naming it.
"""
from __future__ import annotations

import re
import struct
import zlib
from pathlib import Path
from typing import IO, Any, Callable, Iterator

from ...errors import TrackBridgeError

IDENT = b":SWL"
MAGIC = 0xE1D6
VERSION = 2                       # the store version of swanlab 0.10.x
RELEASES = ("0.10.",)             # swanlab releases whose format this module writes
HEADER = struct.pack("<4sHB", IDENT, MAGIC, VERSION)
BLOCK = 32768
CHUNK_HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4
_CRC = {t: zlib.crc32(bytes([t])) & 0xFFFFFFFF for t in (FULL, FIRST, MIDDLE, LAST)}
START_NUM, FINISH_NUM, CONFIG_NUM = -1, -2, -3
CONFIG_KEY = "_trackbridge"       # config.yaml entry holding trackbridge's RunInfo (JSON)
_FOLDER = re.compile(r"^run-(\d{8}_\d{6})-(.+)$")


class FormatError(TrackBridgeError, ValueError):
    """A ``.swanlab`` file of another format version, or not one at all."""


def check_version() -> str:
    """The installed swanlab release, when trackbridge writes its format; raises ImportError when swanlab is
    missing and RuntimeError (one line) when its release or store version is not one trackbridge knows."""
    import swanlab
    release = str(getattr(swanlab, "__version__", "?"))
    try:
        from swanlab.sdk.internal.core_python import store
        store_version = getattr(store, "LEVELDBLOG_HEADER_VERSION", None)
    except ImportError:
        store_version = None
    if not release.startswith(RELEASES) or store_version != VERSION:
        raise RuntimeError(f"swanlab {release} (store version {store_version}): trackbridge writes SwanLab's offline "
                           f"format of swanlab 0.10.x (store version {VERSION}) itself, to keep wall times; "
                           f"install swanlab 0.10.3 (pip install 'trackbridge[swanlab]')")
    return release


def messages() -> Any:
    """swanlab's protobuf modules: ``(record_pb2, run_pb2, column_pb2, data_pb2, save_pb2)``."""
    from swanlab.proto.swanlab.metric.column.v1 import column_pb2
    from swanlab.proto.swanlab.metric.data.v1 import data_pb2
    from swanlab.proto.swanlab.record.v1 import record_pb2
    from swanlab.proto.swanlab.run.v1 import run_pb2
    from swanlab.proto.swanlab.save.v1 import save_pb2
    return record_pb2, run_pb2, column_pb2, data_pb2, save_pb2


# -- the file --------------------------------------------------------------------------------------------
def read_header(fh: IO[bytes], where: str) -> None:
    head = fh.read(CHUNK_HEADER)
    if len(head) < CHUNK_HEADER:
        raise FormatError(f"{where}: {len(head)} bytes, shorter than a SwanLab run file's header")
    ident, magic, version = struct.unpack("<4sHB", head)
    if ident != IDENT or magic != MAGIC:
        raise FormatError(f"{where}: not a SwanLab run file (header {head!r})")
    if version != VERSION:
        raise FormatError(f"{where}: SwanLab store version {version}; trackbridge reads version {VERSION} "
                          f"(swanlab 0.10.x), and SwanLab keeps no compatibility between versions")


def read_payloads(path: Path, report: Callable[[int, str], None] | None = None) -> Iterator[tuple[int, bytes, int]]:
    """``(offset, payload, end)`` of each complete record of a ``.swanlab`` file, in order, read a block at a time
    (``end``: the offset just after the record). Damage (a bad checksum, a chunk out of sequence, a torn tail) ends
    the read there and is reported as ``report(offset, what)``."""
    def bad(at: int, what: str) -> None:
        if report is not None:
            report(at, what)

    with open(path, "rb") as fh:
        read_header(fh, str(path))
        pos = CHUNK_HEADER
        pending: bytearray | None = None
        start = 0
        while True:
            want = BLOCK - pos % BLOCK
            block = fh.read(want)
            if not block:
                if pending is not None:
                    bad(start, "a record cut off at the end of the file skipped")
                return
            o = 0
            while o < len(block):
                if len(block) - o < CHUNK_HEADER:
                    if len(block) == want and not any(block[o:]):
                        break                                   # the zero padding of a block's tail
                    bad(pos + o, f"a torn record at the end ({len(block) - o} bytes) skipped")
                    return
                crc, length, typ = struct.unpack_from("<IHB", block, o)
                body = block[o + CHUNK_HEADER:o + CHUNK_HEADER + length]
                if typ not in _CRC or len(body) < length or zlib.crc32(body, _CRC[typ]) & 0xFFFFFFFF != crc:
                    if len(body) < length and o + CHUNK_HEADER + length > len(block) and len(block) < want:
                        bad(pos + o, "a torn record at the end of the file skipped")
                    else:
                        bad(pos + o, "a record with a bad checksum or type; the rest of the file is not read")
                    return
                here = pos + o
                o += CHUNK_HEADER + length
                if typ == FULL:
                    if pending is not None:
                        bad(start, "a record cut short (no LAST chunk) skipped")
                        pending = None
                    yield here, bytes(body), pos + o
                elif typ == FIRST:
                    pending, start = bytearray(body), here
                elif pending is None:
                    bad(here, "a record continued without its FIRST chunk skipped")
                else:
                    pending += body
                    if typ == LAST:
                        yield start, bytes(pending), pos + o
                        pending = None
            pos += len(block)
            if len(block) < want:
                if pending is not None:
                    bad(start, "a record cut off at the end of the file skipped")
                return


def valid_end(path: Path) -> int:
    """The offset just after the last complete record of ``path`` (where appending may continue)."""
    end = CHUNK_HEADER
    for _offset, _payload, after in read_payloads(path):
        end = after
    return end


class LogWriter:
    """Appends records to a ``.swanlab`` file in the LevelDB log framing (see the module docstring).

    Records are framed in memory and written by :meth:`flush`; the file holds whole records only: a flush that fails
    (a full disk) or is cut short is taken back whole (the file is cut to the end of the last flush that completed,
    :attr:`durable`) and raises, so a batch retried after it is written once, never after a torn tail."""

    def __init__(self, path: Path, *, create: bool) -> None:
        self.fh: IO[bytes]
        self._buf = bytearray()
        if create:
            self.fh = open(path, "xb", buffering=0)
            self.durable = 0
            self._buf += HEADER
            self.pos = CHUNK_HEADER
            try:
                self.flush()
            except OSError:
                self.fh.close()
                path.unlink(missing_ok=True)        # no run file rather than one without its header
                raise
        else:
            end = valid_end(path)
            self.fh = open(path, "r+b", buffering=0)
            self.fh.truncate(end)           # a torn tail left by a killed writer is cut off before appending
            self.fh.seek(end)
            self.pos = self.durable = end

    def write(self, payload: bytes) -> None:
        room = BLOCK - self.pos % BLOCK
        if room < CHUNK_HEADER:
            self._buf += b"\x00" * room
            self.pos += room
            room = BLOCK
        if len(payload) + CHUNK_HEADER <= room:
            self._chunk(payload, FULL)
            return
        first, rest = payload[:room - CHUNK_HEADER], payload[room - CHUNK_HEADER:]
        self._chunk(first, FIRST)
        while len(rest) > BLOCK - CHUNK_HEADER:
            self._chunk(rest[:BLOCK - CHUNK_HEADER], MIDDLE)
            rest = rest[BLOCK - CHUNK_HEADER:]
        self._chunk(rest, LAST)

    def _chunk(self, data: bytes, typ: int) -> None:
        self._buf += struct.pack("<IHB", zlib.crc32(data, _CRC[typ]) & 0xFFFFFFFF, len(data), typ)
        self._buf += data
        self.pos += CHUNK_HEADER + len(data)

    def flush(self) -> None:
        """Write what :meth:`write` framed since the last flush; on failure cut the file back to :attr:`durable`,
        drop the framed records and raise the OSError."""
        if not self._buf:
            return
        view = memoryview(self._buf)
        done = 0
        try:
            while done < len(view):
                n = self.fh.write(view[done:])
                if not n:
                    raise OSError(f"wrote nothing at offset {self.durable + done}")
                done += n
        except OSError:
            self.rollback()
            raise
        finally:
            view.release()
        self.durable += done
        self._buf.clear()

    def rollback(self) -> None:
        """Forget the records framed since the last complete flush, and cut the file back to its end (cutting a file
        shorter needs no room)."""
        self._buf.clear()
        self.pos = self.durable
        try:
            self.fh.truncate(self.durable)
        finally:
            self.fh.seek(self.durable)

    def close(self) -> None:
        try:
            self.flush()
        finally:
            self.fh.close()


# -- where runs are ----------------------------------------------------------------------------------------
def run_files(location: Path) -> list[Path]:
    """Every ``run-*.swanlab`` file that ``location`` designates (a file, a run folder, or a logdir), in order."""
    if location.is_file():
        return [location]
    if not location.is_dir():
        return []
    files = sorted(location.glob("run-*.swanlab"))
    for d in sorted(location.glob("run-*")):
        if d.is_dir() and not d.is_symlink():
            files += sorted(d.glob("run-*.swanlab"))
    return files


def safe_id(run_id: str) -> str:
    """A run id as it may appear in a folder and file name (``[A-Za-z0-9_-]``, other characters as ``_``)."""
    return "".join(c if c.isalnum() or c in "_-" else "_" for c in run_id)[:64] or "run"


def find_run(logdir: Path, run_id: str) -> Path | None:
    """The ``.swanlab`` file of the run ``run_id`` under ``logdir`` (the newest folder, when several)."""
    sid = safe_id(run_id)
    found = sorted(p for d in logdir.glob(f"run-*-{sid}") if _FOLDER.match(d.name) and d.is_dir()
                   for p in d.glob(f"run-{sid}.swanlab"))
    return found[-1] if found else None
