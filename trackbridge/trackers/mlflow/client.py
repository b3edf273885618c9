"""What the MLflow sink and reader share: the tracking URI of a location, the client, and the tags trackbridge
keeps its run info under (chunked JSON tags: ``P.count`` and ``P.0`` .. ``P.<count-1>``, see :func:`chunk_tags`).

**A locked SQLite store is waited for, not failed.** Several processes writing one SQLite store (eight training
runs sharing ``mlflow.db``) take its single write lock in turn; MLflow waits 20 s for it (its ``busy_timeout``), but
SQLite answers "database is locked" at once to a connection that would otherwise deadlock (one reading while it asks
to write), and after the 20 s under a long queue. Every call of the client :func:`make_client` returns, and the bulk
writer's inserts, are tried again on that answer, with doubling pauses (50 ms up to 2 s, jittered) for at most
:data:`LOCKED_PATIENCE` seconds: a failed transaction was rolled back whole, so trying it again writes nothing twice.
MLflow's own log line for each such attempt (a traceback per retry) is held back; any other error passes at once.
"""
from __future__ import annotations

import logging
import math
import os
import random
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, TypeVar

from . import SQLITE_SUFFIXES

if TYPE_CHECKING:       # pragma: no cover
    from mlflow import MlflowClient

TAG_ESCAPE = "trackbridge.key_escape"
TAG_NAMES = "trackbridge.names"
TAG_HIST = "trackbridge.histogram_summaries"
TAG_RUN = "trackbridge.run"
TAG_DERIVED = "trackbridge.derived"    # metrics computed by trackbridge's derived rules, not logged by the trainer
TAG_RUN_ID = "trackbridge.run_id"      # trackbridge's run id, to find the MLflow run again on resume
TEXT_DIR = "trackbridge/text"
CHUNK = 7000          # characters per tag of a chunked tag (MLflow's limit: 8000)


def tracking_uri(location: str) -> str:
    """The MLflow tracking URI for a locator's location; sets the environment MLflow needs for local stores."""
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    loc = location.strip()
    if loc.startswith(("sqlite:", "http://", "https://", "postgresql", "mysql", "mssql", "databricks")):
        return loc
    if loc.lower().endswith(SQLITE_SUFFIXES):
        return f"sqlite:///{Path(loc).expanduser().resolve()}"
    # a directory or file: URI -> the deprecated file store
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    if loc.startswith("file:"):
        return loc
    return Path(loc).expanduser().resolve().as_uri()


def make_client(location: str) -> MlflowClient:
    """An ``MlflowClient`` for ``location`` (imports MLflow here, not at module import).

    For a tracking server, MLflow's own HTTP retries (7 retries with exponential back-off and a 120 s timeout by
    default: minutes per call against a dead server) are bounded to 2 retries and a 15 s timeout, unless the user set
    ``MLFLOW_HTTP_REQUEST_MAX_RETRIES`` / ``MLFLOW_HTTP_REQUEST_TIMEOUT``: the logger retries a failed sink itself,
    and nothing is lost meanwhile (the spool holds every record)."""
    uri = tracking_uri(location)
    if uri.startswith(("http://", "https://")):
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "15")
    for name in ("mlflow.store.db.utils", "alembic.runtime.migration"):   # "Creating initial MLflow database
        logging.getLogger(name).setLevel(logging.WARNING)                 # tables..." on every new store
    _quiet_locked()
    from mlflow.tracking import MlflowClient
    return retry_locked(lambda: RetryingClient(MlflowClient(tracking_uri=uri)))


# -- a locked store: waited for ------------------------------------------------------------------------------
LOCKED_PATIENCE = 60.0           # seconds one call keeps trying a locked store before its error is raised
_LOCKED = ("database is locked", "database table is locked", "sqlite_busy")
T = TypeVar("T")


def is_locked(exc: BaseException) -> bool:
    """Whether ``exc`` (or an exception it was raised from) is SQLite's "database is locked"."""
    seen = 0
    cur: BaseException | None = exc
    while cur is not None and seen < 8:
        text = str(cur).lower()
        if any(m in text for m in _LOCKED):
            return True
        cur = cur.__cause__ or cur.__context__
        seen += 1
    return False


def retry_locked(fn: Callable[..., T], *args: Any, patience: float | None = None, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)``, tried again while it fails because the SQLite store is locked (see the module
    docstring); any other error, or the lock held past ``patience`` seconds, is raised."""
    end = time.monotonic() + (LOCKED_PATIENCE if patience is None else patience)
    pause = 0.05
    while True:
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            if not is_locked(exc) or time.monotonic() + pause > end:
                raise
        time.sleep(pause * random.uniform(0.5, 1.5))
        pause = min(2.0, pause * 2)


class RetryingClient:
    """An ``MlflowClient`` whose every method is called through :func:`retry_locked`; attributes pass through."""

    def __init__(self, client: Any) -> None:
        self._client = client

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._client, name)
        if not callable(attr) or name.startswith("__"):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            return retry_locked(attr, *args, **kwargs)
        call.__name__ = name
        return call

    def __repr__(self) -> str:
        return f"RetryingClient({self._client!r})"


class _NotLocked(logging.Filter):
    """Drops MLflow's log line (with its traceback) for a transaction that failed on a locked store: it is tried
    again, and an error that stays is raised to the caller anyway."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if exc is not None and is_locked(exc):
            return False
        try:
            text = record.getMessage().lower()
        except Exception:               # a record that cannot be formatted is not ours to judge
            return True
        return not any(m in text for m in _LOCKED)


def _quiet_locked() -> None:
    log = logging.getLogger("mlflow.store.db.utils")
    if not any(isinstance(f, _NotLocked) for f in log.filters):
        log.addFilter(_NotLocked())


def chunk_tags(prefix: str, text: str) -> dict[str, str]:
    """Split ``text`` into tags ``prefix.count``, ``prefix.0`` ... (see the module docstring)."""
    pieces = [text[i:i + CHUNK] for i in range(0, len(text), CHUNK)] or [""]
    tags = {f"{prefix}.{i}": p for i, p in enumerate(pieces)}
    tags[f"{prefix}.count"] = str(len(pieces))
    return tags


def read_chunked(tags: dict[str, str], prefix: str) -> str | None:
    """Join a chunked tag written by :func:`chunk_tags`; ``None`` when absent or incomplete."""
    count = tags.get(f"{prefix}.count")
    if count is None or not count.isdigit():
        return None
    parts = [tags.get(f"{prefix}.{i}") for i in range(int(count))]
    if any(p is None for p in parts):
        return None
    return "".join(parts)  # type: ignore[arg-type]




def restore_inf(value: float) -> float:
    """MLflow stores +-inf as +-max double; map that back (only for runs this sink wrote)."""
    if value == 1.7976931348623157e308:
        return math.inf
    if value == -1.7976931348623157e308:
        return -math.inf
    return value
