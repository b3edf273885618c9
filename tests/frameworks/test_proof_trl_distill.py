"""Fingerprint proofs of mappings/trl.yaml for TRL's distillation trainers (issue 33): the installed TRL (1.16.0)
trains a tiny model on CPU with its DistillationTrainer (trl/trainer/distillation_trainer.py: on-policy generation,
a perturbed copy of the student as teacher, the chunked generalized JSD), its experimental SDPOTrainer
(trl/experimental/sdpo/sdpo_trainer.py: self-distillation, the student reprompted with a successful rollout as
teacher) and GKDTrainer (trl/experimental/gkd/gkd_trainer.py); every row they log is read back through a callback's
on_log and matched against every candidate reduction of the values TRL itself computed
(tests/_support/proofs_trl_distill.py). The candidate that fits must be the reduction the shipped entry states for
the run's config, and no other. One process (the gathers are the identity): the process level is told apart by the
AsyncGRPO proofs (test_proof_trl_distill_async_grpo.py), not here.

Runs (each about a second on CPU):

* ``distill``: DistillationTrainer, gradient_accumulation_steps 2, logging_steps 3, 9 optimizer steps: each row
  averages 3 steps x 2 micro-batches of uneven token counts; one generation per optimizer step.
* ``sdpo``: SDPOTrainer, gradient_accumulation_steps 2, logging_steps 2, 6 optimizer steps, 8 completions per
  generation (``sdpo_gen``: 4, for the completion lengths), a 0/1 reward that meets
  the success threshold for most rollouts (every sequence is reprompted, so the self-distillation loss is not 0).
* ``gkd``: GKDTrainer off-policy (lmbda 0) on generated chat messages, gradient_accumulation_steps 2, logging_steps 3,
  9 optimizer steps.
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

from _support.proofs_trl import TRLRun, counter_obs, masked, per_seq  # noqa: E402
from _support.proofs_trl_distill import run_distillation, run_sdpo  # noqa: E402
from _support.proven import close, proof  # noqa: E402

RELEASE = "1.16.0"
WINDOWS = ("mean", "last", "sum", "none")
TOKEN_CANDIDATES = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "token_sum")

DISTILL = dict(per_device_train_batch_size=2, gradient_accumulation_steps=2, logging_steps=3, max_steps=9)
# learning rate 1e-2, not the proofs' 5e-2: at 5e-2 the tiny policy collapses to one-word completions by the third
# logged row on some CPUs (float rounding moves the sampling), no rollout meets the success threshold and SDPO
# reprompts nothing there; at 1e-2 every group holds a success in every row (rewards 0.70 to 0.89), so every
# micro-batch self-distils, as the distillation-loss proof needs
SDPO = dict(per_device_train_batch_size=4, num_generations=4, gradient_accumulation_steps=2, logging_steps=2,
            max_steps=6, success_reward_threshold=0.5, max_completion_length=10, dont_reprompt_on_self_success=False,
            learning_rate=1e-2)


SDPO_GEN = {**SDPO, "per_device_train_batch_size": 2, "num_generations": 2}     # 4 completions per generation


def _config(kw: dict) -> dict:
    keys = ("gradient_accumulation_steps", "logging_steps")
    return {k: kw[k] for k in keys if k in kw}


_WORK = Path(tempfile.mkdtemp(prefix="trl-distill-proofs-"))
atexit.register(shutil.rmtree, _WORK, True)

GEN = "_generate"
LOSS = "compute_loss"


@functools.lru_cache(maxsize=None)
def _distill() -> TRLRun:
    """The DistillationTrainer run, each compute_loss call's locals given TRL's per-token divergence and entropy
    (the k-th ChunkedDivergenceFunction.apply of the run is the k-th compute_loss call's) as (B, K) tensors and the
    loss mask _compute_loss used (completion_mask, times tool_mask when present)."""
    run, outputs = run_distillation(_WORK / "distill", **DISTILL)
    calls = [c for c in run.calls if c.name == LOSS]
    assert len(calls) == len(outputs) == DISTILL["max_steps"] * DISTILL["gradient_accumulation_steps"], (
        len(calls), len(outputs))
    for c, (div, ent) in zip(calls, outputs):
        inputs = c.locals["inputs"]
        mask = inputs["completion_mask"]
        if "tool_mask" in inputs:
            mask = mask * inputs["tool_mask"]
        c.locals["loss_mask"] = mask
        c.locals["per_token_divergence"] = div.view(mask.shape)
        c.locals["per_token_entropy"] = ent.view(mask.shape)
    return run


@functools.lru_cache(maxsize=None)
def _sdpo(name: str = "sdpo") -> TRLRun:
    return run_sdpo(_WORK / name, **{"sdpo": SDPO, "sdpo_gen": SDPO_GEN}[name])


def _obs(run: TRLRun, key: str, fn: str, values) -> list:
    """(logged value, batch) of every train row that logged ``key``."""
    out = [(row[key], run.steps(i, fn, values)) for i, (_s, row) in enumerate(run.train_rows()) if key in row]
    assert out, f"no train row logged {key!r}"
    return out


# ------------------------------------------------------------------------------------------- DistillationTrainer
@proof("trl", trainer="distillation", release=RELEASE, config=_config(DISTILL))
def test_distillation_entropy_is_micro_batch_token_means_averaged(p):
    """entropy: each micro-batch's student entropy summed over its loss tokens over their count (gathered from
    every process), appended per micro-batch; log() averages the row's 3 steps x 2 micro-batches unweighted."""
    run = _distill()
    p.check(run.windows == [(1, 3), (4, 6), (7, 9)], run.windows)
    p.assert_stated("entropy", _obs(run, "entropy", LOSS, masked("per_token_entropy", "loss_mask")),
                    tokens=TOKEN_CANDIDATES, mini=("none",), window=WINDOWS, levels=("micro_batches", "window"))


@proof("trl", trainer="distillation", release=RELEASE, config=_config(DISTILL))
def test_distillation_loss_is_the_steps_token_mean_averaged_over_logged_steps(p):
    """loss: each micro-batch's divergence token sum over the generation batch's token count (num_items_in_batch,
    gathered over processes, divided by their number), summed over the step's micro-batches: the step's token mean
    of the per-token generalized JSD; log() averages the row's steps."""
    run = _distill()
    obs = _obs(run, "loss", LOSS, masked("per_token_divergence", "loss_mask"))
    p.check(all(v > 0 for v, _ in obs), f"the teacher is not the student: the divergence is positive ({obs[0][0]})")
    p.assert_stated("loss", obs, tokens=TOKEN_CANDIDATES, mini=("none",), window=WINDOWS,
                    levels=("micro_batches", "window"), rel=1e-5)


@proof("trl", trainer="distillation", release=RELEASE, config=_config(DISTILL))
def test_distillation_generation_keys_average_the_generations_of_a_row(p):
    """completions/*: computed once over each generation batch (gathered from every process), then averaged over the
    generations of the row (one per optimizer step here)."""
    run = _distill()
    gens = [c.step for c in run.calls if c.name == GEN]
    p.check(gens == list(range(1, DISTILL["max_steps"] + 1)), f"a generation per optimizer step: {gens}")
    for stat in ("mean", "min", "max"):
        p.assert_stated(f"completions/{stat}_length",
                        _obs(run, f"completions/{stat}_length", GEN, per_seq("agg_completion_lengths")),
                        tokens=("per_seq",), stats=(stat,), mini=("none",), window=WINDOWS, levels=())
        term = per_seq("agg_completion_lengths", "agg_is_truncated", invert=True)
        p.assert_stated(f"completions/{stat}_terminated_length",
                        _obs(run, f"completions/{stat}_terminated_length", GEN, term),
                        tokens=("per_seq",), stats=(stat,), mini=("none",), window=WINDOWS, levels=())
    obs = _obs(run, "completions/clipped_ratio", GEN, per_seq("agg_is_truncated"))
    p.check(any(0 < v < 1 for v, _ in obs), f"some completions truncated, not all: {[v for v, _ in obs]}")
    p.assert_stated("completions/clipped_ratio", obs, tokens=("per_seq",), mini=("none",), window=WINDOWS, levels=())


@proof("trl", trainer="distillation", release=RELEASE, config=_config(DISTILL))
def test_distillation_num_tokens_is_the_running_total_at_the_rows_last_generation(p):
    """num_tokens: the running total of prompt + completion tokens over every process as it stood at the row's last
    generation (the list is replaced: _metrics[mode]["num_tokens"] = [total]), summed here from the token counts
    TRL's own _generate calls held; a counter, not reduced over the row's steps."""
    run = _distill()
    total, at = 0.0, {}
    for c in run.calls:
        if c.name == GEN:
            total += float(c.locals["total_prompt_tokens"]) + float(c.locals["agg_completion_lengths"].sum())
            at[c.step] = total
    per_step = [at[max(s for s in at if s <= step)] for step in range(1, DISTILL["max_steps"] + 1)]
    rows = run.train_rows()
    p.check(any(row["num_tokens"] != per_step[first - 1] for (first, _l), (_s, row) in zip(run.windows, rows)),
            "the row's first step's total is another number")
    p.assert_stated("num_tokens", counter_obs(run, "num_tokens", per_step), levels=())


@proof("trl", trainer="distillation", release=RELEASE, config=_config(DISTILL))
def test_distillation_step_time_averages_the_rows_steps(p):
    """step_time: training_step's wall time summed over the step's gradient_accumulation_steps calls, appended once
    per optimizer step (TRL's own timer readings), averaged over the row's steps by log()."""
    run = _distill()
    obs = []
    for i, (_s, row) in enumerate(run.train_rows()):
        first, last = run.windows[i]
        steps = [[[[[[c.appended["step_time"]]]]]] for s in range(first, last + 1)
                 for c in run.calls_of("training_step", s, s) if "step_time" in c.appended]
        p.check(len(steps) == last - first + 1, f"one step_time per optimizer step: {len(steps)}")
        obs.append((row["step_time"], steps))
    p.assert_stated("step_time", obs, tokens=("none",), mini=("none",), window=WINDOWS, levels=())


# ------------------------------------------------------------------------------------------- SDPOTrainer
def _sdpo_distill_tokens(loc: dict) -> list[list[float]]:
    """The per-token self-distillation loss of one micro-batch at the tokens of its loss mask (the locals of
    _compute_self_distillation_loss, the caller of the append)."""
    caller = loc["__caller__"]
    x, m = caller["per_token_loss"].detach().float(), caller["distillation_logits"].loss_mask.bool()
    return [[float(v) for v in x[i][m[i]]] for i in range(x.shape[0]) if bool(m[i].any())]


@proof("trl", trainer="self_distillation", release=RELEASE, config=_config(SDPO))
def test_sdpo_distillation_loss_is_micro_batch_token_means_averaged(p):
    """sdpo/distillation_loss ({method}/distillation_loss): each micro-batch's per-token loss summed over its
    self-distillation mask over the mask's count (gathered over processes and averaged), appended per micro-batch;
    log() averages the row's micro-batches and steps."""
    run = _sdpo()
    name = "_log_self_distillation_metric"
    calls = [c for c in run.calls if c.name == name and c.locals["__caller__"].get("per_token_loss") is not None]
    p.check(calls, "no micro-batch was self-distilled: the success threshold was never met")
    obs = [(row["sdpo/distillation_loss"], run.steps(i, name, _sdpo_distill_tokens))
           for i, (_s, row) in enumerate(run.train_rows())]
    p.check(all(len(mini[0]) == SDPO["gradient_accumulation_steps"] for _v, b in obs for step in b for mini in step),
            "every micro-batch self-distilled (a micro-batch without a distilled token appends 0 unweighted)")
    p.check(all(not close(v, 0.0) for v, _ in obs), "the distillation loss is not 0")
    p.assert_stated("sdpo/distillation_loss", obs, tokens=TOKEN_CANDIDATES, mini=("none",), window=WINDOWS,
                    levels=("micro_batches", "window"), rel=1e-5)


@proof("trl", trainer="self_distillation", release=RELEASE, config=_config(SDPO_GEN))
def test_sdpo_generation_keys_average_the_generations_of_a_row(p):
    """completions/*: computed once over each generation batch (the raw completion lengths gathered from every
    process), then averaged over the row's generations (4 completions per generation: their minimum is not always
    the 1-token completion)."""
    run = _sdpo("sdpo_gen")
    fn = "_record_completion_metrics"

    def lengths(loc):
        return [[float(v)] for v in loc["agg_completion_lengths"].float()]
    for stat in ("mean", "min", "max"):
        p.assert_stated(f"completions/{stat}_length", _obs(run, f"completions/{stat}_length", fn, lengths),
                        tokens=("per_seq",), stats=(stat,), mini=("none",), window=WINDOWS, levels=())
        term = per_seq("agg_completion_lengths", "agg_is_truncated", invert=True)
        p.assert_stated(f"completions/{stat}_terminated_length",
                        _obs(run, f"completions/{stat}_terminated_length", fn, term),
                        tokens=("per_seq",), stats=(stat,), mini=("none",), window=WINDOWS, levels=())
    p.assert_stated("completions/clipped_ratio", _obs(run, "completions/clipped_ratio", fn,
                                                      per_seq("agg_is_truncated")),
                    tokens=("per_seq",), mini=("none",), window=WINDOWS, levels=())


@proof("trl", trainer="self_distillation", release=RELEASE, config=_config(SDPO))
def test_sdpo_reward_function_means_average_the_generations(p):
    """self_distillation/rewards/{reward_fn}: each reward function's nan-aware mean over the gathered generation
    batch (rewards_per_func, already global), averaged over the row's generations."""
    run = _sdpo()
    fn = "_record_reward_diagnostics"
    for col, name in enumerate(("words_reward", "cat_bonus")):
        def fn_rewards(loc, col=col):
            return [[float(v)] for v in loc["rewards_per_func"][:, col] if not math.isnan(float(v))]
        obs = _obs(run, f"self_distillation/rewards/{name}", fn, fn_rewards)
        p.check(not all(close(v, 0.0) for v, _ in obs), f"{name}: every row logs 0")
        p.assert_stated(f"self_distillation/rewards/{name}", obs, tokens=("per_seq",), mini=("none",),
                        window=WINDOWS, levels=())


@proof("trl", trainer="self_distillation", release=RELEASE, config=_config(SDPO))
def test_sdpo_loss_is_the_mean_of_sequence_token_means(p):
    """loss (distillation_weight 1.0): each micro-batch's per-token self-distillation loss summed over each
    sequence's mask over its count, averaged over the micro-batch's sequences, divided by
    gradient_accumulation_steps by compute_loss itself (loss_is_scaled_for_ga: the Trainer does not divide again);
    the step's loss is the mean of its micro-batches', log() averages the row's steps. Every sequence was reprompted
    here (reprompt_sample_fraction 1): a sequence without a reprompt would count 0 in the mean over sequences."""
    run = _sdpo()
    rows = run.train_rows()
    p.check(all(close(r["self_distillation/reprompt_sample_fraction"], 1.0) for _s, r in rows),
            [r["self_distillation/reprompt_sample_fraction"] for _s, r in rows])
    name = "_log_self_distillation_metric"
    obs = [(row["loss"], run.steps(i, name, _sdpo_distill_tokens)) for i, (_s, row) in enumerate(rows)]
    p.check(all(len(micro) == SDPO["per_device_train_batch_size"] for _v, b in obs for step in b for mini in step
                for micro in mini[0]), "every sequence of every micro-batch is in its batch")
    p.assert_stated("loss", obs, tokens=TOKEN_CANDIDATES, mini=("none",), window=WINDOWS,
                    levels=("micro_batches", "window"), rel=1e-5)
    for v, b in obs:     # not the token mean's sign flipped, nor it times gradient_accumulation_steps
        flat = [x for step in b for mini in step for micro in mini[0] for seq in micro for x in seq]
        p.check(not close(v, -sum(flat) / len(flat), 1e-5), (v, sum(flat) / len(flat)))


@proof("trl", trainer="self_distillation", release=RELEASE, config=_config(SDPO))
def test_sdpo_reward_mean_is_the_generations_mean_averaged(p):
    """self_distillation/reward_mean (self_distillation/{metric}): the mean of the generation batch's summed rewards
    (global: rewards_per_func is gathered), one value per generation, averaged over the row's generations."""
    run = _sdpo()
    obs = _obs(run, "self_distillation/reward_mean", "_record_reward_diagnostics", per_seq("rewards"))
    p.check(len({round(v, 9) for v, _ in obs}) > 1, "every row logs the same reward mean")
    p.assert_stated("self_distillation/reward_mean", obs, tokens=("per_seq", "none"), mini=("none",), window=WINDOWS,
                    levels=())


# ------------------------------------------------------------------------------------------- GKDTrainer
GKD = dict(per_device_train_batch_size=2, gradient_accumulation_steps=2, logging_steps=3, max_steps=9)


@functools.lru_cache(maxsize=None)
def _gkd():
    from _support.proofs_trl_distill import run_gkd
    return run_gkd(_WORK / "gkd", **GKD)


@proof("trl", trainer="gkd", release=RELEASE, config={**_config(GKD), "average_tokens_across_devices": True})
def test_gkd_loss_is_the_steps_token_mean_averaged_over_logged_steps(p):
    """loss (lmbda 0: the data set's completions): each micro-batch's generalized JSD summed over its label tokens
    (the terms over the vocabulary, at every shifted label that is not -100) over num_items_in_batch, the Trainer's
    count of the step's label tokens (every micro-batch of the accumulation window); summed over the step's
    micro-batches (the Trainer does not divide by gradient_accumulation_steps when the loss takes
    num_items_in_batch): the step's token mean; log() averages the row's steps."""
    run, calls = _gkd()
    rows = run.train_rows()
    p.check(run.windows == [(1, 3), (4, 6), (7, 9)], run.windows)
    obs = []
    for i, (_s, row) in enumerate(rows):
        first, last = run.windows[i]
        steps = []
        for step in range(first, last + 1):
            mine = [c for c in calls if c["step"] == step]
            tokens = sum(len(seq) for c in mine for seq in c["seqs"])
            given = [c["num_items_in_batch"] for c in mine]
            p.check(all(n == tokens for n in given), f"num_items_in_batch: the step's label tokens ({tokens}): {given}")
            steps.append([[[c["seqs"] for c in mine]]])
        obs.append((row["loss"], steps))
    p.assert_stated("loss", obs, tokens=TOKEN_CANDIDATES, mini=("none",), window=WINDOWS,
                    levels=("micro_batches", "window"), rel=1e-5)


# ------------------------------------------------------------------------------------------- IWOPDTrainer
IWOPD = dict(per_device_train_batch_size=3, gradient_accumulation_steps=2, logging_steps=3, max_steps=9)


@functools.lru_cache(maxsize=None)
def _iwopd() -> TRLRun:
    from _support.proofs_trl_distill import run_iwopd
    return run_iwopd(_WORK / "iwopd", **IWOPD)


@proof("trl", trainer="distillation", release=RELEASE, config=_config(IWOPD))
def test_iwopd_completion_lengths_are_micro_batch_statistics_averaged(p):
    """completions/on_policy_{mean,min,max}_length and completions/truncated_fraction (IWOPDTrainer): after each
    training_step, the micro-batch's label-token counts (the completion lengths, gathered from every process), their
    mean, min and max (and the share at max_completion_length), appended per micro-batch; log() averages the row's
    micro-batches (2 per step, 3 steps)."""
    run = _iwopd()
    fn = "training_step"
    for stat in ("mean", "min", "max"):
        key = f"completions/on_policy_{stat}_length"
        obs = _obs(run, key, fn, per_seq("gathered_lengths"))
        p.assert_stated(key, obs, tokens=("per_seq",), stats=(stat,), mini=("none",), window=WINDOWS, levels=())
    cap = run.config["max_completion_length"]

    def truncated(loc):
        return [[float(v >= cap)] for v in loc["gathered_lengths"].tolist()]
    obs = _obs(run, "completions/truncated_fraction", fn, truncated)
    p.check(any(0 < v < 1 for v, _ in obs), [v for v, _ in obs])
    p.assert_stated("completions/truncated_fraction", obs, tokens=("per_seq",), mini=("none",), window=WINDOWS,
                    levels=())


def test_iwopd_on_policy_loss_divides_by_the_data_sets_label_tokens():
    """on_policy_loss (IWOPDTrainer, lmbda 1.0) fits no candidate reduction (ENTRY_WHY): each micro-batch's loss is
    its per-token IW-OPD loss (the locals of _compute_iw_opd_loss at its valid positions) summed over
    num_items_in_batch, which the Trainer counted from the data set's labels before on-policy generation replaced
    the completions (48 label tokens for a step training 22 generated ones); log() sums the micro-batches' losses
    over the step-equivalents and rounds to 4 decimals. Read back here: the row is the mean over its steps of (the
    step's token sum / num_items_in_batch), not the step's token mean."""
    run = _iwopd()
    for i, (_s, row) in enumerate(run.train_rows()):
        first, last = run.windows[i]
        per_step, means = [], []
        for step in range(first, last + 1):
            mine = run.calls_of("_compute_iw_opd_loss", step, step)
            total = sum(float(c.locals["loss"][c.locals["valid_mask"]].sum()) for c in mine)
            tokens = sum(int(c.locals["valid_mask"].sum()) for c in mine)
            given = {float(c.locals["num_items_in_batch"]) for c in mine}
            assert len(given) == 1 and given != {float(tokens)}, (given, tokens)
            per_step.append(total / given.pop())
            means.append(total / tokens)
        expected = sum(per_step) / len(per_step)
        assert math.isclose(row["on_policy_loss"], round(expected, 4), abs_tol=1e-4), (row["on_policy_loss"], expected)
        assert not math.isclose(row["on_policy_loss"], sum(means) / len(means), rel_tol=1e-3), means
