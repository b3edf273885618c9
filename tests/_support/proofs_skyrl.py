"""SkyRL's own metric code for the fingerprint proofs (tests/frameworks/test_proof_skyrl.py), on a CPU machine.

SkyRL publishes no wheel this machine can install (skyrl 0.4.0 needs Python 3.12 and the GPU stack), so the files
that compute and reduce its logged metrics are vendored verbatim from the git tag ``skyrl-v0.3.0`` (the skyrl
package 0.3.0, the newest release of mappings/skyrl.yaml that has a tag: 0.4.0 exists only as a wheel) under
tests/data/frameworks/skyrl/ (tests/_support/vendored.py) and run from there. What is loaded, and how:

Whole files (``vendored.load``, under empty parent packages):

* ``skyrl/backends/skyrl_train/utils/torch_utils.py`` (``masked_mean``, ``safe_exp_delta``);
* ``skyrl/backends/skyrl_train/utils/off_policy_correction_utils.py`` (``apply_off_policy_correction``);
* ``skyrl/backends/skyrl_train/utils/ppo_utils.py`` (``ppo_policy_loss``, ``reduce_loss``, ``compute_approx_kl``,
  ``apply_loss_reduction_to_advantages_minibatch``, ``PolicyLossRegistry``) with the real ``ray`` (the registry
  asks ``ray.is_initialized()``: it is not, so the local registry answers);
* ``skyrl/backends/skyrl_train/training_batch.py``, ``skyrl/train/dataset/replay_buffer.py`` (``Experience``),
  ``skyrl/train/dataset/bin_packing.py``, ``skyrl/train/dataset/preprocess.py`` (the mini-batch and prompt
  boundaries), ``skyrl/train/generators/base.py`` (``MetricsOutput``);
* ``skyrl/backends/skyrl_train/distributed/strategy.py`` (``DistributedStrategy.all_reduce``: the real
  mean/min/max/sum over the data-parallel ranks, on the simulated group :class:`SkyDist`);
* ``skyrl/backends/skyrl_train/distributed/dispatch.py`` (``MeshDispatch.stage_chunks``, ``PassThroughDispatch``,
  ``DispatchRegistry``, ``WorkerOutput.cat``, ``MeshRank``, ``ActorInfo``);
* ``skyrl/backends/skyrl_train/workers/worker_utils.py`` (``reduce_metrics``, ``all_reduce_metrics``, the
  micro-batch iterators).

Functions compiled from their file's own text (the file imports what a CPU machine lacks or what would start a
cluster), with the module-level names they use bound to the loaded pieces:

* ``skyrl/backends/skyrl_train/workers/worker.py``: ``PolicyWorkerBase.forward_backward``,
  ``_forward_backward_micro``, ``optim_step`` and ``PPORayActorGroup.async_run_ray_method`` (the file imports ray
  actors, vLLM-side weight sync, CUDA ctypes, the Ulysses patches);
* ``skyrl/backends/skyrl_train/workers/worker_dispatch.py``: ``WorkerDispatch.stage_data``,
  ``forward_backward_from_staged``, ``optim_step``;
* ``skyrl/backends/skyrl_train/distributed/fsdp_strategy.py``: ``FSDPStrategy.optimizer_step`` (the file imports
  FSDP2 and the model wrappers; ``FSDPModule`` is bound to None and ``HFModelWrapper`` to a class nothing is an
  instance of, so the plain ``torch.nn.utils.clip_grad_norm_`` branch of that method runs);
* ``skyrl/train/trainer.py``: ``RayPPOTrainer._execute_training_step``, ``_normalize_advantages``,
  ``train_critic_and_policy``, ``postprocess_generator_output``, ``apply_reward_kl_penalty`` and, from ``train``,
  the statements that set ``trainer/tokens_per_second_per_gpu``, ``trainer/epoch``/``trainer/global_step`` and the
  ``log_payload`` handed to the tracker (:func:`train_blocks`);
* ``skyrl/train/utils/utils.py``: ``Timer``; ``skyrl/train/utils/trainer_utils.py``:
  ``finalize_minibatch_rollout_logprob_diff_std``, ``calculate_per_dataset_metrics``, ``sanitize_data_source``;
  ``skyrl/train/evaluate.py``: the eval-metric statements of ``evaluate`` (:func:`eval_block`; the file imports
  the data loader, the inference engines and the trajectory logger); ``skyrl/train/generators/utils.py``:
  ``get_metrics_from_generator_output``, ``get_rollout_metrics``, ``compute_turn_token_counts`` (the file imports
  skyrl_gym); ``skyrl/train/config/config.py``: ``AlgorithmConfig`` and the dataclasses it nests (the file imports
  skyrl_gym's environment configs), whose defaults are the run's config.

Stand-ins, and why each:

* ``jaxtyping`` (not installed): ``Float``/``Integer`` appear only in annotations; a subscriptable placeholder;
* ``loguru`` (not installed): the logger prints; a logger that prints nothing;
* ``skyrl.backends.skyrl_train.utils.io`` (checkpoint file IO) and ``skyrl.utils.tok`` (VLM processor lookup),
  imported by strategy.py for checkpoints and tokenizers, which nothing here saves or loads;
* ``skyrl.backends.skyrl_train.inference_servers.base`` (``ConversationType``, an annotation of base.py);
* ``ray`` for dispatch.py and worker_dispatch.py only (:class:`SimRay`): ``ray.put`` is the object store, which
  the simulated workers (threads of this process) do not need, so a reference is the object itself;
  ``.remote`` (:class:`SimActor`) runs the worker's method on its rank's thread and ``ray.get`` waits for it;
* ``torch.cuda.current_device`` answers ``"cpu"`` while a step runs (:func:`on_cpu`): the worker and
  ``DistributedStrategy.all_reduce`` move tensors to the current CUDA device, which is the CPU here;
* the worker's and trainer's config (``TrainerConfig``/``SkyRLTrainConfig``) is a namespace of the fields the code
  under test reads, their defaults cited from config.py@skyrl-v0.3.0 (:func:`trainer_config`), with the real
  ``AlgorithmConfig`` inside: TrainerConfig nests every model, placement and backend config;
* the model (:class:`TinyPolicy`), optimizer (``torch.optim.SGD``) and scheduler (``LambdaLR``) are the test's:
  the policy returns the per-token log-probs and entropies the test gave it (a straight-through parameter, so a
  gradient flows and the optimizer step does not change them), and records which sequences each micro-batch of each
  rank held; the strategy's ``backward`` is ``loss.backward()`` followed by the data-parallel gradient mean that
  FSDP performs in its backward (:class:`SimStrategy`); the worker's GPU offload, LoRA adapter and memory-snapshot
  hooks do nothing.

Nothing here computes a metric: the runners call SkyRL's functions the way its trainer does (cited per call).
"""
from __future__ import annotations

import ast
import concurrent.futures
import contextlib
import functools
import math
import sys
import types
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _support import framework_code as FC
from _support import vendored

FW = "skyrl"
WORLD = 2
FILES = {
    "worker": "skyrl/backends/skyrl_train/workers/worker.py",
    "worker_utils": "skyrl/backends/skyrl_train/workers/worker_utils.py",
    "worker_dispatch": "skyrl/backends/skyrl_train/workers/worker_dispatch.py",
    "dispatch": "skyrl/backends/skyrl_train/distributed/dispatch.py",
    "strategy": "skyrl/backends/skyrl_train/distributed/strategy.py",
    "fsdp_strategy": "skyrl/backends/skyrl_train/distributed/fsdp_strategy.py",
    "ppo_utils": "skyrl/backends/skyrl_train/utils/ppo_utils.py",
    "trainer": "skyrl/train/trainer.py",
    "trainer_utils": "skyrl/train/utils/trainer_utils.py",
    "utils": "skyrl/train/utils/utils.py",
    "gen_utils": "skyrl/train/generators/utils.py",
    "config": "skyrl/train/config/config.py",
    "evaluate": "skyrl/train/evaluate.py",
}


def release() -> str:
    return vendored.release(FW)


# ------------------------------------------------------------------------------------------------ stand-ins
class _Annotation:
    """jaxtyping's Float/Integer as annotations use them: ``Float[torch.Tensor, "batch seq"]``."""

    def __class_getitem__(cls, item: Any) -> type:
        return cls


class _Logger:
    def __getattr__(self, name: str) -> Any:
        return lambda *a, **k: self

    def opt(self, *a: Any, **k: Any) -> "_Logger":
        return self


LOGGER = _Logger()


class SimRay(types.SimpleNamespace):
    """``ray`` as dispatch.py and worker_dispatch.py call it: put (the object itself), get (wait for futures)."""

    ObjectRef = object

    @staticmethod
    def put(obj: Any) -> Any:
        return obj

    @staticmethod
    def get(refs: Any) -> Any:
        if isinstance(refs, list):
            return [r.result(timeout=120) if isinstance(r, concurrent.futures.Future) else r for r in refs]
        return refs.result(timeout=120) if isinstance(refs, concurrent.futures.Future) else refs


class SkyDist(FC.SimDist):
    """torch.distributed as strategy.py's all_reduce calls it (SUM, MIN, MAX on the simulated group)."""

    class ReduceOp:
        SUM, MAX, MIN = "sum", "max", "min"

    def all_reduce(self, t, op="sum", group=None) -> None:
        if op == "min":
            g, r = FC.current_rank()
            parts = g.exchange(r, t.detach().clone())
            t.copy_(functools.reduce(lambda a, b: a.minimum(b), parts))
            return
        super().all_reduce(t, op=op, group=group)


def _stand_ins() -> dict[str, types.ModuleType]:
    s = vendored.stand_in
    return {
        "jaxtyping": s("jaxtyping", Float=_Annotation, Integer=_Annotation),
        "loguru": s("loguru", logger=LOGGER),
        "skyrl.backends.skyrl_train.utils.io": s("skyrl.backends.skyrl_train.utils.io", io=None),
        "skyrl.utils.tok": s("skyrl.utils.tok", check_is_vlm=None, get_processor=None),
        "skyrl.backends.skyrl_train.inference_servers.base":
            s("skyrl.backends.skyrl_train.inference_servers.base", ConversationType=list),
    }


# ------------------------------------------------------------------------------------------------ compiling
def _path(repo_path: str) -> Path:
    return vendored.provenance(FW).path(repo_path)


@functools.lru_cache(maxsize=None)
def _tree(repo_path: str) -> ast.Module:
    path = _path(repo_path)
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _compile(repo_path: str, nodes: list[ast.stmt], namespace: dict[str, Any]) -> dict[str, Any]:
    code = compile(ast.fix_missing_locations(ast.Module(body=nodes, type_ignores=[])), str(_path(repo_path)), "exec")
    exec(code, namespace)                       # noqa: S102 - the vendored file's own code
    return namespace


def _class(repo_path: str, name: str) -> ast.ClassDef:
    return next(n for n in _tree(repo_path).body if isinstance(n, ast.ClassDef) and n.name == name)


def methods(repo_path: str, cls: str, names: list[str], namespace: dict[str, Any]) -> dict[str, Any]:
    """``cls.<name>`` of the vendored file, compiled from its text into ``namespace``."""
    body = _class(repo_path, cls).body
    wanted = [n for n in body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name in names]
    missing = set(names) - {n.name for n in wanted}
    if missing:
        raise ImportError(f"{repo_path}: {cls} has no {sorted(missing)}")
    _compile(repo_path, wanted, namespace)
    return {n: namespace[n] for n in names}


def top_level(repo_path: str, names: list[str], namespace: dict[str, Any]) -> dict[str, Any]:
    """Top-level functions and classes of the vendored file, compiled from its text into ``namespace``."""
    wanted = [n for n in _tree(repo_path).body
              if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name in names]
    missing = set(names) - {n.name for n in wanted}
    if missing:
        raise ImportError(f"{repo_path}: no {sorted(missing)}")
    _compile(repo_path, wanted, namespace)
    return {n: namespace[n] for n in names}


@contextlib.contextmanager
def _no_bytecode():
    """Loading a vendored file must not leave __pycache__ under src/ (tests/unit/test_vendored.py lists it)."""
    old = sys.dont_write_bytecode
    sys.dont_write_bytecode = True
    try:
        yield
    finally:
        sys.dont_write_bytecode = old


@contextlib.contextmanager
def on_cpu():
    """torch.cuda.current_device() is the CPU while SkyRL's code runs (see the module docstring); the worker's
    ``torch.autocast(device_type="cuda")`` (worker.py:879) disables itself on a CPU machine, with a warning that
    says so and is silenced here."""
    import warnings

    import torch
    old = torch.cuda.current_device
    torch.cuda.current_device = lambda: "cpu"
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="CUDA is not available or torch_xla is imported",
                                    category=UserWarning)
            yield
    finally:
        torch.cuda.current_device = old


# ------------------------------------------------------------------------------------------------ loading
CONFIG_CLASSES = ("BaseConfig", "KLCtrlConfig", "SAPOConfig", "DynamicSamplingConfig", "ClipCovConfig",
                  "KLCovConfig", "CISPOConfig", "DPPOConfig", "OffPolicyCorrectionConfig", "AlgorithmConfig")


@functools.lru_cache(maxsize=None)
def skyrl() -> types.SimpleNamespace:
    import abc
    import dataclasses
    import typing

    import numpy as np
    import omegaconf
    import torch

    load = functools.partial(vendored.load, FW)
    st = _stand_ins()
    with _no_bytecode():
        torch_utils = load("skyrl/backends/skyrl_train/utils/torch_utils.py", stand_ins=st)
        load("skyrl/backends/skyrl_train/utils/off_policy_correction_utils.py", stand_ins=st)
        # config.py imports skyrl_gym's environment configs: AlgorithmConfig and what it nests from its text
        cfg_ns: dict[str, Any] = {"dataclass": dataclasses.dataclass, "field": dataclasses.field, "ABC": abc.ABC,
                                  "DictConfig": omegaconf.DictConfig, "OmegaConf": omegaconf.OmegaConf,
                                  **{k: getattr(typing, k) for k in ("Any", "Dict", "List", "Optional", "Type",
                                                                      "TypeVar", "Union", "Annotated")}}
        config = top_level(FILES["config"], list(CONFIG_CLASSES), cfg_ns)
        config_mod = vendored.stand_in("skyrl.train.config", **config)
        ppo_utils = load(FILES["ppo_utils"], stand_ins={**st, "skyrl.train.config": config_mod})
        training_batch = load("skyrl/backends/skyrl_train/training_batch.py", stand_ins=st)
        replay_buffer = load("skyrl/train/dataset/replay_buffer.py", stand_ins=st)
        load("skyrl/train/dataset/bin_packing.py", stand_ins=st)
        preprocess = load("skyrl/train/dataset/preprocess.py", stand_ins=st)
        gen_base = load("skyrl/train/generators/base.py", stand_ins=st)
        strategy = load(FILES["strategy"], stand_ins=st)
        strategy.dist = SkyDist()                                    # the simulated data-parallel group
        ray = SimRay()
        dispatch = load(FILES["dispatch"], stand_ins={**st, "ray": ray, "ray.actor":
                                                      vendored.stand_in("ray.actor", ActorHandle=object)})
        worker_utils = load(FILES["worker_utils"], stand_ins=st)

    worker_ns: dict[str, Any] = {
        "torch": torch, "defaultdict": defaultdict, "OmegaConf": omegaconf.OmegaConf,
        "get_microbatch_iterator": worker_utils.get_microbatch_iterator,
        "BaseBatchIterator": worker_utils.BaseBatchIterator, "reduce_metrics": worker_utils.reduce_metrics,
        "all_reduce_metrics": worker_utils.all_reduce_metrics,
        "compute_minibatch_rollout_logprob_diff_metrics": worker_utils.compute_minibatch_rollout_logprob_diff_metrics,
        "WorkerOutput": dispatch.WorkerOutput, "PolicyLossRegistry": ppo_utils.PolicyLossRegistry,
        "compute_approx_kl": ppo_utils.compute_approx_kl, "masked_mean": torch_utils.masked_mean,
        "Experience": replay_buffer.Experience, "TrainingInputBatch": training_batch.TrainingInputBatch,
        "DispatchRegistry": dispatch.DispatchRegistry, "Dispatch": dispatch.Dispatch, "ObjectRef": object,
        **{k: getattr(typing, k) for k in ("Any", "Callable", "Dict", "List", "Optional")},
    }
    policy = methods(FILES["worker"], "PolicyWorkerBase", ["forward_backward", "_forward_backward_micro",
                                                           "optim_step"], dict(worker_ns))
    group = methods(FILES["worker"], "PPORayActorGroup", ["async_run_ray_method"], dict(worker_ns))
    wd = methods(FILES["worker_dispatch"], "WorkerDispatch", ["stage_data", "forward_backward_from_staged",
                                                              "optim_step"],
                 {**worker_ns, "ray": ray, "MeshDispatch": dispatch.MeshDispatch, "ObjectRef": object,
                  **{k: getattr(typing, k) for k in ("Tuple",)}})

    class HFModelWrapper:                     # nothing is one: optimizer_step's plain-module branch
        pass

    fsdp = methods(FILES["fsdp_strategy"], "FSDPStrategy", ["optimizer_step"],
                   {"torch": torch, "HFModelWrapper": HFModelWrapper, "FSDPModule": None, "logger": LOGGER,
                    "optim": torch.optim, "Optional": typing.Optional, "Float": _Annotation})

    import time
    timer_ns: dict[str, Any] = {"time": time, "logger": LOGGER}
    top_level(FILES["utils"], ["Timer"], timer_ns)
    tu = top_level(FILES["trainer_utils"], ["finalize_minibatch_rollout_logprob_diff_std"],
                   {"math": math, "Dict": typing.Dict,
                    **{k: getattr(worker_utils, k) for k in dir(worker_utils) if k.startswith("MINIBATCH_")}})
    gen_ns: dict[str, Any] = {"np": np, "torch": torch, "defaultdict": defaultdict,
                              "MetricsOutput": gen_base.MetricsOutput, "GeneratorOutput": gen_base.GeneratorOutput,
                              **{k: getattr(typing, k) for k in ("Any", "Dict", "List", "Optional", "Union")}}
    gen = top_level(FILES["gen_utils"], ["get_metrics_from_generator_output", "get_rollout_metrics",
                                         "compute_turn_token_counts"], gen_ns)
    tu.update(top_level(FILES["trainer_utils"], ["sanitize_data_source", "calculate_per_dataset_metrics"],
                        {**gen_ns, "get_metrics_from_generator_output": gen["get_metrics_from_generator_output"]}))
    trainer_ns: dict[str, Any] = {
        "torch": torch, "np": np, "defaultdict": defaultdict, "logger": LOGGER, "Timer": timer_ns["Timer"],
        "reduce_metrics": worker_utils.reduce_metrics, "masked_mean": torch_utils.masked_mean,
        "finalize_minibatch_rollout_logprob_diff_std": tu["finalize_minibatch_rollout_logprob_diff_std"],
        "apply_loss_reduction_to_advantages_minibatch": ppo_utils.apply_loss_reduction_to_advantages_minibatch,
        "compute_approx_kl": ppo_utils.compute_approx_kl, "ppo_utils": ppo_utils,
        "get_metrics_from_generator_output": gen["get_metrics_from_generator_output"],
        "TrainingInputBatch": training_batch.TrainingInputBatch, "GeneratorOutput": gen_base.GeneratorOutput,
        **{k: getattr(typing, k) for k in ("Any", "Dict", "List", "Optional", "Tuple", "Union")},
    }
    trainer = methods(FILES["trainer"], "RayPPOTrainer",
                      ["_execute_training_step", "_normalize_advantages", "train_critic_and_policy",
                       "postprocess_generator_output", "apply_reward_kl_penalty"], trainer_ns)
    return types.SimpleNamespace(
        torch_utils=torch_utils, ppo_utils=ppo_utils, config=config_mod, training_batch=training_batch,
        replay_buffer=replay_buffer, preprocess=preprocess, strategy=strategy, dispatch=dispatch,
        worker_utils=worker_utils, policy=policy, group=group, worker_dispatch=wd, fsdp=fsdp,
        Timer=timer_ns["Timer"], timer_ns=timer_ns, gen=gen, trainer=trainer, trainer_ns=trainer_ns,
        trainer_utils=tu, release=release())


# ------------------------------------------------------------------------------------------------ train() blocks
def _find(stmts: list[ast.stmt], pred) -> list[ast.stmt]:
    out = []
    for node in stmts:
        for sub in ast.walk(node):
            for name in ("body", "orelse"):
                body = getattr(sub, name, None)
                if isinstance(body, list):
                    out.extend(st for st in body if pred(st))
    return out


def _assigns(name: str):
    return lambda st: isinstance(st, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name
                                                         for t in st.targets)


@functools.lru_cache(maxsize=None)
def train_blocks() -> types.SimpleNamespace:
    """From ``RayPPOTrainer.train`` (trainer.py@skyrl-v0.3.0:497-527), compiled from the file's text: the throughput
    block (``train_time = ...`` and the ``if`` after it), the ``trainer/epoch``/``trainer/global_step`` update and the
    ``log_payload = {...}`` handed to the tracker. Each runs with ``self``, ``training_input``, ``epoch`` and
    ``vllm_metrics`` given as names."""
    cls = _class(FILES["trainer"], "RayPPOTrainer")
    train = next(n for n in cls.body if isinstance(n, ast.AsyncFunctionDef) and n.name == "train")
    path = str(_path(FILES["trainer"]))

    def block(nodes: list[ast.stmt]) -> Any:
        return compile(ast.fix_missing_locations(ast.Module(body=nodes, type_ignores=[])), path, "exec")

    parents = [n for n in ast.walk(train) if isinstance(getattr(n, "body", None), list)]
    throughput = epoch = None
    for par in parents:
        for i, st in enumerate(par.body):
            if _assigns("train_time")(st) and i + 1 < len(par.body) and isinstance(par.body[i + 1], ast.If):
                throughput = block([st, par.body[i + 1]])
            if (isinstance(st, ast.Expr) and isinstance(st.value, ast.Call)
                    and "trainer/global_step" in ast.unparse(st)):
                epoch = block([st])
    (payload,) = _find([train], _assigns("log_payload"))
    assert throughput is not None and epoch is not None, "trainer.py: the train() blocks moved"
    return types.SimpleNamespace(throughput=throughput, epoch=epoch, payload=block([payload]))


@functools.lru_cache(maxsize=None)
def eval_block() -> Any:
    """From ``evaluate`` (evaluate.py@skyrl-v0.3.0:127-139), compiled from the file's text: ``eval_metrics =
    calculate_per_dataset_metrics(...)``, ``overall_metrics = get_metrics_from_generator_output(...)`` and the
    ``eval_metrics.update(...)`` of the pooled ``eval/all/*`` keys; it runs with ``concat_generator_outputs``,
    ``concat_uids``, ``concat_data_sources`` and ``cfg`` given as names (the generation before it is not run)."""
    fn = next(n for n in _tree(FILES["evaluate"]).body if isinstance(n, ast.AsyncFunctionDef) and n.name == "evaluate")
    body = fn.body
    i = next(k for k, st in enumerate(body) if _assigns("eval_metrics")(st))
    nodes = body[i:i + 3]
    assert _assigns("overall_metrics")(nodes[1]) and "eval/all/avg_score" in ast.unparse(nodes[2]), \
        "evaluate.py: the eval metrics block moved"
    return compile(ast.fix_missing_locations(ast.Module(body=nodes, type_ignores=[])), str(_path(FILES["evaluate"])),
                   "exec")


# ------------------------------------------------------------------------------------------------ the run
def trainer_config(algorithm: Any, *, train_batch_size: int, policy_mini_batch_size: int, micro: int,
                   epochs: int = 1, n_samples: int = 4) -> types.SimpleNamespace:
    """The fields of TrainerConfig / SkyRLTrainConfig the code under test reads (config.py@skyrl-v0.3.0:900-944:
    update_epochs_per_batch, train_batch_size, policy_mini_batch_size, micro_train_batch_size_per_gpu,
    max_tokens_per_microbatch -1 by default, i.e. sample-based micro-batches; GeneratorConfig (config.py:809):
    n_samples_per_prompt, step-wise trajectories and their merging off by default)."""
    trainer = types.SimpleNamespace(
        algorithm=algorithm, train_batch_size=train_batch_size, policy_mini_batch_size=policy_mini_batch_size,
        micro_train_batch_size_per_gpu=micro, update_epochs_per_batch=epochs, max_tokens_per_microbatch=-1)
    generator = types.SimpleNamespace(n_samples_per_prompt=n_samples, step_wise_trajectories=False,
                                      merge_stepwise_output=False)
    return types.SimpleNamespace(trainer=trainer, generator=generator)


def _tiny_policy_class():
    import torch

    class TinyPolicy(torch.nn.Module):
        """The policy as the worker calls it (``self.model(sequences, num_actions, ...)`` -> log-probs and an
        ``entropy`` over every position): the log-prob and entropy of each token id are the test's tables; a
        straight-through parameter carries the gradient without changing a value. Records, per call, the rows of
        the batch it was given (the first token of each row is the row's index + 1)."""

        def __init__(self, logp_table, entropy_table, calls: list):
            super().__init__()
            self.w = torch.nn.Parameter(torch.tensor(1.0))
            self.register_buffer("logp_table", logp_table)
            self.register_buffer("entropy_table", entropy_table)
            self.calls = calls

        def forward(self, sequences, num_actions, attention_mask=None, temperature=None, return_output=False,
                    compute_entropy=False, entropy_requires_grad=False, pixel_values=None, image_grid_thw=None):
            ids = sequences[:, -num_actions:]
            logp = self.logp_table[ids] + (self.w - self.w.detach()) * self.logp_table[ids]
            entropy = torch.zeros(sequences.shape, dtype=self.entropy_table.dtype)
            entropy[:, -num_actions - 1:-1] = self.entropy_table[ids]
            self.calls.append([int(r) - 1 for r in sequences[:, 0].tolist()])
            return logp, {"entropy": entropy}

    return TinyPolicy


@dataclass
class PolicyRun:
    metrics: dict[str, float]                   # what train_critic_and_policy put in all_metrics (policy/*)
    micro_rows: list[list[list[list[int]]]]     # [mini-batch][rank][micro-batch] -> the batch rows it held
    lrs: list[float]                            # the rate of each optimizer step's forward_backward (rank 0)
    grad_norms: list[list[float]]               # [rank] -> the norm each optimizer step returned
    timings: dict[str, float] = field(default_factory=dict)


def run_policy_step(batch: Any, cfg: types.SimpleNamespace, logp_table, entropy_table, *, world: int = WORLD,
                    lr: float = 1e-2, lr_decay: float = 0.5) -> PolicyRun:
    """One policy training step of SkyRL's code: ``RayPPOTrainer.train_critic_and_policy`` -> ``_execute_training_step``
    (trainer.py@skyrl-v0.3.0:1481-1553) -> ``WorkerDispatch.stage_data/forward_backward_from_staged/optim_step``
    (worker_dispatch.py:288-406) -> ``PolicyWorkerBase.forward_backward`` / ``optim_step`` (worker.py:758-1042) on
    ``world`` simulated ranks, each with its own TinyPolicy, SGD optimizer and LambdaLR scheduler (the rate times
    ``lr_decay`` per step)."""
    import torch
    S = skyrl()
    TinyPolicy = _tiny_policy_class()
    group = FC.Group(world)
    pool = [concurrent.futures.ThreadPoolExecutor(max_workers=1) for _ in range(world)]

    def on_rank(rank: int):
        FC._current.group, FC._current.rank = group, rank

    for r in range(world):
        pool[r].submit(on_rank, r).result()

    class SimStrategy(S.strategy.DistributedStrategy):
        optimizer_step = S.fsdp["optimizer_step"]

        def __init__(self):
            self.world_size = world
            self.max_norm = 1.0            # FSDPStrategy: optimizer_config.max_grad_norm, 1.0 (config.py:162)

        def backward(self, loss, model, optimizer, **kwargs):
            loss.backward()
            for prm in model.parameters():          # FSDP's data-parallel gradient mean
                if prm.grad is not None:
                    S.strategy.dist.all_reduce(prm.grad, op="sum")
                    prm.grad /= world

    SimStrategy.__abstractmethods__ = frozenset()

    class Policy:
        forward_backward = S.policy["forward_backward"]
        _forward_backward_micro = S.policy["_forward_backward_micro"]
        optim_step = S.policy["optim_step"]

    workers, calls = [], []
    for r in range(world):
        w = Policy()
        w.cfg = cfg.trainer
        rank_calls: list = []
        calls.append(rank_calls)
        w.model = TinyPolicy(logp_table, entropy_table, rank_calls)
        w.optimizer = torch.optim.SGD(w.model.parameters(), lr=lr)
        w.scheduler = torch.optim.lr_scheduler.LambdaLR(w.optimizer, lambda s: lr_decay ** s)
        w.strategy = SimStrategy()
        w.mesh_rank = S.dispatch.MeshRank(dp=r, sp=0, tp=0, pp=0, world_size=world, dp_size=world, pp_size=1)
        w.device_mesh = types.SimpleNamespace(get_group=lambda name: name)
        w.policy_loss_fn = S.ppo_utils.PolicyLossRegistry.get(cfg.trainer.algorithm.policy_loss_type)
        workers.append(w)

    starts: list[list[int]] = [[] for _ in range(world)]      # per rank: len(calls) at each forward_backward
    lrs: list[float] = []
    norms: list[list[float]] = [[] for _ in range(world)]

    class SimActor:
        def __init__(self, rank: int):
            self.rank = rank

        def __getattr__(self, method: str):
            rank = self.rank

            def call(*a, **k):
                if method == "forward_backward":
                    starts[rank].append(len(calls[rank]))
                    if rank == 0:
                        lrs.append(workers[0].scheduler.get_last_lr()[0])
                try:
                    out = getattr(workers[rank], method)(*a, **k)
                except BaseException:
                    group._barrier.abort()            # the other ranks' collectives fail instead of waiting
                    raise
                if method == "optim_step":
                    norms[rank].append(out)
                return out
            return types.SimpleNamespace(remote=lambda *a, **k: pool[rank].submit(call, *a, **k))

    actor_group = types.SimpleNamespace(
        actor_infos=[S.dispatch.ActorInfo(SimActor(r), workers[r].mesh_rank) for r in range(world)])
    actor_group.async_run_ray_method = types.MethodType(S.group["async_run_ray_method"], actor_group)

    class Dispatch:
        stage_data = S.worker_dispatch["stage_data"]
        forward_backward_from_staged = S.worker_dispatch["forward_backward_from_staged"]
        optim_step = S.worker_dispatch["optim_step"]

        def __init__(self):
            self._actor_groups = {"policy": actor_group}

        def _ensure_on_gpu(self, *a, **k):       # offload/backload: nothing is offloaded here
            pass

        def ensure_active_adapter(self, *a, **k):  # multi-tenant LoRA: one model
            pass

        def _save_memory_snapshot(self, *a, **k):
            pass

        def empty_cache(self):
            pass

    class Trainer:
        _execute_training_step = S.trainer["_execute_training_step"]
        _normalize_advantages = S.trainer["_normalize_advantages"]
        train_critic_and_policy = S.trainer["train_critic_and_policy"]
        has_critic = False

    t = Trainer()
    t.cfg, t.dispatch, t.all_metrics, t.all_timings, t.global_step = cfg, Dispatch(), {}, {}, 1
    try:
        with on_cpu():
            t.train_critic_and_policy(batch)
    finally:
        for p in pool:
            p.shutdown(wait=True)
    # the rows each micro-batch held: calls[rank][i], grouped by the forward_backward call they belong to
    n_steps = len(starts[0])
    rows = [[calls[r][starts[r][m]:(starts[r][m + 1] if m + 1 < n_steps else len(calls[r]))]
             for r in range(world)] for m in range(n_steps)]
    return PolicyRun(dict(t.all_metrics), rows, lrs, norms, dict(t.all_timings))


# ------------------------------------------------------------------------------------------------ entries
#: entries of mappings/skyrl.yaml covering skyrl 0.3.0 that no proof here establishes, and why. None: every one of
#: the 25 entries that cover 0.3.0 is fingerprinted by tests/frameworks/test_proof_skyrl.py (the two entries
#: ``until: v0.1.0``, policy/policy_loss and policy/final_loss of skyrl 0.1.0, do not cover the vendored release).
ENTRY_WHY: dict[tuple[str, str, str | None], str] = {}
