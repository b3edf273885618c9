"""Fingerprint proofs of mappings/trl.yaml's OnlineDPOTrainer entries on 2 simulated data-parallel ranks (issue 33
item 1): each rank a trainer built by TRL 1.16.0's own __init__; the completions sampled first by the trainer's own
``_generate``, then the trainer's own ``training_step`` (its accelerator tests/_support/framework_code.py's
SimAccelerator) micro-batch by micro-batch and its own ``_maybe_log_save_evaluate`` after each row
(tests/_support/proofs_trl_pref.py: ``run_online_dpo_on_ranks``). Ranks hold 3, 2, 1 and 2, 4, 3 prompts per
micro-batch in turn (two completions each), gradient accumulation 2, rows of 3 and 2 optimizer steps: the process
(pooled, mean of ranks, rank 0's), micro-batch and window reductions give different numbers.
tests/frameworks/test_proof_trl_pref_online_dpo.py runs the whole Trainer on one process (and the loss, which the
Trainer gathers with torch.distributed).
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
from _support.proofs_trl_pref import RankRun, run_online_dpo_on_ranks  # noqa: E402
from _support.proven import proof  # noqa: E402

RELEASE = "1.16.0"
WINDOWS = ("mean", "last", "sum", "none")
GA, ROWS, BETA = 2, (3, 2), 0.1
LEVELS = ("micro_batches", "processes", "window")
CONFIG = {"gradient_accumulation_steps": GA, "logging_steps": ROWS[0], "beta": BETA, "loss_type": "sigmoid"}

_WORK = Path(tempfile.mkdtemp(prefix="trl-pref-ranks-"))
atexit.register(shutil.rmtree, _WORK, True)


@functools.lru_cache(maxsize=None)
def _ranks() -> RankRun:
    return run_online_dpo_on_ranks(_WORK / "online_dpo", sizes=((3, 2, 1), (2, 4, 3)), rows=ROWS, ga=GA, beta=BETA)


def _rows(tensor, rows=None, mask: bool = True):
    def values(loc):
        x = tensor(loc).detach().float()
        m = loc["completion_mask"].bool()
        idx = range(x.shape[0]) if rows is None else loc[rows].tolist()
        return [[float(v) for v in (x[i][m[i]] if mask else x[i])] for i in idx]
    return values


def _kl(loc):
    return loc["logprobs"] - loc["ref_logprobs"]


@proof("trl", trainer="online_dpo", release=RELEASE, config=CONFIG)
def test_online_dpo_gathered_pairs_and_rank_means(p):
    """rewards/*, logps/*, objective/rlhf_reward: per-pair (per-completion) values gathered from every rank, the
    pooled mean; objective/kl, objective/entropy, objective/non_score_reward (every completion position),
    objective/scores, objective/scores_margin: each rank's mean, gathered and averaged; val/contain_eos_token: the
    logging rank's own share. One value per micro-batch, averaged over the row."""
    run = _ranks()
    p.check(all(len(rows) == len(ROWS) for rows in run.rows), "a row per window on each rank")
    p.check(all(len(calls) == GA * sum(ROWS) for calls in run.calls), "a call per micro-batch")
    for key, values in (("rewards/chosen", per_seq("chosen_rewards")),
                        ("rewards/rejected", per_seq("rejected_rewards")),
                        ("rewards/margins", lambda loc: [[float(a - b)] for a, b in zip(loc["chosen_rewards"],
                                                                                        loc["rejected_rewards"])]),
                        ("rewards/accuracies", lambda loc: [[float(a > b)] for a, b in zip(loc["chosen_rewards"],
                                                                                           loc["rejected_rewards"])]),
                        ("objective/rlhf_reward", per_seq("rlhf_reward")),
                        ("objective/scores", per_seq("rewards")),
                        ("objective/scores_margin", per_seq("scores_margin")),
                        ("val/contain_eos_token", per_seq("contain_eos_token"))):
        p.assert_stated(key, run.obs(key, values), tokens=("per_seq",), mini=("none",), window=WINDOWS,
                        levels=LEVELS, rel=1e-5)
    for key, rows in (("logps/chosen", "chosen_indices"), ("logps/rejected", "rejected_indices")):
        p.assert_stated(key, run.obs(key, _rows(lambda loc: loc["logprobs"], rows)),
                        tokens=("seq_mean_token_sum", "token_mean", "seq_mean_token_mean"), mini=("none",),
                        window=WINDOWS, levels=LEVELS, rel=1e-5)
    for key, tensor in (("objective/kl", _kl), ("objective/entropy", lambda loc: -loc["logprobs"]),
                        ("objective/non_score_reward", lambda loc: -loc["self"].beta * _kl(loc))):
        p.assert_stated(key, run.obs(key, _rows(tensor, mask=False)),
                        tokens=("seq_mean_token_sum", "token_mean", "seq_mean_token_mean"), mini=("none",),
                        window=WINDOWS, levels=LEVELS, rel=1e-5)
