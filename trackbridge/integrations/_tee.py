"""What every wrapper shares: a trackbridge run opened lazily, a tee that never breaks the wrapped call, unwrap.

A wrapper first lets the wrapped logger do exactly what it did before (its return value and its exceptions reach the
caller unchanged), then hands the same values to trackbridge. A failure on the trackbridge side is reported once as
a :class:`~trackbridge.logger.LoggerWarning` and never reaches the training loop.
"""
from __future__ import annotations

import threading
import warnings
from typing import Any, Protocol

from ..logger import LoggerWarning
from ..record.values import as_step


class RunLike(Protocol):
    """What a wrapper needs of the trackbridge run it writes to (what ``trackbridge.init`` returns, ``Run`` or
    ``NoOpRun``, or a run passed as ``run=``)."""

    @property
    def run_id(self) -> str | None: ...

    @property
    def status(self) -> dict[str, Any]: ...

    def log(self, metrics: dict[str, Any], step: int | None = None, *, axis: str | None = None) -> None: ...

    def finish(self, timeout: float | None = None, *, failed: bool = False) -> dict[str, Any]: ...


class Tee:
    """A trackbridge run fed from a wrapped logger.

    ``run``: an existing trackbridge run to write to (it is not finished by :meth:`unwrap`); otherwise the run is
    opened with ``trackbridge.init(**init_options)`` on the first record (so that the wrapped logger's own project,
    name and config can be used as defaults) and finished by :meth:`unwrap`/:meth:`finish`.
    """

    kind = "logger"

    def __init__(self, *, run: RunLike | None = None, **init_options: Any) -> None:
        self._run = run
        self._owns_run = run is None
        self._init_options = {k: v for k, v in init_options.items() if v is not None}
        for spec in self._init_options.get("sinks") or []:
            if isinstance(spec, str):       # a mistyped sink fails here, at wrap(), not later inside training
                from ..trackers import make_sink
                make_sink(spec)
        self._lock = threading.RLock()
        self._warned: set[str] = set()
        self.active = True
        self.skipped: dict[str, str] = {}   # key -> type of a value trackbridge does not take (wandb media, ...)

    # -- the trackbridge run ---------------------------------------------------------------------------------------
    def defaults(self) -> dict[str, Any]:
        """init() options taken from the wrapped logger (project, name, config); the user's options win."""
        return {}

    @property
    def run(self) -> RunLike:
        """The trackbridge run (opened on first access; after a finish, the finished run until the next record)."""
        with self._lock:
            if self._run is None:
                from ..logger import LoggerOptions, init
                self._run = init(**LoggerOptions.fold({**self.defaults(), **self._init_options}))
            return self._run

    def _live_run(self) -> RunLike:
        """The run to log to: a run this wrapper finished is reopened with ``resume=True`` (same run id)."""
        with self._lock:
            run = self.run
            if self._owns_run and getattr(run, "_finished", False):
                from ..logger import LoggerOptions, init
                opts = {**self.defaults(), **self._init_options, "run_id": run.run_id, "resume": True}
                self._run = run = init(**LoggerOptions.fold(opts))
            return run

    @property
    def opened(self) -> bool:
        """Whether the trackbridge run was opened (or given as ``run=``)."""
        return self._run is not None

    def emit(self, metrics: dict[str, Any], step: Any = None, *, axis: str | None = None) -> None:
        """Log one record through trackbridge (``axis``: the step metric ``step`` is the value of, for a run with
        several x axes); problems become one warning each, never an exception."""
        if not metrics:
            return
        try:
            self._live_run().log(metrics, step=as_step(step), axis=axis)
        except Exception as exc:   # the wrapped logger already did its job: never break training
            self.warn_once(type(exc).__name__, f"trackbridge: the {self.kind} wrapper could not log a record "
                                               f"({type(exc).__name__}: {exc}); the original logger is unaffected")

    def warn_once(self, key: str, message: str) -> None:
        """Issue ``message`` as a LoggerWarning, once per ``key`` for this wrapper."""
        if key not in self._warned:
            self._warned.add(key)
            warnings.warn(message, LoggerWarning, stacklevel=3)

    # -- lifecycle -------------------------------------------------------------------------------------------------
    def flush(self) -> None:
        """Send what is buffered (a wandb row not yet committed, SummaryWriter values of the current step)."""

    def restore(self) -> None:
        """Put the original logger back (subclasses)."""

    def finish(self) -> dict[str, Any] | None:
        """Flush and finish the trackbridge run (when this wrapper opened it). The wrapper stays installed."""
        with self._lock:
            try:
                self.flush()
            except Exception as exc:
                self.warn_once("flush", f"trackbridge: flushing the {self.kind} wrapper failed: {exc}")
            if self._run is not None and self._owns_run:
                return self._run.finish()
        return None

    def unwrap(self, finish: bool = True) -> dict[str, Any] | None:
        """Restore the original logger, flush, and (``finish=True``, when this wrapper opened the run) finish the
        trackbridge run. Returns the run's status. Safe to call twice."""
        with self._lock:
            if self.active:
                self.active = False
                self.restore()
            try:
                self.flush()
            except Exception as exc:
                self.warn_once("flush", f"trackbridge: flushing the {self.kind} wrapper failed: {exc}")
            if finish and self._run is not None and self._owns_run:
                return self._run.finish()
            return self._run.status if self._run is not None else None

    def __enter__(self) -> "Tee":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.unwrap()


__all__ = ["RunLike", "Tee", "as_step"]
