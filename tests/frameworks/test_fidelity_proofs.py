"""The proofs report (issue 20): per canonical name two or more frameworks map, every pair of entries of two
frameworks, proven equal, proven different (with the measured gap) or unproven (with why): fingerprint proofs
(tests/_support/proven.py) for entries that state their reductions, the value proofs of issue 11 (the frameworks' own
metric code on one synthetic batch) for pairs of entries that do not yet. docs/fidelity-proofs.md is the table made
from them and must be up to date; each fingerprint proof's assertions are counted."""
from __future__ import annotations

import pytest

pytest.importorskip("trl")
pytest.importorskip("verl", reason="make test installs verl --no-deps")
from _support import fidelity_proofs as P  # noqa: E402
from _support import proven  # noqa: E402


@pytest.fixture(scope="module")
def fingerprints():
    return P.fingerprint_proofs()


@pytest.fixture(scope="module")
def outcomes(fingerprints):
    return P.outcomes(records=fingerprints[2])


def test_pairs_come_from_the_mappings(outcomes):
    """Every cross-framework pair of every shared canonical name has a row; an unproven row always says why."""
    pairs = P.pairs()
    names = P.shared_names()
    assert len(pairs) == len(outcomes) > 0 and len(names) >= 40
    assert {o.pair.canonical for o in outcomes} == set(names)
    for o in outcomes:
        assert o.pair.a.framework != o.pair.b.framework and o.pair.a.canonical == o.pair.b.canonical == \
            o.pair.canonical
        assert o.status in P.STATUSES and o.detail.strip(), o.pair.ident
        if o.status == "proven different":
            assert o.gap is not None and o.gap > 0, o.pair.ident
    assert sum(o.status != "unproven" for o in outcomes) >= 5, "the proofs stopped matching the mappings"
    # by construction (the engine reads mappings/proofs.yaml): a pair is exact only when proven equal
    exact = [o.pair.ident for o in outcomes if o.exact]
    assert exact and exact == [o.pair.ident for o in outcomes if o.status == "proven equal"]


def test_every_fingerprint_proof_ran_and_made_assertions(fingerprints):
    ran, failed, records = fingerprints
    assert not failed, failed
    if not ran:
        pytest.skip("no fingerprint proof is registered yet (tests/frameworks/test_proof_*.py: the fact helpers "
                    "add them with _support.proven.proof)")
    for p in ran:
        assert p.assertions >= proven.MIN_ASSERTIONS and p.records, p.name
        for rec in p.records:
            assert rec.entry.reduce is not None and proven.entry_ident(rec.entry) in records


def test_value_proofs_of_legacy_exact_claims_hold(outcomes):
    """Pairs of entries with hand-written `exact` on both sides that a value proof runs: the frameworks log the same
    value on the uneven and the even batch, unless the claim is listed in KNOWN_WRONG with its evidence (none is
    listed now: the mappings fixed them)."""
    checked = 0
    for o in outcomes:
        if not o.values:
            continue
        checked += 1
        if o.pair.wrong_key() in P.KNOWN_WRONG:
            # every wrong claim the value proofs found so far is a weighting difference: the values differ on the
            # uneven batch and agree when every micro-batch has the same number of tokens
            assert o.status == "proven different", f"{o.pair.ident}: fixed? drop it from KNOWN_WRONG"
            (ua, ub), (ea, eb) = o.values["uneven"], o.values["even"]
            assert not P.close(ua, ub) and P.close(ea, eb), o.detail
            continue
        assert o.status == "proven equal", f"{o.pair.ident}: {o.detail} (a new exact claim the code contradicts: " \
                                           "add it to KNOWN_WRONG with the evidence and tell the mapping owner)"
    if not checked:
        pytest.skip("no pair of legacy exact entries is run by a value proof any more (the entries state reductions)")


def test_token_mean_is_what_verl_and_openrlhf_clip_log():
    """Cross-check of the batch: the token mean over all ranks and micro-batches, computed here from the batch,
    is veRL's actor/entropy and OpenRLHF's ppo_clip_ratio; TRL's GA=2 value is the mean of its two micro-batch means."""
    import torch
    b = P.BATCHES[False]
    m = b.mask.bool()
    ratio = (b.logp - b.old_logp).exp()
    adv = P.grpo_advantages(b)[:, None]
    clipped = (((ratio < 0.8) & (adv < 0)) | ((ratio > 1.2) & (adv > 0))).float()
    assert P.close(P.verl_run(b)["actor/entropy"], b.entropy[m].mean().item())
    assert P.close(P.openrlhf_run(b)["ppo_clip_ratio"], clipped[m].mean().item())
    per_micro = []
    for micro in range(P.GA):
        rows = [i for r in range(b.world) for i in b.micro_rows(r, micro)]
        per_micro.append(clipped[rows][m[rows]].mean().item())
    assert P.close(P.trl_grpo(b)["clip_ratio/region_mean"], sum(per_micro) / len(per_micro))
    assert torch.is_tensor(b.mask)


def test_approximate_weighting_pairs_differ_as_the_reason_says():
    """A pair the proofs run where one entry is approximate because of `weighting`: the values differ on the uneven
    batch and agree on the even one."""
    import itertools
    reg = P._registry()
    checked = 0
    by: dict[str, list] = {}
    for fw in reg.frameworks.values():
        for e in fw.entries:
            by.setdefault(e.canonical, []).append(e)
    for proof in P.PROOFS:
        uneven, even = P.proof_values(proof, False), P.proof_values(proof, True)
        for a, b in itertools.combinations(by.get(proof.canonical, []), 2):
            if a.framework == b.framework or (a.exact and b.exact):
                continue
            if not any("weighting" in e.differs for e in (a, b) if not e.exact):
                continue
            ka, _ = P._match(reg, a, uneven)
            kb, _ = P._match(reg, b, uneven)
            if ka is None or kb is None:
                continue
            checked += 1
            assert not P.close(uneven[ka], uneven[kb]), (P.label(a), P.label(b))
            assert P.close(even[ka], even[kb]), (P.label(a), P.label(b))
    if not checked:
        pytest.skip("no approximate (weighting) pair is covered by a proof in the current mappings")


def test_derived_rules_listed_and_proven_rules_hold():
    from trackbridge.derive import rules_for
    rows = P.derived_outcomes()
    assert [r[0] for r in rows] == [r.name for r in rules_for(P._registry())]
    for name, _, status, detail in rows:
        assert status != "proven different", f"derived rule {name}: {detail}"
    assert any(r[2] == "proven equal" for r in rows)


def test_table_and_shipped_proofs_are_up_to_date(fingerprints):
    """docs/fidelity-proofs.md and mappings/proofs.yaml (what the engine reads to call a pair exact) are generated
    from the mappings and the proofs; regenerate them with `.venv/bin/python tests/_support/fidelity_proofs.py` after
    changing either."""
    assert P.PROOFS_FILE.read_text(encoding="utf-8") == P.proofs_yaml(fingerprints[2]), \
        "mappings/proofs.yaml is stale: run .venv/bin/python tests/_support/fidelity_proofs.py"
    assert P.DOC.read_text(encoding="utf-8") == P.table(fingerprints=fingerprints), \
        "docs/fidelity-proofs.md is stale: run .venv/bin/python tests/_support/fidelity_proofs.py"


def test_reward_fn_std_differs_by_bessels_correction():
    """TRL's rewards/{fn}/std (approximate [estimator]) is the sample std, veRL's gdpo/{fn}/std the population std of
    the same 8 scores: the ratio is sqrt(8 / 7), on the uneven and the even batch."""
    for even in (False, True):
        b = P.BATCHES[even]
        trl_std = P.trl_scores(b)["rewards/score/std"]
        verl_std = P.verl_driver(b)["gdpo/score/std"]
        assert P.close(trl_std / verl_std, (8 / 7) ** 0.5), (trl_std, verl_std)
        assert P.close(P.trl_scores(b)["rewards/score/mean"], P.verl_driver(b)["gdpo/score/mean"])


def test_trl_reward_statistics_are_over_all_ranks():
    """TRL GRPO's reward, reward_std and frac_reward_zero_std come from the rewards gathered over both ranks (one
    GRPO group per rank): the batch mean and the batch sample std of all 8 scores; no group of this batch has
    zero std."""
    import statistics
    b = P.BATCHES[False]
    m = P.trl_scores(b)
    assert P.close(m["reward"], sum(b.scores) / len(b.scores))
    assert P.close(m["reward_std"], statistics.stdev(b.scores))
    assert m["frac_reward_zero_std"] == 0.0
