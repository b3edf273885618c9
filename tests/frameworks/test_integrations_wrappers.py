"""The wrappers of the loggers people already use, against the real thing: wandb (offline), torch's and
tensorboardX's SummaryWriter (real event files), Accelerate (a real Accelerator) and a veRL-style ``log(data, step)``
callable. Each test shows the original logger's output unchanged and the translated output in every sink."""
import math
import subprocess
import sys
import time
from pathlib import Path

import pytest

import trackbridge
from trackbridge.logger import LoggerWarning
from trackbridge.sync.replay import iter_spool
from trackbridge.trackers import open_source

from _support import ROOT

# wandb offline, hubs offline, scratch cache dirs: tests/conftest.py (pytest_configure), set before any
# test module imports a tracker

N = 5


def _read(spec):
    runs = list(open_source(spec).runs())
    assert len(runs) == 1, f"{spec}: {len(runs)} runs"
    return runs[0], list(runs[0].records())


def _by_step(recs, name):
    return {r.step: r.metrics[name] for r in recs if name in r.metrics}


def _spool(run):
    return [r for _s, r in iter_spool(run.spool_path)]


def _sinks(tmp_path):
    return [f"tensorboard:{tmp_path}/tb", f"mlflow:sqlite:///{tmp_path}/mlflow.db?experiment=wrap",
            f"wandb:{tmp_path}/wb", f"jsonl:{tmp_path}/copy"]


def _check_sinks(tmp_path, want, *, wandb_sink=True):
    """Every canonical name of ``want`` ({name: {step: value}}) in every sink, read back with trackbridge's readers."""
    specs = [f"tensorboard:{tmp_path}/tb", f"mlflow:sqlite:///{tmp_path}/mlflow.db?experiment=wrap",
             f"jsonl:{tmp_path}/copy"] + ([f"wandb:{tmp_path}/wb"] if wandb_sink else [])
    for spec in specs:
        _, recs = _read(spec)
        for name, points in want.items():
            got = _by_step(recs, name)
            assert {s: got.get(s) for s in points} == pytest.approx(points, rel=1e-6), (spec, name, got)


def _wait_wandb_file(folder, timeout=60):
    from trackbridge.trackers.wandb.records import find_wandb_files, has_exit_record
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        files = find_wandb_files(Path(folder))
        if files and all(has_exit_record(f) for f in files):
            return
        time.sleep(0.1)
    raise AssertionError(f"wandb run in {folder} not complete after {timeout} s")


def test_import_stays_light():
    code = ("import sys, trackbridge, trackbridge.integrations, trackbridge.integrations.wandb, "
            "trackbridge.integrations.tensorboard, trackbridge.integrations.callable\n"
            "bad = [m for m in ('torch', 'transformers', 'wandb', 'accelerate', 'tensorboardX', 'tensorboard') "
            "if m in sys.modules]\n"
            "assert not bad, bad\n"
            "assert callable(trackbridge.wrap) and callable(trackbridge.unwrap)\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=str(ROOT))


# -- wandb ------------------------------------------------------------------------------------------------------------
def _verl_row(i):
    return {"actor/pg_loss": 0.5 - i / 10, "critic/score/mean": i / 4, "actor/entropy": 1.0 + i,
            "response_length/mean": 10.0 + i}


def test_wandb_module_verl_style(tmp_path):
    """veRL's Tracking: ``wandb.log(data=..., step=step)`` after ``wandb.init``; the wrapper is installed after init."""
    import wandb

    original_log = wandb.Run.log
    wandb.init(project="verl", name="orig", dir=str(tmp_path / "orig"), mode="offline",
               config={"actor_rollout_ref": {"actor": {"kl_loss_coef": 0.001}}})
    handle = trackbridge.wrap(wandb, source="verl", sinks=_sinks(tmp_path), spool=str(tmp_path / "spool"),
                              run_id="verl1")
    assert wandb.log.__func__ is not original_log
    for i in range(N):
        wandb.log(data={**_verl_row(i), "val/generations": wandb.Table(columns=["a"], data=[[i]])}, step=i)
    wandb.log(data={"actor/pg_loss": 9.0}, step=1)      # lower than wandb's step: wandb drops it (with a warning)
    wandb.finish()
    st = handle.unwrap()
    assert wandb.Run.log is original_log
    assert [s["state"] for s in st["sinks"]] == ["closed"] * 5, st
    assert handle.skipped == {"val/generations": "Table"}
    assert handle.dropped_by_wandb == 1

    # wandb itself got the original calls: original names, original steps; the late step-1 row is not there
    _wait_wandb_file(tmp_path / "orig")
    _, orig = _read(f"wandb:{tmp_path}/orig")
    for name in _verl_row(0):
        assert _by_step(orig, name) == pytest.approx({i: _verl_row(i)[name] for i in range(N)}), name
    assert not any("loss/policy" in r.metrics for r in orig)

    # trackbridge: canonical names in every sink; one record per committed wandb row, at wandb's step (row 4 is
    # committed by finish(), after the late step-1 value, which trackbridge keeps)
    spool = _spool(handle.run)
    assert [r.step for r in spool] == [0, 1, 2, 3, 1, 4]
    assert spool[4].metrics == {"loss/policy": 9.0}
    want = {"loss/policy": {i: _verl_row(i)["actor/pg_loss"] for i in range(N)},
            "reward/score/mean": {i: i / 4 for i in range(N)}}
    for r in spool:
        assert "actor/pg_loss" not in r.metrics and "val/generations" not in r.metrics
    assert handle.run.info.config.get("kl_loss_coef") == 0.001     # the wandb run config, nested key translated
    _, mrecs = _read(f"mlflow:sqlite:///{tmp_path}/mlflow.db?experiment=wrap")
    assert _by_step(mrecs, "loss/policy")[1] in (0.4, 9.0)
    want["loss/policy"].pop(1)
    _check_sinks(tmp_path, want)


def test_wandb_run_openrlhf_style_define_metric_commit_and_translated_names(tmp_path):
    """OpenRLHF: define_metric("train/*", step_metric="train/global_step") and log() without step=; a commit=False
    part joins its row; wandb_names="translated" sends canonical names to wandb too (step metrics keep theirs)."""
    import wandb

    original_log = wandb.Run.log
    wrun = wandb.init(project="orlhf", name="orig", dir=str(tmp_path / "orig"), mode="offline")
    handle = trackbridge.wrap(wrun, source="openrlhf", sinks=[f"tensorboard:{tmp_path}/tb", f"jsonl:{tmp_path}/copy"],
                              spool=str(tmp_path / "spool"), run_id="orlhf1", wandb_names="translated")
    wrun.define_metric("train/global_step")
    wrun.define_metric("train/*", step_metric="train/global_step", step_sync=True)
    wrun.define_metric("eval/global_step")
    wrun.define_metric("eval/*", step_metric="eval/global_step", step_sync=True)
    for g in range(1, N + 1):
        wrun.log({"train/kl": g / 100}, commit=False)
        wrun.log({"train/policy_loss": 1.0 / g, "train/global_step": 10 * g})
        if g % 2 == 0:
            wrun.log({"eval/eval_loss": 2.0 / g, "eval/global_step": 10 * g})
    # a row with both splits: two records, each at its own step metric
    wrun.log({"train/policy_loss": 0.01, "train/global_step": 60, "eval/eval_loss": 0.02, "eval/global_step": 55})
    wrun.finish()
    handle.unwrap()
    assert wandb.Run.log is original_log

    spool = _spool(handle.run)
    train = [r for r in spool if "loss/policy" in r.metrics]
    assert [r.step for r in train] == [10, 20, 30, 40, 50, 60]
    assert all("kl/old_ref/k1" in r.metrics or r.step == 60 for r in train), [r.metrics for r in train]
    assert [r.metrics["kl/old_ref/k1"] for r in train[:N]] == pytest.approx([g / 100 for g in range(1, N + 1)])
    evals = [r for r in spool if "eval/loss/total" in r.metrics]
    assert [r.step for r in evals] == [20, 40, 55]
    assert not any("train/policy_loss" in r.metrics for r in spool)
    _, tb = _read(f"tensorboard:{tmp_path}/tb")
    assert _by_step(tb, "loss/policy") == pytest.approx({10 * g: 1.0 / g for g in range(1, N + 1)} | {60: 0.01})

    # wandb got canonical names (translated), the step metric under its own name, all rows
    _wait_wandb_file(tmp_path / "orig")
    _, orig = _read(f"wandb:{tmp_path}/orig")
    names = set().union(*(r.metrics for r in orig))
    assert {"loss/policy", "kl/old_ref/k1"} <= names
    assert "train/policy_loss" not in names
    # the declared step metrics are x axes: the reader gives them back as the records' axis and step, not as
    # metrics; eval/* still covers the renamed eval key, train/* no longer covers loss/policy (the module doc)
    assert "train/global_step" not in names and "eval/global_step" not in names
    ev = [r for r in orig if "eval/loss/total" in r.metrics]
    assert [(r.axis, r.step) for r in ev] == [("eval/global_step", s) for s in (20, 40, 55)]
    assert {r.axis for r in orig if "loss/policy" in r.metrics} == {None}
    # trackbridge's own records: each at its step metric's value, on that axis
    assert {r.axis for r in train} == {"train/global_step"} and {r.axis for r in evals} == {"eval/global_step"}


def test_wandb_wrapped_before_init_and_context_manager(tmp_path):
    """Installed before wandb.init (which rebinds wandb.log): still teed; leaving the with-block restores."""
    import wandb

    original = {n: getattr(wandb.Run, n) for n in ("log", "define_metric", "finish")}
    with trackbridge.wrap(wandb, source="verl", sinks=[f"jsonl:{tmp_path}/copy"], spool=str(tmp_path / "spool"),
                          run_id="early") as handle:
        wandb.init(project="early", dir=str(tmp_path / "orig"), mode="offline")
        for i in range(3):
            wandb.log(_verl_row(i))                 # no step: wandb's own _step 0, 1, 2
        wandb.finish()
    assert {n: getattr(wandb.Run, n) for n in original} == original
    spool = _spool(handle.run)
    assert [r.step for r in spool] == [0, 1, 2]
    assert [r.metrics["loss/policy"] for r in spool] == pytest.approx([0.5, 0.4, 0.3])
    assert handle.run.status["finished"]


# -- SummaryWriter -----------------------------------------------------------------------------------------------------
def _writer(kind, logdir):
    if kind == "torch":
        from torch.utils.tensorboard import SummaryWriter
    else:
        from tensorboardX import SummaryWriter
    return SummaryWriter(str(logdir))


def _event_scalars(folder):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    ea = EventAccumulator(str(folder), size_guidance={"scalars": 0, "histograms": 0})
    ea.Reload()
    return ea


@pytest.mark.parametrize("kind", ["torch", "tensorboardX"])
def test_summary_writer(tmp_path, kind):
    """OpenRLHF's TensorBoard logger: add_scalar(f"train/{k}", v, global_step) per key; plus add_scalars and
    add_histogram. The writer's files are unchanged; trackbridge gets one record per step, translated."""
    import numpy as np

    writer = _writer(kind, tmp_path / "orig")
    cls_methods = {n: getattr(type(writer), n) for n in ("add_scalar", "add_scalars", "add_histogram")}
    handle = trackbridge.wrap(writer, source="openrlhf", sinks=_sinks(tmp_path), spool=str(tmp_path / "spool"),
                              run_id=f"tb-{kind}")
    rng = np.random.default_rng(0)
    hists = {}
    for g in range(1, N + 1):
        writer.add_scalar("train/policy_loss", 1.0 / g, g)
        writer.add_scalar("train/kl", g / 100, global_step=g)
        writer.add_scalars("train/reward", {"max": float(g), "min": -float(g)}, g)
        hists[g] = rng.normal(size=50)
        writer.add_histogram("train/advantages", hists[g], g)
    writer.close()
    st = handle.unwrap()
    assert [s["state"] for s in st["sinks"]] == ["closed"] * 5, st
    assert "add_scalar" not in vars(writer) and all(getattr(type(writer), n) is f for n, f in cls_methods.items())

    # the writer's own event files, read with TensorBoard's loader: original tags, add_scalars sub-runs
    ea = _event_scalars(tmp_path / "orig")
    assert {e.step: e.value for e in ea.Scalars("train/policy_loss")} == pytest.approx(
        {g: 1.0 / g for g in range(1, N + 1)})
    assert "train/advantages" in ea.Tags()["histograms"]
    subs = sorted(p.name for p in (tmp_path / "orig").rglob("*") if p.is_dir())
    assert any("max" in s for s in subs) and any("min" in s for s in subs), subs

    # trackbridge: one record per step, canonical names, add_scalars flattened to main/sub, the histogram kept
    spool = _spool(handle.run)
    assert [r.step for r in spool] == list(range(1, N + 1))
    first = spool[0].metrics
    assert first["loss/policy"] == 1.0 and first["kl/old_ref/k1"] == pytest.approx(0.01)
    assert "train/reward/max" in first or any(k.endswith("reward/max") for k in first), first
    hist_key = next(k for k, v in first.items() if hasattr(v, "counts") or hasattr(v, "values") and
                    not isinstance(v, (int, float, str)))
    assert spool[0].metrics[hist_key].num == 50
    assert spool[0].metrics[hist_key].sum == pytest.approx(float(hists[1].sum()))
    _check_sinks(tmp_path, {"loss/policy": {g: 1.0 / g for g in range(1, N + 1)},
                            "kl/old_ref/k1": {g: g / 100 for g in range(1, N + 1)}})


# -- Accelerate --------------------------------------------------------------------------------------------------------
def _legacy_ppo_stats(i):
    return {"ppo/loss/total": 1.0 / (i + 1), "ppo/mean_scores": i / 3, "objective/kl": 0.1 * i,
            "ppo/learning_rate": 1.41e-5}


def test_accelerate_tracker_beside_tensorboard(tmp_path):
    """Legacy TRL PPOTrainer's path: Accelerator(log_with=[...]), init_trackers(config), log(values, step),
    end_training(). Accelerate's own TensorBoard tracker still writes the raw keys."""
    from accelerate import Accelerator

    from trackbridge.integrations.accelerate import TrackBridgeTracker

    tracker = TrackBridgeTracker(project="ppo", name="legacy", sinks=_sinks(tmp_path), source="trl-legacy",
                                 spool=str(tmp_path / "spool"), run_id="acc1")
    assert tracker.name == "trackbridge" and tracker.requires_logging_directory is False
    acc = Accelerator(cpu=True, log_with=["tensorboard", tracker], project_dir=str(tmp_path / "orig"))
    acc.init_trackers("ppo", config={"init_kl_coef": 0.2, "batch_size": 8, "learning_rate": 1.41e-5})
    assert acc.get_tracker("trackbridge") is tracker
    for i in range(N):
        acc.log(_legacy_ppo_stats(i), step=i)
    run = tracker.tracker
    acc.end_training()
    assert run.status["finished"]
    assert run.info.config["init_kl_coef"] == 0.2 and run.info.config.get("kl_coef") == 0.2

    spool = _spool(run)
    assert [r.step for r in spool] == list(range(N))
    assert not any(k.startswith("ppo/") for r in spool for k in r.metrics), spool[0].metrics
    res = trackbridge.translate(_legacy_ppo_stats(1), source="trl-legacy")
    assert res.unmapped == [] and set(res.metrics) <= set(spool[1].metrics)
    _check_sinks(tmp_path, {res.renamed["ppo/loss/total"]: {i: 1.0 / (i + 1) for i in range(N)},
                            res.renamed["ppo/mean_scores"]: {i: i / 3 for i in range(N)}})

    # Accelerate's TensorBoard tracker: unchanged, raw keys
    folder = next(p for p in (tmp_path / "orig").rglob("*") if p.is_file() and "tfevents" in p.name).parent
    ea = _event_scalars(folder)
    assert {e.step: e.value for e in ea.Scalars("ppo/loss/total")} == pytest.approx(
        {i: 1.0 / (i + 1) for i in range(N)})


# -- any log(data, step) ---------------------------------------------------------------------------------------------
class FakeTracking:
    """veRL's ``Tracking``: ``log(data, step, backend=None)`` fans out to its backends."""

    def __init__(self):
        self.calls = []

    def log(self, data, step, backend=None):
        self.calls.append((dict(data), step, backend))
        return len(self.calls)


def test_callable_wrapper(tmp_path):
    tracking = FakeTracking()
    original = tracking.log
    tracking.log = trackbridge.wrap(tracking.log, source="verl", sinks=_sinks(tmp_path),
                                    spool=str(tmp_path / "spool"), run_id="call1")
    for i in range(N):
        if i % 2:
            ret = tracking.log(data=_verl_row(i), step=i)
        else:
            ret = tracking.log(_verl_row(i), i)
        assert ret == i + 1                              # the original's return value
    assert [c[1] for c in tracking.calls] == list(range(N))
    assert tracking.calls[3] == (_verl_row(3), 3, None)  # the original got exactly what was passed
    run = tracking.log.run
    tracking.log = tracking.log.unwrap()
    assert tracking.log == original
    tracking.log({"actor/pg_loss": 1.0}, 99)              # no longer teed
    assert run.status["finished"]
    spool = _spool(run)
    assert [r.step for r in spool] == list(range(N))
    _check_sinks(tmp_path, {"loss/policy": {i: _verl_row(i)["actor/pg_loss"] for i in range(N)},
                            "reward/score/mean": {i: i / 4 for i in range(N)}})


def test_callable_errors_stay_with_the_original_and_trackbridge_problems_never_raise(tmp_path):
    calls = []

    def log(metrics, step=None):
        calls.append(step)
        if step == 2:
            raise RuntimeError("backend down")

    wrapped = trackbridge.wrap(log, source="verl", spool=str(tmp_path / "spool"), run_id="call2")
    wrapped({"actor/pg_loss": 0.1}, step=1)
    with pytest.raises(RuntimeError, match="backend down"):
        wrapped({"actor/pg_loss": 0.2}, step=2)          # the original's exception, unchanged
    with pytest.warns(LoggerWarning, match="metric 'actor/pg_loss': values of type object cannot be stored"):
        wrapped({"actor/pg_loss": object()}, step=3)      # a value trackbridge cannot take: a warning, no exception
    trackbridge.unwrap(wrapped)
    assert calls == [1, 2, 3]
    spool = _spool(wrapped.run)
    assert [r.step for r in spool] == [1, 3]
    assert spool[1].metrics == {}
    assert math.isclose(spool[0].metrics["loss/policy"], 0.1)


def test_summary_writer_class_for_writers_made_inside_a_framework(tmp_path):
    """OpenRLHF/veRL create their SummaryWriter internally: wrapping the class tees every writer it makes."""
    from torch.utils.tensorboard import SummaryWriter

    original = SummaryWriter.add_scalar
    handle = trackbridge.wrap(SummaryWriter, source="openrlhf", sinks=[f"jsonl:{tmp_path}/copy"],
                              spool=str(tmp_path / "spool"), run_id="tbcls")
    writer = SummaryWriter(str(tmp_path / "orig"))            # made "inside the framework", after the wrap
    for g in range(1, N + 1):
        writer.add_scalar("train/policy_loss", 1.0 / g, g)
        writer.add_scalar("eval/eval_loss", 2.0 / g, g)
    writer.close()                                            # finishes the trackbridge run
    assert handle.run.status["finished"]
    handle.unwrap()
    assert SummaryWriter.add_scalar is original
    ea = _event_scalars(tmp_path / "orig")
    assert {e.step: e.value for e in ea.Scalars("train/policy_loss")} == pytest.approx(
        {g: 1.0 / g for g in range(1, N + 1)})
    spool = _spool(handle.run)
    assert [r.step for r in spool] == list(range(1, N + 1))
    assert spool[0].metrics == {"loss/policy": 1.0, "eval/loss/total": 2.0}
