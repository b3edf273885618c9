"""``jsonl:DIR`` -- the canonical stream on disk, and the spool that "nothing is lost" rests on.

One file per run, ``DIR/<run_id>.jsonl``: the first line is :meth:`RunInfo.to_json` (``"type": "run"``), then one
:meth:`Record.to_json` per line (compact JSON, NaN/inf as strings so the file stays strict JSON). Why this shape: it
is readable by anyone with ``json``, appendable without rewriting, and enough to replay every other sink.

Durability: :meth:`JsonlSink.write` hands each batch to the OS (``file.flush()``) before returning, so a crash of
the Python process loses nothing already written; ``?fsync=1`` also calls ``os.fsync`` per batch (survives a
machine crash, costs a disk round trip per batch). A crash *during* a write can leave a partial last line; readers
skip it and report it, and :meth:`JsonlSink.open` with ``resume=True`` first ends that line so that new lines are
never glued onto it.

Needs nothing but the standard library.
"""
from __future__ import annotations

import json
import os
import re
import uuid
from pathlib import Path

from ...record import Record, RunInfo, dumps, encode_value
from ...sinks.base import Capabilities, Sink, SinkError, printable

_UNSAFE = re.compile(r"[^A-Za-z0-9_.\-]")


def run_file_name(run_id: str) -> str:
    """File name of a run's stream: the run id with characters unsafe in file names replaced by ``_``."""
    return _UNSAFE.sub("_", run_id) + ".jsonl"


def _truthy(value: str | None) -> bool:
    return str(value).strip().lower() in ("1", "true", "yes", "on")


def last_complete_record_step(path: Path, *, chunk: int = 65536) -> int | None:
    """The ``step`` of the last complete record line of ``path`` (reading backwards from the end), or ``None``.

    A partial last line (no trailing newline, or not JSON) and ``"type": "run"`` header lines are passed over.
    """
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return None
    with open(path, "rb") as fh:
        end = size
        tail = b""
        while end > 0:
            start = max(0, end - chunk)
            fh.seek(start)
            tail = fh.read(end - start) + tail
            end = start
            lines = tail.split(b"\n")
            # lines[0] may be cut (unless we reached the file start); the last element is after the final newline
            complete = lines[1:-1] if end > 0 else lines[:-1]
            for raw in reversed(complete):
                raw = raw.strip()
                if not raw:
                    continue
                try:
                    obj = json.loads(raw)
                except ValueError:
                    continue
                if not isinstance(obj, dict) or obj.get("type") == "run":
                    continue
                step = obj.get("step")
                if isinstance(step, int):
                    return step
            if end > 0:
                tail = lines[0]
    return None


class JsonlSink(Sink):
    """Writes the canonical stream to ``DIR/<run_id>.jsonl``. Options: ``fsync=1``."""

    kind = "jsonl"
    capabilities = Capabilities(histograms=True, text=True, nan=True, wall_time=True)

    def __init__(self, location: str = "", **options: str) -> None:
        super().__init__(location, **options)
        if not location:
            raise SinkError("jsonl sink: no folder given (expected jsonl:DIR)")
        self.fsync = _truthy(options.get("fsync"))
        self.path: Path | None = None
        self._fh = None

    def open(self, run: RunInfo, *, resume: bool = False) -> None:
        if run.run_id is None:
            run.run_id = uuid.uuid4().hex[:12]
        self.run = run
        folder = Path(self.location).expanduser()
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise SinkError(f"jsonl sink: cannot create folder {folder}: {exc}") from None
        self.path = folder / run_file_name(run.run_id)
        exists = self.path.exists() and self.path.stat().st_size > 0
        if exists and not resume:
            raise SinkError(f"jsonl sink: {self.path} already holds run {run.run_id!r}; "
                            f"open with resume=True to append to it, or use a new run id")
        self._fh = open(self.path, "ab")
        if exists:
            # End a partial last line left by a crash so that the next record starts on its own line.
            with open(self.path, "rb") as rd:
                rd.seek(-1, os.SEEK_END)
                if rd.read(1) != b"\n":
                    self._fh.write(b"\n")
        else:
            self._fh.write((dumps(run.to_json()) + "\n").encode("utf-8"))
        self._flush()

    def write(self, records: list[Record]) -> None:
        if self._fh is None:
            raise SinkError(f"jsonl sink {self.location}: write() before open() or after close()")
        if not records:
            return
        try:
            data = "".join(dumps(r.to_json()) + "\n" for r in records).encode("utf-8")
        except (TypeError, ValueError):      # UnicodeEncodeError is a ValueError: find the values at fault
            data = "".join(self._line(r) for r in records).encode("utf-8")
        self._fh.write(data)
        self._flush()

    def _line(self, rec: Record) -> str:
        """One record's line, leaving out (see :meth:`Sink.reject`) each value that is not strict JSON in UTF-8."""
        try:
            return (dumps(rec.to_json()) + "\n").encode("utf-8").decode("utf-8")
        except (TypeError, ValueError):
            pass
        keep = {}
        for k, v in rec.metrics.items():
            try:
                dumps({k: encode_value(v)}).encode("utf-8")
            except (TypeError, ValueError) as exc:
                self.reject(printable(k), rec.step, f"{type(exc).__name__}: {printable(str(exc))[:200]}")
                continue
            keep[k] = v
        derived = [d for d in rec.derived if d in keep]
        try:
            return (dumps(Record(rec.step, rec.wall_time, keep, derived).to_json()) + "\n").encode("utf-8").decode(
                "utf-8")
        except (TypeError, ValueError) as exc:
            self.reject("step", rec.step if isinstance(rec.step, int) else None,
                        f"the record is not JSON ({type(exc).__name__}: {printable(str(exc))[:200]})")
            return ""

    def _flush(self) -> None:
        assert self._fh is not None
        self._fh.flush()
        if self.fsync:
            os.fsync(self._fh.fileno())

    def close(self) -> None:
        if self._fh is not None:
            try:
                self._flush()
            finally:
                self._fh.close()
                self._fh = None

    def last_step(self) -> int | None:
        """The step of the file's last complete record line (the highest step when steps only grow)."""
        if self.path is None:
            return None
        if self._fh is not None:
            self._fh.flush()
        return last_complete_record_step(self.path)

    def held(self, since: int | None = None):
        """The points of the file's complete record lines (a partial last line holds nothing)."""
        from ...holdings import Holdings
        from ...record import iter_json_objects
        if self.path is None:
            return None
        if self._fh is not None:
            self._fh.flush()
        h = Holdings()
        if not self.path.exists():
            return h
        with open(self.path, "r", encoding="utf-8", errors="replace") as fh:
            for _line, obj in iter_json_objects(fh, str(self.path), [], complete_lines=True):
                step = obj.get("step")
                if obj.get("type") == "run" or not isinstance(step, int) or (since is not None and step < since):
                    continue
                for key, value in (obj.get("metrics") or {}).items():
                    if value is not None:
                        h.add(key, step)
        return h

    def describe(self) -> str:
        return f"jsonl:{self.path or self.location}"
