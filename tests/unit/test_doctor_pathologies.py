"""Every diagnostic check on synthetic runs with its pathology injected at a known step, written under TRL, veRL and
OpenRLHF names (tests/_support/doctor_runs.py) and read as ``trackbridge doctor`` reads a file: through
``open_runs`` and the run's translation pipeline. So each check is proven to work through translation, in canonical
names, for every framework that logs its series. Healthy runs (several seeds) must stay quiet.

Each test asserts the finding's check id and where it holds (first and last step), not just that something was
found. The frameworks of a pathology are those that log its series (veRL alone logs the aborted ratio, the
sequence-length balance and MFU; TRL's DPO and reward trainers and OpenRLHF's DPO the preference metrics).
"""
from __future__ import annotations

from pathlib import Path

import pytest

from trackbridge.doctor import diagnose
from trackbridge.read.inputs import open_runs

from _support import doctor_runs as R

N = R.N
RL = R.RL_SPECS                               # trl/grpo@1.16.0, verl/ppo@0.7.0, openrlhf/ppo@0.11.2
assert len(RL) == 3


def doctor(tmp_path: Path, spec: str, series: dict, config: dict | None = None):
    path = R.write(tmp_path / "run.jsonl", spec, series)
    runs = open_runs(str(path), rows=True, config=config)
    assert len(runs) == 1
    d = diagnose(runs[0], source=spec)
    assert d.records >= N
    return d


def only(d, check_id: str):
    """The finding of ``check_id`` (exactly one), and the ids of all findings."""
    ids = [f.id for f in d.findings]
    hits = [f for f in d.findings if f.id == check_id]
    assert len(hits) == 1, (check_id, ids)
    return hits[0]


def kl_name(series: dict) -> str:
    return "kl/ref/k3" if "kl/ref/k3" in series else "kl/old_ref/k1"


# ------------------------------------------------------------------------------------------------------ healthy
@pytest.mark.parametrize("spec", sorted(R.RAW))
def test_healthy_runs_stay_quiet(tmp_path, spec):
    for seed in range(4):
        d = doctor(tmp_path, spec, R.healthy(spec, seed=seed))
        assert d.findings == [], (spec, seed, [f.summary() for f in d.findings])
        assert len(d.ran) >= 3, (spec, d.ran)           # the checks did look at the run


# ------------------------------------------------------------------------------------------------------ KL
@pytest.mark.parametrize("spec", RL)
def test_kl_spike_before_reward_collapse(tmp_path, spec):
    s = R.healthy(spec)
    kl = kl_name(s)
    for t in (80, 81, 82):
        s[kl][t] = 0.5                                   # 25x the KL of a healthy run
    for t in range(82, N):
        s["reward/score/mean"][t] = 0.1 + 0.01 * (t % 3)   # the reward collapses two steps later
    d = doctor(tmp_path, spec, s)
    crit = only(d, "kl-spike-then-reward-collapse")
    assert crit.severity == "critical" and crit.series == {"kl": kl, "reward": "reward/score/mean"}
    assert (crit.first_step, crit.last_step) == (80, N - 1)      # from the spike, as long as the collapse lasts
    spike = only(d, "kl-spike")
    assert (spike.first_step, spike.last_step, spike.count) == (80, 80, 1)    # the jump; 81, 82 stay there
    # critical first, the spike grouped under it (a reward that rose and collapsed is not "not improving")
    assert [f.id for f in d.findings] == ["kl-spike-then-reward-collapse", "kl-spike"]
    assert "0.5" in crit.stretches[0].text and "reward/score/mean fell" in crit.stretches[0].text
    assert any("kl-spike-then-reward-collapse" in n for n in spike.notes)


def test_a_kl_spike_after_the_reward_collapsed_did_not_cause_it(tmp_path):
    spec = "verl/ppo@0.7.0"
    s = R.healthy(spec)
    for t in range(60, N):
        s["reward/score/mean"][t] = 0.1 + 0.01 * (t % 3)   # the reward collapses at step 60 ...
    for t in (80, 81, 82):
        s["kl/ref/k3"][t] = 0.5                          # ... the KL spikes 20 steps later
    d = doctor(tmp_path, spec, s)
    assert [(f.id, f.first_step, f.last_step) for f in d.findings] == [("kl-spike", 80, 80)]


@pytest.mark.parametrize("spec", RL)
def test_kl_near_zero_for_long(tmp_path, spec):
    s = R.healthy(spec)
    kl = kl_name(s)
    for t in range(N):
        s[kl][t] = 1e-6 * (1 + 0.1 * (t % 5))
        s["reward/score/mean"][t] = 0.3 + 0.02 * ((t * 7) % 5 - 2)     # flat
    f = only(doctor(tmp_path, spec, s), "kl-near-zero")
    assert f.severity == "warning" and f.series["kl"] == kl
    # the KL is below 1e-4 from step 0; the reward shows no gain from its 21st point: the two meet at step 22
    assert (f.first_step, f.last_step) == (22, N - 1)


def test_kl_logged_as_exactly_zero_is_not_a_measurement(tmp_path):
    # Unsloth's GRPO logs kl = 0.0 when beta is 0 (the KL is not computed): not "the policy does not move"
    spec = "trl/grpo@1.16.0"
    s = R.healthy(spec)
    for t in range(N):
        s["kl/ref/k3"][t] = 0.0
        s["reward/score/mean"][t] = 0.3 + 0.02 * ((t * 7) % 5 - 2)
    d = doctor(tmp_path, spec, s)
    assert "kl-near-zero" in d.ran and [f.id for f in d.findings] == ["reward-not-improving"]   # it is flat
    assert "kl-exactly-zero" in d.not_run                # beta unknown: an exact 0 may be a KL not computed


@pytest.mark.parametrize("spec, config, severity", [
    ("trl/rloo@1.16.0", {"top_k": 50}, "critical"),                                    # RLOOConfig.top_k
    ("verl/ppo@0.7.0", {"actor_rollout_ref": {"rollout": {"top_k": 50}}}, "critical"),   # rollout.top_k
    ("trl/rloo@1.16.0", {}, "warning"),                                                # top-k off: no cause known
    ("openrlhf/ppo@0.11.2", {}, "warning"),                                            # kl without use_loss: k1
])
def test_negative_kl_and_top_k(tmp_path, spec, config, severity):
    s = R.healthy(spec)
    for t in range(40, N):
        s["kl/old_ref/k1"][t] = -0.01 * (1 + 0.1 * (t % 3))
    f = only(doctor(tmp_path, spec, s, config), "kl-negative")
    assert f.series == {"kl": "kl/old_ref/k1"} and f.severity == severity
    assert (f.first_step, f.last_step) == (40, N - 1)
    if config:
        assert len(f.notes) == 1 and "top_k=50" in f.notes[0] and "top-k sampling" in f.notes[0]
    else:
        assert f.notes == []


def test_negative_sequence_kl_above_range_and_near_zero_legacy_ppo_names(tmp_path):
    spec = "trl/ppo@0.12.0"                               # objective/kl: the per-sequence sum (k1)
    s = R.healthy(spec)
    for t in range(40, N):
        s["kl/old_ref/k1_seq_sum"][t] = -2.0
    f = only(doctor(tmp_path, spec, s), "kl-negative-sequence")
    assert (f.first_step, f.last_step, f.series["kl"]) == (40, N - 1, "kl/old_ref/k1_seq_sum")
    s = R.healthy(spec)
    for t in range(40, N):
        s["kl/old_ref/k1_seq_sum"][t] = 15.0 + t % 3     # above TRL's 0..10
    f = only(doctor(tmp_path, spec, s), "kl-above-range")
    assert (f.first_step, f.last_step) == (40, N - 1)
    s = R.healthy(spec)
    for t in range(N):
        s["kl/old_ref/k1_seq_sum"][t] = 0.001
        s["reward/score/mean"][t] = 0.3 + 0.02 * ((t * 7) % 5 - 2)
    f = only(doctor(tmp_path, spec, s), "kl-near-zero-sequence")
    assert (f.first_step, f.last_step) == (22, N - 1)


# ------------------------------------------------------------------------------------------------------ policy
@pytest.mark.parametrize("spec", RL)
def test_entropy_collapse(tmp_path, spec):
    s = R.healthy(spec)
    for t in range(50, N):
        s["policy/entropy"][t] = 0.05                    # a twentieth of its early level (~0.9)
    f = only(doctor(tmp_path, spec, s), "entropy-collapse")
    assert (f.first_step, f.last_step, f.series["entropy"]) == (50, N - 1, "policy/entropy")


@pytest.mark.parametrize("spec", RL)
def test_sustained_high_clip_fraction(tmp_path, spec):
    s = R.healthy(spec)
    for t in range(60, 91):
        s["policy/clip_frac"][t] = 0.35
    f = only(doctor(tmp_path, spec, s), "clip-fraction-high")
    assert (f.first_step, f.last_step, f.count) == (60, 90, 1)


@pytest.mark.parametrize("spec", RL)
def test_grad_norm_explosion(tmp_path, spec):
    s = R.healthy(spec)
    s["optim/grad_norm"][70] = 6.0                       # 12x the usual 0.5 (the glossary: 10x)
    d = doctor(tmp_path, spec, s)
    f = only(d, "grad-norm-explosion")
    assert (f.severity, f.first_step, f.last_step) == ("critical", 70, 70)
    assert [x.id for x in d.findings] == ["grad-norm-explosion"]


@pytest.mark.parametrize("spec", RL)
def test_loss_kl_and_grad_norm_spike_together(tmp_path, spec):
    s = R.healthy(spec)
    loss = "loss/total" if "loss/total" in s else "loss/policy"
    s[loss][90] = 0.5
    s[kl_name(s)][90] *= 10
    s["optim/grad_norm"][90] = 3.0                       # 6x: not an explosion by itself
    d = doctor(tmp_path, spec, s)
    f = only(d, "loss-kl-grad-spike-together")
    assert (f.first_step, f.last_step) == (90, 90)
    assert "grad-norm-explosion" not in [x.id for x in d.findings]
    assert "learning rate schedule" in f.check.check_first


# ------------------------------------------------------------------------------------------------------ lengths
@pytest.mark.parametrize("spec", RL)
def test_reward_up_while_response_length_collapses(tmp_path, spec):
    s = R.healthy(spec)
    for t in range(N):
        s["reward/score/mean"][t] = 0.2 + 0.6 * t / N
        if t >= 50:
            s["response/length/mean"][t] = max(20.0, 200 - 8 * (t - 50))
    f = only(doctor(tmp_path, spec, s), "length-collapse-reward-up")
    # the length falls below 60% of its early level (~200) at step 60, and stays there 5 points
    assert (f.first_step, f.last_step) == (60, N - 1)


@pytest.mark.parametrize("spec", RL)
def test_response_clip_ratio_high(tmp_path, spec):
    s = R.healthy(spec)
    for t in range(60, N):
        s["response/clip_ratio"][t] = 0.3
    f = only(doctor(tmp_path, spec, s), "responses-truncated")
    assert (f.first_step, f.last_step, f.series["clipped"]) == (60, N - 1, "response/clip_ratio")


def test_high_aborted_ratio_verl(tmp_path):
    spec = "verl/ppo@0.7.0"                              # response/aborted_ratio: veRL only
    s = R.healthy(spec)
    for t in range(30, N):
        s["response/aborted_ratio"][t] = 0.2
    f = only(doctor(tmp_path, spec, s), "aborted-ratio-high")
    assert (f.first_step, f.last_step) == (30, N - 1)


# ------------------------------------------------------------------------------------------------------ preference
def _eval_loss_rising_after_60(s: dict) -> None:
    ev = s["eval/loss/total"]
    for t in range(60, N):
        if ev[t] is not None:
            ev[t] = 0.565 + 0.03 * (t - 59) / 10            # evaluations every 10 steps: 69, 79, ... get worse


@pytest.mark.parametrize("spec", R.PREFERENCE_SPECS)
def test_dpo_accuracy_99_while_eval_loss_rises(tmp_path, spec):
    s = R.healthy(spec)
    for t in range(60, N):
        s["preference/accuracy"][t] = 1.0
    _eval_loss_rising_after_60(s)
    f = only(doctor(tmp_path, spec, s), "preference-overfit")
    assert f.series["accuracy"] == "preference/accuracy" and f.series["eval"] == "eval/loss/total"
    # the evaluation at 69 is still no worse than the best before it (0.578 at 49 vs 0.565 at 59); at 79 the last
    # two (0.595, 0.625) are more than 2% worse than the best before them (0.565)
    assert (f.first_step, f.last_step) == (79, N - 1)


def test_dpo_glossary_case_margins_rise_eval_loss_rises_train_accuracy_under_99(tmp_path):
    spec = "trl/dpo@1.16.0"                            # rewards/margins: the glossary's signal
    s = R.healthy(spec)                                # train accuracy stays under 0.97; margins rise
    assert max(v for v in s["preference/accuracy"] if v is not None) < 0.99
    _eval_loss_rising_after_60(s)
    d = doctor(tmp_path, spec, s)
    f = only(d, "preference-overfit")
    # its evidence: the margin and the evaluation loss (train accuracy, bound too, never held)
    assert f.series == {"margin": "preference/reward/margin", "eval": "eval/loss/total"}
    assert (f.first_step, f.last_step) == (79, N - 1)
    assert "preference/reward/margin rose" in f.stretches[0].text


@pytest.mark.parametrize("spec", R.PREFERENCE_SPECS)
def test_dpo_eval_accuracy_saturated_at_1_while_eval_loss_falls_is_healthy(tmp_path, spec):
    s = R.healthy(spec)
    for t in range(60, N):
        s["preference/accuracy"][t] = 1.0              # training pairs all told apart ...
        if s["eval/preference/accuracy"][t] is not None:
            s["eval/preference/accuracy"][t] = 1.0     # ... and the evaluation pairs too, while eval loss falls
    d = doctor(tmp_path, spec, s)
    assert "preference-overfit" in d.ran and d.findings == [], [f.summary() for f in d.findings]


def test_reward_model_margin_near_zero_trl_reward_trainer(tmp_path):
    spec = "trl/reward@1.16.0"
    s = R.healthy(spec)
    for t in range(80, N):
        s["preference/score/margin"][t] = max(0.05, 1.95 - 0.1 * (t - 80))
    f = only(doctor(tmp_path, spec, s), "reward-model-margin-collapse")
    assert (f.first_step, f.last_step) == (98, N - 1)


def test_no_learning_signal_trl_grpo(tmp_path):
    spec = "trl/grpo@1.16.0"                             # frac_reward_zero_std
    s = R.healthy(spec)
    for t in range(30, N):
        s["reward/group_zero_std_frac"][t] = 0.8
    f = only(doctor(tmp_path, spec, s), "no-learning-signal")
    assert (f.first_step, f.last_step) == (30, N - 1)


def test_nonfinite_loss(tmp_path):
    spec = "trl/grpo@1.16.0"
    s = R.healthy(spec)
    s["loss/total"][50] = float("nan")
    f = only(doctor(tmp_path, spec, s), "nonfinite-values")
    assert (f.severity, f.first_step, f.last_step) == ("critical", 50, 50)


def test_validation_drop_verl(tmp_path):
    spec = "verl/ppo@0.7.0"
    s = R.healthy(spec)
    v = s["val/gsm8k/acc/mean@1"]
    for t in range(100, N):
        if v[t] is not None:
            v[t] = 0.2                                   # validation every 10 steps: 109, 119, ...
    f = only(doctor(tmp_path, spec, s), "validation-drop")
    assert f.series == {"val": "val/gsm8k/acc/mean@1"}
    assert (f.first_step, f.last_step) == (109, 149)


# ------------------------------------------------------------------------------------------------------ efficiency
def test_large_global_seqlen_gap_verl(tmp_path):
    spec = "verl/ppo@0.7.0"
    s = R.healthy(spec)
    for t in range(40, N):
        s["perf/global_seqlen/balanced_min"][t] = 0.6 * s["perf/global_seqlen/balanced_max"][t]
    f = only(doctor(tmp_path, spec, s), "seqlen-imbalance")
    assert (f.severity, f.first_step, f.last_step) == ("info", 40, N - 1)
    assert f.series == {"lightest": "perf/global_seqlen/balanced_min", "heaviest": "perf/global_seqlen/balanced_max"}


def test_mfu_under_30_percent_verl(tmp_path):
    spec = "verl/ppo@0.7.0"
    s = R.healthy(spec)
    for t in range(N):
        s["perf/mfu/policy_update"][t] = 0.15
    f = only(doctor(tmp_path, spec, s), "mfu-low")
    assert (f.severity, f.first_step, f.last_step) == ("info", 0, N - 1)


@pytest.mark.parametrize("spec", ["verl/ppo@0.7.0", "openrlhf/ppo@0.11.2"])     # TRL logs no generation time
def test_generation_dominates_timing(tmp_path, spec):
    s = R.healthy(spec)
    for t in range(N):
        s["time/generation"][t] = 80 + (t % 3)          # of a ~100 s step
    f = only(doctor(tmp_path, spec, s), "generation-dominates")
    assert (f.first_step, f.last_step) == (0, N - 1)
    assert f.series == {"generation": "time/generation", "step": "time/step"}


# ------------------------------------------------------------------------------------------------------ issue 32
# The cases an expert's labels showed wrong (issue 32), each as it was seen, and the symptoms that had no check.
def doctor_rows(tmp_path: Path, spec: str, rows: list[dict], config: dict | None = None):
    """A short pasted log: ``rows`` under the framework's own names, read as doctor reads a file."""
    import json
    path = tmp_path / "pasted.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    (run,) = open_runs(str(path), rows=True, config=config)
    return diagnose(run, source=spec)


def test_a_small_kl_ramping_up_then_reward_noise_is_no_spike_and_no_collapse(tmp_path):
    # the false alarm: 0.022 nats/token is 6x a KL still ramping up from 0, and an 8-sample reward that never
    # rose is noise (sd 0.16), not a collapse
    import random
    spec = "trl/grpo@1.16.0"
    s = R.healthy(spec)
    rng = random.Random(3)
    for t in range(N):
        s["kl/ref/k3"][t] = 0.0005 * t if t < 8 else 0.003 + 0.0001 * (t % 7)
        s["reward/score/mean"][t] = sum(rng.random() < 0.3 for _ in range(8)) / 8
    s["kl/ref/k3"][8] = 0.022
    d = doctor(tmp_path, spec, s)
    assert {"kl-spike", "kl-spike-then-reward-collapse"} <= set(d.ran)
    ids = [f.id for f in d.findings]
    assert "kl-spike" not in ids and "kl-spike-then-reward-collapse" not in ids, ids


def test_a_sequence_kl_spike_needs_5_nats(tmp_path):
    spec = "trl/ppo@0.12.0"                               # objective/kl: nats per sequence
    s = R.healthy(spec)
    s["kl/old_ref/k1_seq_sum"][10] = 4.0                  # 6x a KL ramping up from 0 (~0.5 then), under 5 nats
    s["kl/old_ref/k1_seq_sum"][100] = 12.0                # 4x the median ~2.9, above 5 nats
    d = doctor(tmp_path, spec, s)
    f = only(d, "kl-spike")
    assert (f.first_step, f.last_step, f.count, f.series) == (100, 100, 1, {"kl_seq": "kl/old_ref/k1_seq_sum"})


@pytest.mark.parametrize("spec", RL)
def test_grad_norm_explosion_in_the_first_points_is_judged(tmp_path, spec):
    s = R.healthy(spec)
    g = s["optim/grad_norm"]
    g[0], g[1], g[2] = 0.45, 11.8, 53.0                  # the first points of a run blowing up
    d = doctor(tmp_path, spec, s)
    f = only(d, "grad-norm-explosion")
    assert (f.first_step, f.last_step, f.count) == (1, 2, 1)
    assert "53 at step 2, 117.8x the median 0.45" in f.stretches[0].text      # its most extreme point


@pytest.mark.parametrize("spec", RL)
def test_a_second_gradient_spike_is_not_hidden_by_the_first(tmp_path, spec):
    s = R.healthy(spec)
    s["optim/grad_norm"][60] = 415.0
    s["optim/grad_norm"][64] = 617.0                     # under 5x the max of the window (415): missed by a max
    f = only(doctor(tmp_path, spec, s), "grad-norm-explosion")
    assert [(x.first, x.last) for x in f.stretches] == [(60, 60), (64, 64)] and f.count == 2


@pytest.mark.parametrize("spec", RL)
def test_entropy_collapse_in_the_first_points_is_measured_from_the_level_before_it(tmp_path, spec):
    s = R.healthy(spec)
    e = s["policy/entropy"]
    for t in range(N):
        e[t] = 1.5 if t < 3 else (0.9 if t == 3 else 0.5 if t == 4 else 0.2 + 0.005 * (t % 3))
    # the mean of the first 5 points (1.18) already holds the collapse (0.2 is 17% of it, over the old 10%); from
    # the level of the points before it, 1.5, 0.5 at step 4 is a third: a fast fall, held as long as it lasts
    f = only(doctor(tmp_path, spec, s), "entropy-collapse")
    assert (f.first_step, f.last_step, f.count) == (4, N - 1, 1)
    assert "of its peak level 1.5" in f.stretches[0].text


@pytest.mark.parametrize("spec, kl", [("trl/grpo@1.16.0", "kl/ref/k3"), ("trl/rloo@1.16.0", "kl/old_ref/k1")])
def test_token_mean_kl_running_away(tmp_path, spec, kl):
    s = R.healthy(spec)
    for t in range(60, N):
        s[kl][t] = 6.0 + 7.0 * (t - 60) / (N - 61)       # 6 -> 13 nats per token (GRPO and RLOO log per token)
    d = doctor(tmp_path, spec, s)
    f = only(d, "kl-token-runaway")
    assert (f.first_step, f.last_step, f.series) == (60, N - 1, {"kl": kl})
    assert "kl-above-range" not in d.ran                 # that one reads sequence sums, which these do not log


@pytest.mark.parametrize("spec", RL)
def test_reward_not_improving(tmp_path, spec):
    s = R.healthy(spec)
    for t in range(N):
        s["reward/score/mean"][t] = 0.3 + 0.02 * ((t * 7) % 5 - 2)       # flat, with noise
    f = only(doctor(tmp_path, spec, s), "reward-not-improving")
    assert (f.first_step, f.last_step, f.count) == (39, N - 1, 1)      # judged from the 40th point


def test_a_reward_at_its_best_from_the_start_has_no_room_to_improve(tmp_path):
    spec = "verl/ppo@0.7.0"
    s = R.healthy(spec)
    for t in range(N):
        s["reward/score/mean"][t] = 0.95 + 0.01 * ((t * 7) % 5 - 2)      # at its maximum, flat
    d = doctor(tmp_path, spec, s)
    assert "reward-not-improving" in d.ran and d.findings == [], [f.summary() for f in d.findings]


@pytest.mark.parametrize("spec", RL)
def test_no_update_gradient_norm_exactly_zero_with_a_learning_rate(tmp_path, spec):
    s = R.healthy(spec)
    for t in range(50, N):
        s["optim/grad_norm"][t] = 0.0
    f = only(doctor(tmp_path, spec, s), "no-update")
    assert (f.first_step, f.last_step, f.count) == (50, N - 1, 1)


def test_no_update_needs_a_learning_rate_above_zero(tmp_path):
    spec = "trl/grpo@1.16.0"
    s = R.healthy(spec)
    for t in range(N):
        s["optim/grad_norm"][t] = 0.0 if t >= 50 else s["optim/grad_norm"][t]
        s["optim/lr"][t] = 0.0 if t >= 50 else 1e-6     # the schedule ended: nothing should move
    d = doctor(tmp_path, spec, s)
    assert "no-update" in d.ran and "no-update" not in [f.id for f in d.findings]


def test_kl_exactly_zero_with_beta_above_zero(tmp_path):
    spec = "trl/grpo@1.16.0"
    s = R.healthy(spec)
    for t in range(N):
        s["kl/ref/k3"][t] = 0.0
    f = only(doctor(tmp_path, spec, s, config={"beta": 0.04}), "kl-exactly-zero")
    assert (f.first_step, f.last_step) == (0, N - 1)     # 0 from the first point; 5 points tell it
    d = doctor(tmp_path, spec, s, config={"beta": 0.0})
    assert "kl-exactly-zero" in d.not_run and d.findings == []


def test_preference_loss_spike_dpo(tmp_path):
    import math
    spec = "trl/dpo@1.16.0"
    s = R.healthy(spec)
    for t in range(N):
        s["loss/total"][t] = 0.69 * math.exp(-t / 40) + 0.05 + 0.01 * ((t * 7) % 5 - 2)
    s["loss/total"][90] = 1.5                            # the loss jumps back above its starting 0.69
    f = only(doctor(tmp_path, spec, s), "loss-spike")
    assert (f.first_step, f.last_step) == (90, 90)


@pytest.mark.parametrize("spec", RL)
def test_an_rl_loss_jump(tmp_path, spec):
    s = R.healthy(spec)
    loss = "loss/total" if "loss/total" in s else "loss/policy"
    s[loss][90] = 0.5                                    # the loss alone jumps, 25 noise deviations
    s[loss][120] = 0.15                                  # 7 deviations, but under the 0.2 floor: RL losses fluctuate
    f = only(doctor(tmp_path, spec, s), "loss-spike")
    assert [(x.first, x.last) for x in f.stretches] == [(90, 90)]


@pytest.mark.parametrize("spec", RL)
def test_nan_kl_and_infinite_entropy(tmp_path, spec):
    s = R.healthy(spec)
    s[kl_name(s)][50] = float("nan")
    s["policy/entropy"][70] = float("inf")
    f = only(doctor(tmp_path, spec, s), "nonfinite-values")
    assert [(x.first, x.last) for x in f.stretches] == [(50, 50), (70, 70)] and f.severity == "critical"


def test_ppo_ratio_far_from_one(tmp_path):
    spec = "trl/ppo@0.12.0"                              # val/ratio
    s = R.healthy(spec)
    s["policy/ratio_mean"][70] = 2.5
    s["policy/ratio_mean"][110] = 0.3
    f = only(doctor(tmp_path, spec, s), "ppo-ratio-off")
    assert [(x.first, x.last) for x in f.stretches] == [(70, 70), (110, 110)]
    assert f.series == {"ratio": "policy/ratio_mean"}


def test_ppo_approx_kl_and_value_loss_spikes(tmp_path):
    spec = "trl/ppo@0.12.0"                              # policy/approxkl_avg, loss/value_avg
    s = R.healthy(spec)
    s["kl/old_policy/k2"][80] = 0.1                      # 25x its usual 0.004
    s["loss/value"][90] = 3.0                            # 12x its usual ~0.25
    d = doctor(tmp_path, spec, s)
    a = only(d, "approx-kl-spike")
    v = only(d, "value-loss-spike")
    assert (a.first_step, a.last_step, v.first_step, v.last_step) == (80, 80, 90, 90)
    assert a.series == {"akl": "kl/old_policy/k2"} and v.series == {"vloss": "loss/value"}


def test_adaptive_kl_coefficient_rising_legacy_ppo(tmp_path):
    spec = "trl/ppo_legacy@0.11.4"                       # objective/kl_coef
    s = R.healthy(spec)
    for t in range(60, N):
        s["kl/coef"][t] = 0.2 + 0.01 * (t - 60)          # the controller keeps raising it
    f = only(doctor(tmp_path, spec, s), "kl-coef-rising")
    # the first 3-point mean is 0.2013; the 3-point mean (0.2 + 0.01 x (t - 61)) passes 1.5x it (0.302) at step 72
    assert (f.first_step, f.last_step) == (72, N - 1)


# ------------------------------------------------------------------------------------------------------ one row
def test_one_pasted_row_is_enough_for_a_clip_ratio_of_1_a_nan_and_zero_gradient_with_zero_reward(tmp_path):
    spec = "trl/grpo@1.16.0"
    d = doctor_rows(tmp_path, spec, [{"step": 3, "completions/clipped_ratio": 1.0, "loss": float("nan"),
                                      "grad_norm": 0.0, "reward": 0.0, "learning_rate": 1e-6}])
    got = {f.id: (f.first_step, f.last_step) for f in d.findings}
    assert got == {"nonfinite-values": (3, 3), "no-learning-signal": (3, 3), "responses-truncated": (3, 3)}


# ------------------------------------------------------------------------------------------------------ lengths
def test_length_hacking_comes_before_the_truncation_it_drives(tmp_path):
    spec = "trl/grpo@1.16.0"
    s = R.healthy(spec)
    for t in range(N):
        s["reward/score/mean"][t] = 0.2 + 0.6 * t / N     # the reward pays length ...
        s["response/length/mean"][t] = min(512.0, 200 + 2.5 * t)
        s["response/clip_ratio"][t] = 0.5 if t >= 100 else 0.01    # ... into the 512 limit from step 100
    d = doctor(tmp_path, spec, s)
    hack, trunc = only(d, "length-hacking"), only(d, "responses-truncated")
    assert (hack.first_step, hack.last_step, trunc.first_step, trunc.last_step) == (100, N - 1, 100, N - 1)
    ids = [f.id for f in d.findings]
    assert ids.index("length-hacking") == ids.index("responses-truncated") - 1
    assert any("[length-hacking]" in n for n in trunc.notes)


# ------------------------------------------------------------------------------------------------------ cause first
def test_a_learning_rate_jump_leads_the_findings_it_caused(tmp_path):
    spec = "trl/grpo@1.16.0"
    s = R.healthy(spec)
    for t in range(60, N):
        s["optim/lr"][t] = 1e-4                          # 100x: a misconfigured restart
        s["reward/group_zero_std_frac"][t] = 0.9         # the policy collapsed to one answer per prompt
    s["loss/total"][60] = 0.8                            # loss, KL and gradient norm jump together
    s["kl/ref/k3"][60] = 0.4
    s["optim/grad_norm"][60] = 8.0
    d = doctor(tmp_path, spec, s)
    ids = [f.id for f in d.findings]
    assert ids[0] == "lr-jump", ids                      # not "no learning signal: easier prompts"
    lr = only(d, "lr-jump")
    # a jump to a level that stays is a spike until the new level is the window's median (11 of its 20 points)
    assert (lr.first_step, lr.last_step, lr.count) == (60, 70, 1)
    nls = only(d, "no-learning-signal")
    assert (nls.first_step, nls.last_step) == (60, N - 1)
    assert {"loss-kl-grad-spike-together", "grad-norm-explosion", "kl-spike", "no-learning-signal"} <= set(ids)
    for f in d.findings[1:]:
        assert any("[lr-jump]" in n or "[loss-kl-grad-spike-together]" in n for n in f.notes), (f.id, f.notes)


# ------------------------------------------------------------------------------------------------------ tuned
def test_a_kl_jump_at_the_second_point_is_judged(tmp_path):
    spec = "trl/grpo@1.16.0"
    s = R.healthy(spec)
    s["kl/ref/k3"][1] = 1.93                             # 0 -> 1.93 in one step: no ratio to a 0, the floor decides
    f = only(doctor(tmp_path, spec, s), "kl-spike")
    assert (f.first_step, f.last_step, f.count) == (1, 1, 1)


def test_a_kl_ramping_up_fast_is_no_spike(tmp_path):
    spec = "trl/grpo@1.16.0"                             # a weak beta: the KL doubles at first, then keeps growing
    s = R.healthy(spec)
    ramp = [0.0, 0.0047, 0.027, 0.068, 0.135, 0.142, 0.193, 0.215, 0.238, 0.229]
    for t in range(N):
        s["kl/ref/k3"][t] = ramp[t] if t < len(ramp) else min(0.9, 0.23 + 0.006 * (t - 9)) * (1 + 0.05 * (t % 3))
    d = doctor(tmp_path, spec, s)
    assert "kl-spike" in d.ran and d.findings == [], [f.summary() for f in d.findings]


@pytest.mark.parametrize("spec", RL)
def test_no_update_a_zero_learning_rate_and_a_kl_of_exactly_zero(tmp_path, spec):
    s = R.healthy(spec)
    for t in range(N):
        s["optim/lr"][t] = 0.0
        s[kl_name(s)][t] = 0.0
    f = only(doctor(tmp_path, spec, s), "no-update")
    assert (f.first_step, f.last_step, f.count) == (0, N - 1, 1)
    assert set(f.series) == {"lr", "kl"}


def test_a_gradient_norm_alternating_between_two_usual_levels_is_no_explosion(tmp_path):
    spec = "trl/grpo@1.16.0"                             # steps whose groups all have equal rewards: ~1e-3
    s = R.healthy(spec)
    for t in range(N):
        s["optim/grad_norm"][t] = (0.08 + 0.005 * (t % 4)) if t % 7 in (0, 3) else 0.001 * (1 + 0.1 * (t % 5))
    d = doctor(tmp_path, spec, s)
    assert "grad-norm-explosion" in d.ran and "grad-norm-explosion" not in [f.id for f in d.findings]
    s["optim/grad_norm"][100] = 2.0                      # 25x the upper level: an explosion all the same
    f = only(doctor(tmp_path, spec, s), "grad-norm-explosion")
    assert (f.first_step, f.last_step) == (100, 100)


def test_no_update_dpo_zero_learning_rate_and_a_margin_of_exactly_zero(tmp_path):
    spec = "trl/dpo@1.16.0"                              # no KL: DPO's reward margin is 0 when policy = reference
    s = R.healthy(spec)
    for t in range(N):
        s["optim/lr"][t] = 0.0
        s["preference/reward/margin"][t] = 0.0
    f = only(doctor(tmp_path, spec, s), "no-update")
    assert (f.first_step, f.last_step) == (0, N - 1) and set(f.series) == {"lr", "margin"}


def test_no_update_a_gradient_norm_vanishing_to_a_ten_thousandth_of_its_peak(tmp_path):
    spec = "trl/dpo@1.16.0"                              # a saturated model: the loss is 0, so is its gradient
    s = R.healthy(spec)
    for t in range(14, N):
        s["optim/grad_norm"][t] = 1e-6 * (1 + 0.1 * (t % 3))
    f = only(doctor(tmp_path, spec, s), "no-update")
    assert (f.first_step, f.last_step) == (14, N - 1) and set(f.series) == {"grad", "lr"}


@pytest.mark.parametrize("spec", RL)
def test_loss_kl_and_grad_norm_jumping_three_steps_apart_are_together(tmp_path, spec):
    s = R.healthy(spec)
    loss = "loss/total" if "loss/total" in s else "loss/policy"
    s[kl_name(s)][90] *= 10
    s["optim/grad_norm"][90] = 3.0
    s[loss][93] = 0.5                                    # the loss follows 3 steps later
    f = only(doctor(tmp_path, spec, s), "loss-kl-grad-spike-together")
    assert (f.first_step, f.last_step) == (93, 93)


def test_ppo_a_drastic_first_update_approx_kl_above_1_and_clip_fraction_for_5_points(tmp_path):
    spec = "trl/ppo@0.12.0"                              # lr 0.1: the first update is far too drastic
    s = R.healthy(spec)
    s["kl/old_policy/k2"][0] = 14.8                      # the first point: no baseline yet, 1 nat is beyond any
    for t, v in zip(range(0, 8), [0.44, 0.33, 0.34, 0.26, 0.25, 0.10, 0.31, 0.3]):
        s["policy/clip_frac"][t] = v                     # above 0.2 at steps 0-4, a dip at 5
    d = doctor(tmp_path, spec, s)
    a, c = only(d, "approx-kl-spike"), only(d, "clip-fraction-high")
    assert (a.first_step, a.last_step, c.first_step, c.last_step) == (0, 0, 0, 4)
