"""The migration ledger: how far each (source run, destination) migration got, so that ``migrate`` resumes after
the last batch written and does not write a finished run again.

One small JSON file per migration key under ``$TRACKBRIDGE_STATE_DIR/migrations/`` (default
``~/.cache/trackbridge``), replaced atomically on every save: ``records_written`` (source records written so far),
``records_pending`` (up to which record a batch was being written: 0 when none was in flight), ``max_step`` (the
highest step written), ``source`` (what the names were translated from) and ``complete``.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def state_dir() -> Path:
    return Path(os.environ.get("TRACKBRIDGE_STATE_DIR") or Path.home() / ".cache" / "trackbridge")


class Ledger:
    """How far each (source run, destination) migration got. One small JSON file per migration key."""

    def __init__(self, key: str) -> None:
        self.path = state_dir() / "migrations" / f"{key}.json"
        self.data: dict[str, Any] = {}
        if self.path.is_file():
            try:
                self.data = json.loads(self.path.read_text())
            except (OSError, json.JSONDecodeError):
                self.data = {}

    @property
    def written(self) -> int:
        return int(self.data.get("records_written", 0))

    @property
    def pending(self) -> int:
        """Records up to which a batch was being written when the migration stopped (0: none in flight)."""
        return int(self.data.get("records_pending", 0))

    @property
    def complete(self) -> bool:
        return bool(self.data.get("complete"))

    def save(self, **fields: Any) -> None:
        self.data.update(fields)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data))
        os.replace(tmp, self.path)


__all__ = ["Ledger", "state_dir"]
