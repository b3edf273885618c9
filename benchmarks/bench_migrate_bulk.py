"""Benchmark: bulk migration of many runs, one after the other vs ``--jobs`` threads vs ``--engine ray`` (issue 24).

Workload (default): 200 runs, each 100 steps x 20 metrics (400,000 points), as canonical JSON-lines streams (the
cheapest source to read, so the engines' own costs show), migrated into TensorBoard (the cheapest destination) and,
with ``--dest mlflow``, into an MLflow SQLite store. Each measurement runs in its own child process with a fresh
ledger and destination; the tracker's package is imported before the clock starts (Ray's workers import it
themselves: that is part of Ray's cost and is counted). Modes:

* ``sequential``: ``migrate(src, dst)``;
* ``jobs``: ``migrate(src, dst, jobs=N)`` (threads of one process);
* ``ray-cold``: ``migrate(src, dst, engine="ray")`` on a one-node cluster of N CPUs started just before (the
  cluster's start is timed apart; the first migration on it also starts and warms its worker processes);
* ``ray-warm``: a second migration (new destination, new ledger) on the same cluster;
* ``dry-run``: ``migrate(..., dry_run=True)`` one after the other: reading and translating only, nothing written (what
  the source and the pipeline cost, so that the rest is the destination's);
* with ``--requests-per-s R``, every mode again under a limit of R write requests per second shared by all workers
  (the destination's API bound: adding workers stops helping once the limit is reached).

    .venv/bin/python benchmarks/bench_migrate_bulk.py [--runs 200] [--steps 100] [--keys 20] [--workers 2]
        [--dest tensorboard|mlflow] [--requests-per-s R] [--only MODE,...]

Prints a markdown table: seconds, runs/s and points/s per mode, and the speed-up over ``sequential``.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODES = ("dry-run", "sequential", "jobs", "ray-cold", "ray-warm")


def make_source(folder: Path, runs: int, steps: int, keys: int) -> str:
    from trackbridge.record import Record, RunInfo
    from trackbridge.stream import StreamWriter
    names = [f"custom/group_{j // 10}/metric_{j % 10}" for j in range(keys)]
    for i in range(runs):
        w = StreamWriter(folder / f"run-{i:04d}.jsonl")
        w.open(RunInfo(name=f"run-{i:04d}", run_id=f"run-{i:04d}", names="canonical", config={"seed": i}))
        w.write([Record(step=s, wall_time=1.7e9 + s, metrics={n: i + s / 7 + j for j, n in enumerate(names)})
                 for s in range(steps)])
        w.close()
    return f"jsonl:{folder}"


def destination(kind: str, folder: Path) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    if kind == "mlflow":
        return f"mlflow:sqlite:///{folder / 'mlflow.db'}"
    return f"tensorboard:{folder}"


CHILD = r"""
import json, os, sys, time, io
spec = json.loads(sys.argv[1])
sys.path.insert(0, spec["root"])
os.environ["TRACKBRIDGE_STATE_DIR"] = spec["state"]
import trackbridge.migrate as mig
if spec["dest"].startswith("mlflow:"):
    import mlflow  # noqa: F401  (imported before the clock, as in every mode)
else:
    import tensorboard  # noqa: F401
out = {}
mode = spec["mode"]
kw = dict(progress=False, requests_per_s=spec.get("rps"))
if mode == "dry-run":
    t = time.perf_counter(); r = mig.migrate(spec["src"], spec["dest"], dry_run=True, out=io.StringIO())
    out["seconds"] = time.perf_counter() - t
elif mode in ("sequential", "jobs"):
    jobs = spec["workers"] if mode == "jobs" else 1
    t = time.perf_counter(); r = mig.migrate(spec["src"], spec["dest"], jobs=jobs, **kw)
    out["seconds"] = time.perf_counter() - t
else:
    import ray
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    t = time.perf_counter()
    ray.init(address="local", num_cpus=spec["workers"], object_store_memory=100 * 2 ** 20, include_dashboard=False,
             log_to_driver=False, namespace="trackbridge", _node_ip_address="127.0.0.1")
    out["cluster_start"] = time.perf_counter() - t
    t = time.perf_counter(); r = mig.migrate(spec["src"], spec["dest"], engine="ray", **kw)
    out["seconds"] = time.perf_counter() - t
    if mode == "ray-warm":
        os.environ["TRACKBRIDGE_STATE_DIR"] = spec["state"] + "-warm"
        t = time.perf_counter(); r = mig.migrate(spec["src"], spec["dest2"], engine="ray", **kw)
        out["seconds"] = time.perf_counter() - t
    ray.shutdown()
out["ok"] = r.ok
out["runs"] = len(r.runs)
out["points"] = sum(x.points for x in r.runs)
print(json.dumps(out))
"""


def measure(mode: str, src: str, work: Path, args: argparse.Namespace, rps: float | None) -> dict:
    tag = f"{mode}{'-limited' if rps else ''}"
    dest = destination(args.dest, work / f"dst-{tag}")
    dest2 = destination(args.dest, work / f"dst-{tag}-2")
    spec = {"root": str(ROOT), "state": str(work / f"state-{tag}"), "src": src, "dest": dest, "dest2": dest2,
            "mode": mode, "workers": args.workers, "rps": rps}
    p = subprocess.run([sys.executable, "-c", CHILD, json.dumps(spec)], capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"{mode} failed:\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--keys", type=int, default=20)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--dest", choices=["tensorboard", "mlflow"], default="tensorboard")
    ap.add_argument("--requests-per-s", type=float, default=None)
    ap.add_argument("--only", default=",".join(MODES))
    args = ap.parse_args()
    try:
        import ray  # noqa: F401
    except ImportError:
        print("Ray is not installed: the ray modes are left out (pip install 'trackbridge[ray]')")
    work = Path(tempfile.mkdtemp(prefix="bench-bulk-"))
    try:
        src = make_source(work / "src", args.runs, args.steps, args.keys)
        total = args.runs * args.steps * args.keys
        print(f"{args.runs} runs x {args.steps} steps x {args.keys} metrics = {total:,} points, jsonl -> {args.dest}, "
              f"{args.workers} workers, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}\n")
        rows = []
        limits = [None] + ([args.requests_per_s] if args.requests_per_s else [])
        for rps in limits:
            for mode in args.only.split(","):
                if mode == "dry-run" and rps:
                    continue
                res = measure(mode, src, work, args, rps)
                rows.append((mode, rps, res))
                print(f"  {mode}{f' (limit {rps:g} requests/s)' if rps else ''}: {res['seconds']:.2f} s", flush=True)
        base = {rps: r["seconds"] for m, rps, r in rows if m == "sequential"}
        print("\n| mode | limit | seconds | runs/s | points/s | vs sequential | note |")
        print("|---|---|---:|---:|---:|---:|---|")
        for mode, rps, r in rows:
            s = r["seconds"]
            note = f"cluster start {r['cluster_start']:.1f} s (not counted)" if "cluster_start" in r else ""
            if mode == "dry-run":
                note = "read + translate only, nothing written"
            speed = f"{base[rps] / s:.2f}x" if rps in base and mode != "dry-run" else ""
            pts = total if mode == "dry-run" else r["points"]
            print(f"| {mode} | {f'{rps:g} req/s' if rps else '-'} | {s:.2f} | {r['runs'] / s:.1f} | {pts / s:,.0f} | "
                  f"{speed} | {note} |")
            if mode != "dry-run" and (not r["ok"] or r["points"] != total):
                print(f"  !! {mode}: ok={r['ok']}, {r['points']:,} of {total:,} points")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
