"""SwanLab sink: ``swanlab:LOGDIR[?project=NAME&workspace=NAME]`` -- an offline run, as ``swanlab.init(mode="offline",
logdir=LOGDIR)`` leaves it, ready for ``swanlab sync``.

Why not ``swanlab.log``: it takes no timestamp (every point is stamped when it is logged), so a migrated run would
lose its wall times. This sink writes SwanLab's offline format itself (:mod:`.store`), with swanlab's own protobuf
classes, behind a version guard (swanlab 0.10.x, store version 2; anything else is refused at ``open`` with one
line): a ``start`` record, the config (``files/config.yaml`` and its ``save`` record), one ``column`` record per key
before its first point, one ``scalar`` record per value (the record's step; its wall time to the nanosecond), and a
``finish`` record (``FINISHED``, ``CRASHED`` for a failed run, ``ABORTED`` for a killed one).

What SwanLab cannot take, said per key (:meth:`Sink.reject`; the logger warns, ``migrate`` names it and exits 1):

* **a second value of a key at a step it has reached**: SwanLab keeps one value per key and step, steps increasing
  per key, and its SDK drops the rest without a word (measured with swanlab 0.10.3: a re-logged older or equal step is
  gone). This sink leaves such a value out and says so; what the run holds per key and step (:meth:`held`) makes a
  re-run migration or a resumed run write only what is missing;
* text (SwanLab keeps text as media files) and steps below 0;
* histograms become summary statistics ``<name>/mean``, ``/std``, ``/min``, ``/max``, ``/count`` (SwanLab has no
  histogram chart), listed in the run info so readers know them.

Names SwanLab would change (a leading or trailing ``.``, ``/`` or space, control characters, more than 512
characters) are escaped reversibly (:mod:`trackbridge.tracking.names`); the run info (name, tags, config, name map,
derived marks) is kept as JSON in the config entry ``_trackbridge``.
"""
from __future__ import annotations

import json
import os
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from ...record import Record, RunInfo
from ...record.values import printable
from ...tracking.names import NameCache, escape, shorten
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
from . import store

if TYPE_CHECKING:       # pragma: no cover
    pass

KEY_MAX = 512                   # swanlab's METRIC_KEY_MAX_LENGTH
_STRIPPED = " \t\n\r./"         # what swanlab strips from both ends of a key (run/fmt.py validate_key)
STEP_LIMIT = 2 ** 63 - 1
SUMMARY = ("mean", "std", "min", "max", "count")


def _code(ch: str) -> str:
    return f"_x{ord(ch):02X}_"


def swanlab_key(name: str) -> str:
    """``name`` as SwanLab keeps it unchanged: control characters and the characters SwanLab strips from the ends
    escaped reversibly, and cut to 512 characters (with a hash; the map is recorded)."""
    body = escape(name, lambda ch: ch >= " " and ch != "\x7f")
    lead = 0
    while lead < len(body) and body[lead] in _STRIPPED:
        lead += 1
    trail = len(body)
    while trail > lead and body[trail - 1] in _STRIPPED:
        trail -= 1
    out = "".join(map(_code, body[:lead])) + body[lead:trail] + "".join(map(_code, body[trail:]))
    return shorten(out, KEY_MAX, name)


def _timestamp(seconds: float) -> Any:
    from google.protobuf.timestamp_pb2 import Timestamp
    ts = Timestamp()
    ns = round(seconds * 1e9)
    ts.seconds, ts.nanos = divmod(ns, 1_000_000_000)
    return ts


class SwanlabSink(PointStoreSink):
    """Writes one SwanLab offline run (see the module docstring)."""

    kind = "swanlab"
    option_names = ("project", "workspace")
    capabilities = Capabilities(histograms=False, text=False, nan=True, wall_time=True, resolution=(
        "one value per key and step, steps increasing per key (the others are left out and said)",
        "histograms as summary statistics (<name>/mean, /std, /min, /max, /count)"))

    def __init__(self, location: str = "", **options: str) -> None:
        super().__init__(location, **options)
        if not location:
            raise SinkError("swanlab sink: no folder given (expected swanlab:LOGDIR)")
        self.logdir = Path(location).expanduser()
        self.path: Path | None = None
        self.run_id = ""
        self._log: store.LogWriter | None = None
        self._pb: Any = None
        self._names = NameCache(swanlab_key)
        self._last: dict[str, int] = {}      # stored key -> the highest step SwanLab holds for it
        self._num = 0
        self._hist: set[str] = set()
        self._next_step = 0
        self._stale = False                  # the config is to be saved again (a write that saved it failed)

    # -- open --------------------------------------------------------------------------------------------
    @classmethod
    def check_location(cls, location: str) -> None:
        """Refuse a swanlab release whose format trackbridge does not write, before a migration reads anything."""
        cls._guard(location)

    @staticmethod
    def _guard(location: str) -> Any:
        try:
            store.check_version()
            return store.messages()
        except ImportError:
            raise SinkError("swanlab sink needs swanlab: pip install 'trackbridge[swanlab]'") from None
        except RuntimeError as exc:
            raise SinkError(f"swanlab:{location}: {exc}") from None

    def open(self, run: RunInfo, *, resume: bool = False) -> None:
        self._pb = self._guard(self.location)
        self.run = run
        run_id = str(run.run_id) if run.run_id else uuid.uuid4().hex[:8]
        try:
            self.logdir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise SinkError(f"swanlab:{self.location}: cannot create the folder: {exc}") from None
        found = store.find_run(self.logdir, run_id)
        if found is not None and not resume:
            run_id, found = f"{run_id}-{uuid.uuid4().hex[:6]}", None      # a new run that reuses an id
        self.run_id = run_id
        try:
            if found is not None:
                self.path = found
                self._load(found)
                self._log = store.LogWriter(found, create=False)
            else:
                folder = self.logdir / f"run-{datetime.now():%Y%m%d_%H%M%S}-{store.safe_id(run_id)}"
                (folder / "files").mkdir(parents=True, exist_ok=True)
                (folder / "media").mkdir(exist_ok=True)
                self.path = folder / f"run-{store.safe_id(run_id)}.swanlab"
                self._log = store.LogWriter(self.path, create=True)
                self._start()
            self._save_config()
            self._log.flush()
        except (OSError, SinkError) as exc:
            if self._log is not None:           # what this open framed is taken back; the file stays whole
                self._log.rollback()
                self._log.fh.close()
                self._log = None
            if isinstance(exc, SinkError):
                raise
            raise SinkError(f"swanlab:{self.location}: cannot write {self.path}: {exc}") from None

    def _load(self, path: Path) -> None:
        """What an earlier session of the run holds: record numbers, each key's last step, the name map."""
        record_pb2 = self._pb[0]
        for _off, payload, _end in store.read_payloads(path):
            rec = record_pb2.Record()
            try:
                rec.ParseFromString(payload)
            except Exception:  # noqa: BLE001 - a record this swanlab cannot parse holds nothing we wrote
                continue
            self._num = max(self._num, rec.num)
            if rec.WhichOneof("record_type") == "scalar":
                key, step = rec.scalar.key, rec.scalar.step
                self._last[key] = max(step, self._last.get(key, step))
                self._next_step = max(self._next_step, step + 1)
        ours = _read_config(path).get(store.CONFIG_KEY)
        if isinstance(ours, dict):
            for stored, original in (ours.get("sanitized") or {}).items():
                self._names._cache[original] = stored
                self._names.changed[stored] = original
            self._hist.update((ours.get("extra") or {}).get("histogram_summaries") or ())

    def _record(self, num: int, **body: Any) -> None:
        record_pb2 = self._pb[0]
        assert self._log is not None
        rec = record_pb2.Record(num=num, timestamp=_timestamp(time.time()), **body)
        self._log.write(rec.SerializeToString())

    def _start(self) -> None:
        run_pb2 = self._pb[1]
        assert self.run is not None
        tags = [f"{k}={v}" if v else k for k, v in sorted((self.run.tags or {}).items())]
        start = run_pb2.StartRecord(project=self.options.get("project") or self.run.project or "trackbridge",
                                    workspace=self.options.get("workspace") or "", name=self.run.name or self.run_id,
                                    id=self.run_id, tags=tags, group=(self.run.tags or {}).get("group", ""),
                                    started_at=_timestamp(time.time()))
        self._record(store.START_NUM, start=start)

    def _save_config(self) -> None:
        """``files/config.yaml`` in SwanLab's form, the run info under ``_trackbridge``, and its ``save`` record."""
        import yaml
        save_pb2 = self._pb[4]
        assert self.run is not None and self.path is not None
        info = self.run.to_json()
        info["sanitized"] = dict(self._names.changed)
        info["extra"] = {**(info.get("extra") or {}), "histogram_summaries": sorted(self._hist)}
        config = {**(self.run.config or {}), store.CONFIG_KEY: json.loads(json.dumps(info, default=str))}
        doc = {str(k): {"desc": "", "sort": i, "value": v} for i, (k, v) in enumerate(config.items())}
        target = self.path.parent / "files" / "config.yaml"
        tmp = target.with_name(target.name + ".tmp")
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(yaml.safe_dump(json.loads(json.dumps(doc, default=str)), allow_unicode=True,
                                          sort_keys=False), encoding="utf-8")
            os.replace(tmp, target)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise SinkError(f"swanlab:{self.location}: cannot write {target}: {exc}") from None
        self._record(store.CONFIG_NUM, save=save_pb2.SaveRecord(name="config", source_path=str(target),
                                                                type=save_pb2.SaveType.SAVE_TYPE_CONFIG))

    # -- write -------------------------------------------------------------------------------------------
    def write(self, records: list[Record]) -> None:
        if self._log is None:
            raise SinkError(f"swanlab:{self.location}: write() before open() or after close()")
        # a write that fails is taken back whole (the file cut back to its last complete record, what the sink knows
        # of the run as before), so the logger's retry writes the batch once and SwanLab's one-value-per-step rule
        # never refuses a value only a failed attempt had
        state = (dict(self._last), self._num, self._next_step, set(self._hist))
        try:
            self._write(records)
        except BaseException as exc:
            self._last, self._num, self._next_step, self._hist = state
            self._log.rollback()
            self._stale = True
            if isinstance(exc, OSError):
                raise SinkError(f"swanlab:{self.location}: cannot write {self.path}: {exc}") from None
            raise
        self.progress += 1

    def _write(self, records: list[Record]) -> None:
        assert self._log is not None
        _r, _run, column_pb2, data_pb2, _s = self._pb
        hist_before = len(self._hist)
        for rec, step, wall in self.points(records, lo=0, hi=STEP_LIMIT,
                                           why="SwanLab steps are 0 or more (int64); the record is left out"):
            ts = _timestamp(wall)
            for name, value in rec.metrics.items():
                kind = value_kind(value)
                if kind is NUMBER:
                    points = [(name, value)]
                elif kind is NONE:
                    continue
                elif kind is HISTOGRAM:
                    self._hist.add(name)
                    points = [(f"{name}/{k}", v) for k, v in value.summary().items() if k in SUMMARY]
                elif kind is TEXT:
                    self.reject_value(name, step, "SwanLab keeps text as media files; not written")
                    continue
                else:
                    self.reject_value(name, step, not_kept(value))
                    continue
                for key_name, v in points:
                    try:
                        number = float(v)
                        key = self._names(key_name)
                    except (OverflowError, ValueError) as exc:
                        self.reject_value(key_name, step, printable(str(exc))[:200])
                        continue
                    last = self._last.get(key)
                    if last is not None and step <= last:
                        self.reject_value(key_name, step,
                                    f"SwanLab keeps one value per key and step, in increasing steps (it holds step "
                                    f"{last}); its SDK would drop this value silently, trackbridge leaves it out")
                        continue
                    if last is None:
                        section = key.split("/", 1)[0] if "/" in key else ""
                        self._num += 1
                        self._record(self._num, column=column_pb2.ColumnRecord(
                            column_class=column_pb2.ColumnClass.COLUMN_CLASS_CUSTOM,
                            column_type=column_pb2.ColumnType.COLUMN_TYPE_SCALAR, column_key=key,
                            section_name=section, section_type=column_pb2.SectionType.SECTION_TYPE_PUBLIC))
                    self._last[key] = step
                    self._num += 1
                    self._record(self._num, scalar=data_pb2.ScalarRecord(
                        key=key, step=step, type=column_pb2.ColumnType.COLUMN_TYPE_SCALAR, timestamp=ts,
                        value=data_pb2.ScalarValue(number=number)))
        new = self._names.take_new()
        if new:
            self.record_sanitized(new)
        if self.note_derived(records) or new or len(self._hist) != hist_before or self._stale:
            self._save_config()
        self._log.flush()
        self._stale = False

    def close(self) -> None:
        if self._log is None:
            return
        run_pb2 = self._pb[1]
        state = {"failed": run_pb2.RunState.RUN_STATE_CRASHED,
                 "killed": run_pb2.RunState.RUN_STATE_ABORTED}.get(self.outcome, run_pb2.RunState.RUN_STATE_FINISHED)
        log = self._log
        try:
            self._save_config()
            self._record(store.FINISH_NUM, finish=run_pb2.FinishRecord(state=state,
                                                                       finished_at=_timestamp(time.time())))
            log.close()
        except OSError as exc:
            raise SinkError(f"swanlab:{self.location}: cannot write {self.path}: {exc}") from None
        finally:
            self._log = None
            if not log.fh.closed:
                log.rollback()
                log.fh.close()

    # -- what the run holds ------------------------------------------------------------------------------
    def stored_points(self, since: int | None) -> list[tuple[str, int]] | None:
        """The scalar points of the run file, per key and step (a histogram's summaries count as the histogram;
        None before open)."""
        if self.path is None:
            return None
        if self._pb is None:
            return []
        record_pb2 = self._pb[0]
        if self._log is not None:
            self._log.flush()
        unkey = dict(self._names.changed)
        out: list[tuple[str, int]] = []
        summaries: set[tuple[str, int]] = set()
        for _off, payload, _end in store.read_payloads(self.path):
            rec = record_pb2.Record()
            rec.ParseFromString(payload)
            if rec.WhichOneof("record_type") != "scalar" or (since is not None and rec.scalar.step < since):
                continue
            name = unkey.get(rec.scalar.key, rec.scalar.key)
            base, _, stat = name.rpartition("/")
            if base in self._hist and stat in SUMMARY:
                if (base, rec.scalar.step) not in summaries:         # a histogram: held when its summary is
                    summaries.add((base, rec.scalar.step))
                    out.append((base, rec.scalar.step))
                continue
            out.append((name, rec.scalar.step))
        return out

    def describe(self) -> str:
        return f"swanlab:{self.location}" + (f" (run {self.run_id})" if self.run_id else "")


def _read_config(path: Path, problem: Callable[[str, str], None] | None = None) -> dict[str, Any]:
    """``files/config.yaml`` of the run file ``path`` as ``{key: value}`` (SwanLab keeps ``{desc, sort, value}``).
    Read safely: a value tagged for Python's unsafe loader (``!!python/tuple``, ``!!python/object:...``, which SwanLab
    writes for some configs) is read as its plain value, and ``problem(where, what)`` is told; a file that is no YAML
    is told too, never dropped in silence."""
    import yaml
    target = path.parent / "files" / "config.yaml"
    tags: list[str] = []

    class _Plain(yaml.SafeLoader):
        pass

    def plain(loader: Any, suffix: str, node: Any) -> Any:
        tags.append(node.tag)
        if isinstance(node, yaml.MappingNode):
            return loader.construct_mapping(node, deep=True)
        if isinstance(node, yaml.SequenceNode):
            return loader.construct_sequence(node, deep=True)
        return loader.construct_scalar(node)

    _Plain.add_multi_constructor("", plain)
    try:
        text = target.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as exc:
        if problem is not None:
            problem(str(target), f"the run config cannot be read ({exc}); the run is read without it")
        return {}
    try:
        doc = yaml.load(text, Loader=_Plain) or {}
    except (yaml.YAMLError, RecursionError) as exc:
        if problem is not None:
            problem(str(target), f"the run config is not YAML ({str(exc).splitlines()[0]}); the run is read without it")
        return {}
    if tags and problem is not None:
        kinds = ", ".join(sorted(set(tags))[:3])
        problem(str(target), f"{len(tags)} config value(s) tagged for Python's unsafe loader ({kinds}) read as their "
                             f"plain values")
    if not isinstance(doc, dict):
        return {}
    return {str(k): (v.get("value") if isinstance(v, dict) and "value" in v else v) for k, v in doc.items()}
