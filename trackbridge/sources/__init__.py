"""The reader interface (:class:`~trackbridge.sources.base.Source`, :class:`~trackbridge.sources.base.RunReader`),
what several readers share (:mod:`~trackbridge.sources._files`), and the readers of file formats that are not
trackers: CSV exports (``csv.py``), ``trainer_state.json`` (``trainer_state.py``), console logs (``console.py``).
The trackers' readers live in ``trackbridge/trackers/<name>/``; every kind is registered in
:mod:`trackbridge.trackers`, whose ``open_source``, ``source_class`` and ``guess_locator`` are re-exported here."""
from __future__ import annotations

from ..trackers import guess_locator, open_source, source_class
from .base import Problem, RunReader, Source, SourceError

__all__ = ["Problem", "RunReader", "Source", "SourceError", "open_source", "source_class", "guess_locator"]
