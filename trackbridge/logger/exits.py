"""How the training process is ending, for the outcome a run that was not finished records at interpreter exit.

An uncaught exception leaves ``sys.last_value`` (``KeyboardInterrupt``: killed, anything else: failed). A call to
``sys.exit(N)`` leaves nothing Python code can see at exit, so :func:`install` wraps ``sys.exit`` once per process
(the original is called unchanged) to remember ``N``: any code but 0 / None is a failed run. ``raise SystemExit(N)``
outside a ``with trackbridge.init(...)`` block and ``os._exit`` are not seen (a ``with`` block sees the first)."""
from __future__ import annotations

import sys
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
