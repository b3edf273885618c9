"""Replay a JSON-lines spool into a sink without duplicating what the tracker already holds.

The spool (``jsonl`` sink, always on while logging) is the canonical stream of a run: a ``run`` header line, then
one record per line. It is enough to rebuild the run in any tracker that missed it: because the tracker was down,
its sink failed mid-run, the run was killed, or it was added later. The same code serves three callers:

* :func:`replay` -- ``trackbridge replay SPOOL --to SINK`` after a run (finished or crashed);
* the logger, when a sink that failed mid-run recovers (it catches up from the spool before writing new records);
* the logger on ``resume=True``, for a sink that holds fewer steps than the spool.

How duplicates are avoided: the sink is opened with ``resume=True`` (so it reattaches to the run it already holds
rather than creating a second one) and asked what it holds, per key and step
(:meth:`~trackbridge.tracking.sink.Sink.held`, see :mod:`trackbridge.sync.holdings`); each record is cut down to the
points the tracker lacks, so a batch that landed in part (some keys written, others not) is completed and nothing is
written twice. A sink that cannot tell (wandb, whose rows land whole) is asked for its
:meth:`~trackbridge.tracking.sink.Sink.last_step` instead; records with ``step <= last_step`` are skipped. Per tracker:

* **jsonl**: what it holds is read from the file's complete lines; the file is appended to.
* **TensorBoard**: ``last_step`` scans the run folder's event files; without it a second copy of every point
  would be appended (TensorBoard does not deduplicate; its loaders keep the last value per step on display only).
* **wandb** (offline): wandb ignores ``resume`` offline, so the sink finds the existing offline run for the id and
  reports its last step; wandb itself would silently drop steps lower than the last one.
* **MLflow**: the run is found again by its trackbridge run id; the SQL store also ignores a row identical to one
  it holds (same key, value, timestamp, step), so a replay with the same wall times is idempotent there anyway.
* **Trackio**: ``last_step`` is read from its SQLite store (rows can also be skipped by log id).

A sink whose ``last_step`` is ``None`` is taken to hold nothing of the run and receives every record.

Spool reading (:mod:`trackbridge.stream`, as every reader of the canonical stream) is tolerant: a line that is not
valid JSON (a partial last line after SIGKILL, or an append after such a line) is skipped and reported as
``file:line: ...`` in the result's ``problems``; a partial point is never written anywhere. A spool stamped with an
older canonical schema version is read under today's names.
"""
from __future__ import annotations

import copy
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from ..errors import UsageError
from ..logger.pending import pending_file, read_pending, settle_pending, write_pending
from ..pipeline import Renamer, names_translator
from ..record import Record
from ..stream import StreamScan, read_stream, scan_stream
from ..stream import stream_file as spool_file

# The spool is the canonical stream: read it as trackbridge.stream reads every stream (one definition of the
# record numbers, the last step and the lines skipped).
SpoolScan = StreamScan
scan_spool = scan_stream


def iter_spool(path: str | os.PathLike, *, start: int = 0, stop: int | None = None,
               problems: list[str] | None = None) -> Iterator[tuple[int, Record]]:
    """``(seq, record)`` for the spool's records, ``seq`` counting record lines from 0; only ``start <= seq <
    stop``. Streams the file (:func:`trackbridge.stream.read_stream`)."""
    return read_stream(path, start=start, stop=stop, problems=problems)


@dataclass
class ReplayResult:
    """What a replay did: records written, records skipped as already present, the sink's last step before."""

    sink: str
    written: int = 0                   # records written (in full or the points the tracker lacked)
    skipped: int = 0                   # records the tracker held in full
    last_step_before: int | None = None
    points_held: int = 0               # points the tracker held already (exact, per key)
    exact: bool = False                # the tracker was read point by point (else: by its last step)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)     # worth saying, not a problem

    @property
    def damaged(self) -> list[str]:
        """The spool lines skipped that are damage, not the partial last line a killed process leaves."""
        return [p for p in self.problems if "partial last line" not in p]

    def __str__(self) -> str:
        held = "nothing" if self.last_step_before is None else f"steps up to {self.last_step_before}"
        if self.exact:
            held = f"{self.points_held} points, checked per key and step; last step {self.last_step_before}" \
                if self.points_held else "nothing of this run"
        text = f"{self.sink}: wrote {self.written} records, skipped {self.skipped} already present ({held})"
        if self.problems:
            text += f"; {len(self.problems)} spool lines skipped"
        return text


def replay(spool: str | os.PathLike, to: Any, *, names: str | None = None, batch_size: int = 1000,
           mappings: list[str] | None = None, close: bool = True) -> ReplayResult:
    """Send the run in ``spool`` (a spool ``.jsonl`` file) to the sink ``to`` (a locator string such as
    ``"mlflow:sqlite:///runs/mlflow.db"``, or a Sink object), skipping what it already holds.

    ``names``: the naming the tracker should receive; default: what the run was logged with (recorded in the
    spool header), canonical if nothing was recorded. Raises ``FileNotFoundError`` for a missing spool and
    ``ValueError`` for a spool without a run header; sink errors propagate (the tracker is the thing to fix).
    The run is ended as it ended (:func:`~trackbridge.logger.runlock.run_outcome`): a run whose process died
    without finishing it (SIGKILL, ``ray.kill``: its run claim was left) as killed (MLflow KILLED, wandb exit code
    137); a run whose pending note records how it ended (``sys.exit(1)`` or an exception: failed, MLflow FAILED and
    wandb exit code 1; Ctrl-C, SIGTERM, or the training process killed while its writer process finished: killed,
    with the exit code the run had) as that. A sink given already set to an outcome keeps it.
    """
    from ..trackers import make_sink
    from .catchup import catch_up

    path = Path(spool)
    if not path.is_file():
        raise FileNotFoundError(f"replay: spool file {str(path)!r} does not exist")
    scan = scan_spool(path)
    if scan.info is None:
        raise UsageError(f"replay: {path} has no run header line (type 'run'); is it a trackbridge spool?")
    sink = make_sink(to)
    info = copy.deepcopy(scan.info)
    from ..logger.common import KILLED_EXIT
    from ..logger.runlock import left_unfinished, run_outcome
    ended = None
    if getattr(sink, "outcome", "finished") == "finished":      # a sink given already set keeps its outcome
        try:
            note = read_pending(path)
        except UsageError:
            note = []
        ended = run_outcome(path, note)
    target = names or info.extra.get("names") or "canonical"
    info.names = target
    result = ReplayResult(sink=sink.describe(), problems=list(scan.problems))
    logged_with = info.extra.get("mappings")
    if logged_with and not mappings and target != "canonical":
        # paths come from the user, never from a data file (a shared spool could name /dev/zero or anyone's file)
        result.notes.append(f"the run was logged with the mapping file(s) {', '.join(map(str, logged_with))}, "
                            f"which are not read from the spool's header: pass --mappings to use them")
    rename = names_translator(target, mappings=mappings or None, config=info.config, origin=info.source,
                              fidelity=info.approximate)
    if ended is not None and ended[0] != "finished":
        outcome, code = ended
        if outcome == "killed" and code is None:
            code = KILLED_EXIT
        sink.outcome, sink.exit_code = outcome, code
        info.extra["outcome"] = outcome          # the trackers that keep it with the run info keep it too
        if left_unfinished(path):    # the process was killed before it could finish the run (its claim was left)
            result.notes.append("the run's process died without finishing it (its run claim was left): recorded "
                                "as killed")
        else:
            result.notes.append(f"the run ended {outcome}" + (f" (exit code {code})" if code is not None else "")
                                + ", as its pending note records: recorded so")
    sink.open(info, resume=True)
    try:
        done = catch_up(sink, (rename(rec) if rename else rec
                               for _seq, rec in iter_spool(path, problems=result.problems)), batch_size=batch_size)
        result.written, result.skipped = done.written, done.skipped
        result.points_held, result.exact, result.last_step_before = done.points_held, done.exact, done.last_step_before
        result.problems = sorted(set(result.problems), key=result.problems.index)
    finally:
        if close:
            sink.close()
    return result


__all__ = ["Renamer", "ReplayResult", "SpoolScan", "iter_spool", "names_translator", "pending_file", "read_pending",
           "replay", "scan_spool", "settle_pending", "spool_file", "write_pending"]
