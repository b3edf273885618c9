"""Per metric and run: first, last, min, max, mean and number of points, from the values as logged.

Computed on the raw values in stored (log) order, never on smoothed ones, and independent of the x axis. ``points``
counts every numeric value; NaN and infinities are counted there but left out of min, max and mean (the note says
how many).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:       # pragma: no cover  (load imports this module: no import at run time, no cycle)
    from .load import LoadedRun

COLUMNS = ["metric", "run", "first", "last", "min", "max", "mean", "points", "note"]


@dataclass
class MetricStats:
    """The statistics of one metric in one run (see the module docstring)."""

    metric: str
    run: str
    first: float | None
    last: float | None
    min: float | None
    max: float | None
    mean: float | None
    points: int
    non_finite: int = 0
    note: str = ""                      # in full (summary.csv)
    brief: str = ""                     # the same, the fidelity reason left to the metric's warning (report, md)

    def row(self) -> dict[str, Any]:
        """The summary table's row (:data:`COLUMNS`)."""
        return {"metric": self.metric, "run": self.run, "first": self.first, "last": self.last, "min": self.min,
                "max": self.max, "mean": self.mean, "points": self.points, "note": self.note}


def is_number(v: object) -> bool:
    """An int or float value (not a bool, a string or a histogram)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def values(run: "LoadedRun", metric: str) -> list[float]:
    """The numeric values of ``metric`` in ``run``, in stored order."""
    return [float(r.metrics[metric]) for r in run.records if is_number(r.metrics.get(metric))]


def metric_stats(run: "LoadedRun", metric: str) -> MetricStats | None:
    """The statistics of ``metric`` in ``run``; None when the run has no numeric value of it."""
    vals = values(run, metric)
    if not vals:
        return None
    finite = [v for v in vals if math.isfinite(v)]
    st = MetricStats(metric, run.label, first=vals[0], last=vals[-1],
                     min=min(finite) if finite else None, max=max(finite) if finite else None,
                     mean=math.fsum(finite) / len(finite) if finite else None, points=len(vals),
                     non_finite=len(vals) - len(finite))
    return st


def fmt_csv(v: object) -> str:
    """Full precision (shortest repr that round-trips), so the CSV holds exactly the logged numbers."""
    if v is None:
        return ""
    if isinstance(v, float):
        if math.isnan(v):
            return "NaN"
        if math.isinf(v):
            return "Infinity" if v > 0 else "-Infinity"
        return repr(v)
    return str(v)


def fmt_short(v: object) -> str:
    """For people: 6 significant digits."""
    if v is None:
        return ""
    if isinstance(v, float):
        if not math.isfinite(v):
            return fmt_csv(v)
        return f"{v:.6g}"
    return str(v)
