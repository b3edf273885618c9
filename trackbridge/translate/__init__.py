"""Hub-and-spoke translation of logged metric dicts.

Every translation goes source -> canonical -> target, in stages (:mod:`.translator`): resolve the source and the
target (:mod:`.resolve`), translate the names through the compiled name map of the two (:mod:`.names`; fidelity
computed from the entries' stated reductions, :mod:`.fidelity`), derive what the source did not log
(:mod:`.derived`), rename into the target. A key is compiled once per map, so translating a dict is one dictionary
lookup per key.
Tracker prefixes (``train/``, ``eval/``, ``eval_`` ...) are understood and kept as a split: canonical names of eval
records carry an ``eval/`` prefix, and a framework target gets its own eval prefix back. Unknown keys pass through
unchanged and are reported; nothing is dropped.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Any, Iterable, Mapping

from ..schema.spec import SpecError
from .entries import flatten_config
from .report import Report, Translation
from .translator import Translator

# the public classes are documented, printed and pickled under the package's name, where users import them from
for _cls in (Report, Translation, Translator):
    _cls.__module__ = __name__
del _cls

_COMPILED: "OrderedDict[Any, Translator]" = OrderedDict()
_COMPILED_MAX = 32


def translate(metrics: Mapping[str, Any], source: str = "auto", target: str = "canonical", *,
              mappings: Iterable[str] | None = None, config: Mapping[str, Any] | None = None,
              derive: bool = False) -> Translation:
    """Translate one logged dict (one-shot: nothing carries over to the next call, as if a new
    :class:`Translator` were built). The compiled translator is cached by source, target, mappings and config, so
    repeated calls cost about what a reused Translator does; derivation, whose rules keep history, is not cached."""
    if derive:
        return Translator(source, target, mappings=mappings, config=config, derive=True).translate(metrics)
    try:
        key = (source, target, tuple(str(m) for m in mappings or ()), _freeze(config))
        hash(key)
    except TypeError:
        key = None
    tr = _COMPILED.get(key) if key is not None else None
    if tr is None:
        tr = Translator(source, target, mappings=mappings, config=config)
        if key is not None:
            _COMPILED[key] = tr
            while len(_COMPILED) > _COMPILED_MAX:
                _COMPILED.popitem(last=False)
    else:
        _COMPILED.move_to_end(key)
    if tr.needs_detection:
        # the detection depends only on the keys (and the config in the key): a translator pinned to what these
        # keys detect is reused for the same key set
        try:
            k2 = (key, frozenset(k for k in metrics if isinstance(k, str))) if key is not None else None
        except TypeError:
            k2 = None
        pinned = _COMPILED.get(k2) if k2 is not None else None
        if pinned is None:
            pinned = tr.fresh()
            if not pinned.pin_source(metrics):
                return pinned.translate(metrics)        # nothing detected: names pass through, and it says so
            if k2 is not None:
                _COMPILED[k2] = pinned
                while len(_COMPILED) > _COMPILED_MAX:
                    _COMPILED.popitem(last=False)
        tr = pinned
    return tr.fresh().translate(metrics)


def _freeze(value: Any) -> Any:
    if isinstance(value, Mapping):
        return tuple(sorted((str(k), _freeze(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    return value


__all__ = ["Report", "Translation", "Translator", "translate", "flatten_config", "SpecError"]
