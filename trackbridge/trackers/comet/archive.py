"""Comet's offline experiment, as comet_ml 3.58.8 writes it (``comet_ml/offline.py``, ``offline_utils.py``) and
validates it (the JSON Schemas ``comet_ml/schemas/offline-*.schema.json`` that ``comet upload`` checks):

* ``DIR/<experiment key>.zip`` holding ``experiment.json`` (``offline_id``, ``project_name``, ``workspace``,
  ``start_time`` and ``stop_time`` in ms, ``tags``, ...) and ``messages.json``: one JSON object per line,
  ``{"type": ..., "payload": ...}``; a point is ``metric_msg``: ``{"local_timestamp": <ms>, "message_id": <n>,
  "metric": {"metricName", "metricValue" (NaN and infinities as the strings "NaN", "Infinity", "-Infinity"),
  "step", "epoch"}}``; parameters are ``parameter_msg`` (``{"param": {"paramName", "paramValue", "step": null,
  "source"}}``, nested names joined with ``|``), free-form values ``log_other`` (``{"key", "value"}``).
* an experiment key is 32 lowercase hex digits here (Comet's own form); trackbridge's run id is kept in the run
  info (``log_other`` key ``trackbridge``), and the key is derived from it, so a resumed run finds its archive.

While a run is written its files are in ``DIR/<key>.partial/`` (messages appended per batch); ``close`` zips them
into ``DIR/<key>.zip`` (a temporary file moved into place) and removes the folder. A killed run leaves the folder:
readers read it, and the resumed run continues it.
"""
from __future__ import annotations

import hashlib
import json
import re
import zipfile
from pathlib import Path
from typing import IO, Any, Iterator

MESSAGES = "messages.json"
EXPERIMENT = "experiment.json"
PARTIAL = ".partial"
METRIC, PARAMETER, OTHER = "metric_msg", "parameter_msg", "log_other"
INFO_KEY = "trackbridge"          # log_other key holding trackbridge's RunInfo (JSON)
EXPERIMENT_REQUIRED = ("project_name", "start_time", "stop_time", "tags", "workspace")
SPECIAL = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}


def experiment_key(run_id: str) -> str:
    """The experiment key of a trackbridge run id (32 hex digits)."""
    return hashlib.sha1(run_id.encode("utf-8")).hexdigest()[:32]


def encode_number(v: float) -> float | str:
    if v != v:
        return "NaN"
    if v in (float("inf"), float("-inf")):
        return "Infinity" if v > 0 else "-Infinity"
    return v


class Archive:
    """One offline experiment: a zip, or the folder of a run being written (read only)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.partial = path.is_dir()
        self.key = path.name[:-len(PARTIAL)] if self.partial else path.stem

    def text(self, name: str) -> str | None:
        try:
            if self.partial:
                target = self.path / name
                return target.read_text(encoding="utf-8") if target.is_file() else None
            with zipfile.ZipFile(self.path) as z:
                return z.read(name).decode("utf-8") if name in z.namelist() else None
        except (OSError, zipfile.BadZipFile, UnicodeDecodeError, KeyError):
            return None

    def experiment(self) -> dict[str, Any] | None:
        text = self.text(EXPERIMENT)
        try:
            obj = json.loads(text) if text is not None else None
        except json.JSONDecodeError:
            return None
        return obj if isinstance(obj, dict) else None

    def lines(self) -> Iterator[tuple[int, str, bool]]:
        """``(line number, text, complete)`` of every line of ``messages.json`` that holds more than white space (the
        readers skip those anyway): found in 1 MB chunks by a regular expression, so runs of blank lines cost C time,
        not a Python step each (16 MB of bare newlines in a 16 KB zip took minutes), and the work is linear in the
        uncompressed size. A last line without its newline is ``complete=False`` in a ``.partial`` folder (cut short
        while written); a zip's members are whole."""
        if self.partial:
            target = self.path / MESSAGES
            if target.is_file():
                with open(target, "rb") as fh:
                    yield from _content_lines(fh, last_complete=False)
            return
        try:
            with zipfile.ZipFile(self.path) as z, z.open(MESSAGES) as fh:
                yield from _content_lines(fh, last_complete=True)
        except (OSError, zipfile.BadZipFile, KeyError):
            return


_CONTENT = re.compile(rb"[^\n]*\S[^\n]*")      # a line with something other than white space
_CHUNK = 1 << 20


def _content_lines(fh: IO[bytes], *, last_complete: bool) -> Iterator[tuple[int, str, bool]]:
    """The non-blank lines of a binary stream with their line numbers (see :meth:`Archive.lines`)."""
    lineno, tail = 1, b""
    pending: list[bytes] = []                       # chunks of one long line, joined once its newline comes
    while True:
        chunk = fh.read(_CHUNK)
        if not chunk:
            break
        if b"\n" not in chunk:
            pending.append(chunk)
            continue
        data = b"".join([tail, *pending, chunk])
        pending = []
        end = data.rfind(b"\n") + 1                 # whole lines only; the rest waits for the next chunk
        pos = 0
        for m in _CONTENT.finditer(data, 0, end):
            lineno += data.count(b"\n", pos, m.start())
            pos = m.start()
            yield lineno, data[m.start():m.end() + 1].decode("utf-8", errors="replace"), True
        lineno += data.count(b"\n", pos, end)
        tail = data[end:]
    tail = b"".join([tail, *pending])
    if tail.strip():
        yield lineno, tail.decode("utf-8", errors="replace"), last_complete


def archives(location: Path) -> list[Archive]:
    """The offline experiments ``location`` designates: a zip, a ``.partial`` folder, or a folder of them (a run with
    both is read from its zip, the complete one)."""
    if location.is_file() or location.name.endswith(PARTIAL):
        return [Archive(location)]
    out: dict[str, Archive] = {}
    if location.is_dir():
        for p in sorted(location.iterdir()):
            if p.suffix == ".zip" and p.is_file():
                out[p.stem] = Archive(p)
        for p in sorted(location.glob(f"*{PARTIAL}")):
            key = p.name[:-len(PARTIAL)]
            if p.is_dir() and key not in out and (p / MESSAGES).is_file():
                out[key] = Archive(p)
    return [out[k] for k in sorted(out)]
