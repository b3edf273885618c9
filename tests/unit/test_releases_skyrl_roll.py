"""SkyRL and ROLL at every release that logs metrics: old releases' key sets are detected as the framework with a
release range that holds them, `--from FRAMEWORK@RELEASE` resolves each release, reductions that changed between
releases are read with the release's own statement, and the audit items (ROLL's `time/step_total`).

Every fact below carries the file and tag it was read from (github.com/alibaba/ROLL and github.com/NovaSky-AI/SkyRL,
`git show TAG:FILE`); the inventories (tests/data/frameworks/{roll,skyrl}-keys.tsv) hold the full per-release key
lists and tests/unit/test_inventory_next.py checks them against the mappings."""
from __future__ import annotations

import pytest

from trackbridge.detect import detect
from trackbridge.pipeline import Translator
from trackbridge.schema.loader import load_registry
from trackbridge.schema.spec import SpecError, parse_spec
from trackbridge.translate.fidelity import judge, reference, resolve


@pytest.fixture(scope="module")
def reg():
    return load_registry()


def in_range(reg, det, framework: str, release: str) -> bool:
    fw = reg.frameworks[framework]
    i = fw.release_index(release)
    return det.spec is not None and det.spec.framework == framework and det.spec.lo <= i <= det.spec.hi


# -- ROLL ------------------------------------------------------------------------------------------------------------
ROLL_RELEASES = ["v0.1.0", "v0.1.1", "v0.1.3", "v0.2.0", "v0.2.1", "v0.3.0"]      # `git tag` of alibaba/ROLL

# A ROLL v0.1.0 RLVR step, one domain ("math"), as its tracker receives it. The actor's keys carry no @tag yet
# (roll/pipeline/rlvr/actor_worker.py@v0.1.0:104-129); critic/kl and critic/kl_coef are logged without the domain
# prefix (compute_token_reward's metrics added with metrics_mgr.add_metrics, rlvr_pipeline.py@v0.1.0:459); the
# reward stages' timers are plain time/ keys (rlvr_pipeline.py@v0.1.0:444, 452, 460, 478); no time/step_total
# (in v0.1.0 only dpo_pipeline.py logs one); the token/ and critic/ batch statistics from metrics_manager.py@v0.1.0
# add_token_metrics / add_values_metrics (critic/returns/* and critic/raw_advantages/* included: the lines of
# metrics_manager.py@v0.3.0:254-290, unchanged since v0.1.0); system/* from add_system_metrics;
# actor_train/grad_norm from megatron_strategy.py@v0.1.0:402; actor/lr from base_worker.py@v0.1.0:103.
ROLL_V010_STEP = [
    "actor/ppo_ratio_high_clipfrac", "actor/ppo_ratio_low_clipfrac", "actor/ppo_ratio_clipfrac", "actor/ratio_mean",
    "actor/ratio_max", "actor/ratio_min", "actor/clipfrac", "actor/pg_loss", "actor/weighted_pg_loss", "actor/kl_loss",
    "actor/total_loss", "actor/approxkl", "actor/policykl", "actor/valid_samples", "actor/total_samples",
    "actor/valid_sample_ratio", "actor/sample_weights_mean", "actor/sample_weights_min", "actor/sample_weights_max",
    "actor/lr", "actor_train/grad_norm",
    "critic/score/mean", "critic/score/max", "critic/score/min", "critic/rewards/mean", "critic/rewards/max",
    "critic/rewards/min", "critic/advantages/mean", "critic/advantages/max", "critic/advantages/min",
    "critic/returns/mean", "critic/returns/max", "critic/returns/min", "critic/raw_advantages/mean",
    "critic/entropy/mean", "critic/correct/mean", "critic/kl", "critic/kl_coef",
    "token/prompt_length/mean", "token/prompt_length/max", "token/response_length/mean", "token/response_length/max",
    "token/response_length/diff", "token/total_length/mean",
    "math/critic/score/mean", "math/token/response_length/mean",
    "time/step_model_update", "time/step_generate", "time/ref_log_probs_values", "time/old_log_probs",
    "time/get_sample_level_mask", "time/reward_postprocess", "time/get_token_reward", "time/compute_advantage",
    "time/step_train", "mask/final_mask_sum_eq_0",
    "system/global_step", "system/batch_size", "system/samples", "system/tps_gpu", "system/actor_train/tps_gpu",
]


def test_roll_releases_are_every_tag(reg):
    assert reg.frameworks["roll"].releases == ROLL_RELEASES


def test_roll_v010_step_is_roll_with_v010_in_range(reg):
    rec = {k: 0.5 + i / 1000 for i, k in enumerate(ROLL_V010_STEP)}
    det = detect(rec, reg)
    assert det.spec is not None and (det.spec.framework, det.spec.trainer) == ("roll", "rlvr"), det.to_json()
    assert in_range(reg, det, "roll", "v0.1.0"), det.to_json()
    assert det.unexplained == [], det.to_json()


@pytest.mark.parametrize("version, index, note", [
    ("0.1.0", 0, None), ("v0.1.1", 1, None), ("0.1.3", 2, None), ("v0.2.0", 3, None), ("0.2.1", 4, None),
    ("v0.3.0", 5, None), ("0.1.2", 1, "read as v0.1.1"),
])
def test_roll_release_specs_resolve(reg, version, index, note):
    spec = parse_spec(f"roll@{version}", reg)
    assert (spec.framework, spec.lo, spec.hi) == ("roll", index, index)
    assert (spec.note is None) if note is None else (note in spec.note)


def test_roll_older_than_first_release_is_refused(reg):
    with pytest.raises(SpecError, match="older than the first"):
        parse_spec("roll@0.0.9", reg)


@pytest.mark.parametrize("release", ["0.1.3", "0.2.0", "0.2.1", "0.3.0"])
def test_roll_step_total_is_the_previous_step_never_exact(reg, release):
    """rlvr_pipeline.py@v0.3.0:476 sets pre_step_total_time = 0 before the loop, :496 logs it as time/step_total at
    the top of each step, :842 sets it to the step's step_total_timer.last after the step (rlvr_pipeline.py@v0.1.3:437,
    454 the same): the previous step's duration, 0 at the first step. Canonical time/step is the step's own."""
    res = Translator(f"roll@{release}", "canonical", registry=reg).translate({"time/step_total": 41.5})
    assert res.metrics["time/step"] == 41.5
    why = res.approximate.get("time/step")
    assert why is not None and "[deviation]" in why and "previous step" in why, why


def test_roll_step_total_to_another_framework_is_approximate(reg):
    res = Translator("roll@0.3.0", "verl", registry=reg).translate({"time/step_total": 41.5})
    assert res.metrics == {"timing_s/step": 41.5}
    assert "previous step" in (res.approximate.get("timing_s/step") or ""), res.approximate


def test_roll_v010_v011_do_not_log_step_total(reg):
    """No time/step_total in the RLVR pipeline at v0.1.0 and v0.1.1 (only dpo_pipeline.py logs one): no entry claims
    time/step for it there, so the pipeline's key is not written back to those releases."""
    fw = reg.frameworks["roll"]
    for release in ("v0.1.0", "v0.1.1"):
        i = fw.release_index(release)
        assert not [e for e in fw.entries if e.key == "time/step_total" and e.applies("rlvr", i, i)]
    i = fw.release_index("v0.1.3")
    assert [e for e in fw.entries if e.key == "time/step_total" and e.applies("rlvr", i, i)]


def test_roll_untagged_actor_metrics_average_micro_batches(reg):
    """v0.1.x: each micro-batch's agg_loss over that micro-batch alone, np.mean over micro-batches and ranks
    (functionals.py@v0.1.0:351 reduce_metrics; protocol.py@v0.1.0:607 concat joins the ranks' lists); v0.2.0 onward:
    @sum of shares of the global token count (base_worker.py@v0.2.0:207, actor_worker.py@v0.2.0:145): the micro-batches
    and ranks pool. The default loss_agg_mode is seq-mean-token-sum at v0.1.0 (rlvr_config.py@v0.1.0:233) and
    seq-mean-token-mean from v0.1.1 (rlvr_config.py@v0.1.1:237)."""
    config = {"loss_agg_mode": "token-mean"}
    old = Translator("roll@0.1.3", "canonical", registry=reg, config=config).translate({"actor/kl_loss": 0.02})
    new = Translator("roll@0.2.0", "canonical", registry=reg, config=config).translate({"actor/kl_loss": 0.02})
    assert "[micro_batches]" in old.approximate["kl/ref/k3"] and "[processes]" in old.approximate["kl/ref/k3"]
    assert "[micro_batches]" not in new.approximate["kl/ref/k3"] and "[processes]" not in new.approximate["kl/ref/k3"]
    v010 = Translator("roll@0.1.0", "canonical", registry=reg).translate({"actor/pg_loss": 0.1})
    v011 = Translator("roll@0.1.1", "canonical", registry=reg).translate({"actor/pg_loss": 0.1})
    assert "seq-mean-token-sum, the default" in v010.approximate["loss/policy"], v010.approximate
    assert "seq-mean-token-mean, the default" in v011.approximate["loss/policy"], v011.approximate


def test_roll_v010_round_trip_and_unprefixed_reward_kl(reg):
    rec = {k: 0.5 + i / 1000 for i, k in enumerate(ROLL_V010_STEP)}
    canon = Translator("roll@0.1.0", "canonical", registry=reg).translate(rec)
    assert "critic/kl" in canon.unmapped and "mask/final_mask_sum_eq_0" in canon.unmapped
    assert canon.metrics["loss/policy"] == rec["actor/pg_loss"]
    for key, name in (("critic/rewards/max", "reward/shaped/max"), ("critic/advantages/min", "advantage/min"),
                      ("critic/returns/mean", "return/mean"), ("critic/returns/max", "return/max")):
        assert canon.metrics[name] == rec[key], key
    assert "critic/raw_advantages/mean" in canon.unmapped and "token/response_length/diff" in canon.unmapped
    back = Translator("canonical", "roll", registry=reg, origin="roll/rlvr@v0.1.0").translate(canon.metrics)
    assert back.metrics == pytest.approx(rec)


def test_roll_readme_logger_snippet_is_verl_not_roll(reg):
    """The README's logger snippet: two keys both frameworks log under these names (veRL's actor/pg_loss and
    critic/score/mean; ROLL's actor_worker.py@v0.3.0:145 "actor/pg_loss@sum", tag stripped, and
    metrics_manager.py@v0.3.0:206 f"{prefix}/score/mean" with prefix critic) and a veRL config key: veRL."""
    det = detect({"actor/pg_loss": 0.12, "critic/score/mean": 0.4}, reg, config={"algorithm.kl_ctrl.kl_coef": 0.001})
    assert det.spec is not None and det.spec.framework == "verl", det.to_json()


# -- SkyRL -----------------------------------------------------------------------------------------------------------
# The skyrl package's releases: git tags skyrl-v0.1.0, skyrl-v0.2.0, skyrl-v0.3.0 of NovaSky-AI/SkyRL and the skyrl
# 0.4.0 wheel (skyrl/__init__.py@skyrl-v0.3.0: __version__ = "0.3.0"; skyrl 0.0.1 on PyPI is an empty placeholder).
SKYRL_RELEASES = ["v0.1.0", "v0.2.0", "v0.3.0", "v0.4.0"]

# A default GRPO step of skyrl v0.1.0 (use_kl_loss on, no reward KL, no critic): the worker's status keys with the
# trainer's policy/ prefix (skyrl/backends/skyrl_train/workers/worker.py@skyrl-v0.1.0:916-925, loss_metrics/clip_ratio
# from ppo_utils.py), grad_norm from the trainer's optim_step loop (skyrl/train/trainer.py@skyrl-v0.1.0:1088), the
# trainer's reward/, loss/, trainer/ keys and timing/ Timer names (trainer.py@skyrl-v0.1.0), the generator's
# generate/ keys (skyrl/train/generators/utils.py@skyrl-v0.1.0). Not in v0.1.0: generate/batch_num_seq and
# generate/batch_padded_seq_len (trainer.py@skyrl-v0.2.0), trainer/tokens_per_second_per_gpu,
# policy/rollout_train_logprobs_abs_diff_max|min, policy/minibatch_rollout_logprobs_abs_diff_* (skyrl-v0.3.0).
SKYRL_V010_STEP = [
    "policy/policy_loss", "policy/final_loss", "policy/policy_entropy", "policy/policy_kl", "policy/policy_lr",
    "policy/response_length", "policy/loss_metrics/clip_ratio", "policy/grad_norm",
    "policy/rollout_train_logprobs_abs_diff_mean", "policy/rollout_train_logprobs_abs_diff_std",
    "reward/avg_raw_reward", "reward/avg_pass_at_5", "reward/mean_positive_reward",
    "loss/avg_final_rewards", "loss/avg_raw_advantages", "loss/avg_raw_advantages_abs",
    "generate/avg_num_tokens", "generate/max_num_tokens", "generate/min_num_tokens", "generate/std_num_tokens",
    "generate/avg_tokens_non_zero_rewards", "generate/avg_tokens_zero_rewards",
    "trainer/global_step", "trainer/epoch",
    "timing/step", "timing/generate", "timing/policy_train", "timing/fwd_logprobs_values_reward",
    "timing/compute_advantages_and_returns", "timing/train_critic_and_policy", "timing/sync_weights",
]


def test_skyrl_releases_are_the_skyrl_package(reg):
    assert reg.frameworks["skyrl"].releases == SKYRL_RELEASES


def test_skyrl_v010_step_is_skyrl_with_v010_in_range(reg):
    rec = {k: 0.5 + i / 1000 for i, k in enumerate(SKYRL_V010_STEP)}
    det = detect(rec, reg)
    assert det.spec is not None and (det.spec.framework, det.spec.trainer) == ("skyrl", "ppo"), det.to_json()
    assert in_range(reg, det, "skyrl", "v0.1.0"), det.to_json()
    assert det.unexplained == [], det.to_json()
    canon = Translator("skyrl@0.1.0", "canonical", registry=reg).translate(rec)
    back = Translator("canonical", "skyrl", registry=reg, origin="skyrl/ppo@v0.1.0").translate(canon.metrics)
    assert back.metrics == pytest.approx(rec)


@pytest.mark.parametrize("version, index", [("0.1.0", 0), ("v0.2.0", 1), ("0.3.0", 2), ("v0.4.0", 3)])
def test_skyrl_release_specs_resolve(reg, version, index):
    spec = parse_spec(f"skyrl@{version}", reg)
    assert (spec.framework, spec.lo, spec.hi, spec.note) == ("skyrl", index, index, None)


def verdict(reg, release: str, key: str, config: dict) -> str | None:
    """None (exact) or the generated reason of the unconditional skyrl entry for ``key`` at ``release`` under
    ``config``, judged against the canonical reference (the stated reduction itself, before the proof gate)."""
    fw = reg.frameworks["skyrl"]
    i = fw.release_index(release)
    (e,) = [e for e in fw.entries if e.key == key and not e.when and e.applies("ppo", i, i)]
    return judge(resolve(e, fw, "ppo", i, i, config), reference(reg.canonical.metrics[e.canonical]))


ONE_MINI_BATCH = {"trainer.train_batch_size": 256, "trainer.policy_mini_batch_size": 256}


def test_skyrl_v010_policy_loss_is_a_mean_of_micro_batch_means(reg):
    """v0.1.0: policy_loss is each micro-batch's loss_reduction mean (ppo_utils.py@skyrl-v0.1.0:983 reduce_loss),
    averaged over ranks and micro-batches (worker_utils.py@skyrl-v0.1.0:8, 27, mean for every key); v0.2.0 onward it
    is pre-scaled at the mini-batch level and summed (worker_utils.py@skyrl-v0.2.0:9 sum_loss_metrics; worker.py
    @skyrl-v0.2.0:883-890): the pooled mini-batch loss, exact with one mini-batch."""
    old = verdict(reg, "0.1.0", "policy/policy_loss", ONE_MINI_BATCH)
    assert old is not None and "[micro_batches]" in old and "[processes]" in old, old
    for release in ("0.2.0", "0.3.0", "0.4.0"):
        assert verdict(reg, release, "policy/policy_loss", ONE_MINI_BATCH) is None, release
    total = verdict(reg, "0.1.0", "policy/final_loss", {**ONE_MINI_BATCH, "trainer.algorithm.use_kl_loss": False})
    assert total is not None and "[micro_batches]" in total and "[deviation]" not in total, total


def test_skyrl_throughput_only_from_v030(reg):
    """trainer/tokens_per_second_per_gpu is first set in skyrl/train/trainer.py@skyrl-v0.3.0:500."""
    fw = reg.frameworks["skyrl"]
    claims = {r: bool([e for e in fw.entries if e.key == "trainer/tokens_per_second_per_gpu"
                       and e.applies("ppo", fw.release_index(r), fw.release_index(r))]) for r in SKYRL_RELEASES}
    assert claims == {"v0.1.0": False, "v0.2.0": False, "v0.3.0": True, "v0.4.0": True}
