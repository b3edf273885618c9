"""A veRL 0.9.1, an OpenRLHF 0.11.2 and a TRL 1.16 log translated with the trainer and the release left out carry
the right marks for their configs, default and non-default (issue 20 "Done when"), through every path's one engine.

The facts come from small fixture mapping files (tests/data/reductions/fixture/*.yaml, loaded with the shipped
canonical.yaml instead of the shipped framework files), so this tests the engine, not the shipped statements: every
fixture entry counts as proven (``assume_proven``), the proof gate has its own tests (test_proofs_gate.py)."""
from __future__ import annotations

from pathlib import Path

import pytest

from trackbridge.pipeline import Pipeline, Translator
from trackbridge.record import Record
from trackbridge.schema.loader import build_registry

from _support import DATA, ROOT
from _support.unproven import assume_proven

FIXTURE = DATA / "reductions" / "fixture"
LOGS = {
    "verl": {"actor/kl_loss": 0.1, "actor/pg_loss": -0.2, "actor/grad_norm": 1.0, "actor/lr": 1e-6,
             "critic/score/mean": 0.5, "response_length/mean": 300.0, "timing_s/step": 10.0},
    "openrlhf": {"kl": 0.1, "reward": 0.5, "response_length": 300.0, "actor_lr": 1e-6},
    "trl": {"kl": 0.1, "entropy": 1.2, "reward": 0.5, "completions/mean_length": 300.0, "learning_rate": 1e-6},
}


@pytest.fixture(scope="module")
def reg():
    return assume_proven(build_registry([ROOT / "mappings" / "canonical.yaml",
                                         *(FIXTURE / f"{n}.yaml" for n in ("verl", "trl", "openrlhf"))], []))


def tagged(why: str | None) -> set[str]:
    """The fields a generated reason names (``[mini_batches]``)."""
    import re
    return set(re.findall(r"\[([a-z_]+)\]", why or ""))


def run(reg, fw, config=None, target="canonical"):
    tr = Translator("auto", target, registry=reg, config=config)
    res = tr.translate(LOGS[fw])
    return tr, res


def test_verl_default_config_four_mini_batches(reg):
    tr, res = run(reg, "verl")
    assert res.source.startswith("verl/ppo@v0.8.0..v0.9.1 (detected")
    # losses: a token mean over each mini-batch, unweighted over the 4 mini-batches of the default config
    for name in ("kl/ref/k3", "loss/policy", "optim/grad_norm"):
        assert tagged(res.approximate[name]) == {"mini_batches"}, res.approximate[name]
        assert "averages its 4 mini-batches (optimizer steps) unweighted" in res.approximate[name]
        assert "data.train_batch_size=1024 (default)" in res.approximate[name]
    for name in ("reward/score/mean", "response/length/mean", "optim/lr", "time/step"):
        assert name in res.metrics and name not in res.approximate
    defaults = [n for n in tr.notes if n.startswith("the run config does not set")]
    assert len(defaults) == 1 and "data.train_batch_size=1024" in defaults[0] and "(verl's default, assumed)" in \
        defaults[0]


def test_verl_one_mini_batch_config_is_exact(reg):
    config = {"data": {"train_batch_size": 256}, "actor_rollout_ref": {"actor": {
        "ppo_mini_batch_size": 256, "ppo_epochs": 1, "loss_agg_mode": "token-mean", "kl_loss_type": "low_var_kl"}},
        "trainer": {"n_gpus_per_node": 8, "nnodes": 1}}
    tr, res = run(reg, "verl", config)
    assert res.approximate == {}
    assert not [n for n in tr.notes if n.startswith("the run config does not set")]
    # two epochs: two optimizer steps over the one mini-batch
    config["actor_rollout_ref"]["actor"]["ppo_epochs"] = 2
    _, res = run(reg, "verl", config)
    assert "averages its 2 mini-batches" in res.approximate["kl/ref/k3"]
    # seq-mean-token-mean: another population, and a tokens-weighted combination no longer pools it
    config["actor_rollout_ref"]["actor"].update(ppo_epochs=1, loss_agg_mode="seq-mean-token-mean")
    _, res = run(reg, "verl", config)
    assert tagged(res.approximate["kl/ref/k3"]) == {"tokens", "micro_batches"}
    assert "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean" in res.approximate["kl/ref/k3"]
    assert "optim/grad_norm" not in res.approximate


def test_trl_default_logging_window_and_one_step_window(reg):
    tr, res = run(reg, "trl")
    assert res.source.startswith("trl/grpo@v1.14.0..v1.16.0 (detected")
    for name in ("reward/score/mean", "response/length/mean"):
        assert tagged(res.approximate[name]) == {"window"}
        assert "(window = logging_steps = 10 (the default))" in res.approximate[name]
    # the lr of the row's own step (the window's last): the value the canonical name holds at that step
    assert "optim/lr" in res.metrics and "optim/lr" not in res.approximate
    assert tagged(res.approximate["kl/ref/k3"]) == {"processes", "window"}
    # logging every step: the gathered per-sequence values and the lr are exact; the token means still average the
    # processes' values unweighted (how many processes is not in the config)
    _, res = run(reg, "trl", {"logging_steps": 1, "gradient_accumulation_steps": 1})
    assert set(res.approximate) == {"kl/ref/k3", "policy/entropy"}
    assert tagged(res.approximate["kl/ref/k3"]) == {"processes"}
    # gradient accumulation: the micro-batches' token means averaged unweighted
    _, res = run(reg, "trl", {"logging_steps": 1, "gradient_accumulation_steps": 4})
    assert tagged(res.approximate["kl/ref/k3"]) == {"micro_batches", "processes"}
    assert "averages its 4 micro-batches unweighted (micro_batches = gradient_accumulation_steps = 4)" in \
        res.approximate["kl/ref/k3"]


def test_openrlhf_kl_is_the_reward_side_k1_by_default_and_the_loss_k3_when_configured(reg):
    tr, res = run(reg, "openrlhf")
    assert res.source.startswith("openrlhf/ppo@v0.11.0..v0.11.2 (detected")
    assert "kl/old_ref/k1" in res.metrics and tagged(res.approximate["kl/old_ref/k1"]) == {"micro_batches",
                                                                                            "processes"}
    # the run config does not set use_loss / the estimator: OpenRLHF's defaults held (said), so the reward-side k1
    assert any("algo.kl.use_loss=False" in n and "algo.kl.estimator=k1" in n and "(openrlhf's default, assumed)" in n
               for n in tr.notes), tr.notes
    assert not any("mean another quantity" in n for n in tr.notes), tr.notes
    _, res = run(reg, "openrlhf", {"algo": {"kl": {"use_loss": True, "estimator": "k3"}}})
    assert "kl/ref/k3" in res.metrics and "kl/old_ref/k1" not in res.metrics


def test_framework_to_framework_is_judged_directly_with_the_config_carried_over(reg):
    # veRL -> TRL names: veRL logs every step; TRL's names mean a 10-step window by default (assumed, and said)
    tr, res = run(reg, "verl", None, target="trl")
    assert res.metrics["reward"] == 0.5 and res.metrics["completions/mean_length"] == 300.0
    assert res.approximate["reward"] == ("verl 'critic/score/mean' logs every step; trl 'reward' averages the 10 "
                                         "steps since the last log unweighted (window = logging_steps = 10 (the "
                                         "default)) [window]")
    # the KL: veRL's 4 mini-batches against TRL's num_iterations, carried over from veRL's ppo_epochs (canonical
    # ppo_epochs) as 1 here: a difference of mini-batches, and TRL's window; not a difference of tokens
    assert tagged(res.approximate["kl"]) == {"mini_batches", "processes", "window"}
    # same reductions on both sides: exact, although each differs from the canonical reference
    a = Translator("verl", "canonical", registry=reg).translate(LOGS["verl"]).approximate["kl/ref/k3"]
    assert a is not None
    tr = Translator("verl", "verl", registry=reg)
    assert tr.translate(LOGS["verl"]).approximate == {}


def test_the_pipeline_paths_carry_the_same_marks(reg, tmp_path):
    """The logger's canonical stream renamed later (replay, migrate: a canonical source that remembers its origin)
    is judged as the direct path is: through Pipeline, the one path of the records."""
    config = {"logging_steps": 1}
    direct = Translator("trl", "verl", registry=reg, config=config).translate(LOGS["trl"])
    to_canon = Pipeline("auto", "canonical", registry=reg, config=config, derive=False)
    rec = to_canon.one(Record(1, 0.0, dict(LOGS["trl"])))
    again = Pipeline("canonical", "verl", registry=reg, config=config, derive=False, origin=to_canon.stats.source,
                     fidelity=to_canon.stats.approximate)
    out = again.one(rec)
    assert out.metrics == direct.metrics
    assert again.stats.approximate == direct.approximate
    assert Path(FIXTURE / "verl.yaml").is_file()


def test_a_value_derived_from_an_approximate_input_is_approximate_with_its_reason(tmp_path):
    rules = tmp_path / "rules.yaml"
    rules.write_text("format: trackbridge.derived/1\nrules:\n"
                     "  - name: toy/frac\n    formula: kl/ref/k3 * 2\n    description: a test rule\n"
                     "    citation: tests/unit/test_fidelity_translate.py\n")
    reg = assume_proven(build_registry([ROOT / "mappings" / "canonical.yaml",
                                        DATA / "reductions" / "canonical-extra.yaml",
                                        *(FIXTURE / f"{n}.yaml" for n in ("verl", "trl", "openrlhf"))], [str(rules)]))
    tr = Translator("verl", "canonical", registry=reg, derive=True, mappings=[str(rules)])
    res = tr.translate(LOGS["verl"], step=1)
    assert res.metrics["toy/frac"] == pytest.approx(0.2) and "toy/frac" in res.derived
    assert "averages its 4 mini-batches" in res.approximate["toy/frac"]
    config = {"data.train_batch_size": 256, "actor_rollout_ref.actor.ppo_mini_batch_size": 256}
    res = Translator("verl", "canonical", registry=reg, derive=True, mappings=[str(rules)],
                     config=config).translate(LOGS["verl"], step=1)
    assert "toy/frac" in res.derived and "toy/frac" not in res.approximate and "kl/ref/k3" not in res.approximate
