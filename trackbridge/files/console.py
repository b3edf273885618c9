"""``console:PATH``: metrics printed to a console log, read back into records.

These printed forms are recognised, anywhere in a line (after ANSI colours, Ray's ``(TaskRunner pid=N)`` prefix and
tqdm's carriage-return progress updates are removed):

* veRL's console logger: ``step:N - key:value - key:value ...``, one line per step. veRL <= ~0.3 prints values as
  ``f"{v:.3f}"``, later releases as ``pprint.pformat(v)`` (full precision, ``nan``, ``inf``, ``np.float64(0.5)``);
  only numbers are printed. A line that ends in a name with no value (cut off by a paste or a terminal) keeps
  the items before it, and says so; a value that is not a number skips the line. Keys may contain ``/``, ``@``,
  ``-`` and ``:`` (the value is after the *last* colon). A step line broken over several lines (a terminal's hard
  wrap at its width, a paste or a page store cutting it into pieces, anywhere: inside a key, a number or at a
  separator) is joined back when the next line is no line of its own (no Ray prefix, step line, dict or progress
  bar) and the joined text reads as more ``key:number`` items than the line alone, every item before the last one
  whole; :attr:`RunInfo.extra` ``joined_lines`` names the lines joined.
* a printed transformers/TRL log dict on its own: ``{'loss': 0.1, 'grad_norm': 2.3, 'epoch': 0.5}``. Evaluated with
  ``ast`` (never ``eval``); ``np.float64(...)``/``tensor(...)`` wrappers, ``nan``/``inf`` and numbers printed as
  strings (transformers >= 4.5x prints floats as ``'0.1234'``, i.e. rounded to 4 significant digits) are accepted.
* a dict printed over several lines (veRL's run config, ``pprint`` behind Ray's prefix at start): the run's config
  (:attr:`RunInfo.config`, ``extra["config_source"]`` says where), so translation judges fidelity with the run's own
  settings; one that a metrics line interrupts is reported and skipped. A progress bar glued after a printed dict
  (a ``\r`` lost in a copy) is left off the dict.
* a tqdm progress bar with a postfix, as OpenRLHF's trainers print them (``pbar.set_postfix(...)``):
  ``Train epoch [1/1]:  50%|#####     | 2/4 [00:10<00:10, 5.0s/it, act_loss=0.0123, reward=0.5, kl=0.001]``. Each
  ``key=value`` of the postfix becomes a metric under its printed key (``pg``, ``rm``, ``glen``, ``act_loss`` ...: the
  framework mappings translate them); tqdm prints numbers with 3 significant digits, and the bar shows the value of
  one micro-batch, not the step's mean (:attr:`RunInfo.extra` ``progress_bar`` says so). A postfix repeated
  unchanged by tqdm's refreshes is one record; steps are in log order.

* the forms of the frameworks beyond those three (slime's ``step N: {...}``, prime-rl's ``Step N | Label: value``
  lines, NeMo-RL's bullet blocks, AReaL's box-drawn stats tables): :mod:`~trackbridge.files.console_forms`.

Steps come from ``step:N``; else (progress bars: always) from a ``step``/``global_step`` key of the dict (or the key
named by the
``?step=KEY`` option); else from log order (1, 2, 3, ...), and :attr:`RunInfo.extra` says ``step_source: ordinal``.
A console log holds no wall times, so none are given. Lines that are not metrics are skipped and summarised in one
problem; lines that look like metrics but cannot be read (truncated, malformed) are each reported with their line.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Generator, Iterator

from ..record import Record, RunInfo
from ..tracking.source import RunReader, Source, SourceError
from ..tracking.textfiles import LineSummary, existing_file, iter_lines
from .console_forms import Forms
from .printed import ANSI, Braces, LiteralError, parse_number, parse_printed_config, parse_printed_dict

# "step:12 - a:1 - b:2" at the start of a segment or after a space/bracket (Ray and logging prefixes).
_STEP_LINE = re.compile(r"(?:^|(?<=[\s\])]))step:(?P<step>-?\d+)(?P<rest>(?: - .*)?)$")
# what a paste leaves: a markdown quote ("> > > "), colour codes whose escape byte was lost ("[36m", "\ufffd[0m")
_PASTED = re.compile(r"^(?:>\s?)+|(?:\ufffd)?\[[0-9;]{1,8}m")
_RAY_PREFIX = re.compile(r"^\((?:[\w.]+) pid=\d+(?:, ip=[\d.]+)?\)\s*")
# tqdm: "desc: 50%|bar| 2/4 [00:10<00:10, 5.0s/it, k=v, k=v]" (the n/total and [elapsed<remaining, rate...] part)
_TQDM = re.compile(r"\|\s*(?P<n>\d+)(?:/(?P<total>\d+))?\s*\[(?P<inside>[^\[\]]*)\]\s*$")
_LOG_EXTS = (".log", ".txt", ".out", ".err")
_BAR_AFTER = re.compile(r"\s*\d{1,3}%\|")      # "{...} 12%|█▏   | 30/250 [...]": tqdm's bar glued to a dict
_MAX_DICT_LINES = 5000         # a dict printed over more lines than this is not gathered further


def sniff(path_or_uri: str) -> bool:
    """A file named like a log: ``.log``, ``.txt``, ``.out``, ``.err``."""
    p = Path(path_or_uri)
    return p.is_file() and p.suffix.lower() in _LOG_EXTS


class ConsoleRun(RunReader):
    """One console log file."""

    def __init__(self, path: Path, step_key: str | None = None) -> None:
        super().__init__()
        self.path = path
        self.step_key = step_key
        self._info: RunInfo | None = None

    @property
    def has_wall_time(self) -> bool:
        return False

    @property
    def info(self) -> RunInfo:
        if self._info is None:
            self._info = RunInfo(name=self.path.stem, names="raw", extra={"path": str(self.path), "format": None,
                                                              "step_source": None})
            # A cheap look at the first metric line tells the format and where steps come from.
            scan = self._scan(report=False)
            try:
                for rec, kind in scan:
                    self._note(kind, rec)
                    break
            finally:
                scan.close()
        return self._info

    def _note(self, kind: str, rec: Record | None) -> None:
        extra = self.info.extra if self._info is not None else {}
        fmts = extra.get("format")
        if fmts is None:
            extra["format"] = kind.split(":")[0]
        elif kind.split(":")[0] not in fmts.split("+"):
            extra["format"] = fmts + "+" + kind.split(":")[0]
        if extra.get("step_source") is None:
            extra["step_source"] = kind.split(":")[1]

    def records(self) -> Iterator[Record]:
        self.info  # noqa: B018 - make sure the header facts exist before reading
        for rec, kind in self._scan(report=True):
            self._note(kind, rec)
            yield rec

    # -- parsing ---------------------------------------------------------------------------------------------------
    def _scan(self, report: bool) -> Generator[tuple[Record, str], None, None]:
        scan = _Scan(self, report)
        for lineno, text, complete, last in _joined_step_lines(iter_lines(self.path)):
            yield from scan.line(lineno, text, complete, last)
        yield from scan.finish()

    def _printed_config(self, text: str, where: str, report: bool) -> None:
        """A dict printed over several lines: veRL prints its run config so at start (``pprint`` of the Hydra
        config, each line behind Ray's prefix). A dict of nested values is the run's config (the first one wins);
        anything else is reported."""
        try:
            value = parse_printed_config(text)
        except LiteralError as exc:
            if report:
                self.skip(where, f"a dict printed over several lines cannot be read: {exc}")
            return
        if any(isinstance(v, (dict, list)) for v in value.values()):
            if self._info is not None and not self._info.config:
                self._info.config = value
                self._info.extra["config_source"] = f"printed at {where}"
        elif report:
            self.skip(where, "a dict printed over several lines holds no nested values (not a run config); skipped")

    @staticmethod
    def _postfix(inside: str) -> dict[str, Any]:
        """The numeric ``key=value`` items of a tqdm bar's bracket (after elapsed<remaining and the rate)."""
        out: dict[str, Any] = {}
        for item in inside.split(", "):
            key, sep, value = item.partition("=")
            key = key.strip()
            if not sep or not key:
                continue
            num = parse_number(value)
            if num is not None:
                out[key] = num
        return out

    def _step_line(self, m: re.Match[str], where: str, report: bool, complete: bool) -> Record | None:
        rest = m.group("rest")
        if not rest:
            if report:
                self.skip(where, "a 'step:N' line with no metrics")
            return None
        if not complete:
            if report:
                self.skip(where, "last line has no newline (cut off while writing?); skipped to avoid a partial point")
            return None
        metrics: dict[str, Any] = {}
        items = rest[3:].split(" - ")
        for i, item in enumerate(items):
            last = i == len(items) - 1
            if last and item.endswith(" -"):
                item = item[:-2]                # the next separator printed, the next item cut off
            key, sep, value = item.rpartition(":")
            num = parse_number(value) if sep else None
            if not key or num is None:
                if last and metrics and _cut_name(item):
                    # a key with no value: the line's end cut off (a paste, a terminal's width); the items before
                    # it are whole
                    if report:
                        self.skip(where, f"step {m.group('step')}: the line ends in {item[:80]!r}, a name with no "
                                         f"value (cut off?); the {len(metrics)} items before it kept")
                    break
                if report:
                    self.skip(where, f"step {m.group('step')}: cannot read {item[:80]!r} as key:number; line skipped")
                return None
            metrics[key] = num
        return Record(step=int(m.group("step")), wall_time=None, metrics=metrics)

    def _dict_line(self, seg: str, where: str, report: bool, complete: bool
                   ) -> tuple[dict[str, Any], int | None, bool] | None:
        if not complete:
            if report:
                self.skip(where, "last line has no newline (cut off while writing?); skipped to avoid a partial point")
            return None
        try:
            values, dropped, as_strings = parse_printed_dict(seg)
        except LiteralError as exc:
            if report:
                self.skip(where, f"looks like a printed dict but cannot be read: {exc}")
            return None
        numeric = {k: v for k, v in values.items() if isinstance(v, (int, float))}
        if not numeric:
            if report:
                self.skip(where, "printed dict holds no numbers; skipped")
            return None
        if dropped and report:
            self.skip(where, f"dropped non-scalar values of {', '.join(dropped)}")
        step = None
        keys = [self.step_key] if self.step_key else ["step", "global_step"]
        for key in keys:
            v = values.get(key)
            if isinstance(v, (int, float)) and not isinstance(v, bool) and float(v).is_integer():
                step = int(v)
                if not self.step_key:
                    del values[key]
                break
        return values, step, as_strings


def _step_items(text: str) -> tuple[int, bool] | None:
    """For a line holding a ``step:N - ...`` line: how many of its items read as ``key:number``, and whether every
    item before the last one does (the last one may be cut off); None for any other line."""
    seg = _RAY_PREFIX.sub("", _PASTED.sub("", ANSI.sub("", text).split("\r")[-1].strip()))
    m = _STEP_LINE.search(seg)
    if m is None or not m.group("rest"):
        return None
    items = m.group("rest")[3:].split(" - ")
    whole = 0
    for i, item in enumerate(items):
        last = i == len(items) - 1
        if last and item.endswith(" -"):
            item = item[:-2]
        key, sep, value = item.rpartition(":")
        if key and sep and parse_number(value) is not None:
            whole += 1
        elif not (last and whole and _cut_name(item)):
            return whole, False
    return whole, True


def _cut_name(item: str) -> bool:
    """The last item of a step line cut off after its name: ``response_length/cl`` or ``timing_s/gen:`` (no
    value after the colon)."""
    key, sep, value = item.rpartition(":")
    return not sep or (bool(key) and not value.strip())


def _own_line(text: str) -> bool:
    """A line that is a line of its own, not the rest of a wrapped step line: Ray's prefix, a step line, a dict, a
    progress bar, a carriage return, or nothing."""
    seg = ANSI.sub("", text)
    if "\r" in seg or not seg.strip():
        return True
    seg = _PASTED.sub("", seg)
    return bool(_RAY_PREFIX.match(seg.lstrip()) or _STEP_LINE.search(seg.strip()) or seg.lstrip().startswith("{")
                or _TQDM.search(seg.strip()))


def _joined_step_lines(lines: Iterator[tuple[int, str, bool]]) -> Iterator[tuple[int, str, bool, int]]:
    """``(first line number, text, complete, last line number)`` for each line of ``lines``, a step line and the
    lines that continue it joined into one (their text concatenated as it is: a wrap may fall inside a key or a
    number). A next line continues the step line when it is no line of its own (:func:`_own_line`) and the joined
    text reads as more whole items than the step line alone, every item before the last one whole; a last line
    without a newline (cut off while the log was written) is not joined: the step line is read without it."""
    pending: tuple[int, str, bool, int] | None = None
    pending_items: tuple[int, bool] | None = None
    for lineno, text, complete in lines:
        if pending is not None and pending_items is not None:
            if pending[2] and complete and not _own_line(text):
                joined = pending[1] + text
                items = _step_items(joined)
                if items is not None and items[1] and items[0] > pending_items[0]:
                    pending, pending_items = (pending[0], joined, complete, lineno), items
                    continue
            yield pending
            pending = pending_items = None
        items = _step_items(text) if "step:" in text else None
        if items is not None and items[1]:
            pending, pending_items = (lineno, text, complete, lineno), items
            continue
        yield lineno, text, complete, lineno
    if pending is not None:
        yield pending


class ConsoleSource(Source):
    """A console log file, or a folder of them (``*.log``, ``*.txt``, ``*.out``, ``*.err``; one run per file)."""
    text_form = "a console log (text)"

    kind = "console"
    option_names = ("step",)

    def runs(self) -> Iterator[RunReader]:
        p = existing_file(self.location, "console")
        step_key = self.options.get("step") or None
        if p.is_dir():
            files = sorted(f for f in p.iterdir() if f.is_file() and f.suffix.lower() in _LOG_EXTS)
            if not files:
                raise SourceError(f"console: folder {p} holds no {'/'.join(_LOG_EXTS)} files")
            for f in files:
                yield ConsoleRun(f, step_key)
        else:
            yield ConsoleRun(p, step_key)


class _Scan:
    """One pass over a console log's lines (:meth:`ConsoleRunReader._scan`): what reading a line leaves for the next
    (the ordinal step, the last progress bar, a dict being gathered over several lines, the forms' state, the lines
    without metrics)."""

    def __init__(self, reader: Any, report: bool) -> None:
        self.r = reader
        self.report = report
        self.where = str(reader.path)
        self.noise = LineSummary()
        self.ordinal = 0
        self.rounded = False
        self.last_bar: dict[str, Any] | None = None
        self.forms = Forms()
        self.gathering: list[str] | None = None     # the lines of a dict printed over several lines (a run config)
        self.gathered_at = ""
        self.braces = Braces()                       # where that dict closes, scanned once line by line
        self.joined: list[str] = []
        self.found = False

    def form_records(self, found: list[tuple[dict[str, Any], int | None, str]]) -> Iterator[tuple[Record, str]]:
        for metrics, step, kind in found:
            if step is None:
                self.ordinal += 1
                step = self.ordinal
            yield Record(step=step, wall_time=None, metrics=metrics), kind

    def line(self, lineno: int, text: str, complete: bool, last: int) -> Iterator[tuple[Record, str]]:
        """The records of one line (``last``: the last line of a step line broken over several, joined)."""
        if last != lineno:
            self.joined.append(f"{lineno}-{last}")
        self.found = False
        segments = ANSI.sub("", text).split("\r")
        for i, seg in enumerate(segments):
            seg = _RAY_PREFIX.sub("", _PASTED.sub("", seg.strip()))
            if seg:
                yield from self.segment(seg, lineno, complete, i == len(segments) - 1)
        if not self.found:
            self.noise.add(lineno)

    def segment(self, seg: str, lineno: int, complete: bool, last_segment: bool) -> Iterator[tuple[Record, str]]:
        """The records of one segment of a line (a line holds several where a progress bar redraws with ``\\r``)."""
        r = self.r
        bar = _TQDM.search(seg)
        values = r._postfix(bar.group("inside")) if bar and not seg.startswith("{") else None
        if values and not _STEP_LINE.search(seg):
            self.found = True        # a bar without a postfix holds no metrics (and stays noise)
            if not complete and last_segment:
                return          # a bar cut off while writing: its postfix may be partial
            if values != self.last_bar:
                self.last_bar = values
                self.ordinal += 1
                if r._info is not None:
                    r._info.extra["progress_bar"] = (
                        "progress-bar postfix values: one micro-batch each (not the step's mean), "
                        "printed by tqdm with 3 significant digits; steps are in log order")
                yield Record(step=self.ordinal, wall_time=None, metrics=dict(values)), "tqdm:ordinal"
            return
        if self.gathering is not None:
            if seg.startswith("{") or _STEP_LINE.search(seg) or _TQDM.search(seg):
                # a line of its own form: the dict gathered so far ended unclosed (cut off)
                if self.report:
                    r.skip(self.gathered_at, "a dict opened here cannot be read: it is not closed "
                                             "before the next metrics line (cut off?); skipped")
                self.gathering = None
            else:
                self.found = True
                self.gathering.append(seg)
                if self.braces.feed(" " + seg) is not None or len(self.gathering) > _MAX_DICT_LINES:
                    r._printed_config(" ".join(self.gathering), self.gathered_at, self.report)
                    self.gathering = None
                return
        m = _STEP_LINE.search(seg)
        if m:
            self.found = True
            rec = r._step_line(m, f"{self.where}:{lineno}", self.report, complete)
            if rec is not None:
                yield rec, "verl:logged"
            return
        if seg.startswith("{"):
            self.found = True
            self.braces = Braces()
            end = self.braces.feed(seg)
            if end is None and complete:           # opened here, closed on a later line: gather it
                self.gathering, self.gathered_at = [seg], f"{self.where}:{lineno}"
                return
            if end is not None and _BAR_AFTER.match(seg[end:]):
                seg = seg[:end]                  # a progress bar right after the dict (a \r not kept)
            got = r._dict_line(seg, f"{self.where}:{lineno}", self.report, complete)
            if got is None:
                return
            metrics, step, as_strings = got
            self.rounded = self.rounded or as_strings
            if step is None:
                self.ordinal += 1
                yield Record(step=self.ordinal, wall_time=None, metrics=metrics), "dict:ordinal"
            else:
                yield Record(step=step, wall_time=None, metrics=metrics), "dict:logged"
            return
        got_forms = self.forms.feed(seg, f"{self.where}:{lineno}", complete)
        if got_forms is not None:
            self.found = True
            yield from self.form_records(got_forms)

    def finish(self) -> Iterator[tuple[Record, str]]:
        """What the last line leaves: a dict still gathered, the forms' last records, what was skipped and why."""
        r = self.r
        if self.gathering is not None:
            r._printed_config(" ".join(self.gathering), self.gathered_at, self.report)
        if self.joined and r._info is not None:
            joined = self.joined
            r._info.extra["joined_lines"] = (f"step lines broken over several lines (a terminal's wrap, a paste) "
                                             f"joined: lines {', '.join(joined[:5])}"
                                             + (f" and {len(joined) - 5} more" if len(joined) > 5 else ""))
        yield from self.form_records(self.forms.close())
        if self.report:
            for at, why in self.forms.skipped:
                r.skip(at, why)
            if self.noise.count:
                r.skip(self.where, self.noise.text("lines without metrics"))
            if self.rounded and r._info is not None:
                r._info.extra["rounded"] = ("printed dicts held numbers as strings (transformers prints floats "
                                            "with 4 significant digits): values are rounded")
