"""What a tracker already holds of a run, per key: the one answer catch-up, replay, resume and migrate ask.

"The last step of the run" is not "every point up to that step": a batch can land in part (MLflow writes a big
batch as several requests, by key; a killed server leaves some keys complete and others not), so a tracker can
hold key A up to step 499 and key B up to step 7. :class:`Holdings` keeps, per key, the exact multiset of steps the
tracker holds, read back from the tracker itself (each sink's :meth:`~trackbridge.sinks.base.Sink.held`), and
:meth:`Holdings.lacking` cuts a stream of records down to the points the tracker does not have: nothing written
twice, nothing left out.

Matching is one to one: a key logged twice at one step in the spool needs two points at that step in the tracker.
Steps are matched in the order the records come (a merge over each key's sorted steps, so memory stays at one
integer per held point); a key whose steps go backwards falls back to a lookup.
"""
from __future__ import annotations

from array import array
from bisect import bisect_left
from typing import Iterable, Iterator

from .record import Record


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

    def __len__(self) -> int:
        return self.points

    def __repr__(self) -> str:
        return f"Holdings({len(self._raw)} keys, {self.points} points, last step {self.last_step()})"


__all__ = ["Holdings"]
