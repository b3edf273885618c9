"""Trackers in a writer process: ``init(..., writer="process")`` (and ``"auto"``, the default).

The training process then does only what the spool needs (validate, translate, derive, encode a line); the trackers'
clients, their serialisation and their I/O run in a child process with its own interpreter, so they never take the
GIL from training. The child is **fed through its pipe** (:mod:`.feed`): every batch the spool worker took, as the
spool's own JSON lines, whether or not the spool file could take it, so a full disk or a deleted spool costs the
trackers nothing. The spool stays the durable copy and the catch-up source: a tracker that falls behind, fails, or is
sent a *gap* (the feed was too far behind, see :mod:`.feed`) takes what it lacks from the spool file, as the threads
do, with the same :class:`~.tracker.TrackerWorker`. Each message carries how far the spool file holds the run, so a
tracker never catches up from records the file does not hold. The child reads its pipe only while some tracker has
room in its queue, so neither process holds more than its queues and the feed's bound, however far it lags.

The parent sends what it learns while logging (detected source, approximations) and at ``finish()`` the last record
number and how the run ended (``stop``), or ``abort`` when ``finish()`` is interrupted (Ctrl-C, SIGTERM): the child
then closes what it can within a few seconds and exits. The child sends each tracker's status and its warnings. Its
standard output and error are pipes the parent relays, so it never holds the caller's terminal or pipe (``python
train.py | tee`` ends with the training process).

When the training process dies without ``finish()`` (SIGKILL, SIGTERM, a crash), the child takes what the spool
holds beyond what it was sent, closes the trackers with the outcome ``killed`` (MLflow ``KILLED``, wandb exit code
137) within ``finish_timeout`` (giving up on one that makes no progress for ``stall_timeout``), writes the pending
note for what any still lacks, and exits. When the child dies (the OOM killer), the parent restarts it
(:meth:`trackbridge.logger.run.Run`): the new one reopens every tracker's run and catches it up from the spool with
the points it lacks, as a resumed run does.
"""
from __future__ import annotations

import copy
import os
import threading
import time
from pathlib import Path
from typing import Any

from ..pipeline import names_translator
from ..record import RunInfo
from ..stream import RecordDecoder, parse_line, read_stream
from .common import KILLED_EXIT, warn
from .egress import Egress
from .options import LoggerOptions
from .pending import count_lacking, countable, note_entry, pending_file, write_pending
from .remote import FdConn
from .runlock import release_fd
from .tracker import TrackerWorker
from .waiting import wait_for_trackers
from .worker import RunContext

STATUS_EVERY = 0.2
ABORT_WAIT = 3.0         # seconds an interrupted finish() leaves the trackers to close


class SpoolView:
    """How far the spool file holds the run, as the training process last said (the writer's ``ctx.spool``)."""

    def __init__(self, mark: int) -> None:
        self.mark: int | None = mark
        self.cond = threading.Condition()
        self.done = threading.Event()

    def advance(self, mark: int | None) -> None:
        with self.cond:
            if mark is None:
                self.mark = None          # the spool lost records: its numbers are not the run's any more
            elif self.mark is not None and mark > self.mark:
                self.mark = mark
            self.cond.notify_all()

    def wait_written(self, seq: int, timeout: float) -> bool:
        end = time.monotonic() + timeout
        with self.cond:
            while self.mark is not None and self.mark < seq and not self.done.is_set():
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self.cond.wait(left)
            return self.mark is not None and self.mark >= seq


def writer_main(conn: Any, spec: dict[str, Any]) -> None:
    """The child process: build the trackers, take the feed, report, stop when told (or when the parent is gone)."""
    writer = _Writer(conn, spec)
    try:
        parent_gone = writer.follow()
        if not parent_gone:
            parent_gone = writer.close()
        if parent_gone:
            _orphaned(writer.spool_path, writer.workers, writer.options, writer.state, writer.view, writer.egress.put,
                      writer.outcome, spec)
            return
        try:
            writer.report(final=True)
        except (OSError, EOFError, BrokenPipeError):
            pass
        if writer.state["abort"]:
            _exit_now()
    except BaseException as exc:  # never die silently
        warn(f"trackbridge: the writer process failed: {type(exc).__name__}: {exc}")
        raise


class _Writer:
    """The writer process's trackers and what it knows of the run: built from the parent's ``spec``, fed by
    :meth:`take`, reporting with :meth:`report`."""

    def __init__(self, conn: Any, spec: dict[str, Any]) -> None:
        from ..trackers import make_sink

        self.conn = conn
        self.options = options = LoggerOptions(**spec["options"])
        self.info = info = RunInfo.from_json(spec["info"])
        self.problems: list[str] = []
        rename = names_translator(spec["names"], mappings=spec["mappings"], config=info.config,
                                  origin=lambda: info.source, fidelity=info.approximate)
        self.spool_path = Path(spec["spool_path"])
        seq_base = spec["seq_base"]
        self.view = SpoolView(seq_base - 1)
        # the same egress as the tracker threads' (logger/egress.py): one renaming for every tracker, one run info
        self.egress = Egress(info=lambda: copy.deepcopy(info), live=info, rename=rename, names=spec["names"],
                             problem=self.problem)
        self.warned: list[str] = []     # the trackers' warnings: the parent warns them, where the user sees warnings
        self.sent = 0
        _forward_warnings(self.warned)
        ctx = RunContext(options=options, spool_path=self.spool_path, seq_base=seq_base, resume=spec["resume"],
                         resume_last_step=spec["resume_last_step"], tracker_info=self.egress.tracker_info,
                         sync_info=self.egress.sync_info, report=self.problems.append, spool=self.view)
        sinks = [make_sink(s) for s in spec["sinks"]]
        if spec.get("alerts"):          # init(doctor=True): a tracker with alerts of its own raises one per finding
            for sink in sinks:
                sink.alerts = True
        self.workers = [TrackerWorker(ctx, sink, queue_size=options.queue_size, batch_size=options.batch_size,
                                      rename=rename) for sink in sinks]
        self.egress.handles = self.workers
        for w in self.workers:
            w.thread.start()
        self.decoder = RecordDecoder()
        self.state: dict[str, Any] = {"last": seq_base - 1, "final": None, "abort": False, "outcome": None}

    def problem(self, key: str, note: str) -> None:
        if note not in self.problems:
            self.problems.append(note)
            warn(f"trackbridge: {note}")

    def report(self, final: bool = False) -> None:
        new = self.warned[self.sent:]
        self.conn.send(("status", [{**w.status(), "progress": w.progress(), "acked": w.acked,
                                    "alive": w.thread.is_alive(), "probed": w.probed.is_set(), "top": w.resume_top,
                                    "starting": w.starting()}
                                   for w in self.workers], list(self.problems), final, new))
        self.sent += len(new)

    def outcome(self, name: str, code: int | None) -> None:
        self.state["outcome"] = name
        self.info.extra["outcome"] = name
        for w in self.workers:
            w.sink.outcome = name
            w.sink.exit_code = code

    def take(self, msg: tuple[Any, ...]) -> None:
        """One message of the parent's: records, a gap, what it learnt of the run, or how the run ended."""
        kind, state = msg[0], self.state
        self.view.advance(msg[-1])
        if kind == "recs":
            self._records(msg[1], msg[2])
        elif kind == "gap":
            first, last = max(msg[1], state["last"] + 1), msg[2]
            if last >= first:
                for w in self.workers:
                    w.put_gap(first, last)
                state["last"] = last
        elif kind == "info":
            new = RunInfo.from_json(msg[1])
            self.info.source = new.source or self.info.source
            self.info.approximate.update(new.approximate or {})
            self.info.extra.update(new.extra or {})
        elif kind == "stop":
            state["final"] = msg[1]
            self.outcome(msg[2], msg[3])
        elif kind == "abort":
            state["abort"] = True
            self.outcome(msg[1], msg[2])

    def _records(self, first: int, data: bytes) -> None:
        state, put = self.state, self.egress.put
        for i, raw in enumerate(data.split(b"\n")[:-1]):
            seq = first + i
            if seq <= state["last"]:
                continue        # already taken (a restarted writer is sent what the spool had not yet)
            state["last"] = seq
            obj, _error = parse_line(raw)
            if obj is None:
                continue
            try:
                rec = self.decoder.record(obj)
            except (TypeError, ValueError, AttributeError):
                continue
            put(seq, rec)

    def room(self) -> bool:
        """Some tracker takes records now (or none takes them from its queue: they are caught up from the spool)."""
        return any(w.state not in ("ok", "pending") or not w.queue.full() for w in self.workers) or not self.workers

    def follow(self) -> bool:
        """Take the feed until the run's last record or an abort; True when the parent is gone."""
        conn, state, workers = self.conn, self.state, self.workers
        parent_gone = False
        frozen = False
        last_report = 0.0
        while True:
            try:
                if self.room():
                    if conn.poll(0.02):
                        for _ in range(256):
                            self.take(conn.recv())
                            if state["abort"] or not self.room() or not conn.poll(0):
                                break
                else:
                    time.sleep(0.01)
            except (EOFError, OSError):
                parent_gone = True
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
                    self.report()
                except (OSError, EOFError, BrokenPipeError):
                    parent_gone = True
            if parent_gone or state["abort"] or (state["final"] is not None and state["last"] >= state["final"]):
                return parent_gone

    def close(self) -> bool:
        """Stop the trackers: within :data:`ABORT_WAIT` after an abort, else as long as they make their way,
        reporting meanwhile; True when the parent is gone."""
        workers = self.workers
        for w in workers:
            w.stop()
        if self.state["abort"]:
            end = time.monotonic() + ABORT_WAIT
            while any(w.thread.is_alive() for w in workers) and time.monotonic() < end:
                for w in workers:
                    w.thread.join(0.05)
            return False
        while any(w.thread.is_alive() for w in workers):
            for w in workers:
                w.thread.join(STATUS_EVERY)
            try:
                self.report()
            except (OSError, EOFError, BrokenPipeError):
                return True
        return False


def _orphaned(spool_path: Path, workers: list[TrackerWorker], options: LoggerOptions, state: dict[str, Any],
              view: SpoolView, put: Any, outcome: Any, spec: dict[str, Any]) -> None:
    """The training process is gone: take what the spool holds beyond what was sent, close the trackers with the
    outcome ``killed`` (unless the parent said how the run ended), write the pending note for what any still
    lacks, let go of the run, exit."""
    _quiet()
    if state["outcome"] is None:
        outcome("killed", KILLED_EXIT)
    last = state["last"]
    for seq, rec in read_stream(spool_path, start=last + 1):
        view.advance(seq)
        put(seq, rec)
        last = seq
    for w in workers:
        w.stop()
    end = time.monotonic() + options.finish_timeout
    wait_for_trackers(workers, end=end, stall_timeout=options.stall_timeout, left=lambda w: w.left(last))
    behind = [w for w in workers if w.left(last)]
    counted = [w for w in behind if countable(w.sink.locator())]
    for w in behind:                    # they write nothing more and close their trackers as far as they got
        w.cut.set()
        w.stop()
    stop = time.monotonic() + ABORT_WAIT
    for w in counted:
        w.thread.join(max(0.0, stop - time.monotonic()))
    entries = []
    for w in behind:                    # read back from the tracker where it can be: exact, as the training process's
        lack = count_lacking(spool_path, w.sink.locator(), spec["run_id"], rename=w.rename) if w in counted \
            else None
        if lack is None or lack.points:
            entries.append(note_entry(w, records=last + 1, left=w.left(last), lack=lack))
    if entries:
        try:
            write_pending(pending_file(spool_path), spec["run_id"], entries)
        except OSError:
            pass
    if spec.get("lock_fd") is not None:
        release_fd(spec["lock_fd"], Path(spec["lock_path"]))
    _exit_now()


def _quiet() -> None:
    """The parent, which relays this process's output, is gone: write nothing more to the pipes."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.dup2(null, 2)
        os.close(null)
    except OSError:
        pass


def _exit_now() -> None:
    """Leave without the interpreter's shutdown (a tracker client's thread stuck in a request, or its atexit
    hooks, must not keep this process alive)."""
    import sys
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except Exception:
        pass
    os._exit(0)


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


def _child_main(argv: list[str]) -> None:
    try:
        os.nice(5)          # the trackers take only the CPU time training leaves (the spool holds what waits)
    except (AttributeError, OSError):
        pass
    import signal
    try:                    # Ctrl-C reaches the whole process group: the training process decides (abort, or gone)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    except (ValueError, OSError):
        pass
    from multiprocessing.connection import Connection
    conn = FdConn(Connection(int(argv[0]), writable=False), Connection(int(argv[1]), readable=False))
    kind, spec = conn.recv()
    assert kind == "spec"
    writer_main(conn, spec)


if __name__ == "__main__":
    import sys
    _child_main(sys.argv[1:])
