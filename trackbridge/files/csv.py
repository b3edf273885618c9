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

Quotes: a quote that is opened and never closed would make the rest of the file one cell. Such a row is reported
with the line it *starts* on, it is the one row lost (the message says so), and the lines after it are read again
as rows; the same for a quoted cell that spans several lines and leaves the row with the wrong number of cells.
Binary junk (NUL bytes, bytes that are not UTF-8) at the start of the file, or three unreadable rows in a row one
of which is binary, ends the reading of that file with one fatal problem (see
:class:`~trackbridge.tracking.textfiles.JunkGuard`); what came before is kept.
"""
from __future__ import annotations

import csv
import re
from collections import deque
from pathlib import Path
from typing import Any, Iterator

from ..record import Record, RunInfo
from ..tracking.source import RunReader, Source, SourceError, UnreadableRun
from ..tracking.textfiles import JunkGuard, LineSummary, existing_file, not_text, sniff_binary
from .printed import number_or_text, parse_number

STEP_COLUMNS = ("Step", "train/global_step", "global_step", "_step")
_PANEL_EXTREME = re.compile(r"__(?:MIN|MAX)$")


def sniff(path_or_uri: str) -> bool:
    """A ``.csv`` file."""
    p = Path(path_or_uri)
    return p.is_file() and p.suffix.lower() == ".csv"


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

    def _swallowed(self, inner: list[tuple[int, str]], width: int) -> bool:
        """Whether the lines inside a quoted cell that spans several lines look like rows of this table (as many
        cells as the header, an integer step): then the quote was not closed where it should have been, and the
        row has the right width only by accident."""
        return any(_looks_like_row(text, width, self.step_col) for _, text in inner)

    def _misshapen(self, lines: "_Lines", row: list[str], width: int) -> str | None:
        """Why a row is not one of the table's (another width than the header's, or lines inside a quoted cell that
        look like rows), its lines after the first to be read again as rows; None for a row of the table."""
        if len(row) == width and not (len(lines.taken) > 2 and self._swallowed(lines.taken[1:-1], width)):
            return None
        rest = lines.taken[1:]
        if rest:
            shape = (f"leaves a row of {len(row)} cells (header: {width})" if len(row) != width
                     else "holds lines that look like rows of the table")
            lines.push_back(rest)
            return (f"a quoted cell opened on this line runs over {len(rest) + 1} lines to line "
                    f"{rest[-1][0]} and {shape}: a quote that is not closed? This row is skipped "
                    f"(1 row lost) and the {len(rest)} line(s) after it are read again as rows")
        return f"row has {len(row)} cells, header has {width}; skipped (cut off or not part of the table)"

    def _metrics(self, row: list[str], line: int, non_scalar: dict[str, LineSummary]) -> dict[str, Any]:
        """A row's values by metric name: empty cells left out, media and tables (JSON cells) counted per name."""
        metrics: dict[str, Any] = {}
        for i, name in self.columns.items():
            cell = row[i]
            if cell == "":
                continue
            if cell[:1] in "{[":
                non_scalar.setdefault(name, LineSummary()).add(line)
                continue
            metrics[name] = number_or_text(cell)
        return metrics

    def _wall_time(self, row: list[str]) -> float | None:
        if self.time_col is None:
            return None
        t = parse_number(row[self.time_col])
        return float(t) if t is not None else None

    def records(self) -> Iterator[Record]:
        where = str(self.path)
        width = len(self.header)
        no_step = LineSummary()
        non_scalar: dict[str, LineSummary] = {}
        guard = JunkGuard(self, self.path, "a CSV table")
        ordinal = 0
        with open(self.path, newline="", encoding="utf-8-sig", errors="replace") as fh:
            lines = _Lines(fh)
            reader = csv.reader(lines, strict=True)
            try:
                next(reader)
            except (StopIteration, csv.Error):
                return
            while True:
                lines.taken.clear()
                try:
                    row = next(reader)
                except StopIteration:
                    break
                except csv.Error as exc:
                    if not lines.taken:
                        break
                    line, text, what = _unreadable(lines, exc)
                    if guard.bad(line, None, text, f"{where}:{line}", what):
                        return
                    continue
                line = lines.taken[0][0] if lines.taken else lines.n
                if not row or all(not c.strip() for c in row):
                    continue
                misshapen = self._misshapen(lines, row, width)
                if misshapen is not None:
                    text = lines.taken[0][1] if lines.taken else ""
                    if guard.bad(line, None, text, f"{where}:{line}", misshapen):
                        return
                    continue
                guard.good()
                metrics = self._metrics(row, line, non_scalar)
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
                yield Record(step=step, wall_time=self._wall_time(row), metrics=metrics)
        guard.flush()
        if no_step.count and self.step_col is not None:
            self.skip(where, no_step.text(f"rows with no integer {self.header[self.step_col]!r}"))
        for name, summary in non_scalar.items():
            self.skip(where, summary.text(f"non-scalar cells (media/tables) of {name!r}"))


def _unreadable(lines: "_Lines", exc: csv.Error) -> tuple[int, str, str]:
    """A row the csv module cannot read: its line, its text and why it is skipped; the lines after its first are
    read again as rows (a quote left open swallows them)."""
    line, text = lines.taken[0]
    rest = lines.taken[1:]
    if rest:
        what = (f"a quote opened on this line is not closed: the row runs over {len(rest) + 1} "
                f"lines to line {rest[-1][0]} ({exc}); this row is skipped (1 row lost) and the "
                f"{len(rest)} line(s) after it are read again as rows")
    else:
        what = f"unreadable CSV row ({exc}); skipped (1 row lost)"
    lines.push_back(rest)
    return line, text, what


def _looks_like_row(text: str, width: int, step_col: int | None) -> bool:
    try:
        cells = next(csv.reader([text]), [])
    except csv.Error:
        return False
    if len(cells) != width:
        return False
    if step_col is not None:
        num = parse_number(cells[step_col])
        return num is not None and float(num).is_integer()
    return any(parse_number(c) is not None for c in cells)


class _Lines:
    """The lines of a text file for ``csv.reader``, numbered like an editor, with the lines of the current row kept
    (``taken``: ``(line number, text)``) and lines that can be handed back to be read again (``push_back``)."""

    def __init__(self, fh: Any) -> None:
        self.fh = fh
        self.n = 0
        self.taken: list[tuple[int, str]] = []
        self._again: deque[tuple[int, str]] = deque()

    def __iter__(self) -> "_Lines":
        return self

    def __next__(self) -> str:
        if self._again:
            item = self._again.popleft()
        else:
            text = next(self.fh)
            self.n += 1
            item = (self.n, text)
        self.taken.append(item)
        return item[1]

    def push_back(self, items: list[tuple[int, str]]) -> None:
        self._again.extendleft(reversed(items))


class CsvSource(Source):
    """A W&B CSV export (history or panel layout); a folder means every ``*.csv`` in it."""
    text_form = "a CSV file"

    kind = "csv"
    option_names = ("step",)

    def runs(self) -> Iterator[RunReader]:
        p = existing_file(self.location, "csv")
        files = sorted(f for f in p.iterdir() if f.suffix.lower() == ".csv") if p.is_dir() else [p]
        if not files:
            raise SourceError(f"csv: folder {p} holds no .csv files")
        for f in files:
            yield from self._runs_of(f)

    def _runs_of(self, path: Path) -> Iterator[RunReader]:
        with open(path, "rb") as fh:
            bom = 3 if fh.read(3) == b"\xef\xbb\xbf" else 0
        binary = sniff_binary(path, skip=bom)
        if binary is not None:          # one run that says why, once; the other files of a folder are still read
            yield UnreadableRun(path.stem, f"{path}:1", not_text(path, *binary, "a CSV export"))
            return
        header = _read_header(path)
        want = self.options.get("step")
        if want and want not in header:
            raise SourceError(f"csv: {path}: no column {want!r} for ?step= (columns: {', '.join(header[:12])}...)")
        panel = _panel_runs(header)
        if panel is not None and not want:
            panel_step = header.index("Step")
            for run, cols in panel.items():
                kept = {i: m for i, m in cols.items() if not _PANEL_EXTREME.search(m)}
                left = [header[i] for i in cols if i not in kept]
                yield CsvRun(path, header, kept, panel_step, None, run, "wandb-panel", left)
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
