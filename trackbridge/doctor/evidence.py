"""The evidence of a finding's stretch in words: :func:`.words.describe` for every condition it knows, and the words
of the conditions added since (``flat``, a ``collapse`` measured from its peak), for a condition and for
the composites that hold them."""
from __future__ import annotations

from typing import Any, Mapping

from .conditions import Composite
from .nodes import Node
from .words import describe, fmt, step_text

__all__ = ["evidence"]


def evidence(node: Node, names: Mapping[str, str], detail: Mapping[str, Any] | None) -> str:
    """What ``node``'s ``detail`` says, in words, with the series' canonical names (``names``: role -> name)."""
    if detail is None:
        return ""
    if isinstance(node, Composite):
        parts = detail.get("parts") or []
        texts = [evidence(p, names, d) for p, d in zip(node.parts, parts) if d]
        return ("; then " if node.kind == "then" else "; ").join(t for t in texts if t)
    name = names.get(getattr(node, "role", ""), getattr(node, "role", ""))
    d = detail
    at = f" at step {step_text(d.get('at'))}" if d.get("at") is not None else ""
    n = int(d.get("points", 1))
    if node.kind == "flat":
        return (f"{name}: the mean of its last {d['window']} points, {fmt(d['mean'])}{at}, is no better than the "
                f"mean of its first {d['window']}, {fmt(d['first'])} (by more than {fmt(d['margin'])}, twice its "
                f"noise; {d['direction']} is better)")
    if node.kind == "collapse" and d.get("reference") == "peak":
        span = f" for {n} points" if n > 1 else ""
        return (f"{name} fell to {fmt(d['value'])}{at}, {fmt(100 * d['fraction'])}% of its peak level "
                f"{fmt(d['early'])} (below {fmt(100 * getattr(node, 'to', 0))}%{span})")
    return describe(node, names, detail)
