"""Read the runs to compare: readers -> :class:`~trackbridge.pipeline.Pipeline` (translate + derive) -> canonical.

Every locator may hold several runs (a TensorBoard root, an MLflow experiment); each becomes its own
:class:`LoadedRun`, labelled ``LABEL`` when the locator holds one run and ``LABEL/RUN`` otherwise.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable

from ..locators import Locator, parse_many
from ..pipeline import Pipeline
from ..record import Histogram, Record, RunInfo


@dataclass
class LoadedRun:
    label: str
    locator: str                         # the locator as given (without the label)
    info: RunInfo
    records: list[Record]
    source: str = ""                     # what the names were translated from (detected or given)
    approximate: dict[str, str] = field(default_factory=dict)   # canonical name -> why approximate in this run
    derived: list[str] = field(default_factory=list)
    unmapped: list[str] = field(default_factory=list)
    renamed: dict[str, str] = field(default_factory=dict)       # stored name -> canonical name
    notes: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    has_wall_time: bool = True

    def metric_names(self) -> list[str]:
        seen: dict[str, None] = {}
        for r in self.records:
            seen.update(dict.fromkeys(r.metrics))
        return list(seen)

    def scalar_names(self) -> list[str]:
        seen: dict[str, None] = {}
        for r in self.records:
            for k, v in r.metrics.items():
                if is_number(v):
                    seen.setdefault(k)
        return list(seen)

    def original_names(self, canonical: str) -> list[str]:
        """The stored names this run translated to ``canonical`` (empty when derived or already canonical)."""
        return [k for k, v in self.renamed.items() if v == canonical]

    def has_metric(self, name: str) -> bool:
        return any(name in r.metrics and is_number(r.metrics[name]) for r in self.records)


def is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def is_finite_number(v: Any) -> bool:
    return is_number(v) and math.isfinite(v)


def load_runs(locators: Iterable[str | Locator], *, mappings: list[str] | None = None,
              source: str = "auto", derive: bool = True) -> list[LoadedRun]:
    """Open every locator (``LOCATOR`` or ``LABEL=LOCATOR``) and read all its runs as canonical records.

    A locator option ``from=FRAMEWORK[/TRAINER][@VERSION]`` (``console:verl.log?from=verl@v0.3.0.post1``) names
    the framework the run's names come from instead of detecting it; ``source`` does so for every run."""
    from ..sources import REGISTRY, source_class

    texts = [str(x) for x in locators]
    if not texts:
        raise ValueError("compare needs at least one run locator")
    locs = parse_many(texts, kinds=tuple(REGISTRY))
    runs: list[LoadedRun] = []
    for loc in locs:
        opts = dict(loc.options)
        run_source = opts.pop("from", None) or source     # ?from=FRAMEWORK[/TRAINER][@VERSION]: no detection
        plain = str(Locator(loc.kind, loc.location, dict(loc.options)))
        src = source_class(loc.kind)(loc.location, **opts)
        readers = list(src.runs())
        if not readers:
            raise ValueError(f"{plain}: no runs found")
        for i, reader in enumerate(readers):
            info = reader.info
            label = loc.label or "run"
            if len(readers) > 1:
                label = f"{label}/{info.name or info.run_id or i}"
            runs.append(load_one(label, plain, reader, mappings=mappings, source=run_source, derive=derive))
    return runs


def load_one(label: str, locator: str, reader, *, mappings=None, source: str = "auto",
             derive: bool = True) -> LoadedRun:
    info = reader.info
    pipe = Pipeline.for_run(info, "canonical", source=source, mappings=mappings, derive=derive)
    records = list(pipe.process(reader.records()))
    pipe.finish_notes()
    st = pipe.stats
    approx = dict(st.approximate)
    approx.update({k: v for k, v in (info.approximate or {}).items() if k not in approx})
    notes = list(st.notes)
    non_scalar = sorted({k for r in records for k, v in r.metrics.items()
                         if isinstance(v, (Histogram, str))})
    if non_scalar:
        notes.append("not charted (distributions or text, not numbers): " + ", ".join(non_scalar))
    return LoadedRun(label=label, locator=locator, info=info, records=records, source=st.source or str(info.source),
                     approximate=approx, derived=list(st.derived), unmapped=list(st.unmapped),
                     renamed=dict(st.renamed), notes=notes, problems=[str(p) for p in reader.problems],
                     has_wall_time=bool(reader.has_wall_time) and any(r.wall_time is not None for r in records))
