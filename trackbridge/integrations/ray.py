"""``trackbridge.integrations.ray.setup``: a Ray ``worker_process_setup_hook`` that makes the loggers a framework
uses *inside its Ray actors* (veRL's ``TaskRunner``, OpenRLHF's ``PPOTrainer``) also write to every trackbridge
tracker, without a change to the framework::

    ray.init(runtime_env={
        "worker_process_setup_hook": "trackbridge.integrations.ray.setup",
        "env_vars": {"TRACKBRIDGE_SINKS": "tensorboard:/abs/runs/tb,mlflow:sqlite:////abs/runs/mlflow.db",
                     "TRACKBRIDGE_SPOOL": "/abs/runs/spool", "TRACKBRIDGE_SOURCE": "verl"}})

``trackbridge.wrap(wandb)`` in the driver cannot do it: the logging happens in another process. Ray runs the hook
in every worker process it starts for the job (the ``env_vars`` reach them all); there it

* wraps, when (and only when) the process imports them: the ``wandb`` module (as ``trackbridge.wrap(wandb)``),
  torch's and tensorboardX's ``SummaryWriter`` class (as ``trackbridge.wrap(SummaryWriter)``) and veRL's
  ``verl.utils.tracking.Tracking`` (its ``log`` as ``trackbridge.wrap(Tracking.log)``; its ``__init__`` gives the
  run's project, name and config). A process that imports none of them is not touched beyond the import hook, and
  no trackbridge run is opened by an actor that logs nothing: the run opens at the first logged record.
* **One feed per process**: frameworks write the same values to several loggers (veRL's ``Tracking`` to wandb *and*
  TensorBoard, OpenRLHF's ``PPOTrainer`` to ``WandbLogger`` and ``TensorboardLogger``), so the process's run takes
  the records of the first wrapped logger that logs, and of it alone: veRL's ``Tracking`` when it is used (the
  wandb and SummaryWriter calls made inside ``Tracking.log`` are its own), else wandb or a SummaryWriter, whichever
  logs first. Nothing is doubled; the other loggers keep writing their own files as before.
  ``TRACKBRIDGE_TEE=wandb`` (a comma list of ``verl``, ``wandb``, ``tensorboard``) restricts the choice.
* **Ranks**: the run is opened with ``trackbridge.init``'s rank support: a process whose ``RANK`` (``LOCAL_RANK``,
  ...) is not 0 gets a run that writes nothing, so the workers of a worker group do not each open a run. The run id
  is ``TRACKBRIDGE_RUN_ID``, else one made when the run opens; a second process of the job opening the same run id
  is refused by the run claim (one process writes a run) and says so once, its own loggers unaffected.
* **The run finishes** when the feed's logger finishes: ``wandb.finish()`` (``exit_code`` not 0: failed),
  ``SummaryWriter.close()``, veRL's ``Tracking.finish()`` (which its ``__del__`` calls when ``fit()`` returns).
  Ray ends an actor hard once the driver is done (``ray.shutdown()``, the driver exiting: no exit hook runs), so
  this is what closes the trackers before the method that trained returns. Logging after that reopens the same
  run (``resume=True``).
* **Exit**: an actor that exits (``ray.actor.exit_actor()``, its handle released, the process ending) finishes the
  run at interpreter exit, after sending the row or step a logger still buffered, with the outcome the logger
  reads from the exit (finished, or failed after an exception). **SIGTERM** (what the raylet sends a worker it
  stops, or ``kill PID``): the run is finished with the outcome ``killed`` (MLflow ``KILLED``, wandb exit code 143)
  and Ray's own handler then ends the process; during ``finish()`` itself the logger's interrupted finish writes
  what each tracker lacks beside the spool. **SIGKILL** and ``ray.kill(actor)`` (which ends the process without
  an exit hook) leave the spool, complete up to about ``flush_interval`` seconds before the kill:
  ``trackbridge replay SPOOL --to SINK`` completes each tracker and records the outcome ``killed`` (the run's
  claim was left by a process that is gone).

Settings, from the environment of the worker process (``runtime_env["env_vars"]``):

``TRACKBRIDGE_SINKS``      sink locators, comma-separated (or a JSON list); absolute paths (a worker's cwd is Ray's)
``TRACKBRIDGE_SPOOL``      the spool folder (default ``runs``, relative to the worker's cwd: give an absolute path)
``TRACKBRIDGE_SOURCE``     the framework naming (``verl``, ``openrlhf``; default ``auto``)
``TRACKBRIDGE_NAMES``      the naming the trackers get (default ``canonical``)
``TRACKBRIDGE_RUN_ID``, ``TRACKBRIDGE_PROJECT``, ``TRACKBRIDGE_NAME``   (default: the logger's project and name)
``TRACKBRIDGE_CONFIG``     a JSON object laid over the logger's config (nested keys merged)
``TRACKBRIDGE_MAPPINGS``   mapping files, comma-separated
``TRACKBRIDGE_TEE``        which loggers may feed the run (default ``verl,wandb,tensorboard``)
``TRACKBRIDGE_WRITER``     ``auto`` (default), ``process`` or ``thread``: see ``trackbridge.LoggerOptions(writer=)``
``TRACKBRIDGE_WANDB_NAMES`` ``original`` (default) or ``translated``: what wandb itself receives

Where the framework calls ``ray.init`` itself only when Ray is not initialised (OpenRLHF 0.11's ``train_ppo_ray``,
veRL's ``main_ppo``), ``python -m trackbridge.integrations.ray MODULE ARGS...`` (:func:`main`) starts Ray with the
hook and this environment's ``TRACKBRIDGE_*`` variables first, then runs the module. On a running cluster,
``ray job submit --runtime-env-json '{"worker_process_setup_hook": ..., "env_vars": {...}}'`` gives the job the hook
(Ray merges it with the entrypoint's own ``ray.init(runtime_env=...)``, env_vars key by key).

The hook never raises into Ray's worker start: a setting it cannot use is a warning, and the loggers work as before.
Importing this module imports neither Ray nor any tracker.
"""
from __future__ import annotations

import atexit
import importlib.abc
import json
import os
import signal
import sys
import threading
import types
import warnings
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from ..logger.common import LoggerWarning
from ._env import merged, parse_list, parse_sinks
from .ray_wrappers import ENV_PREFIX, _RayWandb, _RayWriter, _wrap_tracking

KINDS = ("verl", "wandb", "tensorboard")
TERMINATED_EXIT = 143        # 128 + SIGTERM, as the logger records it

#: module imported -> what to wrap in it (the hook runs after the module's own code)
WATCHED = {"wandb": "wandb", "torch.utils.tensorboard.writer": "tensorboard", "tensorboardX.writer": "tensorboard",
           "verl.utils.tracking": "verl"}

_STATE: "Coordinator | None" = None
_SETUP_LOCK = threading.Lock()


def setup() -> None:
    """The ``worker_process_setup_hook``: install trackbridge's wrappers in this worker process (see the module
    docstring). Safe to call more than once, and outside Ray (a plain process is set up the same way)."""
    global _STATE
    with _SETUP_LOCK:
        if _STATE is not None:
            return
        try:
            _STATE = Coordinator(options_from_env(os.environ))
            _STATE.install()
        except Exception as exc:             # never break the worker's start
            _warn(f"trackbridge.integrations.ray.setup: not installed ({type(exc).__name__}: {exc}); the loggers "
                  f"work as before")


def state() -> "Coordinator | None":
    """This process's coordinator (None before :func:`setup`)."""
    return _STATE


def _warn(message: str) -> None:
    warnings.warn(message, LoggerWarning, stacklevel=3)


def options_from_env(env: Any) -> dict[str, Any]:
    """The hook's settings from ``TRACKBRIDGE_*`` variables (see the module docstring). Raises ``ValueError`` for a
    value it cannot read (``TRACKBRIDGE_CONFIG`` not a JSON object, an unknown ``TRACKBRIDGE_TEE`` kind)."""
    get = lambda name, default=None: (env.get(ENV_PREFIX + name) or default)   # noqa: E731
    config = None
    if get("CONFIG"):
        config = json.loads(get("CONFIG"))
        if not isinstance(config, dict):
            raise ValueError(f"{ENV_PREFIX}CONFIG must be a JSON object, got {get('CONFIG')!r}")
    tee = parse_list(get("TEE", ""), ENV_PREFIX + "TEE") or list(KINDS)
    unknown = [t for t in tee if t not in KINDS]
    if unknown:
        raise ValueError(f"{ENV_PREFIX}TEE: unknown logger(s) {unknown}; expected some of {', '.join(KINDS)}")
    return {"sinks": parse_sinks(get("SINKS", "")), "spool": get("SPOOL", "runs"), "source": get("SOURCE", "auto"),
            "names": get("NAMES", "canonical"), "run_id": get("RUN_ID"), "project": get("PROJECT"),
            "name": get("NAME"), "config": config,
            "mappings": parse_list(get("MAPPINGS", ""), ENV_PREFIX + "MAPPINGS") or None,
            "tee": tuple(tee), "writer": get("WRITER")}


# ------------------------------------------------------------------------------------------------ after an import
class _AfterImport(importlib.abc.MetaPathFinder):
    """Calls ``callback(module)`` once a watched module has been imported (after its own code ran)."""

    def __init__(self, callback: Callable[[types.ModuleType], None], names: dict[str, str]) -> None:
        self.callback = callback
        self.names = names

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname not in self.names:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        exec_module = getattr(loader, "exec_module", None)
        if exec_module is None:
            return spec
        callback = self.callback

        def run_then_wrap(module: types.ModuleType) -> None:
            try:
                exec_module(module)
            finally:
                try:
                    delattr(loader, "exec_module")  # the loader's own method again
                except AttributeError:
                    pass
            callback(module)

        try:
            setattr(loader, "exec_module", run_then_wrap)   # this module's loader only (an instance attribute)
        except (AttributeError, TypeError):
            return spec
        return spec


# ------------------------------------------------------------------------------------------------ the shared run
class SharedRun:
    """The process's trackbridge run, as every wrapper's ``run=``: opened with ``trackbridge.init`` at the first
    record (the settings, and the feed's project, name and config), reopened with ``resume=True`` after a finish."""

    def __init__(self, coord: "Coordinator") -> None:
        self.coord = coord
        self.inner: Any = None
        self.refused: str | None = None
        self.finishing = False
        self._lock = threading.RLock()

    @property
    def run_id(self) -> str | None:
        return getattr(self.inner, "run_id", None)

    @property
    def status(self) -> dict[str, Any]:
        return dict(self.inner.status) if self.inner is not None else {}

    @property
    def info(self) -> Any:
        return getattr(self.inner, "info", None)

    @property
    def names(self) -> str:
        return getattr(self.inner, "names", None) or self.coord.options["names"]

    def _open(self) -> Any:
        with self._lock:
            if self.refused is not None:
                return None
            if self.inner is not None and not getattr(self.inner, "_finished", False):
                return self.inner
            from ..logger import LoggerOptions, init
            opts = self.coord.init_options()
            if self.inner is not None:
                opts.update(run_id=self.inner.run_id, resume=True)
            try:
                self.inner = init(**LoggerOptions.fold(opts))
            except Exception as exc:
                self.refused = f"{type(exc).__name__}: {exc}"
                _warn(f"trackbridge (Ray worker pid {os.getpid()}): the run could not be opened ({self.refused}); "
                      f"this process's loggers work as before, without trackbridge")
                return None
            self.coord.opened(self.inner)
            return self.inner

    def log(self, metrics: dict[str, Any], step: int | None = None, *, axis: str | None = None) -> None:
        run = self._open()
        if run is not None:
            run.log(metrics, step=step, axis=axis)

    def finish(self, timeout: float | None = None, *, failed: bool = False, outcome: str | None = None,
               exit_code: int | None = None) -> dict[str, Any]:
        """Finish the run (``outcome``: ``finished``/``failed``/``killed`` as the logger records it)."""
        with self._lock:
            run = self.inner
            if run is None or getattr(run, "_finished", False):
                return self.status
            self.finishing = True
            try:
                closer = getattr(run, "_finish", None)
                if outcome is not None and callable(closer):        # Run: the outcome as the logger records it
                    return dict(closer(outcome, exit_code, timeout))
                return dict(run.finish(timeout, failed=failed or outcome == "failed"))
            finally:
                self.finishing = False


# ------------------------------------------------------------------------------------------------ the coordinator
class Coordinator:
    """What :func:`setup` installs in one process: the import hook, the wrappers, the feed, exit and SIGTERM."""

    def __init__(self, options: dict[str, Any]) -> None:
        self.options = options
        self.feed: str | None = None
        self.handles: dict[str, Any] = {}          # module name -> wrapper handle
        self.verl_defaults: dict[str, Any] = {}
        self.shared = SharedRun(self)
        self.killed = False
        self._local = threading.local()
        self._lock = threading.RLock()
        self._exit_registered = False
        self._sigterm_installed = False
        self._finder: _AfterImport | None = None

    # -- installing ---------------------------------------------------------------------------------------------------
    def install(self) -> None:
        names = {m: k for m, k in WATCHED.items() if k in self.options["tee"]}
        self._finder = _AfterImport(self.wrap_module, names)
        sys.meta_path.insert(0, self._finder)
        for name in names:
            mod = sys.modules.get(name)
            if mod is not None:
                self.wrap_module(mod)

    def wrap_module(self, module: types.ModuleType) -> None:
        """Wrap what ``module`` (one of :data:`WATCHED`) holds; a failure is a warning, the module is unchanged."""
        name = module.__name__
        with self._lock:
            if name in self.handles:
                return
            try:
                kind = WATCHED[name]
                if kind == "wandb":
                    self.handles[name] = _RayWandb(module, coord=self)
                elif kind == "tensorboard":
                    self.handles[name] = _RayWriter(module.SummaryWriter, coord=self)
                else:
                    self.handles[name] = _wrap_tracking(module.Tracking, self)
            except Exception as exc:
                _warn(f"trackbridge: could not wrap {name} ({type(exc).__name__}: {exc}); it works as before")

    def uninstall(self) -> None:
        """Remove the import hook and every wrapper (the shared run is finished)."""
        if self._finder is not None and self._finder in sys.meta_path:
            sys.meta_path.remove(self._finder)
        for handle in list(self.handles.values()):
            try:
                handle.unwrap(finish=False)
            except Exception:
                pass
        self.handles.clear()
        self.shared.finish()

    # -- which logger feeds the run ------------------------------------------------------------------------------------
    @contextmanager
    def inside_tracking(self) -> Iterator[None]:
        """While veRL's Tracking calls its backends: their wrapped calls are Tracking's own, not a feed."""
        self._local.depth = getattr(self._local, "depth", 0) + 1
        try:
            yield
        finally:
            self._local.depth -= 1

    def allows(self, kind: str) -> bool:
        """Whether a record from a logger of ``kind`` goes to the run: the first kind that logs is the feed."""
        if kind not in self.options["tee"]:
            return False
        depth: int = getattr(self._local, "depth", 0)
        if kind != "verl" and depth:
            return False
        with self._lock:
            if self.feed is None:
                self.feed = kind
            return self.feed == kind

    def handle_of(self, kind: str | None) -> Any:
        return next((h for h in self.handles.values() if getattr(h, "ray_kind", None) == kind), None)

    def tracker_finished(self, kind: str, failed: bool = False) -> None:
        """The feed's logger finished (wandb.finish, SummaryWriter.close, Tracking.finish): finish the run; after a
        SIGTERM (Ray's exit drops the actor, whose loggers' ``__del__`` finish them) as killed."""
        if kind != self.feed:
            return
        if self.killed:
            self.shared.finish(60.0, outcome="killed", exit_code=TERMINATED_EXIT)
        else:
            self.shared.finish(failed=failed)

    # -- the run's options -------------------------------------------------------------------------------------------
    def init_options(self) -> dict[str, Any]:
        o = self.options
        feed = self.verl_defaults if self.feed == "verl" else {}
        if self.feed not in (None, "verl"):
            handle = self.handle_of(self.feed)
            try:
                feed = dict(handle.defaults()) if handle is not None else {}
            except Exception:
                feed = {}
        config = dict(feed.get("config") or {})
        if o["config"]:
            config = merged(config, o["config"])
        opts: dict[str, Any] = {"sinks": list(o["sinks"]), "spool": o["spool"], "source": o["source"],
                                "names": o["names"], "project": o["project"] or feed.get("project"),
                                "name": o["name"] or feed.get("name"), "config": config or None,
                                "run_id": o["run_id"], "mappings": o["mappings"]}
        if o["writer"]:
            opts["writer"] = o["writer"]
        return {k: v for k, v in opts.items() if v is not None}

    # -- exit and signals ----------------------------------------------------------------------------------------------
    def opened(self, run: Any) -> None:
        """The run just opened: finish it at interpreter exit (this hook runs before the run's own, so that the
        loggers' buffered rows go first) and on SIGTERM."""
        self._register_exit()
        ctx = getattr(run, "_ctx", None)
        if ctx is not None and callable(getattr(ctx, "opened", None)):
            # a tracker client opening in this process moves the run's exit hook last (logger/run.py): keep ours
            # after it, so that ours runs first
            theirs = ctx.opened

            def opened() -> None:
                theirs()
                self._register_exit()

            ctx.opened = opened
        self._install_sigterm()

    def _register_exit(self) -> None:
        atexit.unregister(self._at_exit)
        atexit.register(self._at_exit)
        self._exit_registered = True

    def _flush_feed(self) -> None:
        handle = self.handle_of(self.feed)
        if handle is not None:
            try:
                handle.flush()
            except Exception:
                pass

    def _at_exit(self) -> None:
        try:
            run = self.shared.inner
            if run is None or getattr(run, "_finished", False):
                return
            self._flush_feed()
            if self.killed:
                self.shared.finish(60.0, outcome="killed", exit_code=TERMINATED_EXIT)
            else:
                from ..logger import exits
                outcome, code = exits.outcome_at_exit()
                self.shared.finish(60.0, outcome=outcome, exit_code=code)
        except Exception:
            pass

    def _install_sigterm(self) -> None:
        """SIGTERM: record ``killed``, then whatever handled it before (Ray's worker raises SystemExit, so the exit
        hooks run). Only from the main thread (Python's rule); a run opened elsewhere is finished at exit only."""
        if self._sigterm_installed or threading.current_thread() is not threading.main_thread():
            return
        try:
            previous = signal.getsignal(signal.SIGTERM)
        except (ValueError, OSError):
            return
        coord = self

        def on_sigterm(signum: int, frame: Any) -> None:
            if previous is signal.SIG_IGN:
                return
            coord.killed = True
            run = coord.shared.inner
            if run is not None and coord.shared.finishing:
                from ..logger.exits import Terminated
                raise Terminated()       # finish() was running: the logger closes the run as killed
            if run is not None:
                try:
                    atexit.unregister(run._atexit)     # ours finishes it, as killed
                except Exception:
                    pass
                coord._register_exit()
            if callable(previous):
                previous(signum, frame)
                return
            raise SystemExit(TERMINATED_EXIT)          # the default action, through the exit hooks

        setattr(on_sigterm, "__trackbridge__", True)
        try:
            signal.signal(signal.SIGTERM, on_sigterm)
            self._sigterm_installed = True
        except (ValueError, OSError):
            pass


# ------------------------------------------------------------------------------------------------ after a SIGKILL
# `trackbridge replay SPOOL --to SINK` (trackbridge.sync.replay) completes each tracker and records the outcome killed
# when the run's process died without finishing it (trackbridge.logger.runlock.left_unfinished).


# ------------------------------------------------------------------------------------------------ the launcher
USAGE = """usage: python -m trackbridge.integrations.ray MODULE [ARGS...]

Start Ray with trackbridge's worker_process_setup_hook (and every TRACKBRIDGE_* variable of this environment as the
job's env_vars), then run MODULE as `python -m MODULE ARGS...` does. For a framework that calls ray.init() only when
Ray is not initialised (OpenRLHF's train_ppo_ray, veRL's main_ppo): its actors log through trackbridge. RAY_ADDRESS
connects to a running cluster instead of starting one. The driver process is set up too."""


def main(argv: list[str] | None = None) -> int:
    """``python -m trackbridge.integrations.ray MODULE [ARGS...]`` (see :data:`USAGE`)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "--":
        args = args[1:]
    if not args or args[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if args else 2
    module, rest = args[0], args[1:]
    env = {k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIX)}
    try:
        options_from_env(env)
    except ValueError as exc:
        print(f"trackbridge.integrations.ray: {exc}", file=sys.stderr)
        return 2
    import runpy

    import ray

    from trackbridge.integrations import ray as hook  # the module the workers import (this file may be __main__)
    ray.init(runtime_env={"worker_process_setup_hook": HOOK, "env_vars": env})
    hook.setup()
    sys.argv = [module, *rest]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
    return 0


HOOK = "trackbridge.integrations.ray.setup"

__all__ = ["Coordinator", "HOOK", "SharedRun", "main", "options_from_env", "setup", "state"]

if __name__ == "__main__":      # pragma: no cover - python -m trackbridge.integrations.ray
    sys.exit(main())
