"""The translator's source and target: detecting what the source spec leaves out (framework, trainer, releases)
from the keys, and resolving the target's trainer as the counterpart of the source's (docs/mapping-format.md,
"Trainer resolution")."""
from __future__ import annotations

from typing import Any, Mapping

from ..detect import Detection, detect
from ..schema.model import FrameworkMapping
from .entries import split_canonical
from .state import State


class Resolution(State):
    # ------------------------------------------------------------------------------------------------ detection
    def _needs_detection(self) -> bool:
        """``auto``, or a framework given without its trainer while it has several (``trl@1.16.0``, ``verl``)."""
        if self._pinned:
            return False
        sp = self.source_spec
        if sp.kind == "auto":
            return True
        return (sp.kind == "framework" and sp.trainer is None
                and len(self._framework(sp).trainers) > 1)

    def _maybe_detect(self, metrics: Mapping[str, Any]) -> None:
        if not self._needs_detection():
            return
        new = {k for k in metrics if isinstance(k, str)} - self._seen
        if not new and self._src is not None:
            return
        self._seen |= new
        within = self.source_spec if self.source_spec.kind == "framework" else None
        det = detect(self._seen, self.registry, within=within, config=self.flat_config)
        if within is not None and det.spec is None:
            det.spec = within          # no trainer explains the keys: every trainer's entries stay usable
        if det.spec is None:
            if self.detection is None or self._src is None:
                self.detection = det
            return
        if self._src is None or det.spec != self._src:
            self.detection = det
            self._src = det.spec
            if within is not None or "assuming" in (det.reason or ""):
                self._note_source_trainer(det)     # a trainer assumed from ambiguous keys is said, as when given
            self._plans.clear()
            self._rev_cache.clear()
            if self.target_spec.kind == "framework" and not self.target_spec.trainer:
                self._tgt_trainer = False
            old, self._deriver = self._deriver, None
            if old is not None:          # keep the stateful rules' history under the newly detected source
                new = self._get_deriver()
                if new is not None:
                    new.from_state(old.to_state())

    def _note_source_trainer(self, det: Detection) -> None:
        given = self.source_spec.describe(self.registry)
        if det.spec is self.source_spec:
            text = (f"source {given}: the trainer could not be told from the keys ({det.reason}); "
                    f"every trainer's names used")
        else:
            text = f"source {given}: trainer detected from the keys as {det.source} ({det.reason})"
        self.notes = [n for n in self.notes if not n.startswith(f"source {given}: ")] + [text]
        self._src_note = text

    # ------------------------------------------------------------------------------------------------ trainers
    def _source_trainer(self) -> tuple[FrameworkMapping | None, str | None]:
        """The framework and trainer the input names come from (the source's, or a canonical source's origin)."""
        sp = self._src if self._src is not None and self._src.kind == "framework" else self.origin_spec
        if sp is None or sp.kind != "framework":
            return None, None
        return self._framework(sp), sp.trainer

    def _resolve_target_trainer(self, metrics: Mapping[str, Any] | None = None) -> str | None:
        """The target trainer when the target spec leaves it out: the counterpart of the source's trainer (see
        docs/mapping-format.md). ``\0none`` when the target framework has no trainer of that kind (only names every
        trainer shares are then used)."""
        tgt = self.target_spec
        if tgt.kind != "framework" or tgt.trainer:
            return tgt.trainer
        if self._tgt_trainer is not False:
            return self._tgt_trainer            # type: ignore[return-value]
        fw = self._framework(tgt)
        lo, hi = tgt.bounds(len(fw.releases))
        newest = min(hi, len(fw.releases) - 1)
        alive = [t for t in fw.trainers if fw.trainer_alive(t, lo, hi)]
        alive.sort(key=lambda t: 0 if fw.trainer_alive(t, newest, newest) else 1)    # alive in the newest first
        if len(fw.trainers) <= 1:
            self._tgt_trainer = None
            return None
        src_fw, src_trainer = self._source_trainer()
        label = tgt.describe(self.registry)
        choice: str | None
        if src_trainer is not None and src_fw is not None:
            kind = src_fw.trainer_kind(src_trainer)
            same = [t for t in alive if kind is not None and fw.trainer_kind(t) == kind]
            if kind is None and src_trainer in alive and fw is src_fw:
                same = [src_trainer]        # a trainer of no declared kind is only its own counterpart
            if src_trainer in same:
                choice = src_trainer
            elif same:
                choice = same[0]
            else:
                choice = "\0none"
            what = f"{src_fw.name}/{src_trainer} ({kind or 'no kind'})"
            if choice == "\0none":
                note = (f"target {label}: no trainer of kind {kind!r} (the counterpart of {what}); only names "
                        f"shared by every {fw.name} trainer are used, other canonical names pass through")
            else:
                note = f"target {label}: trainer {choice}, the counterpart of {what}"
        else:
            keys = [k for k in (metrics or {}) if isinstance(k, str)]
            score = {t: sum(1 for k in keys if self._has_reverse(fw, split_canonical(k)[1], t, lo, hi))
                     for t in alive}
            choice = max(alive, key=lambda t: score[t]) if alive else None     # ties: declared order
            note = (f"target {label}: the source's trainer is unknown; trainer {choice} chosen as the one with "
                    f"names for most of the keys ({score.get(choice or '', 0)} of {len(keys)})")
            self._tgt_from_keys = True
        self._tgt_note = note
        if note not in self.notes:
            self.notes.append(note)
        self._tgt_trainer = choice
        self._rev_cache.clear()
        return choice

    @staticmethod
    def _has_reverse(fw: FrameworkMapping, canon: str, trainer: str, lo: float, hi: float) -> bool:
        for e in fw.entries:
            if e.reverse and e.trainers is not None and trainer in e.trainers and e.applies(trainer, lo, hi):
                if e.canonical == canon or (e.canonical_template is not None and e.canonical_template.match(canon)):
                    return True
        return False
