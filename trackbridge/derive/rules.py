"""Loading and validating derived-metric rules (``trackbridge.derived/1`` YAML files) into an ordered RuleSet.

A rules file::

    format: trackbridge.derived/1
    rules:
      - name: preference/reward/margin            # the canonical name the rule produces (templates allowed)
        formula: preference/reward/chosen - preference/reward/rejected
        description: DPO reward margin: mean of chosen minus rejected implicit reward (the mean is linear)
        citation: trl/trainer/dpo_trainer.py@v0.28.0
        requires: {sources: ["trl/*"], config_absent: [kl_target]}   # optional conditions
        forbid_approximate: [preference/reward/chosen]                # optional: inputs that must be exact
        only: {stage: [ref, values]}                                  # optional: allowed placeholder values
        note: ...                                                     # optional
        override: true                                                # user files only: replaces a shipped rule

Everything is checked when the file is loaded, and every error names the file, the line and the rule. The file is
read by the mapping files' loader (:mod:`trackbridge.schema.yamlfile`: line numbers, duplicate keys) and its
structure checked against ``mappings/schemas/derived.schema.json`` (unknown format or fields, wrong types, missing
fields); then this module checks the meaning: a formula that does not parse, an unknown metric or config name, an
unknown function, output placeholders that the inputs do not bind, malformed templates, and dependency cycles
between rules. Templated names use the one template engine of :mod:`trackbridge.schema.templates` (``{x}``,
``{x:path}``, ``{x:int}``), the shipped files come from the one :func:`~trackbridge.schema.paths.mappings_dir`
(``TRACKBRIDGE_MAPPINGS_DIR`` honoured), and :class:`RuleError` is a
:class:`~trackbridge.schema.yamlfile.MappingError`. The rules of all files are then put in dependency order once (a
rule runs after every rule that can produce one of its inputs); among rules with no order between them, rules from
user files come before the shipped ones and file order is kept, so for one output the first applicable rule wins.

A rule in a user file with the same name as a shipped rule must say ``override: true``; it then *replaces* every
shipped rule of that name (they are left out). Without it loading fails with an error naming both files and lines,
so that a shipped formula is never replaced by accident. ``override: true`` on a rule no shipped rule shares a name
with changes nothing. Formulas are bounded (:data:`~trackbridge.derive.expr.MAX_LENGTH` characters,
:data:`~trackbridge.derive.expr.MAX_DEPTH` levels of nesting); a formula past either bound is an error naming file,
line and rule.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from ..schema.jsonschema import SchemaError, json_path, load_schema, validate
from ..schema.paths import mappings_dir
from ..schema.templates import TemplateError, compile_template, fill, is_template, may_overlap, template_regex
from ..schema.yamlfile import LineDict, MappingError, line_of, load_yaml
from . import expr as E
from .names import CanonicalNames, current_names, shipped_canonical, shipped_document, shipped_upgrade

__all__ = ["FORMAT", "RuleError", "RuleErrors", "Rule", "RuleSet", "CanonicalNames", "load_rules", "parse_rules",
           "order_rules", "shipped_canonical", "shipped_upgrade", "mappings_dir", "fill", "is_template", "may_overlap",
           "template_regex"]

FORMAT = "trackbridge.derived/1"


class RuleError(MappingError):
    """A derived-rules file that is wrong: a :class:`MappingError` whose entry is the rule (``rule`` holds its
    name), so ``str()`` is ``file:line: rule 'NAME': message``."""

    def __init__(self, message: str, file: str | None = None, line: int | None = None, rule: str | None = None):
        self.rule = rule
        super().__init__(message, file=file, line=line, entry=f"rule {rule!r}" if rule else None)


class RuleErrors(RuleError):
    """Several problems in rule files (``errors``); file, line and rule are the first one's."""

    def __init__(self, errors: list[RuleError]):
        first = errors[0]
        super().__init__(first.message, first.file, first.line, first.rule)
        self.errors = errors
        self.args = ("\n".join(str(e) for e in errors),)


# ------------------------------------------------------------------------------------------------ rules
@dataclass
class Rule:
    """One derivation rule, parsed and checked."""

    name: str                         # output canonical name (may be a template)
    formula: str
    ast: E.Node
    inputs: list[str]                 # metric names read (templates allowed)
    config: list[str]                 # config names read
    stateful: list[E.Stateful]
    description: str
    citation: str
    sources: list[str] = field(default_factory=list)
    config_absent: list[str] = field(default_factory=list)
    forbid_approximate: list[str] = field(default_factory=list)
    only: dict[str, list[str]] = field(default_factory=dict)
    note: str = ""
    override: bool = False            # a user rule that replaces the shipped rule(s) of the same name
    file: str = ""
    line: int = 0
    key: str = ""                     # unique id: name@file:line (state and note keys)

    @property
    def templated(self) -> bool:
        return is_template(self.name) or any(is_template(i) for i in self.inputs)

    def where(self) -> str:
        return f"{self.file}:{self.line}"


@dataclass
class RuleSet:
    """Rules from one or more files, in dependency order (each rule after every rule that can feed it)."""

    rules: list[Rule]
    files: list[str]

    def __iter__(self) -> Iterator[Rule]:
        return iter(self.rules)

    def __len__(self) -> int:
        return len(self.rules)


# ------------------------------------------------------------------------------------------------ loading
_TEXT_FIELDS = ("name", "formula", "description", "citation")


def _rule_error(e: SchemaError, doc: Any) -> RuleError:
    """A schema error as the rule loader words it: inside a rule, the rule's name and the field's path in it."""
    path = e.path
    if len(path) < 2 or path[0] != "rules":
        return RuleError(e.message, e.file, e.line)
    item = doc["rules"][path[1]]
    name = item.get("name") if isinstance(item, dict) else None
    rel = path[2:]
    if e.keyword == "required" or (len(rel) == 1 and rel[0] in _TEXT_FIELDS and e.keyword in ("minLength", "pattern")):
        msg = f"missing or empty {e.detail if e.keyword == 'required' else rel[0]!r}"
    elif e.keyword == "additionalProperties":
        msg = f"unknown field {e.detail!r}{e.hint}" if len(rel) == 1 else f"unknown field {json_path(rel)}{e.hint}"
    elif rel == ("override",):
        msg = f"'override' must be true or false, not {item['override']!r}"
    elif not rel:
        msg = "a rule must be a mapping with name, formula, description and citation"
    else:
        msg = f"{json_path(rel)}: {e.message}"
    return RuleError(msg, e.file, e.line, name if isinstance(name, str) and name else None)


def _names(value: Any) -> list[str]:
    return [value] if isinstance(value, str) else list(value or [])


def _template_names(text: str, file: str, line: int | None, rule: str) -> list[str]:
    """Placeholder names of a templated name, in order (``[]`` for a plain name); a malformed one is an error."""
    if not is_template(text):
        return []
    try:
        return list(compile_template(text).names)
    except TemplateError as exc:
        raise RuleError(str(exc), file, line, rule) from None


def _parse_rule(raw: LineDict, file: str, canonical: CanonicalNames, config_names: set[str] | None,
                upgrade: Callable[[str], str] | None = None) -> Rule:
    """One rule of a file the schema accepted: the checks of meaning (formula, names, placeholders, conditions)."""
    line = raw.line
    name, formula = raw["name"], raw["formula"]
    nline, fline = raw.key_lines.get("name", line), raw.key_lines.get("formula", line)
    try:
        ast = E.parse(formula)
    except E.ExprError as exc:
        # report the line of the formula; for a block scalar the text starts on the next line
        raise RuleError(f"formula: {exc}", file, fline + ("formula" in raw.block_keys), name) from None
    name = current_names(canonical, upgrade, file, nline, name)(name)
    E.rename(ast, current_names(canonical, upgrade, file, fline, name))
    inputs, cfg = E.names_of(ast), E.config_of(ast)
    out_ph = set(_template_names(name, file, nline, name))
    if name not in canonical:
        raise RuleError(f"output {name!r} is not a canonical metric name (add it to canonical.yaml)", file, nline,
                        name)
    for n in inputs:
        _template_names(n, file, fline, name)
        if n not in canonical:
            raise RuleError(f"formula reads unknown canonical name {n!r}", file, fline, name)
    if config_names is not None:
        for c in cfg:
            if c not in config_names:
                raise RuleError(f"formula reads unknown config name {c!r} (canonical config names: "
                                f"{', '.join(sorted(config_names))})", file, fline, name)
    if name in inputs:
        raise RuleError(f"cycle: rule reads its own output {name!r}", file, line, name)
    in_ph: set[str] = set()
    templated_inputs = [i for i in inputs if is_template(i)]
    if templated_inputs:
        in_ph = set(_template_names(templated_inputs[0], file, fline, name))
        for t in templated_inputs[1:]:
            if not set(_template_names(t, file, fline, name)) <= in_ph:
                raise RuleError(f"templated input {t!r} uses placeholders not bound by {templated_inputs[0]!r} "
                                "(the first templated input binds them)", file, fline, name)
    if not out_ph <= in_ph:
        raise RuleError(f"output placeholders {sorted(out_ph - in_ph)} are not bound by any input", file, nline,
                        name)
    rule = Rule(name=name, formula=formula, ast=ast, inputs=inputs, config=cfg, stateful=E.stateful_of(ast),
                description=raw["description"].strip(), citation=raw["citation"].strip(), file=file, line=line)
    req = raw.get("requires") or {}
    rule.sources = _names(req.get("sources"))
    rule.config_absent = _names(req.get("config_absent"))
    for c in rule.config_absent:
        if config_names is not None and c not in config_names:
            raise RuleError(f"requires.config_absent names unknown config name {c!r}", file,
                            line_of(raw, "requires"), name)
    current = current_names(canonical, upgrade, file, line_of(raw, "forbid_approximate", line), name)
    rule.forbid_approximate = [current(n) for n in _names(raw.get("forbid_approximate"))]
    for n in rule.forbid_approximate:
        if n not in inputs:
            raise RuleError(f"forbid_approximate names {n!r}, which the formula does not read", file,
                            line_of(raw, "forbid_approximate"), name)
    for ph, allowed in (raw.get("only") or {}).items():
        if ph not in in_ph:
            raise RuleError(f"only: {ph!r} is not a placeholder of the inputs", file, line_of(raw, "only"), name)
        rule.only[ph] = _names(allowed)
    rule.note = str(raw.get("note") or "")
    rule.override = bool(raw.get("override", False))
    rule.key = f"{name}@{Path(file).name}:{line}"
    return rule


def read_rules_file(file: str) -> Any:
    """Load one rules file and check its structure against ``derived.schema.json``; returns the document.
    Raises :class:`RuleError` (or :class:`RuleErrors`, every schema problem of the file) naming file and line."""
    try:
        doc = load_yaml(file)
    except MappingError as exc:
        msg = exc.message
        for old, new in (("cannot read: ", "cannot read rules file: "), ("YAML syntax error: ", "not valid YAML: ")):
            msg = new + msg[len(old):] if msg.startswith(old) else msg
        raise RuleError(msg, exc.file or file, exc.line) from None
    if doc is None:
        raise RuleError(f"empty file (expected 'format: {FORMAT}' and 'rules:')", file, 1)
    if not isinstance(doc, dict):
        raise RuleError("top level must be a mapping with 'format' and 'rules'", file, 1)
    if "format" not in doc:
        raise RuleError(f"missing 'format: {FORMAT}'", file, 1)
    if doc["format"] != FORMAT:
        raise RuleError(f"unknown format {doc['format']!r} (expected {FORMAT!r})", file, line_of(doc, "format", 1))
    errors = [_rule_error(e, doc) for e in validate(doc, load_schema("derived"), file=file)]
    if errors:
        raise errors[0] if len(errors) == 1 else RuleErrors(errors)
    return doc


def parse_rules(file: str, canonical: CanonicalNames, config_names: set[str] | None,
                upgrade: Callable[[str], str] | None = None) -> list[Rule]:
    """Load and check one rules file. ``upgrade``: older canonical name -> current one (see ``load_rules``)."""
    doc = read_rules_file(file)
    return [_parse_rule(r, file, canonical, config_names, upgrade) for r in doc["rules"] or []]


def order_rules(rules: list[Rule]) -> list[Rule]:
    """Dependency order (stable); a cycle is a :class:`RuleError` naming every rule in it with file and line."""
    n = len(rules)
    deps: list[set[int]] = [set() for _ in range(n)]       # i depends on j
    for i, r in enumerate(rules):
        for j, p in enumerate(rules):
            if i != j and any(may_overlap(inp, p.name) for inp in r.inputs):
                deps[i].add(j)
    # cycle detection (iterative DFS, colours)
    colour = [0] * n
    stack_path: list[int] = []

    def dfs(start: int) -> None:
        it_stack = [(start, iter(sorted(deps[start])))]
        colour[start] = 1
        stack_path.append(start)
        while it_stack:
            node, it = it_stack[-1]
            nxt = next(it, None)
            if nxt is None:
                colour[node] = 2
                stack_path.pop()
                it_stack.pop()
                continue
            if colour[nxt] == 1:
                cyc = stack_path[stack_path.index(nxt):] + [nxt]
                chain = " -> ".join(f"{rules[k].name!r} ({rules[k].where()})" for k in reversed(cyc))
                first = rules[nxt]
                raise RuleError(f"dependency cycle between rules: {chain}", first.file, first.line, first.name)
            if colour[nxt] == 0:
                colour[nxt] = 1
                stack_path.append(nxt)
                it_stack.append((nxt, iter(sorted(deps[nxt]))))

    for i in range(n):
        if colour[i] == 0:
            dfs(i)
    # Kahn with lowest-index-first priority keeps the given order wherever dependencies allow
    indeg = [len(d) for d in deps]
    users: list[list[int]] = [[] for _ in range(n)]
    for i, d in enumerate(deps):
        for j in d:
            users[j].append(i)
    heap = [i for i in range(n) if indeg[i] == 0]
    heapq.heapify(heap)
    out: list[Rule] = []
    while heap:
        i = heapq.heappop(heap)
        out.append(rules[i])
        for u in users[i]:
            indeg[u] -= 1
            if indeg[u] == 0:
                heapq.heappush(heap, u)
    return out


def _apply_overrides(shipped: list[Rule], user: list[Rule]) -> list[Rule]:
    """The shipped rules without those a user rule overrides; a user rule that shares a shipped rule's name without
    ``override: true`` is a :class:`RuleError` naming both files."""
    by_name: dict[str, Rule] = {}
    for r in shipped:
        by_name.setdefault(r.name, r)
    replaced: set[str] = set()
    for r in user:
        first = by_name.get(r.name)
        if first is None:
            continue
        if not r.override:
            raise RuleError(f"a shipped rule already produces {r.name!r} ({first.where()}); a rule in your file "
                            f"replaces it only with 'override: true' (or give your rule another name)",
                            r.file, r.line, r.name)
        replaced.add(r.name)
    return [r for r in shipped if r.name not in replaced]


def load_rules(paths: list[str] | None = None, *, canonical: Iterable[str] | Callable[[str], bool] | None = None,
               config_names: Iterable[str] | None = None, shipped: bool = True,
               upgrade: Callable[[str], str] | None = None) -> RuleSet:
    """Load the shipped ``derived.yaml`` (unless ``shipped=False``) plus user rule files, check and order them.

    ``canonical``: the canonical metric names (a set, templates included) or a callable ``name -> bool``; default:
    the names of the shipped ``canonical.yaml``. ``config_names``: canonical config names (default: the shipped
    ``canonical.yaml``'s ``config:`` section). ``upgrade``: an older canonical name -> the current one (the
    ``versions:`` renames); a rule reading an older name reads the current one, with a :class:`FutureWarning`.
    Default: the shipped ``canonical.yaml``'s renames when ``canonical`` is defaulted too, else none.
    Raises :class:`RuleError` naming file, line and rule.
    """
    if canonical is None or config_names is None:
        doc = shipped_document()
        if upgrade is None and canonical is None:
            upgrade = shipped_upgrade(doc)
        metric_names, cfg_names = shipped_canonical(doc)
        if canonical is None:
            canonical = metric_names
        if config_names is None:
            config_names = cfg_names
    names = CanonicalNames(canonical)
    cfg = set(config_names)
    files: list[str] = []
    if shipped:
        files.append(str(mappings_dir() / "derived.yaml"))
    files.extend(str(p) for p in (paths or []))
    per_file = [parse_rules(f, names, cfg, upgrade) for f in files]
    if shipped and per_file:
        per_file[0] = _apply_overrides(per_file[0], [r for rules in per_file[1:] for r in rules])
    # user files first (later files first), the shipped file last: for one output, user rules are tried first
    flat = [r for rules in reversed(per_file) for r in rules]
    return RuleSet(order_rules(flat), files)
