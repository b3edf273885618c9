"""slime's own metric code for the fingerprint proofs (tests/frameworks/test_proof_slime.py), on a CPU machine.

slime (THUDM/slime) publishes no wheel; its files are vendored verbatim from the tag v0.3.1 under
tests/data/frameworks/slime/ (tests/_support/vendored.py; PROVENANCE.yaml holds every file's SHA-256) and loaded by
file under empty parent packages. Its training path needs Megatron-LM, SGLang and Ray, none of which runs here.

What runs (all slime's own code, unedited):

* ``slime/utils/arguments.py``: ``get_slime_extra_args_provider()`` adds slime's arguments to a fresh
  ``argparse`` parser, which parses the proof's command line, and ``_pre_parse_mode`` adds its flags: the run's
  config is slime's own defaults but for the flags a proof names (:func:`default_args`), with the few values
  ``slime_validate_args`` derives set as it sets them (cited there) and Megatron's own arguments the code reads;
* ``slime/ray/rollout.py``: ``RolloutManager._post_process_rewards``, ``_convert_samples_to_train_data`` and
  ``_split_train_data_by_dp`` (samples -> the training batch, its per-rollout mask totals, the data-parallel split
  and micro-batch schedule) and the module's metric functions (``_log_rollout_data``, ``_log_eval_rollout_data``,
  ``compute_metrics_from_samples``, ``compute_perf_metrics_from_samples`` and their ``_compute_*`` helpers,
  ``_tensorize_rollout_data_for_training``), compiled from the file's own text: the module imports ray, sglang and
  the engines at its top;
* ``slime/utils/data.py``: ``process_rollout_data`` (a rank's share of the batch) and ``get_source``, compiled from its
  text (the module imports ray and pyarrow);
* ``slime/utils/dp_schedule.py``, ``seqlen_balancing.py``, ``flops_utils.py`` (the schedule ``build_dp_schedule``
  makes), ``types.py`` (``Sample``), ``misc.py``, ``metric_utils.py``, ``timer.py``, ``train_metric_utils.py``,
  ``logging_utils.py``, ``ppo_utils.py``: whole files;
* ``slime/backends/megatron_utils/{cp_utils,loss,data,model}.py``: whole files. The proofs call
  ``compute_advantages_and_returns`` (loss.py), ``log_rollout_data`` and ``get_data_iterator`` (data.py) and
  ``train`` (model.py), as ``MegatronTrainRayActor.train_actor`` does (slime/backends/megatron_utils/actor.py@v0.3.1:
  419-520, not vendored: its class needs Ray and Megatron's initialisation); ``train`` runs ``train_one_step``,
  whose ``forward_step`` runs the real ``get_batch`` and ``loss_function`` per micro-batch and whose
  ``reduce_train_step_metrics`` (cp_utils.py) sums, all-reduces and divides them, and ``train`` builds the logged
  dict (model.py@v0.3.1:870-890) and hands it to ``logging_utils.log``.

Stand-ins, each for something the code under test does not compute a metric with, and why:

* ``megatron.core.mpu`` (:class:`ParallelState`): Megatron's parallel state, answered for the simulated
  data-parallel group of :mod:`_support.framework_code` (each rank a thread; tensor, pipeline and context
  parallelism of size 1: the defaults of a one-GPU-per-rank run); the tensor-parallel group it hands ppo_utils
  answers rank 0 of size 1, so ppo_utils' vocab-parallel all-reduces are skipped as with TP=1;
* ``torch.distributed`` of cp_utils.py and data.py (:class:`SlimeDist`): SimDist's all_reduce (sum at a barrier)
  plus ``get_rank`` and ``gather_object`` (the gather to the data-parallel source rank), the collectives slime calls;
* Megatron's pipeline schedule (``get_forward_backward_func``, :func:`forward_backward_no_pipelining`): calls
  slime's ``forward_step`` once per micro-batch and slime's loss closure on the output, and returns the closures'
  log dicts in micro-batch order, as Megatron's ``forward_backward_no_pipelining`` collects them into
  ``forward_data_store`` (the backward pass is not run: no logged metric depends on it, except the grad norm below);
* the model (:class:`BigramModel`): a fixed table of logits per input token, so the log-probs and entropies slime
  computes from the logits are known per token;
* the optimizer and the lr scheduler (:class:`Optimizer`, :class:`Scheduler`): Megatron's. ``optimizer.step()``
  returns the grad norm Megatron computes (given here, one per step), the scheduler's lr after
  ``step(increment=step_global_batch_size)`` is a given function of the samples seen. slime logs both as they are:
  what the proofs check is that slime's code logs the optimizer's and scheduler's numbers unchanged, once per step;
* ``wandb`` (:class:`Wandb`): the sink. slime's real ``logging_utils.log`` calls ``wandb.log(metrics)`` with
  ``--use-wandb``; the stand-in keeps each dict (``wandb_utils``, ``tensorboard_utils``: not used without
  ``--use-tensorboard``);
* ``megatron.core.packed_seq_params.PackedSeqParams``: a record of the packed stream's offsets that the model
  receives (the bigram model does not attend);
* ``ray`` (``put``/``get``: the object store between the rollout manager and the actors, the identity here);
* imports of code the proofs do not run, given as empty names: ``slime.utils.http_utils`` (misc.py's port helpers),
  ``slime.utils.memory_utils``, model.py's ``.checkpoint``, ``.model_provider``, ``.stateless_adam`` and Megatron's
  model, DDP, ``get_model``, ``finalize_model_grads``, ``unwrap_model`` (model building, checkpoints, gradient
  finalisation), ``slime.utils.distributed_utils`` (``distributed_masked_whiten``: --normalize-advantages, off by
  default), arguments.py's ``sglang_utils`` and ``eval_config`` imports (``parse_args``' SGLang phase and
  ``slime_validate_args``' evaluation datasets);
* ``torch.Tensor.cuda`` is the identity while the proofs run (:func:`running`; this machine's torch has no CUDA,
  and data.py's ``get_batch`` moves ``cu_seqlens`` to the GPU), and ``torch._dynamo`` is disabled there, so
  ppo_utils' ``@torch.compile`` functions (``compute_policy_loss``) run eagerly: the same arithmetic.

Nothing here computes a metric: the proofs read back what slime logs.
"""
from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import functools
import sys
import threading
import types
import warnings
from pathlib import Path
from typing import Any, Callable

from _support import vendored
from _support.framework_code import SimDist, current_rank

FW = "slime"
RELEASE = vendored.release(FW)


# ------------------------------------------------------------------------------------------ simulated parallelism
class SlimeDist(SimDist):
    """torch.distributed as cp_utils.py and data.py call it: all_reduce (SimDist), get_rank, gather_object."""

    def get_rank(self, group=None) -> int:
        return current_rank()[1]

    def gather_object(self, obj: Any, object_gather_list: list | None = None, dst: int = 0, group=None) -> None:
        g, r = current_rank()
        parts = g.exchange(r, obj)
        if object_gather_list is not None:
            object_gather_list[:] = parts


class _TPGroup:
    """The tensor-parallel group of size 1 ppo_utils asks for its rank and size."""

    def rank(self) -> int:
        return 0

    def size(self) -> int:
        return 1


class ParallelState(types.ModuleType):
    """``megatron.core.mpu`` for the simulated data-parallel group (TP = PP = CP = 1)."""

    def __init__(self) -> None:
        super().__init__("megatron.core.mpu")

    @staticmethod
    def get_data_parallel_rank(with_context_parallel: bool = False) -> int:
        return current_rank()[1]

    @staticmethod
    def get_data_parallel_world_size(with_context_parallel: bool = False) -> int:
        return current_rank()[0].world

    @staticmethod
    def get_data_parallel_group(with_context_parallel: bool = False) -> str:
        return "dp"

    get_data_parallel_group_gloo = get_data_parallel_group

    @staticmethod
    def get_data_parallel_src_rank(with_context_parallel: bool = False) -> int:
        return 0

    @staticmethod
    def get_context_parallel_world_size() -> int:
        return 1

    @staticmethod
    def get_context_parallel_rank() -> int:
        return 0

    @staticmethod
    def get_tensor_model_parallel_rank() -> int:
        return 0

    @staticmethod
    def get_tensor_model_parallel_world_size() -> int:
        return 1

    @staticmethod
    def get_tensor_model_parallel_group() -> _TPGroup:
        return _TPGroup()

    @staticmethod
    def is_pipeline_last_stage(ignore_virtual: bool = False) -> bool:
        return True

    @staticmethod
    def get_pipeline_model_parallel_rank() -> int:
        return 0

    @staticmethod
    def get_pipeline_model_parallel_world_size() -> int:
        return 1

    @staticmethod
    def get_virtual_pipeline_model_parallel_world_size() -> None:
        return None


MPU = ParallelState()
_local = threading.local()          # the rank's args (megatron.training.global_vars.get_args)


def get_args() -> argparse.Namespace:
    return _local.args


def set_args(args: argparse.Namespace) -> None:
    _local.args = args


# ------------------------------------------------------------------------------------------ Megatron's pieces
def forward_backward_no_pipelining(*, forward_step_func: Callable, data_iterator: Any, model: Any,
                                   num_microbatches: int, forward_only: bool = False, **_: Any) -> list[dict]:
    """Megatron's schedule without pipelining, as far as the logged metrics go: slime's ``forward_step`` per
    micro-batch, slime's loss closure on its output, the closures' third results (the log dicts) in order."""
    store = []
    iterator = data_iterator[0] if isinstance(data_iterator, list) else data_iterator
    for _ in range(num_microbatches):
        output, loss_func = forward_step_func(iterator, model[0] if isinstance(model, list) else model)
        _loss, _num_tokens, log = loss_func(output)
        store.append(log)
    return store


class BigramModel:
    """The policy: the logits at a position are a fixed row per input token (``table[token]``)."""

    role = "actor"

    def __init__(self, table):
        self.table = table
        self.calls = 0

    def __call__(self, *, input_ids, **_: Any):
        self.calls += 1
        return self.table[input_ids[0]].unsqueeze(0).float()        # [1, T, V]

    def zero_grad_buffer(self) -> None:
        pass

    def train(self) -> None:
        pass


class Optimizer:
    """Megatron's optimizer as train/train_one_step call it: ``step()`` returns (ok, grad norm, zeros); the grad
    norms are given, one per optimizer step."""

    def __init__(self, grad_norms: list[float]):
        self.grad_norms = list(grad_norms)
        self.steps = 0
        self.param_groups = [{"name": "pg0"}]

    def zero_grad(self) -> None:
        pass

    def scale_loss(self, loss):
        return loss

    def step(self):
        norm = self.grad_norms[self.steps]
        self.steps += 1
        return True, norm, None


class Scheduler:
    """Megatron's OptimizerParamScheduler as slime calls it: ``step(increment=...)`` counts the samples, ``get_lr``
    is the given ``lr_of(samples seen)``."""

    def __init__(self, lr_of: Callable[[int], float]):
        self.lr_of = lr_of
        self.samples = 0
        self.increments: list[int] = []

    def step(self, increment: int) -> None:
        self.samples += increment
        self.increments.append(increment)

    def get_lr(self, param_group) -> float:
        return self.lr_of(self.samples)


class Wandb(types.ModuleType):
    """The sink: ``wandb.log`` keeps what slime's ``logging_utils.log`` hands it, per rank."""

    def __init__(self) -> None:
        super().__init__("wandb")
        self.rows: dict[int, list[dict]] = {}
        self._lock = threading.Lock()

    def log(self, metrics: dict) -> None:
        try:
            rank = current_rank()[1]
        except AttributeError:          # called outside the simulated ranks (the rollout manager's process)
            rank = -1
        with self._lock:
            self.rows.setdefault(rank, []).append(dict(metrics))


class PackedSeqParams(types.SimpleNamespace):
    """megatron.core.packed_seq_params.PackedSeqParams: the packed stream's offsets, for the model."""


def _module(name: str, **attrs: Any) -> types.ModuleType:
    return vendored.stand_in(name, **attrs)


def _megatron() -> dict[str, types.ModuleType]:
    class DDP:
        pass

    class Unused:
        def __init__(self, *a: Any, **k: Any) -> None:
            raise AssertionError("not used by the code under test")

    def unused(*a: Any, **k: Any) -> Any:
        raise AssertionError("not used by the code under test")

    core = _module("megatron.core", mpu=MPU)
    return {
        "megatron": _module("megatron", core=core),
        "megatron.core": core,
        "megatron.core.mpu": MPU,
        "megatron.core.packed_seq_params": _module("megatron.core.packed_seq_params", PackedSeqParams=PackedSeqParams),
        "megatron.core.distributed": _module("megatron.core.distributed", DistributedDataParallel=DDP,
                                             finalize_model_grads=unused),
        "megatron.core.enums": _module("megatron.core.enums", ModelType=Unused),
        "megatron.core.models": _module("megatron.core.models"),
        "megatron.core.models.gpt": _module("megatron.core.models.gpt", GPTModel=Unused),
        "megatron.core.optimizer": _module("megatron.core.optimizer", OptimizerConfig=Unused,
                                           get_megatron_optimizer=unused),
        "megatron.core.optimizer.optimizer": _module("megatron.core.optimizer.optimizer", MegatronOptimizer=Unused),
        "megatron.core.optimizer_param_scheduler": _module("megatron.core.optimizer_param_scheduler",
                                                           OptimizerParamScheduler=Unused),
        "megatron.core.pipeline_parallel": _module("megatron.core.pipeline_parallel",
                                                   get_forward_backward_func=lambda: forward_backward_no_pipelining),
        "megatron.core.pipeline_parallel.utils": _module("megatron.core.pipeline_parallel.utils",
                                                         unwrap_model=unused),
        "megatron.core.utils": _module("megatron.core.utils",
                                       get_model_config=lambda model: types.SimpleNamespace(no_sync_func=None)),
        "megatron.training": _module("megatron.training"),
        "megatron.training.global_vars": _module("megatron.training.global_vars", get_args=get_args),
        "megatron.training.training": _module("megatron.training.training", get_model=unused),
    }


def eager():
    """torch.compile disabled in this thread (dynamo's config is per thread: each simulated rank enters it)."""
    import torch._dynamo
    return torch._dynamo.config.patch(disable=True)


@contextlib.contextmanager
def running():
    """While a proof runs slime's code: Megatron's stand-ins importable (ppo_utils imports mpu inside its GAE
    function), ``Tensor.cuda`` the identity (a CPU torch), torch.compile disabled (eager, the same arithmetic)."""
    import torch

    stand = _megatron()
    saved = {k: sys.modules.get(k) for k in stand}
    sys.modules.update(stand)
    cuda = torch.Tensor.cuda
    if not torch.cuda.is_available():
        torch.Tensor.cuda = lambda self, *a, **k: self          # type: ignore[method-assign]
    try:
        with eager():
            yield
    finally:
        torch.Tensor.cuda = cuda                                # type: ignore[method-assign]
        for k, old in saved.items():
            if old is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = old


# ------------------------------------------------------------------------------------------ compiling from text
def _from_source(path: Path, namespace: dict[str, Any], *, functions: tuple[str, ...] = (),
                 assigns: tuple[str, ...] = (), methods: tuple[str, str, tuple[str, ...]] | None = None) -> dict:
    """Top-level functions and assignments of the file at ``path`` (and methods of one class), compiled from the
    file's own text into ``namespace``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    nodes: list[ast.stmt] = []
    for n in tree.body:
        if isinstance(n, ast.FunctionDef) and n.name in functions:
            nodes.append(n)
        elif isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id in assigns for t in n.targets):
            nodes.append(n)
    if methods is not None:
        cls, names = methods[0], methods[1]
        body = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls).body
        nodes += [n for n in body if isinstance(n, ast.FunctionDef) and n.name in names]
        missing = set(names) - {n.name for n in nodes if isinstance(n, ast.FunctionDef)}
    else:
        missing = set()
    missing |= set(functions) - {n.name for n in nodes if isinstance(n, ast.FunctionDef)}
    if missing:
        raise ImportError(f"{path}: no {sorted(missing)}")
    exec(compile(ast.Module(body=nodes, type_ignores=[]), str(path), "exec"), namespace)   # noqa: S102 - slime's
    return namespace


# ------------------------------------------------------------------------------------------ loading
def _load_arguments(load: Callable[..., types.ModuleType]) -> types.ModuleType:
    return load("slime/utils/arguments.py", **{
        "slime.backends.sglang_utils": _module("slime.backends.sglang_utils"),
        "slime.backends.sglang_utils.arguments": _module("slime.backends.sglang_utils.arguments",
                                                         sglang_parse_args=None, validate_args=None),
        "slime.backends.sglang_utils.external": _module("slime.backends.sglang_utils.external",
                                                        apply_external_engine_info_to_args=None),
        "slime.utils.eval_config": _module("slime.utils.eval_config", EvalDatasetConfig=None,
                                           build_eval_dataset_configs=None, ensure_dataset_list=None)})


@functools.lru_cache(maxsize=None)
def slime() -> types.SimpleNamespace:
    import logging

    import numpy as np
    import torch

    def load(path: str, **stand: types.ModuleType) -> types.ModuleType:
        return vendored.load(FW, path, stand_ins=stand)

    meg = _megatron()
    wandb = Wandb()
    misc = load("slime/utils/misc.py", **{"slime.utils.http_utils": _module("slime.utils.http_utils",
                                                                            is_port_available=None)})
    typ = load("slime/utils/types.py")
    metric_utils = load("slime/utils/metric_utils.py")
    timer = load("slime/utils/timer.py")
    logging_utils = load("slime/utils/logging_utils.py", **{
        "wandb": wandb, "slime.utils.wandb_utils": _module("slime.utils.wandb_utils"),
        "slime.utils.tensorboard_utils": _module("slime.utils.tensorboard_utils", _TensorboardAdapter=None)})
    train_metric_utils = load("slime/utils/train_metric_utils.py")
    load("slime/utils/flops_utils.py")
    load("slime/utils/seqlen_balancing.py")
    dp_schedule = load("slime/utils/dp_schedule.py")
    ppo_utils = load("slime/utils/ppo_utils.py")
    with warnings.catch_warnings():           # arguments.py@v0.3.1:251 has an invalid escape in a help string
        warnings.simplefilter("ignore", (DeprecationWarning, SyntaxWarning))
        arguments = _load_arguments(load)
    cp_utils = load("slime/backends/megatron_utils/cp_utils.py", **meg)
    cp_utils.dist = SlimeDist()
    loss = load("slime/backends/megatron_utils/loss.py", **meg, **{
        "slime.utils.distributed_utils": _module("slime.utils.distributed_utils", distributed_masked_whiten=None)})
    data = load("slime/backends/megatron_utils/data.py", **meg)
    data.dist = SlimeDist()
    model = load("slime/backends/megatron_utils/model.py", **meg, **{
        "slime.utils.memory_utils": _module("slime.utils.memory_utils", clear_memory=None),
        "slime.backends.megatron_utils.checkpoint": _module("slime.backends.megatron_utils.checkpoint",
                                                            load_checkpoint=None, save_checkpoint=None),
        "slime.backends.megatron_utils.model_provider": _module("slime.backends.megatron_utils.model_provider",
                                                                get_model_provider_func=None),
        "slime.backends.megatron_utils.stateless_adam": _module("slime.backends.megatron_utils.stateless_adam",
                                                                StatelessAdam=None)})
    ray = _module("ray", put=lambda obj, **_: obj, get=lambda obj: obj)
    src = vendored.provenance(FW).root / "src"
    ns: dict[str, Any] = {
        "np": np, "torch": torch, "ray": ray, "Any": Any, "Sample": typ.Sample, "Box": misc.Box,
        "group_by": misc.group_by, "load_function": misc.load_function, "logging_utils": logging_utils,
        "compute_pass_rate": metric_utils.compute_pass_rate, "compute_rollout_step": metric_utils.compute_rollout_step,
        "compute_statistics": metric_utils.compute_statistics, "dict_add_prefix": metric_utils.dict_add_prefix,
        "has_repetition": metric_utils.has_repetition, "build_dp_schedule": dp_schedule.build_dp_schedule,
        "get_source": None, "logger": logging.getLogger("slime.ray.rollout"), "dataclasses": __import__("dataclasses"),
    }
    rollout = _from_source(src / "slime/ray/rollout.py", ns, assigns=(
        "_ROLLOUT_DATA_TENSOR_DTYPES", "_SGLANG_REQUEST_PERF_FIELDS", "_SGLANG_PREFILL_PERF_FIELDS",
        "_SGLANG_DECODE_PERF_FIELDS"), functions=(
        "_cpu_tensor", "_tensorize_rollout_data_for_training", "_log_eval_rollout_data", "_log_rollout_data",
        "compute_metrics_from_samples", "compute_perf_metrics_from_samples", "_compute_sglang_request_perf_metrics",
        "_iter_sglang_generate_attrs", "_compute_zero_std_metrics", "_compute_top_p_kept_vocab_metrics",
        "_compute_spec_metrics", "_compute_prefix_cache_metrics", "_compute_reward_cat_metrics"),
        methods=("RolloutManager", ("_post_process_rewards", "_convert_samples_to_train_data",
                                    "_split_train_data_by_dp")))
    udata = _from_source(src / "slime/utils/data.py", {"ray": ray, "Timer": timer.Timer, "Sample": typ.Sample},
                         functions=("process_rollout_data", "get_source"))
    ns["get_source"] = udata["get_source"]
    return types.SimpleNamespace(
        misc=misc, types=typ, Sample=typ.Sample, metric_utils=metric_utils, timer=timer, Timer=timer.Timer,
        logging_utils=logging_utils, train_metric_utils=train_metric_utils, ppo_utils=ppo_utils,
        arguments=arguments, cp_utils=cp_utils, loss=loss, data=data, model=model, wandb=wandb, rollout=rollout,
        process_rollout_data=udata["process_rollout_data"], release=RELEASE)


def default_args(cli: list[str], **overrides: Any) -> argparse.Namespace:
    """slime's defaults (slime/utils/arguments.py@v0.3.1 get_slime_extra_args_provider parsing ``cli``: the
    command line of the run, ``--rollout-batch-size`` being required, and ``_pre_parse_mode``'s flags, merged as
    ``parse_args`` merges them), then ``overrides`` (Megatron's arguments),
    with what slime_validate_args derives (arguments.py@v0.3.1:1817-1818: eps_clip_high = eps_clip when unset;
    :1907-1915: global_batch_size = rollout_batch_size * n_samples_per_prompt // num_steps_per_rollout) and the
    Megatron arguments the code reads (Megatron's defaults: seq_length etc. are read only to pass to the schedule)."""
    s = slime()
    parser = s.arguments.get_slime_extra_args_provider()(argparse.ArgumentParser())
    args = parser.parse_args(cli)
    argv, sys.argv = sys.argv, ["train.py", *cli]
    try:                                       # parse_args merges the pre-parsed flags (arguments.py@v0.3.1:1553,1575)
        pre = s.arguments._pre_parse_mode()
    finally:
        sys.argv = argv
    for key, value in vars(pre).items():
        setattr(args, key, value)
    for k, v in {"seq_length": 4096, "decoder_seq_length": None, "micro_batch_size": 1,
                 "check_for_nan_in_loss_and_grad": True, "overlap_grad_reduce": False, "align_grad_reduce": False,
                 "overlap_param_gather": False, "align_param_gather": False, "use_distributed_optimizer": False,
                 "manual_gc": False, "enable_mtp_training": False, "ci_test": False}.items():
        if not hasattr(args, k):
            setattr(args, k, v)
    for k, v in overrides.items():
        setattr(args, k, v)
    if args.eps_clip_high is None:
        args.eps_clip_high = args.eps_clip
    if getattr(args, "num_steps_per_rollout", None) is not None and args.global_batch_size is None:
        args.global_batch_size = args.rollout_batch_size * args.n_samples_per_prompt // args.num_steps_per_rollout
    return args


# ------------------------------------------------------------------------------------------ one rollout, trained
WORLD = 2
PARALLEL = {"dp_size": WORLD, "cp_size": 1, "vpp_size": 1, "microbatch_group_size_per_vp_stage": 1}


def rollout_manager(args: argparse.Namespace) -> types.SimpleNamespace:
    """A RolloutManager as far as its compiled methods read it (``__init__``, rollout.py@v0.3.1:431-455, with no
    custom reward / conversion function, and ``set_train_parallel_config``)."""
    s = slime()
    mgr = types.SimpleNamespace(args=args, custom_reward_post_process_func=None,
                                custom_convert_samples_to_train_data_func=None, train_parallel_config=dict(PARALLEL))
    for name in ("_post_process_rewards", "_convert_samples_to_train_data", "_split_train_data_by_dp"):
        setattr(mgr, name, types.MethodType(s.rollout[name], mgr))
    return mgr


@dataclasses.dataclass
class Run:
    """What slime's code logged (rank 0's wandb rows), and what each rank's code was given / held."""

    rows: list[dict]
    train_data: dict                   # _convert_samples_to_train_data's result (every sample)
    rank_data: list[dict]              # each rank's rollout_data as train() consumed it
    schedulers: list[Scheduler]
    optimizers: list[Optimizer]


def run_rollout_and_train(args: argparse.Namespace, samples: list, rollout_id: int, table,
                          forward: Callable[[int, dict], dict], grad_norms: list[float],
                          lr_of: Callable[[int], float]) -> Run:
    """The rollout manager's conversion and data-parallel split of ``samples`` (RolloutManager.generate,
    rollout.py@v0.3.1:564-565), then on every simulated rank what ``train_actor`` does with its share
    (actor.py@v0.3.1:242 process_rollout_data, :420 get_data_iterator, :497 compute_advantages_and_returns, :502
    log_rollout_data, :512 train). ``forward(rank, rollout_data)``: the fields the actor's forward passes store
    (``compute_log_prob``: log_probs, ref_log_probs; a critic's values), given."""
    from _support.framework_code import run_ranks

    s = slime()
    mgr = rollout_manager(args)
    data = mgr._convert_samples_to_train_data(samples)
    train_data = {k: list(v) if isinstance(v, list) else v for k, v in data.items()}
    refs = mgr._split_train_data_by_dp(data)
    s.wandb.rows.clear()
    schedulers = [Scheduler(lr_of) for _ in range(WORLD)]
    optimizers = [Optimizer(grad_norms) for _ in range(WORLD)]
    held: list[dict] = [{} for _ in range(WORLD)]

    def rank(r: int) -> None:
        with eager():
            _rank(r)

    def _rank(r: int) -> None:
        set_args(args)
        rollout_data = s.process_rollout_data(args, refs, r, WORLD)
        rollout_data.update(forward(r, rollout_data))
        data_iterator = s.data.get_data_iterator(rollout_data)
        s.loss.compute_advantages_and_returns(args, rollout_data)
        s.data.log_rollout_data(rollout_id, args, rollout_data)
        s.model.train(rollout_id, [BigramModel(table)], optimizers[r], schedulers[r], data_iterator,
                      rollout_data["num_microbatches"], rollout_data["global_batch_sizes"])
        held[r].update(rollout_data)

    with running():
        run_ranks(rank, world=WORLD)
    return Run(list(s.wandb.rows.get(0, [])), train_data, held, schedulers, optimizers)


#: entries of mappings/slime.yaml covering v0.3.1 that no proof here runs, and why
ENTRY_WHY: dict[tuple[str, str, str | None], str] = {}
