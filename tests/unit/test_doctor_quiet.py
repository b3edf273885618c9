"""No false alarm on real runs: the shipped examples (examples/) and the public logs of tests/data/public-logs.

Every finding on these files is a real symptom, each explained below with the values that show it; everything else
must stay quiet. A new finding on one of them is either a false alarm (fix the check) or a real symptom (add it here
with its explanation).
"""
from __future__ import annotations

import json

import pytest

from trackbridge.doctor import diagnose
from trackbridge.inputs import open_runs

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
    },
    "public-logs/05_trl_grpo.json": {
        "no-learning-signal": (1, 100, "frac_reward_zero_std is at least 0.75 at every step"),
    },
    "public-logs/07_trl_dpo.json": {},
    "public-logs/10_verl.json": {},
    "public-logs/12_trl_ppo.json": {},
    "public-logs/14_trl_grpo.json": {
        "no-learning-signal": (5, 115, "frac_reward_zero_std is 0.55-0.9 over steps 5-115 (23 logged points), "
                                       "then dips to 0.45"),
        "responses-truncated": (25, 200, "completions/clipped_ratio is 0.14 at step 25, then 0.84-1.0 to the end: "
                                         "nearly every completion hits the 512-token limit"),
    },
    "public-logs/16_trl_grpo.json": {},     # kl is logged as exactly 0.0 (beta 0, Unsloth): not a measurement
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
    verl = json.loads((LOGS / "01_verl.json").read_text())["rows"]
    mfu = [r["perf/mfu/actor"] for r in verl if "perf/mfu/actor" in r]
    assert len(mfu) == 200 and 0.035 <= min(mfu) and max(mfu) <= 0.079
