"""Reading accelerator tensors without stopping the training loop (issue 24): ``log()`` never synchronises the GPU.

``float(t)``, ``t.item()``, ``t.tolist()`` or ``t.cpu()`` on a CUDA tensor make the Python thread wait until the GPU
has run everything queued before it (milliseconds per step for a training loop that keeps the GPU busy). Instead,
``log()`` hands every CUDA tensor of the call to :func:`capture`, which only **enqueues** work on the tensors' current
stream, so it runs after the kernels that computed them and before anything the loop enqueues later:

1. ``torch.stack`` of the call's 0-d tensors of one dtype (one kernel, whatever their number; 1-d and larger
   tensors, logged as histograms, are flattened and concatenated to it), cast to float64 (int64 for integer and bool
   tensors: exact), then
2. one non-blocking copy into pinned host memory (PyTorch's caching host allocator: no ``cudaHostAlloc`` per call),
3. one event recorded after the copy (``blocking=True``: a thread waiting on it sleeps instead of spinning a core).

That is three or four launches and no wait, whatever the number of metrics, and the stack is a copy made on the
stream at the time of ``log()``: an in-place update the loop enqueues afterwards (``loss.add_(1)``, an optimizer
step) cannot change what was logged. A thread (:class:`DeviceReader`) waits on the event (the GIL released), reads
the host buffer and puts the values in place; records leave it in the order of the ``log()`` calls, so once a run
has logged a device tensor every later call goes through it too (a call without one is not held back by anything
but the calls before it). ``finish()`` waits for it: nothing is lost.

Only CUDA tensors take this path (:func:`deferred`). The CPU tensors of a call are read at once, as before, but in
one batch too (one ``stack``: 256 of them cost 0.1 ms instead of 0.9 ms read one by one); NumPy values and numbers
are untouched. Imports nothing: torch is taken from ``sys.modules`` (a tensor was logged, so it is imported).
"""
from __future__ import annotations

import queue
import sys
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from ..record import Histogram
from ..record.values import normalize
from .common import STOP, warn

Item = tuple[Any, ...]      # (wall_time, step, values[, axis[, logged]]), as the run's inbox takes it


@dataclass
class Pending:
    """What one ``log()`` call enqueued: host buffers being filled, the events after the copies, and where each
    metric's values lie in the buffers."""

    host: dict[str, Any] = field(default_factory=dict)         # "f" (float64) / "i" (int64) -> pinned CPU tensor
    events: list[Any] = field(default_factory=list)
    layout: list[tuple[str, str, int, int, bool]] = field(default_factory=list)   # (name, kind, offset, n, scalar)
    problems: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)           # names left out (the problems say why)

    def wait(self) -> None:
        for ev in self.events:
            ev.synchronize()             # releases the GIL; a blocking event sleeps

    def resolve(self, values: dict[str, Any]) -> None:
        """Put the values read back into ``values`` (in place of the tensors)."""
        lists = {k: t.tolist() for k, t in self.host.items()}
        for name, kind, off, n, scalar in self.layout:
            data = lists[kind][off:off + n]
            if scalar:
                values[name] = data[0]
            else:
                values[name] = Histogram.from_values(data)
        for name in self.dropped:
            values.pop(name, None)


def capture(items: list[tuple[str, Any]]) -> Pending:
    """Enqueue the read-back of ``items`` (``(name, tensor)``, all on accelerators) without waiting (see the module
    docstring)."""
    torch = sys.modules["torch"]
    out = Pending()
    tensors = [t for _n, t in items]
    first = tensors[0]
    dtype = first.dtype
    with torch.no_grad():
        # the common case: 0-d tensors of one dtype on one device (stack refuses other shapes and several
        # devices: then the general case)
        if first.dim() == 0 and not dtype.is_complex and all(t.dtype is dtype for t in tensors):
            try:
                stacked = torch.stack(tensors)
            except RuntimeError:
                stacked = None
            if stacked is not None:
                kind = "f" if dtype.is_floating_point else "i"
                out.layout = [(n, kind, i, 1, True) for i, (n, _t) in enumerate(items)]
                _to_host(torch, out, kind, [(first.device, stacked)])
                return out
        return _capture_groups(torch, items, out)


def _capture_groups(torch: Any, items: list[tuple[str, Any]], out: Pending) -> Pending:
    """:func:`capture` for any mix: grouped by dtype and device, each group stacked (0-d) or flattened, cast to
    float64 / int64, each kind's groups one after the other in one host buffer, device by device."""
    groups: dict[tuple[Any, Any], list[tuple[str, Any]]] = {}
    devices: dict[Any, int] = {}
    for name, t in items:
        if t.is_complex():
            out.problems.append(f"metric {name!r}: complex value of type {t.dtype} cannot be stored")
            out.dropped.append(name)
            continue
        devices.setdefault(t.device, len(devices))
        groups.setdefault((t.dtype, t.device), []).append((name, t))
    order = sorted(groups, key=lambda key: (not key[0].is_floating_point, devices[key[1]]))    # stable
    blocks: dict[str, list[tuple[Any, list[Any]]]] = {"f": [], "i": []}
    offset = {"f": 0, "i": 0}
    for key in order:
        dtype, device = key
        kind = "f" if dtype.is_floating_point else "i"
        members = groups[key]
        chunk = []
        scalars = [t for _n, t in members if t.dim() == 0]
        if scalars:
            chunk.append(torch.stack(scalars))          # one kernel for all of them: a copy made now
        for n, t in members:
            if t.dim() == 0:
                out.layout.append((n, kind, offset[kind], 1, True))
                offset[kind] += 1
        for n, t in members:
            if t.dim() != 0:
                flat = t.reshape(-1)
                chunk.append(flat)
                out.layout.append((n, kind, offset[kind], flat.numel(), False))
                offset[kind] += flat.numel()
        joined = chunk[0] if len(chunk) == 1 and scalars else torch.cat(chunk)     # a new tensor either way
        same = blocks[kind] and blocks[kind][-1][0] == device
        if same:
            blocks[kind][-1][1].append(joined)
        else:
            blocks[kind].append((device, [joined]))
    for kind, per_device in blocks.items():
        if per_device:
            _to_host(torch, out, kind, [(d, parts[0] if len(parts) == 1 else torch.cat(
                [p.to(torch.float64 if kind == "f" else torch.int64) for p in parts])) for d, parts in per_device])
    return out


def _to_host(torch: Any, out: Pending, kind: str, per_device: list[tuple[Any, Any]]) -> None:
    """Cast each device's block to float64 (int64), copy the blocks one after the other into one host buffer
    (pinned when a device is CUDA) without blocking, and record an event after each CUDA copy."""
    target = torch.float64 if kind == "f" else torch.int64
    total = sum(t.numel() for _d, t in per_device)
    cuda = any(d.type == "cuda" for d, _t in per_device)
    host = torch.empty(total, dtype=target, pin_memory=cuda and torch.cuda.is_available())
    at = 0
    for device, t in per_device:
        n = t.numel()
        host[at:at + n].copy_(t.to(target), non_blocking=True)
        at += n
        if device.type == "cuda":
            ev = torch.cuda.Event(blocking=True)
            ev.record(torch.cuda.current_stream(device))
            out.events.append(ev)
    out.host[kind] = host


class DeviceReader:
    """The thread that waits for each call's copies and hands its record on, in call order (see the module
    docstring). ``forward(item)`` takes the finished ``(wall_time, step, values)``."""

    def __init__(self, forward: Callable[[Item], None], *, report: Callable[[list[str]], None] | None = None,
                 queue_size: int = 5000) -> None:
        self.forward = forward
        self.report = report
        self.queue: queue.Queue = queue.Queue(maxsize=queue_size)
        self.thread = threading.Thread(target=self._main, name="trackbridge-device-read", daemon=True)
        self.thread.start()

    def put(self, pending: Pending | None, item: Item) -> None:
        self.queue.put((pending, item))

    def _main(self) -> None:
        while True:
            got = self.queue.get()
            if got is STOP:
                return
            pending, item = got
            try:
                if pending is not None:
                    pending.wait()
                    pending.resolve(item[2])
                    if pending.problems and self.report is not None:
                        self.report(pending.problems)
            except Exception as exc:       # the values of this call are lost; say so, keep the others
                warn(f"trackbridge: reading logged device tensors failed ({type(exc).__name__}: {exc}); the "
                     f"tensors of the log() call at step {item[1]} were left out")
                for name, *_ in (pending.layout if pending is not None else []):
                    item[2].pop(name, None)
            self.forward(item)

    def close(self, timeout: float | None = None) -> None:
        """Hand on every call queued so far (their copies waited for), then stop."""
        self.queue.put(STOP)
        self.thread.join(timeout)


def deferred(tensor: Any) -> bool:
    """Whether a tensor is read by the reader thread (a CUDA tensor) rather than at once (the tests route CPU tensors
    through the thread by replacing this)."""
    return bool(tensor.is_cuda)


def hand_off(run: Any, later: list[tuple[str, Any]], item: Item) -> None:
    """``Run.log``'s hand-off when the call holds torch tensors (``later``) or device tensors were logged before:
    CPU tensors are read now, in one batch (one ``stack``, values as ``normalize`` reads them); CUDA tensors have
    their read-back enqueued (nothing waits) and the call goes to the run's reader thread, made on first use, which
    feeds the run's inbox in call order."""
    now = [x for x in later if not deferred(x[1])]
    dev = [x for x in later if deferred(x[1])] if len(now) != len(later) else []
    if now:
        read_now(now, item[2], run._report_values)
    if not dev and run._device is None:
        run._inbox.put(item)
        return
    if run._device is None:
        run._device = DeviceReader(run._inbox.put, report=run._report_values, queue_size=run.options.queue_size)
    run._device.put(capture_or_read(dev, item[2], run._report_values), item)


def read_now(items: list[tuple[str, Any]], values: dict[str, Any], report: Callable[[list[str]], None]) -> None:
    """Read CPU tensors at once, in one batch; tensors a stack cannot take (sparse, quantized ...) one by one, as
    before."""
    try:
        pending = capture(items)
        pending.resolve(values)
        if pending.problems:
            report(pending.problems)
        return
    except Exception:
        pass
    _one_by_one(items, values, report)


def _one_by_one(items: list[tuple[str, Any]], values: dict[str, Any], report: Callable[[list[str]], None]) -> None:
    problems: list[str] = []
    for name, t in items:
        try:
            values[name] = normalize(t, name)
        except ValueError as bad:
            problems.append(str(bad))
            values.pop(name, None)
    if problems:
        report(problems)


def capture_or_read(later: list[tuple[str, Any]], values: dict[str, Any],
                    report: Callable[[list[str]], None]) -> Pending | None:
    """:func:`capture`, or, should it fail (a tensor type it does not know), the tensors read at once as before
    (the loop waits for the GPU that once; a warning says why)."""
    if not later:
        return None
    try:
        return capture(later)
    except Exception as exc:
        warn(f"trackbridge: could not queue the read-back of device tensors ({type(exc).__name__}: {exc}); they "
             f"are read at once (a GPU sync) instead")
        _one_by_one(later, values, report)
        return None


__all__ = ["DeviceReader", "Pending", "capture", "capture_or_read", "deferred", "hand_off", "read_now"]
