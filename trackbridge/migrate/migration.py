"""Migration: readers -> pipeline -> sinks, in batches, idempotent and resumable.

Every run in the source becomes its own run in the destination, under a run id derived from the source run (so a
second migration finds the same destination run). Progress is kept in a small ledger (:mod:`.ledger`: how
many source records of each run were written, and whether the run is complete): a migration interrupted halfway
continues after the last batch that was written, and a finished one is not written again. Without a ledger entry,
and for a batch that was in flight when the migration stopped, what the destination holds decides (per key and step
where the tracker can tell, else by its last step), through :func:`trackbridge.sync.catchup.lacking` as in every
catch-up. A run is migrated under its ledger's claim (:meth:`.ledger.Ledger.claim`): a second attempt at the
same run (a retried task whose first attempt is still alive, the same command started twice) waits, then continues
from the ledger, so a run is never opened twice in the destination.

Engines: ``engine="local"`` (the default) migrates the runs one after the other, or ``jobs`` at a time in threads;
``engine="ray"`` plans a manifest and migrates batches of runs as Ray tasks (:mod:`.bulk`, the ``[ray]``
extra). ``requests_per_s`` / ``points_per_s`` bound what all workers together send to the destination
(:mod:`.ratelimit`; with Ray, one limiter actor per destination server).
"""
from __future__ import annotations

import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator, TextIO

from ..pipeline import Stats
from ..read.inputs import InputRun, NothingReadable, open_runs
from ..read.selection import Selection
from ..record import Record, RunInfo
from ..trackers import check_options, kinds, make_sink, sink_class, source_locator
from ..tracking.locators import Locator, parse
from ..tracking.source import Problem
from .ledger import Ledger, ledger_key, state_dir, target_run_id  # noqa: F401  (state_dir, kept importable from here)
from .ratelimit import RateLimiter
from .resume import Cursor, adopt_ledger, finished_before, open_sink, read_destination, write_batch

BATCH_RECORDS = 500
BATCH_POINTS = 20_000
ENGINES = ("local", "ray")

#: ``throttle(requests, points)``: called before each request to the destination; returns when it may be sent
Throttle = Callable[[int, int], None]


@dataclass
class RunResult:
    source_name: str
    target_run_id: str
    records: int = 0
    points: int = 0
    skipped_records: int = 0           # already in the destination (idempotence / resume)
    already_done: bool = False        # migrated by an earlier command: nothing written now
    finished_earlier: bool = False    # finished by an earlier attempt of this plan (a retried task): its counts
    has_wall_time: bool = True
    problems: list[Problem] = field(default_factory=list)
    stats: Stats = field(default_factory=Stats)
    error: str | None = None
    #: points the destination's tracker could not take (:meth:`Sink.reject`): key -> [count, why, first step]
    left_out: dict[str, list] = field(default_factory=dict)
    unreadable: str | None = None     # the run's file had nothing readable (the error naming it): no run created


@dataclass
class MigrationResult:
    runs: list[RunResult] = field(default_factory=list)
    seconds: float = 0.0
    destination: str = ""                     # the destination's kind
    #: what the destination's tracker keeps less exactly than a record (its sink's ``capabilities.resolution``)
    resolution: tuple[str, ...] = ()

    @property
    def left_out(self) -> int:
        """Points the destination could not take, in all runs (said in the summary; ``migrate`` exits 1)."""
        return sum(n for r in self.runs for n, _why, _step in r.left_out.values())

    @property
    def ok(self) -> bool:
        return all(r.error is None for r in self.runs)

    def totals(self) -> Stats:
        st = Stats()
        for r in self.runs:
            st.merge(r.stats)
        return st


def _batches(records: Iterable[Record]) -> Iterable[list[Record]]:
    batch: list[Record] = []
    points = 0
    for rec in records:
        batch.append(rec)
        points += len(rec.metrics)
        if len(batch) >= BATCH_RECORDS or points >= BATCH_POINTS:
            yield batch
            batch, points = [], 0
    if batch:
        yield batch


class Progress:
    """A progress line: a live bar on a terminal, plain lines otherwise."""

    def __init__(self, total_runs: int, stream: TextIO | None = None, enabled: bool = True) -> None:
        self.total_runs = total_runs
        self.stream = stream or sys.stderr
        self.tty = enabled and hasattr(self.stream, "isatty") and self.stream.isatty()
        self.enabled = enabled
        self.lock = threading.Lock()
        self.points = 0
        self.runs_done = 0
        self.t0 = time.monotonic()
        self._last = 0.0

    def add(self, points: int) -> None:
        with self.lock:
            self.points += points
            now = time.monotonic()
            if self.tty and now - self._last > 0.2:
                self._last = now
                self._draw()

    def run_done(self, name: str, result: RunResult) -> None:
        with self.lock:
            self.runs_done += 1
            if not self.enabled:
                return
            if self.tty:
                self._draw()
                self.stream.write("\n")
            state = "already migrated" if result.already_done else (
                f"failed: {result.error}" if result.error else f"{result.points} points"
                + (" (finished by an earlier attempt)" if result.finished_earlier else ""))
            self.stream.write(f"run {self.runs_done}/{self.total_runs} {name}: {state}\n")
            self.stream.flush()

    def _draw(self) -> None:
        el = max(time.monotonic() - self.t0, 1e-9)
        rate = self.points / el
        width = 24
        frac = self.runs_done / self.total_runs if self.total_runs else 1.0
        bar = "#" * int(width * frac) + "-" * (width - int(width * frac))
        left = ""
        if 0 < self.runs_done < self.total_runs:
            eta = el / self.runs_done * (self.total_runs - self.runs_done)
            left = f" ~{int(eta // 60)}:{int(eta % 60):02d} left"
        self.stream.write(f"\r[{bar}] runs {self.runs_done}/{self.total_runs}  points {self.points:,} "
                          f"({rate:,.0f}/s){left}   ")
        self.stream.flush()


def migrate(src: str, dst: str, *, source: str = "auto", names: str = "canonical", derive: bool = False,
            dry_run: bool = False, jobs: int = 1, mappings: list[str] | None = None, progress: bool = True,
            out: TextIO | None = None, engine: str = "local", requests_per_s: float | None = None,
            points_per_s: float | None = None, ray_address: str | None = None,
            batch_runs: int | None = None, selection: Selection | None = None) -> MigrationResult:
    """Copy every run of ``src`` into ``dst`` (both run locators), translating names on the way.

    ``engine``: ``local`` (one run after the other, ``jobs`` at a time in threads) or ``ray`` (batches of runs as
    Ray tasks, ``jobs`` in flight at most, ``batch_runs`` runs per task; ``ray_address``: the cluster, default
    ``RAY_ADDRESS`` or a new local one: see :mod:`.bulk`). ``requests_per_s`` / ``points_per_s``: what
    all workers together may send to the destination. ``selection``: the runs (name pattern, tags, start date) and
    metrics (globs of the written names) to migrate (:class:`~trackbridge.read.selection.Selection`; default: all)."""
    if engine not in ENGINES:
        raise ValueError(f"migrate: unknown engine {engine!r} (expected one of: {', '.join(ENGINES)})")
    limiter = RateLimiter(requests_per_s, points_per_s)      # checks the numbers before anything is read
    t0 = time.monotonic()
    out = out or sys.stdout
    src_loc, dst_loc = _check_places(src, dst, source, names, mappings)
    found = open_runs(str(src_loc), allow_label=True, select=selection)  # as every command
    result = MigrationResult(destination=dst_loc.kind,
                             resolution=tuple(sink_class(dst_loc.kind).capabilities.resolution))
    if not found:
        return result
    if engine == "ray" and not dry_run:
        from .bulk import migrate_ray
        result.runs = migrate_ray(
            found, src=src, dst=dst, source=source, names=names, derive=derive, jobs=jobs, mappings=mappings,
            dest_missing=not _destination_exists(dst), state_root=state_dir(),
            prog=Progress(len(found), enabled=progress), run_one=_migrate_run, result=RunResult,
            requests_per_s=requests_per_s, points_per_s=points_per_s,
            address=ray_address, batch_runs=batch_runs)
        result.seconds = time.monotonic() - t0
        return result
    result.runs = _migrate_local(found, src, dst, source, names, derive, mappings, dry_run, jobs, progress, out,
                                 limiter)
    result.seconds = time.monotonic() - t0
    if result.runs and all(r.unreadable for r in result.runs):
        # the source yielded nothing readable at all: an error naming its file(s), as a file that is not what its
        # name says is (nothing was created in the destination: each run failed before its sink was opened)
        raise NothingReadable("; ".join(dict.fromkeys(r.unreadable or "" for r in result.runs)))
    return result


def _check_places(src: str, dst: str, source: str, names: str,
                  mappings: list[str] | None) -> tuple[Locator, Locator]:
    """Parse the source and the destination, and return both. Fails early, before anything is read, on a bad
    destination, an option its sink does not know, a place its tracker refuses, or a naming scheme that does not
    exist (``names``, and ``source`` when it names one)."""
    src_loc = parse(source_locator(src), allow_label=True, kinds=kinds("source"))
    dst_loc = parse(dst, kinds=kinds("sink"))    # fail early on a bad destination ...
    check_options(dst_loc)                       # ... on an option its sink does not know ...
    sink_class(dst_loc.kind).check_location(dst_loc.location)    # ... on a place its tracker refuses ...
    if names != "keep":                          # ... and on a naming scheme that does not exist
        from ..schema.loader import load_registry
        from ..schema.spec import parse_spec
        reg = load_registry(mappings or None)
        parse_spec(names, reg, allow_auto=False)
        if source not in ("auto", "keep"):
            parse_spec(source, reg)
    return src_loc, dst_loc


def _migrate_local(found: list[InputRun], src: str, dst: str, source: str, names: str, derive: bool,
                   mappings: list[str] | None, dry_run: bool, jobs: int, progress: bool, out: TextIO,
                   limiter: RateLimiter) -> list[RunResult]:
    """Migrate (or, with ``dry_run``, describe) the runs of the ``local`` engine, one after the other or ``jobs`` at
    a time in threads; returns their results, in the source's order. A run that fails gets a result with its error:
    it does not stop the others."""
    throttle = limiter.acquire if limiter.limited else None
    prog = Progress(len(found), enabled=progress and not dry_run)
    dest_missing = not _destination_exists(dst)        # checked once, before the first run recreates it

    def one(args: tuple[int, InputRun]) -> RunResult:
        """Migrate (or describe) one run; an error in it becomes its result's error."""
        idx, run = args
        try:
            if dry_run:
                return _dry_run(run, src, source, names, derive, mappings, out)
            return _migrate_run(idx, run, src, dst, source, names, derive, mappings, prog, dest_missing,
                                throttle=throttle)
        except Exception as exc:      # one run failing must not stop the others; reported in the summary
            res = RunResult(getattr(run.reader.info, "name", None) or str(idx), "",
                            error=f"{type(exc).__name__}: {exc}")
            res.problems = list(run.problems)
            return res

    items = list(enumerate(found))
    if jobs > 1 and len(items) > 1:
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            return list(pool.map(one, items))
    return [one(it) for it in items]


def _migrate_run(idx: int, run: InputRun, src: str, dst: str, source: str, names: str, derive: bool,
                 mappings: list[str] | None, prog: Progress, dest_missing: bool = False, *,
                 throttle: Throttle | None = None, plan: str | None = None,
                 state_root: Path | str | None = None) -> RunResult:
    """Migrate one run under its ledger's claim (see the module docstring). ``plan``: the id of the plan this
    attempt belongs to (``engine="ray"``): a run the ledger shows finished, or half done, by an earlier attempt of
    the same plan is reported with what that attempt wrote."""
    run_id = target_run_id(src, run.info, idx)
    ledger = Ledger(ledger_key(src, dst, names, run_id), state_root)
    with ledger.claim():
        return _migrate_claimed(idx, run, run_id, ledger, src, dst, source, names, derive, mappings, prog,
                                dest_missing, throttle or _no_throttle, plan)


def _no_throttle(requests: int, points: int) -> None:
    return None


def _migrate_claimed(idx: int, run: InputRun, run_id: str, ledger: Ledger, src: str, dst: str, source: str,
                     names: str, derive: bool, mappings: list[str] | None, prog: Progress, dest_missing: bool,
                     throttle: Throttle, plan: str | None) -> RunResult:
    """Migrate one run whose ledger claim this attempt holds, and return its result. A run the ledger shows complete
    is not written again; otherwise the destination run is opened at the first batch (or at the end, for an empty
    run) and the batches are written after what the ledger and the destination hold (:mod:`.resume`). The run is
    closed before its ledger says complete; on a failure an open run is closed and the error goes up."""
    reader = run.reader
    info = run.info          # the reader's, with the time-axis mark when the run has no wall times of its own
    label = info.name or info.run_id or f"run-{idx}"
    res = RunResult(label, run_id)
    same_plan = adopt_ledger(ledger, res, dest_missing, plan)
    if finished_before(ledger, res, same_plan):
        prog.run_done(label, res)
        return res
    pipe = run.pipeline(names, source=None if source == "auto" else source, mappings=mappings, derive=derive)
    sink = make_sink(dst)
    out_info = _out_info(info, label, run_id, src)
    no_time = not run.has_wall_time     # never make up a time axis: info says so (the next reader knows too)
    cur = Cursor.from_ledger(ledger)
    try:
        stream = pipe.process(_until_unreadable(run.records(), res))
        for batch in _batches(stream):
            if not cur.opened:
                open_sink(sink, pipe, out_info, cur, throttle)
                read_destination(sink, cur, res, same_plan)
            write_batch(batch, cur, sink, pipe, ledger, res, same_plan, throttle, prog)
        if not cur.opened and reader.gave_up:
            # nothing readable (binary junk, an empty file): no empty run in the destination, and the run fails
            res.error = "nothing readable (see above); no run created in the destination"
            res.stats = pipe.stats
            res.problems = list(reader.problems)
            prog.run_done(label, res)
            return res
        if not cur.opened:     # an empty run still gets created, with its config
            open_sink(sink, pipe, out_info, cur, throttle)
        pipe.finish_notes()
        # closed before the ledger says complete: a close flushes the destination and writes its final run info
        # (TensorBoard's trackbridge-run.json); a kill during it leaves the run incomplete, to be done again
        cur.opened = False
        sink.close()
        ledger.save(records_written=cur.seen, records_pending=0, source=pipe.stats.source, complete=True,
                    out_records=res.records, out_points=res.points, out_skipped=res.skipped_records,
                    **({"stats": asdict(pipe.stats)} if plan is not None else {}))
    finally:
        if cur.opened:
            sink.close()
    res.stats = pipe.stats
    res.problems = list(reader.problems)
    res.has_wall_time = not no_time
    prog.run_done(label, res)
    return res


def _out_info(info: RunInfo, label: str, run_id: str, src: str) -> RunInfo:
    """The run's info as the destination gets it: under its destination run id, with copies of the source's config,
    tags and extras, and tags saying where it was migrated from."""
    out_info = RunInfo(name=info.name or label, project=info.project, run_id=run_id, config=dict(info.config),
                       tags=dict(info.tags), source=info.source, extra=dict(info.extra),
                       approximate=dict(info.approximate or {}))
    out_info.tags.setdefault("trackbridge.migrated_from", src)
    if info.run_id:
        out_info.tags.setdefault("trackbridge.source_run_id", str(info.run_id))
    return out_info


def _until_unreadable(records: Iterable[Record], res: RunResult) -> Iterator[Record]:
    """The run's records; a run with nothing readable (:class:`~trackbridge.read.inputs.NothingReadable`) ends them,
    marked on its result, and fails below before its destination is opened."""
    try:
        yield from records
    except NothingReadable as exc:
        res.unreadable = str(exc)


def names_clash(dst: str, *, mappings: list[str] | None = None, look: int = 20) -> str | None:
    """Why ``migrate`` must be told ``--names`` before writing into ``dst``: the destination already holds runs (of
    the first ``look``) whose keys are a framework's own names, not canonical ones, so the default (canonical names)
    would put a second set of names beside theirs and break the dashboards built on them. None when ``dst`` is new,
    holds canonical runs, or cannot be read as a source (a server: nothing is refused on a guess)."""
    if not _destination_exists(dst):
        return None
    try:
        held = open_runs(dst)
    except Exception:       # noqa: BLE001 - a destination that cannot be read back: nothing to compare with
        return None
    for run in held[:look]:
        try:
            if run.info.names == "canonical":
                continue
            pipe = run.resolve(mappings=mappings)
        except Exception:   # noqa: BLE001 - one run that cannot be read says nothing of the others
            continue
        src = pipe.stats.source or ""
        if src and not src.startswith(("unknown", "canonical", "kept")):
            label = run.info.name or run.info.run_id or run.locator
            return (f"{dst} already holds runs under their framework's own names ({label}: {src.split(' (')[0]}); "
                    "the default --names canonical would write canonical names beside them and break dashboards "
                    "built on those: pass --names keep (or --names FRAMEWORK) to match them, or --names canonical "
                    "to write canonical names anyway")
    return None


def _destination_exists(dst: str) -> bool:
    """False when a destination on the local disk (a folder, or an SQLite file) no longer exists; True otherwise
    (including servers, which cannot be checked cheaply)."""
    loc = parse(dst)
    path = sink_class(loc.kind).local_path(loc.location)
    return True if path is None else path.exists()


def _dry_run(run: InputRun, src: str, source: str, names: str, derive: bool, mappings: list[str] | None,
            out: TextIO) -> RunResult:
    reader = run.reader
    info = run.info
    label = info.name or info.run_id or "run"
    pipe = run.pipeline(names, source=None if source == "auto" else source, mappings=mappings, derive=derive)
    res = RunResult(label, "(dry run)")
    originals: dict[str, None] = {}
    no_time = not run.has_wall_time
    stream = pipe.process(_remember(run.records(), originals))
    for rec in stream:
        res.records += 1
        res.points += len(rec.metrics)
    pipe.finish_notes()
    st = res.stats = pipe.stats
    res.problems = list(reader.problems)
    res.has_wall_time = not no_time
    out.write(f"run {label}: {res.records} records, {res.points} points would be written (source: {st.source})\n")
    for key in originals:
        new = st.renamed.get(key, key)
        if key in st.unmapped:
            status = "unmapped (kept as is)"
        elif key in st.conflicts:
            status = f"kept as is: {st.conflicts[key]} is taken by another key"
        else:
            status = "renamed" if new != key else "same name"
        approx = st.approximate.get(new)
        out.write(f"  {key:50s} -> {new:45s} {status}{'; approximate: ' + approx if approx else ''}\n")
    for d in st.derived:
        out.write(f"  {'(derived)':50s} -> {d}\n")
    return res


def _remember(records: Iterable[Record], keys: dict[str, None]) -> Iterable[Record]:
    for r in records:
        keys.update(dict.fromkeys(r.metrics))
        yield r


def summary(result: MigrationResult, *, dry_run: bool = False) -> str:
    tot = result.totals()
    runs = result.runs
    failed = [r for r in runs if r.error]
    # a run that failed is not counted as migrated: "Migrated: 11 run(s)" over eleven FAILED lines said the opposite
    counted = f"{len(runs) - len(failed)} of {len(runs)} run(s)" if failed else f"{len(runs)} run(s)"
    lines = [f"{'Dry run' if dry_run else 'Migrated'}: {counted}, "
             f"{sum(r.records for r in runs):,} records, {sum(r.points for r in runs):,} points "
             f"in {result.seconds:.1f} s"]
    if failed:
        names = ", ".join(r.source_name for r in failed[:10]) + (", ..." if len(failed) > 10 else "")
        lines.append(f"  FAILED: {len(failed)} run(s) ({names}), not migrated; each one's error is below")
    done = [r for r in runs if r.already_done]
    if done:
        lines.append(f"  already migrated earlier (not written again): {', '.join(r.source_name for r in done)}")
    skipped = sum(r.skipped_records for r in runs)
    if skipped:
        lines.append(f"  records already in the destination, skipped: {skipped:,}")
    lines.append(f"  keys renamed: {len(tot.renamed)}")
    unmapped = f": {', '.join(tot.unmapped)}" if tot.unmapped else ""
    lines.append(f"  unmapped (kept as is): {len(tot.unmapped)}{unmapped}")
    lines.append(f"  approximate: {len(tot.approximate)}")
    for k, why in tot.approximate.items():
        lines.append(f"    {k}: {why}")
    lines.append(f"  derived: {len(tot.derived)}" + (f": {', '.join(tot.derived)}" if tot.derived else ""))
    for r in runs:
        for key, (n, why, step) in r.left_out.items():
            lines.append(f"  left out by {result.destination or 'the destination'} in {r.source_name}: {key}, "
                         f"{n} point(s) from step {step} ({why})")
    if result.resolution and not dry_run:
        lines.append(f"  kept to {result.destination}'s resolution: {'; '.join(result.resolution)}")
    no_time = [r.source_name for r in runs if not r.has_wall_time]
    if no_time:
        lines.append(f"  time axis missing (the source holds no wall times; none were made up): {', '.join(no_time)}")
    for r in runs:
        for p in r.problems:
            lines.append(f"  skipped in {r.source_name}: {p}")
        if r.error:
            lines.append(f"  FAILED {r.source_name}: {r.error}")
    for n in tot.notes:
        lines.append(f"  note: {n}")
    return "\n".join(lines)
