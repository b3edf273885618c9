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

Two modules, one language: :mod:`.syntax` is what a formula may be (the tokenizer's name syntax, the AST, the
parser, which checks each function's arity and the size bounds, and the function table), :mod:`.evaluate` what it
means (the evaluator's rules for bad values, and the walks over a parsed formula); the evaluator takes its functions
from the syntax's table, so the two cannot disagree on them. Read them in that order.
"""
from __future__ import annotations

from .evaluate import Env, config_of, evaluate, names_of, rename, stateful_of, to_text
from .evaluate import _rename as _rename  # the engine's and the rules' template filling
from .syntax import (
    FUNCTIONS,
    MAX_DEPTH,
    MAX_LENGTH,
    STATEFUL,
    BinOp,
    Call,
    Config,
    ExprError,
    Name,
    Node,
    NoValue,
    Num,
    Stateful,
    Token,
    Unary,
    parse,
    tokenize,
)

__all__ = [
    "ExprError", "NoValue", "Node", "Num", "Name", "Config", "Unary", "BinOp", "Call", "Stateful", "Token",
    "parse", "tokenize", "names_of", "config_of", "stateful_of", "rename", "evaluate", "Env", "to_text",
    "FUNCTIONS", "STATEFUL", "MAX_LENGTH", "MAX_DEPTH",
]
