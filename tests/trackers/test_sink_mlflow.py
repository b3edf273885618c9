"""MlflowSink against a real MLflow SQLite store (and the file store), read back with MlflowClient itself."""
from __future__ import annotations

import json
import math
import posixpath
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trackbridge.record import Histogram, Record, RunInfo
from trackbridge.trackers import make_sink
from trackbridge.trackers.mlflow.client import read_chunked
from trackbridge.trackers.mlflow.names import mlflow_key, mlflow_valid
from trackbridge.trackers.mlflow.sink import MlflowSink
from trackbridge.tracking import names as _sanitize
from trackbridge.tracking.sink import SinkError

ODD = "val-core/openai/gsm8k/acc/mean@1"
T0 = 1763700000.125


@pytest.fixture(autouse=True)
def _env(monkeypatch, tmp_path):
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    monkeypatch.chdir(tmp_path)           # anything MLflow might drop in the cwd stays in tmp_path


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    """One SQLite store per module (creating one costs about 2 s); tests use their own experiments."""
    return "sqlite:///" + str(tmp_path_factory.mktemp("mlflow") / "mlflow.db")


def records(n=4):
    out = []
    for i in range(n):
        out.append(Record(step=i * 10, wall_time=T0 + i * 1.5, metrics={
            ODD: 0.25 * i,
            "timing(s)/gen": 1.0 + i,
            "train/loss": float("nan") if i == 1 else 1.0 / (i + 1),
            "train/inf": math.inf if i == 2 else -math.inf,
            "actor/entropy": Histogram.from_values([1.0, 2.0, 3.0, float(i)]),
            "sample": f"completion {i}",
            "missing": None,
            "flag": True,
        }))
    return out


def run_info(name="r1"):
    return RunInfo(name=name, project="grpo", run_id=f"id-{name}", config={"optim": {"lr": 1e-5, "betas": [0.9, 0.99]},
                                                      "model": "Qwen/Qwen2.5@0.5B", "w(kl)": 0.04},
                   tags={"team": "rl", "algo": "grpo"})


def test_round_trip_sqlite(db, tmp_path):
    sink = make_sink(f"mlflow:{db}?experiment=rt")
    assert isinstance(sink, MlflowSink)
    sink.open(run_info())
    sink.write(records())
    sink.close()
    sink.close()   # safe twice
    c = sink.client
    r = c.get_run(sink.run_id)
    assert r.info.run_name == "r1" and r.info.status == "FINISHED"
    assert c.get_experiment(r.info.experiment_id).name == "rt"
    # metrics: sanitized reversibly, exact values, steps and ms timestamps
    hist = c.get_metric_history(sink.run_id, "val-core/openai/gsm8k/acc/mean_x40_1")
    assert [(m.step, m.value, m.timestamp) for m in hist] == [
        (i * 10, 0.25 * i, int(round((T0 + i * 1.5) * 1000))) for i in range(4)]
    assert [m.value for m in c.get_metric_history(sink.run_id, "timing_x28_s_x29_/gen")] == [1.0, 2.0, 3.0, 4.0]
    loss = [m.value for m in c.get_metric_history(sink.run_id, "train/loss")]
    assert loss[0] == 1.0 and math.isnan(loss[1]) and loss[3] == 0.25
    # MLflow clamps infinities to the largest double
    assert [m.value for m in c.get_metric_history(sink.run_id, "train/inf")][:3] == [
        -1.7976931348623157e308, -1.7976931348623157e308, 1.7976931348623157e308]
    assert [m.value for m in c.get_metric_history(sink.run_id, "flag")] == [1.0] * 4
    assert "missing" not in r.data.metrics
    # histogram summaries, marked
    mean = c.get_metric_history(sink.run_id, "actor/entropy/mean")
    assert [m.value for m in mean] == [1.5, 1.75, 2.0, 2.25]
    assert {k for k in r.data.metrics if k.startswith("actor/entropy/")} == {
        f"actor/entropy/{s}" for s in ("mean", "std", "min", "max", "count")}
    tags = r.data.tags
    assert json.loads(read_chunked(tags, "trackbridge.histogram_summaries")) == ["actor/entropy"]
    names = json.loads(read_chunked(tags, "trackbridge.names"))
    assert names["val-core/openai/gsm8k/acc/mean_x40_1"] == ODD
    assert tags["trackbridge.key_escape"] == "xhex/1"
    assert tags["team"] == "rl" and tags["algo"] == "grpo"
    # params flattened with dotted keys, JSON for non-strings
    p = r.data.params
    assert p["optim.lr"] == "1e-05" and p["optim.betas"] == "[0.9, 0.99]"
    assert p["model"] == "Qwen/Qwen2.5@0.5B" and p["w_x28_kl_x29_"] == "0.04"
    # RunInfo as a chunked tag
    info = json.loads(read_chunked(tags, "trackbridge.run"))
    assert info["config"] == run_info().config and info["tags"] == run_info().tags
    # strings -> text artifact
    arts = c.list_artifacts(sink.run_id, "trackbridge/text")
    assert len(arts) == 1
    text = c.download_artifacts(sink.run_id, arts[0].path, str(tmp_path))
    lines = [json.loads(x) for x in open(text, encoding="utf-8")]
    assert [(x["step"], x["value"]) for x in lines] == [(i * 10, f"completion {i}") for i in range(4)]
    # the sink recorded its sanitization on the run it was given
    assert sink.run.sanitized["timing_x28_s_x29_/gen"] == "timing(s)/gen"


def test_write_twice_does_not_duplicate_and_last_step(db):
    sink = make_sink(f"mlflow:{db}?experiment=dup")
    sink.open(run_info("dup"))
    assert sink.last_step() is None
    recs = records(3)
    sink.write(recs)
    sink.write(recs)            # the SQL store ignores identical (key, value, timestamp, step) rows
    assert sink.last_step() == 20
    h = sink.client.get_metric_history(sink.run_id, "timing_x28_s_x29_/gen")
    assert len(h) == 3
    # NaN rows are not equal to themselves in SQL: check what happens to them
    loss = sink.client.get_metric_history(sink.run_id, "train/loss")
    assert len(loss) == 3
    assert len(sink.client.list_artifacts(sink.run_id, "trackbridge/text")) == 1   # same content, same file
    sink.close()


def test_resume_reopens_run_and_keeps_params(db):
    first = make_sink(f"mlflow:{db}?experiment=resume")
    info = run_info("res")
    first.open(info)
    first.write(records(2))
    first.close()
    info2 = run_info("res")
    info2.run_id = info.run_id                   # trackbridge's run id; the sink finds the MLflow run by its tag
    info2.config["optim"]["lr"] = 3e-4          # params are immutable: a resumed run keeps the logged value
    info2.config["new_key"] = 7
    again = make_sink(f"mlflow:{db}?experiment=resume")
    again.open(info2, resume=True)
    assert again.run_id == first.run_id
    assert again.last_step() == 10
    again.write([Record(step=None, wall_time=T0 + 100, metrics={ODD: 9.0})])   # no step -> continues at 11
    again.close()
    c = again.client
    r = c.get_run(first.run_id)
    assert r.data.params["optim.lr"] == "1e-05" and r.data.params["new_key"] == "7"
    steps = [m.step for m in c.get_metric_history(first.run_id, "val-core/openai/gsm8k/acc/mean_x40_1")]
    assert steps == [0, 10, 11]
    assert len(c.search_runs([r.info.experiment_id])) == 1


def test_resume_missing_run_is_a_clear_error(db):
    sink = make_sink(f"mlflow:{db}?experiment=x&run=0123456789abcdef0123456789abcdef")
    with pytest.raises(SinkError, match="no run '0123456789abcdef0123456789abcdef'"):
        sink.open(RunInfo(name="x"))


def test_more_than_1000_metrics_in_one_write(db):
    sink = make_sink(f"mlflow:{db}?experiment=big")
    sink.open(RunInfo(name="big"))
    sink.write([Record(step=0, wall_time=T0, metrics={f"m/{i}@k": float(i) for i in range(1500)})])
    sink.close()
    r = sink.client.get_run(sink.run_id)
    assert len(r.data.metrics) == 1500
    assert r.data.metrics["m/1499_x40_k"] == 1499.0


def test_a_big_batch_into_sqlite_ticks_progress_per_chunk_and_lands_whole(db):
    # issue 31: 10,000 keys a step with nine sinks in the writer process got MLflow judged stalled (finish() leaves a
    # tracker whose `progress` does not move for stall_timeout): the bulk path wrote a whole batch in one
    # transaction. Now each BULK_CHUNK points are a transaction and a tick; a chunk retried is harmless
    from trackbridge.trackers.mlflow.sink import BULK_CHUNK
    sink = make_sink(f"mlflow:{db}?experiment=wide")
    sink.open(RunInfo(name="wide"))
    assert sink._bulk is not None                    # the SQLite store takes the bulk path
    keys, steps = 10_000, 12
    batch = [Record(step=s, wall_time=T0 + s, metrics={f"k/{i}": float(i + s) for i in range(keys)})
             for s in range(steps)]
    before = sink.progress
    sink.write(batch)
    chunks = -(-keys * steps // BULK_CHUNK)
    assert chunks >= 3 and sink.progress - before == chunks
    sink.write(batch[-2:])                           # the end of the batch again (a retry): nothing doubled
    sink.close()
    import sqlite3
    con = sqlite3.connect(db[len("sqlite:///"):])
    (n,) = con.execute("SELECT COUNT(*) FROM metrics WHERE run_uuid = ?", (sink.run_id,)).fetchone()
    (latest,) = con.execute("SELECT value FROM latest_metrics WHERE run_uuid = ? AND key = 'k/9999'",
                            (sink.run_id,)).fetchone()
    con.close()
    assert n == keys * steps and latest == 9999.0 + steps - 1


def test_file_store_duplicates_on_rewrite(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    sink = make_sink(f"mlflow:{tmp_path / 'mlruns'}")
    sink.open(RunInfo(name="fs"))
    recs = [Record(step=i, wall_time=T0 + i, metrics={"a": float(i)}) for i in range(2)]
    sink.write(recs)
    sink.write(recs)
    sink.close()
    # unlike the SQL store, the (deprecated) file store appends identical rows again
    assert [m.step for m in sink.client.get_metric_history(sink.run_id, "a")] == [0, 1, 0, 1]


def test_unstorable_value_names_the_metric(db):
    sink = make_sink(f"mlflow:{db}?experiment=bad")
    sink.open(RunInfo(name="bad"))
    sink.write([Record(step=3, wall_time=T0, metrics={"obj": object(), "ok": 1.0})])   # that key only is left out
    ((key, step, why),) = sink.take_rejected()
    assert (key, step) == ("obj", 3) and "cannot store a object" in why
    assert [m.step for m in sink.client.get_metric_history(sink.run_id, "ok")] == [3]
    sink.close()


# -- the reversible escape --------------------------------------------------------------------------------
@pytest.mark.parametrize("name,stored", [
    ("val-core/openai/gsm8k/acc/mean@1", "val-core/openai/gsm8k/acc/mean_x40_1"),
    ("timing(s)/gen", "timing_x28_s_x29_/gen"),
    ("rew[0]", "rew_x5B_0_x5D_"),
    ("a,b", "a_x2C_b"),
    ("a//b", "a/_x2F_b"),
    ("/lead", "_x2F_lead"),
    ("trail/", "trail_x2F_"),
    ("../x", "_x2E__x2E_/x"),
    ("a_x41_b", "a_x5F_x41_b"),           # a literal escape-lookalike is itself escaped
    ("train/loss", "train/loss"),         # valid names are untouched
])
def test_escape_examples(name, stored):
    assert mlflow_key(name) == stored
    assert mlflow_valid(stored)
    assert _sanitize.unescape(stored) == name


@settings(max_examples=400, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("ab_xX/.@:,()[] 1F4é%#=+")), min_size=1, max_size=30))
def test_escape_is_reversible_and_valid(name):
    stored = mlflow_key(name)
    assert mlflow_valid(stored)
    assert re.fullmatch(r"[/\w.\- :]*", stored) and posixpath.normpath(stored) == stored
    if len(stored) <= 250 and "-h" not in stored[-12:]:
        assert _sanitize.unescape(stored) == name


def test_long_names_are_shortened_and_recorded(db):
    long = "x/" + "abc@" * 80
    stored = mlflow_key(long)
    assert len(stored) <= 250 and mlflow_valid(stored)
    sink = make_sink(f"mlflow:{db}?experiment=long")
    sink.open(RunInfo(name="long"))
    sink.write([Record(step=0, wall_time=T0, metrics={long: 1.0})])
    sink.close()
    names = json.loads(read_chunked(sink.client.get_run(sink.run_id).data.tags, "trackbridge.names"))
    assert names[stored] == long


def test_bulk_path_writes_exactly_what_log_batch_writes(tmp_path):
    """The local-SQLite bulk path and MLflow's own log_batch leave identical metric histories and latest values
    (NaN, +-inf, a repeated and a lower step, and a second write of the same records, which adds nothing)."""
    import random

    from mlflow.tracking import MlflowClient

    rng = random.Random(0)
    recs = []
    for s in [0, 1, 2, 5, 3, 3, 7]:
        m = {f"k{i}/v@{i % 3}": rng.random() for i in range(20)}
        m.update({"nanv": float("nan"), "infv": float("inf"), "neg": -float("inf"),
                  "h": Histogram.from_values([1.0, 2.0, 3.0])})
        recs.append(Record(step=s, wall_time=T0 + s + rng.random(), metrics=m))
    seen = {}
    for bulk in ("1", "0"):
        db = tmp_path / f"bulk{bulk}.db"
        sink = make_sink(f"mlflow:sqlite:///{db}?experiment=e&bulk={bulk}")
        sink.open(RunInfo(name="r", run_id="rid"))
        assert (sink._bulk is not None) == (bulk == "1")
        sink.write(recs)
        sink.write(recs[:3])
        sink.close()
        c = MlflowClient(f"sqlite:///{db}")
        (r,) = c.search_runs([c.get_experiment_by_name("e").experiment_id])
        latest = {k: repr(v) for k, v in r.data.metrics.items()}
        history = {k: sorted((p.step, p.timestamp, repr(p.value)) for p in c.get_metric_history(r.info.run_id, k))
                   for k in latest}
        seen[bulk] = (latest, history)
    assert seen["1"] == seen["0"]
    assert sum(len(v) for v in seen["1"][1].values()) == 7 * 28


def test_a_sink_closed_and_opened_again_ends_its_run_again(db):
    """The logger's recovery closes a failed sink and opens the same object again (resume=True): its final close
    must end the MLflow run again (it once stayed RUNNING: the second close thought it had closed already)."""
    sink = make_sink(f"mlflow:{db}?experiment=reopen")
    info = run_info("reopen")
    sink.open(info)
    sink.write(records(2))
    sink.close()
    assert sink.client.get_run(sink.run_id).info.status == "FINISHED"
    sink.open(info, resume=True)
    assert sink.client.get_run(sink.run_id).info.status == "RUNNING"
    sink.write([Record(step=30, wall_time=T0 + 30, metrics={"train/loss": 0.5})])
    sink.outcome = "failed"
    sink.close()
    assert sink.client.get_run(sink.run_id).info.status == "FAILED"

