"""The expression language's syntax (:mod:`trackbridge.derive.expr`): the tokenizer, the AST, the function table and
the recursive-descent parser with its size bounds."""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Callable

from ...errors import TrackBridgeError


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

