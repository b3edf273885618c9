"""The compiled facts of a translation, hub and spoke: what a name means on either side and how faithfully it
carries over. Nothing here holds a run's state (the per-run :class:`~trackbridge.pipeline.Translator` and the stages
that use these facts live in :mod:`trackbridge.pipeline`).

* :mod:`.entries`: the plans of single entries (which release's entry a key takes, its split, its marks);
* :mod:`.names`: the compiled, immutable name map of a source and a target (key -> canonical -> target), each key
  compiled once per map, so translating a dict is one dictionary lookup per key;
* :mod:`.fidelity`: exact or approximate, computed from the entries' stated reductions;
* :mod:`.resolve`: the source and the target trainer a spec and a run's keys resolve to;
* :mod:`.report`: what one translation reports (:class:`Translation`) and a run's sum of them (:class:`Report`).

Tracker prefixes (``train/``, ``eval/``, ``eval_`` ...) are understood and kept as a split: canonical names of eval
records carry an ``eval/`` prefix, and a framework target gets its own eval prefix back. Unknown keys pass through
unchanged and are reported; nothing is dropped.
"""
from __future__ import annotations

from ..schema.spec import SpecError
from .entries import flatten_config
from .report import Report, Translation

# the public classes are documented, printed and pickled under the package's name, where users import them from
for _cls in (Report, Translation):
    _cls.__module__ = __name__
del _cls

__all__ = ["Report", "Translation", "flatten_config", "SpecError"]
