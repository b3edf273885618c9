"""Where the shipped mapping files are: the one ``mappings_dir()`` every loader uses (mapping files, derived rules,
JSON Schemas). A module of its own so that the validator and the derived-rule loader can use it without importing
the registry loader."""
from __future__ import annotations

import os
from pathlib import Path


def mappings_dir() -> Path:
    """The shipped mappings: ``$TRACKBRIDGE_MAPPINGS_DIR`` if set, else ``mappings/`` of a source checkout, else the
    copy inside the installed package (``trackbridge/mappings``)."""
    env = os.environ.get("TRACKBRIDGE_MAPPINGS_DIR")
    if env:
        return Path(env)
    here = Path(__file__).resolve().parent.parent
    for cand in (here.parent / "mappings", here / "mappings"):
        if (cand / "canonical.yaml").is_file():
            return cand
    import importlib.resources as ir
    return Path(str(ir.files("trackbridge.mappings")))
