"""Derived rules through the one schema layer: the mapping files' YAML loader and template engine, derived.schema.json
for their structure, MappingError as the error type, the one mappings folder (TRACKBRIDGE_MAPPINGS_DIR)."""
from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from trackbridge.derive import Deriver, RuleError, load_rules
from trackbridge.derive.rules import RuleErrors, shipped_canonical
from trackbridge.schema import templates
from trackbridge.schema.paths import mappings_dir
from trackbridge.schema.yamlfile import MappingError

NAMES = {"m/a", "m/b", "acc/{n:int}", "acc2/{n:int}", "val/{ds:path}/acc", "val/{ds:path}/err"}
CONFIG = {"kl_coef"}


def write(tmp_path, rules: str, name: str = "rules.yaml") -> str:
    path = tmp_path / name
    path.write_text("format: trackbridge.derived/1\nrules:\n" + rules, encoding="utf-8")
    return str(path)


def rule(name: str, formula: str, extra: str = "") -> str:
    return f"  - name: {name}\n    formula: \"{formula}\"\n    description: test\n    citation: t.py@v1\n{extra}"


def load(path: str):
    return load_rules([path], canonical=NAMES, config_names=CONFIG, shipped=False)


def test_rule_error_is_a_mapping_error_with_file_line_and_rule(tmp_path):
    path = write(tmp_path, rule("m/a", "m/b * 2") + rule("m/b", "m/zzz"))
    with pytest.raises(MappingError) as info:
        load(path)
    err = info.value
    assert isinstance(err, RuleError)
    assert (err.file, err.line, err.rule, err.entry) == (path, 8, "m/b", "rule 'm/b'")
    assert str(err) == f"{path}:8: rule 'm/b': formula reads unknown canonical name 'm/zzz'"


def test_a_misspelled_field_is_reported_by_the_schema_with_file_line_and_a_suggestion(tmp_path):
    path = write(tmp_path, rule("m/a", "m/b * 2").replace("formula:", "formla:"))
    with pytest.raises(RuleError) as info:
        load(path)
    assert str(info.value) == f"{path}:4: rule 'm/a': unknown field 'formla' (did you mean 'formula'?)"
    path = write(tmp_path, rule("m/a", "m/b * 2", "    requires: {sorces: [trl]}\n"))
    with pytest.raises(RuleError) as info:
        load(path)
    assert str(info.value) == f"{path}:7: rule 'm/a': unknown field requires.sorces (did you mean 'sources'?)"


def test_every_structural_problem_of_a_file_at_once(tmp_path):
    path = write(tmp_path, rule("m/a", "m/b", "    colour: red\n") + rule("m/b", "m/a", "    override: maybe\n")
                 + "  - name: m/c\n    formula: m/a\n")
    with pytest.raises(RuleErrors) as info:
        load(path)
    got = [(e.line, e.rule, e.message) for e in info.value.errors]
    assert got == [(7, "m/a", "unknown field 'colour' (known: citation, description, forbid_approximate, formula, "
                               "name, note, only, override, requires)"),
                   (12, "m/b", "'override' must be true or false, not 'maybe'"),
                   (13, "m/c", "missing or empty 'description'"),
                   (13, "m/c", "missing or empty 'citation'")], got
    assert info.value.line == 7 and str(info.value).count(path) == 4


def test_duplicate_keys_and_yaml_errors_come_from_the_mapping_loader(tmp_path):
    path = write(tmp_path, rule("m/a", "m/b", "    formula: m/b\n"))
    with pytest.raises(RuleError, match=r"rules.yaml:7: duplicate key 'formula' \(first at line 4\)"):
        load(path)
    path = write(tmp_path, "  - name: [m/a\n")
    with pytest.raises(RuleError, match=r"rules.yaml:\d+: not valid YAML: "):
        load(path)


def test_int_placeholders_bind_digits_only(tmp_path):
    path = write(tmp_path, rule("acc2/{n:int}", "acc/{n:int} * 2"))
    rs = load(path)
    m = {"acc/3": 1.5, "acc/x": 2.0, "acc/12": 4.0}
    assert sorted(Deriver(rs).apply(m, step=1)) == ["acc2/12", "acc2/3"]
    assert m["acc2/3"] == 3.0 and m["acc2/12"] == 8.0 and "acc2/x" not in m


def test_a_malformed_placeholder_is_an_error_with_file_and_line(tmp_path):
    path = write(tmp_path, rule("m/a", "m/b") + rule("acc2/{n:int}", "acc/{n:float} * 2"))
    with pytest.raises(RuleError) as info:
        load(path)
    err = info.value
    assert (err.line, err.rule) == (8, "acc2/{n:int}") and "malformed placeholder" in str(err), str(err)
    assert str(err).startswith(f"{path}:8: rule 'acc2/{{n:int}}': ")
    path = write(tmp_path, rule("acc2/{n:int}{n}", "acc/{n:int} * 2"))
    with pytest.raises(RuleError, match=r"rules.yaml:3: rule .*placeholder \{n\} appears twice"):
        load(path)


def test_one_template_semantics_for_mappings_and_rules(tmp_path):
    # a path placeholder is matched the same (lazy, anchored) way by the translator's templates and the rules
    t = "val/{ds:path}/acc"
    assert templates.template_regex(t) is templates.template_regex(t)          # compiled once
    assert templates.template_regex(t).match("val/a/b/acc").groupdict() == {"ds": "a/b"}
    assert templates.template_regex(t).match("val/a/b/acc\n") is None
    path = write(tmp_path, rule("val/{ds:path}/err", "1 - val/{ds:path}/acc"))
    m = {"val/math/gsm8k/acc": 0.25}
    assert Deriver(load(path)).apply(m, step=1) == ["val/math/gsm8k/err"] and m["val/math/gsm8k/err"] == 0.75
    assert templates.may_overlap("time/{stage}", "time/gen") and not templates.may_overlap("time/{s}", "t/{s}/x")
    assert templates.may_overlap("acc/{n:int}", "acc/{stage}") and not templates.may_overlap("acc/{n:int}", "acc/x")


def test_mappings_dir_is_honoured_for_derived_rules_and_canonical(tmp_path, monkeypatch):
    mine = tmp_path / "maps"
    shutil.copytree(mappings_dir(), mine, ignore=shutil.ignore_patterns("__pycache__"))
    derived = (mine / "derived.yaml").read_text(encoding="utf-8")
    derived = derived.replace("name: value/std\n", "name: value/std\n    note: from the moved folder\n", 1)
    (mine / "derived.yaml").write_text(derived, encoding="utf-8")
    monkeypatch.setenv("TRACKBRIDGE_MAPPINGS_DIR", str(mine))
    rs = load_rules()
    assert rs.files == [str(mine / "derived.yaml")]
    assert [r.note for r in rs if r.name == "value/std"] == ["from the moved folder"]
    # the schema comes from the moved folder too: a stricter copy there is what the loader applies
    schema = (mine / "schemas" / "derived.schema.json").read_text(encoding="utf-8")
    (mine / "schemas" / "derived.schema.json").write_text(
        schema.replace('"note": {"type": ["string", "null"]', '"note": {"type": "null"'), encoding="utf-8")
    with pytest.raises(RuleError, match=r"derived.yaml:\d+: rule 'value/std': note: must be null"):
        load_rules()
    # and the canonical names: a metric removed from the moved canonical.yaml is unknown to the rules
    canon = (mine / "canonical.yaml").read_text(encoding="utf-8")
    assert "\n  return/std:" in canon
    (mine / "canonical.yaml").write_text(canon.replace("\n  return/std:", "\n  return/std_gone:", 1), "utf-8")
    assert "return/std" not in shipped_canonical()[0]
    (mine / "schemas" / "derived.schema.json").write_text(schema, encoding="utf-8")
    with pytest.raises(RuleError, match=r"rule 'return/std': output 'return/std' is not a canonical metric name"):
        load_rules()


def test_lint_reports_the_schema_problems_of_derived_files(tmp_path):
    path = write(tmp_path, rule("m/a", "m/b").replace("formula:", "formla:") + rule("m/b", "m/a", "    only: 3\n"))
    p = subprocess.run([sys.executable, "-m", "trackbridge", "mappings", "lint", path], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 2, p.stderr
    assert f"{path}:4: rule 'm/a': unknown field 'formla' (did you mean 'formula'?)" in p.stderr
    assert f"{path}:11: rule 'm/b': only: must be a mapping, not integer 3" in p.stderr
    assert "2 problem(s)" in p.stderr and "Traceback" not in p.stderr
