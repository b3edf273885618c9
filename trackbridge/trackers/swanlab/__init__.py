"""``swanlab:DIR`` -- SwanLab's offline/local runs (``swanlab.init(mode="offline"|"local", logdir=DIR)``), written
and read in SwanLab's own on-disk format, with no server and no account.

``store.py`` is the format (the run folder, the LevelDB-log ``.swanlab`` file of protobuf ``Record`` messages, the
version guard), ``sink.py`` writes, ``source.py`` reads; :func:`sniff` recognises a run file, a run folder or a
logdir holding them. Needs ``swanlab`` (its protobuf classes; ``pip install 'trackbridge[swanlab]'``).
"""
from __future__ import annotations

from pathlib import Path


def sniff(path_or_uri: str) -> bool:
    """A ``run-*.swanlab`` file, or a folder holding one in a ``run-*`` folder in it (or being that folder)."""
    p = Path(path_or_uri)
    if p.is_file():
        return p.name.startswith("run-") and p.suffix == ".swanlab"
    if not p.is_dir():
        return False
    return any(p.glob("run-*.swanlab")) or any(p.glob("run-*/run-*.swanlab"))
