"""``trackbridge demo``: the whole mission on data shipped with the project, no server and no account.

1. Reads a TRL GRPO run (``trainer_state.json``) and a veRL run (console log) shipped in ``examples/``.
2. Translates both to canonical names (framework detected from the keys), fills in derived metrics, and writes each
   as a canonical JSON-lines stream, printing what was mapped, approximate and unmapped.
3. Writes both runs into every local tracker (TensorBoard, MLflow on SQLite, wandb offline, Trackio) through the
   same sinks the logger uses, skipping a tracker whose package is not installed.
4. Compares the two runs in a report (HTML, PNG charts, CSV and Markdown tables).

The output folder is the demo's only where it says so: ``.trackbridge-manifest.json`` lists every file the demo
wrote (the report folder has its own, written by ``compare``). A re-run deletes those files and nothing else; a
non-empty folder without that list is refused (see :class:`trackbridge.compare.manifest.OutputManifest`).
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ..exitcodes import ExitCode

if TYPE_CHECKING:       # pragma: no cover
    from ..compare.manifest import OutputManifest

EXAMPLES = [
    ("trl-grpo", "trainer-state", "trl_grpo_trainer_state.json"),
    ("verl-ppo", "console", "verl_console.log"),
]


def examples_dir() -> Path:
    pkg = Path(__file__).resolve().parent.parent        # trackbridge/
    for cand in (pkg.parent / "examples", pkg / "examples"):       # a source checkout, or the installed wheel
        if (cand / "verl_console.log").is_file():
            return cand
    raise FileNotFoundError("the example runs (examples/) are not installed; run the demo from a source checkout")


def _width() -> int:
    import shutil
    return max(60, shutil.get_terminal_size((100, 24)).columns)


def _say(msg: str = "") -> None:
    """One line (or a few), each cut to the terminal's width."""
    w = _width()
    print("\n".join(ln if len(ln) <= w else ln[:w - 1] + "\u2026" for ln in msg.split("\n")), flush=True)


def _some(names: list[str], n: int = 3) -> str:
    return ", ".join(names[:n]) + (f" (+{len(names) - n} more)" if len(names) > n else "")


OLD_MARKER = ".trackbridge-demo"     # what demos before the manifest left (they replaced the whole folder)
REPORT = "report"


def _prepare(out: Path) -> OutputManifest:
    from ..compare.manifest import MANIFEST, OutputManifest

    if (out / OLD_MARKER).is_file() and not (out / MANIFEST).is_file():
        raise ValueError(f"--out {out}: made by an earlier trackbridge demo that kept no list of its files, so the "
                         f"demo cannot tell them from yours; delete the folder yourself or choose another --out")
    manifest = OutputManifest.prepare(out, "demo", skip_under=(f"{REPORT}/",))
    (out / "canonical").mkdir(parents=True, exist_ok=True)
    return manifest


def run_demo(out: Path) -> int:
    from ..extras import PLOT, require
    from ..read.inputs import open_runs
    from ..stream import StreamWriter, stream_file

    out = Path(out)
    try:
        require(*PLOT, "the demo (its comparison report)")     # before anything is written
        manifest = _prepare(out)
    except ValueError as exc:
        print(f"trackbridge demo: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    ex = examples_dir()
    _say(f"trackbridge demo: a TRL GRPO run and a veRL PPO run shipped in {ex}")
    _say("[1/3] reading both runs, translating them to canonical names, deriving what the mappings derive\n")
    locators = []
    for label, kind, fname in EXAMPLES:
        loc = f"{kind}:{ex / fname}"
        locators.append(f"{label}={loc}")
        for run in open_runs(loc):          # as every command reads a run: config, source, time axis
            reader, info = run.reader, run.info
            pipe = run.pipeline("canonical", derive=True)
            records = list(pipe.process(run.records()))      # small runs: the header then knows everything
            path = stream_file(out / "canonical", label)
            path.unlink(missing_ok=True)        # the demo's own (a foreign file there was refused by _prepare)
            writer = StreamWriter(path)
            writer.open(pipe.run_info(info))
            try:
                writer.write(records)
            finally:
                writer.close()
            pipe.finish_notes()
            st = pipe.stats
            steps = [r.step for r in records if r.step is not None]
            span = f" {min(steps)}\u2013{max(steps)}" if steps else ""
            _say(f"  {label}  ({fname}, read as {st.source})")
            _say(f"    {st.records} steps{span}, {st.points} values; {len(st.renamed)} names translated, e.g. "
                 + ", ".join(f"{k} -> {v}" for k, v in list(st.renamed.items())[:2]))
            _say(f"    approximate {len(st.approximate)}" + (f": {_some(list(st.approximate))}" if st.approximate
                                                            else "")
                 + f"; derived {len(st.derived)}" + (f": {_some(list(st.derived))}" if st.derived else "")
                 + f"; unmapped {len(st.unmapped)}" + (f": {_some(list(st.unmapped))}" if st.unmapped else ""))
            if reader.problems:
                _say(f"    {len(reader.problems)} note(s) on the file, e.g. {reader.problems[0]}")
            if not run.has_wall_time:       # the header says so: every tracker copy is marked
                _say("    no wall times in the source: none are made up")
    _say("  why a name is approximate: per chart in the report below, or trackbridge translate FILE --report-json "
         "why.json\n")
    manifest.save(complete=False)
    extra, failed, opens = _write_trackers(out)
    manifest.save(complete=False)
    _say("[3/3] comparing the two runs (charts on the canonical names, with what differs in meaning)")
    report, apart = _compare(out, locators)
    manifest.save()
    _say()
    if apart:
        import textwrap
        print(textwrap.fill(f"Note: {apart}.", _width(), subsequent_indent="  ") + "\n", flush=True)
    _say("Output:")
    _say(f"  canonical JSON lines   {out / 'canonical'}")
    for line in extra:
        _say(f"  {line}")
    if report:
        _say(f"  comparison report      {report}")
    _say("\nOpen them with:")
    for line in opens + ([f"  {report}  (in a browser)"] if report else []):
        _say(line)
    for line in failed:
        print(f"trackbridge demo: {line}", file=sys.stderr)
    return ExitCode.PROBLEMS if failed else ExitCode.OK


def _write_trackers(out: Path) -> tuple[list[str], list[str], list[str]]:
    """Write the translated runs into every local tracker whose package is installed, through the migration path
    (the same sinks the logger uses; old runs keep their steps and get no invented wall times). Returns what was
    written where, what failed, and the commands that open each tracker's copy."""
    import os

    from ..migrate import migrate

    trackers = out / "trackers"
    sinks = [f"tensorboard:{trackers / 'tensorboard'}",
             f"mlflow:sqlite:///{(trackers / 'mlflow.db').resolve()}?experiment=trackbridge-demo",
             f"wandb:{trackers / 'wandb'}",
             f"trackio:{trackers / 'trackio'}?project=trackbridge-demo"]
    active = [s for s in sinks if importlib.util.find_spec(s.split(":", 1)[0]) is not None]
    missing = [s.split(":", 1)[0] for s in sinks if s not in active]
    os.environ.setdefault("WANDB_MODE", "offline")
    old_state = os.environ.get("TRACKBRIDGE_STATE_DIR")
    os.environ["TRACKBRIDGE_STATE_DIR"] = str(out / ".state")      # the demo's own migration ledger
    failed: list[str] = []
    try:
        for i, sink in enumerate(active, 1):
            _say(f"[2/3] writing both runs into {sink.split(':', 1)[0]} ({i} of {len(active)})")
            result = migrate(f"jsonl:{out / 'canonical'}", sink, source="canonical", names="canonical",
                             progress=False)
            failed += [f"{sink.split(':', 1)[0]}: run {r.source_name} not written: {r.error}"
                       for r in result.runs if r.error]
    finally:
        if old_state is None:
            os.environ.pop("TRACKBRIDGE_STATE_DIR", None)
        else:
            os.environ["TRACKBRIDGE_STATE_DIR"] = old_state
    lines = [f"{s.split(':', 1)[0]:22s} {s.split(':', 1)[1].split('?')[0]}" for s in active]
    if missing:
        lines.append(f"(not installed, skipped: {', '.join(missing)})")
    how = {"tensorboard": f"  tensorboard --logdir {trackers / 'tensorboard'}",
           "mlflow": f"  mlflow ui --backend-store-uri sqlite:///{(trackers / 'mlflow.db').resolve()}",
           "wandb": f"  wandb sync {trackers / 'wandb' / 'wandb'}/offline-run-*   (uploads to your W&B account)",
           "trackio": f"  TRACKIO_DIR={trackers / 'trackio'} trackio show --project trackbridge-demo"}
    opens = [how[s.split(":", 1)[0]] for s in active]
    return lines, failed, opens


def _compare(out: Path, locators: list[str]) -> tuple[str, str | None]:
    """The report's path, and the warning that the runs share no step (the example veRL log starts at step 101,
    where its run was resumed), or None."""
    from ..compare import compare_runs, disjoint_steps
    result = compare_runs(locators, out=out / "report")
    return str(result.html), disjoint_steps(result.runs)


def main(argv: list[str] | None = None) -> int:
    """``python -m trackbridge.cli.demo``: the same as ``trackbridge demo`` (same exit codes)."""
    import argparse
    ap = argparse.ArgumentParser(prog="trackbridge demo")
    ap.add_argument("--out", default="out/demo")
    args = ap.parse_args(argv)
    try:
        return run_demo(Path(args.out))
    except KeyboardInterrupt:
        print("trackbridge demo: interrupted", file=sys.stderr)
        return ExitCode.INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
