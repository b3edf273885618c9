"""One PNG per metric, all runs overlaid (matplotlib, Agg backend: no display needed); with groups, one PNG per
metric with one line per group, its band, and below it the number of runs behind each point."""
from __future__ import annotations

import gc
import math
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

WIDTH_IN, HEIGHT_IN, DPI = 9.0, 5.0, 100
PNG_SIZE = (int(WIDTH_IN * DPI), int(HEIGHT_IN * DPI))      # (width, height) in pixels of every chart
_charting = False           # inside charting(): what exists is frozen after each chart's collection
COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f",
          "#bcbd22"]


@dataclass
class Line:
    """One run's series on a chart (``smoothed``: drawn over the faint raw values)."""

    label: str
    xs: list[float]
    ys: list[float]
    smoothed: list[float] | None = None
    color: str | None = None


@dataclass
class Chart:
    """One metric's chart: every run's line, and a warning printed under it."""

    metric: str
    ylabel: str
    xlabel: str
    lines: list[Line]
    warning: str | None = None                 # the footnote under the chart (approximate in some run, ...)
    notes: list[str] = field(default_factory=list)


def _mpl() -> ModuleType:
    import matplotlib
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt
    return plt


@dataclass
class GroupLine:
    """One group's mean curve, its band (NaN where it has none) and the runs behind each point."""

    label: str
    xs: list[float]
    mean: list[float]
    lo: list[float]
    hi: list[float]
    count: list[int]
    color: str | None = None


@dataclass
class GroupChart:
    """One metric's chart of groups: a line per group with its band, the runs behind each point underneath."""

    metric: str
    ylabel: str
    xlabel: str
    lines: list[GroupLine]
    band: str                                  # what the band is, for the legend
    warning: str | None = None


def draw(chart: "Chart | GroupChart", path: Path) -> Path:
    """Draw ``chart`` into the PNG file ``path`` (its folder is created); returns ``path``."""
    if isinstance(chart, GroupChart):
        _render_groups(chart, path)
    else:
        _render(chart, path)
    # a figure sits in reference cycles, and with it Agg's buffers (~90 MB for 10,000 noisy points): freed only by
    # the cycle collector, which might not run before the next chart; collected here (the figure is out of scope:
    # _render has returned), the peak memory of a report is one chart's, not one per chart
    # (tests/trackers/test_streaming_memory.py: 565 MB -> 187 MB on 60 MB). Inside charting() the collection walks
    # only what was made since the last chart, not the whole heap: 52 ms a chart in a fresh process and over a
    # second in a large one (a test process that has imported MLflow, wandb and torch), against a few ms
    gc.collect()
    if _charting:
        gc.freeze()          # what this chart left alive (matplotlib's caches) is not walked again by the next one
    return path


def _render(chart: Chart, path: Path) -> None:
    plt = _mpl()
    fig = plt.figure(figsize=(WIDTH_IN, HEIGHT_IN), dpi=DPI)
    # the footnote is short by design (compare.report.footnote: what differs, per run); it is drawn whole, never cut
    note_lines = textwrap.wrap("\u26a0 " + chart.warning, 120) if chart.warning else []
    bottom = 0.13 + 0.045 * len(note_lines)
    ax = fig.add_axes((0.09, bottom, 0.88, 0.91 - bottom))
    any_points = False
    for i, ln in enumerate(chart.lines):
        color = ln.color or COLORS[i % len(COLORS)]
        if not ln.xs:
            continue
        any_points = True
        few = len(ln.xs) <= 40
        if ln.smoothed is not None:
            ax.plot(ln.xs, ln.ys, color=color, alpha=0.25, linewidth=1)
            ax.plot(ln.xs, ln.smoothed, color=color, linewidth=1.8, label=ln.label)
        else:
            ax.plot(ln.xs, ln.ys, color=color, linewidth=1.5, label=ln.label,
                    marker="o" if few else None, markersize=3.5)
    ax.set_title(chart.metric, fontsize=12, loc="left")
    ax.set_xlabel(chart.xlabel)
    ax.set_ylabel(chart.ylabel)
    ax.grid(True, alpha=0.3)
    if any_points:
        ax.legend(loc="best", fontsize=9, framealpha=0.85)
    else:
        ax.text(0.5, 0.5, "no points on this x axis", ha="center", va="center", transform=ax.transAxes,
                color="#666666")
    ys_all = [y for ln in chart.lines for y in ln.ys if math.isfinite(y)]
    if ys_all and max(ys_all) == min(ys_all):
        v = ys_all[0]
        pad = abs(v) * 0.05 or 0.05
        ax.set_ylim(v - pad, v + pad)
    _save(plt, fig, note_lines, path)


def _save(plt: Any, fig: Any, note_lines: list[str], path: Path) -> None:
    """The warning's lines under the chart, then the PNG written and the figure closed."""
    for k, line in enumerate(note_lines):
        fig.text(0.02, 0.02 + 0.045 * (len(note_lines) - 1 - k), line, fontsize=9, color="#8a1c00",
                 ha="left", va="bottom")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI, format="png")
    plt.close(fig)


def _render_groups(chart: GroupChart, path: Path) -> None:
    plt = _mpl()
    fig = plt.figure(figsize=(WIDTH_IN, HEIGHT_IN), dpi=DPI)
    note_lines = textwrap.wrap("\u26a0 " + chart.warning, 120) if chart.warning else []
    bottom = 0.1 + 0.045 * len(note_lines)
    height = 0.91 - bottom
    ax = fig.add_axes((0.09, bottom + 0.3 * height, 0.88, 0.7 * height))
    cnt = fig.add_axes((0.09, bottom, 0.88, 0.22 * height), sharex=ax)
    top = 1
    for i, ln in enumerate(chart.lines):
        if not ln.xs:
            continue
        color = ln.color or COLORS[i % len(COLORS)]
        few = len(ln.xs) <= 40
        ax.fill_between(ln.xs, ln.lo, ln.hi, color=color, alpha=0.2, linewidth=0)
        ax.plot(ln.xs, ln.mean, color=color, linewidth=1.8, label=f"{ln.label} (n={max(ln.count)})",
                marker="o" if few else None, markersize=3)
        cnt.step(ln.xs, ln.count, where="mid", color=color, linewidth=1.2)
        top = max(top, max(ln.count))
    ax.set_title(chart.metric, fontsize=12, loc="left")
    ax.set_title(f"mean per group; band: {chart.band}", fontsize=9, loc="right", color="#555555")
    ax.set_ylabel(chart.ylabel)
    ax.grid(True, alpha=0.3)
    ax.tick_params(labelbottom=False)
    if any(ln.xs for ln in chart.lines):
        ax.legend(loc="best", fontsize=9, framealpha=0.85)
    else:
        ax.text(0.5, 0.5, "no points on this x axis", ha="center", va="center", transform=ax.transAxes,
                color="#666666")
    cnt.set_ylim(0, top + 0.5)
    cnt.set_ylabel("runs", fontsize=9)
    cnt.set_xlabel(chart.xlabel)
    cnt.grid(True, alpha=0.3)
    _save(plt, fig, note_lines, path)


@contextmanager
def charting() -> Iterator[None]:
    """Draw several charts: the objects that exist when it begins are set aside from the cycle collector
    (``gc.freeze``) until it ends, so that the collection after each chart walks that chart's objects only. Left
    alone when the process has frozen objects of its own (its ``gc.unfreeze`` would be ours to undo), an enclosing
    charting() included."""
    global _charting
    if gc.get_freeze_count():
        yield
        return
    gc.collect()             # what is garbage now is collected now, not kept frozen until the end
    gc.freeze()
    _charting = True
    try:
        yield
    finally:
        _charting = False
        gc.unfreeze()
