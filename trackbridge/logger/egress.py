"""The one way out of the logger to the trackers (issue 35): a record is renamed once for every tracker (the names
``init(names=...)`` asks for; the spool stays canonical) and offered to each tracker's handle, and every tracker
opens with the same run info: the names it receives and the approximations under those names.

The tracker threads of the training process (:class:`~trackbridge.logger.dispatch.Dispatcher`) and the writer
process (:func:`~trackbridge.logger.writer.writer_main`) both send records through an :class:`Egress`, so the two
cannot disagree on a name or on what a tracker stores about the run."""
from __future__ import annotations

from typing import Any, Callable, Protocol

from ..record import Record, RunInfo
from .worker import sync_run_info


class TrackerHandle(Protocol):
    """What the egress offers records to: a tracker's worker thread (:class:`~.tracker.TrackerWorker`), or its
    stand-in in the training process when the writer process writes it (:class:`~.remote.RemoteTracker`)."""

    def put(self, seq: int, rec: Record) -> None:
        """Take record number ``seq`` (never blocks the caller)."""

    def stop(self) -> None:
        """No more records: finish what was taken."""


class Egress:
    """Rename once, fan out to the tracker handles; the run info each tracker opens with and stores.

    ``info``: a fresh copy of the run info every sink can store; ``live``: the run info as it is being learnt (the
    detected source and the approximations found so far, in canonical names); ``rename``: the pipeline to the names
    the trackers receive (None: canonical names); ``problem(key, message)``: say a problem once per key."""

    def __init__(self, *, info: Callable[[], RunInfo], live: RunInfo, rename: Callable[[Record], Record] | None,
                 names: str, problem: Callable[[str, str], None]) -> None:
        self.info = info
        self.live = live
        self.rename = rename
        self.names = names
        self.problem = problem
        self.handles: list[Any] = []        # TrackerHandle: set once they are built (they need the run info first)

    def put(self, seq: int, rec: Record) -> None:
        out = rec
        if self.rename is not None and self.handles:
            try:
                out = self.rename(rec)      # once for all trackers
            except Exception as exc:
                self.problem("names", f"renaming to {self.names!r} failed ({type(exc).__name__}: {exc}); "
                                      f"trackers get canonical names")
        for h in self.handles:
            h.put(seq, out)

    def approximate(self, is_spool: bool = False) -> dict[str, str]:
        """Name -> why its value is approximate, as found so far: canonical names for the spool, the names a
        tracker receives otherwise (none yet before the first record is renamed)."""
        if is_spool or self.rename is None:
            return dict(self.live.approximate)
        pipe = self.rename.pipeline()       # type: ignore[attr-defined]
        return dict(pipe.stats.approximate) if pipe is not None else {}

    def tracker_info(self, is_spool: bool = False) -> RunInfo:
        """The run info a sink is opened with: the spool's is canonical; a tracker's has the names it receives and
        the approximations under those names."""
        info = self.info()
        if not is_spool:
            info.names = self.names
            info.approximate = self.approximate(False)
        return info

    def sync_info(self, run: RunInfo | None, is_spool: bool) -> None:
        """Give a sink's copy of the run info what was learnt while logging (see :func:`.worker.sync_run_info`)."""
        sync_run_info(run, self.live, self.approximate(is_spool))
