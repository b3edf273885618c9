"""NeMo-RL v0.7.0's own metric code for the fingerprint proofs (tests/frameworks/test_proof_nemo_rl.py), on a CPU
machine, from the tag's files vendored under tests/data/frameworks/nemo_rl/ (tests/_support/vendored.py; NeMo-RL
has no usable wheel: PyPI's nemo-rl is a placeholder). Nothing here computes a metric: this module loads the files
and gives the code what it asks of a GPU cluster (a process group, CUDA, a model, Ray workers).

Loaded whole (``vendored.load``), each with the stand-ins below for imports the code under test does not use:

* ``nemo_rl/algorithms/utils.py`` (``masked_mean``, ``calculate_kl``, ``print_performance_metrics``): stand-ins
  for ``transformers`` (``AutoProcessor``/``AutoTokenizer``/``PreTrainedTokenizerBase``: ``get_tokenizer`` only),
  ``nemo_rl.data.chat_templates`` (``get_tokenizer``'s templates), ``nemo_rl.models.policy`` (``TokenizerConfig``,
  an annotation) and ``nemo_rl.utils.logger`` (``Logger``, an annotation of ``log_generation_metrics_to_wandb``);
* ``nemo_rl/distributed/collectives.py`` (whole, torch only) and ``nemo_rl/distributed/batched_data_dict.py``
  (``BatchedDataDict``: ``shard_by_batch_size``, ``get_batch``, ``make_microbatch_iterator``): stand-ins for
  ``nemo_rl.data.multimodal_utils`` (``PackedTensor``: an ``isinstance`` test; no multimodal data here; the real
  file imports PIL, requests and transformers' audio/video loaders) and ``nemo_rl.data.packing`` (``get_packer``:
  sequence packing, off here);
* ``nemo_rl/algorithms/loss/interfaces.py`` (whole) and ``nemo_rl/algorithms/loss/loss_functions.py``
  (``ClippedPGLossFn``, ``ClippedPGLossConfig``: pydantic is real): stand-ins for
  ``nemo_rl.algorithms.x_token.loss_utils`` (the cross-tokenizer distillation loss only) and
  ``nemo_rl.models.dtensor.parallelize`` (``to_local_if_dtensor``: the distillation losses only);
  ``nemo_rl/distributed/model_utils.py`` is the real one (``get_next_token_logprobs_from_logits``);
* ``nemo_rl/algorithms/logits_sampling_utils.py``, ``nemo_rl/distributed/model_utils.py``: whole, torch only;
* ``nemo_rl/algorithms/loss/utils.py`` (``prepare_loss_input``: logits -> next-token log-probs): stand-in for
  ``nemo_rl.algorithms.x_token.loss_utils`` (the cross-tokenizer input only);
* ``nemo_rl/models/automodel/data.py`` (``process_global_batch``: the global valid-token/sequence counts,
  all-reduced; ``get_microbatch_iterator``, ``process_microbatch``, ``check_sequence_dim``): stand-ins for
  ``transformers`` (``AutoTokenizer``, an annotation) and ``nemo_rl.models.huggingface.common`` (sequence packing
  and flash-attention kwargs, off here);
* ``nemo_rl/models/automodel/train.py`` (``automodel_forward_backward``: the division of every metric by
  num_global_batches; ``forward_with_post_processing_fn``, ``model_forward``, ``LossPostProcessor``,
  ``aggregate_training_statistics``): stand-ins for ``nemo_automodel...tensor_utils`` (``to_local_if_dtensor``: the
  logprob/top-k post-processors only), ``transformers.models.gemma3.modeling_gemma3`` (two classes for an
  ``isinstance`` test: the model here is not Gemma 3), ``nemo_rl.algorithms.loss`` (the package ``__init__``, which
  also imports wrapper.py: a module holding the REAL ``prepare_loss_input`` from utils.py and
  ``SequencePackingLossWrapper`` = None, sequence packing being off) and ``nemo_rl.models.policy``
  (``PolicyConfig``, an annotation);
* ``nemo_rl/utils/timer.py`` (``Timer``): whole (the timing proof gives its module's ``time`` the test's clock for
  the block it times, test_proof_nemo_rl.py ``Clock``: the durations are then given numbers);
* ``nemo_rl/experience/rollouts.py`` (``run_multi_turn_rollout``, ``generate_responses``, ``calculate_rewards``;
  ``run_async_multi_turn_rollout`` with ``run_sample_multi_turn_rollout`` and ``generate_responses_async``, real
  asyncio: the rollout metrics): stand-ins for ``ray`` (the environments are Ray actors: the test's environment answers
  ``step.remote`` at once with a resolved future, whose ``.value`` ``ray.get`` returns), ``wandb``
  (``Histogram``/``Table``: the NeMo-Gym path's logging only), ``transformers`` (``PreTrainedTokenizerBase``, an
  annotation) and ``nemo_rl.models.generation.interfaces`` (four TypedDict/Protocol annotations); with the real
  ``nemo_rl/data/llm_message_utils.py`` (``batched_message_log_to_flat_message``; stand-ins for ``datasets``
  and ``transformers.tokenization_utils_base``, annotations), ``nemo_rl/data/interfaces.py`` and
  ``nemo_rl/environments/interfaces.py`` (``EnvironmentReturn``).

``nemo_rl.data.multimodal_utils`` is one stand-in throughout (:class:`PackedTensor`, the class the loaded files'
``isinstance`` tests compare with; the real file imports PIL, requests and transformers' audio/video loaders).

Compiled from a file's own text (its module imports Ray, nemo_automodel, the checkpointing and generation stacks):

* ``DTensorPolicyWorkerV2Impl.train`` (nemo_rl/models/policy/workers/dtensor_policy_worker_v2.py:389-572) and the
  file's ``get_train_context`` (:167-192): the worker's loop over global batches and micro-batches, ``lr``,
  ``global_valid_seqs/toks`` per micro-batch, one optimizer step per global batch, the scheduler step after all of
  them. Its names bound to the loaded pieces above; ``scale_grads_and_clip_grad_norm`` (nemo_automodel, another
  repository) is stood in by torch's ``clip_grad_norm_`` (the same total 2-norm before clipping, one number per
  optimizer step), ``get_train_context_automodel`` (nemo_automodel's loss-parallel / compiled-autograd contexts,
  both off in the call) by ``nullcontext``;
* ``Policy.train`` and ``Policy._shard_for_train`` (nemo_rl/models/policy/lm_policy.py:459-497,702-805): the
  driver's sharding over data-parallel ranks and the merge of every worker's ``all_mb_metrics`` lists; its
  ``worker_group`` is :class:`Workers` (the Ray worker group: each rank's worker runs in its own thread,
  ``framework_code.run_ranks``), its ``flops_tracker`` :class:`FlopsTracker` (flops_tracker.py computes FLOPs from
  the HF model config, which there is none of) and ``get_theoretical_tflops`` :func:`theoretical_tflops` (a table
  of GPU names: the GPU here is the CPU);
* statements of ``grpo_train`` (nemo_rl/algorithms/grpo.py), by their first and last lines' text
  (:func:`grpo_statements`): the step's metrics dict and its aggregation loop (:2793-2860), the timer's
  reduction (:2997-2999) and the step's end (:3044-3090: the console prints, valid_tokens_per_sec_per_gpu,
  print_performance_metrics);
* ``validate`` (grpo.py:3139-3291) with ``_should_use_nemo_gym`` / ``_should_use_async_rollouts``
  (:1646-1731), from the file's text (:func:`validate`).

``torch`` as those modules call it is :class:`TorchOnCPU` (``torch.distributed``: the simulated data-parallel group
of ``framework_code`` whose all-reduce meets at a barrier; ``torch.cuda``: no-ops; ``device="cuda"`` dropped), and
:func:`on_cpu` makes ``Tensor.cuda()`` / ``.to("cuda")`` no-ops while the code runs.
"""
from __future__ import annotations

import ast
import contextlib
import functools
import types
from collections import defaultdict
from contextlib import nullcontext
from typing import Any, Callable

from _support import vendored
from _support.framework_code import SimDist, current_rank, run_ranks

FW = "nemo_rl"
#: (rank, total gradient norm) of every optimizer step, as the grad-norm stand-in returned it to the worker
GRAD_NORMS: list[tuple[int, float]] = []
stand_in = vendored.stand_in


# ------------------------------------------------------------------------------------------ torch on a CPU
class NemoDist(SimDist):
    """``torch.distributed`` as NeMo-RL's worker code calls it: all_reduce (SUM/MAX), get_rank, ReduceOp."""

    class ReduceOp:
        SUM, MAX = "sum", "max"

    def get_rank(self, group=None) -> int:
        return current_rank()[1]

    def __getattr__(self, name: str) -> Any:           # torch.distributed.tensor.DTensor (isinstance tests) ...
        import torch.distributed
        return getattr(torch.distributed, name)


class TorchOnCPU(types.ModuleType):
    """The ``torch`` module the loaded files see: the real one, but ``torch.distributed`` is the simulated group,
    ``torch.cuda`` does nothing and ``torch.tensor(..., device="cuda")`` is made on the CPU."""

    def __init__(self) -> None:
        import torch
        super().__init__("torch")
        self._torch = torch
        self.distributed = NemoDist()
        self.cuda = types.SimpleNamespace(empty_cache=lambda: None, get_device_name=lambda *a: "cpu",
                                          is_available=lambda: False)

    def tensor(self, *args: Any, device: Any = None, **kw: Any):
        return self._torch.tensor(*args, **kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._torch, name)


@contextlib.contextmanager
def on_cpu():
    """``Tensor.cuda()`` and ``Tensor.to("cuda")`` leave the tensor where it is (the code moves batches to the GPU)."""
    import torch
    cuda, to = torch.Tensor.cuda, torch.Tensor.to

    def to_cpu(self, *args, **kw):
        if (args and str(args[0]).startswith("cuda")) or str(kw.get("device", "")).startswith("cuda"):
            return self
        return to(self, *args, **kw)
    torch.Tensor.cuda, torch.Tensor.to = (lambda self, *a, **k: self), to_cpu
    try:
        yield
    finally:
        torch.Tensor.cuda, torch.Tensor.to = cuda, to


# ------------------------------------------------------------------------------------------ the files
class PackedTensor:
    """``nemo_rl.data.multimodal_utils.PackedTensor`` for ``isinstance`` tests (no multimodal data here)."""


def _pkg(*names: str) -> dict[str, types.ModuleType]:
    """Stand-in parent packages (an import of ``a.b.c`` imports ``a`` and ``a.b`` first)."""
    return {n: stand_in(n, __path__=[]) for n in names}


@functools.lru_cache(maxsize=None)
def nemo() -> types.SimpleNamespace:
    """Every loaded file (see the module docstring), once."""
    L = functools.partial(vendored.load, FW)
    multimodal = stand_in("nemo_rl.data.multimodal_utils", PackedTensor=PackedTensor, **{n: None for n in (
        "get_dim_to_pack_along", "get_multimodal_default_settings_from_processor",
        "get_multimodal_keys_from_processor", "load_media_from_message")})
    utils = L("nemo_rl/algorithms/utils.py", stand_ins={
        "transformers": stand_in("transformers", AutoProcessor=None, AutoTokenizer=None,
                                 PreTrainedTokenizerBase=object),
        **_pkg("nemo_rl.data"), "nemo_rl.data.chat_templates": stand_in("nemo_rl.data.chat_templates",
                                                                        COMMON_CHAT_TEMPLATES={}),
        "nemo_rl.models.policy": stand_in("nemo_rl.models.policy", TokenizerConfig=dict),
        "nemo_rl.utils.logger": stand_in("nemo_rl.utils.logger", Logger=object)})
    L("nemo_rl/distributed/collectives.py")
    bdd = L("nemo_rl/distributed/batched_data_dict.py", stand_ins={
        **_pkg("nemo_rl.data"),
        "nemo_rl.data.multimodal_utils": multimodal,
        "nemo_rl.data.packing": stand_in("nemo_rl.data.packing", get_packer=None)})
    interfaces = L("nemo_rl/algorithms/loss/interfaces.py")
    sampling = L("nemo_rl/algorithms/logits_sampling_utils.py")
    model_utils = L("nemo_rl/distributed/model_utils.py")
    xtoken = {**_pkg("nemo_rl.algorithms.x_token"), "nemo_rl.algorithms.x_token.loss_utils": stand_in(
        "nemo_rl.algorithms.x_token.loss_utils", **{n: None for n in (
            "LocalizedAlignment", "build_exact_token_map", "ce_label_mask", "chunk_average_log_probs",
            "get_sparse_projection_matrix", "next_token_accuracy", "project_student_to_teacher_vocab",
            "select_teacher_topk_indices", "student_next_token_ce", "valid_chunk_mask",
            "prepare_xtoken_cross_tokenizer_loss_input")})}
    losses = L("nemo_rl/algorithms/loss/loss_functions.py", stand_ins={
        **xtoken, **_pkg("nemo_rl.models", "nemo_rl.models.dtensor"),
        "nemo_rl.models.dtensor.parallelize": stand_in("nemo_rl.models.dtensor.parallelize",
                                                       to_local_if_dtensor=None)})
    loss_utils = L("nemo_rl/algorithms/loss/utils.py", stand_ins=xtoken)
    data = L("nemo_rl/models/automodel/data.py", stand_ins={
        "transformers": stand_in("transformers", AutoTokenizer=None),
        "nemo_rl.models.huggingface": stand_in("nemo_rl.models.huggingface", __path__=[]),
        "nemo_rl.models.huggingface.common": stand_in("nemo_rl.models.huggingface.common",
                                                      get_flash_attention_kwargs=None, pack_sequences=None)})
    gemma = type("Gemma3", (), {})
    train = L("nemo_rl/models/automodel/train.py", stand_ins={
        **_pkg("nemo_automodel", "nemo_automodel.components", "nemo_automodel.components.distributed"),
        "nemo_automodel.components.distributed.tensor_utils": stand_in(
            "nemo_automodel.components.distributed.tensor_utils", to_local_if_dtensor=None),
        **_pkg("transformers", "transformers.models", "transformers.models.gemma3"),
        "transformers.models.gemma3.modeling_gemma3": stand_in(
            "transformers.models.gemma3.modeling_gemma3", Gemma3ForCausalLM=gemma,
            Gemma3ForConditionalGeneration=gemma),
        "nemo_rl.algorithms.loss": stand_in("nemo_rl.algorithms.loss", __path__=[],
                                            prepare_loss_input=loss_utils.prepare_loss_input,
                                            SequencePackingLossWrapper=None),
        "nemo_rl.models.policy": stand_in("nemo_rl.models.policy", PolicyConfig=dict)})
    timer = L("nemo_rl/utils/timer.py")
    tok_base = {**_pkg("transformers"), "transformers.tokenization_utils_base": stand_in(
        "transformers.tokenization_utils_base", PreTrainedTokenizerBase=object)}
    data_ifaces = L("nemo_rl/data/interfaces.py", stand_ins={**tok_base, "nemo_rl.data.multimodal_utils": multimodal})
    messages = L("nemo_rl/data/llm_message_utils.py", stand_ins={
        **tok_base, "datasets": stand_in("datasets", Dataset=object), "nemo_rl.data.multimodal_utils": multimodal})
    envs = L("nemo_rl/environments/interfaces.py")
    rollouts = L("nemo_rl/experience/rollouts.py", stand_ins={
        "ray": stand_in("ray", get=lambda futures: [f.value for f in futures]),
        "wandb": stand_in("wandb", Histogram=None, Table=None),
        "transformers": stand_in("transformers", PreTrainedTokenizerBase=object),
        **_pkg("nemo_rl.models.generation"), "nemo_rl.models.generation.interfaces": stand_in(
            "nemo_rl.models.generation.interfaces", **{n: dict for n in (
                "GenerationConfig", "GenerationDatumSpec", "GenerationInterface", "GenerationOutputSpec")})})
    cpu_torch = TorchOnCPU()
    for mod in (data, train, model_utils):
        mod.torch = cpu_torch
    return types.SimpleNamespace(utils=utils, bdd=bdd, BatchedDataDict=bdd.BatchedDataDict, interfaces=interfaces,
                                 losses=losses, loss_utils=loss_utils, data=data, train=train, timer=timer,
                                 sampling=sampling, torch=cpu_torch, rollouts=rollouts, messages=messages,
                                 envs=envs, data_interfaces=data_ifaces, release=vendored.release(FW))


# ------------------------------------------------------------------------------------------ compiled from text
def _source(repo_path: str) -> tuple[str, ast.Module]:
    path = vendored.provenance(FW).path(repo_path)
    return str(path), ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _method_nodes(repo_path: str, cls: str, names: tuple[str, ...]) -> tuple[str, list[ast.stmt]]:
    path, tree = _source(repo_path)
    (node,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls]
    found = [n for n in node.body if isinstance(n, ast.FunctionDef) and n.name in names]
    assert {n.name for n in found} == set(names), f"{repo_path}: {cls} lost one of {names}"
    for n in found:
        n.decorator_list = []               # nvtx / ray decorators: profiling only
    return path, found


def _exec(path: str, nodes: list[ast.stmt], ns: dict[str, Any]) -> dict[str, Any]:
    exec(compile(ast.fix_missing_locations(ast.Module(body=nodes, type_ignores=[])), path, "exec"),
         ns)                                                     # noqa: S102 - the tag's own code
    return ns


@functools.lru_cache(maxsize=None)
def worker_class() -> type:
    """``DTensorPolicyWorkerV2Impl`` with only its ``train`` method (and the file's ``get_train_context``), compiled
    from dtensor_policy_worker_v2.py's text against the loaded modules (the module docstring says which names are
    stood in and why)."""
    import torch
    N = nemo()
    repo = "nemo_rl/models/policy/workers/dtensor_policy_worker_v2.py"
    path, tree = _source(repo)
    (ctx,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "get_train_context"]
    _, methods = _method_nodes(repo, "DTensorPolicyWorkerV2Impl", ("train",))
    from typing import Generator, Iterable, Optional

    def clip_grad_norm(max_grad_norm, models, **kw):      # nemo_automodel's scale_grads_and_clip_grad_norm
        params = [p for m in models for p in m.parameters()]
        norm = float(torch.nn.utils.clip_grad_norm_(params, max_grad_norm if max_grad_norm else float("inf")))
        GRAD_NORMS.append((current_rank()[1], norm))
        return norm

    ns: dict[str, Any] = {
        "torch": N.torch, "contextlib": contextlib, "Any": Any, "Generator": Generator, "Iterable": Iterable,
        "Optional": Optional, "warnings": __import__("warnings"), "nullcontext": nullcontext,
        "AbstractContextManager": contextlib.AbstractContextManager, "LossFunction": N.interfaces.LossFunction,
        "BatchedDataDict": N.BatchedDataDict, "contextmanager": contextlib.contextmanager,
        "create_context_parallel_ctx": None, "get_train_context_automodel": lambda *a: nullcontext,
        "check_sequence_dim": N.data.check_sequence_dim, "get_microbatch_iterator": N.data.get_microbatch_iterator,
        "process_global_batch": N.data.process_global_batch, "LossPostProcessor": N.train.LossPostProcessor,
        "automodel_forward_backward": N.train.automodel_forward_backward,
        "aggregate_training_statistics": N.train.aggregate_training_statistics,
        "scale_grads_and_clip_grad_norm": clip_grad_norm,
    }
    _exec(path, [ctx, *methods], ns)
    return type("DTensorPolicyWorkerV2Impl", (), {"train": ns["train"]})


@functools.lru_cache(maxsize=None)
def policy_class() -> type:
    """``Policy`` with ``train`` and ``_shard_for_train`` compiled from lm_policy.py's text."""
    import warnings
    from typing import Iterable, Optional
    N = nemo()
    path, methods = _method_nodes("nemo_rl/models/policy/lm_policy.py", "Policy", ("train", "_shard_for_train"))
    ns = {"Any": Any, "Optional": Optional, "Iterable": Iterable, "nullcontext": nullcontext,
          "defaultdict": defaultdict, "warnings": warnings, "BatchedDataDict": N.BatchedDataDict,
          "LossFunction": N.interfaces.LossFunction, "Timer": N.timer.Timer, "SlicedDataDict": N.bdd.SlicedDataDict,
          "get_theoretical_tflops": theoretical_tflops}
    _exec(path, methods, ns)
    return type("Policy", (), {"train": ns["train"], "_shard_for_train": ns["_shard_for_train"]})


#: the GPU's theoretical TFLOPS as nemo_rl/utils/flops_tracker.py's table would give it for the stand-in GPU
THEORETICAL_TFLOPS = 100.0


def theoretical_tflops(gpu_name: str, dtype: Any) -> float:
    """``get_theoretical_tflops`` (flops_tracker.py: a table of GPU names and dtypes; the GPU here is 'cpu')."""
    return THEORETICAL_TFLOPS


class FlopsTracker:
    """The FLOPs tracker Policy.train resets and feeds (flops_tracker.py's FLOPTracker: FLOPs per sequence from the
    model's config, summed); here every token is ``per_token`` FLOPs."""

    def __init__(self, per_token: float):
        self.per_token, self.total_flops = per_token, 0.0

    def reset(self) -> None:
        self.total_flops = 0.0

    def track_batch(self, lengths: list[int]) -> None:
        self.total_flops += self.per_token * sum(lengths)


class Workers:
    """The Ray worker group ``Policy.train`` calls: each data-parallel shard trained by its own worker in its own
    thread (``run_all_workers_sharded_data`` / ``get_all_worker_results``)."""

    def __init__(self, workers: list[Any]):
        self.workers = workers
        self.cluster = types.SimpleNamespace(world_size=lambda: len(workers))     # one GPU per worker

    def run_all_workers_sharded_data(self, method: str, data: list, common_kwargs: dict, **_: Any) -> list:
        assert len(data) == len(self.workers)
        with on_cpu():
            return run_ranks(lambda r: getattr(self.workers[r], method)(data[r], **common_kwargs),
                             world=len(self.workers))

    def get_all_worker_results(self, futures: list) -> list:
        return futures


def grpo_statements(first: str, last: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """The statements of ``grpo_train`` (nemo_rl/algorithms/grpo.py) from the one whose source starts with
    ``first`` to the one that starts with ``last`` (same block), compiled from the file's text: a function that runs
    them in a namespace (the names they read) and returns it."""
    path, tree = _source("nemo_rl/algorithms/grpo.py")
    (fn,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "grpo_train"]
    text = vendored.provenance(FW).path("nemo_rl/algorithms/grpo.py").read_text(encoding="utf-8")
    lines = text.splitlines()

    def starts(node: ast.stmt, s: str) -> bool:
        return lines[node.lineno - 1].strip().startswith(s)

    for block in ast.walk(fn):
        body = getattr(block, "body", None)
        if not isinstance(body, list):
            continue
        i = next((k for k, n in enumerate(body) if starts(n, first)), None)
        if i is None:
            continue
        j = next(k for k, n in enumerate(body) if k >= i and starts(n, last))
        nodes = body[i:j + 1]
        code = compile(ast.fix_missing_locations(ast.Module(body=nodes, type_ignores=[])), path, "exec")

        def run(ns: dict[str, Any]) -> dict[str, Any]:
            exec(code, ns)                                     # noqa: S102 - the tag's own code
            return ns
        run.lines = (nodes[0].lineno, nodes[-1].end_lineno)   # type: ignore[attr-defined]
        return run
    raise AssertionError(f"grpo.py: no statement starting with {first!r} in grpo_train")


def grpo_functions(names: tuple[str, ...], ns: dict[str, Any]) -> dict[str, Any]:
    """Top-level functions of nemo_rl/algorithms/grpo.py compiled from its text into ``ns`` (the names they read)."""
    path, tree = _source("nemo_rl/algorithms/grpo.py")
    nodes = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in names]
    assert {n.name for n in nodes} == set(names), f"grpo.py lost one of {names}"
    return _exec(path, nodes, ns)


@functools.lru_cache(maxsize=None)
def validate() -> Callable[..., Any]:
    """grpo.py's ``validate`` (:3139-3291) with ``_should_use_nemo_gym`` and ``_should_use_async_rollouts``
    (:1646-1731), compiled from the file's text: the real Timer, run_multi_turn_rollout and
    get_keys_from_message_log; ``print_message_log_samples`` (it prints a few samples' text, inside a try) is a
    no-op; ``torch`` is :class:`TorchOnCPU` (``torch.cuda.empty_cache``)."""
    import gc
    from typing import Optional
    N = nemo()
    ns = grpo_functions(("validate", "_should_use_nemo_gym", "_should_use_async_rollouts"), {
        "Any": Any, "Optional": Optional, "gc": gc, "torch": N.torch, "Timer": N.timer.Timer,
        "run_multi_turn_rollout": N.rollouts.run_multi_turn_rollout,
        "run_async_multi_turn_rollout": N.rollouts.run_async_multi_turn_rollout,
        "run_async_nemo_gym_rollout": N.rollouts.run_async_nemo_gym_rollout,
        "get_keys_from_message_log": N.messages.get_keys_from_message_log,
        "print_message_log_samples": lambda *a, **k: None, "_get_effort_config": lambda cfg: None,
        "GenerationInterface": Any, "StatefulDataLoader": Any, "EnvironmentInterface": Any, "MasterConfig": Any,
        "Logger": Any})
    return ns["validate"]


#: entries covering v0.7.0 that no proof fingerprints, and why (the proofs: tests/frameworks/test_proof_nemo_rl.py)
ENTRY_WHY: dict[tuple[str, str, str | None], str] = {}
