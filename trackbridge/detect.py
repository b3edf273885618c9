"""Auto-detection: which framework, trainer and release range best explain a set of logged keys.

For every framework and trainer, each key votes for the releases in which some entry of that trainer logs it.
The releases with the most votes form the detected range (the newest contiguous block of them); the trainer whose
best count is highest wins, with trainer-specific keys breaking ties. Confidence combines the share of keys explained
with the margin over the runner-up framework.

**Evidence, not dilution** (:class:`Evidence`). Across frameworks a key counts 1/k when k frameworks log it (half
that through a template only), and a run-config key that is one of a framework's ``config:`` keys counts for it
likewise; equal evidence goes to the framework with the longer release history, and the tie is said. The keys no
framework logs (custom reward functions, a fork's or a subclass's own metrics) are evidence of nothing and, once the
best framework names :data:`MIN_STRONG` keys literally that no other framework logs, lower nothing: the share
explained is then of the keys some framework logs.

**"I don't know."** Logs of frameworks trackbridge has no mapping for share a few generic names with the known ones
(``loss``, ``grad_norm``, ``lr`` under a ``train/`` prefix): a NeMo-RL GRPO record fits OpenRLHF DPO by 3 of 6 keys, a
slime record OpenRLHF PPO by 3 of 9, and neither has a key only that framework names. Without :data:`MIN_STRONG`
such keys the share is of every key; below :data:`MIN_EXPLAINED` of it, or below :data:`MIN_CONFIDENCE`, detection
answers ``unknown`` and names the nearest guesses; translation then passes names through unchanged and says so.
Summary keys of a histogram a tracker could not hold (MLflow's ``X/count``, ``X/mean`` ...) count as the one value
they are. Calibrated on the corpus of real public logs (tests/data/real, 2026-12-02: every log recognised at
confidence 0.81 or more, TRL GRPO pastes of 10-12 keys the lowest; tests/unit/test_real_corpus.py) and on records of
NeMo-RL, slime, AReaL and SkyRL against the mappings without those frameworks (tests/data/frameworks-next: 0.29 or
less, and no key only one framework names; tests/unit/test_detect_unknown.py checks both sides).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, TypeVar

from .schema.facts import SPLIT_PREFIXES
from .schema.loader import Registry
from .schema.model import Entry, FrameworkMapping
from .schema.spec import Spec
from .values import flat_config

T = TypeVar("T")

MIN_EXPLAINED = 0.6      # the best framework must explain at least this share of the keys ...
MIN_CONFIDENCE = 0.4     # ... and be this sure (share x margin over the runner-up), else: unknown
MIN_STRONG = 3           # keys only one framework names literally: from this many, the run's own keys dilute nothing


@dataclass
class Evidence:
    """How much each framework's keys say for it. A key logged by k frameworks counts 1/k (``loss`` under ``train/``
    says little, ``actor/ppo_kl`` much), half that when the framework explains it only through a template
    (``perf/{metric}`` catches any ``perf/`` name); a run-config key that is one of the framework's ``config:`` keys
    counts likewise. Keys no framework logs count for none and against none. ``strong`` counts, per framework, the
    keys it names literally and no other framework logs: with :data:`MIN_STRONG` of them, the run's own keys (a fork's,
    a subclass's, custom rewards) do not dilute the share explained."""

    known: set[str]                        # keys some framework explains
    by_framework: dict[str, float]
    strong: dict[str, int]
    config_hits: dict[str, int]

    @classmethod
    def of(cls, cands: list[tuple[Candidate, set[str]]], registry: Registry,
           config: dict[str, Any] | None) -> "Evidence":
        counts: dict[str, int] = {}
        for _, explained in cands:
            for k in explained:
                counts[k] = counts.get(k, 0) + 1
        flat = set(flat_config(config or {}))          # nested or already flat: dotted keys
        owners: dict[str, list[str]] = {}
        for fw in registry.frameworks.values():
            for key in {c.key for c in fw.config} & flat:
                owners.setdefault(key, []).append(fw.name)
        hits: dict[str, int] = {}
        by_fw: dict[str, float] = {}
        strong: dict[str, int] = {}
        for key, fws in owners.items():
            for name in fws:
                hits[name] = hits.get(name, 0) + 1
                by_fw[name] = by_fw.get(name, 0.0) + 1.0 / len(fws)
        for c, explained in cands:
            fw = registry.frameworks[c.framework]
            total = by_fw.get(c.framework, 0.0)
            for k in explained:
                literal = _literal(fw, k)
                total += (1.0 if literal else 0.5) / counts[k]
                if literal and counts[k] == 1:
                    strong[c.framework] = strong.get(c.framework, 0) + 1
            by_fw[c.framework] = total
        return cls(set(counts), by_fw, strong, hits)

    def score(self, cand: Candidate) -> float:
        return round(self.by_framework.get(cand.framework, 0.0), 9)


def _literal(fw: FrameworkMapping, key: str) -> bool:
    """Whether ``fw`` names ``key`` itself (an entry or a passthrough key, not a template), with or without one of
    its tracker prefixes."""
    split, rest = fw.split_prefix(key)
    for k in ((key, rest) if split is not None else (key,)):
        if any(e.key_template is None for e, _ in fw.lookup(k)):
            return True
        if any(tpl is None and text == k for text, tpl in fw.passthrough):
            return True
    return False


@dataclass
class Candidate:
    """One framework/trainer and the release range (indices, inclusive) in which it explains the most keys."""

    framework: str
    trainer: str | None
    lo: int
    hi: int
    explained: int
    specific: int
    missing: int = 0          # keys the trainer logs on every call ("always") that are absent
    literal: int = 0          # keys named literally (not through a template) by the trainer's own entries

    def rank(self) -> tuple[int, int, int, int]:
        """The sort key of candidates: higher is better."""
        # literal names before the always-logged check: a key a trainer names itself is better evidence than a
        # template instance (GRPO's rewards/{reward_fn} also matches DPO's rewards/margins)
        return (self.explained, self.literal, -self.missing, self.specific)

    def describe(self, registry: Registry) -> str:
        """``FRAMEWORK[/TRAINER]@LO[..HI]`` with release names."""
        fw = registry.frameworks[self.framework]
        lo, hi = fw.release_name(self.lo), fw.release_name(self.hi)
        rng = lo if lo == hi else f"{lo}..{hi}"
        return f"{self.framework}{'/' + self.trainer if self.trainer else ''}@{rng}"


@dataclass
class Detection:
    """The result of :func:`detect`: the spec found (None when it cannot tell), how sure, and why."""

    spec: Spec | None                      # None when it cannot tell
    source: str                            # e.g. "trl/grpo@v0.17.0..v0.17.0", "canonical", "unknown"
    confidence: float
    n_keys: int
    explained: int
    unexplained: list[str] = field(default_factory=list)
    candidates: list[str] = field(default_factory=list)   # runners-up, best first
    reason: str = ""

    def to_json(self) -> dict[str, Any]:
        """The summary ``trackbridge detect --json`` prints."""
        return {"source": self.source, "confidence": round(self.confidence, 3), "keys": self.n_keys,
                "explained": self.explained, "unexplained": self.unexplained, "candidates": self.candidates,
                "reason": self.reason}


def _unprefixed(look: Callable[[str], list[T]], fw: FrameworkMapping, key: str) -> list[T]:
    """``look(key)``, else ``look`` of the key without one of the framework's tracker prefixes."""
    hits = look(key)
    if not hits:
        split, rest = fw.split_prefix(key)
        if split is not None:
            hits = look(rest)
    return hits


def _keys_of(fw: FrameworkMapping, key: str) -> list[tuple[Entry, dict[str, str] | None]]:
    return _unprefixed(fw.lookup, fw, key)


def _unmapped_scopes(fw: FrameworkMapping, key: str) -> list[tuple[frozenset | None, float, float]]:
    return _unprefixed(fw.unmapped_scopes, fw, key)


def _release_window(fw: FrameworkMapping, within: Spec | None) -> tuple[int, int]:
    """The releases (indices, inclusive) a detection may name: all, or those of the spec it is restricted to."""
    n_rel = len(fw.releases)
    if within is None:
        return 0, n_rel - 1
    hi = min(n_rel - 1, math.floor(min(within.hi, n_rel - 1)))
    lo = max(0, math.ceil(within.lo))
    return (min(lo, hi), hi)


def _best_for_framework(fw: FrameworkMapping, keys: list[str], trainers: list[str] | None = None,
                        within: Spec | None = None) -> tuple[Candidate | None, set[str]]:
    """The best candidate of one framework (over ``trainers``: all of its trainers by default), naming only
    releases inside ``within`` when given."""
    n_rel = len(fw.releases)
    w_lo, w_hi = _release_window(fw, within)
    names: list[str | None] = list(trainers or fw.trainers) or [None]
    counts = {t: [0] * n_rel for t in names}
    # a trainer explains keys only in the releases in which it exists
    full = {t: (fw.trainer_span(t) if t is not None else (0.0, float("inf"))) for t in names}
    span = {t: (a, min(b, n_rel - 1)) for t, (a, b) in full.items()}
    specific = {t: 0 for t in names}
    literal = {t: 0 for t in names}
    explained_any: set[str] = set()
    for key in keys:
        if key in fw.internal:
            continue
        hits = _keys_of(fw, key)
        if not hits:
            scopes = _unmapped_scopes(fw, key) if fw.passthrough else []
            if scopes:
                # logged by the framework without a canonical name: evidence for the trainers and releases its
                # passthrough item names (every release of every trainer when it names none)
                explained_any.add(key)
                for t in names:
                    lo_t, hi_t = math.ceil(span[t][0]), int(span[t][1])
                    row = counts[t]
                    seen = [False] * n_rel
                    for trs, a, b in scopes:
                        if t is not None and trs is not None and t not in trs:
                            continue
                        for r in range(max(0, lo_t, math.ceil(a)), min(hi_t, int(min(b, n_rel - 1))) + 1):
                            seen[r] = True
                    for r in range(n_rel):
                        row[r] += seen[r]
            continue
        explained_any.add(key)
        for t in names:
            covered = [False] * n_rel
            spec_hit = lit_hit = False
            for e, _ in hits:
                if t is not None and e.trainers is not None and t not in e.trainers:
                    continue
                if e.since > span[t][1] or e.until < span[t][0]:
                    continue
                if e.trainers is not None:
                    spec_hit = True
                    lit_hit = lit_hit or e.key_template is None
                hi = int(min(e.until, n_rel - 1, span[t][1]))
                for r in range(max(math.ceil(e.since), int(span[t][0])), hi + 1):
                    covered[r] = True
            if spec_hit:
                specific[t] += 1
            if lit_hit:
                literal[t] += 1
            row = counts[t]
            for r in range(n_rel):
                if covered[r]:
                    row[r] += 1
    best: Candidate | None = None
    observed: set[str] | None = None            # the keys less their tracker prefixes: made once, if needed
    for t in names:
        row = counts[t]
        top = max(row) if row else 0
        if top == 0:
            continue
        top = max(row[w_lo:w_hi + 1])
        if top == 0:
            continue
        best_rel = [r for r in range(w_lo, w_hi + 1) if row[r] == top]
        # of the releases that explain the most keys, keep those that miss the fewest always-logged keys
        if observed is None:
            observed = _observed(fw, keys)
        missing = _missing_always(fw, t, observed, len(keys), best_rel)
        fewest = min(missing.values())
        best_rel = [r for r in best_rel if missing[r] == fewest]
        lo, hi = best_rel[0], best_rel[-1]        # the span of releases that explain the most keys
        cand = Candidate(fw.name, t, lo, hi, top, specific[t])
        cand.missing = fewest
        cand.literal = literal[t]
        if best is None or cand.rank() > best.rank():
            best = cand
    return best, explained_any


def config_trainers(fw: FrameworkMapping, config: dict[str, Any] | None, within: Spec | None = None) -> list[str]:
    """The trainers whose distinguishing config fields (``config_fields`` in the mapping) appear in ``config``
    (flattened: ``a.b`` keys; a field matches at any depth, since trackers nest the arguments differently).

    A field with ``since``/``until`` is distinctive only in those releases (RLOOConfig v0.9.3-v0.9.6 still had
    PPO's ``vf_coef``, ``cliprange_value`` and ``lam``): it counts only when ``within`` overlaps them, and when
    several trainers are named, those named by a field distinctive in every release win over those named only by
    release-bound ones (an RLOOConfig with ``rloo_k`` and ``vf_coef`` is RLOO's)."""
    if not config:
        return []
    tails = {str(k).rsplit(".", 1)[-1] for k in config}
    lo, hi = _release_window(fw, within) if within is not None else (0, len(fw.releases) - 1)
    named: dict[str, bool] = {}                 # trainer -> named by a field distinctive in every release
    for t, spec in fw.trainers.items():
        for cf in spec.get("config_fields") or ():
            if not isinstance(cf, dict) or cf.get("field") not in tails:
                continue
            a = fw.release_index(str(cf["since"])) if cf.get("since") else 0
            b = fw.release_index(str(cf["until"])) if cf.get("until") else float("inf")
            if b < lo or a > hi:
                continue
            named[t] = named.get(t, False) or not (cf.get("since") or cf.get("until"))
    if len(named) > 1 and any(named.values()):
        return [t for t, always in named.items() if always]
    return list(named)


SUMMARY_STATS = frozenset({"count", "mean", "std", "min", "max"})   # trackbridge.record.Histogram.summary()


def _folded(unexplained: set[str]) -> int:
    """How many of ``unexplained`` are summary keys of a value counted already: of every group of two or more
    ``BASE/STAT`` keys (STAT a histogram summary statistic), all but one."""
    groups: dict[str, int] = {}
    for k in unexplained:
        base, _, stat = k.rpartition("/")
        if base and stat in SUMMARY_STATS:
            groups[base] = groups.get(base, 0) + 1
    return sum(c - 1 for c in groups.values() if c > 1)


def detect(keys: Iterable[str], registry: Registry, within: Spec | None = None,
           config: dict[str, Any] | None = None) -> Detection:
    """The framework, trainer and release range that best explain ``keys``. ``within`` (a framework spec, perhaps
    with a trainer or releases) restricts the answer to what it allows: ``trl@1.16.0`` detects only the trainer.
    ``config`` (the run config, flattened) names the trainer when it holds fields only one trainer's config has."""
    keys = sorted({k for k in keys if isinstance(k, str)})
    n = len(keys)
    if n == 0:
        return Detection(None, "unknown", 0.0, 0, 0, reason="no keys to detect from")
    if within is not None and within.kind == "framework":
        return _detect_within(keys, registry, within, config)
    canon = registry.canonical
    canon_hits = 0
    for k in keys:
        base = k.split("/", 1)[1] if k.startswith(SPLIT_PREFIXES) else k
        if canon.find(canon.upgrade(base)) is not None:
            canon_hits += 1
    cands: list[tuple[Candidate, set[str]]] = []
    named: dict[str, list[str]] = {}
    for fw in registry.frameworks.values():
        named[fw.name] = config_trainers(fw, config)
        best, explained = _best_for_framework(fw, keys, named[fw.name] or None)
        if best is not None:
            cands.append((best, explained))
    weigh = Evidence.of(cands, registry, config)
    # equal evidence: the framework with the longer release history (the more common) first
    cands.sort(key=lambda c: (weigh.score(c[0]), c[0].explained, len(registry.frameworks[c[0].framework].releases)),
               reverse=True)
    top = cands[0][0] if cands else None
    if canon_hits and (top is None or canon_hits > top.explained):
        second = top.explained if top else 0
        conf = canon_hits / n * (0.5 + 0.5 * (canon_hits - second) / canon_hits)
        return Detection(Spec("canonical"), "canonical", conf, n, canon_hits,
                         [k for k in keys if canon.find(k) is None],
                         [c.describe(registry) for c, _ in cands[:3]], "the keys are canonical names")
    if top is None:
        return Detection(None, "unknown", 0.0, n, 0, keys, [], "no key is logged by any framework trackbridge has a "
                         "mapping for")
    # the keys no framework logs (the run's own: custom rewards, a fork's or a subclass's additions) are evidence of
    # nothing and, once the framework has MIN_STRONG keys of its own, dilute nothing: the share is of the keys some
    # framework logs. Without such keys (a few names several frameworks log, or template catches), the share is of
    # every key, so that a framework with no mapping is not named after the generic names it shares. A tracker that
    # holds no histograms stores one as summary keys (MLflow: X/count, X/mean ...): one value, counted once
    own = n - len(weigh.known)
    strong = weigh.strong.get(top.framework, 0)
    pool = set(keys) if strong < MIN_STRONG else weigh.known
    n_pool = len(pool) - _folded(pool - cands[0][1])
    fit = top.explained / max(n_pool, 1)
    ev_top = weigh.score(top)
    ev_second = weigh.score(cands[1][0]) if len(cands) > 1 else 0.0
    conf = fit * (0.5 + 0.5 * (ev_top - ev_second) / ev_top) if ev_top > 0 else 0.0
    if fit < MIN_EXPLAINED or conf < MIN_CONFIDENCE:
        guesses = [f"{c.describe(registry)} ({c.explained} of {n_pool} keys)" for c, _ in cands[:3]]
        whose = "keys" if pool is not weigh.known else "keys some framework logs"
        return Detection(None, "unknown", conf, n, top.explained, sorted(set(keys) - cands[0][1]), guesses,
                         f"the best guess, {top.describe(registry)}, explains only {top.explained} of {n_pool} "
                         f"{whose} (confidence {conf:.2f}, {strong} keys only it names; trackbridge names a framework "
                         f"from {MIN_EXPLAINED:.0%} of the keys and confidence {MIN_CONFIDENCE}, and leaves the keys "
                         f"no framework logs out of the share once {MIN_STRONG} keys only one framework names are "
                         f"there): the keys look like a framework it has no mapping for")
    fw = registry.frameworks[top.framework]
    # a trainer is named only if it beats the others: ties on the keys explained are broken by how much of each
    # trainer's own key set (its trainer-specific names at the detected release) was observed
    by_config = named.get(fw.name) or []
    allowed = by_config or list(fw.trainers)
    tie = [t for t in allowed if t != top.trainer and _trainer_score(fw, keys, t) == top.rank()]
    assumed = None
    if tie:
        tied = [t for t in allowed if t == top.trainer or t in tie]      # declared order: most common first
        winner, told = _tie_winner(fw, keys, tied)
        if not told:
            assumed = (winner, [t for t in tied if t != winner])
        top.trainer, tie = winner, []
        top.lo, top.hi = _range_for(fw, keys, winner, top)
    trainer = top.trainer
    reason = f"{top.explained} of {n} keys are logged by {top.describe(registry)}"
    if own and pool is weigh.known:
        reason += f" ({own} logged by no framework: the run's own, passed through)"
    if ev_second and ev_second == ev_top:
        rival = cands[1][0]
        reason += (f"; {rival.describe(registry)} explains the keys as well (a tie: {top.framework} is the more "
                   f"common; pass source=... to say otherwise)")
    if weigh.config_hits.get(top.framework):
        reason += f"; the run config has {weigh.config_hits[top.framework]} of {top.framework}'s config keys"
    if assumed:
        reason += (f"; the keys fit trainers {', '.join([assumed[0], *assumed[1]])} equally, assuming "
                   f"{assumed[0]} (pass source=... or the run config to say otherwise)"
                   + _differing(fw, keys, assumed[0], assumed[1]))
        conf *= 0.9
    if by_config:
        reason += f"; the run config has fields only {'/'.join(by_config)}'s config class has"

    spec = Spec("framework", framework=top.framework, trainer=trainer, lo=float(top.lo), hi=float(top.hi))
    explained_set = cands[0][1]
    unexplained = set(keys) - explained_set
    return Detection(spec, spec.describe(registry), conf, n - _folded(unexplained), top.explained, sorted(unexplained),
                     [c.describe(registry) for c, _ in cands[1:4]], reason)


def _detect_within(keys: list[str], registry: Registry, within: Spec,
                   config: dict[str, Any] | None = None) -> Detection:
    """Detection inside one framework (and the trainer/releases ``within`` names): which trainer, which releases."""
    assert within.framework is not None          # a framework spec: detect() checked its kind
    fw = registry.frameworks[within.framework]
    by_config = [] if within.trainer else config_trainers(fw, config, within)
    trainers = [within.trainer] if within.trainer else (by_config or list(fw.trainers))
    lo, hi = _release_window(fw, within)
    trainers = [t for t in trainers if t is None or fw.trainer_alive(t, lo, hi)] or trainers
    n = len(keys)
    scored = []
    for t in trainers:
        best, explained = _best_for_framework(fw, keys, [t], within)
        if best is not None:
            scored.append((best, explained))
    given = within.describe(registry)
    if not scored:
        return Detection(None, "unknown", 0.0, n, 0, list(keys), [],
                         f"none of the keys is logged by {given} according to the mappings")
    scored.sort(key=lambda c: c[0].rank(), reverse=True)
    top, explained = scored[0]
    tied = [c.trainer for c, _ in scored if c.rank() == top.rank()]
    reason = f"{top.explained} of {n} keys are logged by {top.describe(registry)}"
    conf = top.explained / n
    if len(tied) > 1:
        order = [t for t in fw.trainers if t in tied]
        winner, told = _tie_winner(fw, keys, order, within)
        if not told:
            reason += (f"; the keys fit {within.framework} trainers {', '.join(order)} equally, assuming {winner} "
                       f"(the first declared; name the trainer or pass the run config to say otherwise)"
                       + _differing(fw, keys, winner, [t for t in order if t != winner], within))
            conf *= 0.9
        top = next(c for c, _ in scored if c.trainer == winner)
        explained = next(e for c, e in scored if c.trainer == winner)
    if by_config:
        reason += f"; the run config has fields only {'/'.join(by_config)}'s config class has"
    spec_lo, spec_hi = (within.lo, within.hi) if within.version else (float(top.lo), float(top.hi))
    spec = Spec("framework", framework=fw.name, trainer=top.trainer, lo=spec_lo, hi=spec_hi,
                version=within.version)
    runners = [c.describe(registry) for c, _ in scored[1:4]]
    return Detection(spec, spec.describe(registry), conf, n, top.explained, sorted(set(keys) - explained),
                     runners, reason)


def _tie_winner(fw: FrameworkMapping, keys: list[str], tied: list[str], within: Spec | None = None
                ) -> tuple[str, bool]:
    """Of trainers that explain the keys equally (in declared order), the one whose own names (trainer-specific,
    literal, in the releases where that trainer explains the keys best) were observed and no other's were; else the
    first declared. Each trainer is judged on its own releases: PPOv2 (v0.9.3-v1.12.0) and RLOO (v0.9.3-v0.21.0)
    log the same names, and at PPO's newest release RLOO's own names are another API's. The flag says whether the
    keys told it (False: assumed)."""
    own = {t: _own_keys_in(fw, keys, t, within) for t in tied}
    observed = _observed(fw, keys)
    distinct = [t for t in tied if (own[t] & observed) - set().union(*(own[o] for o in tied if o != t))]
    return (distinct[0], True) if len(distinct) == 1 else (tied[0], False)


def _own_keys_in(fw: FrameworkMapping, keys: list[str], trainer: str, within: Spec | None) -> set[str]:
    best, _ = _best_for_framework(fw, keys, [trainer], within)
    if best is None:
        return set()
    return {e.key for e in fw.entries if e.trainers is not None and trainer in e.trainers and e.key_template is None
            and e.since <= best.hi and e.until >= best.lo}


def _meanings(fw: FrameworkMapping, key: str, trainer: str, release: int) -> set[tuple[Any, ...]]:
    hits = _keys_of(fw, key)
    specific = [e for e, _ in hits if e.trainers is not None and trainer in e.trainers
                and e.applies(trainer, release, release)]
    chosen = specific or [e for e, _ in hits if e.trainers is None and e.applies(trainer, release, release)]
    return {(e.canonical, e.fidelity, e.differs, e.reason, _stated(e)) for e in chosen}


def _stated(e: Entry) -> tuple[tuple[str, Any], ...]:
    """An entry's stated reduction as compared across trainers (its fidelity is computed from it): the fields, less
    ``tool_tokens`` (a trainer that cannot call tools and one that leaves tool tokens out agree on every run
    without tools)."""
    return tuple((k, v) for k, v in e.reduce.fields if k != "tool_tokens") if e.reduce is not None else ()


def _differing(fw: FrameworkMapping, keys: list[str], winner: str, others: list[str],
               within: Spec | None = None) -> str:
    """``; for rloo these keys mean something else ...``: the keys an assumed trainer translates differently from
    a trainer it was tied with (canonical name or fidelity), judged at the newest release where both explain the
    keys, so the reader knows what the guess costs."""
    spans = {}
    for t in [winner, *others]:
        best, _ = _best_for_framework(fw, keys, [t], within)
        if best is not None:
            spans[t] = (best.lo, best.hi)
    if winner not in spans:
        return ""
    out = []
    for o in others:
        if o not in spans:
            continue
        common = min(spans[winner][1], spans[o][1])
        if common >= max(spans[winner][0], spans[o][0]):
            r_w = r_o = common
        else:                                # no release in common: each at its own newest
            r_w, r_o = spans[winner][1], spans[o][1]
        diff = [k for k in keys if _meanings(fw, k, winner, r_w) != _meanings(fw, k, o, r_o)]
        if diff:
            out.append(f"for {o} (at {fw.release_name(r_o)}) these keys mean something else or with another "
                       f"fidelity: {', '.join(diff[:8])}{' ...' if len(diff) > 8 else ''}")
    return "; " + "; ".join(out) if out else ""


def _trainer_score(fw: FrameworkMapping, keys: list[str], trainer: str) -> tuple[int, int, int, int]:
    best, _ = _best_for_framework(fw, keys, [trainer])
    return best.rank() if best else (0, 0, 0, 0)


def _observed(fw: FrameworkMapping, keys: list[str]) -> set[str]:
    out: set[str] = set()
    for k in keys:
        split, rest = fw.split_prefix(k)
        out.add(rest if split is not None else k)
    return out


def _range_for(fw: FrameworkMapping, keys: list[str], trainer: str, fallback: Candidate) -> tuple[int, int]:
    best, _ = _best_for_framework(fw, keys, [trainer])
    return (best.lo, best.hi) if best else (fallback.lo, fallback.hi)


def _missing_always(fw: FrameworkMapping, trainer: str | None, observed: set[str], n_keys: int,
                    releases: list[int]) -> dict[int, int]:
    """For each of ``releases``, how many of the trainer's ``always`` keys (logged on every call at that release)
    are absent from ``observed`` (the keys, less their tracker prefixes: ``_observed``). Judged only on a key set
    large enough (``n_keys``) to be a whole logged record."""
    missing = dict.fromkeys(releases, 0)
    if trainer is None or n_keys < 4:
        return missing
    for k in fw.trainers.get(trainer, {}).get("always") or []:
        if k in observed:
            continue
        spans = [(e.since, e.until) for e in fw.exact_index.get(k, ()) if e.applies(trainer, -math.inf, math.inf)]
        for r in releases:
            if any(a <= r <= b for a, b in spans):
                missing[r] += 1
    return missing
