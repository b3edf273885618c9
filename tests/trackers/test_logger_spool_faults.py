"""The spool is the durable copy, never the trackers' only feed (issue 19): a spool that cannot be written, is
deleted, or runs out of space for a moment costs no tracker a point, and the spool itself keeps every record once,
in order. Every interval is measured on the monotonic clock. Each test runs in both writer modes and reads every
tracker back with its own tools (tests/_support/readback.py).

Disk-full cells run the training script in its own mount namespace with a tmpfs of a few KB as the spool folder
(tests/_support/smallfs.py): a real full file system, the trackers on the ordinary disk.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import warnings

import pytest

import trackbridge
from trackbridge.logger import LoggerWarning
from trackbridge.sync.replay import iter_spool

from _support import ROOT
from _support.lines import Lines
from _support.readback import exact, mlflow_points, spool_points, tensorboard_points, total, trackio_points
from _support.smallfs import small_fs_problem, start_in_small_fs

WRITERS = ["process", "thread"]
KEYS = [f"custom/k{j:02d}" for j in range(20)]


def _row(i: int) -> dict[str, float]:
    return {k: float(i) + j / 100 for j, k in enumerate(KEYS)}



def _dead_port() -> int:
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


needs_small_fs = pytest.mark.skipif(small_fs_problem() is not None, reason=f"no private tmpfs: {small_fs_problem()}")

FULL = r"""
import json, os, shutil, sys, time, warnings
import trackbridge
spool, out, writer, n, dead = sys.argv[1:6]
keys = [f"custom/k{j:02d}" for j in range(20)]
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    run = trackbridge.init(project="full", name="full", run_id="full", source="canonical", spool=spool,
                           sinks=[f"tensorboard:{out}/tb", f"mlflow:sqlite:///{out}/ml.db", f"trackio:{out}/tio",
                                  f"mlflow:http://127.0.0.1:{dead}"],
                           options=trackbridge.LoggerOptions(writer=writer, flush_interval=0.2, retries=0,
                                                             retry_interval=3600, stall_timeout=5))
    for i in range(int(n)):
        run.log({k: float(i) + j / 100 for j, k in enumerate(keys)}, step=i)
        if i == 10:
            time.sleep(0.5)         # these fit: the spool holds the start of the run
        elif i % 50 == 0:
            time.sleep(0.05)
    st = run.finish()
json.dump({"status": st, "warnings": [str(w.message) for w in caught]}, open(f"{out}/result.json", "w"))
shutil.copytree(spool, f"{out}/spool-copy")
"""


@needs_small_fs
@pytest.mark.parametrize("writer", WRITERS)
def test_spool_on_a_full_disk_costs_no_tracker_a_point(tmp_path, mlflow_template, fault_cell, writer):
    """The spool folder is a 16 KB file system (a few dozen records fit): every healthy tracker still gets all 300
    records; what finish() says about a tracker that lacks records (a dead server) is true (the spool does not hold
    them all), and no half-written pending note is left."""
    out, spool = tmp_path / "out", tmp_path / "spool"
    out.mkdir()
    shutil.copy(mlflow_template, out / "ml.db")
    script = tmp_path / "full.py"
    script.write_text(FULL)
    n = 300
    proc = start_in_small_fs(spool, 16, script, spool, out, writer, n, _dead_port(), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    log, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, log[-3000:]
    result = json.loads((out / "result.json").read_text())
    got = {"tensorboard": tensorboard_points(out / "tb"), "mlflow": mlflow_points(f"sqlite:///{out / 'ml.db'}", "full"),
           "trackio": trackio_points(out / "tio" / "full.db", "full")}
    for tracker, points in got.items():
        assert exact(points, KEYS, range(n)) is None, (tracker, exact(points, KEYS, range(n)))
        fault_cell(f"spool on a full disk (writer={writer})", tracker, n * len(KEYS), total(points))
    spooled, bad = spool_points(out / "spool-copy" / "full.jsonl")
    held = sorted(spooled[KEYS[0]])
    assert 0 < len(held) < n and held == list(range(len(held))), "the spool holds a prefix of the run"
    assert not bad, bad
    assert not [p.name for p in (out / "spool-copy").iterdir() if p.name.endswith(".tmp")]
    msgs = result["warnings"]
    assert any("cannot be written" in m and "the trackers still get every record" in m for m in msgs), msgs
    lacking = [m for m in msgs if "lacks" in m and "127.0.0.1" in m]
    assert lacking and all("the spool lacks" in m and "they are in the spool" not in m for m in lacking), lacking
    spool_state = result["status"]["sinks"][0]
    assert spool_state["state"] != "closed" or spool_state["last_error"], spool_state


MOMENT = r"""
import json, os, shutil, sys, time, warnings
import trackbridge
spool, out, writer = sys.argv[1:4]
keys = [f"custom/k{j:02d}" for j in range(20)]
row = lambda i: {k: float(i) + j / 100 for j, k in enumerate(keys)}
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    run = trackbridge.init(project="moment", name="moment", run_id="moment", source="canonical", spool=spool,
                           sinks=[f"tensorboard:{out}/tb"],
                           options=trackbridge.LoggerOptions(writer=writer, flush_interval=0.1))
    i = 0
    for _ in range(30):
        run.log(row(i), step=i); i += 1
    time.sleep(0.5)
    fd = os.open(os.path.join(spool, "filler"), os.O_WRONLY | os.O_CREAT)   # the disk fills up ...
    try:
        while True:
            os.write(fd, b"x" * 4096)
    except OSError:
        os.close(fd)
    end = time.monotonic() + 60
    while run.status["sinks"][0]["state"] != "failed" and time.monotonic() < end:
        run.log(row(i), step=i); i += 1
        time.sleep(0.01)
    failed_at = i
    time.sleep(0.05)
    os.unlink(os.path.join(spool, "filler"))                   # ... and has room again 50 ms later
    for _ in range(100):
        run.log(row(i), step=i); i += 1
        time.sleep(0.002)
    st = run.finish()
json.dump({"n": i, "failed_at": failed_at, "status": st, "warnings": [str(w.message) for w in caught]},
          open(f"{out}/result.json", "w"))
shutil.copytree(spool, f"{out}/spool-copy")
"""


@needs_small_fs
@pytest.mark.parametrize("writer", WRITERS)
def test_disk_full_for_a_moment_doubles_nothing(tmp_path, fault_cell, writer):
    """A write cut short by a full disk is taken back whole: once the disk has room again the spool holds every
    record exactly once, with no torn line, and TensorBoard every point once."""
    out, spool = tmp_path / "out", tmp_path / "spool"
    out.mkdir()
    script = tmp_path / "moment.py"
    script.write_text(MOMENT)
    proc = start_in_small_fs(spool, 256, script, spool, out, writer, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    log, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, log[-3000:]
    result = json.loads((out / "result.json").read_text())
    n = result["n"]
    assert result["status"]["sinks"][0]["state"] == "closed", result["status"]["sinks"][0]
    assert any("cannot be written" in m for m in result["warnings"]), "the full disk was not met"
    spooled, bad = spool_points(out / "spool-copy" / "moment.jsonl")
    assert not bad, bad
    assert exact(spooled, KEYS, range(n)) is None, exact(spooled, KEYS, range(n))
    tb = tensorboard_points(out / "tb")
    assert exact(tb, KEYS, range(n)) is None, exact(tb, KEYS, range(n))
    fault_cell(f"disk full for 50 ms (writer={writer})", "spool", n * len(KEYS), total(spooled))
    fault_cell(f"disk full for 50 ms (writer={writer})", "tensorboard", n * len(KEYS), total(tb))


@pytest.mark.parametrize("writer", WRITERS)
def test_spool_deleted_mid_run_is_written_again_and_trackers_get_everything(tmp_path, mlflow_template, fault_cell,
                                                                            writer):
    shutil.copy(mlflow_template, tmp_path / "ml.db")
    sinks = [f"tensorboard:{tmp_path / 'tb'}", f"mlflow:sqlite:///{tmp_path / 'ml.db'}"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run = trackbridge.init(project="gone", name="gone", run_id="gone", sinks=sinks, source="canonical",
                               spool=str(tmp_path / "spool"),
                               options=trackbridge.LoggerOptions(writer=writer, flush_interval=0.1))
        for i in range(100):
            run.log(_row(i), step=i)
        end = time.monotonic() + 60
        while sum(1 for _ in iter_spool(run.spool_path)) < 100:
            assert time.monotonic() < end, "the spool never held the first records"
            time.sleep(0.02)
        run.spool_path.unlink()
        for i in range(100, 200):
            run.log(_row(i), step=i)
            time.sleep(0.002)
        st = run.finish()
    assert all(s["state"] == "closed" for s in st["sinks"]), st
    msgs = [str(w.message) for w in caught if issubclass(w.category, LoggerWarning)]
    assert any("was deleted or replaced" in m and "nothing lost" in m for m in msgs), msgs
    spooled, bad = spool_points(run.spool_path)
    assert not bad and exact(spooled, KEYS, range(200)) is None, exact(spooled, KEYS, range(200))
    got = {"tensorboard": tensorboard_points(tmp_path / "tb"),
           "mlflow": mlflow_points(f"sqlite:///{tmp_path / 'ml.db'}", "gone")}
    for tracker, points in {"spool": spooled, **got}.items():
        assert exact(points, KEYS, range(200)) is None, (tracker, exact(points, KEYS, range(200)))
        fault_cell(f"spool file deleted mid-run (writer={writer})", tracker, 200 * len(KEYS), total(points))


CLOCK = r"""
import sys, time
import trackbridge
spool, tb, writer = sys.argv[1:4]
real = time.time
offset = [0.0]
time.time = lambda: real() - offset[0]        # the wall clock, as NTP or an operator stepping it back would leave it
run = trackbridge.init(project="clock", name="clock", run_id="clock", source="canonical", spool=spool,
                       sinks=[f"tensorboard:{tb}"],
                       options=trackbridge.LoggerOptions(writer=writer, flush_interval=1.0))
print("writer", (run.status["writer"] or {}).get("pid", 0), flush=True)
i = 0
while True:
    if i == 100:
        offset[0] = 3600.0
        print("stepped", flush=True)
    run.log({"x": float(i), "mono": time.monotonic()}, step=i)
    i += 1
    time.sleep(0.01)
"""


@pytest.mark.parametrize("writer", WRITERS)
def test_clock_stepped_back_keeps_the_flush_bound(tmp_path, writer):
    """The wall clock stepped back an hour mid-run: a SIGKILL a few seconds later still loses at most the flush
    interval (1 s) of records, in the spool and, in writer-process mode, in the tracker fed behind it."""
    script = tmp_path / "clock.py"
    script.write_text(CLOCK)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, str(script), tmp_path / "spool", tmp_path / "tb", writer],
                            stdout=subprocess.PIPE, text=True, env=env)
    try:
        lines = Lines(proc.stdout)
        writer_pid = int(lines.next(300).split()[1])
        assert lines.next(300) == "stepped"
        time.sleep(3.0)
        killed_at = time.monotonic()
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    recs = [r for _s, r in iter_spool(tmp_path / "spool" / "clock.jsonl")]
    assert [r.step for r in recs] == list(range(len(recs))), "a prefix of the run, no holes"
    assert len(recs) > 100
    lost = killed_at - max(r.metrics["mono"] for r in recs)
    assert lost <= 1.0 + 0.75, f"lost {lost:.2f} s of records after the clock stepped back (bound: 1 s)"
    if writer_pid:          # the writer process finishes the trackers from the spool, then exits
        end = time.monotonic() + 120
        while _alive(writer_pid) and time.monotonic() < end:
            time.sleep(0.1)
        tb = tensorboard_points(tmp_path / "tb")
        assert exact(tb, ["x"], range(len(recs))) is None, exact(tb, ["x"], range(len(recs)))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split()[2] != "Z"
    except OSError:
        return True
