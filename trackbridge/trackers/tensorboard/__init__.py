"""``tensorboard:DIR`` -- TensorBoard event files, read and written without TensorFlow.

``events.py`` is the storage format (TFRecord framing with masked CRC32C, event files, the tags trackbridge keeps
its run info under), ``sink.py`` writes one Event per record, ``source.py`` reads every run folder under ``DIR``;
:func:`sniff` recognises a folder holding event files.
"""
from __future__ import annotations

from pathlib import Path


def sniff(path_or_uri: str) -> bool:
    """A folder with ``events.out.tfevents.*`` files in it or below it."""
    p = Path(path_or_uri)
    return p.is_dir() and any(p.rglob("events.out.tfevents.*"))
