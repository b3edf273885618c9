"""The dispatcher: one thread between ``log()`` and the sinks. It numbers each record (step and sequence number),
translates it to canonical names, derives what the framework did not log, hands it to the spool and to the egress
(logger/egress.py), which renames it once for the trackers and offers it to each tracker's worker (which never makes
it wait)."""
from __future__ import annotations

import math
import queue
import threading
import time
from typing import Any, Callable

from ..record import Record, RunInfo
from ..values import STEP_MAX
from .common import STEP_AXIS, STOP, log, warn
from .egress import Egress


class Dispatcher:
    def __init__(self, *, translator: Any, derive_fn: Callable[..., None] | None, info: RunInfo,
                 egress: Egress, spool: Any, seq_base: int, next_step: int, inbox_size: int,
                 resume_wait: float | None,
                 warn_once: Callable[[str, str], None], doctor: Any = None,
                 found: Callable[[Any], None] | None = None) -> None:
        self.translator = translator
        self.derive_fn = derive_fn
        self.info = info
        self.egress = egress                    # rename once, offer to every tracker (logger/egress.py)
        self.spool = spool
        self.seq = seq_base
        self.next_step = next_step
        self.resume_wait = resume_wait          # None: not resuming
        self.warn_once = warn_once
        self.doctor = doctor                    # trackbridge.doctor.Doctor with init(doctor=True), else None
        self.found = found                      # the run's hook: a new finding, said in the caller's thread
        self.user_names: dict[str, str] = {}    # canonical name -> the key log() was given (for the findings)
        self.inbox: queue.Queue = queue.Queue(maxsize=inbox_size)
        self.thread = threading.Thread(target=self._main, name="trackbridge-dispatch", daemon=True)

    @property
    def trackers(self) -> list[Any]:
        return self.egress.handles

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
        # resume: the step counter waits for the trackers' answers, but only once a record needs it (one logged
        # without a step); records logged with their step go to the spool at once, so that a resumed process killed
        # while a slow tracker opens loses no more than ``flush_interval`` of them
        numbering = self.resume_wait is not None and bool(self.trackers)
        try:
            while True:
                item = self.inbox.get()
                if item is STOP:
                    break
                if numbering and item[1] is None and (len(item) <= 3 or item[3] is None):
                    numbering = False
                    self._resume_step()
                # (wall_time, step, values[, axis[, logged]]): logged is log()'s time.monotonic()
                rec = self.build(item[0], item[1], item[2], item[3] if len(item) > 3 else None)
                logged = item[4] if len(item) > 4 else time.monotonic()
                self.emit(rec, logged)
                if self.doctor is not None:
                    for note in self.diagnose(rec):
                        self.emit(note, logged)
                    time.sleep(0)       # the GIL to a caller waiting in log(), not after the switch interval
        except BaseException as exc:
            warn(f"trackbridge: the dispatcher crashed ({type(exc).__name__}: {exc}); logging stopped")
        finally:
            # the spool closes first so that failed sinks can catch up from a complete file at their final retry
            self.spool.stop()
            self.spool.done.wait()
            for w in self.trackers:
                w.stop()

    def emit(self, rec: Record, logged: float | None = None) -> None:
        """Number a record, hand it to the spool, rename it once for the trackers and offer it to each.
        ``logged``: the ``time.monotonic()`` of its ``log()`` call (the spool's flush bound counts from it)."""
        seq = self.seq
        self.seq += 1
        self.spool.put(seq, rec, logged)          # the spool stays canonical
        self.egress.put(seq, rec)

    def diagnose(self, rec: Record) -> list[Record]:
        """The live checks (``init(doctor=True)``) fed one record: a text record per finding that holds for the
        first time (logged at the record's step, after it), the finding named in the keys ``log()`` was given and
        handed to the run (``found``), which says it in the caller's thread (warning, ``on_finding``, ``stop_on``).
        A check that fails turns the checks off with one warning; logging goes on."""
        from ..doctor.report import live_text
        try:
            found = self.doctor.feed(rec, approximate=self.info.approximate)
        except Exception as exc:
            self.warn_once("doctor", f"the diagnostic checks failed ({type(exc).__name__}: {exc}); they are off "
                                     f"for this run")
            self.doctor = None
            return []
        out = []
        for f in found:
            f.names = {c: self.user_names[c] for c in f.metrics() if c in self.user_names}
            text = live_text(f)
            if self.found is not None:
                self.found(f)
            out.append(Record(step=rec.step, wall_time=rec.wall_time, metrics={f"doctor/{f.id}": text}, axis=rec.axis))
        return out

    def build(self, wall_time: float, step: int | None, values: dict[str, Any], axis: str | None = None) -> Record:
        """The record for one ``log()`` call: canonical names, its step, derived values. A record on an x axis of
        its own (``axis``) keeps its step and leaves the run's step counter alone."""
        res = None
        try:
            res = self.translator.translate(values)
            metrics = dict(res.metrics)
            if res.source and not res.source.startswith("auto"):
                self.info.source = res.source
            derived = list(getattr(res, "derived", []) or [])
            if self.doctor is not None and res.renamed:     # the user's key of each canonical name, for findings
                names = self.user_names
                for src, canon in res.renamed.items():
                    if canon not in names:
                        names[canon] = src
        except Exception as exc:
            self.warn_once("translate", f"translation failed ({type(exc).__name__}: {exc}); names logged as given")
            metrics, derived = dict(values), []
        if step is None and axis is None:
            counter = metrics.get(STEP_AXIS)
            if isinstance(counter, (int, float)) and not isinstance(counter, bool) and math.isfinite(counter):
                step = int(counter)
                if not 0 <= step <= STEP_MAX:
                    self.warn_once("step-axis", f"{STEP_AXIS} = {counter!r} is outside 0 .. 2**53 - 1 (what every "
                                                f"tracker stores); the record is logged at the next step instead")
                    step = self.next_step
            else:
                step = self.next_step
        if axis is None:
            assert step is not None
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
        if res is not None and res.approximate:     # the translation's, and a value derived from an approximate input
            self.info.approximate.update(res.approximate)
        return Record(step=step, wall_time=wall_time, metrics=metrics, derived=derived, axis=axis)


def live_doctor(translator: Any, mappings: list[str] | None, config: dict[str, Any], info: RunInfo,
                resume_from: Any = None) -> Any:
    """The diagnostic checks of ``init(doctor=True)`` (the shipped ones plus the check files among ``mappings``),
    with the run config's canonical names; a resumed run's spool is fed first, so that a finding the run already
    logged is not logged again. A checks file that cannot be used is an error at ``init``."""
    from ..doctor import Doctor, checks_for
    from ..errors import UsageError
    from ..schema.yamlfile import MappingError
    try:
        doc = Doctor(checks_for(translator.registry, mappings), config=config, label=info.name or "run")
    except MappingError as exc:             # CheckError, or several problems of one file at once
        raise UsageError(f"init(doctor=True): {exc}") from None
    if resume_from is not None:
        from ..stream import read_stream
        doc.warm(rec for _seq, rec in read_stream(resume_from))
    return doc


def severity_rank(severity: str) -> int:
    from ..doctor.findings import severity_rank as rank
    return rank(severity)


def live_options(doctor: bool, on_finding: Any, stop_on: str | None) -> tuple[Any, str | None]:
    """``LoggerOptions.on_finding`` and ``init``'s ``stop_on``, checked: each needs ``doctor=True``; ``on_finding``
    a callable taking the finding, ``stop_on`` a severity (``critical``, ``warning`` or ``info``: that or worse sets
    ``run.should_stop``)."""
    from ..doctor import SEVERITIES
    from ..errors import UsageError
    if on_finding is not None and not callable(on_finding):
        raise UsageError(f"LoggerOptions(on_finding={on_finding!r}): expected a callable taking the finding")
    if stop_on is not None and stop_on not in SEVERITIES:
        raise UsageError(f"init(stop_on={stop_on!r}): expected one of {', '.join(SEVERITIES)} (or None)")
    if (on_finding is not None or stop_on is not None) and not doctor:
        given = "LoggerOptions(on_finding=...)" if on_finding is not None else "init(stop_on=...)"
        raise UsageError(f"{given} acts on the live checks' findings: pass doctor=True too")
    return on_finding, stop_on
