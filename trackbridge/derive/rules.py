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

Everything is checked when the file is loaded, and every error names the file, the line and the rule:
unknown format or fields, a formula that does not parse, an unknown metric or config name, an unknown function,
output placeholders that the inputs do not bind, and dependency cycles between rules. The rules of all files are then
put in dependency order once (a rule runs after every rule that can produce one of its inputs); among rules with no
order between them, rules from user files come before the shipped ones and file order is kept, so for one output
the first applicable rule wins.

A rule in a user file with the same name as a shipped rule must say ``override: true``; it then *replaces* every
shipped rule of that name (they are left out). Without it loading fails with an error naming both files and lines,
so that a shipped formula is never replaced by accident. ``override: true`` on a rule no shipped rule shares a name
with changes nothing. Formulas are bounded (:data:`~trackbridge.derive.expr.MAX_LENGTH` characters,
:data:`~trackbridge.derive.expr.MAX_DEPTH` levels of nesting); a formula past either bound is an error naming file,
line and rule.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import yaml

from ..errors import TrackBridgeError
from . import expr as E

FORMAT = "trackbridge.derived/1"
_RULE_FIELDS = {"name", "formula", "description", "citation", "requires", "forbid_approximate", "only", "note",
                "override"}
_REQUIRES_FIELDS = {"sources", "config_absent"}
_PH = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)(:path)?\}")


class RuleError(TrackBridgeError, ValueError):
    """A derived-rules file that is wrong. Names the file, line and rule (MappingError-like: same attributes)."""

    def __init__(self, message: str, file: str | None = None, line: int | None = None, rule: str | None = None):
        self.message, self.file, self.line, self.rule = message, file, line, rule
        where = f"{file or '<rules>'}"
        if line is not None:
            where += f":{line}"
        if rule:
            where += f": rule {rule!r}"
        super().__init__(f"{where}: {message}")


# ------------------------------------------------------------------------------------------------ templates
def placeholders(template: str) -> list[str]:
    """Placeholder names of a templated canonical name, in order (``time/{stage}`` -> ``["stage"]``)."""
    return [m.group(1) for m in _PH.finditer(template)]


def is_template(name: str) -> bool:
    return "{" in name


def template_regex(template: str) -> re.Pattern[str]:
    """Regex matching concrete names of a template; ``{x}`` is one path segment, ``{x:path}`` one or more."""
    out, pos, seen = [], 0, set()
    for m in _PH.finditer(template):
        out.append(re.escape(template[pos:m.start()]))
        ph = m.group(1)
        if ph in seen:
            out.append(f"(?P={ph})")
        else:
            out.append(f"(?P<{ph}>.+)" if m.group(2) else f"(?P<{ph}>[^/]+)")
            seen.add(ph)
        pos = m.end()
    out.append(re.escape(template[pos:]))
    return re.compile("".join(out) + r"\Z")


def fill(template: str, binding: dict[str, str]) -> str:
    """Instantiate a template with placeholder values."""
    if not binding:
        return template
    return _PH.sub(lambda m: binding[m.group(1)], template)


def _shape(template: str) -> str:
    return _PH.sub(lambda m: "{:path}" if m.group(2) else "{}", template)


def _sample(template: str) -> str:
    return _PH.sub(lambda m: "x0q" if not m.group(2) else "x0q/x1q", template)


def may_overlap(a: str, b: str) -> bool:
    """Whether two (possibly templated) names can denote the same concrete name (conservative)."""
    if a == b:
        return True
    if not is_template(a) and not is_template(b):
        return False
    if _shape(a) == _shape(b):
        return True
    ra, rb = template_regex(a), template_regex(b)
    return bool(ra.match(_sample(b)) or rb.match(_sample(a)) or ra.match(b) or rb.match(a))


# ------------------------------------------------------------------------------------------------ canonical names
class CanonicalNames:
    """Membership test for canonical metric names: exact names, and concrete names or templates of templated ones."""

    def __init__(self, names: Iterable[str] | Callable[[str], bool]):
        self._fn: Callable[[str], bool] | None = None
        if callable(names) and not isinstance(names, (set, frozenset, list, tuple, dict)):
            self._fn = names
            return
        names = list(names)
        self.exact = {n for n in names if not is_template(n)}
        self.shapes = {_shape(n) for n in names if is_template(n)}
        self.regexes = [template_regex(n) for n in names if is_template(n)]

    def __contains__(self, name: str) -> bool:
        if self._fn is not None:
            return bool(self._fn(name))
        if not is_template(name):
            return name in self.exact or any(r.match(name) for r in self.regexes)
        return _shape(name) in self.shapes


def mappings_dir() -> Path:
    """Directory of the shipped mapping files (``mappings/`` in a checkout, ``trackbridge/mappings`` in a wheel)."""
    here = Path(__file__).resolve().parent.parent
    for cand in (here / "mappings", here.parent / "mappings"):
        if (cand / "canonical.yaml").is_file():
            return cand
    return here.parent / "mappings"


def shipped_canonical() -> tuple[set[str], set[str]]:
    """(metric names, config names) of the shipped ``canonical.yaml``, read directly with a safe loader."""
    path = mappings_dir() / "canonical.yaml"
    with open(path, encoding="utf-8") as fh:
        data = yaml.safe_load(fh) or {}
    return set((data.get("metrics") or {}).keys()), set((data.get("config") or {}).keys())


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

    def __iter__(self):
        return iter(self.rules)

    def __len__(self) -> int:
        return len(self.rules)

    def outputs(self) -> list[str]:
        return list(dict.fromkeys(r.name for r in self.rules))


# ------------------------------------------------------------------------------------------------ YAML with lines
def _compose(text: str, file: str) -> yaml.Node | None:
    try:
        return yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise RuleError(f"not valid YAML: {getattr(exc, 'problem', exc)}", file,
                        mark.line + 1 if mark else None) from None


def _py(node: yaml.Node, file: str) -> Any:
    """Plain Python value of a YAML node; duplicate keys are an error naming their line."""
    if isinstance(node, yaml.MappingNode):
        out: dict[Any, Any] = {}
        for k, v in node.value:
            key = _py(k, file)
            if key in out:
                raise RuleError(f"duplicate key {key!r}", file, k.start_mark.line + 1)
            out[key] = _py(v, file)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_py(v, file) for v in node.value]
    return _scalar(node)


def _scalar(node: yaml.ScalarNode) -> Any:
    """Resolve a scalar node the way the safe loader would (int, float, bool, null, str)."""
    loader = yaml.SafeLoader("")
    try:
        return loader.construct_object(node, deep=True)
    finally:
        loader.dispose()


def _items(node: yaml.MappingNode) -> list[tuple[str, yaml.Node, int]]:
    return [(str(_scalar(k)) if isinstance(k, yaml.ScalarNode) else "?", v, k.start_mark.line + 1)
            for k, v in node.value]


# ------------------------------------------------------------------------------------------------ loading
def _str_list(value: Any, what: str, file: str, line: int, rule: str) -> list[str]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise RuleError(f"{what} must be a list of strings", file, line, rule)
    return list(value)


def _parse_rule(node: yaml.Node, file: str, canonical: CanonicalNames, config_names: set[str] | None) -> Rule:
    line = node.start_mark.line + 1
    if not isinstance(node, yaml.MappingNode):
        raise RuleError("a rule must be a mapping with name, formula, description and citation", file, line)
    items = _items(node)
    raw = {k: (_py(v, file), ln, v) for k, v, ln in items}
    seen: set[str] = set()
    for k, _, ln in items:
        if k in seen:
            raise RuleError(f"duplicate key {k!r}", file, ln)
        seen.add(k)
    name = raw.get("name", (None,))[0]
    if not isinstance(name, str) or not name:
        raise RuleError("rule has no 'name' (the canonical name it produces)", file, line)
    for k, (_, ln, _) in raw.items():
        if k not in _RULE_FIELDS:
            raise RuleError(f"unknown field {k!r} (known: {', '.join(sorted(_RULE_FIELDS))})", file, ln, name)
    for req in ("formula", "description", "citation"):
        if req not in raw or not isinstance(raw[req][0], str) or not raw[req][0].strip():
            raise RuleError(f"missing or empty {req!r}", file, raw[req][1] if req in raw else line, name)
    formula, fline, fnode = raw["formula"]
    try:
        ast = E.parse(formula)
    except E.ExprError as exc:
        # report the line of the formula; for a block scalar the text starts on the next line
        fl = fline + (1 if getattr(fnode, "style", None) in ("|", ">") else 0)
        raise RuleError(f"formula: {exc}", file, fl, name) from None
    inputs, cfg = E.names_of(ast), E.config_of(ast)
    if name not in canonical:
        raise RuleError(f"output {name!r} is not a canonical metric name (add it to canonical.yaml)", file,
                        raw["name"][1], name)
    for n in inputs:
        if n not in canonical:
            raise RuleError(f"formula reads unknown canonical name {n!r}", file, fline, name)
    if config_names is not None:
        for c in cfg:
            if c not in config_names:
                raise RuleError(f"formula reads unknown config name {c!r} (canonical config names: "
                                f"{', '.join(sorted(config_names))})", file, fline, name)
    if name in inputs:
        raise RuleError(f"cycle: rule reads its own output {name!r}", file, line, name)
    out_ph = set(placeholders(name))
    in_ph: set[str] = set()
    templated_inputs = [i for i in inputs if is_template(i)]
    if templated_inputs:
        first = set(placeholders(templated_inputs[0]))
        for t in templated_inputs[1:]:
            if not set(placeholders(t)) <= first:
                raise RuleError(f"templated input {t!r} uses placeholders not bound by {templated_inputs[0]!r} "
                                "(the first templated input binds them)", file, fline, name)
        in_ph = first
    if not out_ph <= in_ph:
        raise RuleError(f"output placeholders {sorted(out_ph - in_ph)} are not bound by any input", file,
                        raw["name"][1], name)
    rule = Rule(name=name, formula=formula, ast=ast, inputs=inputs, config=cfg, stateful=E.stateful_of(ast),
                description=raw["description"][0].strip(), citation=raw["citation"][0].strip(), file=file, line=line)
    if "requires" in raw:
        req, rl, _ = raw["requires"]
        if not isinstance(req, dict):
            raise RuleError("'requires' must be a mapping (sources, config_absent)", file, rl, name)
        for k in req:
            if k not in _REQUIRES_FIELDS:
                raise RuleError(f"unknown field requires.{k} (known: {', '.join(sorted(_REQUIRES_FIELDS))})",
                                file, rl, name)
        rule.sources = _str_list(req.get("sources", []), "requires.sources", file, rl, name)
        rule.config_absent = _str_list(req.get("config_absent", []), "requires.config_absent", file, rl, name)
        if config_names is not None:
            for c in rule.config_absent:
                if c not in config_names:
                    raise RuleError(f"requires.config_absent names unknown config name {c!r}", file, rl, name)
    if "forbid_approximate" in raw:
        val, fl2, _ = raw["forbid_approximate"]
        rule.forbid_approximate = _str_list(val, "forbid_approximate", file, fl2, name)
        for n in rule.forbid_approximate:
            if n not in inputs:
                raise RuleError(f"forbid_approximate names {n!r}, which the formula does not read", file, fl2, name)
    if "only" in raw:
        val, ol, _ = raw["only"]
        if not isinstance(val, dict):
            raise RuleError("'only' must map placeholders to lists of allowed values", file, ol, name)
        for ph, allowed in val.items():
            if ph not in in_ph:
                raise RuleError(f"only: {ph!r} is not a placeholder of the inputs", file, ol, name)
            rule.only[ph] = _str_list(allowed, f"only.{ph}", file, ol, name)
    if "note" in raw:
        rule.note = str(raw["note"][0] or "")
    if "override" in raw:
        val, ovl, _ = raw["override"]
        if not isinstance(val, bool):
            raise RuleError(f"'override' must be true or false, not {val!r}", file, ovl, name)
        rule.override = val
    rule.key = f"{name}@{Path(file).name}:{line}"
    return rule


def parse_rules(text: str, file: str, canonical: CanonicalNames, config_names: set[str] | None) -> list[Rule]:
    """Parse one rules file's text (``file`` names it in errors)."""
    root = _compose(text, file)
    if root is None:
        raise RuleError(f"empty file (expected 'format: {FORMAT}' and 'rules:')", file, 1)
    if not isinstance(root, yaml.MappingNode):
        raise RuleError("top level must be a mapping with 'format' and 'rules'", file, root.start_mark.line + 1)
    top = {k: (v, ln) for k, v, ln in _items(root)}
    for k, (_, ln) in top.items():
        if k not in ("format", "rules", "description"):
            raise RuleError(f"unknown top-level field {k!r} (known: format, description, rules)", file, ln)
    if "format" not in top:
        raise RuleError(f"missing 'format: {FORMAT}'", file, 1)
    fmt_node, fmt_line = top["format"]
    fmt = _py(fmt_node, file)
    if fmt != FORMAT:
        raise RuleError(f"unknown format {fmt!r} (expected {FORMAT!r})", file, fmt_line)
    if "rules" not in top:
        raise RuleError("missing 'rules:'", file, 1)
    rnode, rline = top["rules"]
    if isinstance(rnode, yaml.ScalarNode) and _scalar(rnode) is None:
        return []
    if not isinstance(rnode, yaml.SequenceNode):
        raise RuleError("'rules' must be a list of rules", file, rline)
    return [_parse_rule(n, file, canonical, config_names) for n in rnode.value]


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
    import heapq
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
               config_names: Iterable[str] | None = None, shipped: bool = True) -> RuleSet:
    """Load the shipped ``derived.yaml`` (unless ``shipped=False``) plus user rule files, check and order them.

    ``canonical``: the canonical metric names (a set, templates included) or a callable ``name -> bool``; default:
    the names of the shipped ``canonical.yaml``. ``config_names``: canonical config names (default: the shipped
    ``canonical.yaml``'s ``config:`` section). Raises :class:`RuleError` naming file, line and rule.
    """
    if canonical is None or config_names is None:
        metric_names, cfg_names = shipped_canonical()
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
    per_file: list[list[Rule]] = []
    for f in files:
        try:
            text = Path(f).read_text(encoding="utf-8")
        except OSError as exc:
            raise RuleError(f"cannot read rules file: {exc.strerror or exc}", f) from None
        per_file.append(parse_rules(text, f, names, cfg))
    if shipped and per_file:
        per_file[0] = _apply_overrides(per_file[0], [r for rules in per_file[1:] for r in rules])
    # user files first (later files first), the shipped file last: for one output, user rules are tried first
    flat = [r for rules in reversed(per_file) for r in rules]
    return RuleSet(order_rules(flat), files)
