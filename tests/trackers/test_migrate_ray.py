"""``trackbridge migrate --engine ray`` on a real one-node Ray cluster on 127.0.0.1 (Ray has no local mode).

The cluster is started once for this module (2 CPUs, a small object store, no dashboard) and shut down at its end;
each test's migration connects to it. Every destination is read back with its tracker's own tools (TensorBoard's
``EventFileLoader`` over the raw event files, ``MlflowClient``, the stream's JSON lines) and every point counted:
nothing lost, nothing doubled, no second run.

* 200 tiny runs into TensorBoard while Ray workers are SIGKILLed in the middle of a run (the pid of the worker that
  holds a run's ledger claim at that moment): Ray retries the task, the retry continues each run from its ledger,
  and the summary still counts every record once (written, or found in the destination).
* 10 runs into MLflow (SQLite) from two worker processes at once.
* One rate limiter for a destination: the migration's tasks and a second user of the same destination book with one
  actor; no second holds more than the limit allows, and every write went through it.
* Running the same migration again writes nothing; the CLI's ``--engine ray --ray-address`` reaches the cluster;
  the command SIGKILLed mid-way, then started again, continues its plan; without Ray installed, ``--engine ray`` is
  a one-line usage error.
"""
from __future__ import annotations

import collections
import fcntl
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest

from trackbridge.migrate import migrate, summary
from trackbridge.migrate.ratelimit import max_in_window
from trackbridge.record import Record, RunInfo

from test_migrate_support import PY, child_env, location, run_cli, write_run

ray = pytest.importorskip("ray")

KEYS = ["actor/pg_loss", "critic/score/mean", "response_length/mean", "custom/a", "custom/b"]


@pytest.fixture(scope="module")
def cluster():
    """A one-node Ray cluster for this module: 2 CPUs (tasks take 1 each), 80 MB of object store, no dashboard."""
    tmp = Path(tempfile.mkdtemp(prefix="rt-", dir="/tmp"))       # short: Ray's socket paths must stay < 108 bytes
    from trackbridge.migrate.bulk import loopback_only
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RAY_AUTH_MODE", "disabled")      # a cluster on 127.0.0.1 only; no token written to ~/.ray
        undo = loopback_only()                      # every socket on 127.0.0.1 (the address alone binds ::)
        ray.init(address="local", num_cpus=2, object_store_memory=80 * 2 ** 20, include_dashboard=False,
                 log_to_driver=False, namespace="trackbridge", _node_ip_address="127.0.0.1", _temp_dir=str(tmp))
        try:
            yield ray.get_runtime_context().gcs_address
        finally:
            ray.shutdown()
            undo()
            shutil.rmtree(tmp, ignore_errors=True)


def _records(n: int, seed: int) -> list[Record]:
    return [Record(step=i, wall_time=1763700000.0 + i, metrics={k: seed + i / 8 + j for j, k in enumerate(KEYS)})
            for i in range(n)]


def _source(folder: Path, runs: int, steps: int) -> str:
    for i in range(runs):
        write_run(f"jsonl:{folder}", RunInfo(name=f"run-{i:03d}", project="proj", run_id=f"run-{i:03d}"),
                  _records(steps, i))
    return f"jsonl:{folder}"


# -- reading back with each tracker's own tools -----------------------------------------------------------------
def tensorboard_runs(root: Path) -> dict[str, dict[str, collections.Counter]]:
    """run folder -> tag -> Counter(step), every event file read with TensorBoard's own loader."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    out: dict[str, dict[str, collections.Counter]] = {}
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        tags: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        for path in sorted(folder.glob("*tfevents*")):
            for event in EventFileLoader(str(path)).Load():
                for v in event.summary.value:
                    if not v.tag.startswith(("trackbridge/", "_hparams_")):
                        tags[v.tag][event.step] += 1
        out[folder.name] = dict(tags)
    return out


def mlflow_runs(uri: str) -> dict[str, dict[str, collections.Counter]]:
    """MLflow run name -> key -> Counter(step), through ``MlflowClient``; a name twice fails."""
    from mlflow.tracking import MlflowClient
    client = MlflowClient(tracking_uri=uri)
    out: dict[str, dict[str, collections.Counter]] = {}
    exps = [e.experiment_id for e in client.search_experiments()]
    for run in client.search_runs(exps, max_results=1000):
        name = run.info.run_name
        assert name not in out, f"MLflow holds run {name!r} twice"
        out[name] = {k: collections.Counter(m.step for m in client.get_metric_history(run.info.run_id, k))
                     for k in run.data.metrics}
    return out


def assert_every_point_once(runs: dict[str, dict[str, collections.Counter]], names: list[str], steps: int,
                            keys: int) -> None:
    assert sorted(runs) == sorted(names), f"runs differ: extra {sorted(set(runs) - set(names))[:5]}, " \
                                          f"missing {sorted(set(names) - set(runs))[:5]}"
    for name, tags in runs.items():
        assert len(tags) == keys, f"{name}: {len(tags)} keys"
        for tag, counter in tags.items():
            assert set(counter) == set(range(steps)) and set(counter.values()) == {1}, \
                f"{name} {tag}: doubled {[s for s, n in counter.items() if n > 1][:5]}, " \
                f"missing {sorted(set(range(steps)) - set(counter))[:5]}"


# -- killing workers mid-run --------------------------------------------------------------------------------
class Killer(threading.Thread):
    """SIGKILLs, ``times`` times, the Ray worker that holds a run's ledger claim at that moment (a run it is in the
    middle of), found from the claim files (the holder's pid is written in them)."""

    def __init__(self, state: Path, times: int, every: float) -> None:
        super().__init__(daemon=True)
        self.state, self.times, self.every = state / "migrations", times, every
        self.killed: list[tuple[int, str]] = []      # (pid, ledger key of the run it was migrating)
        self.stop = threading.Event()

    def _held(self) -> list[tuple[int, str]]:
        out = []
        for lock in self.state.glob("*.lock") if self.state.is_dir() else []:
            fd = os.open(lock, os.O_RDONLY)
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                fcntl.flock(fd, fcntl.LOCK_UN)       # free: no one is migrating this run now
                continue
            except BlockingIOError:
                pass
            finally:
                os.close(fd)
            try:
                pid = int(json.loads(lock.read_text() or "{}").get("pid", 0))
            except (OSError, ValueError):
                continue
            if pid and pid != os.getpid():
                out.append((pid, lock.stem))
        return out

    def run(self) -> None:
        while len(self.killed) < self.times and not self.stop.wait(self.every):
            for pid, key in self._held():
                if any(pid == p for p, _ in self.killed):
                    continue        # killed already: its claim is freed once the kernel has finished with it
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    continue
                self.killed.append((pid, key))
                break


def test_200_runs_with_workers_killed_mid_run(cluster, env):
    src = _source(env / "src", runs=200, steps=60)
    dst = env / "tb"
    killer = Killer(env / "state", times=3, every=0.1)   # three kills before an idle machine is done
    killer.start()
    try:
        res = migrate(src, f"tensorboard:{dst}", engine="ray", progress=False, batch_runs=10)
    finally:
        killer.stop.set()
        killer.join()
    assert len(killer.killed) == 3, f"only {len(killer.killed)} workers were killed mid-run (the runs went too fast)"
    assert len({pid for pid, _ in killer.killed}) == 3
    assert res.ok, summary(res)
    assert len(res.runs) == 200 and not any(r.already_done for r in res.runs)
    # every source record counted once: written by an attempt, or found in the destination after a kill
    assert sum(r.records + r.skipped_records for r in res.runs) == 200 * 60, summary(res)
    assert sum(r.points for r in res.runs) <= 200 * 60 * len(KEYS)
    runs = tensorboard_runs(dst)
    assert_every_point_once(runs, [f"run-{i:03d}" for i in range(200)], steps=60, keys=len(KEYS))
    assert not list(dst.rglob("*.tmp")), "a temporary header file was left in a run folder"
    # the runs being migrated when their workers died are complete too (their ledger says so)
    for _pid, key in killer.killed:
        ledger = json.loads((env / "state" / "migrations" / f"{key}.json").read_text())
        assert ledger["complete"] and ledger["records_written"] == 60

    again = migrate(src, f"tensorboard:{dst}", engine="ray", progress=False)
    assert again.ok and all(r.already_done for r in again.runs) and sum(r.points for r in again.runs) == 0
    assert_every_point_once(tensorboard_runs(dst), [f"run-{i:03d}" for i in range(200)], steps=60, keys=len(KEYS))


def test_mlflow_from_two_workers_at_once(cluster, env):
    src = _source(env / "src", runs=10, steps=30)
    dst = location("mlflow", env / "dst", experiment="moved")
    res = migrate(src, dst, source="verl", engine="ray", progress=False, batch_runs=2)
    assert res.ok, summary(res)
    assert sum(r.points for r in res.runs) == 10 * 30 * len(KEYS)
    runs = mlflow_runs(dst[len("mlflow:"):].split("?")[0])
    # three veRL keys and two of the user's are too few to name the framework (detection says unknown and keeps
    # the names), so the run's source is given; MLflow stores these five as they are
    canon = {"actor/pg_loss": "loss/policy", "critic/score/mean": "reward/score/mean",
             "response_length/mean": "response/length/mean"}
    assert {k for r in runs.values() for k in r} == {canon.get(k, k) for k in KEYS}
    assert_every_point_once(runs, [f"run-{i:03d}" for i in range(10)], steps=30, keys=len(KEYS))


def test_one_rate_limit_shared_by_every_task(cluster, env):
    from trackbridge.migrate.bulk import NAMESPACE, LimiterActor, limiter_name
    src = _source(env / "src", runs=24, steps=10)
    dst = f"jsonl:{env / 'dst'}"
    rate = 12.0
    # another user of the same destination (a second migration would do the same): joining keeps the actor alive
    # after this migration leaves it, so that its bookings can be read
    actor = ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=-1)(LimiterActor)
    handle = actor.options(name=limiter_name(dst), namespace=NAMESPACE, get_if_exists=True).remote(rate, None)
    assert tuple(ray.get(handle.join.remote())) == (rate, None)
    try:
        t0 = time.monotonic()
        res = migrate(src, dst, engine="ray", progress=False, batch_runs=3, requests_per_s=rate)
        took = time.monotonic() - t0
        assert res.ok, summary(res)
        history = ray.get(handle.history.remote())
    finally:
        ray.kill(handle)
    # each run: one request to open it, one to write its only batch; every one booked with the shared actor
    assert sum(h[1] for h in history) == 24 * 2
    # the bucket lets ``burst`` (1 s) worth go at once, then ``rate`` per second, whatever the number of tasks
    assert max_in_window(history, 1.0) <= 2 * rate + 1
    least = (48 - rate - 1) / rate - 1e-3         # the bucket's own arithmetic lands on the bound (2.91666 s)
    assert max(h[0] for h in history) - min(h[0] for h in history) >= least
    assert took >= least
    got = {p.stem for p in (env / "dst").glob("*.jsonl")}
    assert len(got) == 24


def test_the_selection_holds_in_the_ray_workers(cluster, env):
    # a Ray task opens the source again: the runs and metrics --runs/--metrics picked are what its workers write
    src = _source(env / "src", runs=6, steps=5)
    dst = f"jsonl:{env / 'dst'}"
    envv = {"TRACKBRIDGE_STATE_DIR": str(env / "state")}
    p = run_cli("migrate", src, dst, "--engine", "ray", "--ray-address", cluster, "--quiet", "--from", "verl",
                "--runs", "run-00[135]", "--metrics", "loss/*", "--metrics", "custom/a", env_extra=envv)
    assert p.returncode == 0, p.stderr
    import trackbridge
    df = trackbridge.read(dst).to_pandas()
    assert sorted(set(df["run"])) == ["run-001", "run-003", "run-005"]
    assert set(df["key"]) == {"loss/policy", "custom/a"} and len(df) == 3 * 5 * 2


def test_cli_engine_ray_reaches_the_cluster(cluster, env):
    src = _source(env / "src", runs=6, steps=5)
    dst = f"jsonl:{env / 'dst'}"
    envv = {"TRACKBRIDGE_STATE_DIR": str(env / "state")}
    p = run_cli("migrate", src, dst, "--engine", "ray", "--ray-address", cluster, "--quiet", env_extra=envv)
    assert p.returncode == 0, p.stderr
    assert "Migrated: 6 run(s), 30 records, 150 points" in p.stderr
    from trackbridge.stream import read_stream, scan_stream
    files = sorted((env / "dst").glob("*.jsonl"))
    assert len(files) == 6
    for f in files:         # one header, five records, each step once
        assert sum(1 for line in f.read_text().splitlines() if '"type":"run"' in line) == 1
        assert scan_stream(f).records == 5 and sorted(r.step for _, r in read_stream(f)) == list(range(5))
    p = run_cli("migrate", src, dst, "--engine", "ray", "--ray-address", cluster, "--quiet", env_extra=envv)
    assert p.returncode == 0 and "already migrated earlier" in p.stderr, p.stderr


def test_the_driver_killed_then_the_same_command_continues_its_plan(cluster, env):
    """The driver (the command) is SIGKILLed after some runs are done: Ray ends its tasks with it. The same command
    again continues the plan: every run once, the summary counting the whole plan."""
    src = _source(env / "src", runs=40, steps=60)
    dst = f"tensorboard:{env / 'tb'}"
    envv = {**child_env(), "TRACKBRIDGE_STATE_DIR": str(env / "state")}
    args = [PY, "-m", "trackbridge", "migrate", src, dst, "--engine", "ray", "--ray-address", cluster,
            "--batch-runs", "4"]
    proc = subprocess.Popen(args + ["--quiet"], env=envv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ledgers = env / "state" / "migrations"
    deadline = time.monotonic() + 120
    done = 0
    while time.monotonic() < deadline and proc.poll() is None:
        done = sum(1 for f in ledgers.glob("*.json") if json.loads(f.read_text() or "{}").get("complete")) \
            if ledgers.is_dir() else 0
        if done >= 8:
            break
        time.sleep(0.05)
    assert proc.poll() is None and done >= 8, "the first command ended before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    p = subprocess.run(args, env=envv, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert "continuing plan" in p.stderr and "finished by an earlier attempt" in p.stderr
    assert "Migrated: 40 run(s)" in p.stderr and "already migrated earlier" not in p.stderr
    assert_every_point_once(tensorboard_runs(env / "tb"), [f"run-{i:03d}" for i in range(40)], steps=60,
                            keys=len(KEYS))


def test_engine_ray_without_ray_is_a_usage_error(env):
    src = _source(env / "src", runs=1, steps=2)
    code = ("import sys; sys.modules['ray'] = None; from trackbridge.cli import main; "
            f"sys.exit(main(['migrate', {src!r}, 'jsonl:{env / 'dst'}', '--engine', 'ray']))")
    p = subprocess.run([PY, "-c", code], env={**child_env(), "TRACKBRIDGE_STATE_DIR": str(env / "state")},
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stderr
    assert "pip install 'trackbridge[ray]'" in p.stderr and "Traceback" not in p.stderr
    assert not (env / "dst").exists()
