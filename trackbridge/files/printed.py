"""Printed values, as the plain-file readers (``csv:``, ``console:``) meet them: a printed number (``0.5``, ``nan``,
``-inf``, ``np.float64(0.5)``, ``tensor(0.5)``) turned into a record value, and a printed Python dict evaluated
*without* ``eval``. The readers should solve these the same way, so they share this module. Nothing here imports a
tracker or framework.
"""
from __future__ import annotations

import ast
import math
import re
from typing import Any

from ..errors import TrackBridgeError

# ANSI colour/cursor sequences (Ray prefixes every worker line with "\x1b[36m(TaskRunner pid=N)\x1b[0m ").
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")

_INT = re.compile(r"[+-]?\d+\Z")
_FLOAT = re.compile(r"[+-]?(?:\d+\.?\d*(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?)\Z")
_SPECIAL = {
    "nan": math.nan, "+nan": math.nan, "-nan": math.nan,
    "inf": math.inf, "+inf": math.inf, "-inf": -math.inf,
    "infinity": math.inf, "+infinity": math.inf, "-infinity": -math.inf,
}
# numpy / torch scalar reprs around a number: np.float64(0.5), numpy.int64(3), np.True_, tensor(0.5, device='cuda:0')
_WRAPPED = re.compile(
    r"(?:np|numpy)\.(?:float|int|uint|bool_?)\d*\(\s*(?P<a>[^(),]+?)\s*\)\Z"
    r"|(?:torch\.)?tensor\(\s*(?P<b>[^(),]+?)\s*(?:,.*)?\)\Z"
)
_BOOLS = {"true": 1, "false": 0, "np.true_": 1, "np.false_": 0}


def parse_number(text: str) -> int | float | None:
    """A printed scalar as a number, or ``None`` if ``text`` is not one.

    Accepts ints, floats (``1e-06``, ``.5``), ``nan``/``inf``/``Infinity`` in any case and sign, booleans (as 1/0,
    the way trackers store them), and numpy/torch scalar reprs (``np.float64(0.5)``, ``tensor(0.5, device='cuda:0')``).
    Integers stay ``int``; everything else is ``float``.
    """
    t = text.strip()
    if not t:
        return None
    if _INT.match(t):
        return int(t)
    if _FLOAT.match(t):
        return float(t)
    low = t.lower()
    if low in _SPECIAL:
        return _SPECIAL[low]
    if low in _BOOLS:
        return _BOOLS[low]
    m = _WRAPPED.match(t)
    if m:
        return parse_number(m.group("a") or m.group("b") or "")
    return None


class LiteralError(TrackBridgeError, ValueError):
    """A printed dict that is not a plain mapping of names to scalars."""


_NAMES = {"nan": math.nan, "inf": math.inf, "NaN": math.nan, "Infinity": math.inf,
          "True": 1, "False": 0, "None": None}
# Callables whose single argument is the value: np.float64(x), numpy.int32(x), tensor(x, device=...), float('nan')
_WRAPPER_CALL = re.compile(r"(?:(?:np|numpy)\.(?:float|int|uint|bool_?)\d*|(?:torch\.)?tensor|float|int)\Z")


# tensor(0.5, grad_fn=<MeanBackward0>): the "<...>" part is not Python syntax; it says nothing about the value.
_GRAD_FN = re.compile(r",\s*grad_fn=<[\w.]+>")


def _call_name(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_call_name(node.value)}.{node.attr}"
    return "?"


def _scalar(node: ast.AST, quoted: list[bool] | None = None) -> Any:
    """Evaluate one value node of a printed dict: constants, signs, nan/inf names and scalar wrappers only.

    ``quoted`` (if given) gets a ``True`` appended when a number had been printed as a string.
    """
    if isinstance(node, ast.Constant):
        v = node.value
        if isinstance(v, bool):
            return int(v)
        if v is None or isinstance(v, (int, float)):
            return v
        if isinstance(v, str):
            n = parse_number(v)          # transformers >= 4.5x prints floats as '0.1234' strings ("{v:.4g}")
            if n is not None and quoted is not None:
                quoted.append(True)
            return n if n is not None else v
        raise LiteralError(f"unsupported constant {v!r}")
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = _scalar(node.operand)
        if not isinstance(v, (int, float)):
            raise LiteralError("sign applied to a non-number")
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.Name) and node.id in _NAMES:
        return _NAMES[node.id]
    if isinstance(node, ast.Attribute) and _call_name(node) in ("np.nan", "numpy.nan", "math.nan"):
        return math.nan
    if isinstance(node, ast.Attribute) and _call_name(node) in ("np.inf", "numpy.inf", "math.inf"):
        return math.inf
    if isinstance(node, ast.Call) and _WRAPPER_CALL.match(_call_name(node.func)) and len(node.args) == 1:
        v = _scalar(node.args[0])
        if isinstance(v, str):
            n = parse_number(v)
            if n is None:
                raise LiteralError(f"{_call_name(node.func)}({v!r}) is not a number")
            return n
        return v
    raise LiteralError(f"unsupported value {ast.dump(node)[:60]}")


def parse_printed_dict(text: str) -> tuple[dict[str, Any], list[str], bool]:
    """Evaluate a printed Python dict of scalars safely (``ast.parse``, no ``eval``).

    Returns ``(values, dropped, quoted)``: the name -> value mapping, the keys whose values are not scalars (nested
    dicts, lists, objects), which the caller reports, and whether some numbers were printed as strings (rounded).
    Raises :class:`LiteralError` if ``text`` is not a dict with
    string keys at all (syntax error, truncated line, set, ...).
    """
    text = _GRAD_FN.sub("", text)
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except (SyntaxError, ValueError) as exc:
        raise LiteralError(f"not a Python literal ({getattr(exc, 'msg', exc)})") from None
    node = tree.body
    if not isinstance(node, ast.Dict):
        raise LiteralError("not a dict")
    out: dict[str, Any] = {}
    dropped: list[str] = []
    quoted: list[bool] = []
    for k, v in zip(node.keys, node.values):
        if not (isinstance(k, ast.Constant) and isinstance(k.value, str)):
            raise LiteralError("a key is not a string")
        try:
            out[k.value] = _scalar(v, quoted)
        except LiteralError:
            dropped.append(k.value)
    return out, dropped, bool(quoted)


class Braces:
    """Where a printed ``{...}`` that starts a text closes, fed one piece at a time (a dict printed over many lines is
    scanned once, not again from its start at every line): brackets inside quoted strings do not count."""

    def __init__(self) -> None:
        self.depth = 0
        self.quote = ""
        self.escaped = False

    def feed(self, text: str) -> int | None:
        """The index in ``text`` just after the bracket that closes the first one fed, or None when it is still
        open after ``text``."""
        for i, ch in enumerate(text):
            if self.quote:
                if self.escaped:
                    self.escaped = False
                elif ch == "\\":
                    self.escaped = True
                elif ch == self.quote:
                    self.quote = ""
            elif ch in "'\"":
                self.quote = ch
            elif ch in "{[(":
                self.depth += 1
            elif ch in "}])":
                self.depth -= 1
                if self.depth == 0:
                    return i + 1
        return None


def parse_printed_config(text: str) -> dict[str, Any]:
    """A printed (``pprint``) run config: a dict of nested dicts, lists, strings, numbers, booleans and None,
    evaluated with :func:`ast.literal_eval` (never ``eval``). Raises :class:`LiteralError` if it is not one."""
    try:
        value = ast.literal_eval(text.strip())
    except (SyntaxError, ValueError, TypeError, MemoryError, RecursionError) as exc:
        raise LiteralError(f"not a Python literal ({getattr(exc, 'msg', exc)})") from None
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise LiteralError("not a dict with string keys")
    return value


def number_or_text(cell: str) -> Any:
    """A CSV cell as a record value: a number when it reads as one, else the text itself."""
    n = parse_number(cell)
    return cell if n is None else n
