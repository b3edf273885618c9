"""compare says when the runs share no step (the demo's two example runs: TRL steps 1-100, the veRL log 101-300,
resumed at step 101): on a step axis their curves sit side by side, never over each other."""
from __future__ import annotations

import json

from trackbridge.compare import compare_runs


def _run(path, steps):
    path.write_text("".join(json.dumps({"step": s, "reward/score/mean": s / 100}) + "\n" for s in steps))
    return f"{path.stem}=jsonl:{path}"


def test_runs_sharing_no_step_are_said_to(tmp_path):
    a, b = _run(tmp_path / "a.jsonl", range(1, 101)), _run(tmp_path / "b.jsonl", range(101, 301))
    res = compare_runs([a, b], out=None, source="canonical")
    (warning,) = [w for w in res.warnings if "share no step" in w]
    assert "a 1\u2013100, b 101\u2013300" in warning
    assert res.warnings[0] == warning                      # said first: it changes how every chart reads
    res = compare_runs([a, b], out=None, source="canonical", x="time")
    assert not [w for w in res.warnings if "share no step" in w]       # only the step axis is about steps


def test_runs_sharing_a_step_are_not_warned_about(tmp_path):
    a, b = _run(tmp_path / "a.jsonl", range(1, 101)), _run(tmp_path / "b.jsonl", range(100, 301))
    res = compare_runs([a, b], out=None, source="canonical")
    assert not [w for w in res.warnings if "share no step" in w], res.warnings
    res = compare_runs([a], out=None, source="canonical")
    assert not [w for w in res.warnings if "share no step" in w]
