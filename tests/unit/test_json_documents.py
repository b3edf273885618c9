"""A whole JSON document that is not a log history (issue 29: what users commit): a pretty-printed object of values
(wandb's wandb-summary.json, a benchmark's results) is one row with nested names joined by '/', wandb's own fields
left out and said; a bare list of logged dicts is a log history."""
from __future__ import annotations

import json

from trackbridge.read.inputs import open_runs


def rows_of(path):
    (run,) = open_runs(str(path), rows=True)
    return run, list(run.records())


def test_a_wandb_summary_is_one_row_at_its_step(tmp_path):
    p = tmp_path / "wandb-summary.json"
    p.write_text(json.dumps({"actor/pg_loss": 0.25, "critic/score/mean": 0.5, "_step": 120, "_runtime": 3600.5,
                             "_timestamp": 1767225600.0, "_wandb": {"runtime": 3600},
                             "val": {"gsm8k": {"acc": 0.75}}, "table": {"_type": "table-file", "path": "t.json"}},
                            indent=2))
    run, recs = rows_of(p)
    assert len(recs) == 1 and recs[0].step == 120
    assert recs[0].metrics["actor/pg_loss"] == 0.25 and recs[0].metrics["val/gsm8k/acc"] == 0.75
    assert not any(k.startswith("_") for k in recs[0].metrics)
    assert "table" in recs[0].metrics and not isinstance(recs[0].metrics["table"], (int, float))
    assert any("_runtime" in pr.what and "tracker's own fields" in pr.what for pr in run.problems)


def test_a_list_of_logged_dicts_is_a_log_history(tmp_path):
    p = tmp_path / "history.json"
    p.write_text(json.dumps([{"loss": 0.5, "step": 1}, {"loss": 0.25, "step": 2}, "junk"], indent=2))
    run, recs = rows_of(p)
    assert [(r.step, r.metrics) for r in recs] == [(1, {"loss": 0.5}), (2, {"loss": 0.25})]
    assert any("rows[2] is not an object" in pr.what for pr in run.problems)


def test_values_by_metric_and_step_are_rows_by_step(tmp_path):
    """NeMo-RL's CI metrics.json (tests/functional/*/metrics.json): {metric: {step: value}}."""
    p = tmp_path / "metrics.json"
    p.write_text(json.dumps({"train/loss": {"1": 0.5, "2": 0.25}, "train/reward": {"2": 1.0, "1": 0.0}}, indent=2))
    run, recs = rows_of(p)
    assert [(r.step, r.metrics) for r in recs] == [(1, {"train/loss": 0.5, "train/reward": 0.0}),
                                                   (2, {"train/loss": 0.25, "train/reward": 1.0})]


def test_rows_by_step_under_one_key(tmp_path):
    p = tmp_path / "summary.json"
    p.write_text(json.dumps({"note": "x", "steps": {"2": {"a/b": 2.0}, "1": {"a/b": 1.0, "c": {"d": 3}}}}, indent=2))
    _, recs = rows_of(p)
    assert [(r.step, r.metrics) for r in recs] == [(1, {"a/b": 1.0, "c/d": 3}), (2, {"a/b": 2.0})]


def test_the_real_dumps_are_read_by_step():
    """tests/data/real: NeMo-RL's CI dump and AReaL's research summary (provenance in their SOURCES.yaml)."""
    from _support import DATA
    _, recs = rows_of(DATA / "real" / "nemo_rl" / "05_ci_functional_grpo_frozen_env_metrics.json")
    by = {r.step: r.metrics for r in recs}
    assert sorted(by)[:3] == [0, 1, 2] and len(by[1]) == 77     # step 0 and 10, 20 ...: the Ray gauges' own axis
    assert by[1]["performance/generation_tokens_per_sec"] == 3496.283447265625
    _, recs = rows_of(DATA / "real" / "areal" / "04_arealrepo_muon_grpo_summary.json")
    assert recs[0].step == 1 and recs[0].metrics["timeperf/rollout"] == 5.4107
