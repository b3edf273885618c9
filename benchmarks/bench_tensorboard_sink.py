"""Benchmark: trackbridge's TensorBoard sink vs a tensorboardX ``add_scalar`` loop.

Workload (default): 2,000 steps x 100 scalars = 200,000 points, as in the reference measurements. Both writers get
the same values and wall times; each timing includes opening, writing and closing (flushing) the event file. The
sink's file is read back with TensorBoard's own ``EventAccumulator`` to check that every point arrived.

    .venv/bin/python benchmarks/bench_tensorboard_sink.py [--steps 2000] [--keys 100] [--repeat 1]

Prints scalars/s for each writer and the ratio (target: the sink at least 5x faster).
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trackbridge.record import Record, RunInfo  # noqa: E402
from trackbridge.trackers.tensorboard.events import CRC_IMPLEMENTATION  # noqa: E402
from trackbridge.trackers.tensorboard.sink import TensorBoardSink  # noqa: E402


def workload(steps: int, keys: int) -> list[Record]:
    names = [f"train/metric_{i:03d}/mean" for i in range(keys)]
    t0 = 1_763_700_000.0
    return [Record(step=s, wall_time=t0 + s * 0.5, metrics={n: (s * keys + i) * 1e-3 for i, n in enumerate(names)})
            for s in range(steps)]


def run_tbx(records: list[Record], folder: Path) -> float:
    from tensorboardX import SummaryWriter

    t = time.perf_counter()
    w = SummaryWriter(str(folder))
    for rec in records:
        for k, v in rec.metrics.items():
            w.add_scalar(k, v, rec.step, walltime=rec.wall_time)
    w.close()
    return time.perf_counter() - t


def run_sink(records: list[Record], folder: Path, batch: int = 64) -> float:
    t = time.perf_counter()
    sink = TensorBoardSink(str(folder))
    sink.open(RunInfo(name="bench", run_id="bench"))
    for i in range(0, len(records), batch):
        sink.write(records[i:i + batch])
    sink.close()
    return time.perf_counter() - t


def check(folder: Path, steps: int, keys: int) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(str(folder / "bench"), size_guidance={"scalars": 0})
    ea.Reload()
    tags = ea.Tags()["scalars"]
    n = sum(len(ea.Scalars(t)) for t in tags)
    assert len(tags) == keys and n == steps * keys, (len(tags), n)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--keys", type=int, default=100)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--skip-tbx", action="store_true", help="time only the sink")
    args = ap.parse_args()
    records = workload(args.steps, args.keys)
    points = args.steps * args.keys
    tmp = Path(tempfile.mkdtemp(prefix="tb-bench-"))
    try:
        sink_times, tbx_times = [], []
        for r in range(args.repeat):
            sink_times.append(run_sink(records, tmp / f"sink{r}"))
            if not args.skip_tbx:
                tbx_times.append(run_tbx(records, tmp / f"tbx{r}"))
        check(tmp / "sink0", args.steps, args.keys)
        size = sum(p.stat().st_size for p in (tmp / "sink0" / "bench").iterdir())
        sink_t = statistics.median(sink_times)
        print(f"workload: {args.steps} steps x {args.keys} scalars = {points} points; crc32c: {CRC_IMPLEMENTATION}")
        print(f"trackbridge TensorBoardSink : {sink_t:8.3f} s  {points / sink_t:12,.0f} scalars/s  "
              f"({size / 1e6:.2f} MB, read back by EventAccumulator: ok)")
        if tbx_times:
            tbx_t = statistics.median(tbx_times)
            print(f"tensorboardX add_scalar loop: {tbx_t:8.3f} s  {points / tbx_t:12,.0f} scalars/s")
            print(f"ratio (sink / tensorboardX): {tbx_t / sink_t:.1f}x")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    main()
