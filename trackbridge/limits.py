"""How big a run config may be: one rule for ``init`` and ``migrate``, checked before anything is written.

A config is the run's settings, read by every tracker at once when the run opens: a config of a million keys kept
every tracker pending after a 48 s ``init`` (MLflow takes 100 params a request, so 10,000 requests), and a 50 MB
string kept one tracker from opening its run (issue 31). trackbridge takes, counted on the config as the user gave
it, nested keys flattened (``{"a": {"b": 1}}`` is one key, ``a.b``; a list, a scalar or an empty dict is one value):

* at most :data:`MAX_KEYS` (10,000) keys. W&B asks for fewer than 10,000 distinct names per project to stay usable
  and MLflow writes params 100 per request; a veRL or OpenRLHF config flattens to about 300 - 1,500 keys.
* at most :data:`MAX_VALUE_BYTES` (1 MB, 1,000,000 bytes) per key, its name and its value as UTF-8 text: W&B's
  stated width for one value (under 1 MB).
* at most :data:`MAX_CONFIG_BYTES` (10 MB, 10,000,000 bytes) in all: under the 15 MB one API request of a tracker
  server may be (``max_req_size`` in the ``api.conf`` of one of the nine) and W&B's 25 MB for one call.

Beyond, :func:`check_config` raises :class:`~trackbridge.errors.ConfigTooLarge`, one line naming the key (or the
count) and the limit: nothing is written, no tracker is opened, nothing is left pending. A config within these limits
is written whole to the spool and every tracker, but one whose sink declares a shorter value it keeps
(``config_value_chars``: MLflow's params, 6,000 characters, 500 in old MLflow releases): that sink cuts a longer one
there, and ``init`` says so once per key (:func:`tracker_cuts`); the whole config stays in the run info the sink
stores beside (MLflow: the ``trackbridge.run`` tags), which trackbridge's reader restores.

A leaf module (it needs only :mod:`trackbridge.errors`): the logger and the pipeline (``migrate``) both use it.
"""
from __future__ import annotations

import os
from typing import Any

from .errors import ConfigTooLarge

MAX_KEYS = 10_000
MAX_VALUE_BYTES = 1_000_000
MAX_CONFIG_BYTES = 10_000_000
#: nesting below this depth is one value (``sanitize_config`` stores it as its ``repr()``, at most 2,000 characters)
_DEPTH = 50

_HINT = "nothing was written; keep the config to settings and log large data as a file or artifact"


def check_config(config: Any, where: str = "init(config=...)") -> None:
    """Raise :class:`~trackbridge.errors.ConfigTooLarge` when ``config`` is beyond the limits above (one line:
    ``where``, the key or the count, and the limit). Stops at the first key over a limit, so a config of a million
    keys or a 50 MB string is refused in milliseconds."""
    if config is None:
        return
    if not isinstance(config, dict):
        config = {"config": config}
    n = count_keys(config)
    if n > MAX_KEYS:
        raise ConfigTooLarge(f"{where}: the config has {n:,} keys (nested keys counted one by one), more than the "
                             f"{MAX_KEYS:,} trackbridge takes; {_HINT}")
    total = 0
    for i, (name, value) in enumerate(_leaves(config)):
        size = _size(name, MAX_VALUE_BYTES) + _size(value, MAX_VALUE_BYTES)
        if size > MAX_VALUE_BYTES:
            raise ConfigTooLarge(f"{where}: config key {_short(name)!r} is {_amount(size)} ({_what(value)}), more "
                                 f"than the {_amount(MAX_VALUE_BYTES)} a config value may be; {_HINT}")
        total += size
        if total > MAX_CONFIG_BYTES:
            raise ConfigTooLarge(f"{where}: the config is more than {_amount(MAX_CONFIG_BYTES)} in all (its first "
                                 f"{i + 1:,} of {n:,} keys, up to {_short(name)!r}); {_HINT}")


def tracker_cuts(config: Any, sinks: list[Any]) -> list[str]:
    """One line per config key a sink of ``sinks`` keeps cut: a sink whose class declares ``config_value_chars``
    (the characters of one config value its tracker keeps), for ``init`` to say. The config is within
    :func:`check_config`'s limits: at most 10,000 values to look at."""
    import json
    cut: dict[str, int] = {}
    for s in sinks:
        limit = getattr(type(s), "config_value_chars", None)
        if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0:
            cut.setdefault(str(getattr(s, "kind", type(s).__name__)), limit)
    if not cut or not isinstance(config, dict):
        return []
    out = []
    for name, value in _leaves(config):
        if isinstance(value, str):
            n = len(value)
        else:
            try:
                n = len(json.dumps(value, ensure_ascii=False, default=str))
            except (TypeError, ValueError, RecursionError):
                continue
        for kind, limit in cut.items():
            if n > limit:
                out.append(f"config key {_short(name)!r} is {n:,} characters: {kind} keeps its first {limit:,} "
                           f"(the other trackers and the spool keep it whole)")
    return out


def count_keys(config: dict[str, Any]) -> int:
    """The config's keys, flattened (a nested dict's keys counted one by one; lists, scalars and empty dicts are
    one value each)."""
    n = 0
    stack = [(config, 0)]
    while stack:
        d, depth = stack.pop()
        for v in d.values():
            if isinstance(v, dict) and v and depth < _DEPTH:
                stack.append((v, depth + 1))
            else:
                n += 1
    return n


def _leaves(config: dict[str, Any]) -> Any:
    stack: list[tuple[str, dict[str, Any], int]] = [("", config, 0)]
    while stack:
        prefix, d, depth = stack.pop()
        for k, v in d.items():
            name = f"{prefix}{k}"
            if isinstance(v, dict) and v and depth < _DEPTH:
                stack.append((name + ".", v, depth + 1))
            else:
                yield name, v


def _size(v: Any, budget: int, depth: int = 0) -> int:
    """The size of ``v`` as JSON text in bytes, or a number above ``budget`` as soon as it is known to be."""
    t = type(v)
    if v is None or t is bool:
        return 5
    if t is str:
        if len(v) > budget:         # UTF-8 takes at least a byte a character: over, without encoding 50 MB
            return len(v)
        return len(v.encode("utf-8", "surrogatepass")) + 2
    if t is int:
        return v.bit_length() * 30103 // 100000 + 2
    if t is float:
        return 24
    if isinstance(v, (bytes, bytearray, memoryview)):
        return len(v) + 3          # stored as its repr(): at least a character a byte
    if depth > _DEPTH:
        return 2000                # stored as its repr(), cut to 2,000 characters
    if isinstance(v, dict):
        total = 2
        for k, x in v.items():
            total += _size(k if isinstance(k, str) else str(k), budget - total, depth + 1) + 1
            total += _size(x, budget - total, depth + 1) + 1
            if total > budget:
                return total
        return total
    if isinstance(v, (list, tuple, set, frozenset)):
        total = 2
        for x in v:
            total += _size(x, budget - total, depth + 1) + 1
            if total > budget:
                return total
        return total
    if isinstance(v, (str, int, float)):        # subclasses: enums, numpy floats
        return _size(str(v) if isinstance(v, str) else v.__index__() if isinstance(v, int) else float(v), budget,
                     depth)
    nbytes = getattr(v, "nbytes", None)         # a numpy array or tensor: stored as its tolist()
    if isinstance(nbytes, int) and not isinstance(nbytes, bool):
        return max(nbytes, 1)
    if isinstance(v, os.PathLike):
        try:
            return len(os.fspath(v)) + 2
        except Exception:
            return 64
    try:
        return len(repr(v)) + 2
    except Exception:
        return 64


def _amount(n: int) -> str:
    """Bytes in decimal units (1 MB = 1,000,000 bytes, as the limits are stated)."""
    if n >= 1_000_000:
        return f"{n / 1e6:,.1f} MB".replace(".0 MB", " MB")
    if n >= 1_000:
        return f"{n / 1e3:,.1f} KB".replace(".0 KB", " KB")
    return f"{n:,} bytes"


def _what(v: Any) -> str:
    if isinstance(v, str):
        return f"a str of {len(v):,} characters"
    if isinstance(v, (list, tuple, set, frozenset, dict)):
        return f"a {type(v).__name__} of {len(v):,} items"
    return f"a {type(v).__name__}"


def _short(name: str) -> str:
    return name if len(name) <= 120 else name[:100] + f"... ({len(name):,} characters)"


__all__ = ["MAX_CONFIG_BYTES", "MAX_KEYS", "MAX_VALUE_BYTES", "check_config", "count_keys", "tracker_cuts"]
