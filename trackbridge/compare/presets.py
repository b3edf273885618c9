"""Presets: what practitioners look at first, as canonical names and patterns over them.

Patterns are shell-style (``*`` matches across ``/``). A name with a split prefix (``eval/``, ``test/``) matches a
pattern when the name without the prefix does. Within a preset, the order of the patterns is the order of the
charts in the report. What each framework calls these: ``mappings/`` (each entry cites the framework source file and
release it was read from).
"""
from __future__ import annotations

from fnmatch import fnmatchcase
from typing import Iterable

SPLITS = ("eval/", "test/")

PRESETS: dict[str, list[str]] = {
    # did the policy get better? validation accuracy per data source, then the training reward
    "effectiveness": [
        "val/*/acc/mean@*", "val/*/reward/mean@*", "val/*/score/mean@*", "val/*",
        "reward/score/mean", "reward/fn/*/mean", "reward/shaped/mean", "reward/score/std", "reward/fn/*/std",
        "reward/score/max", "reward/score/min", "reward/group_std/mean", "reward/group_zero_std_frac",
        "preference/accuracy", "preference/reward/margin", "preference/reward/chosen",
        "preference/reward/rejected", "preference/win_rate", "preference/score/margin",
    ],
    # is training healthy? KL (to the reference, and between old and new policy), entropy, clipping, gradients,
    # learning rate, losses
    "stability": [
        "kl/ref/k3", "kl/ref/k1", "kl/ref/k2", "kl/old_ref/k1", "kl/old_ref/k3", "kl/old_ref/k2",
        "kl/old_ref/k1_seq_sum", "kl/old_ref/*", "kl/old_policy/k1", "kl/old_policy/k2", "kl/old_policy/*",
        "kl/rollout/k1", "kl/rollout/k3", "kl/coef", "kl/loss_coef", "kl/*",
        "policy/entropy", "policy/entropy_seq_sum",
        "policy/clip_frac", "policy/clip_frac_low", "policy/clip_frac_high", "policy/clip_frac*",
        "policy/ratio_mean",
        "optim/grad_norm", "optim/lr", "optim/critic_grad_norm", "optim/critic_lr",
        "loss/total", "loss/policy", "loss/value", "loss/*",
        "value/explained_variance", "value/clip_frac", "reward/kl_penalty/mean",
    ],
    # how fast? throughput, step time, generation time
    "efficiency": [
        "perf/throughput", "time/step", "time/gen", "time/generation", "time/*",
        "perf/tokens_per_s", "perf/samples_per_s", "perf/samples_per_second", "perf/steps_per_second",
        "perf/tokens_per_step", "perf/response_tokens_per_step", "perf/mfu/*", "perf/memory/*",
    ],
    # what was generated? response length and truncation, prompt length
    "data": [
        "response/length/mean", "response/length/max", "response/length/min", "response/length/std",
        "response/clip_ratio", "response/*",
        "prompt/length/mean", "prompt/length/max", "prompt/length/min", "prompt/clip_ratio", "prompt/*",
        "sequence/*", "perf/global_seqlen/*", "tools/*",
    ],
}

# Names that look alike in trackers but are different quantities: never overlaid; the report says so when one run
# has one and another run the other.
LOOK_ALIKES: list[tuple[str, str, str]] = [
    ("kl/ref/k3", "kl/old_policy/k1",
     "kl/ref/k3 is the KL of the policy from the reference model; kl/old_policy/k1 is the KL between the rollout-time "
     "(old) policy and the policy being updated (PPO's 'approx KL'): a different quantity"),
    ("kl/ref/k3", "kl/old_ref/k1",
     "kl/ref/k3 is the KL loss term (k3 of the policy being updated against the reference: GRPO's kl, veRL's "
     "actor/kl_loss); kl/old_ref/k1 is the KL penalty in the reward (k1 of the rollout-time policy against the "
     "reference: veRL's actor/reward_kl_penalty, OpenRLHF's kl without use_loss): a different quantity"),
    ("kl/old_ref/k1", "kl/old_policy/k1",
     "kl/old_ref/k1 is the rollout-time policy's KL to the reference model; kl/old_policy/k1 is the KL between the "
     "rollout-time policy and the policy being updated: a different quantity"),
    ("kl/old_ref/k1", "kl/old_ref/k1_seq_sum",
     "kl/old_ref/k1 is a per-token mean; kl/old_ref/k1_seq_sum is summed over each response (nats per sequence)"),
    ("kl/ref/k3", "kl/old_ref/k1_seq_sum",
     "kl/ref/k3 is a per-token k3 KL of the policy being updated; kl/old_ref/k1_seq_sum is the rollout-time policy's "
     "k1 KL to the reference summed over each response (nats per sequence): a different quantity"),
    ("kl/old_ref/k1_seq_sum", "kl/old_policy/k1",
     "kl/old_ref/k1_seq_sum is the KL to the reference model summed over each response; kl/old_policy/k1 is the "
     "per-token KL between old and current policy"),
    ("policy/entropy", "policy/entropy_seq_sum",
     "policy/entropy is a per-token mean; policy/entropy_seq_sum is summed over each response"),
    ("reward/score/mean", "reward/shaped/mean",
     "reward/score/mean is the raw score; reward/shaped/mean has the KL penalty subtracted"),
]


def strip_split(name: str) -> str:
    for p in SPLITS:
        if name.startswith(p):
            return name[len(p):]
    return name


def _match(name: str, pattern: str) -> bool:
    return fnmatchcase(name, pattern) or fnmatchcase(strip_split(name), pattern)


def preset_of(name: str) -> str | None:
    for preset, patterns in PRESETS.items():
        if any(_match(name, p) for p in patterns):
            return preset
    return None


def order_key(name: str) -> tuple:
    """Preset order, then pattern order inside the preset, then train before eval/test, then the name."""
    for i, (preset, patterns) in enumerate(PRESETS.items()):
        for j, p in enumerate(patterns):
            if _match(name, p):
                return (i, j, name != strip_split(name), name)
    return (len(PRESETS), 0, name != strip_split(name), name)


def select(spec: "None | str | Iterable[str]", available: Iterable[str], *,
           is_axis=lambda n: False) -> tuple[list[str], list[str]]:
    """The metrics to chart, in report order, and what was asked for but found in no run.

    ``spec``: ``None`` (every metric of every run except progress axes), a preset name, a canonical name, a
    pattern (``kl/*``), or a comma-separated list or a list of those."""
    avail = list(dict.fromkeys(available))
    if spec is None:
        chosen = [n for n in avail if not is_axis(n)]
        return sorted(chosen, key=order_key), []
    items = [s.strip() for s in (spec.split(",") if isinstance(spec, str) else
                                 [x for part in spec for x in str(part).split(",")]) if s.strip()]
    chosen: dict[str, None] = {}
    missing: list[str] = []
    for item in items:
        if item.lower() in PRESETS:
            item = item.lower()
            hits = [n for n in avail if any(_match(n, p) for p in PRESETS[item])]
            hits.sort(key=order_key)
            if not hits:
                missing.append(f"{item} (preset: none of its metrics is in any run)")
        elif any(c in item for c in "*?["):
            hits = sorted((n for n in avail if _match(n, item)), key=order_key)
            if not hits:
                missing.append(item)
        else:
            hits = [item] if item in avail else []
            if not hits:
                missing.append(item)
        chosen.update(dict.fromkeys(hits))
    return list(chosen), missing


def preset_names() -> list[str]:
    return list(PRESETS)
