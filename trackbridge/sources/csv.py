"""``csv:PATH``: a run's history exported from W&B as CSV (or a folder of such files, one run per file).

Two layouts are recognised from the header:

* **history export** (``run.history()``/``scan_history()`` written to CSV, or the UI's run-history download): one
  row per ``wandb.log`` call, columns ``_step``, ``_runtime``, ``_timestamp`` and one per metric. A leading unnamed
  pandas index column is ignored.
* **panel export** (a line plot's "Export panel data -> CSV"): ``Step`` then ``<run name> - <metric>`` columns, with
  ``<run name> - <metric>__MIN`` / ``__MAX`` extremes when the panel was bucketed. Each run name becomes its own run;
  the ``__MIN``/``__MAX`` columns are not logged values and are left out (listed in ``RunInfo.extra``).

The step is taken from the ``?step=COLUMN`` option, else the first present of ``Step``, ``train/global_step`` (the
x-axis Hugging Face's wandb callback declares with ``define_metric``), ``global_step``, ``_step``; else the row's
position (``RunInfo.extra['step_source'] == 'ordinal'``). The step column is not repeated as a metric; other
columns starting with ``_`` (wandb bookkeeping: ``_runtime``, unused ``_step``) are left out too.
An empty cell means the metric was not logged in that row (it is *not* NaN). Wall time comes from ``_timestamp``
when that column exists, otherwise there is none (never made up). Rows with the wrong number of cells (a cut-off
last line, garbage) are skipped and reported with their line.
"""
from __future__ import annotations

import csv
import re
from pathlib import Path
from typing import Any, Iterator

from ..record import Record, RunInfo
from ._files import LineSummary, existing_file, number_or_text, parse_number
from .base import RunReader, Source, SourceError

STEP_COLUMNS = ("Step", "train/global_step", "global_step", "_step")
_PANEL_EXTREME = re.compile(r"__(?:MIN|MAX)$")


def _read_header(path: Path) -> list[str]:
    with open(path, newline="", encoding="utf-8-sig", errors="replace") as fh:
        try:
            return next(csv.reader(fh))
        except StopIteration:
            raise SourceError(f"csv: {path} is empty (no header row)") from None


def _panel_runs(header: list[str]) -> dict[str, dict[int, str]] | None:
    """``{run name: {column index: metric}}`` if the header is a panel export, else None."""
    if "Step" not in header:
        return None
    runs: dict[str, dict[int, str]] = {}
    for i, col in enumerate(header):
        if col == "Step":
            continue
        run, sep, metric = col.rpartition(" - ")
        if not sep or not run or not metric:
            return None
        runs.setdefault(run, {})[i] = metric
    return runs or None


class CsvRun(RunReader):
    """The columns of one run in one CSV file."""

    def __init__(self, path: Path, header: list[str], columns: dict[int, str], step_col: int | None,
                 time_col: int | None, name: str, layout: str, left_out: list[str]) -> None:
        super().__init__()
        self.path = path
        self.header = header
        self.columns = columns          # column index -> metric name
        self.step_col = step_col
        self.time_col = time_col
        self.layout = layout
        self._info = RunInfo(name=name, names="raw", extra={
            "path": str(path), "layout": layout,
            "step_source": header[step_col] if step_col is not None else "ordinal",
            "left_out_columns": left_out,
        })

    @property
    def info(self) -> RunInfo:
        return self._info

    @property
    def has_wall_time(self) -> bool:
        return self.time_col is not None

    def records(self) -> Iterator[Record]:
        where = str(self.path)
        width = len(self.header)
        no_step = LineSummary()
        non_scalar: dict[str, LineSummary] = {}
        ordinal = 0
        with open(self.path, newline="", encoding="utf-8-sig", errors="replace") as fh:
            reader = csv.reader(fh)
            try:
                next(reader)
            except StopIteration:
                return
            while True:
                try:
                    row = next(reader)
                except StopIteration:
                    break
                except csv.Error as exc:
                    self.skip(f"{where}:{reader.line_num}", f"unreadable CSV row ({exc}); skipped")
                    continue
                line = reader.line_num
                if not row or all(not c.strip() for c in row):
                    continue
                if len(row) != width:
                    self.skip(f"{where}:{line}", f"row has {len(row)} cells, header has {width}; skipped "
                                                 f"(cut off or not part of the table)")
                    continue
                metrics: dict[str, Any] = {}
                for i, name in self.columns.items():
                    cell = row[i]
                    if cell == "":
                        continue
                    if cell[:1] in "{[":
                        non_scalar.setdefault(name, LineSummary()).add(line)
                        continue
                    metrics[name] = number_or_text(cell)
                if not metrics:
                    continue          # this run logged nothing in this row (panel exports hold several runs)
                if self.step_col is None:
                    ordinal += 1
                    step: int | None = ordinal
                else:
                    num = parse_number(row[self.step_col])
                    if num is None or not float(num).is_integer():
                        no_step.add(line)
                        continue
                    step = int(num)
                wall = None
                if self.time_col is not None:
                    t = parse_number(row[self.time_col])
                    wall = float(t) if t is not None else None
                yield Record(step=step, wall_time=wall, metrics=metrics)
        if no_step.count:
            self.skip(where, no_step.text(f"rows with no integer {self.header[self.step_col]!r}"))
        for name, summary in non_scalar.items():
            self.skip(where, summary.text(f"non-scalar cells (media/tables) of {name!r}"))


class CsvSource(Source):
    """A W&B CSV export (history or panel layout); a folder means every ``*.csv`` in it."""

    kind = "csv"

    def runs(self) -> Iterator[RunReader]:
        p = existing_file(self.location, "csv")
        files = sorted(f for f in p.iterdir() if f.suffix.lower() == ".csv") if p.is_dir() else [p]
        if not files:
            raise SourceError(f"csv: folder {p} holds no .csv files")
        for f in files:
            yield from self._runs_of(f)

    def _runs_of(self, path: Path) -> Iterator[RunReader]:
        header = _read_header(path)
        want = self.options.get("step")
        if want and want not in header:
            raise SourceError(f"csv: {path}: no column {want!r} for ?step= (columns: {', '.join(header[:12])}...)")
        panel = _panel_runs(header)
        if panel is not None and not want:
            step_col = header.index("Step")
            for run, cols in panel.items():
                kept = {i: m for i, m in cols.items() if not _PANEL_EXTREME.search(m)}
                left = [header[i] for i in cols if i not in kept]
                yield CsvRun(path, header, kept, step_col, None, run, "wandb-panel", left)
            return
        step_name = want or next((c for c in STEP_COLUMNS if c in header), None)
        step_col = header.index(step_name) if step_name else None
        time_col = header.index("_timestamp") if "_timestamp" in header else None
        columns: dict[int, str] = {}
        left_out: list[str] = []
        for i, col in enumerate(header):
            if i == step_col or i == time_col:
                continue
            if col == "" and i == 0 or col.startswith("_"):
                left_out.append(col or "(index)")
                continue
            columns[i] = col
        yield CsvRun(path, header, columns, step_col, time_col, path.stem, "wandb-history", left_out)
