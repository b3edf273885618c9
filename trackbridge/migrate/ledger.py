"""The migration ledger: how far each (source run, destination) migration got, so that ``migrate`` resumes after
the last batch written and does not write a finished run again; and the claim that lets one attempt at a time
migrate a run.

One small JSON file per migration key under ``$TRACKBRIDGE_STATE_DIR/migrations/`` (default
``~/.cache/trackbridge``), replaced atomically on every save: ``records_written`` (source records written so far),
``records_pending`` (up to which record a batch was being written: 0 when none was in flight), ``max_step`` (the
highest step written), ``source`` (what the names were translated from) and ``complete``. A migration that runs
under a plan (``migrate --engine ray``: :mod:`.bulk`) also keeps ``plan`` (the plan's id) and what this
plan wrote so far (``out_records``, ``out_points``, ``out_skipped``, and at the end the run's translation
bookkeeping, ``stats``), so that a task retried after its worker died reports the run's whole migration, not only
the part after the crash.

**The claim** (:meth:`Ledger.claim`): an exclusive ``flock`` on ``<key>.lock`` beside the ledger file, held while a
run is migrated. A second attempt at the same run (a Ray task retried while the first attempt's process is still
alive, the same ``migrate`` started twice, ``--jobs`` threads of two commands) waits until the first lets go, then
continues from the ledger instead of opening the run in the destination a second time (two MLflow runs, a second
TensorBoard folder ``NAME-2``, a second header). The kernel releases the lock when the holder dies, however it
dies, so a killed worker never leaves a run locked. The lock file holds who has it (host, pid, since when), for the
message of an attempt that gives up waiting. Claims coordinate the processes that share the state folder: on one
machine always; across machines only when ``TRACKBRIDGE_STATE_DIR`` is on a shared file system with working
``flock`` (NFSv4, Lustre, CephFS); elsewhere there is no claim and the ledger of each machine is its own.
"""
from __future__ import annotations

import hashlib
import json
import os
import socket
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from ..errors import TrackBridgeError
from ..record import RunInfo

try:
    import fcntl
except ImportError:         # pragma: no cover - not POSIX: no claims (one migration at a time is the user's care)
    fcntl = None  # type: ignore[assignment]

#: seconds an attempt waits for another attempt at the same run to finish before it gives up on that run
CLAIM_WAIT = 600.0


def state_dir() -> Path:
    return Path(os.environ.get("TRACKBRIDGE_STATE_DIR") or Path.home() / ".cache" / "trackbridge")


def target_run_id(src_locator: str, info: RunInfo, index: int) -> str:
    """The id a source run gets in the destination: the same for every migration of that run, so that a second
    migration (or a retried one) finds the run it made."""
    ident = info.run_id or info.name or str(index)
    digest = hashlib.sha1(f"{src_locator}\0{ident}".encode()).hexdigest()
    return f"tb-{digest[:16]}"


def ledger_key(src: str, dst: str, names: str, run_id: str) -> str:
    """The ledger entry of one (source run, destination, naming) migration."""
    return hashlib.sha1(f"{src}\0{dst}\0{names}\0{run_id}".encode()).hexdigest()[:24]


class ClaimBusy(TrackBridgeError, RuntimeError):
    """Another attempt holds the run's claim and did not let go in time; the message names it."""


class Claim:
    """The exclusive claim on one ledger key (see the module docstring). A context manager; :meth:`release` is
    safe to call twice."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def acquire(self, wait: float = CLAIM_WAIT, poll: float = 0.1) -> "Claim":
        if fcntl is None:
            return self
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        end = time.monotonic() + max(0.0, wait)
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= end:
                    holder = _read_holder(self.path)
                    os.close(fd)
                    raise ClaimBusy(f"another migration of this run is in progress ({holder}) and did not finish "
                                    f"within {wait:.0f} s; run the command again when it has") from None
                time.sleep(poll)
        self._fd = fd
        me = json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "since": time.time()}).encode()
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, me, 0)
        except OSError:
            pass
        return self

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            os.ftruncate(fd, 0)          # nobody holds it now (the file stays: unlinking would race a waiter)
        except OSError:
            pass
        os.close(fd)                     # closing the descriptor releases the lock

    def __enter__(self) -> "Claim":
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.release()


def _read_holder(path: Path) -> str:
    try:
        who = json.loads(path.read_text() or "{}")
        return f"process {who.get('pid')} on {who.get('host')} since {time.ctime(who.get('since', 0))}"
    except (OSError, ValueError, TypeError):
        return "holder unknown"


class Ledger:
    """How far each (source run, destination) migration got. One small JSON file per migration key; ``root``: the
    state folder (default :func:`state_dir`)."""

    def __init__(self, key: str, root: Path | str | None = None) -> None:
        self.path = Path(root or state_dir()) / "migrations" / f"{key}.json"
        self.data: dict[str, Any] = {}
        self.reload()

    def reload(self) -> None:
        """Read the ledger file again (another attempt may have moved it on while this one waited for its claim)."""
        self.data = {}
        if self.path.is_file():
            try:
                self.data = json.loads(self.path.read_text())
            except (OSError, json.JSONDecodeError):
                self.data = {}
        if not isinstance(self.data, dict):
            self.data = {}

    def claim(self, wait: float = CLAIM_WAIT) -> Claim:
        """Take the run's claim (waiting at most ``wait`` seconds for another attempt to let go: :class:`ClaimBusy`
        after that), then re-read the ledger. Use as ``with ledger.claim(): ...``."""
        claim = Claim(self.path.with_suffix(".lock")).acquire(wait)
        self.reload()
        return claim

    @property
    def written(self) -> int:
        return int(self.data.get("records_written", 0))

    @property
    def pending(self) -> int:
        """Records up to which a batch was being written when the migration stopped (0: none in flight)."""
        return int(self.data.get("records_pending", 0))

    @property
    def complete(self) -> bool:
        return bool(self.data.get("complete"))

    def save(self, **fields: Any) -> None:
        self.data.update(fields)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(f".{os.getpid()}.tmp")     # per process: two writers never share a temp file
        tmp.write_text(json.dumps(self.data))
        os.replace(tmp, self.path)


__all__ = ["CLAIM_WAIT", "Claim", "ClaimBusy", "Ledger", "ledger_key", "state_dir", "target_run_id"]
