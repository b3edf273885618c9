"""Which mapping entries the real logs hit, and whether each is proven (issue 33: proofs that reach every entry whose
keys appear in the real-log corpus and the examples).

The logs are read as a user reads them: tests/data/real/<framework>/ (the corpus, tests/_support/real_corpus.py:
``open_runs`` and the source detected from the keys and the run config), tests/data/public-logs/*.json (the parsed
public logs the derived-rule tests read; their rows translated with the source detected from the keys) and
examples/ (the sample inputs, opened like the corpus). Every numeric key of every record goes through the run's
translator; the entry a key hits is the mapping entry its translation plan was compiled from (``Plan.fwd``, under
the detected trainer, releases and config: what ``trackbridge translate`` uses for that key). An entry hit by one
log or by several is counted once.

:func:`why_unproven` says, for an entry no proof has fingerprinted, why: the framework cannot run here
(``fidelity_proofs.CANNOT_RUN``), the entry's releases are none of those whose code runs (:func:`run_release`: the
installed wheel, tests/releases.txt's older wheels, the vendored tags' files: tests/_support/vendored.py), a reason of
:data:`ENTRY_WHY` or of a vendored framework's proof module (:func:`entry_why`), or "no proof written yet".
"""
from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from _support import DATA, ROOT

PUBLIC = DATA / "public-logs"
EXAMPLES = ROOT / "examples"

#: the frameworks whose code the suite installs (distribution name): their entries can be proven here
RUNNABLE = {"trl": "trl", "verl": "verl", "openrlhf": "openrlhf", "areal": "areal"}

#: why an entry that covers the installed release has no proof, by (framework, key, trainer or None)
ENTRY_WHY: dict[tuple[str, str, str | None], str] = {
    ("trl", "completion_length", "grpo"): "not logged by TRL >= v0.17.0 (the entry is for Unsloth's patched "
                                          "GRPOTrainer, which still logs it); Unsloth is not installed",
}


@dataclass
class Hit:
    entry: Any
    where: set[str] = field(default_factory=set)     # the logs that hit it (real:<id>, public:<file>, example:<file>)


def _numeric(metrics: dict) -> dict[str, float]:
    return {k: v for k, v in metrics.items()
            if isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool)}


def _note(out: dict, tr: Any, keys: Iterable[str], where: str) -> None:
    keys = sorted(set(keys))
    if tr is None or not keys:
        return
    names = tr._name_map(keys)           # the translator's compiled plans: the entry each key was translated with
    for k in keys:
        plan = names.plan(k)
        if plan is not None and plan.fwd is not None:
            e = plan.fwd
            out.setdefault((e.file, e.line), Hit(e)).where.add(where)


def _opened(path: Path, where: str, out: dict) -> None:
    from trackbridge.read.inputs import open_runs
    for run in open_runs(str(path), rows=True):
        tr = run.resolve().translator
        keys: set[str] = set()
        for rec in run.records():
            metrics = _numeric(rec.metrics)
            keys.update(metrics)
            if tr is not None:
                tr.translate(metrics)        # as the corpus reads it (detection settles on the keys seen)
        _note(out, tr, keys, where)


def logs() -> list[tuple[str, Path]]:
    """Every log read: (label, path)."""
    from _support import real_corpus as RC
    out = [(f"real:{log.id}", log.path) for log in RC.logs()]
    out += [(f"public:{p.name}", p) for p in sorted(PUBLIC.glob("*.json"))]
    out += [(f"example:{p.name}", p) for p in sorted(EXAMPLES.glob("*")) if p.is_file() and p.suffix != ".md"]
    return out


def hits() -> dict[tuple[str, int], Hit]:
    """(entry file, line) -> the entry and the logs whose keys hit it (read once per process: a copy)."""
    return dict(_hits())


@functools.lru_cache(maxsize=1)
def _hits() -> dict[tuple[str, int], Hit]:
    from trackbridge.pipeline import Translator
    out: dict[tuple[str, int], Hit] = {}
    for where, path in logs():
        if where.startswith("public:"):
            tr = Translator("auto", "canonical")
            keys: set[str] = set()
            for row in json.loads(path.read_text(encoding="utf-8"))["rows"]:
                metrics = _numeric(row)
                keys.update(metrics)
                tr.translate(metrics)
            _note(out, tr, keys, where)
        else:
            _opened(path, where, out)
    return out


def releases_of(reg: Any, e: Any) -> str:
    fw = reg.frameworks[e.framework]
    lo = fw.releases[int(e.since)]
    hi = "now" if e.until == float("inf") else fw.releases[int(e.until)]
    return f"{lo}..{hi}" if lo != hi else lo


def run_release(framework: str) -> tuple[str, list[str]] | None:
    """(what runs, its releases: every release whose code runs) for a framework whose code the suite runs: the
    installed wheel, the older releases of tests/releases.txt installed beside it (tests/_support/releases.py) and
    the release tags whose files are vendored in tests/data/frameworks/<framework>/ (tests/_support/vendored.py:
    the primary tag, then each further one); None when none."""
    from _support import framework_code as F
    from _support import releases as R
    from _support import vendored as V
    tags = V.releases(framework) if framework in V.frameworks() else []
    if framework in RUNNABLE:
        dist = RUNNABLE[framework]
        what = f"installs {dist}" + (" or runs its vendored files of" if tags else "")
        return what, [F.release(dist), *R.installed(dist), *tags]
    if tags:
        return f"runs {framework}'s vendored files of", tags
    return None


@functools.lru_cache(maxsize=1)
def entry_why() -> dict[tuple[str, str, str | None], str]:
    """:data:`ENTRY_WHY` with the proof modules' own: ``ENTRY_WHY`` of every tests/_support/proofs_*.py (the reasons
    live beside the proofs that could not be written)."""
    import importlib
    out = dict(ENTRY_WHY)
    for path in sorted(Path(__file__).parent.glob("proofs_*.py")):
        if path.stem == "proofs_corpus":
            continue
        try:
            mod = importlib.import_module(f"_support.{path.stem}")
        except ImportError:             # torch missing: the framework's proofs are skipped, and say so
            continue
        out.update(getattr(mod, "ENTRY_WHY", {}))
    return out


def why_unproven(reg: Any, e: Any) -> str:
    """Why entry ``e`` has no fingerprint proof."""
    from _support import fidelity_proofs as P
    runs = run_release(e.framework)
    if runs is None:
        return P.CANNOT_RUN.get(e.framework, f"{e.framework}'s code is not installed")
    what, versions = runs
    if not any(P.covers(reg, e, v) for v in versions):
        return (f"mapped for {releases_of(reg, e)}; the suite {what} {', '.join(versions)} only (the pinned "
                f"release and tests/releases.txt): a proof needs a release of that range")
    trainers = sorted(e.trainers) if e.trainers else [None]
    for trainer in trainers:
        why = entry_why().get((e.framework, e.key, trainer))
        if why:
            return why
    return "no proof written yet"


@dataclass
class Figures:
    framework: str
    hit: int
    proven: int
    unproven: list[tuple[Any, str, int]]      # (entry, why, logs hitting it)


def figures(reg: Any, proven: Any, found: dict[tuple[str, int], Hit] | None = None) -> list[Figures]:
    """Per framework with an entry hit: entries hit, proven (``(file, line) in proven``), and each unproven one with
    why; frameworks in name order, entries in file order."""
    found = hits() if found is None else found
    out = []
    for name in sorted({h.entry.framework for h in found.values()}):
        mine = sorted((h for h in found.values() if h.entry.framework == name), key=lambda h: h.entry.line)
        done = [h for h in mine if (h.entry.file, h.entry.line) in proven]
        rest = [(h.entry, why_unproven(reg, h.entry), len(h.where)) for h in mine
                if (h.entry.file, h.entry.line) not in proven]
        out.append(Figures(name, len(mine), len(done), rest))
    return out


__all__ = ["Hit", "Figures", "hits", "figures", "logs", "why_unproven", "run_release", "entry_why", "RUNNABLE",
           "ENTRY_WHY"]
