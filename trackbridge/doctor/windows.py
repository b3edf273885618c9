"""Bounded windows over a series, shared by the primitive conditions (:mod:`.primitives`): the last N values
sorted (median, MAD, maximum by ``bisect``), a series' own point noise, a rolling mean and a sliding best. Each
costs O(log N) or O(1) amortised per point plus a small list move; nothing rescans the run."""
from __future__ import annotations

import bisect
import math
from collections import deque

__all__ = ["MAD_SD", "Window", "Noise", "Rolling", "SlidingBest"]

MAD_SD = 1.4826          # a normal distribution's standard deviation is 1.4826 x its median absolute deviation


def _kth_abs_dev(s: list[float], med: float, k: int) -> float:
    """The k-th smallest (0-based) of |x - med| over the sorted list ``s``: a merge of the two sides of the median
    walked k steps (O(k), no sorting)."""
    j = bisect.bisect_left(s, med)
    i = j - 1                       # left side, walked down (distances grow)
    d = 0.0
    for _ in range(k + 1):
        if i >= 0 and (j >= len(s) or med - s[i] <= s[j] - med):
            d = med - s[i]
            i -= 1
        else:
            d = s[j] - med
            j += 1
    return d


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


class Noise:
    """A series' own point-to-point noise: the robust standard deviation of one point, from the last ``n``
    differences between consecutive points (1.4826 x their MAD / sqrt 2: a trend or one jump does not inflate it)."""

    def __init__(self, n: int = 50) -> None:
        self.diffs = Window(n)
        self.last: float | None = None

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
