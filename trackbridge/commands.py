"""Subcommands beyond translate/detect/mappings: each registers its parser and its handler here."""
from __future__ import annotations

import argparse

_HANDLERS: dict[str, object] = {}


def register(sub: "argparse._SubParsersAction") -> None:
    p = sub.add_parser("demo", help="run the demo on the example runs shipped with trackbridge",
                       description="Translate a TRL GRPO run and a veRL run shipped with trackbridge, log them to "
                                   "every local tracker and compare them; prints where the output is.")
    p.add_argument("--out", default="out/demo", help="output folder (default: out/demo; replaced if present)")
    _HANDLERS["demo"] = _demo

    p = sub.add_parser("migrate", help="copy runs between trackers/files, translating names on the way",
                       description="Copy every run in SRC (a TensorBoard root, an MLflow experiment, a wandb folder, "
                                   "a CSV export, a trainer_state.json, a console log, a JSONL stream) into DST. "
                                   "Idempotent and resumable: running it again writes nothing twice.")
    p.add_argument("src", help="source locator, e.g. tensorboard:runs/tb, mlflow:sqlite:///mlflow.db?experiment=x")
    p.add_argument("dst", help="destination locator, e.g. mlflow:sqlite:///new.db, tensorboard:out/tb, jsonl:out")
    p.add_argument("--from", dest="source", default="auto", help="source names: auto, canonical or "
                                                                 "FRAMEWORK[/TRAINER][@VERSION]")
    p.add_argument("--names", default="canonical", help="names to write: canonical (default), keep, or "
                                                        "FRAMEWORK[/TRAINER][@VERSION]")
    p.add_argument("--derive", action="store_true", help="also write derived metrics (marked as derived)")
    p.add_argument("--dry-run", action="store_true", help="print what would be written, name by name")
    p.add_argument("--jobs", type=int, default=1, help="runs migrated in parallel (default 1)")
    p.add_argument("--strict", action="store_true", help="exit 1 when anything was skipped or is unmapped")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.add_argument("--mappings", action="append", default=[], metavar="PATH", help="extra mapping file")
    _HANDLERS["migrate"] = _migrate


def _demo(args) -> int:
    from pathlib import Path

    from .demo import run_demo
    return run_demo(Path(args.out))


def run(args) -> int:
    handler = _HANDLERS.get(args.command)
    if handler is None:
        raise ValueError(f"unknown command {args.command!r}")
    return handler(args)


def _migrate(args) -> int:
    import sys

    from .migrate import migrate, summary
    result = migrate(args.src, args.dst, source=args.source, names=args.names, derive=args.derive,
                     dry_run=args.dry_run, jobs=max(1, args.jobs), mappings=args.mappings or None,
                     progress=not args.quiet)
    print(summary(result, dry_run=args.dry_run), file=sys.stderr if not args.dry_run else sys.stdout)
    if not result.runs:
        print(f"trackbridge: no runs found in {args.src}", file=sys.stderr)
        return 1
    if not result.ok:
        return 1
    if args.strict and (any(r.problems for r in result.runs) or result.totals().unmapped):
        return 1
    return 0
