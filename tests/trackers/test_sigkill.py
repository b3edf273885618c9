"""A run killed with SIGKILL loses at most the spool's flush interval; a run that just exits is flushed at exit."""
import os
import signal
import subprocess
import sys
import time

from trackbridge.sync.replay import iter_spool, scan_spool

from _support import ROOT

CHILD = r"""
import sys, time
import trackbridge
run = trackbridge.init(project="p", name="k", sinks=[], source="canonical", spool=sys.argv[1], run_id="killed",
                       options=trackbridge.LoggerOptions(flush_interval=float(sys.argv[2])))
i = 0
while True:
    run.log({"x": float(i), "loss": 1.0 / (i + 1)})
    i += 1
    if i == 50:
        print("logging", flush=True)
    time.sleep(0.002)
"""

EXITS = r"""
import sys, trackbridge
run = trackbridge.init(project="p", name="e", sinks=[], source="canonical", spool=sys.argv[1], run_id="exits",
                       options=trackbridge.LoggerOptions(flush_interval=5.0))
for i in range(300):
    run.log({"x": i})
# no finish(): the atexit hook flushes
"""


def _child(tmp_path, code, *args):
    script = tmp_path / "child.py"
    script.write_text(code)
    env = dict(os.environ, PYTHONPATH=str(ROOT), WANDB_MODE="offline", WANDB_SILENT="true")
    return subprocess.Popen([sys.executable, str(script), *args], stdout=subprocess.PIPE, text=True, env=env)


def test_sigkill_loses_at_most_the_flush_interval(tmp_path):
    interval = 0.5
    proc = _child(tmp_path, CHILD, str(tmp_path / "spool"), str(interval))
    try:
        assert proc.stdout.readline().strip() == "logging"
        time.sleep(1.5)
        killed_at = time.time()
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL
    path = tmp_path / "spool" / "killed.jsonl"
    scan = scan_spool(path)
    recs = [r for _s, r in iter_spool(path)]
    assert scan.info is not None and scan.info.run_id == "killed"
    assert len(recs) > 100
    assert [r.step for r in recs] == list(range(len(recs))), "a prefix of the run, no holes"
    assert all(r.metrics["x"] == float(r.step) for r in recs)
    lost_seconds = killed_at - recs[-1].wall_time
    # the child logged up to the kill; what is missing is at most the flush interval (plus scheduling slack)
    assert lost_seconds <= interval + 0.25, f"lost {lost_seconds:.3f} s of records (flush interval {interval} s)"


def test_interpreter_exit_flushes_without_finish(tmp_path):
    proc = _child(tmp_path, EXITS, str(tmp_path / "spool"))
    assert proc.wait(timeout=60) == 0
    recs = [r for _s, r in iter_spool(tmp_path / "spool" / "exits.jsonl")]
    assert [r.step for r in recs] == list(range(300))
