"""The fault matrix for the four trackers of issue 22 (issue 31, item 1): each tracker's OWN output folder on a small
file system that fills up and is freed mid-run, and the run killed mid-write and resumed, in both writer modes. Each
tracker is read back with its own tools, not trackbridge's readers:

* SwanLab: swanlab's ``DataStoreReader`` (its ``scan()``, which raises on a torn or corrupt record) and its protobuf
  ``Record`` class;
* ClearML: ``Metrics.report_offline_session`` (what ``Task.import_offline_session`` runs) over the session folder,
  into a session object that keeps the batches it is sent (no server), and the line it cannot parse counted;
* Comet: every line of the offline zip's ``messages.json`` parsed and checked against comet_ml's own JSON Schemas (what
  ``comet upload`` checks), a line that does not parse counted as torn;
* neptune-exporter Parquet: pyarrow over every part (a part pyarrow cannot read counted as torn).

Counted: points lost, doubled, torn; and what the logger said: ``recovered`` only where the tracker holds every
point, else a pending note saying how many records it lacks.

The disk-full cells (tests/_support/smallfs.py) log 3,000 steps of 20 keys (60,000 points, the issue's figure) with
the tracker's folder on a tmpfs of its own; the spool is on the ordinary disk. The disk is filled once the tracker
holds about a third of the run, kept full until the tracker has failed and a few hundred more steps are logged, then
freed; the run goes on and ends. The kill cells SIGKILL the training process group (the writer process with it)
while the tracker writes, then resume the run and log the rest.
"""
from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from typing import Any

import pytest

from _support import ROOT
from _support.lines import Lines
from _support.readback import exact, total
from _support.smallfs import small_fs_problem, start_in_small_fs

WRITERS = ["process", "thread"]
TRACKERS = ["swanlab", "clearml", "comet", "neptune"]
KEYS = [f"custom/k{j:02d}" for j in range(20)]
N = 3000                            # steps: 60,000 points

needs_small_fs = pytest.mark.skipif(small_fs_problem() is not None, reason=f"no private tmpfs: {small_fs_problem()}")

Points = dict[str, collections.Counter]


# -- each tracker read back with its own tools -------------------------------------------------------------------
def _points(pairs: list[tuple[str, int]]) -> Points:
    out: Points = collections.defaultdict(collections.Counter)
    for key, step in pairs:
        out[key][int(step)] += 1
    return out


def swanlab_read(root: Path) -> tuple[Points, int]:
    """SwanLab's own reader over the run file: its scalar points, and 1 when ``scan()`` met a torn or corrupt
    record (it raises there; its iterator would stop without a word)."""
    from swanlab.proto.swanlab.record.v1 import record_pb2
    from swanlab.sdk.internal.core_python.store import DataStoreReader

    (path,) = sorted(root.glob("run-*/run-*.swanlab"))
    reader = DataStoreReader()
    reader.open(path)
    pairs, torn = [], 0
    try:
        while True:
            try:
                data = reader.scan()
            except Exception:  # noqa: BLE001 - DataStoreError, or the AssertionError of a short header
                torn = 1
                break
            if data is None:
                break
            rec = record_pb2.Record()
            rec.ParseFromString(data)
            if rec.WhichOneof("record_type") == "scalar":
                pairs.append((rec.scalar.key, rec.scalar.step))
    finally:
        reader.close()
    return _points(pairs), torn


class _Sent:
    """What ``report_offline_session`` sends: a session that keeps each batch request and answers ok."""

    class _Ok:
        meta = None

        @staticmethod
        def ok() -> bool:
            return True

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def send(self, request: Any) -> Any:
        self.events.extend(request.requests)
        return self._Ok()


def clearml_read(root: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Points, int]:
    """ClearML's own importer of an offline session (``Metrics.report_offline_session``) over the one session under
    ``root``: the scalar events it sends, and how many lines it could not parse (it warns ``Failed reporting metric``
    for each; an unparseable first line makes it raise)."""
    from clearml.backend_interface.metrics import interface

    (folder,) = [p for p in sorted(root.glob("offline-*")) if p.is_dir()]
    task_id = json.loads((folder / "task.json").read_text())["id"]
    said: list[str] = []
    monkeypatch.setattr(interface, "warning", lambda msg, *a, **k: said.append(str(msg)))
    sent = _Sent()
    torn = 0
    try:
        interface.Metrics.report_offline_session(type("T", (), {"id": "imported"})(), str(folder),
                                                 remote_url="file:///nowhere", only_with_id=task_id, session=sent)
    except UnboundLocalError:           # its first line did not parse
        torn += 1
    torn += sum("Failed reporting metric" in m for m in said)
    pairs = []
    for ev in sent.events:
        if ev["type"] == "training_stats_scalar":
            key = ev["metric"] if ev["metric"] == ev["variant"] else f"{ev['metric']}/{ev['variant']}"
            pairs.append((key, ev["iter"]))
    return _points(pairs), torn


def comet_read(root: Path) -> tuple[Points, int]:
    """Every message of the one offline zip, checked against comet_ml's schemas (``comet upload``'s check): its
    metric points, and how many lines are not whole JSON messages."""
    from _support.tracker_files import _comet_validators
    val = _comet_validators()
    (path,) = sorted(root.glob("*.zip"))
    with zipfile.ZipFile(path) as z:
        val["experiment"].validate(json.loads(z.read("experiment.json")))
        lines = z.read("messages.json").decode("utf-8", errors="replace").splitlines()
    pairs, torn = [], 0
    for line in lines:
        try:
            msg = json.loads(line)
        except json.JSONDecodeError:
            torn += 1
            continue
        val[msg["type"]].validate(msg["payload"])
        if msg["type"] == "metric_msg":
            m = msg["payload"]["metric"]
            pairs.append((m["metricName"], m["step"]))
    return _points(pairs), torn


def neptune_read(root: Path) -> tuple[Points, int]:
    """pyarrow over every part file of the one run: its series points, and how many parts pyarrow cannot read."""
    import pyarrow.parquet as pq
    pairs, torn = [], 0
    parts = sorted(root.glob("*/*_part_*.parquet"))
    assert parts, f"no part under {root}"
    for part in parts:
        try:
            t = pq.read_table(part, columns=["attribute_path", "attribute_type", "step"])
        except Exception:  # noqa: BLE001 - a part that is no Parquet file
            torn += 1
            continue
        for path, typ, step in zip(*(t.column(i).to_pylist() for i in range(3))):
            if typ.endswith("_series"):
                pairs.append((path, int(step)))
    return _points(pairs), torn


def first_five_read(kind: str, root: Path) -> tuple[Points, int]:
    """The first five trackers read back as the fault matrix reads them (TensorBoard's event loader, MlflowClient,
    sqlite3 on Trackio's database, wandb's own protobuf records of the offline ``.wandb`` file, the JSON lines);
    torn: lines of the jsonl file that are not whole JSON objects."""
    from _support import readback as rb
    if kind == "tensorboard":
        return rb.tensorboard_points(root), 0
    if kind == "mlflow":
        return rb.mlflow_points(f"sqlite:///{root / 'ml.db'}", "own"), 0
    if kind == "trackio":
        return rb.trackio_points(root / "own.db", "own"), 0
    if kind == "wandb":
        torn = [0]
        return rb.wandb_points(root, "own", torn), torn[0]
    points, bad = rb.spool_points(root / "own.jsonl")
    return points, len(bad)


def read_tracker(kind: str, root: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Points, int]:
    if kind in FIRST_FIVE or kind == "wandb":
        return first_five_read(kind, root)
    if kind == "swanlab":
        return swanlab_read(root)
    if kind == "clearml":
        return clearml_read(root, monkeypatch)
    if kind == "comet":
        return comet_read(root)
    return neptune_read(root)


def doubled_and_lost(points: Points, steps: range) -> tuple[int, int]:
    want = set(steps)
    doubled = sum(n - 1 for key in KEYS for s, n in points.get(key, {}).items() if n > 1)
    lost = sum(len(want - set(points.get(key, {}))) for key in KEYS)
    return doubled, lost


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(ROOT), WANDB_MODE="offline", WANDB_SILENT="true")


def _pending(spool: Path) -> dict[str, Any] | None:
    notes = sorted(spool.glob("*.pending.json"))
    return json.loads(notes[0].read_text()) if notes else None


# -- disk full, then freed -----------------------------------------------------------------------------------------
FULL = r"""
import json, os, shutil, sys, time, warnings
import trackbridge
kind, own, out, spool, writer, n = sys.argv[1:7]
n = int(n)
os.makedirs(f"{own}/{kind}", exist_ok=True)
sink = {"mlflow": f"mlflow:sqlite:///{own}/mlflow/ml.db?experiment=own"}.get(kind, f"{kind}:{own}/{kind}")
keys = [f"custom/k{j:02d}" for j in range(20)]
row = lambda i: {k: float(i) + j / 100 for j, k in enumerate(keys)}

def state():
    return run.status["sinks"][1]

def fill():
    fd = os.open(os.path.join(own, "filler"), os.O_WRONLY | os.O_CREAT)
    try:
        while True:
            os.write(fd, b"x" * 4096)
    except OSError:
        os.close(fd)

with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    run = trackbridge.init(project="own", name="own", run_id="own", source="canonical", spool=spool,
                           sinks=[sink],
                           options=trackbridge.LoggerOptions(writer=writer, flush_interval=0.2, batch_size=200,
                                                             retry_interval=0.5, finish_timeout=120))
    i = 0
    while i < n // 3:
        run.log(row(i), step=i); i += 1
        if i % 100 == 0:
            time.sleep(0.02)
    end = time.monotonic() + 60
    while state()["written"] + state()["caught_up"] < i and time.monotonic() < end:
        time.sleep(0.02)
    fill()                                          # the tracker's disk fills up ...
    end = time.monotonic() + 60
    while state()["state"] != "failed" and time.monotonic() < end and i < n - 400:
        run.log(row(i), step=i); i += 1
        time.sleep(0.002)
    failed_at = i if state()["state"] == "failed" else None
    for _ in range(200):
        run.log(row(i), step=i); i += 1
    time.sleep(0.3)
    os.unlink(os.path.join(own, "filler"))          # ... and is freed mid-run
    while i < n:
        run.log(row(i), step=i); i += 1
        if i % 100 == 0:
            time.sleep(0.02)
    st = run.finish()
json.dump({"n": i, "failed_at": failed_at, "status": st, "warnings": [str(w.message) for w in caught]},
          open(f"{out}/result.json", "w"))
shutil.copytree(f"{own}/{kind}", f"{out}/copy", symlinks=True)      # wandb's latest-run is a link
"""

SIZE_KB = {"swanlab": 16_384, "clearml": 32_768, "comet": 32_768, "neptune": 16_384, "jsonl": 16_384,
           "tensorboard": 16_384, "mlflow": 65_536, "trackio": 32_768, "wandb": 32_768}
#: the first five trackers (issue 12's matrix had their spool's disk full, not their own): read with their own tools;
#: wandb has a test of its own below (its writer cannot recover)
FIRST_FIVE = ["jsonl", "tensorboard", "mlflow", "trackio"]


@needs_small_fs
@pytest.mark.parametrize("writer", WRITERS)
@pytest.mark.parametrize("kind", TRACKERS + FIRST_FIVE)
def test_own_disk_full_then_freed(tmp_path, monkeypatch, fault_cell, kind, writer):
    """The tracker's own folder fills up mid-run and is freed: once it has room again the tracker holds every point
    once, no torn record or line, and the logger says ``recovered`` (no pending note)."""
    own, out, spool = tmp_path / "own", tmp_path / "out", tmp_path / "spool"
    out.mkdir()
    script = tmp_path / "full.py"
    script.write_text(FULL)
    proc = start_in_small_fs(own, SIZE_KB[kind], script, kind, own, out, spool, writer, N, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    log, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, log[-3000:]
    result = json.loads((out / "result.json").read_text())
    n = result["n"]
    assert n == N and result["failed_at"] is not None, ("the full disk never failed the tracker", log[-3000:])
    points, torn = read_tracker(kind, out / "copy", monkeypatch)
    doubled, lost = doubled_and_lost(points, range(n))
    fault_cell(f"its own disk full, then freed mid-run (writer={writer})", kind, n * len(KEYS),
               total({k: points.get(k, collections.Counter()) for k in KEYS}))
    note = _pending(spool)
    recovered = "recovered" in log
    assert (doubled, lost, torn) == (0, 0, 0), dict(doubled=doubled, lost=lost, torn=torn, recovered=recovered,
                                                    pending=note, log=log[-2000:])
    assert exact(points, KEYS, range(n)) is None, exact(points, KEYS, range(n))
    assert recovered and note is None, (note, log[-2000:])
    assert result["status"]["sinks"][1]["state"] == "closed", result["status"]["sinks"][1]
    assert not [p.name for p in (out / "copy").rglob("*.tmp")], "a temporary file left in the tracker's folder"


@needs_small_fs
@pytest.mark.parametrize("writer", WRITERS)
def test_wandb_own_disk_full_is_said_exactly_and_replay_completes_it(tmp_path, monkeypatch, fault_cell, writer):
    """wandb cannot recover from its own disk filling up: wandb-core's transaction log fails every record after the
    first failed write, even once there is room, and its SDK raises nothing (``writer: failed to save record`` in
    the run's debug-internal.log). The logger must not call that recovered: the sink says so at close, finish()
    counts what wandb lacks against what its run file holds (read with wandb's own protobuf records), nothing is
    lost from the spool, and ``trackbridge replay`` then gives wandb exactly the rest (a second offline folder of
    the same run id, which ``wandb sync`` merges)."""
    own, out, spool = tmp_path / "own", tmp_path / "out", tmp_path / "spool"
    out.mkdir()
    script = tmp_path / "full.py"
    script.write_text(FULL)
    proc = start_in_small_fs(own, SIZE_KB["wandb"], script, "wandb", own, out, spool, writer, N,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    log, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, log[-3000:]
    result = json.loads((out / "result.json").read_text())
    assert result["n"] == N
    points, torn = read_tracker("wandb", out / "copy", monkeypatch)
    held = total({k: points.get(k, collections.Counter()) for k in KEYS})
    assert sum(n - 1 for key in KEYS for n in points.get(key, {}).values() if n > 1) == 0
    assert held < N * len(KEYS), "wandb kept every point: the disk never filled under it"
    said = "\n".join(result["warnings"]) + log
    assert "recovered" not in said and "failed to save record" in said, said[-3000:]
    note = _pending(spool)
    assert note is not None, said[-3000:]
    (entry,) = note["sinks"]
    assert entry["counted"] == "read back from the tracker", entry
    assert (entry["points_left"], entry["points_held"]) == (N * len(KEYS) - held, held), entry
    # replay into the folder as it was left (copied out of the small file system)
    env = _env()
    p = subprocess.run([sys.executable, "-m", "trackbridge", "replay", str(spool / "own.jsonl"), "--to",
                        f"wandb:{out / 'copy'}?mode=offline"], capture_output=True, text=True, env=env, timeout=300,
                       cwd=str(ROOT))
    assert p.returncode == 0, p.stderr[-3000:]
    after, _torn = read_tracker("wandb", out / "copy", monkeypatch)
    doubled, lost = doubled_and_lost(after, range(N))
    fault_cell(f"its own disk full, then freed mid-run; then trackbridge replay (writer={writer})", "wandb",
               N * len(KEYS), total({k: after.get(k, collections.Counter()) for k in KEYS}))
    assert (doubled, lost) == (0, 0), dict(doubled=doubled, lost=lost)


# -- killed mid-write, then resumed ---------------------------------------------------------------------------------
KILL = r"""
import sys, time
import trackbridge
kind, where, spool, writer, resume, n = sys.argv[1:7]
keys = [f"custom/k{j:02d}" for j in range(20)]
run = trackbridge.init(project="own", name="own", run_id="own", source="canonical", spool=spool, resume=resume == "1",
                       sinks=[f"{kind}:{where}"],
                       options=trackbridge.LoggerOptions(writer=writer, flush_interval=0.2, batch_size=500))
print("writer", (run.status["writer"] or {}).get("pid", 0), flush=True)
for i in range(int(n)):
    # the run's own step counter: resumed, it starts one past the highest step the spool or the tracker holds
    run.log({k: float(i) + j / 100 for j, k in enumerate(keys)})
    if i == 300:
        print("logging", flush=True)
    if i % 20 == 0:
        time.sleep(0.005)
run.finish()
first = run._next_step - int(n)     # after finish(): every record numbered
print("finished", first, flush=True)
"""


def _size(where: Path) -> int:
    total = 0
    for p in where.rglob("*"):
        try:
            total += p.stat().st_size if p.is_file() else 0
        except OSError:         # a temporary file moved into place meanwhile
            pass
    return total


def _held_steps(spool: Path) -> int:
    from trackbridge.sync.replay import iter_spool
    steps = [rec.step for _s, rec in iter_spool(spool / "own.jsonl")]
    assert steps == list(range(len(steps))), "the spool holds a prefix of the run"
    return len(steps)


@pytest.mark.parametrize("writer", WRITERS)
@pytest.mark.parametrize("kind", TRACKERS)
def test_killed_mid_write_then_resumed(tmp_path, monkeypatch, fault_cell, kind, writer):
    """SIGKILL of the training process group (its writer process with it) while the tracker writes, then the run
    resumed (its step counter one past what the spool or the tracker holds) and 1,000 steps more logged: the tracker
    holds every step once, the ones only the spool had included, and no torn record or line."""
    where, spool = tmp_path / kind, tmp_path / "spool"
    script = tmp_path / "kill.py"
    script.write_text(KILL)
    proc = subprocess.Popen([sys.executable, str(script), kind, where, spool, writer, "0", str(4 * N)],
                            stdout=subprocess.PIPE, text=True, env=_env(), start_new_session=True)
    try:
        lines = Lines(proc.stdout)
        assert lines.next(300).startswith("writer")
        assert lines.next(300) == "logging"
        end, sizes = time.monotonic() + 120, {_size(where)}
        while len(sizes) < 4:                           # the tracker has written three times since: it is writing
            assert time.monotonic() < end and proc.poll() is None, "the tracker never wrote"
            time.sleep(0.01)
            sizes.add(_size(where))
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    spooled = _held_steps(spool)
    more = N // 3
    r = subprocess.run([sys.executable, str(script), kind, where, spool, writer, "1", str(more)], capture_output=True,
                       text=True, env=_env(), timeout=300)
    assert r.returncode == 0 and "finished" in r.stdout, r.stderr[-3000:]
    first = int(r.stdout.split("finished")[1].split()[0])
    assert first >= spooled > 0, (first, spooled)
    n = first + more
    points, torn = read_tracker(kind, where, monkeypatch)
    doubled, lost = doubled_and_lost(points, range(n))
    fault_cell(f"killed mid-write, then resumed (writer={writer})", kind, n * len(KEYS),
               total({k: points.get(k, collections.Counter()) for k in KEYS}))
    assert (doubled, lost, torn) == (0, 0, 0), dict(doubled=doubled, lost=lost, torn=torn, log=r.stderr[-2000:])
    assert exact(points, KEYS, range(n)) is None, exact(points, KEYS, range(n))
    assert _pending(spool) is None, _pending(spool)
    assert not [p.name for p in where.rglob("*.tmp")], "a temporary file left in the tracker's folder"


# -- the sink alone: a batch that fails on the full disk, tried again while full, then once there is room ----------
RETRY = r"""
import json, os, shutil, sys
from trackbridge.record import Record, RunInfo
from trackbridge.trackers import make_sink
kind, own, out = sys.argv[1:4]
keys = [f"custom/k{j:02d}" for j in range(20)]
batch = lambda lo, hi: [Record(i, 1763700000.0 + i, {k: float(i) + j / 100 for j, k in enumerate(keys)})
                        for i in range(lo, hi)]
sink = make_sink(f"{kind}:{own}/{kind}")
sink.open(RunInfo(name="own", project="own", run_id="own"))
sink.write(batch(0, 100))
fd = os.open(os.path.join(own, "filler"), os.O_WRONLY | os.O_CREAT)
try:
    while True:
        os.write(fd, b"x" * 4096)
except OSError:
    os.close(fd)
failed = 0
for _ in range(3):                  # the logger's retries, the disk still full
    try:
        sink.write(batch(100, 400))
    except Exception as exc:
        failed += 1
        last = f"{type(exc).__name__}: {exc}"
os.unlink(os.path.join(own, "filler"))
sink.write(batch(100, 400))         # room again: the batch once
sink.write(batch(400, 500))
sink.close()
json.dump({"failed": failed, "last": last}, open(f"{out}/result.json", "w"))
shutil.copytree(f"{own}/{kind}", f"{out}/copy", symlinks=True)      # wandb's latest-run is a link
"""


@needs_small_fs
@pytest.mark.parametrize("kind", TRACKERS)
def test_a_batch_failed_on_a_full_disk_is_written_once_when_there_is_room(tmp_path, monkeypatch, kind):
    """Without the logger's timing: the sink's write of a batch fails three times on its full disk (each attempt
    cut short part-way), then succeeds once the disk has room: the tracker holds every point once, no torn record."""
    own, out = tmp_path / "own", tmp_path / "out"
    out.mkdir()
    script = tmp_path / "retry.py"
    script.write_text(RETRY)
    proc = start_in_small_fs(own, 2048, script, kind, own, out, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True)
    log, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, log[-3000:]
    result = json.loads((out / "result.json").read_text())
    assert result["failed"] == 3 and "No space left on device" in result["last"], result
    points, torn = read_tracker(kind, out / "copy", monkeypatch)
    assert (doubled_and_lost(points, range(500)), torn) == ((0, 0), 0)
    assert exact(points, KEYS, range(500)) is None, exact(points, KEYS, range(500))
