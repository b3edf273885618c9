"""Fingerprint proofs of mappings/trl.yaml on 2 simulated data-parallel ranks: TRL 1.16.0's own loss methods
(GRPOTrainer._compute_loss under the cispo, vespo, grpo, bnpo, dr_grpo and luspo loss types and the adaptive entropy
bonus; RLOOTrainer._compute_loss; A2POTrainer._prepare_inputs + compute_loss) called micro-batch by micro-batch on
a trainer built without __init__ (tests/_support/proofs_trl_grpo.py), then the trainer's own ``log``. Ranks hold
3+2 and 2+4, 1+3 and 2+1 ... sequences per step (uneven tokens too), gradient accumulation 2, rows of 3 and 2
optimizer steps: the process (weighted, mean of ranks, rank 0's), micro-batch and window reductions give different
numbers.
"""
from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from pathlib import Path

import pytest

pytest.importorskip("trl")

from _support import proofs_trl_grpo as G  # noqa: E402
from _support.proofs_trl import masked, per_seq  # noqa: E402
from _support.proven import close, proof  # noqa: E402

RELEASE = "1.16.0"
WINDOWS = ("mean", "last", "sum", "none")
TOKENS = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "per_seq")
GA, ROWS = 2, (3, 2)
LEVELS = ("micro_batches", "processes", "window")

_WORK = Path(tempfile.mkdtemp(prefix="trl-grpo-ranks-"))
atexit.register(shutil.rmtree, _WORK, True)


def _grpo_args(**kw):
    from trl import GRPOConfig
    return GRPOConfig(output_dir=str(_WORK / "out"), report_to="none", use_cpu=True, gradient_accumulation_steps=GA,
                      logging_steps=ROWS[0], max_completion_length=8, **kw)


@functools.lru_cache(maxsize=None)
def _grpo(items: tuple) -> G.RankRun:
    from trl import GRPOTrainer
    args = _grpo_args(**dict(items))
    steps = G.make_steps(21, sum(ROWS), GA)
    return G.run_loss_on_ranks(lambda: G.grpo_like(GRPOTrainer, args, ga=GA),
                               G.call_grpo_loss(GRPOTrainer._compute_loss, G.generation_tokens(steps)), steps, ROWS)


def _config(items: dict) -> dict:
    return {"gradient_accumulation_steps": GA, "logging_steps": ROWS[0], **items}


# ------------------------------------------------------------------------------------------- GRPO: cispo, vespo
CISPO = {"loss_type": "cispo", "beta": 0.0, "epsilon_high": 1.2}
VESPO = {"loss_type": "vespo", "beta": 0.0}


@proof("trl", trainer="grpo", release=RELEASE, config=_config(CISPO))
def test_grpo_cispo_clip_ratio_is_a_global_token_fraction(p):
    """cispo_clip_ratio: the share of tokens whose ratio exceeds epsilon_high with a positive advantage, per
    micro-batch over every process's tokens (accelerator.reduce of sums and counts), averaged by log()."""
    run = _grpo(tuple(sorted(CISPO.items())))
    obs = run.obs("cispo_clip_ratio", masked("is_cispo_clipped"))
    p.check(all(0 < v < 1 for v, _ in obs), [v for v, _ in obs])
    p.assert_stated("cispo_clip_ratio", obs, tokens=TOKENS, mini=("none",), window=WINDOWS, levels=LEVELS)


@proof("trl", trainer="grpo", release=RELEASE, config=_config(VESPO))
def test_grpo_vespo_phi_is_a_global_sequence_mean(p):
    """vespo/phi_seq_mean: VESPO's gamma weight phi(w), one per sequence, averaged over every process's sequences of
    the micro-batch (reduce of the sum and the sequence count: weighted by the ranks' sequences), then by log()."""
    run = _grpo(tuple(sorted(VESPO.items())))
    calls = [c for c in run.calls[0] if "vespo/phi_seq_mean" in c.appended]
    p.check(calls and all(tuple(c.locals["phi_seq"].shape) == (c.locals["mask"].shape[0], 1) for c in calls),
            "phi is one value per sequence")
    p.assert_stated("vespo/phi_seq_mean", run.obs("vespo/phi_seq_mean", masked("phi_seq")), tokens=TOKENS,
                    mini=("none",), window=WINDOWS, levels=("processes", "window"))


# ------------------------------------------------------------------------------------------- GRPO: policy_loss
def _policy_loss_proof(loss_type: str):
    items = {"loss_type": loss_type, "beta": 0.05, "entropy_coef": 0.01}

    def fn(p):
        run = _grpo(tuple(sorted(items.items())))
        obs = run.obs("policy_loss", masked("per_token_loss"))
        p.check(len(obs) == len(ROWS), obs)
        p.assert_stated("policy_loss", obs, tokens=TOKENS + ("seq_mean_token_sum_norm",), mini=("none",),
                        window=WINDOWS, levels=("micro_batches", "window"), norm_len=8, rel=1e-5)
        for c in run.calls[0]:
            if "policy_loss" in c.appended:
                p.check(not close(c.appended["policy_loss"], float(c.locals["loss"].detach())),
                        "the logged policy loss is the loss before the entropy bonus (and GA division)")
                break
    fn.__name__ = fn.__qualname__ = f"test_grpo_policy_loss_{loss_type}_on_two_ranks"
    fn.__doc__ = (f"policy_loss, loss_type {loss_type}: each rank's loss before the entropy bonus and the division "
                  "by gradient_accumulation_steps (beta * KL included), gathered and averaged over the processes "
                  "unweighted, then log() averages the row's micro-batches and steps.")
    return proof("trl", trainer="grpo", release=RELEASE, config=_config(items))(fn)


test_grpo_policy_loss_grpo_on_two_ranks = _policy_loss_proof("grpo")
test_grpo_policy_loss_bnpo_on_two_ranks = _policy_loss_proof("bnpo")
test_grpo_policy_loss_dr_grpo_on_two_ranks = _policy_loss_proof("dr_grpo")
test_grpo_policy_loss_luspo_on_two_ranks = _policy_loss_proof("luspo")


# ------------------------------------------------------------------------------------------- GRPO: entropy_coef
ADAPTIVE = {"use_adaptive_entropy": True, "entropy_coef": 0.05, "entropy_target": 1.5, "entropy_coef_delta": 0.01,
            "beta": 0.0}


@proof("trl", trainer="grpo", release=RELEASE, config=_config(ADAPTIVE))
def test_grpo_adaptive_entropy_coef_averages_the_rows_steps(p):
    """entropy_coef (adaptive): appended once per optimizer step, at its last micro-batch (sync_gradients), after
    the controller moved it by entropy_coef_delta towards entropy_target; log() averages the row's steps."""
    run = _grpo(tuple(sorted(ADAPTIVE.items())))
    per_step = {c.step: c.appended["entropy_coef"] for c in run.calls[0] if "entropy_coef" in c.appended}
    p.check(sorted(per_step) == list(range(1, sum(ROWS) + 1)), f"one value per optimizer step: {sorted(per_step)}")
    p.check(len({round(v, 9) for v in per_step.values()}) > 2, f"the coefficient moves: {per_step}")
    obs = [(row["entropy_coef"], [[[[[[per_step[s]]]]]] for s in range(lo, hi + 1)])
           for row, (lo, hi) in zip(run.rows[0], run.windows)]
    p.assert_stated("entropy_coef", obs, tokens=("none",), mini=("none",), window=WINDOWS, levels=())


# ------------------------------------------------------------------------------------------- RLOO
RLOO = {"beta": 0.0, "epsilon": 0.2}
RLOO_ROWS = (3, 2, 3)


def _rloo_steps():
    """Random micro-batches, and some where every sequence is low-clipped (negative advantages, old log-probs 0.3
    above the policy's on every token) or none can be high-clipped (negative advantages): the micro-batch min and max
    of the 0/1 clip flags then vary."""
    steps = G.make_steps(31, sum(RLOO_ROWS), GA)
    # all-low micro-batches of 6, 6, 5 and 4 sequences (over both ranks), the rows' averages 5: the mean of the
    # micro-batches' values is not their sequence-weighted mean
    for s, u, kind in ((0, 1, "low"), (1, 1, "neg"), (2, 0, "neg"), (3, 1, "low"), (5, 0, "neg"), (6, 0, "low"),
                       (7, 0, "low")):
        for r in range(G.WORLD):
            m = steps[s][r][u]
            m.advantages = -m.advantages.abs()
            if kind == "low":
                m.old_logp = (m.logp + 0.3) * m.mask
    return steps


@functools.lru_cache(maxsize=None)
def _rloo() -> G.RankRun:
    from trl import RLOOConfig
    args = RLOOConfig(output_dir=str(_WORK / "rloo"), report_to="none", use_cpu=True, gradient_accumulation_steps=GA,
                      logging_steps=ROWS[0], **RLOO)
    return G.run_loss_on_ranks(lambda: G.rloo_like(args, ga=GA), G.call_rloo_loss, _rloo_steps(), RLOO_ROWS)


@proof("trl", trainer="rloo", release=RELEASE, config=_config(RLOO))
def test_rloo_clip_ratios_gather_sequence_flags(p):
    """clip_ratio/*: RLOO's ratio is one per sequence (exp of the summed log-ratio); each micro-batch's 0/1 flags
    gathered from every process, then nanmean / nanmin / nanmax; log() averages the micro-batches and steps. The
    min and max are fingerprinted per micro-batch first (what TRL appended), then the rows."""
    run = _rloo()
    for key, flag in (("clip_ratio/region_mean", "is_region_clipped"), ("clip_ratio/low_mean", "is_low_clipped"),
                      ("clip_ratio/high_mean", "is_high_clipped")):
        p.assert_stated(key, run.obs(key, per_seq(flag)), tokens=("per_seq",), mini=("none",), window=WINDOWS,
                        levels=("processes", "window"))
    for key, flag, stat in (("clip_ratio/low_min", "is_low_clipped", "min"),
                            ("clip_ratio/high_max", "is_high_clipped", "max")):
        per_micro = [(c0.appended[key], [[[[per_seq(flag)(c0.locals)], [per_seq(flag)(c1.locals)]]]])
                     for c0, c1 in zip(run.calls[0], run.calls[1]) if key in c0.appended]
        p.check(len({v for v, _ in per_micro}) == 2, f"{key}: micro-batches of 0 and of 1")
        found = p.assert_stated(key, per_micro, tokens=("per_seq",), stats=(stat, "mean"), micro=("none",),
                                mini=("none",), levels=())
        rows = run.obs(key, per_seq(flag))
        p.check(all(0 < v < 1 for v, _ in rows), f"{key}: rows strictly between 0 and 1: {[v for v, _ in rows]}")
        p.assert_stated(key, rows, tokens=(found.tokens,), stats=(found.stat,), processes=(found.processes,),
                        mini=("none",), window=WINDOWS, levels=("window",))


# ------------------------------------------------------------------------------------------- A2PO
A2PO = {"beta2": 0.5}


@functools.lru_cache(maxsize=None)
def _a2po() -> G.RankRun:
    from transformers import AutoTokenizer
    from trl.experimental.a2po import A2POConfig

    from _support.tiny_trl import build_tiny_model
    tok = AutoTokenizer.from_pretrained(build_tiny_model(_WORK / "a2po-model"))
    args = A2POConfig(output_dir=str(_WORK / "a2po"), report_to="none", use_cpu=True, gradient_accumulation_steps=GA,
                      logging_steps=ROWS[0], **A2PO)
    with G.a2po_generation():
        return G.run_loss_on_ranks(lambda: G.a2po_like_with_rollout(args, tok), G.call_a2po_step,
                                   G.make_steps(41, sum(ROWS), GA), ROWS)


@proof("trl", trainer="a2po", release=RELEASE, config=_config(A2PO))
def test_a2po_metrics_are_rank0s_micro_batch_means(p):
    """reward, v_star (appended by _prepare_inputs, the rollout of each micro-batch) and advantage (r - V*),
    implicit_reward (beta2 * log pi/pi_ref, appended by compute_loss): each the mean over the process's own
    micro-batch, never gathered; the row rank 0 logs averages its micro-batches and steps (rank 1 logs other
    numbers)."""
    run = _a2po()
    p.check(run.rows[0] != run.rows[1], "each rank logs its own values")
    for key, fn, tensor in (("reward", "_prepare_inputs", "rewards"), ("v_star", "_prepare_inputs", "v_star"),
                            ("advantage", "compute_loss", "target"),
                            ("implicit_reward", "compute_loss", "implicit_reward")):
        p.check(all(c.name == fn for r in run.calls for c in r if key in c.appended), f"{key} appended by {fn}")
        p.assert_stated(key, run.obs(key, per_seq(tensor)), tokens=("per_seq",), mini=("none",), window=WINDOWS,
                        levels=("processes", "window"))
    p.check(any(r["advantage"] < 0 for r in run.rows[0]) and any(r["advantage"] > 0 for r in run.rows[0]) or
            any(r["implicit_reward"] < 0 for r in run.rows[0]), "signs that a transform would flip")
