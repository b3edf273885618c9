"""Which names a derived rule may read: membership in the canonical schema (exact names and templated ones), the
shipped ``canonical.yaml``'s names, and older names (``versions:`` renames) read as today's, with a warning at the
rules file's line."""
from __future__ import annotations

import warnings
from typing import Callable, Iterable

from ..schema.paths import mappings_dir
from ..schema.templates import is_template, shape, template_regex
from ..schema.yamlfile import load_yaml

__all__ = ["CanonicalNames", "shipped_document", "shipped_canonical", "shipped_upgrade", "current_names"]


class CanonicalNames:
    """Membership test for canonical metric names: exact names, and concrete names or templates of templated ones."""

    def __init__(self, names: Iterable[str] | Callable[[str], bool]):
        self._fn: Callable[[str], bool] | None = None
        if callable(names) and not isinstance(names, (set, frozenset, list, tuple, dict)):
            self._fn = names
            return
        names = list(names)
        self.exact = {n for n in names if not is_template(n)}
        self.shapes = {shape(n) for n in names if is_template(n)}
        self.regexes = [template_regex(n) for n in names if is_template(n)]

    def __contains__(self, name: str) -> bool:
        if self._fn is not None:
            return bool(self._fn(name))
        if not is_template(name):
            return name in self.exact or any(r.match(name) for r in self.regexes)
        return shape(name) in self.shapes


def shipped_document() -> dict:
    """The shipped ``canonical.yaml``, read with the mapping files' loader."""
    return load_yaml(mappings_dir() / "canonical.yaml") or {}


def shipped_canonical(doc: dict | None = None) -> tuple[set[str], set[str]]:
    """(metric names, config names) of the shipped ``canonical.yaml`` (``doc``: the file, already read), read with
    the mapping files' loader."""
    data = shipped_document() if doc is None else doc
    return set((data.get("metrics") or {}).keys()), set((data.get("config") or {}).keys())


def shipped_upgrade(doc: dict | None = None) -> Callable[[str], str]:
    """Old canonical name -> current one, by the ``versions:`` renames of the shipped ``canonical.yaml`` (``doc``:
    the file, already read), parsed as the registry parses them."""
    from ..schema.canonical import load_canonical
    schema = load_canonical([(str(mappings_dir() / "canonical.yaml"), shipped_document() if doc is None else doc)], [])
    return schema.upgrade if schema is not None else (lambda name: name)


def current_names(canonical: CanonicalNames, upgrade: Callable[[str], str] | None, file: str,
                   line: int | None, rule: str) -> Callable[[str], str]:
    """A name as the rule should read it: an older schema version's name (``versions:`` renames of
    canonical.yaml) becomes the current one, with a :class:`FutureWarning` issued at the rules file's line, naming
    both names, so a rules file written for an older canonical version keeps working and says what to change."""
    def current(name: str) -> str:
        if upgrade is None or name in canonical:
            return name
        new = upgrade(name)
        if new != name and new in canonical:
            warnings.warn_explicit(f"rule {rule!r}: {name!r} is an older canonical name of {new!r} (canonical.yaml "
                                   f"versions:); read as {new!r}, rename it in the file", FutureWarning,
                                   filename=file, lineno=line or 0)
            return new
        return name
    return current
