"""trackbridge: translate, multiplex, migrate and compare RL fine-tuning metrics."""
from __future__ import annotations

import sys
import types
from typing import TYPE_CHECKING, Any

from ._version import __version__

__all__ = ["__version__", "init", "Run", "NoOpRun", "LoggerOptions", "translate", "Translator", "Translation", "wrap",
           "unwrap", "register_tracker", "unregister_tracker", "TrackBridgeError", "UsageError", "Weighted", "read"]

from .errors import TrackBridgeError, UsageError  # noqa: E402

# Everything else loads on first use, so that `trackbridge --help` or `trackbridge detect FILE` import only what they
# need (the translator, the logger and the trackers are not imported by `import trackbridge`).
_LAZY = {"translate": "pipeline", "Translator": "pipeline", "Translation": "translate",
         "init": "logger", "Run": "logger", "NoOpRun": "logger", "LoggerOptions": "logger",
         "wrap": "integrations", "unwrap": "integrations",
         "register_tracker": "trackers", "unregister_tracker": "trackers", "Weighted": "record.ranked", "read": "read"}

if TYPE_CHECKING:       # pragma: no cover
    from .integrations import unwrap, wrap
    from .logger import LoggerOptions, NoOpRun, Run, init
    from .pipeline import Translator, translate
    from .read import read
    from .record.ranked import Weighted
    from .trackers import register_tracker, unregister_tracker
    from .translate import Translation


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


class _Package(types.ModuleType):
    """``trackbridge.translate`` is the function, as ``__all__`` says, although a submodule has the same name:
    importing the submodule ``trackbridge.translate`` (which Python then binds as an attribute of the package) leaves
    the package's attribute to :func:`__getattr__`, which gives the function."""

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(value, types.ModuleType) and name in _LAZY and value.__name__ == f"{__name__}.{name}":
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
