"""``TrackBridgeCallback``: a transformers ``TrainerCallback`` for every TRL trainer and the plain ``Trainer``.

One line in a training script::

    from trackbridge.integrations.transformers import TrackBridgeCallback
    trainer = GRPOTrainer(..., callbacks=[TrackBridgeCallback(sinks=["tensorboard:runs/tb", "wandb:runs/wb"])])

(``trainer.add_callback(TrackBridgeCallback(...))`` works too.) It takes the options of :func:`trackbridge.init`
and runs beside ``report_to`` (``report_to="wandb"`` keeps logging as before) or instead of it (``report_to="none"``).

* **Source, not guessed**: the trainer's class (found on the call stack; the ``*Config`` class of the arguments
  otherwise) and the installed TRL release give ``source`` -- ``GRPOTrainer`` with TRL 1.16.0 is
  ``trl/grpo@1.16.0``, a subclass (Unsloth's ``UnslothGRPOTrainer``, your own) is its TRL base class, the plain
  ``transformers.Trainer`` is ``trl@<release>`` (or ``trl`` without TRL installed: the HF keys are in trl.yaml). Which
  class is which trainer is a fact of ``mappings/trl.yaml`` (each trainer's ``classes:``). An explicit ``source=``
  wins. ``callback.source`` tells what was used.
* **Records**: every dict that reaches ``on_log`` is one record at ``state.global_step``: training rows, ``eval_``
  rows (split ``eval``: ``eval_loss`` is ``eval/loss/total``) and the final summary row (``train_runtime``,
  ``train_loss``, ``total_flos`` ... as ``train/runtime`` ...). Other integrations keep the summary keys out of the
  history; trackbridge logs them as the last record.
* **Config**: ``TrainingArguments.to_dict()`` (values that are not plain JSON become strings) plus the model's
  config under ``model_config`` (``model_config=False`` to leave it out), plus ``config=`` given here. Translated
  config names (``kl_coef``, ``num_generations`` ...) are added by the logger.
* **Lifetime**: the run opens in ``on_train_begin`` (or at the first ``on_log`` of an ``evaluate()`` without
  training) and finishes in ``on_train_end``. A later ``trainer.evaluate()`` reopens the same run (``resume=True``).
  Only the world-process-zero writes (``state.is_world_process_zero``; ``rank_zero_only=False`` to change).
* **Live checks, able to act**: ``doctor=True`` runs the diagnostic checks on every record (off the training
  thread); ``on_finding=callable(finding)`` is called for each finding (at the next ``on_log``, in the training
  thread) and ``stop_on="critical"`` stops the Trainer at its next callback event once a finding that severe held
  (``control.should_training_stop``; ``callback.stopped`` says at which step and why). A finding is also the
  trackers' own alert where they have one (wandb ``run.alert``, Trackio's alerts). With ``report_to="trackbridge"``:
  ``TRACKBRIDGE_DOCTOR=1`` and ``TRACKBRIDGE_STOP_ON=critical``. Only the world-process-zero diagnoses: on several
  processes, stop every process yourself (``should_training_stop`` of rank 0 alone leaves the others waiting).
* **Not seen**: what TRL writes to trackers directly, bypassing ``Trainer.log``/``on_log``: the
  ``profiling/Time taken: ...`` timings and the ``completions`` tables (GRPO/RLOO, ``LogCompletionsCallback``), the
  ``game_log`` tables of legacy DPO-family trainers, ``WinRateCallback`` tables.

**By name** (``report_to="trackbridge"``): importing this module registers the callback in transformers'
integration registry (``INTEGRATION_TO_CALLBACK``), so ``TrainingArguments(report_to="trackbridge")`` (or
``report_to=["wandb", "trackbridge"]``) adds it to every ``Trainer``/TRL trainer. transformers builds it with no
arguments: its options come from the environment (``TRACKBRIDGE_SINKS="tensorboard:runs/tb,mlflow:sqlite:///m.db"``,
``TRACKBRIDGE_SPOOL``, ``TRACKBRIDGE_SOURCE``, ``TRACKBRIDGE_NAMES``, ``TRACKBRIDGE_PROJECT``, ``TRACKBRIDGE_NAME``,
``TRACKBRIDGE_RUN_ID``: :func:`trackbridge.integrations._env.options_from_env`); options passed in code win.
``import trackbridge`` alone registers nothing.

**TRL's command line** (``trl grpo ... --report_to trackbridge`` imports nothing of yours; TRL runs its script in
a child process through ``accelerate launch``)::

    TRACKBRIDGE_SINKS=tensorboard:runs/tb python -m trackbridge.integrations.transformers trl grpo \
        --model_name_or_path ... --dataset_name ... --report_to trackbridge

runs TRL's CLI (``trl.cli.main``) in this process with the registration in place, and has ``accelerate launch``
start the training script through this module (``--module trackbridge.integrations.transformers SCRIPT ARGS``), so
every launched process registers the callback before the script runs. ``python -m
trackbridge.integrations.transformers path/to/train.py ARGS`` runs any script (or ``-m module``) the same way.
"""
from __future__ import annotations

import inspect
import json
import os
import runpy
import sys
import warnings
from typing import Any

from ..extras import require
from ..logger import LoggerOptions, LoggerWarning

require(("transformers",), "trl", __name__)     # one line naming the extra rather than a bare ModuleNotFoundError

from transformers import TrainerCallback  # noqa: E402


def _trl() -> Any:
    """mappings/trl.yaml, whose trainers' ``classes:`` name the TRL classes of each trainer id."""
    from ..schema.loader import load_registry
    return load_registry().framework("trl")


def trl_version() -> str | None:
    """The installed TRL release (``1.16.0``), or None."""
    try:
        from importlib.metadata import version
        return version("trl")
    except Exception:
        return None


def trainer_id(trainer_cls: type | None = None, args_cls: type | None = None) -> str | None:
    """The trl.yaml trainer id of a trainer class (the first class of its MRO a trainer lists under ``classes:``),
    else of its arguments' ``*Config`` class (the name with Config for Trainer)."""
    trl = _trl()
    for cls in getattr(trainer_cls, "__mro__", ()) or ():
        tid = trl.trainer_of_class(cls.__name__, callbacks=_is_hf_trainer(cls))
        if tid is not None:
            return tid
    for cls in getattr(args_cls, "__mro__", ()) or ():
        name = cls.__name__
        if name.endswith("Config"):
            tid = trl.trainer_of_class(name[:-len("Config")] + "Trainer")
            if tid is not None:
                return tid
    return None


def _is_hf_trainer(cls: type) -> bool:
    return any(c.__name__ == "Trainer" and (c.__module__ or "").startswith("transformers") for c in cls.__mro__)


def source_for(trainer_cls: type | None, args_cls: type | None = None, version: str | None = None) -> str:
    """The trackbridge source of a trainer: ``trl/grpo@1.16.0``, ``trl@1.16.0`` (plain Trainer) or ``trl``."""
    version = trl_version() if version is None else version
    tid = trainer_id(trainer_cls, args_cls)
    base = f"trl/{tid}" if tid else "trl"
    return f"{base}@{version}" if version else base


def _find_trainer() -> Any:
    """The ``transformers.Trainer`` whose method is on the call stack (callbacks are not given the trainer)."""
    try:
        from transformers import Trainer
    except Exception:
        return None
    frame = inspect.currentframe()
    try:
        f = frame.f_back if frame is not None else None
        depth = 0
        while f is not None and depth < 60:
            obj = f.f_locals.get("self")
            if obj is not None and isinstance(obj, Trainer):
                return obj
            f = f.f_back
            depth += 1
    finally:
        del frame
    return None


def _plain(value: Any, depth: int = 0) -> Any:
    """A JSON-friendly copy of a config value (enums by value, other objects as strings)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    enum_value = getattr(value, "value", None)
    if enum_value is not None and type(value).__module__ != "builtins" and isinstance(enum_value, (str, int)):
        return enum_value
    if depth < 4 and isinstance(value, dict):
        return {str(k): _plain(v, depth + 1) for k, v in value.items()}
    if depth < 4 and isinstance(value, (list, tuple, set)):
        items = [_plain(v, depth + 1) for v in value]
        return items if len(json.dumps(items, default=str)) <= 2000 else str(value)[:2000]
    return str(value)


class TrackBridgeCallback(TrainerCallback):
    """Logs every ``on_log`` dict of a transformers/TRL trainer through trackbridge (see the module docstring).

    Options are those of :func:`trackbridge.init` (``project``, ``name``, ``sinks``, ``source``, ``names``,
    ``config``, ``spool``, ``run_id`` ...), plus ``model_config`` (include the model's config, default True).
    Options not given (``None``) come from the ``TRACKBRIDGE_*`` environment variables; ``env=False`` ignores them.
    """

    def __init__(self, project: str | None = None, name: str | None = None, sinks: list[Any] | None = None, *,
                 source: str | None = None, config: dict[str, Any] | None = None, model_config: bool = True,
                 rank_zero_only: bool = True, env: bool = True, **init_options: Any) -> None:
        if env:         # options not given come from TRACKBRIDGE_* (what report_to="trackbridge" relies on)
            from ._env import options_from_env
            given = {"project": project, "name": name, "sinks": sinks, "source": source, **init_options}
            for option, value in options_from_env().items():
                if given.get(option) is None:
                    given[option] = value
            project, name, sinks, source = given.pop("project"), given.pop("name"), given.pop("sinks"), \
                given.pop("source")
            init_options = {k: v for k, v in given.items() if v is not None}
            stop_on = (os.environ.get("TRACKBRIDGE_STOP_ON") or "").strip()
            if stop_on and init_options.get("stop_on") is None:
                init_options["stop_on"] = stop_on
            doctor = (os.environ.get("TRACKBRIDGE_DOCTOR") or "").strip().lower()
            if init_options.get("doctor") is None and (doctor in ("1", "true", "yes", "on") or stop_on):
                init_options["doctor"] = True
        if init_options.get("stop_on") is not None or init_options.get("on_finding") is not None:
            # a bad stop_on fails here, not at the first step
            from ..logger.dispatch import live_options
            live_options(bool(init_options.get("doctor")), init_options.get("on_finding"),
                         init_options.get("stop_on"))
        self.stopped: tuple[int, str] | None = None     # (step, why) when stop_on stopped the Trainer
        self.project, self.name, self.sinks = project, name, list(sinks or [])
        self.user_source = source
        self.user_config = dict(config or {})
        self.model_config = model_config
        self.rank_zero_only = rank_zero_only
        self.init_options = init_options
        self.run: Any = None
        self.source: str | None = source
        self.trainer_class: str | None = None
        self.records = 0

    # -- the run -------------------------------------------------------------------------------------------------------
    def _config(self, args: Any, model: Any) -> dict[str, Any]:
        cfg: dict[str, Any] = {}
        try:
            cfg.update(_plain(args.to_dict()))
        except Exception:
            pass
        if self.model_config and model is not None:
            try:
                mc = getattr(model, "config", None)
                if mc is not None and hasattr(mc, "to_diff_dict"):
                    cfg["model_config"] = _plain(mc.to_diff_dict())
            except Exception:
                pass
        cfg.update(self.user_config)
        return cfg

    def _ensure(self, args: Any, state: Any, model: Any) -> Any:
        if self.run is not None and not getattr(self.run, "_finished", False):
            return self.run
        if self.rank_zero_only and state is not None and not getattr(state, "is_world_process_zero", True):
            return None
        from .. import logger
        if self.run is not None:               # finished in on_train_end; a later evaluate() continues the run
            rest = {k: v for k, v in self.init_options.items() if k not in ("run_id", "resume")}
            self.run = logger.init(project=self.project, name=self.name, sinks=self.sinks,
                                   source=self.source or "auto", run_id=self.run.run_id, resume=True,
                                   **LoggerOptions.fold({**rest, "rank_zero_only": self.rank_zero_only}))
            return self.run
        if self.source is None:
            trainer = _find_trainer()
            tcls = type(trainer) if trainer is not None else None
            self.trainer_class = tcls.__name__ if tcls is not None else None
            self.source = source_for(tcls, type(args) if args is not None else None)
            if model is None and trainer is not None:
                model = getattr(trainer, "model", None)
        name = self.name or getattr(args, "run_name", None) or None
        self.run = logger.init(project=self.project, name=name, sinks=self.sinks, source=self.source,
                               config=self._config(args, model),
                               **LoggerOptions.fold({**self.init_options, "rank_zero_only": self.rank_zero_only}))
        return self.run

    # -- events --------------------------------------------------------------------------------------------------------
    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        self._ensure(args, state, model)

    def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, model: Any = None,
               **kwargs: Any) -> None:
        if not logs:
            return
        run = self._ensure(args, state, model)
        if run is None:
            return
        try:
            run.log(dict(logs), step=int(state.global_step))
            self.records += 1
        except Exception as exc:       # never stop training for a logging problem
            warnings.warn(f"trackbridge: TrackBridgeCallback could not log a record ({type(exc).__name__}: {exc})",
                          LoggerWarning, stacklevel=2)
        self._act(state, control)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._act(state, control)

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._act(state, control)

    def _act(self, state: Any, control: Any) -> None:
        """``stop_on``: once the run says a finding that severe held, the Trainer stops after this event."""
        run = self.run
        if run is None or not getattr(run, "should_stop", False):
            return
        control.should_training_stop = True
        if self.stopped is None:
            f = getattr(run, "_stop_finding", None)
            why = f"{f.severity} finding [{f.id}] at {f.stretches[0].steps()}" if f is not None else "a finding"
            self.stopped = (int(getattr(state, "global_step", 0) or 0), why)
            warnings.warn(f"trackbridge: stopping training at step {self.stopped[0]}: {why} "
                          f"(TrackBridgeCallback(stop_on={run._stop_on!r}))", LoggerWarning, stacklevel=2)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.finish()

    def finish(self) -> dict[str, Any] | None:
        """Finish the trackbridge run (done by ``on_train_end``). Returns its status."""
        if self.run is None:
            return None
        return self.run.finish()


# -- report_to="trackbridge" -------------------------------------------------------------------------------------------
REPORT_TO = "trackbridge"


def register() -> None:
    """Make ``report_to="trackbridge"`` add a :class:`TrackBridgeCallback` (done when this module is imported):
    transformers looks every ``report_to`` name up in ``integration_utils.INTEGRATION_TO_CALLBACK`` (the same dict
    ``transformers.integrations`` re-exports) and builds the class with no arguments."""
    from transformers.integrations import integration_utils
    integration_utils.INTEGRATION_TO_CALLBACK[REPORT_TO] = TrackBridgeCallback


def _launch_through_here(script_name: str, launch_args: list[str], training_script_args: list[str],
                         **_kw: Any) -> None:
    """``trl.cli.accelerate_launcher.launch_training_script``, the script started through this module: ``accelerate
    launch --module trackbridge.integrations.transformers <trl/scripts/NAME.py> ARGS``."""
    import importlib.resources as resources

    from accelerate.commands.launch import launch_command, launch_command_parser
    script = str(resources.files("trl.scripts").joinpath(script_name))
    accelerate_args = launch_command_parser().parse_args(
        [*launch_args, "--module", __name__, script, *training_script_args])
    launch_command(accelerate_args)


def run_trl_cli(argv: list[str]) -> int:
    """TRL's command line (``trl.cli.main``) with ``report_to="trackbridge"`` known to every process it starts."""
    try:
        from trl.cli import accelerate_launcher
        from trl.cli import main as trl_main
    except ImportError as exc:      # TRL before 1.x: another CLI layout
        raise SystemExit(f"trackbridge: this TRL ({trl_version()}) has no trl.cli.accelerate_launcher ({exc}); run "
                         f"its script through this module instead: python -m trackbridge.integrations.transformers "
                         f"path/to/trl/scripts/grpo.py ARGS") from None
    original = accelerate_launcher.launch_training_script
    accelerate_launcher.launch_training_script = _launch_through_here   # for this command only, restored below
    try:
        return int(trl_main(list(argv)) or 0)
    finally:
        accelerate_launcher.launch_training_script = original


def run_script(argv: list[str]) -> None:
    """Run ``SCRIPT ARGS`` (or ``-m MODULE ARGS``) as ``__main__`` in this process, the registration in place."""
    if argv[0] == "-m":
        if len(argv) < 2:
            raise SystemExit("usage: python -m trackbridge.integrations.transformers -m MODULE [ARGS ...]")
        sys.argv = [argv[1], *argv[2:]]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        return
    script = os.path.abspath(argv[0])
    sys.argv = [script, *argv[1:]]
    sys.path.insert(0, os.path.dirname(script))
    runpy.run_path(script, run_name="__main__")


USAGE = """usage: python -m trackbridge.integrations.transformers trl COMMAND [ARGS ...]   (TRL's CLI: trl grpo ...)
       python -m trackbridge.integrations.transformers SCRIPT.py [ARGS ...]
       python -m trackbridge.integrations.transformers -m MODULE [ARGS ...]

Runs it with report_to="trackbridge" registered; the callback's options come from TRACKBRIDGE_SINKS,
TRACKBRIDGE_SPOOL, TRACKBRIDGE_SOURCE, TRACKBRIDGE_NAMES, TRACKBRIDGE_PROJECT, TRACKBRIDGE_NAME, TRACKBRIDGE_RUN_ID."""


def main(argv: list[str] | None = None) -> int:
    """``python -m trackbridge.integrations.transformers``: see :data:`USAGE`."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if args else 2
    register()
    if args[0] == "trl":
        return run_trl_cli(args[1:])
    run_script(args)
    return 0


if __name__ != "__main__":
    register()
else:       # python -m: the module's own copy (imported here, by name) registers; this copy only hands over
    import importlib
    raise SystemExit(importlib.import_module(__spec__.name).main())


__all__ = ["REPORT_TO", "TrackBridgeCallback", "main", "register", "run_script", "run_trl_cli", "source_for",
           "trainer_id", "trl_version"]
