"""``trackbridge.translate()``: one logged dict through a one-shot :class:`~trackbridge.pipeline.Pipeline`, the same
stages every run takes (Translate, then Derive when asked), as if a new pipeline were built for the call.

The compiled translator (its name map, target trainer, resolved source) is cached by source, target, mappings and
config, and each call runs on a :meth:`~trackbridge.pipeline.Translator.fresh` copy of it, so nothing carries over
to the next call (notes, marks, the derived rules' history) and repeated calls cost about what a reused translator
does. A source to detect is detected from the call's keys; the translator pinned to what a key set detects is
cached for that key set.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Any, Iterable, Mapping, cast

from ..record import Record
from ..translate import Translation
from .translator import Translator

_COMPILED: "OrderedDict[Any, Translator]" = OrderedDict()
_COMPILED_MAX = 32


def translate(metrics: Mapping[str, Any], source: str = "auto", target: str = "canonical", *,
              mappings: Iterable[str] | None = None, config: Mapping[str, Any] | None = None,
              derive: bool = False) -> Translation:
    """Translate one logged dict (``source``: ``auto`` or ``FRAMEWORK[/TRAINER][@VERSION]``; ``target``:
    ``canonical`` or a framework spec) and, with ``derive``, add the derived values the source did not log. Returns
    the :class:`~trackbridge.translate.Translation`: the translated dict, what was renamed, approximate, derived or
    unmapped, and the notes. Raises TypeError for anything but a mapping."""
    from . import Pipeline

    if not isinstance(metrics, (dict, Mapping)):        # a dict, checked first, is the common case
        raise TypeError(f"translate() takes a dict of metric name -> value, not {type(metrics).__name__}")
    tr = _fresh_translator(metrics, source, target, mappings, config)
    report = Translation()
    # the caller's mapping as the record's metrics, not a copy: the Translate stage only reads it
    out = Pipeline.over(tr, derive=derive).run(Record(None, None, cast(dict, metrics)), report)
    report.metrics = out.metrics
    report.notes = tr.notes
    return report


def _fresh_translator(metrics: Mapping[str, Any], source: str, target: str, mappings: Iterable[str] | None,
                      config: Mapping[str, Any] | None) -> Translator:
    """A translator with no run state for this call, from the compiled one of these settings (and, for a source to
    detect, of this key set)."""
    try:
        key = (source, target, tuple(str(m) for m in mappings or ()), _freeze(config))
        hash(key)
    except TypeError:
        key = None
    tr = _COMPILED.get(key) if key is not None else None
    if tr is None:
        tr = Translator(source, target, mappings=mappings, config=config)
        _keep(key, tr)
    else:
        _COMPILED.move_to_end(key)
    if tr.needs_detection:
        # the detection depends only on the keys (and the config in the key): a translator pinned to what these
        # keys detect is reused for the same key set
        k2 = (key, frozenset(metrics)) if key is not None else None     # a key that is no string: an error below
        pinned = _COMPILED.get(k2) if k2 is not None else None
        if pinned is None:
            pinned = tr.fresh()
            if not pinned.pin_source(metrics):
                return pinned               # nothing detected: names pass through, and its notes say so
            _keep(k2, pinned)
        tr = pinned
    return tr.fresh()


def _keep(key: Any, tr: Translator) -> None:
    if key is None:
        return
    _COMPILED[key] = tr
    while len(_COMPILED) > _COMPILED_MAX:
        _COMPILED.popitem(last=False)


def _freeze(value: Any) -> Any:
    if value is None or isinstance(value, (str, int, float)):
        return value
    if isinstance(value, Mapping):
        return tuple(sorted((str(k), _freeze(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    return value
