"""Fingerprint proofs of the Trainer summaries every TRL trainer logs (mappings/trl.yaml: train_runtime,
train_samples_per_second, train_steps_per_second, train_loss, total_flos at the end of train(); runtime,
samples_per_second, steps_per_second of evaluate(), logged as eval_*), which the real-log corpus hits in most TRL
logs. TRL's SFTTrainer (the installed 1.16.0) trains the tiny model on CPU and evaluates it; transformers' own code
computes every value, under a stand-in clock that advances by a fixed step at each reading
(tests/_support/proofs_trl_summary.py), so the runtimes are the same numbers in every process.

Each is one number per run (``reduce: {stat: value}``): fingerprinted as the one value it is (sign and scale), and
checked against what it would be if it meant something else: the last logging window's time instead of the whole
train(), the samples actually seen instead of the ones the schedule counts, the mean of the logged rows' losses
instead of the mean over every optimizer step, one micro-batch's FLOPs instead of the run's.

The run: 7 examples, per_device_train_batch_size 2, gradient_accumulation_steps 2, logging_steps 3, max_steps 7
(rows after steps 3 and 6; the 7th step is logged by no row, only counted in train_loss; an epoch's last
micro-batch holds one example), each optimizer step a different time on the stand-in clock; then 5 evaluation
examples in batches of 2 (the last holds one).
"""
from __future__ import annotations

import functools
import math
import statistics
import tempfile
from pathlib import Path

import pytest

pytest.importorskip("trl")
pytest.importorskip("datasets")

from _support.proven import close, proof  # noqa: E402

RELEASE = "1.16.0"
RUN = dict(per_device_train_batch_size=2, per_device_eval_batch_size=2, gradient_accumulation_steps=2,
           logging_steps=3, max_steps=7)
N_TRAIN, N_EVAL = 7, 5
CONFIG = {k: RUN[k] for k in ("gradient_accumulation_steps", "logging_steps", "max_steps")}
#: speed_metrics rounds the rates to 3 places (transformers/trainer_utils.py): rates of about 2 are that close
RATE_REL = 1e-3


@functools.lru_cache(maxsize=None)
def _run():
    from _support.proofs_trl_summary import run_summary
    with tempfile.TemporaryDirectory() as tmp:
        return run_summary(Path(tmp), n_examples=N_TRAIN, n_eval=N_EVAL, **RUN)


def one(v: float) -> list:
    return [[[[[[float(v)]]]]]]


@proof("trl", trainer="sft", release=RELEASE, config=CONFIG)
def test_train_summary_is_the_whole_run(p):
    """train_runtime: the seconds from train()'s start to its end (speed_metrics' reading less the start time the
    Trainer took first); train_samples_per_second: the schedule's samples (steps x per-device batch x accumulation
    x processes, the epoch's short micro-batches counted full) over that time; train_steps_per_second: the optimizer
    steps over it; train_loss: the sum of every step's loss over the steps (not the mean of the logged rows, whose
    windows are uneven); total_flos: the FLOP estimates of every micro-batch summed."""
    from _support.proofs_trl_summary import step_seconds
    r = _run()
    row = r.summary()
    call = r.speed_of("train")
    p.check(r.global_step == RUN["max_steps"] == r.max_steps and len(r.run.train_rows()) == 2,
            (r.global_step, r.max_steps, len(r.run.train_rows())))
    runtime = call["now"] - call["start_time"]
    stepped = sum(step_seconds(s) for s in range(1, r.global_step + 1))
    p.check(runtime >= stepped and call["start_time"] == min(c["start_time"] for c in r.speed), (runtime, call))
    p.assert_stated("train_runtime", row["train_runtime"], one(runtime), levels=(), rel=1e-6)
    # the steps since the last row (a row's own window), or one step: shorter spans than the whole train()
    p.check(not close(row["train_runtime"], step_seconds(r.global_step), 1e-3)
            and not close(row["train_runtime"], sum(step_seconds(s) for s in range(7, r.global_step + 1)), 1e-3),
            "train_runtime is the whole train()")

    counted = r.global_step * r.total_train_batch_size
    seen = sum(r.micro_sizes)
    p.check(call["num_samples"] == counted and seen < counted, (call["num_samples"], counted, seen))
    p.assert_stated("train_samples_per_second", row["train_samples_per_second"], one(counted / runtime),
                    levels=(), rel=RATE_REL)
    p.check(not close(row["train_samples_per_second"], seen / runtime, 1e-3), "samples seen, not counted")
    p.check(call["num_steps"] == r.global_step, call)
    p.assert_stated("train_steps_per_second", row["train_steps_per_second"], one(r.global_step / runtime),
                    levels=(), rel=RATE_REL)

    losses = [(row_["loss"], hi - lo + 1) for (_s, row_), (lo, hi) in zip(r.run.train_rows(), r.run.windows)]
    p.check([n for _l, n in losses] == [3, 3], losses)
    p.assert_stated("train_loss", row["train_loss"], one(r.total_loss_scalar / r.global_step), levels=(),
                    rel=1e-6)
    # every optimizer step's loss, the 7th's too (after the last row: no row logs it): not the rows' mean, nor
    # the last row's
    p.check(not close(row["train_loss"], statistics.fmean(v for v, _n in losses), 1e-3), losses)
    p.check(not close(row["train_loss"], losses[-1][0], 1e-3), losses)

    p.check(len(r.flops) == r.global_step * RUN["gradient_accumulation_steps"] and len(set(r.flops)) > 1, r.flops)
    p.assert_stated("total_flos", row["total_flos"], one(sum(r.flops)), levels=(), rel=1e-9)
    p.check(not close(row["total_flos"], r.flops[-1]) and not close(row["total_flos"], statistics.fmean(r.flops)),
            "total_flos sums the micro-batches")


@proof("trl", trainer="sft", release=RELEASE, config=CONFIG)
def test_evaluate_summary_is_the_evaluation_pass(p):
    """eval_runtime: the seconds evaluate() took (its own start time, not train()'s); eval_samples_per_second: the
    evaluation examples (all of them, the last batch short) over it; eval_steps_per_second: ceil(examples /
    (eval batch x processes)) batches over it."""
    r = _run()
    rows = [x for x in r.eval_rows if "eval_runtime" in x]
    p.check(len(rows) == 1, r.eval_rows)
    row = rows[0]
    call = r.speed_of("eval")
    runtime = call["now"] - call["start_time"]
    train_call = r.speed_of("train")
    from _support.proofs_trl_summary import EVAL_BATCH_SECONDS
    p.check(call["start_time"] > train_call["now"], "evaluate() times itself")
    p.check(runtime >= 3 * EVAL_BATCH_SECONDS, (runtime, "the clock moved through the three batches"))
    p.assert_stated("eval_runtime", row["eval_runtime"], one(runtime), levels=(), rel=1e-6)
    p.check(call["num_samples"] == N_EVAL, call)
    p.assert_stated("eval_samples_per_second", row["eval_samples_per_second"], one(N_EVAL / runtime), levels=(),
                    rel=RATE_REL)
    batches = math.ceil(N_EVAL / r.eval_batch_size)
    p.check(call["num_steps"] == batches == 3, (call["num_steps"], batches))
    p.assert_stated("eval_steps_per_second", row["eval_steps_per_second"], one(batches / runtime), levels=(),
                    rel=RATE_REL)
    p.check(not close(row["eval_steps_per_second"], (N_EVAL / r.eval_batch_size) / runtime, 1e-3),
            "whole batches, the short one counted")
