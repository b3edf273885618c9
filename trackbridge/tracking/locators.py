"""Run locators: ``KIND:LOCATION[?option=value&...]`` and ``LABEL=LOCATOR``, parsed in one place.

Examples::

    jsonl:runs
    tensorboard:runs/tb
    mlflow:sqlite:///runs/mlflow.db?experiment=grpo
    mlflow:http://127.0.0.1:5000?experiment=grpo&run=abc123
    wandb:runs?mode=online&project=grpo
    trackio:runs/trackio?project=grpo
    trainer-state:out/trainer_state.json
    console:verl.log
    csv:export.csv
    grpo=trainer-state:grpo/trainer_state.json     (labelled, where a command takes several runs)

The kinds themselves are registered in :mod:`trackbridge.trackers`; callers pass the kinds they accept.

The option string is split off at the *last* ``?`` whose tail looks like ``key=value`` pairs, so locations that
contain ``?`` themselves stay intact unless they end in such a tail.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from urllib.parse import parse_qsl

from ..errors import TrackBridgeError

_LABEL = re.compile(r"^([A-Za-z0-9_][A-Za-z0-9_.\-]*)=(.+)$")
_OPTS = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-]*=[^&]*(&[A-Za-z_][A-Za-z0-9_\-]*=[^&]*)*$")


class LocatorError(TrackBridgeError, ValueError):
    """A locator string that cannot be understood; the message names it and says why."""


@dataclass(frozen=True)
class Locator:
    """A parsed locator: ``KIND:LOCATION?options`` and, where a command takes several runs, its label."""

    kind: str
    location: str
    options: dict[str, str] = field(default_factory=dict)
    label: str | None = None

    def __str__(self) -> str:
        text = f"{self.kind}:{self.location}"
        if self.options:
            text += "?" + "&".join(f"{k}={v}" for k, v in self.options.items())
        return f"{self.label}={text}" if self.label else text

    def option(self, name: str, default: str | None = None) -> str | None:
        """The value of ``?name=...`` (``default`` when not given)."""
        return self.options.get(name, default)


def is_locator(text: str) -> bool:
    """Whether ``text`` names its kind (``KIND:LOCATION``) rather than being a plain path."""
    return ":" in text.split("/", 1)[0] and not text.startswith(("/", "."))


def split_label(text: str) -> tuple[str | None, str]:
    """``(LABEL, rest)`` of ``LABEL=rest``; ``(None, text)`` when there is no label."""
    m = _LABEL.match(text)
    if m and ":" not in m.group(1):
        return m.group(1), m.group(2)
    return None, text


def parse(text: str, *, allow_label: bool = False, kinds: tuple[str, ...] | None = None) -> Locator:
    """Parse one locator. ``allow_label`` accepts ``LABEL=KIND:LOCATION``; ``kinds``: the kinds accepted (None: any
    well-formed kind, checked later by whoever looks it up in the registry)."""
    expected = f", KIND one of {', '.join(kinds)}" if kinds else ""
    if not isinstance(text, str) or not text.strip():
        raise LocatorError(f"empty locator {text!r}: expected KIND:LOCATION{expected}")
    label, raw = split_label(text.strip())
    if label is not None and not allow_label:
        raise LocatorError(f"{text.strip()!r}: a label (LABEL=LOCATOR) is not accepted here")
    kind, sep, rest = raw.partition(":")
    if not sep:
        raise LocatorError(f"{text!r}: missing ':' (expected KIND:LOCATION{expected})")
    kind = kind.strip().lower().replace("_", "-")
    if kinds is not None and kind not in kinds:
        hint = ""
        close = [k for k in kinds if k.startswith(kind[:2])]
        if close:
            hint = f" (did you mean {close[0]!r}?)"
        raise LocatorError(f"{text!r}: unknown kind {kind!r}{hint}; expected one of {', '.join(kinds)}")
    options: dict[str, str] = {}
    if "?" in rest:
        head, _, tail = rest.rpartition("?")
        if _OPTS.match(tail):
            rest = head
            options = dict(parse_qsl(tail, keep_blank_values=True))
    if not rest:
        raise LocatorError(f"{text!r}: empty location after '{kind}:'")
    return Locator(kind=kind, location=rest, options=options, label=label)


def parse_many(texts: list[str], *, kinds: tuple[str, ...] | None = None) -> list[Locator]:
    """Parse several labelled-or-not locators; labels default to the location's base name and must be unique."""
    out: list[Locator] = []
    seen: set[str] = set()
    for t in texts:
        loc = parse(t, allow_label=True, kinds=kinds)
        label = loc.label or _default_label(loc)
        base, n = label, 2
        while label in seen:
            label, n = f"{base}-{n}", n + 1
        seen.add(label)
        out.append(Locator(loc.kind, loc.location, dict(loc.options), label))
    return out


def _default_label(loc: Locator) -> str:
    loc_text = loc.location.rstrip("/")
    base = loc_text.rsplit("/", 1)[-1] or loc.kind
    return base
