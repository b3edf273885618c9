"""Inventory tests of the frameworks mapped after TRL, veRL and OpenRLHF (issue 21): every key each framework's
source logs at each mapped release (tests/data/frameworks/<framework>-keys.tsv, read from the source at the release
tags; provenance in each file's header and tests/data/README.md) is translated by an entry of the shipped mapping
at exactly the releases that log it, or deliberately left to pass through (a `passthrough: why` row, which no entry
may claim); and every literal entry of the mapping is a key of the inventory, logged in every release the entry
claims. The lookups are the registry's own (the engine translation uses)."""
from __future__ import annotations

import pytest

from trackbridge.schema.loader import load_registry

from _support import DATA

INVENTORIES = {          # framework -> [(inventory file, trainer whose keys it lists)]: one file per mapped trainer
    "nemo_rl": [("nemo-rl-keys.tsv", "grpo")],
    "areal": [("areal-keys.tsv", "ppo"), ("areal-realhf-keys.tsv", "realhf")],
    "slime": [("slime-keys.tsv", "rl")],
    "skyrl": [("skyrl-keys.tsv", "ppo")],
    "prime_rl": [("prime-rl-keys.tsv", "rl"), ("prime-rl-sft-keys.tsv", "sft")],
    "roll": [("roll-keys.tsv", "rlvr")],
}
CASES = [(fw, file, trainer) for fw, pairs in sorted(INVENTORIES.items()) for file, trainer in pairs]


def read_inventory(name: str) -> list[dict[str, str]]:
    rows = []
    lines = [ln for ln in (DATA / "frameworks" / name).read_text().splitlines() if ln and not ln.startswith("#")]
    header = lines[0].split("\t")
    for ln in lines[1:]:
        cells = ln.split("\t")
        assert len(cells) == len(header), f"{name}: {ln!r}"
        rows.append(dict(zip(header, cells)))
    assert rows, f"{name}: no rows"
    return rows


def present_at(fw, row) -> list[int]:
    marks = row["presence"].split()
    assert len(marks) == len(fw.releases), f"{row['key']}: presence {row['presence']!r} vs releases {fw.releases}"
    return [i for i, m in enumerate(marks) if m != "."]


@pytest.mark.parametrize("framework,file,trainer", CASES)
def test_every_logged_key_is_mapped_or_deliberately_passed_through(framework, file, trainer):
    reg = load_registry()
    fw = reg.frameworks[framework]
    rows = read_inventory(file)
    checked = 0
    for row in rows:
        key = row["key"]
        releases = present_at(fw, row)
        assert releases, f"{key}: logged by no mapped release"
        assert fw.release_name(releases[0]) == row["first"] and fw.release_name(releases[-1]) == row["last"], key
        hits = [e for e, _ in fw.lookup(key)]
        if row["status"].startswith("passthrough:"):
            assert row["status"][len("passthrough:"):].strip(), f"{key}: a passthrough row says why"
            assert not hits, f"{key} is marked passthrough but {framework} maps it: {[e.key for e in hits]}"
            checked += 1
            continue
        assert row["status"] == "mapped", f"{key}: status {row['status']!r}"
        for i in releases:
            plain = [e for e in hits if e.applies(trainer, i, i) and not e.when]
            assert plain, f"{key} is logged at {fw.release_name(i)} but no unconditional {framework} entry applies"
            checked += 1
    assert checked >= len(rows)


@pytest.mark.parametrize("framework", sorted(INVENTORIES))
def test_every_trainer_and_entry_has_an_inventory(framework):
    fw = load_registry().frameworks[framework]
    listed = {t for _, t in INVENTORIES[framework]}
    assert set(fw.trainers) == listed, (set(fw.trainers), listed)
    for e in fw.entries:
        assert e.trainers is None or e.trainers & listed, (e.key, e.trainers)


@pytest.mark.parametrize("framework,file,trainer", CASES)
def test_every_entry_is_a_logged_key_in_every_release_it_claims(framework, file, trainer):
    reg = load_registry()
    fw = reg.frameworks[framework]
    rows = read_inventory(file)
    logged = {r["key"]: set(present_at(fw, r)) for r in rows if r["status"] == "mapped"}
    mine = [e for e in fw.entries if e.trainers is None or trainer in e.trainers]
    assert mine
    for e in mine:
        claimed = [i for i in range(len(fw.releases)) if e.applies(trainer, i, i)]
        assert claimed, f"{e.key}: applies to no release of trainer {trainer}"
        if e.key_template is None:
            assert e.key in logged, f"entry {e.key!r} is no key of the inventory ({file})"
            missing = [fw.release_name(i) for i in claimed if i not in logged[e.key]]
            assert not missing, f"entry {e.key!r} claims releases that do not log it: {missing}"
        else:
            matched = [k for k in logged if any(h is e for h, _ in fw.lookup(k))]
            assert matched, f"template entry {e.key!r} matches no key of the inventory"


@pytest.mark.parametrize("framework", sorted(INVENTORIES))
def test_passthrough_keys_are_declared_in_the_mapping(framework):
    """The keys the inventory leaves unmapped are the mapping's `passthrough:` declarations (detection counts them
    as the framework's), and every declaration stands for an inventory row: the facts live in the YAML."""
    reg = load_registry()
    fw = reg.frameworks[framework]
    rows = [r for file, _ in INVENTORIES[framework] for r in read_inventory(file)]
    file = ", ".join(f for f, _ in INVENTORIES[framework])
    passed = [r["key"] for r in rows if r["status"].startswith("passthrough:")]
    assert passed and fw.passthrough
    for key in passed:
        assert fw.logs_unmapped(key), f"{key}: a passthrough row the mapping does not declare"
    for text, tpl in fw.passthrough:
        matched = [k for k in passed if (tpl.match(k) is not None if tpl is not None else k == text)]
        assert matched, f"passthrough {text!r} stands for no passthrough row of {file}"


@pytest.mark.parametrize("framework", sorted(INVENTORIES))
def test_passthrough_items_name_the_releases_and_trainers_that_log_them(framework):
    """Detection counts a passthrough key for the trainers and releases its item names (issue 29: a key only
    realhf or only v0.4.0+ logs must not vote for every release): they are the inventory's, first to last."""
    fw = load_registry().frameworks[framework]
    rows = [(r, t) for file, t in INVENTORIES[framework] for r in read_inventory(file)
            if r["status"].startswith("passthrough:")]
    checked = 0
    for text, tpl in fw.passthrough:
        match = [(r, t) for r, t in rows if (tpl.match(r["key"]) is not None if tpl is not None else r["key"] == text)]
        present = sorted({i for r, _ in match for i in present_at(fw, r)})
        trainers = {t for _, t in match}
        for t in trainers:
            mine = sorted({i for r, tt in match if tt == t for i in present_at(fw, r)})
            lo, hi = fw.trainer_span(t)          # a trainer explains keys only in its own releases
            claimed = [i for i in range(len(fw.releases)) if lo <= i <= hi and any(
                (trs is None or t in trs) and a <= i <= b for trs, a, b in fw.unmapped_scopes(match[0][0]["key"]))]
            assert claimed and claimed[0] == mine[0] and claimed[-1] == mine[-1], (text, t, claimed, mine)
            checked += 1
        assert present, text
    assert checked >= len(fw.passthrough)
