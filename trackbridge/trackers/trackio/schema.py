"""Trackio's storage format, as the sink writes it and the reader reads it: one SQLite database per project
(``<canonical project name>.db``, created by the installed trackio's own ``SQLiteStorage.init_db``, schema version
:data:`SCHEMA_VERSION`), its key renaming, its ISO timestamps and histogram objects, and its per-project lock."""
from __future__ import annotations

import contextlib
import math
import os
import sqlite3
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

from ...record import Histogram, encode_value
from ...tracking.sink import SinkError

SCHEMA_VERSION = 2          # trackio 0.43.0's PRAGMA user_version
CONFIG_KEY = "_trackbridge"
HIST_TYPE = "trackio.histogram"
HIST_BINS = 64              # trackio.Histogram's default
_REMOTE_ENV = ("TRACKIO_SPACE_ID", "TRACKIO_SERVER_URL", "TRACKIO_BUCKET_ID", "TRACKIO_DATASET_ID",
               "SPACE_REPO_NAME", "SPACE_ID", "SYSTEM")


def canonical_project_name(project: str) -> str:
    """Trackio's on-disk project name (``utils.canonical_project_name`` in trackio 0.43.0)."""
    safe = "".join(c for c in project if c.isalnum() or c in ("-", "_")).rstrip()
    return safe or "default"


def iso(wall_time: float) -> str:
    """Epoch seconds as the UTC ISO timestamp trackio stores."""
    return datetime.fromtimestamp(wall_time, timezone.utc).isoformat()


def parse_iso(text: Any) -> float | None:
    """Epoch seconds from trackio's ISO timestamp; ``None`` for the empty strings its TF importer writes."""
    if not text or not isinstance(text, str):
        return None
    try:
        dt = datetime.fromisoformat(text)
    except ValueError:
        return None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return dt.timestamp()


def encode(value: Any) -> Any:
    """A metric value in trackio's JSON form."""
    if isinstance(value, Histogram):
        return histogram_to_trackio(value)
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value
    if isinstance(value, float):
        return encode_value(value)          # NaN and infinities as "NaN", "Infinity", "-Infinity" (trackio's form)
    try:
        return encode(float(value))
    except (TypeError, ValueError):
        raise TypeError(f"cannot store a {type(value).__name__} value") from None


def histogram_to_trackio(h: Histogram) -> dict[str, Any]:
    """A histogram as trackio's JSON value (``bins`` edges and ``values`` counts; raw samples are bucketed), with
    the statistics kept under ``trackbridge`` so that :func:`trackio_to_histogram` restores them."""
    if h.limits is not None and h.counts is not None and len(h.limits) == len(h.counts) and h.limits:
        first = h.limits[0]
        if h.min is not None and h.min <= first:
            left = h.min
        elif len(h.limits) > 1:
            left = first - (h.limits[1] - first)
        else:
            left = first
        bins = [float(left)] + [float(x) for x in h.limits]
        counts = [float(c) for c in h.counts]
    else:
        vals = [v for v in (h.values or []) if math.isfinite(v)]
        if vals:
            lo, hi = min(vals), max(vals)
            if lo == hi:
                lo, hi = lo - 0.5, hi + 0.5
            width = (hi - lo) / HIST_BINS
            bins = [lo + i * width for i in range(HIST_BINS)] + [hi]
            counts = [0.0] * HIST_BINS
            for v in vals:
                counts[min(int((v - lo) / width), HIST_BINS - 1)] += 1
        else:
            bins, counts = [], []
    extra = {k: getattr(h, k) for k in ("min", "max", "num", "sum", "sum_squares") if getattr(h, k) is not None}
    return {"_type": HIST_TYPE, "bins": bins, "values": counts, "trackbridge": extra}


def trackio_to_histogram(obj: dict[str, Any]) -> Histogram:
    """Inverse of :func:`histogram_to_trackio` (bucketed: ``limits`` are the right edges)."""
    bins = [float(b) for b in obj.get("bins") or []]
    counts = [float(c) for c in obj.get("values") or []]
    extra = obj.get("trackbridge") or {}
    return Histogram(limits=bins[1:] or None, counts=counts or None,
                     min=extra.get("min", bins[0] if bins else None),
                     max=extra.get("max", bins[-1] if bins else None),
                     num=extra.get("num", float(sum(counts)) if counts else None),
                     sum=extra.get("sum"), sum_squares=extra.get("sum_squares"))


@contextlib.contextmanager
def process_lock(directory: Path, project: str) -> Iterator[None]:
    """Trackio's cross-process lock for a project (the same ``<canonical>.lock`` file, ``fcntl.flock``)."""
    try:
        import fcntl
    except ImportError:      # Windows: trackio uses msvcrt; we rely on SQLite's own locking there
        yield
        return
    path = directory / f"{canonical_project_name(project)}.lock"
    with open(path, "w") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def connect(db: Path) -> sqlite3.Connection:
    """A connection to a project database (rows as ``sqlite3.Row``; waits up to 30 s for trackio's locks)."""
    conn = sqlite3.connect(str(db), timeout=30.0)
    conn.row_factory = sqlite3.Row
    return conn


def schema_version(db: Path) -> int:
    """The database's ``user_version``: the trackio schema it was created with."""
    with contextlib.closing(sqlite3.connect(str(db))) as conn:
        return conn.execute("PRAGMA user_version").fetchone()[0]


def init_db(directory: Path, project: str) -> Path:
    """Create (or migrate) the project database with the installed trackio's own ``SQLiteStorage.init_db``."""
    db = directory / f"{canonical_project_name(project)}.db"
    if db.exists() and schema_version(db) == SCHEMA_VERSION:
        return db
    env = {k: v for k, v in os.environ.items() if k not in _REMOTE_ENV}
    env.update(TRACKIO_DIR=str(directory), HF_HUB_OFFLINE="1")
    code = ("import sys\nfrom trackio.sqlite_storage import SQLiteStorage\n"
            "print(SQLiteStorage.init_db(sys.argv[1]))\n")
    try:
        proc = subprocess.run([sys.executable, "-c", code, project], env=env, capture_output=True, text=True,
                              timeout=300)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SinkError(f"trackio:{directory}: cannot run trackio to create {db.name}: {exc}") from exc
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        raise SinkError(f"trackio:{directory}: trackio could not create {db.name}:\n" + "\n".join(tail))
    version = schema_version(db)
    if version != SCHEMA_VERSION:
        raise SinkError(f"trackio:{db}: schema version {version}, this sink writes version {SCHEMA_VERSION} "
                        f"(trackio 0.43.0); use a matching trackio")
    return db


# Trackio renames reserved keys to ``__<key>`` (trackio/run.py Run.log); the same rule, applied by us, is reversible.
TRACKIO_RESERVED = ("project", "run", "timestamp", "step", "time", "metrics")


def trackio_key(name: str) -> str:
    """Trackio's own renaming: reserved keys and keys starting with ``__`` get a ``__`` prefix."""
    if name in TRACKIO_RESERVED or name.startswith("__"):
        return "__" + name
    return name


def trackio_unkey(stored: str) -> str:
    """Undo :func:`trackio_key` (drop one ``__`` prefix)."""
    return stored[2:] if stored.startswith("__") else stored
