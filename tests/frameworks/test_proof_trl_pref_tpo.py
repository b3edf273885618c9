"""Fingerprint proofs of mappings/trl.yaml for TRL's experimental TPOTrainer (issue 33 item 1). The installed TRL
(1.16.0) trains a tiny model on CPU (tests/_support/proofs_trl_pref.py): 7 (prompt, chosen, rejected, reference)
rows, per_device_train_batch_size 2, gradient_accumulation_steps 2 (micro-batches of 2 and 1 triples, completions of
uneven lengths), logging_steps 3, 9 steps. ``_compute_loss`` appends one value per micro-batch to ``_metrics`` (its
locals copied as it appends: tests/_support/proofs_trl.py's MetricsRecorder) and ``log()`` averages the row's
micro-batches unweighted. The batch is laid out [chosen; rejected; reference] (tpo_alpha 1: the NLL branch on).

* sigmoid (the default): logps/* are completion log-prob sums; tpo-l: token means per completion (a second run).
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

from _support.proofs_trl import TRLRun, counter_obs, masked, per_seq, running_tokens  # noqa: E402
from _support.proofs_trl_pref import run_tpo  # noqa: E402
from _support.proven import proof  # noqa: E402

RELEASE = "1.16.0"
WINDOWS = ("mean", "last", "sum", "none")
TPO = dict(per_device_train_batch_size=2, gradient_accumulation_steps=2, logging_steps=3, max_steps=9, beta=0.1,
           include_num_input_tokens_seen="all")
N_TRIPLES = 7
FN = "_compute_loss"
CONFIG = {**{k: TPO[k] for k in ("gradient_accumulation_steps", "logging_steps", "beta")}, "loss_type": "sigmoid"}
CONFIG_L = {**CONFIG, "loss_type": "tpo-l"}

_WORK = Path(tempfile.mkdtemp(prefix="trl-pref-proofs-"))
atexit.register(shutil.rmtree, _WORK, True)


@functools.lru_cache(maxsize=None)
def _tpo(loss_type: str = "sigmoid") -> TRLRun:
    return run_tpo(_WORK / f"tpo-{loss_type}", n_triples=N_TRIPLES, loss_type=loss_type, **TPO)


def _obs(run: TRLRun, key: str, values) -> list:
    out = [(row[key], run.steps(i, FN, values)) for i, (_s, row) in enumerate(run.train_rows()) if key in row]
    assert out, f"no train row logged {key!r}"
    return out


def _branch(tensor: str, branch: int):
    """Each completion's per-token values of a (3B, T) tensor at its completion tokens, for one branch of the batch
    (0 chosen, 1 rejected)."""
    def values(loc):
        x = loc[tensor].detach().float().chunk(loc["n_branches"], dim=0)[branch]
        m = loc["shift_completion_mask"].bool().chunk(loc["n_branches"], dim=0)[branch]
        return [[float(v) for v in x[i][m[i]]] for i in range(x.shape[0])]
    return values


def _mean_logits(which: str):
    """Each chosen (rejected) completion's per-token mean logit over the vocabulary (TRL's ``logits.mean(-1)``) at
    its completion tokens."""
    def values(loc):
        x = loc[f"{which}_logits"].float().mean(-1)
        m = loc[f"{which}_mask"].bool()
        return [[float(v) for v in x[i][m[i]]] for i in range(x.shape[0])]
    return values


@proof("trl", trainer="tpo", release=RELEASE, config=CONFIG)
def test_tpo_pair_means_average_the_rows_micro_batches(p):
    """rewards/* (beta x the completion log-prob: reference-free) and logps/* (the completion log-prob sums): the
    mean over the micro-batch's pairs gathered from every process, one value per micro-batch, averaged."""
    run = _tpo()
    sizes = [len(c.locals["chosen_rewards"]) for c in run.calls if c.name == FN]
    p.check(set(sizes) == {1, 2}, f"micro-batches of 2 and 1 triples: {sizes}")
    p.check(all(c.locals["n_branches"] == 3 for c in run.calls if c.name == FN), "[chosen; rejected; reference]")
    for key, values in (("rewards/chosen", per_seq("chosen_rewards")),
                        ("rewards/rejected", per_seq("rejected_rewards")),
                        ("rewards/margins", per_seq("margins")),
                        ("rewards/accuracies", per_seq("reward_accuracies"))):
        p.assert_stated(key, _obs(run, key, values), tokens=("per_seq",), mini=("none",), window=WINDOWS,
                        levels=("micro_batches", "window"), rel=1e-5)
    for key, branch in (("logps/chosen", 0), ("logps/rejected", 1)):
        p.assert_stated(key, _obs(run, key, _branch("per_token_logps", branch)),
                        tokens=("seq_mean_token_sum", "token_mean", "seq_mean_token_mean"), mini=("none",),
                        window=WINDOWS, levels=("micro_batches", "window"), rel=1e-5)
    for _s, row in run.train_rows():       # reference-free rewards: beta x the logged log-probs, same sign
        p.check(abs(row["rewards/chosen"] - TPO["beta"] * row["logps/chosen"]) < 1e-5, row)


@proof("trl", trainer="tpo", release=RELEASE, config=CONFIG_L)
def test_tpo_length_normalised_logps_with_tpo_l(p):
    """loss_type tpo-l (and ipo): logps = the completion log-prob sum over the completion length: each pair's token
    means averaged over the micro-batch's pairs."""
    run = _tpo("tpo-l")
    for key, branch in (("logps/chosen", 0), ("logps/rejected", 1)):
        p.assert_stated(key, _obs(run, key, _branch("per_token_logps", branch)),
                        tokens=("seq_mean_token_sum", "token_mean", "seq_mean_token_mean"), mini=("none",),
                        window=WINDOWS, levels=("micro_batches", "window"), rel=1e-5)


@proof("trl", trainer="tpo", release=RELEASE, config=CONFIG)
def test_tpo_token_means_and_token_counter(p):
    """entropy: the process's token mean over every branch's completion tokens, gathered and averaged; logits/*:
    the micro-batch's sum of per-token mean logits over its completion tokens (sums and counts gathered);
    mean_token_accuracy: the chosen completions' top-1 hits over their tokens (counts gathered); one value per
    micro-batch, averaged. num_tokens: the running total of attention-mask tokens at the row's last step."""
    run = _tpo()
    for key, values in (("entropy", masked("per_token_entropy", "shift_completion_mask")),
                        ("logits/chosen", _mean_logits("chosen")), ("logits/rejected", _mean_logits("rejected")),
                        ("mean_token_accuracy", masked("correct_predictions", "chosen_bool_mask"))):
        p.assert_stated(key, _obs(run, key, values), tokens=("token_mean", "seq_mean_token_mean"), mini=("none",),
                        window=WINDOWS, levels=("micro_batches", "window"), rel=1e-5)
    p.check(any(0 < r["mean_token_accuracy"] < 1 for _s, r in run.train_rows()), "accuracy 0 or 1 everywhere: weak")
    tokens = running_tokens(run, FN, lambda loc: loc["inputs"]["attention_mask"])
    p.check(len(set(tokens)) == len(tokens), f"a running total grows every step: {tokens}")
    p.assert_stated("num_tokens", counter_obs(run, "num_tokens", tokens), levels=())
    # HF's num_input_tokens_seen (include_num_input_tokens_seen "all"): the running total of every micro-batch's
    # input_ids.numel() (padding included), gathered, at the row's last step
    seen = running_tokens(run, FN, lambda loc: loc["inputs"]["input_ids"].new_ones(loc["inputs"]["input_ids"].shape))
    p.check(any(not math.isclose(a, b) for a, b in zip(seen, tokens)), "padding counted: more than the mask's tokens")
    p.assert_stated("num_input_tokens_seen", counter_obs(run, "num_input_tokens_seen", seen), levels=())
