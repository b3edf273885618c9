"""Fingerprint proof of mappings/trl.yaml's LD-DPO entries (DPOTrainer with ld_alpha set: logps/chosen,
logps/rejected; issue 33 item 1). The installed TRL (1.16.0) trains a tiny model on CPU as in
tests/frameworks/test_proof_trl_dpo_rloo.py (7 pairs, micro-batches of 2 and 1, logging_steps 3, 9 steps), with
ld_alpha 0.5: ``_compute_loss`` sums each completion's log-probs over the tokens it shares in length with the other
completion of its pair, plus ld_alpha times the sum over the rest (its ``shared_mask`` and ``tail_mask``). The batch
gives each completion token its term as TRL weighed it, and the plain sum over the completion is checked to be
another number (the entry's deviation).
"""
from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from pathlib import Path

import pytest

pytest.importorskip("trl")
pytest.importorskip("datasets")

from _support import fingerprint as FP  # noqa: E402
from _support.proofs_trl import TRLRun, run_dpo  # noqa: E402
from _support.proven import close, proof  # noqa: E402

RELEASE = "1.16.0"
WINDOWS = ("mean", "last", "sum", "none")
DPO = dict(per_device_train_batch_size=2, gradient_accumulation_steps=2, logging_steps=3, max_steps=9, beta=0.1,
           ld_alpha=0.5)
CONFIG = {k: DPO[k] for k in ("gradient_accumulation_steps", "logging_steps", "beta", "ld_alpha")}
N_PAIRS = 7
FN = "_compute_loss"

_WORK = Path(tempfile.mkdtemp(prefix="trl-pref-proofs-"))
atexit.register(shutil.rmtree, _WORK, True)


@functools.lru_cache(maxsize=None)
def _dpo_ld() -> TRLRun:
    return run_dpo(_WORK / "dpo-ld", n_pairs=N_PAIRS, **DPO)


def _obs(run: TRLRun, key: str, values) -> list:
    out = [(row[key], run.steps(i, FN, values)) for i, (_s, row) in enumerate(run.train_rows()) if key in row]
    assert out, f"no train row logged {key!r}"
    return out


def _terms(first: bool, weighted: bool = True):
    """The chosen (first half) or rejected completions' per-token log-probs at their completion tokens, each weighted
    as TRL summed it (1 on the shared length, ld_alpha on the tail), or unweighted."""
    def values(loc):
        x = loc["per_token_logps"].detach().float()
        m = loc["shift_completion_mask"].bool()
        w = loc["shared_mask"].float() + loc["self"].ld_alpha * loc["tail_mask"].float() if weighted else m.float()
        n = x.shape[0] // 2
        rows = range(n) if first else range(n, 2 * n)
        return [[float(v) for v in (x[i] * w[i])[m[i]]] for i in rows]
    return values


@proof("trl", trainer="dpo", release=RELEASE, config=CONFIG)
def test_ld_dpo_logps_sum_the_weighted_completion_tokens(p):
    """logps/chosen, logps/rejected with ld_alpha: the pair-length-weighted completion sums, the mean over the
    micro-batch's pairs gathered from every process, averaged over the row's micro-batches."""
    run = _dpo_ld()
    calls = [c for c in run.calls if c.name == FN]
    p.check(all(c.locals["self"].ld_alpha == DPO["ld_alpha"] for c in calls), "ld_alpha set")
    p.check(any(bool(c.locals["tail_mask"].any()) for c in calls), "some completion longer than its pair's other")
    for c in calls:             # the weighted terms sum to the log-probs TRL reduced
        got = [sum(s) for s in _terms(True)(c.locals)]
        p.check(all(close(a, float(b), 1e-4) for a, b in zip(got, c.locals["chosen_logps"])), (got, "chosen_logps"))
    for key, first in (("logps/chosen", True), ("logps/rejected", False)):
        found = p.assert_stated(key, _obs(run, key, _terms(first)),
                                tokens=("seq_mean_token_sum", "token_mean", "seq_mean_token_mean"), mini=("none",),
                                window=WINDOWS, levels=("micro_batches", "window"), rel=1e-5)
        plain = _obs(run, key, _terms(first, weighted=False))
        p.check(any(not close(v, FP.value_of(b, found), 1e-4) for v, b in plain),
                f"{key}: the unweighted completion sum is another number (LD-DPO's deviation)")
