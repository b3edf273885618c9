"""How fast `trackbridge doctor` reads a run: records per second on a 6-key TRL GRPO run, against `translate` on the
same file in the same process (issue 31 item 5: >= 20,000 records/s on 6 keys, linear in the run).

Run: .venv/bin/python benchmarks/bench_doctor.py [--records N] [--rounds R]
Writes a JSON-lines run of N records (reward, kl, entropy, grad_norm, loss, learning_rate; seeded noise) and, in
alternating rounds (best of R, so that a busy machine slows both alike), times:

* translate: the file read and translated to canonical names, as `trackbridge translate` does (open_runs, the
  run's pipeline), each record consumed;
* doctor: the whole `trackbridge doctor` path (``diagnose``: the same reading and translation with derived
  metrics, then every shipped check);
* checks alone: the engine (``Doctor.feed``) over the already translated records.

It prints records/s for each, doctor / translate, and the checks' cost per record at N and 4N records (linear:
the two agree); it exits 1 when doctor is under 20,000 records/s or the 4N cost per record is over 1.5x the N one.
"""
from __future__ import annotations

import argparse
import json
import math
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from trackbridge.doctor import Doctor, diagnose, load_checks  # noqa: E402
from trackbridge.read.inputs import open_runs  # noqa: E402

SOURCE = "trl/grpo@1.16.0"
TARGET = 20_000            # records per second, 6 keys


def write_run(path: Path, n: int, seed: int = 0) -> Path:
    """A GRPO run that learns (TRL's own key names), one logged dict per line."""
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as fh:
        for t in range(n):
            row = {"step": t + 1, "reward": 0.2 + 0.4 * (1 - math.exp(-t / 600)) + rng.gauss(0, 0.03),
                   "kl": 0.02 * (1 - math.exp(-t / 400)) * max(0.5, 1 + rng.gauss(0, 0.1)),
                   "entropy": 0.9 - 0.3 * t / n + rng.gauss(0, 0.02),
                   "grad_norm": 0.5 * max(0.3, 1 + rng.gauss(0, 0.2)), "loss": rng.gauss(0, 0.02),
                   "learning_rate": 1e-6}
            fh.write(json.dumps(row) + "\n")
    return path


def translate_file(path: Path) -> int:
    (run,) = open_runs(str(path), rows=True)
    pipe = run.pipeline("canonical", source=SOURCE)
    n = 0
    for _ in pipe.process(run.records()):
        n += 1
    return n


def doctor_file(path: Path) -> int:
    (run,) = open_runs(str(path), rows=True)
    d = diagnose(run, source=SOURCE)
    return d.records


def canonical_records(path: Path) -> list:
    (run,) = open_runs(str(path), rows=True)
    return list(run.pipeline("canonical", source=SOURCE).process(run.records()))


def checks_alone(records: list, checks) -> float:
    doc = Doctor(checks)
    t0 = time.perf_counter()
    for rec in records:
        doc.feed(rec)
    doc.finish()
    return time.perf_counter() - t0


def best(fn, rounds: int) -> float:
    out = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return min(out)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    n = args.records
    checks = load_checks()
    with tempfile.TemporaryDirectory() as tmp:
        path = write_run(Path(tmp) / "grpo.jsonl", n)
        big = write_run(Path(tmp) / "grpo4.jsonl", 4 * n, seed=1)
        assert translate_file(path) == n and doctor_file(path) == n          # warm: mappings loaded, compiled
        t_tr = t_doc = math.inf
        for _ in range(args.rounds):                                          # alternating: one machine state
            t_tr = min(t_tr, best(lambda: translate_file(path), 1))
            t_doc = min(t_doc, best(lambda: doctor_file(path), 1))
        recs, recs4 = canonical_records(path), canonical_records(big)
        t_chk = min(checks_alone(recs, checks) for _ in range(args.rounds))
        t_chk4 = min(checks_alone(recs4, checks) for _ in range(args.rounds))
    rate_doc, rate_tr = n / t_doc, n / t_tr
    per, per4 = t_chk / n * 1e6, t_chk4 / (4 * n) * 1e6
    print(f"{n} records of 6 keys ({SOURCE}), {len(checks)} shipped checks, best of {args.rounds} rounds\n")
    print("| path | seconds | records/s | us per record |\n|---|---|---|---|")
    print(f"| translate (read + translate to canonical) | {t_tr:.3f} | {rate_tr:,.0f} | {t_tr / n * 1e6:.1f} |")
    print(f"| doctor (read + translate + derive + every check) | {t_doc:.3f} | {rate_doc:,.0f} | "
          f"{t_doc / n * 1e6:.1f} |")
    print(f"| the checks alone, {n} records | {t_chk:.3f} | {n / t_chk:,.0f} | {per:.1f} |")
    print(f"| the checks alone, {4 * n} records | {t_chk4:.3f} | {4 * n / t_chk4:,.0f} | {per4:.1f} |")
    print(f"\ndoctor / translate: {t_doc / t_tr:.2f}x; doctor {rate_doc:,.0f} records/s (target >= {TARGET:,}); "
          f"the checks' cost per record at 4x the records: {per4 / per:.2f}x the cost at 1x (linear: ~1)")
    ok = rate_doc >= TARGET and per4 <= 1.5 * per
    if not ok:
        print("FAILED: under the target or not linear")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
