"""Test helper: a real ``mlflow server`` on 127.0.0.1 with a SQLite backend.

Tests take the ``mlflow_server`` fixture (tests/trackers/conftest.py): one server per test module, started once
and shared by the module's tests, running when each test starts (restarted if an earlier test killed it). A test
keeps to its own experiment names or run ids, and counts what it wrote (e.g. rows of the store) from what was
there before it.

    def test_x(mlflow_server):
        url = mlflow_server.url                   # "http://127.0.0.1:<free port>"
        mlflow_server.kill(); mlflow_server.start()     # SIGKILL it and bring it back (same port, same store)

Outside pytest, ``with mlflow_server(tmp_path) as url:`` starts and stops one around a block.

The server runs as a subprocess of the venv's ``mlflow`` executable with ``--backend-store-uri sqlite:///...``,
``--artifacts-destination`` under its folder and one worker, and without MLflow's job runner (its huey consumers
are seven more processes importing MLflow, for jobs the tests never use). Starting waits until ``/health`` answers;
stopping terminates the process group it started (only that one). Telemetry is disabled in the child's
environment.
"""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Iterator


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _mlflow_exe() -> str:
    exe = Path(sys.executable).with_name("mlflow")
    return str(exe) if exe.exists() else "mlflow"


def server_env() -> dict[str, str]:
    return dict(os.environ, MLFLOW_DISABLE_TELEMETRY="true", PYTHONUNBUFFERED="1",
                MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")


class MlflowServer:
    """A real ``mlflow server`` that a test can kill (SIGKILL, mid-request) and start again on the same port and
    store: ``start()``, ``kill()``, ``stop()``, ``ensure_running()``; ``url``, ``db``. Use as a context manager
    (stopped on exit)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.db = self.root / "server.db"
        self.proc: subprocess.Popen | None = None
        self._log = None
        self.starts = 0

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, timeout: float = 180.0) -> "MlflowServer":
        self._log = open(self.root / "server.log", "ab")
        cmd = [_mlflow_exe(), "server", "--backend-store-uri", f"sqlite:///{self.db}",
               "--artifacts-destination", str(self.root / "artifacts"),
               "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1"]
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=server_env(),
                                     cwd=self.root, start_new_session=True)
        self.starts += 1
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mlflow server exited with {self.proc.returncode}; see {self.root / 'server.log'}"
                                   ":\n" + (self.root / "server.log").read_text(errors="replace")[-2000:])
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as resp:
                    if resp.status == 200:
                        return self
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"mlflow server on {self.url} not ready after {timeout}s; see "
                                   f"{self.root / 'server.log'}")
            time.sleep(0.2)

    def ensure_running(self) -> "MlflowServer":
        """Start the server unless it is running (an earlier test may have killed it)."""
        if not self.running():
            self.stop()
            self.start()
        return self

    def kill(self) -> None:
        """SIGKILL the server's process group: requests in flight are cut off."""
        if self.running():
            assert self.proc is not None
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        self._close_log()

    def stop(self) -> None:
        if self.running():
            assert self.proc is not None
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=5)
        self._close_log()

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> "MlflowServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def mlflow_server(root: Path, timeout: float = 180.0) -> Iterator[str]:
    """A server started and stopped around a block; yields its URL."""
    srv = MlflowServer(root)
    srv.start(timeout)
    try:
        yield srv.url
    finally:
        srv.stop()
