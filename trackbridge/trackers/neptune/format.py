"""The Parquet layout of neptune-exporter, as its README ("Data layout on disk", "Parquet schema") and
``src/neptune_exporter/model.py`` define it at neptune-ai/neptune-exporter@8d3f44a6 (2026-02-27, package 0.1.0):

* ``DATA/<sanitized project id>/<sanitized run id>_part_<n>.parquet`` (Snappy); a run is complete once its
  ``part_0`` exists (the exporter renames part 0 last); a sanitized name keeps ``[A-Za-z0-9_-]`` (every other
  character becomes ``_``) and appends ``-`` and the 16 hex digits of the name's BLAKE2b digest of 8 bytes
  (``utils.sanitize_path_part``), so two names that clean to the same text stay apart;
* one row per point: ``project_id``, ``run_id``, ``attribute_path``, ``attribute_type`` (``float``, ``int``,
  ``string``, ``bool``, ``datetime``, ``string_set``, ``float_series``, ``string_series``, ``histogram_series``,
  ``file``, ``file_series``), ``step`` (``decimal(18, 6)``), ``timestamp`` (ms, UTC; set for series), one typed value
  column (``int_value`` ... ``histogram_value`` = ``{type, edges, values}``).

:func:`check_schema` is the version guard: a file whose columns or types differ from these is refused with one
line naming the file and the difference (the layout is the exporter's contract with its loaders; a change there is
a new format, not something to guess at).
"""
from __future__ import annotations

import hashlib
import re
from decimal import Decimal
from pathlib import Path
from typing import Any

PART = re.compile(r"^(?P<run>.+)_part_(?P<n>\d+)\.parquet$")
SINGLE_TYPES = ("float", "int", "string", "bool", "datetime", "string_set")
SERIES_TYPES = ("float_series", "string_series", "histogram_series")
FILE_TYPES = ("file", "file_series", "file_set", "artifact")
ATTRIBUTE_TYPES = SINGLE_TYPES + SERIES_TYPES + FILE_TYPES
STEP_DIGITS = 12            # decimal(18, 6): 12 digits before the point
STEP_MAX = 10 ** STEP_DIGITS - 1
RUN_ATTRIBUTE = "trackbridge/run"      # trackbridge's RunInfo (JSON), a string attribute like any parameter
CONFIG_PREFIX = "config/"             # the run config, flattened with '/', one typed attribute per value

# the exporter's columns and their Arrow types (model.py SCHEMA), as text so that this module imports no pyarrow
COLUMNS = (
    ("project_id", "string"), ("run_id", "string"), ("attribute_path", "string"), ("attribute_type", "string"),
    ("step", "decimal128(18, 6)"), ("timestamp", "timestamp[ms, tz=UTC]"), ("int_value", "int64"),
    ("float_value", "double"), ("string_value", "string"), ("bool_value", "bool"),
    ("datetime_value", "timestamp[ms, tz=UTC]"), ("string_set_value", "list<item: string>"),
    ("file_value", "struct<path: string>"),
    ("histogram_value", "struct<type: string, edges: list<item: double>, values: list<item: double>>"),
)


def sanitize_path_part(part: str) -> str:
    """The exporter's file-system-safe form of a project or run id (see the module docstring)."""
    digest = hashlib.blake2b(part.encode("utf-8"), digest_size=8).hexdigest()
    return "".join(c if c.isalnum() or c in ("_", "-") else "_" for c in part) + "-" + digest


def schema() -> Any:
    """The exporter's Arrow schema (``model.SCHEMA``)."""
    import pyarrow as pa
    return pa.schema([
        ("project_id", pa.string()), ("run_id", pa.string()), ("attribute_path", pa.string()),
        ("attribute_type", pa.string()), ("step", pa.decimal128(18, 6)), ("timestamp", pa.timestamp("ms", tz="UTC")),
        ("int_value", pa.int64()), ("float_value", pa.float64()), ("string_value", pa.string()),
        ("bool_value", pa.bool_()), ("datetime_value", pa.timestamp("ms", tz="UTC")),
        ("string_set_value", pa.list_(pa.string())), ("file_value", pa.struct([("path", pa.string())])),
        ("histogram_value", pa.struct([("type", pa.string()), ("edges", pa.list_(pa.float64())),
                                       ("values", pa.list_(pa.float64()))])),
    ])


def check_schema(actual: Any, where: str) -> str | None:
    """Why the Arrow schema ``actual`` of the file ``where`` is not the exporter's layout, or None when it is."""
    # Parquet names a list's item "element" where Arrow says "item": the same type
    have = {f.name: str(f.type).replace("<element: ", "<item: ") for f in actual}
    missing = [name for name, _t in COLUMNS if name not in have]
    if missing:
        return f"{where}: not neptune-exporter's Parquet layout (no column {', '.join(missing)})"
    odd = [f"{name} is {have[name]}, expected {typ}" for name, typ in COLUMNS if have[name] != typ]
    if odd:
        return (f"{where}: an unknown version of neptune-exporter's Parquet layout ({'; '.join(odd)}); "
                f"trackbridge reads the layout of neptune-exporter 0.1.0")
    return None


def part_files(folder: Path, run_prefix: str) -> list[Path]:
    """The part files of the run whose file prefix is ``run_prefix``, in part order."""
    parts = []
    for p in folder.glob(f"{run_prefix}_part_*.parquet"):
        m = PART.match(p.name)
        if m and m.group("run") == run_prefix:
            parts.append((int(m.group("n")), p))
    return [p for _n, p in sorted(parts)]


def step_of(value: Any, multiplier: int = 1) -> int | None:
    """A ``decimal(18, 6)`` step as an integer step (times ``multiplier``, the exporter's ``--step-multiplier``);
    None when it is not a whole number then."""
    if value is None:
        return None
    d = Decimal(value) * multiplier
    return int(d) if d == d.to_integral_value() else None
