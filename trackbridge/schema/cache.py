"""The compiled registry: parsed and validated mapping files, pickled, keyed by the files' bytes.

Loading ~3,600 lines of YAML and checking them takes 0.3-0.6 s; the compiled copy loads in a few ms. The key covers
every file's path and content, trackbridge's and Python's versions, so any edit recompiles. A cache that cannot be
read or written is ignored: the files are then parsed as usual. TRACKBRIDGE_NO_CACHE=1 turns it off;
TRACKBRIDGE_CACHE_DIR moves it (default: $XDG_CACHE_HOME/trackbridge or ~/.cache/trackbridge). Every edit of a
user's mapping file, and every trackbridge release, makes a new file: after writing one, only the :data:`KEEP` most
recently used are kept (a read marks a file used).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .paths import mappings_dir

KEEP = 16           # compiled registries kept in the cache folder, most recently used first


def cache_key(files: list[str]) -> str | None:
    if os.environ.get("TRACKBRIDGE_NO_CACHE"):
        return None
    import hashlib
    import sys

    from .._version import __version__
    h = hashlib.sha256(f"{__version__}|{sys.version}|{__file__}".encode())
    here = Path(__file__).parent
    try:
        code = ("model.py", "sections.py", "templates.py", "loader.py", "canonical.py", "framework.py", "facts.py",
                "reductions.py", "versions.py", "yamlfile.py", "jsonschema.py", "paths.py",
                "proofs.py")    # what shapes the pickle
        schemas = sorted(str(p) for p in (mappings_dir() / "schemas").glob("*.schema.json"))
        from .yamlfile import MappingError, check_file
        for f in [*(str(here / m) for m in code), *schemas, *files]:
            if f in files:
                check_file(f)         # a FIFO, a device, a huge file: not read here (the loader refuses it)
            h.update(f.encode() + b"\0")
            h.update(Path(f).read_bytes())
            h.update(b"\0")
    except (OSError, MappingError):
        return None           # a file that cannot be read: the loader reports it
    return h.hexdigest()[:32]


def cache_file(key: str) -> Path:
    base = os.environ.get("TRACKBRIDGE_CACHE_DIR")
    if not base:
        base = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
                            "trackbridge")
    return Path(base) / f"registry-{key}.pickle"


def read_compiled(path: Path) -> Any:
    """The pickled registry, or None (the caller checks its type)."""
    import pickle
    try:
        with open(path, "rb") as fh:
            reg = pickle.load(fh)
    except Exception:           # missing, partial, from another layout: recompile
        return None
    try:
        os.utime(path)          # used: kept by the pruning in write_compiled
    except OSError:
        pass
    return reg


def write_compiled(path: Path, reg: Any) -> None:
    import pickle
    import tempfile
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".registry-", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as fh:
                pickle.dump(reg, fh, protocol=pickle.HIGHEST_PROTOCOL)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        prune(path.parent, keep=KEEP)
    except Exception:
        pass                    # a read-only home or full disk: the mappings still load, just not faster


def prune(folder: Path, keep: int = KEEP) -> None:
    """Delete all but the ``keep`` most recently used compiled registries in ``folder`` (other files untouched)."""
    def used(p: Path) -> float:
        try:
            return p.stat().st_mtime
        except OSError:
            return 0.0
    for old in sorted(folder.glob("registry-*.pickle"), key=used, reverse=True)[keep:]:
        try:
            old.unlink()
        except OSError:
            pass                # another process removed or holds it: not ours to insist
