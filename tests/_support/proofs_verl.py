"""veRL 0.9.1's own training-step code, run on CPU for the reduction fingerprints (tests/frameworks/
test_fingerprint_verl.py, issue 20). What runs is the installed wheel's code; what is simulated is only what a CPU
machine lacks: the GPUs, the model, Ray and TransferQueue.

The chain of one training step, as 0.9.1 runs it by default (trainer.use_v1: true, trainer.v1.trainer_mode: sync):

* driver: ``PPOTrainer._compute_old_log_prob``, ``_update_actor`` and ``_compute_metrics`` of
  verl/trainer/ppo/v1/trainer_base.py, compiled from the file's own text (its package imports TransferQueue, which
  a CPU machine does not install), with ``tq`` bound to an in-memory key-value store (:class:`Store`) that answers
  ``kv_batch_get`` / ``kv_batch_put`` with nested (jagged) tensors as TransferQueue does;
* worker group: the store's rows split into contiguous data-parallel shares, one thread per rank (the single
  controller's dispatch), each running the real ``TrainingWorker.infer_batch`` / ``train_mini_batch`` /
  ``train_batch`` / ``_postprocess_output`` of verl/workers/engine_workers.py with the real loss function
  (``partial(ppo_loss, config=actor_config)``, verl/workers/utils/losses.py) and ``Metric`` aggregation;
* engine: ``BaseEngine.train_batch`` / ``infer_batch`` (verl/workers/engine/base.py) and ``FSDPEngine``'s
  ``forward_backward_batch``, ``optimizer_zero_grad``, ``optimizer_step``, ``lr_scheduler_step`` and
  ``_build_lr_scheduler`` (verl/workers/engine/fsdp/transformer_impl.py), compiled from the files' text (the
  module imports peft, which is not installed), with veRL's own ``prepare_micro_batches`` /
  ``postprocess_batch_func`` (verl/workers/engine/utils.py). Only ``forward_step`` is this file's: it runs a tiny
  differentiable policy (:class:`TinyPolicy`, log-probabilities that move with every optimizer step) instead of an
  HF model and hands its output to the loss function exactly as ``FSDPEngineWithLMHead.forward_step`` does. The
  gradient averaging FSDP does across ranks is done at the last micro-batch (``_gradient_sync_context``), so every
  rank keeps the same weights and the same (pre-clip) gradient norm, as on a cluster.
* the critic (``run_step(critic=True)``): V1 ``_update_critic`` and the same worker and engine with the real
  ``value_loss``, the tiny policy's form as the value head;
* collectives: ``torch.distributed.all_reduce`` / ``all_gather_object`` / ``get_world_size`` / ``get_rank`` meet
  at a barrier of the simulated group (tests/_support/framework_code.py).

Nothing here computes a metric. What the proofs compare the logged values with is *captured* while veRL runs: the
per-token matrices and masks veRL hands to ``agg_loss`` and ``masked_mean`` (the loss, KL, entropy, clip and
log-ratio values of every micro-batch of every optimizer step on every rank), the gradient norms
``clip_grad_norm_`` returns and the learning rates the optimizer stepped with (:class:`Capture`).
"""
from __future__ import annotations

import ast
import contextlib
import functools
import inspect
import threading
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _support import framework_code as F

WORLD = 2


# --------------------------------------------------------------------------------------------- loading the code
def _compile(path: Path, names: list[str], namespace: dict[str, Any], cls: str | None = None) -> dict[str, Any]:
    """Functions (of class ``cls``, or module level) compiled from the file's own text into ``namespace``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    body = tree.body if cls is None else next(
        n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls).body
    wanted = [n for n in body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name in names]
    missing = set(names) - {n.name for n in wanted}
    if missing:
        raise ImportError(f"{path}: {cls or 'module'} has no {sorted(missing)}")
    exec(compile(ast.Module(body=wanted, type_ignores=[]), str(path), "exec"), namespace)   # noqa: S102
    return {n: namespace[n] for n in names}


def _constant(path: Path, name: str) -> Any:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return ast.literal_eval(node.value)
    raise ImportError(f"{path}: no {name}")


@functools.lru_cache(maxsize=None)
def code() -> types.SimpleNamespace:
    import os
    os.environ.setdefault("VERL_USE_EXTERNAL_PLUGINS", "none")
    from contextlib import nullcontext
    from typing import Callable as _Callable  # the compiled methods' annotations

    import numpy as np
    import torch
    import verl
    import verl.utils.torch_functional as verl_F
    from tensordict import TensorDict
    from verl import DataProto
    from verl.trainer.ppo import core_algos, metric_utils
    from verl.utils import tensordict_utils as tu
    from verl.utils.metric import reduce_metrics
    from verl.utils.py_functional import rename_dict
    from verl.workers import engine_workers
    from verl.workers.config import FSDPActorConfig, FSDPCriticConfig, FSDPOptimizerConfig
    from verl.workers.utils import losses
    from verl.workers.utils.padding import response_from_nested

    root = Path(verl.__file__).resolve().parent
    engine_utils = F._load_file("_trackbridge_verl_engine_utils", root / "workers/engine/utils.py")

    class _NoClass:          # FSDP / FSDPModule / DTensor: the tiny policy is none of them
        pass

    ns: dict[str, Any] = {
        "torch": torch, "tu": tu, "TensorDict": TensorDict, "Callable": _Callable, "Optional": Any, "Any": Any,
        "nullcontext": nullcontext, "get_device_id": lambda: "cpu",
        "prepare_micro_batches": engine_utils.prepare_micro_batches,
        "postprocess_batch_func": engine_utils.postprocess_batch_func,
        "maybe_fix_3d_position_ids": tu.maybe_fix_3d_position_ids,
        "FSDP": _NoClass, "FSDPModule": _NoClass, "DTensor": _NoClass, "fsdp2_clip_grad_norm_": None,
    }
    fsdp = _compile(root / "workers/engine/fsdp/transformer_impl.py",
                    ["forward_backward_batch", "optimizer_zero_grad", "optimizer_step", "lr_scheduler_step",
                     "_build_lr_scheduler"], dict(ns), cls="FSDPEngine")
    base = _compile(root / "workers/engine/base.py", ["train_batch", "infer_batch"], dict(ns), cls="BaseEngine")

    v1_file = root / "trainer/ppo/v1/trainer_base.py"
    v1_ns: dict[str, Any] = {
        "np": np, "torch": torch, "DataProto": DataProto, "agg_loss": core_algos.agg_loss,
        "response_from_nested": response_from_nested, "rename_dict": rename_dict, "reduce_metrics": reduce_metrics,
        "calculate_debug_metrics": None, "is_distillation_enabled": lambda cfg: False,
        "compute_data_metrics": metric_utils.compute_data_metrics,
        "compute_timing_metrics": metric_utils.compute_timing_metrics,
        "compute_throughout_metrics": metric_utils.compute_throughout_metrics,
        "compute_variance_proxy_metrics": metric_utils.compute_variance_proxy_metrics,
        "compute_moe_lb_metrics": metric_utils.compute_moe_lb_metrics,
        "get_metric_data_with_optional_routed_experts": metric_utils.get_metric_data_with_optional_routed_experts,
        "KVBatchMeta": Any, "DataProtoFuture": Any, "TensorDict": TensorDict,
    }
    v1_ns.update(_compile(root / "trainer/ppo/ray_trainer.py", ["compute_spec_decode_metrics"], {"np": np}))
    v1 = _compile(v1_file, ["_compute_old_log_prob", "_update_actor", "_update_critic", "_compute_metrics"], v1_ns,
                  cls="PPOTrainer")
    utils_file = root / "trainer/ppo/v1/utils.py"
    agg_ns = {"Counter": __import__("collections").Counter, "defaultdict": __import__("collections").defaultdict,
              "Any": Any, "np": np, "torch": torch,
              "DAPO_FILTERED_REWARD_COUNTS_KEY": _constant(root / "trainer/ppo/v1/replay_buffer.py",
                                                           "DAPO_FILTERED_REWARD_COUNTS_KEY")}
    aggregator = _compile(utils_file, ["MetricsAggregator"], agg_ns)["MetricsAggregator"]
    return types.SimpleNamespace(
        torch=torch, np=np, TensorDict=TensorDict, tu=tu, verl_F=verl_F, core_algos=core_algos, losses=losses,
        metric_utils=metric_utils, DataProto=DataProto, engine_workers=engine_workers, fsdp=fsdp, base=base, v1=v1,
        v1_ns=v1_ns, MetricsAggregator=aggregator, FSDPActorConfig=FSDPActorConfig, FSDPCriticConfig=FSDPCriticConfig,
        FSDPOptimizerConfig=FSDPOptimizerConfig, reduce_metrics=reduce_metrics, release=F.release("verl"),
        files={"v1": "verl/trainer/ppo/v1/trainer_base.py", "workers": "verl/workers/engine_workers.py",
               "losses": "verl/workers/utils/losses.py", "engine": "verl/workers/engine/fsdp/transformer_impl.py",
               "metric": "verl/utils/metric/utils.py", "core_algos": "verl/trainer/ppo/core_algos.py",
               "metric_utils": "verl/trainer/ppo/metric_utils.py"})


# --------------------------------------------------------------------------------------------- simulated ranks
@contextlib.contextmanager
def simulated_dist():
    """``torch.distributed`` as veRL's worker and engine code call it, answered by the simulated group of the
    calling thread (framework_code.run_ranks)."""
    import torch
    import torch.distributed as dist

    def all_reduce(t, op=dist.ReduceOp.SUM, group=None, async_op=False):
        g, r = F.current_rank()
        parts = g.exchange(r, t.detach().clone())
        out = functools.reduce(lambda a, b: a + b, parts)
        if op == dist.ReduceOp.AVG:
            out = out / g.world
        elif op == dist.ReduceOp.MAX:
            out = functools.reduce(torch.maximum, parts)
        t.copy_(out)

    def all_gather_object(out, obj, group=None):
        g, r = F.current_rank()
        out[:] = g.exchange(r, obj)

    patches = {"all_reduce": all_reduce, "all_gather_object": all_gather_object,
               "get_world_size": lambda group=None: F.current_rank()[0].world,
               "get_rank": lambda group=None: F.current_rank()[1],
               "is_initialized": lambda: True}
    saved = {k: getattr(dist, k) for k in patches}
    for k, v in patches.items():
        setattr(dist, k, v)
    try:
        yield
    finally:
        for k, v in saved.items():
            setattr(dist, k, v)


# --------------------------------------------------------------------------------------------- what veRL computed
@dataclass
class Capture:
    """What veRL's own code handed to its reductions, per rank: for every micro-batch (in order) the masked
    per-token values of each ``agg_loss`` / ``masked_mean`` call of the loss function, the pre-clip gradient norm
    of every optimizer step, and the learning rate each optimizer step used."""
    micro: dict[int, list[dict[str, list[list[float]]]]] = field(default_factory=dict)
    steps: dict[int, list[tuple[int, int]]] = field(default_factory=dict)      # (optimizer step, micro index)
    grad_norms: dict[int, list[float]] = field(default_factory=dict)
    lrs_used: dict[int, list[float]] = field(default_factory=dict)
    driver: list[dict[str, Any]] = field(default_factory=list)               # agg_loss calls on the driver

    def batch(self, name: str, n_steps: int) -> list:
        """``steps[0][optimizer step][rank][micro-batch]`` of the captured per-token values ``name`` (the layout of
        tests/_support/fingerprint.py)."""
        out: list = [[[] for _ in sorted(self.micro)] for _ in range(n_steps)]
        for rank in sorted(self.micro):
            for (opt, _), rec in zip(self.steps[rank], self.micro[rank]):
                out[opt][rank].append(rec[name])
        return [out]


_local = threading.local()

# the order in which a loss function's reductions run: agg_loss calls, verl_F.masked_mean calls (losses.ppo_loss with
# compute_policy_loss_vanilla; losses.value_loss with compute_value_loss, whose agg_loss matrix is halved after)
ACTOR_ORDER = (("pg_loss", "entropy", "kl"), ("ppo_kl", "pg_clipfrac", "pg_clipfrac_lower"))
CRITIC_ORDER = (("vf_loss_x2",), ("vf_clipfrac",))


def _ragged(values, mask) -> list[list[float]]:
    return [[float(v) for v, m in zip(row, mrow) if m] for row, mrow in zip(values.tolist(), mask.tolist())]


def _next(rec: dict, names: tuple[str, ...]) -> str | None:
    done = [k for k in rec if k in names]
    return names[len(done)] if len(done) < len(names) else None


@contextlib.contextmanager
def capturing(cap: "Capture"):
    """Record what veRL's ``agg_loss`` (core_algos and the loss module's import of it) and ``masked_mean``
    (verl.utils.torch_functional, and the loss module's import of it: the critic's vpred mean) are given, in the
    calling rank's current micro-batch record; ``agg_loss`` outside a micro-batch is the driver's."""
    c = code()
    real_agg, real_mean, real_loss_mean = c.core_algos.agg_loss, c.verl_F.masked_mean, c.losses.masked_mean

    def agg_loss(loss_mat, loss_mask, loss_agg_mode, *a, **kw):
        rec = getattr(_local, "record", None)
        if rec is not None:
            name = _next(rec, _local.order[0])
            if name:
                rec[name] = _ragged(loss_mat.detach(), loss_mask.bool())
        else:
            cap.driver.append({"values": _ragged(loss_mat.detach(), loss_mask.bool()), "mode": loss_agg_mode})
        return real_agg(loss_mat, loss_mask, loss_agg_mode, *a, **kw)

    def masked_mean(values, mask, *a, **kw):
        rec = getattr(_local, "record", None)
        if rec is not None:
            name = _next(rec, _local.order[1])
            if name:
                rec[name] = _ragged(values.detach().float(), mask.bool())
        return real_mean(values, mask, *a, **kw)

    def loss_masked_mean(values, mask, *a, **kw):
        rec = getattr(_local, "record", None)
        if rec is not None:
            rec["vpred"] = _ragged(values.detach().float(), mask.bool())
        return real_loss_mean(values, mask, *a, **kw)

    c.core_algos.agg_loss, c.losses.agg_loss, c.verl_F.masked_mean = agg_loss, agg_loss, masked_mean
    c.losses.masked_mean = loss_masked_mean
    c.v1_ns["agg_loss"] = agg_loss
    try:
        yield
    finally:
        c.core_algos.agg_loss, c.losses.agg_loss, c.verl_F.masked_mean = real_agg, real_agg, real_mean
        c.losses.masked_mean = real_loss_mean
        c.v1_ns["agg_loss"] = real_agg


# --------------------------------------------------------------------------------------------- the tiny policy
class TinyPolicy:
    """Per-token log-probabilities ``base + w * feature + b`` and entropies ``ent + 0.1 * w * feature`` of each
    sequence (indexed by the batch's ``seq_id``), with two trainable scalars, so every optimizer step moves the
    policy: the update-time log-probs differ from the pre-update (old) ones from the second optimizer step on.
    ``critic=True``: the same form as the value head's per-token values (``values`` instead of ``log_probs``)."""

    def __init__(self, base, feature, ent, critic: bool = False):
        torch = code().torch
        self.base, self.feature, self.ent, self.critic = base, feature, ent, critic
        self.module = torch.nn.Linear(1, 1)
        with torch.no_grad():
            self.module.weight.zero_()
            self.module.bias.zero_()

    def __call__(self, micro_batch, calculate_entropy: bool):
        torch = code().torch
        w, b = self.module.weight[0, 0], self.module.bias[0]
        prompt_lens = micro_batch["prompts"].offsets().diff().tolist()
        resp_lens = micro_batch["responses"].offsets().diff().tolist()
        lps, ents = [], []
        for i, p, n in zip(micro_batch["seq_id"].tolist(), prompt_lens, resp_lens):
            lp = self.base[i, :n] + w * self.feature[i, :n] + b
            ent = self.ent[i, :n] + 0.1 * w * self.feature[i, :n]
            z = torch.zeros(p - 1)
            # the engine's output covers prompt + response; the response's log-probs sit one token to the left
            lps.append(torch.cat([z, lp, torch.zeros(1)]))
            ents.append(torch.cat([z, ent, torch.zeros(1)]))
        key = "values" if self.critic else "log_probs"
        out = {key: torch.nested.as_nested_tensor(lps, layout=torch.jagged)}
        if calculate_entropy and not self.critic:
            out["entropy"] = torch.nested.as_nested_tensor(ents, layout=torch.jagged)
        return out


class Engine:
    """veRL's FSDP engine methods (compiled from transformer_impl.py and base.py) on one simulated rank; only
    ``forward_step`` runs the tiny policy instead of an HF model."""

    def __init__(self, policy: "TinyPolicy", rank: int, optimizer_config, cap: Capture, micro_size: int,
                 order=ACTOR_ORDER):
        torch = code().torch
        self.order = order
        self.policy, self.module, self.rank, self.cap = policy, policy.module, rank, cap
        self.optimizer_config = optimizer_config
        self.optimizer = torch.optim.SGD(self.module.parameters(), lr=optimizer_config.lr)
        self.rank = -1                 # _build_lr_scheduler prints its settings on rank 0: keep stdout clean
        self.lr_scheduler = self._build_lr_scheduler(self.optimizer)
        self.rank = rank
        self.ulysses_sequence_parallel_size = 1
        self.scaler = None
        self._qat_enabled = False
        self.micro_size = micro_size
        self.opt_step = 0
        self.micro_index = 0
        cap.micro.setdefault(rank, [])
        cap.steps.setdefault(rank, [])
        cap.grad_norms.setdefault(rank, [])
        cap.lrs_used.setdefault(rank, [])
        self.optimizer.register_step_pre_hook(
            lambda opt, *a: cap.lrs_used[rank].append(float(opt.param_groups[0]["lr"])))

    forward_backward_batch = property(lambda self: types.MethodType(code().fsdp["forward_backward_batch"], self))
    optimizer_zero_grad = property(lambda self: types.MethodType(code().fsdp["optimizer_zero_grad"], self))
    lr_scheduler_step = property(lambda self: types.MethodType(code().fsdp["lr_scheduler_step"], self))
    _build_lr_scheduler = property(lambda self: types.MethodType(code().fsdp["_build_lr_scheduler"], self))
    train_batch = property(lambda self: types.MethodType(code().base["train_batch"], self))
    infer_batch = property(lambda self: types.MethodType(code().base["infer_batch"], self))

    def optimizer_step(self):
        _local.cap = self.cap                      # where the clip_grad_norm_ wrapper records this rank's norm
        try:
            return code().fsdp["optimizer_step"](self)
        finally:
            self.opt_step += 1
            self.micro_index = 0

    def forward_step(self, micro_batch, loss_function, forward_only):
        """As FSDPEngineWithLMHead.forward_step: model output, then ``loss_function(model_output=, data=,
        dp_group=)``; the output dict it returns (model_output, loss, metrics)."""
        torch = code().torch
        calc = bool(code().tu.get_non_tensor_data(micro_batch, "calculate_entropy", False))
        with (torch.no_grad() if forward_only else contextlib.nullcontext()):
            model_output = self.policy(micro_batch, calc)
        if loss_function is None:
            return torch.tensor(1.0), {"model_output": {k: v.detach() for k, v in model_output.items()},
                                       "loss": 1.0, "metrics": {}}
        _local.record, _local.order = {}, self.order
        try:
            loss, metrics = loss_function(model_output=model_output, data=micro_batch,
                                          dp_group=self.get_data_parallel_group())
        finally:
            rec, _local.record = _local.record, None
        self.cap.micro[self.rank].append(rec)
        self.cap.steps[self.rank].append((self.opt_step, self.micro_index))
        self.micro_index += 1
        return loss, {"model_output": {k: v.detach() for k, v in model_output.items()},
                      "loss": loss.detach().item(), "metrics": metrics}

    @contextlib.contextmanager
    def _gradient_sync_context(self, *, is_last_micro_batch: bool):
        """FSDP's gradient reduction across ranks, once per mini-batch at its last micro-batch (averaged)."""
        yield
        if is_last_micro_batch:
            for p in self.module.parameters():
                if p.grad is not None:
                    g, r = F.current_rank()
                    parts = g.exchange(r, p.grad.detach().clone())
                    p.grad.copy_(sum(parts) / g.world)

    def train_mode(self, **kw):
        return contextlib.nullcontext()

    eval_mode = train_mode

    def get_data_parallel_group(self):
        return None if WORLD == 1 else "dp"

    def get_data_parallel_size(self):
        return F.current_rank()[0].world

    def get_data_parallel_rank(self):
        return self.rank

    def is_mp_src_rank_with_outputs(self):
        return True


class _Flops:
    """The worker's FlopsCounter needs an HF config; the MFU value is not under test (V1 pops actor/mfu)."""

    def estimate_flops(self, tokens, delta_time, images_seqlens=None):
        return float(sum(tokens)), 1e12


class _Device:
    def max_memory_allocated(self):
        return 0

    max_memory_reserved = max_memory_allocated


def worker(engine: Engine, loss_fn, micro_size: int):
    """A real ``TrainingWorker`` (engine_workers.py) without its Ray/engine construction."""
    c = code()
    w = c.engine_workers.TrainingWorker.__new__(c.engine_workers.TrainingWorker)
    w.engine, w.loss_fn, w.device_name, w.flops_counter = engine, loss_fn, "cpu", _Flops()
    w.model_config = {"use_remove_padding": True}
    from verl.workers.config import FSDPEngineConfig
    w.engine_config = FSDPEngineConfig(strategy="fsdp", use_dynamic_bsz=False, micro_batch_size_per_gpu=micro_size,
                                       infer_micro_batch_size_per_gpu=micro_size)
    from verl.utils.profiler import DistProfiler
    w.profiler = DistProfiler(rank=engine.rank)          # veRL's default: disabled
    return w


def _method(cls, name):
    return inspect.unwrap(getattr(cls, name))


# --------------------------------------------------------------------------------------------- TransferQueue
@dataclass
class Meta:
    """TransferQueue's KVBatchMeta: the keys of a batch, their tags and the extra info handed to the workers."""
    keys: list[str]
    partition_id: str = "train"
    tags: list[dict] = field(default_factory=list)
    extra_info: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.keys)


class Store:
    """TransferQueue as the V1 trainer calls it (``tq.kv_batch_get`` / ``kv_batch_put``): rows by key, fields as
    nested (jagged) tensors or per-row tensors."""

    def __init__(self):
        self.rows: dict[str, dict[str, Any]] = {}

    def put_rows(self, keys: list[str], fields: dict[str, list]):
        for i, k in enumerate(keys):
            self.rows.setdefault(k, {}).update({f: v[i] for f, v in fields.items()})

    def kv_batch_put(self, keys, partition_id=None, fields=None, **kw):
        torch = code().torch
        for name in fields.keys():
            t = fields[name]
            rows = list(t.unbind()) if getattr(t, "is_nested", False) else [t[i] for i in range(len(keys))]
            for k, v in zip(keys, rows):
                self.rows[k][name] = v.detach().clone() if isinstance(v, torch.Tensor) else v
        return Meta(keys=list(keys), partition_id=partition_id or "train")

    def kv_batch_get(self, keys, partition_id=None, select_fields=None, **kw):
        c = code()
        torch = c.torch
        names = [f for f in select_fields if f in self.rows[keys[0]]]
        data = {}
        for f in names:
            vals = [self.rows[k][f] for k in keys]
            if vals[0].dim() >= 1:
                data[f] = torch.nested.as_nested_tensor(vals, layout=torch.jagged)
            else:
                data[f] = torch.stack(vals)
        return c.TensorDict(data, batch_size=[len(keys)])


@dataclass
class Rollout:
    """One step's batch: per sequence the prompt length, the response tokens (LLM and tool tokens: ``tool`` marks
    the tool tokens, which response_mask leaves out), the reward, and the policy/reference values of the tiny
    policy."""
    prompt_lens: list[int]
    resp_lens: list[int]
    tool: list[list[int]]               # per sequence: 1 at the positions of tool-output tokens
    scores: list[float]
    seed: int = 3

    @property
    def n(self) -> int:
        return len(self.resp_lens)


# The shared uneven batch of the fingerprint proofs: 16 sequences (8 per rank: 2 mini-batches of 4, micro-batches of
# 2), lengths uneven at every level; tool-output tokens (1) inside some responses; the longest response (9 tokens)
# twice, none truncated (below the configured maxima, 8 and 12)
UNEVEN = Rollout(
    prompt_lens=[3, 4, 2, 6, 3, 5, 4, 2, 5, 3, 2, 4, 3, 6, 2, 4],
    resp_lens=[2, 5, 3, 9, 1, 4, 6, 2, 3, 7, 2, 5, 9, 1, 6, 3],
    tool=[[], [0, 1, 1], [], [0, 0, 1, 1, 1], [], [0, 1], [], [], [], [0, 0, 1, 1], [], [], [0, 1, 1, 1], [],
          [0, 0, 0, 1], []],
    scores=[1, 0, .5, 1, 0, 0, 1, .25, 1, 0, .5, 0, 1, 1, 0, .5])
MICRO, MINI, EPOCHS = 2, 8, 2          # sequences per micro-batch and rank, per mini-batch (global); epochs
MAX_PROMPT, MAX_RESPONSE = 8, 12


def base_config(r: Rollout = UNEVEN) -> dict[str, Any]:
    """The veRL run config the proofs' trainer step runs with (the levels' counts follow from it)."""
    return {"data.train_batch_size": r.n, "actor_rollout_ref.actor.ppo_mini_batch_size": MINI,
            "actor_rollout_ref.actor.ppo_epochs": EPOCHS, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": MICRO,
            "critic.ppo_mini_batch_size": MINI, "critic.ppo_epochs": EPOCHS,
            "actor_rollout_ref.rollout.n": 1, "trainer.n_gpus_per_node": WORLD, "trainer.nnodes": 1,
            "actor_rollout_ref.actor.use_kl_loss": True, "actor_rollout_ref.actor.calculate_entropy": True,
            "actor_rollout_ref.rollout.multi_turn.tool_config_path": "tools.yaml",
            "data.max_prompt_length": MAX_PROMPT, "data.max_response_length": MAX_RESPONSE}


def _rollout_fields(r: Rollout):
    torch = code().torch
    g = torch.Generator().manual_seed(r.seed)
    width = max(r.resp_lens)
    base = -torch.rand(r.n, width, generator=g) * 1.5 - 0.2
    feature = torch.randn(r.n, width, generator=g)
    ent = torch.rand(r.n, width, generator=g) * 2
    ref_shift = (torch.rand(r.n, width, generator=g) - 0.5) * 0.8
    adv = torch.randn(r.n, width, generator=g)
    fields: dict[str, list] = {k: [] for k in ("prompts", "responses", "response_mask", "loss_mask", "input_ids",
                                               "ref_log_prob", "advantages", "returns", "rm_scores",
                                               "token_level_rewards", "seq_id", "num_turns")}
    for i in range(r.n):
        p, n = r.prompt_lens[i], r.resp_lens[i]
        mask = torch.tensor([0 if t else 1 for t in r.tool[i][:n]] + [1] * (n - len(r.tool[i][:n])),
                            dtype=torch.long)[:n]
        fields["prompts"].append(torch.full((p,), 5))
        fields["responses"].append(torch.arange(n) % 7 + 8)
        fields["response_mask"].append(mask)
        fields["loss_mask"].append(mask)
        fields["input_ids"].append(torch.arange(p + n) % 11 + 1)
        fields["ref_log_prob"].append((base[i, :n] + ref_shift[i, :n]) * mask)
        fields["advantages"].append(adv[i, :n] * mask)
        fields["returns"].append(adv[i, :n] * mask)
        score = torch.zeros(n)
        last = int(mask.nonzero().max()) if mask.any() else n - 1
        score[last] = r.scores[i]
        fields["rm_scores"].append(score)
        fields["token_level_rewards"].append(score)
        fields["seq_id"].append(torch.tensor(i))
        fields["num_turns"].append(torch.tensor(1 + sum(1 for j in range(1, n) if r.tool[i][j:j + 1] == [1]
                                                        and r.tool[i][j - 1] == 0)))
    return fields, (base, feature, ent)


# --------------------------------------------------------------------------------------------- one training step
@dataclass
class StepRun:
    metrics: dict[str, float]           # what the V1 trainer logged for the step
    cap: Capture
    n_opt_steps: int                    # optimizer steps in the step (mini-batches x ppo_epochs)
    lr_after: float                     # the scheduler's learning rate after the step
    rollout: Rollout
    cap_critic: Capture | None = None
    critic_lr_after: float | None = None    # the critic scheduler's learning rate after the step (critic=True)


def actor_config(**overrides):
    c = code()
    kw = dict(strategy="fsdp", ppo_mini_batch_size=4, ppo_micro_batch_size_per_gpu=2, use_dynamic_bsz=False,
              rollout_n=1, use_kl_loss=True, ppo_epochs=2)
    kw.update(overrides)
    return c.FSDPActorConfig(**kw)


def run_step(r: Rollout, *, mini_batch_size: int = 8, micro_size: int = 2, epochs: int = 2, lr: float = 3.0,
             actor_overrides: dict | None = None, critic: bool = False) -> StepRun:
    """One V1 training step of veRL 0.9.1 on ``r`` over WORLD simulated ranks: the old-log-prob pass (entropy),
    the actor update (train_mini_batch: mini-batches of ``mini_batch_size`` sequences, ``epochs`` PPO epochs,
    micro-batches of ``micro_size`` per rank) and the step's data metrics; the logged metrics and what veRL
    computed on the way. ``critic``: a critic too (V1 _update_critic, the engine worker with value_loss, the same
    mini-batches and epochs), its rollout-time values those of the tiny critic before its update."""
    from functools import partial
    c = code()
    torch = c.torch
    acfg = actor_config(ppo_mini_batch_size=mini_batch_size, ppo_micro_batch_size_per_gpu=micro_size,
                        ppo_epochs=epochs, **(actor_overrides or {}))
    ocfg = c.FSDPOptimizerConfig(lr=lr, lr_scheduler_type="cosine", total_training_steps=4, clip_grad=1.0)
    fields, (base, feature, ent) = _rollout_fields(r)
    store = Store()
    keys = [f"k{i}" for i in range(r.n)]
    vbase = torch.randn(r.n, base.shape[1], generator=torch.Generator().manual_seed(r.seed + 1))
    fields["values"] = [vbase[i, :n] * m for i, (n, m) in enumerate(zip(r.resp_lens, fields["response_mask"]))]
    store.put_rows(keys, fields)
    cap, cap_critic = Capture(), Capture()
    policies = [TinyPolicy(base, feature, ent) for _ in range(WORLD)]
    critics = [TinyPolicy(vbase, feature, ent, critic=True) for _ in range(WORLD)]
    engines: list[Engine | None] = [None] * WORLD
    critic_engines: list[Engine | None] = [None] * WORLD
    loss_fn = partial(c.losses.ppo_loss, config=acfg)
    ccfg = c.FSDPCriticConfig(strategy="fsdp", ppo_mini_batch_size=mini_batch_size, ppo_epochs=epochs,
                              ppo_micro_batch_size_per_gpu=micro_size, rollout_n=1, use_dynamic_bsz=False)
    critic_loss_fn = partial(c.losses.value_loss, config=ccfg)

    def share(rank: int) -> list[str]:
        per = r.n // WORLD
        return keys[rank * per:(rank + 1) * per]

    def on_ranks(method: str, meta, select: list[str], role: str = "actor"):
        pool, models = (engines, policies) if role == "actor" else (critic_engines, critics)

        def body(rank: int):
            if pool[rank] is None:
                pool[rank] = Engine(models[rank], rank, ocfg, cap if role == "actor" else cap_critic, micro_size,
                                    order=ACTOR_ORDER if role == "actor" else CRITIC_ORDER)
            ks = share(rank)
            td = store.kv_batch_get(ks, select_fields=select)
            c.tu.assign_non_tensor(td, **meta.extra_info)
            w = worker(pool[rank], loss_fn if role == "actor" else critic_loss_fn, micro_size)
            return _method(c.engine_workers.TrainingWorker, method)(w, td)
        with simulated_dist(), _patched(c.engine_workers, get_torch_device=lambda: _Device()):
            return F.run_ranks(body, WORLD)

    def collect(outs):
        m0 = c.tu.get(outs[0], "metrics")
        for o in outs[1:]:
            assert _same(c.tu.get(o, "metrics"), m0), "the ranks returned different metrics"
        # the single controller's collect (decorator.py collect_nd_compute_dataproto -> concat_tensordict):
        # batch-less TensorDicts of metrics concatenate to the first rank's
        return c.tu.concat_tensordict(outs)

    class WorkerGroup:
        def compute_log_prob(self, meta):
            outs = on_ranks("infer_batch", meta, ["prompts", "responses", "input_ids", "loss_mask", "seq_id",
                                                  "response_mask"])
            for rank, out in enumerate(outs):
                store.kv_batch_put(share(rank), fields={k: out[k] for k in ("log_probs", "entropy")})
            return meta

        def update_actor(self, meta):
            return collect(on_ranks("train_mini_batch", meta, ["prompts", "responses", "input_ids", "loss_mask",
                                                               "seq_id", "response_mask", "old_log_probs",
                                                               "advantages", "ref_log_prob"]))

    class CriticGroup:
        def train_mini_batch(self, meta):
            out = collect(on_ranks("train_mini_batch", meta, ["prompts", "responses", "input_ids", "loss_mask",
                                                              "seq_id", "response_mask", "values", "returns"],
                                   role="critic"))
            return types.SimpleNamespace(get=lambda: out)          # a DataProtoFuture

    config = _config(acfg, r)
    trainer = types.SimpleNamespace(config=config, actor_rollout_wg=WorkerGroup(), use_critic=critic,
                                    critic_wg=CriticGroup(),
                                    _rollout_moe_lb_metrics_accumulator=None,
                                    _get_n_gpus_for_throughput=lambda: WORLD, distillation_config=None)
    meta = Meta(keys=keys, tags=[{"min_global_steps": 0, "max_global_steps": 0} for _ in keys])
    metrics: dict[str, Any] = {}
    v1 = c.v1
    real_clip = torch.nn.utils.clip_grad_norm_

    def clip(params, max_norm, *a, **kw):          # the pre-clip norm veRL's optimizer_step gets back
        norm = real_clip(params, max_norm, *a, **kw)
        _local.cap.grad_norms[F.current_rank()[1]].append(float(norm))
        return norm

    with capturing(cap), _patched_ns(c.v1_ns, tq=store), _patched(torch.nn.utils, clip_grad_norm_=clip):
        v1["_compute_old_log_prob"](trainer, meta, metrics)
        if critic:
            v1["_update_critic"](trainer, meta, metrics)
        v1["_update_actor"](trainer, meta, metrics)
        aggregator = c.MetricsAggregator()            # V1 step(): one iteration in the sync trainer
        aggregator.add_step_metrics(metrics, sample_count=r.n)
        metrics = aggregator.get_aggregated_metrics()
        v1["_compute_metrics"](trainer, meta, metrics, {"step": 1.0, "gen": 0.5, "update_actor": 0.3},
                               global_steps=1, epoch=0)
    n_opt = (r.n // WORLD) // (mini_batch_size // WORLD) * epochs
    return StepRun(metrics={k: float(v) for k, v in metrics.items() if _is_number(v)}, cap=cap, n_opt_steps=n_opt,
                   lr_after=float(engines[0].lr_scheduler.get_last_lr()[0]), rollout=r,
                   cap_critic=cap_critic if critic else None,
                   critic_lr_after=float(critic_engines[0].lr_scheduler.get_last_lr()[0]) if critic else None)


def _is_number(v) -> bool:
    import numbers
    return isinstance(v, numbers.Number) or (hasattr(v, "ndim") and getattr(v, "ndim", 1) == 0)


def _same(a: dict, b: dict) -> bool:
    return set(a) == set(b) and all(str(a[k]) == str(b[k]) for k in a if "memory" not in k)


def _config(acfg, r: Rollout):
    from omegaconf import OmegaConf
    return OmegaConf.create({
        "actor_rollout_ref": {"actor": {"ppo_mini_batch_size": acfg.ppo_mini_batch_size,
                                        "ppo_epochs": acfg.ppo_epochs, "loss_agg_mode": acfg.loss_agg_mode,
                                        "loss_scale_factor": acfg.loss_scale_factor, "calculate_entropy": True,
                                        "entropy_coeff": 0.0, "data_loader_seed": 42, "shuffle": False},
                              "rollout": {"n": 1, "temperature": 1.0, "calculate_log_probs": False,
                                          "moe_load_balance_metrics_interval": 0},
                              "model": {}},
        "critic": {"ppo_mini_batch_size": acfg.ppo_mini_batch_size, "ppo_epochs": acfg.ppo_epochs,
                   "data_loader_seed": 42, "shuffle": False},
        "algorithm": {}, "trainer": {"v1": {}}, "data": {"train_batch_size": r.n}})


@contextlib.contextmanager
def _patched(module, **attrs):
    saved = {k: getattr(module, k) for k in attrs}
    for k, v in attrs.items():
        setattr(module, k, v)
    try:
        yield
    finally:
        for k, v in saved.items():
            setattr(module, k, v)


@contextlib.contextmanager
def _patched_ns(ns: dict, **attrs):
    saved = {k: ns.get(k) for k in attrs}
    ns.update(attrs)
    try:
        yield
    finally:
        ns.update(saved)



def legacy_data_metrics(r: Rollout, max_prompt_length: int, max_response_length: int) -> dict[str, float]:
    """``compute_data_metrics`` (metric_utils.py) on the step's batch as the legacy trainer holds it
    (trainer.use_v1=false, ray_trainer.py): prompts left-padded to rollout.prompt_length and responses right-padded
    to rollout.response_length, as the agent loop pads them (experimental/agent_loop/agent_loop.py@v0.9.1
    ``_postprocess``: padding="max_length"), with the attention mask covering tool-output tokens too."""
    c = code()
    torch = c.torch
    fields, _ = _rollout_fields(r)
    n, P, W = r.n, max_prompt_length, max_response_length
    attn = torch.zeros(n, P + W, dtype=torch.long)
    resp_mask = torch.zeros(n, W, dtype=torch.long)
    scores = torch.zeros(n, W)
    adv = torch.zeros(n, W)
    for i in range(n):
        p, k = r.prompt_lens[i], r.resp_lens[i]
        attn[i, P - p:P] = 1
        attn[i, P:P + k] = 1
        resp_mask[i, :k] = fields["response_mask"][i]
        scores[i, :k] = fields["rm_scores"][i]
        adv[i, :k] = fields["advantages"][i]
    td = c.TensorDict({"prompts": torch.full((n, P), 5), "responses": torch.full((n, W), 5), "attention_mask": attn,
                       "response_mask": resp_mask, "token_level_scores": scores, "token_level_rewards": scores,
                       "advantages": adv, "returns": adv}, batch_size=[n])
    out = c.metric_utils.compute_data_metrics(c.DataProto(batch=td), use_critic=False)
    return {k: float(v) for k, v in out.items() if _is_number(v)}


# --------------------------------------------------------------------------------------------- driver inputs
@dataclass
class DriverInputs:
    """What the V1 trainer's ``_compute_metrics`` handed to metric_utils while veRL ran: the padded DataProto
    ``compute_data_metrics`` was given (and its ``use_critic``), and the timings, GPU count and per-sequence token
    counts (``meta_info["global_token_num"]``) ``compute_timing_metrics`` / ``compute_throughout_metrics`` got."""
    data: Any = None
    use_critic: bool | None = None
    timing: dict | None = None
    n_gpus: int | None = None
    global_token_num: list | None = None
    timing_batch: Any = None


def run_step_driver(r: Rollout, **kw) -> tuple[StepRun, DriverInputs]:
    """:func:`run_step`, recording what veRL's driver metric functions were called with (veRL's own functions
    still compute every logged value: the wrappers only look at their arguments)."""
    c = code()
    got = DriverInputs()
    real_data = c.v1_ns["compute_data_metrics"]
    real_timing = c.v1_ns["compute_timing_metrics"]
    real_thr = c.v1_ns["compute_throughout_metrics"]

    def data_metrics(batch, use_critic=True):
        got.data, got.use_critic = batch, use_critic
        return real_data(batch=batch, use_critic=use_critic)

    def timing_metrics(batch, timing_raw):
        got.timing_batch = batch
        return real_timing(batch=batch, timing_raw=timing_raw)

    def throughput(batch, timing_raw, n_gpus):
        got.timing, got.n_gpus = dict(timing_raw), n_gpus
        got.global_token_num = list(batch.meta_info["global_token_num"])
        return real_thr(batch=batch, timing_raw=timing_raw, n_gpus=n_gpus)

    with _patched_ns(c.v1_ns, compute_data_metrics=data_metrics, compute_timing_metrics=timing_metrics,
                     compute_throughout_metrics=throughput):
        run = run_step(r, **kw)
    return run, got


# --------------------------------------------------------------------------------------------- validation
@functools.lru_cache(maxsize=None)
def val_metrics_update():
    """The V1 trainer's ``PPOTrainer._val_metrics_update`` (trainer/ppo/v1/trainer_base.py), compiled from the
    file's own text, with metric_utils' own ``process_validation_metrics``: validation samples in, the logged
    ``val-core/...`` / ``val-aux/...`` dict out."""
    import verl
    c = code()
    root = Path(verl.__file__).resolve().parent
    ns = {"np": c.np, "process_validation_metrics": c.metric_utils.process_validation_metrics}
    return _compile(root / "trainer/ppo/v1/trainer_base.py", ["_val_metrics_update"], ns,
                    cls="PPOTrainer")["_val_metrics_update"]


def run_validation(data_sources: list, uids: list, infos: dict) -> tuple[dict[str, float], list]:
    """veRL's validation metrics of the samples (``_val_metrics_update`` -> ``process_validation_metrics``) and
    every call of ``bootstrap_metric`` made on the way, in order: (subset_size, the data, the (mean, std) pairs it
    returned)."""
    c = code()
    calls: list = []
    real = c.metric_utils.bootstrap_metric

    def bootstrap_metric(data, subset_size, reduce_fns, n_bootstrap=1000, seed=42):
        out = real(data=data, subset_size=subset_size, reduce_fns=reduce_fns, n_bootstrap=n_bootstrap, seed=seed)
        calls.append((subset_size, list(data), out))
        return out

    with _patched(c.metric_utils, bootstrap_metric=bootstrap_metric):
        out = val_metrics_update()(types.SimpleNamespace(), data_sources, uids, infos, [])
    return {k: float(v) for k, v in out.items()}, calls


# --------------------------------------------------------------------------------------------- KL in the reward
def run_kl_penalty(data, kl_ctrl, kl_penalty: str = "kl") -> tuple[Any, dict[str, float], list]:
    """``apply_kl_penalty`` (trainer/ppo/ray_trainer.py, which the V1 trainer's ``_compute_advantage`` imports and
    calls under algorithm.use_kl_in_reward), compiled from the file's own text (the module imports Ray's worker
    groups) with veRL's own ``core_algos`` and ``masked_mean``; returns the data, the logged metrics and the
    per-token KL matrices ``core_algos.kl_penalty`` returned (captured)."""
    import verl
    c = code()
    root = Path(verl.__file__).resolve().parent
    seen: list = []

    def kl_penalty_fn(*a, **kw):
        out = c.core_algos.kl_penalty(*a, **kw)
        seen.append(out.detach().clone())
        return out

    algos = types.SimpleNamespace(kl_penalty=kl_penalty_fn, AdaptiveKLController=c.core_algos.AdaptiveKLController)
    ns = {"torch": c.torch, "DataProto": c.DataProto, "core_algos": algos, "masked_mean": c.verl_F.masked_mean}
    fn = _compile(root / "trainer/ppo/ray_trainer.py", ["apply_kl_penalty"], ns)["apply_kl_penalty"]
    data, metrics = fn(data, kl_ctrl=kl_ctrl, kl_penalty=kl_penalty)
    return data, {k: float(v) for k, v in metrics.items()}, seen


# --------------------------------------------------------------------------------------------- unproven entries
_ITERATIONS = ("MetricsAggregator sums the count over the step's iterations (v1/utils.py@v0.9.1:41-50; "
               "trainer.v1.<mode>.parameter_sync_step: 1 in the default sync mode, 4 in separate_async), which the "
               "stated {like: scalar} matches for one iteration only")

#: why an entry of veRL 0.9.1 that covers the installed release has no fingerprint proof (issue 33 item 1), by
#: (framework, key, trainer); the proofs that reached the others: tests/frameworks/test_proof_verl*.py
ENTRY_WHY: dict[tuple[str, str, str | None], str] = {
    ("verl", "training/rollout_actor_probs_pearson_corr", "ppo"):
        "a Pearson correlation of the trainer's and the rollout's token probabilities: no candidate reduction "
        "(mean, extremum, sum, std) expresses it",
    ("verl", "rollout_corr/{name}", "ppo"):
        "one template over ~20 names that reduce differently (rollout_corr_helper.py@v0.9.1:660-1008): token means "
        "(rollout_is_mean, chi2_token), per-sequence means (training_ppl, rollout_ppl, log_ppl_diff, ppl_ratio, "
        "rollout_is_seq_mean), extremes (rollout_is_max/min, log_ppl_diff_max/min), stds, an effective sample size, "
        "fractions; the stated token mean is right for a few only: each needs an entry of its own first "
        "(rollout_corr/kl and k3_kl are proven by tests/frameworks/test_proof_verl.py)",
    ("verl", "rollout/moe/{name:path}", "ppo"):
        "proof not written yet: needs routed_experts from a MoE rollout in the transfer queue and the "
        "RolloutMoELoadBalanceMetricsAccumulator's interval (metric_utils.py@v0.9.1:289-360); per-layer "
        "max/min/avg violations are ratios of expert loads over the uniform load, none a candidate statistic of "
        "per-sample values",
    ("verl", "training/off_policy/evicted_samples", "ppo"):
        "proof not written yet: needs the V1 ReplayBuffer (replay_buffer.py@v0.9.1:345-380, which imports "
        "TransferQueue, not installed: compiled from its text over proofs_verl.Store) evicting stale samples; "
        + _ITERATIONS,
    ("verl", "training/filter_groups/evicted_samples", "ppo"):
        "proof not written yet: needs the V1 ReplayBuffer's DAPO group filtering (replay_buffer.py@v0.9.1:261-380, "
        "TransferQueue not installed: compiled from its text over proofs_verl.Store); " + _ITERATIONS,
    ("verl", "training/filter_groups/discarded_surplus_samples", "ppo"):
        "proof not written yet: needs the V1 ReplayBuffer's DAPO group filtering keeping more samples than the "
        "batch (replay_buffer.py@v0.9.1 sample(), TransferQueue not installed: compiled from its text); "
        + _ITERATIONS,
    ("verl", "training/rollout_failure/evicted_samples", "ppo"):
        "proof not written yet: needs failed rollouts in the V1 ReplayBuffer (replay_buffer.py@v0.9.1:317-380, "
        "TransferQueue not installed: compiled from its text); " + _ITERATIONS,
    ("verl", "actor/mtp_losses/mtp_{i}_loss", "ppo"):
        "proof not written yet: the Megatron engine's multi-token-prediction losses (utils/megatron_utils.py); "
        "Megatron-core is not installed, and the engine worker's average over the ranks' lists "
        "(engine_workers.py@v0.9.1:224-227) needs that engine's per-micro-batch mtp_losses to run",
    ("verl", "val-core/{data_source:path}/{var}/std@{n}", "ppo"):
        "veRL 0.9.1 never logs it: _val_metrics_update (trainer_base.py@v0.9.1:1362-1369) puts only mean@, maj@ "
        "and best@ of the core variable at the largest n in val-core, std@ in val-aux (proven there by "
        "tests/frameworks/test_proof_verl_driver.py; tests/frameworks/test_proof_verl.py checks no val-core std@)",
    ("verl", "val-core/{data_source:path}/{var}/worst@{n}/mean", "ppo"):
        "veRL 0.9.1 never logs it: _val_metrics_update (trainer_base.py@v0.9.1:1362-1369) puts worst@ in val-aux "
        "(proven there by tests/frameworks/test_proof_verl_driver.py; tests/frameworks/test_proof_verl.py checks "
        "no val-core worst@)",
    ("verl", "val-core/{data_source:path}/{var}/worst@{n}/std", "ppo"):
        "veRL 0.9.1 never logs it: _val_metrics_update (trainer_base.py@v0.9.1:1362-1369) puts worst@ in val-aux "
        "(proven there by tests/frameworks/test_proof_verl_driver.py; tests/frameworks/test_proof_verl.py checks "
        "no val-core worst@)",
    ("verl", "val/generations", "ppo"):
        "a table of validation samples (ValidationGenerationsLogger: wandb Table, TensorBoard text, MLflow JSON), "
        "not a number: nothing to fingerprint",
}
