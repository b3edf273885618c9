"""compare's group statistics (trackbridge/compare/groups.py, issue 34 item 1), pure computation: against hand
computations (means, the IQM of a small array, the IQR, an area by the trapezoid rule, runs of unequal length
aligned) and against rliable 1.2.0's own functions on the same arrays (get_interval_estimates with aggregate_mean /
aggregate_iqm: the same intervals for the same seed)."""
from __future__ import annotations

import math

import pytest

from trackbridge.compare import groups as g

from _support.rliable_ref import interval, load

np = pytest.importorskip("numpy")

NAN = float("nan")


# -- by hand -------------------------------------------------------------------------------------------------------
def test_iqm_of_a_small_array_by_hand():
    scores = np.array([[1.0], [2.0], [3.0], [4.0], [5.0], [6.0], [7.0], [100.0]])
    # 8 scores: a quarter (2) cut at each end, the mean of 3, 4, 5, 6
    assert float(g.iqm(scores)) == 4.5
    assert float(g.mean(scores)) == 128.0 / 8
    _library, metrics = load()
    assert float(g.iqm(scores)) == float(metrics.aggregate_iqm(scores))
    assert float(g.mean(scores)) == float(metrics.aggregate_mean(scores))
    # 5 scores: int(1.25) = 1 cut at each end
    five = np.array([[10.0], [0.0], [3.0], [1.0], [2.0]])
    assert float(g.iqm(five)) == 2.0 == float(metrics.aggregate_iqm(five))


def test_auc_and_final_by_hand():
    # trapezoids: (1 - 0) * (0 + 2) / 2 + (3 - 1) * (2 + 2) / 2 = 1 + 4
    assert g.auc([0.0, 1.0, 3.0], [0.0, 2.0, 2.0]) == 5.0
    assert g.auc([5.0], [1.0]) is None
    assert g.final([1.0, 2.0, 3.0, 4.0], 2) == 3.5
    assert g.final([1.0, 2.0], 10) == 1.5                      # fewer points than K: all of them


def test_a_run_curve_is_sorted_one_point_per_x_finite_only():
    xs, ys = g.run_curve([3, 1, 2, 2, 4], [30.0, 10.0, 20.0, 21.0, NAN])
    assert (xs, ys) == ([1.0, 2.0, 3.0], [10.0, 21.0, 30.0])    # the last value at x=2; the NaN left out


def test_runs_of_unequal_length_aligned_on_the_union_of_x_values():
    a = ([1.0, 2.0, 3.0, 4.0], [1.0, 2.0, 3.0, 4.0])
    b = ([1.0, 2.0], [3.0, 6.0])
    c = ([2.0, 5.0], [9.0, 7.0])                               # a point where no other run has one
    x, mat = g.align([a, b, c])
    assert x.tolist() == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert g.counts(mat).tolist() == [2, 3, 1, 1, 1]
    assert g.mean_curve(mat).tolist() == [2.0, (2.0 + 6.0 + 9.0) / 3, 3.0, 4.0, 7.0]
    lo, hi = g.iqr_band(mat)
    # x=2: 2, 6, 9 -> linear percentiles 2 + 0.5 * 4 = 4 and 6 + 0.5 * 3 = 7.5; below two runs: no band
    assert (lo[1], hi[1]) == (4.0, 7.5)
    assert all(math.isnan(v) for v in (*lo[2:], *hi[2:]))


def test_an_aggregate_by_hand():
    series = {"s0": ([1, 2, 3], [1.0, 2.0, 3.0]), "s1": ([1, 2], [3.0, 4.0])}
    gm = g.aggregate("G", "reward/score/mean", series, band="iqr", last=1)
    assert gm.runs == ["s0", "s1"] and gm.count.tolist() == [2, 2, 1]
    assert gm.mean.tolist() == [2.0, 3.0, 3.0]
    assert gm.final.value == (3.0 + 4.0) / 2 and gm.final_iqm.value == 3.5
    # the IQR of two values, 3 and 4: 3.25 and 3.75
    assert (gm.final.lo, gm.final.hi) == (3.25, 3.75)
    # areas: s0 1.5 + 2.5 = 4, s1 3.5
    assert gm.auc.value == (4.0 + 3.5) / 2
    assert gm.spans == {"s0": (1.0, 3.0), "s1": (1.0, 2.0)}
    assert any("1\u20132 runs behind a point" in n for n in gm.notes)
    assert any("own x span" in n for n in gm.notes)
    assert g.row(gm, "iqr")[:5] == ["G", "reward/score/mean", 2, "1-2", "iqr"]


def test_a_group_of_one_run_has_its_values_and_no_band():
    gm = g.aggregate("solo", "m", {"s0": ([1, 2, 3], [1.0, 2.0, 4.0])}, last=2)
    assert gm.final.value == 3.0 and gm.final.lo is None and gm.final_iqm.lo is None
    assert gm.auc.value == 1.5 + 3.0 and gm.auc.lo is None
    assert all(math.isnan(v) for v in gm.lo) and "one run: no band" in gm.notes


# -- against rliable -----------------------------------------------------------------------------------------------
SCORES = np.array([0.62, 0.55, 0.71, 0.40, 0.66])              # 5 seeds' final performance


@pytest.mark.parametrize("which", ["mean", "iqm"])
@pytest.mark.parametrize("seed", [0, 7])
def test_intervals_are_rliables_on_the_same_array(which, seed):
    stat = {"mean": g.mean, "iqm": g.iqm}[which]
    point, (lo, hi) = interval(SCORES[:, None], which, reps=2000, seed=seed)
    assert float(stat(SCORES[:, None])) == pytest.approx(point, rel=1e-12)
    mine = g.bootstrap_interval(SCORES, stat, reps=2000, seed=seed)
    assert mine == pytest.approx((lo, hi), rel=1e-12)
    assert lo < point < hi


def test_several_tasks_resampled_per_task_as_rliable_does():
    rng = np.random.default_rng(3)
    scores = rng.normal(size=(6, 3))
    point, ci = interval(scores, "iqm", reps=500, seed=2)
    assert float(g.iqm(scores)) == pytest.approx(point, rel=1e-12)
    assert g.bootstrap_interval(scores, g.iqm, reps=500, seed=2) == pytest.approx(ci, rel=1e-12)


def test_estimates_are_rliables_and_reproducible():
    m, q = g.estimates(list(SCORES), "ci", reps=1000, seed=4)
    assert (m.lo, m.hi) == pytest.approx(interval(SCORES[:, None], "mean", reps=1000, seed=4)[1], rel=1e-12)
    assert (q.lo, q.hi) == pytest.approx(interval(SCORES[:, None], "iqm", reps=1000, seed=4)[1], rel=1e-12)
    again, _ = g.estimates(list(SCORES), "ci", reps=1000, seed=4)
    other, _ = g.estimates(list(SCORES), "ci", reps=1000, seed=5)
    assert (again.lo, again.hi) == (m.lo, m.hi) and (other.lo, other.hi) != (m.lo, m.hi)


def test_the_curve_band_at_a_point_is_rliables_interval_of_its_values():
    runs = [([1, 2, 3], [0.1, 0.5, 0.9]), ([1, 2, 3], [0.2, 0.4, 0.6]), ([1, 2], [0.3, 0.8]), ([1, 2], [0.0, 0.2])]
    x, mat = g.align(runs)
    lo, hi = g.ci_band(mat, reps=1000, seed=1)
    for i in range(len(x)):                                    # 4, 4 and 2 runs behind the points
        vals = mat[i][~np.isnan(mat[i])]
        _point, want = interval(vals[:, None], "mean", reps=1000, seed=1)
        assert (lo[i], hi[i]) == pytest.approx(want, rel=1e-12), x[i]


# -- groups from the command line ----------------------------------------------------------------------------------
def test_groups_parsed_and_bad_ones_refused_in_one_line():
    assert g.parse_group("TRL=a, b,tensorboard:runs/c") == ("TRL", ["a", "b", "tensorboard:runs/c"])
    for text, says in (("TRL", "expected LABEL=RUN,RUN"), ("=a,b", "expected LABEL=RUN,RUN"),
                       ("TRL=", "an empty group"), ("TRL=a,,b", "an empty run name")):
        with pytest.raises(ValueError) as exc:
            g.parse_group(text)
        assert str(exc.value).startswith("--group ") and says in str(exc.value) and "\n" not in str(exc.value)
    with pytest.raises(ValueError, match="--group A: given twice"):
        g.group_specs(["A=x", "A=y"])
    with pytest.raises(ValueError, match="--group A: an empty group"):
        g.group_specs({"A": []})


def test_config_keys_flat_or_nested():
    assert g.config_value({"trainer.algorithm": "grpo"}, "trainer.algorithm") == "grpo"
    assert g.config_value({"trainer": {"algorithm": {"name": "rloo"}}}, "trainer.algorithm.name") == "rloo"
    assert g.config_value({"trainer": {"seed": 1}}, "trainer.algorithm") is g._MISSING
    assert g.members("tb", ["tb/s0", "tb/s1", "tbx", "verl"]) == ["tb/s0", "tb/s1"]
