"""MlflowSource: runs written by MlflowSink and by plain MlflowClient, read back as records."""
from __future__ import annotations

import math

import pytest

import trackbridge.trackers.mlflow.source as src_mlflow
from trackbridge.record import Histogram, Record, RunInfo
from trackbridge.trackers import make_sink, open_source
from trackbridge.tracking.source import SourceError

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


# -- the local SQLite store is read with plain SQL; servers are paged ---------------------------------------------
def _client_records(reader):
    """The same run read through MLflow's client API (the server path: paged get_metric_history per key)."""
    path, reader.db_path = reader.db_path, None
    try:
        return list(reader.records())
    finally:
        reader.db_path = path


def _same_records(a, b):
    assert [(r.step, r.wall_time, sorted(r.metrics), r.derived) for r in a] == \
        [(r.step, r.wall_time, sorted(r.metrics), r.derived) for r in b]
    for x, y in zip(a, b):
        for k, v in x.metrics.items():
            w = y.metrics[k]
            assert v == w or (isinstance(v, float) and math.isnan(v) and math.isnan(w)), (x.step, k, v, w)


def test_sqlite_store_is_read_with_sql_like_the_client_reads_it(store):
    for reader in open_source(f"mlflow:{store['db']}").runs():
        assert reader.db_path is not None and reader.db_path.name == "mlflow.db"     # the SQL path
        got = list(reader.records())
        assert got and reader.problems == []
        _same_records(got, _client_records(reader))


def test_same_step_same_millisecond_values_all_come_back(tmp_path):
    """Two values of one key at one step and one millisecond are two records, in the order stored; the very same
    row twice is one row in MLflow's store and comes back once."""
    import sqlite3

    from mlflow import MlflowClient
    from mlflow.entities import Metric
    db = tmp_path / "dup.db"
    client = MlflowClient(f"sqlite:///{db}")
    exp = client.create_experiment("dup")
    rid = client.create_run(exp, run_name="dup").info.run_id
    client.log_batch(rid, metrics=[Metric("x", 2.0, 1000, 1), Metric("y", 5.0, 1000, 1)])
    client.log_batch(rid, metrics=[Metric("x", 1.0, 1000, 1)])           # same key, step, ms: another value
    client.log_batch(rid, metrics=[Metric("x", 3.0, 2000, 2)])
    client.log_batch(rid, metrics=[Metric("x", 3.0, 2000, 2)])           # the very same row: MLflow keeps one
    client.log_batch(rid, metrics=[Metric("x", float("nan"), 3000, 3), Metric("x", 7.0, 3000, 3)])
    rows = sqlite3.connect(db).execute("SELECT count(*) FROM metrics").fetchone()[0]
    reader = next(iter(open_source(f"mlflow:sqlite:///{db}").runs()))
    got = [(r.step, r.wall_time, r.metrics) for r in reader.records()]
    assert [(s, t) for s, t, _ in got] == [(1, 1.0), (1, 1.0), (2, 2.0), (3, 3.0), (3, 3.0)]
    assert got[0][2] == {"x": 2.0, "y": 5.0} and got[1][2] == {"x": 1.0}      # as logged, in the order stored
    assert got[2][2] == {"x": 3.0}
    assert math.isnan(got[3][2]["x"]) and got[4][2] == {"x": 7.0}
    assert sum(len(m) for _, _, m in got) == rows == 6                         # every stored point, none doubled


def test_sql_reader_streams_one_batch_at_a_time(store, monkeypatch):
    monkeypatch.setattr(src_mlflow, "FETCH", 3)                # several fetches per run
    reader = next(iter(open_source(f"mlflow:{store['db']}?experiment=grpo").runs()))
    it = reader.records()
    first = next(it)
    assert first.step == 0 and first.metrics[ODD] == 0.0
    rest = list(it)
    assert [r.step for r in rest] == [1, 2, 3, 4, 5]


def test_a_file_that_is_no_mlflow_store_is_not_read_with_sql(tmp_path):
    import sqlite3
    db = tmp_path / "other.db"
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE metrics (a, b)")
    con.commit()
    con.close()
    assert not src_mlflow._has_metrics_table(db)
    assert not src_mlflow._has_metrics_table(tmp_path / "missing.db")


def test_server_is_paged_and_reads_like_the_sqlite_file(tmp_path, monkeypatch, mlflow_server):
    """A real ``mlflow server``: histories are paged (a few points per page here), and the run reads the same as
    the server's own SQLite file read with SQL."""
    url = mlflow_server.url
    recs = [Record(step=s, wall_time=T0 + 0.5 * i, metrics={"a": float(i), "eval/b": -float(i), ODD: 0.5 * i})
            for i, s in enumerate([0, 1, 2, 5, 3, 4, 6, 7])]
    sink = make_sink(f"mlflow:{url}?experiment=paged&bulk=0")
    sink.open(RunInfo(name="paged", project="paged"))
    sink.write(recs)
    sink.close()
    monkeypatch.setattr(src_mlflow, "PAGE_BUDGET", 9)     # 3 points per page and key
    pages = []
    history = src_mlflow.MlflowRunReader._history
    monkeypatch.setattr(src_mlflow.MlflowRunReader, "_history",
                        lambda self, key, page=src_mlflow.PAGE: pages.append(page) or history(self, key, page))
    reader = next(iter(open_source(f"mlflow:{url}?experiment=paged").runs()))
    assert reader.db_path is None
    served = list(reader.records())
    assert pages and all(p == 3 for p in pages)
    assert [(r.step, r.wall_time) for r in served] == [(r.step, r.wall_time) for r in recs]
    assert [r.metrics for r in served] == [r.metrics for r in recs]
    local = next(iter(open_source(f"mlflow:sqlite:///{mlflow_server.db}?experiment=paged").runs()))
    assert local.db_path is not None
    _same_records(list(local.records()), served)
