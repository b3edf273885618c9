"""Two attempts at one run never both open it in the destination (issue 24: "a retried task can write a run header
twice").

* The same migration started twice at the same moment (two processes, ``--jobs 2`` each) into TensorBoard: every run
  exists once, every point once, read back with TensorBoard's own loader. Each run is migrated under its ledger's
  claim, so the second process waits for the first and then finds the run complete. (Without the claim both write
  every run into one folder: 600 points doubled per run. Into MLflow, checked by hand, the second process creates
  MLflow runs of its own or fails on SQLite's lock; each MLflow process costs ~10 s here, so it is not repeated in
  the suite: tests/trackers/test_migrate_ray.py writes MLflow from two workers at once.)
* A TensorBoard run folder's first event file appears with its whole header or not at all: an attempt that dies
  between writing the header and putting the file in place leaves a temporary file no reader takes, and the next
  attempt opens the same folder (before, it took the folder for someone else's and made ``NAME-2``).
"""
from __future__ import annotations

import collections
import subprocess

import pytest

from trackbridge.record import Record, RunInfo

from test_migrate_support import PY, child_env, write_run

KEYS = ["custom/a", "custom/b", "custom/c"]


def _source(folder, runs: int, steps: int) -> str:
    for i in range(runs):
        write_run(f"jsonl:{folder}", RunInfo(name=f"r{i}", run_id=f"r{i}"),
                  [Record(step=s, wall_time=1.7e9 + s, metrics={k: s + j for j, k in enumerate(KEYS)})
                   for s in range(steps)])
    return f"jsonl:{folder}"


def _tb_counts(root):
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    out = {}
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        c = collections.Counter()
        for path in folder.glob("*tfevents*"):
            for ev in EventFileLoader(str(path)).Load():
                for v in ev.summary.value:
                    if v.tag in KEYS:
                        c[(v.tag, ev.step)] += 1
        out[folder.name] = c
    return out


def test_the_same_migration_twice_at_once(env):
    runs = 6
    src = _source(env / "src", runs=runs, steps=200)
    dst = f"tensorboard:{env / 'dst'}"
    envv = {**child_env(), "TRACKBRIDGE_STATE_DIR": str(env / "state")}
    procs = [subprocess.Popen([PY, "-m", "trackbridge", "migrate", src, dst, "--jobs", "2", "--quiet"], env=envv,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    counts = _tb_counts(env / "dst")
    assert sorted(counts) == [f"r{i}" for i in range(runs)]
    want = {(k, s) for k in KEYS for s in range(200)}
    for name, c in counts.items():
        assert set(c) == want and set(c.values()) == {1}, f"{name}: {sum(n > 1 for n in c.values())} doubled"


def test_a_tensorboard_header_cut_off_leaves_no_second_folder(env, monkeypatch):
    import os

    import trackbridge.trackers.tensorboard.sink as tbsink
    from trackbridge.trackers import make_sink
    info = RunInfo(name="run", run_id="rid-1")
    real_replace = os.replace

    def killed(*_a, **_k):
        raise KeyboardInterrupt("killed between the header and the rename")
    monkeypatch.setattr(tbsink.os, "replace", killed)
    sink = make_sink(f"tensorboard:{env / 'tb'}")
    with pytest.raises(KeyboardInterrupt):
        sink.open(RunInfo(name="run", run_id="rid-1"), resume=True)
    assert not list((env / "tb").rglob("*tfevents*"))
    monkeypatch.setattr(tbsink.os, "replace", real_replace)
    sink = make_sink(f"tensorboard:{env / 'tb'}")
    sink.open(info, resume=True)
    sink.write([Record(step=s, wall_time=1.7e9 + s, metrics={"custom/a": float(s)}) for s in range(5)])
    sink.close()
    assert sorted(p.name for p in (env / "tb").iterdir()) == ["run"]
    counts = _tb_counts(env / "tb")
    assert set(counts) == {"run"} and counts["run"] == collections.Counter({("custom/a", s): 1 for s in range(5)})
    from trackbridge.trackers import open_source
    runs = list(open_source(f"tensorboard:{env / 'tb'}").runs())
    assert len(runs) == 1 and runs[0].info.run_id == "rid-1" and not runs[0].problems
