"""One rate limit for a destination: write requests per second and points per second, shared by every worker that
writes there (the threads of ``migrate --jobs``, or, through one Ray actor, every task of ``migrate --engine ray``:
:mod:`.bulk`).

The limiter hands out *reservations*: :meth:`RateLimiter.reserve` books the cost now and answers how long the caller
must wait before sending it, so it never blocks (a Ray actor serving many tasks stays responsive) and the callers
sleep in their own processes. Each limit is a token bucket written as a theoretical arrival time (GCRA): a cost of
``c`` at rate ``r`` advances the time by ``c / r``; up to ``burst`` seconds' worth may go at once after a quiet spell.
What counts as one request is one ``write`` of a batch to the destination (plus one to open a run); a tracker client
that splits a batch into several HTTP requests (MLflow's ``log_batch`` takes 1,000 metrics) makes more, which the
points limit bounds. Needs nothing but the standard library.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from typing import Callable


class RateLimiter:
    """Requests per second and points per second (either may be None: no limit); ``burst``: seconds' worth of each
    that may go at once. Thread-safe."""

    def __init__(self, requests_per_s: float | None = None, points_per_s: float | None = None, *,
                 burst: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        for name, v in (("requests_per_s", requests_per_s), ("points_per_s", points_per_s)):
            if v is not None and not v > 0:
                raise ValueError(f"rate limit: {name} must be > 0, got {v!r}")
        self.requests_per_s = requests_per_s
        self.points_per_s = points_per_s
        self.burst = max(0.0, float(burst))
        self.clock = clock
        self._lock = threading.Lock()
        self._tat = [0.0, 0.0]              # theoretical arrival time of the requests and the points buckets
        self.granted: deque[tuple[float, int, int]] = deque(maxlen=100_000)    # (when it may go, requests, points)

    @property
    def limited(self) -> bool:
        return self.requests_per_s is not None or self.points_per_s is not None

    def reserve(self, requests: int = 1, points: int = 0) -> float:
        """Book ``requests`` and ``points``; returns the seconds to wait before sending them (0: at once)."""
        with self._lock:
            now = self.clock()
            costs = ((self.requests_per_s, requests), (self.points_per_s, points))
            go = now
            for i, (rate, cost) in enumerate(costs):
                if rate is not None and cost > 0:
                    go = max(go, self._tat[i] - self.burst)      # up to ``burst`` seconds ahead of its slot
            for i, (rate, cost) in enumerate(costs):
                if rate is not None and cost > 0:
                    self._tat[i] = max(self._tat[i], go) + cost / rate
            self.granted.append((go, requests, points))
            return go - now

    def acquire(self, requests: int = 1, points: int = 0) -> None:
        """:meth:`reserve`, then sleep until the cost may be sent."""
        delay = self.reserve(requests, points)
        if delay > 0:
            time.sleep(delay)

    def history(self) -> list[tuple[float, int, int]]:
        """The reservations so far, as ``(time it may go, requests, points)`` on this limiter's clock."""
        with self._lock:
            return list(self.granted)


def max_in_window(history: list[tuple[float, int, int]], window: float = 1.0, what: int = 1) -> int:
    """The most requests (``what=1``) or points (``what=2``) booked to go within any ``window`` seconds."""
    times = sorted((h[0], int(h[what])) for h in history)
    best = total = 0
    lo = 0
    for t, n in times:
        total += n
        while times[lo][0] <= t - window:
            total -= times[lo][1]
            lo += 1
        best = max(best, total)
    return best


__all__ = ["RateLimiter", "max_in_window"]
