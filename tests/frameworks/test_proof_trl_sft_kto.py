"""Fingerprint proofs of mappings/trl.yaml for TRL's SFTTrainer and KTOTrainer (issue 33: the entries the real-log
corpus hits: tests/data/real/trl/13_issue3926_sft.log, 12_issue1447_kto.log, 15_pr1474_kto_hh.trainer_state.json).
As in test_proof_trl_grpo.py: the installed TRL (1.16.0) trains a tiny model on CPU, the logged rows are matched
against every candidate reduction of the values TRL itself computed (the locals of the function that appended them,
tests/_support/proofs_trl.py), and the match must be the entry's stated reduction for the run's config.

* SFT: 7 prompt-completion examples (completion-only loss), per_device_train_batch_size 2,
  gradient_accumulation_steps 2, logging_steps 3, 9 steps: micro-batches of 2 and 1 examples (the epoch's last
  batch) with uneven label-token counts. loss is HF's (the per-token loss summed over the accumulation window's label
  tokens: the step's token mean); entropy and mean_token_accuracy one global token mean per micro-batch, averaged.
* KTO: 7 unpaired examples (desirable : undesirable 2 : 1), the same batch sizes: micro-batches hold different numbers
  of desirable and undesirable examples (some none of one kind: they append nothing for it).
* The counters (num_tokens, epoch): the value at the row's last step, read from TRL's own running total (the
  attention masks it summed) and from the Trainer's state as each step ended.
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

from _support.proofs_trl import TRLRun, counter_obs, per_seq, run_kto, run_sft, running_tokens  # noqa: E402
from _support.proven import proof  # noqa: E402

RELEASE = "1.16.0"
WINDOWS = ("mean", "last", "sum", "none")
SFT = dict(per_device_train_batch_size=2, gradient_accumulation_steps=2, logging_steps=3, max_steps=9)
KTO = dict(per_device_train_batch_size=3, gradient_accumulation_steps=2, logging_steps=3, max_steps=9, beta=0.1)
N_EXAMPLES = 7
N_KTO = 11
SFT_CONFIG = {k: SFT[k] for k in ("gradient_accumulation_steps", "logging_steps")}
KTO_CONFIG = {k: KTO[k] for k in ("gradient_accumulation_steps", "logging_steps", "beta")}

_WORK = Path(tempfile.mkdtemp(prefix="trl-proofs-"))
atexit.register(shutil.rmtree, _WORK, True)


@functools.lru_cache(maxsize=None)
def _sft() -> TRLRun:
    return run_sft(_WORK / "sft", n_examples=N_EXAMPLES, **SFT)


@functools.lru_cache(maxsize=None)
def _kto() -> TRLRun:
    return run_kto(_WORK / "kto", n_examples=N_KTO, **KTO)


def _obs(run: TRLRun, key: str, fn: str, values) -> list:
    """(logged value, batch) of every train row that logged ``key``; a step's micro-batches are the calls of ``fn``
    that appended ``key`` (KTO appends rewards/chosen only for a micro-batch holding a desirable example), or every
    call of ``fn`` for a key no call appends (HF's loss, which the Trainer sums from the calls' return values)."""
    appends = any(key in c.appended for c in run.calls if c.name == fn)
    out = []
    for i, (_s, row) in enumerate(run.train_rows()):
        if key not in row:
            continue
        first, last = run.windows[i]
        steps = []
        for step in range(first, last + 1):
            micro = [values(c.locals) for c in run.calls_of(fn, step, step)
                     if key in c.appended or not appends]
            if micro:
                steps.append([[micro]])
        out.append((row[key], steps))
    assert out, f"no train row logged {key!r}"
    return out


def _fused(field: str, mask: str = "label_mask", sign: float = 1.0):
    """Each sequence's values of the fused LM head's (B, T) output ``field`` at its label tokens (SFT)."""
    def values(loc):
        out = loc["outputs"]
        x, m = getattr(out, field).float() * sign, getattr(out, mask).bool()
        return [[float(v) for v in x[i][m[i]]] for i in range(x.shape[0])]
    return values


# ------------------------------------------------------------------------------------------------------- SFT
@proof("trl", trainer="sft", release=RELEASE, config=SFT_CONFIG)
def test_sft_loss_is_the_steps_label_token_mean_averaged_over_logged_steps(p):
    """HF's loss for SFT v1.x: each micro-batch's label-token loss sum over the accumulation window's label tokens
    (num_items_in_batch, average_tokens_across_devices), summed over the step: the step's token mean of -log p, then
    the mean over the row's steps."""
    run = _sft()
    sizes = [len(c.locals["outputs"].label_mask) for c in run.calls if c.name == "compute_loss"]
    p.check(set(sizes) == {1, 2}, f"micro-batches of 2 and 1 examples: {sizes}")
    p.assert_stated("loss", _obs(run, "loss", "compute_loss", _fused("log_probs", sign=-1.0)),
                    tokens=("token_mean", "seq_mean_token_mean"), mini=("none",), window=WINDOWS,
                    levels=("micro_batches", "window"), rel=1e-5)


@proof("trl", trainer="sft", release=RELEASE, config=SFT_CONFIG)
def test_sft_entropy_and_token_accuracy_are_micro_batch_token_means_averaged(p):
    """entropy and mean_token_accuracy: the micro-batch's label-token sum over its label-token count, both gathered
    from every process, appended once per micro-batch; log() averages the row's micro-batches unweighted."""
    run = _sft()
    for key, field in (("entropy", "entropy"), ("mean_token_accuracy", "is_top1")):
        p.assert_stated(key, _obs(run, key, "compute_loss", _fused(field)),
                        tokens=("token_mean", "seq_mean_token_mean"), mini=("none",), window=WINDOWS,
                        levels=("micro_batches", "window"))
    p.check(any(0 < r["mean_token_accuracy"] < 1 for _s, r in run.train_rows()), "accuracy 0 or 1 everywhere: weak")


@proof("trl", trainer="sft", release=RELEASE, config=SFT_CONFIG)
def test_sft_counters_are_the_values_at_the_rows_last_step(p):
    """num_tokens: TRL's running total of attention-mask tokens (every process), as it stood at the row's last step;
    epoch: the Trainer's state.epoch as that step ended. Neither is reduced over the row's steps."""
    run = _sft()
    tokens = running_tokens(run, "compute_loss", lambda loc: loc["inputs"]["attention_mask"])
    p.check(len(set(tokens)) == len(tokens), f"a running total grows every step: {tokens}")
    p.assert_stated("num_tokens", counter_obs(run, "num_tokens", tokens), levels=())
    epochs = run.optimizer.epoch
    p.check(len(set(epochs)) == len(epochs), f"state.epoch grows every step: {epochs}")
    p.assert_stated("epoch", counter_obs(run, "epoch", epochs), levels=())
    # the row's first step's counter is another number: the counters are read at the row's last step
    firsts = [(row["num_tokens"], tokens[run.windows[i][0] - 1]) for i, (_s, row) in enumerate(run.train_rows())]
    p.check(any(not math.isclose(a, b) for a, b in firsts), firsts)


# ------------------------------------------------------------------------------------------------------- KTO
def _kl_pairs(loc):
    """Each mismatched (KL) pair's log-ratio sum, policy minus reference: what KTO's batch KL averages."""
    return [[float(a - b)] for a, b in zip(loc["KL_logps"], loc["ref_KL_logps"])]


def _completion_logps(idx: str):
    """The per-token log-probs of the desirable (``chosen_idx``) or undesirable (``rejected_idx``) examples at
    their completion tokens: a sequence's sum is its completion log-prob (KTO's chosen_logps)."""
    def values(loc):
        rows = loc[idx].tolist()
        x, m = loc["per_token_logps"].float(), loc["shift_completion_mask"].bool()
        return [[float(v) for v in x[i][m[i]]] for i in rows]
    return values


@proof("trl", trainer="kto", release=RELEASE, config=KTO_CONFIG)
def test_kto_example_means_average_the_micro_batches_that_hold_them(p):
    """rewards/chosen, rewards/rejected (beta x log-ratio) and logps/chosen, logps/rejected (completion log-prob sums):
    the mean over the micro-batch's desirable (undesirable) examples gathered from every process, appended only for a
    micro-batch that holds one; kl: the mean of the mismatched pairs' log-ratios, gathered, clamped at 0; log()
    averages what the row's micro-batches appended: every value appended since the last log, pooled (the window level
    ``pooled``, not the mean of the steps' means: a step whose micro-batches hold no undesirable example appends
    fewer values; the entries said ``mean`` until this proof)."""
    run = _kto()
    calls = [c for c in run.calls if c.name == "_compute_loss"]
    counts = {(len(c.locals["chosen_idx"]), len(c.locals["rejected_idx"])) for c in calls}
    p.check(len(counts) > 2 and any(0 in cnt for cnt in counts), f"uneven desirable/undesirable counts: {counts}")
    for c in calls:                 # the sequences' token sums are the completion log-probs KTO reduced
        got = [sum(s) for s in _completion_logps("chosen_idx")(c.locals)]
        p.check(all(math.isclose(a, float(b), rel_tol=1e-5, abs_tol=1e-5)
                    for a, b in zip(got, c.locals["chosen_logps"])), (got, c.locals["chosen_logps"]))
    # the desirable examples: micro-batches of 3 and 1 in every step (the micro-batch level told apart); the
    # undesirable: 2 | 1 + 1 | 2 ... (the steps' micro-batch counts differ: the window level told apart)
    for key, values, idx in (("rewards/chosen", per_seq("chosen_rewards"), "chosen_idx"),
                             ("rewards/rejected", per_seq("rejected_rewards"), "rejected_idx")):
        levels = ("micro_batches",) if idx == "chosen_idx" else ()
        p.assert_stated(key, _obs(run, key, "_compute_loss", values), tokens=("per_seq",), mini=("none",),
                        window=WINDOWS, levels=levels)
        logps = "logps/" + key.split("/")[1]
        p.assert_stated(logps, _obs(run, logps, "_compute_loss", _completion_logps(idx)),
                        tokens=("seq_mean_token_sum", "token_mean", "seq_mean_token_mean"), mini=("none",),
                        window=WINDOWS, levels=levels, rel=1e-5)
    # rewards/margins: the micro-batch's desirable mean minus its undesirable mean (appended when it holds both),
    # pooled over the row like the others
    both = [c for c in calls if "rewards/margins" in c.appended]
    p.check(both and all(math.isclose(c.appended["rewards/margins"], float(c.locals["chosen_rewards"].mean())
                                      - float(c.locals["rejected_rewards"].mean()), rel_tol=1e-5, abs_tol=1e-6)
                         for c in both), "margins: the difference of the micro-batch's two means")
    p.assert_stated("rewards/margins", _obs(run, "rewards/margins", "_compute_loss",
                                            lambda loc: [[float(loc["chosen_rewards"].mean())
                                                          - float(loc["rejected_rewards"].mean())]]),
                    tokens=("per_seq",), mini=("none",), window=WINDOWS, levels=(), rel=1e-5)
    # kl in two stages (the clamp at 0 is no reduction): the micro-batches TRL did not clamp fix the statistic over
    # the pairs; the rows, over the values TRL appended (clamped or not), fix the levels above it
    unclamped = [c for c in calls if float((c.locals["KL_logps"] - c.locals["ref_KL_logps"]).mean()) >= 0]
    p.check(len(unclamped) >= 3 and any(c.appended["kl"] > 0 for c in unclamped), [c.appended["kl"] for c in calls])
    p.assert_stated("kl", [(c.appended["kl"], [[[[_kl_pairs(c.locals)]]]]) for c in unclamped],
                    tokens=("per_seq",), stats=("mean", "max", "min"), levels=(), rel=1e-5)
    p.assert_stated("kl", _obs(run, "kl", "_compute_loss", lambda loc: [[float(loc["kl"])]]), tokens=("per_seq",),
                    mini=("none",), window=WINDOWS, levels=(), rel=1e-5)


@proof("trl", trainer="kto", release=RELEASE, config=KTO_CONFIG)
def test_kto_token_means_and_counters(p):
    """entropy, logits/chosen, logits/rejected: one global token mean per micro-batch (sums and counts gathered),
    averaged over the micro-batches that appended; num_tokens: the running total of attention-mask tokens at the
    row's last step."""
    run = _kto()

    def masked_rows(tensor: str, idx: str | None):
        def values(loc):
            x, m = loc[tensor].float(), loc["shift_completion_mask"].bool()
            rows = range(x.shape[0]) if idx is None else loc[idx].tolist()
            return [[float(v) for v in x[i][m[i]]] for i in rows]
        return values
    for key, tensor, idx in (("entropy", "per_token_entropy", None), ("logits/chosen", "mean_logits", "chosen_idx"),
                             ("logits/rejected", "mean_logits", "rejected_idx")):
        p.assert_stated(key, _obs(run, key, "_compute_loss", masked_rows(tensor, idx)),
                        tokens=("token_mean", "seq_mean_token_mean"), mini=("none",), window=WINDOWS,
                        levels=("micro_batches",), rel=1e-5)
    tokens = running_tokens(run, "_compute_loss", lambda loc: loc["batch"]["attention_mask"])
    p.assert_stated("num_tokens", counter_obs(run, "num_tokens", tokens), levels=())
