"""Reversible metric-name sanitization shared by the sinks (and undone by the readers).

Trackers refuse some characters in metric names (one rejects ``@ , [ ] ( ) # = + %`` and ``//``, another
rewrites ``[^-/\\w.]`` to ``_``). Each tracker's own rule lives in its folder (``trackbridge/trackers/<name>/``);
the escape shared by them lives here. Replacing a character by a look-alike (``@`` -> ``_at_``, as veRL does) is *not*
reversible on its own, because ``_at_`` may already be part of a name. This module uses one escape, named
:data:`SCHEME` (``"xhex/1"``), that is reversible by rule:

* a character the tracker refuses becomes ``_x<HEX>_`` with its code point in upper-case hex
  (``@`` -> ``_x40_``, ``,`` -> ``_x2C_``, ``(`` -> ``_x28_``);
* a literal ``_`` that is followed by ``x`` and an upper-case hex digit in the original name is itself escaped as
  ``_x5F_``, so that every ``_x<HEX>`` in the output starts an escape and :func:`unescape` never misreads text;
* names that need no change are stored unchanged (the common case costs nothing and looks native).

Example: ``val-core/openai/gsm8k/acc/mean@1`` -> ``val-core/openai/gsm8k/acc/mean_x40_1``.

Path-like rules (for trackers that treat names as file paths) are handled by :func:`escape_path`: a leading, trailing or
doubled ``/`` and ``.``/``..`` segments are escaped too. A name longer than a tracker's limit cannot be shortened
reversibly: :func:`shorten` keeps a readable prefix plus a hash, and the sink must record the mapping in the run
(sinks record every stored-name -> original-name pair anyway, see :meth:`Sink.record_sanitized`).

Readers restore names with the recorded mapping first and fall back to :func:`unescape` only for runs that are
marked as written by trackbridge (a foreign name that happens to contain ``_x41_`` is left alone).
"""
from __future__ import annotations

import hashlib
import re
from typing import Callable

SCHEME = "xhex/1"

_ESCAPE_RE = re.compile(r"_x([0-9A-F]{1,6})_")
_NEEDS_GUARD = re.compile(r"_x[0-9A-F]")


def needs_guard(name: str) -> bool:
    """Whether ``name`` holds text that :func:`unescape` would read as an escape (so it must be escaped itself)."""
    return _NEEDS_GUARD.search(name) is not None


def _code(ch: str) -> str:
    return f"_x{ord(ch):02X}_"


def escape(name: str, allowed: "re.Pattern[str] | Callable[[str], bool]") -> str:
    """Escape every character of ``name`` that ``allowed`` refuses (a one-character regex or a predicate)."""
    ok = allowed.fullmatch if isinstance(allowed, re.Pattern) else allowed
    out: list[str] = []
    for i, ch in enumerate(name):
        if ch == "_" and _NEEDS_GUARD.match(name, i):
            out.append(_code(ch))
        elif ok(ch):
            out.append(ch)
        else:
            out.append(_code(ch))
    return "".join(out)


def escape_path(name: str, allowed: "re.Pattern[str] | Callable[[str], bool]") -> str:
    """Like :func:`escape`, and also escape what makes a name resolve to another path.

    A ``/`` at the start or end, or right after another ``/``, becomes ``_x2F_``; a segment that is ``.`` or ``..``
    has its dots escaped, as has the first dot of a name starting with ``..``. The result satisfies
    ``posixpath.normpath(result) == result``.
    """
    if not name:
        raise ValueError("empty metric name cannot be stored")
    # decide which slashes survive as separators, on the original text
    keep_slash: set[int] = set()
    for i, ch in enumerate(name):
        if ch == "/" and 0 < i < len(name) - 1 and name[i - 1] != "/":
            keep_slash.add(i)
    pieces: list[str] = []
    start = 0
    for i in sorted(keep_slash) + [len(name)]:
        seg = name[start:i]
        if seg in (".", ".."):
            pieces.append(seg.replace(".", _code(".")))
        else:
            pieces.append("".join(_code("/") if c == "/" else c for c in _escape_keep_slash(seg, allowed)))
        start = i + 1
    if pieces[0].startswith(".."):          # path-like stores also refuse any name that starts with '..'
        pieces[0] = _code(".") + pieces[0][1:]
    return "/".join(pieces)


def _escape_keep_slash(seg: str, allowed: "re.Pattern[str] | Callable[[str], bool]") -> list[str]:
    """Escape a segment as :func:`escape` does but return per-character pieces, slashes left as '/' marks."""
    ok = allowed.fullmatch if isinstance(allowed, re.Pattern) else allowed
    out: list[str] = []
    for i, ch in enumerate(seg):
        if ch == "/":
            out.append("/")                      # becomes _x2F_ in the caller (it is not a kept separator)
        elif ch == "_" and _NEEDS_GUARD.match(seg, i):
            out.append(_code(ch))
        elif ok(ch):
            out.append(ch)
        else:
            out.append(_code(ch))
    return out


def unescape(stored: str) -> str:
    """Undo :func:`escape` / :func:`escape_path`: every ``_x<HEX>_`` becomes its character."""
    def sub(m: "re.Match[str]") -> str:
        cp = int(m.group(1), 16)
        return chr(cp) if cp <= 0x10FFFF else m.group(0)
    return _ESCAPE_RE.sub(sub, stored)


def shorten(stored: str, limit: int, original: str) -> str:
    """Fit ``stored`` into ``limit`` characters: a prefix plus ``-h`` and 10 hex digits of the original's SHA-1.

    Not reversible by rule; the caller must record the mapping.
    """
    if len(stored) <= limit:
        return stored
    digest = hashlib.sha1(original.encode("utf-8")).hexdigest()[:10]
    head = stored[: limit - 12]
    # never cut inside an escape sequence or leave a trailing '/' or '.' segment
    cut = head.rfind("_x")
    if cut != -1 and "_" not in head[cut + 2:]:
        head = head[:cut]
    head = head.rstrip("/.")
    return f"{head}-h{digest}"


class NameCache:
    """Memoizes ``original -> stored`` for one sink and collects the pairs that changed (for the run's record)."""

    def __init__(self, fn: Callable[[str], str]) -> None:
        self._fn = fn
        self._cache: dict[str, str] = {}
        self.changed: dict[str, str] = {}   # stored -> original, every pair where they differ
        self.new: dict[str, str] = {}       # pairs added since the last :meth:`take_new`

    def __call__(self, name: str) -> str:
        try:
            return self._cache[name]
        except KeyError:
            pass
        stored = self._fn(name)
        prev = self.changed.get(stored)
        if prev is not None and prev != name:
            raise ValueError(f"metric names {prev!r} and {name!r} would both be stored as {stored!r}")
        self._cache[name] = stored
        if stored != name:
            self.changed[stored] = name
            self.new[stored] = name
        return stored

    def take_new(self) -> dict[str, str]:
        """The stored -> original pairs first seen since the last call (for :meth:`Sink.record_sanitized`)."""
        out, self.new = self.new, {}
        return out
