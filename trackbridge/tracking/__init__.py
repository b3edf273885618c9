"""What every tracker and every file reader builds on, in one place below them all: the interfaces and the helpers
they share. It imports no tracker, no file reader and not the registry, so a tracker's folder
(``trackbridge/trackers/<name>/``) and a file format's reader (``trackbridge/files/``) import it downward and never
each other (``tests/unit/test_import_graph.py``).

* :mod:`~trackbridge.tracking.sink`: :class:`Sink` (open / write a batch / close, ``held()`` for catch-up),
  :class:`Capabilities`, :class:`SinkError`, step limits, the reachability check of a server;
* :mod:`~trackbridge.tracking.source`: :class:`Source` and :class:`RunReader` (runs, records), :class:`Problem`,
  :class:`SourceError`, the rule that gathers stored points into records per step and split, the derived and
  time-axis marks restored on reading;
* :mod:`~trackbridge.tracking.names`: the reversible escape of metric names a tracker refuses (``xhex/1``);
* :mod:`~trackbridge.tracking.textfiles`: text files read as streams, binary junk told from damage, SQLite tables.

The registry of kinds (``register_tracker``, ``make_sink``, ``open_source``) is :mod:`trackbridge.trackers`, one
layer up. A tracker of your own subclasses :class:`Sink` and :class:`Source` from here.
"""
from __future__ import annotations

from .sink import Capabilities, Sink, SinkError
from .source import Problem, RunReader, Source, SourceError

__all__ = ["Capabilities", "Sink", "SinkError", "Problem", "RunReader", "Source", "SourceError"]
