"""What rank 0's merger costs (issue 34 item 4): CPU seconds per wall second inside rank 0's process, busy and idle,
at 8 / 64 / 256 / 1,024 simulated ranks, flat (rank 0 follows every rank's file) and with node pre-merge (8 ranks a
node: rank 0 follows its own node's 8 rank files and one file per other node; trackbridge/logger/nodes.py).

Three processes per measurement, so that ``time.process_time`` in rank 0's process is rank 0's cost alone:

* the ranks: one process appending to every rank's file what ``RankFile`` writes, ``--keys`` keys (15 weighted
  means, 2 weighted maxima, a count, a maximum and a learning rate without a weight) every step, ``--rate`` steps a
  second on every rank ("busy"), then nothing ("idle": ranks between logging steps, or waiting on a long step);
* the nodes' pre-mergers (node layout only): trackbridge's own ``PreMerger`` threads, one per node but node 0, in one
  process (on a real job each runs on its node's local rank 0);
* rank 0: trackbridge's own ``Merger`` thread (with its ``NodeWatch`` in the node layout), handing each merged step to
  a no-op.

Reported: rank 0's CPU share of one core busy and idle; busy, the steps rank 0 merged per second (``--rate`` when it
kept up; below it when the simulated pre-mergers, all in one process here, lag) and rank 0's CPU per rank per merged
step; idle, rank 0's CPU per rank per second. Flat per rank: those two stay the same from 8 to 1,024 ranks.
``--baseline`` also measures the idle poll against the one before it (opening and reading every file every 50 ms).
The load average is printed: on a shared machine compare ratios and per-rank figures, not CPU shares.

    .venv/bin/python benchmarks/bench_merge_ranks.py [--ranks 8,64,256,1024] [--busy 6] [--idle 4] [--rate 1]
                                                     [--baseline]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trackbridge.logger.nodes import Layout, NodeWatch, PreMerger  # noqa: E402
from trackbridge.logger.ranks import Merger, rank_path  # noqa: E402

PER_NODE = 8
_REDUCE = {"k15": ("max", True), "k16": ("max", True), "k17": ("sum", True), "k18": ("max", True),
           "k19": ("value", True)}


def _reduction(key: str) -> tuple[str | None, bool]:
    return _REDUCE.get(key, (None, True))


def _line_template(rank: int, keys: int) -> str:
    """One rank's line as RankFile writes it, with ``%d`` for the step (values differ by rank, not by step)."""
    metrics = {f"k{i:02d}": 0.1 + (rank * 7919 + i * 104729) % 1000 / 997 for i in range(keys)}
    shares = {f"k{i:02d}": [float(1 + (rank + i) % 50), None, None] for i in range(min(keys, 17))}
    if keys > 17:
        metrics["k17"] = 3 + rank % 5              # a count, no weight
    if keys > 19:
        metrics["k19"] = 1e-6                      # a learning rate, the same on every rank
    body = json.dumps({"wall_time": 0.0, "metrics": metrics, "shares": shares}, separators=(",", ":"))
    return '{"step":%d,' + body[1:].replace("%", "%%") + "\n"


# ------------------------------------------------------------------------------------------------- the roles
def _ranks_role(folder: Path, n: int, keys: int, rate: float, start: float, busy: float) -> None:
    templates = [_line_template(r, keys) for r in range(n)]
    paths = [rank_path(folder, r) for r in range(n)]
    handles = [open(p, "a") for p in paths]
    step = 0
    time.sleep(max(0.0, start - time.time()))
    end = start + busy
    while time.time() < end:
        t0 = time.time()
        for fh, tpl in zip(handles, templates):
            fh.write(tpl % step)
            fh.flush()
        step += 1
        time.sleep(max(0.0, 1.0 / rate - (time.time() - t0)))
    for fh in handles:
        fh.close()
    print(json.dumps({"steps": step}))


def _nodes_role(folder: Path, n: int, seconds: float) -> None:
    layout_nodes = n // PER_NODE
    mergers = [PreMerger(folder, n, Layout(PER_NODE, layout_nodes, g, 0), 3600.0) for g in range(1, layout_nodes)]
    for m in mergers:
        m.start()
    time.sleep(seconds)
    for m in mergers:
        m._stop.set()
    print(json.dumps({"nodes": len(mergers)}))


def _rank0_role(folder: Path, n: int, nodes: bool, start: float, busy: float, idle: float) -> None:
    merged: list[float] = []
    layout = Layout(PER_NODE, n // PER_NODE, 0, 0) if nodes else None
    m = Merger(folder, n, emit=lambda wall, step, values: merged.append(time.time()), reduction=_reduction,
               rank_timeout=3600.0, ranks=layout.ranks_of(0) if layout else None)
    if layout is not None:
        m.nodes = NodeWatch(m, layout, 3600.0)
    m.start()

    def window(t0: float, t1: float) -> tuple[float, int]:
        time.sleep(max(0.0, t0 - time.time()))      # one sleep each: this thread costs nothing in the window
        c0, w0, k0 = time.process_time(), time.monotonic(), len(merged)
        time.sleep(max(0.0, t1 - time.time()))
        return (time.process_time() - c0) / (time.monotonic() - w0), len(merged) - k0
    warm = 1.0                                       # past the first steps (the canonical names' first look-ups)
    busy_cpu, busy_steps = window(start + warm, start + busy)
    idle_cpu, _ = window(start + busy + 2.0, start + busy + 2.0 + idle)   # 2 s: the poll backs off to 1 s
    m._stop.set()
    m.thread.join()
    print(json.dumps({"busy": busy_cpu, "idle": idle_cpu, "rate": busy_steps / (busy - warm)}))


def measure(n: int, nodes: bool, args: argparse.Namespace) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as d:
        folder = Path(d)
        for r in range(n):
            rank_path(folder, r).write_text('{"type":"ranks","rank":%d}\n' % r)
        start = time.time() + 4.0 + n / 250          # the processes' imports and the pre-mergers' start first
        me = [sys.executable, __file__, "--role"]
        common = [str(folder), str(n)]
        procs = [subprocess.Popen(me + ["ranks", *common, str(args.keys), str(args.rate), str(start), str(args.busy)],
                                  stdout=subprocess.PIPE, text=True),
                 subprocess.Popen(me + ["rank0", *common, str(int(nodes)), str(start), str(args.busy), str(args.idle)],
                                  stdout=subprocess.PIPE, text=True)]
        if nodes:
            total = start - time.time() + args.busy + 2.0 + args.idle + 1.0
            procs.append(subprocess.Popen(me + ["nodes", *common, str(total)], stdout=subprocess.PIPE, text=True))
        outs = [p.communicate(timeout=600)[0] for p in procs]
        if any(p.returncode for p in procs):
            raise SystemExit(f"a role failed at {n} ranks: {[p.returncode for p in procs]}")
        got = json.loads(outs[1].strip().splitlines()[-1])
        got["written"] = json.loads(outs[0].strip().splitlines()[-1])["steps"] / args.busy
        return got


# ------------------------------------------------------------------------------------------------- the old poll
def _cpu_share(seconds: float, start: Callable[[], None], stop: Callable[[], None]) -> float:
    start()
    time.sleep(0.5)
    c0, t0 = time.process_time(), time.monotonic()
    time.sleep(seconds)
    cpu, wall = time.process_time() - c0, time.monotonic() - t0
    stop()
    return cpu / wall


def baseline(n: int, seconds: float) -> tuple[float, float]:
    """The idle poll before stat + backoff (open, seek, read every file every 50 ms) and the flat merger's now,
    in this process."""
    with tempfile.TemporaryDirectory() as d:
        folder = Path(d)
        for r in range(n):
            rank_path(folder, r).write_text('{"step": 0, "wall_time": 0.0, "metrics": {"x": 1.0}}\n')
        paths = [rank_path(folder, r) for r in range(n)]
        offsets = {p: p.stat().st_size for p in paths}
        done = threading.Event()

        def loop() -> None:
            while not done.wait(0.05):
                for p in paths:
                    with open(p, "rb") as fh:
                        fh.seek(offsets[p])
                        fh.read()
        t = threading.Thread(target=loop, daemon=True)

        def stop_loop() -> None:
            done.set()
            t.join()
        base = _cpu_share(seconds, t.start, stop_loop)
        m = Merger(folder, n, emit=lambda *a: None, reduction=lambda k: (None, True), rank_timeout=3600.0)

        def stop_merger() -> None:
            m._stop.set()
            m.thread.join()
        mine = _cpu_share(seconds, m.start, stop_merger)
        return base, mine


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--role":
        role, folder, count, *rest = sys.argv[2:]
        if role == "ranks":
            _ranks_role(Path(folder), int(count), int(rest[0]), float(rest[1]), float(rest[2]), float(rest[3]))
        elif role == "nodes":
            _nodes_role(Path(folder), int(count), float(rest[0]))
        else:
            _rank0_role(Path(folder), int(count), rest[0] == "1", float(rest[1]), float(rest[2]), float(rest[3]))
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", default="8,64,256,1024")
    ap.add_argument("--busy", type=float, default=6.0, help="seconds of logging (the first one is not measured)")
    ap.add_argument("--idle", type=float, default=4.0, help="seconds measured idle, after the logging")
    ap.add_argument("--rate", type=float, default=1.0, help="steps a second on every rank while busy")
    ap.add_argument("--keys", type=int, default=20)
    ap.add_argument("--baseline", action="store_true", help="also the idle poll before stat + backoff")
    args = ap.parse_args()
    try:
        sizes = [int(x) for x in args.ranks.split(",")]
    except ValueError:
        raise SystemExit(f"--ranks {args.ranks!r}: comma-separated numbers of ranks expected") from None
    if any(n < PER_NODE or n % PER_NODE for n in sizes) or args.busy <= 1 or args.rate <= 0 or args.keys < 1:
        raise SystemExit(f"--ranks: multiples of {PER_NODE}; --busy > 1 s; --rate > 0; --keys >= 1")
    print(f"load average before: {os.getloadavg()[0]:.2f}; {args.keys} keys, {args.rate:g} steps/s on every rank, "
          f"{PER_NODE} ranks a node")
    print(f"{'ranks':>6} {'layout':>6} {'busy CPU %':>10} {'merged/s':>8} {'µs/rank/step':>12} "
          f"{'idle CPU %':>10} {'idle µs/rank/s':>14}")
    for n in sizes:
        for nodes in (False, True):
            got = measure(n, nodes, args)
            per_step = 1e6 * got["busy"] / (n * got["rate"]) if got["rate"] else float("nan")
            print(f"{n:>6} {'nodes' if nodes else 'flat':>6} {100 * got['busy']:>10.2f} {got['rate']:>8.2f} "
                  f"{per_step:>12.1f} {100 * got['idle']:>10.3f} {1e6 * got['idle'] / n:>14.2f}", flush=True)
    if args.baseline:
        print(f"\n{'ranks':>6} {'previous poll CPU %':>20} {'merger CPU %':>13} (idle, flat)")
        for n in sizes:
            base, mine = baseline(n, 3.0)
            print(f"{n:>6} {100 * base:>20.2f} {100 * mine:>13.2f}")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
