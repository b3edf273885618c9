"""Helpers shared by the test folders (tests/unit, tests/trackers, tests/frameworks), imported as ``_support``
(tests/ is on sys.path through tests/conftest.py). ``ROOT`` is the repository, ``DATA`` is tests/data (every fact a
test needs: the frameworks' inventories and the public logs, with their origin in its README)."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"


def load_test_module(relpath: str) -> ModuleType:
    """The test module at tests/``relpath`` (e.g. "trackers/test_one_pipeline.py"), loaded by path, for a test in
    another folder that reuses its helpers or its small fixtures' data (test folders are not packages)."""
    name = "_support.loaded." + relpath.replace("/", ".").removesuffix(".py")
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "tests" / relpath)
        assert spec is not None and spec.loader is not None, relpath
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]
