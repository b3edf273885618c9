"""The canonical stream's file, header and line (:mod:`trackbridge.stream`): where a run's stream lies, its header
(the run info, the line format, the schema stamp), the closing header, and one line parsed or iterated."""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from ..record import RunInfo, dumps

SUFFIX = ".jsonl"
HEADER_TYPE = "run"
_UNSAFE = re.compile(r"[^A-Za-z0-9_.\-]")

Reject = Callable[[str, "int | None", str], None]      # (key, step, why): a value left out of a record


def stream_file(directory: str | os.PathLike[str], run_id: str) -> Path:
    """Where the stream of ``run_id`` lives in ``directory``: the run id with characters unsafe in file names
    replaced by ``_``, plus ``.jsonl``."""
    return Path(directory).expanduser() / (_UNSAFE.sub("_", run_id) + SUFFIX)


def schema_stamp(mappings: list[str] | None = None) -> str:
    """``canonical@<version>``: the canonical schema version of the mapping files in use (read through the
    registry, so ``TRACKBRIDGE_MAPPINGS_DIR`` counts)."""
    from ..schema.loader import load_registry
    return f"canonical@{load_registry(mappings or None).canonical.version}"


def is_header(obj: dict[str, Any]) -> bool:
    return obj.get("type") == HEADER_TYPE


def header_json(info: RunInfo, schema: str | None) -> dict[str, Any]:
    """The header line's object: the run info, the line format and the schema stamp."""
    obj = info.to_json()
    if schema:
        obj = {"type": obj.pop("type"), "format": obj.pop("format"), "schema": schema, **obj}
    return obj


#: the run info's ``extra`` entries learnt while a run logs that a closing header carries (:func:`closing_header`)
LEARNT = ("ranks",)


def learnt(info: RunInfo | None) -> str:
    """What the run info learnt while logging (:data:`LEARNT`: ``merge_ranks``' steps merged without a rank), as text
    to compare with what it was when the header was written."""
    extra = (info.extra or {}) if info is not None else {}
    return dumps({k: extra.get(k) for k in LEARNT})


def closing_header(info: RunInfo | None, at_open: str | None, schema: str | None = None) -> bytes | None:
    """The **closing header** of a stream: one more header line at its end, the run info as it stands when the writer
    closes, for what the run learnt while logging and the trackers store with the run when it closes (the steps
    ``merge_ranks`` merged without a rank); None when nothing was learnt since the header written at open
    (``at_open``: :func:`learnt` then). Readers take the last header of a run as its run info (:func:`scan_stream`,
    the stream source)."""
    if info is None or at_open is None or learnt(info) == at_open:
        return None
    return (dumps(header_json(info, schema or schema_stamp())) + "\n").encode("utf-8")


# ---------------------------------------------------------------------------------------------------- lines
@dataclass
class Line:
    """One non-blank line of a stream file: where it is, its bytes, and the JSON object it holds (``obj``) or why it
    holds none (``error``)."""

    lineno: int
    offset: int
    raw: bytes
    obj: dict[str, Any] | None = None
    error: str | None = None
    partial: bool = False           # the last line, without its newline


def parse_line(raw: bytes) -> tuple[dict[str, Any] | None, str | None]:
    """``(object, None)`` for a line holding a JSON object, else ``(None, why not)``."""
    try:
        obj = json.loads(raw)
    except UnicodeDecodeError as exc:
        return None, f"not UTF-8 text ({exc.reason} at byte {exc.start})"
    except json.JSONDecodeError as exc:
        return None, f"not a JSON object ({exc.msg} at column {exc.colno})"
    except ValueError as exc:
        return None, f"not a JSON object ({exc})"
    if not isinstance(obj, dict):
        return None, f"expected a JSON object, got {type(obj).__name__}"
    return obj, None


def iter_lines(path: Path, *, complete_only: bool = True, start: int = 0, first_lineno: int = 1) -> Iterator[Line]:
    """Every non-blank line of ``path`` from byte ``start``, parsed. A last line without its newline is ``partial``:
    with ``complete_only`` it is reported (``error``) and not parsed (its writer may still be writing it); otherwise
    it is parsed, and reported only when it does not parse."""
    offset = start
    with open(path, "rb") as fh:
        if start:
            fh.seek(start)
        for lineno, raw in enumerate(fh, first_lineno):
            here, offset = offset, offset + len(raw)
            if not raw.strip():
                continue
            if not raw.endswith(b"\n"):
                if complete_only:
                    yield Line(lineno, here, raw, None, f"partial last line ({len(raw)} bytes) skipped", True)
                    return
                obj, error = parse_line(raw)
                yield Line(lineno, here, raw, obj, error and "partial last line (the writer stopped mid-line)", True)
                return
            obj, error = parse_line(raw)
            yield Line(lineno, here, raw, obj, error)
