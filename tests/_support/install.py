"""Helpers of the wheel smoke (tests/install): fresh venvs holding the built wheel, commands run in them with a
clean environment, the files and modules the wheel must hold. See tests/install/conftest.py."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import zipfile
from dataclasses import dataclass
from pathlib import Path

from . import ROOT

PIP_TIMEOUT = 900           # a cold pip cache on a loaded machine


@dataclass
class Ran:
    """A finished command, printed in full when an assertion about it fails."""

    args: list[str]
    returncode: int
    stdout: str
    stderr: str

    def __str__(self) -> str:
        def tail(text: str) -> str:
            lines = text.rstrip().splitlines()
            return "\n    ".join((["..."] if len(lines) > 40 else []) + lines[-40:]) or "(empty)"
        return (f"\n$ {' '.join(self.args)}\nexit code {self.returncode}\n--- stdout:\n    {tail(self.stdout)}"
                f"\n--- stderr:\n    {tail(self.stderr)}\n")

    __repr__ = __str__


def clean_env(venv: Path) -> dict[str, str]:
    """The session's environment (wandb offline, scratch folders) without anything that would put the checkout
    or another environment on the path."""
    # PYTHONDONTWRITEBYTECODE (set on some machines, this one included) left out: the venv is installed --no-compile,
    # so every command would compile MLflow, wandb and the rest from source again; with it gone, the first command
    # to import a module writes its bytecode inside the venv (a temporary folder) and the others reuse it
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV", "PYTHONSAFEPATH",
                        "PYTHONDONTWRITEBYTECODE")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(venv)
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def run(args: list[str | os.PathLike], *, cwd: Path, env: dict[str, str], timeout: float = 300) -> Ran:
    argv = [str(a) for a in args]
    p = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    return Ran(argv, p.returncode, p.stdout, p.stderr)


@dataclass
class Venv:
    """A fresh virtual environment holding the installed wheel."""

    path: Path
    work: Path          # a scratch folder outside the checkout: every command runs here

    @property
    def env(self) -> dict[str, str]:
        return clean_env(self.path)

    def exe(self, name: str) -> Path:
        return self.path / "bin" / name

    def tb(self, *args: str | os.PathLike, cwd: Path | None = None, timeout: float = 300) -> Ran:
        """``trackbridge ARGS`` through the installed console script."""
        return run([self.exe("trackbridge"), *args], cwd=cwd or self.work, env=self.env, timeout=timeout)

    def py(self, code: str, *args: str | os.PathLike, cwd: Path | None = None, timeout: float = 300) -> Ran:
        return run([self.exe("python"), "-c", textwrap.dedent(code), *args], cwd=cwd or self.work, env=self.env,
                   timeout=timeout)

    def site_package(self) -> Path:
        r = self.py("import trackbridge, pathlib; print(pathlib.Path(trackbridge.__file__).parent)")
        assert r.returncode == 0, r
        return Path(r.stdout.strip())

    def examples(self) -> Path:
        return self.site_package() / "examples"


@dataclass
class Dist:
    sdist: Path
    wheel: Path
    log: str


#: what a copy of the checkout to build from leaves out at its top: tests, caches, environments, builds, outputs
NOT_BUILT = {".git", ".venv", "venv", "tests", "benchmarks", "out", "build", "dist", ".pytest_cache", ".hypothesis",
             ".mypy_cache", ".ruff_cache", "wandb", "mlruns", "runs"}


def _not_built(folder: str, names: list[str]) -> set[str]:
    top = NOT_BUILT if Path(folder).resolve() == ROOT else set()
    return {n for n in names if n in top or n == "__pycache__" or n.endswith(".egg-info")}


def build(out: Path) -> Dist:
    """The sdist and the wheel, built by ``python -m build`` (isolated, as pip builds it) from a copy of this
    checkout (setuptools writes its egg-info beside the sources; the checkout is left alone) into ``out``: the wheel
    is built from the sdist, so a file the sdist forgets is missing from both."""
    src = out / "src"
    shutil.copytree(ROOT, src, ignore=_not_built)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = run([sys.executable, "-m", "build", "--outdir", out, src], cwd=out, env=env, timeout=PIP_TIMEOUT)
    assert r.returncode == 0, f"building the sdist and the wheel failed:{r}"
    sdists, wheels = sorted(out.glob("*.tar.gz")), sorted(out.glob("*.whl"))
    assert len(sdists) == 1 and len(wheels) == 1, (sorted(p.name for p in out.iterdir()), r)
    return Dist(sdists[0], wheels[0], r.stdout + r.stderr)


def make_venv(root: Path, requirement: str) -> Venv:
    """A fresh venv in ``root/venv`` with ``requirement`` installed (not editable), and its scratch folder
    ``root/work``; checks that trackbridge is imported from the venv, not from the checkout."""
    path, work = root / "venv", root / "work"
    work.mkdir(parents=True)
    r = run([sys.executable, "-m", "venv", path], cwd=root, env=clean_env(path))
    assert r.returncode == 0, r
    # --no-compile: pip would byte-compile every file of every dependency (half of the install's CPU time); Python
    # compiles what the commands import, once, as they import it
    r = run([path / "bin" / "python", "-m", "pip", "install", "-q", "--no-compile", "-c", ROOT / "constraints.txt",
             requirement], cwd=work, env=clean_env(path), timeout=PIP_TIMEOUT)
    assert r.returncode == 0, f"installing {requirement} into a fresh venv failed:{r}"
    venv = Venv(path, work)
    where = venv.site_package()
    assert path in where.parents, f"trackbridge imported from {where}, not from the venv {path}"
    assert ROOT not in where.parents
    return venv


def wheel_names(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as z:
        return set(z.namelist())


def source_files() -> dict[str, str]:
    """Every file the wheel must hold, as ``path in the wheel -> path in the checkout``: ``trackbridge/`` as it is,
    ``mappings/`` as ``trackbridge/mappings/`` and ``examples/`` as ``trackbridge/examples/`` (package-dir in
    pyproject.toml). Caches and compiled files are left out."""
    out: dict[str, str] = {}
    for folder, inside in (("trackbridge", "trackbridge"), ("mappings", "trackbridge/mappings"),
                           ("examples", "trackbridge/examples")):
        for p in sorted((ROOT / folder).rglob("*")):
            rel = p.relative_to(ROOT / folder)
            if p.is_dir() or "__pycache__" in rel.parts or p.suffix in (".pyc", ".pyo"):
                continue
            out[f"{inside}/{rel.as_posix()}"] = f"{folder}/{rel.as_posix()}"
    return out


def source_modules() -> list[str]:
    """Every module of the source tree, by the name it has once installed (``trackbridge.mappings`` included)."""
    mods = []
    for inside in source_files():
        if inside.endswith(".py"):
            name = inside[:-3].replace("/", ".").removesuffix(".__init__")
            if name != "trackbridge.__main__":
                mods.append(name)
    return sorted(mods)


def one_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, f"expected one line, got {len(lines)}:\n" + "\n".join(lines)
    return lines[0]


def load_json(path: Path) -> object:
    return json.loads(path.read_text(encoding="utf-8"))
