"""trackbridge.read (issue 34 item 2): the points of runs in long format, as records, pandas and Arrow, from what the
trackers really wrote, checked against the trackers' own readers (tbparse for TensorBoard, MLflow's client for an
SQLite store) and against translate() for the names and the fidelity marks."""
from __future__ import annotations

import collections
import math
import sys

import pytest

import trackbridge
from trackbridge.errors import UsageError
from trackbridge.extras import MissingExtra
from trackbridge.read import COLUMNS

from _support import ROOT

pd = pytest.importorskip("pandas")
pa = pytest.importorskip("pyarrow")

VERL_LOG = ROOT / "examples" / "verl_console.log"
GRPO_STATE = ROOT / "examples" / "trl_grpo_trainer_state.json"
STEPS = 40
KEYS = ("actor/pg_loss", "actor/entropy", "critic/score/mean", "response_length/mean", "my_own/metric")


def _value(step: int, i: int) -> float:
    return round(math.sin(step * 0.3 + i) + 0.01 * step * (i + 1), 6)


def _log_run(tmp_path, sinks: list[str], run_id: str = "r1", name: str = "verl-seed1") -> None:
    run = trackbridge.init(project="p", name=name, run_id=run_id, spool=str(tmp_path / f"spool-{run_id}"),
                           sinks=sinks, source="verl/ppo@0.9.1", names="verl/ppo@0.9.1")
    for step in range(1, STEPS + 1):
        metrics = {k: _value(step, i) for i, k in enumerate(KEYS)}
        if step == 7:
            metrics["actor/entropy"] = float("nan")           # a poison value: kept as a row, NaN
        metrics["note/text"] = f"step {step}"                 # text: not a row, counted
        run.log(metrics, step=step)
    run.finish()


def test_tensorboard_run_read_as_its_own_reader_reads_it(tmp_path):
    tb = tmp_path / "tb"
    _log_run(tmp_path, [f"tensorboard:{tb}"])
    reading = trackbridge.read(f"tensorboard:{tb}", names="keep")
    df = reading.to_pandas()
    assert list(df.columns) == ["run", "step", "wall_time", "key", "value", "fidelity"]
    from tbparse import SummaryReader
    ref = SummaryReader(str(tb), pivot=False).scalars
    ref = ref[ref["tag"].isin(KEYS)]
    assert len(ref) == STEPS * len(KEYS)
    got = df[df["key"].isin(KEYS)]
    assert len(got) == len(ref) and set(df["fidelity"]) == {"as stored"}
    mine = {(int(r.step), r.key): r.value for r in got.itertuples()}
    for r in ref.itertuples():
        want, have = float(r.value), mine[(int(r.step), r.tag)]
        assert (math.isnan(want) and math.isnan(have)) or math.isclose(want, have, rel_tol=1e-6), (r.step, r.tag)
    assert math.isnan(mine[(7, "actor/entropy")])
    (run,) = reading.runs
    assert run.non_numeric >= STEPS and run.points == len(df)       # the text values counted, not rows


def test_mlflow_sqlite_translated_with_fidelity_as_translate_gives_it(tmp_path):
    db = tmp_path / "mlflow.db"
    _log_run(tmp_path, [f"mlflow:sqlite:///{db}?experiment=grpo"])
    reading = trackbridge.read(f"mlflow:sqlite:///{db}?experiment=grpo", source="verl/ppo@0.9.1")
    rows = list(reading)
    from mlflow.tracking import MlflowClient
    client = MlflowClient(tracking_uri=f"sqlite:///{db}")
    (exp,) = [e for e in client.search_experiments() if e.name == "grpo"]
    (mrun,) = client.search_runs([exp.experiment_id])
    n_ref = sum(len(client.get_metric_history(mrun.info.run_id, k)) for k in KEYS)
    assert n_ref == STEPS * len(KEYS)
    logged = [p for p in rows if p.fidelity != "derived"]
    assert len(logged) == n_ref
    # names and fidelity: what translate() gives for the same dict
    res = trackbridge.translate({k: 1.0 for k in KEYS}, source="verl/ppo@0.9.1")
    assert {p.key for p in logged} == set(res.metrics)
    (run,) = reading.runs
    for p in logged:
        why = res.approximate.get(p.key)
        if p.key == "my_own/metric":
            assert p.fidelity == "unmapped" and p.key in run.unmapped
        elif why is None:
            assert p.fidelity == "exact", p
        else:
            assert p.fidelity in ("approximate", "unproven") and run.reasons[p.key] == why
    assert {"exact", "unmapped"} <= {p.fidelity for p in logged}
    assert any(p.fidelity == "approximate" for p in logged)


def test_selection_runs_metrics_steps_and_labels(tmp_path):
    tb = tmp_path / "tb"
    _log_run(tmp_path, [f"tensorboard:{tb}"], run_id="a1", name="verl-seed1")
    _log_run(tmp_path, [f"tensorboard:{tb}"], run_id="b2", name="trl-seed2")
    everything = trackbridge.read(f"tensorboard:{tb}", names="keep")
    assert len(everything.labels()) == 2
    one = trackbridge.read(f"tensorboard:{tb}", names="keep", runs="seed1", metrics="actor/*", steps=(10, 19))
    df = one.to_pandas()
    assert len(one.labels()) == 1 and set(df["run"]) == set(one.labels())
    assert set(df["key"]) == {"actor/pg_loss", "actor/entropy"}
    assert df["step"].min() == 10 and df["step"].max() == 19 and len(df) == 2 * 10
    with pytest.raises(UsageError, match="no run matching runs='nope'"):
        trackbridge.read(f"tensorboard:{tb}", runs="nope").to_pandas()
    with pytest.raises(UsageError, match="not a regular expression"):
        trackbridge.read(f"tensorboard:{tb}", runs="(")
    with pytest.raises(UsageError, match="steps="):
        trackbridge.read(f"tensorboard:{tb}", steps=(1, "x"))


def test_arrow_pandas_records_and_batches_agree_on_two_frameworks():
    """A TRL and a veRL file, labelled, into veRL's names: the same rows whichever way they are taken; the Arrow
    batches are bounded and stream."""
    reading = trackbridge.read([f"grpo={GRPO_STATE}", f"verl={VERL_LOG}"], names="verl")
    rows = list(reading)
    assert {r.run for r in rows} == {"grpo", "verl"} and len(rows) > 1000
    table = reading.to_arrow()
    assert table.num_rows == len(rows) and table.schema.names == list(COLUMNS)
    df = reading.to_pandas()
    assert len(df) == len(rows)
    assert df["value"].sum() == pytest.approx(sum(r.value for r in rows if not math.isnan(r.value)), rel=1e-9)
    sizes = [b.num_rows for b in reading.batches(rows=500)]
    assert sum(sizes) == len(rows) and max(sizes) == 500 and len(sizes) == math.ceil(len(rows) / 500)
    assert {"exact", "approximate"} <= set(df["fidelity"])
    assert set(df["fidelity"]) <= {"exact", "approximate", "unproven", "derived", "unmapped"}


def test_a_missing_extra_is_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "pandas", None)
    with pytest.raises(MissingExtra, match=r"needs the \[pandas\] extra .*pip install 'trackbridge\[pandas\]'"):
        trackbridge.read(str(VERL_LOG)).to_pandas()
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    with pytest.raises(MissingExtra, match=r"\[arrow\] extra"):
        trackbridge.read(str(VERL_LOG)).to_arrow()


def test_read_gives_every_tracker_the_points_its_own_tools_give(tmp_path, wandb_env):
    """All nine trackers written at once by the logger, then ``trackbridge.read`` on each: the same (key, step, value)
    points the tracker's own tools give (TensorBoard's EventFileLoader, MLflow's client, sqlite3 on Trackio's
    store, wandb's protobufs on its transaction log, SwanLab's DataStoreReader, ClearML's session files, Comet's
    schemas, the Parquet parts; tests/_support/readback.py, tracker_files.py)."""
    from _support import readback as RB
    from _support import tracker_files as TF
    sinks = {"jsonl": f"jsonl:{tmp_path}/jsonl", "tensorboard": f"tensorboard:{tmp_path}/tb",
             "mlflow": f"mlflow:sqlite:///{tmp_path}/ml.db", "wandb": f"wandb:{tmp_path}/wb",
             "trackio": f"trackio:{tmp_path}/tio", "swanlab": f"swanlab:{tmp_path}/sw",
             "clearml": f"clearml:{tmp_path}/cl", "comet": f"comet:{tmp_path}/cm", "neptune": f"neptune:{tmp_path}/np"}
    run = trackbridge.init(project="nine", name="all", run_id="nine", sinks=list(sinks.values()),
                           spool=str(tmp_path / "spool"), source="canonical")
    n = 30
    for i in range(n):
        run.log({"custom/loss": 1.0 / (i + 1), "custom/reward": i * 0.5}, step=i)
    st = run.finish()
    assert [s["state"] for s in st["sinks"]] == ["closed"] * 10, st
    keys = ("custom/loss", "custom/reward")

    def own(kind: str) -> dict[tuple[str, int], int]:
        if kind in ("swanlab", "clearml", "comet", "neptune"):
            pts = {"swanlab": TF.swanlab_points(tmp_path / "sw"), "clearml": TF.clearml_points(tmp_path / "cl"),
                   "comet": TF.comet_points(tmp_path / "cm"), "neptune": TF.neptune_points(tmp_path / "np")}[kind][0]
            return dict(collections.Counter((k, s) for k, s, _t, _v in pts if k in keys))
        if kind == "tensorboard":
            counted = RB.tensorboard_points(tmp_path / "tb")
        elif kind == "mlflow":
            counted = RB.mlflow_points(f"sqlite:///{tmp_path}/ml.db", "nine")
        elif kind == "trackio":
            counted = RB.trackio_points(tmp_path / "tio" / "nine.db", "nine")      # the project's database
        elif kind == "wandb":
            counted = RB.wandb_points(tmp_path / "wb", "nine")
        else:
            counted, _ = RB.spool_points(tmp_path / "jsonl" / "nine.jsonl")
        return {(k, s): c for k in keys for s, c in counted.get(k, {}).items()}

    checked = []
    for kind, loc in sinks.items():
        df = trackbridge.read(loc, names="keep", metrics=list(keys)).to_pandas()
        mine = dict(collections.Counter(zip(df["key"], df["step"].astype(int))))
        assert mine == own(kind) and len(df) == 2 * n, (kind, len(df))
        loss = df[df["key"] == "custom/loss"].sort_values("step")["value"].tolist()
        assert loss == pytest.approx([1.0 / (i + 1) for i in range(n)], rel=1e-6), kind
        checked.append(kind)
    assert checked == list(sinks)
