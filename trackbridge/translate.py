"""Hub-and-spoke translation of logged metric dicts.

Every translation goes source -> canonical -> target. A key is looked up once per :class:`Translator` and its plan
(output name, value transform, fidelity) is cached, so translating a dict is one dictionary lookup per key.
Tracker prefixes (``train/``, ``eval/``, ``eval_`` ...) are understood and kept as a split: canonical names of eval
records carry an ``eval/`` prefix, and a framework target gets its own eval prefix back. Unknown keys pass through
unchanged and are reported; nothing is dropped.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Mapping

from .detect import Detection, detect
from .schema.facts import SPLITS  # canonical.yaml splits: train (the default, no prefix), eval/, test/
from .schema.loader import Registry, load_registry
from .schema.model import Entry, FrameworkMapping
from .spec import Spec, SpecError, parse_spec


@dataclass
class Report:
    """What happened to the names: the one bookkeeping type of every path (a single dict's :class:`Translation`, a
    whole run's :class:`trackbridge.pipeline.Stats`)."""

    source: str = ""                                           # resolved source, e.g. "verl/ppo@v0.4.0..v0.7.0"
    mapped: int = 0                                            # number of input keys that were translated
    unmapped: list[str] = field(default_factory=list)          # input keys passed through unchanged
    approximate: dict[str, str] = field(default_factory=dict)  # output key -> why the translation is approximate
    derived: list[str] = field(default_factory=list)           # output keys computed by derived rules
    renamed: dict[str, str] = field(default_factory=dict)      # input key -> output key, where they differ
    conflicts: dict[str, str] = field(default_factory=dict)    # input key kept as is because its output was taken
    notes: list[str] = field(default_factory=list)

    def merge(self, other: "Report") -> None:
        self.mapped += other.mapped
        if other.unmapped:      # a run merges every record's report: set lookups, not list scans
            seen = set(self.unmapped)
            self.unmapped += [k for k in other.unmapped if k not in seen]
        for k, v in other.approximate.items():
            self.approximate.setdefault(k, v)
        if other.derived:
            seen = set(self.derived)
            self.derived += [k for k in other.derived if k not in seen]
        self.renamed.update(other.renamed)
        self.conflicts.update(other.conflicts)
        self.notes += [n for n in other.notes if n not in self.notes]


@dataclass
class Translation(Report):
    """One translated dict: ``metrics`` in the target's names (input order kept, derived values after) and its
    bookkeeping."""

    metrics: dict[str, Any] = field(default_factory=dict)

    def report(self) -> dict[str, Any]:
        out = {"mapped": self.mapped, "unmapped": list(self.unmapped), "approximate": dict(self.approximate),
               "source": self.source}
        if self.derived:
            out["derived"] = list(self.derived)
        if self.conflicts:
            out["conflicts"] = dict(self.conflicts)
        return out


@dataclass(frozen=True)
class _Plan:
    out: str                          # output key
    canonical: str                    # canonical key (with split prefix)
    fwd: Entry | None                 # source entry (None: input was canonical)
    rev: Entry | None                 # target entry (None: target is canonical)
    approx: str | None                # reason, or None if exact
    note: str | None = None

    def __post_init__(self) -> None:
        # compiled once: the value conversions (None when the value passes as is) and whether the input name is
        # the framework's primary one (it keeps the output name in a clash)
        fwd = self.fwd if self.fwd is not None and (self.fwd.scale != 1.0 or self.fwd.offset != 0.0) else None
        rev = self.rev if self.rev is not None and (self.rev.scale != 1.0 or self.rev.offset != 0.0) else None
        object.__setattr__(self, "to_canon", fwd.to_canonical if fwd is not None else None)
        if fwd is None and rev is None:
            conv = None
        elif rev is None:
            conv = fwd.to_canonical
        elif fwd is None:
            conv = rev.from_canonical
        else:
            conv = lambda v, a=fwd.to_canonical, b=rev.from_canonical: b(a(v))   # noqa: E731
        object.__setattr__(self, "conv", conv)
        object.__setattr__(self, "primary", self.fwd is None or self.fwd.reverse)


_NOT_PLANNED = object()


def _split_canonical(key: str) -> tuple[str | None, str]:
    return SPLITS.split_canonical(key)


class Translator:
    """A compiled, reusable translation from one naming scheme to another.

    ``source``: ``auto``, ``canonical`` or ``FRAMEWORK[/TRAINER][@VERSION]``; ``target``: ``canonical[@VERSION]`` or
    ``FRAMEWORK[/TRAINER][@VERSION]``. ``config`` is the run's config in the *source* framework's names (used for
    entries whose meaning depends on it, and by :meth:`translate_config`). ``mappings`` adds user mapping files.
    With ``derive=True`` derived rules fill in canonical metrics the source did not log, in the target's names.

    Trainers left out are resolved (see docs/mapping-format.md, "Trainer resolution"): a source's from its keys
    within the framework and releases given; a target's as the counterpart of the source's trainer (same trainer,
    else the first declared trainer of the same kind alive in the target's releases). With a canonical source,
    ``origin`` names the framework the canonical names came from (a spool's ``RunInfo.source``) and ``fidelity``
    their approximations (canonical name -> reason), so that renaming them again is judged as the direct path is.
    """

    def __init__(self, source: str = "auto", target: str = "canonical", *, mappings: Iterable[str] | None = None,
                 config: Mapping[str, Any] | None = None, derive: bool = False,
                 registry: Registry | None = None, origin: str | None = None,
                 fidelity: Mapping[str, str] | None = None) -> None:
        self.registry = registry or load_registry(mappings)
        self.source_spec = parse_spec(source, self.registry)
        self.target_spec = parse_spec(target, self.registry, allow_auto=False)
        self.origin_spec = _parse_origin(origin, self.registry) if self.source_spec.kind == "canonical" else None
        self.input_fidelity = fidelity if isinstance(fidelity, dict) else dict(fidelity or {})   # live: a logger adds
        self._tgt_trainer: str | None | bool = False       # False: not resolved yet
        self._tgt_note: str | None = None
        self._src_note: str | None = None
        self._source_cache: tuple | None = None
        self._pinned = False
        self._tgt_from_keys = False
        self.raw_config = dict(config or {})
        self.flat_config = flatten_config(self.raw_config)
        self.detection: Detection | None = None
        self._src: Spec | None = None if self._needs_detection() else self.source_spec
        self._seen: set[str] = set()
        self._plans: dict[str, _Plan | None] = {}
        self._rev_cache: dict[str, tuple[Entry, dict | None] | None] = {}
        self._deriver = None
        self._derive = derive
        self._mapping_paths = list(mappings or [])
        self.notes: list[str] = []
        self._outside: list[str] = []

    # ------------------------------------------------------------------------------------------------ public
    def _source_text(self) -> str:
        cached = self._source_cache
        if cached is None or cached[0] is not self._src or cached[1] is not self.detection:
            cached = self._source_cache = (self._src, self.detection, self.source)
        return cached[2]

    @property
    def source(self) -> str:
        if self._src is None:
            return "auto (undetected)"
        text = self._src.describe(self.registry)
        if self.detection is not None and self._src is self.detection.spec and self.source_spec.kind == "auto":
            text += f" (detected, confidence {self.detection.confidence:.2f})"
        return text

    @property
    def source_spec_text(self) -> str | None:
        """The resolved source as a plain spec (``trl/grpo@v0.17.0..v1.16.0``), None while undetected."""
        return self._src.describe(self.registry) if self._src is not None else None

    def translate(self, metrics: Mapping[str, Any], *, step: int | None = None,
                  wall_time: float | None = None) -> Translation:
        if not isinstance(metrics, Mapping):
            raise TypeError(f"translate() takes a dict of metric name -> value, not {type(metrics).__name__}")
        if self._src is None or (not self._pinned and self._needs_detection()
                                 and not metrics.keys() <= self._plans.keys()):
            self._maybe_detect(metrics)
        if self._tgt_trainer is False and self.target_spec.kind == "framework":
            self._resolve_target_trainer(metrics)
        notes = self.notes
        for n in (self._src_note, self._tgt_note):
            if n is not None and n not in notes:
                notes.append(n)
        res = Translation(source=self._source_text())
        out_metrics = res.metrics
        renamed = res.renamed
        approximate = res.approximate
        canon: dict[str, Any] | None = {} if self._derive else None     # canonical view, for derivation
        plans = self._plans
        mapped = 0
        noted = set(notes)
        for key, value in metrics.items():
            plan = plans.get(key, _NOT_PLANNED)
            if plan is _NOT_PLANNED:
                if not isinstance(key, str):
                    raise TypeError(f"metric names must be strings; got {key!r} ({type(key).__name__})")
                plan = plans[key] = self._plan(key)
            if plan is None:
                if key in out_metrics:
                    res.conflicts[key] = key
                    continue
                out_metrics[key] = value
                res.unmapped.append(key)
                continue
            if plan.note is not None and plan.note not in noted:
                noted.add(plan.note)
                notes.append(plan.note)
            out = plan.out
            if canon is not None:
                canon.setdefault(plan.canonical, value if plan.to_canon is None else plan.to_canon(value))
            val = value if plan.conv is None else plan.conv(value)
            if out in out_metrics:
                # two inputs name one quantity (an old and a new name logged side by side, or two aliases)
                if _same_value(out_metrics[out], val):
                    mapped += 1          # the same value twice: kept once, and said so
                    renamed[key] = out
                    if not plan.approx:  # an exact key vouches for the value another key gave approximately
                        approximate.pop(out, None)
                    note = f"{key!r} and another key both give {out!r} with the same value; kept once"
                    if note not in notes:
                        notes.append(note)
                    continue
                # different values: the primary name (the one the framework logs at that release) keeps the
                # canonical name; the other is passed through under its own name and reported
                old_key, old_value, old_primary = _owner(metrics, plans, out, key, res.conflicts)
                if plan.primary and not old_primary:
                    out_metrics[old_key] = old_value
                    res.conflicts[old_key] = out
                    renamed.pop(old_key, None)
                    approximate.pop(out, None)
                    mapped -= 1
                else:
                    res.conflicts[key] = out
                    out_metrics[key] = value
                    continue
            out_metrics[out] = val
            mapped += 1
            if out != key:
                renamed[key] = out
            if plan.approx:
                approximate[out] = plan.approx
        res.mapped = mapped
        if canon is not None:
            self._derive_into(res, canon, step, wall_time)
        res.notes = list(notes)
        return res

    __call__ = translate

    def fresh(self) -> "Translator":
        """A translator with the same settings and none of the state a translation leaves (detection, notes,
        derived-rule history); the compiled plans of a fixed source are shared."""
        new = Translator.__new__(Translator)
        new.__dict__.update(self.__dict__)
        new.notes, new._outside, new._deriver, new._seen = [], [], None, set()
        if not self._pinned:
            new.detection, new._src_note = None, None
        if self._needs_detection():
            new._src, new._plans, new._rev_cache = None, {}, {}
        if self._needs_detection() or self._tgt_from_keys:
            new._plans, new._rev_cache, new._tgt_trainer, new._tgt_note = {}, {}, False, None
            new._tgt_from_keys = False
        return new

    def translate_config(self, config: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Canonical config names (``kl_coef``, ``num_generations`` ...) found in a run config (nested or dotted)."""
        flat = flatten_config(config) if config is not None else self.flat_config
        out: dict[str, Any] = {}
        specs = [self._src] if self._src is not None and self._src.kind == "framework" else []
        frameworks = [self.registry.frameworks[s.framework] for s in specs] or list(self.registry.frameworks.values())
        trainer = specs[0].trainer if specs else None
        # trackers nest the arguments one level down at times (transformers' TensorBoard text `args`, a wandb
        # config group): a key is also found under one wrapping key
        wrapped = {k.split(".", 1)[1]: v for k, v in flat.items()
                   if "." in k and isinstance(flat.get(k.split(".", 1)[0]), Mapping)}
        for fw in frameworks:
            lo, hi = specs[0].bounds(len(fw.releases)) if specs else (0, float("inf"))
            for c in fw.config:
                if c.canonical in out:
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
        if self.target_spec.kind == "canonical":
            return self._canonical_out(canonical_key)
        split, base = _split_canonical(canonical_key)
        hit = self._reverse(base)
        if hit is None:
            return canonical_key
        return self._framework_out(hit[0], hit[1], split)

    def resolve_source(self, keys: Iterable[str]) -> None:
        """Detect the source (framework, trainer, releases: what the spec leaves out) from ``keys`` once and keep
        it: later dicts are translated with it even if they bring new keys (a stored run read with look-ahead)."""
        self._maybe_detect(dict.fromkeys(k for k in keys if isinstance(k, str)))
        if self._src is None and self.source_spec.kind == "framework":
            self._src = self.source_spec
        if self._src is None:
            why = self.detection.reason if self.detection is not None else "no keys"
            self.notes.append(f"could not detect the framework ({why}); names treated as canonical, others passed "
                              "through unchanged")
            self._src = Spec("canonical")
        self._pinned = True

    # ------------------------------------------------------------------------------------------------ detection
    def _needs_detection(self) -> bool:
        """``auto``, or a framework given without its trainer while it has several (``trl@1.16.0``, ``verl``)."""
        if self._pinned:
            return False
        sp = self.source_spec
        if sp.kind == "auto":
            return True
        return (sp.kind == "framework" and sp.trainer is None
                and len(self.registry.frameworks[sp.framework].trainers) > 1)

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
        return self.registry.frameworks[sp.framework], sp.trainer

    def _resolve_target_trainer(self, metrics: Mapping[str, Any] | None = None) -> str | None:
        """The target trainer when the target spec leaves it out: the counterpart of the source's trainer (see
        docs/mapping-format.md). ``\0none`` when the target framework has no trainer of that kind (only names every
        trainer shares are then used)."""
        tgt = self.target_spec
        if tgt.kind != "framework" or tgt.trainer:
            return tgt.trainer
        if self._tgt_trainer is not False:
            return self._tgt_trainer            # type: ignore[return-value]
        fw = self.registry.frameworks[tgt.framework]
        lo, hi = tgt.bounds(len(fw.releases))
        newest = min(hi, len(fw.releases) - 1)
        alive = [t for t in fw.trainers if fw.trainer_alive(t, lo, hi)]
        alive.sort(key=lambda t: 0 if fw.trainer_alive(t, newest, newest) else 1)    # alive in the newest first
        if len(fw.trainers) <= 1:
            self._tgt_trainer = None
            return None
        src_fw, src_trainer = self._source_trainer()
        label = tgt.describe(self.registry)
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
            score = {t: sum(1 for k in keys if self._has_reverse(fw, _split_canonical(k)[1], t, lo, hi))
                     for t in alive}
            choice = max(alive, key=lambda t: score[t]) if alive else None     # ties: declared order
            note = (f"target {label}: the source's trainer is unknown; trainer {choice} chosen as the one with "
                    f"names for most of the keys ({score.get(choice, 0)} of {len(keys)})")
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

    # ------------------------------------------------------------------------------------------------ planning
    def _plan(self, key: str) -> _Plan | None:
        src = self._src
        if src is None:
            return None
        if src.kind == "canonical":
            split, base = _split_canonical(key)
            base = self.registry.canonical.upgrade(base)
            if self.registry.canonical.find(base) is None:
                return None
            return self._to_target(base, split, None, key)
        fw = self.registry.frameworks[src.framework]
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
                        split = inner if inner != "train" else split
        if hit is None:
            return None
        entry, caps, note, range_reason = hit
        canon = entry.canonical_template.fill(caps) if entry.canonical_template and caps else entry.canonical
        plan = self._to_target(canon, None if split == "train" else split, entry, key, note)
        if range_reason and plan.approx is None:
            plan = replace(plan, approx=range_reason)
        return plan

    def _forward(self, fw: FrameworkMapping, key: str, src: Spec):
        hits = fw.lookup(key)
        if not hits:
            return None
        lo, hi = src.bounds(len(fw.releases))
        chosen = _choose(hits, src.trainer, lo, hi, self.flat_config)
        note = range_reason = None
        if chosen is None:       # logged outside the detected/requested releases or by another trainer: use the
            chosen = _nearest(hits, src.trainer, lo, hi, self.flat_config) \
                or _nearest(hits, None, lo, hi, self.flat_config)          # nearest release's meaning, and say so
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
                    range_reason = (f"{_reason(w)} (in {fw.release_name(w.since)}..{_until(fw, w)}; the releases "
                                    f"{src.describe(self.registry)} include these, so the release matters)")
        return chosen[0], chosen[1], note, range_reason

    def _meaning_note(self, fw: FrameworkMapping, key: str, hits, chosen: Entry, src: Spec, lo: float,
                      hi: float) -> str | None:
        """A note when ``key`` means different quantities in different releases of the range in use."""
        others = [h for h, _ in hits if h is not chosen and h.canonical != chosen.canonical
                  and h.applies(src.trainer, lo, hi) and h.condition_holds(self.flat_config) is not False
                  and (src.trainer is None or h.trainers is None or chosen.trainers is None
                       or bool(h.trainers & chosen.trainers))]
        if not others:
            return None
        spans = "; ".join(f"{h.canonical} in {fw.release_name(h.since)}..{_until(fw, h)}" for h in others[:3])
        return (f"{fw.name} {key!r} changed meaning within {src.describe(self.registry)}: {spans}; translated as "
                f"{chosen.canonical} ({fw.release_name(chosen.since)}..{_until(fw, chosen)}); give the release to "
                f"choose")

    def _outside_note(self, src: Spec) -> str:
        """One note for every key translated with an entry of another release or trainer than the source's."""
        text = (f"{len(self._outside)} key(s) are not logged by {src.describe(self.registry)} according to the "
                f"mappings and were translated with the nearest release's entry: {', '.join(self._outside[:12])}"
                + (" ..." if len(self._outside) > 12 else ""))
        self.notes = [n for n in self.notes if not n.startswith(f"{len(self._outside) - 1} key(s) are not logged")]
        return text

    def _to_target(self, canon: str, split: str | None, fwd: Entry | None, key: str, note: str | None = None) -> _Plan:
        canon_key = f"{split}/{canon}" if split else canon
        approx = _reason(fwd) if fwd is not None else self.input_fidelity.get(canon_key)
        if fwd is None and self.origin_spec is not None and self.target_spec.kind == "framework":
            fwd_like = self._origin_entry(canon)      # the entry the origin wrote this canonical name from
        else:
            fwd_like = fwd
        if self.target_spec.kind == "canonical":
            return _Plan(self._canonical_out(canon_key), canon_key, fwd, None, approx, note)
        hit = self._reverse(canon)
        if hit is None:
            tgt = self.target_spec.describe(self.registry)
            return _Plan(canon_key, canon_key, fwd, None, approx,
                         note or f"{tgt} has no name for canonical {canon!r}; kept the canonical name")
        rev, caps = hit
        if fwd_like is not None and rev.framework == fwd_like.framework and \
                self.registry.frameworks[rev.framework].same_quantity(fwd_like, rev):
            # the same entry there and back, or a declared rename: the same quantity. A canonical input keeps a
            # reason that is not the entry's own (the release range it came from holds another fidelity), as the
            # direct path adds that reason back after planning
            approx = None if fwd is not None or approx == _reason(fwd_like) else approx
        else:
            r2 = _reason(rev)
            if r2 and r2 != approx:
                approx = f"{approx}; {r2}" if approx else r2
        return _Plan(self._framework_out(rev, caps, split), canon_key, fwd, rev, approx, note)

    def _canonical_out(self, canon_key: str) -> str:
        ver = self.target_spec.canonical_version
        if not ver:
            return canon_key
        split, base = _split_canonical(canon_key)
        base = self.registry.canonical.downgrade(base, ver)
        return f"{split}/{base}" if split else base

    def _framework_out(self, rev: Entry, caps: dict | None, split: str | None) -> str:
        name = rev.key_template.fill(caps) if rev.key_template is not None and caps is not None else rev.key
        if split:
            fw = self.registry.frameworks[rev.framework]
            name = (fw.prefix_for(split) or f"{split}/") + name
        return name

    def _reverse(self, canon: str) -> tuple[Entry, dict | None] | None:
        if canon in self._rev_cache:
            return self._rev_cache[canon]
        tgt = self.target_spec
        fw = self.registry.frameworks[tgt.framework]
        lo, hi = tgt.bounds(len(fw.releases))
        chosen = self._reverse_in(fw, canon, self._resolve_target_trainer(), lo, hi)
        self._rev_cache[canon] = chosen
        return chosen

    def _origin_entry(self, canon: str) -> Entry | None:
        org = self.origin_spec
        fw = self.registry.frameworks[org.framework]
        lo, hi = org.bounds(len(fw.releases))
        hit = self._reverse_in(fw, canon, org.trainer, lo, hi)
        return hit[0] if hit else None

    def _reverse_in(self, fw: FrameworkMapping, canon: str, trainer: str | None, lo: float, hi: float
                    ) -> tuple[Entry, dict | None] | None:
        """The entry of ``fw`` that writes canonical ``canon`` for ``trainer`` within releases lo..hi."""
        hits: list[tuple[Entry, dict | None]] = []
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
        return _choose(hits, trainer, lo, hi, self.flat_config) if hits else None

    # ------------------------------------------------------------------------------------------------ derive
    def apply_derive(self, res: Translation, step=None, wall_time=None) -> None:
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

    def _derive_into(self, res: Translation, canon: dict[str, Any], step, wall_time) -> None:
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
                split, base = _split_canonical(name)
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
            reasons = [r for r in (d.approximate.get(name), _reason(rev)) if r]
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
                out[plan.canonical] = _reason(plan.fwd) or "approximate"
        return out

    def warm_derive(self, records) -> int:
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

    def _get_deriver(self):
        if self._deriver is None:
            try:
                from .derive import make_deriver
            except ImportError:
                return None
            self._deriver = make_deriver(self.registry, self._mapping_paths, config=self.translate_config(),
                                         source=self.source_spec_text)
        return self._deriver


def _parse_origin(origin: str | None, registry: Registry) -> Spec | None:
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


def _owner(metrics: Mapping[str, Any], plans: dict, out: str, before: str,
           conflicts: Mapping[str, str]) -> tuple[str, Any, bool]:
    """The input key (and its value, and whether its entry is primary) that holds ``out`` when ``before`` clashes
    with it: looked up only on a clash, which is rare, so the loop keeps no per-key record of it."""
    found = None
    for k, v in metrics.items():
        if k == before:
            break
        p = plans.get(k)
        if p is not None and p is not _NOT_PLANNED and p.out == out and k not in conflicts:
            found = (k, v, p.primary)      # the first that is not displaced holds it (a same-valued later one
            break                          # was folded into it)
    if found is None:
        raise KeyError(out)
    return found


def _same_value(a: Any, b: Any) -> bool:
    try:
        return a == b or (a != a and b != b)      # NaN == NaN here
    except Exception:                          # arrays and other values without a plain truth value
        return False


def _reason(e: Entry | None) -> str | None:
    if e is None or e.exact:
        return None
    tag = f" [{', '.join(e.differs)}]" if e.differs else ""
    return f"{e.framework} {e.key!r}: {e.reason}{tag}"


def _until(fw: FrameworkMapping, e: Entry) -> str:
    return "now" if e.until == float("inf") else fw.release_name(int(e.until))


def _choose(hits, trainer, lo, hi, config):
    """The entry that best fits trainer, release range and config; the newest one when several fit. Literal keys
    win over templates: a template is only used when no literal entry fits."""
    literal = [h for h in hits if h[0].key_template is None]
    if literal and len(literal) < len(hits):
        found = _choose(literal, trainer, lo, hi, config)
        if found is not None:
            return found
        hits = [h for h in hits if h[0].key_template is not None]
    best, best_rank = None, None
    for e, caps in hits:
        if not e.applies(trainer, lo, hi):
            continue
        cond = e.condition_holds(config)
        if cond is False:
            continue
        # prefer: config condition confirmed > unconditional > condition unknown; of two confirmed, the one that
        # tests more settings (OpenRLHF's kl with use_loss and estimator k3 over estimator k3 alone);
        # trainer-specific over generic; covering the newest release of the range; more specific template
        rank = (2 if (cond is True and e.when) else 1 if not e.when else 0,
                len(e.when) if (cond is True and e.when) else 0,
                1 if (trainer and e.trainers) else 0,
                min(e.until, hi), e.since,
                e.key_template.literal_len if e.key_template else 10 ** 6)
        if best_rank is None or rank > best_rank:
            best, best_rank = (e, caps), rank
    return best


def _nearest(hits, trainer, lo, hi, config):
    """The entry whose releases lie nearest to lo..hi (for a key the mappings place outside that range)."""
    best, best_rank = None, None
    for e, caps in hits:
        if not e.applies(trainer, 0, float("inf")) or e.condition_holds(config) is False:
            continue
        distance = max(0.0, e.since - hi, lo - e.until)
        rank = (-distance, 1 if (trainer and e.trainers) else 0, min(e.until, hi))
        if best_rank is None or rank > best_rank:
            best, best_rank = (e, caps), rank
    return best


def flatten_config(config: Mapping[str, Any] | None, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1, "a": {...}}``: nested keys are reachable as dotted paths."""
    out: dict[str, Any] = {}
    if not config:
        return out
    for k, v in config.items():
        name = f"{prefix}{k}"
        out[name] = v
        if isinstance(v, Mapping):
            out.update(flatten_config(v, name + "."))
    return out


_COMPILED: "OrderedDict[tuple, Translator]" = OrderedDict()
_COMPILED_MAX = 32


def translate(metrics: Mapping[str, Any], source: str = "auto", target: str = "canonical", *,
              mappings: Iterable[str] | None = None, config: Mapping[str, Any] | None = None,
              derive: bool = False) -> Translation:
    """Translate one logged dict (one-shot: nothing carries over to the next call, as if a new
    :class:`Translator` were built). The compiled translator is cached by source, target, mappings and config, so
    repeated calls cost about what a reused Translator does; derivation, whose rules keep history, is not cached."""
    if derive:
        return Translator(source, target, mappings=mappings, config=config, derive=True).translate(metrics)
    try:
        key = (source, target, tuple(str(m) for m in mappings or ()), _freeze(config))
        hash(key)
    except TypeError:
        key = None
    tr = _COMPILED.get(key) if key is not None else None
    if tr is None:
        tr = Translator(source, target, mappings=mappings, config=config)
        if key is not None:
            _COMPILED[key] = tr
            while len(_COMPILED) > _COMPILED_MAX:
                _COMPILED.popitem(last=False)
    else:
        _COMPILED.move_to_end(key)
    if tr._needs_detection():
        # the detection depends only on the keys (and the config in the key): a translator pinned to what these
        # keys detect is reused for the same key set
        try:
            k2 = (key, frozenset(k for k in metrics if isinstance(k, str))) if key is not None else None
        except TypeError:
            k2 = None
        pinned = _COMPILED.get(k2) if k2 is not None else None
        if pinned is None:
            pinned = tr.fresh()
            pinned._maybe_detect(metrics)
            pinned._pinned = pinned._src is not None
            if k2 is not None and pinned._pinned:
                _COMPILED[k2] = pinned
                while len(_COMPILED) > _COMPILED_MAX:
                    _COMPILED.popitem(last=False)
            else:
                return pinned.translate(metrics)
        tr = pinned
    return tr.fresh().translate(metrics)


def _freeze(value: Any) -> Any:
    if isinstance(value, Mapping):
        return tuple(sorted((str(k), _freeze(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    return value


__all__ = ["Report", "Translation", "Translator", "translate", "flatten_config", "SpecError"]
