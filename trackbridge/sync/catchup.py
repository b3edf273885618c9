"""Write what a tracker lacks, in batches: the one catch-up step of the logger, ``replay``, ``migrate`` and
``compare --into``.

Records (already under the names the tracker receives) are cut down to the points the tracker does not hold
(:class:`~trackbridge.sync.holdings.Holdings`, read back from the tracker by the caller), or, for a tracker that cannot
tell (:meth:`~trackbridge.tracking.sink.Sink.held` returns ``None``), to the records after its last step; then they are
written in batches. Errors from the sink propagate: the caller knows whether to retry, fail the sink or report.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

from ..record import Record
from .holdings import Holdings


@dataclass
class CatchUp:
    """What a catch-up did: records written (whole, or the points the tracker lacked), records the tracker held in
    full, points it held, and whether it was judged point by point (``exact``) or by its last step."""

    written: int = 0
    skipped: int = 0
    points_held: int = 0
    exact: bool = False
    last_step_before: int | None = None


def lacking(records: Iterable[Record], held: Holdings | None, last_step: int | None,
            result: CatchUp) -> Iterator[Record]:
    """The records (or parts of them) the tracker lacks; counts what it held into ``result``."""
    if held is not None:
        counts: dict[str, int] = {}
        result.exact = True
        try:
            yield from held.filter(records, counts)
        finally:
            result.skipped += counts.get("records_held", 0)
            result.points_held += counts.get("points_held", 0)
        return
    for rec in records:
        if last_step is not None and rec.step is not None and rec.step <= last_step:
            result.skipped += 1
            continue
        yield rec


def write_batches(sink: Any, records: Iterable[Record], batch_size: int = 1000,
                  write: Callable[[list[Record]], None] | None = None) -> int:
    """Write records to an open sink in batches of ``batch_size`` (through ``write`` if given, e.g. a worker's
    write that also reports refused keys); returns how many were written. Errors propagate."""
    put = write or sink.write
    n = 0
    batch: list[Record] = []
    for rec in records:
        batch.append(rec)
        if len(batch) >= batch_size:
            put(batch)
            n += len(batch)
            batch = []
    if batch:
        put(batch)
        n += len(batch)
    return n


def catch_up(sink: Any, records: Iterable[Record], *, since: int | None = None, batch_size: int = 1000,
             write: Callable[[list[Record]], None] | None = None, by_last_step: bool = True) -> CatchUp:
    """Ask the open ``sink`` what it holds (steps ``>= since``), then write the rest of ``records`` in batches.
    ``by_last_step=False``: a sink that cannot tell gets every record (the caller knows it holds none of them)."""
    result = CatchUp()
    held = sink.held(since)
    last = None
    if held is not None:
        result.last_step_before = held.last_step()
    elif by_last_step:
        last = result.last_step_before = sink.last_step()
    result.written = write_batches(sink, lacking(records, held, last, result), batch_size, write)
    return result


__all__ = ["CatchUp", "catch_up", "lacking", "write_batches"]
