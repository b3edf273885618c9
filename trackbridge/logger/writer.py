"""Trackers in a writer process fed from the spool: ``init(..., writer="process")``.

The training process then does only what the spool needs (validate, translate, derive, append a line); the
trackers' clients, their serialisation and their I/O run in a child process with its own interpreter, so they never
take the GIL from training. The child follows the spool as the parent appends it
(:class:`trackbridge.stream.StreamTail`: complete lines only, numbered as every reader of the stream numbers them) and
feeds the same :class:`~.tracker.TrackerWorker` s the threads use, with the same catch-up, recovery and pending-note
rules. Parent and child talk through one pipe: the parent
sends what it learns while logging (detected source, approximations) and, at ``finish()``, the last record number
and how the run ended; the child sends each tracker's status and what each tracker holds on resume. If the parent
dies, the child writes what the spool holds and exits.
"""
from __future__ import annotations

import copy
import threading
import time
from pathlib import Path
from typing import Any

from ..pipeline import names_translator
from ..record import Record, RunInfo
from ..stream import StreamTail
from .common import warn
from .options import LoggerOptions
from .tracker import TrackerWorker
from .worker import RunContext, sync_run_info

STATUS_EVERY = 0.2
_HELD_LOCKS: list[Any] = []


def writer_main(conn: Any, spec: dict[str, Any]) -> None:
    """The child process: build the trackers, follow the spool, report, stop when told (or when the parent is
    gone and the spool is read to its end)."""
    from ..trackers import make_sink

    options = LoggerOptions(**spec["options"])
    info = RunInfo.from_json(spec["info"])
    problems: list[str] = []
    rename = names_translator(spec["names"], mappings=spec["mappings"], config=info.config,
                              origin=lambda: info.source, fidelity=info.approximate)
    tail = StreamTail(Path(spec["spool_path"]), spec["seq_base"])      # wait_written as the spool worker

    def approximate(is_spool: bool) -> dict[str, str]:
        pipe = rename.pipeline() if rename is not None else None
        return dict(info.approximate) if pipe is None else dict(pipe.stats.approximate)

    def tracker_info(is_spool: bool) -> RunInfo:
        out = copy.deepcopy(info)
        out.names = spec["names"]
        out.approximate = approximate(is_spool)
        return out

    def sync_info(run: RunInfo | None, is_spool: bool) -> None:
        sync_run_info(run, info, approximate(is_spool))

    warned: list[str] = []       # the trackers' warnings: the parent warns them, where the user sees warnings
    _forward_warnings(warned)
    _one_writer_per_run(tail.path)
    ctx = RunContext(options=options, spool_path=tail.path, seq_base=spec["seq_base"], resume=spec["resume"],
                     resume_last_step=spec["resume_last_step"], tracker_info=tracker_info, sync_info=sync_info,
                     report=problems.append, spool=tail)
    workers = [TrackerWorker(ctx, make_sink(s), queue_size=options.queue_size, batch_size=options.batch_size,
                             rename=rename) for s in spec["sinks"]]
    for w in workers:
        w.thread.start()

    sent = [0]

    def report(final: bool = False) -> None:
        new = warned[sent[0]:]
        conn.send(("status", [{**w.status(), "progress": w.progress(), "acked": w.acked,
                               "alive": w.thread.is_alive(), "probed": w.probed.is_set(), "top": w.resume_top,
                               "starting": w.starting()}
                              for w in workers], list(problems), final, new))
        sent[0] += len(new)

    final_seq: int | None = None
    parent_gone = False
    frozen = False
    last_report = 0.0
    try:
        while True:
            try:
                while conn.poll(0.02):
                    msg = conn.recv()
                    if msg[0] == "info":
                        new = RunInfo.from_json(msg[1])
                        info.source = new.source or info.source
                        info.approximate.update(new.approximate or {})
                        info.extra.update(new.extra or {})
                    elif msg[0] == "stop":
                        final_seq = msg[1]
                        for w in workers:
                            w.sink.outcome = msg[2]
            except (EOFError, OSError):
                parent_gone = True
            for seq, rec in tail.poll():
                out = rec
                if rename is not None:      # once for all trackers, as the dispatcher does for threads
                    try:
                        out = rename(rec)
                    except Exception as exc:
                        note = (f"renaming to {spec['names']!r} failed ({type(exc).__name__}: {exc}); trackers get "
                                f"canonical names")
                        if note not in problems:
                            problems.append(note)
                            warn(f"trackbridge: {note}")
                for w in workers:
                    w.put(seq, out)
            if not frozen and all(w.opened or w.state == "failed" for w in workers):
                # the trackers' packages and opened clients live as long as this process: freezing them keeps the
                # cyclic GC from walking them at every collection (it was most of the sinks' own Python work)
                import gc
                gc.collect()
                gc.freeze()
                frozen = True
            if time.monotonic() - last_report > STATUS_EVERY and not parent_gone:
                last_report = time.monotonic()
                try:
                    report()
                except (OSError, EOFError, BrokenPipeError):
                    parent_gone = True
            if (final_seq is not None and tail.seq >= final_seq) or parent_gone:
                if parent_gone:
                    tail.poll()
                break
        tail.done.set()
        for w in workers:
            w.stop()
        while any(w.thread.is_alive() for w in workers):
            for w in workers:
                w.thread.join(STATUS_EVERY)
            if not parent_gone:
                try:
                    report()
                except (OSError, EOFError, BrokenPipeError):
                    parent_gone = True
        if not parent_gone:
            report(final=True)
    except BaseException as exc:  # never die silently
        warn(f"trackbridge: the writer process failed: {type(exc).__name__}: {exc}")
        raise


def _forward_warnings(into: list[str]) -> None:
    """Collect this process's LoggerWarnings in ``into`` (sent to the parent, which warns them) instead of
    printing them here; other warnings are shown as usual."""
    import warnings

    from .common import LoggerWarning
    shown = warnings.showwarning

    def show(message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
        if issubclass(category, LoggerWarning):
            into.append(str(message))
        else:
            shown(message, category, filename, lineno, file, line)

    warnings.showwarning = show


def _one_writer_per_run(spool: Path) -> None:
    """Wait until no other writer process works on this run (one left by a killed training process finishes the
    spool first), then hold the run's writer lock until this process exits."""
    try:
        import fcntl
    except ImportError:          # no flock (Windows): nothing to wait for
        return
    spool.parent.mkdir(parents=True, exist_ok=True)
    fh = open(spool.with_name(spool.name + ".writer.lock"), "w")
    fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
    _HELD_LOCKS.append(fh)               # kept open: the lock lasts the process


class _RemoteThread:
    def __init__(self, tracker: "RemoteTracker") -> None:
        self.t = tracker

    def is_alive(self) -> bool:
        return self.t.alive

    def join(self, timeout: float | None = None) -> None:
        self.t.changed.wait(timeout)
        self.t.changed.clear()


class _RemoteSink:
    def __init__(self, spec: str, kind: str) -> None:
        self.spec = spec
        self.kind = kind
        self.outcome = "finished"

    def locator(self) -> str:
        return self.spec


class RemoteTracker:
    """The parent's view of one tracker written by the writer process: what its last status said."""

    def __init__(self, spec: str, sink: Any) -> None:
        self.sink = _RemoteSink(spec, sink.kind)
        self.name = sink.describe()
        self.state = "pending"
        self.acked = -1
        self.last_error: str | None = None
        self.alive = True
        self.probed = threading.Event()
        self.resume_top: int | None = None
        self.changed = threading.Event()
        self._status: dict[str, Any] = {"sink": self.name, "state": "pending", "written": 0, "caught_up": 0,
                                        "queued": 0, "failures": 0, "recoveries": 0, "last_error": None,
                                        "spool": False}
        self._progress: tuple = ()
        self._starting = True           # until the child says this tracker's open was tried
        self.thread = _RemoteThread(self)

    def update(self, st: dict[str, Any]) -> None:
        self._progress = tuple(st.pop("progress"))
        self._starting = bool(st.pop("starting", False))
        self.acked = st.pop("acked")
        self.alive = st.pop("alive")
        if st.pop("probed"):
            self.resume_top = st.pop("top")
            self.probed.set()
        else:
            st.pop("top")
        self._status = st
        self.state = st["state"]
        self.last_error = st["last_error"]
        self.changed.set()

    def put(self, seq: int, rec: Record) -> None:
        pass                            # the writer process reads the spool itself

    def stop(self) -> None:
        pass

    def progress(self) -> tuple:
        return self._progress

    def starting(self) -> bool:
        """The writer process is starting, or has not yet tried to open this tracker (see TrackerWorker.starting)."""
        return self._starting and self.alive

    def status(self) -> dict[str, Any]:
        return dict(self._status)

    def left(self, last_seq: int) -> int:
        if not self.alive and self.state == "closed":
            return 0
        return max(0, last_seq - self.acked)


class _FdConn:
    """Send to one pipe, receive from another (``multiprocessing.connection`` framing, pickled messages)."""

    def __init__(self, r: Any, w: Any) -> None:
        self.r, self.w = r, w
        self.lock = threading.Lock()

    def poll(self, timeout: float) -> bool:
        return self.r.poll(timeout)

    def recv(self) -> Any:
        return self.r.recv()

    def send(self, msg: Any) -> None:
        with self.lock:
            self.w.send(msg)


def start(spec: dict[str, Any]) -> tuple[Any, _FdConn]:
    """Start the writer process (``python -m trackbridge.logger.writer``: a fresh interpreter that does not
    re-run the training script, unlike multiprocessing's spawn) and send it ``spec``."""
    import os
    import subprocess
    import sys
    from multiprocessing.connection import Connection
    p2c_r, p2c_w = os.pipe()
    c2p_r, c2p_w = os.pipe()
    proc = subprocess.Popen([sys.executable, "-m", "trackbridge.logger.writer", str(p2c_r), str(c2p_w)],
                            pass_fds=(p2c_r, c2p_w), close_fds=True)
    os.close(p2c_r)
    os.close(c2p_w)
    conn = _FdConn(Connection(c2p_r, writable=False), Connection(p2c_w, readable=False))
    conn.send(("spec", spec))
    return proc, conn


def _child_main(argv: list[str]) -> None:
    import os
    try:
        os.nice(5)          # the trackers take only the CPU time training leaves (the spool holds what waits)
    except (AttributeError, OSError):
        pass
    from multiprocessing.connection import Connection
    conn = _FdConn(Connection(int(argv[0]), writable=False), Connection(int(argv[1]), readable=False))
    kind, spec = conn.recv()
    assert kind == "spec"
    writer_main(conn, spec)


if __name__ == "__main__":
    import sys
    _child_main(sys.argv[1:])
