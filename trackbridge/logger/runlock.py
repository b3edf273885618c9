"""One process logs one run: ``init()`` claims the run before it reads or writes its spool.

The claim is an exclusive ``flock`` on ``<spool>.lock`` beside the spool (``runs/<run_id>.jsonl.lock``), held for as
long as the run is written: by the training process, and by the writer process, which inherits the locked file
(the same open file, so one lock), so that a writer left finishing the trackers by a killed training process still
holds the run. A second ``init()`` of the run (another process, or the same one before ``finish()``) fails at once,
naming the holder. One exception: resuming a run whose training process is gone while its writer process still
finishes the trackers waits for that writer (at most ``finish_timeout``), since that is what the writer is doing.

The lock file is removed by the last holder (``finish()``, or the writer process left behind when it ends); one left
by a process that died is unlocked and taken over. Whoever takes the lock checks that the path still names the file
it locked (a holder may have removed it in between), the usual way to lock through a file that gets removed.
Without ``fcntl`` (Windows) nothing is claimed.
"""
from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Any, Callable

from ..errors import UsageError

try:
    import fcntl
except ImportError:          # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]


def lock_file(spool_path: Path) -> Path:
    return spool_path.with_name(spool_path.name + ".lock")


def left_unfinished(spool: str | os.PathLike[str]) -> bool:
    """Whether the run in ``spool`` (its ``.jsonl`` file) was left unfinished by a process that is gone (SIGKILL,
    ``ray.kill``, the OOM killer): its run claim (``<spool>.lock``, removed by ``finish()``) is still there and no
    live process holds it."""
    path = lock_file(Path(spool))
    if not path.exists():
        return False
    try:
        import fcntl
    except ImportError:          # pragma: no cover - Windows
        return False
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            return False         # held: the run is still being written
        fcntl.flock(fd, fcntl.LOCK_UN)
        return True
    finally:
        os.close(fd)


def outcome_entry(outcome: str, exit_code: int | None) -> dict[str, Any]:
    """How the run ended, as a pending note's entry records it for ``trackbridge replay`` (the note is what a
    tracker left behind gets the rest of the run from, so it must end the run the way the run ended)."""
    return {"outcome": outcome, "exit_code": exit_code}


def run_outcome(spool: str | os.PathLike[str], entries: list[dict[str, Any]] | None = None
                ) -> tuple[str, int | None] | None:
    """How the run in ``spool`` ended, as far as it was recorded: ``("killed", None)`` when its process died
    without finishing it (:func:`left_unfinished`), else the outcome and exit code its pending note's ``entries``
    record (:func:`outcome_entry`; ``finish()`` and the writer process write them: failed after ``sys.exit(1)`` or
    an exception, killed after Ctrl-C, SIGTERM or a SIGKILL of the training process); None when nothing says."""
    if left_unfinished(spool):
        return "killed", None
    for e in entries or ():
        outcome = e.get("outcome")
        if outcome in ("finished", "failed", "killed"):
            code = e.get("exit_code")
            return outcome, code if isinstance(code, int) and not isinstance(code, bool) else None
    return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:             # exists, owned by someone else
        return True
    return True


def _same_file(fd: int, path: Path) -> bool:
    try:
        here = os.stat(path)
    except OSError:
        return False
    mine = os.fstat(fd)
    return (here.st_dev, here.st_ino) == (mine.st_dev, mine.st_ino)


def _holder(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


class RunLock:
    """The claim on one run (see the module docstring)."""

    def __init__(self, path: Path, fd: int | None) -> None:
        self.path = path
        self.fd = fd

    @classmethod
    def claim(cls, spool_path: Path, run_id: str, *, resume: bool, wait: float,
              say: Callable[[str], None]) -> "RunLock":
        """Take the run's lock, or raise :class:`UsageError` naming who holds it. ``wait``: how long a resumed run
        waits for a writer process left by a training process that is gone."""
        path = lock_file(spool_path)
        if fcntl is None:        # pragma: no cover
            return cls(path, None)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError:
            return cls(path, None)      # the spool folder itself is refused later, with its own message
        end = None
        while True:
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            except OSError:
                return cls(path, None)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                holder = _holder(path)
                pid, host = holder.get("pid"), holder.get("host")
                here = host == socket.gethostname()
                left_writer = resume and here and isinstance(pid, int) and not _alive(pid)
                if not left_writer:
                    who = (f"process {pid} on {host}" if pid else "another process") + \
                          (f" (since {holder['started']})" if holder.get("started") else "")
                    raise UsageError(f"run {run_id!r} is being logged by {who} (lock {path}); two processes must "
                                     f"not log one run: give this one another run_id, or finish the other first")
                if end is None:
                    end = time.monotonic() + wait
                    say(f"run {run_id!r}: the writer process left by the earlier training process (pid {pid}) is "
                        f"still writing the trackers; waiting for it (at most {wait:g} s)")
                if time.monotonic() > end:
                    raise UsageError(f"run {run_id!r}: the writer process left by the earlier training process "
                                     f"(pid {pid}) still holds {path} after {wait:g} s; wait for it to end, or "
                                     f"end it, then resume")
                time.sleep(0.1)
                continue
            except OSError:
                os.close(fd)
                return cls(path, None)      # a file system without flock: nothing to claim with
            if not _same_file(fd, path):    # removed by its last holder while we waited: take the new one
                os.close(fd)
                continue
            break
        lock = cls(path, fd)
        try:
            os.ftruncate(fd, 0)
            os.write(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "run_id": run_id,
                                     "started": time.strftime("%Y-%m-%d %H:%M:%S")}).encode("utf-8"))
        except OSError:
            pass
        return lock

    def release(self) -> None:
        """Remove the lock file (if it is still ours) and let go. Safe to call twice."""
        fd, self.fd = self.fd, None
        if fd is None:
            return
        release_fd(fd, self.path)


def release_fd(fd: int, path: Path) -> None:
    """Remove ``path`` when it still names the file open as ``fd``, then close ``fd`` (the lock goes with the last
    holder: the writer process calls this with the descriptor it inherited)."""
    try:
        if _same_file(fd, path):
            os.unlink(path)
    except OSError:
        pass
    try:
        os.close(fd)
    except OSError:
        pass
