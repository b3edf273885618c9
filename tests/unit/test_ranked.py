"""Merging ranks' shares (:mod:`trackbridge.record.ranked`) and the merger that follows the ranks' files
(:mod:`trackbridge.logger.ranks`), without torch: the multi-process test on gloo is
tests/frameworks/test_merge_ranks.py.

* each reduction against the value computed over the pooled items: token means with uneven weights (and weight 0),
  sums, max/min with NaN, pooled sample and population std, pooled distributions, a ``value`` the ranks disagree on;
* bad shares: a weight that is negative, NaN, text or a bool; a std without its mean; bucketed histograms;
* the merger: steps handed on in order once every rank is past them, micro-batches of one step merged, rank 0's
  plain values kept, a rank silent for ``rank_timeout`` merged without (and reported), a late share reported;
* ``init(merge_ranks=True)`` refuses what cannot work, in one line; without it a ``Weighted`` logs its value.
"""
from __future__ import annotations

import math
import random
import statistics
import time

import pytest

import trackbridge
from trackbridge.errors import UsageError
from trackbridge.logger.rankfile import RankFile, rank_path
from trackbridge.logger.ranks import Merger
from trackbridge.record import Histogram
from trackbridge.record.ranked import MergeError, Share, Weighted, check_weight, merge, split_weighted
from trackbridge.record.values import normalize


def _shares(groups: list[list[float]]) -> list[Share]:
    return [Share(r, sum(g) / len(g) if g else math.nan, float(len(g))) for r, g in enumerate(groups)]


def test_weighted_mean_is_the_mean_over_the_pooled_items():
    rng = random.Random(3)
    groups = [[rng.random() * (r + 1) for _ in range(rng.randint(1, 300))] for r in range(7)] + [[]]
    pooled = [x for g in groups for x in g]
    value, note = merge("kl", "mean", _shares(groups))
    assert note is None
    assert math.isclose(value, math.fsum(pooled) / len(pooled), rel_tol=1e-14)
    mean_of_means = statistics.mean(sum(g) / len(g) for g in groups if g)
    assert abs(mean_of_means - value) > 1e-2          # uneven shares: the two reductions differ
    assert math.isnan(merge("kl", "mean", [Share(0, math.nan, 0.0)])[0])     # no items at all
    assert math.isnan(merge("kl", "mean", [Share(0, math.nan, 3.0), Share(1, 1.0, 2.0)])[0])


def test_sum_max_min_value():
    assert merge("n", "sum", [Share(0, 3, 1), Share(1, 4, 1)]) == (7, None)
    assert merge("n", "sum", [Share(0, 0.1, 1), Share(1, 0.2, 1), Share(2, 0.3, 1)])[0] == 0.6
    assert merge("m", "max", [Share(0, 3.0), Share(1, 7.5), Share(2, -1.0)])[0] == 7.5
    assert merge("m", "min", [Share(0, 3.0), Share(1, 7.5), Share(2, -1.0)])[0] == -1.0
    assert math.isnan(merge("m", "max", [Share(0, 3.0), Share(1, math.nan)])[0])
    assert merge("lr", "value", [Share(0, 1e-6), Share(1, 1e-6)]) == (1e-6, None)
    value, note = merge("lr", "value", [Share(0, 1e-6), Share(1, 2e-6)])
    assert value == 1e-6 and "rank 0's is kept" in note and "rank 1: 2e-06" in note


@pytest.mark.parametrize("sample", [True, False])
def test_pooled_std(sample):
    rng = random.Random(5)
    groups = [[rng.gauss(r, 1 + r) for _ in range(rng.randint(2, 60))] for r in range(4)] + [[4.0]]
    std = statistics.stdev if sample else statistics.pstdev
    shares = [Share(r, std(g) if len(g) > 1 else 0.0, float(len(g)), "std", statistics.mean(g))
              for r, g in enumerate(groups)]
    value, _ = merge("s", "std", shares, sample_std=sample)
    assert math.isclose(value, std([x for g in groups for x in g]), rel_tol=1e-12)
    with pytest.raises(MergeError, match="mean"):
        merge("s", "std", [Share(0, 1.0, 3.0)])


def test_pooled_distribution():
    a = Histogram.from_values([1.0, 2.0, float("nan")])
    b = Histogram.from_values([3.0])
    out, _ = merge("d", "dist", [Share(0, a, 3), Share(1, b, 1), Share(2, 5.0, 1)])
    assert sorted(out.values) == [1.0, 2.0, 3.0, 5.0] and out.nonfinite == 1.0 and out.num == 4.0
    with pytest.raises(MergeError, match="bucketed"):
        merge("d", "dist", [Share(0, Histogram(limits=[1.0], counts=[2.0]), 2)])
    with pytest.raises(MergeError, match="cannot be merged"):
        merge("d", "mean", [Share(0, "text", 1)])


@pytest.mark.parametrize("bad", [-1, float("nan"), float("inf"), "3", True, None])
def test_a_weight_must_be_a_count(bad):
    with pytest.raises(MergeError, match="weight"):
        check_weight("k", bad)


def test_weights_from_numpy_like_scalars_and_split():
    class Scalar:
        def item(self) -> int:
            return 12
    assert check_weight("k", Scalar()) == 12.0
    values, shares, problems = split_weighted({"a": 1.0, "b": Weighted(2.0, 4, "max"), "c": 3.0},
                                              {"a": 10, "zzz": 1, "c": -2})
    assert values == {"a": 1.0, "b": 2.0, "c": 3.0}
    assert shares == {"a": (10.0, None, None), "b": (4.0, "max", None)}
    assert any("'zzz'" in p and "not logged" in p for p in problems)
    assert any("'c'" in p and ">= 0" in p for p in problems)
    with pytest.raises(ValueError, match="reduce="):
        Weighted(1.0, 1, "median")


def test_without_merge_ranks_a_weighted_value_is_its_value():
    assert normalize(Weighted(0.5, 10)) == 0.5
    assert normalize(Weighted([1.0, 2.0], 2)).values == [1.0, 2.0]


# -- the merger --------------------------------------------------------------------------------------------------
class Out:
    def __init__(self) -> None:
        self.records: list[tuple[int, dict]] = []
        self.messages: list[str] = []
        self.incomplete: list[tuple[int, list[int]]] = []


def _merger(folder, world, out: Out, timeout: float = 30.0, reductions=None) -> Merger:
    return Merger(folder, world, emit=lambda wall, step, values: out.records.append((step, values)),
                  reduction=lambda key: ((reductions or {}).get(key), True), rank_timeout=timeout,
                  on_incomplete=lambda step, missing, keys: out.incomplete.append((step, missing)),
                  report=out.messages.append)


def _wait(merger: Merger, cond, seconds: float = 5.0) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        merger.poll()
        if cond():
            return
        time.sleep(0.02)


def test_merger_hands_on_steps_in_order_when_every_rank_is_past_them(tmp_path):
    out = Out()
    files = [RankFile(tmp_path, r, 2, "run", flush_interval=0.02) for r in range(2)]
    m = _merger(tmp_path, 2, out, reductions={"mx": "max"})
    files[0].log({"kl": 1.0, "lr": 0.1, "mx": 3.0}, 0, {"kl": 1, "mx": 1}, 100.0)
    files[0].log({"kl": 3.0}, 0, {"kl": 3}, 100.5)         # a second micro-batch of step 0 on rank 0
    files[1].log({"kl": 5.0, "lr": 9.9, "mx": 7.0}, 0, {"kl": 4, "mx": 1}, 100.2)
    _wait(m, lambda: False, 0.3)
    assert out.records == []                                 # nobody is past step 0 yet
    files[0].log({"kl": 0.0}, 1, {"kl": 1}, 101.0)
    _wait(m, lambda: False, 0.3)
    assert out.records == []                                 # rank 1 is not past step 0
    files[1].log({"kl": 2.0}, 1, {"kl": 1}, 101.0)
    _wait(m, lambda: len(out.records) == 1)
    step, values = out.records[0]
    assert step == 0 and values["kl"] == (1 * 1 + 3 * 3 + 5 * 4) / 8 and values["mx"] == 7.0
    assert values["lr"] == 0.1                               # rank 0's plain value; rank 1's differs: said
    for f in files:
        f.close()
    m.finish(time.monotonic() + 5)
    assert [s for s, _ in out.records] == [0, 1] and out.records[1][1]["kl"] == 1.0
    assert out.incomplete == [] and len(out.messages) == 1
    assert "metric 'lr' logged without a weight on 2 ranks: rank 0's value, not the batch's" in out.messages[0]


def test_a_silent_rank_is_merged_without_and_a_late_share_reported(tmp_path):
    out = Out()
    files = [RankFile(tmp_path, r, 3, "run", flush_interval=0.02) for r in range(3)]
    m = _merger(tmp_path, 3, out, timeout=0.4)
    for step in range(3):
        for r in (0, 1):
            files[r].log({"x": float(r)}, step, {"x": 1}, 100.0 + step)
    files[2].log({"x": 2.0}, 0, {"x": 1}, 100.0)
    _wait(m, lambda: len(out.records) >= 1)
    assert out.records[0] == (0, {"x": 1.0})                 # all three ranks at step 0
    _wait(m, lambda: len(out.records) >= 2, 3.0)             # step 1 waits rank_timeout for rank 2, then goes on
    assert out.records[1] == (1, {"x": 0.5}) and out.incomplete[0] == (1, [2])
    files[2].log({"x": 2.0}, 1, {"x": 1}, 101.0)             # too late for step 1
    for f in files:
        f.close()
    m.finish(time.monotonic() + 5)
    assert [s for s, _ in out.records] == [0, 1, 2]
    assert any("rank 2 logged step 1 after that step was handed on" in msg for msg in out.messages)
    assert m.late == {2: 1}
    assert rank_path(tmp_path, 2).read_text().count('"step":1') == 1    # the late share stays in its file


def test_init_merge_ranks_refuses_what_cannot_work(tmp_path, monkeypatch):
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    with pytest.raises(UsageError, match="run_id="):
        trackbridge.init(sinks=[], spool=str(tmp_path), merge_ranks=True,
                         options=trackbridge.LoggerOptions(rank=1, world_size=2))
    with pytest.raises(UsageError, match="rank 2 is not in a world of 2"):
        trackbridge.init(sinks=[], spool=str(tmp_path), merge_ranks=True,
                         options=trackbridge.LoggerOptions(rank=2, world_size=2), run_id="x")
    with pytest.raises(UsageError, match="rank_zero_only=False"):
        trackbridge.init(sinks=[], spool=str(tmp_path), merge_ranks=True,
                         options=trackbridge.LoggerOptions(rank=0, world_size=2, rank_zero_only=False), run_id="x")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "elastic-7")
    other = trackbridge.init(sinks=[], spool=str(tmp_path), merge_ranks=True,
                             options=trackbridge.LoggerOptions(rank=1, world_size=2))
    other.log({"x": Weighted(1.0, 2)}, step=0)
    with pytest.raises(ValueError):
        other.log({"x": 1.0}, step=-1)                      # refused as on rank 0
    assert other.finish()["rank_file"].endswith("elastic-7.ranks/rank-00001.jsonl")
    with pytest.raises(RuntimeError, match="after finish"):
        other.log({"x": 1.0}, step=1)


def test_a_resumed_merger_skips_what_the_spool_holds_and_merges_the_rest(tmp_path):
    """Rank 0 died after handing on step 1; the files hold steps 0-2. The resumed merger (after_step=1) skips steps
    0 and 1 quietly and merges step 2, which the spool never got."""
    files = [RankFile(tmp_path, r, 2, "run", flush_interval=0.02) for r in range(2)]
    for step in range(3):
        for r in range(2):
            files[r].log({"x": float(r + step)}, step, {"x": 1}, 100.0 + step)
    for f in files:
        f.close()
    out = Out()
    m = Merger(tmp_path, 2, emit=lambda wall, step, values: out.records.append((step, values)),
               reduction=lambda key: (None, True), after_step=1, report=out.messages.append)
    m.finish(time.monotonic() + 5)
    assert out.records == [(2, {"x": 2.5})] and out.messages == [] and m.replayed == 4


def test_an_idle_rank_costs_a_stat_not_an_open(tmp_path, monkeypatch):
    """Rank 0's merger polls every rank's file: a file that did not grow since the last poll is stat'ed, never opened
    (issue 34: opening 1,024 files every 50 ms took 29% of a core inside rank 0's training process); a file that
    grew is read from where the last poll stopped."""
    import builtins

    from trackbridge.logger import ranks as R
    for r in range(3):
        R.rank_path(tmp_path, r).write_text('{"step": 1, "metrics": {"x": 1.0}}\n')
    m = R.Merger(tmp_path, 3, emit=lambda *a: None, reduction=lambda k: (None, True), rank_timeout=3600.0)
    opened: list[str] = []
    real_open = builtins.open

    def counting(path, *a, **kw):
        opened.append(str(path))
        return real_open(path, *a, **kw)
    monkeypatch.setattr(R, "open", counting, raising=False)
    assert m.poll() is True and len(opened) == 3                  # the first poll reads each file once
    assert m.poll() is False and m.poll() is False and len(opened) == 3     # idle: no open at all
    with real_open(R.rank_path(tmp_path, 2), "a") as fh:
        fh.write('{"step": 2, "metrics": {"x": 2.0}}\n')
    assert m.poll() is True and opened[3:] == [str(R.rank_path(tmp_path, 2))]
    assert m.ranks[2].top == 2 and m.ranks[0].top == 1
