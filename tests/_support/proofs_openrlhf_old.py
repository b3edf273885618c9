"""OpenRLHF 0.7.1.post2's, 0.9.7's and 0.6.4's own PPO code run on CPU for the fingerprint proofs of the older releases
(tests/frameworks/test_proof_openrlhf_old.py). The proofs run in a child process with
``.venv/releases/openrlhf-<version>/`` first on sys.path (tests/_support/releases.py), so every file loaded here is
that release's.

The path a logged PPO value takes, all from the release's own files:

* ``RemoteExperienceMaker.make_experience`` and ``compute_advantages_and_returns``
  (trainer/ppo_utils/experience_maker.py, loaded by file): the micro rollout batches, the old policy's and the
  reference's log-probs, the reward-side KL, the rewards, returns and advantages (REINFORCE);
* ``Actor.forward`` (models/actor.py, compiled from the file's own text: the module imports peft, DeepSpeed's
  transformers integration and bitsandbytes) turns a model's logits into the masked action log-probs, for the
  rollout, the reference and the update alike;
* the wheel's ``NaiveReplayBuffer`` (trainer/ppo_utils/replay_buffer.py): split into samples, re-batched into
  micro-batches of ``micro_train_batch_size`` by ``make_experience_batch``;
* ``ActorPPOTrainer.ppo_train`` / ``training_step`` (trainer/ray/ppo_actor.py, compiled from the file's own text, as
  tests/_support/framework_code.py does for 0.11.2): the per-micro-batch status, ``strategy.all_reduce`` over the
  simulated ranks (framework_code.strategy_all_reduce), the progress-bar postfix and the plain mean the tracker row
  gets.

Stand-ins, each for something the metric code does not compute with:

* ``ray`` (``get``/``put`` pass values through; the model groups are called in process), the launcher's
  ``PPORayActorGroup`` (a type annotation only), ``remote_rm_utils`` (no remote reward server: the reward model
  group's forward is a table of rewards), ``logging_utils.init_logger`` (a plain logger);
* the model under ``Actor.forward``: its logits are a fixed function of the tokens, the positions and the policy's
  version (how many optimizer steps this rank has taken; the reference is a version of its own), so the old policy,
  the reference and each optimizer step's policy give different log-probs;
* DeepSpeed (``Engine``): ``optimizer_step`` is ``engine.step()``, a real step (the policy's version and the LR
  scheduler advance) at every ``GAS``-th micro-batch; no backward pass;
* ``DataLoader`` (ppo_train's shuffled micro-batches): torch's own, with a generator seeded per run and rank (the
  simulated ranks are threads sharing torch's global RNG);
* ``torch.cuda.current_device`` (ppo_train moves each micro-batch to it): ``"cpu"``; ``tqdm`` (the progress bar):
  records each ``set_postfix`` (the console record trackbridge/sources/console.py reads);
* ``NaiveReplayBuffer.__init__`` is bypassed (it only stores its arguments and asks CUDA for a target device that
  ``sample``, unused by ppo_train, needs).

openrlhf 0.9.7 (``wheel97``, ``run_ppo97``; ``.venv/releases/openrlhf-0.9.7/``): the same path from the replay buffer
on (Actor.forward with the entropy, PolicyLoss's loss / clip ratio / ppo_kl, ppo_train, training_step). Its
experiences are built by ``run_ppo97`` instead of the experience maker (experience_maker.py imports vLLM, the Ray
launcher and the vLLM engine at import; its module is loaded with stand-ins for those -- ``vllm.SamplingParams``,
``RayActorGroup``, ``batch_vllm_engine_call``, ``apply_length_penalties`` -- only for its ``Experience`` dataclass):
the old policy's and the reference's log-probs are the release's Actor.forward on the model of versions 0 and -2,
and the advantages and the per-sample info fields (reward, response_length, total_length, score, group_reward_std,
truncated, response_clip_ratio, the rollout KL) are inputs that training_step and ppo_train reduce; models/utils.py
is loaded with an empty ``deepspeed`` (only set_z3_leaf_modules uses it).

openrlhf 0.6.4 (``wheel64``, ``run_ppo64``): the release's make_experience (the rollout KL with the action mask, the
rewards, the lengths), replay buffer, Actor.forward (num_actions, log-probs not masked), PolicyLoss and
ppo_train_actor / training_step; the advantages are inputs (compute_advantages_and_returns moves every experience to
"cuda" by name), so the return is not asserted there. See the section's comment for its stand-ins.

Every per-token value a proof compares with is computed by the release's functions on that token alone
(``PolicyLoss`` on one token, ``compute_approx_kl``, ``compute_reward`` of one sample), never re-implemented here;
this module records which samples each rank's micro-batches held, in which optimizer step.
"""
from __future__ import annotations

import functools
import logging
import math
import types
from dataclasses import dataclass, field
from typing import Any, Optional

from _support import framework_code as F

RELEASE = "0.7.1.post2"
WORLD, GAS, MICRO = 2, 2, 2              # ranks, micro-batches per optimizer step, samples per micro-batch
GROUP, PROMPTS = 4, 4                    # n_samples_per_prompt, prompts per rollout
N = GROUP * PROMPTS                      # samples per rollout
MICRO_ROLLOUT = 4                        # micro_rollout_batch_size (the experience maker's batches)
VOCAB, PAD, EOS, PROMPT_LEN = 40, 0, 1, 3
KL_COEF = 0.05
BASE_LR = 1e-6


def ns(**kw: Any) -> types.SimpleNamespace:
    return types.SimpleNamespace(**kw)


class _CpuTorch:
    """``torch`` as ppo_actor.py's ppo_train sees it: ``torch.cuda.current_device()`` is the CPU (``empty_cache`` a
    no-op)."""

    def __init__(self, torch: Any):
        self._torch = torch
        self.cuda = ns(current_device=lambda: "cpu", empty_cache=lambda: None)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._torch, name)


_SHUFFLE = {"seed": 0}


def _loader(*a: Any, **k: Any):
    """torch's DataLoader, its shuffle drawn from a generator seeded per run and rank: the simulated ranks are
    threads sharing torch's global RNG, which would make the order depend on their interleaving."""
    import torch
    from torch.utils.data import DataLoader
    g = torch.Generator()
    g.manual_seed(_SHUFFLE["seed"] * 10 + F.current_rank()[1])
    return DataLoader(*a, generator=g, **k)


class Bar:
    """tqdm as ppo_train uses it: iterates, records every ``set_postfix`` (the console record)."""

    bars: list["Bar"] = []

    def __init__(self, it: Any = None, *a: Any, **k: Any):
        self.it, self.postfixes, self.rank = it, [], F.current_rank()[1]
        Bar.bars.append(self)

    def __iter__(self):
        return iter(self.it)

    def set_postfix(self, d: dict, *a: Any, **k: Any) -> None:
        self.postfixes.append(dict(d))


@functools.lru_cache(maxsize=None)
def wheel() -> types.SimpleNamespace:
    import torch

    root = F._package_dir("openrlhf", "openrlhf")
    assert F.release("openrlhf") == RELEASE, F.release("openrlhf")
    for pkg, sub in [("openrlhf", ""), ("openrlhf.models", "models"), ("openrlhf.utils", "utils"),
                     ("openrlhf.trainer", "trainer"), ("openrlhf.trainer.ppo_utils", "trainer/ppo_utils"),
                     ("openrlhf.trainer.ray", "trainer/ray")]:
        F._skeleton(pkg, root / sub)
    utils = F._load_file("openrlhf.models.utils", root / "models/utils.py")
    loss = F._load_file("openrlhf.models.loss", root / "models/loss.py")
    fake_ray = types.ModuleType("ray")
    fake_ray.get = lambda x: x
    fake_ray.put = lambda x: x
    fake_ray.remote = lambda f: f
    launcher = types.ModuleType("openrlhf.trainer.ray.launcher")
    launcher.PPORayActorGroup = object
    logging_utils = types.ModuleType("openrlhf.utils.logging_utils")
    logging_utils.init_logger = lambda name: logging.getLogger(name)
    remote_rm = types.ModuleType("openrlhf.utils.remote_rm_utils")
    remote_rm.remote_rm_fn_ray = None
    stand_ins = {"ray": fake_ray, "openrlhf.trainer.ray.launcher": launcher,
                 "openrlhf.utils.logging_utils": logging_utils, "openrlhf.utils.remote_rm_utils": remote_rm}
    maker = F._load_file("openrlhf.trainer.ppo_utils.experience_maker", root / "trainer/ppo_utils/experience_maker.py",
                         stand_ins)
    buffer = F._load_file("openrlhf.trainer.ppo_utils.replay_buffer", root / "trainer/ppo_utils/replay_buffer.py")
    actor_ns: dict[str, Any] = {"torch": torch, "dist": torch.distributed, "Optional": Optional,
                                "log_probs_from_logits": utils.log_probs_from_logits,
                                "process_sequences": utils.process_sequences}
    forward = F._methods_from_source(root / "models/actor.py", "Actor", ["forward"], actor_ns)["forward"]
    trainer_ns: dict[str, Any] = {"torch": _CpuTorch(torch), "DataLoader": _loader, "tqdm": Bar,
                                  "Dict": dict, "Optional": Optional, "List": list, "Experience": maker.Experience,
                                  "compute_approx_kl": utils.compute_approx_kl, "masked_mean": utils.masked_mean}
    methods = F._methods_from_source(root / "trainer/ray/ppo_actor.py", "ActorPPOTrainer",
                                     ["ppo_train", "training_step"], trainer_ns)
    return ns(utils=utils, loss=loss, maker=maker, buffer=buffer, forward=forward, root=root, **methods)


# --------------------------------------------------------------------------------------------- the model
class Model:
    """The model under ``Actor.forward``: logits a fixed function of (token, position, version)."""

    def __init__(self, version: int):
        self.version = version

    def scale(self) -> float:
        return 1.0 + 0.35 * self.version

    def __call__(self, sequences, attention_mask=None, position_ids=None):
        import torch
        v = torch.arange(VOCAB, dtype=torch.float32)
        pos = torch.arange(sequences.shape[1], dtype=torch.float32)[None, :, None]
        tok = sequences.float()[..., None]
        s = self.scale()
        logits = torch.sin(tok * 0.37 + v * 0.91 + pos * 0.13) * s + torch.cos(v * (0.2 + 0.07 * self.version))
        return {"logits": logits}


class ActorModel:
    """An Actor (models/actor.py) around :class:`Model`: its ``forward`` is the release's own; records what it
    computed (the sample ids of each batch, the per-token action log-probs)."""

    def __init__(self, version: int, log: list | None = None):
        self.model = Model(version)
        self.packing_samples, self.temperature = False, 1.0
        self.log = log

    def train(self) -> None:
        pass

    def __call__(self, sequences, action_mask=None, attention_mask=None, **kw: Any):
        out = wheel().forward(self, sequences, action_mask, attention_mask=attention_mask, **kw)
        lp = out[0] if isinstance(out, tuple) else out
        if self.log is not None:
            self.log.append((self.model.version, sample_ids(sequences), lp.detach().clone(), action_mask.clone()))
        return out


def sample_ids(sequences) -> list[int]:
    """The prompt's first token is 2 + the sample's id (the first one that is not padding: a re-batched micro-batch
    may be left-padded)."""
    return [int(next(t for t in row if int(t) != PAD)) - 2 for row in sequences]


class Group:
    """A model group of the driver (ray/launcher.py's PPORayActorGroup): ``async_run_method_batch("forward")`` runs
    the forward on every batch in process, as one actor (``ray.get`` passes it through)."""

    def __init__(self, fn):
        self.fn = fn

    def async_run_method_batch(self, method_name: str, **kw: Any) -> list:
        assert method_name == "forward", method_name
        n = len(next(iter(kw.values())))
        return [[self.fn(**{k: v[i] for k, v in kw.items()}) for i in range(n)]]


# --------------------------------------------------------------------------------------------- the rollout
@dataclass
class Rollout:
    resp_len: list[int]
    reward: list[float]
    experiences: list = field(default_factory=list)
    kl_tokens: dict = field(default_factory=dict)    # sample -> its reward-side per-token KL (the maker's)
    old_lp: dict = field(default_factory=dict)       # sample -> the old policy's per-token log-probs
    ref_lp: dict = field(default_factory=dict)       # sample -> the reference's per-token log-probs
    returns: dict = field(default_factory=dict)      # sample -> compute_reward's per-token rewards
    advantages: dict = field(default_factory=dict)   # sample -> per-token advantages
    info: dict = field(default_factory=dict)         # sample -> {info key: the maker's per-sample value}


def make_args(*, use_kl_loss: bool = False, estimator: str = "k1") -> types.SimpleNamespace:
    return ns(micro_rollout_batch_size=MICRO_ROLLOUT, use_kl_loss=use_kl_loss, kl_estimator=estimator,
              init_kl_coef=KL_COEF, colocate_actor_ref=False, colocate_all_models=False, ring_attn_size=1,
              advantage_estimator="reinforce", n_samples_per_prompt=GROUP, reward_clip_range=(-10.0, 10.0),
              gamma=1.0, lambd=1.0, no_advantage_std_norm=False, aux_loss_coef=0.0, max_epochs=1,
              vllm_enable_sleep=False)


def make_rollout(args: types.SimpleNamespace, seed: int = 0) -> Rollout:
    """The release's experience maker on N samples of uneven response lengths (right-padded to the longest, as
    _generate_vllm pads them; process_sequences makes the masks)."""
    import torch
    W = wheel()
    resp_len = [1 + (i * 5 + seed * 3) % 7 for i in range(N)]
    reward = [round(((i * 7 + seed) % 11) / 5.0 - 1.0, 3) for i in range(N)]
    width = max(resp_len)
    rows = []
    for i, n in enumerate(resp_len):
        prompt = [2 + i] + [3 + (i + k) % 30 for k in range(PROMPT_LEN - 1)]
        resp = [3 + (i * 3 + k * 5 + seed) % 30 for k in range(n - 1)] + [EOS]
        rows.append(prompt + resp + [PAD] * (width - n))
    sequences, attention_mask, action_mask = W.utils.process_sequences(torch.tensor(rows), PROMPT_LEN, EOS, PAD)
    samples = W.maker.Samples(sequences=sequences, attention_mask=attention_mask, action_mask=action_mask,
                              response_length=action_mask.float().sum(dim=-1),
                              total_length=attention_mask.float().sum(dim=-1),
                              prompts=[f"p{i // GROUP}" for i in range(N)], labels=[""] * N)
    r = Rollout(resp_len=[int(x) for x in action_mask.sum(-1)], reward=reward)
    old_log: list = []
    ref_log: list = []
    old, ref = ActorModel(0, old_log), ActorModel(-2, ref_log)
    rewards_of = Group(lambda sequences, attention_mask, pad_sequence: torch.tensor(
        [reward[i] for i in sample_ids(sequences)]))
    maker = W.maker.RemoteExperienceMaker.__new__(W.maker.RemoteExperienceMaker)   # __init__ only stores these
    maker.__dict__.update(strategy=ns(args=args), args=args, initial_model_group=Group(lambda **k: ref(**k)),
                          critic_model_group=None, reward_model_group=rewards_of, remote_rm_url=None,
                          actor_model_group=Group(lambda **k: old(**k)), kl_ctl=ns(value=KL_COEF),
                          advantage_estimator=args.advantage_estimator)
    exps = maker.make_experience(samples)
    kls = [e.kl.clone() for e in exps]
    exps = maker.compute_advantages_and_returns(exps)
    for (_, ids, lp, mask), (_, _, rlp, _), e, kl in zip(old_log, ref_log, exps, kls):
        for b, i in enumerate(ids):
            m = mask[b].bool()
            r.old_lp[i], r.ref_lp[i] = lp[b][m].tolist(), rlp[b][m].tolist()
            r.kl_tokens[i] = kl[b][m].tolist()
            per_tok = W.utils.compute_reward(torch.tensor([reward[i]]), KL_COEF, kl[b:b + 1], action_mask=mask[b:b + 1],
                                             reward_clip_range=args.reward_clip_range)
            r.returns[i] = per_tok[0][m].tolist()
            r.advantages[i] = e.advantages[b][m].tolist()
            r.info[i] = {k: float(v[b]) for k, v in e.info.items()}
    r.experiences = exps
    return r


# --------------------------------------------------------------------------------------------- the PPO update
class Engine:
    """DeepSpeed's engine on one rank, simulated: a real optimizer step every ``GAS``-th ``optimizer_step``, where the
    policy's version advances and a real torch LR scheduler steps."""

    def __init__(self, actor: ActorModel, offset: int = 0):
        import torch
        self.actor, self.micro = actor, 0
        opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=BASE_LR)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: lr_factor(k + offset))

    def optimizer_step(self, *a: Any, **k: Any) -> None:
        self.micro += 1
        if self.micro % GAS == 0:
            self.actor.model.version += 1
            self.scheduler.optimizer.step()
            self.scheduler.step()


def lr_factor(k: int) -> float:
    """The LR scheduler's factor after k scheduler steps (distinct for k < 13, not monotone)."""
    return 1.0 / (1.0 + 0.25 * ((k * 5) % 13))


@dataclass
class PPORun:
    rollout: Rollout
    status: dict                                   # rank 0's ppo_train return: the tracker row
    postfix: dict                                  # rank 0's last progress-bar postfix: the console record
    batches: list                                  # [rank][micro-batch] -> (policy version, sample ids, new lp)
    lrs: list                                      # [rank][micro-batch] -> the LR training_step read


def run_ppo(args: types.SimpleNamespace, seed: int = 0) -> PPORun:
    """Dispatch the rollout's experiences to WORLD ranks (contiguous shares, as the launcher's
    async_run_method_batch splits a list), each appending them to the release's replay buffer and running
    ppo_train."""
    W = wheel()
    r = make_rollout(args, seed)
    share = len(r.experiences) // WORLD
    logs: list[list] = [[] for _ in range(WORLD)]
    lrs: list[list] = [[] for _ in range(WORLD)]

    def rank_fn(rank: int) -> dict:
        actor = ActorModel(0, logs[rank])
        engine = Engine(actor, offset=3 * seed)
        buf = W.buffer.NaiveReplayBuffer.__new__(W.buffer.NaiveReplayBuffer)
        buf.sample_batch_size, buf.limit, buf.cpu_offload, buf.packing_samples, buf.items = MICRO, 0, False, False, []
        for e in r.experiences[rank * share:(rank + 1) * share]:
            buf.append(e)

        class Scheduler:
            def get_last_lr(self):
                lr = engine.scheduler.get_last_lr()
                lrs[rank].append(lr[0])
                return lr

        strategy = ns(ring_attn_group=None, is_rank_0=lambda: rank == 0, all_reduce=F.strategy_all_reduce,
                      backward=lambda *a, **k: None, optimizer_step=engine.optimizer_step, args=args)
        trainer = ns(strategy=strategy, args=args, replay_buffer=buf, dataloader_pin_memory=False,
                     max_epochs=args.max_epochs, actor=actor, actor_loss_fn=W.loss.PolicyLoss(0.2), aux_loss=False,
                     actor_optim=None, actor_scheduler=Scheduler(), ema_model=None, ema_beta=0.992)
        trainer.training_step = lambda exp, kl_ctl: W.training_step(trainer, exp, kl_ctl)
        return W.ppo_train(trainer, KL_COEF)

    _SHUFFLE["seed"] = seed
    start = len(Bar.bars)
    statuses = F.run_ranks(rank_fn, WORLD)
    bar0 = [bar for bar in Bar.bars[start:] if bar.rank == 0][-1]         # rank 0's (last epoch's) progress bar
    batches = [[(v - 0, ids, lp, mask) for v, ids, lp, mask in logs[rank]] for rank in range(WORLD)]
    return PPORun(r, statuses[0], bar0.postfixes[-1], batches, lrs)


# --------------------------------------------------------------------------------------------- fingerprint batches
def steps_of(run: PPORun, per_seq) -> list:
    """The fingerprint's nesting [logged step][optimizer step][rank][micro-batch][sequence] -> values;
    ``per_seq(sample, micro-batch record)`` gives a sequence's values."""
    opt_steps = len(run.batches[0]) // GAS
    return [[[[[per_seq(i, rec, b) for b, i in enumerate(rec[1])] for rec in run.batches[rank][m * GAS:(m + 1) * GAS]]
              for rank in range(WORLD)] for m in range(opt_steps)]]


def new_lp(rec, b: int) -> list[float]:
    lp, mask = rec[2], rec[3]
    return lp[b][mask[b].bool()].tolist()


def policy_loss_tokens(run: PPORun, i: int, rec, b: int) -> list[float]:
    """Each token's PPO loss, by the release's PolicyLoss on that token alone."""
    import torch
    loss = wheel().loss.PolicyLoss(0.2)
    new = new_lp(rec, b)
    r = run.rollout
    return [float(loss(torch.tensor([[n]]), torch.tensor([[o]]), torch.tensor([[a]]),
                       action_mask=torch.ones(1, 1)))
            for n, o, a in zip(new, r.old_lp[i], r.advantages[i])]


def kl_loss_tokens(run: PPORun, i: int, rec, b: int, estimator: str) -> list[float]:
    """Each token's KL of the policy being updated vs the reference, by the release's compute_approx_kl."""
    import torch
    new = torch.tensor(new_lp(rec, b))
    return wheel().utils.compute_approx_kl(new, torch.tensor(run.rollout.ref_lp[i]), kl_estimator=estimator).tolist()


ENTRY_WHY: dict[tuple[str, str, str | None], str] = {
    ("openrlhf", "kl", "ppo"): (
        "the reward-side KL (no --use_kl_loss): at v0.7.0 - v0.7.1.post2 no candidate reduction gives it: "
        "make_experience takes each sample's masked_mean(kl, None, dim=-1), its token sum over the rollout's padded "
        "response width (experience_maker.py@v0.7.1.post2:391), which training_step weights by response length; the "
        "entries state this as a deviation and test_proof_openrlhf_old.py::test_openrlhf_071_ppo_actor checks no "
        "candidate fits. At v0.7.2 - v0.9.7 the 0.9.7 proofs build the experiences without the experience maker "
        "(its module imports vLLM and the Ray launcher), so the per-sample token means it computes are not run; the "
        "KL-loss entries (the policy being updated vs the reference) are fingerprinted at 0.7.1.post2 and 0.9.7"),
    ("openrlhf", "dynamic_filtering_pass_rate", "ppo"): (
        "no candidate reduction expresses it: a percentage at every release (v0.8.1 - v0.9.0: 100 x the kept "
        "groups' samples over the samples generated, ppo_trainer.py@v0.8.1:497; v0.9.1 - v0.9.8: 100 x "
        "rollout_batch_size over the prompts consumed, experience_maker.py@v0.9.7:297; v0.9.9 on: 100 x the samples "
        "kept over the prompts consumed, samples_generator.py@v0.9.9:110), which the entries state as deviations; "
        "test_proof_openrlhf.py::test_ppo_dynamic_filtering_pass_rate_counts_samples_over_prompts_in_percent runs "
        "0.11.2's generate_samples / _generate_vllm and checks that arithmetic"),
    ("openrlhf", "vllm_kl", "ppo"): (
        "logged only with --enable_vllm_is_correction, whose rollout log-probs come from vLLM (the experience "
        "maker's); the 0.9.7 proofs build the experiences without the maker, and run without the correction"),
    **{("openrlhf", f"perf/experience_maker/{name}", "ppo"): (
        "a raw wall-clock timer of the experience maker (time.time() differences in make_experience, v0.4.6 - "
        "v0.7.0.post1): no batch quantity to fingerprint") for name in ("generate_time", "actor_value_rm_time",
                                                                         "wait_time")},
    ("openrlhf", "policy_loss", "ppo"): (
        "the GSPO entry (--policy_loss_type gspo, v0.8.8 - v0.9.7): PolicyLoss's ratio is a sequence-level mean, so "
        "the per-token values a fingerprint needs are not the loss of a token alone; the 0.9.7 proofs run the PPO "
        "loss only"),
}


# ============================================================================================= openrlhf 0.9.7
# The 0.9.7 proofs run the release's replay buffer, Actor.forward (with the entropy), PolicyLoss and the actor's
# ppo_train / training_step as above. Their experiences are built here, not by the experience maker (its module
# imports vLLM and the Ray launcher at import time): the old policy's and the reference's log-probs come from the
# release's Actor.forward on the model of version 0 and -2; the advantages and the per-sample info fields (reward,
# return, response_length, total_length, the rollout KL) are inputs, which training_step and ppo_train reduce.
RELEASE_97 = "0.9.7"


class _Out(dict):
    """A model output (transformers' ModelOutput allows attributes: Actor.forward sets output.entropy)."""


class Model97(Model):
    """As :class:`Model`; the logits' scale is not monotone in the version, and shifts with the run's ``phase``
    (the entropy of the last optimizer step's policy is then not always the smallest)."""

    def __init__(self, version: int, phase: int = 0):
        super().__init__(version)
        self.phase = phase

    def scale(self) -> float:
        return 1.0 + 0.35 * ((self.version + self.phase) % 3)

    def __call__(self, sequences, attention_mask=None, position_ids=None):
        return _Out(super().__call__(sequences, attention_mask, position_ids))


@functools.lru_cache(maxsize=None)
def wheel97() -> types.SimpleNamespace:
    import torch

    root = F._package_dir("openrlhf", "openrlhf")
    assert F.release("openrlhf") == RELEASE_97, F.release("openrlhf")
    for pkg, sub in [("openrlhf", ""), ("openrlhf.models", "models"), ("openrlhf.utils", "utils"),
                     ("openrlhf.trainer", "trainer"), ("openrlhf.trainer.ppo_utils", "trainer/ppo_utils")]:
        F._skeleton(pkg, root / sub)
    no_deepspeed = types.ModuleType("deepspeed")            # only set_z3_leaf_modules uses it
    utils = F._load_file("openrlhf.models.utils", root / "models/utils.py", {"deepspeed": no_deepspeed})
    loss = F._load_file("openrlhf.models.loss", root / "models/loss.py")
    F._load_file("openrlhf.utils.utils", root / "utils/utils.py")
    F._load_file("openrlhf.utils.seqlen_balancing", root / "utils/seqlen_balancing.py")
    # experience_maker.py: only its Experience dataclass is used; the imports it needs at load are stand-ins
    fake_ray, vllm = types.ModuleType("ray"), types.ModuleType("vllm")
    vllm.SamplingParams = object
    launcher = types.ModuleType("openrlhf.trainer.ray.launcher")
    launcher.RayActorGroup = object
    engine = types.ModuleType("openrlhf.trainer.ray.vllm_engine")
    engine.batch_vllm_engine_call = None
    logging_utils = types.ModuleType("openrlhf.utils.logging_utils")
    logging_utils.init_logger = lambda name: logging.getLogger(name)
    penalty = types.ModuleType("openrlhf.trainer.ppo_utils.length_penalty")
    penalty.apply_length_penalties = None
    F._skeleton("openrlhf.trainer.ray", root / "trainer/ray")
    maker = F._load_file("openrlhf.trainer.ppo_utils.experience_maker", root / "trainer/ppo_utils/experience_maker.py",
                         {"ray": fake_ray, "vllm": vllm, "openrlhf.trainer.ray.launcher": launcher,
                          "openrlhf.trainer.ray.vllm_engine": engine, "openrlhf.utils.logging_utils": logging_utils,
                          "openrlhf.trainer.ppo_utils.length_penalty": penalty})
    buffer = F._load_file("openrlhf.trainer.ppo_utils.replay_buffer", root / "trainer/ppo_utils/replay_buffer.py")
    actor_ns: dict[str, Any] = {"torch": torch, "dist": torch.distributed, "Optional": Optional,
                                "log_probs_from_logits": utils.log_probs_from_logits,
                                "compute_entropy": utils.compute_entropy}
    forward = F._methods_from_source(root / "models/actor.py", "Actor", ["forward"], actor_ns)["forward"]
    trainer_ns: dict[str, Any] = {"torch": _CpuTorch(torch), "DataLoader": _loader, "tqdm": Bar,
                                  "Dict": dict, "Optional": Optional, "List": list, "Experience": maker.Experience,
                                  "compute_approx_kl": utils.compute_approx_kl, "masked_mean": utils.masked_mean}
    methods = F._methods_from_source(root / "trainer/ray/ppo_actor.py", "ActorPPOTrainer",
                                     ["ppo_train", "training_step"], trainer_ns)
    return ns(utils=utils, loss=loss, maker=maker, buffer=buffer, forward=forward, root=root, **methods)


class ActorModel97(ActorModel):
    def __init__(self, version: int, log: list | None = None, phase: int = 0):
        super().__init__(version, log)
        self.model = Model97(version, phase)

    def __call__(self, sequences, action_mask=None, attention_mask=None, **kw: Any):
        out = wheel97().forward(self, sequences, action_mask, attention_mask=attention_mask, **kw)
        lp, output = out if isinstance(out, tuple) else (out, None)
        if self.log is not None:
            ent = getattr(output, "entropy", None)
            ent = None if ent is None else ent[:, -action_mask.shape[1]:].detach().clone()
            self.log.append((self.model.version, sample_ids(sequences), lp.detach().clone(), action_mask.clone(), ent))
        return out


@dataclass
class Run97:
    status: dict
    postfix: dict
    batches: list                   # [rank][micro-batch] -> (version, sample ids, new lp, mask, entropy)
    lrs: list
    norms: list
    resp_len: list
    info: dict                      # sample -> the per-sample info inputs
    old_lp: dict
    ref_lp: dict
    advantages: dict


def args97(*, use_kl_loss: bool = False, estimator: str = "k1") -> types.SimpleNamespace:
    return ns(use_kl_loss=use_kl_loss, kl_estimator=estimator, init_kl_coef=KL_COEF, aux_loss_coef=0.0,
              max_epochs=1, use_dynamic_batch=False, ds_tensor_parallel_size=1, entropy_loss_coef=0.0,
              eps_clip_low_high=(0.2, 0.2), dual_clip=None, policy_loss_type="ppo", enable_vllm_is_correction=False,
              vllm_is_truncated_threshold=None, vllm_is_correction_type="tis")


def run_ppo97(args: types.SimpleNamespace, seed: int = 0) -> Run97:
    import torch
    W = wheel97()
    resp_len = [1 + (i * 5 + seed * 3) % 7 for i in range(N)]
    width = max(resp_len)
    rows = []
    for i, n in enumerate(resp_len):
        prompt = [2 + i] + [3 + (i + k) % 30 for k in range(PROMPT_LEN - 1)]
        resp = [3 + (i * 3 + k * 5 + seed) % 30 for k in range(n - 1)] + [EOS]
        rows.append(prompt + resp + [PAD] * (width - n))
    seqs = torch.tensor(rows)
    attention_mask = (seqs != PAD).long()
    action_mask = torch.tensor([[k < n for k in range(width)] for n in resp_len])
    old_log: list = []
    ref_log: list = []
    ActorModel97(0, old_log, seed)(seqs, action_mask, attention_mask=attention_mask)
    ActorModel97(-2, ref_log, seed)(seqs, action_mask, attention_mask=attention_mask)
    old_lp, ref_lp = old_log[0][2], ref_log[0][2]
    adv = torch.tensor([[0.3 * math.sin(1.7 * i + 0.9 * k + seed) + (0.5 if i % 3 else -0.4) for k in range(width)]
                        for i in range(N)]) * action_mask
    info = {i: {"reward": ((i * 7 + seed) % 11) / 5.0 - 1.0, "return": ((i * 3 + seed) % 7) / 3.0 - 0.8,
                "response_length": float(resp_len[i]), "total_length": float(resp_len[i] + PROMPT_LEN),
                "kl": 0.01 * ((i * 5 + seed) % 9), "score": float((i * 7 + seed * 5) % 11 < 4),
                "group_reward_std": 0.1 * ((i // GROUP * 3 + seed) % 5) + 0.07 * (i // GROUP) ** 2,
                "truncated": float((i * 5 + seed * 3) % 7 < 2),
                "response_clip_ratio": float((i * 3 + seed * 2) % 5 == 1)} for i in range(N)}
    exps = []
    for c in range(0, N, MICRO_ROLLOUT):
        sl = slice(c, c + MICRO_ROLLOUT)
        exps.append(W.maker.Experience(
            sequences=seqs[sl], attention_mask=attention_mask[sl], action_mask=action_mask[sl],
            action_log_probs=old_lp[sl], base_action_log_probs=ref_lp[sl] if args.use_kl_loss else None,
            advantages=adv[sl], returns=adv[sl],
            info={k: torch.tensor([info[i][k] for i in range(c, c + MICRO_ROLLOUT)]) for k in info[0]}))
    share = len(exps) // WORLD
    logs: list[list] = [[] for _ in range(WORLD)]
    lrs: list[list] = [[] for _ in range(WORLD)]
    norms: list[list] = [[] for _ in range(WORLD)]

    def rank_fn(rank: int) -> dict:
        actor = ActorModel97(0, logs[rank], seed)

        def grad_norm(model: Any) -> float:     # DeepSpeed's last step's global norm (the same on every rank)
            norms[rank].append(1.0 + 0.5 * ((actor.model.version * 7 + seed) % 11))
            return norms[rank][-1]
        engine = Engine(actor, offset=3 * seed)
        buf = W.buffer.NaiveReplayBuffer.__new__(W.buffer.NaiveReplayBuffer)
        buf.__dict__.update(sample_batch_size=MICRO, limit=0, cpu_offload=False, packing_samples=False, items=[],
                            dynamic_batch=False, dynamic_indices=[], dynamic_loss_scale=[],
                            dynamic_optimizer_step=[])
        for e in exps[rank * share:(rank + 1) * share]:
            buf.append(e)

        class Scheduler:
            def get_last_lr(self):
                lr = engine.scheduler.get_last_lr()
                lrs[rank].append(lr[0])
                return lr

        strategy = ns(ring_attn_group=None, is_rank_0=lambda: rank == 0, all_reduce=F.strategy_all_reduce,
                      backward=lambda *a, **k: None, optimizer_step=engine.optimizer_step, args=args,
                      get_grad_norm=grad_norm)
        trainer = ns(strategy=strategy, args=args, replay_buffer=buf, dataloader_pin_memory=False,
                     max_epochs=args.max_epochs, actor=actor, aux_loss=False, actor_optim=None,
                     actor_scheduler=Scheduler(), ema_model=None, ema_beta=0.992,
                     actor_loss_fn=W.loss.PolicyLoss(clip_eps_low=0.2, clip_eps_high=0.2))
        trainer.training_step = lambda exp, kl_ctl, step: W.training_step(trainer, exp, kl_ctl, step)
        return W.ppo_train(trainer, KL_COEF)

    _SHUFFLE["seed"] = seed
    start = len(Bar.bars)
    statuses = F.run_ranks(rank_fn, WORLD)
    bar0 = [bar for bar in Bar.bars[start:] if bar.rank == 0][-1]         # rank 0's (last epoch's) progress bar
    masks = action_mask.bool()
    return Run97(statuses[0], bar0.postfixes[-1], logs, lrs, norms, resp_len, info,
                 {i: old_lp[i][masks[i]].tolist() for i in range(N)},
                 {i: ref_lp[i][masks[i]].tolist() for i in range(N)},
                 {i: adv[i][masks[i]].tolist() for i in range(N)})


def steps97(run: Run97, per_seq) -> list:
    opt_steps = len(run.batches[0]) // GAS
    return [[[[[per_seq(i, rec, b) for b, i in enumerate(rec[1])] for rec in run.batches[rank][m * GAS:(m + 1) * GAS]]
              for rank in range(WORLD)] for m in range(opt_steps)]]


def loss97_tokens(run: Run97, i: int, rec, b: int, part: int) -> list[float]:
    """Each token's PolicyLoss output ``part`` (0 loss, 1 clip indicator, 2 ppo_kl) by the release's PolicyLoss on
    that token alone."""
    import torch
    fn = wheel97().loss.PolicyLoss(clip_eps_low=0.2, clip_eps_high=0.2)
    new = new_lp(rec, b)
    return [float(fn(torch.tensor([[n]]), torch.tensor([[o]]), torch.tensor([[a]]), action_mask=torch.ones(1, 1))[part])
            for n, o, a in zip(new, run.old_lp[i], run.advantages[i])]


def entropy97_tokens(rec, b: int) -> list[float]:
    _, _, _, mask, ent = rec
    return ent[b][mask[b].bool()].tolist()


def kl97_tokens(run: Run97, i: int, rec, b: int, estimator: str) -> list[float]:
    import torch
    new = torch.tensor(new_lp(rec, b))
    return wheel97().utils.compute_approx_kl(new, torch.tensor(run.ref_lp[i]), kl_estimator=estimator).tolist()


# ============================================================================================= openrlhf 0.6.4
# The 0.6.4 proof runs the release's RemoteExperienceMaker.make_experience (the rollout KL, the rewards, the lengths),
# its replay buffer, Actor.forward (0.6.4's: num_actions, unmasked log-probs), PolicyLoss and the actor's
# ppo_train_actor / training_step. compute_advantages_and_returns moves every experience to "cuda" by name
# (experience_maker.py@v0.6.4: experience.to_device("cuda")), which a CPU machine cannot run: the advantages are
# inputs (the return is not asserted). Stand-ins beyond the 0.7.1.post2 ones: ``openrlhf.models.actor`` (the Actor
# type only; Actor.forward is compiled from the file), ``torch.distributed`` in experience_maker.py (rank 0 of 1: it
# only gates log lines), ``torch.cuda.current_device`` (the CPU).
RELEASE_64 = "0.6.4"


@functools.lru_cache(maxsize=None)
def wheel64() -> types.SimpleNamespace:
    import torch

    root = F._package_dir("openrlhf", "openrlhf")
    assert F.release("openrlhf") == RELEASE_64, F.release("openrlhf")
    for pkg, sub in [("openrlhf", ""), ("openrlhf.models", "models"), ("openrlhf.utils", "utils"),
                     ("openrlhf.trainer", "trainer"), ("openrlhf.trainer.ppo_utils", "trainer/ppo_utils")]:
        F._skeleton(pkg, root / sub)
    utils = F._load_file("openrlhf.models.utils", root / "models/utils.py")
    loss = F._load_file("openrlhf.models.loss", root / "models/loss.py")
    ring = F._load_file("openrlhf.models.ring_attn_utils", root / "models/ring_attn_utils.py")
    fake_ray = types.ModuleType("ray")
    fake_ray.get = lambda x: x
    fake_ray.put = lambda x: x
    fake_ray.remote = lambda f: f
    actor_mod = types.ModuleType("openrlhf.models.actor")
    actor_mod.Actor = object
    logging_utils = types.ModuleType("openrlhf.utils.logging_utils")
    logging_utils.init_logger = lambda name: logging.getLogger(name)
    remote_rm = types.ModuleType("openrlhf.utils.remote_rm_utils")
    remote_rm.remote_rm_fn_ray = None
    maker = F._load_file("openrlhf.trainer.ppo_utils.experience_maker", root / "trainer/ppo_utils/experience_maker.py",
                         {"ray": fake_ray, "openrlhf.models.actor": actor_mod,
                          "openrlhf.utils.logging_utils": logging_utils, "openrlhf.utils.remote_rm_utils": remote_rm})
    maker.torch = _CpuTorch(torch)
    maker.dist = ns(get_rank=lambda *a: 0, get_world_size=lambda *a: 1)
    buffer = F._load_file("openrlhf.trainer.ppo_utils.replay_buffer", root / "trainer/ppo_utils/replay_buffer.py")
    actor_ns: dict[str, Any] = {"torch": torch, "dist": torch.distributed, "Optional": Optional, "Union": Any,
                                "log_probs_from_logits": utils.log_probs_from_logits, "F": torch.nn.functional}
    actor_fns = F._methods_from_source(root / "models/actor.py", "Actor", ["forward", "process_sequences"], actor_ns)
    forward = actor_fns["forward"]
    trainer_ns: dict[str, Any] = {"torch": _CpuTorch(torch), "DataLoader": _loader, "tqdm": Bar,
                                  "Dict": dict, "Optional": Optional, "List": list, "Experience": maker.Experience,
                                  "compute_approx_kl": utils.compute_approx_kl, "masked_mean": utils.masked_mean,
                                  "unpacking_samples": utils.unpacking_samples, "pad_sequences": ring.pad_sequences,
                                  "unpad_sequences": ring.unpad_sequences}
    methods = F._methods_from_source(root / "trainer/ray/ppo_actor.py", "ActorPPOTrainer",
                                     ["ppo_train_actor", "training_step"], trainer_ns)
    return ns(utils=utils, loss=loss, maker=maker, buffer=buffer, forward=forward, root=root,
              process_sequences=actor_fns["process_sequences"], **methods)


class ActorModel64(ActorModel):
    """0.6.4's Actor (forward(sequences, num_actions, attention_mask, ...)) around :class:`Model`."""

    def eval(self) -> None:
        pass

    def __call__(self, sequences, num_actions=None, attention_mask=None, **kw: Any):
        out = wheel64().forward(self, sequences, num_actions, attention_mask=attention_mask, **kw)
        lp = out[0] if isinstance(out, tuple) else out
        if self.log is not None:
            self.log.append((self.model.version, sample_ids(sequences), lp.detach().clone(), None))
        return out


class Remote64:
    """A Ray actor handle of 0.6.4's driver-side models: ``forward_batch.remote(...)`` runs in process."""

    def __init__(self, fn):
        self.forward_batch = ns(remote=lambda **kw: [fn(**{k: v[i] for k, v in kw.items()})
                                                     for i in range(len(kw["sequences"]))])


@dataclass
class Run64:
    status: dict
    postfix: dict
    batches: list                   # [rank][micro-batch] -> (version, sample ids, new lp, mask)
    resp_len: list
    info: dict
    old_lp: dict
    advantages: dict
    kl_tokens: dict


def run_ppo64(seed: int = 0, estimator: str = "k1") -> Run64:
    import torch
    W = wheel64()
    args = ns(micro_rollout_batch_size=MICRO_ROLLOUT, use_kl_loss=False, kl_estimator=estimator, init_kl_coef=KL_COEF,
              colocate_actor_ref=False, colocate_all_models=False, colocate_critic_reward=False, perf=False,
              packing_samples=False, aux_loss_coef=0.0, max_epochs=1)
    resp_len = [1 + (i * 5 + seed * 3) % 7 for i in range(N)]
    width = max(resp_len)
    rows = []
    for i, n in enumerate(resp_len):
        prompt = [2 + i] + [3 + (i + k) % 30 for k in range(PROMPT_LEN - 1)]
        resp = [3 + (i * 3 + k * 5 + seed) % 30 for k in range(n - 1)] + [EOS]
        rows.append(prompt + resp + [PAD] * (width - n))
    sequences, attention_mask, action_mask = W.process_sequences(None, torch.tensor(rows), PROMPT_LEN, EOS, PAD)
    reward = [round(((i * 7 + seed) % 11) / 5.0 - 1.0, 3) for i in range(N)]
    samples_list = []
    for c in range(0, N, MICRO_ROLLOUT):
        sl = slice(c, c + MICRO_ROLLOUT)
        samples_list.append(W.maker.Samples(
            sequences=sequences[sl], attention_mask=attention_mask[sl], action_mask=action_mask[sl],
            num_actions=action_mask.size(1), packed_seq_lens=None,
            response_length=action_mask[sl].float().sum(dim=-1), total_length=attention_mask[sl].float().sum(dim=-1),
            prompts=[""] * MICRO_ROLLOUT, labels=[""] * MICRO_ROLLOUT, pad_len=None))
    old_log: list = []
    ref_log: list = []
    old, ref = ActorModel64(0, old_log), ActorModel64(-2, ref_log)
    maker = W.maker.RemoteExperienceMaker.__new__(W.maker.RemoteExperienceMaker)    # __init__ only stores these
    maker.__dict__.update(
        strategy=ns(args=args, ring_attn_group=None), actor=old, critic=None, remote_rm_url=None,
        initial_model=Remote64(lambda **k: ref(k["sequences"], k["num_actions"], k["attention_mask"])),
        reward_model=[Remote64(lambda **k: torch.tensor([reward[i] for i in sample_ids(k["sequences"])]))],
        kl_ctl=ns(value=KL_COEF), packing_samples=False, advantage_estimator="reinforce")
    exps = maker.make_experience(samples_list)
    masks = action_mask.bool()
    info, old_lp, kl_tokens, adv = {}, {}, {}, {}
    for c, e in enumerate(exps):
        ids = list(range(c * MICRO_ROLLOUT, (c + 1) * MICRO_ROLLOUT))
        e.advantages = torch.stack([torch.tensor([0.3 * math.sin(1.7 * i + 0.9 * k + seed) + (0.5 if i % 3 else -0.4)
                                                  for k in range(width)]) for i in ids]) * e.action_mask
        e.returns = e.advantages.clone()
        e.info["return"] = torch.zeros(MICRO_ROLLOUT)
        del e.info["num_actions"]
        for b, i in enumerate(ids):
            info[i] = {k: float(v[b]) for k, v in e.info.items()}
            old_lp[i] = e.action_log_probs[b][masks[i]].tolist()
            kl_tokens[i] = e.kl[b][masks[i]].tolist()
            adv[i] = e.advantages[b][masks[i]].tolist()
        e.kl = None
    share = len(exps) // WORLD
    logs: list[list] = [[] for _ in range(WORLD)]
    seen: list[list] = [[] for _ in range(WORLD)]        # each micro-batch's action mask, as training_step got it

    def rank_fn(rank: int) -> dict:
        actor = ActorModel64(0, logs[rank])
        engine = Engine(actor, offset=3 * seed)
        buf = W.buffer.NaiveReplayBuffer.__new__(W.buffer.NaiveReplayBuffer)
        buf.__dict__.update(sample_batch_size=MICRO, limit=0, cpu_offload=False, packing_samples=False, items=[])
        for e in exps[rank * share:(rank + 1) * share]:
            buf.append(e)
        strategy = ns(ring_attn_group=None, is_rank_0=lambda: rank == 0, all_reduce=F.strategy_all_reduce,
                      backward=lambda *a, **k: None, optimizer_step=engine.optimizer_step, args=args)
        trainer = ns(strategy=strategy, args=args, replay_buffer=buf, dataloader_pin_memory=False,
                     max_epochs=args.max_epochs, actor=actor, actor_loss_fn=W.loss.PolicyLoss(0.2), aux_loss=False,
                     actor_optim=None, actor_scheduler=engine.scheduler, ema_model=None, ema_beta=0.992,
                     initial_model=maker.initial_model, kl_ctl=ns(value=KL_COEF), pretrain_dataloader=None)
        def training_step(exp):
            seen[rank].append(exp.action_mask.clone())
            return W.training_step(trainer, exp)
        trainer.training_step = training_step
        return W.ppo_train_actor(trainer, 1)

    _SHUFFLE["seed"] = seed
    start = len(Bar.bars)
    statuses = F.run_ranks(rank_fn, WORLD)
    bar0 = [bar for bar in Bar.bars[start:] if bar.rank == 0][-1]         # rank 0's (last epoch's) progress bar
    batches = [[(v, ids, lp, mask) for (v, ids, lp, _), mask in zip(logs[r], seen[r])] for r in range(WORLD)]
    return Run64(statuses[0], bar0.postfixes[-1], batches, resp_len, info, old_lp, adv, kl_tokens)


def steps64(run: Run64, per_seq) -> list:
    opt_steps = len(run.batches[0]) // GAS
    return [[[[[per_seq(i, rec, b) for b, i in enumerate(rec[1])] for rec in run.batches[rank][m * GAS:(m + 1) * GAS]]
              for rank in range(WORLD)] for m in range(opt_steps)]]


def loss64_tokens(run: Run64, i: int, rec, b: int) -> list[float]:
    """Each response token's PPO loss, by the release's PolicyLoss on that token alone."""
    import torch
    fn = wheel64().loss.PolicyLoss(0.2)
    new = new_lp(rec, b)
    return [float(fn(torch.tensor([[n]]), torch.tensor([[o]]), torch.tensor([[a]]), action_mask=torch.ones(1, 1)))
            for n, o, a in zip(new, run.old_lp[i], run.advantages[i])]
