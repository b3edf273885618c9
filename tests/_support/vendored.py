"""Frameworks with no wheel on the package index, run from their release tag's own files (issue 33).

NeMo-RL, slime, SkyRL, prime-rl and ROLL publish no usable wheel (fidelity_proofs.py names what the index holds), so
the files that compute their logged metrics are kept here verbatim, as they are at one release tag, under
``tests/data/frameworks/<framework>/``:

* ``src/<path in the repository>``: the tag's file, byte for byte (``git show <tag>:<path>``);
* ``LICENSE``: the repository's licence at that tag (every one of them is Apache-2.0, which allows redistribution
  with the licence and notice kept);
* ``PROVENANCE.yaml``: the repository, tag, commit, the release the proofs run as and every file's SHA-256
  (tests/unit/test_vendored.py checks each file against it, so an edit to a vendored file fails the suite).

A proof loads a file with :func:`load` as the module it is in its own package (``nemo_rl.algorithms.utils``), its
parent packages as empty modules (their ``__init__`` is not run), and with stand-ins only for imports the code under
test does not use (each proof module says which and why). Nothing here computes a metric.

To vendor more files (one command; prints what it wrote)::

    python tests/_support/vendored.py add nemo_rl /work/.mirror/NVIDIA-NeMo+RL/repo v0.7.0 nemo_rl/algorithms/utils.py
"""
from __future__ import annotations

import datetime
import functools
import hashlib
import importlib.util
import subprocess
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

try:
    from _support import DATA
except ImportError:                       # run as a script: python tests/_support/vendored.py
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from _support import DATA

FOLDER = DATA / "frameworks"

#: the repository of every framework that can be vendored (its mapping's `repository:`)
REPOSITORIES = {
    "nemo_rl": "https://github.com/NVIDIA-NeMo/RL",
    "slime": "https://github.com/THUDM/slime",
    "skyrl": "https://github.com/NovaSky-AI/SkyRL",
    "prime_rl": "https://github.com/PrimeIntellect-ai/prime-rl",
    "roll": "https://github.com/alibaba/ROLL",
}


@dataclass(frozen=True)
class Vendored:
    framework: str
    repository: str
    tag: str
    commit: str
    release: str              # the mapping release the proofs run as (the tag, as the mapping's `releases:` spell it)
    licence: str
    files: dict[str, str]     # repository path -> SHA-256 of the bytes kept

    @property
    def root(self) -> Path:
        return FOLDER / self.framework

    def path(self, repo_path: str) -> Path:
        if repo_path not in self.files:
            raise FileNotFoundError(f"{self.framework}: {repo_path} is not vendored "
                                    f"(python tests/_support/vendored.py add {self.framework} ...)")
        return self.root / "src" / repo_path


def frameworks() -> list[str]:
    """The frameworks vendored here (a folder with a PROVENANCE.yaml)."""
    return sorted(p.parent.name for p in FOLDER.glob("*/PROVENANCE.yaml"))


@functools.lru_cache(maxsize=None)
def provenance(framework: str) -> Vendored:
    path = FOLDER / framework / "PROVENANCE.yaml"
    doc = yaml.safe_load(path.read_text())
    return Vendored(doc["framework"], doc["repository"], doc["tag"], doc["commit"], str(doc["release"]),
                    doc["licence"], dict(doc.get("files") or {}))


def release(framework: str) -> str:
    """The release a vendored framework's proofs run as ("not vendored" when it is not)."""
    try:
        return provenance(framework).release.lstrip("v")
    except FileNotFoundError:
        return "not vendored"


def _package(name: str, path: Path) -> None:
    """An empty package module for ``name`` (its __init__.py is not run), so relative imports resolve."""
    if name in sys.modules:
        return
    mod = types.ModuleType(name)
    mod.__path__ = [str(path)]
    mod.__package__ = name
    sys.modules[name] = mod


def load(framework: str, repo_path: str, module: str | None = None,
         stand_ins: dict[str, types.ModuleType] | None = None) -> types.ModuleType:
    """The vendored file ``repo_path`` executed as the module ``module`` (by default its dotted path), under empty
    parent packages; ``stand_ins``: modules put in sys.modules while it is executed (imports it does not use), taken
    out again after (the loaded module keeps what it bound)."""
    v = provenance(framework)
    path = v.path(repo_path)
    name = module or repo_path.removesuffix(".py").replace("/", ".").removesuffix(".__init__")
    if name in sys.modules and getattr(sys.modules[name], "__file__", None) == str(path):
        return sys.modules[name]
    parts = name.split(".")
    for i in range(1, len(parts)):
        _package(".".join(parts[:i]), v.root / "src" / Path(*parts[:i]))
    saved = {k: sys.modules.get(k) for k in (stand_ins or {})}
    sys.modules.update(stand_ins or {})
    bytecode, sys.dont_write_bytecode = sys.dont_write_bytecode, True     # no __pycache__ beside the tag's files
    try:
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None, path
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
        if len(parts) > 1:
            setattr(sys.modules[".".join(parts[:-1])], parts[-1], mod)
        return mod
    except BaseException:
        sys.modules.pop(name, None)
        raise
    finally:
        sys.dont_write_bytecode = bytecode
        for k, old in saved.items():
            if old is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = old


def stand_in(name: str, **attrs: Any) -> types.ModuleType:
    """A module named ``name`` holding ``attrs``: for an import the code under test does not use."""
    mod = types.ModuleType(name)
    mod.__dict__.update(attrs)
    return mod


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# ------------------------------------------------------------------------------------------------ vendoring
def add(framework: str, git_dir: str, tag: str, paths: list[str], release_as: str | None = None) -> list[str]:
    """Copy ``paths`` of ``tag`` from the git directory ``git_dir`` into the framework's folder and record them."""
    root = FOLDER / framework
    prov = root / "PROVENANCE.yaml"
    doc = yaml.safe_load(prov.read_text()) if prov.exists() else None

    def git(*args: str) -> bytes:
        return subprocess.run(["git", "--git-dir", git_dir, *args], check=True, capture_output=True).stdout

    commit = git("rev-list", "-n", "1", tag).decode().strip()
    if doc is None:
        doc = {"framework": framework, "repository": REPOSITORIES[framework], "tag": tag, "commit": commit,
               "release": release_as or tag, "licence": "Apache-2.0 (LICENSE: the repository's, at the tag)",
               "fetched": datetime.date.today().isoformat(), "files": {}}
        root.mkdir(parents=True, exist_ok=True)
        (root / "LICENSE").write_bytes(git("show", f"{tag}:LICENSE"))
    elif doc["tag"] != tag or doc["commit"] != commit:
        raise SystemExit(f"{prov}: vendored from {doc['tag']} ({doc['commit']}); one tag per framework")
    wrote = []
    for p in paths:
        data = git("show", f"{tag}:{p}")
        dest = root / "src" / p
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(data)
        doc["files"][p] = sha256(data)
        wrote.append(str(dest.relative_to(FOLDER.parents[2])))
    doc["files"] = dict(sorted(doc["files"].items()))
    prov.write_text("# Written by `python tests/_support/vendored.py add` (tests/_support/vendored.py); the files "
                    "under src/ are\n# the tag's own, byte for byte, and tests/unit/test_vendored.py checks each "
                    "SHA-256 below.\n" + yaml.safe_dump(doc, sort_keys=False, width=1000))
    provenance.cache_clear()
    return wrote


def main(argv: list[str]) -> int:
    if len(argv) < 5 or argv[0] != "add":
        print("usage: python tests/_support/vendored.py add FRAMEWORK GIT_DIR TAG PATH... [--release R]",
              file=sys.stderr)
        return 2
    release_as = None
    if "--release" in argv:
        i = argv.index("--release")
        release_as = argv[i + 1]
        argv = argv[:i] + argv[i + 2:]
    for line in add(argv[1], argv[2], argv[3], argv[4:], release_as):
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
