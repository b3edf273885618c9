"""Presets: what practitioners look at first, as canonical names and patterns over them.

The presets and the "look alike, not the same" pairs are facts of the canonical schema: ``presets:`` and
``look_alike:`` of ``mappings/canonical.yaml`` (read through :mod:`trackbridge.schema.facts`). Patterns are
shell-style (``*`` matches across ``/``). A name with a split prefix (``eval/``, ``test/``: canonical.yaml
``splits:``) matches a pattern when the name without the prefix does. Within a preset, the order of the patterns is
the order of the charts in the report. What each framework calls these: ``mappings/`` (each entry cites the
framework source file and release it was read from).
"""
from __future__ import annotations

from fnmatch import fnmatchcase
from typing import Callable, Iterable

from ..schema.facts import LOOK_ALIKE, SPLITS
from ..schema.facts import PRESETS as _PRESETS

# preset name -> its canonical names and patterns, in report order
PRESETS: dict[str, list[str]] = {name: list(p.metrics) for name, p in _PRESETS.items()}

# Names that look alike in trackers but are different quantities: never overlaid; the report says so when one run
# has one and another run the other. (name, other name, how they differ)
LOOK_ALIKES: list[tuple[str, str, str]] = [(la.a, la.b, la.why) for la in LOOK_ALIKE]


def strip_split(name: str) -> str:
    """A canonical name without its split prefix (``eval/loss/total`` -> ``loss/total``)."""
    return SPLITS.strip(name)


def _match(name: str, pattern: str) -> bool:
    return fnmatchcase(name, pattern) or fnmatchcase(strip_split(name), pattern)


def preset_of(name: str) -> str | None:
    for preset, patterns in PRESETS.items():
        if any(_match(name, p) for p in patterns):
            return preset
    return None


def order_key(name: str) -> tuple:
    """Preset order, then pattern order inside the preset, then train before eval/test, then the name."""
    for i, (preset, patterns) in enumerate(PRESETS.items()):
        for j, p in enumerate(patterns):
            if _match(name, p):
                return (i, j, name != strip_split(name), name)
    return (len(PRESETS), 0, name != strip_split(name), name)


def select(spec: "None | str | Iterable[str]", available: Iterable[str], *,
           is_axis: Callable[[str], bool] = lambda n: False, upgrade: Callable[[str], str] | None = None,
           renamed: dict[str, str] | None = None) -> tuple[list[str], list[str]]:
    """The metrics to chart, in report order, and what was asked for but found in no run.

    ``spec``: ``None`` (every metric of every run except progress axes), a preset name, a canonical name, a
    pattern (``kl/*``), or a comma-separated list or a list of those. ``upgrade``: an older canonical name, split
    prefix and all, -> the current one (``CanonicalSchema.upgrade``), so a name from an older dashboard still
    finds its metric; each such
    name is added to ``renamed`` (old -> new) for the caller to report."""
    avail = list(dict.fromkeys(available))
    if spec is None:
        return sorted((n for n in avail if not is_axis(n)), key=order_key), []
    items = [s.strip() for s in (spec.split(",") if isinstance(spec, str) else
                                 [x for part in spec for x in str(part).split(",")]) if s.strip()]
    chosen: dict[str, None] = {}
    missing: list[str] = []
    for item in items:
        if item.lower() in PRESETS:
            item = item.lower()
            hits = [n for n in avail if any(_match(n, p) for p in PRESETS[item])]
            hits.sort(key=order_key)
            if not hits:
                missing.append(f"{item} (preset: none of its metrics is in any run)")
        elif any(c in item for c in "*?["):
            hits = sorted((n for n in avail if _match(n, item)), key=order_key)
            if not hits:
                missing.append(item)
        else:
            asked = item
            if item not in avail and upgrade is not None:
                item = upgrade(item)
            hits = [item] if item in avail else []
            if hits and item != asked and renamed is not None:
                renamed[asked] = item
            if not hits:
                missing.append(asked if item == asked else f"{asked} (now {item})")
        chosen.update(dict.fromkeys(hits))
    return list(chosen), missing
