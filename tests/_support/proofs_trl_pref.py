"""Real TRL preference trainers run on CPU for the fingerprint proofs of mappings/trl.yaml (issue 33 item 1): the
experimental OnlineDPOTrainer, TPOTrainer, CPOTrainer and ORPOTrainer of the installed release (trl 1.16.0), and
DPOTrainer with LD-DPO (ld_alpha).

Like tests/_support/proofs_trl.py (whose ``TRLRun``, ``OptimizerSteps`` and ``MetricsRecorder`` are reused), a
proof trains a tiny model built in code (tests/_support/tiny_trl.py) for a few optimizer steps, reads every row the
Trainer logs through a callback's ``on_log``, and keeps the local variables of the TRL function that computed the
metrics at each call. TPO appends to ``_metrics`` (``MetricsRecorder`` copies the appending frame's locals); Online
DPO appends to its own ``self.stats`` (a dict it rebuilds at every log) and CPO/ORPO return a metrics dict from
``get_batch_loss_metrics`` that ``store_metrics`` files away, so for those :class:`ReturnRecorder` copies the locals
of the named TRL functions as they return (``sys.setprofile``: no TRL method is replaced and nothing is traced
line by line). Nothing here recomputes a metric: the proofs arrange the values TRL computed (or its per-token
tensors, masked as TRL masks them) as fingerprint's nested batch.

The ``run_*_on_ranks`` functions call the same trainers' own metric methods on 2 simulated data-parallel ranks
(tests/_support/framework_code.py's ``run_ranks`` and ``SimAccelerator``; the TPO trainer built without __init__ as
tests/_support/proofs_trl_grpo.py builds GRPO's, the Online DPO, CPO and ORPO trainers by their own __init__ with the
rank's accelerator swapped in), so the process level is told apart too.
"""
from __future__ import annotations

import contextlib
import random
import sys
import types
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from .proofs_trl import (
    COMMON,
    Call,
    MetricsRecorder,
    OptimizerSteps,
    TRLRun,
    one_thread,
    one_thread_quiet,
    suppress_all_but,
)
from .tiny_trl import build_tiny_model, log_recorder, sentences


class ReturnRecorder:
    """Copies the locals of the TRL functions named ``names`` (code objects defined under trl/) as each call returns:
    one :class:`Call` per call, in call order, tagged with the optimizer step it contributed to (1-based). The values
    accelerate's ``gather_for_metrics`` returned during the call go with its locals (``_gathered``, in call order):
    on an epoch's last optimizer step accelerate truncates a per-sample gather to the dataset's remainder (the
    Trainer has already fetched the step's micro-batches, so the dataloader is at its end), and the metric is the
    mean of what was kept."""

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
            self._gathered.append(arg)          # what accelerate's gather_for_metrics returned, in call order
        elif code.co_name in self.names and "/trl/" in code.co_filename:
            loc = dict(frame.f_locals)
            loc["_gathered"], self._gathered = self._gathered, []
            self.calls.append(Call(code.co_name, self.trainer.state.global_step + 1, loc))

    def __enter__(self) -> "ReturnRecorder":
        self._previous = sys.getprofile()
        sys.setprofile(self._profile)
        return self

    def __exit__(self, *exc: Any) -> None:
        sys.setprofile(self._previous)


class PrefRun(TRLRun):
    """A :class:`TRLRun` whose train rows are told from the summary by ``train_loss`` (with
    include_num_input_tokens_seen the Trainer adds train_runtime and the other speed metrics to every train row)."""

    def train_rows(self) -> list[tuple[int, dict[str, Any]]]:
        return [(s, r) for s, r in self.rows if "loss" in r and "train_loss" not in r]


def train_recording(trainer: Any, rec: Any, names: Iterable[str] = ()) -> TRLRun:
    """Run ``trainer.train()`` with the recorders attached (``_metrics`` appends when the trainer has ``_metrics``,
    the returns of ``names`` otherwise); the rows, calls and per-step values it left."""

    metrics = MetricsRecorder(trainer) if hasattr(trainer, "_metrics") and not names else None
    optimizer = OptimizerSteps(trainer)
    returns = ReturnRecorder(trainer, names)
    try:
        with one_thread_quiet(), (returns if names else contextlib.nullcontext()):
            trainer.train()
    finally:
        if metrics is not None:
            metrics.close()
    calls = metrics.calls if metrics is not None else returns.calls
    run = PrefRun(config=trainer.args.to_dict(), rows=list(rec.stepped), calls=calls, optimizer=optimizer)
    last = 0
    for step, _row in run.train_rows():
        run.windows.append((last + 1, step))
        last = step
    return run


# ------------------------------------------------------------------------------------------------------- online DPO
def pair_reward(completions: list[str], **kwargs: Any) -> list[float]:
    """A reward that orders almost every pair (length near 3 words, ties broken by the characters)."""
    return [-abs(len(c.split()) - 3.0) + 0.01 * len(c) for c in completions]


def _online_dpo_trainer(workdir: Path, *, n_prompts: int, model_path: str | None = None, iterable: bool = False,
                        callbacks=(), **config: Any) -> Any:
    import datasets
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl.experimental.online_dpo import OnlineDPOConfig, OnlineDPOTrainer

    model_path = model_path or build_tiny_model(workdir / "model")
    args = {**COMMON, "output_dir": str(workdir / "out"), "max_new_tokens": 6, "max_length": 48, **config}
    args.setdefault("generation_kwargs", {"suppress_tokens": suppress_all_but(model_path)})
    ds = datasets.Dataset.from_dict({"prompt": sentences(n_prompts, 11)})
    if iterable:        # no length: accelerate knows no remainder, and truncates no gather at the epoch's end
        ds = ds.to_iterable_dataset()
    tok = AutoTokenizer.from_pretrained(model_path)
    return OnlineDPOTrainer(model=AutoModelForCausalLM.from_pretrained(model_path), reward_funcs=[pair_reward],
                            args=OnlineDPOConfig(**args), train_dataset=ds, processing_class=tok,
                            reward_processing_classes=[tok], callbacks=list(callbacks))


def run_online_dpo(workdir: Path, *, n_prompts: int, model_path: str | None = None, iterable: bool = False,
                   **config: Any) -> TRLRun:
    """Train TRL's experimental OnlineDPOTrainer on ``n_prompts`` generated prompts with a reward function (two
    completions sampled per prompt by the tiny model, EOS likely at every position: uneven lengths), recording the
    locals of every ``training_step`` as it returns. ``iterable``: the prompts as a dataset without a length."""
    rec = log_recorder()
    trainer = _online_dpo_trainer(workdir, n_prompts=n_prompts, model_path=model_path, iterable=iterable,
                                  callbacks=[rec], **config)
    return train_recording(trainer, rec, ("training_step",))


# ------------------------------------------------------------------------------------------------------- TPO
def run_tpo(workdir: Path, *, n_triples: int, model_path: str | None = None, **config: Any) -> TRLRun:
    """Train TRL's experimental TPOTrainer on ``n_triples`` generated (prompt, chosen, rejected, reference) rows,
    recording what ``_compute_loss`` appended to ``_metrics`` and its locals."""
    import datasets
    from trl.experimental.tpo import TPOConfig, TPOTrainer

    model_path = model_path or build_tiny_model(workdir / "model")
    args = {**COMMON, "output_dir": str(workdir / "out"), "max_length": 24, **config}
    ds = datasets.Dataset.from_dict({"prompt": sentences(n_triples, 12), "chosen": sentences(n_triples, 13),
                                     "rejected": sentences(n_triples, 14), "reference": sentences(n_triples, 15)})
    rec = log_recorder()
    trainer = TPOTrainer(model=model_path, args=TPOConfig(**args), train_dataset=ds, callbacks=[rec])
    return train_recording(trainer, rec)


# ------------------------------------------------------------------------------------------------------- CPO / ORPO
def _cpo_orpo_trainer(kind: str, workdir: Path, *, n_pairs: int, model_path: str | None = None, callbacks=(),
                      **config: Any) -> Any:
    """A CPOTrainer (``kind`` "cpo") or ORPOTrainer ("orpo") of the installed release on ``n_pairs`` generated
    preference pairs and the tiny model."""
    import datasets
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if kind == "cpo":
        from trl.experimental.cpo import CPOConfig as Config
        from trl.experimental.cpo import CPOTrainer as Trainer
    else:
        from trl.experimental.orpo import ORPOConfig as Config
        from trl.experimental.orpo import ORPOTrainer as Trainer
    model_path = model_path or build_tiny_model(workdir / "model")
    args = {**COMMON, "output_dir": str(workdir / "out"), "max_length": 24, **config}
    ds = datasets.Dataset.from_dict({"prompt": sentences(n_pairs, 16), "chosen": sentences(n_pairs, 17),
                                     "rejected": sentences(n_pairs, 18)})
    model = AutoModelForCausalLM.from_pretrained(model_path)
    tok = AutoTokenizer.from_pretrained(model_path)
    return Trainer(model=model, args=Config(**args), train_dataset=ds, processing_class=tok, callbacks=list(callbacks))


def run_cpo_orpo(kind: str, workdir: Path, *, n_pairs: int, model_path: str | None = None, iterable: bool = False,
                 **config: Any) -> TRLRun:
    """Train TRL's experimental CPOTrainer (``kind`` "cpo") or ORPOTrainer ("orpo") on ``n_pairs`` generated
    preference pairs, recording the locals of ``concatenated_forward``, the loss function and
    ``get_batch_loss_metrics`` as they return (one of each per micro-batch, in order). ``iterable``: the tokenized
    rows handed to the Trainer without a length (see :func:`run_online_dpo`)."""
    rec = log_recorder()
    trainer = _cpo_orpo_trainer(kind, workdir, n_pairs=n_pairs, model_path=model_path, callbacks=[rec], **config)
    if iterable:        # the tokenized rows without a length: accelerate knows no remainder, truncates no gather
        trainer.train_dataset = trainer.train_dataset.to_iterable_dataset()
    loss_fn = "cpo_loss" if kind == "cpo" else "odds_ratio_loss"
    return train_recording(trainer, rec, ("concatenated_forward", loss_fn, "get_batch_loss_metrics"))


def paired(run: TRLRun) -> list[Call]:
    """CPO/ORPO: one :class:`Call` per micro-batch, ``get_batch_loss_metrics``'s locals with those of the recorded
    functions that returned during it or just before it (``concatenated_forward`` under ``fwd``, the loss function
    ``cpo_loss`` / ``odds_ratio_loss`` under ``loss_fn``)."""
    out, extra = [], {}
    for c in run.calls:
        if c.name == "get_batch_loss_metrics":
            out.append(Call(c.name, c.step, {**c.locals, **extra}))
            extra = {}
        else:
            extra["fwd" if c.name == "concatenated_forward" else "loss_fn"] = c.locals
    return out


def label_logps(fwd: dict[str, Any], chosen: bool) -> list[list[float]]:
    """Each chosen (rejected) sequence's per-token log-prob of its label tokens (labels != -100, shifted by one), from
    the logits ``concatenated_forward`` computed: the tokens ``get_batch_logps`` averages or sums."""
    import torch
    logits = fwd["all_logits"].detach().float()[:, :-1, :]
    labels = fwd["concatenated_batch"]["concatenated_labels"][:, 1:]
    n = int(fwd["len_chosen"])
    keep = labels != -100
    lp = torch.log_softmax(logits, dim=-1).gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    rows = range(n) if chosen else range(n, labels.shape[0])
    return [[float(v) for v in lp[i][keep[i]]] for i in rows]


def label_nll(fwd: dict[str, Any]) -> list[list[float]]:
    """Each chosen sequence's per-token -log p of the labels ``concatenated_forward``'s ``cross_entropy_loss`` was
    given (its local ``labels``, shifted by one; -100 ignored): the tokens CrossEntropyLoss averages."""
    import torch
    n = int(fwd["len_chosen"])
    logits = fwd["all_logits"].detach().float()[:n, :-1, :]
    labels = fwd["labels"][:n, 1:]
    keep = labels != -100
    lp = torch.log_softmax(logits, dim=-1).gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return [[-float(v) for v in lp[i][keep[i]]] for i in range(n)]


def per_call_obs(run: TRLRun, calls: list[Call], key: str, values: Callable[[dict[str, Any]], list]) -> list:
    """(logged value, batch) of every train row that logged ``key``: each optimizer step of the row one mini-batch
    of one rank, holding the step's calls (micro-batches) as ``values(locals)``."""
    out = []
    for i, (_s, row) in enumerate(run.train_rows()):
        if key not in row:
            continue
        first, last = run.windows[i]
        steps = [[[[values(c.locals) for c in calls if c.step == step]]] for step in range(first, last + 1)]
        out.append((row[key], [s for s in steps if s[0][0]]))
    assert out, f"no train row logged {key!r}"
    return out


# ------------------------------------------------------------------------------------------------------- ranks
@dataclass
class RankRun:
    """What a loss method did on every simulated rank: each rank's recorded calls (one per micro-batch, ``.step``
    the 1-based optimizer step) and the rows each rank's ``log`` gave; ``windows``: (first, last) step of each row."""
    calls: list[list[Call]]
    rows: list[list[dict]]
    windows: list[tuple[int, int]]

    def steps(self, row: int, values: Callable[[dict[str, Any]], list]) -> list:
        """``[step][mini-batch][rank][micro-batch]`` of ``values(locals)`` of the row's calls."""
        first, last = self.windows[row]
        return [[[[values(c.locals) for c in self.calls[r] if c.step == s] for r in range(len(self.calls))]]
                for s in range(first, last + 1)]

    def obs(self, key: str, values: Callable[[dict[str, Any]], list], rank: int = 0) -> list:
        out = [(row[key], self.steps(i, values)) for i, row in enumerate(self.rows[rank])]
        assert out, f"{key!r} was not logged"
        return out


def _state_and_logs(trainer: Any) -> list[dict]:
    """A Trainer's state, control and a callback handler keeping what ``Trainer.log`` hands ``on_log`` (as
    tests/_support/proofs_trl_grpo.py sets them for GRPO)."""
    from transformers.trainer_callback import TrainerControl, TrainerState
    logs: list[dict] = []
    trainer.state = TrainerState()
    trainer.state.num_input_tokens_seen = 0
    trainer.control = TrainerControl()
    trainer.callback_handler = types.SimpleNamespace(
        on_log=lambda a, s, c, logged: (logs.append(dict(logged)), c)[1])
    return logs


def tpo_like(args: Any, model: Any) -> Any:
    """A TPOTrainer without __init__: what __init__ sets for ``_compute_loss`` and ``log``
    (trl/experimental/tpo/tpo_trainer.py@v1.16.0 __init__: loss_type, beta, label_smoothing, tpo_alpha, tpo_l_gamma,
    _metrics, _total_train_tokens, _tp_size), the rank's simulated accelerator."""
    from trl.experimental.tpo import TPOTrainer

    from .framework_code import SimAccelerator
    self = TPOTrainer.__new__(TPOTrainer)
    self.__dict__.update(accelerator=SimAccelerator(), args=args, model=model, loss_type=args.loss_type,
                         beta=args.beta, label_smoothing=args.label_smoothing, tpo_alpha=args.tpo_alpha,
                         tpo_l_gamma=args.tpo_l_gamma, _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
                         _total_train_tokens=0, _tp_size=1)
    return self


def triples(rng: random.Random, n: int, vocab: tuple[int, int]) -> list[dict[str, list[int]]]:
    """``n`` tokenized (prompt, chosen, rejected, reference) rows of uneven lengths, as TPO's collator takes them."""
    def ids(lo: int, hi: int) -> list[int]:
        return [rng.randrange(*vocab) for _ in range(rng.randint(lo, hi))]
    return [{"prompt_ids": ids(1, 4), "chosen_ids": ids(1, 6), "rejected_ids": ids(1, 6), "reference_ids": ids(1, 5)}
            for _ in range(n)]


def run_tpo_on_ranks(workdir: Path, *, sizes: Sequence[Sequence[int]], rows: Sequence[int], ga: int,
                     seed: int = 0, **config: Any) -> RankRun:
    """TPOTrainer._compute_loss (the installed release) on 2 simulated ranks, micro-batch by micro-batch: rank r's
    micro-batch u of step s holds ``sizes[r][(s * ga + u) % len(sizes[r])]`` triples (collated by TPO's own
    DataCollatorForTriplePreference), the tiny model in training mode; after each row's steps, the trainer's own
    ``log({})``. The locals of every call are recorded as it appends to ``_metrics``."""
    import torch
    from transformers import AutoModelForCausalLM
    from trl.experimental.tpo import TPOConfig
    from trl.experimental.tpo.tpo_trainer import DataCollatorForTriplePreference

    from .framework_code import WORLD, run_ranks
    model_path = build_tiny_model(workdir / "model")
    args = TPOConfig(output_dir=str(workdir / "out"), report_to="none", use_cpu=True, gradient_accumulation_steps=ga,
                     logging_steps=rows[0], **config)
    windows, first = [], 1
    for n in rows:
        windows.append((first, first + n - 1))
        first += n
    rng = random.Random(seed)
    n_steps = first - 1
    batches = [[[triples(rng, sizes[r][(s * ga + u) % len(sizes[r])], (4, 30)) for u in range(ga)]
                for r in range(WORLD)] for s in range(n_steps)]
    collate = DataCollatorForTriplePreference(pad_token_id=0)

    def load() -> Any:      # in this thread: from_pretrained is not thread-safe (its meta-device context is global)
        model = AutoModelForCausalLM.from_pretrained(model_path)
        with torch.no_grad():       # uneven next-token distributions (a fresh tiny model's are near uniform)
            gen = torch.Generator().manual_seed(0)
            emb = 0.3 * torch.randn(model.get_input_embeddings().weight.shape, generator=gen)
            model.get_input_embeddings().weight.copy_(emb)
            model.get_output_embeddings().weight.copy_(emb)
        return model.train()
    models = [load() for _ in range(WORLD)]

    def rank(r: int) -> tuple[list, list]:
        model = models[r]
        trainer = tpo_like(args, model)
        logs = _state_and_logs(trainer)
        rec = MetricsRecorder(trainer)
        try:
            for lo, hi in windows:
                for s in range(lo, hi + 1):
                    trainer.state.global_step = s - 1
                    for micro in batches[s - 1][r]:
                        type(trainer)._compute_loss(trainer, model, collate(micro), False)
                    trainer.state.global_step = s
                type(trainer).log(trainer, {})
        finally:
            rec.close()
        return rec.calls, logs

    with one_thread():
        out = run_ranks(rank, WORLD)
    return RankRun([c for c, _ in out], [lg for _, lg in out], windows)


def run_cpo_orpo_on_ranks(kind: str, workdir: Path, *, sizes: Sequence[Sequence[int]], rows: Sequence[int],
                          ga: int, **config: Any) -> RankRun:
    """CPOTrainer's (``kind`` "cpo") or ORPOTrainer's ("orpo") own ``compute_loss`` and ``log`` (the installed
    release) on 2 simulated ranks: each rank a trainer built by its own __init__ (in this thread) whose accelerator
    is then the rank's SimAccelerator; rank r's micro-batch u of step s holds ``sizes[r][(s * ga + u) %
    len(sizes[r])]`` of the trainer's tokenized pairs, collated by its own data collator. The locals of
    ``concatenated_forward``, the loss function and ``get_batch_loss_metrics`` are recorded as they return (as
    :func:`run_cpo_orpo`), then paired per micro-batch (:func:`paired`)."""

    from .framework_code import WORLD, SimAccelerator, run_ranks
    windows, first = [], 1
    for n in rows:
        windows.append((first, first + n - 1))
        first += n
    n_steps = first - 1
    need = sum(sizes[r][(s * ga + u) % len(sizes[r])] for r in range(WORLD) for s in range(n_steps)
               for u in range(ga))
    model_path = build_tiny_model(workdir / "model")
    made = [_cpo_orpo_trainer(kind, workdir / f"rank{r}", n_pairs=need, model_path=model_path,
                              gradient_accumulation_steps=ga, logging_steps=rows[0], **config) for r in range(WORLD)]
    data = made[0].train_dataset
    rows_of, at = [], 0
    for s in range(n_steps):
        step = []
        for r in range(WORLD):
            micro = []
            for u in range(ga):
                n = sizes[r][(s * ga + u) % len(sizes[r])]
                micro.append([data[i] for i in range(at, at + n)])
                at += n
            step.append(micro)
        rows_of.append(step)
    loss_fn = "cpo_loss" if kind == "cpo" else "odds_ratio_loss"

    def rank(r: int) -> tuple[list, list]:
        trainer = made[r]
        trainer.accelerator = SimAccelerator()
        logs = _state_and_logs(trainer)
        model = trainer.model
        model.train()
        rec = ReturnRecorder(trainer, ("concatenated_forward", loss_fn, "get_batch_loss_metrics"))
        with rec:
            for lo, hi in windows:
                for s in range(lo, hi + 1):
                    trainer.state.global_step = s - 1
                    for micro in rows_of[s - 1][r]:
                        batch = trainer.data_collator(micro)
                        type(trainer).compute_loss(trainer, model, batch)
                    trainer.state.global_step = s
                type(trainer).log(trainer, {"loss": 0.0})
        calls = paired(TRLRun(config={}, rows=[], calls=rec.calls))
        return calls, logs

    with one_thread():
        out = run_ranks(rank, WORLD)
    return RankRun([c for c, _ in out], [lg for _, lg in out], windows)


def run_online_dpo_on_ranks(workdir: Path, *, sizes: Sequence[Sequence[int]], rows: Sequence[int], ga: int,
                            **config: Any) -> RankRun:
    """OnlineDPOTrainer's own ``training_step`` and ``_maybe_log_save_evaluate`` (the installed release) on 2 simulated
    ranks: each rank a trainer built by its own __init__ (in this thread); the completions of every micro-batch are
    sampled first, here, by the trainer's own ``_generate`` (the real accelerator), and handed back to
    ``training_step`` in the rank's thread (its ``_generate`` then returns them), whose accelerator is the rank's
    SimAccelerator (``backward`` a no-op: no update, the metrics only). Rank r's micro-batch u of step s holds
    ``sizes[r][(s * ga + u) % len(sizes[r])]`` prompts. The locals of ``training_step`` (with what gather_for_metrics
    returned) are recorded as it returns; after each row's steps the trainer's own ``_maybe_log_save_evaluate``
    logs. The loss is not reduced over the simulated ranks (nested_gather is torch.distributed's): not for it."""
    import torch

    from .framework_code import WORLD, SimAccelerator, run_ranks
    windows, first = [], 1
    for n in rows:
        windows.append((first, first + n - 1))
        first += n
    n_steps = first - 1
    model_path = build_tiny_model(workdir / "model")
    made = [_online_dpo_trainer(workdir / f"rank{r}", n_prompts=4, model_path=model_path,
                                gradient_accumulation_steps=ga, logging_steps=rows[0], **config)
            for r in range(WORLD)]
    prompts = sentences(200, 21)
    plan, at = [], 0
    torch.manual_seed(0)
    for s in range(n_steps):
        step = []
        for r in range(WORLD):
            micro = []
            for u in range(ga):
                n = sizes[r][(s * ga + u) % len(sizes[r])]
                batch = prompts[at:at + n]
                at += n
                micro.append((batch, made[r]._generate(made[r].model, batch)))
            step.append(micro)
        plan.append(step)

    def rank(r: int) -> tuple[list, list]:
        trainer = made[r]
        acc = SimAccelerator()
        acc.backward = lambda loss, **kw: None
        trainer.accelerator = acc
        logs = _state_and_logs(trainer)
        # what Trainer._inner_training_loop sets before the loop (transformers/trainer.py@v5.24.0)
        trainer._globalstep_last_logged, trainer._total_loss_scalar, trainer.current_flos = 0, 0.0, 0
        model = trainer.model
        queue: list[Any] = []
        trainer._generate = lambda model, prompts, images=None: queue.pop(0)
        rec = ReturnRecorder(trainer, ("training_step",))
        with rec:
            for lo, hi in windows:
                tr_loss = torch.zeros(())
                for s in range(lo, hi + 1):
                    trainer.state.global_step = s - 1
                    for batch, generated in plan[s - 1][r]:
                        queue.append(generated)
                        tr_loss = tr_loss + type(trainer).training_step(trainer, model, {"prompt": batch})
                    trainer.state.global_step = s
                trainer.control.should_log = True
                type(trainer)._maybe_log_save_evaluate(trainer, tr_loss, None, model, None, 0.0, None, None,
                                                       learning_rate=1e-3)
        return rec.calls, logs

    with one_thread():
        out = run_ranks(rank, WORLD)
    return RankRun([c for c, _ in out], [lg for _, lg in out], windows)


# ------------------------------------------------------------------------------------------------------- unproven
#: entries of mappings/trl.yaml covering trl 1.16.0 that no proof of this group fingerprints, and why
ENTRY_WHY: dict[tuple[str, str, str | None], str] = {
    ("trl", "completions", None): "a table of completion texts (W&B/Trackio, stat dist over samples): no numeric "
                                  "value to fingerprint",
    ("trl", "game_log", None): "a table of generated texts (legacy generate_during_eval): no numeric value to "
                               "fingerprint",
    ("trl", "win_rate_completions", None): "a table of policy and reference completions with the judge's verdict: "
                                           "no numeric value to fingerprint",
    ("trl", "win_rate", None): "WinRateCallback is not in the installed trl 1.16.0 (no win_rate anywhere in the "
                               "wheel; the entry cites trl/trainer/callbacks.py@v0.25.1): no code to run",
    ("trl", "avg_win_prob", None): "WinRateCallback is not in the installed trl 1.16.0 (no avg_win_prob anywhere in "
                                   "the wheel; the entry cites trl/trainer/callbacks.py@v0.25.1): no code to run",
    ("trl", "beta", "online_dpo"): "a constant in every run trl 1.16.0 can make: a list beta (the schedule the entry "
                                   "allows for) raises TypeError at its first fractional state.epoch "
                                   "(online_dpo_trainer.py@v1.16.0:597, self._beta[epoch] with a float epoch), and a "
                                   "constant is every candidate reduction's value, so no batch tells them apart",
    ("trl", "profiling/Time taken: {fn}", None): "a raw wall-clock timer of one call (profiling_decorator), written "
                                                 "directly to W&B/MLflow/Trackio on the main process",
    ("trl", "time/ppo/{stage}", "ppo_legacy"): "the legacy step()-API PPOTrainer (v0.2.0-v0.11.4) is not in the "
                                               "installed trl 1.16.0; and its values are raw wall-clock timers",
    ("trl", "accuracy", "prm"): "PRMTrainer was removed after v1.13.0: the installed trl 1.16.0 has no "
                                "trl/trainer/prm_trainer.py to run",
}
