"""The registry of fingerprinted entries the proofs report reads (tests/_support/proven.py): a proof finds the mapping
entry trackbridge translates the key with, resolves its stated reduction for the proof's config, fingerprints the
logged value against it, records what it found and counts its assertions. The "framework code" here is a hand-written
veRL-like loop over the made-up framework `alpha` (tests/data/reductions); real proofs run the frameworks' wheels."""
from __future__ import annotations

import random

import pytest

from _support import DATA
from _support import proven as PV

FILES = tuple(str(DATA / "reductions" / n) for n in ("canonical-extra.yaml", "alpha.yaml", "beta.yaml",
                                                     "gamma.yaml"))
CONFIG = {"data.train_batch_size": 512, "actor.ppo_mini_batch_size": 256, "actor.ppo_epochs": 1,
          "actor.loss_agg_mode": "token-mean"}


def _batch(seed: int):
    """1 logged step x 2 mini-batches x 2 ranks x 2-3 micro-batches of ragged sequences, uneven at every level."""
    rng = random.Random(seed)
    shape = [[[(3, 1), (2,), (2, 3)], [(1, 2), (4,)]],
             [[(2,), (1, 1, 2)], [(3,), (1, 2), (2, 2, 1)]]]
    return [[[[[[round(rng.uniform(0, 1), 6) for _ in range(n)] for n in micro] for micro in rank]
               for rank in mini] for mini in shape]]


def alphas_actor_loop(steps):
    """What alpha's actor does: token mean over each mini-batch pooled over micro-batches and ranks (all-reduced
    sums and counts), then the unweighted mean over mini-batches."""
    per_mini = []
    for mini in steps[0]:
        toks = [v for rank in mini for micro in rank for seq in micro for v in seq]
        per_mini.append(sum(toks) / len(toks))
    return sum(per_mini) / len(per_mini)


def a_wrong_loop(steps):
    """A token mean over the whole step (what alpha's entry does not state)."""
    toks = [v for mini in steps[0] for rank in mini for micro in rank for seq in micro for v in seq]
    return sum(toks) / len(toks)


@PV.proof("alpha", trainer="ppo", release="v2.0", config=CONFIG, mappings=FILES)
def test_alpha_kl_loss_is_the_mean_over_mini_batches(p):
    obs = [(alphas_actor_loop(b), b) for b in (_batch(1), _batch(2))]
    found = p.assert_stated("actor/kl_loss", obs, levels=("micro_batches", "mini_batches", "processes"))
    p.check(found.mini_batches == "mean", found)


def test_the_proof_was_registered_and_recorded():
    pr = PV.PROOFS["test_proven_registry.py::test_alpha_kl_loss_is_the_mean_over_mini_batches"]
    pr.run()
    assert pr.assertions == 2 and len(pr.records) == 1
    rec = pr.records[0]
    assert (rec.framework, rec.key, rec.trainer, rec.release) == ("alpha", "actor/kl_loss", "ppo", "2.0")
    assert rec.entry.key == "actor/kl_loss" and rec.entry.file.endswith("alpha.yaml")
    assert rec.found.mini_batches == "mean" and rec.stated.mini_batches == "mean"
    assert rec.ident in PV.RECORDS
    # the gap to another reduction is measured on the proof's own batch
    pooled = PV.FP.Reduction("token_mean", "mean", "none", "none", "none", "step")
    assert abs(rec.value_of(pooled) - a_wrong_loop(rec.steps)) < 1e-12
    assert not PV.close(rec.value_of(pooled), rec.logged)


def test_a_proof_of_a_wrong_statement_fails():
    def wrong(p):
        obs = [(a_wrong_loop(b), b) for b in (_batch(1), _batch(2))]
        p.assert_stated("actor/kl_loss", obs, levels=("micro_batches", "mini_batches", "processes"))
    pr = PV.Proof(wrong, "alpha", "ppo", "2.0", tuple(CONFIG.items()), "wrong", FILES)
    with pytest.raises(AssertionError, match="the entry states"):
        pr.run()


def test_a_proof_without_assertions_fails_and_an_unstated_entry_is_refused():
    pr = PV.Proof(lambda p: None, "alpha", "ppo", "2.0", (), "empty", FILES)
    with pytest.raises(AssertionError, match="made 0 assertion"):
        pr.run()

    def legacy(p):
        p.assert_stated("legacy_kl", 0.5, [[[[[[0.5]]]]]])
    pr = PV.Proof(legacy, "beta", "grpo", "1.0", (), "legacy", FILES)
    with pytest.raises(AssertionError, match="states no reduction: write its reduce: first"):
        pr.run()


def betas_logging_loop(steps):
    """What beta's trainer does: each micro-batch's token mean over every rank's tokens (reduced across the ranks as
    it is computed, like TRL's per-micro-batch gathers), the unweighted mean of the micro-batches, the logging
    window's steps averaged unweighted."""
    out = []
    for step in steps:
        (mini,) = step
        means = []
        for u in range(len(mini[0])):
            toks = [v for rank in mini for s in rank[u] for v in s]
            means.append(sum(toks) / len(toks))
        out.append(sum(means) / len(means))
    return sum(out) / len(out)


def _window_batch(seed: int):
    """2 logged steps x 2 ranks x 2 micro-batches each (ranks reduce every micro-batch together: as many on each)."""
    rng = random.Random(seed)
    shape = [[[[(3, 1), (2,)], [(1, 2, 2), (4, 1)]]], [[[(2,), (1, 1, 2)], [(3, 3), (1,)]]]]
    return [[[[[[round(rng.uniform(0, 1), 6) for _ in range(n)] for n in micro] for micro in rank] for rank in mini]
             for mini in step] for step in shape]


@PV.proof("beta", trainer="grpo", release="v1.0", mappings=FILES,
          config={"gradient_accumulation_steps": 2, "logging_steps": 2, "num_iterations": 1})
def test_beta_kl_is_a_window_of_micro_batch_means(p):
    obs = [(betas_logging_loop(b), b) for b in (_window_batch(3), _window_batch(4), _window_batch(5))]
    p.assert_stated("kl", obs, levels=("micro_batches", "processes", "window"))


@PV.proof("gamma", trainer="ppo", release="v3.0", mappings=FILES, config={"batch": 512, "mini": 256})
def test_gamma_kl_is_alphas_computation(p):
    obs = [(alphas_actor_loop(b), b) for b in (_batch(5), _batch(6))]
    p.assert_stated("kl", obs, levels=("micro_batches", "mini_batches", "processes"))


def test_the_report_decides_pairs_by_fingerprints():
    """Both entries fingerprinted: the same computation is proven equal, another proven different with the gap
    measured on a proof's batch; an entry without a fingerprint leaves its pairs unproven, saying which."""
    from trackbridge.schema.loader import load_registry

    from _support import fidelity_proofs as FPR
    PV.RECORDS.clear()
    for name in ("test_alpha_kl_loss_is_the_mean_over_mini_batches", "test_beta_kl_is_a_window_of_micro_batch_means",
                 "test_gamma_kl_is_alphas_computation"):
        PV.PROOFS[f"test_proven_registry.py::{name}"].run()
    reg = load_registry(list(FILES))
    kl = {fw: next(e for e in reg.frameworks[fw].entries if e.canonical == "toy/kl" and e.reduce is not None)
          for fw in ("alpha", "beta", "gamma")}
    equal = FPR.decide(reg, FPR.Pair("toy/kl", kl["alpha"], kl["gamma"]), PV.RECORDS)
    assert equal.status == "proven equal" and equal.exact, equal.detail
    diff = FPR.decide(reg, FPR.Pair("toy/kl", kl["alpha"], kl["beta"]), PV.RECORDS)
    assert diff.status == "proven different" and not diff.exact and diff.gap is not None and diff.gap > 0.001
    assert "apart" in diff.detail
    rec = PV.RECORDS[PV.entry_ident(kl["alpha"])][0]
    assert abs(diff.gap - abs(rec.logged - rec.value_of(PV.RECORDS[PV.entry_ident(kl["beta"])][0].stated))
               / abs(rec.logged)) < 1e-12
    PV.RECORDS.pop(PV.entry_ident(kl["gamma"]))
    unproven = FPR.decide(reg, FPR.Pair("toy/kl", kl["alpha"], kl["gamma"]), PV.RECORDS)
    assert unproven.status == "unproven" and "no fingerprint proof of the gamma entry yet" in unproven.detail
    PV.RECORDS.clear()
