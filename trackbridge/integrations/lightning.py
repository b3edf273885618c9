"""``TrackBridgeLogger``: a PyTorch Lightning ``Logger`` writing through trackbridge.

One line in a Lightning script::

    from trackbridge.integrations.lightning import TrackBridgeLogger
    trainer = lightning.Trainer(logger=TrackBridgeLogger(project="rm", sinks=["tensorboard:runs/tb"]))

(beside other loggers too: ``logger=[CSVLogger(...), TrackBridgeLogger(...)]``). It takes the options of
:func:`trackbridge.init` (``project``, ``name``, ``sinks``, ``source``, ``names``, ``spool``, ``run_id`` ...) or
``run=`` an open trackbridge run.

* **Records**: every ``log_metrics(metrics, step)`` Lightning makes (what ``self.log(...)`` gathered, with its
  ``epoch``) is one trackbridge record at ``step`` (``trainer.global_step``). ``source`` defaults to ``"auto"``, as in
  :func:`trackbridge.init`; ``source="canonical"`` keeps your names as they are.
* **Config**: ``log_hyperparams`` (``save_hyperparameters()``, the datamodule's) becomes the run's config; the run
  opens at the first record, so hyperparameters logged before it are in the config (later ones are a warning).
* **Outcome**: ``finalize(status)`` finishes the run: ``"success"``/``"finished"`` -> finished (MLflow FINISHED,
  wandb exit code 0), ``"failed"`` (Lightning's status when ``fit`` raised) -> failed (MLflow FAILED, wandb exit
  code 1). A later ``trainer.validate()``/``test()`` continues the same run (``resume=True``).
* **Ranks**: only global rank zero writes (``log_*`` and ``finalize`` are ``rank_zero_only``; ``experiment`` is
  Lightning's dummy experiment on the other ranks).
* ``experiment`` is the trackbridge run (``logger.experiment.summary()``); ``name`` is the run's name (``project``
  when no name, else ``"trackbridge"``) and ``version`` its run id (fixed when the logger is made).
"""
from __future__ import annotations

import time
import uuid
from argparse import Namespace
from typing import Any, Mapping

from ..extras import require
from ._tee import RunLike, Tee

require(("lightning",), "lightning", __name__)  # one line naming the extra rather than a bare ModuleNotFoundError

from lightning.fabric.utilities.logger import _convert_params, _sanitize_callable_params  # noqa: E402
from lightning.pytorch.loggers.logger import Logger, rank_zero_experiment  # noqa: E402
from lightning.pytorch.utilities.rank_zero import rank_zero_only  # noqa: E402

#: Lightning's ``finalize`` statuses -> the run's outcome
FAILED_STATUSES = frozenset({"failed", "failure", "error", "interrupted"})


def _plain(value: Any, depth: int = 0) -> Any:
    """A JSON-friendly copy of a hyperparameter (tensors and other objects as strings)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if depth < 4 and isinstance(value, Mapping):
        return {str(k): _plain(v, depth + 1) for k, v in value.items()}
    if depth < 4 and isinstance(value, (list, tuple)):
        return [_plain(v, depth + 1) for v in value]
    item = getattr(value, "item", None)
    if callable(item) and getattr(value, "numel", lambda: 2)() == 1:
        try:
            return item()
        except Exception:
            pass
    return str(value)


class TrackBridgeLogger(Logger):
    """A Lightning ``Logger`` writing every ``log_metrics`` through trackbridge (see the module docstring)."""

    def __init__(self, project: str | None = None, name: str | None = None, sinks: list[Any] | None = None, *,
                 run: RunLike | None = None, config: dict[str, Any] | None = None, **init_options: Any) -> None:
        super().__init__()
        run_id = getattr(run, "run_id", None) if run is not None else init_options.pop("run_id", None)
        if run_id is None:          # the version Lightning may ask for before the first record
            run_id = time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]
        self._run_id = str(run_id)
        self._project, self._name = project, name
        self._config: dict[str, Any] = dict(config or {})
        self._tee = _LoggerTee(self, run=run, project=project, name=name, sinks=sinks,
                               **({} if run is not None else {"run_id": self._run_id}), **init_options)
        self._tee.kind = "Lightning logger"
        self.outcome: str | None = None        # "finished" / "failed" once finalize() ran

    # -- what Lightning asks -----------------------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self._name or self._project or "trackbridge"

    @property
    def version(self) -> str:
        return self._run_id

    @property
    @rank_zero_experiment
    def experiment(self) -> RunLike:
        """The trackbridge run. Before the first record it is a stand-in that opens the run when used (Lightning
        touches ``experiment`` in its setup hook, before ``log_hyperparams``: the config must still make it in)."""
        if self._tee.opened:
            return self._tee.run
        return _Deferred(self._tee)

    @rank_zero_only
    def log_hyperparams(self, params: dict[str, Any] | Namespace, *args: Any, **kwargs: Any) -> None:
        """Keep the hyperparameters: they become the run's config when it opens (at the first record)."""
        values = _plain(dict(_sanitize_callable_params(_convert_params(params)) or {}))
        changed = any(k not in self._config or self._config[k] != v for k, v in values.items())
        self._config.update(values)
        if changed and self._tee.opened:        # (trainer.validate() after fit() logs the same ones again)
            self._tee.warn_once("late-config", "trackbridge: log_hyperparams() after the first log_metrics(); the "
                                               "run's configuration was already written")

    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        """One trackbridge record at ``step`` (never raises; problems are warnings)."""
        self._tee.emit(dict(metrics), step)

    @rank_zero_only
    def finalize(self, status: str) -> None:
        """Finish the trackbridge run with Lightning's outcome (``"failed"`` -> failed; else finished)."""
        failed = str(status).lower() in FAILED_STATUSES
        self.outcome = "failed" if failed else "finished"
        tee = self._tee
        if tee._run is None or not tee._owns_run or getattr(tee._run, "_finished", False):
            return
        try:
            tee._run.finish(failed=failed)
        except Exception as exc:        # never turn the end of training into an error
            tee.warn_once("finish", f"trackbridge: finishing the run failed ({type(exc).__name__}: {exc})")


class _Deferred:
    """``logger.experiment`` before the run opened: the run, opened at the first use of one of its attributes."""

    def __init__(self, tee: Tee) -> None:
        self._tee = tee

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._tee.run, attr)

    def __repr__(self) -> str:
        return "<trackbridge run, opened at its first use or the first record>"


class _LoggerTee(Tee):
    def __init__(self, owner: TrackBridgeLogger, **kw: Any) -> None:
        super().__init__(**kw)
        self._owner = owner

    def defaults(self) -> dict[str, Any]:
        return {"config": dict(self._owner._config)} if self._owner._config else {}


__all__ = ["FAILED_STATUSES", "TrackBridgeLogger"]
