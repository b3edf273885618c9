"""The JSON Schemas of the three mapping formats and the built-in validator (trackbridge/schema/jsonschema.py).

The validator must agree with the `jsonschema` package (Draft 2020-12, only installed for the tests) on the shipped
files (all valid), on a corpus of broken documents (each invalid for both, every error naming file and line) and on
systematic mutations of the shipped files; each schema file is itself a valid Draft 2020-12 schema; a schema keyword
outside the supported subset is refused when the schema is loaded.
"""
from __future__ import annotations

import json
import textwrap
import tomllib
from pathlib import Path

import pytest

import trackbridge
from trackbridge.schema.jsonschema import SUPPORTED, SchemaError, check_schema, load_schema, validate
from trackbridge.schema.paths import mappings_dir
from trackbridge.schema.yamlfile import MappingError, load_yaml

jsonschema = pytest.importorskip("jsonschema")
Draft = jsonschema.Draft202012Validator

SCHEMAS = {"trackbridge.canonical/1": "canonical", "trackbridge.mapping/1": "framework",
           "trackbridge.derived/1": "derived", "trackbridge.checks/1": "checks", "trackbridge.proofs/1": "proofs"}
ROOT = Path(trackbridge.__file__).resolve().parents[1]       # the checkout


def shipped() -> list[Path]:
    return sorted(mappings_dir().glob("*.yaml"))


def schema_file(name: str) -> Path:
    return mappings_dir() / "schemas" / f"{name}.schema.json"


def verdicts(doc, schema: dict, file: str) -> tuple[list[SchemaError], list]:
    return validate(doc, schema, file=file), list(Draft(schema).iter_errors(doc))


# ---------------------------------------------------------------------------------------------------- the schemas
@pytest.mark.parametrize("name", sorted(SCHEMAS.values()))
def test_each_schema_is_a_valid_draft_2020_12_schema_in_the_supported_subset(name):
    path = schema_file(name)
    assert path.is_file(), f"{path} missing"
    schema = json.loads(path.read_text(encoding="utf-8"))
    Draft.check_schema(schema)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    check_schema(schema, file=str(path))          # every keyword supported by the built-in validator
    assert load_schema(name) == schema


def test_schemas_ship_with_the_mappings_in_the_wheel():
    # the files the loader finds (mappings_dir(): the checkout's mappings/, in a wheel trackbridge/mappings) are the
    # ones pyproject puts in the wheel as package data of trackbridge.mappings.schemas (the built wheel itself is
    # checked file by file in tests/install/test_wheel.py)
    conf = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    assert conf["package-dir"]["trackbridge.mappings"] == "mappings"
    globs = conf["package-data"]["trackbridge.mappings.schemas"]
    found = sorted(p.relative_to(ROOT / "mappings" / "schemas") for p in (ROOT / "mappings" / "schemas").glob("*.json"))
    assert len(found) >= 3
    for rel in found:
        assert any(rel.match(g) for g in globs), f"{rel} is not package data ({globs})"


def test_the_installed_layout_finds_the_schemas(tmp_path, monkeypatch):
    # paths.py inside an installed package (site-packages/trackbridge/schema/paths.py next to
    # site-packages/trackbridge/mappings/): mappings_dir() finds the copy inside the package, schemas included
    import importlib.util
    import shutil

    monkeypatch.delenv("TRACKBRIDGE_MAPPINGS_DIR", raising=False)
    pkg = tmp_path / "site" / "trackbridge"
    (pkg / "schema").mkdir(parents=True)
    shutil.copy(ROOT / "trackbridge" / "schema" / "paths.py", pkg / "schema" / "paths.py")
    shutil.copytree(ROOT / "mappings", pkg / "mappings", ignore=shutil.ignore_patterns("__pycache__"))
    spec = importlib.util.spec_from_file_location("_installed_paths", pkg / "schema" / "paths.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    found = mod.mappings_dir()
    assert found == pkg / "mappings"
    for name in SCHEMAS.values():
        assert (found / "schemas" / f"{name}.schema.json").is_file()


def test_a_keyword_outside_the_subset_is_refused_at_load(tmp_path, monkeypatch):
    (tmp_path / "schemas").mkdir()
    bad = {"type": "object", "properties": {"a": {"type": "string", "format": "date"}}}
    (tmp_path / "schemas" / "odd.schema.json").write_text(json.dumps(bad), encoding="utf-8")
    monkeypatch.setenv("TRACKBRIDGE_MAPPINGS_DIR", str(tmp_path))
    with pytest.raises(MappingError, match=r"odd.schema.json: #/properties/a/format: keyword 'format' is not "
                                           r"supported"):
        load_schema("odd")
    for schema, message in [({"if": {}}, "keyword 'if'"),
                            ({"$ref": "other.json#/x"}, "references to a defined NAME are supported"),
                            ({"$ref": "#/$defs/missing"}, "references to a defined NAME are supported"),
                            ({"type": "float"}, "unknown type 'float'"),
                            ({"patternProperties": {"(": {}}}, "bad regular expression"),
                            ({"anyOf": []}, "non-empty list")]:
        with pytest.raises(MappingError, match=message):
            check_schema(schema)
    assert {"properties", "additionalProperties", "patternProperties", "oneOf", "anyOf", "$ref"} <= SUPPORTED


# ---------------------------------------------------------------------------------------------------- shipped files
@pytest.mark.parametrize("path", shipped(), ids=lambda p: p.name)
def test_shipped_files_are_valid_for_both_validators(path):
    doc = load_yaml(path)
    schema = load_schema(SCHEMAS[doc["format"]])
    ours, theirs = verdicts(doc, schema, str(path))
    assert ours == [] and theirs == [], (ours[:3], [e.message for e in theirs[:3]])


# ---------------------------------------------------------------------------------------------------- broken files
RULE = """\
  - name: kl/coef
    formula: "-reward/kl_penalty/mean / kl/old_ref/k1_seq_sum"
    description: test
    citation: test.py@v1
"""
# (text, the line of the first error, words of its message); each is a trackbridge.derived/1 file
BROKEN_DERIVED = [
    ("rules:\n" + RULE, 1, "missing required field 'format'"),
    ("format: trackbridge.derived/2\nrules: []\n", 1, "must be 'trackbridge.derived/1'"),
    ("format: trackbridge.derived/1\n", 1, "missing required field 'rules'"),
    ("format: trackbridge.derived/1\nrulez: []\nrules: []\n", 2, "unknown field 'rulez' (did you mean 'rules'?)"),
    ("format: trackbridge.derived/1\nrules: {a: 1}\n", 2, "must be a list or null"),
    ("format: trackbridge.derived/1\nrules:\n  - just a string\n", 2, "must be a mapping"),
    ("format: trackbridge.derived/1\nrules:\n" + RULE.replace("formula:", "formla:"), 4,
     "unknown field 'formla' (did you mean 'formula'?)"),
    ("format: trackbridge.derived/1\nrules:\n" + RULE.replace("    citation: test.py@v1\n", ""), 3,
     "missing required field 'citation'"),
    ("format: trackbridge.derived/1\nrules:\n" + RULE.replace("description: test", "description: ''"), 5,
     "must not be empty"),
    ("format: trackbridge.derived/1\nrules:\n" + RULE.replace("description: test", "description: 3"), 5,
     "must be a string"),
    ("format: trackbridge.derived/1\nrules:\n" + RULE + "    override: yes please\n", 7, "must be a boolean"),
    ("format: trackbridge.derived/1\nrules:\n" + RULE + "    requires: {sorces: [trl]}\n", 7,
     "unknown field 'sorces' (did you mean 'sources'?)"),
    ("format: trackbridge.derived/1\nrules:\n" + RULE + "    requires: [trl]\n", 7, "must be a mapping"),
    ("format: trackbridge.derived/1\nrules:\n" + RULE + "    forbid_approximate: [1]\n", 7, "must be a string"),
    ("format: trackbridge.derived/1\nrules:\n" + RULE + "    only: {stage: {a: b}}\n", 7, "none of the allowed"),
    ("format: trackbridge.derived/1\nrules:\n" + RULE + "    note: [a]\n", 7, "must be a string or null"),
    ("format: trackbridge.derived/1\nrules:\n" + RULE + RULE.replace("name: kl/coef", "nam: kl/coef"), 7,
     "unknown field 'nam' (did you mean 'name'?)"),         # not also "missing 'name'": one error for one typo
    ("format: trackbridge.derived/1\nrules:\n" + RULE + RULE.replace("  - name: kl/coef\n    ", "  - "), 7,
     "missing required field 'name'"),
]


@pytest.mark.parametrize("text, line, words", BROKEN_DERIVED)
def test_broken_derived_files_are_invalid_for_both_with_file_and_line(tmp_path, text, line, words):
    path = tmp_path / "rules.yaml"
    path.write_text(text, encoding="utf-8")
    ours, theirs = verdicts(load_yaml(path), load_schema("derived"), str(path))
    assert theirs, "jsonschema accepts it: the corpus entry is not broken"
    assert ours, "the built-in validator accepts what jsonschema refuses"
    assert all(e.file == str(path) and isinstance(e.line, int) and e.line >= 1 for e in ours)
    first = ours[0]
    assert first.line == line and words in first.message, str(first)
    assert str(first).startswith(f"{path}:{line}: ")


def _broken_variants() -> list:
    """Edits that break any document of a strict schema: an unknown top-level field, a wrong format, a missing
    format, a top level that is not a mapping."""
    return [
        ("unknown top-level field", lambda d: d.__setitem__("formatt", 1)),
        ("format of another format", lambda d: d.__setitem__("format", "trackbridge.unknown/9")),
        ("no format", lambda d: d.pop("format")),
    ]


@pytest.mark.parametrize("path", shipped(), ids=lambda p: p.name)
def test_broken_shipped_files_are_invalid_for_both(path):
    doc = load_yaml(path)
    schema = load_schema(SCHEMAS[doc["format"]])
    for what, edit in _broken_variants():
        broken = _small(load_yaml(path), _required_names(schema))
        edit(broken)
        ours, theirs = verdicts(broken, schema, str(path))
        assert theirs and ours, (what, ours, theirs)
        assert all(e.file == str(path) and e.line for e in ours), what
    assert validate([1, 2], schema, file="x.yaml") and list(Draft(schema).iter_errors([1, 2]))


# ---------------------------------------------------------------------------------------------------- mutations
_DELETE = object()
_ODD_VALUES = [None, 12345, -1, 2.5, True, "", "zz not a name", [], ["zz"], [{"zz": 1}], {}, {"zz_unknown": 1}]


def _sites(node, path=()):
    """Every (container, key) of a document, depth first."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield node, k, (*path, k)
            yield from _sites(v, (*path, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield node, i, (*path, i)
            yield from _sites(v, (*path, i))


def _required_names(schema) -> set:
    out = set()
    if isinstance(schema, dict):
        out |= set(schema.get("required", ()))
        for v in schema.values():
            out |= _required_names(v)
    elif isinstance(schema, list):
        for v in schema:
            out |= _required_names(v)
    return out


def _small(node, keep: set):
    """The document with every list cut to 2 items and every long mapping to 4 keys plus the required ones (in
    place, so the LineDicts keep their lines): the same structure, quick to validate a thousand times."""
    if isinstance(node, dict):
        if len(node) > 8:
            for k in [k for k in list(node)[4:] if k not in keep]:
                del node[k]
        for v in node.values():
            _small(v, keep)
    elif isinstance(node, list):
        del node[2:]
        for v in node:
            _small(v, keep)
    return node


@pytest.mark.parametrize("path", shipped(), ids=lambda p: p.name)
def test_validators_agree_on_mutations_of_the_shipped_files(path):
    """Replace values all over (a cut-down copy of) a shipped file by odd ones (wrong types, empty, unknown keys) and
    delete keys: the built-in validator says 'invalid' exactly when jsonschema does, and names file and line."""
    doc = load_yaml(path)
    schema = load_schema(SCHEMAS[doc["format"]])
    doc = _small(doc, _required_names(schema))
    assert verdicts(doc, schema, str(path)) == ([], [])
    sites = list(_sites(doc))
    step = max(1, len(sites) // 80)             # ~80 places spread over the file, each with a few edits
    checked = invalid = 0
    for n, (container, key, where) in enumerate(sites[::step]):
        original = container[key]
        edits = [_ODD_VALUES[(n + j) % len(_ODD_VALUES)] for j in range(2)]
        for value in edits + ([_DELETE] if isinstance(container, dict) else []):
            if value is _DELETE:
                del container[key]
            else:
                container[key] = value
            try:
                ours, theirs = verdicts(doc, schema, str(path))
            finally:
                container[key] = original
            checked += 1
            assert bool(ours) == bool(theirs), (where, value, [str(e) for e in ours[:3]],
                                                [e.message for e in theirs[:3]])
            if ours:
                invalid += 1
                assert all(e.file == str(path) and isinstance(e.line, int) and e.line >= 1 for e in ours), where
    assert checked >= 30 and invalid > checked // 4, (checked, invalid)


# ---------------------------------------------------------------------------------------------------- semantics
@pytest.mark.parametrize("schema, value", [
    ({"type": "integer"}, True), ({"type": "integer"}, 1.0), ({"type": "number"}, False), ({"enum": [1]}, True),
    ({"const": 1}, 1.0), ({"const": False}, 0), ({"type": "integer", "minimum": 0}, -1),
    ({"type": "integer", "exclusiveMaximum": 3}, 3), ({"type": "string", "pattern": "^a"}, "ba"),
    ({"type": "string", "pattern": "b"}, "abc"), ({"type": "array", "uniqueItems": True}, [1, 1.0]),
    ({"type": "array", "uniqueItems": True}, [1, True]), ({"oneOf": [{"type": "integer"}, {"type": "number"}]}, 1),
    ({"oneOf": [{"type": "integer"}, {"type": "string"}]}, 1), ({"anyOf": [{"type": "null"}, {"minimum": 3}]}, 2),
    ({"not": {"type": "string"}}, "x"), ({"allOf": [{"minLength": 2}, {"maxLength": 3}]}, "abcd"),
    ({"propertyNames": {"pattern": "^[a-z]+$"}}, {"Ab": 1}), ({"minProperties": 1}, {}),
    ({"patternProperties": {"^x": {"type": "string"}}, "additionalProperties": False}, {"xa": "s", "y": 1}),
    ({"additionalProperties": {"type": "integer"}, "properties": {"a": {}}}, {"a": "s", "b": 2, "c": "t"}),
    ({"type": ["string", "null"]}, 3), ({"items": {"type": "string"}, "minItems": 2}, ["a"]),
])
def test_keyword_semantics_match_jsonschema(schema, value):
    schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema}
    check_schema(schema)
    ours, theirs = verdicts(value, schema, "x.yaml")
    assert bool(ours) == bool(theirs), (schema, value, ours, [e.message for e in theirs])


def test_errors_name_the_line_of_the_offending_key_or_item(tmp_path):
    path = tmp_path / "doc.yaml"
    path.write_text(textwrap.dedent("""\
        a: 1
        items:
          - {name: x}
          - name: y
            colour: red
        nested:
          deep:
            n: "three"
        """), encoding="utf-8")
    schema = {"type": "object", "additionalProperties": False,
              "properties": {"a": {"type": "string"},
                             "items": {"type": "array", "items": {"$ref": "#/$defs/item"}},
                             "nested": {"type": "object", "properties": {"deep": {"type": "object", "properties": {
                                 "n": {"type": "integer"}}}}}},
              "$defs": {"item": {"type": "object", "required": ["name", "size"], "additionalProperties": False,
                                 "properties": {"name": {"type": "string"}, "size": {"type": "integer"},
                                                "color": {"type": "string"}}}}}
    errors = validate(load_yaml(path), schema, file=str(path))
    got = [(e.line, e.entry, e.message) for e in errors]
    assert got == [
        (1, "a", "must be a string, not integer 1"),
        (3, "items[0]", "missing required field 'size'"),
        (4, "items[1]", "missing required field 'size'"),
        (5, "items[1].colour", "unknown field 'colour' (did you mean 'color'?)"),
        (8, "nested.deep.n", "must be an integer, not string 'three'"),
    ], got
    assert str(errors[-1]) == f"{path}:8: nested.deep.n: must be an integer, not string 'three'"
    assert len(list(Draft(schema).iter_errors(load_yaml(path)))) == len(errors)


def test_a_null_where_a_string_belongs_reads_once(tmp_path):
    """`until: null` against a string-only field said "must be a string, not null null"."""
    path = tmp_path / "f.yaml"
    path.write_text("a: null\nb: true\n", encoding="utf-8")
    schema = {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "string"}}}
    got = [(e.line, e.entry, e.message) for e in validate(load_yaml(path), schema, file=str(path))]
    assert got == [(1, "a", "must be a string, not null"), (2, "b", "must be a string, not boolean true")], got
