"""AReaL at every release that logs through stats_tracker, v0.3.1 .. v2.0.0 (mappings/areal.yaml), and the audit of
`approx_kl`'s old policy. Facts read from github.com/inclusionAI/AReaL (now areal-project/AReaL) at the release tags
with `git show <tag>:<path>`; each record below cites the lines that log its keys.

* v0.3.1 .. v0.4.0 log the actor under the example scripts' scope `grpo_actor/` with no `update/` level, one tracker
  row per PPO mini-batch (areal/engine/ppo/actor.py@v0.4.0:259-297 exports once per mini-batch and returns the list;
  areal/utils/stats_logger.py@v0.4.0:136-147 logs item i at step log_step + i).
* v0.4.1 .. v2.0.0 log `ppo_actor/` and `ppo_actor/update/` once per step (areal/engine/ppo/actor.py@v0.4.1:190,276;
  areal/trainer/ppo/actor.py@v2.0.0:263,352).
* `approx_kl` is log pi_theta - log pi_prox (areal/utils/functional.py@v0.4.0:346,
  areal/utils/functional/functional.py@v1.0.4:546, @v2.0.0:571), and with the defaults (recompute_logprob and
  use_decoupled_loss false: areal/api/cli_args.py@v1.0.4:1479-1489, @v0.4.0:489-500) compute_advantages sets
  prox_logp to the inference engine's log-probs (areal/trainer/ppo/actor.py@v1.0.4:177-191, @v2.0.0:197-200,
  areal/engine/ppo/actor.py@v0.4.0:121-128): not OpenRLHF's `ppo_kl` / veRL's `actor/ppo_kl`, whose old policy the
  trainer recomputed.
"""
from __future__ import annotations

import pytest

from trackbridge.detect import detect
from trackbridge.pipeline import Translator
from trackbridge.schema.loader import load_registry
from trackbridge.schema.spec import SpecError, parse_spec

from _support.unproven import agrees

pytestmark = pytest.mark.unit

# `git tag` of the repository, every release from the first with the grpo_actor/ scope (the v0.3.0-lite* tags are no
# release names trackbridge reads; v0.3.0 is the legacy realhf system) to the newest
RELEASES = ["v0.3.0", "v0.3.1", "v0.3.2", "v0.3.3", "v0.3.4", "v0.3.4.post1", "v0.4.0", "v0.4.1", "v0.5.0", "v0.5.1",
            "v0.5.2", "v0.5.3",
            "v1.0.0.rc1", "v1.0.0", "v1.0.0.post1", "v1.0.1", "v1.0.2", "v1.0.3", "v1.0.4", "v2.0.0"]
AMM = ("avg", "min", "max")


def _amm(scope: str, *names: str) -> list[str]:
    return [f"{scope}/{n}/{s}" for n in names for s in AMM]


# grpo_loss_fn's statistics and the optimizer step's scalars, one row per PPO mini-batch at v0.4.0:
# areal/engine/ppo/actor.py@v0.4.0:398-403 (denominators), :405-415 (stat, denominator n_valid_tokens), :423-429
# (vocab logits), :431-438 (clipped log-probs); areal/engine/fsdp_engine.py@v0.4.0:632-636 (update_successful,
# grad_norm, lr), scalar()-ed at areal/engine/ppo/actor.py@v0.4.0:292
V040_MINIBATCH = (_amm("grpo_actor", "importance_weight", "approx_kl", "new_logp", "old_logp", "entropy", "actor_loss",
                       "clip_ratio", "dual_clip_ratio", "vocab_min_logits", "vocab_max_logits", "clipped_new_logp",
                       "clipped_old_logp")
                  + ["grpo_actor/n_tokens", "grpo_actor/n_valid_tokens", "grpo_actor/clipped_tokens",
                     "grpo_actor/dual_clipped_tokens", "grpo_actor/update_successful", "grpo_actor/grad_norm",
                     "grpo_actor/lr"])
# the step's first row adds the batch statistics (areal/engine/ppo/actor.py@v0.4.0:217-222, :224-229, :233-239,
# scalars :240-250), the rollout reward (areal/workflow/rlvr.py@v0.4.0:102) and the stage timings
# (examples/math/gsm8k_grpo.py@v0.4.0 record_timing: rollout, compute_advantage, train_step, update_weights)
V040_FIRST_ROW = (V040_MINIBATCH
                  + _amm("grpo_actor", "correct_seq_len", "incorrect_seq_len", "advantages", "kl_rewards",
                         "final_reward", "no_eos_ratios", "task_reward", "prompt_len", "seq_len")
                  + ["grpo_actor/mask_no_eos_with_zero", "grpo_actor/eps_clip", "grpo_actor/use_dual_clip",
                     "rollout/reward", "timeperf/rollout", "timeperf/compute_advantage", "timeperf/train_step",
                     "timeperf/update_weights"])
# one step at v2.0.0 (default config): areal/trainer/ppo/actor.py@v2.0.0 ppo_update and grpo_loss_fn (the same
# keywords as v1.0.4), areal/engine/fsdp_engine.py@v2.0.0:710-713,797, areal/workflow/rlvr.py@v2.0.0:135,
# areal/trainer/rl_trainer.py@v2.0.0 record_timing
V200_STEP = (_amm("ppo_actor", "correct_seq_len", "incorrect_seq_len", "advantages", "kl_rewards", "final_reward",
                  "no_eos_ratios", "task_reward", "prompt_len", "seq_len")
             + ["ppo_actor/n_seqs", "ppo_actor/n_tokens", "ppo_actor/n_valid_tokens", "ppo_actor/correct_n_seqs",
                "ppo_actor/incorrect_n_seqs", "ppo_actor/mask_no_eos_with_zero", "ppo_actor/eps_clip",
                "ppo_actor/use_dual_clip"]
             + _amm("ppo_actor/update", "importance_weight", "approx_kl", "new_logp", "old_logp", "entropy",
                    "actor_loss", "clip_ratio", "dual_clip_ratio", "clipped_new_logp", "clipped_old_logp")
             + ["ppo_actor/update/n_tokens", "ppo_actor/update/n_valid_tokens", "ppo_actor/update/clipped_tokens",
                "ppo_actor/update/dual_clipped_tokens", "ppo_actor/update/update_successful",
                "ppo_actor/update/grad_norm", "ppo_actor/update/lr", "ppo_actor/update/num_micro_batches",
                "rollout/reward", "timeperf/rollout", "timeperf/compute_advantage", "timeperf/train_step",
                "timeperf/update_weights", "timeperf/clear_batches"])


def record(keys: list[str]) -> dict[str, float]:
    assert len(set(keys)) == len(keys)
    return {k: 0.25 + i / 1000 for i, k in enumerate(keys)}


@pytest.fixture(scope="module")
def reg():
    return load_registry()


def idx(reg, name: str) -> int:
    return reg.frameworks["areal"].releases.index(name)


def test_every_release_from_the_first_grpo_actor_one_to_v2_0_0(reg):
    assert reg.frameworks["areal"].releases == RELEASES


@pytest.mark.parametrize("version", ["2.0.0", "v2.0.0", "0.3.1", "0.3.4.post1", "0.4.0", "0.5.2", "1.0.0.rc1",
                                     "1.0.0.post1"])
def test_every_release_resolves_as_itself(reg, version):
    spec = parse_spec(f"areal@{version}", reg)
    name = version if version.startswith("v") else f"v{version}"
    assert (spec.framework, spec.lo, spec.hi) == ("areal", idx(reg, name), idx(reg, name))
    assert spec.note is None


def test_older_than_v0_3_0_is_refused_with_the_known_range(reg):
    # v0.1.1 .. v0.2.0: realhf before its ppo_actor/ stats_tracker scope (realhf/impl/model/interface/
    # ppo_interface.py@v0.2.0 logs another key set); v0.3.0 is the legacy realhf trainer (test_areal_realhf.py)
    with pytest.raises(SpecError, match=r"older than the first areal release.*v0\.3\.0\.\.v2\.0\.0"):
        parse_spec("areal@0.2.0", reg)


def test_a_v0_4_0_step_is_detected_as_areal_before_the_ppo_actor_scope(reg):
    for keys in (V040_FIRST_ROW, V040_MINIBATCH):
        det = detect(record(keys), reg)
        assert det.spec is not None and (det.spec.framework, det.spec.trainer) == ("areal", "ppo"), det.to_json()
        # grpo_actor/ is logged from v0.3.1 through v0.4.0 only
        assert idx(reg, "v0.3.1") <= det.spec.lo <= idx(reg, "v0.4.0") == det.spec.hi, det.to_json()


def test_a_v2_0_0_step_is_detected_up_to_v2_0_0(reg):
    det = detect(record(V200_STEP), reg)
    assert det.spec is not None and (det.spec.framework, det.spec.trainer) == ("areal", "ppo"), det.to_json()
    assert det.spec.lo >= idx(reg, "v0.4.1") and det.spec.hi == idx(reg, "v2.0.0"), det.to_json()


def test_v2_0_0_translates_the_same_ppo_keys_as_v1_0_4(reg):
    rec = record(V200_STEP)
    res = Translator("areal@2.0.0", "canonical", registry=reg).translate(rec)
    for key, canon in (("ppo_actor/update/actor_loss/avg", "loss/policy"), ("ppo_actor/task_reward/avg",
                       "reward/score/mean"), ("ppo_actor/update/entropy/avg", "policy/entropy"),
                       ("ppo_actor/update/grad_norm", "optim/grad_norm"), ("rollout/reward", "sampling/reward/mean"),
                       ("timeperf/train_step", "time/train_step")):
        assert res.metrics[canon] == rec[key], key
    assert res.metrics["kl/old_policy/k1"] == -rec["ppo_actor/update/approx_kl/avg"]


def test_grpo_actor_is_the_ppo_actor_quantity_of_v0_4_1_onwards(reg):
    rec = record(V040_FIRST_ROW)
    res = Translator("areal@0.4.0", "canonical", registry=reg).translate(rec)
    for key, canon in (("grpo_actor/task_reward/avg", "reward/score/mean"),
                       ("grpo_actor/actor_loss/avg", "loss/policy"), ("grpo_actor/entropy/avg", "policy/entropy"),
                       ("grpo_actor/grad_norm", "optim/grad_norm"), ("grpo_actor/lr", "optim/lr"),
                       ("grpo_actor/advantages/avg", "advantage/mean")):
        assert res.metrics[canon] == rec[key], key
    assert res.metrics["kl/old_policy/k1"] == -rec["grpo_actor/approx_kl/avg"]
    # written back for a v0.4.0 run under the old scope, for a v0.4.1 run under the new one
    canon = {"loss/policy": 0.5, "reward/score/mean": 1.0}
    back = Translator("canonical", "areal@0.4.0", registry=reg).translate(canon)
    assert back.metrics == {"grpo_actor/actor_loss/avg": 0.5, "grpo_actor/task_reward/avg": 1.0}
    back = Translator("canonical", "areal@0.4.1", registry=reg).translate(canon)
    assert back.metrics == {"ppo_actor/update/actor_loss/avg": 0.5, "ppo_actor/task_reward/avg": 1.0}


def test_grpo_actor_rows_hold_one_mini_batch_each(reg):
    # actor.ppo_n_minibatches defaults to 4 (areal/api/cli_args.py@v0.4.0); with 1 the row is the step
    rec = {"grpo_actor/actor_loss/avg": 0.1, "grpo_actor/grad_norm": 1.0, "grpo_actor/lr": 1e-6,
           "grpo_actor/task_reward/avg": 0.5}
    res = Translator("areal@0.4.0", "canonical", registry=reg).translate(rec)
    for canon in ("loss/policy", "optim/grad_norm"):
        assert "[deviation]" in res.approximate[canon] and "its own tracker row" in res.approximate[canon], canon
    # the batch statistic sits in the first row; every row holds the same lr, read before the scheduler steps as at
    # v1.0.4 (its only difference from the canonical snapshot)
    assert agrees(res.approximate.get("reward/score/mean")), res.approximate.get("reward/score/mean")
    assert "[snapshot]" in res.approximate["optim/lr"] and "[deviation]" not in res.approximate["optim/lr"]
    res = Translator("areal@0.4.0", "canonical", registry=reg, config={"actor.ppo_n_minibatches": 1}).translate(rec)
    for canon in ("loss/policy", "optim/grad_norm", "reward/score/mean"):
        assert agrees(res.approximate.get(canon)), (canon, res.approximate.get(canon))


OLD_POLICY_KL = [("openrlhf/ppo@0.11.2", "ppo_kl"), ("verl/ppo@0.9.1", "actor/ppo_kl")]
AREAL_KL = [("areal/ppo@1.0.4", "ppo_actor/update/approx_kl/avg"),
            ("areal/ppo@2.0.0", "ppo_actor/update/approx_kl/avg"),
            ("areal/ppo@0.5.3", "ppo_actor/update/approx_kl/avg"),
            ("areal/ppo@0.4.0", "grpo_actor/approx_kl/avg")]


@pytest.mark.parametrize("source,key", AREAL_KL)
@pytest.mark.parametrize("target,name", OLD_POLICY_KL)
def test_approx_kl_by_default_is_against_the_inference_engines_log_probs(reg, source, key, target, name):
    res = Translator(source, target, registry=reg).translate({key: 0.01})
    assert res.metrics == {name: -0.01}                      # log pi_theta - log pi_old = -k1 of KL(old || theta)
    why = res.approximate[name]
    assert "[deviation]" in why and "inference engine's log-prob" in why and "recomputed by the trainer" in why, why


@pytest.mark.parametrize("source,key", AREAL_KL)
@pytest.mark.parametrize("config", [{"actor.recompute_logprob": True}, {"actor.use_decoupled_loss": True},
                                    {"actor.recompute_logprob": "true", "actor.ppo_n_minibatches": 1}])
def test_approx_kl_with_the_trainers_recomputed_log_probs_is_openrlhfs_ppo_kl(reg, source, key, config):
    if key.startswith("grpo_actor/") and config.get("actor.ppo_n_minibatches") != 1:
        config = {**config, "actor.ppo_n_minibatches": 1}    # v0.4.0's rows are one mini-batch each (above)
    res = Translator(source, "openrlhf/ppo@0.11.2", registry=reg, config=config).translate({key: 0.01})
    assert res.metrics == {"ppo_kl": -0.01}
    assert agrees(res.approximate.get("ppo_kl")), res.approximate.get("ppo_kl")
    # veRL's actor/ppo_kl stays approximate for its own unweighted means, no longer for the old policy
    res = Translator(source, "verl/ppo@0.9.1", registry=reg, config=config).translate({key: 0.01})
    why = res.approximate["actor/ppo_kl"]
    assert "[deviation]" not in why and "inference engine" not in why and "[mini_batches]" in why, why
