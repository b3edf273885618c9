"""Idempotence, resume, parallel runs and dry runs of ``trackbridge migrate``.

* The same migration twice: every target tracker holds each point once (counted after run 1 and after run 2).
* Interrupted migrations: a sink that raises after N batches (in process), and a child process killed mid-way
  (SIGKILL); the next migration continues and every point is there exactly once.
* ``--jobs 2`` on sources holding 3 runs (a TensorBoard root with 3 run folders, an MLflow experiment with 3 runs)
  makes 3 runs.
* ``--dry-run`` prints each name with its fate and writes nothing.
"""
from __future__ import annotations

import signal
import subprocess
import time

import pytest

import trackbridge.migrate.migration as mig
from trackbridge.migrate import migrate, summary
from trackbridge.record import Record, RunInfo

from test_migrate_support import (
    KINDS,
    PY,
    child_env,
    count_points,
    location,
    points,
    read_runs,
    run_cli,
    write_run,
)

NAMES = ["actor/pg_loss", "critic/score/mean", "response_length/mean", "val-core/openai/gsm8k/acc/mean@1"]


def _records(n: int, t0: float = 1763700000.0) -> list[Record]:
    return [Record(step=i, wall_time=t0 + i * 0.5, metrics={k: i + j / 8 for j, k in enumerate(NAMES)})
            for i in range(n)]


def _jsonl_source(tmp, n=120, runs=("run-a",)) -> str:
    for name in runs:
        write_run(f"jsonl:{tmp / 'src'}", RunInfo(name=name, project="proj", run_id=name, config={"lr": 0.1}),
                  _records(n))
    return f"jsonl:{tmp / 'src'}"


# -- the same migration twice ---------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_same_migration_twice_writes_nothing_twice(kind, env):
    src = _jsonl_source(env, n=120)
    dst = location(kind, env / "dst")
    r1 = migrate(src, dst, progress=False)
    assert r1.ok, summary(r1)
    n1 = count_points(dst)
    assert n1 == 120 * len(NAMES)
    r2 = migrate(src, dst, progress=False)
    assert r2.ok and r2.runs[0].already_done and r2.runs[0].points == 0
    assert "already migrated" in summary(r2)
    assert count_points(dst) == n1
    assert len(read_runs(dst)) == 1


@pytest.mark.parametrize("kind", ["jsonl", "mlflow", "trackio", "tensorboard"])
def test_lost_ledger_falls_back_to_the_destination(kind, env, tmp_path_factory, monkeypatch):
    """Without its ledger (another machine, a wiped cache) a second migration still adds nothing."""
    src = _jsonl_source(env, n=60)
    dst = location(kind, env / "dst")
    assert migrate(src, dst, progress=False).ok
    monkeypatch.setenv("TRACKBRIDGE_STATE_DIR", str(tmp_path_factory.mktemp("fresh-state")))
    r2 = migrate(src, dst, progress=False)
    assert r2.ok and r2.runs[0].points == 0 and r2.runs[0].skipped_records == 60
    assert count_points(dst) == 60 * len(NAMES)


# -- interrupted migrations -----------------------------------------------------------------------------------
class _Boom(RuntimeError):
    pass


@pytest.mark.parametrize("kind", KINDS)
def test_interrupted_by_a_failing_sink_resumes(kind, env, monkeypatch):
    src = _jsonl_source(env, n=250)
    dst = location(kind, env / "dst")
    monkeypatch.setattr(mig, "BATCH_RECORDS", 40)          # 7 batches
    real_make_sink = mig.make_sink
    calls = {"n": 0}

    def failing_sink(spec):
        sink = real_make_sink(spec)
        write = sink.write

        def write_then_fail(records):
            calls["n"] += 1
            if calls["n"] > 3:
                raise _Boom("disk full (simulated)")
            write(records)
        sink.write = write_then_fail
        return sink

    monkeypatch.setattr(mig, "make_sink", failing_sink)
    r1 = migrate(src, dst, progress=False)
    assert not r1.ok and "disk full" in (r1.runs[0].error or "")
    assert "FAILED" in summary(r1)
    assert count_points(dst) == 3 * 40 * len(NAMES)

    monkeypatch.setattr(mig, "make_sink", real_make_sink)
    r2 = migrate(src, dst, progress=False)
    assert r2.ok, summary(r2)
    assert r2.runs[0].skipped_records == 120 and r2.runs[0].records == 130
    got = points(dst)
    assert len(got) == 250 * len(NAMES)
    assert {(s, w) for (_, s, w, _) in got} == {(r.step, r.wall_time) for r in _records(250)}
    assert len(read_runs(dst)) == 1


@pytest.mark.parametrize("kind", KINDS)
def test_a_close_cut_short_leaves_the_run_to_be_done_again(kind, env, monkeypatch):
    """Every record written, then the process dies in the destination's close (a kill while TensorBoard writes its
    final run info, while MLflow ends its run): the ledger must not say the run is complete before the close is
    done, or the next migration skips it and the close never happens (a Ray worker killed there left
    trackbridge-run.json.tmp and the run info of the open behind: tests/trackers/test_migrate_ray.py)."""
    src = _jsonl_source(env, n=50)
    dst = location(kind, env / "dst")
    real_make_sink = mig.make_sink

    def sink_whose_close_fails(spec):
        sink = real_make_sink(spec)
        close = sink.close

        def close_then_die():       # the tracker's own close runs (a kill leaves no wandb run of this process
            close()                 # behind either), then the process dies before migrate returns to its ledger
            raise _Boom("killed while closing (simulated)")
        sink.close = close_then_die
        return sink

    monkeypatch.setattr(mig, "make_sink", sink_whose_close_fails)
    r1 = migrate(src, dst, progress=False)
    assert not r1.ok and "killed while closing" in (r1.runs[0].error or ""), summary(r1)
    monkeypatch.setattr(mig, "make_sink", real_make_sink)
    r2 = migrate(src, dst, progress=False)
    assert r2.ok, summary(r2)
    assert not r2.runs[0].already_done, "the run was taken as migrated though its destination was never closed"
    assert r2.runs[0].records == 0 and r2.runs[0].skipped_records == 50, summary(r2)
    got = points(dst)                              # each point once
    assert len(got) == 50 * len(NAMES) and len(read_runs(dst)) == 1
    assert not list((env / "dst").rglob("*.tmp"))


_KILL_CHILD = r"""
import os, sys, time
import trackbridge.migrate.migration as mig
from trackbridge.trackers import make_sink as real
mig.BATCH_RECORDS = 20
def slow(spec):
    s = real(spec); w = s.write
    def write(recs):
        w(recs)
        print("batch", flush=True)
        time.sleep(0.3)
    s.write = write
    return s
mig.make_sink = slow
mig.migrate(sys.argv[1], sys.argv[2], progress=False)
print("done", flush=True)
"""


@pytest.mark.parametrize("kind", ["jsonl", "tensorboard", "mlflow", "trackio", "wandb"])
def test_killed_midway_resumes_with_every_point_once(kind, env):
    src = _jsonl_source(env, n=200)
    dst = location(kind, env / "dst")
    envv = child_env()
    proc = subprocess.Popen([PY, "-c", _KILL_CHILD, src, dst], env=envv, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    seen = 0
    deadline = time.monotonic() + 120
    while seen < 3 and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen += line.startswith("batch")
    assert seen == 3, "the child did not write 3 batches"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    r = run_cli("migrate", src, dst, "--quiet")
    assert r.returncode == 0, r.stderr
    got = points(dst)
    # points() fails on any point there twice
    assert {(s, w) for (_, s, w, _) in got} == {(r.step, r.wall_time) for r in _records(200)}
    assert len(got) == 200 * len(NAMES)


# -- several runs, in parallel --------------------------------------------------------------------------------
def test_jobs_2_tensorboard_root_with_3_runs(env):
    for name in ("seed-1", "seed-2", "seed-3"):
        write_run(f"tensorboard:{env / 'tb'}", RunInfo(name=name, run_id=name), _records(30))
    dst = location("mlflow", env / "dst", experiment="moved")
    p = run_cli("migrate", f"tensorboard:{env / 'tb'}", dst, "--jobs", "2", "--quiet")
    assert p.returncode == 0, p.stderr
    runs = read_runs(dst)
    assert sorted(i.name for i, _, _ in runs) == ["seed-1", "seed-2", "seed-3"]
    assert all(sum(len(r.metrics) for r in recs) == 30 * len(NAMES) for _, recs, _ in runs)
    assert "3 run(s)" in p.stderr


def test_jobs_2_mlflow_experiment_with_3_runs(env):
    src = location("mlflow", env / "src", experiment="exp")
    for name in ("a", "b", "c"):
        write_run(src, RunInfo(name=name, project="exp", run_id=name, config={"seed": name}), _records(25))
    write_run(location("mlflow", env / "src", experiment="other"), RunInfo(name="elsewhere", project="other"),
              _records(5))
    dst = f"tensorboard:{env / 'tb'}"
    r = migrate(src, dst, jobs=2, progress=False)
    assert r.ok and len(r.runs) == 3, summary(r)
    runs = read_runs(dst)
    assert sorted(i.name for i, _, _ in runs) == ["a", "b", "c"]
    assert {i.name: i.config for i, _, _ in runs} == {n: {"seed": n} for n in "abc"}
    assert all(sum(len(x.metrics) for x in recs) == 25 * len(NAMES) for _, recs, _ in runs)
    r2 = migrate(src, dst, jobs=2, progress=False)        # idempotent with jobs too
    assert all(x.already_done for x in r2.runs)
    assert sum(sum(len(x.metrics) for x in recs) for _, recs, _ in read_runs(dst)) == 3 * 25 * len(NAMES)


def test_jobs_progress_lines_without_a_terminal(env):
    for name in ("r1", "r2", "r3"):
        write_run(f"jsonl:{env / 'src'}", RunInfo(name=name, run_id=name), _records(10))
    p = run_cli("migrate", f"jsonl:{env / 'src'}", f"jsonl:{env / 'dst'}", "--jobs", "2")
    assert p.returncode == 0, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("run ")]
    assert len(lines) == 3 and all("points" in ln for ln in lines), p.stderr
    assert "\r" not in p.stderr


# -- dry run --------------------------------------------------------------------------------------------------
def test_dry_run_prints_each_name_and_writes_nothing(env):
    recs = _records(5)
    for r in recs:
        r.metrics["my_custom_thing"] = 1.0
        r.metrics["actor/entropy"] = 0.5
    write_run(f"jsonl:{env / 'src'}", RunInfo(name="run", run_id="run"), recs)
    for kind in KINDS:
        dst = location(kind, env / f"dst-{kind}") if kind in ("mlflow", "trackio") else f"{kind}:{env / f'dst-{kind}'}"
        before = sorted(p.name for p in (env / f"dst-{kind}").rglob("*")) if (env / f"dst-{kind}").exists() else []
        p = run_cli("migrate", f"jsonl:{env / 'src'}", dst, "--dry-run")
        assert p.returncode == 0, p.stderr
        out = p.stdout
        lines = {ln.split("->")[0].strip(): ln for ln in out.splitlines() if "->" in ln}
        assert "renamed" in lines["actor/pg_loss"] and "loss/policy" in lines["actor/pg_loss"]
        assert "unmapped" in lines["my_custom_thing"]
        assert "approximate" in lines["actor/entropy"]
        assert "val-core/openai/gsm8k/acc/mean@1" in lines
        assert "Dry run" in out and "would be written" in out
        after = sorted(p.name for p in (env / f"dst-{kind}").rglob("*")) if (env / f"dst-{kind}").exists() else []
        assert after == before, f"dry run wrote into {kind}: {set(after) - set(before)}"
    assert not (env / "state" / "migrations").exists() or not any((env / "state" / "migrations").iterdir())
