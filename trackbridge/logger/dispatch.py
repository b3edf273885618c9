"""The dispatcher: one thread between ``log()`` and the sinks. It numbers each record (step and sequence number),
translates it to canonical names, derives what the framework did not log, hands it to the spool, renames it once
for the trackers and offers it to each tracker's worker (which never makes it wait)."""
from __future__ import annotations

import math
import queue
import threading
import time
from typing import Any, Callable

from ..record import Record, RunInfo
from ..values import STEP_MAX
from .common import STEP_AXIS, STOP, log, warn


class Dispatcher:
    def __init__(self, *, translator: Any, derive_fn: Callable[..., None] | None, info: RunInfo,
                 rename: Callable[[Record], Record] | None, names: str, spool: Any, trackers: list[Any],
                 seq_base: int, next_step: int, inbox_size: int, resume_wait: float | None,
                 warn_once: Callable[[str, str], None]) -> None:
        self.translator = translator
        self.derive_fn = derive_fn
        self.info = info
        self.rename = rename
        self.names = names
        self.spool = spool
        self.trackers = trackers
        self.seq = seq_base
        self.next_step = next_step
        self.resume_wait = resume_wait          # None: not resuming
        self.warn_once = warn_once
        self.inbox: queue.Queue = queue.Queue(maxsize=inbox_size)
        self.thread = threading.Thread(target=self._main, name="trackbridge-dispatch", daemon=True)

    def _resume_step(self) -> None:
        """Resume: the step counter continues after the highest step any tracker holds (a tracker can hold steps
        the spool lost when the process was killed). Waits for the trackers' answers at most ``resume_wait``
        seconds; a tracker that has not answered by then is not waited for."""
        end = time.monotonic() + (self.resume_wait or 0.0)
        tops = []
        for w in self.trackers:
            w.probed.wait(max(0.0, end - time.monotonic()))
            if w.resume_top is not None:
                tops.append(w.resume_top)
        if tops and max(tops) + 1 > self.next_step:
            log.info("trackbridge: resume: a tracker holds steps up to %d; the step counter continues at %d",
                     max(tops), max(tops) + 1)
            self.next_step = max(tops) + 1

    def _main(self) -> None:
        try:
            if self.resume_wait is not None and self.trackers:
                self._resume_step()
            while True:
                item = self.inbox.get()
                if item is STOP:
                    break
                rec = self.build(item[0], item[1], item[2])
                seq = self.seq
                self.seq += 1
                self.spool.put(seq, rec, item[3] if len(item) > 3 else time.monotonic())
                out = rec
                if self.rename is not None and self.trackers:
                    try:
                        out = self.rename(rec)      # once for all trackers; the spool stays canonical
                    except Exception as exc:
                        self.warn_once("names", f"renaming to {self.names!r} failed ({type(exc).__name__}: "
                                                f"{exc}); trackers get canonical names")
                for w in self.trackers:
                    w.put(seq, out)
        except BaseException as exc:
            warn(f"trackbridge: the dispatcher crashed ({type(exc).__name__}: {exc}); logging stopped")
        finally:
            # the spool closes first so that failed sinks can catch up from a complete file at their final retry
            self.spool.stop()
            self.spool.done.wait()
            for w in self.trackers:
                w.stop()

    def build(self, wall_time: float, step: int | None, values: dict[str, Any]) -> Record:
        """The record for one ``log()`` call: canonical names, its step, derived values."""
        res = None
        try:
            res = self.translator.translate(values)
            metrics = dict(res.metrics)
            if res.source and not res.source.startswith("auto"):
                self.info.source = res.source
            if res.approximate:
                self.info.approximate.update(res.approximate)
            derived = list(getattr(res, "derived", []) or [])
        except Exception as exc:
            self.warn_once("translate", f"translation failed ({type(exc).__name__}: {exc}); names logged as given")
            metrics, derived = dict(values), []
        if step is None:
            axis = metrics.get(STEP_AXIS)
            if isinstance(axis, (int, float)) and not isinstance(axis, bool) and math.isfinite(axis):
                step = int(axis)
                if not 0 <= step <= STEP_MAX:
                    self.warn_once("step-axis", f"{STEP_AXIS} = {axis!r} is outside 0 .. 2**53 - 1 (what every "
                                                f"tracker stores); the record is logged at the next step instead")
                    step = self.next_step
            else:
                step = self.next_step
        self.next_step = max(self.next_step, step + 1)
        if self.derive_fn is not None and res is not None:
            try:
                self.derive_fn(res, step, wall_time)
                metrics = dict(res.metrics)
                derived = list(res.derived or [])
            except Exception as exc:
                self.warn_once("derive", f"deriving metrics failed ({type(exc).__name__}: {exc}); "
                                         f"derivation is off for this run")
                self.derive_fn = None
        return Record(step=step, wall_time=wall_time, metrics=metrics, derived=derived)
