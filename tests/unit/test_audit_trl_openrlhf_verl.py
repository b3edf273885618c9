"""Mapping errors an independent audit found in TRL, OpenRLHF and veRL, each checked against the shipped mappings.

The facts, read at the frameworks' tags (cited in the entries' ``source``):

* TRL legacy PPO ``objective/logprobs`` / ``objective/ref_logprobs`` (v0.3.0 - v0.11.4) are the log-probs of every
  position of the padded query+response window, unmasked (trl/trainer/ppo_trainer.py@v0.11.4:1031, 1322); v0.2.x
  kept each sequence's response tokens (ppo_trainer.py@v0.2.1:579).
* TRL async GRPO ``wait_scoring_ms``: every sample carries its group's wait, pooled over every sample of every rank
  (async_rollout_worker.py@v1.10.0:705, async_grpo_trainer.py@v1.10.0:1060).
* TRL self-distillation ``{method}/distillation_loss`` (v1.0.0+): each rank's token mean, gathered and averaged
  (sdpo_trainer.py@v1.16.0:1258; self_distillation_mixin.py@v1.0.0:202); ``self_distillation/distillation_loss`` is
  the same value under the ``self_distillation/`` prefix, not a method named ``self_distillation``.
* TRL DPO ``logps/chosen|rejected`` are length-normalised with ``loss_type: ipo`` v0.7.11 - v0.28.0
  (dpo_trainer.py@v0.13.0:1197, @v0.28.0:1716) but not from the v0.29.0 rewrite (@v1.16.0:1393 normalises inside
  the loss only); LD-DPO (``ld_alpha``, v0.18.0+) weighs the tokens past the shared length (@v1.16.0:1303); TPO's
  ``ipo`` and ``tpo-l`` length-normalise (tpo_trainer.py@v1.16.0:661).
* OpenRLHF's console ``act_loss`` follows policy_loss's micro-batch reduction: a per-rank token mean averaged over the
  ranks (ppo_actor.py@v0.7.2:167), merged by tokens (@v0.9.8:201), aggregate_loss over the data-parallel (@v0.10.3)
  and the optimizer step's (@v0.10.4) token counts; ``pg`` is a mean of per-sequence token means up to v0.6.4 and a
  token mean from v0.7.0 (loss.py@v0.6.4:76, @v0.7.0:97); ``rollout/*`` are computed after dynamic filtering
  (ppo_trainer.py@v0.11.2:227, samples_generator.py@v0.11.2).
* veRL ``timing(s)/gen`` was logged by main commits after v0.1 whose package version is 0.1 (018b0d736).
"""
from __future__ import annotations

import re

import pytest

from trackbridge.pipeline import Translator
from trackbridge.schema.loader import load_registry
from trackbridge.translate.entries import choose, flatten_config
from trackbridge.translate.fidelity import resolve


@pytest.fixture(scope="module")
def reg():
    return load_registry()


def tags(why: str | None) -> set[str]:
    """The fields a generated reason names: ``[padding]``, ``[processes, window]``."""
    return {t.strip() for group in re.findall(r"\[([a-z_, ]+)\]", why or "") for t in group.split(",")}


def translate(reg, source, log, config=None):
    tr = Translator(source, "canonical", registry=reg, config=config)
    return tr, tr.translate(log)


def stated(reg, fw_name, key, trainer, release, config=None):
    """The reduction the entry chosen for ``key`` states (before the levels are normalised), and the entry."""
    fw = reg.frameworks[fw_name]
    at = fw.release_index(release)
    cfg = flatten_config(config)
    hit = choose(fw.lookup(key), trainer, at, at, cfg)
    assert hit is not None, (key, release)
    entry = hit[0]
    assert entry.applies(trainer, at, at), (key, release, entry.since, entry.until)
    return resolve(entry, fw, trainer, at, at, cfg).stated, entry


# ------------------------------------------------------------------------------------------------ TRL
@pytest.mark.parametrize("key, name", [("objective/logprobs", "policy/logprobs_dist"),
                                       ("objective/ref_logprobs", "policy/ref_logprobs_dist")])
def test_legacy_ppo_logprobs_hold_the_padded_query_and_response_window(reg, key, name):
    for release in ("v0.3.0", "v0.7.0", "v0.11.4"):
        _, res = translate(reg, f"trl/ppo_legacy@{release}", {key: [-1.0, -2.0]})
        assert list(res.metrics) == [name]
        why = res.approximate[name]
        assert {"padding", "deviation"} <= tags(why), why
        assert "query" in why and "padding" in why
    # v0.2.x sliced each sequence's response tokens: no padding, no query
    _, res = translate(reg, "trl/ppo_legacy@v0.2.1", {key: [-1.0, -2.0]})
    assert not {"padding", "deviation"} & tags(res.approximate.get(name)), res.approximate.get(name)


def test_async_grpo_wait_scoring_is_pooled_over_every_sample_of_every_rank(reg):
    red, entry = stated(reg, "trl", "wait_scoring_ms", "async_grpo", "v1.10.0")
    assert (red["tokens"], red["processes"], red["micro_batches"], red["window"]) == \
        ("per_seq", "gather", "mean", "mean")
    assert entry.to_canonical(1500.0) == pytest.approx(1.5)
    _, res = translate(reg, "trl/async_grpo@v1.10.0", {"wait_scoring_ms": 500.0})
    assert res.metrics == {"async/wait_scoring_time": pytest.approx(0.5)}
    # a mean over samples, not one value of one rank's worker
    assert {"tokens", "stat"} <= tags(res.approximate["async/wait_scoring_time"])


@pytest.mark.parametrize("release, method", [("v1.0.0", "sdpo"), ("v1.2.0", "sdft"), ("v1.9.0", "sdpo"),
                                             ("v1.16.0", "sdft")])
def test_self_distillation_prefix_is_not_a_method(reg, release, method):
    tr, res = translate(reg, f"trl/self_distillation@{release}",
                        {"self_distillation/distillation_loss": 0.25, f"{method}/distillation_loss": 0.25})
    assert set(res.metrics) == {"distill/self/distillation_loss", f"distill/{method}/loss"}
    assert "distill/self_distillation/loss" not in res.metrics
    # the {method} key is logged from v1.0.0 (the mixin): no other release's entry was borrowed
    assert not [n for n in tr.notes if "nearest release" in n], tr.notes


def test_self_distillation_loss_is_rank_token_means_averaged(reg):
    for release in ("v1.0.0", "v1.16.0"):
        red, _ = stated(reg, "trl", "sdpo/distillation_loss", "self_distillation", release)
        assert (red["tokens"], red["processes"], red["micro_batches"], red["window"], red["snapshot"]) == \
            ("token_mean", "all_reduce_mean", "mean", "mean", "update")
    _, res = translate(reg, "trl/self_distillation@v1.16.0", {"sdpo/distillation_loss": 0.25})
    why = res.approximate["distill/sdpo/loss"]
    assert "processes" in tags(why) and "tokens" not in tags(why), why


@pytest.mark.parametrize("side", ["chosen", "rejected"])
@pytest.mark.parametrize("release", ["v0.7.11", "v0.13.0", "v0.14.0", "v0.28.0"])
def test_dpo_ipo_logs_length_normalised_logps(reg, side, release):
    _, res = translate(reg, f"trl/dpo@{release}", {f"logps/{side}": -1.5}, {"loss_type": "ipo"})
    assert list(res.metrics) == [f"preference/logps_token_mean/{side}"]
    _, res = translate(reg, f"trl/dpo@{release}", {f"logps/{side}": -50.0}, {"loss_type": "sigmoid"})
    assert list(res.metrics) == [f"preference/logps/{side}"]


@pytest.mark.parametrize("side", ["chosen", "rejected"])
def test_dpo_ipo_before_its_normalisation_and_after_the_rewrite_logs_sums(reg, side):
    for release in ("v0.7.10", "v0.29.0", "v1.16.0"):
        _, res = translate(reg, f"trl/dpo@{release}", {f"logps/{side}": -50.0}, {"loss_type": "ipo"})
        assert list(res.metrics) == [f"preference/logps/{side}"], release
        assert "deviation" not in tags(res.approximate.get(f"preference/logps/{side}"))


@pytest.mark.parametrize("side", ["chosen", "rejected"])
def test_ld_dpo_is_not_the_summed_logps(reg, side):
    name = f"preference/logps/{side}"
    for release, config in (("v0.18.0", {"ld_alpha": 0.5}), ("v1.16.0", {"ld_alpha": 0.5}),
                            ("v1.16.0", {"ld_alpha": "0.5"}), ("v0.28.0", {"loss_type": "ipo", "ld_alpha": 0.5})):
        _, res = translate(reg, f"trl/dpo@{release}", {f"logps/{side}": -50.0}, config)
        assert list(res.metrics) == [name], (release, config)
        why = res.approximate[name]
        assert "deviation" in tags(why) and "LD-DPO" in why, (release, config, why)
    for config in (None, {"ld_alpha": None}, {"ld_alpha": "None"}):
        _, res = translate(reg, "trl/dpo@v1.16.0", {f"logps/{side}": -50.0}, config)
        assert "deviation" not in tags(res.approximate.get(name)), config
    # ld_alpha did not exist before v0.18.0
    _, res = translate(reg, "trl/dpo@v0.17.0", {f"logps/{side}": -50.0}, {"ld_alpha": 0.5})
    assert "deviation" not in tags(res.approximate.get(name))


@pytest.mark.parametrize("side", ["chosen", "rejected"])
def test_tpo_ipo_and_tpo_l_log_length_normalised_logps(reg, side):
    for loss_type in ("ipo", "tpo-l"):
        _, res = translate(reg, "trl/tpo@v1.16.0", {f"logps/{side}": -1.5}, {"loss_type": loss_type})
        assert list(res.metrics) == [f"preference/logps_token_mean/{side}"], loss_type
    for config in (None, {"loss_type": "sigmoid"}, {"loss_type": "hinge"}):
        _, res = translate(reg, "trl/tpo@v1.3.0", {f"logps/{side}": -50.0}, config)
        assert list(res.metrics) == [f"preference/logps/{side}"], config
    red, entry = stated(reg, "trl", f"logps/{side}", "tpo", "v1.16.0", {"loss_type": "ipo"})
    assert red["tokens"] == "seq_mean_token_mean" and "tpo_trainer.py" in entry.source


# ------------------------------------------------------------------------------------------------ OpenRLHF
@pytest.mark.parametrize("release, tokens, processes", [
    ("v0.7.2", "token_mean", "all_reduce_mean"),
    ("v0.9.7", "token_mean", "all_reduce_mean"),
    ("v0.9.8", "token_mean", "all_reduce_weighted"),
    ("v0.10.2", "token_mean", "all_reduce_weighted"),
    ("v0.10.3", "token_sum_dp_norm", "all_reduce_weighted"),
    ("v0.10.4", "token_sum_step_norm", "all_reduce_weighted"),
    ("v0.11.2", "token_sum_step_norm", "all_reduce_weighted"),
])
def test_openrlhf_act_loss_reduction_by_release(reg, release, tokens, processes):
    red, _ = stated(reg, "openrlhf", "act_loss", "ppo", release)
    assert (red["tokens"], red["processes"], red["micro_batches"], red["snapshot"]) == \
        (tokens, processes, "last", "update")


def test_openrlhf_act_loss_follows_the_loss_config(reg):
    cases = [("v0.9.7", {"policy_loss_type": "gspo"}, "seq_mean_token_mean", "all_reduce_mean"),
             ("v0.10.1.post2", {"policy_loss_type": "gspo"}, "seq_mean_token_mean", "token_weighted"),
             ("v0.10.3", {"actor": {"policy_loss_type": "gspo"}}, "seq_mean_token_mean", "token_weighted"),
             ("v0.11.2", {"actor": {"policy_loss_type": "gspo"}}, "seq_mean_token_mean", "token_weighted"),
             ("v0.11.2", {"actor": {"loss_agg_mode": "seq-mean-token-mean"}}, "seq_mean_token_mean",
              "token_weighted")]
    for release, config, tokens, processes in cases:
        red, _ = stated(reg, "openrlhf", "act_loss", "ppo", release, config)
        assert (red["tokens"], red["processes"]) == (tokens, processes), (release, config)


@pytest.mark.parametrize("release, tokens", [("v0.1.0", "seq_mean_token_mean"), ("v0.6.4", "seq_mean_token_mean"),
                                             ("v0.7.0", "token_mean"), ("v0.7.1.post2", "token_mean")])
def test_openrlhf_pg_is_a_token_mean_from_v0_7_0(reg, release, tokens):
    red, _ = stated(reg, "openrlhf", "pg", "ppo", release)
    assert (red["tokens"], red["processes"]) == (tokens, "all_reduce_mean")


ROLLOUT = {"rollout/reward_mean": "sampling/reward/mean", "rollout/reward_std": "sampling/reward/std",
           "rollout/response_length_mean": "sampling/response_length/mean",
           "rollout/truncated_rate": "sampling/truncated_rate", "rollout/num_samples": "sampling/num_samples"}


@pytest.mark.parametrize("release, config", [
    ("v0.9.8", {"dynamic_filtering": True}),
    ("v0.10.1.post2", {"dynamic_filtering": "True"}),
    ("v0.10.2", {"algo": {"dynamic_filtering_enable": True}}),
    ("v0.11.2", {"algo.dynamic_filtering_enable": True}),
])
def test_openrlhf_rollout_stats_are_after_dynamic_filtering(reg, release, config):
    log = {k: 1.0 for k in ROLLOUT}
    _, res = translate(reg, f"openrlhf/ppo@{release}", log, config)
    assert set(res.metrics) == set(ROLLOUT.values())
    for name in ROLLOUT.values():
        why = res.approximate[name]
        assert "deviation" in tags(why) and "dynamic filtering" in why, (name, why)
    # without filtering the chunk is every sample generated for the step: no deviation
    off = {k: (False if v is True else "False" if v == "True" else v) for k, v in flatten_config(config).items()
           if not isinstance(v, dict)}
    for cfg in (None, off):
        _, res = translate(reg, f"openrlhf/ppo@{release}", log, cfg)
        for name in ROLLOUT.values():
            assert "deviation" not in tags(res.approximate.get(name)), (release, cfg, name)


def test_openrlhf_rollout_entries_say_after_dynamic_filtering(reg):
    fw = reg.frameworks["openrlhf"]
    for key in ROLLOUT:
        entries = sorted((e for e, _ in fw.lookup(key)), key=lambda e: e.since)
        assert [(fw.release_name(e.since), e.until == float("inf")) for e in entries] == \
            [("v0.9.8", False), ("v0.10.2", True)], key
        for e, flag in zip(entries, ("(dynamic_filtering)", "(algo.dynamic_filtering_enable)")):
            assert (e.note or "").startswith(f"After dynamic filtering {flag}"), (key, e.note)


# ------------------------------------------------------------------------------------------------ veRL
def test_verl_timing_s_gen_is_read_at_v0_1(reg):
    for release in ("v0.1", "v0.2"):
        tr, res = translate(reg, f"verl/ppo@{release}", {"timing(s)/gen": 12.5})
        assert res.metrics == {"time/generation": 12.5}, release
        assert not [n for n in tr.notes if "nearest release" in n], (release, tr.notes)
    fw = reg.frameworks["verl"]
    (entry,) = [e for e, _ in fw.lookup("timing(s)/gen") if e.key_template is None]
    assert fw.release_name(entry.since) == "v0.1"


def test_online_dpo_and_nash_md_log_sums_whatever_the_loss_type(reg):
    # their own trainers log the summed log-probs (online_dpo_trainer.py@v1.9.0:1249, nash_md_trainer.py@v1.9.0:413);
    # the entries cite those files, not DPO's, whose ipo normalisation does not apply to them
    for trainer, release in (("online_dpo", "v1.9.0"), ("nash_md", "v1.9.0")):
        _, res = translate(reg, f"trl/{trainer}@{release}", {"logps/chosen": -50.0}, {"loss_type": "ipo"})
        assert list(res.metrics) == ["preference/logps/chosen"]
        red, entry = stated(reg, "trl", "logps/chosen", trainer, release, {"loss_type": "ipo"})
        assert red["tokens"] == "seq_mean_token_sum" and f"{trainer}_trainer.py" in entry.source, entry.source
        assert "ipo" not in (entry.note or "") or "changes the loss only" in entry.note
