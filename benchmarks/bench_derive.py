"""Benchmark: cost of Deriver.apply on a 100-key canonical dict (what derivation adds to one log() call).

Run: .venv/bin/python benchmarks/bench_derive.py [--n 20000]
Prints microseconds per call for: a dict where several shipped rules fire (veRL-like step), the same dict when
everything derivable was already logged (the common steady state), and a dict where no rule applies.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from trackbridge.derive import Deriver, load_rules


def base_dict(step: int) -> dict:
    m = {
        "perf/global_seqlen/min": 3471.0, "perf/global_seqlen/max": 3970.0,
        "perf/tokens_per_step": 58758.0, "time/step": 10.189, "response/length/mean": 126.934,
        "prompt/length/mean": 102.59, "time/generation": 4.364, "time/values": 0.543, "time/adv": 0.01,
        "time/update_critic": 2.263, "time/update_actor": 2.49, "time/reward": 0.038, "time/old_log_prob": 0.476,
        "progress/tokens": 58758.0 * step, "progress/samples": 256.0 * step,
        "reward/score/mean": 0.5, "kl/old_ref/k1_seq_sum": 3.0,
    }
    for i in range(100 - len(m)):
        m[f"extra/metric_{i:02d}/mean"] = float(i)
    assert len(m) == 100
    return m


def bench(deriver_factory, make, n: int) -> float:
    d = deriver_factory()
    dicts = [make(i + 1) for i in range(n)]
    t0 = time.perf_counter()
    for i, m in enumerate(dicts):
        d.apply(m, step=i + 1, wall_time=1000.0 + i)
    return (time.perf_counter() - t0) / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--steps", type=int, default=2000, help="steps logged through the logger")
    args = ap.parse_args()
    rules = load_rules()
    factory = lambda: Deriver(rules, config={"kl_coef": 0.05, "num_gpus": 16}, source="verl/ppo@v0.4.1")  # noqa: E731

    derivable = base_dict(1)
    probe = dict(derivable)
    names = factory().apply(probe, step=1, wall_time=1.0)
    full = lambda s: {**base_dict(s), **{k: probe[k] for k in names}}                              # noqa: E731
    none = lambda s: {f"extra/metric_{i:03d}/mean": float(i) for i in range(100)}                   # noqa: E731

    print(f"rules: {len(rules)}; derived on a veRL-like step: {len(names)} ({', '.join(names)})")
    for label, make in [("rules fire", base_dict), ("all logged", full), ("nothing applies", none)]:
        best = min(bench(factory, make, args.n) for _ in range(3))
        print(f"{label:>16}: {best:7.2f} us per apply() on a 100-key dict")
    print()
    logger_table(args.steps)


def logger_table(steps: int) -> None:
    """What derivation adds to a 100-key log() call through the logger (veRL names in, JSONL spool only): the time
    log() blocks the caller, and the time until the run is written, with derive on and off."""
    import trackbridge

    verl = {"global_seqlen/min": 3471.0, "global_seqlen/max": 3970.0, "perf/total_num_tokens": 58758.0,
            "perf/time_per_step": 10.189, "response_length/mean": 126.9, "prompt_length/mean": 102.6,
            "timing_s/gen": 4.364, "timing_s/values": 0.543, "timing_s/adv": 0.01, "timing_s/update_critic": 2.263,
            "timing_s/update_actor": 2.49, "critic/score/mean": 0.5}
    for i in range(100 - len(verl)):
        verl[f"val-core/ds{i}/acc/mean@1"] = float(i)
    rows = []
    for derive in (False, True):
        with tempfile.TemporaryDirectory() as tmp:
            run = trackbridge.init(project="bench", run_id="d", sinks=[], source="verl@0.4.1",
                                   options=trackbridge.LoggerOptions(derive=derive),
                                   spool=tmp, config={"trainer": {"n_gpus_per_node": 8, "nnodes": 2}})
            blocks = []
            t0 = time.perf_counter()
            for s in range(steps):
                b0 = time.perf_counter_ns()
                run.log(dict(verl), step=s)
                blocks.append((time.perf_counter_ns() - b0) / 1000)
            run.finish()
            total = time.perf_counter() - t0
            n_derived = sum(1 for line in open(Path(tmp) / "d.jsonl") if '"derived"' in line)
        blocks.sort()
        rows.append((derive, statistics.median(blocks), blocks[int(len(blocks) * 0.99) - 1], total, n_derived))
    print(f"| logger, {steps} steps x 100 veRL keys, JSONL spool | log() blocks, median us | p99 us | "
          "until written, s | records with derived values |")
    print("|---|---|---|---|---|")
    for derive, med, p99, total, n in rows:
        print(f"| derive={'on' if derive else 'off'} | {med:.1f} | {p99:.1f} | {total:.2f} | {n} |")


if __name__ == "__main__":
    main()
