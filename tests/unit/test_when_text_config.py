"""A ``when:`` condition reads a run config value the way a config switch of ``reduce:`` does: trackers store config
values as text at times (MLflow params always; ``"True"``, ``"1"``, ``"null"``), and such a value must select the
same entry as the typed one (schema/model.py Entry.condition_holds; schema/reductions.py config_equal)."""
from __future__ import annotations

import pytest

from trackbridge.pipeline import Translator
from trackbridge.schema.loader import load_registry


@pytest.fixture(scope="module")
def reg():
    return load_registry()


@pytest.mark.parametrize("value", [True, "True", "true", " TRUE "])
def test_a_boolean_condition_matches_its_text(reg, value):
    e = next(e for e in reg.frameworks["openrlhf"].entries
             if e.key == "kl" and e.canonical == "kl/ref/k1" and e.when and e.since > 100)
    assert e.condition_holds({"algo.kl.use_loss": value}) is True


@pytest.mark.parametrize("value", [False, "False", "0", "yes", 1])
def test_other_values_do_not_match(reg, value):
    e = next(e for e in reg.frameworks["openrlhf"].entries
             if e.key == "kl" and e.canonical == "kl/ref/k1" and e.when and e.since > 100)
    assert e.condition_holds({"algo.kl.use_loss": value}) is False


def test_a_text_config_places_the_key_like_the_typed_one(reg):
    typed = Translator("openrlhf/ppo@0.11.2", "canonical", registry=reg,
                       config={"algo": {"kl": {"use_loss": True, "estimator": "k3"}}}).translate({"kl": 0.1})
    text = Translator("openrlhf/ppo@0.11.2", "canonical", registry=reg,
                      config={"algo.kl.use_loss": "True", "algo.kl.estimator": "k3"}).translate({"kl": 0.1})
    assert list(typed.metrics) == list(text.metrics) == ["kl/ref/k3"]
