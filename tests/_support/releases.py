"""Older releases of the wheel frameworks, for the proofs of entries that cover only older releases (issue 33).

tests/releases.txt lists them (``name==version``, then the pinned companions of that release's time, such as an older
transformers, where the test environment's packages do not import it); ``make .venv/.test-installed`` installs each
line with ``pip install --no-deps --target .venv/releases/<name>-<version>``, beside the release constraints.txt
pins. A proof registered for such a release (``@proof("verl", trainer="ppo", release="0.8.0")``) runs in a child
process whose ``sys.path`` starts with that folder, so ``import verl`` there is the old release's own code (and its
companions' code, when its line names any) while everything else (torch, trackbridge, the proof's module) is the
test environment's. The child runs the proof function whole, every assertion included; what it asserted comes back
(each ``assert_stated`` call's key, logged value, batch and options, and the count of other checks), and the parent
replays the ``assert_stated`` calls against the mapping entries of that release,
so the records and the report are made exactly as for a proof run in process.

Run by hand: ``python tests/_support/releases.py install`` installs what tests/releases.txt lists (what make does);
``python tests/_support/releases.py install trl==0.11.4`` that line alone.
"""
from __future__ import annotations

import importlib.util
import os
import pickle
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

if __name__ == "__main__":                       # run as a script: make the test helpers importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _support import ROOT  # noqa: E402

LISTED = ROOT / "tests" / "releases.txt"
FOLDER = Path(os.environ.get("TRACKBRIDGE_RELEASES", ROOT / ".venv" / "releases"))
#: the wheel framework -> its distribution name
DISTS = {"trl": "trl", "verl": "verl", "openrlhf": "openrlhf", "areal": "areal"}
CHILD_TIMEOUT_S = 900


def _lines(path: Path) -> list[tuple[int, str, str, list[str]]]:
    """(line number, distribution, version, companions) per line of ``path``."""
    out = []
    for n, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        first, *rest = line.split()
        name, sep, version = first.partition("==")
        if not sep or not name.strip() or not version.strip():
            raise ValueError(f"{path}:{n}: expected name==version, got {raw!r}")
        for req in rest:
            cname, csep, cversion = req.partition("==")
            if not csep or not cname or not cversion:
                raise ValueError(f"{path}:{n}: a companion must be pinned as name==version, got {req!r}")
        out.append((n, name.strip(), version.strip(), rest))
    return out


def listed(path: Path = LISTED) -> dict[str, list[str]]:
    """{distribution: [version, ...]} from tests/releases.txt, in file order."""
    out: dict[str, list[str]] = {}
    for _, name, version, _ in _lines(path):
        out.setdefault(name, []).append(version)
    return out


def companions(dist: str, version: str, path: Path = LISTED) -> list[str]:
    """The pinned packages installed into the release's folder with it (``name==version``, the rest of its line):
    the dependencies of its time where the test environment's do not import it (an older transformers, say)."""
    for _, name, v, rest in _lines(path):
        if (name, v) == (dist, version):
            return list(rest)
    raise KeyError(f"{dist}=={version} is not listed in {path}")


def folder(dist: str, version: str) -> Path:
    return FOLDER / f"{dist}-{version}"


def installed(dist: str) -> list[str]:
    """The listed older releases of ``dist`` whose folder is there (installed by make)."""
    return [v for v in listed().get(dist, []) if installed_as_listed(dist, v)]


MARK = ".installed-line"


def installed_as_listed(dist: str, version: str) -> bool:
    """The release's folder holds it and exactly the companions its line names now (the line install wrote)."""
    where = folder(dist, version)
    mark = where / MARK
    want = " ".join([f"{dist}=={version}", *companions(dist, version)])
    return (where / dist).is_dir() and mark.is_file() and mark.read_text(encoding="utf-8").strip() == want


def install(python: str = sys.executable, only: list[str] | None = None) -> None:
    """Install every listed release (or those of ``only``, ``name==version`` each) with its companions into its own
    folder; a folder whose line changed is rebuilt from nothing."""
    import shutil
    for dist, versions in listed().items():
        for v in versions:
            if (only and f"{dist}=={v}" not in only) or installed_as_listed(dist, v):
                continue
            where = folder(dist, v)
            shutil.rmtree(where, ignore_errors=True)
            reqs = [f"{dist}=={v}", *companions(dist, v)]
            subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", "--target", str(where), *reqs],
                           check=True)
            (where / MARK).write_text(" ".join(reqs) + "\n", encoding="utf-8")


def runs_elsewhere(framework: str, release: str) -> bool:
    """True when a proof of ``framework`` at ``release`` must run in a child process: a wheel framework whose
    installed release (the one this process imports) is another one listed in tests/releases.txt (a release whose
    tag's files are vendored instead, tests/_support/vendored.py, runs in process: its proof loads those files)."""
    from _support import framework_code as F
    from _support import vendored as V
    dist = DISTS.get(framework)
    if dist is None or F.release(dist) == release:
        return False
    vendored = {r.lstrip("v") for r in V.releases(framework)} if framework in V.frameworks() else set()
    # neither the installed release nor a vendored tag: the child process (which skips when it is not installed),
    # never this process's code under another release's name
    return release not in vendored


def run_in_child(proof: Any, fixtures: dict[str, Any]) -> tuple[list[tuple[str, Any, Any, dict]], int]:
    """Run ``proof`` in a child process with its release first on sys.path: (the ``assert_stated`` calls it made,
    the count of its other checks). Skips (pytest) when the release is not installed; fails with the child's own
    error when the proof fails there."""
    import pytest
    dist = DISTS[proof.framework]
    where = folder(dist, proof.release)
    if not installed_as_listed(dist, proof.release):
        pytest.skip(f"{dist} {proof.release} is not installed as listed in {where} (tests/releases.txt; make "
                    ".venv/.test-installed installs it)")
    module_file, fn = proof.name.split("::")
    path = ROOT / "tests" / "frameworks" / module_file
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "calls.pkl"
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(where), str(ROOT / "tests")]),
                   PYTHONDONTWRITEBYTECODE="1")
        names = sorted(fixtures)
        done = subprocess.run([sys.executable, __file__, "child", str(path), fn, str(out), *names], env=env,
                              cwd=tmp, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-25:]
            raise AssertionError(f"{proof.name} at {dist} {proof.release} (child process) failed:\n" + "\n".join(tail))
        calls, checks = pickle.loads(out.read_bytes())
    return calls, checks


def _child(path: str, fn: str, out: str, fixtures: list[str]) -> None:
    """The child process: import the proof module, run the proof with a recording Proving, write what it asserted."""
    from _support import framework_code as F
    from _support import proven
    name = "_proofs." + Path(path).stem
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    pr = proven.PROOFS[f"{Path(path).name}::{fn}"]
    assert set(fixtures) <= {"tmp_path"}, f"a proof run in a child process may ask for tmp_path only, not {fixtures}"
    got = F.release(DISTS[pr.framework])
    assert got == pr.release, f"the child imports {pr.framework} {got}, not {pr.release} (sys.path: {sys.path[:3]})"
    from importlib import metadata
    for req in companions(DISTS[pr.framework], pr.release):
        name, _, want = req.partition("==")
        assert metadata.version(name) == want, f"the child imports {name} {metadata.version(name)}, not {want}"

    class Recording(proven.Proving):
        calls: list[tuple[str, Any, Any, dict]] = []

        def assert_stated(self, key: str, observed: Any, steps: Any = None, **kw: Any) -> Any:
            found = super().assert_stated(key, observed, steps, **kw)
            self.calls.append((key, observed, steps, kw))
            return found

    p = Recording(pr)
    with tempfile.TemporaryDirectory() as tmp:
        pr.fn(p, **{f: Path(tmp) for f in fixtures})
    Path(out).write_bytes(pickle.dumps((p.calls, p.assertions - len(p.calls))))


if __name__ == "__main__":
    if sys.argv[1:2] == ["child"]:
        _child(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:])
    elif sys.argv[1:2] == ["install"]:
        install(only=sys.argv[2:] or None)
    else:
        raise SystemExit("usage: releases.py install [NAME==VERSION ...] | child PROOF_FILE FUNCTION OUT [FIXTURE ...]")
