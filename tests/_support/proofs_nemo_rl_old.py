"""NeMo-RL v0.2.0's own GRPO training metrics (then ``nemo_reinforcer``), from the tag's files vendored under
tests/data/frameworks/nemo_rl/v0.2.0/ (tests/_support/vendored.py, a further tag), for the fingerprint proofs of the
entries of v0.1.0..v0.2.0 (tests/frameworks/test_proof_nemo_rl_old.py). Nothing here computes a metric. The
simulated ``torch.distributed`` (:class:`proofs_nemo_rl.NemoDist` in :class:`proofs_nemo_rl.TorchOnCPU`) and the
CPU placement (:func:`proofs_nemo_rl.on_cpu`) are tests/_support/proofs_nemo_rl.py's (imported, not copied).

Loaded whole (``vendored.load(..., tag="v0.2.0")``), with stand-ins for imports the code under test does not use:

* ``nemo_reinforcer/distributed/collectives.py`` (torch only) and ``nemo_reinforcer/distributed/batched_data_dict.py``
  (``BatchedDataDict``: ``shard_by_batch_size``, ``slice``, ``make_microbatch_iterator``);
* ``nemo_reinforcer/algorithms/utils.py`` (``masked_mean``, ``calculate_kl_penalty_joschu2020``): stand-ins for
  ``transformers`` (``AutoTokenizer``: ``get_tokenizer`` only), ``nemo_reinforcer.data`` (``hf_datasets``:
  ``get_tokenizer``'s chat templates only) and ``nemo_reinforcer.models.policy`` (``TokenizerConfig``, an
  annotation);
* ``nemo_reinforcer/algorithms/interfaces.py`` (``LossFunction``) and ``nemo_reinforcer/algorithms/loss_functions.py``
  (``ClippedPGLossFn``): stand-in for ``nemo_reinforcer.models.dtensor.parallelize``
  (``get_logprobs_from_vocab_parallel_logits``: the DTensor branch only; the logits here are plain tensors).

Compiled from the files' own text (their modules import Ray, vLLM, transformers' models and the FSDP/DTensor
parallelisation):

* ``nemo_reinforcer/models/policy/dtensor_policy_worker.py``: ``DTensorPolicyWorker.train`` (the default worker:
  ``policy.dtensor_cfg.enabled: true`` in examples/configs/grpo_math_1B.yaml@v0.2.0:46): the global-batch loop,
  ``make_microbatch_iterator``, the loss function of every micro-batch, ``loss_metrics['lr']``, the division by
  ``num_microbatches``, backward, grad norm, ``optimizer.step()`` and ``scheduler.step()`` after each global batch,
  the all-reduced ``global_loss``, the micro-batch metric lists;
* ``nemo_reinforcer/models/policy/hf_policy.py``: ``HfPolicy.train`` (``shard_by_batch_size`` over the data-parallel
  ranks, ``results[0]['global_loss']``, every worker's micro-batch metrics concatenated);
* ``nemo_reinforcer/algorithms/grpo.py``: the statements of ``grpo_train`` from ``print("\\n📊 Training Results:")``
  to ``logger.log_metrics(metrics, step + 1, prefix="train")`` (:575-609: the ``metrics`` dict, the ``np.mean`` /
  ``np.sum`` over the lists, the printed Loss line).

Stand-ins for the machinery around them (none computes a proven metric): the model is :class:`TinyLM` (an
embedding and a linear head over a tiny vocabulary, its output's ``logits``), one replica per simulated rank (ranks
run in threads, proofs_nemo_rl's ``NemoDist`` meets them at ``all_reduce``); ``find_tied_parameters`` gives [];
``get_grad_norm`` / ``clip_grad_by_total_norm_`` (nemo_reinforcer.models.dtensor.parallelize, the DTensor-aware grad
norm; the grad norm is not proven here) are torch's ``get_total_norm`` / ``clip_grads_with_norm_``; a real
``torch.optim.SGD`` and ``LambdaLR`` scheduler (recorded: the lr each global batch used); the worker group runs each
rank's ``train`` on its shard; ``timer.get_timing_metrics`` gives {}; ``logger.log_metrics`` records its dict; the
loss function is the real ``ClippedPGLossFn`` wrapped to record the logits and micro-batch of every call (for the
proofs' per-token values, which they get from the same ``ClippedPGLossFn`` run on each loss-masked token alone).

v0.1.1 (tests/data/frameworks/nemo_rl/v0.1.1/, for the generation-length entries of v0.1.0..v0.1.1):
``nemo_reinforcer/distributed/batched_data_dict.py`` (with ``collectives.py``) and
``nemo_reinforcer/data/llm_message_utils.py`` (``batched_message_log_to_flat_message``; stand-in
``nemo_reinforcer.data.interfaces``, TypedDict annotations) loaded; ``grpo.py``'s ``generate_responses`` and
``validate`` compiled from the file's text, and ``grpo_train``'s logging statements (:629-660). Stand-ins: the vLLM
generation worker (:class:`Generation`: each prompt then a given number of generated tokens, right-padded, with
their unpadded lengths), the tokenizer's ``batch_decode`` (texts not read by the metrics), ``calculate_rewards``
(the environments: given rewards), ``Timer`` (timing only), ``print_message_log_samples`` (a print), the
validation dataloader (a list of message-log batches, the last one shorter).
"""
from __future__ import annotations

import ast
import contextlib
import copy
import io
import types
import warnings
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Dict, Optional

import numpy as np
import torch

from _support import proofs_nemo_rl as NR
from _support import vendored
from _support.framework_code import current_rank, run_ranks

FW = "nemo_rl"
TAG = "v0.2.0"
RELEASE = vendored.release(FW, TAG)
PKG = "nemo_reinforcer"
S = vendored.stand_in


def _load(path: str, stand_ins: dict[str, types.ModuleType] | None = None) -> types.ModuleType:
    return vendored.load(FW, f"{PKG}/{path}", tag=TAG, stand_ins=stand_ins)


def code() -> types.SimpleNamespace:
    """The tag's loaded modules (see the module docstring)."""
    _load("distributed/collectives.py")
    bdd = _load("distributed/batched_data_dict.py")
    utils = _load("algorithms/utils.py", {
        "transformers": S("transformers", AutoTokenizer=object),
        f"{PKG}.data": S(f"{PKG}.data", hf_datasets=None, __path__=[]),
        f"{PKG}.models": S(f"{PKG}.models", __path__=[]),
        f"{PKG}.models.policy": S(f"{PKG}.models.policy", TokenizerConfig=dict, __path__=[])})
    interfaces = _load("algorithms/interfaces.py")
    losses = _load("algorithms/loss_functions.py", {
        f"{PKG}.models": S(f"{PKG}.models", __path__=[]),
        f"{PKG}.models.dtensor": S(f"{PKG}.models.dtensor", __path__=[]),
        f"{PKG}.models.dtensor.parallelize": S(f"{PKG}.models.dtensor.parallelize",
                                               get_logprobs_from_vocab_parallel_logits=None)})
    return types.SimpleNamespace(bdd=bdd, utils=utils, interfaces=interfaces, losses=losses)


def _tree(repo_path: str) -> tuple[ast.Module, str]:
    path = vendored.provenance(FW, TAG).path(f"{PKG}/{repo_path}")
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path)), str(path)


def _method(repo_path: str, cls: str, name: str, ns: dict[str, Any]) -> Any:
    tree, path = _tree(repo_path)
    klass = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
    fn = next(n for n in klass.body if isinstance(n, ast.FunctionDef) and n.name == name)
    fn.decorator_list = []
    exec(compile(ast.Module(body=[fn], type_ignores=[]), path, "exec"), ns)     # noqa: S102 - the tag's own code
    return ns[name]


def _statements(repo_path: str, fn: str, lines: tuple[int, int]) -> types.CodeType:
    """The statements of ``fn`` (at any depth) that lie within ``lines``: the innermost block holding them."""
    tree, path = _tree(repo_path)
    func = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == fn)
    found: list[ast.stmt] = []

    def walk(body: list[ast.stmt]) -> None:
        inside = [n for n in body if lines[0] <= n.lineno and n.end_lineno <= lines[1]]
        if inside:
            found.extend(inside)
            return
        for n in body:
            for field in ("body", "orelse", "finalbody"):
                sub = getattr(n, field, None)
                if isinstance(sub, list) and sub and isinstance(sub[0], ast.stmt):
                    walk(sub)
            for h in getattr(n, "handlers", []):
                walk(h.body)
    walk(func.body)
    assert found, (path, fn, lines)
    return compile(ast.Module(body=found, type_ignores=[]), path, "exec")


class TinyLM(torch.nn.Module):
    """A tiny causal LM: an embedding and a linear head; its output has ``logits`` as a HF model's has."""

    def __init__(self, vocab: int, hidden: int):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, hidden)
        self.head = torch.nn.Linear(hidden, vocab)

    def forward(self, input_ids: torch.Tensor, **_: Any) -> Any:
        return types.SimpleNamespace(logits=self.head(torch.tanh(self.embed(input_ids))))


def _grad_norm(parameters: Any, dp_group: Any = None, tp_group: Any = None, dtype: Any = None) -> float:
    grads = [p.grad for p in parameters if p.grad is not None]
    return float(torch.nn.utils.get_total_norm(grads))


def _clip(parameters: Any, max_grad_norm: float, total_norm: float, dtype: Any = None) -> None:
    grads = [p.grad for p in parameters if p.grad is not None]
    torch.nn.utils.clip_grads_with_norm_(grads, max_grad_norm, torch.tensor(total_norm))


@dataclass
class Call:
    rank: int
    logits: torch.Tensor          # what the model gave the loss function
    mb: Any                       # the micro-batch (a SlicedDataDict)
    metrics: dict[str, Any]       # what the loss function returned


@dataclass
class GrpoRun:
    metrics: dict[str, Any]       # logger.log_metrics(metrics, prefix="train")
    printed: str                  # the statements' stdout
    calls: list[Call]             # every loss-function call, by rank then order
    lr_used: list[list[float]]    # [rank][global batch] the lr of that global batch's optimizer step
    loss_fn: Any
    num_microbatches: int
    global_loss: list[float]      # HfPolicy's train_results['loss']: rank 0's all-reduced global-batch losses


def batch(C: types.SimpleNamespace, n: int, *, vocab: int, seq_len: int, lengths: list[int], prompt: list[int],
          seed: int, adv_scale: float = 6.0) -> Any:
    """A GRPO train_data BatchedDataDict (grpo.py@v0.2.0:468-480's keys): right-padded sequences of ``lengths``
    tokens, the first ``prompt`` of them the prompt (token_mask 0), advantages (positive, from ``adv_scale`` to twice
    it: a loss of several units, so its 4-decimal print keeps 5 significant digits) and log-probs per token."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (n, seq_len), generator=g)
    token_mask = torch.zeros(n, seq_len)
    for i, (length, p) in enumerate(zip(lengths, prompt)):
        token_mask[i, p:length] = 1.0
        ids[i, length:] = 0
    adv = (torch.rand(n, generator=g) * adv_scale + adv_scale).unsqueeze(-1).expand(n, seq_len).clone()
    lp = -torch.rand(n, seq_len, generator=g) * 3 - 0.2
    return C.bdd.BatchedDataDict({
        "input_ids": ids, "input_lengths": torch.tensor(lengths), "advantages": adv * token_mask,
        "prev_logprobs": lp * token_mask, "generation_logprobs": (lp + 0.05 * torch.randn(n, seq_len, generator=g))
        * token_mask, "reference_policy_logprobs": (lp - 0.4 * torch.rand(n, seq_len, generator=g)) * token_mask,
        "token_mask": token_mask, "sample_mask": torch.ones(n)})


def run_grpo_train(data: Any, C: types.SimpleNamespace, loss_cfg: dict[str, Any], *, dp: int, gbs: int, mbs: int,
                   vocab: int, lr: float = 0.5, seed: int = 3) -> GrpoRun:
    """HfPolicy.train -> DTensorPolicyWorker.train on ``dp`` simulated ranks, then grpo_train's metric statements."""
    torch.manual_seed(seed)
    base = TinyLM(vocab, 8)
    models = [copy.deepcopy(base) for _ in range(dp)]
    lr_used: list[list[float]] = [[] for _ in range(dp)]
    calls: list[Call] = []
    real_fn = C.losses.ClippedPGLossFn(loss_cfg)

    def loss_fn(logits: torch.Tensor, mb: Any) -> Any:
        loss, metrics = real_fn(logits, mb)
        calls.append(Call(current_rank()[1], logits.detach().clone(), mb, dict(metrics)))
        return loss, metrics

    tnp = NR.TorchOnCPU()
    wns: dict[str, Any] = {"torch": tnp, "os": __import__("os"), "nullcontext": contextlib.nullcontext,
                           "defaultdict": defaultdict, "find_tied_parameters": lambda model: [],
                           "get_grad_norm": _grad_norm, "clip_grad_by_total_norm_": _clip,
                           "BatchedDataDict": C.bdd.BatchedDataDict, "LossFunction": C.interfaces.LossFunction,
                           "Optional": Optional, "Dict": Dict, "Any": Any}
    worker_train = _method("models/policy/dtensor_policy_worker.py", "DTensorPolicyWorker", "train", wns)
    workers = []
    for r in range(dp):
        model = models[r]
        opt = torch.optim.SGD(model.parameters(), lr=lr)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + 0.7 * s))

        class Sched:
            def __init__(self, rank: int, opt: Any, sched: Any):
                self.rank, self.opt, self.sched = rank, opt, sched

            def step(self) -> None:
                lr_used[self.rank].append(self.opt.param_groups[0]["lr"])
                self.sched.step()
        mesh = types.SimpleNamespace(get_group=lambda: None)
        workers.append(types.SimpleNamespace(
            model=model, optimizer=opt, scheduler=Sched(r, opt, sched), dp_size=dp, dtype=torch.float32,
            max_grad_norm=1.0, dp_mesh=mesh, tp_mesh=mesh,
            cfg={"dtensor_cfg": {"tensor_parallel_size": 1}, "model_name": "tiny",
                 "train_global_batch_size": gbs, "train_micro_batch_size": mbs}))

    class WorkerGroup:
        def run_all_workers_multiple_data(self, method: str, shards: list, common_kwargs: dict, **_: Any) -> list:
            assert method == "train"
            return run_ranks(lambda r: worker_train(workers[r], shards[r], **common_kwargs), world=dp)

        def get_all_worker_results(self, futures: list) -> list:
            return futures

    pns: dict[str, Any] = {"defaultdict": defaultdict, "Optional": Optional, "BatchedDataDict": C.bdd.BatchedDataDict,
                           "LossFunction": C.interfaces.LossFunction}
    policy_train = _method("models/policy/hf_policy.py", "HfPolicy", "train", pns)
    policy = types.SimpleNamespace(dp_size=dp, worker_group=WorkerGroup(),
                                   cfg={"train_global_batch_size": gbs, "train_micro_batch_size": mbs})
    with NR.on_cpu(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*CUDA is not available.*")
        warnings.filterwarnings("ignore", message=".*autocast.*")
        train_results = policy_train(policy, data, loss_fn)
    logged: list[dict[str, Any]] = []
    gns: dict[str, Any] = {
        "np": np, "train_results": train_results, "rewards": torch.tensor([1.0, 0.0, 0.5]),
        "rollout_metrics": {"mean_gen_tokens_per_sample": 7.0}, "step": 0,
        "timer": types.SimpleNamespace(get_timing_metrics=lambda reduction_op=None: {}),
        "logger": types.SimpleNamespace(log_metrics=lambda m, step, prefix=None: logged.append(
            {"prefix": prefix, **m}))}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(_statements("algorithms/grpo.py", "grpo_train", (575, 609)), gns)    # noqa: S102 - grpo.py's own
    train = [m for m in logged if m["prefix"] == "train"]
    assert len(train) == 1, logged
    calls.sort(key=lambda c: c.rank)          # stable: each rank's calls in their order
    return GrpoRun(train[0], out.getvalue(), calls, lr_used, real_fn, (gbs // dp) // mbs,
                   train_results["loss"].tolist())


def per_token(run: GrpoRun, call: Call, key: str) -> list[list[float]]:
    """The call's micro-batch, [sequence][loss-masked token]: ``key`` of ClippedPGLossFn (the tag's own, the run's
    config) run on the same logits with every token but one masked out (its masked_mean is that token's value)."""
    mask = call.mb["token_mask"][:, 1:] * call.mb["sample_mask"].unsqueeze(-1)
    seqs = []
    with NR.on_cpu():
        for i in range(mask.shape[0]):
            vals = []
            for j in torch.nonzero(mask[i]).flatten().tolist():
                one = type(call.mb)({k: v for k, v in call.mb.items()})
                tm = torch.zeros_like(call.mb["token_mask"])
                tm[i, j + 1] = 1.0
                one["token_mask"] = tm
                vals.append(float(run.loss_fn(call.logits, one)[1][key]))
            if vals:
                seqs.append(vals)
    return seqs


def steps_of(run: GrpoRun, key: str, dp: int) -> list:
    """[logged step][global batch][rank][micro-batch][sequence][token] of ``key``'s per-token values."""
    per_rank = [[c for c in run.calls if c.rank == r] for r in range(dp)]
    n = run.num_microbatches
    gbs = len(per_rank[0]) // n
    assert all(len(p) == gbs * n for p in per_rank), [len(p) for p in per_rank]
    return [[[[per_token(run, per_rank[r][g * n + u], key) for u in range(n)] for r in range(dp)]
              for g in range(gbs)]]


# ------------------------------------------------------------------------------------------------ v0.1.1: lengths
TAG_011 = "v0.1.1"
RELEASE_011 = vendored.release(FW, TAG_011)


def _tree_011(repo_path: str) -> tuple[ast.Module, str]:
    path = vendored.provenance(FW, TAG_011).path(f"{PKG}/{repo_path}")
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path)), str(path)


class _Timer:
    """nemo_reinforcer.utils.timer.Timer (the timing metrics only, not proven): times nothing."""

    @contextlib.contextmanager
    def time(self, name: str) -> Any:
        yield

    def get_timing_metrics(self, reduction_op: str = "sum") -> dict[str, float]:
        return {}

    def reset(self) -> None:
        pass


def code_011() -> types.SimpleNamespace:
    """v0.1.1's BatchedDataDict, batched_message_log_to_flat_message (loaded; stand-in
    ``nemo_reinforcer.data.interfaces``, its TypedDict annotations) and grpo.py's ``generate_responses`` and
    ``validate`` compiled from the file's text (the module imports Ray, vLLM and the whole training stack)."""
    vendored.load(FW, f"{PKG}/distributed/collectives.py", tag=TAG_011)
    bdd = vendored.load(FW, f"{PKG}/distributed/batched_data_dict.py", tag=TAG_011)
    msgs = vendored.load(FW, f"{PKG}/data/llm_message_utils.py", tag=TAG_011, stand_ins={
        f"{PKG}.data.interfaces": S(f"{PKG}.data.interfaces", LLMMessageLogType=list, FlatMessagesType=dict,
                                    TaskDataSpec=dict)})
    tree, path = _tree_011("algorithms/grpo.py")
    fns = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in ("generate_responses", "validate")]
    ns: dict[str, Any] = {
        "torch": torch, "Timer": _Timer, "BatchedDataDict": bdd.BatchedDataDict,
        "batched_message_log_to_flat_message": msgs.batched_message_log_to_flat_message,
        "print_message_log_samples": lambda *a, **k: None,
        **{n: Any for n in ("GenerationInterface", "GenerationDatumSpec", "DatumSpec", "StatefulDataLoader",
                            "EnvironmentInterface", "MasterConfig", "Dict", "Tuple", "List")}}
    exec(compile(ast.Module(body=fns, type_ignores=[]), path, "exec"), ns)        # noqa: S102 - the tag's own
    return types.SimpleNamespace(bdd=bdd, msgs=msgs, ns=ns, generate_responses=ns["generate_responses"],
                                 validate=ns["validate"])


class Generation:
    """The vLLM generation worker as generate_responses calls it: each prompt's tokens, then ``gen[i]`` generated
    tokens, right-padded; ``unpadded_sequence_lengths`` prompt + generated."""

    def __init__(self, gen: list[int], vocab: int = 13):
        self.gen, self.vocab, self.at = list(gen), vocab, 0

    def generate(self, data: Any) -> dict[str, Any]:
        ids, lengths = data["input_ids"], data["input_lengths"]
        n = ids.shape[0]
        gen = self.gen[self.at:self.at + n]
        self.at += n
        width = int(max(int(k) + g for k, g in zip(lengths, gen)))
        out = torch.zeros(n, width, dtype=torch.long)
        for i, (k, g) in enumerate(zip(lengths.tolist(), gen)):
            out[i, :k] = ids[i, :k]
            out[i, k:k + g] = 1 + (torch.arange(g) % (self.vocab - 1))
        return {"output_ids": out, "unpadded_sequence_lengths": lengths + torch.tensor(gen)}


def message_batch(C: types.SimpleNamespace, prompts: list[int]) -> Any:
    """A batch of single-turn message logs, the user turn of ``prompts[i]`` tokens."""
    logs = [[{"role": "user", "content": "q", "token_ids": torch.arange(1, p + 1)}] for p in prompts]
    return C.bdd.BatchedDataDict({"message_log": logs, "task_name": ["math"] * len(prompts)})


def run_train_generation(prompts: list[int], gen: list[int]) -> tuple[dict[str, Any], str]:
    """generate_responses on one rollout batch (as grpo_train calls it, grpo.py@v0.1.1:480-495), then grpo_train's
    logging statements (:629-660: metrics, the printed Mean Generation Length, logger.log_metrics)."""
    C = code_011()
    batch = message_batch(C, prompts)
    flat, input_lengths = C.msgs.batched_message_log_to_flat_message(batch["message_log"],
                                                                     pad_value_dict={"token_ids": 0})
    data = C.bdd.BatchedDataDict({"input_ids": flat["token_ids"], "input_lengths": input_lengths})
    _, _, gen_metrics = C.generate_responses(Generation(gen), data, batch, types.SimpleNamespace(
        batch_decode=lambda ids, skip_special_tokens=True: ["a"] * len(ids)), input_lengths)
    tree, path = _tree_011("algorithms/grpo.py")
    func = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "grpo_train")
    found: list[ast.stmt] = []

    def walk(body: list[ast.stmt]) -> None:
        inside = [n for n in body if 629 <= n.lineno and n.end_lineno <= 660]
        if inside:
            found.extend(inside)
            return
        for n in body:
            for field in ("body", "orelse"):
                sub = getattr(n, field, None)
                if isinstance(sub, list) and sub and isinstance(sub[0], ast.stmt):
                    walk(sub)
    walk(func.body)
    logged: list[dict[str, Any]] = []
    ns: dict[str, Any] = {
        "np": np, "gen_metrics": gen_metrics, "rewards": torch.tensor([1.0, 0.0]), "step": 0, "timer": _Timer(),
        "train_results": {"loss": torch.tensor([0.5]), "all_mb_metrics": {}},
        "logger": types.SimpleNamespace(log_metrics=lambda m, step, prefix=None: logged.append({"prefix": prefix,
                                                                                               **m}))}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(ast.Module(body=found, type_ignores=[]), path, "exec"), ns)    # noqa: S102 - grpo.py's own
    train = [m for m in logged if m["prefix"] == "train"]
    assert len(train) == 1, logged
    return train[0], out.getvalue()


def run_validate(batches: list[list[int]], gen: list[int], max_val_samples: int, val_batch_size: int
                 ) -> tuple[dict[str, Any], str]:
    """grpo.py@v0.1.1's validate (:668-774) over the validation batches ``batches`` (each its prompts' lengths)."""
    C = code_011()
    loader = [message_batch(C, b) for b in batches]
    rewards = iter([float(i % 3 == 0) for i in range(sum(len(b) for b in batches))])

    def calculate_rewards(batch: Any, envs: Any) -> tuple[torch.Tensor, list]:
        n = len(batch["message_log"])
        return torch.tensor([next(rewards) for _ in range(n)]), list(batch["message_log"])
    C.ns["calculate_rewards"] = calculate_rewards
    out = io.StringIO()
    tok = types.SimpleNamespace(eos_token_id=0, batch_decode=lambda ids, skip_special_tokens=True: ["a"] * len(ids))
    cfg = {"grpo": {"max_val_samples": max_val_samples, "val_batch_size": val_batch_size},
           "logger": {"num_val_samples_to_print": 0}}
    with contextlib.redirect_stdout(out):
        val_metrics, _ = C.validate(Generation(gen), loader, tok, {}, 0, cfg)
    return val_metrics, out.getvalue()


#: (framework, key, trainer) -> why its entry of these releases is not proven here
ENTRY_WHY: dict[tuple[str, str, str | None], str] = {}
