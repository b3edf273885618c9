"""MLflow's metric-name rule and the MLflow-safe form of a name (escaped by :mod:`trackbridge.tracking.names`).

MLflow (``mlflow/utils/validation.py``, POSIX) accepts letters, digits, ``_ - . /``, space and ``:``, at most 250
characters, and only names that are normalised paths (no leading, trailing or doubled ``/``, no ``.``/``..``
segment, nothing starting with ``..``).
"""
from __future__ import annotations

import posixpath
import re

from ...tracking.names import escape_path, needs_guard, shorten

MLFLOW_CHAR = re.compile(r"[/\w.\- :]")     # one allowed character
MLFLOW_MAX_KEY = 250


def mlflow_valid(name: str) -> bool:
    """MLflow's key rule (POSIX): allowed characters, at most 250 of them, and a normalized path."""
    if not name or len(name) > MLFLOW_MAX_KEY:
        return False
    if not all(MLFLOW_CHAR.fullmatch(c) for c in name):
        return False
    norm = posixpath.normpath(name)
    return norm == name and norm != "." and not norm.startswith("..") and not norm.startswith("/")


def mlflow_key(name: str) -> str:
    """The MLflow-safe form of ``name``: unchanged when valid, else escaped (and shortened past 250 characters)."""
    if mlflow_valid(name) and not needs_guard(name):
        return name
    stored = shorten(escape_path(name, MLFLOW_CHAR), MLFLOW_MAX_KEY, name)
    if not mlflow_valid(stored):   # defensive: the escape is designed never to get here
        raise ValueError(f"cannot make metric name {name!r} acceptable to MLflow (got {stored!r})")
    return stored
