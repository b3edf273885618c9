"""Reading logged dicts from a file for ``trackbridge translate`` / ``detect``.

Accepted: JSON lines (one logged dict per line, or trackbridge stream records ``{"step", "metrics"}``), a Hugging
Face ``trainer_state.json`` (its ``log_history``), and a JSON document with a ``rows`` list (the public-log
fixtures). Bad lines are reported with file and line number and skipped; nothing else is lost.
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from typing import Any, Iterator, TextIO

from .record import iter_json_objects


@dataclass
class Row:
    where: str          # "file:line"
    metrics: dict[str, Any]
    step: Any = None
    wall_time: Any = None
    shape: str = "dict"  # "dict" (plain logged dict) or "record" (stream record)


class InputError(ValueError):
    pass


def open_text(path: str) -> TextIO:
    if path == "-":
        return sys.stdin
    try:
        return open(path, encoding="utf-8")
    except OSError as exc:
        raise InputError(f"{path}: cannot open ({exc.strerror or exc})") from None


def read_rows(path: str, problems: list[str]) -> Iterator[Row]:
    name = "<stdin>" if path == "-" else path
    fh = open_text(path)
    try:
        first = fh.read(1)
        while first and first.isspace():
            first = fh.read(1)
        if first == "{":
            rest = fh.read()
            text = first + rest
            doc = _whole_document(text)
            if doc is not None:
                yield from _rows_of_document(name, doc, problems)
                return
            lines = text.splitlines()
        else:
            lines = (first + fh.read()).splitlines()
    finally:
        if fh is not sys.stdin:
            fh.close()
    for lineno, obj in iter_json_objects(lines, name, problems):
        if obj.get("type") == "run":
            continue
        if isinstance(obj.get("metrics"), dict) and "step" in obj:
            yield Row(f"{name}:{lineno}", obj["metrics"], obj.get("step"), obj.get("wall_time"), "record")
        else:
            yield Row(f"{name}:{lineno}", *_split_step(obj))


def _split_step(obj: dict) -> tuple[dict, Any]:
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


def _rows_of_document(name: str, doc: dict, problems: list[str]) -> Iterator[Row]:
    rows = doc.get("log_history") if isinstance(doc.get("log_history"), list) else doc.get("rows")
    field = "log_history" if "log_history" in doc else "rows"
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            problems.append(f"{name}: {field}[{i}] is not an object; skipped")
            continue
        metrics = dict(row)
        step = metrics.pop("step", None)
        yield Row(f"{name}:{field}[{i}]", metrics, step)
