"""The live checks able to act (issue 32, item 5): ``init(doctor=True, stop_on="critical",
options=LoggerOptions(on_finding=...))`` calls the callback with the finding in the caller's thread, turns
``run.should_stop`` true, says the finding as a warning attributed to the user's line (not to trackbridge's
dispatcher thread), names the user's keys, and raises each finding as the trackers' own alert: wandb's ``run.alert``
(read back from the offline ``.wandb`` file with wandb's protobuf classes) and Trackio's alerts (read back with
Trackio's own ``SQLiteStorage.get_alerts``)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import warnings

import pytest

import trackbridge
from trackbridge.doctor import DoctorWarning, Finding
from trackbridge.stream import read_stream

from _support import doctor_runs as R

SPEC = "verl/ppo@0.7.0"


def _sick():
    s = R.healthy(SPEC)
    s["optim/grad_norm"][70] = 5.0                      # an explosion at step 70: critical
    return s


def test_on_finding_and_stop_on_in_the_callers_thread(tmp_path):
    got: list[tuple[Finding, str]] = []
    run = trackbridge.init(sinks=[], spool=str(tmp_path / "spool"), source=SPEC, doctor=True,
                           options=trackbridge.LoggerOptions(
                               writer="thread", on_finding=lambda f: got.append((f, threading.current_thread().name))),
                           stop_on="critical")
    stopped = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for row in R.rows(SPEC, _sick()):
            step = row.pop("step")
            run.log(row, step=step)                    # the line the warning names
            if run.should_stop:
                stopped = step
                break
            time.sleep(0.005)                           # a training step: the checks keep up
        run.finish()
    assert run.should_stop and stopped is not None and 70 <= stopped < R.N - 1, stopped
    assert run._stop_finding.id == "grad-norm-explosion"
    assert [(f.id, thread) for f, thread in got] == [("grad-norm-explosion", threading.current_thread().name)]
    assert got[0][0].names["optim/grad_norm"] == R.RAW[SPEC]["optim/grad_norm"]      # actor/grad_norm
    said = [w for w in caught if issubclass(w.category, DoctorWarning)]
    assert len(said) == 1
    assert said[0].filename == __file__                 # the user's file, not trackbridge's dispatcher
    src = open(__file__, encoding="utf-8").read().splitlines()
    assert "run.log(row, step=step)" in src[said[0].lineno - 1]
    assert "optim/grad_norm (your actor/grad_norm) = 5 at step 70" in str(said[0].message)


def test_a_warning_error_finding_does_not_stop_on_warning_only(tmp_path):
    """stop_on="critical" ignores a warning-level finding; the callback still gets it."""
    s = R.healthy(SPEC)
    for t in range(30, 60):
        s["policy/clip_frac"][t] = 0.4                  # clip-fraction-high: a warning
    got = []
    run = trackbridge.init(sinks=[], spool=str(tmp_path / "spool"), source=SPEC, doctor=True,
                           options=trackbridge.LoggerOptions(writer="thread",
                                                             on_finding=got.append), stop_on="critical")
    for row in R.rows(SPEC, s):
        step = row.pop("step")
        run.log(row, step=step)
    run.finish()
    assert [f.id for f in got] == ["clip-fraction-high"] and not run.should_stop


def test_a_raising_callback_is_said_once_and_logging_goes_on(tmp_path):
    def boom(f):
        raise RuntimeError("mine")

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run = trackbridge.init(sinks=[], spool=str(tmp_path / "spool"), source=SPEC, doctor=True,
                               options=trackbridge.LoggerOptions(writer="thread", on_finding=boom))
        for row in R.rows(SPEC, _sick()):
            step = row.pop("step")
            run.log(row, step=step)
        run.finish()
    assert any("on_finding" in str(w.message) and "RuntimeError: mine" in str(w.message) for w in caught)
    assert len(list(read_stream(run.spool_path))) == R.N + 1


@pytest.mark.parametrize("kw, message", [
    ({"doctor": True, "stop_on": "fatal"}, r"init\(stop_on='fatal'\): expected one of critical, warning, info"),
    ({"stop_on": "critical"}, r"pass doctor=True too"),
    ({"doctor": True, "on_finding": "print"}, r"LoggerOptions\(on_finding='print'\): expected a callable"),
])
def test_bad_options(tmp_path, kw, message):
    with pytest.raises(trackbridge.UsageError, match=message):
        trackbridge.init(sinks=[], spool=str(tmp_path / "spool"), source=SPEC,
                         **trackbridge.LoggerOptions.fold({"writer": "thread", **kw}))


def _wandb_alerts(folder):
    from wandb.proto import wandb_internal_pb2 as pb

    from trackbridge.trackers.wandb.records import find_wandb_files, read_payloads
    out = []
    for path in find_wandb_files(folder):
        for _, data in read_payloads(path, None):
            rec = pb.Record()
            rec.ParseFromString(data)
            if rec.WhichOneof("record_type") == "alert":
                out.append((rec.alert.title, rec.alert.text, rec.alert.level))
    return out


@pytest.mark.parametrize("writer", ["thread", "process"])
def test_findings_are_the_trackers_own_alerts(tmp_path, writer, monkeypatch):
    pytest.importorskip("wandb")
    pytest.importorskip("trackio")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = trackbridge.init(project="alerts", sinks=[f"wandb:{tmp_path}/wb", f"trackio:{tmp_path}/tio?project=alerts"],
                           spool=str(tmp_path / "spool"), source=SPEC, doctor=True,
                           options=trackbridge.LoggerOptions(writer=writer))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DoctorWarning)
        for row in R.rows(SPEC, _sick()):
            step = row.pop("step")
            run.log(row, step=step)
        st = run.finish()
    assert all(s["state"] == "closed" for s in st["sinks"]), st["sinks"]
    (text,) = [v for _seq, rec in read_stream(run.spool_path) for k, v in rec.metrics.items()
               if k == "doctor/grad-norm-explosion"]
    # wandb: an alert record in the offline run file, as run.alert wrote it
    assert _wandb_alerts(tmp_path / "wb") == [("trackbridge doctor: Gradient norm explodes", text, "ERROR")]
    # Trackio: its own storage code reads its alerts table
    code = ("import json, trackio.sqlite_storage as s; "
            "print(json.dumps(s.SQLiteStorage.get_alerts('alerts')))")
    env = dict(os.environ, TRACKIO_DIR=str(tmp_path / "tio"), HF_HUB_OFFLINE="1")
    env.pop("TRACKIO_SPACE_ID", None)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    alerts = json.loads(out.stdout.strip().splitlines()[-1])
    assert [(a["title"], a["text"], a["level"], a["step"]) for a in alerts] == [
        ("trackbridge doctor: Gradient norm explodes", text, "error", 70)]


def test_no_alerts_without_the_live_checks(tmp_path, monkeypatch):
    """A run logging a doctor/ text itself (or a migrated one) raises no alert: only init(doctor=True) does."""
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = trackbridge.init(sinks=[f"wandb:{tmp_path}/wb"], spool=str(tmp_path / "spool"), source=SPEC,
                           options=trackbridge.LoggerOptions(writer="thread"))
    run.log({"doctor/grad-norm-explosion": "critical: Gradient norm explodes [grad-norm-explosion] at step 1: x"},
            step=1)
    run.finish()
    assert _wandb_alerts(tmp_path / "wb") == []
