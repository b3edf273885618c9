"""Findings in words: the text ``trackbridge doctor`` prints, the one-line text record the logger writes, and the
short sentences of the comparison report."""
from __future__ import annotations

import re
from typing import TYPE_CHECKING, Iterable

from .checks import SEVERITIES

if TYPE_CHECKING:       # pragma: no cover
    from . import Diagnosis
    from .findings import Finding

__all__ = ["text_report", "finding_text", "live_text", "counts", "named", "with_names", "live_alert"]

_LIVE = re.compile(r"^(critical|warning|info): (.+?) \[([A-Za-z0-9_.-]+)\] at ")


def named(canonical: str, f: Finding, names_from: str = "your") -> str:
    """A series as a finding shows it: ``response/clip_ratio (your completions/clipped_ratio)`` where the run (or,
    with ``names_from`` a framework, that framework) calls it otherwise; the canonical name alone when not."""
    other = f.names.get(canonical)
    if not other:
        return canonical
    return f"{canonical} (your {other})" if names_from == "your" else f"{canonical} ({names_from}: {other})"


def with_names(text: str, f: Finding, names_from: str = "your") -> str:
    """``text`` (a stretch's evidence, in canonical names) with the user's name beside the first mention of each
    canonical series the finding read."""
    for canon in sorted(f.names, key=len, reverse=True):        # a longer name first: kl/ref/k3 before kl/ref
        rx = re.compile(r"(?<![\w/.])" + re.escape(canon) + r"(?![\w/]|\.\w)")
        text = rx.sub(lambda m: named(canon, f, names_from), text, count=1)
    return text


def _series_line(f: Finding, names_from: str) -> str | None:
    """``reads: a (your x), b`` when the finding has user names (the evidence may not mention every series)."""
    if not f.names:
        return None
    return "reads: " + ", ".join(named(c, f, names_from) for c in f.metrics())


def counts(findings: Iterable[Finding]) -> str:
    """``2 findings (1 critical, 1 warning)`` / ``no findings``."""
    found = list(findings)
    if not found:
        return "no findings"
    per = [f"{sum(1 for f in found if f.severity == s)} {s}" for s in SEVERITIES
           if any(f.severity == s for f in found)]
    return f"{len(found)} finding{'s' if len(found) != 1 else ''} ({', '.join(per)})"


def finding_text(f: Finding, number: int | None = None, *, indent: str = "   ",
                 names_from: str = "your") -> list[str]:
    """One finding as ``trackbridge doctor`` prints it: the headline, the series it read (in the user's names
    beside the canonical ones), where and what, the meaning, what to check, the notes and caveats, the sources."""
    head = f"{number}. " if number is not None else ""
    out = [f"{head}{f.severity.upper()}  {f.check.title}  [{f.check.id}]"]
    series = _series_line(f, names_from)
    if series:
        out.append(f"{indent}{series}")
    for st in f.stretches[:3]:
        out.append(f"{indent}{st.steps()}: {with_names(st.text, f, names_from)}")
    if f.count > 3:
        out.append(f"{indent}... {f.count - 3} more time{'s' if f.count - 3 > 1 else ''}, the last at "
                   f"{f.stretches[-1].steps()}")
    out.append(f"{indent}means: {f.check.means}")
    for n in f.notes:
        out.append(f"{indent}note: {n}")
    out.append(f"{indent}check first: {f.check.check_first}")
    if f.check.then_check:
        out.append(f"{indent}then check: {f.check.then_check}")
    for c in f.caveats:
        out.append(f"{indent}caveat: {c}")
    out.append(f"{indent}source: " + "; ".join(str(c) for c in f.check.cites))
    return out


def text_report(diagnoses: list[Diagnosis], *, verbose: bool = False) -> str:
    """The findings of every run, each run's ordered by what to look at first."""
    lines: list[str] = []
    for d in diagnoses:
        lines.append(f"run {d.label} ({d.locator}): {d.records} records, translated from {d.source or '?'}: "
                     f"{counts(d.findings)}; {len(d.ran)} of {len(d.ran) + len(d.not_run)} checks apply")
        for p in d.problems:
            lines.append(f"   skipped while reading: {p}")
        for n in getattr(d, "notes", ()):
            lines.append(f"   note: {n}")
        for i, f in enumerate(d.findings, 1):
            lines.extend(finding_text(f, i, names_from=getattr(d, "names_from", "your")))
        if verbose and d.not_run:
            lines.append("   checks that could not run:")
            for cid, why in d.not_run.items():
                lines.append(f"     {cid}: {why}")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def live_text(f: Finding) -> str:
    """The text record and warning the logger writes when a check first holds: one paragraph, self-contained."""
    parts = [f"{f.severity}: {f.check.title} [{f.check.id}] at {f.stretches[0].steps()}: "
             f"{with_names(f.stretches[0].text, f)}.",
             f"Means: {f.check.means}", *(f"Note: {n}" for n in f.notes),
             f"Check first: {f.check.check_first}"]
    if f.check.then_check:
        parts.append(f"Then check: {f.check.then_check}")
    parts += [f"Caveat: {c}" for c in f.caveats]
    return " ".join(parts)


def live_alert(key: str, value: object) -> tuple[str, str, str, str] | None:
    """A live finding's text record (``doctor/<id>`` = :func:`live_text`) as a tracker alert: ``(check id,
    severity, title, text)``; None for any other value. What a sink with alerts of its own (wandb's
    ``run.alert``, Trackio's alerts table) raises for it."""
    if not key.startswith("doctor/") or not isinstance(value, str):
        return None
    m = _LIVE.match(value)
    if m is None or m.group(3) != key[len("doctor/"):]:
        return None
    return m.group(3), m.group(1), f"trackbridge doctor: {m.group(2)}", value
