"""Output folders of ``trackbridge compare`` and ``trackbridge demo`` (:class:`OutputManifest`): a command deletes only
files it wrote itself. Each output folder gets a manifest, ``.trackbridge-manifest.json``, listing the files (and
folders) the command wrote there. The rule:

* a folder that does not exist or is empty is used;
* a folder holding a manifest of the same command is used: the files the manifest lists are deleted first (stale
  charts of an earlier report), everything else in it (the user's own files) is left alone;
* a non-empty folder without a manifest is refused (``ValueError``; exit 2 from the CLI) unless every file in it is
  one the command is about to write anyway (``compare`` into a folder holding only an earlier ``report.html``,
  ``summary.*`` and the same charts); so is a folder holding another command's manifest.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable, Iterable

MANIFEST = ".trackbridge-manifest.json"


class OutputManifest:
    """The files a command wrote into one output folder, so that the next run deletes those and nothing else (see
    the module docstring for the rule). Use :meth:`prepare` before writing and :meth:`save` after (and between
    stages: a run stopped midway has then listed what it wrote so far)."""

    def __init__(self, folder: Path, command: str, theirs: set[str]) -> None:
        self.folder = Path(folder)
        self.command = command
        self.theirs = theirs            # files (relative, posix) that were there before this run: not ours
        self.theirs_dirs: set[str] = set()
        self.skip_under: tuple[str, ...] = ()    # sub-folders another manifest manages (demo -> report/)

    # -- before writing --------------------------------------------------------------------------------------
    @classmethod
    def prepare(cls, folder: Path, command: str, will_write: Callable[[str], bool] | Iterable[str] | None = None,
                skip_under: tuple[str, ...] = ()) -> "OutputManifest":
        """Check ``folder`` and delete what an earlier run of ``command`` wrote there (per its manifest). Raises
        ``ValueError`` (saying why and what to do) for a folder that is not ours to write into. ``will_write``:
        the relative paths this run writes (or a test of one), which may be there without a manifest."""
        folder = Path(folder)
        if folder.exists() and not folder.is_dir():
            raise ValueError(f"{folder}: exists and is not a folder")
        files = _files_under(folder) if folder.exists() else set()
        manifest = folder / MANIFEST
        if manifest.is_file():
            try:
                data = json.loads(manifest.read_text(encoding="utf-8"))
                listed = [str(p) for p in data["files"]]
                dirs = [str(p) for p in data.get("dirs", [])]
                owner = str(data["command"])
            except (OSError, ValueError, KeyError, TypeError) as exc:
                raise ValueError(f"{folder}: its {MANIFEST} is unreadable ({exc}), so trackbridge cannot tell its "
                                 f"own files from yours; choose another folder") from None
            if owner != command:
                raise ValueError(f"{folder}: holds the output of `trackbridge {owner}` (see its {MANIFEST}); "
                                 f"choose another folder for `trackbridge {command}`")
            _delete_listed(folder, listed, dirs)
            files = _files_under(folder)
        elif files:
            test = will_write if callable(will_write) else (set(will_write) if will_write is not None else set())
            ok = test if callable(test) else test.__contains__
            foreign = sorted(f for f in files if not ok(f))
            if foreign:
                shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
                raise ValueError(
                    f"{folder}: the folder is not empty ({shown}) and holds no {MANIFEST}, the list of the files "
                    f"trackbridge wrote there, so it cannot tell your files from its own; choose another folder (or "
                    f"an empty one). trackbridge only ever deletes files it listed there itself.")
            files = set()               # only files this run writes anyway: they become ours
        out = cls(folder, command, {f for f in files if f != MANIFEST})
        out.theirs_dirs = _dirs_under(folder) if folder.exists() else set()
        out.skip_under = tuple(skip_under)
        out.save(complete=False)
        return out

    # -- after writing ---------------------------------------------------------------------------------------
    def save(self, complete: bool = True) -> None:
        """List every file now in the folder that was not there before this run (the manifest itself and
        sub-folders in ``skip_under`` aside)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        ours = sorted(f for f in _files_under(self.folder) if f != MANIFEST and f not in self.theirs
                      and not f.startswith(self.skip_under))
        dirs = sorted((d for d in _dirs_under(self.folder) - self.theirs_dirs
                       if not (d + "/").startswith(self.skip_under)), key=lambda d: (-d.count("/"), d))
        data = {"command": self.command, "complete": complete, "files": ours, "dirs": dirs,
                "note": f"files written by `trackbridge {self.command}`; its next run in this folder deletes these "
                        f"and nothing else"}
        tmp = self.folder / (MANIFEST + ".tmp")
        tmp.write_text(json.dumps(data, indent=1), encoding="utf-8")
        os.replace(tmp, self.folder / MANIFEST)


def _files_under(folder: Path) -> set[str]:
    out: set[str] = set()
    for dirpath, dirnames, filenames in os.walk(folder):
        rel = Path(dirpath).relative_to(folder)
        for name in filenames:
            out.add((rel / name).as_posix())
        for name in dirnames:             # symlinked folders are not followed: list the link itself
            if os.path.islink(os.path.join(dirpath, name)):
                out.add((rel / name).as_posix())
    return out


def _dirs_under(folder: Path) -> set[str]:
    out: set[str] = set()
    for dirpath, dirnames, _ in os.walk(folder):
        rel = Path(dirpath).relative_to(folder)
        out.update((rel / d).as_posix() for d in dirnames if not os.path.islink(os.path.join(dirpath, d)))
    return out


def _inside(folder: Path, rel: str) -> Path | None:
    """``folder / rel`` when it is inside ``folder``: ``rel`` a plain relative path (no ``..``, not absolute) and no
    folder on the way a link to elsewhere (its parent, resolved, is ``folder`` resolved or below it). The last part
    may itself be a link: removing a link removes the link, not what it points to."""
    p = Path(rel)
    if p.is_absolute() or ".." in p.parts or not p.parts:
        return None
    target = folder / p
    try:
        root = folder.resolve()
        parent = target.parent.resolve()
    except (OSError, RuntimeError):
        return None
    if parent != root and root not in parent.parents:
        return None
    return target


def _delete_listed(folder: Path, files: list[str], dirs: list[str]) -> None:
    for rel in files:
        p = _inside(folder, rel)
        if p is not None and (p.is_symlink() or p.is_file()):
            p.unlink()
    for rel in sorted(dirs, key=lambda d: -d.count("/")):       # deepest first; only if nothing else is left
        p = _inside(folder, rel)
        if p is not None and p.is_dir() and not p.is_symlink():
            try:
                p.rmdir()
            except OSError:
                pass                     # the user's files are in it: it stays
    (folder / MANIFEST).unlink(missing_ok=True)
