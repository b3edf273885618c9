"""What a tracker already holds of a run, per key: the one answer catch-up, replay, resume and migrate ask.

"The last step of the run" is not "every point up to that step": a batch can land in part (MLflow writes a big
batch as several requests, by key; a killed server leaves some keys complete and others not), so a tracker can
hold key A up to step 499 and key B up to step 7. :class:`Holdings` keeps, per key, the exact multiset of steps the
tracker holds, read back from the tracker itself (each sink's :meth:`~trackbridge.tracking.sink.Sink.held`), and
:meth:`Holdings.lacking` cuts a stream of records down to the points the tracker does not have: nothing written
twice, nothing left out.

Matching is one to one: a key logged twice at one step in the spool needs two points at that step in the tracker.
Steps are matched in the order the records come (a merge over each key's sorted steps, so memory stays at one
integer per held point); a key whose steps go backwards falls back to a lookup.
"""
from __future__ import annotations

import math
from array import array
from bisect import bisect_left
from collections import Counter
from dataclasses import dataclass
from typing import Iterable, Iterator

from ..record import Record


class _Key:
    __slots__ = ("steps", "pos", "prev", "taken", "skipped")

    def __init__(self, steps: array) -> None:
        self.steps = steps          # sorted
        self.pos = 0                # steps[:pos] are matched or passed over by the merge
        self.prev = -1              # the last step asked about
        self.taken: set[int] = set()     # indexes >= pos matched out of order
        self.skipped: set[int] = set()   # indexes < pos passed over unmatched (points the records lacked so far)


class Holdings:
    """Per key, the steps a tracker holds (a multiset). Build with :meth:`add` or :meth:`from_pairs`."""

    def __init__(self) -> None:
        self._raw: dict[str, array] = {}
        self._keys: dict[str, _Key] | None = None
        self.points = 0

    @classmethod
    def from_pairs(cls, pairs: Iterable[tuple[str, int]]) -> "Holdings":
        h = cls()
        for key, step in pairs:
            h.add(key, step)
        return h

    @classmethod
    def from_records(cls, records: Iterable[Record]) -> "Holdings":
        """The holdings of a tracker read back as records (each metric of a record with a step is one point)."""
        h = cls()
        for rec in records:
            if rec.step is None:
                continue
            for key, value in rec.metrics.items():
                if value is not None:
                    h.add(key, rec.step)
        return h

    def add(self, key: str, step: int) -> None:
        arr = self._raw.get(key)
        if arr is None:
            arr = self._raw[key] = array("q")
        arr.append(int(step))
        self.points += 1
        self._keys = None

    def _ready(self) -> dict[str, _Key]:
        if self._keys is None:
            self._keys = {k: _Key(array("q", sorted(a))) for k, a in self._raw.items()}
        return self._keys

    # -- questions -------------------------------------------------------------------------------------------
    def keys(self) -> list[str]:
        return list(self._raw)

    def last_step(self, key: str | None = None) -> int | None:
        """The highest step held (of ``key``, or of any key)."""
        arrs = [self._raw[key]] if key is not None and key in self._raw else (
            [] if key is not None else list(self._raw.values()))
        highs = [max(a) for a in arrs if len(a)]
        return max(highs) if highs else None

    def take(self, key: str, step: int) -> bool:
        """True when the tracker holds a point of ``key`` at ``step`` not matched before (and matches it)."""
        k = self._ready().get(key)
        if k is None:
            return False
        steps = k.steps
        if step >= k.prev:
            k.prev = step
            n = len(steps)
            while k.pos < n and steps[k.pos] < step:
                if k.pos not in k.taken:
                    k.skipped.add(k.pos)
                k.pos += 1
            while k.pos < n and steps[k.pos] == step:
                i = k.pos
                k.pos += 1
                if i not in k.taken:
                    return True
            return False
        # a step lower than one asked before: a point passed over unmatched, or one the merge has not reached
        i = bisect_left(steps, step)
        while i < len(steps) and steps[i] == step:
            if i < k.pos and i in k.skipped:
                k.skipped.discard(i)
                return True
            if i >= k.pos and i not in k.taken:
                k.taken.add(i)
                return True
            i += 1
        return False

    def lacking(self, rec: Record) -> Record | None:
        """``rec`` cut down to the points the tracker lacks (``None`` when it holds them all). Records without a step
        are kept whole (nothing to match them by)."""
        if rec.step is None or not self._raw:
            return rec
        keep = {k: v for k, v in rec.metrics.items() if v is None or not self.take(k, rec.step)}
        if len(keep) == len(rec.metrics):
            return rec
        if not any(v is not None for v in keep.values()):
            return None
        return Record(step=rec.step, wall_time=rec.wall_time, metrics=keep,
                      derived=[d for d in rec.derived if d in keep], axis=rec.axis)

    def filter(self, records: Iterable[Record], counts: dict[str, int] | None = None) -> Iterator[Record]:
        """The records cut down to what the tracker lacks; ``counts`` (if given) gets ``points_held`` and
        ``records_held`` (records held in full) added up."""
        for rec in records:
            out = self.lacking(rec)
            if counts is not None and out is not rec:
                counts["points_held"] = counts.get("points_held", 0) + len(rec.metrics) - (
                    len(out.metrics) if out is not None else 0)
                if out is None:
                    counts["records_held"] = counts.get("records_held", 0) + 1
            if out is not None:
                yield out

    def counts(self) -> "Counter[tuple[str, int]]":
        """How many points the tracker holds per ``(key, step)``."""
        out: Counter[tuple[str, int]] = Counter()
        for key, arr in self._raw.items():
            for step in arr:
                out[key, step] += 1
        return out

    def __len__(self) -> int:
        return self.points

    def __repr__(self) -> str:
        return f"Holdings({len(self._raw)} keys, {self.points} points, last step {self.last_step()})"


@dataclass
class Audit:
    """What a tracker holds of a stretch of the run against what it was sent (:func:`audit`): points it lacks,
    points it holds more often than they were logged (doubled), the first of each, the points compared, and where a
    catch-up of what it lacks must start (``from_seq``, the number of the first record with a point it lacks, and
    ``from_step``, the lowest step of the records from there on)."""

    lacking: int = 0
    doubled: int = 0
    compared: int = 0
    first_lacking: tuple[str, int] | None = None
    first_doubled: tuple[str, int] | None = None
    from_seq: int | None = None
    from_step: int | None = None

    @property
    def whole(self) -> bool:
        """Every point held exactly as often as it was logged."""
        return not (self.lacking or self.doubled)

    def __str__(self) -> str:
        parts = []
        if self.lacking:
            k, s = self.first_lacking or ("?", -1)
            parts.append(f"lacks {self.lacking} point(s) (first: {k!r} at step {s})")
        if self.doubled:
            k, s = self.first_doubled or ("?", -1)
            parts.append(f"holds {self.doubled} point(s) twice (first: {k!r} at step {s})")
        return " and ".join(parts) or f"holds all {self.compared} point(s) once"


def audit(records: Iterable[tuple[int, Record]], held: Holdings, *, since: int | None = None, nan: bool = True,
          skip_keys: Iterable[str] = (), skip_steps: Iterable[int] = ()) -> Audit:
    """Compare the points of ``records`` (``(seq, record)``; steps ``>= since``) with what a tracker ``held`` (read
    back with the same ``since``), one to one per key and step. Numbers only: a key that ever holds text or a
    histogram in the records is left out of the comparison (trackers keep those in forms of their own), as are
    ``skip_keys`` (keys the sink said it left out), ``skip_steps`` (records it left out for their step) and, for a
    tracker that cannot store them (``nan=False``), NaN and infinities. Keys the tracker holds that the records never
    had are not counted."""
    want: Counter[tuple[str, int]] = Counter()
    first_at: dict[tuple[str, int], int] = {}       # (key, step) -> the first record number holding it
    seqs, steps_seen = array("q"), array("q")
    odd: set[str] = set(skip_keys)
    steps = set(skip_steps)
    for seq, rec in records:
        step = rec.step
        if step is None or (since is not None and step < since) or step in steps:
            continue
        seqs.append(seq)
        steps_seen.append(step)
        for key, value in rec.metrics.items():
            if value is None or key in odd:
                continue
            if not isinstance(value, (int, float)):     # bool included
                odd.add(key)
                continue
            if not nan and not math.isfinite(value):
                continue
            pair = (key, step)
            if pair not in first_at:
                first_at[pair] = seq
            want[pair] += 1
    got = held.counts()
    out = Audit()
    for pair, seq in first_at.items():
        if pair[0] in odd:
            continue
        n, h = want[pair], got.get(pair, 0)
        out.compared += n
        if h < n:
            out.lacking += n - h
            if out.from_seq is None or seq < out.from_seq:
                out.first_lacking, out.from_seq = pair, seq
        elif h > n:
            out.doubled += h - n
            out.first_doubled = out.first_doubled or pair
    if out.from_seq is not None:
        out.from_step = min(st for sq, st in zip(seqs, steps_seen) if sq >= out.from_seq)
    return out


__all__ = ["Audit", "Holdings", "audit"]
