"""Fingerprint proofs of AReaL's step timers (mappings/areal.yaml ``timeperf/rollout`` and ``timeperf/{stage}``,
hit by the real-log corpus): AReaL 1.0.4's own ``stats_tracker.record_timing`` and ``export`` (areal/utils/
stats_tracker.py, loaded from the installed wheel by tests/_support/proofs_areal.py), timed as
areal/trainer/rl_trainer.py@v1.0.4 times a training step: ``record_timing("rollout")`` around the wait for the
step's batch (:601), ``record_timing("train_step")`` around the update (:715), ``record_timing("update_weights")``
(:760), then one export per step (``_export_and_commit_stats``, :1269-1275; a one-process run, or the controller of a
single-controller run, exports its own tracker with no reduce group: train_controller.py@v1.0.4:626).

The stand-in: the tracker module's ``time`` (``record_timing`` reads ``time.perf_counter()`` at the block's start and
end), a clock that moves only when the test says how long a stage took, so the seconds are the same numbers in every
process. What is fingerprinted: each logged timer is the seconds of that stage in that step (the tracker's SCALAR
reduction: the readings' sum over their count), not a running total since the start (export resets the tracker),
not the step's time, not another stage's. A stage timed twice in one step (AReaL's loop times each once; the tracker
allows more) logs the readings' mean: fingerprinted too, with the sum and the last reading as the alternatives.
"""
from __future__ import annotations

import importlib.metadata

import pytest

try:            # the installed wheel (not find_spec: once loaded, `areal` is a skeleton package without a __spec__)
    importlib.metadata.distribution("areal")
except importlib.metadata.PackageNotFoundError:        # its package __init__ needs the GPU stack: not imported
    pytest.skip("make test installs areal==1.0.4 --no-deps", allow_module_level=True)
pytest.importorskip("colorlog", reason="make test installs colorlog (areal/utils/logging.py imports it)")

from _support.framework_code import StandInClock  # noqa: E402
from _support.proofs_areal import areal, rank_stats_tracker  # noqa: E402
from _support.proven import close, proof  # noqa: E402

#: seconds per stage of each step (step 1, step 2): every stage and step a different number
SECONDS = {"rollout": (2.5, 4.75), "train_step": (7.25, 6.5), "update_weights": (0.75, 1.25)}


def _timed_steps(twice: bool = False) -> list[dict[str, float]]:
    """Two training steps timed as rl_trainer.py times them, each exported; ``twice``: step 2 times
    ``update_weights`` a second time (2.0 s)."""
    st_mod = areal().stats_tracker
    st = rank_stats_tracker()
    real = st_mod.time
    clock = st_mod.time = StandInClock(real, 100.0, attr="perf_counter")
    out = []
    try:
        for step in range(2):
            for stage, secs in SECONDS.items():
                with st.record_timing(stage):
                    clock.advance(secs[step])
            if twice and step == 1:
                with st.record_timing("update_weights"):
                    clock.advance(2.0)
            out.append(st.DEFAULT_TRACKER.export(reduce_group=None))
    finally:
        st_mod.time = real
    return out


@proof("areal", trainer="ppo", release="1.0.4", config={})
def test_areal_timers_are_the_stages_seconds_in_the_step(p):
    exports = _timed_steps()
    for step, row in enumerate(exports):
        p.check({k for k in row if not k.endswith("__count")} == {f"timeperf/{s}" for s in SECONDS}, sorted(row))
        for stage, secs in SECONDS.items():
            key = f"timeperf/{stage}"
            p.assert_stated(key, row[key], [[[[[[secs[step]]]]]]], levels=(), rel=1e-9)
            p.check(row[f"{key}__count"] == 1, row)
            if step:
                p.check(not close(row[key], secs[0] + secs[1]), f"{key} is no running total")
        p.check(not close(row["timeperf/train_step"], sum(s[step] for s in SECONDS.values())), "not the step's")


@proof("areal", trainer="ppo", release="1.0.4", config={})
def test_areal_a_stage_timed_twice_logs_the_mean(p):
    second = _timed_steps(twice=True)[1]
    readings = [SECONDS["update_weights"][1], 2.0]
    p.check(second["timeperf/update_weights__count"] == 2, second)
    p.assert_stated("timeperf/update_weights", second["timeperf/update_weights"], [[[[[[x] for x in readings]]]]],
                    levels=(), tokens=("per_seq",), stats=("mean", "sum", "max", "min"), rel=1e-9)
    p.check(not close(second["timeperf/update_weights"], readings[-1]), "not the last reading")
