"""An OpenRLHF 0.11.2 PPO log, translated with the trainer and the release left out, carries the exact /
approximate marks its run config calls for (issue 20): the marks are computed from mappings/openrlhf.yaml's stated
reductions (levels counted from the config, or the framework's defaults), not written by hand.

The row is what the wheel's own ``ppo_train`` returned for a real-shaped rollout (tests/_support/proofs_openrlhf.py),
plus the keys the trainer adds around it (critic, timing/*, rollout/*, global_step). Each case is a run config and the
fields the mark must name for each key (an empty set: exact):

* the defaults (train.batch_size 128 / micro_batch_size 1 on 8 GPUs: 16 micro-batches; rollout 1024 samples / 128:
  8 optimizer steps; logging_steps 1): token means merged by tokens and sample means are exact; the actor's lr and
  grad norm keep the last of 8 optimizer steps; the critic averages them; the reward-side kl is a mean of
  per-sequence means; the step-normalised losses (token sums over the optimizer step's tokens per rank and
  micro-batch, merged by tokens) are not token means, at every level that merges them;
* use_kl_loss with k3: kl becomes the update-time loss term (kl/ref/k3), logprobs_diff the update-time token mean;
* kl estimator k3 without use_kl_loss: the reward-side kl/old_ref/k3;
* logging_steps 10: a row every 10 steps holds that step's own value: the marks of the defaults;
* one optimizer step of one micro-batch per rank: the last-of / mean-of levels hold one item and become exact
  (the critic's only when the release is given: with it left out the detected range holds releases whose config
  keys were flat, and the translation says the release matters); the step-normalised losses are then one
  micro-batch per rank merged by tokens over 8 ranks: still not a token mean.

Each case is checked twice: the mark computed from the entry the translator picks (tests/_support/openrlhf_marks.py),
and the mark the translator itself puts on the translated row (source "openrlhf", or "auto": detected).
"""
from __future__ import annotations

import functools

import pytest

from trackbridge.pipeline import Translator
from trackbridge.schema.loader import load_registry

from _support.openrlhf_marks import judged, tags
from _support.unproven import agrees, gate_holds

torch = pytest.importorskip("torch")
P = pytest.importorskip("_support.proofs_openrlhf")

EXACT: set = set()
NORMED = {"tokens", "micro_batches", "mini_batches", "processes"}     # token_sum_step_norm merged by tokens
DEFAULT = {
    "global_step": EXACT, "policy_loss": NORMED, "entropy_loss": NORMED, "ppo_clip_ratio": EXACT,
    "ppo_kl": EXACT, "kl": {"tokens"}, "logprobs_diff": {"tokens"}, "reward": EXACT, "score": EXACT, "return": EXACT,
    "group_reward_std": EXACT, "response_length": EXACT, "total_length": EXACT, "truncated": EXACT,
    "response_clip_ratio": EXACT, "actor_lr": {"mini_batches"}, "actor_grad_norm": {"mini_batches"},
    "critic_loss": {"mini_batches"}, "values": {"micro_batches", "processes", "mini_batches"},
    "critic_lr": {"micro_batches", "mini_batches"}, "critic_grad_norm": {"micro_batches", "mini_batches"},
    "timing/generation": EXACT, "timing/make_experience": EXACT, "timing/step_total": {"deviation"},
    "rollout/reward_mean": EXACT, "rollout/reward_std": EXACT, "rollout/num_samples": EXACT,
}
CANONICAL = {"kl": "kl/old_ref/k1", "logprobs_diff": "kl/ref_logprob_diff", "policy_loss": "loss/policy",
             "actor_lr": "optim/lr", "reward": "reward/score/mean", "response_clip_ratio": "sequence/clip_ratio",
             "timing/make_experience": "time/make_experience"}
ONE_STEP = {"rollout.batch_size": 16, "rollout.n_samples_per_prompt": 8, "train.batch_size": 128,
            "train.micro_batch_size": 16, "actor.num_nodes": 1, "actor.num_gpus_per_node": 8,
            "critic.num_gpus_per_node": 8, "train.max_epochs": 1}
CASES = {
    "defaults": ({}, DEFAULT, CANONICAL),
    "use_kl_loss k3": ({"algo": {"kl": {"use_loss": True, "estimator": "k3"}}},
                       {**DEFAULT, "kl": NORMED, "logprobs_diff": {"snapshot"}},
                       {**CANONICAL, "kl": "kl/ref/k3"}),
    "use_kl_loss k1": ({"algo.kl.use_loss": "True"},                 # as a tracker stores it: text
                       {**DEFAULT, "kl": NORMED, "logprobs_diff": {"snapshot"}},
                       {**CANONICAL, "kl": "kl/ref/k1"}),
    "estimator k3": ({"algo.kl.estimator": "k3"}, DEFAULT, {**CANONICAL, "kl": "kl/old_ref/k3"}),
    "logging_steps 10": ({"logger": {"logging_steps": 10}}, DEFAULT, CANONICAL),
    "one optimizer step": (ONE_STEP,
                           {**DEFAULT, "actor_lr": EXACT, "actor_grad_norm": EXACT, "critic_loss": EXACT,
                            "values": {"processes"}, "critic_lr": EXACT, "critic_grad_norm": EXACT,
                            "policy_loss": {"tokens", "processes"}, "entropy_loss": {"tokens", "processes"}},
                           CANONICAL),
}


# With the release left out, the detected range (v0.9.8..v0.11.2) holds the critic's releases whose config keys were
# flat (critic_num_gpus_per_node ..., up to v0.10.1.post2): a dotted config does not set those, their defaults give 16
# micro-batches there, and the translation says the release matters. Given the release, the dotted config decides.
RANGE = {"one optimizer step": {"critic_loss": {"micro_batches", "processes"}, "critic_lr": {"micro_batches"},
                                "critic_grad_norm": {"micro_batches"}}}


@pytest.fixture(scope="module")
def reg():
    return load_registry()


@functools.lru_cache(maxsize=None)
def row() -> dict:
    """A logged 0.11.2 PPO row: the wheel's ppo_train status, and what PPOTrainer adds (its values do not matter for
    the marks, only the keys)."""
    run = P.run_ppo(P.make_rollout(0), P.ppo_args())
    out = dict(run.status)
    out.update({"critic_loss": 0.12, "values": 0.4, "critic_lr": 5e-6, "critic_grad_norm": 1.3,
                "timing/generation": 3.2, "timing/make_experience": 1.1, "timing/step_total": 6.0,
                "rollout/reward_mean": 0.31, "rollout/reward_std": 0.4, "rollout/num_samples": 16.0,
                "global_step": 3})
    assert set(DEFAULT) <= set(out), set(DEFAULT) - set(out)
    return out


@pytest.mark.parametrize("case", sorted(CASES))
def test_marks_follow_the_run_config(reg, case):
    """Trainer and release left out (every release: the newest entries and the 0.11 keys' defaults): each key's
    computed mark names exactly the fields the case expects, and goes to the expected canonical name."""
    config, want, names = CASES[case]
    logged = row()
    for key, fields in want.items():
        assert key in logged
        entry, res, why, name = judged(reg, key, config)
        assert tags(why) == fields, f"{case}: {key} -> {name}: {why}"
        if key in names:
            assert name == names[key], (case, key, name)


def test_default_reasons_say_the_counts_and_the_defaults(reg):
    """The generated reasons name the level, its count, the config keys and that defaults were assumed."""
    _, res, why, _ = judged(reg, "actor_lr", {})
    assert "keeps the last of its 8 mini-batches" in why and "rollout.batch_size=1024 (default)" in why, why
    assert dict(res.defaults)["train.batch_size"] == 128
    _, _, why, _ = judged(reg, "values", {})
    assert "averages its 16 micro-batches unweighted" in why and "critic.num_gpus_per_node=8 (default)" in why, why
    # a row every 10 steps holds its own step's value: what the canonical name holds at that step
    _, res, why, _ = judged(reg, "ppo_kl", {"logger.logging_steps": 10})
    assert why is None and res.counts["window"].n == 10 and res.stated["window"] == "last", why
    _, _, why, _ = judged(reg, "kl", {})
    assert "mean of per-sequence token means" in why and "[tokens]" in why, why
    _, _, why, _ = judged(reg, "policy_loss", {})
    assert "is each micro-batch's token sum over the optimizer step's tokens per rank and micro-batch (not a token " \
           "mean) (actor.loss_agg_mode=token-mean, the default)" in why and "[tokens]" in why, why


@pytest.mark.parametrize("source", ["openrlhf", "auto"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_the_translation_carries_the_marks(reg, case, source):
    """The translator itself (trainer and release left out: "openrlhf", or detected from the keys with "auto") sends
    each key to the canonical name the marks were computed for, with the config's when-conditions (use_kl_loss,
    estimator) applied, and marks exactly the expected keys approximate, naming the expected fields."""
    config, want, names = CASES[case]
    tr = Translator(source, "canonical", registry=reg, config=config)
    res = tr.translate(row())
    assert res.source.startswith("openrlhf/ppo@v0.9.8..v0.11.2"), res.source
    for key, fields in {**want, **RANGE.get(case, {})}.items():
        entry, _, _, name = judged(reg, key, config)
        assert name in res.metrics, (case, key, name, sorted(res.metrics))
        if fields:
            assert tags(res.approximate.get(name)) == fields, (case, key, res.approximate.get(name))
        else:
            # exact when proofs saw the reductions of every entry the detected range spans (mappings/proofs.yaml),
            # else "stated, not proven" naming the entries no proof saw (rollout/reward_mean: the v0.10.2.. entry is
            # proven, the range's v0.9.8..v0.10.1.post2 one is not, and the translation says the release matters)
            why = res.approximate.get(name)
            assert gate_holds(reg, entry, why) or (agrees(why) and "the release matters" in why), (case, key, why)
        if key in RANGE.get(case, {}):
            assert "so the release matters" in res.approximate[name], res.approximate[name]


def test_given_the_release_the_config_decides(reg):
    """openrlhf/ppo@0.11.2 with one optimizer step of one micro-batch per rank: the critic's levels hold one item
    each, so critic_loss, critic_lr and critic_grad_norm are exact (values still averages 8 ranks unweighted)."""
    res = Translator("openrlhf/ppo@0.11.2", "canonical", registry=reg, config=ONE_STEP).translate(row())
    for name in ("loss/value", "optim/critic_lr", "optim/critic_grad_norm", "optim/lr", "optim/grad_norm",
                 "kl/old_policy/k1", "reward/score/mean"):
        assert name in res.metrics and agrees(res.approximate.get(name)), (name, res.approximate.get(name))
    assert tags(res.approximate["value/pred/mean"]) == {"processes"}, res.approximate["value/pred/mean"]
    assert "loss/value" not in res.approximate         # critic_loss: proven (test_proof_openrlhf_critic.py)
