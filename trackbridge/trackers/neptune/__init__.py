"""``neptune:DIR`` -- the Parquet layout of ``neptune-exporter`` (neptune-ai/neptune-exporter), read and written.

Neptune's hosted service closed in 2026; its exporter writes every run as long-format Parquet (one row per point,
per parameter, per file) that the exporter's eight loaders read (into other trackers, listed in its README).
trackbridge reads that layout (so a run leaving Neptune can go into any tracker trackbridge writes) and writes it
(so anything can be exported to it). ``format.py`` is the layout and its guard, ``sink.py`` writes, ``source.py``
reads; :func:`sniff` recognises a data folder, a project folder or a part file. Needs ``pyarrow``
(``pip install 'trackbridge[neptune]'``).
"""
from __future__ import annotations

import re
from pathlib import Path

_PART = re.compile(r".+_part_\d+\.parquet$")


def sniff(path_or_uri: str) -> bool:
    """A ``<run>_part_<n>.parquet`` file, or a folder holding such files directly or one level down (the exporter's
    ``--data-path`` holds one folder per project)."""
    p = Path(path_or_uri)
    if p.is_file():
        return bool(_PART.match(p.name))
    if not p.is_dir():
        return False
    if any(_PART.match(f.name) for f in p.glob("*_part_0.parquet")):
        return True
    return any(_PART.match(f.name) for f in p.glob("*/*_part_0.parquet"))
