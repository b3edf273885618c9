"""What the live checks cost ``log()`` (issue 32 item 5, issue 31): how long ``run.log()`` blocks the caller with
``init(doctor=True)`` against ``init(doctor=False)``, in a loop doing ~``--work-ms`` ms of GIL-free work per step
(hashing a buffer, which releases the GIL, as a GPU step or a tokenizer call would) and logging a TRL GRPO step's
keys (the names the checks read, plus ``--keys`` others; one gradient-norm explosion half way: one finding, said
at the next ``log()``), spool only, each variant in its own process.

The variants run interleaved (``--rounds`` rounds, each running ``off`` and ``on`` once, in a rotated order), so that
a change in the machine's load hits them alike. The clock covers ``log()`` only (``init`` and ``finish()`` are not
timed). Reported per variant: the median over rounds of the median, p99 and max of ``log()`` in µs, and per round the
ratio of ``on``'s p99 to ``off``'s (its median over rounds). Goal: the checks run off the caller's thread, so
``log()``'s p99 with the checks stays in tens of microseconds (ratio <= 2; issue 31 measured 5-14 ms against 15-35
µs). ``--work-ms 0`` is the tight loop (no work between calls: the worst case for sharing the GIL). The load average
is printed before and after: on a shared machine, compare ratios, not microseconds.

    .venv/bin/python benchmarks/bench_doctor_live.py [--steps 2000] [--keys 20] [--rounds 3] [--work-ms 1]
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
ENV = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))

CHILD = r"""
import hashlib, json, math, random, sys, time
mode, steps, keys, work_ms, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
import trackbridge
buf = b"x" * (1 << 20)

def work(n):                     # GIL-free: hashlib releases the GIL for buffers over 2 KB
    for _ in range(n):
        hashlib.sha256(buf).digest()

t = time.perf_counter(); work(20); per = (time.perf_counter() - t) / 20
reps = round(work_ms / 1000 / per) if work_ms > 0 else 0
rng = random.Random(0)
import warnings
warnings.simplefilter("ignore")
run = trackbridge.init(project="bench", name=mode, source="trl", spool=out, doctor=(mode == "on"),
                       config={"learning_rate": 1e-6, "beta": 0.04},
                       options=trackbridge.LoggerOptions(queue_size=steps + 10))
extra = [f"custom/metric_{i:03d}" for i in range(keys)]
calls = []
for s in range(steps):
    d = {"reward": 0.2 + 0.5 * s / steps + rng.gauss(0, 0.02), "reward_std": 0.3 + rng.gauss(0, 0.01),
         "kl": 0.01 * (1 + s / steps) + abs(rng.gauss(0, 0.001)), "entropy": 1.2 - 0.3 * s / steps + rng.gauss(0, 0.01),
         "grad_norm": 0.5 + abs(rng.gauss(0, 0.05)), "loss": 0.01 + rng.gauss(0, 0.002), "learning_rate": 1e-6,
         "clip_ratio/region_mean": 0.02 + abs(rng.gauss(0, 0.002)), "completions/mean_length": 40 + rng.gauss(0, 2),
         "completions/clipped_ratio": 0.01, "frac_reward_zero_std": 0.05, "epoch": s / steps}
    if s == steps // 2:
        d["grad_norm"] = 50.0            # one explosion: a finding, said at the next log() (counted in the timings)
    d.update({k: rng.random() for k in extra})
    if reps:
        work(reps)
    a = time.perf_counter(); run.log(d, step=s); calls.append(time.perf_counter() - a)
run.finish()
calls = sorted(c * 1e6 for c in calls)
pick = lambda q: calls[min(len(calls) - 1, int(q * len(calls)))]
print("RESULT" + json.dumps({"median": pick(0.5), "p99": pick(0.99), "max": calls[-1],
                              "findings": len(run.findings)}))
"""


def run_child(mode: str, steps: int, keys: int, work_ms: float, out: Path) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    p = subprocess.run([sys.executable, "-c", CHILD, mode, str(steps), str(keys), str(work_ms), str(out)],
                       capture_output=True, text=True, env=ENV, cwd=out)
    line = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT")]
    if p.returncode or not line:
        raise RuntimeError(f"{mode} failed:\n{p.stderr[-3000:]}")
    return json.loads(line[-1][6:])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--keys", type=int, default=20, help="keys logged beside the TRL ones (default 20)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--work-ms", type=float, default=1.0, help="GIL-free work per step, ms (0: a tight loop)")
    a = ap.parse_args(argv)
    load0 = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    res: dict[str, list[dict]] = {"off": [], "on": []}
    with tempfile.TemporaryDirectory(prefix="bench_doctor_live_") as tmp:
        for r in range(a.rounds):
            for mode in (("off", "on") if r % 2 == 0 else ("on", "off")):
                res[mode].append(run_child(mode, a.steps, a.keys, a.work_ms, Path(tmp) / f"{mode}{r}"))
    load1 = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"\n{a.steps} steps x {12 + a.keys} keys (TRL GRPO names), {a.work_ms:g} ms of GIL-free work per step, "
          f"spool only, {a.rounds} rounds; load average {load0:.1f} -> {load1:.1f}\n")
    print("| log() blocking, µs | doctor=False | doctor=True |")
    print("|---|---:|---:|")
    for q in ("median", "p99", "max"):
        off = statistics.median(x[q] for x in res["off"])
        on = statistics.median(x[q] for x in res["on"])
        print(f"| {q} (median of rounds) | {off:.1f} | {on:.1f} |")
    ratios = [on["p99"] / off["p99"] for on, off in zip(res["on"], res["off"])]
    med = statistics.median(ratios)
    print(f"\np99 ratio doctor=True / doctor=False per round: {', '.join(f'{x:.2f}' for x in ratios)}; "
          f"median {med:.2f} (target <= 2); findings with doctor=True: {res['on'][0]['findings']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
