"""Each framework's keys voting for its trainers' releases (:mod:`trackbridge.detect`): for one framework and trainer,
the releases in which some entry logs each key, the newest contiguous block with the most votes, and the keys that
every call logs at a release but the run lacks."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, TypeVar

from ..schema.loader import Registry
from ..schema.model import Entry, FrameworkMapping
from ..schema.spec import Spec

T = TypeVar("T")


def _unprefixed(look: Callable[[str], list[T]], fw: FrameworkMapping, key: str) -> list[T]:
    """``look(key)``, else ``look`` of the key without one of the framework's tracker prefixes."""
    hits = look(key)
    if not hits:
        split, rest = fw.split_prefix(key)
        if split is not None:
            hits = look(rest)
    return hits


def _keys_of(fw: FrameworkMapping, key: str) -> list[tuple[Entry, dict[str, str] | None]]:
    return _unprefixed(fw.lookup, fw, key)


def _unmapped_scopes(fw: FrameworkMapping, key: str) -> list[tuple[frozenset | None, float, float]]:
    return _unprefixed(fw.unmapped_scopes, fw, key)


def _release_window(fw: FrameworkMapping, within: Spec | None) -> tuple[int, int]:
    """The releases (indices, inclusive) a detection may name: all, or those of the spec it is restricted to."""
    n_rel = len(fw.releases)
    if within is None:
        return 0, n_rel - 1
    hi = min(n_rel - 1, math.floor(min(within.hi, n_rel - 1)))
    lo = max(0, math.ceil(within.lo))
    return (min(lo, hi), hi)


@dataclass
class Candidate:
    """One framework/trainer and the release range (indices, inclusive) in which it explains the most keys."""

    framework: str
    trainer: str | None
    lo: int
    hi: int
    explained: int
    specific: int
    missing: int = 0          # keys the trainer logs on every call ("always") that are absent
    literal: int = 0          # keys named literally (not through a template) by the trainer's own entries

    def rank(self) -> tuple[int, int, int, int]:
        """The sort key of candidates: higher is better."""
        # literal names before the always-logged check: a key a trainer names itself is better evidence than a
        # template instance (GRPO's rewards/{reward_fn} also matches DPO's rewards/margins)
        return (self.explained, self.literal, -self.missing, self.specific)

    def describe(self, registry: Registry) -> str:
        """``FRAMEWORK[/TRAINER]@LO[..HI]`` with release names."""
        fw = registry.frameworks[self.framework]
        lo, hi = fw.release_name(self.lo), fw.release_name(self.hi)
        rng = lo if lo == hi else f"{lo}..{hi}"
        return f"{self.framework}{'/' + self.trainer if self.trainer else ''}@{rng}"


def _observed(fw: FrameworkMapping, keys: list[str]) -> set[str]:
    out: set[str] = set()
    for k in keys:
        split, rest = fw.split_prefix(k)
        out.add(rest if split is not None else k)
    return out


def _missing_always(fw: FrameworkMapping, trainer: str | None, observed: set[str], n_keys: int,
                    releases: list[int]) -> dict[int, int]:
    """For each of ``releases``, how many of the trainer's ``always`` keys (logged on every call at that release)
    are absent from ``observed`` (the keys, less their tracker prefixes: ``_observed``). Judged only on a key set
    large enough (``n_keys``) to be a whole logged record."""
    missing = dict.fromkeys(releases, 0)
    if trainer is None or n_keys < 4:
        return missing
    for k in fw.trainers.get(trainer, {}).get("always") or []:
        if k in observed:
            continue
        spans = [(e.since, e.until) for e in fw.exact_index.get(k, ()) if e.applies(trainer, -math.inf, math.inf)]
        for r in releases:
            if any(a <= r <= b for a, b in spans):
                missing[r] += 1
    return missing


def _best_for_framework(fw: FrameworkMapping, keys: list[str], trainers: list[str] | None = None,
                        within: Spec | None = None) -> tuple[Candidate | None, set[str]]:
    """The best candidate of one framework (over ``trainers``: all of its trainers by default), naming only
    releases inside ``within`` when given."""
    n_rel = len(fw.releases)
    w_lo, w_hi = _release_window(fw, within)
    names: list[str | None] = list(trainers or fw.trainers) or [None]
    counts = {t: [0] * n_rel for t in names}
    # a trainer explains keys only in the releases in which it exists
    full = {t: (fw.trainer_span(t) if t is not None else (0.0, float("inf"))) for t in names}
    span = {t: (a, min(b, n_rel - 1)) for t, (a, b) in full.items()}
    specific = {t: 0 for t in names}
    literal = {t: 0 for t in names}
    explained_any: set[str] = set()
    for key in keys:
        if key in fw.internal:
            continue
        hits = _keys_of(fw, key)
        if not hits:
            if _passthrough_votes(fw, key, names, span, counts):
                explained_any.add(key)
            continue
        explained_any.add(key)
        _entry_votes(hits, names, span, counts, specific, literal)
    best = _best_of(fw, keys, names, counts, specific, literal, w_lo, w_hi)
    return best, explained_any


def _passthrough_votes(fw: FrameworkMapping, key: str, names: list[str | None],
                       span: dict[str | None, tuple[float, float]], counts: dict[str | None, list[int]]) -> bool:
    """A key the framework logs without a canonical name (a passthrough item): evidence for the trainers and
    releases its items name (every release of every trainer when they name none). False when it is none."""
    n_rel = len(fw.releases)
    scopes = _unmapped_scopes(fw, key) if fw.passthrough else []
    if not scopes:
        return False
    for t in names:
        lo_t, hi_t = math.ceil(span[t][0]), int(span[t][1])
        row = counts[t]
        seen = [False] * n_rel
        for trs, a, b in scopes:
            if t is not None and trs is not None and t not in trs:
                continue
            for r in range(max(0, lo_t, math.ceil(a)), min(hi_t, int(min(b, n_rel - 1))) + 1):
                seen[r] = True
        for r in range(n_rel):
            row[r] += seen[r]
    return True


def _entry_votes(hits: list[tuple[Entry, dict[str, str] | None]], names: list[str | None],
                 span: dict[str | None, tuple[float, float]],
                 counts: dict[str | None, list[int]], specific: dict[str | None, int],
                 literal: dict[str | None, int]) -> None:
    """A key some entries translate: a vote for each release each trainer's entries cover it in (``specific``:
    an entry of that trainer's own; ``literal``: one that is no template)."""
    n_rel = len(next(iter(counts.values())))       # one row per trainer, one slot per release
    for t in names:
        covered = [False] * n_rel
        spec_hit = lit_hit = False
        for e, _ in hits:
            if t is not None and e.trainers is not None and t not in e.trainers:
                continue
            if e.since > span[t][1] or e.until < span[t][0]:
                continue
            if e.trainers is not None:
                spec_hit = True
                lit_hit = lit_hit or e.key_template is None
            hi = int(min(e.until, n_rel - 1, span[t][1]))
            for r in range(max(math.ceil(e.since), int(span[t][0])), hi + 1):
                covered[r] = True
        if spec_hit:
            specific[t] += 1
        if lit_hit:
            literal[t] += 1
        row = counts[t]
        for r in range(n_rel):
            if covered[r]:
                row[r] += 1


def _best_of(fw: FrameworkMapping, keys: list[str], names: list[str | None], counts: dict[str | None, list[int]],
             specific: dict[str | None, int], literal: dict[str | None, int], w_lo: int,
             w_hi: int) -> Candidate | None:
    """The trainer and span of releases that explain the most keys (inside the window), missing the fewest
    always-logged keys; ties broken by :meth:`Candidate.rank`."""
    best: Candidate | None = None
    observed: set[str] | None = None            # the keys less their tracker prefixes: made once, if needed
    for t in names:
        row = counts[t]
        top = max(row) if row else 0
        if top == 0:
            continue
        top = max(row[w_lo:w_hi + 1])
        if top == 0:
            continue
        best_rel = [r for r in range(w_lo, w_hi + 1) if row[r] == top]
        # of the releases that explain the most keys, keep those that miss the fewest always-logged keys
        if observed is None:
            observed = _observed(fw, keys)
        missing = _missing_always(fw, t, observed, len(keys), best_rel)
        fewest = min(missing.values())
        best_rel = [r for r in best_rel if missing[r] == fewest]
        lo, hi = best_rel[0], best_rel[-1]        # the span of releases that explain the most keys
        cand = Candidate(fw.name, t, lo, hi, top, specific[t])
        cand.missing = fewest
        cand.literal = literal[t]
        if best is None or cand.rank() > best.rank():
            best = cand
    return best
