"""What a non-zero rank gets from ``init``."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..record import RunInfo
from .checks import validate_call
from .common import RunView

if TYPE_CHECKING:       # pragma: no cover
    from .options import LoggerOptions


class NoOpRun(RunView):
    """The same API as :class:`~trackbridge.logger.Run` (a test checks the two against each other); ``log()``
    validates and discards, nothing is written, ``config``/``name``/``info`` are what ``init`` was given."""

    def __init__(self, rank: int, *, project: str | None = None, name: str | None = None,
                 config: dict[str, Any] | None = None, run_id: str | None = None, names: str = "canonical",
                 resume: bool = False, options: LoggerOptions | None = None) -> None:
        self.rank = rank
        self.run_id = run_id
        self.spool_path: Path | None = None
        self.problems: list[str] = []
        self.resume = bool(resume)
        self.names = names or "canonical"
        self.options = options
        self.info: RunInfo = RunInfo(name=name, project=project, run_id=run_id, config=dict(config or {}))

    def log(self, metrics: dict[str, Any], step: int | None = None, weights: dict[str, Any] | None = None, *,
            axis: str | None = None) -> None:
        """Check the call as :meth:`Run.log <trackbridge.logger.Run.log>` does (and raise the same errors), then
        discard it."""
        validate_call(metrics, step, axis)      # refuses what rank 0 refuses, then discards

    def finish(self, timeout: float | None = None, *, failed: bool = False) -> dict[str, Any]:
        """Nothing to flush; returns :attr:`status`."""
        return self.status

    @property
    def findings(self) -> list[Any]:
        """The live checks run on rank 0 only: ``[]``."""
        return []

    @property
    def status(self) -> dict[str, Any]:
        """The same keys as :attr:`Run.status <trackbridge.logger.Run.status>`: not writing, no sinks."""
        return {"run_id": self.run_id, "rank": self.rank, "writing": False, "spool": None, "finished": False,
                "logged": 0, "sinks": [], "writer": None, "problems": []}

    def summary(self) -> str:
        """One line saying that this rank does not write."""
        return (f"rank {self.rank}: not writing (only rank 0 writes; options=LoggerOptions(rank_zero_only=False) "
                "to change)")

    def __enter__(self) -> "NoOpRun":
        return self

    def __exit__(self, *exc: Any) -> None:
        pass
