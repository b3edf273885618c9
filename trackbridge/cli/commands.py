"""Subcommands beyond translate/detect/mappings: each registers its parser and its handler here. Each handler returns
an :class:`~trackbridge.exitcodes.ExitCode` (the table per command is in :mod:`trackbridge.exitcodes`)."""
from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Callable

from ..exitcodes import ExitCode

if TYPE_CHECKING:       # pragma: no cover
    from ..read.selection import Selection

_HANDLERS: dict[str, Callable[[argparse.Namespace], int]] = {}


def _selection_options(p: argparse.ArgumentParser, *, metrics: bool = False, within: str = "") -> None:
    """The run selection every reading command takes (:class:`~trackbridge.read.selection.Selection`)."""
    p.add_argument("--runs", dest="select_runs", default=None, metavar="REGEX",
                   help=f"{within}only the runs whose label, name or id contains this regular expression")
    p.add_argument("--tag", dest="select_tags", action="append", default=[], metavar="KEY=VALUE",
                   help="only the runs that hold this tag (repeatable; KEY alone: the tag exists)")
    p.add_argument("--since", dest="select_since", default=None, metavar="WHEN",
                   help="only the runs started at or after WHEN: a date (2026-11-01), a date-time (UTC unless it has "
                        "an offset) or a duration before now (7d, 36h); a run with no wall times is left out, said")
    p.add_argument("--until", dest="select_until", default=None, metavar="WHEN",
                   help="only the runs started at or before WHEN (a date alone: the whole day)")
    if metrics:
        p.add_argument("--metrics", dest="select_metrics", action="append", default=[], metavar="GLOB",
                       help="only the metrics whose written name matches this glob (repeatable: 'reward/*')")


def _selection(args: argparse.Namespace) -> "Selection":
    """The selection the options of :func:`_selection_options` give (a bad one: UsageError, exit 2)."""
    from ..read.inputs import parse_tags
    from ..read.selection import Selection
    return Selection.build(runs=args.select_runs, tags=parse_tags(args.select_tags),
                           metrics=getattr(args, "select_metrics", None) or None,
                           since=args.select_since, until=args.select_until)


def _left_out(command: str, select: "Selection") -> None:
    for line in select.left_out:
        print(f"trackbridge {command}: left out {line}", file=sys.stderr)


def register(sub: "argparse._SubParsersAction") -> None:
    """The subcommands this module runs (the parser registers the rest)."""
    _register_demo(sub)
    _register_migrate(sub)
    _register_replay(sub)
    _register_compare(sub)
    _register_doctor(sub)


def _register_demo(sub: "argparse._SubParsersAction") -> None:
    """``demo``: the example runs through every capability."""
    p = sub.add_parser("demo", help="run the demo on the example runs shipped with trackbridge",
                       description="Translate a TRL GRPO run and a veRL run shipped with trackbridge, log them to "
                                   "every local tracker and compare them; prints where the output is.")
    p.add_argument("--out", default="out/demo", help="output folder (default: out/demo); on a re-run only the files "
                                                     "listed in its .trackbridge-manifest.json (what the demo wrote) "
                                                     "are replaced; a non-empty folder without one is refused")
    _HANDLERS["demo"] = _demo


def _register_migrate(sub: "argparse._SubParsersAction") -> None:
    """``migrate``: copy runs between trackers and files."""
    p = sub.add_parser("migrate", help="copy runs between trackers/files, translating names on the way",
                       description="Copy every run in SRC (a TensorBoard root, an MLflow experiment, a wandb folder, "
                                   "a CSV export, a trainer_state.json, a console log, a JSONL stream) into DST. "
                                   "Idempotent and resumable: running it again writes nothing twice.")
    p.add_argument("src", help="source locator, e.g. tensorboard:runs/tb, mlflow:sqlite:///mlflow.db?experiment=x, "
                               "or a path a reader recognises (runs/tb, out/trainer_state.json, verl.log)")
    p.add_argument("dst", help="destination locator, e.g. mlflow:sqlite:///new.db, tensorboard:out/tb, jsonl:out")
    p.add_argument("--from", dest="source", default="auto", help="source names: auto, canonical or "
                                                                 "FRAMEWORK[/TRAINER][@VERSION]")
    p.add_argument("--names", default=None, help="names to write: canonical (default), keep, or "
                                                 "FRAMEWORK[/TRAINER][@VERSION]; asked for when DST already holds "
                                                 "runs under their frameworks' own names")
    _selection_options(p, metrics=True)
    p.add_argument("--derive", action="store_true", help="also write derived metrics (marked as derived)")
    p.add_argument("--dry-run", action="store_true", help="print what would be written, name by name")
    p.add_argument("--jobs", type=int, default=1, help="runs migrated in parallel (default 1; with --engine ray: "
                                                       "tasks in flight, default the cluster's CPUs)")
    p.add_argument("--engine", choices=["local", "ray"], default="local",
                   help="local (default: this process, --jobs threads) or ray (batches of runs as Ray tasks on a "
                        "cluster: pip install 'trackbridge[ray]')")
    p.add_argument("--ray-address", default=None, metavar="ADDR",
                   help="with --engine ray: the cluster (auto, HOST:PORT, ray://...; default RAY_ADDRESS, else a new "
                        "local cluster)")
    p.add_argument("--batch-runs", type=int, default=None, metavar="N",
                   help="with --engine ray: runs per task (default: about 4 tasks per worker, at most 20 runs)")
    p.add_argument("--requests-per-s", type=float, default=None, metavar="N",
                   help="at most N write requests per second to the destination, all workers together")
    p.add_argument("--points-per-s", type=float, default=None, metavar="N",
                   help="at most N points per second to the destination, all workers together")
    p.add_argument("--strict", action="store_true", help="exit 1 when anything was skipped or is unmapped")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.add_argument("--mappings", action="append", default=[], metavar="PATH", help="extra mapping file")
    _HANDLERS["migrate"] = _migrate


def _register_replay(sub: "argparse._SubParsersAction") -> None:
    """``replay``: a spool into a tracker that missed it."""
    p = sub.add_parser("replay", help="send a logged run from its JSONL spool to a tracker that missed it",
                       description="Send a finished or crashed run from its spool (runs/<run_id>.jsonl) to SINK, "
                                   "skipping what the tracker already holds (per key and step), so nothing is "
                                   "written twice and a batch that landed in part is completed. Without --to: "
                                   "to every tracker that finish() noted as lacking records "
                                   "(runs/<run_id>.jsonl.pending.json).")
    p.add_argument("spool", help="the spool file of the run, e.g. runs/20261122-120000-abc123.jsonl")
    p.add_argument("--to", dest="sink", help="sink locator, e.g. mlflow:sqlite:///runs/mlflow.db (default: the "
                                             "trackers noted by finish())")
    p.add_argument("--names", help="names to write (default: as the run was logged)")
    p.add_argument("--mappings", action="append", default=[], metavar="PATH", help="extra mapping file")
    _HANDLERS["replay"] = _replay


def _register_compare(sub: "argparse._SubParsersAction") -> None:
    """``compare``: runs side by side."""
    p = sub.add_parser("compare", help="compare runs from different frameworks side by side (HTML report)",
                       description="Read each RUN (any locator migrate accepts, optionally LABEL=LOCATOR), translate "
                                   "it to canonical names with derived metrics, and write a self-contained "
                                   "report.html, one PNG per metric, summary.csv and summary.md to --out. "
                                   "One run gives the same report for a single run.")
    p.add_argument("runs", nargs="*", metavar="RUN",
                   help="run locator or LABEL=LOCATOR, e.g. grpo=trainer-state:out/trainer_state.json "
                        "verl=console:verl.log; a plain path a reader recognises works too (verl=verl.log)")
    _selection_options(p, within="of the runs a locator holds, ")
    p.add_argument("--group", action="append", default=[], metavar="LABEL=RUN,RUN,...",
                   help="aggregate seeds: a group of runs (each a RUN label given or a locator), repeatable; the "
                        "report adds per group the mean curve with its band, the IQM, final performance and "
                        "area under the curve with rliable's intervals, and the runs behind each point")
    p.add_argument("--group-by", default=None, metavar="CONFIG_KEY",
                   help="aggregate the runs given by the value of a config key, e.g. trainer.algorithm")
    p.add_argument("--band", default="ci", choices=["ci", "iqr"],
                   help="the groups' band: ci (95%% bootstrap interval of the mean, seeded; default) or iqr")
    p.add_argument("--last", type=int, default=10, metavar="K",
                   help="a run's final performance: the mean of its last K points (default 10)")
    p.add_argument("--metrics", default=None, metavar="NAMES|PRESET",
                   help="comma-separated canonical names, patterns (kl/*) or presets: effectiveness, stability, "
                        "efficiency, data (default: every metric)")
    p.add_argument("--x", default="step", choices=["step", "samples", "tokens", "time"],
                   help="x axis: step (default), samples seen, tokens seen, or wall time since the run's start")
    p.add_argument("--smooth", type=int, default=0, metavar="N",
                   help="draw an EMA of span N over the raw values (tables always use the raw values)")
    p.add_argument("--smooth-kind", default="ema", choices=["ema", "mean"],
                   help="ema (default) or mean (trailing mean of N points)")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="report folder (default: compare-report; with --into no report unless --out is given)")
    p.add_argument("--into", default=None, metavar="SINK",
                   help="also write every run under canonical names into one tracker, e.g. tensorboard:runs/cmp, "
                        "mlflow:sqlite:///cmp.db?experiment=cmp")
    p.add_argument("--mappings", action="append", default=[], metavar="PATH", help="extra mapping file")
    p.add_argument("--title", default=None, help="report title")
    _HANDLERS["compare"] = _compare


def _register_doctor(sub: "argparse._SubParsersAction") -> None:
    """``doctor``: the diagnostic checks over runs."""
    p = sub.add_parser("doctor", help="read runs like an expert: the symptoms of a sick run, what to check first",
                       description="Translate each RUN to canonical names and evaluate the diagnostic checks "
                                   "(mappings/checks.yaml, and check files given with --mappings) over it: KL spikes "
                                   "and collapses, entropy collapse, clipping, exploding gradients, length hacking, "
                                   "truncation, overfitting, load imbalance, low MFU. Findings are ordered by what to "
                                   "look at first, each with its steps, its values, what it means, what to check "
                                   "first and next, the fidelity caveats of its inputs and its sources. Exit status: "
                                   "0 no finding at or above --fail-on, 1 findings, 2 bad usage or input.")
    p.add_argument("runs", nargs="+", metavar="RUN",
                   help="run locator or LABEL=LOCATOR (any locator or path the other commands take)")
    _selection_options(p, within="of the runs a locator holds, ")
    p.add_argument("--json", action="store_true", help="print the findings as JSON")
    p.add_argument("--fail-on", default="warning", choices=["critical", "warning", "info"],
                   help="exit 1 when a finding is at least this severe (default: warning)")
    p.add_argument("--checks", default=None, metavar="IDS", help="comma-separated check ids to run (default: all)")
    p.add_argument("--from", dest="source", default=None, help="source names: auto (default), canonical or "
                                                               "FRAMEWORK[/TRAINER][@VERSION]")
    p.add_argument("--config", metavar="JSON", help="run config as a JSON file, added over the run's own (top_k, "
                                                    "max_response_length ... for the checks that read the config)")
    p.add_argument("--verbose", action="store_true", help="also list the checks that could not run, and why")
    p.add_argument("--names", default=None, metavar="NAMES",
                   help="the names shown beside the canonical ones: the run's own (default), canonical (none), or "
                        "FRAMEWORK[/TRAINER][@VERSION] (that framework's, as translate and migrate --names write)")
    p.add_argument("--mappings", action="append", default=[], metavar="PATH",
                   help="extra mapping, derived-rule or checks file (repeatable)")
    _HANDLERS["doctor"] = _doctor


def _demo(args: argparse.Namespace) -> int:
    from pathlib import Path

    from .demo import run_demo
    return run_demo(Path(args.out))


def run(args: argparse.Namespace) -> int:
    handler = _HANDLERS.get(args.command)
    if handler is None:
        raise ValueError(f"unknown command {args.command!r}")
    return handler(args)


def check_destination(text: str) -> str | None:
    """Why the sink locator ``text`` cannot be written to (an unknown kind, a bad locator, a place its tracker
    refuses), or None: asked before anything is read, so that a bad destination is bad usage (exit 2) and a tracker
    that fails later is a problem of the run (exit 1)."""
    from ..trackers import check_options, kinds, sink_class
    from ..tracking.locators import parse
    try:
        loc = parse(text, kinds=kinds("sink"))
        check_options(loc)
        sink_class(loc.kind).check_location(loc.location)
    except (ValueError, RuntimeError, OSError) as exc:
        return str(exc)
    return None


def _migrate(args: argparse.Namespace) -> int:
    from ..errors import UsageError
    from ..migrate import migrate, names_clash, summary
    from ..tracking.sink import SinkError
    from ..tracking.source import SourceError
    try:
        selection = _selection(args)        # a bad --runs/--since ...: exit 2 before anything is read
        # the default renames: say so first when DST holds runs under other names (not in a dry run, which reads
        # nothing of DST: a tracker's SQLite store read back would gain its WAL files)
        if args.names is None and not args.dry_run:
            clash = names_clash(args.dst, mappings=args.mappings or None)
            if clash:
                print(f"trackbridge migrate: {clash}", file=sys.stderr)
                return ExitCode.USAGE
        result = migrate(args.src, args.dst, source=args.source, names=args.names or "canonical",
                         derive=args.derive, dry_run=args.dry_run, jobs=max(1, args.jobs),
                         mappings=args.mappings or None, progress=not args.quiet, engine=args.engine,
                         ray_address=args.ray_address, batch_runs=args.batch_runs,
                         requests_per_s=args.requests_per_s, points_per_s=args.points_per_s,
                         selection=selection)
    except (SourceError, SinkError, UsageError) as exc:     # nothing readable, a refused destination, no Ray
        print(f"trackbridge migrate: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    _left_out("migrate", selection)
    print(summary(result, dry_run=args.dry_run), file=sys.stderr if not args.dry_run else sys.stdout)
    if not result.runs:
        print(f"trackbridge: no runs found in {args.src}{selection.describe()}", file=sys.stderr)
        return ExitCode.PROBLEMS
    if not result.ok or result.left_out:       # a run failed, or points its tracker could not take were left out
        return ExitCode.PROBLEMS
    if args.strict and (any(r.problems for r in result.runs) or result.totals().unmapped):
        return ExitCode.PROBLEMS
    return ExitCode.OK


_CAVEAT = {"differs": "series not the same quantity in every run",
           "approximate": "series of one run translated approximately",
           "unproven": "series the same quantity as stated, not yet proven by running the framework's code"}


def _compare(args: argparse.Namespace) -> int:
    from ..compare import compare_runs
    if args.into:
        bad = check_destination(args.into)
        if bad:
            print(f"trackbridge compare: --into {args.into}: {bad}", file=sys.stderr)
            return ExitCode.USAGE
    out = args.out if args.out else (None if args.into else "compare-report")
    selection = None
    try:
        selection = _selection(args)
        result = compare_runs(args.runs, metrics=args.metrics, x=args.x, smooth=args.smooth,
                              smooth_kind=args.smooth_kind, out=out, mappings=args.mappings or None,
                              title=args.title, groups=args.group or None, group_by=args.group_by,
                              band=args.band, last=args.last, selection=selection)
    except (ValueError, OSError, RuntimeError) as exc:     # a run that cannot be read: bad input
        if selection is not None:
            _left_out("compare", selection)
        print(f"trackbridge compare: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    _left_out("compare", selection)
    for r in result.runs:
        print(f"{r.label}: {len(r.records)} records, translated from {r.source}", file=sys.stderr)
    for f in result.findings:
        print(f"finding: {f.run}: {f.severity}: {f.check.title}, {f.where()} [{f.id}]", file=sys.stderr)
    said_at_chart = ("differs", "approximate", "unproven")
    caveats = {g: [m for m, _ in result.warning_groups.get(g, []) if m is not None] for g in said_at_chart}
    for g, items in result.warning_groups.items():      # the run-level warnings in full, the metrics' summed up
        for metric, text in items:
            if metric is None or g not in said_at_chart:
                print(f"warning: {text}", file=sys.stderr)
    if any(caveats.values()):
        where = "summary.md and report.html" if result.html is not None else "the report"
        print(f"fidelity: {result.fidelity_line()} (each reason in {where})", file=sys.stderr)
        for g, names in caveats.items():
            if names:
                shown = ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
                print(f"warning: {len(names)} {_CAVEAT[g]}: {shown}", file=sys.stderr)
    for group, labels in result.group_members.items():
        print(f"group {group}: {len(labels)} run{'s' if len(labels) != 1 else ''} ({', '.join(labels)})"
              + ("; one run: no band" if len(labels) == 1 else ""), file=sys.stderr)
    if result.groups:
        print(f"groups: {result.group_fidelity_line()}", file=sys.stderr)
    if result.html is not None:
        print(f"{len(result.metrics)} metrics, {len(result.pngs)} charts", file=sys.stderr)
        print(result.html)
    code = ExitCode.OK if result.metrics else ExitCode.PROBLEMS
    if args.into:                       # after the report: a tracker that fails does not cost the report
        from ..compare.into import write_into
        try:
            result.into = write_into(result.runs, args.into)
        except Exception as exc:  # noqa: BLE001 - the tracker failed: a problem of this run, reported
            print(f"trackbridge compare: --into {args.into}: {type(exc).__name__}: {exc}", file=sys.stderr)
            return ExitCode.PROBLEMS
        for res in result.into:
            print(f"into {args.into}: {res.label} -> run {res.run_id}: {res.records} records"
                  + (f" ({res.skipped} already there)" if res.skipped else ""), file=sys.stderr)
        code = ExitCode.OK
    return code


def _replay(args: argparse.Namespace) -> int:
    from pathlib import Path

    from ..errors import UsageError
    from ..sync.replay import read_pending, replay, settle_pending
    if not Path(args.spool).is_file():
        print(f"trackbridge replay: spool file {args.spool!r} does not exist", file=sys.stderr)
        return ExitCode.USAGE
    if args.sink:
        targets = [args.sink]
    else:
        try:
            targets = [e["sink"] for e in read_pending(args.spool)]
        except ValueError as exc:
            print(f"trackbridge replay: {exc}", file=sys.stderr)
            return ExitCode.USAGE
        if not targets:
            print(f"trackbridge replay: no tracker of {args.spool} was left lacking records (no pending note); "
                  f"give one with --to", file=sys.stderr)
            return ExitCode.OK
    if args.names:
        from ..schema.loader import load_registry
        from ..schema.spec import parse_spec
        parse_spec(args.names, load_registry(args.mappings or None), allow_auto=False)   # SpecError: exit 2
    for target in targets:
        bad = check_destination(target)
        if bad:
            print(f"trackbridge replay: {target}: {bad}", file=sys.stderr)
            return ExitCode.USAGE
    done, code = [], ExitCode.OK
    for target in targets:
        try:
            res = replay(args.spool, target, names=args.names, mappings=args.mappings or None)
        except UsageError as exc:           # the spool is not one (no run header)
            print(f"trackbridge replay: {exc}", file=sys.stderr)
            return ExitCode.USAGE
        except Exception as exc:  # noqa: BLE001 - one failing tracker does not stop the others
            print(f"trackbridge replay: {target}: {type(exc).__name__}: {exc}", file=sys.stderr)
            code = ExitCode.PROBLEMS
            continue
        done.append(target)
        print(f"replayed {args.spool} into {res}", file=sys.stderr)
        for p in res.problems:
            print(f"  skipped: {p}", file=sys.stderr)
        for note in res.notes:
            print(f"  note: {note}", file=sys.stderr)
        if res.damaged:         # a damaged spool line is a problem; the partial last line of a killed run is not
            code = ExitCode.PROBLEMS
    if done:
        settle_pending(args.spool, done)
    return code


def _doctor(args: argparse.Namespace) -> int:
    import json

    from ..doctor import checks_for, diagnose
    from ..doctor.findings import severity_rank
    from ..doctor.report import text_report
    from ..read.inputs import open_runs
    from ..schema.loader import load_registry
    reg = load_registry(args.mappings or None)
    checks = checks_for(reg, args.mappings)           # a bad checks file: MappingError, exit 2
    if args.checks:
        checks = checks.only(c.strip() for c in args.checks.split(",") if c.strip())
    names = (args.names or "").strip() or None
    if names and names != "canonical":
        from ..schema.spec import parse_spec
        parse_spec(names, reg, allow_auto=False)          # SpecError: exit 2, naming the framework
    config = {}
    if args.config:                                   # a JSON file, as translate's and detect's --config
        with open(args.config, encoding="utf-8") as fh:
            config = json.load(fh)
    selection = _selection(args)                      # a bad --runs/--since ...: UsageError, exit 2
    runs = []
    for text in args.runs:
        found = open_runs(text, config=config, rows=True, allow_label=True, select=selection)  # unreadable: 2
        _left_out("doctor", selection)
        selection.left_out.clear()
        if not found:
            print(f"trackbridge doctor: {text}: no runs found{selection.describe()}", file=sys.stderr)
            return ExitCode.USAGE
        for i, run in enumerate(found):
            label = run.label or None
            if label and len(found) > 1:
                label = f"{label}/{run.info.name or run.info.run_id or i}"
            runs.append((run, label))
    results, empty = [], []
    for run, label in runs:
        d = diagnose(run, label=label, source=args.source, mappings=args.mappings or None, checks=checks,
                     registry=reg, names=names)
        if d.records == 0:
            empty.append(d)         # a run with no records is not a run (unless every run is empty)
            continue
        d.problems = [p for p in d.problems if "without metrics" not in p]   # a console log's other lines
        results.append(d)
    if not results:
        print(f"trackbridge doctor: {empty[0].locator}: the run holds no records to diagnose", file=sys.stderr)
        return ExitCode.USAGE
    for d in empty:
        print(f"trackbridge doctor: {d.locator} ({d.label}): no records; left out", file=sys.stderr)
    if args.json:
        out = [d.to_json() for d in results]
        print(json.dumps(out[0] if len(out) == 1 else out, indent=2, default=str))
    else:
        sys.stdout.write(text_report(results, verbose=args.verbose))
    worst = min((severity_rank(f.severity) for d in results for f in d.findings), default=None)
    if worst is not None and worst <= severity_rank(args.fail_on):
        return ExitCode.PROBLEMS
    return ExitCode.OK
