"""trackbridge by name: ``report_to="trackbridge"`` (transformers ``Trainer``, TRL trainers, TRL's command line) and
``Accelerator(log_with="trackbridge")``, once ``trackbridge.integrations.transformers`` /
``trackbridge.integrations.accelerate`` is imported, configured by ``TRACKBRIDGE_*`` environment variables.

Real libraries on CPU (a tiny Llama built in code, ``tests/_support/tiny_trl.py``); every tracker is read back with
its own tools (``tests/_support/readback.py``: TensorBoard's ``EventFileLoader``, ``MlflowClient``, the spool's JSON
lines): every logged point once, at its step, with its value, and the run's outcome. Marked ``integration``.
"""
from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
accelerate = pytest.importorskip("accelerate")
datasets = pytest.importorskip("datasets")

from trackbridge.integrations.accelerate import (  # noqa: E402
    TrackBridgeTracker,
    options_from_env,
    parse_sinks,
)
from trackbridge.integrations.transformers import TrackBridgeCallback  # noqa: E402
from trackbridge.pipeline import Translator  # noqa: E402

from _support import ROOT, readback  # noqa: E402
from _support.tiny_trl import build_tiny_model, log_recorder, sentences  # noqa: E402

TRL_VERSION = "1.16.0"
ENV_VARS = ("TRACKBRIDGE_SINKS", "TRACKBRIDGE_SPOOL", "TRACKBRIDGE_SOURCE", "TRACKBRIDGE_NAMES",
            "TRACKBRIDGE_PROJECT", "TRACKBRIDGE_NAME", "TRACKBRIDGE_RUN_ID")


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for var in ENV_VARS:
        monkeypatch.delenv(var, raising=False)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny-llama"))


def _env(monkeypatch, tmp_path, run_id, **more):
    """TRACKBRIDGE_* for a run writing TensorBoard and MLflow (SQLite) beside the spool; returns the MLflow URI."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    env = {"TRACKBRIDGE_SINKS": f"tensorboard:{tmp_path}/tb,mlflow:{uri}", "TRACKBRIDGE_SPOOL": str(tmp_path / "spool"),
           "TRACKBRIDGE_RUN_ID": run_id, **more}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return uri


# -- reading back -------------------------------------------------------------------------------------------------
def _spool_lines(path):
    lines = [json.loads(raw) for raw in Path(path).read_text().splitlines() if raw.strip()]
    header = [d for d in lines if d.get("type") == "run"]
    assert len(header) == 1, f"{path}: {len(header)} run lines"
    return header[0], [d for d in lines if d.get("type") != "run"]


def _expected(source, stepped):
    """{canonical name: Counter(step)} of what the trainer logged (``(global_step, logs)`` pairs), translated."""
    tr = Translator(source)
    out: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for step, logs in stepped:
        res = tr.translate(logs)
        assert res.unmapped == [], res.unmapped
        for k in res.metrics:
            out[k][step] += 1
    return dict(out)


def _check_trackers(spool_path, tmp_path, uri, run_id, expected, *, status="FINISHED", copy=None):
    """The spool holds exactly ``expected`` (plus derived values, marked); TensorBoard holds exactly the spool's
    numeric points; MLflow every point at its step with its value, none more often than the spool, and the outcome
    (the run's MLflow status)."""
    header, records = _spool_lines(spool_path)
    own: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    numeric: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    values: dict[str, dict[int, set]] = collections.defaultdict(lambda: collections.defaultdict(set))
    for rec in records:
        derived = set(rec.get("derived") or [])
        for k, v in rec["metrics"].items():
            if k not in derived:
                own[k][rec["step"]] += 1
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                numeric[k][rec["step"]] += 1
                values[k][rec["step"]].add(round(float(v), 5))
    assert dict(own) == expected, {k: (own.get(k), expected.get(k)) for k in set(own) | set(expected)
                                   if own.get(k) != expected.get(k)}
    tb = readback.tensorboard_points(tmp_path / "tb")
    assert {k: tb.get(k) for k in numeric} == dict(numeric), "TensorBoard lost or doubled points"
    assert set(tb) <= set(numeric), sorted(set(tb) - set(numeric))
    if copy is not None:        # a jsonl sink: the same points as the spool
        points, bad = readback.spool_points(copy)
        assert not bad and {k: points.get(k) for k in numeric} == dict(numeric), "the jsonl copy differs"
    if uri is None:
        return header, None
    client, mrun = readback.mlflow_run(uri, run_id)
    assert mrun.info.status == status
    assert set(mrun.data.metrics) == set(numeric), set(mrun.data.metrics) ^ set(numeric)
    for key, steps in numeric.items():
        hist = client.get_metric_history(mrun.info.run_id, key)
        got = collections.Counter(m.step for m in hist)
        # MLflow's store keeps one row per (key, step, timestamp, value): equal values logged in the same
        # millisecond are one row; so: every step, never more points than the spool, the same values
        assert set(got) == set(steps), (key, got, steps)
        assert all(got[s] <= steps[s] for s in got), (key, got, steps)
        got_values: dict[int, set] = collections.defaultdict(set)
        for m in hist:
            got_values[m.step].add(round(m.value, 5))
        assert dict(got_values) == dict(values[key]), key
    return header, mrun


def _callbacks(trainer):
    return [c for c in trainer.callback_handler.callbacks if isinstance(c, TrackBridgeCallback)]


# -- the environment ------------------------------------------------------------------------------------------------
def test_options_from_env_and_explicit_options_win(monkeypatch, tmp_path):
    assert parse_sinks(" tensorboard:runs/tb , mlflow:sqlite:///runs/mlflow.db,") == [
        "tensorboard:runs/tb", "mlflow:sqlite:///runs/mlflow.db"]
    assert parse_sinks('["jsonl:a,b", "tensorboard:tb"]') == ["jsonl:a,b", "tensorboard:tb"]
    with pytest.raises(ValueError, match="TRACKBRIDGE_SINKS"):
        parse_sinks("[not json")
    env = {"TRACKBRIDGE_SINKS": "tensorboard:x", "TRACKBRIDGE_SPOOL": "sp", "TRACKBRIDGE_SOURCE": "trl/grpo",
           "TRACKBRIDGE_NAMES": "trl", "TRACKBRIDGE_PROJECT": "p", "TRACKBRIDGE_NAME": "n", "TRACKBRIDGE_RUN_ID": "r",
           "TRACKBRIDGE_UNKNOWN": "ignored"}
    assert options_from_env(env) == {"sinks": ["tensorboard:x"], "spool": "sp", "source": "trl/grpo",
                                     "names": "trl", "project": "p", "name": "n", "run_id": "r"}
    assert options_from_env({"TRACKBRIDGE_SINKS": "  "}) == {}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    cb = TrackBridgeCallback()
    assert (cb.project, cb.name, cb.sinks, cb.user_source) == ("p", "n", ["tensorboard:x"], "trl/grpo")
    assert cb.init_options == {"spool": "sp", "names": "trl", "run_id": "r"}
    cb = TrackBridgeCallback(project="mine", sinks=[], spool="own")          # given in code: wins, even []
    assert (cb.project, cb.sinks, cb.init_options["spool"]) == ("mine", [], "own")
    cb = TrackBridgeCallback(env=False)
    assert (cb.project, cb.sinks, cb.user_source, cb.init_options) == (None, [], None, {})
    tracker = TrackBridgeTracker("acc", sinks=[f"jsonl:{tmp_path}/j"])
    assert tracker._tee._init_options["project"] == "acc"
    assert tracker._tee._init_options["sinks"] == [f"jsonl:{tmp_path}/j"]
    assert tracker._tee._init_options["spool"] == "sp" and tracker._tee._init_options["run_id"] == "r"


def test_import_trackbridge_registers_nothing_the_integration_modules_do(tmp_path):
    """``import trackbridge`` leaves transformers and Accelerate alone (report_to="trackbridge" still raises);
    importing the integration module registers the name."""
    code = textwrap.dedent("""
        import trackbridge, trackbridge.integrations
        from transformers.integrations import integration_utils as iu, get_reporting_integration_callbacks
        from accelerate import tracking
        assert "trackbridge" not in iu.INTEGRATION_TO_CALLBACK and "trackbridge" not in tracking.LOGGER_TYPE_TO_CLASS
        try:
            get_reporting_integration_callbacks(["trackbridge"])
        except ValueError as exc:
            assert "trackbridge is not supported" in str(exc), exc
        else:
            raise AssertionError("report_to='trackbridge' accepted before the integration was imported")
        try:
            tracking.filter_trackers(["trackbridge"])
        except ValueError as exc:
            assert "Unsupported logging capability" in str(exc), exc
        else:
            raise AssertionError("log_with='trackbridge' accepted before the integration was imported")
        import trackbridge.integrations.transformers as tt
        assert get_reporting_integration_callbacks("trackbridge") == [tt.TrackBridgeCallback]
        import trackbridge.integrations.accelerate as ta
        assert tracking.filter_trackers(["trackbridge"]) == ["trackbridge"]
        assert tracking.LOGGER_TYPE_TO_CLASS["trackbridge"] is ta.TrackBridgeTracker
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]


# -- transformers Trainer -----------------------------------------------------------------------------------------
def test_report_to_trackbridge_plain_trainer(monkeypatch, tmp_path, tiny_model):
    """``TrainingArguments(report_to="trackbridge")``: one TrackBridgeCallback, built by transformers from
    TRACKBRIDGE_*; training and eval rows and the summary row reach the spool, TensorBoard and MLflow once each."""
    uri = _env(monkeypatch, tmp_path, "hf-plain", TRACKBRIDGE_PROJECT="by-name")
    tok = transformers.AutoTokenizer.from_pretrained(tiny_model)
    ds = datasets.Dataset.from_dict({"text": sentences(16, 0)}).map(
        lambda b: tok(b["text"]), batched=True, remove_columns=["text"])
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), max_steps=4, logging_steps=1, per_device_train_batch_size=4,
        report_to="trackbridge", use_cpu=True, save_strategy="no", disable_tqdm=True, learning_rate=1e-3,
        eval_strategy="steps", eval_steps=2, per_device_eval_batch_size=4, seed=0)
    assert args.report_to == ["trackbridge"]
    rec = log_recorder()
    trainer = transformers.Trainer(
        model=transformers.AutoModelForCausalLM.from_pretrained(tiny_model), args=args, train_dataset=ds,
        eval_dataset=ds.select(range(4)), data_collator=transformers.DataCollatorForLanguageModeling(tok, mlm=False),
        callbacks=[rec])
    (cb,) = _callbacks(trainer)
    assert type(cb) is TrackBridgeCallback and cb.project == "by-name"
    trainer.train()
    assert cb.source == f"trl@{TRL_VERSION}" and cb.run.status["finished"]
    assert cb.records == len(rec.stepped) and any("eval_loss" in logs for _s, logs in rec.stepped)
    expected = _expected(cb.source, rec.stepped)
    assert expected["loss/total"] == collections.Counter({1: 1, 2: 1, 3: 1, 4: 1})
    assert expected["eval/loss/total"] == collections.Counter({2: 1, 4: 1})
    header, mrun = _check_trackers(cb.run.spool_path, tmp_path, uri, "hf-plain", expected)
    # the callback passes trl@1.16.0 (the plain Trainer is no TRL trainer); the logger may narrow it from the keys
    assert header["project"] == "by-name" and header["source"].startswith("trl") and TRL_VERSION in header["source"]
    assert header["config"]["max_steps"] == 4 and header["config"]["report_to"] == ["trackbridge"]
    client = readback.mlflow_run(uri, "hf-plain")[0]
    assert client.get_experiment(mrun.info.experiment_id).name == "by-name"


def test_report_to_trackbridge_grpo(monkeypatch, tmp_path, tiny_model):
    """A real TRL GRPOTrainer with ``report_to=["trackbridge"]``: the source is TRL's trainer, not guessed."""
    trl = pytest.importorskip("trl")
    uri = _env(monkeypatch, tmp_path, "grpo-by-name")

    def length_reward(completions, **kwargs):
        return [-len(c.split()) / 10 for c in completions]

    args = trl.GRPOConfig(output_dir=str(tmp_path / "out"), max_steps=2, logging_steps=1,
                          per_device_train_batch_size=2, report_to=["trackbridge"], use_cpu=True, save_strategy="no",
                          seed=0, learning_rate=1e-3, disable_tqdm=True, num_generations=2, max_completion_length=6,
                          beta=0.1)
    rec = log_recorder()
    trainer = trl.GRPOTrainer(model=tiny_model, reward_funcs=[length_reward], args=args,
                              train_dataset=datasets.Dataset.from_dict({"prompt": sentences(8, 1)}),
                              callbacks=[rec])
    (cb,) = _callbacks(trainer)
    trainer.train()
    assert cb.source == f"trl/grpo@{TRL_VERSION}"
    expected = _expected(cb.source, rec.stepped)
    assert expected["loss/total"] == collections.Counter({1: 1, 2: 1})
    assert any(k.startswith("reward/") for k in expected), sorted(expected)
    header, _ = _check_trackers(cb.run.spool_path, tmp_path, uri, "grpo-by-name", expected)
    assert header["source"] == f"trl/grpo@{TRL_VERSION}"


# -- TRL's command line ------------------------------------------------------------------------------------------
def test_trl_cli_route_report_to_trackbridge(tmp_path, tiny_model):
    """``python -m trackbridge.integrations.transformers trl sft ... --report_to trackbridge``: TRL's own CLI, its
    script started by ``accelerate launch`` in a child process, which registers the callback first. (TensorBoard and
    a jsonl copy here: MLflow's import and run set-up would add ~10 s to an already two-process test.)"""
    data = tmp_path / "data"
    data.mkdir()
    texts = sentences(16, 0)
    (data / "train.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    env = {**os.environ, "TRACKBRIDGE_SINKS": f"tensorboard:{tmp_path}/tb,jsonl:{tmp_path}/copy",
           "TRACKBRIDGE_SPOOL": str(tmp_path / "spool"), "TRACKBRIDGE_RUN_ID": "cli-sft",
           "TRACKBRIDGE_PROJECT": "cli"}
    cmd = [sys.executable, "-m", "trackbridge.integrations.transformers", "trl", "sft",
           "--model_name_or_path", tiny_model, "--dataset_name", str(data), "--output_dir", str(tmp_path / "out"),
           "--max_steps", "3", "--logging_steps", "1", "--per_device_train_batch_size", "2", "--max_length", "16",
           "--report_to", "trackbridge", "--use_cpu", "--save_strategy", "no", "--disable_tqdm", "true",
           "--num_processes", "1"]
    out = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, (out.stdout[-2000:], out.stderr[-4000:])
    assert "Training completed" in out.stdout
    # what TRL printed (its PrinterCallback) is what trackbridge logged: the rows, in order
    rows = [json.loads(line.replace("'", '"')) for line in out.stdout.splitlines() if line.startswith("{'")]
    assert [("loss" in r, "train_runtime" in r) for r in rows] == [(True, False)] * 3 + [(False, True)]
    header, records = _spool_lines(tmp_path / "spool" / "cli-sft.jsonl")
    assert header["source"] == f"trl/sft@{TRL_VERSION}" and header["project"] == "cli"
    assert [r["step"] for r in records] == [1, 2, 3, 3]
    for row, rec in zip(rows, records):        # the printed values are rounded to 4 significant digits
        if "loss" in row:
            assert rec["metrics"]["loss/total"] == pytest.approx(float(row["loss"]), rel=2e-3)
    stepped = [(r["step"], {k: v for k, v in r["metrics"].items() if k not in set(r.get("derived") or [])})
               for r in records]
    expected = {k: collections.Counter(s for s, m in stepped if k in m) for k in {k for _s, m in stepped for k in m}}
    _check_trackers(tmp_path / "spool" / "cli-sft.jsonl", tmp_path, None, "cli-sft", expected,
                    copy=tmp_path / "copy" / "cli-sft.jsonl")


def test_module_runs_a_script_with_the_name_registered(tmp_path, capsys):
    """``python -m trackbridge.integrations.transformers train.py ARGS``: the user's script runs as ``__main__``
    with its arguments, ``report_to="trackbridge"`` known; no arguments print the usage."""
    from trackbridge.integrations.transformers import main
    assert main([]) == 2 and "trl COMMAND" in capsys.readouterr().out
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import sys
        from transformers.integrations import get_reporting_integration_callbacks
        (cb,) = get_reporting_integration_callbacks(["trackbridge"])
        assert cb.__module__ == "trackbridge.integrations.transformers", cb.__module__
        assert __name__ == "__main__" and sys.argv[1:] == ["--lr", "0.1"], (__name__, sys.argv)
        print("script ran", cb.__name__)
    """))
    out = subprocess.run([sys.executable, "-m", "trackbridge.integrations.transformers", str(script), "--lr", "0.1"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "script ran TrackBridgeCallback" in out.stdout, out.stderr[-3000:]


# -- Accelerate ---------------------------------------------------------------------------------------------------
def _ppo_stats(i):
    return {"ppo/loss/total": 1.0 / (i + 1), "ppo/mean_scores": i / 3, "objective/kl": 0.1 * i}


def test_accelerator_log_with_trackbridge(monkeypatch, tmp_path):
    """``Accelerator(log_with="trackbridge")`` + ``init_trackers(project, config)``: the tracker is built by
    Accelerate from its registry, with the project of init_trackers and the sinks of TRACKBRIDGE_SINKS."""
    uri = _env(monkeypatch, tmp_path, "acc-by-name", TRACKBRIDGE_SOURCE="trl-legacy")
    acc = accelerate.Accelerator(cpu=True, log_with="trackbridge")
    acc.init_trackers("legacy-ppo", config={"init_kl_coef": 0.2, "batch_size": 8})
    tracker = acc.get_tracker("trackbridge", unwrap=False)
    assert isinstance(tracker, TrackBridgeTracker)
    assert [t.name for t in acc.trackers] == ["trackbridge"]
    n = 6
    for i in range(n):
        acc.log(_ppo_stats(i), step=i)
    run = tracker.tracker
    acc.end_training()
    assert run.status["finished"]
    assert run.info.config["init_kl_coef"] == 0.2 and run.info.config.get("kl_coef") == 0.2
    tr = Translator("trl-legacy")
    expected: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for i in range(n):
        for k in tr.translate(_ppo_stats(i)).metrics:
            expected[k][i] += 1
    header, mrun = _check_trackers(run.spool_path, tmp_path, uri, "acc-by-name", dict(expected))
    assert header["project"] == "legacy-ppo" and header["source"].startswith("trl/ppo_legacy")
    client = readback.mlflow_run(uri, "acc-by-name")[0]
    assert client.get_experiment(mrun.info.experiment_id).name == "legacy-ppo"
    assert mrun.data.params.get("init_kl_coef") == "0.2"


def test_accelerator_init_kwargs_win_over_env(monkeypatch, tmp_path):
    """``init_trackers(..., init_kwargs={"trackbridge": {...}})`` passes options in code; they win over the env."""
    monkeypatch.setenv("TRACKBRIDGE_SINKS", f"tensorboard:{tmp_path}/env-tb")
    monkeypatch.setenv("TRACKBRIDGE_SPOOL", str(tmp_path / "spool"))
    acc = accelerate.Accelerator(cpu=True, log_with=["trackbridge"])
    acc.init_trackers("p", init_kwargs={"trackbridge": {"sinks": [f"jsonl:{tmp_path}/code"], "run_id": "kw"}})
    for i in range(3):
        acc.log({"loss": float(i)}, step=i)
    run = acc.get_tracker("trackbridge", unwrap=False).tracker
    acc.end_training()
    assert not (tmp_path / "env-tb").exists()
    points, bad = readback.spool_points(tmp_path / "code" / "kw.jsonl")
    assert not bad and points["loss/total"] == collections.Counter({0: 1, 1: 1, 2: 1})
    assert Path(run.spool_path) == tmp_path / "spool" / "kw.jsonl"
