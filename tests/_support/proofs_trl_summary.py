"""The Trainer's end-of-training and evaluate() summaries, run on CPU for the fingerprint proofs of
tests/frameworks/test_proof_trl_summary.py: TRL's SFTTrainer (the installed 1.16.0, on transformers' Trainer) trains
the tiny model of tests/_support/tiny_trl.py, then evaluates it, and what transformers' own code computed is kept:

* the wall clock transformers reads (``time.time()`` in transformers/trainer.py and trainer_utils.py, the module
  attribute ``time`` of each): a stand-in clock that advances by :data:`TICK` seconds at every reading and by
  :func:`step_seconds` at the end of each optimizer step and :data:`EVAL_BATCH_SECONDS` after each evaluation
  batch (callbacks: the steps take different times), so the
  runtimes (and the rates made from them) are the same numbers in every process; every reading is recorded;
* ``speed_metrics`` (trainer_utils.py): its arguments (the split, the start time, the sample and step counts the
  Trainer passed) and what it returned, recorded as it returns;
* ``Trainer.floating_point_ops``: what it returned for each micro-batch (the FLOP estimate total_flos sums).

Nothing here computes a logged value: the proofs compare what transformers logged with the quantities it was given.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .framework_code import StandInClock
from .proofs_trl import COMMON, TRLRun, train
from .tiny_trl import build_tiny_model, log_recorder, sentences

#: seconds the stand-in clock advances at every reading (a binary fraction: the differences are exact)
TICK = 0.375


#: how long each evaluation batch takes on the stand-in clock
EVAL_BATCH_SECONDS = 0.625


def step_seconds(step: int) -> float:
    """How long optimizer step ``step`` (1-based) takes on the stand-in clock: a different binary fraction each."""
    return 1.0 + 0.25 * step

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


@dataclass
class SummaryRun:
    """A train() and evaluate() run: the rows, the speed_metrics calls (split, start_time, num_samples, num_steps,
    the clock's reading inside, the returned dict), the FLOP estimates per micro-batch, the trainer's state."""
    run: TRLRun
    speed: list[dict[str, Any]] = field(default_factory=list)
    flops: list[float] = field(default_factory=list)
    micro_sizes: list[int] = field(default_factory=list)       # examples in each micro-batch trained on
    total_loss_scalar: float = 0.0
    global_step: int = 0
    max_steps: int = 0
    total_train_batch_size: int = 0
    eval_rows: list[dict[str, Any]] = field(default_factory=list)
    eval_examples: int = 0
    eval_batch_size: int = 0

    def summary(self) -> dict[str, Any]:
        rows = [r for _s, r in self.run.rows if "train_runtime" in r]
        assert len(rows) == 1, rows
        return rows[0]

    def speed_of(self, split: str) -> dict[str, Any]:
        calls = [c for c in self.speed if c["split"] == split and c["num_samples"] is not None]
        assert len(calls) == 1, [c["split"] for c in self.speed]
        return calls[0]


def run_summary(workdir: Path, *, n_examples: int, n_eval: int, **config: Any) -> SummaryRun:
    """SFTTrainer.train() on ``n_examples`` prompt-completion pairs, then evaluate() on ``n_eval`` others, with the
    stand-in clock and the recorders of the module docstring."""
    import datasets
    import transformers.trainer as hf_trainer
    import transformers.trainer_utils as hf_utils
    from trl import SFTConfig, SFTTrainer

    model_path = build_tiny_model(workdir / "model")
    args = {**COMMON, "output_dir": str(workdir / "out"), "max_length": 24, **config}
    ds = datasets.Dataset.from_dict({"prompt": sentences(n_examples, 5), "completion": sentences(n_examples, 6)})
    ev = datasets.Dataset.from_dict({"prompt": sentences(n_eval, 7), "completion": sentences(n_eval, 8)})
    import transformers

    real_time, real_speed = hf_trainer.time, hf_utils.speed_metrics
    clock = StandInClock(real_time, 1000.0, step=lambda k: TICK)

    class StepTime(transformers.TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            clock.advance(step_seconds(state.global_step))

        def on_prediction_step(self, args, state, control, **kwargs):
            clock.advance(EVAL_BATCH_SECONDS)

    rec = log_recorder()
    trainer = SFTTrainer(model=model_path, args=SFTConfig(**args), train_dataset=ds, eval_dataset=ev,
                         callbacks=[rec, StepTime()])
    out = SummaryRun(run=TRLRun(config={}, rows=[], calls=[]))

    def speed_metrics(split, start_time, num_samples=None, num_steps=None, num_tokens=None):
        got = real_speed(split, start_time, num_samples=num_samples, num_steps=num_steps, num_tokens=num_tokens)
        out.speed.append({"split": split, "start_time": start_time, "num_samples": num_samples,
                          "num_steps": num_steps, "now": clock.readings[-1], "returned": dict(got)})
        return got

    real_flops = trainer.floating_point_ops

    def floating_point_ops(inputs):
        n = real_flops(inputs)
        out.flops.append(float(n))
        out.micro_sizes.append(int(inputs["input_ids"].shape[0]))
        return n

    trainer.floating_point_ops = floating_point_ops
    hf_trainer.time = hf_utils.time = clock
    hf_trainer.speed_metrics = speed_metrics
    try:
        out.run = train(trainer, rec)
        n_rows = len(rec.logs)
        trainer.evaluate()
        out.eval_rows = [dict(r) for r in rec.logs[n_rows:]]
    finally:
        hf_trainer.time, hf_utils.time = real_time, real_time
        hf_trainer.speed_metrics = real_speed
    out.total_loss_scalar = float(trainer._total_loss_scalar)
    out.global_step = int(trainer.state.global_step)
    out.max_steps = int(trainer.state.max_steps)
    out.total_train_batch_size = int(trainer.args.per_device_train_batch_size
                                     * trainer.args.gradient_accumulation_steps * trainer.args.world_size)
    out.eval_examples = n_eval
    out.eval_batch_size = int(trainer.args.eval_batch_size * trainer.args.world_size)
    return out


#: (framework, key, since or None) -> why no proof covers the entry (the proofs report reads it)
ENTRY_WHY: dict[tuple[str, str, str | None], str] = {}

__all__ = ["ENTRY_WHY", "EVAL_BATCH_SECONDS", "TICK", "SummaryRun", "run_summary", "step_seconds"]
