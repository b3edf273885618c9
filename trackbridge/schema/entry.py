"""One entry of a framework mapping's ``entries:`` parsed and checked: its key and canonical target (placeholders,
templates), its stated reduction or hand-written fidelity, ``transform``, ``when`` and release range, compiled into
an :class:`~.model.Entry` (:func:`load_entry`; :mod:`.framework` reads the rest of the file)."""
from __future__ import annotations

import re
from typing import Any

from .model import _OPS as _WHEN_OPS
from .model import APPROXIMATE, COMPUTED, EXACT, OPEN, CanonicalSchema, Cond, Entry, FrameworkMapping
from .reductions import Reduce, parse_reduce
from .templates import TemplateError, compile_template, is_template, placeholder_names, strip_types
from .versions import normalize
from .yamlfile import MappingError, line_of

_PH_NAME = re.compile(r"\{[^}]*\}")
_DIFFERS = {"estimator", "reduction", "population", "snapshot", "sign", "unit", "config", "scale", "definition",
            "weighting", "version"}


def trainers_of(value: Any, f: str, line: int | None, entry: str, known: dict, errors: list) -> frozenset | None:
    if value is None:
        return None
    items = [value] if isinstance(value, str) else list(value)
    for t in items:
        if known and t not in known:
            errors.append(MappingError(f"unknown trainer {t!r} (declare it under `trainers:`)", file=f, line=line,
                                       entry=entry))
    return frozenset(items)


def release_index(fw_releases: list[str], value: Any, f: str, line: int | None, entry: str, errors: list[MappingError],
             default: float) -> float:
    if value is None:
        return default
    text = str(value)
    for i, r in enumerate(fw_releases):
        if normalize(r) == normalize(text):
            return i
    errors.append(MappingError(f"release {text!r} is not in the framework's `releases` list", file=f, line=line,
                               entry=entry))
    return default


def load_entry(raw: Any, fw: FrameworkMapping, canonical: CanonicalSchema, f: str, name: str,
                errors: list[MappingError], warnings: list[MappingError], require_reduction: bool,
                stated: list[tuple[Reduce, int | None, str]]) -> None:
    """One entry of ``entries:``, checked and added to ``fw.entries`` (its stated reduction to ``stated``);
    an entry with a problem is left out, the problem in ``errors``."""
    line = line_of(raw)
    if not isinstance(raw, dict):
        errors.append(MappingError("entry must be a mapping", file=f, line=line, entry=name))
        return
    found = _names_of(raw, canonical, f, line, errors)
    if found is None:
        return
    key, label, target, ktpl, ctpl = found
    reduce = _stated_reduce(raw, fw, f, line, label, errors)
    fidelity = COMPUTED if "reduce" in raw else raw.get("fidelity", EXACT)
    if fidelity not in (EXACT, APPROXIMATE, COMPUTED):
        errors.append(MappingError(f"fidelity {fidelity!r} must be exact or approximate", file=f, line=line,
                                   entry=label))
    reason = str(raw.get("reason") or "") if reduce is None else ""
    differs = (raw.get("differs") or []) if reduce is None else []
    differs = [differs] if isinstance(differs, str) else list(differs)
    for d in differs:
        if d not in _DIFFERS:
            errors.append(MappingError(f"differs: {d!r} is not one of {sorted(_DIFFERS)}", file=f, line=line,
                                       entry=label))
    if fidelity == APPROXIMATE and not reason:
        errors.append(MappingError("an approximate entry needs a `reason`", file=f, line=line, entry=label))
    if "reduce" not in raw:
        unstated = MappingError("reduction unstated: the entry's fidelity is hand-written (fidelity/differs/"
                                "reason); state how the value is reduced with `reduce:` (docs/reductions.md)",
                                file=f, line=line, entry=label)
        (errors if require_reduction else warnings).append(unstated)
    if not raw.get("source"):
        errors.append(MappingError("missing `source` (file@release it was read from)", file=f, line=line,
                                   entry=label))
    elif "@" not in str(raw["source"]):
        errors.append(MappingError(f"source {raw['source']!r} names no release: write path/in/repo.py@RELEASE",
                                   file=f, line=line, entry=label))
    scale, offset = _transform(raw.get("transform"), f, line, label, errors)
    reverse = bool(raw.get("reverse", True))
    if reverse and scale == 0.0:
        errors.append(MappingError("transform is not invertible (scale 0) but the entry is used for reverse "
                                   "translation (set reverse: false)", file=f, line=line, entry=label))
    when_items = _when_items(raw.get("when"), f, line, label, errors)
    since = release_index(fw.releases, raw.get("since"), f, line, label, errors, 0)
    until = release_index(fw.releases, raw.get("until"), f, line, label, errors, OPEN)
    if since > until:
        errors.append(MappingError(f"since {raw.get('since')} is after until {raw.get('until')}", file=f,
                                   line=line, entry=label))
    fw.entries.append(Entry(
        framework=name, key=key, canonical=target, since=since, until=until,
        trainers=trainers_of(raw.get("trainers"), f, line, label, fw.trainers, errors), fidelity=fidelity,
        differs=tuple(differs), reason=reason, scale=scale, offset=offset, when=when_items, reverse=reverse,
        source=str(raw.get("source", "")), note=str(raw.get("note", "")), override=raw.get("override") is True,
        renamed_from=tuple([raw["renamed_from"]] if isinstance(raw.get("renamed_from"), str)
                           else raw.get("renamed_from") or ()), key_template=ktpl,
        canonical_template=ctpl, file=f, line=line or 0, reduce=reduce))
    if reduce is not None:
        stated.append((reduce, line_of(raw, "reduce", line), label))




def _names_of(raw: dict, canonical: CanonicalSchema, f: str, line: int | None,
              errors: list[MappingError]) -> tuple[str, str, str, Any, Any] | None:
    """An entry's key and canonical target, checked against canonical.yaml and each other (placeholders),
    with their compiled templates: ``(key, label, target, key template, canonical template)``, or None."""
    key = raw.get("key")
    label = str(key)
    if not key or not isinstance(key, str):
        errors.append(MappingError("entry without a `key`", file=f, line=line))
        return None
    target = raw.get("canonical")
    if not target or not isinstance(target, str):
        errors.append(MappingError("missing `canonical`", file=f, line=line, entry=label))
        return None
    target = strip_types(target)
    cm = canonical.metrics.get(target)
    if cm is None:
        shape = _PH_NAME.sub("{}", target)
        alike = [n for n in canonical.metrics if "{" in n and _PH_NAME.sub("{}", n) == shape]
        hint = f" (did you mean {alike[0]!r}? placeholder names must match)" if alike else ""
        errors.append(MappingError(f"canonical target {target!r} does not exist in canonical.yaml{hint}", file=f,
                                   line=line, entry=label))
        return None
    ktpl = ctpl = None
    try:
        if is_template(key):
            ktpl = compile_template(key)
        ctpl = cm.template
    except TemplateError as exc:
        errors.append(MappingError(str(exc), file=f, line=line, entry=label))
        return None
    if placeholder_names(key) != placeholder_names(target):
        errors.append(MappingError(f"placeholders of the key {sorted(placeholder_names(key))} and of the canonical "
                                   f"target {sorted(placeholder_names(target))} differ", file=f, line=line,
                                   entry=label))
        return None
    return key, label, target, ktpl, ctpl


def _stated_reduce(raw: dict, fw: FrameworkMapping, f: str, line: int | None, label: str,
                   errors: list[MappingError]) -> Reduce | None:
    """An entry's ``reduce:``, parsed with the framework's profiles (None when it states none); the
    hand-written fidelity fields beside it are an error."""
    reduce = None
    if "reduce" in raw:
        reduce, problems = parse_reduce(raw["reduce"], fw.profiles)
        rline = line_of(raw, "reduce", line)
        for p in problems:
            errors.append(MappingError(p, file=f, line=rline, entry=label))
        legacy = [k for k in ("fidelity", "differs", "reason") if k in raw]
        if legacy:
            errors.append(MappingError(
                f"{', '.join(legacy)}: an entry that states `reduce:` has its fidelity computed from it; remove "
                f"{'these' if len(legacy) > 1 else 'it'} (a difference the fields cannot state is "
                "`reduce: {deviation: SENTENCE}`; anything else worth knowing is a `note`)",
                file=f, line=line_of(raw, legacy[0], line), entry=label))
    return reduce


def _transform(tr: Any, f: str, line: int | None, label: str, errors: list[MappingError]) -> tuple[float, float]:
    """An entry's ``transform`` as ``(scale, offset)`` (``negate`` folded into the scale); (1, 0) without one."""
    scale, offset = 1.0, 0.0
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
    return scale, offset


def _when_items(when: Any, f: str, line: int | None, label: str, errors: list[MappingError]) -> tuple:
    """An entry's ``when: {config: {KEY: VALUE or {OP: VALUE}}}`` as sorted ``(key, value or Cond)`` pairs."""
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
                            f"when: {k}: a comparison is one of {{ne|gt|ge|lt|le: VALUE}} or {{in: [VALUE, ...]}}, "
                            f"not {dict(v)!r}", file=f, line=line, entry=label))
                        continue
                    op, val = next(iter(v.items()))
                    if op == "in":
                        if not isinstance(val, list) or not val:
                            errors.append(MappingError(f"when: {k}: 'in' takes a list of values, not {val!r}",
                                                       file=f, line=line, entry=label))
                            continue
                        val = tuple(val)
                    v = Cond(str(op), val)
                items.append((str(k), v))
            when_items = tuple(sorted(items, key=lambda kv: kv[0]))
    return when_items
