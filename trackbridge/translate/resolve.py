"""Stage 1 of a translation: resolve the source and the target (docs/mapping-format.md, "Trainer resolution").

* the source: what a spec leaves out (framework, trainer, releases) is detected from the keys, restricted to what
  was given; a run config naming a trainer's own fields settles a tie (:func:`detect_source`). When no framework
  explains the keys well enough, the source is unknown: names pass through unchanged.
* the target: a framework target without a trainer gets the counterpart of the source's trainer (the same trainer,
  else the first declared trainer of the same kind alive in the target's releases); with no source trainer at all,
  the trainer with names for most of the keys (:func:`target_trainer`).

Pure functions of their arguments: the :class:`~trackbridge.pipeline.Translator` keeps what was resolved and
compiles a :class:`~trackbridge.translate.names.NameMap` from it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from ..detect import Detection, detect
from ..schema.loader import Registry
from ..schema.model import FrameworkMapping
from ..schema.spec import Spec, SpecError, parse_spec
from .entries import split_canonical

NO_TRAINER = "\0none"          # the target framework has no counterpart trainer: only names every trainer shares


def framework_of(registry: Registry, spec: Spec) -> FrameworkMapping:
    assert spec.framework is not None, spec
    return registry.frameworks[spec.framework]


def needs_detection(registry: Registry, spec: Spec) -> bool:
    """``auto``, or a framework given without its trainer while it has several (``trl@1.16.0``, ``verl``)."""
    if spec.kind == "auto":
        return True
    return spec.kind == "framework" and spec.trainer is None and len(framework_of(registry, spec).trainers) > 1


def parse_origin(origin: str | None, registry: Registry) -> Spec | None:
    """The framework spec a canonical stream was translated from (``RunInfo.source``, perhaps with a
    ``(detected, ...)`` remark); None when unknown or canonical."""
    if not origin:
        return None
    text = str(origin).split(" (", 1)[0].strip()
    try:
        sp = parse_spec(text, registry)
    except SpecError:
        return None
    return sp if sp.kind == "framework" else None


@dataclass(frozen=True)
class SourceFound:
    """What :func:`detect_source` found: the spec to translate with (None: cannot tell), the detection, and the
    note to give (a trainer assumed or detected inside a framework that was named)."""

    spec: Spec | None
    detection: Detection
    note: str | None = None


def detect_source(registry: Registry, given: Spec, keys: Iterable[str],
                  config: Mapping[str, Any] | None) -> SourceFound:
    """Detect what ``given`` (``auto`` or a framework without its trainer) leaves out from ``keys``."""
    within = given if given.kind == "framework" else None
    det = detect(set(keys), registry, within=within, config=dict(config or {}))
    if within is not None and det.spec is None:
        det.spec = within          # no trainer explains the keys: every trainer's entries stay usable
    if det.spec is None:
        return SourceFound(None, det)
    note = None
    if within is not None or "assuming" in (det.reason or ""):
        text = given.describe(registry)
        if det.spec is given:
            note = f"source {text}: the trainer could not be told from the keys ({det.reason}); every trainer's " \
                   "names used"
        else:
            note = f"source {text}: trainer detected from the keys as {det.source} ({det.reason})"
    return SourceFound(det.spec, det, note)


def unknown_source_note(det: Detection | None) -> str:
    """The note of a source no framework explains: names pass through unchanged, with the nearest guesses."""
    if det is None:
        return "could not tell which framework logged these names (no keys); names passed through unchanged"
    guesses = f"; nearest: {', '.join(det.candidates[:3])}" if det.candidates else ""
    return (f"could not tell which framework logged these names ({det.reason}{guesses}); names passed through "
            "unchanged (name the source, FRAMEWORK[/TRAINER][@RELEASE], to translate them)")


@dataclass(frozen=True)
class TargetFound:
    trainer: str | None                 # None: the target names no trainer (or has one); NO_TRAINER: no counterpart
    note: str | None = None
    from_keys: bool = False             # chosen from the keys (no source trainer): redone when the keys change


def target_trainer(registry: Registry, target: Spec, source: tuple[FrameworkMapping | None, str | None],
                   keys: Iterable[str], config: Mapping[str, Any] | None) -> TargetFound:
    """The target trainer when the target spec leaves it out: the counterpart of the source's trainer (see
    docs/mapping-format.md); with no source trainer, the one with names for most of ``keys``."""
    if target.kind != "framework" or target.trainer:
        return TargetFound(target.trainer)
    fw = framework_of(registry, target)
    if len(fw.trainers) <= 1:
        return TargetFound(None)
    lo, hi = target.bounds(len(fw.releases))
    newest = min(hi, len(fw.releases) - 1)
    alive = [t for t in fw.trainers if fw.trainer_alive(t, lo, hi)]
    alive.sort(key=lambda t: 0 if fw.trainer_alive(t, newest, newest) else 1)    # alive in the newest first
    src_fw, src_trainer = source
    label = target.describe(registry)
    if src_trainer is not None and src_fw is not None:
        kind = src_fw.trainer_kind(src_trainer)
        same = [t for t in alive if kind is not None and fw.trainer_kind(t) == kind]
        if kind is None and src_trainer in alive and fw is src_fw:
            same = [src_trainer]        # a trainer of no declared kind is only its own counterpart
        choice = src_trainer if src_trainer in same else same[0] if same else NO_TRAINER
        what = f"{src_fw.name}/{src_trainer} ({kind or 'no kind'})"
        if choice == NO_TRAINER:
            note = (f"target {label}: no trainer of kind {kind!r} (the counterpart of {what}); only names shared by "
                    f"every {fw.name} trainer are used, other canonical names pass through")
        else:
            note = f"target {label}: trainer {choice}, the counterpart of {what}"
        return TargetFound(choice, note)
    keys = [k for k in keys if isinstance(k, str)]
    score = {t: sum(1 for k in keys if _has_reverse(fw, split_canonical(k)[1], t, lo, hi)) for t in alive}
    choice2 = max(alive, key=lambda t: score[t]) if alive else None     # ties: declared order
    note = (f"target {label}: the source's trainer is unknown; trainer {choice2} chosen as the one with names for "
            f"most of the keys ({score.get(choice2 or '', 0)} of {len(keys)})")
    return TargetFound(choice2, note, from_keys=True)


def _has_reverse(fw: FrameworkMapping, canon: str, trainer: str, lo: float, hi: float) -> bool:
    for e in fw.entries:
        if e.reverse and e.trainers is not None and trainer in e.trainers and e.applies(trainer, lo, hi):
            if e.canonical == canon or (e.canonical_template is not None and e.canonical_template.match(canon)):
                return True
    return False
