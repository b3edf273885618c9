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

The parts: :mod:`.votes` (each framework's keys voting for its trainers' releases), :mod:`.trainers` (the trainer a
run config names, and ties between trainers broken by the keys only one logs); this module weighs the frameworks
against each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

from ..record.values import flat_config
from ..schema.facts import SPLIT_PREFIXES
from ..schema.loader import Registry
from ..schema.model import FrameworkMapping
from ..schema.spec import Spec
from .trainers import _differing, _range_for, _tie_winner, _trainer_score, config_trainers
from .votes import Candidate, _best_for_framework, _release_window

MIN_EXPLAINED = 0.6      # the best framework must explain at least this share of the keys ...


MIN_CONFIDENCE = 0.4     # ... and be this sure (share x margin over the runner-up), else: unknown


MIN_STRONG = 3           # keys only one framework names literally: from this many, the run's own keys dilute nothing


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
    canon_hits, cands, named, weigh = _candidates(keys, registry, config)
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
        return _too_weak(keys, registry, cands, n, n_pool, conf, strong, of_known=pool is weigh.known)
    fw = registry.frameworks[top.framework]
    by_config = named.get(fw.name) or []
    assumed = _name_trainer(fw, keys, top, by_config)
    trainer = top.trainer
    reason, conf = _reason(fw, keys, top, registry, n, own=own if pool is weigh.known else 0,
                           rival=cands[1][0] if ev_second and ev_second == ev_top else None,
                           config_hits=weigh.config_hits.get(top.framework), assumed=assumed,
                           by_config=by_config, conf=conf)

    spec = Spec("framework", framework=top.framework, trainer=trainer, lo=float(top.lo), hi=float(top.hi))
    explained_set = cands[0][1]
    unexplained = set(keys) - explained_set
    return Detection(spec, spec.describe(registry), conf, n - _folded(unexplained), top.explained, sorted(unexplained),
                     [c.describe(registry) for c, _ in cands[1:4]], reason)


def _too_weak(keys: list[str], registry: Registry, cands: list[tuple[Candidate, set[str]]], n: int, n_pool: int,
              conf: float, strong: int, *, of_known: bool) -> Detection:
    """``unknown``: the best candidate explains too few keys, or too few more than the next one (its thresholds in
    the reason, with the best guesses)."""
    top = cands[0][0]
    guesses = [f"{c.describe(registry)} ({c.explained} of {n_pool} keys)" for c, _ in cands[:3]]
    whose = "keys" if not of_known else "keys some framework logs"
    return Detection(None, "unknown", conf, n, top.explained, sorted(set(keys) - cands[0][1]), guesses,
                     f"the best guess, {top.describe(registry)}, explains only {top.explained} of {n_pool} "
                     f"{whose} (confidence {conf:.2f}, {strong} keys only it names; trackbridge names a framework "
                     f"from {MIN_EXPLAINED:.0%} of the keys and confidence {MIN_CONFIDENCE}, and leaves the keys "
                     f"no framework logs out of the share once {MIN_STRONG} keys only one framework names are "
                     f"there): the keys look like a framework it has no mapping for")


def _candidates(keys: list[str], registry: Registry, config: dict[str, Any] | None
               ) -> tuple[int, list[tuple[Candidate, set[str]]], dict[str, list[str]], Evidence]:
    """How many keys are canonical names, and each framework's best candidate with the keys it explains, best
    first by the evidence (``named``: the trainers the run config names, per framework)."""
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
    return canon_hits, cands, named, weigh


def _name_trainer(fw: FrameworkMapping, keys: list[str], top: Candidate, by_config: list[str]
                 ) -> tuple[str, list[str]] | None:
    """Settle ``top``'s trainer among those that explain the keys equally (``by_config``: those the run config
    allows); returns ``(assumed, the others)`` when the keys could not tell them apart."""
    # a trainer is named only if it beats the others: ties on the keys explained are broken by how much of each
    # trainer's own key set (its trainer-specific names at the detected release) was observed
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
    return assumed


def _reason(fw: FrameworkMapping, keys: list[str], top: Candidate, registry: Registry, n: int, *, own: int,
            rival: Candidate | None, config_hits: int | None, assumed: tuple[str, list[str]] | None,
            by_config: list[str], conf: float) -> tuple[str, float]:
    """Why the keys name ``top``, in words, and the confidence (lower when a trainer was assumed)."""
    reason = f"{top.explained} of {n} keys are logged by {top.describe(registry)}"
    if own:
        reason += f" ({own} logged by no framework: the run's own, passed through)"
    if rival is not None:
        reason += (f"; {rival.describe(registry)} explains the keys as well (a tie: {top.framework} is the more "
                   f"common; pass source=... to say otherwise)")
    if config_hits:
        reason += f"; the run config has {config_hits} of {top.framework}'s config keys"
    if assumed:
        reason += (f"; the keys fit trainers {', '.join([assumed[0], *assumed[1]])} equally, assuming "
                   f"{assumed[0]} (pass source=... or the run config to say otherwise)"
                   + _differing(fw, keys, assumed[0], assumed[1]))
        conf *= 0.9
    if by_config:
        reason += f"; the run config has fields only {'/'.join(by_config)}'s config class has"
    return reason, conf


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
