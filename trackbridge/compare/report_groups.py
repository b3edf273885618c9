"""The report's "Groups" parts (seeds aggregated, :mod:`.groups`): each metric's chart of groups, ``groups.csv``, and
the "Groups" sections of ``summary.md`` and ``report.html``."""
from __future__ import annotations

import base64
import csv
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator

from .align import X_LABELS
from .cells import _anchor, _brief, _e, _md_cell, csv_text, footnote
from .groups import COLUMNS as GROUP_COLUMNS
from .groups import CONFIDENCE
from .groups import row as group_row
from .plot import GroupChart, GroupLine, draw
from .stats import fmt_csv, fmt_short

if TYPE_CHECKING:       # pragma: no cover
    from . import CompareResult, MetricReport
    from .groups import GroupMetric


def _group_png(i: int, name: str) -> str:
    from . import slug
    return f"groups_{i:03d}_{slug(name)}.png"


def _group_band(result: CompareResult) -> str:
    return (f"{int(CONFIDENCE * 100)}% bootstrap CI of the mean ({result.reps} resamples, seed {result.seed})"
            if result.band == "ci" else "interquartile range")


def _draw_groups(result: CompareResult, i: int, mr: MetricReport, path: Path, xlabel: str) -> Path:
    """The metric's chart of groups: one line per group, its band, and the runs behind each point."""
    from .plot import COLORS
    lines = []
    for k, group in enumerate(result.group_members):
        gm = next((g for g in result.groups if g.group == group and g.metric == mr.name), None)
        if gm is None or gm.x is None:
            continue
        lines.append(GroupLine(group, gm.x.tolist(), gm.mean.tolist(), gm.lo.tolist(), gm.hi.tolist(),
                               gm.count.tolist(), color=COLORS[k % len(COLORS)]))
    ylabel = mr.name + (f" [{mr.unit}]" if mr.unit else "")
    band = f"{int(CONFIDENCE * 100)}% bootstrap CI of the mean" if result.band == "ci" else "interquartile range"
    return draw(GroupChart(mr.name, ylabel, xlabel, lines, band,
                           warning=footnote(result.group_chart_reports[mr.name])), path)


def _group_rows(result: CompareResult) -> Iterator[tuple[GroupMetric, list]]:
    for gm in result.groups:
        yield gm, group_row(gm, result.band)


def _write_groups_csv(result: CompareResult, path: Path) -> Path:
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow([*GROUP_COLUMNS, "fidelity"])
        for gm, cells in _group_rows(result):
            fid = gm.fidelity.warning if gm.fidelity is not None else None
            w.writerow([csv_text(c) if isinstance(c, str) else fmt_csv(c) for c in cells] + [csv_text(fid or "")])
    return path


def _group_md(result: CompareResult) -> list[str]:
    """summary.md's "Groups" section: who is in each group, how the numbers are made, one row per aggregate."""
    lines = ["## Groups", ""]
    for group, labels in result.group_members.items():
        lines.append(f"- {_md_cell(group)}: {len(labels)} run{'s' if len(labels) != 1 else ''} "
                     f"({_md_cell(', '.join(labels))})")
    lines.append("")
    lines.append(_groups_said(result))
    lines.append("")
    if result.groups:
        lines.append(f"{result.group_fidelity_line()}. The same table in full precision, with each caveat's "
                     "reason: groups.csv.")
        lines.append("")
    head = ["group", "metric", "runs", "runs per point", "final (mean [band])", "final IQM [CI]", "auc (mean [band])",
            "auc IQM [CI]", "note"]
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|" + "|".join("---" for _ in head) + "|")
    for gm, cells in _group_rows(result):
        lines.append("| " + " | ".join(_md_cell(c) for c in _group_cells(gm, cells)) + " |")
    lines.append("")
    return lines


def _groups_said(result: CompareResult) -> str:
    return (f"Per group and metric on the x axis ({X_LABELS[result.x]}): the mean over the runs with a point at each "
            f"x (the union of the runs' x values; a run counts only where it has a point) and its band, "
            f"{_group_band(result)}; final = each run's mean of its last {result.last} points, auc = the area under "
            "each run's curve (trapezoid rule on the x axis); over the runs their mean with the band and their IQM "
            f"(interquartile mean) with its stratified bootstrap {int(CONFIDENCE * 100)}% CI, as rliable computes "
            "them. A group of one run has no band.")


def _group_cells(gm: GroupMetric, cells: list) -> list[str]:
    _g, _m, runs, per_point, _band, *nums, note = cells

    def est(v: object, lo: object, hi: object) -> str:
        return fmt_short(v) + (f" [{fmt_short(lo)}, {fmt_short(hi)}]" if lo is not None else "")
    brief = _brief(gm.fidelity) if gm.fidelity is not None and gm.fidelity.warning else ""
    return [gm.group, f"`{gm.metric}`", str(runs), per_point, est(*nums[0:3]), est(*nums[3:6]), est(*nums[6:9]),
            est(*nums[9:12]), "; ".join(t for t in (brief, note) if t)]


def _group_html(result: CompareResult, e: Callable[[object], str]) -> str:
    """report.html's "Groups" section: the groups, the chart of each metric, the caveats, the table."""
    h = ["<section id=\"groups\"><h2>Groups</h2><ul>"]
    for group, labels in result.group_members.items():
        h.append(f"<li><b>{e(group)}</b>: {len(labels)} run{'s' if len(labels) != 1 else ''} "
                 f"({e(', '.join(labels))})</li>")
    h.append(f"</ul><p class=\"meta\">{e(_groups_said(result))} {e(result.group_fidelity_line())}. "
             "The same table: <a href=\"groups.csv\">groups.csv</a>.</p>")
    head = ["group", "runs", "runs per point", "final (mean [band])", "final IQM [CI]", "auc (mean [band])",
            "auc IQM [CI]", "note"]
    for i, mr in enumerate(result.metrics, 1):
        chart_mr = result.group_chart_reports.get(mr.name)
        if chart_mr is None:
            continue
        h.append(f"<div class=\"metric\" id=\"g-{_anchor(mr.name)[2:]}\"><h3>{e(mr.name)}</h3>")
        png = result.out / "charts" / _group_png(i, mr.name) if result.out is not None else None
        if png is not None and png.is_file():
            data = base64.b64encode(png.read_bytes()).decode("ascii")
            h.append(f"<a href=\"charts/{_e(png.name)}\"><img alt=\"groups chart of {e(mr.name)}\" width=\"900\" "
                     f"height=\"500\" src=\"data:image/png;base64,{data}\"></a>")
        if chart_mr.warning:
            h.append(f"<div class=\"warn\"><b>&#9888; {e(mr.name)}:</b> {e(chart_mr.warning)}</div>")
        h.append("<table><tr>" + "".join(f"<th>{c}</th>" for c in head) + "</tr>")
        for gm, cells in _group_rows(result):
            if gm.metric == mr.name:
                c = _group_cells(gm, cells)
                h.append("<tr>" + f"<td>{e(c[0])}</td>" + "".join(f"<td class=\"num\">{e(v)}</td>" for v in c[2:8])
                         + f"<td>{e(c[8])}</td></tr>")
        h.append("</table></div>")
    h.append("</section>")
    return "\n".join(h)
