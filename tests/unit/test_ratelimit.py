"""The destination's rate limit (:mod:`trackbridge.migrate.ratelimit`), on a made-up clock: reservations never
block, the requests and points booked within any second stay within the rate plus its burst, and a bad rate is
refused."""
from __future__ import annotations

import threading

import pytest

from trackbridge.migrate.ratelimit import RateLimiter, max_in_window


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_requests_per_second_with_a_burst():
    clock = Clock()
    lim = RateLimiter(10, None, burst=0.5, clock=clock)
    delays = [lim.reserve() for _ in range(40)]
    assert delays[:6] == [0.0] * 6                  # half a second's worth goes at once (plus the first)
    assert delays[6] == pytest.approx(0.1) and delays[-1] == pytest.approx(3.4)
    assert max_in_window(lim.history(), 1.0) <= 10 * 1.5 + 1
    clock.t += 60                                    # a quiet minute refills the bucket to its burst, not beyond
    assert [lim.reserve() for _ in range(7)][-1] == pytest.approx(0.1)


def test_points_per_second_bound_big_batches():
    clock = Clock()
    lim = RateLimiter(None, 1000, burst=0.0, clock=clock)
    assert lim.reserve(1, 5000) == 0.0
    assert lim.reserve(1, 1000) == pytest.approx(5.0)    # the first batch's 5 s are paid before the next goes
    assert lim.reserve(1, 0) == 0.0                        # a request without points is not held by the points
    assert max_in_window(lim.history(), 1.0, what=2) <= 5000


def test_both_limits_the_slower_wins():
    clock = Clock()
    lim = RateLimiter(100, 10, burst=0.0, clock=clock)
    assert lim.reserve(1, 10) == 0.0
    assert lim.reserve(1, 10) == pytest.approx(1.0)


def test_threads_share_it():
    lim = RateLimiter(50, None, burst=0.0)
    out: list[float] = []
    lock = threading.Lock()

    def book():
        for _ in range(25):
            d = lim.reserve()
            with lock:
                out.append(d)
    ts = [threading.Thread(target=book) for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert len(lim.history()) == 100
    assert max_in_window(lim.history(), 1.0) <= 51
    assert max(out) >= 99 / 50 - 0.2


@pytest.mark.parametrize("bad", [0, -1.0, float("nan")])
def test_a_rate_that_is_not_positive_is_refused(bad):
    with pytest.raises(ValueError, match="must be > 0"):
        RateLimiter(bad, None)
