"""The ``trackbridge`` command line: a thin layer over the library.

Exit codes (0 ok, 1 done with problems, 2 bad usage or input, 130 interrupted) are :mod:`trackbridge.exitcodes`'
(the table per command is there and in ``docs/cli.md``). ``trackbridge --help`` imports neither the translator, the
logger nor any tracker: each command imports what it needs when it runs (:mod:`.commands` registers the
subcommands beyond the parser's own; :mod:`.demo` is ``trackbridge demo``, :mod:`.mappings` the ``mappings`` views).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Iterator

from .._version import __version__
from ..exitcodes import ExitCode


def _add_mappings(p: argparse.ArgumentParser) -> None:
    p.add_argument("--mappings", action="append", default=[], metavar="PATH",
                   help="extra mapping/derived-rule YAML file (repeatable), checked like the shipped ones")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="trackbridge", description=(
        "Translate, multiplex, migrate and compare RL fine-tuning metrics across TRL, veRL and OpenRLHF and "
        "wandb / TensorBoard / MLflow / Trackio."))
    parser.add_argument("--version", action="version", version=f"trackbridge {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("translate", help="translate logged dicts (JSON lines or trainer_state.json)",
                       description="Read JSON lines (one logged dict per line; a trainer_state.json is also "
                                   "accepted) and write translated JSON lines to stdout.")
    p.add_argument("--from", dest="source", default="auto",
                   help="source names: auto (default), canonical, or FRAMEWORK[/TRAINER][@VERSION] "
                        "(trl/grpo@0.14.0, trl-legacy, verl@0.4.1, openrlhf)")
    p.add_argument("--to", dest="target", default="canonical",
                   help="target names: canonical (default) or FRAMEWORK[/TRAINER][@VERSION]")
    p.add_argument("--report-json", metavar="PATH", help="write {mapped, unmapped, approximate, source} here")
    p.add_argument("--strict", action="store_true", help="exit 1 when any key is unmapped")
    p.add_argument("--derive", action="store_true", help="fill in derived metrics (see mappings/derived.yaml)")
    p.add_argument("--config", metavar="JSON", help="run config as a JSON file, added over the run's own (for "
                                                    "config-dependent entries, trainer detection and derived rules)")
    _add_mappings(p)
    p.add_argument("file", nargs="?", default="-", help="input: JSON lines, a trainer_state.json, a console log, a "
                                                          "CSV export, any run locator, or - for stdin (default)")

    p = sub.add_parser("detect", help="name the framework, trainer and releases that logged these keys")
    p.add_argument("file", help="a file or folder (JSON lines, trainer_state.json, a console log, a CSV export, a "
                                "TensorBoard or wandb folder) or any run locator (console:PATH, mlflow:URI, ...)")
    p.add_argument("--json", action="store_true", help="print the detection as JSON")
    p.add_argument("--config", metavar="JSON", help="run config as a JSON file, added over the run's own (a "
                                                    "TensorBoard folder's args, a stream header's config)")
    _add_mappings(p)

    p = sub.add_parser("mappings", help="list, show, lint or document the mapping files")
    msub = p.add_subparsers(dest="mcommand", metavar="ACTION")
    q = msub.add_parser("list", help="frameworks, trainers, releases and the canonical schema version")
    _add_mappings(q)
    q = msub.add_parser("show", help="one framework's entries, or one canonical name across frameworks")
    q.add_argument("name", help="a framework (trl, trl-legacy, verl, openrlhf) or a canonical metric name")
    _add_mappings(q)
    q = msub.add_parser("lint", help="check mapping files; exit 2 with file:line: entry: problem on errors")
    q.add_argument("paths", nargs="*", help="extra files to check together with the shipped ones")
    q.add_argument("--unstated", action="store_true",
                   help="list every entry whose reduction is unstated (no reduce:), as file:line: key (else one "
                        "line per file)")
    q.add_argument("--require-reduction", action="store_true",
                   help="an entry whose reduction is unstated is an error (exit 2), as it will be once every shipped "
                        "entry states one: in the files named (a shipped file named is checked once), else in all")
    q = msub.add_parser("docs", help="generate the metric reference (Markdown) from the YAML")
    q.add_argument("--out", metavar="PATH", help="write here instead of stdout")
    _add_mappings(q)

    from . import commands  # noqa: F401  (other subcommands register themselves here)
    commands.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        parser = build_parser()
        args = parser.parse_args(argv)          # bad usage: argparse exits with 2 (ExitCode.USAGE)
        if args.command is None:
            parser.print_help()
            return ExitCode.USAGE
        return int(_dispatch(args, parser))
    except KeyboardInterrupt:
        print("trackbridge: interrupted", file=sys.stderr)
        return ExitCode.INTERRUPTED


def _dispatch(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from ..schema.spec import SpecError
    from ..schema.yamlfile import MappingError
    try:
        if getattr(args, "mappings", None) and args.command != "mappings":
            from .mappings import check_user_files
            check_user_files(args.mappings)     # a file mappings lint rejects is rejected here too, naming it
        if args.command == "translate":
            return cmd_translate(args)
        if args.command == "detect":
            return cmd_detect(args)
        if args.command == "mappings":
            return cmd_mappings(args, parser)
        from . import commands
        return commands.run(args)
    except MappingError as exc:
        print(f"trackbridge: invalid mappings:\n{exc}", file=sys.stderr)
        return ExitCode.USAGE
    except SpecError as exc:
        print(f"trackbridge: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    except BrokenPipeError:                 # `trackbridge translate ... | head`: the reader is gone, not an error
        try:
            sys.stdout = open(os.devnull, "w")
        except OSError:
            pass
        return ExitCode.OK
    except (ValueError, OSError, RuntimeError) as exc:     # UsageError, SourceError, UnicodeDecodeError ...: input
        print(f"trackbridge: {_one_line(exc)}", file=sys.stderr)
        return ExitCode.USAGE


def _one_line(exc: BaseException) -> str:
    if isinstance(exc, UnicodeDecodeError):
        return f"not a text file ({exc.reason} at byte {exc.start}); is it a database or a binary log?"
    return str(exc)


# ---------------------------------------------------------------------------------------------------- translate
def _load_config(path: str | None) -> dict[str, Any]:
    if not path:
        return {}
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def cmd_translate(args: argparse.Namespace) -> int:
    from ..pipeline import Stats
    from ..read.inputs import open_runs
    from ..record import Record
    runs = open_runs(args.file, rows=True, config=_load_config(args.config))   # as detect, migrate, compare read it
    problems: list[str] = []
    total = Stats()
    sources: dict[str, None] = {}
    keys: dict[str, None] = {}
    notes: dict[str, None] = {}
    out = sys.stdout

    def seen(records: Iterator[Record]) -> Iterator[Record]:
        for rec in records:
            keys.update(dict.fromkeys(rec.metrics))
            yield rec

    for run in runs:
        pipe = run.pipeline(args.target, source=args.source, mappings=args.mappings or None, derive=args.derive)
        for rec in pipe.process(seen(run.records())):
            if getattr(run.reader, "shape", "dict") == "record":
                obj: dict[str, Any] = {"step": rec.step, "wall_time": rec.wall_time, "metrics": rec.metrics}
                if rec.derived:
                    obj["derived"] = rec.derived
            else:
                obj = dict(rec.metrics)
                if rec.step is not None and "step" not in obj:
                    obj = {"step": rec.step, **obj}
            out.write(json.dumps(obj, default=_json_default) + "\n")
        notes.update(dict.fromkeys(pipe.finish_notes()))
        total.merge(pipe.stats)
        if pipe.stats.source:
            sources[pipe.stats.source] = None
        problems += [str(p) for p in run.problems if "without metrics" not in str(p)]
    unmapped = [k for k in total.unmapped if k not in total.conflicts]
    mapped = [k for k in keys if k not in total.unmapped and k not in total.conflicts]
    source = "; ".join(sources)
    for p in problems:
        print(f"trackbridge: {p}", file=sys.stderr)
    for n in notes:
        print(f"trackbridge: note: {n}", file=sys.stderr)
    report: dict[str, Any] = {"mapped": len(mapped), "unmapped": unmapped, "approximate": dict(total.approximate),
                              "source": source}
    if total.conflicts:
        report["conflicts"] = dict(total.conflicts)
    if args.derive:
        report["derived"] = list(total.derived)
    if problems:
        report["skipped"] = problems
    if notes:
        report["notes"] = list(notes)
    if args.report_json:
        with open(args.report_json, "w", encoding="utf-8") as fh:
            json.dump(report, fh, indent=2)
    conflicts = f", {len(total.conflicts)} kept as is (their name was taken)" if total.conflicts else ""
    print(f"trackbridge: {len(mapped)} keys mapped, {len(unmapped)} unmapped{conflicts}, {len(total.approximate)} "
          f"approximate (source: {source})", file=sys.stderr)
    if problems:
        return ExitCode.PROBLEMS
    if args.strict and unmapped:
        print(f"trackbridge: --strict: unmapped keys: {', '.join(unmapped)}", file=sys.stderr)
        return ExitCode.PROBLEMS
    return ExitCode.OK


def _json_default(obj: Any) -> Any:
    from ..record import encode_value
    enc = encode_value(obj)
    if enc is not obj:
        return enc
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if hasattr(obj, "item"):
        return obj.item()
    return str(obj)


# ---------------------------------------------------------------------------------------------------- detect
def cmd_detect(args: argparse.Namespace) -> int:
    from ..read.inputs import open_runs
    from ..schema.loader import load_registry
    reg = load_registry(args.mappings or None)
    runs = open_runs(args.file, rows=True, config=_load_config(args.config))   # as translate, migrate, compare
    dets = []
    for run in runs:
        pipe = run.resolve(mappings=args.mappings or None, registry=reg)
        dets.append((run, pipe, _detection(pipe)))
        for p in run.problems:
            if "without metrics" not in str(p):
                print(f"trackbridge: {p}", file=sys.stderr)
    if not dets:
        print(f"trackbridge: no runs in {args.file}", file=sys.stderr)
        return ExitCode.PROBLEMS
    if args.json:
        items = [{**det.to_json(), "run": run.info.name, "config": sorted(_config_keys(run.info.config))}
                 for run, _, det in dets]
        print(json.dumps(items[0] if len(items) == 1 else items, indent=2, default=str))
    for run, pipe, det in ([] if args.json else dets):
        if len(dets) > 1:
            print(f"run:         {run.info.name or run.info.run_id}")
        print(f"source:      {det.source}")
        print(f"confidence:  {det.confidence:.2f}")
        if det.n_keys:                      # 0: the run or the user named the source, nothing was detected
            print(f"explained:   {det.explained} of {det.n_keys} keys")
        print(f"why:         {det.reason}")
        if run.info.config and det.n_keys:
            print(f"run config:  {', '.join(sorted(_config_keys(run.info.config))[:12])}"
                  + (" ..." if len(_config_keys(run.info.config)) > 12 else "") + " (used to tell trainers apart)")
        if det.candidates:
            print(f"runners-up:  {', '.join(det.candidates)}")
        if det.unexplained:
            print(f"unexplained: {', '.join(det.unexplained[:30])}{' ...' if len(det.unexplained) > 30 else ''}")
    return ExitCode.OK if all(det.spec is not None for _, _, det in dets) else ExitCode.PROBLEMS


def _config_keys(config: dict[str, Any]) -> list[str]:
    """The top-level keys of a run config (``args``, ``model_config`` for a transformers TensorBoard folder)."""
    return [str(k) for k in (config or {})]


def _detection(pipe: Any) -> Any:
    """What ``pipe`` (an :class:`~trackbridge.pipeline.Pipeline` set up on a run) resolved its source to, as a
    :class:`~trackbridge.detect.Detection`: the detector's answer, or the source the run or the user named."""
    from ..detect import Detection
    tr = pipe.translator
    if tr is not None and tr.detection is not None:
        return tr.detection
    if tr is None:
        return Detection(None, "kept as stored", 0.0, 0, 0, reason="names kept as stored")
    named = "the run says its names are canonical (written by trackbridge" + (
        f"; translated from {pipe.origin})" if pipe.origin else ")")
    return Detection(tr.source_spec, tr.source, 1.0, 0, 0, reason=named if tr.source_spec.kind == "canonical"
                     else f"given: {tr.source}")


# ---------------------------------------------------------------------------------------------------- mappings
def cmd_mappings(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from ..schema.loader import load_registry
    from . import mappings as docs
    if args.mcommand is None:
        print("trackbridge mappings: choose an action: list, show NAME, lint [PATH...], docs", file=sys.stderr)
        return ExitCode.USAGE
    if args.mcommand == "lint":           # problems in mapping files are bad input: 2
        code = docs.lint(args.paths, unstated=args.unstated, require_reduction=args.require_reduction or None)
        return ExitCode.OK if code == 0 else ExitCode.USAGE
    reg = load_registry(args.mappings or None)
    if args.mcommand == "list":
        print(docs.listing(reg))
        return ExitCode.OK
    if args.mcommand == "show":
        text = docs.show(reg, args.name)
        if text is None:
            print(f"trackbridge: {args.name!r} is neither a framework nor a canonical metric name", file=sys.stderr)
            return ExitCode.USAGE
        print(text)
        return ExitCode.OK
    if args.mcommand == "docs":
        text = docs.reference(reg)
        if args.out:
            with open(args.out, "w", encoding="utf-8") as fh:
                fh.write(text)
            print(f"wrote {args.out}", file=sys.stderr)
        else:
            sys.stdout.write(text)
        return ExitCode.OK
    return ExitCode.USAGE


if __name__ == "__main__":
    sys.exit(main())
