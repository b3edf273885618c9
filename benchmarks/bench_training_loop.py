"""What logging costs a training loop (issue 13): per-step time of a loop doing ~1 ms of GIL-free work per step
(hashing a buffer, which releases the GIL, as a GPU step or a tokenizer call would) and logging 100 keys, each
variant in its own process:

* ``none``: no logging (the floor);
* ``wandb``: a direct offline ``wandb.log`` per step (wandb does its work in a separate service process);
* ``spool``: trackbridge with the spool only;
* ``thread``: trackbridge with five sinks (spool, TensorBoard, MLflow/SQLite, wandb offline, Trackio), each tracker
  in a thread of the training process (``writer="thread"``);
* ``process``: the same five sinks, the trackers in one writer process fed from the spool (``writer="process"``);
* with ``--paced``, also ``*-paced`` variants: a 2 ms sleep after each step, so that the sinks' batches hold one or
  a few records (the worst case for per-batch costs).

The variants run interleaved (``--rounds`` rounds, each running every variant once, in a rotated order), so that a
change in the machine's load hits them alike. The clock starts once every sink is open (imports, MLflow's schema
creation and the writer process's start are not timed, as the direct loop's ``wandb.init`` is not); ``finish()`` is
not timed either: it is after training.

Reported: per variant the median over rounds of the mean ms per step, and its cost: the mean ms per step above the
floor of the same round (``none`` or ``none-paced``); per round the ratio of each variant's cost to the direct
``wandb.log`` loop's (for a paced variant: the cheaper of the paced and unpaced direct loops), and its median
over rounds. Goal (issue 13): five sinks cost the loop no more than one direct
``wandb.log`` does (median ratio <= 1). The load average is printed before and after: on a shared machine, compare
ratios, not milliseconds.

    .venv/bin/python benchmarks/bench_training_loop.py [--steps 1500] [--keys 100] [--rounds 3] [--paced]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
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
base = mode.replace("-paced", "")
if base == "wandb":
    import wandb
    run = wandb.init(mode="offline", dir=out, project="bench", settings=wandb.Settings(silent=True, console="off"))
    log = lambda d, s: run.log(d, step=s)
    finish = run.finish
elif base in ("spool", "thread", "process"):
    import trackbridge
    sinks = [] if base == "spool" else [f"tensorboard:{out}/tb", f"mlflow:sqlite:///{out}/ml.db",
                                        f"wandb:{out}/wb", f"trackio:{out}/tio"]
    run = trackbridge.init(project="bench", name="loop", sinks=sinks, spool=f"{out}/spool", source="canonical",
                           options=trackbridge.LoggerOptions(writer="process" if base == "process" else "thread"))
    log = lambda d, s: run.log(d, step=s)
    finish = run.finish
    if base == "thread":
        import wandb, mlflow, tensorboard  # noqa: F401  (imports excluded, as for the direct wandb loop)
    end = time.monotonic() + 300     # start the clock once every sink is open
    while any(s["state"] == "pending" for s in run.status["sinks"]) and time.monotonic() < end:
        time.sleep(0.1)
    time.sleep(0.5)
times = []
for s in range(steps):
    t0 = time.perf_counter()
    work(reps)
    log({n: float(s) + i for i, n in enumerate(names)}, s)
    times.append(time.perf_counter() - t0)
    if mode.endswith("paced"):
        time.sleep(0.002)
t0 = time.perf_counter()
finish()
print(json.dumps({"median_ms": statistics.median(times[steps // 10:]) * 1e3,
                  "mean_ms": statistics.fmean(times[steps // 10:]) * 1e3, "reps": reps,
                  "finish_s": time.perf_counter() - t0}))
"""

GOAL_MODES = ("thread", "process")


def run(mode: str, steps: int, keys: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-loop-") as out:
        p = subprocess.run([sys.executable, "-c", CHILD, mode, str(steps), str(keys), out], env=ENV,
                           capture_output=True, text=True, cwd=ROOT)
        if p.returncode != 0:
            raise SystemExit(f"{mode} failed:\n{p.stderr[-3000:]}")
        return json.loads(p.stdout.strip().splitlines()[-1])


def load() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "?"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--keys", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--paced", action="store_true", help="also the paced variants (one record per batch)")
    ap.add_argument("--modes", default="", help="comma-separated subset of the variants (none and wandb are kept)")
    a = ap.parse_args(argv)
    modes = ["none", "wandb", "spool", "thread", "process"]
    if a.modes:
        modes = ["none", "wandb"] + [m for m in a.modes.split(",") if m not in ("none", "wandb")]
    if a.paced:
        modes += [f"{m}-paced" for m in modes if m != "spool"]
    load_before, started = load(), time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    res: dict[str, list[dict]] = {m: [] for m in modes}
    for r in range(a.rounds):
        order = modes[r % len(modes):] + modes[:r % len(modes)]
        for m in order:
            res[m].append(run(m, a.steps, a.keys))
        print(f"round {r + 1}/{a.rounds} done (load {load()})", file=sys.stderr, flush=True)

    def cost(m: str, r: int) -> float:
        floor = res["none-paced" if m.endswith("-paced") else "none"][r]["mean_ms"]
        return res[m][r]["mean_ms"] - floor

    def ratio(m: str, r: int) -> float | None:
        # a paced variant against the cheaper of the two direct loops (a paced wandb.log can cost more)
        wb = min(cost("wandb", r), cost("wandb-paced", r)) if m.endswith("-paced") else cost("wandb", r)
        return cost(m, r) / wb if wb > 0 else None

    print(f"\n{started}; {a.steps} steps, ~1 ms of GIL-free work + {a.keys} keys logged per step; {a.rounds} rounds, "
          f"interleaved; load average before {load_before}, after {load()}; {os.cpu_count()} CPUs\n")
    print("| loop | mean ms/step | median ms/step | cost: ms/step above no logging | vs direct wandb.log "
          "(median of rounds) | per round |")
    print("|---|---:|---:|---:|---:|---|")
    summary: dict[str, float | None] = {}
    for m in modes:
        mean = statistics.median(x["mean_ms"] for x in res[m])
        med = statistics.median(x["median_ms"] for x in res[m])
        over = statistics.median(cost(m, r) for r in range(a.rounds))
        ratios = [ratio(m, r) for r in range(a.rounds)]
        good = [x for x in ratios if x is not None]
        summary[m] = statistics.median(good) if good and not m.startswith("none") else None
        rtext = f"{summary[m]:.2f}x" if summary[m] is not None else "-"
        per = ", ".join("-" if x is None else f"{x:.2f}" for x in ratios) if summary[m] is not None else ""
        print(f"| {m} | {mean:.2f} | {med:.2f} | {0.0 if m.startswith('none') else over:.2f} | {rtext} | {per} |")
    print()
    for m in modes:
        base = m.replace("-paced", "")
        if base not in GOAL_MODES or summary[m] is None:
            continue
        ok = summary[m] <= 1.0
        print(f"- five sinks, writer={base!r}{' (paced)' if m.endswith('-paced') else ''}: {summary[m]:.2f}x the cost "
              f"of a direct wandb.log: {'met' if ok else 'MISSED'} (goal: <= 1x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
