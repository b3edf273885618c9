"""The pending note: which trackers ``finish()`` left with records of the run missing, written beside the spool for
``trackbridge replay SPOOL`` (which strikes the trackers it completed)."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..errors import UsageError


def pending_file(spool: str | os.PathLike) -> Path:
    """Where ``finish()`` writes down which trackers lack records of the run in ``spool``."""
    p = Path(spool)
    return p.with_name(p.name + ".pending.json")


def write_pending(path: Path, run_id: str, entries: list[dict[str, Any]]) -> None:
    """Write the note whole (a temporary file moved into place) or not at all: a note that cannot be written (a
    full disk) leaves no temporary file behind; the ``OSError`` tells the caller, who says what it would hold."""
    import json
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(json.dumps({"run_id": run_id, "sinks": entries}, indent=1, default=str), encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise


def read_pending(spool: str | os.PathLike) -> list[dict[str, Any]]:
    """The trackers ``finish()`` left with records missing (``[]`` when none, or no note)."""
    import json
    path = pending_file(spool)
    if not path.is_file():
        return []
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UsageError(f"{path}: not a readable pending note ({exc})") from None
    return [e for e in data.get("sinks") or [] if isinstance(e, dict) and e.get("sink")]


def settle_pending(spool: str | os.PathLike, done: list[str]) -> None:
    """Strike the sinks in ``done`` (locators) from the pending note; remove it when none is left."""
    path = pending_file(spool)
    left = [e for e in read_pending(spool) if e["sink"] not in done]
    if not left:
        if path.exists():
            path.unlink()
        return
    import json
    run_id = json.loads(path.read_text(encoding="utf-8")).get("run_id", "")
    write_pending(path, run_id, left)
