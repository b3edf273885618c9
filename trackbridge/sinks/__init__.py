"""Tracker sinks, one module per tracker behind :class:`~trackbridge.sinks.base.Sink`; imported lazily by kind."""
from __future__ import annotations

from ..locators import Locator, load_registered, parse
from .base import Capabilities, Sink, SinkError

# kind -> "module:Class"; a module imports its tracker only when the sink is opened.
REGISTRY = {
    "jsonl": "trackbridge.trackers.jsonl.sink:JsonlSink",
    "tensorboard": "trackbridge.trackers.tensorboard.sink:TensorBoardSink",
    "wandb": "trackbridge.trackers.wandb.sink:WandbSink",
    "mlflow": "trackbridge.trackers.mlflow.sink:MlflowSink",
    "trackio": "trackbridge.trackers.trackio.sink:TrackioSink",
}


def sink_class(kind: str) -> type[Sink]:
    return load_registered(REGISTRY, kind, "sink")


def make_sink(spec: "str | Locator | Sink") -> Sink:
    """A sink from a locator string (``tensorboard:runs/tb``), a parsed Locator, or a ready Sink object."""
    if isinstance(spec, Sink):
        return spec
    loc = spec if isinstance(spec, Locator) else parse(spec, kinds=tuple(REGISTRY))
    return sink_class(loc.kind)(loc.location, **loc.options)


__all__ = ["Capabilities", "Sink", "SinkError", "REGISTRY", "make_sink", "sink_class"]
