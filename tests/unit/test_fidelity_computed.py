"""Fidelity computed from stated reductions (issue 20; trackbridge/translate/fidelity.py): config switches with and
without the run config (the default noted), level counts from the config (one item is the identity), pooling
reductions, the canonical reference, framework A against framework B directly, and the reason generated from the
fields that differ. The two frameworks are made up (tests/data/reductions: veRL-like `alpha`, TRL-like `beta`)."""
from __future__ import annotations

import pytest

import trackbridge
from trackbridge.schema.loader import load_registry
from trackbridge.translate.fidelity import judge, pools, reference, resolve

from _support import DATA

FILES = [str(DATA / "reductions" / n) for n in ("canonical-extra.yaml", "alpha.yaml", "beta.yaml")]


@pytest.fixture(scope="module")
def reg():
    return load_registry(FILES)


def res(reg, fw_name, key, config=None, trainer=None):
    fw = reg.frameworks[fw_name]
    entry = next(e for e in fw.entries if e.key == key)
    n = len(fw.releases) - 1
    return resolve(entry, fw, trainer, n, n, config or {})


def ref(reg, name):
    return reference(reg.canonical.metrics[name])


def test_default_config_four_mini_batches_averaged_unweighted_is_approximate_with_the_count(reg):
    a = res(reg, "alpha", "actor/kl_loss")
    assert a.fields["mini_batches"] == "mean" and a.counts["mini_batches"].n == 4.0
    why = judge(a, ref(reg, "toy/kl"))
    assert why is not None
    clause = next(c for c in why.split(" [mini_batches]")[0].split("; ") if c.startswith("alpha"))
    assert clause == ("alpha 'actor/kl_loss' averages its 4 mini-batches (optimizer steps) unweighted (mini_batches "
                      "= data.train_batch_size / actor.ppo_mini_batch_size * actor.ppo_epochs = 4, with "
                      "data.train_batch_size=1024 (default), actor.ppo_mini_batch_size=256 (default), "
                      "actor.ppo_epochs=1 (default))")
    assert "canonical 'toy/kl' is one token mean over the step's whole batch [mini_batches]" in why
    # the defaults it read are remembered (the translation says them in a note)
    assert dict(a.defaults) == {"actor.loss_agg_mode": "token-mean", "data.train_batch_size": 1024,
                                "actor.ppo_mini_batch_size": 256, "actor.ppo_epochs": 1}
    # processes all_reduce_weighted of a token mean pools the ranks: not a difference
    assert "[processes]" not in why and a.fields["processes"] == "none"


def test_one_mini_batch_is_the_identity_and_then_exact(reg):
    cfg = {"data.train_batch_size": 256, "actor.ppo_mini_batch_size": 256, "actor.ppo_epochs": 1,
           "actor.loss_agg_mode": "token-mean"}
    a = res(reg, "alpha", "actor/kl_loss", cfg)
    assert a.counts["mini_batches"].one and a.fields["mini_batches"] == "none" and a.stated["mini_batches"] == "mean"
    assert a.defaults == ()
    assert judge(a, ref(reg, "toy/kl")) is None
    # two epochs over the one mini-batch: two optimizer steps again
    a2 = res(reg, "alpha", "actor/kl_loss", {**cfg, "actor.ppo_epochs": 2})
    assert a2.counts["mini_batches"].n == 2.0 and "[mini_batches]" in judge(a2, ref(reg, "toy/kl"))
    # config values as trackers store them (text) count as numbers
    a3 = res(reg, "alpha", "actor/kl_loss", {k: str(v) for k, v in cfg.items()})
    assert judge(a3, ref(reg, "toy/kl")) is None


def test_a_config_switch_reads_the_run_config_and_names_it(reg):
    cfg = {"data.train_batch_size": 256, "actor.loss_agg_mode": "seq-mean-token-mean"}
    a = res(reg, "alpha", "actor/kl_loss", cfg)
    assert a.fields["tokens"] == "seq_mean_token_mean"
    why = judge(a, ref(reg, "toy/kl"))
    assert ("alpha 'actor/kl_loss' is the mean of per-sequence token means (actor.loss_agg_mode=seq-mean-token-mean); "
            "canonical 'toy/kl' is the token mean [tokens]") in why
    # a token-weighted combination of per-sequence means does not pool them: a second difference, micro_batches
    assert "[micro_batches]" in why
    # without the key the default is read, and said so
    a = res(reg, "alpha", "response_length/mean")
    assert a.switched["tool_tokens"] == ("rollout.multi_turn", False, True)
    # a value the map does not list cannot be placed: never exact
    a = res(reg, "alpha", "actor/kl_loss", {"data.train_batch_size": 256, "actor.loss_agg_mode": "seq-sum"})
    why = judge(a, ref(reg, "toy/kl"))
    assert a.fields["tokens"] == "?" and "cannot be placed" in why and "actor.loss_agg_mode=seq-sum" in why


def test_framework_to_framework_is_judged_directly(reg):
    # alpha at its defaults averages 4 mini-batches; beta averages num_iterations=4 mini-batches and 1 micro-batch,
    # logs every step: both differ from the reference in the same way, so they are exact to each other
    a = res(reg, "alpha", "actor/kl_loss")
    b = res(reg, "beta", "kl", {"num_iterations": 4, "logging_steps": 1})
    assert judge(a, ref(reg, "toy/kl")) is not None and judge(b, ref(reg, "toy/kl")) is not None
    assert judge(a, b) is None and judge(b, a) is None
    # a different number of mini-batches is still an unweighted mean of mini-batches: the same reduction by field.
    # The default logging window (10 steps) is a difference of beta's
    b10 = res(reg, "beta", "kl", {"num_iterations": 4})
    why = judge(a, b10)
    assert why == ("alpha 'actor/kl_loss' logs every step; beta 'kl' averages the 10 steps since the last log "
                   "unweighted (window = logging_steps = 10 (the default)) [window]")


def test_tool_tokens_none_matches_either_and_a_config_turns_tools_on(reg):
    a, b = res(reg, "alpha", "response_length/mean"), res(reg, "beta", "completions/mean_length",
                                                          {"logging_steps": 1})
    assert a.fields["tool_tokens"] == b.fields["tool_tokens"] == "none"
    assert judge(a, b) is None
    assert judge(a, ref(reg, "toy/length")) is None       # a driver's mean over sequences is the pooled mean
    a = res(reg, "alpha", "response_length/mean", {"rollout.multi_turn": True})
    b = res(reg, "beta", "completions/mean_length", {"logging_steps": 1, "tools": ["search"]})
    assert judge(a, b) == ("alpha 'response_length/mean' counts tool-output tokens (rollout.multi_turn=True); beta "
                           "'completions/mean_length' leaves tool-output tokens out (tools=['search']) [tool_tokens]")


def test_a_window_of_one_step_is_the_identity_and_the_last_step_of_a_window_is_that_steps_value(reg):
    b = res(reg, "beta", "learning_rate", {"logging_steps": 1})
    assert judge(b, ref(reg, "toy/lr")) is None
    # one row every 10 steps holding the row's own step's value: what the reference logs at that step (the steps
    # between rows are not logged, which no logged value suffers from)
    b = res(reg, "beta", "learning_rate")
    assert b.stated["window"] == "last" and b.fields["window"] == "step" and b.counts["window"].n == 10
    assert judge(b, ref(reg, "toy/lr")) is None
    # an average over the window is not one step's value
    k = res(reg, "beta", "kl", {"num_iterations": 1})
    assert k.fields["window"] == "mean"
    assert "beta 'kl' averages the 10 steps since the last log unweighted (window = logging_steps = 10 (the " \
           "default)); canonical 'toy/kl' logs every step [window]" in judge(k, ref(reg, "toy/kl"))
    # and where the other side averages, the reason says what the last-step row is
    lr_mean = resolve_with(reg, "beta", "learning_rate", window="mean")
    assert judge(b, lr_mean) == ("beta 'learning_rate' logs the value of the step it is logged at (one row every 10 "
                                 "steps); beta 'learning_rate' averages the 10 steps since the last log unweighted "
                                 "(window = logging_steps = 10 (the default)) [window]")


def resolve_with(reg, fw_name, key, config=None, **fields):
    """The entry's reduction with some fields replaced (a made-up variant of a real entry)."""
    from dataclasses import replace as dc_replace
    fw = reg.frameworks[fw_name]
    entry = next(e for e in fw.entries if e.key == key)
    entry = dc_replace(entry, reduce=entry.reduce.with_fields(**fields))
    n = len(fw.releases) - 1
    return resolve(entry, fw, None, n, n, config or {})


def test_an_unknown_count_is_never_one(reg):
    from trackbridge.schema.reductions import parse_reduce
    from trackbridge.translate.fidelity import _resolve
    fw = reg.frameworks["alpha"]
    red, _ = parse_reduce({"tokens": "token_mean", "processes": "all_reduce_mean", "snapshot": "update"}, {})
    r = _resolve(red, "alpha 'x'", fw, None, 1, 1, {})
    assert r.counts["processes"].n is None and r.counts["processes"].declared
    assert r.fields["processes"] == "all_reduce_mean"
    assert "averages its processes' values unweighted (how many is unknown from the config)" in \
        judge(r, ref(reg, "toy/kl"))
    # a level the framework gives no count for is not one item either
    red, _ = parse_reduce({"tokens": "token_mean", "micro_batches": "mean"}, {})
    r = _resolve(red, "alpha 'x'", fw, None, 1, 1, {})
    assert r.fields["micro_batches"] == "mean" and not r.counts["micro_batches"].declared
    assert "the mapping gives no count for micro_batches" in judge(r, ref(reg, "toy/kl"))


def test_deviation_is_never_equal_and_a_missing_reference_is_said(reg):
    from trackbridge.schema.reductions import parse_reduce
    red, problems = parse_reduce({"tokens": "token_mean", "deviation": "includes the KL penalty"}, {})
    assert not problems and red.get("deviation") == "includes the KL penalty"
    assert reference(reg.canonical.metrics["toy/frac"]) is None


@pytest.mark.parametrize("level, value, tokens, stat, want", [
    ("micro_batches", "token_weighted", "token_mean", "mean", True),
    ("micro_batches", "token_weighted", "seq_mean_token_mean", "mean", False),
    ("micro_batches", "seq_weighted", "per_seq", "mean", True),
    ("processes", "all_reduce_weighted", "token_mean", "fraction", True),
    ("processes", "gather", "per_seq", "std", True),
    ("processes", "all_reduce_mean", "token_mean", "mean", False),
    ("mini_batches", "max", "per_seq", "max", True),
    ("mini_batches", "max", "per_seq", "mean", False),
    ("mini_batches", "sum", "token_sum", "mean", True),
    ("window", "mean", "token_mean", "mean", False),
])
def test_pooling_reductions(level, value, tokens, stat, want):
    assert pools(level, value, tokens, stat) is want


def test_a_key_whose_reduction_changed_between_releases_names_each_release_range():
    """A detected range of TRL releases holds clip_ratio/high_max under two reductions (v0.17.0..v1.8.0 a mean over
    processes' token fractions, v1.9.0 on a max over sequences): the reason names each side by its releases, so it
    never reads as a contradiction about one name ("trl 'x' is the token mean; trl 'x' is the mean of ...")."""
    res = trackbridge.translate({"clip_ratio/high_max": 0.1}, source="trl/grpo@0.26.0..1.16.0",
                                config={"logging_steps": 1})
    why = res.approximate["policy/clip_frac_high_max"]
    assert "trl 'clip_ratio/high_max@v0.17.0..v1.8.0' is the token mean" in why, why
    assert "trl 'clip_ratio/high_max@v1.9.0..now' is the mean of per-sequence token means" in why, why
    assert "trl 'clip_ratio/high_max' is" not in why and "the release matters" in why
