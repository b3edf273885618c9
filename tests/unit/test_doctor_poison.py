"""The checks on bad input: values that are not numbers, NaN and infinities, bools, a step missing or going back
(a resumed run), a record without any series, gigantic values. Nothing crashes, nothing is made up, and the
pathology injected at a known step is still found where it is."""
from __future__ import annotations

import math

from trackbridge.doctor import Doctor, diagnose_records, load_checks
from trackbridge.record import Histogram, Record


def _grad_records(values):
    return [Record(t, None, {"optim/grad_norm": v}) for t, v in enumerate(values)]


def test_poison_values_are_not_points():
    base = [0.5 + 0.01 * (t % 7) for t in range(60)]
    poison = {10: "0.5", 11: True, 12: None, 13: float("inf"), 14: float("nan"), 15: [1.0, 2.0],
              16: Histogram([1.0, 2.0]), 17: 1e308, 18: -0.0}
    recs = []
    for t, v in enumerate(base):
        recs.append(Record(t, None, {"optim/grad_norm": poison.get(t, v)}))
    recs[40] = Record(40, None, {"optim/grad_norm": 10.0})            # the explosion
    found = {f.id: f for f in diagnose_records(recs)}
    # 1e308 at step 17 is a (gigantic) spike; inf/nan are non-finite values: said by nonfinite-values, never a spike
    assert set(found) == {"grad-norm-explosion", "nonfinite-values"}
    ex = found["grad-norm-explosion"]
    assert [(s.first, s.last) for s in ex.stretches] == [(17, 17), (40, 40)] and ex.count == 2
    nf = found["nonfinite-values"]
    assert [(s.first, s.last) for s in nf.stretches] == [(13, 14)] and nf.severity == "critical"


def test_records_without_step_and_steps_going_back():
    doc = Doctor(load_checks())
    # no step: the record's position; a resumed run that restarts from step 20 after step 49
    for i in range(50):
        doc.feed(Record(None, None, {"optim/grad_norm": 0.5 + 0.01 * (i % 5)}))
    for t in range(20, 60):
        doc.feed(Record(t, None, {"optim/grad_norm": 9.0 if t == 45 else 0.5 + 0.01 * (t % 5)}))
    doc.feed(Record(61, None, {"other": 1.0}))                        # no series of any check
    (f,) = doc.finish()
    assert (f.id, f.first_step, f.last_step) == ("grad-norm-explosion", 45, 45)


def test_numpy_scalars_are_numbers():
    np = __import__("pytest").importorskip("numpy")
    recs = [Record(t, None, {"optim/grad_norm": np.float64(10.0 if t == 30 else 0.5)}) for t in range(40)]
    (f,) = diagnose_records(recs)
    assert (f.id, f.first_step) == ("grad-norm-explosion", 30)
    assert math.isclose(f.stretches[0].detail["value"], 10.0)
