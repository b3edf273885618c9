"""TRL's GRPO variants (GMPO), GRPO's other loss types, RLOO and A2PO run for the fingerprint proofs of
mappings/trl.yaml (tests/frameworks/test_proof_trl_grpo_*.py).

Two ways of running the installed TRL (1.16.0):

* :func:`run_gmpo`: a real ``trl.experimental.gmpo.GMPOTrainer`` trains the tiny model on CPU like
  tests/_support/proofs_trl.py's :func:`~_support.proofs_trl.run_grpo` (the same recorders: every row logged, the
  locals of each call of the metric code that appended to ``_metrics``).
* :func:`run_loss_on_ranks`: the trainer's own loss method (``_compute_loss`` of GMPOTrainer, GRPOTrainer or
  RLOOTrainer, ``compute_loss`` of A2POTrainer) called on 2 simulated data-parallel ranks
  (``framework_code.run_ranks`` / ``SimAccelerator``: TRL's ``accelerator.reduce`` and ``gather`` meet across the
  ranks), on a trainer built without ``__init__`` (the attributes ``__init__`` sets from the real ``*Config``, copied
  here as ``__init__`` sets them), micro-batch by micro-batch over several optimizer steps, then the trainer's own
  ``log`` (which averages what was appended since the last log). The model's forward is replaced by the batch's
  log-probabilities and entropies (:class:`Micro`): ranks and micro-batches hold different numbers of sequences and
  tokens, so the process, micro-batch and window reductions give different numbers. Nothing here computes a metric:
  the values a proof fingerprints are the locals of TRL's own call (:class:`~_support.proofs_trl.MetricsRecorder`).
  The same runner drives GRPO's own ``_generate_and_score_completions`` (:func:`scorer_like`, :func:`call_score`:
  the vLLM importance-sampling keys, the completions coming from a ``rollout_func``) and ``_generate`` with tools
  (:func:`call_generate_with_tools`: the tool execution loop a stand-in reporting the rank's call and failure counts).

At the end, :data:`ENTRY_WHY`: the entries of this group no proof fingerprints, each with why.
"""
from __future__ import annotations

import contextlib
import random
import types
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from _support.framework_code import SimAccelerator, run_ranks
from _support.proofs_trl import MetricsRecorder, default_rewards, log_recorder, one_thread, suppress_all_but, train
from _support.tiny_trl import build_tiny_model, sentences

WORLD = 2


# ------------------------------------------------------------------------------------------- GMPO, trained
def run_gmpo(workdir: Path, *, model_path: str | None = None, **config: Any):
    """Train TRL's GMPOTrainer (trl.experimental.gmpo, the installed release) like proofs_trl.run_grpo."""
    import datasets
    from trl.experimental.gmpo import GMPOConfig, GMPOTrainer

    from _support.proofs_trl import COMMON, RL

    model_path = model_path or build_tiny_model(workdir / "model")
    args = {**COMMON, **RL, "output_dir": str(workdir / "out"), **config}
    args.setdefault("generation_kwargs", {"suppress_tokens": suppress_all_but(model_path)})
    ds = datasets.Dataset.from_dict({"prompt": sentences(256, 1)})
    rec = log_recorder()
    trainer = GMPOTrainer(model=model_path, reward_funcs=list(default_rewards()), args=GMPOConfig(**args),
                          train_dataset=ds, callbacks=[rec])
    return train(trainer, rec)


# ------------------------------------------------------------------------------------------- the loss on 2 ranks
@dataclass
class Micro:
    """One micro-batch of one rank: what the loss method is given (the model's forward replaced by ``logp`` and
    ``entropy``)."""
    lengths: list[int]
    logp: Any                # (B, T) the policy's per-token log-probs (what the forward returns)
    old_logp: Any            # (B, T) the rollout policy's
    ref_logp: Any            # (B, T) the reference model's
    entropy: Any             # (B, T)
    mask: Any                # (B, T) completion mask
    advantages: Any          # (B,)
    rewards: Any             # (B,) A2PO: binary rewards
    v_star: Any              # (B,) A2PO: the prompts' estimated optimal values


def make_micro(rng: random.Random, n_seq: int, *, spread: float = 0.6, width: int = 7) -> Micro:
    """A micro-batch of ``n_seq`` sequences of uneven lengths (1..width), ratios well away from 1 (``spread``)."""
    import torch
    lengths = [rng.randint(1, width) for _ in range(n_seq)]
    T = max(lengths)
    mask = torch.zeros(n_seq, T)
    for i, k in enumerate(lengths):
        mask[i, :k] = 1

    def rand(lo: float, hi: float) -> Any:
        return torch.tensor([[rng.uniform(lo, hi) for _ in range(T)] for _ in range(n_seq)])
    logp = rand(-2.5, -0.05)
    old_logp = logp + rand(-spread, spread)
    ref_logp = logp + rand(-spread, spread)
    entropy = rand(0.0, 3.0)
    adv = torch.tensor([rng.choice((-1.0, 1.0)) * rng.uniform(0.2, 1.5) for _ in range(n_seq)])
    rewards = torch.tensor([float(rng.random() < 0.5) for _ in range(n_seq)])
    v_star = torch.tensor([rng.uniform(0.05, 0.9) for _ in range(n_seq)])
    return Micro(lengths, logp * mask, old_logp * mask, ref_logp * mask, entropy * mask, mask, adv, rewards, v_star)


def make_steps(seed: int, n_steps: int, ga: int, seqs: Sequence[Sequence[int]] = ((3, 2, 1), (2, 4, 3)),
               **kw: Any) -> list[list[list[Micro]]]:
    """``[step][rank][micro]``: the ``n``-th micro-batch of rank ``r`` holds ``seqs[r][n % len]`` sequences (ranks,
    micro-batches and steps of different sizes)."""
    rng = random.Random(seed)
    return [[[make_micro(rng, seqs[r][(s * ga + u) % len(seqs[r])], **kw) for u in range(ga)] for r in range(WORLD)]
            for s in range(n_steps)]


def _state_and_logs(trainer: Any) -> list[dict]:
    from transformers.trainer_callback import TrainerControl, TrainerState
    logs: list[dict] = []
    trainer.state = TrainerState()
    trainer.state.num_input_tokens_seen = 0
    trainer.control = TrainerControl()
    trainer.callback_handler = types.SimpleNamespace(
        on_log=lambda a, s, c, logged: (logs.append(dict(logged)), c)[1])
    return logs


def grpo_like(cls: Any, args: Any, *, ga: int) -> Any:
    """A GRPOTrainer (or subclass) without __init__: what __init__ sets from ``args`` for ``_compute_loss`` and
    ``log`` (trl/trainer/grpo_trainer.py@v1.16.0 __init__, lines 782-983), the rank's simulated accelerator."""
    self = cls.__new__(cls)
    self.__dict__.update(
        accelerator=SimAccelerator(), args=args, model=types.SimpleNamespace(training=True), beta=args.beta,
        loss_type=args.loss_type, epsilon_low=args.epsilon,
        epsilon_high=args.epsilon_high if args.epsilon_high is not None else args.epsilon,
        importance_sampling_level=args.importance_sampling_level, top_entropy_quantile=args.top_entropy_quantile,
        off_policy_mask_threshold=args.off_policy_mask_threshold, use_vllm=args.use_vllm,
        vllm_importance_sampling_correction=args.vllm_importance_sampling_correction, aux_loss_enabled=False,
        router_aux_loss_coef=0.0, max_completion_length=args.max_completion_length,
        entropy_coef=args.entropy_coef, use_adaptive_entropy=args.use_adaptive_entropy,
        _entropy_bonus_enabled=args.entropy_coef != 0.0 or args.use_adaptive_entropy,
        _last_world_entropy=float("inf"), _entropy_window_stats=None, current_gradient_accumulation_steps=ga,
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)}, log_completions=False)
    return self


def rloo_like(args: Any, *, ga: int) -> Any:
    """An RLOOTrainer without __init__ (trl/trainer/rloo_trainer.py@v1.16.0 __init__, lines 536-669)."""
    from trl import RLOOTrainer
    self = RLOOTrainer.__new__(RLOOTrainer)
    self.__dict__.update(
        accelerator=SimAccelerator(), args=args, model=types.SimpleNamespace(training=True), beta=args.beta,
        epsilon_low=args.epsilon, epsilon_high=args.epsilon_high if args.epsilon_high is not None else args.epsilon,
        aux_loss_enabled=False, router_aux_loss_coef=0.0, max_completion_length=args.max_completion_length,
        current_gradient_accumulation_steps=ga, _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
        log_completions=False)
    return self


def a2po_like(args: Any) -> Any:
    """An A2POTrainer without __init__ (trl/experimental/a2po/a2po_trainer.py@v1.16.0: compute_loss and log read
    ``args.beta2``, ``model.training``, ``_metrics``)."""
    from trl.experimental.a2po import A2POTrainer
    self = A2POTrainer.__new__(A2POTrainer)
    self.__dict__.update(accelerator=SimAccelerator(), args=args, model=types.SimpleNamespace(training=True),
                         _metrics={"train": defaultdict(list), "eval": defaultdict(list)})
    return self


@dataclass
class RankRun:
    """What the loss method did on every rank: each rank's recorded calls (``MetricsRecorder`` calls, one per
    micro-batch, ``.step`` the 1-based optimizer step) and the rows each rank's ``log`` gave."""
    calls: list[list[Any]]                  # [rank] -> calls
    rows: list[list[dict]]                  # [rank] -> logged rows
    windows: list[tuple[int, int]]          # (first, last) optimizer step of each row

    def steps(self, row: int, values: Callable[[dict[str, Any]], list[list[float]]], key: str) -> list:
        """The nested batch of row ``row``: ``[step][mini-batch][rank][micro-batch]`` of ``values(locals)`` of each
        call that appended ``key``."""
        first, last = self.windows[row]
        return [[[[values(c.locals) for c in self.calls[r] if c.step == s and key in c.appended]
                  for r in range(len(self.calls))]] for s in range(first, last + 1)]

    def obs(self, key: str, values: Callable[[dict[str, Any]], list[list[float]]], rank: int = 0) -> list:
        """(the value rank ``rank`` logged, its row's batch) of every row."""
        out = [(row[key], self.steps(i, values, key)) for i, row in enumerate(self.rows[rank])]
        assert out and all(v is not None for v, _ in out), f"{key!r} was not logged"
        return out


def run_loss_on_ranks(make_trainer: Callable[[], Any], loss: Callable[[Any, Micro], Any],
                      steps: list[list[list[Micro]]], rows: Sequence[int]) -> RankRun:
    """On 2 simulated ranks: for each optimizer step and micro-batch, ``loss(trainer, micro)`` (the framework's loss
    method, called by the caller's ``loss``), ``sync_gradients`` true at the step's last micro-batch; after the
    steps of each row (``rows``: the optimizer steps per logged row), the trainer's own ``log({})``."""
    windows, first = [], 1
    for n in rows:
        windows.append((first, first + n - 1))
        first += n
    assert first - 1 == len(steps), (rows, len(steps))

    def rank(r: int) -> tuple[list, list]:
        trainer = make_trainer()
        logs = _state_and_logs(trainer)
        rec = MetricsRecorder(trainer)
        try:
            with one_thread():
                run_windows(trainer, r)
        finally:
            rec.close()
        return rec.calls, logs

    def run_windows(trainer: Any, r: int) -> None:
        for lo, hi in windows:
            for s in range(lo, hi + 1):
                trainer.state.global_step = s - 1
                micros = steps[s - 1][r]
                for u, m in enumerate(micros):
                    trainer.accelerator.sync_gradients = u == len(micros) - 1
                    loss(trainer, m)
                trainer.state.global_step = s
            type(trainer).log(trainer, {})

    out = run_ranks(rank, WORLD)
    return RankRun([c for c, _ in out], [lg for _, lg in out], windows)


def grpo_inputs(m: Micro, num_items: float) -> dict[str, Any]:
    """What GRPOTrainer._compute_loss is given for a micro-batch (the shapes _generate_and_score_completions
    builds); ``num_items``: the generation batch's token count over every process (``num_items_in_batch``)."""
    import torch
    B, T = m.mask.shape
    return {"prompt_ids": torch.full((B, 3), 5), "prompt_mask": torch.ones(B, 3, dtype=torch.long),
            "completion_ids": torch.full((B, T), 5), "completion_mask": m.mask.clone(),
            "advantages": m.advantages.clone(), "old_per_token_logps": m.old_logp.clone(),
            "ref_per_token_logps": m.ref_logp.clone(), "num_items_in_batch": torch.tensor(float(num_items))}


def call_grpo_loss(fn: Callable[..., Any], num_items: float) -> Callable[[Any, Micro], Any]:
    """``loss`` for :func:`run_loss_on_ranks`: the model's forward replaced by the micro-batch's log-probs and
    entropies, then ``fn(trainer, None, inputs)`` (GMPOTrainer._compute_loss, GRPOTrainer._compute_loss)."""
    def loss(trainer: Any, m: Micro) -> Any:
        trainer._get_per_token_logps_and_entropies = (
            lambda *a, **k: (m.logp.clone().requires_grad_(True), m.entropy.clone(), None))
        return fn(trainer, None, grpo_inputs(m, num_items))
    return loss


def call_rloo_loss(trainer: Any, m: Micro) -> Any:
    """RLOOTrainer._compute_loss on a micro-batch (``old_logps``: the sequence sums of the rollout log-probs, as
    _generate_and_score_completions gives them)."""
    from trl import RLOOTrainer
    trainer._get_per_token_logps_and_entropies = (
        lambda *a, **k: (m.logp.clone().requires_grad_(True), m.entropy.clone(), None))
    inputs = grpo_inputs(m, 1.0)
    inputs["old_logps"] = (m.old_logp * m.mask).sum(1)
    return RLOOTrainer._compute_loss(trainer, None, inputs)


def call_a2po_loss(trainer: Any, m: Micro) -> Any:
    """A2POTrainer.compute_loss on a micro-batch: its ``_get_sequence_logps`` (the model's forward) replaced by the
    sequences' summed log-probs; ref_logps, rewards and v_star as _prepare_inputs gives them."""
    import torch
    from trl.experimental.a2po import A2POTrainer
    trainer._get_sequence_logps = lambda model, ids, attn, keep: (m.logp * m.mask).sum(1).requires_grad_(True)
    B, T = m.mask.shape
    inputs = {"input_ids": torch.full((B, 3 + T), 5), "attention_mask": torch.ones(B, 3 + T), "logits_to_keep": T,
              "ref_logps": (m.ref_logp * m.mask).sum(1), "rewards": m.rewards.clone(), "v_star": m.v_star.clone()}
    return A2POTrainer.compute_loss(trainer, None, inputs)


def a2po_like_with_rollout(args: Any, tokenizer: Any) -> Any:
    """An A2POTrainer without __init__ that can also run its own ``_prepare_inputs`` (Stage 2's rollout: generation,
    rewards, the cached V*): what __init__ sets (a2po_trainer.py@v1.16.0:150-180), a binary reward function returning
    the current micro-batch's rewards, ``_optimal_values`` holding its prompts' V*; the generation and the
    log-prob forwards are stand-ins (:func:`call_a2po_step`)."""
    import torch
    self = a2po_like(args)

    def binary(prompts, completions, **kw):
        return [float(v) for v in self._micro.rewards]
    self.__dict__.update(processing_class=tokenizer, reward_funcs=[binary], reward_weights=torch.ones(1),
                         eos_token_ids=[tokenizer.eos_token_id], ref_model=object(), generation_config=None,
                         _optimal_values={})
    return self


class _Generator:
    """The policy's ``generate`` for A2PO's _prepare_inputs: the prompt ids followed by the micro-batch's completion
    (``lengths[i]`` tokens, the last one EOS), right-padded."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer

    def generate(self, input_ids: Any, attention_mask: Any = None, generation_config: Any = None) -> Any:
        import torch
        m, tok = self.trainer._micro, self.trainer.processing_class
        T = max(m.lengths)
        out = torch.full((len(m.lengths), T), tok.pad_token_id)
        for i, k in enumerate(m.lengths):
            out[i, :k] = 5
            out[i, k - 1] = tok.eos_token_id
        return torch.cat([input_ids, out], dim=1)


def call_a2po_step(trainer: Any, m: Micro) -> Any:
    """One A2PO micro-batch as HF's training_step runs it: ``_prepare_inputs`` (A2POTrainer's own: the rollout,
    ``reward`` and ``v_star`` appended) then ``compute_loss`` (``advantage``, ``implicit_reward``). Runs inside
    :func:`a2po_generation`."""
    from trl.experimental.a2po import A2POTrainer
    trainer._micro = m
    trainer._n = getattr(trainer, "_n", 0) + 1
    rank = trainer.accelerator.process_index
    prompts = [f"the cat {rank} {trainer._n} {i}" for i in range(len(m.lengths))]
    trainer._optimal_values.update({pr: float(v) for pr, v in zip(prompts, m.v_star)})

    def seq_logps(model, ids, attn, keep):
        ref = model is trainer.ref_model
        return ((m.ref_logp if ref else m.logp) * m.mask).sum(1)
    trainer._get_sequence_logps = seq_logps
    trainer.model.generate = _Generator(trainer).generate
    inputs = A2POTrainer._prepare_inputs(trainer, [{"prompt": pr} for pr in prompts])
    return A2POTrainer.compute_loss(trainer, None, inputs)


@contextlib.contextmanager
def a2po_generation() -> Any:
    """A2POTrainer._prepare_inputs generates under ``unwrap_model_for_generation(self.model, accelerator)``: the
    model itself here (its ``generate``: :class:`_Generator`), set once for every simulated rank."""
    from trl.experimental.a2po import a2po_trainer as module
    saved = module.unwrap_model_for_generation
    module.unwrap_model_for_generation = lambda model, acc, **kw: contextlib.nullcontext(model)
    try:
        yield
    finally:
        module.unwrap_model_for_generation = saved


def generation_tokens(steps: list[list[list[Micro]]]) -> float:
    """The token count of every rank's micro-batches of one optimizer step (GRPO's num_items_in_batch spans the
    generation batch: steps_per_generation = gradient_accumulation_steps micro-batches per rank)."""
    return float(sum(float(m.mask.sum()) for rank in steps[0] for m in rank))


# ------------------------------------------------------------------------------------------- scoring on 2 ranks
def scorer_like(cls: Any, args: Any, *, use_vllm: bool) -> Any:
    """A GRPOTrainer (or subclass) without __init__ that runs its own ``_generate_and_score_completions``: the
    attributes tests/_support/fidelity_proofs.py (_trl_trainer, run_trl_scores) sets for it, read from ``args`` as
    __init__ sets them (grpo_trainer.py@v1.16.0:782-1140); with ``use_vllm`` the vLLM importance-sampling
    correction is on (its sampling log-probs come from the rollout, vLLM's weight sync is a no-op)."""
    import torch
    tok = types.SimpleNamespace(pad_token_id=0, batch_decode=lambda ids, **k: [" ".join(map(str, x)) for x in ids])
    self = grpo_like(cls, args, ga=args.gradient_accumulation_steps)

    def score(prompts, completions, completion_ids, **kw):
        return [float(v) for v in self._micro.rewards]

    def rollout(prompts, trainer):
        m = trainer._micro
        sampler = m.old_logp - 0.25 * (m.ref_logp - m.logp)     # the sampler's log-probs, near the policy's
        return {"prompt_ids": [[5] * 3 for _ in m.lengths],
                "completion_ids": [[6] * (k - 1) + [3] for k in m.lengths],
                "logprobs": [sampler[i, :k].tolist() for i, k in enumerate(m.lengths)]}
    self.__dict__.update(
        processing_class=tok, _tokenizer=tok, eos_token_ids=[3], tools=None, environment_factories=None,
        environments=None, rollout_func=rollout, num_generations=2, num_generations_eval=2, pad_to_multiple_of=None,
        mask_truncated_completions=False, num_iterations=1, ref_model=None, reward_funcs=[score],
        reward_processing_classes=[None], reward_func_names=["score"], reward_weights=torch.ones(1),
        multi_objective_aggregation="sum_then_normalize", scale_rewards="group", _pending_extra_logs={},
        _pending_metrics={}, log_multimodal=False, use_vllm=use_vllm,
        vllm_importance_sampling_correction=use_vllm, vllm_importance_sampling_mode=args.vllm_importance_sampling_mode,
        vllm_importance_sampling_clip_max=args.vllm_importance_sampling_clip_max,
        vllm_importance_sampling_clip_min=args.vllm_importance_sampling_clip_min, _last_loaded_step=-1,
        vllm_generation=types.SimpleNamespace(sync_weights=lambda: None),
        model=types.SimpleNamespace(training=True, is_gradient_checkpointing=False),
        _logs={"prompt": [], "completion": [], "advantages": [], "images": [], "rewards": defaultdict(list),
               "extra": defaultdict(list)})
    return self


def call_score(trainer: Any, m: Micro) -> Any:
    """GRPOTrainer._generate_and_score_completions on one rank's generation batch (``m``: its completions, the
    policy's log-probs at scoring time ``old_logp``; the sampler's log-probs, given by the rollout, differ from them
    by a quarter of ``ref_logp - logp``)."""
    from trl import GRPOTrainer
    trainer._micro = m
    trainer._get_per_token_logps_and_entropies = lambda *a, **k: (m.old_logp.clone(), m.entropy.clone(), None)
    return GRPOTrainer._generate_and_score_completions(trainer, [{"prompt": "the cat"} for _ in m.lengths])


def tool_counts(m: Micro) -> tuple[list[int], list[int]]:
    """The tool calls each completion of ``m`` makes (0, 1 or 2) and how many of them fail: what the tool loop
    stand-in of :func:`call_generate_with_tools` reports."""
    calls = [(k + i) % 3 for i, k in enumerate(m.lengths)]
    fails = [min(c, int(float(r) > 0.5) + (i % 2)) for i, (c, r) in enumerate(zip(calls, m.rewards))]
    return calls, fails


def call_generate_with_tools(trainer: Any, m: Micro) -> Any:
    """GRPOTrainer._generate on one rank's generation batch with tools given: the completions come from the
    rollout, and the tool execution loop (``_tool_call_loop``: parsing tool calls, running them, regenerating) is a
    stand-in that reports :func:`tool_counts` (the rank's calls and failures) and leaves the completions as they
    are; ``_generate``'s own code reduces the counts over the processes."""
    from trl import GRPOTrainer
    trainer._micro = m
    calls, fails = tool_counts(m)

    def tool_loop(prompts, prompt_ids, completion_ids, completions, logprobs, images, multimodal_fields):
        return ([[1] * len(ids) for ids in completion_ids], completions, completion_ids, logprobs, sum(calls),
                sum(fails), [[] for _ in completion_ids])
    trainer.tools = [tool_loop]
    trainer._tool_call_loop = tool_loop
    return GRPOTrainer._generate(trainer, ["the cat" for _ in m.lengths])


@contextlib.contextmanager
def simulated_gather() -> Any:
    """grpo_trainer's module-level ``gather`` / ``gather_object`` (accelerate.utils) over the simulated ranks
    (framework_code.sim_gather, as fidelity_proofs.run_trl_scores sets them)."""
    from trl.trainer import grpo_trainer as module

    from _support.framework_code import sim_gather, sim_gather_object
    saved = module.gather, module.gather_object
    module.gather, module.gather_object = sim_gather, sim_gather_object
    try:
        yield
    finally:
        module.gather, module.gather_object = saved


# ------------------------------------------------------------------------------------------- entries not proven
ENTRY_WHY: dict[tuple[str, str, str | None], str] = {
    ("trl", "completion_length", "grpo"): (
        "not logged by the installed release: TRL >= v0.17.0 writes completions/mean_length instead "
        "(trl/trainer/grpo_trainer.py@v1.16.0 has no completion_length); the entry covers Unsloth's patched "
        "GRPOTrainer, which is not installed"),
}
