"""Fingerprint proofs of mappings/trl.yaml's GRPO-family entries that end before the pinned TRL 1.16.0, run at trl
0.15.2, 0.16.1 (each with the transformers, accelerate and datasets of its time), 0.29.1, 1.8.0 and 1.12.0
(tests/releases.txt; each proof runs in a child process whose sys.path starts with the release:
tests/_support/releases.py). The release's own trainer trains the tiny model on CPU
(tests/_support/proofs_trl_grpo_old.py); every row it logs is matched against every candidate reduction of the values
TRL itself computed, and the candidate that fits must be the one the entry of that release states.

* 0.15.2, ``window``: gradient_accumulation_steps 2, logging_steps 3, beta 1.0 (the KL term is a large part of the
  loss, which transformers 4.49 rounds to 4 decimals), micro-batches of 4 completions (2 prompts x 2 generations) of
  uneven lengths. 0.15.2 generates once per micro-batch (``_prepare_inputs``), so the per-generation keys average
  the row's 6 generations; the loss is each micro-batch's mean of sequence token means.
* 0.16.1, ``window``: gradient_accumulation_steps 2, logging_steps 3, num_iterations 2 (the generations of a step
  reused by the next, the policy moving in between), epsilon 1e-3 (tokens clip): the loss is each micro-batch's
  token mean, clip_ratio its clipped-token fraction.
* 0.29.1: GRPO's ``reward`` (the unweighted sum of the reward functions); DPO's ``entropy`` (v0.29.0..v1.2.0).
* 1.8.0: DPPO (trl.experimental.dppo: advantages/*, mask_ratio/*, prob_diff/mean; a generation every 2 optimizer
  steps, steps_per_generation 4, so a step's advantages do not sum to 0), GRPO with loss_type cispo
  (cispo_clip_ratio) and vespo (vespo/phi_seq_mean), KTO's logits/chosen|rejected (micro-batches of uneven
  desirable / undesirable counts, some with none: log()'s flat mean over the appended values).
* 1.12.0: SSD's completions/{mean,min,max}_length (trl.experimental.ssd, filter_empty zeroing some completions).

The reward functions are written here (0.15.2 turns every returned value into a float tensor: no None there; 0.16.1
nan-means, so ``has_cat`` returns None for some completions).
"""
from __future__ import annotations

import pytest

pytest.importorskip("trl")
pytest.importorskip("datasets")

from _support.proven import proof  # noqa: E402

WINDOWS = ("mean", "last", "sum", "none")
TOKEN_CANDIDATES = ("token_mean", "seq_mean_token_mean")


def length_reward(completions, **kwargs):
    return [-abs(len(c.split()) - 3.0) for c in completions]


def has_cat(completions, **kwargs):
    return [float("cat" in c) for c in completions]


def has_cat_or_none(completions, **kwargs):
    return [None if i % 5 == 4 else float("cat" in c) for i, c in enumerate(completions)]


def _obs(run, key: str, fn: str, values) -> list:
    out = [(row[key], run.steps(i, fn, values)) for i, (_s, row) in enumerate(run.train_rows()) if key in row]
    assert out, f"no train row logged {key!r}"
    return out


def _obs_appended(run, key: str, fn: str, values) -> list:
    """As :func:`_obs`, each step's calls of ``fn`` that appended ``key`` only (a KTO micro-batch without a
    desirable example appends no logits/chosen)."""
    out = []
    for i, (_s, row) in enumerate(run.train_rows()):
        if key not in row:
            continue
        first, last = run.windows[i]
        steps = []
        for step in range(first, last + 1):
            micro = [values(c.locals) for c in run.calls_of(fn, step, step) if key in c.appended]
            if micro:
                steps.append([[micro]])
        out.append((row[key], steps))
    assert out, f"no train row logged {key!r}"
    return out


# ------------------------------------------------------------------------------------------- 0.15.2
W15 = dict(gradient_accumulation_steps=2, logging_steps=3, max_steps=9, beta=1.0, per_device_train_batch_size=4,
           num_generations=2, lr_scheduler_type="cosine_with_restarts", lr_scheduler_kwargs={"num_cycles": 2})
W15_CONFIG = {k: W15[k] for k in ("gradient_accumulation_steps", "logging_steps", "beta")}


@proof("trl", trainer="grpo", release="0.15.2", config=W15_CONFIG)
def test_grpo_0_15_loss_kl_generation_keys_and_lr(p, tmp_path):
    """TRL 0.15.2's GRPOTrainer: ``loss`` each micro-batch's mean of sequence token means of the per-token loss
    (grpo_trainer.py@v0.15.2:713), divided by gradient_accumulation_steps by the Trainer and averaged over the row's
    steps; ``kl`` the same reduction of the k3 term, gathered and averaged per micro-batch; ``completion_length``,
    ``rewards/{fn}``, ``reward_std`` once per generation (per micro-batch at this release), averaged over the row's
    generations; ``learning_rate`` the row's last step's rate after the scheduler stepped (transformers 4.49)."""
    from _support.fingerprint import fingerprint
    from _support.proofs_trl import masked, per_seq
    from _support.proofs_trl_grpo_old import lengths, reward_column, run_grpo_old
    run = run_grpo_old(tmp_path, reward_funcs=[length_reward, has_cat], **W15)
    p.check(run.windows == [(1, 3), (4, 6), (7, 9)], f"three rows of three steps: {run.windows}")
    gens = [c.step for c in run.calls if c.name == "_prepare_inputs"]
    p.check(gens == [s for s in range(1, 10) for _ in range(2)], f"a generation per micro-batch: {gens}")
    loss = [c for c in run.calls if c.name == "compute_loss"]
    toks = {int(c.locals["completion_mask"].sum()) for c in loss}
    p.check(len(loss) == 18 and len(toks) > 2, f"micro-batches of uneven token counts: {toks}")
    # the per-token loss with the micro-batch's completion mask (compute_loss's own tensors)
    p.assert_stated("loss", _obs(run, "loss", "compute_loss", masked("per_token_loss", "completion_mask")),
                    tokens=TOKEN_CANDIDATES, mini=("none",), window=WINDOWS, levels=("micro_batches", "window"),
                    rel=2e-4)
    p.assert_stated("kl", _obs(run, "kl", "compute_loss", masked("per_token_kl", "completion_mask")),
                    tokens=TOKEN_CANDIDATES, mini=("none",), window=WINDOWS, levels=("micro_batches", "window"),
                    rel=1e-5)
    p.assert_stated("completion_length", _obs(run, "completion_length", "compute_loss", lengths()),
                    tokens=("per_seq",), mini=("none",), window=WINDOWS, levels=(), rel=1e-5)
    for col, name in enumerate(("length_reward", "has_cat")):
        p.assert_stated(f"rewards/{name}", _obs(run, f"rewards/{name}", "_prepare_inputs", reward_column(col)),
                        tokens=("per_seq",), mini=("none",), window=WINDOWS, levels=(), rel=1e-5)
    p.assert_stated("reward_std", _obs(run, "reward_std", "_prepare_inputs", per_seq("std_grouped_rewards")),
                    tokens=("per_seq",), mini=("none",), window=WINDOWS, levels=(), rel=1e-5)
    rows = run.train_rows()
    opt = run.optimizer
    lr = [(row["learning_rate"], run.per_step(opt.lr_after, i)) for i, (_s, row) in enumerate(rows)]
    p.assert_stated("learning_rate", lr, tokens=("per_seq",), mini=("none",), window=WINDOWS, levels=())
    before = [(row["learning_rate"], run.per_step(opt.lr_before, i)) for i, (_s, row) in enumerate(rows)]
    with pytest.raises(AssertionError, match="no candidate"):
        fingerprint(before, tokens=("per_seq",), mini=("none",), window=WINDOWS)
    p.check(True, "the rate before the scheduler step fits no reduction (transformers 4.49)")


# ------------------------------------------------------------------------------------------- 0.16.1
W16 = dict(gradient_accumulation_steps=2, logging_steps=3, max_steps=12, num_iterations=2, beta=0.1, epsilon=1e-3,
           epsilon_high=1e-3, per_device_train_batch_size=4, num_generations=2)
W16_CONFIG = {k: W16[k] for k in ("gradient_accumulation_steps", "logging_steps", "num_iterations", "beta")}


@proof("trl", trainer="grpo", release="0.16.1", config=W16_CONFIG)
def test_grpo_0_16_loss_clip_ratio_and_generation_keys(p, tmp_path):
    """TRL 0.16.1's GRPOTrainer: ``loss`` each micro-batch's token mean of the clipped per-token loss (+ beta x k3)
    (grpo_trainer.py@v0.16.1:932), divided by gradient_accumulation_steps by the Trainer, averaged over the row's
    steps; ``clip_ratio`` each micro-batch's token fraction of per_token_loss1 < per_token_loss2, gathered and
    averaged, then averaged over the row's micro-batches; ``completion_length``, ``rewards/{fn}`` (nan-mean) and
    ``reward_std`` once per generation (two micro-batch generations every num_iterations steps), averaged over the
    row's generations."""
    from _support.proofs_trl import masked, per_seq
    from _support.proofs_trl_grpo_old import lengths, reward_column, run_grpo_old
    run = run_grpo_old(tmp_path, reward_funcs=[length_reward, has_cat_or_none], **W16)
    p.check(run.windows == [(1, 3), (4, 6), (7, 9), (10, 12)], f"four rows of three steps: {run.windows}")
    gen = "_generate_and_score_completions"
    gens = [c.step for c in run.calls if c.name == gen]
    p.check(gens == [s for s in (1, 3, 5, 7, 9, 11) for _ in range(2)], f"generations every 2 steps: {gens}")
    loss = [c for c in run.calls if c.name == "compute_loss"]
    p.check(len(loss) == 24 and any(float(c.locals["is_clipped"].sum()) > 0 for c in loss), "nothing clipped")
    p.assert_stated("loss", _obs(run, "loss", "compute_loss", masked("per_token_loss", "completion_mask")),
                    tokens=TOKEN_CANDIDATES, mini=("none",), window=WINDOWS, levels=("micro_batches", "window"),
                    rel=2e-4)
    p.assert_stated("clip_ratio", _obs(run, "clip_ratio", "compute_loss", masked("is_clipped", "completion_mask")),
                    tokens=TOKEN_CANDIDATES, mini=("none",), window=WINDOWS, levels=("micro_batches", "window"),
                    rel=1e-5)
    p.assert_stated("completion_length", _obs(run, "completion_length", gen, lengths()),
                    tokens=("per_seq",), mini=("none",), window=WINDOWS, levels=(), rel=1e-5)
    for col, name in enumerate(("length_reward", "has_cat_or_none")):
        p.assert_stated(f"rewards/{name}", _obs(run, f"rewards/{name}", gen, reward_column(col)),
                        tokens=("per_seq",), mini=("none",), window=WINDOWS, levels=(), rel=1e-5)
    p.assert_stated("reward_std", _obs(run, "reward_std", gen, per_seq("std_grouped_rewards")),
                    tokens=("per_seq",), mini=("none",), window=WINDOWS, levels=(), rel=1e-5)


# ------------------------------------------------------------------------------------------- 0.29.1
W29 = dict(gradient_accumulation_steps=2, logging_steps=3, max_steps=12, num_iterations=2, beta=0.1,
           per_device_train_batch_size=2, num_generations=2)
W29_CONFIG = {k: W29[k] for k in ("gradient_accumulation_steps", "logging_steps", "num_iterations", "beta")}


@proof("trl", trainer="grpo", release="0.29.1", config=W29_CONFIG)
def test_grpo_0_29_reward_is_the_unweighted_sum_averaged_over_generations(p, tmp_path):
    """TRL 0.29.1's GRPOTrainer: ``reward`` the mean over the generation batch (gathered) of each completion's
    unweighted nan-sum of the reward functions (``rewards = rewards_per_func.nansum(dim=1)``, TRL's own tensor as it
    logs it), averaged over the row's generations (one every num_iterations steps)."""
    from _support.proofs_trl import per_seq, run_grpo
    from _support.proofs_trl_old import fix_optional_imports
    fix_optional_imports()
    run = run_grpo(tmp_path, reward_funcs=[length_reward, has_cat_or_none], **W29)
    p.check(run.windows == [(1, 3), (4, 6), (7, 9), (10, 12)], f"four rows of three steps: {run.windows}")
    gen = "_generate_and_score_completions"
    gens = [c.step for c in run.calls if c.name == gen]
    p.check(gens == [1, 3, 5, 7, 9, 11], f"a generation every num_iterations optimizer steps: {gens}")
    p.assert_stated("reward", _obs(run, "reward", gen, per_seq("rewards")), tokens=("per_seq",), mini=("none",),
                    window=WINDOWS, levels=(), rel=1e-5)


# ------------------------------------------------------------------------------------------- 1.8.0
# a generation every 2 optimizer steps (steps_per_generation 4 micro-batches): a step's advantages do not sum to 0
W18 = dict(gradient_accumulation_steps=2, steps_per_generation=4, logging_steps=3, max_steps=12, beta=0.1,
           per_device_train_batch_size=3, num_generations=3)
W18_CONFIG = {k: W18[k] for k in ("gradient_accumulation_steps", "steps_per_generation", "logging_steps", "beta")}


@proof("trl", trainer="grpo_variants", release="1.8.0", config=W18_CONFIG)
def test_dppo_1_8_advantages_mask_ratio_and_prob_diff(p, tmp_path):
    """TRL 1.8.0's DPPOTrainer (trl/experimental/dppo/dppo_trainer.py@v1.8.0:1408-1446): advantages/mean and /std
    the process's micro-batch mean and sample std of its completions' advantages (the generation batch shuffled
    before it is split: groups straddle micro-batches), mask_ratio/* and prob_diff/mean each micro-batch's token
    mean over the completion tokens (the divergence-masked tokens, |p - p_sampling|), gathered per process and
    averaged; each appended once per micro-batch and averaged by log()."""
    from _support.proofs_trl import masked, per_seq
    from _support.proofs_trl_grpo_old import run_dppo
    run = run_dppo(tmp_path, reward_funcs=[length_reward, has_cat_or_none], epsilon=0.02, epsilon_high=0.02, **W18)
    p.check(run.windows == [(1, 3), (4, 6), (7, 9), (10, 12)], f"four rows of three steps: {run.windows}")
    loss = [c for c in run.calls if c.name == "_compute_loss"]
    p.check(len(loss) == 24, f"{len(loss)} micro-batches")
    p.check(any(abs(float(c.locals["advantages"].mean())) > 1e-3 for c in loss), "every micro-batch's mean is 0")
    adv = per_seq("advantages")
    p.assert_stated("advantages/mean", _obs(run, "advantages/mean", "_compute_loss", adv), tokens=("per_seq",),
                    mini=("none",), window=WINDOWS, levels=(), rel=1e-5)
    p.assert_stated("advantages/std", _obs(run, "advantages/std", "_compute_loss", adv), tokens=("per_seq",),
                    stats=("std",), mini=("none",), window=WINDOWS, levels=(), rel=1e-5)
    p.check(any(float(c.locals["is_masked"].sum()) > 0 for c in loss), "no token masked: weak")
    for key, tensor in (("mask_ratio/overall_mean", "is_masked"), ("mask_ratio/positive_adv_mean", "is_masked_pos"),
                        ("mask_ratio/negative_adv_mean", "is_masked_neg"), ("prob_diff/mean", "prob_diff")):
        p.assert_stated(key, _obs(run, key, "_compute_loss", masked(tensor)), tokens=TOKEN_CANDIDATES + ("per_seq",),
                        mini=("none",), window=WINDOWS, levels=("micro_batches", "window"), rel=1e-5)


G18 = dict(gradient_accumulation_steps=2, steps_per_generation=4, logging_steps=3, max_steps=12, beta=0.0,
           per_device_train_batch_size=3, num_generations=3)


def _g18_config(loss_type: str) -> dict:
    return {**{k: G18[k] for k in ("gradient_accumulation_steps", "steps_per_generation", "logging_steps", "beta")},
            "loss_type": loss_type}


@proof("trl", trainer="grpo", release="1.8.0", config=_g18_config("cispo"))
def test_grpo_1_8_cispo_clip_ratio(p, tmp_path):
    """TRL 1.8.0's GRPOTrainer, loss_type cispo (grpo_trainer.py@v1.8.0:3123-3127): cispo_clip_ratio is each
    micro-batch's token fraction of (coef_1 > epsilon_high) & (advantage > 0) over the completion tokens, gathered
    per process and averaged, appended once per micro-batch and averaged by log() (epsilon_high 1.0: every token whose
    ratio grew and whose advantage is positive)."""
    from _support.proofs_trl import masked, run_grpo
    from _support.proofs_trl_old import fix_optional_imports
    fix_optional_imports()
    run = run_grpo(tmp_path, reward_funcs=[length_reward, has_cat_or_none], loss_type="cispo", epsilon_high=1.0,
                   **G18)
    p.check(run.windows == [(1, 3), (4, 6), (7, 9), (10, 12)], f"four rows of three steps: {run.windows}")
    loss = [c for c in run.calls if c.name == "_compute_loss"]
    p.check(len(loss) == 24 and any(float(c.locals["is_cispo_clipped"].sum()) > 0 for c in loss), "nothing clipped")
    p.assert_stated("cispo_clip_ratio", _obs(run, "cispo_clip_ratio", "_compute_loss",
                                             masked("is_cispo_clipped", "mask")),
                    tokens=TOKEN_CANDIDATES, mini=("none",), window=WINDOWS, levels=("micro_batches", "window"),
                    rel=1e-5)


@proof("trl", trainer="grpo", release="1.8.0", config=_g18_config("vespo"))
def test_grpo_1_8_vespo_phi_seq_mean(p, tmp_path):
    """TRL 1.8.0's GRPOTrainer, loss_type vespo (grpo_trainer.py@v1.8.0:3128-3130): vespo/phi_seq_mean is the mean
    of the micro-batch's per-sequence gamma weights phi_seq (gathered from every process, nanmean), appended once per
    micro-batch and averaged by log()."""
    from _support.proofs_trl import masked, run_grpo
    from _support.proofs_trl_old import fix_optional_imports
    fix_optional_imports()
    run = run_grpo(tmp_path, reward_funcs=[length_reward, has_cat_or_none], loss_type="vespo", **G18)
    p.check(run.windows == [(1, 3), (4, 6), (7, 9), (10, 12)], f"four rows of three steps: {run.windows}")
    loss = [c for c in run.calls if c.name == "_compute_loss"]
    phis = {round(float(v), 6) for c in loss for v in c.locals["phi_seq"].flatten()}
    p.check(len(loss) == 24 and len(phis) > 3, f"phi_seq takes few values: {sorted(phis)[:6]}")
    p.assert_stated("vespo/phi_seq_mean", _obs(run, "vespo/phi_seq_mean", "_compute_loss", masked("phi_seq", "mask")),
                    tokens=("per_seq",) + TOKEN_CANDIDATES, mini=("none",), window=WINDOWS, levels=(), rel=1e-5)


KTO18 = dict(per_device_train_batch_size=3, gradient_accumulation_steps=2, logging_steps=3, max_steps=9, beta=0.1)
KTO18_CONFIG = {k: KTO18[k] for k in ("gradient_accumulation_steps", "logging_steps", "beta")}


def _every_logit(name: str):
    """Each example's values of _compute_loss's (n, T, V) ``chosen_logits`` / ``rejected_logits``: per position
    the sum over the vocabulary, at every position of the padded prompt + completion."""
    def values(loc):
        return [[float(v) for v in row] for row in loc[name].float().sum(-1)]
    return values


@proof("trl", trainer="kto", release="1.8.0", config=KTO18_CONFIG)
def test_kto_1_8_logits_are_example_sums_averaged_per_micro_batch(p, tmp_path):
    """TRL 1.8.0's KTOTrainer (trl/trainer/kto_trainer.py@v1.8.0:1615-1628): logits/chosen (rejected) is the sum of
    every logit of the micro-batch's desirable (undesirable) examples (every position of the padded sequence, every
    vocabulary entry), gathered and divided by their count: a mean over the micro-batch's examples of each example's
    logit sum, appended once per micro-batch that holds such examples and averaged by log() (not pooled over the row
    as 0.25.1's _sum/count pairs were)."""
    from _support.proofs_trl import run_kto
    from _support.proofs_trl_old import fix_optional_imports
    fix_optional_imports()
    run = run_kto(tmp_path, n_examples=11, **KTO18)
    calls = [c for c in run.calls if c.name == "_compute_loss"]
    p.check(len(run.windows) == 3 and len(calls) == 18, (run.windows, len(calls)))
    counts = {(int(c.locals["chosen_logits"].shape[0]), int(c.locals["rejected_logits"].shape[0])) for c in calls}
    p.check(len(counts) > 2, f"uneven desirable/undesirable counts: {counts}")
    for key, name in (("logits/chosen", "chosen_logits"), ("logits/rejected", "rejected_logits")):
        obs = _obs_appended(run, key, "_compute_loss", _every_logit(name))
        p.assert_stated(key, obs, window=WINDOWS, mini=("none",), levels=("micro_batches",), rel=1e-4)


# ------------------------------------------------------------------------------------------- DPO at 0.29.1
DPO29 = dict(per_device_train_batch_size=2, gradient_accumulation_steps=2, logging_steps=3, max_steps=9, beta=0.1)
DPO29_CONFIG = {k: DPO29[k] for k in ("gradient_accumulation_steps", "logging_steps", "beta")}


@proof("trl", trainer="dpo", release="0.29.1", config=DPO29_CONFIG)
def test_dpo_0_29_entropy_is_the_micro_batch_token_mean(p, tmp_path):
    """TRL 0.29.1's DPOTrainer (trl/trainer/dpo_trainer.py@v0.29.1:1376-1379): entropy is each micro-batch's token
    mean of the per-token entropy over the chosen and rejected completions' tokens (shift_completion_mask), gathered
    per process and averaged, appended once per micro-batch and averaged by log() (7 pairs: micro-batches of 2 and 1
    pairs, completions of uneven lengths)."""
    from _support.proofs_trl import masked, run_dpo
    from _support.proofs_trl_old import fix_optional_imports
    fix_optional_imports()
    run = run_dpo(tmp_path, n_pairs=7, **DPO29)
    calls = [c for c in run.calls if c.name == "_compute_loss"]
    p.check(len(run.windows) == 3 and len(calls) == 18, (run.windows, len(calls)))
    sizes = {int(c.locals["shift_completion_mask"].shape[0]) for c in calls}
    p.check(sizes == {2, 4}, f"micro-batches of 1 and 2 pairs: {sizes}")
    p.assert_stated("entropy", _obs(run, "entropy", "_compute_loss", masked("per_token_entropy",
                                                                            "shift_completion_mask")),
                    tokens=TOKEN_CANDIDATES, mini=("none",), window=WINDOWS, levels=("micro_batches", "window"),
                    rel=1e-5)


# ------------------------------------------------------------------------------------------- SSD at 1.12.0
SSD12 = dict(per_device_train_batch_size=4, gradient_accumulation_steps=2, logging_steps=3, max_steps=9,
             max_completion_length=16)
SSD12_CONFIG = {k: SSD12[k] for k in ("gradient_accumulation_steps", "logging_steps")}


@proof("trl", trainer="ssd", release="1.12.0", config=SSD12_CONFIG)
def test_ssd_1_12_completion_lengths(p, tmp_path):
    """TRL 1.12.0's SSDTrainer (trl/experimental/ssd/ssd_trainer.py@v1.12.0:465-471): completions/{mean,min,max}_length
    the statistic of the generation batch's completion lengths (gathered; a completion filter_empty drops counts 0),
    once per generation (one per optimizer step) and averaged over the row's generations."""
    from _support.proofs_trl_grpo_old import lengths, run_ssd
    run = run_ssd(tmp_path, **SSD12)
    p.check(run.windows == [(1, 3), (4, 6), (7, 9)], f"three rows of three steps: {run.windows}")
    gen = "_build_buffered_batch"
    p.check([c.step for c in run.calls if c.name == gen] == list(range(1, 10)), "a generation per optimizer step")
    kept = [int((c.locals["completion_mask"].sum(1) > 0).sum()) for c in run.calls if c.name == gen]
    p.check(len(set(kept)) > 1, f"filter_empty keeps every generation's completions alike: {kept}")
    for stat in ("mean", "min", "max"):
        p.assert_stated(f"completions/{stat}_length", _obs(run, f"completions/{stat}_length", gen, lengths()),
                        tokens=("per_seq",), stats=(stat,), mini=("none",), window=WINDOWS, levels=(), rel=1e-5)
