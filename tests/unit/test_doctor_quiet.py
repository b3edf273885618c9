"""No false alarm on real runs: the shipped examples (examples/) and the public logs of tests/data/public-logs.

Every finding on these files is a real symptom, each explained below with the values that show it; everything else
must stay quiet. A new finding on one of them is either a false alarm (fix the check) or a real symptom (add it here
with its explanation).
"""
from __future__ import annotations

import json

import pytest

from trackbridge.doctor import diagnose
from trackbridge.read.inputs import open_runs

from _support import DATA, ROOT

EXAMPLES = ROOT / "examples"
LOGS = DATA / "public-logs"

# file -> {check id: (first step, last step, why it is real)}
EXPECTED: dict[str, dict[str, tuple[int, int, str]]] = {
    "examples/trl_grpo_trainer_state.json": {
        "no-learning-signal": (1, 100, "frac_reward_zero_std is 0.75 or 1.0 at every one of the 100 steps: every "
                                       "completion of most prompts gets reward 0 (reward is 0.0 at 84 steps), so "
                                       "those groups have no advantage; the gradient norm is ~1e-3 on those steps "
                                       "and ~0.08 on the others"),
        "reward-not-improving": (40, 100, "reward is 0.0 at 84 of the 100 steps: the mean of the last 20 (0.003) is "
                                          "below the mean of the first 20 (0.022); grouped after no-learning-signal, "
                                          "its cause"),
        "kl-near-zero": (22, 100, "kl is 0.0001-0.002 nats/token at every step (the policy barely moves) and the "
                                  "best of the last 20 rewards is no better than before them; grouped after "
                                  "no-learning-signal, its cause"),
    },
    "examples/verl_console.log": {
        "mfu-low": (101, 300, "perf/mfu/actor is 0.035-0.079 at every step: the policy update uses under 8% of "
                              "the GPUs' peak FLOPs"),
    },
    "examples/trl_ppo_console.log": {},
    "examples/trl_dpo_wandb_export.csv": {},
    "public-logs/01_verl.json": {
        "mfu-low": (101, 300, "the same run as examples/verl_console.log (its source): perf/mfu/actor 0.035-0.079"),
    },
    "public-logs/04_trl_grpo.json": {
        "responses-truncated": (5, 200, "completions/clipped_ratio is 0.5-1.0 at every logged step (mean length "
                                        "386-512 of a 512 limit, 512 exactly where the ratio is 1.0)"),
        "reward-not-improving": (200, 200, "reward rises to 1.47 by step ~80, then falls to -0.28 and -0.49 at the "
                                           "end: the mean of the last 20 logged points (0.32) is below the first "
                                           "20's (0.56) at the last step"),
    },
    "public-logs/05_trl_grpo.json": {
        "no-learning-signal": (1, 100, "frac_reward_zero_std is at least 0.75 at every step"),
        "reward-not-improving": (40, 100, "the same reward as examples/trl_grpo_trainer_state.json: 0.0 at 84 steps"),
        "kl-near-zero": (22, 100, "the same KL as examples/trl_grpo_trainer_state.json: under 0.002 nats/token"),
    },
    "public-logs/07_trl_dpo.json": {},
    "public-logs/10_verl.json": {},
    "public-logs/12_trl_ppo.json": {},
    "public-logs/14_trl_grpo.json": {
        "no-learning-signal": (5, 115, "frac_reward_zero_std is 0.55-0.9 over steps 5-115 (23 logged points), "
                                       "then dips to 0.45"),
        "no-update": (50, 190, "grad_norm is exactly 0.0 (with learning_rate > 0) at steps 50-60, 95-110, "
                               "150-160 and 180-190: no group had a reward spread, so nothing was updated; grouped "
                               "after no-learning-signal, its cause"),
        "responses-truncated": (5, 200, "completions/clipped_ratio is 1.0 at step 5 (every completion truncated, "
                                        "one point is enough), 0.14 at step 25, then 0.84-1.0 to the end: nearly "
                                        "every completion hits the 512-token limit"),
    },
    # kl is logged as exactly 0.0 (beta 0, Unsloth): not a measurement
    "public-logs/16_trl_grpo.json": {
        "reward-not-improving": (40, 200, "reward swings between 0.44 and 2.5 with no trend over 200 steps: the "
                                          "mean of the last 20 (1.59) is below the first 20's (1.86), beyond twice "
                                          "its noise"),
    },
}


def _path(name: str):
    return ROOT / name if name.startswith("examples/") else LOGS / name.split("/", 1)[1]


def test_every_example_and_public_log_is_covered():
    names = {f"examples/{p.name}" for p in EXAMPLES.iterdir() if p.suffix in (".json", ".log", ".csv")}
    names |= {f"public-logs/{p.name}" for p in LOGS.glob("*.json")}
    assert names == set(EXPECTED), sorted(names ^ set(EXPECTED))


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_only_real_symptoms_are_found(name):
    runs = open_runs(str(_path(name)), rows=True)
    assert len(runs) == 1
    d = diagnose(runs[0])
    assert d.records > 0 and d.ran, (name, d.not_run)
    found = {f.id: (int(f.first_step), int(f.last_step)) for f in d.findings}
    want = {cid: (a, b) for cid, (a, b, _why) in EXPECTED[name].items()}
    assert found == want, (name, [f.summary() for f in d.findings])


def test_the_grpo_example_symptom_is_what_the_values_say():
    """The explanation above, checked against the file itself."""
    rows = json.loads((EXAMPLES / "trl_grpo_trainer_state.json").read_text())["log_history"]
    zero = [r["frac_reward_zero_std"] for r in rows if "frac_reward_zero_std" in r]
    assert len(zero) == 100 and min(zero) >= 0.75
    assert sum(1 for r in rows if r.get("reward") == 0.0) == 84
    kls = [r["kl"] for r in rows if "kl" in r]
    assert len(kls) == 100 and max(abs(k) for k in kls) < 0.002
    rewards = [r["reward"] for r in rows if "reward" in r]
    assert len(rewards) == 100 and sum(rewards[-20:]) / 20 < sum(rewards[:20]) / 20
    logs14 = json.loads((LOGS / "14_trl_grpo.json").read_text())["rows"]
    zero = sorted(r["step"] for r in logs14 if r.get("grad_norm") == 0.0 and r.get("learning_rate", 0) > 0)
    assert zero[:3] == [10, 15, 30] and {50, 55, 60, 95, 100, 105, 110, 150, 155, 160, 180, 185, 190} <= set(zero)
    verl = json.loads((LOGS / "01_verl.json").read_text())["rows"]
    mfu = [r["perf/mfu/actor"] for r in verl if "perf/mfu/actor" in r]
    assert len(mfu) == 200 and 0.035 <= min(mfu) and max(mfu) <= 0.079
