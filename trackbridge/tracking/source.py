"""The one small interface every run reader implements: list runs, read config, read points as a stream.

A :class:`Source` is opened from a locator and lists the :class:`RunReader` objects it holds (a TensorBoard root or an
MLflow experiment holds many runs; a ``trainer_state.json`` holds one). A run reader yields
:class:`~trackbridge.record.Record` objects *under the names as stored* (translation happens later in the pipeline),
with any sanitization that trackbridge recorded in the run already undone. Readers stream: they never load a whole run
into memory. Anything they cannot read is reported in :attr:`RunReader.problems` (with file and offset or line) and
skipped; a partial point is never yielded. Where a reader gives up on a file (binary junk where text was expected, a
file with nothing in it) the problem is *fatal* (:meth:`RunReader.stop`): reported once, and a run that yields no
record and has a fatal problem is not created in a migration's destination (``migrate`` fails that run).

Records per step and split: a reader that has to gather separately stored points into records (TensorBoard files
from other writers hold one Event per value; MLflow holds points, not rows) puts two points into one record only
when they have the same step, and either the same wall time exactly (one logged row, kept whole) or the same split
(:func:`split_of`: the spellings of canonical.yaml ``splits:``, ``eval/``, ``eval_``, ``test/``, ``test_``; anything
else is ``train``) and wall times at
most :data:`WALL_TIME_TOLERANCE` seconds apart, and the record does not hold that name yet (see :func:`same_row`).
The epoch belongs to no split (``epoch``, ``train/epoch``: transformers adds it to every row, evaluation rows too,
and its TensorBoard callback writes it as ``train/epoch``), so it stays with the row it was logged in.
A record's wall time is its first point's. So the training row and the evaluation row of one step stay two records,
each with its own wall time, while the values a ``SummaryWriter`` writes one ``add_scalar`` after another
(microseconds apart) stay one row. Readers of row-based stores (wandb, Trackio, JSONL, CSV, ``trainer_state.json``,
console logs) give one record per stored row and never merge rows.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

from ..errors import TrackBridgeError
from ..record import Record, RunInfo, split_by_axis
from ..schema.facts import SPLITS

TIME_AXIS = "time_axis"        # RunInfo.extra key: "missing" when the run's source held no wall times

WALL_TIME_TOLERANCE = 1.0      # seconds: points further apart than this from a record's first point are not merged
NO_SPLIT = frozenset({"epoch", "train/epoch"})     # logged in every row, of every split


def split_of(name: str) -> str | None:
    """The split a metric name belongs to: ``eval`` (``eval/``, ``eval_``), ``test`` (``test/``, ``test_``), else
    ``train`` (``train/`` or no prefix); None for the epoch (:data:`NO_SPLIT`), which every row carries."""
    if name in NO_SPLIT:
        return None
    return SPLITS.of_raw(name)


def splits_of(names: Iterable[str]) -> frozenset[str]:
    """The splits of ``names`` (the epoch counts for none)."""
    return frozenset(s for s in map(split_of, names) if s is not None)


def same_row(step: int | None, wall_time: float | None, splits: frozenset[str], other_step: int | None,
             other_wall_time: float | None, other_splits: frozenset[str],
             tolerance: float = WALL_TIME_TOLERANCE) -> bool:
    """Whether points at ``other_step``/``other_wall_time`` (of ``other_splits``) may join the record at
    ``step``/``wall_time`` holding ``splits`` (the caller also checks that no name repeats): same step, and the
    same wall time exactly, or at most one split between them (see :func:`splits_of`) and wall times at most
    ``tolerance`` seconds apart."""
    if step != other_step:
        return False
    if wall_time == other_wall_time:
        return True
    if wall_time is None or other_wall_time is None:
        return False
    return len(splits | other_splits) <= 1 and abs(other_wall_time - wall_time) <= tolerance


def gather(points: Iterable[tuple[int | None, float | None, str, Any]]) -> Iterator[Record]:
    """Records from points ``(step, wall_time, name, value)`` in the order given, for a reader of a store that keeps
    points rather than rows: a point joins the record before it when :func:`same_row` allows it and the record does
    not hold its name yet, else it starts a new record (so a key logged twice at one step stays two records, and a
    step's training and evaluation rows stay two records, each with its own wall time)."""
    rec: Record | None = None
    splits: frozenset[str] = frozenset()
    for step, wall_time, name, value in points:
        split = split_of(name)
        mine = frozenset((split,)) if split is not None else frozenset()
        if rec is not None and name not in rec.metrics and same_row(rec.step, rec.wall_time, splits, step,
                                                                    wall_time, mine):
            rec.metrics[name] = value
            splits |= mine
            continue
        if rec is not None:
            yield rec
        rec, splits = Record(step=step, wall_time=wall_time, metrics={name: value}), mine
    if rec is not None:
        yield rec


@dataclass
class Problem:
    """Something a reader skipped: where (file and offset or line) and why."""

    where: str
    what: str
    fatal: bool = False     # the reader gave up on the file here (see RunReader.stop)

    def __str__(self) -> str:
        return f"{self.where}: {self.what}"


class SourceError(TrackBridgeError, RuntimeError):
    """A source that cannot be read at all (missing path, unreachable server, no such run)."""


class RunReader(ABC):
    """One run inside a source."""

    def __init__(self) -> None:
        self.problems: list[Problem] = []

    @property
    @abstractmethod
    def info(self) -> RunInfo:
        """Name, project, config/hyperparameters, tags and recorded sanitization of the run."""

    @abstractmethod
    def records(self) -> Iterator[Record]:
        """The run's points, in stored order: one record per stored row, or, where the store keeps points rather
        than rows, per step and split (see the module docstring)."""

    @property
    def has_wall_time(self) -> bool:
        """False when the run has no time axis of its own: an earlier migration marked it (the tracker it went to
        had to store *some* time, which is not the run's)."""
        return (self.info.extra or {}).get(TIME_AXIS) != "missing" if isinstance(self.info.extra, dict) else True

    def skip(self, where: str, what: str) -> None:
        self.problems.append(Problem(where, what))

    def stop(self, where: str, what: str) -> None:
        """Report that the reader gave up on a file at ``where`` (once; the reader then stops reading it)."""
        self.problems.append(Problem(where, what, fatal=True))

    @property
    def gave_up(self) -> bool:
        """True when some file of the run was abandoned (a fatal problem, see :meth:`stop`)."""
        return any(p.fatal for p in self.problems)


class UnreadableRun(RunReader):
    """A run standing for a file that cannot be read at all (binary junk where a text format was expected): it
    yields no record and reports the reason once, as a fatal problem, when its records are asked for."""

    def __init__(self, name: str, where: str, what: str) -> None:
        super().__init__()
        self._info = RunInfo(name=name, run_id=name)
        self._where, self._what = where, what

    @property
    def info(self) -> RunInfo:
        return self._info

    def records(self) -> Iterator[Record]:
        if not self.gave_up:
            self.stop(self._where, self._what)
        return iter(())


class Source(ABC):
    kind: str = "source"
    #: the locator options (``?name=value``) this reader reads; any other is refused, naming these (None: not
    #: declared, anything is taken)
    option_names: tuple[str, ...] | None = None
    #: what a file of this format starts with, and what the format is, for the one input rule
    #: (:mod:`trackbridge.tracking.inputfile`): a file named as this kind that does not start so is refused
    signature: tuple[bytes, str] | None = None
    #: the name of this text format (``"JSON lines"``): a file of it must not be an SQLite store, an image or an archive
    text_form: str | None = None
    #: the format's own test of a file's first 64 bytes, ``(head, size, what its magic bytes say) -> problem | None``
    head_problem: Callable[[bytes, int, str | None], str | None] | None = None

    def __init__(self, location: str, **options: str) -> None:
        self.location = location
        self.options = dict(options)

    @abstractmethod
    def runs(self) -> Iterator[RunReader]:
        """Every run this source holds (after filtering by the locator's options)."""


def mark_derived(info: RunInfo, records: Iterator[Record]) -> Iterator[Record]:
    """Restore what a store keeps per run rather than per point: the ``derived`` marks (``info.extra["derived"]``),
    the x axis of each series of a run with several (``info.extra["axes"]``, metric name -> axis, recorded by the
    sinks: a record that gathered points of two axes at one step becomes one record per axis, each with its
    ``axis``), and the absence of a time axis (``info.extra["time_axis"] == "missing"``: the write-time timestamps
    the tracker had to store are dropped, never passed off as the run's wall times)."""
    extra_info = info.extra if isinstance(info.extra, dict) else {}
    derived = set(extra_info.get("derived") or ())
    no_time = extra_info.get(TIME_AXIS) == "missing"
    axes = extra_info.get("axes")
    axis_of = axes.get if isinstance(axes, dict) and axes else None
    for rec in records:
        if derived:
            extra = [k for k in rec.metrics if k in derived and k not in rec.derived]
            if extra:
                rec.derived = [*rec.derived, *extra]
        if no_time and rec.wall_time is not None:
            rec.wall_time = None
        if axis_of is None:
            yield rec
        else:
            yield from split_by_axis(rec, axis_of)


def nest_config(flat: dict[str, Any], sep: str = "/") -> dict[str, Any]:
    """A config stored flat (``{"a/b": 1}``, as some trackers keep hyperparameters or attributes)
    made nested again (``{"a": {"b": 1}}``); a key that is both a value and a prefix keeps the nested one."""
    out: dict[str, Any] = {}
    for path, v in flat.items():
        parts = path.split(sep)
        d = out
        for p in parts[:-1]:
            nxt = d.get(p)
            if not isinstance(nxt, dict):
                nxt = d[p] = {}
            d = nxt
        d[parts[-1]] = v
    return out
