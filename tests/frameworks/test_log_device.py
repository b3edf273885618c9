"""``log()`` reads accelerator tensors without synchronising the GPU (issue 24), and what it logs is the value at
the time of ``log()``.

On every machine: the deferred path itself, with CPU tensors routed through it (``trackbridge.logger.device.
deferred`` patched to say yes to any tensor): 0-d tensors of several dtypes (float32, bfloat16, float64, int64, bool), a
1-d tensor (a histogram), tensors nested in a dict and requiring grad, a complex one (left out, reported); every
tensor updated in place right after ``log()``; calls with and without tensors interleaved. After ``finish()`` the
spool holds every call, in order, with the values as they were at ``log()``. The same through
``init(merge_ranks=True)`` (a rank's file). And CPU tensors without the patch are read at once, as before (in one
batch now), with the same values and types as one by one.

Where CUDA is present: the same with CUDA tensors on the current stream, and ``log()`` returns while the GPU is
still busy with a long kernel queued before it (it never waits for the GPU), the value still the one at ``log()``.
"""
from __future__ import annotations

import math
import time

import pytest

import trackbridge
import trackbridge.logger.device as device_mod
from trackbridge.stream import read_stream

torch = pytest.importorskip("torch")

CUDA = torch.cuda.is_available()


def _init(tmp_path, **kw):
    """``trackbridge.init`` for these tests: ``kw`` holds init's keywords and LoggerOptions' knobs alike."""
    return trackbridge.init(project="p", name="dev", sinks=[], spool=str(tmp_path / "spool"), run_id="dev-run",
                            source="canonical", **trackbridge.LoggerOptions.fold({"derive": False, "writer": "thread",
                                                                                   **kw}))


def _calls(device: str) -> tuple[list[tuple[dict, int]], list[dict]]:
    """The calls to make (metrics, step) and, for each, what must be logged (taken before anything is updated)."""
    calls, want = [], []
    for step in range(30):
        loss = torch.tensor(0.5 + step, device=device)                       # float32
        half = torch.tensor(1.0 / 3 + step, dtype=torch.bfloat16, device=device)
        exact = torch.tensor(math.pi * step, dtype=torch.float64, device=device)
        count = torch.tensor(2 ** 40 + step, dtype=torch.int64, device=device)  # beyond float32, within int64
        flag = torch.tensor(step % 2 == 0, device=device)
        hist = torch.arange(step + 1, dtype=torch.float32, device=device) / 4
        grad = torch.tensor(float(step), device=device, requires_grad=True) * 2
        metrics = {"loss/total": loss, "custom/half": half, "custom/exact": exact, "custom/count": count,
                   "custom/flag": flag, "custom/hist": hist, "nested": {"grad": grad}, "lr": 1e-4 * step}
        expect = {"loss/total": float(loss.float().cpu()), "custom/half": float(half.float().cpu()),
                  "custom/exact": float(exact.cpu()), "custom/count": 2 ** 40 + step, "custom/flag": int(step % 2 == 0),
                  "custom/hist": hist.cpu().tolist(), "nested/grad": float(step) * 2,
                  "lr": 1e-4 * step}
        calls.append((metrics, step))
        want.append(expect)
        if step % 3 == 0:          # a call without tensors in between: order is kept
            calls.append(({"custom/plain": float(step)}, step))
            want.append({"custom/plain": float(step)})
    return calls, want


def _run_calls(run, calls) -> None:
    for metrics, step in calls:
        run.log(metrics, step=step)
        with torch.no_grad():                  # the training loop goes on: every tensor changes in place
            for v in list(metrics.values()) + list(metrics.get("nested", {}).values()):
                if isinstance(v, torch.Tensor):
                    if v.dtype == torch.bool:
                        v.logical_not_()
                    else:
                        v.add_(100)


def _check(spool, want) -> None:
    got = [r for _, r in read_stream(spool)]
    assert len(got) == len(want), f"{len(got)} records for {len(want)} calls"
    for rec, exp in zip(got, want):
        for k, v in exp.items():
            value = rec.metrics[k]
            if isinstance(v, list):
                assert value.values == v, (rec.step, k)
            else:
                assert value == v and type(value) is type(v), (rec.step, k, value, v)


@pytest.fixture
def deferred_on_cpu(monkeypatch):
    """Route CPU tensors through the deferred path (the one CUDA tensors take)."""
    monkeypatch.setattr(device_mod, "deferred", lambda t: True)


@pytest.mark.filterwarnings("ignore:trackbridge. metric 'custom/complex'")
def test_deferred_path_logs_the_value_at_log_time_in_order(tmp_path, deferred_on_cpu):
    calls, want = _calls("cpu")
    run = _init(tmp_path)
    _run_calls(run, calls)
    c = torch.tensor(1 + 2j)
    run.log({"custom/complex": c, "custom/ok": torch.tensor(7.0)}, step=99)
    want.append({"custom/ok": 7.0})
    assert run._device is not None               # the calls went through the reader thread
    st = run.finish()
    _check(tmp_path / "spool" / "dev-run.jsonl", want)
    last = [r for _, r in read_stream(tmp_path / "spool" / "dev-run.jsonl")][-1]
    assert "custom/complex" not in last.metrics
    assert any("'custom/complex'" in p and "complex" in p for p in st["problems"]), st["problems"]


def test_deferred_path_many_scalars_of_one_dtype(tmp_path, deferred_on_cpu):
    """The common case, one stack for all: K=64 views of one tensor (``unbind``), the tensor then overwritten in
    place; and a call whose first tensor is 0-d but another is not (stack refuses it: the general path)."""
    names = [f"custom/m{j:02d}" for j in range(64)]
    run = _init(tmp_path)
    want = []
    for step in range(10):
        stats = torch.arange(64, dtype=torch.float32) + step
        run.log(dict(zip(names, stats.unbind())), step=step)
        want.append({n: float(j + step) for j, n in enumerate(names)})
        stats.mul_(-1)                                   # every logged view changes now
    run.log({"custom/a": torch.tensor(1.0), "custom/b": torch.tensor([2.0, 3.0])}, step=10)
    want.append({"custom/a": 1.0, "custom/b": [2.0, 3.0]})
    run.finish()
    _check(tmp_path / "spool" / "dev-run.jsonl", want)


@pytest.mark.filterwarnings("ignore:trackbridge. metric 's'")
def test_cpu_tensors_are_still_read_at_once(tmp_path):
    """Read in log() (no reader thread), in one batch, each value and type exactly what reading it alone gives."""
    from trackbridge.record.values import normalize
    tensors = {"a": torch.tensor(1.5), "b": torch.tensor(1 / 3, dtype=torch.bfloat16), "c": torch.tensor(2 ** 60),
               "d": torch.tensor(True), "e": torch.tensor(0.1, dtype=torch.float64, requires_grad=True) * 3,
               "f": torch.arange(3.0), "g": torch.arange(4), "h": torch.tensor(float("nan")),
               "i": torch.tensor([1.0, float("inf"), 2.0]), "j": torch.tensor(7, dtype=torch.int8),
               "k": torch.zeros(2, 2, dtype=torch.float16)}
    alone = {k: normalize(v, k) for k, v in tensors.items()}
    tensors["s"] = torch.tensor([1.0, 2.0]).to_sparse()       # no readable data: left out, said why
    run = _init(tmp_path)
    run.log(dict(tensors), step=0)
    tensors["a"].add_(1)
    assert run._device is None                   # no reader thread: the values were read in log()
    st = run.finish()
    rec = [r for _, r in read_stream(tmp_path / "spool" / "dev-run.jsonl")][0]
    assert "s" not in rec.metrics and any(p.startswith("metric 's'") for p in st["problems"]), st["problems"]
    for k, want in alone.items():
        got = rec.metrics[k]
        if isinstance(want, float) and math.isnan(want):
            assert math.isnan(got)
        elif hasattr(want, "values"):
            assert (got.values, got.nonfinite, got.num) == (want.values, want.nonfinite, want.num), k
        else:
            assert got == want and type(got) is type(want), (k, got, want)


def test_deferred_path_through_merged_ranks(tmp_path, deferred_on_cpu):
    run = _init(tmp_path, merge_ranks=True, rank=0, world_size=1)
    for step in range(5):
        t = torch.tensor(float(step), dtype=torch.float64)
        run.log({"policy/entropy": t}, step=step, weights={"policy/entropy": torch.tensor(3)})
        t.add_(100)
    run.finish()
    got = [(r.step, r.metrics["policy/entropy"]) for _, r in read_stream(tmp_path / "spool" / "dev-run.jsonl")]
    assert got == [(s, float(s)) for s in range(5)]


@pytest.mark.skipif(not CUDA, reason="no CUDA device on this machine (the deferred path is tested on CPU above)")
def test_cuda_tensors_are_read_without_waiting_for_the_gpu(tmp_path):
    calls, want = _calls("cuda")
    run = _init(tmp_path)
    _run_calls(run, calls)
    # a kernel that keeps the GPU busy for a while, then a value computed after it: log() must not wait for it
    x = torch.ones((), device="cuda")
    torch.cuda._sleep(int(2e9))                  # ~1 s of GPU cycles on current GPUs
    y = x * 3
    t0 = time.perf_counter()
    run.log({"custom/after_sleep": y}, step=1000)
    took = time.perf_counter() - t0
    y.add_(1)
    assert took < 0.1, f"log() took {took:.3f} s: it waited for the GPU"
    want.append({"custom/after_sleep": 3.0})
    run.finish()
    _check(tmp_path / "spool" / "dev-run.jsonl", want)
