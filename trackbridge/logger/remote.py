"""The training process's side of the writer process (:mod:`.writer`): starting it with its output relayed, the
pipe it is fed and reports through, and :class:`RemoteTracker`, the run's view of each tracker it writes."""
from __future__ import annotations

import os
import threading
from typing import Any

from ..record import Record


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
        proc = subprocess.Popen([sys.executable, "-m", "trackbridge.logger.writer", str(p2c_r), str(c2p_w)],
                                pass_fds=fds, close_fds=True, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
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
