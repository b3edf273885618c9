"""RLOO, PPOv2 and GRPO told apart (issue 11, item 3).

RLOO v0.9.3-v0.21.0 logs exactly PPOv2's names, and RLOO from v0.22.0 exactly GRPO's: the keys cannot tell them
apart, the run config can (RLOOConfig's rloo_k / normalize_advantages / reward_clip_range, PPOv2Config's vf_coef,
GRPOConfig's scale_rewards ...). With the config, detection names the trainer; without it, it assumes the first
declared trainer *and says so*, naming the keys whose meaning the guess decides (RLOO's loss/value_avg is always 0).

The key sets and config fields are in tests/data/frameworks/trl-rl-detection-sets.json: TRL 0.9.3 and 0.11.4 from
their source (not installed), TRL 1.16.0 from real runs; the integration test at the end runs real TRL 1.16.0 again
and checks the same on the rows it logs. Every check is also made leave-one-out: each key left out in turn.
"""
from __future__ import annotations

import json

import pytest

from trackbridge.detect import detect
from trackbridge.pipeline import Translator
from trackbridge.schema.loader import load_registry
from trackbridge.schema.spec import parse_spec

from _support import DATA
from _support.unproven import agrees

SETS_FILE = DATA / "frameworks" / "trl-rl-detection-sets.json"
SETS = json.loads(SETS_FILE.read_text())["sets"]
# every set, and which trainers the keys alone cannot tell it from
AMBIGUOUS = {"rloo@v0.9.3": "ppo", "ppo@v0.9.3": "rloo", "rloo@v0.11.4": "ppo", "ppo@v0.11.4": "rloo",
             "rloo@v1.16.0": "grpo", "grpo_beta@v1.16.0": "rloo"}


@pytest.fixture(scope="module")
def reg():
    return load_registry()


def _config(s):
    return {f: None for f in s["config_fields"]} | {"learning_rate": 1e-6, "gradient_accumulation_steps": 1}


def _check(reg, keys, s, config, within=None):
    det = detect(keys, reg, within=parse_spec(within, reg) if within else None, config=config)
    assert det.spec is not None, det.reason
    return det


@pytest.mark.parametrize("name", sorted(SETS))
@pytest.mark.parametrize("within", [None, "trl"])
def test_with_the_run_config_the_trainer_is_named(reg, name, within):
    s = SETS[name]
    det = _check(reg, s["keys"], s, _config(s), within)
    assert det.spec.trainer == s["trainer"], det.source
    assert "assuming" not in det.reason, det.reason
    rel = reg.frameworks["trl"].release_index(s["release"])
    assert det.spec.lo <= rel <= det.spec.hi, (det.source, s["release"])


@pytest.mark.parametrize("name", sorted(SETS))
def test_with_the_run_config_the_release_given(reg, name):
    s = SETS[name]
    det = _check(reg, s["keys"], s, _config(s), f"trl@{s['release'].lstrip('v')}")
    assert det.spec.trainer == s["trainer"], det.source


@pytest.mark.parametrize("name", sorted(AMBIGUOUS))
@pytest.mark.parametrize("within", [None, "trl"])
def test_without_the_config_a_note_says_what_was_assumed(reg, name, within):
    s = SETS[name]
    det = _check(reg, s["keys"], s, None, within)
    other = AMBIGUOUS[name]
    assert det.spec.trainer in (s["trainer"], other), det.source
    assert "assuming" in det.reason and other in det.reason and s["trainer"] in det.reason, det.reason
    assert det.confidence < 0.95, det.confidence


def test_the_note_names_what_the_guess_decides(reg):
    det = detect(SETS["rloo@v0.11.4"]["keys"], reg)
    assert det.spec.trainer == "ppo"                                 # the first declared, assumed
    assert "loss/value_avg" in det.reason and "policy/approxkl_avg" in det.reason, det.reason
    det = detect(SETS["rloo@v1.16.0"]["keys"], reg)
    assert det.spec.trainer == "grpo" and "frac_reward_zero_std" in det.reason and "kl" in det.reason, det.reason


@pytest.mark.parametrize("name", sorted(SETS))
def test_leave_one_key_out(reg, name):
    """Each key left out in turn: with the config the trainer is still named; without it the answer is the trainer
    or an assumption that names it, never another trainer said with confidence."""
    s = SETS[name]
    for left in s["keys"]:
        keys = [k for k in s["keys"] if k != left]
        det = detect(keys, reg, config=_config(s))
        assert det.spec is not None and det.spec.trainer == s["trainer"], (left, det.source, det.reason)
        det = detect(keys, reg)
        assert det.spec is not None and (det.spec.trainer == s["trainer"] or s["trainer"] in det.reason), \
            (left, det.source, det.reason)


def test_rloo_0_9_config_copied_ppo_fields(reg):
    """RLOOConfig v0.9.3-v0.9.6 still had PPOv2Config's vf_coef, cliprange_value and lam: rloo_k decides."""
    s = SETS["rloo@v0.9.3"]
    assert {"vf_coef", "rloo_k"} <= set(s["config_fields"])
    assert detect(s["keys"], reg, config=_config(s)).spec.trainer == "rloo"


def test_rloo_0_11_translated_with_its_own_meanings(reg):
    """With the config the RLOO row is translated as RLOO: loss/value_avg (always 0, no critic) is approximate,
    and the KL/clip statistics get RLOO's sequence-level reasons, not PPO's token-level ones."""
    s = SETS["rloo@v0.11.4"]
    row = {k: 0.0 if k == "loss/value_avg" else 0.5 for k in s["keys"]}
    res = Translator("auto", "canonical", config=_config(s)).translate(row)
    assert res.source.startswith("trl/rloo@"), res.source
    assert "no critic" in res.approximate["loss/value"]
    assert "sequence" in res.approximate["kl/old_policy/k2"] and "sequence" in res.approximate["policy/clip_frac"]
    res = Translator("trl", "canonical").translate(row)               # no config: the assumption is noted
    assert any("assuming ppo" in n and "rloo" in n for n in res.notes), res.notes
    res = Translator("auto", "canonical").translate(row)              # and when the framework is detected too
    assert any("assuming ppo" in n and "rloo" in n for n in res.notes), res.notes


# ----------------------------------------------------------------------------------------- real TRL 1.16.0
@pytest.mark.integration
def test_real_trl_rloo_and_grpo_told_apart_by_their_config(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("trl")
    datasets = pytest.importorskip("datasets")
    from trl import GRPOConfig, GRPOTrainer, RLOOConfig, RLOOTrainer

    from _support.tiny_trl import build_tiny_model, log_recorder, sentences


    def length_reward(completions, **kwargs):
        return [float(len(c.split())) for c in completions]

    model = build_tiny_model(tmp_path / "model")
    ds = datasets.Dataset.from_dict({"prompt": sentences(32, 1)})
    common = dict(logging_steps=1, per_device_train_batch_size=4, report_to="none", use_cpu=True,
                  save_strategy="no", seed=0, disable_tqdm=True, dataloader_num_workers=0, max_steps=3,
                  num_generations=4, max_completion_length=8)
    reg = load_registry()
    runs = {}
    for name, cfg_cls, trainer_cls, kw in (("grpo", GRPOConfig, GRPOTrainer, {"beta": 0.04}),
                                          ("rloo", RLOOConfig, RLOOTrainer, {})):
        rec = log_recorder()
        args = cfg_cls(output_dir=str(tmp_path / name), **common, **kw)
        trainer_cls(model=model, reward_funcs=[length_reward], args=args, train_dataset=ds,
                    callbacks=[rec]).train()
        rows = [r for r in rec.logs if "train_runtime" not in r]
        runs[name] = (rows, args.to_dict())
    keys = {n: sorted(set().union(*map(set, rows))) for n, (rows, _) in runs.items()}
    assert keys["grpo"] == keys["rloo"], "the key sets differ: the config is no longer the only way to tell"
    assert keys["rloo"] == SETS["rloo@v1.16.0"]["keys"], "tests/data key set is stale: regenerate it"
    for name, (rows, config) in runs.items():
        for left in [None, *keys[name]]:                               # leave one out
            ks = [k for k in keys[name] if k != left]
            det = detect(ks, reg, config=config)
            assert det.spec.trainer == name, (left, det.source)
            det = detect(ks, reg)
            assert det.spec.trainer == name or ("assuming" in det.reason and name in det.reason), det.reason
        tr = Translator("auto", "canonical", config=config)
        for row in rows:
            res = tr.translate(row)
            assert res.source.startswith(f"trl/{name}@"), res.source
        if name == "rloo":      # beta 0.05 (default): the KL-penalised zero-std fraction is approximate
            assert "KL" in res.approximate["reward/group_zero_std_frac"]
            exact = Translator("auto", "canonical", config={**config, "beta": 0.0}).translate(rows[0])
            assert agrees(exact.approximate.get("reward/group_zero_std_frac")), exact.approximate
