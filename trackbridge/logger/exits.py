"""How the training process is ending: the outcome a run that was not finished records at interpreter exit, and
the signals that may interrupt ``finish()``.

An uncaught exception leaves ``sys.last_value`` (``KeyboardInterrupt``: killed, anything else: failed). A call to
``sys.exit(N)`` leaves nothing Python code can see at exit, so :func:`install` wraps ``sys.exit`` once per process
(the original is called unchanged) to remember ``N``: any code but 0 / None is a failed run. ``raise SystemExit(N)``
outside a ``with trackbridge.init(...)`` block and ``os._exit`` are not seen (a ``with`` block sees the first)."""
from __future__ import annotations

import signal
import sys
import threading
from typing import Any

from .common import INTERRUPTED_EXIT

_state: dict[str, Any] = {"installed": False, "code": None, "called": False}


def install() -> None:
    """Remember the status ``sys.exit`` is called with (the original ``sys.exit`` still does the exiting)."""
    if _state["installed"]:
        return
    _state["installed"] = True
    original = sys.exit

    def exit(status: Any = None) -> Any:
        _state["called"], _state["code"] = True, status
        original(status)

    exit.__wrapped__ = original          # type: ignore[attr-defined]
    exit.__doc__ = original.__doc__
    setattr(sys, "exit", exit)


def outcome_at_exit() -> tuple[str, int | None]:
    """``(outcome, exit code)`` of a process exiting now, as far as it can be known (see the module docstring)."""
    last = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
    if isinstance(last, KeyboardInterrupt):
        return "killed", INTERRUPTED_EXIT
    if last is not None and not isinstance(last, SystemExit):
        return "failed", None
    if _state["called"] and _state["code"] not in (None, 0):
        return "failed", None
    return "finished", None


class Terminated(BaseException):
    """SIGTERM arrived while finish() waited (see :func:`on_sigterm`)."""


def _raise_terminated(signum: int, frame: Any) -> None:
    raise Terminated()


def on_sigterm() -> Any:
    """While finish() waits, turn SIGTERM into :class:`Terminated`, where that is ours to do: in the main thread,
    when SIGTERM still has its default action (an application or framework handling it keeps its handler). Returns
    what to restore (None: nothing was changed)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    try:
        if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
            return None
        return signal.signal(signal.SIGTERM, _raise_terminated)
    except (ValueError, OSError, AttributeError):
        return None


def restore_sigterm(previous: Any) -> None:
    if previous is not None:
        try:
            signal.signal(signal.SIGTERM, previous)
        except (ValueError, OSError):
            pass


def ignore_interrupts() -> list[tuple[int, Any]]:
    """While an interrupted finish() writes its note: a second Ctrl-C or SIGTERM waits (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        return []
    saved: list[tuple[int, Any]] = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            saved.append((sig, signal.signal(sig, signal.SIG_IGN)))
        except (ValueError, OSError):
            pass
    return saved


def restore_interrupts(saved: list[tuple[int, Any]]) -> None:
    for sig, handler in saved:
        try:
            signal.signal(sig, handler)
        except (ValueError, OSError):
            pass
