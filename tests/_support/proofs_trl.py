"""Real TRL trainers run on CPU for the fingerprint proofs of mappings/trl.yaml (issue 20).

A proof runs a TRL trainer for a few optimizer steps on a tiny model built in code (tests/_support/tiny_trl.py),
reads every row it logs through a callback's ``on_log``, and records, for each call of the trainer's own metric
code (``GRPOTrainer._compute_loss``: one micro-batch; ``GRPOTrainer._generate`` and
``_generate_and_score_completions``: one generation batch), that function's local variables and the values it
appended to ``_metrics``: the
per-token entropies, KL terms and clip indicators, the masks, the completion lengths and rewards TRL itself
computed and then reduced. Nothing here recomputes a metric: :func:`TRLRun.steps` only arranges the framework's own
per-token (or per-sequence) values of the optimizer steps a logged row covers as the nested batch
``steps[window][mini-batch][rank][micro-batch]`` of tests/_support/fingerprint.py, which computes what every
candidate reduction would make of them. The proof then asserts that the logged value is the reduction the shipped
mapping entry states.

The calls are recorded through the trainer's own ``_metrics`` lists: they are replaced by lists whose ``append`` also
copies the locals of the TRL function appending (its frame, the caller of ``append``), so no TRL method is replaced
and nothing is traced. The gradient norm is read from ``accelerator.clip_grad_norm_``'s return value (a pass-through
wrapper) and the learning rate in the ``on_optimizer_step``/``on_step_end`` callbacks.
"""
from __future__ import annotations

import contextlib
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from .tiny_trl import build_tiny_model, log_recorder, sentences

#: the tokens the tiny model may sample besides EOS (the others are suppressed): a near-uniform choice among a few
#: tokens makes EOS likely at every position, so completions end at uneven lengths inside max_completion_length
KEEP_WORDS = ("the", "cat", "sat", "on")


@dataclass
class Call:
    """One call of a TRL function that appended to ``_metrics``: its name, the optimizer step it contributed to
    (1-based: ``state.global_step`` + 1 while it ran), its local variables as they were at its last append, and the
    values it appended (by key)."""
    name: str
    step: int
    locals: dict[str, Any]
    appended: dict[str, float] = field(default_factory=dict)   # what the call appended to _metrics, by key


class MetricsRecorder:
    """Replaces a trainer's ``_metrics`` (``{mode: defaultdict(list)}``) with lists that, when TRL appends a value,
    copy the locals of the TRL function doing the append (its frame is the caller of ``append``): one :class:`Call`
    per call of that function, holding its locals as they were at its last append. TRL's lists and values are
    otherwise untouched (the lists are lists; ``log()`` averages them as before)."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer
        self.calls: list[Call] = []
        self._frame: Any = None
        recorder = self

        class RecordingList(list):
            key = ""

            def append(self, value: Any) -> None:
                recorder._seen(sys._getframe(1))
                recorder.calls[-1].appended[self.key] = value
                super().append(value)

        class Metrics(defaultdict):
            def __missing__(self, key: str) -> RecordingList:
                lst = self[key] = RecordingList()
                lst.key = key
                return lst

        self.list_type = RecordingList
        trainer._metrics = {mode: Metrics() for mode in trainer._metrics}

    def _seen(self, frame: Any) -> None:
        if frame is not self._frame:            # a new call (a frame lives until its function returns)
            self._frame = frame
            self.calls.append(Call(frame.f_code.co_name, self.trainer.state.global_step + 1, {}))
        self.calls[-1].locals = dict(frame.f_locals)

    def close(self) -> None:
        self._frame = None                      # keep no frame alive


class OptimizerSteps:
    """Per optimizer step: the gradient norm the Trainer computed (the value ``accelerator.clip_grad_norm_``
    returned: the norm before clipping), and the learning rate before and after the scheduler stepped (read in the
    ``on_optimizer_step`` and ``on_step_end`` callbacks, which the Trainer calls around ``lr_scheduler.step()``), and
    the Trainer's ``state.epoch`` as each step ended."""

    def __init__(self, trainer: Any) -> None:
        import transformers

        self.grad_norm: list[float] = []
        self.lr_before: list[float] = []
        self.lr_after: list[float] = []
        self.epoch: list[float] = []            # state.epoch at the end of each optimizer step (what Trainer.log reads)
        clip = trainer.accelerator.clip_grad_norm_
        steps = self

        def recording_clip(*args: Any, **kw: Any) -> Any:
            norm = clip(*args, **kw)
            steps.grad_norm.append(float(norm))
            return norm
        trainer.accelerator.clip_grad_norm_ = recording_clip

        class LR(transformers.TrainerCallback):
            def on_optimizer_step(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
                steps.lr_before.append(trainer.lr_scheduler.get_last_lr()[0])

            def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
                steps.lr_after.append(trainer.lr_scheduler.get_last_lr()[0])
                steps.epoch.append(float(state.epoch))
        trainer.add_callback(LR())


@dataclass
class TRLRun:
    """A finished TRL trainer run: its config, the rows it logged (``(global_step, logs)``, in order) and the
    recorded calls of its metric code."""
    config: dict[str, Any]
    rows: list[tuple[int, dict[str, Any]]]
    calls: list[Call]
    optimizer: OptimizerSteps | None = None
    windows: list[tuple[int, int]] = field(default_factory=list)   # (first, last) optimizer step of each train row

    def train_rows(self) -> list[tuple[int, dict[str, Any]]]:
        """The periodic training rows (not the end-of-training summary with train_runtime)."""
        return [(s, r) for s, r in self.rows if "loss" in r and "train_runtime" not in r]

    def per_step(self, values: list[float], row: int) -> list:
        """A value per optimizer step (``optimizer.grad_norm`` ...) of the steps of train row ``row``, as a nested
        batch: each step one micro-batch of one 'sequence' holding the value."""
        first, last = self.windows[row]
        return [[[[[[values[s - 1]]]]]] for s in range(first, last + 1)]

    def per_call(self, key: str, name: str, values: Callable[[dict[str, Any]], list[list[float]]]) -> list:
        """One observation per call of ``name`` that appended ``key``: (the value it appended, its batch as one
        step of one micro-batch): the framework's reduction of a single micro-batch or generation batch."""
        return [(c.appended[key], [[[[values(c.locals)]]]]) for c in self.calls if c.name == name and key in c.appended]

    def calls_of(self, name: str, first: int, last: int) -> list[Call]:
        return [c for c in self.calls if c.name == name and first <= c.step <= last]

    def steps(self, row: int, name: str, values: Callable[[dict[str, Any]], list[list[float]]]) -> list:
        """The nested batch of train row ``row``: its optimizer steps (window level), one mini-batch each, one rank
        (this process), and each step's calls of ``name`` (micro-batches for ``_compute_loss``; one generation batch
        for ``_generate``), each as ``values(locals)``: the sequences of that call, each the list of its values."""
        first, last = self.windows[row]
        out = []
        for step in range(first, last + 1):
            micro = [values(c.locals) for c in self.calls_of(name, step, step)]
            if micro:
                out.append([[micro]])
        return out


# ------------------------------------------------------------------------------------------- per-call values
def masked(tensor_name: str, mask_name: str = "mask") -> Callable[[dict[str, Any]], list[list[float]]]:
    """Each sequence's values of a (B, T) tensor at the positions its mask keeps (a (B, 1) tensor: one value per
    sequence, as TRL's sequence-level importance sampling gives)."""
    def values(loc: dict[str, Any]) -> list[list[float]]:
        x, m = loc[tensor_name].float(), loc[mask_name].bool()
        if x.shape[1] == 1:
            return [[float(v)] for v in x[:, 0]]
        return [[float(v) for v in x[i][m[i]]] for i in range(x.shape[0])]
    return values


def per_seq(tensor_name: str, keep: str | None = None, invert: bool = False) -> Callable:
    """One value per sequence of a (B,) tensor (optionally only where the boolean tensor ``keep`` is true, or false
    with ``invert``; none left: TRL's own stand-in, one 0, as GRPO's _generate logs for a batch without a terminated
    completion)."""
    def values(loc: dict[str, Any]) -> list[list[float]]:
        x = loc[tensor_name].float().flatten()
        if keep is None:
            return [[float(v)] for v in x]
        k = loc[keep].bool().flatten()
        k = ~k if invert else k
        return [[float(v)] for v, ok in zip(x, k) if bool(ok)] or [[0.0]]
    return values


# ------------------------------------------------------------------------------------------- counters
def counter_obs(run: TRLRun, key: str, per_step: list[float]) -> list:
    """(logged value, the value the counter held at the row's last step) of every train row."""
    rows = run.train_rows()
    return [(row[key], [[[[[[per_step[run.windows[i][1] - 1]]]]]]]) for i, (_s, row) in enumerate(rows)]


def running_tokens(run: TRLRun, fn: str, mask_of) -> list[float]:
    """TRL's running total of attention-mask tokens at the end of each optimizer step, summed here from the masks its
    own calls held (one process: the gather is the value)."""
    total, out = 0.0, []
    for step in range(1, len(run.optimizer.epoch) + 1):
        total += sum(float(mask_of(c.locals).sum()) for c in run.calls_of(fn, step, step))
        out.append(total)
    return out


# ------------------------------------------------------------------------------------------- running GRPO
COMMON = dict(report_to="none", use_cpu=True, save_strategy="no", seed=0, disable_tqdm=True, dataloader_num_workers=0,
              learning_rate=5e-2)
RL = dict(per_device_train_batch_size=4, num_generations=4, max_completion_length=8, temperature=1.0)


def suppress_all_but(model_path: str, keep: Sequence[str] = KEEP_WORDS) -> list[int]:
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(model_path)
    kept = {tok.convert_tokens_to_ids(w) for w in keep} | {tok.eos_token_id}
    return [i for i in range(len(tok)) if i not in kept]


def default_rewards() -> list[Callable]:
    def length_reward(completions, **kwargs):
        return [-abs(len(c.split()) - 3.0) for c in completions]

    def has_cat(completions, **kwargs):          # None for some: the nan-aware means leave them out
        return [None if i % 5 == 4 else float("cat" in c) for i, c in enumerate(completions)]
    return [length_reward, has_cat]


@contextlib.contextmanager
def one_thread() -> Any:
    """torch on one thread while the block runs (the simulated batches are tiny: threads only wait on each other,
    and on a shared machine), the thread count restored after."""
    import torch
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@contextlib.contextmanager
def one_thread_quiet() -> Any:
    """:func:`one_thread`, with the block's prints sent to stderr: the Trainer prints every logged dict
    (PrinterCallback, with disable_tqdm), kept off stdout, where the proofs report (tests/_support/fidelity_proofs.py)
    writes docs/fidelity-proofs.md; pytest shows them with a failure."""
    with one_thread(), contextlib.redirect_stdout(sys.stderr):
        yield


def train(trainer: Any, rec: Any) -> TRLRun:
    """Run ``trainer.train()`` with the recorders attached; the rows, calls and per-step values it left."""

    calls = MetricsRecorder(trainer)
    optimizer = OptimizerSteps(trainer)
    try:
        with one_thread_quiet():
            trainer.train()
    finally:
        calls.close()
    run = TRLRun(config=trainer.args.to_dict(), rows=list(rec.stepped), calls=calls.calls, optimizer=optimizer)
    last = 0
    for step, _row in run.train_rows():
        run.windows.append((last + 1, step))
        last = step
    return run


def run_grpo(workdir: Path, *, model_path: str | None = None, rollout_func: Callable | None = None,
             reward_funcs: Sequence[Callable] | None = None, **config: Any) -> TRLRun:
    """Train TRL's GRPOTrainer (the installed release) with ``config`` (GRPOConfig fields over small defaults),
    recording every logged row and what ``_compute_loss``, ``_generate`` and ``_generate_and_score_completions``
    appended at each call, with their locals."""
    import datasets
    from trl import GRPOConfig, GRPOTrainer

    model_path = model_path or build_tiny_model(workdir / "model")
    args = {**COMMON, **RL, "output_dir": str(workdir / "out"), **config}
    args.setdefault("generation_kwargs", {"suppress_tokens": suppress_all_but(model_path)})
    ds = datasets.Dataset.from_dict({"prompt": sentences(256, 1)})
    rec = log_recorder()
    trainer = GRPOTrainer(model=model_path, reward_funcs=list(reward_funcs or default_rewards()),
                          args=GRPOConfig(**args), train_dataset=ds, callbacks=[rec], rollout_func=rollout_func)
    return train(trainer, rec)


def run_rloo(workdir: Path, *, model_path: str | None = None, **config: Any) -> TRLRun:
    """Train TRL's RLOOTrainer like :func:`run_grpo` (``_compute_loss``, ``_generate``,
    ``_generate_and_score_completions`` recorded)."""
    import datasets
    from trl import RLOOConfig, RLOOTrainer

    model_path = model_path or build_tiny_model(workdir / "model")
    args = {**COMMON, **RL, "output_dir": str(workdir / "out"), **config}
    args.setdefault("generation_kwargs", {"suppress_tokens": suppress_all_but(model_path)})
    ds = datasets.Dataset.from_dict({"prompt": sentences(256, 1)})
    rec = log_recorder()
    trainer = RLOOTrainer(model=model_path, reward_funcs=default_rewards(), args=RLOOConfig(**args), train_dataset=ds,
                          callbacks=[rec])
    return train(trainer, rec)


def run_dpo(workdir: Path, *, n_pairs: int, model_path: str | None = None, **config: Any) -> TRLRun:
    """Train TRL's DPOTrainer on ``n_pairs`` generated preference pairs (a count the batch size does not divide
    gives uneven micro-batches at the epoch's end), recording what ``_compute_loss`` appended and its locals."""
    import datasets
    from trl import DPOConfig, DPOTrainer

    model_path = model_path or build_tiny_model(workdir / "model")
    args = {**COMMON, "output_dir": str(workdir / "out"), "max_length": 24, **config}
    ds = datasets.Dataset.from_dict({"prompt": sentences(n_pairs, 2), "chosen": sentences(n_pairs, 3),
                                     "rejected": sentences(n_pairs, 4)})
    rec = log_recorder()
    trainer = DPOTrainer(model=model_path, args=DPOConfig(**args), train_dataset=ds, callbacks=[rec])
    return train(trainer, rec)


def run_sft(workdir: Path, *, n_examples: int, model_path: str | None = None, **config: Any) -> TRLRun:
    """Train TRL's SFTTrainer on ``n_examples`` generated prompt-completion pairs (completion-only loss: the label
    tokens are the completions', of uneven lengths), recording what ``compute_loss`` appended and its locals."""
    import datasets
    from trl import SFTConfig, SFTTrainer

    model_path = model_path or build_tiny_model(workdir / "model")
    args = {**COMMON, "output_dir": str(workdir / "out"), "max_length": 24, **config}
    ds = datasets.Dataset.from_dict({"prompt": sentences(n_examples, 5), "completion": sentences(n_examples, 6)})
    rec = log_recorder()
    trainer = SFTTrainer(model=model_path, args=SFTConfig(**args), train_dataset=ds, callbacks=[rec])
    return train(trainer, rec)


def run_kto(workdir: Path, *, n_examples: int, model_path: str | None = None, **config: Any) -> TRLRun:
    """Train TRL's KTOTrainer on ``n_examples`` generated unpaired examples (desirable and undesirable in an uneven
    pattern, so micro-batches hold different numbers of each), recording what ``compute_loss``'s metric code
    appended and its locals."""
    import datasets
    from trl import KTOConfig, KTOTrainer

    model_path = model_path or build_tiny_model(workdir / "model")
    args = {**COMMON, "output_dir": str(workdir / "out"), "max_length": 24, **config}
    pattern = (1, 1, 1, 1, 0, 0, 1, 1, 0, 0, 1)      # micro-batches of 3: 3:0, 1:2, 2:1 ... desirable:undesirable
    labels = [bool(pattern[i % len(pattern)]) for i in range(n_examples)]
    ds = datasets.Dataset.from_dict({"prompt": sentences(n_examples, 7), "completion": sentences(n_examples, 8),
                                     "label": labels})
    rec = log_recorder()
    trainer = KTOTrainer(model=model_path, args=KTOConfig(**args), train_dataset=ds, callbacks=[rec])
    return train(trainer, rec)


def run_reward(workdir: Path, *, n_pairs: int, model_path: str | None = None, **config: Any) -> TRLRun:
    """Train TRL's RewardTrainer (a sequence-classification head on the tiny model) on ``n_pairs`` generated
    preference pairs, recording what ``compute_loss`` appended and its locals. bf16 off (RewardConfig turns it on
    by default): the rewards are then the float32 values the statistics are computed from."""
    import datasets
    from trl import RewardConfig, RewardTrainer

    model_path = model_path or build_tiny_model(workdir / "model")
    args = {**COMMON, "output_dir": str(workdir / "out"), "max_length": 24, "bf16": False, **config}
    ds = datasets.Dataset.from_dict({"chosen": sentences(n_pairs, 9), "rejected": sentences(n_pairs, 10)})
    rec = log_recorder()
    trainer = RewardTrainer(model=model_path, args=RewardConfig(**args), train_dataset=ds, callbacks=[rec])
    return train(trainer, rec)
