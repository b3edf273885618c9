"""A key passed through under its own name that another key of the same dict is translated to (prime-rl v0.2's
`progress/samples` beside `progress/total_samples`, whose canonical name is `progress/samples`): the input literally
so named keeps the name, the translated one keeps its own and is reported as a conflict, whichever comes first;
no value is lost (it raised KeyError in one order and dropped a value in the other)."""
from __future__ import annotations

import pytest
import yaml

from trackbridge.pipeline import Translator
from trackbridge.schema.loader import build_registry, shipped_files

TOY = {"format": "trackbridge.mapping/1", "framework": "toy", "description": "a user's mapping", "repository": "x",
       "releases": ["v1"],
       "passthrough": [{"key": "progress/samples", "why": "the step's samples; no canonical name here",
                        "source": "toy.py@v1"}],
       "entries": [{"key": "total_samples", "canonical": "progress/samples", "reduce": {"tokens": "none"},
                    "source": "toy.py@v1"}]}


@pytest.fixture(scope="module")
def reg(tmp_path_factory):
    path = tmp_path_factory.mktemp("m") / "toy.yaml"
    path.write_text(yaml.safe_dump(TOY))
    return build_registry(shipped_files(), [path])


@pytest.mark.parametrize("row", [{"progress/samples": 8, "total_samples": 64},
                                 {"total_samples": 64, "progress/samples": 8}], ids=["passthrough-first", "second"])
def test_either_order_keeps_both_values_under_their_own_names(reg, row):
    res = Translator("toy", "canonical", registry=reg).translate(row)
    assert res.metrics == {"progress/samples": 8, "total_samples": 64}
    assert res.conflicts == {"total_samples": "progress/samples"}
    assert res.unmapped == ["progress/samples"] and res.mapped == 0


def test_alone_the_translated_key_takes_the_canonical_name(reg):
    res = Translator("toy", "canonical", registry=reg).translate({"total_samples": 64})
    assert res.metrics == {"progress/samples": 64} and not res.conflicts
