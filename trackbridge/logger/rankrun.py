"""The logger's side of merged ranks (``init(merge_ranks=True)``): :class:`RankLink`, rank 0's link from its run to
the :class:`~.ranks.Merger` (its own rank file, the merged records into the run), :class:`RankRun`, what every other
rank's ``init`` returns, and :func:`check_world`. The rank files and their merge are :mod:`.ranks`; across nodes the
pre-merge is :mod:`.nodes`, wired in here (below both)."""
from __future__ import annotations

import atexit
import math
import time
from pathlib import Path
from typing import Any

from ..errors import UsageError
from ..record.ranked import reduction_of
from .common import log, warn
from .noop import NoOpRun
from .rankfile import RankFile, ranks_folder
from .ranks import RANK_TIMEOUT, Merger


class RankLink:
    """What ``init(merge_ranks=True)`` attaches to rank 0's :class:`~trackbridge.logger.Run`: its own rank file and
    the merger, which feeds the run's inbox."""

    def __init__(self, run: Any, *, world_size: int, rank_timeout: float, spool_dir: Path) -> None:
        self.run = run
        self.world_size = world_size
        folder = ranks_folder(spool_dir, run.run_id)
        self.folder = folder
        self.file = RankFile(folder, 0, world_size, run.run_id, flush_interval=run.options.flush_interval,
                             report=run._report_values)

        def say(message: str) -> None:
            run._warn_once(message, message)
        info = run.info
        info.extra["ranks"] = {"world_size": world_size, "merged": True, "folder": str(folder), "incomplete": []}
        self._names: dict[str, tuple[str | None, bool]] = {}
        self._source = info.source or "auto"
        self._mappings = (info.extra or {}).get("mappings")
        after = run._next_step - 1 if run.resume and run._next_step > 0 else None
        from .nodes import NODE_TIMEOUT, NodeWatch, node_layout
        layout = node_layout(0, world_size)
        own = None if layout is None or layout.node else layout.ranks_of(0)
        self.merger = Merger(folder, world_size, emit=self._emit, reduction=self._reduction,
                             rank_timeout=rank_timeout, after_step=after, on_incomplete=self._incomplete,
                             report=say, ranks=own)
        self.merger.on_plain = self._plain
        if layout is not None and own is not None:      # node pre-merge: this node's ranks, the others' node files
            info.extra["ranks"]["nodes"] = {"nodes": layout.nodes, "per_node": layout.per_node, "taken_over": []}
            self.merger.nodes = NodeWatch(self.merger, layout, min(rank_timeout, NODE_TIMEOUT), on_take=self._taken)
        self.merger.start()

    def log(self, metrics: Any, step: Any, weights: dict[str, Any] | None, wall_time: float) -> None:
        self.file.log(metrics, step, weights, wall_time)

    def _emit(self, wall_time: float, step: int, values: dict[str, Any]) -> None:
        self.run._inbox.put((wall_time, step, values))

    def _reduction(self, key: str) -> tuple[str | None, bool]:
        """The reduction the canonical name of ``key`` states (None: none stated), and whether its std is a
        sample std."""
        if key not in self._names:
            self._names[key] = _canonical_reduction(key, self._source, self._mappings)
        return self._names[key]

    def _incomplete(self, step: int, missing: list[int], keys: list[str]) -> None:
        extra = self.run.info.extra.setdefault("ranks", {})
        rows = extra.setdefault("incomplete", [])
        if len(rows) < 1000:
            rows.append({"step": step, "missing": missing})
        why = (f"merged over {self.world_size - len(missing)} of {self.world_size} ranks at some steps "
               f"(rank {', '.join(map(str, missing))} sent nothing within rank_timeout; info.extra['ranks'])")
        for k in keys:
            self.run.info.approximate.setdefault(k, why)
        self.run._warn_once(f"incomplete:{missing}", f"step {step}: merged without rank(s) "
                            f"{', '.join(map(str, missing))}, which sent nothing for it within rank_timeout="
                            f"{self.merger.rank_timeout:g} s (every step merged without a rank is listed in the run "
                            f"info, extra['ranks']['incomplete'])")

    def _taken(self, node: int, covered: int, why: str) -> None:
        self.run.info.extra["ranks"]["nodes"]["taken_over"].append({"node": node, "after_step": covered, "why": why})

    def _plain(self, key: str, why: str) -> None:
        self.run.info.approximate.setdefault(key, why)

    def finish(self, deadline: float) -> None:
        self.file.close(max(1.0, deadline - time.monotonic()))
        self.merger.finish(deadline)


def _canonical_reduction(key: str, source: str, mappings: list[str] | None) -> tuple[str | None, bool]:
    try:
        from ..pipeline import translate
        from ..schema.loader import load_registry
        res = translate({key: 0.0}, source=source, mappings=mappings)
        name = next(iter(res.metrics), key)
        metric = load_registry(mappings or None).canonical.find(name)
    except Exception as exc:      # a name trackbridge cannot place: the share's own reduction, or a mean
        log.debug("trackbridge: no canonical reduction for %r: %s", key, exc)
        return None, True
    if metric is None or metric.reduce is None or not metric.reduce.stated("stat"):
        return None, True
    return reduction_of(str(metric.reduce.get("stat"))), metric.reduce.get("std") != "population"


# ------------------------------------------------------------------------------------------------- other ranks
class RankRun(NoOpRun):
    """A rank other than 0 of a run with merged ranks (``init(merge_ranks=True)``): ``log()`` validates and queues
    this rank's values and shares for its file (``<spool>/<run_id>.ranks/rank-<r>.jsonl``), which rank 0 merges;
    ``finish()`` writes the end line (also at interpreter exit)."""

    def __init__(self, rank: int, *, world_size: int, run_id: str, spool_dir: Path, flush_interval: float,
                 rank_timeout: float = RANK_TIMEOUT, **noop: Any) -> None:
        super().__init__(rank, run_id=run_id, **noop)
        folder = ranks_folder(spool_dir, run_id)
        self.rank_file = RankFile(folder, rank, world_size, run_id, flush_interval=flush_interval,
                                  report=self._report)
        from .nodes import make_pre_merger, node_layout
        layout = node_layout(rank, world_size)
        # node pre-merge (nodes.py): another node's local rank 0 merges its node's ranks into the node's file
        self.pre_merger = (make_pre_merger(folder, world_size, layout, rank_timeout)
                           if layout is not None and layout.node > 0 and layout.local_rank == 0 else None)
        atexit.register(self.finish)

    def _report(self, problems: list[str]) -> None:
        for p in problems:
            if p not in self.problems:
                self.problems.append(p)
                warn(f"trackbridge: rank {self.rank}: {p}; the value was left out")

    def log(self, metrics: dict[str, Any], step: int | None = None, weights: dict[str, Any] | None = None, *,
            axis: str | None = None) -> None:
        """Queue this rank's values (and shares) for its file; raises as ``Run.log`` does."""
        if axis is not None:
            raise TypeError("log(axis=...) is not supported with init(merge_ranks=True): the ranks' shares are "
                            "merged per step of the run's one step axis")
        self.rank_file.log(metrics, step, weights, time.time())

    def finish(self, timeout: float | None = None, *, failed: bool = False) -> dict[str, Any]:
        """Write what is queued and the end line; returns :attr:`status`."""
        wait = 30.0 if timeout is None else max(0.0, float(timeout))
        end = time.monotonic() + wait
        self.rank_file.close(wait)
        if self.pre_merger is not None:          # the node's other ranks' last steps, then the node file's end
            pre, self.pre_merger = self.pre_merger, None
            pre.finish(end)
        try:
            atexit.unregister(self.finish)
        except Exception:
            pass
        return self.status

    @property
    def status(self) -> dict[str, Any]:
        """As ``NoOpRun.status``, with ``rank_file`` (where this rank's shares go) and ``finished``."""
        return {**super().status, "rank_file": str(self.rank_file.path), "finished": self.rank_file.closed}

    def summary(self) -> str:
        """One line saying where this rank's values go."""
        return f"rank {self.rank}: values go to {self.rank_file.path}, merged by rank 0"


def check_world(world_size: int, rank: int, rank_timeout: float) -> None:
    if world_size < 1 or not 0 <= rank < world_size:
        raise UsageError(f"init(merge_ranks=True): rank {rank} is not in a world of {world_size} rank(s) (set "
                         f"WORLD_SIZE and RANK, or pass world_size= and rank=)")
    if not (rank_timeout > 0 and math.isfinite(rank_timeout)):
        raise UsageError(f"LoggerOptions(rank_timeout={rank_timeout!r}): seconds > 0 expected")
    from .nodes import node_layout
    node_layout(rank, world_size)        # a bad TRACKBRIDGE_NODE_MERGE or LOCAL_WORLD_SIZE: one line, before any run


__all__ = ["RankLink", "RankRun", "check_world"]
