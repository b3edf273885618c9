"""``clearml:DIR`` -- ClearML offline sessions (``Task.set_offline(True)``): ``DIR/offline-<id>/`` with ``task.json``
and ``metrics.jsonl`` (and the session's zip), written and read without a server; ``Task.import_offline_session``
uploads one to a ClearML server later.

``session.py`` is the format (the folder, the events, the name rule, the checks), ``sink.py`` writes, ``source.py``
reads; :func:`sniff` recognises a session folder, its zip, or a folder of sessions. The format is plain JSON:
writing and reading need no package (the ``clearml`` extra installs ClearML's own SDK, to import the sessions).
"""
from __future__ import annotations

import zipfile
from pathlib import Path


def _session(p: Path) -> bool:
    return p.is_dir() and p.name.startswith("offline-") and (p / "task.json").is_file()


def sniff(path_or_uri: str) -> bool:
    """An ``offline-*`` folder holding ``task.json``, its ``.zip``, or a folder holding such sessions."""
    p = Path(path_or_uri)
    if p.is_file():
        if not (p.name.startswith("offline-") and p.suffix == ".zip"):
            return False
        try:
            with zipfile.ZipFile(p) as z:
                return "task.json" in z.namelist()
        except (OSError, zipfile.BadZipFile):
            return False
    return _session(p) or (p.is_dir() and any(_session(d) for d in p.glob("offline-*")))
