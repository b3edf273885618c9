"""Issue 31: when a resumed run's catch-up is cut short by ``finish_timeout``, the pending note said "lacks 300
records" (the records of the resumed process) where SwanLab lacked 12,787. The note now counts what the tracker
lacks against what it holds, read back once nothing writes to it any more (the tracker threads are stopped and close
their tracker; the writer process has ended): here checked against SwanLab's own ``DataStoreReader`` on the offline
run, point by point, in both writer modes; then ``replay`` completes it, once."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

import trackbridge
from trackbridge.logger import LoggerWarning
from trackbridge.sync.replay import read_pending

from _support import ROOT
from _support.tracker_files import swanlab_points

KEYS = [f"custom/k{k}" for k in range(8)]
BEFORE = 30_000          # records the run logged before it was resumed, with no tracker but the spool
AFTER = 300              # records the resumed process logs


def _row(step: int) -> dict[str, float]:
    return {k: float(step + i) for i, k in enumerate(KEYS)}


def _held(logdir: Path) -> Counter:
    if not list(logdir.glob("run-*/run-*.swanlab")):       # finish() gave up before SwanLab had opened its run
        return Counter()
    points, _config, _raw = swanlab_points(logdir)
    return Counter((key, step) for key, step, _t, _v in points)


@pytest.mark.parametrize("writer", ["thread", "process"])
def test_the_note_counts_what_a_cut_off_catch_up_left_out(tmp_path, writer):
    spool = str(tmp_path / "spool")
    run = trackbridge.init(project="p", run_id="r", sinks=[], spool=spool, source="canonical",
                           options=trackbridge.LoggerOptions(writer="thread"))
    for s in range(BEFORE):
        run.log(_row(s), step=s)
    run.finish()

    # resumed with SwanLab, which has all 30,000 earlier records to catch up, and finish() gives it 0.3 s
    with pytest.warns(LoggerWarning) as said:
        run = trackbridge.init(project="p", run_id="r", sinks=[f"swanlab:{tmp_path / 'sw'}"], spool=spool,
                               source="canonical", resume=True,
                               options=trackbridge.LoggerOptions(finish_timeout=0.3, writer=writer))
        assert run._next_step == BEFORE
        for s in range(BEFORE, BEFORE + AFTER):
            run.log(_row(s), step=s)
        run.finish()
    (note,) = read_pending(run.spool_path)

    # what SwanLab holds, read with its own reader, against everything logged
    logged = Counter((k, s) for s in range(BEFORE + AFTER) for k in KEYS)
    held = _held(tmp_path / "sw")
    lacking = logged - held
    assert not held - logged                     # nothing doubled, nothing made up
    steps = {s for _k, s in lacking}
    assert len(steps) > AFTER, "the catch-up was not cut short: this machine caught up 30,000 records in time"
    assert note["points_left"] == sum(lacking.values())
    assert note["records_left"] == len(steps)
    assert note["points_held"] == sum(held.values())
    assert note["from_record"] == min(steps)     # one record a step here
    assert note["counted"] == "read back from the tracker"
    lines = [str(w.message) for w in said if "finish(): sink swanlab:" in str(w.message)]
    assert len(lines) == 1, lines
    assert (f"lacks {sum(lacking.values()):,} points in {len(steps):,} of the run's {BEFORE + AFTER:,} records"
            in lines[0]), lines[0]
    assert re.search(rf"counted against the {sum(held.values()):,} points it holds", lines[0]), lines[0]

    # `trackbridge replay SPOOL` writes exactly what the note counted, completes the tracker and strikes the note
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    p = subprocess.run([sys.executable, "-m", "trackbridge", "replay", str(run.spool_path)], capture_output=True,
                       text=True, env=env, timeout=600, cwd=str(ROOT))
    assert p.returncode == 0, p.stderr[-3000:]
    assert _held(tmp_path / "sw") == logged, "SwanLab after replay: every point once"
    assert read_pending(run.spool_path) == []


ORPHAN = r'''
import os, signal, sys
import trackbridge
spool, logdir, keys, before = sys.argv[1], sys.argv[2], sys.argv[3].split(","), int(sys.argv[4])
run = trackbridge.init(project="p", run_id="r", sinks=[f"swanlab:{logdir}"], spool=spool, source="canonical",
                       resume=True,
                       options=trackbridge.LoggerOptions(finish_timeout=0.2, stall_timeout=0.2, flush_interval=0.1,
                                                         writer="process"))
for s in range(before, before + 300):
    run.log({k: float(s + i) for i, k in enumerate(keys)}, step=s)
import time; time.sleep(0.4)                  # the spool's flush interval: what training logged is in the spool
print("logged", flush=True)
os.kill(os.getpid(), signal.SIGKILL)       # training killed: the writer process is left alone with the run
'''


def test_the_orphaned_writer_process_counts_what_the_tracker_lacks(tmp_path):
    """Training SIGKILLed while the writer process still catches SwanLab up: the writer process, left alone, writes
    the note itself, counted against what SwanLab holds (read with its own reader here), not estimated."""
    spool = tmp_path / "spool"
    run = trackbridge.init(project="p", run_id="r", sinks=[], spool=str(spool), source="canonical",
                           options=trackbridge.LoggerOptions(writer="thread"))
    for s in range(BEFORE):
        run.log(_row(s), step=s)
    run.finish()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    p = subprocess.run([sys.executable, "-c", ORPHAN, str(spool), str(tmp_path / "sw"), ",".join(KEYS), str(BEFORE)],
                       capture_output=True, text=True, env=env, timeout=300, cwd=str(ROOT))
    assert p.returncode == -9 and "logged" in p.stdout, (p.returncode, p.stderr[-3000:])
    import time
    note_file = spool / "r.jsonl.pending.json"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (note_file.exists() and not (spool / "r.jsonl.lock").exists()):
        time.sleep(0.2)
    notes = read_pending(spool / "r.jsonl")
    assert len(notes) == 1, (notes, sorted(os.listdir(spool)))
    note = notes[0]
    held = _held(tmp_path / "sw")
    from trackbridge.stream import read_stream
    logged = Counter((k, rec.step) for _seq, rec in read_stream(spool / "r.jsonl") for k in rec.metrics)
    assert len(logged) == (BEFORE + 300) * len(KEYS)
    lacking = logged - held
    assert not held - logged
    assert sum(lacking.values()) > 0, "SwanLab caught up 30,000 records within 0.2 s of finish_timeout"
    assert note["counted"] == "read back from the tracker", note
    assert note["points_left"] == sum(lacking.values()) and note["points_held"] == sum(held.values())
    assert note["records_left"] == len({s for _k, s in lacking}) and note["outcome"] == "killed", note
