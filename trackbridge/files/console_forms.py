"""The printed forms of the frameworks beyond TRL, veRL and OpenRLHF, as users paste them (issue 29), read by
``console:`` beside veRL's ``step:N`` lines, printed dicts and tqdm postfixes (:mod:`~trackbridge.files.console`).

Every form keeps the names as printed; the framework mappings translate them (a printed label is a key of its own,
with its release range, like OpenRLHF's progress-bar names). Nothing here knows a framework:

* **a dict after a step** (slime's ``step 12: {'train/loss': ...}`` and ``perf 3: {'rollout/...': ...}``, a
  ``... step=3 metrics={"a": 1}`` line): the dict's items at that number (a train step or a rollout id, as the word
  before it says; the record's ``x`` is that number either way); the dict may be a Python literal or JSON.
* **labelled values on one line** (prime-rl's ``Step 28 | Time: 73.77s | Reward: 0.3887 | Throughput: 2408.9
  tokens/s``, and from 0.6 ``Step 28 |   73.8s | Reward 0.3887 | Turns 1.0``): each ``Label: number[unit]`` or
  ``Label number[unit]`` item under its label (an item without a label, or with a value such as ``12/16``, is
  left), the step from the ``Step N`` item; a unit printed after the number is dropped (the mapping says the unit).
* **bullet blocks** (NeMo-RL's ``📊 Training Results:`` then ``  • Loss: 0.1032`` lines, ``⏱️  Timing:`` then
  ``  • policy_training: 25.05s (37.6%)``): each bullet as ``SECTION/Label`` (the header's words: ``Training
  Results/Loss``, ``Timing/policy_training``); a ``Step N/M`` line (NeMo-RL prints ``===== Step 3/100 =====``) starts
  the next step's record, and the blocks until then are one record.
* **box-drawn tables** (AReaL's stats tables, ``│ ppo_actor/new_logp/avg │ -2.8348e-01 │ ...``): every ``key │ value``
  pair of cells whose key is a metric name (no spaces) and whose value is a number; one table is one record, ended by
  its bottom border or the first line that is no table row. Rows that hold no such pair (a cut-off cell, a header)
  are noise.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from .printed import LiteralError, parse_number, parse_printed_dict

# "step 12: {", "Step 3 - {", "step=3 metrics={": the step then the dict (the rest of the segment)
_STEP_DICT = re.compile(r"(?:^|(?<=[\s|\]]))(?P<word>[A-Za-z][\w-]*)[ =:]\s*(?P<step>\d+)\s*(?:[:,-]\s*)?"
                        r"(?:metrics\s*=\s*)?(?P<d>\{.*\})\s*$")
# "Label: 12.5", "Label: 12.5s", "Label: 2408.9 tokens/s", "Label: 48.9%"
_LABELLED = re.compile(r"^\s*(?P<label>[A-Za-z][\w .()/@-]*?)\s*:\s*"
                       r"(?P<num>[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|nan|inf|-inf)"
                       r"\s*(?P<unit>[A-Za-z%/.µ]*(?:/[A-Za-z]+)?)?\s*(?:\([^()]*\))?\s*$")
# prime-rl >= 0.6: "Reward 0.4123", "Turns 1.0", "Error 0.0%" (no colon); a label of words only
_BARE = re.compile(r"^\s*(?P<label>[A-Za-z][A-Za-z .()/-]*?)\s+"
                   r"(?P<num>[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|nan|inf|-inf)"
                   r"\s*(?P<unit>[A-Za-z%µ]*(?:/[A-Za-z]+)?)?\s*(?:\([^()]*\))?\s*$")
_STEP_ITEM = re.compile(r"(?:^|\s)Step\s+(?P<step>\d+)(?:\s*/\s*\d+)?\s*$")
_STEP_BANNER = re.compile(r"^[=\-#*\s]*Step\s+(?P<step>\d+)\s*(?:/\s*\d+)?[=\-#*\s]*$")
_HEADER = re.compile(r"^[^\w\s]*\s*(?P<title>[A-Z][^:•]*?)\s*:\s*$")
_BULLET = re.compile(r"^[•·▪\-*]\s+(?P<item>.+)$")
_CELL_SEP = re.compile(r"[│┃]")
_BOTTOM = ("╘", "└", "┗", "╰")
_KEY = re.compile(r"^[A-Za-z_][\w./@:-]*$")
_BORDER = re.compile(r"^[\u2500-\u257f\s]+$")           # a line of box-drawing characters only: a table's border


@dataclass
class _Block:
    metrics: dict[str, Any] = field(default_factory=dict)
    step: int | None = None
    sections: set[str] = field(default_factory=set)


class Forms:
    """A state machine fed the console's cleaned segments one at a time: :meth:`feed` answers what a segment ends
    (records, each ``(metrics, step, form)``) or ``None`` when the segment is none of these forms; :meth:`close`
    flushes what is open at the end of the file. ``skipped`` collects ``(where, why)`` for lines that look like a
    form but cannot be read."""

    def __init__(self) -> None:
        self.skipped: list[tuple[str, str]] = []
        self._section: str | None = None
        self._bullets: _Block | None = None
        self._table: _Block | None = None
        self._next_step: int | None = None

    # -- one segment ------------------------------------------------------------------------------------------------
    def feed(self, seg: str, where: str, complete: bool) -> list[tuple[dict[str, Any], int | None, str]] | None:
        out: list[tuple[dict[str, Any], int | None, str]] = []
        if _CELL_SEP.search(seg) or _BORDER.match(seg):
            return self._table_row(seg, where, out)
        out += self._end_table()
        m = _STEP_DICT.search(seg)
        if m:
            rec = self._step_dict(m, where, complete)
            return out + ([rec] if rec else [])
        banner = _STEP_BANNER.match(seg)
        if banner:
            out += self._end_bullets()
            self._next_step = int(banner.group("step"))
            return out
        header = _HEADER.match(seg)
        if header:
            title = header.group("title").strip()
            if self._bullets is not None and title in self._bullets.sections:
                out += self._end_bullets()        # the same block again: the next step's (no step banner between)
            self._section = title
            return out
        bullet = _BULLET.match(seg)
        if bullet and self._section is not None:
            item = _LABELLED.match(bullet.group("item"))
            if item is None:
                return out or None
            block = self._bullets or _Block(step=self._next_step)
            self._bullets = block
            block.sections.add(self._section)
            num = parse_number(item.group("num"))
            if num is not None:
                block.metrics[f"{self._section}/{item.group('label').strip()}"] = num
            return out
        if " | " in seg:
            rec = self._labelled_line(seg)
            if rec is not None:
                return out + [rec]
        self._section = None                  # a line of another kind ends a header's bullets, not the step's
        return out or None

    def close(self) -> list[tuple[dict[str, Any], int | None, str]]:
        return self._end_table() + self._end_bullets()

    # -- the forms --------------------------------------------------------------------------------------------------
    def _step_dict(self, m: re.Match[str], where: str, complete: bool) -> tuple[dict[str, Any], int | None, str] | None:
        if not complete:
            self.skipped.append((where, "last line has no newline (cut off while writing?); skipped"))
            return None
        text = m.group("d")
        values: dict[str, Any]
        try:
            doc = json.loads(text)
            values = doc if isinstance(doc, dict) else {}
        except ValueError:
            try:
                values = parse_printed_dict(text)[0]
            except LiteralError as exc:
                self.skipped.append((where, f"step {m.group('step')}: a printed dict that cannot be read: {exc}"))
                return None
        numeric = {k: v for k, v in values.items() if isinstance(k, str) and isinstance(v, (int, float))
                   and not isinstance(v, bool)}
        if not numeric:
            self.skipped.append((where, f"step {m.group('step')}: the dict holds no numbers"))
            return None
        return numeric, int(m.group("step")), "step-dict:logged"

    def _labelled_line(self, seg: str) -> tuple[dict[str, Any], int | None, str] | None:
        metrics: dict[str, Any] = {}
        step = None
        for part in seg.split(" | "):
            s = _STEP_ITEM.search(part)
            if s and step is None:
                step = int(s.group("step"))
                continue
            item = _LABELLED.match(part) or _BARE.match(part)
            if item is None:
                continue
            num = parse_number(item.group("num"))
            if num is not None:
                metrics[item.group("label").strip()] = num
        if len(metrics) < 2:
            return None
        return metrics, step, "labelled:" + ("logged" if step is not None else "ordinal")

    def _table_row(self, seg: str, where: str, out: list) -> list:
        if self._table is None:
            self._table = _Block(step=self._next_step)
        if seg.startswith(_BOTTOM):
            return out + self._end_table()
        cells = [c.strip() for c in _CELL_SEP.split(seg)]
        cells = [c for c in cells if c]
        for key, value in zip(cells, cells[1:]):
            if not _KEY.match(key):
                continue
            num = parse_number(value)
            if num is not None:
                self._table.metrics[key] = num
        return out

    def _end_table(self) -> list[tuple[dict[str, Any], int | None, str]]:
        t, self._table = self._table, None
        if t is None or not t.metrics:
            return []
        return [(t.metrics, t.step, "table:" + ("logged" if t.step is not None else "ordinal"))]

    def _end_bullets(self) -> list[tuple[dict[str, Any], int | None, str]]:
        b, self._bullets = self._bullets, None
        self._section = None
        if b is not None and self._next_step is not None and b.step == self._next_step:
            self._next_step = None                # a banner's step names one record
        if b is None or not b.metrics:
            return []
        return [(b.metrics, b.step, "blocks:" + ("logged" if b.step is not None else "ordinal"))]


__all__ = ["Forms"]
