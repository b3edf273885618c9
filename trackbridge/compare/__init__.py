"""Compare runs from different frameworks side by side.

``compare_runs(["grpo=trainer-state:grpo/trainer_state.json", "verl=console:verl.log"], out=Path("report"))``
reads every run through the same readers as migration, translates it to canonical names with derived metrics filled
in (:mod:`.load`), aligns the runs on steps, samples, tokens or wall time (:mod:`.align`), and writes to ``out``:

* ``report.html``: self-contained (charts embedded as data URIs, no external CSS/JS). It opens with the findings of
  :mod:`trackbridge.doctor`'s checks per run (each linked to the charts of the metrics it read), then its key charts
  (the first four metrics, those of every run first), then the warnings grouped
  by kind (counted, each group an expandable list with every warning in full), each run's source and detected
  framework, the metrics found in only one run, and one section per metric: a chart of all runs overlaid, the
  warning in full when the quantity is not the same in every run (approximate translation, with the mapping's
  reason), and a table per run. Local paths are shown relative to the report or working folder, never absolute;
* ``charts/*.png``: one chart per metric, with a short footnote saying what differs per run (the reasons are in
  the report);
* ``summary.csv`` and ``summary.md``: the same table (metric, run, first, last, min, max, mean, points, note).

Canonical names that only look alike (``kl/ref/k3`` against ``kl/old_policy/k1``) are different metrics, never one
chart;
the report says so when one run has one and another run the other. With ``into=SINK`` every run is also written,
under canonical names, into one tracker (:mod:`.into`). One run gives the same report for a single run.

With ``groups=`` (``{"TRL": [RUN, ...], "veRL": [...]}`` or ``["TRL=RUN,RUN", ...]``; a RUN is a locator or the
label of a run given in ``locators``) or ``group_by=CONFIG_KEY`` the runs are also aggregated per group (seeds):
the mean curve with its band, the IQM and the final-performance and area-under-curve summaries with rliable's
intervals, and the runs behind each point (:mod:`.groups`), in :attr:`CompareResult.groups` and the report's
"Groups" section.

Runs are streamed (:mod:`.load`): memory holds each run's statistics and the points its charts draw, not its
records, so it does not grow with the inputs' size.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

from ..schema.proofs import only_unproven
from .align import SMOOTH_KINDS, X_KINDS, Axis, run_axis, series
from .groups import LAST, REPS, SEED, GroupMetric
from .load import LoadedRun
from .presets import LOOK_ALIKES, PRESETS, preset_of, select
from .seeds import _aggregate, _group_options, _load_grouped, _members_by_config
from .stats import MetricStats

if TYPE_CHECKING:       # pragma: no cover
    from collections.abc import Mapping, Sequence

    from ..doctor import Finding
    from ..read.selection import Selection
    from ..schema.model import CanonicalSchema

__all__ = ["compare_runs", "CompareResult", "MetricReport", "PRESETS", "X_KINDS", "SMOOTH_KINDS", "WARNING_GROUPS"]


@dataclass
class MetricReport:
    name: str
    unit: str = ""
    description: str = ""
    preset: str | None = None
    runs: list[str] = field(default_factory=list)               # labels of the runs that have the metric
    stats: list[MetricStats] = field(default_factory=list)
    approximate: dict[str, str] = field(default_factory=dict)    # run label -> why approximate there
    originals: dict[str, list[str]] = field(default_factory=dict)  # run label -> stored names it came from
    derived_in: list[str] = field(default_factory=list)
    look_alikes: list[str] = field(default_factory=list)         # plain sentences
    warning: str | None = None                                   # what the chart and the report say
    chart: Path | None = None
    axis_notes: list[str] = field(default_factory=list)

    @property
    def differs(self) -> dict[str, str]:
        """Run label -> why the metric is another quantity there (the approximations other than "stated, not
        proven")."""
        return {label: why for label, why in self.approximate.items() if not only_unproven(why)}

    @property
    def unproven(self) -> list[str]:
        """The runs where the metric is the quantity as stated, but no proof has run that framework's code yet."""
        return [label for label, why in self.approximate.items() if only_unproven(why)]


@dataclass
class CompareResult:
    out: Path | None
    html: Path | None
    summary_csv: Path | None
    summary_md: Path | None
    pngs: list[Path] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    runs: list[LoadedRun] = field(default_factory=list)
    metrics: list[MetricReport] = field(default_factory=list)
    only_one_run: dict[str, str] = field(default_factory=dict)   # metric -> the one run that has it
    missing: list[str] = field(default_factory=list)             # asked for, found in no run
    into: list = field(default_factory=list)                     # IntoResult per run when into= was given
    x: str = "step"
    smooth: int = 0
    # the same warnings by kind (WARNING_GROUPS, in that order): (metric the warning is about or None, full text)
    warning_groups: dict[str, list[tuple[str | None, str]]] = field(default_factory=dict)
    # trackbridge doctor's findings, per run (in run order, each run's ordered by what to look at first), shown
    # above the key charts, each linked to the charts of the metrics it read; empty: no findings section
    findings: list[Finding] = field(default_factory=list)
    # seeds aggregated (groups= / group_by=): group label -> its runs' labels, and per group and metric the aggregate
    group_members: dict[str, list[str]] = field(default_factory=dict)
    groups: list[GroupMetric] = field(default_factory=list)
    group_chart_reports: dict[str, MetricReport] = field(default_factory=dict)  # metric -> caveats over all groups
    band: str = "ci"
    last: int = LAST
    reps: int = REPS
    seed: int = SEED

    def metric(self, name: str) -> MetricReport | None:
        return next((m for m in self.metrics if m.name == name), None)

    def fidelity_counts(self) -> dict[str, int]:
        """How many charted series are the same quantity in every run (``exact``), differ in meaning in some run
        (``differs``: their reductions differ, said per run with the fields), or are equal as stated but not yet
        proven by running a framework's code (``unproven``)."""
        return fidelity_counts(self.metrics)

    def fidelity_line(self) -> str:
        """One line of :meth:`fidelity_counts`, as the CLI, report.html and summary.md say it."""
        return fidelity_line(self.metrics)

    def group_fidelity_line(self) -> str:
        """:meth:`fidelity_line` of the group aggregates, each over its group's runs."""
        return fidelity_line([g.fidelity for g in self.groups if g.fidelity is not None], what="aggregates",
                             where="every run of its group")

    def warn(self, group: str, text: str, metric: str | None = None, *, first: bool = False) -> None:
        """Add a warning to :attr:`warnings` (the flat list the CLI prints) and to its group."""
        if first:
            self.warnings.insert(0, text)
        else:
            self.warnings.append(text)
        items = self.warning_groups.setdefault(group, [])
        if first:
            items.insert(0, (metric, text))
        else:
            items.append((metric, text))


def fidelity_counts(reports: "Iterable[MetricReport]") -> dict[str, int]:
    """How many of ``reports`` are the same quantity in every run, differ in some, or are equal but unproven."""
    out = {"exact": 0, "differs": 0, "unproven": 0}
    for mr in reports:
        out["differs" if mr.differs else "unproven" if mr.unproven else "exact"] += 1
    return out


def fidelity_line(reports: "list[MetricReport]", what: str = "series", where: str = "every run") -> str:
    """The one line of :func:`fidelity_counts` the CLI, report.html and summary.md say."""
    c = fidelity_counts(reports)
    return (f"{len(reports)} {what}: {c['exact']} the same quantity in {where}, {c['differs']} not the "
            f"same quantity (the reductions differ: each says how), {c['unproven']} the same as stated but not "
            "yet proven by running the framework's code")


# the report's warning groups, in the order shown (each an expandable list with its count)
WARNING_GROUPS = {
    "differs": "Not the same quantity in every run",
    "approximate": "Approximate translations (a metric of one run)",
    "unproven": "The same quantity as stated, not yet proven by running the framework",
    "look_alike": "Look alike, never overlaid",
    "axis": "The x axis",
    "reading": "Skipped while reading",
    "names": "Metric names",
}


def compare_runs(locators: "Iterable[str]", *, metrics: "None | str | list[str]" = None, x: str = "step",
                 smooth: int = 0, smooth_kind: str = "ema", out: "Path | str | None" = Path("compare-report"),
                 into: str | None = None, mappings: "list[str] | None" = None, source: str = "auto",
                 title: str | None = None, doctor: bool = True,
                 groups: "Mapping[str, Sequence[str]] | Sequence[str] | None" = None, group_by: str | None = None,
                 band: str = "ci", last: int = LAST, reps: int = REPS, seed: int = SEED,
                 selection: "Selection | None" = None) -> CompareResult:
    """Compare runs (locators, optionally ``LABEL=LOCATOR``) and write the report to ``out`` (None: no report).

    ``metrics``: None (all), a preset (``effectiveness``, ``stability``, ``efficiency``, ``data``), canonical names
    or patterns, comma-separated or as a list. ``x``: step, samples, tokens or time. ``smooth``: N > 1 draws an
    EMA of span N (``smooth_kind="mean"``: a trailing mean of N points) over the faint raw line; the tables always
    use the raw values. ``into``: a sink locator to write every run into as well. ``doctor``: run the diagnostic
    checks (:mod:`trackbridge.doctor`) over each run as it is read; the report opens with their findings.

    ``groups`` / ``group_by``: aggregate seeds (see the module docstring and :mod:`.groups`); ``band``: ``ci`` (the
    95% bootstrap interval of the mean) or ``iqr``; ``last``: the points of a run its final performance averages;
    ``reps`` and ``seed``: the bootstrap's resamples and seed. ``selection``: of the runs a locator holds, only those it
    keeps (:class:`~trackbridge.read.selection.Selection`: name pattern, tags, start date;
    ``compare --runs/--tag/--since/--until``)."""
    locators = list(locators)
    specs = _group_options(groups, group_by, band, last, reps)
    smooth = _check_options(x, smooth, smooth_kind, out, into)
    runs, members = _load_grouped(locators, specs, mappings=mappings, source=source, doctor=doctor,
                                  selection=selection)
    result = CompareResult(out=Path(out) if out is not None else None, html=None, summary_csv=None,
                           summary_md=None, runs=runs, x=x, smooth=smooth, band=band, last=int(last),
                           reps=int(reps), seed=int(seed))
    schema = _schema(mappings)
    chosen, renamed = _choose_metrics(result, metrics, schema)
    axes = _warn_inputs(result, renamed)
    _report_metrics(result, chosen, axes, schema)
    if group_by:
        members = _members_by_config(result, group_by)
    if members:
        _aggregate(result, members, axes, schema)

    if into:
        from .into import write_into
        result.into = write_into(runs, into)

    if result.out is not None:
        from .report import write_report
        write_report(result, axes, smooth_kind=smooth_kind, title=title)
    return result


def _check_options(x: str, smooth: int, smooth_kind: str, out: "Path | str | None", into: str | None) -> int:
    """The axis, the smoothing and the extras the report and the sink need, checked before any run is read."""
    if x not in X_KINDS:
        raise ValueError(f"unknown x axis {x!r}; expected one of {', '.join(X_KINDS)}")
    if smooth_kind not in SMOOTH_KINDS:
        raise ValueError(f"unknown smoothing {smooth_kind!r}; expected one of {', '.join(SMOOTH_KINDS)}")
    smooth = int(smooth or 0)
    if smooth < 0:
        raise ValueError("smooth must be >= 0")
    if out is not None:
        from ..extras import PLOT, require
        require(*PLOT, "the comparison report")        # before any run is read
    if into:                                            # likewise the tracker's package (MissingExtra)
        from ..trackers import kinds, sink_class
        from ..tracking.locators import parse
        sink_class(parse(into, kinds=kinds("sink")).kind)
    return smooth


def _choose_metrics(result: CompareResult, metrics: "None | str | list[str]",
                    schema: CanonicalSchema) -> tuple[list[str], dict[str, str]]:
    """The metrics to chart (asked for, then those the findings read) and the older names renamed to them."""
    available: dict[str, None] = {}
    for r in result.runs:
        available.update(dict.fromkeys(r.scalar_names()))

    def is_axis(name: str) -> bool:
        m = schema.find(name) if schema is not None else None
        return bool(m is not None and getattr(m, "axis", False)) or name.startswith("progress/")

    renamed: dict[str, str] = {}
    chosen, missing = select(metrics, available, is_axis=is_axis, upgrade=schema.upgrade, renamed=renamed)
    result.missing = missing
    # the findings of trackbridge doctor open the report; the metrics they read are charted, so each links to its
    # charts (added after the ones asked for when --metrics left them out)
    result.findings = [f for r in result.runs for f in r.findings]
    for f in result.findings:
        for name in f.metrics():
            if name in available and name not in chosen:
                chosen.append(name)
    return chosen, renamed


def _warn_inputs(result: CompareResult, renamed: dict[str, str]) -> dict[str, Axis]:
    """Each run's x axis, with the warnings about names, axes and reading the runs added to ``result``."""
    runs, x = result.runs, result.x
    for old, new in renamed.items():
        result.warn("names", f"{old} is an older canonical name of {new} (canonical.yaml versions:); "
                             f"compared as {new}")
    axes = {r.label: run_axis(r, x) for r in runs}
    if x != "step" and not any(a.available for a in axes.values()):
        result.warn("axis", f"no run has a {x} axis, so the charts are empty (the tables do not depend on the x "
                            f"axis); use --x step for charts", first=True)
    for r in runs:
        for p in r.problems:
            result.warn("reading", f"{r.label}: skipped while reading: {p}")
        ax = axes[r.label]
        if ax.note:
            result.warn("axis", ax.note)
    for name in result.missing:
        result.warn("names", f"asked for but found in no run: {name}")
    apart = disjoint_steps(runs)
    if x == "step" and apart:
        result.warn("axis", apart, first=True)
    return axes


def _report_metrics(result: CompareResult, chosen: list[str], axes: dict[str, Axis],
                    schema: CanonicalSchema) -> None:
    """One report per chosen metric in ``result``, the metrics of only one run, and each metric's warning."""
    runs = result.runs
    for name in chosen:
        result.metrics.append(_metric_report(name, runs, axes, schema))
    if len(runs) > 1:
        for mr in result.metrics:
            if len(mr.runs) == 1:
                result.only_one_run[mr.name] = mr.runs[0]
    for mr in result.metrics:
        if mr.warning:
            group = ("differs" if len(mr.runs) > 1 else "approximate") if mr.differs else \
                "unproven" if mr.approximate else "look_alike"
            result.warn(group, f"{mr.name}: {mr.warning}", mr.name)


def disjoint_steps(runs: "list[LoadedRun]") -> str | None:
    """A warning when the runs share no step (a log that starts where a run was resumed, runs of different lengths
    counted differently): their curves on a step axis then sit side by side, never over each other."""
    ranges = [(r.label, r.step_range()) for r in runs]
    known = [(label, rng) for label, rng in ranges if rng is not None]
    if len(known) < 2 or max(lo for _l, (lo, _h) in known) <= min(hi for _l, (_lo, hi) in known):
        return None
    spans = ", ".join(f"{label} {lo}\u2013{hi}" for label, (lo, hi) in known)
    return (f"the runs share no step ({spans}): on a step axis their curves sit side by side, not over each "
            f"other; compare their shapes, not their values at one step")


def _schema(mappings: list[str] | None) -> CanonicalSchema:
    from ..schema.loader import load_registry
    return load_registry(mappings or None).canonical


def _metric_report(name: str, runs: list[LoadedRun], axes: dict[str, Axis],
                   schema: CanonicalSchema | None) -> MetricReport:
    meta = schema.find(name) if schema is not None else None
    if meta is None and schema is not None:
        from .presets import strip_split
        meta = schema.find(strip_split(name))
    mr = MetricReport(name=name, unit=getattr(meta, "unit", "") or "",
                      description=getattr(meta, "description", "") or "", preset=preset_of(name))
    for r in runs:
        st = r.metric_stats(name)
        if st is None:
            continue
        mr.runs.append(r.label)
        mr.stats.append(st)
        orig = r.original_names(name)
        if orig:
            mr.originals[r.label] = orig
        if name in r.approximate:
            mr.approximate[r.label] = r.approximate[name]
        if name in r.derived:
            mr.derived_in.append(r.label)
        ax = axes[r.label]
        if not ax.available:
            mr.axis_notes.append(f"{r.label} is not on this chart: {(ax.note or 'no axis').split(': ', 1)[-1]}")
        else:
            xs, _ = series(r, name, ax)
            if not xs:
                mr.axis_notes.append(f"{r.label} is not on this chart: none of its points has an x value")
    # names that look alike but are other quantities, held by runs that do not have this one
    for a, b, why in LOOK_ALIKES:
        for mine, other in ((a, b), (b, a)):
            if name != mine:
                continue
            # only when some run has this one without the other, and another run the other without this one:
            # then the two would be taken for one quantity
            others = [r.label for r in runs if r.label not in mr.runs and r.has_metric(other)]
            if others and any(not r.has_metric(other) for r in runs if r.label in mr.runs):
                mr.look_alikes.append(f"not overlaid with {other} of {', '.join(others)}: {why}.")
    parts = []
    differ, unproven = mr.differs, mr.unproven
    if differ:
        several = len(mr.runs) > 1
        head = "Not the same quantity in every run" if several else "Approximate translation"
        items = []
        for label, why in differ.items():
            src = mr.originals.get(label)
            items.append(f"in {label}" + (f" ({', '.join(src)})" if src else "") + f": {_plain(why)}")
        parts.append(f"{head}: " + "; ".join(items) + ".")
    if unproven:
        # the stated reductions are the reference's; no proof has run that framework's code for the key yet
        items = [label + (f" ({', '.join(mr.originals[label])})" if mr.originals.get(label) else "")
                 for label in unproven]
        parts.append("The same quantity as stated in the mappings, not yet proven by running the framework's code, "
                     f"in {', '.join(items)} (docs/fidelity-proofs.md).")
    parts += [s[0].upper() + s[1:] for s in mr.look_alikes]
    mr.warning = " ".join(parts) or None
    for st in mr.stats:
        notes, brief = [], []
        if st.run in mr.approximate:
            why = mr.approximate[st.run]
            notes.append(f"approximate: {_plain(why)}")
            # the reason is said once, in the metric's warning; the row says only which kind and which fields
            tags = sorted(set(re.findall(r"\[([a-z_]+)\]", why)))
            brief.append("stated, not proven" if st.run in unproven else
                         "approximate" + (f" [{', '.join(tags)}]" if tags else ""))
        rest = []
        if st.run in mr.derived_in:
            rest.append("derived by trackbridge from other logged metrics (not logged by the run)")
        if st.non_finite:
            rest.append(f"{st.non_finite} NaN/inf value(s) left out of min/max/mean")
        for n in mr.axis_notes:
            if n.startswith(st.run + " "):
                rest.append(n[len(st.run) + 1:])
        st.note = "; ".join(notes + rest)
        st.brief = "; ".join(brief + rest)
    return mr


_WHO = re.compile(r"^[\w.@/-]+ '[^']*': ")


def _plain(why: str) -> str:
    """The mapping's reason without the translator's ``framework 'key': `` prefix (the key is shown already)."""
    return _WHO.sub("", why.strip()).rstrip(".")


def slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_") or "metric"
