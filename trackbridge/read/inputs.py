"""What every command reads, and how: one run in, its records, its config and its source resolved one way.

:func:`open_runs` turns what a user names (``[LABEL=]KIND:LOCATION``, a plain path a reader recognises, a JSON-lines
or JSON file, ``-`` for stdin) into :class:`InputRun` objects; ``translate``, ``detect``, ``migrate``, ``compare``
and the demo all read runs through it, so that for the same input they see the same things:

* **the run config**: the reader's (a TensorBoard folder's ``args``/``model_config`` texts, a stream's header, an
  MLflow run's params, a ``trainer_state.json``'s settings), plus what ``--config`` adds;
* **the source**: :meth:`InputRun.pipeline` is :meth:`~trackbridge.pipeline.Pipeline.for_run` on that info, and a
  pipeline resolves the framework, trainer and releases from the run's first
  :data:`~trackbridge.pipeline.DETECT_LOOKAHEAD` records and the config (:meth:`InputRun.resolve` is exactly that
  step, what ``detect`` reports);
* **the time axis**: a run has wall times of its own only when its reader says so *and* its first record has one. A
  run without them (a ``trainer_state.json``, a console log, JSON lines without ``wall_time``, a tracker copy marked
  by an earlier write) yields records without wall times, and its info carries ``extra["time_axis"] = "missing"``
  (:data:`~trackbridge.tracking.source.TIME_AXIS`), which every sink stores with the run and every reader honours: the
  timestamps a tracker has to invent are never read back as the run's.

Logged dicts: JSON lines (one logged dict per line, or trackbridge stream records ``{"step", "metrics"}``), a
Hugging Face ``trainer_state.json`` (its ``log_history``), a JSON document with a ``rows`` list (the public-log
fixtures), a JSON list of logged dicts, and one JSON object of values (a ``wandb-summary.json``, a benchmark's
results: one row, nested names joined by ``/``). ``translate`` and ``detect`` read stdin, ``.json``/``.jsonl``
files and files no reader recognises this way (:func:`~trackbridge.files.rows.read_rows`: every value kept, bad
lines reported with file and line number and skipped); a stream header there is the run's info as for the ``jsonl``
reader.
"""
from __future__ import annotations

import copy
import itertools
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Mapping

from ..errors import UsageError
from ..files.rows import Row, read_rows
from ..record import Record, RunInfo
from ..tracking.inputfile import InputError
from ..tracking.inputfile import input_problem as _input_problem
from ..tracking.source import TIME_AXIS, Problem, RunReader
from .selection import Selection

if TYPE_CHECKING:       # pragma: no cover
    from ..pipeline import Pipeline
    from ..schema.loader import Registry


# -- the one rule for an input file (trackbridge/tracking/inputfile.py); each format's facts come from its reader
#: logged dicts read as rows (``translate``, ``detect``): JSON or JSON lines
_ROWS_TEXT = "JSON or JSON lines"


def _format_facts(kind: str | None) -> dict[str, Any]:
    """What the reader registered as ``kind`` declares of its files (signature, text form, head check)."""
    if kind is None:
        return {"text": _ROWS_TEXT}
    if not kind:
        return {}
    try:
        from ..trackers import source_class
        cls = source_class(kind)
    except Exception:       # noqa: BLE001 - an unknown kind or a missing extra: said when the reader is opened
        return {}
    return {"signature": cls.signature, "text": cls.text_form, "head_check": cls.head_problem}


def input_problem(path: str | Path, kind: str | None = None) -> str | None:
    """Why ``path`` cannot be read as an input of ``kind`` (a reader's kind, None for logged dicts, "" for a file
    whose reader is not known yet), or None: :func:`trackbridge.tracking.inputfile.input_problem` with what the
    kind's reader declares."""
    return _input_problem(path, **_format_facts(kind))


def check_input(path: str | Path, kind: str | None = None) -> None:
    """Raise :class:`InputError` naming ``path`` when it breaks :func:`input_problem`'s rule."""
    why = input_problem(path, kind)
    if why is not None:
        raise InputError(f"{path}: {why}")


# ---------------------------------------------------------------------------------------------------- runs
class RowsRun(RunReader):
    """A file of logged dicts (:func:`read_rows`: JSON lines, a ``log_history`` or ``rows`` document) or stdin, as
    one run. Its info is the stream header's when the file has one (as the ``jsonl`` reader's), else a run named
    after the file. ``shape`` is ``"record"`` once a stream record (``{"step", "metrics"}``) was read. Stdin can be
    read once; a file is read again on every call of :meth:`records`."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path
        self.shape = "dict"
        self._headers: list[dict[str, Any]] = []
        self._settings: dict[str, Any] = {}          # a trainer_state.json's settings: the run config
        self._raw: list[str] = []
        self._rows: Iterator[Row] | None = None
        self._first: list[Row] = []
        self._read = False
        self._info: RunInfo | None = None

    def _start(self) -> None:
        if self._rows is None and not self._read:
            self._rows = read_rows(self.path, self._raw, self._headers, self._settings)
            self._first = list(itertools.islice(self._rows, 1))      # the header, if any, comes before it

    @property
    def info(self) -> RunInfo:
        if self._info is None:
            self._start()
            if self._headers:
                self._info = RunInfo.from_json(self._headers[0])
            else:
                name = "stdin" if self.path == "-" else Path(self.path).stem
                self._info = RunInfo(name=name, run_id=name, config=dict(self._settings))
        return self._info

    def records(self) -> Iterator[Record]:
        self._start()
        if self._rows is not None:
            rows: Iterable[Row] = itertools.chain(self._first, self._rows)
            self._rows, self._first, self._read = None, [], True
        elif self.path == "-":
            rows = ()
        else:
            rows = read_rows(self.path, self._raw)
        try:
            for row in rows:
                self._flush()
                if row.shape == "record":
                    self.shape = "record"
                step = row.step if isinstance(row.step, int) and not isinstance(row.step, bool) else None
                wall = row.wall_time if isinstance(row.wall_time, (int, float)) else None
                yield Record(step, wall, row.metrics)
        finally:
            self._flush()

    def _flush(self) -> None:
        """The lines :func:`read_rows` skipped so far, as :attr:`problems` (``file:line: why``)."""
        for text in self._raw:
            where, sep, what = text.partition(": ")
            self.problems.append(Problem(where, what) if sep else Problem(self.path, text))
        self._raw.clear()


class NothingReadable(InputError):
    """A run whose reader gave up on its file before a single record: nothing readable (the file is named)."""


def _readable(reader: RunReader, records: Iterator[Record]) -> Iterator[Record]:
    """``records``, and at their end the rule's last part: a run whose reader gave up on its file (binary junk where
    text was expected, a file with no record frame) and yielded nothing at all is :class:`NothingReadable`, an error
    naming the file, judged after reading and before anything is written (migrate opens its destination with the
    first record; compare writes no report)."""
    n = 0
    for rec in records:
        n += 1
        yield rec
    if n == 0 and reader.gave_up:
        fatal = next(p for p in reader.problems if p.fatal)
        raise NothingReadable(f"{fatal.where}: {fatal.what}; nothing readable, so nothing was written")


def _without_wall_time(records: Iterable[Record]) -> Iterator[Record]:
    for r in records:
        yield Record(r.step, None, r.metrics, r.derived, r.axis) if r.wall_time is not None else r


class InputRun:
    """One run as every command reads it (see the module docstring): ``info`` (the reader's, with ``config`` added
    and the time-axis mark), ``records()`` (without wall times when the run has none of its own), and
    :meth:`pipeline` / :meth:`resolve` (its source, resolved from its keys and config)."""

    def __init__(self, reader: RunReader, locator: str, label: str | None = None,
                 config: Mapping[str, Any] | None = None) -> None:
        self.reader = reader
        self.locator = locator          # as given, without a label
        self.label = label
        self.source: str | None = None  # the locator's ?from=FRAMEWORK[/TRAINER][@VERSION], when given
        self._config = dict(config or {})
        self._info: RunInfo | None = None
        self._has_time: bool | None = None
        self._first: Record | None = None
        self._pending: Iterator[Record] | None = None
        self.metrics: list[str] = []     # glob patterns of the names its pipeline keeps (open_runs' ``metrics``)

    @property
    def problems(self) -> list[Problem]:
        return self.reader.problems

    @property
    def has_wall_time(self) -> bool:
        """Whether the run's records carry wall times of their own: the reader says so (a tracker copy marked
        ``time_axis: missing`` does not) and the first record has one. Peeks at the first record once."""
        if self._has_time is None:
            if not self.reader.has_wall_time:
                self._has_time = False
            else:
                it = iter(self.reader.records())
                first = next(it, None)
                self._pending = it if first is None else itertools.chain([first], it)
                self._first = first
                self._has_time = first is None or first.wall_time is not None
        return self._has_time

    @property
    def started(self) -> float | None:
        """When the run started: its first record's wall time (seconds since the epoch), or None when the run has
        no wall times of its own or no records (what ``--since``/``--until`` select on)."""
        if not self.has_wall_time or self._first is None or self._first.wall_time is None:
            return None
        try:
            return float(self._first.wall_time)
        except (TypeError, ValueError):
            return None

    @property
    def info(self) -> RunInfo:
        """The reader's run info, with ``--config`` added over its config and ``extra["time_axis"] = "missing"``
        when the run has no wall times of its own (so that whatever is written from it says so)."""
        if self._info is None:
            base = self.reader.info
            info = copy.copy(base)
            info.config = {**(base.config or {}), **self._config}
            info.extra = dict(base.extra or {})
            if not self.has_wall_time:
                info.extra[TIME_AXIS] = "missing"
            self._info = info
        return self._info

    def records(self) -> Iterator[Record]:
        """The run's records as stored (names untranslated); wall times left out when the run has none of its own.
        Each call reads the run again (stdin: once)."""
        no_time = not self.has_wall_time
        it, self._pending = (self._pending, None) if self._pending is not None else (self.reader.records(), None)
        return _readable(self.reader, _without_wall_time(it) if no_time else iter(it))

    def pipeline(self, names: str = "canonical", *, source: str | None = None, mappings: Iterable[str] | None = None,
                 derive: bool = True, registry: Registry | None = None) -> Pipeline:
        """The pipeline that translates this run (:meth:`~trackbridge.pipeline.Pipeline.for_run` on :attr:`info`):
        the source is resolved from the first records it is given and the run config. ``source``: what the names
        are (default: the locator's ``?from=``, else ``auto``)."""
        from ..pipeline import Pipeline
        return Pipeline.for_run(self.info, names, source=source or self.source or "auto", mappings=mappings,
                                derive=derive, registry=registry, select=self.metrics or None)

    def resolve(self, source: str | None = None, *, mappings: Iterable[str] | None = None,
                registry: Registry | None = None) -> Pipeline:
        """The pipeline with its source resolved as :meth:`pipeline`'s is when it translates the run: from the
        first :data:`~trackbridge.pipeline.DETECT_LOOKAHEAD` records' keys and the run config (what ``detect``
        reports)."""
        from ..pipeline import DETECT_LOOKAHEAD
        pipe = self.pipeline("canonical", source=source, mappings=mappings, derive=False, registry=registry)
        keys: set[str] = set()
        for rec in itertools.islice(self.records(), DETECT_LOOKAHEAD):
            keys.update(rec.metrics)
        pipe.setup(keys)
        return pipe


def open_runs(text: str, *, config: Mapping[str, Any] | None = None, rows: bool = False,
              allow_label: bool = False, select: Selection | None = None) -> list[InputRun]:
    """Every run that ``text`` names (:func:`_open_runs`) that ``select`` keeps (:class:`~trackbridge.read.selection.
    Selection`: runs by name pattern, tags and start date; its ``metrics`` globs are handed to each run, whose
    pipeline keeps only those names: :meth:`InputRun.pipeline`). The same selection for ``migrate``, ``doctor``,
    ``compare`` and ``trackbridge.read``."""
    out = _open_runs(text, config=config, rows=rows, allow_label=allow_label)
    if select is None:
        return out
    out = [r for r in out if select.keep(r)]
    for r in out:
        r.metrics = list(select.metrics)
    return out


def parse_tags(items: Iterable[str]) -> dict[str, str]:
    """``--tag KEY=VALUE`` (or ``--tag KEY``: the tag exists) items as a dict; a bad item is a one-line error."""
    out: dict[str, str] = {}
    for item in items:
        key, _, value = str(item).partition("=")
        if not key.strip():
            raise UsageError(f"--tag {item!r}: expected KEY=VALUE or KEY")
        out[key.strip()] = value.strip()
    return out


def _open_runs(text: str, *, config: Mapping[str, Any] | None = None, rows: bool = False,
               allow_label: bool = False) -> list[InputRun]:
    """Every run that ``text`` names (one for a file, several for a TensorBoard root or an MLflow experiment).

    ``text``: ``KIND:LOCATION[?options]``, a plain path a reader recognises (:func:`~trackbridge.trackers.
    source_locator`; a path none recognises, or one that does not exist, raises :class:`~trackbridge.tracking.locators.
    LocatorError`). With ``rows`` (``translate``, ``detect``), ``-`` (stdin), ``.json``/``.jsonl`` files and files
    no reader recognises are read as logged dicts (:class:`RowsRun`). ``config`` is added over each run's own
    config. With ``allow_label``, ``LABEL=`` in front names the runs (:attr:`InputRun.label`). A locator option
    ``from=FRAMEWORK[/TRAINER][@VERSION]`` (``console:verl.log?from=verl@v0.3.0.post1``) names the source instead
    of detecting it (:attr:`InputRun.source`); it is taken off before the reader sees the locator."""
    from ..trackers import guess_locator, kinds, open_source, source_locator
    from ..tracking.locators import Locator, is_locator, parse, split_label
    label, text = split_label(text.strip()) if allow_label else (None, text)
    if rows and not is_locator(text):
        plain = text == "-" or text.endswith((".json", ".jsonl"))
        guessed = None if plain else guess_locator(text)
        if guessed is None or guessed.startswith("jsonl:"):
            if text != "-" and not Path(text).exists():
                raise InputError(f"{text}: cannot open (no such file or folder)")
            if text != "-":
                check_input(text, None)
            return [InputRun(RowsRun(text), text, label, config)]
    if not is_locator(text) and os.path.lexists(text) and not Path(text).is_dir():
        check_input(text, None if text.endswith((".json", ".jsonl")) else "")   # before a reader is guessed
    loc = parse(source_locator(text), kinds=kinds("source"))
    where = loc.location
    if "://" not in where and os.path.lexists(where) and not Path(where).is_dir():
        check_input(where, loc.kind)        # the file a locator names: the one rule, before its reader opens it
    opts = dict(loc.options)
    given = opts.pop("from", None)            # ?from=FRAMEWORK[/TRAINER][@VERSION]: the source named, not detected
    loc = Locator(loc.kind, loc.location, opts)
    out = [InputRun(reader, str(loc), label, config) for reader in open_source(loc).runs()]
    for run in out:
        run.source = given
    return out
