"""Run every benchmark in this folder, one after the other, each in its own process (``make bench``).

The logger and migration benchmarks take a few minutes at full size; pass ``--quick`` for a smaller workload.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
QUICK = {
    "bench_logger.py": ["--steps", "300"],
    "bench_migrate.py": ["--tags", "100", "--steps", "500"],
    "bench_tensorboard_sink.py": [],
    "bench_translate.py": ["--calls", "2000"],
    "bench_derive.py": ["--n", "5000", "--steps", "500"],
    "bench_pipeline.py": ["--records", "2000", "--rounds", "3"],
    "bench_load.py": ["--runs", "3"],
    "bench_training_loop.py": ["--steps", "300", "--rounds", "1"],
    "bench_migrate_bulk.py": ["--runs", "40", "--steps", "50", "--keys", "10"],
    "bench_merge_ranks.py": ["--ranks", "8,64", "--busy", "3", "--idle", "2"],
}


def main() -> int:
    quick = "--quick" in sys.argv[1:]
    failed = []
    for name in ("bench_load.py", "bench_translate.py", "bench_derive.py", "bench_pipeline.py",
                 "bench_tensorboard_sink.py", "bench_logger.py", "bench_training_loop.py", "bench_migrate.py",
                 "bench_migrate_bulk.py", "bench_merge_ranks.py"):
        print(f"\n=== {name}{' (quick)' if quick else ''}", flush=True)
        args = QUICK[name] if quick else []
        if subprocess.call([sys.executable, str(HERE / name), *args]) != 0:
            failed.append(name)
    if failed:
        print(f"\nfailed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
