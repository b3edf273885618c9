"""Hub-and-spoke translation of logged metric dicts (API fixed; engine being written)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Translation:
    metrics: dict[str, Any]                                   # translated names -> values (order kept)
    unmapped: list[str] = field(default_factory=list)         # input keys passed through unchanged
    approximate: dict[str, str] = field(default_factory=dict)  # output key -> reason the translation is approximate
    derived: list[str] = field(default_factory=list)          # output keys computed by derived rules
    source: str = ""                                          # resolved source, e.g. "verl/ppo@v0.4.0..v0.7.0"
    mapped: int = 0                                           # number of input keys that were translated
