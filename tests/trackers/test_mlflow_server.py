"""MlflowSink and MlflowSource against a real ``mlflow server`` (SQLite backend) on 127.0.0.1."""
from __future__ import annotations

import math

import pytest

from trackbridge.record import Histogram, Record, RunInfo
from trackbridge.trackers import make_sink, open_source

pytestmark = pytest.mark.server

ODD = "val-core/openai/gsm8k/acc/mean@1"
T0 = 1763700000.5


@pytest.fixture
def server(mlflow_server):
    return mlflow_server.url


def test_round_trip_through_server(server):
    assert server.startswith("http://127.0.0.1:")
    recs = [Record(step=i, wall_time=T0 + i, metrics={
        ODD: 0.5 + i, "loss": float("nan") if i == 1 else 2.0 / (i + 1), "h": Histogram.from_values([i, 1.0, 5.0]),
        "sample": f"s{i}"}) for i in range(300)]
    info = RunInfo(name="srv", project="grpo", config={"optim": {"lr": 1e-5}, "w(kl)": 0.1}, tags={"k": "v"})
    sink = make_sink(f"mlflow:{server}?experiment=srv")
    sink.open(info)
    sink.write(recs[:200])          # 200 steps x 9 metrics: several log_batch chunks
    sink.write(recs[200:])
    sink.write(recs[:10])                         # replay: the server's SQL store drops identical rows
    assert sink.last_step() == 299
    sink.close()

    hist = sink.client.get_metric_history(sink.run_id, "val-core/openai/gsm8k/acc/mean_x40_1")
    assert len(hist) == 300
    assert [(m.step, m.value, m.timestamp) for m in hist[:3]] == [
        (i, 0.5 + i, int((T0 + i) * 1000)) for i in range(3)]
    assert sink.client.get_run(sink.run_id).data.params["w_x28_kl_x29_"] == "0.1"

    reader = next(iter(open_source(f"mlflow:{server}?experiment=srv&name=srv").runs()))
    assert reader.info.config == info.config and reader.info.tags == info.tags and reader.info.name == "srv"
    got = list(reader.records())
    assert reader.problems == []
    assert len(got) == 300
    assert got[5].step == 5 and got[5].wall_time == T0 + 5
    assert got[5].metrics[ODD] == 5.5 and got[5].metrics["sample"] == "s5"
    assert math.isnan(got[1].metrics["loss"])
    assert got[7].metrics["h/max"] == 7.0


def test_resume_through_server(server):
    sink = make_sink(f"mlflow:{server}?experiment=srv-resume")
    sink.open(RunInfo(name="a"))
    sink.write([Record(step=0, wall_time=T0, metrics={"x": 1.0})])
    sink.close()
    again = make_sink(f"mlflow:{server}?experiment=srv-resume&run={sink.run_id}")
    again.open(RunInfo(name="a"))
    again.write([Record(step=None, wall_time=T0 + 1, metrics={"x": 2.0})])
    again.close()
    assert [(m.step, m.value) for m in again.client.get_metric_history(sink.run_id, "x")] == [(0, 1.0), (1, 2.0)]
