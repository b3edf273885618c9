"""Seeds aggregated: ``compare --group LABEL=RUN,RUN,...`` and ``--group-by CONFIG_KEY``.

A group is several runs of one setting (seeds). Per group and canonical metric, on compare's x axis (steps, samples,
tokens or time, :mod:`.align`):

* the **curve**: at every x any run of the group has a point (the union of the runs' x values), the mean over the
  runs that have a point there, and how many they are (runs of unequal length: a run counts only where it has a
  point; nothing is interpolated or extrapolated). A run with several values at one x counts its last one; NaN and
  infinities are left out;
* its **band**: the 95% bootstrap confidence interval of that mean (``band="ci"``: percentile bootstrap over the
  runs, seeded, so a report is reproducible) or the interquartile range (``band="iqr"``); none where fewer than two
  runs have a point;
* per run two numbers, **final** (the mean of its last ``last`` points) and **auc** (the area under its curve, the
  trapezoid rule on the x axis, over its own x span), and over the group's runs their mean with the band (the
  bootstrap interval of the mean, or the IQR) and their **IQM** (the interquartile mean, a 25% trimmed mean) with its
  stratified bootstrap interval: both exactly as rliable computes them (``rliable.library.get_interval_estimates``
  with ``rliable.metrics.aggregate_mean`` / ``aggregate_iqm``, method ``percentile``, on the runs x 1 score matrix;
  the same resamples for the same seed: tests/unit/test_compare_groups.py).

A group of one run has its values and no band. The fidelity caveats of the group's runs are carried to the
aggregate by :func:`trackbridge.compare._metric_report` over the group's runs: an aggregate of series that are not
the same quantity says so as compare's per-metric caveats do.

numpy does the arithmetic (it comes with the ``[plot]`` extra, as matplotlib's dependency).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

if TYPE_CHECKING:       # pragma: no cover
    import numpy as np

    from . import MetricReport
    from .load import LoadedRun

BANDS = ("ci", "iqr")
CONFIDENCE = 0.95       # the intervals' coverage
REPS = 2000             # bootstrap resamples (rliable's default is 50,000; more: slower, steadier ends)
SEED = 0
LAST = 10               # final performance: the mean of a run's last LAST points
_CHUNK = 2_000_000      # floats held at once by the curve's bootstrap


def _np() -> Any:
    """numpy, or :class:`~trackbridge.extras.MissingExtra` naming the [plot] extra that installs it."""
    from ..extras import PLOT, require
    require(("numpy",), PLOT[1], "compare's group statistics")
    import numpy
    return numpy


# -- groups from the command line ----------------------------------------------------------------------------------
def parse_group(text: str) -> tuple[str, list[str]]:
    """``LABEL=RUN,RUN,...`` -> (label, runs). ``ValueError`` naming the argument for anything else."""
    label, sep, rest = str(text).partition("=")
    label = label.strip()
    if not sep or not label:
        raise ValueError(f"--group {text}: expected LABEL=RUN,RUN,... (a label, '=', then runs)")
    items = [s.strip() for s in rest.split(",")]
    if not any(items):
        raise ValueError(f"--group {label}: an empty group; give LABEL=RUN,RUN,...")
    if not all(items):
        raise ValueError(f"--group {label}: an empty run name in {rest!r}")
    return label, items


def group_specs(groups: "Mapping[str, Sequence[str]] | Iterable[str]") -> dict[str, list[str]]:
    """Groups as given (``{"TRL": [RUN, ...]}`` or ``["TRL=RUN,RUN", ...]``), checked: unique labels, none empty."""
    out: dict[str, list[str]] = {}
    pairs = (((str(k), list(v)) for k, v in groups.items()) if isinstance(groups, Mapping)
             else (parse_group(t) for t in groups))
    for label, items in pairs:
        if label in out:
            raise ValueError(f"--group {label}: given twice")
        if not items:
            raise ValueError(f"--group {label}: an empty group; give LABEL=RUN,RUN,...")
        out[label] = [str(i) for i in items]
    return out


def members(label: str, run_labels: Sequence[str]) -> list[str]:
    """The runs a run label names: itself, or every run of a locator that held several (``LABEL/RUN``)."""
    return [r for r in run_labels if r == label or r.startswith(label + "/")]


_MISSING = object()


def config_value(config: Mapping[str, Any], key: str) -> Any:
    """The value of ``key`` in a run config: a flat key as written (``trainer.algorithm``) or a path of nested
    dicts; :data:`_MISSING` when absent."""
    if key in config:
        return config[key]
    node: Any = config
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return _MISSING
        node = node[part]
    return node


def group_by(runs: "Sequence[LoadedRun]", key: str) -> tuple[dict[str, list[str]], list[str]]:
    """Runs grouped by the value of config ``key`` (the run's own config, else its canonical config names), in order
    of first appearance; and the runs that have no such key."""
    groups: dict[str, list[str]] = {}
    without: list[str] = []
    for r in runs:
        value = config_value(r.info.config or {}, key)
        if value is _MISSING:
            value = config_value(dict((r.info.extra or {}).get("canonical_config") or {}), key)
        if value is _MISSING:
            without.append(r.label)
            continue
        groups.setdefault(f"{key}={value}", []).append(r.label)
    return groups, without


# -- one run's series ----------------------------------------------------------------------------------------------
def run_curve(xs: Sequence[float], ys: Sequence[float]) -> tuple[list[float], list[float]]:
    """A run's points by increasing x, one per x (the last value logged there), finite values only."""
    last: dict[float, float] = {}
    for x, y in zip(xs, ys):
        if x is not None and math.isfinite(x) and math.isfinite(y):
            last[float(x)] = float(y)
    order = sorted(last)
    return order, [last[x] for x in order]


def final(ys: Sequence[float], last: int = LAST) -> float | None:
    """The mean of the last ``last`` values (all of them when fewer); None for none."""
    tail = list(ys)[-max(1, int(last)):]
    return math.fsum(tail) / len(tail) if tail else None


def auc(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """The area under the curve by the trapezoid rule on the x axis; None for fewer than two points."""
    if len(xs) < 2:
        return None
    return math.fsum((xs[i + 1] - xs[i]) * (ys[i + 1] + ys[i]) / 2.0 for i in range(len(xs) - 1))


# -- several runs' curves on one axis ------------------------------------------------------------------------------
def align(curves: "Sequence[tuple[Sequence[float], Sequence[float]]]") -> "tuple[np.ndarray, np.ndarray]":
    """The union of the curves' x values, and a matrix (x, run) of their values there, NaN where a run has none."""
    np = _np()
    grid = np.array(sorted({float(x) for xs, _ in curves for x in xs}), dtype=float)
    mat = np.full((len(grid), len(curves)), np.nan)
    for j, (xs, ys) in enumerate(curves):
        if len(xs):
            mat[np.searchsorted(grid, np.asarray(xs, dtype=float)), j] = np.asarray(ys, dtype=float)
    return grid, mat


def counts(mat: "np.ndarray") -> "np.ndarray":
    """How many runs have a value at each x."""
    np = _np()
    return np.sum(~np.isnan(mat), axis=1)


def mean_curve(mat: "np.ndarray") -> "np.ndarray":
    """The mean over the runs that have a value, per x."""
    np = _np()
    n = counts(mat)
    return np.where(n > 0, np.nansum(mat, axis=1) / np.maximum(n, 1), np.nan)


def iqr_band(mat: "np.ndarray") -> "tuple[np.ndarray, np.ndarray]":
    """The 25th and 75th percentiles (linear interpolation) over the runs with a value, per x; NaN below two runs."""
    np = _np()
    lo, hi = np.full(len(mat), np.nan), np.full(len(mat), np.nan)
    ok = counts(mat) >= 2
    if ok.any():
        lo[ok], hi[ok] = np.nanpercentile(mat[ok], [25, 75], axis=1)
    return lo, hi


def ci_band(mat: "np.ndarray", *, reps: int = REPS, seed: int = SEED,
            size: float = CONFIDENCE) -> "tuple[np.ndarray, np.ndarray]":
    """Per x, the percentile bootstrap interval of the mean over the runs with a value there (each x's value equal to
    :func:`bootstrap_interval` of its values with :func:`mean` and ``seed``); NaN below two runs. The points the same
    runs have share their resamples (whole curves are resampled), in chunks of bounded memory."""
    np = _np()
    lo, hi = np.full(len(mat), np.nan), np.full(len(mat), np.nan)
    have = ~np.isnan(mat)
    patterns: dict[bytes, list[int]] = {}
    for i, row in enumerate(have):
        if row.sum() >= 2:
            patterns.setdefault(row.tobytes(), []).append(i)
    q = [100 * (1 - size) / 2, 100 * (1 - (1 - size) / 2)]
    for rows in patterns.values():
        rows_a = np.asarray(rows)
        sub = mat[rows_a][:, have[rows[0]]]                     # (points, k) values of the k runs there
        k = sub.shape[1]
        idx = _indices(k, reps, seed)[:, :, 0]                  # (reps, k)
        step = max(1, _CHUNK // (reps * k))
        for a in range(0, len(rows_a), step):
            boot = sub[a:a + step][:, idx].mean(axis=2)         # (points, reps)
            lo[rows_a[a:a + step]], hi[rows_a[a:a + step]] = np.percentile(boot, q, axis=1)
    return lo, hi


# -- the group's per-run numbers -----------------------------------------------------------------------------------
def mean(scores: "np.ndarray") -> "np.ndarray":
    """rliable's ``aggregate_mean`` of (…, runs, tasks) score matrices: the mean over tasks of the mean over runs."""
    return scores.mean(axis=-2).mean(axis=-1)


def iqm(scores: "np.ndarray") -> "np.ndarray":
    """rliable's ``aggregate_iqm`` (scipy's ``trim_mean(proportiontocut=0.25, axis=None)``) of (…, runs, tasks) score
    matrices: the mean of the middle half of all the scores, a quarter of them cut at each end (rounded down)."""
    np = _np()
    flat = scores.reshape(tuple(scores.shape[:-2]) + (-1,))
    n = flat.shape[-1]
    cut = int(0.25 * n)
    return np.sort(flat, axis=-1)[..., cut:n - cut].mean(axis=-1)


def _indices(n_runs: int, reps: int, seed: int, n_tasks: int = 1) -> "np.ndarray":
    """The resampled run indices of rliable's StratifiedBootstrap (``numpy.random.choice(runs, (runs, tasks))`` per
    resample, numpy's legacy generator seeded with ``seed``): (reps, runs, tasks)."""
    np = _np()
    return np.random.RandomState(seed).choice(n_runs, (reps, n_runs, n_tasks), replace=True)


def bootstrap_interval(scores: "np.ndarray", statistic: Any, *, reps: int = REPS, seed: int = SEED,
                       size: float = CONFIDENCE) -> tuple[float, float]:
    """The stratified percentile bootstrap interval of ``statistic`` (:func:`mean` or :func:`iqm`) over a (runs,
    tasks) score matrix, as ``rliable.library.get_interval_estimates(..., method="percentile")`` computes it after
    ``numpy.random.seed(seed)``: each task's runs resampled with replacement, ``reps`` times."""
    np = _np()
    scores = np.asarray(scores, dtype=float)
    if scores.ndim == 1:
        scores = scores[:, None]
    n, m = scores.shape
    idx = _indices(n, reps, seed, m)
    boot = statistic(scores[idx, np.arange(m)[None, None, :]])
    lo, hi = np.percentile(boot, [100 * (1 - size) / 2, 100 * (1 - (1 - size) / 2)])
    return float(lo), float(hi)


@dataclass
class Estimate:
    """One aggregate of the group's per-run numbers: its value and its band (None: one run, no band)."""

    value: float | None
    lo: float | None = None
    hi: float | None = None


def estimates(values: "Sequence[float | None]", band: str = "ci", *, reps: int = REPS,
              seed: int = SEED) -> tuple[Estimate, Estimate]:
    """(mean with its band, IQM with its stratified bootstrap interval) of per-run numbers."""
    np = _np()
    if band not in BANDS:
        raise ValueError(f"--band {band}: expected one of {', '.join(BANDS)}")
    vals = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=float)
    if len(vals) == 0:
        return Estimate(None), Estimate(None)
    scores = vals[:, None]
    m, q = Estimate(float(mean(scores))), Estimate(float(iqm(scores)))
    if len(vals) >= 2:
        if band == "iqr":
            m.lo, m.hi = (float(v) for v in np.percentile(vals, [25, 75]))
        else:
            m.lo, m.hi = bootstrap_interval(scores, mean, reps=reps, seed=seed)
        q.lo, q.hi = bootstrap_interval(scores, iqm, reps=reps, seed=seed)
    return m, q


# -- one group and metric ------------------------------------------------------------------------------------------
@dataclass
class GroupMetric:
    """The aggregate of one metric over one group's runs (see the module docstring)."""

    group: str
    metric: str
    runs: list[str]                              # the group's runs that have the metric (with x values)
    x: Any = None                                # numpy arrays: the union of x values, the mean, the band, counts
    mean: Any = None
    lo: Any = None
    hi: Any = None
    count: Any = None
    final: Estimate = field(default_factory=lambda: Estimate(None))
    final_iqm: Estimate = field(default_factory=lambda: Estimate(None))
    auc: Estimate = field(default_factory=lambda: Estimate(None))
    auc_iqm: Estimate = field(default_factory=lambda: Estimate(None))
    spans: dict[str, tuple[float, float]] = field(default_factory=dict)   # run -> its first and last x
    notes: list[str] = field(default_factory=list)
    fidelity: "MetricReport | None" = None       # the caveats of the group's runs (compare's own, over them)

    def points_range(self) -> tuple[int, int]:
        """The fewest and the most runs behind a point of the curve."""
        if self.count is None or not len(self.count):
            return (0, 0)
        return int(self.count.min()), int(self.count.max())


def aggregate(group: str, metric: str, series: "Mapping[str, tuple[Sequence[float], Sequence[float]]]", *,
              band: str = "ci", last: int = LAST, reps: int = REPS, seed: int = SEED) -> GroupMetric:
    """Aggregate one metric over a group: ``series`` maps each run to its (x, y) points (:func:`.align.series`)."""
    if band not in BANDS:
        raise ValueError(f"--band {band}: expected one of {', '.join(BANDS)}")
    curves = {label: run_curve(xs, ys) for label, (xs, ys) in series.items()}
    curves = {label: c for label, c in curves.items() if c[0]}
    gm = GroupMetric(group, metric, list(curves))
    if not curves:
        gm.notes.append("no run of the group has a point of it on this x axis")
        return gm
    gm.x, mat = align(list(curves.values()))
    gm.count = counts(mat)
    gm.mean = mean_curve(mat)
    gm.lo, gm.hi = ci_band(mat, reps=reps, seed=seed) if band == "ci" else iqr_band(mat)
    gm.spans = {label: (xs[0], xs[-1]) for label, (xs, _) in curves.items()}
    gm.final, gm.final_iqm = estimates([final(ys, last) for _, ys in curves.values()], band, reps=reps, seed=seed)
    gm.auc, gm.auc_iqm = estimates([auc(xs, ys) for xs, ys in curves.values()], band, reps=reps, seed=seed)
    if len(curves) == 1:
        gm.notes.append("one run: no band")
    else:
        lo, hi = gm.points_range()
        if lo < len(curves):
            gm.notes.append(f"runs of unequal length: {lo}\u2013{hi} runs behind a point")
        if len(set(gm.spans.values())) > 1:
            gm.notes.append("auc over each run's own x span, which differ: " + ", ".join(
                f"{label} {_num(a)}\u2013{_num(b)}" for label, (a, b) in gm.spans.items()))
        if hi == 1:
            gm.notes.append("the runs share no x value: each point is one run's (no band); try --x step")
    if any(len(xs) < 2 for xs, _ in curves.values()):
        gm.notes.append("a run with one point has no auc")
    return gm


def _num(v: float) -> str:
    return f"{v:.6g}"


COLUMNS = ["group", "metric", "runs", "runs_per_point", "band", "final_mean", "final_lo", "final_hi", "final_iqm",
           "final_iqm_lo", "final_iqm_hi", "auc_mean", "auc_lo", "auc_hi", "auc_iqm", "auc_iqm_lo", "auc_iqm_hi",
           "note"]


def row(gm: GroupMetric, band: str) -> list[Any]:
    """The summary table's row of one aggregate (:data:`COLUMNS`; the note without the fidelity caveat)."""
    lo, hi = gm.points_range()
    per_point = f"{lo}" if lo == hi else f"{lo}-{hi}"
    nums = [v for e in (gm.final, gm.final_iqm, gm.auc, gm.auc_iqm) for v in (e.value, e.lo, e.hi)]
    return [gm.group, gm.metric, len(gm.runs), per_point, band, *nums, "; ".join(gm.notes)]
