"""Fingerprint proofs of mappings/trl.yaml for TRL's DPOTrainer and RLOOTrainer (issue 20), the other TRL trainers
whose keys share canonical names with veRL and OpenRLHF (preference/reward/*, preference/accuracy, kl/old_ref/k1,
policy/entropy, loss/total). As in test_proof_trl_grpo.py: the installed TRL trains a tiny model on CPU, the logged
rows are matched against every candidate reduction of the values TRL computed (the locals of the function that
appended them), and the match must be the entry's stated reduction for the run's config.

* DPO: 7 preference pairs, per_device_train_batch_size 2, gradient_accumulation_steps 2: micro-batches of 2 and 1
  pairs (the epoch's last batch), logging_steps 3, 9 steps: every key is a value per micro-batch (gathered over
  processes: a global mean of pairs, or a global token mean) averaged over the row's micro-batches and steps.
* RLOO: gradient_accumulation_steps 2, logging_steps 3, num_iterations 2, beta 0.05: the KL of the sampling-time
  policy is one global token mean per generation batch, averaged over the row's generations; entropy per micro-batch.
"""
from __future__ import annotations

import atexit
import functools
import math
import shutil
import tempfile
from pathlib import Path

import pytest

pytest.importorskip("trl")
pytest.importorskip("datasets")

from _support.proofs_trl import TRLRun, counter_obs, masked, per_seq, run_dpo, run_rloo, running_tokens  # noqa: E402,E501
from _support.proven import proof  # noqa: E402

RELEASE = "1.16.0"
WINDOWS = ("mean", "last", "sum", "none")
DPO = dict(per_device_train_batch_size=2, gradient_accumulation_steps=2, logging_steps=3, max_steps=9, beta=0.1)
RLOO = dict(gradient_accumulation_steps=2, logging_steps=3, max_steps=6, num_iterations=2, beta=0.05,
            per_device_train_batch_size=2, num_generations=2, epsilon=1e-3, epsilon_high=1e-3,
            lr_scheduler_type="cosine_with_restarts", lr_scheduler_kwargs={"num_cycles": 5})   # lr: last != min
N_PAIRS = 7

_WORK = Path(tempfile.mkdtemp(prefix="trl-proofs-"))
atexit.register(shutil.rmtree, _WORK, True)


@functools.lru_cache(maxsize=None)
def _dpo() -> TRLRun:
    return run_dpo(_WORK / "dpo", n_pairs=N_PAIRS, **DPO)


@functools.lru_cache(maxsize=None)
def _rloo() -> TRLRun:
    return run_rloo(_WORK / "rloo", **RLOO)


def _obs(run: TRLRun, key: str, fn: str, values) -> list:
    out = [(row[key], run.steps(i, fn, values)) for i, (_s, row) in enumerate(run.train_rows()) if key in row]
    assert out, f"no train row logged {key!r}"
    return out


def _half(values, first: bool = True):
    """The chosen (first half) or rejected (second half) sequences of a DPO batch ([chosen; rejected])."""
    def fn(loc):
        seqs = values(loc)
        n = len(seqs) // 2
        return seqs[:n] if first else seqs[n:]
    return fn


@proof("trl", trainer="dpo", release=RELEASE, config={k: DPO[k] for k in ("gradient_accumulation_steps",
                                                                            "logging_steps", "beta")})
def test_dpo_pair_means_average_micro_batches_and_logged_steps(p):
    """rewards/*, logps/*: the mean over the micro-batch's pairs gathered from every process; entropy, logits/chosen
    and mean_token_accuracy: the micro-batch's token mean over every process (summed token counts); then log()
    averages the row's micro-batches (2 and 1 pairs) unweighted. HF's loss: the mean over pairs per micro-batch,
    divided by gradient_accumulation_steps and summed, averaged over the row's steps."""
    run = _dpo()
    sizes = [len(c.locals["chosen_rewards"]) for c in run.calls if c.name == "_compute_loss"]
    p.check(set(sizes) == {1, 2}, f"micro-batches of 2 and 1 pairs: {sizes}")
    per_pair = (("rewards/chosen", per_seq("chosen_rewards")), ("rewards/rejected", per_seq("rejected_rewards")),
                ("rewards/margins", per_seq("margins")), ("rewards/accuracies", per_seq("reward_accuracies")))
    for key, values in per_pair:
        p.assert_stated(key, _obs(run, key, "_compute_loss", values), tokens=("per_seq",), mini=("none",),
                        window=WINDOWS, levels=("micro_batches", "window"))
    for key, first in (("logps/chosen", True), ("logps/rejected", False)):
        p.assert_stated(key, _obs(run, key, "_compute_loss",
                                  _half(masked("per_token_logps", "shift_completion_mask"), first)),
                        tokens=("seq_mean_token_sum", "token_mean"), mini=("none",), window=WINDOWS,
                        levels=("micro_batches", "window"))
    for key, values in (("entropy", masked("per_token_entropy", "mask")),
                        ("logits/chosen", masked("chosen_mean_logits", "chosen_mask")),
                        ("logits/rejected", masked("rejected_mean_logits", "rejected_mask")),
                        ("mean_token_accuracy", masked("chosen_is_top1", "chosen_mask"))):
        p.assert_stated(key, _obs(run, key, "_compute_loss", values), tokens=("token_mean", "seq_mean_token_mean"),
                        mini=("none",), window=WINDOWS, levels=("micro_batches", "window"))
    p.assert_stated("loss", _obs(run, "loss", "_compute_loss", per_seq("per_sequence_loss")), tokens=("per_seq",),
                    mini=("none",), window=WINDOWS, levels=("micro_batches", "window"), rel=1e-5)


@proof("trl", trainer="dpo", release=RELEASE, config={k: DPO[k] for k in ("gradient_accumulation_steps",
                                                                            "logging_steps", "beta")})
def test_dpo_num_tokens_is_the_running_total_at_the_rows_last_step(p):
    """num_tokens: the running total of the attention-mask tokens of every micro-batch (every process), as it stood
    at the row's last step: a counter, not reduced over the row's steps."""
    run = _dpo()
    tokens = running_tokens(run, "_compute_loss", lambda loc: loc["inputs"]["attention_mask"])
    p.check(len(set(tokens)) == len(tokens), f"a running total grows every step: {tokens}")
    p.assert_stated("num_tokens", counter_obs(run, "num_tokens", tokens), levels=())


@proof("trl", trainer="rloo", release=RELEASE, config={k: RLOO[k] for k in ("gradient_accumulation_steps",
                                                                              "logging_steps", "num_iterations",
                                                                              "beta")})
def test_rloo_kl_per_generation_and_entropy_per_micro_batch(p):
    """kl: k1 of the sampling-time policy against the reference, one global token mean per generation batch
    (accelerator.reduce of sums and counts), averaged over the row's generations; entropy: per micro-batch, averaged
    over micro-batches and steps."""
    run = _rloo()
    gens = [c.step for c in run.calls if c.name == "_generate_and_score_completions"]
    p.check(gens == [1, 3, 5], f"a generation every num_iterations steps: {gens}")
    p.assert_stated("kl", _obs(run, "kl", "_generate_and_score_completions",
                               masked("per_token_kl", "completion_mask")),
                    tokens=("token_mean", "seq_mean_token_mean"), mini=("none",), window=WINDOWS, levels=())
    p.assert_stated("entropy", _obs(run, "entropy", "_compute_loss", masked("entropies", "completion_mask")),
                    tokens=("token_mean", "seq_mean_token_mean"), mini=("none",), window=WINDOWS,
                    levels=("micro_batches", "window"))
    _entry, res = p.entry("kl")
    p.check(res.fields["snapshot"] == "rollout" and res.fields["estimator"] == "k1", res.fields)


# ------------------------------------------------------------------------------------------------------- RLOO
RLOO_CONFIG = {k: RLOO[k] for k in ("gradient_accumulation_steps", "logging_steps", "num_iterations", "beta")}
GEN, SCORE, LOSS = "_generate", "_generate_and_score_completions", "_compute_loss"


@proof("trl", trainer="rloo", release=RELEASE, config=RLOO_CONFIG)
def test_rloo_generation_keys_average_the_generations_of_a_row(p):
    """RLOO v0.22+ shares GRPO's generation code: completions/* over each generation batch's completions (gathered
    from every process), rewards/{fn}/mean and std over its scored completions, frac_reward_zero_std over its
    per-completion flags; each appended once per generation and averaged over the row's generations."""
    run = _rloo()
    for stat in ("mean", "min", "max"):
        p.assert_stated(f"completions/{stat}_length", _obs(run, f"completions/{stat}_length", GEN,
                                                           per_seq("agg_completion_lengths")),
                        tokens=("per_seq",), stats=(stat,), mini=("none",), window=WINDOWS, levels=())
        term = per_seq("agg_completion_lengths", "agg_is_truncated", invert=True)
        p.assert_stated(f"completions/{stat}_terminated_length",
                        _obs(run, f"completions/{stat}_terminated_length", GEN, term),
                        tokens=("per_seq",), stats=(stat,), mini=("none",), window=WINDOWS, levels=())
    p.assert_stated("completions/clipped_ratio", _obs(run, "completions/clipped_ratio", GEN,
                                                      per_seq("agg_is_truncated")),
                    tokens=("per_seq",), mini=("none",), window=WINDOWS, levels=())
    for col, name in enumerate(("length_reward", "has_cat")):
        def fn_rewards(loc, col=col):
            return [[float(v)] for v in loc["rewards_per_func"][:, col] if not math.isnan(float(v))]
        p.assert_stated(f"rewards/{name}/mean", _obs(run, f"rewards/{name}/mean", SCORE, fn_rewards),
                        tokens=("per_seq",), mini=("none",), window=WINDOWS, levels=())
        p.assert_stated(f"rewards/{name}/std", _obs(run, f"rewards/{name}/std", SCORE, fn_rewards),
                        tokens=("per_seq",), stats=("std",), mini=("none",), window=WINDOWS, levels=())
    p.assert_stated("frac_reward_zero_std", _obs(run, "frac_reward_zero_std", SCORE, per_seq("is_std_zero")),
                    tokens=("per_seq",), mini=("none",), window=WINDOWS, levels=())


@proof("trl", trainer="rloo", release=RELEASE, config=RLOO_CONFIG)
def test_rloo_loss_lr_and_token_counter(p):
    """HF's loss: the micro-batch's mean of the
    sequence-level objective, averaged; learning_rate: the row's last step's, before the scheduler steps;
    num_tokens: the running total at the row's last generation."""
    run = _rloo()
    p.assert_stated("loss", _obs(run, "loss", LOSS, per_seq("per_sequence_loss")), tokens=("per_seq",),
                    mini=("none",), window=WINDOWS, levels=(), rel=1e-5)
    opt = run.optimizer
    lr_obs = [(row["learning_rate"], run.per_step(opt.lr_before, i)) for i, (_s, row) in enumerate(run.train_rows())]
    p.assert_stated("learning_rate", lr_obs, tokens=("per_seq",), mini=("none",), window=WINDOWS, levels=())
    total, at = 0.0, {}
    for c in run.calls:
        if c.name == GEN:
            total += float(c.locals["total_prompt_tokens"]) + float(c.locals["agg_completion_lengths"].sum())
            at[c.step] = total
    per_step = [at[max(s for s in at if s <= step)] for step in range(1, RLOO["max_steps"] + 1)]
    p.assert_stated("num_tokens", counter_obs(run, "num_tokens", per_step), levels=())
