"""What a non-zero rank gets from ``init``."""
from __future__ import annotations

from typing import Any

from ..record import RunInfo
from .checks import validate_call
from .common import RunView


class NoOpRun(RunView):
    """The same API as :class:`~trackbridge.logger.Run` (a test checks the two against each other); ``log()``
    validates and discards, nothing is written, ``config``/``name``/``info`` are what ``init`` was given."""

    def __init__(self, rank: int, *, project: str | None = None, name: str | None = None,
                 config: dict[str, Any] | None = None, run_id: str | None = None, names: str = "canonical",
                 resume: bool = False, options: Any = None) -> None:
        self.rank = rank
        self.run_id = run_id
        self.spool_path = None
        self.problems: list[str] = []
        self.resume = bool(resume)
        self.names = names or "canonical"
        self.options = options
        self.info = RunInfo(name=name, project=project, run_id=run_id, config=dict(config or {}))

    def log(self, metrics: dict[str, Any], step: int | None = None) -> None:
        validate_call(metrics, step)      # refuses what rank 0 refuses, then discards

    def tracker_info(self, is_spool: bool = False) -> RunInfo:
        return self.info

    def tracker_approximate(self, is_spool: bool = False) -> dict[str, str]:
        return {}

    def finish(self, timeout: float | None = None, *, failed: bool = False) -> dict[str, Any]:
        return self.status

    @property
    def status(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "rank": self.rank, "writing": False, "spool": None, "finished": False,
                "logged": 0, "sinks": [], "problems": []}

    def summary(self) -> str:
        return f"rank {self.rank}: not writing (only rank 0 writes; init(rank_zero_only=False) to change)"

    def __enter__(self) -> "NoOpRun":
        return self

    def __exit__(self, *exc: Any) -> None:
        pass
