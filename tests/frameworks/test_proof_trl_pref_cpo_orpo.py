"""Fingerprint proofs of mappings/trl.yaml for TRL's experimental CPOTrainer and ORPOTrainer (issue 33 item 1). The
installed TRL (1.16.0) trains a tiny model on CPU (tests/_support/proofs_trl_pref.py): 7 preference pairs,
per_device_train_batch_size 2, gradient_accumulation_steps 2 (micro-batches of 2 and 1 pairs of uneven lengths),
logging_steps 3, 9 steps. ``get_batch_loss_metrics`` returns one value per micro-batch of each key (gathered with
accelerate's gather_for_metrics), ``store_metrics`` files it and ``log()`` averages the row's micro-batches
unweighted. The tokenized rows are handed to the Trainer without a length (an iterable dataset), so accelerate knows
no remainder and truncates no gather at an epoch's end (tests/frameworks/test_proof_trl_pref_online_dpo.py shows
what it does to a sized dataset's last step).

The batches are the tensors TRL computed, recorded as each function returned: ``concatenated_forward``'s logits and
labels (the per-token log-probs of the label tokens taken from them), the loss function's per-pair values, and what
``gather_for_metrics`` returned.
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

from _support.proofs_trl import TRLRun, per_seq  # noqa: E402
from _support.proofs_trl_pref import label_logps, label_nll, paired, per_call_obs, run_cpo_orpo  # noqa: E402
from _support.proven import close, proof  # noqa: E402

RELEASE = "1.16.0"
WINDOWS = ("mean", "last", "sum", "none")
RUN = dict(per_device_train_batch_size=2, gradient_accumulation_steps=2, logging_steps=3, max_steps=9, beta=0.1,
           accelerator_config={"dispatch_batches": False})
N_PAIRS = 7
CONFIG = {**{k: RUN[k] for k in ("gradient_accumulation_steps", "logging_steps", "beta")}, "loss_type": "sigmoid"}
ORPO_CONFIG = {k: RUN[k] for k in ("gradient_accumulation_steps", "logging_steps", "beta")}
#: the order of get_batch_loss_metrics' gather_for_metrics calls
GATHERED = ("chosen_rewards", "rejected_rewards", "reward_accuracies", "margins", "rejected_logps", "chosen_logps",
            "rejected_logits", "chosen_logits", "nll_loss", "log_odds_ratio", "log_odds_chosen")

_WORK = Path(tempfile.mkdtemp(prefix="trl-pref-proofs-"))
atexit.register(shutil.rmtree, _WORK, True)


@functools.lru_cache(maxsize=None)
def _run(kind: str) -> tuple[TRLRun, list]:
    run = run_cpo_orpo(kind, _WORK / kind, n_pairs=N_PAIRS, iterable=True, **RUN)
    return run, paired(run)


def _gathered(name: str):
    def values(loc):
        return [[float(v)] for v in loc["_gathered"][GATHERED.index(name)].flatten()]
    return values


def _fwd(fn, *args):
    def values(loc):
        return fn(loc["fwd"], *args)
    return values


def _mean_logits(chosen: bool):
    """Each chosen (rejected) sequence's per-position mean logit over the vocabulary of the logits TRL averaged
    (policy_chosen_logits: every position of the padded sequence, prompt and padding included)."""
    def values(loc):
        x = loc["policy_chosen_logits" if chosen else "policy_rejected_logits"].detach().float().mean(-1)
        return [[float(v) for v in row] for row in x]
    return values


def _check_common(p, kind: str, run: TRLRun, calls: list) -> None:
    sizes = [int(c.locals["fwd"]["len_chosen"]) for c in calls]
    p.check(set(sizes) == {1, 2}, f"{kind}: micro-batches of 2 and 1 pairs: {sizes}")
    n = 11 if kind == "orpo" else 9
    p.check(all(len(c.locals["_gathered"]) == n for c in calls), f"{kind}: one gather per metric")
    p.check(len(calls) == 2 * RUN["max_steps"], f"{kind}: a call per micro-batch")


def _pair_keys(p, kind: str, run: TRLRun, calls: list, token_mean_logps: bool) -> None:
    """rewards/* (reference-free: beta x the policy's log-prob) over the micro-batch's pairs, gathered, averaged;
    logps/*: the sequences' label-token log-prob sums (CPO sigmoid) or token means (ORPO)."""
    for key, values in (("rewards/chosen", per_seq("chosen_rewards")),
                        ("rewards/rejected", per_seq("rejected_rewards")),
                        ("rewards/margins", _gathered("margins")),
                        ("rewards/accuracies", per_seq("reward_accuracies"))):
        p.assert_stated(key, per_call_obs(run, calls, key, values), tokens=("per_seq",), mini=("none",),
                        window=WINDOWS, levels=("micro_batches", "window"), rel=1e-5)
    p.check(any(0 < r["rewards/accuracies"] < 1 for _s, r in run.train_rows()), "accuracy 0 or 1 everywhere: weak")
    for c in calls:             # the label tokens are the ones TRL's get_batch_logps reduced
        for chosen, name in ((True, "policy_chosen_logps"), (False, "policy_rejected_logps")):
            seqs = label_logps(c.locals["fwd"], chosen)
            red = [sum(s) / len(s) if token_mean_logps else sum(s) for s in seqs]
            p.check(all(close(a, float(b), 1e-4) for a, b in zip(red, c.locals[name])), (kind, name))
    for key, chosen in (("logps/chosen", True), ("logps/rejected", False)):
        p.assert_stated(key, per_call_obs(run, calls, key, _fwd(label_logps, chosen)),
                        tokens=("seq_mean_token_sum", "seq_mean_token_mean", "token_mean"), mini=("none",),
                        window=WINDOWS, levels=("micro_batches", "window"), rel=1e-5)
    for _s, row in run.train_rows():
        p.check(close(row["rewards/chosen"], RUN["beta"] * row["logps/chosen"], 1e-5)
                and not close(row["rewards/chosen"], -RUN["beta"] * row["logps/chosen"], 1e-5), row)


def _token_keys(p, kind: str, run: TRLRun, calls: list) -> None:
    """logits/*: the mean raw logit over every position and the vocabulary of the micro-batch's padded sequences
    (prompt and padding included), the process's mean gathered and averaged; nll_loss: CrossEntropyLoss over the
    chosen sequences' label tokens (the process's token mean, gathered and averaged)."""
    for key, chosen in (("logits/chosen", True), ("logits/rejected", False)):
        p.assert_stated(key, per_call_obs(run, calls, key, _mean_logits(chosen)),
                        tokens=("token_mean", "seq_mean_token_mean"), mini=("none",), window=WINDOWS,
                        levels=("micro_batches", "window"), rel=1e-5)
    p.assert_stated("nll_loss", per_call_obs(run, calls, "nll_loss", _fwd(label_nll)),
                    tokens=("token_mean", "seq_mean_token_mean"), mini=("none",), window=WINDOWS,
                    levels=("micro_batches", "window"), rel=1e-5)
    p.check(all(r["nll_loss"] > 0 for _s, r in run.train_rows()), "a negative log-likelihood is positive")
    # which tokens: CPO's labels are the completion's (the prompt is -100), ORPO's every attention-mask token
    prompt_in = [bool(((c.locals["fwd"]["labels"] != -100)
                       & (c.locals["fwd"]["concatenated_batch"]["concatenated_labels"] == -100)).any()) for c in calls]
    p.check(all(prompt_in) if kind == "orpo" else not any(prompt_in), f"{kind}: nll tokens {prompt_in}")


@proof("trl", trainer="cpo", release=RELEASE, config=CONFIG)
def test_cpo_pair_and_token_keys(p):
    """CPO (loss_type sigmoid): rewards/*, logps/* (sums over the completion's label tokens), logits/*, nll_loss
    (over the chosen completions' label tokens: the prompt is masked)."""
    run, calls = _run("cpo")
    _check_common(p, "cpo", run, calls)
    _pair_keys(p, "cpo", run, calls, token_mean_logps=False)
    _token_keys(p, "cpo", run, calls)


@proof("trl", trainer="orpo", release=RELEASE, config=ORPO_CONFIG)
def test_orpo_pair_and_token_keys(p):
    """ORPO: rewards/*, logps/* (average_log_prob: token means over the completion's label tokens), logits/*,
    nll_loss (over the chosen sequences' attention-mask tokens: prompt and completion)."""
    run, calls = _run("orpo")
    _check_common(p, "orpo", run, calls)
    _pair_keys(p, "orpo", run, calls, token_mean_logps=True)
    _token_keys(p, "orpo", run, calls)


@proof("trl", trainer="orpo", release=RELEASE, config=ORPO_CONFIG)
def test_orpo_log_odds(p):
    """log_odds_ratio: the mean over the micro-batch's pairs of log sigmoid(log odds(chosen) - log odds(rejected));
    log_odds_chosen: the mean of the log odds ratio itself; each the process's mean, gathered and averaged, one
    value per micro-batch, averaged over the row."""
    run, calls = _run("orpo")
    for key, values in (("log_odds_ratio", lambda loc: [[float(v)] for v in loc["loss_fn"]["ratio"].flatten()]),
                        ("log_odds_chosen", lambda loc: [[float(v)] for v in loc["loss_fn"]["log_odds"].flatten()])):
        p.assert_stated(key, per_call_obs(run, calls, key, values), tokens=("per_seq",), mini=("none",),
                        window=WINDOWS, levels=("micro_batches", "window"), rel=1e-5)
    p.check(all(r["log_odds_ratio"] < 0 for _s, r in run.train_rows()), "a log-sigmoid is negative")
