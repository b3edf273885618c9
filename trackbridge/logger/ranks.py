"""Per-rank streams (``init(merge_ranks=True)``): every rank logs its own share of each value with its weight, and
rank 0 merges the shares into the value over the whole batch (:mod:`trackbridge.record.ranked`), which then takes the
run's one pipeline (translation, derived metrics, every sink) like any logged value.

**Where the merge happens, and why there.** Every rank, rank 0 included, appends what it logs to its own file,
``<spool>/<run_id>.ranks/rank-<r>.jsonl`` (:class:`~.rankfile.RankFile`: a thread of the rank writes it; ``log()`` only
validates and queues, as on rank 0 without ranks). A merger thread on rank 0 (:class:`Merger`) follows the files of
all ``world_size`` ranks, gathers the shares by step (the shares of every rank and of several calls at one step:
micro-batches merge too), and hands step *s* to the run once every rank has gone past it (logged a higher step, or
finished). No collective operation runs in ``log()``: a rank that dies never blocks another rank, and the training
loop never waits on the network. What survives what:

* a rank that dies, hangs or lags: its file simply stops. Once the other ranks are ``rank_timeout`` seconds past a
  step, the merger hands the step on without the missing rank and says so (a warning naming the rank and the steps,
  ``run.problems``, the merged names' ``approximate`` marks, and ``info.extra["ranks"]["incomplete"]``, which every
  tracker stores with the run); from then on that rank is not waited for, until it writes again;
* rank 0 dying: every rank's shares are already in its file (handed to the operating system at most
  ``flush_interval / 2`` s after ``log()``); a resumed run (``resume=True``) merges from the files what the spool
  does not hold yet (steps after the spool's last step);
* files need a folder every rank can write and rank 0 can read: the node's disk for a one-node job, a shared file
  system otherwise (``spool=`` names it, the same on every rank). ``run_id`` must be the same on every rank (given,
  or torchrun's ``TORCHELASTIC_RUN_ID``).

Values logged without a weight are merged where their canonical name's statistic needs no weight (the max of the
ranks' maxima, the sum of their sums or counts, a value the same on every rank); a mean or a std logged without a
weight, with different values on different ranks, is rank 0's value, marked approximate and said once. Steps must
not go back within a run with merged ranks: a share that arrives for a step already handed on is left out and
reported (it stays in its rank's file). Shares are merged in rank order (a ``value`` keeps the lowest rank's). Rank 0
stats every file it follows each poll and opens only those that grew; the poll interval doubles from 50 ms up to
1 s while nothing arrives (benchmarks/bench_merge_ranks.py). Across nodes (``LOCAL_WORLD_SIZE < WORLD_SIZE``) each
node's local rank 0 pre-merges its node's ranks and rank 0 follows one file per node (:mod:`.nodes`), with the same
merged values to the last bit (:mod:`.parts`).
"""
from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..record import decode_value
from ..record.ranked import MergeError, Share, merge, same_value
from .common import warn
from .parts import Packed, Part, merge_parts, rank_of
from .rankfile import rank_path

RANK_TIMEOUT = 60.0
_POLL = 0.05            # seconds between polls while lines arrive
_POLL_IDLE = 1.0        # at most this long between polls when nothing arrives (the interval doubles up to it)


# ------------------------------------------------------------------------------------------------- the merger
@dataclass
class _Rank:
    path: Path
    offset: int = 0
    buf: bytes = b""
    top: int | None = None          # highest step seen
    ended: bool = False
    gone: bool = False              # timed out: not waited for until it writes again
    seen_at: float = 0.0
    skip: int | None = None         # a node taken over: steps up to here came from its node file


@dataclass
class _Step:
    wall0: float | None = None      # rank 0's first call at the step: the record's wall time
    wall_min: float | None = None   # else the earliest of any rank
    plain: dict[str, Any] = field(default_factory=dict)
    others: dict[str, list[tuple[int, Any]]] = field(default_factory=dict)   # other ranks' values without a weight
    shares: dict[str, list[Share]] = field(default_factory=dict)
    ranks: set[int] = field(default_factory=set)
    waiting_since: float | None = None
    wparts: dict[str, list[Packed]] = field(default_factory=dict)   # nodes' parts of weighted keys (nodes.py)
    pparts: dict[str, list[Packed]] = field(default_factory=dict)   # nodes' parts of values without a weight
    node_missing: set[int] = field(default_factory=set)             # ranks a node merged without


class Merger:
    """Rank 0's thread: follows every rank's file, merges the shares of each step, hands the merged record to
    ``emit(wall_time, step, values)`` in step order (see the module docstring)."""

    def __init__(self, folder: Path, world_size: int, *, emit: Callable[[float, int, dict[str, Any]], None],
                 reduction: Callable[[str], tuple[str | None, bool]], rank_timeout: float = RANK_TIMEOUT,
                 after_step: int | None = None,
                 on_incomplete: Callable[[int, list[int], list[str]], None] | None = None,
                 report: Callable[[str], None] | None = None, ranks: list[int] | None = None) -> None:
        self.folder = folder
        self.world_size = world_size
        self.emit = emit
        self.reduction = reduction
        self.rank_timeout = rank_timeout
        self.on_incomplete = on_incomplete
        self.on_plain: Callable[[str, str], None] | None = None     # a key kept as rank 0's value, and why
        self.report = report or warn
        self.emitted: int | None = after_step   # steps up to here are handed on (or were, before a resume)
        self.resumed_at = after_step         # a resumed run: the files' earlier lines up to here are in the spool
        self.replayed = 0                    # such lines, skipped without a word
        self.started = time.monotonic()
        self.ranks = {r: _Rank(rank_path(folder, r), seen_at=self.started)
                      for r in (range(world_size) if ranks is None else ranks)}
        self.nodes: Any = None      # node pre-merge: a nodes.NodeWatch over the other nodes' files
        self.pending: dict[int, _Step] = {}
        self.late: dict[int, int] = {}       # rank -> shares left out because their step was handed on
        self._said: set[str] = set()
        self._stop = threading.Event()
        self._finishing = False
        self._lock = threading.Lock()
        self.thread = threading.Thread(target=self._main, name="trackbridge-merge-ranks", daemon=True)

    # -- reading ------------------------------------------------------------------------------------------------
    def _read(self, r: int, st: _Rank, now: float) -> bool:
        """Read what rank ``r`` appended since the last poll; False when nothing was (one ``stat``, no open: rank 0
        polls every rank's file, so an idle rank costs a system call, not an open and a read)."""
        try:
            if os.stat(st.path).st_size <= st.offset:
                return False
            with open(st.path, "rb") as fh:
                fh.seek(st.offset)
                data = fh.read()
        except FileNotFoundError:
            return False
        if not data:
            return False
        st.offset += len(data)
        data = st.buf + data
        cut = data.rfind(b"\n") + 1
        st.buf = data[cut:]
        for raw in data[:cut].splitlines():
            if not raw.strip():
                continue
            try:
                obj = json.loads(raw)
            except ValueError:
                self._once(f"bad:{r}", f"{st.path}: a line that is not JSON was skipped")
                continue
            st.seen_at = now
            if st.gone:
                st.gone = False
                self._once(f"back:{r}", f"rank {r} writes again; it is waited for from its next step on")
            kind = obj.get("type")
            if kind == "end":
                st.ended = True
            elif kind is None and isinstance(obj.get("step"), int):
                self._take(r, st, obj)
        return True

    def _take(self, r: int, st: _Rank, obj: dict[str, Any]) -> None:
        step = obj["step"]
        st.top = step if st.top is None else max(st.top, step)
        if st.skip is not None and step <= st.skip:
            return                           # its node's file held this step (a node taken over)
        if self.resumed_at is not None and step <= self.resumed_at:
            self.replayed += 1               # merged before the resume (the spool holds it)
            return
        if self.emitted is not None and step <= self.emitted:
            self.late[r] = self.late.get(r, 0) + 1
            self._once(f"late:{r}", f"rank {r} logged step {step} after that step was handed on without it (steps "
                                    f"must not go back, and a rank more than rank_timeout={self.rank_timeout:g} s "
                                    f"behind is not waited for); its shares stay in {st.path}")
            return
        group = self.pending.setdefault(step, _Step())
        group.ranks.add(r)
        wall = obj.get("wall_time")
        if isinstance(wall, (int, float)):
            if r == 0 and group.wall0 is None:
                group.wall0 = float(wall)
            group.wall_min = float(wall) if group.wall_min is None else min(group.wall_min, float(wall))
        metrics = {k: decode_value(v) for k, v in (obj.get("metrics") or {}).items()}
        shares = obj.get("shares") or {}
        for k, v in metrics.items():
            s = shares.get(k)
            if isinstance(s, list) and len(s) == 3:
                group.shares.setdefault(k, []).append(Share(r, v, float(s[0]), s[1], s[2]))
            elif r == 0:
                group.plain[k] = v           # rank 0's own value (the last call at the step wins, as in wandb)
            else:
                group.others.setdefault(k, []).append((r, v))     # merged by its stated statistic, or said

    # -- handing on ---------------------------------------------------------------------------------------------
    def _passed(self, r: int, st: _Rank, step: int) -> bool:
        return st.ended or st.gone or (st.top is not None and st.top > step)

    def _ready(self, now: float, force: bool) -> None:
        for step in sorted(self.pending):
            group = self.pending[step]
            waiting = [r for r, st in self.ranks.items() if not self._passed(r, st, step)]
            nodes = self.nodes.waiting(step) if self.nodes is not None else []
            if (waiting or nodes) and not force:
                if group.waiting_since is None:
                    if (len(waiting) < len(self.ranks) or (self.nodes is not None and self.nodes.passed_any(step))
                            or any(st.top is not None and st.top > step for st in self.ranks.values())):
                        group.waiting_since = now
                waited = None if group.waiting_since is None else now - group.waiting_since
                if nodes:                # a node is never merged without: its ranks' files are read instead
                    if self.nodes is not None and self.nodes.stalled(nodes, waited, now):
                        return
                    if waiting and waited is not None and waited >= self.rank_timeout:
                        for r in waiting:
                            if r not in group.ranks:
                                self.ranks[r].gone = True
                    return
                if waited is None or waited < self.rank_timeout:
                    return               # in step order: nothing after this step goes first
                for r in waiting:
                    if r not in group.ranks:
                        self.ranks[r].gone = True
            # missing: ranks that neither logged at this step nor went past it (gone, or not waited for any more);
            # a rank that finished, or logged a later step without this one, simply had nothing here
            missing = sorted({r for r, st in self.ranks.items()
                              if r not in group.ranks and not st.ended and (st.top is None or st.top < step)}
                             | group.node_missing)
            self._hand_on(step, group, missing)
            del self.pending[step]

    def _hand_on(self, step: int, group: _Step, missing: list[int]) -> None:
        values = dict(group.plain)
        merged_plain = self._merge_plain(group, values)
        for key in {**group.shares, **group.wparts}:
            # in rank order (a rank's calls in their order): the lowest rank's value is the one a ``value`` keeps
            shares = sorted(group.shares.get(key, ()), key=lambda s: s.rank)
            parts = group.wparts.get(key)
            stated = {s.reduce for s in shares if s.reduce}.union(*(p.stated for p in parts or ()))
            if len(stated) > 1:
                self._once(f"reduce:{key}", f"metric {key!r}: the ranks state different reductions "
                                            f"({', '.join(sorted(stated))}); {sorted(stated)[0]!r} is used")
            reduce, sample = (sorted(stated)[0], True) if stated else self.reduction(key)
            try:
                if parts:                # nodes' parts (node pre-merge): the same value as every share would give
                    items: list[Share | Packed] = sorted([*shares, *parts], key=rank_of)
                    value, note = merge_parts(key, reduce or "mean", items, sample_std=sample)
                else:
                    value, note = merge(key, reduce or "mean", shares, sample_std=sample)
            except MergeError as exc:
                self._once(f"merge:{key}", f"{exc}; rank 0's value is logged instead")
                own = [s for s in shares if s.rank == 0]
                if not own:
                    continue
                value, note = own[-1].value, None
            if note:
                self._once(f"note:{key}", note)
            values[key] = value
        if missing and self.on_incomplete is not None:
            self.on_incomplete(step, missing, sorted({*group.shares, *group.wparts, *merged_plain}))
        wall = group.wall0 if group.wall0 is not None else group.wall_min if group.wall_min is not None else time.time()
        self.emitted = step if self.emitted is None else max(self.emitted, step)
        self.emit(wall, step, values)

    def _merge_plain(self, group: _Step, values: dict[str, Any]) -> list[str]:
        """Values several ranks logged without a weight: merged by the statistic their canonical name states where
        no weight is needed (the max of the ranks' maxima, the sum of their sums or counts, a value the same on every
        rank); a mean or a std cannot be merged without the ranks' counts, so rank 0's value stays, marked
        approximate and said once (never rank 0's value passed off as the batch's). Returns the keys merged."""
        merged = []
        for key in {**group.others, **group.pparts}:
            items: list[Share | Packed] = [Share(r, v, 1.0, None, None) for r, v in group.others.get(key, ())]
            items = sorted([*items, *group.pparts.get(key, ())], key=rank_of)
            if key in group.plain:
                items.insert(0, Share(0, group.plain[key], 1.0, None, None))
            reduce, _sample = self.reduction(key)
            if reduce in ("max", "min", "sum", "value"):
                try:
                    if key in group.pparts:
                        value, note = merge_parts(key, reduce, items)
                    else:
                        value, note = merge(key, reduce, items)    # type: ignore[arg-type]
                except MergeError as exc:
                    self._once(f"plain:{key}", f"{exc}; rank 0's value is logged instead")
                    continue
                if note:
                    self._once(f"note:{key}", note)
                values[key] = value
                merged.append(key)
                continue
            if key in group.pparts:
                total = Part()
                for x in items:
                    total.add_part(x.part()) if isinstance(x, Packed) else total.add_share(x)
                same, ranks = total.same, total.n_ranks
            else:
                shares: list[Share] = items     # type: ignore[assignment]
                same = all(same_value(s.value, shares[0].value) for s in shares[1:])
                ranks = len({s.rank for s in shares})
            if same:
                continue                     # the same on every rank (a learning rate): rank 0's is the batch's
            why = (f"logged without a weight on {ranks} ranks: rank 0's value, not the "
                   f"batch's ({reduce or 'no statistic stated'} cannot be merged without each rank's count: log "
                   f"trackbridge.Weighted(value, count))")
            if self.on_plain is not None:
                self.on_plain(key, why)
            self._once(f"plain:{key}", f"metric {key!r} {why}")
        return merged

    def _once(self, key: str, message: str) -> None:
        if key not in self._said:
            self._said.add(key)
            self.report(message)

    # -- the thread -----------------------------------------------------------------------------------------------
    def poll(self, force: bool = False) -> bool:
        """Read every rank's new lines and hand on the steps that are ready; True when any rank wrote."""
        with self._lock:
            now = time.monotonic()
            wrote = False
            for r, st in list(self.ranks.items()):
                wrote = self._read(r, st, now) or wrote
            if self.nodes is not None:
                wrote = self.nodes.poll(now) or wrote
            self._ready(now, force)
            return wrote

    def _main(self) -> None:
        interval = _POLL
        try:
            while not self._stop.wait(interval):
                # idle ranks: the interval doubles up to _POLL_IDLE (the files are stat'ed, not read, meanwhile)
                interval = _POLL if self.poll() else min(interval * 2, _POLL_IDLE)
        except Exception as exc:      # never let the merger take training down; say what stopped it
            warn(f"trackbridge: merging the ranks stopped ({type(exc).__name__}: {exc}); the ranks' files keep "
                 f"their shares in {self.folder}")

    def start(self) -> None:
        self.thread.start()

    def finish(self, deadline: float) -> None:
        """Rank 0 is done: wait for the other ranks to finish (each at most ``rank_timeout`` seconds after it last
        wrote, all before ``deadline``), hand on every step, stop."""
        self._stop.set()
        if self.thread.is_alive():
            self.thread.join(max(0.0, deadline - time.monotonic()))
        while time.monotonic() < deadline:
            self.poll()
            now = time.monotonic()
            if self.nodes is not None:
                self.nodes.finishing(now)      # a silent node: its ranks' files are read instead
            open_ranks = [r for r, st in self.ranks.items() if not (st.ended or st.gone)]
            open_nodes = self.nodes.open() if self.nodes is not None else []
            if not open_ranks and not open_nodes:
                break
            if open_ranks and all(now - self.ranks[r].seen_at >= self.rank_timeout for r in open_ranks):
                for r in open_ranks:
                    self.ranks[r].gone = True
                self._once(f"finish:{open_ranks}", f"rank(s) {', '.join(map(str, open_ranks))} did not finish "
                                                   f"within rank_timeout={self.rank_timeout:g} s of their last "
                                                   f"line; their last steps are merged without them")
                if not open_nodes:
                    break
            time.sleep(_POLL)
        self.poll(force=True)


# ------------------------------------------------------------------------------------------------- on each rank


__all__ = ["Merger", "RANK_TIMEOUT"]
