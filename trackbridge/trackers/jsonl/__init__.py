"""``jsonl:DIR`` -- the canonical JSON-lines stream, one ``<run_id>.jsonl`` file per run (the logger's spool too).

``sink.py`` writes it (one ``run`` header line, then one line per record), ``source.py`` reads it (and plain JSON
lines of logged dicts); :func:`sniff` recognises a ``.jsonl`` file or a folder holding some.
"""
from __future__ import annotations

from pathlib import Path


def sniff(path_or_uri: str) -> bool:
    """A ``.jsonl`` file, or a folder with ``*.jsonl`` files directly in it."""
    p = Path(path_or_uri)
    if p.is_dir():
        return any(p.glob("*.jsonl"))
    return p.is_file() and p.suffix.lower() == ".jsonl"
