"""``trackbridge.wrap(writer, source="openrlhf", sinks=[...])`` for ``torch.utils.tensorboard.SummaryWriter`` and
``tensorboardX.SummaryWriter``: the event files are written exactly as before, and the same values go through
trackbridge, translated.

* ``add_scalar(tag, value, global_step)``, ``add_histogram(tag, values, global_step)`` and
  ``add_text(tag, text, global_step)`` give the metric ``tag``.
* ``add_scalars(main_tag, {sub: value}, global_step)`` gives ``main_tag/sub`` for each entry. (What the writers do:
  both write each entry as a scalar named ``main_tag`` into its own sub-run folder, torch's to
  ``LOGDIR/<main_tag with / as _>_<sub>``, tensorboardX's to ``LOGDIR/<main_tag>/<sub>``; TensorBoard shows one chart
  ``main_tag`` with one line per sub-run.)
* Names are taken as the caller wrote them (tensorboardX's own tag cleaning, ``[^-/\\w.]`` -> ``_``, is not applied
  on the trackbridge side, so translation sees the framework's real names).
* Writers are called once per value; trackbridge wants one record per step. Values are therefore collected while
  ``global_step`` stays the same and sent as one record when the step changes, when a name repeats within a step,
  on ``writer.flush()``, ``writer.close()`` and ``unwrap()``. Values are read at the call (a tensor changed later
  does not change what was logged). Values logged without ``global_step`` form one record at trackbridge's next
  step (the writers store them at step 0).
* ``trackbridge.wrap(SummaryWriter)`` (the class, torch's or tensorboardX's) tees every writer the class makes,
  for frameworks that create their writer internally (OpenRLHF, veRL): one trackbridge run for all of them.
* ``writer.close()`` also finishes the trackbridge run (when the wrapper opened it; a later call reopens it with
  ``resume=True``); ``unwrap()`` restores the writer's own methods.
"""
from __future__ import annotations

from typing import Any

from ..record.values import normalize
from ._tee import RunLike, Tee, as_step

_SENTINEL = object()


def _arg(args: tuple[Any, ...], kwargs: dict[str, Any], index: int, name: str, default: Any = None) -> Any:
    if len(args) > index:
        return args[index]
    return kwargs.get(name, default)


class WriterWrapper(Tee):
    """Tees a SummaryWriter into trackbridge (see the module docstring)."""

    kind = "SummaryWriter"
    methods = ("add_scalar", "add_scalars", "add_histogram", "add_text", "flush", "close")

    def __init__(self, writer: Any, *, run: RunLike | None = None, **init_options: Any) -> None:
        super().__init__(run=run, **init_options)
        self.writer = writer
        self.is_class = isinstance(writer, type)      # wrap(SummaryWriter): every writer the class makes
        self._pending: dict[str, Any] = {}
        self._pending_step: Any = _SENTINEL
        self._patched: dict[str, Any] = {}
        self._shadowed: dict[str, Any] = {}
        for name in self.methods:
            orig = getattr(writer, name, None)
            if orig is None:
                continue
            if name in vars(writer):
                self._shadowed[name] = vars(writer)[name]
            fn = self._make(name, orig)
            self._patched[name] = fn
            setattr(writer, name, fn)

    def defaults(self) -> dict[str, Any]:
        import os
        if self.is_class:
            return {}
        logdir = None
        try:
            logdir = self.writer.get_logdir() if hasattr(self.writer, "get_logdir") else getattr(self.writer, "logdir",
                                                                                                   None)
        except Exception:
            pass
        return {"name": os.path.basename(os.path.normpath(str(logdir)))} if logdir else {}

    def _make(self, name: str, orig: Any) -> Any:
        tee = self
        skip = 1 if self.is_class else 0        # a class attribute is called with the writer first

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if name == "close" and tee.active:
                with tee._lock:
                    tee._safe(tee.flush)
                    result = orig(*args, **kwargs)
                    tee._safe(tee.tracker_finished)
                    return result
            result = orig(*args, **kwargs)
            if tee.active:
                tee._safe(lambda: getattr(tee, "_on_" + name)(args[skip:], kwargs))
            return result

        wrapper.__name__ = name
        wrapper.__qualname__ = getattr(orig, "__qualname__", name)
        wrapper.__doc__ = getattr(orig, "__doc__", None)
        setattr(wrapper, "__wrapped__", orig)            # function attributes: set dynamically
        setattr(wrapper, "__trackbridge_wrapper__", self)
        return wrapper

    def tracker_finished(self) -> None:
        """A wrapped writer was closed: the trackbridge run is finished (when this wrapper opened it)."""
        self.finish()

    def _safe(self, fn: Any) -> None:
        try:
            fn()
        except Exception as exc:
            self.warn_once(f"tee-{type(exc).__name__}",
                           f"trackbridge: teeing the SummaryWriter failed ({type(exc).__name__}: {exc}); "
                           f"the event files are unaffected")

    # -- the calls -----------------------------------------------------------------------------------------------------
    def _on_add_scalar(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self._add(_arg(args, kwargs, 0, "tag"), _arg(args, kwargs, 1, "scalar_value"),
                  _arg(args, kwargs, 2, "global_step"))

    def _on_add_scalars(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        main = _arg(args, kwargs, 0, "main_tag")
        values = _arg(args, kwargs, 1, "tag_scalar_dict") or {}
        step = _arg(args, kwargs, 2, "global_step")
        for sub, value in values.items():
            self._add(f"{main}/{sub}", value, step)

    def _on_add_histogram(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self._add(_arg(args, kwargs, 0, "tag"), _arg(args, kwargs, 1, "values"), _arg(args, kwargs, 2, "global_step"))

    def _on_add_text(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self._add(_arg(args, kwargs, 0, "tag"), _arg(args, kwargs, 1, "text_string"),
                  _arg(args, kwargs, 2, "global_step"))

    def _on_flush(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.flush()

    def _on_close(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        pass                    # handled in the wrapper (flush, close, finish)

    def _add(self, tag: Any, value: Any, step: Any) -> None:
        if not isinstance(tag, str):
            return
        value = normalize(value, tag)            # read now: a tensor updated in place later cannot change it
        step = as_step(step)
        with self._lock:
            if self._pending and (step != self._pending_step or tag in self._pending):
                self.flush()
            self._pending[tag] = value
            self._pending_step = step

    def flush(self) -> None:
        with self._lock:
            pending, step = self._pending, self._pending_step
            self._pending, self._pending_step = {}, _SENTINEL
            if pending:
                self.emit(pending, None if step is _SENTINEL else step)

    def restore(self) -> None:
        attrs = dict(vars(self.writer))
        for name, fn in self._patched.items():
            if attrs.get(name) is fn:
                if name in self._shadowed:
                    setattr(self.writer, name, self._shadowed[name])
                else:
                    delattr(self.writer, name)


__all__ = ["WriterWrapper"]
