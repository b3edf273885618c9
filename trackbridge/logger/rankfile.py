"""Each rank's own file of ``init(merge_ranks=True)`` (:mod:`.ranks`): where it lies
(``<spool>/<run_id>.ranks/rank-<r>.jsonl``), the run id every rank shares, and :class:`RankFile`, the thread of a rank
that appends what it logs there."""
from __future__ import annotations

import os
import queue
import threading
import time
from pathlib import Path
from typing import Any, Callable

from ..errors import UsageError
from ..record import dumps, encode_value
from ..record.ranked import split_weighted
from ..stream import SUFFIX, stream_file
from .checks import validate_call
from .common import STOP, warn
from .device import capture_or_read


def ranks_folder(spool_dir: Path, run_id: str) -> Path:
    """Where the ranks' files of run ``run_id`` live: beside its spool file."""
    return stream_file(spool_dir, run_id).with_suffix(".ranks")


def rank_path(folder: Path, rank: int) -> Path:
    return folder / f"rank-{rank:05d}{SUFFIX}"


def shared_run_id(run_id: str | None) -> str:
    """The run id every rank agrees on: the one given, else torchrun's ``TORCHELASTIC_RUN_ID``."""
    if run_id:
        return run_id
    env = os.environ.get("TORCHELASTIC_RUN_ID", "")
    if env and env != "none":
        return env
    raise UsageError("init(merge_ranks=True) needs run_id=, the same on every rank (or torchrun's "
                     "TORCHELASTIC_RUN_ID), so that rank 0 finds the other ranks' files")


# ------------------------------------------------------------------------------------------------- one rank's file
class RankFile:
    """One rank's file: :meth:`log` validates and queues (never waits on the disk), a thread appends the lines and
    hands them to the operating system at most ``flush_interval / 2`` seconds after they were logged."""

    def __init__(self, folder: Path, rank: int, world_size: int, run_id: str, *, flush_interval: float = 1.0,
                 report: Callable[[list[str]], None] | None = None) -> None:
        self.path = rank_path(folder, rank)
        self.rank = rank
        self.report = report or _warn_each
        self.next_step = 0
        self.closed = False
        self._q: queue.Queue = queue.Queue()
        self._latency = flush_interval / 2
        folder.mkdir(parents=True, exist_ok=True)
        self._fh = open(self.path, "ab")
        head = {"type": "ranks", "rank": rank, "world_size": world_size, "run_id": run_id, "pid": os.getpid(),
                "opened": time.time()}
        self._fh.write(("\n" if self._fh.tell() and not self._ends_with_newline() else "").encode()
                       + (dumps(head) + "\n").encode("utf-8"))
        self._fh.flush()
        self._thread = threading.Thread(target=self._main, name=f"trackbridge-rank{rank}", daemon=True)
        self._thread.start()

    def _ends_with_newline(self) -> bool:
        with open(self.path, "rb") as fh:
            fh.seek(-1, os.SEEK_END)
            return fh.read(1) == b"\n"

    def log(self, metrics: Any, step: Any, weights: dict[str, Any] | None, wall_time: float) -> None:
        if not isinstance(metrics, dict):
            validate_call(metrics, step)           # raises the TypeError log() raises for a non-dict
        values, shares, problems = split_weighted(metrics, weights)
        later: list[tuple[str, Any]] = []        # torch tensors: read in one batch (CUDA: by the writer thread)
        values, more, as_int = validate_call(values, step, defer=later)
        problems += more
        if problems:
            self.report(problems)
        if self.closed:
            raise RuntimeError("log() after finish()")
        if as_int is None:
            as_int = self.next_step
        self.next_step = max(self.next_step, as_int + 1)
        line: dict[str, Any] = {"step": as_int, "wall_time": wall_time, "metrics": values}
        kept = {k: list(s) for k, s in shares.items() if k in values}
        if kept:
            line["shares"] = kept
        self._q.put((capture_or_read(later, values, self.report), line))

    def _main(self) -> None:
        while True:
            item = self._q.get()
            batch = [item]
            end = time.monotonic() + self._latency
            while item is not STOP:
                try:
                    item = self._q.get(timeout=max(0.0, end - time.monotonic()))
                except queue.Empty:
                    break
                batch.append(item)
            stop = batch[-1] is STOP
            lines = []
            for got in batch:
                if got is STOP:
                    continue
                pending, line = got
                if pending is not None:          # device tensors: wait for their copy (this thread only)
                    try:
                        pending.wait()
                        pending.resolve(line["metrics"])
                    except Exception as exc:
                        warn(f"trackbridge: reading logged device tensors failed ({type(exc).__name__}: {exc}); "
                             f"they are left out of step {line['step']}")
                        for name, *_ in pending.layout:
                            line["metrics"].pop(name, None)
                    if pending.problems:
                        self.report(pending.problems)
                line["metrics"] = {k: encode_value(v) for k, v in line["metrics"].items()}
                lines.append(line)
            try:
                if lines:
                    self._fh.write("".join(self._dump(x) for x in lines).encode("utf-8"))
                if stop:
                    self._fh.write((dumps({"type": "end", "at": time.time()}) + "\n").encode("utf-8"))
                self._fh.flush()
            except (OSError, ValueError) as exc:
                warn(f"trackbridge: cannot write {self.path}: {exc}; this rank's shares are lost from here on")
                return
            if stop:
                self._fh.close()
                return

    @staticmethod
    def _dump(line: dict[str, Any]) -> str:
        try:
            return dumps(line) + "\n"
        except (TypeError, ValueError):         # a value that is not strict JSON: left out, the line kept
            line["metrics"] = {k: v for k, v in line["metrics"].items() if _jsonable(v)}
            return dumps(line) + "\n"

    def close(self, timeout: float = 30.0) -> None:
        """Write what is queued and the end line (the merger then knows this rank is done)."""
        if self.closed:
            return
        self.closed = True
        self._q.put(STOP)
        self._thread.join(timeout)


def _warn_each(problems: list[str]) -> None:
    for p in problems:
        warn(f"trackbridge: {p}; the value was left out")


def _jsonable(v: Any) -> bool:
    try:
        dumps(v)
        return True
    except (TypeError, ValueError):
        return False

__all__ = ["RankFile", "rank_path", "ranks_folder", "shared_run_id"]
