"""AReaL's legacy realhf trainer (trainer `realhf` of mappings/areal.yaml): the only trainer at v0.3.0, shipped beside
areal/ through v0.5.1 (realhf/ is gone at v0.5.2). Facts read from github.com/inclusionAI/AReaL (now
areal-project/AReaL) at the release tags with `git show <tag>:<path>`; realhf/impl/model/interface/ppo_interface.py is
the same blob at every tag v0.3.0 .. v0.5.1, so its v0.3.0 line numbers hold for all of them.

* PPOActorInterface.train_step logs under stats_tracker.scope("ppo_actor") (ppo_interface.py@v0.3.0:705) with no
  update/ level: the batch statistics once, in the step's first row (:710-785, :830), the loss function's and the
  optimizer step's once per PPO mini-batch (:107-161, :815-827), each list item a row at step n * global_step + j
  (realhf/system/model_function_call.py@v0.3.0:450-460).
* approx_kl is logprobs - denorm_logprobs, denorm the proximal log-prob under the decoupled loss, else the old log-prob
  (realhf/impl/model/utils/ppo_functional.py@v0.3.0:88-94,140), which is the generation's unless ppo.recompute_logprob
  (realhf/experiments/common/ppo_math_exp.py@v0.3.0:165-167,286-287; both flags default false,
  realhf/api/cli_args.py@v0.3.0:684-691).
* task_reward is the reward realhf trains on: the verifier's 0/1 success mapped to +1/-1
  (realhf/impl/model/interface/math_rw_interface.py@v0.3.0:309-314, realhf/impl/agent/math_single_step_agent.py
  @v0.3.0:75-78).
"""
from __future__ import annotations

import pytest

from trackbridge.detect import detect
from trackbridge.pipeline import Translator
from trackbridge.schema.loader import load_registry
from trackbridge.schema.spec import SpecError, parse_spec

from _support.unproven import agrees

pytestmark = pytest.mark.unit

AMM = ("avg", "min", "max")


def _amm(*names: str) -> list[str]:
    return [f"ppo_actor/{n}/{s}" for n in names for s in AMM]


# one PPO mini-batch's row (every row of a step): the loss function's denominators (ppo_interface.py@v0.3.0:107-112),
# stat() with denominator n_valid_tokens (:114-124), the vocabulary logits (:140-144), the clipped tokens' log-probs
# (:152-161), the Megatron optimizer step's stat dict scalar()-ed in the scope (realhf/impl/model/backend/
# megatron.py@v0.3.0:555-561, two parameter groups; ppo_interface.py@v0.3.0:826)
MINIBATCH_ROW = (_amm("importance_weight", "approx_kl", "new_logp", "old_logp", "entropy", "actor_loss", "clip_ratio",
                      "dual_clip_ratio", "vocab_min_logits", "vocab_max_logits", "clipped_new_logp",
                      "clipped_old_logp", "dual_clipped_new_logp", "dual_clipped_old_logp")
                 + ["ppo_actor/n_tokens", "ppo_actor/n_valid_tokens", "ppo_actor/clipped_tokens",
                    "ppo_actor/dual_clipped_tokens", "ppo_actor/update_successful", "ppo_actor/grad_norm",
                    "ppo_actor/loss_scale", "ppo_actor/param_group0/lr", "ppo_actor/param_group1/lr"])
# the step's first row adds the batch statistics of a math run: math_reward (:729-732, RL_TASKS), correct/incorrect
# lengths (:734-739), token stats (:741-748), sequence stats (:750-767), the config scalars (:768-781, c_clip unset)
FIRST_ROW = (MINIBATCH_ROW
             + _amm("math_reward", "correct_seq_len", "incorrect_seq_len", "advantages", "kl_rewards", "final_reward",
                    "no_eos_ratios", "task_reward", "prompt_len", "seq_len")
             + ["ppo_actor/disable_value", "ppo_actor/mask_no_eos_with_zero", "ppo_actor/eps_clip",
                "ppo_actor/use_prox_logp", "ppo_actor/use_dual_clip"])
# asynchronous PPO (training/main_async_ppo.py, training/configs/async-ppo.yaml@v0.3.0: use_decoupled_loss true):
# the rollout's versions (:756-763) and the decoupled loss's behaviour stats (:125-131)
ASYNC_FIRST_ROW = (FIRST_ROW + _amm("head_offpolicyness", "tail_offpolicyness", "behave_imp_weight", "behave_approx_kl")
                   + ["ppo_actor/unclipped_behave_tokens"])
# one v0.5.1 step of the areal/ trainer, which ships beside realhf there: ppo_actor/ and ppo_actor/update/
# (areal/engine/ppo/actor.py@v0.4.1:190,276, the same keywords at v0.5.1)
AREAL_V051_STEP = (_amm("task_reward", "advantages", "seq_len", "prompt_len", "no_eos_ratios")
                   + ["ppo_actor/n_seqs", "ppo_actor/n_tokens", "ppo_actor/n_valid_tokens"]
                   + [f"ppo_actor/update/{n}/{s}" for n in ("actor_loss", "entropy", "approx_kl", "clip_ratio",
                                                            "importance_weight") for s in AMM]
                   + ["ppo_actor/update/grad_norm", "ppo_actor/update/lr", "rollout/reward", "timeperf/train_step"])


from test_releases_areal import idx, record  # noqa: E402 - one record shape for both files


@pytest.fixture(scope="module")
def reg():
    return load_registry()


def test_v0_3_0_is_the_first_release_and_realhf_runs_through_v0_5_1(reg):
    fw = reg.frameworks["areal"]
    assert fw.releases[:2] == ["v0.3.0", "v0.3.1"]
    t = fw.trainers["realhf"]
    assert (t.get("since"), t.get("until")) == ("v0.3.0", "v0.5.1")
    assert fw.trainers["ppo"].get("since") == "v0.3.1"           # areal/ starts at v0.3.1


@pytest.mark.parametrize("spec,release,trainer", [("areal@0.3.0", "v0.3.0", None),
                                                  ("areal/realhf@0.3.0", "v0.3.0", "realhf"),
                                                  ("areal/realhf@v0.5.1", "v0.5.1", "realhf")])
def test_realhf_releases_resolve(reg, spec, release, trainer):
    s = parse_spec(spec, reg)
    assert (s.framework, s.trainer, s.lo, s.hi) == ("areal", trainer, idx(reg, release), idx(reg, release))


def test_the_lite_tags_are_no_release_names(reg):
    # tags v0.3.0-lite, v0.3.0-lite.post1, v0.3.0-lite.post2: trackbridge/schema/versions.py reads no '-lite'
    with pytest.raises(SpecError, match="not a version"):
        parse_spec("areal@0.3.0-lite", reg)


@pytest.mark.parametrize("keys", [FIRST_ROW, MINIBATCH_ROW, ASYNC_FIRST_ROW], ids=["first", "minibatch", "async"])
def test_a_realhf_row_is_detected_as_realhf_within_its_releases(reg, keys):
    det = detect(record(keys), reg)
    assert det.spec is not None and (det.spec.framework, det.spec.trainer) == ("areal", "realhf"), det.to_json()
    assert idx(reg, "v0.3.0") <= det.spec.lo <= det.spec.hi <= idx(reg, "v0.5.1"), det.to_json()


def test_the_areal_trainer_beside_realhf_stays_ppo(reg):
    det = detect(record(AREAL_V051_STEP), reg)
    assert det.spec is not None and (det.spec.framework, det.spec.trainer) == ("areal", "ppo"), det.to_json()
    assert det.spec.lo >= idx(reg, "v0.4.1"), det.to_json()


def test_realhf_keys_translate_without_update_level(reg):
    rec = record(FIRST_ROW)
    res = Translator("areal/realhf@0.3.0", "canonical", registry=reg).translate(rec)
    for key, canon in (("ppo_actor/actor_loss/avg", "loss/policy"), ("ppo_actor/entropy/avg", "policy/entropy"),
                       ("ppo_actor/clip_ratio/avg", "policy/clip_frac"), ("ppo_actor/grad_norm", "optim/grad_norm"),
                       ("ppo_actor/param_group0/lr", "optim/lr"), ("ppo_actor/task_reward/avg", "reward/score/mean"),
                       ("ppo_actor/advantages/avg", "advantage/mean"),
                       ("ppo_actor/seq_len/avg", "sequence/length/mean"),
                       ("ppo_actor/no_eos_ratios/avg", "response/clip_ratio")):
        assert res.metrics[canon] == rec[key], key
    assert res.metrics["kl/old_policy/k1"] == -rec["ppo_actor/approx_kl/avg"]   # log pi_theta - log pi_old
    # the no-weight-decay group's lr and the log-prob stats pass through unchanged, declared as realhf's
    for key in ("ppo_actor/param_group1/lr", "ppo_actor/new_logp/avg", "ppo_actor/vocab_min_logits/avg"):
        assert key in res.unmapped and res.metrics[key] == rec[key], key
        assert reg.frameworks["areal"].logs_unmapped(key), key
    # the same step written back for realhf: no update/ level
    back = Translator("canonical", "areal/realhf@0.3.0", registry=reg).translate({"loss/policy": 0.5})
    assert back.metrics == {"ppo_actor/actor_loss/avg": 0.5}


def test_the_master_workers_e2e_time_is_the_step_time(reg):
    # realhf/system/master_worker.py@v0.3.0:356,407,490: the step's whole dataflow graph, logged as timeperf/e2e
    res = Translator("areal/realhf@0.3.0", "canonical", registry=reg).translate({"timeperf/e2e": 706.147})
    assert res.metrics == {"time/step": 706.147}
    # the areal/ trainer has no timeperf/e2e stage: its timeperf/{stage} would make it time/e2e
    res = Translator("areal/ppo@1.0.4", "canonical", registry=reg).translate({"timeperf/e2e": 1.0})
    assert "time/step" not in res.metrics


def test_realhf_rows_hold_one_mini_batch_each(reg):
    # ppo.ppo_n_minibatches defaults to 4 (realhf/api/cli_args.py@v0.3.0:609): four rows per step
    rec = {"ppo_actor/actor_loss/avg": 0.1, "ppo_actor/grad_norm": 1.0, "ppo_actor/param_group0/lr": 1e-6,
           "ppo_actor/advantages/avg": 0.0, "ppo_actor/n_valid_tokens": 161150.0}
    res = Translator("areal/realhf@0.3.0", "canonical", registry=reg).translate(rec)
    for canon in ("loss/policy", "optim/grad_norm", "perf/response_tokens_per_step"):
        assert "[deviation]" in res.approximate[canon] and "mini-batch" in res.approximate[canon], canon
    # the batch statistic (first row) and the lr (the same value in every row, after the scheduler's step) are exact
    for canon in ("advantage/mean", "optim/lr"):
        assert agrees(res.approximate.get(canon)), (canon, res.approximate.get(canon))
    res = Translator("areal/realhf@0.3.0", "canonical", registry=reg,
                     config={"ppo.ppo_n_minibatches": 1}).translate(rec)
    for canon in ("loss/policy", "optim/grad_norm", "perf/response_tokens_per_step"):
        assert "[deviation]" not in (res.approximate.get(canon) or ""), (canon, res.approximate.get(canon))


def test_task_reward_is_the_plus_minus_one_reward_not_the_raw_score(reg):
    res = Translator("areal/realhf@0.3.0", "canonical", registry=reg).translate({"ppo_actor/task_reward/avg": 0.2})
    why = res.approximate["reward/score/mean"]
    assert "[deviation]" in why and "+1/-1" in why, why
    # the areal/ trainer's task_reward is the workflow's raw reward
    res = Translator("areal/ppo@1.0.4", "canonical", registry=reg).translate({"ppo_actor/task_reward/avg": 0.2})
    assert agrees(res.approximate.get("reward/score/mean")), res.approximate.get("reward/score/mean")


def test_approx_kl_by_default_is_against_the_generations_log_probs(reg):
    res = Translator("areal/realhf@0.3.0", "openrlhf/ppo@0.11.2", registry=reg).translate(
        {"ppo_actor/approx_kl/avg": 0.01})
    assert res.metrics == {"ppo_kl": -0.01}
    why = res.approximate["ppo_kl"]
    assert "[deviation]" in why and "generation's log-prob" in why, why


@pytest.mark.parametrize("flag", ["ppo.recompute_logprob", "ppo.use_decoupled_loss"])
def test_approx_kl_with_recomputed_log_probs_is_openrlhfs_ppo_kl(reg, flag):
    config = {flag: True, "ppo.ppo_n_minibatches": 1}
    res = Translator("areal/realhf@0.3.0", "openrlhf/ppo@0.11.2", registry=reg, config=config).translate(
        {"ppo_actor/approx_kl/avg": 0.01})
    assert res.metrics == {"ppo_kl": -0.01}
    assert agrees(res.approximate.get("ppo_kl")), res.approximate.get("ppo_kl")
    # with the default four mini-batches the row is still one mini-batch's
    res = Translator("areal/realhf@0.3.0", "openrlhf/ppo@0.11.2", registry=reg, config={flag: True}).translate(
        {"ppo_actor/approx_kl/avg": 0.01})
    assert "its own tracker row" in res.approximate["ppo_kl"], res.approximate["ppo_kl"]
