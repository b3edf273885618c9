"""Node pre-merge (issue 34 item 4, trackbridge/logger/nodes.py): six ranks on "three nodes of two" (separate
processes with the variables torchrun sets: RANK, LOCAL_RANK, LOCAL_WORLD_SIZE, WORLD_SIZE, GROUP_RANK), each
node's local rank 0 merging its node's ranks into a node file and rank 0 merging the node files, give the very
records (every step, every key, to the last bit) that the same processes logging the same values give with
``TRACKBRIDGE_NODE_MERGE=0`` (rank 0 following every rank's file): weighted means by their weights (a NaN share, a
share of weight 0, two calls at one step, a rank skipping a step), maxima, minima, sums of floats and of integers,
counts, a ``value`` the ranks disagree on (the lowest rank's, which lives on another node), a pooled std and pooled
samples (their shares travel as they are), a mean logged without a weight (rank 0's, marked approximate and said).

A pre-merger killed mid-run (rank 2, local rank 0 of node 1, ``os._exit`` after step 4): rank 0 takes the node over
(reads its ranks' files from the step after the last one the node file covers) and the records equal those of the
flat layout with the same rank killed at the same step: nothing lost, nothing twice. A pre-merger that still beats
but stops merging (real ``PreMerger`` and ``Merger`` objects on real rank files, polled by hand): taken over once a
step has waited ``rank_timeout + node_timeout`` on it, the records equal a flat merge of the same files. The parts'
sums are exact where summing each node's values first in floats would round.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trackbridge.record import Histogram
from trackbridge.stream import read_stream, scan_stream

from _support import ROOT

WORLD, PER_NODE, STEPS = 6, 2, 10

_RANK = r"""
import json, os, random, sys, time, warnings
import trackbridge
from trackbridge import Weighted

rank, world, out, die = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
run = trackbridge.init(project="p", name="nodes", sinks=[], spool=f"{out}/spool", run_id="job-n", source="canonical",
                       merge_ranks=True,
                       options=trackbridge.LoggerOptions(rank_timeout=10.0, writer="thread", flush_interval=0.1))
for step in range(10):
    if rank == 4 and step == 2:
        continue                                   # a rank with nothing at a step
    g = random.Random(1000 * step + rank)
    n = g.randint(1, 9)
    tokens = g.randint(5, 400)
    scores = [g.gauss(rank, 1.0) for _ in range(n)]
    mean = sum(scores) / n
    std = (sum((x - mean) ** 2 for x in scores) / (n - 1)) ** 0.5 if n > 1 else 0.0
    lens = [g.randint(1, 50 * (rank + 1)) for _ in range(n)]
    k2 = float("nan") if (rank == 5 and step == 3) else g.random() / 3
    values = {
        "policy/entropy": Weighted(g.random() * (rank + 1), 0 if (rank == 4 and step == 1) else tokens),
        "policy/clip_frac_low": Weighted(g.random() / 7, tokens),
        "policy/clip_frac_high": Weighted(g.random() / 11, tokens),
        "kl/ref/k1": Weighted(g.random() / 10, tokens),
        "kl/ref/k2": Weighted(k2, tokens),
        "reward/score/mean": Weighted(mean, n),
        "reward/score/std": Weighted(std, n, mean=mean),
        "reward/score/dist": Weighted(scores, n),
        "response/length/max": Weighted(float(max(lens)), n),
        "response/length/min": Weighted(min(lens), n),
        "advantage/max": Weighted(g.gauss(0, 3), n),
        "kl/ref/k1_seq_sum": Weighted(g.random() * 1e-3 + 1e6 * (rank % 2), 1, reduce="sum"),
        "response/eos_count": Weighted(g.randint(0, n), 1, reduce="sum"),
        "reward/score/max": max(scores),           # no weight: the max of the ranks' maxima
        "reward/score/min": min(scores),
        "sampling/num_samples": n,                 # a count: the sum of the ranks' counts
        "optim/lr": 1e-6,                          # the same on every rank
        "optim/grad_norm": 1.5 + rank,             # a value the ranks disagree on: rank 0's, said
        "response/length/mean": sum(lens) / n,     # a mean without a weight: rank 0's, marked approximate
    }
    if rank >= 2:
        values["time/step"] = Weighted(0.25 * rank + step, 1)    # a value: the lowest rank's (rank 2, node 1)
    if rank == 3:                                  # two calls at one step (micro-batches)
        keys = sorted(values)
        run.log({k: values[k] for k in keys[::2]}, step=step)
        run.log({k: values[k] for k in keys[1::2]}, step=step)
    else:
        run.log(values, step=step)
    time.sleep(0.05)
    if rank == die and step == 4:
        time.sleep(0.5)                            # its file has what it logged (flush_interval / 2 after log())
        os._exit(0)                                # dies, and with it node 1's pre-merger: no finish, no end line
if rank == 0:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        status = run.finish()
    json.dump({"problems": status["problems"], "ranks": run.info.extra["ranks"]}, open(f"{out}/rank0.json", "w"))
else:
    run.finish()
"""


def _launch(out: Path, *, nodes: bool, die: int = -1) -> dict:
    out.mkdir()
    procs = []
    for r in range(WORLD):
        env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               "RANK": str(r), "WORLD_SIZE": str(WORLD), "LOCAL_RANK": str(r % PER_NODE),
               "LOCAL_WORLD_SIZE": str(PER_NODE), "GROUP_RANK": str(r // PER_NODE),
               "TRACKBRIDGE_NODE_MERGE": "1" if nodes else "0"}
        env.pop("TORCHELASTIC_RUN_ID", None)
        procs.append(subprocess.Popen([sys.executable, "-c", _RANK, str(r), str(WORLD), str(out), str(die)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=240) for p in procs]
    assert [p.returncode for p in procs] == [0] * WORLD, "\n".join(e[-3000:] for _, e in outs)
    got = json.loads((out / "rank0.json").read_text())
    spool = out / "spool" / "job-n.jsonl"
    got["records"] = [r for _, r in read_stream(spool)]
    got["info"] = scan_stream(spool).info
    got["folder"] = out / "spool" / "job-n.ranks"
    return got


def _same(a, b) -> bool:
    if isinstance(a, Histogram) and isinstance(b, Histogram):
        return a.to_json() == b.to_json()
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return type(a) is type(b) and a == b


def _compare(flat: dict, nodes: dict) -> int:
    """Every point of the two runs equal (value and type); returns how many were compared."""
    assert [r.step for r in flat["records"]] == list(range(STEPS)), "one flat record per step"
    assert [r.step for r in nodes["records"]] == list(range(STEPS)), "one node-merged record per step"
    points = 0
    for a, b in zip(flat["records"], nodes["records"]):
        assert sorted(a.metrics) == sorted(b.metrics), a.step
        for k in a.metrics:
            assert _same(a.metrics[k], b.metrics[k]), (a.step, k, a.metrics[k], b.metrics[k])
            points += 1
        assert a.derived == b.derived
    assert flat["info"].approximate == nodes["info"].approximate
    return points


def _node_lines(folder: Path, node: int) -> list[dict]:
    lines = (folder / f"node-{node:05d}.jsonl").read_text().splitlines()
    return [json.loads(x) for x in lines if x.strip()]


def test_node_pre_merge_gives_the_flat_merge_to_the_last_bit(tmp_path):
    flat = _launch(tmp_path / "flat", nodes=False)
    nodes = _launch(tmp_path / "nodes", nodes=True)
    points = _compare(flat, nodes)
    assert points >= STEPS * 20
    rec = {r.step: r for r in nodes["records"]}
    assert math.isnan(rec[3].metrics["kl/ref/k2"]) and not math.isnan(rec[4].metrics["kl/ref/k2"])
    assert rec[0].metrics["time/step"] == 0.5                  # rank 2's (node 1), the lowest that logged it
    assert type(rec[0].metrics["sampling/num_samples"]) is int and type(rec[0].metrics["response/eos_count"]) is int
    assert sorted(flat["problems"]) == sorted(nodes["problems"])
    assert any("'response/length/mean' logged without a weight on 6 ranks" in p for p in nodes["problems"])
    # the layouts really differ: nodes 1 and 2 wrote node files of parts, rank 0 took none over; flat wrote none
    assert nodes["info"].extra["ranks"]["nodes"] == {"nodes": 3, "per_node": 2, "taken_over": []}
    for node in (1, 2):
        steps = [x for x in _node_lines(nodes["folder"], node) if x.get("type") is None]
        assert [x["step"] for x in steps] == list(range(STEPS))
        assert all(x["ranks"] == [2 * node, 2 * node + 1] or (node == 2 and x["step"] == 2 and x["ranks"] == [5])
                   for x in steps)
        assert "policy/entropy" in steps[0]["parts"] and "reward/score/dist" in steps[0]["raw"]
        assert _node_lines(nodes["folder"], node)[-1]["type"] == "end"
    assert not list(flat["folder"].glob("node-*")) and not (nodes["folder"] / "node-00000.jsonl").exists()
    assert "nodes" not in flat["info"].extra["ranks"]


def test_a_killed_pre_merger_loses_nothing_and_doubles_nothing(tmp_path):
    flat = _launch(tmp_path / "flat", nodes=False, die=2)
    nodes = _launch(tmp_path / "nodes", nodes=True, die=2)
    _compare(flat, nodes)
    # steps 5-9 merged without the dead rank in both layouts, and said so
    incomplete = [{"step": s, "missing": [2]} for s in range(5, STEPS)]
    assert flat["ranks"]["incomplete"] == incomplete and nodes["ranks"]["incomplete"] == incomplete
    for got in (flat, nodes):
        assert any("merged without rank(s) 2" in p for p in got["problems"]), got["problems"]
    # rank 0 took node 1 over once its file stopped changing, from the step after the last one the file covers
    lines = _node_lines(nodes["folder"], 1)
    assert lines[-1].get("type") != "end"          # the pre-merger died: its file just stops
    covered = max(x["step"] for x in lines if isinstance(x.get("step"), int))
    assert 0 <= covered < STEPS - 1                 # some steps came from the node file, the rest from the ranks'
    assert nodes["ranks"]["nodes"]["taken_over"] == [{"node": 1, "after_step": covered, "why": "silent"}]
    assert any("node 1's pre-merger" in p and "reads ranks 2-3's files itself from step " f"{covered + 1}" in p
               for p in nodes["problems"]), nodes["problems"]
    assert _node_lines(nodes["folder"], 2)[-1]["type"] == "end"   # node 2 untouched: it finished


def test_parts_are_exact_where_a_naive_pre_sum_rounds():
    """The parts' sums are exact: shares chosen so that summing each node's shares first (as floats) and then the
    nodes' sums gives another number than the flat ``fsum``; the parts give the flat value for every reduction."""
    import random

    from trackbridge.logger.parts import Packed, Part, merge_parts
    from trackbridge.record.ranked import Share, merge
    g = random.Random(7)
    differs = 0
    for case in range(200):
        shares = [Share(r, g.choice([1e16, -1e16, 1.0, 3.0, 0.1, -0.3, 1e-9, 2.0 ** 60]) * g.random(),
                        float(g.choice([0, 1, 3, 7, 1e9])), None, None) for r in range(24)]
        per = g.choice([2, 3, 4, 8])
        parts = []
        for lo in range(0, 24, per):
            p = Part()
            for s in shares[lo:lo + per]:
                p.add_share(s)
            parts.append(Packed(json.loads(json.dumps(p.to_json()))))
        for reduce in ("mean", "sum", "max", "min", "value"):
            assert _same(merge("k", reduce, shares)[0], merge_parts("k", reduce, parts)[0]), (case, reduce)
        # a value some ranks agree on: the same value and the same note (naming the first four ranks' values)
        agree = [Share(r, float(r // 5), 1.0, None, None) for r in range(24)]
        packed = []
        for lo in range(0, 24, per):
            p = Part()
            for s in agree[lo:lo + per]:
                p.add_share(s)
            packed.append(Packed(json.loads(json.dumps(p.to_json()))))
        assert merge("k", "value", agree) == merge_parts("k", "value", packed)
        naive = sum(math.fsum(s.value for s in shares[lo:lo + per]) for lo in range(0, 24, per))
        differs += naive != math.fsum(s.value for s in shares)
    assert differs > 20, differs          # the cases are ones where a pre-sum in floats would be wrong


def test_a_slow_pre_merger_is_taken_over_and_the_steps_stay_exact(tmp_path):
    """A pre-merger that still beats (its file touched) but stops merging: once a step has waited rank_timeout +
    node_timeout on it, rank 0 reads its node's ranks' files itself, from the step after the last one its file
    covers; the records equal those of a flat merge of the same files."""
    import time

    from trackbridge import Weighted
    from trackbridge.logger import LoggerWarning
    from trackbridge.logger.nodes import Layout, NodeWatch, PreMerger, node_path
    from trackbridge.logger.rankfile import RankFile
    from trackbridge.logger.ranks import Merger

    folder = tmp_path / "job.ranks"
    files = [RankFile(folder, r, 4, "job", flush_interval=0.02) for r in range(4)]
    reduce = {"m/max": ("max", True), "m/count": ("sum", True)}

    def reduction(key: str) -> tuple[str | None, bool]:
        return reduce.get(key, (None, True))

    def log(step: int) -> None:
        for r, f in enumerate(files):
            f.log({"m/mean": Weighted(0.1 * r + step / 3, 1 + 7 * r), "m/max": Weighted(r * 1.5 - step, 2),
                   "m/count": step + r}, step, None, time.time())
        time.sleep(0.1)                             # each RankFile hands its lines on within flush_interval / 2

    layout = Layout(2, 2, 1, 0)
    pre = PreMerger(folder, 4, layout, rank_timeout=0.5)    # polled by hand below: "slow" is when it is not
    got: list[tuple[int, dict]] = []
    rank0 = Merger(folder, 4, emit=lambda w, s, v: got.append((s, v)), reduction=reduction, rank_timeout=0.5,
                   ranks=Layout(2, 2, 0, 0).ranks_of(0))
    takes: list[tuple[int, int, str]] = []
    rank0.nodes = NodeWatch(rank0, Layout(2, 2, 0, 0), node_timeout=0.5,
                            on_take=lambda node, after, why: takes.append((node, after, why)))
    for step in range(4):
        log(step)
        pre.poll()
        rank0.poll()
    covered = rank0.nodes.nodes[1].covered
    assert covered == 2 and [s for s, _ in got] == [0, 1, 2]     # step 3 waits for step 4 to be logged
    for step in range(4, 8):                        # the pre-merger stops merging but its file is touched
        log(step)
        os.utime(node_path(folder, 1))
        rank0.poll()
    deadline = time.monotonic() + 10
    with pytest.warns(LoggerWarning, match="node 1's pre-merger .*holds a step back.* reads ranks 2-3's files itself "
                                           "from step 3 on"):
        while not rank0.nodes.nodes[1].taken and time.monotonic() < deadline:
            os.utime(node_path(folder, 1))
            rank0.poll()
            time.sleep(0.05)
    assert rank0.nodes.nodes[1].taken
    for f in files:
        f.close()
    rank0.finish(time.monotonic() + 10)
    flat: list[tuple[int, dict]] = []
    ref = Merger(folder, 4, emit=lambda w, s, v: flat.append((s, v)), reduction=reduction, rank_timeout=0.5)
    ref.finish(time.monotonic() + 10)
    assert [s for s, _ in flat] == list(range(8)) and [s for s, _ in got] == list(range(8))
    for (s, a), (_, b) in zip(flat, got):
        assert sorted(a) == sorted(b) == ["m/count", "m/max", "m/mean"]
        assert all(_same(a[k], b[k]) for k in a), (s, a, b)
    assert takes == [(1, 2, "behind")]             # taken over for lagging, not for silence
    pre.finish(time.monotonic() + 1)


def test_when_node_pre_merge_turns_on():
    from trackbridge.errors import UsageError
    from trackbridge.logger.nodes import Layout, node_layout
    torchrun = {"RANK": "5", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "WORLD_SIZE": "6", "GROUP_RANK": "2"}
    assert node_layout(5, 6, torchrun) == Layout(per_node=2, nodes=3, node=2, local_rank=1)
    assert node_layout(5, 6, {**torchrun, "GROUP_RANK": "", "NODE_RANK": "2"}) == Layout(2, 3, 2, 1)   # Ray Train
    assert node_layout(5, 6, {**torchrun, "TRACKBRIDGE_NODE_MERGE": "0"}) is None        # turned off
    assert node_layout(5, 6, {**torchrun, "LOCAL_WORLD_SIZE": "6"}) is None              # one node
    assert node_layout(5, 6, {**torchrun, "LOCAL_WORLD_SIZE": "4"}) is None              # nodes of unequal size
    assert node_layout(5, 6, {**torchrun, "GROUP_RANK": "0"}) is None                    # not numbered node by node
    assert node_layout(5, 6, {k: v for k, v in torchrun.items() if k != "LOCAL_WORLD_SIZE"}) is None
    with pytest.raises(UsageError, match="TRACKBRIDGE_NODE_MERGE='maybe': expected 0"):
        node_layout(5, 6, {**torchrun, "TRACKBRIDGE_NODE_MERGE": "maybe"})
    with pytest.raises(UsageError, match="LOCAL_WORLD_SIZE='two' is not an integer"):
        node_layout(5, 6, {**torchrun, "LOCAL_WORLD_SIZE": "two"})
