"""``trackio:DIR`` -- Trackio projects, one SQLite database per project, written and read with SQL directly.

``schema.py`` is the storage format (Trackio's tables and schema version, its key renaming, histogram and time
encodings, the per-project lock), ``sink.py`` writes, ``source.py`` reads; :func:`sniff` recognises a Trackio
database or a folder holding one.
"""
from __future__ import annotations

from pathlib import Path

from ...tracking.textfiles import sqlite_tables

TABLES = ("metrics", "configs")


def _is_trackio_db(p: Path) -> bool:
    return p.suffix.lower() == ".db" and all(t in sqlite_tables(p) for t in TABLES)


def sniff(path_or_uri: str) -> bool:
    """A ``.db`` file with Trackio's ``metrics`` and ``configs`` tables, or a folder with one directly in it."""
    p = Path(path_or_uri)
    if p.is_dir():
        return any(_is_trackio_db(db) for db in p.glob("*.db"))
    return _is_trackio_db(p)
