"""Which runs and metrics a command reads: one :class:`Selection` for ``migrate``, ``compare``, ``doctor`` and
:func:`trackbridge.read`, built once from what the user gave and applied by :func:`~trackbridge.read.inputs.open_runs`.

* ``runs``: a regular expression searched in each run's label, name and id;
* ``tags``: tags a run must hold with these values (an empty value: the tag only has to exist);
* ``metrics``: glob patterns (``fnmatch``: ``reward/*``) of the names a run's pipeline writes;
* ``since`` / ``until``: the run *started* (its first record's wall time) at or after ``since`` and at or before
  ``until``. A date alone (``2026-11-01``) is the whole day: ``--until 2026-11-30`` keeps runs started on the 30th.
  Times without an offset are UTC; ``7d``, ``36h``, ``90m`` are that long before now. A run without wall times
  of its own (a ``trainer_state.json``, most console logs) cannot be dated: with ``since``/``until`` it is left
  out and said (:attr:`Selection.left_out`), never guessed in.
"""
from __future__ import annotations

import datetime as _dt
import re
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from ..errors import UsageError

_RELATIVE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DATE_ONLY = re.compile(r"^\s*\d{4}-\d{2}-\d{2}\s*$")


def parse_when(text: str | float | _dt.datetime | _dt.date, what: str = "--since ", *, end_of_day: bool = False,
               now: float | None = None) -> float:
    """``text`` as seconds since the epoch: an ISO date or date-time (UTC unless it carries an offset), a duration
    before ``now`` (``7d``, ``36h``, ``90m``, ``30s``, ``2w``), a number of epoch seconds, or a ``datetime``/``date``.
    A date alone is its day's start, or with ``end_of_day`` its last instant (``--until``). A bad value is a one-line
    :class:`~trackbridge.errors.UsageError` naming ``what``."""
    if isinstance(text, bool):
        raise UsageError(f"{what}{text!r}: expected a date, a date-time or a duration such as 7d")
    if isinstance(text, (int, float)):
        return float(text)
    if isinstance(text, _dt.datetime):
        return (text if text.tzinfo else text.replace(tzinfo=_dt.timezone.utc)).timestamp()
    if isinstance(text, _dt.date):
        return parse_when(text.isoformat(), what, end_of_day=end_of_day)
    s = str(text)
    m = _RELATIVE.match(s)
    if m:
        return (time.time() if now is None else now) - float(m.group(1)) * _UNIT_S[m.group(2)]
    try:
        when = _dt.datetime.fromisoformat(s.strip().replace("Z", "+00:00"))
    except ValueError:
        raise UsageError(f"{what}{s!r}: expected a date (2026-11-01), a date-time (2026-11-01T12:00, UTC unless "
                         f"an offset is given) or a duration before now (7d, 36h, 90m)") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=_dt.timezone.utc)
    if end_of_day and _DATE_ONLY.match(s):
        when += _dt.timedelta(days=1) - _dt.timedelta(microseconds=1)
    return when.timestamp()


def runs_pattern(runs: str | None, what: str = "--runs ") -> re.Pattern[str] | None:
    """The compiled run selection (None: every run); a bad expression is a one-line error naming ``what``."""
    if not runs:
        return None
    try:
        return re.compile(runs)
    except re.error as exc:
        raise UsageError(f"{what}{runs!r} is not a regular expression ({exc})") from None


def _iso(t: float) -> str:
    return _dt.datetime.fromtimestamp(t, _dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Selection:
    """What to read of the runs a locator holds (see the module docstring). Build it with :meth:`build`, which checks
    every part; :meth:`keep` says whether a run is selected (and, for a run that cannot be dated, why not, in
    :attr:`left_out`)."""

    runs: str | None = None
    tags: dict[str, str] = field(default_factory=dict)
    metrics: list[str] = field(default_factory=list)
    since: float | None = None       # epoch seconds, inclusive
    until: float | None = None       # epoch seconds, inclusive
    left_out: list[str] = field(default_factory=list)   # "LABEL: why" for each run left out that is worth saying
    prefix: str = "--"                                  # how its options are named in messages ("read: " ...)
    _pattern: re.Pattern[str] | None = field(default=None, repr=False, compare=False)

    @classmethod
    def build(cls, *, runs: str | None = None, tags: Mapping[str, str] | None = None,
              metrics: str | Iterable[str] | None = None, since: object = None, until: object = None,
              prefix: str = "--") -> "Selection":
        """The selection, each part checked now: a bad regular expression, date or glob is a one-line error naming
        its option (``prefix`` ``--`` for the command line, ``read: `` ... for the library)."""
        def opt(name: str) -> str:
            return f"--{name} " if prefix == "--" else f"{prefix}{name}="
        pattern = runs_pattern(runs, opt("runs")) if runs else None
        pats = [metrics] if isinstance(metrics, str) else [str(m) for m in metrics or ()]
        lo = None if since is None or since == "" else parse_when(since, opt("since"))  # type: ignore[arg-type]
        hi = None if until is None or until == "" else parse_when(until, opt("until"),  # type: ignore[arg-type]
                                                                  end_of_day=True)
        if lo is not None and hi is not None and hi < lo:
            raise UsageError(f"{opt('until')}{_iso(hi)} is before {opt('since')}{_iso(lo)}: no run can be selected")
        return cls(runs=runs or None, tags=dict(tags or {}), metrics=pats, since=lo, until=hi, prefix=prefix,
                   _pattern=pattern)

    @property
    def dated(self) -> bool:
        return self.since is not None or self.until is not None

    def describe(self) -> str:
        """The selection in words, for "no runs found ..." messages (empty when nothing is selected)."""
        parts = []
        if self.runs:
            opt = f"--runs {self.runs!r}" if self.prefix == "--" else f"runs={self.runs!r}"
            parts.append(f"matching {opt}")
        if self.tags:
            parts.append("with the tags asked for")
        if self.since is not None:
            parts.append(f"started since {_iso(self.since)}")
        if self.until is not None:
            parts.append(f"started until {_iso(self.until)}")
        return (" " + ", ".join(parts)) if parts else ""

    def keep(self, run: Any) -> bool:
        """Whether ``run`` is selected: its label, name or id matches ``runs``, it holds ``tags``, and it started
        within ``since``/``until`` (peeks at its first record only when dates were asked for)."""
        if self._pattern is not None and not any(self._pattern.search(str(t))
                                                 for t in (run.label, run.info.name, run.info.run_id) if t):
            return False
        held = run.info.tags or {}
        if self.tags and not all(k in held and (not v or str(held[k]) == str(v)) for k, v in self.tags.items()):
            return False
        if not self.dated:
            return True
        started = run.started
        name = run.label or run.info.name or run.info.run_id or run.locator
        if started is None:
            self.left_out.append(f"{name}: no wall times of its own, so it cannot be dated (--since/--until)")
            return False
        return (self.since is None or started >= self.since) and (self.until is None or started <= self.until)


__all__ = ["Selection", "parse_when", "runs_pattern"]
