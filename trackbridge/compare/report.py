"""The report: ``report.html`` (self-contained), ``charts/*.png``, ``summary.csv`` and ``summary.md``.

The HTML loads nothing: the charts are embedded as base64 data URIs, the style is inline, there is no script, and a
Content-Security-Policy forbids any other load, so it opens offline and from an e-mail attachment alike.
"""
from __future__ import annotations

import base64
import csv
import datetime as _dt
import html
from pathlib import Path

from .. import __version__ as _tb_version
from .align import X_LABELS, Axis, series, smooth as _smooth
from .plot import Chart, Line, draw
from .presets import PRESETS
from .stats import COLUMNS, fmt_csv, fmt_short

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
"""


def write_report(result, axes: dict[str, Axis], *, smooth_kind: str = "ema", title: str | None = None) -> None:
    from . import slug

    out: Path = result.out
    out.mkdir(parents=True, exist_ok=True)
    charts_dir = out / "charts"
    charts_dir.mkdir(exist_ok=True)
    for old in charts_dir.glob("*.png"):          # charts of an earlier report in the same folder
        old.unlink()
    by_label = {r.label: r for r in result.runs}
    xlabel = X_LABELS[result.x]
    for i, mr in enumerate(result.metrics, 1):
        lines = []
        for label in mr.runs:
            run = by_label[label]
            xs, ys = series(run, mr.name, axes[label])
            sm = _smooth(ys, result.smooth, smooth_kind) if result.smooth > 1 and ys else None
            lines.append(Line(label, xs, ys, sm, color=_color(result.runs, label)))
        ylabel = mr.name + (f" [{mr.unit}]" if mr.unit else "")
        path = charts_dir / f"{i:03d}_{slug(mr.name)}.png"
        draw(Chart(mr.name, ylabel, xlabel, lines, warning=mr.warning), path)
        mr.chart = path
        result.pngs.append(path)
    result.summary_csv = _write_csv(result, out / "summary.csv")
    result.summary_md = _write_md(result, out / "summary.md", title)
    result.html = _write_html(result, out / "report.html", title, smooth_kind)


def _color(runs, label: str) -> str:
    from .plot import COLORS
    idx = [r.label for r in runs].index(label)
    return COLORS[idx % len(COLORS)]


def _rows(result):
    for mr in result.metrics:
        for st in mr.stats:
            yield st


def _write_csv(result, path: Path) -> Path:
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(COLUMNS)
        for st in _rows(result):
            w.writerow([st.metric, st.run, fmt_csv(st.first), fmt_csv(st.last), fmt_csv(st.min), fmt_csv(st.max),
                        fmt_csv(st.mean), st.points, st.note])
    return path


def _md_cell(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _title(result, title):
    return title or ("trackbridge comparison: " + " vs ".join(r.label for r in result.runs)
                     if len(result.runs) > 1 else f"trackbridge report: {result.runs[0].label}")


def _write_md(result, path: Path, title) -> Path:
    lines = [f"# {_title(result, title)}", ""]
    lines.append(f"x axis: {X_LABELS[result.x]}. Statistics are over the values as logged (not smoothed), in log "
                 "order; `points` counts every numeric value.")
    lines.append("")
    lines.append("| run | locator | translated from |")
    lines.append("|---|---|---|")
    for r in result.runs:
        lines.append(f"| {_md_cell(r.label)} | `{_md_cell(r.locator)}` | {_md_cell(r.source)} |")
    lines.append("")
    if result.warnings:
        lines.append("## Warnings")
        lines.append("")
        lines += [f"- {_md_cell(w)}" for w in result.warnings]
        lines.append("")
    lines.append("## Summary")
    lines.append("")
    lines.append("| " + " | ".join(COLUMNS) + " |")
    lines.append("|" + "|".join("---" for _ in COLUMNS) + "|")
    for st in _rows(result):
        cells = [f"`{st.metric}`", st.run, fmt_short(st.first), fmt_short(st.last), fmt_short(st.min),
                 fmt_short(st.max), fmt_short(st.mean), str(st.points), st.note]
        lines.append("| " + " | ".join(_md_cell(c) for c in cells) + " |")
    lines.append("")
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


def _e(text) -> str:
    return html.escape(str(text), quote=True)


def _anchor(name: str) -> str:
    from . import slug
    return "m-" + slug(name)


def _write_html(result, path: Path, title, smooth_kind: str) -> Path:
    t = _title(result, title)
    h: list[str] = []
    h.append("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">")
    h.append(f"<meta http-equiv=\"Content-Security-Policy\" content=\"{CSP}\">")
    h.append("<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">")
    h.append(f"<title>{_e(t)}</title><style>{STYLE}</style></head><body>")
    h.append(f"<h1>{_e(t)}</h1>")
    smooth_txt = ("no smoothing" if result.smooth <= 1 else
                  (f"EMA of span {result.smooth}" if smooth_kind == "ema" else f"trailing mean of {result.smooth} "
                   "points") + " drawn over the faint raw values")
    h.append(f"<p class=\"meta\">x axis: {_e(X_LABELS[result.x])} &middot; {_e(smooth_txt)} &middot; tables use "
             f"the values as logged &middot; trackbridge {_e(_tb_version)} &middot; "
             f"{_dt.datetime.now().strftime('%Y-%m-%d %H:%M')}</p>")

    # runs
    h.append("<h2 id=\"runs\">Runs</h2><table><tr><th>run</th><th>locator</th><th>translated from (detected "
             "framework)</th><th>records</th><th>steps</th><th>wall time</th><th>derived</th><th>unmapped "
             "(kept as stored)</th></tr>")
    for r in result.runs:
        steps = [rec.step for rec in r.records if rec.step is not None]
        step_txt = f"{min(steps)}&ndash;{max(steps)}" if steps else "none"
        unm = ", ".join(r.unmapped)
        h.append(f"<tr><td><b>{_e(r.label)}</b></td><td><code>{_e(r.locator)}</code></td><td>{_e(r.source)}</td>"
                 f"<td class=\"num\">{len(r.records)}</td><td class=\"num\">{step_txt}</td>"
                 f"<td>{'yes' if r.has_wall_time else 'none in the source'}</td>"
                 f"<td>{_e(', '.join(r.derived)) or '&mdash;'}</td>"
                 f"<td>{_e(unm) if unm else '&mdash;'}</td></tr>")
    h.append("</table>")
    notes = [(r.label, n) for r in result.runs for n in r.notes]
    if notes:
        h.append("<ul class=\"note\">" + "".join(f"<li>{_e(lbl)}: {_e(n)}</li>" for lbl, n in notes) + "</ul>")

    # warnings
    if result.warnings:
        h.append("<h2 id=\"warnings\">Warnings</h2><ul>")
        for w in result.warnings:
            h.append(f"<li>{_e(w)}</li>")
        h.append("</ul>")

    # only in one run
    if len(result.runs) > 1:
        h.append("<h2 id=\"only-one\">Metrics in only one run</h2>")
        if result.only_one_run:
            h.append("<table><tr><th>metric</th><th>only in</th></tr>")
            for name, label in result.only_one_run.items():
                h.append(f"<tr><td><a href=\"#{_anchor(name)}\"><code>{_e(name)}</code></a></td>"
                         f"<td>{_e(label)}</td></tr>")
            h.append("</table>")
        else:
            h.append("<p>None: every charted metric is in more than one run.</p>")

    # contents
    h.append("<h2 id=\"contents\">Metrics</h2>")
    groups: dict[str, list] = {p: [] for p in PRESETS}
    groups["other"] = []
    for mr in result.metrics:
        groups[mr.preset or "other"].append(mr)
    h.append("<ul class=\"toc\">")
    for g, items in groups.items():
        if not items:
            continue
        links = ", ".join(f"<a href=\"#{_anchor(m.name)}\"><code>{_e(m.name)}</code></a>"
                          + (" <span class=\"badge\" title=\"not the same quantity in every run\">&#9888;</span>"
                             if m.warning else "") for m in items)
        h.append(f"<li><b>{_e(g)}</b>: {links}</li>")
    h.append("</ul>")
    if not result.metrics:
        h.append("<p>No metric to show.</p>")

    # one section per metric
    for mr in result.metrics:
        h.append(f"<section class=\"metric\" id=\"{_anchor(mr.name)}\"><h3>{_e(mr.name)}</h3>")
        desc = _e(mr.description) + (f" &middot; unit: <code>{_e(mr.unit)}</code>" if mr.unit else "")
        if desc:
            h.append(f"<p class=\"meta\">{desc}</p>")
        if mr.warning:
            h.append(f"<div class=\"warn\"><b>&#9888; {_e(mr.name)}:</b> {_e(mr.warning)}</div>")
        for n in mr.axis_notes:
            h.append(f"<p class=\"note\">{_e(n)}</p>")
        if mr.chart is not None and mr.chart.is_file():
            data = base64.b64encode(mr.chart.read_bytes()).decode("ascii")
            h.append(f"<img alt=\"chart of {_e(mr.name)}\" width=\"900\" height=\"500\" "
                     f"src=\"data:image/png;base64,{data}\">")
        h.append("<table><tr>" + "".join(f"<th>{c}</th>" for c in COLUMNS[1:]) + "</tr>")
        for st in mr.stats:
            cells = [f"<td>{_e(st.run)}</td>"]
            cells += [f"<td class=\"num\" title=\"{_e(fmt_csv(v))}\">{_e(fmt_short(v))}</td>"
                      for v in (st.first, st.last, st.min, st.max, st.mean)]
            cells.append(f"<td class=\"num\">{st.points}</td>")
            cells.append(f"<td>{_e(st.note)}</td>")
            h.append("<tr>" + "".join(cells) + "</tr>")
        h.append("</table></section>")
    h.append("<p class=\"meta\">Same table as CSV and Markdown: <code>summary.csv</code>, <code>summary.md</code>; "
             "charts as PNG files in <code>charts/</code>.</p>")
    h.append("</body></html>\n")
    path.write_text("\n".join(h), encoding="utf-8")
    return path
