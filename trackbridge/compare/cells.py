"""The report's text, shared by its files (:mod:`.report`, :mod:`.report_groups`): spreadsheet-safe CSV cells,
Markdown and HTML escaping, local paths shown without the author's file system, the charts the report opens on, and
each metric's caveat said short (under its chart, in a table's note)."""
from __future__ import annotations

import html
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:       # pragma: no cover
    from . import CompareResult, MetricReport


_FORMULA = ("=", "+", "-", "@", "\t", "\r")


def csv_text(value: object) -> str:
    """A text cell safe to open in a spreadsheet: one that starts like a formula (``=``, ``+``, ``-``, ``@``, a tab
    or a carriage return: ``=HYPERLINK(...)``, ``@SUM(...)``, ``+1+1``) gets a leading ``'``, which spreadsheets
    show as text and do not evaluate (OWASP's advice on CSV injection). Numbers are written by :func:`fmt_csv`."""
    text = "" if value is None else str(value)
    return "'" + text if text.startswith(_FORMULA) else text


def _md_cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _anchor(name: str) -> str:
    from . import slug
    return "m-" + slug(name)


# A local absolute path in text: a "/" followed by a name, at a word's start or after a locator's "KIND:", or the
# fourth slash of ``sqlite:////abs/path``; never the "//" of a URL or a "/" inside a word (kl/ref/k3, tokens/s)
_ABS_PATH = re.compile(r"(?:(?<=:///)|(?<![\w.\\/~-]))/(?=[^/\s])[^\s'\"<>|,;()]+")


class _Paths:
    """Local paths as the report shows them, without the author's file system: relative to the report folder when
    inside it (``charts/001_x.png``), else relative to the folder the command ran in (``examples/verl_console.log``),
    else the last two parts (``…/trackers/mlflow.db``). Applied to every text of the HTML and Markdown."""

    def __init__(self, out: Path) -> None:
        self.bases = [Path(out).resolve()]
        cwd = Path.cwd().resolve()
        if len(cwd.parts) > 1:
            self.bases.append(cwd)

    def show(self, text: str) -> str:
        path = Path(os.path.normpath(text))
        for base in self.bases:
            try:
                return path.relative_to(base).as_posix() or "."
            except ValueError:
                continue
        return "\u2026/" + "/".join(path.parts[-2:]) if len(path.parts) > 2 else path.name or "."

    def text(self, text: object) -> str:
        return _ABS_PATH.sub(lambda m: self.show(m.group(0)), str(text))


KEY_CHARTS = 4        # charts the report opens on


def key_metrics(result: CompareResult, n: int = KEY_CHARTS) -> list[MetricReport]:
    """The charts the report opens on: in report order (the presets' order: effectiveness first), metrics every run
    has first, then those of several runs, then the rest; at most ``n``."""
    runs = len(result.runs)
    ranked = sorted(range(len(result.metrics)), key=lambda i: (
        0 if len(result.metrics[i].runs) == runs else 1 if len(result.metrics[i].runs) > 1 else 2, i))
    chosen = sorted(ranked[:n])
    return [result.metrics[i] for i in chosen]


def footnote(mr: MetricReport) -> str | None:
    """What a chart's PNG says under it: the kind of warning and, per run, what differs (the mapping's ``[tags]``),
    complete and short; the reasons in full are in report.html and summary.md."""
    if not mr.warning:
        return None
    parts = []
    differ, unproven = mr.differs, mr.unproven
    if differ:
        per_run = [f"{label}{' ' + tags if tags else ''}" for label, why in differ.items()
                   for tags in (_tags(why),)]
        if len(", ".join(per_run)) > 200:
            per_run = [f"{len(per_run)} runs"]
        head = "Not the same quantity in every run" if len(mr.runs) > 1 else "Approximate translation"
        parts.append(f"{head}: approximate in {'; '.join(per_run)}.")
    if unproven:
        who = ", ".join(unproven) if len(", ".join(unproven)) <= 200 else f"{len(unproven)} runs"
        parts.append(f"Stated, not proven in {who}.")
    for text in mr.look_alikes:
        what, _, _ = text.partition(": ")
        parts.append(what[0].upper() + what[1:] + ": a different quantity.")
    parts.append("Reasons: report.html, summary.md.")
    return " ".join(parts)


#: warning groups whose reason the metric's chart says in full (the warnings list then names the runs and fields)
_SAID_AT_CHART = ("differs", "approximate", "unproven")


def _brief(mr: MetricReport) -> str:
    """Which runs a metric's caveat concerns and what differs, short: "approximate in run-a [processes]; stated, not
    proven in run-b"."""
    parts = [f"approximate in {label} {_tags(why)}".rstrip() for label, why in mr.differs.items()]
    if mr.unproven:
        parts.append(f"stated, not proven in {', '.join(mr.unproven)}")
    parts += [t.split(": ")[0] for t in mr.look_alikes]
    return "; ".join(parts)


def _tags(why: str) -> str:
    found = re.findall(r"\[([a-z_]+(?:, [a-z_]+)*)\]", why)
    return f"[{found[-1]}]" if found else ""
