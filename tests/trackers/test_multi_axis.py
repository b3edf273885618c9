"""A run with several x axes (slime) survives every path: read from a real wandb offline run, written to every
tracker, read back, compared, and logged live, each series on its own axis with its own steps, nothing collapsed
onto one step.

slime declares its axes with wandb's ``define_metric`` (``slime/utils/wandb_utils.py@v0.3.1``,
``_init_wandb_common``): ``train/*`` on ``train/step``, ``rollout/*``, ``multi_turn/*``, ``passrate/*`` and ``perf/*``
on ``rollout/step``, ``eval/*`` on ``eval/step``; each ``wandb.log(metrics)`` call (no ``step=``) carries its step key
(``slime/utils/logging_utils.py@v0.3.1``: ``log(args, metrics, step_key)``). Several train steps are logged per
rollout, so the three axes count differently and wandb's own ``_step`` is none of them.
"""
from __future__ import annotations

import io

import pytest

from trackbridge.migrate import migrate
from trackbridge.record import Record
from trackbridge.sources import open_source

from test_migrate_support import KINDS, f32, location

ROLLOUTS = 3
TRAIN_PER_ROLLOUT = 2
T0 = 1767225600.0


def slime_calls() -> list[dict[str, float]]:
    """The wandb.log calls of a slime run, in order (each holds its step key, as slime logs them)."""
    calls = []
    for r in range(ROLLOUTS):
        calls.append({"rollout/raw_reward": 0.1 + 0.25 * r, "rollout/response_lengths": 300.0 + 7 * r,
                      "rollout/step": r})
        calls.append({"perf/step_time": 20.0 + r, "perf/wait_time_ratio": 0.05 * (r + 1), "rollout/step": r})
        for k in range(TRAIN_PER_ROLLOUT):
            s = TRAIN_PER_ROLLOUT * r + k
            calls.append({"train/pg_loss": 0.5 - 0.03 * s, "train/pg_clipfrac": 0.01 * (s + 1), "train/step": s})
        if r % 2 == 0:
            calls.append({"eval/aime": 0.2 + 0.1 * r, "eval/step": r})
    return calls


AXIS_OF_PREFIX = {"rollout/": "rollout/step", "perf/": "rollout/step", "train/": "train/step", "eval/": "eval/step"}


def expected_series() -> dict[tuple[str, str], dict[int, float]]:
    """(axis, metric) -> {step on that axis: value}: what every path must keep."""
    out: dict[tuple[str, str], dict[int, float]] = {}
    for call in slime_calls():
        axis = next(a for p, a in AXIS_OF_PREFIX.items() if next(iter(call)).startswith(p))
        for k, v in call.items():
            if k != axis:
                out.setdefault((axis, k), {})[int(call[axis])] = v
    return out


def write_slime_wandb(folder) -> str:
    """A real wandb offline run written the way slime writes it; returns its locator."""
    import wandb

    run = wandb.init(project="slime", name="slime-grpo", dir=str(folder), mode="offline",
                     config={"rollout_batch_size": 32, "n_samples_per_prompt": 8})
    # slime/utils/wandb_utils.py@v0.3.1 _init_wandb_common, verbatim order
    run.define_metric("train/step")
    run.define_metric("train/*", step_metric="train/step")
    run.define_metric("rollout/step")
    run.define_metric("rollout/*", step_metric="rollout/step")
    run.define_metric("multi_turn/*", step_metric="rollout/step")
    run.define_metric("passrate/*", step_metric="rollout/step")
    run.define_metric("eval/step")
    run.define_metric("eval/*", step_metric="eval/step")
    run.define_metric("perf/*", step_metric="rollout/step")
    for call in slime_calls():
        run.log(call)
    run.finish()
    import time

    from trackbridge.trackers.wandb.records import find_wandb_files, has_exit_record
    (f,) = find_wandb_files(folder)
    deadline = time.monotonic() + 60
    while not has_exit_record(f) and time.monotonic() < deadline:
        time.sleep(0.05)
    return f"wandb:{folder}"


def series_of(loc: str, *, tb: bool = False) -> tuple[dict[tuple[str, str], dict[int, float]], list[Record]]:
    (reader,) = list(open_source(loc).runs())
    recs = list(reader.records())
    assert reader.problems == [], reader.problems
    out: dict[tuple[str, str], dict[int, float]] = {}
    for r in recs:
        assert r.axis is not None, f"{loc}: a record without its axis: {r}"
        for k, v in r.metrics.items():
            assert r.step not in out.get((r.axis, k), {}), f"{loc}: {k} twice at {r.axis} {r.step}"
            out.setdefault((r.axis, k), {})[r.step] = v
    return out, recs


def same_series(got, want, *, f32_values: bool = False) -> None:
    assert set(got) == set(want)
    for key, pts in want.items():
        exp = {s: (f32(v) if f32_values else v) for s, v in pts.items()}
        assert got[key] == pytest.approx(exp, rel=1e-12, abs=0), key


@pytest.fixture
def slime_run(env):
    return write_slime_wandb(env / "slime")


def test_wandb_reader_puts_each_series_on_its_declared_axis(slime_run):
    got, recs = series_of(slime_run)
    same_series(got, expected_series())
    # the step metrics are the axes, not metrics; wandb's _step (0..14, one per call) is no step of any series
    assert not any(k.endswith("/step") for r in recs for k in r.metrics)
    assert len(recs) == len(slime_calls())
    assert {r.axis for r in recs} == {"train/step", "rollout/step", "eval/step"}
    assert max(r.step for r in recs) == ROLLOUTS * TRAIN_PER_ROLLOUT - 1


@pytest.mark.parametrize("kind", KINDS)
def test_every_tracker_keeps_every_axis(slime_run, env, kind):
    """wandb (slime) -> KIND -> read back, and KIND -> wandb again: every series on its axis with its steps, and
    the wandb copy declares each series on its axis (define_metric), so wandb's charts use it too."""
    dst = location(kind, env / "dst")
    res = migrate(slime_run, dst, names="keep", progress=False, out=io.StringIO())
    assert res.ok, str(res)
    got, _ = series_of(dst)
    same_series(got, expected_series(), f32_values=kind == "tensorboard")

    again = location("wandb", env / "again")
    res = migrate(dst, again, names="keep", progress=False, out=io.StringIO())
    assert res.ok, str(res)
    got, _ = series_of(again)
    same_series(got, expected_series(), f32_values=kind == "tensorboard")
    declared = _declared_axes(env / "again")
    for axis, metric in expected_series():
        assert declared.get(metric) == axis, (metric, declared.get(metric))


def _declared_axes(folder) -> dict[str, str]:
    """name -> step metric of the define_metric records in the wandb run under ``folder``."""
    from wandb.proto import wandb_internal_pb2 as pb

    from trackbridge.trackers.wandb.records import find_wandb_files, read_payloads

    (f,) = find_wandb_files(folder)
    out = {}
    for _, data in read_payloads(f):
        rec = pb.Record()
        rec.ParseFromString(data)
        if rec.WhichOneof("record_type") == "metric" and rec.metric.name and rec.metric.step_metric:
            out[rec.metric.name] = rec.metric.step_metric
    return out


def test_compare_charts_each_series_on_its_own_axis(slime_run):
    from trackbridge.compare.align import run_axis
    from trackbridge.compare.load import load_runs

    (run,) = load_runs([f"slime={slime_run}"], source="keep", derive=False)
    xs = run_axis(run, "step").values
    for (axis, metric), pts in expected_series().items():
        assert [(xs[i], y) for i, y in run.points(metric)] == [(float(s), v) for s, v in pts.items()], metric
    notes = " | ".join(run.notes)
    for axis in ("train/step", "rollout/step", "eval/step"):
        assert f"on x axis {axis}" in notes


def test_logger_writes_each_axis_to_every_tracker(env):
    """run.log(metrics, step=..., axis=...) (what trackbridge.wrap(wandb) does for slime's calls): every tracker
    reads back each series on its axis; the run's own step counter is not advanced by axis records."""
    import trackbridge

    sinks = [location(k, env / f"live-{k}") + ("?project=proj" if k == "trackio" else "") for k in KINDS]
    run = trackbridge.init(project="proj", name="live", run_id="live-1", sinks=sinks, source="canonical",
                           spool=str(env / "spool"))
    for call in slime_calls():
        axis = next(a for a in AXIS_OF_PREFIX.values() if a in call)
        run.log({k: v for k, v in call.items() if k != axis}, step=int(call[axis]), axis=axis)
    run.log({"note/plain": 1.0})
    out = run.finish(timeout=120)
    assert out is not None
    want = expected_series()
    for kind, loc in zip(KINDS, sinks):
        (reader,) = list(open_source(loc).runs())
        recs = list(reader.records())
        plain = [r for r in recs if "note/plain" in r.metrics]
        assert [(r.axis, r.step) for r in plain] == [(None, 0)], kind
        got: dict[tuple[str, str], dict[int, float]] = {}
        for r in recs:
            for k, v in r.metrics.items():
                if k != "note/plain":
                    got.setdefault((r.axis, k), {})[r.step] = v
        same_series(got, want, f32_values=kind == "tensorboard")


def test_axis_must_come_with_a_step():
    from trackbridge.logger.checks import validate_call

    with pytest.raises(TypeError, match="needs step="):
        validate_call({"train/loss": 1.0}, None, "train/step")
    with pytest.raises(TypeError, match="non-empty string"):
        validate_call({"train/loss": 1.0}, 1, 3)


def test_translated_to_canonical_each_series_keeps_its_axis(slime_run, env):
    """wandb (slime) -> canonical names (source detected from the keys) -> TensorBoard: the translation renames the
    series and keeps each on its axis; the detected source is slime."""
    dst = location("tensorboard", env / "canon")
    res = migrate(slime_run, dst, names="canonical", progress=False, out=io.StringIO())
    assert res.ok, str(res)
    assert all(r.stats.source.startswith("slime") for r in res.runs), [r.stats.source for r in res.runs]
    got, _ = series_of(dst)
    rename = {"rollout/raw_reward": "reward/score/mean", "rollout/response_lengths": "response/length/mean",
              "perf/step_time": "time/step", "perf/wait_time_ratio": "perf/wait_time_ratio",
              "train/pg_loss": "loss/policy", "train/pg_clipfrac": "policy/clip_frac", "eval/aime": "val/aime/score"}
    want = {(axis, rename[k]): pts for (axis, k), pts in expected_series().items()}
    same_series(got, want, f32_values=True)
