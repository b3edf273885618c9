"""Parse and check a framework mapping (``format: trackbridge.mapping/1``): releases, trainers, aliases, split
prefixes, config names and entries, compiled into a :class:`~.model.FrameworkMapping`.

The structure of each file (fields, types, allowed values) is checked by ``mappings/schemas/framework.schema.json``
before this module runs; what is checked here needs the canonical schema or the rest of the file: canonical targets
and config names that exist, release names and order, placeholders, overlapping entries, reverse ambiguity, renames,
trainers named by entries, aliases, ``always`` keys and trainer ``classes``.
"""
from __future__ import annotations

import re

from . import reductions
from .entry import load_entry, release_index, trainers_of
from .model import (
    OPEN,
    CanonicalSchema,
    ConfigEntry,
    Entry,
    FrameworkMapping,
)
from .reductions import LEVELS, NO_DEFAULT, CountError, LevelCount, Reduce, parse_count, parse_profiles
from .templates import compile_template, is_template
from .versions import VersionError, is_version, version_key
from .yamlfile import LineDict, MappingError, line_of


def load_framework(f: str, doc: LineDict, canonical: CanonicalSchema, frameworks: dict[str, FrameworkMapping],
                   errors: list[MappingError], warnings: list[MappingError] | None = None,
                   require_reduction: bool | None = None) -> None:
    """Parse one framework file into ``frameworks`` (a file of a framework already there extends it). Problems go to
    ``errors``; what the transition tolerates (an entry whose reduction is unstated) to ``warnings``, or to
    ``errors`` with ``require_reduction`` (default: :data:`~.reductions.REQUIRE_REDUCTION`)."""
    warnings = warnings if warnings is not None else []
    if require_reduction is None:
        require_reduction = reductions.REQUIRE_REDUCTION
    name = doc.get("framework")
    if not name or not isinstance(name, str):
        errors.append(MappingError("missing `framework: NAME`", file=f, line=1))
        return
    fw = _framework_of(f, doc, name, frameworks, errors)
    if fw is None:
        return
    _load_tables(doc, fw, canonical, f, name, errors)
    _load_config(doc, fw, canonical, f, name, errors)
    before = dict(fw.profiles)
    fw.profiles = parse_profiles(doc.get("reductions"), f, name, errors, inherited=fw.profiles)
    raw_profiles = doc.get("reductions") if isinstance(doc.get("reductions"), dict) else {}
    stated: list[tuple[Reduce, int | None, str]] = [(r, line_of(raw_profiles, n), f"reductions.{n}")
                                                    for n, r in fw.profiles.items() if n not in before]
    n_levels = {lvl: len(items) for lvl, items in fw.levels.items()}
    _load_levels(doc, fw, f, name, errors)
    entries = doc.get("entries") or []
    if not isinstance(entries, list):
        errors.append(MappingError("`entries` must be a list", file=f, line=line_of(doc, "entries"), entry=name))
        return
    for raw in entries:
        load_entry(raw, fw, canonical, f, name, errors, warnings, require_reduction, stated)
    new_levels = [item for lvl, items in fw.levels.items() for item in items[:len(items) - n_levels.get(lvl, 0)]]
    _check_defaults(fw, stated, new_levels, f, errors)



def _framework_of(f: str, doc: LineDict, name: str, frameworks: dict[str, FrameworkMapping],
                  errors: list[MappingError]) -> FrameworkMapping | None:
    """The framework a file describes: a new one (its releases checked), or the one a file before it
    declared, which it extends (its releases must be that one's). None when a new one has no releases."""
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
            return None
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
    return fw


def _load_tables(doc: LineDict, fw: FrameworkMapping, canonical: CanonicalSchema, f: str, name: str,
                 errors: list[MappingError]) -> None:
    """The file's trainers, aliases, split prefixes, internal keys and passthrough keys."""
    fw.trainers.update({k: dict(v or {}) for k, v in (doc.get("trainers") or {}).items()})
    for alias, spec in (doc.get("aliases") or {}).items():
        if not re.fullmatch(r"[a-z0-9][a-z0-9_.\-]*", str(alias)):
            errors.append(MappingError(f"alias {alias!r}: use lower-case letters, digits, '-', '_' or '.' ('/' "
                                       "separates a trainer and '@' a release)", file=f,
                                       line=line_of(doc.get("aliases"), alias), entry=name))
            continue
        fw.aliases[str(alias)] = dict(spec or {})
    for p in doc.get("prefixes") or []:
        if not isinstance(p, dict) or "prefix" not in p or p.get("split") not in canonical.splits.names:
            errors.append(MappingError(f"prefix needs {{prefix: TEXT, split: {'|'.join(canonical.splits.names)}}} "
                                       "(the splits of canonical.yaml)", file=f,
                                       line=line_of(p, None, line_of(doc, "prefixes")), entry=name))
            continue
        fw.prefixes.append((str(p["prefix"]), p["split"]))
        fw.declared_prefixes.append((str(p["prefix"]), p["split"]))
    fw.prefixes.sort(key=lambda ps: -len(ps[0]))
    fw.internal.update(str(k) for k in (doc.get("internal") or []))
    for item in doc.get("passthrough") or []:
        if isinstance(item, dict) and isinstance(item.get("key"), str):
            k = item["key"]
            if k not in fw.passthrough_scope:       # a key may have an item per trainer: one key, several scopes
                fw.passthrough.append((k, compile_template(k) if is_template(k) else None))
            line = line_of(item)
            fw.passthrough_scope.setdefault(k, []).append(       # where detection counts it (default: everywhere)
                (trainers_of(item.get("trainers"), f, line, k, fw.trainers, errors),
                 release_index(fw.releases, item.get("since"), f, line, k, errors, 0),
                 release_index(fw.releases, item.get("until"), f, line, k, errors, OPEN)))


def _load_config(doc: LineDict, fw: FrameworkMapping, canonical: CanonicalSchema, f: str, name: str,
                 errors: list[MappingError]) -> None:
    """The file's ``config:`` entries: canonical config names, defaults and ``default_key`` links."""
    for c in doc.get("config") or []:
        line = line_of(c)
        if not isinstance(c, dict) or "key" not in c or not ({"canonical", "default", "default_key"} & set(c)):
            errors.append(MappingError("config entry needs key and canonical (its canonical config name), or key and "
                                       "default (the framework's default, for level counts and config switches; or "
                                       "default_key: another config key whose value it defaults to)",
                                       file=f, line=line, entry=name))
            continue
        if "default" in c and "default_key" in c:
            errors.append(MappingError("config entry: `default` or `default_key` (another key's value), not both",
                                       file=f, line=line, entry=f"config {c['key']}"))
        dkey = c.get("default_key")
        if dkey is not None and (not isinstance(dkey, str) or not dkey.strip() or dkey == c["key"]):
            errors.append(MappingError(f"config entry: default_key {dkey!r} must name another run config key",
                                       file=f, line=line, entry=f"config {c['key']}"))
            dkey = None
        if "canonical" in c and c["canonical"] not in canonical.config:
            errors.append(MappingError(f"unknown canonical config name {c['canonical']!r} (add it to the `config:` "
                                       "section of canonical.yaml)", file=f, line=line, entry=f"config {c['key']}"))
        ckey = str(c["key"])
        fw.config.append(ConfigEntry(key=ckey, canonical=str(c.get("canonical") or ""),
                                     default=c["default"] if "default" in c else NO_DEFAULT,
                                     default_key=str(dkey).strip() if dkey is not None else None,
                                     trainers=trainers_of(c.get("trainers"), f, line, ckey, fw.trainers, errors),
                                     since=release_index(fw.releases, c.get("since"), f, line, ckey, errors, 0),
                                     until=release_index(fw.releases, c.get("until"), f, line, ckey, errors, OPEN),
                                     scale=float(c.get("scale", 1.0)), source=str(c.get("source", "")),
                                     note=str(c.get("note", "")), file=f, line=line or 0))


def _check_defaults(fw: FrameworkMapping, stated: list[tuple[Reduce, int | None, str]], levels: list[LevelCount],
                    f: str, errors: list[MappingError]) -> None:
    """Every config key a switch or a count reads has a default (the switch's own, or a ``config:`` entry's): a run
    config that lacks the key is then read as the framework's default, and the translation says so."""
    def has_default(key: str) -> bool:
        return any(c.key == key and c.has_default for c in fw.config)

    for c in fw.config:
        if c.default_key is None or c.file != f:
            continue
        chain, key = [c.key], c.default_key
        while True:
            if key in chain:
                errors.append(MappingError(f"config {c.key!r}: default_key loops ({' -> '.join([*chain, key])})",
                                           file=f, line=c.line or None, entry=f"config {c.key}"))
                break
            nxt = [d for d in fw.config if d.key == key and d.has_default]
            if not nxt:
                errors.append(MappingError(f"config {c.key!r}: default_key {key!r} has no default of its own (add a "
                                           f"`config:` entry {{key: {key}, default: ...}})", file=f,
                                           line=c.line or None, entry=f"config {c.key}"))
                break
            step = next((d.default_key for d in nxt if d.default_key is not None), None)
            if step is None:
                break
            chain.append(key)
            key = step

    for red, line, where in stated:
        for sw in red.switches:
            if sw.default is NO_DEFAULT and not has_default(sw.key):
                errors.append(MappingError(f"config switch on {sw.key!r}: no default (give `default:` in the switch, "
                                           f"or a `config:` entry {{key: {sw.key}, default: ...}})", file=f,
                                           line=line, entry=where))
        for level, expr in red.counts:
            for key in (parse_count(expr).keys if expr is not None else ()):
                if not has_default(key):
                    errors.append(MappingError(f"counts.{level}: config key {key!r} has no default (add a `config:` "
                                               f"entry {{key: {key}, default: ...}}, or write the count null: "
                                               "unknown)", file=f, line=line, entry=where))
    for item in levels:
        for key in (parse_count(item.expr).keys if item.expr is not None else ()):
            if not has_default(key):
                errors.append(MappingError(f"config key {key!r} has no default (add a `config:` entry {{key: {key}, "
                                           "default: ...}, or write the count null: unknown)", file=f,
                                           line=item.line or None, entry=f"levels.{item.level}"))


def _load_levels(doc: LineDict, fw: FrameworkMapping, f: str, name: str, errors: list[MappingError]) -> None:
    """``levels:``: level -> a count expression (or null: unknown from the config), or a list of
    ``{count: EXPR|null, trainers, since, until}`` (the first that applies counts). A later file of the same
    framework (a user's) puts its items first."""
    raw = doc.get("levels")
    if raw is None:
        return
    if not isinstance(raw, dict):
        errors.append(MappingError(f"`levels` maps a level ({', '.join(LEVELS)}) to a count", file=f,
                                   line=line_of(doc, "levels"), entry=name))
        return
    for level, spec in raw.items():
        line = line_of(raw, level)
        where = f"levels.{level}"
        if level not in LEVELS:
            errors.append(MappingError(f"{level!r} is not a level ({', '.join(LEVELS)})", file=f, line=line,
                                       entry=where))
            continue
        items = spec if isinstance(spec, list) else [{"count": spec}]
        parsed: list[LevelCount] = []
        for item in items:
            iline = line_of(item, None, line)
            if not isinstance(item, dict) or "count" not in item:
                errors.append(MappingError("a levels item is {count: EXPRESSION or null, trainers, since, until}",
                                           file=f, line=iline, entry=where))
                continue
            expr = item["count"]
            if expr is not None:
                try:
                    parse_count(str(expr))
                except CountError as exc:
                    errors.append(MappingError(f"count {expr!r}: {exc}", file=f, line=iline, entry=where))
                    continue
            parsed.append(LevelCount(
                level=str(level), expr=None if expr is None else str(expr),
                trainers=trainers_of(item.get("trainers"), f, iline, where, fw.trainers, errors),
                since=release_index(fw.releases, item.get("since"), f, iline, where, errors, 0),
                until=release_index(fw.releases, item.get("until"), f, iline, where, errors, OPEN),
                file=f, line=iline or 0))
        fw.levels[str(level)] = parsed + fw.levels.get(str(level), [])


def _overlap(a: Entry, b: Entry) -> bool:
    if a.until < b.since or b.until < a.since:
        return False
    if a.trainers is not None and b.trainers is not None and not (a.trainers & b.trainers):
        return False
    return a.when == b.when


def check_framework(fw: FrameworkMapping, errors: list[MappingError]) -> None:
    for text, tpl in fw.passthrough:          # a key is either translated or declared without a canonical name
        if tpl is None:
            mapped_by = [e.key for e in fw.entries if (e.key_template.match(text) is not None if e.key_template
                                                      else e.key == text)]
            if mapped_by:
                errors.append(MappingError(f"passthrough key {text!r} is also mapped (entry {mapped_by[0]!r}): a key "
                                           "is either an entry or passed through", file=fw.file, entry=fw.name))
    for name, spec in fw.trainers.items():
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
    claimed: dict[str, list[str]] = {}
    for name, spec in fw.trainers.items():
        classes = spec.get("classes")
        for cls in classes if isinstance(classes, list) else ():
            claimed.setdefault(str(cls), []).append(name)
    for cls, names in claimed.items():
        kinds = [fw.trainers[n].get("callbacks", True) is not False for n in names]
        if len(names) > 1 and (len(names) > 2 or kinds[0] == kinds[1]):
            errors.append(MappingError(f"class {cls!r} is listed by trainers {names}: a class names one trainer (two "
                                       "only when exactly one of them has `callbacks: false`)",
                                       file=fw.file, line=line_of(fw.trainers.get(names[-1])), entry=names[-1]))
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
