"""Fingerprint proofs of NeMo-RL's GRPO training entries of v0.1.0..v0.2.0, run on the v0.2.0 tag's own code
(nemo_reinforcer; tests/_support/proofs_nemo_rl_old.py says what runs and what stands in): train/loss,
train/kl_penalty, train/lr and the printed Training Results/Loss, and train/kl_penalty with
loss_fn.use_on_policy_kl_approximation (v0.2.0); and on the v0.1.1 tag's code the generation-length entries of
v0.1.0..v0.1.1 (train/mean_generation_length, validation/avg_length and their printed lines).

The batch: 16 sequences of uneven lengths and prompts, 2 data-parallel ranks, a global batch of 8 (2 global
batches, each rank's 4 sequences in 2 micro-batches of 2): every level (tokens, micro-batches, global batches,
ranks) holds several uneven items, so every candidate reduction gives another number.
"""
from __future__ import annotations

import re

import pytest

pytest.importorskip("torch")
pytest.importorskip("numpy")

from _support import proofs_nemo_rl_old as OLD  # noqa: E402
from _support.proven import close, proof  # noqa: E402

RELEASE = OLD.RELEASE
DP, GBS, MBS, VOCAB, SEQ = 2, 8, 2, 13, 12
LENGTHS = [12, 7, 9, 5, 11, 6, 12, 8, 4, 10, 9, 12, 6, 11, 5, 8]
PROMPTS = [3, 2, 4, 1, 2, 3, 5, 2, 1, 3, 2, 4, 1, 2, 2, 3]
KL_COEF = 0.05
LOSS_CFG = {"reference_policy_kl_penalty": KL_COEF, "ratio_eps_min": 0.2, "ratio_eps_max": 0.2,
            "use_on_policy_kl_approximation": False, "use_importance_sampling_correction": False}
CFG = {"loss_fn.reference_policy_kl_penalty": KL_COEF, "policy.train_global_batch_size": GBS,
       "policy.train_micro_batch_size": MBS}
LEVELS = ("micro_batches", "mini_batches", "processes")


def run(loss_cfg: dict) -> OLD.GrpoRun:
    C = OLD.code()
    data = OLD.batch(C, len(LENGTHS), vocab=VOCAB, seq_len=SEQ, lengths=LENGTHS, prompt=PROMPTS, seed=11)
    return OLD.run_grpo_train(data, C, loss_cfg, dp=DP, gbs=GBS, mbs=MBS, vocab=VOCAB)


@proof("nemo_rl", trainer="grpo", release=RELEASE, config=CFG)
def test_grpo_loss_kl_lr_v020(p):
    """train/loss and train/kl_penalty: ClippedPGLossFn's masked_mean over the micro-batch's loss-masked tokens
    (loss_functions.py@v0.2.0:149, 174-177; kl divided back by the coefficient, :188), the micro-batch's own token
    mean; the worker keeps every micro-batch's metrics (dtensor_policy_worker.py@v0.2.0:353-354), HfPolicy
    concatenates every rank's (hf_policy.py@v0.2.0), and grpo.py's np.mean (:581-585) averages them all, the
    micro-batch list overwriting train_results['loss'] (:576-580): the mean over ranks, global batches and
    micro-batches of the micro-batch token means. Training Results/Loss: its print, :.4f (:590). train/lr: the
    param_groups[0]['lr'] of each micro-batch (:342), the scheduler stepping after each global batch (:374-375):
    the mean of the global batches' learning rates."""
    r = run(LOSS_CFG)
    m = r.metrics
    p.check(len(r.calls) == DP * 2 * r.num_microbatches and r.num_microbatches == 2, len(r.calls))
    loss, kl = OLD.steps_of(r, "loss", DP), OLD.steps_of(r, "kl_penalty", DP)
    p.assert_stated("train/loss", m["loss"], loss, levels=LEVELS, rel=1e-5)
    p.assert_stated("train/kl_penalty", m["kl_penalty"], kl, levels=LEVELS, rel=1e-5)
    p.check(m["kl_penalty"] > 0, m["kl_penalty"])
    printed = re.search(r"• Loss: (-?[0-9.]+)", r.printed)
    p.check(printed is not None, r.printed)
    p.assert_stated("Training Results/Loss", float(printed.group(1)), loss, levels=LEVELS, rel=2e-5)
    # the micro-batch list replaced the all-reduced global_loss (each global batch's micro-batch losses over their
    # count, summed, averaged over the ranks): with every micro-batch valid, its mean is the same number
    p.check(len(r.global_loss) == 2 and close(m["loss"], sum(r.global_loss) / 2, 1e-5), r.global_loss)
    lrs = r.lr_used
    p.check(len(lrs[0]) == 2 and lrs[0] == lrs[1] and not close(lrs[0][0], lrs[0][1]), lrs)
    # every rank and micro-batch of a global batch read the same lr: one value per global batch
    lr_steps = [[[[[[lr]]]] for lr in lrs[0]]]
    p.assert_stated("train/lr", m["lr"], lr_steps, levels=(), tokens=("none",))


@proof("nemo_rl", trainer="grpo", release=RELEASE,
       config={**CFG, "loss_fn.use_on_policy_kl_approximation": True})
def test_grpo_on_policy_kl_approximation_v020(p):
    """loss_fn.use_on_policy_kl_approximation (v0.2.0): each token's k3 weighted by exp(logp - logp_generation)
    (loss_functions.py@v0.2.0:131-149), then reduced as without it: the micro-batch's token mean, np.mean'ed over
    every rank's micro-batches; the per-token values from ClippedPGLossFn itself on each token alone."""
    r = run({**LOSS_CFG, "use_on_policy_kl_approximation": True})
    kl = OLD.steps_of(r, "kl_penalty", DP)
    p.assert_stated("train/kl_penalty", r.metrics["kl_penalty"], kl, levels=LEVELS, rel=1e-5)
    plain = run(LOSS_CFG)
    p.check(not close(r.metrics["kl_penalty"], plain.metrics["kl_penalty"]), "the weights changed nothing")


# ------------------------------------------------------------------------------------------------ v0.1.1 lengths
RELEASE_011 = OLD.RELEASE_011
TRAIN_PROMPTS, TRAIN_GEN = [3, 9, 4, 6, 2], [17, 3, 41, 8, 25]
VAL_BATCHES, VAL_GEN = [[4, 2, 7, 3, 5], [6, 1, 3]], [12, 40, 5, 9, 31, 2, 27, 14]


def per_seq(values: list) -> list:
    return [[[[[[v] for v in values]]]]]


@proof("nemo_rl", trainer="grpo", release=RELEASE_011, config={})
def test_grpo_train_generation_length_v011(p):
    """train/mean_generation_length: generate_responses (grpo.py@v0.1.1:283-330) logs (sum of the unpadded
    sequence lengths - sum of the prompt lengths) / samples, the mean generated tokens per sample of the step's
    single-turn generation; grpo_train's metrics.update(gen_metrics) logs it (:636, :659) and prints it, :.4f
    (Training Results/Mean Generation Length, :643)."""
    m, printed = OLD.run_train_generation(TRAIN_PROMPTS, TRAIN_GEN)
    lens = per_seq([float(g) for g in TRAIN_GEN])
    p.assert_stated("train/mean_generation_length", m["mean_generation_length"], lens, levels=(), tokens=("per_seq",))
    shown = re.search(r"• Mean Generation Length: ([0-9.]+)", printed)
    p.check(shown is not None, printed)
    p.assert_stated("Training Results/Mean Generation Length", float(shown.group(1)), lens, levels=(),
                    tokens=("per_seq",), rel=1e-5)
    p.check(m["max_seqlen"] == max(a + b for a, b in zip(TRAIN_PROMPTS, TRAIN_GEN)), m["max_seqlen"])


@proof("nemo_rl", trainer="grpo", release=RELEASE_011, config={"grpo.max_val_samples": 10, "grpo.val_batch_size": 5})
def test_grpo_validation_avg_length_v011(p):
    """validation/avg_length: validate (grpo.py@v0.1.1:668-774) extends total_lengths with every validation
    sample's generated-token count over the validation batches (:727) and divides their sum by their number (:734):
    the mean over every sample, pooled over the batches (a short last batch weighs by its samples); its print,
    :.1f (Validation Results/Average response length, :763)."""
    m, printed = OLD.run_validate(VAL_BATCHES, VAL_GEN, max_val_samples=10, val_batch_size=5)
    n = len(VAL_BATCHES[0])
    batches = [[[[[[float(g)] for g in VAL_GEN[:n]], [[float(g)] for g in VAL_GEN[n:]]]]]]
    p.assert_stated("validation/avg_length", m["avg_length"], batches, levels=("micro_batches",),
                    tokens=("per_seq",))
    shown = re.search(r"• Average response length: ([0-9.]+) tokens", printed)
    p.check(shown is not None, printed)
    p.assert_stated("Validation Results/Average response length", float(shown.group(1)), batches,
                    levels=("micro_batches",), tokens=("per_seq",), rel=2e-3)
