"""trackbridge: translate, multiplex, migrate and compare RL fine-tuning metrics."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = ["__version__", "init", "Run", "NoOpRun", "LoggerOptions", "translate", "Translator", "Translation", "wrap",
           "unwrap", "register_tracker", "unregister_tracker", "TrackBridgeError", "UsageError"]

# `translate` is imported at once: the submodule of the same name would otherwise shadow the function once anything
# imports it. The logger and the integrations load on first use, so that `trackbridge --help` or `trackbridge detect
# FILE` import only what they need.
from .errors import TrackBridgeError, UsageError  # noqa: E402
from .translate import Translation, Translator, translate  # noqa: E402

_LAZY = {"init": "logger", "Run": "logger", "NoOpRun": "logger", "LoggerOptions": "logger", "wrap": "integrations",
         "unwrap": "integrations",
         "register_tracker": "trackers", "unregister_tracker": "trackers"}

if TYPE_CHECKING:       # pragma: no cover
    from .integrations import unwrap, wrap
    from .logger import LoggerOptions, NoOpRun, Run, init
    from .trackers import register_tracker, unregister_tracker


def __getattr__(name: str) -> Any:
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'trackbridge' has no attribute {name!r}")
    import importlib
    value = getattr(importlib.import_module(f".{mod}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
