"""neptune-exporter Parquet sink: ``neptune:DIR[?project=WORKSPACE/PROJECT&run=RUN_ID]``.

Writes a run the way neptune-exporter lays out an exported one (:mod:`.format`), so the exporter's eight loaders,
pandas and pyarrow read it as one: ``DIR/<project>/<run>_part_<n>.parquet``, one row per point. ``project`` defaults
to ``trackbridge/<the run's project>`` (Neptune project ids are ``workspace/project``); the run id is trackbridge's.

* numbers (and bools, as 0/1) become ``float_series`` points (float64: NaN and infinities kept), strings
  ``string_series`` points, histograms ``histogram_series`` points (``{type: "COUNTING", edges, values}``; raw samples
  are first put into 64 equal buckets over their range); each point has the record's step and its wall time in
  milliseconds; ``None`` is no point (the layout has no "missing" value);
* steps are ``decimal(18, 6)``: a record whose step has more than 12 digits is left out (said per record);
* the run: ``sys/custom_run_id``, ``sys/name``, ``sys/creation_time``, ``sys/tags`` (``key=value``), the config
  flattened with ``/`` under ``config/`` (one typed attribute each; lists as JSON text), and the RunInfo as JSON in
  the string attribute ``trackbridge/run`` (so a reader restores name, config, tags and marks exactly). Written when
  the run opens and again when it changes or closes; readers take the last.

Durability: part 0 exists from ``open`` on (the exporter's mark of a complete run). Every ``write`` rewrites the
current part whole into a temporary file and moves it into place, so a part on disk is always a complete Parquet file
and a killed process loses at most the batch being written; a part that reaches :data:`PART_ROWS` rows is left as
it is and the next part begins (the exporter's parts are bigger, about 50 MB; its loaders read any number of
parts). A resumed run (the same run id, ``resume=True``) continues in a new part.
"""
from __future__ import annotations

import json
import math
import os
import time
import uuid
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...record import Histogram, Record, RunInfo
from ...record.values import flat_config
from ...tracking.sink import (
    HISTOGRAM,
    NONE,
    NUMBER,
    TEXT,
    Capabilities,
    PointStoreSink,
    SinkError,
    not_kept,
    value_kind,
)
from .format import CONFIG_PREFIX, PART, RUN_ATTRIBUTE, STEP_MAX, part_files, sanitize_path_part, schema, step_of

if TYPE_CHECKING:       # pragma: no cover
    pass

PART_ROWS = 100_000          # rows per part before the next part begins (a part is rewritten whole on each write)
HIST_BINS = 64
_COLUMNS = ("project_id", "run_id", "attribute_path", "attribute_type", "step", "timestamp", "int_value",
            "float_value", "string_value", "bool_value", "datetime_value", "string_set_value", "file_value",
            "histogram_value")




def histogram_value(h: Histogram) -> dict[str, Any] | None:
    """A histogram as the layout's ``{type, edges, values}`` (``len(edges) == len(values) + 1``), or None when it
    holds nothing to draw."""
    if h.limits is not None and h.counts is not None and len(h.limits) == len(h.counts) and h.limits:
        limits = [float(x) for x in h.limits]
        if h.min is not None and h.min <= limits[0]:
            left = float(h.min)
        elif len(limits) > 1:
            left = limits[0] - (limits[1] - limits[0])
        else:
            left = limits[0] - 1.0
        return {"type": "COUNTING", "edges": [left, *limits], "values": [float(c) for c in h.counts]}
    values = [float(v) for v in (h.values or []) if math.isfinite(v)]
    if not values:
        return None
    lo, hi = min(values), max(values)
    if lo == hi:
        return {"type": "COUNTING", "edges": [lo - 0.5, hi + 0.5], "values": [float(len(values))]}
    width = (hi - lo) / HIST_BINS
    counts = [0.0] * HIST_BINS
    for v in values:
        counts[min(HIST_BINS - 1, int((v - lo) / width))] += 1.0
    return {"type": "COUNTING", "edges": [lo + i * width for i in range(HIST_BINS)] + [hi], "values": counts}


class NeptuneSink(PointStoreSink):
    """Writes one run in neptune-exporter's Parquet layout (see the module docstring)."""

    kind = "neptune"
    option_names = ("project", "run")
    capabilities = Capabilities(histograms=True, text=True, nan=True, wall_time=True, resolution=(
        "wall times to the millisecond", "histograms as edges and counts (no sum, so no mean or std)",
        "raw histogram samples as 64 buckets"))

    def __init__(self, location: str = "", **options: str) -> None:
        super().__init__(location, **options)
        if not location:
            raise SinkError("neptune sink: no folder given (expected neptune:DIR)")
        self.root = Path(location).expanduser()
        self.project_id = ""
        self.run_id = ""
        self.folder: Path | None = None
        self._prefix = ""
        self._part = 0
        self._rows: list[tuple[Any, ...]] = []
        self._table: Any = None          # the current part's rows already converted to Arrow
        self._done = 0                   # how many of self._rows are in self._table
        self._next_step = 0
        self._created = 0
        self._stale = False                  # the run rows are to be written again (a write that had them failed)

    # -- open --------------------------------------------------------------------------------------------
    def open(self, run: RunInfo, *, resume: bool = False) -> None:
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            raise SinkError("neptune sink needs pyarrow: pip install 'trackbridge[neptune]'") from None
        self.run = run
        project = self.options.get("project") or run.project or "trackbridge"
        self.project_id = project if "/" in project else f"trackbridge/{project}"
        run_id = self.options.get("run") or (str(run.run_id) if run.run_id else uuid.uuid4().hex[:12])
        self.folder = self.root / sanitize_path_part(self.project_id)
        parts = part_files(self.folder, sanitize_path_part(run_id))
        if parts and not resume and not self.options.get("run"):
            run_id = f"{run_id}-{uuid.uuid4().hex[:6]}"     # a new run that reuses an id: its own files
            parts = []
        self.run_id = run_id
        self._prefix = sanitize_path_part(run_id)
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise SinkError(f"neptune:{self.location}: cannot create {self.folder}: {exc}") from None
        self._part = (int(PART.match(parts[-1].name).group("n")) + 1) if parts else 0   # type: ignore[union-attr]
        self._rows, self._table, self._done = [], None, 0
        for stale in self.folder.glob(f"{self._prefix}_part_*.parquet.tmp"):
            stale.unlink(missing_ok=True)           # a part a killed writer was writing: the part it replaces stands
        self._created = int(time.time() * 1000)
        last = self.last_step()
        self._next_step = 0 if last is None else last + 1
        self._rows.extend(self._run_rows())
        self._flush()

    def _row(self, path: str, typ: str, step: int | None = None, ms: int | None = None,
             **value: Any) -> tuple[Any, ...]:
        cols = dict.fromkeys(_COLUMNS[6:])
        cols.update(value)
        return (self.project_id, self.run_id, path, typ, None if step is None else Decimal(step), ms,
                *cols.values())

    def _run_rows(self) -> list[tuple[Any, ...]]:
        assert self.run is not None
        rows = [self._row("sys/custom_run_id", "string", string_value=self.run_id),
                self._row("sys/creation_time", "datetime", datetime_value=self._created)]
        if self.run.name:
            rows.append(self._row("sys/name", "string", string_value=self.run.name))
        if self.run.tags:
            rows.append(self._row("sys/tags", "string_set",
                                  string_set_value=[f"{k}={v}" for k, v in sorted(self.run.tags.items())]))
        for path, v in flat_config(self.run.config or {}, "/").items():
            path = CONFIG_PREFIX + path
            if isinstance(v, bool):
                rows.append(self._row(path, "bool", bool_value=v))
            elif isinstance(v, int) and -(2 ** 63) <= v < 2 ** 63:
                rows.append(self._row(path, "int", int_value=v))
            elif isinstance(v, float):
                rows.append(self._row(path, "float", float_value=v))
            elif isinstance(v, str):
                rows.append(self._row(path, "string", string_value=v))
            elif v is not None:
                rows.append(self._row(path, "string", string_value=json.dumps(v, default=str, ensure_ascii=False)))
        info = json.dumps(self.run.to_json(), default=str, ensure_ascii=False, allow_nan=True)
        rows.append(self._row(RUN_ATTRIBUTE, "string", string_value=info))
        return rows

    # -- write -------------------------------------------------------------------------------------------
    def write(self, records: list[Record]) -> None:
        if self.folder is None:
            raise SinkError(f"neptune:{self.location}: write() before open()")
        rows = self._rows
        before, next_step = len(rows), self._next_step
        try:
            self._write(records, rows)
            if len(rows) > before:
                self._flush()
            self._stale = False
        except BaseException:
            # taken back whole: the rows of a batch whose part could not be written are not kept for the next
            # write (the logger retries the batch: kept, they were written twice into the part)
            del rows[before:]
            self._next_step = next_step
            self._stale = True                  # the run rows of that batch (new derived marks) go with the next
            raise

    def _write(self, records: list[Record], rows: list[tuple[Any, ...]]) -> None:
        for rec, step, wall in self.points(records, lo=-STEP_MAX, hi=STEP_MAX,
                                           why="the layout keeps steps as decimal(18, 6), 12 digits at most; the "
                                               "record is left out"):
            ms = round(wall * 1000)
            for name, value in rec.metrics.items():
                kind = value_kind(value)
                if kind is NUMBER:
                    try:
                        rows.append(self._row(name, "float_series", step, ms, float_value=float(value)))
                    except OverflowError:
                        self.reject_value(name, step, "an integer beyond a float64")
                elif kind is NONE:
                    continue
                elif kind is TEXT:
                    rows.append(self._row(name, "string_series", step, ms, string_value=value))
                elif kind is HISTOGRAM:
                    h = value.finite()
                    hv = histogram_value(h) if h is not None else None
                    if hv is None:
                        self.reject_value(name, step, "a histogram with nothing finite to draw")
                    else:
                        rows.append(self._row(name, "histogram_series", step, ms, histogram_value=hv))
                else:
                    self.reject_value(name, step, not_kept(value))
        if self.note_derived(records) or self._stale:
            rows.extend(self._run_rows())

    def _flush(self) -> None:
        """Write the current part whole (a temporary file moved into place); begin the next part when it is full."""
        import pyarrow as pa
        import pyarrow.parquet as pq
        assert self.folder is not None
        new = self._rows[self._done:]
        cols = list(zip(*new)) if new else [()] * len(_COLUMNS)
        try:
            batch = pa.Table.from_arrays([pa.array(list(c), type=f.type) for c, f in zip(cols, schema())],
                                         schema=schema())
        except (pa.ArrowInvalid, pa.ArrowTypeError, ValueError, TypeError) as exc:
            del self._rows[self._done:]
            raise SinkError(f"neptune:{self.location}: cannot encode the batch: {exc}") from None
        table = batch if self._table is None else pa.concat_tables([self._table, batch])
        path = self.folder / f"{self._prefix}_part_{self._part}.parquet"
        tmp = path.with_name(path.name + ".tmp")
        try:
            pq.write_table(table, tmp, compression="snappy")
            os.replace(tmp, path)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            del self._rows[self._done:]         # the part on disk is as it was: so is what the sink holds
            raise SinkError(f"neptune:{self.location}: cannot write {path}: {exc}") from None
        self.progress += 1
        self._table, self._done = table, len(self._rows)     # what the part holds, converted once
        if len(self._rows) >= PART_ROWS:
            self._part += 1
            self._rows, self._table, self._done = [], None, 0

    def close(self) -> None:
        if self.folder is None or self.run is None:
            return
        if self.outcome != "finished":
            self.run.extra = {**(self.run.extra or {}), "outcome": self.outcome}
        self._rows.extend(self._run_rows())
        self._flush()
        self.folder = None

    # -- what the run holds ------------------------------------------------------------------------------
    def stored_points(self, since: int | None) -> list[tuple[str, int]] | None:
        """The series points of the run's parts, per attribute and step (None before open)."""
        if self.folder is None:
            return None
        import pyarrow.parquet as pq
        out: list[tuple[str, int]] = []
        for part in part_files(self.folder, self._prefix):
            try:
                t = pq.read_table(part, columns=["attribute_path", "attribute_type", "step"])
            except Exception:  # noqa: BLE001 - a part that cannot be read holds nothing for catch-up
                continue
            for path, typ, st in zip(*(t.column(i).to_pylist() for i in range(3))):
                if typ.endswith("_series"):
                    step = step_of(st)
                    if step is not None and (since is None or step >= since):
                        out.append((path, step))
        return out

    def describe(self) -> str:
        return f"neptune:{self.location}" + (f" (project {self.project_id}, run {self.run_id})" if self.run_id else "")
