"""Resuming one run of a migration (:func:`.migration._migrate_claimed`, under the run's ledger claim): what its
ledger says an earlier attempt did, what the destination really holds, and the writing of the rest, batch by batch.

Each batch is written in three parts, in order: the records the ledger counts as written (skipped), the records
that may be in the destination (a batch that was in flight when an earlier attempt stopped: cut down to what the
destination lacks, through :func:`trackbridge.sync.catchup.lacking` as in every catch-up), and the records it cannot
hold yet. The ledger marks a batch pending before it is written and written after it, with the counts so far.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..pipeline import Stats
from ..sync.catchup import CatchUp, lacking

if TYPE_CHECKING:       # pragma: no cover
    from ..pipeline import Pipeline
    from ..record import Record, RunInfo
    from ..sync.holdings import Holdings
    from ..tracking.sink import Sink
    from .ledger import Ledger
    from .migration import Progress, RunResult, Throttle


def adopt_ledger(ledger: Ledger, res: RunResult, dest_missing: bool, plan: str | None) -> bool:
    """Start the run's result from its ledger; returns whether the ledger belongs to this plan (``plan``).

    A ledger that says the run was written into a destination that is gone since is reset, so the run is migrated
    again. When an earlier attempt of this plan got this far, its counts are this run's too; a run new to this plan
    gets the plan and zero counts in its ledger."""
    same_plan = plan is not None and ledger.data.get("plan") == plan
    if ledger.written and dest_missing and not same_plan:
        # the ledger says this run went there before, but the destination is gone: migrate it again
        ledger.data = {}
        ledger.save(records_written=0, complete=False)
    if same_plan:       # an earlier attempt of this plan got this far: its counts are this run's too
        res.records = int(ledger.data.get("out_records", 0))
        res.points = int(ledger.data.get("out_points", 0))
        res.skipped_records = int(ledger.data.get("out_skipped", 0))
    elif plan is not None:
        ledger.save(plan=plan, out_records=0, out_points=0, out_skipped=0)
    return same_plan


def finished_before(ledger: Ledger, res: RunResult, same_plan: bool) -> bool:
    """Whether the ledger shows the run complete, so nothing is written now; if so, the result says by whom.

    A run finished by an earlier attempt of this plan gets that attempt's stats; one finished by an earlier command
    is marked as already migrated."""
    if not ledger.complete:
        return False
    if same_plan:
        res.finished_earlier = True
        res.stats = Stats(**ledger.data["stats"]) if isinstance(ledger.data.get("stats"), dict) else Stats()
    else:
        res.already_done = True
    res.stats.source = ledger.data.get("source", "")
    return True


@dataclass
class Cursor:
    """Where the writing of one run stands. ``skip_n``: the records the ledger counts as written; ``check_n``: the
    records up to which some may be in the destination (None: every one, as without a ledger); ``max_written``: the
    highest step written so far; ``opened``: the destination run is open (and must be closed on the way out);
    ``last_step`` and ``held``: what the destination holds; ``seen``: the records taken from the stream so far."""

    skip_n: int
    check_n: int | None
    max_written: int | None
    opened: bool = False
    last_step: int | None = None
    held: Holdings | None = None
    seen: int = 0

    @classmethod
    def from_ledger(cls, ledger: Ledger) -> Cursor:
        """The cursor at the start of an attempt, from what the run's ledger says earlier attempts wrote."""
        skip_n = ledger.written
        # A batch that was being written when the migration was killed may be in the destination in full, in part
        # or not at all: its records are checked against the destination's last step (as without a ledger).
        check_n = ledger.pending if skip_n else None
        return cls(skip_n, check_n, ledger.data.get("max_step"))    # highest step written so far (per the ledger)


def open_sink(sink: Sink, pipe: Pipeline, out_info: RunInfo, cur: Cursor, throttle: Throttle) -> None:
    """Open (or reopen) the run in the destination once the rate limit lets its request go; marks the cursor open."""
    throttle(1, 0)
    sink.open(pipe.run_info(out_info), resume=True)
    cur.opened = True


def read_destination(sink: Sink, cur: Cursor, res: RunResult, same_plan: bool) -> None:
    """Read what the just-opened destination run holds, where the ledger cannot tell (a run without a ledger entry,
    or a batch that was in flight), and trust the destination over a ledger that counts more than it holds."""
    if cur.skip_n == 0 or (cur.check_n or 0) > cur.skip_n:
        # what the destination really holds, per key and step: a batch that landed in part is completed
        cur.held = sink.held()
        cur.last_step = cur.held.last_step() if cur.held is not None else sink.last_step()
    if cur.skip_n and cur.max_written is not None:
        top = cur.last_step if cur.last_step is not None else sink.last_step()
        if top is None or top < cur.max_written:
            # the destination lost what the ledger counted (wandb offline buffers writes in its
            # service process; a kill loses them): trust the destination, as without a ledger
            cur.skip_n, cur.check_n, cur.last_step = 0, None, top
            cur.held = cur.held if cur.held is not None else sink.held()
            if same_plan:       # everything is counted again, as written or as held
                res.records = res.points = res.skipped_records = 0


def write_batch(batch: list[Record], cur: Cursor, sink: Sink, pipe: Pipeline, ledger: Ledger, res: RunResult,
                same_plan: bool, throttle: Throttle, prog: Progress) -> None:
    """Write what the destination lacks of one batch, and count it in the result, the progress line and the ledger.

    The ledger marks the batch pending before anything is written, and written after, with the result's counts
    (what the destination's tracker could not take is counted in the result's ``left_out``)."""
    # in order: records the ledger counts as written, records that may be in the destination (cut down to
    # what it lacks, as every catch-up does), records it cannot hold yet
    start, cur.seen = cur.seen, cur.seen + len(batch)
    n_skip = min(len(batch), max(0, cur.skip_n - start))
    rest = batch[n_skip:]
    n_check = len(rest) if cur.check_n is None else min(len(rest), max(0, cur.check_n - start - n_skip))
    held_now = CatchUp()
    todo = [*lacking(rest[:n_check], cur.held, cur.last_step, held_now), *rest[n_check:]]
    # records the ledger counts as written were counted by the attempt that wrote them when it is this plan's
    res.skipped_records += (0 if same_plan else n_skip) + held_now.skipped
    if todo:
        ledger.save(records_written=max(cur.seen - len(batch), cur.skip_n), records_pending=cur.seen,
                    source=pipe.stats.source, complete=False)
        pts = sum(len(r.metrics) for r in todo)
        throttle(1, pts)
        sink.write(todo)
        for key, step, why in sink.take_rejected():     # what the tracker could not take: said, counted
            seen_key = res.left_out.setdefault(key, [0, why, step])
            seen_key[0] += 1
        steps = [r.step for r in todo if r.step is not None]
        if steps:
            cur.max_written = max(steps) if cur.max_written is None else max(cur.max_written, *steps)
        res.records += len(todo)
        res.points += pts
        prog.add(pts)
    ledger.save(records_written=cur.seen, records_pending=0, max_step=cur.max_written, source=pipe.stats.source,
                complete=False, out_records=res.records, out_points=res.points, out_skipped=res.skipped_records)
