"""Fingerprint proofs of mappings/trl.yaml for TRL's GRPO variants (trainer ``grpo_variants``; at the installed
release 1.16.0 the one variant left is ``trl.experimental.gmpo.GMPOTrainer``: it overrides ``_compute_loss`` and
inherits GRPO's generation, scoring and ``log``).

* ``ranks``: GMPOTrainer._compute_loss on 2 simulated ranks (tests/_support/proofs_trl_grpo.py), gradient
  accumulation 2, ranks holding 3+2 and 2+4 sequences of uneven lengths per step, rows of 3 and 2 optimizer steps:
  kl, entropy and the clip fractions are told apart at the process, micro-batch and window levels.
* ``trained``: a real GMPOTrainer run on the tiny model (gradient accumulation 2, logging_steps 3, num_iterations 2):
  HF's loss, num_tokens, completions/*, rewards/{fn}/* and frac_reward_zero_std, from the locals of TRL's own calls.
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

from _support import proofs_trl_grpo as G  # noqa: E402
from _support.proofs_trl import TRLRun, counter_obs, masked, per_seq  # noqa: E402
from _support.proven import close, proof  # noqa: E402

RELEASE = "1.16.0"
WINDOWS = ("mean", "last", "sum", "none")
TOKEN_CANDIDATES = ("token_mean", "seq_mean_token_mean")
GA, ROWS = 2, (3, 2)
RANKS = dict(gradient_accumulation_steps=GA, logging_steps=ROWS[0], beta=0.1, epsilon=0.2)
TRAINED = dict(gradient_accumulation_steps=2, logging_steps=3, max_steps=12, num_iterations=2, beta=0.1,
               epsilon=1e-3, epsilon_high=1e-3, per_device_train_batch_size=2, num_generations=2,
               learning_rate=1e-4)      # a policy that stays near the random one: completion lengths stay uneven
LOSS, GEN, SCORE = "_compute_loss", "_generate", "_generate_and_score_completions"

_WORK = Path(tempfile.mkdtemp(prefix="trl-grpo-variants-"))
atexit.register(shutil.rmtree, _WORK, True)


def _config(kw: dict) -> dict:
    keys = ("gradient_accumulation_steps", "logging_steps", "num_iterations", "beta")
    return {k: kw[k] for k in keys if k in kw}


@functools.lru_cache(maxsize=None)
def _ranks() -> G.RankRun:
    from trl.experimental.gmpo import GMPOConfig, GMPOTrainer
    args = GMPOConfig(output_dir=str(_WORK / "ranks"), report_to="none", use_cpu=True, **RANKS)
    steps = G.make_steps(11, sum(ROWS), GA)
    return G.run_loss_on_ranks(lambda: G.grpo_like(GMPOTrainer, args, ga=GA),
                               G.call_grpo_loss(GMPOTrainer._compute_loss, G.generation_tokens(steps)), steps, ROWS)


@functools.lru_cache(maxsize=None)
def _trained() -> TRLRun:
    return G.run_gmpo(_WORK / "trained", **TRAINED)


def _obs(run: TRLRun, key: str, fn: str, values) -> list:
    out = [(row[key], run.steps(i, fn, values)) for i, (_s, row) in enumerate(run.train_rows()) if key in row]
    assert out, f"no train row logged {key!r}"
    return out


# ------------------------------------------------------------------------------------------- on 2 ranks
@proof("trl", trainer="grpo_variants", release=RELEASE, config=_config(RANKS))
def test_gmpo_token_means_on_two_ranks(p):
    """kl (k3 per token), entropy and the clip fractions of GMPO's log-space clipping: each micro-batch's token mean
    over every process (accelerator.reduce of the sums and counts: weighted by the ranks' tokens, not the mean of
    the ranks' means), then log() averages the row's micro-batches and steps unweighted."""
    run = _ranks()
    p.check(run.rows[0] == run.rows[1], "every rank logs the same global values")
    p.check(len(run.rows[0]) == len(ROWS), run.rows[0])
    for key, tensor in (("kl", "per_token_kl"), ("entropy", "entropies"),
                        ("clip_ratio/region_mean", "is_region_clipped"), ("clip_ratio/low_mean", "is_low_clipped"),
                        ("clip_ratio/high_mean", "is_high_clipped")):
        obs = run.obs(key, masked(tensor))
        p.assert_stated(key, obs, tokens=TOKEN_CANDIDATES, mini=("none",), window=WINDOWS,
                        levels=("micro_batches", "processes", "window"))
        p.check(all(v >= 0 for v, _ in obs), f"{key}: a fraction or a divergence is not negative")
    p.check(all(0 < r["clip_ratio/region_mean"] < 1 for r in run.rows[0]), "clipped and unclipped tokens both")
    for row in run.rows[0]:
        p.check(close(row["clip_ratio/region_mean"], row["clip_ratio/low_mean"] + row["clip_ratio/high_mean"]),
                "the region is the low and the high clips")


# ------------------------------------------------------------------------------------------- trained
@proof("trl", trainer="grpo_variants", release=RELEASE, config=_config(TRAINED))
def test_gmpo_loss_is_the_sequence_mean_averaged(p):
    """HF's loss: GMPO's per_sequence_loss (-exp(mean clipped log-ratio) * A + beta * the sequence's KL mean)
    averaged over the micro-batch's sequences and divided by gradient_accumulation_steps (the step sums its
    micro-batches: their mean), then the mean over the row's steps. Not a token mean as GRPO's dapo loss is."""
    run = _trained()
    rows = run.train_rows()
    p.check(len(rows) == TRAINED["max_steps"] // TRAINED["logging_steps"], rows)
    p.check(all(c.locals["loss"].dim() == 0 for c in run.calls if c.name == LOSS), "a scalar loss per micro-batch")
    p.assert_stated("loss", _obs(run, "loss", LOSS, per_seq("per_sequence_loss")), tokens=("per_seq",),
                    mini=("none",), window=WINDOWS, levels=(), rel=1e-5)


@proof("trl", trainer="grpo_variants", release=RELEASE, config=_config(TRAINED))
def test_gmpo_generation_keys_average_the_generations_of_a_row(p):
    """completions/*, rewards/{fn}/mean and std and frac_reward_zero_std: GRPO's generation code, inherited by
    GMPO: computed once over each generation batch (gathered from every process), averaged over the row's
    generations (num_iterations 2: a generation every 2 optimizer steps)."""
    run = _trained()
    gens = [c.step for c in run.calls if c.name == GEN]
    p.check(gens == [1, 3, 5, 7, 9, 11], f"a generation every num_iterations optimizer steps: {gens}")
    p.check(type(run.calls[0].locals["self"]).__name__ == "GMPOTrainer", "the GMPO trainer ran")
    for stat in ("mean", "min", "max"):
        p.assert_stated(f"completions/{stat}_length", _obs(run, f"completions/{stat}_length", GEN,
                                                           per_seq("agg_completion_lengths")),
                        tokens=("per_seq",), stats=(stat,), mini=("none",), window=WINDOWS, levels=())
        term = per_seq("agg_completion_lengths", "agg_is_truncated", invert=True)
        p.assert_stated(f"completions/{stat}_terminated_length",
                        _obs(run, f"completions/{stat}_terminated_length", GEN, term),
                        tokens=("per_seq",), stats=(stat,), mini=("none",), window=WINDOWS, levels=())
    p.assert_stated("completions/clipped_ratio", _obs(run, "completions/clipped_ratio", GEN,
                                                      per_seq("agg_is_truncated")),
                    tokens=("per_seq",), mini=("none",), window=WINDOWS, levels=())
    for col, name in enumerate(("length_reward", "has_cat")):
        def fn_rewards(loc, col=col):
            return [[float(v)] for v in loc["rewards_per_func"][:, col] if not math.isnan(float(v))]
        p.assert_stated(f"rewards/{name}/mean", _obs(run, f"rewards/{name}/mean", SCORE, fn_rewards),
                        tokens=("per_seq",), mini=("none",), window=WINDOWS, levels=())
        p.assert_stated(f"rewards/{name}/std", _obs(run, f"rewards/{name}/std", SCORE, fn_rewards),
                        tokens=("per_seq",), stats=("std",), mini=("none",), window=WINDOWS, levels=())
    p.check(any(r["rewards/length_reward/mean"] < 0 for _s, r in run.train_rows()), "the length reward is negative")
    p.assert_stated("frac_reward_zero_std", _obs(run, "frac_reward_zero_std", SCORE, per_seq("is_std_zero")),
                    tokens=("per_seq",), mini=("none",), window=WINDOWS, levels=())


@proof("trl", trainer="grpo_variants", release=RELEASE, config=_config(TRAINED))
def test_gmpo_num_tokens_is_the_running_total_at_the_last_generation(p):
    """num_tokens: the running total of prompt + completion tokens over every process as it stood at the row's last
    generation, summed from the token counts TRL's own _generate calls held; a counter, not reduced over steps."""
    run = _trained()
    total, at = 0.0, {}
    for c in run.calls:
        if c.name == GEN:
            total += float(c.locals["total_prompt_tokens"]) + float(c.locals["agg_completion_lengths"].sum())
            at[c.step] = total
    per_step = [at[max(s for s in at if s <= step)] for step in range(1, TRAINED["max_steps"] + 1)]
    p.check(len({row["num_tokens"] for _s, row in run.train_rows()}) == len(run.train_rows()), "a growing total")
    p.assert_stated("num_tokens", counter_obs(run, "num_tokens", per_step), levels=())
