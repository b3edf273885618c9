"""``tokens: token_sum_global_norm`` (docs/reductions.md, "The levels" and the table of globally normalised token
sums): each micro-batch's token sum S over the step's tokens T on every rank and micro-batch (prime-rl's RL loss from
v0.6.0). Summed over the micro-batches and the ranks it is the step's token mean; averaged over them (prime-rl's
``loss/mean``) the token mean divided by G x D, a token mean only when G = D = 1. Such a sum that stays one after the
levels are normalised is a scale of the token mean, not a population: it differs ``[tokens]`` even from a reference
that leaves ``tokens`` to the framework (``any``). The framework below is made up (written to the test's folder);
the last tests read the shipped prime-rl entries."""
from __future__ import annotations

import json
import math

import pytest

from trackbridge.schema.loader import load_registry
from trackbridge.schema.reductions import FIELDS
from trackbridge.translate.fidelity import judge, reference, resolve

from _support import DATA, ROOT
from _support import fingerprint as FP

FRAMEWORK = """\
format: trackbridge.mapping/1
framework: gamma
releases: [v1.0]
trainers:
  rl: {kind: rl}
config:
  - {key: ga, default: 2}
  - {key: gpus, default: 4}
levels:
  micro_batches: ga
  processes: gpus
entries:
  - key: averaged          # every micro-batch's S/T averaged over the micro-batches of all ranks (prime-rl)
    canonical: toy/loss
    reduce: {tokens: token_sum_global_norm, micro_batches: mean, processes: all_reduce_mean, snapshot: update}
    source: gamma/train.py@v1.0
  - key: summed            # S/T summed over the micro-batches and the ranks: the step's token mean
    canonical: toy/tok
    reverse: false
    reduce: {tokens: token_sum_global_norm, micro_batches: sum, processes: sum, snapshot: update}
    source: gamma/train.py@v1.0
  - key: summed_micro      # summed over the micro-batches, averaged over the ranks: the token mean over D
    canonical: toy/tok
    reverse: false
    reduce: {tokens: token_sum_global_norm, micro_batches: sum, processes: all_reduce_mean, snapshot: update}
    source: gamma/train.py@v1.0
  - key: weighted          # merged by tokens: a reweighted token mean whatever the counts (but one of each)
    canonical: toy/loss
    reverse: false
    reduce: {tokens: token_sum_global_norm, micro_batches: token_weighted, processes: all_reduce_weighted,
             snapshot: update}
    source: gamma/train.py@v1.0
  - key: stepnorm_last     # OpenRLHF-like: the last micro-batch's G x D x S / T, averaged over the ranks
    canonical: toy/loss
    reverse: false
    reduce: {tokens: token_sum_step_norm, micro_batches: last, processes: all_reduce_mean, snapshot: update}
    source: gamma/sft.py@v1.0
  - key: lm_loss           # a plain token mean
    canonical: toy/loss
    reverse: false
    reduce: {tokens: token_mean, micro_batches: token_weighted, processes: all_reduce_weighted, snapshot: update}
    source: gamma/sft.py@v1.0
"""


@pytest.fixture(scope="module")
def reg(tmp_path_factory):
    path = tmp_path_factory.mktemp("gamma") / "gamma.yaml"
    path.write_text(FRAMEWORK, encoding="utf-8")
    return load_registry([str(DATA / "reductions" / "canonical-extra.yaml"), str(path)])


def res(reg, key, config=None):
    fw = reg.frameworks["gamma"]
    entry = next(e for e in fw.entries if e.key == key)
    return resolve(entry, fw, None, 0, 0, config or {})


def ref(reg, name):
    return reference(reg.canonical.metrics[name])


def tags(why):
    return {t.split("]")[0] for t in why.split("[")[1:]} if why else set()


def levels(r):
    return r.fields["tokens"], r.fields["micro_batches"], r.fields["processes"]


# ------------------------------------------------------------------------------------------------ the vocabulary
def test_the_literal_is_in_the_vocabulary_and_both_json_schemas():
    assert "token_sum_global_norm" in FIELDS["tokens"]
    for name in ("framework.schema.json", "canonical.schema.json"):
        text = (ROOT / "mappings" / "schemas" / name).read_text(encoding="utf-8")
        json.loads(text)
        assert text.count('"token_sum_global_norm"') == 1, name
    doc = (ROOT / "docs" / "reductions.md").read_text(encoding="utf-8")
    assert "`token_sum_global_norm` (prime-rl's RL loss" in doc
    assert ("| `token_sum_global_norm`, micro-batches `mean`, processes `all_reduce_mean` | G = D = 1 / otherwise "
            "|") in doc


# ------------------------------------------------------------------------------------------------ by hand
# two micro-batches of one rank, of 1 and 3 tokens with the values 1 and 2 (docs/reductions.md): S = 1 and 6, T = 4
DOC_STEPS = [[[[[[1.0]], [[2.0, 2.0, 2.0]]]]]]


def test_the_docs_example_by_hand():
    averaged = FP.value_of(DOC_STEPS, FP.Reduction("token_sum_global_norm", "mean", "mean", "none",
                                                   "all_reduce_mean", "step"))
    summed = FP.value_of(DOC_STEPS, FP.Reduction("token_sum_global_norm", "mean", "sum", "none", "sum", "step"))
    token_mean = FP.value_of(DOC_STEPS, FP.Reduction("token_mean", "mean", "none", "none", "none", "step"))
    assert math.isclose(averaged, (1 / 4 + 6 / 4) / 2) and math.isclose(averaged, 0.875)
    assert math.isclose(summed, 1.75) and math.isclose(token_mean, 1.75)
    assert math.isclose(averaged * 2, token_mean)          # the token mean over G x D = 2 x 1


# ------------------------------------------------------------------------------------------------ normalised
def test_averaged_over_micro_batches_and_ranks_is_a_token_mean_only_with_one_of_each(reg):
    r = res(reg, "averaged", {"ga": 1, "gpus": 1})
    assert levels(r) == ("token_mean", "none", "none")
    assert judge(r, ref(reg, "toy/tok")) is None and judge(r, ref(reg, "toy/loss")) is None
    # the token mean over G, over D, over G x D: a level of one item is the identity, the sum stays one
    for cfg, want in (({"ga": 2, "gpus": 1}, ("mean", "none")), ({"ga": 1, "gpus": 8}, ("none", "all_reduce_mean")),
                      ({"ga": 4, "gpus": 8}, ("mean", "all_reduce_mean")), ({}, ("mean", "all_reduce_mean"))):
        r = res(reg, "averaged", cfg)
        assert levels(r) == ("token_sum_global_norm", *want), cfg
        assert "tokens" in tags(judge(r, ref(reg, "toy/loss"))), cfg


def test_summed_over_both_levels_is_the_token_mean_at_any_count(reg):
    for cfg in ({"ga": 1, "gpus": 1}, {"ga": 4, "gpus": 8}, {}):
        r = res(reg, "summed", cfg)
        assert levels(r) == ("token_mean", "none", "none"), cfg
        assert judge(r, ref(reg, "toy/tok")) is None, cfg


def test_summed_over_one_level_and_averaged_over_the_other(reg):
    assert levels(res(reg, "summed_micro", {"ga": 4, "gpus": 1})) == ("token_mean", "none", "none")
    r = res(reg, "summed_micro", {"ga": 4, "gpus": 8})                 # the token mean over D = 8
    assert levels(r) == ("token_sum_global_norm", "sum", "all_reduce_mean")
    assert "tokens" in tags(judge(r, ref(reg, "toy/tok")))


def test_merged_by_tokens_is_no_token_mean_with_several_items(reg):
    assert levels(res(reg, "weighted", {"ga": 1, "gpus": 1}))[0] == "token_mean"
    assert levels(res(reg, "weighted", {"ga": 2, "gpus": 2}))[0] == "token_sum_global_norm"


# ------------------------------------------------------------------------------------------------ against `any`
def test_a_global_sum_that_is_no_token_mean_differs_even_from_any(reg):
    r = res(reg, "averaged", {"ga": 2, "gpus": 3})
    why = judge(r, ref(reg, "toy/loss"))
    assert ref(reg, "toy/loss").fields["tokens"] == "any"
    assert tags(why) == {"tokens", "micro_batches", "processes"}, why
    assert ("gamma 'averaged' is each micro-batch's token sum over the step's global token count (every rank's "
            "and micro-batch's tokens; not a token mean: averaged over the micro-batches of all ranks, the step's "
            "token mean divided by the number of micro-batches on all ranks); canonical 'toy/loss' leaves tokens to "
            "each framework [tokens]") in why
    assert "averages its 2 micro-batches unweighted" in why and "averages its 3 processes' values unweighted" in why


def test_a_token_mean_and_a_normalised_sum_that_became_one_still_take_any(reg):
    # `any` is still the framework's choice of population: a token mean (stated, or what the levels made of a
    # normalised sum) is exact against it
    assert judge(res(reg, "lm_loss", {"ga": 4, "gpus": 8}), ref(reg, "toy/loss")) is None
    assert judge(res(reg, "summed", {"ga": 4, "gpus": 8}), ref(reg, "toy/loss")) is None
    assert judge(res(reg, "stepnorm_last", {"ga": 1, "gpus": 8}), ref(reg, "toy/loss")) is None


def test_the_step_normalised_last_micro_batch_differs_from_any_in_tokens_too(reg):
    # the last micro-batch's G x S_u / T (G = 4) is no population the framework chose: a scale, [tokens] as well
    why = judge(res(reg, "stepnorm_last", {"ga": 4, "gpus": 8}), ref(reg, "toy/loss"))
    assert tags(why) == {"tokens", "micro_batches"}, why
    assert "over the optimizer step's tokens per rank and micro-batch (not a token mean)" in why


# ------------------------------------------------------------------------------------------------ prime-rl
@pytest.fixture(scope="module")
def shipped():
    return load_registry()


def shipped_verdict(reg, key, release):
    fw = reg.frameworks["prime_rl"]
    i = fw.release_index(release)
    e = next(e for e in fw.entries if e.key == key and e.applies("rl", i, i))
    return e, judge(resolve(e, fw, "rl", i, i, {}), reference(reg.canonical.metrics[e.canonical]))


@pytest.mark.parametrize("release", ["v0.6.0", "v0.8.0", "v0.8.1.dev67"])
def test_prime_rl_loss_mean_states_the_global_norm(shipped, release):
    e, why = shipped_verdict(shipped, "loss/mean", release)
    assert e.reduce.get("tokens") == "token_sum_global_norm" and e.reduce.get("micro_batches") == "mean"
    assert e.reduce.get("processes") == "all_reduce_mean" and e.reduce.get("deviation") == "none"
    assert "[tokens]" in why and "[deviation]" not in why
    assert "the step's token mean divided by the number of micro-batches on all ranks" in why
    e, why = shipped_verdict(shipped, "Loss", release)
    assert e.reduce.get("tokens") == "token_sum_global_norm"
    assert "[tokens]" in why and "rounded to 4 decimals [deviation]" in why
    assert "divided by the number of micro-batches on all ranks" in why


def test_prime_rl_before_v0_6_0_keeps_its_per_rank_scale_deviation(shipped):
    # until v0.5.0 each rank divides by its own tokens: no literal states that, the deviation does
    e, why = shipped_verdict(shipped, "loss/mean", "v0.5.0")
    assert e.reduce.get("tokens") == "token_mean" and "[deviation]" in why
    assert "divided by its own rank's loss-masked token count" in why


def test_the_mapping_format_page_lists_every_literal_of_every_field():
    """docs/mapping-format.md's field table is what users write reduce: from: each field's row names every literal
    FIELDS holds, and no other (it lacked token_sum_global_norm when the literal was added)."""
    import re

    from trackbridge.schema.reductions import FIELDS

    from _support import ROOT
    rows = {}
    for line in (ROOT / "docs" / "mapping-format.md").read_text(encoding="utf-8").splitlines():
        m = re.match(r"^\| (`[a-z_]+`(?:, `[a-z_]+`)*) \| (.*) \|$", line)
        if m:
            for name in re.findall(r"`([a-z_]+)`", m.group(1)):
                rows[name] = set(re.findall(r"`([a-z0-9_-]+)`", m.group(2)))
    checked = 0
    for name, literals in FIELDS.items():
        if name == "deviation":
            continue
        assert name in rows, f"docs/mapping-format.md has no row for reduce field {name!r}"
        assert set(literals) <= rows[name], (name, sorted(set(literals) - rows[name]))
        checked += 1
    assert checked >= 10, checked
