"""prime-rl v0.4.0's own orchestrator step metrics and SFT trainer loop, from the tag's files vendored under
tests/data/frameworks/prime_rl/v0.4.0/ (tests/_support/vendored.py, a further tag), for the fingerprint proofs of
the orchestrator's logged entries of v0.2..v0.4.0 (tests/frameworks/test_proof_prime_rl_old2.py). Nothing here
computes a metric. The clock and the null logger are tests/_support/proofs_prime_rl.py's (imported, not copied).

What runs, from the tag's files:

* ``src/prime_rl/orchestrator/orchestrator.py``: the statements of ``orchestrate()``'s ``while True:`` loop from the
  results DataFrame to the printed step line (:492-668: ``results_df`` with ``get_completion_len`` /
  ``get_prompt_len`` / ``get_seq_len`` of every rollout, the progress counts, ``throughput``, the solve-all/none
  fractions, ``step_time``, ``to_log`` with its ``groupby('example_id')`` means, ``monitor.log``, the step line),
  compiled from the file's text and executed with the names the loop set up before them (below);
* ``src/prime_rl/utils/vf.py``: ``get_prompt_len``, ``get_seq_len``, ``get_completion_len`` compiled from the file's
  text (the file imports verifiers and openai, not installed; ``vf.State`` and ``ChatCompletion`` are annotations
  and a ``cast`` of the fallback path, which rollouts with raw tokens never take);
* ``src/prime_rl/trainer/sft/train.py``: the statements of ``train()`` that set up ``grad_accum_steps`` (:88-94),
  the context-parallel names and ``ce_loss`` (:165-177), then the body of its ``while True:`` loop (:187-end,
  every statement but the ``if ... progress.step >= config.max_steps: break``), executed once per step on every
  simulated rank: the micro-batch loop (forward, per-token cross-entropy, ``loss[loss_mask].mean()``, the
  ``/ grad_accum_steps`` sum), ``clip_grad_norm_``, optimizer and scheduler step, ``dist.all_reduce(batch_loss,
  op=AVG)``, the printed step line and every ``monitor.log`` call.

Stand-ins, each for an import or a set-up object the code under test does not compute the proven metrics with:
``pd`` is pandas itself; ``time`` a :class:`proofs_prime_rl.Clock`; the rollouts are plain dicts with the fields the
statements read (verifiers' State is a dict); ``tokenizer.decode`` and ``count_chinese_chars`` (prime_rl.utils.utils,
only the chinese/* metrics, not proven) give a string of the completion's length and no Chinese characters;
``scheduler``, ``buffer``, ``event_loop_lag_monitor`` give their (unproven) metrics as {} and the printed async
levels; ``rewards`` / ``advantages`` (only the distributions logged, a no-op monitor here) are given; no validation
(``val_outputs`` None, the ``await val_task`` before :492 is not run).

v0.6.0 (tests/data/frameworks/prime_rl/v0.6.0/, for its progress/total_samples and Reward entries):
``src/prime_rl/orchestrator/metrics.py`` loaded (``MetricsBuilder``; stand-ins for ``prime_rl.configs.orchestrator``
and ``prime_rl.orchestrator.types``, annotations under ``from __future__ import annotations``, and
``token_export_metrics.collect_next_token_export_metrics``, the trainer's on-disk exports: none); from
``src/prime_rl/orchestrator/orchestrator.py`` the statements of ``Orchestrator.finalize_train_batch`` from
``metrics = self.metrics.build(`` to its end (:616-663) and ``Orchestrator.log_train_batch`` (:748-796), compiled
from the file's text. Stand-ins: ``self`` (a namespace holding the MetricsBuilder, the Progress counters, a
train sink with no pre-filter drops, one train env, no usage reporter, heartbeat or eval), the TrainRollouts and
the TrainBatch (namespaces with the fields read), ``format_time`` and ``get_logger`` (the logger records the line).

SFT stand-ins (as tests/_support/proofs_prime_rl_old.py's for v0.5.0, whose helpers are imported): the ranks are
threads with proofs_prime_rl's simulated ``torch.distributed`` (:class:`AvgDist` adds NCCL's ``ReduceOp.AVG``: the
sum over the ranks divided by their number), ``TorchOnCpu`` / ``on_device`` (device moves stay on the CPU),
``_clip_grad_norm_`` (torchtitan's, not installed); each rank its own copy of the tiny LM, SGD and a LinearLR
warm-up; ``CrossEntropyLoss`` is torch's, subclassed to record the per-token losses it returns; the data iterator
yields each rank's packed micro-batches; ``get_perf_counter`` gives a counter reading 0 (perf.py: the throughput and
MFU, not proven here); no checkpoint, validation, MoE or memory profiler; ``monitor`` and ``logger`` record.
"""
from __future__ import annotations

import ast
import types
from dataclasses import dataclass
from typing import Any, cast

from _support import proofs_prime_rl as PR
from _support import vendored
from _support.framework_code import current_rank

FW = "prime_rl"
TAG = "v0.4.0"
RELEASE = vendored.release(FW, TAG)
ORCH = "src/prime_rl/orchestrator/orchestrator.py"
VF = "src/prime_rl/utils/vf.py"
S = vendored.stand_in


def _tree(repo_path: str) -> tuple[ast.Module, str]:
    path = vendored.provenance(FW, TAG).path(repo_path)
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path)), str(path)


def _function(tree: ast.Module, name: str) -> ast.FunctionDef | ast.AsyncFunctionDef:
    return next(n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name)


def _compile(body: list[ast.stmt], path: str) -> types.CodeType:
    assert body, path
    return compile(ast.Module(body=body, type_ignores=[]), path, "exec")


def loop_statements(repo_path: str, fn: str, lines: tuple[int, int]) -> types.CodeType:
    """The statements of ``fn``'s ``while True:`` loop within ``lines`` (inclusive), from the tag's own text."""
    tree, path = _tree(repo_path)
    loop = next(n for n in _function(tree, fn).body if isinstance(n, ast.While))
    return _compile([n for n in loop.body if lines[0] <= n.lineno and n.end_lineno <= lines[1]], path)


def length_functions() -> dict[str, Any]:
    """vf.py's get_prompt_len, get_seq_len and get_completion_len, compiled from the tag's text."""
    tree, path = _tree(VF)
    names = ["get_prompt_len", "get_seq_len", "get_completion_len"]
    ns: dict[str, Any] = {"vf": S("verifiers", State=dict), "cast": cast, "ChatCompletion": object}
    exec(_compile([_function(tree, n) for n in names], path), ns)      # noqa: S102 - the tag's own functions
    return {n: ns[n] for n in names}


def rollout(example_id: int, *, reward: float, prompt: int, completion: int, task: str = "math") -> dict[str, Any]:
    """A verifiers State as the orchestrator's statements read it (one trajectory step, raw tokens)."""
    return {"example_id": example_id, "task": task, "reward": reward, "is_truncated": False, "error": None,
            "trajectory": [{"tokens": {"prompt_ids": [0] * prompt, "completion_ids": [1] * completion}}],
            "timing": {"generation_ms": 10.0 * completion, "scoring_ms": 1.0}, "metrics": {}}


@dataclass
class OrchestratorRun:
    logged: dict[str, Any]                       # the step's monitor.log(to_log)
    line: str                                    # the printed step line
    clock: PR.Clock
    step_start: float
    generate_seconds: float


def run_orchestrator_step(rollouts: list[dict[str, Any]], *, rollouts_per_example: int = 4,
                          generate_seconds: float = 2.37) -> OrchestratorRun:
    """orchestrate()'s statements :492-668 for one step over ``rollouts`` (the step's train_rollouts)."""
    import random

    import pandas as pd
    code = loop_statements(ORCH, "orchestrate", (492, 668))
    lines: list[str] = []
    logged: list[dict[str, Any]] = []
    clock = PR.Clock(500.0, [0.0031, 3.71, 1.9, 0.012])
    step_start = clock.perf_counter()

    class Logger(PR._NullLogger):
        def success(self, msg: str) -> None:
            lines.append(msg)

    ns: dict[str, Any] = {
        "pd": pd, "random": random, "time": clock, "logger": Logger(), **length_functions(),
        "tokenizer": types.SimpleNamespace(decode=lambda ids: "x" * len(ids)),
        "count_chinese_chars": lambda text: (0, len(text)),
        "config": types.SimpleNamespace(rollouts_per_example=rollouts_per_example, batch_size=len(rollouts)),
        "progress": types.SimpleNamespace(step=1, total_tokens=0, total_samples=0, total_problems=0),
        "train_rollouts": rollouts, "rewards": [r["reward"] for r in rollouts], "advantages": [0.0] * len(rollouts),
        "val_outputs": None, "ckpt_step": 0, "temperature": 1.0, "step_start_time": step_start,
        "generate_completions_time": generate_seconds, "teacher_logprobs_time": 0, "save_ckpt_time": 0,
        "parallel_preprocess_time": 0.01,
        "scheduler": types.SimpleNamespace(get_metrics=lambda: {}, async_level=1, max_off_policy_level=0),
        "buffer": types.SimpleNamespace(get_metrics=lambda: {}),
        "event_loop_lag_monitor": types.SimpleNamespace(get_metrics=lambda: {}),
        "monitor": types.SimpleNamespace(log=lambda d, step=None: logged.append(dict(d)),
                                         log_samples=lambda *a, **k: None, log_distributions=lambda *a, **k: None),
    }
    exec(code, ns)                                        # noqa: S102 - orchestrator.py's own statements
    assert len(logged) == 1 and len(lines) == 1, (logged, lines)
    return OrchestratorRun(logged[0], lines[0], clock, step_start, generate_seconds)


# --------------------------------------------------------------------------------------------- the SFT trainer
SFT = "src/prime_rl/trainer/sft/train.py"


def statements(repo_path: str, fn: str, lines: tuple[int, int]) -> types.CodeType:
    """The top-level statements of ``fn`` in the tag's file within ``lines`` (inclusive), from its own text."""
    tree, path = _tree(repo_path)
    return _compile([n for n in _function(tree, fn).body if lines[0] <= n.lineno and n.end_lineno <= lines[1]], path)


def sft_loop(repo_path: str, fn: str) -> types.CodeType:
    """The statements of ``fn``'s ``while True:`` loop without the ``if ...: break`` that ends it."""
    tree, path = _tree(repo_path)
    loop = next(n for n in _function(tree, fn).body if isinstance(n, ast.While))
    body = [n for n in loop.body
            if not (isinstance(n, ast.If) and len(n.body) == 1 and isinstance(n.body[0], ast.Break))]
    return _compile(body, path)


class AvgDist(PR.PrimeDist):
    """proofs_prime_rl's simulated ``torch.distributed`` with ``ReduceOp.AVG`` (v0.4.0's all_reduce of the step
    loss): the ranks' sum over their number, as NCCL's AVG."""

    class ReduceOp:
        SUM, MAX, AVG = "sum", "max", "avg"

    def all_reduce(self, t: Any, op: Any = "sum", group: Any = None) -> None:
        super().all_reduce(t, "sum" if op == "avg" else op, group)
        if op == "avg":
            t.div_(current_rank()[0].world)


class _Perf:
    """get_perf_counter's PerfCounter (perf.py; the throughput and MFU, not proven here): counts nothing."""

    def count_tokens(self, n: int) -> None:
        pass

    def get_tokens_per_second(self) -> float:
        return 0.0

    def get_mfu(self) -> float:
        return 0.0


@dataclass
class SftRun:
    logs: list[list[dict[str, Any]]]              # [step] rank 0's monitor.log calls
    lines: list[str]                              # rank 0's step lines
    token_losses: list[list[list[Any]]]           # [step][rank] each micro-batch's per-token cross-entropy
    masks: list[list[list[Any]]]                  # [step][rank] each micro-batch's loss mask
    world: int

    def logged(self, step: int) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for d in self.logs[step - 1]:
            out.update(d)
        return out


def run_sft(samples: list[list[int]], *, steps: int = 3, seq_len: int = 16, vocab: int = 11, lr: float = 2e-4,
            seed: int = 5) -> SftRun:
    """``steps`` steps of v0.4.0's sft/train.py loop (:187-end, all but the break) on every simulated rank, after
    its ``grad_accum_steps`` (:88-94) and cp / ce_loss set-up (:165-177); ``samples[rank]`` the loss-mask lengths of
    that rank's micro-batches (one packed row of ``seq_len`` tokens each), the steps' in turn."""
    import contextlib
    import copy

    import torch

    from _support import proofs_prime_rl_old as OLD
    from _support.framework_code import run_ranks
    world = len(samples)
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    base = OLD.TinyLM(vocab, 8)
    per_step = len(samples[0]) // steps
    config = types.SimpleNamespace(
        data=types.SimpleNamespace(seq_len=seq_len, batch_size=world * per_step, micro_batch_size=1),
        model=types.SimpleNamespace(cp=1, tp=1, ac_offloading=False), loss_impl="torch",
        optim=types.SimpleNamespace(max_norm=1e9), max_steps=None, memory_profiler_path=None, ckpt=None,
        log=types.SimpleNamespace(log_data=False), output_dir=None, trace_path=None)
    logs: list[list[list[dict[str, Any]]]] = [[[] for _ in range(steps)] for _ in range(world)]
    lines: list[list[str]] = [[] for _ in range(world)]
    token_losses: list[list[list[Any]]] = [[[] for _ in range(world)] for _ in range(steps)]
    masks: list[list[list[Any]]] = [[[] for _ in range(world)] for _ in range(steps)]
    models = [copy.deepcopy(base) for _ in range(world)]

    def micro_batch(n_mask: int) -> dict[str, Any]:
        ids = torch.randint(0, vocab, (1, seq_len + 1), generator=gen)
        mask = torch.zeros(1, seq_len, dtype=torch.bool)
        start = int(torch.randint(0, seq_len - n_mask + 1, (1,), generator=gen))
        mask[0, start:start + n_mask] = True
        return {"input_ids": PR.on_device(ids[:, :-1]), "target_ids": PR.on_device(ids[:, 1:]),
                "position_ids": PR.on_device(torch.arange(seq_len).unsqueeze(0)), "loss_mask": PR.on_device(mask)}
    data = [[micro_batch(n) for n in rank] for rank in samples]
    dist = AvgDist()
    loop = sft_loop(SFT, "train")
    setup = statements(SFT, "train", (88, 94))
    losses = statements(SFT, "train", (165, 177))

    def rank_fn(rank: int) -> None:
        model = models[rank]
        state = {"step": 0}
        optimizer = torch.optim.SGD(model.parameters(), lr=lr)
        scheduler = torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=0.2, end_factor=1.0, total_iters=5)

        class RecordingCE(torch.nn.CrossEntropyLoss):
            def forward(self, input: Any, target: Any) -> Any:
                out = super().forward(input, target)
                token_losses[state["step"]][rank].append(out.detach().clone().as_subclass(torch.Tensor))
                return out

        def batches() -> Any:
            for u, mb in enumerate(data[rank]):
                masks[u // per_step][rank].append(mb["loss_mask"].as_subclass(torch.Tensor).reshape(-1))
                yield mb

        class Logger(PR._NullLogger):
            def success(self, msg: str) -> None:
                lines[rank].append(msg)

        def log(metrics: dict[str, Any], step: int | None = None) -> None:
            logs[rank][state["step"]].append(dict(metrics))

        ns: dict[str, Any] = {
            "torch": PR.TorchOnCpu(int((6.5 + 3 * rank) * 1024**3)), "dist": dist,
            "time": PR.Clock(200.0 + rank, [1.37, 0.0021, 2.93, 0.71]), "config": config, "model": model,
            "optimizer": optimizer, "scheduler": scheduler, "logger": Logger(), "world": PR._world(),
            "parallel_dims": types.SimpleNamespace(cp_enabled=False, cp=1, ep_enabled=False, world_mesh=None),
            "progress": types.SimpleNamespace(step=1, total_tokens=0, total_samples=0),
            "dataset": types.SimpleNamespace(step=0, epoch=0, num_samples={"train": 1}, num_tokens={"train": 1}),
            "dataiter": batches(), "heart": None, "max_memory": 80.0, "is_first_step": True,
            "dataloader": types.SimpleNamespace(state_dict=lambda: {"dataset_state": {"dataset": {"step": 0}}}),
            "ckpt_manager": None, "weight_ckpt_manager": None, "monitor": types.SimpleNamespace(log=log),
            "maybe_record_function": contextlib.nullcontext, "MemoryProfiler": None,
            "maybe_activation_offloading": lambda enabled: contextlib.nullcontext(),
            "forward": lambda model, input_ids, position_ids, **kw: {"logits": model(input_ids)},
            "CrossEntropyLoss": RecordingCE, "is_tt_moe_model": lambda model: False,
            "clip_grad_norm_": PR._clip_grad_norm_, "get_ckpt_disk_metrics": lambda output_dir: {},
            "get_perf_counter": lambda model, seq_len: _Perf(),
        }
        exec(setup, ns)                                   # noqa: S102 - grad_accum_steps (sft/train.py:88-94)
        exec(losses, ns)                                  # noqa: S102 - cp names, ce_loss (:165-177)
        for s in range(steps):
            state["step"] = s
            ns["dataset"].step = (s + 1) * config.data.batch_size
            exec(loop, ns)                                # noqa: S102 - one step of its loop

    PR.GRADS_SEEN.clear()
    run_ranks(rank_fn, world=world)
    return SftRun([logs[0][s] for s in range(steps)], lines[0], token_losses, masks, world)


# --------------------------------------------------------------------------------------------- v0.6.0 orchestrator
TAG_060 = "v0.6.0"
RELEASE_060 = vendored.release(FW, TAG_060)
ORCH_060 = "src/prime_rl/orchestrator/orchestrator.py"
METRICS_060 = "src/prime_rl/orchestrator/metrics.py"


def _method_060(cls: str, name: str) -> ast.FunctionDef | ast.AsyncFunctionDef:
    path = vendored.provenance(FW, TAG_060).path(ORCH_060)
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    klass = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
    return next(n for n in klass.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name)


def rollout_060(group_id: int, *, reward: float, prompt: int, completion: int, env: str = "math") -> Any:
    """A TrainRollout (orchestrator/types.py@v0.6.0) with the fields MetricsBuilder.build and log_train_batch
    read: one trajectory step, its token usage and timing."""
    timing = {"total": 1.0, "setup": {"duration": 0.1}, "generation": {"duration": 0.5},
              "model": {"duration": 0.3}, "env": {"duration": 0.05}, "scoring": {"duration": 0.02},
              "overhead": 0.03}
    raw = {"token_usage": {"final_input_tokens": prompt, "final_output_tokens": completion},
           "trajectory": [{}], "timing": timing, "metrics": {}, "stop_condition": None}
    return types.SimpleNamespace(group_id=group_id, example_id=group_id, env_name=env, reward=reward,
                                 is_truncated=False, is_filtered=False, raw=raw, filter_results={},
                                 off_policy_steps=0, advantage=0.0, to_dict=lambda: {})


@dataclass
class Orchestrator060:
    logged: list[dict[str, Any]]      # [step] MetricsBuilder.build's dict, as monitor.log got it
    lines: list[str]                  # [step] log_train_batch's step line
    totals_after: list[int]           # [step] progress.total_samples after the step


def run_orchestrator_060(steps: list[list[Any]]) -> Orchestrator060:
    """Orchestrator.finalize_train_batch's statements from ``metrics = self.metrics.build(`` to its end
    (orchestrator.py@v0.6.0:616-663: the step dict, monitor.log, the progress totals, log_train_batch's step line,
    progress.step += 1), once per step, with v0.6.0's own MetricsBuilder (metrics.py, loaded) and
    Orchestrator.log_train_batch (compiled from the file's text)."""
    metrics_mod = vendored.load(FW, METRICS_060, "prime_rl.orchestrator.metrics", tag=TAG_060, stand_ins={
        "prime_rl.configs.orchestrator": S("prime_rl.configs.orchestrator", OrchestratorConfig=object),
        "prime_rl.orchestrator.token_export_metrics": S(
            "prime_rl.orchestrator.token_export_metrics", collect_next_token_export_metrics=lambda *a, **k: {}),
        "prime_rl.orchestrator.types": S("prime_rl.orchestrator.types", Progress=object, TrainBatchMetrics=object,
                                         TrainRollout=object)})
    fn = _method_060("Orchestrator", "finalize_train_batch")
    path = str(vendored.provenance(FW, TAG_060).path(ORCH_060))
    tail = _compile([n for n in fn.body if n.lineno >= 616], path)
    lines: list[str] = []
    logger = types.SimpleNamespace(success=lines.append, info=lambda *a, **k: None, warning=lambda *a, **k: None)
    log_ns: dict[str, Any] = {"get_logger": lambda: logger, "format_time": lambda s: f"{s:.2f}s", "Any": Any,
                              "TrainBatch": object}
    log_fn = _method_060("Orchestrator", "log_train_batch")
    exec(_compile([log_fn], path), log_ns)                # noqa: S102 - the tag's own method
    logged: list[dict[str, Any]] = []
    totals: list[int] = []
    config = types.SimpleNamespace(train=types.SimpleNamespace(env=[types.SimpleNamespace(resolved_name="math",
                                                                                          group_size=4)]),
                                   output_dir=None)
    progress = types.SimpleNamespace(step=1, total_tokens=0, total_samples=0, total_problems=0)
    sink = types.SimpleNamespace(pre_filter_seen=0, pre_filter_dropped=0, pre_filter_dropped_by_name={},
                                 reset_pre_filter_stats=lambda: None)
    self = types.SimpleNamespace(
        metrics=metrics_mod.MetricsBuilder(config), progress=progress, train_sink=sink, usage_reporter=None,
        heart=None, train_envs=[types.SimpleNamespace(name="math")], maybe_trigger_eval=lambda step: None,
        monitor=types.SimpleNamespace(log=lambda d, step=None: logged.append(dict(d)),
                                      log_samples=lambda *a, **k: None, log_distributions=lambda *a, **k: None))
    self.log_train_batch = types.MethodType(log_ns["log_train_batch"], self)
    for rollouts in steps:
        n = len(rollouts)
        batch = types.SimpleNamespace(rollouts=rollouts, samples=[], metrics=types.SimpleNamespace(
            rollout_prefill_lens=[r.raw["token_usage"]["final_input_tokens"] for r in rollouts],
            rollout_decode_lens=[r.raw["token_usage"]["final_output_tokens"] for r in rollouts],
            samples_per_rollout=[1] * n, num_prefill_tokens=0, num_decode_tokens=0, n_trainable=n,
            arrivals_by_env={"math": n}, errors_by_env={"math": 0}))
        ns = {"self": self, "batch": batch, "step": progress.step, "step_time": 3.5, "save_ckpt_time": 0.0,
              "rollout_dicts": [r.to_dict() for r in rollouts], "os": __import__("os"),
              "teacher_logprobs_time": 0.0, "config": config}
        exec(tail, ns)                                    # noqa: S102 - finalize_train_batch's own statements
        totals.append(progress.total_samples)
    assert len(logged) == len(steps) == len(lines), (len(logged), len(lines))
    return Orchestrator060(logged, lines, totals)


# --------------------------------------------------------------------------------------------- entries not proven
_PER_PROBLEM = ("v0.2..v0.4.0: results_df.groupby('example_id').{col}.mean().{stat}() "
                "(orchestrator.py@v0.4.0:{line}): the {stat} of the per-problem MEAN lengths, not of the rollouts' "
                "lengths (the entry's deviation says so); tests/_support/fingerprint.py has no candidate that takes "
                "a {stat} over group means of per-sequence values (its per_seq {stat} is over the sequences), so "
                "the fingerprint would reject the stated {stat} on any batch that tells them apart; a proof needs "
                "that candidate first. tests/frameworks/test_proof_prime_rl_old2.py runs these statements and "
                "proves completion_len/mean, seq_len/mean, prompt_len/mean and reward/mean")
_THROUGHPUT = ("v0.2..v0.4.0: the entry states the RL TRAINER's perf/throughput (trainer/rl/train.py@v0.2:393, "
               "PerfCounter's rolling rate); the orchestrator logs another quantity under the same name "
               "(orchestrator.py@v0.4.0:543, num_tokens / generate_completions_time), so the v0.4.0 orchestrator "
               "run of tests/frameworks/test_proof_prime_rl_old2.py cannot prove it; the trainer's loop at v0.4.0 "
               "(trainer/rl/train.py@v0.4.0) is not vendored (the v0.5.0 loop, proved by test_proof_prime_rl_old.py, "
               "is another file)")

#: (framework, key, trainer) -> why its entry of these releases is not proven here
ENTRY_WHY: dict[tuple[str, str, str | None], str] = {
    ("prime_rl", "completion_len/max", "rl"): _PER_PROBLEM.format(col="completion_len", stat="max", line=572),
    ("prime_rl", "completion_len/min", "rl"): _PER_PROBLEM.format(col="completion_len", stat="min", line=573),
    ("prime_rl", "perf/throughput", "rl"): _THROUGHPUT,
}
