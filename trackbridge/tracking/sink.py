"""The one small interface every tracker sink implements: open / write a batch / close.

A sink receives :class:`~trackbridge.record.Record` batches whose metric names are already in the naming scheme the
user asked for (canonical by default). It is responsible for what its tracker cannot take: sanitizing names
reversibly (recording the mapping with :meth:`Sink.record_sanitized`), turning histograms into summary statistics
where the tracker holds none, and handling non-monotonic steps. Sinks are written to from one worker thread each
(see :mod:`trackbridge.logger`), so an implementation need not be thread-safe.

The loop every tracker's ``write`` runs is here once: :meth:`Sink.points` resolves each record's step (its own, or
the sink's next automatic one), leaves out a record whose step the tracker cannot hold (said with :meth:`Sink.reject`)
and defaults the wall time; :func:`value_kind` tells a record's values apart (None, numbers, histograms, text, what no
tracker holds), and :meth:`Sink.reject_value` says which one was left out, and why. A sink keeps only what is its
tracker's own (its step range, its fast paths, how it stores each kind). ``tests/trackers/test_sink_conformance.py``
holds every registered sink to the same contract.
"""
from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Union

from ..errors import TrackBridgeError
from ..record import Histogram, Record, RunInfo
from ..record.values import printable

if TYPE_CHECKING:
    from ..sync.holdings import Holdings


@dataclass(frozen=True)
class Capabilities:
    """What a tracker can store natively (a sink converts or leaves out the rest)."""

    histograms: bool = False     # can store a distribution natively
    text: bool = False           # can store strings
    nan: bool = True             # can store NaN / +-inf
    wall_time: bool = True       # keeps the wall time we give it
    #: what the tracker keeps less exactly than a record holds it, one phrase each ("wall times to the millisecond",
    #: "values as float32"); ``migrate`` names them in its summary, so no loss goes unsaid
    resolution: tuple[str, ...] = ()
    #: how the tracker stores a nested config when it flattens it, ``(separator, what it calls the result)``: keys
    #: that flatten to one name keep only one value there, which the logger says when this tracker is in the run
    flat_config: tuple[str, str] | None = None


class Unreachable(TrackBridgeError, OSError):
    """Nothing answers at ``host``:``port`` (``reason`` says what the connect attempt got)."""

    def __init__(self, host: str | None, port: int, reason: str) -> None:
        super().__init__(f"{host}:{port} is not reachable ({reason})")
        self.host, self.port, self.reason = host, port, reason


def check_reachable(url: str, timeout: float = 2.0) -> None:
    """A quick TCP connect to the host and port of an ``http(s)://`` URL; raises :class:`Unreachable` when nothing
    answers there, ValueError when the URL names no host."""
    import socket
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    host, port = parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)
    if not host:
        raise ValueError(f"no host in {url!r}")
    try:
        with socket.create_connection((host, port), timeout=timeout):
            pass
    except OSError as exc:
        raise Unreachable(host, port, str(exc)) from None


class SinkError(TrackBridgeError, RuntimeError):
    """A sink could not do what was asked; the message names the sink."""


#: the steps a sink writes: trackers keep steps in signed 64-bit integers (a record outside is left out, see
#: :meth:`Sink.reject`; the logger refuses steps outside 0 .. 2**53 - 1 already at ``log()``)
STEP_MIN, STEP_LIMIT = -(2 ** 63), 2 ** 63 - 1


def step_ok(step: int | None) -> bool:
    """Whether a sink can write a record at ``step`` (None, or inside :data:`STEP_MIN` .. :data:`STEP_LIMIT`)."""
    return step is None or STEP_MIN <= step <= STEP_LIMIT


#: the kinds of value a record holds, as :func:`value_kind` tells them (compare with ``is``)
NONE, NUMBER, HISTOGRAM, TEXT, OTHER = "none", "number", "histogram", "text", "other"
#: the kind of each exact type a record's values have (bool is a number: 0 / 1); :func:`value_kind` for the rest
KIND_OF_TYPE: dict[type, str] = {float: NUMBER, int: NUMBER, bool: NUMBER, str: TEXT, type(None): NONE,
                                 Histogram: HISTOGRAM}
_kind_of_type = KIND_OF_TYPE.get


def value_kind(value: Any) -> str:
    """What a sink does with ``value`` depends on its kind: :data:`NONE` (nothing is written: no tracker has a
    "missing" value), :data:`NUMBER` (int, float and bool, subclasses too), :data:`HISTOGRAM`, :data:`TEXT` (a str),
    or :data:`OTHER` (what the tracker cannot hold: see :func:`not_kept`). One dict look-up for the usual types."""
    kind = _kind_of_type(type(value))
    if kind is not None:
        return kind
    if isinstance(value, Histogram):
        return HISTOGRAM
    if isinstance(value, str):
        return TEXT
    if isinstance(value, (int, float)):
        return NUMBER
    return OTHER


def not_kept(value: Any) -> str:
    """The reason a sink gives for a value of a kind it does not store (:data:`OTHER`)."""
    return f"{type(value).__name__} values are not kept"


#: why a record is left out for its step: a text, or a function of the step giving it
StepWhy = Union[str, Callable[[int], str]]


class Sink(ABC):
    """Base class of every tracker sink. Subclasses set ``kind`` and ``capabilities``."""

    kind: str = "sink"
    capabilities = Capabilities()
    #: the locator options (``?name=value``) this sink reads; any other is refused, naming these (None: not declared,
    #: anything is taken)
    option_names: tuple[str, ...] | None = None

    #: packages the sink needs (checked at ``init``, before training starts) and the extra that installs them; a sink
    #: made from a locator gets them from its registration (:func:`trackbridge.trackers.register_tracker`)
    requires: tuple[str, ...] = ()
    extra: str = ""
    #: set by the logger with init(doctor=True): a sink whose tracker has alerts of its own raises one per finding
    alerts: bool = False
    #: how the run ended, set before ``close()``: "finished"; "failed" when training raised or exited with a
    #: non-zero code; "killed" when it was interrupted, terminated or killed (trackers that keep a run status record
    #: it: MLflow FAILED / KILLED, wandb exit code 1 / :attr:`exit_code`; the others store it with the run info)
    outcome: str = "finished"
    #: the exit code of a "killed" run where it is known (130 Ctrl-C, 143 SIGTERM; 137 when the process vanished)
    exit_code: int | None = None
    #: set by a sink that found its tracker's store gone (a run folder deleted while it was written): everything
    #: it held is lost, so the logger gives it every record of the spool again (less what it holds) when it recovers
    store_lost: bool = False
    #: environment variables this tracker's client sets for its own process only (the address of a background
    #: service it started): not passed on to the logger's writer process, which must start its own
    process_env: tuple[str, ...] = ()

    def __init__(self, location: str = "", **options: str) -> None:
        self.location = location
        self.options = dict(options)
        self.run: RunInfo | None = None
        # requests the tracker answered: a sink that writes a batch in several requests counts them, so that a slow
        # tracker making progress is told from a hung one (finish() waits while this or the records written move)
        self.progress = 0

    # -- the interface -------------------------------------------------------------------------------------
    @abstractmethod
    def open(self, run: RunInfo, *, resume: bool = False) -> None:
        """Create (or, with ``resume``, reopen) the run in the tracker, writing ``run.config`` and tags."""

    @abstractmethod
    def write(self, records: list[Record]) -> None:
        """Write a batch of records. Must raise on failure (the logger retries), never swallow errors."""

    @abstractmethod
    def close(self) -> None:
        """Flush and close. Safe to call twice."""

    # -- optional ------------------------------------------------------------------------------------------
    def last_step(self) -> int | None:
        """The highest step this tracker already holds for the open run (for resume/replay without duplicates)."""
        return None

    def held(self, since: int | None = None) -> "Holdings | None":
        """What the tracker really holds of the open run, per key and step (steps ``>= since`` only), read back from
        the tracker under the names this sink was given, or ``None`` when the sink cannot tell (callers then go by
        :meth:`last_step`, right only when whole records land or not at all). See :mod:`trackbridge.sync.holdings`."""
        return None

    def note_derived(self, records: list[Record]) -> list[str]:
        """Remember which metric names in ``records`` were derived rather than logged; returns the names seen for the
        first time. They are kept in ``run.extra["derived"]``, which every sink stores with its run metadata, so that
        a derived value is marked as such in each tracker (sinks re-save that metadata when this returns names)."""
        seen = self.__dict__.setdefault("_derived_seen", set())
        new = sorted({n for r in records for n in r.derived} - seen)
        if new:
            seen.update(new)
            if self.run is not None:
                self.run.extra = {**(self.run.extra or {}),
                                  "derived": sorted(set((self.run.extra or {}).get("derived") or ()) | seen)}
        return new

    def note_axes(self, records: list[Record]) -> bool:
        """Remember the x axis of each metric name in ``records`` that is on an axis of its own (``Record.axis``:
        slime's ``train/step``, ``rollout/step``); True when a name was seen on an axis for the first time. They are
        kept in ``run.extra["axes"]`` (name -> axis), which every sink stores with its run metadata, so that a reader
        of a store that keeps points rather than rows gives each series its own axis again
        (:func:`~trackbridge.tracking.source.mark_derived`); sinks re-save that metadata when this returns True."""
        seen: dict[str, str] = self.__dict__.setdefault("_axes_seen", {})
        new = False
        for r in records:
            axis = r.axis
            if axis is None:
                continue
            for k in r.metrics:
                if seen.get(k) != axis:
                    seen[k] = axis
                    new = True
        if new and self.run is not None:
            self.run.extra = {**(self.run.extra or {}), "axes": {**((self.run.extra or {}).get("axes") or {}), **seen}}
        return new

    # -- the per-record loop every sink shares --------------------------------------------------------------
    #: the step a record without one is written at; :meth:`points` moves it past every record it gives (a sink sets
    #: it at open from what its tracker holds: the last step + 1)
    _next_step: int = 0

    def points(self, records: Iterable[Record], *, lo: int = STEP_MIN, hi: int = STEP_LIMIT,
               why: StepWhy = "the tracker keeps steps in signed 64-bit integers; the record is left out",
               repeat: bool = False) -> Iterator[tuple[Record, int, float]]:
        """``(record, step, wall_time)`` for each record of ``records`` the tracker can take, in order: ``step`` is
        the record's own, or for a record without one the sink's next automatic step (:attr:`_next_step`);
        ``wall_time`` the record's, or now. A step outside ``lo`` .. ``hi`` leaves the record out, noted as
        ``reject("step", step, why)`` (``why`` a text or a function of the step). After each record given the next
        automatic step is past every step so far (``repeat=True``: the step of that record, as TensorBoard, which
        writes a record without a step at the step of the one before it). One generator per batch: walk each
        record's values in the loop body (:func:`value_kind` tells them apart)."""
        for rec in records:
            step = int(rec.step) if rec.step is not None else self._next_step
            if not lo <= step <= hi:
                self.reject("step", step, why if isinstance(why, str) else why(step))
                continue
            if repeat:
                self._next_step = step
            elif step >= self._next_step:
                self._next_step = step + 1
            yield rec, step, rec.wall_time if rec.wall_time is not None else time.time()

    def reject_value(self, name: str, step: int | None, why: str) -> None:
        """:meth:`reject` for the value of metric ``name`` (the name made printable: a lone surrogate escaped)."""
        self.reject(printable(name), step, why)

    def reject(self, key: str, step: int | None, why: str) -> None:
        """Note that this sink left ``key`` out of the record at ``step`` because its tracker cannot take the value
        (``key`` is ``"step"`` when the whole record was left out for its step). The other keys are written; the
        logger reports each key once per sink (see :meth:`take_rejected`). Never raises."""
        self.__dict__.setdefault("_rejected", []).append((key, step, why))

    def renamed(self, key: str, stored: str, why: str) -> None:
        """Note that this sink stores ``key`` as ``stored`` because its tracker's schema refuses the name as it is
        (the pair is also recorded with :meth:`record_sanitized`, so readers give the name back). The logger says so
        once per key. Never raises."""
        self.__dict__.setdefault("_renamed", []).append((key, stored, why))

    def take_renamed(self) -> list[tuple[str, str, str]]:
        """The ``(key, stored, why)`` noted by :meth:`renamed` since the last call."""
        out = self.__dict__.get("_renamed") or []
        self.__dict__["_renamed"] = []
        return out

    def take_rejected(self) -> list[tuple[str, int | None, str]]:
        """The ``(key, step, why)`` noted by :meth:`reject` since the last call."""
        out = self.__dict__.get("_rejected") or []
        self.__dict__["_rejected"] = []
        return out

    def written_of(self, records: list[Record]) -> int:
        """How many leading records of ``records``, whose :meth:`write` just raised, are in the tracker already.
        0 for a sink whose write is all-or-nothing or idempotent; a sink that writes record by record and cannot
        take a row back (wandb) says how far it got, so that the logger does not write those rows twice."""
        return 0

    def record_sanitized(self, mapping: dict[str, str]) -> None:
        """Remember stored-name -> original-name pairs so that readers can restore the originals."""
        if self.run is not None:
            self.run.sanitized.update(mapping)

    @classmethod
    def check_location(cls, location: str) -> None:
        """Raise :class:`SinkError` when ``location`` cannot take this tracker's runs, before anything is written there
        (``migrate`` asks before reading the source). Default: nothing to check."""

    @classmethod
    def local_path(cls, location: str) -> "Path | None":
        """The file or folder on this machine that ``location`` designates, or None when it is not one (a server)."""
        if "://" in location:
            return None
        return Path(location).expanduser()

    def describe(self) -> str:
        """A short human-readable name (may add what the sink resolved, such as a run folder)."""
        return f"{self.kind}:{self.location}"

    def locator(self) -> str:
        """The locator this sink was made from, options included: what `trackbridge replay --to` needs."""
        opts = "&".join(f"{k}={v}" for k, v in self.options.items())
        return f"{self.kind}:{self.location}" + (f"?{opts}" if opts else "")

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.describe()}>"


class PointStoreSink(Sink):
    """A sink whose tracker keeps points (key, step) it can list back, as the offline formats some trackers write
    do (a JSON lines file of events, a run file of records, Parquet parts): it implements :meth:`stored_points` and
    gets :meth:`last_step` and :meth:`held` from it."""

    @abstractmethod
    def stored_points(self, since: int | None) -> list[tuple[str, int]] | None:
        """``(key, step)`` of every point of the open run the tracker holds (steps ``>= since``), under the names
        this sink was given; None when no run is open."""

    def last_step(self) -> int | None:
        points = self.stored_points(None)
        return max((s for _k, s in points), default=None) if points else None

    def held(self, since: int | None = None) -> "Holdings | None":
        from ..sync.holdings import Holdings
        points = self.stored_points(since)
        return None if points is None else Holdings.from_pairs(points)
