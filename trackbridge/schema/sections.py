"""The compiled form of canonical.yaml's fact sections: ``splits``, ``axes``, ``presets`` and ``look_alike``
(parsed by :mod:`.canonical`, read as constants through :mod:`.facts`)."""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property


@dataclass(frozen=True)
class Split:
    """One entry of canonical.yaml `splits:`: the default split (train) has no canonical prefix, the others one."""
    name: str
    prefix: str | None                      # "eval/"; None for the default split
    spellings: tuple[str, ...] = ()         # raw-name prefixes frameworks and trackers write ("eval/", "eval_")
    default: bool = False


@dataclass(frozen=True)
class Splits:
    """canonical.yaml `splits:`, in declaration order, with the lookups the code needs."""
    splits: tuple[Split, ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.splits)

    @cached_property
    def default(self) -> str | None:
        return next((s.name for s in self.splits if s.default), None)

    @cached_property
    def prefixes(self) -> tuple[str, ...]:
        """The canonical prefixes of the splits that have one: ``("eval/", "test/")``."""
        return tuple(s.prefix for s in self.splits if s.prefix)

    @cached_property
    def spellings(self) -> tuple[tuple[str, str], ...]:
        """(raw prefix, split) pairs, longest prefix first: ``(("eval/", "eval"), ("eval_", "eval"), ...)``."""
        pairs = [(p, s.name) for s in self.splits for p in s.spellings]
        return tuple(sorted(pairs, key=lambda ps: -len(ps[0])))

    def split_canonical(self, name: str) -> tuple[str | None, str]:
        """(split, rest) of a canonical name with a split prefix (``eval/loss/total``), else (None, name)."""
        for s in self.splits:
            if s.prefix and name.startswith(s.prefix) and len(name) > len(s.prefix):
                return s.name, name[len(s.prefix):]
        return None, name

    def strip(self, name: str) -> str:
        """A canonical name without its split prefix."""
        return self.split_canonical(name)[1]

    def of_raw(self, name: str) -> str | None:
        """The split a raw (untranslated) name belongs to by its spelling; the default split otherwise."""
        for prefix, split in self.spellings:
            if name.startswith(prefix):
                return split
        return self.default


@dataclass(frozen=True)
class Axis:
    """One entry of canonical.yaml `axes:` (the x axes of compare)."""
    name: str
    label: str
    metric: str | None = None               # the canonical name holding the axis as a logged value
    per_step: str | None = None             # its per-step increment, summed when a run logs no counter


@dataclass(frozen=True)
class Preset:
    """One entry of canonical.yaml `presets:`: canonical names and shell-style patterns, in report order."""
    name: str
    description: str
    metrics: tuple[str, ...]


@dataclass(frozen=True)
class LookAlike:
    """One entry of canonical.yaml `look_alike:`: two names that look alike but are different quantities."""
    a: str
    b: str
    why: str
