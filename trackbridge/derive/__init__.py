"""Derived metrics: compute what a framework did not log from what it did, by rules declared in YAML.

``expr`` is the safe expression language, ``rules`` loads and checks ``derived.yaml`` files, ``engine`` applies them
per step. Typical use::

    rules = load_rules()                       # shipped mappings/derived.yaml (+ user files: load_rules([path]))
    d = Deriver(rules, config={"kl_coef": 0.05}, source="trl/ppo@v0.12.0", fidelity=translation.approximate)
    names = d.apply(metrics, step=17, wall_time=time.time())   # fills metrics in place, returns derived names
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping

from .engine import Deriver
from .expr import ExprError, NoValue, parse
from .rules import Rule, RuleError, RuleSet, load_rules

if TYPE_CHECKING:       # pragma: no cover
    from ..schema.loader import Registry

__all__ = ["Deriver", "ExprError", "NoValue", "Rule", "RuleError", "RuleSet", "load_rules", "parse", "make_deriver",
           "rules_for", "lint_rules", "SplitDeriver"]

_CACHE: dict[tuple[int, tuple[str, ...]], RuleSet] = {}


def rules_for(registry: Registry, extra_paths: Iterable[str] | None = None) -> RuleSet:
    """The shipped rules plus the derived-rule files among ``extra_paths``, checked against ``registry``'s names.
    Loaded once per registry and set of files."""
    from pathlib import Path
    derived = {str(Path(p).resolve()) for p in registry.derived_files}
    shipped = str((Path(registry.canonical.file).parent / "derived.yaml").resolve())
    extra = sorted(p for p in derived if p != shipped)
    key = (id(registry), tuple(extra))
    rules = _CACHE.get(key)
    if rules is None:
        canon = registry.canonical
        rules = load_rules(extra, canonical=lambda n: canon.find(n) is not None, config_names=set(canon.config),
                           upgrade=canon.upgrade)
        _CACHE[key] = rules
    return rules


from ..schema.facts import SPLIT_PREFIXES  # noqa: E402  # canonical.yaml splits: eval/, test/ (train has none)


class SplitDeriver:
    """Applies the rules to each split of a record separately (train names, ``eval/...``, ``test/...``), each split
    with its own :class:`Deriver` and so its own history for the stateful functions. Same interface as Deriver.
    ``make(split)`` builds one split's deriver. Only a split's own counters are used: rules that take a delta or
    rate of a progress axis do not run on eval/test rows (which repeat the training run's position), and a record
    of another split interrupts the training split's ``rate()`` (the wall time until the next training row includes
    the evaluation)."""

    def __init__(self, make: Callable[[str], Deriver]) -> None:
        self._make = make
        self._by_split: dict[str, Deriver] = {"": self._new("")}
        self.fidelity: dict[str, str] = {}
        self._synced: dict[str, str] = {}      # self.fidelity as last given to the splits
        self._prefixes: dict[tuple[str, ...], list[str]] = {}

    def _new(self, prefix: str) -> Deriver:
        return self._make(prefix.rstrip("/"))           # make(split): "" for train, "eval", "test"

    def _deriver(self, prefix: str) -> Deriver:
        d = self._by_split.get(prefix)
        if d is None:
            d = self._by_split[prefix] = self._new(prefix)
        return d

    def apply(self, metrics: dict[str, Any], *, step: int | None = None, wall_time: float | None = None) -> list[str]:
        """:meth:`Deriver.apply` for each split of ``metrics`` (filled in place); returns the derived names."""
        names = tuple(metrics)
        prefixes = self._prefixes.get(names)
        if prefixes is None:                # worked out once per set of names (a run logs few)
            if len(self._prefixes) >= 256:
                self._prefixes.clear()
            prefixes = self._prefixes[names] = sorted({p for k in names for p in SPLIT_PREFIXES if k.startswith(p)})
        base = self._by_split[""]
        if self.fidelity != self._synced:   # the splits judge their inputs by what is known so far
            base.fidelity.update({k: v for k, v in self.fidelity.items() if not k.startswith(SPLIT_PREFIXES)})
            for p, d in self._by_split.items():
                if p:
                    d.fidelity.update({k[len(p):]: v for k, v in self.fidelity.items() if k.startswith(p)})
            self._synced = dict(self.fidelity)
        out = base.apply(metrics, step=step, wall_time=wall_time)
        for p in prefixes:
            sub = {k[len(p):]: v for k, v in metrics.items() if k.startswith(p)}
            if p not in self._by_split:
                self._deriver(p).fidelity.update({k[len(p):]: v for k, v in self.fidelity.items()
                                                  if k.startswith(p)})
            d = self._by_split[p]
            for name in d.apply(sub, step=step, wall_time=wall_time):
                metrics[p + name] = sub[name]
                out.append(p + name)
        if prefixes:
            base.interrupt()          # the evaluation's wall time is not training throughput
        return out

    @property
    def notes(self) -> list[str]:
        """Every split's notes, prefixed with the split (``[eval] ...``)."""
        seen: list[str] = []
        for p, d in self._by_split.items():
            seen += [(f"[{p.rstrip('/')}] " if p else "") + n for n in d.notes]
        return seen

    @property
    def approximate(self) -> dict[str, str]:
        """Derived names (with their split prefix) -> why they are approximate."""
        return {p + k: v for p, d in self._by_split.items() for k, v in d.approximate.items()}

    def to_state(self) -> dict[str, Any]:
        """Every split's :meth:`Deriver.to_state`, by split prefix."""
        return {p: d.to_state() for p, d in self._by_split.items()}

    def from_state(self, state: dict[str, Any]) -> "SplitDeriver":
        """Restore what :meth:`to_state` saved."""
        for p, s in (state or {}).items():
            self._deriver(p).from_state(s)
        return self


def make_deriver(registry: Registry, extra_paths: Iterable[str] | None = None, *,
                 config: dict[str, Any] | None = None, source: str | None = None,
                 fidelity: Mapping[str, str] | None = None) -> SplitDeriver:
    """A deriver for one run: rules from ``registry`` (and user files), canonical ``config``, the run's ``source``;
    train, eval and test records are derived separately."""
    rules = rules_for(registry, extra_paths)
    axes = frozenset(n for n, m in registry.canonical.metrics.items() if m.axis)

    def make(split: str = "") -> Deriver:
        return Deriver(rules, config=config, source=source, split=split, axes=axes)

    d = SplitDeriver(make)
    d.fidelity.update(fidelity or {})
    return d


def lint_rules(registry: Registry, paths: Iterable[str] | None = None) -> int:
    """Check every derived-rule file (shipped and user) and return the number of rules. Raises :class:`RuleError`
    naming file, line and rule; :class:`~trackbridge.derive.rules.RuleErrors` (``errors``) for the structural
    (JSON Schema) problems of every file at once."""
    from ..schema.paths import mappings_dir
    from .rules import RuleErrors, read_rules_file
    errors: list[RuleError] = []
    for f in dict.fromkeys([str(mappings_dir() / "derived.yaml"), *registry.derived_files]):
        try:
            read_rules_file(f)
        except RuleError as exc:
            errors += getattr(exc, "errors", [exc])
    if errors:
        raise errors[0] if len(errors) == 1 else RuleErrors(errors)
    return len(rules_for(registry, paths))
