"""The :class:`Translator`: a compiled, reusable translation from one naming scheme to another. Its parts: source
and target resolution (:mod:`.resolve`), the plan of each key (:mod:`.plan`) and derived metrics (:mod:`.derived`);
the state they share is declared in :mod:`.state`."""
from __future__ import annotations

from typing import Any, Iterable, Mapping

from ..detect import Detection
from ..schema.loader import Registry, load_registry
from ..schema.model import Entry
from ..spec import Spec, parse_spec
from .derived import Deriving
from .entries import NOT_PLANNED, Plan, config_view, flatten_config, owner, parse_origin, same_value, split_canonical
from .plan import Planning
from .report import Translation
from .resolve import Resolution


class Translator(Resolution, Planning, Deriving):
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
        self.origin_spec = parse_origin(origin, self.registry) if self.source_spec.kind == "canonical" else None
        self.input_fidelity = fidelity if isinstance(fidelity, dict) else dict(fidelity or {})   # live: a logger adds
        self._tgt_trainer: str | None | bool = False       # False: not resolved yet
        self._tgt_note: str | None = None
        self._src_note: str | None = None
        self._source_cache: tuple[Any, ...] | None = None
        self._pinned = False
        self._tgt_from_keys = False
        self.raw_config = dict(config or {})
        self.flat_config = config_view(self.raw_config)     # `args.x` of a TensorBoard folder is found as `x`
        self.detection: Detection | None = None
        self._src: Spec | None = None if self._needs_detection() else self.source_spec
        self._seen: set[str] = set()
        self._plans: dict[str, Plan | None] = {}
        self._rev_cache: dict[str, tuple[Entry, dict[str, str] | None] | None] = {}
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
        return str(cached[2])

    @property
    def source(self) -> str:
        """The source naming scheme for people: the resolved spec, ``(detected, confidence ...)`` when it was
        detected, ``auto (undetected)`` before then."""
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
        """Translate one logged dict into the target's names (derived values added when derivation is on);
        ``step``/``wall_time`` feed the stateful derived rules. Raises TypeError for anything but a mapping."""
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
            plan = plans.get(key, NOT_PLANNED)
            if plan is NOT_PLANNED:
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
                if same_value(out_metrics[out], val):
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
                old_key, old_value, old_primary = owner(metrics, plans, out, key, res.conflicts)
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
        frameworks = [self._framework(s) for s in specs] or list(self.registry.frameworks.values())
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
        split, base = split_canonical(canonical_key)
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
