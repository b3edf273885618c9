"""Load, validate and compile the mapping files into a :class:`Registry`.

The shipped files live in ``mappings/`` (inside the wheel as ``trackbridge/mappings``). User files given with
``mappings=[PATH]`` / ``--mappings PATH`` are classified by their ``format`` line: a canonical extension, a
framework mapping (new, or extending a shipped framework of the same name; an entry colliding with a shipped one
needs ``override: true``, :mod:`.overrides`), derived rules or diagnostic checks (:mod:`trackbridge.doctor`).
Each canonical and framework file is first checked against its JSON Schema (``mappings/schemas/canonical.schema.json``,
``framework.schema.json``: fields, types, allowed values), then parsed by :mod:`.canonical` and :mod:`.framework`
(what needs the other files: canonical names that exist, releases, overlaps, renames). Every problem found is
collected and raised together as :class:`MappingErrors`, each naming file, line and entry. The compiled registry is
cached on disk (:mod:`.cache`).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable

from . import cache, reductions
from .canonical import load_canonical
from .framework import check_framework, load_framework
from .jsonschema import SchemaError, load_schema, validate
from .model import CanonicalSchema, FrameworkMapping
from .overrides import apply_overrides
from .paths import mappings_dir
from .proofs import PROOFS_FORMAT, Proven, proven_entries
from .yamlfile import MappingError, MappingErrors, line_of, load_yaml

CANONICAL_FORMAT = "trackbridge.canonical/1"
MAPPING_FORMAT = "trackbridge.mapping/1"
DERIVED_FORMAT = "trackbridge.derived/1"
CHECKS_FORMAT = "trackbridge.checks/1"           # diagnostic checks (trackbridge/doctor/checks.py loads them)
KNOWN_FORMATS = (CANONICAL_FORMAT, MAPPING_FORMAT, DERIVED_FORMAT, CHECKS_FORMAT, PROOFS_FORMAT)
SCHEMAS = {CANONICAL_FORMAT: "canonical", MAPPING_FORMAT: "framework"}     # format -> mappings/schemas/<name>

__all__ = ["Registry", "load_registry", "build_registry", "shipped_files", "user_files", "mappings_dir",
           "KNOWN_FORMATS"]


@dataclass
class Registry:
    canonical: CanonicalSchema
    frameworks: dict[str, FrameworkMapping]
    derived_files: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    check_files: list[str] = field(default_factory=list)  # trackbridge.checks/1 files (shipped and the user's)
    overrides: list[str] = field(default_factory=list)    # what user entries override (schema/overrides.py)
    warnings: list[MappingError] = field(default_factory=list)    # what `mappings lint` reports without failing
    #: (entry file, entry line) -> the proofs that ran the framework's code and saw the entry's stated reduction
    #: (mappings/proofs.yaml, schema/proofs.py); an entry not here is unproven
    proven: dict[tuple[str, int], Proven] = field(default_factory=dict)

    def framework(self, name: str) -> FrameworkMapping:
        try:
            return self.frameworks[name]
        except KeyError:
            raise MappingError(f"unknown framework {name!r}; known: {', '.join(sorted(self.frameworks))}") from None

    def resolve_alias(self, name: str) -> tuple[str, dict[str, Any]] | None:
        """``trl-legacy`` -> ("trl", {"trainer": "ppo_legacy", "until": "v0.11.4"})."""
        if name in self.frameworks:
            return name, {}
        for fw in self.frameworks.values():
            if name in fw.aliases:
                return fw.name, dict(fw.aliases[name] or {})
        return None


# ---------------------------------------------------------------------------------------------------- loading
def load_registry(extra: Iterable[str | os.PathLike] | None = None) -> Registry:
    """The shipped mappings plus any user files, validated. Cached per set of user files."""
    return _load_cached(tuple(str(Path(p).resolve()) for p in (extra or ())))


@lru_cache(maxsize=16)
def _load_cached(extra: tuple[str, ...]) -> Registry:
    files = [str(p) for p in shipped_files()]
    key = cache.cache_key([*files, *extra])
    path = cache.cache_file(key) if key else None
    if path is not None:
        reg = cache.read_compiled(path)
        if isinstance(reg, Registry):
            return reg
    reg = build_registry([Path(f) for f in files], list(extra))
    if path is not None:
        cache.write_compiled(path, reg)
    return reg


def shipped_files() -> list[Path]:
    d = mappings_dir()
    return sorted(p for p in d.glob("*.yaml"))


def user_files(extra: Iterable[str | os.PathLike], shipped: Iterable[str | os.PathLike]) -> list[str]:
    """The user's files among ``extra``, each once: a path that is one of the ``shipped`` files (``trackbridge mappings
    lint mappings/openrlhf.yaml`` in a checkout) is the shipped file, loaded once, not a second copy that overlaps
    it entry by entry."""
    seen = {_same(p) for p in shipped}
    out = []
    for p in extra:
        key = _same(p)
        if key not in seen:
            seen.add(key)
            out.append(str(p))
    return out


def _same(p: str | os.PathLike) -> str:
    try:
        return str(Path(p).resolve())
    except OSError:
        return str(p)


def build_registry(files: list[Path], extra: list[str], *, require_reduction: bool | None = None) -> Registry:
    """Load and check ``files`` (the shipped ones) and ``extra`` (a user's); raise :class:`MappingErrors` naming every
    problem. ``require_reduction``: an entry without ``reduce:`` is an error (default:
    :data:`~.reductions.REQUIRE_REDUCTION`), else a warning in ``Registry.warnings``."""
    errors: list[MappingError] = []
    warnings: list[MappingError] = []
    docs: list[tuple[str, Any]] = []
    extra = user_files(extra, files)
    for f in [*map(str, files), *extra]:
        try:
            docs.append((f, load_yaml(f)))
        except MappingError as exc:
            errors.append(exc)
    canon_docs: list[tuple[str, Any]] = []
    fw_docs: list[tuple[str, Any]] = []
    derived: list[str] = []
    checks: list[str] = []
    proof_docs: list[tuple[str, Any]] = []
    for f, doc in docs:
        if not isinstance(doc, dict):
            errors.append(MappingError("expected a mapping at the top level", file=f, line=1))
            continue
        fmt = doc.get("format")
        if fmt == CANONICAL_FORMAT:
            canon_docs.append((f, doc))
        elif fmt == MAPPING_FORMAT:
            fw_docs.append((f, doc))
        elif fmt == DERIVED_FORMAT:
            derived.append(f)
        elif fmt == CHECKS_FORMAT:
            checks.append(f)
        elif fmt == PROOFS_FORMAT:
            proof_docs.append((f, doc))
        else:
            errors.append(MappingError(
                f"unknown format {fmt!r}; this trackbridge reads {', '.join(KNOWN_FORMATS)} "
                "(is the file for a newer trackbridge?)", file=f, line=line_of(doc, "format", 1)))
    structural = [e for fmt, group in ((CANONICAL_FORMAT, canon_docs), (MAPPING_FORMAT, fw_docs))
                  for f, doc in group for e in validate(doc, load_schema(SCHEMAS[fmt]), file=f)]
    canonical = None
    if not canon_docs:
        errors.append(MappingError("no canonical schema (format: trackbridge.canonical/1) among the mapping files"))
    else:
        shipped: tuple[Any, Any] = (None, None)
        if "splits" not in canon_docs[0][1] or "axes" not in canon_docs[0][1]:
            # a canonical file of one's own without these sections gets the shipped ones
            from .facts import shipped_splits_and_axes
            shipped = shipped_splits_and_axes()
        canonical = _guarded(lambda: load_canonical(canon_docs, errors, shipped, warnings), structural, errors)
    frameworks: dict[str, FrameworkMapping] = {}
    overrides: list[str] = []
    if canonical is not None:
        for f, doc in fw_docs:
            _guarded(lambda: load_framework(f, doc, canonical, frameworks, errors, warnings, require_reduction),
                     structural, errors)
        for fw in frameworks.values():
            overrides += apply_overrides(fw, set(extra), errors)
            _guarded(lambda: check_framework(fw, errors), structural, errors)
            fw.index()
    proven = proven_entries(proof_docs, frameworks, set(map(str, files)), errors, warnings,
                           canonical) if canonical else {}
    if require_reduction if require_reduction is not None else reductions.REQUIRE_REDUCTION:
        errors += warnings           # a reduction unstated (an entry's, or a canonical metric's reference)
        warnings = []
    errors = [*errors, *(e for e in structural if not _said(e, errors))]
    errors.sort(key=lambda e: (e.file or "", e.line or 0))
    if errors:
        raise errors[0] if len(errors) == 1 else MappingErrors(errors)
    assert canonical is not None            # no canonical file, or one that failed to parse, is an error above
    warnings.sort(key=lambda e: (e.file or "", e.line or 0))
    return Registry(canonical=canonical, frameworks=frameworks, derived_files=derived, files=[f for f, _ in docs],
                    overrides=overrides, check_files=checks, warnings=warnings, proven=proven)


def _said(e: Any, errors: list[MappingError]) -> bool:
    """Whether the loader already names the field a schema error is about, in its own words (``role 'penalty' is
    not one of ...``), at the same file and line or for the same entry: then the schema's error would only repeat
    it."""
    field_name = e.detail if getattr(e, "keyword", "") in ("required", "additionalProperties") else next(
        (p for p in reversed(getattr(e, "path", ())) if isinstance(p, str)), None)
    if not field_name:
        return False
    path = [p for p in getattr(e, "path", ()) if isinstance(p, str)]
    return any(o.file == e.file and (o.line == e.line or (o.entry is not None and o.entry in path))
               and str(field_name) in o.message for o in errors)


def _guarded(parse: Any, structural: list[SchemaError], errors: list[MappingError]) -> Any:
    """Run one parsing step; a file the JSON Schema already rejected may trip it (a list where a mapping belongs):
    then the schema's errors say what is wrong and the step's crash is not reported."""
    try:
        return parse()
    except (TypeError, AttributeError, ValueError) as exc:
        if isinstance(exc, MappingError) or not structural:
            raise
        return None
