"""``wandb:DIR`` -- Weights & Biases, **offline by default** (``?mode=online&project=P`` only when asked).

Runs go to ``DIR/wandb/offline-run-<time>-<run_id>/run-<run_id>.wandb`` (upload later with ``wandb sync``). Each
sink owns its own ``Run`` object (``reinit="create_new"``), so several runs can live in one process, and never uses
the global ``wandb.log``. Console capture, system stats, git and code saving are off.

What wandb 0.31 does, and what this sink does about it (verified against the offline ``.wandb`` file):

* **A step lower than the last one is silently dropped.** Every record becomes its own history row at a wandb step
  that only grows: the record's own step when it is higher than the last wandb step, else last + 1. The true step
  is logged in every row as ``trackbridge/step`` and declared the x-axis of every metric
  (``define_metric("*", step_metric="trackbridge/step")``), so nothing is lost and charts use the real steps.
  :class:`~trackbridge.trackers.wandb.source.WandbSource` reads ``trackbridge/step`` back as the record's step.
* **Wall time**: a ``_timestamp`` key in the logged dict is honoured (stored verbatim as the row's
  ``_timestamp``); this sink sets it from ``Record.wall_time``.
* **Strings** are stored as JSON strings in the history row (read back exactly); ``None`` is stored as ``null``.
* **Histograms** become ``wandb.Histogram`` (bucket edges ``[min] + limits``, at most 512 buckets: more are merged
  pairwise). wandb keeps only edges and counts: ``sum``/``sum_squares`` are lost. Raw ``values`` are bucketed by
  wandb into ``bins`` buckets (option, default 64).
* **Float 1.0 is stored as the integer 1** (wandb's JSON encoding); equal in value.
* **Reserved names**: keys starting with ``_`` belong to wandb (``_step``, ``_runtime``, ``_timestamp``) and keys
  starting with ``trackbridge/`` to this sink (``trackbridge/step``), so a metric ``_x`` is stored as
  ``trackbridge/_x`` and a metric ``trackbridge/step`` as ``trackbridge/trackbridge/step``; the mapping is
  recorded (``RunInfo.sanitized``) and the reader restores the names.
* **What wandb cannot take** (a name or text with a lone surrogate, a value wandb refuses) is left out of that row
  only, reported once per key by the logger; a record whose step is beyond +-(2**53 - 1) is left out. A batch
  retried after ``run.log`` failed part-way continues after the rows already logged (no duplicate rows).
* **Run info**: ``config`` is the run's config plus one entry ``_trackbridge`` holding the rest of the
  :class:`RunInfo` (name, project, tags, source, sanitization, ...), from which the reader restores it exactly.
  wandb tags (a list) are set to ``key=value`` strings (64 characters at most) for the UI.
* **finish() can return before the file is flushed** (seen: a 7-byte ``.wandb`` right after ``finish()``, more
  often when wandb-core starts slowly). :meth:`WandbSink.close` therefore waits until the run's ``exit`` record is
  in the file (option ``flush_timeout``, default 300 s: wandb-core on a loaded machine), so a reader right after
  ``close()`` sees everything.
* **Resume**: offline wandb ignores ``resume``. With ``resume=True`` this sink finds the run's earlier offline
  folders under ``DIR/wandb`` (by run id), reads their last wandb step and last true step with the wandb reader,
  and starts a *new* offline run with the same id (wandb names its folder ``...-<id>-1`` when the second matches),
  continuing the wandb step after the last one. The reader merges all folders of one run id, in order. Opening an
  id that already has folders without ``resume`` raises :class:`SinkError` (it would mix two runs).
"""
from __future__ import annotations

import os
import time
import uuid
from pathlib import Path
from typing import Any

from ...extras import MissingExtra
from ...record import Histogram, Record, RunInfo
from ...record.values import printable, utf8_ok
from ...tracking.sink import Capabilities, Sink, SinkError
from .records import META_KEY, STEP_KEY, has_exit_record, run_files

MAX_BINS = 512
_RESERVED_PREFIX = "trackbridge/"
WANDB_STEP_MAX = 2 ** 53 - 1     # wandb shows steps in JavaScript
_INT_FLOAT = 2 ** 1023           # integers up to this one are floats; a bigger one may be beyond a float


def _merge_buckets(edges: list[float], counts: list[float], limit: int) -> tuple[list[float], list[float]]:
    """Merge neighbouring buckets pairwise until at most ``limit`` remain."""
    while len(counts) > limit:
        new_counts = [counts[i] + (counts[i + 1] if i + 1 < len(counts) else 0.0) for i in range(0, len(counts), 2)]
        new_edges = [edges[i] for i in range(0, len(counts), 2)] + [edges[-1]]
        edges, counts = new_edges, new_counts
    return edges, counts


def histogram_edges(h: Histogram) -> tuple[list[float], list[float]] | None:
    """``(edges, counts)`` with ``len(edges) == len(counts) + 1`` from a limits/counts histogram, or None."""
    if h.limits is None or h.counts is None or not h.counts:
        return None
    limits = [float(x) for x in h.limits]
    first = limits[0]
    left = float(h.min) if h.min is not None and h.min <= first else first
    return _merge_buckets([left] + limits, [float(c) for c in h.counts], MAX_BINS)


#: characters wandb refuses in a project name and a run id ("cannot contain characters '/,\\,#,?,%,:'")
WANDB_REFUSES = "/\\#?%:"


def wandb_safe(text: str) -> str:
    """``text`` with each character wandb refuses in a project or run id as ``-`` (``team/grpo`` -> ``team-grpo``).
    The run's own project and id are kept whole in the run's trackbridge metadata, which the reader gives back."""
    return "".join("-" if c in WANDB_REFUSES else c for c in text)


OFFLINE_INIT_TIMEOUT = 600.0     # seconds wandb.init may take offline (see open())


#: the most of wandb-core's debug-internal.log read for its failed writes (the log of a long run stays far smaller)
STORE_LOG_LIMIT = 64 * 1024 * 1024


class WandbSink(Sink):
    """Writes a wandb run. Options: ``mode`` (offline|online, default offline), ``project``, ``entity``, ``bins``,
    ``flush_timeout`` (seconds close() waits for the offline file to be complete)."""

    kind = "wandb"
    option_names = ("mode", "project", "entity", "bins", "flush_timeout")
    process_env = ("WANDB_SERVICE",)    # wandb.init's wandb-core address, for this process and the ones it starts
    alerts = False                      # the logger with init(doctor=True): a live finding is also a run.alert
    capabilities = Capabilities(histograms=True, text=True, nan=True, wall_time=True, resolution=(
        "raw histogram samples as 64 buckets (?bins=N)",))

    def __init__(self, location: str = "", **options: str) -> None:
        super().__init__(location, **options)
        self.mode = options.get("mode", "offline")
        if self.mode not in ("offline", "online"):
            raise SinkError(f"wandb sink: mode={self.mode!r}; expected offline or online")
        try:
            self.bins = max(1, min(MAX_BINS, int(options.get("bins", 64))))
        except ValueError:
            raise SinkError(f"wandb sink: option bins={options.get('bins')!r} is not an integer") from None
        self._run: Any = None
        self._wandb: Any = None
        self._wstep = -1
        self._max_step: int | None = None
        self._sanitized_written: dict[str, str] = {}
        self._file: Path | None = None
        self._file_seen = False
        self._stored: dict[str, str] = {}
        self._partial_batch: list[Record] | None = None
        self._partial_done = 0
        try:
            self.flush_timeout = float(options.get("flush_timeout", 300))
        except ValueError:
            raise SinkError(f"wandb sink: flush_timeout={options.get('flush_timeout')!r} is not a number") from None

    # -- open ------------------------------------------------------------------------------------------------
    def open(self, run: RunInfo, *, resume: bool = False) -> None:
        os.environ.setdefault("WANDB_SILENT", "true")
        try:
            import wandb
        except ImportError:
            raise MissingExtra("the wandb sink", "wandb", "wandb") from None
        self._wandb = wandb
        if run.run_id is None:
            run.run_id = uuid.uuid4().hex[:12]
        self.run = run
        self._wid = wandb_safe(run.run_id)
        folder = Path(self.location or ".").expanduser()
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise SinkError(f"wandb sink: cannot create {folder}: {exc}") from None
        self._wstep, self._max_step = -1, None        # what the folder holds decides (a reopened sink's may be gone)
        if self.mode == "offline":
            self._continue_offline(folder, run, resume)
        # offline, wandb.init only waits for the local wandb-core: on a loaded machine that took over its 90 s
        # default, and every retry then found the run id still held by the first attempt ("run ID is in use")
        settings = wandb.Settings(console="off", x_disable_stats=True, disable_git=True, save_code=False,
                                  silent=True, x_disable_meta=True,
                                  init_timeout=OFFLINE_INIT_TIMEOUT if self.mode == "offline" else 90.0)
        tags = [t for t in (f"{k}={v}" if v not in (None, "") else str(k) for k, v in run.tags.items())
                if 0 < len(t) <= 64]
        kwargs: dict[str, Any] = {}
        if self.mode == "online" and resume:
            kwargs["resume"] = "allow"
        try:
            self._run = wandb.init(
                mode=self.mode, dir=str(folder),
                project=wandb_safe(self.options.get("project") or run.project or "trackbridge"),
                entity=self.options.get("entity"), name=run.name, id=self._wid, config=self._config(run),
                tags=tags or None, reinit="create_new", settings=settings, **kwargs)
        except Exception as exc:
            raise SinkError(f"wandb sink: wandb.init failed for run {run.run_id!r} in {folder}: {exc}") from exc
        if self.mode == "online" and resume:
            self._wstep = max(self._wstep, int(getattr(self._run, "step", 0) or 0) - 1)
        self._run.define_metric(STEP_KEY)
        self._run.define_metric("*", step_metric=STEP_KEY)
        self._sanitized_written = dict(run.sanitized)
        self._file = None
        self._file_seen = False
        if self.mode == "offline":
            run_dir = getattr(self._run, "dir", None)     # .../offline-run-<time>-<id>/files
            if run_dir:
                self._file = Path(run_dir).parent / f"run-{self._wid}.wandb"

    def _continue_offline(self, folder: Path, run: RunInfo, resume: bool) -> None:
        """Find earlier offline folders of this run id; refuse them without resume, continue after them with."""
        from .source import WandbRunReader

        assert run.run_id is not None           # set by open()
        previous = run_files(folder / "wandb", wandb_safe(run.run_id))
        if not previous:
            return
        if not resume:
            raise SinkError(f"wandb sink: {previous[0].parent} already holds run {run.run_id!r}; open with "
                            f"resume=True to continue it, or use a new run id")
        reader = WandbRunReader(previous, run_id=wandb_safe(run.run_id))
        last_wstep, last_step = reader.last_steps()
        self._wstep = last_wstep if last_wstep is not None else -1
        self._max_step = last_step

    @staticmethod
    def _meta(run: RunInfo) -> dict[str, Any]:
        meta = run.to_json()
        meta.pop("config", None)
        return meta

    def _config(self, run: RunInfo) -> dict[str, Any]:
        config = dict(run.config or {})
        config[META_KEY] = self._meta(run)
        return config

    # -- write -----------------------------------------------------------------------------------------------
    def _key(self, name: str) -> str:
        """The stored name: names starting with ``_`` belong to wandb and names starting with ``trackbridge/`` to
        this sink (``trackbridge/step``), so both get a ``trackbridge/`` prefix, recorded in ``RunInfo.sanitized``
        (``_x`` -> ``trackbridge/_x``, ``trackbridge/step`` -> ``trackbridge/trackbridge/step``)."""
        try:
            return self._stored[name]
        except KeyError:
            pass
        if not utf8_ok(name):
            raise SinkError("the name holds a lone surrogate (invalid Unicode)")
        if not name:
            raise SinkError("an empty name")
        stored = name
        if name.startswith("_") or name.startswith(_RESERVED_PREFIX):
            stored = _RESERVED_PREFIX + name
            self.record_sanitized({stored: name})
        self._stored[name] = stored
        return stored

    def _value(self, name: str, v: Any) -> Any:
        t = type(v)
        if t is float or v is None:
            return v
        if t is int:
            if -_INT_FLOAT <= v <= _INT_FLOAT:
                return v
            float(v)            # an integer beyond a float raises (wandb would store it as +-inf): left out
            return v
        if t is str:
            if not utf8_ok(v):
                raise SinkError("the text holds a lone surrogate (invalid Unicode)")
            return v
        if t is bool:
            return int(v)
        if isinstance(v, Histogram):
            wandb = self._wandb
            parts = histogram_edges(v)
            if parts is not None:
                edges, counts = parts
                return wandb.Histogram(np_histogram=(counts, edges))
            import math

            finite = [float(x) for x in (v.values or []) if math.isfinite(float(x))]
            if not finite:
                return None
            return wandb.Histogram(finite, num_bins=self.bins)
        if isinstance(v, (int, float)):
            return float(v)
        if isinstance(v, str):
            return self._value(name, str(v))
        raise SinkError(f"cannot write a {type(v).__name__}")

    def _row(self, rec: Record) -> dict[str, Any]:
        row: dict[str, Any] = {}
        for k, v in rec.metrics.items():
            try:
                row[self._key(k)] = self._value(k, v)
            except Exception as exc:           # this key only: the rest of the record is written
                self.reject(printable(k), rec.step, f"{type(exc).__name__}: {printable(str(exc))[:200]}")
        return row

    def _gone(self) -> bool:
        """The offline run's folder, or its run file once wandb-core made it, is no longer there (deleted)."""
        if self._file is None:
            return False
        if self._file.exists():
            self._file_seen = True
            return False
        return self._file_seen or not self._file.parent.is_dir()   # not yet made (wandb-core is slow) is not gone

    def _check_file(self) -> None:
        """wandb-core keeps writing an offline run whose folder was deleted, into nothing: say so (the logger then
        starts the run again in a new folder and writes it everything from the spool, see ``store_lost``)."""
        if not self._gone():
            return
        self.store_lost = True
        raise SinkError(f"wandb sink: the offline run file {self._file} was deleted while the run was written "
                        f"(its folder removed?); what it held is gone")

    def write(self, records: list[Record]) -> None:
        if self._run is None:
            raise SinkError(f"wandb sink {self.location}: write() before open() or after close()")
        self._check_file()
        log = self._run.log
        # a retry of a batch that failed part-way (the logger retries the same list) starts after the rows that
        # were logged already: wandb cannot take a row back, and logging it again would duplicate it
        start = self._partial_done if records is self._partial_batch else 0
        self._partial_batch, self._partial_done = records, start
        for i in range(start, len(records)):
            rec = records[i]
            if rec.step is not None and not -WANDB_STEP_MAX <= rec.step <= WANDB_STEP_MAX:
                self.reject("step", rec.step, f"wandb cannot store step {rec.step} (beyond +-(2**53 - 1)); the "
                                              f"record is left out")
                self._partial_done = i + 1
                continue
            row = self._row(rec)
            if rec.axis is not None:
                self._on_axis(rec, row)
            row[STEP_KEY] = rec.step
            if rec.wall_time is not None:
                row["_timestamp"] = float(rec.wall_time)
            step = rec.step if rec.step is not None and rec.step > self._wstep else self._wstep + 1
            try:
                log(row, step=step, commit=True)
            except Exception as exc:
                raise SinkError(f"wandb sink: run.log failed at step {rec.step}: {exc}") from exc
            self._wstep = step
            self._partial_done = i + 1
            if self.alerts:
                self._alert(rec)
            if rec.step is not None and (self._max_step is None or rec.step > self._max_step):
                self._max_step = rec.step
        self._partial_batch, self._partial_done = None, 0
        self._check_file()
        axes = self.note_axes(records)
        if self.note_derived(records) and self.run is not None:
            # derived (not logged) metrics are marked in the run's config, beside trackbridge's run metadata
            self._run.config.update({META_KEY: self._meta(self.run),
                                     "trackbridge_derived": list(self.run.extra["derived"])}, allow_val_change=True)
        elif axes and self.run is not None:
            self._run.config.update({META_KEY: self._meta(self.run)}, allow_val_change=True)

    def _on_axis(self, rec: Record, row: dict[str, Any]) -> None:
        """A record on an x axis of its own (``Record.axis``): the axis's value goes into the row under the axis's
        name, and each metric is declared on that axis (``define_metric(name, step_metric=axis)``, as slime declares
        ``train/*`` on ``train/step``), so wandb charts every series on its own axis and the reader gives the
        record its axis back."""
        assert rec.axis is not None
        axis = self._key(rec.axis)
        defined = self.__dict__.setdefault("_axis_defined", {})
        if axis not in defined:
            self._run.define_metric(axis)
            defined[axis] = axis
        for name in row:
            if defined.get(name) != axis and name != axis:
                self._run.define_metric(name, step_metric=axis)
                defined[name] = axis
        row[axis] = rec.step

    def _alert(self, rec: Record) -> None:
        """A live finding (``doctor/<id>``, with ``init(doctor=True)``) as a wandb alert: ``run.alert(title, text,
        level)``, which an offline run records in its ``.wandb`` file (an ``alert`` record, sent by ``wandb
        sync``). Each check's finding is logged once per run, so no alert repeats."""
        from ...doctor.report import live_alert
        for key, value in rec.metrics.items():
            found = live_alert(key, value)
            if found is None:
                continue
            _cid, severity, title, text = found
            level = {"critical": "ERROR", "warning": "WARN"}.get(severity, "INFO")
            try:
                self._run.alert(title=title, text=text, level=level)
            except Exception as exc:        # the point is logged; the alert is said once as lost
                self.reject(key, rec.step, f"wandb run.alert failed: {printable(str(exc))[:200]}")

    def written_of(self, records: list[Record]) -> int:
        return self._partial_done if records is self._partial_batch else 0

    def close(self) -> None:
        if self._run is None:
            return
        run, self._run = self._run, None
        try:
            if self.run is not None:      # the run info as it stands at the end (fidelity, derived, names)
                run.config.update({META_KEY: self._meta(self.run)}, allow_val_change=True)
        finally:
            code = 1 if self.outcome == "failed" else 0
            if self.outcome == "killed":
                code = self.exit_code if self.exit_code is not None else 137
            self._finish(run, code)
        if self.mode == "offline" and self._file is not None:
            if self._gone():
                self.store_lost = True
                raise SinkError(f"wandb sink: the offline run file {self._file} was deleted before the run was "
                                f"closed; what it held is gone")
            failed = self._store_errors()
            if failed:
                raise SinkError(f"wandb sink: wandb-core could not write the run file {self._file} ({failed}; its "
                                f"logs/debug-internal.log): the records after that are not in it, and wandb's SDK "
                                f"does not say so")
            self._wait_for_file(self._file)

    def _store_errors(self) -> str | None:
        """What wandb-core's writer logged of failed writes to this run's file (a full disk: it keeps failing after
        the first, even once there is room), or None. Its SDK raises nothing; the run's ``debug-internal.log`` says
        ``"level":"ERROR","msg":"writer: failed to save record: ..."``."""
        assert self._file is not None
        log = self._file.parent / "logs" / "debug-internal.log"
        try:
            with open(log, "rb") as fh:
                data = fh.read(STORE_LOG_LIMIT)
        except OSError:
            return None
        marker = b'"msg":"writer: failed to save record'
        n = data.count(marker)
        if not n:
            return None
        first = data[data.index(marker):].split(b"\n", 1)[0][7:].decode("utf-8", "replace").rstrip('"}')
        return f"{n} failed write(s), the first: {first[:200]}"

    def _finish(self, run: Any, code: int) -> None:
        """``run.finish()``; for an offline run whose folder was deleted, with its folders made again first: wandb
        writes its logs there as it finishes (without them the run stayed open in wandb-core and its id "in use", so
        the logger could not start it again), and a run started again within the same second gets the same folder
        name, whose log wandb's logger still writes. They hold wandb's logs only, no run file: no reader takes them
        for the run."""
        if self.mode == "offline" and self._file is not None and self._gone():
            for sub in ("files", "logs", "tmp"):
                (self._file.parent / sub).mkdir(parents=True, exist_ok=True)
        run.finish(exit_code=code)

    def _wait_for_file(self, path: Path) -> None:
        """Wait until wandb-core has written the run's ``exit`` record: in 0.31 offline, ``finish()`` can return
        before the transaction log is flushed (seen: a 7-byte file right after ``finish()``)."""

        start = time.monotonic()
        deadline = start + self.flush_timeout
        delay = 0.01
        whole_at = start + 2.0          # then now and then the whole file (its end may be padding made ahead)
        while not has_exit_record(path, whole=time.monotonic() >= whole_at):
            if time.monotonic() >= whole_at:
                whole_at = time.monotonic() + 5.0
            if time.monotonic() > deadline:
                raise SinkError(f"wandb sink: {path} still has no exit record {self.flush_timeout:g} s after "
                                f"finish(); wandb-core may still be writing it")
            time.sleep(delay)
            delay = min(delay * 2, 0.2)

    def last_step(self) -> int | None:
        return self._max_step

    def describe(self) -> str:
        return f"wandb:{self.location}?mode={self.mode}"
