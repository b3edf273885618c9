"""``--into SINK``: every compared run, under canonical names, into one tracker (one run per input run).

One TensorBoard folder (a sub-folder per run), one MLflow experiment, one wandb or Trackio project: users compare
the runs in the tracker they already use. Each run is written under a run id derived from its locator and label and
reopened with ``resume``: writing the same comparison again writes only what the tracker lacks
(:mod:`trackbridge.sync.catchup`, as the logger, ``replay`` and ``migrate`` do).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

from ..record import RunInfo
from .load import LoadedRun

DEFAULT_PROJECT = "trackbridge-compare"
BATCH = 500


@dataclass
class IntoResult:
    """What ``--into`` wrote for one compared run: its run id in the tracker, records written and skipped."""

    label: str
    run_id: str
    records: int = 0
    skipped: int = 0


def write_into(runs: list[LoadedRun], into: str, *, project: str = DEFAULT_PROJECT) -> list[IntoResult]:
    """Write every run, under canonical names, into the tracker locator ``into`` (see the module docstring)."""
    from ..sync.catchup import catch_up
    from ..trackers import make_sink

    results: list[IntoResult] = []
    for run in runs:
        run_id = "cmp-" + hashlib.sha1(f"{run.locator}\0{run.label}".encode()).hexdigest()[:16]
        info = RunInfo(name=run.label, project=project, run_id=run_id,
                       config=dict(run.info.config), tags=dict(run.info.tags), source=run.source,
                       names="canonical", approximate=dict(run.approximate), extra=dict(run.info.extra))
        info.tags.setdefault("trackbridge.compared_from", run.locator)
        info.tags.setdefault("trackbridge.source", run.source)
        sink = make_sink(into)
        res = IntoResult(run.label, run_id)
        sink.open(info, resume=True)
        try:
            done = catch_up(sink, iter(run.records), batch_size=BATCH)    # what the tracker lacks, per key and step
            res.records, res.skipped = done.written, done.skipped
        finally:
            sink.close()
        results.append(res)
    return results
