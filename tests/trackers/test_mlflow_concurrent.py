"""Several writers creating and sharing one MLflow store or experiment at once (issue 31): nothing lost, no raw
database error, no run left RUNNING or FINISHED empty. Every count is MLflow's own (``MlflowClient``).

* The README's own ``trackbridge migrate tensorboard:old_runs/ mlflow:sqlite:///mlflow.db?experiment=grpo --jobs 4``
  into a store that does not exist yet (the real CLI): four threads used to run MLflow's alembic migrations into
  each other (``KeyError: 'script'``, ``duplicate column name: step``) under "Migrated: 11 run(s)".
* Eight training processes (real ``trackbridge.init``, the default writer process, an mlflow sink) start at one
  moment into one new SQLite store: the store is made once, the experiment once, every point of every run is
  there and every run is FINISHED ("database is locked" is waited for, not failed).
* Processes starting at one moment into a new experiment of a freshly started ``mlflow server``; and the
  get-or-create race itself, made to happen every time: another writer creates the experiment between the sink's
  look-up and its create.
* A migration whose runs fail does not say "Migrated: N run(s)": rc 1, the failed runs named.
"""
from __future__ import annotations

import os
import subprocess
import textwrap
import time
from pathlib import Path

import pytest

from trackbridge.record import Record, RunInfo

from test_migrate_support import PY, child_env, run_cli, write_run

pytest.importorskip("mlflow")

KEYS = 100


def _client(uri: str):
    from mlflow.tracking import MlflowClient
    return MlflowClient(tracking_uri=uri)


def _runs(uri: str, experiment: str) -> list:
    client = _client(uri)
    exps = [e for e in client.search_experiments() if e.name == experiment]
    assert len(exps) == 1, f"experiment {experiment!r} made {len(exps)} times"
    return client.search_runs([exps[0].experiment_id], max_results=1000)


def _points(uri: str, run_id: str, key: str) -> list[int]:
    return sorted(m.step for m in _client(uri).get_metric_history(run_id, key))


# -- migrate --jobs 4 into a new store (the README's line) ------------------------------------------------------
def test_readme_jobs_line_into_a_new_store(tmp_path, env):
    old = tmp_path / "old_runs"
    steps = 20
    for i in range(11):
        write_run(f"tensorboard:{old / f'run{i}'}", RunInfo(name=f"run{i}", project="p", run_id=f"r{i}"),
                  [Record(step=s, wall_time=1.7e9 + s, metrics={"custom/a": s + i / 10, "custom/b": -s})
                   for s in range(steps)])
    db = tmp_path / "new" / "mlflow.db"
    assert not db.exists()
    p = run_cli("migrate", f"tensorboard:{old}/", f"mlflow:sqlite:///{db}?experiment=grpo", "--jobs", "4",
                "--names", "keep", "--quiet",
                env_extra={"TRACKBRIDGE_STATE_DIR": str(tmp_path / "state")})
    assert p.returncode == 0, p.stderr[-3000:]
    assert "Migrated: 11 run(s), 220 records, 440 points" in p.stderr
    assert "FAILED" not in p.stderr and "Traceback" not in p.stderr
    runs = _runs(f"sqlite:///{db}", "grpo")
    assert sorted(r.info.run_name for r in runs) == sorted(f"run{i}" for i in range(11))
    for r in runs:
        assert r.info.status == "FINISHED"
        for key in ("custom/a", "custom/b"):
            assert _points(f"sqlite:///{db}", r.info.run_id, key) == list(range(steps)), (r.info.run_name, key)
    # nothing of the creation is left beside the store
    assert sorted(p.name for p in db.parent.iterdir()) == ["mlartifacts", "mlflow.db"] or \
        sorted(p.name for p in db.parent.iterdir()) == ["mlflow.db"]


# -- training processes sharing one store ------------------------------------------------------------------------
TRAIN = textwrap.dedent('''
    import os, sys, time
    from pathlib import Path
    import trackbridge
    sink, run_id, steps, keys, go = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), Path(sys.argv[5])
    while not go.exists():          # every process starts logging at one moment
        time.sleep(0.01)
    run = trackbridge.init(project="shared", name=run_id, run_id=run_id, sinks=[sink], source="canonical",
                           names="canonical", spool=sys.argv[6],
                           options=trackbridge.LoggerOptions(finish_timeout=240, stall_timeout=120))
    for s in range(steps):
        run.log({f"custom/k{j:03d}": s + j / 1000 for j in range(keys)}, step=s)
    st = run.finish()
    bad = [x for x in st["sinks"] if x["state"] not in ("ok", "closed")]
    print("STATUS", [(x["sink"], x["state"], x["last_error"]) for x in st["sinks"]], flush=True)
    sys.exit(3 if bad or st["problems"] else 0)
''')


def _train_together(tmp_path: Path, sink: str, n: int, steps: int, keys: int, timeout: float = 300) -> list[str]:
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    go = tmp_path / "go"
    spool = tmp_path / "spool"
    procs = [subprocess.Popen([PY, str(script), sink, f"proc-{i}", str(steps), str(keys), str(go), str(spool)],
                              env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for i in range(n)]
    time.sleep(1.0)
    go.write_text("go")
    outs = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=timeout)
            outs.append(out)
            assert p.returncode == 0, out[-3000:]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for out in outs:
        assert "Traceback" not in out and "database is locked" not in out, out[-3000:]
    pending = list(spool.glob("*.pending.json"))
    assert not pending, [p.read_text() for p in pending]
    return [f"proc-{i}" for i in range(n)]


def _check_runs(uri: str, experiment: str, names: list[str], steps: int, keys: int) -> None:
    runs = _runs(uri, experiment)
    assert sorted(r.info.run_name for r in runs) == sorted(names)      # one run each, none twice
    client = _client(uri)
    for r in runs:
        assert r.info.status == "FINISHED", (r.info.run_name, r.info.status)
        held = client.get_run(r.info.run_id).data.metrics
        assert len([k for k in held if k.startswith("custom/")]) == keys, r.info.run_name
        for j in (0, keys // 2, keys - 1):                 # whole histories of a few keys ...
            assert _points(uri, r.info.run_id, f"custom/k{j:03d}") == list(range(steps))
    if uri.startswith("sqlite:///"):                     # ... and every point, counted in the store MLflow made
        import sqlite3
        con = sqlite3.connect(f"file:{uri[len('sqlite:///'):]}?mode=ro", uri=True)
        try:
            for r in runs:
                (n,) = con.execute("SELECT COUNT(*) FROM metrics WHERE run_uuid = ? AND key LIKE 'custom/%'",
                                   (r.info.run_id,)).fetchone()
                assert n == steps * keys, (r.info.run_name, n)
        finally:
            con.close()


HOLD = textwrap.dedent('''
    import sqlite3, sys, time
    db, runs, hold = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    end = time.monotonic() + 120
    while time.monotonic() < end:       # once the first run writes its points, while the others open theirs ...
        try:
            con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1)
            n = con.execute("SELECT COUNT(*) FROM metrics").fetchone()[0]
            con.close()
            if n >= runs:
                break
        except sqlite3.Error:
            pass
        time.sleep(0.05)
    con = sqlite3.connect(db, timeout=60, isolation_level=None)
    con.execute("BEGIN EXCLUSIVE")      # ... another user of the store holds it (a backup, a long delete) for
    print("HELD", flush=True)           # longer than MLflow's own 20 s busy timeout
    time.sleep(hold)
    con.execute("COMMIT")
    print("RELEASED", flush=True)
''')


def test_eight_training_processes_share_one_new_sqlite_store(tmp_path):
    """Eight processes make one new store and share it; mid-way another connection holds the whole database for
    25 s (past MLflow's 20 s busy timeout, where every write failed with "database is locked"): the writes wait for
    it, and every point of every run is in the store, every run FINISHED."""
    db = tmp_path / "store" / "mlflow.db"
    steps = 300
    (tmp_path / "hold.py").write_text(HOLD)
    holder = subprocess.Popen([PY, str(tmp_path / "hold.py"), str(db), "1", "25"], stdout=subprocess.PIPE,
                              text=True)
    try:
        names = _train_together(tmp_path, f"mlflow:sqlite:///{db}?experiment=shared", 8, steps, KEYS)
        out, _ = holder.communicate(timeout=120)
    finally:
        if holder.poll() is None:
            holder.kill()
    assert out.split() == ["HELD", "RELEASED"]       # the store was held while the runs were written
    _check_runs(f"sqlite:///{db}", "shared", names, steps, KEYS)


def test_processes_into_a_new_experiment_of_a_fresh_server(tmp_path, mlflow_server):
    steps, keys = 30, 10
    experiment = f"fresh-{os.getpid()}-{time.time_ns()}"
    names = _train_together(tmp_path, f"mlflow:{mlflow_server.url}?experiment={experiment}", 4, steps, keys)
    _check_runs(mlflow_server.url, experiment, names, steps, keys)


@pytest.mark.parametrize("where", ["sqlite", "server"])
def test_experiment_made_by_another_writer_between_look_up_and_create(tmp_path, where, request, monkeypatch):
    """The get-or-create race, every time: another writer's client makes the experiment right after the sink's
    look-up found none; the sink then takes that experiment instead of failing on MLflow's raw INSERT error."""
    from trackbridge.trackers import make_sink
    from trackbridge.trackers.mlflow import sink as sink_mod
    if where == "server":
        uri = request.getfixturevalue("mlflow_server").url
    else:
        uri = f"sqlite:///{tmp_path / 'race.db'}"
    experiment = f"race-{where}-{time.time_ns()}"
    real_make = sink_mod.make_client
    other = []

    def make_client(location):
        client = real_make(location)
        looked = client.get_experiment_by_name

        def get_experiment_by_name(name):
            found = looked(name)
            if found is None and not other:          # the other writer makes it now, after this look-up
                other.append(_client(uri).create_experiment(name))
            return found
        client.get_experiment_by_name = get_experiment_by_name
        return client
    monkeypatch.setattr(sink_mod, "make_client", make_client)
    sink = make_sink(f"mlflow:{uri}?experiment={experiment}")
    sink.open(RunInfo(name="racer", run_id="racer-1"))
    sink.write([Record(step=s, wall_time=1.7e9 + s, metrics={"custom/x": float(s)}) for s in range(5)])
    sink.close()
    assert other, "the other writer did not make the experiment"
    runs = _runs(uri, experiment)
    assert [r.info.experiment_id for r in runs] == other       # the other writer's experiment, one run in it
    assert runs[0].info.status == "FINISHED"
    assert _points(uri, runs[0].info.run_id, "custom/x") == list(range(5))


# -- a migration whose runs failed does not say it migrated them ------------------------------------------------
def test_failed_runs_are_not_reported_migrated(tmp_path, env):
    src = tmp_path / "tb"
    write_run(f"tensorboard:{src / 'good'}", RunInfo(name="good", project="p", run_id="good"),
              [Record(step=s, wall_time=1.7e9 + s, metrics={"custom/a": float(s)}) for s in range(4)])
    for name in ("bad1", "bad2"):           # event files of junk: nothing readable, so these two runs fail
        (src / name).mkdir(parents=True)
        (src / name / "events.out.tfevents.1.host").write_bytes(os.urandom(3000))
    db = tmp_path / "m.db"
    p = run_cli("migrate", f"tensorboard:{src}", f"mlflow:sqlite:///{db}?experiment=e", "--names", "keep",
                "--quiet", env_extra={"TRACKBRIDGE_STATE_DIR": str(tmp_path / "state")})
    assert p.returncode != 0, p.stderr[-2000:]
    assert "Traceback" not in p.stderr
    assert "Migrated: 3 run(s)" not in p.stderr
    assert "Migrated: 1 of 3 run(s)" in p.stderr, p.stderr[-2000:]
    assert "FAILED: 2 run(s) (bad1, bad2)" in p.stderr, p.stderr[-2000:]
    assert "FAILED bad1:" in p.stderr and "FAILED bad2:" in p.stderr
    assert [r.info.run_name for r in _runs(f"sqlite:///{db}", "e")] == ["good"]    # no empty run for the others
