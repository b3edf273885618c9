"""The run's info as the trackers get it (:class:`~trackbridge.record.RunInfo`): cleaned so that every tracker can
store it, and, on a resume with another config, the run's config kept with the change recorded."""
from __future__ import annotations

import copy
import dataclasses
import threading
from typing import Any, Iterable

from ..record import RunInfo
from ..record.values import printable, sanitize_config
from .checks import config_changes

_INFO_LOCK = threading.Lock()       # sink workers open concurrently and each cleans the info


def clean_info(src: RunInfo, flattened: Iterable[tuple[str, str]] = ()) -> tuple[RunInfo, list[tuple[str, str]]]:
    """A copy of the run info that every sink can store, and what was changed (``(key, message)``, to be said once):
    the config made plain JSON (see :func:`trackbridge.record.values.sanitize_config`), tags as strings, no lone
    surrogate in the name or project. ``flattened``: how the run's trackers that flatten the config do it (each sink's
    ``capabilities.flat_config``), so that keys flattening to one name there are said."""
    with _INFO_LOCK:
        config, notes = sanitize_config(src.config, flattened)
        info: RunInfo = copy.deepcopy(dataclasses.replace(src, config={}, extra={}))
        info.config = config
        info.extra, _ = sanitize_config(src.extra)
        info.name = printable(info.name) if isinstance(info.name, str) else info.name
        info.project = printable(info.project) if isinstance(info.project, str) else info.project
        info.tags = {printable(str(k)): printable(v if isinstance(v, str) else str(v))
                     for k, v in (info.tags or {}).items()}
    return info, list(notes)


def resumed_config(prev: RunInfo, cfg: dict[str, Any], extra: dict[str, Any], last_step: int | None,
                   given: set[str] | None = None) -> tuple[dict[str, Any], dict[str, Any], str | None]:
    """Resume with a config that differs from the run's: every tracker keeps the run's config (MLflow cannot change
    a param, so the others keep it too and all agree), and the change is recorded in the run info
    (``extra["config_changes"]``: the step it applies from and each changed, added or removed key), which every
    tracker stores with the run. Returns (the config, the extra, the one warning to say or None). Translation
    follows the new config from here on."""
    old, _ = sanitize_config(prev.config)
    new, _ = sanitize_config(cfg)
    # the canonical names translation adds to the config change with the user's keys: said once, by the user's
    change = config_changes(old, new, skip=set(cfg) - given if given is not None else set())
    extra = {**extra, "config_changes": list((prev.extra or {}).get("config_changes") or [])}
    if not change:
        if not extra["config_changes"]:
            del extra["config_changes"]
        return dict(prev.config), extra, None
    at = 0 if last_step is None else last_step + 1
    extra["config_changes"].append({"from_step": at, **change})
    shown = [f"{k}: {v[0]!r} -> {v[1]!r}" for k, v in list(change.get("changed", {}).items())[:5]]
    shown += [f"{k} added" for k in list(change.get("added", {}))[:3]]
    shown += [f"{k} removed" for k in list(change.get("removed", []))[:3]]
    n = sum(len(change.get(k) or ()) for k in ("changed", "added", "removed"))
    said = (f"resume: the config differs from the run's ({'; '.join(shown)}"
            f"{f'; {n} keys in all' if n > len(shown) else ''}); every tracker keeps the run's config (a tracker's "
            f"params cannot all be changed) and records the change in trackbridge's run info (config_changes, from "
            f"step {at}); translation follows the new config")
    return dict(prev.config), extra, said
