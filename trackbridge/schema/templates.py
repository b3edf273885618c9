"""Templated metric names: ``rewards/{reward_fn}/mean``, ``val-core/{data_source:path}/{var}/mean@{n}``.

``{x}`` matches one path segment (no ``/``); ``{x:path}`` matches one or more segments (may contain ``/``). Literal
text must match exactly. Matching is anchored and backtracks, so a data source with ``/`` in it is captured whole
while the fixed suffix still anchors the remaining parts. ``{x:int}`` matches digits only.

One engine for the mapping files and the derived rules: :func:`compile_template` (cached per text by
:func:`template_regex`), :func:`fill`, and for the rule loader's dependency order :func:`shape` (a template's form
without placeholder names) and :func:`may_overlap` (can two names denote one concrete name?).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property, lru_cache

from ..errors import TrackBridgeError

_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)(?::(path|int|segment))?\}")


class TemplateError(TrackBridgeError, ValueError):
    pass


@dataclass(frozen=True)
class Template:
    text: str
    pattern: str              # the anchored regular expression (compiled on first use)
    names: tuple[str, ...]
    literal_len: int          # characters of literal text: more literal = more specific
    prefix: str               # literal text before the first placeholder

    @cached_property
    def regex(self) -> re.Pattern:
        return re.compile(self.pattern, re.S)

    def __getstate__(self) -> dict:
        # the compiled registry cache stores the pattern; most templates are never matched in a short command
        return {k: v for k, v in self.__dict__.items() if k != "regex"}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)

    def match(self, key: str) -> dict[str, str] | None:
        m = self.regex.match(key)
        return m.groupdict() if m else None

    def fill(self, values: dict[str, str]) -> str:
        return _PLACEHOLDER.sub(lambda m: values[m.group(1)], self.text)


def is_template(text: str) -> bool:
    return "{" in text


def compile_template(text: str) -> Template:
    pos, parts, names = 0, [], []
    literal = 0
    prefix = None
    for m in _PLACEHOLDER.finditer(text):
        lit = text[pos:m.start()]
        if prefix is None:
            prefix = lit
        literal += len(lit)
        parts.append(re.escape(lit))
        name, kind = m.group(1), m.group(2) or "segment"
        if name in names:
            raise TemplateError(f"placeholder {{{name}}} appears twice in {text!r}")
        names.append(name)
        parts.append({"path": rf"(?P<{name}>.+?)", "int": rf"(?P<{name}>\d+)"}.get(kind, rf"(?P<{name}>[^/]+?)"))
        pos = m.end()
    tail = text[pos:]
    if "{" in _PLACEHOLDER.sub("", text) or "}" in _PLACEHOLDER.sub("", text):
        raise TemplateError(f"malformed placeholder in {text!r} (use {{name}} or {{name:path}})")
    literal += len(tail)
    parts.append(re.escape(tail))
    if not names:
        raise TemplateError(f"{text!r} has no placeholder")
    return Template(text=text, pattern="^" + "".join(parts) + r"\Z", names=tuple(names), literal_len=literal,
                    prefix=prefix or "")


def placeholder_names(text: str) -> set[str]:
    return {m.group(1) for m in _PLACEHOLDER.finditer(text)}


def strip_types(text: str) -> str:
    """``val/{data_source:path}/{var}`` -> ``val/{data_source}/{var}``: the form names are compared in."""
    return _PLACEHOLDER.sub(lambda m: "{" + m.group(1) + "}", text)


def fill(text: str, values: dict[str, str]) -> str:
    """Instantiate a templated name: ``time/{stage}`` with ``{"stage": "gen"}`` -> ``time/gen``."""
    return _PLACEHOLDER.sub(lambda m: values[m.group(1)], text) if values else text


@lru_cache(maxsize=4096)
def template_regex(text: str) -> re.Pattern:
    """The anchored regex of a name: a template's (see :func:`compile_template`), or the literal name's."""
    return compile_template(text).regex if is_template(text) else re.compile(re.escape(text) + r"\Z", re.S)


def shape(text: str) -> str:
    """A template without its placeholder names: ``val/{ds:path}/{var}`` -> ``val/{:path}/{}``."""
    return _PLACEHOLDER.sub(lambda m: "{" + (":" + m.group(2) if m.group(2) and m.group(2) != "segment" else "")
                            + "}", text)


_SAMPLE = {"path": "x0q/x1q", "int": "7"}


def sample(text: str) -> str:
    """A concrete name the template matches (placeholders filled with made-up values)."""
    return _PLACEHOLDER.sub(lambda m: _SAMPLE.get(m.group(2) or "segment", "x0q"), text)


def may_overlap(a: str, b: str) -> bool:
    """Whether two (possibly templated) names can denote the same concrete name (conservative: true when unsure)."""
    if a == b:
        return True
    if not is_template(a) and not is_template(b):
        return False
    if shape(a) == shape(b):
        return True
    ra, rb = template_regex(a), template_regex(b)
    return bool(ra.match(sample(b)) or rb.match(sample(a)) or ra.match(b) or rb.match(a))
