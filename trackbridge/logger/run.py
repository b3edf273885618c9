"""``Run``: what ``trackbridge.init`` returns on rank 0. It builds the sinks and their workers, takes ``log()``
calls, and at ``finish()`` waits for the trackers while they make progress, then writes down what any still lacks.

About 400 lines because ``Run`` is one object with one lifecycle (init, log, finish, resume, and the link to the
writer process that ``writer='auto'`` starts); what can stand alone lives beside it (checks, dispatch, spool,
tracker, writer)."""
from __future__ import annotations

import atexit
import copy
import dataclasses
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from ..errors import UsageError
from ..pipeline import names_translator
from ..record import RunInfo
from ..sinks.base import Sink
from ..stream import read_stream, scan_stream, stream_file
from ..values import printable, sanitize_config
from .checks import (
    check_packages,
    choose_writer,
    derive_hook,
    make_translator,
    precheck_location,
    ready_for_shutdown,
    validate_call,
)
from .common import STOP, RunView, warn
from .dispatch import Dispatcher, live_doctor
from .options import LoggerOptions
from .pending import pending_file, write_pending
from .spool import SpoolFile, SpoolWorker, spool_place
from .tracker import TrackerWorker
from .worker import RunContext, sync_run_info

_INFO_LOCK = threading.Lock()


def _writes(sink: Sink, run_id: str, spool_path: Path) -> bool:
    """True when ``sink`` would write the canonical stream to the spool's own file."""
    target = getattr(sink, "stream_file", None)
    if not callable(target):
        return False
    try:
        return Path(target(run_id)).expanduser().resolve() == spool_path.expanduser().resolve()
    except (OSError, TypeError, ValueError):
        return False


class Run(RunView):
    """A logging run: ``log()`` many times, then ``finish()`` (or use it as a context manager)."""

    def __init__(self, *, project: str | None, name: str | None, sinks: list[Any], source: str, names: str,
                 config: dict[str, Any] | None, run_id: str | None, resume: bool, derive: bool,
                 mappings: list[str] | None, spool: str, options: LoggerOptions,
                 tags: dict[str, str] | None, doctor: bool = False) -> None:
        from ..locators import LocatorError
        from ..sinks import make_sink

        self.options = options
        self.resume = bool(resume)
        self.names = names or "canonical"
        self.problems: list[str] = []
        self._finished = False
        self._lock = threading.Lock()
        self._warned_values: set[str] = set()
        self._warned_once: set[str] = set()

        # spool: "DIR" or "DIR?fsync=1"
        spool_dir, spool_fsync = spool_place(spool)
        self.run_id: str = run_id or time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]
        self.spool_path = stream_file(spool_dir, self.run_id)
        scan = scan_stream(self.spool_path)
        if self.spool_path.exists() and self.spool_path.stat().st_size and not self.resume:
            raise UsageError(f"run {self.run_id!r} already exists in the spool {self.spool_path}; "
                             f"pass resume=True to continue it, or choose another run_id")
        prev = scan.info
        cfg = dict(config) if config is not None else (dict(prev.config) if prev else {})
        translator = make_translator(source, mappings, cfg)
        try:
            cfg = {**cfg, **dict(translator.translate_config(cfg))}   # canonical names added
        except Exception as exc:
            warn(f"trackbridge: could not translate the config to canonical names: {exc}")
        self.info = RunInfo(name=name or (prev.name if prev else None) or self.run_id,
                            project=project or (prev.project if prev else None), run_id=self.run_id, config=cfg,
                            tags=dict(tags or (prev.tags if prev else {}) or {}),
                            source=None if source == "auto" else source, names="canonical",
                            extra={"names": self.names, "mappings": list(mappings) if mappings else None,
                                   "flush_interval": options.flush_interval})
        self._seq_base = scan.records
        derive_fn = derive_hook(translator) if derive else None
        if derive_fn is not None and self.resume and scan.records:
            # stateful derived rules (delta, rate, ema ...) continue from the history kept in the spool
            translator.warm_derive(rec for _seq, rec in read_stream(self.spool_path))

        # init(doctor=True): the live checks, before any sink or thread (a bad checks file fails init here)
        self._doctor = live_doctor(translator, mappings, cfg, self.info, self.spool_path if self.resume else None) \
            if doctor else None

        # sinks: the spool first, then the user's; build all first so that a bad spec fails init before any thread
        spool_sink = SpoolFile(self.spool_path, fsync=spool_fsync)
        built: list[Sink] = []
        for spec in sinks or []:
            try:
                sink = make_sink(spec)
            except (LocatorError, Exception) as exc:
                raise UsageError(f"sink {spec!r}: {exc}") from None
            check_packages(spec, sink, import_now=options.writer == "thread")   # the writer process imports its own
            ready_for_shutdown()
            if isinstance(spec, str):
                precheck_location(spec, sink)
            built.append(sink)
        # a sink that would write the spool's own file (the canonical stream in the spool folder) is the spool itself
        built = [s for s in built if not _writes(s, self.run_id, self.spool_path)]
        precheck_location(str(spool), spool_sink)

        # trackers get the names asked for through the same pipeline as replay and migrate, judged from the
        # source detected while logging and the approximations found so far (both live)
        self._rename = names_translator(self.names, mappings=mappings, config=cfg,
                                        origin=lambda: self.info.source, fidelity=self.info.approximate)
        ctx = RunContext(options=options, spool_path=self.spool_path, seq_base=self._seq_base, resume=self.resume,
                         resume_last_step=scan.last_step, tracker_info=self.tracker_info,
                         sync_info=self._sync_info, report=self.problems.append)
        self._spool_worker = ctx.spool = SpoolWorker(ctx, spool_sink, queue_size=options.queue_size,
                                                     batch_size=max(options.batch_size, 1000))
        self._writer: Any = None
        writer, why_thread = choose_writer(options.writer, sinks or [], built)
        if why_thread:
            self._warn_once("writer", why_thread)
        if writer == "process":
            from .writer import RemoteTracker
            by_locator = {s.locator(): s for s in built}
            self._writer_spec: dict[str, object] | None = {
                "sinks": list(by_locator), "spool_path": str(self.spool_path), "seq_base": self._seq_base,
                "resume": self.resume, "resume_last_step": scan.last_step, "names": self.names,
                "mappings": list(mappings) if mappings else None, "options": dataclasses.asdict(options)}
            try:
                self._start_writer_process()
            except (OSError, ValueError, RuntimeError) as exc:   # the platform cannot start it (no pass_fds ...)
                if options.writer == "process":
                    raise UsageError(f"init(writer='process'): the writer process could not start: {exc}") from None
                self._warn_once("writer", f"the writer process could not start ({type(exc).__name__}: {exc}); "
                                          f"the trackers are written by threads of the training process")
                self._writer_spec = None
                writer = "thread"
        if writer == "process":
            trackers: list[Any] = [RemoteTracker(loc, s) for loc, s in by_locator.items()]
        else:
            if options.writer != "thread":          # imported now, in this thread (see check_packages)
                for s in built:
                    check_packages(s.locator(), s)
            trackers = [TrackerWorker(ctx, s, queue_size=options.queue_size, batch_size=options.batch_size,
                                      rename=self._rename) for s in built]
        self._workers: list[Any] = [self._spool_worker, *trackers]
        self._dispatcher = Dispatcher(
            translator=translator, derive_fn=derive_fn, info=self.info,
            rename=None if self._writer_spec_given() else self._rename, names=self.names,
            spool=self._spool_worker, trackers=trackers, seq_base=self._seq_base,
            next_step=0 if scan.last_step is None else scan.last_step + 1, inbox_size=options.queue_size,
            resume_wait=options.resume_wait if self.resume else None, warn_once=self._warn_once,
            doctor=self._doctor)
        self._inbox = self._dispatcher.inbox
        self._spool_worker.thread.start()
        if self._writer_spec_given():
            self._start_writer(trackers)
        else:
            for w in trackers:
                w.thread.start()
        self._dispatcher.thread.start()
        atexit.register(self._atexit)

    # -- public API ----------------------------------------------------------------------------------------------
    @property
    def _next_step(self) -> int:
        return self._dispatcher.next_step

    @property
    def _seq(self) -> int:
        return self._dispatcher.seq

    def log(self, metrics: dict[str, Any], step: int | None = None, *, axis: str | None = None) -> None:
        """Log one step's metrics. Returns as soon as the values are validated and queued.

        ``axis``: the name of the x axis ``step`` counts, for a run with several (slime's ``train/step`` and
        ``rollout/step``): the metrics are charted on that axis in every tracker, and the run's own step counter
        is not advanced. Raises ``TypeError`` for a non-dict, a non-string key or a non-integer ``step`` (or a
        non-string ``axis``), ``ValueError`` for a step outside 0 .. 2**53 - 1 (nothing is logged for that call),
        ``RuntimeError`` after ``finish()``. A value or name no tracker can store (an empty name, a lone surrogate,
        ...) is left out with a one-time warning naming it (see ``run.problems``); the other values of the call are
        logged.
        """
        wall_time = time.time()
        values, problems, step = validate_call(metrics, step, axis)
        if problems:
            self._report_values(problems)
        if self._finished:
            raise RuntimeError(f"run {self.run_id!r}: log() after finish()")
        self._inbox.put((wall_time, step, values, axis))

    def tracker_info(self, is_spool: bool = False) -> RunInfo:
        """The run info a sink is opened with: the spool's is canonical; a tracker's has the names it receives and
        the approximations under those names."""
        info = self._clean_info()
        if not is_spool:
            info.names = self.names
            info.approximate = self.tracker_approximate(is_spool)
        return info

    def tracker_approximate(self, is_spool: bool = False) -> dict[str, str]:
        """Name -> why its value is approximate, as found so far: canonical names for the spool, the names a
        tracker receives otherwise."""
        if is_spool or self._rename is None:
            return dict(self.info.approximate)
        pipe = self._rename.pipeline()
        return dict(pipe.stats.approximate) if pipe is not None else {}

    def finish(self, timeout: float | None = None, *, failed: bool = False) -> dict[str, Any]:
        """Flush every sink and close it (a failed sink is given one last chance to recover and catch up).
        ``failed=True`` records that training failed (MLflow FAILED, wandb exit code 1, ``outcome`` in the run
        info); leaving a ``with`` block by an exception, or the interpreter exiting on an uncaught one, does it.
        Waits while the trackers make progress, at most ``timeout`` (default ``finish_timeout``) seconds; what a
        tracker still lacks is written beside the spool for ``trackbridge replay``. Safe to call twice. Returns
        :meth:`status`."""
        with self._lock:
            if self._finished:
                return self.status
            self._finished = True
        try:
            atexit.unregister(self._atexit)
        except Exception:
            pass
        outcome = "failed" if failed else "finished"
        self.info.extra["outcome"] = outcome
        for w in self._workers:
            w.sink.outcome = outcome
        self._inbox.put(STOP)
        end = time.monotonic() + (self.options.finish_timeout if timeout is None else max(0.0, float(timeout)))
        self._dispatcher.thread.join(max(0.0, end - time.monotonic()))
        self._spool_worker.thread.join(max(0.0, end - time.monotonic()))
        if self._writer is not None:
            self._writer_send(("info", self._clean_info().to_json()))
            self._writer_send(("stop", self._seq - 1, outcome))
        # wait for every tracker while it makes progress (records written or caught up, or requests answered, as
        # the sink counts them); one that makes none for stall_timeout seconds (a hung or unreachable server) is
        # left behind: what it lacks is written down for `trackbridge replay`
        last_progress = {id(w): (w.progress(), time.monotonic()) for w in self._workers}
        while True:
            alive = [w for w in self._workers[1:] if w.thread.is_alive()]
            now = time.monotonic()
            if not alive or now >= end:
                break
            stalled = []
            for w in alive:
                p = w.progress()
                if p != last_progress[id(w)][0] or w.starting():
                    last_progress[id(w)] = (p, now)
                elif now - last_progress[id(w)][1] > self.options.stall_timeout:
                    stalled.append(w)
            if len(stalled) == len(alive):
                break
            alive[0].thread.join(0.1)
        if self._writer is not None:
            self._stop_writer(end)
        self._write_pending()
        return self.status

    @property
    def findings(self) -> list[Any]:
        """With ``init(doctor=True)``: every finding of the diagnostic checks so far, ordered by what to look at
        first (complete after :meth:`finish`); ``[]`` otherwise."""
        return self._doctor.finish(dict(self.info.approximate)) if self._doctor is not None else []

    @property
    def status(self) -> dict[str, Any]:
        """Run id, spool path, and per sink: state (ok/behind/failed/closed), records written, caught up, queued,
        failures, last error."""
        return {"run_id": self.run_id, "spool": str(self.spool_path), "finished": self._finished,
                "logged": self._seq - self._seq_base, "sinks": [w.status() for w in self._workers],
                "problems": list(self.problems)}

    def summary(self) -> str:
        """The status as a small text table (what ``print(run.summary())`` shows)."""
        st = self.status
        lines = [f"run {st['run_id']}  spool {st['spool']}  records logged {st['logged']}"]
        for s in st["sinks"]:
            err = f"  last error: {s['last_error']}" if s["last_error"] and s["state"] == "failed" else ""
            lines.append(f"  {s['sink']:<48} {s['state']:<7} written {s['written']:>7}  caught up "
                         f"{s['caught_up']:>6}  failures {s['failures']:>3}{err}")
        for p in st["problems"]:
            lines.append(f"  problem: {p}")
        return "\n".join(lines)

    def __enter__(self) -> "Run":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.finish(failed=exc_type is not None)

    # -- the writer process (writer="process") ----------------------------------------------------------------
    def _writer_spec_given(self) -> bool:
        return getattr(self, "_writer_spec", None) is not None

    def _start_writer_process(self) -> None:
        from .writer import start
        spec = {**(self._writer_spec or {}), "info": self._clean_info().to_json()}
        self._writer, self._writer_conn = start(spec)

    def _start_writer(self, trackers: list[Any]) -> None:
        self._remote = {t.sink.locator(): t for t in trackers}
        self._sent_info: tuple[Any, ...] = ()
        self._monitor = threading.Thread(target=self._monitor_writer, name="trackbridge-writer-monitor",
                                         daemon=True)
        self._monitor.start()

    def _writer_send(self, msg: Any) -> None:
        try:
            self._writer_conn.send(msg)
        except (OSError, EOFError, ValueError):
            pass

    def _monitor_writer(self) -> None:
        """Take the writer's status messages; pass it what the run learns while logging."""
        seen: set[str] = set()
        trackers = list(self._remote.values())
        while True:
            try:
                if self._writer_conn.poll(0.1):
                    kind, statuses, problems, _final, warned = self._writer_conn.recv()
                    for message in warned:      # the trackers' warnings, as the threads would have warned them
                        warn(message)
                    for t, st in zip(trackers, statuses):
                        t.update(st)
                    for p in problems:
                        if p not in seen:
                            seen.add(p)
                            self.problems.append(p)
            except (EOFError, OSError):
                for t in trackers:
                    t.alive = False
                    t.changed.set()
                return
            now = (self.info.source, tuple(sorted(self.info.approximate.items())))
            if now != self._sent_info and not self._finished:
                self._sent_info = now
                self._writer_send(("info", self._clean_info().to_json()))

    def _stop_writer(self, end: float) -> None:
        """After the trackers finished or stalled: let the writer exit, or stop it (its records are in the spool)."""
        try:
            self._writer.wait(timeout=max(0.5, min(5.0, end - time.monotonic())))
        except Exception:
            pass
        if self._writer.poll() is None:
            self._writer.kill()
            self._writer.wait(timeout=10)
            for t in self._remote.values():
                t.alive = False
        self._monitor.join(2.0)

    # -- internals -------------------------------------------------------------------------------------------
    def _atexit(self) -> None:
        # at interpreter exit after an uncaught exception, Python has set sys.last_value (PyErr_Print)
        dying = getattr(sys, "last_value", None) is not None or getattr(sys, "last_exc", None) is not None
        try:
            self.finish(timeout=60.0, failed=dying)
        except Exception:
            pass

    def _write_pending(self) -> None:
        """After finish(): write down, beside the spool, which trackers lack which records (and say so), so that
        ``trackbridge replay SPOOL`` completes them; remove the note when nothing is left."""
        last_seq = self._seq - 1
        left = [(w, w.left(last_seq)) for w in self._workers[1:]]
        left = [(w, n) for w, n in left if n]
        path = pending_file(self.spool_path)
        if not left:
            if path.exists():
                try:
                    path.unlink()
                except OSError:
                    pass
            return
        entries = [{"sink": w.sink.locator(), "describe": w.name, "records_left": n, "from_record": w.acked + 1,
                    "records": self._seq, "state": w.state, "last_error": w.last_error} for w, n in left]
        try:
            write_pending(path, self.run_id, entries)
        except OSError as exc:
            warn(f"trackbridge: could not write {path}: {exc}")
        for w, n in left:
            msg = (f"sink {w.name} lacks {n} of the run's {self._seq} records ({w.state}"
                   + (f"; last error: {w.last_error}" if w.last_error else "")
                   + f"); they are in the spool: trackbridge replay {self.spool_path}")
            self.problems.append(msg)
            warn(f"trackbridge: finish(): {msg}")

    def _sync_info(self, run: RunInfo | None, is_spool: bool) -> None:
        sync_run_info(run, self.info, self.tracker_approximate(is_spool))

    def _clean_info(self) -> RunInfo:
        """A copy of the run info that every sink can store: the config made plain JSON (see
        :func:`trackbridge.values.sanitize_config`; each change is reported once, naming the key), tags as
        strings, no lone surrogate in the name or project. Sink workers open concurrently, hence the lock."""
        with _INFO_LOCK:
            src = self.info
            config, notes = sanitize_config(src.config)
            for key, message in notes:
                self._warn_once(f"config:{key}", message)
            info: RunInfo = copy.deepcopy(dataclasses.replace(src, config={}, extra={}))
            info.config = config
            info.extra, _ = sanitize_config(src.extra)
            info.name = printable(info.name) if isinstance(info.name, str) else info.name
            info.project = printable(info.project) if isinstance(info.project, str) else info.project
            info.tags = {printable(str(k)): printable(v if isinstance(v, str) else str(v))
                         for k, v in (info.tags or {}).items()}
        return info

    def _report_values(self, problems: list[str]) -> None:
        for p in problems:
            key = p.split(":", 1)[0]
            if key not in self._warned_values:
                self._warned_values.add(key)
                self.problems.append(p)
                warn(f"trackbridge: {p}; the value was left out")

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned_once:
            self._warned_once.add(key)
            self.problems.append(message)
            warn(f"trackbridge: {message}")
