"""The writer process's feed: every record the spool worker took, sent to the writer process through its pipe, in
order, whether or not the spool file could take it (``writer='process'``).

The spool worker encodes each batch once (the spool's own JSON lines) and hands the same bytes to the file and to
this feed, so a spool that cannot be written (a full disk, a deleted file) costs the trackers nothing. One thread
sends, so ``log()`` never waits on the pipe. What waits is bounded: beyond ``limit`` bytes queued (the writer
process lags far behind), the oldest batches that the spool file already holds are sent as *gaps* (``"gap", first,
last``), which the writer's trackers read back from the spool (as a tracker that fell behind does); batches the
spool could not take stay queued until it takes them (their bytes are the spool worker's held batches, bounded
there). Control messages (the run info learnt while logging, ``stop``, ``abort``) go through the same queue, after
the records before them.

When the writer process dies, the run restarts it and :meth:`Feed.restart` sends the new one what the spool file does
not hold yet; what it holds, each tracker catches up from the spool with what it lacks.
"""
from __future__ import annotations

import collections
import threading
from typing import Any, Callable


class Feed:
    def __init__(self, limit: int, spooled: Callable[[], int | None]) -> None:
        """``spooled()``: the highest record number the spool file holds in order (None: its numbers cannot be
        trusted any more); sent with every message, so that the writer's trackers know what they can catch up."""
        self.limit = limit
        self.spooled = spooled
        self.q: collections.deque[list[Any]] = collections.deque()
        self.bytes = 0
        self.cond = threading.Condition()
        self.gen = 0
        self.gaps = 0                # batches sent as gaps (for the status)
        self.closed = False

    # -- producers --------------------------------------------------------------------------------------------
    def records(self, first: int, last: int, data: bytes) -> None:
        with self.cond:
            self.q.append(["recs", first, last, data])
            self.bytes += len(data)
            if self.bytes > self.limit:
                self._trim()
            self.cond.notify_all()

    def control(self, msg: tuple[Any, ...]) -> None:
        with self.cond:
            self.q.append(["ctl", msg])
            self.cond.notify_all()

    def _trim(self) -> None:
        spooled = self.spooled()
        if spooled is None:
            return
        for item in self.q:
            if self.bytes <= self.limit:
                break
            if item[0] == "recs" and item[2] <= spooled:
                self.bytes -= len(item[3])
                item[0], item[3] = "gap", None
                self.gaps += 1
        # adjacent gaps become one
        merged: collections.deque[list[Any]] = collections.deque()
        for item in self.q:
            if item[0] == "gap" and merged and merged[-1][0] == "gap" and merged[-1][2] + 1 == item[1]:
                merged[-1][2] = item[2]
            else:
                merged.append(item)
        self.q = merged

    # -- the sender -------------------------------------------------------------------------------------------
    def start(self, conn: Any) -> None:
        with self.cond:
            self.gen += 1
            gen = self.gen
        threading.Thread(target=self._send, args=(conn, gen), name="trackbridge-writer-feed", daemon=True).start()

    def restart(self, conn: Any, items: list[list[Any]]) -> None:
        """A new writer process: queue ``items`` (what the spool does not hold yet, then the control messages
        still due) instead of what was queued for the dead one."""
        with self.cond:
            self.q = collections.deque(items)
            self.bytes = sum(len(i[3]) for i in items if i[0] == "recs")
            self.cond.notify_all()
        self.start(conn)

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.gen += 1
            self.cond.notify_all()

    def _send(self, conn: Any, gen: int) -> None:
        while True:
            with self.cond:
                while not self.q and gen == self.gen:
                    self.cond.wait()
                if gen != self.gen:
                    return
                item = self.q.popleft()
                if item[0] == "recs":
                    self.bytes -= len(item[3])
            spooled = self.spooled()
            if item[0] == "recs":
                msg: tuple[Any, ...] = ("recs", item[1], item[3], spooled)
            elif item[0] == "gap":
                msg = ("gap", item[1], item[2], spooled)
            else:
                msg = (*item[1], spooled)
            try:
                conn.send(msg)
            except (OSError, EOFError, ValueError):
                return          # the writer process is gone: the run's monitor restarts it (or gives up)

    def pending(self) -> int:
        with self.cond:
            return len(self.q)
