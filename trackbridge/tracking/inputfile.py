"""The one rule every input file is held to before a reader opens it (issue 31): it is a **regular file** (a FIFO
would block the reader forever, ``/dev/zero`` feed it forever; a symlink is followed, and named when it leads to
one), it is **not empty**, and it is **what its name says** by its first bytes.

What a format's file starts with is the format's own fact, declared by its reader (:class:`~trackbridge.tracking.
source.Source`: ``signature``, ``text_form``, ``head_problem``), so this module names no tracker;
``trackbridge.read.inputs`` asks the registry for the reader of a kind and passes what it declares. A reader that
opens files inside a folder holds each to the same rule (:func:`check_input`)."""
from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Callable

from ..errors import TrackBridgeError

__all__ = ["InputError", "MAGIC", "check_input", "input_problem"]


class InputError(TrackBridgeError, ValueError):
    """An input file that cannot be opened."""


#: what a file that is not what its name says really is, by its first bytes (so the message can say so)
MAGIC: tuple[tuple[bytes, str], ...] = (
    (b"SQLite format 3\x00", "an SQLite database"), (b"\x89PNG\r\n\x1a\n", "a PNG image"),
    (b"\xff\xd8\xff", "a JPEG image"), (b"GIF8", "a GIF image"), (b"%PDF-", "a PDF document"),
    (b"PAR1", "a Parquet file"), (b"PK\x03\x04", "a zip archive"), (b"\x1f\x8b", "a gzip file"),
    (b":W&B", "a wandb transaction log"), (b"\x7fELF", "an executable"), (b"BZh", "a bzip2 file"),
    (b"\xfd7zXZ\x00", "an xz file"), (b"\x93NUMPY", "a NumPy array"))

HeadCheck = Callable[[bytes, int, "str | None"], "str | None"]


def _kind_of_file(mode: int) -> str:
    for test, what in ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder")):
        if test(mode):
            return what
    return "not a plain file"


def input_problem(path: str | Path, *, signature: tuple[bytes, str] | None = None, text: str | None = None,
                  head_check: HeadCheck | None = None) -> str | None:
    """Why ``path`` cannot be read as an input, or None. ``signature``: the bytes a file of the format starts with
    and what the format is (a ``.wandb`` log starts with ``:W&B``, Parquet with ``PAR1``); ``text``: the text
    format's name (a text format must not be an SQLite database, an image or an archive); ``head_check``: the
    format's own test of its first 64 bytes (``(head, size, what the magic bytes say it is) -> problem``). A folder
    is left to its reader (which holds each file it opens to this rule)."""
    p = Path(path)
    try:
        st = os.stat(p)                     # follows a symlink: what is read is what it points to
    except OSError as exc:
        return f"cannot open ({exc.strerror or exc})"
    link = f" (a link to {os.path.realpath(p)})" if p.is_symlink() else ""
    if stat.S_ISDIR(st.st_mode):
        return None
    if not stat.S_ISREG(st.st_mode):
        return f"not a regular file: {_kind_of_file(st.st_mode)}{link}; nothing was read from it"
    if st.st_size == 0:
        return f"an empty file (0 bytes){link}: nothing to read"
    try:
        with open(p, "rb") as fh:
            head = fh.read(64)
    except OSError as exc:
        return f"cannot open ({exc.strerror or exc})"
    found = next((what for magic, what in MAGIC if head.startswith(magic)), None)
    if signature is not None:
        magic, what = signature
        if not head.startswith(magic):
            if found is None:
                found = "it is text" if head.isascii() and b"\x00" not in head else \
                    "it does not start with its signature"
            return f"not {what}: {found} ({st.st_size:,} bytes)"
        return None
    if head_check is not None:
        return head_check(head, st.st_size, found)
    if text is not None and found is not None:
        return f"{found}, not {text} ({st.st_size:,} bytes); nothing was read from it"
    return None


def check_input(path: str | Path, *, signature: tuple[bytes, str] | None = None, text: str | None = None,
                head_check: HeadCheck | None = None) -> None:
    """Raise :class:`InputError` naming ``path`` when it breaks :func:`input_problem`'s rule."""
    why = input_problem(path, signature=signature, text=text, head_check=head_check)
    if why is not None:
        raise InputError(f"{path}: {why}")
