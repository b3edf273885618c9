"""Proofs by execution (issue 11): the frameworks' own metric code on one synthetic batch, for every pair of keys the
mappings call the same quantity exactly. The pairs are enumerated from the mappings when the tests run
(tests/_support/fidelity_proofs.py); docs/fidelity-proofs.md is the table made from them and must be up to date."""
from __future__ import annotations

import pytest

pytest.importorskip("trl")
pytest.importorskip("verl", reason="make test installs verl --no-deps")
from _support import fidelity_proofs as P  # noqa: E402

PROVEN = ("proven equal", "proven different")


@pytest.fixture(scope="module")
def outcomes():
    return P.outcomes()


def test_pairs_come_from_the_mappings(outcomes):
    """Every cross-framework exact/exact pair has a row, and a source-only row always says why."""
    pairs = P.exact_pairs()
    assert len(pairs) == len(outcomes) > 0
    for o in outcomes:
        assert o.pair.a.exact and o.pair.b.exact and o.pair.a.framework != o.pair.b.framework
        assert o.status in PROVEN + ("source-only",)
        assert o.detail.strip(), o.pair.ident
    assert sum(o.status in PROVEN for o in outcomes) >= 5, "the proofs stopped matching the mappings"


@pytest.mark.parametrize("canonical", sorted({p.canonical for p in P.PROOFS}))
def test_exact_claims_hold(outcomes, canonical):
    """Pairs the proofs run: the frameworks log the same value on the uneven and the even batch, unless the pair is
    a known wrong claim (asserted by test_known_wrong_claim)."""
    for o in outcomes:
        if o.pair.canonical != canonical or o.status not in PROVEN or o.pair.wrong_key() in P.KNOWN_WRONG:
            continue
        assert o.status == "proven equal", f"{o.pair.ident}: {o.detail} (a new exact claim the code contradicts: " \
                                           "add it to KNOWN_WRONG with the evidence and tell the mapping owner)"


@pytest.mark.parametrize("key", sorted(P.KNOWN_WRONG), ids=lambda k: " ~ ".join(k))
def test_known_wrong_claim(outcomes, key, request):
    """The mapping says exact; the frameworks' code disagrees. Asserts the claim, xfail(strict) with the evidence:
    an XPASS means a framework changed; a skip means the mapping entry was fixed (drop the KNOWN_WRONG line)."""
    request.node.add_marker(pytest.mark.xfail(strict=True, reason=P.KNOWN_WRONG[key]))
    mine = [o for o in outcomes if o.pair.wrong_key() == key and o.status in PROVEN]
    if not mine:
        pytest.skip("the pair is no longer claimed exact (or no longer run): remove it from KNOWN_WRONG")
    for o in mine:
        assert o.status == "proven equal", f"{o.pair.ident}: {o.detail}"


@pytest.mark.parametrize("key", sorted(P.KNOWN_WRONG), ids=lambda k: " ~ ".join(k))
def test_known_wrong_claims_differ_by_weighting(outcomes, key):
    """What the frameworks really do: every wrong claim found so far is a weighting difference (a mean of
    micro-batch means, or a re-weighted normaliser): the values differ on the uneven batch and agree when every
    micro-batch has the same number of tokens."""
    mine = [o for o in outcomes if o.pair.wrong_key() == key and o.status in PROVEN]
    if not mine:
        pytest.skip("the pair is no longer claimed exact")
    for o in mine:
        (ua, ub), (ea, eb) = o.values["uneven"], o.values["even"]
        assert not P.close(ua, ub), o.detail
        assert P.close(ea, eb), o.detail


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


def test_table_is_up_to_date():
    """docs/fidelity-proofs.md is generated from the mappings and the proofs; regenerate it with
    `.venv/bin/python tests/_support/fidelity_proofs.py > docs/fidelity-proofs.md` after changing either."""
    assert P.DOC.read_text(encoding="utf-8") == P.table(), \
        "docs/fidelity-proofs.md is stale: run " \
        ".venv/bin/python tests/_support/fidelity_proofs.py > docs/fidelity-proofs.md"


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
