"""Derived values are marked as derived in every tracker that can hold a mark, and never overwrite a logged value."""
from __future__ import annotations

import json
import sqlite3

import pytest

import trackbridge
from trackbridge.trackers import open_source

from _support import ROOT


@pytest.fixture
def env(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("WANDB_MODE", "offline")
    return tmp_path


def _log_verl_run(tmp_path, sinks, *, logged_diff=None):
    run = trackbridge.init(project="marks", name="verl-run", run_id="verl-run", sinks=sinks, source="verl@0.4.1",
                           spool=str(tmp_path / "spool"))
    for step in range(3):
        d = {"global_seqlen/min": 100.0 + step, "global_seqlen/max": 150.0 + 2 * step, "critic/score/mean": 0.5}
        if logged_diff is not None:
            d["global_seqlen/minmax_diff"] = logged_diff
        run.log(d, step=step)
    run.finish()


def test_derived_marked_in_every_sink(env):
    tmp = env
    db = tmp / "mlflow.db"
    sinks = [f"tensorboard:{tmp / 'tb'}", f"mlflow:sqlite:///{db}?experiment=marks", f"wandb:{tmp / 'wandb'}",
             f"trackio:{tmp / 'trackio'}?project=marks"]
    _log_verl_run(tmp, sinks)
    name = "perf/global_seqlen/minmax_diff"

    # the canonical stream (spool): per record
    lines = [json.loads(x) for x in (tmp / "spool" / "verl-run.jsonl").read_text().splitlines()]
    recs = [x for x in lines if x.get("type") != "run"]
    assert all(name in r["derived"] and r["metrics"][name] == 50.0 + r["step"] for r in recs)

    # the trackers' own readers see the mark
    from mlflow.tracking import MlflowClient
    client = MlflowClient(f"sqlite:///{db}")
    (mrun,) = client.search_runs([client.get_experiment_by_name("marks").experiment_id])
    assert name in json.loads(mrun.data.tags["trackbridge.derived.0"]) if "trackbridge.derived.0" in mrun.data.tags \
        else name in json.loads(mrun.data.tags["trackbridge.derived"])

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    (folder,) = [p for p in (tmp / "tb").iterdir() if p.is_dir()]
    acc = EventAccumulator(str(folder))
    acc.Reload()
    assert "derived by trackbridge" in acc.SummaryMetadata(name).summary_description
    with pytest.raises(KeyError):               # logged tags carry no such description
        acc.SummaryMetadata("reward/score/mean")

    (tdb,) = (tmp / "trackio").glob("*.db")
    with sqlite3.connect(tdb) as conn:
        (cfg,) = conn.execute("SELECT config FROM configs").fetchone()
    assert name in json.loads(cfg)["trackbridge_derived"]

    # and trackbridge's readers restore the per-record mark from each of them
    for loc in (f"tensorboard:{tmp / 'tb'}", f"mlflow:sqlite:///{db}?experiment=marks", f"wandb:{tmp / 'wandb'}",
                f"trackio:{tmp / 'trackio'}"):
        (reader,) = list(open_source(loc).runs())
        got = [r for r in reader.records() if name in r.metrics]
        assert len(got) == 3, loc
        assert all(name in r.derived and "reward/score/mean" not in r.derived for r in got), loc


def test_logged_value_is_never_overwritten(env):
    _log_verl_run(env, [], logged_diff=-1.0)
    lines = [json.loads(x) for x in (env / "spool" / "verl-run.jsonl").read_text().splitlines()]
    recs = [x for x in lines if x.get("type") != "run"]
    assert all(r["metrics"]["perf/global_seqlen/minmax_diff"] == -1.0 for r in recs)
    assert all("perf/global_seqlen/minmax_diff" not in r.get("derived", []) for r in recs)


def test_stateful_rules_continue_across_a_resumed_run(env):
    """perf/tokens_per_step = delta(progress/tokens) / delta(progress/step): the first step after a resume must use
    the last step logged before the interruption (restored from the spool), and a missing step is bridged."""
    spool = str(env / "spool")
    tokens = {0: 0, 1: 100, 2: 250, 3: 450, 5: 900, 6: 1200}      # step 4 is missing
    run = trackbridge.init(project="p", run_id="res", sinks=[], source="trl/grpo@1.16.0", spool=spool)
    for s in (0, 1, 2):
        run.log({"num_tokens": tokens[s], "loss": 1.0}, step=s)
    run.finish()
    run = trackbridge.init(project="p", run_id="res", sinks=[], source="trl/grpo@1.16.0", spool=spool, resume=True)
    for s in (3, 5, 6):
        run.log({"num_tokens": tokens[s], "loss": 1.0}, step=s)
    run.finish()
    lines = [json.loads(x) for x in (env / "spool" / "res.jsonl").read_text().splitlines()]
    per_step = {r["step"]: r["metrics"].get("perf/tokens_per_step") for r in lines if r.get("type") != "run"}
    assert per_step[0] is None                       # no history yet: no value, never a made-up one
    assert per_step[1] == 100 and per_step[2] == 150
    assert per_step[3] == 200                        # after the resume: (450 - 250) / (3 - 2)
    assert per_step[5] == 225                        # across the missing step 4: (900 - 450) / (5 - 3)
    assert per_step[6] == 300


def test_fidelity_is_stored_with_the_run_and_survives_migration(env):
    """Which translations were approximate is stored in every tracker with the run, read back by the readers, and
    kept when the run is migrated again (so `compare` can still warn)."""
    from trackbridge.migrate import migrate

    tmp = env
    db = tmp / "m.db"
    sinks = [f"tensorboard:{tmp / 'tb'}", f"mlflow:sqlite:///{db}?experiment=f", f"wandb:{tmp / 'wb'}",
             f"trackio:{tmp / 'tio'}?project=f"]
    run = trackbridge.init(project="f", name="v", run_id="fid", sinks=sinks, source="auto",
                           spool=str(tmp / "spool"))
    for s in range(3):
        run.log({"actor/ppo_kl": 0.01, "critic/score/mean": 0.5, "actor/pg_clipfrac": 0.1,
                 "training/global_step": s, "val-core/openai/gsm8k/acc/mean@1": 0.3}, step=s)
    run.finish()
    for loc in (f"tensorboard:{tmp / 'tb'}", f"mlflow:sqlite:///{db}?experiment=f", f"wandb:{tmp / 'wb'}",
                f"trackio:{tmp / 'tio'}"):
        (reader,) = list(open_source(loc).runs())
        assert "kl/old_policy/k1" in reader.info.approximate, (loc, reader.info.approximate)
        assert (reader.info.source or "").startswith("verl"), (loc, reader.info.source)
    migrate(f"tensorboard:{tmp / 'tb'}", f"jsonl:{tmp / 'copy'}", progress=False)
    (reader,) = list(open_source(f"jsonl:{tmp / 'copy'}").runs())
    assert "kl/old_policy/k1" in reader.info.approximate


def test_no_time_axis_stays_missing_when_read_back(env):
    """A source without wall times migrated into trackers that must store some time: trackbridge's own readers
    give the records back without wall times and say the run has no time axis."""

    from trackbridge.migrate import migrate

    example = ROOT / "examples" / "trl_grpo_trainer_state.json"
    tmp = env
    dests = [f"tensorboard:{tmp / 'tb'}", f"mlflow:sqlite:///{tmp / 'm.db'}?experiment=t", f"trackio:{tmp / 'tio'}"]
    for d in dests:
        migrate(f"trainer-state:{example}", d, progress=False)
    for d in dests:
        (reader,) = list(open_source(d.replace("?experiment=t", "")).runs())
        recs = list(reader.records())
        assert recs and not reader.has_wall_time, d
        assert all(r.wall_time is None for r in recs), d
