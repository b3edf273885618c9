"""The logger writes all nine trackers at once, and the four trackers of issue 22 in the fault matrix: poison values,
the training process SIGKILLed and resumed, a missing package. Each tracker is read back with its own tools
(tests/_support/tracker_files.py; trackbridge's readers for the other five, whose own tools other tests use)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import warnings
from collections import Counter
from pathlib import Path

import pytest

import trackbridge
from trackbridge.record import Histogram
from trackbridge.trackers import open_source

from _support import ROOT
from _support.tracker_files import clearml_points, comet_points, neptune_points, swanlab_points

NEW = ("swanlab", "clearml", "comet", "neptune")


def new_sinks(d: Path) -> dict[str, str]:
    return {"swanlab": f"swanlab:{d}/sw", "clearml": f"clearml:{d}/cl", "comet": f"comet:{d}/cm",
            "neptune": f"neptune:{d}/np"}


def own_points(kind: str, d: Path) -> list[tuple[str, int, float, object]]:
    """The points of the one run under ``d`` read with the tracker's own tools."""
    if kind == "swanlab":
        return swanlab_points(d / "sw")[0]
    if kind == "clearml":
        return clearml_points(d / "cl")[0]
    if kind == "comet":
        return comet_points(d / "cm")[0]
    return neptune_points(d / "np")[0]


def test_the_logger_writes_all_nine_at_once(tmp_path, wandb_env):
    sinks = {"jsonl": f"jsonl:{tmp_path}/jsonl", "tensorboard": f"tensorboard:{tmp_path}/tb",
             "mlflow": f"mlflow:sqlite:///{tmp_path}/ml.db", "wandb": f"wandb:{tmp_path}/wb",
             "trackio": f"trackio:{tmp_path}/tio", **new_sinks(tmp_path)}
    run = trackbridge.init(project="nine", name="all", run_id="nine", sinks=list(sinks.values()),
                           spool=str(tmp_path / "spool"), source="canonical", config={"lr": 0.001, "n": {"a": 1}})
    n = 40
    for i in range(n):
        row = {"custom/loss": 1.0 / (i + 1), "custom/reward": i * 0.5}
        if i % 10 == 0:
            row["custom/hist"] = [float(j) for j in range(i + 1)]
        run.log(row, step=i)
        if i % 10 == 9:
            run.log({"eval/custom/acc": i / 100}, step=i)        # an evaluation row at a training step
    st = run.finish()
    assert [s["state"] for s in st["sinks"]] == ["closed"] * 10, st
    scalar_keys = {"custom/loss": n, "custom/reward": n, "eval/custom/acc": n // 10}
    for kind, loc in sinks.items():
        (reader,) = list(open_source(loc).runs())
        counts = Counter(k for r in reader.records() for k in r.metrics)
        assert {k: counts[k] for k in scalar_keys} == scalar_keys, (kind, counts)
        assert counts["custom/hist"] == 4 or counts["custom/hist/count"] == 4, (kind, counts)
        assert reader.info.config["lr"] == 0.001 and reader.info.config["n"] == {"a": 1}, kind
    for kind in NEW:        # and with each tracker's own tools: every point once, at its step
        pts = own_points(kind, tmp_path)
        steps = Counter((k, s) for k, s, _t, _v in pts if k in scalar_keys)
        assert sum(steps.values()) == sum(scalar_keys.values()) and set(steps.values()) == {1}, kind
        assert sorted(s for k, s, _t, _v in pts if k == "custom/loss") == list(range(n)), kind


# -- poison values (the README's fault matrix, the columns of the four new trackers) --------------------------------
N = 50
POISON_AT = 10
GOOD = ("loss", "reward/mean")
FAULTS = ("nan_histogram", "empty_key", "huge_step", "surrogate_key", "surrogate_value", "odd_config", "past_the_door")


def _good(i: int) -> dict:
    return {"loss": 1.0 / (i + 1), "reward/mean": i * 0.5}


@pytest.fixture(scope="module")
def poison_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("poison-new")
    out = {}
    for fault in FAULTS:
        d = root / fault
        config = {"lr": float("nan"), "out": Path("/tmp/out"), "seeds": {3, 1, 2}, "plain": 1} \
            if fault == "odd_config" else {"lr": 1e-3}
        raised = []
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            run = trackbridge.init(project="poison", name=fault, sinks=list(new_sinks(d).values()),
                                   source="canonical", spool=str(d / "spool"), run_id=f"cell-{fault}",
                                   config=config, options=trackbridge.LoggerOptions(retries=1, backoff=0.01))
            for i in range(N):
                metrics, step = _good(i), i
                if i == POISON_AT:
                    if fault == "nan_histogram":
                        metrics["weights"] = [1.0, float("nan"), float("inf"), 2.0, float("-inf")]
                    elif fault == "empty_key":
                        metrics[""] = 1.0
                    elif fault == "huge_step":
                        step = 2 ** 63
                    elif fault == "surrogate_key":
                        metrics["bad\ud800name"] = 1.0
                    elif fault == "surrogate_value":
                        metrics["note"] = "half a pair: \ud800"
                    elif fault == "past_the_door":      # straight into the dispatcher, past log()'s checks
                        metrics.update({"": 1.0, "bad\ud800": 2.0, "note": "x\ud800",
                                        "h": Histogram(values=[1.0, float("nan")], min=1.0, max=1.0, num=2.0),
                                        "huge": 10 ** 400})
                        run._inbox.put((time.time(), step, metrics))
                        continue
                try:
                    run.log(metrics, step=step)
                except ValueError as exc:
                    raised.append(str(exc))
            if fault == "past_the_door":
                run._inbox.put((time.time(), 2 ** 63, {"loss": 0.0}))
            status = run.finish()
        out[fault] = {"dir": d, "status": status, "raised": raised, "warnings": [str(w.message) for w in caught]}
    return out


@pytest.mark.parametrize("tracker", NEW)
@pytest.mark.parametrize("fault", FAULTS)
def test_poison_cell_of_the_new_trackers(poison_runs, fault, tracker, fault_cell):
    cell = poison_runs[fault]
    assert [s["state"] for s in cell["status"]["sinks"]] == ["closed"] * 5, cell["status"]
    assert all(s["failures"] == 0 for s in cell["status"]["sinks"]), cell["status"]
    want = [i for i in range(N) if not (fault == "huge_step" and i == POISON_AT)]
    pts = own_points(tracker, cell["dir"])
    steps = {k: sorted(s for key, s, _t, _v in pts if key == k) for k in GOOD}
    fault_cell(f"poison: {fault}", tracker, len(GOOD) * len(want), sum(len(v) for v in steps.values()))
    for key in GOOD:
        assert steps[key] == want, f"{tracker}: {key}: {len(steps[key])} points, want {len(want)} (no loss, no dup)"
    if fault == "nan_histogram":
        names = {k for k, _s, _t, _v in pts}
        assert "weights" in names or "weights/count" in names, names
    if fault == "past_the_door":
        assert any("cannot take metric" in w or "cannot store step" in w for w in cell["warnings"]), cell["warnings"]


# -- the training process SIGKILLed, then resumed --------------------------------------------------------------------
CHILD = r"""
import sys, time
import trackbridge
d, resume, n, writer = sys.argv[1:5]
sinks = [f"swanlab:{d}/sw", f"clearml:{d}/cl", f"comet:{d}/cm", f"neptune:{d}/np"]
keys = [f"custom/k{j:02d}" for j in range(10)]
run = trackbridge.init(project="p", name="k", sinks=sinks, source="canonical", spool=f"{d}/spool", run_id="killed",
                       resume=resume == "1",
                       options=trackbridge.LoggerOptions(flush_interval=0.5, batch_size=50, writer=writer))
print("step", run._next_step, flush=True)
i = 0
while True:
    run.log({k: float(i) + j for j, k in enumerate(keys)})
    i += 1
    if i == 200:
        while any(s["written"] == 0 for s in run.status["sinks"]):
            time.sleep(0.05)
        print("logging", flush=True)
    if int(n) and i >= int(n):
        break
    time.sleep(0.002)
run.finish()
print("done", flush=True)
"""


def _child(tmp_path: Path, *args: object) -> subprocess.Popen:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.Popen([sys.executable, str(script), *map(str, args)], stdout=subprocess.PIPE, text=True,
                            env=env, cwd=tmp_path)


@pytest.mark.parametrize("writer", ["thread", "process"])
def test_sigkill_then_resume_in_the_new_trackers(tmp_path, fault_cell, writer):
    """With ``writer="thread"`` the trackers die with the training process (a torn SwanLab record, a cut ClearML
    line, an open Comet folder, a Parquet part being replaced); with the writer process they are closed by it."""
    keys = [f"custom/k{j:02d}" for j in range(10)]
    proc = _child(tmp_path, tmp_path, 0, 0, writer)
    try:
        assert proc.stdout.readline().startswith("step")
        assert proc.stdout.readline().strip() == "logging"
        time.sleep(1.5)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    _quiet(tmp_path)        # the writer process outlives the training process and closes the trackers
    before = {kind: Counter((k, s) for k, s, _t, _v in _readable(kind, tmp_path) if k in keys) for kind in NEW}
    for kind, c in before.items():
        assert c and max(c.values()) == 1, f"{kind}: doubled (or nothing) before the resume"
    proc = _child(tmp_path, tmp_path, 1, 300, writer)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    from trackbridge.sync.replay import iter_spool
    spool_steps = {r.step for _s, r in iter_spool(tmp_path / "spool" / "killed.jsonl")}
    for kind in NEW:
        got = Counter((k, s) for k, s, _t, _v in own_points(kind, tmp_path) if k in keys)
        assert max(got.values()) == 1, f"{kind}: a point written twice"
        held_before = {s for (_k, s) in before[kind]}
        want = held_before | spool_steps
        assert {s for (k, s) in got if k == keys[0]} == want, kind
        assert all({s for (k, s) in got if k == key} == want for key in keys), kind
        fault_cell(f"training SIGKILLed, then resumed (writer={writer})", kind, len(want) * len(keys),
                   sum(got.values()))


def _quiet(d: Path, still: float = 2.0, limit: float = 120.0) -> None:
    """Wait until no file under ``d`` has changed for ``still`` seconds."""
    def state() -> list:
        return sorted((str(p), p.stat().st_size, p.stat().st_mtime) for p in d.rglob("*") if p.is_file())
    last, since, t0 = state(), time.monotonic(), time.monotonic()
    while time.monotonic() - since < still and time.monotonic() - t0 < limit:
        time.sleep(0.25)
        now = state()
        if now != last:
            last, since = now, time.monotonic()


def _readable(kind: str, d: Path) -> list:
    """What a killed run left, with the tracker's own tools (a Comet archive not closed is still a folder: its
    lines, read as they are)."""
    if kind != "comet" or list((d / "cm").glob("*.zip")):
        return own_points(kind, d)
    (folder,) = list((d / "cm").glob("*.partial"))
    out = []
    for line in (folder / "messages.json").read_text().splitlines():
        msg = json.loads(line)
        if msg["type"] == "metric_msg":
            m = msg["payload"]["metric"]
            out.append((m["metricName"], m["step"], msg["payload"]["local_timestamp"] / 1000, m["metricValue"]))
    return out


# -- a missing package ------------------------------------------------------------------------------------------------
MISSING = r"""
import sys
sys.modules[sys.argv[1]] = None           # the package is not installed
import trackbridge
try:
    trackbridge.init(sinks=[sys.argv[2]], spool=sys.argv[3], source="canonical")
except Exception as exc:
    print(type(exc).__name__, isinstance(exc, trackbridge.UsageError), exc)
"""


@pytest.mark.parametrize("kind, package, extra", [("swanlab", "swanlab", "swanlab"), ("neptune", "pyarrow", "neptune")])
def test_a_missing_package_fails_init_naming_the_extra(tmp_path, kind, package, extra, fault_cell):
    script = tmp_path / "missing.py"
    script.write_text(MISSING)
    out = subprocess.run([sys.executable, str(script), package, f"{kind}:{tmp_path / 'x'}", str(tmp_path / "spool")],
                         capture_output=True, text=True, timeout=120, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert f"pip install 'trackbridge[{extra}]'" in out.stdout, out.stdout + out.stderr
    # one line: trackbridge.extras.MissingExtra, a UsageError (and an ImportError), naming the sink and the extra
    assert out.stdout.startswith(f"MissingExtra True sink '{kind}:"), out.stdout
    assert not (tmp_path / "x").exists()
    fault_cell(f"{package} not installed: init fails naming trackbridge[{extra}]", kind, 0, 0)
