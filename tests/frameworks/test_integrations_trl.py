"""Real TRL trainers (TRL 1.16.0, transformers 5.23.0, torch CPU) for a few steps through ``TrackBridgeCallback``:
every key that reached ``on_log`` reaches every configured sink under its canonical name, and nothing is unmapped.

No Hub: a tiny randomly initialised Llama built from a config, a WordLevel tokenizer trained in code on generated
strings, datasets from ``Dataset.from_dict``; the model is saved to a temporary folder and passed by path (GRPO's
KL term and DPO's reference model load it from there). Marked ``integration`` (``--skip-integration`` or
``TRACKBRIDGE_SKIP_INTEGRATION=1`` skips them).
"""
import json
import sqlite3

import pytest

pytestmark = pytest.mark.integration

# wandb offline, hubs offline, scratch cache dirs: tests/conftest.py (pytest_configure), set before any
# test module imports a tracker

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
trl = pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")

import trackbridge  # noqa: E402
from trackbridge.integrations.transformers import TrackBridgeCallback, source_for  # noqa: E402
from trackbridge.pipeline import Translator  # noqa: E402
from trackbridge.sync.replay import iter_spool  # noqa: E402
from trackbridge.trackers import open_source  # noqa: E402

from _support.tiny_trl import WORDS, build_tiny_model, log_recorder  # noqa: E402

TRL_VERSION = "1.16.0"


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    """A 2-layer Llama (hidden 32) and a WordLevel tokenizer built in code, saved to a folder; returns its path."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny-llama"))


def _sentences(n, seed):
    import random
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 5))) for _ in range(n)]


def _common_args(tmp_path):
    return dict(output_dir=str(tmp_path / "out"), max_steps=3, logging_steps=1, per_device_train_batch_size=2,
                report_to="none", use_cpu=True, save_strategy="no", seed=0, learning_rate=1e-3,
                disable_tqdm=True, dataloader_num_workers=0)


def _sinks(tmp_path):
    return [f"tensorboard:{tmp_path}/tb", f"mlflow:sqlite:///{tmp_path}/mlflow.db?experiment=trl",
            f"wandb:{tmp_path}/wb", f"trackio:{tmp_path}/trackio?project=trl", f"jsonl:{tmp_path}/copy"]


def _read(spec):
    runs = list(open_source(spec).runs())
    assert len(runs) == 1, f"{spec}: {len(runs)} runs"
    return list(runs[0].records())


def _check(tmp_path, callback, recorder, trainer_id):
    """Every on_log key: translated with nothing unmapped, and present with its value at its step in every sink."""
    assert callback.source == f"trl/{trainer_id}@{TRL_VERSION}", callback.source
    st = callback.run.status
    assert st["finished"] and all(s["state"] == "closed" for s in st["sinks"]), callback.run.summary()
    assert recorder.stepped, "nothing reached on_log"
    tr = Translator(f"trl/{trainer_id}@{TRL_VERSION}")
    expected: list[tuple[int, dict]] = []
    unmapped: dict[str, None] = {}
    for step, logs in recorder.stepped:
        res = tr.translate(logs)
        for k in res.unmapped:
            unmapped[k] = None
        expected.append((step, res.metrics))
    assert list(unmapped) == [], (f"keys {trainer_id} logs that mappings/trl.yaml does not map (a mapping gap, "
                                  f"trl/trainer/{trainer_id}_trainer.py@v{TRL_VERSION}): {list(unmapped)}")
    # the spool: the same records, in order, at state.global_step, with exactly the translated names
    spool = [r for _s, r in iter_spool(callback.run.spool_path)]
    assert [r.step for r in spool] == [s for s, _m in expected]
    for rec, (_step, metrics) in zip(spool, expected):
        own = {k: v for k, v in rec.metrics.items() if k not in rec.derived}
        assert set(own) == set(metrics), (set(own) ^ set(metrics))
        for k, v in metrics.items():
            if isinstance(v, float) and v == v:
                assert own[k] == pytest.approx(v, rel=1e-9, abs=1e-12), k
    # every sink, read back: every (step, canonical name) of every record, with its value
    want: dict[str, dict[int, float]] = {}
    for step, metrics in expected:
        for k, v in metrics.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v:
                want.setdefault(k, {})[step] = float(v)   # the last record of a step wins, as in the readers
    specs = [f"tensorboard:{tmp_path}/tb", f"mlflow:sqlite:///{tmp_path}/mlflow.db?experiment=trl",
             f"wandb:{tmp_path}/wb", f"jsonl:{tmp_path}/copy"]
    for spec in specs:
        recs = _read(spec)
        got: dict[str, dict[int, float]] = {}
        for r in recs:
            for k, v in r.metrics.items():
                if isinstance(v, (int, float)):
                    got.setdefault(k, {})[r.step] = float(v)
        missing = sorted(set(want) - set(got))
        assert not missing, (spec, missing)
        for k, points in want.items():
            assert got[k] == pytest.approx(points, rel=1e-5, abs=1e-6), (spec, k)
    # trackio: its own SQLite store holds every canonical name
    (tdb,) = list((tmp_path / "trackio").glob("*.db"))
    with sqlite3.connect(tdb) as con:
        rows = con.execute("SELECT step, metrics FROM metrics").fetchall()
    names = set().union(*(json.loads(m) for _s, m in rows))
    assert set(want) <= names, sorted(set(want) - names)
    return expected


def _callback(tmp_path, run_id):
    return TrackBridgeCallback(project="trl", name=run_id, sinks=_sinks(tmp_path), spool=str(tmp_path / "spool"),
                               run_id=run_id)


def test_grpo_two_named_rewards_with_kl(tmp_path, tiny_model):
    from trl import GRPOConfig, GRPOTrainer

    def format_reward(completions, **kwargs):
        return [1.0 if "answer" in c else 0.0 for c in completions]

    def length_reward(completions, **kwargs):
        return [-len(c.split()) / 10 for c in completions]

    prompts = _sentences(16, 1)
    ds = datasets.Dataset.from_dict({"prompt": prompts})
    args = GRPOConfig(**_common_args(tmp_path), num_generations=2, max_completion_length=8, beta=0.1,
                      temperature=1.0)
    cb, rec = _callback(tmp_path, "grpo"), log_recorder()
    trainer = GRPOTrainer(model=tiny_model, reward_funcs=[format_reward, length_reward], args=args,
                          train_dataset=ds, callbacks=[rec, cb])
    trainer.train()
    expected = _check(tmp_path, cb, rec, "grpo")
    keys = set().union(*(logs for _s, logs in rec.stepped))
    assert {"kl", "rewards/format_reward/mean", "rewards/length_reward/mean", "train_runtime"} <= keys, keys
    names = set().union(*(m for _s, m in expected))
    assert "kl/ref/k3" in names and any("format_reward" in n for n in names), names
    cfg = cb.run.info.config
    assert cfg["beta"] == 0.1 and cfg.get("kl_coef") == 0.1 and cfg.get("num_generations") == 2
    assert cfg["model_config"]["hidden_size"] == 32


def test_dpo(tmp_path, tiny_model):
    from trl import DPOConfig, DPOTrainer

    n = 12
    ds = datasets.Dataset.from_dict({"prompt": _sentences(n, 2), "chosen": _sentences(n, 3),
                                     "rejected": _sentences(n, 4)})
    args = DPOConfig(**_common_args(tmp_path), max_length=16, beta=0.1, eval_strategy="steps", eval_steps=2,
                     per_device_eval_batch_size=2)
    cb, rec = _callback(tmp_path, "dpo"), log_recorder()
    trainer = DPOTrainer(model=tiny_model, args=args, train_dataset=ds, eval_dataset=ds.select(range(4)),
                         callbacks=[rec, cb])
    trainer.train()
    expected = _check(tmp_path, cb, rec, "dpo")
    names = set().union(*(m for _s, m in expected))
    assert any(n.startswith("eval/") for n in names), names          # eval_ records in the eval split
    assert cb.run.info.config.get("dpo_beta") == 0.1


def test_sft_and_evaluate_after_training(tmp_path, tiny_model):
    from trl import SFTConfig, SFTTrainer

    ds = datasets.Dataset.from_dict({"text": _sentences(16, 5)})
    # beside report_to: transformers' own TensorBoard callback keeps writing its train/... tags
    args = SFTConfig(**{**_common_args(tmp_path), "report_to": ["tensorboard"]}, max_length=16,
                     per_device_eval_batch_size=2)
    cb, rec = _callback(tmp_path, "sft"), log_recorder()
    trainer = SFTTrainer(model=tiny_model, args=args, train_dataset=ds, eval_dataset=ds.select(range(4)),
                         callbacks=[rec, cb])
    trainer.train()
    trainer.evaluate()                     # after on_train_end: the same run continues (resume)
    cb.finish()
    expected = _check(tmp_path, cb, rec, "sft")
    assert "train/runtime" in expected[-2][1] and "eval/loss/total" in expected[-1][1]
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    folder = next(p for p in (tmp_path / "out").rglob("*tfevents*")).parent
    ea = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    ea.Reload()
    hf = {e.step: e.value for e in ea.Scalars("train/loss")}
    ours = {s: m["loss/total"] for s, m in expected if "loss/total" in m}
    assert hf == pytest.approx(ours, rel=1e-6)


def test_plain_transformers_trainer(tmp_path, tiny_model):
    """The plain transformers.Trainer: source trl@<release>, HF keys translated, nothing unmapped."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, Trainer, TrainingArguments

    tok = AutoTokenizer.from_pretrained(tiny_model)
    enc = [tok(t)["input_ids"][:16] for t in _sentences(8, 6)]
    width = max(map(len, enc))
    ids = [e + [tok.pad_token_id] * (width - len(e)) for e in enc]
    ds = datasets.Dataset.from_dict({"input_ids": ids, "labels": [[t if t != tok.pad_token_id else -100 for t in e]
                                                                 for e in ids]})
    args = TrainingArguments(**{**_common_args(tmp_path), "max_steps": 2})
    cb, rec = _callback(tmp_path, "plain"), log_recorder()
    trainer = Trainer(model=AutoModelForCausalLM.from_pretrained(tiny_model), args=args, train_dataset=ds,
                      callbacks=[rec, cb])
    trainer.train()
    assert cb.source == f"trl@{TRL_VERSION}" and cb.trainer_class == "Trainer"
    spool = [r for _s, r in iter_spool(cb.run.spool_path)]
    assert [r.step for r in spool] == [s for s, _l in rec.stepped] == [1, 2, 2]
    for (_s, logs), r in zip(rec.stepped, spool):
        res = Translator(f"trl@{TRL_VERSION}").translate(logs)
        assert res.unmapped == [] and set(res.metrics) <= set(r.metrics)
    assert "loss/total" in spool[0].metrics and "train/runtime" in spool[-1].metrics


def test_plain_trainer_source_and_detection():
    """The source of the plain transformers.Trainer and of subclasses (Unsloth-style) without running them."""
    from transformers import Trainer, TrainingArguments
    from trl import GRPOConfig, GRPOTrainer, SFTTrainer

    class UnslothGRPOTrainer(GRPOTrainer):
        pass

    assert source_for(Trainer, TrainingArguments, "1.16.0") == "trl@1.16.0"
    assert source_for(UnslothGRPOTrainer, GRPOConfig, "1.16.0") == "trl/grpo@1.16.0"
    assert source_for(SFTTrainer, None, "1.16.0") == "trl/sft@1.16.0"
    assert source_for(None, GRPOConfig, "1.16.0") == "trl/grpo@1.16.0"
    assert source_for(Trainer, TrainingArguments, "") == "trl"
    assert trackbridge.translate({"train_runtime": 1.0, "eval_loss": 0.5}, source="trl@1.16.0").unmapped == []


def test_callback_writes_on_world_process_zero_only(tmp_path):
    from transformers import TrainerControl, TrainerState, TrainingArguments

    args = TrainingArguments(output_dir=str(tmp_path / "out"), report_to="none", use_cpu=True)
    other = TrainerState(is_world_process_zero=False, global_step=3)
    cb = TrackBridgeCallback(source="trl/sft@1.16.0", spool=str(tmp_path / "spool"), run_id="rank1")
    cb.on_train_begin(args, other, TrainerControl())
    cb.on_log(args, other, TrainerControl(), logs={"loss": 1.0})
    cb.on_train_end(args, other, TrainerControl())
    assert cb.run is None and not (tmp_path / "spool").exists()
    zero = TrainerState(is_world_process_zero=True, global_step=3)
    cb = TrackBridgeCallback(source="trl/sft@1.16.0", spool=str(tmp_path / "spool"), run_id="rank0")
    cb.on_log(args, zero, TrainerControl(), logs={"loss": 1.0, "eval_loss": 2.0})   # evaluate() without train()
    cb.on_train_end(args, zero, TrainerControl())
    (rec,) = [r for _s, r in iter_spool(cb.run.spool_path)]
    assert rec.step == 3 and rec.metrics == {"loss/total": 1.0, "eval/loss/total": 2.0}
