"""``logger_warnings``: what a test that breaks a tracker on purpose expects trackbridge to say.

    with logger_warnings(srv.url, "failed"):       # every LoggerWarning names srv.url; one says "failed"
        ...                                         # the run, up to the join of any sink thread still at work

trackbridge's ``LoggerWarning`` about the broken tracker is the behaviour under test, so it is checked, not left for
the session's warnings summary. The block records every warning of the process (other threads' included, which is
why a test joins the threads that are still warning before leaving it); warnings of other categories are passed on
unchanged, and a LoggerWarning about anything else fails the test.
"""
from __future__ import annotations

import contextlib
import re
import warnings
from typing import Iterator


@contextlib.contextmanager
def logger_warnings(about: str, *expected: str) -> Iterator[list[str]]:
    """Every LoggerWarning raised in the block must contain ``about``; each regex of ``expected`` must match one
    of them (none given: there may be none). Yields the list of their messages, filled when the block ends."""
    from trackbridge.logger import LoggerWarning

    messages: list[str] = []
    with warnings.catch_warnings(record=True) as caught:      # the session's filters stay in force
        warnings.simplefilter("always", LoggerWarning)
        yield messages
    for w in caught:
        if issubclass(w.category, LoggerWarning):
            messages.append(str(w.message))
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    strays = [m for m in messages if about not in m]
    assert not strays, f"LoggerWarnings not about {about!r}: {strays}"
    for pattern in expected:
        assert any(re.search(pattern, m) for m in messages), f"no LoggerWarning matches {pattern!r}: {messages}"
