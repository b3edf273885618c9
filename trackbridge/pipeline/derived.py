"""Stage 3 of a translation: derive, in canonical space, what the source did not log, and rename it into the target
(never over a logged value). A value derived from an approximate input is approximate, with the input's reason;
one renamed into a target name that is not the canonical quantity carries that name's reason too."""
from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping

from ..record import Record
from ..schema.facts import SPLITS
from ..schema.loader import Registry
from ..translate.entries import split_canonical
from ..translate.names import NameMap
from ..translate.report import Translation


class DeriveStage:
    """The derived rules of one run (their history: ``delta``, ``rate``, ``ema`` ...), built on first use."""

    def __init__(self, registry: Registry, mapping_paths: list[str], config: Mapping[str, Any],
                 source: str | None) -> None:
        self.registry, self.mapping_paths = registry, mapping_paths
        self.config, self.source = dict(config), source
        self._deriver: Any = None
        self._built = False
        self._fid_key: tuple[Any, ...] | None = None    # the names whose approximations were given last

    @property
    def deriver(self) -> Any:
        if not self._built:
            self._built = True
            try:
                from ..derive import make_deriver
            except ImportError:         # pragma: no cover - the derive package ships with the core
                return None
            self._deriver = make_deriver(self.registry, self.mapping_paths, config=self.config, source=self.source)
        return self._deriver

    def carry_from(self, old: "DeriveStage | None") -> None:
        """Continue the stateful rules' history of ``old`` (the source was detected anew mid-run)."""
        if old is not None and old._deriver is not None and self.deriver is not None:
            self.deriver.from_state(old._deriver.to_state())

    def canonical_view(self, res: Translation, names: NameMap) -> dict[str, Any]:
        """A translated dict's values by canonical name (what the rules read)."""
        canon: dict[str, Any] = {}
        plans = names.plans
        renamed_to = set(res.renamed.values())
        for key, value in res.metrics.items():
            if key in renamed_to:
                continue
            plan = plans.get(key)
            canon[key if plan is None else plan.canonical] = value
        for key, out in res.renamed.items():
            plan = plans.get(key)
            if plan is not None and out in res.metrics:
                val = res.metrics[out]
                canon.setdefault(plan.canonical, plan.rev.to_canonical(val) if plan.rev is not None else val)
        return canon

    def run(self, res: Translation, canon: dict[str, Any], names: NameMap, note: Callable[[str], None],
            input_fidelity: Mapping[str, str], step: int | None, wall_time: float | None) -> None:
        """Add derived values to ``res`` (in the target's names; listed in ``res.derived``, and in
        ``res.approximate`` when an input was approximate or the target name is not the canonical quantity)."""
        d = self.deriver
        if d is None:
            return
        # the approximations by canonical name depend only on the dict's names (and, for a canonical source, on
        # what the caller knows): given again only when those change
        key = (names, tuple(res.renamed), tuple(res.metrics)) if names.source.kind != "canonical" else None
        if key is None or key != self._fid_key:
            d.fidelity.update(self._canonical_fidelity(res, names, input_fidelity))
            self._fid_key = key
        new = d.apply(canon, step=step, wall_time=wall_time)
        for name in new:
            value = canon[name]
            why_target = None
            if names.target.kind == "canonical":
                out = names.canonical_out(name)
            else:
                split, base = split_canonical(name)
                hit = names.reverse(base)
                if hit is None:
                    out = name
                    note(f"{names.target.describe(self.registry)} has no name for derived {base!r}; kept the "
                         "canonical name")
                else:
                    rev = hit[0]
                    out = names.framework_out(rev, hit[1], split)
                    value = rev.from_canonical(value)
                    why_target = names.against_reference(rev, base, "target", out,
                                                         None if split == SPLITS.default else split)
                    unconfirmed = names.unconfirmed(rev, hit[1], out)
                    if unconfirmed:
                        why_target = f"{why_target}; {unconfirmed}" if why_target else unconfirmed
            if out in res.metrics:
                continue                       # logged under the target's name: a derived value never overwrites
            res.metrics[out] = value
            res.derived.append(out)
            reasons = [r for r in (d.approximate.get(name), why_target) if r]
            if reasons:
                res.approximate[out] = "; ".join(dict.fromkeys(reasons))
        for n in getattr(d, "notes", []):
            note(n)

    @staticmethod
    def _canonical_fidelity(res: Translation, names: NameMap, input_fidelity: Mapping[str, str]) -> dict[str, str]:
        """The approximations of this dict's inputs, by canonical name (what the rules judge their inputs by)."""
        out = dict(input_fidelity) if names.source.kind == "canonical" else {}
        plans = names.plans
        for key in [*res.renamed, *(k for k in res.metrics if k not in res.renamed)]:
            plan = plans.get(key)
            if plan is not None and plan.fwd is not None and plan.canon_reason:
                out[plan.canonical] = plan.canon_reason
        return out

    def warm(self, records: Iterable[Record]) -> int:
        """Feed earlier canonical records to the stateful rules without producing output (a resumed run continues
        with the right history). Returns the number of records seen."""
        d = self.deriver
        if d is None:
            return 0
        n = 0
        for rec in records:
            d.apply(dict(rec.metrics), step=rec.step, wall_time=rec.wall_time)
            n += 1
        return n
