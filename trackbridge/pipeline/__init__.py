"""The one path every record takes: names as stored -> canonical -> derived values -> the names asked for.

A :class:`Pipeline` is the stages of :mod:`.stages` (Translate -> Step -> Derive -> Rename, each
``(record, report) -> record``) around one :class:`Translator` per run (:mod:`.translator`: what a run learns as its
records arrive, over the compiled facts of :mod:`trackbridge.translate`; where its names come from,
:mod:`.source`; the derived rules and their history, :mod:`.derived`). Logging (the logger's stages and
``names=``), ``translate()`` (a one-shot pipeline, :mod:`.oneshot`), migration, replay, comparison, the demo and the
integrations all build it: a short look-ahead resolves the source of a stored run, derived marks are carried
through, and one :class:`Stats` (the same bookkeeping type as a single translation) counts the run.
"""
from __future__ import annotations

import copy
import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Mapping, Protocol, TypeVar

from ..limits import check_config
from ..record import Record, RunInfo
from ..translate import Report, Translation
from .oneshot import translate  # the one-shot pipeline; it imports Pipeline when called
from .stages import Derive, Rename, Select, Stage, Step, Translate
from .translator import Translator

Translator.__module__ = __name__        # documented, printed and pickled where users import it from

if TYPE_CHECKING:       # pragma: no cover
    from ..schema.loader import Registry

DETECT_LOOKAHEAD = 50      # records read ahead to detect the framework of a stored run
S = TypeVar("S")


@dataclass
class Stats(Report):
    """A whole run's bookkeeping: what every record's translation reported, plus how many records and points."""

    points: int = 0                      # metric values written
    records: int = 0

    def merge(self, other: Report) -> None:
        """Add ``other``'s bookkeeping (and its counts, when it is a :class:`Stats` too) to this one."""
        super().merge(other)
        if isinstance(other, Stats):
            self.points += other.points
            self.records += other.records

    def to_json(self) -> dict[str, Any]:
        """The summary the commands print with ``--json`` (lists of names, counts of renames)."""
        return {"source": self.source, "records": self.records, "points": self.points,
                "renamed": len(self.renamed), "unmapped": list(self.unmapped), "approximate": self.approximate,
                "derived": list(self.derived), "conflicts": self.conflicts, "notes": self.notes}


class Pipeline:
    """Translate (and derive) a stream of records of one run.

    ``source``: ``auto`` (detected from the first records), ``canonical``, ``keep`` (no translation at all) or
    ``FRAMEWORK[/TRAINER][@VERSION]``. ``names``: the naming scheme of the output (``canonical[@VERSION]`` or a
    framework spec); ``keep`` as either side means names pass through untouched. For a canonical source, ``origin``
    (the framework the canonical names were translated from, as in ``RunInfo.source``) and ``fidelity`` (their
    approximations) let the target's trainer and fidelity be judged as if translating the original names.
    """

    def __init__(self, source: str = "auto", names: str = "canonical", *, config: dict[str, Any] | None = None,
                 mappings: Iterable[str] | None = None, derive: bool = True, registry: Registry | None = None,
                 origin: str | None = None, fidelity: Mapping[str, str] | None = None,
                 select: Iterable[str] | None = None) -> None:
        self.source = source
        self.names = names
        self.config = dict(config or {})
        self.mappings = list(mappings or [])
        self.derive = derive
        self.registry = registry
        self.origin = origin
        self.fidelity = fidelity if isinstance(fidelity, dict) else dict(fidelity or {})
        self.stats = Stats()
        self.translator: Translator | None = None
        self.stages: list[Stage] = []           # built by setup(): Translate, Derive, Select
        self._kept = False
        # ``select``: glob patterns of the output names to keep (the last stage; a run's selection, open_runs)
        self.select = [str(p) for p in select or ()]
        self._selector = Select(self.select) if self.select else None

    @classmethod
    def for_run(cls, info: RunInfo, names: str = "canonical", *, source: str = "auto", **kw: Any) -> "Pipeline":
        """The pipeline for a stored run. With ``source="auto"``, a run trackbridge wrote under canonical names is
        read as canonical and remembers where its names came from (``info.source``: the target's trainer and the
        fidelity are judged from it); one it wrote under a framework's names (``info.names``) is read as that
        framework's; any other run is detected from its keys (and config)."""
        if source == "auto" and (info.names or "").split("@")[0] == "canonical":
            source = "canonical"
        elif source == "auto" and info.names and info.names not in ("raw", "keep"):
            # written by trackbridge under a framework's names (migrate --names verl): those are its names, and the
            # names it had none for were kept canonical, which pass through; detecting would see a mix of the two
            source = info.names
        return cls(source, names, config=info.config, origin=info.source, fidelity=info.approximate, **kw)

    # ------------------------------------------------------------------------------------------------ setup
    def setup(self, keys: Iterable[str] = ()) -> Translator | None:
        """Build the translator and resolve the source from ``keys`` (a stored run's first records)."""
        if self.translator is not None or self._kept:
            return self.translator
        if self.source == "keep" or self.names == "keep":
            self.stats.source = "kept as stored"
            self._kept = True
            self.stages = [self._selector] if self._selector is not None else []
            return None
        from ..schema.loader import load_registry
        reg = self.registry = self.registry or load_registry(self.mappings or None)
        tr = Translator(self.source, self.names, registry=reg, config=self.config, derive=False,
                        mappings=self.mappings, origin=self.origin if self.source == "canonical" else None,
                        fidelity=self.fidelity if self.source == "canonical" else None)
        tr.resolve_source(keys)
        self._around(tr)
        return tr

    @classmethod
    def over(cls, translator: Translator, *, derive: bool = False) -> "Pipeline":
        """The pipeline of a translator already built (the one-shot ``translate()``: compiled once, a fresh copy
        per call): its stages are Translate and, with ``derive``, Derive."""
        pipe = cls(translator.source_spec.describe(), translator.target_spec.describe(), config=translator.raw_config,
                   derive=derive, registry=translator.registry)
        pipe._around(translator)
        return pipe

    @classmethod
    def live(cls, translator: Translator, *, derive: bool = True, next_step: int = 0,
             problem: Callable[[str, str], None] | None = None) -> "Pipeline":
        """The logger's pipeline, Translate -> Step -> Derive, over a translator whose source is detected as keys
        arrive (a run being logged has no records to look ahead at, so nothing is pinned). ``next_step``: where the
        Step stage's counter starts (a resumed run's); ``problem(key, message)``: what it says once per key. The
        logger's dispatcher runs the stages one by one (:meth:`stage`), so that a stage that fails is said and
        isolated: names logged as given, or derivation off for the run."""
        pipe = cls.over(translator, derive=derive)
        pipe.stages.insert(1, Step(next_step, problem))
        return pipe

    def stage(self, kind: type[S]) -> S | None:
        """This pipeline's stage of that class (``pipe.stage(Derive)``), or None when it has none."""
        for s in self.stages:
            if isinstance(s, kind):
                return s
        return None

    def _around(self, tr: Translator) -> None:
        selection: list[Stage] = [self._selector] if self._selector is not None else []
        self.translator = tr
        self.stats.source = tr.source
        self.stages = [Translate(tr, canonical=self.derive), *([Derive(tr)] if self.derive else []), *selection]

    def canonical_config(self) -> dict[str, Any]:
        """The run config with canonical config names added (``kl_coef`` ...), original keys kept."""
        if self.translator is None:
            return {}
        return self.translator.translate_config(self.config)

    def run_info(self, info: RunInfo) -> RunInfo:
        """The RunInfo to write: names scheme, source and canonical config names recorded. A config beyond
        :mod:`trackbridge.limits` raises :class:`~trackbridge.errors.ConfigTooLarge` (before any destination
        opens the run: ``migrate`` fails that run alone, naming the key and the limit)."""
        check_config(info.config, f"run {info.name or info.run_id or ''!r}")
        out = copy.copy(info)
        out.__dict__.update({k: dict(v) for k, v in info.__dict__.items() if isinstance(v, dict)})
        out.names = self.names if not self._kept else info.names
        src = self.stats.source
        if src and not src.startswith(("canonical", "unknown")) and src != "kept as stored":
            out.source = src
        canon = self.canonical_config()
        if canon:
            out.extra = dict(out.extra)
            out.extra["canonical_config"] = canon
        kept = info.approximate if (self._kept or self.names == info.names) else {}
        out.approximate = {**(kept or {}), **self.stats.approximate}
        if self._selector is not None:          # the marks of the names written only
            chosen = self._selector.chosen
            out.approximate = {k: v for k, v in out.approximate.items() if chosen.get(k)}
        return out

    # ------------------------------------------------------------------------------------------------ streaming
    def process(self, records: Iterable[Record]) -> Iterator[Record]:
        """Translate a stream of records; the source is resolved from the first :data:`DETECT_LOOKAHEAD` records."""
        it = iter(records)
        if self.translator is None and not self._kept:
            head = list(itertools.islice(it, DETECT_LOOKAHEAD))
            keys: set[str] = set()
            for r in head:
                keys.update(r.metrics)
            self.setup(keys)
            it = itertools.chain(head, it)
        for rec in it:
            yield self.one(rec)

    def one(self, rec: Record, report: Translation | None = None) -> Record:
        """Run one record through the stages (the source resolved from its keys if not yet known) and count it in
        ``stats``; ``report``: a fresh :class:`~trackbridge.translate.Translation` the stages fill with this
        record's bookkeeping (what was renamed to what, for a caller that maps its own keys)."""
        if report is None:
            report = Translation(source=self.stats.source)
        out = self.run(rec, report)
        st = self.stats
        if not self._kept:
            st.merge(report)
        st.records += 1
        st.points += len(out.metrics)
        return out

    def run(self, rec: Record, report: Translation) -> Record:
        """The stages alone, for one record (the source resolved from its keys if not yet known): ``report`` filled
        with its bookkeeping, nothing counted in ``stats``."""
        if self.translator is None and not self._kept:
            self.setup(rec.metrics)
        out = Record(rec.step, rec.wall_time, dict(rec.metrics), list(rec.derived), rec.axis) if self._kept else rec
        for stage in self.stages:
            out = stage(out, report)
        return out

    def finish_notes(self) -> list[str]:
        """The run's notes, the translator's included, each once (also left in ``stats.notes``)."""
        notes = list(self.stats.notes)
        if self.translator is not None:
            notes += [n for n in self.translator.notes if n not in notes]
        self.stats.notes = notes
        return notes


class Renamer(Protocol):
    """What :func:`names_translator` returns (a :class:`~.stages.Rename` stage): called with a canonical record,
    gives it under the target's names; ``pipeline()`` is the pipeline doing it (None before the first record), with
    its bookkeeping."""

    def __call__(self, rec: Record) -> Record: ...

    def pipeline(self) -> "Pipeline | None": ...


def names_translator(target: str | None, *, mappings: list[str] | None = None,
                     config: dict[str, Any] | None = None, origin: Any = None,
                     fidelity: dict[str, str] | None = None) -> Renamer | None:
    """The :class:`~.stages.Rename` stage from canonical names to the ``target`` naming (``FRAMEWORK[@VERSION]``):
    derived marks follow their values; the target's trainer and the fidelity are judged from ``origin``, the
    framework the canonical names came from (a value or a function returning it); ``None`` when the target is
    canonical."""
    if not target or target == "canonical":
        return None
    return Rename(target, mappings=mappings, config=config, origin=origin, fidelity=fidelity)


__all__ = ["DETECT_LOOKAHEAD", "Pipeline", "Renamer", "Stats", "Translation", "Translator", "names_translator",
           "translate"]
