"""Synthetic runs for the diagnostic checks (tests/unit/test_doctor_*.py, tests/trackers/test_logger_doctor.py).

A run is built in canonical names (:func:`healthy`: the curves of a run that learns, with seeded noise), a pathology
is injected at a known step by editing those curves, and the run is written out under one framework's own metric
names (:data:`RAW`, copied from the framework mapping files, so that the checks are proven to work through
translation). Eval rows (a split of their own in every framework) are separate logged dicts at the same step.
"""
from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any

N = 150              # steps of a synthetic run (0 .. N-1)

# canonical name -> the framework's own key, per framework spec (from mappings/trl.yaml, verl.yaml, openrlhf.yaml)
RAW: dict[str, dict[str, str]] = {
    "trl/grpo@1.16.0": {
        "reward/score/mean": "reward", "kl/ref/k3": "kl", "policy/entropy": "entropy",
        "policy/clip_frac": "clip_ratio/region_mean", "optim/grad_norm": "grad_norm", "loss/total": "loss",
        "optim/lr": "learning_rate", "response/length/mean": "completions/mean_length",
        "response/clip_ratio": "completions/clipped_ratio", "reward/group_zero_std_frac": "frac_reward_zero_std",
        "reward/score/std": "reward_std",
    },
    "trl/rloo@1.16.0": {
        "reward/score/mean": "reward", "kl/old_ref/k1": "kl", "policy/entropy": "entropy",
        "policy/clip_frac": "clip_ratio/region_mean", "optim/grad_norm": "grad_norm", "loss/total": "loss",
        "optim/lr": "learning_rate", "response/length/mean": "completions/mean_length",
        "response/clip_ratio": "completions/clipped_ratio",
    },
    "trl/ppo@0.12.0": {
        "reward/score/mean": "objective/scores", "kl/old_ref/k1_seq_sum": "objective/kl",
        "policy/entropy": "policy/entropy_avg", "policy/clip_frac": "policy/clipfrac_avg", "loss/policy":
        "loss/policy_avg", "optim/lr": "lr", "policy/ratio_mean": "val/ratio", "kl/old_policy/k2":
        "policy/approxkl_avg", "loss/value": "loss/value_avg",
    },
    "trl/ppo_legacy@0.11.4": {          # step()/log_stats() PPOTrainer: keys verbatim, an adaptive KL coefficient
        "reward/score/mean": "ppo/mean_scores", "kl/old_ref/k1_seq_sum": "objective/kl", "kl/coef":
        "objective/kl_coef", "loss/value": "ppo/loss/value", "kl/old_policy/k2": "ppo/policy/approxkl",
        "loss/policy": "ppo/loss/policy", "policy/entropy": "ppo/policy/entropy", "optim/lr": "ppo/learning_rate",
    },
    "trl/dpo@1.16.0": {
        "preference/accuracy": "rewards/accuracies", "eval/preference/accuracy": "eval_rewards/accuracies",
        "eval/loss/total": "eval_loss", "loss/total": "loss", "optim/grad_norm": "grad_norm",
        "optim/lr": "learning_rate", "preference/reward/margin": "rewards/margins",
    },
    "trl/reward@1.16.0": {
        "preference/score/margin": "margin", "preference/accuracy": "accuracy", "loss/total": "loss",
        "optim/grad_norm": "grad_norm", "optim/lr": "learning_rate",
    },
    "verl/ppo@0.7.0": {
        "reward/score/mean": "critic/score/mean", "kl/ref/k3": "actor/kl_loss", "kl/old_ref/k1":
        "actor/reward_kl_penalty", "policy/entropy": "actor/entropy", "policy/clip_frac": "actor/pg_clipfrac",
        "optim/grad_norm": "actor/grad_norm", "loss/policy": "actor/pg_loss", "optim/lr": "actor/lr",
        "response/length/mean": "response_length/mean", "response/clip_ratio": "response_length/clip_ratio",
        "response/aborted_ratio": "response/aborted_ratio",
        "perf/global_seqlen/balanced_min": "global_seqlen/balanced_min",
        "perf/global_seqlen/balanced_max": "global_seqlen/balanced_max",
        "perf/mfu/policy_update": "perf/mfu/actor", "time/generation": "timing_s/gen", "time/step": "timing_s/step",
        "val/gsm8k/acc/mean@1": "val-core/gsm8k/acc/mean@1",
    },
    "openrlhf/ppo@0.11.2": {
        "reward/score/mean": "reward", "kl/old_ref/k1": "kl", "policy/entropy": "entropy_loss",
        "policy/clip_frac": "ppo_clip_ratio", "optim/grad_norm": "actor_grad_norm", "loss/policy": "policy_loss",
        "optim/lr": "actor_lr", "response/length/mean": "response_length", "response/clip_ratio": "truncated",
        "time/generation": "timing/generation", "time/step": "timing/step_total",
    },
    "openrlhf/dpo@0.11.2": {
        "preference/accuracy": "acc", "eval/preference/accuracy": "eval/acc", "eval/loss/total": "eval/loss",
        "loss/total": "loss", "optim/grad_norm": "grad_norm", "optim/lr": "lr",
    },
}

RL_SPECS = ["trl/grpo@1.16.0", "verl/ppo@0.7.0", "openrlhf/ppo@0.11.2"]      # one RL trainer per framework
PREFERENCE_SPECS = ["trl/dpo@1.16.0", "openrlhf/dpo@0.11.2"]


def _noise(rng: random.Random, sd: float) -> float:
    return rng.gauss(0.0, sd)


def healthy(spec: str, n: int = N, seed: int = 0) -> dict[str, list[float | None]]:
    """Canonical series of a run that learns, for the names ``spec`` logs (None: not logged at that step)."""
    rng = random.Random(seed)
    names = RAW[spec]
    out: dict[str, list[float | None]] = {}
    for name in names:
        vals: list[float | None] = []
        for t in range(n):
            vals.append(_value(name, t, n, rng))
        out[name] = vals
    return out


def _value(name: str, t: int, n: int, rng: random.Random) -> float | None:
    if name.startswith("eval/") or name.startswith("val/"):
        if t % 10 != 9:
            return None
    if name == "reward/score/mean":
        return 0.2 + 0.4 * (1 - math.exp(-t / 60)) + _noise(rng, 0.03)
    if name == "reward/score/std":
        return 0.3 + _noise(rng, 0.02)
    if name in ("kl/ref/k3", "kl/old_ref/k1"):
        return 0.0 if t == 0 else 0.02 * (1 - math.exp(-t / 40)) * max(0.5, 1 + _noise(rng, 0.1))
    if name == "kl/old_ref/k1_seq_sum":
        return 0.0 if t == 0 else 3.0 * (1 - math.exp(-t / 40)) * max(0.5, 1 + _noise(rng, 0.1))
    if name == "policy/entropy":
        return 0.9 - 0.3 * t / n + _noise(rng, 0.02)
    if name == "policy/clip_frac":
        return max(0.0, 0.03 + _noise(rng, 0.005))
    if name == "optim/grad_norm":
        return 0.5 * max(0.3, 1 + _noise(rng, 0.2))
    if name in ("loss/total", "loss/policy"):
        return _noise(rng, 0.02)
    if name == "optim/lr":
        return 1e-6
    if name == "policy/ratio_mean":
        return 1.0 + _noise(rng, 0.005)
    if name == "kl/old_policy/k2":
        return 0.004 * max(0.3, 1 + _noise(rng, 0.2))
    if name == "loss/value":
        return 0.2 + 0.3 * math.exp(-t / 40) + abs(_noise(rng, 0.02))
    if name == "kl/coef":
        return 0.2 * (1 + 0.05 * math.sin(t / 15))         # an adaptive coefficient near its initial value
    if name == "response/length/mean":
        return 200 + 30 * t / n + _noise(rng, 5)
    if name == "response/clip_ratio":
        return 0.01 + abs(_noise(rng, 0.005))
    if name == "response/aborted_ratio":
        return 0.0
    if name == "reward/group_zero_std_frac":
        return min(1.0, max(0.0, 0.2 + _noise(rng, 0.05)))
    if name == "perf/global_seqlen/balanced_max":
        return float(int(10000 + _noise(rng, 200)))
    if name == "perf/global_seqlen/balanced_min":
        return float(int(9500 + _noise(rng, 100)))
    if name == "perf/mfu/policy_update":
        return 0.45 + _noise(rng, 0.02)
    if name == "time/generation":
        return 30 + _noise(rng, 2)
    if name == "time/step":
        return 100 + _noise(rng, 5)
    if name == "val/gsm8k/acc/mean@1":
        return 0.3 + 0.3 * (1 - math.exp(-t / 60)) + _noise(rng, 0.01)
    if name == "preference/accuracy":
        return min(0.97, 0.5 + 0.35 * (1 - math.exp(-t / 50)) + _noise(rng, 0.03))
    if name == "eval/preference/accuracy":
        return 0.5 + 0.25 * (1 - math.exp(-t / 60)) + _noise(rng, 0.005)
    if name == "eval/loss/total":
        return 0.69 - 0.2 * (1 - math.exp(-t / 60)) + _noise(rng, 0.005)
    if name == "preference/reward/margin":
        return 0.5 * (1 - math.exp(-t / 50)) + _noise(rng, 0.05)
    if name == "preference/score/margin":
        return 2.0 * (1 - math.exp(-t / 40)) + 0.05 + _noise(rng, 0.05)
    raise KeyError(name)


def rows(spec: str, series: dict[str, list[float | None]]) -> list[dict[str, Any]]:
    """The run as the framework logs it: one dict per step under its own names (``step`` kept), eval rows apart."""
    names = RAW[spec]
    n = max(len(v) for v in series.values())
    out: list[dict[str, Any]] = []
    for t in range(n):
        train: dict[str, Any] = {}
        ev: dict[str, Any] = {}
        for name, vals in series.items():
            v = vals[t] if t < len(vals) else None
            if v is None:
                continue
            (ev if name.startswith("eval/") else train)[names[name]] = v
        if train:
            out.append({"step": t, **train})
        if ev:
            out.append({"step": t, **ev})
    return out


def write(path: Path, spec: str, series: dict[str, list[float | None]]) -> Path:
    """The run as JSON lines (one logged dict per line), as ``translate`` and ``doctor`` read them."""
    with open(path, "w", encoding="utf-8") as fh:
        for row in rows(spec, series):
            fh.write(json.dumps(row) + "\n")
    return path
