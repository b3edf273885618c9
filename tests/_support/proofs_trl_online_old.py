"""TRL's online preference trainers at older releases, run for the fingerprint proofs of mappings/trl.yaml's XPO and
Nash-MD entries (v0.11.0..v1.13.0) and of Online DPO's beta and learning_rate (tests/frameworks/
test_proof_trl_online_old.py; each proof runs in a child process with the release first on sys.path:
tests/_support/releases.py).

* XPO and Nash-MD at 1.12.0 (``trl.experimental.xpo``, ``trl.experimental.nash_md``: OnlineDPOTrainer subclasses;
  0.25.1's do not log with transformers 5, see the test module): each ``training_step`` (one micro-batch) samples a
  completion per prompt from the policy and one from the reference (Nash-MD: from the geometric mixture of both),
  scores both with a reward model, computes the loss and calls ``_log_statistics``, which appends one value per key
  to ``self.stats`` (``gather_for_metrics(x).mean()``); ``_maybe_log_save_evaluate`` logs ``sum(val) / len(val)`` of
  each list and resets them. Online DPO at 0.13.0 (``trl.OnlineDPOTrainer``, transformers 4.46.3) appends its stats
  in ``training_step`` itself. The reward model is a tiny ``LlamaForSequenceClassification`` built in code
  (:func:`build_reward_model`, the policy's tokenizer), the policy the tiny model of tests/_support/tiny_trl.py.
  :class:`StatsRecorder` copies the locals of each ``_log_statistics`` (``_compute_losses``; Online DPO:
  ``training_step``) call as it returns (``sys.setprofile``, as tests/_support/proofs_trl_pref.py's ReturnRecorder)
  with the values that call appended (``self.stats[key][-1]``): no TRL method is replaced. The learning rates come
  from tests/_support/proofs_trl.py's OptimizerSteps callbacks.
* The scheduled coefficients (``beta``, ``alpha``, ``mixture_coef``): the releases take a list per epoch, but index
  it with ``state.epoch``, a float (``self._beta[epoch]``: a TypeError), so a run can only set one value. A
  Schedule callback (:func:`schedule_callback`) writes another value into the trainer's ``_beta`` (``_alpha``,
  ``_mixture_coef``) before each micro-batch (``on_step_begin``, ``on_substep_end``): what a schedule would do,
  read by TRL's own properties.

The prompts are given as an iterable dataset (no length): accelerate then knows no remainder and truncates no
gather at an epoch's end (tests/_support/proofs_trl_pref.py's online DPO proofs show that truncation).

Stand-ins: proofs_trl_old.py's :func:`~_support.proofs_trl_old.fix_optional_imports` (optional-package flags,
``warnings_issued``; no-ops at these releases); nothing the metric code computes with.

At the end, :data:`ENTRY_WHY`: the entries of these trainers no proof here fingerprints, each with why.
"""
from __future__ import annotations

import contextlib
import inspect
import sys
from pathlib import Path
from typing import Any, Iterable

from .proofs_trl import COMMON, Call, OptimizerSteps, TRLRun, suppress_all_but
from .proofs_trl_old import fix_optional_imports
from .tiny_trl import build_tiny_model, log_recorder, sentences


class StatsRecorder:
    """Copies the locals of the TRL functions ``names`` as each call returns (one :class:`Call` each, tagged with
    the optimizer step, 1-based), with ``appended``: the last value of each of ``self.stats``'s lists at that moment
    (what the call appended), and ``_gathered``: what accelerate's gather_for_metrics returned during it."""

    def __init__(self, trainer: Any, names: Iterable[str]) -> None:
        self.trainer = trainer
        self.names = set(names)
        self.calls: list[Call] = []
        self._gathered: list[Any] = []
        self._previous: Any = None

    def _profile(self, frame: Any, event: str, arg: Any) -> None:
        if event != "return":
            return
        code = frame.f_code
        if code.co_name == "gather_for_metrics" and "/accelerate/" in code.co_filename:
            self._gathered.append(arg)
        elif code.co_name in self.names and "/trl/" in code.co_filename:
            loc = dict(frame.f_locals)
            loc["_gathered"], self._gathered = self._gathered, []
            stats = getattr(self.trainer, "stats", {})
            loc["_appended"] = appended = {k: float(v[-1]) for k, v in stats.items() if v}
            self.calls.append(Call(code.co_name, self.trainer.state.global_step + 1, loc, appended))

    def __enter__(self) -> "StatsRecorder":
        self._previous = sys.getprofile()
        sys.setprofile(self._profile)
        return self

    def __exit__(self, *exc: Any) -> None:
        sys.setprofile(self._previous)


def schedule_callback(attrs: dict[str, list[float]]) -> Any:
    """A TrainerCallback writing the next value of each ``attrs`` list (cycled) into the trainer's attribute of that
    name before every micro-batch (module docstring); ``.trainer`` must be set after the trainer is built."""
    import transformers

    class Schedule(transformers.TrainerCallback):
        trainer: Any = None
        n = 0

        def _next(self) -> None:
            for name, values in attrs.items():
                setattr(self.trainer, name, values[self.n % len(values)])
            self.n += 1

        def on_step_begin(self, args, state, control, **kwargs):
            self._next()

        def on_substep_end(self, args, state, control, **kwargs):
            self._next()

    return Schedule()


def build_reward_model(model_path: str, seed: int = 1) -> Any:
    """A tiny randomly initialised LlamaForSequenceClassification (one label) with the policy's tokenizer's ids."""
    import torch
    from transformers import AutoConfig, AutoModelForSequenceClassification

    config = AutoConfig.from_pretrained(model_path)
    config.num_labels = 1
    torch.manual_seed(seed)
    return AutoModelForSequenceClassification.from_config(config)


def _seed(seed: int = 0) -> None:
    import random

    import numpy as np
    import torch
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _classes(kind: str) -> tuple[Any, Any]:
    """The (config, trainer) classes of ``kind`` ("xpo", "nash_md", "online_dpo"): trl.experimental's (v0.26.0 on),
    else trl's own."""
    import importlib
    names = {"xpo": ("XPOConfig", "XPOTrainer"), "nash_md": ("NashMDConfig", "NashMDTrainer"),
             "online_dpo": ("OnlineDPOConfig", "OnlineDPOTrainer")}[kind]
    try:
        module = importlib.import_module(f"trl.experimental.{kind}")
    except ImportError:
        module = importlib.import_module("trl")
    return getattr(module, names[0]), getattr(module, names[1])


def run_online(kind: str, workdir: Path, *, n_prompts: int, schedule: dict[str, list[float]], **config: Any) -> TRLRun:
    """Train the installed release's XPOTrainer (``kind`` "xpo"), NashMDTrainer ("nash_md") or OnlineDPOTrainer
    ("online_dpo") on ``n_prompts`` generated prompts with a reward model, ``schedule`` (trainer attribute -> values)
    written before each micro-batch; the run's calls are the ``_log_statistics`` calls (one per micro-batch, with
    the micro-batch's ``_compute_losses`` locals under ``_losses``; Online DPO: ``training_step``), each with
    ``_appended`` and ``_gathered`` among its locals."""
    import datasets
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    fix_optional_imports()
    Config, Trainer = _classes(kind)
    _seed()
    model_path = build_tiny_model(workdir / "model")
    args = {**COMMON, "output_dir": str(workdir / "out"), "max_new_tokens": 6, "max_length": 48, **config}
    fields = inspect.signature(Config).parameters
    if "generation_kwargs" in fields:
        args.setdefault("generation_kwargs", {"suppress_tokens": suppress_all_but(model_path)})
    args = {k: v for k, v in args.items() if k != "max_length" or k in fields}      # no max_length at 0.13.0
    ds = datasets.Dataset.from_dict({"prompt": sentences(n_prompts, 11)}).to_iterable_dataset()
    tok = AutoTokenizer.from_pretrained(model_path)
    rec = log_recorder()
    sched = schedule_callback(schedule)
    params = inspect.signature(Trainer.__init__).parameters
    reward = build_reward_model(model_path)
    if "reward_funcs" in params:            # 0.25.1 - 1.12.0; reward_model before
        extra = {"reward_funcs": reward}
        if "reward_processing_classes" in params:       # NashMDTrainer@v1.12.0 scores with processing_class
            extra["reward_processing_classes"] = [tok]
    else:
        extra = {"reward_model": reward, "reward_processing_class": tok}
    trainer = Trainer(model=AutoModelForCausalLM.from_pretrained(model_path),
                      ref_model=AutoModelForCausalLM.from_pretrained(model_path), args=Config(**args),
                      train_dataset=ds, processing_class=tok, callbacks=[rec, sched], **extra)
    optimizer = OptimizerSteps(trainer)
    sched.trainer = trainer
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    # OnlineDPOTrainer appends its stats in training_step itself
    recorder = StatsRecorder(trainer, ("training_step",) if kind == "online_dpo" else
                             ("_compute_losses", "_log_statistics"))
    try:
        with contextlib.redirect_stdout(sys.stderr), recorder:
            trainer.train()
    finally:
        torch.set_num_threads(threads)
    calls, losses = [], {}
    for c in recorder.calls:        # each micro-batch's _compute_losses locals go with its _log_statistics call
        if c.name == "_compute_losses":
            losses = c.locals
        else:
            c.locals["_losses"], losses = losses, {}
            calls.append(c)
    run = TRLRun(config=trainer.args.to_dict(), rows=list(rec.stepped), calls=calls, optimizer=optimizer)
    last = 0
    for step, _row in run.train_rows():
        run.windows.append((last + 1, step))
        last = step
    return run


_XPO_LOGPS = ("not fingerprinted (the entry's deviation): _log_statistics logs "
              "gather_mean(chosen_model_logprobs.mean() + chosen_ref_logprobs.mean()) "
              "(trl/experimental/xpo/xpo_trainer.py@v1.12.0, _log_statistics; trl/trainer/xpo_trainer.py@v0.25.1: "
              "the same), the sum of the policy's and the reference's means of the chosen (rejected) completions' "
              "log-prob sums: no candidate reduction of one population computes a sum of two means")

ENTRY_WHY: dict[tuple[str, str, str], str] = {
    ("trl", "logps/chosen", "xpo"): _XPO_LOGPS,
    ("trl", "logps/rejected", "xpo"): _XPO_LOGPS,
}
