"""A user's mapping entries against the shipped ones: one rule, the derived rules' (``override: true``).

A user file (``mappings=[PATH]``, ``--mappings PATH``) may add entries to a shipped framework. One of them *collides*
with a shipped entry when both cover some release and trainer (with the same ``when`` condition) and

* both claim the same key (framework -> canonical is ambiguous), or
* both are written back for the same canonical name under different keys (canonical -> framework is ambiguous).

Without ``override: true`` a collision is an error at the user's file and line, naming the shipped entry and the
fix. With it the user's entry wins where the two overlap, and only there: a shipped entry claiming the same key is
left out for the releases and trainers the user's entry covers (kept for the others); a shipped entry writing the
same canonical name still reads its own key there but is no longer written (``reverse: false`` for the overlap).
Each override is said once (:attr:`Registry.overrides`; ``trackbridge mappings lint`` prints them). ``override`` in
a shipped file is an error (the shipped files settle their own collisions); ``override: true`` on an entry that
collides with nothing changes nothing. Derived rules follow the same rule (:mod:`trackbridge.derive.rules`).
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from .model import OPEN, Entry, FrameworkMapping
from .yamlfile import MappingError


def apply_overrides(fw: FrameworkMapping, user_files: set[str], errors: list[MappingError]) -> list[str]:
    """Settle the collisions between ``fw``'s entries from ``user_files`` and its shipped entries (module
    docstring), in place; returns one sentence per override applied. Problems go to ``errors``."""
    said: list[str] = []
    users = [e for e in fw.entries if e.file in user_files]
    shipped = [e for e in fw.entries if e.file not in user_files]
    for e in shipped:
        if e.override:
            errors.append(MappingError("`override` is for user files (a shipped file settles its own collisions)",
                                       file=e.file, line=e.line, entry=e.key))
    if not users:
        return said
    kept_users: list[Entry] = []
    for u in users:
        hits = [(s, why) for s in shipped for why in (_collision(u, s),) if why is not None]
        if not hits:
            kept_users.append(u)
            continue
        if not u.override:
            for s, why in hits:
                errors.append(MappingError(_problem(fw, u, s, why), file=u.file, line=u.line, entry=u.key))
            continue           # left out, so that the shipped file is not blamed for the same collision again
        kept_users.append(u)
        hit_ids = {id(s): why for s, why in hits}
        out: list[Entry] = []
        for s in shipped:
            found = hit_ids.get(id(s))
            if found is None:
                out.append(s)
                continue
            outside, inside = _split(fw, s, u)
            out += outside
            if found == "reverse" and inside is not None:
                out.append(replace(inside, reverse=False))     # still read, no longer written back there
            said.append(_said(fw, u, s, found))
        shipped = out
    fw.entries = [*shipped, *kept_users]
    return said


def _overlap(a: Entry, b: Entry) -> bool:
    if a.until < b.since or b.until < a.since:
        return False
    if a.trainers is not None and b.trainers is not None and not (a.trainers & b.trainers):
        return False
    return a.when == b.when


def _collision(u: Entry, s: Entry) -> str | None:
    if not _overlap(u, s):
        return None
    if u.key == s.key:
        return "key"
    if u.reverse and s.reverse and u.canonical == s.canonical:
        return "reverse"
    return None


def _split(fw: FrameworkMapping, s: Entry, u: Entry) -> tuple[list[Entry], Entry | None]:
    """``s`` cut into the pieces ``u`` does not cover (releases before and after ``u``'s, and other trainers in
    between) and the piece it does."""
    lo, hi = max(s.since, u.since), min(s.until, u.until)
    outside: list[Entry] = []
    if s.since < lo:
        outside.append(replace(s, until=lo - 1))
    if hi < s.until:
        outside.append(replace(s, since=hi + 1))
    mine = s.trainers if s.trainers is not None else (frozenset(fw.trainers) or None)
    if u.trainers is None or mine is None:
        return outside, replace(s, since=lo, until=hi)
    rest, both = mine - u.trainers, mine & u.trainers
    if rest:
        outside.append(replace(s, since=lo, until=hi, trainers=frozenset(rest)))
    return outside, (replace(s, since=lo, until=hi, trainers=frozenset(both)) if both else None)


def _where(fw: FrameworkMapping, a: Entry, b: Entry) -> str:
    """The releases and trainers two overlapping entries share, in words."""
    lo, hi = max(a.since, b.since), min(a.until, b.until)
    first, last = fw.release_name(lo), ("" if hi == OPEN else fw.release_name(hi))
    if lo == 0 and hi == OPEN:
        rel = "every release"
    elif hi == OPEN:
        rel = f"{first} onwards"
    else:
        rel = first if first == last else f"{first}..{last}"
    if a.trainers is None and b.trainers is None:
        tr = "every trainer"
    else:
        both = sorted((a.trainers or b.trainers or frozenset()) & (b.trainers or a.trainers or frozenset()))
        tr = ("trainer " if len(both) == 1 else "trainers ") + ", ".join(both)
    return f"{fw.name} {rel}, {tr}"


def _at(e: Entry) -> str:
    return f"{Path(e.file).name}:{e.line}"


def _problem(fw: FrameworkMapping, u: Entry, s: Entry, kind: str) -> str:
    where = _where(fw, u, s)
    if kind == "key":
        return (f"the shipped {_at(s)} already maps {s.key!r} (to {s.canonical!r}) for {where}; add `override: "
                f"true` to this entry to use yours there (the shipped entry keeps the other releases and trainers), "
                f"or narrow it with since/until/trainers")
    return (f"the shipped {_at(s)} already writes canonical {s.canonical!r} back as {s.key!r} for {where}; add "
            f"`reverse: false` to only read your key, or `override: true` to write {u.key!r} instead there (the "
            f"shipped key is still read)")


def _said(fw: FrameworkMapping, u: Entry, s: Entry, kind: str) -> str:
    where = _where(fw, u, s)
    if kind == "key":
        return f"{_at(u)}: {u.key!r} overrides the shipped {_at(s)} ({s.key!r} -> {s.canonical!r}) for {where}"
    return (f"{_at(u)}: {u.key!r} is written for canonical {u.canonical!r} instead of the shipped {s.key!r} "
            f"({_at(s)}, still read) for {where}")
