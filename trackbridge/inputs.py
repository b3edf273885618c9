"""Reading logged dicts from a file for ``trackbridge translate`` / ``detect``.

Accepted: JSON lines (one logged dict per line, or trackbridge stream records ``{"step", "metrics"}``), a Hugging
Face ``trainer_state.json`` (its ``log_history``), and a JSON document with a ``rows`` list (the public-log
fixtures). Bad lines are reported with file and line number and skipped; nothing else is lost.
"""
from __future__ import annotations

import itertools
import json
import sys
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, TextIO

from .errors import TrackBridgeError
from .record import iter_json_objects
from .stream import is_header


@dataclass
class Row:
    """One logged dict read from an input file, with where it was read and its step/wall time if it had them."""

    where: str          # "file:line"
    metrics: dict[str, Any]
    step: Any = None
    wall_time: Any = None
    shape: str = "dict"  # "dict" (plain logged dict) or "record" (stream record)


class InputError(TrackBridgeError, ValueError):
    """An input file that cannot be opened."""


def open_text(path: str) -> TextIO:
    """``path`` opened as UTF-8 text (``-``: stdin); raises InputError when it cannot be opened."""
    if path == "-":
        return sys.stdin
    try:
        return open(path, encoding="utf-8")
    except OSError as exc:
        raise InputError(f"{path}: cannot open ({exc.strerror or exc})") from None


def read_rows(path: str, problems: list[str]) -> Iterator[Row]:
    """The rows of ``path`` (``-``: stdin), streamed: JSON lines are read and parsed one line at a time, so memory
    does not grow with the file. A JSON document (``trainer_state.json``, a ``rows`` fixture) is one value and is
    parsed whole, as before."""
    name = "<stdin>" if path == "-" else path
    fh = open_text(path)
    try:
        yield from _rows_of(fh, name, problems)
    finally:
        if fh is not sys.stdin:
            fh.close()


def _rows_of(fh: TextIO, name: str, problems: list[str]) -> Iterator[Row]:
    head: list[str] = []            # the lines read ahead to tell a document from JSON lines, in order
    first = ""
    for line in fh:
        head.append(line)
        if line.strip():
            first = line
            break
    lines: Iterable[str] = fh
    if first.lstrip().startswith("{"):
        doc, state = _first_line_document(first)
        if state == "document":     # a one-line document, unless more lines follow (then: JSON lines)
            for line in fh:
                head.append(line)
                if line.strip():
                    break
            else:
                yield from _rows_of_document(name, doc, problems)
                return
        elif state == "open":        # the first line opens a multi-line value: perhaps a whole document
            text = "".join(head) + fh.read()
            doc = _whole_document(text)
            if doc is not None:
                yield from _rows_of_document(name, doc, problems)
                return
            head, lines = [], text.splitlines(keepends=True)
    for lineno, obj in iter_json_objects(itertools.chain(head, lines), name, problems):
        if is_header(obj):
            continue
        if isinstance(obj.get("metrics"), dict) and "step" in obj:
            yield Row(f"{name}:{lineno}", obj["metrics"], obj.get("step"), obj.get("wall_time"), "record")
        else:
            yield Row(f"{name}:{lineno}", *_split_step(obj))


def _first_line_document(line: str) -> tuple[Any, str]:
    """What the first non-blank line starting with ``{`` is: ``("document", doc)`` a whole document on one line,
    ``"line"`` a JSON line (or a broken one), ``"open"`` the start of a value continued on the next lines."""
    text = line.strip()
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        # an error at the very end of the line: the value goes on (a pretty-printed document); elsewhere: a bad line
        return None, ("open" if exc.pos >= len(text) else "line")
    if isinstance(obj, dict) and (isinstance(obj.get("log_history"), list) or isinstance(obj.get("rows"), list)):
        return obj, "document"
    return None, "line"


def _split_step(obj: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    """A plain row's ``step`` (what ``translate`` writes beside the names, and what trainers log as their x axis) is
    the row's step, not a metric."""
    step = obj.get("step")
    if isinstance(step, int) and not isinstance(step, bool):
        obj = {k: v for k, v in obj.items() if k != "step"}
        return obj, step
    return obj, None


def _whole_document(text: str) -> Any:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        return None
    if isinstance(doc, dict) and (isinstance(doc.get("log_history"), list) or isinstance(doc.get("rows"), list)):
        return doc
    return None


def _rows_of_document(name: str, doc: dict[str, Any], problems: list[str]) -> Iterator[Row]:
    history = doc.get("log_history")
    rows: list[Any] = history if isinstance(history, list) else doc.get("rows") or []
    field = "log_history" if "log_history" in doc else "rows"
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            problems.append(f"{name}: {field}[{i}] is not an object; skipped")
            continue
        metrics = dict(row)
        step = metrics.pop("step", None)
        yield Row(f"{name}:{field}[{i}]", metrics, step)
