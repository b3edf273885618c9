"""The spool: the run's own durable log, always on. It is the canonical stream (:mod:`trackbridge.stream`) in
``spool=DIR`` (``DIR/<run_id>.jsonl``), written by the stream's own writer (:class:`SpoolFile`), not by a tracker.

Its worker never drops a record: a full queue makes the dispatcher wait (back-pressure on the disk, never on a
tracker). Batches are handed to the OS at most ``flush_interval / 2`` seconds after their first record was logged, so
a SIGKILL loses at most about ``flush_interval`` seconds; ``spool="DIR?fsync=1"`` also forces each batch to the disk.
Trackers that fell behind or failed catch up from the file; :meth:`SpoolWorker.wait_written` tells them when the
records they need are in it."""
from __future__ import annotations

import threading
import time
from pathlib import Path
from urllib.parse import parse_qsl

from .. import stream
from ..errors import UsageError
from ..holdings import Holdings
from ..record import Record, RunInfo
from ..tracking.sink import Capabilities, Sink
from .worker import RunContext, Worker

_TRUE = ("1", "true", "yes", "on")


def spool_place(spool: str) -> tuple[Path, bool]:
    """The spool folder and whether to fsync, from ``init(spool=...)``: ``"DIR"`` or ``"DIR?fsync=1"``."""
    folder, _, query = str(spool).partition("?")
    if not folder:
        raise UsageError(f"spool {spool!r}: no folder given (expected DIR or DIR?fsync=1)")
    opts = dict(parse_qsl(query, keep_blank_values=True))
    unknown = sorted(set(opts) - {"fsync"})
    if unknown:
        raise UsageError(f"spool {spool!r}: unknown option(s) {', '.join(unknown)} (the spool takes fsync=1)")
    return Path(folder).expanduser(), opts.get("fsync", "").strip().lower() in _TRUE


class SpoolFile(Sink):
    """The spool as the worker's sink: one stream file written by :class:`trackbridge.stream.StreamWriter`."""

    kind = "spool"
    capabilities = Capabilities(histograms=True, text=True, nan=True, wall_time=True)

    def __init__(self, path: Path, *, fsync: bool = False) -> None:
        super().__init__(str(path.parent), **({"fsync": "1"} if fsync else {}))
        self.path = path
        self.fsync = fsync
        self._writer = stream.StreamWriter(path, fsync=fsync, reject=self.reject)

    def open(self, run: RunInfo, *, resume: bool = False) -> None:
        self.run = run
        self._writer.open(run, resume=resume)

    def write(self, records: list[Record]) -> None:
        self._writer.write(records)

    def close(self) -> None:
        self._writer.close()

    def last_step(self) -> int | None:
        self._writer.flush()
        return stream.last_step(self.path)

    def held(self, since: int | None = None) -> Holdings:
        self._writer.flush()
        return stream.holdings(self.path, since)

    def describe(self) -> str:
        return f"spool:{self.path}"


class SpoolWorker(Worker):
    is_spool = True

    def __init__(self, ctx: RunContext, sink: Sink, *, queue_size: int, batch_size: int) -> None:
        super().__init__(ctx, sink, queue_size=queue_size, batch_size=batch_size)
        self.max_latency = ctx.options.flush_interval / 2
        self.written_seq = ctx.seq_base - 1     # highest seq handed to the OS
        self.lost = False                        # some records could not be written
        self.cond = threading.Condition()

    def put(self, seq: int, rec: Record) -> None:
        self.queue.put((seq, rec))

    def _loop(self) -> None:
        stopping = False
        while not stopping:
            batch, stopping = self._next_batch()
            if not self.opened and not self.open_tried:
                self._open(first=True)
            if self.state == "failed":
                self._skip(batch)
                continue
            batch = [(s, rec) for s, rec in batch if s > self.acked]
            if not batch:
                continue
            if self._write(batch):
                self._advance(self.acked)
            else:
                self._mark_failed(f"after {self.ctx.options.retries + 1} attempts to write")
                self._skip(batch)

    def _failed_then(self) -> str:
        return "records logged from now on may be lost if the process dies"

    def _advance(self, seq: int) -> None:
        with self.cond:
            self.written_seq = max(self.written_seq, seq)
            self.cond.notify_all()

    def _skip(self, batch: list[tuple[int, Record]]) -> None:
        if batch:
            self.lost = True
            self._advance(batch[-1][0])

    def _closed(self) -> None:
        with self.cond:
            self.done.set()
            self.cond.notify_all()

    def wait_written(self, seq: int, timeout: float) -> bool:
        """Wait until every record up to ``seq`` has been handed to the OS; False if some could not be written
        (then the spool is not a complete source for them) or the wait timed out."""
        end = time.monotonic() + timeout
        with self.cond:
            while self.written_seq < seq and not self.done.is_set():
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self.cond.wait(left)
            return self.written_seq >= seq and not self.lost
