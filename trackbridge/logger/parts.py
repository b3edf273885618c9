"""A node's part of a merged value (node pre-merge, :mod:`trackbridge.logger.nodes`): what the shares of one key at
one step on one node's ranks add up to, kept **exactly**, so that rank 0 merging the nodes' parts gets the very
value (to the last bit) it gets merging every rank's share itself (:func:`trackbridge.record.ranked.merge`).

A part does not know the reduction (that is chosen on rank 0, from every rank's stated reductions and the canonical
name), so it keeps what each of ``mean``, ``sum``, ``max``, ``min`` and ``value`` needs:

* sums (of the values, of the weights, of value x weight) as the exact **partial sums** of Shewchuk's algorithm, the
  one :func:`math.fsum` uses: a few floats whose exact sum is the exact sum of the terms, so ``fsum`` over the
  partials of every node equals ``fsum`` over every rank's terms (both are the correctly rounded exact sum); sums of
  integers as integers; non-finite terms as they are (``fsum``'s result from them depends on them alone);
* the largest and smallest value (the first one in rank order, as ``max()`` over the ranks' values keeps it), and
  whether a NaN was among them;
* the first value in rank order and its first four values (what ``value`` keeps and its note names), whether every
  value equals the first, the first value that is not a number (what the merge refuses, naming its rank), and the
  number of ranks.

A ``std`` needs every share's mean and count, and a ``dist`` every sample: shares logged with ``mean=`` or holding
samples travel to rank 0 as they are (:func:`raw_share`). The one case that differs from a flat merge: a name whose
reduction is ``dist`` logged as one *number* per rank (not a list of samples) with no reduction stated on the share
(a node cannot know the name's reduction): those numbers are in parts, which cannot be pooled, so rank 0's value is
logged and said, where a flat merge pools the numbers.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ..record import Histogram, decode_value, encode_value
from ..record.ranked import MergeError, Share, merge, same_value


def add_exact(partials: list[float], x: float) -> None:
    """Add the finite float ``x`` to ``partials`` (non-overlapping, increasing magnitude; their exact sum is the exact
    sum of everything added): Shewchuk's algorithm, the one behind :func:`math.fsum`."""
    i = 0
    for y in partials:
        if abs(x) < abs(y):
            x, y = y, x
        hi = x + y
        lo = y - (hi - x)
        if lo:
            partials[i] = lo
            i += 1
        x = hi
    partials[i:] = [x]


def _add(partials: list[float], special: list[float], x: float) -> None:
    if math.isfinite(x):
        add_exact(partials, x)
    else:
        special.append(x)


@dataclass
class Part:
    """The shares (or plain values) of one key at one step on a group of ranks, kept exactly (module docstring)."""

    ranks: set[int] = field(default_factory=set)
    first: tuple[int, Any] | None = None          # (rank, value) of the first share in rank order (bool as int)
    head: list[tuple[int, Any]] = field(default_factory=list)
    same: bool = True                             # every value equals the first
    bad: tuple[int, str] | None = None            # the first value that is not a number: (rank, type name)
    ints: bool = True                             # every value is an int
    isum: int = 0
    vsum: list[float] = field(default_factory=list)       # exact partials of the values
    vspecial: list[float] = field(default_factory=list)
    hi: Any = None
    lo: Any = None
    nan: bool = False
    wsum: list[float] = field(default_factory=list)       # of the weights
    psum: list[float] = field(default_factory=list)       # of value x weight, weight > 0
    pspecial: list[float] = field(default_factory=list)
    stated: set[str] = field(default_factory=set)
    count: int = 0                                # shares
    more_ranks: int = 0                           # ranks counted in parts read back (they hold no rank set)

    @property
    def n_ranks(self) -> int:
        return len(self.ranks) + self.more_ranks

    def add_share(self, s: Share) -> None:
        v = s.value
        if isinstance(v, bool):
            v = int(v)
        self.count += 1
        self.ranks.add(s.rank)
        if s.reduce:
            self.stated.add(s.reduce)
        if self.first is None:
            self.first = (s.rank, v)
        elif self.same and not same_value(v, self.first[1]):
            self.same = False
        if len(self.head) < 4:
            self.head.append((s.rank, v))
        add_exact(self.wsum, float(s.weight))
        if not isinstance(v, (int, float)):
            if self.bad is None:
                self.bad = (s.rank, type(v).__name__)
            self.ints = False
            return
        if isinstance(v, int):
            self.isum += v
        else:
            self.ints = False
        _add(self.vsum, self.vspecial, float(v))
        if s.weight > 0:
            _add(self.psum, self.pspecial, v * s.weight)
        if isinstance(v, float) and math.isnan(v):
            self.nan = True
        else:
            if self.hi is None or v > self.hi:
                self.hi = v
            if self.lo is None or v < self.lo:
                self.lo = v

    def add_part(self, o: "Part") -> None:
        """Take in the part of ranks that all come after this part's (rank order)."""
        if o.first is None:
            return
        self.count += o.count
        self.ranks |= o.ranks
        self.more_ranks += o.more_ranks
        self.stated |= o.stated
        if self.first is None:
            self.first, self.same = o.first, o.same
        elif self.same and not (o.same and same_value(o.first[1], self.first[1])):
            self.same = False
        self.head = (self.head + o.head)[:4]
        if self.bad is None:
            self.bad = o.bad
        self.ints = self.ints and o.ints
        self.isum += o.isum
        for x in o.vsum:
            add_exact(self.vsum, x)
        self.vspecial += o.vspecial
        for x in o.wsum:
            add_exact(self.wsum, x)
        for x in o.psum:
            add_exact(self.psum, x)
        self.pspecial += o.pspecial
        self.nan = self.nan or o.nan
        if o.hi is not None and (self.hi is None or o.hi > self.hi):
            self.hi = o.hi
        if o.lo is not None and (self.lo is None or o.lo < self.lo):
            self.lo = o.lo

    def result(self, key: str, reduce: str) -> tuple[Any, str | None]:
        """What :func:`trackbridge.record.ranked.merge` gives for these shares by ``reduce`` (one of mean, sum, max,
        min, value): the same value, the same note, the same :class:`MergeError`."""
        if self.first is None:
            raise MergeError(f"metric {key!r}: nothing to merge")
        if self.bad is not None:
            raise MergeError(f"metric {key!r}: rank {self.bad[0]}'s value of type {self.bad[1]} cannot be merged "
                             f"by {reduce!r} (a number is needed)")
        if reduce == "value":
            note = None if self.same else (
                f"metric {key!r}: the ranks logged different values for a value that is the same on every rank "
                f"({', '.join(f'rank {r}: {v!r}' for r, v in self.head)}); rank {self.first[0]}'s is kept")
            return self.first[1], note
        if reduce == "sum":
            return (self.isum if self.ints else math.fsum(self.vsum + self.vspecial)), None
        if reduce in ("max", "min"):
            return (math.nan if self.nan else self.hi if reduce == "max" else self.lo), None
        if reduce == "mean":
            total = math.fsum(self.wsum)
            if total == 0:
                return math.nan, None
            return math.fsum(self.psum + self.pspecial) / total, None
        raise MergeError(f"metric {key!r}: unknown reduction {reduce!r}")

    # -- the node file's form -------------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        assert self.first is not None
        out: dict[str, Any] = {"k": self.n_ranks, "c": self.count,
                               "f": [self.first[0], encode_value(self.first[1])], "w": self.wsum}
        if not self.same:                 # the first values, for the note on values that differ
            out["d"] = 1
            out["h"] = [[r, encode_value(v)] for r, v in self.head[1:]]
        elif len(self.head) > 1:          # all equal to the first: their ranks are enough
            out["hr"] = [r for r, _ in self.head[1:]]
        if self.bad is not None:
            out["b"] = list(self.bad)
        if self.ints:
            out["i"] = self.isum
        out["v"] = self.vsum
        if self.vspecial:
            out["vx"] = [encode_value(x) for x in self.vspecial]
        if self.hi is not None:
            out["hi"], out["lo"] = encode_value(self.hi), encode_value(self.lo)
        if self.nan:
            out["n"] = 1
        out["p"] = self.psum
        if self.pspecial:
            out["px"] = [encode_value(x) for x in self.pspecial]
        if self.stated:
            out["s"] = sorted(self.stated)
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Part":
        first = (int(d["f"][0]), decode_value(d["f"][1]))
        return cls(more_ranks=int(d["k"]), count=int(d["c"]), first=first,
                   head=[first] + [(int(r), decode_value(v)) for r, v in d.get("h", [])]
                   + [(int(r), first[1]) for r in d.get("hr", [])],
                   same=not d.get("d"), bad=(int(d["b"][0]), str(d["b"][1])) if d.get("b") else None,
                   ints="i" in d, isum=int(d.get("i", 0)), vsum=[float(x) for x in d["v"]],
                   vspecial=[float(decode_value(x)) for x in d.get("vx", [])],
                   hi=decode_value(d.get("hi")), lo=decode_value(d.get("lo")),
                   nan=bool(d.get("n")), wsum=[float(x) for x in d["w"]], psum=[float(x) for x in d["p"]],
                   pspecial=[float(decode_value(x)) for x in d.get("px", [])], stated=set(d.get("s", [])))


def needs_raw(s: Share) -> bool:
    """A share a part cannot stand for: one with a mean (a ``std``) or with samples (a ``dist``)."""
    return s.mean is not None or isinstance(s.value, Histogram) or s.reduce in ("std", "dist")


def raw_share(s: Share) -> list[Any]:
    return [s.rank, encode_value(s.value), s.weight, s.reduce, s.mean]


def share_of(row: list[Any]) -> Share:
    return Share(int(row[0]), decode_value(row[1]), float(row[2]), row[3], row[4])


class Packed:
    """A part as read from a node file: its JSON, decoded only as far as the reduction needs (rank 0 reads one per
    key, step and node)."""

    __slots__ = ("d", "rank")

    def __init__(self, d: dict[str, Any]) -> None:
        self.d = d
        self.rank = int(d["f"][0])                  # the lowest rank that logged the key (shares in rank order)

    @property
    def stated(self) -> set[str]:
        return set(self.d.get("s", ()))

    def part(self) -> Part:
        return Part.from_json(self.d)


def _number(key: str, reduce: str, x: Share | Packed) -> None:
    """The MergeError merge() raises for a value that is not a number (the first one in rank order)."""
    if isinstance(x, Packed):
        if "b" in x.d:
            raise MergeError(f"metric {key!r}: rank {x.d['b'][0]}'s value of type {x.d['b'][1]} cannot be merged "
                             f"by {reduce!r} (a number is needed)")
    elif not isinstance(x.value, (int, float)):
        raise MergeError(f"metric {key!r}: rank {x.rank}'s value of type {type(x.value).__name__} cannot be merged "
                         f"by {reduce!r} (a number is needed)")


def merge_parts(key: str, reduce: str, items: list[Share | Packed], *, sample_std: bool = True
                ) -> tuple[Any, str | None]:
    """Merge ``items`` (rank 0's own ranks' shares and the nodes' parts, in rank order) as
    :func:`trackbridge.record.ranked.merge` merges every rank's shares: the same value, note and error."""
    if reduce in ("std", "dist"):
        if any(isinstance(x, Packed) for x in items):
            if reduce == "std":        # a part holds shares without a mean, which merge() refuses the same way
                raise MergeError(f"metric {key!r}: a std is merged from each rank's std, mean and count: log "
                                 f"Weighted(std, count, reduce='std', mean=the_mean)")
            raise MergeError(f"metric {key!r}: numbers pre-merged on a node cannot be pooled into a distribution "
                             f"(log the samples: a list or a 1-d tensor)")
        return merge(key, reduce, [x for x in items if isinstance(x, Share)], sample_std=sample_std)
    if reduce not in ("mean", "sum", "max", "min") or not items:
        total = Part()                 # value (and the unknown): the first values and whether they all agree
        for x in items:
            total.add_part(x.part()) if isinstance(x, Packed) else total.add_share(x)
        return total.result(key, reduce)
    for x in items:
        _number(key, reduce, x)
    # fsum over every share's term and every part's exact partials: the correctly rounded exact sum, as merge()'s
    if reduce == "mean":
        weights: list[float] = []
        terms: list[float] = []
        for x in items:
            if isinstance(x, Packed):
                weights += x.d["w"]
                terms += x.d["p"]
                terms += [float(decode_value(t)) for t in x.d.get("px", ())]
            else:
                weights.append(x.weight)
                if x.weight > 0:
                    terms.append(x.value * x.weight)
        total_w = math.fsum(weights)
        return (math.nan if total_w == 0 else math.fsum(terms) / total_w), None
    if reduce == "sum":
        if all(("i" in x.d) if isinstance(x, Packed) else isinstance(x.value, int) for x in items):
            return sum(int(x.d["i"]) if isinstance(x, Packed) else int(x.value) for x in items), None
        values: list[float] = []
        for x in items:
            if isinstance(x, Packed):
                values += x.d["v"]
                values += [float(decode_value(t)) for t in x.d.get("vx", ())]
            else:
                values.append(x.value)
        return math.fsum(values), None
    best: Any = None                   # max/min: the first extreme in rank order, NaN if any value is NaN
    for x in items:
        if isinstance(x, Packed):
            if x.d.get("n"):
                return math.nan, None
            v = decode_value(x.d.get("hi" if reduce == "max" else "lo"))
            if v is None:
                continue
        else:
            v = int(x.value) if isinstance(x.value, bool) else x.value
            if isinstance(v, float) and math.isnan(v):
                return math.nan, None
        if best is None or (v > best if reduce == "max" else v < best):
            best = v
    return best, None


def rank_of(x: Share | Packed) -> int:
    return x.rank


__all__ = ["Packed", "Part", "add_exact", "merge_parts", "needs_raw", "raw_share", "share_of"]
