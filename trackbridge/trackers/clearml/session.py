"""ClearML's offline session, as clearml 2.1.12 writes it (``Task.set_offline(True)``; ``clearml/task.py``
``import_offline_session`` and ``backend_interface/metrics/interface.py`` ``report_offline_session`` read it):

* a folder ``offline-<id>/`` holding ``task.json`` (the task: ``id``, ``name``, ``project_name``, ``type``,
  ``hyperparams`` ``{section: {name: {name, section, type, value (text), description}}}``, ``configuration``
  ``{name: {name, value, type, description}}``, ``tags``, ...: the fields of a task edit request) and
  ``metrics.jsonl``: one JSON **array** of events per line, a scalar being ``{"timestamp": <ms>, "type":
  "training_stats_scalar", "task": <id>, "iter": <int>, "metric": <title>, "variant": <series>, "value": <float>}``;
  ``import_offline_session`` replays the events as they are (timestamp included) into a new task;
* ``offline-<id>.zip`` beside it: the same files (what ClearML prints for import).

Names: ClearML plots a scalar under a **title** (``metric``) and a **series** (``variant``). A key is split on its
first ``/``: ``train/loss`` is title ``train``, series ``loss``; ``actor/kl/mean`` is title ``actor``, series
``kl/mean`` (transformers' ClearML callback files ``eval/...`` keys under the title ``eval`` the same way). A key
without ``/`` (or with an empty side) is its own title and series, ``loss`` -> ``loss``/``loss``, as ClearML's
TensorBoard binding files a tag without ``/`` (``binding/frameworks/tensorflow_bind.py``, ``default_title=tag``). A
reader of a foreign session joins ``title/series``, or gives the title alone when the two are equal; a session
trackbridge wrote records every key whose stored pair reads back otherwise (``loss/loss``), so it restores all.
"""
from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path
from typing import Any, Iterator

TASK_FILE = "task.json"
METRICS_FILE = "metrics.jsonl"
SCALAR = "training_stats_scalar"
PLOT = "plot"
KNOWN_EVENTS = (SCALAR, PLOT, "training_debug_image", "log")
CONFIG_NAME = "trackbridge"       # the configuration item holding trackbridge's RunInfo (JSON)


def split_key(name: str) -> tuple[str, str]:
    """A key as ClearML's ``(title, series)`` (see the module docstring)."""
    title, sep, series = name.partition("/")
    if sep and title and series:
        return title, series
    safe = name.replace("/", "_x2F_") if sep else name
    return safe, safe


def stored(title: str, series: str) -> str:
    """The text a ``(title, series)`` pair is recorded under in trackbridge's name map."""
    return f"{title}/{series}"


def join_key(title: str, series: str) -> str:
    """The key of a foreign ``(title, series)`` pair: ``title/series``, or the title when the two are equal."""
    return title if title == series else f"{title}/{series}"


class Session:
    """One offline session: a folder, or its zip (read only)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.zip = path.suffix == ".zip"

    def read_text(self, name: str) -> str | None:
        try:
            if self.zip:
                with zipfile.ZipFile(self.path) as z:
                    return z.read(name).decode("utf-8") if name in z.namelist() else None
            target = self.path / name
            return target.read_text(encoding="utf-8") if target.is_file() else None
        except (OSError, zipfile.BadZipFile, UnicodeDecodeError):
            return None

    def task(self) -> dict[str, Any] | None:
        text = self.read_text(TASK_FILE)
        if text is None:
            return None
        try:
            obj = json.loads(text)
        except json.JSONDecodeError:
            return None
        return obj if isinstance(obj, dict) else None

    def event_lines(self) -> Iterator[tuple[int, str, bool]]:
        """``(line number, text, complete)`` of ``metrics.jsonl``, streamed from a folder."""
        if self.zip:
            text = self.read_text(METRICS_FILE) or ""
            # lines as a file reads them (``\n``; ``str.splitlines`` would also cut at U+2028, U+0085 ... inside a
            # JSON string, which sessions written before the sink escaped them hold)
            for i, line in enumerate(io.StringIO(text, newline=None), 1):
                yield i, line, line.endswith("\n")
            return
        target = self.path / METRICS_FILE
        if not target.is_file():
            return
        with open(target, encoding="utf-8", errors="replace") as fh:
            for i, line in enumerate(fh, 1):
                yield i, line, line.endswith("\n")


def sessions(location: Path) -> list[Session]:
    """The sessions ``location`` designates (a session folder, its zip, or a folder of them); a session present as
    a folder and a zip is read from its folder."""
    if location.is_file():
        return [Session(location)]
    if (location / TASK_FILE).is_file():
        return [Session(location)]
    out: dict[str, Session] = {}
    if location.is_dir():
        for p in sorted(location.glob("offline-*")):
            if p.is_dir() and (p / TASK_FILE).is_file():
                out[p.name] = Session(p)
            elif p.suffix == ".zip" and p.stem not in out and not (location / p.stem / TASK_FILE).is_file():
                out[p.stem] = Session(p)
    return [out[k] for k in sorted(out)]
