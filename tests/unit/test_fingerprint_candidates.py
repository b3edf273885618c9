"""The fingerprint's candidates that some entries need and the rest of the candidates could not state
(tests/_support/fingerprint.py): a ``count`` statistic, a ``gather`` (a pooled std over the ranks), a ``driver``
combining its batches (``processes: none`` with a ``micro_batches`` level), a window's ``max`` / ``min``, a token
sum over the step's global token count (``token_sum_global_norm``), the unbiased variance of a level's values
(``var``: TRL's ``val/ratio_var``) and the explained variance of (return, value) pairs (``explained_var``: veRL's
``critic/vf_explained_var``). Each test writes the expected value out by hand
on a batch where that candidate differs from every other one offered, and checks a value that fits two different
candidates is still refused."""
from __future__ import annotations

import statistics

import pytest

from _support import fingerprint as FP
from _support.fingerprint import assert_stated, equivalent, fingerprint
from _support.proven import as_fields, to_fingerprint

STATS = ("mean", "sum", "max", "min", "count")


def _fields(**kw: str) -> dict:
    base = {"tokens": "per_seq", "stat": "mean", "micro_batches": "none", "mini_batches": "none",
            "processes": "none", "window": "step", "std": "none"}
    return {**base, **kw}


# ------------------------------------------------------------------------------------------------- count
# one rank, three uneven micro-batches; every sequence its value on each of its tokens: 6 sequences, 13 tokens
COUNT_STEPS = [[[[[[0.7] * 3, [0.2]], [[0.9] * 2], [[0.4] * 4, [0.1] * 2, [0.3]]]]]]


def test_count_is_the_number_of_sequences_or_of_tokens():
    kw = {"tokens": ("per_seq", "token_mean"), "stats": STATS, "levels": ("micro_batches",), "mini": ("none",)}
    found = assert_stated(6.0, COUNT_STEPS, {"tokens": "per_seq", "stat": "count"}, **kw)
    assert (found.tokens, found.stat, found.micro_batches) == ("per_seq", "count", "none")
    found = assert_stated(13.0, COUNT_STEPS, {"tokens": "token_mean", "stat": "count"}, **kw)
    assert (found.tokens, found.stat) == ("token_mean", "count")
    with pytest.raises(AssertionError, match="differs in tokens"):
        assert_stated(6.0, COUNT_STEPS, {"tokens": "token_mean", "stat": "count"}, **kw)


def test_a_count_that_equals_a_sum_is_refused():
    ones = [[[[[[1.0]] * 2, [[1.0]]]]]]              # every value 1: the sum of the sequences is their count
    with pytest.raises(AssertionError, match="fit different reductions"):
        fingerprint(3.0, ones, tokens=("per_seq",), stats=STATS, mini=("none",))


def test_count_is_stated_through_proven_and_summed_over_gathered_ranks():
    assert to_fingerprint(_fields(stat="count", processes="gather")).processes == "sum"
    # two ranks (3 and 2 sequences): gathered, the count is their sum; rank 0's would be 3
    steps = [[[[[[0.5], [0.25], [0.125]]], [[[2.0], [4.0]]]]]]
    want = as_fields(to_fingerprint(_fields(stat="count", processes="gather")))
    found = assert_stated(5.0, steps, want, tokens=("per_seq",), stats=STATS, mini=("none",), levels=("processes",))
    assert (found.stat, found.processes) == ("count", "sum")


# ------------------------------------------------------------------------------------------------- gather
# two ranks of uneven sizes (3 and 2 sequences), one micro-batch each
GATHER_STEPS = [[[[[[0.1], [0.5], [0.9]]], [[[2.0], [2.4]]]]]]


def test_gather_std_is_the_std_of_the_pooled_values():
    want = to_fingerprint(_fields(stat="std", std="sample", processes="gather"))
    assert (want.processes, want.std) == ("gather", "sample")       # not a weighted mean of the ranks' stds
    pooled = statistics.stdev([0.1, 0.5, 0.9, 2.0, 2.4])             # 0.9990
    per_rank = (statistics.stdev([0.1, 0.5, 0.9]) * 3 + statistics.stdev([2.0, 2.4]) * 2) / 5
    kw = {"tokens": ("per_seq",), "stats": ("mean", "std"), "mini": ("none",), "levels": ("processes",)}
    found = assert_stated(pooled, GATHER_STEPS, as_fields(want), **kw)
    assert equivalent(found, want, GATHER_STEPS) and found.std == "sample"
    assert not FP.math.isclose(FP.value_of(GATHER_STEPS, want), statistics.pstdev([0.1, 0.5, 0.9, 2.0, 2.4]))
    with pytest.raises(AssertionError, match="the entry states"):
        assert_stated(per_rank, GATHER_STEPS, as_fields(want), **kw)


def test_gather_pools_each_micro_batch_over_the_ranks():
    # two ranks, two micro-batches each: micro-batch u pooled over the ranks, then the micro-batches averaged
    steps = [[[[[[0.1], [0.7]], [[0.3]]], [[[0.9]], [[1.5], [0.2], [0.4]]]]]]
    red = FP.Reduction("per_seq", "std", "mean", "none", "gather", "step", "population")
    by_hand = (statistics.pstdev([0.1, 0.7, 0.9]) + statistics.pstdev([0.3, 1.5, 0.2, 0.4])) / 2
    assert FP.math.isclose(FP.value_of(steps, red), by_hand)
    found = fingerprint(by_hand, steps, tokens=("per_seq",), stats=("mean", "std"), mini=("none",),
                        processes=(*FP.PROCESSES, "gather"))
    assert (found.processes, found.micro_batches, found.std) == ("gather", "mean", "population")


# ------------------------------------------------------------------------------------------------- driver
# two ranks' batches (3 and 2 of them, uneven sizes), each sequence one value
DRIVER_STEPS = [[[[[[1.1], [3.7]], [[8.3]], [[2.9], [2.2], [5.6]]], [[[4.4]], [[6.1], [0.35]]]]]]
DRIVER_MEANS = [2.4, 8.3, 3.5666666666666664, 4.4, 3.225]       # each batch's mean


def test_driver_averages_its_batches_means_unweighted():
    want = to_fingerprint(_fields(micro_batches="mean"))           # processes none with a micro_batches level
    assert want.processes == "driver"
    by_hand = sum(DRIVER_MEANS) / 5                                 # the 5 batches' means, each counted once
    found = assert_stated(by_hand, DRIVER_STEPS, as_fields(want), tokens=("per_seq",), mini=("none",),
                          levels=("micro_batches", "processes"))
    assert (found.processes, found.micro_batches) == ("driver", "mean")
    # not the ranks' means of their batches averaged, not the pooled mean
    per_rank = (sum(DRIVER_MEANS[:3]) / 3 + sum(DRIVER_MEANS[3:]) / 2) / 2
    pooled = (1.1 + 3.7 + 8.3 + 2.9 + 2.2 + 5.6 + 4.4 + 6.1 + 0.35) / 9
    assert not FP.math.isclose(by_hand, per_rank) and not FP.math.isclose(by_hand, pooled)
    with pytest.raises(AssertionError, match="the entry states"):
        assert_stated(pooled, DRIVER_STEPS, as_fields(want), tokens=("per_seq",), mini=("none",),
                      levels=("micro_batches", "processes"))


def test_driver_is_not_offered_unless_asked_for():
    by_hand = sum(DRIVER_MEANS) / 5
    with pytest.raises(AssertionError, match="no candidate"):
        fingerprint(by_hand, DRIVER_STEPS, tokens=("per_seq",), mini=("none",))


# ------------------------------------------------------------------------------------------------- window
# three logged steps, one scalar each (the largest is neither the first nor the last)
WINDOW_STEPS = [[[[[[0.3]]]]], [[[[[0.9]]]]], [[[[[0.5]]]]]]


def test_window_max_and_min_are_the_windows_extreme_values():
    # the steps' own levels not reduced: only the window can pick a step's value (a mini_batches max over the
    # pooled window would be the same computation as the window's max)
    kw = {"tokens": ("none",), "micro": ("none",), "mini": ("none",)}
    for value, window in ((0.9, "max"), (0.3, "min")):
        found = assert_stated(value, WINDOW_STEPS, {"tokens": "none", "window": window}, levels=(), **kw)
        assert found.window == window
        with pytest.raises(AssertionError, match="no candidate"):
            fingerprint(value, WINDOW_STEPS, **kw)        # not offered unless asked for or stated
    # a window max that is also its last value fits two candidates
    rising = [[[[[[0.3]]]]], [[[[[0.5]]]]], [[[[[0.9]]]]]]
    with pytest.raises(AssertionError, match="fit different reductions"):
        fingerprint(0.9, rising, window=(*FP.WINDOW[1:], *FP.WINDOW_EXTRA), **kw)


# ------------------------------------------------------------------------------------------------- global token norm
# two ranks, two micro-batches each (uneven token counts: 3, 1 | 2, 4; the step's 10 tokens)
GLOBAL_STEPS = [[[[[[0.5, 0.25], [1.0]], [[2.0]]], [[[0.75, 0.25]], [[1.5], [0.5, 0.5, 1.0]]]]]]


def test_token_sum_over_the_steps_global_token_count():
    sums, total = [1.75, 2.0, 1.0, 3.5], 10
    by_hand = sum(s / total for s in sums) / 4          # each micro-batch's token sum over 10, averaged over the 4
    want = {"tokens": "token_sum_global_norm", "micro_batches": "mean", "processes": "all_reduce_mean"}
    found = assert_stated(by_hand, GLOBAL_STEPS, want, levels=("micro_batches", "processes"), mini=("none",))
    assert found.tokens == "token_sum_global_norm"
    assert FP.math.isclose(by_hand * 4, 8.25 / 10)       # 4 x the step's token mean: not the token mean itself
    with pytest.raises(AssertionError, match="no candidate"):
        fingerprint(by_hand, GLOBAL_STEPS, mini=("none",))   # not offered unless asked for or stated


def test_a_sample_std_of_one_value_is_no_candidate():
    # the driver's batches of one sequence each: their sample stds are undefined, not an error of the fingerprint
    steps = [[[[[[0.2]], [[0.6], [1.3]], [[0.9]]]]]]
    red = FP.Reduction("per_seq", "std", "mean", "none", "driver", "step", "sample")
    with pytest.raises(FP.Undefined):
        FP.value_of(steps, red)
    found = fingerprint(statistics.stdev([0.2, 0.6, 1.3, 0.9]), steps, tokens=("per_seq",), stats=("mean", "std"),
                        mini=("none",), processes=(*FP.PROCESSES, *FP.PROCESSES_EXTRA))
    assert (found.stat, found.std, found.micro_batches) == ("std", "sample", "none")


# ------------------------------------------------------------------------------------------------- var
# one logged step, 2 optimizer steps x 2 ranks x 2 micro-batches (token counts 2, 1 | 3, 2 and 1, 3 | 1, 2); each
# micro-batch's token mean: 2, 4 | 1, 6 and 2, 8 | 3, 1
VAR_STEPS = [[[[[[1.0, 3.0]], [[4.0]]], [[[0.0, 0.0, 3.0]], [[5.0, 7.0]]]],
              [[[[2.0]], [[6.0, 8.0, 10.0]]], [[[3.0]], [[0.5, 1.5]]]]]]
VAR_WANT = FP.Reduction("token_mean", "mean", "var", "none", "driver", "step")
VAR_KW = {"tokens": ("token_mean",), "micro": (*FP.COMBINE, *FP.COMBINE_EXTRA),
          "processes": (*FP.PROCESSES, *FP.PROCESSES_EXTRA)}


def test_var_is_the_unbiased_variance_of_every_micro_batch_value():
    # the 8 micro-batch means 2, 4, 1, 6, 2, 8, 3, 1: mean 27/8, squared deviations summing to 43.875, over n-1 = 7
    by_hand = 43.875 / 7                                              # 6.2679
    assert FP.math.isclose(by_hand, statistics.variance([2, 4, 1, 6, 2, 8, 3, 1]))
    assert FP.math.isclose(FP.value_of(VAR_STEPS, VAR_WANT), by_hand)
    found = fingerprint(by_hand, VAR_STEPS, **VAR_KW)
    assert (found.micro_batches, found.mini_batches, found.processes) == ("var", "none", "driver")
    # each micro-batch averaged over the ranks first (docs/reductions.md's nesting: 1.5, 5 | 2.5, 4.5), then the
    # variance of those 4 (squared deviations from 3.375 summing to 8.1875, over 3): another number
    over_ranks = FP.Reduction("token_mean", "mean", "var", "none", "all_reduce_mean", "step")
    assert FP.math.isclose(FP.value_of(VAR_STEPS, over_ranks), 8.1875 / 3)
    assert not FP.math.isclose(8.1875 / 3, by_hand)


def test_var_is_offered_when_stated_and_not_otherwise():
    by_hand = 43.875 / 7
    found = assert_stated(by_hand, VAR_STEPS, as_fields(VAR_WANT), tokens=("token_mean",),
                          levels=("micro_batches", "mini_batches", "processes"))
    assert found.micro_batches == "var"
    with pytest.raises(AssertionError, match="no candidate"):
        fingerprint(by_hand, VAR_STEPS, tokens=("token_mean",), processes=(*FP.PROCESSES, *FP.PROCESSES_EXTRA))
    # the population variance (n) is not it
    with pytest.raises(AssertionError, match="no candidate"):
        fingerprint(43.875 / 8, VAR_STEPS, **VAR_KW)


def test_a_variance_of_one_value_is_no_candidate():
    one = [[[[[[0.5, 1.5]]]]]]
    with pytest.raises(FP.Undefined):
        FP.value_of(one, VAR_WANT)


# ------------------------------------------------------------------------------------------------- explained_var
# (return, value) pairs of 7 valid tokens: two ranks, rank 0 with two micro-batches
EV_STEPS = [[[[[[(1.0, 0.5), (2.0, 1.0)], [(3.0, 2.0)]], [[(0.0, 0.5)]]],
              [[[(4.0, 3.0), (2.0, 2.5), (1.0, 1.0)]]]]]]
# returns 1, 2, 3, 0, 4, 2, 1: sum of squared deviations 76/7, unbiased variance 76/42; returns - values 0.5, 1, 1,
# -0.5, 1, -0.5, 0: 20/7 and 20/42
EV_BY_HAND = 1 - (20 / 42) / (76 / 42 + 1e-5)                          # 0.73684
EV_WANT = FP.Reduction("token_mean", "explained_var", "none", "none", "none", "step")


def test_explained_var_over_every_valid_token_at_once():
    assert FP.math.isclose(EV_BY_HAND, 1 - statistics.variance([0.5, 1, 1, -0.5, 1, -0.5, 0])
                           / (statistics.variance([1, 2, 3, 0, 4, 2, 1]) + 1e-5))
    assert FP.math.isclose(FP.value_of(EV_STEPS, EV_WANT), EV_BY_HAND)
    found = fingerprint(EV_BY_HAND, EV_STEPS, tokens=("token_mean", "per_seq"), stats=("explained_var",))
    assert (found.tokens, found.stat, found.processes, found.micro_batches) == ("token_mean", "explained_var",
                                                                                "none", "none")
    # each rank's explained variance, averaged unweighted: rank 0's tokens (returns 1, 2, 3, 0; differences 0.5,
    # 1, 1, -0.5: variances 5/3 and 0.5) and rank 1's (4, 2, 1; 1, -0.5, 0: 7/3 and 7/12)
    per_rank = FP.Reduction("token_mean", "explained_var", "none", "none", "all_reduce_mean", "step")
    by_rank = ((1 - 0.5 / (5 / 3 + 1e-5)) + (1 - (7 / 12) / (7 / 3 + 1e-5))) / 2
    assert FP.math.isclose(FP.value_of(EV_STEPS, per_rank), by_rank)
    assert not FP.math.isclose(by_rank, EV_BY_HAND, rel_tol=1e-3)
    found = assert_stated(EV_BY_HAND, EV_STEPS, as_fields(EV_WANT), tokens=("token_mean", "per_seq"),
                          levels=("micro_batches", "processes"))
    assert found.stat == "explained_var"


def test_explained_var_is_offered_only_when_asked_for_and_only_on_pairs():
    with pytest.raises(AssertionError, match="no candidate"):
        fingerprint(EV_BY_HAND, EV_STEPS, tokens=("token_mean",))      # a mean of pairs is no candidate
    plain = [[[[[[1.0, 2.0], [3.0]]]]]]
    with pytest.raises(FP.Undefined):
        FP.value_of(plain, EV_WANT)                                    # plain values have no explained variance
    with pytest.raises(FP.Undefined):
        FP.value_of([[[[[[(1.0, 0.5)]]]]]], EV_WANT)                   # one pair: no unbiased variance


def test_explained_var_candidates_stay_pairs_on_reshaped_batches():
    # equivalent() draws other batches of the same shape: pairs stay pairs, so the candidates stay defined
    assert equivalent(EV_WANT, FP.Reduction("token_mean", "explained_var", "none", "mean", "none", "step"), EV_STEPS)
    assert not equivalent(EV_WANT, FP.Reduction("token_mean", "explained_var", "none", "none", "all_reduce_mean",
                                                "step"), EV_STEPS)
