"""The loggers a Ray worker's trainer calls, wrapped for :mod:`trackbridge.integrations.ray`: wandb (the module),
TensorBoard's ``SummaryWriter`` and veRL's ``Tracking``, each feeding the worker's one shared trackbridge run through
its :class:`~trackbridge.integrations.ray.Coordinator` (which allows one feed per record and says when a logger
finished)."""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:       # pragma: no cover
    from .ray import Coordinator

ENV_PREFIX = "TRACKBRIDGE_"


def _wandb_wrapper_class() -> type:
    from .wandb import WandbWrapper

    class RayWandb(WandbWrapper):
        ray_kind = "wandb"

        def __init__(self, target: Any, *, coord: Coordinator) -> None:
            self.coord = coord
            super().__init__(target, run=coord.shared,
                             wandb_names=os.environ.get(ENV_PREFIX + "WANDB_NAMES") or "original",
                             source=coord.options["source"], names=coord.options["names"],
                             mappings=coord.options["mappings"])

        def emit(self, metrics: dict[str, Any], step: Any = None, *, axis: str | None = None) -> None:
            if self.coord.allows("wandb"):
                super().emit(metrics, step, axis=axis)

        def tracker_finished(self, failed: bool = False) -> None:
            super().tracker_finished(failed)
            self.coord.tracker_finished("wandb", failed)

    return RayWandb


def _RayWandb(target: Any, *, coord: Coordinator) -> Any:
    return _wandb_wrapper_class()(target, coord=coord)


def _RayWriter(cls: type, *, coord: Coordinator) -> Any:
    from .tensorboard import WriterWrapper

    class RayWriter(WriterWrapper):
        ray_kind = "tensorboard"

        def emit(self, metrics: dict[str, Any], step: Any = None, *, axis: str | None = None) -> None:
            if coord.allows("tensorboard"):
                super().emit(metrics, step, axis=axis)

        def tracker_finished(self) -> None:
            self.flush()
            coord.tracker_finished("tensorboard")

    return RayWriter(cls, run=coord.shared)


class _TrackingHandle:
    """veRL's ``Tracking`` wrapped: ``log`` through a :class:`~trackbridge.integrations.callable.LogWrapper` (the
    backends' own wrapped calls inside it are not a feed), ``__init__`` read for the run's project, name and
    config, ``finish`` (and so ``__del__``) finishing the run."""

    ray_kind = "verl"

    def __init__(self, cls: type, coord: Coordinator) -> None:
        import functools
        import inspect

        from .callable import LogWrapper
        self.cls, self.coord = cls, coord
        self.active = True
        self._orig = {name: cls.__dict__[name] for name in ("__init__", "log", "finish")}
        orig_init, orig_log, orig_finish = self._orig["__init__"], self._orig["log"], self._orig["finish"]
        sig = inspect.signature(orig_init)

        class TrackingLog(LogWrapper):
            kind = "veRL Tracking"

            def __call__(self, *args: Any, **kwargs: Any) -> Any:
                with coord.inside_tracking():
                    return super().__call__(*args, **kwargs)

            def emit(self, metrics: dict[str, Any], step: Any = None, *, axis: str | None = None) -> None:
                if coord.allows("verl"):
                    super().emit(metrics, step, axis=axis)

        self.log = TrackingLog(orig_log, run=coord.shared, data_arg="data", step_arg="step")

        @functools.wraps(orig_init)
        def __init__(obj: Any, *args: Any, **kwargs: Any) -> None:
            with coord.inside_tracking():
                orig_init(obj, *args, **kwargs)
            try:
                bound = sig.bind(obj, *args, **kwargs)
                bound.apply_defaults()
                a = bound.arguments
                config = a.get("config")
                coord.verl_defaults = {"project": a.get("project_name"), "name": a.get("experiment_name"),
                                       "config": dict(config) if isinstance(config, dict) else None}
            except Exception:
                pass

        @functools.wraps(orig_finish)
        def finish(obj: Any, *args: Any, **kwargs: Any) -> Any:
            already = bool(getattr(obj, "_finished", False))
            with coord.inside_tracking():
                result = orig_finish(obj, *args, **kwargs)
            if not already:
                code = args[0] if args else kwargs.get("exit_code", 0)
                coord.tracker_finished("verl", failed=isinstance(code, int) and code != 0)
            return result

        self._patched = {"__init__": __init__, "log": self.log, "finish": finish}
        for name, fn in self._patched.items():
            setattr(cls, name, fn)

    def defaults(self) -> dict[str, Any]:
        return dict(self.coord.verl_defaults)

    def flush(self) -> None:
        pass

    def unwrap(self, finish: bool = True) -> None:
        if self.active:
            self.active = False
            for name, fn in self._patched.items():
                if self.cls.__dict__.get(name) is fn:
                    setattr(self.cls, name, self._orig[name])
            self.log.unwrap(finish=False)


def _wrap_tracking(cls: type, coord: Coordinator) -> _TrackingHandle:
    return _TrackingHandle(cls, coord)
