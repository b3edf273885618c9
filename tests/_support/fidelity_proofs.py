"""The proofs report, docs/fidelity-proofs.md: per canonical name two or more frameworks map, every pair of their
entries, proven equal, proven different (with the measured gap) or unproven (with why).

**How a pair is decided.** With computed fidelity (issue 20), a pair is *exact* when the two entries' stated
reductions are equal (``trackbridge.translate.fidelity``, each under its framework's defaults) and *proven* when both
entries' reductions were fingerprinted by a proof that ran the framework's code. Fingerprint proofs register
themselves (tests/_support/proven.py, whose docstring is the contract)::

    from _support.proven import proof

    @proof("verl", trainer="ppo", release="0.9.1", config={...})     # the run config the code ran with
    def test_verl_actor_losses(p):
        logged, steps = ...                                          # run the framework's code on an uneven batch
        p.assert_stated("actor/kl_loss", logged["actor/kl_loss"], steps, levels=("micro_batches", "mini_batches"))

``proven.run_all()`` imports every module of ``proven.PROOF_MODULES`` (tests/frameworks/test_proof_*.py and
test_fidelity_*.py) and runs each proof; each must make at least one assertion (counted, and shown in the report).
Pairs of entries that state no reduction yet keep their hand-written fidelity and the value proofs below (issue 11:
both frameworks' metric code run on one shared synthetic batch, tests/_support/framework_code.py).

The batch of the value proofs (``make_batch``): 2 simulated data-parallel ranks x gradient accumulation 2 x
micro-batches of 2 sequences (8 sequences, GRPO groups of 4), responses of unequal length right-padded, two of them
cut at the length limit without EOS. ``even=True`` gives every micro-batch the same number of tokens: a difference of
*weighting* (mean of micro-batch means vs one token mean) shows on the uneven batch and vanishes on the even one.

    .venv/bin/python tests/_support/fidelity_proofs.py        # writes docs/fidelity-proofs.md
"""
from __future__ import annotations

import itertools
import math
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

if __name__ == "__main__":      # run as a script (the command above): put tests/ on sys.path so `_support` imports
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    # one module, whatever imports it: a proof or proofs_corpus importing `_support.fidelity_proofs` gets this one
    # (a second copy has its own batch caches, and its veRL driver run left the report's derived rules without input)
    sys.modules.setdefault("_support.fidelity_proofs", sys.modules[__name__])
from _support import ROOT  # noqa: E402
from _support import framework_code as F  # noqa: E402
from _support import vendored as V  # noqa: E402
from _support.unproven import EveryEntryProven  # noqa: E402

DOC = ROOT / "docs" / "fidelity-proofs.md"
PROOFS_FILE = ROOT / "mappings" / "proofs.yaml"     # shipped: the entries proven, read by the engine
EOS, PAD, WIDTH, GROUP = 3, 0, 8, 4
MB, GA = 2, 2                                      # sequences per micro-batch, gradient accumulation steps
TRL_CONFIG = (("gradient_accumulation_steps", GA),)   # the TRL run config the proof's code ran with
TOL = 1e-6


# --------------------------------------------------------------------------------------------- the shared batch
@dataclass
class Batch:
    lengths: list[int]                 # response tokens per sequence, rank-major: rank r holds r*4 .. r*4+3
    truncated: list[bool]              # cut at WIDTH without EOS
    prompt_lengths: list[int]
    scores: list[float]
    logp: Any                          # (8, WIDTH) current policy log-probs, 0 on padding
    old_logp: Any                      # (8, WIDTH) rollout-time (old) policy log-probs
    ref_logp: Any                      # (8, WIDTH) reference policy log-probs
    entropy: Any                       # (8, WIDTH) per-token entropy
    mask: Any                          # (8, WIDTH) response mask
    completion_ids: list[list[int]] = field(default_factory=list)
    world: int = F.WORLD

    def rank_rows(self, rank: int) -> list[int]:
        n = MB * GA
        return list(range(rank * n, (rank + 1) * n))

    def micro_rows(self, rank: int, micro: int) -> list[int]:
        return self.rank_rows(rank)[micro * MB:(micro + 1) * MB]


def make_batch(even: bool = False) -> Batch:
    import torch
    # micro-batch token counts: uneven 5/15 | 5/14, even 10/10 | 10/10 (per rank: micro-batch 0 / 1)
    lengths = [4, 6, 8, 2, 3, 7, 5, 5] if even else [2, 3, 8, 7, 1, 4, 8, 6]
    truncated = [n == WIDTH for n in lengths]
    g = torch.Generator().manual_seed(7)
    n = len(lengths)
    mask = torch.zeros(n, WIDTH)
    for i, k in enumerate(lengths):
        mask[i, :k] = 1
    logp = -torch.rand(n, WIDTH, generator=g) * 2 - 0.05
    old_logp = logp + (torch.rand(n, WIDTH, generator=g) - 0.5) * 0.8      # ratios well outside 1 +- 0.2
    ref_logp = logp + (torch.rand(n, WIDTH, generator=g) - 0.5) * 0.6
    entropy = torch.rand(n, WIDTH, generator=g) * 3
    logp, old_logp, ref_logp, entropy = (t * mask for t in (logp, old_logp, ref_logp, entropy))
    scores = [1.0, 0.0, 0.5, 1.0, 0.0, 0.0, 1.0, 0.25]
    completion_ids = []
    for i, k in enumerate(lengths):
        ids = [4 + (i + j) % 20 for j in range(k)]
        if not truncated[i]:
            ids[-1] = EOS
        completion_ids.append(ids)
    return Batch(lengths=lengths, truncated=truncated, prompt_lengths=[3, 3, 3, 3, 5, 5, 5, 5], scores=scores,
                 logp=logp, old_logp=old_logp, ref_logp=ref_logp, entropy=entropy, mask=mask,
                 completion_ids=completion_ids)


def grpo_advantages(b: Batch):
    """Group-normalised sequence advantages (the same numbers are given to every framework's loss)."""
    import torch
    s = torch.tensor(b.scores).view(-1, GROUP)
    adv = (s - s.mean(1, keepdim=True)) / (s.std(1, keepdim=True) + 1e-4)
    return adv.view(-1)


# --------------------------------------------------------------------------------------------- TRL (GRPOTrainer)
def _trl_trainer(b: Batch, *, beta: float = 0.04):
    """A real GRPOTrainer without __init__ (no model, no data set): the attributes its metric code reads, set the
    way __init__ sets them from a GRPOConfig; the rank's simulated accelerator; the rollout as a rollout_func."""
    from collections import defaultdict

    from transformers.trainer_callback import TrainerControl, TrainerState
    t = F.trl()
    args = types.SimpleNamespace(use_bias_correction_kl=False, delta=None, include_num_input_tokens_seen="no",
                                 steps_per_generation=GA, vespo_k_pos=None)
    self = t.GRPOTrainer.__new__(t.GRPOTrainer)
    acc = F.SimAccelerator()
    tok = types.SimpleNamespace(pad_token_id=PAD, batch_decode=lambda ids, **k: [" ".join(map(str, x)) for x in ids])
    rank_rows = b.rank_rows(acc.process_index)

    def rollout_func(prompts, trainer):
        return {"prompt_ids": [[5] * b.prompt_lengths[i] for i in rank_rows],
                "completion_ids": [b.completion_ids[i] for i in rank_rows],
                "logprobs": [b.old_logp[i, :b.lengths[i]].tolist() for i in rank_rows]}

    captured: dict[str, Any] = {}
    logs: list[dict] = []
    self.__dict__.update(
        accelerator=acc, args=args, model=types.SimpleNamespace(training=True), beta=beta, loss_type="dapo",
        epsilon_low=0.2, epsilon_high=0.2, importance_sampling_level="token", top_entropy_quantile=1.0,
        off_policy_mask_threshold=None, use_vllm=False, aux_loss_enabled=False, _entropy_bonus_enabled=False,
        current_gradient_accumulation_steps=GA, _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
        rollout_func=rollout_func, processing_class=tok, _tokenizer=tok, eos_token_ids=[EOS], tools=None,
        environment_factories=None, state=TrainerState(), control=TrainerControl(), log_completions=False,
        callback_handler=types.SimpleNamespace(on_log=lambda a, s, c, logged: (logs.append(dict(logged)), c)[1]),
        num_generations=GROUP, num_generations_eval=GROUP, _logs=defaultdict(list))
    self.state.num_input_tokens_seen = 0
    self._captured, self._logged = captured, logs
    return self


def run_trl_grpo(b: Batch, *, beta: float = 0.04) -> dict[str, float]:
    """TRL 1.16 GRPO on both ranks: ``_generate`` (completion statistics), then ``_compute_loss`` on each of the GA
    micro-batches (entropy, KL, clip ratios; the model's forward replaced by the batch's log-probs and entropies),
    then ``log`` (which averages what the micro-batches appended). Returns what rank 0 logs."""
    import torch
    t = F.trl()

    def rank(r: int) -> dict:
        trainer = _trl_trainer(b, beta=beta)
        t.GRPOTrainer._generate(trainer, ["p"] * (MB * GA))
        for m in range(GA):
            rows = b.micro_rows(r, m)
            width = max(b.lengths[i] for i in rows)           # TRL pads to the longest completion it holds
            sl = (rows, slice(0, width))

            def forward(model, input_ids, attention_mask, logits_to_keep, **kw):
                return b.logp[sl].clone(), b.entropy[sl].clone(), None

            trainer._get_per_token_logps_and_entropies = forward
            inputs = {"prompt_ids": torch.full((len(rows), 3), 5), "prompt_mask": torch.ones(len(rows), 3),
                      "completion_ids": torch.full((len(rows), width), 5), "completion_mask": b.mask[sl].clone(),
                      "advantages": grpo_advantages(b)[rows], "old_per_token_logps": b.old_logp[sl].clone(),
                      "ref_per_token_logps": b.ref_logp[sl].clone(), "num_items_in_batch": b.mask.sum()}
            t.GRPOTrainer._compute_loss(trainer, None, inputs)
        t.GRPOTrainer.log(trainer, {})
        return trainer._logged[-1]

    return F.run_ranks(rank)[0]


# --------------------------------------------------------------------------------------------- veRL
def run_verl(b: Batch) -> dict[str, float]:
    """veRL 0.9.x: ``metric_utils.compute_data_metrics`` on the driver's DataProto of the whole batch;
    ``actor/entropy`` as ray_trainer computes it (``core_algos.agg_loss`` over the whole batch, the actor's
    loss_agg_mode, default token-mean); ``actor/entropy_loss``, ``actor/pg_clipfrac`` and ``actor/pg_loss`` as the
    engine path computes them (``losses.ppo_loss``: ``agg_loss`` / ``compute_policy_loss_vanilla`` per micro-batch
    with the global batch info, then ``Metric.aggregate_dp`` over ranks in engine_workers)."""
    import torch
    from tensordict import TensorDict
    v = F.verl()
    n = len(b.lengths)
    P = max(b.prompt_lengths)
    prompts = torch.full((n, P), 5)
    attn = torch.zeros(n, P + WIDTH, dtype=torch.long)
    for i, k in enumerate(b.prompt_lengths):
        attn[i, P - k:P] = 1
    attn[:, P:] = b.mask.long()
    scores = torch.zeros(n, WIDTH)
    for i, k in enumerate(b.lengths):
        scores[i, k - 1] = b.scores[i]
    adv = grpo_advantages(b)[:, None] * b.mask
    td = TensorDict({"prompts": prompts, "responses": torch.full((n, WIDTH), 5), "attention_mask": attn,
                     "response_mask": b.mask.long(), "token_level_scores": scores, "token_level_rewards": scores,
                     "advantages": adv, "returns": adv}, batch_size=[n])
    metrics = dict(v.metric_utils.compute_data_metrics(v.DataProto(batch=td), use_critic=False))
    ca = v.core_algos
    from verl.workers.config import FSDPActorConfig
    defaults = FSDPActorConfig(strategy="fsdp", ppo_mini_batch_size=MB * GA, ppo_micro_batch_size_per_gpu=MB,
                               use_dynamic_bsz=False, rollout_n=GROUP)
    metrics["actor/entropy"] = ca.agg_loss(loss_mat=b.entropy, loss_mask=b.mask.bool(),
                                           loss_agg_mode=defaults.loss_agg_mode,
                                           loss_scale_factor=defaults.loss_scale_factor).item()
    # engine path: per rank, per micro-batch, normalised by the global token count; SUM over micro-batches,
    # mean over dp ranks (Metric.aggregate_dp)
    batch_num_tokens = b.mask.sum()
    per_rank: dict[str, list] = {"actor/entropy_loss": [], "actor/pg_clipfrac": [], "actor/pg_loss": []}
    from verl.workers.config import FSDPActorConfig
    cfg = FSDPActorConfig(strategy="fsdp", ppo_mini_batch_size=MB * GA, ppo_micro_batch_size_per_gpu=MB,
                          use_dynamic_bsz=False, rollout_n=GROUP)          # defaults: token-mean, clip 0.2
    cfg.global_batch_info.update(dp_size=b.world, batch_num_tokens=batch_num_tokens, global_batch_size=None,
                                 loss_scale_factor=cfg.loss_scale_factor)  # as losses.ppo_loss sets them
    for r in range(b.world):
        ent = v.Metric(v.AggregationType.SUM)
        pgl = v.Metric(v.AggregationType.SUM)
        clip = v.Metric(v.AggregationType.MEAN)
        for m in range(GA):
            rows = b.micro_rows(r, m)
            ent.append(ca.agg_loss(loss_mat=b.entropy[rows], loss_mask=b.mask[rows].bool(),
                                   loss_agg_mode=cfg.loss_agg_mode, **cfg.global_batch_info))
            pg_loss, pg_metrics = ca.compute_policy_loss_vanilla(
                old_log_prob=b.old_logp[rows], log_prob=b.logp[rows],
                advantages=(grpo_advantages(b)[:, None] * b.mask)[rows], response_mask=b.mask[rows].bool(),
                loss_agg_mode=cfg.loss_agg_mode, config=cfg)
            pgl.append(pg_loss)
            clip.append(pg_metrics["actor/pg_clipfrac"])
        per_rank["actor/entropy_loss"].append(ent)
        per_rank["actor/pg_loss"].append(pgl)
        per_rank["actor/pg_clipfrac"].append(clip)
    for k, lists in per_rank.items():
        metrics[k] = float(v.Metric.aggregate_dp(lists))
    return metrics


# --------------------------------------------------------------------------------------------- OpenRLHF
def run_openrlhf(b: Batch, *, use_kl_loss: bool = False) -> dict[str, float]:
    """OpenRLHF 0.11.x: the actor's ``ppo_train`` and ``training_step`` (the wheel's own source) on each rank, with
    the real ``PolicyLoss``, ``aggregate_loss``, ``compute_approx_kl`` and ``iter_grad_accum_global_norm``;
    micro-batches of 2 with gradient accumulation 2; the actor's forward replaced by the batch's log-probs and
    entropies; DeepSpeed's backward/step and its ``all_reduce`` (mean over ranks) simulated. Returns rank 0's
    ``status_mean`` (what ppo_trainer logs)."""
    import torch
    o = F.openrlhf()
    adv = grpo_advantages(b)[:, None] * b.mask

    def experience(rows: list[int]):
        width = max(b.lengths[i] for i in rows)
        sl = (rows, slice(0, width))
        e = o.Experience(sequences=torch.full((len(rows), 3 + width), 5),
                         attention_mask=torch.ones(len(rows), 3 + width),
                         action_mask=b.mask[sl].bool(), action_log_probs=b.old_logp[sl].clone(),
                         base_action_log_probs=b.ref_logp[sl].clone(), advantages=adv[sl].clone(),
                         response_length=torch.tensor([float(b.lengths[i]) for i in rows]),
                         truncated=torch.tensor([float(b.truncated[i]) for i in rows]),
                         info={"reward": [b.scores[i] for i in rows]})
        e._rows = sl
        return e

    by_sequences: dict[int, Any] = {}

    class Actor:
        def train(self):
            pass

        def __call__(self, sequences, action_mask, **kw):
            e = by_sequences[id(sequences)]
            return b.logp[e._rows].clone(), types.SimpleNamespace(entropy=b.entropy[e._rows].clone())

    def rank(r: int) -> dict:
        exps = [experience(b.micro_rows(r, m)) for m in range(GA)]
        by_sequences.update({id(e.sequences): e for e in exps})
        actor = Actor()

        strategy = F.openrlhf_strategy(r, GA)
        args = types.SimpleNamespace(
            train=types.SimpleNamespace(dynamic_batch_enable=False), ds=types.SimpleNamespace(tensor_parallel_size=1),
            actor=types.SimpleNamespace(entropy_coef=0.0, aux_loss_coef=0.0),
            algo=types.SimpleNamespace(kl=types.SimpleNamespace(use_loss=use_kl_loss, init_coef=0.04,
                                                                 estimator="k3", unbiased_gradient=False)))
        trainer = types.SimpleNamespace(
            args=args, strategy=strategy, replay_buffer=F.openrlhf_buffer(exps), dataloader_pin_memory=False,
            max_epochs=1,
            actor=actor, actor_loss_fn=o.PolicyLoss(clip_eps_low=0.2, clip_eps_high=0.2), aux_loss=False,
            ema_model=None, actor_optim=None, actor_scheduler=types.SimpleNamespace(get_last_lr=lambda: [1e-6]))
        trainer.training_step = types.MethodType(o.training_step, trainer)
        real_cuda_device = torch.cuda.current_device
        torch.cuda.current_device = lambda: "cpu"          # ppo_train moves experiences to the GPU
        try:
            torch.manual_seed(0)                           # the DataLoader shuffles
            return o.ppo_train(trainer, kl_ctl=0.04)
        finally:
            torch.cuda.current_device = real_cuda_device

    return F.run_ranks(rank)[0]


# --------------------------------------------------------------------------------------------- TRL (scores)
def run_trl_scores(b: Batch) -> dict[str, float]:
    """TRL 1.16 GRPO ``_generate_and_score_completions`` on both ranks (one generation batch of GA micro-batches per
    rank: a GRPO group of 4 per rank), with one reward function named ``score`` given as a plain Python callable
    that returns the batch's scores; accelerate's module-level ``gather``/``gather_object`` simulated over the ranks.
    ``reward``, ``reward_std``, ``frac_reward_zero_std`` and ``rewards/score/*`` are appended once per generation,
    then ``log``. Returns what rank 0 logs."""
    from collections import defaultdict

    import torch
    t = F.trl()

    def rank(r: int) -> dict:
        trainer = _trl_trainer(b, beta=0.0)
        rows = b.rank_rows(r)

        def score(prompts, completions, completion_ids, **kw):
            return [b.scores[i] for i in rows]
        trainer.args.__dict__.update(gradient_accumulation_steps=GA, gradient_checkpointing_kwargs=None, report_to=[],
                                     per_device_train_batch_size=MB, per_device_eval_batch_size=MB)
        trainer.__dict__.update(
            model=types.SimpleNamespace(training=True, is_gradient_checkpointing=False), pad_to_multiple_of=None,
            mask_truncated_completions=False, num_iterations=1, vllm_importance_sampling_correction=False,
            ref_model=None, reward_funcs=[score], reward_processing_classes=[None], reward_func_names=["score"],
            reward_weights=torch.ones(1), multi_objective_aggregation="sum_then_normalize", scale_rewards="group",
            environments=None, _pending_extra_logs={}, _pending_metrics={}, log_multimodal=False,
            _logs={"prompt": [], "completion": [], "advantages": [], "images": [], "rewards": defaultdict(list),
                   "extra": defaultdict(list)})
        t.GRPOTrainer._generate_and_score_completions(trainer, [{"prompt": "p"} for _ in rows])
        t.GRPOTrainer.log(trainer, {})
        return trainer._logged[-1]

    saved = t.module.gather, t.module.gather_object
    t.module.gather, t.module.gather_object = F.sim_gather, F.sim_gather_object
    try:
        return F.run_ranks(rank)[0]
    finally:
        t.module.gather, t.module.gather_object = saved


# --------------------------------------------------------------------------------------------- veRL (driver metrics)
def run_verl_driver(b: Batch) -> dict[str, float]:
    """veRL 0.9.x driver-side metrics of one step, each from the wheel: ``compute_data_metrics``,
    ``compute_timing_metrics`` and ``compute_throughout_metrics`` (metric_utils, with fixed stage timings and
    ``meta_info["global_token_num"]`` as ray_trainer sets it), ``log_seqlen_unbalance`` (seqlen_balancing, the two
    ranks' halves as partitions), and the GDPO per-reward-function block of ``RayPPOTrainer.fit`` (compiled from
    ray_trainer.py's own text: it is inline in the training loop) on the batch's scores as reward function ``score``."""
    import numpy as np
    import torch
    from tensordict import TensorDict
    v = F.verl()
    n = len(b.lengths)
    P = max(b.prompt_lengths)
    attn = torch.zeros(n, P + WIDTH, dtype=torch.long)
    for i, k in enumerate(b.prompt_lengths):
        attn[i, P - k:P] = 1
    attn[:, P:] = b.mask.long()
    scores = torch.zeros(n, WIDTH)
    for i, k in enumerate(b.lengths):
        scores[i, k - 1] = b.scores[i]
    td = TensorDict({"prompts": torch.full((n, P), 5), "responses": torch.full((n, WIDTH), 5), "attention_mask": attn,
                     "response_mask": b.mask.long(), "token_level_scores": scores, "token_level_rewards": scores,
                     "advantages": b.mask.clone(), "returns": b.mask.clone()}, batch_size=[n])
    seqlens = attn.sum(-1).tolist()
    batch = v.DataProto(batch=td, non_tensor_batch={"score": np.array(b.scores, dtype=object)},
                        meta_info={"global_token_num": seqlens})
    metrics = dict(v.metric_utils.compute_data_metrics(batch, use_critic=False))
    metrics.update(v.metric_utils.compute_timing_metrics(batch, dict(VERL_TIMING)))
    metrics.update(v.metric_utils.compute_throughout_metrics(batch, dict(VERL_TIMING), n_gpus=b.world))
    half = n // b.world
    metrics.update(v.seqlen_balancing.log_seqlen_unbalance(
        seqlen_list=seqlens, partitions=[list(range(r * half, (r + 1) * half)) for r in range(b.world)],
        prefix="global_seqlen"))
    gdpo = v.gdpo_block()
    config = types.SimpleNamespace(algorithm={"gdpo_reward_keys": ["score"], "adv_estimator": "gdpo"})
    config.algorithm = types.SimpleNamespace(get=config.algorithm.get, adv_estimator="gdpo")
    ns = {"self": types.SimpleNamespace(config=config), "batch": batch, "metrics": metrics, "np": np,
          "AdvantageEstimator": v.core_algos.AdvantageEstimator}
    exec(gdpo, ns)                                            # noqa: S102 - the wheel's own code
    return {k: float(x) for k, x in metrics.items() if isinstance(x, (int, float, np.floating, np.integer))}


VERL_TIMING = {"gen": 2.0, "ref": 0.5, "adv": 0.1, "update_actor": 1.5, "step": 4.4}


# --------------------------------------------------------------------------------------------- the proofs
@dataclass(frozen=True)
class Key:
    framework: str
    key: str
    trainer: str | None          # the trainer whose code ran
    config: tuple = ()           # run config the code ran with (for entries with `when:`)


@dataclass
class Proof:
    canonical: str
    run: Callable[[Batch], dict[Key, float]]
    code: str                    # what ran, one line for the table


def _pick(values: dict[str, float], spec: dict[Key, str]) -> dict[Key, float]:
    return {k: float(values[name]) for k, name in spec.items()}


def _cached(fn):
    cache: dict = {}

    def wrapper(b: Batch):
        k = (id(b), fn.__name__)
        if k not in cache:
            cache[k] = (b, fn(b))
        return cache[k][1]
    wrapper.__name__ = fn.__name__
    return wrapper


trl_grpo = _cached(run_trl_grpo)
verl_run = _cached(run_verl)
openrlhf_run = _cached(run_openrlhf)
openrlhf_kl_run = _cached(lambda b: run_openrlhf(b, use_kl_loss=True))
openrlhf_kl_run.__name__ = "openrlhf_kl_run"
trl_scores = _cached(run_trl_scores)
verl_driver = _cached(run_verl_driver)


def _proof_entropy(b: Batch) -> dict[Key, float]:
    return {**_pick(trl_grpo(b), {Key("trl", "entropy", "grpo", TRL_CONFIG): "entropy"}),
            **_pick(verl_run(b), {Key("verl", "actor/entropy", "ppo"): "actor/entropy",
                                  Key("verl", "actor/entropy_loss", "ppo"): "actor/entropy_loss"}),
            **_pick(openrlhf_run(b), {Key("openrlhf", "entropy_loss", "ppo"): "entropy_loss"})}


def _proof_clip(b: Batch) -> dict[Key, float]:
    return {**_pick(trl_grpo(b), {Key("trl", "clip_ratio/region_mean", "grpo", TRL_CONFIG): "clip_ratio/region_mean"}),
            **_pick(verl_run(b), {Key("verl", "actor/pg_clipfrac", "ppo"): "actor/pg_clipfrac"}),
            **_pick(openrlhf_run(b), {Key("openrlhf", "ppo_clip_ratio", "ppo"): "ppo_clip_ratio"})}


def _proof_lengths(stat: str, verl_key: str):
    def run(b: Batch) -> dict[Key, float]:
        trl_key = f"completions/{stat}_length"
        out = {**_pick(trl_grpo(b), {Key("trl", trl_key, "grpo", TRL_CONFIG): trl_key}),
               **_pick(verl_run(b), {Key("verl", verl_key, "ppo"): verl_key})}
        if stat == "mean":
            out.update(_pick(openrlhf_run(b), {Key("openrlhf", "response_length", "ppo"): "response_length"}))
        return out
    return run


def _proof_clipped(b: Batch) -> dict[Key, float]:
    return {**_pick(trl_grpo(b),
                    {Key("trl", "completions/clipped_ratio", "grpo", TRL_CONFIG): "completions/clipped_ratio"}),
            **_pick(verl_run(b), {Key("verl", "response_length/clip_ratio", "ppo"): "response_length/clip_ratio"}),
            **_pick(openrlhf_run(b), {Key("openrlhf", "truncated", "ppo"): "truncated"})}


def _proof_score(b: Batch) -> dict[Key, float]:
    return {**_pick(verl_run(b), {Key("verl", "critic/score/mean", "ppo"): "critic/score/mean"}),
            **_pick(openrlhf_run(b), {Key("openrlhf", "reward", "ppo"): "reward"}),
            **_pick(trl_scores(b), {Key("trl", "reward", "grpo", TRL_CONFIG): "reward"})}


def _proof_reward_fn(stat: str):
    def run(b: Batch) -> dict[Key, float]:
        return {**_pick(trl_scores(b), {Key("trl", f"rewards/{{reward_fn}}/{stat}", "grpo", TRL_CONFIG):
                                        f"rewards/score/{stat}"}),
                **_pick(verl_driver(b), {Key("verl", f"gdpo/{{reward_fn}}/{stat}", "ppo"): f"gdpo/score/{stat}"})}
    run.__name__ = f"reward_fn_{stat}"
    return run


def _proof_group_std(b: Batch) -> dict[Key, float]:
    """TRL's reward_std meant the group std up to v0.26.2 (the installed release logs the batch std): run, so the
    table says which releases the pair needs."""
    return _pick(trl_scores(b), {Key("trl", "reward_std", "grpo", TRL_CONFIG): "reward_std"})


def _proof_policy_loss(b: Batch) -> dict[Key, float]:
    return {**_pick(verl_run(b), {Key("verl", "actor/pg_loss", "ppo"): "actor/pg_loss"}),
            **_pick(openrlhf_run(b), {Key("openrlhf", "policy_loss", "ppo"): "policy_loss"})}


def _proof_kl_loss(b: Batch) -> dict[Key, float]:
    return {**_pick(trl_grpo(b), {Key("trl", "kl", "grpo", TRL_CONFIG): "kl"}),
            **_pick(openrlhf_kl_run(b), {Key("openrlhf", "kl", "ppo", (("algo.kl.use_loss", True),)): "kl"})}


PROOFS: list[Proof] = [
    Proof("policy/entropy", _proof_entropy,
          "TRL GRPOTrainer._compute_loss + log; veRL core_algos.agg_loss (ray_trainer, engine ppo_loss) + "
          "Metric.aggregate_dp; OpenRLHF ActorPPOTrainer.training_step + ppo_train"),
    Proof("policy/clip_frac", _proof_clip,
          "TRL GRPOTrainer._compute_loss + log; veRL compute_policy_loss_vanilla + Metric.aggregate_dp; "
          "OpenRLHF PolicyLoss + ppo_train"),
    Proof("response/length/mean", _proof_lengths("mean", "response_length/mean"),
          "TRL GRPOTrainer._generate (rollout_func) + log; veRL compute_data_metrics; OpenRLHF ppo_train"),
    Proof("response/length/max", _proof_lengths("max", "response_length/max"),
          "TRL GRPOTrainer._generate (rollout_func) + log; veRL compute_data_metrics"),
    Proof("response/length/min", _proof_lengths("min", "response_length/min"),
          "TRL GRPOTrainer._generate (rollout_func) + log; veRL compute_data_metrics"),
    Proof("response/clip_ratio", _proof_clipped,
          "TRL GRPOTrainer._generate (rollout_func) + log; veRL compute_data_metrics; OpenRLHF ppo_train"),
    Proof("reward/score/mean", _proof_score,
          "TRL GRPOTrainer._generate_and_score_completions (reward function as a Python callable) + log; veRL "
          "compute_data_metrics; OpenRLHF ppo_train"),
    Proof("reward/fn/{reward_fn}/mean", _proof_reward_fn("mean"),
          "TRL GRPOTrainer._generate_and_score_completions + log; veRL RayPPOTrainer.fit's GDPO block (compiled from "
          "ray_trainer.py)"),
    Proof("reward/fn/{reward_fn}/std", _proof_reward_fn("std"),
          "TRL GRPOTrainer._generate_and_score_completions + log; veRL RayPPOTrainer.fit's GDPO block (compiled from "
          "ray_trainer.py)"),
    Proof("reward/group_std/mean", _proof_group_std, "TRL GRPOTrainer._generate_and_score_completions + log"),
    Proof("loss/policy", _proof_policy_loss,
          "veRL compute_policy_loss_vanilla (engine ppo_loss normalisation) + Metric.aggregate_dp; OpenRLHF "
          "PolicyLoss + aggregate_loss + ppo_train"),
    Proof("kl/ref/k3", _proof_kl_loss,
          "TRL GRPOTrainer._compute_loss (beta>0) + log; OpenRLHF training_step (use_loss, k3) + ppo_train"),
]

# Why a canonical name's pairs have no proof (a line for the table); anything else says "no proof written yet".
SOURCE_ONLY: dict[str, str] = {
    "kl/ref/k2": "the k2 (mse) KL loss: OpenRLHF's entries cover v0.6.1..v0.10.2, not the installed 0.11.2, and the "
                 "proof runs veRL's and OpenRLHF's default k3 path only; a k2 batch proof is not written yet",
    "optim/lr": "the scheduler's learning rate, read off the optimizer; no batch computation to run",
    "optim/critic_lr": "the scheduler's learning rate, read off the optimizer; no batch computation to run",
    "optim/grad_norm": "the norm DeepSpeed/FSDP/accelerate clipping returns; needs the real distributed engines "
                       "(DeepSpeed and FSDP do not run here)",
    "optim/critic_grad_norm": "the norm DeepSpeed/FSDP clipping returns; DeepSpeed and FSDP do not run here",
    "progress/step": "a step counter, not computed from a batch",
    "progress/tokens": "a cumulative token counter; TRL's lives in Trainer state, veRL's in the SFT loop",
    "time/step": "wall-clock timers; no batch quantity to compare",
    "time/generation": "wall-clock timers; no batch quantity to compare",
    "time/{stage}": "wall-clock timers; no batch quantity to compare",
    "kl/coef": "a configured coefficient echoed back (or the KL controller's value); nothing computed from a batch",
    "loss/total": "the whole training loss of DPO/RM/SFT/KTO trainers: needs each trainer's model forward inside "
                  "DeepSpeed (OpenRLHF) or a Trainer loop; not written yet",
    "preference/accuracy": "computed inline in OpenRLHF's DeepSpeed DPO/RM training loop (no CPU path); "
                           "issue 11 item 1 says it is the last micro-batch, not a window mean",
    "preference/reward/chosen": "computed inline in OpenRLHF's DeepSpeed DPO/KTO training loop (no CPU path)",
    "preference/reward/rejected": "computed inline in OpenRLHF's DeepSpeed DPO/KTO training loop (no CPU path)",
    "preference/kto_kl": "computed inline in OpenRLHF's DeepSpeed KTO training loop (no CPU path)",
    "preference/score/mean": "computed inline in OpenRLHF's DeepSpeed RM training loop (no CPU path)",
    "loss/nll": "computed inline in OpenRLHF's DeepSpeed DPO training loop (no CPU path)",
    "loss/aux": "the MoE router's auxiliary loss; needs a mixture-of-experts model forward",
    "kl/rollout/k1": "needs vLLM rollout log-probs (OpenRLHF's is_correction path, veRL's rollout_corr_helper); "
                  "not written yet",
    "tools/calls/mean": "needs a tool-calling rollout (TRL tools loop, veRL agent loop); not written yet",
    "reward/group_std/mean": "OpenRLHF computes it in the Ray experience maker (remote reward models); "
                             "not written yet",
    "reward/shaped/mean": "TRL's entries are PPOv2/RLOO/online DPO (rollout loops with a model); not written yet",
    "advantage/mean": "TRL's entries are experimental trainers (a2po, dppo); not written yet",
    "kl/ref/k1": "OpenRLHF's exact `kl` (use_loss, default k1) entries end at v0.10.2; the installed 0.11.2 is "
                 "approximate [weighting], shown by tests/frameworks/test_fidelity_openrlhf.py (2.375 vs 1.750); "
                 "veRL's kl_loss_type kl "
                 "pair is not written yet",
    "loss/value": "TRL's exact entries are the PPOv2/legacy trainers, not in the installed release; OpenRLHF's "
                  "critic_loss (v0.10.4+) is shown to be the token mean by tests/frameworks/test_fidelity_openrlhf.py "
                  "(the wheel's "
                  "CriticPPOTrainer), but a pair proof against veRL's engine-path critic is not written yet",
    "response/length/max": "",
    "response/length/min": "",
    "perf/mfu/policy_update": "MFU: the engine's estimated FLOPs over the device's promised FLOPs (veRL's "
                              "FlopsCounter needs a real accelerator and model config); nothing to fingerprint on CPU",
    "perf/mfu/critic_update": "MFU: the engine's estimated FLOPs over the device's promised FLOPs (veRL's "
                              "FlopsCounter needs a real accelerator and model config); nothing to fingerprint on CPU",
    "perf/mfu/policy_logprob": "MFU of the old-log-prob pass: needs a real device FLOPs estimate (and veRL 0.9.1's "
                               "V1 trainer does not log it); nothing to fingerprint on CPU",
    "perf/memory/max_reserved_gb": "the accelerator's peak reserved memory (torch.cuda / the device's allocator): "
                                   "a device reading, not computed from a batch; none on CPU",
}


# --------------------------------------------------------------------------------------------- derived rules
def _derive(inputs: dict[str, float], source: str, config: dict | None = None) -> dict[str, float]:
    """trackbridge's own derivation engine on canonical values."""
    from trackbridge.derive import make_deriver
    d = make_deriver(_registry(), source=source, config=config)
    out = dict(inputs)
    d.apply(out, step=1)
    return out


def _derived_clip_frac(b: Batch) -> tuple[float, float]:
    m = trl_grpo(b)
    out = _derive({"policy/clip_frac_low": m["clip_ratio/low_mean"],
                   "policy/clip_frac_high": m["clip_ratio/high_mean"]}, "trl/grpo")
    return out["policy/clip_frac"], m["clip_ratio/region_mean"]


def _verl_canonical(b: Batch, drop: tuple[str, ...]) -> dict[str, float]:
    """veRL's driver metrics translated to canonical names by trackbridge, without the names being derived."""
    from trackbridge.pipeline import Translator
    res = Translator(f"verl/ppo@{F.release('verl')}", "canonical", registry=_registry()).translate(verl_driver(b))
    return {k: v for k, v in res.metrics.items() if k not in drop}


def _derived_from_verl(target: str, logged: Callable[[dict], float], drop: tuple[str, ...] = ()):
    def fn(b: Batch) -> tuple[float, float]:
        out = _derive(_verl_canonical(b, (target,) + drop), f"verl/ppo@{F.release('verl')}", {"num_gpus": b.world})
        return out[target], logged(verl_driver(b))
    return fn


_VERL_DERIVED = "veRL compute_data_metrics / compute_timing_metrics / compute_throughout_metrics / " \
                "log_seqlen_unbalance, translated by trackbridge and derived, vs "

# rule name -> (proof: batch -> (derived value, the value the framework logs), what ran)
DERIVED_PROOFS: dict[str, tuple[Callable[[Batch], tuple[float, float]], str]] = {
    "policy/clip_frac": (_derived_clip_frac, "TRL GRPOTrainer._compute_loss + log: clip_ratio/low_mean + high_mean "
                                             "through trackbridge's deriver vs clip_ratio/region_mean"),
    "perf/global_seqlen/minmax_diff": (
        _derived_from_verl("perf/global_seqlen/minmax_diff", lambda m: m["global_seqlen/minmax_diff"]),
        _VERL_DERIVED + "veRL's global_seqlen/minmax_diff"),
    "perf/response_tokens_per_step": (
        _derived_from_verl("perf/response_tokens_per_step",
                           lambda m: m["timing_s/gen"] * 1000 / m["timing_per_token_ms/gen"],
                           drop=("time/per_token_ms/gen",)),
        _VERL_DERIVED + "the response tokens veRL divides timing_s/gen by (timing_s/gen * 1000 / "
                        "timing_per_token_ms/gen)"),
    "time/per_token_ms/gen": (
        _derived_from_verl("time/per_token_ms/gen", lambda m: m["timing_per_token_ms/gen"]),
        _VERL_DERIVED + "veRL's timing_per_token_ms/gen"),
    "time/per_token_ms/{stage}": (
        _derived_from_verl("time/per_token_ms/update_actor", lambda m: m["timing_per_token_ms/update_actor"],
                           drop=("time/per_token_ms/ref", "time/per_token_ms/adv")),
        _VERL_DERIVED + "veRL's timing_per_token_ms/update_actor"),
    "perf/throughput": (
        _derived_from_verl("perf/throughput", lambda m: m["perf/throughput"]),
        _VERL_DERIVED + "veRL's perf/throughput (config num_gpus = 2 ranks)"),
}
DERIVED_SOURCE_ONLY: dict[str, str] = {
    "perf/tokens_per_step": "TRL's cumulative num_tokens lives in Trainer state and is logged once per logging step; "
                            "a proof needs two logging steps of a real Trainer loop (no framework logs tokens per step "
                            "from a counter to compare with); not written yet",
    "perf/tokens_per_s": "a wall-clock rate between two logged rows; no framework logs the same instantaneous rate "
                         "(TRL's eps is int-rounded and since the start of training)",
    "perf/samples_per_s": "a wall-clock rate between two logged rows; TRL PPO's eps is int(episodes / seconds since "
                          "the start of training), a different quantity, and the trainer is not in the installed "
                          "release",
    "reward/shaped/mean": "TRL PPOv2 (its citation) is not in the installed release",
    "reward/kl_penalty/mean": "TRL PPOv2 (its citation) is not in the installed release",
    "kl/coef": "TRL PPOv2 (its citation) is not in the installed release",
    "return/std": "legacy TRL PPOTrainer (<= 0.11.4) is not in the installed release",
    "value/std": "legacy TRL PPOTrainer (<= 0.11.4) is not in the installed release",
    "value/explained_variance": "legacy TRL PPOTrainer (<= 0.11.4) is not in the installed release",
    "preference/reward/margin": "needs TRL DPOTrainer's loss on a model forward; not written yet",
}


def derived_outcomes() -> list[tuple[str, str, str, str]]:
    """(rule name, formula, status, detail) for every derived rule the mappings ship."""
    from trackbridge.derive import rules_for
    rows = []
    for rule in rules_for(_registry()):
        if rule.name in DERIVED_PROOFS:
            fn, code = DERIVED_PROOFS[rule.name]
            vals = {n: fn(BATCHES[even]) for n, even in (("uneven", False), ("even", True))}
            rel = ", ".join(f"{n} {x:.6g} vs {y:.6g}" for n, (x, y) in vals.items())
            ok = all(close(x, y) for x, y in vals.values())
            rows.append((rule.name, rule.formula, "proven equal" if ok else "proven different", f"{rel} ({code})"))
        else:
            rows.append((rule.name, rule.formula, "source-only",
                         DERIVED_SOURCE_ONLY.get(rule.name, "no proof written yet")))
    return rows


# --------------------------------------------------------------------------------------------- enumeration
INSTALLED = {"trl": ("trl", "grpo"), "verl": ("verl", "ppo"), "openrlhf": ("openrlhf", "ppo")}


def _registry():
    from trackbridge.schema.loader import load_registry
    return load_registry()


def _vkey(s: str) -> tuple:
    import re
    s = s.lstrip("v")
    parts = re.findall(r"\d+|[a-z]+", s)
    return tuple(int(p) if p.isdigit() else -1 for p in parts)


def covers(reg, e, version: str) -> bool:
    """Does the entry's release range include the installed ``version`` (a release newer than the mapping's newest
    counts as covered when the entry is still open: ``until`` omitted)?"""
    fw = reg.frameworks[e.framework]
    rel = [r for r in fw.releases if _vkey(r) == _vkey(version)]
    if rel:
        i = fw.releases.index(rel[0])
        return e.since <= i <= e.until
    if _vkey(version) > _vkey(fw.releases[-1]):
        return e.until == float("inf")
    return False


def releases_of(reg, e) -> str:
    fw = reg.frameworks[e.framework]
    lo = fw.releases[int(e.since)]
    hi = "now" if e.until == float("inf") else fw.releases[int(e.until)]
    return f"{lo}..{hi}" if lo != hi else lo


@dataclass
class Pair:
    canonical: str
    a: Any
    b: Any

    @property
    def ident(self) -> str:
        return f"{self.canonical}: {label(self.a)} ~ {label(self.b)}"


def label(e) -> str:
    tr = ",".join(sorted(e.trainers)) if e.trainers else "*"
    return f"{e.framework} `{e.key}` [{tr}]"


def shared_names(reg=None) -> dict[str, list]:
    """Every canonical name two or more frameworks map, with its entries (framework order, then file order)."""
    reg = reg or _registry()
    by: dict[str, list] = {}
    for name in sorted(reg.frameworks):
        for e in reg.frameworks[name].entries:
            by.setdefault(e.canonical, []).append(e)
    return {c: es for c, es in sorted(by.items()) if len({e.framework for e in es}) > 1}


def pairs(reg=None) -> list[Pair]:
    """Every pair of entries of two frameworks that share a canonical name."""
    return [Pair(c, a, b) for c, es in shared_names(reg).items() for a, b in itertools.combinations(es, 2)
            if a.framework != b.framework]


def exact_pairs(reg=None) -> list[Pair]:
    """The pairs whose hand-written fidelity is exact on both sides (legacy entries: the value proofs run them)."""
    return [p for p in pairs(reg) if p.a.exact and p.b.exact]


def _resolved(reg, e):
    from trackbridge.translate.fidelity import resolve
    fw = reg.frameworks[e.framework]
    newest = float(min(e.until, len(fw.releases) - 1))
    return resolve(e, fw, None, newest, newest, {})


def computed(reg, a, b, proven=None) -> tuple[bool, str | None]:
    """(exact?, why not) of a pair, as the engine decides it: their stated reductions compared directly (each at the
    newest release it covers, under its framework's defaults), and, when equal, exact only if both entries are
    proven (``proven``: (file, line) -> proofs; default the registry's, mappings/proofs.yaml); where an entry states
    none, its hand-written fidelity, and the other's reduction against the canonical reference."""
    from trackbridge.translate.fidelity import judge, reference, unproven
    if a.reduce is not None and b.reduce is not None:
        ra, rb = _resolved(reg, a), _resolved(reg, b)
        why = judge(ra, rb) or unproven([(a, ra), (b, rb)], reg.proven if proven is None else proven,
                                        "equal reductions")
        return why is None, why
    reasons = []
    for e in (a, b):
        if e.reduce is None:
            if not e.exact:
                reasons.append(f"{e.framework} `{e.key}`: {e.reason}")
            continue
        metric = reg.canonical.find(e.canonical)
        ref = reference(metric) if metric is not None else None
        why = judge(_resolved(reg, e), ref) if ref is not None else "no reference reduction"
        if why:
            reasons.append(why)
    return not reasons, "; ".join(reasons) or None


def _match(reg, e, proof_keys: dict[Key, float]) -> tuple[Key | None, str]:
    """The value proof's key that stands for entry ``e``, or None and why not."""
    if e.framework not in INSTALLED:        # a framework no value proof runs (its proofs are fingerprints)
        return None, f"no value proof runs {e.framework}"
    dist, _ = INSTALLED[e.framework]
    version = F.release(dist)
    same_key = [k for k in proof_keys if k.framework == e.framework and k.key == e.key]
    if not same_key:
        return None, f"no proof runs {e.framework}'s `{e.key}`"
    if not covers(reg, e, version):
        return None, f"{e.framework} `{e.key}` is mapped for {releases_of(reg, e)}; installed {dist} {version}"
    for k in same_key:
        if e.trainers is not None and k.trainer not in e.trainers:
            continue
        if e.condition_holds(dict(k.config)) is False:
            continue
        if not e.when:      # a `when:` entry that the proof's config confirms replaces the default one
            for other in reg.frameworks[e.framework].entries:
                if other is not e and other.key == e.key and other.when and other.canonical == e.canonical \
                        and (other.trainers is None or k.trainer in other.trainers) and covers(reg, other, version) \
                        and other.condition_holds(dict(k.config)) is True and not other.exact:
                    cfg = ", ".join(f"{n}={v}" for n, v in k.config)
                    return None, (f"with {cfg} (as the proof runs) the mapping marks {e.framework} `{e.key}` "
                                  f"approximate: {other.reason}")
        return k, ""
    return None, f"the proof runs {e.framework} trainer {same_key[0].trainer}, the entry is for " \
                 f"{','.join(sorted(e.trainers or []))}"


@dataclass
class Outcome:
    pair: Pair
    status: str                  # proven equal | proven different | unproven
    detail: str
    values: dict[str, tuple[float, float]] = field(default_factory=dict)   # batch -> (a, b) (value proofs)
    exact: bool = False          # the pair's fidelity: computed from stated reductions, else hand-written
    gap: float | None = None     # proven different: the relative gap measured on a proof's batch


STATUSES = ("proven equal", "proven different", "unproven")
_proof_cache: dict[tuple[str, bool], dict[Key, float]] = {}


def proof_values(proof: Proof, even: bool) -> dict[Key, float]:
    k = (proof.canonical, even)
    if k not in _proof_cache:
        _proof_cache[k] = proof.run(BATCHES[even])
    return _proof_cache[k]


class _Batches(dict):
    def __missing__(self, even):
        self[even] = make_batch(even)
        return self[even]


BATCHES: dict[bool, Batch] = _Batches()


def close(x: float, y: float) -> bool:
    return math.isclose(x, y, rel_tol=TOL, abs_tol=TOL)


def _fingerprinted(e, records) -> list:
    from _support.proven import entry_ident
    return records.get(entry_ident(e), [])


def proven_map(records: dict) -> dict[tuple[str, int], Any]:
    """What the engine reads from mappings/proofs.yaml, made from the proofs that ran: (file, line) -> proofs."""
    return {(rs[0].entry.file, rs[0].entry.line): [r.proof for r in rs] for rs in records.values() if rs}


def _record_order(r) -> tuple:
    return (r.proof, r.key, repr(r.stated), r.logged)


def _measurable(ra: list, rb: list, fw_a: str, fw_b: str):
    """(record measured, record whose reduction it is measured with, their frameworks): every pairing of the two
    entries' records, the first ones first, each way round."""
    for fa in ra:
        for fb in rb:
            yield fa, fb, fw_a, fw_b
            yield fb, fa, fw_b, fw_a


def decide(reg, pair: Pair, records: dict | None = None) -> Outcome:
    """A pair's status. Fingerprint proofs (tests/_support/proven.py) decide pairs whose entries state their
    reductions: proven when both were fingerprinted, equal when the fingerprints are one computation (and the
    stated reductions agree), else different, with the gap measured on a proof's batch. Pairs of legacy entries
    keep the value proofs of issue 11 (both frameworks' code on one batch)."""
    records = records if records is not None else {}
    exact, why = computed(reg, pair.a, pair.b, proven_map(records))
    if pair.a.reduce is not None and pair.b.reduce is not None:
        ra, rb = _fingerprinted(pair.a, records), _fingerprinted(pair.b, records)
        missing = [e.framework for e, r in ((pair.a, ra), (pair.b, rb)) if not r]
        if missing:
            stated_equal = computed(reg, pair.a, pair.b, _ALL_PROVEN)[0]
            cannot = SOURCE_ONLY.get(pair.canonical)
            return Outcome(pair, "unproven", f"no fingerprint proof of the {' and '.join(missing)} "
                           f"entr{'y' if len(missing) == 1 else 'ies'} yet (stated reductions "
                           f"{'equal: approximate until proven' if stated_equal else 'differ: approximate'})"
                           + (f"; {cannot}" if cannot else ""), exact=exact)
        # each proof asserted that its entry's statement is what the code does; an entry several proofs saw is
        # taken in the proofs' name order, so the report does not depend on the order the proofs ran in
        ra, rb = sorted(ra, key=_record_order), sorted(rb, key=_record_order)
        fa, fb = ra[0], rb[0]
        if exact:
            return Outcome(pair, "proven equal", f"equal stated reductions, each fingerprinted ({fa.proof}; "
                           f"{fb.proof})", exact=exact)
        # the gap, measured on a batch both reductions apply to: a framework that logs one row per step cannot be
        # asked what it logs for a row of several steps, so the other proofs' batches are tried too
        for mine, theirs, fw_mine, fw_theirs in _measurable(ra, rb, pair.a.framework, pair.b.framework):
            try:
                other = mine.value_of(theirs.stated)
            except (AssertionError, ArithmeticError):      # no value there (FP.Undefined), or 0 tokens to divide by
                continue
            gap = abs(mine.logged - other) / max(abs(mine.logged), 1e-12)
            if gap < TOL:
                return Outcome(pair, "unproven", f"fingerprinted, but the difference does not show on the proofs' "
                               f"batches (no proof measures it): {why}", exact=exact)
            return Outcome(pair, "proven different", f"on {mine.proof}'s batch {fw_mine} logged {mine.logged:.6g}; "
                           f"{fw_theirs}'s reduction gives {other:.6g} ({gap:.1%} apart): {why}", exact=exact,
                           gap=gap)
        return Outcome(pair, "unproven", f"fingerprinted, but neither proof's batch fits the other's reduction (one "
                       f"row per step against a row of several): {why}", exact=exact)
    unstated = [e.framework for e in (pair.a, pair.b) if e.reduce is None]     # none ship (a test says so)
    return Outcome(pair, "unproven", f"the {' and '.join(unstated)} reduction unstated: approximate", exact=exact)


_ALL_PROVEN = EveryEntryProven()       # every entry counted proven: the pair's stated reductions alone


def outcomes(reg=None, records: dict | None = None) -> list[Outcome]:
    reg = reg or _registry()
    return [decide(reg, p, records) for p in pairs(reg)]


def installed_releases() -> str:
    """What code the proofs run: the installed wheels, and the vendored release tags' files."""
    from _support import proofs_corpus as C
    from _support import releases as R
    wheels = ", ".join(f"{d} {' and '.join([F.release(d), *R.installed(d)])}" for d in C.RUNNABLE.values())
    tags = ", ".join(f"{fw} {' and '.join(f'{t} ({V.provenance(fw, t).commit[:10]})' for t in V.tags(fw))}"
                     for fw in V.frameworks())
    wheels += " (their wheels: the pinned release, then tests/releases.txt's)"
    return f"{wheels}; {tags} (the tag's files, vendored)" if tags else wheels


def fingerprint_proofs() -> tuple[list, dict[str, str], dict]:
    """Run every registered fingerprint proof (tests/_support/proven.py): (proofs that ran, {proof: why not}, the
    records by entry)."""
    from _support import proven
    ran, failed = proven.run_all()
    return ran, failed, dict(proven.RECORDS)


def proofs_yaml(records: dict, reg=None) -> str:
    """mappings/proofs.yaml: every entry a fingerprint proof saw, as the engine matches it (schema/proofs.py)."""
    import yaml

    from trackbridge.schema.proofs import PROOFS_FORMAT, identity
    reg = reg or _registry()
    rows = []
    for rs in sorted((rs for rs in records.values() if rs), key=lambda rs: (rs[0].entry.framework,
                                                                          Path(rs[0].entry.file).name,
                                                                          rs[0].entry.line)):
        e = rs[0].entry
        runs = []
        for r in rs:
            cfg = ", ".join(f"{k}={v}" for k, v in r.config)
            runs.append(f"{r.proof} ({r.framework} {r.release}{', ' + cfg if cfg else ''})")
        rows.append({"entry": identity(e, reg.frameworks[e.framework], reg.canonical),
                     "proofs": list(dict.fromkeys(runs))})
    head = ("# Generated by `python tests/_support/fidelity_proofs.py` (with docs/fidelity-proofs.md); do not edit:\n"
            "# tests/frameworks/test_fidelity_proofs.py fails when it is out of date. Each record names a framework\n"
            "# entry whose stated reduction a fingerprint proof saw by running that framework's own code (the\n"
            "# installed release and config it ran). The engine (trackbridge/schema/proofs.py) reads it: two entries\n"
            "# translate as exact only when their stated reductions are equal and both are here; an entry whose\n"
            "# meaning was edited since (the `meaning` digest: reduction, sign and scale, canonical target) is\n"
            "# unproven until the proofs run again.\n")
    body = yaml.safe_dump({"format": PROOFS_FORMAT, "proven": rows}, sort_keys=False, width=1000,
                          default_flow_style=None, allow_unicode=True)
    return head + body


#: Why a framework's code cannot be installed: it has no wheel on the package index (checked on the package index,
#: 2026-12-02). Its proofs run the release tag's own files instead, vendored verbatim with their licence in
#: tests/data/frameworks/<framework>/ (tests/_support/vendored.py).
NO_WHEEL = {
    "nemo_rl": "no release on the package index: `nemo-rl` 0.0.0 there is a placeholder (nemo_rl/__init__.py and "
               "package_info.py only)",
    "slime": "no release on the package index: `slime` 0.0.0 there is an empty placeholder sdist",
    "skyrl": "no release on the package index (`skyrl-train` is not there; `skyrl-gym` holds the environments, not "
             "the trainer's metric code)",
    "prime_rl": "no release on the package index (`prime-rl` is not there)",
    "roll": "no release on the package index: `roll` there is another project (pyrates/roll, an HTTP framework)",
}
#: Why a framework has no proof at all: no wheel, and its files are not vendored either
CANNOT_RUN = {name: f"{why}, and its files are not vendored (tests/_support/vendored.py)"
              for name, why in NO_WHEEL.items() if name not in V.frameworks()}


def coverage(reg, records: dict, outs: list[Outcome]) -> list[str]:
    """The coverage per framework: entries proven of entries, cross-framework pairs exact of pairs, and why a
    framework has no proof."""
    proven = proven_map(records)
    lines = ["## Coverage per framework", "",
             "| framework | entries | proven | pairs with another framework | exact | why no proof |",
             "|---|---|---|---|---|---|"]
    tot = [0, 0, 0, 0]
    for name, fw in sorted(reg.frameworks.items()):
        es = [*fw.entries, *fw.template_entries]
        n_proven = sum((e.file, e.line) in proven for e in es)
        mine = [o for o in outs if name in (o.pair.a.framework, o.pair.b.framework)]
        row = [len(es), n_proven, len(mine), sum(o.exact for o in mine)]
        tot = [t + r for t, r in zip(tot, row)]
        why = CANNOT_RUN.get(name, "") if not n_proven else ""
        lines.append(f"| {name} | {row[0]} | {row[1]} ({row[1] / max(row[0], 1):.0%}) | {row[2]} | {row[3]} | "
                     f"{why} |")
    pairs, exact = len(outs), sum(o.exact for o in outs)
    lines += [f"| **all** | {tot[0]} | {tot[1]} ({tot[1] / max(tot[0], 1):.0%}) | {pairs} | {exact} | |", ""]
    return lines


def corpus_lines(reg, records: dict) -> list[str]:
    """The entries the real logs hit (tests/_support/proofs_corpus.py): per framework, hit and proven, and every
    unproven one with why (grouped by the reason)."""
    from _support import proofs_corpus as C
    figs = C.figures(reg, proven_map(records))
    lines = ["## Entries the real logs hit", "",
             "The mapping entries that the keys of the real-log corpus (tests/data/real/), the parsed public logs "
             "(tests/data/public-logs/) and the sample inputs (examples/) translate with, each log read as a user "
             "reads it (the source detected from its keys): an entry is counted once, however many logs hit it.", "",
             "| framework | entries hit | proven | unproven |", "|---|---|---|---|"]
    for f in figs:
        lines.append(f"| {f.framework} | {f.hit} | {f.proven} ({f.proven / max(f.hit, 1):.0%}) | {len(f.unproven)} |")
    hit, done = sum(f.hit for f in figs), sum(f.proven for f in figs)
    lines += [f"| **all** | {hit} | {done} ({done / max(hit, 1):.0%}) | {hit - done} |", ""]
    for f in figs:
        if not f.unproven:
            continue
        lines += [f"### {f.framework}: the {len(f.unproven)} unproven", ""]
        by: dict[str, list] = {}
        for e, why, _n in f.unproven:
            by.setdefault(why, []).append(e)
        for why, es in by.items():
            keys = ", ".join(f"{label(e)} ({releases_of(reg, e)})" for e in es)
            lines.append(f"* {why} ({len(es)}): {keys}")
        lines.append("")
    return lines


def table(reg=None, fingerprints=None) -> str:
    reg = reg or _registry()
    ran, failed, records = fingerprints or fingerprint_proofs()
    outs = outcomes(reg, records)
    derived = derived_outcomes()
    counts = {s: sum(o.status == s for o in outs) for s in STATUSES}
    names = shared_names(reg)
    lines = [
        "# Fidelity proofs by execution",
        "",
        "Generated by `python tests/_support/fidelity_proofs.py` from the mappings and from running the frameworks' "
        "own code (tests/frameworks/test_fidelity_proofs.py checks it is up to date). For every canonical name two "
        "or more frameworks map, every pair of entries of two frameworks: *proven equal*, *proven different* (with "
        "the gap measured) or *unproven* (with why). **Proven** means both entries' reductions were fingerprinted "
        "by a proof that runs the framework's code (tests/_support/proven.py: the installed wheel, or for a framework "
        "without one its release tag's files, vendored verbatim with their licence in tests/data/frameworks/<name>/); "
        "the entries proven are shipped in "
        "mappings/proofs.yaml, which the engine reads. A pair is **exact** when the two entries' stated reductions "
        "are equal (docs/reductions.md; under each framework's default config) and both are proven; stated equal "
        "but not proven, it translates as approximate (\"stated, not proven\", naming the entry that lacks a "
        "proof). Every shipped entry states its reduction (a test says so), so no pair keeps a hand-written fidelity.",
        "",
        f"Releases run: {installed_releases()} (CPU).",
        "",
        f"**{len(names)} shared canonical names, {len(outs)} pairs: {counts['proven equal']} proven equal, "
        f"{counts['proven different']} proven different, {counts['unproven']} unproven**; "
        f"{sum(o.exact for o in outs)} pairs exact. Fingerprint proofs: {len(ran)} ran "
        f"({sum(p.assertions for p in ran)} assertions, {sum(len(p.records) for p in ran)} entries fingerprinted)"
        + (f", {len(failed)} could not run" if failed else "") + "; derived rules: "
        + ", ".join(f"{sum(r[2] == st for r in derived)} {st}" for st in ("proven equal", "proven different",
                                                                          "source-only")) + ".",
        "",
        *coverage(reg, records, outs),
        *corpus_lines(reg, records),
        "## Fingerprint proofs", "",
        "| proof | framework | trainer | release | entries fingerprinted | assertions |", "|---|---|---|---|---|---|"]
    for p in sorted(ran, key=lambda p: p.name):       # one order whatever ran first (in this process or at import)
        keys = ", ".join(f"`{r.key}`" for r in p.records) or "-"
        lines.append(f"| {p.name} | {p.framework} | {p.trainer or '*'} | {p.release} | {keys} | {p.assertions} |")
    for name, why in sorted(failed.items()):
        lines.append(f"| {name} | | | | {why.replace('|', '/')} | |")
    if not ran and not failed:
        lines.append("| (none registered yet) | | | | | |")
    lines += ["", "## By canonical name", ""]
    by_name: dict[str, list[Outcome]] = {}
    for o in outs:
        by_name.setdefault(o.pair.canonical, []).append(o)
    for name, group in by_name.items():
        c = {s: sum(o.status == s for o in group) for s in STATUSES}
        lines += [f"### `{name}`", "",
                  f"{len(group)} pairs: {c['proven equal']} proven equal, {c['proven different']} proven different, "
                  f"{c['unproven']} unproven; {sum(o.exact for o in group)} exact.", ""]
        proven_rows = [o for o in group if o.status != "unproven"]
        if proven_rows:
            lines += ["| A (releases) | B (releases) | status | evidence |", "|---|---|---|---|"]
            for o in proven_rows:
                p = o.pair
                lines.append(f"| {label(p.a)} ({releases_of(reg, p.a)}) | {label(p.b)} ({releases_of(reg, p.b)}) | "
                             f"{o.status} | {o.detail.replace('|', '/')} |")
            lines.append("")
        why: dict[str, list[Outcome]] = {}
        for o in group:
            if o.status == "unproven":
                why.setdefault(o.detail, []).append(o)
        for reason, items in why.items():
            pairs_text = "; ".join(f"{label(o.pair.a)} ({releases_of(reg, o.pair.a)}) ~ {label(o.pair.b)} "
                                   f"({releases_of(reg, o.pair.b)})" for o in items)
            lines.append(f"* unproven ({len(items)}): {reason}. Pairs: {pairs_text}")
        lines.append("")
    lines += ["## Derived rules", "", "Each rule of mappings/derived.yaml, computed by trackbridge's deriver from "
              "the values a framework logs, against the value that framework logs itself.", "",
              "| rule | formula | status | evidence or reason |", "|---|---|---|---|"]
    for name, formula, status, detail in derived:
        lines.append(f"| `{name}` | `{formula}` | {status} | {detail.replace('|', '/')} |")
    return "\n".join(lines) + "\n"


README = ROOT / "docs" / "translation.md"    # the proofs coverage, between its markers
README_BEGIN, README_END = "<!-- proofs-coverage: generated by tests/_support/fidelity_proofs.py -->", \
    "<!-- /proofs-coverage -->"


def readme_block(reg=None, fingerprints=None) -> str:
    """The README's coverage figures (between its markers): the summary line and the coverage per framework."""
    reg = reg or _registry()
    ran, _failed, records = fingerprints or fingerprint_proofs()
    outs = outcomes(reg, records)
    counts = {s: sum(o.status == s for o in outs) for s in STATUSES}
    head = (f"{len(shared_names(reg))} shared canonical names, {len(outs)} pairs: {counts['proven equal']} proven "
            f"equal (the only exact pairs), {counts['proven different']} proven different (each gap measured), "
            f"{counts['unproven']} unproven (each with why); {len(ran)} fingerprint proofs "
            f"({sum(p.assertions for p in ran)} assertions).")
    table_lines = coverage(reg, records, outs)[2:]          # without the section's heading
    from _support import proofs_corpus as C
    figs = C.figures(reg, proven_map(records))
    hit, done = sum(f.hit for f in figs), sum(f.proven for f in figs)
    per = ", ".join(f"{f.framework} {f.proven}/{f.hit}" for f in figs)
    corpus = (f"Entries the real logs hit (the corpus, the public logs and the examples): {done} of {hit} proven "
              f"({per}); each unproven one says why in docs/fidelity-proofs.md.")
    return "\n".join([README_BEGIN, head, "", *table_lines[:-1], "", corpus, README_END])


def update_readme(text: str, block: str) -> str:
    i, j = text.index(README_BEGIN), text.index(README_END) + len(README_END)
    return text[:i] + block + text[j:]


if __name__ == "__main__":
    # written here, not through stdout: the frameworks' own code prints (progress bars, banners) while the proofs run
    found = fingerprint_proofs()
    PROOFS_FILE.write_text(proofs_yaml(found[2]), encoding="utf-8")
    DOC.write_text(table(fingerprints=found), encoding="utf-8")
    README.write_text(update_readme(README.read_text(encoding="utf-8"), readme_block(fingerprints=found)),
                      encoding="utf-8")
    print(f"wrote {PROOFS_FILE.relative_to(ROOT)}, {DOC.relative_to(ROOT)} and docs/translation.md's coverage",
          file=sys.stderr)
