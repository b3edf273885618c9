"""The pending note: which trackers ``finish()`` left with records of the run missing, written beside the spool for
``trackbridge replay SPOOL`` (which strikes the trackers it completed).

What a tracker on this machine lacks is counted exactly (:func:`count_lacking`): the spool's points (under the names
the tracker receives, of the kinds it can store) against what the tracker holds, read back with its own reader, once
nothing writes to it any more. A resumed run's catch-up cut short by ``finish_timeout`` once said "lacks 300 records"
(the records of this process) where the tracker lacked 12,787 (the catch-up's too; issue 31). A tracker behind a
server, one without a reader, or one whose reading takes longer than :data:`COUNT_WITHIN` seconds keeps the estimate
from its worker's count (records after the last one it acknowledged)."""
from __future__ import annotations

import contextlib
import math
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ..errors import UsageError
from ..record import Histogram, Record
from .common import warn
from .runlock import outcome_entry
from .tracker import closed_cleanly, cut_threads

#: the most seconds :func:`count_lacking` reads a tracker back (a store locked by a process that hangs must not hold
#: ``finish()``): beyond, the estimate is noted instead
COUNT_WITHIN = 10.0


@dataclass
class Lack:
    """What a tracker lacks of a run: points (key, step), the records they belong to, the first such record's
    number (None: it lacks nothing), and the points it holds."""

    points: int = 0
    records: int = 0
    first: int | None = None
    held: int = 0


def countable(locator: str) -> bool:
    """Whether what the tracker at ``locator`` holds can be read back here to count what it lacks: a store on this
    machine (not a server) of a kind trackbridge has a reader for."""
    from ..trackers import kinds, sink_class
    from ..tracking.locators import parse
    try:
        loc = parse(locator)
        if loc.kind not in kinds("source"):
            return False
        return sink_class(loc.kind).local_path(loc.location) is not None and loc.options.get("mode") != "online"
    except Exception:
        return False


def count_lacking(spool: str | os.PathLike, locator: str, run_id: str, *,
                  rename: Callable[[Record], Record] | None = None, within: float = COUNT_WITHIN) -> Lack | None:
    """What the tracker at ``locator`` lacks of the run ``run_id`` in the spool, counted against what it holds, read
    with its reader (:func:`trackbridge.trackers.open_source`); ``rename``: the run's renaming for ``names=`` (the
    spool holds canonical names). None when it cannot be counted here: no reader for it, a server, a run the reader
    cannot single out, or more than ``within`` seconds of reading."""
    out: list[Lack | None] = []
    t = threading.Thread(target=lambda: out.append(_count(spool, locator, run_id, rename, within)),
                         name="trackbridge-pending-count", daemon=True)
    t.start()
    t.join(within)
    return out[0] if out else None


def _count(spool: str | os.PathLike, locator: str, run_id: str, rename: Callable[[Record], Record] | None,
           within: float) -> Lack | None:
    import time
    from urllib.parse import urlencode

    from ..stream import read_stream
    from ..sync.holdings import Holdings
    from ..trackers import open_source, sink_class, source_class
    from ..tracking.locators import parse
    end = time.monotonic() + within
    try:
        loc = parse(locator)
        sink_cls, src_cls = sink_class(loc.kind), source_class(loc.kind)
        where = sink_cls.local_path(loc.location)
        if where is None or loc.options.get("mode") == "online":
            return None              # a server: reading it back may hang as writing did
        held = Holdings()
        if where.exists():
            known = set(getattr(src_cls, "option_names", None) or ()) - {"run"}
            opts = {k: v for k, v in loc.options.items() if k in known}
            text = f"{loc.kind}:{loc.location}" + (f"?{urlencode(opts)}" if opts else "")
            runs = [r for r in open_source(text).runs() if r.info.run_id == run_id]
            if len(runs) > 1:
                return None
            for r in runs:
                for rec in r.records():
                    if time.monotonic() > end:
                        return None
                    if rec.step is not None:
                        for key, value in rec.metrics.items():
                            if value is not None:
                                held.add(key, rec.step)
        caps = sink_cls.capabilities
        lack = Lack(held=held.points)
        for seq, rec in read_stream(spool):
            if seq % 1000 == 0 and time.monotonic() > end:
                return None
            if rename is not None:
                rec = rename(rec)
            rec.metrics = {k: v for k, v in rec.metrics.items() if _storable(v, caps)}
            if not rec.metrics:
                continue
            cut = held.lacking(rec)
            n = 0 if cut is None else sum(1 for v in cut.metrics.values() if v is not None)
            if n:
                lack.points += n
                lack.records += 1
                if lack.first is None:
                    lack.first = seq
        return lack
    except Exception:       # a reader that cannot read it now: the estimate is noted instead
        return None


def _storable(v: Any, caps: Any) -> bool:
    """Whether a tracker of capabilities ``caps`` stores the value ``v`` as a point (what it leaves out, or keeps
    in another form, cannot be counted against it)."""
    if v is None:
        return False
    if isinstance(v, str):
        return bool(caps.text)
    if isinstance(v, Histogram):
        return bool(caps.histograms)
    if isinstance(v, float) and not math.isfinite(v):
        return bool(caps.nan)
    return True


def note_entry(w: Any, *, records: int, left: int, lack: Lack | None) -> dict[str, Any]:
    """One tracker's row of the pending note (``w``: its worker, or the writer process's view of one): what it lacks
    counted against what it holds (``lack``), else estimated from its worker (``left`` records after the last one it
    acknowledged); ``records``: the run's records; with how the run ended."""
    entry: dict[str, Any] = {"sink": w.sink.locator(), "describe": w.name,
                             "records_left": left if lack is None else lack.records,
                             "from_record": w.acked + 1 if lack is None else lack.first, "records": records,
                             "state": w.state, "last_error": w.last_error}
    if lack is not None:
        entry.update(points_left=lack.points, points_held=lack.held, counted="read back from the tracker")
    else:
        entry.update(counted="estimated (records after the last one it acknowledged)")
    return {**entry, **outcome_entry(w.sink.outcome, w.sink.exit_code)}


def pending_file(spool: str | os.PathLike) -> Path:
    """Where ``finish()`` writes down which trackers lack records of the run in ``spool``."""
    p = Path(spool)
    return p.with_name(p.name + ".pending.json")


def write_pending(path: Path, run_id: str, entries: list[dict[str, Any]]) -> None:
    """Write the note whole (a temporary file moved into place) or not at all: a note that cannot be written (a
    full disk) leaves no temporary file behind; the ``OSError`` tells the caller, who says what it would hold."""
    import json
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(json.dumps({"run_id": run_id, "sinks": entries}, indent=1, default=str), encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise


def read_pending(spool: str | os.PathLike) -> list[dict[str, Any]]:
    """The trackers ``finish()`` left with records missing (``[]`` when none, or no note)."""
    import json
    path = pending_file(spool)
    if not path.is_file():
        return []
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UsageError(f"{path}: not a readable pending note ({exc})") from None
    return [e for e in data.get("sinks") or [] if isinstance(e, dict) and e.get("sink")]


def settle_pending(spool: str | os.PathLike, done: list[str]) -> None:
    """Strike the sinks in ``done`` (locators) from the pending note; remove it when none is left."""
    path = pending_file(spool)
    left = [e for e in read_pending(spool) if e["sink"] not in done]
    if not left:
        if path.exists():
            path.unlink()
        return
    import json
    run_id = json.loads(path.read_text(encoding="utf-8")).get("run_id", "")
    write_pending(path, run_id, left)


def where_they_are(spool_path: Path, spool: Any) -> str:
    """Where what the trackers lack can be had: the spool (``trackbridge replay``), or as far as it goes when the
    spool worker could not write some of the run's records (``spool.lost``)."""
    if not spool.lost:
        return f"they are in the spool: trackbridge replay {spool_path}"
    return (f"the spool lacks {spool.lost_records} of the run's records too (it could not be written), so "
            f"trackbridge replay {spool_path} completes them only as far as the spool goes")


def lack_message(w: Any, n: int, lack: "Lack | None", *, records: int, where: str, interrupted: bool) -> str:
    """What ``finish()`` says of one tracker left behind: ``n`` of the run's ``records`` lacked, counted against
    what it holds (``lack``) or estimated from the records it acknowledged."""
    state = "interrupted" if interrupted else w.state
    err = f"; last error: {w.last_error}" if w.last_error else ""
    if lack is not None:
        return (f"sink {w.name} lacks {lack.points:,} points in {n:,} of the run's {records:,} records (counted "
                f"against the {lack.held:,} points it holds, read back with its reader; from record {lack.first}; "
                f"{state}{err}); {where}")
    return f"sink {w.name} lacks {n} of the run's {records} records (from record {w.acked + 1}; {state}{err}); {where}"


def note_left(trackers: list[Any], *, seq: int, spool_path: Path, run_id: str, rename: Any, spool: Any,
              problems: list[str], interrupted: bool, wait: float) -> None:
    """After ``finish()``: write down, beside the spool, which trackers lack which records (and say so), so that
    ``trackbridge replay SPOOL`` completes them; remove the note when nothing is left. Says whether the spool
    holds what they lack (it may not: a spool that could not be written). A tracker on this machine that was left
    behind is first stopped (threads: :attr:`~.worker.Worker.cut`; the writer process has ended), then what it
    lacks is counted against what it holds, read back with its own reader (:func:`count_lacking`):
    points and records, exactly; an interrupted finish(), a server or a tracker without a reader keep the
    worker's estimate (records after the last one it acknowledged)."""
    last_seq = seq - 1
    behind = [w for w in trackers if not closed_cleanly(w)]
    counted = {id(w) for w in behind if not interrupted and countable(w.sink.locator())}
    if behind and not interrupted:
        cut_threads(behind, wait_for=counted, wait=wait)
    rows: list[tuple[Any, int, Lack | None]] = []
    for w in behind:
        lack = count_lacking(spool_path, w.sink.locator(), run_id, rename=rename) if id(w) in counted else None
        if lack is not None:
            if lack.points:
                rows.append((w, lack.records, lack))
        else:
            n = w.left(last_seq)
            if n:
                rows.append((w, n, None))
    path = pending_file(spool_path)
    if not rows:
        with contextlib.suppress(OSError):
            path.unlink(missing_ok=True)
        return
    where = where_they_are(spool_path, spool)
    entries = [note_entry(w, records=seq, left=n, lack=lack) for w, n, lack in rows]
    try:
        write_pending(path, run_id, entries)
    except OSError as exc:
        warn(f"trackbridge: could not write the pending note {path} ({exc}); what it would hold is in the "
             f"warnings below")
    for w, n, lack in rows:
        msg = lack_message(w, n, lack, records=seq, where=where, interrupted=interrupted)
        problems.append(msg)
        warn(f"trackbridge: finish(): {msg}")
