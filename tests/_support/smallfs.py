"""A real small file system for disk-full faults: a child process started in its own user and mount namespace
(``unshare -rm``, no privileges needed where unprivileged user namespaces are allowed) with a tmpfs of a few KB
mounted over a folder. Only the child sees that tmpfs (the folder stays empty outside), so the child copies out
what the test reads; everything else it writes lands on the ordinary disk.

``small_fs_problem()`` says why it cannot be done here (the test is then skipped, saying so), or None."""
from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from . import ROOT


@functools.lru_cache(maxsize=1)
def small_fs_problem() -> str | None:
    exe = shutil.which("unshare")
    if exe is None:
        return "no unshare(1) on this machine"
    with tempfile.TemporaryDirectory() as d:
        try:
            r = subprocess.run([exe, "-rm", "--", "sh", "-c", 'mount -t tmpfs -o size=64k tb-probe "$0"', d],
                               capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"unshare -rm failed: {exc}"
    if r.returncode != 0:
        return f"cannot mount a private tmpfs here (unshare -rm: {r.stderr.strip()[:200]})"
    return None


def start_in_small_fs(mount: Path, size_kb: int, script: Path, *args: Any, **popen: Any) -> subprocess.Popen:
    """Run ``python script ARGS`` with a ``size_kb`` KB tmpfs over ``mount`` (created if missing); the child's
    pid is Python's (the shell execs it), so signals reach it."""
    mount.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=str(ROOT), WANDB_MODE="offline", WANDB_SILENT="true",
               MLFLOW_DISABLE_TELEMETRY="true")
    cmd = ["unshare", "-rm", "--", "sh", "-c", f'mount -t tmpfs -o size={int(size_kb)}k tb-test "$0" && exec "$@"',
           str(mount), sys.executable, str(script), *map(str, args)]
    return subprocess.Popen(cmd, env=env, **popen)
