"""Every registered sink against one adversarial batch (as Lightning's ``tests/loggers/test_all.py`` runs every
logger): the same records are written into a fresh location of each kind, read back with trackbridge's own reader
of that kind (and, for the trackers whose tests already do it, with the tracker's own tools), and checked for what
every sink must do, whatever its tracker:

* every finite number comes back at its step, once, equal in value, under its own name (odd characters and all);
* NaN and +-inf, histograms and text come back as the sink's :class:`~trackbridge.tracking.sink.Capabilities` say
  (histograms as ``<name>/mean`` ... summaries where the tracker holds none), or are left out and said;
* ``None`` is no point and no rejection; a value no tracker holds (an ``object()``) is a rejection;
* whatever is not written is in the sink's rejections (``take_rejected()``) with a reason: a value the tracker
  cannot hold under its key and step, a record whose step it cannot hold as ``("step", step)``;
* a step the logger lets through (0 .. 2**53 - 1) is never refused; a record without a step is written where the
  sink's rule puts it (:meth:`~trackbridge.tracking.sink.Sink.points`: past every step so far; the exceptions, each
  with why, are in :data:`AUTO_STEP`);
* wall times come back (to the millisecond), and a record without one is stamped when it was written.

Each tracker's own tests keep its special cases (SwanLab's one value per key and step, wandb's rows, MLflow's
server ...).
"""
from __future__ import annotations

import contextlib
import json
import math
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from trackbridge.record import Histogram, Record, RunInfo
from trackbridge.trackers import kinds, make_sink, open_source

#: every kind with a sink, as registered (trackbridge/trackers/__init__.py); a new one is added here and so tested
EXPECTED_SINKS = ("tensorboard", "wandb", "jsonl", "trackio", "mlflow", "swanlab", "clearml", "comet", "neptune")
#: kinds with a sink that is not tested here, with why (a tracker with no offline format, that needs a server): none
#: -- MLflow is written to a local SQLite store, wandb offline, ClearML and Comet as their offline sessions
SKIPPED: dict[str, str] = {}
#: where a sink writes a record without a step when it is not the shared rule (past every step so far), and why
AUTO_STEP = {
    "tensorboard": ("previous", "TensorBoard writes a record without a step at the step of the one before it"),
    "jsonl": ("absent", "the canonical stream keeps the record as it was given: its readers resolve the step"),
    "wandb": ("absent", "wandb's own step only grows; the true step (trackbridge/step) is kept absent, as given"),
}
#: sinks that keep a record as it is given: no wall time stays no wall time, and why
AS_GIVEN = {"jsonl": "the canonical stream: its readers (replay, migrate) stamp what has no wall time"}
#: sinks that keep a step beyond int64, and why
ANY_STEP = {"jsonl": "the canonical stream is JSON: any integer step is kept"}

T0 = 1763700000.25
ODD = "odd key@[1](x), //é\u2028 end "          # MLflow, SwanLab, Comet escape parts of it: readers restore it
HIST = Histogram.from_values([1.0, 2.0, 2.0, 5.0])
SUMMARY = ("mean", "std", "min", "max", "count")
NONFINITE = ("nan", "pinf", "ninf")
HUGE_STEP = 2 ** 60                            # inside int64, beyond 2**53 (Comet, wandb) and 12 digits (neptune)
BEYOND_STEP = 2 ** 64                          # beyond int64


def batch() -> list[Record]:
    """The adversarial batch: numbers exact in float32 (TensorBoard keeps float32), so every tracker's value is
    the value written."""
    return [
        Record(0, T0, {"f": 0.5, "i": 3, "b": True, "nan": math.nan, "pinf": math.inf, "ninf": -math.inf,
                       "bigint": 2 ** 70, "hugeint": 10 ** 400, "hist": HIST, "text": "hello\nworld", "none": None,
                       "obj": object(), ODD: 1.25}),
        Record(None, T0 + 1, {"auto": 1.5}),
        Record(-5, T0 + 2, {"neg": -2.5}),
        Record(7, None, {"late": 0.75}),
        Record(HUGE_STEP, T0 + 4, {"large": 4.5}),
        Record(BEYOND_STEP, T0 + 5, {"beyond": 5.5}),
        Record(None, T0 + 6, {"auto2": 6.5}),
    ]


#: the kinds with a sink when the tests are collected (a test that registers a tracker of its own does it later)
REGISTERED = kinds("sink")
KINDS = tuple(k for k in REGISTERED if k not in SKIPPED)


def test_every_registered_sink_is_tested():
    assert REGISTERED == EXPECTED_SINKS, "a sink was added or removed: list it in EXPECTED_SINKS (or SKIPPED)"
    assert KINDS and set(KINDS) | set(SKIPPED) == set(EXPECTED_SINKS)
    assert set(AUTO_STEP) | set(ANY_STEP) | set(AS_GIVEN) <= set(KINDS)


# -- write once per kind, read back ------------------------------------------------------------------------------
class Outcome:
    def __init__(self, kind: str, root: Path) -> None:
        self.kind = kind
        self.location = f"sqlite:///{root}/ml.db" if kind == "mlflow" else str(root / kind)
        sink = make_sink(f"{kind}:{self.location}")
        self.capabilities = sink.capabilities
        sink.open(RunInfo(name="conformance", project="conformance", run_id="conf1", config={"lr": 0.5}))
        self.batch = batch()
        self.before = time.time()
        sink.write(self.batch)
        self.after = time.time()
        self.rejected = sink.take_rejected()
        sink.close()
        self.rejected += sink.take_rejected()
        (reader,) = list(open_source(f"{kind}:{self.location}").runs())
        self.records = list(reader.records())
        self.problems = list(getattr(reader, "problems", []) or [])
        self.info = reader.info
        # (key, step) -> [(value, wall_time)] of everything read back
        self.read: dict[tuple[str, int | None], list[tuple[Any, float | None]]] = {}
        for r in self.records:
            for k, v in r.metrics.items():
                self.read.setdefault((k, r.step), []).append((v, r.wall_time))

    def step_rejected(self, step: int | None) -> bool:
        return any(k == "step" and s == step for k, s, _w in self.rejected)

    def value_rejected(self, key: str, step: int | None) -> bool:
        return any(k == key and s == step for k, s, _w in self.rejected)

    def resolved(self) -> list[tuple[int | None, bool]]:
        """``(step, written)`` of each record of the batch: the step the sink's rule puts it at, and whether the
        sink took it (False: refused for its step)."""
        rule = AUTO_STEP.get(self.kind, ("next", ""))[0]
        nxt, prev, out = 0, 0, []
        for rec in self.batch:
            step = rec.step if rec.step is not None else {"next": nxt, "previous": prev, "absent": None}[rule]
            if step is not None and self.step_rejected(step):
                out.append((step, False))
                continue
            if step is not None:
                nxt, prev = max(nxt, step + 1), step
            out.append((step, True))
        return out


_OUTCOMES: dict[str, Outcome] = {}


@pytest.fixture(scope="module")
def written(tmp_path_factory, wandb_env):
    root = tmp_path_factory.mktemp("conformance")

    def get(kind: str) -> Outcome:
        if kind not in _OUTCOMES:
            _OUTCOMES[kind] = Outcome(kind, root / kind)
        return _OUTCOMES[kind]
    yield get
    _OUTCOMES.clear()


def _same(got: Any, want: Any) -> bool:
    if isinstance(want, float) and math.isnan(want):
        return isinstance(got, float) and math.isnan(got)
    if isinstance(want, (bool, int, float)) and not isinstance(got, (bool, int, float)):
        return False
    return bool(got == want)


def _count(h: Histogram) -> float:
    if h.num is not None:
        return float(h.num)
    if h.counts is not None:
        return float(sum(h.counts))
    return float(len(h.values or []))


# -- the contract ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_steps_are_resolved_by_the_rule_and_only_untakeable_ones_refused(written, kind):
    out = written(kind)
    steps = out.resolved()
    for rec, (step, ok) in zip(out.batch, steps):
        if not ok:
            assert step is not None and not 0 <= step <= 2 ** 53 - 1, \
                f"{kind}: step {step}, one the logger lets through, was refused"
            assert not any(s == step for _k, s in out.read), f"{kind}: the refused step {step} came back"
            continue
        for key, value in rec.metrics.items():
            if value is not None and not out.value_rejected(key, step):
                held = (key, step) in out.read or (key == "hist" and (f"{key}/mean", step) in out.read)
                assert held, f"{kind}: {key!r} not at step {step} (the record's step {rec.step})"
    # a record beyond int64 is refused by every tracker that keeps steps in 64 bits
    assert steps[5] == (BEYOND_STEP, kind in ANY_STEP), (kind, steps)
    # a rejection names the step its record was resolved to
    for key, step, _why in out.rejected:
        if key == "step":
            assert (step, False) in steps, (kind, step, steps)
        else:
            assert any(s == step and ok and key in rec.metrics for rec, (s, ok) in zip(out.batch, steps)), \
                (kind, key, step)


@pytest.mark.parametrize("kind", KINDS)
def test_every_finite_number_comes_back_at_its_step_once(written, kind):
    out = written(kind)
    for rec, (step, ok) in zip(out.batch, out.resolved()):
        if not ok:
            continue
        for key, value in rec.metrics.items():
            if not isinstance(value, (bool, int, float)) or (isinstance(value, float) and not math.isfinite(value)):
                continue
            if out.value_rejected(key, step):
                assert key == "hugeint", f"{kind}: the finite number {key}={value!r} was refused"
                continue
            got = out.read.get((key, step), [])
            assert len(got) == 1, f"{kind}: {key!r} at step {step}: {len(got)} values read back, want 1"
            assert _same(got[0][0], value), f"{kind}: {key!r} at step {step}: {got[0][0]!r}, want {value!r}"
    assert out.read.get((ODD, 0)), f"{kind}: the odd key did not come back under its name"


@pytest.mark.parametrize("kind", KINDS)
def test_nonfinite_histogram_text_none_and_other_as_the_capabilities_say(written, kind):
    out = written(kind)
    caps = out.capabilities
    for key in NONFINITE:
        want = out.batch[0].metrics[key]
        if caps.nan:
            got = out.read.get((key, 0), [])
            assert len(got) == 1 and _same(got[0][0], want), (kind, key, got)
        else:
            assert out.value_rejected(key, 0) and (key, 0) not in out.read, (kind, key)
    if caps.histograms:
        got = out.read.get(("hist", 0), [])
        assert len(got) == 1 and isinstance(got[0][0], Histogram) and _count(got[0][0]) == 4, (kind, got)
    elif not out.value_rejected("hist", 0):     # summary statistics, as the tracker holds no histograms
        summary = HIST.summary()
        for stat in SUMMARY:
            got = out.read.get((f"hist/{stat}", 0), [])
            assert len(got) == 1 and math.isclose(got[0][0], summary[stat]), (kind, stat, got)
    if caps.text:
        assert [v for v, _w in out.read.get(("text", 0), [])] == ["hello\nworld"], kind
    else:
        assert out.value_rejected("text", 0) and ("text", 0) not in out.read, kind
    assert all(v is None for v, _w in out.read.get(("none", 0), [])), kind
    assert not out.value_rejected("none", 0), kind
    assert out.value_rejected("obj", 0) and ("obj", 0) not in out.read, f"{kind}: a value no tracker holds"


@pytest.mark.parametrize("kind", KINDS)
def test_what_is_not_written_is_rejected_with_a_reason_and_nothing_is_doubled(written, kind):
    out = written(kind)
    keys = {k for r in out.batch for k in r.metrics} | {f"hist/{s}" for s in SUMMARY}
    for key, step, why in out.rejected:
        assert isinstance(why, str) and why.strip(), (kind, key, step, why)
        assert key == "step" or key in keys, (kind, key)
        assert (key, step) not in out.read, f"{kind}: {key!r} at {step} was rejected and came back"
    for (key, step), got in out.read.items():
        assert key in keys, f"{kind}: {key!r} came back, never written"
        assert len(got) == 1, f"{kind}: {key!r} at step {step} came back {len(got)} times"
    assert not out.problems, (kind, out.problems)
    assert out.info.name == "conformance" and out.info.config == {"lr": 0.5}, (kind, out.info)


@pytest.mark.parametrize("kind", KINDS)
def test_wall_times_come_back(written, kind):
    out = written(kind)
    if not out.capabilities.wall_time:
        pytest.skip(f"{kind} keeps no wall time")
    for rec, (step, ok) in zip(out.batch, out.resolved()):
        if not ok:
            continue
        for key in rec.metrics:
            for _v, wall in out.read.get((key, step), []):
                if rec.wall_time is not None:
                    assert wall is not None and abs(wall - rec.wall_time) <= 1e-3, (kind, key, wall, rec.wall_time)
                elif kind in AS_GIVEN:
                    assert wall is None, (kind, key, wall)
                else:       # stamped when it was written
                    assert wall is not None and out.before - 1e-3 <= wall <= out.after + 1e-3, (kind, key, wall)


# -- the trackers' own tools see the same points -----------------------------------------------------------------
#: kinds read with trackbridge's reader only here, and why
NO_OWN_READER = {"jsonl": "trackbridge's own format", "wandb": "wandb has no offline reader of its own; "
                 "test_sink_wandb.py reads the .wandb file with `wandb leet inspect --json`"}
PLAIN = ("f", "i", "b", "bigint", "auto", "neg", "late", "large", "auto2")       # names no tracker changes


def _own_points(kind: str, out: Outcome) -> set[tuple[str, int]] | None:
    """(key, step) of the plain numbers, read with the tracker's own tools (None: no such reader in the tests)."""
    root = Path(out.location)
    if kind in ("swanlab", "clearml", "comet", "neptune"):
        from _support import tracker_files
        points = getattr(tracker_files, f"{kind}_points")(root)[0]
        return {(k, s) for k, s, _w, _v in points if k in PLAIN}
    if kind == "tensorboard":
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
        (folder,) = [p for p in root.iterdir() if p.is_dir()]
        ea = EventAccumulator(str(folder), size_guidance={"scalars": 0}, purge_orphaned_data=False)
        ea.Reload()
        tags = set(ea.Tags()["scalars"])
        return {(k, e.step) for k in PLAIN if k in tags for e in ea.Scalars(k)}
    if kind == "trackio":         # trackio's SQLite store, one row per record (JSON of its values)
        (db,) = root.glob("*.db")
        with contextlib.closing(sqlite3.connect(db)) as con:
            rows = con.execute("SELECT step, metrics FROM metrics").fetchall()
        return {(k, s) for s, m in rows for k in json.loads(m) if k in PLAIN}
    if kind == "mlflow":
        from mlflow.tracking import MlflowClient
        client = MlflowClient(tracking_uri=out.location)
        exp = client.get_experiment_by_name("conformance")
        (run,) = client.search_runs([exp.experiment_id])
        return {(k, m.step) for k in PLAIN for m in client.get_metric_history(run.info.run_id, k)}
    return None


@pytest.mark.parametrize("kind", KINDS)
def test_the_trackers_own_tools_read_the_same_points(written, kind):
    out = written(kind)
    own = _own_points(kind, out)
    if own is None:
        pytest.skip(f"{kind}: read with trackbridge's reader only ({NO_OWN_READER[kind]})")
    ours = {(k, s) for (k, s) in out.read if k in PLAIN}
    assert own == ours, (kind, sorted(own ^ ours, key=str))
