"""The primitive conditions (see :mod:`.conditions` for the table): each reads one series (``ratio``: two logged in
the same record) point by point, with a fixed amount of state (a window of the last points, a few running
numbers)."""
from __future__ import annotations

import bisect
import math
from collections import deque
from typing import Any, Mapping

from .nodes import Node, Spec

__all__ = ["Primitive", "Bound", "Sign", "Spike", "Collapse", "Drop", "Rise", "NoGain", "Ratio", "NonFinite"]


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
