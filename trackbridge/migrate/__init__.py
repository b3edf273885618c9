"""Migration (``trackbridge migrate``): every run of a source into a destination tracker, names translated on the
way, idempotent and resumable.

* :mod:`.migration`: readers -> pipeline -> sinks, in batches, one run under its ledger's claim at a time (the
  ``local`` engine, ``jobs`` runs at once in threads);
* :mod:`.resume`: a run picked up where its ledger says it got to, and each batch written under it;
* :mod:`.ledger`: what each destination run holds and who is writing it (a second attempt waits, then continues);
* :mod:`.bulk`: the ``ray`` engine (a manifest, batches of runs as Ray tasks, the ``[ray]`` extra);
* :mod:`.ratelimit`: the request and point budgets every worker together keeps to.
"""
from __future__ import annotations

from .ledger import state_dir, target_run_id
from .migration import MigrationResult, Progress, RunResult, migrate, names_clash, summary

__all__ = ["migrate", "summary", "names_clash", "MigrationResult", "RunResult", "Progress", "target_run_id",
           "state_dir"]
