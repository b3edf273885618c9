"""Which trainer (:mod:`trackbridge.detect`): the trainer a run config names, and ties between trainers that explain the
keys equally, broken by the keys only one of them logs; what a guess costs, said."""
from __future__ import annotations

from typing import Any

from ..schema.model import Entry, FrameworkMapping
from ..schema.spec import Spec
from .votes import Candidate, _best_for_framework, _keys_of, _observed, _release_window


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


def _range_for(fw: FrameworkMapping, keys: list[str], trainer: str, fallback: Candidate) -> tuple[int, int]:
    best, _ = _best_for_framework(fw, keys, [trainer])
    return (best.lo, best.hi) if best else (fallback.lo, fallback.hi)
