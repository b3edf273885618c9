"""ROLL v0.1.3's own actor metric code for the fingerprint proofs of the RLVR entries of v0.1.0..v0.1.3
(tests/frameworks/test_proof_roll_old.py), from the tag's files vendored under tests/data/frameworks/roll/v0.1.3/
(tests/_support/vendored.py, a further tag: its ``roll.*`` modules are kept apart from the primary v0.3.0 ones).
Nothing here computes a metric. ``CPU``, ``_Unused`` and the logger are tests/_support/proofs_roll.py's (imported).

What v0.1.3 does differently from v0.2.0 on (the point of these proofs): the actor's metrics carry no ``@sum`` tag
and each micro-batch's value is ``agg_loss`` over that micro-batch alone (no global token / sample count:
functionals.py@v0.1.3 agg_loss has no ``batch_num_tokens`` / ``global_valid_samples``); DeepSpeedTrainStrategy's
``train_step`` appends one value per micro-batch, ``ActorWorker.train_step`` appends each backward batch's lists,
``DataProto.concat`` joins the ranks' lists and ``MetricsManager.add_reduced_metrics`` -> ``reduce_metrics`` takes
``np.mean`` of them all (the pipeline's ``actor_mean`` profile).

Loaded whole (``vendored.load(..., tag="v0.1.3")``, parents as empty packages): ``roll/utils/constants.py``,
``roll/utils/kl_controller.py``; ``roll/utils/functionals.py`` (``agg_loss``, ``compute_approx_kl``,
``masked_mean``, ``log_probs_from_logits``, ``append_to_dict``, ``reduce_metrics``, ``get_sample_level_mask``;
stand-ins ``roll.configs.base_config`` / ``roll.pipeline.rlvr.rlvr_config``, imported for annotations only,
``roll.platforms`` (:data:`proofs_roll.CPU`) and ``roll.utils.logging``); ``roll/distributed/scheduler/protocol.py``
(``DataProto``: ``make_iterator``, ``chunk``, ``concat``; stand-in ``ray``, imported for ``ray.get`` of remote
batches, none here); ``roll/utils/metrics/metrics_manager.py`` (``MetricsManager.add_reduced_metrics``; stand-ins
``ray.util.timer`` and ``codetiming``, the timer metrics only).

Compiled from the files' own text (their modules import Ray, DeepSpeed, transformers and the model providers),
Ray's ``@register`` decorators left out: ``roll/pipeline/base_worker.py`` ``ActorWorker.train_step`` and
``get_old_log_probs_with_cache``; ``roll/pipeline/rlvr/actor_worker.py`` ``ActorWorker.loss_func`` and
``compute_sample_weights``; ``roll/distributed/strategy/deepspeed_strategy.py`` ``DeepSpeedTrainStrategy.train_step``
(the micro-batch loop: forward, ``loss_func``, ``append_to_dict``, backward and the engine's step) and
``DeepSpeedInferStrategy.get_data_input``; ``roll/distributed/strategy/strategy.py``
``InferenceStrategy.op_compute_log_probs``.

Stand-ins (none computes a metric): the DeepSpeed engine (``self.model``) is :class:`Engine`, a real torch model
(proofs_roll's ``TinyLM``) whose ``backward`` is ``loss.backward()``, ``step`` the optimizer and scheduler step with
``torch.nn.utils.clip_grad_norm_`` at each gradient-accumulation boundary (what DeepSpeed's engine does; its
1/GA loss scaling touches only the gradients), ``get_global_grad_norm`` the last norm; ``load_states`` /
``offload_states`` do nothing; ``state_offload_manger`` only yields; ``make_mini_batch_iter_for_dynamic_batching``
unused (dynamic batching off); the pipeline and worker configuration are SimpleNamespaces with the dataclass
defaults of roll/configs/base_config.py@v0.1.3 and roll/pipeline/rlvr/rlvr_config.py@v0.1.3 (cited per field).
"""
from __future__ import annotations

import contextlib
import functools
import types
from typing import Any, Callable, Dict, List, Optional, Tuple

from _support import proofs_roll as R
from _support import vendored as VD

FW = "roll"
TAG = "v0.1.3"
RELEASE = VD.release(FW, TAG)
S = VD.stand_in


def methods(repo_path: str, cls: str, names: list[str], namespace: dict[str, Any]) -> dict[str, Any]:
    """``cls.<name>`` of the tag's file compiled from its own text (``@register`` left out: proofs_roll.methods)."""
    return R.methods(repo_path, cls, names, namespace, tag=TAG)


@functools.lru_cache(maxsize=None)
def roll() -> types.SimpleNamespace:
    import numpy as np
    import torch
    from tqdm import tqdm

    base = {"roll.platforms": S("roll.platforms", current_platform=R.CPU),
            "roll.utils.logging": S("roll.utils.logging", get_logger=R._get_logger)}
    VD.load(FW, "roll/utils/constants.py", tag=TAG)
    VD.load(FW, "roll/utils/kl_controller.py", tag=TAG)
    F = VD.load(FW, "roll/utils/functionals.py", tag=TAG, stand_ins={
        **base, "roll.configs": S("roll.configs"),
        "roll.configs.base_config": S("roll.configs.base_config", PPOConfig=object),
        "roll.pipeline.rlvr.rlvr_config": S("roll.pipeline.rlvr.rlvr_config", RLVRConfig=object)})
    protocol = VD.load(FW, "roll/distributed/scheduler/protocol.py", tag=TAG, stand_ins={
        **base, "ray": S("ray", ObjectRef=type("ObjectRef", (), {}))})
    metrics = VD.load(FW, "roll/utils/metrics/metrics_manager.py", tag=TAG, stand_ins={
        **base, "ray": S("ray", __path__=[]), "ray.util": S("ray.util", __path__=[]),
        "ray.util.timer": S("ray.util.timer", _Timer=object), "codetiming": S("codetiming", Timer=object)})
    DataProto = protocol.DataProto

    @contextlib.contextmanager
    def state_offload_manger(strategy, metrics, metric_infix, is_offload_states=True, load_kwargs={}):  # noqa: B006
        yield

    worker_ns: dict[str, Any] = {
        "torch": torch, "tqdm": tqdm, "DataProto": DataProto, "current_platform": R.CPU,
        "state_offload_manger": state_offload_manger, "append_to_dict": F.append_to_dict,
        "make_mini_batch_iter_for_dynamic_batching": R._Unused("make_mini_batch_iter_for_dynamic_batching"),
        "OffloadStateType": types.SimpleNamespace(model_params="model_params", other_params="other_params",
                                                  optimizer_states="optimizer_states"),
        "Dict": Dict, "Optional": Optional, "List": List,
    }
    worker = methods("roll/pipeline/base_worker.py", "ActorWorker", ["train_step", "get_old_log_probs_with_cache"],
                     worker_ns)
    actor_ns: dict[str, Any] = {"torch": torch, "np": np, "DataProto": DataProto, "masked_mean": F.masked_mean,
                                "agg_loss": F.agg_loss, "compute_approx_kl": F.compute_approx_kl}
    actor = methods("roll/pipeline/rlvr/actor_worker.py", "ActorWorker", ["loss_func", "compute_sample_weights"],
                    actor_ns)
    ds_ns: dict[str, Any] = {"torch": torch, "defaultdict": __import__("collections").defaultdict,
                             "DataProto": DataProto, "OffloadStateType": worker_ns["OffloadStateType"],
                             "append_to_dict": F.append_to_dict,
                             "Callable": Callable, "Tuple": Tuple, "Dict": Dict,
                             "get_ulysses_group": R._Unused("get_ulysses_group"), "dist": R._Unused("dist")}
    strategy = methods("roll/distributed/strategy/deepspeed_strategy.py", "DeepSpeedTrainStrategy", ["train_step"],
                       ds_ns)
    strategy.update(methods("roll/distributed/strategy/deepspeed_strategy.py", "DeepSpeedInferStrategy",
                            ["get_data_input"], ds_ns))
    strategy.update(methods("roll/distributed/strategy/strategy.py", "InferenceStrategy", ["op_compute_log_probs"],
                            {"torch": torch, "log_probs_from_logits": F.log_probs_from_logits}))
    return types.SimpleNamespace(F=F, DataProto=DataProto, MetricsManager=metrics.MetricsManager, worker=worker,
                                 actor=actor, strategy=strategy)


#: PPOConfig / RLVRConfig defaults the code under test reads (roll/configs/base_config.py@v0.1.3,
#: roll/pipeline/rlvr/rlvr_config.py@v0.1.3)
PIPELINE_DEFAULTS = {
    "ppo_epochs": 1,                                   # base_config.py:333
    "pg_clip": 0.2,                                    # base_config.py:338
    "use_pg_clip_range": False,                        # base_config.py:339
    "use_kl_loss": False,                              # base_config.py:391
    "kl_loss_coef": 0.0,                               # base_config.py:392
    "entropy_loss_coef": 0.0,                          # base_config.py:393
    "loss_agg_mode": "seq-mean-token-mean",            # base_config.py:394-395
    "dual_clip_loss": False,                           # base_config.py:397
    "enable_old_logprobs_recompute": True,             # base_config.py:401 (set True whenever a rank steps twice)
    "seed": 42,                                        # base_config.py:47-48
    "difficulty_loss_weight": False,                   # rlvr_config.py:127
    "length_loss_weight": False,                       # rlvr_config.py:128
    "postive_loss_coef": 0.0,                          # rlvr_config.py:129-130
    "use_topr_neg_loss_coef": 0.0,                     # rlvr_config.py:133-134
    "rl_loss_coef": 1.0,                               # rlvr_config.py:145-146
    "importance_sampling": "token",                    # rlvr_config.py:149-150
    "use_rollout_importance_sampling_ratio": False,    # rlvr_config.py:152
    "rollout_importance_sampling_ratio_upper_bound": 1.2,  # rlvr_config.py:153
    "train_infer_ratio_mask": False,                   # rlvr_config.py:155
    "train_infer_diff_mask": False,                    # rlvr_config.py:158
    "train_infer_ratio_seq_mask": False,               # rlvr_config.py:162
    "train_infer_diff_seq_mask": False,                # rlvr_config.py:165
    "max_len_mask": False,                             # rlvr_config.py:171
    "difficulty_mask": False,                          # rlvr_config.py:173
    "difficulty_low_threshold": 0.0,                   # rlvr_config.py:176
    "difficulty_high_threshold": 1.0,                  # rlvr_config.py:177
    "error_max_len_clip": False,                       # rlvr_config.py:178
    "error_max_len_threshold": 9999999999,             # rlvr_config.py:179
}


def pipeline_config(**overrides: Any) -> types.SimpleNamespace:
    unknown = set(overrides) - set(PIPELINE_DEFAULTS)
    assert not unknown, unknown
    return types.SimpleNamespace(**{**PIPELINE_DEFAULTS, **overrides})


def worker_config(per_device_train_batch_size: int, gradient_accumulation_steps: int) -> types.SimpleNamespace:
    return types.SimpleNamespace(
        name="actor_train", use_dynamic_batching_in_train=False,
        training_args=types.SimpleNamespace(per_device_train_batch_size=per_device_train_batch_size,
                                            gradient_accumulation_steps=gradient_accumulation_steps))


class Engine:
    """DeepSpeed's engine as DeepSpeedTrainStrategy.train_step calls it (see the module docstring)."""

    def __init__(self, model: Any, optimizer: Any, scheduler: Any, ga: int, max_norm: float = 1.0):
        self.module, self.optimizer, self.scheduler, self.ga, self.max_norm = model, optimizer, scheduler, ga, max_norm
        self.micro, self.norm = 0, 0.0

    def train(self) -> None:
        self.module.train()

    def __call__(self, input_ids: Any, attention_mask: Any = None, position_ids: Any = None, **_: Any) -> Any:
        return types.SimpleNamespace(logits=self.module(input_ids))

    def backward(self, loss: Any) -> None:
        loss.backward()

    def is_gradient_accumulation_boundary(self) -> bool:
        return (self.micro + 1) % self.ga == 0

    def step(self) -> None:
        import torch
        if self.is_gradient_accumulation_boundary():
            self.norm = float(torch.nn.utils.clip_grad_norm_(self.module.parameters(), self.max_norm))
            self.optimizer.step()
            self.scheduler.step()
            self.optimizer.zero_grad()
        self.micro += 1

    def get_global_grad_norm(self) -> Any:
        import torch
        return torch.tensor(self.norm)


class ActorRank:
    """One data-parallel rank of actor_train; ``calls`` records each ``loss_func`` call (its batch, and the log-probs
    ``op_compute_log_probs`` returned for it)."""

    def __init__(self, rank: int, dp_size: int, cfg: types.SimpleNamespace, wcfg: types.SimpleNamespace,
                 vocab: int, lr: float = 0.05):
        import logging

        import torch
        r = roll()
        self.calls: list[dict[str, Any]] = []
        model = R.TinyLM(vocab, seed=1234)
        optimizer = torch.optim.SGD(model.parameters(), lr=lr)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, R.lr_lambda)
        rank_info = types.SimpleNamespace(cp_size=1, dp_size=dp_size, dp_rank=rank)
        worker = types.SimpleNamespace(pipeline_config=cfg, worker_config=wcfg, rank_info=rank_info)
        engine = Engine(model, optimizer, scheduler, wcfg.training_args.gradient_accumulation_steps)
        strategy = types.SimpleNamespace(worker=worker, worker_config=wcfg, model=engine, scheduler=scheduler,
                                         load_states=lambda **k: None, offload_states=lambda **k: None)
        for name, fn in r.strategy.items():
            setattr(strategy, name, types.MethodType(fn, strategy))
        real_logp = strategy.op_compute_log_probs

        def op_compute_log_probs(logits, input_ids, attention_mask):
            out = real_logp(logits=logits, input_ids=input_ids, attention_mask=attention_mask)
            self.calls[-1]["log_probs"] = out.detach().clone()
            return out

        strategy.op_compute_log_probs = op_compute_log_probs
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
        self.worker = worker

    def train_step(self, data: Any) -> Any:
        return self.worker.train_step(data)


def pipeline_reduce(outputs: list[Any]) -> dict[str, Any]:
    """What RLVRPipeline.run does with the ranks' train_step outputs, by ROLL's own code: ``DataProto.concat`` (what
    ``materialize_concat`` does after ray.get; its ``metrics`` merge joins the ranks' lists) and
    ``MetricsManager.add_reduced_metrics`` (rlvr_pipeline.py@v0.1.3:714-717), ``get_metrics``."""
    r = roll()
    merged = r.DataProto.concat(outputs)
    mgr = r.MetricsManager()
    mgr.add_reduced_metrics(merged.meta_info.pop("metrics", {}))
    return mgr.get_metrics()


#: (framework, key, trainer) -> why its entry of these releases is not proven here
ENTRY_WHY: dict[tuple[str, str, str | None], str] = {}
