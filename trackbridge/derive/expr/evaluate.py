"""The expression language's meaning (:mod:`trackbridge.derive.expr`): evaluation (bad values raise
:class:`~.syntax.NoValue`, never anything else) and the walks over a parsed formula (its names, config values,
stateful calls; renaming; back to text)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from .syntax import FUNCTIONS, BinOp, Call, Config, Name, Node, NoValue, Num, Stateful, Unary


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
