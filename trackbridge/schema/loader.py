"""Load, validate and compile the mapping files into a :class:`Registry`.

The shipped files live in ``mappings/`` (inside the wheel as ``trackbridge/mappings``). User files given with
``mappings=[PATH]`` / ``--mappings PATH`` are classified by their ``format`` line: a canonical extension, a
framework mapping (new, or extending a shipped framework of the same name) or derived rules. Every problem found is
collected and raised together as :class:`MappingErrors`, each naming file, line and entry.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable

from .model import _OPS as _WHEN_OPS
from .model import (
    APPROXIMATE,
    EXACT,
    OPEN,
    CanonicalMetric,
    CanonicalSchema,
    Cond,
    ConfigEntry,
    Entry,
    FrameworkMapping,
)
from .templates import TemplateError, compile_template, is_template, placeholder_names, strip_types
from .versions import VersionError, is_version, normalize, version_key
from .yamlfile import LineDict, MappingError, MappingErrors, line_of, load_yaml

_PH_NAME = re.compile(r"\{[^}]*\}")
CANONICAL_FORMAT = "trackbridge.canonical/1"
MAPPING_FORMAT = "trackbridge.mapping/1"
DERIVED_FORMAT = "trackbridge.derived/1"
KNOWN_FORMATS = (CANONICAL_FORMAT, MAPPING_FORMAT, DERIVED_FORMAT)

_CANON_TOP = {"format", "schema_version", "versions", "config", "metrics", "description"}
_METRIC_FIELDS = {"description", "unit", "kind", "better", "estimator", "reduction", "role", "axis", "note", "aliases"}
_ROLES = {"loss", "reward", "monitor"}
_KINDS = {"scalar", "histogram", "text"}
_BETTER = {"higher", "lower", "none"}
_MAP_TOP = {"format", "framework", "description", "repository", "releases", "aliases", "trainers", "prefixes",
            "config", "internal", "entries", "note"}
_ENTRY_FIELDS = {"key", "canonical", "since", "until", "trainers", "fidelity", "differs", "reason", "transform",
                 "when", "reverse", "source", "note", "renamed_from"}
_DIFFERS = {"estimator", "reduction", "population", "snapshot", "sign", "unit", "config", "scale", "definition",
            "weighting", "version"}
_CONFIG_FIELDS = {"key", "canonical", "trainers", "since", "until", "scale", "source", "note"}


def mappings_dir() -> Path:
    """The shipped mappings: ``mappings/`` of a source checkout, else the copy inside the installed package."""
    env = os.environ.get("TRACKBRIDGE_MAPPINGS_DIR")
    if env:
        return Path(env)
    here = Path(__file__).resolve().parent.parent
    for cand in (here.parent / "mappings", here / "mappings"):
        if (cand / "canonical.yaml").is_file():
            return cand
    import importlib.resources as ir
    return Path(str(ir.files("trackbridge.mappings")))


@dataclass
class Registry:
    canonical: CanonicalSchema
    frameworks: dict[str, FrameworkMapping]
    derived_files: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)

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
    key = _cache_key([*files, *extra])
    path = _cache_file(key) if key else None
    if path is not None:
        reg = _read_compiled(path)
        if reg is not None:
            return reg
    reg = build_registry([Path(f) for f in files], list(extra))
    if path is not None:
        _write_compiled(path, reg)
    return reg


# -- the compiled registry: parsed and validated mapping files, pickled, keyed by the files' bytes -----------------
# Loading ~3,600 lines of YAML and checking them takes 0.3-0.6 s; the compiled copy loads in a few ms. The key covers
# every file's path and content, trackbridge's and Python's versions, so any edit recompiles. A cache that cannot be
# read or written is ignored: the files are then parsed as usual. TRACKBRIDGE_NO_CACHE=1 turns it off;
# TRACKBRIDGE_CACHE_DIR moves it (default: $XDG_CACHE_HOME/trackbridge or ~/.cache/trackbridge).
def _cache_key(files: list[str]) -> str | None:
    if os.environ.get("TRACKBRIDGE_NO_CACHE"):
        return None
    import hashlib
    import sys

    from .. import __version__
    h = hashlib.sha256(f"{__version__}|{sys.version}|{__file__}".encode())
    here = Path(__file__).parent
    try:
        code = ("model.py", "templates.py", "loader.py", "versions.py", "yamlfile.py")   # what shapes the pickle
        for f in [*(str(here / m) for m in code), *files]:
            h.update(f.encode() + b"\0")
            h.update(Path(f).read_bytes())
            h.update(b"\0")
    except OSError:
        return None           # a file that cannot be read: the loader reports it
    return h.hexdigest()[:32]


def _cache_file(key: str) -> Path:
    base = os.environ.get("TRACKBRIDGE_CACHE_DIR")
    if not base:
        base = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
                            "trackbridge")
    return Path(base) / f"registry-{key}.pickle"


def _read_compiled(path: Path) -> Registry | None:
    import pickle
    try:
        with open(path, "rb") as fh:
            reg = pickle.load(fh)
    except Exception:           # missing, partial, from another layout: recompile
        return None
    return reg if isinstance(reg, Registry) else None


def _write_compiled(path: Path, reg: Registry) -> None:
    import pickle
    import tempfile
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".registry-", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as fh:
                pickle.dump(reg, fh, protocol=pickle.HIGHEST_PROTOCOL)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    except Exception:
        pass                    # a read-only home or full disk: the mappings still load, just not faster


def shipped_files() -> list[Path]:
    d = mappings_dir()
    return sorted(p for p in d.glob("*.yaml"))


def build_registry(files: list[Path], extra: list[str]) -> Registry:
    errors: list[MappingError] = []
    docs: list[tuple[str, Any]] = []
    for f in [*map(str, files), *extra]:
        try:
            docs.append((f, load_yaml(f)))
        except MappingError as exc:
            errors.append(exc)
    canon_docs, fw_docs, derived = [], [], []
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
        else:
            errors.append(MappingError(
                f"unknown format {fmt!r}; this trackbridge reads {', '.join(KNOWN_FORMATS)} "
                "(is the file for a newer trackbridge?)", file=f, line=line_of(doc, "format", 1)))
    canonical = None
    if not canon_docs:
        errors.append(MappingError("no canonical schema (format: trackbridge.canonical/1) among the mapping files"))
    else:
        canonical = _load_canonical(canon_docs, errors)
    frameworks: dict[str, FrameworkMapping] = {}
    if canonical is not None:
        for f, doc in fw_docs:
            _load_framework(f, doc, canonical, frameworks, errors)
        for fw in frameworks.values():
            _check_framework(fw, errors)
            fw.index()
    if errors:
        raise errors[0] if len(errors) == 1 else MappingErrors(errors)
    return Registry(canonical=canonical, frameworks=frameworks, derived_files=derived, files=[f for f, _ in docs])


def _unknown(obj: LineDict, allowed: set[str], f: str, entry: str, errors: list[MappingError]) -> None:
    for k in obj:
        if k not in allowed:
            errors.append(MappingError(f"unknown field {k!r} (allowed: {', '.join(sorted(allowed))})",
                                       file=f, line=line_of(obj, k), entry=entry))


def _load_canonical(docs: list[tuple[str, Any]], errors: list[MappingError]) -> CanonicalSchema | None:
    main_file, main = docs[0]
    metrics: dict[str, CanonicalMetric] = {}
    config: dict[str, dict[str, Any]] = {}
    renames: list[tuple[str, dict[str, str]]] = []
    version = str(main.get("schema_version", "0"))
    for f, doc in docs:
        _unknown(doc, _CANON_TOP, f, "canonical schema", errors)
        for name, spec in (doc.get("config") or {}).items():
            if name in config:
                errors.append(MappingError("canonical config name defined twice", file=f,
                                           line=line_of(doc.get("config"), name), entry=name))
            config[name] = dict(spec or {})
        mdoc = doc.get("metrics") or {}
        if not isinstance(mdoc, dict):
            errors.append(MappingError("`metrics` must be a mapping of name -> definition", file=f,
                                       line=line_of(doc, "metrics")))
            continue
        for raw_name, spec in mdoc.items():
            line = line_of(mdoc, raw_name)
            name = strip_types(str(raw_name))
            if name in metrics:
                errors.append(MappingError("canonical name defined twice", file=f, line=line, entry=name))
                continue
            if not isinstance(spec, dict):
                errors.append(MappingError("definition must be a mapping", file=f, line=line, entry=name))
                continue
            _unknown(spec, _METRIC_FIELDS, f, name, errors)
            for req in ("description", "unit"):
                if not spec.get(req):
                    errors.append(MappingError(f"missing {req!r}", file=f, line=line, entry=name))
            kind = spec.get("kind", "scalar")
            if kind not in _KINDS:
                errors.append(MappingError(f"kind {kind!r} is not one of {sorted(_KINDS)}", file=f, line=line,
                                           entry=name))
            better = spec.get("better", "none")
            if better not in _BETTER:
                errors.append(MappingError(f"better {better!r} is not one of {sorted(_BETTER)}", file=f, line=line,
                                           entry=name))
            role = spec.get("role")
            if role is not None and role not in _ROLES:
                errors.append(MappingError(f"role {role!r} is not one of {sorted(_ROLES)}", file=f, line=line,
                                           entry=name))
            tpl = None
            if is_template(name):
                try:
                    tpl = compile_template(str(raw_name))
                except TemplateError as exc:
                    errors.append(MappingError(str(exc), file=f, line=line, entry=name))
                    continue
            metrics[name] = CanonicalMetric(
                name=name, description=str(spec.get("description", "")), unit=str(spec.get("unit", "")),
                kind=kind, better=better, estimator=spec.get("estimator"), reduction=spec.get("reduction"),
                role=role, axis=bool(spec.get("axis", False)), template=tpl, file=f, line=line or 0)
    vers = main.get("versions") or {}
    try:
        ordered = sorted(vers.items(), key=lambda kv: version_key(str(kv[0])))
    except VersionError as exc:
        errors.append(MappingError(str(exc), file=main_file, line=line_of(main, "versions")))
        ordered = []
    for ver, change in ordered:
        ren = dict((change or {}).get("rename_metrics") or {})
        for old, new in ren.items():
            if new not in metrics and not any(m.template and m.template.match(new) for m in metrics.values()):
                errors.append(MappingError(f"rename target {new!r} is not a canonical name", file=main_file,
                                           line=line_of(vers, ver), entry=f"versions.{ver}"))
        renames.append((str(ver), ren))
    if ordered and str(ordered[-1][0]) != version:
        errors.append(MappingError(f"schema_version {version} is not the newest entry of versions "
                                   f"({ordered[-1][0]})", file=main_file, line=line_of(main, "schema_version")))
    templates = sorted((m for m in metrics.values() if m.template), key=lambda m: -m.template.literal_len)
    return CanonicalSchema(version=version, metrics=metrics, templates=templates, config=config, renames=renames,
                           file=main_file)


def _trainers(value: Any, f: str, line: int | None, entry: str, known: dict, errors: list) -> frozenset | None:
    if value is None:
        return None
    items = [value] if isinstance(value, str) else list(value)
    for t in items:
        if known and t not in known:
            errors.append(MappingError(f"unknown trainer {t!r} (declare it under `trainers:`)", file=f, line=line,
                                       entry=entry))
    return frozenset(items)


def _release(fw_releases: list[str], value: Any, f: str, line, entry: str, errors: list, default: float) -> float:
    if value is None:
        return default
    text = str(value)
    for i, r in enumerate(fw_releases):
        if normalize(r) == normalize(text):
            return i
    errors.append(MappingError(f"release {text!r} is not in the framework's `releases` list", file=f, line=line,
                               entry=entry))
    return default


def _load_framework(f: str, doc: LineDict, canonical: CanonicalSchema, frameworks: dict[str, FrameworkMapping],
                    errors: list[MappingError]) -> None:
    _unknown(doc, _MAP_TOP, f, "mapping", errors)
    name = doc.get("framework")
    if not name or not isinstance(name, str):
        errors.append(MappingError("missing `framework: NAME`", file=f, line=1))
        return
    existing = frameworks.get(name)
    releases = [str(r) for r in (doc.get("releases") or [])]
    for r in releases:
        if not is_version(r):
            errors.append(MappingError(f"release {r!r} is not a version", file=f, line=line_of(doc, "releases"),
                                       entry=name))
    if existing is None:
        if not releases:
            errors.append(MappingError("`releases` (the framework's releases, oldest first) is required", file=f,
                                       line=1, entry=name))
            return
        try:
            if [version_key(r) for r in releases] != sorted(version_key(r) for r in releases):
                errors.append(MappingError("`releases` must be in release order, oldest first", file=f,
                                           line=line_of(doc, "releases"), entry=name))
        except VersionError:
            pass
        fw = FrameworkMapping(name=name, description=str(doc.get("description", "")), releases=releases,
                              trainers={}, aliases={}, prefixes=[], config=[], internal=set(), entries=[],
                              repository=str(doc.get("repository", "")), file=f)
        frameworks[name] = fw
    else:
        fw = existing
        for r in releases:
            if not fw.has_release(r):
                errors.append(MappingError(f"release {r!r} unknown to framework {name!r}", file=f,
                                           line=line_of(doc, "releases"), entry=name))
    fw.trainers.update({k: dict(v or {}) for k, v in (doc.get("trainers") or {}).items()})
    for alias, spec in (doc.get("aliases") or {}).items():
        if not re.fullmatch(r"[a-z0-9][a-z0-9_.\-]*", str(alias)):
            errors.append(MappingError(f"alias {alias!r}: use lower-case letters, digits, '-', '_' or '.' ('/' "
                                       "separates a trainer and '@' a release)", file=f,
                                       line=line_of(doc.get("aliases"), alias), entry=name))
            continue
        fw.aliases[str(alias)] = dict(spec or {})
    for p in doc.get("prefixes") or []:
        if not isinstance(p, dict) or "prefix" not in p or p.get("split") not in ("train", "eval", "test"):
            errors.append(MappingError("prefix needs {prefix: TEXT, split: train|eval|test}", file=f,
                                       line=line_of(p, None, line_of(doc, "prefixes")), entry=name))
            continue
        fw.prefixes.append((str(p["prefix"]), p["split"]))
        fw.declared_prefixes.append((str(p["prefix"]), p["split"]))
    fw.prefixes.sort(key=lambda ps: -len(ps[0]))
    fw.internal.update(str(k) for k in (doc.get("internal") or []))
    for c in doc.get("config") or []:
        line = line_of(c)
        if not isinstance(c, dict) or "key" not in c or "canonical" not in c:
            errors.append(MappingError("config entry needs key and canonical", file=f, line=line, entry=name))
            continue
        _unknown(c, _CONFIG_FIELDS, f, f"config {c.get('key')}", errors)
        if c["canonical"] not in canonical.config:
            errors.append(MappingError(f"unknown canonical config name {c['canonical']!r} (add it to the `config:` "
                                       "section of canonical.yaml)", file=f, line=line, entry=f"config {c['key']}"))
        fw.config.append(ConfigEntry(key=str(c["key"]), canonical=str(c["canonical"]),
                                     trainers=_trainers(c.get("trainers"), f, line, str(c["key"]), fw.trainers, errors),
                                     since=_release(fw.releases, c.get("since"), f, line, str(c["key"]), errors, 0),
                                     until=_release(fw.releases, c.get("until"), f, line, str(c["key"]), errors, OPEN),
                                     scale=float(c.get("scale", 1.0)), source=str(c.get("source", "")),
                                     note=str(c.get("note", "")), file=f, line=line or 0))
    entries = doc.get("entries") or []
    if not isinstance(entries, list):
        errors.append(MappingError("`entries` must be a list", file=f, line=line_of(doc, "entries"), entry=name))
        return
    for raw in entries:
        line = line_of(raw)
        if not isinstance(raw, dict):
            errors.append(MappingError("entry must be a mapping", file=f, line=line, entry=name))
            continue
        key = raw.get("key")
        label = str(key)
        _unknown(raw, _ENTRY_FIELDS, f, label, errors)
        if not key or not isinstance(key, str):
            errors.append(MappingError("entry without a `key`", file=f, line=line))
            continue
        target = raw.get("canonical")
        if not target or not isinstance(target, str):
            errors.append(MappingError("missing `canonical`", file=f, line=line, entry=label))
            continue
        target = strip_types(target)
        cm = canonical.metrics.get(target)
        if cm is None:
            shape = _PH_NAME.sub("{}", target)
            alike = [n for n in canonical.metrics if "{" in n and _PH_NAME.sub("{}", n) == shape]
            hint = f" (did you mean {alike[0]!r}? placeholder names must match)" if alike else ""
            errors.append(MappingError(f"canonical target {target!r} does not exist in canonical.yaml{hint}", file=f,
                                       line=line, entry=label))
            continue
        ktpl = ctpl = None
        try:
            if is_template(key):
                ktpl = compile_template(key)
            ctpl = cm.template
        except TemplateError as exc:
            errors.append(MappingError(str(exc), file=f, line=line, entry=label))
            continue
        if placeholder_names(key) != placeholder_names(target):
            errors.append(MappingError(f"placeholders of the key {sorted(placeholder_names(key))} and of the canonical "
                                       f"target {sorted(placeholder_names(target))} differ", file=f, line=line,
                                       entry=label))
            continue
        fidelity = raw.get("fidelity", EXACT)
        if fidelity not in (EXACT, APPROXIMATE):
            errors.append(MappingError(f"fidelity {fidelity!r} must be exact or approximate", file=f, line=line,
                                       entry=label))
        reason = str(raw.get("reason") or "")
        differs = raw.get("differs") or []
        differs = [differs] if isinstance(differs, str) else list(differs)
        for d in differs:
            if d not in _DIFFERS:
                errors.append(MappingError(f"differs: {d!r} is not one of {sorted(_DIFFERS)}", file=f, line=line,
                                           entry=label))
        if fidelity == APPROXIMATE and not reason:
            errors.append(MappingError("an approximate entry needs a `reason`", file=f, line=line, entry=label))
        if not raw.get("source"):
            errors.append(MappingError("missing `source` (file@release it was read from)", file=f, line=line,
                                       entry=label))
        elif "@" not in str(raw["source"]):
            errors.append(MappingError(f"source {raw['source']!r} names no release: write path/in/repo.py@RELEASE",
                                       file=f, line=line, entry=label))
        scale, offset = 1.0, 0.0
        tr = raw.get("transform")
        if tr is not None:
            if not isinstance(tr, dict) or set(tr) - {"scale", "offset", "negate"}:
                errors.append(MappingError("transform must be {scale: X, offset: Y} and/or {negate: true}", file=f,
                                           line=line, entry=label))
            else:
                try:
                    scale = float(tr.get("scale", 1.0)) * (-1.0 if tr.get("negate") else 1.0)
                    offset = float(tr.get("offset", 0.0))
                except (TypeError, ValueError):
                    errors.append(MappingError("transform scale/offset must be numbers", file=f, line=line,
                                               entry=label))
        reverse = bool(raw.get("reverse", True))
        if reverse and scale == 0.0:
            errors.append(MappingError("transform is not invertible (scale 0) but the entry is used for reverse "
                                       "translation (set reverse: false)", file=f, line=line, entry=label))
        when = raw.get("when")
        when_items: tuple = ()
        if when is not None:
            if not isinstance(when, dict) or set(when) != {"config"} or not isinstance(when["config"], dict):
                errors.append(MappingError("when must be {config: {KEY: VALUE, ...}}", file=f, line=line,
                                           entry=label))
            else:
                items = []
                for k, v in when["config"].items():
                    if isinstance(v, dict):       # a comparison: {KEY: {gt: 1}}
                        if len(v) != 1 or next(iter(v)) not in _WHEN_OPS:
                            errors.append(MappingError(
                                f"when: {k}: a comparison is one of {{ne|gt|ge|lt|le: VALUE}}, not {dict(v)!r}",
                                file=f, line=line, entry=label))
                            continue
                        op, val = next(iter(v.items()))
                        v = Cond(str(op), val)
                    items.append((str(k), v))
                when_items = tuple(sorted(items, key=lambda kv: kv[0]))
        since = _release(fw.releases, raw.get("since"), f, line, label, errors, 0)
        until = _release(fw.releases, raw.get("until"), f, line, label, errors, OPEN)
        if since > until:
            errors.append(MappingError(f"since {raw.get('since')} is after until {raw.get('until')}", file=f,
                                       line=line, entry=label))
        fw.entries.append(Entry(
            framework=name, key=key, canonical=target, since=since, until=until,
            trainers=_trainers(raw.get("trainers"), f, line, label, fw.trainers, errors), fidelity=fidelity,
            differs=tuple(differs), reason=reason, scale=scale, offset=offset, when=when_items, reverse=reverse,
            source=str(raw.get("source", "")), note=str(raw.get("note", "")),
            renamed_from=tuple([raw["renamed_from"]] if isinstance(raw.get("renamed_from"), str)
                               else raw.get("renamed_from") or ()), key_template=ktpl,
            canonical_template=ctpl, file=f, line=line or 0))


def _overlap(a: Entry, b: Entry) -> bool:
    if a.until < b.since or b.until < a.since:
        return False
    if a.trainers is not None and b.trainers is not None and not (a.trainers & b.trainers):
        return False
    return a.when == b.when


def _check_framework(fw: FrameworkMapping, errors: list[MappingError]) -> None:
    for name, spec in fw.trainers.items():
        unknown = set(spec) - {"kind", "since", "until", "description", "source", "always", "note", "config_fields"}
        if unknown:
            errors.append(MappingError(f"trainer {name!r}: unknown field(s) {sorted(unknown)} (allowed: kind, since, "
                                       "until, description, source, always, note, config_fields)", file=fw.file,
                                       entry=name))
        for bound in ("since", "until"):
            if spec.get(bound) is not None:
                try:
                    version_key(str(spec[bound]))
                except Exception as exc:
                    errors.append(MappingError(f"trainer {name!r}: {bound} {spec[bound]!r}: {exc}", file=fw.file,
                                               entry=name))
        if "kind" in spec and not isinstance(spec.get("kind"), str):
            errors.append(MappingError(f"trainer {name!r}: `kind` must be a word (rl, preference, sft, reward, ...)",
                                       file=fw.file, entry=name))
        for cf in spec.get("config_fields") or []:
            if not isinstance(cf, dict) or not isinstance(cf.get("field"), str) or not cf.get("source"):
                errors.append(MappingError(f"trainer {name!r}: config_fields items need `field` and `source`",
                                           file=fw.file, entry=name))
        for k in spec.get("always") or []:
            if not any(e.key == k and (e.trainers is None or name in e.trainers) for e in fw.entries):
                errors.append(MappingError(f"trainer {name!r}: `always` key {k!r} has no entry for this trainer",
                                           file=fw.file, entry=name))
    for alias, spec in fw.aliases.items():
        if spec.get("trainer") and spec["trainer"] not in fw.trainers:
            errors.append(MappingError(f"alias {alias!r} names unknown trainer {spec['trainer']!r}", file=fw.file,
                                       entry=alias))
    by_key: dict[str, list[Entry]] = {}
    by_canon: dict[str, list[Entry]] = {}
    for e in fw.entries:
        by_key.setdefault(e.key, []).append(e)
        if e.reverse:
            by_canon.setdefault(e.canonical, []).append(e)
    for key, es in by_key.items():
        for i, a in enumerate(es):
            for b in es[i + 1:]:
                if _overlap(a, b):
                    errors.append(MappingError(
                        f"two entries claim {key!r} for overlapping releases/trainers (the other is at "
                        f"{b.file}:{b.line}); split the release ranges, restrict trainers, or add a `when:` condition",
                        file=a.file, line=a.line, entry=key))
    for e in fw.entries:
        for old in e.renamed_from:
            prev = [p for p in by_key.get(old, ()) if p.until < e.since and p.canonical == e.canonical
                    and (p.trainers is None or e.trainers is None or p.trainers & e.trainers)]
            if not prev:
                errors.append(MappingError(
                    f"renamed_from {old!r}: no earlier entry of that key (ending before {fw.release_name(e.since)}) "
                    f"with the same canonical target {e.canonical!r}", file=e.file, line=e.line, entry=e.key))
            for p in prev:
                fw.link(p, e)
    for canon, es in by_canon.items():
        for i, a in enumerate(es):
            for b in es[i + 1:]:
                if a.key != b.key and _overlap(a, b):
                    errors.append(MappingError(
                        f"two reverse entries ({a.key!r} and {b.key!r} at {b.file}:{b.line}) give canonical {canon!r} "
                        "for the same trainer and releases, so canonical -> framework is ambiguous; mark the alias "
                        "`reverse: false` or give the quantities different canonical names",
                        file=a.file, line=a.line, entry=a.key))
