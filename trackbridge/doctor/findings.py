"""What the doctor found (:mod:`trackbridge.doctor`): a :class:`Finding` of one check in one run, its :class:`Stretch`
of steps (each run of records where it holds), and the order to read them in (:func:`sort_findings`: severity, the
checks file's order, the first step; then grouped by cause, the root cause first)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from .checks import SEVERITIES, Check
from .words import step_text


def severity_rank(severity: str) -> int:
    return SEVERITIES.index(severity) if severity in SEVERITIES else len(SEVERITIES)


@dataclass
class Stretch:
    """Consecutive records where a check held: first and last step, how many judged records, and the numbers."""

    first: float
    last: float
    records: int = 1
    detail: dict[str, Any] | None = None
    text: str = ""

    def steps(self) -> str:
        return f"step {step_text(self.first)}" if self.first == self.last else \
            f"steps {step_text(self.first)}-{step_text(self.last)}"

    def to_json(self) -> dict[str, Any]:
        return {"first_step": _num(self.first), "last_step": _num(self.last), "records": self.records,
                "evidence": self.text, "values": _jsonable(self.detail)}


@dataclass
class Finding:
    """One check that held in one run."""

    check: Check
    run: str
    severity: str
    series: dict[str, str]                  # role -> canonical name read
    stretches: list[Stretch] = field(default_factory=list)
    count: int = 0                          # stretches in all (only MAX_STRETCHES are kept)
    notes: list[str] = field(default_factory=list)
    caveats: list[str] = field(default_factory=list)
    order: int = 0
    names: dict[str, str] = field(default_factory=dict)    # canonical name read -> the name the user knows it by

    @property
    def id(self) -> str:
        return self.check.id

    @property
    def first_step(self) -> float:
        return self.stretches[0].first

    @property
    def last_step(self) -> float:
        return self.stretches[-1].last

    def metrics(self) -> list[str]:
        """The canonical names the finding is about (its charts), in the order of ``reads``."""
        return list(dict.fromkeys(self.series.values()))

    def where(self) -> str:
        """Where it held, in words: ``steps 60-80`` or ``steps 60-80 (and 2 more stretches, up to step 140)``."""
        head = self.stretches[0].steps()
        more = self.count - 1
        if more > 0:
            head += f" (and {more} more time{'s' if more > 1 else ''}, the last at step {step_text(self.last_step)})"
        return head

    def summary(self) -> str:
        """One sentence: severity, title, where, and the evidence of its first stretch."""
        return f"{self.severity}: {self.check.title}: {self.where()}: {self.stretches[0].text}"

    def to_json(self) -> dict[str, Any]:
        c = self.check
        return {"check": c.id, "title": c.title, "severity": self.severity, "run": self.run,
                "series": dict(self.series), "first_step": _num(self.first_step), "last_step": _num(self.last_step),
                "count": self.count, "stretches": [s.to_json() for s in self.stretches],
                "condition": c.when.text(), "means": c.means, "check_first": c.check_first,
                "then_check": c.then_check, "notes": list(self.notes), "caveats": list(self.caveats),
                "cites": [x.to_json() for x in c.cites], "defined_at": c.where()}


def _num(v: Any) -> Any:
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return v


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _jsonable(v) for k, v in obj.items() if k != "score"}
    if isinstance(obj, list):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, float):
        if not math.isfinite(obj):
            return str(obj)
        return _num(obj)
    return obj


def _share(cause: Finding, effect: Finding, within: float) -> bool:
    """The two findings share steps: a stretch of each within ``within`` steps of the other."""
    return any(c.first <= e.last + within and e.first <= c.last + within
               for c in cause.stretches for e in effect.stretches)


def sort_findings(found: list[Finding]) -> list[Finding]:
    """Findings in the order to look at them: by severity, the checks file's order and the first step; then a
    finding that another one's check ``explains`` (the checks file's ``explains:``) and that shares steps with it
    is grouped right after that cause, and the group takes the place of its first member (the root cause leads:
    a learning-rate jump before the collapse it caused, length hacking before the truncation it drives). A grouped
    finding gets a note naming its cause."""
    base = sorted(found, key=lambda f: (severity_rank(f.severity), f.order, f.first_step))
    rank = {id(f): i for i, f in enumerate(base)}
    parent: dict[int, Finding] = {}

    def ancestors(f: Finding) -> set[int]:
        out = set()
        while id(f) in parent and id(f) not in out:
            out.add(id(f))
            f = parent[id(f)]
        return out | {id(f)}

    for f in base:
        causes = [c for c in base if c is not f and f.id in c.check.explains
                  and _share(c, f, c.check.explains_within)]
        for c in sorted(causes, key=lambda c: (c.first_step, rank[id(c)])):
            if id(f) not in ancestors(c):           # never a cycle (a user's files may declare one)
                parent[id(f)] = c
                break
    children: dict[int, list[Finding]] = {}
    for f in base:
        if id(f) in parent:
            children.setdefault(id(parent[id(f)]), []).append(f)
    lead: dict[int, int] = {}

    def first_rank(f: Finding) -> int:
        if id(f) not in lead:
            lead[id(f)] = min([rank[id(f)], *(first_rank(c) for c in children.get(id(f), []))])
        return lead[id(f)]

    out: list[Finding] = []

    def walk(f: Finding) -> None:
        out.append(f)
        for c in sorted(children.get(id(f), []), key=first_rank):
            cause = parent[id(c)]
            note = (f"likely caused by {cause.check.title.lower()} [{cause.id}], {cause.where()}, listed before it: "
                    f"look at that first")
            if note not in c.notes:
                c.notes.append(note)
            walk(c)

    for f in sorted((f for f in base if id(f) not in parent), key=first_rank):
        walk(f)
    return out
