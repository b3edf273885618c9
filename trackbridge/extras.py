"""The optional extras (``pip install 'trackbridge[EXTRA]'``): the one way trackbridge says that one is missing.

The core needs only PyYAML. Each tracker's sink and reader, and the charts of ``compare``'s report, need a package of
an extra (``[project.optional-dependencies]`` in pyproject.toml). Every path that needs one asks :func:`require`
before it reads or writes anything: a tracker's sink or reader through the registry (:mod:`trackbridge.trackers`,
which ``init``, ``migrate``, ``replay``, ``compare`` and ``detect``/``translate`` all go through), ``compare``'s report
and the demo. A missing package is then a :class:`MissingExtra` with one line naming the extra, which the command line
prints as ``trackbridge COMMAND: ...`` with exit code 2, never a traceback half way through.
"""
from __future__ import annotations

import importlib.util
from typing import Iterable

from .errors import UsageError


class MissingExtra(UsageError, ImportError):
    """A package that an optional extra installs is missing. A :class:`~trackbridge.UsageError` (so a ``ValueError``,
    as every bad setting) and an ``ImportError`` (``name`` is the package); ``extra`` is the extra that installs it
    (empty for a package of no trackbridge extra, such as a user tracker's)."""

    def __init__(self, what: str, package: str, extra: str = "") -> None:
        self.what, self.package, self.extra = what, package, extra
        super().__init__(message(what, package, extra))
        self.name = package

    def about(self, what: str) -> MissingExtra:
        """The same error, saying ``what`` needs the extra (a sink's locator instead of its kind)."""
        return MissingExtra(what, self.package, self.extra)


def message(what: str, package: str, extra: str = "") -> str:
    """``WHAT needs the [EXTRA] extra (PACKAGE is not installed): pip install 'trackbridge[EXTRA]'``."""
    if not extra:
        return f"{what} needs the {package!r} package, which is not installed"
    return f"{what} needs the [{extra}] extra ({package} is not installed): pip install 'trackbridge[{extra}]'"


def installed(package: str) -> bool:
    """Whether ``package`` (an import name) can be imported, without importing it. False also for a package set to
    None in ``sys.modules`` (blocked)."""
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):
        return False


def require(packages: Iterable[str], extra: str, what: str) -> None:
    """Raise :class:`MissingExtra` for the first of ``packages`` that is not installed."""
    for package in packages:
        if not installed(package):
            raise MissingExtra(what, package, extra)


#: the report's charts (``compare`` writing a report, ``demo``)
PLOT = (("matplotlib",), "plot")

__all__ = ["MissingExtra", "PLOT", "installed", "message", "require"]
