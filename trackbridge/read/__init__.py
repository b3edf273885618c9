"""Reading runs: :mod:`.inputs` opens what a user names (one run as every command reads it), :mod:`.selection` says
which runs and metrics, and this module reads them into Python (``trackbridge.read``): every point of one or more
runs, in long format, as records, a pandas DataFrame or an Arrow table.

A run is opened as every command opens it (:func:`trackbridge.read.inputs.open_runs`: a file, a tracker's folder or
store, a locator such as ``mlflow:sqlite:///mlflow.db?experiment=grpo``) and translated by its one
:class:`~trackbridge.pipeline.Pipeline` into the names asked for (``names``: canonical by default, a framework spec,
or ``keep`` for the names as stored), so the values and their fidelity are those ``translate``, ``migrate`` and
``compare`` give. Each point is one row::

    run, step, wall_time, key, value, fidelity

``fidelity`` is ``exact``, ``approximate`` (the reductions differ; the reason per run and key:
:attr:`RunData.reasons`), ``unproven`` (equal as stated, not yet proven by running the framework's code), ``derived``
(computed by trackbridge's derived rules, not logged), ``unmapped`` (a key the mappings do not know, kept as stored)
or ``as stored`` (``names="keep"``). Only numbers are rows (``value`` is a float, NaN and infinities kept); text and
histograms are counted per run (:attr:`RunData.non_numeric`), never dropped without a word.

The rows stream: iterating a :class:`Reading` reads one record at a time, :meth:`Reading.batches` yields Arrow
record batches of bounded size, and only :meth:`Reading.to_pandas` / :meth:`Reading.to_arrow` hold the whole
table. Selection: ``runs`` (a regular expression searched in the run's label, name and id), ``metrics`` (glob
patterns of the output names, ``fnmatch`` rules: ``policy/*``), ``steps`` (an inclusive ``(first, last)`` range).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Sequence

from ..errors import UsageError
from ..extras import require
from ..schema.proofs import only_unproven
from .selection import Selection

if TYPE_CHECKING:       # pragma: no cover
    import pandas
    import pyarrow

    from ..pipeline import Pipeline
    from .inputs import InputRun

__all__ = ["COLUMNS", "FIDELITY", "Point", "Reading", "RunData", "read"]

COLUMNS = ("run", "step", "wall_time", "key", "value", "fidelity")
FIDELITY = ("exact", "approximate", "unproven", "derived", "unmapped", "as stored")
BATCH_ROWS = 65_536             # rows per Arrow record batch


@dataclass(frozen=True)
class Point:
    """One logged value: a row of the long format."""

    run: str
    step: int | None
    wall_time: float | None
    key: str
    value: float
    fidelity: str


@dataclass
class RunData:
    """What is known of one run read: where it came from, what its names were translated from, and (once its rows
    were read) why each approximate key is approximate, which keys were kept unmapped, and how many values were not
    numbers."""

    label: str
    locator: str
    source: str = ""
    config: dict[str, Any] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)      # output key -> why it is approximate
    unmapped: list[str] = field(default_factory=list)
    non_numeric: int = 0
    points: int = 0


class Reading:
    """The points of the runs ``locators`` name (see the module docstring); build it with :func:`read`."""

    def __init__(self, locators: Sequence[str], *, metrics: Sequence[str] | None, names: str, source: str | None,
                 mappings: Sequence[str] | None, runs: str | None, steps: tuple[int | None, int | None] | None,
                 config: dict[str, Any] | None, tags: dict[str, str] | None = None, since: object = None,
                 until: object = None) -> None:
        self.locators = list(locators)
        self.metrics = list(metrics or [])
        self.names = names
        self.source = source
        self.mappings = list(mappings or [])
        self.steps = steps
        self.config = dict(config or {})
        # every part checked now (a bad expression or date is said here, not when the rows are read)
        self.selection = Selection.build(runs=runs, tags=tags, metrics=self.metrics, since=since, until=until,
                                         prefix="read: ")
        self._opened: list[tuple[InputRun, str]] | None = None
        self.runs: list[RunData] = []          # filled as the rows are read

    # ------------------------------------------------------------------------------------------------ runs
    def _open(self) -> list[tuple[InputRun, str]]:
        """The selected runs with their labels (opened once; reading their rows reads them again)."""
        if self._opened is None:
            from .inputs import open_runs
            opened: list[tuple[InputRun, str]] = []
            for loc in self.locators:
                for run in open_runs(loc, rows=True, config=self.config or None, allow_label=True,
                                     select=self.selection):
                    label = run.label or run.info.name or run.info.run_id or run.locator
                    opened.append((run, _unique(label, [lbl for _, lbl in opened])))
            if not opened:
                why = "".join(f"; left out {line}" for line in self.selection.left_out)
                raise UsageError(f"read: no run{self.selection.describe()} in {', '.join(self.locators)}{why}")
            self._opened = opened
        return self._opened

    def labels(self) -> list[str]:
        """The labels of the selected runs, in reading order (opens them, reads no rows)."""
        return [label for _, label in self._open()]

    # ------------------------------------------------------------------------------------------------ rows
    def __iter__(self) -> Iterator[Point]:
        self.runs = []
        for run, label in self._open():
            yield from self._points(run, label)

    def _points(self, run: InputRun, label: str) -> Iterator[Point]:
        data = RunData(label=label, locator=run.locator)
        self.runs.append(data)
        keep = self.names == "keep"
        pipe: Pipeline = run.pipeline("canonical" if keep else self.names, source="keep" if keep else self.source,
                                      mappings=self.mappings or None)
        carried = dict(run.info.approximate or {}) if run.info.names == self.names else {}
        lo, hi = self.steps or (None, None)
        names: set[str] = set()             # every name the pipeline wrote (it kept only those asked for)
        marks: dict[str, str] = {}          # name -> its fidelity, judged once: the mark is set when it first comes
        for rec in pipe.process(run.records()):
            names.update(rec.metrics)
            if (lo is not None and (rec.step is None or rec.step < lo)) or \
                    (hi is not None and (rec.step is None or rec.step > hi)):
                continue
            derived = rec.derived
            for key, value in rec.metrics.items():
                number = _number(value)
                if number is None:
                    data.non_numeric += 1
                    continue
                data.points += 1
                mark = marks.get(key)
                if mark is None:
                    mark = marks[key] = self._fidelity(key, pipe, carried, keep)
                yield Point(label, rec.step, rec.wall_time, key, number,
                            "derived" if not keep and key in derived else mark)
        data.source = pipe.stats.source
        data.config = dict(run.info.config or {})
        data.reasons = {k: v for k, v in {**carried, **pipe.stats.approximate}.items() if k in names}
        data.unmapped = [k for k in pipe.stats.unmapped if k in names]

    @staticmethod
    def _fidelity(key: str, pipe: Pipeline, carried: dict[str, str], keep: bool) -> str:
        """A logged (not derived) name's mark."""
        if keep:
            return "as stored"
        why = pipe.stats.approximate.get(key) or carried.get(key)
        if why is not None:
            return "unproven" if only_unproven(why) else "approximate"
        return "unmapped" if key in pipe.stats.unmapped else "exact"

    # ------------------------------------------------------------------------------------------------ tables
    def batches(self, rows: int = BATCH_ROWS) -> Iterator[pyarrow.RecordBatch]:
        """The rows as Arrow record batches of at most ``rows`` rows, streamed (needs the [arrow] extra)."""
        require(("pyarrow",), "arrow", "trackbridge.read(...).batches()")
        import pyarrow as pa
        schema = arrow_schema()
        cols: dict[str, list[Any]] = {c: [] for c in COLUMNS}
        for p in self:
            for c in COLUMNS:
                cols[c].append(getattr(p, c))
            if len(cols["key"]) >= rows:
                yield pa.RecordBatch.from_pydict(cols, schema=schema)
                cols = {c: [] for c in COLUMNS}
        if cols["key"]:
            yield pa.RecordBatch.from_pydict(cols, schema=schema)

    def to_arrow(self) -> pyarrow.Table:
        """Every row as one Arrow table (columns :data:`COLUMNS`; needs the [arrow] extra)."""
        require(("pyarrow",), "arrow", "trackbridge.read(...).to_arrow()")
        import pyarrow as pa
        return pa.Table.from_batches(list(self.batches()), schema=arrow_schema())

    def to_pandas(self) -> pandas.DataFrame:
        """Every row as a pandas DataFrame (columns :data:`COLUMNS`; ``step`` a nullable integer; needs the [pandas]
        extra). Pivot it for one column per key: ``df.pivot_table(index=["run", "step"], columns="key",
        values="value")``."""
        require(("pandas",), "pandas", "trackbridge.read(...).to_pandas()")
        import pandas as pd
        cols: dict[str, list[Any]] = {c: [] for c in COLUMNS}
        for p in self:
            for c in COLUMNS:
                cols[c].append(getattr(p, c))
        df = pd.DataFrame(cols, columns=list(COLUMNS))
        df["step"] = df["step"].astype("Int64")
        df["wall_time"] = df["wall_time"].astype("float64")
        df["value"] = df["value"].astype("float64")
        for c in ("run", "key", "fidelity"):
            df[c] = df[c].astype("string")
        return df


def arrow_schema() -> pyarrow.Schema:
    import pyarrow as pa
    return pa.schema([("run", pa.string()), ("step", pa.int64()), ("wall_time", pa.float64()), ("key", pa.string()),
                      ("value", pa.float64()), ("fidelity", pa.string())])


def read(locators: str | Iterable[str], *, metrics: str | Iterable[str] | None = None, names: str = "canonical",
         source: str | None = None, mappings: Iterable[str] | None = None, runs: str | None = None,
         steps: tuple[int | None, int | None] | None = None, config: dict[str, Any] | None = None,
         tags: dict[str, str] | None = None, since: object = None, until: object = None) -> Reading:
    """The points of the runs ``locators`` name (a locator or a list: a file, a tracker folder or store, ``LABEL=``
    in front to name a run), translated into ``names`` (``canonical``, ``FRAMEWORK[/TRAINER][@VERSION]`` or
    ``keep``) from ``source`` (detected by default, or the locator's ``?from=``). ``metrics``: glob patterns of the
    output names to keep; ``runs``: a regular expression a run's label, name or id must contain; ``steps``: an
    inclusive (first, last) range, ``None`` for an open end; ``config``: added over each run's config; ``tags``: tags
    a run must hold (an empty value: the tag exists); ``since`` / ``until``: the run started (its first wall time)
    at or after / at or before this (a date, an ISO date-time, UTC unless it has an offset, a ``datetime``, epoch
    seconds, or a duration before now such as ``"7d"``; a run without wall times is left out and named in
    ``.selection.left_out``). Nothing is read
    until the result is iterated or turned into a table (``.to_pandas()``, ``.to_arrow()``, ``.batches()``)."""
    locs = [locators] if isinstance(locators, str) else list(locators)
    if not locs:
        raise UsageError("read: no run given")
    pats = [metrics] if isinstance(metrics, str) else list(metrics or [])
    if steps is not None and (len(steps) != 2 or not all(s is None or isinstance(s, int) for s in steps)):
        raise UsageError(f"read: steps={steps!r} must be (first, last), each an int or None")
    return Reading(locs, metrics=pats, names=names, source=source, mappings=list(mappings or []), runs=runs,
                   steps=steps, config=config, tags=tags, since=since, until=until)


def _number(v: Any) -> float | None:
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, (int, float)):
        return float(v)
    try:                                    # numpy and torch scalars (a tracker reader may yield them)
        if hasattr(v, "item") and getattr(v, "ndim", 1) == 0:
            x = v.item()
            return float(x) if isinstance(x, (int, float)) else None
    except (TypeError, ValueError):
        return None
    return None


def _unique(label: str, taken: list[str]) -> str:
    if label not in taken:
        return label
    n = 2
    while f"{label}#{n}" in taken:
        n += 1
    return f"{label}#{n}"
