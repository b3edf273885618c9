"""veRL's older releases' own training-step code, run on CPU for the fingerprint proofs of the entries whose range ends
before 0.9.1 (tests/frameworks/test_proof_verl_old.py; the releases tests/releases.txt lists, each proof in a child
process with the release first on sys.path, tests/_support/releases.py).

What runs is the release's code: the legacy FSDP workers' ``DataParallelPPOActor.update_policy`` (verl/workers/actor/
dp_actor.py) and ``DataParallelPPOCritic.update_critic`` (verl/workers/critic/dp_critic.py) with the release's
``compute_policy_loss`` / ``compute_value_loss`` / ``agg_loss`` / ``kl_penalty`` (verl/trainer/ppo/core_algos.py) and
``_optimizer_step`` (clip_grad_norm_ on a plain module, the branch dp_actor.py takes for a non-FSDP module), the
worker's ``DataProto(meta_info={"metrics": metrics})`` output collected over the simulated ranks with the release's
own ``DataProto.concat`` (what the single controller's DP_COMPUTE_PROTO collect does, protocol.py) and reduced with the
release's ``reduce_metrics`` (verl/utils/metric/utils.py), as ray_trainer.py's fit() does; the driver's
``compute_data_metrics`` (verl/trainer/ppo/metric_utils.py).

Stand-ins, each for what a CPU machine lacks and the metric code does not compute:

* ``_forward_micro_batch`` (the HF model's forward with remove-padding / ulysses): a tiny differentiable policy
  (:class:`TinyLM`: per-position logits from an embedding of the response token and its position) whose
  log-probabilities and entropies (veRL's own ``entropy_from_logits``) move with every optimizer step; the critic's
  the same form with one output (the value head);
* ``torch.distributed.get_rank`` / ``get_world_size``: the simulated rank (the workers print on rank 0 only); the
  ranks run one after the other, each its own actor and optimizer (FSDP's gradient all-reduce is not simulated: the
  metrics are each rank's own, the driver sees them as on a cluster);
* the worker's normalisation of ``ppo_mini_batch_size`` (fsdp_workers.py: times rollout.n, divided by the
  data-parallel size) is done here: the configs hold the per-rank sizes the worker would have set;
* GPUMemoryLogger's device reading around update_policy / update_critic (a log line): zeros;
* for ``ActorRolloutRefWorker.update_actor`` / ``CriticWorker.update_critic`` (fsdp_workers.py, compiled from the
  file's text without the dispatch / profiler decorators, :func:`run_worker`): ``self`` is a namespace holding the
  real actor / critic, optimizer and scheduler (``get_constant_schedule_with_warmup``); the FlopsCounter (needs the
  HF model config), ``get_torch_device()``'s memory readings and psutil's used memory are made-up per-rank numbers
  (:data:`READINGS`), since only their reduction over the ranks is read; the ulysses sharding manager is the
  identity it is with sequence parallel size 1;
* the worker's ``compute_log_prob`` wrapping of dp_actor's two tensors into a DataProto (:func:`run_old_log_prob`);
  the trainer's lines after it are ``RayPPOTrainer.fit``'s own text, executed as is;
* ``torch.distributed.all_gather`` for ``topk_reduce_ratio_min_max``: the simulated group's exchange on threads
  (framework_code.run_ranks).

Nothing here computes a metric: what the proofs compare the logged values with is *captured* while veRL runs (the
per-token matrices and masks handed to ``agg_loss`` and ``masked_mean``, micro-batch by micro-batch, :class:`Capture`).
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from typing import Any

WORLD = 2
# per rank: 8 sequences, mini-batches of 4 (2 per epoch), micro-batches of 2, 2 PPO epochs -> 4 optimizer steps
N_PER_RANK, MINI, MICRO, EPOCHS = 8, 4, 2, 2
RESP_W, PROMPT_W, VOCAB = 7, 3, 11
# response lengths of the 16 sequences (rank 0: the first 8), uneven at every level
RESP_LENS = [2, 6, 3, 7, 1, 4, 6, 2, 3, 7, 2, 5, 7, 1, 6, 3]


def base_config() -> dict[str, Any]:
    """The run config of the proofs (global sizes; the levels' counts follow from it)."""
    return {"data.train_batch_size": N_PER_RANK * WORLD, "actor_rollout_ref.rollout.n": 1,
            "actor_rollout_ref.actor.ppo_mini_batch_size": MINI * WORLD, "actor_rollout_ref.actor.ppo_epochs": EPOCHS,
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": MICRO,
            "critic.ppo_mini_batch_size": MINI * WORLD, "critic.ppo_epochs": EPOCHS,
            "trainer.n_gpus_per_node": WORLD, "trainer.nnodes": 1,
            "actor_rollout_ref.actor.use_kl_loss": True}


# --------------------------------------------------------------------------------------------- what veRL computed
def _ragged(values, mask) -> list[list[float]]:
    return [[float(v) for v, k in zip(row, m) if k] for row, m in zip(values.tolist(), mask.tolist())]


@dataclass
class Capture:
    """Per rank, per micro-batch (in order): the ``masked_mean`` and ``agg_loss`` calls veRL made (outside other
    such calls), each the masked per-token values; and the optimizer step each micro-batch belonged to."""
    micro: dict[int, list[dict[str, list]]] = field(default_factory=dict)
    opt: dict[int, list[int]] = field(default_factory=dict)
    rank: int = 0
    n_opt: dict[int, int] = field(default_factory=dict)
    norms: dict[int, list[float]] = field(default_factory=dict)     # what each optimizer step returned, per rank
    depth: int = 0

    def start_micro(self) -> None:
        self.micro.setdefault(self.rank, []).append({"mm": [], "agg": []})
        self.opt.setdefault(self.rank, []).append(self.n_opt.get(self.rank, 0))

    def record(self, kind: str, values, mask) -> None:
        if self.depth == 0 and self.micro.get(self.rank):
            self.micro[self.rank][-1][kind].append(_ragged(values.detach(), mask))

    def batch(self, kind: str, index: int, scale: float = 1.0) -> list:
        """``steps[0][optimizer step][rank][micro-batch]`` of the ``index``-th ``kind`` call of each micro-batch."""
        n_steps = max(self.n_opt.values())
        out: list = [[[] for _ in sorted(self.micro)] for _ in range(n_steps)]
        for r in sorted(self.micro):
            for opt, rec in zip(self.opt[r], self.micro[r]):
                out[opt][r].append([[v * scale for v in seq] for seq in rec[kind][index]])
        return [out]


@contextlib.contextmanager
def capturing(cap: Capture, modules: list):
    """``masked_mean`` and ``agg_loss`` wherever the release's loss code calls them (module attributes), recorded."""
    import verl.utils.torch_functional as verl_F
    saved = []

    def wrap(kind, fn, mask_arg):
        def inner(*a, **kw):
            values = kw.get("loss_mat", kw.get("values", a[0] if a else None))
            mask = kw.get(mask_arg, a[1] if len(a) > 1 else kw.get("mask"))
            cap.record(kind, values, mask)
            cap.depth += 1
            try:
                return fn(*a, **kw)
            finally:
                cap.depth -= 1
        return inner

    targets = [(verl_F, "masked_mean", "mm", "mask")]
    for m in modules:
        if hasattr(m, "agg_loss"):
            targets.append((m, "agg_loss", "agg", "loss_mask"))
        if getattr(m, "masked_mean", None) is verl_F.masked_mean:
            targets.append((m, "masked_mean", "mm", "mask"))
    for obj, name, kind, mask_arg in targets:
        fn = getattr(obj, name)
        saved.append((obj, name, fn))
        setattr(obj, name, wrap(kind, fn, mask_arg))
    try:
        yield
    finally:
        for obj, name, fn in reversed(saved):
            setattr(obj, name, fn)


@contextlib.contextmanager
def simulated_rank(rank: int):
    import torch.distributed as dist
    saved = {k: getattr(dist, k) for k in ("get_rank", "get_world_size", "is_initialized")}
    dist.get_rank = lambda group=None: rank
    dist.get_world_size = lambda group=None: WORLD
    dist.is_initialized = lambda: True
    try:
        yield
    finally:
        for k, v in saved.items():
            setattr(dist, k, v)


@contextlib.contextmanager
def no_memory_log():
    """GPUMemoryLogger (verl/utils/profiler/performance.py) reads the device's memory for a log line around
    update_policy / update_critic; a CPU has none: zeros (verl/utils/debug/performance.py up to v0.4.1)."""
    try:
        from verl.utils.profiler import performance
    except ImportError:
        try:
            from verl.utils.debug import performance
        except ImportError:
            yield
            return
    saved = getattr(performance, "_get_current_mem_info", None)
    if saved is not None:
        performance._get_current_mem_info = lambda *a, **k: ("0", "0", "0", "0")
    try:
        yield
    finally:
        if saved is not None:
            performance._get_current_mem_info = saved


# --------------------------------------------------------------------------------------------- the tiny models
def tiny_lm(seed: int, out: int = VOCAB):
    """The stand-in for the model's forward: per-position logits (``out`` of them; 1: a value head)."""
    import torch

    class TinyLM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            g = torch.Generator().manual_seed(seed)
            self.emb = torch.nn.Parameter(torch.randn(VOCAB, out, generator=g))
            self.pos = torch.nn.Parameter(0.5 * torch.randn(RESP_W, out, generator=g))

        def forward(self, responses):
            return self.emb[responses] + self.pos[: responses.shape[1]]
    return TinyLM()


def policy_forward(actor, cap: Capture, release: str):
    """``_forward_micro_batch`` of the tiny policy: (entropy, log_prob) up to v0.6, a dict from v0.7 (the shape the
    release's update_policy reads); up to v0.3 it has no calculate_entropy switch and always returns the entropy."""
    import verl.utils.torch_functional as verl_F
    always = release.startswith(("0.1", "0.2", "0.3"))

    def forward(micro_batch, temperature, calculate_entropy=False, **_):
        cap.start_micro()
        logits = actor.actor_module(micro_batch["responses"]) / temperature
        log_prob = verl_F.logprobs_from_logits(logits, micro_batch["responses"])
        entropy = verl_F.entropy_from_logits(logits) if calculate_entropy or always else None
        if release.startswith(("0.7", "0.8")):
            return {"log_probs": log_prob, "entropys": entropy}
        return entropy, log_prob
    return forward


def critic_forward(critic, cap: Capture):
    def forward(micro_batch):
        cap.start_micro()
        return critic.critic_module(micro_batch["responses"])[..., 0]
    return forward


def counting_step(obj, cap: Capture, rank: int):
    step = obj._optimizer_step

    def inner():
        out = step()
        cap.n_opt[rank] = cap.n_opt.get(rank, 0) + 1
        cap.norms.setdefault(rank, []).append(float(out))
        return out
    return inner


# --------------------------------------------------------------------------------------------- the batch
def batch(rank: int, seed: int = 7):
    """Rank ``rank``'s share of the step's batch: right-padded responses, old/ref log-probs off the initial policy
    (so the ratio clips from the first mini-batch on), advantages, values and returns."""
    import torch
    from tensordict import TensorDict
    from verl import DataProto
    g = torch.Generator().manual_seed(seed + rank)
    n = N_PER_RANK
    lens = RESP_LENS[rank * n:(rank + 1) * n]
    responses = torch.randint(0, VOCAB, (n, RESP_W), generator=g)
    mask = torch.zeros(n, RESP_W, dtype=torch.long)
    for i, k in enumerate(lens):
        mask[i, :k] = 1
    attn = torch.cat([torch.ones(n, PROMPT_W, dtype=torch.long), mask], dim=1)
    init = tiny_lm(1)
    with torch.no_grad():
        lp = torch.log_softmax(init(responses), -1).gather(-1, responses[..., None])[..., 0]
    old = lp + 0.4 * torch.randn(n, RESP_W, generator=g)
    ref = lp + 0.6 * torch.randn(n, RESP_W, generator=g)
    adv = torch.randn(n, RESP_W, generator=g)
    values = 0.5 * torch.randn(n, RESP_W, generator=g)
    returns = values + torch.randn(n, RESP_W, generator=g)
    td = TensorDict({"responses": responses, "response_mask": mask, "input_ids": torch.cat(
        [torch.full((n, PROMPT_W), 3), responses], dim=1), "attention_mask": attn,
        "position_ids": torch.cumsum(attn, -1) - 1, "old_log_probs": old * mask, "ref_log_prob": ref * mask,
        "advantages": adv * mask, "values": values * mask, "returns": returns * mask}, batch_size=[n])
    return DataProto(batch=td, meta_info={"temperature": 1.0})


# --------------------------------------------------------------------------------------------- the configs
def actor_config(release: str, **overrides):
    kw = dict(strategy="fsdp", ppo_mini_batch_size=MINI, ppo_micro_batch_size_per_gpu=MICRO, use_dynamic_bsz=False,
              ppo_epochs=EPOCHS, clip_ratio=0.2, entropy_coeff=0.0, use_kl_loss=True, kl_loss_coef=0.1,
              kl_loss_type="low_var_kl", loss_agg_mode="token-mean", grad_clip=1.0, use_torch_compile=False)
    kw.update(overrides)
    if release.startswith("0.7"):
        from verl.workers.config import FSDPActorConfig
        kw.setdefault("rollout_n", 1)
        return FSDPActorConfig(**kw)
    from omegaconf import OmegaConf
    for k, v in dict(clip_ratio_low=None, clip_ratio_high=None, clip_ratio_c=3.0, policy_loss={"loss_mode": "vanilla"},
                     ulysses_sequence_parallel_size=1, entropy_from_logits_with_chunking=False,
                     use_remove_padding=False, fsdp_config={"dtype": "float32"}).items():    # dtype: read from v0.6
        kw.setdefault(k, v)
    return OmegaConf.create(kw)


def critic_config(release: str, **overrides):
    kw = dict(strategy="fsdp", ppo_mini_batch_size=MINI, ppo_micro_batch_size_per_gpu=MICRO, use_dynamic_bsz=False,
              ppo_epochs=EPOCHS, cliprange_value=0.3, loss_agg_mode="token-mean", grad_clip=1.0)
    kw.update(overrides)
    if release.startswith("0.7"):
        import types

        from verl.workers.config import FSDPCriticConfig
        kw.setdefault("rollout_n", 1)
        # model_config: any non-None value keeps __post_init__ from loading an HF config (dp_critic never reads it)
        return FSDPCriticConfig(model_config=types.SimpleNamespace(), **kw)
    from omegaconf import OmegaConf
    kw.update(ulysses_sequence_parallel_size=1, model={"use_remove_padding": False})
    return OmegaConf.create(kw)


def release_reduce_metrics():
    """The release's ``reduce_metrics`` (verl/utils/metric/utils.py from v0.4.0; verl/trainer/ppo/metric_utils.py
    before, where ray_trainer.py imports it from; up to v0.2.0.post2 a function of ray_trainer.py itself, compiled
    from the file's text: the module imports what a CPU test environment lacks)."""
    try:
        from verl.utils.metric import reduce_metrics
    except ImportError:
        try:
            from verl.trainer.ppo.metric_utils import reduce_metrics
        except ImportError:
            import ast
            from pathlib import Path

            import numpy as np
            import verl
            path = Path(verl.__file__).resolve().parent / "trainer" / "ppo" / "ray_trainer.py"
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "reduce_metrics")
            ns: dict[str, Any] = {"np": np}
            exec(compile(ast.Module(body=[fn], type_ignores=[]), str(path), "exec"), ns)   # noqa: S102
            reduce_metrics = ns["reduce_metrics"]
    return reduce_metrics


# --------------------------------------------------------------------------------------------- one update
@dataclass
class Update:
    metrics: dict[str, float]            # what the driver logs (reduce_metrics of the collected output)
    per_rank: list[dict[str, Any]]       # each rank's own metrics dict (update_policy's return)
    cap: Capture


def run_update(role: str = "actor", lr: float = 0.5, seed: int = 7, **overrides) -> Update:
    """One legacy update (``update_policy`` or ``update_critic``) on each simulated rank, collected and reduced as
    the driver does."""
    os.environ.setdefault("VERL_USE_EXTERNAL_PLUGINS", "none")
    import torch
    from verl import DataProto
    from verl.trainer.ppo import core_algos
    reduce_metrics = release_reduce_metrics()

    from _support import framework_code as F
    release = F.release("verl")
    cap = Capture()
    outputs, per_rank = [], []
    if role == "actor":
        from verl.workers.actor import dp_actor as mod
        cfg = actor_config(release, **overrides)
    else:
        from verl.workers.critic import dp_critic as mod
        cfg = critic_config(release, **overrides)
    torch.manual_seed(0)
    with capturing(cap, [core_algos, mod]), no_memory_log():
        for rank in range(WORLD):
            cap.rank = rank
            with simulated_rank(rank):
                model = tiny_lm(1, VOCAB if role == "actor" else 1)
                opt = torch.optim.SGD(model.parameters(), lr=lr)
                if role == "actor":
                    w = mod.DataParallelPPOActor(cfg, model, opt)
                    w._forward_micro_batch = policy_forward(w, cap, release)
                    w._optimizer_step = counting_step(w, cap, rank)
                    metrics = w.update_policy(batch(rank, seed))
                else:
                    w = mod.DataParallelPPOCritic(cfg, model, opt)
                    w._forward_micro_batch = critic_forward(w, cap)
                    w._optimizer_step = counting_step(w, cap, rank)
                    metrics = w.update_critic(batch(rank, seed))
            per_rank.append(metrics)
            outputs.append(DataProto(meta_info={"metrics": metrics}))      # fsdp_workers.update_actor's output
    collected = DataProto.concat(outputs)                                    # the DP_COMPUTE_PROTO collect
    logged = reduce_metrics(collected.meta_info["metrics"])                  # ray_trainer.py fit()
    return Update({k: float(v) for k, v in logged.items()}, per_rank, cap)


# --------------------------------------------------------------------------------------------- the worker method
def _worker_method(cls: str, name: str, namespace: dict[str, Any]):
    """``cls.name`` of the release's verl/workers/fsdp_workers.py, compiled from the file's own text without its
    decorators (register / DistProfiler: the single controller's dispatch and a profiler)."""
    import ast
    from pathlib import Path

    import verl
    path = Path(verl.__file__).resolve().parent / "workers" / "fsdp_workers.py"
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    body = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls).body
    fn = next(n for n in body if isinstance(n, ast.FunctionDef) and n.name == name)
    fn.decorator_list = []
    exec(compile(ast.Module(body=[fn], type_ignores=[]), str(path), "exec"), namespace)   # noqa: S102
    return namespace[name]


#: the made-up per-rank readings of each training step (rank 0 the larger in one step, the smaller in the other)
READINGS = ((3, 5), (6, 4))


class _Device:
    """get_torch_device() on a CPU: the rank's memory readings, made up (a different number on each rank, so the
    driver's reduction over the ranks shows); only the reduction of them is what the proofs read."""

    def __init__(self, rank: int, step: int):
        self.rank, self.step = rank, step

    def max_memory_allocated(self) -> int:
        return READINGS[self.step][self.rank] * 1024**3

    def max_memory_reserved(self) -> int:
        return (READINGS[self.step][self.rank] + 2) * 1024**3


class _Psutil:
    """psutil as the method reads it: the node's used memory, made up per rank (one node per rank here)."""

    def __init__(self, rank: int, step: list[int]):
        self.rank, self.step = rank, step

    def virtual_memory(self):
        import types
        return types.SimpleNamespace(used=(READINGS[self.step[0]][self.rank] + 5) * 1024**3)


class _Flops:
    """The FlopsCounter (needs the HF model config): made-up flops that differ by rank as each rank's own timer of
    the update does (estimated from the global tokens and the rank's delta_time)."""

    def __init__(self, rank: int, step: list[int]):
        self.rank, self.step = rank, step

    def estimate_flops(self, *_a, **_k):
        return float(READINGS[self.step[0]][self.rank]), 8.0


class _NoSharding:
    """ulysses_sharding_manager with sequence parallel size 1 (FSDPUlyssesShardingManager: identity)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        return None

    @staticmethod
    def preprocess_data(data):
        return data

    postprocess_data = preprocess_data


@dataclass
class WorkerSteps:
    logged: list[float]          # rank 0's actor/lr or critic/lr of each training step
    used: list[list[float]]      # the rates rank 0's optimizer stepped with, per training step
    after: list[float]           # rank 0's scheduler's rate after each step
    metrics: list[dict[str, float]]      # the driver's metrics of each step (collected over the ranks, reduce_metrics)
    per_rank: list[list[dict[str, float]]]     # each step's ranks' own metrics


def run_worker(role: str = "actor", steps: int = 2, warmup: int = 3, lr: float = 0.5) -> WorkerSteps:
    """``steps`` training steps through the release's own ``ActorRolloutRefWorker.update_actor`` /
    ``CriticWorker.update_critic`` (fsdp_workers.py) on each simulated rank, with the scheduler fsdp_workers builds
    (``get_constant_schedule_with_warmup``, verl/utils/torch_functional.py) so the rate changes every step; the
    ranks' outputs collected (DataProto.concat) and reduced (reduce_metrics) as the driver does."""
    import types

    import torch
    from codetiming import Timer
    from verl import DataProto
    reduce_metrics = release_reduce_metrics()
    from verl.utils.torch_functional import get_constant_schedule_with_warmup

    from _support import framework_code as F
    release = F.release("verl")
    cap = Capture()
    used: list[list[float]] = []
    out = WorkerSteps([], used, [], [], [])
    workers = []
    now = [0]                    # the training step the readings are of
    with capturing(cap, []), no_memory_log():
        for rank in range(WORLD):
            ns = {"DataProto": DataProto, "Timer": Timer, "torch": torch, "psutil": _Psutil(rank, now),
                  "get_device_id": lambda: "cpu", "get_torch_device": lambda rank=rank: _Device(rank, now[0]),
                  "log_gpu_memory_usage": lambda *a, **k: None, "logger": None}
            model = tiny_lm(1, VOCAB if role == "actor" else 1)
            opt = torch.optim.SGD(model.parameters(), lr=lr)
            sched = get_constant_schedule_with_warmup(optimizer=opt, num_warmup_steps=warmup)
            with simulated_rank(rank):
                if role == "actor":
                    from verl.workers.actor import dp_actor as mod
                    w = mod.DataParallelPPOActor(actor_config(release), model, opt)
                    w._forward_micro_batch = policy_forward(w, cap, release)
                    method = _worker_method("ActorRolloutRefWorker", "update_actor", ns)
                    me = types.SimpleNamespace(
                        actor=w, actor_lr_scheduler=sched, actor_optimizer=opt, _is_actor=True,
                        config=types.SimpleNamespace(actor=types.SimpleNamespace(ppo_epochs=EPOCHS)),
                        tokenizer=types.SimpleNamespace(pad_token_id=0))
                else:
                    from verl.workers.critic import dp_critic as mod
                    w = mod.DataParallelPPOCritic(critic_config(release), model, opt)
                    w._forward_micro_batch = critic_forward(w, cap)
                    method = _worker_method("CriticWorker", "update_critic", ns)
                    me = types.SimpleNamespace(critic=w, critic_lr_scheduler=sched, critic_optimizer=opt,
                                               config=types.SimpleNamespace(ppo_epochs=EPOCHS))
            me.__dict__.update(_is_offload_param=False, _is_offload_optimizer=False, world_size=WORLD,
                               flops_counter=_Flops(rank, now), ulysses_sharding_manager=_NoSharding())
            if rank == 0:
                step = w._optimizer_step

                def recording(step=step, opt=opt):
                    used[-1].append(float(opt.param_groups[0]["lr"]))
                    return step()
                w._optimizer_step = recording
            workers.append((me, method, sched))
        for k in range(steps):
            now[0] = k % len(READINGS)
            used.append([])
            outputs = []
            for rank, (me, method, sched) in enumerate(workers):
                data = batch(rank, seed=7 + k)
                data.meta_info["global_token_num"] = [int(x) for x in data.batch["attention_mask"].sum(-1)]
                with simulated_rank(rank):
                    res = method(me, data)
                outputs.append(res)
                if rank == 0:
                    out.logged.append(float(res.meta_info["metrics"][f"{role}/lr"]))
                    out.after.append(float(sched.get_last_lr()[0]))
            out.per_rank.append([{k2: float(v) for k2, v in o.meta_info["metrics"].items()
                                  if not isinstance(v, list)} for o in outputs])
            logged = reduce_metrics(DataProto.concat(outputs).meta_info["metrics"])
            out.metrics.append({k2: float(v) for k2, v in logged.items()})
    return out


# --------------------------------------------------------------------------------------------- the driver's entropy
def _fit_lines(first: str, last: str) -> str:
    """The statements of ``RayPPOTrainer.fit`` (verl/trainer/ppo/ray_trainer.py of the release) from the line that
    starts with ``first`` through the one that starts with ``last``, dedented: the trainer's own code, run as is."""
    import textwrap
    from pathlib import Path

    import verl
    lines = (Path(verl.__file__).resolve().parent / "trainer/ppo/ray_trainer.py").read_text().splitlines()
    a = next(i for i, t in enumerate(lines) if t.strip().startswith(first))
    b = next(i for i in range(a, len(lines)) if lines[i].strip().startswith(last))
    return textwrap.dedent("\n".join(lines[a:b + 1]))


@dataclass
class OldLogProb:
    metrics: dict[str, float]
    entropys: list[list[float]]      # veRL's per-token entropies of the valid response tokens, sequence by sequence
    resp_lens: list[int]


def run_old_log_prob(seed: int = 7, **actor) -> OldLogProb:
    """The trainer's old-log-prob pass: each rank's ``DataParallelPPOActor.compute_log_prob(calculate_entropy=True)``
    (the worker's fsdp_workers.compute_log_prob wraps its two tensors into a DataProto, as here), the ranks' outputs
    concatenated (DataProto.concat), then fit()'s own lines from ``entropys = old_log_prob.batch["entropys"]``
    through ``metrics.update(old_log_prob_metrics)`` (agg_loss over the whole batch with actor.loss_agg_mode)."""
    import types

    from verl import DataProto
    from verl.trainer.ppo import core_algos
    from verl.workers.actor import dp_actor as mod

    from _support import framework_code as F
    release = F.release("verl")
    cfg = actor_config(release, **actor)
    cap = Capture()
    shares, outs = [], []
    with no_memory_log():
        for rank in range(WORLD):
            with simulated_rank(rank):
                w = mod.DataParallelPPOActor(cfg, tiny_lm(1), None)
                w._forward_micro_batch = policy_forward(w, cap, release)
                data = batch(rank, seed)
                data.meta_info.update(micro_batch_size=MICRO, use_dynamic_bsz=False)
                got = w.compute_log_prob(data, calculate_entropy=True)
                lp, ent = (got["log_probs"], got["entropys"]) if isinstance(got, dict) else got
                shares.append(data)
                outs.append(DataProto.from_dict(tensors={"old_log_probs": lp, "entropys": ent},
                                                meta_info={"temperature": 1.0}))
    full, old_log_prob = DataProto.concat(shares), DataProto.concat(outs)
    ns: dict[str, Any] = {"old_log_prob": old_log_prob, "batch": full, "metrics": {}, "agg_loss": core_algos.agg_loss,
                          "old_log_prob_mfu": 0.0,
                          "self": types.SimpleNamespace(config=types.SimpleNamespace(
                              actor_rollout_ref=types.SimpleNamespace(actor=cfg)))}
    exec(_fit_lines('entropys = old_log_prob.batch["entropys"]', "metrics.update(old_log_prob_metrics)"), ns)  # noqa: S102
    mask = full.batch["response_mask"]
    return OldLogProb({k: float(v) for k, v in ns["metrics"].items()},
                      _ragged(old_log_prob.batch["entropys"], mask), [int(x) for x in mask.sum(-1)])


# --------------------------------------------------------------------------------------------- generation timing
def run_generation_timing(seconds: list[float]) -> list[tuple[float, float, float]]:
    """``topk_reduce_ratio_min_max`` (verl/utils/profiler/performance.py, what fsdp_workers.py generate_sequences
    calls on each rank's generate_sequences seconds) on threads of a simulated group, ``torch.distributed.all_gather``
    answered by the group's exchange: (topk ratio, min, max) on each rank."""
    import torch.distributed as dist
    from verl.utils.profiler import performance

    from _support import framework_code as F
    world = len(seconds)

    def all_gather(tensor_list, tensor, group=None, async_op=False):
        g, r = F.current_rank()
        for out, got in zip(tensor_list, g.exchange(r, tensor.detach().clone())):
            out.copy_(got.reshape(out.shape))

    patches = {"all_gather": all_gather, "is_initialized": lambda: True,
               "get_world_size": lambda group=None: world}
    saved = {k: getattr(dist, k) for k in patches}
    for k, v in patches.items():
        setattr(dist, k, v)
    saved_dev = performance.get_device_id
    performance.get_device_id = lambda: "cpu"
    try:
        return F.run_ranks(lambda r: performance.topk_reduce_ratio_min_max(seconds[r]), world)
    finally:
        performance.get_device_id = saved_dev
        for k, v in saved.items():
            setattr(dist, k, v)


# --------------------------------------------------------------------------------------------- why not proven
# verl 0.6.1 / 0.6.0 / 0.4.1 / 0.4.0 / 0.3.0.post1 / 0.2.0.post2 import with the companions tests/releases.txt names
# (and, up to 0.3.0.post1, the stand-ins of tests/_support/proofs_verl_old2.py); their entries' proofs and
# reasons are tests/frameworks/test_proof_verl_old2.py's and proofs_verl_old2.ENTRY_WHY.
ENTRY_WHY: dict[tuple[str, str, str | None], str] = {
    ("verl", "actor/kl_loss", "ppo"):
        "actor.kl_loss_type picks only the per-token estimator kl_penalty computes; the reduction is dp_actor.py's "
        "one agg_loss / append line (engine workers: losses.py's), fingerprinted at the same release for the "
        "default low_var_kl (0.5.0, 0.7.1, 0.9.1) and at 0.7.1 for kl and mse (tests/frameworks/"
        "test_proof_verl_old.py); a proof per remaining estimator would be one more child process each",
    ("verl", "timing_s/generation_timing/topk_ratio", "ppo"):
        "topk_reduce_ratio_min_max (utils/profiler/performance.py@v0.7.1:226-240): the fraction of ranks whose "
        "generate_sequences seconds exceed the ranks' 90th percentile (torch.quantile): no candidate reduction "
        "(mean, extremum, sum, std) expresses it; its max and min siblings are fingerprinted (test_proof_verl_old.py)",
    ("verl", "perf/mfu/actor_infer", "ppo"):
        "a throughput reading of the one old-log-prob forward pass (estimated flops over that pass's own timer and "
        "the device's promised flops; 0 on the legacy worker path up to v0.7.1, ray_trainer.py@v0.7.1:1146), "
        "logged once per step with no batch, micro-batch or rank reduction to fingerprint",
    ("verl", "mtp_losses/mtp_{i}_loss", "ppo"):
        "the Megatron actor's multi-token-prediction losses (megatron_actor.py@v0.7.1): megatron-core is not "
        "installed, and the legacy FSDP actor never logs them",
    ("verl", "actor/mtp_losses/mtp_{i}_loss", "ppo"):
        "the Megatron multi-token-prediction losses (megatron_actor.py@v0.7.1, the Megatron engine from v0.8.0): "
        "megatron-core is not installed",
    ("verl", "critic/vf_loss", "ppo"):
        "v0.8.0's engine-worker value_loss (workers/utils/losses.py@v0.8.0) runs through the engine worker and "
        "TransferQueue trainer that tests/_support/proofs_verl.py simulates from 0.9.1's files only; not ported to "
        "0.8.0's (the legacy-worker ranges are fingerprinted at 0.5.0 and 0.7.1 by test_proof_verl_old.py)",
}
