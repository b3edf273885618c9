"""FrameworkMapping.lookup remembers each key's matches (detection asks for the same keys once per trainer and
release range): the answers are those of a fresh walk, ``index()`` forgets them, a pickled copy (the compiled
registry cache) carries none, and the cache stays bounded."""
from __future__ import annotations

import pickle

from trackbridge.schema import model
from trackbridge.schema.loader import load_registry


def _copy(fw):
    return pickle.loads(pickle.dumps(fw))


def test_lookups_are_a_fresh_walks_and_index_forgets_them():
    fw = _copy(load_registry().frameworks["verl"])
    keys = ["actor/ppo_kl", "critic/score/mean", "val-core/openai/gsm8k/acc/mean@1", "no/such/key"]
    fresh = {k: fw._match(k) for k in keys}
    assert fresh["actor/ppo_kl"] and fresh["val-core/openai/gsm8k/acc/mean@1"] and not fresh["no/such/key"]
    for _ in range(2):                                            # the second round comes from the cache
        assert {k: fw.lookup(k) for k in keys} == fresh
    fw.lookup("actor/ppo_kl").clear()                             # a caller's list is its own
    assert fw.lookup("actor/ppo_kl") == fresh["actor/ppo_kl"]
    assert "_lookups" not in _copy(fw).__dict__                   # the compiled cache pickles no lookups
    fw.entries = [e for e in fw.entries if e.key != "actor/ppo_kl"]
    fw.index()
    assert fw.lookup("actor/ppo_kl") == []


def test_the_cache_is_bounded(monkeypatch):
    monkeypatch.setattr(model, "LOOKUP_CACHE", 8)
    fw = _copy(load_registry().frameworks["trl"])
    for i in range(50):
        fw.lookup(f"custom/key_{i}")
    assert 0 < len(fw._lookups) <= 8
