"""What a translation did to the names: :class:`Report` (the bookkeeping every path shares) and :class:`Translation`
(one translated dict)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Report:
    """What happened to the names: the one bookkeeping type of every path (a single dict's :class:`Translation`, a
    whole run's :class:`trackbridge.pipeline.Stats`)."""

    source: str = ""                                           # resolved source, e.g. "verl/ppo@v0.4.0..v0.7.0"
    mapped: int = 0                                            # number of input keys that were translated
    unmapped: list[str] = field(default_factory=list)          # input keys passed through unchanged
    approximate: dict[str, str] = field(default_factory=dict)  # output key -> why the translation is approximate
    derived: list[str] = field(default_factory=list)           # output keys computed by derived rules
    renamed: dict[str, str] = field(default_factory=dict)      # input key -> output key, where they differ
    conflicts: dict[str, str] = field(default_factory=dict)    # input key kept as is because its output was taken
    notes: list[str] = field(default_factory=list)

    def merge(self, other: "Report") -> None:
        """Add ``other``'s bookkeeping to this one (a run's total over its records; each name and note once)."""
        self.mapped += other.mapped
        if other.unmapped:      # a run merges every record's report: set lookups, not list scans
            seen = set(self.unmapped)
            self.unmapped += [k for k in other.unmapped if k not in seen]
        for k, v in other.approximate.items():
            self.approximate.setdefault(k, v)
        if other.derived:
            seen = set(self.derived)
            self.derived += [k for k in other.derived if k not in seen]
        self.renamed.update(other.renamed)
        self.conflicts.update(other.conflicts)
        self.notes += [n for n in other.notes if n not in self.notes]


@dataclass
class Translation(Report):
    """One translated dict: ``metrics`` in the target's names (input order kept, derived values after) and its
    bookkeeping."""

    metrics: dict[str, Any] = field(default_factory=dict)
    #: the values by canonical name (a key with none under its own), kept when asked for: what the derived rules
    #: read (the pipeline's Derive stage); None otherwise
    canonical: dict[str, Any] | None = field(default=None, repr=False, compare=False)

    def report(self) -> dict[str, Any]:
        """The bookkeeping as a plain dict: ``mapped``, ``unmapped``, ``approximate``, ``source``, and ``derived`` and
        ``conflicts`` when there are any."""
        out = {"mapped": self.mapped, "unmapped": list(self.unmapped), "approximate": dict(self.approximate),
               "source": self.source}
        if self.derived:
            out["derived"] = list(self.derived)
        if self.conflicts:
            out["conflicts"] = dict(self.conflicts)
        return out
