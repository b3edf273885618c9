"""Bulk migration on Ray: ``trackbridge migrate --engine ray SRC DST`` (``migrate(..., engine="ray")``).

Teams move thousands of runs at once; Ray is already in most RL stacks, so the runs are spread over a Ray cluster
instead of a home-made pool. Needs the ``[ray]`` extra; nothing else in trackbridge imports Ray.

1. **Plan**: the driver lists the source's runs once and writes a manifest (:class:`Manifest`, a JSON file under
   ``$TRACKBRIDGE_STATE_DIR/migrations/plans/``): for each run its position, name and run id, the id it gets in the
   destination and its ledger key, and the batches. A migration started again on the same source, destination and
   naming continues the same plan (same plan id) until the plan is complete, so its summary counts the whole plan.
2. **Tasks**: each batch of runs (``batch_runs``, default about four batches per worker, at most 20 runs) is one Ray
   task. A task opens the source itself, finds its runs (by position, checked against the planned destination id;
   by that id among all runs when the source moved), and migrates them one after the other exactly as the local
   engine does (:func:`.migration._migrate_run`): through the one pipeline, under the run's ledger claim,
   recording progress in the ledger after every batch of records.
3. **Idempotent and retried**: Ray retries a task whose worker died (``max_retries``). The retry finds each run's
   ledger: a run finished by the earlier attempt is reported with what that attempt wrote, a run cut off halfway
   continues after its last recorded batch, and a batch that was in flight is checked against what the destination
   holds, per key and step (:func:`trackbridge.sync.catchup.lacking`). Two attempts at one run never overlap: the
   ledger's claim (an ``flock`` the kernel releases when a worker dies) makes a second attempt wait, and sinks create a
   run's file or folder with its whole header at once, so a killed attempt never leaves half a header that the next one
   would take for another run. A task that fails even after its retries fails only its unfinished runs; running the
   command again resumes them.
4. **One rate limit per destination server**: with ``requests_per_s`` / ``points_per_s``, every task books its writes
   with one Ray actor (:class:`.ratelimit.RateLimiter` inside, named after the destination's server or
   path in the ``trackbridge`` namespace, so several migrations into one server on one cluster share it while they
   run), then sleeps in its own process; the actor is restarted if it dies (its bucket starts afresh).

Where the ledger lives: the driver's state folder, passed to every task. On one machine that is enough; on a cluster
of several machines put it on a shared file system (``TRACKBRIDGE_STATE_DIR``) so that every node sees the same
ledger and claims, and give the source and destination as absolute paths on a shared file system, or as servers. A
node that cannot see the ledger still writes nothing twice into a destination that can say what it holds (every
tracker here can), but it starts each run it retries from the first record.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from ..errors import UsageError
from ..read.inputs import InputRun, open_runs
from ..trackers import kinds, sink_class, source_locator
from ..tracking.locators import parse
from .ledger import Ledger, ledger_key, target_run_id
from .ratelimit import RateLimiter

if TYPE_CHECKING:       # pragma: no cover
    from .migration import Progress, RunResult

MAX_BATCH_RUNS = 20
MAX_RETRIES = 5          # Ray retries of a task whose worker died
NAMESPACE = "trackbridge"


# ------------------------------------------------------------------------------------------------- the plan
@dataclass
class PlannedRun:
    index: int               # position in the source's listing when planned
    name: str
    target_run_id: str       # the run's id in the destination (target_run_id)
    ledger: str              # its ledger key


@dataclass
class Manifest:
    """The runs of one bulk migration and how they are batched; one JSON file per (source, destination, names)."""

    plan: str
    src: str
    dst: str
    names: str
    runs: list[PlannedRun] = field(default_factory=list)
    batches: list[list[int]] = field(default_factory=list)      # positions in ``runs``
    created: float = 0.0
    complete: bool = False

    @staticmethod
    def path_for(src: str, dst: str, names: str, root: Path) -> Path:
        key = hashlib.sha1(f"plan\0{src}\0{dst}\0{names}".encode()).hexdigest()[:24]
        return root / "migrations" / "plans" / f"{key}.json"

    def save(self, root: Path) -> None:
        path = self.path_for(self.src, self.dst, self.names, root)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(asdict(self)))
        os.replace(tmp, path)

    @classmethod
    def load(cls, src: str, dst: str, names: str, root: Path) -> "Manifest | None":
        path = cls.path_for(src, dst, names, root)
        try:
            obj = json.loads(path.read_text())
            obj["runs"] = [PlannedRun(**r) for r in obj.get("runs", [])]
            return cls(**obj)
        except (OSError, ValueError, TypeError):
            return None


def plan_runs(src: str, dst: str, names: str, runs: list[InputRun], *, workers: int, batch_runs: int | None,
              root: Path) -> tuple[Manifest, bool]:
    """The manifest for ``runs``: the unfinished plan of the same migration when there is one (its id kept, runs
    that appeared since added), else a new one. Returns ``(manifest, continued)``."""
    planned = []
    for idx, run in enumerate(runs):
        rid = target_run_id(src, run.info, idx)
        planned.append(PlannedRun(idx, run.info.name or run.info.run_id or f"run-{idx}", rid,
                                  ledger_key(src, dst, names, rid)))
    old = Manifest.load(src, dst, names, root)
    continued = old is not None and not old.complete
    plan = old.plan if continued and old is not None else uuid.uuid4().hex[:12]
    n = len(planned)
    size = max(1, batch_runs) if batch_runs else max(1, min(MAX_BATCH_RUNS, math.ceil(n / max(1, 4 * workers))))
    batches = [list(range(i, min(n, i + size))) for i in range(0, n, size)]
    man = Manifest(plan=plan, src=src, dst=dst, names=names, runs=planned, batches=batches,
                   created=old.created if continued and old is not None else time.time())
    man.save(root)
    return man, continued


# ------------------------------------------------------------------------------------------------- the tasks
@dataclass
class TaskContext:
    """What every task needs (pickled once per task: small)."""

    src: str
    dst: str
    source: str
    names: str
    derive: bool
    mappings: list[str] | None
    dest_missing: bool
    plan: str
    state_root: str
    cwd: str
    run_one: Callable[..., Any]          # migration._migrate_run (passed in: this module is below it)
    result: Callable[..., Any]           # trackbridge.migrate.RunResult
    progress: Callable[..., Any]         # trackbridge.migrate.Progress (each task makes a silent one)
    limiter: Any = None                  # the limiter actor's handle, or None
    local_rate: tuple[float | None, float | None] = (None, None)    # per-task share if the actor is gone
    metrics: tuple[str, ...] = ()        # the selection's metric globs (a worker opens the runs again: unselected)


def run_batch(ctx: TaskContext, entries: list[PlannedRun]) -> list["RunResult"]:
    """One Ray task: migrate ``entries`` one after the other (see the module docstring). Each run's failure is its
    result's ``error``; only the worker dying fails the task (Ray then retries it)."""
    if ctx.cwd and os.path.isdir(ctx.cwd) and os.getcwd() != ctx.cwd:
        os.chdir(ctx.cwd)                # relative locators mean what they meant to the driver (same machine)
    throttle = _throttle(ctx)
    out: list[RunResult] = []
    try:
        runs = open_runs(source_locator(ctx.src), allow_label=True)
    except Exception as exc:             # the source cannot be opened here: every run of the batch fails
        return [ctx.result(e.name, e.target_run_id, error=f"cannot open the source here: {type(exc).__name__}: "
                                                         f"{exc}") for e in entries]
    by_id: dict[str, tuple[int, InputRun]] | None = None
    quiet = ctx.progress(0, enabled=False)
    for e in entries:
        found: tuple[int, InputRun] | None = None
        if e.index < len(runs) and target_run_id(ctx.src, runs[e.index].info, e.index) == e.target_run_id:
            found = (e.index, runs[e.index])
        else:                            # the source's listing moved since the plan: look the run up by its id
            if by_id is None:
                by_id = {target_run_id(ctx.src, r.info, i): (i, r) for i, r in enumerate(runs)}
            found = by_id.get(e.target_run_id)
        if found is None:
            out.append(ctx.result(e.name, e.target_run_id, error="the run is no longer in the source"))
            continue
        idx, run = found
        run.metrics = list(ctx.metrics)      # what the driver's selection handed each run it opened
        try:
            out.append(ctx.run_one(idx, run, ctx.src, ctx.dst, ctx.source, ctx.names, ctx.derive, ctx.mappings,
                                   quiet, ctx.dest_missing, throttle=throttle, plan=ctx.plan,
                                   state_root=ctx.state_root))
        except Exception as exc:          # one run failing must not stop the others; reported in the summary
            res = ctx.result(e.name, e.target_run_id, error=f"{type(exc).__name__}: {exc}")
            res.problems = list(run.problems)
            out.append(res)
    return out


def _throttle(ctx: TaskContext) -> Any:
    if ctx.limiter is None:
        return None
    import ray
    local = RateLimiter(*ctx.local_rate)
    handle = [ctx.limiter]

    def throttle(requests: int, points: int) -> None:
        if handle[0] is not None:
            try:
                delay = ray.get(handle[0].reserve.remote(requests, points))
                if delay > 0:
                    time.sleep(delay)
                return
            except Exception:            # the actor is gone for good (its owner ended): this task's share
                handle[0] = None
        local.acquire(requests, points)
    return throttle


class LimiterActor:
    """The rate limiter as a Ray actor (one per destination server): tasks book with :meth:`reserve`."""

    def __init__(self, requests_per_s: float | None, points_per_s: float | None) -> None:
        self.limiter = RateLimiter(requests_per_s, points_per_s)
        self.users = 0

    def join(self) -> tuple[float | None, float | None]:
        """A migration starts using this limiter; returns the limits in force (the first migration's)."""
        self.users += 1
        return self.limiter.requests_per_s, self.limiter.points_per_s

    def leave(self) -> int:
        """A migration is done with it; returns how many still use it (0: the caller ends the actor)."""
        self.users = max(0, self.users - 1)
        return self.users

    def reserve(self, requests: int, points: int) -> float:
        return self.limiter.reserve(requests, points)

    def history(self) -> list[tuple[float, int, int]]:
        return self.limiter.history()


def limiter_name(dst: str) -> str:
    """The destination's server (``scheme://host:port``) or local path: one limiter each."""
    loc = parse(dst, kinds=kinds("sink"))
    path = sink_class(loc.kind).local_path(loc.location)
    if path is not None:
        key = f"{loc.kind}:{path.resolve()}"
    else:
        from urllib.parse import urlsplit
        parts = urlsplit(loc.location)
        server = f"{parts.scheme}://{parts.hostname}:{parts.port or ''}"
        key = server if parts.hostname else f"{loc.kind}:{loc.location}"
    return "trackbridge-limiter-" + hashlib.sha1(key.encode()).hexdigest()[:16]


# ------------------------------------------------------------------------------------------------- the driver
def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise UsageError("migrate --engine ray needs Ray, which is not installed: pip install 'trackbridge[ray]'") \
            from None
    return ray


def migrate_ray(runs: list[InputRun], *, src: str, dst: str, source: str, names: str, derive: bool, jobs: int,
                mappings: list[str] | None, dest_missing: bool, state_root: Path, prog: "Progress",
                run_one: Callable[..., Any], result: Callable[..., Any],
                requests_per_s: float | None = None, points_per_s: float | None = None, address: str | None = None,
                batch_runs: int | None = None, max_retries: int = MAX_RETRIES) -> list["RunResult"]:
    """The Ray engine of :func:`.migrate`, which checks the arguments, lists ``runs`` and passes
    its own per-run function (``run_one``), result type and progress line. ``address``: the cluster (``auto``,
    ``HOST:PORT``, ``ray://...``); default: the one this process is connected to, else ``RAY_ADDRESS``, else a new
    local cluster (of ``jobs`` CPUs when ``jobs`` > 1), shut down at the end. ``jobs``: tasks in flight at most
    (default: as many as the cluster runs at once). Returns one result per run, in the source's order."""
    ray = _ray()
    started = False
    loopback: Callable[[], None] | None = None
    if not ray.is_initialized():
        kw: dict[str, Any] = {"address": address, "namespace": NAMESPACE, "log_to_driver": False,
                              "include_dashboard": False}
        if address is None and not os.environ.get("RAY_ADDRESS"):
            if jobs > 1:
                kw["num_cpus"] = jobs
            kw["_node_ip_address"] = "127.0.0.1"
            loopback = loopback_only()          # a cluster trackbridge starts: reachable from this machine only
        try:
            ray.init(**kw)
        except BaseException:
            if loopback is not None:
                loopback()
            raise
        started = True
    limiter = None
    try:
        workers = max(1, int(ray.cluster_resources().get("CPU", 1)))
        in_flight = jobs if jobs > 1 else workers
        man, continued = plan_runs(src, dst, names, runs, workers=in_flight, batch_runs=batch_runs,
                                   root=state_root)
        if continued:
            _say(prog.enabled, f"continuing plan {man.plan} ({len(man.runs)} runs)")
        if requests_per_s is not None or points_per_s is not None:
            actor = ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=-1)(LimiterActor)
            limiter = actor.options(name=limiter_name(dst), namespace=NAMESPACE, get_if_exists=True).remote(
                requests_per_s, points_per_s)
            in_force = tuple(ray.get(limiter.join.remote()))
            if in_force != (requests_per_s, points_per_s):
                _say(prog.enabled, f"another migration into this destination set its rate limit first: "
                                   f"{in_force[0]} requests/s, {in_force[1]} points/s, shared by both")
        share = (None if requests_per_s is None else requests_per_s / in_flight,
                 None if points_per_s is None else points_per_s / in_flight)
        ctx = TaskContext(src=src, dst=dst, source=source, names=names, derive=derive, mappings=mappings,
                          dest_missing=dest_missing, plan=man.plan, state_root=str(state_root), cwd=os.getcwd(),
                          run_one=run_one, result=result, progress=type(prog), limiter=limiter, local_rate=share,
                          metrics=tuple(runs[0].metrics) if runs else ())
        task = ray.remote(num_cpus=1, max_retries=max_retries, retry_exceptions=False)(run_batch)
        ctx_ref = ray.put(ctx)
        by_batch: dict[Any, list[PlannedRun]] = {}
        done: dict[str, Any] = {}
        todo = list(man.batches)
        while todo or by_batch:
            while todo and len(by_batch) < in_flight:
                entries = [man.runs[i] for i in todo.pop(0)]
                by_batch[task.remote(ctx_ref, entries)] = entries
            ready, _ = ray.wait(list(by_batch), num_returns=1)
            for ref in ready:
                entries = by_batch.pop(ref)
                try:
                    got = ray.get(ref)
                except Exception as exc:   # the task failed even after its retries: its unfinished runs fail
                    got = [_from_ledger(e, man.plan, state_root, exc, result) for e in entries]
                for r in got:
                    done[r.target_run_id] = r
                    prog.add(r.points)
                    prog.run_done(r.source_name, r)
        out = [done.get(e.target_run_id) or result(e.name, e.target_run_id, error="not migrated")
               for e in man.runs]
        if all(r.error is None for r in out):
            man.complete = True
            man.save(state_root)
        return out
    finally:
        if limiter is not None:
            try:
                if ray.get(limiter.leave.remote()) == 0:
                    ray.kill(limiter)
            except Exception:
                pass
        if started:
            ray.shutdown()
        if loopback is not None:
            loopback()


#: Ray's switch for a single-machine cluster (its ``ray_constants.ENABLE_RAY_CLUSTER``, read from this variable)
LOCAL_ONLY_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def loopback_only() -> Callable[[], None]:
    """Make the local cluster about to be started listen on 127.0.0.1 only; returns what undoes it.

    Given ``_node_ip_address="127.0.0.1"`` alone, Ray (2.x on Linux) still binds its GCS server, raylet, workers
    and the driver's core worker to every interface (``::``) and its runtime-env agent to the machine's address.
    What makes every one of them bind loopback is Ray's single-machine mode: ``ENABLE_RAY_CLUSTER`` false
    (``ray/_private/ray_constants.py``, from ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER``; the default on Windows and
    macOS, where ``services.get_node_ip_address`` then answers ``get_localhost_ip()``). The variable is set for the
    processes the cluster starts, and the constant for this one (Ray read it when it was imported); both are put
    back when the cluster is shut down. Checked by listing the cluster's sockets
    (``tests/trackers/test_ray_loopback.py``)."""
    before = os.environ.get(LOCAL_ONLY_ENV)
    os.environ[LOCAL_ONLY_ENV] = "0"
    constants: Any = None
    old_constant = None
    try:
        import ray._private.ray_constants as constants
        old_constant = getattr(constants, "ENABLE_RAY_CLUSTER", None)
        constants.ENABLE_RAY_CLUSTER = False
    except (ImportError, AttributeError):      # another Ray layout: the variable alone
        constants = None

    def undo() -> None:
        if before is None:
            os.environ.pop(LOCAL_ONLY_ENV, None)
        else:
            os.environ[LOCAL_ONLY_ENV] = before
        if constants is not None and old_constant is not None:
            constants.ENABLE_RAY_CLUSTER = old_constant
    return undo


def _say(enabled: bool, text: str) -> None:
    if enabled:
        import sys
        sys.stderr.write(f"trackbridge migrate: {text}\n")


def _from_ledger(entry: PlannedRun, plan: str, root: Path, exc: BaseException,
                 result: Callable[..., Any]) -> "RunResult":
    """A run of a task that failed for good: finished, if its ledger says this plan finished it; else failed."""
    from ..pipeline import Stats
    ledger = Ledger(entry.ledger, root)
    res = result(entry.name, entry.target_run_id)
    if ledger.complete and ledger.data.get("plan") == plan:
        res.finished_earlier = True
        res.records = int(ledger.data.get("out_records", 0))
        res.points = int(ledger.data.get("out_points", 0))
        res.skipped_records = int(ledger.data.get("out_skipped", 0))
        stats = ledger.data.get("stats")
        res.stats = Stats(**stats) if isinstance(stats, dict) else Stats()
        res.stats.source = ledger.data.get("source", "")
        return res
    res.error = (f"the task migrating it failed ({type(exc).__name__}: {str(exc).splitlines()[0][:200]}); "
                 f"run the command again to resume it")
    return res


__all__ = ["Manifest", "PlannedRun", "TaskContext", "LimiterActor", "limiter_name", "migrate_ray", "plan_runs",
           "run_batch"]
