"""Benchmark of the multiplexing logger (issue 3, "Performance").

Workload: STEPS steps x 100 metrics with veRL names, translated to canonical names, written to all five sinks
(jsonl spool, TensorBoard, MLflow SQLite, wandb offline, Trackio). Reported, from one run on one machine:

* how long ``run.log()`` blocks the caller (median, p99), next to a direct offline ``wandb.log`` of the same dict;
* the total time until every sink has finished (``init`` to ``finish()`` returning), next to each tracker written
  alone with its own client in its own process, batched the best way its API allows (TensorBoard: its own
  ``EventFileWriter``, one Event per step; MLflow: ``MlflowClient.log_batch`` in chunks of 1000; wandb: one
  ``log`` per step; Trackio: one ``log`` per step).

Tracker imports are excluded from every timing (the trackbridge process imports them before it starts the clock).
Targets: median ``log()`` <= 0.1 x direct ``wandb.log``; drain <= 1.2 x the slowest tracker alone.

    python benchmarks/bench_logger.py [--steps 2000] [--metrics 100]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, WANDB_MODE="offline", WANDB_SILENT="true", WANDB_DISABLE_GIT="true",
           MLFLOW_DISABLE_TELEMETRY="true", HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))

VERL_KEYS = [
    "actor/pg_loss", "actor/entropy", "actor/pg_clipfrac", "actor/ppo_kl", "actor/grad_norm", "actor/lr",
    "actor/kl_loss", "actor/pg_clipfrac_lower", "critic/score/mean", "critic/score/max", "critic/score/min",
    "critic/rewards/mean", "critic/rewards/max", "critic/rewards/min", "critic/advantages/mean",
    "critic/advantages/max", "critic/advantages/min", "critic/returns/mean", "critic/returns/max",
    "critic/returns/min", "response_length/mean", "response_length/max", "response_length/min",
    "response_length/clip_ratio", "prompt_length/mean", "prompt_length/max", "prompt_length/min",
    "prompt_length/clip_ratio", "timing_s/gen", "timing_s/ref", "timing_s/adv", "timing_s/update_actor",
    "timing_s/step", "timing_per_token_ms/gen", "timing_per_token_ms/ref", "timing_per_token_ms/adv",
    "timing_per_token_ms/update_actor", "perf/throughput", "perf/total_num_tokens", "perf/time_per_step",
    "perf/max_memory_allocated_gb", "perf/max_memory_reserved_gb", "perf/cpu_memory_used_gb",
    "global_seqlen/min", "global_seqlen/max", "global_seqlen/minmax_diff", "global_seqlen/balanced_min",
    "global_seqlen/balanced_max", "global_seqlen/mean", "training/global_step", "training/epoch",
    "val-core/openai/gsm8k/reward/mean@1",
]


def make_keys(n: int) -> list[str]:
    keys = list(VERL_KEYS[:n])
    i = 0
    while len(keys) < n:
        keys.append(f"val-aux/openai/gsm8k/reward/std@{i}" if i % 2 else f"timing_s/stage_{i}")
        i += 1
    return keys


def make_dict(keys: list[str], step: int) -> dict[str, float]:
    d = {k: (step * 0.001 + j * 0.01) for j, k in enumerate(keys)}
    if "training/global_step" in d:
        d["training/global_step"] = step
    return d


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


# -- child programs (each tracker alone, in its own process) ---------------------------------------------------
CHILD = {
    "wandb": """
import wandb
t0 = time.perf_counter()
run = wandb.init(project="bench", dir=OUT, mode="offline", config={"lr": 1e-6})
calls = []
for s in range(STEPS):
    d = make_dict(KEYS, s)
    a = time.perf_counter(); run.log(d, step=s); calls.append(time.perf_counter() - a)
run.finish()
RESULT = {"total": time.perf_counter() - t0, "calls": calls}
""",
    "tensorboard": """
from tensorboard.summary.writer.event_file_writer import EventFileWriter
from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.compat.proto.summary_pb2 import Summary
t0 = time.perf_counter()
w = EventFileWriter(OUT)
for s in range(STEPS):
    d = make_dict(KEYS, s)
    w.add_event(Event(wall_time=time.time(), step=s, summary=Summary(
        value=[Summary.Value(tag=k, simple_value=v) for k, v in d.items()])))
w.close()
RESULT = {"total": time.perf_counter() - t0}
""",
    "mlflow": """
from mlflow.tracking import MlflowClient
from mlflow.entities import Metric
t0 = time.perf_counter()
c = MlflowClient(tracking_uri="sqlite:///" + OUT + "/m.db")
exp = c.create_experiment("bench")
rid = c.create_run(exp).info.run_id
buf = []
for s in range(STEPS):
    d = make_dict(KEYS, s)
    ts = int(time.time() * 1000)
    buf.extend(Metric(k.replace("@", "_at_"), v, ts, s) for k, v in d.items())
    while len(buf) >= 1000:
        c.log_batch(rid, metrics=buf[:1000]); buf = buf[1000:]
if buf:
    c.log_batch(rid, metrics=buf)
c.set_terminated(rid)
RESULT = {"total": time.perf_counter() - t0}
""",
    "trackio": """
import trackio
t0 = time.perf_counter()
trackio.init(project="bench", name="alone", config={"lr": 1e-6})
for s in range(STEPS):
    trackio.log(make_dict(KEYS, s), step=s)
trackio.finish()
RESULT = {"total": time.perf_counter() - t0}
""",
}

PRELUDE = """
import json, sys, time
sys.path.insert(0, ROOT + "/benchmarks")
from bench_logger import make_dict, make_keys
KEYS = make_keys(METRICS)
"""


def run_child(name: str, steps: int, metrics: int, out: Path) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    code = (f"ROOT={str(ROOT)!r}; OUT={str(out)!r}; STEPS={steps}; METRICS={metrics}\n" + PRELUDE + CHILD[name]
            + "\nprint('RESULT' + json.dumps(RESULT))\n")
    env = dict(ENV, TRACKIO_DIR=str(out))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=out)
    line = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT")]
    if p.returncode or not line:
        raise RuntimeError(f"{name} alone failed:\n{p.stderr[-2000:]}")
    return json.loads(line[-1][6:])


def run_trackbridge(steps: int, metrics: int, out: Path) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    code = f"ROOT={str(ROOT)!r}; OUT={str(out)!r}; STEPS={steps}; METRICS={metrics}\n" + PRELUDE + """
import mlflow, wandb, trackio, tensorboard.compat.proto.event_pb2   # imports excluded from the timings
import trackbridge
sinks = ["tensorboard:" + OUT + "/tb", "mlflow:sqlite:///" + OUT + "/m.db?experiment=bench", "wandb:" + OUT + "/wb",
         "trackio:" + OUT + "/trackio?project=bench"]
t0 = time.perf_counter()
run = trackbridge.init(project="bench", name="tb", sinks=sinks, source="verl", spool=OUT + "/spool",
                       config={"lr": 1e-6}, options=trackbridge.LoggerOptions(queue_size=max(5000, STEPS + 10)))
calls = []
for s in range(STEPS):
    d = make_dict(KEYS, s)
    a = time.perf_counter(); run.log(d, step=s); calls.append(time.perf_counter() - a)
t_logged = time.perf_counter() - t0
st = run.finish()
RESULT = {"total": time.perf_counter() - t0, "log_loop": t_logged, "calls": calls,
          "sinks": [(x["sink"].split(":")[0], x["state"], x["written"]) for x in st["sinks"]],
          "source": run.info.source}
"""
    p = subprocess.run([sys.executable, "-c", code + "\nprint('RESULT' + json.dumps(RESULT))\n"], capture_output=True,
                       text=True, env=ENV, cwd=out)
    line = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT")]
    if p.returncode or not line:
        raise RuntimeError(f"trackbridge run failed:\n{p.stderr[-3000:]}")
    return json.loads(line[-1][6:])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--metrics", type=int, default=100)
    ap.add_argument("--skip-alone", action="store_true", help="only the trackbridge run and direct wandb")
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench_logger_") as tmp:
        tmp = Path(tmp)
        tb = run_trackbridge(a.steps, a.metrics, tmp / "trackbridge")
        alone = {"wandb": run_child("wandb", a.steps, a.metrics, tmp / "wandb")}
        if not a.skip_alone:
            for name in ("tensorboard", "trackio", "mlflow"):
                alone[name] = run_child(name, a.steps, a.metrics, tmp / name)
    calls_tb = [c * 1e6 for c in tb["calls"]]
    calls_wb = [c * 1e6 for c in alone["wandb"]["calls"]]
    slowest = max(alone, key=lambda k: alone[k]["total"])
    print(f"\n{a.steps} steps x {a.metrics} metrics, veRL names in (detected source: {tb['source']}), "
          f"canonical out; sinks: {', '.join(f'{k} {s} {w}' for k, s, w in tb['sinks'])}\n")
    print("| measure | trackbridge | reference | ratio | target |")
    print("|---|---|---|---|---|")
    med_tb, med_wb = statistics.median(calls_tb), statistics.median(calls_wb)
    print(f"| log() blocking, median µs | {med_tb:.1f} | {med_wb:.1f} (direct wandb.log offline) | "
          f"{med_tb / med_wb:.3f} | <= 0.1 |")
    print(f"| log() blocking, p99 µs | {pct(calls_tb, 0.99):.1f} | {pct(calls_wb, 0.99):.1f} | "
          f"{pct(calls_tb, 0.99) / pct(calls_wb, 0.99):.3f} | - |")
    print(f"| total until all sinks finished, s | {tb['total']:.2f} (log loop {tb['log_loop']:.2f}) | "
          f"{alone[slowest]['total']:.2f} (slowest alone: {slowest}) | {tb['total'] / alone[slowest]['total']:.2f} "
          f"| <= 1.2 |")
    for name, r in sorted(alone.items(), key=lambda kv: -kv[1]["total"]):
        print(f"| {name} alone, s | | {r['total']:.2f} | | |")


if __name__ == "__main__":
    main()
