"""Benchmark: ``trackbridge migrate`` of a big TensorBoard run vs the obvious hand-written way.

Workload (default): one TensorBoard run of 500 tags x 2,000 steps = 1,000,000 scalar points laid out as trainers
write them (``--layout per-value``, the default: one event per value, as ``SummaryWriter.add_scalar`` in TRL,
transformers and torch does, each with its own wall time, no trackbridge run information); ``--layout per-step`` writes
trackbridge's own files (one event per step, several times faster to read). It is migrated

* into a new TensorBoard folder: ``migrate("tensorboard:SRC", "tensorboard:DST")`` vs tbparse into pandas, then
  tensorboardX ``add_scalar`` per value;
* into MLflow (SQLite): ``migrate("tensorboard:SRC", "mlflow:sqlite:///DB")`` vs tbparse into pandas, then
  ``MlflowClient.log_batch`` in chunks of 1,000; and, as the floor, ``log_batch`` alone of the same points
  (already in memory, in step order as a live logger sends them), i.e. MLflow's own write speed. Note: tbparse
  returns points grouped by tag, which is MLflow's fastest order (each log_batch touches one key); trackbridge
  streams step by step and sorts each batch of ~40 steps by key (1.6x the step-order floor);
* out of MLflow (``--only mlflow-wandb``): the run, first migrated into an MLflow SQLite store (not measured), into
  wandb (offline): ``migrate("mlflow:sqlite:///DB", "wandb:DIR")`` vs the hand-written way: ``MlflowClient``
  ``get_metric_history`` per key, rows gathered per step, ``wandb.log(row, step=step)``. ``--baseline-root DIR``
  also measures trackbridge from another checkout (e.g. ``git archive`` of a commit before a reader change), so
  the ratio before and after is printed side by side.

Every measurement runs in its own child process (fresh imports, its own peak memory): wall time from the start of
the work (after imports, store creation excluded for all alike) to the end, points/s, and peak memory
(``ru_maxrss``: the whole process, and above the process's size after its imports). trackbridge's peak memory is
also measured on a run of a quarter of the steps: it must not grow with the run's length (streaming).
trackbridge migrates with canonical names (detection and translation included).

    .venv/bin/python benchmarks/bench_migrate.py [--tags 500] [--steps 2000] [--only tb|mlflow|mlflow-wandb]
        [--keep DIR] [--baseline-root DIR]

Prints a markdown table and the ratios against the targets (TensorBoard >= 5x, MLflow >= 1.5x).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, os.environ.get("BENCH_ROOT") or str(ROOT))     # a child may measure another checkout

VERL_NAMES = ["actor/pg_loss", "actor/entropy", "actor/ppo_kl", "actor/grad_norm", "actor/pg_clipfrac",
              "critic/score/mean", "critic/score/max", "critic/score/min", "critic/rewards/mean",
              "critic/advantages/mean", "response_length/mean", "response_length/max", "prompt_length/mean",
              "timing_s/gen", "timing_s/step", "perf/throughput", "val-core/openai/gsm8k/acc/mean@1"]


def tag_names(n: int) -> list[str]:
    names = VERL_NAMES[:n]
    i = 0
    while len(names) < n:
        names.append(f"custom/group_{i // 20:02d}/metric_{i % 20:02d}")
        i += 1
    return names


def make_plain_source(folder: Path, tags: int, steps: int) -> None:
    """A TensorBoard folder as trainers leave it: one ``Event`` per scalar value (``add_scalar``), each with its own
    wall time, and no trackbridge run information. Written with TensorBoard's own protobufs and the standard TFRecord
    framing (faster than calling tensorboardX a million times; the files are the same)."""
    from tensorboard.compat.proto import event_pb2

    from trackbridge.trackers.tensorboard.events import frame

    names = tag_names(tags)
    folder.mkdir(parents=True, exist_ok=True)
    t0 = 1_763_700_000.0
    with open(folder / f"events.out.tfevents.{int(t0)}.bench", "wb") as fh:
        fh.write(frame(event_pb2.Event(wall_time=t0, file_version="brain.Event:2").SerializeToString()))
        for s in range(steps):
            chunk = []
            for i, n in enumerate(names):
                ev = event_pb2.Event(wall_time=t0 + s * 0.25 + i * 1e-6, step=s)
                ev.summary.value.add(tag=n, simple_value=(s * tags + i) * 1e-4)
                chunk.append(frame(ev.SerializeToString()))
            fh.write(b"".join(chunk))


def make_source(folder: Path, tags: int, steps: int, layout: str = "per-value") -> None:
    if layout == "per-value":
        make_plain_source(folder, tags, steps)
        return
    from trackbridge.record import Record, RunInfo
    from trackbridge.trackers.tensorboard.sink import TensorBoardSink

    names = tag_names(tags)
    sink = TensorBoardSink(str(folder))
    sink.open(RunInfo(name="big", run_id="big", project="bench", config={"seed": 1}))
    t0 = 1_763_700_000.0
    batch = []
    for s in range(steps):
        batch.append(Record(s, t0 + s * 0.25, {n: (s * tags + i) * 1e-4 for i, n in enumerate(names)}))
        if len(batch) >= 64:
            sink.write(batch)
            batch = []
    if batch:
        sink.write(batch)
    sink.close()


# -- the measurements, each run in a child process ------------------------------------------------------------
def _rss_mb() -> float:
    import resource
    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kb / 1024.0 if sys.platform != "darwin" else kb / 1024.0 / 1024.0


def m_trackbridge(src: str, dst: str) -> dict:
    from trackbridge.migrate import migrate
    if dst.startswith("mlflow:"):
        from trackbridge.trackers.mlflow.client import make_client
        make_client(dst[len("mlflow:"):]).search_experiments()    # store creation is not migration
    import trackbridge.pipeline
    import trackbridge.trackers.tensorboard.sink  # noqa: F401,E401
    from trackbridge.schema.loader import load_registry
    load_registry()
    base = _rss_mb()
    t = time.perf_counter()
    res = migrate(src, dst, names="canonical", progress=False)
    el = time.perf_counter() - t
    assert res.ok, [r.error for r in res.runs]
    return {"seconds": el, "points": sum(r.points for r in res.runs), "rss": _rss_mb(), "base": base}


def _read_tbparse(folder: str):
    from tbparse import SummaryReader
    return SummaryReader(folder, pivot=False, extra_columns={"wall_time"}).scalars


def m_hand_tb(src_folder: str, dst_folder: str) -> dict:
    import pandas  # noqa: F401
    import tbparse  # noqa: F401
    from tensorboardX import SummaryWriter
    base = _rss_mb()
    t = time.perf_counter()
    df = _read_tbparse(src_folder)
    w = SummaryWriter(dst_folder)
    n = 0
    for tag, step, value, wall in zip(df["tag"].tolist(), df["step"].tolist(), df["value"].tolist(),
                                      df["wall_time"].tolist()):
        w.add_scalar(tag, value, step, walltime=wall)
        n += 1
    w.close()
    return {"seconds": time.perf_counter() - t, "points": n, "rss": _rss_mb(), "base": base}


def m_hand_mlflow(src_folder: str, db: str) -> dict:
    import pandas  # noqa: F401
    import tbparse  # noqa: F401
    from mlflow.entities import Metric

    from trackbridge.trackers.mlflow.client import make_client
    client = make_client(f"sqlite:///{db}")
    client.search_experiments()
    base = _rss_mb()
    t = time.perf_counter()
    df = _read_tbparse(src_folder)
    exp = client.create_experiment("hand")
    run = client.create_run(exp, run_name="big").info.run_id
    n = _log_in_chunks(client, run, (Metric(tag.replace("@", "_"), float(value), int(wall * 1000), int(step))
                                     for tag, step, value, wall in zip(df["tag"].tolist(), df["step"].tolist(),
                                                                       df["value"].tolist(), df["wall_time"].tolist())))
    client.set_terminated(run)
    return {"seconds": time.perf_counter() - t, "points": n, "rss": _rss_mb(), "base": base}


def _log_in_chunks(client, run: str, metrics) -> int:
    """``MlflowClient.log_batch`` in chunks of 1,000 (its limit per call); returns the number of points."""
    batch, n = [], 0
    for m in metrics:
        batch.append(m)
        if len(batch) == 1000:
            client.log_batch(run, metrics=batch)
            n, batch = n + len(batch), []
    if batch:
        client.log_batch(run, metrics=batch)
        n += len(batch)
    return n


def m_mlflow_floor(tags: int, steps: int, db: str) -> dict:
    from mlflow.entities import Metric

    from trackbridge.trackers.mlflow.client import make_client
    client = make_client(f"sqlite:///{db}")
    client.search_experiments()
    names = [n.replace("@", "_") for n in tag_names(tags)]
    exp = client.create_experiment("floor")
    run = client.create_run(exp, run_name="floor").info.run_id
    base = _rss_mb()
    t = time.perf_counter()
    t0 = 1_763_700_000.0
    n = _log_in_chunks(client, run, (Metric(name, (s * tags + i) * 1e-4, int((t0 + s * 0.25) * 1000), s)
                                     for s in range(steps) for i, name in enumerate(names)))
    return {"seconds": time.perf_counter() - t, "points": n, "rss": _rss_mb(), "base": base}


def m_hand_wandb(db: str, out: str) -> dict:
    """The hand-written way out of MLflow into wandb: every key's history through MlflowClient, rows per step,
    one ``wandb.log`` per step (offline)."""
    import wandb

    from trackbridge.trackers.mlflow.client import make_client
    client = make_client(f"sqlite:///{db}")
    client.search_experiments()
    base = _rss_mb()
    t = time.perf_counter()
    n = 0
    for exp in client.search_experiments():
        for run in client.search_runs([exp.experiment_id]):
            rows: dict[int, dict[str, float]] = {}
            for key in run.data.metrics:
                for m in client.get_metric_history(run.info.run_id, key):
                    rows.setdefault(m.step, {})[key] = m.value
            w = wandb.init(mode="offline", dir=out, project="hand", name=run.info.run_name,
                           settings=wandb.Settings(silent=True, console="off"))
            for step in sorted(rows):
                w.log(rows[step], step=step)
                n += len(rows[step])
            w.finish()
    return {"seconds": time.perf_counter() - t, "points": n, "rss": _rss_mb(), "base": base}


MEASURES = {"trackbridge": m_trackbridge, "hand_wandb": m_hand_wandb, "hand_tb": m_hand_tb,
            "hand_mlflow": m_hand_mlflow,
            "mlflow_floor": m_mlflow_floor}


def child(name: str, *args: str, root: Path = ROOT) -> dict:
    env = dict(os.environ)
    env.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    env.setdefault("WANDB_MODE", "offline")
    env.setdefault("WANDB_SILENT", "true")
    env["TRACKBRIDGE_STATE_DIR"] = tempfile.mkdtemp(prefix="bench-state-")
    env["PYTHONPATH"] = str(root) + os.pathsep + env.get("PYTHONPATH", "")
    env["BENCH_ROOT"] = str(root)
    p = subprocess.run([sys.executable, __file__, "--child", name, *args], env=env, capture_output=True, text=True,
                       cwd=root)
    shutil.rmtree(env["TRACKBRIDGE_STATE_DIR"], ignore_errors=True)
    if p.returncode != 0:
        raise SystemExit(f"{name} failed:\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tags", type=int, default=500)
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--only", choices=["tb", "mlflow", "mlflow-wandb"], default=None)
    ap.add_argument("--baseline-root", default=None, metavar="DIR",
                    help="another trackbridge checkout to measure too (MLflow -> wandb: the ratio before/after)")
    ap.add_argument("--layout", choices=["per-value", "per-step"], default="per-value",
                    help="source event layout: one event per value (as trainers write) or per step (trackbridge's)")
    ap.add_argument("--keep", default=None, help="work in this folder and keep it")
    ap.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        name, *args = a.child
        if name == "mlflow_floor":
            args = [int(args[0]), int(args[1]), args[2]]
        print(json.dumps(MEASURES[name](*args)))
        return

    work = Path(a.keep) if a.keep else Path(tempfile.mkdtemp(prefix="bench-migrate-"))
    work.mkdir(parents=True, exist_ok=True)
    points = a.tags * a.steps
    print(f"workload: {a.tags} tags x {a.steps} steps = {points:,} points; work folder {work}", file=sys.stderr)
    t = time.perf_counter()
    make_source(work / "src", a.tags, a.steps, a.layout)
    quarter = max(1, a.steps // 4)
    make_source(work / "src-quarter", a.tags, quarter, a.layout)
    print(f"source written in {time.perf_counter() - t:.1f} s", file=sys.stderr)
    src = f"tensorboard:{work / 'src'}"
    rows = []

    def add(label: str, r: dict) -> dict:
        r["label"] = label
        r["rate"] = r["points"] / r["seconds"]
        rows.append(r)
        print(f"  {label}: {r['points']:,} points in {r['seconds']:.1f} s ({r['rate']:,.0f}/s), "
              f"peak {r['rss']:.0f} MB", file=sys.stderr)
        return r

    ratios = []
    if a.only in (None, "tb"):
        tb = add("trackbridge -> TensorBoard", child("trackbridge", src, f"tensorboard:{work / 'out-tb'}"))
        tbq = add(f"trackbridge -> TensorBoard ({quarter} steps)",
                  child("trackbridge", f"tensorboard:{work / 'src-quarter'}", f"tensorboard:{work / 'out-tb-q'}"))
        hand = add("tbparse + tensorboardX add_scalar", child("hand_tb", str(work / "src"), str(work / "out-tbx")))
        assert tb["points"] == points and hand["points"] == points, (tb["points"], hand["points"])
        ratios.append(("into TensorBoard", tb["rate"] / hand["rate"], 5.0, tb, tbq))
    if a.only in (None, "mlflow"):
        ml = add("trackbridge -> MLflow (SQLite)",
                 child("trackbridge", src, f"mlflow:sqlite:///{work / 'tb.db'}?experiment=migrated"))
        mlq = add(f"trackbridge -> MLflow (SQLite) ({quarter} steps)",
                  child("trackbridge", f"tensorboard:{work / 'src-quarter'}",
                        f"mlflow:sqlite:///{work / 'tbq.db'}?experiment=migrated"))
        hand = add("tbparse + MlflowClient.log_batch(1000)", child("hand_mlflow", str(work / "src"),
                                                                   str(work / "hand.db")))
        add("floor: MlflowClient.log_batch(1000) alone, step order",
            child("mlflow_floor", str(a.tags), str(a.steps), str(work / "floor.db")))
        assert ml["points"] == points and hand["points"] == points, (ml["points"], hand["points"])
        ratios.append(("into MLflow", ml["rate"] / hand["rate"], 1.5, ml, mlq))

    if a.only in (None, "mlflow-wandb"):
        db = work / "src-mlflow.db"
        if not db.exists():             # the source store: the same run, written by trackbridge (not measured)
            child("trackbridge", src, f"mlflow:sqlite:///{db}?experiment=src")
        msrc = f"mlflow:sqlite:///{db}"
        tw = add("trackbridge MLflow -> wandb", child("trackbridge", msrc, f"wandb:{work / 'out-wandb'}"))
        hand = add("MlflowClient.get_metric_history + wandb.log", child("hand_wandb", str(db),
                                                                         str(work / "out-wandb-hand")))
        assert tw["points"] == hand["points"], (tw["points"], hand["points"])
        mlflow_wandb = [("after", tw["rate"] / hand["rate"])]
        if a.baseline_root:
            old = add("trackbridge MLflow -> wandb (baseline checkout)",
                      child("trackbridge", msrc, f"wandb:{work / 'out-wandb-old'}", root=Path(a.baseline_root)))
            mlflow_wandb.insert(0, ("baseline", old["rate"] / hand["rate"]))

    print(f"\n{a.tags} tags x {a.steps} steps = {points:,} scalar points, source layout: {a.layout} "
          f"({'one event per value, as trainers write' if a.layout == 'per-value' else 'one event per step'})\n")
    print("| way | points | seconds | points/s | peak RSS MB | above imports MB |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['label']} | {r['points']:,} | {r['seconds']:.1f} | {r['rate']:,.0f} | {r['rss']:.0f} | "
              f"{r['rss'] - r['base']:.0f} |")
    print()
    for what, ratio, target, full, q in ratios:
        grow = (full["rss"] - full["base"]) - (q["rss"] - q["base"])
        print(f"- {what}: trackbridge {ratio:.1f}x the hand-written way (target >= {target:g}x): "
              f"{'met' if ratio >= target else 'MISSED'}; "
              f"peak memory above imports {full['rss'] - full['base']:.0f} MB "
              f"for {a.steps} steps vs {q['rss'] - q['base']:.0f} MB for {quarter} steps ({grow:+.0f} MB)")
    if a.only in (None, "mlflow-wandb"):
        print("- out of MLflow into wandb: trackbridge " + ", ".join(f"{r:.2f}x ({w})" for w, r in mlflow_wandb)
              + " the hand-written way (MlflowClient.get_metric_history + wandb.log; > 1 is faster)")
    if not a.keep:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
