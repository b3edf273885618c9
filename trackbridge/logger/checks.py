"""What ``init`` checks and builds before any thread starts: the translation, the sinks' packages and locations."""
from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import UsageError
from ..record.values import STEP_MAX, as_step, check_step, flat_config, normalize_metrics
from ..tracking.sink import Sink, Unreachable, check_reachable
from .common import warn

if TYPE_CHECKING:       # pragma: no cover
    from ..pipeline import Translator


def make_translator(source: str, mappings: list[str] | None, config: dict[str, Any]) -> Translator:
    """Translator from ``source`` names to canonical ones. A mapping file that cannot be used (the user's
    ``mappings=`` or a shipped one) is an error at ``init``, naming the file: logging untranslated names into
    trackers would be worse than not starting."""
    from ..pipeline import Translator
    try:
        return Translator(source=source, target="canonical", mappings=mappings, config=config)
    except Exception as exc:
        what = f"mappings={list(mappings)!r}" if mappings else f"source={source!r}"
        raise UsageError(f"init({what}): cannot build the translation: {exc}") from exc


def validate_call(metrics: object, step: object, axis: object = None, defer: list[tuple[str, Any]] | None = None
                  ) -> tuple[dict[str, Any], list[str], int | None]:
    """What ``log(metrics, step, axis=)`` checks on every rank: the values normalised (with the problems of the ones
    left out) and the step as an int. Raises as :meth:`Run.log` documents (the arguments are the caller's,
    unchecked). ``defer``: takes the torch tensors, read in one batch (CUDA ones without a sync: :mod:`.device`)."""
    if axis is not None and (not isinstance(axis, str) or not axis):
        raise TypeError(f"log(axis=...) must be the name of the step metric (a non-empty string), got {axis!r}")
    if axis is not None and step is None:
        raise TypeError(f"log(axis={axis!r}) needs step=: the value of {axis!r} for these metrics")
    values, problems = normalize_metrics(metrics, defer=defer)
    as_int = None
    if step is not None:
        as_int = to_step(step)
        if not 0 <= as_int <= STEP_MAX:
            check_step(as_int)
    return values, problems, as_int


def to_step(step: object) -> int:
    """``step`` as an int (an integer of any kind: Python, NumPy, a 0-d tensor); TypeError for anything else."""
    out = as_step(step)
    if out is None:
        kind = "bool" if isinstance(step, bool) else type(step).__name__
        raise TypeError(f"log(step=...) must be an integer, got {kind} {step!r}")
    return out


def ready_for_shutdown() -> None:
    """Tracker clients started by a sink's thread may create a thread pool, which registers with the interpreter's
    shutdown; once the main thread has ended (a script that never calls finish()) that is refused ("can't register
    atexit after shutdown") and the run would reach no tracker. Importing the pool module now registers it in time."""
    import concurrent.futures.thread  # noqa: F401


def check_packages(spec: object, sink: Sink, *, import_now: bool = True) -> None:
    """Fail at init, naming the extra to install, when a sink's tracker package is missing (rather than retrying
    in the background and losing the tracker for the whole run); import it now (see below)."""
    import importlib

    from ..extras import require
    for pkg in getattr(sink, "requires", ()):
        require((pkg,), getattr(sink, "extra", ""), f"sink {spec!r}")
        # imported here, in the caller's thread: a package imported by the sink's thread while the training script
        # imports it too can be seen half-initialised by one of them (MLflow then fails with a circular import)
        if import_now:
            importlib.import_module(pkg)


def precheck_location(spec: str, sink: Sink) -> None:
    """Fail at init for a location its tracker refuses (the very check ``migrate`` makes of a destination:
    :meth:`Sink.check_location`, such as an SQLite file that is not an MLflow store) and for a plain folder location
    that cannot be created or written; warn (the sink is retried later, training goes on) for a server URL that
    does not answer now."""
    from ..tracking.sink import SinkError
    loc = sink.location
    try:
        type(sink).check_location(loc)
    except SinkError as exc:
        raise UsageError(f"sink {spec!r}: {exc}") from None
    if loc and loc.startswith(("http://", "https://")):
        check_server(spec, loc)
        return
    if not loc or "://" in loc or ":" in loc.split("/")[0]:
        return
    path = Path(loc).expanduser()
    probe = path
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        raise UsageError(f"sink {spec!r}: {probe} exists and is not a folder")
    if probe.exists() and not os.access(probe, os.W_OK | os.X_OK):
        raise UsageError(f"sink {spec!r}: folder {probe} is not writable")


def check_server(spec: str, url: str) -> None:
    """UsageError for a URL without a host; a warning (training goes on) when the server does not answer now."""
    try:
        check_reachable(url)
    except ValueError as exc:
        raise UsageError(f"sink {spec!r}: {exc}") from None
    except Unreachable as exc:
        warn(f"trackbridge: sink {spec!r}: server {exc.host}:{exc.port} is not reachable now ({exc.reason}); "
             f"training goes on, the sink is retried later and catches up from the spool")


def choose_writer(asked: str, sinks: list[Any], built: list[Sink]) -> tuple[str, str | None]:
    """Where the trackers run, and why not in the writer process when ``writer='auto'`` falls back with a reason
    to say. ``'auto'`` is the writer process when it can load every sink (locator strings of trackers the package
    registers), else threads: silently for a Sink object (the caller built it in this process, so it stays here),
    with a warning for a tracker registered only in this process. An explicit ``writer='process'`` that cannot be
    honoured is a UsageError."""
    if not built or asked == "thread":
        return "thread", None
    objects = len([s for s in sinks if isinstance(s, str)]) != len(sinks)
    foreign = [s.locator() for s in built if not type(s).__module__.startswith("trackbridge.")]
    if asked == "process":
        if objects:
            raise UsageError("LoggerOptions(writer='process') takes sinks as locator strings (a Sink object cannot be "
                             "handed to another process)")
        if foreign:
            raise UsageError(f"LoggerOptions(writer='process'): {', '.join(foreign)} is a tracker registered in this "
                             f"process, which the writer process cannot load; use writer='thread' for it")
        return "process", None
    if objects:
        return "thread", None
    if foreign:
        return "thread", (f"{', '.join(foreign)} is a tracker registered in this process (register_tracker), which "
                          f"the writer process cannot load; the trackers are written by threads of the training "
                          f"process (writer='thread' says so)")
    return "process", None


def config_changes(old: dict[str, Any], new: dict[str, Any], skip: "set[str] | frozenset[str]" = frozenset()
                   ) -> dict[str, Any]:
    """What differs between two run configs (plain JSON), flattened with dots: ``{"changed": {key: [old, new]},
    "added": {key: new}, "removed": [key]}``, each present only when not empty. Top-level keys in ``skip`` are left
    out."""
    a = {k: v for k, v in flat_config(old).items() if k.split(".", 1)[0] not in skip}
    b = {k: v for k, v in flat_config(new).items() if k.split(".", 1)[0] not in skip}
    out: dict[str, Any] = {}
    changed = {k: [a[k], b[k]] for k in a if k in b and a[k] != b[k]}
    added = {k: b[k] for k in b if k not in a}
    removed = [k for k in a if k not in b]
    if changed:
        out["changed"] = changed
    if added:
        out["added"] = added
    if removed:
        out["removed"] = removed
    return out


def build_sinks(specs: list[Any], options: Any, run_id: str, spool_path: Path) -> list[Sink]:
    """The user's sinks, all built before any thread starts so that a bad spec fails ``init`` first (one line naming
    the sink, or the missing extra); a sink that would write the spool's own file (the canonical stream in the
    spool folder) is the spool itself and is left out."""
    from ..extras import MissingExtra
    from ..trackers import make_sink
    from ..tracking.locators import LocatorError
    built: list[Sink] = []
    for spec in specs:
        try:
            sink = make_sink(spec)
        except MissingExtra as exc:
            raise exc.about(f"sink {spec!r}") from None
        except (LocatorError, Exception) as exc:
            raise UsageError(f"sink {spec!r}: {exc}") from None
        check_packages(spec, sink, import_now=options.writer == "thread")   # the writer process imports its own
        ready_for_shutdown()
        if isinstance(spec, str):
            precheck_location(spec, sink)       # judged as migrate judges a destination, before training
        built.append(sink)
    return [s for s in built if not _writes(s, run_id, spool_path)]


def _writes(sink: Sink, run_id: str, spool_path: Path) -> bool:
    """True when ``sink`` would write the canonical stream to the spool's own file."""
    target = getattr(sink, "stream_file", None)
    if not callable(target):
        return False
    try:
        return Path(target(run_id)).expanduser().resolve() == spool_path.expanduser().resolve()
    except (OSError, TypeError, ValueError):
        return False

