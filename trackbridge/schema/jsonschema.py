"""A small JSON Schema validator for the mapping files' schemas (``mappings/schemas/<name>.schema.json``).

The core depends on PyYAML only, so this is a validator for the subset of JSON Schema (Draft 2020-12) that the
shipped schemas use, with errors that name the YAML file, the line and the entry::

    schema = load_schema("derived")                        # mappings/schemas/derived.schema.json, checked, cached
    errors = validate(load_yaml(path), schema, file=path)  # [] when valid; else SchemaError (a MappingError) each

Supported keywords: ``type`` (one or a list of ``object array string integer number boolean null``),
``properties``, ``required``, ``additionalProperties`` (true/false or a schema), ``patternProperties``,
``propertyNames``, ``minProperties``, ``enum``, ``const``, ``items`` (one schema for every item), ``minItems``,
``maxItems``, ``uniqueItems``, ``minLength``, ``maxLength``, ``pattern`` (searched, as JSON Schema does),
``minimum``, ``maximum``, ``exclusiveMinimum``, ``exclusiveMaximum``, ``oneOf``, ``anyOf``, ``allOf``, ``not``,
``$ref`` (only ``#/$defs/NAME``), ``$defs``; annotations (``$schema $id $comment title description default
examples deprecated``) are ignored. Any other keyword makes :func:`load_schema` / :func:`check_schema` fail, so the
subset never silently ignores a constraint. The tests check that this validator agrees with the ``jsonschema``
package on the shipped files and on a corpus of broken ones.

Each error is a :class:`SchemaError`: ``file``, ``line`` (the line of the offending key or item, from
:class:`~trackbridge.schema.yamlfile.LineDict`; for a missing field the line of the mapping that lacks it),
``entry`` (the JSON path, e.g. ``rules[3].formla``), plus ``path`` (the path as a tuple) and ``keyword``.
"""
from __future__ import annotations

import difflib
import json
import math
import os
import re
from functools import lru_cache
from typing import Any

from .paths import mappings_dir
from .yamlfile import LineDict, MappingError

__all__ = ["SchemaError", "load_schema", "check_schema", "validate", "json_path"]

_ANNOTATIONS = {"$schema", "$id", "$comment", "title", "description", "default", "examples", "deprecated"}
_SCHEMA_MAPS = {"properties", "patternProperties", "$defs"}      # name -> schema
_SCHEMA_LISTS = {"oneOf", "anyOf", "allOf"}                      # [schema, ...]
_SCHEMA_ONE = {"additionalProperties", "items", "propertyNames", "not"}   # schema (or bool)
_VALUES = {"type", "required", "enum", "const", "minItems", "maxItems", "uniqueItems", "minLength", "maxLength",
           "pattern", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "minProperties", "$ref"}
SUPPORTED = _ANNOTATIONS | _SCHEMA_MAPS | _SCHEMA_LISTS | _SCHEMA_ONE | _VALUES
_TYPE_WORDS = {"object": "a mapping", "array": "a list", "string": "a string", "integer": "an integer",
               "number": "a number", "boolean": "a boolean", "null": "null"}
_TYPES = set(_TYPE_WORDS)


class SchemaError(MappingError):
    """One place where a document does not follow its schema (a :class:`MappingError`: file, line, entry)."""

    def __init__(self, message: str, *, file: str | None, line: int | None, path: tuple = (), keyword: str = "",
                 detail: Any = None, hint: str = ""):
        # detail: the missing field (required), the unknown key (additionalProperties); hint: " (did you mean ...)"
        self.path, self.keyword, self.detail, self.hint = tuple(path), keyword, detail, hint
        super().__init__(message, file=file, line=line, entry=json_path(path) or None)


def json_path(path: tuple | list) -> str:
    """``("rules", 3, "formla")`` -> ``rules[3].formla``; keys that are not plain words are quoted."""
    out = ""
    for p in path:
        if isinstance(p, int) and not isinstance(p, bool):
            out += f"[{p}]"
        elif isinstance(p, str) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_/@{}:\-]*", p):
            out += ("." if out else "") + p
        else:
            out += f"[{json.dumps(p) if isinstance(p, str) else repr(p)}]"
    return out


# ---------------------------------------------------------------------------------------------------- schemas
def load_schema(name: str) -> dict:
    """The schema ``mappings/schemas/<name>.schema.json`` of the one mappings folder (``TRACKBRIDGE_MAPPINGS_DIR``
    honoured), checked against the supported subset; cached per file and modification time."""
    path = str(mappings_dir() / "schemas" / f"{name}.schema.json")
    try:
        stamp = os.stat(path).st_mtime_ns
    except OSError as exc:
        raise MappingError(f"cannot read JSON Schema: {exc.strerror or exc}", file=path) from None
    return _load_file(path, stamp)


@lru_cache(maxsize=16)
def _load_file(path: str, stamp: int) -> dict:
    try:
        with open(path, encoding="utf-8") as fh:
            schema = json.load(fh)
    except OSError as exc:
        raise MappingError(f"cannot read JSON Schema: {exc.strerror or exc}", file=path) from None
    except json.JSONDecodeError as exc:
        raise MappingError(f"not valid JSON: {exc.msg}", file=path, line=exc.lineno) from None
    check_schema(schema, file=path)
    return schema


def check_schema(schema: Any, *, file: str | None = None) -> None:
    """Raise :class:`MappingError` if ``schema`` uses a keyword (or a ``$ref``) this validator does not support."""
    defs = schema.get("$defs", {}) if isinstance(schema, dict) else {}

    def walk(node: Any, where: str) -> None:
        if isinstance(node, bool):
            return
        if not isinstance(node, dict):
            raise MappingError(f"{where}: a schema must be an object or a boolean", file=file)
        for k, v in node.items():
            at = f"{where}/{k}"
            if k not in SUPPORTED:
                raise MappingError(f"{at}: keyword {k!r} is not supported by trackbridge's validator "
                                   f"(supported: {', '.join(sorted(SUPPORTED - _ANNOTATIONS))})", file=file)
            if k in _SCHEMA_MAPS:
                for name, sub in v.items():
                    if k == "patternProperties":
                        _compile(name, file, at)
                    walk(sub, f"{at}/{name}")
            elif k in _SCHEMA_LISTS:
                if not isinstance(v, list) or not v:
                    raise MappingError(f"{at}: must be a non-empty list of schemas", file=file)
                for i, sub in enumerate(v):
                    walk(sub, f"{at}/{i}")
            elif k in _SCHEMA_ONE:
                walk(v, at)
            elif k == "$ref":
                if not (isinstance(v, str) and v.startswith("#/$defs/") and v[len("#/$defs/"):] in defs):
                    raise MappingError(f"{at}: only '#/$defs/NAME' references to a defined NAME are supported, "
                                       f"not {v!r}", file=file)
            elif k == "type":
                for t in v if isinstance(v, list) else [v]:
                    if t not in _TYPES:
                        raise MappingError(f"{at}: unknown type {t!r}", file=file)
            elif k == "pattern":
                _compile(v, file, at)

    walk(schema, "#")


@lru_cache(maxsize=512)
def _regex(pattern: str) -> re.Pattern:
    return re.compile(pattern)


def _compile(pattern: Any, file: str | None, where: str) -> None:
    try:
        _regex(pattern)
    except (re.error, TypeError) as exc:
        raise MappingError(f"{where}: bad regular expression {pattern!r}: {exc}", file=file) from None


# ---------------------------------------------------------------------------------------------------- validation
def validate(data: Any, schema: dict, *, file: str | None) -> list[SchemaError]:
    """Every place where ``data`` (as loaded by :func:`~trackbridge.schema.yamlfile.load_yaml`) breaks ``schema``,
    in document order; ``[]`` when it is valid."""
    v = _Validator(schema, file)
    errors = v.check(data, schema, (), line_of_node(data) or 1)
    return sorted(errors, key=lambda e: (e.line or 0, e.path.__repr__()))


def line_of_node(obj: Any) -> int | None:
    return obj.line if isinstance(obj, LineDict) else None


def _type_ok(value: Any, t: str) -> bool:
    if t == "object":
        return isinstance(value, dict)
    if t == "array":
        return isinstance(value, list)
    if t == "string":
        return isinstance(value, str)
    if t == "boolean":
        return isinstance(value, bool)
    if t == "null":
        return value is None
    if isinstance(value, bool):
        return False
    if t == "integer":
        return isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    return isinstance(value, (int, float))            # number


def _type_name(value: Any) -> str:
    for t in ("null", "boolean", "integer", "number", "string", "array", "object"):
        if _type_ok(value, t):
            return t
    return type(value).__name__


def _equal(a: Any, b: Any) -> bool:
    """JSON equality: ``True`` is not ``1``, ``1`` is ``1.0``."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b or (_type_ok(a, "number") and _type_ok(b, "number") and a == b)


def _show(value: Any) -> str:
    text = json.dumps(value, default=str) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _suggest(word: Any, choices: list) -> str:
    if not isinstance(word, str):
        return ""
    close = difflib.get_close_matches(word, [c for c in choices if isinstance(c, str)], n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


class _Validator:
    def __init__(self, root: dict, file: str | None):
        self.root, self.file = root, file

    def err(self, msg: str, line: int | None, path: tuple, keyword: str, detail: Any = None,
            hint: str = "") -> SchemaError:
        return SchemaError(msg, file=self.file, line=line, path=path, keyword=keyword, detail=detail, hint=hint)

    def check(self, value: Any, schema: Any, path: tuple, line: int | None) -> list[SchemaError]:
        if schema is True:
            return []
        if schema is False:
            return [self.err("not allowed here", line, path, "false")]
        if "$ref" in schema:
            out = self.check(value, self.root["$defs"][schema["$ref"][len("#/$defs/"):]], path, line)
        else:
            out = []
        if "type" in schema:
            types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
            if not any(_type_ok(value, t) for t in types):
                want = " or ".join(_TYPE_WORDS[t] for t in types)
                got = _type_name(value)
                shown = "" if value is None else f" {_show(value)}"      # "not null", never "not null null"
                return out + [self.err(f"must be {want}, not {got}{shown}", line, path, "type")]
        if "const" in schema and not _equal(value, schema["const"]):
            out.append(self.err(f"must be {_show(schema['const'])}, not {_show(value)}", line, path, "const"))
        if "enum" in schema and not any(_equal(value, e) for e in schema["enum"]):
            out.append(self.err(f"{_show(value)} is not one of {', '.join(_show(e) for e in schema['enum'])}"
                                f"{_suggest(value, schema['enum'])}", line, path, "enum"))
        if isinstance(value, dict):
            out += self._object(value, schema, path, line)
        elif isinstance(value, list):
            out += self._array(value, schema, path, line)
        elif isinstance(value, str):
            out += self._string(value, schema, path, line)
        elif _type_ok(value, "number"):
            out += self._number(value, schema, path, line)
        for sub in schema.get("allOf", ()):
            out += self.check(value, sub, path, line)
        if "not" in schema and not self.check(value, schema["not"], path, line):
            out.append(self.err(f"{_show(value)} is not allowed here", line, path, "not"))
        if "anyOf" in schema:
            out += self._alternatives(value, schema["anyOf"], path, line, "anyOf")
        if "oneOf" in schema:
            out += self._alternatives(value, schema["oneOf"], path, line, "oneOf")
        return out

    def _object(self, obj: dict, schema: dict, path: tuple, line: int | None) -> list[SchemaError]:
        out: list[SchemaError] = []
        props = schema.get("properties", {})
        pats = schema.get("patternProperties", {})
        key_lines = getattr(obj, "key_lines", {})
        misspelled: set[str] = set()
        if schema.get("additionalProperties") is False:     # only then can an unknown key be a misspelled field
            unknown = [k for k in obj if k not in props and not any(isinstance(k, str) and _regex(p).search(k)
                                                                     for p in pats)]
            misspelled = {h for k in unknown for h in difflib.get_close_matches(str(k), list(props), n=1,
                                                                                   cutoff=0.6)}
        for req in schema.get("required", ()):
            if req not in obj and not (req in misspelled and schema.get("additionalProperties") is False):
                # a misspelled required field is reported once, as the unknown field (did you mean ...?)
                out.append(self.err(f"missing required field {req!r}", line, path, "required", req))
        if "minProperties" in schema and len(obj) < schema["minProperties"]:
            out.append(self.err(f"must have at least {schema['minProperties']} field(s)", line, path,
                                "minProperties"))
        for k, v in obj.items():
            kline = key_lines.get(k, line)
            sub = (*path, k)
            if "propertyNames" in schema:
                for e in self.check(k, schema["propertyNames"], sub, kline):
                    e.keyword = "propertyNames"
                    out.append(e)
            matched = False
            if k in props:
                matched = True
                out += self.check(v, props[k], sub, kline)
            for pat, psub in pats.items():
                if isinstance(k, str) and _regex(pat).search(k):
                    matched = True
                    out += self.check(v, psub, sub, kline)
            if not matched and "additionalProperties" in schema:
                extra = schema["additionalProperties"]
                if extra is False:
                    known = list(props)
                    hint = _suggest(k, known) or (f" (known: {', '.join(sorted(known))})" if known else "")
                    out.append(self.err(f"unknown field {k!r}{hint}", kline, sub, "additionalProperties", k, hint))
                else:
                    out += self.check(v, extra, sub, kline)
        return out

    def _array(self, arr: list, schema: dict, path: tuple, line: int | None) -> list[SchemaError]:
        out: list[SchemaError] = []
        if "minItems" in schema and len(arr) < schema["minItems"]:
            out.append(self.err(f"must have at least {schema['minItems']} item(s)", line, path, "minItems"))
        if "maxItems" in schema and len(arr) > schema["maxItems"]:
            out.append(self.err(f"must have at most {schema['maxItems']} item(s)", line, path, "maxItems"))
        if schema.get("uniqueItems"):
            for i, item in enumerate(arr):
                if any(_equal(item, prev) for prev in arr[:i]):
                    out.append(self.err(f"{_show(item)} is listed twice", line_of_node(item) or line, (*path, i),
                                        "uniqueItems"))
        if "items" in schema:
            for i, item in enumerate(arr):
                out += self.check(item, schema["items"], (*path, i), line_of_node(item) or line)
        return out

    def _string(self, s: str, schema: dict, path: tuple, line: int | None) -> list[SchemaError]:
        out: list[SchemaError] = []
        if "minLength" in schema and len(s) < schema["minLength"]:
            out.append(self.err("must not be empty" if schema["minLength"] == 1 else
                                f"must be at least {schema['minLength']} characters", line, path, "minLength"))
        if "maxLength" in schema and len(s) > schema["maxLength"]:
            out.append(self.err(f"must be at most {schema['maxLength']} characters", line, path, "maxLength"))
        if "pattern" in schema and not _regex(schema["pattern"]).search(s):
            out.append(self.err(f"{_show(s)} does not match the pattern {schema['pattern']!r}", line, path,
                                "pattern"))
        return out

    def _number(self, x: Any, schema: dict, path: tuple, line: int | None) -> list[SchemaError]:
        out: list[SchemaError] = []
        if isinstance(x, float) and not math.isfinite(x):
            return out
        for kw, bad, word in (("minimum", lambda b: x < b, ">="), ("maximum", lambda b: x > b, "<="),
                              ("exclusiveMinimum", lambda b: x <= b, ">"),
                              ("exclusiveMaximum", lambda b: x >= b, "<")):
            if kw in schema and bad(schema[kw]):
                out.append(self.err(f"{_show(x)} must be {word} {schema[kw]}", line, path, kw))
        return out

    def _alternatives(self, value: Any, alts: list, path: tuple, line: int | None, kw: str) -> list[SchemaError]:
        results = [self.check(value, alt, path, line) for alt in alts]
        ok = [i for i, r in enumerate(results) if not r]
        if kw == "oneOf" and len(ok) > 1:
            return [self.err(f"matches {len(ok)} of the allowed forms; it must match exactly one", line, path, kw)]
        if ok:
            return []
        # the alternatives whose type fits the value say most about what is wrong
        typed = [r for r in results if not any(e.keyword == "type" and e.path == path for e in r)]
        if len(typed) == 1:
            return typed[0]
        forms = [_describe(alt, self.root) for alt in alts]
        return [self.err(f"{_show(value)} is none of the allowed forms ({'; '.join(forms)})", line, path, kw)]


def _describe(schema: Any, root: dict) -> str:
    if isinstance(schema, bool):
        return "anything" if schema else "nothing"
    if "$ref" in schema:
        target = root["$defs"][schema["$ref"][len("#/$defs/"):]]
        return target.get("title") or schema["$ref"].rsplit("/", 1)[-1]
    if "title" in schema:
        return schema["title"]
    if "const" in schema:
        return _show(schema["const"])
    if "enum" in schema:
        return "one of " + ", ".join(_show(e) for e in schema["enum"])
    t = schema.get("type")
    if t:
        return " or ".join(_TYPE_WORDS[x] for x in (t if isinstance(t, list) else [t]))
    return "a schema"
