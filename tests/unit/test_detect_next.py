"""Detection and round trips of the frameworks mapped after TRL, veRL and OpenRLHF (issue 21), on logs shaped as
each framework writes them at its newest mapped release (keys from the inventories in tests/data/frameworks/, the
shapes from the loggers cited below), with trainer and release left out.

NeMo-RL's `train/loss`, `train/reward` and `train/grad_norm` are also the names HF's rewrite_logs gives TRL GRPO's
`loss`, `reward` and `grad_norm` (other quantities): detection tells the two apart by the other keys of the record.
"""
from __future__ import annotations

import json

import pytest
from test_inventory_next import read_inventory

from trackbridge.detect import detect
from trackbridge.pipeline import Translator
from trackbridge.schema.loader import load_registry
from trackbridge.schema.spec import parse_spec

from _support import DATA


def inventory_record(file: str, release: str, leave_out: set[str], value=lambda i: 0.5 + i / 1000) -> dict:
    """One logged step: every key of the inventory logged at the release (a default-config run logs these; the
    keys in ``leave_out`` need a non-default config), with distinct values. The presence column names each release
    that logs the key."""
    rows = read_inventory(file)
    keys = [r["key"] for r in rows if release in r["presence"].split() and r["key"] not in leave_out]
    assert len(keys) > 20
    return {k: value(i) for i, k in enumerate(keys)}


# -- NeMo-RL ---------------------------------------------------------------------------------------------------------
# not logged by a default synchronous GRPO run (grpo_math_1B.yaml@v0.7.0): DAPO dynamic sampling, async GRPO,
# message-level penalties, the Megatron path's wd, truncated importance sampling, async rollouts' reward extrema
NEMO_OPTIONAL = {"train/filtered_reward", "train/dynamic_sampling_num_gen_batches",
                 "train/dynamic_sampling_num_discarded_valid_samples", "train/invalid_tool_call_rate",
                 "train/malformed_thinking_rate", "train/num_invalid_tool_calls", "train/num_malformed_thinking",
                 "train/num_assistant_messages", "train/buffer_size", "train/avg_trajectory_age", "train/wd",
                 "train/is_oob_ratio", "train/mean_total_reward", "train/max_total_reward", "train/min_total_reward",
                 "performance/average_token_imbalance", "performance/training_worker_idle_time_ratio"}


def nemo_rl_step() -> dict:
    return inventory_record("nemo-rl-keys.tsv", "v0.7.0", NEMO_OPTIONAL)        # v0.7.0


def nemo_rl_mlflow_step() -> dict:
    """The same step as NeMo-RL v0.7.0's MLflow backend stores it with the async vLLM engine: the list-valued rollout
    histograms summarised into /mean|p50|p90|max sub-keys (nemo_rl/utils/logger.py@v0.7.0, _summarize_list),
    which the wandb and TensorBoard backends do not have as scalars."""
    rec = nemo_rl_step()
    for name in ("gen_tokens_length", "input_tokens_length", "total_tokens_length"):
        for stat in ("mean", "p50", "p90", "max"):
            rec[f"train/histogram/{name}/{stat}"] = 100.0 + len(rec)
    return rec


def trl_grpo_wandb_step() -> dict:
    """A TRL 1.16.0 GRPO row as HF's wandb/TensorBoard callbacks write it (rewrite_logs: `train/` prefix)."""
    sets = json.loads((DATA / "frameworks" / "trl-rl-detection-sets.json").read_text())["sets"]
    keys = [k for k in sets["grpo@v1.16.0"]["keys"] if k != "epoch"]
    return {f"train/{k}": 0.25 + i / 100 for i, k in enumerate(keys)}


# -- AReaL -----------------------------------------------------------------------------------------------------------
# not logged by every step of a default GRPO run (areal/api/cli_args.py@v1.0.4 defaults): rejection sampling, dual
# clipping, the critic, teacher/offload/recompute stages, periodic saves and evaluations
AREAL_OPTIONAL = {"ppo_actor/rs_upper", "ppo_actor/rs_lower", "ppo_actor/c_clip",
                  "ppo_actor/update/rs_filtered_fraction", "ppo_actor/update/unclipped_behave_tokens",
                  "eval-rollout/reward", "timeperf/critic_values",
                  "timeperf/critic_train_step", "timeperf/teacher_logp", "timeperf/rollout_pause",
                  "timeperf/rollout_resume", "timeperf/rollout_offload", "timeperf/rollout_onload",
                  "timeperf/actor_onload", "timeperf/actor_offload", "timeperf/save", "timeperf/checkpoint_for_recover",
                  "timeperf/eval", "timeperf/recompute_logp"} | {
                  f"ppo_actor/update/{n}/{s}" for n in ("behave_imp_weight", "behave_approx_kl")
                  for s in ("avg", "min", "max")}


def areal_step() -> dict:
    return inventory_record("areal-keys.tsv", "v1.0.4", AREAL_OPTIONAL)        # v1.0.4


@pytest.fixture(scope="module")
def reg():
    return load_registry()


def test_nemo_rl_grpo_log_is_nemo_rl(reg):
    rec = nemo_rl_step()
    det = detect(rec, reg)
    assert det.spec is not None and (det.spec.framework, det.spec.trainer) == ("nemo_rl", "grpo"), det.to_json()
    assert det.source.startswith("nemo_rl/grpo@"), det.source
    # about half of a NeMo-RL step has no canonical name (passthrough rows of the inventory); the explained half is
    # NeMo-RL's by a wide margin over every other framework
    assert det.explained >= 30
    runners_up = [detect(rec, reg, within=parse_spec(fw, reg)).explained for fw in ("trl", "verl", "openrlhf")]
    assert max(runners_up) <= det.explained / 4, runners_up


def test_nemo_rl_keys_that_collide_with_trl_translate_as_nemo_rl(reg):
    """The same three names, NeMo-RL's meaning in a NeMo-RL record and TRL's in a TRL record."""
    rec = nemo_rl_step()
    res = Translator("auto", "canonical", registry=reg).translate(rec)
    assert res.source.startswith("nemo_rl/grpo")
    for key, canon in (("train/loss", "loss/total"), ("train/reward", "reward/score/mean"),
                       ("train/grad_norm", "optim/grad_norm"), ("train/kl_penalty", "kl/ref/k3"),
                       ("train/gen_kl_error", "kl/rollout/k3"), ("validation/accuracy", "val/score"),
                       ("timing/train/total_step_time", "time/step")):
        assert res.metrics[canon] == rec[key], key
    assert "train/token_mult_prob_error" in res.unmapped           # passthrough, reported

    trl = trl_grpo_wandb_step()
    det = detect(trl, reg)
    assert det.spec is not None and (det.spec.framework, det.spec.trainer) == ("trl", "grpo"), det.to_json()
    tr = Translator("auto", "canonical", registry=reg).translate(trl)
    assert tr.source.startswith("trl/grpo")
    assert tr.metrics["reward/score/mean"] == trl["train/reward"]
    assert "nemo_rl" not in tr.source


def test_nemo_rl_mlflow_and_wandb_key_sets_read_alike(reg):
    """One run, two trackers, two key sets (MLflow's list summaries): the same detection and the same translation
    of every key the two share; the MLflow-only summaries pass through, reported."""
    wb, ml = nemo_rl_step(), nemo_rl_mlflow_step()
    d_wb, d_ml = detect(wb, reg), detect(ml, reg)
    assert d_wb.spec.framework == d_ml.spec.framework == "nemo_rl"
    assert d_wb.spec.trainer == d_ml.spec.trainer == "grpo"
    t_wb = Translator("auto", "canonical", registry=reg).translate(wb)
    t_ml = Translator("auto", "canonical", registry=reg).translate(ml)
    shared = {t_wb.renamed.get(k, k) for k in wb}
    assert {k: t_ml.metrics[k] for k in shared} == {k: t_wb.metrics[k] for k in shared}
    extra = set(ml) - set(wb)
    assert len(extra) == 12 and extra <= set(t_ml.unmapped)


@pytest.mark.parametrize("target", ["nemo_rl", "nemo_rl@0.7.0"])
def test_nemo_rl_round_trip_through_canonical(reg, target):
    rec = nemo_rl_step()
    canon = Translator("nemo_rl@0.7.0", "canonical", registry=reg).translate(rec)
    assert len(canon.renamed) >= 30
    back = Translator("canonical", target, registry=reg, origin="nemo_rl/grpo@v0.7.0").translate(canon.metrics)
    assert back.metrics == rec


def test_areal_log_is_areal(reg):
    rec = areal_step()
    det = detect(rec, reg)
    assert det.spec is not None and (det.spec.framework, det.spec.trainer) == ("areal", "ppo"), det.to_json()
    assert det.explained >= 20
    res = Translator("auto", "canonical", registry=reg).translate(rec)
    for key, canon in (("ppo_actor/update/actor_loss/avg", "loss/policy"), ("ppo_actor/task_reward/avg",
                       "reward/score/mean"), ("ppo_actor/update/entropy/avg", "policy/entropy"),
                       ("rollout/reward", "sampling/reward/mean"), ("timeperf/train_step", "time/train_step")):
        assert res.metrics[canon] == rec[key], key
    # approx_kl is log pi_theta - log pi_old: the negated k1 of KL(old || theta)
    assert res.metrics["kl/old_policy/k1"] == -rec["ppo_actor/update/approx_kl/avg"]


def test_areal_round_trip_through_canonical(reg):
    rec = areal_step()
    canon = Translator("areal@1.0.4", "canonical", registry=reg).translate(rec)
    assert len(canon.renamed) >= 20
    back = Translator("canonical", "areal", registry=reg, origin="areal/ppo@v1.0.4").translate(canon.metrics)
    assert back.metrics == rec


# -- slime -----------------------------------------------------------------------------------------------------------
# not logged by a default GRPO run without a critic (slime/utils/arguments.py@v0.3.1): the KL loss, critic, MTP,
# distillation and off-policy diagnostics, multi-turn round numbers, pass rates
SLIME_OPTIONAL = {"train/kl_loss", "train/ois", "train/opsm_clipfrac", "train/opd_reverse_kl",
                  "train/critic-value_loss", "train/critic-value_clipfrac", "train/mtp_loss", "rollout/values",
                  "rollout/returns",
                  "rollout/teacher_log_probs", "rollout/round_number", "eval/aime-pass@1"}


def slime_rollout_step() -> dict:
    """The keys of one rollout step of a slime run, every axis's rows together (what a reader of the run sees first:
    the train/, rollout/, perf/ and eval/ rows; the step keys are axes, not metrics)."""
    return inventory_record("slime-keys.tsv", "v0.3.1", SLIME_OPTIONAL)          # v0.3.1


def test_slime_log_is_slime_not_trl_or_openrlhf(reg):
    rec = slime_rollout_step()
    det = detect(rec, reg)
    assert det.spec is not None and (det.spec.framework, det.spec.trainer) == ("slime", "rl"), det.to_json()
    # TRL's async-GRPO template perf/{metric} takes every perf/ key, and HF's train/ prefix loss and grad_norm: the
    # rest of the record (rollout/, eval/, slime's own train/ names) is slime's alone
    runners_up = [detect(rec, reg, within=parse_spec(fw, reg)).explained for fw in ("trl", "verl", "openrlhf")]
    assert max(runners_up) <= det.explained - 5, runners_up
    res = Translator("auto", "canonical", registry=reg).translate(rec)
    for key, canon in (("train/pg_loss", "loss/policy"), ("train/entropy_loss", "policy/entropy"),
                       ("train/ppo_kl", "kl/old_policy/k1"), ("rollout/raw_reward", "reward/score/mean"),
                       ("perf/step_time", "time/step"), ("perf/actor_train_time", "time/actor_train"),
                       ("eval/aime", "val/aime/score"), ("train/lr-pg_0", "optim/lr")):
        assert res.metrics[canon] == rec[key], key


def test_slime_round_trip_through_canonical(reg):
    rec = slime_rollout_step()
    canon = Translator("slime@0.3.1", "canonical", registry=reg).translate(rec)
    assert len(canon.renamed) >= 20
    back = Translator("canonical", "slime", registry=reg, origin="slime/rl@v0.3.1").translate(canon.metrics)
    assert back.metrics == rec


# -- SkyRL -----------------------------------------------------------------------------------------------------------
# not logged by every step of a default GRPO run (skyrl/train/config/config.py@v0.4.0: use_kl_loss, no reward KL,
# no zero-variance filter): the reward-KL keys, evaluation rows, the off-policy log-prob diagnostics
SKYRL_OPTIONAL = {"loss/avg_kl", "loss/avg_kl_max", "loss/kl_loss_coef", "reward/num_zero_variance_filtered",
                  "eval/all/avg_score", "eval/all/pass_at_1", "eval/all/mean_positive_reward", "eval/gsm8k/avg_score",
                  "eval/gsm8k/pass_at_1", "eval/gsm8k/mean_positive_reward"}


def skyrl_step() -> dict:
    return inventory_record("skyrl-keys.tsv", "v0.4.0", SKYRL_OPTIONAL)          # v0.4.0


def test_skyrl_log_is_skyrl(reg):
    rec = skyrl_step()
    det = detect(rec, reg)
    assert det.spec is not None and (det.spec.framework, det.spec.trainer) == ("skyrl", "ppo"), det.to_json()
    res = Translator("auto", "canonical", registry=reg).translate(rec)
    for key, canon in (("policy/policy_loss", "loss/policy"), ("policy/policy_entropy", "policy/entropy"),
                       ("policy/policy_kl", "kl/ref/k3"), ("reward/avg_raw_reward", "reward/score/mean"),
                       ("generate/avg_num_tokens", "response/length/mean"), ("timing/step", "time/step"),
                       ("timing/policy_train", "time/policy_train")):
        assert res.metrics[canon] == rec[key], key


def test_skyrl_round_trip_through_canonical(reg):
    rec = skyrl_step()
    canon = Translator("skyrl@0.4.0", "canonical", registry=reg).translate(rec)
    assert len(canon.renamed) >= 15
    back = Translator("canonical", "skyrl", registry=reg, origin="skyrl/ppo@v0.4.0").translate(canon.metrics)
    assert back.metrics == rec


# -- prime-rl --------------------------------------------------------------------------------------------------------
def prime_rl_file_lines() -> list[dict]:
    """A step of prime-rl v0.8.0 as its `file` monitor writes it: one JSON line per monitor.log call of the trainer
    (perf, optim, tensor stats, time) and of the orchestrator, each {"step", "time", ...}
    (src/prime_rl/utils/monitor/file.py@v0.8.0)."""
    printed = {r["key"] for r in read_inventory("prime-rl-keys.tsv") if "/" not in r["key"]}   # console labels
    rec = inventory_record("prime-rl-keys.tsv", "v0.8.0", {"optim/grad_norm"} | printed)
    groups = [("perf/",), ("optim/",), ("loss/", "entropy/", "mismatch_kl/", "kl_ent_ratio/", "masked_", "unmasked_",
                                         "is_masked"), ("time/",), ("progress/", "train/", "pre_filters/")]
    lines = []
    for i, prefixes in enumerate(groups):
        part = {k: v for k, v in rec.items() if k.startswith(prefixes)}
        assert part
        lines.append({"step": 7, "time": 1767225600.0 + i, **part})
    assert sum(len(x) - 2 for x in lines) == len(rec)
    return lines


def test_prime_rl_file_monitor_log_reads_as_prime_rl(reg, tmp_path):
    """Read through the JSONL reader (time is the wall time, not a metric) and detected over the run's keys: prime-rl,
    not 'canonical', although optim/lr, time/step, perf/throughput and progress/tokens are spelled like canonical
    names. Those that mean other quantities are translated to the right ones."""
    from trackbridge.trackers import open_source

    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in prime_rl_file_lines()))
    (reader,) = open_source(f"jsonl:{path}").runs()
    recs = list(reader.records())
    assert all(r.wall_time is not None and "time" not in r.metrics for r in recs)
    keys = {k for r in recs for k in r.metrics}
    det = detect(keys, reg)
    assert det.spec is not None and (det.spec.framework, det.spec.trainer) == ("prime_rl", "rl"), det.to_json()
    tr = Translator("auto", "canonical", registry=reg)
    out: dict = {}
    for r in recs:
        out.update(tr.translate(r.metrics).metrics)
    flat = {k: v for r in recs for k, v in r.metrics.items()}
    assert out["perf/throughput"] == flat["perf/throughput_per_gpu"]          # per GPU
    assert out["perf/tokens_per_s"] == flat["perf/throughput"]                # all GPUs
    assert out["progress/tokens"] == flat["progress/total_tokens"]            # since the start
    assert out["perf/tokens_per_step"] == flat["progress/tokens"]             # this step
    assert out["perf/mfu/policy_update"] == pytest.approx(flat["perf/mfu"] / 100)
    assert out["policy/entropy"] == flat["entropy/all/mean"]


def test_prime_rl_round_trip_through_canonical(reg):
    rec = {k: v for line in prime_rl_file_lines() for k, v in line.items() if k not in ("step", "time")}
    canon = Translator("prime_rl@0.8.0", "canonical", registry=reg).translate(rec)
    back = Translator("canonical", "prime_rl", registry=reg, origin="prime_rl/rl@v0.8.0").translate(canon.metrics)
    assert back.metrics == pytest.approx(rec)


# -- ROLL ------------------------------------------------------------------------------------------------------------
def roll_step() -> dict:
    """A ROLL v0.3.0 RLVR step as its tracker receives it: @tags stripped (roll/utils/tracking.py), one domain."""
    return inventory_record("roll-keys.tsv", "v0.3.0", set())


def test_roll_log_is_roll_not_verl(reg):
    """ROLL's names are veRL's style (actor/pg_loss, critic/score/mean ...): its own keys (token/, system/, time/step_*,
    actor/approxkl, the per-domain keys) tell it apart."""
    rec = roll_step()
    det = detect(rec, reg)
    assert det.spec is not None and (det.spec.framework, det.spec.trainer) == ("roll", "rlvr"), det.to_json()
    verl = detect(rec, reg, within=parse_spec("verl", reg)).explained
    assert verl <= det.explained - 20, verl
    res = Translator("auto", "canonical", registry=reg).translate(rec)
    for key, canon in (("actor/pg_loss", "loss/policy"), ("actor/kl_loss", "kl/ref/k3"), ("actor/approxkl",
                       "kl/old_policy/k2"), ("critic/score/mean", "reward/score/mean"),
                       ("token/response_length/mean", "response/length/mean"), ("time/step_total", "time/step")):
        assert res.metrics[canon] == rec[key], key
    assert res.metrics["kl/old_policy/k1"] == -rec["actor/policykl"]          # log pi - log pi_old, negated
    assert "math/critic/kl" in res.unmapped                                  # per-domain: passed through


def test_roll_round_trip_through_canonical(reg):
    rec = roll_step()
    canon = Translator("roll@0.3.0", "canonical", registry=reg).translate(rec)
    back = Translator("canonical", "roll", registry=reg, origin="roll/rlvr@v0.3.0").translate(canon.metrics)
    assert back.metrics == pytest.approx(rec)


# -- ms-swift GRPO (TRL) ---------------------------------------------------------------------------------------------
def test_ms_swift_grpo_log_is_trl_grpo(reg):
    """ms-swift's GRPOTrainer subclasses TRL's and adds entropy/mean|max|min|threshold (swift/rlhf_trainers/
    grpo_trainer.py in the ms_swift 4.6.0 wheel, which requires trl>=0.15,<1.0): its log is TRL GRPO's, with
    trainer and release left out; entropy/mean is the per-completion mean entropy, the rest pass through."""
    sets = json.loads((DATA / "frameworks" / "trl-rl-detection-sets.json").read_text())["sets"]
    keys = [k for k in sets["grpo@v1.16.0"]["keys"] if k not in ("epoch", "step_time", "num_tokens")]
    rec = {k: 0.25 + i / 64 for i, k in enumerate(keys)}
    rec |= {"entropy/mean": 0.61, "entropy/max": 1.5, "entropy/min": 0.1, "entropy/threshold": 0.9}
    det = detect(rec, reg)
    assert det.spec is not None and (det.spec.framework, det.spec.trainer) == ("trl", "grpo"), det.to_json()
    assert det.unexplained == [] and det.source.endswith("v0.29.1"), det.to_json()     # ms-swift: trl < 1.0
    res = Translator("auto", "canonical", registry=reg).translate(rec)
    assert res.metrics["policy/entropy"] == rec["entropy"]          # TRL's own token-mean entropy wins
    assert "entropy/mean" in res.conflicts                          # the per-completion mean: same name, reported
    assert {"entropy/max", "entropy/min", "entropy/threshold"} <= set(res.unmapped)
