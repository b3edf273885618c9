"""The translation engine on small synthetic mappings: hub and spoke, splits, templates, transforms, detection."""
from __future__ import annotations

import math
import textwrap

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trackbridge.detect import detect
from trackbridge.pipeline import Translator
from trackbridge.schema.loader import build_registry
from trackbridge.schema.spec import SpecError

CANON = textwrap.dedent("""\
    format: trackbridge.canonical/1
    schema_version: 1.0.0
    versions: {1.0.0: {}}
    config:
      kl_coef: {description: beta, unit: "1"}
    metrics:
      policy/entropy: {description: entropy, unit: nats/token}
      kl/ref: {description: kl to ref, unit: nats/token}
      kl/ref_seq_sum: {description: kl summed, unit: nats/sequence}
      time/{stage}: {description: seconds per stage, unit: s}
      val/{data_source:path}/{var}/mean@{n}: {description: val, unit: "1"}
      loss/total: {description: loss, unit: "1"}
    """)

ALPHA = textwrap.dedent("""\
    format: trackbridge.mapping/1
    framework: alpha
    releases: [v0.1, v0.2, v0.3, v1.0]
    trainers: {grpo: {}, ppo: {}}
    aliases: {alpha-old: {trainer: ppo, until: v0.2}}
    prefixes: [{prefix: "train/", split: train}, {prefix: "eval_", split: eval}]
    config: [{key: beta, canonical: kl_coef, source: a.py@v1.0}]
    entries:
      - {key: entropy, canonical: policy/entropy, source: a.py@v1.0}
      - {key: kl, canonical: kl/ref, trainers: [grpo], source: a.py@v1.0}
      - {key: kl, canonical: kl/ref_seq_sum, trainers: [ppo], source: a.py@v1.0}
      - {key: old_kl, canonical: kl/ref, trainers: [grpo], until: v0.2, reverse: false, source: a.py@v0.2}
      - {key: "timing_ms/{stage}", canonical: "time/{stage}", transform: {scale: 0.001}, source: a.py@v1.0}
      - {key: loss, canonical: loss/total, source: a.py@v1.0}
      - {key: ppo_only, canonical: loss/total, trainers: [ppo], since: v0.3, reverse: false, source: a.py@v0.3}
    """)

BETA = textwrap.dedent("""\
    format: trackbridge.mapping/1
    framework: beta
    releases: [v1, v2]
    entries:
      - {key: actor/entropy, canonical: policy/entropy, fidelity: approximate, differs: [snapshot],
         reason: pre-update policy, source: b.py@v2}
      - {key: actor/kl_loss, canonical: kl/ref, source: b.py@v1}
      - {key: "timing_s/{stage:path}", canonical: "time/{stage}", source: b.py@v1}
      - {key: "val-core/{data_source:path}/{var}/mean@{n}", canonical: "val/{data_source}/{var}/mean@{n}",
         source: b.py@v2}
      - {key: actor/loss, canonical: loss/total, source: b.py@v1}
    """)


@pytest.fixture(scope="module")
def reg(tmp_path_factory):
    d = tmp_path_factory.mktemp("maps")
    files = []
    for name, text in (("canonical.yaml", CANON), ("alpha.yaml", ALPHA), ("beta.yaml", BETA)):
        (d / name).write_text(text)
        files.append(d / name)
    return build_registry(files, [])


def T(reg, src, dst="canonical", **kw):
    return Translator(src, dst, registry=reg, **kw)


def test_framework_to_canonical_with_transform_and_template(reg):
    res = T(reg, "alpha/grpo@v1.0").translate({"entropy": 0.5, "kl": 0.01, "timing_ms/gen": 1500.0})
    assert res.metrics == {"policy/entropy": 0.5, "kl/ref": 0.01, "time/gen": 1.5}
    assert res.unmapped == [] and res.mapped == 3 and res.approximate == {}


def test_same_name_different_trainers(reg):
    assert "kl/ref_seq_sum" in T(reg, "alpha/ppo").translate({"kl": 3.0}).metrics
    assert "kl/ref" in T(reg, "alpha/grpo").translate({"kl": 3.0}).metrics
    assert "kl/ref_seq_sum" in T(reg, "alpha-old").translate({"kl": 3.0}).metrics


def test_unknown_keys_pass_through_and_are_reported(reg):
    res = T(reg, "alpha/grpo").translate({"entropy": 1.0, "my_custom": "x", "weird": None})
    assert res.metrics["my_custom"] == "x" and res.metrics["weird"] is None
    assert res.unmapped == ["my_custom", "weird"]


def test_doubly_prefixed_keys(reg):
    res = T(reg, "alpha/grpo").translate({"train/eval_entropy": 0.3, "train/train/loss": 1.0})
    assert res.metrics == {"eval/policy/entropy": 0.3, "loss/total": 1.0}


def test_splits_are_kept(reg):
    res = T(reg, "alpha/grpo").translate({"eval_entropy": 0.3, "train/loss": 1.0})
    assert res.metrics == {"eval/policy/entropy": 0.3, "loss/total": 1.0}
    back = T(reg, "canonical", "alpha/grpo").translate(res.metrics)
    assert back.metrics == {"eval_entropy": 0.3, "loss": 1.0}


def test_cross_framework_goes_through_canonical_and_keeps_fidelity(reg):
    res = T(reg, "beta@v2", "alpha/grpo@v1.0").translate(
        {"actor/entropy": 0.7, "actor/kl_loss": 0.02, "timing_s/gen": 2.0})
    assert res.metrics == {"entropy": 0.7, "kl": 0.02, "timing_ms/gen": 2000.0}
    assert set(res.approximate) == {"entropy"} and "pre-update policy" in res.approximate["entropy"]


def test_templated_data_source_with_slash(reg):
    res = T(reg, "beta").translate({"val-core/openai/gsm8k/acc/mean@1": 0.42})
    assert res.metrics == {"val/openai/gsm8k/acc/mean@1": 0.42}
    back = T(reg, "canonical", "beta").translate(res.metrics)
    assert back.metrics == {"val-core/openai/gsm8k/acc/mean@1": 0.42}


def test_alias_without_reverse_and_conflicts(reg):
    res = T(reg, "alpha/grpo@v0.2").translate({"old_kl": 1.0, "kl": 2.0})
    # both name kl/ref with different values: the primary name wins whatever the order, the alias is kept under
    # its own name and reported
    assert res.metrics["kl/ref"] == 2.0 and res.metrics["old_kl"] == 1.0
    assert res.conflicts == {"old_kl": "kl/ref"}
    same = T(reg, "alpha/grpo@v0.2").translate({"old_kl": 3.0, "kl": 3.0})
    assert same.metrics == {"kl/ref": 3.0} and not same.conflicts and same.mapped == 2


def test_values_of_any_type_never_crash(reg):
    np = pytest.importorskip("numpy")
    vals = {"entropy": np.float32(0.5), "timing_ms/gen": np.float64(1000.0), "kl": float("nan"),
            "loss": float("inf"), "x": None, "timing_ms/ref": "not a number", "timing_ms/upd": [1.0, 2.0]}
    res = T(reg, "alpha/grpo").translate(vals)
    assert res.metrics["time/gen"] == pytest.approx(1.0)
    assert math.isnan(res.metrics["kl/ref"]) and res.metrics["loss/total"] == math.inf
    assert res.metrics["time/ref"] == "not a number"
    # torch tensors: tests/frameworks/test_values_torch.py (tests/unit imports no framework)


def test_bad_specs(reg):
    with pytest.raises(SpecError, match="unknown framework 'gamma'"):
        T(reg, "gamma")
    with pytest.raises(SpecError, match="unknown alpha trainer 'dpo'"):
        T(reg, "alpha/dpo")
    with pytest.raises(SpecError, match="only allowed for the source"):
        T(reg, "alpha", "auto")
    with pytest.raises(TypeError, match="dict of metric name"):
        T(reg, "alpha").translate([("entropy", 1.0)])
    with pytest.raises(TypeError, match="must be strings"):
        T(reg, "alpha").translate({1: 2.0})


def test_auto_detection(reg):
    det = detect({"actor/entropy", "actor/kl_loss", "timing_s/gen"}, reg)
    assert det.spec.framework == "beta" and det.confidence > 0.5
    det = detect({"entropy", "kl", "old_kl"}, reg)
    assert det.spec.framework == "alpha" and det.spec.trainer == "grpo"
    assert det.source.endswith("@v0.1..v0.2")
    assert detect({"nothing", "known"}, reg).spec is None
    res = T(reg, "auto").translate({"actor/entropy": 1.0, "timing_s/step": 3.0})
    assert res.source.startswith("beta") and res.metrics == {"policy/entropy": 1.0, "time/step": 3.0}


def test_config_translation(reg):
    tr = T(reg, "alpha/grpo", config={"beta": 0.04, "other": 1})
    assert tr.translate_config() == {"kl_coef": 0.04}


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(st.sampled_from(["entropy", "kl", "timing_ms/gen", "timing_ms/x/y", "loss", "eval_entropy",
                                        "unknown/thing"]),
                       st.floats(allow_nan=False, allow_infinity=False, width=32), min_size=1))
def test_round_trip_is_identity_for_exact_entries(reg, metrics):
    canon = T(reg, "alpha/grpo@v1.0").translate(metrics)
    back = T(reg, "canonical", "alpha/grpo@v1.0").translate(canon.metrics)
    assert set(back.metrics) == set(metrics)
    for k, v in metrics.items():
        assert back.metrics[k] == pytest.approx(v, rel=1e-12, abs=1e-300)


def test_config_found_under_one_wrapping_key():
    """transformers' TensorBoard text summary puts TrainingArguments under `args`: canonical config names are still
    found there (and at the top level, as before)."""
    from trackbridge import Translator
    tr = Translator("trl/grpo@1.16.0", "canonical")
    assert tr.translate_config({"args": {"beta": 0.1, "num_generations": 4}}) == {"kl_coef": 0.1,
                                                                                  "num_generations": 4}
    assert tr.translate_config({"beta": 0.2}) == {"kl_coef": 0.2}
