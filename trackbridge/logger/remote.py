"""The training process's side of the writer process (:mod:`.writer`): :class:`WriterLink` (start it with its output
relayed, feed it, take its reports, start it again when it dies, let it go), the pipe it is fed and reports through,
and :class:`RemoteTracker`, the run's view of each tracker it writes."""
from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any, Callable

from ..record import Record
from .common import warn
from .feed import Feed

MAX_RESTARTS = 3            # writer processes started again after one died, per run
FEED_LIMIT = 8 * 2 ** 20    # bytes queued for the writer process before batches the spool holds become gaps


class WriterLink:
    """The run's link to its writer process. ``spec``: what the process is started with (its sinks, the spool, the
    options ...); ``spool``: the run's SpoolWorker (whose batches feed it, and whose held batches a restarted one is
    sent); ``info()``: the run info to send now; ``problems``: the run's list, for what is said once."""

    def __init__(self, spec: dict[str, Any], *, spool: Any, lock_fd: int | None, info: Callable[[], Any],
                 problems: list[str]) -> None:
        self.spec = spec
        self.spool = spool
        self.lock_fd = lock_fd
        self.info = info
        self.problems = problems
        self.feed = Feed(FEED_LIMIT, spool.spooled)
        self.restarts = 0
        self.final = False          # the process sent its last report
        self.ending = False         # the run lets it end (or ends it): no restart
        self.stop_msg: tuple[Any, ...] | None = None
        self.trackers: list[RemoteTracker] = []
        self.learnt: Callable[[], Any] = lambda: None
        self.finished: Callable[[], bool] = lambda: False
        self.sent: Any = None
        self._learnt_lock = threading.Lock()
        self.proc, self.conn = start({**spec, "info": info()}, lock_fd)

    def attach(self, trackers: list["RemoteTracker"], *, learnt: Callable[[], Any],
               finished: Callable[[], bool]) -> None:
        """Start feeding it and taking its reports; ``learnt()`` changes when the run learns something the trackers
        store (source, approximations), which is then sent; ``finished()``: the run is finishing."""
        self.trackers = trackers
        self.learnt, self.finished = learnt, finished
        self.feed.start(self.conn)
        self.monitor = threading.Thread(target=self._monitor, name="trackbridge-writer-monitor", daemon=True)
        self.monitor.start()

    def send_learnt(self, feeding: bool = False) -> None:
        """Send the run info when the run learnt something since it was last sent (its source, an approximation).
        The spool worker calls it before it feeds a batch (``feeding``; also while finish() waits for it: the stop
        message comes after the spool's last batch), so the writer process judges the batch's names with what the
        run knew when the batch was logged (the child renames with the origin and its reasons)."""
        with self._learnt_lock:
            now = self.learnt()
            if now != self.sent and (feeding or not self.finished()):
                self.sent = now
                self.feed.control(("info", self.info()))

    def records(self, first: int, last: int, data: bytes) -> None:
        """The spool worker's feed: what the run learnt first, then the batch."""
        self.send_learnt(feeding=True)
        self.feed.records(first, last, data)

    def status(self) -> dict[str, Any]:
        return {"pid": self.proc.pid, "restarts": self.restarts, "queued_messages": self.feed.pending(),
                "gaps": self.feed.gaps}

    # -- the end of the run --------------------------------------------------------------------------------------
    def stop(self, last_seq: int, outcome: str, exit_code: int | None) -> None:
        """After the last record: the run info as it stands, then how the run ended (the process ends when its
        trackers are done)."""
        self.feed.control(("info", self.info()))
        self.stop_msg = ("stop", last_seq, outcome, exit_code)
        self.feed.control(self.stop_msg)

    def abort(self, outcome: str, exit_code: int | None) -> None:
        """finish() was interrupted: the process closes what it can within seconds and ends."""
        self.ending = True
        self.feed.control(("abort", outcome, exit_code))

    def close(self, end: float) -> None:
        """After the trackers finished or stalled: let the process exit, or end it (its records are in the spool)."""
        stop_by = time.monotonic() + max(0.5, min(5.0, end - time.monotonic()))
        while self.proc.poll() is None and time.monotonic() < stop_by:
            try:
                self.proc.wait(timeout=0.1)
            except Exception:
                pass
        self.ending = True
        proc = self.proc
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
            for t in self.trackers:
                t.alive = False
        self.feed.close()
        self.monitor.join(2.0)

    # -- while the run goes on -----------------------------------------------------------------------------------
    def _monitor(self) -> None:
        """Take the process's status messages; send it what the run learns while logging; start it again when it
        dies before the run is over."""
        seen: set[str] = set()
        while True:
            conn = self.conn
            try:
                if conn.poll(0.1):
                    kind, statuses, problems, final, warned = conn.recv()
                    for message in warned:      # the trackers' warnings, as the threads would have warned them
                        warn(message)
                    for t, st in zip(self.trackers, statuses):
                        t.update(st)
                    for p in problems:
                        if p not in seen:
                            seen.add(p)
                            self.problems.append(p)
                    if final:
                        self.final = True
            except (EOFError, OSError):
                if self.final or self.ending or not self._restart():
                    for t in self.trackers:
                        t.alive = False
                        t.changed.set()
                    return
                continue
            self.send_learnt()

    def _restart(self) -> bool:
        """The process died before the run was over (the OOM killer, a crash): start another one, which reopens
        every tracker's run and catches it up from the spool with what it lacks (as a resumed run does), and is fed
        what the spool does not hold yet. Said once; after :data:`MAX_RESTARTS` the trackers are left (written down
        at finish() for trackbridge replay)."""
        try:
            rc = self.proc.wait(timeout=5)
        except Exception:
            rc = self.proc.poll()
        why = (f"killed by signal {-rc}" + (" (SIGKILL: the OOM killer?)" if rc == -signal.SIGKILL else "")
               if isinstance(rc, int) and rc < 0 else f"exit code {rc}")
        replay = f"trackbridge replay {self.spec['spool_path']} completes them"
        if self.restarts >= MAX_RESTARTS:
            self._say(f"the writer process died again ({why}) after {self.restarts} restarts; its trackers are "
                      f"left behind: {replay}")
            for t in self.trackers:
                t.writer_lost("failed")
            return False
        for t in self.trackers:
            t.writer_lost("restarting")
        self.restarts += 1
        if self.restarts == 1:
            self._say(f"the writer process died ({why}); it is started again: each tracker's run is reopened and "
                      f"caught up from the spool with what it lacks, and training goes on meanwhile")
        spool = self.spool
        with spool.cond:            # no batch reaches the feed meanwhile: the new process gets each one once
            items: list[list[Any]] = [["recs", f, last, d] for f, last, d in spool.held]
            try:
                self.proc, self.conn = start({**self.spec, "info": self.info(), "seq_base": spool.written_seq + 1,
                                              "resume": True, "resume_last_step": spool.last_step}, self.lock_fd)
            except (OSError, ValueError, RuntimeError) as exc:
                self._say(f"the writer process could not be started again ({exc}); its trackers are left behind: "
                          f"{replay}")
                for t in self.trackers:
                    t.writer_lost("failed")
                return False
            if self.stop_msg is not None:
                items += [["ctl", ("info", self.info())], ["ctl", self.stop_msg]]
            self.feed.restart(self.conn, items)
        return True

    def _say(self, message: str) -> None:
        self.problems.append(message)
        warn(f"trackbridge: {message}")



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
        self.exit_code: int | None = None

    def locator(self) -> str:
        return self.spec


COUNTS = ("written", "caught_up", "failures", "recoveries")


class RemoteTracker:
    """The parent's view of one tracker written by the writer process: what its last status said (counts add up
    over the writer processes of the run, when one had to be restarted)."""

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
        self._base = dict.fromkeys(COUNTS, 0)
        self._progress: tuple = ()
        self._starting = True           # until the child says this tracker's open was tried
        self.thread = _RemoteThread(self)

    def update(self, st: dict[str, Any]) -> None:
        self._progress = (*st.pop("progress"), *self._base.values())
        self._starting = bool(st.pop("starting", False))
        self.acked = st.pop("acked")
        self.alive = st.pop("alive")
        if st.pop("probed"):
            self.resume_top = st.pop("top")
            self.probed.set()
        else:
            st.pop("top")
        for k in COUNTS:
            st[k] = st.get(k, 0) + self._base[k]
        self._status = st
        self.state = st["state"]
        self.last_error = st["last_error"]
        self.changed.set()

    def writer_lost(self, state: str) -> None:
        """The writer process died: this tracker waits for the next one (``restarting``), or is left (``failed``)."""
        for k in COUNTS:
            self._base[k] = self._status.get(k, 0)
        self._status = {**self._status, "state": state, "queued": 0}
        self.state = state
        self._starting = state == "restarting"
        if state == "failed":
            self.alive = False
        self.changed.set()

    def put(self, seq: int, rec: Record) -> None:
        pass                            # the writer process is fed by the spool worker (see .feed)

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


class FdConn:
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

    def close(self) -> None:
        for c in (self.r, self.w):
            try:
                c.close()
            except OSError:
                pass


def start(spec: dict[str, Any], lock_fd: int | None = None) -> tuple[Any, FdConn]:
    """Start the writer process (``python -m trackbridge.logger.writer``: a fresh interpreter that does not
    re-run the training script, unlike multiprocessing's spawn) and send it ``spec``. Its standard output and error
    are relayed to this process's (see the module docstring); ``lock_fd``: the run's lock, which it shares."""
    import subprocess
    import sys
    from multiprocessing.connection import Connection
    p2c_r, p2c_w = os.pipe()
    c2p_r, c2p_w = os.pipe()
    fds = (p2c_r, c2p_w) + ((lock_fd,) if lock_fd is not None else ())
    try:
        # not the training process's own tracker services (a sink's ``process_env``, such as the address of a
        # tracker's background service that its client put in the environment): the writer outlives a killed
        # training process, whose services end with it and would take the writer's runs along
        drop = set(spec.get("drop_env") or ())
        env = {k: v for k, v in os.environ.items() if k not in drop}
        proc = subprocess.Popen([sys.executable, "-m", "trackbridge.logger.writer", str(p2c_r), str(c2p_w)],
                                pass_fds=fds, close_fds=True, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=env)
    finally:
        os.close(p2c_r)
        os.close(c2p_w)
    for src, name in ((proc.stdout, "stdout"), (proc.stderr, "stderr")):
        threading.Thread(target=_relay, args=(src, name), name=f"trackbridge-writer-{name}", daemon=True).start()
    conn = FdConn(Connection(c2p_r, writable=False), Connection(p2c_w, readable=False))
    conn.send(("spec", {**spec, "lock_fd": lock_fd}))
    return proc, conn


def _relay(src: Any, name: str) -> None:
    """Copy the writer process's output to this process's ``sys.stdout`` / ``sys.stderr`` as it comes."""
    import sys
    try:
        while True:
            data = os.read(src.fileno(), 65536)
            if not data:
                break
            out = getattr(sys, name, None)
            try:
                if out is not None:
                    out.write(data.decode("utf-8", "replace"))
                    out.flush()
            except (OSError, ValueError):
                pass
    except OSError:
        pass
    finally:
        try:
            src.close()
        except OSError:
            pass
