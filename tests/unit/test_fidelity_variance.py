"""A variance across micro-batches (``micro_batches: var``, docs/reductions.md): TRL's ``val/ratio_var`` is
``gather_for_metrics(ratio_stats).var()``, the unbiased variance of every micro-batch's mean ratio of every optimizer
step and rank. A variance is never the identity (one value has none), the ranks gathered into its list are no pooled
population (``processes: gather`` stays while there is more than one rank), the reason names it in words, and the
proofs' fingerprint reads it as the driver's list (tests/_support/proven.py)."""
from __future__ import annotations

import pytest

from trackbridge.schema.loader import load_registry
from trackbridge.translate.fidelity import Count, _normalise, describe, judge, reference, resolve

from _support import proven

ONE = {"gradient_accumulation_steps": 1, "num_mini_batches": 1, "num_ppo_epochs": 1, "num_processes": 1}


@pytest.fixture(scope="module")
def reg():
    return load_registry()


def ratio_var(reg, trainer, config):
    fw = reg.frameworks["trl"]
    entry = next(e for e in fw.entries if e.key == "val/ratio_var" and trainer in (e.trainers or ()))
    lo = hi = fw.releases.index("v0.11.4") if "v0.11.4" in fw.releases else 0
    return resolve(entry, fw, trainer, lo, hi, config)


@pytest.mark.parametrize("trainer", ["ppo", "rloo"])
def test_a_variance_of_one_micro_batch_is_not_its_value(reg, trainer):
    r = ratio_var(reg, trainer, ONE)
    assert r.counts["micro_batches"].one
    assert r.fields["micro_batches"] == "var"                  # nan with one value: not the identity
    assert r.fields["mini_batches"] == "none"


def test_the_ranks_gathered_into_the_list_stay_a_level_unless_there_is_one_rank(reg):
    many = ratio_var(reg, "rloo", {**ONE, "gradient_accumulation_steps": 4})
    assert many.fields["micro_batches"] == "var"
    assert many.fields["processes"] == "gather"                # TRL's file gives no process count: it stays
    assert describe(many, "micro_batches").startswith("takes the unbiased variance (n-1) of its 4 micro-batches")
    stated = {**many.fields}
    assert _normalise(stated, {"processes": Count(2.0, declared=True)})["processes"] == "gather"
    assert _normalise(stated, {"processes": Count(1.0, declared=True)})["processes"] == "none"   # one rank: as is
    assert _normalise({**stated, "micro_batches": "mean"}, {})["processes"] == "none"  # a gathered mean pools


def test_a_variance_is_judged_against_a_mean_by_its_micro_batch_level(reg):
    r = ratio_var(reg, "rloo", {**ONE, "gradient_accumulation_steps": 4})
    mean = reference(reg.canonical.metrics["policy/ratio_mean"])
    why = judge(r, mean)
    assert why is not None and "[micro_batches]" in why and "unbiased variance" in why


def test_the_canonical_ratio_variance_is_trls_but_for_its_padding(reg):
    for config in (ONE, {**ONE, "gradient_accumulation_steps": 4}):
        r = ratio_var(reg, "rloo", config)
        why = judge(r, reference(reg.canonical.metrics["policy/ratio_var"]))
        assert why == "trl 'val/ratio_var' includes padding tokens; canonical 'policy/ratio_var' excludes padding " \
                      "tokens [padding]", config


def test_the_fingerprint_reads_gathered_variance_as_the_drivers_list():
    fields = {"tokens": "token_mean", "stat": "mean", "micro_batches": "var", "mini_batches": "none",
              "processes": "gather", "window": "step", "std": "none"}
    fp = proven.to_fingerprint(fields)
    assert (fp.micro_batches, fp.mini_batches, fp.processes) == ("var", "none", "driver")
    fp = proven.to_fingerprint({**fields, "micro_batches": "mean"})
    assert fp.processes == "all_reduce_weighted"             # a gathered mean is the pooled mean
