"""Values that one rank computed over its own share of a batch, and how the shares merge into the value over the whole
batch (issue 24, "per-rank streams"; the logger's side is :mod:`trackbridge.logger.ranks`).

Frameworks log from rank 0 after reductions of their own, and those are where metrics go wrong across GPUs (a mean
of per-rank means, a value scaled with the number of ranks, rank 0's share taken for the whole). Here each rank logs
its **local** value with its **weight** (how many items the value is over: tokens for a token mean, sequences for a
per-sequence mean) and trackbridge merges the shares by the value's reduction, exactly:

==========  ================================================================  ======================================
reduction   merged value                                                      canonical ``stat:``
==========  ================================================================  ======================================
``mean``    sum of ``value x weight`` / sum of weights (sum of sums / sum     ``mean``, ``fraction``
            of counts); shares of weight 0 add nothing
``sum``     sum of the values                                                 ``sum``, ``count``
``max``     largest value                                                     ``max``
``min``     smallest value                                                    ``min``
``std``     the pooled standard deviation, from each share's std, ``mean=``   ``std`` (``std: sample`` or
            and weight (sample: n - 1, population: n, as the name states)     ``population``)
``dist``    the samples of every share pooled into one histogram              ``dist``
``value``   one value the same on every rank (a learning rate, a global       ``value``
            grad norm): the lowest rank's, with a note when ranks disagree
==========  ================================================================  ======================================

Which reduction: the one the share names (``Weighted(..., reduce="max")``), else the one the canonical name's
reference states (``canonical.yaml`` ``reduce: {stat: ...}``: docs/reductions.md), else ``mean`` (a weight says "a
mean over this many items"). Floating-point sums use :func:`math.fsum`, so the merged mean equals the mean computed
over the whole batch to the last bit or two, whatever the order the shares arrive in.

Needs nothing but the standard library.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..errors import TrackBridgeError
from . import Histogram

#: the reductions a share can be merged by
REDUCTIONS = ("mean", "sum", "max", "min", "std", "dist", "value")
#: canonical ``stat:`` -> the reduction that merges it over ranks
STAT_TO_REDUCTION = {"mean": "mean", "fraction": "mean", "sum": "sum", "count": "sum", "max": "max", "min": "min",
                     "std": "std", "dist": "dist", "value": "value"}


@dataclass(frozen=True)
class Weighted:
    """One rank's share of a value: ``value`` computed over ``weight`` items (tokens, sequences) of the rank's part
    of the batch. ``reduce``: how shares merge (one of :data:`REDUCTIONS`; default: the canonical name's stated
    reduction, else ``mean``); ``mean``: the share's mean, needed to merge a ``std``. Log it as a value
    (``run.log({"kl": Weighted(kl, n_tokens)})``) or through ``run.log(..., weights={"kl": n_tokens})``; the logger
    merges the shares of every rank (``init(merge_ranks=True)``) and of several calls at one step."""

    value: Any
    weight: float = 1.0
    reduce: str | None = None
    mean: float | None = None

    def __post_init__(self) -> None:
        if self.reduce is not None and self.reduce not in REDUCTIONS:
            raise ValueError(f"Weighted(reduce={self.reduce!r}): expected one of {', '.join(REDUCTIONS)}")


class MergeError(TrackBridgeError, ValueError):
    """Shares that cannot be merged (the message names the key and why)."""


@dataclass
class Share:
    """A share as the merger holds it: the rank, the normalised value (number or Histogram), its weight and
    reduction as logged (None: not stated), and the mean of a std share."""

    rank: int
    value: Any
    weight: float = 1.0
    reduce: str | None = None
    mean: float | None = None


def check_weight(key: str, weight: Any) -> float:
    """The weight as a float; :class:`MergeError` for one that is not a finite number >= 0."""
    if isinstance(weight, (bool, str, bytes)) or weight is None:
        raise MergeError(f"metric {key!r}: its weight {weight!r} is not a count of items")
    if not isinstance(weight, (int, float)):
        item = getattr(weight, "item", None)          # numpy / torch scalars
        if callable(item):
            weight = item()
    try:
        w = float(weight)
    except (TypeError, ValueError):
        raise MergeError(f"metric {key!r}: its weight {weight!r} is not a number") from None
    if not math.isfinite(w) or w < 0:
        raise MergeError(f"metric {key!r}: its weight {w!r} must be a finite number >= 0 (a count of items)")
    return w


def merge(key: str, reduce: str, shares: list[Share], *, sample_std: bool = True) -> tuple[Any, str | None]:
    """The value over the whole batch from the shares of one key at one step, and a note when the merge had to
    choose (ranks disagreeing on a ``value``). Raises :class:`MergeError` for shares the reduction cannot merge."""
    if not shares:
        raise MergeError(f"metric {key!r}: nothing to merge")
    if reduce == "dist":
        samples: list[float] = []
        nonfinite = 0.0
        for s in shares:
            h = s.value if isinstance(s.value, Histogram) else Histogram.from_values([s.value])
            if h.values is None:
                raise MergeError(f"metric {key!r}: a bucketed histogram cannot be pooled with other ranks' samples "
                                 f"(log the samples: a list or a 1-d tensor)")
            samples.extend(h.values)
            nonfinite += h.nonfinite or 0.0
        out = Histogram.from_values(samples)
        out.nonfinite = nonfinite or None
        return out, None
    values = []
    for s in shares:
        v = s.value
        if isinstance(v, bool):
            v = int(v)
        if not isinstance(v, (int, float)):
            raise MergeError(f"metric {key!r}: rank {s.rank}'s value of type {type(v).__name__} cannot be merged "
                             f"by {reduce!r} (a number is needed)")
        values.append(v)
    if reduce == "value":
        first = values[0]
        differ = any(not same_value(v, first) for v in values[1:])
        note = (f"metric {key!r}: the ranks logged different values for a value that is the same on every rank "
                f"({', '.join(f'rank {s.rank}: {v!r}' for s, v in zip(shares[:4], values[:4]))}); "
                f"rank {shares[0].rank}'s is kept") if differ else None
        return first, note
    if reduce == "sum":
        if all(isinstance(v, int) for v in values):
            return sum(values), None
        return math.fsum(values), None
    if reduce == "max":
        return _extreme(values, max), None
    if reduce == "min":
        return _extreme(values, min), None
    weights = [s.weight for s in shares]
    total = math.fsum(weights)
    if reduce == "mean":
        if total == 0:
            return math.nan, None               # a mean over no items, as the whole batch would give
        return math.fsum(v * w for v, w in zip(values, weights) if w > 0) / total, None
    if reduce == "std":
        if any(s.mean is None for s in shares):
            raise MergeError(f"metric {key!r}: a std is merged from each rank's std, mean and count: log "
                             f"Weighted(std, count, reduce='std', mean=the_mean)")
        means = [float(s.mean) for s in shares]    # type: ignore[arg-type]
        if total == 0:
            return math.nan, None
        grand = math.fsum(m * w for m, w in zip(means, weights) if w > 0) / total
        # each share's sum of squared deviations from its own mean (a sample std of one item adds nothing)
        within = math.fsum(v * v * (w - 1 if sample_std else w) for v, w in zip(values, weights)
                           if w > (1 if sample_std else 0))
        between = math.fsum(w * (m - grand) ** 2 for m, w in zip(means, weights) if w > 0)
        n = total - 1 if sample_std else total
        return (math.sqrt(max(within + between, 0.0) / n) if n > 0 else math.nan), None
    raise MergeError(f"metric {key!r}: unknown reduction {reduce!r}")


def same_value(a: Any, b: Any) -> bool:
    """Equal, NaN equal to NaN (two ranks' copies of one value)."""
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


def _extreme(values: list[Any], pick: Any) -> Any:
    if any(isinstance(v, float) and math.isnan(v) for v in values):
        return math.nan                        # as max()/min() over the whole batch with a NaN in it (torch, numpy)
    return pick(values)


def reduction_of(stat: str | None) -> str | None:
    """The reduction that merges a canonical ``stat:`` over ranks (None when it states none)."""
    return STAT_TO_REDUCTION.get(stat) if stat else None


def split_weighted(metrics: dict[str, Any], weights: dict[str, Any] | None
                   ) -> tuple[dict[str, Any], dict[str, tuple[float, str | None, float | None]], list[str]]:
    """``metrics`` with :class:`Weighted` values (and the keys of ``weights``) taken apart: ``(values, shares,
    problems)`` where ``shares`` maps a key to ``(weight, reduce, mean)``. A weight that is not a count is a
    problem (the value is then logged without one, as rank 0's)."""
    values: dict[str, Any] = {}
    shares: dict[str, tuple[float, str | None, float | None]] = {}
    problems: list[str] = []
    for k, v in metrics.items():
        if isinstance(v, Weighted):
            try:
                shares[k] = (check_weight(k, v.weight), v.reduce, None if v.mean is None else float(v.mean))
            except (MergeError, TypeError, ValueError) as exc:
                problems.append(str(exc))
            values[k] = v.value
        else:
            values[k] = v
    for k, w in (weights or {}).items():
        if k not in values:
            problems.append(f"metric {k!r}: weights= names a metric that was not logged in this call")
            continue
        if k in shares:
            continue
        try:
            shares[k] = (check_weight(k, w), None, None)
        except MergeError as exc:
            problems.append(str(exc))
    return values, shares, problems


__all__ = ["REDUCTIONS", "STAT_TO_REDUCTION", "MergeError", "Share", "Weighted", "check_weight", "merge",
           "reduction_of", "split_weighted"]
