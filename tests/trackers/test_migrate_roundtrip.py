"""Round trips A -> B -> A for every ordered pair of trackers (TensorBoard, wandb offline, MLflow/SQLite, Trackio,
JSONL): every point comes back with its step, wall time and name; config, tags and the run name too.

What each tracker is allowed to change (and nothing else), applied hop by hop to build the expected run:

* TensorBoard stores numbers as float32 (``simple_value``);
* MLflow holds no histograms: a histogram becomes summary metrics ``<name>/count|max|mean|min|std`` (the run is
  marked: ``extra["histogram_summaries"]``);
* wandb keeps a histogram's edges and counts but not ``sum``/``sum_squares``.

The run: non-monotonic steps (0 1 2 5 3 4), wall times on a 0.5 s grid (MLflow keeps milliseconds), a NaN, a
histogram, a string, a sparse record, names that trackers refuse (``val-core/openai/gsm8k/acc/mean@1``,
``my/custom,key[0]``), nested config, tags.
"""
from __future__ import annotations

import itertools

import pytest

from trackbridge.migrate import migrate, summary
from trackbridge.pipeline import Pipeline
from trackbridge.record import Histogram, Record, RunInfo

from test_migrate_support import KINDS, f32, location, read_runs, same_value, write_run

STEPS = [0, 1, 2, 5, 3, 4]
T0 = 1763700000.0
CONFIG = {"actor_rollout_ref": {"actor": {"ppo_epochs": 1, "clip_ratio": 0.2}, "rollout": {"n": 8}},
          "algorithm": {"adv_estimator": "grpo", "kl_ctrl": {"kl_coef": 0.001}},
          "data": {"train_files": ["a.parquet", "b.parquet"], "max_prompt_length": 512},
          "trainer": {"project_name": "proj", "seed": 7}, "lr": 1e-06}
TAGS = {"team": "rl", "base_model": "Qwen2.5-0.5B"}


def source_run() -> tuple[RunInfo, list[Record]]:
    recs = []
    for i, step in enumerate(STEPS):
        m = {
            "actor/pg_loss": 0.1 * i - 0.05,
            "actor/entropy": 1.0 / (i + 3),
            "critic/score/mean": 0.25 * i,
            "response_length/mean": 100.0 + i,
            "val-core/openai/gsm8k/acc/mean@1": 0.3 + 0.01 * i,
            "my/custom,key[0]": float(i * i),
            "samples/text": f"step {step}: the answer is {i}",
            "actor/ratio_hist": Histogram(limits=[0.5, 1.0, 1.5, 2.0], counts=[1.0, 2.0 + i, 3.0, 1.0],
                                          min=0.25, max=2.0, num=7.0 + i, sum=8.5 + i, sum_squares=12.25 + i),
        }
        if i == 2:
            m["actor/pg_loss"] = float("nan")
        if i == 4:                     # a sparse record
            m = {"critic/score/mean": 0.75, "response_length/mean": 123.0}
        recs.append(Record(step=step, wall_time=T0 + 0.5 * i, metrics=m))
    info = RunInfo(name="grpo-qwen-run", project="proj", run_id="r-0001", config=CONFIG, tags=TAGS)
    return info, recs


# -- what a tracker does to a run ---------------------------------------------------------------------------
def hop(kind: str, recs: list[Record]) -> list[Record]:
    out = []
    for r in recs:
        m = {}
        for k, v in r.metrics.items():
            if isinstance(v, Histogram):
                if kind == "mlflow":
                    for stat, x in v.summary().items():
                        m[f"{k}/{stat}"] = x
                    continue
                if kind == "wandb":
                    v = Histogram(limits=v.limits, counts=v.counts, min=v.min, max=v.max, num=v.num)
            elif isinstance(v, (int, float)) and kind == "tensorboard":
                v = f32(float(v))
            m[k] = v
        out.append(Record(r.step, r.wall_time, m))
    return out


def translate(recs: list[Record]) -> list[Record]:
    return list(Pipeline("auto", "canonical", derive=False).process(recs))


def expected_run(a: str, b: str, names: str) -> list[Record]:
    _, recs = source_run()
    recs = hop(a, recs)
    if names == "canonical":
        recs = translate(recs)
    return hop(a, hop(b, recs))


def _hist_comparable(v: Histogram, path: tuple[str, ...]) -> Histogram:
    """What of a histogram survives ``path``: wandb then TensorBoard leaves sum/sum_squares at 0 (not stored)."""
    if "wandb" in path and "tensorboard" in path:
        return Histogram(limits=v.limits, counts=v.counts, min=v.min, max=v.max, num=v.num)
    return v


def check_same(got: list[Record], want: list[Record], path: tuple[str, ...]) -> None:
    assert [(r.step, r.wall_time) for r in got] == [(r.step, r.wall_time) for r in want], \
        "steps or wall times differ (or records were split/merged/reordered)"
    for g, w in zip(got, want):
        assert set(g.metrics) == set(w.metrics), f"step {g.step}: names differ: " \
            f"missing {set(w.metrics) - set(g.metrics)}, extra {set(g.metrics) - set(w.metrics)}"
        for k, wv in w.metrics.items():
            gv = g.metrics[k]
            if isinstance(gv, Histogram) and isinstance(wv, Histogram):
                gv, wv = _hist_comparable(gv, path), _hist_comparable(wv, path)
            assert same_value(gv, wv), f"step {g.step} {k!r}: got {gv!r}, want {wv!r}"


PAIRS = [p for p in itertools.product(KINDS, KINDS) if p[0] != p[1]]


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """Run A written once into each tracker by trackbridge's sink (read-only afterwards)."""
    out = {}
    info, recs = source_run()
    for kind in KINDS:
        loc = location(kind, tmp_path_factory.mktemp(f"src-{kind}"), experiment="proj" if kind == "mlflow" else None)
        write_run(loc, RunInfo(**{**info.__dict__, "config": dict(info.config), "tags": dict(info.tags)}), recs)
        out[kind] = loc
    return out


@pytest.mark.parametrize("names", ["keep", "canonical"])
@pytest.mark.parametrize("a,b", PAIRS, ids=[f"{a}-{b}" for a, b in PAIRS])
def test_round_trip(a, b, names, sources, env):
    src = sources[a]
    mid = location(b, env / "b")
    back = location(a, env / "back")
    r1 = migrate(src, mid, names=names, progress=False)
    assert r1.ok, summary(r1)
    assert len(r1.runs) == 1 and r1.runs[0].points > 0
    r2 = migrate(mid, back, names=names, progress=False)
    assert r2.ok, summary(r2)

    runs = read_runs(back)
    assert len(runs) == 1, f"{back} holds {len(runs)} runs"
    info, got, problems = runs[0]
    assert problems == []
    check_same(got, expected_run(a, b, names), (a, b))

    want_info, _ = source_run()
    assert info.name == want_info.name
    assert info.project == want_info.project
    assert info.config == want_info.config
    for k, v in want_info.tags.items():
        assert info.tags.get(k) == v, f"tag {k!r}: {info.tags.get(k)!r}"
    assert info.tags.get("trackbridge.migrated_from") == src       # where the data first came from
    if b == "mlflow":   # the histogram became summary statistics in B: the run says so (carried to A)
        assert "actor/ratio_hist" in (info.extra.get("histogram_summaries") or []), info.extra
    # the summary of a keep-names migration renames nothing; a canonical one renames veRL's names once
    if names == "keep":
        assert r1.totals().renamed == {} and r2.totals().renamed == {}
    else:
        assert r1.totals().renamed.get("actor/pg_loss") == "loss/policy"
        assert r2.totals().renamed == {}
