"""One pipeline for every use: records as stored -> translate -> derive -> records under the requested names.

Logging, migration, replay and comparison all pass their records through :class:`Pipeline`. It keeps the
bookkeeping users are shown at the end (renamed, unmapped, approximate, derived) and streams: records are handled
one at a time, apart from a short look-ahead used to detect the source framework when it is not given.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

from .record import Record, RunInfo
from .translate import Translator

DETECT_LOOKAHEAD = 50      # records read ahead to detect the framework of a stored run


@dataclass
class Stats:
    points: int = 0                      # metric values written
    records: int = 0
    renamed: dict[str, str] = field(default_factory=dict)
    unmapped: dict[str, None] = field(default_factory=dict)
    approximate: dict[str, str] = field(default_factory=dict)
    derived: dict[str, None] = field(default_factory=dict)
    conflicts: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    source: str = ""

    def merge(self, other: "Stats") -> None:
        self.points += other.points
        self.records += other.records
        self.renamed.update(other.renamed)
        self.unmapped.update(other.unmapped)
        self.approximate.update(other.approximate)
        self.derived.update(other.derived)
        self.conflicts.update(other.conflicts)
        self.notes += [n for n in other.notes if n not in self.notes]

    def to_json(self) -> dict[str, Any]:
        return {"source": self.source, "records": self.records, "points": self.points,
                "renamed": len(self.renamed), "unmapped": list(self.unmapped), "approximate": self.approximate,
                "derived": list(self.derived), "conflicts": self.conflicts, "notes": self.notes}


class Pipeline:
    """Translate (and optionally derive) a stream of records of one run.

    ``source``: ``auto`` (detected from the first records), ``canonical``, ``keep`` (no translation at all) or
    ``FRAMEWORK[/TRAINER][@VERSION]``. ``names``: the naming scheme of the output (``canonical`` or a framework
    spec); ``keep`` as either side means names pass through untouched.
    """

    def __init__(self, source: str = "auto", names: str = "canonical", *, config: dict | None = None,
                 mappings: Iterable[str] | None = None, derive: bool = True, registry=None) -> None:
        self.source = source
        self.names = names
        self.config = dict(config or {})
        self.mappings = list(mappings or [])
        self.derive = derive
        self.registry = registry
        self.stats = Stats()
        self._to_canon: Translator | None = None
        self._to_names: Translator | None = None
        self._deriver = None

    # ------------------------------------------------------------------------------------------------ setup
    def _setup(self, keys: set[str]) -> None:
        if self.source == "keep" or self.names == "keep":
            self.stats.source = "kept as stored"
            return
        from .detect import detect
        from .schema.loader import load_registry
        reg = self.registry or load_registry(self.mappings or None)
        self.registry = reg
        src = self.source
        if src == "auto":
            det = detect(keys, reg)
            src = det.spec.describe(reg) if det.spec is not None else "canonical"
            if det.spec is None:
                self.stats.notes.append(f"could not detect the framework ({det.reason}); names treated as "
                                        "canonical, others passed through unchanged")
            else:
                self.stats.notes.append(f"detected {det.source} (confidence {det.confidence:.2f}): {det.reason}")
        self._to_canon = Translator(src, "canonical", registry=reg, config=self.config)
        self.stats.source = self._to_canon.source
        if self.names != "canonical":
            self._to_names = Translator("canonical", self.names, registry=reg, config=self.config)
        if self.derive:
            try:
                from .derive import make_deriver
            except ImportError:
                make_deriver = None
            if make_deriver is not None:
                self._deriver = make_deriver(reg, self.mappings, config=self.canonical_config(),
                                             source=self._to_canon.source_spec_text)

    def canonical_config(self) -> dict[str, Any]:
        """The run config with canonical config names added (``kl_coef`` ...), original keys kept."""
        if self._to_canon is None:
            return {}
        return self._to_canon.translate_config(self.config)

    def run_info(self, info: RunInfo) -> RunInfo:
        """The RunInfo to write: names scheme, source and canonical config names recorded."""
        out = RunInfo(**{k: (dict(v) if isinstance(v, dict) else v) for k, v in info.__dict__.items()})
        out.names = self.names
        out.source = self.stats.source or info.source
        canon = self.canonical_config()
        if canon:
            out.extra = dict(out.extra)
            out.extra["canonical_config"] = canon
        out.approximate = {**(info.approximate or {}), **self.stats.approximate}   # kept from an earlier translation
        return out

    # ------------------------------------------------------------------------------------------------ streaming
    def process(self, records: Iterable[Record]) -> Iterator[Record]:
        it = iter(records)
        if self._to_canon is None and self.stats.source == "":
            head = list(itertools.islice(it, DETECT_LOOKAHEAD))
            keys: set[str] = set()
            for r in head:
                keys.update(r.metrics)
            self._setup(keys)
            it = itertools.chain(head, it)
        for rec in it:
            yield self.one(rec)

    def one(self, rec: Record) -> Record:
        st = self.stats
        if self._to_canon is None:
            out = Record(rec.step, rec.wall_time, dict(rec.metrics), list(rec.derived))
        else:
            res = self._to_canon.translate(rec.metrics)
            metrics = res.metrics
            derived = list(rec.derived)
            if self._deriver is not None:
                self._deriver.fidelity.update(res.approximate)
                new = self._deriver.apply(metrics, step=rec.step, wall_time=rec.wall_time)
                derived += [n for n in new if n not in derived]
                for n in new:
                    st.derived.setdefault(n)
            st.unmapped.update(dict.fromkeys(res.unmapped))
            st.approximate.update(res.approximate)
            st.conflicts.update(res.conflicts)
            if self._to_names is not None:
                res2 = self._to_names.translate(metrics)
                metrics = res2.metrics
                rename = res2.renamed
                derived = [rename.get(d, d) for d in derived]
                for k, v in res2.approximate.items():
                    st.approximate.setdefault(k, v)
                # input name -> the name finally written (through canonical)
                for k in rec.metrics:
                    final = rename.get(res.renamed.get(k, k), res.renamed.get(k, k))
                    if final != k:
                        st.renamed[k] = final
            else:
                st.renamed.update(res.renamed)
            out = Record(rec.step, rec.wall_time, metrics, derived)
        st.records += 1
        st.points += len(out.metrics)
        return out

    def finish_notes(self) -> list[str]:
        notes = list(self.stats.notes)
        for tr in (self._to_canon, self._to_names):
            if tr is not None:
                notes += [n for n in tr.notes if n not in notes]
        if self._deriver is not None:
            notes += [n for n in getattr(self._deriver, "notes", []) if n not in notes]
        self.stats.notes = notes
        return notes

