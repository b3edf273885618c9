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
              at least ``factor`` x the baseline (the median, or the maximum with ``baseline: max``) and/or at least
              ``mads`` robust standard deviations (1.4826 x the median absolute deviation) above the median; always
              by at least ``floor``
``collapse``  the value is below ``to`` x its early level (the mean of ``early`` points after ``skip``), for
              ``for`` points (a positive quantity: entropy, length)
``drop``      the mean of the last ``window`` points is below its running peak by more than ``by`` x the peak
              (and by at least ``min``), for ``for`` points
``rise``      the mean of the last ``window`` points is above the early level (the first such mean) by more than
              ``by`` x that level (and by at least ``min``), for ``for`` points
``no_gain``   the last ``window`` points are no better than the best point before them (by more than ``by``); the
              direction is canonical.yaml's ``better:`` of the metric
``ratio``     ``of / to``, logged in the same record, is above (or below) a bound for ``for`` points
``nonfinite`` the value is NaN or infinite (every other condition skips such points)
============  ==================================================================================================

Composite conditions: ``all`` (every part holds at its latest point, or, with ``within: N``, held at a step at
most N steps back and one of them holds now), ``any`` (at least one part holds at its latest point), ``then`` (the
second part holds now, in a stretch that began at most ``within`` steps after the first part held: the first came
first; it holds as long as that stretch lasts).

Each node has, after every record: ``fresh`` (it got a point in this record), ``holds`` (at its latest point),
``last_true`` (the step it last held at), ``since`` (the step the current stretch of holding began at: a
sustained condition's first point, the spike's step for ``then``) and ``detail`` (the numbers behind it, for the
finding's text).
"""
from __future__ import annotations

import bisect
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Mapping

__all__ = ["Spec", "Node", "build", "PRIMITIVES", "COMPOSITES", "describe"]

PRIMITIVES = ("above", "below", "sign", "spike", "collapse", "drop", "rise", "no_gain", "ratio", "nonfinite")
COMPOSITES = ("all", "any", "then")


@dataclass
class Spec:
    """A parsed condition: its kind, its parameters (as written) and, for all/any/then, its parts."""

    kind: str
    params: dict[str, Any]
    parts: list["Spec"] = field(default_factory=list)
    line: int = 0

    def roles(self) -> set[str]:
        if self.parts:
            return set().union(*(p.roles() for p in self.parts))
        return {self.params[k] for k in ("of", "to") if k in self.params and (k == "of" or self.kind == "ratio")}

    def config_names(self) -> set[str]:
        if self.parts:
            return set().union(*(p.config_names() for p in self.parts))
        return {self.params["config"]} if "config" in self.params else set()

    def text(self) -> str:
        """The condition in one line, as written (for docs and ``--json``)."""
        if self.parts:
            inner = f" {self.kind} ".join(f"({p.text()})" for p in self.parts) if self.kind != "then" else \
                " then ".join(f"({p.text()})" for p in self.parts)
            w = self.params.get("within")
            return inner + (f" within {w} steps" if w is not None else "")
        args = ", ".join(f"{k}={v}" for k, v in self.params.items() if k != "of")
        return f"{self.kind}({self.params['of']}{', ' + args if args else ''})"


# ---------------------------------------------------------------------------------------------------- nodes
class Node:
    """A condition being evaluated (see the module docstring for the state every node keeps)."""

    kind = ""

    def __init__(self) -> None:
        self.fresh = False
        self.holds = False
        self.last_true: float | None = None
        self.since: float | None = None
        self.detail: dict[str, Any] | None = None
        self.applicable = True

    def roles(self) -> set[str]:
        raise NotImplementedError

    def start_record(self) -> None:
        self.fresh = False

    def update(self, step: float) -> None:
        """Composites: judge the record just fed (primitives are judged as their points arrive)."""

    def active(self, step: float, within: int | None) -> bool:
        if within is None:
            return self.holds
        return self.last_true is not None and step - within <= self.last_true <= step


class Primitive(Node):
    """A condition on one series; ``point()`` is called with each finite value (``nonfinite`` gets them all)."""

    def __init__(self, spec: Spec) -> None:
        super().__init__()
        self.kind = spec.kind
        self.p = spec.params
        self.role: str = spec.params["of"]
        self.need = int(spec.params.get("for", 1))
        self._run = 0
        self._run_start: float | None = None
        self._run_detail: dict[str, Any] | None = None

    def roles(self) -> set[str]:
        return {self.role}

    def point(self, step: float, value: float) -> None:
        ok, detail = self.test(step, value)
        self.fresh = True
        if ok:
            if self._run == 0:
                self._run_start = step
                self._run_detail = None
            self._run += 1
            detail = dict(detail or {}, at=step)
            if self._run_detail is None or detail.get("score", 0) > self._run_detail.get("score", 0):
                self._run_detail = detail         # the most extreme point of the stretch (the first of equals)
        else:
            self._run = 0
        self.holds = self._run >= self.need
        if self.holds:
            self.last_true = step
            self.since = self._run_start
            self.detail = dict(self._run_detail or {}, points=self._run, since_step=self._run_start, last_step=step)

    def test(self, step: float, value: float) -> tuple[bool, dict[str, Any] | None]:
        raise NotImplementedError


class Bound(Primitive):
    """``above`` / ``below``: a fixed bound, or ``times`` x a run config value."""

    def __init__(self, spec: Spec, config: Mapping[str, Any]) -> None:
        super().__init__(spec)
        self.up = spec.kind == "above"
        self.abs = bool(spec.params.get("abs", False))
        self.ignore_zero = bool(spec.params.get("ignore_zero", False))
        self.bound: float | None = None
        if "config" in spec.params:
            v = config.get(spec.params["config"])
            if isinstance(v, str):
                try:
                    v = float(v)
                except ValueError:
                    v = None
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0:
                self.bound = float(v) * float(spec.params.get("times", 1.0))
            else:
                self.applicable = False         # the run config does not say: the check cannot be judged
        else:
            self.bound = float(spec.params["value"])

    def point(self, step: float, value: float) -> None:
        if self.ignore_zero and value == 0:
            return                  # not a point: a value logged as exactly 0 is not measured (a KL with beta 0)
        super().point(step, value)

    def test(self, step: float, value: float) -> tuple[bool, dict[str, Any] | None]:
        assert self.bound is not None
        v = abs(value) if self.abs else value
        ok = v > self.bound if self.up else v < self.bound
        score = v if self.up else -v
        return ok, {"value": value, "bound": self.bound, "score": score} if ok else None


class Sign(Primitive):
    def __init__(self, spec: Spec) -> None:
        super().__init__(spec)
        self.negative = spec.params["is"] == "negative"
        self.tol = float(spec.params.get("tolerance", 0.0))

    def test(self, step: float, value: float) -> tuple[bool, dict[str, Any] | None]:
        ok = value < -self.tol if self.negative else value > self.tol
        return ok, {"value": value, "score": -value if self.negative else value} if ok else None


class _Window:
    """The last ``n`` values, in arrival order and sorted (for the median and the maximum)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.order: deque[float] = deque()
        self.sorted: list[float] = []

    def __len__(self) -> int:
        return len(self.order)

    def add(self, v: float) -> None:
        self.order.append(v)
        bisect.insort(self.sorted, v)
        if len(self.order) > self.n:
            old = self.order.popleft()
            del self.sorted[bisect.bisect_left(self.sorted, old)]

    def median(self) -> float:
        s, k = self.sorted, len(self.sorted)
        return s[k // 2] if k % 2 else (s[k // 2 - 1] + s[k // 2]) / 2

    def max(self) -> float:
        return self.sorted[-1]

    def mad(self, med: float) -> float:
        dev = sorted(abs(x - med) for x in self.order)
        k = len(dev)
        return dev[k // 2] if k % 2 else (dev[k // 2 - 1] + dev[k // 2]) / 2


class Spike(Primitive):
    def __init__(self, spec: Spec) -> None:
        super().__init__(spec)
        self.factor = spec.params.get("factor")
        self.mads = spec.params.get("mads")
        self.use_max = spec.params.get("baseline", "median") == "max"
        self.floor = float(spec.params.get("floor", 0.0))
        self.min_points = int(spec.params.get("min_points", 5))
        self.window = _Window(int(spec.params.get("window", 20)))

    def test(self, step: float, value: float) -> tuple[bool, dict[str, Any] | None]:
        w = self.window
        ok, detail = False, None
        if len(w) >= self.min_points:
            med = w.median()
            base = w.max() if self.use_max else med
            ok = value - base > self.floor
            score = 0.0
            if ok and self.factor is not None:
                ok = base > 0 and value >= self.factor * base
                score = value / base if base > 0 else 0.0
            if ok and self.mads is not None:
                spread = 1.4826 * w.mad(med)
                spread = max(spread, 1e-9 * max(abs(med), 1.0))
                ok = value - med >= self.mads * spread
                score = score or (value - med) / spread
            if ok:
                detail = {"value": value, "baseline": base, "baseline_kind": "max" if self.use_max else "median",
                          "window": len(w), "score": score}
                if self.factor is not None and base > 0:
                    detail["ratio"] = value / base
        w.add(value)
        return ok, detail


class Collapse(Primitive):
    def __init__(self, spec: Spec) -> None:
        super().__init__(spec)
        self.to = float(spec.params["to"])
        self.early_n = int(spec.params.get("early", 5))
        self.skip = int(spec.params.get("skip", 0))
        self.seen = 0
        self.early_sum = 0.0
        self.early: float | None = None

    def test(self, step: float, value: float) -> tuple[bool, dict[str, Any] | None]:
        self.seen += 1
        if self.early is None:
            if self.seen > self.skip:
                self.early_sum += value
                if self.seen == self.skip + self.early_n:
                    self.early = self.early_sum / self.early_n
            return False, None
        if self.early <= 0:
            return False, None
        ok = value < self.to * self.early
        return ok, {"value": value, "early": self.early, "fraction": value / self.early,
                    "score": -value / self.early} if ok else None


class _Rolling:
    def __init__(self, n: int) -> None:
        self.vals: deque[float] = deque(maxlen=n)
        self.total = 0.0

    def add(self, v: float) -> float | None:
        if len(self.vals) == self.vals.maxlen:
            self.total -= self.vals[0]
        self.vals.append(v)
        self.total += v
        if len(self.vals) < (self.vals.maxlen or 1):
            return None
        return math.fsum(self.vals) / len(self.vals)


class Drop(Primitive):
    def __init__(self, spec: Spec) -> None:
        super().__init__(spec)
        self.by = float(spec.params["by"])
        self.min = float(spec.params.get("min", 0.0))
        self.win = int(spec.params.get("window", 5))
        self.roll = _Rolling(self.win)
        self.peak: float | None = None
        self.peak_at: float | None = None

    def test(self, step: float, value: float) -> tuple[bool, dict[str, Any] | None]:
        m = self.roll.add(value)
        if m is None:
            return False, None
        if self.peak is None or m > self.peak:
            self.peak, self.peak_at = m, step
            return False, None
        fall = self.peak - m
        ok = fall > self.by * abs(self.peak) and fall >= self.min and fall > 0
        return ok, {"value": value, "mean": m, "peak": self.peak, "peak_at": self.peak_at, "window": self.win,
                    "score": fall} if ok else None


class Rise(Primitive):
    def __init__(self, spec: Spec) -> None:
        super().__init__(spec)
        self.by = float(spec.params["by"])
        self.min = float(spec.params.get("min", 0.0))
        self.win = int(spec.params.get("window", 5))
        self.early_n = int(spec.params.get("early", 1))
        self.roll = _Rolling(self.win)
        self.early_means: list[float] = []
        self.early: float | None = None

    def test(self, step: float, value: float) -> tuple[bool, dict[str, Any] | None]:
        m = self.roll.add(value)
        if m is None:
            return False, None
        if self.early is None:
            self.early_means.append(m)
            if len(self.early_means) >= self.early_n:
                self.early = self.early_means[0]
            return False, None
        gain = m - self.early
        ok = gain > self.by * abs(self.early) and gain >= self.min and gain > 0
        return ok, {"value": value, "mean": m, "early": self.early, "window": self.win, "score": gain} if ok \
            else None


class NoGain(Primitive):
    def __init__(self, spec: Spec, better: str) -> None:
        super().__init__(spec)
        self.sign = 1.0 if better == "higher" else -1.0
        self.win = int(spec.params.get("window", 3))
        self.by = float(spec.params.get("by", 0.0))
        self.recent: deque[tuple[float, float]] = deque(maxlen=self.win)
        self.best_before: float | None = None       # best (signed) value before the recent window
        self.first: float | None = None

    def test(self, step: float, value: float) -> tuple[bool, dict[str, Any] | None]:
        if self.first is None:
            self.first = value
        if len(self.recent) == self.win:
            old = self.recent[0][1]
            self.best_before = old if self.best_before is None else (
                max(self.best_before, old) if self.sign > 0 else min(self.best_before, old))
        self.recent.append((step, value))
        if self.best_before is None:
            return False, None
        best_recent = max(v for _, v in self.recent) if self.sign > 0 else min(v for _, v in self.recent)
        gain = (best_recent - self.best_before) * self.sign
        ok = gain <= self.by
        return ok, {"value": value, "best_before": self.best_before, "best_recent": best_recent,
                    "first": self.first, "window": self.win,
                    "direction": "higher" if self.sign > 0 else "lower", "score": -gain} if ok else None


class Ratio(Primitive):
    def __init__(self, spec: Spec) -> None:
        super().__init__(spec)
        self.other: str = spec.params["to"]
        self.up = "above" in spec.params
        self.bound = float(spec.params["above" if self.up else "below"])

    def roles(self) -> set[str]:
        return {self.role, self.other}

    def test(self, step: float, value: float) -> tuple[bool, dict[str, Any] | None]:
        ok = value > self.bound if self.up else value < self.bound
        return ok, {"value": value, "bound": self.bound, "score": value if self.up else -value} if ok else None


class NonFinite(Primitive):
    def test(self, step: float, value: float) -> tuple[bool, dict[str, Any] | None]:
        ok = not math.isfinite(value)
        return ok, {"value": value, "score": 1.0} if ok else None


class Composite(Node):
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
        for p in self.parts:
            p.update(step)
        self.fresh = any(p.fresh for p in self.parts)
        if not self.fresh:
            return
        if self.kind == "then":
            # the second condition's current stretch began at most `within` steps after the first held (at or
            # before that beginning): the cause came first; it holds as long as that stretch lasts
            first, second = self.parts
            if first.fresh and first.holds:
                self._events.append(step)
            ok, since = False, None
            if second.fresh and second.holds:
                start = second.since if second.since is not None else step
                causes = [e for e in self._events if start - (self.within or 0) <= e <= start]
                if causes:
                    ok, since = True, causes[-1]
        elif self.kind == "all":
            # with `within`, the parts meet at the record where the last of them holds (not at the records after it,
            # while the earlier ones are still in the window)
            ok = all(p.active(step, self.within) for p in self.parts) and (
                self.within is None or any(p.fresh and p.holds for p in self.parts))
            since = max((p.since if p.since is not None else step) for p in self.parts) if ok else None
        else:
            held = [p for p in self.parts if p.holds]
            ok = bool(held)
            since = min((p.since if p.since is not None else step) for p in held) if ok else None
        self.holds = ok
        if ok:
            self.last_true = step
            self.since = since
            self.detail = {"parts": [dict(p.detail or {}) if p.last_true is not None else {} for p in self.parts]}


def build(spec: Spec, config: Mapping[str, Any], better: Mapping[str, str]) -> Node:
    """The node tree of ``spec``; ``config``: canonical config values (bounds from the config); ``better``: role ->
    the bound metric's direction (``no_gain``)."""
    if spec.parts:
        return Composite(spec, [build(p, config, better) for p in spec.parts])
    kind = spec.kind
    if kind in ("above", "below"):
        return Bound(spec, config)
    cls = {"sign": Sign, "spike": Spike, "collapse": Collapse, "drop": Drop, "rise": Rise, "ratio": Ratio,
           "nonfinite": NonFinite}.get(kind)
    if cls is not None:
        return cls(spec)
    if kind == "no_gain":
        return NoGain(spec, better.get(spec.params["of"], "higher"))
    raise ValueError(f"unknown condition {kind!r}")


def primitives(node: Node) -> list[Primitive]:
    """The primitive nodes of a tree, in order."""
    if isinstance(node, Composite):
        return [q for p in node.parts for q in primitives(p)]
    assert isinstance(node, Primitive)
    return [node]


# ---------------------------------------------------------------------------------------------------- words
def fmt(v: Any) -> str:
    """A number as a finding shows it: 4 significant digits, no trailing zeros."""
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return str(v)
    if not math.isfinite(v):
        return "nan" if v != v else ("inf" if v > 0 else "-inf")
    if v == int(v) and abs(v) < 1e15:
        return str(int(v))
    return f"{v:.4g}"


def step_text(s: Any) -> str:
    return fmt(s) if s is not None else "?"


def describe(node: Node, names: Mapping[str, str], detail: Mapping[str, Any] | None) -> str:
    """What a node's detail says, in words, with the series' canonical names (``names``: role -> name)."""
    if detail is None:
        return ""
    if isinstance(node, Composite):
        parts = detail.get("parts") or []
        texts = [describe(p, names, d) for p, d in zip(node.parts, parts) if d]
        joint = "; then " if node.kind == "then" else "; "
        return joint.join(t for t in texts if t)
    assert isinstance(node, Primitive)
    name = names.get(node.role, node.role)
    d = detail
    at = f" at step {step_text(d.get('at'))}" if d.get("at") is not None else ""
    n = int(d.get("points", 1))
    span = f" for {n} points" if n > 1 else ""
    k = node.kind
    if k in ("above", "below"):
        what = f"|{name}|" if getattr(node, "abs", False) else name
        extreme = ("highest" if k == "above" else "lowest") if n > 1 else "value"
        return f"{what} {k} {fmt(d['bound'])}{span} ({extreme} {fmt(d['value'])}{at})"
    if k == "sign":
        word = "negative" if getattr(node, "negative", True) else "positive"
        extreme = ("most negative" if word == "negative" else "highest") if n > 1 else "value"
        return f"{name} {word}{span} ({extreme} {fmt(d['value'])}{at})"
    if k == "spike":
        ratio = f", {fmt(d['ratio'])}x" if "ratio" in d else ""
        return (f"{name} = {fmt(d['value'])}{at}{ratio} the {d.get('baseline_kind', 'median')} "
                f"{fmt(d['baseline'])} of the {d.get('window')} points before")
    if k == "collapse":
        return (f"{name} fell to {fmt(d['value'])}{at}, {fmt(100 * d['fraction'])}% of its early level "
                f"{fmt(d['early'])}" + (f" (below {fmt(100 * getattr(node, 'to', 0))}%{span})" if n > 1 else ""))
    if k == "drop":
        return (f"{name} fell to {fmt(d['mean'])} (mean of {d['window']} points{at}) from its peak "
                f"{fmt(d['peak'])} (step {step_text(d.get('peak_at'))})")
    if k == "rise":
        return f"{name} rose to {fmt(d['mean'])} (mean of {d['window']} points{at}) from {fmt(d['early'])}"
    if k == "no_gain":
        return (f"{name}: the best of its last {d['window']} points, {fmt(d['best_recent'])}{at}, is no better "
                f"than {fmt(d['best_before'])} before them ({d['direction']} is better)")
    if k == "ratio":
        other = names.get(getattr(node, "other", ""), "")
        rel = "above" if getattr(node, "up", True) else "below"
        extreme = ("highest" if rel == "above" else "lowest") if n > 1 else "value"
        return f"{name} / {other} {rel} {fmt(d['bound'])}{span} ({extreme} {fmt(d['value'])}{at})"
    if k == "nonfinite":
        return f"{name} = {fmt(d['value'])}{at}"
    return f"{name}: {d}"
