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
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Union, cast

from ..errors import UsageError
from ..extras import require
from ..tracking.locators import Locator, LocatorError, is_locator, parse, split_label

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
    the packages its sink needs (``requires``) and its reader (``source_requires``; None: the same), and the extra
    that installs them (``extra``: ``pip install 'trackbridge[EXTRA]'``). A missing package is a
    :class:`~trackbridge.extras.MissingExtra` naming the extra, raised when the sink or reader class is asked for,
    before anything is read or written."""

    name: str
    sink: SinkRef = None
    source: SourceRef = None
    sniff: SniffRef = None
    extra: str = ""
    requires: tuple[str, ...] = ()
    source_requires: tuple[str, ...] | None = None
    _loaded: dict[str, Any] = field(default_factory=dict, repr=False)

    def _get(self, role: str) -> Any:
        """The object registered for ``role``, imported on first use when it was given as ``"module:attribute"``."""
        if role in self._loaded:
            return self._loaded[role]
        target = getattr(self, role)
        if target is None:
            raise LocatorError(f"{self.name!r} has no {role}; kinds with one: {', '.join(kinds(role))}")
        if role in ("sink", "source"):
            require(self.needs(role), self.extra, f"the {self.name} {'reader' if role == 'source' else role}")
        if isinstance(target, str):
            module, _, attr = target.partition(":")
            try:
                target = getattr(importlib.import_module(module), attr)
            except AttributeError:
                raise UsageError(f"tracker {self.name!r}: its {role} {getattr(self, role)!r} names no attribute "
                                 f"{attr!r} of {module}") from None
            _check(self.name, role, target, f"{getattr(self, role)!r}")
        self._loaded[role] = target
        return target

    def needs(self, role: str) -> tuple[str, ...]:
        """The import names of the packages the ``role`` ("sink" or "source") needs."""
        if role == "source" and self.source_requires is not None:
            return self.source_requires
        return self.requires

    def sink_class(self) -> type[Sink]:
        """The sink class (imported now if registered by name); LocatorError when this kind has none, MissingExtra
        when a package it needs is not installed."""
        return cast("type[Sink]", self._get("sink"))

    def source_class(self) -> type[Source]:
        """The source class (imported now if registered by name); LocatorError when this kind has none, MissingExtra
        when a package it needs is not installed."""
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
#: options every command that reads a run takes, whatever the reader (``?from=FRAMEWORK[@VERSION]``: the framework
#: the run's names come from, see :func:`trackbridge.read.inputs.open_runs`)
READ_OPTIONS = ("from",)
_BUILT_IN: dict[str, Tracker] = {}      # the kinds registered below: replacing one of them warns


def _key(name: object) -> str:
    return str(name).strip().lower().replace("_", "-")


_REF_MODULE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
_REF = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$")


def _bases() -> tuple[type[Sink], type[Source]]:
    from ..tracking.sink import Sink
    from ..tracking.source import Source
    return Sink, Source


def _check(name: str, role: str, obj: Any, what: str) -> None:
    """What Accelerate's ``register_tracker_class`` checks of a tracker class, for each role: a sink is a concrete
    subclass of :class:`~trackbridge.tracking.sink.Sink`, a source of :class:`~trackbridge.tracking.source.Source`,
    and ``sniff`` is callable. Raises :class:`~trackbridge.errors.UsageError` naming the kind, the role and what is
    wrong (at registration for objects, on first use for ``"module:attribute"`` strings)."""
    import inspect
    if role == "sniff":
        if not callable(obj):
            raise UsageError(f"register_tracker({name!r}): sniff {what} is not callable (a function path -> bool)")
        return
    base = _bases()[0 if role == "sink" else 1]
    if not (isinstance(obj, type) and issubclass(obj, base)):
        raise UsageError(f"register_tracker({name!r}): {role} {what} is not a subclass of "
                         f"trackbridge.tracking.{base.__name__}")
    if inspect.isabstract(obj):
        missing = ", ".join(sorted(getattr(obj, "__abstractmethods__", ())))
        raise UsageError(f"register_tracker({name!r}): {role} {obj.__qualname__} does not implement {missing}")
    known = getattr(obj, "option_names", None)
    if known is not None and (isinstance(known, str) or not all(isinstance(k, str) for k in known)):
        raise UsageError(f"register_tracker({name!r}): {obj.__qualname__}.option_names must be a tuple of option "
                         f"names, not {known!r}")


def register_tracker(name: str, *, sink: SinkRef = None, source: SourceRef = None, sniff: SniffRef = None,
                     extra: str = "", requires: tuple[str, ...] | list[str] = (),
                     source_requires: tuple[str, ...] | list[str] | None = None, replace: bool = False) -> Tracker:
    """Register the kind ``name`` (used as ``name:LOCATION`` in every locator).

    ``sink``: a :class:`~trackbridge.tracking.sink.Sink` subclass, built as ``sink(location, **options)``;
    ``source``: a :class:`~trackbridge.tracking.source.Source` subclass, built the same way; at least one of the two.
    ``sniff(path_or_uri) -> bool``: whether a plain path holds this kind's runs (optional). Each may also be a
    ``"module:attribute"`` string, imported on first use. ``requires``: import names of the packages the sink
    needs, ``source_requires`` those the reader needs (default: ``requires``); asking for the sink or the reader
    (``init``, ``migrate``, ``open_source`` ...) fails at once with :class:`~trackbridge.extras.MissingExtra`, naming
    ``extra``, when one is missing. ``replace=True`` replaces a kind that is registered already (with a warning for
    a built-in one); otherwise registering a name twice is an error.

    Checked here, as Accelerate's ``register_tracker_class`` checks a tracker class: the name; that a sink is a
    subclass of :class:`~trackbridge.tracking.sink.Sink` and a source of :class:`~trackbridge.tracking.source.Source`
    that implement every abstract method; that ``sniff`` is callable; ``requires``, ``source_requires`` and
    ``extra``. A ``"module:attribute"`` string is checked for its form here and for what it names on first use. Each
    problem is a :class:`~trackbridge.errors.UsageError` naming the kind and the role. Returns the :class:`Tracker`."""
    key = _key(name)
    if not isinstance(name, str) or not _NAME.match(key):
        raise UsageError(f"register_tracker: bad name {name!r} (letters, digits and '-', starting with a letter)")
    if sink is None and source is None:
        raise UsageError(f"register_tracker({name!r}): give a sink, a source or both")
    if key in _TRACKERS and not replace:
        raise UsageError(f"register_tracker: {key!r} is registered already (pass replace=True to replace it)")
    for role, ref in (("sink", sink), ("source", source), ("sniff", sniff)):
        if isinstance(ref, str):
            if not _REF.match(ref):
                raise UsageError(f"register_tracker({name!r}): {role}={ref!r} is not 'package.module:attribute'")
        elif ref is not None:
            _check(key, role, ref, repr(ref))
    if isinstance(requires, str) or not all(isinstance(r, str) and _REF_MODULE.match(r) for r in requires):
        raise UsageError(f"register_tracker({name!r}): requires={requires!r} must be a list of import names, "
                         f"such as ('wandb',)")
    if source_requires is not None and (isinstance(source_requires, str) or not all(
            isinstance(r, str) and _REF_MODULE.match(r) for r in source_requires)):
        raise UsageError(f"register_tracker({name!r}): source_requires={source_requires!r} must be a list of import "
                         f"names, such as ('wandb',)")
    if not isinstance(extra, str) or (extra and not _NAME.match(extra)):
        raise UsageError(f"register_tracker({name!r}): extra={extra!r} must be the name of a trackbridge extra")
    if replace and key in _BUILT_IN:
        warnings.warn(f"register_tracker: {key!r} replaces the built-in {key} tracker in this process", stacklevel=2)
    entry = Tracker(key, sink=sink, source=source, sniff=sniff, extra=extra, requires=tuple(requires),
                    source_requires=None if source_requires is None else tuple(source_requires))
    _TRACKERS[key] = entry          # a replaced kind keeps its place in the order sniff() is tried
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
    cls = entry.sink_class()
    check_options(loc, cls)
    sink = cls(loc.location, **loc.options)
    sink.kind = entry.name              # what its locator() says, for replay and the writer process
    if entry.requires and not getattr(sink, "requires", ()):
        sink.requires, sink.extra = entry.requires, entry.extra
    return sink


def open_source(spec: str | Locator) -> Source:
    """The reader of a locator (``LABEL=`` allowed and ignored here), or of a plain path a reader recognises
    (see :func:`source_locator`)."""
    loc = spec if isinstance(spec, Locator) else parse(source_locator(spec), allow_label=True, kinds=kinds("source"))
    cls = source_class(loc.kind)
    check_options(loc, cls)
    return cls(loc.location, **loc.options)


def check_options(loc: Locator, cls: type[Sink] | type[Source] | None = None) -> None:
    """Refuse an option that the sink or reader ``cls`` (by default the kind's sink) does not know: a misspelt
    ``?experimnet=`` would otherwise be ignored and the run written where it was not meant to go. A class that
    declares no :attr:`option_names` (a tracker of your own that has not) takes anything."""
    if cls is None:
        cls = sink_class(loc.kind)
    known = getattr(cls, "option_names", None)
    if known is None:
        return
    role = "reader" if issubclass(cls, _bases()[1]) else "sink"
    if role == "reader":
        known = (*known, *READ_OPTIONS)
    unknown = [k for k in loc.options if k not in known]
    if not unknown:
        return
    import difflib
    hint = difflib.get_close_matches(unknown[0], known, n=1)
    mean = f" (did you mean {hint[0]!r}?)" if hint else ""
    takes = f"takes {', '.join(sorted(known))}" if known else "takes no option"
    raise LocatorError(f"{loc.kind}:{loc.location}: unknown option {unknown[0]!r}{mean}; the {loc.kind} {role} "
                       f"{takes}")


def source_locator(text: str) -> str:
    """A run to read, as a locator: ``[LABEL=]KIND:LOCATION`` as given, or ``[LABEL=]PATH`` with the kind a
    reader recognises the path as (:func:`guess_locator`: a TensorBoard or wandb folder, a trainer_state.json, a
    CSV export, a console log ...). Raises :class:`~trackbridge.tracking.locators.LocatorError` for a path that does not
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
           "make_sink", "open_source", "check_options", "guess_locator", "source_locator"]

# -- the built-in kinds: one line each; sniff() is tried in this order ------------------------------------------
_T = "trackbridge.trackers."
register_tracker("tensorboard", sink=_T + "tensorboard.sink:TensorBoardSink", source=_T + "tensorboard.source:TensorBoardSource", sniff=_T + "tensorboard:sniff", requires=("tensorboard",), extra="tensorboard")  # noqa: E501
register_tracker("wandb", sink=_T + "wandb.sink:WandbSink", source=_T + "wandb.source:WandbSource", sniff=_T + "wandb:sniff", requires=("wandb",), extra="wandb")  # noqa: E501
register_tracker("trainer-state", source="trackbridge.files.trainer_state:TrainerStateSource", sniff="trackbridge.files.trainer_state:sniff")  # noqa: E501
register_tracker("jsonl", sink=_T + "jsonl.sink:JsonlSink", source=_T + "jsonl.source:JsonlSource", sniff=_T + "jsonl:sniff")  # noqa: E501
register_tracker("trackio", sink=_T + "trackio.sink:TrackioSink", source=_T + "trackio.source:TrackioSource", sniff=_T + "trackio:sniff", requires=("trackio",), source_requires=(), extra="trackio")  # noqa: E501
register_tracker("mlflow", sink=_T + "mlflow.sink:MlflowSink", source=_T + "mlflow.source:MlflowSource", sniff=_T + "mlflow:sniff", requires=("mlflow",), extra="mlflow")  # noqa: E501
register_tracker("swanlab", sink=_T + "swanlab.sink:SwanlabSink", source=_T + "swanlab.source:SwanlabSource", sniff=_T + "swanlab:sniff", requires=("swanlab",), extra="swanlab")  # noqa: E501
register_tracker("clearml", sink=_T + "clearml.sink:ClearmlSink", source=_T + "clearml.source:ClearmlSource", sniff=_T + "clearml:sniff")  # noqa: E501
register_tracker("comet", sink=_T + "comet.sink:CometSink", source=_T + "comet.source:CometSource", sniff=_T + "comet:sniff")  # noqa: E501
register_tracker("neptune", sink=_T + "neptune.sink:NeptuneSink", source=_T + "neptune.source:NeptuneSource", sniff=_T + "neptune:sniff", requires=("pyarrow",), extra="neptune")  # noqa: E501
register_tracker("csv", source="trackbridge.files.csv:CsvSource", sniff="trackbridge.files.csv:sniff")
register_tracker("console", source="trackbridge.files.console:ConsoleSource", sniff="trackbridge.files.console:sniff")  # noqa: E501
del _T
_BUILT_IN.update(_TRACKERS)
