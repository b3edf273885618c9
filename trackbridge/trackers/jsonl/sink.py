"""``jsonl:DIR`` -- the canonical stream as a tracker: one ``DIR/<run_id>.jsonl`` file per run.

The line format, its durability and its reading rules are :mod:`trackbridge.stream`'s (the logger's spool writes the
same stream through it directly); this sink only makes it a :class:`~trackbridge.tracking.sink.Sink`: a folder, one file
per run id, the header written with the run info the sink is opened with. Options: ``fsync=1`` (force every batch to
the disk: survives a machine crash, costs a disk round trip per batch). Needs nothing but the standard library.

What the run learns while it logs and the other trackers store with the run when it closes (``init(merge_ranks=True)``'s
steps merged without a rank, ``extra["ranks"]["incomplete"]``) is written as a **closing header**: the run info as it
stands at ``close()``, one more header line at the end of the stream (``stream.closing_header``), when it differs from
the header written at ``open()`` in what was learnt. The stream's readers take the last header of the run as its run
info (:func:`trackbridge.stream.scan_stream`, the ``jsonl`` source), so the list reaches whatever reads the stream.
The spool writes its closing header the same way.
"""
from __future__ import annotations

import uuid
from pathlib import Path
from typing import TYPE_CHECKING

from ... import stream
from ...record import Record, RunInfo
from ...stream import closing_header, learnt
from ...tracking.sink import Capabilities, Sink, SinkError

if TYPE_CHECKING:       # pragma: no cover
    from ...sync.holdings import Holdings


def _truthy(value: str | None) -> bool:
    return str(value).strip().lower() in ("1", "true", "yes", "on")


class JsonlSink(Sink):
    """Writes the canonical stream to ``DIR/<run_id>.jsonl``. Options: ``fsync=1``."""

    kind = "jsonl"
    option_names = ("fsync",)
    capabilities = Capabilities(histograms=True, text=True, nan=True, wall_time=True)

    def __init__(self, location: str = "", **options: str) -> None:
        super().__init__(location, **options)
        if not location:
            raise SinkError("jsonl sink: no folder given (expected jsonl:DIR)")
        self.fsync = _truthy(options.get("fsync"))
        self.path: Path | None = None
        self._writer: stream.StreamWriter | None = None
        self._learnt: str | None = None      # what the run info had learnt when the header was written

    def stream_file(self, run_id: str) -> Path:
        """The file this sink writes the run ``run_id`` to (the logger leaves out a sink that would write the
        spool's own file)."""
        return stream.stream_file(self.location, run_id)

    def open(self, run: RunInfo, *, resume: bool = False) -> None:
        if run.run_id is None:
            run.run_id = uuid.uuid4().hex[:12]
        self.run = run
        self.path = self.stream_file(run.run_id)
        writer = stream.StreamWriter(self.path, fsync=self.fsync, reject=self.reject)
        try:
            writer.open(run, resume=resume)
        except FileExistsError:
            raise SinkError(f"jsonl sink: {self.path} already holds run {run.run_id!r}; "
                            f"open with resume=True to append to it, or use a new run id") from None
        except OSError as exc:
            raise SinkError(f"jsonl sink: cannot write {self.path}: {exc}") from None
        self._writer = writer
        self._learnt = learnt(run)

    def write(self, records: list[Record]) -> None:
        if self._writer is None:
            raise SinkError(f"jsonl sink {self.location}: write() before open() or after close()")
        self._writer.write(records)

    def close(self) -> None:
        if self._writer is not None:
            try:
                head = closing_header(self.run, self._learnt, self._writer.schema)
                if head is not None:        # the run info as the other trackers store it at the end
                    self._writer.write_bytes(head)
                    self._learnt = learnt(self.run)
                self._writer.close()
            finally:
                self._writer = None

    def last_step(self) -> int | None:
        """The highest step of the file's complete record lines."""
        if self.path is None:
            return None
        if self._writer is not None:
            self._writer.flush()
        return stream.last_step(self.path)

    def held(self, since: int | None = None) -> "Holdings | None":
        """The points of the file's complete record lines (a partial last line holds nothing)."""
        if self.path is None:
            return None
        if self._writer is not None:
            self._writer.flush()
        return stream.holdings(self.path, since)

    def describe(self) -> str:
        return f"jsonl:{self.path or self.location}"
