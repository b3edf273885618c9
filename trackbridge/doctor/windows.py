"""Bounded windows over a series, shared by the primitive conditions (:mod:`.primitives`): the last N values
sorted (median, MAD, maximum by ``bisect``), a series' own point noise, a rolling mean and a sliding best. Each
costs O(log N) or O(1) amortised per point plus a small list move; nothing rescans the run.

Primitives that read the same points of a series (built at the same record, each given every finite value from
then on) share its sorted windows and its noise (:class:`Pool`): each gives a shared window its own count of points
with the point (``at(i, value)``), and only the first to give a point moves the window, so a point enters each
window once however many conditions judge the series by it."""
from __future__ import annotations

import bisect
import math
from collections import deque

__all__ = ["MAD_SD", "Window", "Trailing", "Noise", "Rolling", "SlidingBest", "Pool"]

MAD_SD = 1.4826          # a normal distribution's standard deviation is 1.4826 x its median absolute deviation


def _kth_abs_dev(s: list[float], med: float, k: int) -> float:
    """The k-th smallest (0-based) of |x - med| over the sorted list ``s``. The distances below the median
    (``med - s[j-1], med - s[j-2] ...``) and those from it up (``s[j] - med ...``) are two ascending sequences; the
    k+1 smallest take ``a`` from the first and the rest from the second, and ``a`` is found by bisection (O(log k),
    each distance computed as a merge of the two would compute it, so the value is the same)."""
    j = bisect.bisect_left(s, med)
    m = k + 1                       # how many distances to take
    lo, hi = max(0, m - (len(s) - j)), min(m, j)
    while lo < hi:                  # the fewest taken from below such that the next one below is not smaller
        a = (lo + hi) // 2
        if med - s[j - 1 - a] < s[j + m - a - 1] - med:
            lo = a + 1
        else:
            hi = a
    below = med - s[j - lo] if lo > 0 else 0.0
    up = s[j + m - lo - 1] - med if m - lo > 0 else 0.0
    return below if below > up else up


class Window:
    """The last ``n`` values, in arrival order and sorted (for the median, the MAD and the maximum)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.order: deque[float] = deque()
        self.sorted: list[float] = []

    def __len__(self) -> int:
        return len(self.order)

    def add(self, v: float) -> float | None:
        """Add ``v``; returns the value that left the window, if one did."""
        self.order.append(v)
        bisect.insort(self.sorted, v)
        if len(self.order) > self.n:
            old = self.order.popleft()
            del self.sorted[bisect.bisect_left(self.sorted, old)]
            return old
        return None

    def median(self) -> float:
        """The lower median (of an even count, the lower middle value: with two points, the first level seen is
        not averaged with a spike)."""
        s = self.sorted
        return s[(len(s) - 1) // 2]

    def max(self) -> float:
        return self.sorted[-1]

    def mad(self, med: float) -> float:
        """The (lower) median absolute deviation from ``med``."""
        k = len(self.sorted)
        return _kth_abs_dev(self.sorted, med, (k - 1) // 2) if k else 0.0


class Trailing(Window):
    """The last ``n`` points before the current one: ``at(i, value)`` with the reader's i-th point, before the
    window is read (the point before it enters then, once per point however many readers share the window)."""

    def __init__(self, n: int) -> None:
        super().__init__(n)
        self.i = 0
        self.current = 0.0

    def at(self, i: int, v: float) -> None:
        if i != self.i:
            if self.i:
                self.add(self.current)
            self.i, self.current = i, v


class Noise:
    """A series' own point-to-point noise: the robust standard deviation of one point, from the last ``n``
    differences between consecutive points (1.4826 x their MAD / sqrt 2: a trend or one jump does not inflate it)."""

    def __init__(self, n: int = 50) -> None:
        self.diffs = Window(n)
        self.last: float | None = None
        self.i = 0

    def at(self, i: int, v: float) -> None:
        """The reader's i-th point ``v``: added once, however many readers share the noise."""
        if i != self.i:
            self.i = i
            self.add(v)

    def add(self, v: float) -> None:
        if self.last is not None:
            self.diffs.add(v - self.last)
        self.last = v

    def sd(self) -> float:
        if len(self.diffs) < 2:
            return 0.0
        med = self.diffs.median()
        return MAD_SD * self.diffs.mad(med) / math.sqrt(2.0)


class Rolling:
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


class SlidingBest:
    """The best (max or min) of the last ``n`` values: a monotonic deque (O(1) amortised per point)."""

    def __init__(self, n: int, higher: bool) -> None:
        self.n, self.higher = n, higher
        self.q: deque[tuple[int, float]] = deque()
        self.i = 0

    def add(self, v: float) -> None:
        q, hi = self.q, self.higher
        while q and (q[-1][1] <= v if hi else q[-1][1] >= v):
            q.pop()
        q.append((self.i, v))
        self.i += 1
        if q[0][0] <= self.i - 1 - self.n:
            q.popleft()

    def best(self) -> float:
        return self.q[0][1]


class Pool:
    """The windows and noise of the series of primitives built at one record (:mod:`.conditions`' ``build``): one
    per series name and size. ``name=None`` (a series not bound yet): a window of the primitive's own."""

    def __init__(self) -> None:
        self._made: dict[tuple[str, str, int], Trailing | Noise] = {}

    def trailing(self, name: str | None, n: int) -> Trailing:
        if name is None:
            return Trailing(n)
        w = self._made.setdefault(("trailing", name, n), Trailing(n))
        assert isinstance(w, Trailing)
        return w

    def noise(self, name: str | None) -> Noise:
        if name is None:
            return Noise()
        w = self._made.setdefault(("noise", name, 0), Noise())
        assert isinstance(w, Noise)
        return w
