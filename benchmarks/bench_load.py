"""How long a new process takes to get the mappings, and a whole small CLI command.

Run: .venv/bin/python benchmarks/bench_load.py [--runs N]
Each figure is measured in a fresh Python process (best of N), with a throw-away cache directory:

* the registry parsed with PyYAML's pure-Python loader, no compiled cache (how it was);
* the registry parsed with libyaml (yaml.CSafeLoader), no compiled cache (TRACKBRIDGE_NO_CACHE=1: a first run);
* the registry read from the compiled cache (every later run);
* `trackbridge --help` and `trackbridge detect examples/verl_console.log`, whole commands, with a warm cache.

The load figures include importing trackbridge (what a script pays before its first translation).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_LOAD = ("import time; t = time.perf_counter(); {setup}from trackbridge.schema.loader import load_registry; "
         "load_registry(); print(time.perf_counter() - t)")
_PURE = "import trackbridge.schema.yamlfile as y; y._Loader = y._PyLoader; "


def _load_time(setup: str, env: dict) -> float:
    out = subprocess.run([sys.executable, "-c", _LOAD.format(setup=setup)], capture_output=True, text=True,
                         env=env, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def _command_time(args: list[str], env: dict) -> float:
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "trackbridge", *args], capture_output=True, env=env, check=True, cwd=ROOT)
    return time.perf_counter() - t


def _timed(cmd: list[str], env: dict) -> float:
    t = time.perf_counter()
    subprocess.run(cmd, capture_output=True, env=env, check=False)
    return time.perf_counter() - t


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    runs = max(args.runs, 1)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    env.pop("TRACKBRIDGE_NO_CACHE", None)
    import yaml
    libyaml = bool(getattr(yaml, "__with_libyaml__", False))
    with tempfile.TemporaryDirectory() as cache:
        env["TRACKBRIDGE_CACHE_DIR"] = cache
        off = {**env, "TRACKBRIDGE_NO_CACHE": "1"}
        pure = min(_load_time(_PURE, off) for _ in range(min(runs, 3)))
        clib = min(_load_time("", off) for _ in range(runs)) if libyaml else None
        _load_time("", env)                                     # compiles and writes the cache
        warm = min(_load_time("", env) for _ in range(runs))
        python = min(_timed([sys.executable, "-c", "pass"], env) for _ in range(runs))
        helptime = min(_command_time(["--help"], env) for _ in range(runs))
        log = ROOT / "examples" / "verl_console.log"
        detect_cold = min(_command_time(["detect", str(log)], off) for _ in range(min(runs, 3)))
        detect = min(_command_time(["detect", str(log)], env) for _ in range(runs))
    print(f"best of {runs} fresh processes; libyaml available: {libyaml}\n")
    print("| start-up (new process) | seconds | target |")
    print("|---|---|---|")
    print(f"| registry: pure-Python YAML, no cache | {pure:.3f} | |")
    print(f"| registry: libyaml (CSafeLoader), no cache (first run) | "
          f"{'n/a (PyYAML without libyaml)' if clib is None else f'{clib:.3f}'} | |")
    print(f"| registry: compiled cache (later runs) | {warm:.3f} | <= 0.1 |")
    print(f"| `python -c pass` (interpreter alone) | {python:.3f} | |")
    print(f"| `trackbridge --help` | {helptime:.3f} | |")
    print(f"| `trackbridge detect examples/verl_console.log`, no cache | {detect_cold:.3f} | |")
    print(f"| `trackbridge detect examples/verl_console.log`, warm cache | {detect:.3f} | < 0.3 |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
