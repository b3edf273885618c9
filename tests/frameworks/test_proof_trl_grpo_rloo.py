"""Fingerprint proof of mappings/trl.yaml's RLOO frac_reward_zero_std under its stated config (beta 0, no reward
clipping: the rewards are the weighted scores): the installed TRL (1.16.0) RLOOTrainer trains the tiny model on CPU
(tests/_support/proofs_trl.py run_rloo), and the logged rows are matched against TRL's own per-completion flags."""
from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from pathlib import Path

import pytest

pytest.importorskip("trl")
pytest.importorskip("datasets")

from _support.proofs_trl import TRLRun, per_seq, run_rloo  # noqa: E402
from _support.proven import proof  # noqa: E402

RELEASE = "1.16.0"
WINDOWS = ("mean", "last", "sum", "none")
RLOO = dict(gradient_accumulation_steps=2, logging_steps=3, max_steps=9, num_iterations=2, beta=0.0,
            per_device_train_batch_size=2, num_generations=2, learning_rate=1e-4)
SCORE = "_generate_and_score_completions"

_WORK = Path(tempfile.mkdtemp(prefix="trl-grpo-rloo-"))
atexit.register(shutil.rmtree, _WORK, True)


@functools.lru_cache(maxsize=None)
def _rloo() -> TRLRun:
    return run_rloo(_WORK / "rloo", **RLOO)


@proof("trl", trainer="rloo", release=RELEASE,
       config={"gradient_accumulation_steps": 2, "logging_steps": 3, "num_iterations": 2, "beta": 0.0,
               "reward_clip_range": None})
def test_rloo_zero_std_fraction_without_kl_or_clipping(p):
    """frac_reward_zero_std: the mean of TRL's per-completion flags (the completion's group has reward std 0) over
    each generation batch (gathered from every process), averaged over the row's generations."""
    run = _rloo()
    p.check(run.config["beta"] == 0.0 and run.config.get("reward_clip_range") is None, run.config)
    rows = run.train_rows()
    obs = [(row["frac_reward_zero_std"], run.steps(i, SCORE, per_seq("is_std_zero")))
           for i, (_s, row) in enumerate(rows)]
    p.check(len({round(v, 9) for v, _ in obs}) > 1, f"every row logs the same fraction: {[v for v, _ in obs]}")
    p.assert_stated("frac_reward_zero_std", obs, tokens=("per_seq",), mini=("none",), window=WINDOWS, levels=())
