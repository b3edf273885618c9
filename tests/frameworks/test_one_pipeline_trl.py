"""The one-pipeline check of tests/trackers/test_one_pipeline.py on real TRL runs: a GRPO and a DPO run of a tiny model
built in code (tests/_support/tiny_trl.py), their logged dicts (as TRL hands them to callbacks) written as plain JSON
lines, then sent through translate (API and CLI), init(names=X) + replay, migrate and compare: identical everywhere."""
from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.integration

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
trl = pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")

from _support import load_test_module  # noqa: E402
from _support.tiny_trl import build_tiny_model, log_recorder, sentences  # noqa: E402

_one = load_test_module("trackers/test_one_pipeline.py")      # the checks of the one-pipeline test, on these runs
_raw_records, check_cli, check_compare = _one._raw_records, _one.check_cli, _one.check_compare
check_logger_replay_migrate, reference_for = _one.check_logger_replay_migrate, _one.reference_for

TARGETS = ["canonical", "trl@1.16.0", "trl@0.20.0", "verl", "openrlhf"]




def _args(tmp_path):
    return dict(output_dir=str(tmp_path / "out"), max_steps=3, logging_steps=1, per_device_train_batch_size=2,
                report_to="none", use_cpu=True, save_strategy="no", seed=0, learning_rate=1e-3, disable_tqdm=True,
                dataloader_num_workers=0)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{name: (plain JSON-lines file of the logged dicts, source with the trainer left out)}"""
    from trl import DPOConfig, DPOTrainer, GRPOConfig, GRPOTrainer
    base = tmp_path_factory.mktemp("trl-runs")
    model = build_tiny_model(base / "tiny")
    out = {}

    def reward_len(completions, **kwargs):
        return [-len(c.split()) / 10 for c in completions]

    rec = log_recorder()
    GRPOTrainer(model=model, reward_funcs=[reward_len],
                args=GRPOConfig(**_args(base / "g"), num_generations=2, max_completion_length=8, beta=0.1),
                train_dataset=datasets.Dataset.from_dict({"prompt": sentences(8, 1)}), callbacks=[rec]).train()
    out["grpo"] = rec.stepped
    n = 8
    ds = datasets.Dataset.from_dict({"prompt": sentences(n, 2), "chosen": sentences(n, 3),
                                     "rejected": sentences(n, 4)})
    rec = log_recorder()
    DPOTrainer(model=model, args=DPOConfig(**_args(base / "d"), max_length=16, beta=0.1, eval_strategy="steps",
                                           eval_steps=2, per_device_eval_batch_size=2),
               train_dataset=ds, eval_dataset=ds.select(range(4)), callbacks=[rec]).train()
    out["dpo"] = rec.stepped
    files = {}
    for name, logs in out.items():
        f = base / f"{name}.jsonl"
        f.write_text("".join(json.dumps({"step": s, **d}) + "\n" for s, d in logs))
        files[name] = (f"jsonl:{f}", f"trl@{trl.__version__}")
    return files


@pytest.mark.parametrize("name", ["grpo", "dpo"])
@pytest.mark.parametrize("target", TARGETS)
def test_real_trl_runs_agree_on_every_path(tmp_path, runs, name, target):
    loc, source = runs[name]
    raw = _raw_records(loc)
    assert raw
    ref = reference_for(raw, source, target)
    assert ref[3].startswith(f"trl/{name}@"), ref[3]          # the trainer was told from the keys
    check_cli(tmp_path, loc.split(":", 1)[1], source, target, ref)
    check_logger_replay_migrate(tmp_path, loc, source, target, raw, ref)
    if target == "canonical":
        check_compare(name, loc, source, ref)
