"""``Run``: what ``trackbridge.init`` returns on rank 0. It builds the sinks and their workers, takes ``log()``
calls, and at ``finish()`` waits for the trackers while they make progress, then writes down what any still lacks.
One object with one lifecycle; what can stand alone lives beside it (checks, runinfo, dispatch, spool, tracker,
runlock, exits, waiting, pending, and the link to the writer process in remote)."""
from __future__ import annotations

import atexit
import collections
import os
import signal
import threading
import time
import uuid
from typing import Any

from ..errors import UsageError
from ..limits import tracker_cuts
from ..pipeline import Pipeline, names_translator
from ..pipeline.stages import Derive
from ..record import RunInfo
from ..stream import read_stream, scan_stream, stream_file
from . import exits, pending
from .checks import (
    build_sinks,
    check_packages,
    choose_writer,
    make_translator,
    precheck_location,
    validate_call,
)
from .common import INTERRUPTED_EXIT, STOP, TERMINATED_EXIT, RunView, log, user_frame, warn
from .device import hand_off
from .dispatch import Dispatcher, live_doctor, live_options, severity_rank
from .egress import Egress
from .exits import Terminated, ignore_interrupts, on_sigterm, restore_interrupts, restore_sigterm
from .options import LoggerOptions
from .runinfo import clean_info, resumed_config
from .runlock import RunLock
from .spool import SpoolFile, SpoolWorker, spool_place
from .tracker import TrackerWorker
from .waiting import wait_for_trackers
from .worker import RunContext

ABORT_WAIT = 5.0            # seconds an interrupted finish() gives the writer process and the spool

class Run(RunView):
    """A logging run: ``log()`` many times, then ``finish()`` (or use it as a context manager)."""

    _ranks: Any = None      # init(merge_ranks=True): the rank file and merger (logger/rankrun.py, ranks.py)
    _device: Any = None     # once a CUDA tensor was logged: the thread reading them back in order (logger/device.py)

    def __init__(self, *, project: str | None, name: str | None, sinks: list[Any], source: str, names: str,
                 config: dict[str, Any] | None, run_id: str | None, resume: bool, derive: bool,
                 mappings: list[str] | None, spool: str, options: LoggerOptions,
                 tags: dict[str, str] | None, doctor: bool = False, on_finding: Any = None,
                 stop_on: str | None = None) -> None:
        self._on_finding, self._stop_on = live_options(doctor, on_finding, stop_on)
        self._said: collections.deque[Any] = collections.deque()    # findings still to be said in the caller's thread
        self.should_stop = False
        self._stop_finding: Any = None      # the finding that set should_stop
        self.options = options
        self.resume = bool(resume)
        self.names = names or "canonical"
        self.problems: list[str] = []
        self._finished = False
        self._lock = threading.Lock()
        self._warned_values: set[str] = set()
        self._warned_once: set[str] = set()
        self._link: Any = None              # the writer process (writer="process"): remote.WriterLink
        exits.install()

        # spool: "DIR" or "DIR?fsync=1"
        spool_dir, spool_fsync = spool_place(spool)
        self.run_id: str = run_id or time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]
        self.spool_path = stream_file(spool_dir, self.run_id)
        if self.spool_path.exists() and not self.spool_path.is_file():
            raise UsageError(f"spool {self.spool_path} exists and is not a regular file")
        # one process logs one run: claimed before the spool is read (see runlock)
        self._runlock = RunLock.claim(self.spool_path, self.run_id, resume=self.resume, wait=options.finish_timeout,
                                      say=lambda m: log.warning("trackbridge: %s", m))
        try:
            self._setup(project=project, name=name, sinks=sinks, source=source, config=config, derive=derive,
                        mappings=mappings, spool=spool, spool_fsync=spool_fsync, options=options, tags=tags,
                        doctor=doctor)
        except BaseException:
            self._runlock.release()
            raise

    def _setup(self, *, project: str | None, name: str | None, sinks: list[Any], source: str,
               config: dict[str, Any] | None, derive: bool, mappings: list[str] | None, spool: str,
               spool_fsync: bool, options: LoggerOptions, tags: dict[str, str] | None, doctor: bool) -> None:

        scan, cfg, shown, translator = self._open_info(project=project, name=name, source=source, config=config,
                                                       mappings=mappings, options=options, tags=tags)
        self._seq_base = scan.records
        pipe = Pipeline.live(translator, derive=derive, next_step=0 if scan.last_step is None else scan.last_step + 1,
                             problem=self._warn_once)
        deriving = pipe.stage(Derive)
        if deriving is not None and self.resume and scan.records:
            # stateful derived rules (delta, rate, ema ...) continue from the history kept in the spool
            deriving.warm(rec for _seq, rec in read_stream(self.spool_path))

        # init(doctor=True): the live checks, before any sink or thread (a bad checks file fails init here)
        self._doctor = live_doctor(translator, mappings, cfg, self.info, self.spool_path if self.resume else None) \
            if doctor else None

        # sinks: the spool first, then the user's; build all first so that a bad spec fails init before any thread
        spool_sink = SpoolFile(self.spool_path, fsync=spool_fsync)
        built = build_sinks(sinks or [], options, self.run_id, self.spool_path)
        self._flat_configs = [s.capabilities.flat_config for s in built if s.capabilities.flat_config]
        for line in tracker_cuts(shown, built):     # a tracker that keeps a value cut (trackbridge/limits.py)
            self._warn_once(f"cut:{line}", line)
        if self._doctor is not None:
            for s in built:             # a tracker with alerts of its own raises one per finding (wandb, Trackio)
                s.alerts = True
        precheck_location(str(spool), spool_sink)
        if self.resume and self.info.extra.get("config_changes") and scan.info is not None:
            spool_sink.new_header = True       # the spool records the change, as the trackers do

        # trackers get the names asked for through the same pipeline as replay and migrate, judged from the
        # source detected while logging and the approximations found so far (both live)
        self._rename = names_translator(self.names, mappings=mappings, config=cfg,
                                        origin=lambda: self.info.source, fidelity=self.info.approximate)
        self._egress = Egress(info=self._clean_info, live=self.info, rename=self._rename, names=self.names,
                              problem=self._warn_once)
        ctx = RunContext(options=options, spool_path=self.spool_path, seq_base=self._seq_base, resume=self.resume,
                         resume_last_step=scan.last_step, tracker_info=self._egress.tracker_info,
                         sync_info=self._egress.sync_info, report=self.problems.append, opened=self._exit_hook_last)
        self._ctx = ctx
        self._spool_worker = ctx.spool = SpoolWorker(ctx, spool_sink, queue_size=options.queue_size,
                                                     batch_size=max(options.batch_size, 1000))
        trackers = self._trackers(options, sinks, built, scan.last_step, mappings)
        self._start(trackers, pipe, options)

    def _start(self, trackers: list[Any], pipe: Pipeline, options: LoggerOptions) -> None:
        """The dispatcher between ``log()`` and the spool and trackers, and every thread started."""
        self._workers: list[Any] = [self._spool_worker, *trackers]
        # with the writer process, records leave canonical: its own egress renames them (logger/writer.py)
        out = self._egress if self._link is None else Egress(info=self._clean_info, live=self.info, rename=None,
                                                              names=self.names, problem=self._warn_once)
        out.handles = trackers
        self._dispatcher = Dispatcher(
            pipeline=pipe, info=self.info, egress=out, spool=self._spool_worker, seq_base=self._seq_base,
            inbox_size=options.queue_size,
            resume_wait=options.resume_wait if self.resume else None, warn_once=self._warn_once,
            doctor=self._doctor, found=self._found if self._doctor is not None else None)
        self._inbox = self._dispatcher.inbox
        self._spool_worker.thread.start()
        if self._link is not None:
            self._link.attach(trackers, learnt=lambda: (self.info.source, tuple(sorted(self.info.approximate.items()))),
                              finished=lambda: self._finished)
        else:
            for w in trackers:
                w.thread.start()
        self._dispatcher.thread.start()
        atexit.register(self._atexit)

    def _open_info(self, *, project: str | None, name: str | None, source: str, config: dict[str, Any] | None,
                   mappings: list[str] | None, options: LoggerOptions,
                   tags: dict[str, str] | None) -> tuple[Any, dict[str, Any], dict[str, Any], Any]:
        """The run's info (``self.info``) from what ``init`` was given and, on a resume, what the spool holds:
        returns the spool's scan, the config with its canonical names, the config the trackers are shown and the
        translator to canonical names."""
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
        extra: dict[str, Any] = {"names": self.names, "mappings": list(mappings) if mappings else None,
                                 "flush_interval": options.flush_interval}
        shown = cfg
        if self.resume and prev is not None and config is not None:
            shown, extra, said = resumed_config(prev, cfg, extra, scan.last_step, given=set(config))
            if said:
                self._warn_once("config-changed", said)
        self.info = RunInfo(name=name or (prev.name if prev else None) or self.run_id,
                            project=project or (prev.project if prev else None), run_id=self.run_id, config=shown,
                            tags=dict(tags or (prev.tags if prev else {}) or {}),
                            source=None if source == "auto" else source, names="canonical", extra=extra)
        return scan, cfg, shown, translator

    def _trackers(self, options: LoggerOptions, sinks: list[Any], built: list[Any], last_step: int | None,
                  mappings: list[str] | None) -> list[Any]:
        """The trackers' workers: in the writer process (``RemoteTracker`` handles, fed through ``self._link``)
        or in threads of this one, as ``LoggerOptions.writer`` and the trackers allow."""
        writer, why_thread = choose_writer(options.writer, sinks or [], built)
        if why_thread:
            self._warn_once("writer", why_thread)
        if writer == "process":
            from .remote import RemoteTracker, WriterLink
            by_locator = {s.locator(): s for s in built}
            spec = {"sinks": list(by_locator), "spool_path": str(self.spool_path), "seq_base": self._seq_base,
                    "resume": self.resume, "resume_last_step": last_step, "names": self.names,
                    "mappings": list(mappings) if mappings else None, "options": options.for_writer(),
                    "alerts": self._doctor is not None,
                    "run_id": self.run_id, "lock_path": str(self._runlock.path),
                    "drop_env": sorted({v for s in built for v in getattr(s, "process_env", ())})}
            try:
                self._link = WriterLink(spec, spool=self._spool_worker, lock_fd=self._runlock.fd,
                                        info=lambda: self._clean_info().to_json(), problems=self.problems)
            except (OSError, ValueError, RuntimeError) as exc:   # the platform cannot start it (no pass_fds ...)
                if options.writer == "process":
                    raise UsageError(f"LoggerOptions(writer='process'): the writer process could not start: "
                                     f"{exc}") from None
                self._warn_once("writer", f"the writer process could not start ({type(exc).__name__}: {exc}); "
                                          f"the trackers are written by threads of the training process")
                writer = "thread"
        if writer == "process":
            trackers: list[Any] = [RemoteTracker(loc, s) for loc, s in by_locator.items()]
            self._spool_worker.feed = self._link        # what the run learnt goes before each batch
        else:
            if options.writer != "thread":          # imported now, in this thread (see check_packages)
                for s in built:
                    check_packages(s.locator(), s)
            trackers = [TrackerWorker(self._ctx, s, queue_size=options.queue_size, batch_size=options.batch_size,
                                      rename=self._rename) for s in built]
        return trackers

    # -- public API ----------------------------------------------------------------------------------------------
    @property
    def _next_step(self) -> int:
        return self._dispatcher.next_step

    @property
    def _seq(self) -> int:
        return self._dispatcher.seq

    def log(self, metrics: dict[str, Any], step: int | None = None, weights: dict[str, Any] | None = None, *,
            axis: str | None = None) -> None:
        """Log one step's metrics. Returns as soon as the values are validated and queued.

        ``weights``: name -> how many items (tokens, sequences) this rank's value of that name is over; with
        ``init(merge_ranks=True)`` the ranks' values are merged by the name's reduction (:class:`trackbridge.Weighted`
        states another), otherwise each value is logged as it is.

        ``axis``: the name of the x axis ``step`` counts, for a run with several (slime's ``train/step`` and
        ``rollout/step``): the metrics are charted on that axis in every tracker, and the run's own step counter
        is not advanced.

        Raises ``TypeError`` for a non-dict, a non-string key or a non-integer ``step`` (or a non-string ``axis``, or
        ``axis`` with ``merge_ranks=True``), ``ValueError`` for a step outside 0 .. 2**53 - 1 (nothing is logged for
        that call), ``RuntimeError`` after ``finish()``. A value or name no tracker can store (an empty name, a lone
        surrogate, ...) is left out with a one-time warning naming it (see ``run.problems``); the other values of
        the call are logged.
        """
        wall_time = time.time()
        logged = time.monotonic()       # intervals (the spool's flush bound) never follow the wall clock
        if self._said:              # init(doctor=True): findings of earlier records, said here, in the caller's code
            self._say(user_frame())
        if self._ranks is not None:      # merge_ranks: to this rank's file; the merger feeds the inbox
            if axis is not None:
                raise TypeError("log(axis=...) is not supported with init(merge_ranks=True): the ranks' shares are "
                                "merged per step of the run's one step axis")
            self._ranks.log(metrics, step, weights, wall_time)
            return
        later: list[tuple[str, Any]] = []        # torch tensors: read in one batch, CUDA ones without a sync
        values, problems, step = validate_call(metrics, step, axis, defer=later)
        if problems:
            self._report_values(problems)
        if self._finished:
            raise RuntimeError(f"run {self.run_id!r}: log() after finish()")
        if later or self._device is not None:
            hand_off(self, later, (wall_time, step, values, axis, logged))     # logger/device.py
        else:
            self._inbox.put((wall_time, step, values, axis, logged))

    def finish(self, timeout: float | None = None, *, failed: bool = False) -> dict[str, Any]:
        """Flush every sink and close it (a failed sink is given one last chance to recover and catch up).
        ``failed=True`` records that training failed (MLflow FAILED, wandb exit code 1, ``outcome`` in the run
        info); leaving a ``with`` block by an exception, or the interpreter exiting on an uncaught one or through
        ``sys.exit(N)`` with N not 0, does it. Waits while the trackers make progress, at most ``timeout`` (default
        ``finish_timeout``) seconds, saying what it waits for after a few seconds; what a tracker still lacks is
        written beside the spool for ``trackbridge replay``. Ctrl-C or SIGTERM while it waits: the run is closed as
        killed as far as a few seconds allow, the note is written, then the interrupt goes on. Safe to call twice.
        Returns :meth:`status`."""
        return self._finish("failed" if failed else "finished", None, timeout)

    def _finish(self, outcome: str, exit_code: int | None, timeout: float | None) -> dict[str, Any]:
        with self._lock:
            if self._finished:
                return self.status
            self._finished = True
        try:
            atexit.unregister(self._atexit)
        except Exception:
            pass
        self._set_outcome(outcome, exit_code)
        previous = on_sigterm()
        try:
            self._finish_wait(timeout)
        except (KeyboardInterrupt, Terminated) as exc:
            restore_sigterm(previous)
            self._abort(exc)
            if isinstance(exc, Terminated):         # end as SIGTERM ends a process, now that the note is written
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(1.0)
                raise SystemExit(TERMINATED_EXIT) from None
            raise
        restore_sigterm(previous)
        self._runlock.release()
        self._ctx.ended.set()
        if self._said:              # the findings of the last records
            self._say(user_frame())
        return self.status

    def _found(self, finding: Any) -> None:
        """The dispatcher's hook for a new finding (its thread): ``should_stop`` at once, the rest (warning,
        ``on_finding``) at the next ``log()`` or ``finish()``, in the caller's thread and attributed to its code."""
        if self._stop_on is not None and severity_rank(finding.severity) <= severity_rank(self._stop_on):
            if not self.should_stop:
                self._stop_finding = finding
            self.should_stop = True
        self._said.append(finding)

    def _say(self, frame: Any) -> None:
        from ..doctor import warn_finding
        while self._said:
            f = self._said.popleft()
            warn_finding(f, frame)
            if self._on_finding is not None:
                try:
                    self._on_finding(f)
                except Exception as exc:        # the user's callback: said once, logging goes on
                    self._warn_once("on_finding", f"LoggerOptions(on_finding=...) raised {type(exc).__name__}: {exc} "
                                                  f"(for the finding {f.id}); logging goes on")

    def _set_outcome(self, outcome: str, exit_code: int | None) -> None:
        self.info.extra["outcome"] = outcome
        for w in self._workers:
            w.sink.outcome = outcome
            w.sink.exit_code = exit_code

    def _finish_wait(self, timeout: float | None) -> None:
        limit = self.options.finish_timeout if timeout is None else max(0.0, float(timeout))
        if self._device is not None:     # the device tensors logged so far, read back
            self._device.close(limit)
        if self._ranks is not None:      # merge_ranks: the other ranks' last steps first
            self._ranks.finish(time.monotonic() + limit)
        self._inbox.put(STOP)
        end = time.monotonic() + limit
        self._dispatcher.thread.join(max(0.0, end - time.monotonic()))
        self._spool_worker.thread.join(max(0.0, end - time.monotonic()))
        if self._link is not None:
            sink = self._workers[0].sink
            self._link.stop(self._seq - 1, sink.outcome, sink.exit_code)
        # wait for every tracker while it makes progress (records written or caught up, or requests answered, as
        # the sink counts them); one that makes none for stall_timeout seconds (a hung or unreachable server) is
        # left behind: what it lacks is written down for `trackbridge replay`
        wait_for_trackers(self._workers[1:], end=end, stall_timeout=self.options.stall_timeout,
                          left=lambda w: w.left(self._seq - 1), say=lambda m: log.warning("trackbridge: %s", m),
                          finish_timeout=self.options.finish_timeout if timeout is None else timeout)
        if self._link is not None:
            self._link.close(end)
        self._write_pending()

    def _abort(self, exc: BaseException) -> None:
        """finish() interrupted (Ctrl-C, SIGTERM): close the run as killed as far as :data:`ABORT_WAIT` seconds
        allow (the spool first), write down what each tracker lacks, and let the writer process go."""
        ignored = ignore_interrupts()
        try:
            code = INTERRUPTED_EXIT if isinstance(exc, KeyboardInterrupt) else TERMINATED_EXIT
            self._set_outcome("killed", code)
            end = time.monotonic() + ABORT_WAIT
            self._dispatcher.thread.join(max(0.0, end - time.monotonic()))
            self._spool_worker.thread.join(max(0.0, end - time.monotonic()))
            if self._link is not None:
                self._link.abort("killed", code)
                self._link.close(end + 2.0)
            else:
                for w in self._workers[1:]:
                    w.stop()
            self._write_pending(interrupted=True)
            self._runlock.release()
            self._ctx.ended.set()
        finally:
            restore_interrupts(ignored)

    @property
    def findings(self) -> list[Any]:
        """With ``init(doctor=True)``: every finding of the diagnostic checks so far, ordered by what to look at
        first (complete after :meth:`finish`), each naming the keys ``log()`` was given; ``[]`` otherwise."""
        if self._doctor is None:
            return []
        from ..doctor import name_findings
        found: list[Any] = self._doctor.finish(dict(self.info.approximate))
        name_findings(found, dict(self._dispatcher.user_names))
        return found

    @property
    def status(self) -> dict[str, Any]:
        """Run id, spool path, per sink: state (ok/behind/failed/closed, ``restarting`` while the writer process
        is started again), records written, caught up, queued, failures, last error; and the writer process (its
        pid, how often it was started again; None with threads)."""
        return {"run_id": self.run_id, "spool": str(self.spool_path), "finished": self._finished,
                "logged": self._seq - self._seq_base, "sinks": [w.status() for w in self._workers],
                "writer": self._link.status() if self._link is not None else None,
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
        if exc_type is None or (issubclass(exc_type, SystemExit) and exc.code in (None, 0)):
            self._finish("finished", None, None)
        elif issubclass(exc_type, KeyboardInterrupt):
            self._finish("killed", INTERRUPTED_EXIT, None)
        else:
            self._finish("failed", None, None)

    # -- internals -------------------------------------------------------------------------------------------
    def _exit_hook_last(self) -> None:
        """Register the run's exit hook again after a tracker's client opened in this process: exit hooks run last
        registered first, and a client's own (wandb tears its service down) must not run before the run closes its
        trackers at interpreter exit."""
        if not self._finished:
            atexit.unregister(self._atexit)
            atexit.register(self._atexit)

    def _atexit(self) -> None:
        try:
            outcome, code = exits.outcome_at_exit()
            self._finish(outcome, code, 60.0)
        except Exception:
            pass

    def _write_pending(self, *, interrupted: bool = False) -> None:
        """After finish(): the pending note of the trackers left behind (:func:`.pending.note_left`)."""
        pending.note_left(self._workers[1:], seq=self._seq, spool_path=self.spool_path, run_id=self.run_id,
                          rename=self._rename, spool=self._spool_worker, problems=self.problems,
                          interrupted=interrupted, wait=ABORT_WAIT)

    def _clean_info(self) -> RunInfo:
        """A copy of the run info that every sink can store (:func:`.runinfo.clean_info`); each change said once."""
        info, notes = clean_info(self.info, self._flat_configs)
        for key, message in notes:
            self._warn_once(f"config:{key}", message)
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

