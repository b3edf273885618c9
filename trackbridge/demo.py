"""``trackbridge demo``: the whole mission on data shipped with the project, no server and no account.

1. Reads a TRL GRPO run (``trainer_state.json``) and a veRL run (console log) shipped in ``examples/``.
2. Translates both to canonical names (framework detected from the keys), fills in derived metrics, and writes each
   as a canonical JSON-lines stream, printing what was mapped, approximate and unmapped.
3. Logs both runs through the multiplexing logger to every local tracker at once (JSONL, TensorBoard, MLflow on
   SQLite, wandb offline, Trackio), skipping a tracker whose package is not installed.
4. Compares the two runs in a report (HTML, PNG charts, CSV and Markdown tables).
"""
from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

EXAMPLES = [
    ("trl-grpo", "trainer-state", "trl_grpo_trainer_state.json"),
    ("verl-ppo", "console", "verl_console.log"),
]


def examples_dir() -> Path:
    here = Path(__file__).resolve().parent
    for cand in (here.parent / "examples", here / "examples"):       # a source checkout, or the installed wheel
        if (cand / "verl_console.log").is_file():
            return cand
    raise FileNotFoundError("the example runs (examples/) are not installed; run the demo from a source checkout")


def _say(msg: str = "") -> None:
    print(msg, flush=True)


def run_demo(out: Path) -> int:
    from .pipeline import Pipeline
    from .record import dumps
    from .sources import open_source

    out = Path(out)
    if out.exists():
        shutil.rmtree(out)
    (out / "canonical").mkdir(parents=True)
    ex = examples_dir()
    _say(f"trackbridge demo: example runs from {ex}\n")
    locators = []
    for label, kind, fname in EXAMPLES:
        loc = f"{kind}:{ex / fname}"
        locators.append(f"{label}={loc}")
        src = open_source(loc)
        for reader in src.runs():
            info = reader.info
            pipe = Pipeline("auto", "canonical", config=info.config, derive=True)
            path = out / "canonical" / f"{label}.jsonl"
            with open(path, "w", encoding="utf-8") as fh:
                first = True
                for rec in pipe.process(reader.records()):
                    if first:
                        fh.write(dumps(pipe.run_info(info).to_json()) + "\n")
                        first = False
                    fh.write(dumps(rec.to_json()) + "\n")
            pipe.finish_notes()
            st = pipe.stats
            _say(f"== {label}: {loc}")
            _say(f"   source      {st.source}")
            _say(f"   records     {st.records} steps, {st.points} values -> {path}")
            _say(f"   mapped      {len(st.renamed)} names renamed to canonical, e.g. "
                 + ", ".join(f"{k} -> {v}" for k, v in list(st.renamed.items())[:4]))
            _say(f"   approximate {len(st.approximate)}" + ("".join(
                f"\n      {k}: {why}" for k, why in list(st.approximate.items())[:6])))
            _say(f"   derived     {len(st.derived)}" + (f": {', '.join(list(st.derived)[:8])}" if st.derived else ""))
            _say(f"   unmapped    {len(st.unmapped)}" + (f": {', '.join(st.unmapped)}" if st.unmapped else ""))
            for p in reader.problems:
                _say(f"   skipped     {p}")
            _say()
    extra = _log_to_trackers(out, ex)
    report = _compare(out, locators)
    _say("Output:")
    _say(f"  canonical JSON lines   {out / 'canonical'}")
    for line in extra:
        _say(f"  {line}")
    if report:
        _say(f"  comparison report      {report}")
    return 0


def _log_to_trackers(out: Path, ex: Path) -> list[str]:
    """Log the translated runs to every local tracker through the logger (when the logger is available)."""
    try:
        from .logger import init
    except ImportError:
        return []
    from .record import read_stream, RunInfo
    sinks = [f"tensorboard:{out / 'trackers' / 'tensorboard'}",
             f"mlflow:sqlite:///{(out / 'trackers' / 'mlflow.db').resolve()}",
             f"wandb:{out / 'trackers' / 'wandb'}",
             f"trackio:{out / 'trackers' / 'trackio'}"]
    needs = {"tensorboard": "tensorboard", "mlflow": "mlflow", "wandb": "wandb", "trackio": "trackio"}
    active = [s for s in sinks if importlib.util.find_spec(needs[s.split(":", 1)[0]]) is not None]
    missing = [s.split(":", 1)[0] for s in sinks if s not in active]
    lines = []
    for path in sorted((out / "canonical").glob("*.jsonl")):
        with open(path, encoding="utf-8") as fh:
            items = list(read_stream(fh))
        info = next((i for i in items if isinstance(i, RunInfo)), RunInfo())
        run = init(project="trackbridge-demo", name=path.stem, sinks=active, source="canonical",
                   config=info.config, spool=str(out / "trackers" / "spool"), derive=False)
        with run:
            for rec in items:
                if not isinstance(rec, RunInfo):
                    run.log(rec.metrics, step=rec.step)
    for s in active:
        kind, _, where = s.partition(":")
        lines.append(f"{kind:22s} {where}")
    lines.append(f"{'jsonl spool':22s} {out / 'trackers' / 'spool'}")
    if missing:
        lines.append(f"(not installed, skipped: {', '.join(missing)})")
    return lines


def _compare(out: Path, locators: list[str]) -> str | None:
    try:
        from .compare import compare_runs
    except ImportError:
        return None
    result = compare_runs(locators, out=out / "report")
    return str(result.html)


def main(argv: list[str] | None = None) -> int:
    import argparse
    ap = argparse.ArgumentParser(prog="trackbridge demo")
    ap.add_argument("--out", default="out/demo")
    args = ap.parse_args(argv)
    return run_demo(Path(args.out))


if __name__ == "__main__":
    sys.exit(main())
