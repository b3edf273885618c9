"""The logger's tuning knobs and overrides, in one place: ``init(..., options=LoggerOptions(...))``."""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from ..errors import UsageError

WRITERS = ("auto", "process", "thread")


@dataclass(frozen=True)
class LoggerOptions:
    """How the logger batches, retries and waits, and the settings a run rarely needs (:func:`trackbridge.init` takes
    what users set; these come as ``options=LoggerOptions(...)``).

    ``flush_interval``: the most a SIGKILL can lose from the spool, in seconds. ``queue_size``: records queued per
    sink before it falls behind (then it is fed from the spool). ``batch_size``: records per write to a tracker.
    ``retries`` / ``backoff``: attempts of a failing open or write, and the first pause between them (doubling).
    ``retry_interval``: how often a failed sink is tried again. ``stall_timeout``: how long ``finish()`` waits for
    a tracker that makes no progress. ``finish_timeout``: the most ``finish()`` waits in all. ``resume_wait``: how
    long a resumed run waits for the trackers to say what they hold before it numbers its first step. ``hold_mb``:
    how many MB of records the spool worker keeps in memory while the spool file cannot be written (a full disk),
    to write them when it can again (beyond, records are left out of the spool, with a warning; the trackers still
    get them). ``writer``:
    ``"process"`` (the trackers in one writer process fed from the spool, so their work never takes the GIL from
    training; sinks must be locator strings of trackers the writer can load), ``"thread"`` (each tracker in a thread
    of the training process) or ``"auto"`` (the default: the writer process when it can take every sink, else
    threads -- with a warning saying why for a tracker registered only in this process; silently for Sink objects,
    which the caller built in this process).

    ``derive``: compute the derived metrics of mappings/derived.yaml (default on). ``rank``: this process's global
    rank, overriding the environment's (``RANK``, then ``LOCAL_RANK``, ...); ``world_size``: the number of ranks
    ``merge_ranks`` waits for (default ``WORLD_SIZE``); ``rank_zero_only``: only global rank 0 writes (default; off,
    every rank writes a run of its own); ``rank_timeout``: how long rank 0 waits for a silent rank before it merges a
    step without it. ``on_finding``: called with each :class:`~trackbridge.doctor.Finding` of ``init(doctor=True)``,
    in the caller's thread."""

    flush_interval: float = 1.0
    queue_size: int = 5000
    batch_size: int = 500
    retries: int = 3
    backoff: float = 0.2
    retry_interval: float = 30.0
    stall_timeout: float = 30.0
    finish_timeout: float = 300.0
    resume_wait: float = 10.0
    hold_mb: float = 256.0
    writer: str = "auto"
    derive: bool = True
    rank: int | None = None
    world_size: int | None = None
    rank_zero_only: bool = True
    rank_timeout: float = 60.0
    on_finding: Any = None

    def __post_init__(self) -> None:
        if self.writer not in WRITERS:
            raise UsageError(f"writer must be one of {', '.join(map(repr, WRITERS))}, got {self.writer!r}")
        if not self.flush_interval > 0:
            raise UsageError(f"flush_interval must be > 0 seconds, got {self.flush_interval!r}")
        if self.queue_size < 1 or self.batch_size < 1:
            raise UsageError("queue_size and batch_size must be at least 1")
        if self.retries < 0:
            raise UsageError(f"retries must be >= 0, got {self.retries!r}")
        for name in ("backoff", "retry_interval", "stall_timeout", "finish_timeout", "resume_wait", "hold_mb",
                     "rank_timeout"):
            if getattr(self, name) < 0:
                raise UsageError(f"{name} must be >= 0 seconds, got {getattr(self, name)!r}")

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The names of the knobs (the fields)."""
        return tuple(f.name for f in fields(cls))

    def for_writer(self) -> dict[str, Any]:
        """The knobs the writer process works with, as plain values sent through its pipe: every field but
        ``on_finding`` (a callable of the caller's process, called there)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "on_finding"}

    @classmethod
    def fold(cls, kwargs: dict[str, Any]) -> dict[str, Any]:
        """Keywords for :func:`trackbridge.init` from one flat dict (an integration's options, a config file's
        section): the knobs among them go into ``options`` (laid over an ``options`` given there too)."""
        knobs = {k: kwargs[k] for k in cls.names() if k in kwargs}
        if not knobs:
            return dict(kwargs)
        out = {k: v for k, v in kwargs.items() if k not in knobs}
        base = out.get("options")
        merged = {f.name: getattr(base, f.name) for f in fields(cls)} if base is not None else {}
        out["options"] = cls(**{**merged, **knobs})
        return out
