"""``wandb:DIR`` -- wandb runs, written offline through the ``wandb`` package and read from its ``.wandb`` files.

``records.py`` is the storage format (the ``.wandb`` file's block framing, where a run's files are, its exit
record), ``sink.py`` writes through ``wandb`` offline, ``source.py`` reads the files without a wandb service;
:func:`sniff` recognises a ``.wandb`` file or a folder holding some.
"""
from __future__ import annotations

from pathlib import Path


def sniff(path_or_uri: str) -> bool:
    """A ``.wandb`` file, or a folder with ``run-*.wandb`` files in it or below it."""
    p = Path(path_or_uri)
    if p.is_dir():
        return any(p.rglob("run-*.wandb"))
    return p.is_file() and p.suffix.lower() == ".wandb"
