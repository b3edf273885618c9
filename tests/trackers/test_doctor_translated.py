"""The same findings after translation to another framework's names (issue 32's done-when): labelled corpus runs of
TRL (tests/data/doctor/), migrated as a user would (``trackbridge migrate ... --names verl`` / ``openrlhf``), then read
by ``trackbridge doctor``: every finding of a check that could run on both comes back, at the same steps."""
from __future__ import annotations

import pytest

from trackbridge.doctor import diagnose
from trackbridge.migrate import migrate
from trackbridge.read.inputs import open_runs

from _support import DATA

RUNS = DATA / "doctor" / "runs"
# sick runs whose series veRL and OpenRLHF both log (KL, grad norm, entropy, reward, loss, lengths)
SICK = ["grpo_lr_high", "grpo_entropy_collapse", "grpo_beta_weak", "grpo_length_reward"]


def _findings(locator: str, **kw):
    (run,) = open_runs(locator, rows=True)
    d = diagnose(run, **kw)
    return {(f.id, tuple((float(s.first), float(s.last)) for s in f.stretches)) for f in d.findings}, set(d.ran)


@pytest.mark.parametrize("target", ["verl/ppo@0.9.1", "openrlhf/ppo@0.11.2"])
def test_the_same_findings_under_another_frameworks_names(tmp_path, target):
    compared = 0
    for name in SICK:
        state = RUNS / name / "trainer_state.json"
        assert state.is_file(), state
        want, ran = _findings(str(state))
        assert want, f"{name}: the corpus run has findings"
        out = tmp_path / name
        res = migrate(f"trainer-state:{state}", f"jsonl:{out}", names=target, progress=False)
        assert res.ok and res.runs, name
        got, ran_after = _findings(f"jsonl:{out}")
        both = ran & ran_after
        keep = lambda fs: {f for f in fs if f[0] in both}  # noqa: E731 - checks judged on both sides
        assert keep(got) == keep(want), (name, target, sorted(keep(want) ^ keep(got)))
        compared += len(keep(want))
    assert compared >= len(SICK)          # findings were compared, not only sets of checks that could not run
