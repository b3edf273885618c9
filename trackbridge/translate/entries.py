"""Choosing and compiling entries: which mapping entry a key means for a trainer, release range and run config
(:func:`choose`, :func:`nearest`), the compiled :class:`Plan` of one input key, and the small helpers the
translator's parts share."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from ..schema.facts import SPLITS  # canonical.yaml splits: train (the default, no prefix), eval/, test/
from ..schema.model import Entry, FrameworkMapping


@dataclass(frozen=True)
class Plan:
    out: str                          # output key
    canonical: str                    # canonical key (with split prefix)
    fwd: Entry | None                 # source entry (None: input was canonical)
    rev: Entry | None                 # target entry (None: target is canonical)
    approx: str | None                # why the output is not the input's quantity (None: exact)
    note: str | None = None
    canon_reason: str | None = None   # why the input is not the canonical quantity (what derived values inherit)
    marks: "Marks | None" = None      # what the run's notes need from this key (None for most keys)
    # compiled in __post_init__
    to_canon: Callable[[Any], Any] | None = field(init=False, repr=False, compare=False)
    conv: Callable[[Any], Any] | None = field(init=False, repr=False, compare=False)
    primary: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # compiled once: the value conversions (None when the value passes as is) and whether the input name is
        # the framework's primary one (it keeps the output name in a clash)
        fwd = self.fwd if self.fwd is not None and (self.fwd.scale != 1.0 or self.fwd.offset != 0.0) else None
        rev = self.rev if self.rev is not None and (self.rev.scale != 1.0 or self.rev.offset != 0.0) else None
        object.__setattr__(self, "to_canon", fwd.to_canonical if fwd is not None else None)
        conv: Callable[[Any], Any] | None = None
        if fwd is not None and rev is not None:
            conv = lambda v, a=fwd.to_canonical, b=rev.from_canonical: b(a(v))   # noqa: E731
        elif fwd is not None:
            conv = fwd.to_canonical
        elif rev is not None:
            conv = rev.from_canonical
        object.__setattr__(self, "conv", conv)
        object.__setattr__(self, "primary", self.fwd is None or self.fwd.reverse)


@dataclass(frozen=True)
class Marks:
    """What a key contributes to the run's notes, each said once for the whole run (not once per key)."""

    outside: bool = False                              # translated with the nearest release's or trainer's entry
    no_target_name: bool = False                       # the target has no name: the canonical name kept
    defaults: tuple[tuple[str, str, Any], ...] = ()    # (framework, config key, value): defaults its fidelity read
    unset: tuple[str, ...] = ()                        # config keys the run config lacks that would change its meaning


Hit = tuple[Entry, "dict[str, str] | None"]     # an entry and the placeholder values its template matched
NOT_PLANNED: Any = object()       # a key not planned yet (None: planned, no translation)


def split_canonical(key: str) -> tuple[str | None, str]:
    return SPLITS.split_canonical(key)


def owner(metrics: Mapping[str, Any], plans: Mapping[str, Plan | None], out: str, before: str,
           conflicts: Mapping[str, str]) -> tuple[str, Any, bool]:
    """The input key (and its value, and whether its entry is primary) that holds ``out`` when ``before`` clashes
    with it: looked up only on a clash, which is rare, so the loop keeps no per-key record of it."""
    found = None
    for k, v in metrics.items():
        if k == before:
            break
        p = plans.get(k)
        if p is not None and p is not NOT_PLANNED and p.out == out and k not in conflicts:
            found = (k, v, p.primary)      # the first that is not displaced holds it (a same-valued later one
            break                          # was folded into it)
    if found is None:
        raise KeyError(out)
    return found


def same_value(a: Any, b: Any) -> bool:
    try:
        return bool(a == b or (a != a and b != b))      # NaN == NaN here
    except Exception:                          # arrays and other values without a plain truth value
        return False


def reason_of(e: Entry | None) -> str | None:
    if e is None or e.exact:
        return None
    tag = f" [{', '.join(e.differs)}]" if e.differs else ""
    return f"{e.framework} {e.key!r}: {e.reason}{tag}"


def until_name(fw: FrameworkMapping, e: Entry) -> str:
    return "now" if e.until == float("inf") else fw.release_name(int(e.until))


def choose(hits: list[Hit], trainer: str | None, lo: float, hi: float, config: Mapping[str, Any] | None
           ) -> Hit | None:
    """The entry that best fits trainer, release range and config; the newest one when several fit. Literal keys
    win over templates: a template is only used when no literal entry fits."""
    literal = [h for h in hits if h[0].key_template is None]
    if literal and len(literal) < len(hits):
        found = choose(literal, trainer, lo, hi, config)
        if found is not None:
            return found
        hits = [h for h in hits if h[0].key_template is not None]
    best, best_rank = None, None
    for e, caps in hits:
        if not e.applies(trainer, lo, hi):
            continue
        cond = e.condition_holds(config)
        if cond is False:
            continue
        # prefer: config condition confirmed > unconditional > condition unknown; of two confirmed, the one that
        # tests more settings (OpenRLHF's kl with use_loss and estimator k3 over estimator k3 alone);
        # trainer-specific over generic; covering the newest release of the range; more specific template
        rank = (2 if (cond is True and e.when) else 1 if not e.when else 0,
                len(e.when) if (cond is True and e.when) else 0,
                1 if (trainer and e.trainers) else 0,
                min(e.until, hi), e.since,
                e.key_template.literal_len if e.key_template else 10 ** 6)
        if best_rank is None or rank > best_rank:
            best, best_rank = (e, caps), rank
    return best


def nearest(hits: list[Hit], trainer: str | None, lo: float, hi: float, config: Mapping[str, Any] | None
            ) -> Hit | None:
    """The entry whose releases lie nearest to lo..hi (for a key the mappings place outside that range)."""
    best, best_rank = None, None
    for e, caps in hits:
        if not e.applies(trainer, 0, float("inf")) or e.condition_holds(config) is False:
            continue
        distance = max(0.0, e.since - hi, lo - e.until)
        rank = (-distance, 1 if (trainer and e.trainers) else 0, min(e.until, hi))
        if best_rank is None or rank > best_rank:
            best, best_rank = (e, caps), rank
    return best


def flatten_config(config: Mapping[str, Any] | None, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1, "a": {...}}``: nested keys are reachable as dotted paths."""
    out: dict[str, Any] = {}
    if not config:
        return out
    for k, v in config.items():
        name = f"{prefix}{k}"
        out[name] = v
        if isinstance(v, Mapping):
            out.update(flatten_config(v, name + "."))
    return out
