"""Fingerprint proofs of mappings/trl.yaml's TPOTrainer entries on 2 simulated data-parallel ranks (issue 33 item 1):
TRL 1.16.0's own ``TPOTrainer._compute_loss`` called micro-batch by micro-batch on a trainer built without __init__
(tests/_support/proofs_trl_pref.py: ``run_tpo_on_ranks``, the ranks' accelerator tests/_support/framework_code.py's
SimAccelerator), with batches collated by TPO's own DataCollatorForTriplePreference, then the trainer's own ``log``.
Ranks hold 3, 2, 1 and 2, 4, 3 triples per micro-batch in turn (uneven tokens too), gradient accumulation 2, rows of
3 and 2 optimizer steps: the process (pooled, token-weighted, mean of ranks, rank 0's), micro-batch and window
reductions give different numbers. tests/frameworks/test_proof_trl_pref_tpo.py runs the whole Trainer on one process.
"""
from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from pathlib import Path

import pytest

pytest.importorskip("trl")

from _support.proofs_trl import masked, per_seq  # noqa: E402
from _support.proofs_trl_pref import RankRun, run_tpo_on_ranks  # noqa: E402
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
    return run_tpo_on_ranks(_WORK / "tpo", sizes=((3, 2, 1), (2, 4, 3)), rows=ROWS, ga=GA, beta=BETA)


def _branch(tensor: str, branch: int):
    def values(loc):
        x = loc[tensor].detach().float().chunk(loc["n_branches"], dim=0)[branch]
        m = loc["shift_completion_mask"].bool().chunk(loc["n_branches"], dim=0)[branch]
        return [[float(v) for v in x[i][m[i]]] for i in range(x.shape[0])]
    return values


def _mean_logits(which: str):
    def values(loc):
        x = loc[f"{which}_logits"].float().mean(-1)
        m = loc[f"{which}_mask"].bool()
        return [[float(v) for v in x[i][m[i]]] for i in range(x.shape[0])]
    return values


@proof("trl", trainer="tpo", release=RELEASE, config=CONFIG)
def test_tpo_pair_means_gather_every_rank(p):
    """rewards/* and logps/*: accelerator.gather of the per-pair values, the mean over every rank's pairs (the
    pooled mean), one value per micro-batch, averaged over the row's micro-batches."""
    run = _ranks()
    p.check(len(run.rows[0]) == len(ROWS) and len(run.rows[1]) == len(ROWS), "a row per window on each rank")
    for key, values in (("rewards/chosen", per_seq("chosen_rewards")),
                        ("rewards/rejected", per_seq("rejected_rewards")),
                        ("rewards/margins", per_seq("margins")),
                        ("rewards/accuracies", per_seq("reward_accuracies"))):
        p.assert_stated(key, run.obs(key, values), tokens=("per_seq",), mini=("none",), window=WINDOWS,
                        levels=LEVELS, rel=1e-5)
    for key, branch in (("logps/chosen", 0), ("logps/rejected", 1)):
        p.assert_stated(key, run.obs(key, _branch("per_token_logps", branch)),
                        tokens=("seq_mean_token_sum", "token_mean", "seq_mean_token_mean"), mini=("none",),
                        window=WINDOWS, levels=LEVELS, rel=1e-5)


@proof("trl", trainer="tpo", release=RELEASE, config=CONFIG)
def test_tpo_token_means_over_ranks(p):
    """entropy: each rank's token mean (every branch's completion tokens), gather_for_metrics(...).mean(): the
    ranks' means averaged; logits/* and mean_token_accuracy: sums and token counts gathered and summed (a global
    token mean); one value per micro-batch, averaged over the row. num_tokens: every rank's attention-mask tokens,
    gathered and summed, as the running total stood at the row's last step."""
    run = _ranks()
    p.assert_stated("entropy", run.obs("entropy", masked("per_token_entropy", "shift_completion_mask")),
                    tokens=("token_mean", "seq_mean_token_mean"), mini=("none",), window=WINDOWS, levels=LEVELS,
                    rel=1e-5)
    for key, values in (("logits/chosen", _mean_logits("chosen")), ("logits/rejected", _mean_logits("rejected")),
                        ("mean_token_accuracy", masked("correct_predictions", "chosen_bool_mask"))):
        p.assert_stated(key, run.obs(key, values), tokens=("token_mean", "seq_mean_token_mean"), mini=("none",),
                        window=WINDOWS, levels=LEVELS, rel=1e-5)
    total, per_step = 0.0, []
    for step in range(1, run.windows[-1][1] + 1):
        total += sum(float(c.locals["inputs"]["attention_mask"].sum()) for calls in run.calls for c in calls
                     if c.step == step)
        per_step.append(total)
    obs = [(row["num_tokens"], [[[[[[per_step[last - 1]]]]]]]) for row, (_first, last) in zip(run.rows[0],
                                                                                           run.windows)]
    p.check(all(r0["num_tokens"] == r1["num_tokens"] for r0, r1 in zip(*run.rows)), "every rank counts every rank")
    p.assert_stated("num_tokens", obs, levels=())
