"""Run readers, one module per place runs live behind :class:`~trackbridge.sources.base.Source`; imported lazily."""
from __future__ import annotations

import importlib

from ..locators import Locator, LocatorError, parse
from .base import Problem, RunReader, Source, SourceError

REGISTRY = {
    "jsonl": "trackbridge.sources.jsonl:JsonlSource",
    "tensorboard": "trackbridge.sources.tensorboard:TensorBoardSource",
    "wandb": "trackbridge.sources.wandb:WandbSource",
    "mlflow": "trackbridge.sources.mlflow:MlflowSource",
    "trackio": "trackbridge.sources.trackio:TrackioSource",
    "csv": "trackbridge.sources.csv:CsvSource",
    "trainer-state": "trackbridge.sources.trainer_state:TrainerStateSource",
    "console": "trackbridge.sources.console:ConsoleSource",
}


def source_class(kind: str) -> type[Source]:
    try:
        target = REGISTRY[kind]
    except KeyError:
        raise LocatorError(f"unknown source kind {kind!r}; expected one of {', '.join(REGISTRY)}") from None
    module, _, cls = target.partition(":")
    return getattr(importlib.import_module(module), cls)


def open_source(spec: "str | Locator") -> Source:
    loc = spec if isinstance(spec, Locator) else parse(spec, allow_label=True, kinds=tuple(REGISTRY))
    return source_class(loc.kind)(loc.location, **loc.options)


__all__ = ["Problem", "RunReader", "Source", "SourceError", "REGISTRY", "open_source", "source_class"]
