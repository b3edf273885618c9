"""The entries the real logs hit, against the shipped proofs (issue 33: "100% of the entries whose keys appear in the
real-log corpus and the examples"): tests/_support/proofs_corpus.py reads the corpus (tests/data/real/), the parsed
public logs (tests/data/public-logs/) and the examples as a user reads them, and names the entry each key was
translated with; mappings/proofs.yaml (kept current by tests/frameworks/test_fidelity_proofs.py) says which are
proven. docs/fidelity-proofs.md, "Entries the real logs hit", lists them.

At the time of writing (2026-12-03, evening): 319 entries hit, 282 proven; every other one says why (most are
entries of releases no proof can run here: a release of that range does not import with the test environment's
torch and transformers, or is older than every release tests/releases.txt installs and every tag vendored; a few
are wall-clock or device readings, or values no candidate reduction expresses). The proofs run the installed wheel,
the older releases of tests/releases.txt (in child processes) and the vendored tags' files (NeMo-RL, slime, SkyRL,
prime-rl and ROLL, and AReaL's v0.4.0).
"""
from __future__ import annotations

import pytest

pytest.importorskip("trl")

from _support import proofs_corpus as C  # noqa: E402

#: the proven hit entries of every framework the logs hit, at least (raised as proofs are added)
PROVEN_FLOOR = {"trl": 93, "verl": 113, "openrlhf": 8, "areal": 42, "nemo_rl": 31, "prime_rl": 10, "skyrl": 4,
                "slime": 18}


@pytest.fixture(scope="module")
def figures():
    from trackbridge.schema.loader import load_registry
    reg = load_registry()
    return reg, {f.framework: f for f in C.figures(reg, reg.proven)}


def test_every_log_is_read_and_hits_entries():
    found = C.hits()
    where = {w for h in found.values() for w in h.where}
    read = [label for label, _path in C.logs()]
    assert len(read) >= 60
    assert any(r.startswith("public:") for r in read) and any(r.startswith("example:") for r in read)
    # every log with per-step metrics that trackbridge recognises hits an entry (a summary or check table may not)
    assert len(where) >= 50, sorted(set(read) - where)
    assert {e.framework for e in (h.entry for h in found.values())} >= set(C.RUNNABLE)


def test_every_hit_entry_is_proven_or_says_why(figures):
    """No entry the real logs hit is left without a proof for want of one being written: each unproven one names why
    it cannot be proven here (another release than the one whose code runs, a wall-clock or device reading, a value
    no candidate reduction expresses ...). Every framework the logs hit runs: its wheel, or its tag's files
    vendored (tests/_support/vendored.py)."""
    _reg, figs = figures
    assert set(figs) <= set(PROVEN_FLOOR), sorted(set(figs) - set(PROVEN_FLOOR))
    for name, floor in PROVEN_FLOOR.items():
        f = figs[name]
        assert C.run_release(name) is not None, name
        assert f.proven >= floor, (name, f.proven, floor)
        assert f.proven + len(f.unproven) == f.hit
        missing = [f"{e.key} [{','.join(sorted(e.trainers or []))}] line {e.line}" for e, why, _n in f.unproven
                   if why == "no proof written yet"]
        assert not missing, (name, missing)
