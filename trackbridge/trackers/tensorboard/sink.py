"""``tensorboard:DIR`` -- TensorBoard event files, written fast and without TensorFlow.

Why not a ``SummaryWriter``: tensorboardX's ``add_scalar`` pushes every value through a ``multiprocessing.Queue``
and writes one Event per value (about 10k scalars/s here). This sink writes **one Event per record** carrying all of
that step's values in one ``Summary``, and does the TFRecord framing itself (``uint64 length``, masked CRC32C of
the length, the serialized Event, masked CRC32C of the data), using only the protobuf classes that the
``tensorboard`` package ships (``tensorboard.compat.proto``). See ``benchmarks/bench_tensorboard_sink.py``.

What is written, per run folder ``DIR/<run name or run id>/`` (one new ``events.out.tfevents.*`` file per open):

* numbers: legacy ``simple_value`` scalars (float32: integers above 2**24 and most decimals are not exact;
  bools become 0/1; NaN and infinities are kept);
* :class:`~trackbridge.record.Histogram`: a ``HistogramProto`` (``bucket_limit`` = right edges, ``bucket`` =
  counts, plus min/max/num/sum/sum_squares); raw ``values`` are bucketed into ``bins`` buckets (option, default 30);
* strings: the text plugin (a scalar string tensor with ``plugin_name: "text"``);
* ``None``: nothing (TensorBoard has no "missing" value);
* each record's ``wall_time`` is the Event's wall time (now, when the record has none); ``step`` is the Event's step
  (the previous step when a record has none). Steps need not grow: TensorBoard keeps every event.

Run metadata: at open, one Event at step 0 carries (1) a text summary ``trackbridge/run`` whose string is
``RunInfo.to_json()`` -- the reader restores name, id, project, tags and config from it exactly -- and (2) an
``hparams`` plugin ``session_start_info`` with the config flattened to ``a/b`` keys (numbers, strings and bools),
so that TensorBoard's HParams tab and other readers see the config too. Keeping both inside the event file (rather
than a sidecar) means a copied event file is complete on its own. A resumed open writes them again in its new file;
readers take the last.

Needs the ``tensorboard`` package (imported in :meth:`TensorBoardSink.open`). The framing and CRC32C are in
:mod:`trackbridge.trackers.tensorboard.events`.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import re
import socket
import threading
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...extras import MissingExtra
from ...record import Histogram, Record, RunInfo, dumps
from ...record.values import printable
from ...tracking.appender import Appender
from ...tracking.sink import HISTOGRAM, NONE, NUMBER, TEXT, Capabilities, Sink, SinkError, value_kind
from .events import DERIVED_DESCRIPTION, HPARAMS_TAG, INFO_FILE, RUN_TAG, event_files, frame

if TYPE_CHECKING:       # pragma: no cover
    from ...sync.holdings import Holdings

_FILE_COUNTER = itertools.count()
_UNSAFE_DIR = re.compile(r"[\\/:*?\"<>|\x00-\x1f]")

# ---------------------------------------------------------------------------------------------------------------
# Small helpers shared with the reader.

def flatten_config(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a/b": 1}``; lists and other values become their JSON text."""
    out: dict[str, Any] = {}
    for k, v in config.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flatten_config(v, key + "/"))
        elif v is None or isinstance(v, (bool, int, float, str)):
            out[key] = v
        else:
            try:
                out[key] = json.dumps(v, default=str)
            except (TypeError, ValueError):
                out[key] = str(v)
    return out


MAX_FOLDER_NAME = 120      # characters of a run folder's name (file systems allow 255 bytes; ids are added)


def run_folder_name(run: RunInfo) -> str:
    """The run's folder name: its name with what file systems refuse replaced by ``_``; a name longer than
    ``MAX_FOLDER_NAME`` is cut and ends in ``~`` and 8 hex digits of its hash. The full name is kept in the run
    info (``trackbridge-run.json`` and the ``trackbridge/run`` text), which readers prefer to the folder name."""
    name = run.name or run.run_id or "run"
    safe = _UNSAFE_DIR.sub("_", name).strip(". ") or "run"
    if len(safe) > MAX_FOLDER_NAME or len(safe.encode("utf-8")) > 2 * MAX_FOLDER_NAME:
        digest = hashlib.sha1(name.encode("utf-8", "surrogatepass")).hexdigest()[:8]
        cut = safe[:MAX_FOLDER_NAME - 9]
        while len(cut.encode("utf-8")) > 2 * MAX_FOLDER_NAME - 9:
            cut = cut[:-1]
        safe = f"{cut}~{digest}"
    return safe


def folder_run_id(folder: Path) -> str | None:
    """The trackbridge run id a run folder holds (from ``trackbridge-run.json``, else the ``trackbridge/run`` text
    of its event files), or ``None`` when it holds none that is known."""
    info = folder / INFO_FILE
    if info.is_file():
        try:
            rid = json.loads(info.read_text(encoding="utf-8")).get("run_id")
            return str(rid) if rid is not None else None
        except (OSError, ValueError, AttributeError):
            pass
    if not event_files(folder):
        return None
    from .source import TensorBoardRunReader
    try:
        rid = TensorBoardRunReader(folder, name="\0", verify=False).info.run_id
    except Exception:
        return None
    return None if rid in (None, "\0") else str(rid)


def pick_run_folder(root: Path, run: RunInfo) -> Path:
    """The folder for ``run`` under ``root``: the one that already holds this run id (resume, replay), else the
    first of ``NAME``, ``NAME-2``, ``NAME-3`` ... that holds no event files. A new run never writes into another
    run's folder, even when both have the same name."""
    base = run_folder_name(run)
    free: Path | None = None
    for i in range(1, 10_000):
        folder = root / (base if i == 1 else f"{base}-{i}")
        if not folder.exists() or not event_files(folder):
            if free is None:
                free = folder
            if not folder.exists():
                break
            continue
        if run.run_id is not None and folder_run_id(folder) == str(run.run_id):
            return folder
    if free is None:
        raise SinkError(f"tensorboard sink: no free folder for run {base!r} under {root}")
    return free


def _as_float(v: float) -> float | None:
    try:
        return float(v)
    except OverflowError:
        return None


def _bucket(values: list[float], bins: int) -> tuple[list[float], list[float]]:
    """Right edges and counts of ``bins`` equal-width buckets over the finite values (NaN/inf are not counted)."""
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return [], []
    lo, hi = min(finite), max(finite)
    if lo == hi:
        return [hi], [float(len(finite))]
    width = (hi - lo) / bins
    counts = [0.0] * bins
    for v in finite:
        i = int((v - lo) / width)
        counts[min(i, bins - 1)] += 1.0
    limits = [lo + width * (i + 1) for i in range(bins - 1)] + [hi]
    return limits, counts


def histogram_parts(h: Histogram, bins: int = 30) -> dict[str, Any]:
    """The fields of a HistogramProto for ``h`` (bucketing raw values when no limits/counts are given)."""
    if h.limits is not None and h.counts is not None:
        limits, counts = list(h.limits), list(h.counts)
    else:
        limits, counts = _bucket(list(h.values or []), bins)
    num = h.num if h.num is not None else float(sum(counts))
    mn = h.min if h.min is not None else (limits[0] if limits else 0.0)
    mx = h.max if h.max is not None else (limits[-1] if limits else 0.0)
    return dict(min=float(mn), max=float(mx), num=float(num), sum=float(h.sum or 0.0),
                sum_squares=float(h.sum_squares or 0.0), bucket_limit=limits, bucket=counts)


class TensorBoardSink(Sink):
    """Writes event files to ``DIR/<run name>/``. Options: ``bins=N`` (histogram buckets for raw values)."""

    kind = "tensorboard"
    option_names = ("bins",)
    capabilities = Capabilities(histograms=True, text=True, nan=True, wall_time=True,
                                flat_config=("/", "TensorBoard's hparams"), resolution=(
        "numbers as float32 (about 7 significant digits)", "raw histogram samples as 30 buckets (?bins=N)"))

    def __init__(self, location: str = "", **options: str) -> None:
        super().__init__(location, **options)
        if not location:
            raise SinkError("tensorboard sink: no folder given (expected tensorboard:DIR)")
        try:
            self.bins = max(1, int(options.get("bins", 30)))
        except ValueError:
            raise SinkError(f"tensorboard sink: option bins={options.get('bins')!r} is not an integer") from None
        self.folder: Path | None = None
        self.path: Path | None = None
        self._fh: Any = None
        self._pb: Any = None
        self._next_step = 0              # a record without a step is written at the step of the one before it
        self._max_step: int | None = None
        self._text_meta = None

    # -- open ------------------------------------------------------------------------------------------------
    def open(self, run: RunInfo, *, resume: bool = False) -> None:
        try:
            from tensorboard.compat.proto import event_pb2, summary_pb2
        except ImportError:
            raise MissingExtra("the tensorboard sink", "tensorboard", "tensorboard") from None
        self._pb = (event_pb2, summary_pb2)
        if run.run_id is None:
            run.run_id = uuid.uuid4().hex[:12]
        self.run = run
        root = Path(self.location).expanduser()
        try:
            root.mkdir(parents=True, exist_ok=True)
            self.folder = pick_run_folder(root, run)
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise SinkError(f"tensorboard sink: cannot create a run folder under {root}: {exc}") from None
        existing = event_files(self.folder)
        if existing and not resume:
            raise SinkError(f"tensorboard sink: {self.folder} already holds run {run.run_id!r}; "
                            f"open with resume=True to continue that run")
        self._max_step = self._scan_last_step() if existing else None
        self._next_step = self._max_step or 0
        self._pending_open = bool(existing)      # resuming: the new event file is made at the first write only
        if not existing:
            self._create_file()
            self._write_final_info()      # the folder says whose it is from the start (and again at close)

    def _create_file(self) -> None:
        assert self.run is not None and self.folder is not None      # set by open()
        self._pending_open = False
        now = time.time()
        # the counter zero-padded: TensorBoard reads a folder's event files in name order, and two files of one
        # second and process numbered 9 and 10 were read 10 first (a resumed run's steps out of order)
        name = (f"events.out.tfevents.{int(now):010d}.{socket.gethostname()}.{os.getpid()}."
                f"{next(_FILE_COUNTER):06d}.trackbridge")
        self.path = self.folder / name
        self._write_header(now)
        self._fh = Appender(self.path)    # a batch that fails part-way (a full disk) is taken back whole

    def _write_header(self, now: float) -> None:
        event_pb2, summary_pb2 = self._pb
        run = self.run
        assert run is not None and self.folder is not None
        meta = summary_pb2.SummaryMetadata()
        meta.plugin_data.plugin_name = "text"
        self._text_meta = meta
        first = event_pb2.Event(wall_time=now, step=0, file_version="brain.Event:2")
        info = event_pb2.Event(wall_time=now, step=0)
        info.summary.value.append(self._text_value(RUN_TAG, dumps(run.to_json())))
        hp = self._hparams_value(run.config)
        if hp is not None:
            info.summary.value.append(hp)
        # the file appears with its whole header or not at all: an attempt killed while writing it leaves a
        # temporary file (no "tfevents" in its name: no reader takes it), never an event file without the run id,
        # which would make the next attempt take the folder for someone else's and open NAME-2. That next attempt
        # removes what a killed one left: one writer holds a run's folder at a time (the logger's and migrate's
        # run claims), so another header being written here is a dead attempt's
        for stale in self.folder.glob(".trackbridge-new-*.tmp"):
            stale.unlink(missing_ok=True)
        tmp = self.folder / f".trackbridge-new-{os.getpid()}-{threading.get_ident()}.tmp"
        try:
            with open(tmp, "wb") as fh:
                fh.write(frame(first.SerializeToString()) + frame(info.SerializeToString()))
            assert self.path is not None
            os.replace(tmp, self.path)
        except BaseException:       # a full disk: no half-made file left behind
            tmp.unlink(missing_ok=True)
            raise

    def _text_value(self, tag: str, text: str) -> Any:
        _, summary_pb2 = self._pb
        v = summary_pb2.Summary.Value(tag=tag)
        v.metadata.CopyFrom(self._text_meta)
        v.tensor.dtype = 7  # DT_STRING
        v.tensor.string_val.append(text.encode("utf-8"))
        return v

    def _hparams_value(self, config: dict[str, Any]) -> Any:
        """The hparams plugin's ``session_start_info`` for ``config`` (flattened), or None if it has nothing."""
        flat = {k: v for k, v in flatten_config(config or {}).items() if v is not None}
        if not flat:
            return None
        try:
            from tensorboard.plugins.hparams import plugin_data_pb2
        except ImportError:  # pragma: no cover - shipped with tensorboard
            return None
        _, summary_pb2 = self._pb
        data = plugin_data_pb2.HParamsPluginData(version=0)
        start = data.session_start_info
        for k, v in flat.items():
            if isinstance(v, bool):
                start.hparams[k].bool_value = v
            elif isinstance(v, (int, float)) and _as_float(v) is not None:
                start.hparams[k].number_value = float(v)
            elif isinstance(v, int):            # beyond a float (sanitize_config already made such a config text)
                start.hparams[k].string_value = f"<an integer of {v.bit_length()} bits>"
            else:
                start.hparams[k].string_value = str(v)
        start.start_time_secs = time.time()
        v = summary_pb2.Summary.Value(tag=HPARAMS_TAG)
        v.metadata.plugin_data.plugin_name = "hparams"
        v.metadata.plugin_data.content = data.SerializeToString()
        return v

    # -- write -----------------------------------------------------------------------------------------------
    def write(self, records: list[Record]) -> None:
        if self._fh is None and getattr(self, "_pending_open", False):
            self._create_file()
        if self._fh is None:
            raise SinkError(f"tensorboard sink {self.location}: write() before open() or after close()")
        event_pb2, summary_pb2 = self._pb
        Event = event_pb2.Event
        out = []
        before = (self._next_step, self._max_step)
        for rec, step, wall in self.points(records, repeat=True, why=self._step_refused):
            try:
                out.append(frame(self._event(Event, summary_pb2, rec, step, wall).SerializeToString()))
            except Exception:    # a value TensorBoard cannot take: find it, write the rest
                out.append(self._careful_event(Event, summary_pb2, rec, step, wall))
            if self._max_step is None or step > self._max_step:
                self._max_step = step
        try:
            self._fh.append(b"".join(out))
        except OSError:         # nothing of the batch is in the file (taken back): the steps are as before it
            self._next_step, self._max_step = before
            raise
        self.note_axes(records)          # saved with the run info at close (trackbridge-run.json)

    def _step_refused(self, step: int) -> str:
        """Why a record at ``step`` (outside int64, an Event's step) is left out, in protobuf's words."""
        try:
            self._pb[0].Event(step=step).SerializeToString()
        except Exception as exc:  # noqa: BLE001 - what protobuf says is the reason
            return f"TensorBoard cannot store step {step!r} ({type(exc).__name__}: {exc})"
        return f"TensorBoard cannot store step {step!r}"

    def _event(self, Event: Any, summary_pb2: Any, rec: Record, step: int, wall: float, only: Any = None) -> Any:
        """One Event holding every value of ``rec`` (or of the keys in ``only``)."""
        ev = Event(wall_time=wall, step=step)
        values = ev.summary.value
        add = values.add
        marks = self.note_derived([rec]) if rec.derived and only is None else ()
        for tag, v in rec.metrics.items() if only is None else only:
            t = type(v)
            if t is float or t is int:              # the common case, cheaply
                if tag in marks:
                    # first value of a derived tag: TensorBoard keeps a tag's first metadata, shown as its description
                    val = add(tag=tag, simple_value=v)
                    val.metadata.summary_description = DERIVED_DESCRIPTION
                else:
                    add(tag=tag, simple_value=v)
                continue
            kind = value_kind(v)
            if kind is NUMBER:                      # bool (0 / 1), int and float subclasses
                add(tag=tag, simple_value=float(v))
            elif kind is NONE:
                continue
            elif kind is TEXT:
                values.append(self._text_value(tag, v))
            elif kind is HISTOGRAM:
                add(tag=tag, histo=summary_pb2.HistogramProto(**histogram_parts(v, self.bins)))
            else:
                raise SinkError(f"tensorboard sink: metric {tag!r} at step {rec.step}: "
                                f"cannot write a {type(v).__name__}")
        return ev

    def _careful_event(self, Event: Any, summary_pb2: Any, rec: Record, step: int, wall: float) -> bytes:
        """The framed Event of ``rec`` without the values TensorBoard refuses (each noted with :meth:`reject`)."""
        good = []
        for tag, v in rec.metrics.items():
            try:
                self._event(Event, summary_pb2, rec, step, wall, only=[(tag, v)]).SerializeToString()
            except Exception as exc:
                self.reject_value(tag, step, f"{type(exc).__name__}: {printable(str(exc))[:200]}")
                continue
            good.append((tag, v))
        sub = Record(step=rec.step, wall_time=rec.wall_time, metrics=dict(good),
                     derived=[d for d in rec.derived if any(d == t for t, _ in good)], axis=rec.axis)
        return frame(self._event(Event, summary_pb2, sub, step, wall).SerializeToString())

    def close(self) -> None:
        if self._fh is not None:
            try:
                self._fh.close()
            finally:
                self._fh = None
            self._write_final_info()
        elif getattr(self, "_pending_open", False):      # resumed, nothing new: only the run info may have grown
            self._pending_open = False
            self._write_final_info()

    def _write_final_info(self) -> None:
        """The run info as it stands at the end (the fidelity of the translations seen, derived metrics, sanitized
        names) in ``trackbridge-run.json`` beside the event files; the reader prefers it to the ``trackbridge/run``
        text written when the run opened (which keeps a copied event file self-describing)."""
        if self.run is None or self.folder is None:
            return
        tmp = self.folder / (INFO_FILE + ".tmp")
        tmp.write_text(dumps(self.run.to_json()), encoding="utf-8")
        os.replace(tmp, self.folder / INFO_FILE)

    # -- resume ----------------------------------------------------------------------------------------------
    def last_step(self) -> int | None:
        return self._max_step

    def held(self, since: int | None = None) -> Holdings | None:
        """The points of every event file in the run folder, read back with the TensorBoard reader."""
        from ...sync.holdings import Holdings
        from .source import TensorBoardRunReader
        if self.folder is None:
            return None
        if not event_files(self.folder):
            return Holdings()
        reader = TensorBoardRunReader(self.folder, name=self.folder.name, verify=False)
        return Holdings.from_records(r for r in reader.records() if since is None or (r.step or 0) >= since)

    def _scan_last_step(self) -> int | None:
        """Highest step of any metric event already in the run folder (read with the TensorBoard reader)."""
        from .source import TensorBoardRunReader

        assert self.folder is not None
        reader = TensorBoardRunReader(self.folder, name=self.folder.name, verify=False)
        best = None
        for rec in reader.records():
            if rec.step is not None and (best is None or rec.step > best):
                best = rec.step
        return best

    def describe(self) -> str:
        return f"tensorboard:{self.folder or self.location}"

