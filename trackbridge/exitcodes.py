"""The exit codes of every ``trackbridge`` command, defined once (``docs/cli.md`` shows the same table).

====  ===============  ================================================================================================
code  name             meaning
====  ===============  ================================================================================================
0     ``OK``           the command did what it was asked
1     ``PROBLEMS``     it ran to the end, but with problems: a tracker failed or points were not written, input
                       lines were skipped, or (``--strict``) keys stayed unmapped; what went wrong is printed
2     ``USAGE``        bad usage or bad input: a wrong argument (argparse), an unknown locator or naming scheme, a
                       file or folder that cannot be read or is not what the command takes, invalid mapping files
                       (``MappingError``), a :class:`~trackbridge.errors.UsageError`; nothing was done
130   ``INTERRUPTED``  interrupted (Ctrl-C)
====  ===============  ================================================================================================

Per command (what "problems" means where a command's purpose is to find them):

* ``translate``: 1 when input lines were skipped, or with ``--strict`` when a key is unmapped.
* ``detect``: 1 when no framework is recognised (the answer is "unknown").
* ``mappings list|show|docs``: 2 for a name that is neither a framework nor a canonical metric. ``mappings lint``:
  2 when the mapping files have errors (they are bad input to every other command).
* ``migrate``: 1 when a run could not be written (its tracker failed, or nothing of it was readable), when the source
  holds no run, or with ``--strict`` when lines were skipped or keys are unmapped. A destination the tracker refuses
  before anything is read (``check_location``) or a source that cannot be opened is 2.
* ``replay``: 1 when a tracker could not be caught up (it failed while opened or written; the others are still
  replayed); spool lines skipped (a partial last line after a crash) are printed, not a problem. A missing spool, one
  without a run header, an unreadable pending note, an unknown or refused ``--to`` locator or an unknown ``--names``
  is 2.
* ``compare``: differences between runs are the report, not a problem (0). 1 when no metric could be compared
  (nothing to chart) or a tracker of ``--into`` failed (the report is written first). Unreadable runs are 2.
* ``demo``: 1 when a local tracker could not be written; 2 for an ``--out`` folder that is not the demo's.
* ``doctor``: finding symptoms is its purpose: 0 when no finding is at or above ``--fail-on`` (default ``warning``),
  1 when one is, in any run; lines skipped while reading are printed, not a problem. A run that cannot be read or
  holds no records, an unknown ``--checks`` id or invalid mapping or checks files are 2.
"""
from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """What a ``trackbridge`` command's exit status means (the table in :mod:`trackbridge.exitcodes`)."""

    OK = 0
    PROBLEMS = 1
    USAGE = 2
    INTERRUPTED = 130


OK = ExitCode.OK
PROBLEMS = ExitCode.PROBLEMS
USAGE = ExitCode.USAGE
INTERRUPTED = ExitCode.INTERRUPTED

__all__ = ["ExitCode", "INTERRUPTED", "OK", "PROBLEMS", "USAGE"]
