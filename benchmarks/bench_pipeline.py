"""Benchmark: what the one pipeline costs per record (``Pipeline.one``: the stages Translate, then Derive when it is
on), the path every stored run takes (translate, migrate, replay, compare, doctor, read).

Workload: 5,000 records of a veRL run (12 of veRL 0.4.1's own keys and ``--extra`` keys of its own that no mapping
knows, 40 by default: unmapped keys pass through, and the derived rules see them), each run through a fresh
``Pipeline("verl@0.4.1", "canonical")`` per round, derivation off and on. Prints microseconds per record (median and
best of the rounds). ``--baseline-root DIR`` also measures another checkout of trackbridge (``git worktree add DIR
REV``) in child processes, rounds interleaved with this one's, and prints the ratio this / baseline per mode.

    .venv/bin/python benchmarks/bench_pipeline.py [--records 5000] [--rounds 5] [--extra 40] [--baseline-root DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VERL = {"actor/pg_loss": 0.1, "actor/ppo_kl": 0.01, "critic/score/mean": 0.5, "response_length/mean": 120.0,
        "timing_s/step": 10.0, "timing_s/gen": 4.0, "perf/total_num_tokens": 58000.0, "actor/entropy": 1.2,
        "critic/rewards/mean": 0.4, "actor/grad_norm": 1.0, "actor/lr": 1e-6}


def records(n: int, extra: int) -> list:
    from trackbridge.record import Record
    out = []
    for i in range(n):
        m = {k: v * (1 + 0.001 * i) for k, v in VERL.items()}
        m["training/global_step"] = i
        m.update({f"extra/m{j}": float(j + i) for j in range(extra)})
        out.append(Record(i, float(i), m))
    return out


def measure(n: int, extra: int) -> dict[str, float]:
    """One round: microseconds per record, derivation off and on (a fresh pipeline each)."""
    from trackbridge.pipeline import Pipeline
    recs = records(n, extra)
    out = {}
    for derive in (False, True):
        pipe = Pipeline("verl@0.4.1", "canonical", derive=derive)
        t0 = time.perf_counter()
        for r in recs:
            pipe.one(r)
        out[f"derive {'on' if derive else 'off'}"] = (time.perf_counter() - t0) / n * 1e6
    return out


def child(root: str, n: int, extra: int) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=root)
    code = (f"import json, sys; sys.path.insert(0, {root!r}); sys.path.insert(1, {str(ROOT / 'benchmarks')!r}); "
            f"import bench_pipeline as B; print(json.dumps(B.measure({n}, {extra})))")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--extra", type=int, default=40, help="unmapped keys per record")
    ap.add_argument("--baseline-root", default=None, metavar="DIR")
    a = ap.parse_args()
    mine: dict[str, list[float]] = {}
    base: dict[str, list[float]] = {}
    for _ in range(a.rounds):
        for k, v in child(str(ROOT), a.records, a.extra).items():
            mine.setdefault(k, []).append(v)
        if a.baseline_root:
            for k, v in child(a.baseline_root, a.records, a.extra).items():
                base.setdefault(k, []).append(v)
    print(f"{a.records} records, {len(VERL) + 1} veRL keys + {a.extra} unmapped, {a.rounds} rounds")
    print("| mode | this checkout, µs/record (median, best) | baseline | this / baseline (median of rounds) |")
    print("|---|---|---|---|")
    for k, v in mine.items():
        row = f"| {k} | {statistics.median(v):.1f}, {min(v):.1f} |"
        if base:
            b = base[k]
            ratio = statistics.median([x / y for x, y in zip(v, b)])
            row += f" {statistics.median(b):.1f}, {min(b):.1f} | {ratio:.2f} |"
        else:
            row += " — | — |"
        print(row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
