"""Parse the canonical schema (``format: trackbridge.canonical/1``): metrics, config names, versions, and the facts
the rest of the package reads from it (``splits``, ``axes``, ``presets``, ``look_alike``).

The structure of each file (fields, types, allowed values) is checked by ``mappings/schemas/canonical.schema.json``
before this module runs; what is checked here is what a JSON Schema cannot say: names defined twice, templates that
do not compile, rename targets and preset names that are no canonical name, the version order, one default split.
Only the main canonical file (the shipped one) declares versions, splits, axes, presets and look-alike pairs; an
extension (``--mappings``) adds metrics and config names. A main file that leaves out ``splits`` and ``axes`` (a
test's small schema given to ``build_registry``) gets those of the shipped ``canonical.yaml`` (:mod:`.facts`).
"""
from __future__ import annotations

from typing import Any

from .model import (
    STEP_AXIS,
    Axis,
    CanonicalMetric,
    CanonicalSchema,
    LookAlike,
    Preset,
    Split,
    Splits,
)
from .reductions import FIELDS, parse_reduce
from .templates import TemplateError, compile_template, is_template, strip_types
from .versions import VersionError, version_key
from .yamlfile import MappingError, line_of

_ROLES = {"loss", "reward", "monitor"}
_KINDS = {"scalar", "histogram", "text"}
_BETTER = {"higher", "lower", "none"}
_GLOB = "*?["
_MAIN_ONLY = ("schema_version", "versions", "splits", "axes", "presets", "look_alike")


def parse_splits(doc: Any, f: str, errors: list[MappingError]) -> Splits | None:
    """canonical.yaml `splits:` (None when the document has none)."""
    raw = doc.get("splits") if isinstance(doc, dict) else None
    if not isinstance(raw, dict):
        return None
    out: list[Split] = []
    for name, spec in raw.items():
        spec = spec if isinstance(spec, dict) else {}
        default = bool(spec.get("default", False))
        prefix = spec.get("prefix")
        line = line_of(raw, name)
        if default and prefix:
            errors.append(MappingError("the default split has no canonical prefix", file=f, line=line,
                                       entry=f"splits.{name}"))
        if not default and not prefix:
            errors.append(MappingError("a split other than the default needs a `prefix`", file=f, line=line,
                                       entry=f"splits.{name}"))
        if prefix and prefix != f"{name}/":
            errors.append(MappingError(f"prefix {prefix!r}: a split's canonical prefix is its name and '/' "
                                       f"({name + '/'!r})", file=f, line=line, entry=f"splits.{name}"))
        out.append(Split(name=str(name), prefix=str(prefix) if prefix and not default else None,
                         spellings=tuple(str(s) for s in spec.get("spellings") or ()), default=default))
    if sum(s.default for s in out) != 1:
        errors.append(MappingError("exactly one split is the default (`default: true`)", file=f,
                                   line=line_of(doc, "splits"), entry="splits"))
    seen: dict[str, str] = {}
    for s in out:
        for sp in s.spellings:
            if sp in seen and seen[sp] != s.name:
                errors.append(MappingError(f"spelling {sp!r} is claimed by splits {seen[sp]!r} and {s.name!r}",
                                           file=f, line=line_of(raw, s.name), entry=f"splits.{s.name}"))
            seen[sp] = s.name
    return Splits(tuple(out))


def parse_axes(doc: Any) -> dict[str, Axis] | None:
    """canonical.yaml `axes:` (None when the document has none); names are checked by :func:`check_axes`."""
    raw = doc.get("axes") if isinstance(doc, dict) else None
    if not isinstance(raw, dict):
        return None
    out: dict[str, Axis] = {}
    for name, spec in raw.items():
        spec = spec if isinstance(spec, dict) else {}
        out[str(name)] = Axis(name=str(name), label=str(spec.get("label", name)),
                              metric=spec.get("metric"), per_step=spec.get("per_step"))
    return out


def check_axes(axes: dict[str, Axis], schema: CanonicalSchema, doc: Any, f: str, errors: list[MappingError]) -> None:
    raw = doc.get("axes") or {}             # (step and time are required: the JSON Schema says so)
    for a in axes.values():
        line = line_of(raw, a.name)
        for field_name in ("metric", "per_step"):
            name = getattr(a, field_name)
            if name is not None and schema.find(name) is None:
                errors.append(MappingError(f"{field_name} {name!r} is not a canonical name", file=f, line=line,
                                           entry=f"axes.{a.name}"))
        if a.name not in ("step", "time") and not a.metric:
            errors.append(MappingError("an axis other than step and time is read from a `metric`", file=f,
                                       line=line, entry=f"axes.{a.name}"))
    step = axes.get("step")
    if step is not None and step.metric != STEP_AXIS:
        errors.append(MappingError(f"the step axis's metric is {STEP_AXIS!r} (the name trackbridge gives the tracker "
                                   f"step: trackbridge.schema.model.STEP_AXIS), not {step.metric!r}", file=f,
                                   line=line_of(raw, "step"), entry="axes.step"))


def parse_presets(doc: Any) -> dict[str, Preset]:
    """canonical.yaml `presets:`, in order; names are checked by :func:`check_presets`."""
    raw = doc.get("presets") if isinstance(doc, dict) else None
    out: dict[str, Preset] = {}
    for name, spec in (raw.items() if isinstance(raw, dict) else ()):
        spec = spec if isinstance(spec, dict) else {}
        out[str(name)] = Preset(str(name), str(spec.get("description", "")),
                                tuple(str(m) for m in spec.get("metrics") or ()))
    return out


def check_presets(schema: CanonicalSchema, doc: Any, f: str, errors: list[MappingError]) -> None:
    raw = doc.get("presets") or {}
    for p in schema.presets.values():
        line = line_of(raw, p.name)
        if p.name != p.name.lower():
            errors.append(MappingError("preset names are lower case (compare matches them case-insensitively)",
                                       file=f, line=line, entry=f"presets.{p.name}"))
        for m in p.metrics:
            if not any(c in m for c in _GLOB) and schema.find(m) is None:
                errors.append(MappingError(f"{m!r} is not a canonical name (a pattern needs * ? or [)", file=f,
                                           line=line, entry=f"presets.{p.name}"))


def parse_look_alike(doc: Any) -> list[LookAlike]:
    """canonical.yaml `look_alike:` (pairs that are not two names are left to :func:`check_look_alike`)."""
    raw = doc.get("look_alike") if isinstance(doc, dict) else None
    out: list[LookAlike] = []
    for item in raw if isinstance(raw, list) else ():
        names = [str(n) for n in (item.get("names") or ())] if isinstance(item, dict) else []
        if len(names) == 2:
            out.append(LookAlike(names[0], names[1], str(item.get("why", ""))))
    return out


def check_look_alike(schema: CanonicalSchema, doc: Any, f: str, errors: list[MappingError]) -> None:
    raw = doc.get("look_alike") or []
    for item in raw if isinstance(raw, list) else ():
        names = [str(n) for n in (item.get("names") or ())] if isinstance(item, dict) else []
        line = line_of(item)
        if len(names) != 2 or names[0] == names[1]:
            errors.append(MappingError("`names` lists two different canonical names", file=f, line=line,
                                       entry="look_alike"))
            continue
        for n in names:
            if schema.find(n) is None:
                errors.append(MappingError(f"{n!r} is not a canonical name", file=f, line=line, entry="look_alike"))


def _parse_metric(raw_name: Any, spec: Any, mdoc: Any, f: str, errors: list[MappingError],
                  warnings: list[MappingError] | None = None) -> CanonicalMetric | None:
    line = line_of(mdoc, raw_name)
    name = strip_types(str(raw_name))
    if not isinstance(spec, dict):
        errors.append(MappingError("definition must be a mapping", file=f, line=line, entry=name))
        return None
    for req in ("description", "unit"):
        if not spec.get(req):
            errors.append(MappingError(f"missing {req!r}", file=f, line=line, entry=name))
    kind = spec.get("kind", "scalar")
    if kind not in _KINDS:
        errors.append(MappingError(f"kind {kind!r} is not one of {sorted(_KINDS)}", file=f, line=line, entry=name))
    better = spec.get("better", "none")
    if better not in _BETTER:
        errors.append(MappingError(f"better {better!r} is not one of {sorted(_BETTER)}", file=f, line=line,
                                   entry=name))
    role = spec.get("role")
    if role is not None and role not in _ROLES:
        errors.append(MappingError(f"role {role!r} is not one of {sorted(_ROLES)}", file=f, line=line, entry=name))
    tpl = None
    if is_template(name):
        try:
            tpl = compile_template(str(raw_name))
        except TemplateError as exc:
            errors.append(MappingError(str(exc), file=f, line=line, entry=name))
            return None
    reduce = None
    if spec.get("reduce") is not None:
        reduce, problems = parse_reduce(spec["reduce"], {}, literal_only=True)
        rline = line_of(spec, "reduce", line)
        for p in problems:
            errors.append(MappingError(p, file=f, line=rline, entry=name))
        est = spec.get("estimator")
        if reduce is not None and est and reduce.stated("estimator") and reduce.get("estimator") != est:
            errors.append(MappingError(f"reduce: estimator {reduce.get('estimator')!r} disagrees with the metric's "
                                       f"estimator {est!r}", file=f, line=rline, entry=name))
        if reduce is not None and est in FIELDS["estimator"] and not reduce.stated("estimator"):
            reduce = reduce.with_fields(estimator=str(est))     # the metric's estimator is part of its reference
    elif kind != "text" and warnings is not None:
        warnings.append(MappingError("reference reduction unstated: state the quantity the name means with `reduce:` "
                                     "(docs/reductions.md); framework entries are compared against it", file=f,
                                     line=line, entry=name))
    return CanonicalMetric(
        name=name, description=str(spec.get("description", "")), unit=str(spec.get("unit", "")),
        kind=kind, better=better, estimator=spec.get("estimator"), reduction=spec.get("reduction"),
        role=role, axis=bool(spec.get("axis", False)), template=tpl, file=f, line=line or 0, reduce=reduce)


def load_canonical(docs: list[tuple[str, Any]], errors: list[MappingError],
                   shipped: tuple[Splits | None, dict[str, Axis] | None] = (None, None),
                   warnings: list[MappingError] | None = None) -> CanonicalSchema | None:
    """The canonical schema from its documents: the first is the main file (versions, splits, axes, presets,
    look-alike pairs), the others extend it (metrics, config names). ``shipped``: the splits and axes of the shipped
    canonical.yaml, used when the main file declares none."""
    main_file, main = docs[0]
    metrics: dict[str, CanonicalMetric] = {}
    config: dict[str, dict[str, Any]] = {}
    renames: list[tuple[str, dict[str, str]]] = []
    version = str(main.get("schema_version", "0"))
    for f, doc in docs:
        if f != main_file:
            for only_main in _MAIN_ONLY:
                if only_main in doc:
                    errors.append(MappingError(f"`{only_main}` is declared by the main canonical file "
                                               f"({main_file}) only; an extension adds metrics and config names",
                                               file=f, line=line_of(doc, only_main)))
        cdoc = doc.get("config") or {}
        if isinstance(cdoc, dict):
            for name, spec in cdoc.items():
                if name in config:
                    errors.append(MappingError("canonical config name defined twice", file=f,
                                               line=line_of(cdoc, name), entry=name))
                config[name] = dict(spec or {})
        mdoc = doc.get("metrics") or {}
        if not isinstance(mdoc, dict):
            errors.append(MappingError("`metrics` must be a mapping of name -> definition", file=f,
                                       line=line_of(doc, "metrics")))
            continue
        for raw_name, spec in mdoc.items():
            name = strip_types(str(raw_name))
            if name in metrics:
                errors.append(MappingError("canonical name defined twice", file=f, line=line_of(mdoc, raw_name),
                                           entry=name))
                continue
            metric = _parse_metric(raw_name, spec, mdoc, f, errors, warnings)
            if metric is not None:
                metrics[name] = metric
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
    templates = sorted((m for m in metrics.values() if m.template),
                       key=lambda m: -m.template.literal_len if m.template else 0)
    schema = CanonicalSchema(version=version, metrics=metrics, templates=templates, config=config, renames=renames,
                             file=main_file)
    splits = parse_splits(main, main_file, errors)
    schema.splits = splits if splits is not None else (shipped[0] or Splits())
    axes = parse_axes(main)
    if axes is not None:
        check_axes(axes, schema, main, main_file, errors)
    schema.axes = axes if axes is not None else dict(shipped[1] or {})
    schema.presets = parse_presets(main)
    check_presets(schema, main, main_file, errors)
    schema.look_alike = parse_look_alike(main)
    check_look_alike(schema, main, main_file, errors)
    return schema


def compatibility_problems(released: CanonicalSchema, current: CanonicalSchema) -> list[str]:
    """Why ``current`` is not backward compatible with ``released`` (an earlier canonical schema), one sentence per
    name; ``[]`` when it is. Every metric name of ``released`` must still be a current name or be renamed, through a
    ``versions:`` entry newer than ``released.version`` (the loader checks that such an entry is the
    ``schema_version``), to a current name, so that readers upgrade an old stream; every config name must still
    exist (``versions:`` renames metrics only); and the version may not go back."""
    out: list[str] = []
    try:
        if version_key(current.version) < version_key(released.version):
            out.append(f"schema_version {current.version} is older than the released {released.version}")
    except VersionError as exc:
        return [str(exc)]
    renames = [r for v, r in current.renames if version_key(v) > version_key(released.version)]
    for name in released.metrics:
        if name in current.metrics:
            continue
        new = name
        for r in renames:
            new = r.get(new, new)
        if new == name:
            out.append(f"metric {name!r} of canonical@{released.version} was removed without a `versions:` rename "
                       f"(add it under `rename_metrics` of a version newer than {released.version})")
        elif current.find(new) is None:
            out.append(f"metric {name!r} of canonical@{released.version} is renamed to {new!r}, which is no "
                       "current canonical name")
    for name in released.config:
        if name not in current.config:
            out.append(f"config name {name!r} of canonical@{released.version} was removed (config names cannot be "
                       "renamed through `versions:`)")
    return out
