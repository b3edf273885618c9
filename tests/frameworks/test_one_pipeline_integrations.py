"""One pipeline for the wrappers (issue 30, item 4): what ``trackbridge.wrap(wandb, wandb_names="translated")`` sends
to wandb is translated with the same source, names, mappings and run config as the trackbridge run, so wandb and
every trackbridge tracker hold one name per value.

The case a user hit: OpenRLHF with ``--algo.kl.use_loss`` (and ``--algo.kl.estimator k3``) logs its KL loss as
``train/kl``; read with that run config it is ``kl/ref/k3``, read without it ``kl/old_ref/k1`` (the reward-side KL).
The wandb run's config (what ``wandb.init(config=...)`` got, the run's config defaults) and ``config=`` given to
``wrap`` (laid over it) both reach the translation. Read back with each tracker's own tools: wandb's offline
transaction log (its protobuf records), TensorBoard's EventFileLoader, MlflowClient, the spool's JSON lines.
"""
from __future__ import annotations

import collections
import json
import time
from pathlib import Path

import pytest

import trackbridge

from _support.readback import mlflow_points, spool_points, tensorboard_points, wandb_records

wandb = pytest.importorskip("wandb")

N = 6
USE_LOSS = {"algo": {"kl": {"use_loss": True, "estimator": "k3"}}}


def _wandb_rows(folder: Path) -> dict:
    """key -> Counter(_step) of the history rows of the wandb offline run(s) under ``folder``."""
    from trackbridge.trackers.wandb.records import find_wandb_files, has_exit_record
    end = time.monotonic() + 60
    while not (find_wandb_files(folder) and all(has_exit_record(f) for f in find_wandb_files(folder))):
        assert time.monotonic() < end, f"wandb run in {folder} not complete"
        time.sleep(0.1)
    out: dict = collections.defaultdict(collections.Counter)
    for rec in wandb_records(folder):
        if rec.WhichOneof("record_type") == "history":
            row = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in rec.history.item}
            for key in row:
                if not key.startswith("_"):
                    out[key][row.get("_step")] += 1
    return dict(out)


def _log_openrlhf(run, steps=N):
    run.define_metric("train/global_step")
    run.define_metric("train/*", step_metric="train/global_step", step_sync=True)
    for g in range(1, steps + 1):
        run.log({"train/kl": g / 100, "train/policy_loss": 1.0 / g, "train/global_step": g})


def _sinks(tmp_path):
    return [f"tensorboard:{tmp_path}/tb", f"mlflow:sqlite:///{tmp_path}/mlflow.db"]


def _trackers(tmp_path, run_id):
    spool, bad = spool_points(tmp_path / "spool" / f"{run_id}.jsonl")
    assert not bad
    return {"spool": spool, "tensorboard": tensorboard_points(tmp_path / "tb"),
            "mlflow": mlflow_points(f"sqlite:///{tmp_path}/mlflow.db", run_id)}


@pytest.mark.parametrize("where", ["wandb_config", "wrap_config"])
def test_wandb_translated_names_follow_the_run_config(tmp_path, where):
    """use_loss in the wandb run's config, or in wrap(config=) over a wandb config that lacks it: kl/ref/k3 in wandb
    and in every trackbridge tracker, once per step; kl/old_ref/k1 nowhere."""
    wcfg = USE_LOSS if where == "wandb_config" else {"algo": {"kl": {"init_coef": 0.01}}}
    wrun = wandb.init(project="orlhf", name="orig", dir=str(tmp_path / "orig"), mode="offline", config=wcfg)
    extra = {} if where == "wandb_config" else {"config": USE_LOSS}
    handle = trackbridge.wrap(wandb, source="openrlhf", wandb_names="translated", sinks=_sinks(tmp_path),
                              spool=str(tmp_path / "spool"), run_id=f"kl-{where}", **extra)
    _log_openrlhf(wrun)
    wrun.finish()                 # finishes the trackbridge run too
    assert handle.run.status["finished"]
    handle.unwrap()

    steps = range(1, N + 1)
    wb = _wandb_rows(tmp_path / "orig")
    assert wb.get("kl/ref/k3") == collections.Counter({s - 1: 1 for s in steps}), sorted(wb)
    assert "kl/old_ref/k1" not in wb and "train/kl" not in wb, sorted(wb)
    for name, points in _trackers(tmp_path, f"kl-{where}").items():
        assert points.get("kl/ref/k3") == collections.Counter({s: 1 for s in steps}), (name, sorted(points))
        assert "kl/old_ref/k1" not in points, (name, sorted(points))
        # wandb and the trackers: the same names for the values wandb was given
        assert {k for k in wb if not k.startswith("train/global_step")} <= set(points), (name, sorted(wb))
    # the run's config: the wandb run's, config= laid over it (nested keys merged)
    cfg = handle.run.info.config
    assert cfg["algo"]["kl"]["use_loss"] is True and cfg["algo"]["kl"]["estimator"] == "k3"
    if where == "wrap_config":
        assert cfg["algo"]["kl"]["init_coef"] == 0.01


def test_wandb_translated_to_another_framework_names_matches_the_trackers(tmp_path):
    """names="verl": wandb gets exactly the names the trackers get (source -> canonical -> verl, as the logger)."""
    wrun = wandb.init(project="orlhf", name="orig", dir=str(tmp_path / "orig"), mode="offline", config=USE_LOSS)
    handle = trackbridge.wrap(wandb, source="openrlhf", names="verl", wandb_names="translated",
                              sinks=[f"tensorboard:{tmp_path}/tb"], spool=str(tmp_path / "spool"), run_id="kl-verl")
    _log_openrlhf(wrun)
    wrun.finish()
    handle.unwrap()
    wb = set(_wandb_rows(tmp_path / "orig")) - {"train/global_step"}
    tb = set(tensorboard_points(tmp_path / "tb"))
    assert wb and wb <= tb, (sorted(wb), sorted(tb))
    assert "train/kl" not in wb and "kl/ref/k3" not in wb, sorted(wb)


def test_summary_writer_wrapper_takes_the_run_config(tmp_path):
    """The TensorBoard wrapper: OpenRLHF's TensorboardLogger writes train/kl; with the run config every trackbridge
    tracker holds kl/ref/k3 once per step, the writer's own event files keep train/kl; a wandb wrapper sharing the
    run (run=) sends wandb the same name."""
    from torch.utils.tensorboard import SummaryWriter
    run = trackbridge.init(source="openrlhf", config=USE_LOSS, sinks=_sinks(tmp_path), spool=str(tmp_path / "spool"),
                           run_id="kl-tb")
    writer = SummaryWriter(log_dir=str(tmp_path / "own_tb"))
    handle = trackbridge.wrap(writer, run=run)
    wrun = wandb.init(project="orlhf", name="orig", dir=str(tmp_path / "orig"), mode="offline")
    whandle = trackbridge.wrap(wandb, run=run, wandb_names="translated", source="openrlhf")
    for g in range(1, N + 1):
        writer.add_scalar("train/kl", g / 100, g)
        writer.add_scalar("train/policy_loss", 1.0 / g, g)
    writer.close()
    wrun.log({"train/kl": 0.5})           # wandb through the same run's translation
    wrun.finish()
    whandle.unwrap()
    handle.unwrap()
    run.finish()

    steps = range(1, N + 1)
    own = tensorboard_points(tmp_path / "own_tb")
    assert own["train/kl"] == collections.Counter({s: 1 for s in steps})
    for name, points in _trackers(tmp_path, "kl-tb").items():
        assert points["kl/ref/k3"][0] == 1, (name, points["kl/ref/k3"])      # the wandb row, at wandb's step 0
        assert {s: points["kl/ref/k3"][s] for s in steps} == {s: 1 for s in steps}, (name, points.get("kl/ref/k3"))
        assert "kl/old_ref/k1" not in points and "train/kl" not in points, (name, sorted(points))
    wb = _wandb_rows(tmp_path / "orig")
    assert "kl/ref/k3" in wb and "kl/old_ref/k1" not in wb and "train/kl" not in wb, sorted(wb)
