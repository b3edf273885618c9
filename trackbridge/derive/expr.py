"""The derived-metrics expression language: tokenizer, recursive-descent parser, AST and evaluator.

Why a language of its own: formulas in ``derived.yaml`` (and in users' files) must never run user code, so there is
no ``eval``, no attribute access and no way to call anything but the fixed functions below.

Syntax (one expression per formula)::

    expr    := term (('+' | '-') term)*
    term    := unary (('*' | '/') unary)*
    unary   := ('-' | '+') unary | primary
    primary := NUMBER | NAME | CONFIG | FUNC '(' expr (',' expr)* ')' | '(' expr ')'

* **Numbers**: ``2``, ``0.5``, ``1e-3``, ``.25``.
* **Canonical metric names** are written bare or in backquotes. A bare name starts with a letter or ``_`` and runs
  over ``[A-Za-z0-9_./@{}:-]``, so ``reward/score/mean``, ``time/{stage}`` and ``val/{ds:path}/acc/mean@{n}`` are
  single tokens. Because ``/`` and ``-`` may be part of a name, **division and subtraction next to a bare name need
  spaces**: ``a / b`` divides, ``a/b`` is the name ``a/b``. Backquotes take anything up to the closing backquote:
  ```time/gen` * 1000``.
* **Config values**: ``config.NAME`` (canonical config names from ``canonical.yaml``'s ``config:`` section).
* **Functions**: ``sqrt abs log exp`` (one argument), ``min max`` (two or more). Stateful functions over the run's
  history: ``delta(x)`` (x now minus x at the last step where x was present), ``cumsum(x)`` (running sum over the
  steps where x was present), ``rate(x)`` (``delta(x)`` per second of wall time) and ``ema(x, alpha)`` (exponential
  moving average, ``alpha`` a constant in (0, 1]).
* Names containing ``__`` are rejected; there is no attribute access, indexing or call of anything else.
* Size is bounded: a formula longer than :data:`MAX_LENGTH` characters, or nested deeper than :data:`MAX_DEPTH`
  (parentheses, function calls and signs, and chains such as ``a + b + c`` count one level per operator), is a
  syntax error at the column where the limit is passed, never a "maximum recursion depth exceeded".

Evaluation never raises for bad *values*: division by zero, NaN or infinite inputs and results, ``sqrt`` of a
negative number, ``log`` of a non-positive number, a missing or non-numeric config value all raise
:class:`NoValue` with a reason, which the engine turns into "no output" plus a one-time note.

Why one module of ~530 lines: it is the whole definition of one small language, and its parts must agree with each
other: the tokenizer's name syntax, the AST, the parser (which checks each function's arity and the size bounds), the
function table the parser and the evaluator share, and the evaluator's rules for bad values. Split in two, the
function table would live apart from either its parser or its evaluator, and the AST types would need a third module
imported by both; reading the language top to bottom in one file is what a reviewer of its safety needs.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from ..errors import TrackBridgeError

__all__ = [
    "ExprError", "NoValue", "Node", "Num", "Name", "Config", "Unary", "BinOp", "Call", "Stateful",
    "parse", "names_of", "config_of", "stateful_of", "evaluate", "FUNCTIONS", "STATEFUL",
]


class ExprError(TrackBridgeError, ValueError):
    """A formula that cannot be parsed. ``pos`` is the 0-based column in the formula text."""

    def __init__(self, message: str, text: str, pos: int):
        self.message, self.text, self.pos = message, text, pos
        caret = " " * pos + "^"
        super().__init__(f"{message} at column {pos + 1}\n    {text}\n    {caret}")


class NoValue(Exception):
    """Raised during evaluation when the formula gives no value for these inputs (reason in ``args[0]``)."""


MAX_LENGTH = 4096      # characters in one formula (the longest shipped formula has under 200)
MAX_DEPTH = 64         # nesting of one formula: parentheses, calls, signs and operator chains


# ------------------------------------------------------------------------------------------------ tokenizer
_NUMBER = re.compile(r"(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_./@{}:\-]*")
_SPACE = re.compile(r"\s+")
_OPS = set("+-*/(),")


@dataclass(frozen=True)
class Token:
    kind: str      # "num" | "name" | "qname" | "op" | "end"
    text: str
    pos: int


def tokenize(text: str) -> list[Token]:
    """Split a formula into tokens; raises :class:`ExprError` with the column of anything unexpected."""
    if not isinstance(text, str):
        raise ExprError(f"formula must be a string, not {type(text).__name__}", repr(text), 0)
    toks: list[Token] = []
    i, n = 0, len(text)
    while i < n:
        m = _SPACE.match(text, i)
        if m:
            i = m.end()
            continue
        c = text[i]
        if c.isdigit() or (c == "." and i + 1 < n and text[i + 1].isdigit()):
            m = _NUMBER.match(text, i)
            assert m
            end = m.end()
            if end < n and (text[end].isalpha() or text[end] == "_"):
                raise ExprError(f"malformed number {text[i:end + 1]!r}", text, i)
            toks.append(Token("num", m.group(), i))
            i = end
        elif c == "`":
            j = text.find("`", i + 1)
            if j < 0:
                raise ExprError("unterminated backquoted name", text, i)
            name = text[i + 1:j]
            if not name.strip():
                raise ExprError("empty backquoted name", text, i)
            if "__" in name:
                raise ExprError(f"names containing '__' are not allowed ({name!r})", text, i)
            toks.append(Token("qname", name, i))
            i = j + 1
        elif c.isalpha() or c == "_":
            m = _NAME.match(text, i)
            assert m
            if "__" in m.group():
                raise ExprError(f"names containing '__' are not allowed ({m.group()!r})", text, i)
            toks.append(Token("name", m.group(), i))
            i = m.end()
        elif c in _OPS:
            toks.append(Token("op", c, i))
            i += 1
        else:
            hint = " (there is no exponent operator; use exp/log)" if c == "^" else ""
            raise ExprError(f"unexpected character {c!r}{hint}", text, i)
    toks.append(Token("end", "", n))
    return toks


# ------------------------------------------------------------------------------------------------ AST
class Node:
    """Base of the AST node types."""

    pos: int = 0


@dataclass
class Num(Node):
    value: float
    pos: int = 0


@dataclass
class Name(Node):
    name: str             # canonical metric name (may be a template such as time/{stage})
    pos: int = 0


@dataclass
class Config(Node):
    name: str             # canonical config name (without the "config." prefix)
    pos: int = 0


@dataclass
class Unary(Node):
    op: str
    operand: Node
    pos: int = 0


@dataclass
class BinOp(Node):
    op: str
    left: Node
    right: Node
    pos: int = 0


@dataclass
class Call(Node):
    fn: str
    args: list[Node]
    pos: int = 0


@dataclass
class Stateful(Node):
    """A call of delta/cumsum/rate/ema. ``index`` numbers the stateful calls of one formula (its state slot)."""

    fn: str
    arg: Node
    alpha: float | None = None
    index: int = 0
    pos: int = 0


def _sqrt(x: float) -> float:
    if x < 0:
        raise NoValue(f"sqrt of a negative number ({x!r})")
    return math.sqrt(x)


def _log(x: float) -> float:
    if x <= 0:
        raise NoValue(f"log of a non-positive number ({x!r})")
    return math.log(x)


def _exp(x: float) -> float:
    try:
        return math.exp(x)
    except OverflowError:
        raise NoValue(f"exp overflow ({x!r})") from None


# name -> (function, min args, max args or None)
FUNCTIONS: dict[str, tuple[Callable[..., float], int, int | None]] = {
    "sqrt": (_sqrt, 1, 1),
    "abs": (abs, 1, 1),
    "log": (_log, 1, 1),
    "exp": (_exp, 1, 1),
    "min": (min, 2, None),
    "max": (max, 2, None),
}
STATEFUL = {"delta": 1, "cumsum": 1, "rate": 1, "ema": 2}


# ------------------------------------------------------------------------------------------------ parser
class _Parser:
    def __init__(self, text: str):
        if isinstance(text, str) and len(text) > MAX_LENGTH:
            raise ExprError(f"formula too long ({len(text):,} characters; at most {MAX_LENGTH:,})", text[:60] + " ...",
                            0)
        self.text = text
        self.toks = tokenize(text)
        self.i = 0
        self.n_stateful = 0
        self.nesting = 0                     # open parentheses, calls and signs around the current token
        self.depths: dict[int, int] = {}     # id(node) -> depth of the subtree (operator chains nest too)

    def _deeper(self, tok: Token) -> None:
        self.nesting += 1
        if self.nesting > MAX_DEPTH:
            raise self.error(f"formula nested too deep (more than {MAX_DEPTH} levels of parentheses, calls or "
                             f"signs)", tok)

    def _node(self, node: Node, children: list[Node], tok: Token) -> Node:
        depth = 1 + max((self.depths.get(id(c), 1) for c in children), default=0)
        if depth > MAX_DEPTH:
            raise self.error(f"formula nested too deep (more than {MAX_DEPTH} levels; a long chain of operators "
                             f"counts one level per operator)", tok)
        self.depths[id(node)] = depth
        return node

    def peek(self) -> Token:
        return self.toks[self.i]

    def next(self) -> Token:
        t = self.toks[self.i]
        self.i += 1
        return t

    def error(self, msg: str, tok: Token | None = None) -> ExprError:
        tok = tok or self.peek()
        return ExprError(msg, self.text, tok.pos)

    def expect(self, op: str) -> Token:
        t = self.peek()
        if t.kind != "op" or t.text != op:
            got = "end of formula" if t.kind == "end" else repr(t.text)
            raise self.error(f"expected {op!r}, got {got}")
        return self.next()

    def parse(self) -> Node:
        if self.peek().kind == "end":
            raise self.error("empty formula")
        node = self.expr()
        t = self.peek()
        if t.kind != "end":
            hint = ""
            prev = self.toks[self.i - 1]
            if prev.kind == "name" and prev.text[-1] in "/-":
                hint = " (a bare name swallows '/' and '-': put spaces around division and subtraction)"
            elif t.kind in ("name", "qname", "num"):
                hint = " (missing operator?)"
            raise self.error(f"unexpected {t.text!r}{hint}", t)
        return node

    def expr(self) -> Node:
        self._deeper(self.peek())
        node = self.term()
        while self.peek().kind == "op" and self.peek().text in "+-":
            t = self.next()
            right = self.term()
            node = self._node(BinOp(t.text, node, right, t.pos), [node, right], t)
        self.nesting -= 1
        return node

    def term(self) -> Node:
        node = self.unary()
        while self.peek().kind == "op" and self.peek().text in "*/":
            t = self.next()
            right = self.unary()
            node = self._node(BinOp(t.text, node, right, t.pos), [node, right], t)
        return node

    def unary(self) -> Node:
        t = self.peek()
        if t.kind == "op" and t.text in "+-":
            self.next()
            self._deeper(t)
            operand = self.unary()
            self.nesting -= 1
            return self._node(Unary(t.text, operand, t.pos), [operand], t)
        return self.primary()

    def primary(self) -> Node:
        t = self.next()
        if t.kind == "num":
            return Num(float(t.text), t.pos)
        if t.kind == "qname":
            self._check_name(t.text, t)
            return Name(t.text.strip(), t.pos)
        if t.kind == "name":
            self._check_name(t.text, t)
            nxt = self.peek()
            if nxt.kind == "op" and nxt.text == "(":
                return self.call(t)
            if t.text in FUNCTIONS or t.text in STATEFUL:
                raise self.error(f"function {t.text!r} must be called with parentheses", nxt)
            if t.text.startswith("config."):
                cname = t.text[len("config."):]
                if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", cname):
                    raise self.error(f"bad config name {cname!r} (expected config.NAME, NAME in [A-Za-z0-9_])", t)
                return Config(cname, t.pos)
            return Name(t.text, t.pos)
        if t.kind == "op" and t.text == "(":
            node = self.expr()
            self.expect(")")
            return node
        if t.kind == "end":
            raise self.error("unexpected end of formula", t)
        raise self.error(f"unexpected {t.text!r}", t)

    def _check_name(self, name: str, tok: Token) -> None:
        if "__" in name:
            raise self.error(f"names containing '__' are not allowed ({name!r})", tok)

    def call(self, t: Token) -> Node:
        fn = t.text
        if fn not in FUNCTIONS and fn not in STATEFUL:
            known = ", ".join(sorted([*FUNCTIONS, *STATEFUL]))
            raise self.error(f"unknown function {fn!r} (known: {known})", t)
        self.expect("(")
        args = [self.expr()]
        while self.peek().kind == "op" and self.peek().text == ",":
            self.next()
            args.append(self.expr())
        self.expect(")")
        if fn in STATEFUL:
            want = STATEFUL[fn]
            if len(args) != want:
                raise self.error(f"{fn}() takes {want} argument{'s' if want > 1 else ''}, got {len(args)}", t)
            alpha = None
            if fn == "ema":
                a = args[1]
                if isinstance(a, Unary) and isinstance(a.operand, Num):
                    a = Num(-a.operand.value if a.op == "-" else a.operand.value, a.pos)
                if not isinstance(a, Num):
                    raise ExprError("ema() alpha must be a number", self.text, args[1].pos)
                if not 0.0 < a.value <= 1.0:
                    raise ExprError(f"ema() alpha must be in (0, 1], got {a.value!r}", self.text, args[1].pos)
                alpha = a.value
            node = self._node(Stateful(fn, args[0], alpha, self.n_stateful, t.pos), args, t)
            self.n_stateful += 1
            return node
        _, lo, hi = FUNCTIONS[fn]
        if len(args) < lo or (hi is not None and len(args) > hi):
            need = f"{lo}" if lo == hi else f"at least {lo}"
            raise self.error(f"{fn}() takes {need} argument{'s' if lo > 1 or hi is None else ''}, got {len(args)}", t)
        return self._node(Call(fn, args, t.pos), args, t)


def parse(text: str) -> Node:
    """Parse one formula into an AST. Raises :class:`ExprError` (message, column) on any syntax error."""
    return _Parser(text).parse()


# ------------------------------------------------------------------------------------------------ inspection
def _walk(node: Node) -> Iterator[Node]:
    yield node
    if isinstance(node, Unary):
        yield from _walk(node.operand)
    elif isinstance(node, BinOp):
        yield from _walk(node.left)
        yield from _walk(node.right)
    elif isinstance(node, Call):
        for a in node.args:
            yield from _walk(a)
    elif isinstance(node, Stateful):
        yield from _walk(node.arg)


def rename(node: Node, new_name: Callable[[str], str]) -> None:
    """Replace, in place, every metric name the formula reads by ``new_name(name)``."""
    for n in _walk(node):
        if isinstance(n, Name):
            n.name = new_name(n.name)


def names_of(node: Node) -> list[str]:
    """Metric names the formula reads, in order of first appearance."""
    return list(dict.fromkeys(n.name for n in _walk(node) if isinstance(n, Name)))


def config_of(node: Node) -> list[str]:
    """Config names the formula reads."""
    return list(dict.fromkeys(n.name for n in _walk(node) if isinstance(n, Config)))


def stateful_of(node: Node) -> list[Stateful]:
    """Stateful calls, innermost first (the order in which they must observe their inputs)."""
    out: list[Stateful] = []

    def post(n: Node) -> None:
        if isinstance(n, Unary):
            post(n.operand)
        elif isinstance(n, BinOp):
            post(n.left)
            post(n.right)
        elif isinstance(n, Call):
            for a in n.args:
                post(a)
        elif isinstance(n, Stateful):
            post(n.arg)
            out.append(n)

    post(node)
    return out


def _rename(node: Node, fill: Callable[[str], str]) -> Node:
    """Copy of the AST with every metric name passed through ``fill`` (used to instantiate templates)."""
    if isinstance(node, Name):
        return Name(fill(node.name), node.pos)
    if isinstance(node, Unary):
        return Unary(node.op, _rename(node.operand, fill), node.pos)
    if isinstance(node, BinOp):
        return BinOp(node.op, _rename(node.left, fill), _rename(node.right, fill), node.pos)
    if isinstance(node, Call):
        return Call(node.fn, [_rename(a, fill) for a in node.args], node.pos)
    if isinstance(node, Stateful):
        return Stateful(node.fn, _rename(node.arg, fill), node.alpha, node.index, node.pos)
    return node


# ------------------------------------------------------------------------------------------------ evaluation
def _number(v: Any, what: str) -> float:
    """A finite float from a metric or config value, or :class:`NoValue` saying why not."""
    if isinstance(v, (bool, str, bytes)) or not hasattr(v, "__float__"):
        raise NoValue(f"{what} is not a number ({type(v).__name__})")
    try:
        x = float(v)          # also numpy/torch scalars, without importing them
    except (TypeError, ValueError):
        raise NoValue(f"{what} is not a number ({type(v).__name__})") from None
    if math.isnan(x):
        raise NoValue(f"{what} is NaN")
    if math.isinf(x):
        raise NoValue(f"{what} is infinite")
    return x


@dataclass
class Env:
    """What a formula is evaluated against: metric values, config values and the stateful calls' results."""

    metrics: dict[str, Any]
    config: dict[str, Any]
    stateful: dict[int, float] = field(default_factory=dict)   # Stateful.index -> value computed this step


def evaluate(node: Node, env: Env) -> float:
    """Value of ``node``; raises :class:`NoValue` (never anything else for bad values) when there is none."""
    if isinstance(node, Num):
        return node.value
    if isinstance(node, Name):
        if node.name not in env.metrics or env.metrics[node.name] is None:
            raise NoValue(f"{node.name} is missing")
        return _number(env.metrics[node.name], node.name)
    if isinstance(node, Config):
        if node.name not in env.config or env.config[node.name] is None:
            raise NoValue(f"config value {node.name} is missing")
        return _number(env.config[node.name], f"config value {node.name}")
    if isinstance(node, Unary):
        v = evaluate(node.operand, env)
        return -v if node.op == "-" else v
    if isinstance(node, BinOp):
        a = evaluate(node.left, env)
        b = evaluate(node.right, env)
        if node.op == "+":
            r = a + b
        elif node.op == "-":
            r = a - b
        elif node.op == "*":
            r = a * b
        else:
            if b == 0:
                raise NoValue("division by zero")
            r = a / b
        return _finite(r)
    if isinstance(node, Call):
        fn = FUNCTIONS[node.fn][0]
        return _finite(fn(*[evaluate(a, env) for a in node.args]))
    if isinstance(node, Stateful):
        if node.index not in env.stateful:
            raise NoValue(f"{node.fn}() has no value yet")
        return env.stateful[node.index]
    raise TypeError(f"not an expression node: {node!r}")  # pragma: no cover - parser never builds these


def _finite(x: float) -> float:
    if math.isnan(x) or math.isinf(x):
        raise NoValue("result is not finite")
    return x


def to_text(node: Node) -> str:
    """Canonical text of an AST (fully parenthesised binary operations; names backquoted)."""
    if isinstance(node, Num):
        return repr(node.value)
    if isinstance(node, Name):
        return f"`{node.name}`"
    if isinstance(node, Config):
        return f"config.{node.name}"
    if isinstance(node, Unary):
        return f"{node.op}{to_text(node.operand)}"
    if isinstance(node, BinOp):
        return f"({to_text(node.left)} {node.op} {to_text(node.right)})"
    if isinstance(node, Call):
        return f"{node.fn}({', '.join(to_text(a) for a in node.args)})"
    if isinstance(node, Stateful):
        extra = f", {node.alpha!r}" if node.alpha is not None else ""
        return f"{node.fn}({to_text(node.arg)}{extra})"
    raise TypeError(node)
