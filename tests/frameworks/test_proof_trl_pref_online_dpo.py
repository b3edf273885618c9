"""Fingerprint proofs of mappings/trl.yaml for TRL's experimental OnlineDPOTrainer (issue 33 item 1). The installed
TRL (1.16.0) trains a tiny model on CPU (tests/_support/proofs_trl_pref.py): 7 prompts, per_device_train_batch_size 2,
gradient_accumulation_steps 2 (micro-batches of 2 and 1 prompts, two completions each, of uneven lengths),
logging_steps 3, 6 steps. ``training_step`` appends one value per micro-batch to ``self.stats``;
``_maybe_log_save_evaluate`` logs ``sum(val) / len(val)`` of each (the row's micro-batches, unweighted) and
``round(tr_loss / steps, 4)`` as the loss. The per-call batches are the tensors ``training_step`` held (its locals as
it returned).

The sampled completions' per-token log-probs are not masked before objective/kl, objective/entropy and
objective/non_score_reward sum them (``kl.sum(1)``, ``-logprobs.sum(1)``: the padding positions after EOS count):
the proofs give every position of the padded completion and check the completion tokens alone give another value.
"""
from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from pathlib import Path

import pytest

pytest.importorskip("trl")
pytest.importorskip("datasets")

from _support import fingerprint as FP  # noqa: E402
from _support.proofs_trl import TRLRun, per_seq  # noqa: E402
from _support.proofs_trl_pref import run_online_dpo  # noqa: E402
from _support.proven import close, proof  # noqa: E402

RELEASE = "1.16.0"
WINDOWS = ("mean", "last", "sum", "none")
ODPO = dict(per_device_train_batch_size=2, gradient_accumulation_steps=2, logging_steps=3, max_steps=6, beta=0.1,
            loss_type="ipo", lr_scheduler_type="cosine_with_restarts", lr_scheduler_kwargs={"num_cycles": 5},
            accelerator_config={"dispatch_batches": False})
CONFIG = {k: ODPO[k] for k in ("gradient_accumulation_steps", "logging_steps", "beta", "loss_type")}
N_PROMPTS = 7
STEP = "training_step"

_WORK = Path(tempfile.mkdtemp(prefix="trl-pref-proofs-"))
atexit.register(shutil.rmtree, _WORK, True)


@functools.lru_cache(maxsize=None)
def _odpo() -> TRLRun:
    """The prompts as an iterable dataset (no length): every micro-batch's gathers whole, 2 and 1 prompts."""
    return run_online_dpo(_WORK / "online_dpo", n_prompts=N_PROMPTS, iterable=True, **ODPO)


@functools.lru_cache(maxsize=None)
def _odpo_sized() -> TRLRun:
    """The prompts as a sized dataset (7 prompts, batches of 2: a remainder of 1)."""
    return run_online_dpo(_WORK / "online_dpo_sized", n_prompts=N_PROMPTS, **ODPO)


def _obs(run: TRLRun, key: str, values) -> list:
    out = [(row[key], run.steps(i, STEP, values)) for i, (_s, row) in enumerate(run.train_rows()) if key in row]
    assert out, f"no train row logged {key!r}"
    return out


def _rows(tensor, rows=None, mask: bool = True):
    """Each completion's per-token values of a (2B, T) tensor of training_step's locals (``rows``: index tensor of the
    completions to take, all by default), at its completion tokens (``mask``) or at every position."""
    def values(loc):
        x = tensor(loc).detach().float()
        m = loc["completion_mask"].bool()
        idx = range(x.shape[0]) if rows is None else loc[rows].tolist()
        return [[float(v) for v in (x[i][m[i]] if mask else x[i])] for i in idx]
    return values


def _kl(loc):
    return loc["logprobs"] - loc["ref_logprobs"]


#: the order of training_step's gather_for_metrics calls (with reward functions): what each gathered
GATHERED = ("scores_margin_mean", "rewards_mean", "chosen_logprobs_sum", "rejected_logprobs_sum", "mean_kl",
            "mean_non_score_reward", "rlhf_reward", "mean_entropy", "chosen_rewards", "rejected_rewards")


def _gathered(name: str):
    """The per-completion (per-pair) values accelerate's gather_for_metrics returned for ``name``: what TRL took
    the mean of (on an epoch's last step, truncated to the dataset's remainder)."""
    def values(loc):
        return [[float(v)] for v in loc["_gathered"][GATHERED.index(name)].flatten()]
    return values


def _kept_logps(rows: str, gathered: str):
    """The completion-token log-probs of the chosen (rejected) completions that gather_for_metrics kept (its first
    len(gathered) rows), checked to sum to what it gathered."""
    def values(loc):
        kept = loc["_gathered"][GATHERED.index(gathered)].flatten()
        seqs = _rows(lambda loc: loc["logprobs"], rows)(loc)[:len(kept)]
        assert all(close(sum(s), float(k), 1e-4) for s, k in zip(seqs, kept)), (seqs, kept)
        return seqs
    return values


@proof("trl", trainer="online_dpo", release=RELEASE, config=CONFIG)
def test_online_dpo_pair_means_average_the_rows_micro_batches(p):
    """rewards/*, logps/*, objective/rlhf_reward: the mean over the micro-batch's pairs (completions) gathered from
    every process (accelerate's gather_for_metrics), one value per micro-batch; objective/scores and
    objective/scores_margin: the process's mean, gathered and averaged; the row averages its micro-batches."""
    run = _odpo()
    calls = [c for c in run.calls if c.name == STEP]
    sizes = [int(c.locals["batch_size"]) for c in calls]
    p.check(set(sizes) == {1, 2}, f"micro-batches of 2 and 1 prompts: {sizes}")
    p.check(all(len(c.locals["_gathered"]) == len(GATHERED) for c in calls), "one gather per metric")
    p.check(all(c.locals["_gathered"][8] is c.locals["gathered_chosen_rewards"] for c in calls), "gather order")
    per_pair = (("rewards/chosen", _gathered("chosen_rewards")), ("rewards/rejected", _gathered("rejected_rewards")),
                ("rewards/margins", per_seq("margin")), ("rewards/accuracies", per_seq("accuracy")),
                ("objective/rlhf_reward", _gathered("rlhf_reward")),
                ("objective/scores", per_seq("rewards")), ("objective/scores_margin", per_seq("scores_margin")))
    for key, values in per_pair:
        p.assert_stated(key, _obs(run, key, values), tokens=("per_seq",), mini=("none",), window=WINDOWS,
                        levels=("micro_batches", "window"), rel=1e-5)
    p.check(any(0 < r["rewards/accuracies"] < 1 for _s, r in run.train_rows()), "accuracy 0 or 1 everywhere: weak")
    for key, rows, gathered in (("logps/chosen", "chosen_indices", "chosen_logprobs_sum"),
                                ("logps/rejected", "rejected_indices", "rejected_logprobs_sum")):
        p.assert_stated(key, _obs(run, key, _kept_logps(rows, gathered)),
                        tokens=("seq_mean_token_sum", "token_mean", "seq_mean_token_mean", "token_sum"),
                        mini=("none",), window=WINDOWS, levels=("micro_batches", "window"), rel=1e-5)
        p.check(all(row[key] < 0 for _s, row in run.train_rows()), f"{key}: log-probs are negative")
    # the chosen completion is the higher-scored one of its pair: scores_margin >= 0 in every micro-batch
    p.check(all(float(c.locals["scores_margin"].min()) >= 0 for c in calls), "chosen first")


@proof("trl", trainer="online_dpo", release=RELEASE, config=CONFIG)
def test_online_dpo_gathers_drop_samples_at_a_sized_epochs_end(p):
    """With a sized dataset whose length the batch does not divide, the Trainer fetches a step's micro-batches
    before running them, so accelerate is at the dataloader's end for the whole last step of an epoch and
    gather_for_metrics truncates every per-sample gather of that step to the remainder (1 of 7): a micro-batch of 2
    pairs there logs the mean of its first pair. The logged value is still the stated reduction of what was
    gathered."""
    run = _odpo_sized()
    calls = [c for c in run.calls if c.name == STEP]
    cut = [c for c in calls if len(c.locals["_gathered"][8]) < int(c.locals["batch_size"])]
    p.check(cut and all(len(c.locals["_gathered"][8]) == N_PROMPTS % ODPO["per_device_train_batch_size"]
                        for c in cut), "a gather truncated to the remainder at each epoch's end")
    whole = [[[float(v)] for v in c.locals["chosen_rewards"]] for c in calls]
    p.check(any(not close(sum(v[0] for v in w) / len(w), float(c.locals["_gathered"][8].mean()), 1e-6)
                for w, c in zip(whole, calls)), "the truncated mean differs from the micro-batch's")
    for key, values in (("rewards/chosen", _gathered("chosen_rewards")),
                        ("rewards/rejected", _gathered("rejected_rewards"))):
        p.assert_stated(key, _obs(run, key, values), tokens=("per_seq",), mini=("none",), window=WINDOWS,
                        levels=("window",), rel=1e-5)


@proof("trl", trainer="online_dpo", release=RELEASE, config=CONFIG)
def test_online_dpo_kl_entropy_and_penalty_sum_every_completion_position(p):
    """objective/kl (k1: log pi - log pi_ref), objective/entropy (-log pi of the sampled tokens) and
    objective/non_score_reward (-beta x k1): summed per completion over every position of the padded completion,
    averaged over the micro-batch's completions, gathered, one value per micro-batch, averaged over the row."""
    run = _odpo()
    padded = [c for c in run.calls if c.name == STEP and not bool(c.locals["completion_mask"].bool().all())]
    p.check(len(padded) >= 3, "completions of uneven lengths: padding after EOS in most micro-batches")
    keys = (("objective/kl", _kl, 1.0), ("objective/entropy", lambda loc: -loc["logprobs"], 1.0),
            ("objective/non_score_reward", lambda loc: -loc["self"].beta * _kl(loc), -ODPO["beta"]))
    for key, tensor, _scale in keys:
        obs = _obs(run, key, _rows(tensor, mask=False))
        found = p.assert_stated(key, obs, tokens=("seq_mean_token_sum", "token_mean", "seq_mean_token_mean",
                                                  "token_sum"),
                                mini=("none",), window=WINDOWS, levels=("micro_batches", "window"), rel=1e-5)
        # the completion tokens alone are another number: the padding positions are in the sums
        masked = _obs(run, key, _rows(tensor, mask=True))
        p.check(any(not close(v, FP.value_of(b, found), 1e-4) for v, b in masked), f"{key}: padding not counted?")
    # sign and scale: the penalty is -beta times the kl, the entropy (-log p summed) positive
    for _s, row in run.train_rows():
        p.check(close(row["objective/non_score_reward"], -ODPO["beta"] * row["objective/kl"], 1e-5)
                and not close(row["objective/non_score_reward"], row["objective/kl"], 1e-5), row)
        p.check(row["objective/entropy"] > 0, row)


@proof("trl", trainer="online_dpo", release=RELEASE, config=CONFIG)
def test_online_dpo_eos_share_is_the_logging_process_completions(p):
    """val/contain_eos_token: the share of the micro-batch's completions (this process's: not gathered) holding an
    EOS token, one value per micro-batch, averaged over the row; the entry maps it to response/clip_ratio as
    1 - the share."""
    run = _odpo()
    obs = _obs(run, "val/contain_eos_token", per_seq("contain_eos_token"))
    p.check(any(0 < v < 1 for v, _b in obs), "some completions end without EOS")
    p.assert_stated("val/contain_eos_token", obs, tokens=("per_seq",), mini=("none",), window=WINDOWS,
                    levels=("micro_batches", "window"))
    entry, _res = p.entry("val/contain_eos_token")
    p.check(close(entry.scale, -1.0) and close(entry.offset, 1.0), f"clip ratio = 1 - share: {entry.scale}, "
                                                                   f"{entry.offset}")
    share = obs[0][0]
    p.check(close(entry.to_canonical(share), 1.0 - share) and not close(entry.to_canonical(share), share),
            "the canonical value is 1 - the logged share")


@proof("trl", trainer="online_dpo", release=RELEASE, config=CONFIG)
def test_online_dpo_loss_and_learning_rate(p):
    """loss: training_step returns the micro-batch's mean over pairs / gradient_accumulation_steps; the Trainer sums
    them per step, and _maybe_log_save_evaluate logs round(sum / steps, 4): the micro-batches' unweighted mean, the
    mean of the row's steps. learning_rate: the rate of the row's last step, before the scheduler steps."""
    run = _odpo()
    p.assert_stated("loss", _obs(run, "loss", per_seq("losses")), tokens=("per_seq",), mini=("none",),
                    window=WINDOWS, levels=("micro_batches", "window"), rel=1e-5)
    p.check(all(round(r["loss"], 4) == r["loss"] for _s, r in run.train_rows()), "rounded to 4 decimals")
    opt = run.optimizer
    lr_obs = [(row["learning_rate"], run.per_step(opt.lr_before, i)) for i, (_s, row) in enumerate(run.train_rows())]
    p.assert_stated("learning_rate", lr_obs, tokens=("per_seq",), mini=("none",), window=WINDOWS, levels=())
