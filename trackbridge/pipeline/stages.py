"""The stages a record passes through, in this order: **Translate -> Step -> Derive -> Rename** (then, for a run's
selection, **Select**). Each is ``stage(record, report) -> record``: it takes a record and the per-record
:class:`~trackbridge.translate.Translation` the stages before it filled, and returns the record the next stage gets
(its own bookkeeping added to the report). Every path builds the same stages: a stored run's
:class:`~trackbridge.pipeline.Pipeline` (translate, migrate, replay, compare, doctor, read) runs Translate, Derive
and Select; the logger runs Translate, Step and Derive before the spool (its records have no step until Step gives
them one, and derived rules such as ``rate`` need it), and Rename once for every tracker (logger/egress.py).

* :class:`Translate`: names as stored -> canonical (or straight to the target: one translator resolves both sides);
  derived marks the record carried follow their values.
* :class:`Step`: a record logged without a step gets its canonical step (``progress/step``) or the run's counter; a
  record on an x axis of its own keeps its step and leaves the counter alone.
* :class:`Derive`: what the source did not log, computed in canonical space from the translated values (marked in
  ``record.derived``, and approximate when an input was).
* :class:`Rename`: a canonical record -> the names asked for (``FRAMEWORK[@VERSION]``), through a pipeline of its
  own whose bookkeeping is that target's (approximations under the target's names).
* :class:`Select`: only the output names matching the run's glob patterns.

The translator (:class:`~trackbridge.pipeline.Translator`) holds what a run learns as its records arrive (the
detected source, the notes, the derived rules' history); the stages hold no state but the step counter.
"""
from __future__ import annotations

import fnmatch
import math
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Protocol

from ..record import Record
from ..record.values import STEP_MAX
from ..schema.model import STEP_AXIS
from ..translate import Translation

if TYPE_CHECKING:       # pragma: no cover
    from . import Pipeline
    from .translator import Translator


class Stage(Protocol):
    """One stage: the record the next stage gets, its bookkeeping added to ``report``."""

    def __call__(self, rec: Record, report: Translation) -> Record: ...


class Translate:
    """Names as stored -> the translator's target (canonical, or a framework's names in a one-shot translation).
    The first stage: it fills the fresh report (and, with ``canonical``, keeps the values by canonical name in
    ``report.canonical`` for a Derive stage after it)."""

    def __init__(self, translator: Translator, *, canonical: bool = False) -> None:
        self.translator = translator
        self.canonical = canonical

    def __call__(self, rec: Record, report: Translation) -> Record:
        res = self.translator.translate(rec.metrics, notes=False, into=report,   # the run's notes: read at the end
                                        canonical=self.canonical)
        derived = [res.renamed.get(d, d) for d in rec.derived if res.renamed.get(d, d) in res.metrics] \
            if rec.derived else []
        return Record(rec.step, rec.wall_time, res.metrics, derived, rec.axis)


class Step:
    """The step of a record logged without one: its canonical step (``progress/step``) when it logs one (a finite
    number in 0 .. 2**53 - 1), else the run's counter, which continues after the highest step logged (``next``). A
    record on an x axis of its own (``axis``) keeps its step and leaves the counter alone. ``problem(key,
    message)``: said once per key (a ``progress/step`` out of range)."""

    def __init__(self, next_step: int = 0, problem: Callable[[str, str], None] | None = None) -> None:
        self.next = next_step
        self.problem = problem

    def __call__(self, rec: Record, report: Translation) -> Record:
        step = rec.step
        if step is None and rec.axis is None:
            step = self.next
            counter = rec.metrics.get(STEP_AXIS)
            if isinstance(counter, (int, float)) and not isinstance(counter, bool) and math.isfinite(counter):
                if 0 <= int(counter) <= STEP_MAX:
                    step = int(counter)
                elif self.problem is not None:
                    self.problem("step-axis", f"{STEP_AXIS} = {counter!r} is outside 0 .. 2**53 - 1 (what every "
                                              f"tracker stores); the record is logged at the next step instead")
        if rec.axis is None and step is not None:
            self.next = max(self.next, step + 1)
        if step == rec.step:
            return rec
        return Record(step, rec.wall_time, rec.metrics, rec.derived, rec.axis)


class Derive:
    """What the source did not log, computed in canonical space from the translated values (``report.canonical``,
    kept by the Translate stage before it, or given back from the record's names; the translator's derived rules and
    their history), added under the target's names, never over a logged value."""

    def __init__(self, translator: Translator) -> None:
        self.translator = translator

    def __call__(self, rec: Record, report: Translation) -> Record:
        if report.metrics is not rec.metrics:       # added to the translation's own dict, never to a caller's
            report.metrics = dict(rec.metrics)
        before = len(report.derived)
        self.translator.apply_derive(report, rec.step, rec.wall_time, notes=False)
        new = [d for d in report.derived[before:] if d not in rec.derived]
        if not new:
            return rec
        return Record(rec.step, rec.wall_time, report.metrics, list(rec.derived) + new, rec.axis)

    def warm(self, records: Iterable[Record]) -> int:
        """Feed earlier canonical records to the stateful rules (``delta``, ``rate`` ...) without output: a resumed
        run continues with their history. Returns the number of records seen."""
        return self.translator.warm_derive(records)


class Select:
    """Only the metrics whose output name matches one of ``patterns`` (``fnmatch`` globs; each name judged once)."""

    def __init__(self, patterns: Iterable[str]) -> None:
        self.patterns = [str(p) for p in patterns]
        self.chosen: dict[str, bool] = {}

    def __call__(self, rec: Record, report: Translation) -> Record:
        seen = self.chosen
        for k in rec.metrics:
            if k not in seen:
                seen[k] = any(fnmatch.fnmatchcase(k, p) for p in self.patterns)
        if all(seen[k] for k in rec.metrics):
            return rec
        kept = {k: v for k, v in rec.metrics.items() if seen[k]}
        return Record(rec.step, rec.wall_time, kept, [d for d in rec.derived if d in kept], rec.axis)


class Rename:
    """A canonical record -> the ``target`` naming (``FRAMEWORK[@VERSION]``) through a pipeline of its own, built on
    the first record: the target's trainer and the fidelity are judged from ``origin`` (the framework the canonical
    names came from; a value, or a function giving it once the source is detected) and ``fidelity`` (the
    approximations found so far, in canonical names). :meth:`pipeline` gives that pipeline (None before the first
    record) and its bookkeeping: the approximations under the target's names; ``report``, when given, is filled with
    the record's own (what was renamed to what)."""

    def __init__(self, target: str, *, mappings: list[str] | None = None, config: Mapping[str, Any] | None = None,
                 origin: Any = None, fidelity: dict[str, str] | None = None) -> None:
        self.target = target
        self.mappings = mappings
        self.config = dict(config or {})
        self.origin = origin
        self.fidelity = fidelity
        self._pipe: Pipeline | None = None

    def pipeline(self) -> Pipeline | None:
        return self._pipe

    def __call__(self, rec: Record, report: Translation | None = None) -> Record:
        pipe = self._pipe
        if pipe is None:
            from . import Pipeline
            org = self.origin() if callable(self.origin) else self.origin
            pipe = self._pipe = Pipeline("canonical", self.target, config=self.config, mappings=self.mappings,
                                         derive=False, origin=org, fidelity=self.fidelity)
            pipe.setup(())
        return pipe.one(rec, report)


__all__ = ["Derive", "Rename", "Select", "Stage", "Step", "Translate"]
