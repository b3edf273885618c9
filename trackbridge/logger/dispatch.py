"""The dispatcher: one thread between ``log()`` and the sinks. It runs each record through the run's pipeline
(:meth:`trackbridge.pipeline.Pipeline.live`: Translate to canonical names, Step, Derive what the framework did not
log; trackbridge/pipeline/stages.py), stage by stage so that a stage that fails is said and isolated, numbers
it, hands it to the spool and to the egress (logger/egress.py), which renames it once for the trackers (the Rename
stage) and offers it to each tracker's worker (which never makes it wait)."""
from __future__ import annotations

import queue
import threading
import time
from typing import Any, Callable

from ..pipeline import Pipeline
from ..pipeline.stages import Derive, Step, Translate
from ..record import Record, RunInfo
from ..translate import Translation
from .common import STOP, log, warn
from .egress import Egress


class Dispatcher:
    def __init__(self, *, pipeline: Pipeline, info: RunInfo, egress: Egress, spool: Any, seq_base: int,
                 inbox_size: int,
                 resume_wait: float | None,
                 warn_once: Callable[[str, str], None], doctor: Any = None,
                 found: Callable[[Any], None] | None = None) -> None:
        translate, step = pipeline.stage(Translate), pipeline.stage(Step)
        assert translate is not None and step is not None, "the logger's pipeline is Pipeline.live's"
        self.translate: Translate = translate
        self.step: Step = step
        self.derive: Derive | None = pipeline.stage(Derive)
        self.info = info
        self.egress = egress                    # rename once, offer to every tracker (logger/egress.py)
        self.spool = spool
        self.seq = seq_base
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

    @property
    def next_step(self) -> int:
        """The step the next record logged without one gets (the Step stage's counter)."""
        return self.step.next

    @next_step.setter
    def next_step(self, value: int) -> None:
        self.step.next = value

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
        """The record for one ``log()`` call through the stages: canonical names, its step, derived values. A stage
        that fails is said once: a failed translation logs the names as given, a failed derivation turns
        derivation off for the run."""
        rec = Record(step=step, wall_time=wall_time, metrics=values, axis=axis)
        report = Translation()
        translated = True
        try:
            rec = self.translate(rec, report)
            if report.source and not report.source.startswith("auto"):
                self.info.source = report.source
            if self.doctor is not None and report.renamed:  # the user's key of each canonical name, for findings
                names = self.user_names
                for src, canon in report.renamed.items():
                    if canon not in names:
                        names[canon] = src
        except Exception as exc:
            self.warn_once("translate", f"translation failed ({type(exc).__name__}: {exc}); names logged as given")
            rec, report, translated = Record(step=step, wall_time=wall_time, metrics=dict(values), axis=axis), \
                Translation(), False
        rec = self.step(rec, report)
        if self.derive is not None and translated:
            try:
                rec = self.derive(rec, report)
            except Exception as exc:
                self.warn_once("derive", f"deriving metrics failed ({type(exc).__name__}: {exc}); "
                                         f"derivation is off for this run")
                self.derive = None
        if report.approximate:      # the translation's, and a value derived from an approximate input
            self.info.approximate.update(report.approximate)
        return rec


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
