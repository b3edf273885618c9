"""Stages 2 and 4 of a translation: the compiled name map of one resolved source and target.

A :class:`NameMap` is built once the source and the target are resolved (:mod:`.resolve`) and never changes: for
each input key it gives a :class:`~.entries.Plan` (the output name, the value conversion, the canonical name, the
fidelity) through canonical names (forward: source key -> canonical; reverse: canonical -> target key). Plans are
compiled on first use and kept, so translating a dict is one dictionary lookup per key.

Fidelity is computed (docs/reductions.md): an entry that states its reduction is resolved under the run config and
compared with the canonical reference (to canonical) or with the target entry, directly (framework to framework);
an entry with hand-written fidelity (legacy) keeps it. ``canon_reason`` (the source against the canonical reference)
is what derived values inherit; ``approx`` (against the target) is what the translation reports.
"""
from __future__ import annotations

import re
from dataclasses import replace
from typing import Any, Mapping

from ..schema.facts import SPLITS
from ..schema.loader import Registry
from ..schema.model import Entry, FrameworkMapping, condition_value_text
from ..schema.proofs import UNPROVEN
from ..schema.spec import Spec
from . import fidelity as F
from .entries import Hit, Marks, Plan, choose, nearest, reason_of, split_canonical, until_name
from .resolve import NO_TRAINER, framework_of


class NameMap:
    """The compiled, immutable name map from one resolved source to one resolved target.

    ``source``: a framework spec (trainer and releases resolved as far as they can be) or ``canonical``;
    ``target``: ``canonical[@VERSION]`` or a framework spec, ``target_trainer`` its resolved trainer (None: all;
    :data:`~.resolve.NO_TRAINER`: no counterpart). ``config``: the run config in the source's names, flattened;
    ``target_config`` the same carried to the target's keys through the canonical config names. A canonical source
    may name its ``origin`` (the framework its names came from) and ``input_fidelity`` (its approximations).
    """

    def __init__(self, registry: Registry, source: Spec, target: Spec, target_trainer: str | None, *,
                 config: Mapping[str, Any], target_config: Mapping[str, Any], origin: Spec | None = None,
                 input_fidelity: Mapping[str, str] | None = None) -> None:
        self.registry, self.source, self.target = registry, source, target
        self.target_trainer = target_trainer
        self.config, self.target_config = config, target_config
        self.origin = origin
        self.input_fidelity = input_fidelity if input_fidelity is not None else {}
        self._plans: dict[str, Plan | None] = {}
        self._rev: dict[str, Hit | None] = {}
        self._used: dict[tuple[str, str], Any] | None = None   # the config defaults the plan being compiled read

    # ------------------------------------------------------------------------------------------------ lookups
    def plan(self, key: str) -> Plan | None:
        """What ``key`` becomes (None: no translation: passed through and reported)."""
        try:
            return self._plans[key]
        except KeyError:
            pass
        self._used = {}
        try:
            plan = self._compile(key)
            if plan is not None and self._used:
                plan = replace(plan, marks=replace(plan.marks or Marks(),
                                                   defaults=tuple((fw, k, v) for (fw, k), v in self._used.items())))
        finally:
            self._used = None
        self._plans[key] = plan
        return plan

    @property
    def plans(self) -> Mapping[str, Plan | None]:
        """The plans compiled so far (read-only use: the translator's hot loop reads it directly)."""
        return self._plans

    def target_name(self, canonical_key: str) -> str:
        """The target-scheme name of one canonical key (the key itself when the target has none)."""
        if self.target.kind == "canonical":
            return self.canonical_out(canonical_key)
        split, base = split_canonical(canonical_key)
        hit = self.reverse(base)
        return canonical_key if hit is None else self.framework_out(hit[0], hit[1], split)

    def reverse(self, canon: str) -> Hit | None:
        """The target entry that writes canonical ``canon`` (None: the target has no name for it)."""
        try:
            return self._rev[canon]
        except KeyError:
            pass
        fw = framework_of(self.registry, self.target)
        lo, hi = self.target.bounds(len(fw.releases))
        trainer = self.target_trainer
        hit = _reverse_in(self.registry, fw, canon, trainer, lo, hi, self.target_config)
        self._rev[canon] = hit
        return hit

    def canonical_out(self, canon_key: str) -> str:
        ver = self.target.canonical_version
        if not ver:
            return canon_key
        split, base = split_canonical(canon_key)
        base = self.registry.canonical.downgrade(base, ver)
        return f"{split}/{base}" if split else base

    def framework_out(self, rev: Entry, caps: dict[str, str] | None, split: str | None) -> str:
        name = rev.key_template.fill(caps) if rev.key_template is not None and caps is not None else rev.key
        if split:
            fw = self.registry.frameworks[rev.framework]
            name = (fw.prefix_for(split) or f"{split}/") + name
        return name

    # ------------------------------------------------------------------------------------------------ fidelity
    def against_reference(self, e: Entry, canon: str, side: str, label: str | None = None,
                          split: str | None = None) -> str | None:
        """Why ``e`` (of the source, or of the target: ``side``) is not the canonical quantity ``canon`` (None:
        exact); ``split``: the key's split other than train (an evaluation's value). Legacy entries: their
        hand-written reason."""
        r = self._resolved(e, side, label, split)
        if r is None:
            return reason_of(e)
        metric = self.registry.canonical.find(canon)
        ref = F.reference(metric, split) if metric is not None else None
        if ref is None:
            return f"{r.who}: canonical {canon!r} states no reference reduction to compare with"
        return F.judge(r, ref) or F.unproven([(e, r)], self.registry.proven, "the canonical reduction")

    def between(self, a: Entry, a_side: str, b: Entry, b_side: str, canon: str, a_label: str | None = None,
                b_label: str | None = None, split: str | None = None) -> str | None:
        """Why source entry ``a`` and target entry ``b`` are not the same quantity (None: exact): their stated
        reductions compared directly, else (either is legacy) both against the canonical reference."""
        ra, rb = self._resolved(a, a_side, a_label, split), self._resolved(b, b_side, b_label, split)
        if ra is not None and rb is not None:
            if a is b:
                return None                 # one entry on both sides: the same code, whatever was proven
            return F.judge(ra, rb) or F.unproven([(a, ra), (b, rb)], self.registry.proven, "equal reductions")
        reasons = [r for r in (self.against_reference(a, canon, a_side, a_label, split),
                               self.against_reference(b, canon, b_side, b_label, split)) if r]
        return "; ".join(dict.fromkeys(reasons)) or None

    def _resolved(self, e: Entry, side: str, label: str | None, split: str | None = None) -> F.Resolved | None:
        if e.reduce is None:
            return None
        fw = self.registry.frameworks[e.framework]
        if side == "target":
            spec, trainer, config = self.target, self.target_trainer, self.target_config
        else:
            spec = self.origin if side == "origin" and self.origin is not None else self.source
            trainer, config = spec.trainer, self.config
        if trainer == NO_TRAINER:
            trainer = None
        lo, hi = spec.bounds(len(fw.releases)) if spec.framework == fw.name else (0.0, float(len(fw.releases)))
        r = F.resolve(e, fw, trainer, lo, hi, config, label=label, split=split)
        if r is not None and self._used is not None:
            for k, v in r.defaults:
                self._used.setdefault((fw.name, k), v)
        return r

    # ------------------------------------------------------------------------------------------------ compiling
    def _compile(self, key: str) -> Plan | None:
        src = self.source
        if src.kind == "canonical":
            split, base = split_canonical(key)
            base = self.registry.canonical.upgrade(base)
            if self.registry.canonical.find(base) is None:
                return None
            return self._to_target(base, split, None, key)
        if src.kind != "framework":
            return None                         # an unknown source: names pass through
        fw = framework_of(self.registry, src)
        if key in fw.internal:
            return None
        split, hit = None, self._forward(fw, key, src, None)
        if hit is None:
            split, rest = fw.split_prefix(key)
            if split is not None:
                hit = self._forward(fw, rest, src, _other(split))
                if hit is None:
                    # a trainer that prefixed its own keys (TRL KTO v0.8.2-v0.8.6 wrote `eval/...`), prefixed again by
                    # the tracker integration (`train/eval/...`): the inner prefix is the split
                    inner, rest2 = fw.split_prefix(rest)
                    if inner is not None:
                        split = inner if inner != SPLITS.default else split
                        hit = self._forward(fw, rest2, src, _other(split))
        if hit is None:
            return None
        entry, caps, note, range_reason, outside, unset = hit
        canon = entry.canonical_template.fill(caps) if entry.canonical_template and caps else entry.canonical
        split = None if split == SPLITS.default else split
        # the key as the framework names it (the split's native prefix, none for train): every path, a stream renamed
        # back from its canonical names included, names it so in its reasons
        label = self.framework_out(entry, caps, split)
        plan = self._to_target(canon, split, entry, label, note)
        if unset:
            plan = replace(plan, marks=replace(plan.marks or Marks(), unset=unset))
        if range_reason:
            # the range's reason says more than a missing proof does: it comes first, the proof gate's after it
            plan = replace(plan, approx=_first(range_reason, plan.approx),
                           canon_reason=_first(range_reason, plan.canon_reason))
        if outside:
            plan = replace(plan, marks=replace(plan.marks or Marks(), outside=True))
        return plan

    def _forward(self, fw: FrameworkMapping, key: str, src: Spec, split: str | None
                 ) -> tuple[Entry, dict[str, str] | None, str | None, str | None, bool, tuple[str, ...]] | None:
        hits = fw.lookup(key)
        if not hits:
            return None
        lo, hi = src.bounds(len(fw.releases))
        cfg, assumed = self._when_config(fw, hits, src.trainer, lo, hi)
        chosen = choose(hits, src.trainer, lo, hi, cfg)
        note = range_reason = None
        if chosen is None:       # logged outside the detected/requested releases or by another trainer: use the
            chosen = nearest(hits, src.trainer, lo, hi, cfg) \
                or nearest(hits, None, lo, hi, cfg)                 # nearest release's meaning, and say so
            if chosen is None:
                return None
            return chosen[0], chosen[1], None, None, True, ()
        e = chosen[0]
        if lo != hi:
            note = self._meaning_note(fw, key, hits, e, src, lo, hi, cfg)
            range_reason = self._range_reason(fw, key, hits, e, src, lo, hi, split, cfg)
        # another meaning under a config the run config does not rule out (it lacks the keys, and the framework
        # declares no default for them): read with the default meaning; a default that decided it is said as such
        deciding = [h for h, _ in hits if h is not e and h.when and h.canonical != e.canonical
                    and h.applies(src.trainer, lo, hi) and h.condition_holds(self.config) is None]
        unset = tuple(dict.fromkeys(k for h in deciding for k, _ in h.when if k not in cfg))
        if self._used is not None:
            for h in deciding:
                for k, _ in h.when:
                    if k in assumed:
                        self._used.setdefault((fw.name, k), assumed[k])
        return e, chosen[1], note, range_reason, False, unset

    def _when_config(self, fw: FrameworkMapping, hits: list[Hit], trainer: str | None, lo: float, hi: float
                     ) -> tuple[Mapping[str, Any], dict[str, Any]]:
        """The run config as the ``when:`` conditions of ``hits`` read it: a key the run config lacks holds the
        framework's default (a run that does not set loss_fn.reference_policy_kl_type ran with k3), so an entry for
        another value does not apply. (config, {key: default assumed})."""
        assumed: dict[str, Any] = {}
        for h, _ in hits:
            for k, _ in h.when:
                if k not in self.config and k not in assumed:
                    known, value = fw.config_default(k, trainer, lo, hi, self.config)
                    if known:
                        assumed[k] = value
        return ({**self.config, **assumed} if assumed else self.config), assumed

    def _range_reason(self, fw: FrameworkMapping, key: str, hits: list[Hit], e: Entry, src: Spec, lo: float,
                      hi: float, split: str | None, cfg: Mapping[str, Any], side: str = "source") -> str | None:
        """A range of releases (detected, or FRAMEWORK without a version) may hold the name with another reduction
        (or hand-written fidelity) in some of its releases: then the translation is only as good as the worst."""
        # an entry for a non-default config counts only when the run config confirms it, and the unconditional entry
        # only where no confirmed `when` entry replaces it: `when` entries are alternatives by config, not by release
        others = [h for h, _ in hits if h is not e and h.canonical == e.canonical and h.applies(src.trainer, lo, hi)
                  and (h.condition_holds(cfg) is True if h.when else
                       not (e.when and e.since <= h.since and h.until <= e.until))]
        for h in others:
            if e.reduce is not None and h.reduce is not None:
                # one key in two releases: each side named by its releases, or the clauses read as a contradiction
                # ("trl 'x' is the token mean; trl 'x' is the mean of per-sequence token means")
                why = self.between(h, side, e, side, e.canonical,
                                   f"{key}@{fw.release_name(h.since)}..{until_name(fw, h)}",
                                   f"{key}@{fw.release_name(e.since)}..{until_name(fw, e)}", split)
            elif e.exact and not h.exact:
                why = reason_of(h)
            else:
                continue
            if why:
                return (f"{why} (in {fw.release_name(h.since)}..{until_name(fw, h)}; the releases "
                        f"{src.describe(self.registry)} include these, so the release matters)")
        return None

    def _meaning_note(self, fw: FrameworkMapping, key: str, hits: list[Hit], chosen: Entry, src: Spec, lo: float,
                      hi: float, cfg: Mapping[str, Any]) -> str | None:
        """A note when ``key`` means different quantities in different releases of the range in use, and choosing
        the release would settle it: an entry of another canonical name whose releases do not overlap the chosen
        one's. Entries that differ by config (``when``), by trainer or by key pattern (a template beside a literal
        key) are not differences a release resolves, and get no such note."""
        others = [h for h, _ in hits if h is not chosen and h.canonical != chosen.canonical
                  and h.applies(src.trainer, lo, hi) and h.condition_holds(cfg) is not False
                  and h.when == chosen.when and (h.key_template is None) == (chosen.key_template is None)
                  and (h.until < chosen.since or h.since > chosen.until)
                  and (src.trainer is None or h.trainers is None or chosen.trainers is None
                       or bool(h.trainers & chosen.trainers))]
        if not others:
            return None
        spans = "; ".join(f"{h.canonical} in {fw.release_name(h.since)}..{until_name(fw, h)}" for h in others[:3])
        return (f"{fw.name} {key!r} changed meaning within {src.describe(self.registry)}: {spans}; translated as "
                f"{chosen.canonical} ({fw.release_name(chosen.since)}..{until_name(fw, chosen)}); give the release to "
                f"choose")

    def _to_target(self, canon: str, split: str | None, fwd: Entry | None, key: str, note: str | None = None) -> Plan:
        canon_key = f"{split}/{canon}" if split else canon
        ev = _other(split)
        if fwd is not None:
            canon_reason = self.against_reference(fwd, canon, "source", key, ev)
        else:
            canon_reason = self.input_fidelity.get(canon_key)
        fwd_like, like_side, like_key = fwd, "source", key
        found = None
        if fwd is None and self.origin is not None and self.target.kind == "framework":
            found = self._origin_entry(canon)           # the entry the origin wrote this name from, and its key
            if found is not None:
                fwd_like, like_side, like_key = found[0], "origin", self.framework_out(found[0], found[1], split)
        if self.target.kind == "canonical":
            return Plan(self.canonical_out(canon_key), canon_key, fwd, None, canon_reason, note,
                        canon_reason=canon_reason)
        hit = self.reverse(canon)
        if hit is None:
            return Plan(canon_key, canon_key, fwd, None, canon_reason, note, canon_reason=canon_reason,
                        marks=Marks(no_target_name=True))
        rev, caps = hit
        out = self.framework_out(rev, caps, split)
        unconfirmed = self.unconfirmed(rev, caps, out)
        if fwd_like is not None and rev.framework == fwd_like.framework and \
                self.registry.frameworks[rev.framework].same_quantity(fwd_like, rev):
            # the same entry there and back, or a declared rename: the same quantity. A canonical input keeps a
            # reason that is not the entry's own (the release range it came from held another fidelity)
            approx = None if fwd is not None or self._own_reason(canon_reason, fwd_like, canon, like_side, ev) \
                else canon_reason
            if approx is None and found is not None:
                # the direct path says when the origin's release range holds the name with another reduction
                approx = self._origin_range_reason(found, ev)
        elif fwd_like is not None and (fwd is not None or (fwd_like.reduce is not None and rev.reduce is not None)):
            approx = self.between(fwd_like, like_side, rev, "target", canon, like_key, out, ev)
        else:
            # a canonical input without an origin entry that states its reduction: the reason it came with (judged
            # against the canonical reference where it was written), then the target name's own
            r2 = self.against_reference(rev, canon, "target", out, ev)
            approx = "; ".join(r for r in dict.fromkeys((canon_reason, r2)) if r) or None
        if unconfirmed:
            approx = f"{approx}; {unconfirmed}" if approx else unconfirmed
        return Plan(out, canon_key, fwd, rev, approx, note, canon_reason=canon_reason)

    def _origin_range_reason(self, found: Hit, split: str | None) -> str | None:
        """The release-range reason of the origin's key (what translating from the origin directly adds)."""
        org = self.origin
        assert org is not None
        fw = framework_of(self.registry, org)
        lo, hi = org.bounds(len(fw.releases))
        if lo == hi:
            return None
        e, caps = found
        key = e.key_template.fill(caps) if e.key_template is not None and caps is not None else e.key
        hits = fw.lookup(key)
        cfg, _ = self._when_config(fw, hits, org.trainer, lo, hi)
        return self._range_reason(fw, key, hits, e, org, lo, hi, split, cfg, side="origin")

    def _own_reason(self, reason: str | None, e: Entry, canon: str, side: str, split: str | None) -> bool:
        """Whether ``reason`` (a canonical input's, stored where it was written) is ``e``'s own judgement against the
        canonical reference, whatever the key it was written under (``train/entropy`` logged, ``entropy`` rebuilt
        from the entry): then renaming back to ``e`` is the same quantity, exact."""
        if reason is None:
            return self.against_reference(e, canon, side, None, split) is None
        mark = "\x00"
        template = self.against_reference(e, canon, side, mark, split)
        if template is None:
            return False
        pattern = re.escape(template).replace(re.escape(repr(mark)), r"'[^']*'")
        return re.fullmatch(pattern, reason) is not None

    def unconfirmed(self, rev: Entry, caps: dict[str, str] | None, out: str) -> str | None:
        """Why the target name ``out`` holds the quantity of ``rev`` only under a config the target's run config does
        not confirm (``rev``'s ``when:``): a reader of the target framework's ``kl`` takes it for what that key
        means under the config it has (OpenRLHF's ``kl`` is the KL loss term only with ``--algo.kl.use_loss``; by
        default the reward-side KL). None when the entry has no ``when`` or the target config confirms it."""
        if not rev.when or rev.condition_holds(self.target_config) is True:
            return None
        fw = self.registry.frameworks[rev.framework]
        lo, hi = self.target.bounds(len(fw.releases)) if self.target.framework == fw.name else (0.0, float("inf"))
        trainer = None if self.target_trainer in (None, NO_TRAINER) else self.target_trainer
        conds = ", ".join(condition_value_text(k, v) for k, v in rev.when)
        said = [condition_value_text(k, self.target_config[k]) for k, _ in rev.when if k in self.target_config]
        assumed = []
        for k, _ in rev.when:
            if k not in self.target_config:
                known, value = fw.config_default(k, trainer, lo, hi, self.target_config)
                if known:
                    assumed.append(f"{k}={value}")
        key = rev.key_template.fill(caps) if rev.key_template is not None and caps is not None else rev.key
        # what the key means for a run that says nothing more: its config with the framework's defaults of the keys
        # the key's `when` entries test
        hits = fw.lookup(key)
        filled = dict(self.target_config)
        for e, _ in hits:
            for k, _ in e.when:
                if k not in filled:
                    known, value = fw.config_default(k, trainer, lo, hi, self.target_config)
                    if known:
                        filled[k] = value
        usual = choose(hits, trainer, lo, hi, filled)
        text = f"{fw.name} {out!r} is {rev.canonical} only when {conds}"
        text += (f", and the target config says {', '.join(said)}" if said and not assumed else
                 "; the target config does not say so" + (f" (the defaults: {', '.join(assumed)})" if assumed else ""))
        if usual is not None and usual[0] is not rev and usual[0].canonical != rev.canonical:
            text += f"; otherwise {fw.name} {out!r} is {usual[0].canonical}"
        return text + " [when]"

    def _origin_entry(self, canon: str) -> Hit | None:
        org = self.origin
        assert org is not None                  # called only with an origin
        fw = framework_of(self.registry, org)
        lo, hi = org.bounds(len(fw.releases))
        return _reverse_in(self.registry, fw, canon, org.trainer, lo, hi, self.config)


def _reverse_in(registry: Registry, fw: FrameworkMapping, canon: str, trainer: str | None, lo: float, hi: float,
                config: Mapping[str, Any]) -> Hit | None:
    """The entry of ``fw`` that writes canonical ``canon`` for ``trainer`` within releases lo..hi."""
    hits: list[Hit] = []
    literal = canon in registry.canonical.metrics     # a name of its own is never a template instance
    for e in fw.entries:
        if not e.reverse:
            continue
        if e.canonical_template is None:
            if e.canonical == canon:
                hits.append((e, None))
        elif not literal and canon.startswith(e.canonical_template.prefix):
            caps = e.canonical_template.match(canon)
            if caps is not None:
                hits.append((e, caps))
    return choose(hits, trainer, lo, hi, config) if hits else None


def _other(split: str | None) -> str | None:
    """The split a value's fidelity is judged under: None for the training split (canonical.yaml's default)."""
    return None if split is None or split == SPLITS.default else split


def _first(range_reason: str, reason: str | None) -> str:
    """A plan's reason once the release range says the meaning varies over it: the range's, then a proof gate's."""
    if reason is None:
        return range_reason
    return f"{range_reason}; {reason}" if reason.startswith(UNPROVEN) else reason
