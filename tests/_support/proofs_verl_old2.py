"""veRL releases beside those of tests/_support/proofs_verl_old.py, run on CPU for the fingerprint proofs of the
entries only they cover (tests/frameworks/test_proof_verl_old2.py; each proof in a child process with the release
first on sys.path, tests/_support/releases.py): verl 0.6.1, 0.6.0, 0.4.1, 0.4.0, 0.3.0.post1, 0.2.0.post2, and the
FSDP SFT trainer of 0.5.0.

What runs is the release's own code: through the harness of proofs_verl_old.py (the legacy workers' ``update_policy``
/ ``update_critic`` with the release's ``core_algos``, collected with its ``DataProto.concat`` and reduced with its
``reduce_metrics``; ``fsdp_workers.py``'s ``update_actor`` / ``update_critic`` compiled from the release's text;
the stand-ins listed in that module's docstring), and here the trainer's own functions compiled from the release's
text (:func:`method`: ``apply_kl_penalty``, ``RayPPOTrainer._validate``,
``compute_rollout_importance_weights_and_add_to_batch``, ``FSDPSFTTrainer.training_step`` ...), each with the
stand-ins its docstring names. Up to v0.3.0.post1 the workers import flash_attn at module level and move batches to
cuda: :func:`flash_attn_stand_in` and :func:`cuda_moves_stay_on_cpu` (never computing with them). Nothing here
computes a metric.

At the end, :data:`ENTRY_WHY`: the entries of these releases no proof fingerprints, each with why.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from _support import proofs_verl_old as O

#: gradient-accumulation steps of the legacy workers on the proofs' batch (ppo_mini_batch_size // micro-batch size):
#: v0.6.x multiplies each micro-batch's logged loss by loss_scale_factor = 1 / this (dp_actor.py@v0.6.1:436,522)
GRAD_ACCUM = O.MINI // O.MICRO


def obs(updates: list[O.Update], key: str, kind: str, index: int, scale: float = 1.0) -> list:
    """(logged value, captured batch) of every run."""
    return [(u.metrics[key], u.cap.batch(kind, index, scale)) for u in updates]


def layout(values: list, shares=((3, 1, 3), (2, 4, 1, 2))) -> list:
    """Sequences cut into uneven groups ([rank][group][sequence]): a driver metric is computed once over the whole
    batch, so any such layout is one it could have been averaged over instead."""
    out, i = [], 0
    for rank in shares:
        groups = []
        for size in rank:
            groups.append(values[i:i + size])
            i += size
        out.append(groups)
    assert i == len(values), (i, len(values))
    return out


def layouts(logged: float, seqs: list) -> list:
    """The logged value against three layouts of the same sequences (as given, shortest first, longest first)."""
    orders = (list(seqs), sorted(seqs, key=len), sorted(seqs, key=len, reverse=True))
    return [(logged, [[layout(list(o))]]) for o in orders]


def one_value(x: float) -> list:
    """A scalar as the fingerprint's batch: one logged step, one optimizer step, one rank, one value."""
    return [[[[[[float(x)]]]]]]


def norm_steps(norms: list[float]) -> list:
    """Rank 0's optimizer steps (mini-batches, in order) as ``steps[0][mini-batch][rank][micro][seq][token]``: one
    value each (DataProto.concat keeps the first worker's metrics: rank 0's)."""
    return [[[[[[n]]]] for n in norms]]


def per_rank(run: O.WorkerSteps, key: str) -> list:
    """(logged value, the ranks' own values) of every training step: ``steps[0][0][rank] = [[value]]``."""
    return [(m[key], [[[[[[ranks[r][key]]]] for r in range(O.WORLD)]]]) for m, ranks in zip(run.metrics, run.per_rank)]


# --------------------------------------------------------------------------------------------- up to v0.3
@contextlib.contextmanager
def flash_attn_stand_in():
    """What verl 0.3.0.post1 needs to import and run its legacy workers on a CPU, none of which the metric code
    computes with:

    * a stand-in ``flash_attn`` module (with ``flash_attn.bert_padding``'s four names) in ``sys.modules`` before the
      workers import: dp_actor.py and dp_critic.py@v0.3.0.post1:34 import ``pad_input``, ``unpad_input``,
      ``rearrange``, ``index_first_axis`` at module level for the remove-padding forward, which the proofs never run
      (use_remove_padding off, ``_forward_micro_batch`` replaced by proofs_verl_old's tiny model); the stand-in is
      not a package, so torch_functional.py's ``try: from flash_attn.ops.triton.cross_entropy import ...`` fails as
      without flash_attn and ``logprobs_from_logits`` takes its plain-torch branch;
    * ``torch.cuda.current_device`` -> ``"cpu"`` (where update_policy / update_critic / fsdp_workers.py move each
      micro-batch), ``torch.cuda.max_memory_allocated`` / ``max_memory_reserved`` -> 0 (fsdp_workers.py's memory
      readings, not read by these proofs).

    Installed only when flash_attn is not importable; everything is restored on exit."""
    import importlib.util
    import sys
    import types

    import torch
    added = []
    if importlib.util.find_spec("flash_attn") is None:
        fa, bp = types.ModuleType("flash_attn"), types.ModuleType("flash_attn.bert_padding")

        def _unused(*_a, **_k):
            raise AssertionError("the flash_attn stand-in was called: the proof runs code that uses flash_attn")
        for name in ("pad_input", "unpad_input", "rearrange", "index_first_axis"):
            setattr(bp, name, _unused)
        fa.bert_padding = bp
        for name, mod in (("flash_attn", fa), ("flash_attn.bert_padding", bp)):
            sys.modules[name] = mod
            added.append(name)
    patches = {"current_device": lambda: "cpu", "max_memory_allocated": lambda *a, **k: 0,
               "max_memory_reserved": lambda *a, **k: 0}
    saved = {k: getattr(torch.cuda, k) for k in patches}
    for k, v in patches.items():
        setattr(torch.cuda, k, v)
    try:
        yield
    finally:
        for k, v in saved.items():
            setattr(torch.cuda, k, v)
        for name in added:
            sys.modules.pop(name, None)


@contextlib.contextmanager
def cuda_moves_stay_on_cpu():
    """verl 0.2.0.post2's fsdp_workers.py update_actor / update_critic move the batch with ``data.to('cuda')`` and
    ``data.batch.cuda()`` (v0.2.0.post2:410,420,800), dp_actor / dp_critic each micro-batch with ``data.cuda()``:
    device moves a CPU cannot make, none of them computing a metric. ``DataProto.to`` moves to the CPU instead and
    ``TensorDict.cuda`` is the identity while this runs."""
    from tensordict import TensorDict
    from verl import DataProto
    to, cuda = DataProto.to, TensorDict.cuda
    DataProto.to = lambda self, device: to(self, "cpu")
    TensorDict.cuda = lambda self, *a, **k: self
    try:
        yield
    finally:
        DataProto.to, TensorDict.cuda = to, cuda


# --------------------------------------------------------------------------------------------- the release's text
def method(relpath: str, cls: str | None, name: str, namespace: dict[str, Any]):
    """``cls.name`` (a module-level function when ``cls`` is None) of the release's ``verl/<relpath>``, compiled from
    the file's own text without its decorators, its globals ``namespace``: the module is not imported (ray_trainer.py
    imports torchdata, which the test environment lacks, for its dataloader)."""
    from pathlib import Path

    import verl

    from _support.framework_code import _methods_from_source
    path = Path(verl.__file__).resolve().parent / relpath
    return _methods_from_source(path, cls, [name], namespace, keep=lambda d: False)[name]


# --------------------------------------------------------------------------------------------- reward KL (<= 0.3)
@dataclass
class RewardKL:
    metrics: dict[str, float]            # what apply_kl_penalty returned
    kld: list[list[float]]               # the per-token kl it averaged (masked_mean(kld, mask, axis=-1)), valid tokens
    coef_after: float                    # the controller's coefficient after its update


def run_apply_kl_penalty(kl_penalty: str = "kl", seed: int = 7, coef: float = 0.05) -> RewardKL:
    """``apply_kl_penalty`` of the release's ray_trainer.py (v0.3.0.post1:136-166, what fit() calls on the driver's
    whole batch when the reward carries the KL) on the two ranks' shares of proofs_verl_old's batch concatenated,
    with the release's AdaptiveKLController (so the coefficient moves: the logged one is read before its update).
    Its ``masked_mean`` (the module's name, given here as veRL's own function, recorded) is captured."""
    import torch
    import verl.utils.torch_functional as verl_F
    from verl import DataProto
    from verl.trainer.ppo import core_algos
    full = DataProto.concat([O.batch(r, seed) for r in range(O.WORLD)])
    full.batch["token_level_scores"] = torch.zeros_like(full.batch["old_log_probs"])
    seen: list[list[list[float]]] = []

    def masked_mean(values, mask, axis=None, **kw):
        seen.append(O._ragged(values.detach(), mask))
        return verl_F.masked_mean(values, mask, axis=axis, **kw)

    fn = method("trainer/ppo/ray_trainer.py", None, "apply_kl_penalty",
                {"DataProto": DataProto, "core_algos": core_algos, "torch": torch, "masked_mean": masked_mean})
    ctrl = core_algos.AdaptiveKLController(init_kl_coef=coef, target_kl=0.01, horizon=100)
    _, metrics = fn(full, kl_ctrl=ctrl, kl_penalty=kl_penalty)
    assert len(seen) == 1, len(seen)
    return RewardKL({k: float(v) for k, v in metrics.items()}, seen[0], float(ctrl.value))


# --------------------------------------------------------------------------------------------- validation (<= 0.3)
#: the validation batches (prompts per batch, uneven) and each prompt's data source
VAL_BATCHES = ((5, ("a", "b", "a", "a", "b")), (3, ("a", "b", "b")), (4, ("b", "a", "b", "b")))


@dataclass
class Validation:
    metrics: dict[str, float]                      # what _validate returned
    scores: dict[str, list[list[float]]]           # per data source, per validation batch: the samples' scores


def run_validate(seed: int = 7, n: int = 2) -> Validation:
    """``RayPPOTrainer._validate`` of the release's ray_trainer.py (v0.3.0.post1:486-573, with its
    ``_maybe_log_val_generations``), compiled from its text, over :data:`VAL_BATCHES` with ``val_kwargs.n`` samples
    per prompt. Stand-ins for what the metric does not compute with: the dataloader (the batches as dicts of
    tensors and numpy arrays), the tokenizer (decode only), the rollout worker group (``world_size`` 2,
    ``generate_sequences`` returns responses of the padded batch) and the validation reward function (a made-up
    score per sample at its last response token, recorded per data source and batch: what the metric is given)."""
    import types

    import numpy as np
    import torch
    from omegaconf import OmegaConf
    from verl import DataProto
    from verl.protocol import pad_dataproto_to_divisor, unpad_dataproto
    g = torch.Generator().manual_seed(seed)
    loader = []
    for size, sources in VAL_BATCHES:
        ids = torch.randint(3, O.VOCAB, (size, O.PROMPT_W), generator=g)
        loader.append({"input_ids": ids, "attention_mask": torch.ones_like(ids),
                       "position_ids": torch.arange(O.PROMPT_W).expand(size, -1).clone(),
                       "raw_prompt_ids": np.array([list(r) for r in ids.tolist()] + [None], dtype=object)[:-1],
                       "data_source": np.array(sources, dtype=object)})
    scores: dict[str, list[list[float]]] = {}

    def reward_fn(batch):
        out = torch.zeros(len(batch), O.RESP_W)
        values = torch.round(torch.rand(len(batch), generator=g) * 8) / 4       # 0, 0.25 .. 2: ties on purpose
        for src in sorted(set(batch.non_tensor_batch["data_source"])):    # sorted: the same order in every process
            scores.setdefault(str(src), []).append([])
        for i, (v, src) in enumerate(zip(values.tolist(), batch.non_tensor_batch["data_source"])):
            out[i, -1] = v
            scores[str(src)][-1].append(float(v))
        return out

    def generate_sequences(batch):
        return DataProto.from_dict(tensors={"responses": torch.randint(3, O.VOCAB, (len(batch), O.RESP_W),
                                                                       generator=g)})

    cfg = OmegaConf.create({"actor_rollout_ref": {"rollout": {"val_kwargs": {"n": n, "do_sample": True}}},
                            "reward_model": {"enable": False}, "trainer": {"val_generations_to_log_to_wandb": 0,
                                                                           "logger": []}})
    ns = {"DataProto": DataProto, "pad_dataproto_to_divisor": pad_dataproto_to_divisor,
          "unpad_dataproto": unpad_dataproto, "torch": torch, "np": np}
    validate = method("trainer/ppo/ray_trainer.py", "RayPPOTrainer", "_validate", ns)
    log_gens = method("trainer/ppo/ray_trainer.py", "RayPPOTrainer", "_maybe_log_val_generations", ns)
    me = types.SimpleNamespace(config=cfg, val_dataloader=loader, val_reward_fn=reward_fn, global_steps=1,
                               tokenizer=types.SimpleNamespace(decode=lambda ids, **k: " ".join(map(str, ids.tolist())),
                                                               eos_token_id=1, pad_token_id=0),
                               actor_rollout_wg=types.SimpleNamespace(world_size=O.WORLD,
                                                                      generate_sequences=generate_sequences))
    me._maybe_log_val_generations = lambda **kw: log_gens(me, **kw)
    metrics = validate(me)
    return Validation({k: float(v) for k, v in metrics.items()}, scores)


# --------------------------------------------------------------------------------------------- SFT (<= 0.7.0)
#: per rank: 6 sequences of 8 positions (micro-batches of 2), each sequence's loss-mask length (uneven everywhere)
SFT_LEN, SFT_MICRO, SFT_LOSS_LENS = 8, 2, ((7, 2, 3, 6, 1, 5), (4, 7, 2, 2, 6, 1))


@dataclass
class SFTSteps:
    logged: list[dict[str, float]]           # rank 0's training_step output of each step
    per_rank: list[list[dict[str, float]]]   # every rank's output of each step
    tokens: list[list[list[list[list[float]]]]]   # [step][rank][micro-batch][sequence]: the per-token losses
    lr_used: list[float]                     # the rate rank 0's optimizer stepped with, per step
    lr_after: list[float]                    # rank 0's scheduler's rate after each step
    val_loss: float                          # fit()'s val/loss
    val_tokens: list[list[list[list[float]]]]   # [rank][validation batch][sequence]: the per-token losses


def _sft_batch(rank: int, seed: int, lens: tuple[int, ...]):
    import torch
    from tensordict import TensorDict
    g = torch.Generator().manual_seed(seed * 10 + rank)
    n = len(lens)
    ids = torch.randint(0, O.VOCAB, (n, SFT_LEN), generator=g)
    mask = torch.zeros(n, SFT_LEN, dtype=torch.long)
    for i, k in enumerate(lens):
        mask[i, 1:1 + k] = 1           # the response positions whose next token is learned
    return TensorDict({"input_ids": ids, "attention_mask": torch.ones_like(ids),
                       "position_ids": torch.arange(SFT_LEN).expand(n, -1).clone(), "loss_mask": mask},
                      batch_size=[n])


def run_sft(seed: int = 7, steps: int = 2, lr: float = 0.5) -> SFTSteps:
    """``FSDPSFTTrainer.training_step`` and ``_compute_loss_and_backward`` of the release's
    verl/trainer/fsdp_sft_trainer.py (v0.5.0:349-495), compiled from its text, on two simulated ranks (threads),
    ``steps`` steps, then the validation lines of its ``fit()`` (:743-752: ``validation_step`` per validation batch,
    ``torch.mean(torch.stack(val_losses))``). Stand-ins for what a CPU machine lacks and the metric code does not
    compute: ``self.fsdp_model`` a tiny causal LM (per-position logits from an embedding, its
    ``clip_grad_norm_`` torch's), the trainer's other attributes a namespace (config, SGD optimizer, the release's
    ``get_cosine_schedule_with_warmup``); ``is_cuda_available`` True, so the code takes the GPU branch (the
    ``all_reduce(step_loss, op=AVG)`` of :490-491); ``torch.distributed.all_reduce`` answered by the simulated
    group's exchange with the op's own meaning (AVG the mean, SUM the sum of the ranks' tensors); the memory log a
    no-op. ``nn.CrossEntropyLoss(reduction="none")`` is torch's, its per-token output recorded with the micro-batch's
    loss mask: what the logged loss is compared with."""
    import textwrap
    import types
    from contextlib import nullcontext
    from pathlib import Path

    import torch
    import torch.distributed as dist
    import verl
    from omegaconf import OmegaConf
    from tensordict import TensorDict
    from verl.utils.torch_functional import get_cosine_schedule_with_warmup

    from _support import framework_code as F
    rel = "trainer/fsdp_sft_trainer.py"
    cfg = OmegaConf.create({"data": {"micro_batch_size_per_gpu": SFT_MICRO, "balance_dp_token": False},
                            "model": {"strategy": "fsdp"}, "optim": {"clip_grad": 1.0},
                            "ulysses_sequence_parallel_size": 1})
    seen: dict[int, list] = {}

    class CrossEntropy(torch.nn.CrossEntropyLoss):
        def forward(self, logits, labels):
            out = super().forward(logits, labels)
            seen[F.current_rank()[1]][-1].append(out.detach())
            return out

    ns: dict[str, Any] = {"torch": torch, "nn": types.SimpleNamespace(CrossEntropyLoss=CrossEntropy),
                          "nullcontext": nullcontext, "is_cuda_available": True, "is_npu_available": False,
                          "log_gpu_memory_usage": lambda *a, **k: None, "logger": None, "TensorDict": TensorDict}
    train = method(rel, "FSDPSFTTrainer", "training_step", ns)
    compute = method(rel, "FSDPSFTTrainer", "_compute_loss_and_backward", ns)
    validate = method(rel, "FSDPSFTTrainer", "validation_step", ns)
    lines = (Path(verl.__file__).resolve().parent / rel).read_text().splitlines()
    a = next(i for i, t in enumerate(lines) if t.strip() == "val_losses = []")
    b = next(i for i in range(a, len(lines)) if lines[i].strip().startswith('metric = {"val/loss"'))
    val_block = textwrap.dedent("\n".join(lines[a:b + 1]))

    class TinyCausal(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lm = O.tiny_lm(1)

        def forward(self, input_ids, **_):
            return types.SimpleNamespace(logits=self.lm.emb[input_ids] + 0.5 * self.lm.pos[0])

        def clip_grad_norm_(self, max_norm):
            return torch.nn.utils.clip_grad_norm_(self.parameters(), max_norm)

    ops = {dist.ReduceOp.AVG: lambda ts: sum(ts) / len(ts), dist.ReduceOp.SUM: sum}

    def all_reduce(tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
        g, r = F.current_rank()
        tensor.copy_(ops[op](g.exchange(r, tensor.detach().clone())))

    def rank_run(rank: int):
        model = TinyCausal()
        opt = torch.optim.SGD(model.parameters(), lr=lr)
        me = types.SimpleNamespace(fsdp_model=model, model=types.SimpleNamespace(config=types.SimpleNamespace(
            vocab_size=O.VOCAB)), config=cfg, use_remove_padding=False, device_name="cpu", optimizer=opt,
            lr_scheduler=get_cosine_schedule_with_warmup(optimizer=opt, num_warmup_steps=1, num_training_steps=4),
            sharding_manager=None)
        masks: list = []

        def loss_and_backward(batch, do_backward=True):
            masks.append(batch["loss_mask"][:, :-1].clone())
            seen[rank].append([])
            return compute(me, batch, do_backward=do_backward)
        me._compute_loss_and_backward = loss_and_backward
        seen[rank] = []
        outs, used, after = [], [], []
        for k in range(steps):
            used.append(float(opt.param_groups[0]["lr"]))
            out = train(me, _sft_batch(rank, seed + k, SFT_LOSS_LENS[rank]))
            outs.append({key: float(v) for key, v in out.items()})
            after.append(float(me.lr_scheduler.get_last_lr()[0]))
        me.validation_step = lambda batch: validate(me, batch)
        loader = [dict(_sft_batch(rank, seed + 50 + v, lens).items()) for v, lens in
                  enumerate(((5, 1), (2, 6)) if rank == 0 else ((3, 7), (1, 4)))]
        vns = {"self": types.SimpleNamespace(val_dataloader=loader, config=cfg, device_name="cpu",
                                             validation_step=me.validation_step),
               "TensorDict": TensorDict, "torch": torch, "rank": 0}
        exec(val_block, vns)   # noqa: S102
        pairs = []
        for mask, rec in zip(masks, seen[rank]):
            loss = rec[0].reshape(mask.shape)
            pairs.append(O._ragged(loss, mask))
        return outs, used, after, float(vns["metric"]["val/loss"]), pairs

    saved = dist.all_reduce
    dist.all_reduce = all_reduce
    try:
        got = F.run_ranks(rank_run, O.WORLD)
    finally:
        dist.all_reduce = saved
    n_micro = len(SFT_LOSS_LENS[0]) // SFT_MICRO
    tokens = [[got[r][4][k * n_micro:(k + 1) * n_micro] for r in range(O.WORLD)] for k in range(steps)]
    val_tokens = [got[r][4][steps * n_micro:] for r in range(O.WORLD)]
    return SFTSteps(list(got[0][0]), [[got[r][0][k] for r in range(O.WORLD)] for k in range(steps)], tokens,
                    got[0][1], got[0][2], got[0][3], val_tokens)


# --------------------------------------------------------------------------------------------- mismatch (0.6.0)
@dataclass
class Mismatch:
    metrics: dict[str, float]            # what the trainer's method returned (the mismatch/ metrics)
    calls: list[list[list[float]]]       # compute_mismatch_metrics' whole-batch masked_mean calls, the valid tokens


def run_mismatch(seed: int = 7, threshold: float = 2.0) -> Mismatch:
    """``RayPPOTrainer.compute_rollout_importance_weights_and_add_to_batch`` (ray_trainer.py@v0.6.0:922-962, the
    method fit() calls once per step on the driver's whole batch, :1157) on the two ranks' shares of
    proofs_verl_old's batch concatenated (DataProto.concat), with rollout log-probs off the old ones; ``self`` holds
    the run config's algorithm section (rollout_is_threshold set: the metrics' switch). compute_mismatch_metrics'
    ``masked_mean`` calls over the whole batch (no axis) are captured: the per-token matrices it averaged."""
    import types

    import torch
    import verl.utils.torch_functional as verl_F
    from omegaconf import OmegaConf
    from verl import DataProto
    from verl.trainer.ppo import mismatch_helper as mh
    full = DataProto.concat([O.batch(r, seed) for r in range(O.WORLD)])
    mask = full.batch["response_mask"]
    g = torch.Generator().manual_seed(seed + 100)
    old = full.batch["old_log_probs"]
    full.batch["rollout_log_probs"] = (old + 0.3 * torch.randn(old.shape, generator=g)) * mask
    cfg = OmegaConf.create({"algorithm": {"rollout_is_threshold": threshold, "rollout_is_threshold_lower": None,
                                          "rollout_is_level": "token", "rollout_is_mode": "truncate",
                                          "rollout_is_veto_threshold": 1e-4, "rollout_is": False}})
    fn = method("trainer/ppo/ray_trainer.py", "RayPPOTrainer", "compute_rollout_importance_weights_and_add_to_batch",
                {"DataProto": DataProto, "compute_rollout_importance_weights": mh.compute_rollout_importance_weights})
    calls: list[list[list[float]]] = []
    inside = [False]
    saved_mm, saved_cm = verl_F.masked_mean, mh.compute_mismatch_metrics

    def masked_mean(values, mask_, axis=None, **kw):
        if inside[0] and axis is None:
            calls.append(O._ragged(values.detach(), mask_))
        return saved_mm(values, mask_, axis=axis, **kw)

    def mismatch_metrics(*a, **kw):
        inside[0] = True
        try:
            return saved_cm(*a, **kw)
        finally:
            inside[0] = False

    verl_F.masked_mean, mh.compute_mismatch_metrics = masked_mean, mismatch_metrics
    try:
        _, metrics = fn(types.SimpleNamespace(config=cfg), full)
    finally:
        verl_F.masked_mean, mh.compute_mismatch_metrics = saved_mm, saved_cm
    return Mismatch({k: float(v) for k, v in metrics.items()}, calls)


# --------------------------------------------------------------------------------------------- why not proven
_TEMPLATE = ("one reduce: for a template whose names are reduced differently: {names}; stated as the token mean "
             "over the whole batch, which only {means} are (a proof of one name would mark every name proven)")
ENTRY_WHY: dict[tuple[str, str, str | None], str] = {
    ("verl", "mismatch/{name}", "ppo"): _TEMPLATE.format(
        names="mismatch_helper.py@v0.6.0's rollout_is_mean and the ratio / catastrophic-token fractions are "
              "masked_means over the batch's valid tokens, rollout_is_max / _min the extremes, rollout_is_std a "
              "population std of clamped weights, rollout_is_eff_sample_size a ratio, rollout_is_seq_* and the "
              "mismatch_*_ppl / log_ppl_diff* means over sequences, rollout_is_p25 .. p99 quantiles",
        means="rollout_is_mean and the fractions"),
    ("verl", "rollout_corr/{name}", "ppo"): _TEMPLATE.format(
        names="rollout_corr_helper.py@v0.7.0's renamed mismatch diagnostics (token means, extremes, a std, "
              "per-sequence means, perplexities, chi-square statistics)",
        means="rollout_is_mean and the fractions"),
}
