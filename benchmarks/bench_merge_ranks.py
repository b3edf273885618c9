"""What rank 0's merger costs while the ranks are idle (issue 34 item 4): CPU seconds per wall second inside rank 0's
process, for 8 / 64 / 256 / 1,024 rank files that exist and do not grow (ranks between logging steps), measured on
trackbridge's own :class:`~trackbridge.logger.ranks.Merger` thread, against the way it polled before: opening,
seeking and reading every rank's file every 50 ms (the baseline, run here the same way on the same files).

The merger now stats each file (no open) and doubles its poll interval up to 1 s while nothing arrives, so its idle
cost no longer grows as ranks x 20 opens per second. The load average is printed: on a shared machine compare the
ratios, not the CPU shares.

    .venv/bin/python benchmarks/bench_merge_ranks.py [--ranks 8,64,256,1024] [--seconds 5]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trackbridge.logger.ranks import Merger, rank_path  # noqa: E402


def _files(folder: Path, n: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for r in range(n):
        rank_path(folder, r).write_text('{"step": 0, "wall_time": 0.0, "metrics": {"x": 1.0}}\n')


def _cpu_share(seconds: float, start, stop) -> float:
    """Process CPU seconds per wall second while the poller runs (nothing else runs in this process)."""
    start()
    time.sleep(0.5)                                  # past the first reads
    c0, t0 = time.process_time(), time.monotonic()
    time.sleep(seconds)
    cpu, wall = time.process_time() - c0, time.monotonic() - t0
    stop()
    return cpu / wall


def merger_share(folder: Path, n: int, seconds: float) -> float:
    m = Merger(folder, n, emit=lambda *a: None, reduction=lambda k: (None, True), rank_timeout=3600.0)
    return _cpu_share(seconds, m.start, lambda: (m._stop.set(), m.thread.join()))


def baseline_share(folder: Path, n: int, seconds: float) -> float:
    paths = [rank_path(folder, r) for r in range(n)]
    offsets = {p: p.stat().st_size for p in paths}
    done = threading.Event()

    def loop() -> None:                              # the previous poll: open, seek, read every file every 50 ms
        while not done.wait(0.05):
            for p in paths:
                with open(p, "rb") as fh:
                    fh.seek(offsets[p])
                    fh.read()
    t = threading.Thread(target=loop, daemon=True)
    return _cpu_share(seconds, t.start, lambda: (done.set(), t.join()))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", default="8,64,256,1024")
    ap.add_argument("--seconds", type=float, default=5.0)
    args = ap.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    print(f"{'ranks':>6} {'baseline CPU %':>15} {'merger CPU %':>13} {'ratio':>7}")
    with tempfile.TemporaryDirectory() as d:
        for n in (int(x) for x in args.ranks.split(",")):
            folder = Path(d) / f"r{n}"
            _files(folder, n)
            base = baseline_share(folder, n, args.seconds)
            mine = merger_share(folder, n, args.seconds)
            print(f"{n:>6} {100 * base:>15.2f} {100 * mine:>13.2f} {base / max(mine, 1e-9):>7.1f}x")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
