"""Derived metrics checked against what real TRL logs: run TRL 1.16.0 for a few steps on a tiny local model, hide a
value TRL really logged, derive it back from the rest, and compare (issue 4).

* DPO logs ``rewards/margins`` beside ``rewards/chosen`` and ``rewards/rejected`` (train and eval rows).
* GRPO logs ``clip_ratio/region_mean`` beside ``clip_ratio/low_mean`` and ``clip_ratio/high_mean``; several
  optimisation passes per generation batch (``num_iterations``) and a tiny clip range make the ratios non-zero.
"""
from __future__ import annotations

import math

import pytest

pytestmark = pytest.mark.integration

# wandb offline, hubs offline, scratch cache dirs: tests/conftest.py (pytest_configure), set before any
# test module imports a tracker
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")

from trackbridge.derive import make_deriver  # noqa: E402
from trackbridge.pipeline import Translator  # noqa: E402
from trackbridge.schema.loader import load_registry  # noqa: E402

from _support.tiny_trl import build_tiny_model, log_recorder, sentences  # noqa: E402


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny-llama-derive"))


def _args(tmp_path, **kw):
    return dict(output_dir=str(tmp_path / "out"), logging_steps=1, per_device_train_batch_size=4, report_to="none",
                use_cpu=True, save_strategy="no", seed=0, disable_tqdm=True, dataloader_num_workers=0, **kw)


def _hide_and_derive(rows, spec, hidden_key, canonical):
    """Translate each logged row, drop the canonical value of ``hidden_key``, derive, and return pairs (logged,
    derived)."""
    reg = load_registry()
    pairs = []
    for row in rows:
        if hidden_key not in row:
            continue
        tr = Translator(spec, "canonical", registry=reg)
        res = tr.translate(row)
        assert not res.unmapped, res.unmapped
        split = "eval/" if hidden_key.startswith("eval_") else ""
        name = split + canonical
        logged = res.metrics.pop(name)
        deriver = make_deriver(reg, config=tr.translate_config(), source=spec)
        derived = deriver.apply(res.metrics, step=None, wall_time=None)
        assert name in derived, (name, deriver.notes)
        pairs.append((logged, res.metrics[name]))
    return pairs


def test_dpo_reward_margin_derived_back(tmp_path, tiny_model):
    from trl import DPOConfig, DPOTrainer

    n = 16
    ds = datasets.Dataset.from_dict({"prompt": sentences(n, 2), "chosen": sentences(n, 3),
                                     "rejected": sentences(n, 4)})
    rec = log_recorder()
    trainer = DPOTrainer(model=tiny_model, args=DPOConfig(**_args(tmp_path, max_steps=4, learning_rate=5e-3),
                                                           max_length=16, beta=0.1, eval_strategy="steps",
                                                           eval_steps=2, per_device_eval_batch_size=4),
                         train_dataset=ds, eval_dataset=ds.select(range(8)), callbacks=[rec])
    trainer.train()
    for key, canon in (("rewards/margins", "preference/reward/margin"),
                       ("eval_rewards/margins", "preference/reward/margin")):
        pairs = _hide_and_derive(rec.logs, "trl/dpo@1.16.0", key, canon)
        assert len(pairs) >= 2, (key, rec.logs)
        assert any(abs(logged) > 1e-6 for logged, _ in pairs), "margins are all zero: the check would be weak"
        for logged, derived in pairs:
            assert math.isclose(derived, logged, rel_tol=1e-4, abs_tol=1e-6), (key, logged, derived)


def test_grpo_clip_region_derived_back(tmp_path, tiny_model):
    from trl import GRPOConfig, GRPOTrainer

    def length_reward(completions, **kwargs):
        return [float(len(c.split())) for c in completions]

    ds = datasets.Dataset.from_dict({"prompt": sentences(32, 1)})
    args = GRPOConfig(**_args(tmp_path, max_steps=6, learning_rate=5e-2), num_generations=4,
                      max_completion_length=8, beta=0.0, num_iterations=3, epsilon=1e-4, epsilon_high=1e-4,
                      temperature=1.0)
    rec = log_recorder()
    GRPOTrainer(model=tiny_model, reward_funcs=[length_reward], args=args, train_dataset=ds,
                callbacks=[rec]).train()
    pairs = _hide_and_derive(rec.logs, "trl/grpo@1.16.0", "clip_ratio/region_mean", "policy/clip_frac")
    assert len(pairs) >= 3
    assert any(logged > 0 for logged, _ in pairs), f"no clipping happened: {[p[0] for p in pairs]}"
    for logged, derived in pairs:
        assert math.isclose(derived, logged, rel_tol=1e-5, abs_tol=1e-7), (logged, derived)
