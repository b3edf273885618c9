"""The canonical schema's facts the rest of the package needs as plain constants, read once, at import, from the
shipped ``canonical.yaml`` (the one ``mappings_dir()``, so ``TRACKBRIDGE_MAPPINGS_DIR`` is honoured): its splits
(:data:`SPLITS`, :data:`SPLIT_PREFIXES`), x axes (:data:`AXES`), compare presets (:data:`PRESETS`) and look-alike
pairs (:data:`LOOK_ALIKE`), plus :data:`STEP_AXIS` (the name of the tracker step, which ``axes: step:`` declares).

Readers of raw names (:func:`trackbridge.tracking.source.split_of`), the translator, the derived-rule engine, the logger
and compare import these instead of spelling ``eval/`` or ``progress/step`` themselves. The sections are parsed with
the loader's own functions; the validation is the loader's, so a canonical file that cannot be read leaves these
empty, and the problem is reported, with file and line, when the registry is loaded (every command loads it).
"""
from __future__ import annotations

from .canonical import parse_axes, parse_look_alike, parse_presets, parse_splits
from .model import STEP_AXIS, Axis, LookAlike, Preset, Splits
from .paths import mappings_dir
from .yamlfile import MappingError, load_yaml

__all__ = ["STEP_AXIS", "SPLITS", "SPLIT_PREFIXES", "AXES", "PRESETS", "LOOK_ALIKE", "shipped_splits_and_axes"]


def _shipped() -> dict:
    try:
        doc = load_yaml(mappings_dir() / "canonical.yaml")
    except MappingError:
        return {}
    return doc if isinstance(doc, dict) else {}


def shipped_splits_and_axes() -> tuple[Splits | None, dict[str, Axis] | None]:
    """(splits, axes) of the shipped canonical.yaml; None for a section it does not have."""
    doc = _shipped()
    return parse_splits(doc, "", []), parse_axes(doc)


_doc = _shipped()
SPLITS: Splits = parse_splits(_doc, "", []) or Splits()
SPLIT_PREFIXES: tuple[str, ...] = SPLITS.prefixes            # ("eval/", "test/"): canonical names of eval/test records
AXES: dict[str, Axis] = parse_axes(_doc) or {}
PRESETS: dict[str, Preset] = parse_presets(_doc)
LOOK_ALIKE: list[LookAlike] = parse_look_alike(_doc)
del _doc
