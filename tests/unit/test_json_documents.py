"""A whole JSON document that is not a log history (issue 29: what users commit): a pretty-printed object of values
(wandb's wandb-summary.json, a benchmark's results) is one row with nested names joined by '/', wandb's own fields
left out and said; a bare list of logged dicts is a log history."""
from __future__ import annotations

import json

from trackbridge.inputs import open_runs


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
