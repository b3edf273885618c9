"""Read a child process's output line by line with a deadline: a child that never prints what a test waits for
fails the test in time instead of hanging the session."""
from __future__ import annotations

import queue
import threading
from typing import IO


class Lines:
    def __init__(self, stream: IO[str]) -> None:
        self.q: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            self.q.put(line)
        self.q.put(None)

    def next(self, timeout: float = 300) -> str:
        """The next line (without its newline); AssertionError when none comes within ``timeout`` seconds or the
        stream ends first."""
        try:
            line = self.q.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"the child printed nothing more in {timeout:g} s") from None
        if line is None:
            raise AssertionError("the child's output ended")
        return line.rstrip("\n")

    def rest(self, timeout: float = 300) -> str:
        """What is printed after the lines taken, up to the stream's end (its pipe closed by every process holding
        it); AssertionError when it has not ended within ``timeout`` seconds."""
        import time
        end = time.monotonic() + timeout
        out = []
        while True:
            try:
                line = self.q.get(timeout=max(0.0, end - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"the stream did not end within {timeout:g} s") from None
            if line is None:
                return "".join(out)
            out.append(line)
