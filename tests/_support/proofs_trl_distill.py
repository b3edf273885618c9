"""Real TRL distillation trainers run on CPU for the fingerprint proofs of mappings/trl.yaml (issue 33): the
DistillationTrainer (trl/trainer/distillation_trainer.py), the experimental SDPOTrainer
(trl/experimental/sdpo/sdpo_trainer.py) and GKDTrainer (trl/experimental/gkd/gkd_trainer.py) of the installed wheel
train a tiny model built in code (tests/_support/tiny_trl.py) for a few optimizer steps, and every row they log is
read through a callback's on_log. The experimental AsyncGRPOTrainer's metric code (compute_loss, its collator's
_log_metrics, the rollout loop's _push_rollout_metrics, log) and AsyncDistillationTrainer's (_compute_loss with the
tiny model as student, log) run on objects built without __init__ (they need a vLLM server and a teacher server
otherwise): :func:`run_async_grpo_loss` and :func:`run_async_distillation_loss` on 2 simulated ranks,
:func:`async_log`.

What the framework computed is recorded as in tests/_support/proofs_trl.py (the trainer's ``_metrics`` lists copy the
locals of the TRL function appending), with two additions, both pass-through recorders:

* :class:`CallerRecorder` also keeps the locals of the appending function's caller (``__caller__``): SDPO appends its
  distillation loss in ``_log_self_distillation_metric``, called by ``_compute_self_distillation_loss``, which holds
  the per-token loss and the mask the value was reduced from.
* :func:`recording_divergence` replaces the name ``ChunkedDivergenceFunction`` in the DistillationTrainer's module by
  an object whose ``apply`` calls TRL's own ``ChunkedDivergenceFunction.apply`` and keeps a detached copy of the
  per-token divergence and entropy it returned (TRL's values, which ``_chunked_divergence_loss`` then sums): one
  entry per call of ``compute_loss``.

Nothing here computes a metric: the proofs arrange TRL's own per-token (per-sequence) values as the nested batch of
tests/_support/fingerprint.py. One process (the gathers are the identity): the process level is not told apart here.
"""
from __future__ import annotations

import atexit
import contextlib
import functools
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable, Sequence

from .proofs_trl import COMMON, MetricsRecorder, OptimizerSteps, TRLRun, one_thread_quiet, suppress_all_but
from .tiny_trl import build_tiny_model, log_recorder, sentences


class CallerRecorder(MetricsRecorder):
    """:class:`~_support.proofs_trl.MetricsRecorder` that also keeps, under ``__caller__``, the locals of the
    caller of the function appending to ``_metrics``."""

    def _seen(self, frame: Any) -> None:
        super()._seen(frame)
        caller = frame.f_back
        self.calls[-1].locals["__caller__"] = dict(caller.f_locals) if caller is not None else {}


@contextlib.contextmanager
def recording_divergence(out: list[tuple[Any, Any]]):
    """While open, TRL's DistillationTrainer calls ``ChunkedDivergenceFunction.apply`` through a pass-through that
    appends (per-token divergence, per-token entropy), detached, to ``out``."""
    import trl.trainer.distillation_trainer as mod

    original = mod.ChunkedDivergenceFunction

    class Recording:
        @staticmethod
        def apply(*args: Any) -> Any:
            div, ent = original.apply(*args)
            out.append((div.detach().clone(), ent.detach().clone()))
            return div, ent

    mod.ChunkedDivergenceFunction = Recording
    try:
        yield out
    finally:
        mod.ChunkedDivergenceFunction = original


def train(trainer: Any, rec: Any) -> TRLRun:
    """``trainer.train()`` with the recorders attached (as ``proofs_trl.train``, with :class:`CallerRecorder`)."""

    calls = CallerRecorder(trainer)
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


def perturbed_teacher(model_path: str, seed: int = 1, scale: float = 0.5) -> Any:
    """The tiny model with noise added to every weight: a teacher whose distribution differs from the student's
    (the same tokenizer and vocabulary), so the divergence is not 0."""
    import torch
    from transformers import AutoModelForCausalLM

    teacher = AutoModelForCausalLM.from_pretrained(model_path)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in teacher.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * scale)
    return teacher


def run_distillation(workdir: Path, **config: Any) -> tuple[TRLRun, list[tuple[Any, Any]]]:
    """Train TRL's DistillationTrainer (student: the tiny model; teacher: a perturbed copy) with ``config``
    (DistillationConfig fields over small defaults): the run and, per ``compute_loss`` call, TRL's per-token
    divergence and entropy (flattened (B * K,), every position: the CPU path projects every position and masks)."""
    import datasets
    from trl import DistillationConfig, DistillationTrainer

    model_path = build_tiny_model(workdir / "model")
    args = {**COMMON, "output_dir": str(workdir / "out"), "max_completion_length": 8, **config}
    args.setdefault("generation_kwargs", {"suppress_tokens": suppress_all_but(model_path)})
    ds = datasets.Dataset.from_dict({"prompt": sentences(256, 1)})
    rec = log_recorder()
    trainer = DistillationTrainer(model=model_path, teacher_model=perturbed_teacher(model_path),
                                  args=DistillationConfig(**args), train_dataset=ds, callbacks=[rec])
    outputs: list[tuple[Any, Any]] = []
    with recording_divergence(outputs):
        run = train(trainer, rec)
    return run, outputs


def words_reward(completions: Sequence[str], **kwargs: Any) -> list[float]:
    """1 for a completion of two words or more (SDPO's success threshold is met: most groups hold a successful
    rollout to reprompt with), 0 otherwise."""
    return [float(len(c.split()) >= 2) for c in completions]


def cat_bonus(completions: Sequence[str], **kwargs: Any) -> list[float | None]:
    """0.25 for a completion naming the cat, 0 otherwise, None for every fifth completion (TRL's nan-aware means
    leave it out); too small to move a summed reward across SDPO's success threshold of 0.5."""
    return [None if i % 5 == 4 else 0.25 * float("cat" in c) for i, c in enumerate(completions)]


def run_sdpo(workdir: Path, reward_funcs: Sequence[Callable] | None = None, **config: Any) -> TRLRun:
    """Train TRL's experimental SDPOTrainer (self-distillation: the teacher is the student reprompted with a
    successful rollout) with ``config`` (SDPOConfig fields over small defaults)."""
    import datasets
    from trl.experimental.sdpo import SDPOConfig, SDPOTrainer

    model_path = build_tiny_model(workdir / "model")
    args = {**COMMON, "output_dir": str(workdir / "out"), "max_completion_length": 8, **config}
    args.setdefault("generation_kwargs", {"suppress_tokens": suppress_all_but(model_path)})
    ds = datasets.Dataset.from_dict({"prompt": sentences(256, 1)})
    rec = log_recorder()
    trainer = SDPOTrainer(model=model_path, reward_funcs=list(reward_funcs or (words_reward, cat_bonus)),
                          args=SDPOConfig(**args), train_dataset=ds, callbacks=[rec])
    return train(trainer, rec)


# ------------------------------------------------------------------------------------------- AsyncGRPOTrainer
#: AsyncGRPO's micro-batches: [optimizer step][rank][micro-batch] = the completion lengths of the sequences packed
#: into that rank's row (uneven over ranks, micro-batches and steps)
ASYNC_LENGTHS = (((( 3, 5), (2,)), ((4, 1, 6), (7, 2))),
                 (((2, 2, 3), (5, 1)), ((6,), (3, 4, 2))))
ASYNC_EPSILON = 0.2


def _async_inputs(lengths: Sequence[int], rng: Any, falling: bool = False) -> tuple[dict[str, Any], dict[str, Any]]:
    """One packed row as AsyncGRPO's collator gives compute_loss (one prompt token, then the completion tokens, per
    sequence; token_index -1 at the prompt tokens), and what the stand-in forward returns at each position.
    ``falling``: every advantage negative and the new log-probs below the old ones (most tokens clipped low)."""
    import torch

    world = 2
    pos, token_index, segment, adv = 0, [], [], []
    for i, n in enumerate(lengths):
        a = (-1.0 if falling else rng.choice((-1.0, 1.0))) * rng.uniform(0.5, 1.5)
        token_index.append(-1)
        segment.append(0)
        adv.append(0.0)
        pos += 1
        for _ in range(n):
            token_index.append(pos)
            segment.append(i)
            adv.append(a)
            pos += 1
    total = pos
    old = [rng.uniform(-3.0, -0.5) for _ in range(total)]
    inputs = {
        "input_ids": torch.ones(1, total, dtype=torch.long),
        "attention_mask": torch.ones(1, total, dtype=torch.long),
        "position_ids": torch.arange(total).unsqueeze(0),
        "shift_labels": torch.ones(1, total, dtype=torch.long),
        "token_index": torch.tensor([token_index]),
        "old_log_probs": torch.tensor([old]),
        "advantages": torch.tensor([adv]),
        "segment_id": torch.tensor([segment]),
        "global_n_tokens": torch.tensor([float(sum(lengths) * world)]),   # only read for the loss's scale
        "global_n_forward_tokens": torch.tensor([float(total)]),
        "mean_seq_len": torch.tensor([float(total) / len(lengths)]),
        "tree_kv_index": torch.full((1, 4), -1), "tree_cu_seqlens_q": torch.full((1, 4), -1),
        "tree_cu_seqlens_k": torch.full((1, 4), -1), "tree_max_seqlens": torch.tensor([[total, total]]),
    }
    shift = (-0.8, 0.0) if falling else (-0.4, 0.4)
    forward = {"log_probs": torch.tensor([[o + rng.uniform(*shift) for o in old]]),
               "entropy": torch.tensor([[rng.uniform(0.2, 2.0) for _ in range(total)]])}
    return inputs, forward


def run_async_grpo_loss(lengths: Sequence = ASYNC_LENGTHS, seed: int = 0, falling: bool = False,
                        aux: bool = False) -> list[tuple[dict[str, Any], list]]:
    """AsyncGRPOTrainer.compute_loss (trl/experimental/async_grpo/async_grpo_trainer.py), the installed code, on 2
    simulated ranks (accelerator.reduce/gather meet across threads: tests/_support/framework_code.py) for the
    optimizer steps and micro-batches of ``lengths``, then AsyncGRPOTrainer.log() over them (its _reduce_metric,
    then the Trainer's log). The trainer is built without __init__ (no model, no vLLM server, no rollout worker):
    compute_loss gets the packed rows a collator would give it, and the model is a stand-in returning per-position
    log-probs and entropies (and, with ``aux``, an MoE router's load-balancing loss: aux_loss_enabled); every metric
    is computed and aggregated by TRL's code from them. Per rank: (the row log() logged, the recorded compute_loss
    calls)."""
    import random
    import types
    from collections import defaultdict

    from transformers import TrainerState
    from trl.experimental.async_grpo.async_grpo_trainer import AsyncGRPOTrainer

    from .framework_code import SimAccelerator, run_ranks

    def rank(r: int) -> tuple[dict[str, Any], list]:
        rng = random.Random(1000 * seed + r)
        trainer = AsyncGRPOTrainer.__new__(AsyncGRPOTrainer)
        trainer.accelerator = SimAccelerator()
        trainer.epsilon_low = trainer.epsilon_high = ASYNC_EPSILON
        trainer.aux_loss_enabled = aux
        trainer.router_aux_loss_coef = 0.01
        trainer.state = TrainerState()
        trainer._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
        trainer.rollout_worker = None
        for name in ("_step_forward_tokens", "_step_trained_tokens", "_step_seq_len_weighted", "_step_samples",
                     "_step_forward_s"):
            setattr(trainer, name, 0.0)
        logged: dict[str, Any] = {}
        trainer.args = types.SimpleNamespace(include_num_input_tokens_seen="no")
        trainer.control = None
        trainer.callback_handler = types.SimpleNamespace(
            on_log=lambda args, state, control, logs: logged.update(logs))
        calls = MetricsRecorder(trainer)
        forward: dict[str, Any] = {}

        def model(**kw: Any) -> Any:
            return types.SimpleNamespace(**forward)
        model.training = True                               # type: ignore[attr-defined]
        trainer.model = model
        for step, ranks in enumerate(lengths):
            trainer.state.global_step = step
            micros = ranks[r]
            trainer.current_gradient_accumulation_steps = len(micros)
            for micro in micros:
                inputs, out = _async_inputs(micro, rng, falling)
                if aux:
                    import torch
                    out["aux_loss"] = torch.tensor(rng.uniform(0.5, 3.0))
                forward.clear()
                forward.update(out)
                trainer.compute_loss(model, inputs)
        trainer.state.global_step = len(lengths)
        trainer.log({})
        calls.close()
        return logged, calls.calls

    return run_ranks(rank)


def async_log(fill: Callable[[dict[str, list], Any], None]) -> dict[str, Any]:
    """AsyncGRPOTrainer.log() (the installed code) on a trainer built without __init__, after ``fill(sink, worker)``
    filled its metric sink (``_metrics['train']``) or its rollout worker's metrics queue (a stand-in holding a
    ``queue.Queue``, which log() drains on the main process): the row it hands to the Trainer's log."""
    import queue
    import types
    from collections import defaultdict

    from transformers import TrainerState
    from trl.experimental.async_grpo.async_grpo_trainer import AsyncGRPOTrainer

    trainer = AsyncGRPOTrainer.__new__(AsyncGRPOTrainer)
    trainer.accelerator = types.SimpleNamespace(is_main_process=True)
    trainer.state = TrainerState()
    trainer._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
    trainer.model = types.SimpleNamespace(training=True)
    trainer.rollout_worker = types.SimpleNamespace(metrics_queue=queue.Queue())
    logged: dict[str, Any] = {}
    trainer.args = types.SimpleNamespace(include_num_input_tokens_seen="no")
    trainer.control = None
    trainer.callback_handler = types.SimpleNamespace(on_log=lambda args, state, control, logs: logged.update(logs))
    fill(trainer._metrics["train"], trainer.rollout_worker)
    trainer.log({})
    return logged


def collate_metrics(sink: dict[str, list], micro_batches: Sequence[Sequence[dict[str, Any]]]) -> None:
    """DataCollatorForRollout._log_metrics (the installed code: what rank 0's collator appends for each micro-batch
    it packs) for each micro-batch of samples, each ``{"input_ids", "completion_mask", "metrics"}`` as the rollout
    queue yields them (``metrics``: the rollout worker's per-sample reward, reward_std, rewards/<func>); one packed
    row per sample (the packing statistics are not read here)."""
    import types

    import torch
    from trl.experimental.async_grpo.async_grpo_trainer import DataCollatorForRollout

    collator = DataCollatorForRollout(pad_token_id=0, num_processes=1, metrics=sink)
    for examples in micro_batches:
        rows = [types.SimpleNamespace(tokens=list(e["input_ids"]), load=float(len(e["input_ids"]))) for e in examples]
        collator._log_metrics(rows=rows, all_examples=list(examples),
                              padded=torch.ones(len(rows), max(len(r.tokens) for r in rows), dtype=torch.long))


def rollout_worker_pushes(worker_sink: Any, completions: Sequence[Sequence[int]], eos: int = 3) -> None:
    """The rollout worker's _AsyncRolloutLoop._push_rollout_metrics (the installed code) once per completion (its
    token ids), on a loop built without __init__ whose metrics queue is the stand-in trainer's: what the worker
    pushes per rollout (the completion-length rate pair, the min/max gauges)."""
    import types
    from collections import defaultdict

    from trl.experimental.async_grpo.async_rollout_worker import _AsyncRolloutLoop

    worker = _AsyncRolloutLoop.__new__(_AsyncRolloutLoop)
    worker._counters = defaultdict(float)
    worker._rates = defaultdict(lambda: [0.0, 0.0])
    worker._metrics_queue = worker_sink.metrics_queue
    worker.eos_token_ids = [eos]
    worker.tokenizer = types.SimpleNamespace(pad_token_id=0)
    worker.tools = None
    tally = {"transitions": 0, "fork": 0, "realign": 0, "drift_tokens": 0, "drift_max": 0.0}
    for ids in completions:
        worker._push_rollout_metrics(turns=1, sequences=1, completion_ids=list(ids), tally=tally,
                                     loop_exhausted=False, duration_s=0.1)


# ------------------------------------------------------------------------------------------- GKDTrainer
def run_gkd(workdir: Path, **config: Any) -> tuple[TRLRun, list[dict[str, Any]]]:
    """Train TRL's experimental GKDTrainer (an SFTTrainer distilling a perturbed copy of the student) on generated
    chat 'messages' (off-policy with lmbda 0: the data set's completions) with ``config`` (GKDConfig fields over
    small defaults). Each call of its ``generalized_jsd_loss`` goes through a pass-through that also asks TRL's own
    function for the unreduced divergence (``reduction='none'``, no num_items_in_batch: the masked positions' terms
    over the vocabulary) and keeps, per call, the optimizer step, each sequence's per-token divergences (the terms
    summed over the vocabulary, split by the label mask's rows) and the num_items_in_batch it was given."""
    import datasets
    import torch
    from trl.experimental.gkd import GKDConfig, GKDTrainer

    model_path = build_tiny_model(workdir / "model")
    args = {**COMMON, "output_dir": str(workdir / "out"), "max_length": 32, "lmbda": 0.0, **config}
    n = 64
    ds = datasets.Dataset.from_dict({"messages": [[{"role": "user", "content": p}, {"role": "assistant", "content": c}]
                                                  for p, c in zip(sentences(n, 11), sentences(n, 12))]})
    rec = log_recorder()
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(model_path)
    trainer = GKDTrainer(model=model_path, teacher_model=perturbed_teacher(model_path), args=GKDConfig(**args),
                         train_dataset=ds, processing_class=tok, callbacks=[rec])
    calls: list[dict[str, Any]] = []

    def recording(**kw: Any) -> Any:
        loss = GKDTrainer.generalized_jsd_loss(**kw)
        with torch.no_grad():
            terms = GKDTrainer.generalized_jsd_loss(**{**kw, "num_items_in_batch": None, "reduction": "none"})
            per_token = terms.sum(-1).detach().float()
            counts = (kw["labels"] != -100).sum(-1).tolist()
            seqs, at = [], 0
            for c in counts:
                if c:
                    seqs.append(per_token[at:at + c].tolist())
                at += c
        nib = kw.get("num_items_in_batch")
        calls.append({"step": trainer.state.global_step + 1, "seqs": seqs,
                      "num_items_in_batch": None if nib is None else float(nib)})
        return loss
    trainer.generalized_jsd_loss = recording
    return train(trainer, rec), calls


# ------------------------------------------------------------------------------------------- IWOPDTrainer
def run_iwopd(workdir: Path, **config: Any) -> TRLRun:
    """Train TRL's experimental IWOPDTrainer (importance-weighted on-policy distillation, lmbda 1.0; teacher: a
    perturbed copy of the student) on generated chat 'messages' with ``config`` (IWOPDConfig fields over small
    defaults). Its sampling is kept to a few tokens besides EOS (the generation config's suppress_tokens, set after
    construction: IWOPDConfig has no generation_kwargs), so completions end at uneven lengths."""
    import datasets
    from transformers import AutoTokenizer
    from trl.experimental.iw_opd import IWOPDConfig, IWOPDTrainer

    model_path = build_tiny_model(workdir / "model")
    args = {**COMMON, "output_dir": str(workdir / "out"), "max_completion_length": 8, "lmbda": 1.0, **config}
    n = 256
    ds = datasets.Dataset.from_dict({"messages": [[{"role": "user", "content": p}, {"role": "assistant", "content": c}]
                                                  for p, c in zip(sentences(n, 13), sentences(n, 14))]})
    rec = log_recorder()
    trainer = IWOPDTrainer(model=model_path, teacher_model=perturbed_teacher(model_path), args=IWOPDConfig(**args),
                           train_dataset=ds, processing_class=AutoTokenizer.from_pretrained(model_path),
                           callbacks=[rec])
    suppress = suppress_all_but(model_path)
    trainer.generation_kwargs["suppress_tokens"] = suppress
    trainer.generation_config.suppress_tokens = suppress
    return train(trainer, rec)


# ------------------------------------------------------------------------------------------- AsyncDistillationTrainer
#: [optimizer step][rank][micro-batch] = (completion length, teacher index) of each sequence packed into the row
DISTILL_ROWS = (((((3, 0), (5, 1)), ((2, 1), (4, 0))), (((4, 0), (1, 0), (6, 1)), ((7, 1), (2, 0)))),
                ((((2, 1), (2, 0), (3, 0)), ((5, 1), (1, 0))), (((6, 0), (2, 1)), ((3, 1), (4, 0), (2, 1)))))
TEACHERS = ("math", "code")


@functools.lru_cache(maxsize=1)
def _student_path() -> str:
    """The tiny model AsyncDistillation's proofs use as student, built once per process (removed at exit)."""
    where = Path(tempfile.mkdtemp(prefix="trl-async-distill-"))
    atexit.register(shutil.rmtree, where, True)
    return build_tiny_model(where / "model")


def run_async_distillation_loss(rows: Sequence = DISTILL_ROWS, seed: int = 0) -> list[tuple[dict[str, Any], list]]:
    """AsyncDistillationTrainer._compute_loss (trl/experimental/async_distillation/async_distillation_trainer.py, the
    installed code) with the tiny model as student, on 2 simulated ranks, for the optimizer steps and micro-batches
    of ``rows`` (packed rows: one prompt token then the completion per sequence, each sequence scored by one of
    :data:`TEACHERS`, the teachers' top-4 candidates and log-probs at every position given as a teacher server
    would), then AsyncDistillationTrainer.log(). Built without __init__ (no teacher server, no vLLM rollout worker).
    The module's chunk size is set to 1 while it runs and its ``_jsd_loss_chunk`` goes through a pass-through that
    keeps each call's returned sums: TRL's own per-token jsd, student entropy and teacher entropy, in the order of
    the valid positions. Per rank: (the row log() logged, [(step, the call's locals, per-token stats)])."""
    import contextlib as _cl
    import random
    import types
    from collections import defaultdict

    import torch
    from transformers import AutoModelForCausalLM, TrainerState
    from trl.experimental.async_distillation import async_distillation_trainer as mod

    from .framework_code import SimAccelerator, run_ranks

    torch.manual_seed(seed)
    student = AutoModelForCausalLM.from_pretrained(_student_path())      # one student, read by both ranks' threads
    vocab = student.config.vocab_size
    original_chunk, original_size = mod._jsd_loss_chunk, mod._CHUNKED_LM_HEAD_CHUNK_SIZE
    per_token: dict[int, list] = defaultdict(list)

    def recording_chunk(*args: Any, **kw: Any) -> Any:
        out = original_chunk(*args, **kw)
        from .framework_code import current_rank
        per_token[current_rank()[1]].append(tuple(float(x) for x in out[1:4]))
        return out

    def rank(r: int) -> tuple[dict[str, Any], list]:
        rng = random.Random(1000 * seed + r)
        gen = torch.Generator().manual_seed(1000 * seed + r)          # not the global RNG the other rank's thread uses
        trainer = mod.AsyncDistillationTrainer.__new__(mod.AsyncDistillationTrainer)
        acc = SimAccelerator()
        acc.autocast = _cl.nullcontext
        trainer.accelerator = acc
        trainer.args = types.SimpleNamespace(beta=0.0, teacher_temperature=1.0, add_tail_bucket=True,
                                             include_num_input_tokens_seen="no")
        trainer._teacher_ids = list(TEACHERS)
        trainer.state = TrainerState()
        trainer._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
        trainer.rollout_worker = None
        for name in ("_step_forward_tokens", "_step_trained_tokens", "_step_seq_len_weighted", "_step_samples",
                     "_step_forward_s"):
            setattr(trainer, name, 0.0)
        logged: dict[str, Any] = {}
        trainer.control = None
        trainer.callback_handler = types.SimpleNamespace(on_log=lambda args, state, control, logs: logged.update(logs))
        trainer.model = types.SimpleNamespace(training=True)
        calls = []
        for step, ranks in enumerate(rows):
            trainer.state.global_step = step
            micros = ranks[r]
            trainer.current_gradient_accumulation_steps = len(micros)
            for seqs in micros:
                ids, comp, pos, teacher, segment = [], [], [], [], []
                for i, (n, t) in enumerate(seqs):
                    for k in range(n + 1):
                        ids.append(rng.randrange(4, vocab))
                        comp.append(int(k > 0))
                        pos.append(k)
                        teacher.append(t)
                        segment.append(i)
                total = len(ids)
                top_ids = torch.tensor([[rng.sample(range(4, vocab), 4) for _ in range(total)]])
                # the teacher's 4 most likely of 8 candidates: the tail keeps some probability mass
                top_lp = torch.log_softmax(torch.randn(1, total, 8, generator=gen) * 2, dim=-1)
                top_lp = top_lp.sort(dim=-1, descending=True).values
                top_lp = top_lp[..., :4]
                inputs = {"input_ids": torch.tensor([ids]), "attention_mask": torch.ones(1, total, dtype=torch.long),
                          "completion_mask": torch.tensor([comp]), "position_ids": torch.tensor([pos]),
                          "teacher_topk_ids": top_ids, "teacher_topk_logprobs": top_lp,
                          "teacher_id_idx": torch.tensor([teacher]),
                          "global_n_tokens": torch.tensor([float(sum(comp) * 2)]),
                          "global_n_forward_tokens": torch.tensor([float(total)]),
                          "mean_seq_len": torch.tensor([float(total) / len(seqs)])}
                start = len(per_token[r])
                trainer._compute_loss(student, inputs)
                calls.append((step + 1, {"segment": segment, "teacher": teacher, "completion_mask": comp},
                              per_token[r][start:]))
        trainer.state.global_step = len(rows)
        trainer.log({})
        return logged, calls

    mod._jsd_loss_chunk, mod._CHUNKED_LM_HEAD_CHUNK_SIZE = recording_chunk, 1
    try:
        return run_ranks(rank)
    finally:
        mod._jsd_loss_chunk, mod._CHUNKED_LM_HEAD_CHUNK_SIZE = original_chunk, original_size


# ------------------------------------------------------------------------------------------- what is not proven
_MOE = ("proof not written yet: an MoE model run with output_router_logits (the tiny Llama of "
        "tests/_support/tiny_trl.py has no router, so {trainer} never logs aux_loss); the async_grpo trainer's "
        "aux_loss is proven (test_proof_trl_distill_async_grpo.py)")
_ASYNC_TEMPLATE = ("a template over metrics that AsyncGRPOTrainer.log reduces differently by their value's shape and "
                   "name (trl/experimental/async_grpo/async_grpo_trainer.py@v1.16.0:81-105 _reduce_metric: (num, den) "
                   "rate pairs pooled, *_total counters summed, *max*/*min* words an extremum, the rest a window "
                   "mean), several of them wall-clock timers (perf/*_s) or queue readings "
                   "(sample/rollout_queue_size): no one reduction states them all")
_GONE = ("{cls} was removed in {gone} (the entry's trainer ends at {last}): not in the installed 1.16.0 wheel, no "
         "code to run")
_TABLE = ("a Trackio table of rollout traces (stat: dist), written with trackio.log, not through Trainer.log: no "
          "scalar to fingerprint")
_PACKER = " (AsyncDistillationTrainer shares the packer)"
ENTRY_WHY: dict[tuple[str, str, str | None], str] = {
    ("trl", "loss", "async_grpo"): (
        "proof not written yet: the Trainer's tr_loss of AsyncGRPOTrainer.compute_loss (token sum over "
        "global_n_tokens / world size, divided by gradient_accumulation_steps itself) needs the Trainer's training "
        "loop around the stand-in compute_loss of test_proof_trl_distill_async_grpo.py (a vLLM server and rollout "
        "worker otherwise)"),
    ("trl", "loss", "prm"): _GONE.format(cls="PRMTrainer", gone="v1.14.0", last="v1.13.0"),
    ("trl", "loss", "ssd"): _GONE.format(cls="SSDTrainer", gone="v1.16.0", last="v1.15.0"),
    ("trl", "aux_loss", "dpo"): _MOE.format(trainer="DPOTrainer"),
    ("trl", "aux_loss", "grpo"): _MOE.format(trainer="GRPOTrainer"),
    ("trl", "aux_loss", "kto"): _MOE.format(trainer="KTOTrainer"),
    ("trl", "aux_loss", "rloo"): _MOE.format(trainer="RLOOTrainer"),
    ("trl", "aux_loss", "sft"): _MOE.format(trainer="SFTTrainer"),
    ("trl", "tools/call_frequency", "distillation"): (
        "proof not written yet: a DistillationTrainer run with tools (the model must emit tool calls the "
        "tokenizer's response schema parses, so _tool_call_loop runs: a chat template with tool-call parsing the "
        "tiny WordLevel tokenizer lacks)"),
    ("trl", "tools/failure_frequency", "distillation"): (
        "proof not written yet: a DistillationTrainer run with tools whose calls fail (see tools/call_frequency)"),
    ("trl", "batch/{metric}", "async_grpo"): _ASYNC_TEMPLATE,
    ("trl", "batch/{metric}", "distillation"): _ASYNC_TEMPLATE + _PACKER,
    ("trl", "perf/{metric}", "async_grpo"): _ASYNC_TEMPLATE,
    ("trl", "perf/{metric}", "distillation"): _ASYNC_TEMPLATE + _PACKER,
    ("trl", "sample/{metric}", "async_grpo"): _ASYNC_TEMPLATE,
    ("trl", "sample/{metric}", "distillation"): _ASYNC_TEMPLATE + _PACKER,
    ("trl", "rollouts", "async_grpo"): _TABLE,
    ("trl", "rollouts", "distillation"): _TABLE,
    ("trl", "on_policy_loss", "distillation"): (
        "no candidate reduction expresses it (IWOPDTrainer, run here: test_iwopd_on_policy_loss_divides_by_the_data_"
        "sets_label_tokens): each micro-batch's loss is its token sum over num_items_in_batch, which the Trainer "
        "counted from the data set's labels before on-policy generation replaced the completions (48 label tokens "
        "for a step training 22), summed over step-equivalents and rounded to 4 decimals; GOLDTrainer's (the "
        "entry's source) is not run: a GOLD run with its ULD/hybrid loss would be needed"),
    ("trl", "off_policy_loss", "distillation"): (
        "proof not written yet: IWOPDTrainer refuses lmbda < 1 (distillation_objective 'iw_opd' is on-policy), so "
        "only a GOLDTrainer run (trl/experimental/gold) with lmbda < 1 logs it: its off-policy micro-batch losses "
        "summed, all-reduced and rounded to 4 decimals"),
    **{("trl", key, "distillation"): (
        "proof not written yet: a GOLDTrainer run (trl/experimental/gold) with the hybrid ULD loss "
        "(uld_use_hybrid_loss), recording the matched/unmatched token losses it sums; its log() all-reduces the sums "
        "(SUM), divides by the step-equivalents and rounds to 4 decimals")
       for key in ("matched_loss", "unmatched_loss")},
    ("trl", "iw_opd/{metric}", "distillation"): (
        "a template over metrics of different reductions (trl/experimental/iw_opd/iw_opd_trainer.py@v1.16.0:1252-1260: "
        "mean_advantage, mean_abs_advantage, mean_weight are token means of the micro-batch, min_weight/max_weight "
        "its token min/max, each then averaged over the micro-batches): its stat: value states none of them"),
}
