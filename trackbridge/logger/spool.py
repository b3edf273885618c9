"""The spool: the run's own durable log, always on. It is the canonical stream (:mod:`trackbridge.stream`) in
``spool=DIR`` (``DIR/<run_id>.jsonl``), written by the stream's own writer (:class:`SpoolFile`), not by a tracker.

Its worker never drops a record while it can hold it: a full queue makes the dispatcher wait (back-pressure on the
disk, never on a tracker); a file that cannot be written keeps its batches in memory, in order, up to ``hold_mb``
(see :class:`SpoolWorker`). Batches are handed to the OS at most ``flush_interval / 2`` seconds (monotonic) after
their first record was logged, so a SIGKILL loses at most about ``flush_interval`` seconds; ``spool="DIR?fsync=1"``
also forces each batch to the disk. Trackers that fell behind or failed catch up from the file;
:meth:`SpoolWorker.wait_written` tells them when the records they need are in it. With the writer process, every
batch also goes to its feed (:mod:`.feed`), whether the file took it or not."""
from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

from .. import stream
from ..errors import UsageError
from ..record import Record, RunInfo
from ..stream import closing_header, learnt
from ..sync.holdings import Holdings
from ..tracking.sink import Capabilities, Sink
from .common import warn
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
        self.new_header = False      # resuming: write the run info again (it changed: config_changes)
        self._writer = stream.StreamWriter(path, fsync=fsync, reject=self.reject)
        self._learnt: str | None = None      # what the run info had learnt when the header was written

    def open(self, run: RunInfo, *, resume: bool = False) -> None:
        self.run = run
        self._writer.open(run, resume=resume, header=self.new_header)
        self._learnt = learnt(run)

    def write(self, records: list[Record]) -> None:
        self._writer.write(records)

    def encode(self, records: list[Record]) -> bytes:
        return self._writer.encode(records)

    def write_bytes(self, data: bytes) -> None:
        self._writer.write_bytes(data)

    def replaced(self) -> bool:
        return self._writer.replaced()

    def recreate(self) -> int:
        return self._writer.recreate()

    def close(self) -> None:
        """The closing header first, when the run learnt something the other trackers store at the end (the steps
        ``merge_ranks`` merged without a rank: see :func:`trackbridge.stream.closing_header`)."""
        head = closing_header(self.run, self._learnt, self._writer.schema) if self._writer.is_open else None
        if head is not None:
            try:
                self._writer.write_bytes(head)
                self._learnt = learnt(self.run)
            except OSError:         # a full disk: the records are what matters; the note says what is missing
                pass
        self._writer.close()

    def last_step(self) -> int | None:
        return stream.last_step(self.path)

    def held(self, since: int | None = None) -> Holdings:
        return stream.holdings(self.path, since)

    def describe(self) -> str:
        return f"spool:{self.path}"


class SpoolWorker(Worker):
    """Writes the spool; never drops a record while it can hold it. A batch the file cannot take (a full disk) is
    held in memory, in order, and written when the file takes it again (retried with back-off, and at ``finish()``);
    later batches wait behind it so that the file keeps the records in the order they were logged. At most
    ``hold_mb`` MB are held: beyond, batches are left out of the spool (the trackers still get them) with a warning.
    A spool file deleted or replaced while the run writes it is written again at its path from the file still open.
    In writer-process mode every batch also goes to the :class:`~.feed.Feed`, spool or not."""

    is_spool = True

    def __init__(self, ctx: RunContext, sink: Sink, *, queue_size: int, batch_size: int) -> None:
        super().__init__(ctx, sink, queue_size=queue_size, batch_size=batch_size)
        self.max_latency = ctx.options.flush_interval / 2
        self.written_seq = ctx.seq_base - 1     # highest seq handed to the OS (in order)
        self.last_step: int | None = ctx.resume_last_step
        self.lost = False                        # some records could not be written (the file is not complete)
        self.lost_records = 0
        self.cond = threading.Condition()
        self.held: list[tuple[int, int, bytes]] = []     # (first seq, last seq, lines) the file has not taken yet
        self.held_bytes = 0
        self.hold_limit = int(ctx.options.hold_mb * 2 ** 20)
        self.feed: Any = None                    # writer-process mode: every batch goes there too
        self.next_try = 0.0
        self.delay = 0.05
        self._said: set[str] = set()

    def put(self, seq: int, rec: Record, logged: float | None = None) -> None:
        """``logged``: the ``time.monotonic()`` of the record's ``log()`` call (its batch is written at most
        ``flush_interval / 2`` later)."""
        self.queue.put((seq, rec, time.monotonic() if logged is None else logged))

    def _loop(self) -> None:
        stopping = False
        while not stopping:
            timeout = 0.25 if not self.held else max(0.01, min(0.25, self.next_try - time.monotonic()))
            batch, stopping = self._next_batch(timeout)
            if not self.opened and not self.open_tried:
                self._try_open()
            if batch:
                self._take(batch)
            if self.held and (stopping or time.monotonic() >= self.next_try):
                self._write_held(final=stopping)

    # -- writing --------------------------------------------------------------------------------------------
    def _try_open(self) -> bool:
        self.open_tried = True
        try:
            self.sink.open(self.ctx.tracker_info(True), resume=self.ctx.resume)
        except Exception as exc:
            self.failures += 1
            self.last_error = f"open: {type(exc).__name__}: {exc}"
            self._failing(exc)
            return False
        self.opened = True
        with self.lock:
            self.state = "ok"
        return True

    def _take(self, batch: list[tuple[int, Record]]) -> None:
        first, last = batch[0][0], batch[-1][0]
        recs = [item[1] for item in batch]
        data = self.sink.encode(recs)             # type: ignore[attr-defined]
        self._report_rejected()
        steps = [r.step for r in recs if r.step is not None]
        with self.cond:
            if steps:
                top = max(steps)
                self.last_step = top if self.last_step is None else max(self.last_step, top)
            if self.opened and not self.held:
                try:
                    self.sink.write_bytes(data)   # type: ignore[attr-defined]
                except OSError as exc:
                    self.failures += 1
                    self.last_error = f"write: {type(exc).__name__}: {exc}"
                    self._failing(exc)
                    self._hold(first, last, data)
                else:
                    self.written += len(batch)
                    self.acked = last
                    self.written_seq = max(self.written_seq, last)
                    self.cond.notify_all()
            else:
                self._hold(first, last, data)
            if self.feed is not None:
                self.feed.records(first, last, data)
        if self.opened and not self.held:
            self._check_place()

    def _hold(self, first: int, last: int, data: bytes) -> None:
        if self.held_bytes + len(data) > self.hold_limit:
            self.lost = True
            self.lost_records += last - first + 1
            if "dropped" not in self._said:
                self._said.add("dropped")
                self._say(f"the spool {self.sink.describe()} cannot be written ({self.last_error}) and already holds "
                          f"{self.held_bytes / 2 ** 20:.0f} MB of records in memory (hold_mb); records from number "
                          f"{first} on are left out of the spool: the trackers still get them, but a crash of this "
                          f"process loses them and a tracker that falls behind cannot catch them up")
            self.cond.notify_all()
            return
        self.held.append((first, last, data))
        self.held_bytes += len(data)

    def _write_held(self, *, final: bool) -> None:
        """Write the held batches, in order, as far as the file takes them. ``final``: at ``finish()``, keep trying
        for a few seconds, then leave out what is still held (and say so)."""
        end = time.monotonic() + (5.0 if final else 0.0)
        while True:
            if not self.opened and not self._try_open():
                pass
            else:
                with self.cond:
                    while self.held:
                        first, last, data = self.held[0]
                        try:
                            self.sink.write_bytes(data)     # type: ignore[attr-defined]
                        except OSError as exc:
                            self.failures += 1
                            self.last_error = f"write: {type(exc).__name__}: {exc}"
                            break
                        self.held.pop(0)
                        self.held_bytes -= len(data)
                        self.written += last - first + 1
                        self.acked = last
                        if not self.lost:
                            self.written_seq = max(self.written_seq, last)
                        self.cond.notify_all()
                    if not self.held:
                        self.delay = 0.05
                        with self.lock:
                            self.state = "ok"
                        if "recovered" not in self._said and "failing" in self._said:
                            self._said.add("recovered")
                            self._say(f"the spool {self.sink.describe()} is written again; nothing held back was "
                                      f"lost" if not self.lost else
                                      f"the spool {self.sink.describe()} is written again, without the "
                                      f"{self.lost_records} records it could not hold")
                        self._check_place()
                        return
            if not final or time.monotonic() >= end:
                break
            time.sleep(0.1)
        self.next_try = time.monotonic() + self.delay
        self.delay = min(1.0, self.delay * 2)
        if final and self.held:
            n = sum(last - first + 1 for first, last, _d in self.held)
            with self.cond:
                self.lost = True
                self.lost_records += n
                self.held, self.held_bytes = [], 0
                self.cond.notify_all()
            self._say(f"the spool {self.sink.describe()} still cannot be written at finish() ({self.last_error}); "
                      f"{n} records are not in it (the trackers that kept up have them)")

    def _check_place(self) -> None:
        """The spool file deleted or replaced while the run writes it: write it again at its path."""
        try:
            gone = self.sink.replaced()           # type: ignore[attr-defined]
        except Exception:
            return
        if not gone:
            return
        with self.cond:
            try:
                size = self.sink.recreate()       # type: ignore[attr-defined]
            except OSError as exc:
                if "place" not in self._said:
                    self._said.add("place")
                    self._say(f"the spool file {self.sink.describe()} was deleted or replaced while the run writes "
                              f"it, and cannot be written again there ({type(exc).__name__}: {exc}); the records "
                              f"stay in the file this process holds open, and it is tried again")
                return
        self._say(f"the spool file {self.sink.describe()} was deleted or replaced while the run writes it; it was "
                  f"written again there from the file still open ({size} bytes: nothing lost)")

    def _failing(self, exc: BaseException) -> None:
        with self.lock:
            self.state = "failed"
        if "failing" in self._said:
            return
        self._said.add("failing")
        self._said.discard("recovered")
        self._say(f"the spool {self.sink.describe()} cannot be written ({type(exc).__name__}: {exc}); records are "
                  f"held in memory (at most {self.ctx.options.hold_mb:g} MB, hold_mb) and written when it can be "
                  f"again; the trackers still get every record")

    def _say(self, message: str) -> None:
        self.ctx.report(message)
        warn(f"trackbridge: {message}")

    def _failed_then(self) -> str:
        return "records logged from now on may be lost if the process dies"

    def _closed(self) -> None:
        with self.cond:
            self.done.set()
            self.cond.notify_all()

    def spooled(self) -> int | None:
        """The highest record number the file holds with every one before it (None once it lost records: its
        record numbers are then no longer those of the run)."""
        return None if self.lost else self.written_seq

    def wait_written(self, seq: int, timeout: float) -> bool:
        """Wait until every record up to ``seq`` has been handed to the OS; False if some could not be written
        (then the spool is not a complete source for them) or the wait timed out."""
        end = time.monotonic() + timeout
        with self.cond:
            while self.written_seq < seq and not self.done.is_set() and not self.lost:
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self.cond.wait(left)
            return self.written_seq >= seq and not self.lost
