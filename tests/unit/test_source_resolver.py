"""The source of a run's names (trackbridge/pipeline/source.py), with its two policies: detect as keys arrive (a
logger, a one-shot dict) and pin (a stored run, resolved once from its first records). Facts (shipped mappings):
TRL's GRPO trainers log ``completions/mean_length``, ``frac_reward_zero_std`` and ``clip_ratio/region_mean``; a
spec without its trainer (``verl@0.4.1``) leaves the trainer to detect, one with it (``verl/ppo@0.4.1``) nothing."""
from __future__ import annotations

import pytest

from trackbridge.pipeline.source import UNKNOWN, SourceResolver
from trackbridge.schema.loader import load_registry
from trackbridge.schema.spec import parse_spec

GRPO = {"completions/mean_length": 1, "reward": 1, "kl": 1, "frac_reward_zero_std": 0, "clip_ratio/region_mean": 0}


@pytest.fixture(scope="module")
def reg():
    return load_registry()


def resolver(reg, spec):
    return SourceResolver(reg, parse_spec(spec, reg), {})


def test_detect_as_keys_arrive_then_keep_what_was_found(reg):
    r = resolver(reg, "auto")
    assert r.needs_detection and r.found is None
    assert r.observe({"mystery": 1}) is False and r.found is None       # nothing explains it yet
    assert r.observe(GRPO) is True
    assert r.found.framework == "trl" and r.found.trainer.startswith("grpo")
    assert r.observe(GRPO) is False                                    # no new key: nothing detected again
    assert r.try_pin() is True and r.pinned and not r.needs_detection


def test_pin_falls_back_to_unknown_or_to_the_spec_itself(reg):
    r = resolver(reg, "auto")
    r.observe({"mystery": 1})
    assert r.try_pin() is False and not r.pinned                       # nothing found: still detecting
    assert r.pin() is True and r.found is UNKNOWN and r.pinned
    v = resolver(reg, "verl@0.4.1")                                    # the trainer left out
    assert v.needs_detection and v.found is None
    assert v.pin() is True and v.found.framework == "verl"             # the spec, with no trainer chosen
    fixed = resolver(reg, "verl/ppo@0.4.1")
    assert not fixed.needs_detection and fixed.found.trainer == "ppo" and fixed.pin() is False


def test_a_fresh_resolver_keeps_a_pinned_source_and_forgets_an_unpinned_one(reg):
    r = resolver(reg, "auto")
    r.observe(GRPO)
    unpinned = r.fresh()
    assert unpinned.found is None and unpinned.detection is None and unpinned.seen == set()
    assert unpinned.needs_detection and r.seen                          # the first run's keys stay its own
    r.try_pin()
    pinned = r.fresh()
    assert pinned.found == r.found and pinned.pinned and not pinned.needs_detection
    fixed = resolver(reg, "verl/ppo@0.4.1")
    assert fixed.fresh() is fixed and pinned is r                       # nothing a run changes: shared
