"""The primitive conditions (see :mod:`.conditions` for the table): each reads one series (``ratio``: two logged in
the same record) point by point, with a fixed amount of state (a window of the last points, a few running
numbers): no point is judged by rescanning the run, and a window's median, MAD and maximum come from its sorted
copy (``bisect``), so a point costs O(log window) plus the window's small list moves."""
from __future__ import annotations

import bisect
import math
from collections import deque
from typing import Any, Mapping

from .nodes import Node, Spec
from .windows import MAD_SD, Pool, Rolling, SlidingBest, Window

__all__ = ["Primitive", "Bound", "Sign", "Spike", "Collapse", "Drop", "Rise", "NoGain", "Flat", "Ratio",
           "NonFinite"]

class Primitive(Node):
    """A condition on one series; ``point()`` is called with each finite value (``nonfinite`` gets them all). A
    point at which it holds, or at which it stops holding, is told to the engine (``hot``): only then, or while a
    check is in a stretch, can the checks reading it say something else than at their last point."""

    def __init__(self, spec: Spec) -> None:
        super().__init__()
        self.kind = spec.kind
        self.p = spec.params
        self.role: str = spec.params["of"]
        self.need = int(spec.params.get("for", 1))
        self._run = 0
        self._run_start: float | None = None
        self._run_detail: dict[str, Any] | None = None
        self.hot: list[Primitive] | None = None     # the engine's: the primitives whose point changed something

    def roles(self) -> set[str]:
        return {self.role}

    def point(self, step: float, value: float) -> None:
        ok, detail = self.test(step, value)
        self.fresh = True
        if not ok:
            self._run = 0
            if self.holds:
                self._stopped()
            return
        self._held(step, detail)

    def _stopped(self) -> None:
        """It held at its last point and does not at this one."""
        self.holds = False
        if self.hot is not None:
            self.hot.append(self)

    def _held(self, step: float, detail: dict[str, Any] | None) -> None:
        if self._run == 0:
            self._run_start = step
            self._run_detail = None
        self._run += 1
        if detail is None:
            detail = {"at": step}
        else:
            detail["at"] = step               # every caller gives a dict of its own, made for this point
        if self._run_detail is None or detail.get("score", 0) > self._run_detail.get("score", 0):
            self._run_detail = detail         # the most extreme point of the stretch (the first of equals)
        self.holds = self._run >= self.need
        if self.holds:
            self.last_true = step
            self.since = self._run_start
            self.detail = dict(self._run_detail or {}, points=self._run, since_step=self._run_start, last_step=step)
            if self.hot is not None:
                self.hot.append(self)

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
        v = -value if self.abs and value < 0 else value
        self.fresh = True
        if (v > self.bound) if self.up else (v < self.bound):       # type: ignore[operator]
            self._held(step, {"value": value, "bound": self.bound, "score": v if self.up else -v})
        else:
            self._run = 0
            if self.holds:
                self._stopped()

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


class Spike(Primitive):
    """``spike``: the value jumps above a robust baseline of the points before it. Every point enters the window
    (a spike is one point of ``window``: it does not move the median, so a second spike after the first is judged
    against the usual level, not against the first spike); ``over_usual`` compares with the 95th percentile of the
    *usual* points (those that were no spike) of the last 5 x window, so a series alternating between two usual
    levels is no spike."""

    def __init__(self, spec: Spec, pool: Pool | None = None, name: str | None = None) -> None:
        super().__init__(spec)
        self.factor = spec.params.get("factor")
        self.mads = spec.params.get("mads")
        self.use_max = spec.params.get("baseline", "median") == "max"
        self.floor = float(spec.params.get("floor", 0.0))
        self.at_least = spec.params.get("at_least")
        self.over_usual = spec.params.get("over_usual")
        self.over_last = spec.params.get("over_last")
        self.last: float | None = None
        self.min_points = int(spec.params.get("min_points", 5))
        self.window = (pool or Pool()).trailing(name, int(spec.params.get("window", 20)))   # the points before
        self.n = 0
        # the usual points (those that were no spike) of a longer window, 5 x `window`, and their 95th percentile:
        # a level the series returns to now and then (GRPO steps whose groups all have equal rewards alternate
        # with the others) is usual, one earlier spike or two are not
        self.usual: Window | None = Window(5 * self.window.n) if self.over_usual is not None else None
        self._flags: deque[tuple[float, bool]] = deque()

    def test(self, step: float, value: float) -> tuple[bool, dict[str, Any] | None]:
        w = self.window
        self.n += 1
        w.at(self.n, value)
        ok, detail = False, None
        s = w.sorted
        if len(s) >= self.min_points and (self.at_least is None or value >= self.at_least):
            med = s[(len(s) - 1) // 2]                  # the lower median (Window.median)
            base = s[-1] if self.use_max else med
            ok = value - base > self.floor and value > med
            score = 0.0
            if ok and self.factor is not None:
                # a baseline at or below 0 (a KL of 0 at the first step) has no ratio: the absolute floor decides
                ok = value >= self.factor * base if base > 0 else self.at_least is not None
                score = value / base if base > 0 else value
            if ok and self.over_last is not None and self.last is not None and self.last > 0:
                ok = value >= self.over_last * self.last      # a jump from the point before, not a ramp
            if ok and self.usual is not None:
                usual = self.usual.sorted
                high = usual[math.ceil(0.95 * (len(usual) - 1))] if usual else 0.0
                ok = value >= float(self.over_usual or 0.0) * high
            if ok and self.mads is not None:
                spread = MAD_SD * w.mad(med)
                spread = max(spread, 1e-9 * max(abs(med), 1.0))
                ok = value - med >= self.mads * spread
                score = score or (value - med) / spread
            if ok:
                detail = {"value": value, "baseline": base, "baseline_kind": "max" if self.use_max else "median",
                          "window": len(w.sorted), "score": score}
                if self.factor is not None and base > 0:
                    detail["ratio"] = value / base
        self.last = value
        u = self.usual
        if u is not None:
            # the usual points among the last 5 x window points (a spike is not usual)
            self._flags.append((value, ok))
            if not ok:
                u.order.append(value)
                bisect.insort(u.sorted, value)
            if len(self._flags) > u.n:
                old, was_spike = self._flags.popleft()
                if not was_spike:
                    u.order.popleft()
                    del u.sorted[bisect.bisect_left(u.sorted, old)]
        return ok, detail


class Collapse(Primitive):
    """``collapse``: below ``to`` x a reference level. ``reference: early`` (default): the mean of the first
    ``early`` points after ``skip``; ``reference: peak``: the highest median of ``early`` consecutive points so far
    (a level held for a few points, not one outlier; a collapse in the first points is measured from the level
    before it, not from an early mean that already contains it), with ``within: N`` of the last N points only (a
    fast fall, not a slow decline over the run), held against that level for as long as the collapse lasts."""

    def __init__(self, spec: Spec) -> None:
        super().__init__(spec)
        self.to = float(spec.params["to"])
        self.early_n = int(spec.params.get("early", 5))
        self.skip = int(spec.params.get("skip", 0))
        self.peak_mode = spec.params.get("reference", "early") == "peak"
        self.within = spec.params.get("within")
        self.seen = 0
        self.early_sum = 0.0
        self.early: float | None = None
        self.recent: deque[float] = deque(maxlen=self.early_n)
        self.peaks = SlidingBest(int(self.within), True) if self.within is not None else None
        self.frozen: float | None = None

    def test(self, step: float, value: float) -> tuple[bool, dict[str, Any] | None]:
        self.seen += 1
        if self.peak_mode:
            self.recent.append(value)
            if len(self.recent) == self.early_n:
                med = sorted(self.recent)[(self.early_n - 1) // 2]
                if self.peaks is not None:
                    self.peaks.add(med)
                    self.early = self.peaks.best()      # the highest level of the last `within` points
                elif self.early is None or med > self.early:
                    self.early = med
            if self.early is None:
                return False, None
            if self.peaks is not None:
                if self._run > 0 and self.frozen is not None:
                    ref = self.frozen                   # a collapse goes on against the level it fell from
                else:
                    ref = self.frozen = self.early
                if ref <= 0:
                    return False, None
                ok = value < self.to * ref
                return ok, {"value": value, "early": ref, "fraction": value / ref, "reference": "peak",
                            "score": -value / ref} if ok else None
        elif self.early is None:
            if self.seen > self.skip:
                self.early_sum += value
                if self.seen == self.skip + self.early_n:
                    self.early = self.early_sum / self.early_n
            return False, None
        if self.early <= 0:
            return False, None
        ok = value < self.to * self.early
        return ok, {"value": value, "early": self.early, "fraction": value / self.early,
                    "reference": "peak" if self.peak_mode else "early", "score": -value / self.early} if ok else None


class Drop(Primitive):
    """``drop``: the rolling mean falls from its running peak. ``noise: K``: the fall must also exceed K standard
    errors of that mean (the series' own point noise / sqrt(window)); ``after_rise: true``: the peak must first
    have risen above the first rolling mean by as much (a series that never rose has not collapsed: noise around
    a flat level is not a drop)."""

    def __init__(self, spec: Spec, pool: Pool | None = None, name: str | None = None) -> None:
        super().__init__(spec)
        self.by = float(spec.params["by"])
        self.min = float(spec.params.get("min", 0.0))
        self.win = int(spec.params.get("window", 5))
        self.k = spec.params.get("noise")
        self.after_rise = bool(spec.params.get("after_rise", False))
        self.roll = Rolling(self.win)
        self.noise = (pool or Pool()).noise(name) if self.k is not None or self.after_rise else None
        self.n = 0
        self.first: float | None = None
        self.peak: float | None = None
        self.peak_at: float | None = None

    def test(self, step: float, value: float) -> tuple[bool, dict[str, Any] | None]:
        self.n += 1
        if self.noise is not None:
            self.noise.at(self.n, value)
        m = self.roll.add(value)
        if m is None:
            return False, None
        if self.first is None:
            self.first = m
        if self.peak is None or m > self.peak:
            self.peak, self.peak_at = m, step
            return False, None
        fall = self.peak - m
        ok = fall > self.by * abs(self.peak) and fall >= self.min and fall > 0
        if ok and self.noise is not None:
            se = self.noise.sd() / math.sqrt(self.win)
            k = float(self.k if self.k is not None else 3.0)
            ok = fall > k * se and (not self.after_rise or self.peak - self.first > k * se)
        return ok, {"value": value, "mean": m, "peak": self.peak, "peak_at": self.peak_at, "window": self.win,
                    "score": fall} if ok else None


class Rise(Primitive):
    def __init__(self, spec: Spec) -> None:
        super().__init__(spec)
        self.by = float(spec.params["by"])
        self.min = float(spec.params.get("min", 0.0))
        self.win = int(spec.params.get("window", 5))
        self.early_n = int(spec.params.get("early", 1))
        self.roll = Rolling(self.win)
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
    """``no_gain``: the best of the last ``window`` points is no better than the best before them (by more than
    ``by``); ``worse_by: F``: it is worse than that best by more than F x its size (the series got worse)."""

    def __init__(self, spec: Spec, better: str) -> None:
        super().__init__(spec)
        self.sign = 1.0 if better == "higher" else -1.0
        self.win = int(spec.params.get("window", 3))
        self.by = float(spec.params.get("by", 0.0))
        self.worse_by = spec.params.get("worse_by")
        self.recent: deque[tuple[float, float]] = deque(maxlen=self.win)
        self.best_recent = SlidingBest(self.win, self.sign > 0)
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
        self.best_recent.add(value)
        if self.best_before is None:
            return False, None
        best_recent = self.best_recent.best()
        gain = (best_recent - self.best_before) * self.sign
        ok = gain <= self.by if self.worse_by is None else -gain > self.worse_by * abs(self.best_before)
        return ok, {"value": value, "best_before": self.best_before, "best_recent": best_recent,
                    "first": self.first, "window": self.win,
                    "direction": "higher" if self.sign > 0 else "lower", "score": -gain} if ok else None


class Flat(Primitive):
    """``flat``: after at least ``2 x window`` points, the mean of the last ``window`` points is no better (in the
    metric's direction) than the mean of the first ``window`` by more than ``sigmas`` standard errors of that
    difference (the series' own point noise x sqrt(2 / window)) and ``min``, and no rolling mean so far was better
    by more than twice that: it has not improved (one that rose and fell back collapsed). ``headroom: F``:
    not when that first mean is within F x the best point seen (a series that starts at its best, a reward at its
    maximum, has no room to improve)."""

    def __init__(self, spec: Spec, better: str, pool: Pool | None = None, name: str | None = None) -> None:
        super().__init__(spec)
        self.sign = 1.0 if better == "higher" else -1.0
        self.win = int(spec.params.get("window", 20))
        self.sigmas = float(spec.params.get("sigmas", 2.0))
        self.min = float(spec.params.get("min", 0.0))
        self.headroom = spec.params.get("headroom")
        self.roll = Rolling(self.win)
        self.noise = (pool or Pool()).noise(name)
        self.n = 0
        self.first: float | None = None
        self.best: float | None = None
        self.top: float | None = None           # the best rolling mean so far (signed)

    def test(self, step: float, value: float) -> tuple[bool, dict[str, Any] | None]:
        self.n += 1
        self.noise.at(self.n, value)
        signed = value * self.sign
        if self.best is None or signed > self.best:
            self.best = signed
        m = self.roll.add(value)
        if m is None:
            return False, None
        if self.first is None:
            self.first = m
        signed_m = m * self.sign
        if self.top is None or signed_m > self.top:
            self.top = signed_m
        if self.n < 2 * self.win:
            return False, None
        gain = (m - self.first) * self.sign
        margin = max(self.min, self.sigmas * self.noise.sd() * math.sqrt(2.0 / self.win))
        # no better now, and never clearly better (a series that rose and fell back is a collapse, not flat)
        ok = gain <= margin and self.top - self.first * self.sign <= 2 * margin
        if ok and self.headroom is not None and self.best is not None:
            # the series started within `headroom` of the best point it reached: no room to improve is shown
            ok = self.first * self.sign < self.best - self.headroom * abs(self.best)
        return ok, {"value": value, "mean": m, "first": self.first, "window": self.win, "margin": margin,
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
    def point(self, step: float, value: float) -> None:
        self.fresh = True
        if value - value == 0:      # finite (NaN and infinities give NaN): the common case, no stretch
            self._run = 0
            if self.holds:
                self._stopped()
        else:
            self._held(step, {"value": value, "score": 1.0})

    def test(self, step: float, value: float) -> tuple[bool, dict[str, Any] | None]:
        ok = not math.isfinite(value)
        return ok, {"value": value, "score": 1.0} if ok else None
