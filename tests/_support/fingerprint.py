"""Fingerprint a logged value's reduction (docs/reductions.md, "Proof by fingerprint").

A proof feeds a framework's own code a batch and reads back the value it logs. This module computes, from the same
batch, the value every candidate reduction would give, and checks that the logged value is the one the mapping
entry states, and no other:

    assert_stated(logged, steps, {"tokens": "token_mean", "micro_batches": "mean", "mini_batches": "mean",
                                  "processes": "all_reduce_mean"}, tokens=("token_mean", "seq_mean_token_mean"))

The batch is nested from the outermost level in: ``steps[w][m][r][u]`` is micro-batch ``u`` of rank ``r`` in
optimizer step (mini-batch) ``m`` of logged step ``w``. A micro-batch is a list of sequences, each the list of its
valid tokens' values (ragged: padding already removed) for token quantities, or a one-element list holding the
sequence's own value for per-sequence quantities (``tokens="per_seq"``; a scalar such as the lr or a grad norm,
``tokens="none"``, is one such value per micro-batch). A level reduced ``none`` pools its items (computed once over
all of them).

The levels are reduced as docs/reductions.md nests them: each micro-batch over the ranks first (an all-reduce or a
gather per micro-batch), then the micro-batches, the optimizer steps and the logged steps. Ranks that hold different
numbers of micro-batches cannot be reduced per micro-batch: each rank then combines its own micro-batches first.

Some candidates are offered only when a proof asks for them (``tokens=``, ``processes=``, ``window=``, ``stats=``) or
the entry states them (:func:`assert_stated` adds the stated value): :data:`TOKENS_EXTRA` (a token sum over the step's
global token count), :data:`PROCESSES_EXTRA` (``gather``: the ranks' values pooled before the statistic, a pooled std;
``driver``: one process combining its batches, ``processes: none`` with a ``micro_batches`` level),
:data:`WINDOW_EXTRA` (the window's max / min), :data:`COMBINE_EXTRA` (``var``: the unbiased variance of a level's
values, such as every micro-batch's mean at once) and the ``count`` and ``explained_var`` statistics (:data:`STATS`;
``explained_var`` is over a population of (return, value) pairs, each token's value a 2-tuple): the rest of the
candidates stay what every proof was fingerprinted against, and of equivalent candidates the representative is one
of those.

Two candidates that give the logged value are one computation when they agree on several other batches of the same
shape (:func:`equivalent`: a level holding one item makes all its reductions equal; a token mean pooled over
micro-batches is their token-weighted mean). When two different computations give the logged value, the batch does
not tell them apart and the proof fails: a batch too even to discriminate fails instead of passing.
"""
from __future__ import annotations

import itertools
import math
import random
import statistics
from dataclasses import dataclass, fields
from typing import Any, Iterable, Mapping, Sequence

Seq = Sequence[float]
Micro = Sequence[Seq]
Steps = Sequence[Sequence[Sequence[Sequence[Micro]]]]      # [logged step][mini-batch][rank][micro-batch]

TOKENS = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm", "token_sum",
          "per_seq", "token_sum_step_norm", "token_sum_dp_norm")
#: offered only when asked for (``tokens=``) or stated: each micro-batch's token sum over the step's token count on
#: every rank and micro-batch (docs/reductions.md ``token_sum_global_norm``: prime-rl's RL loss)
TOKENS_EXTRA = ("token_sum_global_norm",)
# all_reduce_weighted weighs by tokens
TOKEN_WEIGHTED = ("token_mean", "token_sum_step_norm", "token_sum_dp_norm", "token_sum_global_norm")
COMBINE = ("none", "token_weighted", "seq_weighted", "mean", "sum", "last", "max", "min")
#: offered only when asked for (``micro=``, ``mini=``, ``window=``) or stated: ``var``, the unbiased variance
#: (torch.var's default, n-1) of the level's values. With ``mini="none"`` (the optimizer steps' micro-batches pooled
#: rank by rank) and ``processes="driver"`` (every rank's micro-batches combined at once) it is the variance of every
#: micro-batch value of the step over all ranks: TRL's ``val/ratio_var``, ``gather_for_metrics(ratio_stats).var()``
#: of the per-micro-batch mean ratios (trl/experimental/ppo/ppo_trainer.py@v1.12.0:868,904)
COMBINE_EXTRA = ("var",)
PROCESSES = ("none", "all_reduce_weighted", "all_reduce_mean", "token_weighted", "seq_weighted", "sum", "max", "min",
             "rank0")
#: offered only when asked for (``processes=``) or stated (proven.to_fingerprint): ``gather``, the ranks' populations
#: pooled (all_gather'ed) before the statistic, per micro-batch (a pooled std); ``driver``, one process combining the
#: values of its batches (the ranks' micro-batches, in order) with ``micro_batches`` (NeMo-RL's validation batches;
#: a mapping entry's ``processes: none`` with a ``micro_batches`` level)
PROCESSES_EXTRA = ("gather", "driver")
WINDOW = ("step", "mean", "last", "sum", "none")       # none: the logged steps' items pooled (the format's `pooled`)
#: offered only when asked for (``window=``): the window's largest / smallest logged value
WINDOW_EXTRA = ("max", "min")
#: the statistics a proof may offer (``stats=``); ``count``: how many items (sequences for per_seq, tokens for
#: token_mean) the population holds; ``explained_var``: 1 - Var(r - v) / (Var(r) + 1e-5) of a population of
#: (return, value) pairs (each token's value a 2-tuple), both variances unbiased (torch.var): veRL's
#: ``critic/vf_explained_var`` over the batch's valid tokens (verl/trainer/ppo/metric_utils.py@v0.9.1
#: compute_data_metrics)
STATS = ("mean", "max", "min", "sum", "std", "count", "explained_var")
#: the constant veRL adds to Var(returns) in the explained variance's denominator
EXPLAINED_VAR_EPS = 1e-5
LEVELS = ("micro_batches", "mini_batches", "processes", "window")


@dataclass(frozen=True)
class Reduction:
    """One candidate: a value for every level (the fields of a mapping entry's ``reduce:``); ``-``: not told."""
    tokens: str
    stat: str
    micro_batches: str
    mini_batches: str
    processes: str
    window: str
    std: str | None = None

    def differs(self, other: "Reduction") -> list[str]:
        return [f.name for f in fields(self) if getattr(self, f.name) != getattr(other, f.name)]


class Undefined(AssertionError):
    """A reduction that has no value on a batch (a sample std of one value): no candidate there."""


# ------------------------------------------------------------------------------------------- one population
def _stat(values: list[float], stat: str, std: str | None) -> float:
    if stat in ("mean", "value"):         # value: one value (a scalar per micro-batch: tokens none)
        return sum(values) / len(values)
    if stat == "max":
        return max(values)
    if stat == "min":
        return min(values)
    if stat == "sum":
        return sum(values)
    if stat == "count":
        return float(len(values))
    if stat == "explained_var":            # values: (return, value) pairs
        if len(values) < 2:
            return math.nan                   # an unbiased variance of one pair: undefined
        returns = [float(r) for r, _ in values]
        diffs = [float(r) - float(v) for r, v in values]
        return 1.0 - statistics.variance(diffs) / (statistics.variance(returns) + EXPLAINED_VAR_EPS)
    if stat == "std":
        if std == "sample" and len(values) < 2:
            return math.nan                   # undefined: a candidate no logged value matches
        return statistics.stdev(values) if std == "sample" else statistics.pstdev(values)
    raise ValueError(stat)


def reduce_population(seqs: Micro, red: Reduction, norm_len: float) -> tuple[float, int, int]:
    """The value of one population (a micro-batch, or the union of several), with its token and sequence counts.
    ``norm_len``: the constant of ``seq_mean_token_sum_norm``, or the token count ``token_sum_step_norm`` /
    ``token_sum_dp_norm`` / ``token_sum_global_norm`` divide by (computed by :func:`value_of` from the step)."""
    n_tok, n_seq = sum(len(s) for s in seqs), len(seqs)
    if any(isinstance(v, tuple) for s in seqs for v in s[:1]) != (red.stat == "explained_var"):
        # (return, value) pairs have an explained variance and nothing else; plain values no explained variance
        raise Undefined(f"{red} has no value on this population")
    if red.tokens in ("per_seq", "none"):    # none: a scalar per micro-batch (lr, a grad norm), one 'sequence' of it
        return _stat([s[0] for s in seqs], red.stat, red.std), n_tok, n_seq
    if red.tokens == "token_mean":
        return _stat([v for s in seqs for v in s], red.stat, red.std), n_tok, n_seq
    if red.tokens == "seq_mean_token_mean":
        return _stat([sum(s) / len(s) for s in seqs], red.stat, red.std), n_tok, n_seq
    if red.tokens == "seq_mean_token_sum":
        return _stat([sum(s) for s in seqs], red.stat, red.std), n_tok, n_seq
    total = sum(v for s in seqs for v in s)
    if red.tokens == "seq_mean_token_sum_norm":
        return total / (n_seq * norm_len), n_tok, n_seq
    if red.tokens == "token_sum":
        return total, n_tok, n_seq
    if red.tokens in ("token_sum_step_norm", "token_sum_dp_norm", "token_sum_global_norm"):
        return total / norm_len, n_tok, n_seq
    raise ValueError(red.tokens)


def _combine(parts: list[tuple[float, int, int]], how: str, red: Reduction) -> tuple[float, int, int]:
    toks, seqs = sum(p[1] for p in parts), sum(p[2] for p in parts)
    vals = [p[0] for p in parts]
    if how == "all_reduce_weighted":        # weighted by the population the value is a mean over
        how = "token_weighted" if red.tokens in TOKEN_WEIGHTED else "seq_weighted"
    if how == "token_weighted":
        return sum(p[0] * p[1] for p in parts) / toks, toks, seqs
    if how == "seq_weighted":
        return sum(p[0] * p[2] for p in parts) / seqs, toks, seqs
    if how in ("mean", "all_reduce_mean"):
        return sum(vals) / len(vals), toks, seqs
    if how == "sum":
        return sum(vals), toks, seqs
    if how == "last":
        return vals[-1], toks, seqs
    if how == "rank0":
        return vals[0], toks, seqs
    if how == "max":
        return max(vals), toks, seqs
    if how == "min":
        return min(vals), toks, seqs
    if how == "var":                         # unbiased (n-1), torch.var's default; undefined for one value
        return (statistics.variance(vals) if len(vals) > 1 else math.nan), toks, seqs
    raise ValueError(how)


def value_of(steps: Steps, red: Reduction, norm_len: int = 0) -> float:
    """What ``red`` makes of the batch."""
    def pooled(micros: Iterable[Micro]) -> Micro:
        return [s for m in micros for s in m]

    def toks(micros: Iterable[Micro]) -> int:
        return sum(len(s) for m in micros for s in m)

    def rank_value(micros: Sequence[Micro], norms: Sequence[float]) -> tuple[float, int, int]:
        if red.micro_batches == "none":
            return reduce_population(pooled(micros), red, norms[0])
        return _combine([reduce_population(m, red, n) for m, n in zip(micros, norms)], red.micro_batches, red)

    def mini_value(ranks: Sequence[Sequence[Micro]]) -> tuple[float, int, int]:
        if red.processes == "none":            # a driver over the global batch (no micro-batches: see _valid)
            return reduce_population(pooled(m for r in ranks for m in r), red, norm_len)
        if red.processes == "driver":          # a driver combining the values of its batches
            return _combine([reduce_population(m, red, norm_len) for r in ranks for m in r], red.micro_batches, red)
        n_micro = max(len(r) for r in ranks)
        if red.tokens == "token_sum_step_norm":      # the step's tokens per (rank, micro-batch), OpenRLHF >= 0.10.4
            norms = [toks(m for r in ranks for m in r) / sum(len(r) for r in ranks)] * n_micro
        elif red.tokens == "token_sum_dp_norm":      # micro-batch u's tokens per rank, OpenRLHF 0.10.3
            norms = [toks(r[u] for r in ranks if u < len(r)) / len(ranks) for u in range(n_micro)]
        elif red.tokens == "token_sum_global_norm":  # the step's tokens over every rank and micro-batch (prime-rl)
            norms = [toks(m for r in ranks for m in r)] * n_micro
        else:
            norms = [norm_len] * n_micro
        if red.processes == "gather":                # the ranks' populations pooled before the statistic
            if red.micro_batches == "none" or len({len(r) for r in ranks}) > 1:
                return reduce_population(pooled(m for r in ranks for m in r), red, norms[0])
            return _combine([reduce_population(pooled(r[u] for r in ranks), red, norms[u]) for u in range(n_micro)],
                            red.micro_batches, red)
        if red.micro_batches == "none" or len({len(r) for r in ranks}) > 1:
            return _combine([rank_value(r, norms) for r in ranks], red.processes, red)
        # each micro-batch reduced over the ranks, then the micro-batches
        return _combine([_combine([reduce_population(r[u], red, norms[u]) for r in ranks], red.processes, red)
                         for u in range(n_micro)], red.micro_batches, red)

    def step_value(minis: Sequence[Sequence[Sequence[Micro]]]) -> tuple[float, int, int]:
        if red.mini_batches == "none":         # the optimizer steps' data pooled, rank by rank
            merged = [[m for mini in minis for m in mini[r]] for r in range(len(minis[0]))]
            return mini_value(merged)
        return _combine([mini_value(mini) for mini in minis], red.mini_batches, red)

    if red.window in ("none", "pooled"):       # the logged steps' data pooled
        out = step_value([mini for step in steps for mini in step])[0]
    elif red.window == "step":
        assert len(steps) == 1, "window 'step' logs one row per step: give one step"
        out = step_value(steps[0])[0]
    else:
        out = _combine([step_value(step) for step in steps], red.window, red)[0]
    if math.isnan(out):
        raise Undefined(f"{red} is undefined on this batch (a sample std of a single value)")
    return out


def _valid(red: Reduction) -> bool:
    if red.stat != "mean" and red.tokens not in ("per_seq", "token_mean", "seq_mean_token_mean",
                                                 "seq_mean_token_sum"):
        return False
    if red.stat in ("count", "explained_var") and red.tokens not in ("per_seq", "token_mean"):
        return False                       # a count (explained variance) of sequences or of tokens
    if (red.stat == "std") != (red.std is not None):
        return False
    if red.processes == "none" and red.micro_batches != "none":
        return False                       # a driver computes over the global batch at once: no micro-batches
    if red.processes == "driver" and red.micro_batches == "none":
        return False                       # that is processes none
    if red.tokens in ("token_sum_step_norm", "token_sum_dp_norm", "token_sum_global_norm") and (
            "none" in (red.processes, red.micro_batches) or red.processes in ("gather", "driver")):
        return False                       # normalised by the step's (micro-batch's) tokens over its ranks
    return True


def candidates(steps: Steps, *, tokens: Iterable[str] = TOKENS, stats: Iterable[str] = ("mean",),
               micro: Iterable[str] = COMBINE, mini: Iterable[str] = COMBINE,
               processes: Iterable[str] = PROCESSES, window: Iterable[str] | None = None,
               norm_len: int = 0) -> list[tuple[float, Reduction]]:
    """Every candidate reduction's value on ``steps``."""
    if window is None:
        window = ("step",) if len(steps) == 1 else tuple(w for w in WINDOW if w != "step")
    out = []
    for t, s, u, m, p, w in itertools.product(tokens, stats, micro, mini, processes, window):
        for std in (("sample", "population") if s == "std" else (None,)):
            red = Reduction(t, s, u, m, p, w, std)
            if not _valid(red) or (t == "seq_mean_token_sum_norm" and not norm_len):
                continue
            try:
                out.append((value_of(steps, red, norm_len), red))
            except Undefined:
                continue                   # undefined on this batch (a sample std of one value)
    return out


def _reshaped(steps: Steps, rng: random.Random) -> Steps:
    """A batch of the same shape with other values: two reductions equal on several of these are one function."""
    def fresh(v: Any) -> Any:             # a (return, value) pair stays a pair
        return tuple(rng.uniform(-1.0, 2.0) for _ in v) if isinstance(v, tuple) else rng.uniform(-1.0, 2.0)
    return [[[[[[fresh(v) for v in seq] for seq in micro] for micro in rank] for rank in mini]
             for mini in step] for step in steps]


def equivalent(a: Reduction, b: Reduction, steps: Steps, norm_len: int = 0, trials: int = 4) -> bool:
    """Whether ``a`` and ``b`` are the same computation on batches of this shape (a level holding one item makes
    all its reductions the same; a token mean pooled over micro-batches is their token-weighted mean ...)."""
    rng = random.Random(1234)
    for _ in range(trials):
        other = _reshaped(steps, rng)
        if not math.isclose(value_of(other, a, norm_len), value_of(other, b, norm_len), rel_tol=1e-9, abs_tol=1e-12):
            return False
    return True


Observation = tuple[float, Steps]      # a logged value and the batch it was logged for


def magnitude(batch: Any) -> float:
    """The largest magnitude among a batch's values (nested lists of numbers): the scale of the terms a reduction
    adds, against which rounding is judged."""
    if isinstance(batch, (int, float)):
        return abs(float(batch))
    return max((magnitude(x) for x in batch), default=0.0)


def fingerprint(observed: float | Sequence[Observation], steps: Steps | None = None, *, rel: float = 1e-6,
                norm_len: int = 0, **kw: Any) -> Reduction:
    """The reduction that gives the logged value(s): ``fingerprint(logged, steps)`` or, for several runs of the
    framework's code on batches of one shape, ``fingerprint([(logged1, steps1), (logged2, steps2), ...])`` (a
    reduction that selects one item, such as the last micro-batch or rank 0's value, can coincide with another
    selection on one batch; rarely on three). Returns one representative of the candidates that fit every
    observation, checked to be one computation. Fails when none fits, or when two different computations do (the
    batches do not tell them apart: make them more uneven, or give more observations). ``rel`` is relative twice:
    to the value, and to the scale of the batch's own terms (:func:`magnitude`), so a value that is 0 in exact
    arithmetic and logs as a float32 framework's rounding of O(0.1) terms (7e-09) is equal to 0, whatever the
    batch's scale; the other observations still tell the candidates apart."""
    obs: list[Observation] = ([(float(observed), steps)] if steps is not None    # type: ignore[arg-type]
                              else list(observed))                              # type: ignore[arg-type]
    assert obs, "no observation"
    if kw.get("window") is None and any(len(batch) > 1 for _, batch in obs):
        # rows of several steps beside a row of one (a window that ends early): the window candidates of them all
        kw["window"] = tuple(w for w in WINDOW if w != "step")
    hits = None
    for logged, batch in obs:
        abs_tol = rel * magnitude(batch)
        fit = {red for v, red in candidates(batch, norm_len=norm_len, **kw)
               if math.isclose(v, logged, rel_tol=rel, abs_tol=abs_tol)}
        hits = fit if hits is None else hits & fit
    assert hits, f"no candidate reduction gives the logged value(s) {[o[0] for o in obs]!r}"
    ordered = sorted(hits, key=lambda r: (_late(r), str(r)))
    first = ordered[0]
    other = [h for h in ordered[1:] if not all(equivalent(first, h, batch, norm_len) for _, batch in obs)]
    assert not other, (f"the logged value(s) fit different reductions (make the batch more uneven, or observe more "
                       f"batches): {first} and {other[0]}" + (f" (+{len(other) - 1} more)" if len(other) > 1 else ""))
    return first


def _late(red: Reduction) -> bool:
    """Whether ``red`` is one of the candidates offered only when asked for (a gather, a driver combining its
    batches, a window's extreme ...): of equivalent candidates, the representative is one of the others."""
    return (red.processes in PROCESSES_EXTRA or red.window in WINDOW_EXTRA or red.tokens in TOKENS_EXTRA
            or bool(set(COMBINE_EXTRA) & {red.micro_batches, red.mini_batches, red.window}))


def _uneven(groups: Iterable[Sequence[Any]], size: Any) -> bool:
    return any(len(g) > 1 and len({size(item) for item in g}) > 1 for g in groups)


def check_uneven(steps: Steps, levels: Iterable[str]) -> None:
    """Fail unless each of ``levels`` holds, somewhere, two or more items of different token counts: only then do its
    weighted and unweighted (and first, last, pooled) reductions give different numbers."""
    def toks(x: Any) -> int:       # a (return, value) pair counts 2: every count doubled, the unevenness the same
        return sum(toks(y) for y in x) if x and isinstance(x[0], (list, tuple)) else len(x)
    where = {"window": [steps],
             "mini_batches": list(steps),
             "processes": [mini for step in steps for mini in step],
             "micro_batches": [rank for step in steps for mini in step for rank in mini]}
    for level in levels:
        assert _uneven(where[level], toks), (f"the batch does not tell {level} reductions apart: give it two or more "
                                             f"items of different token counts")


def assert_stated(observed: float | Sequence[Observation], steps: Steps | None, entry_reduce: Mapping[str, Any], *,
                  rel: float = 1e-6, norm_len: int = 0, levels: Iterable[str] = LEVELS, **kw: Any) -> Reduction:
    """Assert that the logged value(s) were computed with the entry's stated reduction and with no other on these
    batches (arguments as :func:`fingerprint`); returns the fingerprinted reduction. ``levels``: the levels the batch
    must tell apart (all four by default; leave out one the framework does not have for this key, such as the
    logging window of a framework that logs every step)."""
    batches = [steps] if steps is not None else [b for _, b in observed]     # type: ignore[union-attr]
    shape = max(batches, key=len)                                # the observation of the most logged steps
    check_uneven(shape, levels)
    want = stated(entry_reduce, shape)
    for name, default in (("tokens", TOKENS), ("processes", PROCESSES), ("window", None),
                          ("stats", ("mean",))):      # the stated value is always a candidate
        field_name = "stat" if name == "stats" else name
        if name == "window":
            if getattr(want, "window") not in WINDOW_EXTRA:
                continue                              # fingerprint's default windows (by the batch's steps)
            default = tuple(w for w in WINDOW if w != "step")
        offered = tuple(kw.get(name) or default)
        if getattr(want, field_name) not in offered:
            kw[name] = (*offered, getattr(want, field_name))
    for name, field_name in (("micro", "micro_batches"), ("mini", "mini_batches")):
        offered = tuple(kw.get(name) or COMBINE)
        if getattr(want, field_name) in COMBINE_EXTRA and getattr(want, field_name) not in offered:
            kw[name] = (*offered, getattr(want, field_name))
    found = fingerprint(observed, steps, rel=rel, norm_len=norm_len, **kw)
    assert all(equivalent(found, want, b, norm_len) for b in batches), (
        f"the logged value was computed as {found}; the entry states {want} "
        f"(differs in {', '.join(found.differs(want))})")
    return found


def stated(entry_reduce: Mapping[str, Any], steps: Steps) -> Reduction:
    """An entry's stated reduction (its ``reduce:`` fields, resolved for the proof's config) as a candidate.
    Levels it leaves out are ``none`` (not reduced at that level: computed once over the whole)."""
    return Reduction(str(entry_reduce.get("tokens", "none")), str(entry_reduce.get("stat", "mean")),
                     str(entry_reduce.get("micro_batches", "none")), str(entry_reduce.get("mini_batches", "none")),
                     str(entry_reduce.get("processes", "none")), str(entry_reduce.get("window", "step")),
                     entry_reduce.get("std"))
