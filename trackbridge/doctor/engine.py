"""The engine: every check of a :class:`~.checks.CheckSet` evaluated over one run's canonical records, in one pass.

``Doctor(checks, config=canonical_config)`` is fed canonical records in log order (``feed(record)``, which returns
the findings that hold for the first time at that record: what the logger says live) and ``finish()`` returns every
finding, ordered by what to look at first. State per check is bounded (:mod:`.conditions`), so memory does not grow
with the run.

**Series.** A check's role reads the first of its canonical names present in the first record that has any of them
(the order of ``reads`` is the preference); from then on that name. The step is the record's step (its position in
the run when it has none). A value that is not a number is not a point; NaN and infinities are points only for
``nonfinite``.

**Findings.** A check holds at a record when its condition does (see :mod:`.conditions`); consecutive records where
it holds are one stretch, reported with its first and last step and the numbers behind it. The stretch starts where
the condition's evidence starts (the first of the N points of a sustained bound, the KL spike of "spike then
collapse"). At most :data:`MAX_STRETCHES` stretches are kept per check; ``count`` says how many there were.

**Order** (what to look at first): severity (critical, warning, info), then the order of the checks file (written in
the order an expert reads a run: validation, reward, KL, entropy, clipping, gradients, lengths, preference, the
reward model, load balance, time), then the first step; then findings are grouped by cause
(:func:`.findings.sort_findings`): one that another finding's check ``explains`` and that shares steps with it comes
right after it, the group in the place of its first member, so the root cause is read first.

**Fidelity.** A finding says when a series it read is approximate in this run (the translation's ``approximate``
reason) or was derived by trackbridge, and when a bound came from the run config.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping

from ..schema.model import Cond
from ..schema.templates import is_template, template_regex
from .checks import Check, CheckSet
from .conditions import Node, build, primitives
from .evidence import evidence
from .findings import Finding, Stretch, severity_rank, sort_findings
from .primitives import Bound, Primitive, Ratio
from .windows import Pool
from .words import fmt

if TYPE_CHECKING:       # pragma: no cover
    from ..record import Record

__all__ = ["Doctor", "Finding", "Stretch", "MAX_STRETCHES", "severity_rank"]

MAX_STRETCHES = 20


def _test(have: Any, want: Any) -> bool:
    if isinstance(want, Cond):
        return have is not None and bool(want.test(have))
    if isinstance(have, str) and isinstance(want, (int, float)) and not isinstance(want, bool):
        try:
            return float(have) == want
        except ValueError:
            return False
    return bool(have == want)


class _Instance:
    """One check being evaluated on one run."""

    def __init__(self, check: Check, config: Mapping[str, Any], order: int) -> None:
        self.check = check
        self.order = order
        self.config = config
        self.bound: dict[str, str] = {}                 # role -> canonical name read
        self.node: Node | None = None
        self.prims: list[Primitive] = []
        self.stretches: list[Stretch] = []
        self.count = 0
        self.open = False
        self.fired = False
        self.why_not: str | None = None
        self.severity = check.severity
        self.notes: list[str] = []
        self._feeds: list[tuple[Primitive, str, str | None, bool]] = []
        self._feeds_for = -1
        unmet = [f"{k}{v}" if isinstance(v, Cond) else f"{k}={v!r}" for k, v in check.requires
                 if not _test(config.get(k), v)]
        if unmet:
            self.why_not = f"the run config does not have {', '.join(unmet)}"
            return
        for note in check.notes:
            if all(_test(config.get(k), v) for k, v in note.when):
                self.notes.append(_fill(note.say, config))
                if note.severity and severity_rank(note.severity) < severity_rank(self.severity):
                    self.severity = note.severity
        self._patterns = {role: [(n, None if not is_template(n) else template_regex(n)) for n in names]
                          for role, names in check.reads.items()}

    def bind(self, metrics: Mapping[str, Any], new_keys: list[str],
             shared: dict[tuple[Any, ...], Primitive] | None = None, pool: Pool | None = None) -> bool:
        """Bind unbound roles to names in this record; True when every role is bound (the node is then built;
        ``pool``: the windows of the primitives built at this record)."""
        for role, pats in self._patterns.items():
            if role in self.bound:
                continue
            for name, rx in pats:
                if rx is None:
                    if name in metrics:
                        self.bound[role] = name
                        break
                else:
                    hit = next((k for k in sorted(new_keys) if rx.match(k)), None)
                    if hit is not None:
                        self.bound[role] = hit
                        break
        if len(self.bound) < len(self._patterns) and not self.check.when.needed(set(self.bound)):
            return False
        if self.node is None:
            better = {role: self.check.better.get(role, {}).get(self._pattern_of(role, name), "higher")
                      for role, name in self.bound.items()}
            self.node = build(self.check.when, self.config, better, shared, self.bound, pool)
            self.prims = primitives(self.node)
            if not self.node.applicable:
                need = sorted(p.p["config"] for p in self.prims if isinstance(p, Bound) and not p.applicable)
                self.why_not = f"the run config has no usable {', '.join(need)}"
        return True

    def _pattern_of(self, role: str, name: str) -> str:
        for n, rx in self._patterns[role]:
            if n == name or (rx is not None and rx.match(name)):
                return n
        return name

    def feeds(self) -> list[tuple[Primitive, str, str | None, bool]]:
        """(primitive, name read, the other name of a ratio, takes NaN/inf) for every bound primitive: what
        :meth:`feed` does per record, worked out once per binding."""
        if self._feeds_for != len(self.bound):      # roles are only ever added
            self._feeds_for = len(self.bound)
            self._feeds = [(p, self.bound[p.role], self.bound.get(p.other) if isinstance(p, Ratio) else None,
                            p.kind == "nonfinite") for p in self.prims if p.role in self.bound]
        return self._feeds

    def held(self, step: float) -> bool:
        """The check's node holds at the record just fed (:meth:`Doctor.feed` judges it: fed, and holding): the
        stretch goes on or a new one starts; True when the check held for the first time in the run."""
        node = self.node
        assert node is not None
        first = node.since if node.since is not None else step
        last = self.stretches[-1] if self.stretches else None
        if last is not None and (self.open and not first > last.last or not self.open and first <= last.last):
            # the same event goes on (evidence that began after it is a new one), or evidence that began within the
            # last stretch completes after a pause (a sustained bound's 5th point after a one-point form): one event
            last.first = min(last.first, first)
            last.last, last.records, last.detail = step, last.records + 1, node.detail
            self.open = True
        else:
            self.count += 1
            self.open = True
            if len(self.stretches) < MAX_STRETCHES:
                self.stretches.append(Stretch(first=min(first, step), last=step, detail=node.detail))
            else:
                self.open = False           # counted, not kept
        if not self.fired:
            self.fired = True
            return True
        return False

    def finding(self, run: str, approximate: Mapping[str, str], derived: set[str]) -> Finding:
        node = self.node
        assert node is not None
        for st in self.stretches:
            st.text = evidence(node, self.bound, st.detail)
        # the series the finding is about: those of the conditions that held (an `any`'s other alternatives, bound
        # because the run logs them, are not its evidence)
        held = {r for p in self.prims if p.last_true is not None
                for r in ((p.role, p.other) if isinstance(p, Ratio) else (p.role,))}
        series = {role: name for role, name in self.bound.items() if role in held} or dict(self.bound)
        caveats = []
        for role, name in series.items():
            if name in approximate:
                caveats.append(f"{name} is approximate in this run: {approximate[name]}")
            if name in derived:
                caveats.append(f"{name} was derived by trackbridge from other logged metrics (not logged by the "
                               f"run)")
        for p in self.prims:
            if isinstance(p, Bound) and "config" in p.p and p.role in series:
                caveats.append(f"the bound of {self.bound.get(p.role, p.role)} is {fmt(p.p.get('times', 1))} x the "
                               f"run config's {p.p['config']} = {fmt(self.config.get(p.p['config']))}")
        caveats = list(dict.fromkeys(caveats))
        return Finding(check=self.check, run=run, severity=self.severity, series=series,
                       stretches=list(self.stretches), count=self.count, notes=list(self.notes), caveats=caveats,
                       order=self.order)


_PLACEHOLDER = re.compile(r"\{([a-z_][a-z0-9_]*)\}")
_NUMBER = (int, float)      # the exact classes, the fast path; a bool is never a number here


def _number(v: Any) -> bool:
    """A number of another class (numpy's float64 is a float; a bool is not a number)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _fill(text: str, config: Mapping[str, Any]) -> str:
    return _PLACEHOLDER.sub(lambda m: fmt(config[m.group(1)]) if m.group(1) in config else m.group(0), text)


@dataclass
class _Series:
    """Who reads one canonical name: each primitive once (``finite``: their ``point``, given every finite value;
    ``nonfinite``: those that take NaN and infinities too; ``ratios``: a ratio and the name it divides by), and
    the checks they belong to."""

    finite: list[Callable[[float, float], None]] = field(default_factory=list)
    nonfinite: list[Callable[[float, float], None]] = field(default_factory=list)
    ratios: list[tuple[Primitive, str]] = field(default_factory=list)
    prims: list[Primitive] = field(default_factory=list)
    insts: list[_Instance] = field(default_factory=list)


class Doctor:
    """Evaluate ``checks`` over one run's canonical records (see the module docstring).

    ``config``: the run config with canonical config names (``top_k``, ``max_response_length`` ...), as
    :meth:`~trackbridge.pipeline.Pipeline.canonical_config` gives it. ``label``: the run's name in findings."""

    def __init__(self, checks: CheckSet | Iterable[Check], *, config: Mapping[str, Any] | None = None,
                 label: str = "run") -> None:
        self.label = label
        self.config = dict(config or {})
        self.instances = [_Instance(c, self.config, i) for i, c in enumerate(checks)]
        self._waiting = [i for i in self.instances if i.why_not is None]     # roles not all bound yet
        self._running: list[_Instance] = []
        self._seen: set[str] = set()
        self._subs: dict[str, _Series] = {}             # canonical name -> who reads it
        self._by_keys: dict[tuple[str, ...], tuple[list[tuple[_Instance, Node]], list[Primitive]]] = {}
        self._shared: dict[tuple[Any, ...], Primitive] = {}     # identical primitives of several checks: one
        self._hot: list[Primitive] = []         # the primitives that hold at this record or stopped holding at it
        self._owners: dict[int, list[_Instance]] = {}           # id of a primitive -> the checks that read it
        self._open: set[_Instance] = set()      # the checks in a stretch at their last judged record
        self._index = 0
        self.derived: set[str] = set()
        self.records = 0

    def feed(self, rec: Record, approximate: Mapping[str, str] | None = None) -> list[Finding]:
        """Feed one canonical record; returns the findings that hold for the first time at it (``approximate``: the
        approximations known so far, for their caveats)."""
        metrics = rec.metrics
        step = float(rec.step) if rec.step is not None else float(self._index)
        self._index += 1
        self.records += 1
        if rec.derived:
            self.derived.update(rec.derived)
        if self._waiting and not metrics.keys() <= self._seen:     # only a record with new names can bind a role
            new = [k for k in metrics if k not in self._seen]
            self._seen.update(new)
            still = []
            pool = Pool()                   # the primitives built at this record read the same points from now on
            for inst in self._waiting:
                started = inst.node is not None
                if inst.bind(metrics, new, self._shared, pool):
                    if inst.why_not is None and not started:
                        self._running.append(inst)
                    if len(inst.bound) < len(inst.check.reads) and inst.why_not is None:
                        still.append(inst)          # an `any` running on some roles: the others may come
                else:
                    still.append(inst)
            self._waiting = still
            self._subscribe()
        # each value is checked once and given to every primitive that reads its name; then each check that reads
        # a name of the record is judged (one none of whose primitives got a point is not fresh: unchanged)
        subs = self._subs
        for name, v in metrics.items():
            series = subs.get(name)
            if series is None or v is None:
                continue
            if v.__class__ not in _NUMBER:
                if not _number(v):
                    continue
            v = float(v)
            if v - v == 0:                  # finite (NaN and infinities give NaN)
                for point in series.finite:
                    point(step, v)
                for p, other in series.ratios:
                    o = metrics.get(other)
                    if o is None or (o.__class__ not in _NUMBER and not _number(o)) or not o \
                            or not math.isfinite(o):
                        continue
                    p.point(step, v / float(o))
            else:
                for point in series.nonfinite:
                    point(step, v)
        touched, fed = self._judged(metrics)
        fired = []
        hot = self._hot
        if hot or self._open:
            # a check is judged when a condition of it holds at this record or stopped holding at it, or while it is
            # in a stretch; at any other record none of its conditions holds, so judging it would change nothing
            heated = {id(i) for p in hot for i in self._owners[id(p)]}
            hot.clear()
            for inst, node in touched:
                if not inst.open and id(inst) not in heated:
                    continue
                if node.parts_:
                    node.update(step)
                if not node.fresh:
                    continue
                if not node.holds:
                    inst.open = False
                elif inst.held(step):
                    fired.append(inst.finding(self.label, approximate or {}, self.derived))
                if inst.open:
                    self._open.add(inst)
                else:
                    self._open.discard(inst)
        for p in fed:
            p.fresh = False                 # judged by every check that reads it: the next record starts unfed
        return fired

    def _judged(self, metrics: Mapping[str, Any]) -> tuple[list[tuple[_Instance, Node]], list[Primitive]]:
        """The checks that read a name of the record (in the order of its names, then of :meth:`_subscribe`), with
        their nodes, and the primitives that do: worked out once per set of names (a run logs few)."""
        key = tuple(metrics)
        hit = self._by_keys.get(key)
        if hit is None:
            if len(self._by_keys) >= 256:   # a run whose records each log other names: bounded all the same
                self._by_keys.clear()
            insts: dict[int, _Instance] = {}
            prims: dict[int, Primitive] = {}
            for name in key:
                series = self._subs.get(name)
                if series is not None:
                    insts.update((id(i), i) for i in series.insts if id(i) not in insts)
                    prims.update((id(p), p) for p in series.prims)
            hit = self._by_keys[key] = ([(i, i.node) for i in insts.values() if i.node is not None],
                                        list(prims.values()))
        return hit

    def _subscribe(self) -> None:
        """Who reads each canonical name: worked out again only when a record bound new roles."""
        subs: dict[str, _Series] = {}
        seen: set[tuple[str, int]] = set()
        owners: dict[int, list[_Instance]] = {}
        for inst in self._running:
            for p, name, other, nonfinite in inst.feeds():
                p.hot = self._hot
                if inst not in owners.setdefault(id(p), []):
                    owners[id(p)].append(inst)
                series = subs.get(name)
                if series is None:
                    series = subs[name] = _Series()
                if (name, id(p)) not in seen:   # a primitive shared by several checks is fed once per point
                    seen.add((name, id(p)))
                    series.prims.append(p)
                    if other is not None:
                        series.ratios.append((p, other))
                    else:
                        series.finite.append(p.point)
                        if nonfinite:
                            series.nonfinite.append(p.point)
                if inst not in series.insts:
                    series.insts.append(inst)
        self._subs = subs
        self._owners = owners
        self._by_keys.clear()

    def warm(self, records: Iterable[Record], prefix: str = "doctor/") -> None:
        """Feed a resumed run's earlier records without reporting: a check that held then counts as reported only
        when the records hold its text record (``doctor/<id>``), so each finding is logged once across restarts."""
        logged: set[str] = set()
        for rec in records:
            logged.update(k[len(prefix):] for k in rec.metrics if k.startswith(prefix))
            self.feed(rec)
        for inst in self._running:
            if inst.fired and inst.check.id not in logged:
                inst.fired = False

    def finish(self, approximate: Mapping[str, str] | None = None) -> list[Finding]:
        """Every finding of the run, ordered by what to look at first. ``approximate``: canonical name -> why its
        value is approximate in this run (the translation's bookkeeping)."""
        found = [inst.finding(self.label, approximate or {}, self.derived) for inst in self._running
                 if inst.stretches]
        return sort_findings(found)

    def coverage(self) -> dict[str, Any]:
        """Which checks ran, and why the others could not (no series, or the run config lacks what they need)."""
        ran = [i.check.id for i in self._running]
        skipped = {}
        for inst in self.instances:
            if inst.check.id in ran:
                continue
            if inst.why_not is not None:
                skipped[inst.check.id] = inst.why_not
            else:
                missing = [role for role in inst.check.reads if role not in inst.bound]
                skipped[inst.check.id] = "the run logs none of " + "; ".join(
                    " / ".join(inst.check.reads[r]) for r in missing)
        return {"ran": ran, "not_run": skipped}


