"""What logging costs a training loop (issue 13): per-step time of a loop doing ~1 ms of GIL-free work per step
(hashing a buffer, which releases the GIL, as a GPU step or a tokenizer call would) and logging 100 keys, in five
ways, each in its own process:

* no logging (the floor);
* a direct offline ``wandb.log`` per step (wandb does its work in a separate service process);
* trackbridge with the spool only;
* trackbridge with five sinks (spool, TensorBoard, MLflow/SQLite, wandb offline, Trackio);
* trackbridge with five sinks, steps paced so that each batch holds one record (the worst case for per-batch costs);
* the same two with ``writer="process"`` (the trackers in a writer process fed from the spool).

Reported: median ms per step of the loop (``finish()`` excluded: it is after training), and the overhead above the
floor against the direct ``wandb.log`` loop's. Goal (issue 13): five sinks cost the loop no more than one direct
``wandb.log`` does.

    .venv/bin/python benchmarks/bench_training_loop.py [--steps 1500] [--keys 100]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, WANDB_MODE="offline", WANDB_SILENT="true", WANDB_DISABLE_GIT="true",
           MLFLOW_DISABLE_TELEMETRY="true", HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))

CHILD = r"""
import hashlib, json, sys, time, statistics
mode, steps, keys, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
names = [f"actor/metric_{i:03d}" for i in range(keys)]
buf = b"x" * (1 << 20)

def work(n):                     # GIL-free: hashlib releases the GIL for buffers over 2 KB
    for _ in range(n):
        hashlib.sha256(buf).digest()

t = time.perf_counter(); work(50); per = (time.perf_counter() - t) / 50
reps = max(1, round(0.001 / per))

log = lambda d, s: None
finish = lambda: None
if mode == "wandb":
    import wandb
    run = wandb.init(mode="offline", dir=out, project="bench", settings=wandb.Settings(silent=True, console="off"))
    log = lambda d, s: run.log(d, step=s)
    finish = run.finish
elif mode.startswith("trackbridge"):
    import trackbridge
    sinks = [] if mode == "trackbridge-spool" else [f"tensorboard:{out}/tb", f"mlflow:sqlite:///{out}/ml.db",
                                                   f"wandb:{out}/wb", f"trackio:{out}/tio"]
    run = trackbridge.init(project="bench", name="loop", sinks=sinks, spool=f"{out}/spool", source="canonical",
                           writer="process" if "process" in mode else "thread")
    log = lambda d, s: run.log(d, step=s)
    finish = run.finish
    if sinks:
        import wandb, mlflow, tensorboard  # noqa: F401  (imports excluded, as for the direct wandb loop)
        time.sleep(3.0)          # let the sinks open (MLflow creates its schema) before the clock starts
times = []
for s in range(steps):
    t0 = time.perf_counter()
    work(reps)
    log({n: float(s) + i for i, n in enumerate(names)}, s)
    times.append(time.perf_counter() - t0)
    if mode.endswith("paced"):
        time.sleep(0.002)
finish()
print(json.dumps({"median_ms": statistics.median(times[steps // 10:]) * 1e3,
                  "mean_ms": statistics.fmean(times[steps // 10:]) * 1e3, "reps": reps}))
"""


def run(mode: str, steps: int, keys: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-loop-") as out:
        p = subprocess.run([sys.executable, "-c", CHILD, mode, str(steps), str(keys), out], env=ENV,
                           capture_output=True, text=True, cwd=ROOT)
        if p.returncode != 0:
            raise SystemExit(f"{mode} failed:\n{p.stderr[-3000:]}")
        return json.loads(p.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--keys", type=int, default=100)
    a = ap.parse_args(argv)
    modes = ["none", "wandb", "trackbridge-spool", "trackbridge-5", "trackbridge-5-process", "trackbridge-5-paced",
             "trackbridge-5-process-paced", "none-paced"]
    res = {m: run(m, a.steps, a.keys) for m in modes}
    floor = res["none"]["mean_ms"]
    wb = res["wandb"]["mean_ms"] - floor
    print(f"\n{a.steps} steps, ~1 ms of GIL-free work + {a.keys} keys logged per step\n")
    print("| loop | mean ms/step | median ms/step | overhead above no logging, ms | vs direct wandb.log |")
    print("|---|---:|---:|---:|---:|")
    for m in modes:
        base = res["none-paced"]["mean_ms"] if m.endswith("paced") else floor
        over = res[m]["mean_ms"] - base
        ratio = f"{over / wb:.2f}x" if wb > 0 and not m.startswith("none") else "-"
        print(f"| {m} | {res[m]['mean_ms']:.2f} | {res[m]['median_ms']:.2f} | {over:.2f} | {ratio} |")
    for mode, label in (("trackbridge-5", "in threads"), ("trackbridge-5-process", "in a writer process")):
        five = res[mode]["mean_ms"] - floor
        print(f"- five sinks {label} cost the loop {five:.2f} ms/step against {wb:.2f} ms for a direct wandb.log: "
              f"{'met' if five <= wb else 'MISSED'} (goal: no more)")


if __name__ == "__main__":
    main()
