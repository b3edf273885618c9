"""The one small interface every run reader implements: list runs, read config, read points as a stream.

A :class:`Source` is opened from a locator and lists the :class:`RunReader` objects it holds (a TensorBoard root or an
MLflow experiment holds many runs; a ``trainer_state.json`` holds one). A run reader yields
:class:`~trackbridge.record.Record` objects *under the names as stored* (translation happens later in the pipeline),
with any sanitization that trackbridge recorded in the run already undone. Readers stream: they never load a whole run
into memory. Anything they cannot read is reported in :attr:`RunReader.problems` (with file and offset or line) and
skipped; a partial point is never yielded.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Iterator

from ..record import Record, RunInfo


@dataclass
class Problem:
    """Something a reader skipped: where (file and offset or line) and why."""

    where: str
    what: str

    def __str__(self) -> str:
        return f"{self.where}: {self.what}"


class SourceError(RuntimeError):
    """A source that cannot be read at all (missing path, unreachable server, no such run)."""


class RunReader(ABC):
    """One run inside a source."""

    def __init__(self) -> None:
        self.problems: list[Problem] = []

    @property
    @abstractmethod
    def info(self) -> RunInfo:
        """Name, project, config/hyperparameters, tags and recorded sanitization of the run."""

    @abstractmethod
    def records(self) -> Iterator[Record]:
        """The run's points, in stored order, grouped per (step, wall time) where the store allows."""

    @property
    def has_wall_time(self) -> bool:
        return True

    def skip(self, where: str, what: str) -> None:
        self.problems.append(Problem(where, what))


class Source(ABC):
    kind: str = "source"

    def __init__(self, location: str, **options: str) -> None:
        self.location = location
        self.options = dict(options)

    @abstractmethod
    def runs(self) -> Iterator[RunReader]:
        """Every run this source holds (after filtering by the locator's options)."""


def mark_derived(info: RunInfo, records: Iterator[Record]) -> Iterator[Record]:
    """Restore the per-record ``derived`` marks from the run's list of derived metrics (``info.extra["derived"]``),
    for stores that keep the mark per run (a tag or config entry) rather than per point."""
    derived = set((info.extra or {}).get("derived") or ()) if isinstance(info.extra, dict) else set()
    for rec in records:
        if derived:
            extra = [k for k in rec.metrics if k in derived and k not in rec.derived]
            if extra:
                rec.derived = [*rec.derived, *extra]
        yield rec
