"""The ``.wandb`` transaction log, as wandb writes it (offline or not) and trackbridge reads it, and where a run's
files are (``DIR/wandb/offline-run-<time>-<id>/run-<id>.wandb``, or ``DIR`` itself being one of those folders):

* the file starts with a 7-byte header: ``:W&B``, magic ``0xBEE1`` (little-endian u16), version ``0``;
* then LevelDB-log-style chunks in 32 KiB blocks: 7-byte chunk header (CRC32 **IEEE** of type byte + data, u32 LE;
  length u16 LE; type u8: FULL=1, FIRST=2, MIDDLE=3, LAST=4), a block tail shorter than 7 bytes is padding;
* each reassembled payload is a ``wandb.proto.wandb_internal_pb2.Record`` (the wandb package's protobuf classes).

The sink stores each record's step under :data:`STEP_KEY` and the run info in the config under :data:`META_KEY`.
"""
from __future__ import annotations

import re
import struct
import zlib
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

if TYPE_CHECKING:       # pragma: no cover
    from ...tracking.source import RunReader

STEP_KEY = "trackbridge/step"
META_KEY = "_trackbridge"
BLOCK = 32768
HEADER = b":W&B" + struct.pack("<H", 0xBEE1) + b"\x00"
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4
_FOLDER = re.compile(r"^(?:offline-)?run-(\d{8}_\d{6})-(.+?)(?:-(\d+))?$")


def folder_order(path: Path) -> tuple[str, int, str]:
    """Sort key of ``.wandb`` files: by the run folder's timestamp and resume number, then path."""
    m = _FOLDER.match(path.parent.name)
    if not m:
        return ("", 0, str(path))
    return (m.group(1), int(m.group(3) or 0), str(path))


def run_id_of(path: Path) -> str:
    """The run id of a ``run-<id>.wandb`` file (from its name)."""
    return path.name[len("run-"):-len(".wandb")] if path.name.startswith("run-") else path.stem


def find_wandb_files(location: Path) -> list[Path]:
    """Every ``run-*.wandb`` file that ``location`` designates (see the module doc), without symlinked folders."""
    if location.is_file():
        return [location]
    found: list[Path] = []
    candidates = [location]
    for sub in (location, location / "wandb"):
        if sub.is_dir():
            candidates += [d for d in sorted(sub.iterdir()) if d.is_dir() and not d.is_symlink()]
    seen = set()
    for d in candidates:
        for f in sorted(d.glob("run-*.wandb")):
            if f.is_file() and f.resolve() not in seen:
                seen.add(f.resolve())
                found.append(f)
    return found


def run_files(wandb_dir: Path, run_id: str) -> list[Path]:
    """The ``.wandb`` files of run ``run_id`` under ``wandb_dir`` (a ``wandb/`` folder), oldest first."""
    if not wandb_dir.is_dir():
        return []
    files = [f for f in find_wandb_files(wandb_dir) if run_id_of(f) == run_id]
    return sorted(files, key=folder_order)


def read_payloads(path: Path, reader: "RunReader | None" = None, *, start: int = 0) -> Iterator[tuple[int, bytes]]:
    """``(offset, payload)`` for each complete record of a ``.wandb`` file; damage is reported to ``reader``.

    ``start`` (a multiple of the 32 KiB block size) begins mid-file: records that began earlier are skipped.
    """

    def report(offset: int, what: str) -> None:
        if reader is not None:
            reader.skip(f"{path}:{offset}", what)

    with open(path, "rb") as fh:
        if start:
            fh.seek(start)
            offset = start
        else:
            head = fh.read(len(HEADER))
            if head != HEADER:
                report(0, f"not a wandb transaction log (header {head!r}); file skipped")
                return
            offset = len(HEADER)
        pending: list[bytes] = []
        pending_at = 0
        while True:
            left = BLOCK - offset % BLOCK
            if left < 7:
                fh.read(left)
                offset += left
                continue
            chunk_head = fh.read(7)
            if not chunk_head:
                break
            if len(chunk_head) < 7:
                report(offset, f"truncated chunk header ({len(chunk_head)} of 7 bytes); rest skipped")
                break
            crc, length, kind = struct.unpack("<IHB", chunk_head)
            if kind == 0 and length == 0 and crc == 0:     # zero padding (preallocated or block tail)
                fh.read(left - 7)
                offset += left
                continue
            data = fh.read(length)
            if len(data) < length:
                report(offset, f"truncated chunk (needs {length} bytes, {len(data)} present); rest skipped")
                break
            if length > left - 7 or zlib.crc32(bytes([kind]) + data) & 0xFFFFFFFF != crc:
                report(offset, "bad chunk CRC; skipped to the next block")
                pending = []
                nxt = offset + left
                fh.seek(nxt)
                offset = nxt
                continue
            at = offset
            offset += 7 + length
            if kind == _FULL:
                if pending:
                    report(pending_at, "record without its last chunk; skipped")
                    pending = []
                yield at, data
            elif kind == _FIRST:
                if pending:
                    report(pending_at, "record without its last chunk; skipped")
                pending, pending_at = [data], at
            elif kind in (_MIDDLE, _LAST):
                if not pending:
                    report(at, "chunk continues a record whose start is missing; skipped")
                    continue
                pending.append(data)
                if kind == _LAST:
                    yield pending_at, b"".join(pending)
                    pending = []
            else:
                report(at, f"unknown chunk type {kind}; skipped")
        if pending:
            report(pending_at, "truncated record (its last chunk is missing); skipped")


def has_exit_record(path: Path, *, whole: bool = False) -> bool:
    """Whether the file's last blocks (``whole``: the whole file, for a file whose end is zero padding wandb-core
    made ahead of its records) hold the run's ``exit`` record (the run was finished and flushed)."""
    from wandb.proto import wandb_internal_pb2 as pb

    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return False
    start = 0 if whole else max(0, (size // BLOCK - 1) * BLOCK)
    for _, data in read_payloads(path, None, start=start):
        rec = pb.Record()
        try:
            rec.ParseFromString(data)
        except Exception:
            continue
        if rec.WhichOneof("record_type") == "exit":
            return True
    return False
