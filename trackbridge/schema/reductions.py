"""How a logged value was reduced (docs/reductions.md): the vocabulary of an entry's ``reduce:``, its compiled form,
level counts from the run config, and how these are read from a mapping file.

A framework entry states, field by field, how its value was computed (``tokens: token_mean``, ``mini_batches: mean``
...). A field is a literal (one of :data:`FIELDS`) or a **config switch** ``{config: KEY, map: {VALUE: LITERAL, ...},
default: VALUE, other: LITERAL}``: the literal depends on the run config's ``KEY`` (``default``: the config value
assumed when the run config lacks the key; left out, the framework file's ``config:`` entry of that key gives its
``default:``; ``other``: the literal for a value the map does not list). Entries share descriptions through the
file's named profiles (``reductions: {NAME: {...}}``), referenced with ``reduce: {like: NAME, FIELD: override}``; a
profile may itself be ``like`` another. How many items each level holds comes from the file's ``levels:`` (a count
expression over config keys, or null: unknown), or from a ``counts:`` of the entry or profile.

This module only parses and compiles; comparing reductions and the fidelity that follows live in
:mod:`trackbridge.translate.fidelity`.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Mapping

from ..errors import TrackBridgeError
from .yamlfile import MappingError, line_of

#: True: an entry that states no ``reduce:`` (the legacy hand-written ``fidelity``/``differs``/``reason``) is an error
#: of the loader and of ``trackbridge mappings lint``, in shipped and user files alike; False (the transition): a
#: warning that ``lint`` reports ("reduction unstated"). ``lint --require-reduction`` applies True for one run.
REQUIRE_REDUCTION = False

#: The levels a value is reduced over, innermost first (each a field of ``reduce:`` whose count ``levels:`` gives).
LEVELS = ("micro_batches", "mini_batches", "processes", "window")
_COMBINE = ("token_weighted", "seq_weighted", "mean", "sum", "last", "max", "min", "var", "none")

#: field -> its literals (docs/reductions.md, "The levels"). ``deviation`` is free text besides ``none``.
FIELDS: dict[str, tuple[str, ...]] = {
    "tokens": ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm", "token_sum",
               "token_sum_step_norm", "token_sum_dp_norm", "token_sum_global_norm", "per_seq", "none"),
    "stat": ("mean", "max", "min", "std", "sum", "fraction", "count", "value", "dist", "explained_var"),
    "std": ("sample", "population"),
    "micro_batches": _COMBINE,
    "mini_batches": _COMBINE,
    "processes": ("all_reduce_weighted", "all_reduce_mean", "token_weighted", "seq_weighted", "gather", "sum", "max",
                  "min", "rank0", "none"),
    "window": ("step", "mean", "last", "sum", "pooled"),
    "snapshot": ("rollout", "update", "after_update", "before_scheduler_step", "after_scheduler_step", "none"),
    "estimator": ("k1", "k2", "k3", "abs", "exact", "sampled", "none"),
    "padding": ("excluded", "included"),
    "tool_tokens": ("included", "excluded", "none"),
    "clip_length": ("max_length", "batch_longest", "none"),
    "deviation": ("none",),
}
#: the value a field has when a ``reduce:`` leaves it out (both sides of a comparison read it so)
DEFAULTS: dict[str, str] = {"tokens": "none", "stat": "mean", "std": "none", "micro_batches": "none",
                            "mini_batches": "none", "processes": "none", "window": "step", "snapshot": "none",
                            "estimator": "none", "padding": "excluded", "tool_tokens": "none", "clip_length": "none",
                            "deviation": "none"}
FREE_TEXT = ("deviation",)      # fields whose value may be any sentence (a difference the other fields cannot state)
#: a canonical reference's value for a field the name leaves to each framework (``loss/total``'s tokens: a language
#: model's loss is a token mean, a preference loss a mean over pairs); it compares equal to any value
ANY = "any"
REFERENCE_ANY = ("tokens",)     # the fields a reference may leave to the framework
_KEYWORDS = ("like", "counts")


class _NoDefault:
    """The marker of "no default given" (``None`` is a default like any other value)."""

    def __repr__(self) -> str:
        return "NO_DEFAULT"

    def __reduce__(self) -> str:          # one object, also through the compiled registry cache
        return "NO_DEFAULT"


NO_DEFAULT: Any = _NoDefault()


def _allowed(field_name: str, value: Any) -> bool:
    if field_name in FREE_TEXT:
        return isinstance(value, str) and bool(value.strip())
    return isinstance(value, str) and value in FIELDS[field_name]


# ------------------------------------------------------------------------------------------------ compiled form
@dataclass(frozen=True)
class Switch:
    """A field whose literal depends on the run config: ``{config: KEY, map: {...}, default: ..., other: ...}``."""

    key: str
    cases: tuple[tuple[Any, str], ...]       # (config value, literal), in the file's order
    default: Any = NO_DEFAULT                # config value assumed when the run config lacks the key
    other: str | None = None                 # literal for a config value the map does not list

    def pick(self, have: Any) -> str | None:
        """The literal for config value ``have`` (None: the map does not say and there is no ``other``)."""
        for want, literal in self.cases:
            if config_equal(have, want):
                return literal
        return self.other

    def __str__(self) -> str:
        cases = ", ".join(f"{w}: {v}" for w, v in self.cases)
        return f"{{config: {self.key}, map: {{{cases}}}}}"


def config_equal(have: Any, want: Any) -> bool:
    """Whether a run-config value is the value a mapping file names: trackers store configs as text at times
    (``"1"``, ``"True"``, ``"null"``), so text is read as the type of the value it is compared with."""
    if isinstance(have, str) and not isinstance(want, str):
        text = have.strip()
        if want is None:
            return text.lower() in ("none", "null", "")
        if isinstance(want, bool):
            return text.lower() == str(want).lower()
        if isinstance(want, (int, float)):
            try:
                return float(text) == float(want)
            except ValueError:
                return False
        return False
    if isinstance(want, bool) or isinstance(have, bool):
        return isinstance(want, bool) and isinstance(have, bool) and have == want
    try:
        return bool(have == want)
    except Exception:
        return False


Value = "str | Switch"


@dataclass(frozen=True)
class Reduce:
    """A ``reduce:`` (an entry's, a profile's, or a canonical metric's) with its profile merged in: the stated fields
    (literals or switches) and the level counts it sets itself."""

    fields: tuple[tuple[str, Any], ...]          # (field, literal | Switch), in FIELDS order
    counts: tuple[tuple[str, str | None], ...] = ()   # (level, count expression | None = unknown)
    like: str | None = None                      # the profile it was written `like` (for docs)

    def get(self, name: str) -> Any:
        for k, v in self.fields:
            if k == name:
                return v
        return DEFAULTS[name]

    def stated(self, name: str) -> bool:
        return any(k == name for k, _ in self.fields)

    def count_expr(self, level: str) -> tuple[bool, str | None]:
        """(set here, expression) of a level's count set by this reduce."""
        for k, v in self.counts:
            if k == level:
                return True, v
        return False, None

    def with_fields(self, **values: Any) -> "Reduce":
        """A copy with these fields set (kept in :data:`FIELDS` order)."""
        merged = {**dict(self.fields), **values}
        return Reduce(tuple((k, merged[k]) for k in FIELDS if k in merged), self.counts, self.like)

    @property
    def switches(self) -> list[Switch]:
        return [v for _, v in self.fields if isinstance(v, Switch)]

    def text(self) -> str:
        """``tokens: token_mean, mini_batches: mean, ...`` (as documented)."""
        return ", ".join(f"{k}: {v}" for k, v in self.fields)


@dataclass(frozen=True)
class LevelCount:
    """One ``levels:`` item: the count of a level (an expression over config keys; None: unknown from the config),
    for some trainers and releases."""

    level: str
    expr: str | None
    trainers: frozenset[str] | None = None
    since: float = 0
    until: float = float("inf")
    file: str = ""
    line: int = 0

    def applies(self, trainer: str | None, lo: float, hi: float) -> bool:
        if self.until < lo or self.since > hi:
            return False
        return trainer is None or self.trainers is None or trainer in self.trainers


# ------------------------------------------------------------------------------------------------ count expressions
class CountError(TrackBridgeError, ValueError):
    pass


_TOKEN = re.compile(r"\s*(?:(?P<num>\d+(?:\.\d*)?(?:[eE][+-]?\d+)?)|(?P<name>[A-Za-z_][A-Za-z0-9_.\-]*)"
                    r"|(?P<op>//|[-+*/(),]))")
_FUNCS = {"min": (2, None), "max": (2, None), "ceil": (1, 1), "floor": (1, 1)}


@dataclass(frozen=True)
class CountExpr:
    """A level count: ``data.train_batch_size / actor_rollout_ref.actor.ppo_mini_batch_size * ppo_epochs``.

    Numbers, config keys (dotted; a ``-`` inside a key is part of it, so subtraction needs spaces), ``+ - * / //``,
    parentheses and ``min max ceil floor``. Nothing else: no attribute access, no call of anything but these."""

    text: str
    tree: Any

    @property
    def keys(self) -> list[str]:
        out: list[str] = []

        def walk(n: Any) -> None:
            if isinstance(n, tuple):
                if n[0] == "key" and n[1] not in out:
                    out.append(n[1])
                for part in n[1:]:
                    walk(part)
            elif isinstance(n, list):
                for part in n:
                    walk(part)
        walk(self.tree)
        return out

    def evaluate(self, value_of: Any) -> float | None:
        """The count, with ``value_of(key)`` giving each key's number (None: unknown); None when any is unknown or
        the arithmetic fails (a division by zero)."""
        def ev(n: Any) -> float:
            kind = n[0]
            if kind == "num":
                return float(n[1])
            if kind == "key":
                v = value_of(n[1])
                if v is None:
                    raise _Unknown
                return v
            if kind == "neg":
                return -ev(n[1])
            if kind == "call":
                args = [ev(a) for a in n[2]]
                return float({"min": min, "max": max}[n[1]](args)) if n[1] in ("min", "max") else \
                    float(math.ceil(args[0]) if n[1] == "ceil" else math.floor(args[0]))
            a, b = ev(n[1]), ev(n[2])
            if kind == "+":
                return a + b
            if kind == "-":
                return a - b
            if kind == "*":
                return a * b
            if b == 0:
                raise _Unknown
            return a / b if kind == "/" else float(a // b)
        try:
            out = ev(self.tree)
        except _Unknown:
            return None
        return out if math.isfinite(out) else None


class _Unknown(Exception):
    pass


def parse_count(text: str) -> CountExpr:
    """Parse a count expression; raises :class:`CountError` naming the column."""
    tokens: list[tuple[str, str, int]] = []
    pos = 0
    text = str(text)
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        m = _TOKEN.match(text, pos)
        if m is None:
            raise CountError(f"unexpected {text[pos:].strip()[:1]!r} at column {pos + 1}")
        kind = m.lastgroup or ""
        tokens.append((kind, m.group(kind), m.start(kind)))
        pos = m.end()
    tokens.append(("end", "", len(text)))
    i = 0

    def peek() -> tuple[str, str, int]:
        return tokens[i]

    def take() -> tuple[str, str, int]:
        nonlocal i
        i += 1
        return tokens[i - 1]

    def expect(op: str) -> None:
        t = take()
        if t[1] != op:
            raise CountError(f"expected {op!r} at column {t[2] + 1}")

    def expr(depth: int) -> Any:
        if depth > 32:
            raise CountError("nested too deep")
        node = term(depth)
        while peek()[1] in ("+", "-") and peek()[0] == "op":
            op = take()[1]
            node = (op, node, term(depth))
        return node

    def term(depth: int) -> Any:
        node = unary(depth)
        while peek()[1] in ("*", "/", "//") and peek()[0] == "op":
            op = take()[1]
            node = (op, node, unary(depth))
        return node

    def unary(depth: int) -> Any:
        if peek()[0] == "op" and peek()[1] == "-":
            take()
            return ("neg", unary(depth + 1))
        return primary(depth)

    def primary(depth: int) -> Any:
        kind, val, at = take()
        if kind == "num":
            return ("num", float(val))
        if kind == "name":
            if val in _FUNCS and peek()[1] == "(":
                take()
                args = [expr(depth + 1)]
                while peek()[1] == ",":
                    take()
                    args.append(expr(depth + 1))
                expect(")")
                lo, hi = _FUNCS[val]
                if len(args) < lo or (hi is not None and len(args) > hi):
                    raise CountError(f"{val}() takes {lo}{'' if hi == lo else ' or more'} argument(s)")
                return ("call", val, args)
            if "__" in val:
                raise CountError(f"a config key may not contain '__': {val!r}")
            return ("key", val)
        if kind == "op" and val == "(":
            node = expr(depth + 1)
            expect(")")
            return node
        raise CountError(f"expected a number, a config key or '(' at column {at + 1}"
                         + (" (end of the expression)" if kind == "end" else f", not {val!r}"))

    tree = expr(0)
    if peek()[0] != "end":
        raise CountError(f"unexpected {peek()[1]!r} at column {peek()[2] + 1}")
    return CountExpr(text, tree)


# ------------------------------------------------------------------------------------------------ parsing
def parse_switch(field_name: str, raw: Mapping[str, Any], where: str, errors: list[str]) -> Switch | None:
    key = raw.get("config")
    if not isinstance(key, str) or not key.strip():
        errors.append(f"{where}: a config switch needs `config: KEY` (the run config key it depends on)")
        return None
    cases_raw = raw.get("map")
    if not isinstance(cases_raw, Mapping) or not cases_raw:
        errors.append(f"{where}: a config switch needs `map: {{CONFIG_VALUE: {field_name.upper()}, ...}}`")
        return None
    cases = []
    for want, literal in cases_raw.items():
        if not _allowed(field_name, literal):
            errors.append(f"{where}: map: {want!r}: {literal!r} is not a {field_name} value "
                          f"({_choices(field_name)})")
            continue
        cases.append((want, str(literal)))
    other = raw.get("other")
    if other is not None and not _allowed(field_name, other):
        errors.append(f"{where}: other: {other!r} is not a {field_name} value ({_choices(field_name)})")
        other = None
    extra = set(raw) - {"config", "map", "default", "other"}
    if extra:
        errors.append(f"{where}: unknown field(s) {sorted(map(str, extra))} in a config switch (config, map, "
                      "default, other)")
    return Switch(key.strip(), tuple(cases), raw["default"] if "default" in raw else NO_DEFAULT,
                  str(other) if other is not None else None)


def _choices(field_name: str) -> str:
    vals = " | ".join(FIELDS[field_name])
    return f"{vals} | a sentence" if field_name in FREE_TEXT else vals


def parse_reduce(raw: Any, profiles: Mapping[str, Reduce], *, literal_only: bool = False,
                 where: str = "reduce") -> tuple[Reduce | None, list[str]]:
    """Compile one ``reduce:`` mapping (``like`` resolved against ``profiles``); (reduce, problems). A canonical
    metric's reduce (``literal_only``) takes literals only: it is the reference, not a framework's choice."""
    problems: list[str] = []
    if not isinstance(raw, Mapping):
        return None, [f"{where} must be a mapping of fields (docs/reductions.md)"]
    base: Reduce | None = None
    like = raw.get("like")
    if like is not None:
        if literal_only:
            problems.append(f"{where}: `like` is for framework files (profiles under `reductions:`)")
        elif not isinstance(like, str) or like not in profiles:
            known = ", ".join(sorted(profiles)) or "none declared"
            problems.append(f"{where}: like: {like!r} is not a profile of this framework's `reductions:` "
                            f"(known: {known})")
        else:
            base = profiles[like]
    fields: dict[str, Any] = dict(base.fields) if base else {}
    for name, value in raw.items():
        if name in _KEYWORDS:
            continue
        if name not in FIELDS:
            import difflib
            close = difflib.get_close_matches(str(name), [*FIELDS, *_KEYWORDS], n=1, cutoff=0.6)
            problems.append(f"{where}: unknown field {name!r}" + (f" (did you mean {close[0]!r}?)" if close else
                                                                   f" (fields: {', '.join(FIELDS)})"))
            continue
        at = f"{where}.{name}"
        if isinstance(value, Mapping):
            if literal_only:
                problems.append(f"{at}: a canonical reference states a literal, not a config switch")
                continue
            sw = parse_switch(name, value, at, problems)
            if sw is not None:
                fields[name] = sw
        elif _allowed(name, value):
            fields[name] = str(value)
        elif literal_only and value == ANY and name in REFERENCE_ANY:
            fields[name] = ANY
        else:
            problems.append(f"{at}: {value!r} is not a {name} value ({_choices(name)}), nor a config switch "
                            "{config: KEY, map: {...}}")
    stat = fields.get("stat")
    if "std" in fields and not isinstance(stat, Switch) and stat != "std":
        problems.append(f"{where}: `std` (sample | population) goes with `stat: std`")
    if stat == "std" and "std" not in fields:
        problems.append(f"{where}: `stat: std` needs `std: sample` (n-1) or `std: population` (n)")
    counts: dict[str, str | None] = dict(base.counts) if base else {}
    raw_counts = raw.get("counts")
    if raw_counts is not None:
        if literal_only:
            problems.append(f"{where}: `counts` is for framework files")
        elif not isinstance(raw_counts, Mapping):
            problems.append(f"{where}.counts must map a level ({', '.join(LEVELS)}) to a count expression or null")
        else:
            for level, expr in raw_counts.items():
                if level not in LEVELS:
                    problems.append(f"{where}.counts: {level!r} is not a level ({', '.join(LEVELS)})")
                    continue
                if expr is not None:
                    try:
                        parse_count(str(expr))
                    except CountError as exc:
                        problems.append(f"{where}.counts.{level}: {expr!r}: {exc}")
                        continue
                counts[str(level)] = None if expr is None else str(expr)
    ordered = tuple((k, fields[k]) for k in FIELDS if k in fields)
    return Reduce(ordered, tuple((k, counts[k]) for k in LEVELS if k in counts),
                  like if isinstance(like, str) else None), problems


def parse_profiles(raw: Any, f: str, entry: str, errors: list[MappingError],
                   inherited: Mapping[str, Reduce] | None = None) -> dict[str, Reduce]:
    """A framework file's ``reductions:`` (profile name -> reduce); a profile may be ``like`` another (declared
    before or after it, in this file or an earlier file of the framework); a cycle is an error."""
    out: dict[str, Reduce] = dict(inherited or {})
    if raw is None:
        return out
    if not isinstance(raw, Mapping):
        errors.append(MappingError("`reductions` maps profile names to reductions", file=f, entry=entry))
        return out
    pending = {str(k): v for k, v in raw.items()}
    for name in list(pending):
        if name in out and name in (inherited or {}):
            errors.append(MappingError(f"profile {name!r} is declared by an earlier file of this framework",
                                       file=f, line=line_of(raw, name), entry=f"reductions.{name}"))
            pending.pop(name)
    while pending:
        progress = False
        for name, spec in list(pending.items()):
            like = spec.get("like") if isinstance(spec, Mapping) else None
            if isinstance(like, str) and like in pending and like != name:
                continue                     # its base first
            red, problems = parse_reduce(spec, out, where=f"reductions.{name}")
            for p in problems:
                errors.append(MappingError(p, file=f, line=line_of(raw, name), entry=f"reductions.{name}"))
            if red is not None:
                out[name] = red
            pending.pop(name)
            progress = True
        if not progress:
            cycle = ", ".join(sorted(pending))
            errors.append(MappingError(f"profiles {cycle} are `like` each other in a cycle", file=f,
                                       line=line_of(raw, sorted(pending)[0]), entry="reductions"))
            break
    return out
