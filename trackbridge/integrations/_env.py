"""What the integrations that cannot take options in code read from the environment (``report_to="trackbridge"``,
``log_with="trackbridge"``, the Ray worker hook): the ``TRACKBRIDGE_*`` variables, one parser for all of them, and the
one way a config is laid over another. Imports no tracker and no framework.
"""
from __future__ import annotations

import json
import os
from typing import Any, Mapping

#: environment variable -> :func:`trackbridge.init` option
ENV_OPTIONS = {"TRACKBRIDGE_SINKS": "sinks", "TRACKBRIDGE_SPOOL": "spool", "TRACKBRIDGE_SOURCE": "source",
               "TRACKBRIDGE_NAMES": "names", "TRACKBRIDGE_PROJECT": "project", "TRACKBRIDGE_NAME": "name",
               "TRACKBRIDGE_RUN_ID": "run_id"}


def parse_list(text: str, var: str) -> list[str]:
    """A list in an environment variable ``var``: items separated by commas (``tensorboard:runs/tb,mlflow:...``), or
    a JSON list of strings (for an item that holds a comma). Raises ``ValueError`` naming ``var``."""
    text = text.strip()
    if text.startswith("["):
        try:
            items = json.loads(text)
        except ValueError as exc:
            raise ValueError(f"{var}: not a JSON list ({exc}): {text!r}") from None
        if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
            raise ValueError(f"{var}: expected a JSON list of strings, got {text!r}")
        return [i.strip() for i in items if i.strip()]
    return [part.strip() for part in text.split(",") if part.strip()]


def parse_sinks(text: str) -> list[str]:
    """``TRACKBRIDGE_SINKS``: sink locators separated by commas, or a JSON list of them."""
    return parse_list(text, "TRACKBRIDGE_SINKS")


def options_from_env(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The :func:`trackbridge.init` options the ``TRACKBRIDGE_*`` environment variables give (see
    :data:`ENV_OPTIONS`; empty variables are ignored). A mistyped sink fails when the run opens, naming it."""
    env = os.environ if environ is None else environ
    out: dict[str, Any] = {}
    for var, option in ENV_OPTIONS.items():
        value = (env.get(var) or "").strip()
        if value:
            out[option] = parse_sinks(value) if option == "sinks" else value
    return out


def merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``over`` laid over ``base``; nested dicts merged key by key."""
    out = dict(base)
    for key, val in over.items():
        out[key] = merged(out[key], val) if isinstance(val, dict) and isinstance(out.get(key), dict) else val
    return out


__all__ = ["ENV_OPTIONS", "merged", "options_from_env", "parse_list", "parse_sinks"]
