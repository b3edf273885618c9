"""ROLL's own metric code for the fingerprint proofs (tests/frameworks/test_proof_roll.py), on a CPU machine.

ROLL (alibaba/ROLL) publishes no wheel, and its package ``__init__`` files and workers start Ray actors, Megatron or
FSDP2 process groups and vLLM/SGLang engines. The files that compute and reduce the RLVR pipeline's logged metrics
are vendored verbatim from the v0.3.0 tag (tests/data/frameworks/roll/, tests/_support/vendored.py) and run here:

Loaded whole (``vendored.load``, parents as empty packages):

* ``roll/utils/constants.py`` (``IGNORE_INDEX``), ``roll/utils/kl_controller.py`` (annotations of functionals.py);
* ``roll/utils/functionals.py``: ``agg_loss``, ``compute_approx_kl``, ``masked_mean``, ``log_probs_from_logits``,
  ``append_to_dict``, ``flatten_sum``, ``reduce_metrics``, ``get_sample_level_mask``. Stand-ins: ``roll.configs``/
  ``roll.configs.base_config`` (``PPOConfig``) and ``roll.pipeline.rlvr.rlvr_config`` (``RLVRConfig``), which the
  file imports only for annotations (``from __future__ import annotations``: never evaluated), and whose real
  modules import the whole worker/strategy configuration tree; ``roll.platforms`` (:data:`CPU`, see below);
* ``roll/distributed/scheduler/protocol.py`` (``DataProto``: ``chunk``, ``make_iterator``, ``concat`` with its
  ``metrics`` merge) and ``roll/distributed/scheduler/remote_protocol.py`` (``BatchProxy``, through which
  ``data.batch[...]`` reads). Stand-ins: ``ray`` (only ``ray.ObjectRef``, an annotation of ``materialize_concat``
  and ``ObjectRefWrap``; the proofs call ``DataProto.concat`` directly, which is what ``materialize_concat`` does
  once ``ray.get`` has fetched the workers' outputs, protocol.py:1115-1118), ``codetiming`` (``Timer``: only the
  remote-batch transfer paths time with it; no batch here is remote) and
  ``roll.distributed.scheduler.transfer_backend`` (the remote-batch store: no batch here is remote);
* ``roll/utils/metrics/metrics_manager.py`` (``MetricsManager``: ``add_reduced_metrics``, ``add_values_metrics``,
  ``add_token_metrics``, ``get_metrics``), with the ``codetiming`` stand-in (its ``DurationTracker`` only);
* ``roll/utils/tracking.py`` (``_strip_metric_tag``: what ``strip_at_tag_in_log`` does to the keys before every
  tracker's ``log``).

Compiled from the files' own text (their modules import ray, accelerate, transformers, Megatron/FSDP pieces and the
model providers), decorators that are Ray dispatch registrations (``@register(...)``) left out, every other
decorator kept:

* ``roll/pipeline/base_worker.py``: ``ActorWorker.train_step`` (the optimizer steps over the backward batches, the
  ``@sum`` division by ``backward_steps``, ``actor/lr``) and ``ActorWorker.get_old_log_probs_with_cache``;
* ``roll/pipeline/rlvr/actor_worker.py``: ``ActorWorker.loss_func`` and ``compute_sample_weights``;
* ``roll/distributed/strategy/fsdp2_strategy.py``: ``FSDP2TrainStrategy.train_step`` (the micro-batch loop,
  ``append_to_dict`` of each micro-batch's metrics, ``{name}/grad_norm`` at each sync boundary),
  ``_clip_grad_norm`` (``torch.nn.utils.clip_grad_norm_``), ``_grad_accumulation_context``,
  ``_requires_grad_sync_context``, ``FSDP2InferStrategy.op_compute_log_probs`` and
  ``FSDP2StrategyBase.get_data_input`` (the batch as it is without context parallelism);
* ``roll/distributed/strategy/strategy.py``: ``InferenceStrategy._get_batch_num_tokens`` and
  ``_get_global_valid_samples`` (the token and sample counts of the backward batch, all-reduced over the
  data-parallel group).

What stands in for the machinery around them (none of it computes a metric):

* ``roll.utils.logging``: ``get_logger`` gives the stdlib logger "roll". The real module runs
  ``logging.basicConfig(force=True)`` at import (replacing the test process's root handlers) and ``get_logger``
  opens log files under ./output/logs; the code under test only logs through it;
* ``torch.distributed`` of strategy.py: :class:`_support.framework_code.SimDist` (the ranks run in threads,
  ``all_reduce`` meets at a barrier), ``dp_group`` None;
* the model: :class:`TinyLM`, a real ``torch.nn`` language model (an embedding of the vocabulary to its logits),
  returned by the stand-in ``_fsdp2_forward`` (the FSDP2-wrapped HF forward; one process, no sharding, so each
  simulated rank's grad norm is its own replica's, where FSDP2's is one global norm); a real ``torch.optim.SGD``
  and ``LambdaLR`` scheduler; ``param_dtype`` bfloat16 (FSDP2's usual mixed precision: the autocast region changes
  none of TinyLM's ops, an embedding lookup, and log_softmax runs in float32);
* :class:`ActorRank` wraps ``op_compute_log_probs``, ``_clip_grad_norm``, ``loss_func`` and the scheduler's
  ``step`` only to record what they were given and returned (each calls the real one and returns its result);
* ``state_offload_manger`` (roll/utils/context_managers.py): moves the model and optimizer states between GPU and
  CPU and records memory/timer metrics around the step; a context manager that only yields;
* ``compute_train_infer_correction`` (roll/utils/train_infer_corrections.py): bound to a function that fails; the
  proofs run with ``enable_old_logprobs_recompute`` on (what PPOConfig.set_old_logprobs_status sets whenever a rank
  makes more than one optimizer step, base_config.py@v0.3.0:811-815), where loss_func does not call it;
* ``make_mini_batch_iter_for_dynamic_batching``, ``OffloadStateType``: unused with the default
  ``use_dynamic_batching_in_train`` off (bound to placeholders);
* ``roll.platforms.current_platform``: :data:`CPU` (``device_type`` "cpu", not an NPU);
* the pipeline and worker configuration: :func:`pipeline_config` and :func:`worker_config`, SimpleNamespaces with
  the dataclass defaults of roll/configs/base_config.py@v0.3.0 and roll/pipeline/rlvr/rlvr_config.py@v0.3.0 (cited
  per field) and the overrides a proof names.
"""
from __future__ import annotations

import ast
import contextlib
import functools
import math
import sys
import types
from typing import Any, Callable, Dict, List, Optional, Tuple

from _support import vendored as VD
from _support.framework_code import SimDist

FW = "roll"
FILES = {
    "worker": "roll/pipeline/base_worker.py",
    "actor": "roll/pipeline/rlvr/actor_worker.py",
    "fsdp2": "roll/distributed/strategy/fsdp2_strategy.py",
    "strategy": "roll/distributed/strategy/strategy.py",
    "functionals": "roll/utils/functionals.py",
    "protocol": "roll/distributed/scheduler/protocol.py",
    "metrics": "roll/utils/metrics/metrics_manager.py",
    "tracking": "roll/utils/tracking.py",
}


class _CPUPlatform:
    """``roll.platforms.current_platform`` on this machine: a CPU, not an NPU."""

    device_type = "cpu"

    @staticmethod
    def is_npu() -> bool:
        return False

    @staticmethod
    def is_available() -> bool:
        return False


CPU = _CPUPlatform()


class _Unused:
    """A name the code under test binds but does not reach in these runs."""

    def __init__(self, what: str):
        self.what = what

    def __call__(self, *a: Any, **k: Any) -> Any:
        raise AssertionError(f"{self.what} is not vendored: the proof's config should not reach it")

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"{self.what}.{name} is not vendored: the proof's config should not reach it")


class _UnusedTimer:
    """``codetiming.Timer`` (not installed): named in an annotation, entered only on paths these runs do not take."""

    def __init__(self, *a: Any, **k: Any):
        raise AssertionError("codetiming.Timer is not installed: the proof's run should not time anything")


def _get_logger() -> Any:
    import logging
    return logging.getLogger("roll")


def _is_register(dec: ast.expr) -> bool:
    f = dec.func if isinstance(dec, ast.Call) else dec
    return isinstance(f, ast.Name) and f.id == "register"


def methods(repo_path: str, cls: str, names: list[str], namespace: dict[str, Any], tag: str | None = None
            ) -> dict[str, Any]:
    """``cls.<name>`` of the vendored file (of tag ``tag``; the pinned tag when None), compiled from its own text into
    ``namespace`` (Ray's ``@register`` dispatch decorators left out: they route a call to the workers; every other
    decorator kept)."""
    from _support.framework_code import _methods_from_source
    return _methods_from_source(VD.provenance(FW, tag).path(repo_path), cls, names, namespace,
                                keep=lambda d: not _is_register(d))


@functools.lru_cache(maxsize=None)
def roll() -> types.SimpleNamespace:
    """The vendored modules and compiled methods (see the module docstring), loaded once."""
    import numpy as np
    import torch
    from torch.distributed.tensor import DTensor
    from torch.nn.utils import clip_grad_norm_
    from tqdm import tqdm

    saved_bytecode = sys.dont_write_bytecode
    sys.dont_write_bytecode = True           # no __pycache__ under the vendored src/ (test_vendored lists it)
    try:
        base = {"roll.platforms": VD.stand_in("roll.platforms", current_platform=CPU),
                "roll.utils.logging": VD.stand_in("roll.utils.logging", get_logger=_get_logger)}
        constants = VD.load(FW, "roll/utils/constants.py")
        VD.load(FW, "roll/utils/kl_controller.py")
        F = VD.load(FW, FILES["functionals"], stand_ins={
            **base, "roll.configs": VD.stand_in("roll.configs"),
            "roll.configs.base_config": VD.stand_in("roll.configs.base_config", PPOConfig=object),
            "roll.pipeline.rlvr.rlvr_config": VD.stand_in("roll.pipeline.rlvr.rlvr_config", RLVRConfig=object)})
        no_timer = VD.stand_in("codetiming", Timer=_UnusedTimer)
        remote = {**base, "ray": VD.stand_in("ray", ObjectRef=type("ObjectRef", (), {})), "codetiming": no_timer,
                  "roll.distributed.scheduler.transfer_backend":
                      VD.stand_in("roll.distributed.scheduler.transfer_backend")}
        VD.load(FW, "roll/distributed/scheduler/remote_protocol.py", stand_ins=remote)
        protocol = VD.load(FW, FILES["protocol"], stand_ins=remote)
        metrics = VD.load(FW, FILES["metrics"], stand_ins={**base, "codetiming": no_timer})
        tracking = VD.load(FW, FILES["tracking"], stand_ins=base)
    finally:
        sys.dont_write_bytecode = saved_bytecode
    DataProto = protocol.DataProto
    logger = _get_logger()

    @contextlib.contextmanager
    def state_offload_manger(strategy, metrics, metric_infix, is_offload_states=True, load_kwargs={}):  # noqa: B006
        yield

    worker_ns: dict[str, Any] = {
        "torch": torch, "tqdm": tqdm, "DataProto": DataProto, "current_platform": CPU,
        "state_offload_manger": state_offload_manger, "reduce_metrics": F.reduce_metrics,
        "append_to_dict": F.append_to_dict, "flatten_sum": F.flatten_sum,
        "make_mini_batch_iter_for_dynamic_batching": _Unused("make_mini_batch_iter_for_dynamic_batching"),
        "OffloadStateType": types.SimpleNamespace(model_params="model_params", other_params="other_params"),
        "Dict": Dict, "Optional": Optional, "List": List,
    }
    worker = methods(FILES["worker"], "ActorWorker", ["train_step", "get_old_log_probs_with_cache"], worker_ns)
    actor_ns: dict[str, Any] = {
        "torch": torch, "np": np, "DataProto": DataProto, "masked_mean": F.masked_mean, "agg_loss": F.agg_loss,
        "compute_approx_kl": F.compute_approx_kl,
        "compute_train_infer_correction": _Unused("compute_train_infer_correction"),
    }
    actor = methods(FILES["actor"], "ActorWorker", ["loss_func", "compute_sample_weights"], actor_ns)
    fsdp_ns: dict[str, Any] = {
        "torch": torch, "contextlib": contextlib, "defaultdict": __import__("collections").defaultdict,
        "DataProto": DataProto, "current_platform": CPU, "logger": logger, "dist": SimDist(),
        "clip_grad_norm_": clip_grad_norm_, "DTensor": DTensor, "append_to_dict": F.append_to_dict,
        "log_probs_from_logits": F.log_probs_from_logits, "Callable": Callable, "Tuple": Tuple, "Dict": Dict,
        "Optional": Optional,
    }
    fsdp = methods(FILES["fsdp2"], "FSDP2TrainStrategy",
                   ["train_step", "_clip_grad_norm", "_grad_accumulation_context", "_requires_grad_sync_context"],
                   fsdp_ns)
    fsdp.update(methods(FILES["fsdp2"], "FSDP2InferStrategy", ["op_compute_log_probs"], fsdp_ns))
    fsdp.update(methods(FILES["fsdp2"], "FSDP2StrategyBase", ["get_data_input"], fsdp_ns))
    strat_ns: dict[str, Any] = {"torch": torch, "dist": SimDist(), "IGNORE_INDEX": constants.IGNORE_INDEX,
                                "DataProto": DataProto}
    fsdp.update(methods(FILES["strategy"], "InferenceStrategy",
                        ["_get_batch_num_tokens", "_get_global_valid_samples"], strat_ns))
    return types.SimpleNamespace(F=F, DataProto=DataProto, MetricsManager=metrics.MetricsManager,
                                 strip_tags=tracking._strip_metric_tag, worker=worker, actor=actor, strategy=fsdp,
                                 release=VD.release(FW), files=FILES)


# ------------------------------------------------------------------------------------------------ configuration
#: PPOConfig / RLVRConfig defaults the code under test reads (roll/configs/base_config.py@v0.3.0,
#: roll/pipeline/rlvr/rlvr_config.py@v0.3.0)
PIPELINE_DEFAULTS = {
    "ppo_epochs": 1,                          # base_config.py:510
    "max_grad_norm": 1.0,                     # base_config.py:511
    "pg_clip": 0.2,                           # base_config.py:515
    "use_pg_clip_range": False,               # base_config.py:516
    "use_kl_loss": False,                     # base_config.py:568
    "kl_loss_coef": 0.0,                      # base_config.py:569
    "entropy_loss_coef": 0.0,                 # base_config.py:570
    "loss_agg_mode": "seq-mean-token-mean",   # base_config.py:571-572
    "dual_clip_loss": False,                  # base_config.py:574
    "enable_old_logprobs_recompute": True,    # base_config.py:578, set by set_old_logprobs_status (811-815)
    "seed": 42,                               # base_config.py:103 (BaseConfig.seed)
    "difficulty_loss_weight": False,          # rlvr_config.py:119
    "length_loss_weight": False,              # rlvr_config.py:120
    "rl_loss_coef": 1.0,                      # rlvr_config.py:137-139
    "importance_sampling": "token",           # rlvr_config.py:141-143
    "max_len_mask": False,                    # rlvr_config.py:147
    "difficulty_mask": False,                 # rlvr_config.py:149
    "error_max_len_clip": False,              # rlvr_config.py:154
}


def pipeline_config(**overrides: Any) -> types.SimpleNamespace:
    unknown = set(overrides) - set(PIPELINE_DEFAULTS)
    assert not unknown, unknown
    cfg = types.SimpleNamespace(**{**PIPELINE_DEFAULTS, **overrides})
    cfg.train_infer_correction = types.SimpleNamespace(is_weight=types.SimpleNamespace(enabled=False), filters=[])
    return cfg


def worker_config(per_device_train_batch_size: int, gradient_accumulation_steps: int) -> types.SimpleNamespace:
    """WorkerConfig (roll/configs/worker_config.py) of actor_train: the fields train_step reads."""
    return types.SimpleNamespace(
        name="actor_train", use_dynamic_batching_in_train=False, use_sequence_packing=False, apply_loss_scale=True,
        training_args=types.SimpleNamespace(per_device_train_batch_size=per_device_train_batch_size,
                                            gradient_accumulation_steps=gradient_accumulation_steps))


# ------------------------------------------------------------------------------------------------ one rank
class TinyLM:
    """A real torch language model: each token's embedding is its next-token logits (small initial scale, so the
    log-probs are near log(1/V) and the PPO ratios near 1)."""

    def __new__(cls, vocab: int, seed: int):
        import torch
        g = torch.Generator().manual_seed(seed)
        emb = torch.nn.Embedding(vocab, vocab)
        with torch.no_grad():
            emb.weight.copy_(0.3 * torch.randn(vocab, vocab, generator=g))
        return emb


def lr_lambda(step: int) -> float:
    """The scheduler's schedule: a linear decay, so each optimizer step leaves another lr."""
    return 1.0 - 0.1 * step


class ActorRank:
    """One data-parallel rank of actor_train: a worker object holding ROLL's compiled ActorWorker methods and an
    FSDP2TrainStrategy object holding the compiled strategy methods, around a TinyLM. ``calls`` records, per
    ``loss_func`` call (each micro-batch, in order), the batch the strategy handed it and the log-probs
    ``op_compute_log_probs`` computed for it; ``grad_norms`` what ``_clip_grad_norm`` returned; ``lrs`` the lr after
    each scheduler step."""

    def __init__(self, rank: int, dp_size: int, cfg: types.SimpleNamespace, wcfg: types.SimpleNamespace,
                 vocab: int, lr: float = 0.05):
        import logging

        import torch
        r = roll()
        self.calls: list[dict[str, Any]] = []
        self.grad_norms: list[float] = []
        self.lrs: list[float] = []
        model = TinyLM(vocab, seed=1234)
        optimizer = torch.optim.SGD(model.parameters(), lr=lr)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda)
        rank_info = types.SimpleNamespace(cp_size=1, dp_size=dp_size, dp_rank=rank)
        worker = types.SimpleNamespace(pipeline_config=cfg, worker_config=wcfg, rank_info=rank_info)
        strategy = types.SimpleNamespace(worker=worker, worker_config=wcfg, model=model, optimizer=optimizer,
                                         scheduler=scheduler, scaler=None, param_dtype=torch.bfloat16,
                                         reduce_scatter_during_grad_accumulation=False, cpu_offload_enabled=False,
                                         ep_enabled=False)
        for name, fn in r.strategy.items():
            setattr(strategy, name, types.MethodType(fn, strategy))
        strategy._fsdp2_forward = lambda input_ids, attention_mask, position_ids, forward_args: model(input_ids)
        real_logp, real_clip, real_step = strategy.op_compute_log_probs, strategy._clip_grad_norm, scheduler.step

        def op_compute_log_probs(logits, input_ids, attention_mask):
            out = real_logp(logits=logits, input_ids=input_ids, attention_mask=attention_mask)
            self.calls[-1]["log_probs"] = out.detach().clone()
            return out

        def clip(max_norm):
            gn = real_clip(max_norm)
            self.grad_norms.append(float(gn))
            return gn

        def sched_step(*a, **k):
            real_step(*a, **k)
            self.lrs.append(float(scheduler.get_last_lr()[0]))

        strategy.op_compute_log_probs, strategy._clip_grad_norm, scheduler.step = op_compute_log_probs, clip, \
            sched_step
        worker.strategy = strategy
        worker.logger = logging.getLogger("roll.proofs")
        worker.worker_name, worker.cluster_name, worker._logprobs_cache = f"actor_train-{rank}", "actor_train", {}
        for name, fn in {**r.worker, **r.actor}.items():
            setattr(worker, name, types.MethodType(fn, worker))
        real_loss = worker.loss_func

        def loss_func(data, output_tensor):
            self.calls.append({"data": data})
            loss, metrics = real_loss(data, output_tensor)
            self.calls[-1]["metrics"] = metrics
            return loss, metrics

        worker.loss_func = loss_func
        self.worker, self.strategy = worker, strategy

    def train_step(self, data: Any) -> Any:
        return self.worker.train_step(data)


def pipeline_reduce(outputs: list[Any]) -> dict[str, Any]:
    """What RLVRPipeline.run does with the ranks' train_step outputs, by ROLL's own code: ``DataProto.concat`` (what
    ``materialize_concat`` does after ray.get, protocol.py:1115-1118; its ``metrics`` merge joins the ranks' values),
    ``MetricsManager.add_reduced_metrics`` (rlvr_pipeline.py@v0.3.0:797), ``get_metrics`` (815) and the trackers'
    ``strip_at_tag_in_log`` (tracking.py:40-52, on ``self.tracker.log``, 822)."""
    r = roll()
    merged = r.DataProto.concat(outputs)
    mgr = r.MetricsManager()
    mgr.add_reduced_metrics(merged.meta_info.pop("metrics", {}))
    return r.strip_tags(mgr.get_metrics())


def finite(x: float) -> bool:
    return math.isfinite(float(x))


# ------------------------------------------------------------------------------------------------ not provable here
ENTRY_WHY: dict[tuple[str, str, str | None], str] = {
    ("roll", "time/step_total", "rlvr"): (
        "wall-clock timer: codetiming Timer('step_total').last of the previous step (rlvr_pipeline.py@v0.3.0:490, "
        "842), logged as pre_step_total_time at the top of the next step (496); no batch quantity to fingerprint, "
        "and the loop that carries it over runs only with ROLL's Ray clusters"),
    ("roll", "time/step_generate", "rlvr"): (
        "wall-clock timer: codetiming Timer('step_generate').last around the rollout (rlvr_pipeline.py@v0.3.0:539, "
        "566); no batch quantity to fingerprint"),
    ("roll", "time/{stage}", "rlvr"): (
        "wall-clock timers: codetiming Timer(...).last of each stage (step_train, old_log_probs, "
        "ref_log_probs_values, step_model_update ...: rlvr_pipeline.py@v0.3.0:514-803); no batch quantity to "
        "fingerprint"),
}
