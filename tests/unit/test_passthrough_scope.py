"""A passthrough item may name the releases and trainers that log its key (issue 29): detection counts the key only
there, and a release or trainer the file does not declare is refused with the file, line and key."""
from __future__ import annotations

import pytest
import yaml

from trackbridge.detect import detect
from trackbridge.schema.loader import build_registry, shipped_files
from trackbridge.schema.yamlfile import MappingError


def toy(passthrough: list[dict]) -> dict:
    return {"format": "trackbridge.mapping/1", "framework": "toy", "description": "a user's mapping",
            "repository": "x", "releases": ["v1", "v2", "v3"],
            "trainers": {"a": {"kind": "rl"}, "b": {"kind": "rl"}},
            "passthrough": passthrough,
            "entries": [{"key": "toy/loss", "canonical": "loss/total", "reduce": {"tokens": "none"},
                         "source": "toy.py@v1"}]}


def registry(tmp_path, doc):
    path = tmp_path / "toy.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return build_registry(shipped_files(), [path])


def test_a_scoped_passthrough_key_dates_the_log(tmp_path):
    reg = registry(tmp_path, toy([
        {"key": "toy/new_diag", "why": "w", "source": "toy.py@v3", "since": "v3"},
        {"key": "toy/old_diag", "why": "w", "source": "toy.py@v1", "until": "v1", "trainers": ["b"]}]))
    fw = reg.frameworks["toy"]
    new = detect(["toy/loss", "toy/new_diag"], reg, within=None)
    assert new.spec.framework == "toy" and fw.release_name(int(new.spec.lo)) == "v3", new.to_json()
    old = detect(["toy/loss", "toy/old_diag"], reg)
    assert (old.spec.trainer, fw.release_name(int(old.spec.hi))) == ("b", "v1"), old.to_json()


def test_an_unscoped_passthrough_key_counts_everywhere(tmp_path):
    reg = registry(tmp_path, toy([{"key": "toy/diag", "why": "w", "source": "toy.py@v1"}]))
    det = detect(["toy/loss", "toy/diag"], reg)
    fw = reg.frameworks["toy"]
    assert (fw.release_name(int(det.spec.lo)), fw.release_name(int(det.spec.hi))) == ("v1", "v3")


@pytest.mark.parametrize("bad,says", [({"since": "v9"}, "release 'v9' is not in the framework's `releases` list"),
                                      ({"trainers": ["c"]}, "unknown trainer 'c'")])
def test_an_undeclared_release_or_trainer_is_refused(tmp_path, bad, says):
    with pytest.raises(MappingError) as exc:
        registry(tmp_path, toy([{"key": "toy/diag", "why": "w", "source": "toy.py@v1", **bad}]))
    assert says in str(exc.value) and "toy.yaml" in str(exc.value)
