"""Read a run like an expert: diagnostic checks written once, in canonical names, for a run from any framework.

The checks are facts, declared in YAML (``mappings/checks.yaml``, format ``trackbridge.checks/1``; users add or
override checks with files of their own, :mod:`.checks`); each names the canonical series it reads, a condition over
them (:mod:`.conditions`: a spike against a rolling baseline, a collapse against the early level, a bound held for
N points, a sign, two series together, a relation to the run config), a severity, what the symptom means, what to
check first and next, and where that advice comes from. One engine (:mod:`.engine`) evaluates them over a run's
canonical records in one pass with bounded state, so the same checks run

* on any stored run: ``trackbridge doctor RUN...`` (:func:`diagnose`, read through
  :func:`trackbridge.read.inputs.open_runs` and translated by the run's one :class:`~trackbridge.pipeline.Pipeline`),
* in the comparison report (its findings section, each finding linked to the chart it concerns),
* live in the logger (``trackbridge.init(..., doctor=True)``): a finding is logged once, as a text record and a
  warning, the first time its check holds.

Pure Python: the core needs only PyYAML.
"""
from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Mapping

from .checks import FORMAT, SEVERITIES, Check, CheckError, CheckSet, checks_for, lint_checks, load_checks
from .engine import Doctor
from .findings import Finding, Stretch, sort_findings

if TYPE_CHECKING:       # pragma: no cover
    from ..read.inputs import InputRun
    from ..record import Record
    from ..schema.loader import Registry

__all__ = ["FORMAT", "SEVERITIES", "Check", "CheckError", "CheckSet", "Diagnosis", "Doctor", "DoctorWarning",
           "Finding", "Stretch", "checks_for", "diagnose", "diagnose_records", "lint_checks", "load_checks",
           "sort_findings", "warn_finding", "TEXT_METRIC", "source_names", "target_names", "name_findings"]

TEXT_METRIC = "doctor/{check}"      # the canonical text metric a live finding is logged under (canonical.yaml)


class DoctorWarning(UserWarning):
    """A finding of the live checks (``trackbridge.init(..., doctor=True)``), said once when its check first holds."""


def warn_finding(finding: Finding, frame: Any = None) -> str:
    """Say a live finding once: as a :class:`DoctorWarning` and on the ``trackbridge`` logger when the application
    configured logging; returns the text (what the logger writes as ``doctor/<id>``). ``frame``: the user's frame
    the warning is attributed to (its file and line, as ``warnings`` shows them; the logger passes the frame that
    called ``log()``), else the caller's."""
    import logging
    import warnings

    from .report import live_text
    text = live_text(finding)
    log = logging.getLogger("trackbridge")
    if log.hasHandlers():
        log.warning("trackbridge doctor: %s", text)
    message = f"trackbridge doctor: {text}"
    try:
        if frame is None:
            warnings.warn(message, DoctorWarning, stacklevel=2)
        else:
            glob = frame.f_globals
            warnings.warn_explicit(message, DoctorWarning, frame.f_code.co_filename, frame.f_lineno,
                                   module=glob.get("__name__", "__main__"),
                                   registry=glob.setdefault("__warningregistry__", {}), module_globals=glob)
    except Exception:       # warnings turned into errors (-W error): said by the text record, never a crash
        pass
    return text


@dataclass
class Diagnosis:
    """The findings of one run, with what was read and how."""

    label: str
    locator: str
    source: str                                    # what the names were translated from
    findings: list[Finding]
    records: int = 0
    ran: list[str] = field(default_factory=list)   # check ids that could be judged
    not_run: dict[str, str] = field(default_factory=dict)   # check id -> why not
    problems: list[str] = field(default_factory=list)       # lines skipped while reading
    approximate: dict[str, str] = field(default_factory=dict)
    names_from: str = "your"        # whose names a finding's ``names`` are: the run's own ("your") or a framework's
    notes: list[str] = field(default_factory=list)          # how the run was read, where it matters to the checks

    def to_json(self) -> dict[str, Any]:
        return {"run": self.label, "locator": self.locator, "source": self.source, "records": self.records,
                "names_from": self.names_from,
                "findings": [{**f.to_json(), "names": dict(f.names)} for f in self.findings],
                "checks_run": self.ran, "checks_not_run": self.not_run, "problems": self.problems,
                "notes": self.notes}


def source_names(renamed: Mapping[str, str]) -> dict[str, str]:
    """Canonical name -> the run's own key that produced it, from a translation's ``renamed`` (source key ->
    canonical key, where they differ); the first key wins where several map to one name."""
    out: dict[str, str] = {}
    for src, canon in renamed.items():
        out.setdefault(canon, src)
    return out


def target_names(canonical: Iterable[str], target: str, *, origin: str | None = None,
                 config: Mapping[str, Any] | None = None, mappings: list[str] | None = None,
                 registry: Registry | None = None) -> dict[str, str]:
    """Canonical name -> its name under ``target`` (``FRAMEWORK[/TRAINER][@VERSION]``), through the pipeline every
    command renames with (``origin``: the framework the canonical names came from, for the target's trainer); a name
    the target does not have is left out."""
    from ..pipeline import Pipeline
    from ..record import Record
    names = list(dict.fromkeys(canonical))
    if not names:
        return {}
    pipe = Pipeline("canonical", target, config=dict(config or {}), mappings=mappings, derive=False,
                    registry=registry, origin=origin)
    pipe.setup(())
    pipe.one(Record(step=0, wall_time=None, metrics={n: 0.0 for n in names}))
    return {c: t for c, t in pipe.stats.renamed.items() if c in names and t != c}


def name_findings(findings: Iterable[Finding], names: Mapping[str, str]) -> None:
    """Give each finding the user's name of every canonical series it read (``names``: canonical -> user's)."""
    for f in findings:
        f.names = {c: names[c] for c in f.metrics() if c in names and names[c] != c}


def diagnose_records(records: Iterable[Record], *, config: Mapping[str, Any] | None = None,
                     checks: CheckSet | Iterable[Check] | None = None, label: str = "run",
                     approximate: Mapping[str, str] | None = None) -> list[Finding]:
    """The findings of canonical ``records`` (``config``: canonical config names), ordered by what to look at
    first."""
    if checks is None:
        checks = load_checks()
    doc = Doctor(checks, config=config, label=label)
    for rec in records:
        doc.feed(rec)
    return doc.finish(approximate)


def diagnose(run: InputRun, *, label: str | None = None, source: str | None = None,
             mappings: list[str] | None = None, checks: CheckSet | None = None,
             registry: Registry | None = None, names: str | None = None) -> Diagnosis:
    """Translate one run (as every command reads it: :func:`trackbridge.read.inputs.open_runs`) to canonical names, with
    derived metrics, and evaluate the checks over it. ``checks``: default the shipped checks plus the check files
    among ``mappings``. Each finding names its series as the run logged them (``Finding.names``: canonical -> the
    run's own key, from the run's translation); ``names="FRAMEWORK[@VERSION]"``: in that framework's names instead
    (``canonical``: none).

    **A trainer the keys cannot tell** (TRL 1.16's RLOO logs GRPO's names; detection assumes the first declared
    trainer and says so): the run is read again as each other trainer the keys fit, and what the file holds
    decides where it can: a KL estimator that cannot be negative (k2, k3) read negative rules that reading out (RLOO's
    ``kl`` is k1 and goes negative; GRPO's is k3, never negative). When the values rule out nothing, the diagnosis
    says which checks the guess decides (``notes``) instead of leaving them silently unrun."""
    from ..schema.loader import load_registry
    reg = registry or load_registry(mappings or None)
    if checks is None:
        checks = checks_for(reg, mappings)
    first = _diagnose_as(run, source, label=label, mappings=mappings, checks=checks, registry=reg, names=names)
    d, _impossible, det = first
    named = bool(source) and ("/" in str(source) or str(source) in ("canonical", "keep"))   # a trainer given
    assumed = None if named else _assumed(det)
    if assumed is None:
        for k, (step, value) in first[1].items():       # read as told, but the values say otherwise: said
            d.notes.append(f"{k} is {value:.4g} at step {step:g}, and that estimator is never negative: the run's "
                           f"names may mean another trainer's ({d.source})")
        return d
    framework, chosen, others = assumed
    readings = [(chosen, first)]
    for t in others:
        try:
            readings.append((t, _diagnose_as(run, f"{framework}/{t}", label=label, mappings=mappings, checks=checks,
                                             registry=reg, names=names)))
        except Exception:       # a trainer that cannot read these keys after all: not a reading
            continue
    fit = [(t, r) for t, r in readings if not r[1]]
    if fit and fit[0][0] != chosen and first[1]:
        t, (best, _imp, _det) = fit[0]
        (name, (step, value)), = list(first[1].items())[:1]
        best.notes.append(f"the keys fit {framework} trainers {', '.join([chosen, *others])} equally; read as {t}: "
                          f"as {chosen}, {name} would be {value:.4g} at step {step:g}, and that estimator is never "
                          f"negative (so the file is not {chosen}'s)")
        return best
    if len(readings) > 1:
        differ = _decided(readings)
        if differ:
            d.notes.append(f"the keys fit {framework} trainers {', '.join([chosen, *others])} equally and the file "
                           f"holds nothing that tells them apart; read as {chosen} (pass --from {framework}/TRAINER "
                           f"to say). The guess decides: " + "; ".join(differ))
    return d


_NONNEGATIVE = re.compile(r"^kl/.*/k[23](?:_seq_sum|_seq_mean)?$")    # k2 = r^2/2, k3 = e^r - 1 - r: never < 0


def _diagnose_as(run: InputRun, source: str | None, *, label: str | None, mappings: list[str] | None,
                 checks: CheckSet, registry: Registry, names: str | None
                 ) -> tuple[Diagnosis, dict[str, tuple[float, float]], Any]:
    """One reading of the run: its diagnosis, the series that cannot be negative but are (canonical name -> the
    first (step, value)), and the translator's detection."""
    pipe = run.pipeline("canonical", source=source, mappings=mappings, registry=registry)
    it = pipe.process(run.records())
    first = next(it, None)                  # the source is resolved: the config's canonical names are known
    config = {**dict(run.info.extra.get("canonical_config") or {}), **pipe.canonical_config()}
    name = label or run.label or run.info.name or run.info.run_id or "run"
    doc = Doctor(checks, config=config, label=name)
    impossible: dict[str, tuple[float, float]] = {}
    watch: list[str] = []
    seen: set[str] = set()
    if first is not None:
        for i, rec in enumerate(_in_batches(itertools.chain([first], it))):
            doc.feed(rec)
            if not rec.metrics.keys() <= seen:
                new = [k for k in rec.metrics if k not in seen]
                seen.update(new)
                watch += [k for k in new if _NONNEGATIVE.match(k)]
            for k in watch:
                v = rec.metrics.get(k)
                if k not in impossible and isinstance(v, (int, float)) and not isinstance(v, bool) and v < -1e-6:
                    impossible[k] = (float(rec.step if rec.step is not None else i), float(v))
    pipe.finish_notes()
    approx = {**dict(run.info.approximate or {}), **pipe.stats.approximate}
    cov = doc.coverage()
    found = doc.finish(approx)
    src = pipe.stats.source or str(run.info.source or "")
    names_from = "your"
    if names and names not in ("your", "source"):
        names_from = names
        shown = {} if names == "canonical" else target_names(
            (m for f in found for m in f.metrics()), names, config=config, mappings=mappings, registry=registry,
            origin=src if src and not src.startswith(("canonical", "unknown", "kept")) else run.info.source)
    else:
        shown = source_names(pipe.stats.renamed)
    name_findings(found, shown)
    d = Diagnosis(label=name, locator=run.locator, source=src,
                  findings=found, records=doc.records, ran=cov["ran"], not_run=cov["not_run"],
                  problems=list(dict.fromkeys(str(p) for p in run.problems)), approximate=approx,
                  names_from=names_from)
    det = pipe.translator.detection if pipe.translator is not None else None
    return d, impossible, det


def _in_batches(records: Iterator[Record], size: int = 256) -> Iterator[Record]:
    """The records as they come, read ``size`` at a time: the pipeline's work and the checks' then run in turns of
    a batch each rather than of a record (a fifth less time per record: each keeps its own code and data warm)."""
    while True:
        batch = list(itertools.islice(records, size))
        if not batch:
            return
        yield from batch


_ASSUMED = re.compile(r"the keys fit (?:(?P<fw>[\w.-]+) )?trainers (?P<all>[\w.-]+(?:, [\w.-]+)+) equally, assuming "
                      r"(?P<chosen>[\w.-]+)")


def _assumed(det: Any) -> tuple[str, str, list[str]] | None:
    """(framework, the trainer assumed, the others the keys fit) when detection guessed among trainers."""
    if det is None or det.spec is None or not det.spec.framework:
        return None
    m = _ASSUMED.search(det.reason or "")
    if m is None:
        return None
    chosen = m.group("chosen")
    others = [t for t in m.group("all").split(", ") if t != chosen]
    return (det.spec.framework, chosen, others) if others else None


def _decided(readings: list[tuple[str, tuple[Diagnosis, Any, Any]]]) -> list[str]:
    """What each reading changes: a check that runs (or finds something) under one trainer and not another."""
    out = []
    base_t, (base, _i, _d) = readings[0]
    for t, (other, _i2, _d2) in readings[1:]:
        only = sorted(set(other.ran) - set(base.ran))
        lost = sorted(set(base.ran) - set(other.ran))
        found_base = {f.id for f in base.findings}
        found_other = {f.id for f in other.findings}
        if only:
            out.append(f"as {t}, {', '.join(only)} would run (not as {base_t})")
        if lost:
            out.append(f"as {t}, {', '.join(lost)} would not run")
        extra = sorted(found_other - found_base)
        gone = sorted(found_base - found_other)
        if extra:
            out.append(f"as {t}, {', '.join(extra)} would be found")
        if gone:
            out.append(f"as {t}, {', '.join(gone)} would not be found")
    return out
