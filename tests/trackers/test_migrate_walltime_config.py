"""A TensorBoard run written the way TRL / transformers write it, migrated TB -> MLflow -> wandb -> Trackio -> JSONL
-> TB: every point keeps its value and its own wall time (the evaluation row of a step 2.6 s after that step's
training row), nothing is lost or doubled, and the run config (transformers' ``args`` and ``model_config`` texts)
is the run's config at every hop, not a step-0 metric.

Then, per reader, that a training row and an evaluation row of the same step come back as two records, each with
its own wall time (records per step and split, see :mod:`trackbridge.tracking.source`).

How transformers' ``TensorBoardCallback`` writes (transformers 5.x, ``integrations/integration_utils.py``):
``add_text("args", args.to_json_string())`` and ``add_text("model_config", model.config.to_json_string())`` at train
begin (tags ``args/text_summary``, ``model_config/text_summary``, step 0), then one ``add_scalar(k, v, global_step)``
per logged value, ``train/``-prefixed for training rows and ``eval/`` for evaluation rows (``rewrite_logs``).
"""
from __future__ import annotations

import io
import json
import sqlite3
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from trackbridge.migrate import migrate, summary
from trackbridge.record import Record, RunInfo
from trackbridge.trackers import open_source

from test_migrate_support import location

pytest.importorskip("tensorboard")

T0 = 1_763_700_000.0
ARGS = {"output_dir": "out/grpo", "learning_rate": 1e-05, "per_device_train_batch_size": 4, "logging_steps": 1,
        "eval_strategy": "steps", "eval_steps": 2, "beta": 0.04, "num_generations": 8, "report_to": ["tensorboard"],
        "lr_scheduler_kwargs": {}, "seed": 42, "bf16": False, "push_to_hub_token": None}
MODEL_CONFIG = {"architectures": ["Qwen2ForCausalLM"], "hidden_size": 32, "num_hidden_layers": 2,
                "model_type": "qwen2", "rope_scaling": None, "torch_dtype": "float32", "vocab_size": 151936}
EVAL_STEPS = (3, 5)
EVAL_DELAY = 2.6          # seconds between a step's training row and its evaluation row
SPREAD = 2e-5             # seconds between two add_scalar calls of one row (a real writer: microseconds)


def summary_writer():
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        SummaryWriter = pytest.importorskip("tensorboardX").SummaryWriter
    return SummaryWriter


def write_trl_run(folder: Path) -> None:
    """One TensorBoard run folder as transformers' TensorBoardCallback writes it (explicit wall times)."""
    w = summary_writer()(str(folder))
    w.add_text("args", json.dumps(ARGS, indent=2, sort_keys=True), walltime=T0)   # to_json_string(): indent 2
    w.add_text("model_config", json.dumps(MODEL_CONFIG, indent=2, sort_keys=True) + "\n", walltime=T0)
    for step in range(1, 6):
        t = T0 + 10.0 * step
        row = {"train/loss": 1.0 / step, "train/grad_norm": 0.5 + 0.1 * step, "train/learning_rate": 1e-05 * step,
               "train/epoch": 0.2 * step}
        for i, (k, v) in enumerate(row.items()):
            w.add_scalar(k, v, step, walltime=t + i * SPREAD)
        if step in EVAL_STEPS:
            # transformers' eval row carries the epoch too, which rewrite_logs turns into train/epoch
            row = {"eval/loss": 2.0 / step, "eval/runtime": 0.37 * step, "train/epoch": 0.2 * step}
            for i, (k, v) in enumerate(row.items()):
                w.add_scalar(k, v, step, walltime=t + EVAL_DELAY + i * SPREAD)
    w.close()


def tb_points(folder: Path) -> dict[tuple[str, int], list[tuple[float, float]]]:
    """Every scalar of a run folder, read with TensorBoard's own EventAccumulator: (tag, step) -> [(wall, value)]."""
    from tensorboard.backend.event_processing import event_accumulator as ea

    acc = ea.EventAccumulator(str(folder), size_guidance={ea.SCALARS: 0, ea.TENSORS: 0})
    acc.Reload()
    out: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for tag in acc.Tags()["scalars"]:
        for e in acc.Scalars(tag):
            out.setdefault((tag, e.step), []).append((e.wall_time, e.value))
    return out


def tb_hparams(folder: Path) -> dict:
    """The hparams plugin's session_start_info of a run folder, read with TensorBoard's own classes."""
    from tensorboard.backend.event_processing import event_accumulator as ea
    from tensorboard.plugins.hparams import plugin_data_pb2

    acc = ea.EventAccumulator(str(folder), size_guidance={ea.TENSORS: 0})
    acc.Reload()
    out = {}
    for content in acc.PluginTagToContent("hparams").values():
        data = plugin_data_pb2.HParamsPluginData.FromString(content)
        if data.WhichOneof("data") == "session_start_info":
            for k, v in data.session_start_info.hparams.items():
                out[k] = getattr(v, v.WhichOneof("kind"))
    return out


def wandb_config(folder: Path) -> dict:
    """The config items of the offline run(s) under ``folder``, from wandb's own protobuf records."""
    from wandb.proto import wandb_internal_pb2 as pb

    from trackbridge.trackers.wandb.records import find_wandb_files, read_payloads

    config: dict = {}
    for path in find_wandb_files(folder):
        for _, data in read_payloads(path):
            rec = pb.Record()
            rec.ParseFromString(data)
            kind = rec.WhichOneof("record_type")
            items = rec.run.config.update if kind == "run" else rec.config.update if kind == "config" else ()
            for item in items:
                config[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
    return config


def run_folder(root: Path) -> Path:
    (folder,) = {p.parent for p in root.rglob("events.out.tfevents.*")}
    return folder


def hop(src: str, dst: str) -> None:
    res = migrate(src, dst, names="keep", progress=False, out=io.StringIO())
    text = summary(res)
    assert res.ok and len(res.runs) == 1, text
    assert not res.runs[0].problems, text


def test_trl_tensorboard_run_through_every_tracker_keeps_wall_times_and_config(env):
    src = env / "tb-src" / "runs" / "Nov20_10-00-00_host"
    write_trl_run(src)
    original = tb_points(src)
    assert sum(map(len, original.values())) == 5 * 4 + 2 * 3
    assert [len(original[("train/epoch", s)]) for s in range(1, 6)] == [1, 1, 2, 1, 2]

    # the reader: config from the texts, no text metric, train and eval rows of one step apart
    (reader,) = open_source(f"tensorboard:{env / 'tb-src'}").runs()
    assert reader.info.config == {"args": ARGS, "model_config": MODEL_CONFIG}
    recs = list(reader.records())
    assert reader.problems == []
    assert not any("text_summary" in k for r in recs for k in r.metrics)
    at3 = [r for r in recs if r.step == 3]
    assert [sorted(r.metrics) for r in at3] == [["train/epoch", "train/grad_norm", "train/learning_rate", "train/loss"],
                                                ["eval/loss", "eval/runtime", "train/epoch"]]
    assert at3[0].wall_time == T0 + 30.0 and at3[1].wall_time == T0 + 30.0 + EVAL_DELAY

    # --strict on the first hop with canonical names: nothing unmapped, nothing skipped (the texts are config)
    strict_dst = location("mlflow", env / "strict")
    r = subprocess.run([sys.executable, "-m", "trackbridge", "migrate", f"tensorboard:{env / 'tb-src'}", strict_dst,
                        "--strict", "--quiet"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "unmapped (kept as is): 0" in r.stdout + r.stderr, r.stdout + r.stderr

    # TB -> MLflow -> wandb -> Trackio -> JSONL -> TB, names kept
    ml = location("mlflow", env / "mlflow")
    wb = location("wandb", env / "wandb")
    tio = location("trackio", env / "trackio", projects=("trackbridge",))
    jl = location("jsonl", env / "jsonl")
    tb_out = location("tensorboard", env / "tb-out")
    hop(f"tensorboard:{env / 'tb-src'}", ml)

    from trackbridge.trackers.mlflow.client import make_client
    client = make_client(ml[len("mlflow:"):])
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    params = run.data.params
    for prefix, cfg in (("args", ARGS), ("model_config", MODEL_CONFIG)):
        for k, v in cfg.items():
            if v == {}:
                continue                                   # an empty dict has no leaf to become a param
            stored = params[f"{prefix}.{k}"]
            assert (stored if isinstance(v, str) else json.loads(stored)) == v, (k, stored)
    eval3 = [m for m in client.get_metric_history(run.info.run_id, "eval/loss") if m.step == 3]
    assert [m.timestamp for m in eval3] == [round((T0 + 30.0 + EVAL_DELAY) * 1000)]

    hop(ml, wb)
    cfg = wandb_config(env / "wandb")
    assert cfg["args"] == ARGS and cfg["model_config"] == MODEL_CONFIG

    hop(wb, tio)
    with sqlite3.connect(next((env / "trackio").glob("*.db"))) as conn:
        (blob,) = [row[0] for row in conn.execute("SELECT config FROM configs")]
    cfg = json.loads(blob)
    assert cfg["args"] == ARGS and cfg["model_config"] == MODEL_CONFIG

    hop(tio, jl)
    (jfile,) = (env / "jsonl").glob("*.jsonl")
    header = json.loads(jfile.read_text().splitlines()[0])
    assert header["type"] == "run" and header["config"] == {"args": ARGS, "model_config": MODEL_CONFIG}

    hop(jl, tb_out)
    final_folder = run_folder(env / "tb-out")
    final = tb_points(final_folder)

    # no point lost, none doubled, each value and wall time the original's
    assert Counter({k: len(v) for k, v in final.items()}) == Counter({k: len(v) for k, v in original.items()})
    for key, pts in original.items():
        for (wall, value), (wall2, value2) in zip(sorted(pts), sorted(final[key])):
            assert value2 == value, key                             # float32 in both TensorBoard files
            assert abs(wall2 - wall) <= 1e-3, (key, wall2 - wall)   # MLflow keeps milliseconds
    for step in EVAL_STEPS:
        assert final[("eval/loss", step)][0][0] - final[("train/loss", step)][0][0] == pytest.approx(EVAL_DELAY,
                                                                                                      abs=2e-3)
    # the config: the final run's (trackbridge's reader) and what TensorBoard's HParams tab shows
    (final_reader,) = open_source(f"tensorboard:{env / 'tb-out'}").runs()
    assert final_reader.info.config == {"args": ARGS, "model_config": MODEL_CONFIG}
    hp = tb_hparams(final_folder)
    assert hp["args/learning_rate"] == pytest.approx(1e-05) and hp["model_config/model_type"] == "qwen2"

    # idempotent: every hop again writes nothing
    for a, b in ((f"tensorboard:{env / 'tb-src'}", ml), (ml, wb), (wb, tio), (tio, jl), (jl, tb_out)):
        res = migrate(a, b, names="keep", progress=False, out=io.StringIO())
        assert res.ok and all(r.already_done for r in res.runs), summary(res)
    assert tb_points(final_folder) == final


def test_config_text_that_is_not_json_is_kept_and_reported(tmp_path):
    w = summary_writer()(str(tmp_path / "run"))
    w.add_text("args", "TrainingArguments(output_dir='x', lr=1e-5)", walltime=T0)
    w.add_scalar("train/loss", 1.0, 1, walltime=T0 + 1)
    w.close()
    (reader,) = open_source(f"tensorboard:{tmp_path}").runs()
    assert reader.info.config == {"args": "TrainingArguments(output_dir='x', lr=1e-5)"}
    assert [r.metrics for r in reader.records()] == [{"train/loss": 1.0}]
    assert len(reader.problems) == 1 and "'args/text_summary' is not JSON" in reader.problems[0].what


# -- per reader: a training row and an evaluation row of one step are two records, each with its wall time --------
def _rows(recs: list[Record]) -> list[tuple]:
    return [(r.step, None if r.wall_time is None else round(r.wall_time, 6), sorted(r.metrics)) for r in recs]


TRAIN = {"train/loss": 0.5, "train/learning_rate": 1e-05}
EVAL = {"eval/loss": 0.75, "eval/runtime": 1.5}


def _sink_roundtrip(kind: str, folder: Path) -> list[Record]:
    """Train and eval records of steps 1 (train only) and 2 (both) through trackbridge's sink, read back."""
    from trackbridge.trackers import make_sink

    loc = location(kind, folder, projects=("trackbridge",))
    sink = make_sink(loc)
    sink.open(RunInfo(name="r", run_id="r1", config={"args": ARGS}))
    sink.write([Record(1, T0 + 10.0, dict(TRAIN)), Record(2, T0 + 20.0, dict(TRAIN)),
                Record(2, T0 + 20.0 + EVAL_DELAY, dict(EVAL)), Record(3, T0 + 30.0, dict(TRAIN))])
    sink.close()
    (reader,) = open_source(loc).runs()
    recs = list(reader.records())
    assert reader.problems == [] and reader.info.config == {"args": ARGS}
    return recs


@pytest.mark.parametrize("kind", ["tensorboard", "mlflow", "wandb", "trackio", "jsonl"])
def test_sinks_and_readers_keep_two_records_of_one_step(kind, env):
    recs = _sink_roundtrip(kind, env / kind)
    assert _rows(recs) == [(1, T0 + 10.0, sorted(TRAIN)), (2, T0 + 20.0, sorted(TRAIN)),
                           (2, T0 + 20.0 + EVAL_DELAY, sorted(EVAL)), (3, T0 + 30.0, sorted(TRAIN))]


def test_tensorboard_reader_other_writer(tmp_path):
    w = summary_writer()(str(tmp_path / "run"))
    for k, v in TRAIN.items():
        w.add_scalar(k, v, 2, walltime=T0)
    w.add_scalar("eval_loss", 0.75, 2, walltime=T0 + 0.5)          # another split, within the tolerance
    w.add_scalar("train/epoch", 1.0, 2, walltime=T0 + 0.50001)      # the epoch: of no split, stays in its row
    w.add_scalar("train/grad_norm", 1.0, 2, walltime=T0 + 0.9)      # train again: a new record
    w.add_scalar("train/entropy", 2.0, 2, walltime=T0 + 2.5)        # same split, 1.6 s after that one's start
    w.close()
    (reader,) = open_source(f"tensorboard:{tmp_path}").runs()
    assert _rows(list(reader.records())) == [(2, T0, sorted(TRAIN)), (2, T0 + 0.5, ["eval_loss", "train/epoch"]),
                                             (2, T0 + 0.9, ["train/grad_norm"]), (2, T0 + 2.5, ["train/entropy"])]


def test_mlflow_reader_other_writer(env):
    from mlflow.entities import Metric

    from trackbridge.trackers.mlflow.client import make_client

    loc = location("mlflow", env / "mlflow")
    client = make_client(loc[len("mlflow:"):])
    exp = client.create_experiment("plain")
    run = client.create_run(exp, run_name="plain")
    ms = int(T0 * 1000)
    client.log_batch(run.info.run_id, metrics=[
        Metric("train/loss", 0.5, ms, 2), Metric("train/learning_rate", 1e-05, ms + 3, 2),   # one row, 3 ms apart
        Metric("train/epoch", 1.0, ms, 2),
        Metric("eval/loss", 0.75, ms + 2600, 2), Metric("eval/runtime", 1.5, ms + 2601, 2),
        Metric("epoch", 1.0, ms + 2601, 2),                                                  # the eval row's
        Metric("test_acc", 0.9, ms + 2700, 2),                                               # a third split
        Metric("train/loss", 0.4, ms + 10000, 3)])
    client.set_terminated(run.info.run_id)
    (reader,) = open_source(loc).runs()
    assert _rows(list(reader.records())) == [(2, T0, sorted([*TRAIN, "train/epoch"])),
                                             (2, T0 + 2.6, ["epoch", *sorted(EVAL)]),
                                             (2, T0 + 2.7, ["test_acc"]), (3, T0 + 10.0, ["train/loss"])]


def test_row_readers_keep_rows(tmp_path):
    # JSONL (the plain-dict form), a W&B CSV history export, trainer_state.json: one record per row
    (tmp_path / "plain.jsonl").write_text(
        json.dumps({"step": 2, "_timestamp": T0, **TRAIN}) + "\n"
        + json.dumps({"step": 2, "_timestamp": T0 + EVAL_DELAY, **EVAL}) + "\n")
    (reader,) = open_source(f"jsonl:{tmp_path / 'plain.jsonl'}").runs()
    assert _rows(list(reader.records())) == [(2, T0, sorted(TRAIN)), (2, T0 + EVAL_DELAY, sorted(EVAL))]

    (tmp_path / "history.csv").write_text(
        "_step,_timestamp,train/global_step,train/loss,eval/loss\n"
        f"0,{T0},2,0.5,\n"
        f"1,{T0 + EVAL_DELAY},2,,0.75\n")
    (reader,) = open_source(f"csv:{tmp_path / 'history.csv'}").runs()
    assert _rows(list(reader.records())) == [(2, T0, ["train/loss"]), (2, T0 + EVAL_DELAY, ["eval/loss"])]

    (tmp_path / "trainer_state.json").write_text(json.dumps({"global_step": 2, "log_history": [
        {"loss": 0.5, "learning_rate": 1e-05, "step": 2}, {"eval_loss": 0.75, "eval_runtime": 1.5, "step": 2}]}))
    (reader,) = open_source(f"trainer-state:{tmp_path / 'trainer_state.json'}").runs()
    assert _rows(list(reader.records())) == [(2, None, ["learning_rate", "loss"]),
                                             (2, None, ["eval_loss", "eval_runtime"])]


def test_mlflow_run_without_time_axis_keeps_its_rows(env):
    # trainer_state.json holds no wall times: MLflow gets one made-up timestamp per record (1 ms apart), and the
    # reader keeps those rows apart even when they are of one step and split
    state = env / "trainer_state.json"
    state.write_text(json.dumps({"global_step": 2, "log_history": [
        {"loss": 0.5, "learning_rate": 1e-05, "step": 2}, {"eval_loss": 0.75, "step": 2},
        {"train_runtime": 12.5, "train_loss": 0.6, "step": 2}]}))
    ml = location("mlflow", env / "mlflow")
    hop(f"trainer-state:{state}", ml)
    (reader,) = open_source(ml).runs()
    assert not reader.has_wall_time
    assert [(r.step, r.wall_time, sorted(r.metrics)) for r in reader.records()] == [
        (2, None, ["learning_rate", "loss"]), (2, None, ["eval_loss"]), (2, None, ["train_loss", "train_runtime"])]


def test_mlflow_reader_keeps_a_rewritten_point_once(env):
    # text points live in one artifact per written batch: writing a batch again (a replay) repeats them there
    from trackbridge.trackers import make_sink

    loc = location("mlflow", env / "mlflow")
    recs = [Record(2, T0, {**TRAIN, "sample": "a"}), Record(2, T0 + EVAL_DELAY, {**EVAL, "eval/sample": "b"})]
    sink = make_sink(loc)
    sink.open(RunInfo(name="r", run_id="r1"))
    sink.write(recs)
    sink.write(recs[1:])
    sink.close()
    (reader,) = open_source(loc).runs()
    assert _rows(list(reader.records())) == [(2, T0, sorted([*TRAIN, "sample"])),
                                             (2, T0 + EVAL_DELAY, sorted([*EVAL, "eval/sample"]))]
