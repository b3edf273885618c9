"""The logger's tuning knobs, in one place (``init(..., options=LoggerOptions(...))`` or as keywords)."""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from ..errors import UsageError

WRITERS = ("auto", "process", "thread")


@dataclass(frozen=True)
class LoggerOptions:
    """How the logger batches, retries and waits. Every field is also a keyword of :func:`trackbridge.init`.

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
    which the caller built in this process)."""

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

    def __post_init__(self) -> None:
        if self.writer not in WRITERS:
            raise UsageError(f"writer must be one of {', '.join(map(repr, WRITERS))}, got {self.writer!r}")
        if not self.flush_interval > 0:
            raise UsageError(f"flush_interval must be > 0 seconds, got {self.flush_interval!r}")
        if self.queue_size < 1 or self.batch_size < 1:
            raise UsageError("queue_size and batch_size must be at least 1")
        if self.retries < 0:
            raise UsageError(f"retries must be >= 0, got {self.retries!r}")
        for name in ("backoff", "retry_interval", "stall_timeout", "finish_timeout", "resume_wait", "hold_mb"):
            if getattr(self, name) < 0:
                raise UsageError(f"{name} must be >= 0 seconds, got {getattr(self, name)!r}")

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The names of the knobs (each also a keyword of :func:`trackbridge.init`)."""
        return tuple(f.name for f in fields(cls))

    @classmethod
    def build(cls, options: "LoggerOptions | None", given: dict[str, Any]) -> "LoggerOptions":
        """``options`` with the keywords given explicitly (not None) laid over it."""
        base = {f.name: getattr(options, f.name) for f in fields(cls)} if options is not None else {}
        base.update({k: v for k, v in given.items() if v is not None})
        return cls(**base)
