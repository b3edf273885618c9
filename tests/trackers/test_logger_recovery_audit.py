"""The logger says a tracker "recovered" only once it has read the tracker back and found every point of the stretch
that failed held exactly once (issue 31, item 1): a tracker that acknowledged a catch-up but kept less stays failed
and is caught up again; one that holds points twice is said to, not called recovered.

The trackers are real jsonl sinks (their file read back with trackbridge's stream reader, which the audit also
uses) with two faults of real clients put in front of their writes: a full disk for a while (``ENOSPC``), then either
a write acknowledged of which one point never lands, or a client that keeps the batch that failed and sends it again
with its next write (Neptune's exporter did this before issue 31)."""
from __future__ import annotations

import errno
import logging
import time
import warnings
from collections import Counter

import trackbridge
from trackbridge.logger import LoggerWarning
from trackbridge.record import Histogram, Record
from trackbridge.stream import holdings
from trackbridge.sync.holdings import Holdings, audit
from trackbridge.trackers.jsonl.sink import JsonlSink

KEYS = ("loss/policy", "kl/value")
STEPS = 60
FULL_AT, FREED_AT = 20, 30          # the writes of steps FULL_AT .. FREED_AT-1 find the disk full


def test_audit_counts_what_is_lacking_and_doubled_point_by_point():
    recs = [(0, Record(0, 0.0, {"a": 1.0, "b": 2})), (1, Record(1, 1.0, {"a": 1.5, "t": "text"})),
            (2, Record(1, 1.5, {"a": float("nan"), "h": Histogram.from_values([1.0])})),
            (3, Record(2, 2.0, {"a": 3.0, "b": None}))]
    held = Holdings.from_pairs([("a", 0), ("b", 0), ("b", 0), ("a", 1), ("a", 2), ("t", 1), ("zz", 9)])
    got = audit(iter(recs), held)
    # a@1 was logged twice (once NaN) and is held once; b@0 held twice; text and histogram keys are not compared
    assert (got.lacking, got.doubled, got.compared) == (1, 1, 5)
    assert got.first_lacking == ("a", 1) and got.first_doubled == ("b", 0)
    assert (got.from_seq, got.from_step) == (1, 1)
    no_nan = audit(iter(recs), held, nan=False)            # a tracker that cannot store NaN is not blamed for it
    assert (no_nan.lacking, no_nan.doubled, no_nan.compared) == (0, 1, 4) and no_nan.from_seq is None
    later = audit(iter(recs), held, since=2, skip_keys={"b"})
    assert (later.lacking, later.doubled, later.compared) == (0, 0, 1) and later.whole


class _FullThen(JsonlSink):
    """A jsonl tracker whose disk is full while steps FULL_AT .. FREED_AT-1 are written (nothing lands), then
    ``after`` decides what the first write once the disk is free does."""

    after = "ok"

    def __init__(self, location: str) -> None:
        super().__init__(location)
        self.freed = False
        self.kept: list[Record] = []
        self.tricked = False

    def write(self, records: list[Record]) -> None:
        if not self.freed and any(r.step is not None and FULL_AT <= r.step < FREED_AT for r in records):
            if self.after == "resend" and not self.kept:
                self.kept = [Record(r.step, r.wall_time, dict(r.metrics)) for r in records]
            raise OSError(errno.ENOSPC, "No space left on device")
        if self.freed and not self.tricked:
            self.tricked = True
            if self.after == "lose":          # acknowledged, but one point of the first record never lands
                first = records[0]
                records = [Record(first.step, first.wall_time, {k: v for k, v in first.metrics.items()
                                                                if k != KEYS[1]})] + records[1:]
            elif self.after == "resend":      # the client sends the batch it kept from the failure first
                records = self.kept + records
        super().write(records)


def _run(tmp_path, after, caplog):
    sink = _FullThen(str(tmp_path / "trk"))
    sink.after = after
    run = trackbridge.init(project="p", run_id="audit", sinks=[sink], source="canonical",
                           options=trackbridge.LoggerOptions(writer="thread", retries=0, backoff=0.01,
                                                             retry_interval=0.05, stall_timeout=20, batch_size=5,
                                                             queue_size=10_000),
                           spool=str(tmp_path / "spool"))
    with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.WARNING, "trackbridge"):
        warnings.simplefilter("always")
        for s in range(STEPS):
            if s == FREED_AT:
                deadline = time.monotonic() + 20     # the tracker has failed (its worker fed from the spool)
                while run._workers[1].state != "failed" and time.monotonic() < deadline:
                    time.sleep(0.02)
                assert run._workers[1].state == "failed"
                sink.freed = True               # the disk is free again: the next write decides
            run.log({k: float(s) + j / 10 for j, k in enumerate(KEYS)}, step=s)
            time.sleep(0.002)
        st = run.finish()
    said = [str(w.message) for w in caught if issubclass(w.category, LoggerWarning)] + [
        r.getMessage() for r in caplog.records]
    held = holdings(sink.stream_file("audit"), None).counts()
    return st, said, held


def test_a_tracker_that_lost_a_point_in_its_catch_up_is_not_called_recovered(tmp_path, caplog):
    st, said, held = _run(tmp_path, "lose", caplog)
    want = Counter({(k, s): 1 for k in KEYS for s in range(STEPS)})
    assert held == want, (set(want) - set(held), {p: n for p, n in held.items() if n > 1})
    lost = [m for m in said if "reopened but after catching up it lacks 1 point(s)" in m]
    assert lost and f"'{KEYS[1]}'" in lost[0], said
    recovered = [m for m in said if "recovered" in m]
    assert recovered and "holds all" in recovered[-1], said
    assert st["sinks"][1]["state"] == "closed" and not any("pending" in m for m in said), (st, said)


def test_a_tracker_that_holds_points_twice_is_said_to(tmp_path, caplog):
    st, said, held = _run(tmp_path, "resend", caplog)
    doubled = {p: n for p, n in held.items() if n > 1}
    assert doubled and all(n == 2 for n in doubled.values())
    assert set(held) == {(k, s) for k in KEYS for s in range(STEPS)}
    twice = [m for m in said if "reopened and caught up" in m and f"holds {len(doubled)} point(s) twice" in m]
    assert twice, said
    assert not any("recovered" in m for m in said), said
    assert any("twice" in p for p in st["problems"]), st["problems"]
