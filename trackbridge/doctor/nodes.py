"""A parsed condition (:class:`Spec`) and what every condition being evaluated has (:class:`Node`), shared by the
primitives and the composites."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["Spec", "Node", "PRIMITIVES", "COMPOSITES"]

PRIMITIVES = ("above", "below", "sign", "spike", "collapse", "drop", "rise", "no_gain", "flat", "ratio", "nonfinite")
COMPOSITES = ("all", "any", "then")


@dataclass
class Spec:
    """A parsed condition: its kind, its parameters (as written) and, for all/any/then, its parts."""

    kind: str
    params: dict[str, Any]
    parts: list["Spec"] = field(default_factory=list)
    line: int = 0

    def roles(self) -> set[str]:
        if self.parts:
            return set().union(*(p.roles() for p in self.parts))
        return {self.params[k] for k in ("of", "to") if k in self.params and (k == "of" or self.kind == "ratio")}

    def needed(self, bound: set[str]) -> bool:
        """Whether the condition can be judged with the roles ``bound``: a primitive needs its roles, all/then
        every part, any one of its parts (so a check whose alternatives read different series runs on those the
        run logs)."""
        if not self.parts:
            return self.roles() <= bound
        if self.kind == "any":
            return any(p.needed(bound) for p in self.parts)
        return all(p.needed(bound) for p in self.parts)

    def config_names(self) -> set[str]:
        if self.parts:
            return set().union(*(p.config_names() for p in self.parts))
        return {self.params["config"]} if "config" in self.params else set()

    def text(self) -> str:
        """The condition in one line, as written (for docs and ``--json``)."""
        if self.parts:
            inner = f" {self.kind} ".join(f"({p.text()})" for p in self.parts) if self.kind != "then" else \
                " then ".join(f"({p.text()})" for p in self.parts)
            w = self.params.get("within")
            return inner + (f" within {w} steps" if w is not None else "")
        args = ", ".join(f"{k}={v}" for k, v in self.params.items() if k != "of")
        return f"{self.kind}({self.params['of']}{', ' + args if args else ''})"


class Node:
    """A condition being evaluated (:mod:`.conditions` says what state every node keeps)."""

    kind = ""
    parts_ = False          # a composite (its update() judges its parts); a primitive is judged as points arrive

    def __init__(self) -> None:
        self.fresh = False
        self.holds = False
        self.last_true: float | None = None
        self.since: float | None = None
        self.detail: dict[str, Any] | None = None
        self.applicable = True

    def roles(self) -> set[str]:
        raise NotImplementedError

    def start_record(self) -> None:
        self.fresh = False

    def update(self, step: float) -> None:
        """Composites: judge the record just fed (primitives are judged as their points arrive)."""

    def active(self, step: float, within: int | None) -> bool:
        if within is None:
            return self.holds
        return self.last_true is not None and step - within <= self.last_true <= step
