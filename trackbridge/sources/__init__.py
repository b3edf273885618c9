"""Run readers, one module per place runs live behind :class:`~trackbridge.sources.base.Source`; imported lazily."""
from __future__ import annotations

from ..locators import Locator, load_registered, parse
from .base import Problem, RunReader, Source, SourceError

REGISTRY = {
    "jsonl": "trackbridge.trackers.jsonl.source:JsonlSource",
    "tensorboard": "trackbridge.trackers.tensorboard.source:TensorBoardSource",
    "wandb": "trackbridge.trackers.wandb.source:WandbSource",
    "mlflow": "trackbridge.trackers.mlflow.source:MlflowSource",
    "trackio": "trackbridge.trackers.trackio.source:TrackioSource",
    "csv": "trackbridge.sources.csv:CsvSource",
    "trainer-state": "trackbridge.sources.trainer_state:TrainerStateSource",
    "console": "trackbridge.sources.console:ConsoleSource",
}


def source_class(kind: str) -> type[Source]:
    return load_registered(REGISTRY, kind, "source")


def guess_locator(path: str) -> str | None:
    """A locator for a plain path, from what it looks like: a TensorBoard or wandb folder, a trainer_state.json, a CSV
    export, a JSONL stream, or a console log. None when it cannot tell (or the path does not exist)."""
    import os
    from pathlib import Path

    p = Path(path)
    if p.is_dir():
        if any(p.rglob("events.out.tfevents.*")):
            return f"tensorboard:{path}"
        if any(p.rglob("run-*.wandb")):
            return f"wandb:{path}"
        if (p / "trainer_state.json").is_file() or any(p.glob("checkpoint-*/trainer_state.json")):
            return f"trainer-state:{path}"
        if any(p.glob("*.jsonl")):
            return f"jsonl:{path}"
        if any(p.glob("*.db")):
            return f"trackio:{path}"
        return None
    if not p.is_file():
        return None
    name, suffix = p.name.lower(), p.suffix.lower()
    if name == "trainer_state.json":
        return f"trainer-state:{path}"
    if suffix == ".csv":
        return f"csv:{path}"
    if suffix == ".jsonl":
        return f"jsonl:{path}"
    if suffix == ".wandb":
        return f"wandb:{os.path.dirname(path) or '.'}"
    if suffix in (".log", ".txt", ".out", ".err"):
        return f"console:{path}"
    if suffix in (".db", ".sqlite", ".sqlite3"):
        tables = _sqlite_tables(p)
        if "experiments" in tables and "latest_metrics" in tables:
            return f"mlflow:sqlite:///{p.resolve()}"
        if "metrics" in tables and "configs" in tables:
            return f"trackio:{p.parent}"
    return None


def _sqlite_tables(path) -> set[str]:
    import sqlite3
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
            return {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    except sqlite3.Error:
        return set()


def open_source(spec: "str | Locator") -> Source:
    loc = spec if isinstance(spec, Locator) else parse(spec, allow_label=True, kinds=tuple(REGISTRY))
    return source_class(loc.kind)(loc.location, **loc.options)


__all__ = ["Problem", "RunReader", "Source", "SourceError", "REGISTRY", "open_source", "source_class", "guess_locator"]
