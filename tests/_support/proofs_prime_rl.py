"""prime-rl v0.8.1.dev67's own trainer code, loaded from its vendored files (tests/data/frameworks/prime_rl, issue 33)
for the fidelity proofs in tests/frameworks/test_proof_prime_rl.py. Nothing here computes a metric.

What is loaded, by file (``vendored.load``, each as the module it is in its own package):

* ``src/prime_rl/trainer/rl/loss.py``: ``compute_loss``, ``default_loss_fn``, ``compute_entropy``,
  ``selective_log_softmax``, ``compute_importance_ratio_and_mismatch_kl``, ``shift_tensor_left/right``;
* ``src/prime_rl/trainer/utils.py``: ``Tensors`` (the all-gathered tensor statistics), ``flexible_all_gather``,
  ``filter_rl_trainer_tensor_stats_for_wandb``, ``clip_grad_norm_``, ``scale_gradients_``, ``begin/finish_backward``,
  ``prepare_gradient_offload``;
* ``src/prime_rl/trainer/perf.py``: ``get_perf_counter`` (``PerfCounter.get_step_tokens_per_second``/``get_step_mfu``);
* ``src/prime_rl/trainer/scheduler.py``: ``setup_linear_scheduler`` (torch's LinearLR warm-up);
* ``packages/prime-rl-configs/src/prime_rl/configs/trainer.py``: only the classes ``DefaultLossConfig``,
  ``IPOLossConfig``, ``CustomLossConfig`` and the alias ``LossConfig``, compiled from the file's own text (the file
  imports the whole config tree: monitors, shared, ``prime_rl.utils.config``), with ``BaseConfig`` bound to
  pydantic's ``BaseModel`` (prime-rl's BaseConfig is a pydantic model; the loss config's defaults are its fields');
* ``src/prime_rl/trainer/rl/train.py``: the body of the training loop of ``train()`` (``while True:``, lines 262-715,
  every statement of one step but ``if is_last_step: break``), compiled from the file's own text and executed once
  per simulated rank with the names ``train()`` set up before the loop bound to the pieces below. That is the
  composition itself: the global token counts (:307-323), the micro-batch loop (forward, log-probs and entropy from
  the logits, ``compute_loss``, backward, the tensors appended for logging: :337-549), clipping, optimizer and
  scheduler step (:560-573), ``tensors.compute_stats()`` (:623), the step metrics, the printed step line (:626-648)
  and every ``monitors.log`` call (:651-693);
* ``src/prime_rl/trainer/sft/train.py``: likewise the SFT loop's body (:441-696, all but the break), run for several
  steps, after the statements of ``train()`` that set up ``grad_accum_steps`` (:113-119), the context-parallel names
  and the nested ``compute_loss`` (:257-339), compiled from the file's text;
* ``src/prime_rl/orchestrator/orchestrator.py``: ``Orchestrator.finalize_train_batch`` and ``log_train_batch``
  compiled from the file's text (under its ``from __future__ import annotations``), called with a stand-in ``self``;
  ``src/prime_rl/orchestrator/metrics.py`` (``TrainEpisodes`` and its metrics, ``to_wandb``),
  ``orchestrator/algo/routing.py`` (``is_trainable``, ``scalar_advantage``), ``orchestrator/utils.py``
  (``episode_group_id``, ``episode_staleness``), loaded by file.

Stand-ins, each for an import or a set-up object the code under test does not compute a metric with:

* ``beartype`` / ``jaxtyping`` (not installed): runtime shape checks; ``jaxtyped`` is the identity and
  ``Float[...]``/``Int[...]``/``Bool[...]`` are ``Any``;
* ``prime_rl.utils.utils`` (``import_object``, ``get_step_path``), ``prime_rl.utils.pathing`` (``get_ckpt_dir``),
  ``prime_rl.utils.logger`` (``get_logger``): a custom loss's import, checkpoint paths, logging;
* ``prime_rl.trainer.world.get_world``: torchrun's process-wide environment variables; the simulated ranks are
  threads of one process, so each gets a ``world`` of its own (rank, world size);
* ``torchtitan.distributed.utils.clip_grad_norm_`` (not installed): for a model without expert parallelism and
  without DTensors it is ``torch.nn.utils.get_total_norm`` of the gradients followed by
  ``clip_grads_with_norm_``; the stand-in does exactly that, with a barrier between the two so that the ranks, which
  share one model (below), all read the norm before any of them clips;
* ``transformers.PretrainedConfig``, ``transformers.tokenization_utils.PreTrainedTokenizer``: annotations only;
  ``prime_rl.trainer.lora.has_lora_layers`` (False: the tiny model has no LoRA adapters) and
  ``prime_rl.trainer.models.layers.lora.MultiLoRAModule`` (an empty class) for perf.py;
* ``prime_rl.configs.trainer.SchedulerConfig``, ``prime_rl.trainer.optim`` (``OffloadOptimizer``): annotations and
  an ``isinstance`` of the CPU-offload wrapper, which is not used;
* ``verifiers.v1`` (not installed): the annotations orchestrator/utils.py evaluates and the two provenance classes
  its ``train_work`` checks (``TrainRunInfo``, ``TrainWorkInfo``); ``prime_rl.configs.algorithm``,
  ``prime_rl.transports.rollouts`` (routing.py's loss-routing helper), ``prime_rl.configs.orchestrator``,
  ``prime_rl.utils.client`` (utils.py's inference-pool set-up): not used by the metric code.

What the training loop is given instead of what ``train()`` builds before it (no GPU, no FSDP, no model weights):

* a tiny causal LM (an embedding and a linear head, ``model.config`` with the sizes perf.py reads), shared by the
  simulated ranks: their backward passes accumulate into its ``.grad``, which is what FSDP's reduce-scatter of the
  ranks' gradients holds after train.py undoes FSDP's averaging (``fsdp_gradient_divide_factor``: 1 here, as no
  averaging happened); ``forward`` returns its logits (the ``VanillaOutputLinear`` path, train.py:436-443), so the
  log-probs and the entropy are computed by loss.py's own functions;
* ``config.enable_token_export = True`` for its ``dist.barrier()`` after the micro-batch loop (train.py:551-553): the
  ranks' backward passes into the shared model are done before any rank clips (the export itself is a stand-in that
  records what the loop hands it: ``out`` with the per-token log-probs and entropy, the micro-batch);
* ``torch.distributed`` (train.py's ``dist`` and utils.py's ``dist``): :class:`PrimeDist`, the threads' collectives
  (all_reduce, all_gather, all_gather_object, barrier) meeting at a barrier;
* ``torch`` in the loop's namespace: the real module, except that a tensor asked for ``device="cuda"`` stays on the
  CPU and ``torch.cuda`` is a stand-in (reset/read the peak memory counter, ``empty_cache``); the micro-batches'
  tensors are :class:`CudaOnCpu` (``.to("cuda")`` and ``.cuda()`` keep them on the CPU; every op on them keeps the
  type), as are the values derived from them;
* ``time``: a clock (:class:`Clock`) that gives each ``time.perf_counter()`` call a new reading and records the line
  of train.py that asked, so the timings and rates are numbers computed from known readings;
* the data loader (this rank's micro-batches), the optimizer (``torch.optim.SGD`` over the shared model, one per
  rank, with the real warm-up scheduler), the weight broadcast and checkpoint manager (record calls only), the
  monitors (record every ``monitors.log`` call; the proofs read rank 0's: only rank 0 registers monitors,
  monitors/__init__.py:58-61, read and not run, as its MONITORS list is one per process) and the logger (records the
  ``logger.success`` step line);
* PerfCounter's peak FLOPs: perf.py reads them from the CUDA device's name (perf.py:36-37); the proofs set them from
  its own table for an H100 (``_get_peak_flops``), the device a real run would name;
* the SFT trainer: each rank its own copy of the model (its gradients are not reduced over the ranks, which only
  all-reduce the loss and token counts the loop itself all-reduces), its own ``PerfCounter`` (perf.py keeps one per
  process, perf.py:237-245) whose ``time`` is each rank's clock, a dataset stand-in (``step``, ``epoch``,
  ``num_samples``/``num_tokens`` per subset: sft/data.py's packing dataset needs a tokenizer and a data set) and a
  ``CrossEntropyLoss`` that records the per-token losses it computes;
* the orchestrator: verifiers' episodes and traces as plain records (:class:`Obj`) with the fields metrics.py and
  orchestrator.py read; ``self`` of ``Orchestrator`` with its progress, a packer and sender that pass the samples on,
  no checkpoint, no hold for the policy (its version is ahead), one train environment.
"""
from __future__ import annotations

import ast
import asyncio
import contextlib
import functools
import re
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from _support import vendored
from _support.framework_code import SimDist, current_rank, run_ranks

FW = "prime_rl"
RELEASE = vendored.release(FW)
TRAIN = "src/prime_rl/trainer/rl/train.py"
LOSS = "src/prime_rl/trainer/rl/loss.py"
UTILS = "src/prime_rl/trainer/utils.py"
PERF = "src/prime_rl/trainer/perf.py"
SCHED = "src/prime_rl/trainer/scheduler.py"
CONFIGS = "packages/prime-rl-configs/src/prime_rl/configs/trainer.py"
S = vendored.stand_in
#: the clock's increments, one per perf_counter() call of a step (train.py asks 12 times: :269, 281, 283, 288, 290,
#: 298, 573, 588, 594, 610, 612, 637); the forward-backward interval (:298 -> :573) is 3.1 ns so that the MFU of the
#: tiny model prints as a readable percentage
CLOCK_STEPS = (0.013, 2.1e-3, 0.0071, 1.3e-3, 0.29, 0.043, 3.1e-9, 0.0131, 2.1e-5, 0.0071, 1.3e-4, 0.29)


# --------------------------------------------------------------------------------------------- device stand-ins
class CudaOnCpu(torch.Tensor):
    """A CPU tensor that ``.to("cuda")`` / ``.cuda()`` leave where it is (every op on it keeps the type)."""

    def to(self, *args: Any, **kwargs: Any) -> Any:                       # type: ignore[override]
        dev = args[0] if args else kwargs.get("device")
        if isinstance(dev, (str, torch.device)) and str(dev).startswith("cuda"):
            return self
        return super().to(*args, **kwargs)

    def cuda(self, *args: Any, **kwargs: Any) -> Any:                     # type: ignore[override]
        return self

    def __format__(self, spec: str) -> str:       # as torch.Tensor formats a plain 0-d tensor (its item)
        return self.item().__format__(spec) if self.dim() == 0 else super().__format__(spec)


def on_device(t: torch.Tensor) -> CudaOnCpu:
    return t.as_subclass(CudaOnCpu)


class TorchOnCpu(types.ModuleType):
    """train.py's ``torch``: the real module, but ``device="cuda"`` stays on the CPU and ``torch.cuda`` is a stand-in
    whose peak-memory counter reads ``peak_bytes``."""

    def __init__(self, peak_bytes: int):
        super().__init__("torch")
        self.cuda = S("torch.cuda", reset_peak_memory_stats=lambda: None, empty_cache=lambda: None,
                      max_memory_reserved=lambda: peak_bytes, is_available=lambda: False)

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)

    def tensor(self, *args: Any, device: Any = None, **kwargs: Any) -> CudaOnCpu:
        return on_device(torch.tensor(*args, **kwargs))


class PrimeDist(SimDist):
    """``torch.distributed`` as train.py and utils.py call it, over the simulated ranks (threads)."""

    def get_rank(self, group: Any = None) -> int:
        return current_rank()[1]

    def barrier(self, group: Any = None) -> None:
        g, r = current_rank()
        g.exchange(r, None)

    def all_gather(self, out: list, t: torch.Tensor, group: Any = None) -> None:
        g, r = current_rank()
        for slot, part in zip(out, g.exchange(r, t.detach().clone())):
            slot.copy_(part)

    def all_gather_object(self, out: list, obj: Any, group: Any = None) -> None:
        g, r = current_rank()
        out[:] = g.exchange(r, obj)


class Clock:
    """``time`` for train.py: every ``perf_counter()`` call gets a new, unevenly spaced reading, recorded with the
    line of train.py that asked for it."""

    def __init__(self, start: float, steps: list[float]):
        self.now, self.steps, self.readings = start, list(steps), []

    def perf_counter(self) -> float:
        self.now += self.steps[len(self.readings) % len(self.steps)]
        self.readings.append((sys._getframe(1).f_lineno, self.now))
        return self.now

    def at(self, line: int, occurrence: int | None = None) -> float:
        """The reading asked for at ``line`` (its ``occurrence``-th, when the line ran more than once)."""
        hits = [v for ln, v in self.readings if ln == line]
        assert hits and (occurrence is not None or len(hits) == 1), (line, self.readings)
        return hits[occurrence or 0]


# --------------------------------------------------------------------------------------------- loading
class _Ann:
    def __getitem__(self, item: Any) -> Any:
        return Any


def _jaxtyped(fn: Any = None, **_: Any) -> Any:
    return fn if callable(fn) else (lambda f: f)


def _typing_stand_ins() -> dict[str, types.ModuleType]:
    return {"beartype": S("beartype", beartype=lambda f: f),
            "jaxtyping": S("jaxtyping", Bool=_Ann(), Float=_Ann(), Int=_Ann(), jaxtyped=_jaxtyped)}


def _classes_from_source(repo_path: str, names: list[str], namespace: dict[str, Any]) -> dict[str, Any]:
    """The top-level classes and assignments ``names`` of a vendored file, compiled from its own text."""
    path = vendored.provenance(FW).path(repo_path)
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))

    def name_of(n: ast.stmt) -> str | None:
        if isinstance(n, ast.ClassDef):
            return n.name
        if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name):
            return n.target.id
        return None
    wanted = [n for n in tree.body if name_of(n) in names]
    missing = set(names) - {name_of(n) for n in wanted}
    if missing:
        raise ImportError(f"{path}: no {sorted(missing)}")
    exec(compile(ast.Module(body=wanted, type_ignores=[]), str(path), "exec"), namespace)   # noqa: S102
    return {n: namespace[n] for n in names}


def _methods_from_source(repo_path: str, cls: str, names: list[str], namespace: dict[str, Any]) -> dict[str, Any]:
    """The methods ``cls.<name>`` (async ones too) of a vendored file, compiled from its own text under its
    ``from __future__ import annotations``, into ``namespace``."""
    import __future__
    path = vendored.provenance(FW).path(repo_path)
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    body = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls).body
    wanted = [n for n in body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name in names]
    missing = set(names) - {n.name for n in wanted}
    if missing:
        raise ImportError(f"{path}: {cls} has no {sorted(missing)}")
    code = compile(ast.Module(body=wanted, type_ignores=[]), str(path), "exec",
                   flags=__future__.annotations.compiler_flag, dont_inherit=True)
    exec(code, namespace)                                                   # noqa: S102 - the tag's own code
    return {n: namespace[n] for n in names}


def _loop_body(repo_path: str = TRAIN) -> types.CodeType:
    """The statements of one step of train()'s ``while True:`` loop, all but ``if is_last_step: break``, compiled
    from the file's own text (line numbers kept)."""
    path = vendored.provenance(FW).path(repo_path)
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "train")
    loop = next(n for n in fn.body if isinstance(n, ast.While))
    end = next(i for i, n in enumerate(loop.body) if isinstance(n, ast.If) and isinstance(n.test, ast.Name)
               and n.test.id == "is_last_step" and isinstance(n.body[0], ast.Break))
    # everything but the break (the loop's last statement, ``progress.step += 1``, moves to the next step)
    return compile(ast.Module(body=loop.body[:end] + loop.body[end + 1:], type_ignores=[]), str(path), "exec")


@functools.lru_cache(maxsize=None)
def prime() -> types.SimpleNamespace:
    from typing import Annotated, Literal, TypeAlias

    import pydantic

    cfg_ns: dict[str, Any] = {"BaseConfig": pydantic.BaseModel, "Field": pydantic.Field, "Literal": Literal,
                              "Any": Any, "Annotated": Annotated, "TypeAlias": TypeAlias}
    cfg = _classes_from_source(CONFIGS, ["DefaultLossConfig", "IPOLossConfig", "CustomLossConfig", "LossConfig"],
                               cfg_ns)
    for c in cfg.values():
        if isinstance(c, type) and issubclass(c, pydantic.BaseModel):
            c.model_rebuild(_types_namespace=cfg_ns)     # the names the file's own module imports
    configs = S("prime_rl.configs.trainer", SchedulerConfig=object, **cfg)
    logger = S("prime_rl.utils.logger", get_logger=lambda: _NullLogger())
    utils_utils = S("prime_rl.utils.utils", import_object=None, get_step_path=None)
    world = S("prime_rl.trainer.world", get_world=lambda: _world())
    loss = vendored.load(FW, LOSS, "prime_rl.trainer.rl.loss", stand_ins={
        **_typing_stand_ins(), "prime_rl.configs.trainer": configs, "prime_rl.utils.utils": utils_utils})
    utils = vendored.load(FW, UTILS, "prime_rl.trainer.utils", stand_ins={
        "torchtitan.distributed.utils": S("torchtitan.distributed.utils", clip_grad_norm_=_clip_grad_norm_),
        "transformers.tokenization_utils": S("transformers.tokenization_utils", PreTrainedTokenizer=object),
        "prime_rl.trainer.world": world, "prime_rl.utils.logger": logger,
        "prime_rl.utils.pathing": S("prime_rl.utils.pathing", get_ckpt_dir=None),
        "prime_rl.utils.utils": utils_utils})
    utils.dist = PrimeDist()                                  # the simulated data-parallel group
    perf = vendored.load(FW, PERF, "prime_rl.trainer.perf", stand_ins={
        "transformers": S("transformers", PretrainedConfig=object),
        "prime_rl.trainer.lora": S("prime_rl.trainer.lora", has_lora_layers=lambda model: False),
        "prime_rl.trainer.models.layers.lora": S("prime_rl.trainer.models.layers.lora",
                                                 MultiLoRAModule=type("MultiLoRAModule", (), {})),
        "prime_rl.trainer.world": world, "prime_rl.utils.logger": logger})
    sched = vendored.load(FW, SCHED, "prime_rl.trainer.scheduler", stand_ins={
        "prime_rl.configs.trainer": configs,
        "prime_rl.trainer.optim": S("prime_rl.trainer.optim", OffloadOptimizer=type("OffloadOptimizer", (), {}),
                                    OptimizerLike=object)})
    return types.SimpleNamespace(loss=loss, utils=utils, perf=perf, scheduler=sched, configs=configs,
                                 loop=_loop_body())


class _NullLogger:
    def __getattr__(self, name: str) -> Any:
        return lambda *a, **k: None


def _world() -> types.SimpleNamespace:
    group, rank = current_rank()
    return types.SimpleNamespace(rank=rank, world_size=group.world, local_rank=rank, local_world_size=group.world,
                                 num_nodes=1, is_master=rank == 0)


GRADS_SEEN: list[tuple[int, list[torch.Tensor]]] = []    # (rank, the gradients a clip_grad_norm_ call was given)


def _clip_grad_norm_(parameters: Any, max_norm: float, ep_enabled: bool = False, norm_type: float = 2.0) -> Any:
    """torchtitan's clip_grad_norm_ without expert parallelism or DTensors: the total norm, then the clip (a barrier
    between: the simulated ranks share one model's gradients)."""
    assert not ep_enabled
    dist = PrimeDist()
    dist.barrier()                          # every rank's backward has accumulated into the shared gradients
    params = [p for p in parameters if p.grad is not None]
    GRADS_SEEN.append((current_rank()[1], [p.grad.detach().clone().as_subclass(torch.Tensor) for p in params]))
    total = torch.nn.utils.get_total_norm([p.grad for p in params], norm_type)
    dist.barrier()
    if current_rank()[1] == 0:              # the one gradient clipped once (threads never write it at once)
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
    dist.barrier()
    return on_device(total)


class _SharedStep:
    """A rank's optimizer over the one model the simulated ranks share: ``step`` and ``zero_grad`` run once, on rank
    0, between barriers (as FSDP's ranks each update their own shard once), so no two threads write the parameters
    or the gradients at once; everything else is the rank's own optimizer (its scheduler reads its lr)."""

    def __init__(self, optimizer: Any) -> None:
        self._optimizer = optimizer

    def __getattr__(self, name: str) -> Any:
        return getattr(self._optimizer, name)

    def _once(self, fn: Any, *a: Any, **k: Any) -> Any:
        dist = PrimeDist()
        dist.barrier()
        out = fn(*a, **k) if current_rank()[1] == 0 else None
        dist.barrier()
        return out

    def step(self, *a: Any, **k: Any) -> Any:
        return self._once(self._optimizer.step, *a, **k)

    def zero_grad(self, *a: Any, **k: Any) -> Any:
        return self._once(self._optimizer.zero_grad, *a, **k)


# --------------------------------------------------------------------------------------------- one training step
@dataclass
class MicroBatch:
    """One packed micro-batch as prime-rl's data loader gives it: ``lengths`` the packed samples' lengths (the last
    one padding when ``pad``), ``prompt`` each sample's prompt tokens (not loss-masked)."""
    lengths: list[int]
    prompt: list[int]
    pad: int = 0


@dataclass
class StepRun:
    rank0_logs: list[dict[str, Any]]             # every monitors.log call of rank 0, in order
    step_lines: list[str]                        # rank 0's logger.success lines
    exported: list[list[dict[str, Any]]]         # [rank][micro step] what the loop handed the token exporter
    clocks: list[Clock]
    namespaces: list[dict[str, Any]]
    inputs: list[list[dict[str, Any]]]           # [rank][micro step] the micro-batch given
    peak_bytes: list[int]
    model: Any
    config: Any
    world: int
    lr_before: list[float]                       # [rank] the optimizer's lr before the step's scheduler.step()
    lr_after: list[float]                        # [rank] the scheduler's last lr after it
    grads: list[list[torch.Tensor]]              # [rank] what its clip_grad_norm_ was given
    perf_counter: Any

    @property
    def logged(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for d in self.rank0_logs:
            out.update(d)
        return out


class TinyLM(torch.nn.Module):
    def __init__(self, vocab: int, hidden: int):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, hidden)
        self.head = torch.nn.Linear(hidden, vocab)
        torch.nn.init.normal_(self.head.weight, std=1.5)      # peaked next-token distributions: entropies spread
        self.config = types.SimpleNamespace(vocab_size=vocab, hidden_size=hidden, num_attention_heads=2,
                                            num_key_value_heads=2, num_hidden_layers=1, intermediate_size=2 * hidden)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.embed(input_ids)))


def make_micro_batch(mb: MicroBatch, vocab: int, gen: torch.Generator, env: str) -> dict[str, Any]:
    width = sum(mb.lengths)
    ids = torch.randint(0, vocab, (1, width), generator=gen)
    mask = torch.zeros(1, width, dtype=torch.bool)
    adv = torch.zeros(1, width)
    pos, at = [], 0
    n_samples = len(mb.lengths) - (1 if mb.pad else 0)
    for i, n in enumerate(mb.lengths):
        pos += list(range(n))
        if i < n_samples:
            mask[0, at + mb.prompt[i]:at + n] = True
            adv[0, at:at + n] = float(torch.empty(()).uniform_(-1.5, 1.5, generator=gen))
        at += n
    # inference log-probs: the sampler's, of other values than the trainer's (mismatch KL of O(0.1))
    inf = torch.log(torch.empty(1, width).uniform_(0.02, 0.6, generator=gen))
    temps = torch.full((1, width), 1.0)
    return {"input_ids": on_device(ids), "position_ids": on_device(torch.tensor([pos])),
            "advantages": on_device(adv), "loss_mask": on_device(mask), "inference_logprobs": on_device(inf),
            "ref_logprobs": None, "rl_weights": None, "ce_weights": None, "ref_kl_weights": None,
            "routed_experts": None, "seq_lens": on_device(torch.tensor(mb.lengths)),
            "temperatures": on_device(temps), "sequence_lengths": list(mb.lengths),
            "env_names": [env] * width}


def run_step(layout: list[list[MicroBatch]], *, vocab: int = 11, lr: float = 3e-4, warmup_steps: int = 4,
             max_norm: float = 1.0, peak_gib: tuple[float, ...] = (5.5, 3.0, 9.0), seed: int = 7,
             clock_steps: tuple[float, ...] = CLOCK_STEPS,
             tmp: Path | None = None) -> StepRun:
    """One training step of train.py's loop on every simulated rank (``layout[rank]``: its micro-batches)."""
    P = prime()
    world = len(layout)
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    model = TinyLM(vocab, 8)
    inputs = [[make_micro_batch(mb, vocab, gen, env="math" if (r + u) % 2 else "code")
               for u, mb in enumerate(rank)] for r, rank in enumerate(layout)]
    widths = {sum(mb.lengths) for rank in layout for mb in rank}
    assert len(widths) == 1, f"prime-rl packs every micro-batch to one seq_len: {widths}"
    seq_len = widths.pop()
    config = types.SimpleNamespace(
        memory_profiler_path=None, enable_router_replay=False, enable_token_export=True,
        model=types.SimpleNamespace(cp_style=None, lora=None, vlm=None, ac_offloading=False),
        loss=P.configs.DefaultLossConfig(), optim=types.SimpleNamespace(max_norm=max_norm),
        weight_broadcast=types.SimpleNamespace(type="filesystem"), max_steps=None,
        ckpt=types.SimpleNamespace(interval=1), output_dir=tmp)
    peak_bytes = [int(g * 1024**3) for g in peak_gib[:world]]
    P.perf._PERF_COUNTER = None
    with _as_rank(world):
        counter = P.perf.get_perf_counter(model, seq_len)
    # the peak FLOPs PerfCounter reads from the CUDA device's name (perf.py:36-37); this CPU has none
    counter.gpu_peak_flops = counter._get_peak_flops("NVIDIA H100 80GB HBM3")
    clocks = [Clock(100.0 + 10 * r, [s * (1 + 0.1 * r) for s in clock_steps]) for r in range(world)]
    exported: list[list[dict[str, Any]]] = [[] for _ in range(world)]
    logs: list[list[dict[str, Any]]] = [[] for _ in range(world)]
    lines: list[list[str]] = [[] for _ in range(world)]
    namespaces: list[dict[str, Any]] = [{} for _ in range(world)]
    dist = PrimeDist()
    lr_before: list[float] = [0.0] * world
    schedulers: list[Any] = [None] * world
    GRADS_SEEN.clear()

    def rank_fn(rank: int) -> None:
        optimizer = torch.optim.SGD(model.parameters(), lr=lr)
        scheduler = P.scheduler.setup_linear_scheduler(optimizer, None, warmup_steps, 0, lr, 0.0)
        lr_before[rank] = optimizer.param_groups[0]["lr"]
        schedulers[rank] = scheduler

        async def log(metrics: dict[str, Any], step: int | None = None, *a: Any, **k: Any) -> None:
            logs[rank].append(dict(metrics))

        def export(step: int, micro_step: int, micro_batch: dict, out: dict, sequence_lengths: list, cfg: Any):
            exported[rank].append({"step": step, "micro_step": micro_step,
                                   "logprobs": out["logprobs"].detach().clone().as_subclass(torch.Tensor),
                                   "entropy": out["entropy"].detach().clone().as_subclass(torch.Tensor),
                                   "sequence_lengths": list(sequence_lengths)})

        class Logger(_NullLogger):
            def success(self, msg: str) -> None:
                lines[rank].append(msg)

        group = types.SimpleNamespace(get_group=lambda: None, size=lambda: world, get_local_rank=lambda: rank)
        ns = namespaces[rank]
        ns.update({
            "torch": TorchOnCpu(peak_bytes[rank]), "dist": dist, "time": clocks[rank], "asyncio": asyncio,
            "config": config, "model": model, "optimizer": _SharedStep(optimizer), "scheduler": scheduler,
            "gradient_manager": None, "logger": Logger(), "world": _world(),
            "parallel_dims": types.SimpleNamespace(get_mesh=lambda name: group, fsdp_gradient_divide_factor=1.0,
                                                   cp_enabled=False, cp=1, ep_enabled=False, world_mesh=None),
            "progress": types.SimpleNamespace(step=1, total_tokens=0, total_samples=0), "start_step": 1,
            "gc_handler": None, "max_peak_memory": 0.0, "metrics_server": None, "heart": None,
            "dataloader": types.SimpleNamespace(wait_for_batch=lambda: None, get_batch=lambda: inputs[rank]),
            "weight_broadcast": types.SimpleNamespace(broadcast_weights=lambda model, step: None,
                                                      maybe_clean=lambda step, keep: None),
            "ckpt_manager": types.SimpleNamespace(save=lambda *a, **k: None, maybe_clean=lambda: None),
            "token_exporter": types.SimpleNamespace(export=export, mark_stable=lambda: None),
            "monitors": types.SimpleNamespace(log=log),
            "maybe_record_function": contextlib.nullcontext,
            "maybe_activation_offloading": lambda enabled: contextlib.nullcontext(),
            "forward": lambda model, input_ids, position_ids, **kw: {"logits": model(input_ids)},
            "is_tt_moe_model": lambda model: False, "get_load_balance_stats": None,
            "get_ckpt_disk_metrics": lambda output_dir: {},        # the machine's disk usage (no entry)
            "format_time": lambda s: f"{s:.2f}s",                  # the step line's unlabelled time (no entry)
            "Tensors": P.utils.Tensors, "prepare_gradient_offload": P.utils.prepare_gradient_offload,
            "begin_backward": P.utils.begin_backward, "finish_backward": P.utils.finish_backward,
            "scale_gradients_": P.utils.scale_gradients_, "clip_grad_norm_": P.utils.clip_grad_norm_,
            "filter_rl_trainer_tensor_stats_for_wandb": P.utils.filter_rl_trainer_tensor_stats_for_wandb,
            "get_perf_counter": P.perf.get_perf_counter, "compute_loss": P.loss.compute_loss,
            "compute_entropy": P.loss.compute_entropy, "selective_log_softmax": P.loss.selective_log_softmax,
            "compute_importance_ratio_and_mismatch_kl": P.loss.compute_importance_ratio_and_mismatch_kl,
            "shift_tensor_left": P.loss.shift_tensor_left, "shift_tensor_right": P.loss.shift_tensor_right,
            "rl_loss_fn": P.loss.setup_rl_loss_fn(config.loss),
        })
        exec(P.loop, ns)                                          # noqa: S102 - train.py's own statements

    with torch.compiler.set_stance("force_eager"):      # loss.py's @torch.compile functions, run as written
        run_ranks(rank_fn, world=world)
    return StepRun(logs[0], lines[0], exported, clocks, namespaces, inputs, peak_bytes, model, config, world,
                   lr_before, [s.get_last_lr()[0] for s in schedulers],
                   [next(g for r, g in GRADS_SEEN if r == rank) for rank in range(world)], counter)


@contextlib.contextmanager
def _as_rank(world: int):
    """Rank 0 of a ``world``-rank group in this thread (for set-up calls that ask for the world)."""
    from _support import framework_code as fc
    old = dict(vars(fc._current))
    fc._current.group, fc._current.rank = fc.Group(world), 0
    try:
        yield
    finally:                    # as it was: a thread that was no rank is none again (current_rank() then raises)
        vars(fc._current).clear()
        vars(fc._current).update(old)




# --------------------------------------------------------------------------------------------- the orchestrator
ORCH = "src/prime_rl/orchestrator/orchestrator.py"
METRICS = "src/prime_rl/orchestrator/metrics.py"
ROUTING = "src/prime_rl/orchestrator/algo/routing.py"
ORCH_UTILS = "src/prime_rl/orchestrator/utils.py"


class Obj(types.SimpleNamespace):
    """A verifiers v1 record (``vf.Trace``, ``vf.Episode``: pydantic models) as the orchestrator reads it."""

    def model_copy(self, update: dict[str, Any] | None = None) -> "Obj":
        return type(self)(**{**vars(self), **(update or {})})


class _TrainRunInfo(Obj):
    pass


class _TrainWorkInfo(Obj):
    pass


def _verifiers() -> types.ModuleType:
    """``verifiers.v1`` (not installed): the annotations utils.py evaluates, and the two classes its train_work()
    checks episodes' provenance with."""
    return S("verifiers.v1", Episode=_Ann(), Trace=_Ann(), Branch=_Ann(), TrainRunInfo=_TrainRunInfo,
             TrainWorkInfo=_TrainWorkInfo, EvalWorkInfo=type("EvalWorkInfo", (Obj,), {}))


@functools.lru_cache(maxsize=None)
def orchestrator() -> types.SimpleNamespace:
    """metrics.py (TrainEpisodes and its metrics), algo/routing.py (is_trainable, scalar_advantage), utils.py
    (episode_group_id, episode_staleness), and Orchestrator.finalize_train_batch / log_train_batch compiled from
    orchestrator.py's own text. Stand-ins: ``verifiers.v1`` (above); ``prime_rl.configs.algorithm``,
    ``prime_rl.transports.rollouts`` (routing.py's loss-routing helper, not used), ``prime_rl.configs.orchestrator``,
    ``prime_rl.utils.client``, ``prime_rl.utils.logger``, ``prime_rl.utils.utils`` (utils.py's inference-pool set-up,
    logging and paths, not used)."""
    vf = _verifiers()
    vfs = {"verifiers": S("verifiers", v1=vf), "verifiers.v1": vf}      # `import verifiers.v1 as vf` reads both
    logger = S("prime_rl.utils.logger", get_logger=lambda: _NullLogger(), InterceptHandler=object,
               setup_logger=None)
    routing = vendored.load(FW, ROUTING, "prime_rl.orchestrator.algo.routing", stand_ins={
        **vfs, "prime_rl.configs.algorithm": S("prime_rl.configs.algorithm", ActionLossType=object),
        "prime_rl.transports.rollouts": S("prime_rl.transports.rollouts", TrainingSample=object)})
    outils = vendored.load(FW, ORCH_UTILS, "prime_rl.orchestrator.utils", stand_ins={
        **vfs, "prime_rl.configs.orchestrator": S("prime_rl.configs.orchestrator",
                                                               OrchestratorConfig=object),
        "prime_rl.utils.client": S("prime_rl.utils.client", InferencePool=object), "prime_rl.utils.logger": logger,
        "prime_rl.utils.utils": S("prime_rl.utils.utils", get_broadcast_dir=None, get_ckpt_dir=None,
                                  get_step_path=None)})
    metrics = vendored.load(FW, METRICS, "prime_rl.orchestrator.metrics", stand_ins={
        **vfs, "prime_rl.orchestrator.algo.routing": routing, "prime_rl.orchestrator.utils": outils})
    path = vendored.provenance(FW).path(ORCH)
    text = path.read_text(encoding="utf-8")
    lag = int(re.search(r"^TARGET_LAG = (\d+)$", text, re.M).group(1))
    empty = int(re.search(r"^MAX_CONSECUTIVE_EMPTY_BATCHES = (\d+)$", text, re.M).group(1))
    return types.SimpleNamespace(metrics=metrics, routing=routing, utils=outils, vf=vf, path=path,
                                 target_lag=lag, max_empty=empty)


def make_trace(i: int, *, reward: float, n_in: int, n_out: int, advantage: float, error: bool = False,
               truncated: bool = False, agent: str = "policy") -> Obj:
    timing = Obj(**{k: Obj(duration=0.1 * (i + 1)) for k in ("setup", "finalize", "scoring")},
                 agent=Obj(duration=0.2, model=Obj(duration=0.15), harness=Obj(duration=0.05)))
    return Obj(id=f"t{i}", reward=reward, num_input_tokens=n_in, num_output_tokens=n_out,
               num_total_tokens=n_in + n_out, num_turns=1 + i % 3, num_branches=1, is_truncated=truncated,
               is_completed=not truncated, has_error=error, stop_condition="length" if truncated else "stop",
               last_error=Obj(type="EnvError") if error else None, agent=Obj(name=agent, trainable=True),
               timing=timing, metrics={}, rewards={}, info={}, nodes=[Obj(advantages=[advantage] * n_out)])


def make_episode(i: int, trace: Obj, group: str, env: str = "math", start: int = 0) -> Obj:
    return Obj(id=f"e{i}", ok=not trace.has_error, traces=[trace], group=Obj(id=group), env=Obj(name=env),
               run=_TrainRunInfo(work=_TrainWorkInfo(policy=Obj(start=start, end=start))))


@dataclass
class OrchestratorRun:
    logs: list[tuple[Any, ...]]                  # every monitors.log call: (metrics or episodes, step, *args)
    lines: list[str]                             # get_logger().success lines
    clock: Clock
    progress: Any

    def step_metrics(self, step: int) -> dict[str, Any]:
        hits = [a[0] for a in self.logs if isinstance(a[0], dict) and a[0].get("step") == step and
                "progress/tokens" in a[0]]
        assert len(hits) == 1, (step, len(hits))
        return hits[0]


def run_orchestrator(batches: list[tuple[list[Obj], set[str], set[str], set[str]]]) -> OrchestratorRun:
    """Orchestrator.finalize_train_batch (with its log_train_batch) on each batch in turn: (the step's arrived
    episodes, the sampled trace ids, the admitted and the cancelled episode ids); the shipped cohort is the
    admitted, not cancelled episodes."""
    orch = orchestrator()
    logs: list[tuple[Any, ...]] = []
    lines: list[str] = []
    clock = Clock(500.0, [0.7, 0.0031, 1.9, 0.012])

    class Logger(_NullLogger):
        def success(self, msg: str) -> None:
            lines.append(msg)

    async def log(*args: Any, **kw: Any) -> None:
        logs.append(args if "step" not in kw else (args[0], kw["step"], *args[1:]))

    async def send(grid: Any) -> None:
        return None

    async def no_ckpt(step: int) -> float:
        return 0.0

    ns: dict[str, Any] = {
        "time": clock, "asyncio": asyncio, "monitors": S("prime_rl.monitors", log=log),
        "is_trainable": orch.routing.is_trainable, "TrainEpisodes": orch.metrics.TrainEpisodes,
        "episode_group_id": orch.utils.episode_group_id, "episode_staleness": orch.utils.episode_staleness,
        "trim_process_memory": lambda: None, "get_logger": lambda: Logger(),
        "format_time": lambda s: f"{s:.2f}s",                 # the step line's unlabelled time (no entry)
        "TARGET_LAG": orch.target_lag, "MAX_CONSECUTIVE_EMPTY_BATCHES": orch.max_empty,
    }
    methods = _methods_from_source(ORCH, "Orchestrator", ["finalize_train_batch", "log_train_batch"], ns)
    progress = types.SimpleNamespace(step=1, total_tokens=0, total_samples=0, total_problems=0)
    self = types.SimpleNamespace(
        config=types.SimpleNamespace(max_steps=None), progress=progress, last_batch_at=None,
        consecutive_empty_batches=0, policy=types.SimpleNamespace(version=10**6), version_advanced=None,
        wait_for_policy_time=0.0, packer=types.SimpleNamespace(pack=lambda samples: [samples]),
        sender=types.SimpleNamespace(send=send), update_dispatch_gate=lambda: None, maybe_save_ckpt=no_ckpt,
        train_sink=types.SimpleNamespace(stale_drops=0), train_source=types.SimpleNamespace(metrics=lambda: {}),
        heart=None, maybe_trigger_eval=lambda step: None, draining=False, train_envs=[object()])
    self.log_train_batch = types.MethodType(methods["log_train_batch"], self)
    for episodes, sampled, admitted, cancelled in batches:
        window = orch.metrics.TrainEpisodes(list(episodes), set(sampled), set(admitted), set(cancelled))
        shipped = [e for e in episodes if e.id in admitted and e.id not in cancelled]
        cohort = orch.metrics.TrainEpisodes(shipped, set(sampled), set(admitted), set(cancelled))
        batch = types.SimpleNamespace(episodes=window, cohort=cohort, samples=[object()])
        asyncio.run(methods["finalize_train_batch"](self, batch))
    return OrchestratorRun(logs, lines, clock, progress)


# --------------------------------------------------------------------------------------------- the SFT trainer
SFT = "src/prime_rl/trainer/sft/train.py"


def _train_statements(repo_path: str, lines: tuple[int, int]) -> types.CodeType:
    """The top-level statements of ``train()`` in the vendored file that lie within ``lines`` (inclusive), compiled
    from its own text."""
    path = vendored.provenance(FW).path(repo_path)
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "train")
    body = [n for n in fn.body if lines[0] <= n.lineno and n.end_lineno <= lines[1]]
    assert body, (repo_path, lines)
    return compile(ast.Module(body=body, type_ignores=[]), str(path), "exec")


class RankClock:
    """perf.py's ``time`` (one module for the simulated ranks): each rank's own :class:`Clock`."""

    def __init__(self, clocks: list[Clock]):
        self.clocks = clocks

    def perf_counter(self) -> float:
        clock = self.clocks[current_rank()[1]]
        clock.now += clock.steps[len(clock.readings) % len(clock.steps)]
        clock.readings.append((sys._getframe(1).f_lineno, clock.now))
        return clock.now


@dataclass
class SftRun:
    logs: list[list[dict[str, Any]]]             # [step] rank 0's monitors.log calls
    lines: list[str]                             # rank 0's step lines
    token_losses: list[list[list[torch.Tensor]]]  # [step][rank] the per-token cross-entropy of each micro-batch
    masks: list[list[list[torch.Tensor]]]        # [step][rank] each micro-batch's loss mask
    clocks: list[Clock]
    perf_clocks: list[Clock]
    lr_before: list[list[float]]                 # [step][rank] the lr the optimizer step used
    grads: list[list[torch.Tensor]]              # [step] what rank 0's clip_grad_norm_ was given
    peak_bytes: list[int]
    counters: list[Any]
    config: Any
    world: int

    def logged(self, step: int) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for d in self.logs[step - 1]:
            out.update(d)
        return out


def run_sft(samples: list[list[list[int]]], *, steps: int = 3, seq_len: int = 16, vocab: int = 11,
            lr: float = 2e-4, warmup_steps: int = 5, max_norm: float = 1.0, seed: int = 5,
            peak_gib: tuple[float, ...] = (6.5, 2.0, 12.5),
            clock_steps: tuple[float, ...] = (0.011, 3.7e-9, 0.002, 4.1e-9, 0.05),
            tmp: Path | None = None) -> SftRun:
    """``steps`` steps of trainer/sft/train.py's loop on every simulated rank; ``samples[rank]``: the loss-mask
    lengths of that rank's packed micro-batches, one list per step's micro-batches in turn (each micro-batch is one
    packed row of ``seq_len`` tokens; the tokens outside the mask are prompts and padding). Each rank has its own
    copy of the model (the ranks do not reduce gradients: no FSDP), its own PerfCounter (perf.py keeps one per
    process) and its own optimizer and warm-up scheduler."""
    import copy
    P = prime()
    world = len(samples)
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    base = TinyLM(vocab, 8)
    per_step = len(samples[0]) // steps
    config = types.SimpleNamespace(
        data=types.SimpleNamespace(seq_len=seq_len, batch_size=world * per_step, micro_batch_size=1),
        model=types.SimpleNamespace(cp=1, cp_style=None, lora=None, vlm=None, ac_offloading=False,
                                    fused_lm_head_token_chunk_size=None),
        optim=types.SimpleNamespace(max_norm=max_norm), val=None, max_steps=None, memory_profiler_path=None,
        ckpt=types.SimpleNamespace(interval=1), log=types.SimpleNamespace(log_data=False), run_dir=tmp)
    peak_bytes = [int(g * 1024**3) for g in peak_gib[:world]]
    clocks = [Clock(200.0 + r, [s * (1 + 0.2 * r) for s in clock_steps]) for r in range(world)]
    # PerfCounter's window (full steps' wall time): nanoseconds, so the tiny model's MFU prints as a percentage
    perf_clocks = [Clock(1.0 + r, [3.7e-9 * (1 + 0.3 * r), 1.1e-9, 5.8e-9]) for r in range(world)]
    P.perf.time = RankClock(perf_clocks)                 # PerfCounter.count_tokens' clock (perf.py:45)
    counters: list[Any] = [None] * world
    logs: list[list[list[dict[str, Any]]]] = [[[] for _ in range(steps)] for _ in range(world)]
    lines: list[list[str]] = [[] for _ in range(world)]
    token_losses = [[[] for _ in range(world)] for _ in range(steps)]
    masks = [[[] for _ in range(world)] for _ in range(steps)]
    lr_before = [[0.0] * world for _ in range(steps)]
    models = [copy.deepcopy(base) for _ in range(world)]

    def micro_batch(n_mask: int) -> dict[str, Any]:
        ids = torch.randint(0, vocab, (1, seq_len + 1), generator=gen)
        mask = torch.zeros(1, seq_len, dtype=torch.bool)
        start = int(torch.randint(0, seq_len - n_mask + 1, (1,), generator=gen))
        mask[0, start:start + n_mask] = True
        return {"input_ids": on_device(ids[:, :-1]), "target_ids": on_device(ids[:, 1:]),
                "position_ids": on_device(torch.arange(seq_len).unsqueeze(0)), "loss_mask": on_device(mask),
                "seq_lens": on_device(torch.tensor([seq_len]))}
    data = [[micro_batch(n) for n in rank] for rank in samples]
    dist = PrimeDist()
    loop = _loop_body(SFT)
    setup = _train_statements(SFT, (113, 119))
    loss_fn = _train_statements(SFT, (257, 339))

    def rank_fn(rank: int) -> None:
        model = models[rank]
        state = {"step": 0}

        class Optimizer(torch.optim.SGD):
            def step(self, closure: Any = None) -> Any:
                lr_before[state["step"]][rank] = self.param_groups[0]["lr"]
                return super().step(closure)
        optimizer = Optimizer(model.parameters(), lr=lr)
        scheduler = P.scheduler.setup_linear_scheduler(optimizer, None, warmup_steps, 0, lr, 0.0)
        counters[rank] = P.perf.PerfCounter(model, seq_len)
        counters[rank].gpu_peak_flops = counters[rank]._get_peak_flops("NVIDIA H100 80GB HBM3")

        class RecordingCE(torch.nn.CrossEntropyLoss):
            def forward(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
                out = super().forward(input, target)
                token_losses[state["step"]][rank].append(out.detach().clone().as_subclass(torch.Tensor))
                return out

        def batches():
            for u, mb in enumerate(data[rank]):
                masks[u // per_step][rank].append(mb["loss_mask"].as_subclass(torch.Tensor).reshape(-1))
                yield mb

        class Logger(_NullLogger):
            def success(self, msg: str) -> None:
                lines[rank].append(msg)

        async def log(metrics: dict[str, Any], step: int | None = None, *a: Any, **k: Any) -> None:
            logs[rank][state["step"]].append(dict(metrics))

        group = types.SimpleNamespace(get_group=lambda: None, size=lambda: world, get_local_rank=lambda: rank)
        torch_ = TorchOnCpu(peak_bytes[rank])
        torch_.cuda.mem_get_info = lambda: (0, 80 * 1024**3)
        ns: dict[str, Any] = {
            "torch": torch_, "dist": dist, "time": clocks[rank], "asyncio": asyncio, "math": __import__("math"),
            "config": config, "model": model, "optimizer": _SharedStep(optimizer), "scheduler": scheduler,
            "gradient_manager": None, "logger": Logger(), "world": _world(),
            "parallel_dims": types.SimpleNamespace(get_mesh=lambda name: group, fsdp_gradient_divide_factor=1.0,
                                                   cp_enabled=False, cp=1, ep_enabled=False, world_mesh=None),
            "progress": types.SimpleNamespace(step=1, total_tokens=0, total_samples=0),
            "dataset": types.SimpleNamespace(step=0, epoch=0, num_samples={"train": 1}, num_tokens={"train": 1}),
            "dataiter": batches(), "dataloader": None, "gc_handler": None, "heart": None, "max_peak_memory": 0.0,
            "max_memory": 80.0, "is_first_step": True, "weight_broadcast": None,
            "ckpt_manager": types.SimpleNamespace(save=lambda *a, **k: None, maybe_clean=lambda: None),
            "monitors": types.SimpleNamespace(log=log), "maybe_record_function": contextlib.nullcontext,
            "maybe_activation_offloading": lambda enabled: contextlib.nullcontext(),
            "forward": lambda model, input_ids, position_ids, **kw: {"logits": model(input_ids)},
            "CrossEntropyLoss": RecordingCE, "is_tt_moe_model": lambda model: False,
            "get_ckpt_disk_metrics": lambda run_dir: {}, "format_time": lambda s: f"{s:.2f}s",
            "is_online_eval_step": lambda step: False,
            "scale_gradients_": P.utils.scale_gradients_, "clip_grad_norm_": P.utils.clip_grad_norm_,
            "begin_backward": P.utils.begin_backward, "finish_backward": P.utils.finish_backward,
            "prepare_gradient_offload": P.utils.prepare_gradient_offload,
            "get_perf_counter": lambda model, seq_len: counters[rank],
        }
        exec(setup, ns)                                   # noqa: S102 - grad_accum_steps (sft/train.py:113-119)
        exec(loss_fn, ns)                                 # noqa: S102 - cp set-up, compute_loss (:257-339)
        for s in range(steps):
            state["step"] = s
            ns["dataset"].step = (s + 1) * config.data.batch_size
            exec(loop, ns)                                # noqa: S102 - one step of its loop (:441-696)

    GRADS_SEEN.clear()
    try:
        run_ranks(rank_fn, world=world)
    finally:
        P.perf.time = __import__("time")
    grads = [g for r, g in GRADS_SEEN if r == 0]                       # rank 0's, one call a step
    return SftRun([logs[0][s] for s in range(steps)], lines[0], token_losses, masks, clocks, perf_clocks,
                  lr_before, grads, peak_bytes, counters, config, world)


# --------------------------------------------------------------------------------------------- entries not proven
ENTRY_WHY: dict[tuple[str, str, str | None], str] = {
    ("prime_rl", "progress/num_samples", "sft"):
        "proof not written yet: the value is dataset.step of trainer/sft/data.py's packing dataset "
        "(sft/train.py@v0.8.1.dev67:597, :623), the examples its iterator has read; the proofs give the SFT loop a "
        "stand-in dataset (sft/data.py needs a tokenizer, the renderers package and a HF data set, none installed "
        "here); it would need sft/data.py vendored and run with a stand-in tokenizer on an in-memory data set",
}
