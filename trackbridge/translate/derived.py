"""The translator's derived metrics: computed in canonical space by the derived rules, written under the target's
names, never over a logged value."""
from __future__ import annotations

from typing import Any, Iterable

from ..record import Record
from .entries import reason_of, split_canonical
from .report import Translation
from .state import State


class Deriving(State):
    # ------------------------------------------------------------------------------------------------ derive
    def apply_derive(self, res: Translation, step: int | None = None, wall_time: float | None = None) -> None:
        """Add derived metrics to ``res`` (already translated by this translator, without ``derive``): computed in
        canonical space, written under the target's names, never over a logged value, listed in ``res.derived``
        and, when their inputs were approximate, in ``res.approximate``. The logger calls this once the step is
        known; ``translate(derive=True)`` calls it itself."""
        canon: dict[str, Any] = {}
        for key, value in res.metrics.items():
            plan = self._plans.get(key)
            if key in res.renamed.values():
                continue
            canon[key if plan is None else plan.canonical] = value
        for key, out in res.renamed.items():
            plan = self._plans.get(key)
            if plan is not None and out in res.metrics:
                val = res.metrics[out]
                canon.setdefault(plan.canonical, plan.rev.to_canonical(val) if plan.rev is not None else val)
        self._derive_into(res, canon, step, wall_time)

    def _derive_into(self, res: Translation, canon: dict[str, Any], step: int | None,
                     wall_time: float | None) -> None:
        d = self._get_deriver()
        if d is None:
            return
        d.fidelity.update(self._canonical_fidelity(res))
        new = d.apply(canon, step=step, wall_time=wall_time)
        target_is_canonical = self.target_spec.kind == "canonical"
        for name in new:
            value = canon[name]
            if target_is_canonical:
                out, rev = self._canonical_out(name), None
            else:
                split, base = split_canonical(name)
                hit = self._reverse(base)
                if hit is None:
                    out, rev = name, None
                    note = (f"{self.target_spec.describe(self.registry)} has no name for derived {base!r}; kept the "
                            f"canonical name")
                    if note not in self.notes:
                        self.notes.append(note)
                else:
                    rev = hit[0]
                    out = self._framework_out(rev, hit[1], split)
                    value = rev.from_canonical(value)
            if out in res.metrics:
                continue                       # logged under the target's name: a derived value never overwrites
            res.metrics[out] = value
            res.derived.append(out)
            reasons = [r for r in (d.approximate.get(name), reason_of(rev)) if r]
            if reasons:
                res.approximate[out] = "; ".join(dict.fromkeys(reasons))
        for n in getattr(d, "notes", []):
            if n not in self.notes:
                self.notes.append(n)

    def _canonical_fidelity(self, res: Translation) -> dict[str, str]:
        """The approximations of this dict's inputs, by canonical name (what the deriver judges its inputs by)."""
        out = dict(self.input_fidelity) if self.source_spec.kind == "canonical" else {}
        for key, name in res.renamed.items():
            plan = self._plans.get(key)
            if plan is not None and plan.fwd is not None and not plan.fwd.exact:
                out[plan.canonical] = reason_of(plan.fwd) or "approximate"
        return out

    def warm_derive(self, records: Iterable[Record]) -> int:
        """Feed earlier canonical records to the stateful derived rules (``delta``, ``rate`` ...) without producing
        output, so that a resumed run continues with the right history. Returns the number of records seen."""
        d = self._get_deriver()
        n = 0
        if d is None:
            return 0
        for rec in records:
            d.apply(dict(rec.metrics), step=rec.step, wall_time=rec.wall_time)
            n += 1
        return n

    def _get_deriver(self) -> Any:
        if self._deriver is None:
            try:
                from ..derive import make_deriver
            except ImportError:
                return None
            self._deriver = make_deriver(self.registry, self._mapping_paths, config=self.translate_config(),
                                         source=self.source_spec_text)
        return self._deriver
