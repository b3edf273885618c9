"""Adopt trackbridge with one line in an existing training script.

* :class:`trackbridge.integrations.transformers.TrackBridgeCallback` -- a transformers ``TrainerCallback`` for every
  TRL trainer and the plain ``Trainer`` (knows the trainer and the TRL release, so the source is not guessed).
* ``trackbridge.wrap(wandb)`` / ``trackbridge.wrap(wandb_run)`` -- code that calls ``wandb.log`` (veRL, OpenRLHF)
  keeps logging to wandb exactly as before and also writes translated names to every trackbridge sink
  (:mod:`trackbridge.integrations.wandb`).
* ``trackbridge.wrap(summary_writer)`` -- torch's or tensorboardX's ``SummaryWriter``: ``add_scalar``,
  ``add_scalars``, ``add_histogram``, ``add_text`` go to the event files as before and through trackbridge
  (:mod:`trackbridge.integrations.tensorboard`).
* :class:`trackbridge.integrations.accelerate.TrackBridgeTracker` -- ``Accelerator(log_with=[TrackBridgeTracker()])``.
* ``trackbridge.wrap(fn)`` -- any callable ``log(dict, step=None)`` such as veRL's ``Tracking.log``
  (:mod:`trackbridge.integrations.callable`).
* ``trackbridge.integrations.ray.setup`` -- a Ray ``worker_process_setup_hook`` for veRL's and OpenRLHF's trainers in
  Ray actors: wraps wandb, ``SummaryWriter`` and veRL's ``Tracking`` in every worker, settings from ``TRACKBRIDGE_*``
  environment variables (:mod:`trackbridge.integrations.ray`).
* By name: ``report_to="trackbridge"`` once :mod:`trackbridge.integrations.transformers` is imported,
  ``log_with="trackbridge"`` once :mod:`trackbridge.integrations.accelerate` is; a Lightning ``Logger``,
  :class:`trackbridge.integrations.lightning.TrackBridgeLogger`.

Every wrapper takes the options of :func:`trackbridge.init` (``sinks=``, ``source=``, ``project=`` ...) or
``run=`` an existing trackbridge run, and is undone by ``handle.unwrap()``, ``trackbridge.unwrap(target)`` or by
leaving ``with trackbridge.wrap(...):``. Importing this package (or the wandb, tensorboard and callable modules)
imports neither torch nor transformers nor the wrapped tracker.
"""
from __future__ import annotations

import builtins
import types
from typing import TYPE_CHECKING, Any, Callable, Protocol, TypeGuard, overload, runtime_checkable

if TYPE_CHECKING:       # pragma: no cover
    from ._tee import Tee
    from .callable import LogWrapper

# importing the submodule ``callable`` sets ``callable`` in this module's namespace: use the builtin explicitly
_callable = builtins.callable

_ACTIVE: dict[int, Tee] = {}   # id(wrapped target) -> handle, for unwrap(target)


@runtime_checkable
class _Handle(Protocol):
    """What :func:`unwrap` takes as a handle: what :func:`wrap` returned (or a method bound to it, when a wrapped
    callable was set as a class attribute)."""

    active: bool

    def unwrap(self, finish: bool = True) -> dict[str, Any] | Callable[..., Any] | None: ...


def _is_wandb(obj: object) -> bool:
    if isinstance(obj, types.ModuleType):
        return obj.__name__ == "wandb"
    return (type(obj).__module__ or "").startswith("wandb.") and hasattr(obj, "log") and hasattr(obj, "define_metric")


def _is_summary_writer(obj: object) -> bool:
    return (not isinstance(obj, types.ModuleType) and _callable(getattr(obj, "add_scalar", None))
            and _callable(getattr(obj, "add_scalars", None)))


def _is_callable(obj: object) -> TypeGuard[Callable[..., Any]]:
    return _callable(obj)


@overload
def wrap(target: type[Any], **options: Any) -> Tee: ...        # wrap(SummaryWriter): the class
@overload
def wrap(target: Callable[..., Any], **options: Any) -> LogWrapper: ...
@overload
def wrap(target: object, **options: Any) -> Tee: ...


def wrap(target: object, **options: Any) -> Tee:
    """Make an existing logger also write through trackbridge; returns a handle with ``unwrap()``.

    * the ``wandb`` module or a wandb ``Run`` -> :class:`~trackbridge.integrations.wandb.WandbWrapper`
      (``wandb_names="original"`` (default) or ``"translated"``: what wandb itself receives);
    * a ``SummaryWriter`` (torch or tensorboardX) -> :class:`~trackbridge.integrations.tensorboard.WriterWrapper`;
    * any other callable ``log(data, step=None, ...)`` -> a :class:`~trackbridge.integrations.callable.LogWrapper`,
      itself callable: use it in place of the original (``tracking.log = trackbridge.wrap(tracking.log, ...)``).

    ``options``: those of :func:`trackbridge.init` (``sinks``, ``source``, ``project``, ``name``, ``config``,
    ``names``, ``spool`` ...), or ``run=`` an open trackbridge run to share between several wrappers.
    """
    is_wandb = _is_wandb(target)
    is_writer = not is_wandb and _is_summary_writer(target)
    if not (is_wandb or is_writer or _is_callable(target)):
        raise TypeError(f"trackbridge.wrap(): cannot wrap a {type(target).__name__}; expected the wandb module or a "
                        f"wandb run, a SummaryWriter, or a callable log(dict, step=None)")
    previous = _ACTIVE.get(id(target))
    if previous is not None and previous.active and not isinstance(previous, _callable_class()):
        raise RuntimeError(f"trackbridge.wrap(): {target!r} is already wrapped; unwrap it first "
                           f"(or pass run= to share one trackbridge run between wrappers)")
    handle: Tee
    if is_wandb:
        from .wandb import WandbWrapper
        handle = WandbWrapper(target, **options)
    elif is_writer:
        from .tensorboard import WriterWrapper
        handle = WriterWrapper(target, **options)
    else:
        from .callable import LogWrapper
        assert _is_callable(target)             # checked above
        handle = LogWrapper(target, **options)
    _ACTIVE[id(target)] = handle
    return handle


def _callable_class() -> type[Tee]:
    from .callable import LogWrapper
    return LogWrapper


def unwrap(target: object, finish: bool = True) -> dict[str, Any] | Callable[..., Any] | None:
    """Undo :func:`wrap`: pass the handle, or the wrapped object itself. Returns the trackbridge run's status
    (None when the run was never opened; for a wrapped callable: the original callable)."""
    handle: _Handle | None = target if isinstance(target, _Handle) else _ACTIVE.get(id(target))
    if handle is None:
        raise ValueError(f"trackbridge.unwrap(): {target!r} is not wrapped")
    for key, value in list(_ACTIVE.items()):
        if value is handle:
            del _ACTIVE[key]
    return handle.unwrap(finish=finish)


__all__ = ["wrap", "unwrap"]
