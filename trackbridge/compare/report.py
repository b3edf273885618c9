"""The report: ``report.html`` (self-contained), ``charts/*.png``, ``summary.csv`` and ``summary.md``; with groups
(seeds aggregated, :mod:`.groups`) also ``charts/groups_*.png``, ``groups.csv`` and a "Groups" section in
``report.html`` and ``summary.md``.

The HTML loads nothing: the charts are embedded as base64 data URIs, the style is inline, there is no script, and a
Content-Security-Policy forbids any other load, so it opens offline and from an e-mail attachment alike.

Output folders: :mod:`.manifest` (a command deletes only files it wrote itself).
"""
from __future__ import annotations

import base64
import csv
import datetime as _dt
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator

from .._version import __version__ as _tb_version
from .align import X_LABELS, Axis, series
from .align import smooth as _smooth
from .cells import (
    _SAID_AT_CHART,
    _anchor,
    _brief,
    _e,
    _md_cell,
    _Paths,
    csv_text,
    footnote,
    key_metrics,
)
from .manifest import OutputManifest
from .plot import Chart, Line, charting, draw
from .presets import PRESETS
from .report_groups import _draw_groups, _group_html, _group_md, _group_png, _write_groups_csv
from .stats import COLUMNS, MetricStats, fmt_csv, fmt_short

if TYPE_CHECKING:       # pragma: no cover  (the package imports this module on use: no import at run time)
    from . import CompareResult, MetricReport
    from .load import LoadedRun

CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"

STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;margin:24px auto;max-width:1100px;
     color:#1d1d1f;background:#fff;line-height:1.4;padding:0 16px}
h1{font-size:1.6em;margin-bottom:.2em} h2{margin-top:1.6em;border-bottom:1px solid #ddd;padding-bottom:.2em}
h3{margin:.2em 0;font-family:ui-monospace,Menlo,Consolas,monospace;font-size:1.15em}
table{border-collapse:collapse;margin:.5em 0 1em 0;font-size:.9em}
th,td{border:1px solid #d0d0d0;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f3f3f3} td.num{text-align:right;font-family:ui-monospace,Menlo,Consolas,monospace}
code{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:.95em;overflow-wrap:anywhere}
.meta{color:#555;font-size:.9em}
.warn{background:#fff4e5;border-left:4px solid #e67700;padding:6px 10px;margin:.5em 0;color:#5c2b00}
.metric{margin:1.2em 0 2em 0;padding-top:.4em;border-top:1px solid #eee}
.metric img{max-width:100%;height:auto;border:1px solid #eee}
.toc li{margin:.1em 0} .badge{color:#b35c00;font-weight:bold}
.note{color:#555}
details{margin:.3em 0} details summary{cursor:pointer} details li{margin:.25em 0}
.warngroup{background:#fff8ef;border-left:4px solid #e67700;padding:4px 10px}
#findings ul{margin:.2em 0 .6em 0;padding-left:1.2em} #findings li{margin:.25em 0}
#findings h3{font-family:inherit;font-size:1em;margin:.4em 0 0 0}
.sev{display:inline-block;min-width:4.5em;font-size:.8em;font-weight:bold;text-transform:uppercase}
.sev-critical .sev{color:#b00020} .sev-warning .sev{color:#b35c00} .sev-info .sev{color:#1f5fa8}
"""


def write_report(result: CompareResult, axes: dict[str, Axis], *, smooth_kind: str = "ema",
                 title: str | None = None) -> None:
    """Write the charts, ``summary.csv``, ``summary.md`` and ``report.html`` of ``result`` into ``result.out``
    (recorded in an output manifest, so that a later report replaces exactly these files)."""
    from . import slug

    out = result.out
    assert out is not None, "write_report: the comparison has no output folder"
    charts = [f"charts/{i:03d}_{slug(mr.name)}.png" for i, mr in enumerate(result.metrics, 1)]
    charts += [f"charts/{_group_png(i, mr.name)}" for i, mr in enumerate(result.metrics, 1)
               if mr.name in result.group_chart_reports]
    manifest = OutputManifest.prepare(out, "compare", [*charts, "report.html", "summary.csv", "summary.md",
                                                        *(["groups.csv"] if result.groups else [])])
    charts_dir = out / "charts"
    charts_dir.mkdir(parents=True, exist_ok=True)
    by_label = {r.label: r for r in result.runs}
    xlabel = X_LABELS[result.x]
    with charting():
        for i, mr in enumerate(result.metrics, 1):
            lines: list[Line] = []
            for label in mr.runs:
                run = by_label[label]
                xs, ys = series(run, mr.name, axes[label])
                sm = _smooth(ys, result.smooth, smooth_kind) if result.smooth > 1 and ys else None
                lines.append(Line(label, xs, ys, sm, color=_color(result.runs, label)))
            ylabel = mr.name + (f" [{mr.unit}]" if mr.unit else "")
            path = charts_dir / f"{i:03d}_{slug(mr.name)}.png"
            draw(Chart(mr.name, ylabel, xlabel, lines, warning=footnote(mr)), path)
            mr.chart = path
            result.pngs.append(path)
            if mr.name in result.group_chart_reports:
                result.pngs.append(_draw_groups(result, i, mr, charts_dir / _group_png(i, mr.name), xlabel))
    result.summary_csv = _write_csv(result, out / "summary.csv")
    if result.groups:
        _write_groups_csv(result, out / "groups.csv")
    result.summary_md = _write_md(result, out / "summary.md", title)
    result.html = _write_html(result, out / "report.html", title, smooth_kind)
    manifest.save()


def _color(runs: list[LoadedRun], label: str) -> str:
    from .plot import COLORS
    idx = [r.label for r in runs].index(label)
    return COLORS[idx % len(COLORS)]


def _rows(result: CompareResult) -> Iterator[MetricStats]:
    for mr in result.metrics:
        for st in mr.stats:
            yield st


def _write_csv(result: CompareResult, path: Path) -> Path:
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(COLUMNS)
        for st in _rows(result):
            w.writerow([csv_text(st.metric), csv_text(st.run), fmt_csv(st.first), fmt_csv(st.last), fmt_csv(st.min),
                        fmt_csv(st.max), fmt_csv(st.mean), st.points, csv_text(st.note)])
    return path


def _title(result: CompareResult, title: str | None) -> str:
    return title or ("trackbridge comparison: " + " vs ".join(r.label for r in result.runs)
                     if len(result.runs) > 1 else f"trackbridge report: {result.runs[0].label}")


def _write_md(result: CompareResult, path: Path, title: str | None) -> Path:
    paths = _Paths(path.parent)
    lines = [f"# {_title(result, title)}", ""]
    lines.append(f"x axis: {X_LABELS[result.x]}. Statistics are over the values as logged (not smoothed), in log "
                 "order; `points` counts every numeric value.")
    lines.append("")
    lines.append("| run | locator | translated from |")
    lines.append("|---|---|---|")
    for r in result.runs:
        lines.append(f"| {_md_cell(r.label)} | `{_md_cell(r.locator)}` | {_md_cell(r.source)} |")
    lines.append("")
    if result.findings:
        lines.append("## Findings")
        lines.append("")
        for f in result.findings:
            lines.append(f"- {_md_cell(f.run)}: {_md_cell(f.severity)}: {_md_cell(f.check.title)} "
                         f"(`{f.id}`), {_md_cell(f.where())}: {_md_cell(f.stretches[0].text)}. Check first: "
                         f"{_md_cell(f.check.check_first)}")
        lines.append("")
    if result.warnings:
        lines.append("## Warnings")
        lines.append("")
        lines.append(f"{result.fidelity_line()}; each reason is said once, here (the summary's notes name the "
                     "fields).")
        lines.append("")
        lines += [f"- {_md_cell(w)}" for w in result.warnings]
        lines.append("")
    if result.group_members:
        lines += _group_md(result)
    lines.append("## Summary")
    lines.append("")
    lines.append("| " + " | ".join(COLUMNS) + " |")
    lines.append("|" + "|".join("---" for _ in COLUMNS) + "|")
    for st in _rows(result):
        cells = [f"`{st.metric}`", st.run, fmt_short(st.first), fmt_short(st.last), fmt_short(st.min),
                 fmt_short(st.max), fmt_short(st.mean), str(st.points), st.brief]
        lines.append("| " + " | ".join(_md_cell(c) for c in cells) + " |")
    lines.append("")
    path.write_text(paths.text("\n".join(lines)), encoding="utf-8")
    return path


def _write_html(result: CompareResult, path: Path, title: str | None, smooth_kind: str) -> Path:
    """The report: title, the findings (when any), the key charts, the warnings grouped, the runs, every metric.

    Layout, top to bottom: the title and one line of context (runs, axis, files); ``<section id="findings">``,
    the diagnostic checks' findings per run, each linked to the charts it read (:attr:`CompareResult.findings`;
    nothing when there are none); the key charts (:func:`key_metrics`) so that the first screen shows a chart; the
    warnings, one ``<details>`` per kind with its count and every warning in full; the runs; the metrics of one run;
    the contents and every other metric's section. No absolute local path appears (:class:`_Paths`); links are
    relative to the report folder."""
    paths = _Paths(path.parent)

    def e(text: object) -> str:
        return _e(paths.text(text))

    n_warn = sum(len(v) for v in result.warning_groups.values()) or len(result.warnings)
    h = _html_head(result, _title(result, title), smooth_kind, n_warn, e)

    # findings: trackbridge doctor's, per run, above the charts, each linked to the charts it concerns
    h.append("<!-- findings: per run, ordered by what to look at first, each linked to the charts below -->")
    if result.findings:
        h.append(_findings(result, e))

    # the key charts
    key = key_metrics(result)
    if key:
        h.append("<h2 id=\"key\">Key charts</h2>")
        for mr in key:
            h.append(_section(mr, e))
    else:
        h.append("<p>No metric to show.</p>")

    # seeds aggregated
    if result.group_members:
        h.append(_group_html(result, e))

    # warnings, grouped
    if result.warnings:
        h += _warnings_html(result, n_warn, e)

    h += _runs_html(result, e)

    # only in one run
    if len(result.runs) > 1:
        h += _only_one_html(result, e)

    h += _contents_html(result, key, e)

    # one section per metric (the key charts' are above)
    shown = {id(m) for m in key}
    for mr in result.metrics:
        if id(mr) not in shown:
            h.append(_section(mr, e))
    h.append("<p class=\"meta\">Same table as CSV and Markdown: <a href=\"summary.csv\">summary.csv</a>, "
             "<a href=\"summary.md\">summary.md</a>; charts as PNG files in <code>charts/</code>.</p>")
    h.append("</body></html>\n")
    path.write_text("\n".join(h), encoding="utf-8")
    return path


def _html_head(result: CompareResult, t: str, smooth_kind: str, n_warn: int, e: Callable[[object], str]) -> list[str]:
    """The page's head, its title and the line of context under it (runs, axis, smoothing, links, version, time)."""
    h: list[str] = []
    h.append("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">")
    h.append(f"<meta http-equiv=\"Content-Security-Policy\" content=\"{CSP}\">")
    h.append("<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">")
    h.append(f"<title>{e(t)}</title><style>{STYLE}</style></head><body>")
    h.append(f"<h1>{e(t)}</h1>")
    smooth_txt = ("no smoothing" if result.smooth <= 1 else
                  (f"EMA of span {result.smooth}" if smooth_kind == "ema" else f"trailing mean of {result.smooth} "
                   "points") + " drawn over the faint raw values")
    runs_txt = ", ".join(f"<b>{e(r.label)}</b> ({e(r.source)})" for r in result.runs)
    h.append(f"<p class=\"meta\">{runs_txt} &middot; x axis: {e(X_LABELS[result.x])} &middot; {e(smooth_txt)}"
             + (f" &middot; <a href=\"#warnings\">&#9888; {n_warn} warning{'s' if n_warn != 1 else ''}</a>"
                if n_warn else "")
             + (f" &middot; <a href=\"#groups\">{len(result.group_members)} groups</a>" if result.group_members
                else "")
             + f" &middot; <a href=\"#contents\">all {len(result.metrics)} metrics</a> &middot; "
             "<a href=\"summary.csv\">summary.csv</a> &middot; <a href=\"summary.md\">summary.md</a> &middot; "
             f"trackbridge {e(_tb_version)} &middot; {_dt.datetime.now().strftime('%Y-%m-%d %H:%M')}</p>")
    return h


def _warnings_html(result: CompareResult, n_warn: int, e: Callable[[object], str]) -> list[str]:
    """The warnings section: one expandable list per kind, with its count, each warning linked to its metric."""
    from . import WARNING_GROUPS
    groups = result.warning_groups or {"other": [(None, w) for w in result.warnings]}
    h = [f"<h2 id=\"warnings\">Warnings ({n_warn})</h2>",
         f"<p class=\"meta\">{e(result.fidelity_line())}; each reason is said once, at its chart.</p>"]
    for g in [*WARNING_GROUPS, *(g for g in groups if g not in WARNING_GROUPS)]:
        items = groups.get(g)
        if not items:
            continue
        label = WARNING_GROUPS.get(g, "Other")
        h.append(f"<details class=\"warngroup\"><summary><b>{e(label)}</b>: {len(items)}</summary><ul>")
        for metric, text in items:
            said = result.metric(metric) if metric is not None and g in _SAID_AT_CHART else None
            if metric is not None and said is not None:
                # the reason in full is said once, at the metric's chart; here which runs and what differs
                h.append(f"<li><a href=\"#{_anchor(metric)}\"><code>{e(metric)}</code></a>: "
                         f"{e(_brief(said))}</li>")
            elif metric is not None and text.startswith(metric + ": "):
                text = text[len(metric) + 2:]
                h.append(f"<li><a href=\"#{_anchor(metric)}\"><code>{e(metric)}</code></a>: {e(text)}</li>")
            else:
                h.append(f"<li>{e(text)}</li>")
        h.append("</ul></details>")
    return h


def _runs_html(result: CompareResult, e: Callable[[object], str]) -> list[str]:
    """The runs section: a table of every run's source, steps and names, then each run's translation notes."""
    h = ["<h2 id=\"runs\">Runs</h2><table><tr><th>run</th><th>locator</th><th>translated from (detected "
         "framework)</th><th>records</th><th>steps</th><th>wall time</th><th>derived</th><th>unmapped "
         "(kept as stored)</th></tr>"]
    for r in result.runs:
        rng = r.step_range()          # from the packed steps kept while streaming: the run is not read again
        step_txt = f"{rng[0]}&ndash;{rng[1]}" if rng else "none"
        unm = ", ".join(r.unmapped)
        h.append(f"<tr><td><b>{e(r.label)}</b></td><td><code>{e(r.locator)}</code></td><td>{e(r.source)}</td>"
                 f"<td class=\"num\">{len(r.records)}</td><td class=\"num\">{step_txt}</td>"
                 f"<td>{'yes' if r.has_wall_time else 'none in the source'}</td>"
                 f"<td>{e(', '.join(r.derived)) or '&mdash;'}</td>"
                 f"<td>{e(unm) if unm else '&mdash;'}</td></tr>")
    h.append("</table>")
    for r in result.runs:
        if r.notes:
            h.append(f"<details class=\"note\"><summary>{e(r.label)}: {len(r.notes)} note"
                     f"{'s' if len(r.notes) != 1 else ''} from the translation</summary><ul>"
                     + "".join(f"<li>{e(n)}</li>" for n in r.notes) + "</ul></details>")
    return h


def _only_one_html(result: CompareResult, e: Callable[[object], str]) -> list[str]:
    """The section of the metrics found in only one run, each linked to its chart."""
    h = ["<h2 id=\"only-one\">Metrics in only one run</h2>"]
    if result.only_one_run:
        h.append("<table><tr><th>metric</th><th>only in</th></tr>")
        for name, label in result.only_one_run.items():
            h.append(f"<tr><td><a href=\"#{_anchor(name)}\"><code>{e(name)}</code></a></td>"
                     f"<td>{e(label)}</td></tr>")
        h.append("</table>")
    else:
        h.append("<p>None: every charted metric is in more than one run.</p>")
    return h


def _contents_html(result: CompareResult, key: list[MetricReport], e: Callable[[object], str]) -> list[str]:
    """The contents: every metric linked to its section, by preset, then the links to the key charts."""
    h = ["<h2 id=\"contents\">All metrics</h2>"]
    groups_m: dict[str, list[MetricReport]] = {p: [] for p in PRESETS}
    groups_m["other"] = []
    for mr in result.metrics:
        groups_m[mr.preset or "other"].append(mr)
    h.append("<ul class=\"toc\">")
    for g, items_m in groups_m.items():
        if not items_m:
            continue
        links = ", ".join(f"<a href=\"#{_anchor(m.name)}\"><code>{e(m.name)}</code></a>"
                          + (" <span class=\"badge\" title=\"not the same quantity in every run\">&#9888;</span>"
                             if m.warning else "") for m in items_m)
        h.append(f"<li><b>{e(g)}</b>: {links}</li>")
    h.append("</ul>")
    if key:
        h.append("<p class=\"meta\">The key charts are at the top: "
                 + ", ".join(f"<a href=\"#{_anchor(m.name)}\"><code>{e(m.name)}</code></a>" for m in key) + ".</p>")
    return h


def _findings(result: CompareResult, e: Callable[[object], str]) -> str:
    """The findings section: per run, one line per finding (severity, what, where, links to its charts), its
    evidence, meaning, what to check and its caveats folded under it."""
    charted = {m.name for m in result.metrics}
    by_run: dict[str, list] = {}
    for f in result.findings:
        by_run.setdefault(f.run, []).append(f)
    h = ["<section id=\"findings\"><h2>Findings</h2>",
         "<p class=\"meta\">What the diagnostic checks (<code>trackbridge doctor</code>, mappings/checks.yaml) found "
         "in each run, ordered by what to look at first; each links to the charts it read.</p>"]
    for run in result.runs:
        items = by_run.get(run.label)
        if not items:
            if len(result.runs) > 1:
                h.append(f"<h3>{e(run.label)}</h3><p class=\"note\">No findings.</p>")
            continue
        h.append(f"<h3>{e(run.label)}</h3><ul>")
        for f in items:
            links = ", ".join(f"<a href=\"#{_anchor(m)}\"><code>{e(m)}</code></a>" if m in charted else
                              f"<code>{e(m)}</code>" for m in f.metrics())
            more = [f"<p>{e(st.steps())}: {e(st.text)}</p>" for st in f.stretches[:3]]
            more.append(f"<p><b>Means:</b> {e(f.check.means)}</p>")
            more += [f"<p><b>Note:</b> {e(n)}</p>" for n in f.notes]
            more.append(f"<p><b>Check first:</b> {e(f.check.check_first)}</p>")
            if f.check.then_check:
                more.append(f"<p><b>Then check:</b> {e(f.check.then_check)}</p>")
            more += [f"<p><b>Caveat:</b> {e(c)}</p>" for c in f.caveats]
            more.append("<p class=\"meta\">Source: " + "; ".join(e(c) for c in f.check.cites) + "</p>")
            h.append(f"<li class=\"sev-{e(f.severity)}\" id=\"f-{_anchor(run.label)[2:]}-{e(f.id)}\">"
                     f"<span class=\"sev\">{e(f.severity)}</span> <b>{e(f.check.title)}</b>, {e(f.where())}: "
                     f"{links}<details><summary>why, and what to check</summary>{''.join(more)}</details></li>")
        h.append("</ul>")
    h.append("</section>")
    return "\n".join(h)


def _section(mr: MetricReport, e: Callable[[object], str]) -> str:
    """One metric: name, description, chart (linked to its PNG), the warning in full, axis notes, the table."""
    h = [f"<section class=\"metric\" id=\"{_anchor(mr.name)}\"><h3>{e(mr.name)}</h3>"]
    desc = e(mr.description) + (f" &middot; unit: <code>{e(mr.unit)}</code>" if mr.unit else "")
    if desc:
        h.append(f"<p class=\"meta\">{desc}</p>")
    if mr.chart is not None and mr.chart.is_file():
        data = base64.b64encode(mr.chart.read_bytes()).decode("ascii")
        h.append(f"<a href=\"charts/{_e(mr.chart.name)}\"><img alt=\"chart of {e(mr.name)}\" width=\"900\" "
                 f"height=\"500\" src=\"data:image/png;base64,{data}\"></a>")
    if mr.warning:
        h.append(f"<div class=\"warn\"><b>&#9888; {e(mr.name)}:</b> {e(mr.warning)}</div>")
    for n in mr.axis_notes:
        h.append(f"<p class=\"note\">{e(n)}</p>")
    h.append("<table><tr>" + "".join(f"<th>{c}</th>" for c in COLUMNS[1:]) + "</tr>")
    for st in mr.stats:
        cells = [f"<td>{e(st.run)}</td>"]
        cells += [f"<td class=\"num\" title=\"{_e(fmt_csv(v))}\">{_e(fmt_short(v))}</td>"
                  for v in (st.first, st.last, st.min, st.max, st.mean)]
        cells.append(f"<td class=\"num\">{st.points}</td>")
        cells.append(f"<td>{e(st.brief)}</td>")
        h.append("<tr>" + "".join(cells) + "</tr>")
    h.append("</table></section>")
    return "\n".join(h)
