"""Read the runs to compare: readers -> :class:`~trackbridge.pipeline.Pipeline` (translate + derive) -> canonical.

Every locator may hold several runs (a TensorBoard root, an MLflow experiment); each becomes its own
:class:`LoadedRun`, labelled ``LABEL`` when the locator holds one run and ``LABEL/RUN`` otherwise.

Runs are streamed: each record is read, translated and folded into what the report needs, then dropped. A
:class:`LoadedRun` keeps, per record, only its step, wall time and the x-axis counters (``progress/samples``,
``progress/tokens``, ``perf/tokens_per_step``) as packed arrays, and per metric its statistics (first, last, min,
max, exact mean, points) and the points it charts: every point up to :data:`SERIES_POINTS`, beyond that each bucket
of consecutive points keeps its lowest and highest value (the chart's shape, spikes included), so memory does not
grow with the input. ``run.records`` reads the run again through a fresh pipeline when iterated (``--into``, tests).
"""
from __future__ import annotations

import math
from array import array
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, TypeGuard

from ..record import Histogram, Record, RunInfo
from ..tracking.locators import Locator, parse_many

if TYPE_CHECKING:       # pragma: no cover
    from ..doctor import Finding
    from ..read.inputs import InputRun
    from ..read.selection import Selection
    from .stats import MetricStats

SERIES_POINTS = 10_000          # points kept per run and metric for the chart before buckets take over
AXIS_METRICS = ("progress/samples", "progress/tokens", "perf/tokens_per_step")
_NAN = math.nan


def is_number(v: Any) -> TypeGuard[float]:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def is_finite_number(v: Any) -> TypeGuard[float]:
    return is_number(v) and math.isfinite(v)


class RecordsView:
    """The run's canonical records, read again (streamed) on every iteration; ``len()`` is the record count."""

    def __init__(self, count: int, reread: Callable[[], Iterator[Record]]) -> None:
        self._count = count
        self._reread = reread

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[Record]:
        return iter(self._reread())

    def __bool__(self) -> bool:
        return self._count > 0


class _Stats:
    """Streaming statistics of one metric in one run: exact (the mean is math.fsum's, from Shewchuk partials)."""

    __slots__ = ("first", "last", "min", "max", "points", "non_finite", "partials", "finite")

    def __init__(self) -> None:
        self.first: float | None = None
        self.last: float | None = None
        self.min: float | None = None
        self.max: float | None = None
        self.points = self.non_finite = self.finite = 0
        self.partials: list[float] = []

    def add(self, v: float) -> None:
        if self.points == 0:
            self.first = v
        self.last = v
        self.points += 1
        if not math.isfinite(v):
            self.non_finite += 1
            return
        self.finite += 1
        if self.min is None or v < self.min:
            self.min = v
        if self.max is None or v > self.max:
            self.max = v
        partials = self.partials            # exact running sum (the algorithm behind math.fsum)
        i = 0
        x = v
        for y in partials:
            if abs(x) < abs(y):
                x, y = y, x
            hi = x + y
            lo = y - (hi - x)
            if lo:
                partials[i] = lo
                i += 1
            x = hi
        partials[i:] = [x]

    def mean(self) -> float | None:
        return math.fsum(self.partials) / self.finite if self.finite else None


class _Series:
    """The points (record index, value) of one metric in one run that its chart draws: all of them up to ``cap``;
    beyond, consecutive points are bucketed and each bucket keeps its lowest and its highest point (NaN only when a
    bucket holds nothing else), so at most ``cap`` points are held."""

    __slots__ = ("idx", "ys", "stride", "cap", "open")

    def __init__(self, cap: int = SERIES_POINTS) -> None:
        self.idx = array("q")
        self.ys = array("d")
        self.stride = 1
        self.cap = max(8, cap)
        self.open: list[Any] | None = None        # the bucket being filled: [count, lo_i, lo_y, hi_i, hi_y]

    def add(self, i: int, y: float) -> None:
        if self.stride == 1:
            self.idx.append(i)
            self.ys.append(y)
            if len(self.idx) > self.cap:
                self._rebucket(4)
            return
        self._fold(i, y)
        assert self.open is not None
        if self.open[0] >= self.stride:
            self._close()
            if len(self.idx) > self.cap:
                self._rebucket(self.stride * 2)

    def _close(self) -> None:
        assert self.open is not None
        _, lo_i, lo_y, hi_i, hi_y = self.open
        self.open = None
        if lo_i == hi_i:
            self.idx.append(lo_i)
            self.ys.append(lo_y)
            return
        for i, y in sorted(((lo_i, lo_y), (hi_i, hi_y)), key=lambda p: p[0]):
            self.idx.append(i)
            self.ys.append(y)

    def _rebucket(self, stride: int) -> None:
        """Halve the points held: every four held points (in order) become their lowest and highest; new points
        go into buckets of ``stride``."""
        if self.open is not None:
            self._close()
        old_idx, old_ys = self.idx, self.ys
        self.idx, self.ys = array("q"), array("d")
        for j in range(0, len(old_idx), 4):
            for i, y in zip(old_idx[j:j + 4], old_ys[j:j + 4]):
                self._fold(i, y)
            self._close()
        self.stride = stride

    def _fold(self, i: int, y: float) -> None:
        b = self.open
        if b is None:
            self.open = [1, i, y, i, y]
            return
        b[0] += 1
        if b[2] != b[2] or y < b[2]:              # a number replaces a NaN
            b[1], b[2] = i, y
        if b[4] != b[4] or y > b[4]:
            b[3], b[4] = i, y

    def points(self) -> Iterator[tuple[int, float]]:
        yield from zip(self.idx, self.ys)
        if self.open is not None:
            _, lo_i, lo_y, hi_i, hi_y = self.open
            yield from ([(lo_i, lo_y)] if lo_i == hi_i else sorted([(lo_i, lo_y), (hi_i, hi_y)],
                                                                   key=lambda p: p[0]))


class RunData:
    """What compare keeps of one run, folded in record by record (see the module docstring)."""

    def __init__(self, cap: int = SERIES_POINTS) -> None:
        self.count = 0
        self.steps = array("d")              # per record: the step (NaN: none)
        self.walls = array("d")              # per record: the wall time when a finite number (NaN: none)
        self.any_wall = False                # some record has a wall time (finite or not)
        self.axis: dict[str, array] = {}     # per record, the x-axis counters (NaN: not logged as a finite number)
        self.names: dict[str, None] = {}     # every metric name, first seen first
        self.scalars: dict[str, None] = {}   # names with a number somewhere
        self.non_scalar: set[str] = set()    # names with a distribution or a text
        self.stats: dict[str, _Stats] = {}
        self.series: dict[str, _Series] = {}
        self.axes: dict[str, dict[str, None]] = {}   # a run with several x axes: axis -> the metrics on it
        self.cap = cap

    def add(self, rec: Record) -> None:
        i = self.count
        self.count += 1
        self.steps.append(float(rec.step) if rec.step is not None else _NAN)
        w = rec.wall_time
        if w is not None:
            self.any_wall = True
        self.walls.append(float(w) if is_finite_number(w) else _NAN)
        m = rec.metrics
        if rec.axis is not None:
            on = self.axes.setdefault(rec.axis, {})
            for k in m:
                on[k] = None
        for name in AXIS_METRICS:
            v = m.get(name)
            col = self.axis.get(name)
            if is_finite_number(v):
                if col is None:
                    col = self.axis[name] = array("d", [_NAN]) * i
                col.append(float(v))
            elif col is not None:
                col.append(_NAN)
        names = self.names
        for k, v in m.items():
            if k not in names:
                names[k] = None
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                st = self.stats.get(k)
                if st is None:
                    st = self.stats[k] = _Stats()
                    self.series[k] = _Series(self.cap)
                    self.scalars[k] = None
                fv = float(v)
                st.add(fv)
                self.series[k].add(i, fv)
            elif isinstance(v, (Histogram, str)):
                self.non_scalar.add(k)

    def column(self, name: str) -> array:
        col = self.axis.get(name)
        return col if col is not None else array("d", [_NAN]) * self.count


@dataclass
class LoadedRun:
    label: str
    locator: str                         # the locator as given (without the label)
    info: RunInfo
    records: "RecordsView | list[Record]"   # iterating reads the run again (streamed); len() is the count
    source: str = ""                     # what the names were translated from (detected or given)
    approximate: dict[str, str] = field(default_factory=dict)   # canonical name -> why approximate in this run
    derived: list[str] = field(default_factory=list)
    unmapped: list[str] = field(default_factory=list)
    renamed: dict[str, str] = field(default_factory=dict)       # stored name -> canonical name
    notes: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    has_wall_time: bool = True
    data: "RunData | None" = None        # folded from the records (computed from ``records`` when not given)
    findings: list[Finding] = field(default_factory=list)     # trackbridge doctor's, ordered by what to see first

    def __post_init__(self) -> None:
        if self.data is None:
            self.data = RunData()
            for rec in self.records:
                self.data.add(rec)

    def _folded(self) -> RunData:
        assert self.data is not None            # set by __post_init__
        return self.data

    def metric_names(self) -> list[str]:
        return list(self._folded().names)

    def scalar_names(self) -> list[str]:
        return list(self._folded().scalars)

    def original_names(self, canonical: str) -> list[str]:
        """The stored names this run translated to ``canonical`` (empty when derived or already canonical)."""
        return [k for k, v in self.renamed.items() if v == canonical]

    def has_metric(self, name: str) -> bool:
        return name in self._folded().scalars

    def step_range(self) -> tuple[int, int] | None:
        """The lowest and highest step of the run (None: no record has a step)."""
        steps = [s for s in self._folded().steps if s == s]
        return (int(min(steps)), int(max(steps))) if steps else None

    def metric_stats(self, metric: str) -> MetricStats | None:
        """First, last, min, max, mean and points of ``metric`` (a :class:`~.stats.MetricStats`; None: no numbers)."""
        from .stats import MetricStats
        st = self._folded().stats.get(metric)
        if st is None:
            return None
        return MetricStats(metric, self.label, first=st.first, last=st.last, min=st.min, max=st.max,
                           mean=st.mean(), points=st.points, non_finite=st.non_finite)

    def points(self, metric: str) -> Iterator[tuple[int, float]]:
        """(record index, value) of the numbers of ``metric`` the chart draws, in log order."""
        ser = self._folded().series.get(metric)
        return ser.points() if ser is not None else iter(())


def load_runs(locators: Iterable[str | Locator], *, mappings: list[str] | None = None,
              source: str = "auto", derive: bool = True, doctor: bool = True,
              selection: "Selection | None" = None) -> list[LoadedRun]:
    """Open every locator (``LOCATOR`` or ``LABEL=LOCATOR``) and read all its runs as canonical records.

    Runs are opened as every command opens them (:func:`trackbridge.read.inputs.open_runs`: the same config, the same
    source resolution, the same time axis). A locator option ``from=FRAMEWORK[/TRAINER][@VERSION]``
    (``console:verl.log?from=verl@v0.3.0.post1``) names the framework the run's names come from instead of
    detecting it; ``source`` does so for every run without one. ``selection``: only the runs it keeps."""
    from ..read.inputs import open_runs
    from ..trackers import kinds, source_locator

    texts = [source_locator(str(x)) for x in locators]
    if not texts:
        raise ValueError("compare needs at least one run locator")
    locs = parse_many(texts, kinds=kinds("source"))
    runs: list[LoadedRun] = []
    for loc in locs:
        plain = str(Locator(loc.kind, loc.location, dict(loc.options)))
        found = open_runs(plain, select=selection)
        if not found:
            raise ValueError(f"{plain}: no runs found" + (selection.describe() if selection else ""))
        for i, run in enumerate(found):
            info = run.info
            label = loc.label or "run"
            if len(found) > 1:
                label = f"{label}/{info.name or info.run_id or i}"
            runs.append(load_one(label, plain, run, mappings=mappings, source=run.source or source, derive=derive,
                                 doctor=doctor))
    return runs


def load_one(label: str, locator: str, run: InputRun, *, mappings: list[str] | None = None, source: str = "auto",
             derive: bool = True, doctor: bool = True) -> LoadedRun:
    """Read one run through a pipeline, record by record, keeping only :class:`RunData` (see the module
    docstring) and, with ``doctor``, the diagnostic checks' state (:mod:`trackbridge.doctor`: bounded too);
    ``records`` of the result reads the run again when iterated."""
    info = run.info
    pipe = run.pipeline("canonical", source=source, mappings=mappings, derive=derive)
    data = RunData()
    doc = None
    for rec in pipe.process(run.records()):
        if doctor and doc is None:          # the source is resolved by now: the config's canonical names are known
            doc = _doctor(pipe, info, label, mappings)
        data.add(rec)
        if doc is not None:
            doc.feed(rec)
    pipe.finish_notes()
    st = pipe.stats
    approx = dict(st.approximate)
    approx.update({k: v for k, v in (info.approximate or {}).items() if k not in approx})
    findings = doc.finish(approx) if doc is not None else []
    notes = list(st.notes)
    if data.non_scalar:
        notes.append("not charted (distributions or text, not numbers): " + ", ".join(sorted(data.non_scalar)))
    for axis, names in data.axes.items():
        shown = list(names)
        notes.append(f"on x axis {axis} (step = its value): {', '.join(shown[:8])}{' ...' if len(shown) > 8 else ''}")

    def reread() -> Iterator[Record]:
        again = run.pipeline("canonical", source=source, mappings=mappings, derive=derive)
        return again.process(run.records())

    return LoadedRun(label=label, locator=locator, info=info, records=RecordsView(data.count, reread),
                     source=st.source or str(info.source), approximate=approx, derived=list(st.derived),
                     unmapped=list(st.unmapped), renamed=dict(st.renamed), notes=notes,
                     problems=[str(p) for p in run.problems],
                     has_wall_time=run.has_wall_time and data.any_wall, data=data, findings=findings)


def _doctor(pipe: Any, info: RunInfo, label: str, mappings: list[str] | None) -> Any:
    """The diagnostic checks for one run (the shipped ones plus the check files among ``mappings``), with the
    run config's canonical names."""
    from ..doctor import Doctor, checks_for
    from ..schema.loader import load_registry
    reg = pipe.registry or load_registry(mappings or None)
    config = {**dict((info.extra or {}).get("canonical_config") or {}), **pipe.canonical_config()}
    return Doctor(checks_for(reg, mappings), config=config, label=label)
