"""Text files as the readers meet them, shared by every reader of a text format (the ``jsonl`` tracker, ``csv:``,
``trainer-state:``, ``console:``) and by the trackers that keep runs in SQLite: lines read as a stream without loading
the file, a location that must exist, a compact summary of skipped lines, binary junk told from damage
(:class:`JunkGuard`), and the tables of an SQLite file (:func:`sqlite_tables`). Nothing here imports a tracker or
framework.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

from .source import RunReader, SourceError


def iter_lines(path: Path) -> Iterator[tuple[int, str, bool]]:
    """``(line number, text, complete)`` for each line, streamed, 1-based like an editor.

    Read as bytes so that tqdm's carriage returns stay inside their line (and line numbers match ``wc -l``); bytes
    that are not UTF-8 are replaced rather than aborting the read. ``complete`` is False only for a last line with no
    newline, which may have been cut off while the log was being written.
    """
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, 1):
            complete = raw.endswith(b"\n")
            yield lineno, raw.decode("utf-8", errors="replace").rstrip("\n").rstrip("\r"), complete


def existing_file(location: str, what: str) -> Path:
    """``location`` as a path (``~`` expanded); SourceError naming ``what`` when nothing is there."""
    p = Path(location).expanduser()
    if not p.exists():
        raise SourceError(f"{what}: no such file or folder: {location}")
    return p


class LineSummary:
    """Collects the line numbers of lines skipped as "not a metric line", for one compact report at the end.

    A console log is mostly not metrics (config dumps, warnings, progress bars); one problem per such line would
    bury the real ones, so they are summarised: how many, and the first few line numbers.
    """

    def __init__(self, keep: int = 10) -> None:
        self.count = 0
        self.first: list[int] = []
        self.keep = keep

    def add(self, lineno: int) -> None:
        """Count one skipped line."""
        self.count += 1
        if len(self.first) < self.keep:
            self.first.append(lineno)

    def text(self, what: str) -> str:
        """``skipped N WHAT (lines a, b, ...)``."""
        more = ", ..." if self.count > len(self.first) else ""
        return f"skipped {self.count} {what} (lines {', '.join(map(str, self.first))}{more})"


# -- binary junk where text was expected -------------------------------------------------------------------------
SNIFF_BYTES = 8192     # how much of a file's start is checked for binary data before reading it as lines
BINARY_RUN = 3         # consecutive unreadable lines, one of them binary, after which a file is given up
TEXT_RUN = 20          # unreadable lines before the first readable one after which a file is given up


def binary_reason(data: bytes | str) -> str | None:
    """Why ``data`` (a line, as bytes or as text decoded with ``errors="replace"``) is binary rather than text: a NUL
    byte, or bytes that are not UTF-8 (whichever comes first); None for text."""
    at, reason = _first_binary(data)
    return None if at is None else f"{reason} at column {at + 1}"


def _first_binary(data: bytes | str, final: bool = True) -> tuple[int | None, str]:
    if isinstance(data, str):
        nul, bad = data.find("\x00"), data.find("\ufffd")
    else:
        import codecs
        nul, bad = data.find(b"\x00"), -1
        try:
            codecs.getincrementaldecoder("utf-8")().decode(data, final=final)
        except UnicodeDecodeError as exc:
            bad = exc.start
    if nul >= 0 and (bad < 0 or nul <= bad):
        return nul, "a NUL byte"
    if bad >= 0:
        return bad, "bytes that are not UTF-8"
    return None, ""


def sniff_binary(path: Path, skip: int = 0) -> tuple[int, str] | None:
    """``(byte offset, reason)`` of the first NUL byte or invalid UTF-8 in the first :data:`SNIFF_BYTES` bytes of
    ``path``'s first line (after ``skip`` bytes, e.g. a byte-order mark), or None when that start reads as text."""
    with open(path, "rb") as fh:
        fh.seek(skip)
        head = fh.read(SNIFF_BYTES)
    nl = head.find(b"\n")
    first = head if nl < 0 else head[:nl]
    at, reason = _first_binary(first, final=nl >= 0 or len(head) < SNIFF_BYTES)
    return None if at is None else (skip + at, reason)


def not_text(path: Path, offset: int, reason: str, what: str) -> str:
    """The one message for a file that is binary from its start."""
    return (f"not a text file ({reason} at byte {offset}): not {what}; is it a database, an archive or a binary "
            f"log? Nothing was read from it ({path.stat().st_size:,} bytes)")


class JunkGuard:
    """Tells damage from junk while a text file is read line by line.

    Unreadable lines are held back while they come one after another. When a readable line follows, they are
    reported one by one (ordinary damage: a cut-off line, a stray line of text). When :data:`BINARY_RUN` of them in a
    row include a binary one (NUL bytes, invalid UTF-8), or the first :data:`TEXT_RUN` non-empty lines of the file
    are all unreadable, the file is given up instead: **one** fatal problem naming the first line and byte offset of
    the run, and how much of the file was left unread (:meth:`bad` returns True; the reader stops)."""

    def __init__(self, reader: RunReader, path: Path, what: str) -> None:
        self.reader = reader
        self.path = path
        self.what = what
        self.pending: list[tuple[str, str]] = []
        self.first: tuple[int, int | None] = (0, None)     # (line, offset) of the first held-back line
        self.binary: str | None = None
        self.readable = 0

    def bad(self, lineno: int, offset: int | None, data: bytes | str, where: str, what: str) -> bool:
        """Hold back an unreadable line; True when the reader should give up on the file (reported as fatal)."""
        if not self.pending:
            self.first = (lineno, offset)
        self.pending.append((where, what))
        if self.binary is None:
            self.binary = binary_reason(data)
        if self.binary is not None and len(self.pending) >= BINARY_RUN:
            self._give_up(f"binary data ({self.binary}, and {len(self.pending) - 1} more unreadable line(s) "
                          f"right after it): not {self.what} from here on")
            return True
        if not self.readable and len(self.pending) >= TEXT_RUN:
            self._give_up(f"the first {len(self.pending)} non-empty lines are all unreadable: not {self.what}")
            return True
        return False

    def _give_up(self, why: str) -> None:
        lineno, offset = self.first
        at = f"line {lineno}" + (f" (offset {offset})" if offset is not None else "")
        try:
            size = self.path.stat().st_size
        except OSError:
            size = None
        rest = (f"; the rest of the file ({size - offset:,} of {size:,} bytes) was not read"
                if size is not None and offset is not None else "; the rest of the file was not read")
        self.reader.stop(f"{self.path}:{at}", why + rest)
        self.pending = []

    def good(self) -> None:
        """A readable line: the lines held back were isolated bad lines (reported as skipped)."""
        self.flush()
        self.readable += 1

    def flush(self) -> None:
        """Report the lines held back as skipped (at the end of the file)."""
        for where, what in self.pending:
            self.reader.skip(where, what)
        self.pending = []
        self.binary = None


def sqlite_tables(path: "Path | str") -> set[str]:
    """The table names of an SQLite file, opened read-only (empty when it is not one, or cannot be read): what the
    trackers that keep runs in SQLite look at to tell whose database a file is."""
    import sqlite3
    p = Path(path)
    if not p.is_file():
        return set()
    try:
        with sqlite3.connect(f"{p.resolve().as_uri()}?mode=ro", uri=True) as conn:
            return {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    except sqlite3.Error:
        return set()
