"""The seeds of :func:`~trackbridge.compare.compare_runs` (``groups=`` / ``group_by=``): the options checked before
any run is read, the runs a group names by locator read with the others, the groups of a config key, and every
charted metric aggregated per group (:mod:`.groups` computes the aggregates)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .align import Axis, series
from .groups import BANDS
from .load import LoadedRun, load_runs

if TYPE_CHECKING:       # pragma: no cover
    from collections.abc import Mapping, Sequence

    from ..schema.model import CanonicalSchema
    from . import CompareResult


def _group_options(groups: "Mapping[str, Sequence[str]] | Sequence[str] | None", group_by: str | None,
                   band: str, last: int, reps: int) -> dict[str, list[str]]:
    """The groups as given, checked with the aggregation's settings before any run is read."""
    from .groups import group_specs
    if groups and group_by:
        raise ValueError("--group and --group-by: give one of them")
    if group_by is not None and not str(group_by).strip():
        raise ValueError("--group-by: an empty config key")
    if band not in BANDS:
        raise ValueError(f"--band {band}: expected one of {', '.join(BANDS)}")
    if int(last) < 1:
        raise ValueError(f"--last {last}: must be at least 1")
    if int(reps) < 100:
        raise ValueError(f"reps={reps}: at least 100 bootstrap resamples")
    if isinstance(groups, str):
        groups = [groups]
    if groups or group_by:
        from .groups import _np
        _np()                                           # numpy (the [plot] extra), before any run is read
    return group_specs(groups) if groups else {}


def _load_grouped(locators: list[str], specs: dict[str, list[str]], **kw: Any) -> \
        tuple[list[LoadedRun], dict[str, list[str]]]:
    """Read the runs given and those the groups name by locator; each group's members as run labels. A group's
    RUN is the label of a run given (every run of it, when its locator held several), a locator given, or a locator
    of its own (read like the others)."""
    from ..trackers import kinds, source_locator
    from ..tracking.locators import Locator, parse_many
    from .groups import members as named
    if not locators and not specs:
        raise ValueError("compare needs at least one run: RUN ... or --group LABEL=RUN,RUN,...")
    runs = load_runs(locators, **kw) if locators else []
    labels = [r.label for r in runs]
    own = {t: loc.label for t, loc in zip(locators, parse_many([source_locator(t) for t in locators],
                                                               kinds=kinds("source")))}
    extra: dict[str, str] = {}                                 # a group's own locator -> its runs' label
    for label, items in specs.items():
        for item in items:
            if item in own or item in extra or named(item, labels):
                continue
            try:
                (loc,) = parse_many([source_locator(item)], kinds=kinds("source"))
            except ValueError as exc:
                raise ValueError(f"--group {label}: {item!r} is not the label of a run given, nor a run locator: "
                                 f"{str(exc).splitlines()[0]}") from None
            base = name = loc.label or "run"
            n = 2
            while named(name, labels) or name in extra.values():
                name, n = f"{base}-{n}", n + 1
            try:
                found = load_runs([f"{name}={Locator(loc.kind, loc.location, dict(loc.options))}"], **kw)
            except (ValueError, OSError) as exc:
                raise ValueError(f"--group {label}: {item}: {str(exc).splitlines()[0]}") from None
            runs += found
            labels += [r.label for r in found]
            extra[item] = name
    out: dict[str, list[str]] = {}
    for label, items in specs.items():
        got: dict[str, None] = {}
        for item in items:
            got.update(dict.fromkeys(named(own.get(item) or extra.get(item) or item, labels)))
        out[label] = list(got)
    return runs, out


def _members_by_config(result: CompareResult, group_by: str) -> dict[str, list[str]]:
    """The groups of the runs' values of the config key ``group_by``; the runs without it are said in a warning."""
    from .groups import group_by as by_config
    members, without = by_config(result.runs, group_by)
    if not members:
        raise ValueError(f"--group-by {group_by}: no run's config has this key")
    if without:
        result.warn("reading", f"--group-by {group_by}: not in any group (no such config key): "
                               + ", ".join(without))
    return members


def _aggregate(result: CompareResult, members: dict[str, list[str]], axes: dict[str, Axis],
               schema: CanonicalSchema | None) -> None:
    """Every charted metric aggregated over every group that has it; the caveats of the group's runs with it."""
    from . import _metric_report
    from .groups import aggregate
    by_label = {r.label: r for r in result.runs}
    result.group_members = members
    grouped = [by_label[lab] for lab in dict.fromkeys(lab for ms in members.values() for lab in ms)]
    for mr in result.metrics:
        for group, labels in members.items():
            mine = [by_label[lab] for lab in labels if by_label[lab].has_metric(mr.name)]
            if not mine:
                continue
            gm = aggregate(group, mr.name, {r.label: series(r, mr.name, axes[r.label]) for r in mine},
                           band=result.band, last=result.last, reps=result.reps, seed=result.seed)
            gm.fidelity = _metric_report(mr.name, mine, axes, schema)
            bucketed = [r.label for r in mine if (r.metric_stats(mr.name) or _NO_STATS).points > _series_cap()]
            if bucketed:
                gm.notes.append("aggregated over the points the chart keeps (each bucket's lowest and highest) of "
                                + ", ".join(bucketed))
            result.groups.append(gm)
        if any(g.metric == mr.name for g in result.groups):
            result.group_chart_reports[mr.name] = _metric_report(mr.name, grouped, axes, schema)


class _NoStats:
    points = 0


_NO_STATS = _NoStats()


def _series_cap() -> int:
    from .load import SERIES_POINTS
    return SERIES_POINTS
