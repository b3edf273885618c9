"""``trackbridge.wrap(wandb, source="verl", sinks=[...])``: code that calls ``wandb.log`` keeps logging to wandb as
before and also writes to every trackbridge sink, under canonical names (or ``names=``).

veRL's ``Tracking`` calls ``wandb.log(data=..., step=step)``; OpenRLHF calls ``wandb.define_metric("train/*",
step_metric="train/global_step")`` and then ``wandb.log({...})`` with ``train/global_step`` in the dict. Neither
needs changing::

    import trackbridge, wandb
    trackbridge.wrap(wandb, source="verl", sinks=["tensorboard:runs/tb", "mlflow:sqlite:///runs/mlflow.db"])

How it works (wandb 0.31):

* ``wandb.log`` is the global run's bound ``Run.log`` (``wandb.init`` rebinds it). The wrapper patches ``Run.log``,
  ``Run.define_metric`` and ``Run.finish`` on the class, and rebinds ``wandb.log``/``wandb.define_metric`` when a run
  already exists, so it works whether it is installed before or after ``wandb.init``. Only the wrapped run is teed:
  with the module, whatever ``wandb.run`` is at the time of the call; with a run object, that run. trackbridge's own
  wandb sink (a separate ``reinit="create_new"`` run) is never teed.
* **wandb itself is called first, with the same arguments**, so its behaviour, return value and exceptions are
  unchanged. With ``wandb_names="translated"`` wandb receives the translated names instead (keys that are declared
  step metrics, ``_``-keys and media keep their names; note that ``define_metric`` globs written for the original
  names then no longer match the renamed keys). They are the names every trackbridge tracker gets: translated
  through :class:`trackbridge.pipeline.Pipeline` with the trackbridge run's source, ``names``, ``mappings`` and run
  config (opened at the first ``wandb.log`` for that), as the logger translates (OpenRLHF's ``kl`` with
  ``algo.kl.use_loss`` in the config is ``kl/ref/k1``/``k3`` in wandb and in the trackers alike).
* **Rows**: trackbridge gets one record per *committed* wandb row, following wandb's own ``step=``/``commit=``
  rules (it reads ``run.step`` around each call): ``commit=False`` and an explicit ``step=`` without
  ``commit=True`` accumulate into the row, a higher ``step=`` commits the previous row, ``finish()``/``unwrap()``
  flush the last one. A ``step=`` lower than wandb's current step is dropped by wandb (with a warning); trackbridge
  still records it at that step (it handles non-monotonic steps).
* **Steps**: the record's step is the wandb row's step, unless ``define_metric(glob, step_metric=M)`` covers the keys:
  then it is the value of ``M`` in the row (or the last value seen, as wandb's ``step_sync``), and ``M`` is the
  record's x axis (``Record.axis``: every tracker charts those keys on it). Keys governed by different step
  metrics in one row (``train/*`` and ``eval/*``, slime's ``train/step`` and ``rollout/step``) become separate
  records. Rules declared before the wrapper was installed are not seen: pass them as
  ``step_metrics={"train/*": "train/global_step"}``.
* **Values**: numbers, strings, tensors/arrays (as histograms) and ``wandb.Histogram`` go through; other wandb media
  (``Table``, ``Image`` ...) stay in wandb only (listed in ``handle.skipped``); ``_step``/``_runtime``/``_timestamp``
  are wandb's.
* **Finishing**: the wrapped run's ``finish()`` (``wandb.finish()``, ``run.finish()``, wandb's own exit hook) sends
  the last row and finishes the trackbridge run the wrapper opened (``exit_code`` not 0: as failed); a later
  ``wandb.log`` reopens it with ``resume=True``. ``handle.unwrap()`` (or ``trackbridge.unwrap(wandb)``, or leaving
  ``with trackbridge.wrap(wandb, ...):``) restores the original methods, flushes the pending row and finishes the
  trackbridge run. Defaults for ``project``, ``name`` and ``config`` come from the wandb run when the trackbridge run
  opens (at the first committed row); ``config=`` is laid over the wandb run's config (nested keys merged), so the
  run config is both.
* Inside Ray actors (veRL, OpenRLHF), where the driver's ``wrap`` cannot reach: :mod:`trackbridge.integrations.ray`.
"""
from __future__ import annotations

import fnmatch
import functools
import sys
import types
from typing import Any

from ._env import merged
from ._tee import RunLike, Tee

_WANDB_RESERVED = ("_step", "_runtime", "_timestamp")


class WandbWrapper(Tee):
    """Tees a wandb run (or whatever ``wandb.run`` is, for the module) into trackbridge. See the module docstring."""

    kind = "wandb"

    def __init__(self, target: Any, *, wandb_names: str = "original", step_metrics: dict[str, str] | None = None,
                 run: RunLike | None = None, **init_options: Any) -> None:
        super().__init__(run=run, **init_options)
        # config= is laid over the wandb run's config (the run's config defaults), not put in its place
        self._user_config = self._init_options.pop("config", None)
        if wandb_names not in ("original", "translated"):
            raise ValueError(f"wandb_names={wandb_names!r}; expected 'original' or 'translated'")
        self.wandb_names = wandb_names
        if isinstance(target, types.ModuleType):
            self.wb = target
            self.target_run = None
            self.run_cls = target.Run
        else:
            self.wb = sys.modules.get("wandb") or __import__("wandb")
            self.target_run = target
            self.run_cls = type(target)
        self.rules: list[tuple[str, str]] = []        # (glob or name, step metric), latest first wins
        self.step_metric_names: set[str] = set()
        for pattern, metric in (step_metrics or {}).items():
            self._add_rule(pattern, metric)
        self._last_step_value: dict[str, int] = {}
        self._pending: dict[str, Any] | None = None
        self._pending_step: int | None = None
        self._counter = 0
        self._renamer: Any = None
        self.rows = 0                                  # committed rows sent to trackbridge
        self.dropped_by_wandb = 0                      # rows wandb dropped (step lower than its own) that we kept
        self._install()

    # -- which run is teed -------------------------------------------------------------------------------------------
    def _targets(self, run_self: Any) -> bool:
        if not self.active:
            return False
        if self.target_run is not None:
            return run_self is self.target_run
        return run_self is getattr(self.wb, "run", None)

    def _wandb_run(self) -> Any:
        return self.target_run if self.target_run is not None else getattr(self.wb, "run", None)

    def defaults(self) -> dict[str, Any]:
        """``project``, ``name`` and ``config`` of the wandb run; ``config=`` given to the wrapper is laid over the
        wandb run's config (nested dicts merged key by key)."""
        out = self._wandb_defaults()
        if self._user_config is not None:
            out["config"] = merged(out.get("config") or {}, dict(self._user_config))
        return out

    def _wandb_defaults(self) -> dict[str, Any]:
        r = self._wandb_run()
        out: dict[str, Any] = {}
        if r is None:
            return out
        for key, attr in (("project", "project"), ("name", "name")):
            try:
                val = getattr(r, attr, None)
            except Exception:
                val = None
            if isinstance(val, str) and val:
                out[key] = val
        try:
            cfg = dict(r.config)
            if cfg:
                out["config"] = {k: v for k, v in cfg.items() if not str(k).startswith("_")}
        except Exception:
            pass
        return out

    # -- patching ------------------------------------------------------------------------------------------------------
    def _install(self) -> None:
        cls = self.run_cls
        tee = self
        names = ("log", "define_metric", "finish")
        self._own_attr = {name: name in cls.__dict__ for name in names}   # False: inherited, delete on restore
        self._orig = {name: getattr(cls, name) for name in names}
        orig_log, orig_define, orig_finish = self._orig["log"], self._orig["define_metric"], self._orig["finish"]

        @functools.wraps(orig_log)
        def log(run_self: Any, data: Any = None, step: Any = None, commit: Any = None, *args: Any,
                **kwargs: Any) -> Any:
            if not tee._targets(run_self):
                return orig_log(run_self, data, step, commit, *args, **kwargs)
            return tee._log(orig_log, run_self, data, step, commit, args, kwargs)

        @functools.wraps(orig_define)
        def define_metric(run_self: Any, name: str, step_metric: Any = None, *args: Any, **kwargs: Any) -> Any:
            result = orig_define(run_self, name, step_metric, *args, **kwargs)
            if step_metric is not None and tee._targets(run_self):
                tee._add_rule(name, getattr(step_metric, "name", step_metric))
            return result

        @functools.wraps(orig_finish)
        def finish(run_self: Any, *args: Any, **kwargs: Any) -> Any:
            if tee._targets(run_self):
                code = args[0] if args else kwargs.get("exit_code")
                try:
                    tee.tracker_finished(failed=isinstance(code, int) and not isinstance(code, bool) and code != 0)
                except Exception as exc:
                    tee.warn_once("finish", f"trackbridge: finishing the trackbridge run with the wandb run failed "
                                            f"({type(exc).__name__}: {exc}); wandb is unaffected")
            return orig_finish(run_self, *args, **kwargs)

        self._patched = {"log": log, "define_metric": define_metric, "finish": finish}
        for name, fn in self._patched.items():
            setattr(fn, "__trackbridge_wrapper__", self)      # a function attribute: set dynamically
            setattr(cls, name, fn)
        self._rebind_globals(self._patched)

    def _rebind_globals(self, table: dict[str, Any]) -> None:
        """``wandb.log``/``wandb.define_metric`` are methods bound at ``wandb.init``: rebind them to ``table``."""
        for name in ("log", "define_metric"):
            bound = getattr(self.wb, name, None)
            owner = getattr(bound, "__self__", None)
            if owner is not None and isinstance(owner, self.run_cls) and self._targets_any(owner):
                setattr(self.wb, name, types.MethodType(table[name], owner))

    def tracker_finished(self, failed: bool = False) -> None:
        """The wrapped wandb run is finishing (``wandb.finish()``, ``run.finish()``, or wandb's own exit hook): send
        the last row and finish the trackbridge run (when this wrapper opened it; ``failed``: wandb's ``exit_code``
        was not 0). A record logged later reopens the trackbridge run with ``resume=True``."""
        with self._lock:
            try:
                self.flush()
            except Exception as exc:
                self.warn_once("flush", f"trackbridge: flushing the last wandb row failed: {exc}")
            if self._run is not None and self._owns_run and not getattr(self._run, "_finished", False):
                self._run.finish(failed=failed)

    def _targets_any(self, owner: Any) -> bool:
        return self.target_run is None or owner is self.target_run

    def restore(self) -> None:
        cls = self.run_cls
        for name, fn in self._patched.items():
            if cls.__dict__.get(name) is fn:
                if self._own_attr[name]:
                    setattr(cls, name, self._orig[name])
                else:
                    delattr(cls, name)
            # else: another wrapper was installed on top; ours stays in the chain as a pass-through (inactive)
        current = {name: getattr(cls, name) for name in ("log", "define_metric")}
        for name in ("log", "define_metric"):
            bound = getattr(self.wb, name, None)
            if bound is not None and getattr(bound, "__func__", None) is self._patched[name]:
                setattr(self.wb, name, types.MethodType(current[name], bound.__self__))

    # -- define_metric rules -------------------------------------------------------------------------------------------
    def _add_rule(self, pattern: str, step_metric: str) -> None:
        self.rules.insert(0, (str(pattern), str(step_metric)))
        self.step_metric_names.add(str(step_metric))

    def _step_metric_for(self, key: str) -> str | None:
        if key in self.step_metric_names:
            return key
        for pattern, metric in self.rules:          # exact names first, then globs (wandb's precedence)
            if pattern == key:
                return metric
        for pattern, metric in self.rules:
            if ("*" in pattern or "?" in pattern) and fnmatch.fnmatchcase(key, pattern):
                return metric
        return None

    # -- the tee -------------------------------------------------------------------------------------------------------
    def _log(self, orig_log: Any, run_self: Any, data: Any, step: Any, commit: Any, args: tuple[Any, ...],
             kwargs: dict[str, Any]) -> Any:
        with self._lock:
            before = self._row_step(run_self)
            out = data
            if self.wandb_names == "translated" and isinstance(data, dict):
                out = self._translated(data)
            result = orig_log(run_self, out, step, commit, *args, **kwargs)
            if isinstance(data, dict):
                try:
                    self._after(run_self, data, step, before)
                except Exception as exc:
                    self.warn_once(f"tee-{type(exc).__name__}", f"trackbridge: teeing wandb.log failed "
                                                                f"({type(exc).__name__}: {exc}); wandb is unaffected")
            return result

    def _row_step(self, run_self: Any) -> int | None:
        try:
            s = run_self.step
            return int(s) if s is not None else None
        except Exception:
            return None

    def _after(self, run_self: Any, data: dict[str, Any], step: Any, before: int | None) -> None:
        values = self._values(data)
        explicit = None if step is None else int(step)
        if before is None:                     # no step from wandb (should not happen): count rows ourselves
            before = self._counter
        if explicit is not None and explicit < before:
            self.dropped_by_wandb += 1         # wandb drops it; trackbridge keeps it at its own step
            self._emit_row(values, explicit)
            return
        row = before if explicit is None else explicit
        if self._pending is not None and self._pending_step != row:
            self.flush()                       # wandb committed the previous row
        if self._pending is None:
            self._pending, self._pending_step = {}, row
        self._pending.update(values)
        after = self._row_step(run_self)
        if after is None:
            after = row + 1 if (explicit is None) else row
        if after > row:
            self.flush()
        self._counter = max(self._counter, (after if after is not None else row))

    def flush(self) -> None:
        with self._lock:
            pending, row = self._pending, self._pending_step
            self._pending, self._pending_step = None, None
            if pending:
                self._emit_row(pending, row)

    def _emit_row(self, values: dict[str, Any], row: int | None) -> None:
        if not values:
            return
        groups: dict[str | None, dict[str, Any]] = {}
        for key, val in values.items():
            groups.setdefault(self._step_metric_for(key), {})[key] = val
        for metric, part in groups.items():
            step, axis = row, None
            if metric is not None:
                val = values.get(metric)
                num = _number(val)
                if num is not None:
                    self._last_step_value[metric] = num
                if metric in self._last_step_value:       # else: no value of it yet, the row's step
                    step, axis = self._last_step_value[metric], metric
            self.rows += 1
            self.emit(part, step, axis=axis)

    def _values(self, data: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, val in data.items():
            if not isinstance(key, str) or key in _WANDB_RESERVED:
                continue
            mod = type(val).__module__ or ""
            if mod.startswith("wandb"):
                conv = _wandb_histogram(val)
                if conv is None:
                    self.skipped[key] = type(val).__name__
                    continue
                val = conv
            out[key] = val
        return out

    def _translated(self, data: dict[str, Any]) -> dict[str, Any]:
        """``data`` under the names the trackbridge run's trackers get (``wandb_names="translated"``): the same
        source, names, mappings and run config as the run (see :meth:`_wandb_pipeline`). Step metrics, ``_``-keys
        and wandb media keep their names."""
        plain = {k: v for k, v in data.items() if isinstance(k, str) and not k.startswith("_")
                 and k not in self.step_metric_names and not (type(v).__module__ or "").startswith("wandb")}
        try:
            renamed, metrics = self._wandb_pipeline().rename(plain)
        except Exception as exc:
            self.warn_once("rename", f"trackbridge: translating names for wandb failed ({exc}); wandb gets the "
                                     f"original names")
            return data
        out: dict[str, Any] = {}
        for key, val in data.items():
            new = renamed.get(key) if isinstance(key, str) else None
            if new is not None and new not in out and new in metrics:
                out[new] = metrics[new]
            else:
                out[key] = val
        return out

    def _wandb_pipeline(self) -> "_NamesFor":
        """The translation wandb's names go through, built once from the trackbridge run (opened here if it was
        not yet): its source, naming, mappings and config, which is the wandb run's config with ``config=`` over
        it (or, for ``run=``, that run's config)."""
        if self._renamer is None:
            run = self._live_run()
            info = getattr(run, "info", None)
            opts = {**self.defaults(), **self._init_options}
            config = opts.get("config") if self._owns_run else getattr(info, "config", None)
            extra = getattr(info, "extra", None) or {}
            source = self._init_options.get("source") or getattr(info, "source", None) or "auto"
            names = getattr(run, "names", None) or opts.get("names") or "canonical"
            mappings = opts.get("mappings") or extra.get("mappings")
            self._renamer = _NamesFor(source, names, dict(config or {}), list(mappings or []))
        return self._renamer


class _NamesFor:
    """Original name -> the name a trackbridge tracker gets, as the logger does it: through
    :class:`trackbridge.pipeline.Pipeline`, source -> canonical with the run config (the logger's translation),
    then canonical -> ``names`` through the logger's Rename stage (its renaming for ``names=``), without derived
    values (wandb gets what it was given, renamed)."""

    def __init__(self, source: str, names: str, config: dict[str, Any], mappings: list[str]) -> None:
        from ..pipeline import Pipeline
        self.config = config
        self.to_canonical = Pipeline(source, "canonical", config=config, mappings=mappings or None, derive=False)
        self.names = names
        self.mappings = mappings
        self.to_names: Any = None

    def rename(self, plain: dict[str, Any]) -> tuple[dict[str, str], dict[str, Any]]:
        """``(original -> final name, final name -> value)`` for the values of one call."""
        from ..record import Record
        from ..translate import Translation
        first = self.to_canonical.setup(plain)
        if first is None:                    # source or names "keep": nothing renamed
            return {k: k for k in plain}, dict(plain)
        rep = Translation()
        rec = self.to_canonical.one(Record(None, None, dict(plain)), rep)
        renamed = {k: rep.renamed.get(k, k) for k in plain if rep.renamed.get(k, k) in rec.metrics}
        if self.names in ("canonical", ""):
            return renamed, dict(rec.metrics)
        if self.to_names is None:
            from ..pipeline.stages import Rename
            canon = dict(self.config)
            try:
                canon = {**canon, **dict(first.translate_config(self.config))}   # as the logger renames
            except Exception:
                pass
            self.to_names = Rename(self.names, config=canon, mappings=self.mappings or None, origin=first.source)
        second = Translation()
        out = self.to_names(rec, second)
        final = {k: second.renamed.get(c, c) for k, c in renamed.items() if second.renamed.get(c, c) in out.metrics}
        return final, dict(out.metrics)


def _number(val: Any) -> int | None:
    item = getattr(val, "item", None)
    if callable(item):
        try:
            val = item()
        except Exception:
            return None
    if isinstance(val, bool):
        return None
    if isinstance(val, int):
        return val
    if isinstance(val, float) and val == val and abs(val) != float("inf"):
        return int(val)
    return None


def _wandb_histogram(val: Any) -> Any:
    """A trackbridge Histogram from a ``wandb.Histogram`` (bucket edges and counts), else None."""
    if type(val).__name__ != "Histogram":
        return None
    bins, counts = getattr(val, "bins", None), getattr(val, "histogram", None)
    if bins is None or counts is None:
        return None
    from ..record import Histogram
    edges = [float(x) for x in bins]
    cnt = [float(c) for c in counts]
    if len(edges) != len(cnt) + 1:
        return None
    return Histogram(limits=edges[1:], counts=cnt, min=edges[0], max=edges[-1], num=float(sum(cnt)))


__all__ = ["WandbWrapper"]
