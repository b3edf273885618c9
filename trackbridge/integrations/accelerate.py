"""``Accelerator(log_with=[TrackBridgeTracker(sinks=[...], source="trl-legacy")])``: an Accelerate tracker.

Legacy TRL ``PPOTrainer`` (v0.2.0-v0.11.4), DDPO/AlignProp and any script using ``accelerator.log`` send their
metrics through Accelerate's trackers; this one writes them to every trackbridge sink, translated, beside or instead of
``"wandb"``/``"tensorboard"``::

    from trackbridge.integrations.accelerate import TrackBridgeTracker
    tracker = TrackBridgeTracker(project="ppo", sinks=["tensorboard:runs/tb"], source="trl-legacy")
    accelerator = Accelerator(log_with=["wandb", tracker])
    accelerator.init_trackers("ppo", config=config.to_dict())

The trackbridge run opens at the first ``log()`` (so it carries the configuration Accelerate passes to
``store_init_configuration``; ``init_trackers`` gives it after the tracker was built) and is finished by ``finish()``
(``accelerator.end_training()``). Only the main process writes (``main_process_only = True``). ``tracker`` is the
trackbridge run. For legacy PPOTrainer pass ``project_kwargs``/``tracker_project_name`` as usual; the project is
``project=`` here (Accelerate does not pass its project name to trackers given as objects).

**By name**: importing this module registers the tracker under the name ``"trackbridge"`` (Accelerate's
``register_tracker_class``), so ``Accelerator(log_with="trackbridge")`` (or ``["wandb", "trackbridge"]``) works and
``init_trackers(project, config)`` builds it with ``project`` as the trackbridge project. Options not passed come
from the environment (:func:`options_from_env`: ``TRACKBRIDGE_SINKS``, ``TRACKBRIDGE_SPOOL``, ``TRACKBRIDGE_SOURCE``,
``TRACKBRIDGE_NAMES``, ``TRACKBRIDGE_PROJECT``, ``TRACKBRIDGE_NAME``, ``TRACKBRIDGE_RUN_ID``);
``init_trackers(..., init_kwargs={"trackbridge": {"sinks": [...]}})`` passes them in code and wins. Importing
``trackbridge`` alone registers nothing.
"""
from __future__ import annotations

from typing import Any

from ..extras import require
from ._env import ENV_OPTIONS, options_from_env, parse_sinks
from ._tee import RunLike, Tee

require(("accelerate",), "trl", __name__)       # one line naming the extra rather than a bare ModuleNotFoundError

from accelerate.tracking import GeneralTracker, on_main_process  # noqa: E402


class TrackBridgeTracker(GeneralTracker):
    """An Accelerate ``GeneralTracker`` writing to trackbridge; takes the options of :func:`trackbridge.init` or
    ``run=`` an open trackbridge run. Options not given (``None``) come from the ``TRACKBRIDGE_*`` environment
    variables (:func:`options_from_env`); ``env=False`` ignores them."""

    name = "trackbridge"
    requires_logging_directory = False
    main_process_only = True

    def __init__(self, project: str | None = None, name: str | None = None, sinks: list[Any] | None = None, *,
                 run: RunLike | None = None, env: bool = True, **init_options: Any) -> None:
        super().__init__()
        if env and run is None:
            given = {"project": project, "name": name, "sinks": sinks, **init_options}
            for option, value in options_from_env().items():
                if given.get(option) is None:
                    given[option] = value
            project, name, sinks = given.pop("project"), given.pop("name"), given.pop("sinks")
            init_options = given
        self._config: dict[str, Any] = dict(init_options.pop("config", None) or {})
        self._tee = _TrackerTee(self, run=run, project=project, name=name, sinks=sinks, **init_options)
        self._tee.kind = "Accelerate tracker"

    @property
    def tracker(self) -> RunLike:
        """The trackbridge run (opened on first access)."""
        return self._tee.run

    @on_main_process
    def start(self) -> None:
        """Nothing to do yet: the run opens at the first log, with the configuration."""

    @on_main_process
    def store_init_configuration(self, values: dict[str, Any]) -> None:
        """Keep the configuration: it becomes the run's config when the run opens (at the first log)."""
        self._config.update(dict(values or {}))
        if self._tee.opened:
            self._tee.warn_once("late-config", "trackbridge: store_init_configuration() after the first log(); "
                                               "the run's configuration was already written")

    @on_main_process
    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Log one record through trackbridge (never raises; problems are warnings)."""
        self._tee.emit(dict(values), step)

    @on_main_process
    def finish(self) -> None:
        """Flush and finish the trackbridge run (when this tracker opened it)."""
        self._tee.finish()


class _TrackerTee(Tee):
    def __init__(self, owner: TrackBridgeTracker, **kw: Any) -> None:
        super().__init__(**kw)
        self._owner = owner

    def defaults(self) -> dict[str, Any]:
        return {"config": dict(self._owner._config)} if self._owner._config else {}


def register() -> bool:
    """Make ``Accelerator(log_with="trackbridge")`` build a :class:`TrackBridgeTracker` (done when this module is
    imported). Returns False on an Accelerate without ``register_tracker_class`` (before 1.x: pass
    ``log_with=[TrackBridgeTracker(...)]`` there)."""
    from accelerate import tracking
    if tracking.LOGGER_TYPE_TO_CLASS.get(TrackBridgeTracker.name) is TrackBridgeTracker:
        return True
    registrar = getattr(tracking, "register_tracker_class", None)
    if registrar is None:
        return False
    registrar(TrackBridgeTracker)
    return True


if __name__ != "__main__":
    register()


__all__ = ["ENV_OPTIONS", "TrackBridgeTracker", "options_from_env", "parse_sinks", "register"]
