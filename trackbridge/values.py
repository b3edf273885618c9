"""Normalise what a trainer passes to ``log()`` into the values a :class:`~trackbridge.record.Record` holds.

A record holds numbers (``int``/``float``, NaN and infinities kept), strings, :class:`~trackbridge.record.Histogram`
objects and ``None``. Trainers pass much more: numpy scalars, 0-d arrays, torch tensors (on any device, with or
without grad), Python lists of numbers, nested dicts. This module turns those into record values **by duck typing**,
so it never imports numpy or torch (``import trackbridge`` needs only PyYAML):

* ``int``/``float``/``str``/``None``/:class:`Histogram`: kept as they are (the fast path; most calls stop here).
* ``bool`` (and ``numpy.bool_``): ``0``/``1``.
* anything with ``.item()`` and a 0-d ``shape`` or one element (numpy scalars, 0-d arrays, 0-d tensors): ``.item()``.
  Tensors are detached and moved to the CPU first; the value is read *now*, so an in-place update after ``log()``
  cannot change what is logged.
* lists, tuples and arrays/tensors with one or more dimensions: a :class:`Histogram` of their (flattened) values.
* other numbers (``decimal.Decimal``, ``fractions.Fraction``, anything with ``__float__``): ``float(value)``.
* nested dicts: flattened to ``outer/inner`` names (the way trackers display grouped names).

Anything else (bytes, complex numbers, arbitrary objects) raises :class:`ValueError` naming the key and the type.
"""
from __future__ import annotations

import math
from typing import Any

from .record import Histogram

Value = "int | float | str | Histogram | None"


class UnsupportedValue(ValueError):
    """A logged value that no tracker can store; the message names the key and the type."""


def _describe(value: Any) -> str:
    t = type(value)
    return f"{t.__module__}.{t.__qualname__}" if t.__module__ != "builtins" else t.__qualname__


def _flatten_numbers(obj: Any, key: str, out: list[float]) -> None:
    if isinstance(obj, (list, tuple)):
        for item in obj:
            _flatten_numbers(item, key, out)
        return
    if isinstance(obj, bool) or type(obj).__name__ in ("bool_", "bool"):
        out.append(float(bool(obj)))
        return
    try:
        out.append(float(obj))
    except (TypeError, ValueError):
        raise UnsupportedValue(
            f"metric {key!r}: a list/array element of type {_describe(obj)} is not a number "
            f"(lists and arrays are logged as histograms of numbers)") from None


def _to_host(value: Any) -> Any:
    """Detach a tensor-like and move it to the CPU (no-ops for numpy arrays and scalars)."""
    detach = getattr(value, "detach", None)
    if callable(detach):
        value = detach()
        cpu = getattr(value, "cpu", None)
        if callable(cpu):
            value = cpu()
    return value


def _size(value: Any) -> int | None:
    shape = getattr(value, "shape", None)
    if shape is None:
        return None
    try:
        n = 1
        for d in tuple(shape):
            n *= int(d)
        return n
    except (TypeError, ValueError):
        return None


def normalize(value: Any, key: str = "?") -> Any:
    """One logged value as a record value (see the module docstring). Raises :class:`UnsupportedValue`."""
    t = type(value)
    if t is float or t is int or t is str or value is None or t is Histogram:
        return value
    if t is bool:
        return int(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, Histogram):
        return value
    if isinstance(value, (list, tuple)):
        vals: list[float] = []
        _flatten_numbers(value, key, vals)
        return Histogram.from_values(vals)
    if isinstance(value, (bytes, bytearray, complex)):
        raise UnsupportedValue(f"metric {key!r}: values of type {_describe(value)} cannot be stored by a tracker "
                               f"(log a number, a string, or a list of numbers)")
    # numpy / torch / jax and friends, by duck typing
    if hasattr(value, "item") and hasattr(value, "shape"):
        host = _to_host(value)
        ndim = getattr(host, "ndim", None)
        if ndim == 0:
            return _scalar(host.item(), key, value)
        tolist = getattr(host, "tolist", None)
        if callable(tolist):
            vals = []
            _flatten_numbers(tolist(), key, vals)
            return Histogram.from_values(vals)
    if hasattr(value, "item") and callable(value.item) and _size(value) in (None, 1):
        try:
            return _scalar(_to_host(value).item(), key, value)
        except (TypeError, ValueError):
            pass
    if hasattr(value, "__array__") and hasattr(value, "tolist"):
        vals = []
        _flatten_numbers(value.tolist(), key, vals)
        return Histogram.from_values(vals)
    if hasattr(value, "__float__"):
        try:
            return float(value)
        except (TypeError, ValueError, OverflowError):
            pass
    raise UnsupportedValue(f"metric {key!r}: values of type {_describe(value)} cannot be stored by a tracker "
                           f"(log a number, a string, a list/array of numbers, or a 0-d tensor)")


def _scalar(item: Any, key: str, original: Any) -> Any:
    t = type(item)
    if t is bool:
        return int(item)
    if t is int or t is float or t is str:
        return item
    if isinstance(item, complex):
        raise UnsupportedValue(f"metric {key!r}: complex value of type {_describe(original)} cannot be stored")
    try:
        return float(item)
    except (TypeError, ValueError):
        raise UnsupportedValue(f"metric {key!r}: {_describe(original)}.item() gave {_describe(item)}, "
                               f"not a number") from None


def normalize_metrics(metrics: Any, *, prefix: str = "") -> tuple[dict[str, Any], list[str]]:
    """Validate and normalise a ``log()`` dict.

    Returns ``(values, problems)``: ``problems`` holds one message per value that was left out because no tracker
    could store it. Raises :class:`TypeError` for a non-dict or a non-string key (a programming error, reported at
    once in the caller's thread rather than in a worker nobody sees).
    """
    if not isinstance(metrics, dict):
        raise TypeError(f"log() takes a dict of metric name -> value, got {_describe(metrics)}"
                        + (" (did you mean log({name: value})?)" if isinstance(metrics, (int, float, str)) else ""))
    out: dict[str, Any] = {}
    problems: list[str] = []
    for k, v in metrics.items():
        if type(k) is not str:
            raise TypeError(f"log(): metric names must be strings, got {_describe(k)} key {k!r}"
                            + (f" under {prefix.rstrip('/')!r}" if prefix else ""))
        tv = type(v)
        if tv is float or tv is int or tv is str or v is None:
            out[prefix + k if prefix else k] = v
            continue
        name = prefix + k if prefix else k
        if isinstance(v, dict):
            inner, inner_problems = normalize_metrics(v, prefix=name + "/")
            out.update(inner)
            problems.extend(inner_problems)
            continue
        try:
            out[name] = normalize(v, name)
        except UnsupportedValue as exc:
            problems.append(str(exc))
    return out, problems


def is_nonfinite(value: Any) -> bool:
    """True for NaN and infinities (the values some trackers cannot store)."""
    return type(value) is float and not math.isfinite(value)


__all__ = ["UnsupportedValue", "normalize", "normalize_metrics", "is_nonfinite"]


def as_step(step: Any) -> int | None:
    """An integer step from an int, a float with no fraction, or a numpy/torch scalar or 0-d tensor; ``None`` for
    ``None``, a bool, or anything else that is not a whole number."""
    if step is None or isinstance(step, bool):
        return None
    item = getattr(step, "item", None)
    if callable(item):
        step = item()
    if isinstance(step, float) and step.is_integer():
        return int(step)
    if isinstance(step, int) and not isinstance(step, bool):
        return step
    return None
