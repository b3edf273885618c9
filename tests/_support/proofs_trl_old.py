"""TRL's older releases run for the fingerprint proofs of mappings/trl.yaml's entries that end before the pinned
1.16.0 (tests/frameworks/test_proof_trl_old.py; each proof runs in a child process with the release first on
sys.path: tests/_support/releases.py).

* GRPO and RLOO at 0.25.1: the release's own ``GRPOTrainer`` (``RLOOTrainer``) trains the tiny model on CPU through
  tests/_support/proofs_trl.py's :func:`~_support.proofs_trl.run_grpo` (``run_rloo``; the same recorders: every row
  logged, the locals of each call of the metric code that appended to ``_metrics``).
* PPO at 1.12.0 (``trl.experimental.ppo``, removed in v1.13.0) and 0.25.1 (``trl.PPOTrainer``): :func:`run_ppo` trains
  the release's own ``PPOTrainer`` (policy, reference, value and reward models: the tiny model and two
  sequence-classification heads on it). Its metrics are computed inside ``PPOTrainer.train``, one long function:
  :class:`PPORecorder` copies that function's locals (its frame, found on the stack) at two moments, without replacing
  any TRL code: when each micro-batch's ``with accelerator.accumulate(model):`` block ends (a pass-through wrapper of
  ``Accelerator.accumulate``: the per-token losses, ratios, entropies and masks of the micro-batch, after TRL wrote
  its ``*_stats[epoch, mini-batch, micro-batch]``), and when a row is logged (an ``on_log`` callback: the rollout's
  KL, log-probs, scores, rewards and masks). The learning rate is read in ``on_step_end`` (after
  ``lr_scheduler.step()``).

Stand-ins, each for code the trainers under test do not run:

* :func:`fix_optional_imports` (0.25.1; a no-op at 1.12.0): trl/import_utils.py@v0.25.1 keeps
  ``transformers.utils.import_utils._is_package_available(name)``'s result as the flag "package available"; with
  transformers 5.24 that function returns a ``(bool, version)`` tuple, always true, so trl 0.25.1 imports mergekit,
  llm_blender, vllm ... at module level and fails (no module named 'mergekit'). The flags are set to the tuple's
  bool before ``trl`` imports its trainers; none of those packages is used by a CPU GRPO run.
* ``PreTrainedModel.warnings_issued`` (0.25.1): GRPOTrainer.__init__ (and RLOOTrainer's) writes
  ``model.warnings_issued["estimate_tokens"] = True`` (grpo_trainer.py@v0.25.1:444) to silence a FLOP-estimate
  warning; transformers 5 removed that dict, so an empty one is given to the class. Nothing reads it.

Not runnable here: trl 0.16.1 (the last release logging completion_length, rewards/{reward_fn}, and the
v0.14.0..v0.21.0 reward_std) imports with :func:`fix_optional_imports` but its GRPOTrainer does not train with
transformers 5.24: ``_get_train_sampler(self)`` takes no dataset argument, which transformers 5's
``Trainer._get_dataloader`` passes (TypeError), and that sampler decides the batches; it is not listed in
tests/releases.txt, and its entries stay unproven (no listed release covers them).

Every entry of these releases that a proof here reaches is fingerprinted (no ENTRY_WHY).
"""
from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .framework_code import StandInClock
from .proofs_trl import COMMON, one_thread_quiet
from .tiny_trl import build_tiny_model, sentences


def fix_optional_imports() -> None:
    """trl 0.25.1's optional-package flags as bools (module docstring); and the ``warnings_issued`` dict GRPO
    writes to. Call before importing a trainer from ``trl``."""
    import transformers
    import trl.import_utils as iu
    for name, value in list(vars(iu).items()):
        if name.startswith("_") and name.endswith("_available") and isinstance(value, tuple):
            setattr(iu, name, value[0])
    if not hasattr(transformers.PreTrainedModel, "warnings_issued"):
        transformers.PreTrainedModel.warnings_issued = {}


# ------------------------------------------------------------------------------------------- PPO at 1.12.0
#: the micro-batch locals of PPOTrainer.train copied when its accumulate() block ends
MICRO_LOCALS = ("ppo_epoch_idx", "minibatch_idx", "gradient_accumulation_idx", "micro_batch_inds", "logprobs_diff",
                "ratio", "pg_losses", "pg_losses2", "pg_loss_max", "vf_losses1", "vf_losses2", "vf_loss_max",
                "entropy", "pg_loss", "vf_loss", "pg_clipfrac", "vf_clipfrac", "approxkl")
#: the rollout locals of PPOTrainer.train copied when a row is logged
ROLLOUT_LOCALS = ("kl", "logprobs", "ref_logprobs", "padding_mask", "padding_mask_p1", "non_score_reward", "scores",
                  "rewards", "responses", "postprocessed_responses", "sequence_lengths", "approxkl_stats",
                  "pg_clipfrac_stats", "pg_loss_stats", "vf_loss_stats", "vf_clipfrac_stats", "entropy_stats",
                  "ratio_stats")


def _copy(frame_locals: dict[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    import torch
    out = {}
    for n in names:
        v = frame_locals.get(n)
        out[n] = v.detach().clone() if isinstance(v, torch.Tensor) else v
    return out


def _train_frame() -> Any:
    """PPOTrainer.train's frame, on the stack above the caller."""
    f = sys._getframe(1)
    while f is not None and not (f.f_code.co_name == "train" and "approxkl_stats" in f.f_locals):
        f = f.f_back
    assert f is not None, "PPOTrainer.train is not on the stack"
    return f


@dataclass
class PPOUpdate:
    """One PPO update (one logged row): the micro-batches' locals in order, the rollout's locals, the row, and
    the trainer's episode counter and learning rate as TRL logged them."""
    micros: list[dict[str, Any]] = field(default_factory=list)
    rollout: dict[str, Any] = field(default_factory=dict)
    row: dict[str, Any] = field(default_factory=dict)
    episode: int = 0
    global_step: int = 0


class PPORecorder:
    """Copies PPOTrainer.train's locals at the end of each micro-batch (``accelerator.accumulate`` wrapped,
    passing through) and at each log (an ``on_log`` callback); ``lr_after``: the rate after each update's
    ``lr_scheduler.step()`` (``on_step_end``)."""

    def __init__(self, trainer: Any) -> None:
        import transformers

        self.updates: list[PPOUpdate] = [PPOUpdate()]
        self.lr_after: list[float] = []
        recorder = self
        accumulate = trainer.accelerator.accumulate

        @contextlib.contextmanager
        def recording_accumulate(*models: Any) -> Any:
            frame = _train_frame()
            with accumulate(*models) as ctx:
                yield ctx
            recorder.updates[-1].micros.append(_copy(frame.f_locals, MICRO_LOCALS))
            del frame
        trainer.accelerator.accumulate = recording_accumulate

        class Rows(transformers.TrainerCallback):
            def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
                frame = _train_frame()
                upd = recorder.updates[-1]
                upd.rollout = _copy(frame.f_locals, ROLLOUT_LOCALS)
                upd.row, upd.episode, upd.global_step = dict(logs or {}), state.episode, state.global_step
                del frame
                recorder.updates.append(PPOUpdate())

            def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
                recorder.lr_after.append(trainer.lr_scheduler.get_last_lr()[0])
        trainer.add_callback(Rows())

    def done(self) -> list[PPOUpdate]:
        return [u for u in self.updates if u.row]


@dataclass
class PPORun:
    config: dict[str, Any]
    updates: list[PPOUpdate]
    lr_after: list[float]
    lr_initial: float
    eos_token_id: int
    clock: list[float] = field(default_factory=list)      # the clock's readings: train()'s start, then one per log

    def micro_steps(self, upd: PPOUpdate, values: Any) -> list:
        """The nested batch of one update's update statistics: one logged step, its (epoch, mini-batch) pairs as
        the optimizer-step level (the entry's ``num_mini_batches * num_ppo_epochs``), one rank, each mini-batch's
        micro-batches, each ``values(micro locals, rollout locals)``: its sequences' values."""
        minis: dict[tuple[int, int], list] = {}
        for m in upd.micros:
            minis.setdefault((m["ppo_epoch_idx"], m["minibatch_idx"]), []).append(values(m, upd.rollout))
        return [[[micros] for _k, micros in sorted(minis.items())]]

    def rollout_steps(self, upd: PPOUpdate, values: Any) -> list:
        """The rollout batch of one update: one step, one mini-batch, one rank, one micro-batch of its sequences."""
        return [[[[values(upd.rollout)]]]]


def rows_of(tensor: Any, mask: Any = None) -> list[list[float]]:
    """Each row of a (B, T) tensor at the positions ``mask`` keeps (every position without one)."""
    if mask is None:
        return [[float(v) for v in row] for row in tensor.float()]
    return [[float(v) for v in row[keep]] for row, keep in zip(tensor.float(), mask.bool())]


def build_ppo_models(workdir: Path) -> str:
    """The tiny causal LM (policy and reference) saved to ``workdir``; the value and reward models are
    sequence-classification heads loaded from it (1 label: a random score head)."""
    return build_tiny_model(workdir / "model")


def run_ppo(workdir: Path, *, n_prompts: int = 64, **config: Any) -> PPORun:
    """Train trl.experimental.ppo.PPOTrainer (the release on sys.path) with ``config`` (PPOConfig fields over
    small defaults), recording every update (:class:`PPORecorder`)."""
    import datasets
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

    fix_optional_imports()
    try:                                    # v0.26.0+: trl.experimental.ppo; before: trl.trainer.ppo_trainer
        from trl.experimental.ppo import PPOConfig, PPOTrainer
    except ImportError:
        from trl import PPOConfig, PPOTrainer

    path = build_ppo_models(workdir)
    tok = AutoTokenizer.from_pretrained(path)
    torch.manual_seed(1)
    policy = AutoModelForCausalLM.from_pretrained(path)
    ref = AutoModelForCausalLM.from_pretrained(path)
    value = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1)
    reward = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1)
    for m in (value, reward):
        m.config.pad_token_id = tok.pad_token_id
    ids = [tok(s)["input_ids"] for s in sentences(n_prompts, 11)]
    ds = datasets.Dataset.from_dict({"input_ids": ids})
    args = {**COMMON, "output_dir": str(workdir / "out"), "num_sample_generations": 0, **config}
    ppo_args = PPOConfig(**args)
    trainer = PPOTrainer(args=ppo_args, processing_class=tok, model=policy, ref_model=ref, reward_model=reward,
                         value_model=value, train_dataset=ds)
    rec = PPORecorder(trainer)
    lr0 = trainer.lr_scheduler.get_last_lr()[0]
    # PPOTrainer.train draws each epoch's mini-batch order from numpy's global generator (np.random.permutation,
    # ppo_trainer.py@v1.12.0:803), which neither the trainer nor torch.manual_seed seeds: seeded here, so a fresh
    # process computes the same update statistics (the report's measured gaps included)
    import numpy as np
    np.random.seed(1)
    module = sys.modules[type(trainer).__module__]
    real_time = module.time
    # ppo_trainer.py reads the clock at train()'s start (start_time) and once per logged update (eps), nowhere else:
    # its k-th reading is 1000 + 0.25 k (k + 1) seconds, each later than the last by a longer step
    clock = module.time = StandInClock(real_time, 1000.0, step=lambda k: 0.5 * k)
    try:
        with one_thread_quiet():
            trainer.train()
    finally:
        module.time = real_time
    return PPORun(ppo_args.to_dict(), rec.done(), rec.lr_after, lr0, tok.eos_token_id, clock.readings)
