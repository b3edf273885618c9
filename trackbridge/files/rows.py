"""Logged dicts read from a file or stdin as rows (``translate``, ``detect``, and the ``rows=`` runs of
:func:`trackbridge.read.inputs.open_runs`): JSON lines (one logged dict per line, or trackbridge stream records), a
``trainer_state.json`` (its ``log_history``), a JSON document with a ``rows`` list, a JSON list of logged dicts, or
one JSON object of values (nested names joined by ``/``). Every value is kept; a bad line is reported with its file
and line number and skipped."""
from __future__ import annotations

import itertools
import json
import sys
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, TextIO

from ..record import iter_json_objects
from ..stream import is_header
from ..tracking.inputfile import InputError


@dataclass
class Row:
    """One logged dict read from an input file, with where it was read and its step/wall time if it had them."""

    where: str          # "file:line"
    metrics: dict[str, Any]
    step: Any = None
    wall_time: Any = None
    shape: str = "dict"  # "dict" (plain logged dict) or "record" (stream record)


def open_text(path: str) -> TextIO:
    """``path`` opened as UTF-8 text (``-``: stdin); raises InputError when it cannot be opened."""
    if path == "-":
        return sys.stdin
    try:
        return open(path, encoding="utf-8")
    except OSError as exc:
        raise InputError(f"{path}: cannot open ({exc.strerror or exc})") from None


def read_rows(path: str, problems: list[str], headers: list[dict[str, Any]] | None = None,
              settings: dict[str, Any] | None = None) -> Iterator[Row]:
    """The rows of ``path`` (``-``: stdin), streamed: JSON lines are read and parsed one line at a time, so memory
    does not grow with the file. A JSON document (``trainer_state.json``, a ``rows`` fixture) is one value and is
    parsed whole, as before. A trackbridge stream's header line (the run info) goes to ``headers``, a
    ``trainer_state.json``'s settings (its ``logging_steps`` ...) to ``settings``."""
    name = "<stdin>" if path == "-" else path
    fh = open_text(path)
    try:
        yield from _rows_of(fh, name, problems, headers, settings)
    finally:
        if fh is not sys.stdin:
            fh.close()


def _rows_of(fh: TextIO, name: str, problems: list[str], headers: list[dict[str, Any]] | None,
             settings: dict[str, Any] | None = None) -> Iterator[Row]:
    head: list[str] = []            # the lines read ahead to tell a document from JSON lines, in order
    first = ""
    for line in fh:
        head.append(line)
        if line.strip():
            first = line
            break
    lines: Iterable[str] = fh
    if first.lstrip().startswith(("{", "[")):
        doc, state = _first_line_document(first)
        if state == "document":     # a one-line document, unless more lines follow (then: JSON lines)
            for line in fh:
                head.append(line)
                if line.strip():
                    break
            else:
                yield from _rows_of_document(name, doc, problems, settings)
                return
        elif state == "open":        # the first line opens a multi-line value: perhaps a whole document
            text = "".join(head) + fh.read()
            doc = _whole_document(text)
            if doc is not None:
                yield from _rows_of_document(name, doc, problems, settings)
                return
            head, lines = [], text.splitlines(keepends=True)
    for lineno, obj in iter_json_objects(itertools.chain(head, lines), name, problems):
        if is_header(obj):
            if headers is not None:
                headers.append(obj)
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
    if isinstance(obj, list):
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
    if isinstance(doc, (dict, list)):
        return doc
    return None


def _flat_leaves(obj: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for k, v in obj.items():
        if isinstance(v, dict) and v and "_type" not in v:
            yield from _flat_leaves(v, f"{prefix}{k}/")
        else:
            yield f"{prefix}{k}", v


def _step_keys(d: Any) -> bool:
    """A non-empty dict whose keys are all step numbers (``"1"``, ``"20"``)."""
    return isinstance(d, dict) and bool(d) and all(isinstance(k, str) and k.isdigit() for k in d)


def _by_step(doc: dict[str, Any]) -> tuple[str, dict[int, dict[str, Any]]] | None:
    """The rows of a JSON object that holds values by step, in either of the two shapes metric dumps take:
    metric-major ``{"train/loss": {"1": 0.5, "2": 0.4}, ...}`` (NeMo-RL's CI ``metrics.json``, a TensorBoard dump),
    or step-major ``{"1": {"train/loss": 0.5}, ...}``, perhaps under one key (``{"steps": {"1": {...}}}``);
    None when the object is neither."""
    table: dict[int, dict[str, Any]] = {}
    metric_major = [k for k, v in doc.items() if _step_keys(v) and not any(isinstance(x, dict) for x in v.values())]
    if metric_major and len(metric_major) >= 0.8 * len(doc):
        for k in metric_major:
            for step, v in doc[k].items():
                table.setdefault(int(step), {})[k] = v
        return "values by metric and step", table
    for holder in ([doc] + [v for v in doc.values() if isinstance(v, dict)]):
        if _step_keys(holder) and all(isinstance(v, dict) for v in holder.values()):
            for step, row in holder.items():
                table[int(step)] = dict(_flat_leaves(row))
            return "rows by step", table
    return None


def _rows_of_document(name: str, doc: Any, problems: list[str], settings: dict[str, Any] | None = None
                      ) -> Iterator[Row]:
    if isinstance(doc, list):                 # a saved copy of a log history: a list of logged dicts
        doc = {"rows": doc}
    elif not (isinstance(doc.get("log_history"), list) or isinstance(doc.get("rows"), list)):
        by_step = _by_step(doc)
        if by_step is not None:
            shape, table = by_step
            problems.append(f"{name}: a JSON object of {shape}: one row per step")
            for step in sorted(table):
                yield Row(f"{name}:step {step}", table[step], step)
            return
        # one object of values (a wandb-summary.json, a benchmark's results): one row, nested names joined by '/';
        # wandb's own fields (_runtime, _timestamp, _wandb) are not metrics, its _step is the row's step
        metrics = dict(_flat_leaves(doc))
        internal = sorted(k for k in metrics if k.startswith("_") and k != "_step")
        if internal:
            problems.append(f"{name}: one JSON object read as one row; left out {', '.join(internal[:6])}"
                            f"{' ...' if len(internal) > 6 else ''} (the tracker's own fields)")
        step = metrics.pop("_step", None)
        yield Row(f"{name}:1", {k: v for k, v in metrics.items() if k not in internal},
                  step if isinstance(step, int) and not isinstance(step, bool) else None)
        return
    history = doc.get("log_history")
    if settings is not None and isinstance(history, list):
        # a trainer_state.json's settings are the run config, as the trainer-state reader gives them
        from .trainer_state import state_config
        settings.update(state_config(doc))
    rows: list[Any] = history if isinstance(history, list) else doc.get("rows") or []
    field = "log_history" if "log_history" in doc else "rows"
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            problems.append(f"{name}: {field}[{i}] is not an object; skipped")
            continue
        metrics = dict(row)
        step = metrics.pop("step", None)
        yield Row(f"{name}:{field}[{i}]", metrics, step)
