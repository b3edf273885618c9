"""TensorBoard's storage format as trackbridge writes and reads it, without TensorFlow: TFRecord framing
(``uint64 length``, masked CRC32C of the length, the serialized Event, masked CRC32C of the data), the event files
of a run folder, and the tags and files trackbridge keeps its run info under.

A native CRC32C (``crc32c`` or ``google_crc32c``) is used when installed, otherwise a pure-Python slicing-by-8
implementation (~20 MB/s). Reading frames in large chunks and, at the first sign of damage, record by record:
a record whose length CRC is wrong is skipped by scanning forward to the next valid record, a record whose data CRC
is wrong is skipped, a truncated last record ends the file; each is reported to the reader as ``file:offset``.
"""
from __future__ import annotations

import struct
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

if TYPE_CHECKING:       # pragma: no cover
    from ...tracking.source import RunReader

DERIVED_DESCRIPTION = "derived by trackbridge (computed from other metrics, not logged by the trainer)"
INFO_FILE = "trackbridge-run.json"   # the run info at close (see TensorBoardSink._write_final_info)
RUN_TAG = "trackbridge/run"        # text summary holding RunInfo JSON
META_PREFIX = "trackbridge/"       # tags this sink writes for itself (not metrics)
HPARAMS_TAG = "_hparams_/session_start_info"

# ---------------------------------------------------------------------------------------------------------------
# CRC32C (Castagnoli), masked as TFRecord wants it.

_POLY = 0x82F63B78


def _tables() -> list[tuple[int, ...]]:
    t0 = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ _POLY if c & 1 else c >> 1
        t0.append(c)
    tables = [t0]
    for _ in range(7):
        prev = tables[-1]
        tables.append([(prev[i] >> 8) ^ t0[prev[i] & 0xFF] for i in range(256)])
    return [tuple(t) for t in tables]


_T = _tables()


def _crc32c_py(data: bytes) -> int:
    """CRC32C in pure Python, slicing-by-8 (twice the speed of the byte-wise table loop)."""
    T0, T1, T2, T3, T4, T5, T6, T7 = _T
    crc = 0xFFFFFFFF
    n = len(data)
    n8 = n - n % 8
    if n8:
        for a, b in struct.iter_unpack("<II", memoryview(data)[:n8]):
            a ^= crc
            crc = (T7[a & 0xFF] ^ T6[(a >> 8) & 0xFF] ^ T5[(a >> 16) & 0xFF] ^ T4[a >> 24]
                   ^ T3[b & 0xFF] ^ T2[(b >> 8) & 0xFF] ^ T1[(b >> 16) & 0xFF] ^ T0[b >> 24])
    for x in data[n8:]:
        crc = T0[(crc ^ x) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _pick_crc32c() -> tuple[Callable[[bytes], int], str]:
    try:  # the package tensorboardX also uses
        import crc32c as _native

        return (lambda d: _native.crc32c(d)), "crc32c"
    except Exception:
        pass
    try:
        import google_crc32c as _g

        if getattr(_g, "implementation", "c") == "c":
            return _g.value, "google_crc32c"
    except Exception:
        pass
    return _crc32c_py, "python"


crc32c, CRC_IMPLEMENTATION = _pick_crc32c()


def masked_crc32c(data: bytes) -> int:
    """The CRC32C of ``data``, masked as TFRecord framing stores it."""
    x = crc32c(data)
    return (((x >> 15) | (x << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def frame(data: bytes) -> bytes:
    """One TFRecord: length, masked CRC of the length, data, masked CRC of the data."""
    header = struct.pack("<Q", len(data))
    return b"".join((header, struct.pack("<I", masked_crc32c(header)), data,
                     struct.pack("<I", masked_crc32c(data))))


def event_file_problem(head: bytes, size: int, found: str | None) -> str | None:
    """The input rule's test of an event file's first bytes (trackbridge/tracking/inputfile.py): a TensorBoard event
    file starts with a TFRecord frame, an 8-byte length and its masked CRC-32C."""
    if found is not None:
        return f"{found}, not a TensorBoard event file ({size:,} bytes)"
    if len(head) < 12 or struct.unpack_from("<I", head, 8)[0] != masked_crc32c(head[:8]):
        return f"not a TensorBoard event file: its first record's header does not hold ({size:,} bytes)"
    return None


def event_files(folder: Path) -> list[Path]:
    """The event files directly inside ``folder``, in the order TensorBoard reads them (by name)."""
    out = []
    for p in sorted(folder.iterdir()):
        if "tfevents" not in p.name or p.is_dir():
            continue
        if not p.is_file():
            # a FIFO, a link to /dev/zero, a dangling link: an error naming it (the one rule of
            # trackbridge.read.inputs), never silently no file at all
            from ...tracking.inputfile import check_input
            check_input(p, head_check=event_file_problem)
        out.append(p)
    return out


_CHUNK = 1 << 22      # bytes read at a time: memory stays flat whatever the file's size


def read_event_records(path: Path, reader: "RunReader | None", *, verify: bool = True) -> Iterator[tuple[int, bytes]]:
    """``(offset, serialized Event)`` for each valid TFRecord of ``path``; damage goes to ``reader.skip``.

    The file is read in large chunks and framed in memory (an ordinary TensorBoard file holds one small record per
    scalar value); at the first sign of damage the record-by-record reader takes over from that offset and says
    what it skipped."""
    crc = crc32c
    unpack_from = struct.unpack_from
    size = path.stat().st_size
    with open(path, "rb") as fh:
        buf, base, pos = b"", 0, 0
        while base + pos < size:
            if len(buf) - pos < 12:
                buf, base, pos = buf[pos:] + fh.read(_CHUNK), base + pos, 0
                if len(buf) < 12:
                    break                                   # a truncated header: reported below
            length, hcrc = unpack_from("<QI", buf, pos)
            x = crc(buf[pos:pos + 8])
            if hcrc != (((x >> 15) | (x << 17)) + 0xA282EAD8) & 0xFFFFFFFF:
                break                                       # damage: the careful reader reports and resyncs
            need = 16 + length
            if base + pos + need > size:
                break                                       # a length beyond the file (truncated, or crafted: 2**40)
            if len(buf) - pos < need:
                more = fh.read(max(_CHUNK, need - (len(buf) - pos)))
                if not more:
                    break                                   # truncated record
                buf, base, pos = buf[pos:] + more, base + pos, 0
                continue
            data = buf[pos + 12:pos + 12 + length]
            if verify:
                x = crc(data)
                if unpack_from("<I", buf, pos + 12 + length)[0] != (((x >> 15) | (x << 17)) + 0xA282EAD8) & 0xFFFFFFFF:
                    if reader is not None:
                        reader.skip(f"{path}:{base + pos}", "bad data CRC; record skipped")
                    pos += need
                    continue
            yield base + pos, data
            pos += need
        else:
            return
    yield from _read_careful(path, reader, verify=verify, start=base + pos)


def _read_careful(path: Path, reader: "RunReader | None", *, verify: bool = True, start: int = 0
                  ) -> Iterator[tuple[int, bytes]]:
    """Record by record from ``start``, reporting truncation and bad CRCs and resyncing after damage."""

    def report(offset: int, what: str) -> None:
        if reader is not None:
            reader.skip(f"{path}:{offset}", what)

    size = path.stat().st_size
    with open(path, "rb") as fh:
        offset = start
        while offset < size:
            fh.seek(offset)
            header = fh.read(12)
            if len(header) < 12:
                report(offset, f"truncated record header ({len(header)} of 12 bytes at end of file); rest skipped")
                return
            length, = struct.unpack("<Q", header[:8])
            if struct.unpack("<I", header[8:])[0] != masked_crc32c(header[:8]) or offset + 16 + length > size:
                if struct.unpack("<I", header[8:])[0] == masked_crc32c(header[:8]):
                    report(offset, f"truncated record (needs {length} bytes, file ends after "
                                   f"{size - offset - 12}); rest skipped")
                    return
                nxt = _resync(fh, offset + 1, size)
                if nxt is None:
                    report(offset, "bad length CRC and no valid record after it; rest of file skipped")
                    return
                report(offset, f"bad length CRC; skipped {nxt - offset} bytes to the next valid record at {nxt}")
                offset = nxt
                continue
            data = fh.read(length)
            footer = fh.read(4)
            if verify and struct.unpack("<I", footer)[0] != masked_crc32c(data):
                report(offset, "bad data CRC; record skipped")
            else:
                yield offset, data
            offset += 16 + length


def _resync(fh: Any, start: int, size: int, limit: int = 1 << 20) -> int | None:
    """The first offset >= start (within ``limit`` bytes) where a record with valid length and data CRCs begins."""
    fh.seek(start)
    window = fh.read(min(limit, size - start) + 12)
    for i in range(0, max(0, len(window) - 12)):
        head = window[i:i + 8]
        if struct.unpack("<I", window[i + 8:i + 12])[0] != masked_crc32c(head):
            continue
        length, = struct.unpack("<Q", head)
        at = start + i
        if at + 16 + length > size:
            continue
        fh.seek(at + 12)
        data = fh.read(length)
        if struct.unpack("<I", fh.read(4))[0] == masked_crc32c(data):
            return at
    return None
