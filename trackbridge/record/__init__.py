"""The one record type that moves through trackbridge, and the canonical stream's JSON-lines form.

A :class:`Record` is one step of one run: ``step``, ``wall_time`` and ``metrics`` (name -> value), plus which of
those metrics were derived rather than logged. A :class:`RunInfo` describes the run the records belong to. The
package holds what a record is made of as well: :mod:`.values` (what a trainer passes to ``log()`` made record
values), :mod:`.ranked` (a rank's share of a value and how shares merge) and :mod:`.rank` (which process this is).

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
from typing import Any, Callable, Iterable, Iterator

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
    nonfinite: float | None = None   # NaN/+-inf samples left out of ``values`` (None when there were none)

    @classmethod
    def from_values(cls, values: Iterable[Any]) -> "Histogram":
        """A raw-samples histogram. NaN and infinities are left out of ``values`` (no tracker can bucket them, and
        the spool must stay strict JSON); how many were left out is kept in ``nonfinite``."""
        vals = [float(v) for v in values]
        finite = [v for v in vals if v - v == 0.0]      # v - v is NaN for NaN and +-inf
        dropped = len(vals) - len(finite)
        try:
            sq = float(sum(v * v for v in finite)) if finite else 0.0
        except OverflowError:    # pragma: no cover - float products overflow to inf, never raise
            sq = math.inf
        return cls(
            values=finite,
            min=min(finite) if finite else None,
            max=max(finite) if finite else None,
            num=float(len(finite)),
            sum=float(sum(finite)) if finite else 0.0,
            sum_squares=sq,
            nonfinite=float(dropped) if dropped else None,
        )

    def is_finite(self) -> bool:
        """True when every number in the histogram is finite (what strict JSON and every tracker can take)."""
        for seq in (self.values, self.limits, self.counts):
            if seq:
                for x in seq:
                    if not math.isfinite(x):
                        return False
        for stat in (self.min, self.max, self.num, self.sum, self.sum_squares, self.nonfinite):
            if stat is not None and not math.isfinite(stat):
                return False
        return True

    def finite(self) -> "Histogram | None":
        """This histogram with NaN/+-inf samples moved out of ``values`` into ``nonfinite`` (statistics recomputed);
        ``None`` when bucket edges, counts or statistics are not finite (such a histogram cannot be repaired)."""
        if self.is_finite():
            return self
        if self.limits is not None or self.counts is not None or self.values is None:
            return None
        out = Histogram.from_values(self.values)
        out.nonfinite = (out.nonfinite or 0.0) + (self.nonfinite or 0.0) or None
        return out if out.is_finite() else None

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
        """The stream's JSON form: ``{"_type": "histogram", ...}`` with the fields that are set."""
        return {"_type": "histogram", **{k: v for k, v in self.__dict__.items() if v is not None}}

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> "Histogram":
        """Inverse of :meth:`to_json`; unknown keys are ignored."""
        known = cls.__dataclass_fields__
        return cls(**{k: v for k, v in obj.items() if k in known})


@dataclass
class Record:
    """One step of one run.

    ``axis`` names the x axis ``step`` counts when the run has several (slime declares ``train/step``,
    ``rollout/step`` and ``eval/step`` with wandb's ``define_metric``): the record's metrics are that axis's series
    and ``step`` is the axis's value. ``None`` (every single-axis run) is the run's own step. A record holds the
    metrics of one axis only; :func:`split_by_axis` makes it so."""

    step: int | None
    wall_time: float | None
    metrics: dict[str, Any]
    derived: list[str] = field(default_factory=list)
    axis: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The stream's JSON form of this record (values through :func:`encode_value`; ``axis`` only when set)."""
        obj: dict[str, Any] = {"step": self.step, "wall_time": self.wall_time,
                               "metrics": {k: encode_value(v) for k, v in self.metrics.items()}}
        if self.derived:
            obj["derived"] = list(self.derived)
        if self.axis is not None:
            obj["axis"] = self.axis
        return obj

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> "Record":
        """Inverse of :meth:`to_json` (values through :func:`decode_value`)."""
        axis = obj.get("axis")
        if axis is not None and not isinstance(axis, str):
            raise ValueError(f"axis {axis!r} is not a string")
        return cls(step=obj.get("step"), wall_time=obj.get("wall_time"),
                   metrics={k: decode_value(v) for k, v in (obj.get("metrics") or {}).items()},
                   derived=list(obj.get("derived") or []), axis=axis)


def split_by_axis(rec: Record, axis_of: Callable[[str], str | None]) -> list[Record]:
    """``rec`` as one record per x axis of its metrics (``axis_of(name)``: the axis a metric is on, None for the
    run's own step): a store that keeps points, not rows, may have gathered points of two axes at the same step into
    one record. A record whose metrics are all on one axis comes back as it is (its axis set)."""
    groups: dict[str | None, dict[str, Any]] = {}
    for k, v in rec.metrics.items():
        a = axis_of(k)
        groups.setdefault(rec.axis if a is None else a, {})[k] = v
    if len(groups) <= 1:
        if groups:
            (only,) = groups
            rec.axis = only
        return [rec]
    return [Record(rec.step, rec.wall_time, ms, [d for d in rec.derived if d in ms], a) for a, ms in groups.items()]


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
        """The stream's header line: ``{"type": "run", "format": ..., <every field>}``."""
        return {"type": "run", "format": STREAM_FORMAT, **{k: v for k, v in self.__dict__.items()}}

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> "RunInfo":
        """Inverse of :meth:`to_json`; unknown keys are ignored."""
        known = {k: obj[k] for k in cls.__dataclass_fields__ if k in obj}
        return cls(**known)


def encode_value(v: Any) -> Any:
    """JSON form of a metric value, so that the file stays strict JSON.

    * a float NaN / +inf / -inf becomes the bare string ``"NaN"`` / ``"Infinity"`` / ``"-Infinity"`` (the form every
      stream ever written uses, and trackio's);
    * a *string* value that is exactly one of those three words is tagged, ``{"_type": "str", "value": "NaN"}``, so
      that it reads back as a string (before this rule it read back as a float);
    * a histogram becomes ``{"_type": "histogram", ...}``.

    The rule for readers (:func:`decode_value`): a bare special word is always a float, in old and new streams alike;
    only the tagged form is a string. Old streams stay readable unchanged, and so does every stream without such a
    string (the tag appears only for those three exact strings).
    """
    t = type(v)
    if t is float:
        if v != v:
            return "NaN"
        if v in _INFS:
            return "Infinity" if v > 0 else "-Infinity"
        return v
    if t is str:
        return {"_type": "str", "value": v} if v in _SPECIAL else v
    if isinstance(v, Histogram):
        return v.to_json()
    if isinstance(v, float):
        return encode_value(float(v))
    if isinstance(v, str):
        return encode_value(str(v))
    return v


_SPECIAL = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}
_INFS = (float("inf"), float("-inf"))


def decode_value(v: Any) -> Any:
    """Inverse of :func:`encode_value` (see its rule)."""
    if isinstance(v, dict):
        t = v.get("_type")
        if t == "histogram":
            return Histogram.from_json(v)
        if t == "str" and isinstance(v.get("value"), str):
            return v["value"]
        return v
    if isinstance(v, str) and v in _SPECIAL:
        return _SPECIAL[v]
    return v


def dumps(obj: Any) -> str:
    """Compact strict JSON (no NaN/Infinity literals): the form of one line of the stream."""
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
