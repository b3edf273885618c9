"""The shipped canonical.yaml stays backward compatible with the last released one (issue 13).

``tests/data/released/canonical.yaml`` is a frozen copy of the canonical schema as last released (see the README
next to it). Every metric name of that release must still be a canonical name, or be renamed to one through a
``versions:`` entry newer than the release (so that a reader upgrades an old stream); every config name must still
exist. Update the frozen copy only when a new ``schema_version`` is released.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from trackbridge.schema.canonical import compatibility_problems
from trackbridge.schema.loader import build_registry, load_registry

from _support import DATA

RELEASED = DATA / "released" / "canonical.yaml"


def _canonical(path: Path):
    return build_registry([path], []).canonical


def test_the_frozen_copy_is_a_release():
    released = _canonical(RELEASED)
    current = load_registry().canonical
    assert released.version == "1.1.0" and released.metrics and released.config
    assert released.version in [v for v, _ in current.renames]      # a version the shipped schema knows


def test_shipped_canonical_is_backward_compatible_with_the_last_release():
    assert compatibility_problems(_canonical(RELEASED), load_registry().canonical) == []


def test_a_name_deleted_without_a_rename_is_named(tmp_path):
    text = RELEASED.read_text(encoding="utf-8")
    assert "\n  policy/entropy:\n" in text
    bad = tmp_path / "canonical.yaml"
    bad.write_text(text.replace("\n  policy/entropy:\n", "\n  policy/entropy_gone:\n", 1), encoding="utf-8")
    problems = compatibility_problems(_canonical(RELEASED), _canonical(bad))
    assert len(problems) == 1 and "'policy/entropy'" in problems[0] and "without a `versions:` rename" in problems[0]


def test_a_rename_through_a_newer_version_is_accepted(tmp_path):
    text = RELEASED.read_text(encoding="utf-8")
    text = text.replace("\n  policy/entropy:\n", "\n  policy/token_entropy:\n", 1)
    text = text.replace("schema_version: 1.1.0\nversions:\n",
                        "schema_version: 1.2.0\nversions:\n  1.2.0:\n    rename_metrics: {policy/entropy: "
                        "policy/token_entropy}\n", 1)
    renamed = tmp_path / "canonical.yaml"
    renamed.write_text(text, encoding="utf-8")
    current = _canonical(renamed)
    assert current.upgrade("policy/entropy") == "policy/token_entropy"
    assert compatibility_problems(_canonical(RELEASED), current) == []


@pytest.mark.parametrize("edit, needle", [
    (lambda t: t.replace("\n  kl_coef: {", "\n  kl_coefficient: {", 1), "config name 'kl_coef'"),
    (lambda t: t.replace("schema_version: 1.1.0\nversions:\n", "schema_version: 1.0.0\nversions:\n", 1)
     .replace("  1.1.0:\n    rename_metrics:", "  0.9.0:\n    rename_metrics:", 1), "older than the released 1.1.0"),
])
def test_other_breaks_are_named(tmp_path, edit, needle):
    bad = tmp_path / "canonical.yaml"
    bad.write_text(edit(RELEASED.read_text(encoding="utf-8")), encoding="utf-8")
    problems = compatibility_problems(_canonical(RELEASED), _canonical(bad))
    assert any(needle in p for p in problems), problems
