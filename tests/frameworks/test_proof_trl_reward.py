"""Fingerprint proofs of mappings/trl.yaml for TRL's RewardTrainer (issue 33: the rest of TRL 1.16.0's trainers'
entries). As in test_proof_trl_dpo_rloo.py: the installed TRL trains a sequence-classification head on the tiny model
on CPU, and the logged rows are matched against every candidate reduction of the rewards TRL itself computed (the
locals of compute_loss, tests/_support/proofs_trl.py).

7 preference pairs, per_device_train_batch_size 2, gradient_accumulation_steps 2, logging_steps 3, 9 steps:
micro-batches of 2 and 1 pairs (the epoch's last batch), so a mean over a micro-batch's pairs and a mean over the
row's pairs differ.
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

from _support.proofs_trl import TRLRun, counter_obs, run_reward, running_tokens  # noqa: E402
from _support.proven import proof  # noqa: E402

RELEASE = "1.16.0"
WINDOWS = ("mean", "last", "sum", "none")
REWARD = dict(per_device_train_batch_size=2, gradient_accumulation_steps=2, logging_steps=3, max_steps=9)
CONFIG = {k: REWARD[k] for k in ("gradient_accumulation_steps", "logging_steps")}
N_PAIRS = 7

_WORK = Path(tempfile.mkdtemp(prefix="trl-proofs-"))
atexit.register(shutil.rmtree, _WORK, True)


@functools.lru_cache(maxsize=None)
def _reward() -> TRLRun:
    return run_reward(_WORK / "reward", n_pairs=N_PAIRS, **REWARD)


def _obs(run: TRLRun, key: str, values) -> list:
    out = [(row[key], run.steps(i, "compute_loss", values)) for i, (_s, row) in enumerate(run.train_rows())
           if key in row]
    assert out, f"no train row logged {key!r}"
    return out


def _every_reward(loc):
    return [[float(v)] for v in loc["outputs"].logits.detach().flatten()]


def _pairs(fn):
    def values(loc):
        c, r = loc["rewards_chosen"].detach(), loc["rewards_rejected"].detach()
        return [[float(v)] for v in fn(c, r)]
    return values


@proof("trl", trainer="reward", release=RELEASE, config=CONFIG)
def test_reward_statistics_per_micro_batch_averaged_over_the_row(p):
    """mean_reward, min_reward, max_reward: over every chosen and rejected reward of the micro-batch (gathered from
    every process); accuracy and margin: the micro-batch's mean over its pairs (per process, then averaged over the
    processes); each appended once per micro-batch and averaged over the row's micro-batches by log()."""
    run = _reward()
    sizes = [len(c.locals["rewards_chosen"]) for c in run.calls if c.name == "compute_loss"]
    p.check(set(sizes) == {1, 2}, f"micro-batches of 2 and 1 pairs: {sizes}")
    for key, stat in (("mean_reward", "mean"), ("min_reward", "min"), ("max_reward", "max")):
        p.assert_stated(key, _obs(run, key, _every_reward), tokens=("per_seq",), stats=(stat,), mini=("none",),
                        window=WINDOWS, levels=("micro_batches", "window"), rel=1e-5)
    p.assert_stated("margin", _obs(run, "margin", _pairs(lambda c, r: c - r)), tokens=("per_seq",), mini=("none",),
                    window=WINDOWS, levels=("micro_batches", "window"), rel=1e-5)
    p.assert_stated("accuracy", _obs(run, "accuracy", _pairs(lambda c, r: (c > r).float())), tokens=("per_seq",),
                    mini=("none",), window=WINDOWS, levels=("micro_batches", "window"))
    p.check(any(0 < r["accuracy"] < 1 for _s, r in run.train_rows()), "accuracy 0 or 1 in every row: weak")


@proof("trl", trainer="reward", release=RELEASE, config=CONFIG)
def test_reward_num_tokens_is_the_running_total_at_the_rows_last_step(p):
    """num_tokens: the running total of the attention-mask tokens of every micro-batch (chosen and rejected, every
    process) at the row's last step."""
    run = _reward()
    tokens = running_tokens(run, "compute_loss", lambda loc: loc["inputs"]["attention_mask"])
    p.check(len(set(tokens)) == len(tokens), f"a running total grows every step: {tokens}")
    p.assert_stated("num_tokens", counter_obs(run, "num_tokens", tokens), levels=())
