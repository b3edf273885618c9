"""How long translating one logged dict takes: a 100-key veRL dict to canonical names and to TRL names.

Run: .venv/bin/python benchmarks/bench_translate.py [--calls N]
Reports the median and p99 per call (microseconds) once the Translator is warm, and the one-off cost of loading
the mappings and compiling a Translator.
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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from trackbridge.pipeline import Translator, translate  # noqa: E402
from trackbridge.schema.loader import _load_cached, load_registry  # noqa: E402

VERL_LOG = Path(__file__).resolve().parents[1] / "tests" / "data" / "public-logs" / "01_verl.json"


def verl_dict(n: int = 100) -> dict[str, float]:
    """A real veRL run's keys (a public console log, tests/data), topped up with validation keys to ``n``."""
    keys = [k for k in json.loads(VERL_LOG.read_text())["keys"] if k != "step"]
    stages = ["gen", "ref", "values", "adv", "update_critic", "update_actor", "step", "reward", "old_log_prob"]
    keys += [f"timing_s/{s}" for s in stages] + [f"val-core/openai/gsm8k_{i}/acc/mean@4" for i in range(40)]
    keys = list(dict.fromkeys(keys))[:n]
    out = {k: float(i) * 0.5 + 0.25 for i, k in enumerate(keys)}
    if "perf/time_per_step" in out and "timing_s/step" in out:
        # veRL logs one value under both names (metric_utils.py@v0.7.0 compute_throughout_metrics: time_per_step is
        # timing_raw["step"]); distinct values would make every call take the rare clash path (see clash_dict)
        out["perf/time_per_step"] = out["timing_s/step"]
    return out


def clash_dict(n: int = 100) -> dict[str, float]:
    """``verl_dict`` with two names of one quantity holding different values: the clash path (kept and reported)."""
    out = verl_dict(n)
    out["perf/time_per_step"] = out["timing_s/step"] + 1.0
    return out


def measure(fn, calls: int) -> tuple[float, float]:
    times = []
    for _ in range(calls):
        t0 = time.perf_counter_ns()
        fn()
        times.append((time.perf_counter_ns() - t0) / 1000)
    times.sort()
    return statistics.median(times), times[int(len(times) * 0.99) - 1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=5000)
    args = ap.parse_args()
    t0 = time.perf_counter()
    _load_cached.cache_clear()
    reg = load_registry()
    t_load = time.perf_counter() - t0
    metrics = verl_dict()
    # the floor: renaming the same dict with a prepared {old: new} table (what a hand-written map costs)
    table = Translator("verl@v0.7.0", "canonical", registry=reg).translate(metrics).renamed
    plain, plain99 = measure(lambda: {table.get(k, k): v for k, v in metrics.items()}, args.calls)
    rows = []
    for target in ("canonical", "trl/grpo@1.16.0"):
        t0 = time.perf_counter()
        tr = Translator("verl@v0.7.0", target, registry=reg)
        first = tr.translate(metrics)
        t_first = time.perf_counter() - t0
        med, p99 = measure(lambda: tr.translate(metrics), args.calls)
        rows.append((f"Translator -> {target}", len(metrics), first.mapped, len(first.unmapped), t_first * 1e3,
                     med, p99))
    clash = clash_dict()
    tr = Translator("verl@v0.7.0", "canonical", registry=reg)
    first_clash = tr.translate(clash)
    med, p99 = measure(lambda: tr.translate(clash), args.calls)
    rows.append(("Translator -> canonical, one clash (two names, two values)", len(clash), first_clash.mapped,
                 len(first_clash.unmapped), 0.0, med, p99))
    translate(metrics, source="verl@v0.7.0")           # compiled once, as any first call
    med, p99 = measure(lambda: translate(metrics, source="verl@v0.7.0"), max(args.calls // 5, 100))
    rows.append(("translate() one-shot -> canonical", len(metrics), first.mapped, len(first.unmapped), 0.0, med, p99))
    auto = Translator("auto", "canonical", registry=reg)
    t0 = time.perf_counter()
    auto.translate(metrics)
    t_auto = (time.perf_counter() - t0) * 1e3
    print(f"mappings loaded and validated in {t_load * 1e3:.0f} ms (once per process)\n")
    print("| veRL dict | keys | mapped | unmapped | first call (compile), ms | median, us | p99, us | "
          "x plain dict rename |")
    print("|---|---|---|---|---|---|---|---|")
    print(f"| plain dict rename (prepared table) | {len(metrics)} | | | | {plain:.1f} | {plain99:.1f} | 1.0 |")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]} | {r[4]:.2f} | {r[5]:.1f} | {r[6]:.1f} | {r[5] / plain:.1f} |")
    reused = rows[0][5]
    print(f"\none-shot translate() / reused Translator: {rows[-1][5] / reused:.2f}x (target <= 2x); "
          f"Translator / plain rename: {reused / plain:.1f}x (target <= 4x)")
    print(f"auto-detection on the first dict: {t_auto:.2f} ms (once per run, again only when new keys appear)")
    startup()


def _fresh(code: str, env: dict) -> float:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def startup() -> None:
    """Loading the mappings in a new process (parsing and checking the YAML vs the compiled cache) and a whole
    `trackbridge detect FILE` command on a small file, best of 5."""
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": str(root)}
    with tempfile.TemporaryDirectory() as cache:
        env["TRACKBRIDGE_CACHE_DIR"] = cache
        code = ("import time; t = time.perf_counter(); from trackbridge.schema.loader import load_registry; "
                "load_registry(); print(time.perf_counter() - t)")
        cold = min(_fresh(code, {**env, "TRACKBRIDGE_NO_CACHE": "1"}) for _ in range(3))
        _fresh(code, env)                                   # writes the cache
        warm = min(_fresh(code, env) for _ in range(5))
        cmd = [sys.executable, "-m", "trackbridge", "detect", str(root / "examples" / "verl_console.log")]
        runs = []
        for _ in range(5):
            t = time.perf_counter()
            subprocess.run(cmd, capture_output=True, env=env, check=True)
            runs.append(time.perf_counter() - t)
    print("\n| start-up (new process) | seconds |\n|---|---|")
    print(f"| load the mappings: parse and check the YAML (no cache) | {cold:.3f} |")
    print(f"| load the mappings: compiled cache | {warm:.3f} (target <= 0.1) |")
    print(f"| `trackbridge detect examples/verl_console.log` (601 lines), whole command, best of 5 | "
          f"{min(runs):.3f} (target < 0.3) |")


if __name__ == "__main__":
    main()
