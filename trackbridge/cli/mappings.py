"""Human-readable views of the mappings: ``trackbridge mappings list``, ``show``, ``lint`` and the generated reference
page (docs/metrics.md). They print, and lint reads the derived rules too, so they live beside the CLI, above the
schema layer they read."""
from __future__ import annotations

import sys
from collections import defaultdict

from ..schema.loader import Registry, build_registry, shipped_files, user_files
from ..schema.model import Entry, FrameworkMapping, condition_value_text
from ..schema.yamlfile import MappingError, MappingErrors


def check_user_files(paths: list[str]) -> Registry:
    """What ``mappings lint`` checks of the user's files, for every command's ``--mappings``: the mapping entries,
    the derived rules and the diagnostic checks among them (a file lint rejects is rejected everywhere). Raises
    :class:`~trackbridge.schema.yamlfile.MappingError` naming file and line; returns the registry."""
    from ..derive import lint_rules
    from ..doctor import lint_checks
    from ..schema.loader import load_registry
    reg = load_registry(paths)
    lint_rules(reg, [str(p) for p in paths])
    lint_checks(reg, [str(p) for p in paths])
    return reg


def lint(paths: list[str], *, unstated: bool = False, require_reduction: bool | None = None) -> int:
    """Check the shipped mappings plus ``paths``; print every problem as ``file:line: entry: message``. Entries whose
    reduction is unstated are warnings (one line per file, or each with ``unstated``), errors with
    ``require_reduction`` (default: :data:`~trackbridge.schema.reductions.REQUIRE_REDUCTION`): of the files named in
    ``paths`` when any are (shipped or not: "is my file done?"), else of every file."""
    from pathlib import Path

    from ..schema import reductions
    named = {str(Path(p).resolve()) for p in paths}
    paths = user_files(paths, shipped_files())       # a shipped file named on the command line is the shipped file
    require = require_reduction if require_reduction is not None else reductions.REQUIRE_REDUCTION
    try:
        reg = build_registry(shipped_files(), paths, require_reduction=require and not named)
    except MappingErrors as exc:
        for e in exc.errors:
            print(str(e), file=sys.stderr)
        print(f"{len(exc.errors)} problem(s)", file=sys.stderr)
        return 2
    except MappingError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    # derived rules: the schema errors of every file, then their meaning
    from ..derive import lint_rules
    try:
        n_rules = lint_rules(reg, [str(p) for p in paths])
    except MappingError as exc:            # RuleError / RuleErrors (a MappingError), or the registry's
        errs = getattr(exc, "errors", None) or [exc]
        for e in errs:
            print(str(e), file=sys.stderr)
        if len(errs) > 1:
            print(f"{len(errs)} problem(s)", file=sys.stderr)
        return 2
    if require and named:
        mine = [w for w in reg.warnings if w.file and str(Path(w.file).resolve()) in named]
        if mine:
            for e in mine:
                print(str(e), file=sys.stderr)
            print(f"{len(mine)} problem(s)", file=sys.stderr)
            return 2
    # diagnostic checks (trackbridge doctor): the shipped ones and those among the paths
    from ..doctor import lint_checks
    try:
        n_checks = lint_checks(reg, [str(p) for p in paths])
    except MappingError as exc:            # CheckError (a MappingError), or several at once
        errs = getattr(exc, "errors", None) or [exc]
        for e in errs:
            print(str(e), file=sys.stderr)
        return 2
    _warn_unstated(reg, each=unstated)
    for said in reg.overrides:
        print(f"note: {said}")
    n = sum(len(f.entries) for f in reg.frameworks.values())
    print(f"ok: {len(reg.canonical.metrics)} canonical metrics, {n} framework entries in "
          f"{len(reg.frameworks)} frameworks, {n_rules} derived rules, {n_checks} checks ({len(reg.files)} files)")
    return 0


def _warn_unstated(reg: Registry, *, each: bool) -> None:
    """The entries that state no reduction (warnings of the loader): each as ``file:line: key: ...``, or one line per
    file with the count and the first lines."""
    if each:
        for w in reg.warnings:
            print(f"warning: {w}", file=sys.stderr)
        return
    by_file: dict[str, list[int]] = defaultdict(list)
    for w in reg.warnings:
        by_file[w.file or "<mappings>"].append(w.line or 0)
    for f, lines in by_file.items():
        first = ", ".join(map(str, lines[:5])) + (" ..." if len(lines) > 5 else "")
        print(f"warning: {f}: {len(lines)} reduction{'' if len(lines) == 1 else 's'} unstated (lines {first}): "
              "state `reduce:` (docs/reductions.md); `trackbridge mappings lint --unstated` lists them",
              file=sys.stderr)


def fidelity_text(reg: Registry, e: Entry, sep: str = ": ") -> str:
    """An entry's fidelity against its canonical name as a reader sees it: hand-written (legacy), or computed from
    its stated reduction under the framework's defaults at the newest release it covers (what a run whose config
    says nothing gets; a run's own config may change it)."""
    if e.reduce is None:
        return "exact" if e.exact else f"approximate{sep}{e.reason}"
    from ..schema.proofs import UNPROVEN
    from ..translate.fidelity import judge, reference, resolve, unproven
    fw = reg.frameworks[e.framework]
    newest = float(min(e.until, len(fw.releases) - 1))
    r = resolve(e, fw, None, newest, newest, {})
    metric = reg.canonical.find(e.canonical)
    ref = reference(metric) if metric is not None else None
    if r is None or ref is None:
        return "approximate (no reference reduction to compare with)"
    why = judge(r, ref)
    if why is None and unproven([(e, r)], reg.proven, "the canonical reduction"):
        return f"approximate (default config){sep}{UNPROVEN} (equal to the reference as stated; no proof ran it yet)"
    return "exact (default config, proven)" if why is None else f"approximate (default config){sep}{why}"


def _range(fw: FrameworkMapping, e: Entry) -> str:
    lo = fw.release_name(e.since)
    hi = "now" if e.until == float("inf") else fw.release_name(int(e.until))
    return f"{lo}..{hi}"


def listing(reg: Registry) -> str:
    lines = [f"canonical schema {reg.canonical.version}: {len(reg.canonical.metrics)} metrics, "
             f"{len(reg.canonical.config)} config names"]
    for fw in reg.frameworks.values():
        lines.append(f"{fw.name}: releases {fw.releases[0]}..{fw.releases[-1]} ({len(fw.releases)}), "
                     f"{len(fw.entries)} entries, trainers: {', '.join(fw.trainers) or '-'}")
        for alias, spec in fw.aliases.items():
            if alias != fw.name:
                extra = ", ".join(f"{k}={v}" for k, v in spec.items())
                lines.append(f"  alias {alias}{' (' + extra + ')' if extra else ''}")
    return "\n".join(lines)


def show(reg: Registry, name: str) -> str | None:
    """A framework, alias or FRAMEWORK/TRAINER[@VERSION] (its names), or a canonical metric (every framework's name)."""
    from ..schema.spec import SpecError, parse_spec
    spec = None
    if reg.resolve_alias(name.partition("/")[0].partition("@")[0]) is not None:
        try:
            spec = parse_spec(name, reg)
        except SpecError:
            spec = None
    if spec is not None and spec.kind == "framework" and spec.framework is not None:
        fw = reg.frameworks[spec.framework]
        trainer = spec.trainer
        lo, hi = spec.bounds(len(fw.releases))
        shown = [r for i, r in enumerate(fw.releases) if lo <= i <= hi]
        lines = [f"# {fw.name}{' / ' + trainer if trainer else ''}: {fw.description}".rstrip(),
                 f"releases: {', '.join(shown)}", ""]
        for e in fw.entries:
            if not e.applies(trainer, lo, hi):
                continue
            fid = fidelity_text(reg, e)
            tr = f" [{', '.join(sorted(e.trainers))}]" if e.trainers else ""
            lines.append(f"{e.key:45s} -> {e.canonical:40s} {_range(fw, e)}{tr}  {fid}")
        return "\n".join(lines)
    metric = reg.canonical.metrics.get(name) or reg.canonical.find(name)
    renamed = []
    if metric is None and reg.canonical.upgrade(name) != name:      # an older schema version's name
        metric = reg.canonical.find(reg.canonical.upgrade(name))
        renamed = [f"({name} is the name of an older canonical schema version; renamed {metric.name})"] if metric \
            else []
    if metric is None:
        return _show_framework_key(reg, name)
    lines = renamed + [f"# {metric.name}", metric.description, f"unit: {metric.unit}; kind: {metric.kind}; "
             f"better: {metric.better}" + (f"; estimator: {metric.estimator}" if metric.estimator else "")
             + (f"; reduction: {metric.reduction}" if metric.reduction else "")
             + (f"; role: {metric.role}" if metric.role else "")
             + (f"\nreference reduction: {metric.reduce.text()}" if metric.reduce is not None else ""), ""]
    for fw in reg.frameworks.values():
        for e in fw.entries:
            if e.canonical == metric.name:
                fid = fidelity_text(reg, e)
                tr = f" [{', '.join(sorted(e.trainers))}]" if e.trainers else ""
                lines.append(f"{fw.name:9s} {e.key:40s} {_range(fw, e)}{tr}  {fid}  ({e.source})")
    return "\n".join(lines)


def _show_framework_key(reg: Registry, key: str) -> str | None:
    """A framework's key (``objective/kl``): the canonical quantity it is in each trainer and release, and every
    framework's name for that quantity."""
    found: dict[str, list[tuple[FrameworkMapping, Entry]]] = {}
    for fw in reg.frameworks.values():
        split, rest = fw.split_prefix(key)
        for e, caps in fw.lookup(key) or (fw.lookup(rest) if split else []):
            canon = e.canonical_template.fill(caps) if e.canonical_template is not None and caps else e.canonical
            found.setdefault(canon, []).append((fw, e))
    if not found:
        return None
    parts = []
    for canon, hits in found.items():
        where = "; ".join(f"{fw.name} {_range(fw, e)}" + (f" [{', '.join(sorted(e.trainers))}]" if e.trainers else "")
                          for fw, e in hits)
        parts.append(f"{key!r} is canonical {canon!r} in {where}\n")
        parts.append(show(reg, canon) or "")
    return "\n\n".join(parts)


def reference(reg: Registry) -> str:
    """The canonical catalogue with each framework's names per release side by side (Markdown)."""
    by_canon: dict[str, list[Entry]] = defaultdict(list)
    for fw in reg.frameworks.values():
        for e in fw.entries:
            by_canon[e.canonical].append(e)
    out = ["# Metric reference", "",
           f"Generated from `mappings/*.yaml` by `trackbridge mappings docs` (canonical schema "
           f"{reg.canonical.version}). Do not edit by hand.", "",
           "Each canonical metric lists every framework name that maps to it, the releases that log that name, "
           "and whether it is the same quantity (**exact**) or only **approximately** the same (and why): "
           "hand-written for entries that state no reduction yet, else computed from the entry's stated reduction "
           "against the metric's reference reduction under the framework's default config (docs/reductions.md; a "
           "run's own config may change it). "
           "Names in different rows of one table with *approximate* fidelity are not the same quantity: compare "
           "them with care.", ""]
    sections: dict[str, list[str]] = defaultdict(list)
    for name in reg.canonical.metrics:
        sections[name.split("/", 1)[0]].append(name)
    out.append("Sections: " + ", ".join(f"[{s}](#{s})" for s in sections))
    out.append("")
    for section, names in sections.items():
        out += [f"## {section}", ""]
        for name in names:
            m = reg.canonical.metrics[name]
            facts = [f"unit `{m.unit}`", f"kind {m.kind}"]
            if m.better != "none":
                facts.append(f"{m.better} is better")
            if m.estimator:
                facts.append(f"estimator {m.estimator}")
            if m.reduction:
                facts.append(f"reduction {m.reduction}")
            if m.role:
                facts.append(f"role {m.role}")
            if m.reduce is not None:
                facts.append(f"reference reduction `{{{m.reduce.text()}}}`")
            out += [f"### `{name}`", "", m.description, "", "; ".join(facts), ""]
            es = by_canon.get(name, [])
            if es:
                out += ["| framework | name | releases | trainers | fidelity | source |", "|---|---|---|---|---|---|"]
                for e in es:
                    fw = reg.frameworks[e.framework]
                    fid = fidelity_text(reg, e).replace("|", "\\|")
                    if e.reduce is not None:
                        fid += f" (`{{{e.reduce.text()}}}`)".replace("|", "\\|")
                    tr = ", ".join(sorted(e.trainers)) if e.trainers else "all"
                    if e.when:
                        tr += " when " + ", ".join(condition_value_text(k, v) for k, v in e.when)
                    out.append(f"| {e.framework} | `{e.key}` | {_range(fw, e)} | {tr} | {fid} | `{e.source}` |")
                out.append("")
    cfg = reg.canonical.config
    out += ["## Config names", "", "| canonical | meaning | " + " | ".join(reg.frameworks) + " |",
            "|---|---|" + "---|" * len(reg.frameworks)]
    for name, spec in cfg.items():
        cells = []
        for fw in reg.frameworks.values():
            keys = [f"`{c.key}`" + (f" ({', '.join(sorted(c.trainers))})" if c.trainers else "")
                    for c in fw.config if c.canonical == name]
            cells.append("<br>".join(keys) or "")
        out.append(f"| `{name}` | {spec.get('description', '')} | " + " | ".join(cells) + " |")
    out.append("")
    return "\n".join(out)
