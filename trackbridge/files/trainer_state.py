"""``trainer-state:PATH``: a Hugging Face ``trainer_state.json`` (what every Trainer/TRL checkpoint holds).

``PATH`` is the file itself, or a folder holding ``trainer_state.json`` (preferred) or ``checkpoint-N/`` folders (the
one with the highest N is read: its log history is the longest). A bare JSON list (a saved copy of
``state.log_history``) is accepted too; ``?key=NAME`` reads the list under another top-level key (some projects save
``raw_log_history``).

Each ``log_history`` entry becomes one record: its ``step`` (``state.global_step`` at log time, added by
``Trainer.log``) is the step, every other key a metric (``epoch`` stays a metric). Eval entries (``eval_*`` keys)
and the end-of-training summary (``train_runtime``, ``train_loss``, ...) are records too, at their own step.
The file holds no times, so no wall time is given (:attr:`has_wall_time` is False). :attr:`RunInfo.config` gets
``logging_steps``, ``eval_steps``, ``save_steps``, ``train_batch_size``, ``num_train_epochs``, ``max_steps`` and any
hyperparameter-search ``trial_params``; the rest of the state goes to :attr:`RunInfo.extra`.

The file is streamed: the top-level object is walked key by key and ``log_history`` entry by entry, so memory holds
one entry at a time. A truncated file yields every complete entry and reports where it stops.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import IO, Any, Iterator

from ..record import Record, RunInfo
from ..tracking.source import RunReader, Source, SourceError
from ..tracking.textfiles import existing_file

CONFIG_FIELDS = ("logging_steps", "eval_steps", "save_steps", "train_batch_size", "num_train_epochs", "max_steps")
_CHECKPOINT = re.compile(r"checkpoint-(\d+)$")
_CHUNK = 1 << 16


class TruncatedJSON(ValueError):
    """The JSON text ends before the value being read is complete."""


class _Scanner:
    """Just enough of a streaming JSON reader: walk one object's keys, decode values one at a time.

    Values are decoded with :func:`json.JSONDecoder.raw_decode` on a buffer that grows only while a single value is
    incomplete; consumed text is dropped. Tracks the line number for error messages.
    """

    _WS = " \t\r\n"

    def __init__(self, fh: IO[str]) -> None:
        self.fh = fh
        self.buf = ""
        self.pos = 0
        self.eof = False
        self.line = 1
        self.decoder = json.JSONDecoder()

    def _more(self) -> bool:
        if self.eof:
            return False
        chunk = self.fh.read(_CHUNK)
        if not chunk:
            self.eof = True
            return False
        self.line += self.buf.count("\n", 0, self.pos)
        self.buf = self.buf[self.pos:] + chunk
        self.pos = 0
        return True

    def peek(self) -> str:
        while True:
            while self.pos < len(self.buf) and self.buf[self.pos] in self._WS:
                self.pos += 1
            if self.pos < len(self.buf):
                return self.buf[self.pos]
            if not self._more():
                raise TruncatedJSON("unexpected end of file")

    def expect(self, ch: str) -> None:
        got = self.peek()
        if got != ch:
            raise ValueError(f"expected {ch!r}, found {got!r}")
        self.pos += 1

    def value(self) -> Any:
        self.peek()
        while True:
            try:
                obj, end = self.decoder.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError as exc:
                if self._more():
                    continue
                if not self.buf[exc.pos:].strip() or exc.msg.startswith("Unterminated"):
                    raise TruncatedJSON(exc.msg) from None
                raise ValueError(exc.msg) from None
            # A number (or literal) that ends exactly at the buffer's end may continue in the next chunk.
            if end >= len(self.buf) and not self.eof and self._more():
                continue
            self.pos = end
            return obj

    def where(self) -> int:
        return self.line + self.buf.count("\n", 0, self.pos)


def state_config(fields: dict[str, Any]) -> dict[str, Any]:
    """The run config a trainer state holds beside its log history: :data:`CONFIG_FIELDS` (``logging_steps``, the
    window of every TRL row ...) and any hyperparameter-search ``trial_params``."""
    config = {k: fields[k] for k in CONFIG_FIELDS if k in fields}
    trial = fields.get("trial_params")
    if isinstance(trial, dict):
        config.update(trial)
    return config


def sniff(path_or_uri: str) -> bool:
    """A ``trainer_state.json`` file (by name, or a ``.json`` file with ``"log_history"`` in its first 64 KiB:
    a renamed copy), or a folder holding one (directly or in a ``checkpoint-*`` folder)."""
    p = Path(path_or_uri)
    if p.is_dir():
        return (p / "trainer_state.json").is_file() or any(p.glob("checkpoint-*/trainer_state.json"))
    if not p.is_file():
        return False
    if p.name.lower() == "trainer_state.json":
        return True
    if p.suffix.lower() != ".json":
        return False
    try:
        with open(p, "rb") as fh:
            return b'"log_history"' in fh.read(65536)
    except OSError:
        return False


def _find_state_file(p: Path) -> tuple[Path, list[str]]:
    """The trainer_state.json to read for a file or folder, and the other candidates that were passed over."""
    if p.is_file():
        return p, []
    direct = p / "trainer_state.json"
    ckpts = sorted(((int(m.group(1)), d) for d in p.iterdir()
                    if d.is_dir() and (m := _CHECKPOINT.match(d.name)) and (d / "trainer_state.json").is_file()),
                   key=lambda t: t[0])
    if direct.is_file():
        return direct, [str(d / "trainer_state.json") for _, d in ckpts]
    if ckpts:
        return ckpts[-1][1] / "trainer_state.json", [str(d / "trainer_state.json") for _, d in ckpts[:-1]]
    raise SourceError(f"trainer-state: {p} holds no trainer_state.json and no checkpoint-*/trainer_state.json")


def _run_name(path: Path) -> str:
    if path.name != "trainer_state.json":
        return path.stem
    d = path.parent.resolve()
    if _CHECKPOINT.match(d.name):
        d = d.parent
    return d.name or "trainer_state"


def _is_value(v: Any) -> bool:
    return v is None or isinstance(v, (int, float, str))


class TrainerStateRun(RunReader):
    """One trainer_state.json (one run)."""

    def __init__(self, path: Path, key: str = "log_history", passed_over: list[str] | None = None) -> None:
        super().__init__()
        self.path = path
        self.key = key
        self.passed_over = passed_over or []
        self._info: RunInfo | None = None

    @property
    def has_wall_time(self) -> bool:
        return False

    @property
    def info(self) -> RunInfo:
        if self._info is None:
            fields: dict[str, Any] = {}
            n = 0
            for item in self._walk(fields, report=False):
                n += 1
            config = state_config(fields)
            extra = {k: v for k, v in fields.items() if k not in CONFIG_FIELDS and k != "trial_params"}
            extra.update(path=str(self.path), log_history_entries=n, step_source="logged")
            if self.passed_over:
                extra["other_state_files"] = list(self.passed_over)
            self._info = RunInfo(name=fields.get("trial_name") or _run_name(self.path), config=config,
                                 names="raw", extra=extra)
        return self._info

    def records(self) -> Iterator[Record]:
        where = str(self.path)
        for lineno, entry in self._walk({}, report=True):
            if not isinstance(entry, dict):
                self.skip(f"{where}:{lineno}", f"{self.key} entry is a {type(entry).__name__}, not an object; skipped")
                continue
            step = entry.get("step")
            if isinstance(step, float) and step.is_integer():
                step = int(step)
            if not isinstance(step, int) or isinstance(step, bool):
                self.skip(f"{where}:{lineno}", f"{self.key} entry has no integer 'step' ({step!r}); skipped")
                continue
            metrics: dict[str, Any] = {}
            bad: list[str] = []
            for k, v in entry.items():
                if k == "step":
                    continue
                if isinstance(v, bool):
                    v = int(v)
                if _is_value(v):
                    metrics[k] = v
                else:
                    bad.append(k)
            if bad:
                self.skip(f"{where}:{lineno}", f"step {step}: dropped non-scalar values of {', '.join(bad)}")
            yield Record(step=step, wall_time=None, metrics=metrics)

    def _walk(self, fields: dict[str, Any], report: bool) -> Iterator[tuple[int, Any]]:
        """Yield ``(line, entry)`` for each log entry; fill ``fields`` with the other top-level values."""
        where = str(self.path)
        with open(self.path, encoding="utf-8", errors="replace") as fh:
            sc = _Scanner(fh)
            found = False
            try:
                first = sc.peek()
                if first == "[":
                    found = True
                    yield from self._entries(sc)
                elif first == "{":
                    sc.pos += 1
                    while True:
                        if sc.peek() == "}":
                            break
                        key = sc.value()
                        if not isinstance(key, str):
                            raise ValueError("object key is not a string")
                        sc.expect(":")
                        if key == self.key and sc.peek() == "[":
                            found = True
                            yield from self._entries(sc)
                        else:
                            fields[key] = sc.value()
                        if sc.peek() == ",":
                            sc.pos += 1
                            continue
                        sc.expect("}")
                        break
                else:
                    raise ValueError(f"expected a JSON object or list, found {first!r}")
            except TruncatedJSON as exc:
                if report:
                    self.skip(f"{where}:{sc.where()}", f"truncated JSON ({exc}); read what came before")
            except ValueError as exc:
                if report:
                    self.skip(f"{where}:{sc.where()}", f"invalid JSON ({exc}); stopped reading")
            if not found and report:
                self.skip(where, f"no {self.key!r} list found: no points")

    def _entries(self, sc: _Scanner) -> Iterator[tuple[int, Any]]:
        sc.expect("[")
        if sc.peek() == "]":
            sc.pos += 1
            return
        while True:
            lineno = sc.where()
            yield lineno, sc.value()
            if sc.peek() == ",":
                sc.pos += 1
                continue
            sc.expect("]")
            return


class TrainerStateSource(Source):
    """A trainer_state.json file, or a training output folder (its own or its latest checkpoint's state)."""
    text_form = "a trainer_state.json (JSON)"

    kind = "trainer-state"
    option_names = ("key",)

    def runs(self) -> Iterator[RunReader]:
        p = existing_file(self.location, "trainer-state")
        path, passed_over = _find_state_file(p)
        yield TrainerStateRun(path, key=self.options.get("key") or "log_history", passed_over=passed_over)


__all__ = ["TrainerStateSource", "TrainerStateRun", "CONFIG_FIELDS", "state_config"]
