"""``comet:DIR`` -- Comet offline experiments (``comet_ml.OfflineExperiment(offline_directory=DIR)``): one
``<experiment key>.zip`` per run holding ``messages.json`` and ``experiment.json``, written and read without a server
or an account; ``comet upload DIR/*.zip`` sends them to Comet later.

``archive.py`` is the format (the zip, the messages, the checks), ``sink.py`` writes, ``source.py`` reads;
:func:`sniff` recognises an offline zip or a folder holding some. The format is plain JSON in a zip: writing and
reading need no package (the ``comet`` extra installs ``comet_ml``, whose ``comet upload`` sends the zips).
"""
from __future__ import annotations

import zipfile
from pathlib import Path


def _offline_zip(p: Path) -> bool:
    if p.suffix != ".zip" or not p.is_file():
        return False
    try:
        with zipfile.ZipFile(p) as z:
            names = set(z.namelist())
    except (OSError, zipfile.BadZipFile):
        return False
    return {"messages.json", "experiment.json"} <= names


def sniff(path_or_uri: str) -> bool:
    """A zip holding ``messages.json`` and ``experiment.json``, or a folder with such zips directly in it."""
    p = Path(path_or_uri)
    if p.is_dir():
        return any(_offline_zip(z) for z in p.glob("*.zip")) or any(p.glob("*.partial/messages.json"))
    return _offline_zip(p)
