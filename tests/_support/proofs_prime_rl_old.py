"""prime-rl v0.5.0's own SFT trainer loop and orchestrator step metrics, from the tag's files vendored under
tests/data/frameworks/prime_rl/v0.5.0/ (tests/_support/vendored.py, a further tag: its modules are kept apart from
the primary v0.8.1.dev67 ones), for the fingerprint proofs of the printed step lines of v0.2..v0.5.0
(tests/frameworks/test_proof_prime_rl_old.py). Nothing here computes a metric. The device stand-ins, the simulated
ranks and the clocks are tests/_support/proofs_prime_rl.py's (imported, not copied; it says what each does).

What runs, from the tag's files:

* ``src/prime_rl/trainer/sft/train.py``: the statements of ``train()`` that set up ``grad_accum_steps``
  (:92-98), the context-parallel names, ``ce_loss`` and the nested ``compute_loss`` (:183-232), then the body of its
  ``while True:`` loop (:282-501, every statement but the ``if ... progress.step >= config.max_steps: break``),
  compiled from the file's text and executed once per step on every simulated rank: the micro-batch loop (forward,
  per-token cross-entropy, the loss sums and token counts), the all-reduces, ``clip_grad_norm_``, optimizer and
  scheduler step, the ``PerfCounter`` rate, the printed step line (:424-427) and every ``monitor.log`` call;
* ``src/prime_rl/trainer/perf.py``: ``PerfCounter`` (the rolling window, ``get_tokens_per_second``, ``get_mfu``);
* ``src/prime_rl/orchestrator/orchestrator.py``: the statements of ``orchestrate()``'s ``while True:`` loop that
  count the step's rollouts and problems (:551-553) and those from the step time to the printed step line (:654-848:
  ``step_time``, the results DataFrame, ``to_log`` with its ``groupby('example_id')`` means, ``monitor.log``, the
  step line), compiled from the file's text and executed with the names the loop set up before them (below);
* ``src/prime_rl/trainer/rl/train.py``: the body of ``train()``'s ``while True:`` loop (:220-646, all but the
  ``break``), executed once per step on every simulated rank: the micro-batch loop (forward, log-probs and entropy
  from the logits, ``compute_loss``, backward, the tensors appended for logging), ``clip_grad_norm_``, optimizer and
  scheduler step, ``tensors.compute_stats()``, the PerfCounter rate, the printed step line (:505-510) and every
  ``monitor.log`` call; ``src/prime_rl/trainer/rl/loss.py`` whole (``compute_loss``, ``setup_loss_fn``,
  ``default_loss_fn``, ``selective_log_softmax``, ``compute_entropy``, ``shift_tensor_left/right``), its config
  classes (``DefaultLossConfig`` ...) compiled from ``src/prime_rl/configs/trainer.py``'s text (the file imports the
  whole config tree); ``src/prime_rl/trainer/utils.py``: ``Tensors``, ``flexible_all_gather`` and
  ``get_response_lengths`` compiled from its text (the file imports rich, DTensor and the tokenizer for helpers not
  run), with the simulated group as its ``dist``; ``src/prime_rl/orchestrator/vf_utils.py``: ``get_seq_len``
  compiled from the file's text (the file imports verifiers, not installed).

Stand-ins, each for an import or a set-up object the code under test does not compute the proven metrics with:

* SFT: ``torchtitan.distributed.utils.clip_grad_norm_`` (not installed): proofs_prime_rl's ``_clip_grad_norm_``
  (``torch.nn.utils.get_total_norm`` then ``clip_grads_with_norm_``, what torchtitan does without expert parallelism
  or DTensors); ``get_zero_gradient_ratio`` (optim/zero_grad_ratio, no entry proven here) returns 0.0;
  ``get_ckpt_disk_metrics`` (the machine's disk) returns {}; the scheduler is torch's ``LinearLR`` warm-up
  (prime-rl's setup_linear_scheduler builds a LinearLR too; the proofs read where train.py reads the lr, not how the
  scheduler sets it); no checkpoint manager, no validation, no MoE (``is_tt_moe_model`` False), ``loss_impl`` torch
  (``CrossEntropyLoss(reduction="none")``, recorded as it computes); the data iterator yields each rank's packed
  micro-batches; ``monitor`` records every log call; ``logger`` records the ``logger.success`` line.
* RL trainer: as for SFT (``clip_grad_norm_``, ``get_zero_gradient_ratio``, ``get_ckpt_disk_metrics``, LinearLR, the
  monitor and logger), and as proofs_prime_rl runs dev67's loop: one tiny model the ranks share (their backward
  passes accumulate into its gradients, what FSDP's reduce-scatter sums), each rank's SGD over it stepped once, on
  rank 0 (``_SharedStep``); the data loader hands each rank its step's packed micro-batches
  (``proofs_prime_rl.make_micro_batch``); no weight broadcast, checkpoint, metrics server or heartbeat; ``forward``
  returns the logits (the VanillaOutputLinear path, train.py:388-396); ``Tensors`` is utils.py's, subclassed to record
  what the loop appended before its ``compute_stats()`` runs (the proofs' per-token entropy).
* perf.py: ``transformers.PretrainedConfig`` (annotation), ``prime_rl.trainer.lora.has_lora_layers`` (False),
  ``MultiLoRAModule`` (an empty class), ``get_world`` (the simulated rank's world), ``get_logger``; its peak FLOPs
  from its own table for an H100 (it reads the CUDA device's name; this CPU has none).
* orchestrator: ``pd`` is pandas itself; ``time`` a :class:`proofs_prime_rl.Clock`; the rollouts are plain dicts with
  the fields the statements read (verifiers' RolloutOutput is a TypedDict); ``scheduler``, ``buffer``,
  ``event_loop_lag_monitor`` give their (unproven) metrics as {} and the printed async levels; the per-rollout
  prefill / decode / samples lists and token sums (computed by the loop's statements before :654 from the trainer
  samples, which need a tokenizer) are given.
"""
from __future__ import annotations

import ast
import contextlib
import copy
import types
import warnings
from dataclasses import dataclass
from typing import Any

import torch

from _support import proofs_prime_rl as PR
from _support import vendored
from _support.framework_code import run_ranks

FW = "prime_rl"
TAG = "v0.5.0"
RELEASE = vendored.release(FW, TAG)
SFT = "src/prime_rl/trainer/sft/train.py"
PERF = "src/prime_rl/trainer/perf.py"
ORCH = "src/prime_rl/orchestrator/orchestrator.py"
VF_UTILS = "src/prime_rl/orchestrator/vf_utils.py"
S = vendored.stand_in


def _tree(repo_path: str) -> tuple[ast.Module, str]:
    path = vendored.provenance(FW, TAG).path(repo_path)
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path)), str(path)


def _function(tree: ast.Module, name: str) -> ast.FunctionDef | ast.AsyncFunctionDef:
    return next(n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name)


def _compile(body: list[ast.stmt], path: str) -> types.CodeType:
    assert body, path
    return compile(ast.Module(body=body, type_ignores=[]), path, "exec")


def statements(repo_path: str, fn: str, lines: tuple[int, int]) -> types.CodeType:
    """The top-level statements of ``fn`` in the tag's file within ``lines`` (inclusive), from its own text."""
    tree, path = _tree(repo_path)
    return _compile([n for n in _function(tree, fn).body if lines[0] <= n.lineno and n.end_lineno <= lines[1]], path)


def loop_statements(repo_path: str, fn: str, lines: tuple[int, int] | None = None) -> types.CodeType:
    """The statements of ``fn``'s ``while True:`` loop (within ``lines`` when given), without the ``if ...: break``
    that ends the loop."""
    tree, path = _tree(repo_path)
    loop = next(n for n in _function(tree, fn).body if isinstance(n, ast.While))
    body = [n for n in loop.body
            if not (isinstance(n, ast.If) and len(n.body) == 1 and isinstance(n.body[0], ast.Break))]
    if lines is not None:
        body = [n for n in body if lines[0] <= n.lineno and n.end_lineno <= lines[1]]
    return _compile(body, path)


def perf() -> types.ModuleType:
    logger = S("prime_rl.utils.logger", get_logger=lambda: PR._NullLogger())
    return vendored.load(FW, PERF, "prime_rl.trainer.perf", tag=TAG, stand_ins={
        "transformers": S("transformers", PretrainedConfig=object),
        "prime_rl.trainer.lora": S("prime_rl.trainer.lora", has_lora_layers=lambda model: False),
        "prime_rl.trainer.models.layers.lora": S("prime_rl.trainer.models.layers.lora",
                                                 MultiLoRAModule=type("MultiLoRAModule", (), {})),
        "prime_rl.trainer.world": S("prime_rl.trainer.world", get_world=PR._world),
        "prime_rl.utils.logger": logger})


class TinyLM(PR.TinyLM):
    """proofs_prime_rl's tiny causal LM with the names v0.5.0's perf.py reads (``lm_head``,
    ``config.tie_word_embeddings``)."""

    def __init__(self, vocab: int, hidden: int):
        super().__init__(vocab, hidden)
        self.lm_head = self.head
        self.config.tie_word_embeddings = False


# --------------------------------------------------------------------------------------------- the SFT trainer
@dataclass
class SftRun:
    logs: list[list[dict[str, Any]]]             # [step] rank 0's monitor.log calls
    lines: list[str]                             # rank 0's step lines
    token_losses: list[list[list[torch.Tensor]]]  # [step][rank] the per-token cross-entropy of each micro-batch
    masks: list[list[list[torch.Tensor]]]        # [step][rank] each micro-batch's loss mask
    clocks: list[PR.Clock]
    perf_clocks: list[PR.Clock]
    lr_before: list[list[float]]                 # [step][rank] the lr the optimizer step used
    grads: list[list[torch.Tensor]]              # [step] what rank 0's clip_grad_norm_ was given
    counters: list[Any]
    config: Any
    world: int

    def logged(self, step: int) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for d in self.logs[step - 1]:
            out.update(d)
        return out


def run_sft(samples: list[list[int]], *, steps: int = 3, seq_len: int = 16, vocab: int = 11, lr: float = 2e-4,
            max_norm: float = 0.05, seed: int = 5,
            clock_steps: tuple[float, ...] = (1.37, 0.0021, 2.93, 0.71)) -> SftRun:
    """``steps`` steps of v0.5.0's sft/train.py loop on every simulated rank; ``samples[rank]``: the loss-mask lengths
    of that rank's packed micro-batches (one row of ``seq_len`` tokens each), the steps' in turn. Each rank has its
    own model copy, optimizer, warm-up scheduler and PerfCounter (perf.py keeps one per process)."""
    P = perf()
    world = len(samples)
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    base = TinyLM(vocab, 8)
    per_step = len(samples[0]) // steps
    config = types.SimpleNamespace(
        data=types.SimpleNamespace(seq_len=seq_len, batch_size=world * per_step, micro_batch_size=1),
        model=types.SimpleNamespace(cp=1, lora=None, ac_offloading=False), loss_impl="torch",
        optim=types.SimpleNamespace(max_norm=max_norm), val=None, max_steps=None, memory_profiler_path=None,
        ckpt=None, log=types.SimpleNamespace(log_data=False), output_dir=None, trace_path=None)
    clocks = [PR.Clock(200.0 + r, [s * (1 + 0.2 * r) for s in clock_steps]) for r in range(world)]
    # PerfCounter's window: nanoseconds, so the tiny model's MFU prints as a percentage
    perf_clocks = [PR.Clock(1.0 + r, [3.7e-9 * (1 + 0.3 * r), 1.1e-9, 5.8e-9]) for r in range(world)]
    P.time = PR.RankClock(perf_clocks)                   # PerfCounter.count_tokens' clock (perf.py:41)
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
        return {"input_ids": PR.on_device(ids[:, :-1]), "target_ids": PR.on_device(ids[:, 1:]),
                "position_ids": PR.on_device(torch.arange(seq_len).unsqueeze(0)), "loss_mask": PR.on_device(mask)}
    data = [[micro_batch(n) for n in rank] for rank in samples]
    dist = PR.PrimeDist()
    loop = loop_statements(SFT, "train")
    setup = statements(SFT, "train", (92, 98))
    loss_fn = statements(SFT, "train", (183, 232))

    def rank_fn(rank: int) -> None:
        model = models[rank]
        state = {"step": 0}

        class Optimizer(torch.optim.SGD):
            def step(self, closure: Any = None) -> Any:
                lr_before[state["step"]][rank] = self.param_groups[0]["lr"]
                return super().step(closure)
        optimizer = Optimizer(model.parameters(), lr=lr)
        scheduler = torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=0.2, end_factor=1.0, total_iters=5)
        counters[rank] = P.PerfCounter(model, seq_len, 10)
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

        class Logger(PR._NullLogger):
            def success(self, msg: str) -> None:
                lines[rank].append(msg)

        def log(metrics: dict[str, Any], step: int | None = None) -> None:
            logs[rank][state["step"]].append(dict(metrics))

        group = types.SimpleNamespace(get_group=lambda: None, size=lambda: world, get_local_rank=lambda: rank)
        torch_ = PR.TorchOnCpu(int((6.5 + 3 * rank) * 1024**3))
        ns: dict[str, Any] = {
            "torch": torch_, "dist": dist, "time": clocks[rank], "config": config, "model": model,
            "optimizer": optimizer, "scheduler": scheduler, "logger": Logger(), "world": PR._world(),
            "parallel_dims": types.SimpleNamespace(get_mesh=lambda name: group, fsdp_gradient_divide_factor=1.0,
                                                   cp_enabled=False, cp=1, ep_enabled=False, world_mesh=None,
                                                   dp_replicate=1),
            "progress": types.SimpleNamespace(step=1, total_tokens=0, total_samples=0),
            "dataset": types.SimpleNamespace(step=0, epoch=0, num_samples={"train": 1}, num_tokens={"train": 1}),
            "dataiter": batches(), "dataloader": None, "heart": None, "max_memory": 80.0, "is_first_step": True,
            "ckpt_manager": None, "weight_ckpt_manager": None, "monitor": types.SimpleNamespace(log=log),
            "maybe_record_function": contextlib.nullcontext, "MemoryProfiler": None,
            "maybe_activation_offloading": lambda enabled: contextlib.nullcontext(),
            "forward": lambda model, input_ids, position_ids, **kw: {"logits": model(input_ids)},
            "CrossEntropyLoss": RecordingCE, "is_tt_moe_model": lambda model: False,
            "clip_grad_norm_": PR._clip_grad_norm_, "get_zero_gradient_ratio": lambda params, dp: 0.0,
            "get_ckpt_disk_metrics": lambda output_dir: {},
            "get_perf_counter": lambda model, seq_len: counters[rank],
        }
        exec(setup, ns)                                   # noqa: S102 - grad_accum_steps (sft/train.py:92-98)
        exec(loss_fn, ns)                                 # noqa: S102 - cp names, ce_loss, compute_loss (:183-232)
        for s in range(steps):
            state["step"] = s
            ns["dataset"].step = (s + 1) * config.data.batch_size
            exec(loop, ns)                                # noqa: S102 - one step of its loop (:282-501)

    PR.GRADS_SEEN.clear()
    try:
        run_ranks(rank_fn, world=world)
    finally:
        P.time = __import__("time")
    grads = [g for r, g in PR.GRADS_SEEN if r == 0]
    return SftRun([logs[0][s] for s in range(steps)], lines[0], token_losses, masks, clocks, perf_clocks,
                  lr_before, grads, counters, config, world)


# --------------------------------------------------------------------------------------------- the orchestrator
@dataclass
class OrchestratorRun:
    logged: dict[str, Any]                       # the step's monitor.log(to_log)
    line: str                                    # the printed step line
    clock: PR.Clock
    step_start: float


def get_seq_len() -> Any:
    tree, path = _tree(VF_UTILS)
    ns: dict[str, Any] = {"vf": S("verifiers", RolloutOutput=dict)}
    exec(_compile([_function(tree, "get_seq_len")], path), ns)      # noqa: S102 - the tag's own function
    return ns["get_seq_len"]


def rollout(example_id: int, *, reward: float, prompt: int, completion: int, task: str = "math") -> dict[str, Any]:
    """A verifiers RolloutOutput as the orchestrator's statements read it (one trajectory step, raw tokens)."""
    return {"example_id": example_id, "task": task, "reward": reward, "is_truncated": False, "stop_condition": None,
            "trajectory": [{"tokens": {"prompt_ids": [0] * prompt, "completion_ids": [1] * completion}}],
            "timing": {"generation_ms": 10.0 * completion, "scoring_ms": 1.0}, "metrics": {}}


def run_orchestrator_step(rollouts: list[dict[str, Any]], *, rollouts_per_example: int = 4) -> OrchestratorRun:
    """orchestrate()'s statements :551-553 (the step's rollout and problem counts) and :654-848 for one step over
    ``rollouts`` (the step's train_rollouts)."""
    import random

    import pandas as pd
    counts = loop_statements(ORCH, "orchestrate", (551, 553))     # example_ids, num_rollouts, num_unique_examples
    code = loop_statements(ORCH, "orchestrate", (654, 848))
    lines: list[str] = []
    logged: list[dict[str, Any]] = []
    clock = PR.Clock(500.0, [0.0031, 3.71, 1.9, 0.012])
    step_start = clock.perf_counter()

    class Logger(PR._NullLogger):
        def success(self, msg: str) -> None:
            lines.append(msg)

    seq_len = get_seq_len()
    prompts = [len(r["trajectory"][-1]["tokens"]["prompt_ids"]) for r in rollouts]
    decodes = [len(r["trajectory"][-1]["tokens"]["completion_ids"]) for r in rollouts]
    ns: dict[str, Any] = {
        "pd": pd, "random": random, "time": clock, "logger": Logger(), "get_seq_len": seq_len,
        "config": types.SimpleNamespace(rollouts_per_example=rollouts_per_example),
        "progress": types.SimpleNamespace(step=1, total_tokens=0, total_samples=0, total_problems=0),
        "train_rollouts": rollouts, "rollout_prefill_lens": prompts, "rollout_decode_lens": decodes,
        "rollout_samples_per_rollout": [1] * len(rollouts), "num_prefill_tokens": sum(prompts),
        "num_decode_tokens": sum(decodes), "rewards": [r["reward"] for r in rollouts],
        "advantages": [0.0] * len(rollouts), "val_outputs": None, "ckpt_step": 0, "temperature": 1.0,
        "step_start_time": step_start, "generate_completions_time": 0.5, "teacher_logprobs_time": 0,
        "save_ckpt_time": 0, "parallel_preprocess_time": 0.01, "filter_metrics": {}, "is_first_step": True,
        "scheduler": types.SimpleNamespace(get_metrics=lambda: {}, async_level=1, max_off_policy_level=0),
        "buffer": types.SimpleNamespace(get_metrics=lambda: {}),
        "event_loop_lag_monitor": types.SimpleNamespace(get_metrics=lambda: {}),
        "monitor": types.SimpleNamespace(log=lambda d, step=None: logged.append(dict(d)),
                                         log_samples=lambda *a, **k: None, log_distributions=lambda *a, **k: None),
    }
    exec(counts, ns)                                      # noqa: S102 - orchestrator.py's own statements
    exec(code, ns)                                        # noqa: S102
    assert len(logged) == 1 and len(lines) == 1, (logged, lines)
    return OrchestratorRun(logged[0], lines[0], clock, step_start)


# --------------------------------------------------------------------------------------------- the RL trainer
RL_TRAIN = "src/prime_rl/trainer/rl/train.py"
LOSS = "src/prime_rl/trainer/rl/loss.py"
UTILS = "src/prime_rl/trainer/utils.py"
CONFIGS = "src/prime_rl/configs/trainer.py"
#: the RL loop's clock increments, one per perf_counter() call of a step (:283, 287, 289, 294, 296, 304, 483, 504)
RL_CLOCK = (0.31, 0.0021, 0.46, 0.0013, 0.0071, 0.013, 1.73, 0.029)


def _defs(repo_path: str, names: list[str], namespace: dict[str, Any]) -> dict[str, Any]:
    """The top-level functions, classes and annotated assignments ``names`` of the tag's file, from its text."""
    tree, path = _tree(repo_path)

    def name_of(n: ast.stmt) -> str | None:
        if isinstance(n, (ast.ClassDef, ast.FunctionDef)):
            return n.name
        if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name):
            return n.target.id
        return None
    wanted = [n for n in tree.body if name_of(n) in names]
    assert {name_of(n) for n in wanted} == set(names), (path, names)
    exec(_compile(wanted, path), namespace)                # noqa: S102 - the tag's own code
    return {n: namespace[n] for n in names}


def rl_code() -> types.SimpleNamespace:
    """loss.py whole (its config classes compiled from configs/trainer.py's text, pydantic models as there), and
    utils.py's ``Tensors``, ``flexible_all_gather``, ``get_response_lengths`` compiled from its text (the file imports
    rich tables, DTensor and the tokenizer for other helpers) with the simulated group as its ``dist``."""
    from typing import Annotated, Literal, TypeAlias

    import pydantic
    cfg_ns: dict[str, Any] = {"BaseModel": pydantic.BaseModel, "Field": pydantic.Field, "Literal": Literal,
                              "Any": Any, "Annotated": Annotated, "TypeAlias": TypeAlias}
    cfg = _defs(CONFIGS, ["DefaultLossConfig", "SFTLossConfig", "CustomLossConfig", "LossConfig"], cfg_ns)
    for c in cfg.values():
        if isinstance(c, type) and issubclass(c, pydantic.BaseModel):
            c.model_rebuild(_types_namespace=cfg_ns)     # the names the file's own module imports
    configs = S("prime_rl.configs.trainer", **cfg)
    loss = vendored.load(FW, LOSS, "prime_rl.trainer.rl.loss", tag=TAG, stand_ins={
        **PR._typing_stand_ins(), "prime_rl.configs.trainer": configs,
        "prime_rl.utils.utils": S("prime_rl.utils.utils", import_object=None)})
    from collections import defaultdict
    uns: dict[str, Any] = {"torch": torch, "Tensor": torch.Tensor, "defaultdict": defaultdict, "dist": PR.PrimeDist()}
    utils = types.SimpleNamespace(**_defs(UTILS, ["get_response_lengths", "flexible_all_gather", "Tensors"], uns))
    return types.SimpleNamespace(loss=loss, utils=utils, configs=configs)


@dataclass
class RlRun:
    logs: list[list[dict[str, Any]]]             # [step] rank 0's monitor.log calls
    lines: list[str]                             # rank 0's step lines
    clocks: list[PR.Clock]
    perf_clocks: list[PR.Clock]
    lr_before: list[float]                       # [step] rank 0's optimizer lr before the step's scheduler.step()
    lr_after: list[float]                        # [step] its scheduler's last lr after it
    grads: list[list[torch.Tensor]]              # [step] what clip_grad_norm_ was given (the shared gradients)
    counters: list[Any]
    seq_len: int
    micro_batches: int
    world: int
    tensors: list[list[dict[str, list[torch.Tensor]]]]   # [step][rank] what the loop appended to its Tensors
    peak_bytes: list[int]

    def logged(self, step: int) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for d in self.logs[step - 1]:
            out.update(d)
        return out


def run_rl(layout: list[list[list[PR.MicroBatch]]], *, vocab: int = 11, lr: float = 3e-4, max_norm: float = 0.05,
           seed: int = 7) -> RlRun:
    """Steps of v0.5.0's rl/train.py loop (:220-646, all but the break) on every simulated rank:
    ``layout[step][rank]`` its packed micro-batches. The ranks share one model (their backward passes accumulate
    into its gradients, as FSDP's reduce-scatter sums them), each rank its own optimizer over it (stepped once, on
    rank 0, proofs_prime_rl._SharedStep), warm-up scheduler and PerfCounter."""
    C = rl_code()
    P = perf()
    steps, world = len(layout), len(layout[0])
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    model = TinyLM(vocab, 8)
    inputs = [[[PR.make_micro_batch(mb, vocab, gen, env="math") for mb in rank] for rank in step] for step in layout]
    for step in inputs:
        for rank in step:
            for mb in rank:
                mb["teacher_logprobs"] = None
    seq_len = sum(layout[0][0][0].lengths)
    n_micro = len(layout[0][0])
    assert all(len(rank) == n_micro and sum(mb.lengths) == seq_len for st in layout for rank in st for mb in rank)
    config = types.SimpleNamespace(
        max_steps=None, max_async_level=1, ckpt=None, max_concurrent_runs=1, memory_profiler_path=None,
        enable_router_replay=False, model=types.SimpleNamespace(lora=None, ac_offloading=False),
        optim=types.SimpleNamespace(max_norm=max_norm), output_dir=None)
    clocks = [PR.Clock(100.0 + 10 * r, [s * (1 + 0.1 * r) for s in RL_CLOCK]) for r in range(world)]
    perf_clocks = [PR.Clock(1.0 + r, [3.7e-9 * (1 + 0.3 * r), 1.1e-9, 5.8e-9]) for r in range(world)]
    P.time = PR.RankClock(perf_clocks)
    counters: list[Any] = [None] * world
    logs: list[list[list[dict[str, Any]]]] = [[[] for _ in range(steps)] for _ in range(world)]
    lines: list[list[str]] = [[] for _ in range(world)]
    lr_before: list[float] = [0.0] * steps
    lr_after: list[float] = [0.0] * steps
    dist = PR.PrimeDist()
    loop = loop_statements(RL_TRAIN, "train")
    recorded: list[list[dict[str, list[torch.Tensor]]]] = [[{} for _ in range(world)] for _ in range(steps)]
    peak_bytes = [int(g * 1024**3) for g in (6.5, 3.0, 9.5)[:world]]

    def rank_fn(rank: int) -> None:
        state = {"step": 0}

        class Tensors(C.utils.Tensors):
            """utils.py's Tensors, recording what the loop appended before its compute_stats() gathers it."""

            def compute_stats(self) -> dict[str, float | int]:
                recorded[state["step"]][rank] = {k: [t.clone() for t in v] for k, v in self.items()}
                return super().compute_stats()
        optimizer = torch.optim.SGD(model.parameters(), lr=lr)
        scheduler = torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=0.2, end_factor=1.0, total_iters=5)
        counters[rank] = P.PerfCounter(model, seq_len, 10)
        counters[rank].gpu_peak_flops = counters[rank]._get_peak_flops("NVIDIA H100 80GB HBM3")

        class Scheduler:
            def step(self) -> None:
                if rank == 0:
                    lr_before[state["step"]] = optimizer.param_groups[0]["lr"]
                scheduler.step()
                if rank == 0:
                    lr_after[state["step"]] = scheduler.get_last_lr()[0]

        class Logger(PR._NullLogger):
            def success(self, msg: str) -> None:
                lines[rank].append(msg)

        def log(metrics: dict[str, Any], step: int | None = None) -> None:
            logs[rank][state["step"]].append(dict(metrics))

        group = types.SimpleNamespace(get_group=lambda: None, size=lambda: world, get_local_rank=lambda: rank)
        ns: dict[str, Any] = {
            "torch": PR.TorchOnCpu(peak_bytes[rank]), "dist": dist, "time": clocks[rank],
            "config": config, "model": model, "optimizer": PR._SharedStep(optimizer), "scheduler": Scheduler(),
            "logger": Logger(), "world": PR._world(), "weight_broadcast": None, "ckpt_manager": None,
            "parallel_dims": types.SimpleNamespace(get_mesh=lambda name: group, cp_enabled=False, cp=1,
                                                   ep_enabled=False, world_mesh=None, dp_replicate=1),
            "progress": types.SimpleNamespace(step=1, total_tokens=0, total_samples=0), "is_first_step": True,
            "dataloader": types.SimpleNamespace(wait_for_batch=lambda: None,
                                                get_batch=lambda: inputs[state["step"]][rank]),
            "MemoryProfiler": None, "monitor": types.SimpleNamespace(log=log), "metrics_server": None, "heart": None,
            "maybe_record_function": contextlib.nullcontext,
            "maybe_activation_offloading": lambda enabled: contextlib.nullcontext(),
            "forward": lambda model, input_ids, position_ids, **kw: {"logits": model(input_ids)},
            "is_tt_moe_model": lambda model: False, "get_load_balance_stats": None,
            "clip_grad_norm_": PR._clip_grad_norm_, "get_zero_gradient_ratio": lambda params, dp: 0.0,
            "get_ckpt_disk_metrics": lambda output_dir: {},
            "get_perf_counter": lambda model, seq_len: counters[rank],
            "Tensors": Tensors, "get_response_lengths": C.utils.get_response_lengths,
            "compute_loss": C.loss.compute_loss, "compute_entropy": C.loss.compute_entropy,
            "selective_log_softmax": C.loss.selective_log_softmax, "shift_tensor_left": C.loss.shift_tensor_left,
            "shift_tensor_right": C.loss.shift_tensor_right,
            "loss_fn": C.loss.setup_loss_fn(C.configs.DefaultLossConfig()),
        }
        for s in range(steps):
            state["step"] = s
            exec(loop, ns)                                # noqa: S102 - one step of its loop (:220-646)

    PR.GRADS_SEEN.clear()
    try:
        # the ranks but 0 never step their optimizer (rank 0 steps the shared one): torch's warning about it
        with torch.compiler.set_stance("force_eager"), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step", category=UserWarning)
            run_ranks(rank_fn, world=world)
    finally:
        P.time = __import__("time")
    grads = [g for r, g in PR.GRADS_SEEN if r == 0]
    return RlRun([logs[0][s] for s in range(steps)], lines[0], clocks, perf_clocks, lr_before, lr_after, grads,
                 counters, seq_len, n_micro, world, recorded, peak_bytes)


# --------------------------------------------------------------------------------------------- entries not proven
_LOSS_WHY = ("v0.2..v0.5.0: each micro-batch's loss is its loss-masked token sum over its OWN rank's loss-masked "
             "token count for the step (loss_scale, trainer/rl/train.py@v0.5.0:308-309, compute_loss loss.py:198-250) "
             "and Tensors.compute_stats averages those values over the micro-batches of all ranks "
             "(train.py@v0.5.0:442, utils.py:345): the mean over the ranks of each rank's token-mean loss divided by "
             "the number of micro-batches per rank (as the entry's deviation says); no candidate of the fingerprint "
             "(tests/_support/fingerprint.py TOKENS: token_sum_step_norm divides by the step's tokens of every rank, "
             "token_sum_dp_norm by the micro-batch's own) and no `tokens:` literal of docs/reductions.md is a token "
             "sum over the rank's step token count, and default_loss_fn (loss.py@v0.5.0:107-163) returns only the "
             "sequence's summed loss, not its per-token values; a proof needs that literal (and candidate) first. "
             "tests/frameworks/test_proof_prime_rl_old.py::test_rl_trainer_step_line_v050 runs this loop and proves "
             "the line's other labels")

ENTRY_WHY: dict[tuple[str, str, str | None], str] = {
    ("prime_rl", "loss/mean", "rl"): _LOSS_WHY,
    ("prime_rl", "Loss", "rl"): "the RL step line's print of loss/mean (train.py@v0.5.0:505): " + _LOSS_WHY,
}
