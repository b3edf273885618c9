"""The translator's plans: what one input key becomes (forward to canonical, then reverse to the target), with the
fidelity and the notes the release range and trainer call for."""
from __future__ import annotations

from dataclasses import replace

from ..schema.facts import SPLITS
from ..schema.model import Entry, FrameworkMapping
from ..spec import Spec
from .entries import Hit, Plan, choose, nearest, reason_of, split_canonical, until_name
from .state import State


class Planning(State):
    # ------------------------------------------------------------------------------------------------ planning
    def _plan(self, key: str) -> Plan | None:
        src = self._src
        if src is None:
            return None
        if src.kind == "canonical":
            split, base = split_canonical(key)
            base = self.registry.canonical.upgrade(base)
            if self.registry.canonical.find(base) is None:
                return None
            return self._to_target(base, split, None, key)
        fw = self._framework(src)
        if key in fw.internal:
            return None
        split, hit = None, self._forward(fw, key, src)
        if hit is None:
            split, rest = fw.split_prefix(key)
            if split is not None:
                hit = self._forward(fw, rest, src)
                if hit is None:
                    # a trainer that prefixed its own keys (TRL KTO v0.8.2-v0.8.6 wrote `eval/...`), prefixed again by
                    # the tracker integration (`train/eval/...`): the inner prefix is the split
                    inner, rest2 = fw.split_prefix(rest)
                    if inner is not None:
                        hit = self._forward(fw, rest2, src)
                        split = inner if inner != SPLITS.default else split
        if hit is None:
            return None
        entry, caps, note, range_reason = hit
        canon = entry.canonical_template.fill(caps) if entry.canonical_template and caps else entry.canonical
        plan = self._to_target(canon, None if split == SPLITS.default else split, entry, key, note)
        if range_reason and plan.approx is None:
            plan = replace(plan, approx=range_reason)
        return plan

    def _forward(self, fw: FrameworkMapping, key: str, src: Spec
                 ) -> tuple[Entry, dict[str, str] | None, str | None, str | None] | None:
        hits = fw.lookup(key)
        if not hits:
            return None
        lo, hi = src.bounds(len(fw.releases))
        chosen = choose(hits, src.trainer, lo, hi, self.flat_config)
        note = range_reason = None
        if chosen is None:       # logged outside the detected/requested releases or by another trainer: use the
            chosen = nearest(hits, src.trainer, lo, hi, self.flat_config) \
                or nearest(hits, None, lo, hi, self.flat_config)          # nearest release's meaning, and say so
            if chosen is None:
                return None
            self._outside.append(key)
            note = self._outside_note(src)
        else:
            e = chosen[0]
            if lo != hi:
                note = self._meaning_note(fw, key, hits, e, src, lo, hi)
            # a range of releases (detected, or FRAMEWORK without a version) may hold the name with another fidelity
            # in some of its releases: then the translation is only as good as the worst of them
            if e.exact and lo != hi:
                # (an entry for a non-default config counts only when the run config confirms it, and the
                # unconditional entry only where no confirmed `when` entry replaces it: `when` entries are
                # alternatives by config, not by release)
                worse = [h for h, _ in hits if h is not e and not h.exact and h.canonical == e.canonical
                         and h.applies(src.trainer, lo, hi)
                         and (h.condition_holds(self.flat_config) is True if h.when else
                              not (e.when and e.since <= h.since and h.until <= e.until))]
                if worse:
                    w = worse[0]
                    range_reason = (f"{reason_of(w)} (in {fw.release_name(w.since)}..{until_name(fw, w)}; the releases "
                                    f"{src.describe(self.registry)} include these, so the release matters)")
        return chosen[0], chosen[1], note, range_reason

    def _meaning_note(self, fw: FrameworkMapping, key: str, hits: list[Hit], chosen: Entry, src: Spec, lo: float,
                      hi: float) -> str | None:
        """A note when ``key`` means different quantities in different releases of the range in use."""
        others = [h for h, _ in hits if h is not chosen and h.canonical != chosen.canonical
                  and h.applies(src.trainer, lo, hi) and h.condition_holds(self.flat_config) is not False
                  and (src.trainer is None or h.trainers is None or chosen.trainers is None
                       or bool(h.trainers & chosen.trainers))]
        if not others:
            return None
        spans = "; ".join(f"{h.canonical} in {fw.release_name(h.since)}..{until_name(fw, h)}" for h in others[:3])
        return (f"{fw.name} {key!r} changed meaning within {src.describe(self.registry)}: {spans}; translated as "
                f"{chosen.canonical} ({fw.release_name(chosen.since)}..{until_name(fw, chosen)}); give the release to "
                f"choose")

    def _outside_note(self, src: Spec) -> str:
        """One note for every key translated with an entry of another release or trainer than the source's."""
        text = (f"{len(self._outside)} key(s) are not logged by {src.describe(self.registry)} according to the "
                f"mappings and were translated with the nearest release's entry: {', '.join(self._outside[:12])}"
                + (" ..." if len(self._outside) > 12 else ""))
        self.notes = [n for n in self.notes if not n.startswith(f"{len(self._outside) - 1} key(s) are not logged")]
        return text

    def _to_target(self, canon: str, split: str | None, fwd: Entry | None, key: str, note: str | None = None) -> Plan:
        canon_key = f"{split}/{canon}" if split else canon
        approx = reason_of(fwd) if fwd is not None else self.input_fidelity.get(canon_key)
        if fwd is None and self.origin_spec is not None and self.target_spec.kind == "framework":
            fwd_like = self._origin_entry(canon)      # the entry the origin wrote this canonical name from
        else:
            fwd_like = fwd
        if self.target_spec.kind == "canonical":
            return Plan(self._canonical_out(canon_key), canon_key, fwd, None, approx, note)
        hit = self._reverse(canon)
        if hit is None:
            tgt = self.target_spec.describe(self.registry)
            return Plan(canon_key, canon_key, fwd, None, approx,
                         note or f"{tgt} has no name for canonical {canon!r}; kept the canonical name")
        rev, caps = hit
        if fwd_like is not None and rev.framework == fwd_like.framework and \
                self.registry.frameworks[rev.framework].same_quantity(fwd_like, rev):
            # the same entry there and back, or a declared rename: the same quantity. A canonical input keeps a
            # reason that is not the entry's own (the release range it came from holds another fidelity), as the
            # direct path adds that reason back after planning
            approx = None if fwd is not None or approx == reason_of(fwd_like) else approx
        else:
            r2 = reason_of(rev)
            if r2 and r2 != approx:
                approx = f"{approx}; {r2}" if approx else r2
        return Plan(self._framework_out(rev, caps, split), canon_key, fwd, rev, approx, note)

    def _canonical_out(self, canon_key: str) -> str:
        ver = self.target_spec.canonical_version
        if not ver:
            return canon_key
        split, base = split_canonical(canon_key)
        base = self.registry.canonical.downgrade(base, ver)
        return f"{split}/{base}" if split else base

    def _framework_out(self, rev: Entry, caps: dict[str, str] | None, split: str | None) -> str:
        name = rev.key_template.fill(caps) if rev.key_template is not None and caps is not None else rev.key
        if split:
            fw = self.registry.frameworks[rev.framework]
            name = (fw.prefix_for(split) or f"{split}/") + name
        return name

    def _reverse(self, canon: str) -> tuple[Entry, dict[str, str] | None] | None:
        if canon in self._rev_cache:
            return self._rev_cache[canon]
        tgt = self.target_spec
        fw = self._framework(tgt)
        lo, hi = tgt.bounds(len(fw.releases))
        chosen = self._reverse_in(fw, canon, self._resolve_target_trainer(), lo, hi)
        self._rev_cache[canon] = chosen
        return chosen

    def _origin_entry(self, canon: str) -> Entry | None:
        org = self.origin_spec
        assert org is not None                  # called only with an origin
        fw = self._framework(org)
        lo, hi = org.bounds(len(fw.releases))
        hit = self._reverse_in(fw, canon, org.trainer, lo, hi)
        return hit[0] if hit else None

    def _reverse_in(self, fw: FrameworkMapping, canon: str, trainer: str | None, lo: float, hi: float
                    ) -> tuple[Entry, dict[str, str] | None] | None:
        """The entry of ``fw`` that writes canonical ``canon`` for ``trainer`` within releases lo..hi."""
        hits: list[tuple[Entry, dict[str, str] | None]] = []
        literal = canon in self.registry.canonical.metrics     # a name of its own is never a template instance
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
        return choose(hits, trainer, lo, hi, self.flat_config) if hits else None
