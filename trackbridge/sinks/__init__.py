"""The sink interface (:class:`~trackbridge.sinks.base.Sink`) and what several trackers' sinks share (reversible
name escaping in :mod:`~trackbridge.sinks._sanitize`). The sinks themselves live in ``trackbridge/trackers/<name>/``,
registered in :mod:`trackbridge.trackers`; ``make_sink`` and ``sink_class`` are that registry's, re-exported."""
from __future__ import annotations

from ..trackers import make_sink, sink_class
from .base import Capabilities, Sink, SinkError

__all__ = ["Capabilities", "Sink", "SinkError", "make_sink", "sink_class"]
