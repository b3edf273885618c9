"""The proofs report (issue 20): per canonical name two or more frameworks map, every pair of entries of two
frameworks, proven equal, proven different (with the measured gap) or unproven (with why): fingerprint proofs
(tests/_support/proven.py) for entries that state their reductions, the value proofs of issue 11 (the frameworks' own
metric code on one synthetic batch) for pairs of entries that do not yet. docs/fidelity-proofs.md is the table made
from them and must be up to date; each fingerprint proof's assertions are counted."""
from __future__ import annotations

import re

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


def test_every_entry_states_its_reduction_so_no_pair_needs_a_value_proof():
    """Fidelity is computed from stated reductions only: no shipped entry keeps a hand-written fidelity without a
    `reduce`, so every pair is decided by fingerprints (the value proofs of issue 11 decided such pairs once)."""
    reg = P._registry()
    entries = [e for fw in reg.frameworks.values() for e in [*fw.entries, *fw.template_entries]]
    assert len(entries) >= 1000
    unstated = [f"{e.framework} {e.key}" for e in entries if e.reduce is None]
    assert not unstated, unstated[:10]


def test_token_mean_is_what_verl_and_openrlhf_clip_log():
    """Cross-check of the batch against the frameworks' own aggregation code: the token mean over all ranks and
    micro-batches, computed here from the batch, is what veRL's engine path logs as actor/entropy_loss (its agg_loss
    per micro-batch with the global batch info, then Metric.aggregate_dp over the ranks) and what OpenRLHF logs as
    ppo_clip_ratio; TRL's GA=2 value is the mean of its two micro-batch means. The batch tells these apart: the
    mean of the ranks' own token means is another number."""
    import torch
    b = P.BATCHES[False]
    m = b.mask.bool()
    token_mean = b.entropy[m].mean().item()
    per_rank = []
    for r in range(b.world):
        rows = [i for micro in range(P.GA) for i in b.micro_rows(r, micro)]
        per_rank.append(b.entropy[rows][m[rows]].mean().item())
    assert not P.close(token_mean, sum(per_rank) / len(per_rank))           # the batch discriminates
    assert P.close(P.verl_run(b)["actor/entropy_loss"], token_mean)
    ratio = (b.logp - b.old_logp).exp()
    adv = P.grpo_advantages(b)[:, None]
    clipped = (((ratio < 0.8) & (adv < 0)) | ((ratio > 1.2) & (adv > 0))).float()
    assert P.close(P.openrlhf_run(b)["ppo_clip_ratio"], clipped[m].mean().item())
    per_micro = []
    for micro in range(P.GA):
        rows = [i for r in range(b.world) for i in b.micro_rows(r, micro)]
        per_micro.append(clipped[rows][m[rows]].mean().item())
    assert not P.close(clipped[m].mean().item(), sum(per_micro) / len(per_micro))
    assert P.close(P.trl_grpo(b)["clip_ratio/region_mean"], sum(per_micro) / len(per_micro))
    assert torch.is_tensor(b.mask)


def test_a_pair_proven_different_translates_as_approximate_naming_the_fields(outcomes):
    """Every pair a proof measured apart translates as approximate, and the reason names the reduction fields that
    differ ([processes], [mini_batches], [snapshot] ...): never "stated, not proven", which promises equality."""
    different = [o for o in outcomes if o.status == "proven different"]
    assert len(different) >= 10
    for o in different:
        assert not o.exact and o.gap is not None and o.gap >= P.TOL, o.pair.ident
        assert re.search(r"\[[a-z_]+\]", o.detail) and "stated, not proven" not in o.detail, o.detail


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
    readme = P.README.read_text(encoding="utf-8")
    assert P.update_readme(readme, P.readme_block(fingerprints=fingerprints)) == readme, \
        "docs/translation.md's proofs coverage is stale: run .venv/bin/python tests/_support/fidelity_proofs.py"


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


def test_a_framework_without_proofs_says_why(fingerprints):
    """The coverage table: a framework with no entry proven names why its code cannot run here, and no framework
    with a proof keeps such a reason (it would be stale). Every framework runs today (a wheel, or its tag's files
    vendored), so every one has a proof."""
    reg = P._registry()
    proven = P.proven_map(fingerprints[2])
    none = {name for name, fw in reg.frameworks.items()
            if not any((e.file, e.line) in proven for e in [*fw.entries, *fw.template_entries])}
    assert none == set(P.CANNOT_RUN) == set(), (none, set(P.CANNOT_RUN))
    doc = P.DOC.read_text(encoding="utf-8")
    for name in none:
        assert f"| {name} |" in doc and P.CANNOT_RUN[name] in doc
