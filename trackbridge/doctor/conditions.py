"""The conditions a check tests, evaluated point by point over a run's series (pure Python, bounded state).

A condition is a tree (:class:`Spec`, parsed by :mod:`.checks`); :func:`build` turns it into nodes that are fed the
points of their series in log order. Each node keeps a fixed amount of state (a window of the last points, a few
running numbers), so a run of any length is diagnosed in constant memory, live in the logger as well as from a file.

Primitive conditions read one series (``of``; ``ratio`` reads two logged in the same record):

============  ==================================================================================================
``above``     the value (``abs``: its absolute value) is above ``value``, or above ``times`` x the run config's
              ``config`` value, for ``for`` consecutive points (``ignore_zero``: values exactly 0 are not points,
              as a KL logged as 0.0 when it is not computed)
``below``     the same, below
``sign``      the value is below ``-tolerance`` (``is: negative``) or above ``tolerance``, for ``for`` points
``spike``     the value jumps above a baseline of the ``window`` points before it (at least ``min_points``):
              at least ``factor`` x the baseline (the lower median, or the maximum with ``baseline: max``) and/or
              at least ``mads`` robust standard deviations (1.4826 x the median absolute deviation) above the
              median; always by more than ``floor``, to at least ``at_least`` (an absolute floor), with
              ``over_last`` at least that many times the point before (a jump, not a ramp), and with
              ``over_usual`` at least that many times the 95th percentile of the usual points (no spikes) of the
              last 5 x ``window``
``collapse``  the value is below ``to`` x its reference level, for ``for`` points (a positive quantity: entropy,
              length): the early level (the mean of ``early`` points after ``skip``) or, with ``reference:
              peak``, the highest median of ``early`` consecutive points so far (``within``: of the last N)
``drop``      the mean of the last ``window`` points is below its running peak by more than ``by`` x the peak
              (and by at least ``min``), for ``for`` points; ``noise: K``: and by more than K standard errors of
              that mean (the series' own point noise); ``after_rise``: the peak rose above the first mean by as
              much (noise around a level that never rose is no drop)
``rise``      the mean of the last ``window`` points is above the early level (the first such mean) by more than
              ``by`` x that level (and by at least ``min``), for ``for`` points
``no_gain``   the last ``window`` points are no better than the best point before them (by more than ``by``); the
              direction is canonical.yaml's ``better:`` of the metric
``flat``      after ``2 x window`` points, the mean of the last ``window`` is no better than the mean of the first
              ``window`` by more than ``sigmas`` (2) standard errors of the difference and ``min`` (direction:
              ``better:``)
``ratio``     ``of / to``, logged in the same record, is above (or below) a bound for ``for`` points
``nonfinite`` the value is NaN or infinite (every other condition skips such points)
============  ==================================================================================================

Composite conditions: ``all`` (every part holds at its latest point, or, with ``within: N``, held at a step at
most N steps back and one of them holds now), ``any`` (at least one part holds at its latest point), ``then`` (the
second part holds now, in a stretch that began at most ``within`` steps after the first part held: the first came
first; it holds as long as that stretch lasts).

The nodes: :mod:`.nodes` (what every node has), :mod:`.primitives` (the primitive conditions), the composites and
:func:`build` here; :mod:`.words` says a node's numbers in words.

Each node has, after every record: ``fresh`` (it got a point in this record), ``holds`` (at its latest point),
``last_true`` (the step it last held at), ``since`` (the step the current stretch of holding began at: a
sustained condition's first point, the spike's step for ``then``) and ``detail`` (the numbers behind it, for the
finding's text).
"""
from __future__ import annotations

from collections import deque
from typing import Any, Mapping

from .nodes import COMPOSITES, PRIMITIVES, Node, Spec
from .primitives import Bound, Collapse, Drop, Flat, NoGain, NonFinite, Primitive, Ratio, Rise, Sign, Spike
from .windows import Pool

__all__ = ["Spec", "Node", "Primitive", "Composite", "build", "primitives", "PRIMITIVES", "COMPOSITES"]


class Composite(Node):
    parts_ = True

    def __init__(self, spec: Spec, parts: list[Node]) -> None:
        super().__init__()
        self.kind = spec.kind
        self.parts = parts
        self.within: int | None = spec.params.get("within")
        self._events: deque[float] = deque(maxlen=64)      # `then`: the steps the first condition held at, lately
        if self.kind == "any":
            usable = [p for p in parts if p.applicable]
            self.parts = usable or parts
            self.applicable = bool(usable)
        else:
            self.applicable = all(p.applicable for p in parts)

    def roles(self) -> set[str]:
        return set().union(*(p.roles() for p in self.parts))

    def start_record(self) -> None:
        self.fresh = False
        for p in self.parts:
            p.start_record()

    def update(self, step: float) -> None:
        """Judge the record just fed: the parts first (a composite part is judged here), then this node, when any
        part got a point (each kind in its own method: one pass over the parts)."""
        if self.kind == "any":
            self._any(step)
        elif self.kind == "all":
            self._all(step)
        else:
            self._then(step)

    def _fed(self, step: float) -> bool:
        fresh = False
        for p in self.parts:
            if p.parts_:
                p.update(step)
            if p.fresh:
                fresh = True
        self.fresh = fresh
        return fresh

    def _any(self, step: float) -> None:
        # at least one part holds at its latest point; the stretch began where the earliest of them began
        fresh = ok = False
        since = step
        for p in self.parts:
            if p.parts_:
                p.update(step)
            if p.fresh:
                fresh = True
            if p.holds:
                s = p.since if p.since is not None else step
                if not ok or s < since:
                    since = s
                ok = True
        self.fresh = fresh
        if fresh:
            if ok:
                self._held(since, step)
            else:
                self.holds = False

    def _all(self, step: float) -> None:
        # with `within`, the parts meet at the record where the last of them holds (not at the records after it,
        # while the earlier ones are still in the window); the cheaper test first (a part holding at this record)
        if not self._fed(step):
            return
        within = self.within
        if within is None:
            ok = all(p.holds for p in self.parts)
        else:
            ok = any(p.fresh and p.holds for p in self.parts) and all(p.active(step, within) for p in self.parts)
        if ok:
            self._held(max((p.since if p.since is not None else step) for p in self.parts), step)
        else:
            self.holds = False

    def _then(self, step: float) -> None:
        # the second condition's current stretch began at most `within` steps after the first held (at or before
        # that beginning): the cause came first; it holds as long as that stretch lasts
        if not self._fed(step):
            return
        first, second = self.parts
        if first.fresh and first.holds:
            e = first.since if first.since is not None else step     # one event per stretch: where it began
            if not self._events or self._events[-1] != e:
                self._events.append(e)
        self.holds = False
        if second.fresh and second.holds:
            start = second.since if second.since is not None else step
            lo = start - (self.within or 0)
            for e in reversed(self._events):        # the latest cause at most `within` before it began
                if lo <= e <= start:
                    self._held(e, step)
                    break

    def _held(self, since: float, step: float) -> None:
        self.holds = True
        self.last_true = step
        self.since = since
        # the parts' details as they are (a primitive replaces its detail, never changes it in place)
        self.detail = {"parts": [(p.detail or {}) if p.last_true is not None else {} for p in self.parts]}


def build(spec: Spec, config: Mapping[str, Any], better: Mapping[str, str],
          shared: dict[tuple[Any, ...], Primitive] | None = None, names: Mapping[str, str] | None = None,
          pool: Pool | None = None) -> Node:
    """The node tree of ``spec``; ``config``: canonical config values (bounds from the config); ``better``: role ->
    the bound metric's direction (``no_gain``). ``shared`` (with ``names``, role -> the canonical name bound): the
    primitives already built for this run, by kind, parameters and names read; an identical one is reused, so one
    series judged the same way by several checks is judged once per point. ``pool``: the windows of the primitives
    built at this record (:class:`~.windows.Pool`): a series' window is shared by the conditions that keep one."""
    if spec.parts:
        return Composite(spec, [build(p, config, better, shared, names, pool) for p in spec.parts])
    roles = sorted(spec.roles())
    key = None
    if shared is not None and names is not None and all(r in names for r in roles):
        key = (spec.kind, tuple(sorted((k, repr(v)) for k, v in spec.params.items() if k not in ("of", "to"))),
               tuple(names[r] for r in roles), tuple(better.get(r, "higher") for r in roles))
        found = shared.get(key)
        if found is not None:
            return found
    node = _primitive(spec, config, better, pool or Pool(), (names or {}).get(spec.params["of"]))
    if key is not None and shared is not None:
        shared[key] = node
    return node


def _primitive(spec: Spec, config: Mapping[str, Any], better: Mapping[str, str], pool: Pool,
               name: str | None) -> Primitive:
    """``name``: the canonical name the condition reads (None when not bound yet: its windows are its own)."""
    kind = spec.kind
    if kind in ("above", "below"):
        return Bound(spec, config)
    if kind == "spike":
        return Spike(spec, pool, name)
    if kind == "drop":
        return Drop(spec, pool, name)
    cls = {"sign": Sign, "collapse": Collapse, "rise": Rise, "ratio": Ratio, "nonfinite": NonFinite}.get(kind)
    if cls is not None:
        return cls(spec)
    if kind == "no_gain":
        return NoGain(spec, better.get(spec.params["of"], "higher"))
    if kind == "flat":
        return Flat(spec, better.get(spec.params["of"], "higher"), pool, name)
    raise ValueError(f"unknown condition {kind!r}")


def primitives(node: Node) -> list[Primitive]:
    """The primitive nodes of a tree, in order."""
    if isinstance(node, Composite):
        return [q for p in node.parts for q in primitives(p)]
    assert isinstance(node, Primitive)
    return [node]
