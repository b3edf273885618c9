"""Is this SQLite file an MLflow store? Checked before MLflow opens it, with the standard library only.

Opening ``sqlite:///x.db`` with MLflow runs its schema migrations: an SQLite database of anything else (an
application's data, Trackio's metrics, a file that merely ends in ``.db``) silently gets ~50 MLflow tables added
to it. The MLflow sink (and ``trackbridge migrate``'s check of where it writes) therefore calls
:func:`check_sqlite_store` first. The rule:

* a file that does not exist, or holds 0 bytes, is fine (MLflow creates a new store in it);
* an SQLite database with no tables is fine (nothing in it to spoil);
* an MLflow store is fine: it has the tables ``experiments``, ``runs`` and ``metrics``, and ``runs`` has MLflow's
  ``run_uuid`` column (``alembic_version`` is not required, so that a store another process is creating this
  moment is not refused);
* anything else is refused with a :class:`~trackbridge.tracking.sink.SinkError` naming the file and why: an SQLite
  database with other tables (the first few are named), or a file that is not an SQLite database at all.

The file is opened read-only (``mode=ro``), so the check itself never creates or changes anything. A database that
cannot be checked for another reason (locked, unreadable) is left for MLflow to report.

A new store is created whole or not at all (:func:`create_sqlite_store`): MLflow makes its ~50 tables and runs its
migrations one by one, and a process stopped in the middle (a ``finish()`` that gave up, a SIGKILL) used to leave a
half-made store that every later open refused (``table entity_associations already exists``). The store is made in
a temporary file beside the target and linked into place once complete; a stopped creation leaves only that
temporary file, removed by the next creation once its process is gone.

Creation is serialised (:func:`store_lock`): MLflow makes a store by running its alembic migrations, and alembic
keeps its migration context in module globals, so two threads of one process making stores at once (``migrate
--jobs 4`` into a new store) ran each other's migrations (``KeyError: 'script'``, ``duplicate column name:
step``). While a store is checked and made, a process holds a lock of its own threads and an ``flock`` on the
folder of the SQLite file (a folder, not a lock file: nothing is left beside the store), so every thread and every
process that opens the new store waits for the one making it and then finds it complete.
"""
from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import uuid
from pathlib import Path
from typing import Iterator

from ...tracking.sink import SinkError

MLFLOW_TABLES = ("experiments", "runs", "metrics")
SQLITE_MAGIC = b"SQLite format 3\x00"


def sqlite_path(location: str) -> Path | None:
    """The SQLite file of an MLflow locator's location (``sqlite:///x.db``, ``sqlite:////abs/x.db`` or a bare
    ``x.db``, ``x.sqlite``, ``x.sqlite3``), or None when the location is not a local SQLite store (a server, a file
    store, another database)."""
    loc = location.strip().split("?", 1)[0]
    if loc.startswith("sqlite:"):
        rest = loc[len("sqlite:"):]
        if not rest.startswith("///"):
            return None                     # sqlite:// (in memory) or a malformed URI: MLflow reports it
        path = rest[3:]
        if not path or path == ":memory:":
            return None
        return Path(path).expanduser()
    if "://" in loc or loc.startswith("file:"):
        return None
    if loc.lower().endswith((".db", ".sqlite", ".sqlite3")):
        return Path(loc).expanduser()
    return None


def check_sqlite_store(location: str, what: str = "mlflow") -> None:
    """Raise :class:`SinkError` when ``location`` names a local SQLite file that is not an MLflow store (see the
    module docstring); return quietly otherwise. ``what`` prefixes the message (``mlflow:LOCATION``)."""
    path = sqlite_path(location)
    if path is None or not path.exists():
        return
    if path.is_dir():
        raise SinkError(f"{what}:{location}: {path} is a folder, not an SQLite file")
    try:
        size = path.stat().st_size
        if size == 0:
            return
        with open(path, "rb") as fh:
            magic = fh.read(len(SQLITE_MAGIC))
    except OSError:
        return                              # unreadable: MLflow says why
    if magic != SQLITE_MAGIC:
        raise SinkError(f"{what}:{location}: {path} is not an SQLite database (it does not start with the SQLite "
                        f"header); refusing to let MLflow write into it. Give a new file name (or an empty file).")
    try:
        con = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=5)
    except sqlite3.Error:
        return
    try:
        tables = {row[0] for row in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        run_columns = {row[1] for row in con.execute("PRAGMA table_info(runs)")} if "runs" in tables else set()
    except sqlite3.DatabaseError as exc:
        if isinstance(exc, sqlite3.OperationalError):
            return                          # locked, busy, ...: not a verdict on the file
        raise SinkError(f"{what}:{location}: {path} is not a usable SQLite database ({exc}); refusing to let "
                        f"MLflow write into it") from None
    finally:
        con.close()
    tables = {t for t in tables if not t.startswith("sqlite_")}
    if not tables:
        return
    if all(t in tables for t in MLFLOW_TABLES) and "run_uuid" in run_columns:
        return
    shown = ", ".join(sorted(tables)[:8]) + (", ..." if len(tables) > 8 else "")
    raise SinkError(f"{what}:{location}: {path} is an SQLite database but not an MLflow store (it has the "
                    f"table(s) {shown}, and not MLflow's {', '.join(MLFLOW_TABLES)}); MLflow would add its own "
                    f"tables to it, so it is left untouched. Give a new file name (or an empty file).")


_NEW = ".trackbridge-new-"


_CREATING = threading.Lock()     # one creation at a time in this process (alembic's context is module-global)


@contextlib.contextmanager
def store_lock(path: Path) -> Iterator[None]:
    """Hold the creation lock of the store at ``path``: this process's own, then an exclusive ``flock`` on the
    folder that holds the file (see the module docstring). Without ``fcntl``, or on a folder that cannot be locked,
    only this process's threads are serialised."""
    with _CREATING:
        fd = None
        try:
            import fcntl
            fd = os.open(path.parent if str(path.parent) else ".", os.O_RDONLY)
            fcntl.flock(fd, fcntl.LOCK_EX)
        except (ImportError, OSError):
            if fd is not None:
                os.close(fd)
            fd = None
        try:
            yield
        finally:
            if fd is not None:
                os.close(fd)            # closing the descriptor lets go of the flock


def _complete(path: Path) -> bool:
    """A store is there (a file with something in it that is not a half-made MLflow store): nothing to make."""
    try:
        return path.exists() and path.stat().st_size > 0 and not _half_made(path)
    except OSError:
        return True                     # MLflow says why


def create_sqlite_store(path: Path) -> None:
    """Make a new MLflow store at ``path`` when there is none (the file missing or empty), whole or not at all (see
    the module docstring). Threads and processes making it at the same time wait for each other
    (:func:`store_lock`): the first makes it, the others find it made."""
    _remove_stale(path)                 # temporary stores of creations whose process is gone (killed mid-way)
    if _complete(path):
        return                          # the common case: no lock taken
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError:
        return                          # MLflow says why
    with store_lock(path):
        _create(path)


def _create(path: Path) -> None:
    _remove_stale(path)
    half = False
    try:
        if path.exists() and path.stat().st_size > 0:
            half = _half_made(path)
            if not half:
                return
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError:
        return                              # MLflow says why
    import logging
    for name in ("mlflow.store.db.utils", "alembic.runtime.migration"):   # "Creating initial MLflow database
        logging.getLogger(name).setLevel(logging.WARNING)                 # tables..." on every new store
    tmp = path.with_name(f".{path.name}{_NEW}{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        try:        # the store MLflow itself would make for this URI (its artifact root, its store class)
            from mlflow.tracking._tracking_service.utils import _get_sqlalchemy_store as make
        except ImportError:                 # pragma: no cover - another MLflow layout
            from mlflow.store.tracking import DEFAULT_LOCAL_FILE_AND_ARTIFACT_PATH
            from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

            def make(uri: str, artifacts: str | None) -> object:
                return SqlAlchemyStore(uri, artifacts or DEFAULT_LOCAL_FILE_AND_ARTIFACT_PATH)
        store = make(f"sqlite:///{tmp}", None)
        engine = getattr(store, "engine", None)
        if engine is not None:
            engine.dispose()
        if half:                            # a store cut short by another tool, holding nothing: made again
            logging.getLogger("trackbridge").warning(
                "trackbridge: %s is an MLflow store whose creation was cut short (no experiment in it); made again",
                path)
            os.replace(tmp, path)
            return
        try:
            os.link(tmp, path)              # only if there is still none
        except FileExistsError:
            if path.stat().st_size == 0:
                os.replace(tmp, path)       # an empty file was there: the complete store replaces it
    finally:
        for p in (tmp, tmp.with_name(tmp.name + "-journal")):
            try:
                os.unlink(p)
            except OSError:
                pass


def _half_made(path: Path) -> bool:
    """An SQLite file with MLflow's tables but not a single experiment: MLflow makes the Default experiment last,
    so its creation was cut short (by a tool that makes stores in place), and nothing in it can be anyone's."""
    try:
        con = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=5)
    except sqlite3.Error:
        return False
    try:
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if not all(t in tables for t in MLFLOW_TABLES):
            return False
        return con.execute("SELECT COUNT(*) FROM experiments").fetchone()[0] == 0 and \
            con.execute("SELECT COUNT(*) FROM runs").fetchone()[0] == 0
    except sqlite3.Error:
        return False
    finally:
        con.close()


def _remove_stale(path: Path) -> None:
    """Temporary stores left by creations whose process is gone."""
    if not path.parent.is_dir():
        return
    for p in path.parent.glob(f".{path.name}{_NEW}*"):
        pid = p.name[len(f".{path.name}{_NEW}"):].split("-", 1)[0]
        if not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
            continue
        except ProcessLookupError:
            pass
        except OSError:
            continue
        try:
            os.unlink(p)
        except OSError:
            pass
