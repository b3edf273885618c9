"""``init`` / ``log`` / ``finish``: one canonical stream to several trackers at once, without blocking training.

Pipeline (one run)::

    run.log(dict)  ──►  inbox  ──►  dispatcher thread  ──►  spool queue  ──►  spool worker  ──►  jsonl file
     validate +                     translate (names in     (per sink,       (one thread      (always on)
     normalise values               -> canonical), derive,   bounded)         per sink,  ──►  tensorboard, mlflow,
     (caller's thread)              step, Record, rename                      batches)        wandb, trackio, ...
                                    for ``names=``

* ``log()`` only validates and normalises the values (so a tensor updated in place afterwards cannot change what was
  logged) and hands them off; translation, derivation and every tracker's I/O happen in other threads. Every queue
  is bounded: when one is full, the producer waits (back-pressure); nothing is ever dropped from a queue.
* **The spool** (``jsonl`` sink in ``spool=DIR``, file ``DIR/<run_id>.jsonl``) is always on. Its worker writes a
  batch and flushes it to the operating system at the latest ``flush_interval / 2`` seconds after the first record
  of the batch was logged, so a process killed with SIGKILL loses at most about ``flush_interval`` seconds of
  records (default 1.0 s; ``flush_interval=`` to change; the SIGKILL test checks the bound). A machine crash can
  lose more unless the spool is opened with ``?fsync=1`` (``spool="DIR?fsync=1"``).
* **Fault isolation**: a sink that raises in ``open`` or ``write`` is retried with exponential back-off
  (``retries`` attempts, starting at ``backoff`` seconds), then marked *failed* with a warning naming the sink and
  the error; the other sinks and the training loop carry on. A failed sink is tried again every
  ``retry_interval`` seconds and once more at ``finish()``; when it comes back it is reopened with
  ``resume=True`` and catches up from the spool (the exact records it missed, by sequence number), so nothing is
  lost. A sink whose queue stays full for ``stall_timeout`` seconds (a hung server) is treated as failed too, so it
  cannot stall training forever.
* **Steps**: the explicit ``step=``, else the canonical ``progress/step`` in the logged dict, else an internal
  counter (one more than the highest step so far). Each record carries ``wall_time = time.time()`` of the
  ``log()`` call. What each tracker needs for non-monotonic steps is the sink's business.
* **Resume**: ``init(run_id=..., resume=True)`` reads the spool to find the last step (the counter continues after
  it), opens every sink with ``resume=True`` and replays into each sink the spool records it does not hold yet
  (``step > sink.last_step()``).
* **Ranks**: only global rank 0 (``RANK``, then ``LOCAL_RANK``, ...) writes unless ``rank_zero_only=False``; other
  ranks get a run whose ``log()`` validates and returns.

This module names no tracker and no framework: sinks come from :mod:`trackbridge.sinks`, translation from
:mod:`trackbridge.translate`, derivation from :mod:`trackbridge.derive` (each optional until it exists).
"""
from __future__ import annotations

import atexit
import copy
import logging
import math
import os
import queue
import sys
import threading
import time
import uuid
import warnings
from pathlib import Path
from typing import Any, Callable

from . import _rank
from .record import Record, RunInfo
from .replay import iter_spool, names_translator, pending_file, scan_spool, spool_file, write_pending
from .sinks.base import Sink, Unreachable, check_reachable
from .values import STEP_MAX, as_step, check_step, normalize_metrics, utf8_ok

log = logging.getLogger("trackbridge")

STEP_AXIS = "progress/step"
_STOP = object()


class LoggerWarning(RuntimeWarning):
    """A problem the logger reports without stopping training (a failed sink, a value that cannot be stored)."""


def _warn(message: str) -> None:
    """A warning users see once: through ``warnings`` (LoggerWarning), and also through the ``trackbridge`` logger
    when the application configured logging (otherwise logging's last-resort handler would print it twice)."""
    if log.hasHandlers():
        log.warning(message)
    warnings.warn(message, LoggerWarning, stacklevel=3)


# -- optional engines: translation and derivation (tolerate their absence) --------------------------------------
def _make_translator(source: str, mappings: list[str] | None, config: dict[str, Any]) -> Any:
    """Translator from ``source`` names to canonical ones. A mapping file that cannot be used (the user's
    ``mappings=`` or a shipped one) is an error at ``init``, naming the file: logging untranslated names into
    trackers would be worse than not starting."""
    from .translate import Translator
    try:
        return Translator(source=source, target="canonical", mappings=mappings, config=config)
    except Exception as exc:
        what = f"mappings={list(mappings)!r}" if mappings else f"source={source!r}"
        raise ValueError(f"init({what}): cannot build the translation: {exc}") from exc


def _derive_hook(translator: Any) -> Callable[..., None] | None:
    """The translator's derive step (run after the step is known): ``hook(translation, step, wall_time)`` fills
    ``translation.metrics`` in place and sets ``translation.derived``."""
    return getattr(translator, "apply_derive", None)


# -- one worker per sink -----------------------------------------------------------------------------------------
class _SinkWorker:
    """Owns one sink: a bounded queue of ``(seq, record)``, a thread draining it in batches, retries, recovery.

    States: ``pending`` (not opened yet), ``ok`` (fed through its queue), ``behind`` (its queue was full: it is
    fed from the spool until it has caught up, so the dispatcher never waits for it), ``failed`` (its tracker
    failed: retried every ``retry_interval`` seconds, then fed from the spool), ``closed``."""

    def __init__(self, run: "Run", sink: Sink, *, is_spool: bool, queue_size: int, batch_size: int,
                 max_latency: float, rename: Callable[[Record], Record] | None) -> None:
        self.runref = run
        self.sink = sink
        self.is_spool = is_spool
        self.name = sink.describe()
        self.queue: queue.Queue = queue.Queue(maxsize=queue_size)
        self.batch_size = batch_size
        self.max_latency = max_latency
        self.rename = rename
        self.lock = threading.Lock()
        self.state = "pending"          # pending -> ok | behind | failed -> ... -> closed
        self.opened = False
        self.open_tried = False
        self.acked = run._seq_base - 1  # highest seq this sink holds
        self.dropped_hi: int | None = None  # highest seq not queued (failed or behind): to take from the spool
        self.failed_since: int | None = None  # lowest step of a write that failed (it may have landed in part)
        self.stopping = False
        self.written = 0
        self.caught_up = 0
        self.failures = 0
        self.recoveries = 0
        self.behind_times = 0
        self.last_error: str | None = None
        self.next_retry = 0.0
        self.notes: set[str] = set()
        self.done = threading.Event()
        self.probed = threading.Event()        # resume: the tracker was asked what it holds (or could not be)
        self.resume_top: int | None = None      # resume: the highest step the tracker holds
        self.written_seq = run._seq_base - 1   # spool only: highest seq handed to the OS
        self.lost = False                       # spool only: some records could not be written
        self.cond = threading.Condition()
        self.thread = threading.Thread(target=self._main, name=f"trackbridge-sink-{sink.kind}", daemon=True)

    # -- producer side (dispatcher thread): never waits on a tracker --
    def put(self, seq: int, rec: Record) -> None:
        if self.is_spool:
            self.queue.put((seq, rec))     # the spool is the run's own durable log: back-pressure, never a drop
            return
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

    def stop(self) -> None:
        self.stopping = True
        try:
            self.queue.put_nowait(_STOP)
        except queue.Full:
            pass            # the worker sees ``stopping`` when it next looks at its queue

    # -- worker thread --
    def _main(self) -> None:
        try:
            self._loop()
        except BaseException as exc:  # never die silently
            _warn(f"trackbridge: worker of sink {self.name} crashed: {type(exc).__name__}: {exc}")
            with self.lock:
                self.state = "failed"
        finally:
            self.probed.set()
            if self.opened:
                try:
                    self._sync_info()
                    self.sink.close()
                except Exception as exc:
                    _warn(f"trackbridge: sink {self.name} failed to close: {type(exc).__name__}: {exc}")
            with self.lock:
                if self.state not in ("failed", "behind"):
                    self.state = "closed"
            with self.cond:
                self.done.set()
                self.cond.notify_all()

    def _loop(self) -> None:
        r = self.runref
        if r.resume and not self.is_spool:
            self._open(first=True)      # at once: the run's step counter waits (briefly) for what trackers hold
            self.probed.set()
        stopping = False
        while not stopping:
            batch, stopping = self._next_batch()
            if not self.opened and not self.open_tried:
                self._open(first=True)
            with self.lock:
                state = self.state
                if state == "failed" and batch:
                    hi = batch[-1][0]
                    self.dropped_hi = hi if self.dropped_hi is None else max(self.dropped_hi, hi)
            if state == "failed":
                if self.is_spool:
                    self._spool_skip(batch)
                elif stopping or time.monotonic() >= self.next_retry:
                    self._recover(final=stopping)
                continue
            batch = [(s, rec) for s, rec in batch if s > self.acked]
            if batch:
                self._write(batch)
            if state == "behind" and self.state == "behind" and (stopping or self.queue.empty()):
                self._catch_up_behind(final=stopping)

    def _next_batch(self) -> tuple[list[tuple[int, Record]], bool]:
        timeout = 0.25
        if self.state == "failed" and not self.is_spool:
            timeout = min(timeout, max(0.05, self.next_retry - time.monotonic()))
        try:
            first = self.queue.get(timeout=timeout)
        except queue.Empty:
            return [], self.stopping
        if first is _STOP:
            return [], True
        batch = [first]
        deadline = first[1].wall_time + self.max_latency if self.max_latency > 0 else 0.0
        while len(batch) < self.batch_size:
            try:
                item = self.queue.get_nowait()
            except queue.Empty:
                remaining = deadline - time.time()
                if remaining <= 0:
                    break
                try:
                    item = self.queue.get(timeout=remaining)
                except queue.Empty:
                    break
            if item is _STOP:
                return batch, True
            batch.append(item)
        return batch, False

    def _retrying(self, what: str, fn: Callable[[], Any]) -> bool:
        r = self.runref
        delay = r._backoff
        for attempt in range(r._retries + 1):
            try:
                fn()
                return True
            except Exception as exc:
                self.failures += 1
                self.last_error = f"{what}: {type(exc).__name__}: {exc}"
                log.debug("sink %s: %s failed (attempt %d): %s", self.name, what, attempt + 1, exc)
            if attempt < r._retries:
                time.sleep(delay)
                delay *= 2
        return False

    def _mark_failed_locked(self, why: str) -> None:
        if self.state == "failed":
            return
        self.state = "failed"
        self.last_error = self.last_error if why.startswith("after") else why
        self.next_retry = time.monotonic() + self.runref._retry_interval
        r = self.runref
        then = ("records logged from now on may be lost if the process dies" if self.is_spool else
                f"the other sinks and training carry on, every record stays in the spool {r.spool_path}, and the "
                f"sink is retried every {r._retry_interval:g} s and at finish()")
        role = "the spool" if self.is_spool else "sink"
        _warn(f"trackbridge: {role} {self.name} failed ({why}; last error: {self.last_error}); {then}")

    def _mark_failed(self, why: str) -> None:
        with self.lock:
            self._mark_failed_locked(why)

    def _open(self, *, first: bool) -> bool:
        r = self.runref
        self.open_tried = True
        info = r.tracker_info(self.is_spool)
        resume = r.resume if first else True

        def do_open() -> None:
            self.sink.open(info, resume=resume)

        if not self._retrying("open", do_open):
            self._mark_failed(f"after {r._retries + 1} attempts to open")
            return False
        self.opened = True
        with self.lock:
            if self.state == "pending":
                self.state = "ok"
        if first and r.resume and not self.is_spool:
            self._catch_up_resume()
        return True

    def _catch_up_resume(self) -> None:
        """On resume: give the tracker, from the spool, the points it lacks (per key and step: a batch that landed
        in part before the process died is completed), and tell the run the highest step it holds."""
        r = self.runref
        try:
            held = self.sink.held()
            top = held.last_step() if held is not None else self.sink.last_step()
        except Exception as exc:
            _warn(f"trackbridge: sink {self.name}: could not read what it holds on resume ({exc}); "
                  f"not catching up from the spool (use trackbridge replay)")
            return
        self.resume_top = top
        self.probed.set()
        if not r._resume_scan.records:
            return
        if held is None and top is not None and r._resume_scan.last_step is not None \
                and top >= r._resume_scan.last_step:
            return
        recs = self._renamed(rec for _s, rec in iter_spool(r.spool_path, stop=r._seq_base))
        if held is not None:
            todo: Any = held.filter(recs)
        else:
            todo = (rec for rec in recs if top is None or rec.step is None or rec.step > top)
        self._write_stream(todo)

    def _renamed(self, recs: Any) -> Any:
        if self.rename is None:
            return recs
        return (self.rename(rec) for rec in recs)

    def _write_stream(self, recs: Any) -> None:
        """Write records (already renamed) in batches; progress is counted per batch."""
        chunk: list[Record] = []
        for rec in recs:
            chunk.append(rec)
            if len(chunk) >= self.batch_size:
                self._write_chunk(chunk)
                chunk = []
        if chunk:
            self._write_chunk(chunk)

    def _write_chunk(self, chunk: list[Record]) -> None:
        self._check_capabilities(chunk)
        self.sink.write(chunk)
        self._report_rejected()
        self.caught_up += len(chunk)

    def _catch_up_range(self, hi: int, *, exact: bool, since: int | None) -> None:
        """Give the tracker the spool's records ``acked+1 .. hi``. ``since``: a write at or after this step failed
        and may have landed in part: those points are checked against what the tracker holds. ``exact=False``:
        the spool itself lost records, so the tracker's own last step decides. Raises what the sink raises."""
        r = self.runref
        recs = self._renamed(rec for _s, rec in iter_spool(r.spool_path, start=self.acked + 1, stop=hi + 1))
        if not exact:
            last = self.sink.last_step()
            recs = (rec for rec in recs if last is None or rec.step is None or rec.step > last)
        elif since is not None:
            held = self.sink.held(since)
            if held is not None:
                recs = held.filter(recs)
        self._write_stream(recs)
        self.acked = hi

    def _catch_up_behind(self, *, final: bool) -> None:
        """The queue overflowed and has drained: take what was not queued from the spool, then go back to the
        queue. Records keep being taken from the spool until none was dropped since the last look."""
        r = self.runref
        spool = r._spool_worker
        while True:
            with self.lock:
                hi = self.dropped_hi
                if hi is None or hi <= self.acked:
                    self.dropped_hi = None
                    self.state = "ok"
                    return
            spool.wait_written(hi, timeout=max(5.0, 4 * r._flush_interval))
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
                return False
            state["proved"] = True
            return True

        def sub(rec: Record, items: list[tuple[str, Any]]) -> Record:
            keys = {k for k, _ in items}
            return Record(step=rec.step, wall_time=rec.wall_time, metrics=dict(items),
                          derived=[d for d in rec.derived if d in keys])

        def split(rec: Record, items: list[tuple[str, Any]]) -> None:
            if len(items) <= 1:
                why = (self.last_error or "refused")[:300]
                bad.append((_printable(items[0][0]) if items else "step", rec.step, why))
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

    def _report_rejected(self) -> None:
        """Warn once per key about what the sink left out of records because its tracker cannot take it."""
        if not getattr(self.sink, "_rejected", None):
            return
        for key, step, why in self.sink.take_rejected():
            tag = f"rejected {key}"
            if tag in self.notes:
                continue
            self.notes.add(tag)
            where = ("left out of the spool (no tracker gets it)" if self.is_spool else
                     "left out of this tracker only (the spool and the other trackers keep it)")
            if key == "step":
                message = f"sink {self.name} cannot store step {step} ({why}); records at such steps are {where}"
            else:
                message = (f"sink {self.name} cannot take metric {key!r} (first at step {step}: {why}); that "
                           f"metric is {where}")
            self.runref.problems.append(message)
            _warn(f"trackbridge: {message}")

    def _write(self, batch: list[tuple[int, Record]]) -> None:
        recs = [rec for _s, rec in batch]
        self._check_capabilities(recs)

        def do_write() -> None:
            self.sink.write(recs)

        if self._retrying("write", do_write) or self._isolate(recs):
            self._report_rejected()
            self.written += len(recs)
            self.acked = batch[-1][0]
            if self.is_spool:
                self._spool_advance(self.acked)
            return
        self._report_rejected()
        steps = [rec.step for rec in recs if rec.step is not None]
        if steps:
            low = min(steps)
            self.failed_since = low if self.failed_since is None else min(self.failed_since, low)
        with self.lock:
            self.dropped_hi = batch[-1][0] if self.dropped_hi is None else max(self.dropped_hi, batch[-1][0])
            self._mark_failed_locked(f"after {self.runref._retries + 1} attempts to write")
        if self.is_spool:
            self._spool_skip(batch)

    def _spool_advance(self, seq: int) -> None:
        with self.cond:
            self.written_seq = max(self.written_seq, seq)
            self.cond.notify_all()

    def _spool_skip(self, batch: list[tuple[int, Record]]) -> None:
        if batch:
            self.lost = True
            self._spool_advance(batch[-1][0])

    def wait_written(self, seq: int, timeout: float) -> bool:
        """Spool only: wait until every record up to ``seq`` has been handed to the OS."""
        end = time.monotonic() + timeout
        with self.cond:
            while self.written_seq < seq and not self.done.is_set():
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self.cond.wait(left)
            return self.written_seq >= seq and not self.lost

    def _sync_info(self) -> None:
        """Give the sink's copy of the run info what was learnt while logging (the detected source, which
        translations were approximate), so that it stores them with the run when it closes."""
        run = getattr(self.sink, "run", None)
        r = self.runref
        if run is None:
            return
        if r.info.source:
            run.source = r.info.source
        if "outcome" in r.info.extra:
            run.extra = {**(run.extra or {}), "outcome": r.info.extra["outcome"]}
        run.approximate = {**(run.approximate or {}), **r.tracker_approximate(self.is_spool)}

    def _recover(self, *, final: bool) -> None:
        """Reopen a failed sink and give it, from the spool, the records it missed."""
        r = self.runref
        self.next_retry = time.monotonic() + r._retry_interval
        if self.opened:
            try:
                self.sink.close()
            except Exception:
                pass
            self.opened = False
        info = r.tracker_info(self.is_spool)
        try:
            self.sink.open(info, resume=True)
        except Exception as exc:
            self.failures += 1
            self.last_error = f"reopen: {type(exc).__name__}: {exc}"
            if final:
                _warn(f"trackbridge: sink {self.name} is still failing at finish() ({self.last_error}); "
                      f"send it the run later with: trackbridge replay {r.spool_path} --to {self.sink.locator()}")
            return
        self.opened = True
        with self.lock:
            hi = self.dropped_hi
            self.state = "ok"           # from here on the dispatcher queues new records again
            self.dropped_hi = None
        n_before = self.caught_up
        if hi is not None and hi > self.acked:
            exact = r._spool_worker.wait_written(hi, timeout=max(5.0, 4 * r._flush_interval))
            try:
                self._catch_up_range(hi, exact=exact, since=self.failed_since)
            except Exception as exc:
                self.failures += 1
                self.last_error = f"catch up: {type(exc).__name__}: {exc}"
                with self.lock:
                    self.state = "failed"
                    self.dropped_hi = hi if self.dropped_hi is None else max(self.dropped_hi, hi)
                if final:
                    _warn(f"trackbridge: sink {self.name} could not catch up at finish() ({self.last_error}); "
                          f"send it the run later with: trackbridge replay {r.spool_path} --to {self.sink.locator()}")
                return
        self.failed_since = None
        self.recoveries += 1
        log.warning("trackbridge: sink %s recovered; caught up %d records from the spool",
                    self.name, self.caught_up - n_before)

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
            self.runref.problems.append(message)
            log.warning("trackbridge: %s", message)

    def status(self) -> dict[str, Any]:
        return {"sink": self.name, "state": self.state, "written": self.written, "caught_up": self.caught_up,
                "queued": self.queue.qsize(), "failures": self.failures, "recoveries": self.recoveries,
                "last_error": self.last_error, "spool": self.is_spool}


# -- the run -------------------------------------------------------------------------------------------------------
class Run:
    """A logging run: ``log()`` many times, then ``finish()`` (or use it as a context manager)."""

    def __init__(self, *, project: str | None, name: str | None, sinks: list[Any], source: str, names: str,
                 config: dict[str, Any] | None, run_id: str | None, resume: bool, derive: bool,
                 mappings: list[str] | None, spool: str, flush_interval: float, queue_size: int,
                 batch_size: int, retries: int, backoff: float, retry_interval: float, stall_timeout: float,
                 finish_timeout: float, resume_wait: float, tags: dict[str, str] | None) -> None:
        from .locators import LocatorError, parse
        from .sinks import REGISTRY, make_sink

        if flush_interval <= 0:
            raise ValueError(f"flush_interval must be > 0 seconds, got {flush_interval!r}")
        if queue_size < 1 or batch_size < 1:
            raise ValueError("queue_size and batch_size must be at least 1")
        self.resume = bool(resume)
        self.names = names or "canonical"
        self.problems: list[str] = []
        self._flush_interval = float(flush_interval)
        self._retries = int(retries)
        self._backoff = float(backoff)
        self._retry_interval = float(retry_interval)
        self._stall_timeout = float(stall_timeout)
        self._finish_timeout = float(finish_timeout)
        self._resume_wait = float(resume_wait)
        self._finished = False
        self._lock = threading.Lock()
        self._warned_values: set[str] = set()

        # spool: "DIR" or "DIR?fsync=1" (or a full "jsonl:..." locator)
        spool_text = spool if str(spool).startswith("jsonl:") else f"jsonl:{spool}"
        spool_loc = parse(spool_text, kinds=("jsonl",))
        self.run_id = run_id or time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]
        self.spool_path = spool_file(spool_loc.location, self.run_id)
        self._resume_scan = scan_spool(self.spool_path)
        if self.spool_path.exists() and self.spool_path.stat().st_size and not self.resume:
            raise ValueError(f"run {self.run_id!r} already exists in the spool {self.spool_path}; "
                             f"pass resume=True to continue it, or choose another run_id")
        prev = self._resume_scan.info
        cfg = dict(config) if config is not None else (dict(prev.config) if prev else {})
        self._translator = _make_translator(source, mappings, cfg)
        try:
            cfg = {**cfg, **dict(self._translator.translate_config(cfg))}   # canonical names added
        except Exception as exc:
            _warn(f"trackbridge: could not translate the config to canonical names: {exc}")
        self.info = RunInfo(name=name or (prev.name if prev else None) or self.run_id,
                            project=project or (prev.project if prev else None), run_id=self.run_id, config=cfg,
                            tags=dict(tags or (prev.tags if prev else {}) or {}),
                            source=None if source == "auto" else source, names="canonical",
                            extra={"names": self.names, "mappings": list(mappings) if mappings else None,
                                   "flush_interval": self._flush_interval})
        self._seq_base = self._resume_scan.records
        self._seq = self._seq_base
        last = self._resume_scan.last_step
        self._next_step = 0 if last is None else last + 1
        self._derive = bool(derive)
        self._mappings = mappings
        self._derive_fn = _derive_hook(self._translator) if derive else None
        self._warned_once: set[str] = set()
        if self._derive_fn is not None and self.resume and self._resume_scan.records:
            # stateful derived rules (delta, rate, ema ...) continue from the history kept in the spool
            warm = getattr(self._translator, "warm_derive", None)
            if warm is not None:
                warm(rec for _seq, rec in iter_spool(self.spool_path))

        # sinks: the spool first, then the user's; build all first so that a bad spec fails init before any thread
        spool_sink = make_sink(spool_loc)
        built: list[Sink] = []
        for spec in sinks or []:
            try:
                sink = make_sink(spec)
            except (LocatorError, Exception) as exc:
                raise ValueError(f"sink {spec!r}: {exc}") from None
            _check_packages(spec, sink)
            _ready_for_shutdown()
            if isinstance(spec, str):
                _precheck_location(spec, sink, REGISTRY)
            built.append(sink)
        # a jsonl sink on the spool's own folder is the spool itself
        spool_dir = Path(spool_loc.location).expanduser().resolve()
        built = [s for s in built if not (s.kind == "jsonl" and Path(s.location).expanduser().resolve() == spool_dir)]
        _precheck_location(spool_text, spool_sink, REGISTRY)

        # trackers get the names asked for through the same pipeline as replay and migrate, judged from the
        # source detected while logging and the approximations found so far (both live)
        rename = self._rename = names_translator(self.names, mappings=mappings, config=cfg,
                                                 origin=lambda: self.info.source, fidelity=self.info.approximate)
        self._spool_worker = _SinkWorker(self, spool_sink, is_spool=True, queue_size=queue_size,
                                         batch_size=max(batch_size, 1000), max_latency=self._flush_interval / 2,
                                         rename=None)
        self._workers = [self._spool_worker] + [
            _SinkWorker(self, s, is_spool=False, queue_size=queue_size, batch_size=batch_size, max_latency=0.0,
                        rename=rename) for s in built]
        self._inbox: queue.Queue = queue.Queue(maxsize=queue_size)
        self._dispatcher = threading.Thread(target=self._dispatch_main, name="trackbridge-dispatch", daemon=True)
        for w in self._workers:
            w.thread.start()
        self._dispatcher.start()
        atexit.register(self._atexit)

    # -- public API ----------------------------------------------------------------------------------------------
    @property
    def id(self) -> str:
        return self.run_id

    @property
    def name(self) -> str | None:
        return self.info.name

    @property
    def config(self) -> dict[str, Any]:
        return self.info.config

    def log(self, metrics: dict[str, Any], step: int | None = None) -> None:
        """Log one step's metrics. Returns as soon as the values are validated and queued.

        Raises ``TypeError`` for a non-dict, a non-string key or a non-integer ``step``, ``ValueError`` for a step
        outside 0 .. 2**53 - 1 (nothing is logged for that call), ``RuntimeError`` after ``finish()``. A value or
        name no tracker can store (an empty name, a lone surrogate, ...) is left out with a one-time warning naming
        it (see ``run.problems``); the other values of the call are logged.
        """
        wall_time = time.time()
        values, problems = normalize_metrics(metrics)
        if step is not None:
            step = _as_step(step)
            if not 0 <= step <= STEP_MAX:
                check_step(step)
        if problems:
            self._report_values(problems)
        if self._finished:
            raise RuntimeError(f"run {self.run_id!r}: log() after finish()")
        self._inbox.put((wall_time, step, values))

    def tracker_info(self, is_spool: bool = False) -> RunInfo:
        """The run info a sink is opened with: the spool's is canonical; a tracker's has the names it receives and
        the approximations under those names."""
        return _tracker_info_impl(self, is_spool)

    def tracker_approximate(self, is_spool: bool = False) -> dict[str, str]:
        if is_spool or self._rename is None:
            return dict(self.info.approximate)
        pipe = self._rename.pipeline()
        return dict(pipe.stats.approximate) if pipe is not None else {}

    def finish(self, timeout: float | None = None, *, failed: bool = False) -> dict[str, Any]:
        """Flush every sink and close it (a failed sink is given one last chance to recover and catch up).
        ``failed=True`` records that training failed (MLflow FAILED, wandb exit code 1, ``outcome`` in the run
        info); leaving a ``with`` block by an exception, or the interpreter exiting on an uncaught one, does it.
        Safe to call twice. Returns :meth:`status`."""
        with self._lock:
            if self._finished:
                return self.status
            self._finished = True
        try:
            atexit.unregister(self._atexit)
        except Exception:
            pass
        outcome = "failed" if failed else "finished"
        self.info.extra["outcome"] = outcome
        for w in self._workers:
            w.sink.outcome = outcome
        self._inbox.put(_STOP)
        end = time.monotonic() + (self._finish_timeout if timeout is None else max(0.0, float(timeout)))
        self._dispatcher.join(max(0.0, end - time.monotonic()))
        self._spool_worker.thread.join(max(0.0, end - time.monotonic()))
        # wait for every tracker while it makes progress (records written or caught up, or requests answered, as
        # the sink counts them); one that makes none for stall_timeout seconds (a hung or unreachable server) is
        # left behind: what it lacks is written down for `trackbridge replay`
        last_progress = {id(w): (self._progress(w), time.monotonic()) for w in self._workers}
        while True:
            alive = [w for w in self._workers[1:] if w.thread.is_alive()]
            now = time.monotonic()
            if not alive or now >= end:
                break
            stalled = []
            for w in alive:
                p = self._progress(w)
                if p != last_progress[id(w)][0]:
                    last_progress[id(w)] = (p, now)
                elif now - last_progress[id(w)][1] > self._stall_timeout:
                    stalled.append(w)
            if len(stalled) == len(alive):
                break
            alive[0].thread.join(0.1)
        self._write_pending()
        return self.status

    def _left(self, w: "_SinkWorker") -> int:
        """Records of this run the tracker is not known to hold (0 once its worker closed cleanly)."""
        if not w.thread.is_alive() and w.state == "closed":
            return 0
        return max(0, self._seq - 1 - w.acked)

    def _write_pending(self) -> None:
        """After finish(): write down, beside the spool, which trackers lack which records (and say so), so that
        ``trackbridge replay SPOOL`` completes them; remove the note when nothing is left."""
        left = [(w, self._left(w)) for w in self._workers[1:]]
        left = [(w, n) for w, n in left if n]
        path = pending_file(self.spool_path)
        if not left:
            if path.exists():
                try:
                    path.unlink()
                except OSError:
                    pass
            return
        entries = [{"sink": w.sink.locator(), "describe": w.name, "records_left": n, "from_record": w.acked + 1,
                    "records": self._seq, "state": w.state,
                    "last_error": w.last_error} for w, n in left]
        try:
            write_pending(path, self.run_id, entries)
        except OSError as exc:
            _warn(f"trackbridge: could not write {path}: {exc}")
        for w, n in left:
            msg = (f"sink {w.name} lacks {n} of the run's {self._seq} records ({w.state}"
                   + (f"; last error: {w.last_error}" if w.last_error else "")
                   + f"); they are in the spool: trackbridge replay {self.spool_path}")
            self.problems.append(msg)
            _warn(f"trackbridge: finish(): {msg}")

    @staticmethod
    def _progress(w: "_SinkWorker") -> tuple:
        return (w.written, w.caught_up, w.state, w.failures, getattr(w.sink, "progress", 0))

    @property
    def status(self) -> dict[str, Any]:
        """Run id, spool path, and per sink: state (ok/failed/closed), records written, caught up, queued,
        failures, last error."""
        return {"run_id": self.run_id, "spool": str(self.spool_path), "finished": self._finished,
                "logged": self._seq - self._seq_base, "sinks": [w.status() for w in self._workers],
                "problems": list(self.problems)}

    def summary(self) -> str:
        """The status as a small text table (what ``print(run.summary())`` shows)."""
        st = self.status
        lines = [f"run {st['run_id']}  spool {st['spool']}  records logged {st['logged']}"]
        for s in st["sinks"]:
            err = f"  last error: {s['last_error']}" if s["last_error"] and s["state"] == "failed" else ""
            lines.append(f"  {s['sink']:<48} {s['state']:<7} written {s['written']:>7}  caught up "
                         f"{s['caught_up']:>6}  failures {s['failures']:>3}{err}")
        for p in st["problems"]:
            lines.append(f"  problem: {p}")
        return "\n".join(lines)

    def __enter__(self) -> "Run":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.finish(failed=exc_type is not None)

    def _atexit(self) -> None:
        # at interpreter exit after an uncaught exception, Python has set sys.last_value (PyErr_Print)
        dying = getattr(sys, "last_value", None) is not None or getattr(sys, "last_exc", None) is not None
        try:
            self.finish(timeout=60.0, failed=dying)
        except Exception:
            pass

    # -- dispatcher thread ---------------------------------------------------------------------------------------
    def _report_values(self, problems: list[str]) -> None:
        for p in problems:
            key = p.split(":", 1)[0]
            if key not in self._warned_values:
                self._warned_values.add(key)
                self.problems.append(p)
                _warn(f"trackbridge: {p}; the value was left out")

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned_once:
            self._warned_once.add(key)
            self.problems.append(message)
            _warn(f"trackbridge: {message}")

    def _resume_step(self) -> None:
        """Resume: the step counter continues after the highest step any tracker holds (a tracker can hold steps
        the spool lost when the process was killed). Waits for the trackers' answers at most ``resume_wait``
        seconds; a tracker that has not answered by then is not waited for."""
        end = time.monotonic() + self._resume_wait
        tops = []
        for w in self._workers[1:]:
            w.probed.wait(max(0.0, end - time.monotonic()))
            if w.resume_top is not None:
                tops.append(w.resume_top)
        if tops and max(tops) + 1 > self._next_step:
            log.info("trackbridge: resume: a tracker holds steps up to %d; the step counter continues at %d",
                     max(tops), max(tops) + 1)
            self._next_step = max(tops) + 1

    def _dispatch_main(self) -> None:
        try:
            if self.resume and len(self._workers) > 1:
                self._resume_step()
            while True:
                item = self._inbox.get()
                if item is _STOP:
                    break
                rec = self._build(*item)
                seq = self._seq
                self._seq += 1
                self._spool_worker.put(seq, rec)
                out = rec
                if self._rename is not None and len(self._workers) > 1:
                    try:
                        out = self._rename(rec)      # once for all trackers; the spool stays canonical
                    except Exception as exc:
                        self._warn_once("names", f"renaming to {self.names!r} failed ({type(exc).__name__}: "
                                                 f"{exc}); trackers get canonical names")
                for w in self._workers[1:]:
                    w.put(seq, out)
        except BaseException as exc:
            _warn(f"trackbridge: the dispatcher crashed ({type(exc).__name__}: {exc}); logging stopped")
        finally:
            # the spool closes first so that failed sinks can catch up from a complete file at their final retry
            self._spool_worker.stop()
            self._spool_worker.done.wait()
            for w in self._workers[1:]:
                w.stop()

    def _build(self, wall_time: float, step: int | None, values: dict[str, Any]) -> Record:
        res = None
        try:
            res = self._translator.translate(values)
            metrics = dict(res.metrics)
            if res.source and not res.source.startswith("auto"):
                self.info.source = res.source
            if res.approximate:
                self.info.approximate.update(res.approximate)
            derived = list(getattr(res, "derived", []) or [])
        except Exception as exc:
            self._warn_once("translate", f"translation failed ({type(exc).__name__}: {exc}); names logged as given")
            metrics, derived = dict(values), []
        if step is None:
            axis = metrics.get(STEP_AXIS)
            if isinstance(axis, (int, float)) and not isinstance(axis, bool) and math.isfinite(axis):
                step = int(axis)
                if not 0 <= step <= STEP_MAX:
                    self._warn_once("step-axis", f"{STEP_AXIS} = {axis!r} is outside 0 .. 2**53 - 1 (what every "
                                                 f"tracker stores); the record is logged at the next step instead")
                    step = self._next_step
            else:
                step = self._next_step
        self._next_step = max(self._next_step, step + 1)
        if self._derive_fn is not None and res is not None:
            try:
                self._derive_fn(res, step, wall_time)
                metrics = dict(res.metrics)
                derived = list(res.derived or [])
            except Exception as exc:
                self._warn_once("derive", f"deriving metrics failed ({type(exc).__name__}: {exc}); "
                                          f"derivation is off for this run")
                self._derive_fn = None
        return Record(step=step, wall_time=wall_time, metrics=metrics, derived=derived)


_INFO_LOCK = threading.Lock()


def _clean_info(run: "Run") -> RunInfo:
    """A copy of the run info that every sink can store: the config made plain JSON (see
    :func:`trackbridge.values.sanitize_config`; each change is reported once, naming the key), tags as strings, no
    lone surrogate in the name or project. Sink workers open concurrently, hence the lock."""
    import dataclasses
    from .values import sanitize_config
    with _INFO_LOCK:
        src = run.info
        config, notes = sanitize_config(src.config)
        for key, message in notes:
            run._warn_once(f"config:{key}", message)
        fix = _fix_text
        info = copy.deepcopy(dataclasses.replace(src, config={}, extra={}))
        info.config = config
        info.extra, _ = sanitize_config(src.extra)
        info.name = fix(info.name) if isinstance(info.name, str) else info.name
        info.project = fix(info.project) if isinstance(info.project, str) else info.project
        info.tags = {fix(str(k)): fix(v if isinstance(v, str) else str(v)) for k, v in (info.tags or {}).items()}
    return info


def _fix_text(text: str) -> str:
    return text if utf8_ok(text) else text.encode("utf-8", "backslashreplace").decode("utf-8")


_printable = _fix_text


def _tracker_info_impl(run: "Run", is_spool: bool) -> RunInfo:
    info = _clean_info(run)
    if not is_spool:
        info.names = run.names
        info.approximate = run.tracker_approximate(is_spool)
    return info


class NoOpRun:
    """What a non-zero rank gets: the same API as :class:`Run` (a test checks the two against each other);
    ``log()`` validates and discards, nothing is written, ``config``/``name``/``info`` are what ``init`` was given."""

    def __init__(self, rank: int, *, project: str | None = None, name: str | None = None,
                 config: dict[str, Any] | None = None, run_id: str | None = None, names: str = "canonical",
                 resume: bool = False) -> None:
        self.rank = rank
        self.run_id = run_id
        self.spool_path = None
        self.problems: list[str] = []
        self.resume = bool(resume)
        self.names = names or "canonical"
        self.info = RunInfo(name=name, project=project, run_id=run_id, config=dict(config or {}))

    @property
    def id(self) -> str | None:
        return self.run_id

    @property
    def name(self) -> str | None:
        return self.info.name

    @property
    def config(self) -> dict[str, Any]:
        return self.info.config

    def log(self, metrics: dict[str, Any], step: int | None = None) -> None:
        normalize_metrics(metrics)        # the same TypeError as on rank 0 for what rank 0 would refuse
        if step is not None:
            step = _as_step(step)
            if not 0 <= step <= STEP_MAX:
                check_step(step)

    def tracker_info(self, is_spool: bool = False) -> RunInfo:
        return self.info

    def tracker_approximate(self, is_spool: bool = False) -> dict[str, str]:
        return {}

    def finish(self, timeout: float | None = None, *, failed: bool = False) -> dict[str, Any]:
        return self.status

    @property
    def status(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "rank": self.rank, "writing": False, "spool": None, "finished": False,
                "logged": 0, "sinks": [], "problems": []}

    def summary(self) -> str:
        return f"rank {self.rank}: not writing (only rank 0 writes; init(rank_zero_only=False) to change)"

    def __enter__(self) -> "NoOpRun":
        return self

    def __exit__(self, *exc: Any) -> None:
        pass


def _as_step(step: Any) -> int:
    out = as_step(step)
    if out is None:
        kind = "bool" if isinstance(step, bool) else type(step).__name__
        raise TypeError(f"log(step=...) must be an integer, got {kind} {step!r}")
    return out


def _ready_for_shutdown() -> None:
    """Tracker clients started by a sink's thread may create a thread pool, which registers with the interpreter's
    shutdown; once the main thread has ended (a script that never calls finish()) that is refused ("can't register
    atexit after shutdown") and the run would reach no tracker. Importing the pool module now registers it in time."""
    import concurrent.futures.thread  # noqa: F401


def _check_packages(spec: Any, sink: Sink) -> None:
    """Fail at init, naming the extra to install, when a sink's tracker package is missing (rather than retrying
    in the background and losing the tracker for the whole run)."""
    import importlib.util
    for pkg in getattr(sink, "requires", ()):
        try:
            found = importlib.util.find_spec(pkg) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            extra = getattr(sink, "extra", "") or "all"
            raise ValueError(f"sink {spec!r} needs the {pkg!r} package, which is not installed: "
                             f"pip install 'trackbridge[{extra}]'")


def _precheck_location(spec: str, sink: Sink, registry: dict[str, str]) -> None:
    """Fail at init for a plain folder location that cannot be created or written; warn (the sink is retried
    later, training goes on) for a server URL that does not answer now."""
    loc = sink.location
    if loc and loc.startswith(("http://", "https://")):
        _check_server(spec, loc)
        return
    if not loc or "://" in loc or ":" in loc.split("/")[0]:
        return
    path = Path(loc).expanduser()
    probe = path
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        raise ValueError(f"sink {spec!r}: {probe} exists and is not a folder")
    if probe.exists() and not os.access(probe, os.W_OK | os.X_OK):
        raise ValueError(f"sink {spec!r}: folder {probe} is not writable")


def _check_server(spec: str, url: str) -> None:
    try:
        check_reachable(url)
    except ValueError as exc:
        raise ValueError(f"sink {spec!r}: {exc}") from None
    except Unreachable as exc:
        _warn(f"trackbridge: sink {spec!r}: server {exc.host}:{exc.port} is not reachable now ({exc.reason}); "
              f"training goes on, the sink is retried later and catches up from the spool")


def init(project: str | None = None, name: str | None = None, sinks: list[Any] | None = None, *,
         source: str = "auto", names: str = "canonical", config: dict[str, Any] | None = None,
         run_id: str | None = None, resume: bool = False, derive: bool = True, mappings: list[str] | None = None,
         spool: str = "runs", flush_interval: float = 1.0, queue_size: int = 5000, batch_size: int = 500,
         retries: int = 3, backoff: float = 0.2, retry_interval: float = 30.0, stall_timeout: float = 30.0,
         finish_timeout: float = 300.0, resume_wait: float = 10.0, tags: dict[str, str] | None = None, rank_zero_only: bool = True, rank: int | None = None) -> Run | NoOpRun:
    """Start a run that writes one canonical stream to every sink (see the module docstring for the behaviour).

    ``sinks``: locator strings (``"tensorboard:runs/tb"``, ``"mlflow:sqlite:///runs/mlflow.db"``, ...) or Sink
    objects; the JSONL spool in ``spool`` is always added. ``source``: naming of what the trainer logs (``auto``,
    ``canonical`` or ``FRAMEWORK[@VERSION]``); ``names``: naming written to the trackers (``canonical`` or
    ``FRAMEWORK[@VERSION]``; the spool always holds canonical names). ``flush_interval``: the most a SIGKILL can
    lose from the spool, in seconds. ``rank``: override the rank taken from the environment.

    Raises ``ValueError`` naming the sink for a sink string that is unknown or points at an unusable folder.
    """
    r = _rank.global_rank() if rank is None else int(rank)
    if rank_zero_only and r != 0:
        return NoOpRun(r, project=project, name=name, config=config, run_id=run_id, names=names, resume=resume)
    if not rank_zero_only and _rank.world_size() > 1 and run_id is None:
        run_id = time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6] + f"-rank{r}"
    return Run(project=project, name=name, sinks=list(sinks or []), source=source, names=names, config=config,
               run_id=run_id, resume=resume, derive=derive, mappings=mappings, spool=spool,
               flush_interval=flush_interval, queue_size=queue_size, batch_size=batch_size, retries=retries,
               backoff=backoff, retry_interval=retry_interval, stall_timeout=stall_timeout,
               finish_timeout=finish_timeout, resume_wait=resume_wait, tags=tags)


__all__ = ["init", "Run", "NoOpRun", "LoggerWarning", "STEP_AXIS"]
