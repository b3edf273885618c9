"""KL names carry the pair of distributions and the estimator (issue 11 item 6; docs/mapping-format.md "KL names").

GRPO's `kl` and veRL's `actor/kl_loss` are the same loss term (k3 of the policy being updated against the reference)
and share `kl/ref/k3` (exact only where veRL's reduction is the step's token mean: one mini-batch and one epoch);
veRL's `actor/reward_kl_penalty` is the reward penalty (k1 of the rollout-time policy against the reference,
`kl/old_ref/k1`) and never becomes GRPO's `kl`."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

import trackbridge
from trackbridge.schema.loader import build_registry, load_registry
from trackbridge.schema.yamlfile import MappingError

VERL_K1 = {"actor_rollout_ref": {"actor": {"kl_loss_type": "kl"}}}
VERL_SEQ_MEAN = {"actor_rollout_ref": {"actor": {"loss_agg_mode": "seq-mean-token-mean"}}}
ORLHF_LOSS_K3 = {"algo": {"kl": {"use_loss": True, "estimator": "k3"}}}


@pytest.fixture(scope="module")
def reg():
    return load_registry()


def test_grpo_kl_goes_to_verl_kl_loss():
    """The same loss term, so the name maps: veRL's kl_loss, not the reward-side penalty. Whether the two are exact to
    each other is computed from both reductions: veRL's default config averages its 4 optimizer steps
    (train_batch_size 1024 / ppo_mini_batch_size 256 x ppo_epochs 1) unweighted (engine workers, losses.py@v0.9.1), and
    TRL's default logging_steps (10) averages 10 steps in a row: approximate, saying why (issue 20)."""
    res = trackbridge.translate({"kl": 0.01}, source="trl/grpo@1.16.0", target="verl@0.9.1")
    assert res.metrics == {"actor/kl_loss": 0.01}
    assert "actor/reward_kl_penalty" not in res.metrics
    reason = res.approximate["actor/kl_loss"]
    assert "4 mini-batches" in reason and "[mini_batches]" in reason, reason
    assert "logging_steps = 10 (the default)" in reason, reason
    assert trackbridge.translate({"kl": 0.01}, source="trl/grpo@1.16.0").metrics == {"kl/ref/k3": 0.01}


def test_verl_kl_loss_with_another_estimator_or_reduction_is_not_grpo_kl_exactly():
    # kl_loss_type kl (k1): another quantity, another name: GRPO has no name for it
    res = trackbridge.translate({"actor/kl_loss": 0.02}, source="verl@0.9.1", target="trl/grpo@1.16.0",
                                config=VERL_K1)
    assert "kl" not in res.metrics and res.metrics == {"kl/ref/k1": 0.02}
    # loss_agg_mode seq-mean-token-mean: the same KL, another reduction: GRPO's kl, approximate, with the reason
    res = trackbridge.translate({"actor/kl_loss": 0.02}, source="verl@0.9.1", target="trl/grpo@1.16.0",
                                config=VERL_SEQ_MEAN)
    assert res.metrics == {"kl": 0.02}
    assert "loss_agg_mode=seq-mean-token-mean" in res.approximate["kl"] and "[tokens]" in res.approximate["kl"]
    # one mini-batch and one epoch with token-mean: veRL's value is the step's token mean, exactly kl/ref/k3
    one = {"data": {"train_batch_size": 64}, "actor_rollout_ref": {"actor": {"ppo_mini_batch_size": 64}}}
    res = trackbridge.translate({"actor/kl_loss": 0.02}, source="verl@0.9.1", config=one)
    assert res.metrics == {"kl/ref/k3": 0.02} and not res.approximate, res.approximate


def test_verl_reward_kl_penalty_never_becomes_grpo_kl():
    for config in (None, {"algorithm": {"kl_penalty": "low_var_kl"}}):
        res = trackbridge.translate({"actor/reward_kl_penalty": 0.03}, source="verl@0.9.1",
                                    target="trl/grpo@1.16.0", config=config)
        assert "kl" not in res.metrics, res.metrics
        want = "kl/old_ref/k3" if config else "kl/old_ref/k1"
        assert res.metrics == {want: 0.03}
    # and a GRPO kl sent to veRL is never written as the reward penalty (checked for every release range)
    for target in ("verl@0.8.0", "verl@0.9.1", "verl"):
        out = trackbridge.translate({"kl": 0.01}, source="trl/grpo@1.16.0", target=target).metrics
        assert "actor/reward_kl_penalty" not in out and "critic/kl" not in out, (target, out)


def test_openrlhf_kl_is_placed_by_use_loss_and_estimator():
    grpo = set(trackbridge.translate({"kl": 0.1}, source="trl/grpo@1.16.0").metrics)
    for release, config in (("0.11.2", ORLHF_LOSS_K3), ("0.10.2", ORLHF_LOSS_K3),
                            ("0.9.8", {"use_kl_loss": True, "kl_estimator": "k3"})):
        res = trackbridge.translate({"kl": 0.1}, source=f"openrlhf@{release}", config=config)
        assert set(res.metrics) == grpo == {"kl/ref/k3"}, (release, res.metrics)
    # the k3 loss is the canonical reduction as stated, and proven at 0.10.2 (OpenRLHF's own actor with the k3
    # loss, tests/frameworks/test_proof_openrlhf_old2.py): exact, no mark
    approx = trackbridge.translate({"kl": 0.1}, source="openrlhf@0.10.2", config=ORLHF_LOSS_K3).approximate
    assert approx == {}, approx
    # the default estimator k1 as a loss, the reward-side KL without the flag
    cases = [({"algo": {"kl": {"use_loss": True}}}, "kl/ref/k1"), (None, "kl/old_ref/k1"),
             ({"algo": {"kl": {"estimator": "k3"}}}, "kl/old_ref/k3")]
    for config, want in cases:
        assert set(trackbridge.translate({"kl": 0.1}, source="openrlhf@0.11.2", config=config).metrics) == {want}
    # OpenRLHF k3 as a loss into GRPO: GRPO's kl (approximate in 0.11.2: the step-normalised sums re-weighted by
    # tokens, mappings/openrlhf.yaml profile ppo_step_norm)
    res = trackbridge.translate({"kl": 0.1}, source="openrlhf@0.11.2", target="trl/grpo@1.16.0", config=ORLHF_LOSS_K3)
    assert res.metrics == {"kl": 0.1}
    assert "token sum over the optimizer step's tokens per rank and micro-batch (not a token mean)" in \
        res.approximate["kl"]


def test_trl_kls_by_pair():
    t = trackbridge.translate
    assert t({"kl": 0.1}, source="trl/rloo@1.16.0").metrics == {"kl/old_ref/k1": 0.1}       # k1 in the reward
    assert t({"objective/kl": 2.0}, source="trl/ppo@0.12.0").metrics == {"kl/old_ref/k1_seq_sum": 2.0}
    assert t({"objective/kl": 2.0}, source="trl/ppo@0.19.0", config={"kl_estimator": "k3"}).metrics == \
        {"kl/old_ref/k3_seq_sum": 2.0}
    assert t({"objective/kl": 2.0}, source="trl-legacy@0.11.4", config={"kl_penalty": "mse"}).metrics == \
        {"kl/old_ref/k2_seq_sum": 2.0}
    assert t({"kl": 0.1}, source="trl/kto@1.16.0").metrics == {"preference/kto_kl": 0.1}


OLD_1_0_0 = {"kl/ref": "kl/ref/k3", "loss/kl": "kl/ref/k3", "kl/ref_seq_sum": "kl/old_ref/k1_seq_sum",
             "kl/ref_seq_sum_dist": "kl/old_ref/k1_seq_sum_dist", "kl/old_policy": "kl/old_policy/k1",
             "kl/old_policy_k2": "kl/old_policy/k2", "kl/rollout": "kl/rollout/k1", "kl/rollout_k3": "kl/rollout/k3"}
KEPT_1_0_0 = ["kl/coef", "kl/loss_coef", "kl/ref_logprob_diff", "reward/kl_penalty/mean",
              "reward/kl_penalty/token_mean", "preference/kto_kl"]


def test_1_0_0_kl_names_are_removed_only_through_renames(reg):
    c = reg.canonical
    assert c.version == "1.1.0"
    for old, new in OLD_1_0_0.items():
        assert old not in c.metrics and c.upgrade(old) == new and new in c.metrics, old
    for name in KEPT_1_0_0:
        assert name in c.metrics, name
    # several old names renamed to one: the first listed (kl/ref, GRPO's) is written for canonical@1.0.0
    assert c.downgrade("kl/ref/k3", "1.0.0") == "kl/ref"
    assert c.downgrade("kl/old_ref/k1", "1.0.0") == "kl/old_ref/k1"       # new in 1.1.0: no older name


def test_old_canonical_names_upgrade_on_input_and_downgrade_on_output(tmp_path):
    res = trackbridge.translate({"kl/ref": 0.1, "kl/old_policy": 0.2, "kl/rollout_k3": 0.3}, source="canonical")
    assert res.metrics == {"kl/ref/k3": 0.1, "kl/old_policy/k1": 0.2, "kl/rollout/k3": 0.3}
    # a 1.0.0 canonical stream into veRL: the loss term, not the reward penalty
    assert trackbridge.translate({"kl/ref": 0.1}, source="canonical", target="verl@0.9.1").metrics == \
        {"actor/kl_loss": 0.1}
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"kl/ref/k3": 0.1, "kl/old_policy/k2": 0.2, "kl/old_ref/k1_seq_sum": 3.0}) + "\n")
    r = subprocess.run([sys.executable, "-m", "trackbridge", "translate", "--from", "canonical", "--to",
                        "canonical@1.0.0", str(src)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    line = json.loads(r.stdout.splitlines()[0])
    assert {k: v for k, v in line.items() if "/" in k} == {"kl/ref": 0.1, "kl/old_policy_k2": 0.2,
                                                          "kl/ref_seq_sum": 3.0}


def kl_names(reg):
    return [m for m in reg.canonical.metrics.values()
            if (m.name.startswith("kl/") and m.unit.startswith("nats")) or m.name == "preference/kto_kl"]


def test_every_kl_name_has_an_estimator_and_a_role(reg):
    names = kl_names(reg)
    assert len(names) >= 18
    for m in names:
        assert m.estimator in ("k1", "k2", "k3"), m.name
        assert m.role in ("loss", "reward", "monitor"), m.name
        assert m.estimator in m.name.split("/")[-1] or m.name in ("kl/ref_logprob_diff", "preference/kto_kl"), m.name
    for name in ("kl/coef", "kl/loss_coef", "reward/kl_penalty/mean", "reward/kl_penalty/token_mean"):
        assert reg.canonical.metrics[name].role in ("loss", "reward"), name
    roles = {m.name: m.role for m in names}
    assert roles["kl/ref/k3"] == "loss" and roles["kl/old_ref/k1"] == "reward" and roles["kl/old_policy/k1"] == \
        "monitor"


def test_a_framework_key_lands_on_one_pair_per_configuration(reg):
    """Entries of one key in one release and trainer without a `when` never name two KL pairs (the estimator and
    the role come from the config, through `when`)."""
    for fw in reg.frameworks.values():
        plain = [e for e in fw.entries if e.canonical.startswith("kl/") and not e.when]
        for i, a in enumerate(plain):
            for b in plain[i + 1:]:
                if a.key == b.key and a.since <= b.until and b.since <= a.until and \
                        (not a.trainers or not b.trainers or a.trainers & b.trainers):
                    assert a.canonical == b.canonical, (fw.name, a.key, a.canonical, b.canonical)


def test_role_is_checked_by_the_loader(tmp_path):
    bad = tmp_path / "canonical.yaml"
    bad.write_text("format: trackbridge.canonical/1\nschema_version: 1.0.0\nversions: {1.0.0: {}}\nmetrics:\n"
                   "  kl/x/k1: {description: d, unit: nats/token, estimator: k1, role: penalty}\n")
    with pytest.raises(MappingError, match="role 'penalty' is not one of"):
        build_registry([bad], [])


def test_a_target_name_whose_meaning_needs_a_config_the_target_does_not_confirm_says_so():
    """TRL GRPO's kl (the KL loss term, k3) has OpenRLHF's `kl` as its name only under --algo.kl.use_loss and
    --algo.kl.estimator k3 (mappings/openrlhf.yaml `when:`): without a target config confirming them, the translation
    is approximate and says which config it needs and what OpenRLHF's kl is otherwise."""
    res = trackbridge.translate({"kl": 0.1}, source="trl/grpo@1.16.0", target="openrlhf@0.11.2")
    assert res.metrics == {"kl": 0.1}
    why = res.approximate["kl"]
    assert "openrlhf 'kl' is kl/ref/k3 only when algo.kl.estimator=k3, algo.kl.use_loss=True; the target config " \
           "does not say so (the defaults: algo.kl.estimator=k1, algo.kl.use_loss=False); otherwise openrlhf 'kl' " \
           "is kl/old_ref/k1 [when]" in why, why
    # half confirmed: the estimator's default still makes it the k1 loss term
    why = trackbridge.translate({"kl": 0.1}, source="trl/grpo@1.16.0", target="openrlhf@0.11.2",
                                config={"use_kl_loss": True}).approximate["kl"]
    assert "(the defaults: algo.kl.estimator=k1); otherwise openrlhf 'kl' is kl/ref/k1 [when]" in why, why
    # confirmed: no such clause
    res = trackbridge.translate({"kl": 0.1}, source="trl/grpo@1.16.0", target="openrlhf@0.11.2",
                                config={"use_kl_loss": True, "kl_estimator": "k3"})
    assert "[when]" not in res.approximate.get("kl", ""), res.approximate
    # a target whose config contradicts the when has no name for it: the canonical name is kept
    res = trackbridge.translate({"kl": 0.1}, source="trl/grpo@1.16.0", target="openrlhf@0.11.2",
                                config={"use_kl_loss": False})
    assert res.metrics == {"kl/ref/k3": 0.1}, res.metrics
