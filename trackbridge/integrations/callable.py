"""``trackbridge.wrap(fn, source=..., sinks=[...])`` for any callable ``log(data, step=None, ...)``.

The returned :class:`LogWrapper` is itself callable: it calls ``fn`` with the same arguments (its return value and
exceptions reach the caller unchanged), then logs ``data`` at ``step`` through trackbridge. Use it in place of the
original, e.g. veRL's ``Tracking.log(data, step, backend=None)``::

    tracking.log = trackbridge.wrap(tracking.log, source="verl", sinks=["mlflow:sqlite:///runs/mlflow.db"])
    ...
    tracking.log = tracking.log.unwrap()      # the original bound method back; the trackbridge run is finished

The dict is the argument named ``data``, ``metrics``, ``values``, ``logs``, ``stats`` or ``d`` (else the first
positional argument that is a dict); the step is ``step`` or ``global_step`` (else the second positional argument
when it is an integer). ``data_arg=``/``step_arg=`` name them explicitly.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable, Mapping

from ._tee import RunLike, Tee

_DATA_NAMES = ("data", "metrics", "values", "logs", "stats", "d", "metrics_dict", "log_dict")
_STEP_NAMES = ("step", "global_step", "iteration", "it")


class LogWrapper(Tee):
    """A callable standing in for ``fn`` that also logs through trackbridge (see the module docstring)."""

    kind = "callable"

    def __init__(self, fn: Callable[..., Any], *, data_arg: str | None = None, step_arg: str | None = None,
                 run: RunLike | None = None, **init_options: Any) -> None:
        if not callable(fn):
            raise TypeError(f"trackbridge.wrap(): {fn!r} is not callable")
        super().__init__(run=run, **init_options)
        self.fn = fn
        self.data_arg, self.step_arg = data_arg, step_arg
        try:
            self._sig: inspect.Signature | None = inspect.signature(fn)
        except (TypeError, ValueError):
            self._sig = None
        self.__wrapped__ = fn
        self.__name__ = getattr(fn, "__name__", "log")
        self.__doc__ = getattr(fn, "__doc__", None)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        result = self.fn(*args, **kwargs)
        if self.active:
            try:
                data, step = self._extract(args, kwargs)
            except Exception as exc:
                self.warn_once("extract", f"trackbridge: could not find the metrics dict in a call of "
                                          f"{self.__name__} ({exc}); pass data_arg=/step_arg= to wrap()")
                return result
            if isinstance(data, Mapping):
                self.emit(dict(data), step)
        return result

    def _extract(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any]:
        bound: dict[str, Any] = {}
        if self._sig is not None:
            try:
                bound = dict(self._sig.bind_partial(*args, **kwargs).arguments)
            except TypeError:
                bound = {}
        if not bound:
            bound = dict(kwargs)
            for i, a in enumerate(args):
                bound.setdefault(f"#{i}", a)
        names = list(bound)
        data_key = self.data_arg or next((n for n in _DATA_NAMES if n in bound), None)
        if data_key is None:
            data_key = next((n for n in names if isinstance(bound[n], Mapping)), None)
        step_key = self.step_arg or next((n for n in _STEP_NAMES if n in bound), None)
        if step_key is None and data_key in names:
            i = names.index(data_key)
            nxt = bound[names[i + 1]] if i + 1 < len(names) else None
            if isinstance(nxt, int) and not isinstance(nxt, bool):
                step_key = names[i + 1]
        return bound.get(data_key) if data_key else None, bound.get(step_key) if step_key else None

    def unwrap(self, finish: bool = True) -> Callable[..., Any]:   # type: ignore[override]
        """Stop teeing, finish the trackbridge run (when this wrapper opened it) and return the original callable."""
        self.status = super().unwrap(finish=finish)
        return self.fn

    def __repr__(self) -> str:
        return f"<trackbridge.wrap of {self.fn!r}>"

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        """Used as a class attribute, bind like a function (``Tracking.log = trackbridge.wrap(Tracking.log)``)."""
        if obj is None:
            return self
        import types
        return types.MethodType(self, obj)


__all__ = ["LogWrapper"]
