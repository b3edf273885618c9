"""``Run``: what ``trackbridge.init`` returns on rank 0. It builds the sinks and their workers, takes ``log()``
calls, and at ``finish()`` waits for the trackers while they make progress, then writes down what any still lacks.

About 470 lines because ``Run`` is one object with one lifecycle (init with its run claim and resume rules, log,
finish with its outcome, its interruption and its pending note); what can stand alone lives beside it (checks,
dispatch, spool, tracker, runlock, exits, waiting, and the link to the writer process in remote)."""
from __future__ import annotations

import atexit
import collections
import copy
import dataclasses
import os
import signal
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from ..errors import UsageError
from ..extras import MissingExtra
from ..limits import tracker_cuts
from ..pipeline import names_translator
from ..record import RunInfo
from ..stream import read_stream, scan_stream, stream_file
from ..tracking.sink import Sink
from ..values import printable, sanitize_config
from . import exits
from .checks import (
    check_packages,
    choose_writer,
    config_changes,
    derive_hook,
    make_translator,
    precheck_location,
    ready_for_shutdown,
    validate_call,
)
from .common import INTERRUPTED_EXIT, STOP, TERMINATED_EXIT, RunView, log, user_frame, warn
from .device import hand_off
from .dispatch import Dispatcher, live_doctor, live_options, severity_rank
from .exits import Terminated, ignore_interrupts, on_sigterm, restore_interrupts, restore_sigterm
from .options import LoggerOptions
from .pending import Lack, count_lacking, countable, note_entry, pending_file, write_pending
from .runlock import RunLock
from .spool import SpoolFile, SpoolWorker, spool_place
from .tracker import TrackerWorker
from .waiting import wait_for_trackers
from .worker import RunContext, sync_run_info

ABORT_WAIT = 5.0            # seconds an interrupted finish() gives the writer process and the spool

_INFO_LOCK = threading.Lock()


def _closed_cleanly(w: Any) -> bool:
    """Whether a tracker's worker (a thread, or the writer process's view of one) closed its tracker with every
    record it was given."""
    alive = w.thread.is_alive() if isinstance(w, TrackerWorker) else getattr(w, "alive", False)
    return not alive and w.state == "closed"


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
        from ..locators import LocatorError
        from ..trackers import make_sink

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
            shown, extra = self._resumed_config(prev, cfg, extra, scan.last_step, given=set(config))
        self.info = RunInfo(name=name or (prev.name if prev else None) or self.run_id,
                            project=project or (prev.project if prev else None), run_id=self.run_id, config=shown,
                            tags=dict(tags or (prev.tags if prev else {}) or {}),
                            source=None if source == "auto" else source, names="canonical", extra=extra)
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
            except MissingExtra as exc:
                raise exc.about(f"sink {spec!r}") from None
            except (LocatorError, Exception) as exc:
                raise UsageError(f"sink {spec!r}: {exc}") from None
            check_packages(spec, sink, import_now=options.writer == "thread")   # the writer process imports its own
            ready_for_shutdown()
            if isinstance(spec, str):
                precheck_location(spec, sink)       # judged as migrate judges a destination, before training
            built.append(sink)
        # a sink that would write the spool's own file (the canonical stream in the spool folder) is the spool itself
        built = [s for s in built if not _writes(s, self.run_id, self.spool_path)]
        for line in tracker_cuts(shown, built):     # a tracker that keeps a value cut (trackbridge/limits.py)
            self._warn_once(f"cut:{line}", line)
        if self._doctor is not None:
            for s in built:             # a tracker with alerts of its own raises one per finding (wandb, Trackio)
                s.alerts = True
        precheck_location(str(spool), spool_sink)
        if self.resume and self.info.extra.get("config_changes") and prev is not None:
            spool_sink.new_header = True       # the spool records the change, as the trackers do

        # trackers get the names asked for through the same pipeline as replay and migrate, judged from the
        # source detected while logging and the approximations found so far (both live)
        self._rename = names_translator(self.names, mappings=mappings, config=cfg,
                                        origin=lambda: self.info.source, fidelity=self.info.approximate)
        ctx = RunContext(options=options, spool_path=self.spool_path, seq_base=self._seq_base, resume=self.resume,
                         resume_last_step=scan.last_step, tracker_info=self.tracker_info,
                         sync_info=self._sync_info, report=self.problems.append, opened=self._exit_hook_last)
        self._ctx = ctx
        self._spool_worker = ctx.spool = SpoolWorker(ctx, spool_sink, queue_size=options.queue_size,
                                                     batch_size=max(options.batch_size, 1000))
        writer, why_thread = choose_writer(options.writer, sinks or [], built)
        if why_thread:
            self._warn_once("writer", why_thread)
        if writer == "process":
            from .remote import RemoteTracker, WriterLink
            by_locator = {s.locator(): s for s in built}
            spec = {"sinks": list(by_locator), "spool_path": str(self.spool_path), "seq_base": self._seq_base,
                    "resume": self.resume, "resume_last_step": scan.last_step, "names": self.names,
                    "mappings": list(mappings) if mappings else None, "options": dataclasses.asdict(options),
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
            trackers = [TrackerWorker(ctx, s, queue_size=options.queue_size, batch_size=options.batch_size,
                                      rename=self._rename) for s in built]
        self._workers: list[Any] = [self._spool_worker, *trackers]
        self._dispatcher = Dispatcher(
            translator=translator, derive_fn=derive_fn, info=self.info,
            rename=None if self._link is not None else self._rename, names=self.names,
            spool=self._spool_worker, trackers=trackers, seq_base=self._seq_base,
            next_step=0 if scan.last_step is None else scan.last_step + 1, inbox_size=options.queue_size,
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
        if self._device is not None:     # the device tensors logged so far, read back
            self._device.close(self.options.finish_timeout if timeout is None else max(0.0, float(timeout)))
        if self._ranks is not None:      # merge_ranks: the other ranks' last steps first
            self._ranks.finish(time.monotonic() + (self.options.finish_timeout if timeout is None else
                                                   max(0.0, float(timeout))))
        self._inbox.put(STOP)
        end = time.monotonic() + (self.options.finish_timeout if timeout is None else max(0.0, float(timeout)))
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
        """After finish(): write down, beside the spool, which trackers lack which records (and say so), so that
        ``trackbridge replay SPOOL`` completes them; remove the note when nothing is left. Says whether the spool
        holds what they lack (it may not: a spool that could not be written). A tracker on this machine that was left
        behind is first stopped (threads: :attr:`~.worker.Worker.cut`; the writer process has ended), then what it
        lacks is counted against what it holds, read back with its own reader (:func:`.pending.count_lacking`):
        points and records, exactly; an interrupted finish(), a server or a tracker without a reader keep the
        worker's estimate (records after the last one it acknowledged)."""
        last_seq = self._seq - 1
        behind = [w for w in self._workers[1:] if not _closed_cleanly(w)]
        counted = {id(w) for w in behind if not interrupted and countable(w.sink.locator())}
        if behind and not interrupted:
            self._cut(behind, wait_for=counted)
        rows: list[tuple[Any, int, Lack | None]] = []
        for w in behind:
            lack = count_lacking(self.spool_path, w.sink.locator(), self.run_id, rename=self._rename) \
                if id(w) in counted else None
            if lack is not None:
                if lack.points:
                    rows.append((w, lack.records, lack))
            else:
                n = w.left(last_seq)
                if n:
                    rows.append((w, n, None))
        path = pending_file(self.spool_path)
        if not rows:
            if path.exists():
                try:
                    path.unlink()
                except OSError:
                    pass
            return
        spool = self._spool_worker
        where = (f"they are in the spool: trackbridge replay {self.spool_path}" if not spool.lost else
                 f"the spool lacks {spool.lost_records} of the run's records too (it could not be written), so "
                 f"trackbridge replay {self.spool_path} completes them only as far as the spool goes")
        entries = [note_entry(w, records=self._seq, left=n, lack=lack) for w, n, lack in rows]
        try:
            write_pending(path, self.run_id, entries)
        except OSError as exc:
            warn(f"trackbridge: could not write the pending note {path} ({exc}); what it would hold is in the "
                 f"warnings below")
        for w, n, lack in rows:
            state = "interrupted" if interrupted else w.state
            err = f"; last error: {w.last_error}" if w.last_error else ""
            if lack is not None:
                msg = (f"sink {w.name} lacks {lack.points:,} points in {n:,} of the run's {self._seq:,} records "
                       f"(counted against the {lack.held:,} points it holds, read back with its reader; from record "
                       f"{lack.first}; {state}{err}); {where}")
            else:
                msg = (f"sink {w.name} lacks {n} of the run's {self._seq} records (from record {w.acked + 1}; "
                       f"{state}{err}); {where}")
            self.problems.append(msg)
            warn(f"trackbridge: finish(): {msg}")

    def _cut(self, behind: list[Any], wait_for: set[int]) -> None:
        """Stop the tracker threads ``finish()`` gave up on (they write nothing more and close their trackers as far
        as they got), waiting at most :data:`ABORT_WAIT` seconds for those in ``wait_for`` (ids: the trackers on this
        machine, whose holdings are counted next; one hung in a request stays, and is counted while it may still
        land); a server's is not waited for."""
        threads = [w for w in behind if isinstance(w, TrackerWorker)]
        for w in threads:
            w.cut.set()
            w.stop()
        end = time.monotonic() + ABORT_WAIT
        for w in threads:
            if id(w) in wait_for:
                w.thread.join(max(0.0, end - time.monotonic()))

    def _resumed_config(self, prev: RunInfo, cfg: dict[str, Any], extra: dict[str, Any], last_step: int | None,
                        given: set[str] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
        """Resume with a config that differs from the run's: every tracker keeps the run's config (MLflow cannot
        change a param, so the others keep it too and all agree), and the change is recorded in the run info
        (``extra["config_changes"]``: the step it applies from and each changed, added or removed key), which every
        tracker stores with the run; said in one warning. Translation follows the new config from here on."""
        old, _ = sanitize_config(prev.config)
        new, _ = sanitize_config(cfg)
        # the canonical names translation adds to the config change with the user's keys: said once, by the user's
        change = config_changes(old, new, skip=set(cfg) - given if given is not None else set())
        extra = {**extra, "config_changes": list((prev.extra or {}).get("config_changes") or [])}
        if not change:
            if not extra["config_changes"]:
                del extra["config_changes"]
            return dict(prev.config), extra
        at = 0 if last_step is None else last_step + 1
        extra["config_changes"].append({"from_step": at, **change})
        shown = [f"{k}: {v[0]!r} -> {v[1]!r}" for k, v in list(change.get("changed", {}).items())[:5]]
        shown += [f"{k} added" for k in list(change.get("added", {}))[:3]]
        shown += [f"{k} removed" for k in list(change.get("removed", []))[:3]]
        n = sum(len(change.get(k) or ()) for k in ("changed", "added", "removed"))
        self._warn_once("config-changed",
                        f"resume: the config differs from the run's ({'; '.join(shown)}"
                        f"{f'; {n} keys in all' if n > len(shown) else ''}); every tracker keeps the run's config "
                        f"(a tracker's params cannot all be changed) and records the change in trackbridge's run info "
                        f"(config_changes, from step {at}); translation follows the new config")
        return dict(prev.config), extra

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

