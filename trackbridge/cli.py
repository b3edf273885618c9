"""The ``trackbridge`` command line: a thin layer over the library.

Exit codes (0 ok, 1 done with problems, 2 bad usage or input, 130 interrupted) are :mod:`trackbridge.exitcodes`'
(the table per command is there and in ``docs/cli.md``). ``trackbridge --help`` imports neither the translator, the
logger nor any tracker: each command imports what it needs when it runs.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import TYPE_CHECKING, Any, Iterator

from ._version import __version__
from .exitcodes import ExitCode

if TYPE_CHECKING:       # pragma: no cover
    from .inputs import Row


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
    p.add_argument("--config", metavar="JSON", help="run config as a JSON file (for config-dependent entries and "
                                                    "derived rules)")
    _add_mappings(p)
    p.add_argument("file", nargs="?", default="-", help="input: JSON lines, a trainer_state.json, a console log, a "
                                                          "CSV export, any run locator, or - for stdin (default)")

    p = sub.add_parser("detect", help="name the framework, trainer and releases that logged these keys")
    p.add_argument("file", help="a file or folder (JSON lines, trainer_state.json, a console log, a CSV export, a "
                                "TensorBoard or wandb folder) or any run locator (console:PATH, mlflow:URI, ...)")
    p.add_argument("--json", action="store_true", help="print the detection as JSON")
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
                        "entry states one")
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
    from .schema.spec import SpecError
    from .schema.yamlfile import MappingError
    try:
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
    """The one pipeline (:class:`trackbridge.pipeline.Pipeline`, as migrate, replay and compare use it): the source
    resolved from the first rows (look-ahead), every row translated with it, one report for the run."""
    import itertools

    from .pipeline import DETECT_LOOKAHEAD, Pipeline
    from .record import Record
    pipe = Pipeline(args.source, args.target, config=_load_config(args.config), mappings=args.mappings or None,
                    derive=args.derive)
    problems: list[str] = []
    rows = iter(_input_rows(args.file, problems))
    head = list(itertools.islice(rows, DETECT_LOOKAHEAD))
    pipe.setup({k for row in head if isinstance(row.metrics, dict) for k in row.metrics if isinstance(k, str)})
    seen: dict[str, None] = {}
    out = sys.stdout
    for row in itertools.chain(head, rows):
        step = row.step if isinstance(row.step, int) and not isinstance(row.step, bool) else None
        wall = row.wall_time if isinstance(row.wall_time, (int, float)) and not isinstance(row.wall_time, bool) \
            else None
        try:
            if not isinstance(row.metrics, dict):
                raise TypeError(f"expected a dict of metric name -> value, not {type(row.metrics).__name__}")
            rec = pipe.one(Record(step, wall, row.metrics))
        except TypeError as exc:
            problems.append(f"{row.where}: {exc}; line skipped")
            continue
        seen.update(dict.fromkeys(row.metrics))
        if row.shape == "record":
            obj = {"step": row.step, "wall_time": row.wall_time, "metrics": rec.metrics}
            if rec.derived:
                obj["derived"] = rec.derived
        else:
            obj = dict(rec.metrics)
            if row.step is not None and "step" not in obj:
                obj = {"step": row.step, **obj}
        out.write(json.dumps(obj, default=_json_default) + "\n")
    st = pipe.stats
    notes = pipe.finish_notes()
    for p in problems:
        print(f"trackbridge: {p}", file=sys.stderr)
    for n in notes:
        print(f"trackbridge: note: {n}", file=sys.stderr)
    unmapped = [k for k in st.unmapped if k not in st.conflicts]
    mapped = [k for k in seen if k not in unmapped and k not in st.conflicts]
    report: dict[str, Any] = {"mapped": len(mapped), "unmapped": unmapped, "approximate": dict(st.approximate),
                              "source": st.source}
    if st.conflicts:
        report["conflicts"] = dict(st.conflicts)
    if args.derive:
        report["derived"] = list(st.derived)
    if problems:
        report["skipped"] = problems
    if notes:
        report["notes"] = notes
    if args.report_json:
        with open(args.report_json, "w", encoding="utf-8") as fh:
            json.dump(report, fh, indent=2)
    conflicts = f", {len(st.conflicts)} kept as is (their name was taken)" if st.conflicts else ""
    print(f"trackbridge: {len(mapped)} keys mapped, {len(unmapped)} unmapped{conflicts}, {len(st.approximate)} "
          f"approximate (source: {st.source})", file=sys.stderr)
    if problems:
        return ExitCode.PROBLEMS
    if args.strict and unmapped:
        print(f"trackbridge: --strict: unmapped keys: {', '.join(unmapped)}", file=sys.stderr)
        return ExitCode.PROBLEMS
    return ExitCode.OK


def _input_rows(path: str, problems: list[str]) -> Iterator[Row]:
    """Logged dicts from a JSON-lines or trainer_state.json file, or from anything a reader understands (a run
    locator, or a plain path that looks like a console log, a CSV export, a TensorBoard or wandb folder)."""
    from .inputs import Row, read_rows
    from .locators import is_locator
    from .trackers import guess_locator, open_source
    loc = path if is_locator(path) else None
    if loc is None and path != "-" and not path.endswith((".json", ".jsonl")):
        guessed = guess_locator(path)
        if guessed and not guessed.startswith("jsonl:"):
            loc = guessed
    if loc is None:
        yield from read_rows(path, problems)
        return
    for run in open_source(loc).runs():
        for i, rec in enumerate(run.records()):
            yield Row(f"{loc} record {i}", rec.metrics, rec.step, rec.wall_time)
        problems += [str(p) for p in run.problems if "without metrics" not in str(p)]


def _json_default(obj: Any) -> Any:
    from .record import encode_value
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
    from .detect import detect
    from .schema.loader import load_registry
    reg = load_registry(args.mappings or None)
    keys: set[str] = set()
    problems: list[str] = []
    for row in _input_rows(args.file, problems):      # the same inputs `translate` accepts
        keys.update(row.metrics)
    det = detect(keys, reg)
    for p in problems:
        print(f"trackbridge: {p}", file=sys.stderr)
    if args.json:
        print(json.dumps(det.to_json(), indent=2))
    else:
        print(f"source:      {det.source}")
        print(f"confidence:  {det.confidence:.2f}")
        print(f"explained:   {det.explained} of {det.n_keys} keys")
        print(f"why:         {det.reason}")
        if det.candidates:
            print(f"runners-up:  {', '.join(det.candidates)}")
        if det.unexplained:
            print(f"unexplained: {', '.join(det.unexplained[:30])}{' ...' if len(det.unexplained) > 30 else ''}")
    return ExitCode.OK if det.spec is not None else ExitCode.PROBLEMS


# ---------------------------------------------------------------------------------------------------- mappings
def cmd_mappings(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from . import mappings_views as docs
    from .schema.loader import load_registry
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
