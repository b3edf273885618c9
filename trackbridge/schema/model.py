"""The compiled form of the mapping files: canonical schema, framework mappings, entries."""
from __future__ import annotations

import bisect
import operator
from dataclasses import dataclass, field, replace
from typing import Any, Mapping

from .reductions import NO_DEFAULT, LevelCount, Reduce, config_equal
from .sections import Axis, LookAlike, Preset, Split, Splits
from .templates import Template
from .versions import normalize, version_key

EXACT, APPROXIMATE = "exact", "approximate"
COMPUTED = "computed"           # an entry that states its reduction (`reduce:`): fidelity is computed per translation
OPEN = float("inf")
STEP_AXIS = "progress/step"     # the canonical name of the tracker step; canonical.yaml `axes: step: metric:` names it

__all__ = ["EXACT", "APPROXIMATE", "COMPUTED", "OPEN", "STEP_AXIS", "CanonicalMetric", "CanonicalSchema", "Cond",
           "ConfigEntry", "Entry", "FrameworkMapping", "Axis", "LookAlike", "Preset", "Split", "Splits",
           "condition_value_text"]


@dataclass(frozen=True)
class CanonicalMetric:
    name: str
    description: str
    unit: str
    kind: str = "scalar"
    better: str = "none"
    estimator: str | None = None
    reduction: str | None = None
    role: str | None = None              # loss | reward | monitor: what the framework does with the value
    axis: bool = False
    template: Template | None = None
    file: str = ""
    line: int = 0
    reduce: Reduce | None = None         # the reference reduction: the quantity the name means (docs/reductions.md)


@dataclass
class CanonicalSchema:
    version: str
    metrics: dict[str, CanonicalMetric]
    templates: list[CanonicalMetric]                     # templated names, most specific first
    config: dict[str, dict[str, Any]]
    renames: list[tuple[str, dict[str, str]]]            # (version, {old: new}), oldest first
    file: str = ""
    splits: Splits = field(default_factory=Splits)
    axes: dict[str, Axis] = field(default_factory=dict)     # in declaration order
    presets: dict[str, Preset] = field(default_factory=dict)
    look_alike: list[LookAlike] = field(default_factory=list)

    @property
    def step_axis(self) -> str | None:
        axis = self.axes.get("step")
        return axis.metric if axis is not None else None

    def find(self, name: str) -> CanonicalMetric | None:
        """The canonical metric a concrete name belongs to (exact name or an instance of a template)."""
        m = self.metrics.get(name)
        if m is not None:
            return m
        if "{" in name:                      # a template name itself, with or without placeholder types
            from .templates import strip_types
            return self.metrics.get(strip_types(name))
        for t in self.templates:
            if t.template is not None and t.template.match(name) is not None:
                return t
        return None

    def upgrade(self, name: str) -> str:
        """Follow renames recorded in ``versions`` from any older schema version to the current one; a split prefix
        (``eval/kl/ref``) is kept."""
        _, base = self.splits.split_canonical(name)
        prefix = name[:len(name) - len(base)]
        for _, renames in self.renames:
            base = renames.get(base, base)
        return prefix + base

    def downgrade(self, name: str, to_version: str) -> str:
        """The name a canonical metric had at an older schema version."""
        for ver, renames in reversed(self.renames):
            if version_key(ver) <= version_key(to_version):
                break
            inverse: dict[str, str] = {}
            for old, new in renames.items():      # several old names renamed to one: the first listed is written
                inverse.setdefault(new, old)
            name = inverse.get(name, name)
        return name


_OPS = {"ne": (operator.ne, "!="), "gt": (operator.gt, ">"), "ge": (operator.ge, ">="), "lt": (operator.lt, "<"),
        "le": (operator.le, "<="), "in": (lambda have, values: have in values, " in ")}


@dataclass(frozen=True)
class Cond:
    """A ``when:`` test other than equality, written ``{KEY: {gt: 1}}`` (ops: ne, gt, ge, lt, le) or
    ``{KEY: {in: [a, b]}}`` (any of the values; ``value`` is then a tuple)."""
    op: str
    value: Any

    def test(self, have: Any) -> bool | None:
        """True/False; None when the config value cannot be compared (then the config does not say)."""
        if isinstance(have, str) and not isinstance(self.value, (str, tuple)):     # a number compared
            try:
                have = float(have)
            except ValueError:
                return None
        try:
            return bool(_OPS[self.op][0](have, self.value))
        except TypeError:
            return None

    def __str__(self) -> str:
        value = f"{{{', '.join(str(v) for v in self.value)}}}" if self.op == "in" else self.value
        return f"{_OPS[self.op][1]}{value}"


def condition_value_text(key: str, want: Any) -> str:
    """``key=value`` or ``key>value``: how a ``when`` item reads in docs and notes."""
    return f"{key}{want}" if isinstance(want, Cond) else f"{key}={want}"


@dataclass(frozen=True)
class Entry:
    framework: str
    key: str
    canonical: str
    since: float                      # index into the framework's releases (inclusive)
    until: float                      # inclusive; OPEN (infinity) when the framework still logs the key
    trainers: frozenset[str] | None
    fidelity: str                     # exact | approximate (hand-written, legacy) | computed (from `reduce`)
    differs: tuple[str, ...] = ()
    reason: str = ""
    scale: float = 1.0
    offset: float = 0.0
    when: tuple[tuple[str, Any], ...] = ()
    reverse: bool = True
    source: str = ""
    note: str = ""
    override: bool = False            # a user's entry that wins over the shipped entries it collides with
    renamed_from: tuple[str, ...] = ()   # earlier keys of the same quantity (pure renames between releases)
    key_template: Template | None = None
    canonical_template: Template | None = None
    file: str = ""
    line: int = 0
    reduce: Reduce | None = None         # how the value was reduced; None: unstated (legacy hand-written fidelity)

    @property
    def exact(self) -> bool:
        """Hand-written ``exact`` (legacy entries); an entry with ``reduce`` is judged per translation
        (:mod:`trackbridge.translate.fidelity`)."""
        return self.fidelity == EXACT

    def applies(self, trainer: str | None, lo: float, hi: float) -> bool:
        if self.until < lo or self.since > hi:
            return False
        return trainer is None or self.trainers is None or trainer in self.trainers

    def condition_holds(self, config: Mapping[str, Any] | None) -> bool | None:
        """True/False when the run config decides the ``when`` condition; None when the config does not say. One
        item the config contradicts decides it (False), whatever the config says of the others."""
        if not self.when:
            return True
        if not config:
            return None
        unknown = False
        for k, want in self.when:
            if k not in config:
                unknown = True
                continue
            if isinstance(want, Cond):
                ok = want.test(config[k])
                if ok is None:
                    unknown = True
                elif not ok:
                    return False
            elif not config_equal(config[k], want):      # trackers store config values as text at times
                return False
        return None if unknown else True

    def to_canonical(self, value: Any) -> Any:
        return _apply(value, self.scale, self.offset)

    def from_canonical(self, value: Any) -> Any:
        if self.scale == 1.0 and self.offset == 0.0:
            return value
        return _apply(value, 1.0 / self.scale, -self.offset / self.scale)


def _plain_number(value: Any) -> Any:
    """The Python number inside a numpy or torch scalar / one-element tensor (duck-typed: nothing is imported);
    any other value unchanged."""
    item, shape = getattr(value, "item", None), getattr(value, "shape", None)
    if isinstance(value, (int, float)) or not callable(item) or shape is None:
        return value
    try:
        return item() if tuple(shape) in ((), (1,)) else value
    except Exception:
        return value


def _apply(value: Any, scale: float, offset: float) -> Any:
    if scale == 1.0 and offset == 0.0:
        return value
    value = _plain_number(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        hist: Any = value
        values = getattr(value, "values", None)
        if isinstance(values, list):         # a Histogram of raw samples
            new = replace(hist, values=[v * scale + offset for v in values])
            return replace(new, min=None, max=None, sum=None, sum_squares=None) if scale < 0 or offset else new
        return value
    return value * scale + offset


@dataclass(frozen=True)
class ConfigEntry:
    key: str
    canonical: str
    trainers: frozenset[str] | None = None
    since: float = 0
    until: float = OPEN
    scale: float = 1.0
    source: str = ""
    note: str = ""
    file: str = ""
    line: int = 0
    default: Any = NO_DEFAULT        # the framework's default value when the run config lacks the key
    default_key: str | None = None   # or: the default is another config key's value (GRPO's steps_per_generation)

    @property
    def has_default(self) -> bool:
        return self.default is not NO_DEFAULT or self.default_key is not None

    def applies(self, trainer: str | None, lo: float, hi: float) -> bool:
        if self.until < lo or self.since > hi:
            return False
        return trainer is None or self.trainers is None or trainer in self.trainers


LOOKUP_CACHE = 4096            # keys whose matching entries a framework mapping remembers (FrameworkMapping.lookup)


@dataclass
class FrameworkMapping:
    name: str
    description: str
    releases: list[str]
    trainers: dict[str, dict[str, Any]]
    aliases: dict[str, dict[str, Any]]
    prefixes: list[tuple[str, str]]                    # (prefix, split), longest first (for matching)
    config: list[ConfigEntry]
    internal: set[str]
    entries: list[Entry]
    repository: str = ""
    file: str = ""
    exact_index: dict[str, list[Entry]] = field(default_factory=dict)
    template_entries: list[Entry] = field(default_factory=list)
    _lineage: dict[int, int] = field(default_factory=dict)
    declared_prefixes: list[tuple[str, str]] = field(default_factory=list)   # as declared: the first is native
    passthrough: list[tuple[str, Any]] = field(default_factory=list)   # `passthrough:` (key, Template or None)
    # each passthrough key's items: the trainers and releases that log it (trainers or None, since, until)
    passthrough_scope: dict[str, list[tuple[frozenset | None, float, float]]] = field(default_factory=dict)
    profiles: dict[str, Reduce] = field(default_factory=dict)        # `reductions:` (named reduce profiles)
    levels: dict[str, list[LevelCount]] = field(default_factory=dict)   # `levels:`: level -> counts (first applies)

    def __getstate__(self) -> dict:
        # renames are linked by object identity; a pickled copy (the compiled registry cache) links by position
        state = dict(self.__dict__)
        pos = {id(e): i for i, e in enumerate(self.entries)}
        state["_lineage"] = {pos[a]: pos[b] for a, b in self._lineage.items()}
        state.pop("_spans", None)
        state.pop("_lookups", None)
        state.pop("_unmapped", None)
        return state

    def __setstate__(self, state: dict) -> None:
        lineage = state.pop("_lineage")
        self.__dict__.update(state)
        self._lineage = {id(self.entries[a]): id(self.entries[b]) for a, b in lineage.items()}

    def link(self, old: Entry, new: Entry) -> None:
        """Declare ``new`` a pure rename of ``old`` (the same quantity under another key)."""
        a, b = self._root(id(old)), self._root(id(new))
        if a != b:
            self._lineage[a] = b

    def _root(self, x: int) -> int:
        while self._lineage.get(x, x) != x:
            x = self._lineage[x]
        return x

    def config_default(self, key: str, trainer: str | None, lo: float, hi: float,
                       config: Mapping[str, Any] | None = None, _seen: tuple[str, ...] = ()) -> tuple[bool, Any]:
        """(known, value): the framework's default of a run config key (a ``config:`` entry's ``default:``) for the
        trainer and releases lo..hi; of several, the one covering the newest release of the range. A ``default_key:``
        default is that key's value in the run ``config``, else its own default."""
        found = [c for c in self.config if c.key == key and c.has_default and c.applies(trainer, lo, hi)]
        if not found:
            return False, None
        best = max(found, key=lambda c: (min(c.until, hi), 1 if (trainer and c.trainers) else 0, c.since))
        other = best.default_key
        if other is None:
            return True, best.default
        if other in _seen:                    # a cycle of default_key (the loader refuses them): unknown
            return False, None
        if config is not None and other in config:
            return True, config[other]
        return self.config_default(other, trainer, lo, hi, config, (*_seen, key))

    def level_count(self, level: str, trainer: str | None, lo: float, hi: float) -> tuple[bool, str | None, Any]:
        """(declared, expression or None for unknown, the ``levels:`` item) of a level's count for the trainer
        and releases lo..hi: the first item of ``levels:`` that applies."""
        for item in self.levels.get(level, ()):
            if item.applies(trainer, lo, hi):
                return True, item.expr, item
        return False, None, None

    def trainer_kind(self, trainer: str | None) -> str | None:
        """The trainer's declared ``kind`` (rl, preference, sft, reward, ...): what a counterpart must share."""
        if trainer is None:
            return None
        return (self.trainers.get(trainer) or {}).get("kind")

    def trainer_of_class(self, class_name: str, callbacks: bool = True) -> str | None:
        """The trainer a Python class names (the trainers' ``classes:``). A class two trainers list (a step()-API
        class and a later callback-driven class of the same name) names the one whose ``callbacks`` (default true)
        is ``callbacks``: whether the class runs the framework's trainer callbacks."""
        found = [t for t, spec in self.trainers.items()
                 if isinstance(spec.get("classes"), list) and class_name in spec["classes"]]
        if len(found) > 1:
            found = [t for t in found
                     if (self.trainers[t].get("callbacks", True) is not False) == callbacks]
        return found[0] if found else None

    def trainer_span(self, trainer: str) -> tuple[float, float]:
        """The releases in which the trainer logs anything (from its own entries); every release when it has none."""
        span = getattr(self, "_spans", None)
        if span is None:
            span = {}
            for e in self.entries:
                for t in e.trainers or ():
                    lo, hi = span.get(t, (float("inf"), -1.0))
                    span[t] = (min(lo, e.since), max(hi, e.until))
            for t, spec in self.trainers.items():      # declared first and last releases win
                lo, hi = span.get(t, (0.0, float("inf")))
                if spec.get("since") is not None:      # a release not listed: the next listed one
                    lo = self.release_index(str(spec["since"])) + (0 if self.has_release(str(spec["since"])) else 1)
                if spec.get("until") is not None:
                    hi = self.release_index(str(spec["until"]))
                span[t] = (lo, hi)
            self._spans = span
        return span.get(trainer, (0.0, float("inf")))

    def trainer_alive(self, trainer: str, lo: float, hi: float) -> bool:
        a, b = self.trainer_span(trainer)
        return not (b < lo or a > hi)

    def same_quantity(self, a: Entry, b: Entry) -> bool:
        """True when one entry is a declared rename of the other (directly or along a chain of renames)."""
        return a is b or self._root(id(a)) == self._root(id(b))

    def index(self) -> None:
        self._lookups: dict[str, tuple[tuple[Entry, dict[str, str] | None], ...]] = {}
        self._unmapped: dict[str, tuple[tuple[frozenset | None, float, float], ...]] = {}
        self.exact_index = {}
        self.template_entries = []
        for e in self.entries:
            if e.key_template is None:
                self.exact_index.setdefault(e.key, []).append(e)
            else:
                self.template_entries.append(e)
        self.template_entries.sort(key=lambda e: -e.key_template.literal_len if e.key_template else 0)
        self._keys = [version_key(r) for r in self.releases]

    def release_index(self, version: str) -> float:
        """Position of a release in ``releases``. A release between two known ones behaves like the older (a patch
        release logs what its predecessor logged); one newer than every known release gets ``len - 0.5``, so only
        entries that are still open-ended (no ``until``) apply to it."""
        key = version_key(version)
        i = bisect.bisect_left(self._keys, key)
        if i < len(self._keys) and self._keys[i] == key:
            return float(i)
        if i >= len(self._keys):
            return len(self._keys) - 0.5
        return float(i - 1)

    def release_name(self, index: float) -> str:
        return self.releases[max(0, min(int(index), len(self.releases) - 1))]

    def has_release(self, version: str) -> bool:
        return any(normalize(r) == normalize(version) for r in self.releases)

    def lookup(self, key: str) -> list[tuple[Entry, dict[str, str] | None]]:
        """Every entry whose key matches (exact entries first, then templates, most specific first). Remembered per
        key (a bounded cache that ``index()`` empties): detection asks for the same keys once per trainer and
        release range, and each ask walks every template."""
        cache: dict[str, tuple[tuple[Entry, dict[str, str] | None], ...]] | None = self.__dict__.get("_lookups")
        if cache is None:
            cache = self._lookups = {}
        hits = cache.get(key)
        if hits is None:
            hits = tuple(self._match(key))
            if len(cache) >= LOOKUP_CACHE:
                cache.clear()
            cache[key] = hits
        return list(hits)

    def _match(self, key: str) -> list[tuple[Entry, dict[str, str] | None]]:
        out: list[tuple[Entry, dict[str, str] | None]] = [(e, None) for e in self.exact_index.get(key, ())]
        for e in self.template_entries:
            tpl = e.key_template
            if tpl is not None and key.startswith(tpl.prefix):
                caps = tpl.match(key)
                if caps is not None:
                    out.append((e, caps))
        return out

    def logs_unmapped(self, key: str) -> bool:
        """Whether ``key`` is one the framework logs without a canonical name (``passthrough:``)."""
        return bool(self.unmapped_scopes(key, first=True))

    def unmapped_scopes(self, key: str, first: bool = False) -> list[tuple[frozenset | None, float, float]]:
        """Where the ``passthrough:`` items that match ``key`` say it is logged: (trainers or None, since, until)
        each; every trainer and release for an item that states neither. Empty: no item matches. Remembered per key
        like :meth:`lookup` (detection asks for every key once per trainer, and each ask walks every item)."""
        cache: dict[str, tuple[tuple[frozenset | None, float, float], ...]] | None = self.__dict__.get("_unmapped")
        if cache is None:
            cache = self._unmapped = {}
        scopes = cache.get(key)
        if scopes is None:
            found: list[tuple[frozenset | None, float, float]] = []
            for text, tpl in self.passthrough:
                if (tpl.match(key) is not None) if tpl is not None else key == text:
                    found.extend(self.passthrough_scope.get(text, [(None, 0.0, float("inf"))]))
            if len(cache) >= LOOKUP_CACHE:
                cache.clear()
            scopes = cache[key] = tuple(found)
        return list(scopes[:1] if first else scopes)

    def split_prefix(self, key: str) -> tuple[str | None, str]:
        """(split, rest) for a key that starts with one of this framework's tracker prefixes, else (None, key)."""
        for prefix, split in self.prefixes:
            if key.startswith(prefix) and len(key) > len(prefix):
                return split, key[len(prefix):]
        return None, key

    def prefix_for(self, split: str) -> str | None:
        """The prefix written for a split: the first one declared for it (the framework's native form)."""
        for prefix, s in self.declared_prefixes:
            if s == split:
                return prefix
        return None
