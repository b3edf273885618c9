"""A tracker's worker: fed through its queue while it keeps up, from the spool when it does not.

States: ``pending`` (not opened yet), ``ok`` (fed through its queue), ``behind`` (its queue was full: it is fed
from the spool until it has caught up, so the dispatcher never waits for it), ``failed`` (its tracker failed:
retried every ``retry_interval`` seconds, then fed from the spool), ``closed``. Whatever it takes from the spool
is cut down to what the tracker lacks where a write may have landed in part (:mod:`trackbridge.sync.catchup`)."""
from __future__ import annotations

import queue
import threading
import time
from typing import Any, Callable, Iterable

from ..record import Record
from ..stream import StreamCursor, read_stream
from ..sync.catchup import CatchUp, lacking, write_batches
from ..sync.holdings import Audit, audit
from ..tracking.sink import Sink
from .common import log
from .worker import RunContext, Worker


class SpoolShort(Exception):
    """The spool does not hold (yet) the records a tracker is to catch up."""


class TrackerWorker(Worker):

    def __init__(self, ctx: RunContext, sink: Sink, *, queue_size: int, batch_size: int,
                 rename: Callable[[Record], Record] | None) -> None:
        super().__init__(ctx, sink, queue_size=queue_size, batch_size=batch_size)
        self.rename = rename
        self.dropped_hi: int | None = None     # highest seq not queued (failed or behind): to take from the spool
        self.failed_since: int | None = None   # lowest step of a write that failed (it may have landed in part)
        self.behind_times = 0
        self.next_retry = 0.0
        self.probed = threading.Event()        # resume: the tracker was asked what it holds (or could not be)
        self.resume_top: int | None = None     # resume: the highest step the tracker holds
        self.cursor = StreamCursor()           # where the last catch-up stopped reading the spool

    # -- producer side (dispatcher thread): never waits on a tracker --
    def put(self, seq: int, rec: Record) -> None:
        with self.lock:
            if self.state in ("failed", "behind"):
                self.dropped_hi = seq if self.dropped_hi is None else max(self.dropped_hi, seq)
                return
            try:
                self.queue.put_nowait((seq, rec))
                return
            except queue.Full:
                self.dropped_hi = seq
                self.state = "behind"
                self.behind_times += 1
                if self.behind_times > 1:
                    return
        log.warning("trackbridge: sink %s fell behind (its queue of %d records is full); training goes on and the "
                    "sink catches up from the spool", self.name, self.queue.maxsize)

    def put_gap(self, first: int, last: int) -> None:
        """Records ``first`` .. ``last`` are to be taken from the spool (the writer process's feed sent them as a
        gap): the tracker catches them up from there once its queue has drained, as when it fell behind."""
        with self.lock:
            self.dropped_hi = last if self.dropped_hi is None else max(self.dropped_hi, last)
            if self.state not in ("failed", "behind"):
                self.state = "behind"

    # -- the thread --
    def _loop(self) -> None:
        if self.ctx.resume:
            self._open(first=True)      # at once: the run's step counter waits (briefly) for what trackers hold
            self.probed.set()
        stopping = False
        while not stopping:
            timeout = 0.25
            if self.state == "failed":
                timeout = min(timeout, max(0.05, self.next_retry - time.monotonic()))
            batch, stopping = self._next_batch(timeout)
            if not self.opened and not self.open_tried:
                self._open(first=True)
            with self.lock:
                state = self.state
                if state == "failed" and batch:
                    hi = batch[-1][0]
                    self.dropped_hi = hi if self.dropped_hi is None else max(self.dropped_hi, hi)
            if state == "failed":
                if stopping or time.monotonic() >= self.next_retry:
                    self._recover(final=stopping)
                continue
            batch = [(s, rec) for s, rec in batch if s > self.acked]
            if batch and not self._write(batch):
                self._write_failed(batch)
            if state == "behind" and self.state == "behind" and (stopping or self.queue.empty()):
                self._catch_up_behind(final=stopping)

    def _before_close(self) -> None:
        self.probed.set()

    def _failed_then(self) -> str:
        opts = self.ctx.options
        return (f"the other sinks and training carry on, every record stays in the spool {self.ctx.spool_path}, "
                f"and the sink is retried every {opts.retry_interval:g} s and at finish()")

    def _mark_failed_locked(self, why: str) -> None:
        if self.state != "failed":
            self.next_retry = time.monotonic() + self.ctx.options.retry_interval
        super()._mark_failed_locked(why)

    def _write_failed(self, batch: list[tuple[int, Record]]) -> None:
        steps = [rec.step for _s, rec in batch if rec.step is not None]
        if steps:
            low = min(steps)
            self.failed_since = low if self.failed_since is None else min(self.failed_since, low)
        with self.lock:
            self.dropped_hi = batch[-1][0] if self.dropped_hi is None else max(self.dropped_hi, batch[-1][0])
            self._mark_failed_locked(f"after {self.ctx.options.retries + 1} attempts to write")

    def _open(self, *, first: bool) -> bool:
        ok = super()._open(first=first)
        if ok and first and self.ctx.resume:
            self._catch_up_resume()
        return ok

    # -- catching up from the spool --
    def _renamed(self, recs: Iterable[Record]) -> Iterable[Record]:
        if self.rename is None:
            return recs
        return (self.rename(rec) for rec in recs)

    def _spool_records(self, start: int = 0, stop: int | None = None, seen: list[int] | None = None
                       ) -> Iterable[Record]:
        """The spool's records ``start <= seq < stop``, under the tracker's names; ``seen[0]``: the last record
        number read."""
        def read() -> Iterable[Record]:
            for s, rec in read_stream(self.ctx.spool_path, start=start, stop=stop, cursor=self.cursor):
                if seen is not None:
                    seen[0] = s
                yield rec
        return self._renamed(read())

    def _catch_up_resume(self) -> None:
        """On resume: give the tracker, from the spool, the points it lacks (per key and step: a batch that landed
        in part before the process died is completed), and tell the run the highest step it holds."""
        ctx = self.ctx
        try:
            held = self.sink.held()
            top = held.last_step() if held is not None else self.sink.last_step()
        except Exception as exc:
            self._warn(f"trackbridge: sink {self.name}: could not read what it holds on resume ({exc}); "
                 f"not catching up from the spool (use trackbridge replay)")
            return
        self.resume_top = top
        self.probed.set()
        if not ctx.seq_base:
            return
        if held is None and top is not None and ctx.resume_last_step is not None and top >= ctx.resume_last_step:
            return
        todo = lacking(self._spool_records(stop=ctx.seq_base), held, top, CatchUp())
        write_batches(self.sink, todo, self.batch_size, self._write_reported)

    def _catch_up_range(self, hi: int, *, exact: bool, since: int | None, whole: bool = False) -> None:
        """Give the tracker the spool's records ``acked+1 .. hi``. ``since``: a write at or after this step failed
        and may have landed in part: those points are checked against what the tracker holds. ``exact=False``:
        the spool itself lost records, so the tracker's own last step decides. ``whole``: the tracker lost what it
        held (its store was deleted): every record of the spool up to ``hi``, less what it holds now. Raises what
        the sink raises, and :class:`SpoolShort` when the spool does not hold the records (yet)."""
        start = 0 if whole else self.acked + 1
        seen = [start - 1]
        recs = self._spool_records(start=start, stop=hi + 1, seen=seen)
        held, last = None, None
        if whole:
            held = self.sink.held()
            last = self.sink.last_step() if held is None else None
        elif not exact:
            last = self.sink.last_step()
        elif since is not None:
            held = self.sink.held(since)
        write_batches(self.sink, lacking(recs, held, last, CatchUp()), self.batch_size, self._write_reported)
        if exact and seen[0] < hi:
            self.acked = max(self.acked, seen[0])
            raise SpoolShort(f"the spool {self.ctx.spool_path} holds records up to number {seen[0]}, not {hi}")
        self.acked = hi

    def _wait_spool(self, hi: int) -> bool:
        return self.ctx.spool.wait_written(hi, timeout=max(5.0, 4 * self.ctx.options.flush_interval))

    def _catch_up_behind(self, *, final: bool) -> None:
        """The queue overflowed and has drained: take what was not queued from the spool, then go back to the
        queue. Records keep being taken from the spool until none was dropped since the last look."""
        while True:
            with self.lock:
                hi = self.dropped_hi
                if hi is None or hi <= self.acked:
                    self.dropped_hi = None
                    self.state = "ok"
                    return
            self._wait_spool(hi)
            try:
                self._catch_up_range(hi, exact=True, since=None)
            except Exception as exc:
                self.failures += 1
                self.last_error = f"catch up: {type(exc).__name__}: {exc}"
                with self.lock:
                    self._mark_failed_locked("while catching up from the spool")
                return
            with self.lock:
                if self.dropped_hi == hi:
                    self.dropped_hi = None
                    self.state = "ok"
                    return
            if final and self.stopping and self.dropped_hi is None:
                return

    def _recover(self, *, final: bool) -> None:
        """Reopen a failed sink and give it, from the spool, the records it missed."""
        ctx = self.ctx
        self.next_retry = time.monotonic() + ctx.options.retry_interval
        later = f"send it the run later with: trackbridge replay {ctx.spool_path} --to {self.sink.locator()}"
        if self.opened:
            try:
                self.sink.close()
            except Exception:
                pass
            self.opened = False
        try:
            self.sink.open(ctx.tracker_info(False), resume=True)
        except Exception as exc:
            self.failures += 1
            self.last_error = f"reopen: {type(exc).__name__}: {exc}"
            if final:
                self._warn(f"trackbridge: sink {self.name} is still failing at finish() ({self.last_error}); "
                           f"{later}")
            return
        self.opened = True
        with self.lock:
            hi = self.dropped_hi
            self.state = "ok"           # from here on the dispatcher queues new records again
            self.dropped_hi = None
        n_before = self.caught_up
        whole = bool(getattr(self.sink, "store_lost", False))
        if whole:           # what the tracker held is gone with its store: everything again, less what it holds now
            self.sink.store_lost = False
            hi = max(hi if hi is not None else -1, self.acked)
        if hi is not None and (hi > self.acked or whole):
            exact = self._wait_spool(hi)
            try:
                self._catch_up_range(hi, exact=exact, since=self.failed_since, whole=whole)
            except Exception as exc:
                self.failures += 1
                self.last_error = f"catch up: {type(exc).__name__}: {exc}"
                with self.lock:
                    self.state = "failed"
                    self.dropped_hi = hi if self.dropped_hi is None else max(self.dropped_hi, hi)
                if whole:
                    self.sink.store_lost = True
                if final:
                    self._warn(f"trackbridge: sink {self.name} could not catch up at finish() ({self.last_error}); "
                               f"{later}")
                return
        since = None if whole else self.failed_since
        top = hi if hi is not None and hi > self.acked else self.acked
        try:
            check = self._audit(since, top)
        except Exception as exc:        # the tracker cannot be read back now: not known to be whole, so not recovered
            self.last_error = f"read back: {type(exc).__name__}: {exc}"
            self._not_recovered(f"could not be read back after catching up ({self.last_error})", final, later, top)
            return
        if check is not None and check.lacking:
            self.last_error = f"after catching up it {check}"
            if check.from_seq is not None:      # the next catch-up starts there, cut down to what it lacks
                self.acked = min(self.acked, check.from_seq - 1)
                low = check.from_step if check.from_step is not None else 0
                self.failed_since = low if self.failed_since is None else min(self.failed_since, low)
            self._not_recovered(self.last_error, final, later, top)
            return
        self.failed_since = None
        self.recoveries += 1
        caught = self.caught_up - n_before
        if check is None:
            log.warning("trackbridge: sink %s reopened; caught up %d records from the spool (it cannot list what it "
                        "holds, so they were not checked)", self.name, caught)
        elif check.doubled:
            self._warn(f"trackbridge: sink {self.name} reopened and caught up {caught} records from the spool, but "
                       f"it {check} (its own writes before it failed landed again)")
            self.ctx.report(f"sink {self.name} {check} after it failed and was reopened")
        else:
            log.warning("trackbridge: sink %s recovered; caught up %d records from the spool, and it holds all %d "
                        "points logged since step %s", self.name, caught, check.compared,
                        since if since is not None else 0)

    def _audit(self, since: int | None, hi: int) -> Audit | None:
        """What the tracker holds of the spool's records up to number ``hi`` with a step ``>= since``, point by
        point (None for a tracker that cannot list what it holds). Read from the tracker itself, so that
        "recovered" is said only of a tracker known to hold every point."""
        held = self.sink.held(since)
        if held is None:
            return None
        rename = self.rename or (lambda rec: rec)
        recs = ((s, rename(rec)) for s, rec in read_stream(self.ctx.spool_path, stop=hi + 1, since=since))
        return audit(recs, held, since=since, nan=self.sink.capabilities.nan, skip_keys=self.left_out,
                     skip_steps=self.left_out_steps)

    def _not_recovered(self, why: str, final: bool, later: str, hi: int) -> None:
        """The tracker reopened and caught up but is not whole: failed again, retried later (the spool keeps all)."""
        self.failures += 1
        with self.lock:
            self.state = "failed"
            top = max(self.acked, hi)
            self.dropped_hi = top if self.dropped_hi is None else max(self.dropped_hi, top)
            self.next_retry = time.monotonic() + self.ctx.options.retry_interval
        self._warn(f"trackbridge: sink {self.name} reopened but {why}; "
                   + (later if final else "it stays failed and is retried (the spool keeps every record)"))

    def left(self, last_seq: int) -> int:
        """Records up to ``last_seq`` this tracker is not known to hold (0 once its worker closed cleanly)."""
        if not self.thread.is_alive() and self.state == "closed":
            return 0
        return max(0, last_seq - self.acked)


def closed_cleanly(w: Any) -> bool:
    """Whether a tracker's worker (a thread, or the writer process's view of one) closed its tracker with every
    record it was given."""
    alive = w.thread.is_alive() if isinstance(w, TrackerWorker) else getattr(w, "alive", False)
    return not alive and w.state == "closed"


def cut_threads(behind: list[Any], wait_for: set[int], wait: float) -> None:
    """Stop the tracker threads ``finish()`` gave up on (they write nothing more and close their trackers as far as
    they got), waiting at most ``wait`` seconds for those in ``wait_for`` (ids: the trackers on this machine, whose
    holdings are counted next; one hung in a request stays, and is counted while it may still land); a server's is
    not waited for."""
    threads = [w for w in behind if isinstance(w, TrackerWorker)]
    for w in threads:
        w.cut.set()
        w.stop()
    end = time.monotonic() + wait
    for w in threads:
        if id(w) in wait_for:
            w.thread.join(max(0.0, end - time.monotonic()))

