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
from typing import Any, Iterable

from . import Histogram
from .ranked import Weighted

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
    if isinstance(value, Weighted):      # a rank's share, logged without merge_ranks: its value (nothing to merge)
        return normalize(value.value, key)
    if isinstance(value, (list, tuple)):
        vals: list[float] = []
        _flatten_numbers(value, key, vals)
        return Histogram.from_values(vals)
    if isinstance(value, (bytes, bytearray, complex)):
        raise UnsupportedValue(f"metric {key!r}: values of type {_describe(value)} cannot be stored by a tracker "
                               f"(log a number, a string, or a list of numbers)")
    # numpy / torch / jax and friends, by duck typing
    if hasattr(value, "item") and hasattr(value, "shape"):
        try:
            host = _to_host(value)
            ndim = getattr(host, "ndim", None)
            if ndim == 0:
                return _scalar(host.item(), key, value)
            tolist = getattr(host, "tolist", None)
            if callable(tolist):
                vals = []
                _flatten_numbers(tolist(), key, vals)
                return Histogram.from_values(vals)
        except RuntimeError as exc:      # a tensor without readable data (sparse, meta ...): left out, said why
            raise UnsupportedValue(f"metric {key!r}: a {_describe(value)} whose values cannot be read "
                                   f"({str(exc).splitlines()[0][:120]})") from None
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


# Keys already checked (a str, not empty, encodable as UTF-8): training logs the same names every step, so each is
# checked once; a set lookup costs what the old ``type(k) is str`` test did. Bounded: cleared when it grows past
# _GOOD_KEYS_MAX (a trainer that makes up new names every step only pays the check again).
_GOOD_KEYS: set[str] = set()
_GOOD_KEYS_MAX = 200_000

#: the largest step every tracker stores exactly (wandb and Trackio's dashboards are JavaScript: 2**53 - 1)
STEP_MAX = 2 ** 53 - 1
_FLOAT_MAX_INT = 2 ** 1023      # ints at least this large may not convert to a float (TensorBoard, MLflow need one)


def utf8_ok(text: str) -> bool:
    """True when ``text`` can be written as UTF-8 (no lone surrogate such as ``"\\ud800"``)."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _key_problem(k: Any, prefix: str) -> str | None:
    """Why a metric name cannot be logged (``None`` when it can; it is then remembered as good). Raises
    :class:`TypeError` for a name that is not a string (a programming error)."""
    if type(k) is not str:
        if not isinstance(k, str):
            raise TypeError(f"log(): metric names must be strings, got {_describe(k)} key {k!r}"
                            + (f" under {prefix.rstrip('/')!r}" if prefix else ""))
        k = str(k)
    if not k:
        where = f" under {prefix.rstrip('/')!r}" if prefix else ""
        return f"metric {prefix + k!r}: an empty metric name{where} cannot be stored by a tracker"
    if not utf8_ok(k):
        return (f"metric {printable(prefix + k)!r}: the name holds a lone "
                f"surrogate (invalid Unicode), which no tracker can store")
    if len(_GOOD_KEYS) >= _GOOD_KEYS_MAX:
        _GOOD_KEYS.clear()
    _GOOD_KEYS.add(k)
    return None


def _value_problem(name: str, v: Any) -> tuple[Any, str | None]:
    """The slow checks of a str/int/Histogram value: ``(value to log, None)`` or ``(None, why it is left out)``."""
    if type(v) is str or isinstance(v, str):
        if utf8_ok(v):
            return v, None
        return None, (f"metric {name!r}: the string value holds a lone surrogate (invalid Unicode), which no "
                      f"tracker can store")
    if isinstance(v, int):
        if -_FLOAT_MAX_INT < v < _FLOAT_MAX_INT:
            return v, None
        try:
            return float(v), None
        except OverflowError:
            return None, f"metric {name!r}: the integer {str(v)[:20]}... is too large for any tracker (> 1.8e308)"
    if isinstance(v, Histogram):
        fixed = v.finite()
        if fixed is None:
            return None, (f"metric {name!r}: the histogram's bucket edges, counts or statistics are NaN or "
                          f"infinite, which no tracker can store")
        return fixed, None
    return v, None


def batched(value: Any) -> bool:
    """True for a torch tensor (on the CPU or a GPU): the logger reads all of a call's tensors in one batch
    (``trackbridge.logger.device``: CUDA ones without synchronising the GPU), where :func:`normalize` reads them one
    by one (and waits for the GPU for each CUDA tensor)."""
    return isinstance(getattr(value, "is_cuda", None), bool)


def normalize_metrics(metrics: Any, *, prefix: str = "",
                      defer: list[tuple[str, Any]] | None = None) -> tuple[dict[str, Any], list[str]]:
    """Validate and normalise a ``log()`` dict.

    ``defer``: a list that takes ``(name, tensor)`` for each torch tensor (:func:`batched`; the tensor is kept as the
    value, for the caller to replace once read); without it each tensor is read here, one by one.

    Returns ``(values, problems)``: ``problems`` holds one message per value that was left out because no tracker
    could store it (each message starts with ``metric '<name>'``): an empty name, a name or string holding a lone
    surrogate, an integer beyond the float range, a histogram whose edges/counts are not finite, an unsupported
    type. NaN/inf samples of a list or array are left out of its histogram (counted in ``Histogram.nonfinite``).
    Raises :class:`TypeError` for a non-dict or a non-string key (a programming error, reported at once in the
    caller's thread rather than in a worker nobody sees).
    """
    if not isinstance(metrics, dict):
        raise TypeError(f"log() takes a dict of metric name -> value, got {_describe(metrics)}"
                        + (" (did you mean log({name: value})?)" if isinstance(metrics, (int, float, str)) else ""))
    out: dict[str, Any] = {}
    problems: list[str] = []
    good = _GOOD_KEYS
    for k, v in metrics.items():
        if k not in good:
            bad = _key_problem(k, prefix)
            if bad is not None:
                problems.append(bad)
                continue
            k = str(k)
        tv = type(v)
        if tv is float or v is None:
            out[prefix + k if prefix else k] = v
            continue
        name = prefix + k if prefix else k
        if tv is int:
            if -_FLOAT_MAX_INT < v < _FLOAT_MAX_INT:
                out[name] = v
                continue
        elif tv is str:
            if v.isascii():
                out[name] = v
                continue
        elif isinstance(v, dict):
            inner, inner_problems = normalize_metrics(v, prefix=name + "/", defer=defer)
            out.update(inner)
            problems.extend(inner_problems)
            continue
        elif defer is not None and batched(v):
            defer.append((name, v))
            out[name] = v
            continue
        try:
            value = normalize(v, name)
        except UnsupportedValue as exc:
            problems.append(str(exc))
            continue
        value, bad = _value_problem(name, value)
        if bad is not None:
            problems.append(bad)
        else:
            out[name] = value
    return out, problems


def check_step(step: int) -> int:
    """``step`` when every tracker can store it (0 <= step <= :data:`STEP_MAX`), else :class:`ValueError`."""
    if 0 <= step <= STEP_MAX:
        return step
    raise ValueError(f"log(step={step!r}): steps must be between 0 and 2**53 - 1 = {STEP_MAX} (the range every "
                     f"tracker stores exactly: some show steps in JavaScript, whose numbers are exact up to 2**53, "
                     f"the others keep 64-bit integers); nothing was logged for this call")


def is_nonfinite(value: Any) -> bool:
    """True for NaN and infinities (the values some trackers cannot store)."""
    return type(value) is float and not math.isfinite(value)


__all__ = ["UnsupportedValue", "normalize", "normalize_metrics", "is_nonfinite", "check_step", "utf8_ok", "STEP_MAX",
           "batched"]


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


# -- the run's config: made JSON before any sink sees it ----------------------------------------------------------
def printable(text: str) -> str:
    """``text`` safe to print or store as UTF-8 (a lone surrogate becomes a ``\\udXXX`` escape): the one text-safety
    helper of the package (the canonical stream's writer, the sinks' messages, the run config)."""
    return text if utf8_ok(text) else text.encode("utf-8", "backslashreplace").decode("utf-8")


_FLOAT_INT = int(1.7976931348623157e308)     # the largest int a float holds (about)


def _config_value(v: Any, path: str, notes: list[tuple[str, str]], depth: int = 0) -> Any:
    t = type(v)
    if t is int and not -_FLOAT_INT <= v <= _FLOAT_INT:
        # beyond a float (10**400): TensorBoard's hparams and MLflow's params hold numbers as floats; kept exact
        # as its digits (Python refuses to print more than 4300 of them)
        digits = v.bit_length() * 30103 // 100000 + 1
        text = str(v) if digits <= 4000 else f"<an integer of about {digits} digits>"
        notes.append((path, f"config {path!r}: an integer beyond what a float holds; stored as its decimal text"))
        return text
    if v is None or t is bool or t is int or t is str:
        if t is str and not utf8_ok(v):
            notes.append((path, f"config {path!r}: a lone surrogate in the text was written as a \\u escape"))
            return printable(v)
        return v
    if t is float:
        if v - v == 0.0:
            return v
        text = "NaN" if v != v else ("Infinity" if v > 0 else "-Infinity")
        notes.append((path, f"config {path!r}: {v!r} is not JSON; stored as the string {text!r}"))
        return text
    if depth > 50:
        notes.append((path, f"config {path!r}: nested too deep; stored as its repr()"))
        return printable(repr(v)[:2000])
    if isinstance(v, dict):
        out: dict[str, Any] = {}
        for k, x in v.items():
            key = k if type(k) is str else (str(k) if isinstance(k, (str, int, float, bool)) or k is None else repr(k))
            if not utf8_ok(key):
                key = printable(key)
                notes.append((key, f"config {key!r}: a lone surrogate in the key was written as a \\u escape"))
            sub = f"{path}.{key}" if path else key
            if key is not k and not isinstance(k, (str, int, float, bool)) and k is not None:
                notes.append((sub, f"config {sub!r}: the key is a {_describe(k)}, not a string; stored as its repr()"))
            out[key] = _config_value(x, sub, notes, depth + 1)
        return out
    if isinstance(v, (list, tuple)):
        return [_config_value(x, f"{path}[{i}]", notes, depth + 1) for i, x in enumerate(v)]
    if isinstance(v, (set, frozenset)):
        items = [_config_value(x, f"{path}{{}}", notes, depth + 1) for x in v]
        try:
            items.sort()
        except TypeError:
            items.sort(key=repr)
        notes.append((path, f"config {path!r}: a {t.__name__} is not JSON; stored as a sorted list"))
        return items
    if isinstance(v, (str, int, float)):          # subclasses (enums, numpy floats ...)
        base = str if isinstance(v, str) else (int if isinstance(v, int) else float)
        return _config_value(base(v), path, notes, depth + 1)
    import os
    if isinstance(v, os.PathLike):
        return printable(os.fspath(v) if not isinstance(os.fspath(v), bytes) else repr(os.fspath(v)))
    item = getattr(v, "item", None)
    if callable(item) and _size(v) in (None, 1):
        try:
            return _config_value(item(), path, notes, depth + 1)
        except Exception:
            pass
    tolist = getattr(v, "tolist", None)
    if callable(tolist):
        try:
            return _config_value(tolist(), path, notes, depth + 1)
        except Exception:
            pass
    try:
        text = repr(v)
    except Exception:
        text = f"<{_describe(v)}>"
    notes.append((path, f"config {path!r}: a {_describe(v)} is not JSON; stored as its repr() {text[:80]!r}"))
    return printable(text)


def _flat_names(config: dict[str, Any], sep: str, prefix: str, owner: str, seen: dict[str, str],
                clashes: list[tuple[str, str, str]]) -> None:
    for k, v in config.items():
        name = f"{prefix}{sep}{k}" if prefix else k
        path = f"{owner} > {k}" if owner else k
        if isinstance(v, dict) and v:
            _flat_names(v, sep, name, path, seen, clashes)
        elif name in seen:
            clashes.append((name, seen[name], path))
        else:
            seen[name] = path


def sanitize_config(config: Any, flattened: Iterable[tuple[str, str]] = ()) -> tuple[dict[str, Any],
                                                                                    list[tuple[str, str]]]:
    """The run config as plain JSON, for the spool and every tracker; returns ``(config, notes)``.

    NaN/+-inf become the strings ``"NaN"``/``"Infinity"``/``"-Infinity"``; a ``pathlib.Path`` (any ``os.PathLike``)
    its text (no note: the path is exact); a set a sorted list; tuples lists; a numpy scalar/array or 0-d tensor
    its ``item()``/``tolist()``; a non-string key its ``str()``; a lone surrogate a ``\\udXXX`` escape; anything
    else its ``repr()``. ``notes`` holds ``(key, message)`` for each change a user should hear about, and for nested
    keys that flatten to the same name in a tracker that flattens the config, where only one of them is kept:
    ``flattened`` holds ``(separator, what the tracker calls the flat config)`` for each such tracker (a sink's
    ``capabilities.flat_config``: ``("/", "TensorBoard's hparams")`` gives ``a/b``).
    """
    notes: list[tuple[str, str]] = []
    if not isinstance(config, dict):
        config = {} if config is None else {"config": config}
    clean = _config_value(config, "", notes)
    for sep, where in dict.fromkeys(flattened):
        clashes: list[tuple[str, str, str]] = []
        _flat_names(clean, sep, "", "", {}, clashes)
        for name, first, second in clashes:
            notes.append((f"flat:{sep}{name}", f"config keys {first!r} and {second!r} both flatten to {name!r} in "
                                              f"{where}; only the last one is kept there (the spool keeps the "
                                              f"nested config, as the trackers that do not flatten it do)"))
    return clean, notes


def flat_config(config: dict[str, Any], sep: str = ".", prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a<sep>b": 1}``, as trackers that keep a config flat store it (with ``.`` or
    ``/``, depending on the tracker); lists, scalars and empty dicts are leaves."""
    out: dict[str, Any] = {}
    for k, v in config.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flat_config(v, sep, key + sep))
        else:
            out[key] = v
    return out
