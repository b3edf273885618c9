"""Fingerprint proofs of mappings/trl.yaml's CPOTrainer and ORPOTrainer entries on 2 simulated data-parallel ranks
(issue 33 item 1): each rank a trainer built by TRL 1.16.0's own __init__, whose accelerator is then
tests/_support/framework_code.py's SimAccelerator; the trainer's own ``compute_loss`` (``get_batch_loss_metrics``:
accelerate's gather_for_metrics of each metric) on batches its own data collator made, micro-batch by micro-batch,
then its own ``log`` (tests/_support/proofs_trl_pref.py: ``run_cpo_orpo_on_ranks``). Ranks hold 3, 2, 1 and 2, 4, 3
pairs per micro-batch in turn, gradient accumulation 2, rows of 3 and 2 optimizer steps: the process (pooled, mean
of ranks, rank 0's), micro-batch and window reductions give different numbers.
tests/frameworks/test_proof_trl_pref_cpo_orpo.py runs the whole Trainer on one process.
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

from _support.proofs_trl import per_seq  # noqa: E402
from _support.proofs_trl_pref import RankRun, label_logps, label_nll, run_cpo_orpo_on_ranks  # noqa: E402
from _support.proven import proof  # noqa: E402

RELEASE = "1.16.0"
WINDOWS = ("mean", "last", "sum", "none")
GA, ROWS, BETA = 2, (3, 2), 0.1
LEVELS = ("micro_batches", "processes", "window")
CONFIG = {"gradient_accumulation_steps": GA, "logging_steps": ROWS[0], "beta": BETA, "loss_type": "sigmoid"}
ORPO_CONFIG = {"gradient_accumulation_steps": GA, "logging_steps": ROWS[0], "beta": BETA}

_WORK = Path(tempfile.mkdtemp(prefix="trl-pref-ranks-"))
atexit.register(shutil.rmtree, _WORK, True)


@functools.lru_cache(maxsize=None)
def _ranks(kind: str) -> RankRun:
    return run_cpo_orpo_on_ranks(kind, _WORK / kind, sizes=((3, 2, 1), (2, 4, 3)), rows=ROWS, ga=GA, beta=BETA)


def _fwd(fn, *args):
    def values(loc):
        return fn(loc["fwd"], *args)
    return values


def _mean_logits(chosen: bool):
    def values(loc):
        x = loc["policy_chosen_logits" if chosen else "policy_rejected_logits"].detach().float().mean(-1)
        return [[float(v) for v in row] for row in x]
    return values


def _all_keys(p, kind: str) -> RankRun:
    run = _ranks(kind)
    p.check(all(len(rows) == len(ROWS) for rows in run.rows), f"{kind}: a row per window on each rank")
    p.check(all(len(calls) == GA * sum(ROWS) for calls in run.calls), f"{kind}: a call per micro-batch")
    for key, values in (("rewards/chosen", per_seq("chosen_rewards")),
                        ("rewards/rejected", per_seq("rejected_rewards")),
                        ("rewards/accuracies", per_seq("reward_accuracies"))):
        p.assert_stated(key, run.obs(key, values), tokens=("per_seq",), mini=("none",), window=WINDOWS,
                        levels=LEVELS, rel=1e-5)
    margins = run.obs("rewards/margins", lambda loc: [[float(a - b)] for a, b in zip(loc["chosen_rewards"],
                                                                                     loc["rejected_rewards"])])
    p.assert_stated("rewards/margins", margins, tokens=("per_seq",), mini=("none",), window=WINDOWS, levels=LEVELS,
                    rel=1e-5)
    for key, chosen in (("logps/chosen", True), ("logps/rejected", False)):
        p.assert_stated(key, run.obs(key, _fwd(label_logps, chosen)),
                        tokens=("seq_mean_token_sum", "seq_mean_token_mean", "token_mean"), mini=("none",),
                        window=WINDOWS, levels=LEVELS, rel=1e-5)
    for key, chosen in (("logits/chosen", True), ("logits/rejected", False)):
        p.assert_stated(key, run.obs(key, _mean_logits(chosen)), tokens=("token_mean", "seq_mean_token_mean"),
                        mini=("none",), window=WINDOWS, levels=LEVELS, rel=1e-5)
    p.assert_stated("nll_loss", run.obs("nll_loss", _fwd(label_nll)), tokens=("token_mean", "seq_mean_token_mean"),
                    mini=("none",), window=WINDOWS, levels=LEVELS, rel=1e-5)
    return run


@proof("trl", trainer="cpo", release=RELEASE, config=CONFIG)
def test_cpo_metrics_over_ranks(p):
    """CPO: rewards/* and logps/* gathered per pair (the pooled mean over every rank's pairs); logits/* and
    nll_loss each rank's mean, gathered and averaged; one value per micro-batch, averaged over the row."""
    _all_keys(p, "cpo")


@proof("trl", trainer="orpo", release=RELEASE, config=ORPO_CONFIG)
def test_orpo_metrics_over_ranks(p):
    """ORPO: as CPO, and log_odds_ratio, log_odds_chosen: odds_ratio_loss returns each rank's mean over its pairs,
    gather_for_metrics(...).mean() averages the ranks' means."""
    run = _all_keys(p, "orpo")
    for key, name in (("log_odds_ratio", "ratio"), ("log_odds_chosen", "log_odds")):
        p.assert_stated(key, run.obs(key, lambda loc, name=name: [[float(v)] for v in loc["loss_fn"][name]]),
                        tokens=("per_seq",), mini=("none",), window=WINDOWS, levels=LEVELS, rel=1e-5)
