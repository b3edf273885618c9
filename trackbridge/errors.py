"""The one base of the errors trackbridge raises, so that ``except trackbridge.TrackBridgeError`` catches them all.

Each error also keeps the built-in type it always had (``ValueError`` for bad input, ``RuntimeError`` for a tracker
or a reader that failed, ``OSError`` for an unreachable server), so code catching those keeps working."""
from __future__ import annotations


class TrackBridgeError(Exception):
    """Base of every error trackbridge raises on purpose."""


class UsageError(TrackBridgeError, ValueError):
    """A bad argument or setting (an unknown sink, an impossible option, a run that already exists ...)."""


class ConfigTooLarge(UsageError):
    """A run config beyond what trackbridge takes (:mod:`trackbridge.logger.limits`): too many keys, a value or the
    whole config too big. Raised by ``init`` before anything is written, and by ``migrate`` for that run."""


__all__ = ["ConfigTooLarge", "TrackBridgeError", "UsageError"]
