"""TRL's GRPOTrainer at older releases (0.15.2, 0.16.1; 0.29.1 and 1.8.0 through proofs_trl.run_grpo), DPPO (1.8.0)
and SSD (1.12.0) run for the fingerprint proofs of mappings/trl.yaml's GRPO-family entries that end before the pinned
1.16.0 (tests/frameworks/test_proof_trl_grpo_old.py; each proof runs in a child
process with the release, and the transformers / accelerate / datasets of its time, first on sys.path:
tests/releases.txt, tests/_support/releases.py).

:func:`run_grpo_old` trains the release's own ``GRPOTrainer`` on the tiny model of tests/_support/tiny_trl.py on CPU,
as tests/_support/proofs_trl.py's :func:`~_support.proofs_trl.run_grpo` does at the pinned release, with the same
recorders (every row logged through ``on_log``; the locals of each call of TRL's metric code as it appended to
``_metrics``; the gradient norm and the learning rate around each optimizer step). Differences of these releases:

* ``_metrics`` is one flat ``defaultdict(list)`` at 0.15.2 (``{mode: defaultdict(list)}`` from 0.16.0):
  :func:`record_metrics` gives :class:`~_support.proofs_trl.MetricsRecorder` either.
* 0.15.2 generates in ``_prepare_inputs``, once per micro-batch (no ``num_iterations``); 0.16.1 in
  ``_generate_and_score_completions``, once per micro-batch slot every ``num_iterations`` optimizer steps (the
  generations buffered and reused).
* neither release's GRPOConfig has ``generation_kwargs``: the tokens the tiny model may sample are narrowed (so that
  completions end at uneven lengths) by setting ``suppress_tokens`` (and the EOS id, which 0.15.2's
  GenerationConfig leaves out) on the trainer's own ``generation_config`` after ``__init__`` built it; nothing of
  TRL's code is replaced.

:func:`run_dppo` and :func:`run_ssd` train trl.experimental.dppo.DPPOTrainer (1.8.0) and
trl.experimental.ssd.SSDTrainer (1.12.0) the same way (their configs take ``generation_kwargs``).

Stand-ins: only those of tests/_support/proofs_trl_old.py's :func:`~_support.proofs_trl_old.fix_optional_imports`
(the optional-package flags, ``warnings_issued``) for the releases run with the test environment's transformers
(0.29.1, 1.8.0, 1.12.0); with transformers 4.49 / 4.51 (0.15.2, 0.16.1) it changes nothing.

At the end, :data:`ENTRY_WHY`: the entries of this group no proof here fingerprints, each with why.
"""
from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

from .proofs_trl import COMMON, KEEP_WORDS, MetricsRecorder, OptimizerSteps, TRLRun
from .tiny_trl import build_tiny_model, log_recorder, sentences


def record_metrics(trainer: Any) -> MetricsRecorder:
    """A MetricsRecorder for a trainer whose ``_metrics`` is ``{mode: defaultdict(list)}`` (0.16+) or one flat
    ``defaultdict(list)`` (0.15)."""
    flat = not all(isinstance(v, dict) for v in trainer._metrics.values()) or not trainer._metrics
    if flat:
        trainer._metrics = {"flat": {}}
    rec = MetricsRecorder(trainer)
    if flat:
        trainer._metrics = trainer._metrics["flat"]
    return rec


def narrow_generation(trainer: Any, keep: Sequence[str] = KEEP_WORDS) -> None:
    """The trainer's generation_config samples ``keep`` and EOS only (module docstring)."""
    tok = trainer.processing_class
    kept = {tok.convert_tokens_to_ids(w) for w in keep} | {tok.eos_token_id}
    trainer.generation_config.suppress_tokens = [i for i in range(len(tok)) if i not in kept]
    trainer.generation_config.eos_token_id = tok.eos_token_id


def train_old(trainer: Any, rec: Any) -> TRLRun:
    """``trainer.train()`` with the recorders attached (proofs_trl.train, with :func:`record_metrics`)."""
    import torch

    calls = record_metrics(trainer)
    optimizer = OptimizerSteps(trainer)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            trainer.train()
    finally:
        torch.set_num_threads(threads)
        calls.close()
    run = TRLRun(config=trainer.args.to_dict(), rows=list(rec.stepped), calls=calls.calls, optimizer=optimizer)
    last = 0
    for step, _row in run.train_rows():
        run.windows.append((last + 1, step))
        last = step
    return run


def run_grpo_old(workdir: Path, *, reward_funcs: Sequence[Callable], **config: Any) -> TRLRun:
    """Train the installed (child process: the older release's) GRPOTrainer with ``config`` over small defaults."""
    import random

    import datasets
    import numpy as np
    import torch
    from trl import GRPOConfig, GRPOTrainer

    from .proofs_trl_old import fix_optional_imports
    fix_optional_imports()
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    model_path = build_tiny_model(workdir / "model")
    args = {**COMMON, "max_completion_length": 8, "temperature": 1.0, "output_dir": str(workdir / "out"), **config}
    ds = datasets.Dataset.from_dict({"prompt": sentences(256, 1)})
    rec = log_recorder()
    trainer = GRPOTrainer(model=model_path, reward_funcs=list(reward_funcs), args=GRPOConfig(**args),
                          train_dataset=ds, callbacks=[rec])
    narrow_generation(trainer)
    return train_old(trainer, rec)


def run_dppo(workdir: Path, *, reward_funcs: Sequence[Callable], **config: Any) -> TRLRun:
    """Train trl.experimental.dppo.DPPOTrainer (1.0.0rc1-1.8.0; child process: the older release's) like
    proofs_trl.run_grpo (the same recorders; ``generation_kwargs`` narrows the sampled tokens)."""
    import datasets

    from .proofs_trl import RL, suppress_all_but, train
    from .proofs_trl_old import fix_optional_imports
    fix_optional_imports()
    from trl.experimental.dppo import DPPOConfig, DPPOTrainer

    model_path = build_tiny_model(workdir / "model")
    args = {**COMMON, **RL, "output_dir": str(workdir / "out"), **config}
    args.setdefault("generation_kwargs", {"suppress_tokens": suppress_all_but(model_path)})
    ds = datasets.Dataset.from_dict({"prompt": sentences(256, 1)})
    rec = log_recorder()
    trainer = DPPOTrainer(model=model_path, reward_funcs=list(reward_funcs), args=DPPOConfig(**args),
                          train_dataset=ds, callbacks=[rec])
    return train(trainer, rec)


def run_ssd(workdir: Path, **config: Any) -> TRLRun:
    """Train trl.experimental.ssd.SSDTrainer (v1.2.0-v1.15.0; child process: 1.12.0) like proofs_trl.run_grpo (the
    same recorders: ``_build_buffered_batch`` appends the completion statistics once per generation,
    ``compute_loss`` the cross-entropy once per micro-batch)."""
    import datasets

    from .proofs_trl import suppress_all_but, train
    from .proofs_trl_old import fix_optional_imports
    fix_optional_imports()
    from trl.experimental.ssd import SSDConfig, SSDTrainer

    model_path = build_tiny_model(workdir / "model")
    args = {**COMMON, "max_completion_length": 8, "temperature": 1.0, "output_dir": str(workdir / "out"), **config}
    args.setdefault("generation_kwargs", {"suppress_tokens": suppress_all_but(model_path)})
    ds = datasets.Dataset.from_dict({"prompt": sentences(256, 1)})
    rec = log_recorder()
    trainer = SSDTrainer(model=model_path, args=SSDConfig(**args), train_dataset=ds, callbacks=[rec])
    return train(trainer, rec)


# ------------------------------------------------------------------------------------------- per-call values
def lengths(mask_name: str = "completion_mask") -> Callable[[dict[str, Any]], list[list[float]]]:
    """Each completion's length: the row sums of TRL's own (B, T) completion mask."""
    def values(loc: dict[str, Any]) -> list[list[float]]:
        return [[float(v)] for v in loc[mask_name].sum(1)]
    return values


def reward_column(col: int) -> Callable[[dict[str, Any]], list[list[float]]]:
    """Reward function ``col``'s value of each completion (TRL's gathered ``rewards_per_func``), NaN (None) left
    out."""
    import math

    def values(loc: dict[str, Any]) -> list[list[float]]:
        return [[float(v)] for v in loc["rewards_per_func"][:, col] if not math.isnan(float(v))]
    return values


# ------------------------------------------------------------------------------------------- entries not proven
_SELF_DISTILLATION = (
    "v1.0.0..v1.6.0 only, and no release of that range is listed in tests/releases.txt (0.29.1, 1.8.0 and 1.12.0 "
    "are; their trl/experimental/sdft has no action_accuracy ...): the key is written by the SDFT evaluation "
    "helper (trl/experimental/sdft/sdft.py@v1.6.0), not by a trainer's log(); a proof needs trl 1.6.0 installed "
    "and a run of that helper")

ENTRY_WHY: dict[tuple[str, str, str | None], str] = {
    ("trl", "entropy/mean", "grpo"): (
        "ms-swift's GRPOTrainer subclass writes it (log_entropy: swift/rlhf_trainers/grpo_trainer.py@ms-swift-4.6.0), "
        "TRL's own GRPOTrainer never does at any release (0.15.2, 0.16.1, 0.25.1, 1.12.0 checked: no entropy/mean), "
        "and ms-swift is not installed in the test environment"),
    ("trl", "clip_ratio", "grpo"): (
        "v0.17.0..v1.13.0: written only on the Liger-kernel loss path (use_liger_loss: the kernel's own clip "
        "fraction, trl/trainer/grpo_trainer.py@v1.13.0); liger_kernel is not installed here (a Triton/GPU kernel "
        "package), so the trainer's code that logs it cannot run on the CPU test machine"),
    ("trl", "ssd/{metric}", "ssd"): (
        "one template entry states one reduction ({stat: value, micro_batches: mean, window: mean}) for the two "
        "metrics SSDTrainer logs, which trl 1.12.0 computes differently: ssd/cross_entropy_loss is each "
        "micro-batch's token mean of -log p, gathered and averaged (ssd_trainer.py@v1.12.0:507-512: "
        "metrics_rank_token_mean), ssd/active_sample_ratio a per-generation fraction of the completions filter_empty "
        "kept (ssd_trainer.py@v1.12.0:472-473: like generation, processes all_reduce_mean, stat fraction). Neither is "
        "the stated tokens: none, and splitting the entry into two concrete keys needs two canonical names "
        "(distill/ssd/cross_entropy_loss, distill/ssd/active_sample_ratio) that canonical.yaml does not have (the "
        "loader refuses them): left to the lead"),
    **{("trl", f"{{method}}/{name}", "self_distillation"): _SELF_DISTILLATION
       for name in ("action_accuracy", "action_present_rate", "tool_call_accuracy", "valid_json_rate")},
    ("trl", "prob_diff/{stat}", "grpo_variants"): (
        "proven by prob_diff/mean (the entry's stated token mean, fingerprinted at 1.8.0); prob_diff/max and /min, "
        "which the same template entry covers, are the micro-batch's token max / min over every process "
        "(dppo_trainer.py@v1.8.0:1424-1427), which a single stated reduction cannot also state: not fingerprinted"),
}
