"""Node pre-merge for ``init(merge_ranks=True)`` over several nodes: each node's local rank 0 merges its node's ranks'
files into one file per node, and global rank 0 follows the node files (and its own node's rank files) instead of
every rank's file: it watches nodes, not ranks.

**When.** On by itself when the launcher says the job spans nodes: ``LOCAL_WORLD_SIZE`` (torchrun, Ray Train) below
``WORLD_SIZE``, dividing it, with ranks numbered node by node (``RANK == node x LOCAL_WORLD_SIZE + LOCAL_RANK``, the
node from ``GROUP_RANK`` or ``NODE_RANK`` where set), as torchrun numbers them. ``TRACKBRIDGE_NODE_MERGE=0`` turns
it off (every rank's file followed by rank 0, as on one node). Node *g* holds ranks ``g*L .. g*L+L-1``.

**What.** The pre-merger (:class:`PreMerger`, a thread of the node's local rank 0) gathers its ranks' shares by step
as rank 0 does, and once every rank of the node has gone past a step (or is ``rank_timeout`` late) writes one line
for it to ``<spool>/<run_id>.ranks/node-<g>.jsonl``: per key a :class:`~trackbridge.logger.parts.Part` (exact
partial sums, extremes, the first values: what rank 0 needs to give the same value as merging every share itself, to
the last bit), or the shares themselves where a part cannot stand for them (a ``std``'s means, a ``dist``'s
samples), with the ranks it merged without. Between steps it writes how far its ranks have all gone
(``{"type": "through"}``), and touches the file every second while idle (a heartbeat rank 0 sees in its ``stat``).

**What survives what.** The ranks' files stay the truth. Rank 0 reads a step of a node from the node file, or, once
it has *taken the node over*, from the node's ranks' files, never both: it takes over a node whose file has not
changed (no line, no heartbeat) for ``node_timeout`` (``min(rank_timeout, 10 s)``) while a step waits on it or the
run finishes (its pre-merger died, with its process, or never started), or which holds a step back more than
``rank_timeout + node_timeout`` although it still beats (a slow pre-merger). From then on it reads that node's ranks'
files itself, from the step after the last one the node file covered (a line cut off by a crash covers nothing);
lines up to that step are passed over. A pre-merger restarted beside its node file carries on after the steps the
file covers. The run info lists taken-over nodes (``info.extra["ranks"]["nodes"]["taken_over"]``).
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..errors import UsageError
from ..record import dumps
from ..record.ranked import Share
from ..stream import SUFFIX
from .common import warn
from .parts import Packed, Part, needs_raw, raw_share, share_of
from .rankfile import rank_path
from .ranks import Merger, _Rank, _Step

HEARTBEAT = 1.0          # seconds between touches of an idle node file
NODE_TIMEOUT = 10.0      # at most this long silent before rank 0 reads the node's ranks' files itself


def node_path(folder: Path, node: int) -> Path:
    return folder / f"node-{node:05d}{SUFFIX}"


@dataclass(frozen=True)
class Layout:
    """``nodes`` nodes of ``per_node`` ranks each; this process is ``local_rank`` of node ``node``."""

    per_node: int
    nodes: int
    node: int
    local_rank: int

    def ranks_of(self, node: int) -> list[int]:
        return list(range(node * self.per_node, (node + 1) * self.per_node))


def node_layout(rank: int, world_size: int, env: dict[str, str] | None = None) -> Layout | None:
    """The job's nodes from the launcher's variables (module docstring), or None: no pre-merge."""
    env = dict(os.environ) if env is None else env
    switch = env.get("TRACKBRIDGE_NODE_MERGE", "").strip().lower()
    if switch in ("0", "off", "false", "no"):
        return None
    if switch not in ("", "1", "on", "true", "yes", "auto"):
        raise UsageError(f"TRACKBRIDGE_NODE_MERGE={switch!r}: expected 0 (off) or 1 / auto (on across nodes)")

    def num(*names: str) -> int | None:
        for n in names:
            raw = env.get(n, "").strip()
            if raw:
                try:
                    return int(raw)
                except ValueError:
                    raise UsageError(f"environment variable {n}={raw!r} is not an integer") from None
        return None
    per = num("LOCAL_WORLD_SIZE")
    if per is None or per < 1 or per >= world_size or world_size % per:
        return None
    node = num("GROUP_RANK", "NODE_RANK")
    local = num("LOCAL_RANK")
    node = rank // per if node is None else node
    local = rank % per if local is None else local
    if rank != node * per + local:           # not numbered node by node: every rank's file followed by rank 0
        return None
    return Layout(per, world_size // per, node, local)


def covered_by(path: Path) -> int | None:
    """The last step a node file covers (its step lines and ``through`` marks; a cut-off last line covers none)."""
    top: int | None = None
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    for raw in data[:data.rfind(b"\n") + 1].splitlines():
        try:
            obj = json.loads(raw)
        except ValueError:
            continue
        step = obj.get("step")
        if isinstance(step, int) and obj.get("type") in (None, "through"):
            top = step if top is None else max(top, step)
    return top


# ------------------------------------------------------------------------------------------------- on a node
def part_line(step: int, group: _Step, missing: list[int]) -> dict[str, Any]:
    """The node file's line for one step of a node's ranks (module docstring)."""
    line: dict[str, Any] = {"step": step, "ranks": sorted(group.ranks), "wall": group.wall_min}
    if missing:
        line["missing"] = missing
    parts: dict[str, Any] = {}
    raw: dict[str, Any] = {}
    for key, shares in group.shares.items():
        shares = sorted(shares, key=lambda s: s.rank)
        if any(needs_raw(s) for s in shares):
            raw[key] = [raw_share(s) for s in shares]
            continue
        p = Part()
        for s in shares:
            p.add_share(s)
        parts[key] = p.to_json()
    plain: dict[str, Any] = {}
    for key, rest in group.others.items():
        p = Part()
        for r, v in sorted(rest, key=lambda x: x[0]):
            p.add_share(Share(r, v, 1.0, None, None))
        plain[key] = p.to_json()
    for name, d in (("parts", parts), ("raw", raw), ("plain", plain)):
        if d:
            line[name] = d
    return line


class PreMerger(Merger):
    """A :class:`~trackbridge.logger.ranks.Merger` over one node's ranks whose steps go to the node's file
    (module docstring), carrying on after what that file already covers."""

    def __init__(self, folder: Path, world_size: int, layout: Layout, rank_timeout: float) -> None:
        self.path = node_path(folder, layout.node)
        self.layout = layout
        super().__init__(folder, world_size, emit=lambda *a: None, reduction=lambda k: (None, True),
                         rank_timeout=rank_timeout, after_step=covered_by(self.path),
                         ranks=layout.ranks_of(layout.node))
        self.through = -1 if self.emitted is None else self.emitted
        self._out: list[str] = []
        self._ended = False
        self._beat = time.monotonic()
        self._fh = open(self.path, "ab")
        head = {"type": "node", "node": layout.node, "ranks": layout.ranks_of(layout.node), "pid": os.getpid(),
                "opened": time.time()}
        self._fh.write(("\n" if self._fh.tell() else "").encode() + (dumps(head) + "\n").encode())
        self._fh.flush()

    def _hand_on(self, step: int, group: _Step, missing: list[int]) -> None:
        self.emitted = step if self.emitted is None else max(self.emitted, step)
        self._out.append(dumps(part_line(step, group, missing)) + "\n")

    def poll(self, force: bool = False) -> bool:
        wrote = super().poll(force)
        with self._lock:
            now = time.monotonic()
            done = all(st.ended or st.gone for st in self.ranks.values()) and not self.pending
            through = min(1 << 62 if st.ended or st.gone else -1 if st.top is None else st.top - 1
                          for st in self.ranks.values())
            if not done and through > self.through and (self.emitted is None or through >= self.emitted):
                self.through = through
                self._out.append(dumps({"type": "through", "step": through}) + "\n")
            if done and not self._ended:
                self._ended = True
                self._out.append(dumps({"type": "end", "at": time.time()}) + "\n")
            if self._out:
                self._fh.write("".join(self._out).encode("utf-8"))
                self._fh.flush()
                self._out = []
                self._beat = now
            elif now - self._beat >= HEARTBEAT:
                os.utime(self.path)
                self._beat = now
        return wrote

    def _main(self) -> None:          # the heartbeat: never sleep longer than it between polls
        interval = 0.05
        try:
            while not self._stop.wait(interval):
                interval = 0.05 if self.poll() else min(interval * 2, HEARTBEAT)
        except Exception as exc:      # never take training down: rank 0 takes the node over
            warn(f"trackbridge: pre-merging node {self.layout.node}'s ranks stopped ({type(exc).__name__}: {exc}); "
                 f"rank 0 reads their files itself")

    def finish(self, deadline: float) -> None:
        super().finish(deadline)
        self._fh.close()


def make_pre_merger(folder: Path, world_size: int, layout: Layout, rank_timeout: float) -> PreMerger:
    """Node ``layout.node``'s pre-merger, started."""
    m = PreMerger(folder, world_size, layout, rank_timeout)
    m.start()
    return m


# ------------------------------------------------------------------------------------------------- on rank 0
@dataclass
class _Node:
    node: int
    path: Path
    ranks: list[int]
    offset: int = 0
    buf: bytes = b""
    stamp: tuple[int, int] = (-1, -1)       # (size, mtime_ns) at the last look
    seen_at: float = 0.0                    # when the file last changed (rank 0's clock)
    covered: int = -1                       # the last step the file covers
    ended: bool = False
    taken: bool = False
    lines: int = 0


@dataclass
class NodeWatch:
    """Rank 0's view of the other nodes' files: read into the merger's steps, taken over when silent."""

    merger: Merger
    layout: Layout
    node_timeout: float
    on_take: Callable[[int, int, str], None] | None = None
    nodes: dict[int, _Node] = field(default_factory=dict)

    def __post_init__(self) -> None:
        now = time.monotonic()
        for g in range(1, self.layout.nodes):
            self.nodes[g] = _Node(g, node_path(self.merger.folder, g), self.layout.ranks_of(g), seen_at=now)

    def poll(self, now: float) -> bool:
        wrote = False
        for nd in self.nodes.values():
            if nd.taken:
                continue
            try:
                st = os.stat(nd.path)
            except FileNotFoundError:
                continue
            stamp = (st.st_size, st.st_mtime_ns)
            if stamp != nd.stamp:
                nd.stamp, nd.seen_at = stamp, now
            if st.st_size > nd.offset:
                wrote = self._read(nd) or wrote
        return wrote

    def _read(self, nd: _Node) -> bool:
        with open(nd.path, "rb") as fh:
            fh.seek(nd.offset)
            data = fh.read()
        nd.offset += len(data)
        data = nd.buf + data
        cut = data.rfind(b"\n") + 1
        nd.buf = data[cut:]
        for raw in data[:cut].splitlines():
            try:
                obj = json.loads(raw)
            except ValueError:
                continue
            kind, step = obj.get("type"), obj.get("step")
            if kind == "end":
                nd.ended = True
            elif isinstance(step, int) and kind in (None, "through"):
                nd.covered = max(nd.covered, step)
                if kind is None:
                    nd.lines += 1
                    self._take(obj)
        return True

    def _take(self, obj: dict[str, Any]) -> None:
        m = self.merger
        step = obj["step"]
        if m.resumed_at is not None and step <= m.resumed_at:
            m.replayed += 1
            return
        if m.emitted is not None and step <= m.emitted:
            m._once(f"late-node:{obj.get('ranks')}", f"ranks {obj.get('ranks')} (pre-merged on their node) logged "
                                                     f"step {step} after it was handed on without them")
            return
        group = m.pending.setdefault(step, _Step())
        group.ranks.update(int(r) for r in obj.get("ranks", []))
        group.node_missing.update(int(r) for r in obj.get("missing", []))
        wall = obj.get("wall")
        if isinstance(wall, (int, float)):
            group.wall_min = float(wall) if group.wall_min is None else min(group.wall_min, float(wall))
        for key, d in (obj.get("parts") or {}).items():
            group.wparts.setdefault(key, []).append(Packed(d))
        for key, rows in (obj.get("raw") or {}).items():
            group.shares.setdefault(key, []).extend(share_of(r) for r in rows)
        for key, d in (obj.get("plain") or {}).items():
            group.pparts.setdefault(key, []).append(Packed(d))

    def waiting(self, step: int) -> list[int]:
        return [g for g, nd in self.nodes.items() if not (nd.taken or nd.ended or nd.covered >= step)]

    def passed_any(self, step: int) -> bool:
        return any(nd.covered >= step for nd in self.nodes.values() if not nd.taken)

    def stalled(self, nodes: list[int], waited: float | None, now: float) -> bool:
        """Take over the nodes of ``nodes`` silent for node_timeout (or beating but rank_timeout + node_timeout
        behind) while a step waited ``waited`` seconds; True when any was."""
        if waited is None or waited < self.node_timeout:
            return False
        took = False
        for g in nodes:
            nd = self.nodes[g]
            silent = now - nd.seen_at >= self.node_timeout
            if silent or waited >= self.merger.rank_timeout + self.node_timeout:
                self.take_over(nd, now, "silent" if silent else "behind")
                took = True
        return took

    def open(self) -> list[int]:
        return [g for g, nd in self.nodes.items() if not (nd.taken or nd.ended)]

    def finishing(self, now: float) -> None:
        for g in self.open():
            nd = self.nodes[g]
            if now - nd.seen_at >= self.node_timeout:
                self.take_over(nd, now, "silent")

    def take_over(self, nd: _Node, now: float, why: str) -> None:
        """Read node ``nd``'s ranks' files from the step after the last one its file covers (module docstring)."""
        nd.taken = True
        m = self.merger
        for r in nd.ranks:
            m.ranks[r] = _Rank(rank_path(m.folder, r), seen_at=now, skip=nd.covered)
        for group in m.pending.values():
            group.waiting_since = None          # its ranks are waited for rank_timeout from now
        said = ("its file has not changed for %g s" % self.node_timeout if why == "silent" else
                "it holds a step back %g s past the other nodes" % (m.rank_timeout + self.node_timeout))
        m._once(f"take:{nd.node}", f"node {nd.node}'s pre-merger ({nd.path.name}): {said}; rank 0 reads ranks "
                                   f"{nd.ranks[0]}-{nd.ranks[-1]}'s files itself from step {nd.covered + 1} on")
        if self.on_take is not None:
            self.on_take(nd.node, nd.covered, why)


__all__ = ["Layout", "NodeWatch", "PreMerger", "make_pre_merger", "node_layout", "node_path", "part_line"]
