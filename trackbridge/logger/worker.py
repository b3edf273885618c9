"""One thread per sink: a bounded queue of ``(seq, record)`` drained in batches, retries with back-off, and the
isolation of values a tracker refuses. The spool (:mod:`.spool`) and the trackers (:mod:`.tracker`) are the two kinds
of worker; this module holds what they share. Workers see the run only through a :class:`RunContext`."""
from __future__ import annotations

import errno
import math
import queue
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..record import Record, RunInfo
from ..record.values import printable
from ..tracking.sink import Sink
from .common import STOP, log, warn
from .options import LoggerOptions

#: a failed batch is probed record by record for values the tracker refuses (:meth:`Worker._isolate`) only when its
#: last attempt failed within this many seconds: a refusal is quick, a tracker that is down fails slowly
ISOLATE_WITHIN = 5.0
#: errors of a store that cannot be written now (a full disk, a quota, a failing or read-only device): never the
#: fault of a value, so a write that fails with one (or a sink error raised while handling one) ends the probing
STORE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS})


def store_failing(exc: BaseException | None) -> bool:
    """Whether ``exc``, or an error it was raised from or while handling, is one of :data:`STORE_ERRNOS`."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in STORE_ERRNOS:
            return True
        exc = exc.__cause__ or exc.__context__
    return False


class Cut(BaseException):
    """Raised in a tracker's worker once ``finish()`` has given up on it (:attr:`Worker.cut`): it writes no more,
    closes its tracker and ends, so that what the tracker lacks can be counted exactly (the pending note). A
    ``BaseException``, so that no retry or failure handling takes it for the tracker's own error."""


@dataclass
class RunContext:
    """What a worker needs of its run (and nothing else)."""

    options: LoggerOptions
    spool_path: Path
    seq_base: int                               # records the spool held before this process (resume)
    resume: bool
    resume_last_step: int | None                # the spool's highest step before this process
    tracker_info: Callable[[bool], RunInfo]     # the run info a sink opens with (is_spool)
    sync_info: Callable[[RunInfo | None, bool], None]  # fill a sink's run info with what was learnt logging
    report: Callable[[str], None]               # a problem for run.problems (the caller warns)
    spool: Any = field(default=None)            # the run's SpoolWorker, set once built
    # set when finish() has returned: a worker it left behind (stuck on a hung server) says nothing more; what it
    # lacks is in the pending note and finish()'s warnings
    ended: threading.Event = field(default_factory=threading.Event)
    # called once a tracker's client is open (it may have registered its own exit hooks: the run's must come first)
    opened: Callable[[], None] = field(default=lambda: None)


def sync_run_info(run: RunInfo | None, info: RunInfo, approximate: dict[str, str]) -> None:
    """Give a sink's copy of the run info what was learnt while logging (the detected source, which translations
    were approximate, how the run ended), so that it stores them with the run when it closes."""
    if run is None:
        return
    if info.source:
        run.source = info.source
    for key in ("outcome", "ranks"):     # ranks: init(merge_ranks=True)'s steps merged without a rank
        if key in info.extra:
            run.extra = {**(run.extra or {}), key: info.extra[key]}
    run.approximate = {**(run.approximate or {}), **approximate}


class Worker:
    """Owns one sink: its queue, its thread, retries, the sink's refusals. Subclasses decide what happens when the
    queue is full, when a write fails and what the worker does between batches."""

    is_spool = False
    max_latency = 0.0

    def __init__(self, ctx: RunContext, sink: Sink, *, queue_size: int, batch_size: int) -> None:
        self.ctx = ctx
        self.sink = sink
        self.last_failure_s = 0.0          # how long the last failed attempt took to fail
        self.name = sink.describe()
        self.queue: queue.Queue = queue.Queue(maxsize=queue_size)
        self.batch_size = batch_size
        self.lock = threading.Lock()
        self.state = "pending"
        self.opened = False
        self.open_tried = False
        self.acked = ctx.seq_base - 1       # highest seq this sink holds
        self.stopping = False
        self.written = 0
        self.caught_up = 0
        self.failures = 0
        self.recoveries = 0
        self.last_error: str | None = None
        self.notes: set[str] = set()
        self.left_out: set[str] = set()       # keys the sink said it left out (see _report_rejected)
        self.left_out_steps: set[int] = set()  # steps whose records it left out
        self.opening = False                # in sink.open() now
        try:                                # a store on this machine (not a server): opening it is work, not a hang
            self.local = (type(sink).local_path(sink.location) is not None
                          and getattr(sink, "options", {}).get("mode") != "online")     # wandb online: a server
        except Exception:
            self.local = False
        self.done = threading.Event()
        # set by finish() after it stopped waiting for this tracker: the worker writes nothing more, closes the
        # tracker and ends (the pending note counts what the tracker then holds)
        self.cut = threading.Event()
        self.thread = threading.Thread(target=self._main, name=f"trackbridge-sink-{sink.kind}", daemon=True)

    # -- producer side ----------------------------------------------------------------------------------------
    def put(self, seq: int, rec: Record) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        self.stopping = True
        try:
            self.queue.put_nowait(STOP)
        except queue.Full:
            pass            # the worker sees ``stopping`` when it next looks at its queue

    # -- the thread -------------------------------------------------------------------------------------------
    def _main(self) -> None:
        try:
            self._loop()
        except Cut:                   # finish() gave up on this tracker: close it as far as it got
            pass
        except BaseException as exc:  # never die silently
            self._warn(f"trackbridge: worker of sink {self.name} crashed: {type(exc).__name__}: {exc}")
            with self.lock:
                self.state = "failed"
        finally:
            self._before_close()
            if self.opened:
                try:
                    self.ctx.sync_info(getattr(self.sink, "run", None), self.is_spool)
                    self.sink.close()
                except Exception as exc:
                    self._warn(f"trackbridge: sink {self.name} failed to close: {type(exc).__name__}: {exc}")
                    # not known to hold the run: failed, so that finish() counts what it lacks (exactly, for a
                    # tracker on this machine: one that lacks nothing gets no pending note)
                    self.last_error = f"close: {type(exc).__name__}: {exc}"
                    with self.lock:
                        self.state = "failed"
                        if getattr(self.sink, "store_lost", False):     # nothing of the run is left there
                            self.acked = -1
            with self.lock:
                if self.state not in ("failed", "behind") and not self.cut.is_set():
                    self.state = "closed"
            self._closed()

    def _loop(self) -> None:
        raise NotImplementedError

    def _warn(self, message: str) -> None:
        if not self.ctx.ended.is_set():
            warn(message)

    def _before_close(self) -> None:
        pass

    def _closed(self) -> None:
        self.done.set()

    def _next_batch(self, timeout: float = 0.25) -> tuple[list[tuple[int, Record]], bool]:
        """Up to ``batch_size`` queued records, waiting at most ``max_latency`` after the first for more; and
        whether the worker is to stop after them."""
        if self.cut.is_set():
            raise Cut
        try:
            first = self.queue.get(timeout=timeout)
        except queue.Empty:
            return [], self.stopping
        if first is STOP:
            return [], True
        batch = [first]
        # the spool's items carry the monotonic time of their log() call: a batch is written at most max_latency
        # after its first record was logged, whatever the wall clock does (stepped back by NTP or by hand)
        deadline = first[2] + self.max_latency if self.max_latency > 0 else 0.0
        while len(batch) < self.batch_size:
            try:
                item = self.queue.get_nowait()
            except queue.Empty:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                try:
                    item = self.queue.get(timeout=remaining)
                except queue.Empty:
                    break
            if item is STOP:
                return batch, True
            batch.append(item)
        return batch, False

    def _retrying(self, what: str, fn: Callable[[], Any]) -> bool:
        opts = self.ctx.options
        delay = opts.backoff
        for attempt in range(opts.retries + 1):
            started = time.monotonic()
            try:
                fn()
                return True
            except Exception as exc:
                self.last_failure_s = time.monotonic() - started
                self.failures += 1
                self.last_error = f"{what}: {type(exc).__name__}: {exc}"
                log.debug("sink %s: %s failed (attempt %d): %s", self.name, what, attempt + 1, exc)
            if attempt < opts.retries:
                time.sleep(delay)
                delay *= 2
        return False

    # -- failure ----------------------------------------------------------------------------------------------
    def _failed_then(self) -> str:
        raise NotImplementedError

    def _mark_failed_locked(self, why: str) -> None:
        if self.state == "failed":
            return
        self.state = "failed"
        self.last_error = self.last_error if why.startswith("after") else why
        role = "the spool" if self.is_spool else "sink"
        self._warn(f"trackbridge: {role} {self.name} failed ({why}; last error: {self.last_error}); "
                   f"{self._failed_then()}")

    def _mark_failed(self, why: str) -> None:
        with self.lock:
            self._mark_failed_locked(why)

    # -- open and write ---------------------------------------------------------------------------------------
    def _open(self, *, first: bool) -> bool:
        self.open_tried = True
        info = self.ctx.tracker_info(self.is_spool)
        resume = self.ctx.resume if first else True

        def do_open() -> None:
            self.opening = True
            try:
                self.sink.open(info, resume=resume)
            finally:
                self.opening = False

        if not self._retrying("open", do_open):
            self._mark_failed(f"after {self.ctx.options.retries + 1} attempts to open")
            return False
        self.opened = True
        with self.lock:
            if self.state == "pending":
                self.state = "ok"
        try:
            self.ctx.opened()
        except Exception:
            pass
        return True

    def _write(self, batch: list[tuple[int, Record]]) -> bool:
        """Write a batch (retried; on failure, probed for values the tracker refuses). True when it is in."""
        recs = [rec for _s, rec in batch]
        self._check_capabilities(recs)

        def do_write() -> None:
            if self.cut.is_set():
                raise Cut
            self.sink.write(recs)

        # a tracker that refuses a value says so at once; one that takes ISOLATE_WITHIN seconds or more to fail (a
        # timeout, a locked store) is down, and probing it record by record would only multiply the wait
        if self._retrying("write", do_write) or (self.last_failure_s < ISOLATE_WITHIN and self._isolate(recs)):
            self._report_rejected()
            self.written += len(recs)
            self.acked = batch[-1][0]
            return True
        self._report_rejected()
        return False

    def _write_reported(self, chunk: list[Record]) -> None:
        """One write outside the queue (catch-up): capabilities noted, refusals reported, progress counted."""
        if self.cut.is_set():
            raise Cut
        self._check_capabilities(chunk)
        self.sink.write(chunk)
        self._report_rejected()
        self.caught_up += len(chunk)

    def _isolate(self, recs: list[Record]) -> bool:
        """After a batch failed every retry: find out whether values are to blame rather than the tracker. The
        records are written one by one; one that fails is split in halves by key, recursively, down to the keys
        the tracker refuses, which are left out (reported once per key like the sink's own refusals). Returns
        False, having given up, as soon as a record and both its halves fail before any write succeeded (the
        tracker itself is down: three quick attempts, no back-off, then the usual failure handling)."""
        class Down(Exception):
            pass

        state = {"proved": False}
        bad: list[tuple[str, int | None, str]] = []

        def attempt(rec: Record) -> bool:
            try:
                self.sink.write([rec])
            except Exception as exc:
                self.last_error = f"write: {type(exc).__name__}: {exc}"
                if store_failing(exc):      # the disk is full: the values that did not fit are not refused
                    raise Down from None
                return False
            state["proved"] = True
            return True

        def sub(rec: Record, items: list[tuple[str, Any]]) -> Record:
            keys = {k for k, _ in items}
            return Record(step=rec.step, wall_time=rec.wall_time, metrics=dict(items),
                          derived=[d for d in rec.derived if d in keys], axis=rec.axis)

        def split(rec: Record, items: list[tuple[str, Any]]) -> None:
            if len(items) <= 1:
                why = (self.last_error or "refused")[:300]
                bad.append((printable(items[0][0]) if items else "step", rec.step, why))
                return
            half = len(items) // 2
            a, b = items[:half], items[half:]
            ok_a, ok_b = attempt(sub(rec, a)), attempt(sub(rec, b))
            if not ok_a and not ok_b and not state["proved"]:
                raise Down
            if not ok_a:
                split(rec, a)
            if not ok_b:
                split(rec, b)

        try:
            skip = self.sink.written_of(recs)
        except Exception:
            skip = 0
        try:
            for rec in recs[skip:]:
                if not attempt(rec):
                    split(rec, list(rec.metrics.items()))
        except Down:
            return False
        if bad and not state["proved"]:
            return False
        for key, step, why in bad:
            self.sink.reject(key, step, why)
        return True

    # -- what the tracker cannot take -------------------------------------------------------------------------
    def _report_rejected(self) -> None:
        """Warn once per key about what the sink left out of records because its tracker cannot take it, and
        about names it had to store otherwise."""
        if getattr(self.sink, "_renamed", None):
            for key, stored, why in self.sink.take_renamed():
                self._say_once(f"renamed {key}", f"sink {self.name} stores {key!r} as {stored!r} ({why}); "
                                                 f"trackbridge's readers give it back its name")
        if not getattr(self.sink, "_rejected", None):
            return
        where = ("left out of the spool (no tracker gets it)" if self.is_spool else
                 "left out of this tracker only (the spool and the other trackers keep it)")
        for key, step, why in self.sink.take_rejected():
            if key == "step" and step is not None:
                self.left_out_steps.add(step)
            else:
                self.left_out.add(key)
            if key == "step":
                message = f"sink {self.name} cannot store step {step} ({why}); records at such steps are {where}"
            else:
                message = (f"sink {self.name} cannot take metric {key!r} (first at step {step}: {why}); that "
                           f"metric is {where}")
            self._say_once(f"rejected {key}", message)

    def _say_once(self, tag: str, message: str) -> None:
        """Report ``message`` in the run's problems and warn, the first time ``tag`` comes up."""
        if tag in self.notes:
            return
        self.notes.add(tag)
        self.ctx.report(message)
        self._warn(f"trackbridge: {message}")

    def _check_capabilities(self, recs: list[Record]) -> None:
        caps = self.sink.capabilities
        if caps.nan and caps.text:
            return
        for rec in recs:
            for k, v in rec.metrics.items():
                t = type(v)
                if t is float and not caps.nan and not math.isfinite(v):
                    self._note(f"sink {self.name} cannot store NaN/infinity (first: {k!r} = {v} at step "
                               f"{rec.step}); such values are kept in the spool only")
                elif t is str and not caps.text:
                    self._note(f"sink {self.name} cannot store text (first: {k!r} at step {rec.step}); "
                               f"text is kept in the spool only")

    def _note(self, message: str) -> None:
        key = message.split(" (first")[0]
        if key not in self.notes:
            self.notes.add(key)
            self.ctx.report(message)
            log.warning("trackbridge: %s", message)

    def starting(self) -> bool:
        """Not yet tried to open its sink (the thread, or the writer process holding it, is still starting), or
        opening a store on this machine (MLflow creating its SQLite schema takes seconds, more on a loaded machine,
        and stopping it half-way helps nobody): ``finish()`` does not count that time as a stall;
        ``finish_timeout`` still bounds it. Opening a server's run counts: a hung server is a stall."""
        return not self.open_tried or (self.opening and self.local)

    def progress(self) -> tuple:
        """Changes while the worker gets anywhere (records written or caught up, requests answered)."""
        return (self.written, self.caught_up, self.state, self.failures, getattr(self.sink, "progress", 0))

    def status(self) -> dict[str, Any]:
        return {"sink": self.name, "state": self.state, "written": self.written, "caught_up": self.caught_up,
                "queued": self.queue.qsize(), "failures": self.failures, "recoveries": self.recoveries,
                "last_error": self.last_error, "spool": self.is_spool}
