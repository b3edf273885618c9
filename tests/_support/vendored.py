"""Framework releases with no wheel on the package index, run from their release tag's own files (issue 33).

NeMo-RL, slime, SkyRL, prime-rl and ROLL publish no usable wheel (fidelity_proofs.py names what the index holds), and
a wheel framework's releases that never reached the index (AReaL's before 1.0.4) have none either, so the files that
compute their logged metrics are kept here verbatim, as they are at a release tag. A framework's folder
``tests/data/frameworks/<framework>/`` holds its *primary* tag (the one its proofs ran from first; a framework with a
wheel has none: the wheel is its primary code) and each further tag in a folder of its own,
``tests/data/frameworks/<framework>/<tag>/``; each holds:

* ``src/<path in the repository>``: the tag's file, byte for byte (``git show <tag>:<path>``);
* ``LICENSE``: the repository's licence at that tag (every one of them is Apache-2.0, which allows redistribution
  with the licence and notice kept);
* ``PROVENANCE.yaml``: the repository, tag, commit, the release the proofs run as and every file's SHA-256
  (tests/unit/test_vendored.py checks each file against it, so an edit to a vendored file fails the suite).

A proof loads a file with :func:`load` as the module it is in its own package (``nemo_rl.algorithms.utils``), its
parent packages as empty modules (their ``__init__`` is not run), and with stand-ins only for imports the code under
test does not use (each proof module says which and why). Nothing here computes a metric.

Two tags of one framework do not collide: the primary tag's modules live in ``sys.modules`` under their own names (as
before), a further tag's in a namespace of its own (:data:`_TAG_MODULES`). While a further tag's file executes, every
``sys.modules`` entry of its top-level package (``areal``, ``areal.utils`` ...) is set aside and that tag's modules
loaded so far stand in their place, so its ``from areal.utils import stats_tracker`` binds that tag's file (load the
files a file imports before it); after, ``sys.modules`` is put back as it was. A further tag's code that imports
at call time sees the process's modules, not the tag's: its proof loads what such a call needs beforehand.

To vendor more files (one command; prints what it wrote)::

    python tests/_support/vendored.py add nemo_rl /work/.mirror/NVIDIA-NeMo+RL/repo v0.7.0 nemo_rl/algorithms/utils.py

A tag other than the primary one goes to its own folder (``add`` does that when the framework's primary tag is
another, or the framework has a wheel: :data:`WHEELS`).
"""
from __future__ import annotations

import contextlib
import datetime
import functools
import hashlib
import importlib.util
import subprocess
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

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
    "areal": "https://github.com/inclusionAI/AReaL",
}
#: the frameworks with a wheel (the installed one is their primary code): only their older tags are vendored
WHEELS = {"areal"}


@dataclass(frozen=True)
class Vendored:
    framework: str
    repository: str
    tag: str
    commit: str
    release: str              # the mapping release the proofs run as (the tag, as the mapping's `releases:` spell it)
    licence: str
    files: dict[str, str]     # repository path -> SHA-256 of the bytes kept
    primary: bool = True      # the framework's primary tag (its folder's own) or a further one (a folder of its own)

    @property
    def root(self) -> Path:
        return FOLDER / self.framework if self.primary else FOLDER / self.framework / self.tag

    def path(self, repo_path: str) -> Path:
        if repo_path not in self.files:
            raise FileNotFoundError(f"{self.framework}: {repo_path} is not vendored "
                                    f"(python tests/_support/vendored.py add {self.framework} ...)")
        return self.root / "src" / repo_path


def frameworks() -> list[str]:
    """The frameworks vendored here (their folder, or a tag folder in it, holds a PROVENANCE.yaml)."""
    return sorted({p.parent.name for p in FOLDER.glob("*/PROVENANCE.yaml")}
                  | {p.parents[1].name for p in FOLDER.glob("*/*/PROVENANCE.yaml")})


def tags(framework: str) -> list[str]:
    """Every vendored tag of ``framework``: the primary one first (none for a wheel framework), then the further
    ones in release order."""
    from trackbridge.schema.versions import version_key
    root = FOLDER / framework
    further = sorted((p.parent.name for p in root.glob("*/PROVENANCE.yaml")),
                     key=lambda t: version_key(t.lstrip("v")))
    return ([provenance(framework).tag] if (root / "PROVENANCE.yaml").exists() else []) + further


@functools.lru_cache(maxsize=None)
def provenance(framework: str, tag: str | None = None) -> Vendored:
    """The record of ``framework``'s vendored tag ``tag`` (None or the primary tag's name: the primary one)."""
    root = FOLDER / framework
    primary = tag is None or not (root / tag / "PROVENANCE.yaml").exists()
    path = root / "PROVENANCE.yaml" if primary else root / tag / "PROVENANCE.yaml"
    doc = yaml.safe_load(path.read_text())
    if tag is not None and doc["tag"] != tag:
        raise FileNotFoundError(f"{framework}: tag {tag} is not vendored (tags: {tags(framework)})")
    return Vendored(doc["framework"], doc["repository"], doc["tag"], doc["commit"], str(doc["release"]),
                    doc["licence"], dict(doc.get("files") or {}), primary)


def release(framework: str, tag: str | None = None) -> str:
    """The release a vendored framework's proofs run as ("not vendored" when it is not): its primary tag's, or
    ``tag``'s."""
    try:
        return provenance(framework, tag).release.lstrip("v")
    except FileNotFoundError:
        return "not vendored"


def releases(framework: str) -> list[str]:
    """The releases of every vendored tag of ``framework`` (the primary tag's first); [] when none is."""
    return [provenance(framework, t).release.lstrip("v") for t in tags(framework)]


def tag_of(framework: str, release_: str) -> str:
    """The vendored tag whose proofs run as ``release_``."""
    for t in tags(framework):
        if provenance(framework, t).release.lstrip("v") == release_.lstrip("v"):
            return t
    raise FileNotFoundError(f"{framework}: no vendored tag runs as {release_} (tags: {tags(framework)})")


def _package(name: str, path: Path) -> None:
    """An empty package module for ``name`` (its __init__.py is not run), so relative imports resolve."""
    if name in sys.modules:
        return
    mod = types.ModuleType(name)
    mod.__path__ = [str(path)]
    mod.__package__ = name
    sys.modules[name] = mod


#: a further tag's modules, kept out of sys.modules: (framework, tag) -> {module name: module}
_TAG_MODULES: dict[tuple[str, str], dict[str, types.ModuleType]] = {}


def load(framework: str, repo_path: str, module: str | None = None,
         stand_ins: dict[str, types.ModuleType] | None = None, tag: str | None = None) -> types.ModuleType:
    """The vendored file ``repo_path`` of ``tag`` (None: the primary tag) executed as the module ``module`` (by
    default its dotted path), under empty parent packages; ``stand_ins``: modules put in sys.modules while it is
    executed (imports it does not use), taken out again after (the loaded module keeps what it bound). A further
    tag's modules are kept apart from the process's (the module docstring)."""
    v = provenance(framework, tag)
    if v.primary:
        return _load(v, repo_path, module, stand_ins, sys.modules)
    ns = _TAG_MODULES.setdefault((framework, v.tag), {})
    name = module or _dotted(repo_path)
    top = name.split(".")[0]
    tops = {top, *(k.split(".")[0] for k in stand_ins or {})}
    mine = [k for k in sys.modules if k.split(".")[0] in tops]
    saved = {k: sys.modules.pop(k) for k in mine}
    sys.modules.update({k: m for k, m in ns.items() if k.split(".")[0] in tops})
    try:
        mod = _load(v, repo_path, module, stand_ins, sys.modules)
        ns.update({k: m for k, m in sys.modules.items() if k.split(".")[0] in tops and k not in (stand_ins or {})})
        return mod
    finally:
        for k in [k for k in sys.modules if k.split(".")[0] in tops]:
            del sys.modules[k]
        sys.modules.update(saved)


@contextlib.contextmanager
def active(framework: str, tag: str, extra: dict[str, types.ModuleType] | None = None) -> Iterator[None]:
    """While open: a further tag's modules loaded so far (and ``extra``: stand-ins for what its code imports at call
    time) in sys.modules in place of the process's modules of their top-level packages, for the tag's code that
    imports when called; after, sys.modules is put back as it was."""
    ns = {**_TAG_MODULES.get((framework, provenance(framework, tag).tag), {}), **(extra or {})}
    tops = {k.split(".")[0] for k in ns}
    saved = {k: sys.modules.pop(k) for k in [k for k in sys.modules if k.split(".")[0] in tops]}
    sys.modules.update(ns)
    try:
        yield
    finally:
        for k in [k for k in sys.modules if k.split(".")[0] in tops]:
            del sys.modules[k]
        sys.modules.update(saved)


def _dotted(repo_path: str) -> str:
    return repo_path.removesuffix(".py").replace("/", ".").removesuffix(".__init__")


def _load(v: Vendored, repo_path: str, module: str | None, stand_ins: dict[str, types.ModuleType] | None,
          modules: dict[str, types.ModuleType]) -> types.ModuleType:
    path = v.path(repo_path)
    name = module or _dotted(repo_path)
    if name in modules and getattr(modules[name], "__file__", None) == str(path):
        return modules[name]
    parts = name.split(".")
    for i in range(1, len(parts)):
        _package(".".join(parts[:i]), v.root / "src" / Path(*parts[:i]))
    saved = {k: modules.get(k) for k in (stand_ins or {})}
    modules.update(stand_ins or {})
    bytecode, sys.dont_write_bytecode = sys.dont_write_bytecode, True     # no __pycache__ beside the tag's files
    try:
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None, path
        mod = importlib.util.module_from_spec(spec)
        modules[name] = mod
        spec.loader.exec_module(mod)
        if len(parts) > 1:
            setattr(modules[".".join(parts[:-1])], parts[-1], mod)
        return mod
    except BaseException:
        modules.pop(name, None)
        raise
    finally:
        sys.dont_write_bytecode = bytecode
        for k, old in saved.items():
            if old is None:
                modules.pop(k, None)
            else:
                modules[k] = old


def stand_in(name: str, **attrs: Any) -> types.ModuleType:
    """A module named ``name`` holding ``attrs``: for an import the code under test does not use."""
    mod = types.ModuleType(name)
    mod.__dict__.update(attrs)
    return mod


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# ------------------------------------------------------------------------------------------------ vendoring
def add(framework: str, git_dir: str, tag: str, paths: list[str], release_as: str | None = None) -> list[str]:
    """Copy ``paths`` of ``tag`` from the git directory ``git_dir`` into the tag's folder and record them: the
    framework's folder for its primary tag (the first vendored of a framework without a wheel), else
    ``<framework>/<tag>/``."""
    root = FOLDER / framework
    primary = root / "PROVENANCE.yaml"
    if framework in WHEELS or (primary.exists() and yaml.safe_load(primary.read_text())["tag"] != tag):
        root = root / tag
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
        raise SystemExit(f"{prov}: vendored from {doc['tag']} ({doc['commit']}), not {tag} ({commit})")
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
