"""X axes and smoothing.

Frameworks count steps differently (batch sizes differ, some TRL releases advance ``global_step`` oddly), so runs
can be aligned on the axes of canonical.yaml ``axes:`` (read through :mod:`trackbridge.schema.facts`):

* ``step``: the step as the framework counts it (records without a step are numbered in log order);
* ``samples``: ``progress/samples``, samples (episodes/sequences) seen so far, as the run logged it;
* ``tokens``: ``progress/tokens``, tokens seen so far; when a run logs no cumulative counter but logs the tokens
  of every step (``perf/tokens_per_step``) on consecutive steps, their running sum from the first logged step is
  used, and the report says so;
* ``time``: wall time relative to the run's first wall time. A run without wall times of its own (its reader, or
  the ``time_axis: missing`` mark a tracker copy carries, says so) is left out of time-axis charts and the report
  says so: no time is ever made up. A run whose records are less than a millisecond apart (a tracker copy written
  before runs carried that mark) is drawn with a warning that its times are write times.

``step`` and ``time`` come from the records themselves; every other axis from its ``metric`` (a counter the run
logs), else from the running sum of its ``per_step`` metric.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from ..derive.engine import MIN_RATE_INTERVAL
from ..schema.facts import AXES
from .load import LoadedRun

X_KINDS = tuple(AXES)                                                    # ("step", "samples", "tokens", "time")
COUNTERS = {n: a.metric for n, a in AXES.items() if n not in ("step", "time") and a.metric}
PER_STEP = {n: a.per_step for n, a in AXES.items() if a.per_step}
X_LABELS = {n: a.label for n, a in AXES.items()}
SMOOTH_KINDS = ("ema", "mean")


@dataclass
class Axis:
    kind: str
    values: list[float | None]           # one x per record of the run (None: no x for that record)
    available: bool = True
    note: str | None = None              # how the axis was obtained, or why the run has none


def run_axis(run: LoadedRun, kind: str = "step") -> Axis:
    """One x value per record of ``run`` (from the steps, wall times and counters it keeps, not its records)."""
    if kind not in X_KINDS:
        raise ValueError(f"unknown x axis {kind!r}; expected one of {', '.join(X_KINDS)}")
    d = run.data
    assert d is not None                 # folded from the records when the run was loaded
    n = d.count
    if kind == "step":
        steps = d.steps
        have = sum(1 for s in steps if s == s)
        if have == n:
            return Axis(kind, list(steps))
        if have == 0:
            return Axis(kind, [float(i + 1) for i in range(n)],
                        note=f"{run.label}: the source holds no steps; records numbered 1..{n} in log order")
        return Axis(kind, [s if s == s else None for s in steps],
                    note=f"{run.label}: {n - have} record(s) without a step left out")
    if kind == "time":
        walls = d.walls
        times = [w for w in walls if w == w]
        if not times or not run.has_wall_time:
            return Axis(kind, [None] * n, available=False,
                        note=f"{run.label}: the source holds no wall times, so this run is left out of the "
                             "time-axis charts (no time was made up)")
        t0 = min(times)
        rel: list[float | None] = [w - t0 if w == w else None for w in walls]
        missing = n - len(times)
        notes = [f"{missing} record(s) without a wall time left out"] if missing else []
        gaps = sorted(b - a for a, b in zip(times, times[1:]) if b > a)
        if len(times) >= 3 and (not gaps or gaps[len(gaps) // 2] < MIN_RATE_INTERVAL):
            notes.append(f"its {len(times)} records span {max(times) - t0:.3g} s: times that close are when a copy "
                         f"wrote them (a tracker copy made before runs carried the time-axis mark), not when "
                         f"training logged them; this time axis is not the run's")
        return Axis(kind, rel, note=f"{run.label}: " + "; ".join(notes) if notes else None)
    counter = COUNTERS[kind]
    col = d.column(counter)
    steps = d.steps
    by_step: dict[float, float] = {}
    for v, s in zip(col, steps):
        if v == v and s == s:
            by_step.setdefault(s, v)
    vals: list[float | None] = []
    for v, s in zip(col, steps):
        if v == v:
            vals.append(v)
        elif s == s and s in by_step:
            vals.append(by_step[s])      # e.g. an eval row of the same step as the train row
        else:
            vals.append(None)
    by_step.clear()
    if any(v is not None for v in vals):
        missing = sum(v is None for v in vals)
        note = f"{run.label}: {missing} record(s) without {counter} left out" if missing else None
        return Axis(kind, vals, note=note)
    summed = _running_sum(run, kind, PER_STEP.get(kind))
    if summed is not None:
        return summed
    why = f"logs no {counter}"
    if kind in PER_STEP:
        why += f" (nor {PER_STEP[kind]} on consecutive steps to add up)"
    return Axis(kind, [None] * n, available=False,
                note=f"{run.label}: {why}, so it is left out of the charts on this axis")


def _running_sum(run: LoadedRun, kind: str, per_step: str | None) -> Axis | None:
    if per_step is None:
        return None
    d = run.data
    assert d is not None                 # folded from the records when the run was loaded
    steps: dict[float, float] = {}
    for v, s in zip(d.column(per_step), d.steps):
        if s == s and v == v:
            steps.setdefault(s, v)
    if not steps:
        return None
    order = sorted(steps)
    if order[-1] - order[0] + 1 != len(order):
        return None                          # gaps: the steps in between are unknown, summing would undercount
    cum: dict[float, float] = {}
    total = 0.0
    for s in order:
        total += steps[s]
        cum[s] = total
    vals = [cum.get(s) if s == s else None for s in d.steps]
    first = int(order[0])
    note = (f"{run.label}: {kind} seen = running sum of {per_step} from its first logged step ({first})"
            + ("; steps before it are not counted" if first > 1 else ""))
    return Axis(kind, vals, note=note)


def series(run: LoadedRun, metric: str, axis: Axis) -> tuple[list[float], list[float]]:
    """(x, y) of one metric in one run: numbers only (NaN kept as NaN), records without an x left out. A long run
    gives the points its chart keeps (see :mod:`.load`), not every point."""
    xs: list[float] = []
    ys: list[float] = []
    values = axis.values
    for i, y in run.points(metric):
        x = values[i]
        if x is None:
            continue
        xs.append(x)
        ys.append(y)
    return xs, ys


def smooth(ys: Sequence[float], n: int, kind: str = "ema") -> list[float]:
    """Smooth with an exponential moving average of span ``n`` (alpha = 2/(n+1)) or a trailing mean of ``n`` points.

    Non-finite values are skipped (they stay NaN in the output and do not disturb the average)."""
    ys = [float(y) for y in ys]
    if n is None or n <= 1:
        return ys
    if kind not in SMOOTH_KINDS:
        raise ValueError(f"unknown smoothing {kind!r}; expected one of {', '.join(SMOOTH_KINDS)}")
    out: list[float] = []
    if kind == "ema":
        alpha = 2.0 / (n + 1.0)
        s = None
        for y in ys:
            if not math.isfinite(y):
                out.append(float("nan"))
                continue
            s = y if s is None else alpha * y + (1 - alpha) * s
            out.append(s)
        return out
    window: list[float] = []
    for y in ys:
        if not math.isfinite(y):
            out.append(float("nan"))
            continue
        window.append(y)
        if len(window) > n:
            window.pop(0)
        out.append(sum(window) / len(window))
    return out
