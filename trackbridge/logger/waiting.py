"""Waiting for trackers at the end of a run, the same way in ``finish()`` and in a writer process whose training
process is gone: while they make progress, at most until a deadline; one that makes none for ``stall_timeout`` is
left behind. A wait longer than a few seconds says what it waits for."""
from __future__ import annotations

import time
from typing import Any, Callable

SAY_AFTER = 5.0          # seconds of waiting before the first word about it
SAY_EVERY = 15.0


def wait_for_trackers(workers: list[Any], *, end: float, stall_timeout: float, left: Callable[[Any], int],
                      say: Callable[[str], None] | None = None, finish_timeout: float | None = None) -> list[Any]:
    """Wait while ``workers`` (tracker workers, or the parent's view of the writer process's) make progress, until
    ``end`` (``time.monotonic()``). Returns the ones still at work (stalled, or out of time). ``left(w)``: records
    ``w`` still lacks, for the message ``say`` gets after :data:`SAY_AFTER` seconds (and every :data:`SAY_EVERY`)."""
    start = time.monotonic()
    last = {id(w): (w.progress(), start) for w in workers}
    next_say = start + SAY_AFTER
    while True:
        alive = [w for w in workers if w.thread.is_alive()]
        now = time.monotonic()
        if not alive or now >= end:
            return alive
        stalled = []
        for w in alive:
            p = w.progress()
            if p != last[id(w)][0] or w.starting():
                last[id(w)] = (p, now)
            elif now - last[id(w)][1] > stall_timeout:
                stalled.append(w)
        if len(stalled) == len(alive):
            return alive
        if say is not None and now >= next_say:
            next_say = now + SAY_EVERY
            parts = []
            for w in alive:
                quiet = now - last[id(w)][1]
                n = left(w)
                what = ("opening its run" if w.state == "pending" else f"{n} records left" if n else "closing")
                quiet_part = f", no progress for {quiet:.0f} s" if quiet >= 1 and w.state != "pending" else ""
                parts.append(f"{w.name} ({what}{quiet_part})")
            limit = f"; at most {finish_timeout:g} s in all" if finish_timeout is not None else ""
            say(f"finish(): waiting {now - start:.0f} s so far for {', '.join(parts)}; a tracker that makes no "
                f"progress for {stall_timeout:g} s is left behind (written down for trackbridge replay){limit}")
        alive[0].thread.join(0.1)
