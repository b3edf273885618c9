"""The tracker registry: every kind of run locator (``KIND:LOCATION``) is registered here once.

A tracker is one folder, ``trackbridge/trackers/<name>/``: its storage format, ``sink.py`` (a
:class:`~trackbridge.tracking.sink.Sink`: open / write / close), ``source.py`` (a
:class:`~trackbridge.tracking.source.Source` listing :class:`~trackbridge.tracking.source.RunReader` objects) and, in
its ``__init__``, ``sniff(path_or_uri) -> bool`` ("does this path or URI hold one of mine?"). One line at the end of
this module registers it. File formats that are read but never written (CSV exports, ``trainer_state.json``, console
logs) live in ``trackbridge/files/`` and register the same way, without a sink. Both build on
:mod:`trackbridge.tracking` (the interfaces and shared helpers, one layer down) and never import each other.

A user's tracker plugs in the same way, from anywhere::

    import trackbridge
    trackbridge.register_tracker("mytracker", sink=MySink, source=MySource, sniff=my_sniff)
    run = trackbridge.init(sinks=["mytracker:runs/mine"])        # and migrate, replay, compare, open_source ...

``sink``, ``source`` and ``sniff`` are objects or ``"module:attribute"`` strings, imported on first use: this module
imports no tracker, and a tracker's own package (``mlflow``, ``wandb`` ...) is imported only when its sink or reader
is used. ``sniff`` functions are tried in registration order by :func:`guess_locator` (the built-in ones first).
"""
from __future__ import annotations

import importlib
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Union, cast

from ..locators import Locator, LocatorError, is_locator, parse, split_label

if TYPE_CHECKING:       # pragma: no cover
    from ..tracking.sink import Sink
    from ..tracking.source import Source

_NAME = re.compile(r"^[a-z][a-z0-9-]*$")

#: what :func:`register_tracker` takes for each role: the object, or ``"module:attribute"`` imported on first use
SinkRef = Union["type[Sink]", str, None]
SourceRef = Union["type[Source]", str, None]
SniffRef = Union[Callable[[str], bool], str, None]


@dataclass
class Tracker:
    """One registered kind: what writes it (``sink``), what reads it (``source``), what recognises it (``sniff``),
    the packages it needs (``requires``, checked at ``init``) and the extra that installs them (``extra``:
    ``pip install 'trackbridge[EXTRA]'``)."""

    name: str
    sink: SinkRef = None
    source: SourceRef = None
    sniff: SniffRef = None
    extra: str = ""
    requires: tuple[str, ...] = ()
    _loaded: dict[str, Any] = field(default_factory=dict, repr=False)

    def _get(self, role: str) -> Any:
        """The object registered for ``role``, imported on first use when it was given as ``"module:attribute"``."""
        if role in self._loaded:
            return self._loaded[role]
        target = getattr(self, role)
        if target is None:
            raise LocatorError(f"{self.name!r} has no {role}; kinds with one: {', '.join(kinds(role))}")
        if isinstance(target, str):
            module, _, attr = target.partition(":")
            target = getattr(importlib.import_module(module), attr)
        self._loaded[role] = target
        return target

    def sink_class(self) -> type[Sink]:
        """The sink class (imported now if registered by name); LocatorError when this kind has none."""
        return cast("type[Sink]", self._get("sink"))

    def source_class(self) -> type[Source]:
        """The source class (imported now if registered by name); LocatorError when this kind has none."""
        return cast("type[Source]", self._get("source"))

    def sniffs(self, path_or_uri: str) -> bool:
        """Whether this tracker's ``sniff`` recognises ``path_or_uri`` (False when it has none, or it fails)."""
        if self.sniff is None:
            return False
        try:
            return bool(self._get("sniff")(path_or_uri))
        except Exception:       # noqa: BLE001  (a sniffer that cannot tell does not stop the others)
            return False


_TRACKERS: dict[str, Tracker] = {}


def _key(name: object) -> str:
    return str(name).strip().lower().replace("_", "-")


def register_tracker(name: str, *, sink: SinkRef = None, source: SourceRef = None, sniff: SniffRef = None,
                     extra: str = "", requires: tuple[str, ...] | list[str] = (), replace: bool = False) -> Tracker:
    """Register the kind ``name`` (used as ``name:LOCATION`` in every locator).

    ``sink``: a :class:`~trackbridge.tracking.sink.Sink` subclass, built as ``sink(location, **options)``;
    ``source``: a :class:`~trackbridge.tracking.source.Source` subclass, built the same way; at least one of the two.
    ``sniff(path_or_uri) -> bool``: whether a plain path holds this kind's runs (optional). Each may also be a
    ``"module:attribute"`` string, imported on first use. ``requires``: import names of the packages the sink
    needs (``init`` fails at once, naming ``extra``, when one is missing). ``replace=True`` replaces a kind that is
    registered already; otherwise registering a name twice is an error. Returns the :class:`Tracker`."""
    key = _key(name)
    if not _NAME.match(key):
        raise ValueError(f"register_tracker: bad name {name!r} (letters, digits and '-', starting with a letter)")
    if sink is None and source is None:
        raise ValueError(f"register_tracker({name!r}): give a sink, a source or both")
    if key in _TRACKERS and not replace:
        raise ValueError(f"register_tracker: {key!r} is registered already (pass replace=True to replace it)")
    entry = Tracker(key, sink=sink, source=source, sniff=sniff, extra=extra, requires=tuple(requires))
    _TRACKERS.pop(key, None)
    _TRACKERS[key] = entry
    return entry


def unregister_tracker(name: str) -> None:
    """Remove the kind ``name`` (no error when it is not registered)."""
    _TRACKERS.pop(_key(name), None)


def kinds(role: str | None = None) -> tuple[str, ...]:
    """The registered kinds, in registration order; ``role="sink"`` or ``"source"``: those that have one."""
    return tuple(k for k, t in _TRACKERS.items() if role is None or getattr(t, role) is not None)


def tracker(kind: str, role: str | None = None) -> Tracker:
    """The :class:`Tracker` registered as ``kind`` (with a ``role``: one that has a sink / a source)."""
    entry = _TRACKERS.get(_key(kind))
    if entry is None or (role is not None and getattr(entry, role) is None):
        what = f"{role} kind" if role else "kind"
        raise LocatorError(f"unknown {what} {kind!r}; expected one of {', '.join(kinds(role))}")
    return entry


def sink_class(kind: str) -> type[Sink]:
    """The sink class registered as ``kind``; LocatorError naming the kinds with a sink when there is none."""
    return tracker(kind, "sink").sink_class()


def source_class(kind: str) -> type[Source]:
    """The source class registered as ``kind``; LocatorError naming the kinds with a source when there is none."""
    return tracker(kind, "source").source_class()


def make_sink(spec: str | Locator | Sink) -> Sink:
    """A sink from a locator string (``tensorboard:runs/tb``), a parsed Locator, or a ready Sink object (returned as
    it is)."""
    if not isinstance(spec, (str, Locator)):
        return spec
    loc = spec if isinstance(spec, Locator) else parse(spec, kinds=kinds("sink"))
    entry = tracker(loc.kind, "sink")
    sink = entry.sink_class()(loc.location, **loc.options)
    if entry.requires and not getattr(sink, "requires", ()):
        sink.requires, sink.extra = entry.requires, entry.extra
    return sink


def open_source(spec: str | Locator) -> Source:
    """The reader of a locator (``LABEL=`` allowed and ignored here), or of a plain path a reader recognises
    (see :func:`source_locator`)."""
    loc = spec if isinstance(spec, Locator) else parse(source_locator(spec), allow_label=True, kinds=kinds("source"))
    return source_class(loc.kind)(loc.location, **loc.options)


def source_locator(text: str) -> str:
    """A run to read, as a locator: ``[LABEL=]KIND:LOCATION`` as given, or ``[LABEL=]PATH`` with the kind a
    reader recognises the path as (:func:`guess_locator`: a TensorBoard or wandb folder, a trainer_state.json, a
    CSV export, a console log ...). Raises :class:`~trackbridge.locators.LocatorError` for a path that does not
    exist or that no reader recognises, naming the path and the kinds."""
    import os
    if not isinstance(text, str):
        return text
    label, rest = split_label(text.strip())
    if not rest or is_locator(rest):
        return text                                  # KIND:LOCATION (or empty): parse() says what is wrong
    guessed = guess_locator(rest)
    if guessed is None:
        if not os.path.exists(rest):
            raise LocatorError(f"{text!r}: no such file or folder (a run is KIND:LOCATION or the path of one)")
        raise LocatorError(f"{text!r}: no reader recognises this path; name its kind, KIND:{rest}, KIND one of "
                           f"{', '.join(kinds('source'))}")
    return f"{label}={guessed}" if label else guessed


def guess_locator(path: str) -> str | None:
    """A locator for a plain path or URI, from the first registered kind whose ``sniff`` recognises it (a
    TensorBoard or wandb folder, a trainer_state.json, a CSV export, a JSON-lines stream, an MLflow or Trackio
    database, a console log, ...). None when none does (or the path does not exist)."""
    for entry in _TRACKERS.values():
        if entry.source is not None and entry.sniffs(path):
            return f"{entry.name}:{path}"
    return None


__all__ = ["Tracker", "register_tracker", "unregister_tracker", "kinds", "tracker", "sink_class", "source_class",
           "make_sink", "open_source", "guess_locator", "source_locator"]

# -- the built-in kinds: one line each; sniff() is tried in this order ------------------------------------------
_T = "trackbridge.trackers."
register_tracker("tensorboard", sink=_T + "tensorboard.sink:TensorBoardSink", source=_T + "tensorboard.source:TensorBoardSource", sniff=_T + "tensorboard:sniff", requires=("tensorboard",), extra="tensorboard")  # noqa: E501
register_tracker("wandb", sink=_T + "wandb.sink:WandbSink", source=_T + "wandb.source:WandbSource", sniff=_T + "wandb:sniff", requires=("wandb",), extra="wandb")  # noqa: E501
register_tracker("trainer-state", source="trackbridge.files.trainer_state:TrainerStateSource", sniff="trackbridge.files.trainer_state:sniff")  # noqa: E501
register_tracker("jsonl", sink=_T + "jsonl.sink:JsonlSink", source=_T + "jsonl.source:JsonlSource", sniff=_T + "jsonl:sniff")  # noqa: E501
register_tracker("trackio", sink=_T + "trackio.sink:TrackioSink", source=_T + "trackio.source:TrackioSource", sniff=_T + "trackio:sniff", requires=("trackio",), extra="trackio")  # noqa: E501
register_tracker("mlflow", sink=_T + "mlflow.sink:MlflowSink", source=_T + "mlflow.source:MlflowSource", sniff=_T + "mlflow:sniff", requires=("mlflow",), extra="mlflow")  # noqa: E501
register_tracker("csv", source="trackbridge.files.csv:CsvSource", sniff="trackbridge.files.csv:sniff")
register_tracker("console", source="trackbridge.files.console:ConsoleSource", sniff="trackbridge.files.console:sniff")  # noqa: E501
del _T
