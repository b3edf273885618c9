"""Fingerprint proofs of mappings/trl.yaml's DPO, CPO and ORPO entries that end at v0.13.0 (or v0.11.4), run at trl
0.11.4 and 0.13.0 with the transformers of their time (tests/releases.txt; each proof runs in a child process whose
sys.path starts with the release: tests/_support/releases.py; tests/_support/proofs_trl_pref_old.py trains the
release's own trainer).

7 pairs, per_device_train_batch_size 2, gradient_accumulation_steps 2 (micro-batches of 2, 2, 2 and 1 pairs per
epoch, completions of uneven lengths), logging_steps 3, 9 steps (three rows, each crossing an epoch's end). Each
micro-batch's metrics are means over its pairs (tokens), stored once per micro-batch, and ``log()`` averages the
row's stored values: one process, no gather at these releases. CPO at 0.13.0 also runs a cosine-with-restarts rate for
the v0.2.0..v0.18.2 learning_rate entry (transformers 4.46.3: the rate after the scheduler stepped).

IterativeSFTTrainer at 0.13.0 (loss, learning_rate) is driven through its own ``step()`` API: 3 calls of 8 texts,
micro-batches of 2, one optimizer step each, logging_steps 3.

Not proven here (tests/_support/proofs_trl_pref_old.py's ENTRY_WHY): BCO's v0.10..v0.11.4 logits/* (never written at
0.11.4) and rewards/margins (a difference of two pooled means).
"""
from __future__ import annotations

import math
from typing import Any

import pytest

pytest.importorskip("trl")
pytest.importorskip("datasets")

from _support.proven import proof  # noqa: E402

WINDOWS = ("mean", "last", "sum", "none")
TOKENS = ("seq_mean_token_sum", "token_mean", "seq_mean_token_mean", "token_sum")
RUN = dict(per_device_train_batch_size=2, gradient_accumulation_steps=2, logging_steps=3, max_steps=9, beta=0.1)
CONFIG = {k: RUN[k] for k in ("gradient_accumulation_steps", "logging_steps", "beta")}
METRICS = "get_batch_loss_metrics"


def _obs(run, key: str, values) -> list:
    out = [(row[key], run.steps(i, METRICS, values)) for i, (_s, row) in enumerate(run.train_rows()) if key in row]
    assert out, f"no train row logged {key!r}"
    return out


def _per_pair(fn):
    """One value per pair: ``fn(get_batch_loss_metrics's locals)``, a (B,) tensor."""
    def values(loc):
        return [[float(v)] for v in fn(loc).detach().float().flatten()]
    return values


def _n_chosen(fwd) -> int:
    return int(fwd["len_chosen"] if "len_chosen" in fwd else fwd["num_examples"])


def _token_logps(chosen: bool, sign: float = 1.0):
    """Each chosen (rejected) completion's per-token log-probs at its label tokens (TRL's loss_mask): from the
    policy's get_batch_logps (0.11.4, CPO/ORPO) or concatenated_forward (DPO 0.13.0)."""
    def values(loc):
        src = loc["_logps"] or loc["_forward"]
        x, m = src["per_token_logps"].float(), src["loss_mask"].bool()
        n = _n_chosen(loc["_forward"])
        rows = range(n) if chosen else range(n, x.shape[0])
        return [[sign * float(v) for v in x[i][m[i]]] for i in rows]
    return values


def _logits(chosen: bool, name: str, masked: bool):
    """Each chosen (rejected) sequence's logits averaged over the vocabulary, per position: of the policy's
    concatenated_forward tensor ``name``, at every position of the padded sequence or (``masked``) at its label
    tokens (the loss_mask of get_batch_logps / concatenated_forward, aligned with the shifted logits)."""
    def values(loc):
        fwd = loc["_forward"]
        x = fwd[name].float().mean(-1)
        n = _n_chosen(fwd)
        rows = range(n) if chosen else range(n, x.shape[0])
        if not masked:
            return [[float(v) for v in x[i]] for i in rows]
        src = loc["_logps"] or fwd
        m = src["loss_mask"].bool()
        if x.shape[1] == m.shape[1] + 1:          # all_logits (B, T): the mask is of the shifted labels
            x = x[:, :-1]
        return [[float(v) for v in x[i][m[i]]] for i in rows]
    return values


def _sums_check(p, run, key: str, chosen: bool, local: str) -> None:
    """The tokens given are the completions' log-prob sums TRL reduced: checked against its own per-pair tensor."""
    obs = _obs(run, key, _token_logps(chosen))
    sums = [sum(seq) for _v, batch in obs for step in batch for micro in step[0][0] for seq in micro]
    want = [float(v) for c in run.calls for v in c.locals[local]]
    p.check(len(sums) == len(want) and all(math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-4)
                                           for a, b in zip(sums, want)), (sums[:4], want[:4]))


def _assert_rewards(p, run) -> None:
    for key, fn in (("rewards/chosen", lambda loc: loc["chosen_rewards"]),
                    ("rewards/rejected", lambda loc: loc["rejected_rewards"]),
                    ("rewards/margins", lambda loc: loc["chosen_rewards"] - loc["rejected_rewards"]),
                    ("rewards/accuracies", lambda loc: loc["reward_accuracies"])):
        p.assert_stated(key, _obs(run, key, _per_pair(fn)), tokens=("per_seq",), mini=("none",), window=WINDOWS,
                        levels=("micro_batches", "window"), rel=1e-5)
    p.check(any(0 < r["rewards/accuracies"] < 1 for _s, r in run.train_rows()), "accuracy 0 or 1 everywhere: weak")


def _shape_checks(p, run) -> None:
    p.check(run.windows == [(1, 3), (4, 6), (7, 9)], f"three rows of three steps: {run.windows}")
    sizes = [_n_chosen(c.locals["_forward"]) for c in run.calls]
    p.check(len(sizes) == 18 and set(sizes) == {1, 2}, f"18 micro-batches of 2 and 1 pairs: {sizes}")
    p.check(all(c.locals["_forward"] for c in run.calls), "the policy's forward of each micro-batch recorded")


@proof("trl", trainer="dpo", release="0.11.4", config=CONFIG)
def test_dpo_0_11_rewards_logps_and_every_position_logits(p, tmp_path):
    """DPOTrainer at 0.11.4: rewards/* the micro-batch's mean over its pairs; logps/* its mean over pairs of each
    completion's log-prob sum; logits/* ``policy_chosen_logits.mean()``: the mean over every position of the padded
    prompt + completion sequences (and the vocabulary), not over the completion tokens; each stored per
    micro-batch, averaged over the row."""
    from _support.fingerprint import fingerprint
    from _support.proofs_trl_pref_old import run_pref
    run = run_pref("dpo", tmp_path, n_pairs=7, **RUN)
    _shape_checks(p, run)
    _assert_rewards(p, run)
    for key, chosen, local in (("logps/chosen", True, "policy_chosen_logps"),
                               ("logps/rejected", False, "policy_rejected_logps")):
        _sums_check(p, run, key, chosen, local)
        p.assert_stated(key, _obs(run, key, _token_logps(chosen)), tokens=TOKENS, mini=("none",), window=WINDOWS,
                        levels=("micro_batches", "window"), rel=1e-5)
    for key, chosen in (("logits/chosen", True), ("logits/rejected", False)):
        p.assert_stated(key, _obs(run, key, _logits(chosen, "all_logits", masked=False)),
                        tokens=("token_mean", "seq_mean_token_mean"), mini=("none",), window=WINDOWS,
                        levels=("micro_batches", "window"), rel=1e-5)
        with pytest.raises(AssertionError, match="no candidate"):
            fingerprint(_obs(run, key, _logits(chosen, "all_logits", masked=True)),
                        tokens=("token_mean", "seq_mean_token_mean"), mini=("none",), window=WINDOWS, rel=1e-5)
        p.check(True, f"{key}: the completion tokens alone fit no reduction (every position is averaged)")


@proof("trl", trainer="dpo", release="0.13.0", config=CONFIG)
def test_dpo_0_13_rewards_logps_and_completion_token_logits(p, tmp_path):
    """DPOTrainer at 0.13.0: rewards/* and logps/* as at 0.11.4; logits/* ``logits[loss_mask].mean()``: the token
    mean over the completion (label) tokens of the logits' vocabulary mean; each stored per micro-batch, averaged
    over the row."""
    from _support.proofs_trl_pref_old import run_pref
    run = run_pref("dpo", tmp_path, n_pairs=7, **RUN)
    _shape_checks(p, run)
    _assert_rewards(p, run)
    for key, chosen in (("logps/chosen", True), ("logps/rejected", False)):
        p.assert_stated(key, _obs(run, key, _token_logps(chosen)), tokens=TOKENS, mini=("none",), window=WINDOWS,
                        levels=("micro_batches", "window"), rel=1e-5)
    for key, chosen in (("logits/chosen", True), ("logits/rejected", False)):
        p.assert_stated(key, _obs(run, key, _logits(chosen, "logits", masked=True)),
                        tokens=("token_mean", "seq_mean_token_mean"), mini=("none",), window=WINDOWS,
                        levels=("micro_batches", "window"), rel=1e-5)


IPO = {**RUN, "loss_type": "ipo"}
IPO_CONFIG = {**CONFIG, "loss_type": "ipo"}


@proof("trl", trainer="dpo", release="0.13.0", config=IPO_CONFIG)
def test_dpo_0_13_ipo_logs_length_normalised_logps(p, tmp_path):
    """loss_type ipo at 0.13.0: concatenated_forward divides each completion's log-prob sum by its token count, so
    logps/* log the mean over pairs of each completion's token mean."""
    from _support.fingerprint import fingerprint
    from _support.proofs_trl_pref_old import run_pref
    run = run_pref("dpo", tmp_path, n_pairs=7, **IPO)
    _shape_checks(p, run)
    for key, chosen in (("logps/chosen", True), ("logps/rejected", False)):
        obs = _obs(run, key, _token_logps(chosen))
        p.assert_stated(key, obs, tokens=TOKENS, mini=("none",), window=WINDOWS,
                        levels=("micro_batches", "window"), rel=1e-5)
        with pytest.raises(AssertionError, match="no candidate"):
            fingerprint(obs, tokens=("seq_mean_token_sum",), mini=("none",), window=WINDOWS, rel=1e-5)
        p.check(True, f"{key}: the completions' sums fit no reduction")


def _assert_cpo_orpo(p, kind: str, tmp_path, **run_kw) -> Any:
    """CPO / ORPO at 0.11.4 and 0.13.0: logits/* ``policy_chosen_logits.mean()`` over every position of the padded
    sequences; nll_loss nn.CrossEntropyLoss over the labels concatenated_forward gave it (ignore_index -100; CPO: the
    chosen completion's tokens, ORPO: every attended token of the chosen sequence, the prompt included): the
    micro-batch's token mean of those tokens' NLL (tests/_support/proofs_trl_pref.py's label_nll: -log_softmax of
    TRL's logits at TRL's labels); each stored per micro-batch, averaged over the row."""
    from _support.fingerprint import fingerprint
    from _support.proofs_trl_pref_old import run_pref
    run = run_pref(kind, tmp_path, n_pairs=7, **{**RUN, **run_kw})
    _shape_checks(p, run)
    p.check(all(c.locals["_logps"] for c in run.calls), "the policy's get_batch_logps of each micro-batch recorded")
    for key, chosen in (("logits/chosen", True), ("logits/rejected", False)):
        p.assert_stated(key, _obs(run, key, _logits(chosen, "all_logits", masked=False)),
                        tokens=("token_mean", "seq_mean_token_mean"), mini=("none",), window=WINDOWS,
                        levels=("micro_batches", "window"), rel=1e-5)
        with pytest.raises(AssertionError, match="no candidate"):
            fingerprint(_obs(run, key, _logits(chosen, "all_logits", masked=True)),
                        tokens=("token_mean", "seq_mean_token_mean"), mini=("none",), window=WINDOWS, rel=1e-5)
        p.check(True, f"{key}: the completion tokens alone fit no reduction")
    from _support.proofs_trl_pref import label_nll
    p.assert_stated("nll_loss", _obs(run, "nll_loss", lambda loc: label_nll(loc["_forward"])), tokens=TOKENS,
                    mini=("none",), window=WINDOWS, levels=("micro_batches", "window"), rel=1e-5)
    # CPO: the chosen completion's label tokens; ORPO: every attended token of the chosen sequence, prompt included
    prompt_in = [bool(((c.locals["_forward"]["labels"] != -100)
                       & (c.locals["_forward"]["concatenated_batch"]["concatenated_labels"] == -100)).any())
                 for c in run.calls]
    p.check(all(prompt_in) if kind == "orpo" else not any(prompt_in), f"{kind}: nll over prompt tokens {prompt_in}")
    return run


#: a rate that rises and falls within a row: its last, first, min and max steps differ
LR = {"lr_scheduler_type": "cosine_with_restarts", "lr_scheduler_kwargs": {"num_cycles": 5}}


@proof("trl", trainer="cpo", release="0.13.0", config=CONFIG)
def test_cpo_0_13_logits_every_position_and_nll_token_mean(p, tmp_path):
    """(see _assert_cpo_orpo) and learning_rate: transformers 4.46.3's _maybe_log_save_evaluate reads the rate after
    lr_scheduler.step(): the rate after the row's last step (the next step's), not the rate it used."""
    from _support.proven import close
    run = _assert_cpo_orpo(p, "cpo", tmp_path, **LR)
    opt = run.optimizer
    lr_obs = [(row["learning_rate"], run.per_step(opt.lr_after, i)) for i, (_s, row) in enumerate(run.train_rows())]
    p.assert_stated("learning_rate", lr_obs, tokens=("per_seq",), mini=("none",), window=WINDOWS, levels=())
    for (_s, row), (_first, last) in zip(run.train_rows(), run.windows):
        p.check(not close(row["learning_rate"], opt.lr_before[last - 1]), "the rate the last step used was logged")


@proof("trl", trainer="orpo", release="0.11.4", config=CONFIG)
def test_orpo_0_11_logits_every_position_and_nll_token_mean(p, tmp_path):
    _assert_cpo_orpo(p, "orpo", tmp_path)


ISFT = dict(per_device_train_batch_size=2, logging_steps=3, max_steps=12, lr_scheduler_type="cosine_with_restarts",
            lr_scheduler_kwargs={"num_cycles": 5})
ISFT_CONFIG = {"logging_steps": 3}


@proof("trl", trainer="iterative_sft", release="0.13.0", config=ISFT_CONFIG)
def test_iterative_sft_0_13_loss_and_the_rate_after_the_scheduler_stepped(p, tmp_path):
    """IterativeSFTTrainer at 0.13.0 (transformers 4.46.3): its own loop in step() runs one optimizer step per
    micro-batch and sums the micro-batches' losses (the model's own loss, one value per step); every logging_steps
    steps it logs round(sum / steps, 4), the mean of the row's steps, and ``_get_learning_rate()`` read after
    ``lr_scheduler.step()``: the rate after the row's last step (the next step's)."""
    from _support.proofs_trl_pref_old import run_iterative_sft
    from _support.proven import close
    run = run_iterative_sft(tmp_path, calls=3, n_texts=8, **ISFT)
    p.check(run.windows == [(1, 3), (4, 6), (7, 9), (10, 12)], run.windows)
    p.check(len(run.calls) == 12 and [c.step for c in run.calls] == list(range(1, 13)), "one loss per step")
    obs = [(row["loss"], [[[[[[float(c.locals["loss"])]]]]] for c in run.calls if first <= c.step <= last])
           for (_s, row), (first, last) in zip(run.train_rows(), run.windows)]
    p.assert_stated("loss", obs, tokens=("none",), mini=("none",), window=WINDOWS, levels=(), rel=2e-4)
    p.check(all(round(r["loss"], 4) == r["loss"] for _s, r in run.train_rows()), "rounded to 4 decimals")
    opt = run.optimizer
    lr_obs = [(row["learning_rate"], run.per_step(opt.lr_after, i)) for i, (_s, row) in enumerate(run.train_rows())]
    p.assert_stated("learning_rate", lr_obs, tokens=("per_seq",), mini=("none",), window=WINDOWS, levels=())
    for (_s, row), (_first, last) in zip(run.train_rows(), run.windows):
        p.check(not close(row["learning_rate"], opt.lr_before[last - 1]), "the rate the last step used was logged")
