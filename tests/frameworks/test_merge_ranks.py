"""Per-rank streams merged exactly (issue 24): several processes on CPU joined by ``torch.distributed`` (gloo), each
logging its own share of a batch with uneven sequence lengths, with ``init(merge_ranks=True)``.

Each rank computes, over its share only, what a framework computes over the batch: the token mean of per-token
entropies and of the clip indicators (weight: its tokens), the mean, std and distribution of per-sequence scores
(weight: its sequences), the longest and shortest response; and logs them with ``weights=`` / ``Weighted``. Rank 0
also gathers every rank's raw tensors through gloo and computes the same quantities over the whole batch: the
reference. The merged record that reaches the spool and the trackers (a JSON-lines sink read back as its file, and
TensorBoard read back with its own ``EventFileLoader``) must equal the reference (to 1e-12 relative; TensorBoard
stores float32), under canonical names, with the derived ``policy/clip_frac`` (low + high) computed from the merged
values. The mean of the ranks' means (what rank-0 reductions in frameworks often give) is checked to differ, so the
batch is uneven enough for the test to tell the two apart.

A rank that dies (``os._exit`` after step 2, no ``finish()``): the steps it logged are merged with it, the later ones
without it after ``rank_timeout``, equal to the reference over the surviving ranks, and the run says which steps
(``info.extra["ranks"]["incomplete"]``, the merged names marked approximate, a warning).
"""
from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from trackbridge.stream import read_stream, scan_stream

from _support import ROOT

torch = pytest.importorskip("torch")

STEPS = 5

_RANK = r"""
import json, math, os, sys, time, warnings
import torch
import torch.distributed as dist
import trackbridge
from trackbridge import Weighted

rank, world, port, out, die_after = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5])
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
# the ranks that live to the end, for the reference after a rank died (every rank takes part in making a group)
survivors = dist.new_group([r for r in range(world) if r != die_after]) if die_after >= 0 else None
run = trackbridge.init(project="p", name="ranks", sinks=[f"jsonl:{out}/jsonl", f"tensorboard:{out}/tb"],
                       spool=f"{out}/spool", run_id="job-1", source="canonical",
                       merge_ranks=True,
                       config={"seed": 1},
                       options=trackbridge.LoggerOptions(rank=rank, world_size=world, rank_timeout=3.0,
                                                         writer="thread" if die_after >= 0 else "auto",
                                                         flush_interval=0.2))
refs = []
for step in range(5):
    g = torch.Generator().manual_seed(1000 * step + rank)
    n_seq = 2 + 3 * rank + step % 2                       # uneven shares: ranks hold different numbers of sequences
    lens = torch.randint(1, 40 * (rank + 1), (n_seq,), generator=g)
    ent = [torch.rand(int(n), generator=g, dtype=torch.float64) * (rank + 1) for n in lens]
    clip_lo = [(torch.rand(int(n), generator=g) < 0.1 * (rank + 1)).double() for n in lens]
    clip_hi = [(torch.rand(int(n), generator=g) < 0.05).double() for n in lens]
    scores = torch.randn(n_seq, generator=g, dtype=torch.float64) + rank
    tokens = int(lens.sum())
    local = {
        "policy/entropy": torch.cat(ent).mean(),          # 0-d tensors, as a training loop has them
        "policy/clip_frac_low": torch.cat(clip_lo).mean(),
        "policy/clip_frac_high": torch.cat(clip_hi).mean(),
        "reward/score/mean": scores.mean(),
        "reward/score/std": Weighted(scores.std().item(), n_seq, mean=scores.mean().item()),
        "reward/score/dist": scores.tolist(),
        "response/length/max": Weighted(float(lens.max()), n_seq),
        "response/length/min": Weighted(float(lens.min()), n_seq),
        "optim/lr": 1e-6,                                  # the same on every rank (no weight)
        # without a weight, on every rank: merged by the statistic the canonical name states where none is needed
        "reward/score/max": float(scores.max()),           # the max of the ranks' maxima
        "sampling/num_samples": n_seq,                     # a count: the sum of the ranks' counts
        "response/length/mean": float(lens.double().mean()),   # a mean needs counts: rank 0's, marked and said
    }
    if rank != 0 or step % 2 == 0:                         # two calls at one step on rank 0 merge too
        run.log(local, step=step, weights={"policy/entropy": tokens, "policy/clip_frac_low": tokens,
                                           "policy/clip_frac_high": tokens, "reward/score/mean": n_seq,
                                           "reward/score/dist": n_seq})
    else:
        half = {k: local[k] for k in ("policy/entropy", "reward/score/mean", "optim/lr")}
        run.log(half, step=step, weights={"policy/entropy": tokens, "reward/score/mean": n_seq})
        rest = {k: v for k, v in local.items() if k not in half}
        run.log(rest, step=step, weights={"policy/clip_frac_low": tokens, "policy/clip_frac_high": tokens,
                                          "reward/score/dist": n_seq})
    # the whole batch, gathered over gloo from the ranks still running, for the reference
    alive = [r for r in range(world) if not (die_after >= 0 and step > 2 and r == die_after)]
    group = survivors if len(alive) < world else None
    if rank in alive:
        parts = [None] * len(alive)
        mine = {"ent": torch.cat(ent).tolist(), "lo": torch.cat(clip_lo).tolist(), "hi": torch.cat(clip_hi).tolist(),
                "scores": scores.tolist(), "lens": lens.tolist(),
                "local_ent_mean": float(torch.cat(ent).mean()), "local_score_mean": float(scores.mean())}
        dist.all_gather_object(parts, mine, group=group)
        if rank == 0:
            cat = lambda k: torch.tensor([x for p in parts for x in p[k]], dtype=torch.float64)
            ent_all, sc = cat("ent"), cat("scores")
            lens_all = cat("lens").tolist()
            refs.append({"step": step, "ranks": len(parts),
                         "policy/entropy": float(ent_all.mean()),
                         "policy/clip_frac_low": float(cat("lo").mean()),
                         "policy/clip_frac_high": float(cat("hi").mean()),
                         "reward/score/mean": float(sc.mean()), "reward/score/std": float(sc.std()),
                         "reward/score/dist": sorted(sc.tolist()),
                         "response/length/max": float(max(lens_all)), "response/length/min": float(min(lens_all)),
                         "reward/score/max": float(sc.max()), "sampling/num_samples": len(lens_all),
                         "rank0_length_mean": sum(parts[0]["lens"]) / len(parts[0]["lens"]),
                         "mean_of_rank_means": sum(p["local_ent_mean"] for p in parts) / len(parts)})
    if rank == die_after and step == 2:
        time.sleep(0.5)        # a rank's file has what it logged flush_interval / 2 (0.1 s here) after log()
        os._exit(0)            # dies: no finish(), no end line
if rank == 0:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        status = run.finish()
    json.dump({"refs": refs, "problems": status["problems"], "warnings": [str(w.message) for w in caught]},
              open(f"{out}/reference.json", "w"))
else:
    run.finish()
if die_after < 0:
    dist.destroy_process_group()
else:
    # a peer died: gloo's process group cannot be torn down cleanly (its C++ destructor may abort with "terminate
    # called without an active exception"), as in a real job a launcher would kill the survivors; everything this
    # rank had to write was written by finish()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(tmp_path: Path, world: int, die_after: int = -1) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        env.pop(k, None)
    port = str(_free_port())
    procs = [subprocess.Popen([sys.executable, "-c", _RANK, str(r), str(world), port, str(tmp_path), str(die_after)],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in range(world)]
    outs = [p.communicate(timeout=240) for p in procs]
    assert [p.returncode for p in procs] == [0] * world, "\n".join(e[-3000:] for _, e in outs)
    return json.loads((tmp_path / "reference.json").read_text())


def _tb_scalars(folder: Path) -> dict[tuple[str, int], float]:
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.util import tensor_util
    out: dict[tuple[str, int], float] = {}
    for path in sorted(folder.rglob("*tfevents*")):
        for ev in EventFileLoader(str(path)).Load():
            for v in ev.summary.value:
                if v.HasField("simple_value"):
                    val = v.simple_value
                elif v.HasField("tensor") and v.metadata.plugin_data.plugin_name == "scalars":
                    val = float(tensor_util.make_ndarray(v.tensor))
                else:
                    continue
                assert (v.tag, ev.step) not in out, f"{v.tag} at step {ev.step} twice"
                out[(v.tag, ev.step)] = val
    return out


SCALARS = ["policy/entropy", "policy/clip_frac_low", "policy/clip_frac_high", "reward/score/mean",
           "reward/score/std", "response/length/max", "response/length/min"]


def _check_step(rec, ref) -> None:
    for k in SCALARS:
        assert math.isclose(rec.metrics[k], ref[k], rel_tol=1e-12, abs_tol=1e-15), (k, rec.step, rec.metrics[k], ref[k])
    assert sorted(rec.metrics["reward/score/dist"].values) == pytest.approx(ref["reward/score/dist"], rel=1e-15)
    assert rec.metrics["optim/lr"] == 1e-6
    assert rec.metrics["reward/score/max"] == ref["reward/score/max"]          # not rank 0's maximum
    assert rec.metrics["sampling/num_samples"] == ref["sampling/num_samples"]  # not rank 0's count
    assert rec.metrics["response/length/mean"] == pytest.approx(ref["rank0_length_mean"], rel=1e-12)
    assert "policy/clip_frac" in rec.derived
    assert rec.metrics["policy/clip_frac"] == pytest.approx(ref["policy/clip_frac_low"] + ref["policy/clip_frac_high"],
                                                            rel=1e-12)


def test_three_ranks_merge_to_the_whole_batch(tmp_path):
    got = _launch(tmp_path, world=3)
    refs = {r["step"]: r for r in got["refs"]}
    assert sorted(refs) == list(range(STEPS)) and all(r["ranks"] == 3 for r in refs.values())
    spool = tmp_path / "spool" / "job-1.jsonl"
    recs = [r for _, r in read_stream(spool)]
    assert [r.step for r in recs] == list(range(STEPS)), "one record per step, in order"
    for rec in recs:
        _check_step(rec, refs[rec.step])
        # the batch is uneven: the mean of the ranks' means is another number
        assert abs(refs[rec.step]["mean_of_rank_means"] - rec.metrics["policy/entropy"]) > 1e-3
    # the trackers got the same merged values: the jsonl sink's file, and TensorBoard read with its own loader
    sink_recs = [r for _, r in read_stream(tmp_path / "jsonl" / "job-1.jsonl")]
    assert [(r.step, r.metrics) for r in sink_recs] == [(r.step, r.metrics) for r in recs]
    tb = _tb_scalars(tmp_path / "tb")
    for step, ref in refs.items():
        for k in SCALARS:
            assert tb[(k, step)] == pytest.approx(ref[k], rel=1e-6), (k, step)
    info = scan_stream(spool).info
    assert info is not None and info.extra["ranks"]["world_size"] == 3
    # the one problem: a mean logged without a weight on every rank is rank 0's value, said (and marked approximate)
    assert len(got["problems"]) == 1 and "'response/length/mean' logged without a weight on 3 ranks: rank 0's " \
        "value, not the batch's" in got["problems"][0], got["problems"]
    assert not (tmp_path / "spool" / "job-1.ranks" / "rank-00003.jsonl").exists()
    for r in range(3):          # each rank's own file ends with its end line
        lines = (tmp_path / "spool" / "job-1.ranks" / f"rank-{r:05d}.jsonl").read_text().splitlines()
        assert json.loads(lines[-1])["type"] == "end"


def test_a_rank_that_dies_is_merged_without_and_the_run_says_so(tmp_path):
    got = _launch(tmp_path, world=3, die_after=2)
    refs = {r["step"]: r for r in got["refs"]}
    assert [refs[s]["ranks"] for s in range(STEPS)] == [3, 3, 3, 2, 2]
    spool = tmp_path / "spool" / "job-1.jsonl"
    recs = [r for _, r in read_stream(spool)]
    assert [r.step for r in recs] == list(range(STEPS))
    for rec in recs:        # steps 0-2 over all three ranks, 3-4 over the two that lived: each exact
        _check_step(rec, refs[rec.step])
    info = scan_stream(spool).info
    assert info is not None
    # the header was written at the start; the incomplete steps reach the run info every tracker stores at the end
    tb_info = json.loads(next((tmp_path / "tb").rglob("trackbridge-run.json")).read_text())
    assert tb_info["extra"]["ranks"]["incomplete"] == [{"step": 3, "missing": [2]}, {"step": 4, "missing": [2]}]
    assert "merged over 2 of 3 ranks" in tb_info["approximate"]["policy/entropy"]
    assert any("merged without rank(s) 2" in p for p in got["problems"]), got["problems"]
