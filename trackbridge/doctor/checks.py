"""Loading and validating diagnostic checks (``trackbridge.checks/1`` YAML files) into an ordered :class:`CheckSet`.

A checks file (the shipped ``mappings/checks.yaml``, or a file of one's own passed with ``mappings=[PATH]`` /
``--mappings PATH`` like any mapping or derived-rules file; the ``format`` line tells them apart)::

    format: trackbridge.checks/1
    sources:                                  # citations, by id
      trl-faq: {title: "TRL documentation: Training FAQ", url: "https://huggingface.co/docs/trl/how_to_train"}
    checks:
      - id: grad-norm-explosion               # lower-case words joined by '-'
        title: Gradient norm at 10x its usual value
        severity: critical                    # critical | warning | info
        reads: {grad: [optim/grad_norm]}      # role -> canonical names, the first one the run logs is read
        when: {spike: {of: grad, factor: 10, window: 20}}
        means: ...                            # what the symptom usually means
        check_first: ...                      # what to look at first
        then_check: ...                       # and next
        cites: [glossary]                     # ids of sources:, or {title, url | path} written out
        notes: [{if: {top_k: {gt: 0}}, say: "top_k={top_k} ...", severity: critical}]   # optional
        requires: {use_kl_loss: true}         # optional: the check runs only when the run config says so
        override: true                        # user files only: replaces the shipped check with this id

The file is read by the mapping files' loader (:mod:`trackbridge.schema.yamlfile`: line numbers, duplicate keys),
its structure checked against ``mappings/schemas/checks.schema.json``, then this module checks the meaning: every
name read is a canonical metric name of the registry (a template, and an ``eval/`` or ``test/`` prefix, allowed;
an older canonical name is read as today's, with a warning), every config name is a canonical config name, each
condition has exactly one kind and reads a declared role, ``no_gain`` reads metrics whose ``better:`` is higher or
lower, citations resolve. Every error is a :class:`~trackbridge.schema.yamlfile.MappingError` naming the file, the
line and the check (``checks.yaml:12: check 'x': ...``).

The override rule is the one of the derived rules and user mapping entries: a user check whose ``id`` is a
shipped check's must say ``override: true`` and then replaces it (in its place in the order); without it loading
fails naming both files and lines. ``override`` in a shipped file is an error.

(Over 400 lines: the format's loader and all its checks of meaning in one place, as :mod:`trackbridge.derive.rules`
for the derived rules.)
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

from ..schema.jsonschema import SchemaError, json_path, load_schema, validate
from ..schema.model import Cond
from ..schema.paths import mappings_dir
from ..schema.templates import is_template, sample
from ..schema.yamlfile import LineDict, MappingError, line_of, load_yaml
from .conditions import COMPOSITES, PRIMITIVES, Spec

if TYPE_CHECKING:       # pragma: no cover
    from ..schema.loader import Registry
    from ..schema.model import CanonicalSchema

__all__ = ["FORMAT", "SEVERITIES", "Check", "CheckSet", "CheckError", "Citation", "load_checks", "checks_for",
           "lint_checks"]

FORMAT = "trackbridge.checks/1"
SEVERITIES = ("critical", "warning", "info")      # most severe first


class CheckError(MappingError):
    """A checks file that is wrong: ``file:line: check 'ID': message``."""

    def __init__(self, message: str, file: str | None = None, line: int | None = None, check: str | None = None):
        self.check = check
        super().__init__(message, file=file, line=line, entry=f"check {check!r}" if check else None)


@dataclass(frozen=True)
class Citation:
    title: str
    url: str = ""
    path: str = ""
    note: str = ""

    def __str__(self) -> str:
        where = ", ".join(x for x in (self.url, self.path) if x)
        return f"{self.title} ({where})" if where else self.title

    def to_json(self) -> dict[str, str]:
        return {k: v for k, v in (("title", self.title), ("url", self.url), ("path", self.path),
                                  ("note", self.note)) if v}


@dataclass(frozen=True)
class ConfigNote:
    when: tuple[tuple[str, Any], ...]      # (canonical config name, value or Cond)
    say: str
    severity: str | None = None


@dataclass
class Check:
    """One check, parsed and checked."""

    id: str
    title: str
    severity: str
    reads: dict[str, tuple[str, ...]]       # role -> canonical names, in preference order
    when: Spec                              # the condition tree
    means: str
    check_first: str
    then_check: str
    cites: list[Citation]
    requires: tuple[tuple[str, Any], ...] = ()
    notes: list[ConfigNote] = field(default_factory=list)
    better: dict[str, dict[str, str]] = field(default_factory=dict)   # role -> name -> higher|lower|none
    override: bool = False
    file: str = ""
    line: int = 0
    explains: tuple[str, ...] = ()          # check ids this one's finding is the cause of, when they share steps
    explains_within: int = 20               # ... within this many steps of each other

    def where(self) -> str:
        return f"{self.file}:{self.line}"

    def config_names(self) -> set[str]:
        """The canonical config names the check reads (bounds, notes, requires)."""
        out = {k for k, _ in self.requires}
        for n in self.notes:
            out.update(k for k, _ in n.when)
        out.update(self.when.config_names())
        return out


@dataclass
class CheckSet:
    """Checks from one or more files, in the order findings of one severity are shown in."""

    checks: list[Check]
    files: list[str]

    def __iter__(self) -> Any:
        return iter(self.checks)

    def __len__(self) -> int:
        return len(self.checks)

    def get(self, check_id: str) -> Check | None:
        return next((c for c in self.checks if c.id == check_id), None)

    def only(self, ids: Iterable[str]) -> "CheckSet":
        """The checks named (unknown ids are a :class:`CheckError`)."""
        want = list(ids)
        unknown = [i for i in want if self.get(i) is None]
        if unknown:
            raise CheckError(f"unknown check id(s): {', '.join(unknown)} (known: "
                             f"{', '.join(c.id for c in self.checks)})")
        return CheckSet([c for c in self.checks if c.id in want], self.files)


# ---------------------------------------------------------------------------------------------------- parsing
def _schema_error(e: SchemaError, doc: Any) -> CheckError:
    path = e.path
    check = None
    if len(path) >= 2 and path[0] == "checks" and isinstance(doc.get("checks"), list):
        item = doc["checks"][path[1]]
        check = item.get("id") if isinstance(item, dict) and isinstance(item.get("id"), str) else None
        rel = path[2:]
        if e.keyword == "additionalProperties":
            msg = (f"unknown field {e.detail!r}{e.hint}" if len(rel) <= 1 else
                   f"{json_path(rel[:-1])}: unknown field {e.detail!r}{e.hint}")
        elif e.keyword == "required":
            msg = (f"missing field {e.detail!r}" if not rel else f"{json_path(rel)}: missing field {e.detail!r}")
        elif rel == ("id",) and e.keyword == "pattern":
            msg = f"id: {item.get('id')!r} must be lower-case words joined by '-' (like 'kl-spike')"
        elif not rel:
            msg = "a check must be a mapping with id, title, severity, reads, when, means, check_first and cites"
        else:
            msg = f"{json_path(rel)}: {e.message}"
        return CheckError(msg, e.file, e.line, check)
    return CheckError(e.message if not e.entry else f"{e.entry}: {e.message}", e.file, e.line)


def read_checks_file(file: str) -> Any:
    """Load one checks file and check its structure against ``checks.schema.json``; returns the document. Raises
    :class:`CheckError` (or :class:`~trackbridge.schema.yamlfile.MappingErrors` of them) naming file and line."""
    from ..schema.yamlfile import MappingErrors
    doc = load_yaml(file)
    if doc is None:
        raise CheckError(f"empty file (expected 'format: {FORMAT}' and 'checks:')", file, 1)
    if not isinstance(doc, dict):
        raise CheckError("top level must be a mapping with 'format' and 'checks'", file, 1)
    if doc.get("format") != FORMAT:
        raise CheckError(f"unknown format {doc.get('format')!r} (expected {FORMAT!r})", file,
                         line_of(doc, "format", 1))
    errors = [_schema_error(e, doc) for e in validate(doc, load_schema("checks"), file=file)]
    if errors:
        raise errors[0] if len(errors) == 1 else MappingErrors(list(errors))
    return doc


class _Ctx:
    """What parsing one check needs: the file, the check, the canonical schema, the citations known."""

    def __init__(self, file: str, check: str, canon: CanonicalSchema, sources: dict[str, Citation]) -> None:
        self.file, self.check, self.canon, self.sources = file, check, canon, sources

    def error(self, message: str, line: int | None) -> CheckError:
        return CheckError(message, self.file, line, self.check)


def _config_test(raw: Any, ctx: _Ctx, line: int | None, what: str) -> tuple[tuple[str, Any], ...]:
    items = []
    for k, v in raw.items():
        if k not in ctx.canon.config:
            raise ctx.error(f"{what}: {k!r} is not a canonical config name (canonical.yaml config:)", line)
        if isinstance(v, dict):
            (op, val), = v.items()
            if op == "in":
                val = tuple(val)
            v = Cond(str(op), val)
        items.append((str(k), v))
    return tuple(items)


def _name(name: str, ctx: _Ctx, line: int | None, role: str) -> tuple[str, str]:
    """A name of ``reads`` as the run's records spell it (older canonical names upgraded), and its ``better``."""
    split, base = ctx.canon.splits.split_canonical(name)
    meta = ctx.canon.find(sample(base) if is_template(base) else base)
    if meta is None:
        new = ctx.canon.upgrade(base)
        if new != base and ctx.canon.find(new) is not None:
            warnings.warn_explicit(f"check {ctx.check!r}: {base!r} is an older canonical name of {new!r} "
                                   f"(canonical.yaml versions:); read as {new!r}, rename it in the file",
                                   FutureWarning, filename=ctx.file, lineno=line or 0)
            name, meta = name[:len(name) - len(base)] + new, ctx.canon.find(new)
        else:
            raise ctx.error(f"reads: {role}: {name!r} is not a canonical metric name (add it to canonical.yaml, "
                            f"or use `trackbridge mappings show NAME` to find it)", line)
    assert meta is not None
    if meta.kind != "scalar":
        raise ctx.error(f"reads: {role}: {name!r} is a {meta.kind}, not a scalar series", line)
    return name, str(getattr(meta, "better", "none") or "none")


def _citations(raw: list[Any], ctx: _Ctx, line: int | None) -> list[Citation]:
    out = []
    for item in raw:
        if isinstance(item, str):
            cit = ctx.sources.get(item)
            if cit is None:
                raise ctx.error(f"cites: unknown source {item!r} (known: {', '.join(sorted(ctx.sources)) or 'none'};"
                                f" declare it under `sources:` or write the citation out)", line)
            out.append(cit)
        else:
            cit = _citation(item)
            if not (cit.url or cit.path):
                raise ctx.error(f"cites: {cit.title!r} needs a url or a path (where it can be read)", line)
            out.append(cit)
    return out


def _citation(raw: dict[str, Any]) -> Citation:
    return Citation(title=str(raw["title"]).strip(), url=str(raw.get("url") or ""), path=str(raw.get("path") or ""),
                    note=str(raw.get("note") or ""))


def _parse_check(raw: LineDict, file: str, canon: CanonicalSchema, sources: dict[str, Citation]) -> Check:
    ctx = _Ctx(file, raw["id"], canon, sources)
    line = raw.line
    reads: dict[str, tuple[str, ...]] = {}
    better: dict[str, dict[str, str]] = {}
    rline = line_of(raw, "reads", line)
    for role, names in raw["reads"].items():
        got = [_name(n, ctx, line_of(raw["reads"], role, rline), role) for n in names]
        reads[role] = tuple(n for n, _ in got)
        better[role] = {n: b for n, b in got}
    when = _condition(raw["when"], ctx, line_of(raw, "when", line), reads, better, top=True)
    unused = sorted(set(reads) - when.roles())
    if unused:
        raise ctx.error(f"reads: role(s) {', '.join(unused)} declared but read by no condition", rline)
    notes = []
    for n in raw.get("notes") or []:
        nline = line_of(n, "if", line)
        notes.append(ConfigNote(_config_test(n["if"], ctx, nline, "notes"), str(n["say"]).strip(),
                                n.get("severity")))
    requires = _config_test(raw["requires"], ctx, line_of(raw, "requires", line), "requires") \
        if raw.get("requires") else ()
    ex = raw.get("explains") or {}
    explains = tuple(str(x) for x in ex.get("checks") or ())
    if raw["id"] in explains:
        raise ctx.error("explains: a check does not explain itself", line_of(raw, "explains", line))
    return Check(id=raw["id"], title=str(raw["title"]).strip(), severity=raw["severity"], reads=reads, when=when,
                 explains=explains, explains_within=int(ex.get("within", 20)),
                 means=str(raw["means"]).strip(), check_first=str(raw["check_first"]).strip(),
                 then_check=str(raw.get("then_check") or "").strip(),
                 cites=_citations(raw["cites"], ctx, line_of(raw, "cites", line)), requires=requires, notes=notes,
                 better=better, override=bool(raw.get("override", False)), file=file, line=line)


def _condition(raw: LineDict, ctx: _Ctx, line: int | None, reads: dict[str, tuple[str, ...]],
               better: dict[str, dict[str, str]], top: bool = False) -> Spec:
    line = line_of(raw, None, line)
    kinds = [k for k in raw if k != "within"]
    if len(kinds) != 1:
        raise ctx.error(f"a condition has exactly one kind ({', '.join([*PRIMITIVES, *COMPOSITES])}), not "
                        f"{', '.join(kinds) or 'none'}", line)
    kind = kinds[0]
    body = raw[kind]
    kline = line_of(raw, kind, line)
    if kind in COMPOSITES:
        if "within" in raw and kind == "any":
            raise ctx.error("any: takes no `within` (each condition is judged at its latest point)", kline)
        if kind == "then" and "within" not in raw:
            raise ctx.error("then: needs `within` (the steps the second condition may follow the first by)", kline)
        parts = [_condition(p, ctx, kline, reads, better) for p in body]
        return Spec(kind, {"within": raw.get("within")}, parts=parts, line=kline or 0)
    if "within" in raw:
        raise ctx.error(f"{kind}: `within` belongs to all/then", kline)
    params = dict(body)
    for key in ("of", "to") if kind == "ratio" else ("of",):
        if params[key] not in reads:
            raise ctx.error(f"{kind}: {key}: {params[key]!r} is not a role of `reads` ({', '.join(reads)})", kline)
    if kind in ("above", "below"):
        if ("value" in params) == ("config" in params):
            raise ctx.error(f"{kind}: give exactly one of `value` and `config`", kline)
        if "config" in params and params["config"] not in ctx.canon.config:
            raise ctx.error(f"{kind}: config: {params['config']!r} is not a canonical config name", kline)
        if "times" in params and "config" not in params:
            raise ctx.error(f"{kind}: `times` goes with `config`", kline)
    if kind == "spike" and "factor" not in params and "mads" not in params:
        raise ctx.error("spike: give `factor` (times the baseline), `mads` (robust deviations) or both", kline)
    if kind == "spike" and "baseline" in params and "factor" not in params:
        raise ctx.error("spike: `baseline` is the baseline of `factor`", kline)
    if kind == "spike" and "over_usual" in params and params.get("baseline") == "max":
        raise ctx.error("spike: `over_usual` compares with the window's usual points; with `baseline: max` use "
                        "`factor`", kline)
    if kind == "collapse" and "within" in params and params.get("reference") != "peak":
        raise ctx.error("collapse: `within` is the span of `reference: peak`", kline)
    if kind == "drop" and params.get("after_rise") and "noise" not in params:
        raise ctx.error("drop: `after_rise` is measured in the series' noise: give `noise` (standard errors)", kline)
    if kind == "ratio" and ("above" in params) == ("below" in params):
        raise ctx.error("ratio: give exactly one of `above` and `below`", kline)
    if kind in ("no_gain", "flat"):
        role = params["of"]
        flat = [n for n, b in better[role].items() if b not in ("higher", "lower")]
        if flat:
            raise ctx.error(f"{kind}: {', '.join(flat)} has no direction (canonical.yaml better: higher or "
                            f"lower), so a gain cannot be told", kline)
    return Spec(kind, params, line=kline or 0)


def parse_checks(file: str, canon: CanonicalSchema, shipped_sources: dict[str, Citation] | None = None,
                 ) -> tuple[list[Check], dict[str, Citation]]:
    """Load and check one checks file: its checks and its ``sources:`` (which later files may cite too)."""
    doc = read_checks_file(file)
    sources = dict(shipped_sources or {})
    for sid, raw in (doc.get("sources") or {}).items():
        sources[sid] = _citation(raw)
    out: list[Check] = []
    seen: dict[str, int] = {}
    for raw in doc.get("checks") or []:
        chk = _parse_check(raw, file, canon, sources)
        if chk.id in seen:
            raise CheckError(f"id used twice in one file (first at line {seen[chk.id]})", file, chk.line, chk.id)
        seen[chk.id] = chk.line
        out.append(chk)
    return out, sources


def _merge(shipped: list[Check], user: list[Check]) -> list[Check]:
    """The shipped checks with the user's overrides in their place, then the user's new checks (file order)."""
    for c in shipped:
        if c.override:
            raise CheckError("`override` is for user files (a shipped file settles its own ids)", c.file, c.line,
                             c.id)
    by_id = {c.id: c for c in shipped}
    replaced: dict[str, Check] = {}
    new: list[Check] = []
    for c in user:
        first = by_id.get(c.id)
        if first is None:
            if any(n.id == c.id for n in new):
                other = next(n for n in new if n.id == c.id)
                raise CheckError(f"id {c.id!r} is also used by {other.where()}", c.file, c.line, c.id)
            new.append(c)
            continue
        if not c.override:
            raise CheckError(f"a shipped check already has this id ({first.where()}); a check in your file replaces "
                             f"it only with 'override: true' (or give yours another id)", c.file, c.line, c.id)
        replaced[c.id] = c
    return [replaced.get(c.id, c) for c in shipped] + new


def load_checks(registry: Registry | None = None, paths: Iterable[str] | None = None, *,
                shipped: bool = True) -> CheckSet:
    """The shipped ``checks.yaml`` (unless ``shipped=False``) plus user check files, checked against ``registry``'s
    canonical names (default: the shipped registry). Raises :class:`CheckError` naming file, line and check."""
    if registry is None:
        from ..schema.loader import load_registry
        registry = load_registry()
    canon = registry.canonical
    files: list[str] = []
    if shipped:
        files.append(str(mappings_dir() / "checks.yaml"))
    files.extend(str(p) for p in (paths or []))
    sources: dict[str, Citation] = {}
    per_file: list[list[Check]] = []
    for f in files:
        checks, sources = parse_checks(f, canon, sources)
        per_file.append(checks)
    if shipped and per_file:
        ordered = _merge(per_file[0], [c for cs in per_file[1:] for c in cs])
    else:
        ordered = _merge([], [c for cs in per_file for c in cs])
    known = {c.id for c in ordered}
    for c in ordered:
        unknown = [x for x in c.explains if x not in known]
        if unknown:
            raise CheckError(f"explains: unknown check id(s) {', '.join(unknown)} (a check this one is the cause "
                             f"of must be loaded too)", c.file, c.line, c.id)
    return CheckSet(ordered, files)


_CACHE: dict[tuple[int, tuple[str, ...]], CheckSet] = {}


def checks_for(registry: Registry, extra_paths: Iterable[str] | None = None) -> CheckSet:
    """The shipped checks plus the check files among the registry's files: the user files it was loaded with
    (``load_registry(mappings)``, ``--mappings``) are classified by their ``format`` line, so mapping and
    derived-rule files among them are not check files. ``extra_paths``: the same user files (accepted for symmetry
    with :func:`~trackbridge.derive.rules_for`; only those the registry classified as checks are read). Loaded once
    per registry and set of files."""
    known = {str(Path(p).resolve()) for p in getattr(registry, "check_files", [])}
    files = known | {q for q in (str(Path(p).resolve()) for p in (extra_paths or [])) if q in known}
    shipped = str((mappings_dir() / "checks.yaml").resolve())
    extra = tuple(sorted(p for p in files if p != shipped))
    key = (id(registry), extra)
    found = _CACHE.get(key)
    if found is None:
        found = _CACHE[key] = load_checks(registry, list(extra))
    return found


def lint_checks(registry: Registry, paths: Iterable[str]) -> int:
    """Check the shipped checks and those among ``paths`` (files of another format are left to the other linters);
    returns the number of checks. Raises :class:`CheckError` for the first problem."""
    mine = []
    for p in paths:
        try:
            doc = load_yaml(p)
        except MappingError:
            continue                    # reported by the mapping files' lint
        if isinstance(doc, dict) and doc.get("format") == FORMAT:
            mine.append(str(p))
    return len(load_checks(registry, mine))
