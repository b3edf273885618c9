"""Test helper: a real ``mlflow server`` on 127.0.0.1 with a SQLite backend, started and stopped around a block.

    with mlflow_server(tmp_path) as url:      # url == "http://127.0.0.1:<free port>"
        ...

The server runs as a subprocess of the venv's ``mlflow`` executable with ``--backend-store-uri sqlite:///...``,
``--artifacts-destination`` under ``tmp_path`` and one worker; the helper waits until ``/health`` answers, and on exit
terminates the process group it started (only that one). Telemetry is disabled in the child's environment.
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


@contextlib.contextmanager
def mlflow_server(root: Path, timeout: float = 90.0) -> Iterator[str]:
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    port = free_port()
    db = root / "server.db"
    env = dict(os.environ, MLFLOW_DISABLE_TELEMETRY="true", PYTHONUNBUFFERED="1")
    log = open(root / "server.log", "wb")
    cmd = [_mlflow_exe(), "server", "--backend-store-uri", f"sqlite:///{db}",
           "--artifacts-destination", str(root / "artifacts"),
           "--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=root, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"mlflow server exited with {proc.returncode}; see {root / 'server.log'}:\n"
                                   + (root / "server.log").read_text(errors="replace")[-2000:])
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"mlflow server on {url} not ready after {timeout}s; see {root / 'server.log'}")
            time.sleep(0.3)
        yield url
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=5)
        log.close()


class MlflowServer:
    """A real ``mlflow server`` that a test can kill (SIGKILL, mid-request) and start again on the same port and
    store: ``start()``, ``kill()``, ``stop()``; ``url``. Use as a context manager (stopped on exit)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.db = self.root / "server.db"
        self.proc: subprocess.Popen | None = None
        self._log = None

    def start(self, timeout: float = 90.0) -> "MlflowServer":
        env = dict(os.environ, MLFLOW_DISABLE_TELEMETRY="true", PYTHONUNBUFFERED="1")
        self._log = open(self.root / "server.log", "ab")
        cmd = [_mlflow_exe(), "server", "--backend-store-uri", f"sqlite:///{self.db}",
               "--artifacts-destination", str(self.root / "artifacts"),
               "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1"]
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env, cwd=self.root,
                                     start_new_session=True)
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mlflow server exited with {self.proc.returncode}; see {self.root / 'server.log'}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as resp:
                    if resp.status == 200:
                        return self
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"mlflow server on {self.url} not ready after {timeout}s")
            time.sleep(0.3)

    def kill(self) -> None:
        """SIGKILL the server's process group: requests in flight are cut off."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        if self._log is not None:
            self._log.close()
            self._log = None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=5)
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> "MlflowServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
