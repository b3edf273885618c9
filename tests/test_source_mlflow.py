"""MlflowSource: runs written by MlflowSink and by plain MlflowClient, read back as records."""
from __future__ import annotations

import math

import pytest

from trackbridge.record import Histogram, Record, RunInfo
from trackbridge.sinks import make_sink
from trackbridge.sources import open_source
from trackbridge.sources.base import SourceError
import trackbridge.sources.mlflow as src_mlflow

ODD = "val-core/openai/gsm8k/acc/mean@1"
T0 = 1763700000.125


@pytest.fixture(autouse=True)
def _env(monkeypatch, tmp_path):
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    monkeypatch.chdir(tmp_path)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A SQLite store holding one trackbridge-written run and one run written with MlflowClient directly."""
    db = "sqlite:///" + str(tmp_path_factory.mktemp("mlflow_src") / "mlflow.db")
    recs = [Record(step=i, wall_time=T0 + i, metrics={
        ODD: 0.1 * i, "timing(s)/gen": 2.0 * i, "loss": float("nan") if i == 2 else 1.0 - 0.1 * i,
        "inf": math.inf, "h": Histogram.from_values([float(i), 2.0, 4.0]), "text": f"t{i}"}) for i in range(6)]
    info = RunInfo(name="ours", project="grpo", config={"optim": {"lr": 1e-5}, "k(x)": [1, 2], "s": "a@b"},
                   tags={"team": "rl"}, source="verl@>=v0.4.0")
    sink = make_sink(f"mlflow:{db}?experiment=grpo")
    sink.open(info)
    sink.write(recs[:3])
    sink.write(recs[3:])
    sink.close()

    from mlflow.entities import Metric, Param
    client = sink.client
    exp = client.create_experiment("foreign")
    run = client.create_run(exp, run_name="theirs", tags={"owner": "me"})
    rid = run.info.run_id
    client.log_batch(rid, metrics=[Metric("reward_x41_", float(i), 1000 * i + 7, i) for i in range(3)]
                     + [Metric("kl", 0.01 * i, 1000 * i + 7, i) for i in range(3)],
                     params=[Param("lr", "0.001"), Param("name", "grpo run"), Param("use_vllm", "true")])
    client.set_terminated(rid)
    return {"db": db, "records": recs, "info": info, "ours": sink.run_id, "theirs": rid}


def test_reads_trackbridge_run_exactly(store):
    runs = list(open_source(f"mlflow:{store['db']}?experiment=grpo").runs())
    assert len(runs) == 1
    reader = runs[0]
    info = reader.info
    assert info.name == "ours" and info.project == "grpo" and info.source == "verl@>=v0.4.0"
    assert info.config == store["info"].config and info.tags == store["info"].tags
    assert info.run_id == store["ours"]
    assert info.extra["histogram_summaries"] == ["h"]
    assert info.sanitized["timing_x28_s_x29_/gen"] == "timing(s)/gen"
    got = list(reader.records())
    assert reader.problems == []
    assert [r.step for r in got] == list(range(6))
    for r, want in zip(got, store["records"]):
        assert r.wall_time == pytest.approx(want.wall_time, abs=1e-3)
        assert int(round(r.wall_time * 1000)) == int(round(want.wall_time * 1000))
        assert r.metrics[ODD] == want.metrics[ODD]
        assert r.metrics["timing(s)/gen"] == want.metrics["timing(s)/gen"]
        if math.isnan(want.metrics["loss"]):
            assert math.isnan(r.metrics["loss"])
        else:
            assert r.metrics["loss"] == want.metrics["loss"]
        assert r.metrics["inf"] == math.inf                      # clamped by MLflow, restored by the reader
        assert r.metrics["text"] == want.metrics["text"]
        s = want.metrics["h"].summary()
        assert {k: r.metrics[f"h/{k}"] for k in s} == s           # histogram -> marked summaries


def test_reads_foreign_run_as_stored(store):
    reader = next(iter(open_source(f"mlflow:{store['db']}?experiment=foreign").runs()))
    info = reader.info
    assert info.name == "theirs" and info.project == "foreign"
    assert info.config == {"lr": 0.001, "name": "grpo run", "use_vllm": True}
    assert info.tags == {"owner": "me"}
    got = list(reader.records())
    assert [(r.step, r.wall_time) for r in got] == [(i, (1000 * i + 7) / 1000) for i in range(3)]
    # a foreign name that looks like an escape is NOT decoded
    assert got[1].metrics == {"reward_x41_": 1.0, "kl": 0.01}


def test_select_by_run_and_name(store):
    by_id = list(open_source(f"mlflow:{store['db']}?run={store['theirs']}").runs())
    assert [r.info.name for r in by_id] == ["theirs"]
    by_name = list(open_source(f"mlflow:{store['db']}?name=ours").runs())
    assert [r.info.run_id for r in by_name] == [store["ours"]]
    everything = list(open_source(f"mlflow:{store['db']}").runs())
    assert {r.info.name for r in everything} == {"ours", "theirs"}


def test_missing_things_raise_source_error(store):
    with pytest.raises(SourceError, match="no run with id 'deadbeef'"):
        list(open_source(f"mlflow:{store['db']}?run=deadbeef").runs())
    with pytest.raises(SourceError, match="no experiment named 'nope'.*grpo"):
        list(open_source(f"mlflow:{store['db']}?experiment=nope").runs())
    with pytest.raises(SourceError, match="no run named 'ghost'"):
        list(open_source(f"mlflow:{store['db']}?name=ghost").runs())


def test_paged_history_streams_in_order(store, monkeypatch):
    monkeypatch.setattr(src_mlflow, "PAGE", 2)        # force several pages per metric key
    reader = next(iter(open_source(f"mlflow:{store['db']}?experiment=grpo").runs()))
    got = list(reader.records())
    assert [r.step for r in got] == list(range(6))
    assert [r.metrics[ODD] for r in got] == [0.1 * i for i in range(6)]
