"""The :class:`Translator`: one run's translation, as explicit stages.

1. **resolve** the source and the target (:mod:`.resolve`): what a spec leaves out is detected from the keys (and
   the run config), the target's trainer is the counterpart of the source's;
2. **translate names** into canonical names and 4. **rename into the target**, through the compiled, immutable
   :class:`~.names.NameMap` of the resolved source and target (one plan per key, with its fidelity);
3. **derive**, in canonical space, what the source did not log (:class:`~.derived.DeriveStage`), renamed into the
   target like the rest.

Every path goes through it: ``translate()``, the CLI, the logger (source names to canonical, then canonical to the
names asked for), replay, migrate and compare (:class:`trackbridge.pipeline.Pipeline`), the demo and the
integrations. Each translated dict comes back as a :class:`~.report.Translation`; a run's reports add up in
:class:`trackbridge.pipeline.Stats`.
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping

from ..detect import Detection
from ..record import Record
from ..schema.loader import Registry, load_registry
from ..schema.model import FrameworkMapping
from ..schema.proofs import UNPROVEN
from ..schema.spec import Spec, parse_spec
from ..translate.entries import (
    NOT_PLANNED,
    Marks,
    Plan,
    config_view,
    flatten_config,
    owner,
    same_value,
    split_canonical,
)
from ..translate.names import NameMap
from ..translate.report import Translation
from ..translate.resolve import TargetFound, framework_of, parse_origin, target_trainer, unknown_source_note
from .derived import DeriveStage
from .source import UNKNOWN, SourceResolver


class Translator:
    """A compiled, reusable translation from one naming scheme to another.

    ``source``: ``auto``, ``canonical`` or ``FRAMEWORK[/TRAINER][@VERSION]``; ``target``: ``canonical[@VERSION]`` or
    ``FRAMEWORK[/TRAINER][@VERSION]``. ``config`` is the run's config in the *source* framework's names (it decides
    entries whose meaning depends on it, the reductions' config switches and level counts, and
    :meth:`translate_config`). ``mappings`` adds user mapping files. With ``derive=True`` derived rules fill in
    canonical metrics the source did not log, in the target's names.

    Trainers left out are resolved (see docs/mapping-format.md, "Trainer resolution"): a source's from its keys
    within the framework and releases given; a target's as the counterpart of the source's trainer (same trainer,
    else the first declared trainer of the same kind alive in the target's releases). With a canonical source,
    ``origin`` names the framework the canonical names came from (a spool's ``RunInfo.source``) and ``fidelity``
    their approximations (canonical name -> reason), so that renaming them again is judged as the direct path is.
    A source no framework explains is *unknown*: its names pass through unchanged and a note says so.
    """

    def __init__(self, source: str = "auto", target: str = "canonical", *, mappings: Iterable[str] | None = None,
                 config: Mapping[str, Any] | None = None, derive: bool = False,
                 registry: Registry | None = None, origin: str | None = None,
                 fidelity: Mapping[str, str] | None = None) -> None:
        self.registry = registry or load_registry(mappings)
        self.source_spec = parse_spec(source, self.registry)
        self.target_spec = parse_spec(target, self.registry, allow_auto=False)
        self.origin_spec = parse_origin(origin, self.registry) if self.source_spec.kind == "canonical" else None
        self.input_fidelity = fidelity if isinstance(fidelity, dict) else dict(fidelity or {})   # live: a logger adds
        self.raw_config = dict(config or {})
        self.flat_config = config_view(self.raw_config)     # `args.x` of a TensorBoard folder is found as `x`
        self._derive = derive
        self._mapping_paths = list(mappings or [])
        self.sources = SourceResolver(self.registry, self.source_spec, self.flat_config)    # stage 1
        self._reset_run()

    def _reset_run(self) -> None:
        """Forget what one run's translations left (its notes, derived-rule history; the keys seen and the source
        detected are the resolver's: :meth:`SourceResolver.fresh`)."""
        self._notes: list[str] = []
        self._noted: set[str] = set()          # the same, for the hot loop's membership test
        self._marked: set[str] = set()         # keys whose plan's marks this run has taken note of
        self._outside: dict[str, None] = {}
        self._kept: dict[str, None] = {}                # canonical names the target has no name for
        self._unset: dict[str, tuple[str, ...]] = {}    # key -> config keys that would change its meaning, unset
        self._defaults: dict[tuple[str, str], Any] = {}
        self._target: TargetFound | None = None
        self._names: NameMap | None = None
        self._deriving: DeriveStage | None = None
        self._notes_cache: tuple[Any, list[str]] | None = None

    # ------------------------------------------------------------------------------------------------ stage 1
    @property
    def needs_detection(self) -> bool:
        """Whether the source is still to be detected from keys (``auto``, or a framework without its trainer)."""
        return self.sources.needs_detection

    @property
    def detection(self) -> Detection | None:
        """How the source was detected (None before any detection, or when the spec left nothing to detect)."""
        return self.sources.detection

    @property
    def _src(self) -> Spec | None:
        return self.sources.found

    def _detect(self, keys: Iterable[Any]) -> None:
        if not self.sources.observe(keys):
            return
        old = self._deriving               # a new source: its own name map, target trainer and derived rules
        self._names = None
        if self.target_spec.kind == "framework" and not self.target_spec.trainer:
            self._target = None
        if old is not None:                # keep the stateful rules' history under the newly detected source
            self._deriving = None
            self._derive_stage().carry_from(old)

    def resolve_source(self, keys: Iterable[str]) -> None:
        """Detect the source (framework, trainer, releases: what the spec leaves out) from ``keys`` once and keep
        it: later dicts are translated with it even if they bring new keys (a stored run read with look-ahead).
        A source no framework explains is unknown: names pass through unchanged, and a note says so."""
        if self.needs_detection:
            self._detect(keys)
        if self.sources.pin():
            self._names = None

    def pin_source(self, keys: Iterable[str]) -> bool:
        """Detect the source from ``keys`` and keep it if found (True); else leave it to be detected (False)."""
        if self.needs_detection:
            self._detect(keys)
        return self.sources.try_pin()

    def _source_trainer(self) -> tuple[FrameworkMapping | None, str | None]:
        """The framework and trainer the input names come from (the source's, or a canonical source's origin)."""
        sp = self._src if self._src is not None and self._src.kind == "framework" else self.origin_spec
        if sp is None or sp.kind != "framework":
            return None, None
        return framework_of(self.registry, sp), sp.trainer

    def _resolve_target(self, keys: Iterable[Any]) -> TargetFound:
        if self._target is None:
            self._target = target_trainer(self.registry, self.target_spec, self._source_trainer(), keys,
                                          self.flat_config)
            self._names = None
        return self._target

    # ------------------------------------------------------------------------------------------------ the map
    def _name_map(self, keys: Iterable[Any] = ()) -> NameMap:
        """The compiled name map of the source and target resolved so far (stage 1 done for ``keys``)."""
        names = self._names
        if names is not None:
            return names
        target = self._resolve_target(keys).trainer if self.target_spec.kind == "framework" else None
        src = self._src if self._src is not None else UNKNOWN
        names = self._names = NameMap(self.registry, src, self.target_spec, target, config=self.flat_config,
                                      target_config=self._target_config(), origin=self.origin_spec,
                                      input_fidelity=self.input_fidelity)
        return names

    def _target_config(self) -> dict[str, Any]:
        """The run config in the target framework's names: the source's own config when both are one framework,
        else carried through the canonical config names (``ppo_epochs``, ``gradient_accumulation_steps`` ...)."""
        tgt = self.target_spec
        if tgt.kind != "framework":
            return {}
        src_fw, _ = self._source_trainer()
        if src_fw is not None and src_fw.name == tgt.framework:
            return self.flat_config
        canon = self.translate_config()
        out: dict[str, Any] = {}
        for c in framework_of(self.registry, tgt).config:
            if c.canonical and c.canonical in canon and c.key not in out:
                val = canon[c.canonical]
                if c.scale not in (0.0, 1.0) and isinstance(val, (int, float)) and not isinstance(val, bool):
                    val = val / c.scale
                out[c.key] = val
        return out

    # ------------------------------------------------------------------------------------------------ public
    @property
    def source(self) -> str:
        """The source naming scheme for people: the resolved spec, ``(detected, confidence ...)`` when it was
        detected, ``auto (undetected)`` before then, ``unknown`` when no framework explains the keys."""
        src, det = self.sources.found, self.sources.detection
        if src is None:
            return "auto (undetected)"
        if src.kind == "unknown":
            return "unknown (names passed through)"
        text = src.describe(self.registry)
        if det is not None and src is det.spec and self.source_spec.kind == "auto":
            text += f" (detected, confidence {det.confidence:.2f})"
        return text

    @property
    def source_spec_text(self) -> str | None:
        """The resolved source as a plain spec (``trl/grpo@v0.17.0..v1.16.0``), None while undetected."""
        return self._src.describe(self.registry) if self._src is not None and self._src.kind != "unknown" else None

    @property
    def notes(self) -> list[str]:
        """What the translations so far need said, each once: the releases asked for, the source and target
        resolution, keys outside the releases in use (one note, the final count), the config defaults assumed,
        meaning changes, derived-rule notes."""
        sources = self.sources
        state = (len(self._notes), len(self._outside), len(self._kept), len(self._defaults), len(self._unset),
                 id(sources.found), id(self._target), id(sources.detection), sources.pinned, bool(sources.seen))
        cached = self._notes_cache
        if cached is None or cached[0] != state:
            cached = self._notes_cache = (state, self._compose_notes())
        return list(cached[1])

    def _compose_notes(self) -> list[str]:
        out = [n for n in (self.source_spec.note, self.target_spec.note, self.sources.note) if n]
        if self._target is not None and self._target.note:
            out.append(self._target.note)
        if self._src is not None and self._src.kind == "unknown" or (self._src is None and self.sources.seen):
            out.append(unknown_source_note(self.detection))
        out += self._notes
        if self._outside:
            keys = list(self._outside)
            src = self._src.describe(self.registry) if self._src is not None else "the source"
            out.append(f"{len(keys)} key(s) are not logged by {src} according to the mappings and were translated "
                       f"with the nearest release's entry: {', '.join(keys[:12])}" + (" ..." if len(keys) > 12 else ""))
        if self._kept:
            names = list(self._kept)
            out.append(f"{self.target_spec.describe(self.registry)} has no name for {len(names)} canonical name(s); "
                       f"kept as they are: {', '.join(names[:12])}" + (" ..." if len(names) > 12 else ""))
        if self._unset:
            items = [f"{k} ({', '.join(v)})" for k, v in self._unset.items()]
            out.append(f"{len(items)} key(s) mean another quantity under config settings the run config does not "
                       f"give, and were read with the framework's default meaning: {'; '.join(items[:8])}"
                       + (" ..." if len(items) > 8 else "") + "; pass the run config to settle them")
        if self._defaults:
            by_fw: dict[str, list[str]] = {}
            for (fw, key), value in self._defaults.items():
                by_fw.setdefault(fw, []).append(f"{key}={value}")
            out.append("the run config does not set " + "; ".join(
                f"{', '.join(v)} ({fw}'s default, assumed)" for fw, v in by_fw.items())
                + ": the keys' meanings and their exact or approximate marks were judged with these")
        return list(dict.fromkeys(out))

    def translate(self, metrics: Mapping[str, Any], *, step: int | None = None,
                  wall_time: float | None = None, notes: bool = True, into: Translation | None = None,
                  canonical: bool = False) -> Translation:
        """Translate one logged dict into the target's names (derived values added when derivation is on);
        ``step``/``wall_time`` feed the stateful derived rules. ``notes=False``: ``res.notes`` left empty (a caller
        that reads :attr:`notes` once at the end, as the pipeline does). ``into``: a fresh Translation to fill (the
        pipeline's per-record report) instead of a new one; ``canonical``: also keep the values by canonical name
        in ``res.canonical`` (what the derived rules read: the pipeline's Derive stage). Raises TypeError for
        anything but a mapping."""
        if not isinstance(metrics, Mapping):
            raise TypeError(f"translate() takes a dict of metric name -> value, not {type(metrics).__name__}")
        names = self._names
        sources = self.sources
        # stage 1, redone only while the source is being detected and new keys arrive
        if sources.found is None or (sources.detecting and not sources.pinned and
                                 (names is None or not metrics.keys() <= names.plans.keys())):
            self._detect(metrics)
        names = self._name_map(metrics)
        res = self._rename(metrics, names, into, {} if canonical or self._derive else None)     # stages 2 and 4
        if self._derive:
            self._derive_into(res, names, step, wall_time)              # stage 3, as the pipeline runs it
        if notes:
            res.notes = self.notes
        return res

    __call__ = translate

    def _rename(self, metrics: Mapping[str, Any], names: NameMap, into: Translation | None,
                canon: dict[str, Any] | None) -> Translation:
        """Stages 2 and 4 for one dict: every key through its plan; two inputs that name one output are kept once
        (the same value) or the primary one wins and the other passes through as a conflict. ``canon``: filled
        with the values by canonical name (a key passed through under its own name), kept in ``res.canonical``."""
        res = into if into is not None else Translation()
        res.source = self.source
        res.canonical = canon
        out_metrics, renamed, approximate, conflicts = res.metrics, res.renamed, res.approximate, res.conflicts
        plans = names.plans
        noted, marked = self._noted, self._marked
        mapped = 0
        for key, value in metrics.items():
            plan = plans.get(key, NOT_PLANNED)
            if plan is NOT_PLANNED:
                if not isinstance(key, str):
                    raise TypeError(f"metric names must be strings; got {key!r} ({type(key).__name__})")
                plan = names.plan(key)
            if plan is None:
                if key in out_metrics:
                    # a key passed through under its own name that an earlier key was translated to: the input
                    # that is literally so named keeps it, the translated one goes back to its own name (as when
                    # the translated key comes second), so neither value is lost and the order does not matter
                    try:
                        old_key, old_value, _ = owner(metrics, plans, key, key, conflicts)
                    except KeyError:
                        conflicts[key] = key
                        continue
                    out_metrics[old_key] = old_value
                    conflicts[old_key] = key
                    renamed.pop(old_key, None)
                    approximate.pop(key, None)
                    mapped -= 1
                out_metrics[key] = value
                res.unmapped.append(key)
                if canon is not None:
                    canon.setdefault(key, value)
                continue
            if plan.note is not None and plan.note not in noted:
                self._note(plan.note)
            if plan.marks is not None and key not in marked:
                self._mark(key, plan, plan.marks)
            out = plan.out
            if canon is not None:
                canon.setdefault(plan.canonical, value if plan.to_canon is None else plan.to_canon(value))
            val = value if plan.conv is None else plan.conv(value)
            if out in out_metrics:
                # two inputs name one quantity (an old and a new name logged side by side, or two aliases)
                if same_value(out_metrics[out], val):
                    mapped += 1          # the same value twice: kept once, and said so
                    renamed[key] = out
                    if not plan.approx:  # an exact key vouches for the value another key gave approximately
                        approximate.pop(out, None)
                    elif out in approximate and plan.approx.startswith(UNPROVEN) \
                            and not approximate[out].startswith(UNPROVEN):
                        approximate[out] = plan.approx      # a key stated equal says more than one stated different
                    note = f"{key!r} and another key both give {out!r} with the same value; kept once"
                    if note not in noted:
                        self._note(note)
                    continue
                # different values: the primary name (the one the framework logs at that release) keeps the
                # canonical name; the other is passed through under its own name and reported
                try:
                    old_key, old_value, old_primary = owner(metrics, plans, out, key, conflicts)
                except KeyError:             # held by a key passed through under that very name: it keeps it
                    conflicts[key] = out
                    out_metrics[key] = value
                    continue
                if plan.primary and not old_primary:
                    out_metrics[old_key] = old_value
                    conflicts[old_key] = out
                    renamed.pop(old_key, None)
                    approximate.pop(out, None)
                    mapped -= 1
                else:
                    conflicts[key] = out
                    out_metrics[key] = value
                    continue
            out_metrics[out] = val
            mapped += 1
            if out != key:
                renamed[key] = out
            if plan.approx:
                approximate[out] = plan.approx
        res.mapped = mapped
        return res

    def _note(self, text: str) -> None:
        if text not in self._noted:
            self._noted.add(text)
            self._notes.append(text)

    def _mark(self, key: str, plan: Plan, marks: Marks) -> None:
        self._marked.add(key)
        if marks.outside:
            self._outside[key] = None
        if marks.no_target_name:
            self._kept[plan.canonical] = None
        for fw, k, v in marks.defaults:
            self._defaults.setdefault((fw, k), v)
        if marks.unset:
            self._unset.setdefault(key, marks.unset)

    # ------------------------------------------------------------------------------------------------ stage 3
    def _derive_stage(self) -> DeriveStage:
        if self._deriving is None:
            self._deriving = DeriveStage(self.registry, self._mapping_paths, self.translate_config(),
                                         self.source_spec_text)
        return self._deriving

    def apply_derive(self, res: Translation, step: int | None = None, wall_time: float | None = None, *,
                     notes: bool = True) -> None:
        """Add derived metrics to ``res`` (already translated by this translator, without ``derive``): computed in
        canonical space, written under the target's names, never over a logged value, listed in ``res.derived``
        and, when their inputs were approximate, in ``res.approximate``. The logger calls this once the step is
        known; ``translate(derive=True)`` calls it itself."""
        self._derive_into(res, self._name_map(res.metrics), step, wall_time)
        if notes:
            res.notes = self.notes

    def _derive_into(self, res: Translation, names: NameMap, step: int | None, wall_time: float | None) -> None:
        """Stage 3: the derived rules read the values by canonical name the translation kept (``res.canonical``),
        else those its output gives back (a translation made without them)."""
        stage = self._derive_stage()
        canon = res.canonical if res.canonical is not None else stage.canonical_view(res, names)
        stage.run(res, canon, names, self._note, self.input_fidelity, step, wall_time)

    def warm_derive(self, records: Iterable[Record]) -> int:
        """Feed earlier canonical records to the stateful derived rules (``delta``, ``rate`` ...) without producing
        output, so that a resumed run continues with the right history. Returns the number of records seen."""
        return self._derive_stage().warm(records)

    # ------------------------------------------------------------------------------------------------ the rest
    def fresh(self) -> "Translator":
        """A translator with the same settings and none of the state a translation leaves (detection unless the
        source was pinned, notes, derived-rule history); the compiled name map of a fixed source is shared."""
        if not self.needs_detection and self._src is not None and self._names is None:
            found = self._target or target_trainer(self.registry, self.target_spec, self._source_trainer(), (),
                                                   self.flat_config)
            if not found.from_keys:     # compiled once, here, and shared by every fresh copy
                self._target = found
                self._name_map(())
        new = Translator.__new__(Translator)
        new.__dict__.update(self.__dict__)
        names, target = self._names, self._target
        new.sources = self.sources.fresh()
        new._reset_run()
        if not new.needs_detection and not (target is not None and target.from_keys):
            new._names, new._target = names, target        # nothing about them depends on this run's keys
        return new

    def translate_config(self, config: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Canonical config names (``kl_coef``, ``num_generations`` ...) found in a run config (nested or dotted)."""
        flat = flatten_config(config) if config is not None else self.flat_config
        out: dict[str, Any] = {}
        src, _ = self._source_trainer()
        spec = self._src if self._src is not None and self._src.kind == "framework" else self.origin_spec
        frameworks = [src] if src is not None else list(self.registry.frameworks.values())
        trainer = spec.trainer if spec is not None else None
        # trackers nest the arguments one level down at times (transformers' TensorBoard text `args`, a wandb
        # config group): a key is also found under one wrapping key
        wrapped = {k.split(".", 1)[1]: v for k, v in flat.items()
                   if "." in k and isinstance(flat.get(k.split(".", 1)[0]), Mapping)}
        for fw in frameworks:
            lo, hi = spec.bounds(len(fw.releases)) if spec is not None else (0, float("inf"))
            for c in fw.config:
                if not c.canonical or c.canonical in out:
                    continue
                if c.key not in flat and c.key not in wrapped:
                    continue
                if trainer and c.trainers is not None and trainer not in c.trainers:
                    continue
                if c.until < lo or c.since > hi:
                    continue
                val = flat[c.key] if c.key in flat else wrapped[c.key]
                if c.scale != 1.0 and isinstance(val, (int, float)) and not isinstance(val, bool):
                    val = val * c.scale
                out[c.canonical] = val
        for name in self.registry.canonical.config:     # already canonical names are kept
            if name in flat and name not in out:
                out[name] = flat[name]
        return out

    def target_name(self, canonical_key: str) -> str:
        """The target-scheme name of one canonical key (the key itself when the target has none)."""
        return self._name_map((canonical_key,)).target_name(canonical_key)

    def canonical_key(self, key: str) -> str | None:
        """The canonical name (with its split prefix) an input key translates to; None when it has none."""
        plan = self._name_map((key,)).plan(key)
        return plan.canonical if plan is not None else None


__all__ = ["Translator", "split_canonical"]
