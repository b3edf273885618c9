"""The fingerprint the fidelity proofs rely on (tests/_support/fingerprint.py): it names the reduction a value was
computed with, and refuses a batch too even to tell reductions apart."""
from __future__ import annotations

import random

import pytest

from _support.fingerprint import assert_stated, equivalent, fingerprint, stated


# 1 logged step x 3 optimizer steps x 3 ranks x 2-3 micro-batches (three items, so that the last is neither the
# largest nor the smallest); uneven sequence lengths and micro-batch sizes,
# values drawn so that no two candidates coincide, and rank 0 neither the largest nor the smallest
def _batch(seed: int = 7):
    rng = random.Random(seed)
    shape = [[[(3, 1), (2,), (2, 3)], [(1, 2), (4,), (1,)], [(2, 2), (1, 1, 1), (3,)]],
             [[(2,), (1, 1, 2), (1, 1)], [(3,), (1, 2), (2, 2, 1)], [(4, 1), (2,), (1, 3)]],
             [[(1,), (2, 2)], [(3, 1), (1,), (2,)], [(1, 1, 1), (4,)]]]
    steps = [[[[[[round(rng.uniform(0, 1), 6) for _ in range(n)] for n in micro] for micro in rank]
               for rank in mini] for mini in shape]]
    for mini in steps[0]:          # rank 0 the middle one: min/max over ranks never equal rank 0's value
        mini.sort(key=lambda rank: sum(v for m in rank for s in m for v in s) / sum(len(s) for m in rank for s in m))
        mini.insert(0, mini.pop(1))
    return steps


STEPS = _batch()
LEVELS3 = ("micro_batches", "mini_batches", "processes")   # one logged step: no window


def token_mean(seqs):
    flat = [v for s in seqs for v in s]
    return sum(flat) / len(flat)


def test_names_mean_of_micro_batch_token_means_over_mini_batches():
    # written out by hand: token mean per micro-batch, unweighted mean over micro-batches, mean over ranks,
    # mean over the two optimizer steps (veRL's actor metrics)
    per_mini = []
    for mini in STEPS[0]:
        per_rank = [sum(token_mean(m) for m in rank) / len(rank) for rank in mini]
        per_mini.append(sum(per_rank) / len(per_rank))
    logged = sum(per_mini) / len(per_mini)
    assert_stated(logged, STEPS, {"tokens": "token_mean", "micro_batches": "mean", "mini_batches": "mean",
                                  "processes": "all_reduce_mean"}, tokens=("token_mean", "seq_mean_token_mean"),
                  levels=LEVELS3)
    with pytest.raises(AssertionError, match="differs in mini_batches"):
        assert_stated(logged, STEPS, {"tokens": "token_mean", "micro_batches": "mean",
                                      "mini_batches": "token_weighted", "processes": "all_reduce_mean"},
                      tokens=("token_mean", "seq_mean_token_mean"), levels=LEVELS3)


def test_a_global_token_mean_equals_its_pooled_description():
    flat = [v for mini in STEPS[0] for rank in mini for m in rank for s in m for v in s]
    logged = sum(flat) / len(flat)
    found = assert_stated(logged, STEPS, {"tokens": "token_mean", "micro_batches": "token_weighted",
                                          "mini_batches": "token_weighted", "processes": "all_reduce_weighted"},
                          tokens=("token_mean", "seq_mean_token_mean"), levels=LEVELS3)
    assert equivalent(found, stated({"tokens": "token_mean"}, STEPS), STEPS)    # pooled at every level: the same
    assert not equivalent(found, stated({"tokens": "token_mean", "mini_batches": "mean"}, STEPS), STEPS)


def test_the_last_micro_batch_of_rank0():
    # a selection (last micro-batch, last optimizer step, rank 0) can coincide with another on one batch (rank 0's
    # value may be the smallest): three observations of one shape tell them apart
    obs = [(token_mean(b[0][-1][0][-1]), b) for b in (_batch(seed) for seed in (1, 2, 3))]
    found = assert_stated(obs, None, {"tokens": "token_mean", "micro_batches": "last", "mini_batches": "last",
                                  "processes": "rank0"}, tokens=("token_mean",), levels=LEVELS3)
    assert (found.micro_batches, found.mini_batches, found.processes) == ("last", "last", "rank0")
    with pytest.raises(AssertionError, match="fit different reductions"):
        fingerprint(*obs[0], tokens=("token_mean",))          # one observation is not enough here


def test_an_even_batch_is_refused():
    even = [[[[[[1.0, 2.0]], [[3.0, 4.0]]]]]]      # one rank, one optimizer step, micro-batches of equal size
    with pytest.raises(AssertionError, match="does not tell micro_batches reductions apart"):
        assert_stated(2.5, even, {"tokens": "token_mean", "micro_batches": "mean"}, tokens=("token_mean",),
                      levels=("micro_batches",))
    coincide = [[[[[[0.3, 0.3]], [[0.3]]]]]]     # uneven, but every reduction of equal values coincides
    with pytest.raises(AssertionError, match="fit different reductions"):
        assert_stated(0.3, coincide, {"tokens": "token_mean", "micro_batches": "mean"}, tokens=("token_mean",),
                      levels=("micro_batches",))


def test_no_candidate_is_an_error():
    with pytest.raises(AssertionError, match="no candidate"):
        fingerprint(123.0, STEPS, tokens=("token_mean",))


def test_names_openrlhf_step_normalised_token_sum():
    # OpenRLHF >= 0.10.4 (aggregate_loss with iter_grad_accum_global_norm's normaliser): a micro-batch's token sum over
    # the optimizer step's tokens per (rank, micro-batch), then merged by tokens. One rank, micro-batches of 1 token
    # (value 1) and 3 tokens (value 2) of one step: 1 / 2 = 0.5 and 6 / 2 = 3.0, merged (0.5 + 9) / 4 = 2.375 where
    # the token mean is 1.75. A second step of 2 + 3 tokens, values 1 and 3: 2 / 2.5 = 0.8, 9 / 2.5 = 3.6, merged
    # (1.6 + 10.8) / 5 = 2.48; the two steps merged by tokens.
    steps = [[[[[[1.0]], [[2.0, 2.0, 2.0]]]], [[[[1.0, 1.0]], [[3.0, 3.0, 3.0]]]]]]
    want = (2.375 * 4 + 2.48 * 5) / 9
    red = {"tokens": "token_sum_step_norm", "micro_batches": "token_weighted", "mini_batches": "token_weighted",
           "processes": "all_reduce_weighted"}
    assert_stated(want, steps, red, levels=("micro_batches", "mini_batches"))
    with pytest.raises(AssertionError, match="computed as"):
        assert_stated(want, steps, {**red, "tokens": "token_mean"}, levels=("micro_batches", "mini_batches"))


# ------------------------------------------------------------------------------------------ the nesting of the levels
def _even(seed: int):
    """1 logged step x 1 optimizer step x 2 ranks x 2 micro-batches each (ranks can reduce each micro-batch together
    only when they hold as many), uneven token counts everywhere."""
    rng = random.Random(seed)
    ranks = [[(3, 1), (2,)], [(1, 2, 2), (4, 1)]]
    mini = [[[[round(rng.uniform(0, 1), 6) for _ in range(n)] for n in micro] for micro in rank] for rank in ranks]
    return [[mini]]


def per_micro_batch_global_token_means(steps):
    """TRL-like: each micro-batch's token mean over every rank's tokens, then the micro-batches averaged."""
    (mini,) = steps[0]
    means = []
    for u in range(len(mini[0])):
        toks = [v for rank in mini for s in rank[u] for v in s]
        means.append(sum(toks) / len(toks))
    return sum(means) / len(means)


def per_rank_means_weighted_by_tokens(steps):
    """Each rank's unweighted mean of its micro-batches' token means, the ranks weighted by their tokens."""
    (mini,) = steps[0]
    vals, toks = [], []
    for rank in mini:
        vals.append(sum(token_mean(m) for m in rank) / len(rank))
        toks.append(sum(len(s) for m in rank for s in m))
    return sum(v * t for v, t in zip(vals, toks)) / sum(toks)


def test_the_ranks_are_reduced_inside_each_micro_batch():
    batches = [_even(s) for s in (1, 2, 3)]
    red = {"tokens": "token_mean", "micro_batches": "mean", "processes": "all_reduce_weighted"}
    found = assert_stated([(per_micro_batch_global_token_means(b), b) for b in batches], None, red,
                          levels=("micro_batches", "processes"), tokens=("token_mean", "seq_mean_token_mean"))
    assert (found.micro_batches, found.processes) in (("mean", "all_reduce_weighted"), ("mean", "token_weighted"))
    # the other nesting (each rank's micro-batches first, then the ranks by tokens) is another number: no candidate
    # states it, so a framework that computed it would fail its proof instead of passing as the stated reduction
    with pytest.raises(AssertionError):
        assert_stated([(per_rank_means_weighted_by_tokens(b), b) for b in batches], None, red,
                      levels=("micro_batches", "processes"), tokens=("token_mean", "seq_mean_token_mean"))


def test_processes_weighted_by_tokens_differ_from_by_sequences_for_sequence_means():
    batches = [_even(s) for s in (4, 5, 6)]

    def seq_means_merged_by_tokens(steps):
        (mini,) = steps[0]
        num = den = 0.0
        for rank in mini:
            for m in rank:
                n = sum(len(s) for s in m)
                num += n * sum(sum(s) / len(s) for s in m) / len(m)
                den += n
        return num / den
    red = {"tokens": "seq_mean_token_mean", "micro_batches": "token_weighted", "processes": "token_weighted"}
    found = assert_stated([(seq_means_merged_by_tokens(b), b) for b in batches], None, red,
                          levels=("micro_batches", "processes"))
    assert found.processes == "token_weighted"
    with pytest.raises(AssertionError, match="computed as"):
        assert_stated([(seq_means_merged_by_tokens(b), b) for b in batches], None,
                      {**red, "processes": "seq_weighted"}, levels=("micro_batches", "processes"))


# ------------------------------------------------------------------------------------------ scalars and windows
def test_a_scalar_per_optimizer_step_and_the_window_that_keeps_its_last():
    # the lr of each optimizer step, one value per micro-batch ('tokens: none'); rows of 3, 3 and 1 steps (the last
    # window ends early): the row holds the last step's value, not the mean
    rng = random.Random(9)

    def row(n):
        return [[[[[[round(rng.uniform(1e-6, 1e-5), 12)]]]]] for _ in range(n)]
    rows = [row(3), row(3), row(1)]
    obs = [(b[-1][0][0][0][0][0], b) for b in rows]
    red = {"tokens": "none", "stat": "mean", "micro_batches": "none", "mini_batches": "none", "processes": "none",
           "window": "last"}
    # one value per step: the values tell the window's reductions apart, not token counts (levels: none to check)
    found = assert_stated(obs, None, red, levels=(), rel=1e-9)
    assert (found.tokens, found.window) == ("none", "last")
    with pytest.raises(AssertionError, match="computed as"):
        assert_stated(obs, None, {**red, "window": "mean"}, levels=(), rel=1e-9)


def test_the_stated_reduction_through_proven_reads_value_and_pooled():
    from _support.proven import to_fingerprint
    base = {"tokens": "none", "stat": "value", "std": "none", "micro_batches": "none", "mini_batches": "none",
            "processes": "none", "window": "pooled"}
    red = to_fingerprint(base)
    assert (red.stat, red.window) == ("mean", "none")
