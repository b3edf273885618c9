"""verl 0.1 (the first release, tagged 2024-12-12) run on CPU for the fingerprints of the entries whose range ends
at v0.1 (tests/frameworks/test_proof_verl_v01.py; a child process with the release first on sys.path,
tests/_support/releases.py). Its layout is its own: the trainer, actor, critic and workers all live under
``verl/trainer/ppo/`` (``workers/fsdp_workers.py``, ``actor/dp_actor.py``, ``critic/dp_critic.py``,
``ray_trainer.py``).

What runs is the release's code:

* :func:`run_worker`: ``ActorRolloutRefWorker.update_actor`` / ``CriticWorker.update_critic`` of
  ``verl/trainer/ppo/workers/fsdp_workers.py``, compiled from the file's text without the dispatch decorator, around
  the release's own ``DataParallelPPOActor.update_policy`` / ``DataParallelPPOCritic.update_critic`` on a tiny model,
  with the scheduler the worker builds (``get_constant_schedule_with_warmup``) so the rate changes every step; the
  simulated ranks' outputs collected with the release's ``DataProto.concat`` and reduced with ray_trainer.py's
  ``reduce_metrics``, as ``fit()`` does.
* :func:`run_fit`: ``RayPPOTrainer.fit`` of ``verl/trainer/ppo/ray_trainer.py`` itself, compiled from the file's
  text, over a few training steps: its own ``Timer`` blocks (codetiming), ``apply_kl_penalty``,
  ``compute_advantage``, ``reduce_metrics``, ``compute_data_metrics`` and the rows it hands to its logger.

Stand-ins, each for what a CPU machine lacks and the metric code does not compute:

* the model's forward (``_forward_micro_batch``: an HF model under bf16 autocast on cuda): proofs_verl_old's tiny
  policy, returning what v0.1's returns, (logits, log-probs); the critic's value head the same form;
* the device moves (``data.to('cuda')``, ``TensorDict.cuda``) and ``flash_attn`` (imported by dp_critic.py at
  module level for a remove-padding path v0.1's critic never takes here): proofs_verl_old2's stand-ins;
* for ``fit()``: the worker groups (generation, reference and value passes, the two updates; Ray actors on GPUs) and
  the reward and validation functions are stand-ins that return tensors of the right shapes and *advance a stand-in
  clock* (framework_code.StandInClock, installed as codetiming's ``time``) by the seconds the proof gives each stage:
  the timers veRL reads are then known numbers, the same in every process; the logger (``Tracking``) records the
  rows ``fit()`` hands it.
"""
from __future__ import annotations

import contextlib
import types
from dataclasses import dataclass, field
from typing import Any

from _support import proofs_verl_old as O
from _support import proofs_verl_old2 as O2

#: the fit() stages whose Timer blocks v0.1 logs as timing/<stage> (ray_trainer.py@v0.1:434-503)
STAGES = ("gen", "ref", "values", "adv", "update_critic", "update_actor", "testing")


def actor_config(**overrides):
    from omegaconf import OmegaConf
    kw = dict(strategy="fsdp", ppo_mini_batch_size=O.MINI, ppo_micro_batch_size=O.MICRO, ppo_epochs=O.EPOCHS,
              shuffle=False, grad_clip=1.0, clip_ratio=0.2, entropy_coeff=0.0)
    kw.update(overrides)
    return OmegaConf.create(kw)


def critic_config(**overrides):
    from omegaconf import OmegaConf
    kw = dict(strategy="fsdp", ppo_mini_batch_size=O.MINI, ppo_micro_batch_size=O.MICRO, ppo_epochs=O.EPOCHS,
              shuffle=False, grad_clip=1.0, cliprange_value=0.3)
    kw.update(overrides)
    return OmegaConf.create(kw)


def policy_forward(actor):
    """v0.1's ``_forward_micro_batch(micro_batch, temperature)`` returns (logits, log-probs) of the response tokens
    (dp_actor.py@v0.1:45-55): the tiny policy's, with the release's own ``logprobs_from_logits``."""
    from verl.utils.torch_functional import logprobs_from_logits

    def forward(micro_batch, temperature):
        logits = actor.actor_module(micro_batch["responses"]) / temperature
        return logits, logprobs_from_logits(logits, micro_batch["responses"])
    return forward


@contextlib.contextmanager
def cpu_only():
    """flash_attn's stand-in module and the device moves kept on the CPU (proofs_verl_old2), for the block."""
    with O2.flash_attn_stand_in(), O2.cuda_moves_stay_on_cpu():
        yield


# --------------------------------------------------------------------------------------------- the workers' updates
@dataclass
class WorkerSteps:
    logged: list[float]                  # rank 0's actor/lr(1e-4) or critic/lr(1e-4) of each training step
    used: list[list[float]]              # the rates rank 0's optimizer stepped with, per training step
    after: list[float]                   # rank 0's scheduler's rate after each training step
    metrics: list[dict[str, float]]      # the driver's metrics of each step (reduce_metrics of the collected output)
    norms: list[dict[int, list[float]]]  # each step's pre-clip norms, per rank, in optimizer-step order


def run_worker(role: str = "actor", steps: int = 2, warmup: int = 3, lr: float = 0.5) -> WorkerSteps:
    """``steps`` training steps of v0.1's ``update_actor`` / ``update_critic`` (fsdp_workers.py) on each simulated
    rank, collected (DataProto.concat) and reduced (reduce_metrics) as the driver does. Call inside
    :func:`cpu_only`."""
    import torch
    from verl import DataProto
    from verl.trainer.ppo import ray_trainer
    from verl.utils.torch_functional import get_constant_schedule_with_warmup

    key = f"{role}/lr(1e-4)"
    out = WorkerSteps([], [], [], [], [])
    norms: dict[int, list[float]] = {}
    workers = []
    for rank in range(O.WORLD):
        ns: dict[str, Any] = {"DataProto": DataProto, "torch": torch, "log_gpu_memory_usage": lambda *a, **k: None,
                              "logger": None}
        model = O.tiny_lm(1, O.VOCAB if role == "actor" else 1)
        opt = torch.optim.SGD(model.parameters(), lr=lr)
        sched = get_constant_schedule_with_warmup(optimizer=opt, num_warmup_steps=warmup)
        if role == "actor":
            from verl.trainer.ppo.actor import dp_actor as mod
            w = mod.DataParallelPPOActor(actor_config(), model, opt)
            w._forward_micro_batch = policy_forward(w)
            method = O2.method("trainer/ppo/workers/fsdp_workers.py", "ActorRolloutRefWorker", "update_actor", ns)
            me = types.SimpleNamespace(actor=w, actor_lr_scheduler=sched, actor_optimizer=opt, _is_actor=True)
        else:
            from verl.trainer.ppo.critic import dp_critic as mod
            w = mod.DataParallelPPOCritic(critic_config(), model, opt)
            w._forward_micro_batch = O.critic_forward(w, O.Capture())
            method = O2.method("trainer/ppo/workers/fsdp_workers.py", "CriticWorker", "update_critic", ns)
            me = types.SimpleNamespace(critic=w, critic_lr_scheduler=sched, critic_optimizer=opt)
        me.__dict__.update(_is_offload_param=False, _is_offload_optimizer=False, _is_offload_grad=False)
        step = w._optimizer_step

        def recording(step=step, opt=opt, rank=rank):
            if rank == 0:
                out.used[-1].append(float(opt.param_groups[0]["lr"]))
            got = step()
            norms.setdefault(rank, []).append(float(got))
            return got
        w._optimizer_step = recording
        workers.append((me, method, sched))
    for k in range(steps):
        out.used.append([])
        norms.clear()
        outputs = []
        for rank, (me, method, sched) in enumerate(workers):
            with O.simulated_rank(rank):
                res = method(me, O.batch(rank, seed=7 + k))
            outputs.append(res)
            if rank == 0:
                out.logged.append(float(res.meta_info["metrics"][key]))
                out.after.append(float(sched.get_last_lr()[0]))
        logged = ray_trainer.reduce_metrics(DataProto.concat(outputs).meta_info["metrics"])
        out.metrics.append({k2: float(v) for k2, v in logged.items()})
        out.norms.append({r: list(v) for r, v in norms.items()})
    return out


# --------------------------------------------------------------------------------------------- fit()
@dataclass
class Fit:
    rows: list[tuple[int, dict[str, float]]]        # (step, data) as fit() handed them to its logger
    seconds: list[dict[str, float]]                 # the seconds each stage's stand-ins took, step by step
    clock: Any = field(repr=False)


class _Recorder:
    """``verl.utils.tracking.Tracking`` while fit() runs: the rows it logs, kept."""
    rows: list[tuple[int, dict[str, float]]] = []

    def __init__(self, *a: Any, **k: Any) -> None:
        pass

    def log(self, data: dict, step: int, backend: Any = None) -> None:
        type(self).rows.append((int(step), {k: float(v) for k, v in data.items()}))


def _fit_config():
    from omegaconf import OmegaConf
    return OmegaConf.create({
        "trainer": {"project_name": "p", "experiment_name": "e", "logger": ["console"], "total_epochs": 1,
                    "test_freq": 1, "save_freq": -1, "critic_warmup": 0, "default_local_dir": "unused",
                    "default_hdfs_dir": None},
        "algorithm": {"gamma": 1.0, "lam": 0.95, "adv_estimator": "gae", "kl_penalty": "kl",
                      "kl_ctrl": {"type": "fixed", "kl_coef": 0.001}},
        "data": {"train_batch_size": O.N_PER_RANK}})


def run_fit(seconds: list[dict[str, float]]) -> Fit:
    """``RayPPOTrainer.fit`` of verl 0.1 over ``len(seconds)`` training steps, each stage's stand-in taking the
    given seconds on the stand-in clock (the initial and final validations 100 s each, outside every timed block)."""
    import time

    import codetiming._timer as ct
    import torch
    import verl.utils.tracking as tracking
    from verl import DataProto
    from verl.trainer.ppo import core_algos, ray_trainer

    from _support.framework_code import StandInClock
    clock = StandInClock(time, 1000.0, attr="perf_counter")
    n = O.N_PER_RANK
    now = [-1]                                          # the training step the stand-ins are in (-1: before)
    rollout: list[Any] = [None]                         # that step's batch of n sequences (O.batch's tensors)

    def take(stage: str) -> None:
        clock.advance(seconds[now[0]][stage] if now[0] >= 0 else 100.0)

    class ActorRollout:
        def generate_sequences(self, gen_batch):
            now[0] += 1
            take("gen")
            rollout[0] = d = O.batch(0, seed=7 + now[0]).batch
            return DataProto.from_dict({k: d[k] for k in ("responses", "input_ids", "attention_mask",
                                                          "position_ids", "old_log_probs")})

        def update_actor(self, batch):
            take("update_actor")
            return DataProto(meta_info={"metrics": {"actor/pg_loss": [0.1, 0.3]}})

    class Ref:
        def compute_ref_log_prob(self, batch):
            take("ref")
            return DataProto.from_dict({"ref_log_prob": rollout[0]["ref_log_prob"]})

    class Critic:
        def compute_values(self, batch):
            take("values")
            return DataProto.from_dict({"values": rollout[0]["values"]})

        def update_critic(self, batch):
            take("update_critic")
            return DataProto(meta_info={"metrics": {"critic/vf_loss": [0.2, 0.4]}})

    def reward_fn(batch):
        take("adv")
        mask = batch.batch["attention_mask"][:, -O.RESP_W:]
        scores = torch.zeros(n, O.RESP_W)
        last = mask.sum(-1) - 1
        scores[torch.arange(n), last.clamp(min=0)] = torch.linspace(0.0, 1.0, n)
        return scores

    def validate():
        take("testing")
        return {"test_score/toy": 0.25 + 0.5 * max(now[0], 0)}

    prompts = torch.full((n, O.PROMPT_W), 3)
    loader = [{"input_ids": prompts, "attention_mask": torch.ones(n, O.PROMPT_W, dtype=torch.long),
               "position_ids": torch.arange(O.PROMPT_W).repeat(n, 1)} for _ in seconds]
    me = types.SimpleNamespace(
        config=_fit_config(), train_dataloader=loader, actor_rollout_wg=ActorRollout(),
        ref_policy_wg=Ref(), critic_wg=Critic(), use_reference_policy=True, use_rm=False, use_critic=True,
        reward_fn=reward_fn, val_reward_fn=object(), _validate=validate,
        kl_ctrl=core_algos.FixedKLController(kl_coef=0.001))
    fit = O2.method("trainer/ppo/ray_trainer.py", "RayPPOTrainer", "fit", dict(vars(ray_trainer)))
    saved = ct.time, tracking.Tracking
    _Recorder.rows = []
    ct.time, tracking.Tracking = clock, _Recorder
    try:
        fit(me)
    finally:
        ct.time, tracking.Tracking = saved
    return Fit(list(_Recorder.rows), seconds, clock)


# --------------------------------------------------------------------------------------------- why not proven
ENTRY_WHY: dict[tuple[str, str, str | None], str] = {
    ("verl", "critic/kld", "ppo"):
        "MegatronPPOCritic.compute_advantages (verl/trainer/ppo/critic/megatron_critic.py@v0.1:106-166): the module "
        "imports megatron at its top, which is not installed, and the method has no caller in v0.1rc or v0.1 (the "
        "driver computes the advantages), so no run of the release logs it; stated from its text (a token mean)",
    ("verl", "critic/kl_coef", "ppo"):
        "MegatronPPOCritic.compute_advantages (megatron_critic.py@v0.1:164): megatron is not installed and the "
        "method has no caller in v0.1rc or v0.1; the controller's coefficient, as ray_trainer.py's critic/kl_coeff",
}
