"""The corpus of real public logs (tests/data/real/<framework>/, provenance in each folder's SOURCES.yaml), read as a
new user reads them: ``open_runs`` (what ``trackbridge translate``/``detect``/``doctor`` do with a path), the source
resolved from the keys and the run config (what ``detect`` reports), then every record translated. One
:class:`Outcome` per log; the corpus test and the README's frameworks table are made from these."""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

if __name__ == "__main__":      # run as a script: put tests/ on sys.path so `_support` imports
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from trackbridge.read.inputs import open_runs  # noqa: E402
from trackbridge.schema.loader import Registry, load_registry  # noqa: E402

from _support import DATA  # noqa: E402

REAL = DATA / "real"


@dataclass
class Log:
    """One SOURCES.yaml row."""

    folder: str
    file: str
    framework: str
    trainer: str | None
    release: Any                       # a release name, a list of them, or a text ("unknown-...": not checkable)
    form: str
    own_keys: list[str]
    expect: list[dict[str, str]]
    origin: dict[str, Any]
    metric_log: bool = True            # False: no per-step metrics (a summary over steps, a check table): kept for
    why: str = ""                      # the readers' notes, left out of the bar

    @property
    def path(self) -> Path:
        return REAL / self.folder / self.file

    @property
    def id(self) -> str:
        return f"{self.folder}/{self.file}"

    def releases(self, reg: Registry) -> list[int] | None:
        """The indices of the real releases in the framework's mapping, or None when the log's release is not one
        (a text such as 'unknown-newer-than-mapped: X')."""
        fw = reg.frameworks[self.framework]
        names = self.release if isinstance(self.release, list) else [self.release]
        try:
            return [fw.release_index(str(n)) for n in names]
        except Exception:           # noqa: BLE001 - a release the mapping does not list
            return None


def logs() -> list[Log]:
    out = []
    for sources in sorted(REAL.glob("*/SOURCES.yaml")):
        doc = yaml.safe_load(sources.read_text()) or {}
        for row in doc.get("logs") or []:
            out.append(Log(sources.parent.name, row["file"], row["framework"], row.get("trainer"),
                           row.get("release"), row.get("form", ""), list(row.get("own_keys") or []),
                           list(row.get("expect") or []), dict(row.get("origin") or {}),
                           bool(row.get("metric_log", True)), str(row.get("why", ""))))
    return out


@dataclass
class Outcome:
    log: Log
    source: str = "unknown"
    framework: str | None = None
    trainer: str | None = None
    lo: float = math.nan
    hi: float = math.nan
    confidence: float = 0.0
    numeric: set[str] = field(default_factory=set)     # numeric keys the log holds (less its own keys)
    mapped: set[str] = field(default_factory=set)      # of those, translated to a canonical name
    known: set[str] = field(default_factory=set)       # of those, logged by the framework (mapped or passthrough)
    canonical: dict[str, set[str]] = field(default_factory=dict)   # raw key -> canonical names it was written as
    error: str = ""

    @property
    def recognised(self) -> bool:
        return self.framework == self.log.framework and (self.log.trainer is None or self.trainer == self.log.trainer)

    def release_right(self, reg: Registry) -> bool | None:
        real = self.log.releases(reg)
        if real is None:
            return None
        return any(self.lo <= r <= self.hi for r in real)

    @property
    def share_mapped(self) -> float:
        return len(self.mapped) / len(self.numeric) if self.numeric else 0.0

    @property
    def share_known(self) -> float:
        return len(self.known) / len(self.numeric) if self.numeric else 0.0


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def run(log: Log, reg: Registry | None = None) -> Outcome:
    reg = reg or load_registry()
    out = Outcome(log)
    try:
        runs = open_runs(str(log.path), rows=True)
    except Exception as exc:           # noqa: BLE001 - reported as the outcome
        out.error = f"{type(exc).__name__}: {exc}"
        return out
    own = set(log.own_keys)
    for r in runs:
        pipe = r.resolve()
        tr = pipe.translator
        det = tr.detection if tr is not None else None
        if det is not None and det.spec is not None:
            out.source, out.confidence = det.source, det.confidence
            out.framework, out.trainer = det.spec.framework, det.spec.trainer
            out.lo, out.hi = det.spec.lo, det.spec.hi
        elif det is not None:
            out.source = det.source
        fw = reg.frameworks.get(out.framework or "")
        for rec in r.records():
            raw = {k: v for k, v in rec.metrics.items() if _is_number(v) and k not in own}
            out.numeric.update(raw)
            if tr is None:
                continue
            res = tr.translate(dict(raw))
            unmapped = set(res.unmapped) | set(res.conflicts)
            for k in raw:
                if k not in unmapped:
                    out.mapped.add(k)
                    out.known.add(k)
                    out.canonical.setdefault(k, set()).add(res.renamed.get(k, k))
                elif fw is not None and (fw.logs_unmapped(k) or fw.logs_unmapped(fw.split_prefix(k)[1])):
                    out.known.add(k)
    return out


__all__ = ["Log", "Outcome", "logs", "run", "REAL"]


# ------------------------------------------------------------------------------------------------ the README
HEADER = """# Real public logs (issue 29)

Logs of RL fine-tuning runs that users pasted into public GitHub issues and pull requests or committed to public
repositories, never written here: each file is a verbatim copy of what the search corpus stores (an issue's pasted
block, a committed file), cut only where the row says so. Each folder's `SOURCES.yaml` gives every file's origin
(repository and issue, or path and commit), the release the run used and how that is known, the keys the user's own
code added, and a sample of keys with the canonical name the framework's source gives them (cited). Read by
`tests/unit/test_real_corpus.py` as a new user reads them (`trackbridge translate FILE` / `detect FILE`). A file that
holds no per-step metrics (`metric_log: false`) is kept for the readers' notes and left out of the bar.

This file is generated: `python tests/_support/real_corpus.py --readme` (the corpus test fails when it is stale).

| file | framework / trainer | release | form | origin |
|---|---|---|---|---|
"""


def _origin(log: Log) -> str:
    o = log.origin
    repo = o.get("repository", "?")
    if o.get("commit"):
        return f"{repo} `{o.get('path', '')}` @ {str(o['commit'])[:12]}"
    what = f"#{o['issue']}" if o.get("issue") else ""
    return f"{repo} {what} ({o.get('date', '')})".replace("  ", " ")


def readme() -> str:
    rows = []
    for log in logs():
        rel = ", ".join(map(str, log.release)) if isinstance(log.release, list) else str(log.release)
        rows.append(f"| {log.id} | {log.framework} / {log.trainer} | {rel} | {log.form} | {_origin(log)} |")
    return HEADER + "\n".join(rows) + "\n"


CORPUS_COLUMNS = ("real logs", "recognised", "keys mapped", "keys placed")


def update_main_readme(text: str, figures: dict[str, dict[str, str]]) -> str:
    """README.md with the corpus columns of its 'Frameworks mapped' table set to ``figures`` (each framework's first
    row, found by its mapping file)."""
    head, sep, rest = text.partition("**Frameworks mapped**")
    lines = rest.split("\n")
    cols: list[str] | None = None
    done: set[str] = set()
    for i, ln in enumerate(lines[:60]):
        if not ln.startswith("|"):
            if cols is not None:
                break
            continue
        cells = [c.strip() for c in ln.strip().strip("|").split("|")]
        if cols is None:
            cols = cells
            continue
        name = dict(zip(cols, cells)).get("file", "").strip("`").removesuffix(".yaml")
        if name in figures and name not in done:
            done.add(name)
            for col in CORPUS_COLUMNS:
                cells[cols.index(col)] = figures[name][col]
            lines[i] = "| " + " | ".join(cells) + " |"
    return head + sep + "\n".join(lines)


def summary(outcomes: list[Outcome], reg: Registry) -> dict[str, dict[str, str]]:
    """Per framework: the README frameworks table's corpus columns (real logs, recognised with the release right,
    numeric keys translated, numeric keys placed: translated or passed through as the framework's own)."""
    out: dict[str, dict[str, str]] = {}
    for name in reg.frameworks:
        mine = [o for o in outcomes if o.log.framework == name and o.log.metric_log]
        ok = [o for o in mine if o.recognised and o.release_right(reg) is not False]
        numeric = sum(len(o.numeric) for o in mine)
        mapped = sum(len(o.mapped) for o in mine)
        placed = sum(len(o.known) for o in mine)
        out[name] = {"real logs": str(len(mine)), "recognised": f"{len(ok)}/{len(mine)}",
                     "keys mapped": f"{mapped}/{numeric}", "keys placed": f"{placed}/{numeric}"}
    return out


if __name__ == "__main__":       # pragma: no cover - a maintainer's command
    if "--readme" in sys.argv:
        (REAL / "README.md").write_text(readme())
        print(f"wrote {REAL / 'README.md'}")
        from _support import ROOT
        reg = load_registry()
        figures = summary([run(log, reg) for log in logs()], reg)
        main = ROOT / "docs" / "translation.md"      # its "Frameworks mapped" table
        main.write_text(update_main_readme(main.read_text(), figures))
        print(f"wrote the corpus columns of {main}")
