"""``init`` / ``log`` / ``finish``: one canonical stream to several trackers at once, without blocking training.

Pipeline (one run)::

    run.log(dict)  ──►  inbox  ──►  dispatcher thread  ──►  spool queue  ──►  spool worker  ──►  spool file
     validate +                     translate (names in     (per sink,       (one thread      (always on)
     normalise values               -> canonical), derive,   bounded)         per sink,  ──►  tensorboard, mlflow,
     (caller's thread)              step, Record, rename                      batches)        wandb, trackio, ...
                                    for ``names=``

* ``log()`` only validates and normalises the values (so a tensor updated in place afterwards cannot change what was
  logged; CUDA tensors are copied on their stream and read back by a thread, without a GPU sync: :mod:`.device`)
  and hands them off; translation, derivation and every tracker's I/O happen in other threads. ``log()``
  never waits on a tracker: a tracker whose queue is full *falls behind* and is fed from the spool until it has
  caught up. Only the spool's queue makes the dispatcher wait (the disk, never a tracker).
* **The spool** (the canonical stream of :mod:`trackbridge.stream`, file ``DIR/<run_id>.jsonl`` in ``spool=DIR``)
  is always on: the run's durable copy and every tracker's catch-up source, never a tracker's only feed. Its worker
  writes a batch and hands it to the operating system at the latest ``flush_interval / 2`` seconds (on the monotonic
  clock) after the first record of the batch was logged, so a process killed with SIGKILL loses at most about
  ``flush_interval`` seconds of records (default 1.0 s; ``flush_interval=`` to change; the SIGKILL test checks the
  bound). A machine crash can lose more unless the spool is opened with ``?fsync=1`` (``spool="DIR?fsync=1"``). A
  batch the file cannot take (a full disk) is held in memory, in order, and written when it can be (``hold_mb``);
  a write cut short is taken back whole, so nothing is doubled or torn; a spool file deleted while the run writes it
  is written again from the file still open.
* **The run is claimed** in ``init`` (:mod:`.runlock`): a second process (or a second ``init`` here) logging the
  same run id fails at once, naming the holder.
* **Fault isolation**: a sink that raises in ``open`` or ``write`` is retried with exponential back-off
  (``retries`` attempts, starting at ``backoff`` seconds), then marked *failed* with a warning naming the sink and
  the error; the other sinks and the training loop carry on. A failed sink is tried again every
  ``retry_interval`` seconds and once more at ``finish()``; when it comes back it is reopened with
  ``resume=True`` and catches up from the spool (the records it missed, by sequence number; a write that may have
  landed in part is checked point by point against what the tracker holds), so nothing is lost or doubled.
  ``finish()`` waits while trackers make progress (per request), gives up on one that makes none for
  ``stall_timeout`` seconds, and writes what it lacks beside the spool (``<spool>.pending.json``) for
  ``trackbridge replay``.
* **Steps**: the explicit ``step=``, else the canonical ``progress/step`` in the logged dict, else an internal
  counter (one more than the highest step so far). Each record carries ``wall_time = time.time()`` of the
  ``log()`` call. What each tracker needs for non-monotonic steps is the sink's business.
* **Resume**: ``init(run_id=..., resume=True)`` reads the spool, opens every sink with ``resume=True``, gives each
  tracker the points of the spool it does not hold (per key and step) and continues the step counter after the
  highest step the spool or any tracker holds (waiting ``resume_wait`` seconds at most for the trackers).
* **Ranks**: only global rank 0 (``RANK``, then ``LOCAL_RANK``, ...) writes unless ``rank_zero_only=False``; other
  ranks get a run whose ``log()`` validates and returns.

This package names no tracker and no framework: sinks come from :mod:`trackbridge.trackers`, translation from
:mod:`trackbridge.translate`, derivation from :mod:`trackbridge.derive`.

The logger's parts (one module each): :mod:`.options` (the tuning knobs), :mod:`.dispatch` (the thread between
``log()`` and the sinks), :mod:`.worker` (what every sink's thread shares), :mod:`.spool` and :mod:`.tracker` (the
two kinds of worker), :mod:`.run` (``Run``), :mod:`.noop` (``NoOpRun``), :mod:`.checks` (what ``init`` checks first),
:mod:`.device` (tensors read in one batch, CUDA ones without a sync), :mod:`.ranks` (``merge_ranks``: each rank's
file and rank 0's merger), :mod:`.runlock` (one process per run), :mod:`.waiting` (waiting for trackers at the end),
:mod:`.exits` (how the process is ending), and for the writer process :mod:`.writer` (the child), :mod:`.remote` (the
parent's side) and :mod:`.feed` (what the child is sent). Catching a tracker up from the spool uses
:mod:`trackbridge.sync.catchup`, as ``replay`` and ``migrate`` do.
"""
from __future__ import annotations

import time
import uuid
from typing import Any

from ..limits import check_config
from ..record import rank as _rank
from .common import STEP_AXIS, LoggerWarning
from .noop import NoOpRun
from .options import LoggerOptions
from .run import Run


def init(project: str | None = None, name: str | None = None, sinks: list[Any] | None = None, *,
         source: str = "auto", names: str = "canonical", config: dict[str, Any] | None = None,
         run_id: str | None = None, resume: bool = False, mappings: list[str] | None = None, spool: str = "runs",
         tags: dict[str, str] | None = None, doctor: bool = False, stop_on: str | None = None,
         merge_ranks: bool = False, options: LoggerOptions | None = None) -> Run | NoOpRun:
    """Start a run that writes one canonical stream to every sink (see the module docstring for the behaviour).

    ``sinks``: locator strings (``"tensorboard:runs/tb"``, ``"mlflow:sqlite:///runs/mlflow.db"``, ...) or Sink
    objects; the JSONL spool in ``spool`` is always added. ``source``: naming of what the trainer logs (``auto``,
    ``canonical`` or ``FRAMEWORK[@VERSION]``); ``names``: naming written to the trackers (``canonical`` or
    ``FRAMEWORK[@VERSION]``; the spool always holds canonical names, and ``keep`` keeps those: to write the names
    the trainer logs, pass its framework, ``names=source``). ``options``: the tuning knobs
    and overrides (:class:`LoggerOptions`: flush interval, queue and batch sizes, retries, timeouts, the writer
    process, derived metrics, the rank and world size, ``on_finding``). ``doctor``: run the
    diagnostic checks (:mod:`trackbridge.doctor`) on the records as they are logged, in the dispatcher thread (off
    the caller's: ``log()`` stays as fast, ``benchmarks/bench_doctor_live.py``); a finding is logged once, the first
    time its check holds, as the text metric ``doctor/<check id>`` to every tracker (and as the tracker's own alert
    where it has them: wandb's ``run.alert``, Trackio's alerts), and said at the next ``log()`` (or ``finish()``) in
    the caller's thread: a :class:`~trackbridge.doctor.DoctorWarning` attributed to the user's line that called it,
    and ``options.on_finding(finding)`` when given (a :class:`~trackbridge.doctor.Finding`; ``run.findings`` lists them
    all). ``stop_on="critical"`` (or ``"warning"``, ``"info"``): ``run.should_stop`` turns true as soon as a finding
    at least that severe holds (training stops itself: ``if run.should_stop: break``; the transformers callback
    stops the Trainer). Both need ``doctor=True``.

    ``merge_ranks=True``: every rank logs its own share of a value with its weight (``log(..., weights=...)`` or
    :class:`trackbridge.Weighted`) and rank 0 merges the shares of all ``options.world_size`` ranks (default
    ``WORLD_SIZE``) into the value over the whole batch, by the value's reduction, before the pipeline (see
    :mod:`trackbridge.logger.ranks`; ``run_id`` the same on every rank; a rank silent for ``options.rank_timeout``
    while the others are past a step is merged without, and the run says so).

    Raises ``ValueError`` naming the sink for a sink string that is unknown or points at an unusable folder, and
    :class:`~trackbridge.errors.ConfigTooLarge` (a ``ValueError``) for a config beyond :mod:`trackbridge.limits`
    (more than 10,000 keys, a value over 1 MB, over 10 MB in all), before anything is written.
    """
    check_config(config)        # every rank alike, before anything is claimed, opened or written (..limits)
    opts = options if options is not None else LoggerOptions()
    r = _rank.global_rank() if opts.rank is None else int(opts.rank)
    common: dict[str, Any] = dict(project=project, name=name, source=source, names=names, config=config,
                                  resume=resume, derive=opts.derive, mappings=mappings, options=opts, tags=tags,
                                  doctor=doctor, on_finding=opts.on_finding, stop_on=stop_on)
    if merge_ranks:
        return _merged(r, run_id=run_id, spool=spool, sinks=list(sinks or []), **common)
    if opts.rank_zero_only and r != 0:
        from .dispatch import live_options
        live_options(doctor, opts.on_finding, stop_on)     # refused on every rank alike
        return NoOpRun(r, project=project, name=name, config=config, run_id=run_id, names=names, resume=resume,
                       options=opts)
    if not opts.rank_zero_only and _rank.world_size() > 1 and run_id is None:
        run_id = time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6] + f"-rank{r}"
    return Run(sinks=list(sinks or []), run_id=run_id, spool=spool, **common)


def _merged(r: int, *, run_id: str | None, spool: str, **kw: Any) -> Run | NoOpRun:
    """``init(merge_ranks=True)``: rank 0's run with the merger attached; the other ranks' :class:`RankRun`."""
    from ..errors import UsageError
    from .rankfile import shared_run_id
    from .rankrun import RankLink, RankRun, check_world
    from .spool import spool_place
    options: LoggerOptions = kw["options"]
    if not options.rank_zero_only:
        raise UsageError("init(merge_ranks=True) merges every rank into rank 0's run; rank_zero_only=False (a run "
                         "per rank) cannot be combined with it")
    size = _rank.world_size() if options.world_size is None else int(options.world_size)
    rank_timeout = options.rank_timeout
    check_world(size, r, rank_timeout)
    run_id = shared_run_id(run_id)
    spool_dir = spool_place(spool)[0]
    if r != 0:
        return RankRun(r, world_size=size, run_id=run_id, spool_dir=spool_dir, flush_interval=options.flush_interval,
                       rank_timeout=rank_timeout,
                       project=kw["project"], name=kw["name"], config=kw["config"], names=kw["names"],
                       resume=kw["resume"], options=options)
    run = Run(run_id=run_id, spool=spool, **kw)
    run._ranks = RankLink(run, world_size=size, rank_timeout=rank_timeout, spool_dir=spool_dir)
    return run


__all__ = ["init", "Run", "NoOpRun", "LoggerOptions", "LoggerWarning", "STEP_AXIS"]
