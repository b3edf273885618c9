"""Benchmark: what logging K metrics held as 0-d tensors costs a training loop (issue 24), interleaved.

Each step does the loop's work (a chain of matrix products, ``--work-ms`` long on the device) and computes K metrics
as 0-d tensors of the result (two kernels and K views, in every mode alike), then logs them:

* ``none``: not logged (the reference);
* ``item``: ``{k: v.item() for ...}`` (K device syncs);
* ``stack``: ``torch.stack(values).tolist()`` (one sync);
* ``summarywriter``: ``SummaryWriter.add_scalar(k, v, step)`` per metric (torch's writer reads each value);
* ``trackbridge``: ``run.log({k: v ...}, step=step)`` into a spool (CUDA tensors take the deferred path: one stack,
  one non-blocking copy into pinned memory, one event, read by a thread; CPU tensors are read at once, in one
  stack);
* ``trackbridge-deferred`` (CPU only): the deferred path forced onto CPU tensors, to measure its Python side where
  no GPU exists (no CUDA launch or event costs in it).

The modes run one after the other within each round, rounds repeated (``--rounds``), so that drift of a shared
machine falls on every mode alike. Per step: the loop's cost over ``none`` (a round's time / steps, the device
synchronised at the round's end: work the GPU still owes counts), and the time spent inside the logging call itself
(median, p99). On a GPU, the goal is ``trackbridge`` <= 0.15 ms over ``none`` at K=64 (<= 0.3 ms at 256) and a
logging call that never waits for the GPU.

    .venv/bin/python benchmarks/bench_gpu_log.py [--device cuda|cpu] [--ks 16,64,256] [--steps 100] [--rounds 3]
        [--work-ms 8.5]
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

MODES = ("none", "item", "stack", "summarywriter", "trackbridge")


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def make_work(device: str, work_ms: float):
    """A step of work about ``work_ms`` long on ``device``: ``reps`` products of n x n matrices (calibrated)."""
    n = 2048 if device == "cuda" else 256
    a = torch.randn(n, n, device=device) / n ** 0.5
    b = torch.randn(n, n, device=device) / n ** 0.5

    def step(reps: int) -> torch.Tensor:
        x = a
        for _ in range(reps):
            x = x @ b
        return x

    for _ in range(3):                 # warm-up: the first products pay for allocation and kernel selection
        step(1)
    reps = 1
    while True:
        sync(device)
        t0 = time.perf_counter()
        for _ in range(5):
            step(reps)
        sync(device)
        per = (time.perf_counter() - t0) / 5 * 1000
        if per >= work_ms or reps > 4096:
            break
        reps = max(reps + 1, int(reps * work_ms / max(per, 1e-3)))
    return step, reps, per


def run_round(mode: str, k: int, steps: int, device: str, work, reps: int, tmp: Path) -> tuple[float, list[float]]:
    names = [f"custom/group_{j // 16:02d}/m{j:03d}" for j in range(k)]
    writer = run = None
    if mode == "summarywriter":
        from torch.utils.tensorboard import SummaryWriter
        writer = SummaryWriter(str(tmp / f"sw-{k}-{time.monotonic_ns()}"))
    elif mode.startswith("trackbridge"):
        import trackbridge
        run = trackbridge.init(project="bench", sinks=[], spool=str(tmp / "spool"), source="canonical",

                               options=trackbridge.LoggerOptions(derive=False),
                               run_id=f"{mode}-{k}-{time.monotonic_ns()}")
    inside: list[float] = []
    sync(device)
    t0 = time.perf_counter()
    for s in range(steps):
        out = work(reps)
        stats = out[:k].sum(dim=1)
        vals = stats.unbind()                         # K 0-d tensors
        if mode == "none":
            continue
        t = time.perf_counter()
        if mode == "item":
            _ = {n: v.item() for n, v in zip(names, vals)}
        elif mode == "stack":
            _ = dict(zip(names, torch.stack(vals).tolist()))
        elif mode == "summarywriter":
            for n, v in zip(names, vals):
                writer.add_scalar(n, v, s)
        else:
            run.log(dict(zip(names, vals)), step=s)
        inside.append(time.perf_counter() - t)
    sync(device)
    total = time.perf_counter() - t0
    if writer is not None:
        writer.close()
    if run is not None:
        run.finish()
    return total / steps, inside


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--ks", default="16,64,256")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--work-ms", type=float, default=None, help="device work per step (default 8.5 on CUDA, 2 on CPU)")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1: the logger's threads keep a "
                                                          "core on a 2-core machine)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    device = args.device
    work_ms = args.work_ms if args.work_ms is not None else (8.5 if device == "cuda" else 2.0)
    modes = list(MODES) + (["trackbridge-deferred"] if device == "cpu" else [])
    tmp = Path(tempfile.mkdtemp(prefix="bench-gpu-log-"))
    try:
        work, reps, per = make_work(device, work_ms)
        name = torch.cuda.get_device_name() if device == "cuda" else f"CPU ({os.cpu_count()} cores, torch threads " \
                                                                       f"{torch.get_num_threads()})"
        print(f"device: {name}; work per step {per:.2f} ms ({reps} products); {args.steps} steps x {args.rounds} "
              f"rounds, modes interleaved; load {os.getloadavg()[0]:.1f}\n")
        ks = [int(x) for x in args.ks.split(",")]
        res: dict[tuple[str, int], list[float]] = {}
        inside: dict[tuple[str, int], list[float]] = {}
        import trackbridge.logger.device as device_mod
        real = device_mod.deferred
        for k in ks:
            for mode in modes:        # warm-up (imports, allocator, pinned pool)
                device_mod.deferred = (lambda t: True) if mode == "trackbridge-deferred" else real
                run_round(mode, k, 5, device, work, reps, tmp)
            for _ in range(args.rounds):
                for mode in modes:
                    device_mod.deferred = (lambda t: True) if mode == "trackbridge-deferred" else real
                    per_step, ins = run_round(mode, k, args.steps, device, work, reps, tmp)
                    res.setdefault((mode, k), []).append(per_step)
                    inside.setdefault((mode, k), []).extend(ins)
            device_mod.deferred = real
        print("cost per step over `none`, ms (median of the rounds); the logging call itself: median / p99 ms\n")
        print("| K | " + " | ".join(m for m in modes if m != "none") + " |")
        print("|---|" + "---|" * (len(modes) - 1))
        for k in ks:
            base = statistics.median(res[("none", k)])
            cells = []
            for m in modes:
                if m == "none":
                    continue
                over = (statistics.median(res[(m, k)]) - base) * 1000
                ins = sorted(inside[(m, k)])
                med = statistics.median(ins) * 1000
                p99 = ins[int(0.99 * (len(ins) - 1))] * 1000
                cells.append(f"{over:+.3f} (call {med:.3f} / {p99:.3f})")
            print(f"| {k} | " + " | ".join(cells) + " |")
        print(f"\n`none`: {statistics.median(res[('none', ks[0])]) * 1000:.2f} ms per step")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
