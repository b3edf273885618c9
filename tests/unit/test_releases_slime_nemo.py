"""slime and NeMo-RL at every release that logs metrics (slime v0.1.0..v0.3.1, NeMo-RL v0.1.0..v0.7.0): the old
releases' key sets are detected as theirs and translated with those releases' entries, `FRAMEWORK@RELEASE` resolves
for each, and the audit items of the step time and the rollout-side response length say what the source does.

Every fact below was read from the framework's source at the tag (cited file@tag:line) and is restated here, not read
from the mapping or the inventory, so a mapping that drifts from the source fails."""
from __future__ import annotations

import pytest

from trackbridge.detect import detect
from trackbridge.pipeline import Translator
from trackbridge.schema.loader import load_registry
from trackbridge.schema.proofs import UNPROVEN
from trackbridge.schema.spec import SpecError, parse_spec
from trackbridge.translate.fidelity import judge, reference, resolve


@pytest.fixture(scope="module")
def reg():
    return load_registry()


def record(keys) -> dict:
    return {k: 0.5 + i / 100 for i, k in enumerate(keys)}


def verdict(reg, framework: str, trainer: str, release: str, key: str, config: dict | None = None) -> str | None:
    """None (exact) or the reason, for the unconditional entry of ``key`` at ``release`` against its canonical name."""
    fw = reg.frameworks[framework]
    i = fw.release_index(release)
    [e] = [e for e in fw.entries if e.key == key and not e.when and e.applies(trainer, i, i)]
    return judge(resolve(e, fw, trainer, i, i, config or {}), reference(reg.canonical.metrics[e.canonical]))


# -- releases ----------------------------------------------------------------------------------------------------------
# git tags of github.com/THUDM/slime and github.com/NVIDIA-NeMo/RL (each logs metrics through wandb/its Logger)
SLIME_TAGS = ["v0.1.0", "v0.2.0", "v0.2.0.post1", "v0.2.1", "v0.2.2", "v0.2.3", "v0.2.4", "v0.3.0", "v0.3.1"]
NEMO_TAGS = ["v0.1.0", "v0.1.1", "v0.2.0", "v0.2.1", "v0.3.0", "v0.3.1", "v0.4.0", "v0.5.0", "v0.6.0", "v0.7.0"]


def test_every_release_is_listed_oldest_first(reg):
    assert reg.frameworks["slime"].releases == SLIME_TAGS
    assert reg.frameworks["nemo_rl"].releases == NEMO_TAGS


@pytest.mark.parametrize("spec,framework,release", [
    *[(f"slime@{t}", "slime", t) for t in SLIME_TAGS], ("slime@0.2.0.post1", "slime", "v0.2.0.post1"),
    *[(f"nemo_rl@{t}", "nemo_rl", t) for t in NEMO_TAGS], ("nemo-rl@0.1.1", "nemo_rl", "v0.1.1")])
def test_each_release_resolves(reg, spec, framework, release):
    s = parse_spec(spec, reg)
    fw = reg.frameworks[framework]
    assert s.framework == framework and s.lo == s.hi == fw.release_index(release)


@pytest.mark.parametrize("spec", ["slime@0.0.9", "nemo_rl@0.0.1"])
def test_a_release_before_the_first_is_refused(reg, spec):
    with pytest.raises(SpecError):
        parse_spec(spec, reg)


# -- slime v0.1.0 --------------------------------------------------------------------------------------------------
# the rollout/step rows of v0.1.0: rollout/<field> of the training batch (slime/ray/buffer.py@v0.1.0:118-152 train_data,
# slime/backends/utils/data.py@v0.1.0:82 total_lengths; slime/backends/megatron_utils/data.py@v0.1.0:162-197 logs
# every field), the rollout manager's perf/ (ray/buffer.py@v0.1.0:188-190) and the timers' perf/
# (data.py@v0.1.0:359-378; perf/total_train_time is v0.1.0's name, train_metric_utils.py@v0.2.0:40 calls it
# perf/step_time)
SLIME_V010_ROLLOUT_STEP = [
    "rollout/raw_reward", "rollout/rewards", "rollout/response_lengths", "rollout/total_lengths", "rollout/truncated",
    "rollout/log_probs", "rollout/ref_log_probs", "rollout/advantages", "rollout/returns",
    "perf/rollout_time", "perf/tokens_per_gpu_per_sec", "perf/longest_sample_tokens_per_sec",
    "perf/train_time", "perf/train_wait_time", "perf/actor_train_time", "perf/data_preprocess_time",
    "perf/log_probs_time", "perf/ref_log_probs_time", "perf/log_probs_tflops", "perf/ref_log_probs_tflops",
    "perf/actor_train_tflops", "perf/total_train_time", "perf/wait_time_ratio"]
# the train/step rows: reported_loss (megatron_utils/loss.py@v0.1.0:313-322), grad_norm and lr (model.py@v0.1.0:459-464)
SLIME_V010_TRAIN_STEP = ["train/loss", "train/pg_loss", "train/entropy_loss", "train/pg_clipfrac", "train/ppo_kl",
                         "train/kl_loss", "train/grad_norm", "train/lr-pg_0"]


@pytest.mark.parametrize("keys", [SLIME_V010_ROLLOUT_STEP, SLIME_V010_TRAIN_STEP], ids=["rollout_step", "train_step"])
def test_slime_v010_rows_are_slime(reg, keys):
    det = detect(record(keys), reg)
    assert det.spec is not None and (det.spec.framework, det.spec.trainer) == ("slime", "rl"), det.to_json()
    fw = reg.frameworks["slime"]
    lo, hi = det.spec.bounds(len(fw.releases))
    assert lo <= fw.release_index("v0.1.0") <= hi, det.source


def test_slime_v010_step_time_is_perf_total_train_time(reg):
    rec = record(SLIME_V010_ROLLOUT_STEP)
    res = Translator("slime@v0.1.0", "canonical", registry=reg).translate(rec)
    assert res.metrics["time/step"] == rec["perf/total_train_time"]
    assert res.metrics["time/train_wait"] == rec["perf/train_wait_time"]         # the perf/{stage}_time template
    assert "perf/tokens_per_gpu_per_sec" in res.unmapped                             # passthrough
    # the same quantity renamed in v0.2.0: exact between the two releases both ways
    new = Translator("slime@v0.1.0", "slime@v0.3.1", registry=reg).translate({"perf/total_train_time": 12.0})
    assert new.metrics == {"perf/step_time": 12.0} and not new.approximate
    old = Translator("slime@v0.3.1", "slime@v0.1.0", registry=reg).translate({"perf/step_time": 12.0})
    assert old.metrics == {"perf/total_train_time": 12.0} and not old.approximate


def test_slime_keys_first_logged_after_v010(reg):
    fw = reg.frameworks["slime"]
    v010, v020 = fw.release_index("v0.1.0"), fw.release_index("v0.2.0")
    # slime/ray/rollout.py@v0.2.0:528-539 compute_metrics_from_samples is new in v0.2.0 (ray/buffer.py@v0.1.0:182-198
    # logs only perf/), so are the eval pass@k (compute_pass_rate) and the critic's rollout/values
    for key, entry in (("rollout/response_len/mean", None), ("rollout/truncated_ratio", None),
                       ("eval/aime-pass@1", "eval/{data_source}-pass@{n}"),
                       ("eval/aime/response_len/mean", "eval/{data_source}/response_len/mean"),
                       ("rollout/values", None), ("perf/step_time", None)):
        hits = [e for e, _ in fw.lookup(key) if not e.when and e.key == (entry or key)]
        assert hits and all(not e.applies("rl", v010, v010) for e in hits), key
        assert any(e.applies("rl", v020, v020) for e in hits), key
    # rollout/zero_std/count_<reward> (rollout.py@v0.2.0:543-556) is declared: passed through, counted by detection
    assert fw.logs_unmapped("rollout/zero_std/count_1.0") and not fw.lookup("rollout/zero_std/count_1.0")
    # train/tis, train/tis_clipfrac exist only in v0.1.0 (megatron_utils/loss.py@v0.1.0:325-327)
    assert fw.logs_unmapped("train/tis") and fw.logs_unmapped("train/tis_clipfrac")


def test_slime_v010_kl_loss_type_default_is_kl(reg):
    # slime/utils/arguments.py@v0.1.0: --kl-loss-type choices kl, k2, k3, low_var_kl, default "kl" (k1); v0.2.0: "k1"
    fw = reg.frameworks["slime"]
    by_release = {}
    for c in fw.config:
        if getattr(c, "key", None) == "kl_loss_type":
            by_release[(c.since, c.until)] = c.default
    assert "kl" in by_release.values() and "k1" in by_release.values(), by_release
    res = Translator("slime@v0.1.0", "canonical", registry=reg, config={"kl_loss_type": "kl", "use_kl_loss": True}) \
        .translate({"train/kl_loss": 0.01})
    assert res.metrics == {"kl/ref/k1": 0.01}


# -- audit: slime perf/step_time -------------------------------------------------------------------------------
# slime/backends/megatron_utils/actor.py@v0.3.1:427 `with inverse_timer("train_wait"), timer("train")`: the wait timer
# is stopped when train() starts and restarted when it returns (slime/utils/timer.py@v0.3.1:84-89), so perf/step_time =
# train_wait + train (train_metric_utils.py@v0.3.1:44-47) runs from the end of one train() to the end of the next,
# through train.py@v0.3.1's save_model (:76), update_weights (:85), eval (:91) and the next generate (:53).
@pytest.mark.parametrize("src,key", [("slime@v0.3.1", "perf/step_time"), ("slime@v0.2.0", "perf/step_time"),
                                     ("slime@v0.1.0", "perf/total_train_time")])
def test_slime_step_time_differs_by_definition_from_verl(reg, src, key):
    tr = Translator(src, "verl", registry=reg)
    res = tr.translate({key: 30.0})
    assert res.metrics == {"timing_s/step": 30.0}
    why = res.approximate["timing_s/step"]
    assert not why.startswith(UNPROVEN), why                       # not an equality waiting for its proof
    assert "[deviation]" in why and "previous iteration's checkpoint save, weight update and evaluation" in why, why


def test_slime_step_time_against_canonical(reg):
    for release, key in (("v0.3.1", "perf/step_time"), ("v0.1.0", "perf/total_train_time")):
        why = verdict(reg, "slime", "rl", release, key)
        assert why is not None and "[deviation]" in why and "train_wait" in why, why


# -- audit: slime rollout/response_len/* over the kept samples ------------------------------------------------
# slime/rollout/sglang_rollout.py@v0.3.1:424-439,468: every finished group goes to all_data, only the groups the
# dynamic-sampling filter keeps (up to rollout_batch_size) to data, which is returned; RolloutManager.generate logs that
# list (slime/ray/rollout.py@v0.3.1:560-562), compute_metrics_from_samples takes compute_statistics of its
# effective_response_length (rollout.py@v0.3.1:1312-1316)
def test_slime_response_len_is_over_the_kept_samples(reg):
    why = verdict(reg, "slime", "rl", "v0.3.1", "rollout/response_len/mean")
    assert "[deviation]" in why and "kept samples" in why, why
    assert "[tool_tokens]" in why, why                                   # effective_response_length = sum(loss_mask)
    # prime-rl's every-rollout mean (train/agg/all/num_output_tokens/mean: all rollouts, before filtering, tool
    # tokens left out too): the one difference left is the population, and it is said
    res = Translator("slime@v0.3.1", "prime_rl", registry=reg).translate({"rollout/response_len/mean": 812.0})
    assert res.metrics == {"train/agg/all/num_output_tokens/mean": 812.0}
    why = res.approximate["train/agg/all/num_output_tokens/mean"]
    assert not why.startswith(UNPROVEN) and "[deviation]" in why and "kept samples" in why, why
    assert "[tool_tokens]" not in why, why
    # the same population for the truncation share (rollout.py@v0.3.1:1323) and at the first release that logs them
    for release in ("v0.2.0", "v0.3.1"):
        assert "kept samples" in verdict(reg, "slime", "rl", release, "rollout/truncated_ratio")
        assert "kept samples" in verdict(reg, "slime", "rl", release, "rollout/response_len/mean")


# -- NeMo-RL v0.1.0..v0.3.1 ---------------------------------------------------------------------------------
# a v0.1.0 GRPO step: ClippedPGLossFn's dict (nemo_reinforcer/algorithms/loss_functions.py@v0.1.0:130-139), the policy's
# lr (models/policy/hf_policy.py@v0.1.0:290), grpo_train's loss/reward and generate_responses' metrics
# (algorithms/grpo.py@v0.1.0:318-323,626-631) and its timers (grpo.py@v0.1.0:453-634)
NEMO_V010_STEP = ["train/loss", "train/reward", "train/lr", "train/kl_penalty", "train/probs_ratio",
                  "train/probs_ratio_clamped", "train/token_mult_prob_error", "train/mean_generation_length",
                  "train/max_seqlen", *(f"timing/train/{t}" for t in (
                      "total_step_time", "generation", "policy_training", "policy_and_reference_logprobs",
                      "reward_calculation", "data_processing", "training_prep", "logprob_inference_prep",
                      "prepare_for_generation"))]


def test_nemo_rl_v010_step_is_nemo_rl_not_trl(reg):
    rec = record(NEMO_V010_STEP)
    det = detect(rec, reg)
    assert det.spec is not None and (det.spec.framework, det.spec.trainer) == ("nemo_rl", "grpo"), det.to_json()
    fw = reg.frameworks["nemo_rl"]
    lo, hi = det.spec.bounds(len(fw.releases))
    assert lo <= fw.release_index("v0.1.0") <= hi < fw.release_index("v0.2.0"), det.source
    res = Translator("auto", "canonical", registry=reg).translate(rec)
    assert res.metrics["response/length/mean"] == rec["train/mean_generation_length"]
    assert res.metrics["loss/total"] == rec["train/loss"]
    assert res.metrics["time/step"] == rec["timing/train/total_step_time"]
    assert "train/max_seqlen" in res.unmapped


def test_nemo_rl_reductions_before_and_after_global_normalisation(reg):
    # up to v0.2.0 each micro-batch's local token mean, np.mean'ed (loss_functions.py@v0.1.0:104,120;
    # grpo.py@v0.1.0:631): an unweighted mean over micro-batches; v0.2.1 divides by the global valid-token count and
    # np.sum's (dtensor_policy_worker.py@v0.2.1:409-413, grpo.py@v0.2.1:572-576): pooled within a global batch
    for release in ("v0.1.0", "v0.2.0"):
        why = verdict(reg, "nemo_rl", "grpo", release, "train/loss")
        assert "[micro_batches]" in why and "[processes]" in why, (release, why)
    for release in ("v0.2.1", "v0.7.0"):
        why = verdict(reg, "nemo_rl", "grpo", release, "train/loss") or ""
        assert "[micro_batches]" not in why and "[processes]" not in why, (release, why)
    # the learning rate: the scheduler steps after every global batch up to v0.2.0 (hf_policy.py@v0.1.0:303-304), so
    # np.mean over micro-batches averages several global batches' rates; once per step from v0.2.1
    # (dtensor_policy_worker.py@v0.2.1:453)
    assert "[mini_batches]" in verdict(reg, "nemo_rl", "grpo", "v0.1.0", "train/lr",
                                       {"grpo.num_prompts_per_step": 64})
    assert "[mini_batches]" not in verdict(reg, "nemo_rl", "grpo", "v0.7.0", "train/lr",
                                           {"grpo.num_prompts_per_step": 64})


def test_nemo_rl_keys_by_first_release(reg):
    fw = reg.frameworks["nemo_rl"]
    # train/grad_norm joins grpo_train's metrics in v0.2.1 (grpo.py@v0.2.1 metrics dict), approx_entropy the loss
    # function's dict in v0.2.1, gen_kl_error in v0.4.0, multi-turn rollout metrics in v0.2.0
    # (experience/rollouts.py@v0.2.0:365-378)
    for key, first in (("train/grad_norm", "v0.2.1"), ("train/approx_entropy", "v0.2.1"),
                       ("train/gen_kl_error", "v0.4.0"), ("train/mean_gen_tokens_per_sample", "v0.2.0"),
                       ("train/mean_total_tokens_per_sample", "v0.3.0"), ("performance/tokens_per_sec", "v0.4.0"),
                       ("train/mean_generation_length", "v0.1.0")):
        hits = [e for e, _ in fw.lookup(key) if not e.when]
        claimed = [fw.release_name(i) for i in range(len(fw.releases)) if any(e.applies("grpo", i, i) for e in hits)]
        assert claimed and claimed[0] == first, (key, claimed)


# -- audit: NeMo-RL total_step_time against veRL's timing_s/step ---------------------------------------------------
# nemo_rl/algorithms/grpo.py@v0.7.0:2258 `with timer.time("total_step_time")` holds the validation (:2758) and the
# checkpointing (:2928) of the steps that run them (so at v0.1.0: grpo.py@v0.1.0:453,578,608). veRL's `step` timer holds
# `testing` and `save_checkpoint` the same way (verl/trainer/ppo/ray_trainer.py@v0.4.1:979,1152,1159;
# @v0.7.0:1357,1567,1590; @v0.9.1:1508,1711,1730; verl/trainer/ppo/v1/trainer_base.py@v0.9.1:473,484,494): the two
# keys state the same definition, so the pair is an equality awaiting its proof, not a difference of definition;
# against slime's step time (above) the difference is stated.
def test_nemo_rl_step_time_has_verl_s_definition(reg):
    res = Translator("nemo_rl@v0.7.0", "verl", registry=reg).translate({"timing/train/total_step_time": 41.0})
    assert res.metrics == {"timing_s/step": 41.0}
    why = res.approximate.get("timing_s/step")
    assert why is None or (why.startswith(UNPROVEN) and "[deviation]" not in why), why
    assert verdict(reg, "nemo_rl", "grpo", "v0.1.0", "timing/train/total_step_time") is None
    res = Translator("nemo_rl@v0.7.0", "slime@v0.3.1", registry=reg).translate({"timing/train/total_step_time": 41.0})
    assert "[deviation]" in res.approximate["perf/step_time"] and "train_wait" in res.approximate["perf/step_time"]
