"""Appending whole lines to a tracker's own text file so that a failed append is taken back (issue 31: the JSON lines
two trackers' offline formats keep, on a disk that fills up)."""
from __future__ import annotations

import os
from pathlib import Path


class Appender:
    """Appends whole lines to a file, unbuffered: an append that fails part-way (a full disk) is taken back (the file
    cut to the end of the last append that completed, :attr:`durable`; cutting a file shorter needs no room) and
    raises, so the file never holds a torn line and a batch retried after it is written once."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fh = open(path, "ab", buffering=0)
        self.durable = self.fh.seek(0, os.SEEK_END)

    def append(self, data: bytes) -> None:
        fd = self.fh.fileno()
        if os.fstat(fd).st_size != self.durable:        # a failed append not yet cut back
            os.ftruncate(fd, self.durable)
        view, done = memoryview(data), 0
        try:
            while done < len(data):
                n = self.fh.write(view[done:])
                if not n:
                    raise OSError(f"{self.path}: wrote nothing at offset {self.durable + done}")
                done += n
        except OSError:
            try:
                os.ftruncate(fd, self.durable)
            except OSError:
                pass                                    # cut at the next append, or on open
            raise
        finally:
            view.release()
        self.durable += done

    def close(self) -> None:
        self.fh.close()


__all__ = ["Appender"]
