"""prime-rl at every release that logs metrics (mappings/prime_rl.yaml, tests/data/frameworks/prime-rl-keys.tsv):
logs of the older releases (v0.1 of 2025-07, the zeroband code base; v0.2 of 2025-12, whose names are
progress/problems, batch/solve_all, completion_len/*, time/generate_completions) and of the newest tag (off_policy/*,
time/pack, train/agg/all/cancelled/mean) are detected as prime-rl at the right releases, `prime_rl@<release>`
resolves, renamed keys translate at their own releases only, and the three audit items are stated: the lagging
progress totals, the populations of progress/tokens vs progress/output_tokens, and the policy drift inside the
mismatch KL. The keys below are read from github.com/PrimeIntellect-ai/prime-rl at the tags (`git show TAG:PATH`),
cited file@tag:line."""
from __future__ import annotations

import pytest

from trackbridge.detect import detect
from trackbridge.pipeline import Translator
from trackbridge.schema.loader import load_registry
from trackbridge.schema.spec import parse_spec

from _support.unproven import agrees


@pytest.fixture(scope="module")
def reg():
    return load_registry()


# A v0.1 run (2025-07-03, src/zeroband): the trainer's dict (src/zeroband/train.py@v0.1:430-461, with the
# MetricsAverager keys of :326-402), its time metrics (:524-531) and an inference worker's, with wandb's prefix
# infer/ (src/zeroband/infer.py@v0.1:442-474; utils/monitor.py@v0.1:177-179 adds the prefix).
V01 = ["losses/Loss", "train/rollout_step", "train/inner_lr", "train/total_tokens", "train/total_samples",
       "losses/grad_norm", "lengths/padding_proportion", "rewards/sample_reward", "rewards/task_reward",
       "lengths/seq_lens", "lengths/length_penalties", "lengths/target_lengths", "losses/pg_loss",
       "losses/entropy_loss", "losses/clip_ratio", "perf/tokens_per_second", "perf/tokens_per_second_per_gpu",
       "perf/mfu", "perf/time_rollout_step", "perf/time_logprob", "perf/time_data_loading", "perf/time_packing",
       "perf/time_data_preprocessing", "perf/time_rollout_delete", "infer/progress/batch_problems",
       "infer/progress/batch_samples", "infer/progress/batch_tokens", "infer/progress/step",
       "infer/performance/batch_tokens_per_second", "infer/performance/batch_samples_per_minute",
       "infer/performance/batch_avg_seq_length", "infer/rewards/batch_reward"]

# A v0.2 run (2025-12-30): the trainer's dicts (src/prime_rl/trainer/rl/train.py@v0.2:406-433, tensor stats of
# Tensors.compute_stats, trainer/utils.py@v0.2:219-223, of tensors entropy/loss (train.py@v0.2:339-340) and the
# loss's mismatch_kl/is_masked (loss.py@v0.2:140-145)) and the orchestrator's step dict
# (src/prime_rl/orchestrator/orchestrator.py@v0.2:398-450).
V02_TRAINER = ["perf/throughput", "perf/throughput_per_gpu", "perf/mfu", "perf/peak_memory", "optim/lr",
               "optim/grad_norm", "time/step", "time/wait_for_batch", "time/load_data", "time/broadcast_weights",
               "time/save_ckpt", "time/forward_backward",
               *(f"{t}/{s}" for t in ("entropy", "loss", "mismatch_kl", "is_masked", "geo_seq_ratio")
                 for s in ("mean", "median", "std", "min", "max"))]
V02_ORCHESTRATOR = ["progress/tokens", "progress/samples", "progress/problems", "progress/total_tokens",
                    "progress/total_samples", "progress/total_problems", "progress/ckpt_step",
                    *(f"{q}/{s}" for q in ("seq_len", "prompt_len", "completion_len", "is_truncated", "num_turns",
                                            "generation_ms", "scoring_ms") for s in ("mean", "max", "min")),
                    "reward/mean", "batch/solve_none", "batch/solve_all", "batch/effective_batch_size",
                    "error/mean", "time/step", "time/generate_completions", "time/save_ckpt"]

# The newest tag v0.8.1.dev67: the orchestrator's step dict (orchestrator.py@v0.8.1.dev67:713-741: time/pack,
# off_policy/*) and the episode metrics (orchestrator/metrics.py@v0.8.1.dev67:329-333: has_error, cancelled), the
# trainer without optim/zero_grad_ratio (train.py@v0.8.1.dev67:660-666).
DEV67_ORCHESTRATOR = ["progress/tokens", "progress/input_tokens", "progress/output_tokens", "progress/rollouts",
                      "progress/tasks", "progress/total_tokens", "progress/total_rollouts", "progress/total_tasks",
                      "time/step", "time/pack", "time/save_ckpt", "time/wait_for_policy",
                      "off_policy/mean", "off_policy/max", "off_policy/in_flight/mean", "off_policy/in_flight/max",
                      "off_policy/in_queue/mean", "off_policy/in_queue/max", "off_policy/dropped",
                      "train/agg/all/has_error/mean", "train/agg/all/cancelled/mean",
                      *(f"train/agg/{sub}/{d}/{s}" for sub in ("all", "effective")
                        for d in ("num_total_tokens", "num_output_tokens", "num_turns") for s in ("mean", "max"))]
DEV67_TRAINER = ["perf/throughput", "perf/throughput_per_gpu", "perf/mfu", "perf/peak_memory", "optim/lr",
                 "optim/grad_norm", "time/step", "time/forward_backward", "entropy/all/mean", "entropy/all/max",
                 "mismatch_kl/all/mean", "mismatch_kl/all/std", "loss/mean", "loss/std", "kl_ent_ratio/mean",
                 "masked_mismatch_kl/mean", "is_masked/mean", "masked_advantage_positive/mean"]


def releases_of(reg, det):
    fw = reg.frameworks["prime_rl"]
    lo, hi = det.spec.bounds(len(fw.releases))
    return [r for i, r in enumerate(fw.releases) if lo <= i <= hi]


def test_the_releases_from_v0_2_to_the_newest_tag_resolve(reg):
    fw = reg.frameworks["prime_rl"]
    for release in ("v0.1", "v0.2", "v0.3.0", "v0.4.0", "v0.5.0", "v0.6.0", "v0.7.0", "v0.8.0", "v0.8.1.dev67"):
        spec = parse_spec(f"prime_rl@{release}", reg)
        assert spec.framework == "prime_rl" and spec.note is None, (release, spec)
        assert fw.release_name(int(spec.lo)) == release and spec.lo == spec.hi, (release, spec)
    order = [fw.releases.index(r) for r in ("v0.1", "v0.2", "v0.8.0", "v0.8.1.dev67")]
    assert order == sorted(order)


def test_a_v0_1_zeroband_log_is_prime_rl_at_v0_1(reg):
    det = detect(set(V01), reg)
    assert det.spec is not None and det.spec.framework == "prime_rl", det.to_json()
    assert releases_of(reg, det) == ["v0.1"]
    rec = {k: 10.0 + i for i, k in enumerate(V01)}
    res = Translator("prime_rl@v0.1", "canonical", registry=reg).translate(rec)
    for key, canon in (("losses/grad_norm", "optim/grad_norm"), ("train/inner_lr", "optim/lr"),
                       ("train/total_tokens", "progress/tokens"), ("train/total_samples", "progress/samples"),
                       ("perf/tokens_per_second", "perf/tokens_per_s"),
                       ("perf/tokens_per_second_per_gpu", "perf/throughput")):
        assert res.metrics[canon] == rec[key], key
    assert res.metrics["perf/mfu/policy_update"] == pytest.approx(rec["perf/mfu"] / 100)     # percent
    # the tokens counted are the packed micro-batches' full shape (train.py@v0.1:422-425): padding included
    assert "padding" in (res.approximate.get("progress/tokens") or ""), res.approximate
    fw = reg.frameworks["prime_rl"]
    assert all(fw.logs_unmapped(k) for k in ("losses/Loss", "losses/pg_loss", "infer/progress/batch_tokens"))


def test_a_v0_2_log_is_prime_rl_at_the_old_releases(reg):
    det = detect(set(V02_TRAINER) | set(V02_ORCHESTRATOR), reg)
    assert det.spec is not None and (det.spec.framework, det.spec.trainer) == ("prime_rl", "rl"), det.to_json()
    found = releases_of(reg, det)
    assert "v0.2" in found and not {"v0.1", "v0.5.0", "v0.6.0", "v0.7.0", "v0.8.0"} & set(found), found
    res = Translator("prime_rl@v0.2", "canonical", registry=reg).translate(
        {k: 1.0 + i for i, k in enumerate(V02_TRAINER + V02_ORCHESTRATOR)})
    assert res.metrics["response/length/mean"] == 1.0 + (V02_TRAINER + V02_ORCHESTRATOR).index("completion_len/mean")
    assert {"progress/tokens", "perf/tokens_per_step", "sampling/num_samples", "reward/score/mean",
            "time/generate_completions", "policy/entropy", "kl/rollout/k3"} <= set(res.metrics)
    fw = reg.frameworks["prime_rl"]
    for key in ("progress/problems", "batch/solve_all", "batch/solve_none", "seq_len/max", "geo_seq_ratio/mean"):
        assert key in res.unmapped and key in res.metrics and fw.logs_unmapped(key), key   # passed through


def test_the_newest_tag_log_is_prime_rl_at_the_newest_tag(reg):
    det = detect(set(DEV67_TRAINER) | set(DEV67_ORCHESTRATOR), reg)
    assert det.spec is not None and det.spec.framework == "prime_rl", det.to_json()
    found = releases_of(reg, det)
    assert "v0.8.1.dev67" in found and "v0.6.0" not in found, found


def test_renamed_keys_translate_at_their_own_releases(reg):
    # entropy/mean until v0.5.0 (train.py@v0.5.0:441 tensors["entropy"]), entropy/all/mean from v0.6.0
    # (train.py@v0.6.0:496 tensors["entropy/all"])
    old = Translator("prime_rl@v0.5.0", "canonical", registry=reg).translate({"entropy/mean": 0.7})
    assert old.metrics["policy/entropy"] == 0.7 and agrees(old.approximate.get("policy/entropy"))
    new = Translator("prime_rl@v0.6.0", "canonical", registry=reg).translate({"entropy/all/mean": 0.6})
    assert new.metrics["policy/entropy"] == 0.6
    late = Translator("prime_rl@v0.8.0", "canonical", registry=reg).translate({"entropy/mean": 0.7})
    assert any("nearest release" in n and "entropy/mean" in n for n in late.notes), late.notes   # not v0.8.0's
    # progress/total_samples (orchestrator.py@v0.5.0:714) -> progress/total_rollouts (orchestrator.py@v0.7.0:594)
    assert Translator("prime_rl@v0.5.0", "canonical", registry=reg).translate(
        {"progress/total_samples": 64.0}).metrics["progress/samples"] == 64.0
    assert Translator("prime_rl@v0.7.0", "canonical", registry=reg).translate(
        {"progress/total_rollouts": 64.0}).metrics["progress/samples"] == 64.0


def test_the_progress_totals_lag_one_step_from_v0_6_0(reg):
    """orchestrator.py@v0.8.0:678-679 logs progress.total_tokens / total_samples, :716-717 add the step's own
    afterwards: step N holds the total through step N-1 (metrics.py@v0.6.0:92-93 vs orchestrator.py@v0.6.0:655-656;
    orchestrator.py@v0.8.1.dev67:719-720 vs :753-754). Until v0.5.0 the step's tokens are added first
    (orchestrator.py@v0.2:383-384 before :403-404)."""
    for release, keys in (("v0.6.0", ("progress/total_tokens", "progress/total_samples")),
                          ("v0.8.0", ("progress/total_tokens", "progress/total_rollouts")),
                          ("v0.8.1.dev67", ("progress/total_tokens", "progress/total_rollouts"))):
        res = Translator(f"prime_rl@{release}", "canonical", registry=reg).translate({k: 1000.0 for k in keys})
        for canon in ("progress/tokens", "progress/samples"):
            assert res.metrics[canon] == 1000.0, (release, canon)
            assert "N-1" in (res.approximate.get(canon) or ""), (release, canon, res.approximate)
    res = Translator("prime_rl@v0.2", "canonical", registry=reg).translate(
        {"progress/total_tokens": 1000.0, "progress/total_samples": 8.0})
    assert res.metrics["progress/tokens"] == 1000.0 and agrees(res.approximate.get("progress/tokens"))
    assert agrees(res.approximate.get("progress/samples"))


def test_tokens_and_output_tokens_are_of_different_populations(reg):
    """progress/tokens sums every arrival (batch.rollouts, orchestrator.py@v0.8.0:667; batch.episodes,
    orchestrator.py@v0.8.1.dev67:708), progress/output_tokens only the effective subset (:669 / :710), which the
    default zero-advantage filter thins (post_batch_filters ZeroAdvantageFilterConfig(),
    packages/prime-rl-configs/src/prime_rl/configs/orchestrator.py@v0.8.0:499; filter_zero_advantages = True,
    packages/prime-rl-configs/src/prime_rl/configs/orchestrator.py@v0.8.1.dev67:270)."""
    for release in ("v0.7.0", "v0.8.0", "v0.8.1.dev67"):
        res = Translator(f"prime_rl@{release}", "canonical", registry=reg).translate(
            {"progress/tokens": 5000.0, "progress/output_tokens": 1200.0})
        assert res.metrics["perf/tokens_per_step"] == 5000.0
        assert res.metrics["perf/response_tokens_per_step"] == 1200.0
        assert "zero-advantage" in (res.approximate.get("perf/tokens_per_step") or ""), res.approximate
        assert "effective" in (res.approximate.get("perf/response_tokens_per_step") or ""), res.approximate


def test_the_mismatch_kl_holds_policy_drift(reg):
    """mismatch_kl is r - log r - 1 with the trainer's log-probs of the policy at the training step, which runs
    up to max_off_policy_steps (default 8: packages/prime-rl-configs/src/prime_rl/configs/orchestrator.py@v0.8.0:565)
    ahead of the sampling policy: not the pure inference-vs-trainer mismatch of kl/rollout/*; against veRL's
    rollout-correction KL it is approximate with that reason."""
    for release, key in (("v0.2", "mismatch_kl/mean"), ("v0.8.0", "mismatch_kl/all/mean"),
                         ("v0.8.1.dev67", "mismatch_kl/all/mean")):
        res = Translator(f"prime_rl@{release}", "canonical", registry=reg).translate({key: 0.01})
        assert res.metrics["kl/rollout/k3"] == 0.01
        assert "policy drift" in (res.approximate.get("kl/rollout/k3") or ""), (release, res.approximate)
    res = Translator("prime_rl@v0.8.0", "verl", registry=reg).translate({"mismatch_kl/all/mean": 0.01})
    assert res.metrics["rollout_corr/k3_kl"] == 0.01
    assert "policy drift" in (res.approximate.get("rollout_corr/k3_kl") or ""), res.approximate
    # OpenRLHF's vllm_kl and veRL's rollout_corr/kl are k1 (kl/rollout/k1): prime-rl's k3 is not written as them,
    # and it keeps its reason on the canonical name it stays under
    res = Translator("prime_rl@v0.8.0", "openrlhf", registry=reg).translate({"mismatch_kl/all/mean": 0.01})
    assert "vllm_kl" not in res.metrics and res.metrics["kl/rollout/k3"] == 0.01
    assert "policy drift" in (res.approximate.get("kl/rollout/k3") or ""), res.approximate
    back = Translator("verl", "prime_rl@v0.8.0", registry=reg).translate({"rollout_corr/k3_kl": 0.01})
    assert back.metrics["mismatch_kl/all/mean"] == 0.01
    assert "policy drift" in (back.approximate.get("mismatch_kl/all/mean") or ""), back.approximate


def test_the_trainer_scales_and_rates_changed_at_v0_6_0(reg):
    """Until v0.5.0 each micro-batch's loss is divided by its own rank's loss-masked tokens (train.py@v0.5.0:308-309),
    from v0.6.0 by the all-reduced global count (train.py@v0.6.0:358-362); until v0.5.0 perf/throughput is
    PerfCounter's 10-step rolling rate over wall time (train.py@v0.5.0:499, trainer/perf.py@v0.2:46-49, :219), from
    v0.6.0 the step's tokens over its forward-backward seconds (train.py@v0.6.0:597). Until v0.4.0 the orchestrator
    logs a perf/throughput of its own (orchestrator.py@v0.2:432)."""
    rec = {"loss/mean": 0.2, "perf/throughput": 9000.0, "perf/throughput_per_gpu": 1125.0}
    old = Translator("prime_rl@v0.4.0", "canonical", registry=reg).translate(rec)
    new = Translator("prime_rl@v0.6.0", "canonical", registry=reg).translate(rec)
    assert old.metrics["loss/total"] == new.metrics["loss/total"] == 0.2
    assert "own rank's" in old.approximate["loss/total"] and "global" in new.approximate["loss/total"]
    assert "rolling" in old.approximate["perf/tokens_per_s"] and "orchestrator" in old.approximate["perf/tokens_per_s"]
    assert "rolling" in old.approximate["perf/throughput"]
    assert "forward-backward" in new.approximate["perf/tokens_per_s"]
    assert "forward-backward" in new.approximate["perf/throughput"]
    v05 = Translator("prime_rl@v0.5.0", "canonical", registry=reg).translate(rec)
    assert "rolling" in v05.approximate["perf/tokens_per_s"]
    assert "orchestrator" not in v05.approximate["perf/tokens_per_s"]


def test_the_old_orchestrator_lengths_and_reward(reg):
    """v0.2-v0.4.0: completion_len/mean, seq_len/mean, prompt_len/mean and reward/mean over the step's rollouts
    (orchestrator.py@v0.2:408-434), v0.5.0-v0.6.0 seq_len/all/mean and reward/all/mean (orchestrator.py@v0.5.0:718,
    :750); from v0.7.0 the reward is per agent only, the lengths train/agg/<subset>/num_output_tokens/*."""
    rec = {"completion_len/mean": 300.0, "seq_len/mean": 420.0, "prompt_len/mean": 120.0, "reward/mean": 0.4}
    res = Translator("prime_rl@v0.3.0", "canonical", registry=reg).translate(rec)
    for key, canon in (("completion_len/mean", "response/length/mean"), ("seq_len/mean", "sequence/length/mean"),
                       ("prompt_len/mean", "prompt/length/mean"), ("reward/mean", "reward/score/mean")):
        assert res.metrics[canon] == rec[key] and agrees(res.approximate.get(canon)), (key, res.approximate)
    res = Translator("prime_rl@v0.5.0", "canonical", registry=reg).translate({"seq_len/all/mean": 420.0,
                                                                              "reward/all/mean": 0.4})
    assert res.metrics["sequence/length/mean"] == 420.0 and res.metrics["reward/score/mean"] == 0.4
