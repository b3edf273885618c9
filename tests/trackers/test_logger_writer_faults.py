"""What happens to the training process and the writer process is what the trackers say (issue 19): a writer
process that dies is started again and catches up; a killed, terminated or failed training run is never recorded
as a success; one run is logged by one process; Ctrl-C or SIGTERM during finish() leaves a note and no process
behind; a resumed run with a changed config keeps the trackers in agreement; a lagging writer's memory is bounded;
a wandb run folder deleted mid-run is written again. Both writer modes wherever the logger runs them; every tracker
read back with its own tools (tests/_support/readback.py)."""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import pytest

import trackbridge
from trackbridge.errors import UsageError
from trackbridge.logger import LoggerWarning
from trackbridge.sync.replay import read_pending

from _support import ROOT
from _support.lines import Lines
from _support.readback import (
    exact,
    mlflow_points,
    mlflow_run,
    mlflow_status,
    tensorboard_points,
    total,
    trackio_points,
    wandb_config,
    wandb_exit_codes,
    wandb_points,
)

WRITERS = ["process", "thread"]
KEYS = [f"custom/k{j:02d}" for j in range(10)]


def _row(i: int) -> dict[str, float]:
    return {k: float(i) + j / 100 for j, k in enumerate(KEYS)}



def _store(template: Path, where: Path) -> Path:
    where.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(template, where)
    return where


def _wait(pred, timeout: float, what: str, every: float = 0.02) -> None:
    end = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(every)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(ROOT), WANDB_MODE="offline", WANDB_SILENT="true",
                MLFLOW_DISABLE_TELEMETRY="true")


def _script(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "child.py"
    path.write_text(text)
    return path


class _Silent:
    """A TCP server that accepts every connection and never answers (a hung tracking server)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.conns: list[socket.socket] = []
        self.stop = False
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while not self.stop:
            try:
                self.conns.append(self.sock.accept()[0])
            except OSError:
                continue

    def close(self) -> None:
        self.stop = True
        self.thread.join(2)
        for c in self.conns:
            c.close()
        self.sock.close()


@pytest.fixture
def silent():
    s = _Silent()
    yield s
    s.close()


# -- item 4: the writer process killed (the OOM killer) --------------------------------------------------------------
def test_writer_process_killed_is_started_again_and_catches_up(tmp_path, mlflow_template, fault_cell):
    db = _store(mlflow_template, tmp_path / "ml.db")
    sinks = [f"tensorboard:{tmp_path / 'tb'}", f"mlflow:sqlite:///{db}", f"trackio:{tmp_path / 'tio'}"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run = trackbridge.init(project="oom", name="oom", run_id="oom", sinks=sinks, source="canonical",
                               spool=str(tmp_path / "spool"), options=trackbridge.LoggerOptions(writer="process"))
        for i in range(100):
            run.log(_row(i), step=i)
        _wait(lambda: all(s["written"] >= 1 for s in run.status["sinks"][1:]), 180, "every tracker to write")
        first = run.status["writer"]["pid"]
        os.kill(first, signal.SIGKILL)
        _wait(lambda: run.status["writer"]["restarts"] == 1, 60, "the run to see the writer process die")
        states = {s["sink"]: s["state"] for s in run.status["sinks"][1:]}
        assert set(states.values()) <= {"restarting", "ok", "closed"}, states
        assert "ok" not in states.values() or run.status["writer"]["pid"] != first, states
        for i in range(100, 200):
            run.log(_row(i), step=i)
        st = run.finish()
    assert run.status["writer"]["pid"] != first
    assert all(s["state"] == "closed" for s in st["sinks"]), run.summary()
    died = [str(w.message) for w in caught if "writer process died" in str(w.message)]
    assert len(died) == 1 and "SIGKILL" in died[0], died
    got = {"tensorboard": tensorboard_points(tmp_path / "tb"), "mlflow": mlflow_points(f"sqlite:///{db}", "oom"),
           "trackio": trackio_points(tmp_path / "tio" / "oom.db", "oom")}
    for tracker, points in got.items():
        assert exact(points, KEYS, range(200)) is None, (tracker, exact(points, KEYS, range(200)))
        fault_cell("writer process SIGKILLed mid-run (writer=process)", tracker, 200 * len(KEYS), total(points))
    assert mlflow_status(f"sqlite:///{db}", "oom") == "FINISHED"


# -- item 5: how the training process ended -------------------------------------------------------------------------
OUTCOME = r"""
import sys, time
import trackbridge
db, wb, spool, writer, how = sys.argv[1:6]
run = trackbridge.init(project="p", name="o", run_id="o", spool=spool, source="canonical",
                       sinks=[f"mlflow:sqlite:///{db}", f"wandb:{wb}"],
                       options=trackbridge.LoggerOptions(writer=writer))
for i in range(20):
    run.log({"loss": float(i)}, step=i)
end = time.monotonic() + 240
while any(s["written"] == 0 and s["state"] != "failed" for s in run.status["sinks"]) and time.monotonic() < end:
    time.sleep(0.05)
bad = [(s["sink"], s["state"], s["last_error"]) for s in run.status["sinks"] if s["written"] == 0]
print("ready", (run.status["writer"] or {}).get("pid", 0), repr(bad), flush=True)
if how == "exit":
    sys.exit(1)
time.sleep(600)
"""


@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM", "exit"])
@pytest.mark.parametrize("writer", WRITERS)
def test_a_killed_or_failed_run_is_never_recorded_as_finished(tmp_path, mlflow_template, writer, how):
    """SIGKILL / SIGTERM of training (a preemption): with the writer process, MLflow KILLED and wandb exit code 137
    (the writer process sees its training process vanish); with threads nothing outlives the process to say it,
    and the run is left RUNNING, never FINISHED. sys.exit(1): FAILED and exit code 1 in both modes."""
    db = _store(mlflow_template, tmp_path / "ml.db")
    proc = subprocess.Popen([sys.executable, str(_script(tmp_path, OUTCOME)), db, tmp_path / "wb", tmp_path / "spool",
                             writer, how], stdout=subprocess.PIPE, text=True, env=_env())
    try:
        line = Lines(proc.stdout).next(300).split(" ", 2)
        assert line[0] == "ready" and line[2] == "[]", f"a tracker took no record: {line[2]}"
        writer_pid = int(line[1])
        if how != "exit":
            os.kill(proc.pid, getattr(signal, how))
        proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    if writer_pid:
        _wait(lambda: not _alive(writer_pid), 300, "the writer process to close the trackers and end", every=0.1)
    status = mlflow_status(f"sqlite:///{db}", "o")
    codes = wandb_exit_codes(tmp_path / "wb", "o")
    if how == "exit":
        assert proc.returncode == 1
        assert status == "FAILED" and codes == [1], (status, codes)
    elif writer == "process":
        assert status == "KILLED" and codes == [137], (status, codes)
    else:
        assert status == "RUNNING" and codes == [], (status, codes)
    assert sum(tensorboard_or_mlflow(db)) == 20, "every point logged before the end is there"


def tensorboard_or_mlflow(db: Path) -> list[int]:
    return [sum(c.values()) for c in mlflow_points(f"sqlite:///{db}", "o").values()]


@pytest.mark.parametrize("writer", WRITERS)
def test_mlflow_run_that_recovered_mid_run_ends_finished(tmp_path, mlflow_template, writer):
    """The MLflow store locked by another process for a while: the sink fails, recovers when the lock goes,
    catches up, and the run ends FINISHED (it stayed RUNNING for good: close() after a reopen returned early)."""
    db = _store(mlflow_template, tmp_path / "ml.db")
    run = trackbridge.init(project="lock", name="lock", run_id="lock", sinks=[f"mlflow:sqlite:///{db}?bulk=0"],
                           source="canonical", spool=str(tmp_path / "spool"),
                           options=trackbridge.LoggerOptions(writer=writer, retries=0, retry_interval=0.5))
    for i in range(10):
        run.log(_row(i), step=i)
    _wait(lambda: run.status["sinks"][1]["written"] >= 10, 180, "the first records in MLflow")
    con = sqlite3.connect(db, timeout=0, isolation_level=None)
    con.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.warns(LoggerWarning, match="failed"):
            for i in range(10, 20):
                run.log(_row(i), step=i)
            _wait(lambda: run.status["sinks"][1]["state"] == "failed", 180, "the sink to fail on the locked store")
    finally:
        con.execute("ROLLBACK")
        con.close()
    for i in range(20, 30):
        run.log(_row(i), step=i)
    st = run.finish()
    assert st["sinks"][1]["state"] == "closed" and st["sinks"][1]["recoveries"] >= 1, st["sinks"][1]
    assert exact(mlflow_points(f"sqlite:///{db}", "lock"), KEYS, range(30)) is None
    assert mlflow_status(f"sqlite:///{db}", "lock") == "FINISHED"


# -- item 8: one run id, two processes ------------------------------------------------------------------------------
SECOND = r"""
import sys, trackbridge
spool, tb, writer, resume = sys.argv[1:5]
try:
    run = trackbridge.init(project="p", name="twin", run_id="twin", spool=spool, sinks=[f"tensorboard:{tb}"],
                           source="canonical", resume=resume == "1", options=trackbridge.LoggerOptions(writer=writer))
except trackbridge.UsageError as exc:
    print("REFUSED", exc, flush=True)
    sys.exit(2)
run.log({"custom/k00": -1.0}, step=999)
run.finish()
print("LOGGED", flush=True)
"""


@pytest.mark.parametrize("writer", WRITERS)
def test_one_run_id_is_logged_by_one_process(tmp_path, writer):
    """A second init() of a run that another process (or this one) is logging fails in init, naming the holder;
    after finish() the run can be resumed, and no lock file is left beside the spool."""
    spool, tb = tmp_path / "spool", tmp_path / "tb"
    run = trackbridge.init(project="p", name="twin", run_id="twin", spool=str(spool), sinks=[f"tensorboard:{tb}"],
                           source="canonical", options=trackbridge.LoggerOptions(writer=writer))
    for i in range(10):
        run.log({"custom/k00": float(i)}, step=i)
    script = _script(tmp_path, SECOND)
    for resume in ("0", "1"):
        r = subprocess.run([sys.executable, str(script), spool, tb, writer, resume], capture_output=True, text=True,
                           env=_env(), timeout=300)
        assert r.returncode == 2 and f"is being logged by process {os.getpid()}" in r.stdout, (r.stdout, r.stderr)
    with pytest.raises(UsageError, match="is being logged by process"):
        trackbridge.init(project="p", name="twin", run_id="twin", spool=str(spool), resume=True,
                         options=trackbridge.LoggerOptions(writer=writer))
    run.finish()
    assert sorted(p.name for p in spool.iterdir()) == ["twin.jsonl"], "a lock file left beside the spool"
    r = subprocess.run([sys.executable, str(script), spool, tb, writer, "1"], capture_output=True, text=True,
                       env=_env(), timeout=300)
    assert r.returncode == 0 and "LOGGED" in r.stdout, (r.stdout, r.stderr)
    points = tensorboard_points(tb)
    assert exact(points, ["custom/k00"], [*range(10), 999]) is None, exact(points, ["custom/k00"], [*range(10), 999])
    assert sorted(p.name for p in spool.iterdir()) == ["twin.jsonl"]


RACE = r"""
import os, sys, time, trackbridge
spool, tb, writer, go = sys.argv[1:5]
while not os.path.exists(go):
    time.sleep(0.001)
try:
    run = trackbridge.init(project="p", name="race", run_id="race", spool=spool, sinks=[f"tensorboard:{tb}"],
                           source="canonical", options=trackbridge.LoggerOptions(writer=writer))
except trackbridge.UsageError as exc:
    print("REFUSED", exc, flush=True)
    sys.exit(2)
for i in range(20):
    run.log({"custom/k00": float(os.getpid())}, step=i)
run.finish()
print("LOGGED", flush=True)
"""


@pytest.mark.parametrize("writer", WRITERS)
def test_two_processes_starting_one_run_at_once(tmp_path, writer):
    """Two training processes start the same run at the same moment: one logs it, the other fails in init; the
    run's values are those of one process only, each once."""
    spool, tb, go = tmp_path / "spool", tmp_path / "tb", tmp_path / "go"
    script = _script(tmp_path, RACE)
    procs = [subprocess.Popen([sys.executable, str(script), spool, tb, writer, go], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=_env()) for _ in range(2)]
    time.sleep(3.0)          # both imported and waiting
    go.touch()
    outs = [p.communicate(timeout=300) for p in procs]
    codes = sorted(p.returncode for p in procs)
    assert codes == [0, 2], (codes, outs)
    assert sum("REFUSED" in o for o, _e in outs) == 1
    points = tensorboard_points(tb)
    assert exact(points, ["custom/k00"], range(20)) is None, exact(points, ["custom/k00"], range(20))


# -- item 9: Ctrl-C or SIGTERM during finish() -----------------------------------------------------------------------
def _as_from_a_shell() -> None:
    """The training script starts with Ctrl-C as a shell gives it (default, not blocked), whatever this test process
    inherited or was left with (an ignored or blocked SIGINT is inherited across exec; see tests/conftest.py)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


INTERRUPT = r"""
import sys, trackbridge
spool, tb, writer, port = sys.argv[1:5]
run = trackbridge.init(project="p", name="intr", run_id="intr", spool=spool, source="canonical",
                       sinks=[f"tensorboard:{tb}", f"mlflow:http://127.0.0.1:{port}"],
                       options=trackbridge.LoggerOptions(writer=writer, retries=0, stall_timeout=600,
                                                         finish_timeout=900))
print("writer", (run.status["writer"] or {}).get("pid", 0), flush=True)
for i in range(50):
    run.log({"custom/k00": float(i)}, step=i)
print("finishing", flush=True)
run.finish()
print("finished", flush=True)
"""


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM", "SIGINT to the process group"])
@pytest.mark.parametrize("writer", WRITERS)
def test_interrupted_finish_writes_the_note_and_leaves_no_process(tmp_path, silent, writer, sig):
    """finish() waits on a hung server; Ctrl-C (SIGINT, to the training process or, as a terminal sends it, to its
    whole process group) or SIGTERM arrives: the pending note is written, the process ends within seconds, and its
    stdout/stderr pipes close with it (``python train.py | tee`` returns): the writer process holds neither and is
    gone too."""
    spool = tmp_path / "spool"
    proc = subprocess.Popen([sys.executable, str(_script(tmp_path, INTERRUPT)), spool, tmp_path / "tb", writer,
                             str(silent.port)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
                            start_new_session=True, preexec_fn=_as_from_a_shell)
    try:
        lines, errors = Lines(proc.stdout), Lines(proc.stderr)
        writer_pid = int(lines.next(300).split()[1])
        assert lines.next(300) == "finishing"
        time.sleep(3.0)
        if sig.endswith("group"):
            os.killpg(proc.pid, signal.SIGINT)
        else:
            os.kill(proc.pid, getattr(signal, sig))
        t0 = time.monotonic()
        out, err = lines.rest(60), errors.rest(60)    # EOF on both pipes: nobody else holds them
        took = time.monotonic() - t0
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert took < 30, f"{took:.0f} s until the pipes closed"
    assert "finished" not in out and proc.returncode != 0, (out, err[-2000:])
    if writer_pid:
        _wait(lambda: not _alive(writer_pid), 15, "the writer process to end", every=0.1)
    pending = read_pending(spool / "intr.jsonl")
    assert [e["sink"] for e in pending] == [f"mlflow:http://127.0.0.1:{silent.port}"], (pending, err[-2000:])
    assert pending[0]["records_left"] == 50
    assert "lacks 50 of the run's 50 records" in err
    assert not [p.name for p in spool.iterdir() if p.name.endswith((".tmp", ".lock"))]
    assert exact(tensorboard_points(tmp_path / "tb"), ["custom/k00"], range(50)) is None


# -- item 10: resume with a changed config --------------------------------------------------------------------------
@pytest.mark.parametrize("writer", WRITERS)
def test_resume_with_a_changed_config_warns_and_the_trackers_agree(tmp_path, mlflow_template, wandb_env, writer):
    db = _store(mlflow_template, tmp_path / "ml.db")
    sinks = [f"tensorboard:{tmp_path / 'tb'}", f"mlflow:sqlite:///{db}", f"wandb:{tmp_path / 'wb'}",
             f"trackio:{tmp_path / 'tio'}"]
    common = dict(project="cfg", name="cfg", run_id="cfg", sinks=sinks, source="canonical",
                  spool=str(tmp_path / "spool"), options=trackbridge.LoggerOptions(writer=writer))
    run = trackbridge.init(config={"lr": 0.001, "batch": 8}, **common)
    for i in range(5):
        run.log(_row(i), step=i)
    run.finish()
    with pytest.warns(LoggerWarning) as rec:
        run = trackbridge.init(config={"lr": 0.0005, "batch": 8}, resume=True, **common)
        for i in range(5, 10):
            run.log(_row(i), step=i)
        st = run.finish()
    assert all(s["state"] == "closed" for s in st["sinks"]), run.summary()
    said = [str(w.message) for w in rec if "config differs" in str(w.message)]
    assert len(said) == 1 and "lr: 0.001 -> 0.0005" in said[0] and "params cannot all be changed" in said[0], said
    change = {"from_step": 5, "changed": {"lr": [0.001, 0.0005]}}
    # MLflow: params as the run started; the change in trackbridge's run tag
    client, mrun = mlflow_run(f"sqlite:///{db}", "cfg")
    assert mrun.data.params["lr"] == "0.001"
    tags = mrun.data.tags
    info = json.loads("".join(tags[f"trackbridge.run.{i}"] for i in range(int(tags["trackbridge.run.count"]))))
    assert info["extra"]["config_changes"] == [change], info["extra"]
    # TensorBoard: the run info file beside the event files
    tb_info = json.loads((tmp_path / "tb" / "cfg" / "trackbridge-run.json").read_text())
    assert tb_info["config"]["lr"] == 0.001 and tb_info["extra"]["config_changes"] == [change]
    # wandb: the resumed offline run's config records
    cfg = wandb_config(tmp_path / "wb", "cfg")
    assert cfg["lr"] == 0.001 and cfg["_trackbridge"]["extra"]["config_changes"] == [change], cfg
    # Trackio: its configs table
    with sqlite3.connect(tmp_path / "tio" / "cfg.db") as conn:
        (text,) = conn.execute("SELECT config FROM configs WHERE run_id = 'cfg'").fetchone()
    tio = json.loads(text)
    assert tio["lr"] == 0.001 and tio["_trackbridge"]["extra"]["config_changes"] == [change], tio
    assert exact(tensorboard_points(tmp_path / "tb"), KEYS, range(10)) is None


# -- item 11: the writer's memory under lag --------------------------------------------------------------------------
def _kb(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise AssertionError(f"no {field} for {pid}")


WIDE = [f"custom/w{j:02d}" for j in range(50)]


def test_writer_memory_is_bounded_however_far_it_lags(tmp_path, fault_cell):
    """The writer process stopped (SIGSTOP) while 20,000 records of 50 keys are logged, then let go: its peak memory
    grows by a bounded amount (it read the whole backlog at once: memory in proportion to its lag), and so does the
    training process's (the feed keeps a few MB, then the spool serves); TensorBoard gets every point."""
    n = 20_000
    run = trackbridge.init(project="lag", name="lag", run_id="lag", sinks=[f"tensorboard:{tmp_path / 'tb'}"],
                           source="canonical", spool=str(tmp_path / "spool"),
                           options=trackbridge.LoggerOptions(writer="process", queue_size=500))
    row = {k: 0.5 for k in WIDE}
    for i in range(50):
        run.log(row, step=i)
    _wait(lambda: run.status["sinks"][1]["written"] >= 50, 180, "the writer to start")
    pid = run.status["writer"]["pid"]
    base_writer, base_self = _kb(pid, "VmHWM"), _kb(os.getpid(), "VmRSS")
    os.kill(pid, signal.SIGSTOP)
    try:
        for i in range(50, 50 + n):
            run.log(row, step=i)
        _wait(lambda: run._spool_worker.written_seq >= 50 + n - 1, 300, "the spool to take the backlog")
        grown_self = _kb(os.getpid(), "VmRSS") - base_self
    finally:
        os.kill(pid, signal.SIGCONT)
    _wait(lambda: run.status["sinks"][1]["written"] + run.status["sinks"][1]["caught_up"] >= 50 + n, 600,
          "the writer to catch up", every=0.2)
    grown_writer = _kb(pid, "VmHWM") - base_writer
    st = run.finish()
    assert st["sinks"][1]["state"] == "closed", st["sinks"][1]
    assert grown_writer < 60_000, f"the writer process grew by {grown_writer / 1024:.0f} MB catching up"
    assert grown_self < 60_000, f"the training process grew by {grown_self / 1024:.0f} MB while the writer lagged"
    points = tensorboard_points(tmp_path / "tb")
    assert exact(points, WIDE, range(50 + n)) is None, exact(points, WIDE, range(50 + n))
    fault_cell("writer process stopped while 20,000 steps were logged (writer=process)", "tensorboard",
               (50 + n) * len(WIDE), total(points))


def test_training_memory_is_bounded_while_a_tracker_hangs(tmp_path, silent):
    """Threads: a tracker hung on a server that never answers falls behind; the training process keeps only its
    queue of records (the spool holds the rest), and the other tracker gets every point."""
    n = 20_000
    run = trackbridge.init(project="lag", name="lag", run_id="lag", source="canonical", spool=str(tmp_path / "spool"),
                           sinks=[f"tensorboard:{tmp_path / 'tb'}", f"mlflow:http://127.0.0.1:{silent.port}"],

                           options=trackbridge.LoggerOptions(writer="thread", queue_size=500, retries=0,
                                                             stall_timeout=3, finish_timeout=120))
    row = {k: 0.5 for k in WIDE}
    for i in range(50):
        run.log(row, step=i)
    _wait(lambda: run.status["sinks"][1]["written"] >= 50, 180, "TensorBoard to start")
    base = _kb(os.getpid(), "VmRSS")
    for i in range(50, 50 + n):
        run.log(row, step=i)
    _wait(lambda: run.status["sinks"][1]["written"] + run.status["sinks"][1]["caught_up"] >= 50 + n, 300,
          "TensorBoard to take the records", every=0.1)
    grown = _kb(os.getpid(), "VmRSS") - base
    with pytest.warns(LoggerWarning, match="lacks"):
        run.finish()
    assert grown < 60_000, f"the training process grew by {grown / 1024:.0f} MB while a tracker hung"
    points = tensorboard_points(tmp_path / "tb")
    assert exact(points, WIDE, range(50 + n)) is None


# -- item 6: the wandb run folder deleted mid-run --------------------------------------------------------------------
@pytest.mark.parametrize("writer", WRITERS)
def test_wandb_folder_deleted_mid_run_is_written_again(tmp_path, wandb_env, fault_cell, writer):
    wb = tmp_path / "wb"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run = trackbridge.init(project="wbdel", name="wbdel", run_id="wbdel", sinks=[f"wandb:{wb}"],
                               source="canonical", spool=str(tmp_path / "spool"),
                               options=trackbridge.LoggerOptions(writer=writer, retries=1, retry_interval=1.0))
        for i in range(50):
            run.log(_row(i), step=i)
        _wait(lambda: run.status["sinks"][1]["written"] >= 50, 180, "wandb to take the first records")
        _wait(lambda: any(f.stat().st_size > 4096 for f in wb.rglob("*.wandb")), 120, "wandb-core to write")
        shutil.rmtree(wb / "wandb")
        for i in range(50, 150):
            run.log(_row(i), step=i)
            time.sleep(0.005)
        st = run.finish()
    assert st["sinks"][1]["state"] == "closed", run.summary()
    msgs = [str(w.message) for w in caught if issubclass(w.category, LoggerWarning)]
    assert any("was deleted" in m for m in msgs), msgs
    points = wandb_points(wb, "wbdel")
    assert exact(points, KEYS, range(150)) is None, exact(points, KEYS, range(150))
    fault_cell(f"wandb run folder deleted mid-run (writer={writer})", "wandb (its protobuf records)",
               150 * len(KEYS), total(points))


# -- issue 18, item 5: a store whose creation was cut short ------------------------------------------------------------
CREATE = r"""
import os, sys, time
import trackbridge
db, spool, writer, how = sys.argv[1:5]
run = trackbridge.init(project="p", name="first", run_id="first", spool=spool, source="canonical",
                       sinks=[f"mlflow:sqlite:///{db}"],
                       options=trackbridge.LoggerOptions(writer=writer, flush_interval=0.2))
for i in range(20):
    run.log({"custom/k00": float(i)}, step=i)
print("logged", flush=True)
if how == "timeout":
    run.finish(timeout=1.0)         # gives up while MLflow may still be creating its tables ...
    os._exit(0)                     # ... and the process ends at once (a job's time limit)
time.sleep(600)
"""


@pytest.mark.parametrize("how", ["kill", "timeout"])
@pytest.mark.parametrize("writer", WRITERS)
def test_mlflow_store_creation_cut_short_leaves_a_usable_store(tmp_path, writer, how):
    """The process ends while MLflow creates its SQLite store (SIGKILL of the process group the moment creation
    starts; or finish() timing out during it, then the process ending): the next run opens the store, and replaying
    the first run's spool writes every point once (a half-made store used to refuse every later open)."""
    db, spool = tmp_path / "ml.db", tmp_path / "spool"
    proc = subprocess.Popen([sys.executable, str(_script(tmp_path, CREATE)), db, spool, writer, how],
                            stdout=subprocess.PIPE, text=True, env=_env(), start_new_session=True)
    try:
        assert Lines(proc.stdout).next(300) == "logged"
        if how == "kill":
            _wait(lambda: list(tmp_path.glob(".ml.db.trackbridge-new-*")), 120, "MLflow to start creating the store",
                  every=0.005)
            _wait(lambda: sum(1 for _ in read_spool(spool / "first.jsonl")) == 20, 60, "the spool")
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    if how == "kill":
        assert not db.exists() or db.stat().st_size == 0, "the store was made before the kill: nothing was cut short"
    # a later run opens the store ...
    run = trackbridge.init(project="p", name="second", run_id="second", spool=str(spool), source="canonical",
                           options=trackbridge.LoggerOptions(writer=writer), sinks=[f"mlflow:sqlite:///{db}"])
    for i in range(10):
        run.log({"custom/k00": float(i)}, step=i)
    st = run.finish()
    assert st["sinks"][1]["state"] == "closed", run.summary()
    # ... and the first run's spool replays into it, every point once
    from trackbridge.sync.replay import replay
    replay(spool / "first.jsonl", f"mlflow:sqlite:///{db}")
    assert exact(mlflow_points(f"sqlite:///{db}", "first"), ["custom/k00"], range(20)) is None
    assert exact(mlflow_points(f"sqlite:///{db}", "second"), ["custom/k00"], range(10)) is None
    assert not list(tmp_path.glob(".ml.db.trackbridge-new-*")), "a temporary store left behind"


def read_spool(path: Path):
    from trackbridge.sync.replay import iter_spool
    return iter_spool(path) if path.exists() else iter([])


PLAIN = r"""
import sys
from mlflow import MlflowClient
MlflowClient(f"sqlite:///{sys.argv[1]}").search_experiments()
"""


@pytest.mark.parametrize("writer", WRITERS)
def test_a_store_another_tool_left_half_made_is_made_again(tmp_path, writer):
    """MLflow itself (not trackbridge) killed while creating a store leaves one that MLflow then refuses ("duplicate
    column", "table ... already exists"); holding no experiment, it is nobody's: the sink makes it again."""
    db = tmp_path / "ml.db"
    proc = subprocess.Popen([sys.executable, str(_script(tmp_path, PLAIN)), db], env=_env(),
                            stderr=subprocess.DEVNULL)
    try:
        _wait(lambda: db.exists() and db.stat().st_size > 100_000, 120, "MLflow to be creating its tables", 0.002)
        proc.kill()
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT COUNT(*) FROM experiments").fetchone()[0] == 0, "creation was not cut short"
    run = trackbridge.init(project="p", name="after", run_id="after", spool=str(tmp_path / "spool"),
                           source="canonical", options=trackbridge.LoggerOptions(writer=writer), sinks=[f"mlflow:sqlite:///{db}"])
    for i in range(5):
        run.log({"custom/k00": float(i)}, step=i)
    st = run.finish()
    assert st["sinks"][1]["state"] == "closed", run.summary()
    assert exact(mlflow_points(f"sqlite:///{db}", "after"), ["custom/k00"], range(5)) is None


# -- issue 18, item 8: a long finish() says what it waits for; no lock file left -------------------------------------
@pytest.mark.parametrize("writer", WRITERS)
def test_a_long_finish_says_what_it_waits_for(tmp_path, silent, caplog, writer):
    url = f"mlflow:http://127.0.0.1:{silent.port}"
    run = trackbridge.init(project="p", name="slow", run_id="slow", spool=str(tmp_path / "spool"), source="canonical",
                           sinks=[f"tensorboard:{tmp_path / 'tb'}", url],
                           options=trackbridge.LoggerOptions(writer=writer, retries=0, stall_timeout=8,
                                                             finish_timeout=120))
    for i in range(10):
        run.log({"custom/k00": float(i)}, step=i)
    with caplog.at_level("WARNING", logger="trackbridge"), pytest.warns(LoggerWarning, match="lacks 10 of"):
        run.finish()
    said = [r.getMessage() for r in caplog.records if "finish(): waiting" in r.getMessage()]
    assert said and url in said[0] and "no progress for 8 s is left behind" in said[0], said
    assert sorted(p.name for p in (tmp_path / "spool").iterdir()) == ["slow.jsonl", "slow.jsonl.pending.json"]


def test_the_writer_process_starts_its_own_wandb_service(tmp_path, monkeypatch):
    """A training script that used wandb itself has WANDB_SERVICE set (wandb.init puts its wandb-core's address
    there, for the processes it starts). The writer process must not use that service: it outlives a killed
    training process, whose wandb-core ends with it. An address of a service that is gone stands for that here."""
    monkeypatch.setenv("WANDB_SERVICE", "3-1-unix-/nonexistent/wandb-gone/socket")
    wb = tmp_path / "wb"
    run = trackbridge.init(project="p", name="svc", run_id="svc", spool=str(tmp_path / "spool"), source="canonical",
                           sinks=[f"wandb:{wb}?mode=offline"], options=trackbridge.LoggerOptions(writer="process"))
    for i in range(30):
        run.log({"loss": float(i)}, step=i)
    st = run.finish()
    assert [s["state"] for s in st["sinks"]] == ["closed", "closed"], run.summary()
    points = wandb_points(wb, "svc")
    assert exact(points, ["loss"], range(30)) is None, exact(points, ["loss"], range(30))
