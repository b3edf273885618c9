"""What a condition's numbers say, in words (the evidence of a finding's stretch)."""
from __future__ import annotations

import math
from typing import Any, Mapping

from .conditions import Composite
from .nodes import Node
from .primitives import Primitive

__all__ = ["fmt", "step_text", "describe"]


def fmt(v: Any) -> str:
    """A number as a finding shows it: 4 significant digits, no trailing zeros."""
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return str(v)
    if not math.isfinite(v):
        return "nan" if v != v else ("inf" if v > 0 else "-inf")
    if v == int(v) and abs(v) < 1e15:
        return str(int(v))
    return f"{v:.4g}"


def step_text(s: Any) -> str:
    return fmt(s) if s is not None else "?"


def describe(node: Node, names: Mapping[str, str], detail: Mapping[str, Any] | None) -> str:
    """What a node's detail says, in words, with the series' canonical names (``names``: role -> name)."""
    if detail is None:
        return ""
    if isinstance(node, Composite):
        parts = detail.get("parts") or []
        texts = [describe(p, names, d) for p, d in zip(node.parts, parts) if d]
        joint = "; then " if node.kind == "then" else "; "
        return joint.join(t for t in texts if t)
    assert isinstance(node, Primitive)
    name = names.get(node.role, node.role)
    d = detail
    at = f" at step {step_text(d.get('at'))}" if d.get("at") is not None else ""
    n = int(d.get("points", 1))
    span = f" for {n} points" if n > 1 else ""
    k = node.kind
    if k in ("above", "below"):
        what = f"|{name}|" if getattr(node, "abs", False) else name
        extreme = ("highest" if k == "above" else "lowest") if n > 1 else "value"
        return f"{what} {k} {fmt(d['bound'])}{span} ({extreme} {fmt(d['value'])}{at})"
    if k == "sign":
        word = "negative" if getattr(node, "negative", True) else "positive"
        extreme = ("most negative" if word == "negative" else "highest") if n > 1 else "value"
        return f"{name} {word}{span} ({extreme} {fmt(d['value'])}{at})"
    if k == "spike":
        ratio = f", {fmt(d['ratio'])}x" if "ratio" in d else ""
        return (f"{name} = {fmt(d['value'])}{at}{ratio} the {d.get('baseline_kind', 'median')} "
                f"{fmt(d['baseline'])} of the {d.get('window')} points before")
    if k == "collapse":
        return (f"{name} fell to {fmt(d['value'])}{at}, {fmt(100 * d['fraction'])}% of its early level "
                f"{fmt(d['early'])}" + (f" (below {fmt(100 * getattr(node, 'to', 0))}%{span})" if n > 1 else ""))
    if k == "drop":
        return (f"{name} fell to {fmt(d['mean'])} (mean of {d['window']} points{at}) from its peak "
                f"{fmt(d['peak'])} (step {step_text(d.get('peak_at'))})")
    if k == "rise":
        return f"{name} rose to {fmt(d['mean'])} (mean of {d['window']} points{at}) from {fmt(d['early'])}"
    if k == "no_gain":
        return (f"{name}: the best of its last {d['window']} points, {fmt(d['best_recent'])}{at}, is no better "
                f"than {fmt(d['best_before'])} before them ({d['direction']} is better)")
    if k == "ratio":
        other = names.get(getattr(node, "other", ""), "")
        rel = "above" if getattr(node, "up", True) else "below"
        extreme = ("highest" if rel == "above" else "lowest") if n > 1 else "value"
        return f"{name} / {other} {rel} {fmt(d['bound'])}{span} ({extreme} {fmt(d['value'])}{at})"
    if k == "nonfinite":
        return f"{name} = {fmt(d['value'])}{at}"
    return f"{name}: {d}"
