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
from trackbridge.replay import read_pending

from _support import ROOT
from _support.tracker_files import swanlab_points

KEYS = [f"custom/k{k}" for k in range(8)]
BEFORE = 30_000          # records the run logged before it was resumed, with no tracker but the spool
AFTER = 300              # records the resumed process logs


def _row(step: int) -> dict[str, float]:
    return {k: float(step + i) for i, k in enumerate(KEYS)}


def _held(logdir: Path) -> Counter:
    points, _config, _raw = swanlab_points(logdir)
    return Counter((key, step) for key, step, _t, _v in points)


@pytest.mark.parametrize("writer", ["thread", "process"])
def test_the_note_counts_what_a_cut_off_catch_up_left_out(tmp_path, writer):
    spool = str(tmp_path / "spool")
    run = trackbridge.init(project="p", run_id="r", sinks=[], spool=spool, source="canonical", writer="thread")
    for s in range(BEFORE):
        run.log(_row(s), step=s)
    run.finish()

    # resumed with SwanLab, which has all 30,000 earlier records to catch up, and finish() gives it 2 s
    with pytest.warns(LoggerWarning) as said:
        run = trackbridge.init(project="p", run_id="r", sinks=[f"swanlab:{tmp_path / 'sw'}"], spool=spool,
                               source="canonical", resume=True, finish_timeout=2.0, writer=writer)
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
