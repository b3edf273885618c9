"""The one record type that moves through trackbridge, and the canonical stream's JSON-lines form.

A :class:`Record` is one step of one run: ``step``, ``wall_time`` and ``metrics`` (name -> value), plus which of
those metrics were derived rather than logged. A :class:`RunInfo` describes the run the records belong to.

Metric values are one of:

* a number (``int``/``float``, NaN and infinities included),
* a ``str`` (text),
* a :class:`Histogram` (a distribution, either raw samples or bucketed counts),
* ``None`` (logged as missing; carried through, never invented).

Logging, migration, replay and comparison all produce and consume these two types.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

STREAM_FORMAT = "trackbridge.stream/1"


@dataclass
class Histogram:
    """A distribution. Either ``values`` (raw samples) or ``limits``+``counts`` (bucket right edges and counts)."""

    values: list[float] | None = None
    limits: list[float] | None = None
    counts: list[float] | None = None
    min: float | None = None
    max: float | None = None
    num: float | None = None
    sum: float | None = None
    sum_squares: float | None = None

    @classmethod
    def from_values(cls, values: Iterable[Any]) -> "Histogram":
        vals = [float(v) for v in values]
        finite = [v for v in vals if math.isfinite(v)]
        return cls(
            values=vals,
            min=min(finite) if finite else None,
            max=max(finite) if finite else None,
            num=float(len(vals)),
            sum=float(sum(finite)) if finite else 0.0,
            sum_squares=float(sum(v * v for v in finite)) if finite else 0.0,
        )

    def summary(self) -> dict[str, float]:
        """Summary statistics for trackers that hold no histograms (``mean``, ``std``, ``min``, ``max``, ``count``)."""
        out: dict[str, float] = {}
        n = self.num
        if n is None and self.counts is not None:
            n = float(sum(self.counts))
        if n:
            out["count"] = float(n)
            if self.sum is not None:
                mean = self.sum / n
                out["mean"] = mean
                if self.sum_squares is not None:
                    out["std"] = math.sqrt(max(self.sum_squares / n - mean * mean, 0.0))
        if self.min is not None:
            out["min"] = float(self.min)
        if self.max is not None:
            out["max"] = float(self.max)
        return out

    def to_json(self) -> dict[str, Any]:
        return {"_type": "histogram", **{k: v for k, v in self.__dict__.items() if v is not None}}

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> "Histogram":
        return cls(**{k: v for k, v in obj.items() if k != "_type"})


@dataclass
class Record:
    """One step of one run."""

    step: int | None
    wall_time: float | None
    metrics: dict[str, Any]
    derived: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        obj: dict[str, Any] = {"step": self.step, "wall_time": self.wall_time,
                               "metrics": {k: encode_value(v) for k, v in self.metrics.items()}}
        if self.derived:
            obj["derived"] = list(self.derived)
        return obj

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> "Record":
        return cls(step=obj.get("step"), wall_time=obj.get("wall_time"),
                   metrics={k: decode_value(v) for k, v in (obj.get("metrics") or {}).items()},
                   derived=list(obj.get("derived") or []))


@dataclass
class RunInfo:
    """What is known about a run as a whole."""

    name: str | None = None
    project: str | None = None
    run_id: str | None = None
    config: dict[str, Any] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    source: str | None = None            # e.g. "verl@>=v0.4.0,<=v0.7.0" (what the names were translated from)
    names: str = "raw"                   # naming scheme of the records: canonical, FRAMEWORK[@V], raw (not known)
    sanitized: dict[str, str] = field(default_factory=dict)   # stored name -> original name
    approximate: dict[str, str] = field(default_factory=dict)  # canonical name -> why it is approximate
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"type": "run", "format": STREAM_FORMAT, **{k: v for k, v in self.__dict__.items()}}

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> "RunInfo":
        known = {k: obj[k] for k in cls.__dataclass_fields__ if k in obj}
        return cls(**known)


def encode_value(v: Any) -> Any:
    """JSON form of a metric value. NaN and infinities become strings so that the file stays strict JSON."""
    if isinstance(v, Histogram):
        return v.to_json()
    if isinstance(v, float):
        if math.isnan(v):
            return "NaN"
        if math.isinf(v):
            return "Infinity" if v > 0 else "-Infinity"
    return v


_SPECIAL = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}


def decode_value(v: Any) -> Any:
    if isinstance(v, dict) and v.get("_type") == "histogram":
        return Histogram.from_json(v)
    if isinstance(v, str) and v in _SPECIAL:
        return _SPECIAL[v]
    return v


def dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def iter_json_objects(lines: Iterable[str], where: str, problems: list[str] | None = None, *,
                      complete_lines: bool = False) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, object)`` for every line of JSON-lines text that holds a JSON object. Blank lines are passed
    over; a line that is not JSON or not an object is reported in ``problems`` as ``where:line: ...`` and skipped
    (or raises ValueError when ``problems`` is None). With ``complete_lines``, reading stops at a last line without
    a newline (a write cut off by a crash), which is reported too."""
    def bad(msg: str) -> None:
        if problems is None:
            raise ValueError(msg)
        problems.append(msg)

    for lineno, line in enumerate(lines, 1):
        if complete_lines and not line.endswith("\n"):
            if line.strip():
                bad(f"{where}:{lineno}: partial last line ({len(line)} characters) skipped")
            return
        text = line.strip()
        if not text:
            continue
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            bad(f"{where}:{lineno}: not a JSON object ({exc.msg} at column {exc.colno}); line skipped")
            continue
        if not isinstance(obj, dict):
            bad(f"{where}:{lineno}: expected a JSON object, got {type(obj).__name__}; line skipped")
            continue
        yield lineno, obj


def read_stream(lines: Iterable[str], where: str = "<stream>",
                problems: list[str] | None = None) -> Iterator[RunInfo | Record]:
    """Parse the canonical stream: RunInfo header lines and Record lines (bad lines: see iter_json_objects)."""
    for _lineno, obj in iter_json_objects(lines, where, problems):
        if obj.get("type") == "run":
            yield RunInfo.from_json(obj)
        else:
            yield Record.from_json(obj)
