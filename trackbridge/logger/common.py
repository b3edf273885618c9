"""What every part of the logger shares: its warning category, the stop marker, the canonical step axis."""
from __future__ import annotations

import logging
import os
import sys
import sysconfig
import warnings
from typing import TYPE_CHECKING, Any

from ..schema.model import STEP_AXIS as STEP_AXIS  # the canonical name of the tracker step (canonical.yaml axes)

if TYPE_CHECKING:       # pragma: no cover
    from ..record import RunInfo

log = logging.getLogger("trackbridge")

STOP = object()          # put on a queue: the consumer stops after what is before it

#: how a run ended, as the trackers are told (Sink.outcome): finished, failed (training raised, or exited with a
#: non-zero code), killed (interrupted, terminated or killed: Ctrl-C, SIGTERM, SIGKILL, the process gone)
OUTCOMES = ("finished", "failed", "killed")
KILLED_EXIT = 137        # wandb's exit code of a run whose training process vanished (the shell's 128 + SIGKILL)
INTERRUPTED_EXIT = 130   # ... interrupted by Ctrl-C (128 + SIGINT)
TERMINATED_EXIT = 143    # ... terminated by SIGTERM during finish() (128 + SIGTERM)


class LoggerWarning(RuntimeWarning):
    """A problem the logger reports without stopping training (a failed sink, a value that cannot be stored)."""


def warn(message: str) -> None:
    """A warning users see once: through ``warnings`` (LoggerWarning), and also through the ``trackbridge`` logger
    when the application configured logging (otherwise logging's last-resort handler would print it twice)."""
    if log.hasHandlers():
        log.warning(message)
    warnings.warn(message, LoggerWarning, stacklevel=3)


_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep      # .../trackbridge/
_LIBRARIES = tuple({p + os.sep for p in (sysconfig.get_paths().get(k) for k in ("stdlib", "purelib", "platlib"))
                    if p})


def user_frame(depth: int = 2) -> Any:
    """The frame of the user's code on this thread's stack: the first, from ``depth`` frames up, that is neither
    trackbridge's nor a library's (site-packages, the standard library: a Trainer calling trackbridge's callback
    calls it from transformers); else the first outside trackbridge; else the caller's."""
    try:
        frame = sys._getframe(depth)
    except ValueError:
        return None
    outside = None
    f: Any = frame
    while f is not None:
        name = f.f_code.co_filename
        if not name.startswith(_PACKAGE):
            if outside is None:
                outside = f
            if not name.startswith(_LIBRARIES) and not name.startswith("<") and \
                    "site-packages" not in name and "dist-packages" not in name:
                return f
        f = f.f_back
    return outside or frame


class RunView:
    """What ``Run`` and ``NoOpRun`` derive alike from their ``run_id`` and ``info``."""

    run_id: str | None      # None only on a NoOpRun not given one
    info: RunInfo
    #: with ``init(doctor=True, stop_on=SEVERITY)``: true once a finding at least that severe held (a loop that
    #: checks it can stop; the transformers callback stops the Trainer); always False on a rank that does not write
    should_stop: bool = False

    @property
    def id(self) -> str | None:
        """The run id (as ``wandb.Run.id``): the spool file's name and the id every tracker keeps the run under."""
        return self.run_id

    @property
    def name(self) -> str | None:
        """The run's display name."""
        return self.info.name

    @property
    def config(self) -> dict[str, Any]:
        """The run's configuration (on rank 0 with the canonical config names added)."""
        return self.info.config


