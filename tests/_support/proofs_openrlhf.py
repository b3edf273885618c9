"""OpenRLHF's own metric code run on CPU for the fingerprint proofs (tests/frameworks/test_proof_openrlhf_*.py).

Builds on tests/_support/framework_code.py (``F.openrlhf()``: the wheel's metric files loaded by file, the actor's
``ppo_train``/``training_step`` compiled from ppo_actor.py, simulated data-parallel ranks) and adds the rest of the
path a logged PPO value takes, all from the installed wheel (openrlhf 0.11.2):

* raw rollouts: ``SamplesGenerator._process_response_into_experience`` (samples_generator.py) turns vLLM-shaped
  responses (observation tokens, action ranges, reward, finish reason) into one-sample Experiences;
* ``RemoteExperienceMaker.make_experience_batch`` (experience_maker.py, the module loaded by file with ``ray`` as a
  pass-through): micro rollout batches, the old policy's and the reference's log-probs (the model groups' forward is
  a table), the reward-side KL, baselines, returns, advantages;
* ``RayActorGroup.async_run_method_batch`` (launcher.py, compiled from source) hands the experiences to the ranks,
  each of which appends them to the wheel's ``NaiveReplayBuffer`` (replay_buffer.py) and runs ``ppo_train``;
* ``BasePPOTrainer.save_logs_and_checkpoints`` (ppo_trainer.py) and ``WandbLogger.log_train`` (logging_utils.py)
  decide which steps reach the tracker.

DeepSpeed is simulated (``Engine``): ``optimizer_step`` counts micro-steps and, every ``accumulated_gradient`` of
them, steps a real torch LR scheduler and records that optimizer step's gradient norm, which ``get_grad_norm`` returns
until the next boundary (DeepSpeed's engine.step / get_global_grad_norm). The policy moves at each optimizer step:
the actor's forward during the update returns log-probs and entropies that depend on how many optimizer steps this
rank has taken, so the rollout-time (old) policy, and each mini-batch's update-time policy, are all different.

The DPO, RM and SFT trainers' ``fit`` loops are compiled from their files and run on the simulated ranks with the
same engine, a model whose forward reads a table of per-token log-probs (DPO/SFT) or scores (RM), and the wheel's
own ``_get_batch_logps`` / ``concatenated_inputs`` / losses.

Every per-token value a proof compares with is computed by the wheel's functions on that token alone (PolicyLoss on a
one-token mask, compute_approx_kl), never re-implemented here; this module only records which sequences each rank's
micro-batches held, in which optimizer step, so tests/_support/fingerprint.py can compute every candidate reduction.
"""
from __future__ import annotations

import contextlib
import functools
import math
import os
import threading
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from _support import framework_code as F

WORLD, GAS, MICRO = 2, 2, 2              # ranks, micro-batches per optimizer step, sequences per micro-batch
GROUP = 4                                # n_samples_per_prompt


def ns(**kw: Any) -> types.SimpleNamespace:
    return types.SimpleNamespace(**kw)


# --------------------------------------------------------------------------------------------- loading
@functools.lru_cache(maxsize=None)
def wheel() -> types.SimpleNamespace:
    """The wheel's pieces beyond F.openrlhf(): experience maker, replay buffer, samples generator, launcher's batch
    dispatch, the PPO trainer's logging, the DPO/RM/SFT fit loops."""
    import torch
    from tqdm import tqdm

    o = F.openrlhf()
    root = Path(o.loss.__file__).resolve().parents[1]
    for pkg, sub in [("openrlhf.trainer.ray", "trainer/ray")]:
        F._skeleton(pkg, root / sub)
    ray = types.ModuleType("ray")                       # single process: refs are the values themselves
    ray.get = lambda x: x
    ray.put = lambda x: x
    launcher = types.ModuleType("openrlhf.trainer.ray.launcher")
    launcher.RayActorGroup = object
    vllm = types.ModuleType("vllm")
    vllm.SamplingParams = dict
    vllm_engine = types.ModuleType("openrlhf.trainer.ray.vllm_engine")
    vllm_engine.batch_vllm_engine_call = lambda *a, **k: None
    logging_utils = F._load_file("openrlhf.utils.logging_utils", root / "utils/logging_utils.py")
    F._load_file("openrlhf.utils.seqlen_balancing", root / "utils/seqlen_balancing.py")
    length_penalty = F._load_file("openrlhf.trainer.ppo_utils.length_penalty",
                                  root / "trainer/ppo_utils/length_penalty.py")
    kl_controller = F._load_file("openrlhf.trainer.ppo_utils.kl_controller",
                                 root / "trainer/ppo_utils/kl_controller.py")
    maker = F._load_file("openrlhf.trainer.ppo_utils.experience_maker", root / "trainer/ppo_utils/experience_maker.py",
                         {"ray": ray, "openrlhf.trainer.ray.launcher": launcher})
    buffer = F._load_file("openrlhf.trainer.ppo_utils.replay_buffer", root / "trainer/ppo_utils/replay_buffer.py")
    samples = F._load_file("openrlhf.trainer.ppo_utils.samples_generator",
                           root / "trainer/ppo_utils/samples_generator.py",
                           {"ray": ray, "vllm": vllm, "openrlhf.trainer.ray.vllm_engine": vllm_engine})
    dispatch = F._methods_from_source(root / "trainer/ray/launcher.py", "RayActorGroup", ["async_run_method_batch"],
                                      {"ray": ray})["async_run_method_batch"]
    trainer_ns = {"torch": torch, "ray": ray, "time": __import__("time"), "tqdm": tqdm, "Dict": dict, "Tuple": tuple,
                  "logger": logging_utils.init_logger("trackbridge.proofs")}
    trainer = F._methods_from_source(root / "trainer/ppo_trainer.py", "BasePPOTrainer",
                                     ["save_logs_and_checkpoints", "train_step", "ppo_train", "_compute_rollout_stats"],
                                     trainer_ns)
    quiet_loggers()
    return ns(o=o, root=root, maker=maker, buffer=buffer, samples=samples, kl_controller=kl_controller,
              length_penalty=length_penalty, logging_utils=logging_utils, dispatch=dispatch, trainer=trainer,
              release=F.release("openrlhf"))


def quiet_loggers() -> None:
    """OpenRLHF's loggers (logging_utils.init_logger) print INFO lines to stdout: keep them to warnings, so a report
    generated on stdout (tests/_support/fidelity_proofs.py) holds only the report."""
    import logging
    for name in list(logging.root.manager.loggerDict):
        if name.startswith(("openrlhf", "trackbridge.proofs")):
            logging.getLogger(name).setLevel(logging.WARNING)


def quiet_tqdm(*a: Any, **k: Any):
    from tqdm import tqdm
    return tqdm(*a, **{**k, "disable": True})


# --------------------------------------------------------------------------------------------- DeepSpeed stand-in
class Engine:
    """What OpenRLHF's DeepSpeed strategy does with a model on one rank, simulated: ``optimizer_step`` is
    ``engine.step()``, a real step only at every ``gas``-th call (the accumulation boundary), where the LR scheduler
    steps and the step's global gradient norm is computed (``norms[k]`` for the k-th optimizer step, the same on every
    rank as DeepSpeed's all-reduced norm); ``get_grad_norm`` returns the last one (0.0 before the first step)."""

    def __init__(self, rank: int, gas: int, norms: Callable[[int], float] | None = None,
                 lr_at: Callable[[int], float] | None = None, base_lr: float | None = None):
        import torch
        self.rank, self.gas, self.micro, self.steps = rank, gas, 0, 0
        self.norms, self._norm = norms or grad_norm_of_step, None
        lr_at = lr_at or lr_factor
        opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=BASE_LR if base_lr is None else base_lr)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: lr_at(k))

    def optimizer_step(self, *a: Any, **k: Any) -> None:
        self.micro += 1
        if self.micro % self.gas == 0:
            self._norm = self.norms(self.steps)
            self.steps += 1
            self.scheduler.optimizer.step()
            self.scheduler.step()

    @property
    def global_steps(self) -> int:                 # DeepSpeed engine.global_steps (SFTTrainer logs with it)
        return self.steps

    def get_grad_norm(self, model: Any = None) -> float:
        return 0.0 if self._norm is None else float(self._norm)

    def strategy(self) -> types.SimpleNamespace:
        return ns(ring_attn_group=None, accumulated_gradient=self.gas, is_rank_0=lambda: self.rank == 0,
                  all_reduce=F.strategy_all_reduce, backward=lambda *a, **k: None, optimizer_step=self.optimizer_step,
                  get_grad_norm=self.get_grad_norm, world_size=F.current_rank()[0].world, args=None)


def grad_norm_of_step(k: int) -> float:
    """The gradient norm the simulated engine computes at optimizer step k (distinct for k < 11, not monotone)."""
    return 1.0 + 0.5 * ((k * 7) % 11)


def lr_factor(k: int) -> float:
    """The LR scheduler's factor after k scheduler steps (distinct for k < 13, not monotone)."""
    return 1.0 / (1.0 + 0.25 * ((k * 5) % 13))


BASE_LR = 1e-6


# --------------------------------------------------------------------------------------------- the PPO rollout
@dataclass
class Rollout:
    """One PPO step's raw rollouts: per sample its prompt length, response length, reward, whether vLLM stopped it
    at the length limit; per token the old (rollout-time) policy's and the reference's log-probs; the update-time
    policy's log-probs and entropies after k optimizer steps are ``logp(i, k)`` / ``entropy(i, k)``."""
    prompt_len: list[int]
    resp_len: list[int]
    reward: list[float]
    truncated: list[bool]
    old: list[list[float]]
    ref: list[list[float]]
    seed: int
    logp: Callable[[int, int], list[float]] = field(repr=False, default=None)      # type: ignore[assignment]
    entropy: Callable[[int, int], list[float]] = field(repr=False, default=None)   # type: ignore[assignment]

    @property
    def n(self) -> int:
        return len(self.resp_len)


def make_rollout(seed: int = 0, n: int = 16) -> Rollout:
    import random
    rng = random.Random(1000 + seed)
    resp = [rng.choice([1, 2, 3, 5, 7, 8, 11]) + (i % 3) for i in range(n)]
    prompt = [3 + (i % 2) for i in range(n)]
    old = [[-0.2 - rng.random() * 1.5 for _ in range(k)] for k in resp]
    ref = [[o + (rng.random() - 0.5) * 0.9 for o in row] for row in old]
    reward = [round(rng.choice([0.0, 0.25, 1.0, 0.5, -0.5]) + 0.01 * i, 4) for i in range(n)]
    truncated = [rng.random() < 0.3 for _ in range(n)]
    drift = [[(rng.random() - 0.5) * 0.8 for _ in range(k)] for k in resp]
    ent = [[rng.random() * 2.5 for _ in range(k)] for k in resp]

    def logp(i: int, k: int) -> list[float]:            # the policy moves at every optimizer step
        return [o + d * (1 + 0.6 * k) for o, d in zip(old[i], drift[i])]

    def entropy(i: int, k: int) -> list[float]:
        return [e * (1 + 0.15 * k) for e in ent[i]]
    return Rollout(prompt, resp, reward, truncated, old, ref, seed, logp, entropy)


def responses(r: Rollout) -> list[dict]:
    """vLLM-shaped responses (what vllm_engine.generate_responses hands the samples generator): the prompt's tokens
    then the response's; the first prompt token carries the sample's index, so the model stand-ins can look it up."""
    out = []
    for i in range(r.n):
        obs = [100 + i] + [7] * (r.prompt_len[i] - 1) + [8] * r.resp_len[i]
        out.append({"observation_tokens": obs, "action_ranges": [(r.prompt_len[i], len(obs))], "reward": r.reward[i],
                    "scores": r.reward[i], "rollout_log_probs": None, "truncated": r.truncated[i],
                    "prompt": f"p{i // GROUP}", "label": ""})
    return out


def ppo_args(*, use_kl_loss: bool = False, estimator: str = "k1", init_coef: float = 0.05,
             advantage: str = "group_norm", entropy_coef: float | None = 0.0, max_epochs: int = 2,
             loss_agg_mode: str = "token-mean", logging_steps: int = 1, train_batch: int = WORLD * GAS * MICRO,
             n: int = 16) -> types.SimpleNamespace:
    """The run config (OpenRLHF 0.11 dotted groups) of a proof; defaults as train_ppo_ray.py's unless named."""
    return ns(
        algo=ns(kl=ns(use_loss=use_kl_loss, estimator=estimator, init_coef=init_coef, unbiased_gradient=False,
                      target=None, horizon=10000),
                advantage=ns(estimator=advantage, gamma=1.0, lambd=1.0, no_std_norm=False,
                             is_correction_level="off"),
                dynamic_filtering_enable=False),
        reward=ns(clip_range=(-10, 10), overlong_buffer_len=None, stop_properly_penalty_coef=None),
        rollout=ns(n_samples_per_prompt=GROUP, batch_size=n // GROUP, micro_batch_size=2, max_new_tokens=16),
        train=ns(dynamic_batch_enable=False, colocate_all=False, colocate_actor_ref=False,
                 colocate_critic_reward=False, batch_size=train_batch, max_epochs=max_epochs),
        ds=ns(ring_attn_size=1, tensor_parallel_size=1, packing_samples=False),
        actor=ns(entropy_coef=entropy_coef, aux_loss_coef=0.0, loss_agg_mode=loss_agg_mode),
        critic=ns(freezing_steps=-1),
        logger=ns(logging_steps=logging_steps), ckpt=ns(save_steps=float("inf")),
    )


# per-token and per-sequence values computed with the wheel's own functions
def policy_terms(r: Rollout, i: int, k: int, adv: list[float]) -> tuple[list[float], list[float], list[float]]:
    """PolicyLoss (loss.py) on each token of sample i alone (a one-token mask, no global normaliser: its masked mean
    is that token's value): the token's loss, clip indicator and ppo_kl under the policy after k optimizer steps."""
    import torch
    o = F.openrlhf()
    fn = o.PolicyLoss(clip_eps_low=0.2, clip_eps_high=0.2)
    cur, old = torch.tensor([r.logp(i, k)]), torch.tensor([r.old[i]])
    a = torch.tensor([adv])
    loss, clip, kl = [], [], []
    for t in range(r.resp_len[i]):
        mask = torch.zeros_like(cur, dtype=torch.bool)
        mask[0, t] = True
        lo, cl, pk, _, _ = fn(cur, old, a, action_mask=mask)
        loss.append(float(lo))
        clip.append(float(cl))
        kl.append(float(pk))
    return loss, clip, kl


def approx_kl(a: list[float], b: list[float], estimator: str) -> list[float]:
    import torch
    o = F.openrlhf()
    return o.compute_approx_kl(torch.tensor([a]), torch.tensor([b]), kl_estimator=estimator)[0].tolist()


# --------------------------------------------------------------------------------------------- one PPO step
@dataclass
class PPORun:
    """What one PPO step logged (``status``: the dict ppo_trainer hands to the trackers, rank 0's actor status
    merged as PPOTrainer.ppo_train does) and what the proof needs to compute candidates: which samples each rank's
    micro-batches held in each optimizer step (``micro[step][rank][u]`` = sample indices), the experiences the maker
    produced (per sample: advantages, info), and the config."""
    rollout: Rollout
    args: types.SimpleNamespace
    status: dict
    micro: list[list[list[list[int]]]]
    experiences: dict[int, Any]
    policy_steps: list[int]              # per optimizer step: the policy version (optimizer steps before it)
    lr_after: list[float]                # LR after each optimizer step's scheduler step
    logged: list[dict] = field(default_factory=list)


@contextlib.contextmanager
def _seeded_shuffle(seed: int) -> Any:
    """The calling simulated rank's DataLoaders shuffle with a generator of their own: the ranks are threads sharing
    torch's global generator, so a global seed would give each run another order (and the proofs report other gaps).
    RandomSampler is patched once, while any rank is inside, to give a seeded generator to the rank that asked."""
    import torch
    import torch.utils.data as tud
    me = threading.get_ident()
    with _SAMPLER_LOCK:
        if not _SAMPLER_SEEDS:
            real = tud.RandomSampler.__init__

            def init(self: Any, data_source: Any, *a: Any, generator: Any = None, **kw: Any) -> None:
                own = _SAMPLER_SEEDS.get(threading.get_ident())
                if generator is None and own is not None:
                    generator = torch.Generator().manual_seed(own)
                real(self, data_source, *a, generator=generator, **kw)
            _SAMPLER_REAL.append(real)
            tud.RandomSampler.__init__ = init               # type: ignore[method-assign]
        _SAMPLER_SEEDS[me] = seed
    try:
        yield
    finally:
        with _SAMPLER_LOCK:
            _SAMPLER_SEEDS.pop(me, None)
            if not _SAMPLER_SEEDS:
                tud.RandomSampler.__init__ = _SAMPLER_REAL.pop()   # type: ignore[method-assign]


_SAMPLER_LOCK = threading.Lock()
_SAMPLER_SEEDS: dict[int, int] = {}
_SAMPLER_REAL: list[Callable[..., None]] = []


def run_ppo(r: Rollout, args: types.SimpleNamespace, *, step_offset: int = 0) -> PPORun:
    """One PPO step of OpenRLHF 0.11 from raw rollouts: samples generator -> experience maker -> dispatch to the
    ranks' replay buffers -> ppo_train on every rank (simulated DeepSpeed) -> the step's status dict.
    ``step_offset``: the simulated engine's gradient norms and LR factors start that many optimizer steps later
    (``grad_norm_of_step(k + step_offset)``), so runs of the same shape see different sequences of them."""
    import torch
    w = wheel()
    o = w.o

    # raw rollouts -> one-sample Experiences (the wheel's samples generator)
    gen_kwargs = {"max_len": 64}
    samples = [w.samples.SamplesGenerator._process_response_into_experience(None, resp, **gen_kwargs)
               for resp in responses(r)]

    # model groups of the experience maker: the actor's forward gives the old policy, the initial model the reference
    def sample_ids(seqs) -> list[int]:
        return [int(s[0]) - 100 for s in seqs]

    def table(rows: Callable[[int], list[float]]):
        def forward(sequences, action_mask, attention_mask, **kw):
            out = torch.zeros(action_mask.shape, dtype=torch.float32)
            for b, i in enumerate(sample_ids(sequences)):
                idx = torch.nonzero(action_mask[b]).flatten()
                out[b, idx] = torch.tensor(rows(i))
            return out
        return forward

    class Group:
        def __init__(self, fn):
            self.fn = fn

        def async_run_method_batch(self, method_name, **kw):
            assert method_name == "forward", method_name
            n = len(kw["sequences"])
            return [[self.fn(**{k: v[j] for k, v in kw.items() if k in ("sequences", "action_mask",
                                                                       "attention_mask")}) for j in range(n)]]

        def async_run_method(self, method_name, **kw):
            return [None]

    strategy = ns(args=args)
    kl_ctl = w.kl_controller.FixedKLController(args.algo.kl.init_coef)
    maker = w.maker.RemoteExperienceMaker(Group(table(lambda i: r.old[i])), None, None,
                                          Group(table(lambda i: r.ref[i])), kl_ctl, strategy,
                                          ns(pad_token_id=0, decode=lambda *a, **k: ["x"]))
    experiences = maker.make_experience_batch(samples)
    per_sample = {}
    for e in experiences:
        for b, i in enumerate(sample_ids(e.sequences)):
            per_sample[i] = ns(advantages=e.advantages[b][e.action_mask[b].bool()].tolist(),
                               info={k: float(v[b]) for k, v in e.info.items()})

    # the trainer hands the experiences to the actor ranks (launcher's round-robin chunks)
    chunks: list[list] = [[] for _ in range(WORLD)]

    class Handle:
        def __init__(self, rank):
            self.rank = rank
            self.execute_batch = ns(remote=self._remote)

        def _remote(self, method_name, data, start, end):
            assert method_name == "append"
            chunks[self.rank].extend(data["experience"][start:end])

    w.dispatch(ns(_actor_handlers=[Handle(k) for k in range(WORLD)], duplicate_actors=1), "append",
               experience=experiences)

    calls: list[list[tuple[int, list[int]]]] = [[] for _ in range(WORLD)]
    lr_after: list[float] = []

    def rank(rk: int) -> dict:
        engine = Engine(rk, GAS, norms=lambda k: grad_norm_of_step(k + step_offset),
                        lr_at=lambda k: lr_factor(k + step_offset))
        if True:
            torch.cuda.current_device = lambda: 0          # the buffer names its target device cuda:N
            buf = w.buffer.NaiveReplayBuffer(MICRO, 0, False, False, False)
            torch.cuda.current_device = lambda: "cpu"      # ppo_train moves experiences to it
            for e in chunks[rk]:
                buf.append(e)

            class Actor:
                def train(self):
                    pass

                def __call__(self, sequences, action_mask, **kw):
                    ids = sample_ids(sequences)
                    calls[rk].append((engine.steps, ids))
                    cur = torch.zeros(action_mask.shape)
                    ent = torch.zeros(action_mask.shape)
                    for b, i in enumerate(ids):
                        idx = torch.nonzero(action_mask[b]).flatten()
                        cur[b, idx] = torch.tensor(r.logp(i, engine.steps))
                        ent[b, idx] = torch.tensor(r.entropy(i, engine.steps))
                    return cur, ns(entropy=ent)

            strategy = engine.strategy()
            strategy.is_rank_0 = lambda: False              # no progress bar
            trainer = ns(args=args, strategy=strategy, replay_buffer=buf, dataloader_pin_memory=False,
                         max_epochs=args.train.max_epochs, actor=Actor(),
                         actor_loss_fn=o.PolicyLoss(clip_eps_low=0.2, clip_eps_high=0.2,
                                                    token_level_loss=args.actor.loss_agg_mode == "token-mean"),
                         aux_loss=False, ema_model=None, actor_optim=None, actor_scheduler=engine.scheduler)
            trainer.training_step = types.MethodType(o.training_step, trainer)
            with _seeded_shuffle(r.seed * 100 + rk):      # the DataLoader shuffles the replay buffer
                status = o.ppo_train(trainer, kl_ctl=kl_ctl.value)
            if rk == 0:
                lr_after.extend(BASE_LR * lr_factor(k + 1 + step_offset) for k in range(engine.steps))
            return status

    real = torch.cuda.current_device
    try:
        statuses = F.run_ranks(rank, world=WORLD)
    finally:
        torch.cuda.current_device = real
    # the optimizer steps: gas consecutive micro-batches of each rank (iter_grad_accum_global_norm's windows)
    n_steps = len(calls[0]) // GAS
    assert all(len(c) == n_steps * GAS for c in calls), [len(c) for c in calls]
    micro = [[[calls[rk][s * GAS + u][1] for u in range(GAS)] for rk in range(WORLD)] for s in range(n_steps)]
    policy_steps = [calls[0][s * GAS][0] for s in range(n_steps)]
    assert all(calls[rk][s * GAS + u][0] == policy_steps[s] for rk in range(WORLD) for s in range(n_steps)
               for u in range(GAS))
    # PPOTrainer.ppo_train: status.update over the actor ranks' results (ray.get of every rank's fit)
    status: dict = {}
    for s in statuses:
        status.update(s)
    return PPORun(r, args, status, micro, per_sample, policy_steps, lr_after)


# --------------------------------------------------------------------------------------------- DPO / RM / SFT fit
@dataclass
class PrefData:
    """Preference (DPO/RM) or SFT data for ``world`` ranks x ``steps`` optimizer steps x ``gas`` micro-batches x
    ``micro`` sequences (pairs). Item ``(rank, step, u, j)`` has a prompt of ``prompt`` tokens, chosen and rejected
    responses of ``lens[...]`` tokens. The policy's per-token log-probs depend on the optimizer steps taken (it is
    trained); the reference's do not. RM: the model's score of each sequence is ``score``."""
    world: int
    steps: int
    gas: int
    micro: int
    prompt: int = 2

    def items(self):
        for r in range(self.world):
            for s in range(self.steps):
                for u in range(self.gas):
                    for j in range(self.micro):
                        yield r, s, u, j

    def key(self, r: int, s: int, u: int, j: int) -> int:
        return ((r * self.steps + s) * self.gas + u) * self.micro + j

    def length(self, k: int, side: int) -> int:             # response tokens (side 0 chosen, 1 rejected)
        import random
        return random.Random(k * 97 + side * 13 + 5).randint(1, 6)

    def logp(self, k: int, side: int, version: int, model: str = "policy") -> list[float]:
        import random
        rng = random.Random(k * 31 + side * 7 + (0 if model == "policy" else 1000))
        base = [-0.3 - rng.random() * 2 for _ in range(self.length(k, side))]
        if model != "policy":
            return base
        drift = [(rng.random() - 0.5) * 0.6 for _ in base]
        return [b + d * math.cos(1.7 * version + k) * (1 + version) for b, d in zip(base, drift)]

    def score(self, k: int, side: int, version: int) -> float:
        return math.sin(k * 1.3 + side * 2.1) * 1.5 + 0.3 * math.cos(1.7 * version + k) * (1 - 2 * side)


def _fit_methods(kind: str) -> dict:
    import torch
    w = wheel()
    cls, path = {"dpo": ("DPOTrainer", "trainer/dpo_trainer.py"), "rm": ("RewardModelTrainer", "trainer/rm_trainer.py"),
                 "sft": ("SFTTrainer", "trainer/sft_trainer.py")}[kind]

    class NoSampler:
        pass
    namespace = {"torch": torch, "tqdm": quiet_tqdm, "os": os, "DistributedSampler": NoSampler,
                 "iter_grad_accum_global_norm": w.o.loss_utils.iter_grad_accum_global_norm}
    names = ["fit", "save_logs_and_checkpoints", "concatenated_forward", "concatenated_inputs"]
    names += ["_get_batch_logps"] if kind == "dpo" else []
    names = names if kind != "sft" else ["fit", "save_logs_and_checkpoints"]
    return F._methods_from_source(w.root / path, cls, names, namespace)


def run_fit(kind: str, d: PrefData, *, logging_steps: int = 1, nll: bool = False, beta: float = 0.1) -> list[dict]:
    """The wheel's DPOTrainer / RewardModelTrainer / SFTTrainer ``fit`` (with its own ``save_logs_and_checkpoints``,
    ``concatenated_forward``, ``concatenated_inputs``, ``_get_batch_logps``; the real DPOLoss, PairWiseLoss, SFTLoss,
    ``iter_grad_accum_global_norm``) on ``d.world`` simulated ranks with the simulated DeepSpeed engine. Returns the
    rows rank 0 hands to wandb (``train/...`` keys)."""
    import torch
    w = wheel()
    o = w.o
    m = _fit_methods(kind)

    class Out(dict):
        __getattr__ = dict.get

    def rank(r: int) -> list[dict]:
        engine = Engine(r, d.gas)
        logged: list[dict] = []
        width = d.prompt + 7

        def ids_row(k: int, side: int):
            n = d.length(k, side)
            ids = torch.zeros(1, width, dtype=torch.long)
            mask = torch.zeros(1, width, dtype=torch.long)
            ids[0, 0] = 1000 + 2 * k + side                       # the item and side travel in the first token
            ids[0, 1:d.prompt + n] = 5
            mask[0, :d.prompt + n] = 1
            return ids, mask

        batches = []
        for s in range(d.steps):
            for u in range(d.gas):
                rows = [d.key(r, s, u, j) for j in range(d.micro)]
                c = [ids_row(k, 0) for k in rows]
                j_ = [ids_row(k, 1) for k in rows]
                cat = lambda xs, i: torch.stack([x[i] for x in xs])              # noqa: E731  (B, 1, T)
                if kind == "sft":
                    loss_mask = cat(c, 1).clone()
                    loss_mask[:, :, :d.prompt] = 0
                    batches.append((cat(c, 0), cat(c, 1), loss_mask))
                else:
                    extra = [d.prompt] * d.micro if kind == "dpo" else [0.0] * d.micro
                    batches.append((cat(c, 0), cat(c, 1), cat(j_, 0), cat(j_, 1), extra))

        class Model:
            def __init__(self, role: str):
                self.role = role
                self.model = engine

            def train(self):
                pass

            def eval(self):
                pass

            def parameters(self):
                return iter([torch.zeros(1)])

            def __call__(self, input_ids, attention_mask=None, return_output=False, return_logprobs=False, **kw):
                version = engine.steps
                if kind == "rm":
                    vals = torch.tensor([d.score((int(x[0]) - 1000) // 2, (int(x[0]) - 1000) % 2, version)
                                         for x in input_ids])
                    return vals, Out()
                out = torch.zeros(input_ids.shape[0], input_ids.shape[1] - 1)
                for b, x in enumerate(input_ids):
                    k, side = (int(x[0]) - 1000) // 2, (int(x[0]) - 1000) % 2
                    vals = d.logp(k, side, version, self.role)
                    at = d.prompt if kind == "sft" else d.prompt - 1   # where each trainer's loss mask reads them
                    out[b, at:at + len(vals)] = torch.tensor(vals)
                return (out, Out()) if return_output else out

        class Loader(list):
            sampler = None

        strategy = engine.strategy()
        args = ns(train=ns(batch_size=d.micro * d.world * d.gas), eval=ns(steps=10 ** 9),
                  ckpt=ns(save_steps=10 ** 9), logger=ns(logging_steps=logging_steps),
                  model=ns(aux_loss_coef=0.0, nll_loss_coef=0.5 if nll else 0.0), ds=ns(packing_samples=False))
        strategy.args = args
        policy, ref = Model("policy"), Model("ref")
        t = ns(model=policy, ref_model=ref, epochs=1, train_dataloader=Loader(batches), eval_dataloader=None, args=args,
               aux_loss=False, nll_loss=nll, margin_loss=False, compute_fp32_loss=False, beta=beta,
               loss_fn={"dpo": o.DPOLoss(beta), "rm": o.loss.PairWiseLoss(), "sft": o.loss.SFTLoss()}[kind],
               optimizer=None, scheduler=engine.scheduler, strategy=strategy, tokenizer=ns(pad_token_id=0),
               _wandb=ns(log=logged.append, finish=lambda: None) if r == 0 else None, _tensorboard=None,
               disable_ds_ckpt=True, save_hf_ckpt=False)
        for name, fn in m.items():
            if name != "fit":
                setattr(t, name, types.MethodType(fn, t))
        m["fit"](t, args)
        return logged

    return F.run_ranks(rank, world=d.world)[0]


def pref_windows(d: PrefData, value: Callable[[int, int], list[float]], window: int) -> list:
    """``fingerprint`` steps of each logged row of a fit run: the ``window`` (logging_steps) optimizer steps since the
    previous row, each one mini-batch of ``d.world`` ranks x ``d.gas`` micro-batches; ``value(item, version)`` is a
    sequence's token values (version: the optimizer steps taken before its micro-batch)."""
    return [[[[[[value(d.key(r, s, u, j), s) for j in range(d.micro)] for u in range(d.gas)] for r in range(d.world)]]
             for s in range(w0, w0 + window)] for w0 in range(0, d.steps - window + 1, window)]


# --------------------------------------------------------------------------------------------- batches for fingerprint
def steps_of(run: PPORun, per_seq: Callable[[int, int], list[float]]) -> list:
    """``fingerprint`` steps (one logged step) from a run: ``per_seq(sample, optimizer step index)`` gives a
    sequence's per-token values (or a one-element list for a per-sequence value)."""
    return [[[[[per_seq(i, s) for i in mb] for mb in rank] for rank in step] for s, step in enumerate(run.micro)]]


os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


# --------------------------------------------------------------------------------------------- the PPO critic
@dataclass
class CriticRun:
    """One PPO step of the critic: ``status`` (CriticPPOTrainer.ppo_train's status_mean on rank 0), which micro-batch
    each rank trained in each optimizer step (``micro[step][rank][u]`` = the micro-batch's sequence ids), per
    sequence its response tokens' returns and old values, the critic's predictions after k optimizer steps
    (``pred(j, k)``), and per micro-batch call the LR and grad norm the engine reported."""
    status: dict
    micro: list[list[list[list[int]]]]
    returns: list[list[float]]
    old: list[list[float]]
    pred: Callable[[int, int], list[float]] = field(repr=False)
    lrs: list[float] = field(default_factory=list)          # rank 0, every micro-batch, in order
    norms: list[float] = field(default_factory=list)


CRITIC_CLIP = 0.2
CRITIC_EPOCHS = 2


def run_critic(seed: int = 0) -> CriticRun:
    """The wheel's CriticPPOTrainer.ppo_train / training_step (ppo_critic.py, compiled from source) on WORLD simulated
    ranks, each holding 4 micro-batches of MICRO sequences of different lengths, GAS micro-batches per optimizer step,
    CRITIC_EPOCHS epochs (shuffled by the DataLoader), the real ValueLoss (clip 0.2), iter_grad_accum_global_norm and
    strategy.all_reduce, the simulated DeepSpeed engine (LR scheduler and grad norm at the boundaries); the critic's
    predictions move at every optimizer step."""
    import random

    import torch
    o = F.openrlhf()
    c = F.openrlhf_critic()
    rng = random.Random(500 + seed)
    per_rank = 4 * MICRO
    n = WORLD * per_rank
    lens = [rng.choice([1, 2, 3, 5, 7, 9]) for _ in range(n)]
    returns = [[rng.uniform(-1, 1.5) for _ in range(k)] for k in lens]
    old = [[rng.uniform(-1, 1) for _ in range(k)] for k in lens]
    drift = [[rng.uniform(-0.4, 0.4) for _ in range(k)] for k in lens]

    def pred(j: int, k: int) -> list[float]:
        return [a + d * (1 + 0.7 * k) for a, d in zip(old[j], drift[j])]

    width = max(lens)

    def experience(ids: list[int]):
        b = len(ids)
        mask = torch.zeros(b, width, dtype=torch.bool)
        seqs = torch.full((b, 2 + width), 5)
        rets, olds = torch.zeros(b, width), torch.zeros(b, width)
        for row, j in enumerate(ids):
            mask[row, :lens[j]] = True
            seqs[row, 0] = 1000 + j                      # the sequence travels in its first token
            rets[row, :lens[j]] = torch.tensor(returns[j])
            olds[row, :lens[j]] = torch.tensor(old[j])
        return o.Experience(sequences=seqs, attention_mask=torch.ones(b, 2 + width), action_mask=mask, values=olds,
                            returns=rets)

    calls: list[list[tuple[int, list[int]]]] = [[] for _ in range(WORLD)]
    lrs: list[float] = []
    norms: list[float] = []

    def rank(r: int) -> dict:
        ids = list(range(r * per_rank, (r + 1) * per_rank))
        exps = [experience(ids[u * MICRO:(u + 1) * MICRO]) for u in range(per_rank // MICRO)]
        engine = Engine(r, GAS)

        class Critic:
            def train(self):
                pass

            def __call__(self, sequences, action_mask=None, **kw):
                js = [int(s[0]) - 1000 for s in sequences]
                calls[r].append((engine.steps, js))
                out = torch.zeros(action_mask.shape)
                for row, j in enumerate(js):
                    out[row, :lens[j]] = torch.tensor(pred(j, engine.steps))
                return out, ns(aux_loss=0.0)

        strategy = engine.strategy()
        strategy.is_rank_0 = lambda: False
        base_step = strategy.optimizer_step

        def optimizer_step(*a, **k):
            base_step(*a, **k)
            if r == 0:
                lrs.append(engine.scheduler.get_last_lr()[0])
                norms.append(engine.get_grad_norm())
        strategy.optimizer_step = optimizer_step
        args = ns(train=ns(dynamic_batch_enable=False), ds=ns(tensor_parallel_size=1), actor=ns(aux_loss_coef=0.0))
        trainer = ns(args=args, strategy=strategy, replay_buffer=F.openrlhf_buffer(exps), dataloader_pin_memory=False,
                     max_epochs=CRITIC_EPOCHS, critic=Critic(), critic_loss_fn=c.ValueLoss(CRITIC_CLIP),
                     aux_loss=False, critic_optim=None, critic_scheduler=engine.scheduler)
        trainer.training_step = types.MethodType(c.training_step, trainer)
        with _seeded_shuffle(seed * 100 + r):
            return c.ppo_train(trainer)

    real = torch.cuda.current_device
    torch.cuda.current_device = lambda: "cpu"
    try:
        statuses = F.run_ranks(rank, world=WORLD)
    finally:
        torch.cuda.current_device = real
    n_steps = len(calls[0]) // GAS
    assert all(len(cl) == n_steps * GAS for cl in calls) and n_steps == 2 * CRITIC_EPOCHS
    micro = [[[calls[rk][s * GAS + u][1] for u in range(GAS)] for rk in range(WORLD)] for s in range(n_steps)]
    assert all(calls[rk][s * GAS + u][0] == s for rk in range(WORLD) for s in range(n_steps) for u in range(GAS))
    return CriticRun(statuses[0], micro, returns, old, pred, lrs, norms)


def value_loss_terms(run: CriticRun, j: int, k: int) -> list[float]:
    """The wheel's ValueLoss on each token of sequence j alone (a one-token mask, no global normaliser: its masked
    mean is that token's loss) under the critic after k optimizer steps."""
    import torch
    o = F.openrlhf()
    fn = o.loss.ValueLoss(CRITIC_CLIP)
    cur, old, ret = (torch.tensor([x]) for x in (run.pred(j, k), run.old[j], run.returns[j]))
    out = []
    for t in range(len(run.old[j])):
        mask = torch.zeros_like(cur, dtype=torch.bool)
        mask[0, t] = True
        out.append(float(fn(cur, old, ret, action_mask=mask)))
    return out


def critic_steps(run: CriticRun, per_seq: Callable[[int, int], list[float]]) -> list:
    """``fingerprint`` steps of a critic run: ``per_seq(sequence, optimizer step)``."""
    return [[[[[per_seq(j, s) for j in mb] for mb in rank] for rank in step] for s, step in enumerate(run.micro)]]


# ============================================================================================ issue 33 item 1: the rest
# Helpers of tests/frameworks/test_proof_openrlhf.py (the entries no earlier proof reached). They run the same wheel
# code as above with three things varied, each only for the duration of a run and restored after it: the PolicyLoss
# the actor ranks build (GSPO, vLLM importance-sampling correction), the rollout log-probs the vLLM-shaped responses
# carry, and the progress bar ppo_train writes its postfix to (the console records act_loss, gen_len ...).

@contextlib.contextmanager
def _swapped(holder: Any, name: str, value: Any, *, item: bool = False) -> Any:
    old = holder[name] if item else getattr(holder, name)
    if item:
        holder[name] = value
    else:
        setattr(holder, name, value)
    try:
        yield
    finally:
        if item:
            holder[name] = old
        else:
            setattr(holder, name, old)


class _Bar:
    """What ppo_train's ``tqdm(dataloader, ...)`` returns, recording every ``set_postfix`` of rank 0 (the bar it
    shows: disable=not is_rank_0; the postfix is the all-reduced micro-batch status, the same on every rank)."""

    def __init__(self, iterable: Any, sink: list, **kw: Any):
        self.iterable, self.sink = iterable, sink

    def __iter__(self):
        return iter(self.iterable)

    def __len__(self) -> int:
        return len(self.iterable)

    def set_postfix(self, status: dict) -> None:
        if F.current_rank()[1] == 0:
            self.sink.append(dict(status))


def rollout_log_probs_of(r: Rollout, shift: float = 0.9) -> list[list[float]]:
    """vLLM's log-probs of each sampled token: the old (training-side) policy's moved by up to ``shift`` either way,
    so that exp(old - rollout) leaves the default importance-sampling band [0.5, 5] for some tokens."""
    import random
    rng = random.Random(7000 + r.seed)
    return [[o + (rng.random() - 0.5) * 2 * shift for o in row] for row in r.old]


def run_ppo_variant(r: Rollout, args: types.SimpleNamespace, *, loss: dict | None = None,
                    rollout_lp: list[list[float]] | None = None, step_offset: int = 0) -> tuple[PPORun, list[dict]]:
    """:func:`run_ppo` with the actor's ``PolicyLoss(**loss)`` (train_ppo_ray.py builds it from --actor.policy_loss_type
    and --algo.advantage.is_correction_*), responses carrying ``rollout_lp`` (vLLM's per-token log-probs of the
    response, as generate_responses hands them: one per observation token, the prompt's unused), and rank 0's
    progress-bar postfixes recorded. Returns (the run, the postfixes in order: one per micro-batch)."""
    o = F.openrlhf()
    bar: list[dict] = []
    real_loss, real_responses = o.PolicyLoss, responses

    def policy_loss(*a: Any, **k: Any) -> Any:
        return real_loss(*a, **{**k, **(loss or {})})

    def with_lp(rr: Rollout) -> list[dict]:
        out = real_responses(rr)
        if rollout_lp is not None:
            for i, resp in enumerate(out):
                resp["rollout_log_probs"] = [0.0] * rr.prompt_len[i] + list(rollout_lp[i])
        return out

    with _swapped(o, "PolicyLoss", policy_loss), _swapped(globals(), "responses", with_lp, item=True), \
            _swapped(o.ppo_train.__globals__, "tqdm", lambda it, **kw: _Bar(it, bar, **kw), item=True):
        run = run_ppo(r, args, step_offset=step_offset)
    return run, bar


def make_experiences(r: Rollout, args: types.SimpleNamespace, *, max_len: int = 64) -> tuple[list, Any, Any]:
    """The wheel's samples generator (``_process_response_into_experience`` with ``max_len``) and experience maker
    on the rollout, the model groups' forward a table as in :func:`run_ppo`: (the one-sample Experiences, the
    maker, its KL controller)."""
    import torch
    w = wheel()
    samples = [w.samples.SamplesGenerator._process_response_into_experience(None, resp, max_len=max_len)
               for resp in responses(r)]

    def table(rows: Callable[[int], list[float]]):
        def forward(sequences, action_mask, attention_mask, **kw):
            out = torch.zeros(action_mask.shape, dtype=torch.float32)
            for b, s in enumerate(sequences):
                idx = torch.nonzero(action_mask[b]).flatten()
                out[b, idx] = torch.tensor(rows(int(s[0]) - 100)[:len(idx)])
            return out
        return forward

    class Group:
        def __init__(self, fn):
            self.fn = fn

        def async_run_method_batch(self, method_name, **kw):
            n = len(kw["sequences"])
            return [[self.fn(**{k: v[j] for k, v in kw.items() if k in ("sequences", "action_mask",
                                                                       "attention_mask")}) for j in range(n)]]

        def async_run_method(self, method_name, **kw):
            return [None]

    kl_ctl = w.kl_controller.FixedKLController(args.algo.kl.init_coef)
    maker = w.maker.RemoteExperienceMaker(Group(table(lambda i: r.old[i])), None, None,
                                          Group(table(lambda i: r.ref[i])), kl_ctl, ns(args=args),
                                          ns(pad_token_id=0, decode=lambda *a, **k: ["x"]))
    return samples, maker, kl_ctl


def run_train_step(r: Rollout, args: types.SimpleNamespace, *, global_step: int = 1) -> tuple[dict, list]:
    """BasePPOTrainer.train_step (ppo_trainer.py, compiled from source) on the rollout's samples: the real
    experience maker, ``_compute_rollout_stats``, the dispatch to the actor group (recorded: the experiences each
    rank would append), the timers; the actor/critic fit stubbed out (its status is another proof's). Returns (the
    step's status, the experiences the maker produced, in order)."""
    w = wheel()
    samples, maker, kl_ctl = make_experiences(r, args)
    given: list = []

    class ActorGroup:
        def async_run_method_batch(self, method_name, experience):
            assert method_name == "append"
            given.extend(experience)
            return []
    t = ns(args=args, experience_maker=maker, tokenizer=ns(decode=lambda *a, **k: ["x"]), kl_ctl=kl_ctl,
           actor_model_group=ActorGroup(), critic_model_group=None, vllm_engines=None,
           ppo_train=lambda global_steps: {})
    t._compute_rollout_stats = types.MethodType(w.trainer["_compute_rollout_stats"], t)
    status, nxt = w.trainer["train_step"](t, samples, global_step)
    assert nxt == global_step + 1
    return status, given


@functools.lru_cache(maxsize=None)
def compute_eval_metrics() -> Callable[..., dict]:
    """ppo_trainer.py's module-level ``compute_eval_metrics`` (the PPO eval rows), compiled from the wheel's text."""
    import ast

    import torch
    path = wheel().root / "trainer/ppo_trainer.py"
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    fn = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "compute_eval_metrics"]
    namespace: dict[str, Any] = {"torch": torch}
    exec(compile(ast.Module(body=fn, type_ignores=[]), str(path), "exec"), namespace)   # noqa: S102 - the wheel's
    return namespace["compute_eval_metrics"]


def make_long_rollout(seed: int, long: frozenset[int], n: int = 16, max_len: int = 64) -> Rollout:
    """:func:`make_rollout` with the responses of the samples in ``long`` long enough that prompt + response is
    exactly ``max_len`` tokens (the samples generator's context window: clipped, is_clipped = total_length >=
    max_len, without being cut)."""
    import random
    rng = random.Random(2000 + seed)
    prompt = [3 + (i % 2) for i in range(n)]
    resp = [max_len - prompt[i] if i in long else rng.choice([1, 2, 3, 5, 7, 8, 11]) for i in range(n)]
    old = [[-0.2 - rng.random() * 1.5 for _ in range(k)] for k in resp]
    ref = [[o + (rng.random() - 0.5) * 0.9 for o in row] for row in old]
    reward = [round(rng.choice([0.0, 0.25, 1.0, 0.5, -0.5]) + 0.01 * i, 4) for i in range(n)]
    truncated = [rng.random() < 0.3 for _ in range(n)]
    drift = [[(rng.random() - 0.5) * 0.8 for _ in range(k)] for k in resp]
    ent = [[rng.random() * 2.5 for _ in range(k)] for k in resp]

    def logp(i: int, k: int) -> list[float]:
        return [o + d * (1 + 0.6 * k) for o, d in zip(old[i], drift[i])]

    def entropy(i: int, k: int) -> list[float]:
        return [e * (1 + 0.15 * k) for e in ent[i]]
    return Rollout(prompt, resp, reward, truncated, old, ref, seed, logp, entropy)


def run_eval(kind: str, d: PrefData, sizes: list[list[int]]) -> tuple[dict, Callable[[int, int, int], int]]:
    """The wheel's DPOTrainer / RewardModelTrainer / SFTTrainer ``evaluate`` (compiled from source with its own
    concatenated_forward / concatenated_inputs / _get_batch_logps and the real losses) on ``len(sizes)`` simulated
    ranks, rank r's eval loader holding batches of ``sizes[r]`` items (pairs; SFT: chosen responses), the model not
    yet trained (version 0), ``strategy.all_reduce`` / ``all_gather`` over the ranks. Returns (the row rank 0 hands
    to wandb, ``key(rank, batch, j)``: the PrefData item of the j-th item of a batch)."""
    import torch
    w = wheel()
    o = w.o
    cls, path = {"dpo": ("DPOTrainer", "trainer/dpo_trainer.py"), "rm": ("RewardModelTrainer", "trainer/rm_trainer.py"),
                 "sft": ("SFTTrainer", "trainer/sft_trainer.py")}[kind]
    names = ["evaluate"] + (["concatenated_forward", "concatenated_inputs"] if kind != "sft" else [])
    names += ["_get_batch_logps"] if kind == "dpo" else []
    m = F._methods_from_source(w.root / path, cls, names, {"torch": torch, "tqdm": quiet_tqdm})

    def key(r: int, b: int, j: int) -> int:
        return 10_000 + (r * 10 + b) * 10 + j

    class Out(dict):
        __getattr__ = dict.get

    def rank(r: int) -> list[dict]:
        engine = Engine(r, 1)
        logged: list[dict] = []
        width = d.prompt + 7

        def ids_row(k: int, side: int):
            n = d.length(k, side)
            ids = torch.zeros(1, width, dtype=torch.long)
            mask = torch.zeros(1, width, dtype=torch.long)
            ids[0, 0] = 1000 + 2 * k + side
            ids[0, 1:d.prompt + n] = 5
            mask[0, :d.prompt + n] = 1
            return ids, mask

        def cat(xs, i):
            return torch.stack([x[i] for x in xs])

        batches = []
        for b, size in enumerate(sizes[r]):
            rows = [key(r, b, j) for j in range(size)]
            c, rj = [ids_row(k, 0) for k in rows], [ids_row(k, 1) for k in rows]
            if kind == "sft":
                loss_mask = cat(c, 1).clone()
                loss_mask[:, :, :d.prompt] = 0
                batches.append((cat(c, 0), cat(c, 1), loss_mask))
            else:
                extra = [d.prompt] * size if kind == "dpo" else [0.0] * size
                batches.append((cat(c, 0), cat(c, 1), cat(rj, 0), cat(rj, 1), extra))

        class Model:
            def __init__(self, role: str):
                self.role = role

            def train(self):
                pass

            def eval(self):
                pass

            def parameters(self):
                return iter([torch.zeros(1)])

            def __call__(self, input_ids, attention_mask=None, return_output=False, return_logprobs=False, **kw):
                if kind == "rm":
                    return torch.tensor([d.score((int(x[0]) - 1000) // 2, (int(x[0]) - 1000) % 2, 0)
                                         for x in input_ids]), Out()
                out = torch.zeros(input_ids.shape[0], input_ids.shape[1] - 1)
                for b, x in enumerate(input_ids):
                    k, side = (int(x[0]) - 1000) // 2, (int(x[0]) - 1000) % 2
                    vals = d.logp(k, side, 0, self.role)
                    at = d.prompt if kind == "sft" else d.prompt - 1
                    out[b, at:at + len(vals)] = torch.tensor(vals)
                return (out, Out()) if return_output else out

        def all_gather(t):
            g, me = F.current_rank()
            return torch.cat(g.exchange(me, t))

        strategy = engine.strategy()
        strategy.all_gather = all_gather
        strategy.print = lambda *a, **k: None
        strategy._unwrap_model = lambda model: ns(config=ns())
        strategy.ring_attn_group = None
        args = ns(ds=ns(packing_samples=False), model=ns(aux_loss_coef=0.0, nll_loss_coef=0.0))
        t = ns(model=Model("policy"), ref_model=Model("ref"), args=args, strategy=strategy, margin_loss=False,
               aux_loss=False, nll_loss=False, compute_fp32_loss=False, beta=0.1,
               loss_fn={"dpo": o.DPOLoss(0.1), "rm": o.loss.PairWiseLoss(), "sft": o.loss.SFTLoss()}[kind],
               _wandb=ns(log=logged.append) if r == 0 else None, _tensorboard=None, tokenizer=ns(pad_token_id=0))
        for name, fn in m.items():
            setattr(t, name, types.MethodType(fn, t))
        t.evaluate(batches, steps=3)
        return logged

    rows = F.run_ranks(rank, world=len(sizes))[0]
    assert len(rows) == 1, rows
    return rows[0], key


def run_fit_aux(kind: str, d: PrefData, aux: Callable[[int, int], float], *, logging_steps: int = 1) -> list[dict]:
    """:func:`run_fit` (RM / SFT) with ``--aux_loss_coef`` 0.01 (trainer.aux_loss on): the model's forward returns
    an ``aux_loss`` (a MoE load-balancing loss stand-in) of ``aux(first item of the micro-batch, optimizer steps
    taken)``, which ``fit`` logs as aux_loss. Returns the rows rank 0 hands to wandb."""
    nll, beta = False, 0.1
    import torch
    w = wheel()
    o = w.o
    m = _fit_methods(kind)

    class Out(dict):
        __getattr__ = dict.get

    def rank(r: int) -> list[dict]:
        engine = Engine(r, d.gas)
        logged: list[dict] = []
        width = d.prompt + 7

        def ids_row(k: int, side: int):
            n = d.length(k, side)
            ids = torch.zeros(1, width, dtype=torch.long)
            mask = torch.zeros(1, width, dtype=torch.long)
            ids[0, 0] = 1000 + 2 * k + side                       # the item and side travel in the first token
            ids[0, 1:d.prompt + n] = 5
            mask[0, :d.prompt + n] = 1
            return ids, mask

        batches = []
        for s in range(d.steps):
            for u in range(d.gas):
                rows = [d.key(r, s, u, j) for j in range(d.micro)]
                c = [ids_row(k, 0) for k in rows]
                j_ = [ids_row(k, 1) for k in rows]
                cat = lambda xs, i: torch.stack([x[i] for x in xs])              # noqa: E731  (B, 1, T)
                if kind == "sft":
                    loss_mask = cat(c, 1).clone()
                    loss_mask[:, :, :d.prompt] = 0
                    batches.append((cat(c, 0), cat(c, 1), loss_mask))
                else:
                    extra = [d.prompt] * d.micro if kind == "dpo" else [0.0] * d.micro
                    batches.append((cat(c, 0), cat(c, 1), cat(j_, 0), cat(j_, 1), extra))

        def first(input_ids) -> int:             # the micro-batch's first item (chosen side)
            return (int(input_ids[0][0]) - 1000) // 2

        class Model:
            def __init__(self, role: str):
                self.role = role
                self.model = engine

            def train(self):
                pass

            def eval(self):
                pass

            def parameters(self):
                return iter([torch.zeros(1)])

            def __call__(self, input_ids, attention_mask=None, return_output=False, return_logprobs=False, **kw):
                version = engine.steps
                if kind == "rm":
                    vals = torch.tensor([d.score((int(x[0]) - 1000) // 2, (int(x[0]) - 1000) % 2, version)
                                         for x in input_ids])
                    return vals, Out(aux_loss=torch.tensor(aux(first(input_ids), version)))
                out = torch.zeros(input_ids.shape[0], input_ids.shape[1] - 1)
                for b, x in enumerate(input_ids):
                    k, side = (int(x[0]) - 1000) // 2, (int(x[0]) - 1000) % 2
                    vals = d.logp(k, side, version, self.role)
                    at = d.prompt if kind == "sft" else d.prompt - 1   # where each trainer's loss mask reads them
                    out[b, at:at + len(vals)] = torch.tensor(vals)
                return (out, Out(aux_loss=torch.tensor(aux(first(input_ids), version)))) if return_output else out

        class Loader(list):
            sampler = None

        strategy = engine.strategy()
        args = ns(train=ns(batch_size=d.micro * d.world * d.gas), eval=ns(steps=10 ** 9),
                  ckpt=ns(save_steps=10 ** 9), logger=ns(logging_steps=logging_steps),
                  model=ns(aux_loss_coef=0.01, nll_loss_coef=0.5 if nll else 0.0), ds=ns(packing_samples=False))
        strategy.args = args
        policy, ref = Model("policy"), Model("ref")
        t = ns(model=policy, ref_model=ref, epochs=1, train_dataloader=Loader(batches), eval_dataloader=None, args=args,
               aux_loss=True, nll_loss=nll, margin_loss=False, compute_fp32_loss=False, beta=beta,
               loss_fn={"dpo": o.DPOLoss(beta), "rm": o.loss.PairWiseLoss(), "sft": o.loss.SFTLoss()}[kind],
               optimizer=None, scheduler=engine.scheduler, strategy=strategy, tokenizer=ns(pad_token_id=0),
               _wandb=ns(log=logged.append, finish=lambda: None) if r == 0 else None, _tensorboard=None,
               disable_ds_ckpt=True, save_hf_ckpt=False)
        for name, fn in m.items():
            if name != "fit":
                setattr(t, name, types.MethodType(fn, t))
        m["fit"](t, args)
        return logged

    return F.run_ranks(rank, world=d.world)[0]


def run_generate_samples(scores: dict[int, list[float]], *, batch_size: int, n: int = GROUP,
                         score_range: tuple[float, float] = (0.0, 1.0)) -> tuple[list, float | None, int, bool]:
    """The wheel's SamplesGenerator.generate_samples / _generate_vllm / _dispatch_prompts_to_vllm /
    _process_response_into_experience with --algo.dynamic_filtering_enable, a prompt loader of prompts ``p0``,
    ``p1`` ... (two per batch) and one vLLM engine whose generate_responses returns prompt i's ``n`` samples scored
    ``scores[i]`` (``ray.wait`` hands back one ref at a time, in order). Returns what generate_samples returns:
    (the samples, filter_pass_rate, prompts consumed, exhausted)."""
    w = wheel()
    S = w.samples

    def responses(prompt: str, num_samples: int) -> list[dict]:
        i = int(prompt[1:])
        return [{"observation_tokens": [100 + i, 7, 7, 8, 8], "action_ranges": [(3, 5)], "reward": float(x),
                 "scores": float(x), "rollout_log_probs": None, "truncated": False, "prompt": prompt, "label": ""}
                for x in scores[i][:num_samples]]

    class Engine_:
        generate_responses = ns(remote=lambda prompt, label, sampling_params, max_length, hf_tokenizer, num_samples,
                                images: responses(prompt, num_samples))
        get_num_unfinished_requests = ns(remote=lambda: 0)
    loader = [(["d"] * 2, [f"p{2 * b}", f"p{2 * b + 1}"], ["", ""], [None, None]) for b in range(len(scores) // 2)]
    args = ns(rollout=ns(batch_size=batch_size, n_samples_per_prompt=n, vllm_generate_batch_size=None),
              vllm=ns(enable_sleep=False),
              algo=ns(dynamic_filtering_enable=True, dynamic_filtering_range=score_range,
                      advantage=ns(is_correction_level="off")))
    g = ns(args=args, vllm_engines=[Engine_()], tokenizer=None, prompts_dataloader=loader)
    for name in ("generate_samples", "_generate_vllm", "_dispatch_prompts_to_vllm",
                 "_process_response_into_experience"):
        setattr(g, name, types.MethodType(getattr(S.SamplesGenerator, name), g))
    S.ray.wait = lambda refs, num_returns=1, timeout=None: (refs[:num_returns], refs[num_returns:])
    try:
        with _swapped(S, "tqdm", quiet_tqdm):
            return g.generate_samples(max_len=64)
    finally:
        del S.ray.wait


#: entries covering the installed releases (openrlhf 0.11.2, areal 1.0.4) that no proof fingerprints, and why (the
#: proofs: tests/frameworks/test_proof_openrlhf*.py)
ENTRY_WHY: dict[tuple[str, str, str | None], str] = {
    ("openrlhf", "generated_samples", "ppo"): (
        "not a scalar: [decoded text of sample 0, its reward], a cumulative wandb table / TensorBoard text; "
        "test_ppo_rollout_stats_are_the_drivers_sample_statistics checks train_step puts that pair in the status"),
    ("openrlhf", "timing/{stage}", "ppo"): (
        "a raw wall-clock timer (time.time() differences around make_experience, ppo_train, broadcast in "
        "train_step): no batch quantity to fingerprint"),
    ("openrlhf", "timing/generation", "ppo"): (
        "a raw wall-clock timer (the samples generator's generation time, measured in fit): no batch quantity to "
        "fingerprint"),
    ("openrlhf", "timing/step_total", "ppo"): (
        "the sum of the step's other wall-clock timers: no batch quantity to fingerprint, and no candidate "
        "reduction is a sum of other keys"),
    ("openrlhf", "dynamic_filtering_pass_rate", "ppo"): (
        "no candidate reduction expresses it: SamplesGenerator.generate_samples logs 100 x the samples kept over "
        "the prompts consumed (a percentage, n_samples_per_prompt times the prompt groups' pass rate), which the "
        "entry now states as a deviation; test_ppo_dynamic_filtering_pass_rate_counts_samples_over_prompts_in_percent "
        "runs the wheel's generate_samples / _generate_vllm with dynamic filtering and checks that arithmetic"),
}
