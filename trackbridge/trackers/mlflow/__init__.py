"""``mlflow:URI`` -- MLflow stores (SQLite, a tracking server, the file store), through ``MlflowClient``.

``client.py`` is what the sink and the reader share (tracking URIs, the client, trackbridge's tags and their
chunking), ``names.py`` MLflow's metric-name rule and the escape that satisfies it, ``store.py`` the check that an
SQLite file is an MLflow store, ``bulk.py`` the bulk writer for local SQLite stores, ``sink.py`` and ``source.py``
the two directions; :func:`sniff` recognises an MLflow SQLite database (a path or a ``sqlite:///`` URI).
"""
from __future__ import annotations

from ...tracking.textfiles import sqlite_tables
from .store import sqlite_path

SQLITE_SUFFIXES = (".db", ".sqlite", ".sqlite3")


def sniff(path_or_uri: str) -> bool:
    """An SQLite file (``.db``, ``.sqlite``, ``.sqlite3``, or ``sqlite:///PATH``) with MLflow's tables."""
    p = sqlite_path(path_or_uri)
    if p is None:
        return False
    tables = sqlite_tables(p)
    return "experiments" in tables and "latest_metrics" in tables
