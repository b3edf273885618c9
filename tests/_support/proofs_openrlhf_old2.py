"""OpenRLHF 0.10.1.post2's, 0.10.2's and 0.10.3's own PPO actor and critic code (and 0.9.5's KTO, the 0.10 line's
SFT fit loops) run on CPU for the fingerprint proofs of the
entries that cover only those releases (tests/frameworks/test_proof_openrlhf_old2.py). The proofs run in a child
process with ``.venv/releases/openrlhf-<version>/`` first on sys.path (tests/_support/releases.py), so every file
loaded here is that release's.

The path a logged PPO value takes is the one tests/_support/proofs_openrlhf_old.py runs for 0.9.7, on the files of the
0.10 line (which moved the Experience dataclass to trainer/ppo_utils/experience.py, merged the per-micro-batch
status by tokens or samples in ``ppo_train``, renamed the arguments into groups at 0.10.2 -- ``args.actor.*``,
``args.algo.kl.*``, ``args.train.*`` -- and normalised the losses by the micro-batch's token count over the ranks at
0.10.3 with ``utils/loss_utils.get_loss_batch_info`` and ``models/loss.aggregate_loss``):

* ``Actor.forward`` (models/actor.py, compiled from the file's own text: the module imports peft, DeepSpeed's
  transformers integration and bitsandbytes) turns a model's logits into the masked action log-probs and the
  entropy, for the old policy, the reference and the update alike;
* the release's ``Experience`` (trainer/ppo_utils/experience.py) and ``NaiveReplayBuffer``
  (trainer/ppo_utils/replay_buffer.py: split into samples, padding removed, re-batched into micro-batches of
  ``micro_train_batch_size`` by ``make_experience_batch``);
* ``PolicyLoss`` (models/loss.py), ``compute_approx_kl`` / ``masked_mean`` / ``compute_entropy`` (models/utils.py),
  at 0.10.3 ``aggregate_loss`` and ``get_loss_batch_info`` (utils/loss_utils.py, its ``torch.distributed`` the
  simulated ranks' collective, framework_code.SimDist);
* ``ActorPPOTrainer.ppo_train`` / ``training_step`` (trainer/ray/ppo_actor.py, compiled from the file's own text):
  the per-micro-batch metrics and weights, ``strategy.all_reduce`` over the simulated ranks
  (framework_code.strategy_all_reduce), the progress-bar postfix and the merge of the status list the tracker row
  gets.

Stand-ins, each for something the metric code does not compute with (as in proofs_openrlhf_old.py): the model under
``Actor.forward`` (logits a fixed function of the tokens, the positions and the policy's version), DeepSpeed
(``Engine``: ``optimizer_step`` is a real step of the policy's version and of a torch LR scheduler at every ``GAS``-th
micro-batch; no backward pass), torch's DataLoader with a generator seeded per run and rank, ``tqdm`` (records each
``set_postfix``), ``torch.cuda.current_device`` (the CPU), ``merge_mm_train_inputs`` (no multimodal inputs),
``torch.compile`` (models/utils.py's compute_entropy runs as its own eager function), an empty ``deepspeed`` module
for models/utils.py (only ``set_z3_leaf_modules`` uses it), and ``NaiveReplayBuffer.__init__`` bypassed (it only
stores its arguments and asks CUDA for a device ``sample`` needs).

The experiences are built here: the old policy's and the reference's log-probs are the release's Actor.forward on
the model of versions 0 and -2; the advantages and the per-sample fields are inputs that training_step and ppo_train
reduce. With ``use_maker`` (the reward-side KL, 0.10.1.post2) the release's ``RemoteExperienceMaker.make_experience``
(trainer/ppo_utils/experience_maker.py, loaded with ``ray`` get/put passing values through and the launcher's
``RayActorGroup`` a type annotation only; the model groups run in process) computes those log-probs, the per-token
KL and its per-sample token mean. The critic proofs run ``CriticPPOTrainer.ppo_train`` / ``training_step``
(trainer/ray/ppo_critic.py, compiled from its text) with the release's ValueLoss, the critic's values a fixed function
of the tokens, positions and the critic's version (``Critic``: the model built from a checkpoint is the stand-in).

Beyond PPO: openrlhf 0.9.5's ``KTOTrainer.fit`` and the 0.10 line's ``SFTTrainer.fit`` (see their sections).

Every per-token value a proof compares with is computed by the release's functions on that token (or, for GSPO's
sequence-level ratio, that sequence; for KTO, that example) alone, never re-implemented here.
"""
from __future__ import annotations

import functools
import logging
import math
import types
from dataclasses import dataclass, field
from typing import Any, Optional

from _support import framework_code as F
from _support.proofs_openrlhf_old import (
    _SHUFFLE,
    EOS,
    GAS,
    GROUP,
    KL_COEF,
    MICRO,
    MICRO_ROLLOUT,
    PAD,
    PROMPT_LEN,
    VOCAB,
    WORLD,
    ActorModel,
    Bar,
    Engine,
    Group,
    Model97,
    N,
    _CpuTorch,
    _loader,
    _Out,
    new_lp,
    ns,
    sample_ids,
)

__all__ = ["GROUP", "MICRO", "N", "WORLD"]            # the run's shape, read by the test module

RELEASES = ("0.10.1.post2", "0.10.2", "0.10.3")


def nested(release: str) -> bool:
    """Whether the release groups its arguments (``args.actor.*``, ``args.algo.kl.*``: 0.10.2 on)."""
    return release != "0.10.1.post2"


@functools.lru_cache(maxsize=None)
def wheel10() -> types.SimpleNamespace:
    import torch

    release = F.release("openrlhf")
    assert release in RELEASES, release
    root = F._package_dir("openrlhf", "openrlhf")
    for pkg, sub in [("openrlhf", ""), ("openrlhf.models", "models"), ("openrlhf.utils", "utils"),
                     ("openrlhf.trainer", "trainer"), ("openrlhf.trainer.ppo_utils", "trainer/ppo_utils")]:
        F._skeleton(pkg, root / sub)
    no_deepspeed = types.ModuleType("deepspeed")            # only set_z3_leaf_modules uses it
    utils = F._load_file("openrlhf.models.utils", root / "models/utils.py", {"deepspeed": no_deepspeed})
    loss = F._load_file("openrlhf.models.loss", root / "models/loss.py")
    F._load_file("openrlhf.utils.utils", root / "utils/utils.py")
    F._load_file("openrlhf.utils.seqlen_balancing", root / "utils/seqlen_balancing.py")
    experience = F._load_file("openrlhf.trainer.ppo_utils.experience", root / "trainer/ppo_utils/experience.py")
    buffer = F._load_file("openrlhf.trainer.ppo_utils.replay_buffer", root / "trainer/ppo_utils/replay_buffer.py")
    # compute_entropy is decorated with @torch.compile: its own function, run eagerly (inductor compiles C++ for
    # every new shape on a CPU machine, minutes a proof; the arithmetic is the function's)
    entropy = getattr(utils.compute_entropy, "_torchdynamo_orig_callable", utils.compute_entropy)
    actor_ns: dict[str, Any] = {"torch": torch, "dist": torch.distributed, "Optional": Optional,
                                "log_probs_from_logits": utils.log_probs_from_logits, "compute_entropy": entropy}
    forward = F._methods_from_source(root / "models/actor.py", "Actor", ["forward"], actor_ns)["forward"]
    trainer_ns: dict[str, Any] = {
        "torch": _CpuTorch(torch), "DataLoader": _loader, "tqdm": Bar, "Dict": dict, "Optional": Optional,
        "List": list, "Union": Any, "fields": __import__("dataclasses").fields, "Experience": experience.Experience,
        "compute_approx_kl": utils.compute_approx_kl, "masked_mean": utils.masked_mean,
        "merge_mm_train_inputs": lambda *a, **k: {}, "PolicyLoss": loss.PolicyLoss}
    loss_utils = None
    if (root / "utils/loss_utils.py").exists():                  # 0.10.3
        loss_utils = F._load_file("openrlhf.utils.loss_utils", root / "utils/loss_utils.py")
        loss_utils.dist = F.SimDist()                            # the simulated data-parallel group
        trainer_ns.update(aggregate_loss=loss.aggregate_loss, get_loss_batch_info=loss_utils.get_loss_batch_info)
    methods = F._methods_from_source(root / "trainer/ray/ppo_actor.py", "ActorPPOTrainer",
                                     ["ppo_train", "training_step"], trainer_ns)
    # experience_maker.py: ray (get/put pass values through), the launcher's RayActorGroup (a type annotation only)
    fake_ray = types.ModuleType("ray")
    fake_ray.get = lambda x: x
    fake_ray.put = lambda x: x
    launcher = types.ModuleType("openrlhf.trainer.ray.launcher")
    launcher.RayActorGroup = object
    F._skeleton("openrlhf.trainer.ray", root / "trainer/ray")
    logging_utils = F._load_file("openrlhf.utils.logging_utils", root / "utils/logging_utils.py")
    F._load_file("openrlhf.trainer.ppo_utils.length_penalty", root / "trainer/ppo_utils/length_penalty.py")
    maker = F._load_file("openrlhf.trainer.ppo_utils.experience_maker", root / "trainer/ppo_utils/experience_maker.py",
                         {"ray": fake_ray, "openrlhf.trainer.ray.launcher": launcher})
    critic_ns: dict[str, Any] = {"torch": _CpuTorch(torch), "DataLoader": _loader, "tqdm": Bar, "Dict": dict,
                                 "Optional": Optional, "Experience": experience.Experience,
                                 "masked_mean": utils.masked_mean}
    if loss_utils is not None:
        critic_ns["get_loss_batch_info"] = loss_utils.get_loss_batch_info
    critic = F._methods_from_source(root / "trainer/ray/ppo_critic.py", "CriticPPOTrainer",
                                    ["ppo_train", "training_step"], critic_ns)
    maker.logger.setLevel(logging.WARNING)
    logging_utils.init_logger("openrlhf").setLevel(logging.WARNING)
    return ns(release=release, utils=utils, loss=loss, experience=experience, buffer=buffer, forward=forward,
              loss_utils=loss_utils, maker=maker, root=root, critic_ppo_train=critic["ppo_train"],
              critic_training_step=critic["training_step"], **methods)


class ActorModel10(ActorModel):
    """The release's Actor (forward with the entropy) around :class:`Model97`; records each batch's sample ids,
    action log-probs, action mask and entropy."""

    def __init__(self, version: int, log: list | None = None, phase: int = 0):
        super().__init__(version, log)
        self.model = Model97(version, phase)

    def __call__(self, sequences, action_mask=None, attention_mask=None, **kw: Any):
        out = wheel10().forward(self, sequences, action_mask, attention_mask=attention_mask, **kw)
        lp, output = out if isinstance(out, tuple) else (out, None)
        if self.log is not None:
            ent = getattr(output, "entropy", None)
            ent = None if ent is None else ent[:, -action_mask.shape[1]:].detach().clone()
            self.log.append((self.model.version, sample_ids(sequences), lp.detach().clone(), action_mask.clone(), ent))
        return out


def make_args(release: str, *, use_kl_loss: bool = False, estimator: str = "k1",
              policy_loss_type: str = "ppo") -> types.SimpleNamespace:
    """The run's arguments as the release reads them (flat at 0.10.1.post2, grouped from 0.10.2 on)."""
    if not nested(release):
        return ns(use_kl_loss=use_kl_loss, kl_estimator=estimator, init_kl_coef=KL_COEF, aux_loss_coef=0.0,
                  max_epochs=1, use_dynamic_batch=False, ds_tensor_parallel_size=1, entropy_loss_coef=0.0,
                  eps_clip_low_high=(0.2, 0.2), dual_clip=None, policy_loss_type=policy_loss_type,
                  enable_vllm_is_correction=False, vllm_is_truncated_threshold=None, vllm_is_correction_type="tis",
                  ring_attn_size=1, colocate_all_models=False, colocate_actor_ref=False, colocate_critic_reward=False,
                  advantage_estimator="reinforce")
    return ns(train=ns(max_epochs=1, dynamic_batch_enable=False), ds=ns(tensor_parallel_size=1, packing_samples=False),
              actor=ns(entropy_coef=0.0, aux_loss_coef=0.0, policy_loss_type=policy_loss_type,
                       eps_clip_low_high=(0.2, 0.2), dual_clip=None),
              algo=ns(kl=ns(use_loss=use_kl_loss, init_coef=KL_COEF, estimator=estimator),
                      advantage=ns(is_correction_enable=False, is_correction_threshold=None,
                                   is_correction_type="tis")))


def policy_loss_fn(args: types.SimpleNamespace):
    """PolicyLoss built as ActorPPOTrainer.__init__ builds it from the arguments (ppo_actor.py)."""
    W = wheel10()
    a = args if not nested(W.release) else args.actor
    return W.loss.PolicyLoss(clip_eps_low=a.eps_clip_low_high[0], clip_eps_high=a.eps_clip_low_high[1],
                             dual_clip=a.dual_clip, policy_loss_type=a.policy_loss_type)


@dataclass
class Run10:
    status: dict
    postfix: dict
    batches: list                   # [rank][micro-batch] -> (version, sample ids, new lp, mask, entropy)
    resp_len: list
    old_lp: dict
    ref_lp: dict
    advantages: dict
    policy_loss_type: str
    rollout_kl: dict                # sample -> the experience maker's per-token reward-side KL (use_maker)


def run_ppo10(args: types.SimpleNamespace, seed: int = 0, use_maker: bool = False) -> Run10:
    """N samples of uneven response lengths, MICRO_ROLLOUT-sample experiences dispatched in contiguous shares to WORLD
    ranks, each appending them to the release's replay buffer and running ppo_train (2 optimizer steps x GAS
    micro-batches of MICRO samples, shuffled)."""
    import torch
    W = wheel10()
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
    ActorModel10(0, old_log, seed)(seqs, action_mask, attention_mask=attention_mask)
    ActorModel10(-2, ref_log, seed)(seqs, action_mask, attention_mask=attention_mask)
    old_lp, ref_lp = old_log[0][2], ref_log[0][2]
    adv = torch.tensor([[0.3 * math.sin(1.7 * i + 0.9 * k + seed) + (0.5 if i % 3 else -0.4) for k in range(width)]
                        for i in range(N)]) * action_mask
    kl_loss = (args.use_kl_loss if not nested(W.release) else args.algo.kl.use_loss)
    exps = []
    for c in range(0, N, MICRO_ROLLOUT):
        sl = slice(c, c + MICRO_ROLLOUT)
        ids = range(c, c + MICRO_ROLLOUT)
        exps.append(W.experience.Experience(
            sequences=seqs[sl], attention_mask=attention_mask[sl], action_mask=action_mask[sl],
            action_log_probs=old_lp[sl], base_action_log_probs=ref_lp[sl] if kl_loss else None,
            advantages=adv[sl], returns=adv[sl],
            rewards=torch.tensor([((i * 7 + seed) % 11) / 5.0 - 1.0 for i in ids]),
            response_length=torch.tensor([float(resp_len[i]) for i in ids]),
            total_length=torch.tensor([float(resp_len[i] + PROMPT_LEN) for i in ids]),
            truncated=torch.tensor([float((i * 5 + seed * 3) % 7 < 2) for i in ids]),
            info={"reward": torch.tensor([((i * 7 + seed) % 11) / 5.0 - 1.0 for i in ids])}))
    rollout_kl: dict = {}
    if use_maker:
        # the release's RemoteExperienceMaker.make_experience: the old policy's and the reference's log-probs from the
        # model groups (in process), the reward-side KL and its per-sample token mean (info kl, logprobs_diff)
        for e in exps:
            e.action_log_probs = e.base_action_log_probs = None
        old, ref = ActorModel10(0, None, seed), ActorModel10(-2, None, seed)
        maker = W.maker.RemoteExperienceMaker.__new__(W.maker.RemoteExperienceMaker)   # __init__ only stores these
        maker.__dict__.update(strategy=ns(args=args), args=args, advantage_estimator="reinforce",
                              actor_model_group=Group(lambda **k: old(**k)), critic_model_group=None,
                              reward_model_group=None, initial_model_group=Group(lambda **k: ref(**k)),
                              tokenizer=ns(pad_token_id=PAD), kl_ctl=ns(value=KL_COEF))
        exps = maker.make_experience(exps)
        for c, e in enumerate(exps):
            for b in range(len(e.sequences)):
                i = c * MICRO_ROLLOUT + b
                m = e.action_mask[b].bool()
                rollout_kl[i] = e.kl[b][m].tolist()
                assert e.action_log_probs[b][m].tolist() == old_lp[i][m].tolist()
            e.kl = None                 # compute_advantages_and_returns drops it (experience_maker.py)
    share = len(exps) // WORLD
    logs: list[list] = [[] for _ in range(WORLD)]

    def rank_fn(rank: int) -> dict:
        actor = ActorModel10(0, logs[rank], seed)
        engine = Engine(actor, offset=3 * seed)
        buf = W.buffer.NaiveReplayBuffer.__new__(W.buffer.NaiveReplayBuffer)
        buf.__dict__.update(sample_batch_size=MICRO, limit=0, cpu_offload=False, packing_samples=False, items=[],
                            dynamic_batch=False, dynamic_indices=[], dynamic_loss_scale=[],
                            dynamic_sample_loss_scale=[], dynamic_batch_num_tokens=[], dynamic_global_batch_size=[],
                            dynamic_optimizer_step=[])
        for e in exps[rank * share:(rank + 1) * share]:
            buf.append(e)
        strategy = ns(ring_attn_group=None, is_rank_0=lambda: rank == 0, all_reduce=F.strategy_all_reduce,
                      backward=lambda *a, **k: None, optimizer_step=engine.optimizer_step, args=args,
                      get_grad_norm=lambda model: 1.0 + 0.5 * ((actor.model.version * 7 + seed) % 11),
                      accumulated_gradient=GAS)
        trainer = ns(strategy=strategy, args=args, replay_buffer=buf, dataloader_pin_memory=False,
                     max_epochs=1, actor=actor, aux_loss=False, actor_optim=None,
                     actor_scheduler=engine.scheduler, ema_model=None, ema_beta=0.992,
                     actor_loss_fn=policy_loss_fn(args))
        trainer.training_step = lambda exp, kl_ctl, step: W.training_step(trainer, exp, kl_ctl, step)
        return W.ppo_train(trainer, KL_COEF)

    _SHUFFLE["seed"] = seed
    start = len(Bar.bars)
    statuses = F.run_ranks(rank_fn, WORLD)
    bar0 = [bar for bar in Bar.bars[start:] if bar.rank == 0][-1]         # rank 0's progress bar
    masks = action_mask.bool()
    loss_type = args.policy_loss_type if not nested(W.release) else args.actor.policy_loss_type
    return Run10(statuses[0], bar0.postfixes[-1], logs, resp_len,
                 {i: old_lp[i][masks[i]].tolist() for i in range(N)},
                 {i: ref_lp[i][masks[i]].tolist() for i in range(N)},
                 {i: adv[i][masks[i]].tolist() for i in range(N)}, loss_type, rollout_kl)


def steps10(run: Run10, per_seq) -> list:
    """The fingerprint's nesting [logged step][optimizer step][rank][micro-batch][sequence] -> values."""
    opt_steps = len(run.batches[0]) // GAS
    return [[[[[per_seq(i, rec, b) for b, i in enumerate(rec[1])] for rec in run.batches[rank][m * GAS:(m + 1) * GAS]]
              for rank in range(WORLD)] for m in range(opt_steps)]]


def loss_tokens(run: Run10, i: int, rec, b: int, part: int) -> list[float]:
    """Each token's PolicyLoss output ``part`` (0 loss, 1 clip indicator, 2 ppo_kl) by the release's PolicyLoss on
    that token alone; for GSPO (a sequence-level ratio) the loss of the sequence alone, on each of its tokens."""
    import torch
    W = wheel10()
    fn = W.loss.PolicyLoss(clip_eps_low=0.2, clip_eps_high=0.2, policy_loss_type=run.policy_loss_type)
    new = new_lp(rec, b)
    if run.policy_loss_type == "gspo":
        out = fn(torch.tensor([new]), torch.tensor([run.old_lp[i]]), torch.tensor([run.advantages[i]]),
                 action_mask=torch.ones(1, len(new)))
        return [float(out[part])] * len(new)
    return [float(fn(torch.tensor([[n]]), torch.tensor([[o]]), torch.tensor([[a]]), action_mask=torch.ones(1, 1))[part])
            for n, o, a in zip(new, run.old_lp[i], run.advantages[i])]


def entropy_tokens(rec, b: int) -> list[float]:
    _, _, _, mask, ent = rec
    return ent[b][mask[b].bool()].tolist()


def kl_tokens(run: Run10, i: int, rec, b: int, estimator: str) -> list[float]:
    """Each token's KL of the policy being updated vs the reference, by the release's compute_approx_kl."""
    import torch
    new = torch.tensor(new_lp(rec, b))
    return wheel10().utils.compute_approx_kl(new, torch.tensor(run.ref_lp[i]), kl_estimator=estimator).tolist()


# --------------------------------------------------------------------------------------------- the critic
class Critic:
    """The critic model under CriticPPOTrainer.training_step (models/model.py's critic, built by
    get_llm_for_sequence_regression from a checkpoint): its values are a fixed function of the tokens, the positions
    and the critic's version (how many optimizer steps it has taken); records each batch's sample ids, values, mask."""

    def __init__(self, log: list, seed: int):
        self.model = ns(version=0)
        self.log, self.seed = log, seed

    def train(self) -> None:
        pass

    def __call__(self, sequences, action_mask=None, attention_mask=None, return_output=False, **kw: Any):
        import torch
        width = action_mask.shape[1]
        tok = sequences[:, -width - 1:-1].float()
        pos = torch.arange(width, dtype=torch.float32)[None, :]
        v = self.model.version
        values = (torch.sin(tok * 0.29 + pos * 0.41 + 0.7 * v + self.seed) * (1.0 + 0.3 * (v % 2))) * action_mask
        self.log.append((v, sample_ids(sequences), values.detach().clone(), action_mask.clone()))
        return (values, ns(aux_loss=None)) if return_output else values


@dataclass
class CriticRun:
    status: dict
    batches: list                   # [rank][micro-batch] -> (version, sample ids, values, mask)
    lrs: list                       # [rank] -> the LR each micro-batch read
    norms: list                     # [rank] -> the grad norm each micro-batch read
    old_values: dict
    returns: dict


def critic_args(release: str) -> types.SimpleNamespace:
    if not nested(release):
        return ns(max_epochs=1, use_dynamic_batch=False, ds_tensor_parallel_size=1, aux_loss_coef=0.0)
    return ns(train=ns(max_epochs=1, dynamic_batch_enable=False), ds=ns(tensor_parallel_size=1, packing_samples=False),
              actor=ns(aux_loss_coef=0.0))


def run_critic10(seed: int = 0) -> CriticRun:
    """The release's CriticPPOTrainer.ppo_train / training_step on WORLD ranks, each with its share of N samples of
    uneven response lengths (old values and returns given), in micro-batches of MICRO, an optimizer step every GAS."""
    import torch
    W = wheel10()
    args = critic_args(W.release)
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
    old_v = torch.tensor([[0.4 * math.cos(1.3 * i + 0.7 * k + seed) for k in range(width)]
                          for i in range(N)]) * action_mask
    ret = torch.tensor([[0.6 * math.sin(0.9 * i - 0.5 * k + seed) + (0.3 if i % 2 else -0.2) for k in range(width)]
                        for i in range(N)]) * action_mask
    chunks = [slice(c, c + MICRO_ROLLOUT) for c in range(0, N, MICRO_ROLLOUT)]
    exps = [W.experience.Experience(sequences=seqs[c], attention_mask=attention_mask[c], action_mask=action_mask[c],
                                    values=old_v[c], returns=ret[c], info={}) for c in chunks]
    share = len(exps) // WORLD
    logs: list[list] = [[] for _ in range(WORLD)]
    lrs: list[list] = [[] for _ in range(WORLD)]
    norms: list[list] = [[] for _ in range(WORLD)]

    def rank_fn(rank: int) -> dict:
        critic = Critic(logs[rank], seed)
        engine = Engine(critic, offset=3 * seed)
        buf = W.buffer.NaiveReplayBuffer.__new__(W.buffer.NaiveReplayBuffer)
        buf.__dict__.update(sample_batch_size=MICRO, limit=0, cpu_offload=False, packing_samples=False, items=[],
                            dynamic_batch=False, dynamic_indices=[], dynamic_loss_scale=[],
                            dynamic_sample_loss_scale=[], dynamic_batch_num_tokens=[], dynamic_global_batch_size=[],
                            dynamic_optimizer_step=[])
        for e in exps[rank * share:(rank + 1) * share]:
            buf.append(e)

        class Scheduler:
            def get_last_lr(self):
                lr = engine.scheduler.get_last_lr()
                lrs[rank].append(lr[0])
                return lr

        def grad_norm(model: Any) -> float:     # DeepSpeed's last step's global norm (the same on every rank)
            norms[rank].append(1.0 + 0.5 * ((critic.model.version * 7 + seed) % 11))
            return norms[rank][-1]
        strategy = ns(ring_attn_group=None, is_rank_0=lambda: rank == 0, all_reduce=F.strategy_all_reduce,
                      backward=lambda *a, **k: None, optimizer_step=engine.optimizer_step, args=args,
                      get_grad_norm=grad_norm, accumulated_gradient=GAS)
        trainer = ns(strategy=strategy, args=args, replay_buffer=buf, dataloader_pin_memory=False, max_epochs=1,
                     critic=critic, critic_optim=None, critic_scheduler=Scheduler(), aux_loss=False,
                     critic_loss_fn=W.loss.ValueLoss(0.2))
        trainer.training_step = lambda exp, step: W.critic_training_step(trainer, exp, step)
        return W.critic_ppo_train(trainer)

    _SHUFFLE["seed"] = seed
    statuses = F.run_ranks(rank_fn, WORLD)
    masks = action_mask.bool()
    return CriticRun(statuses[0], logs, lrs, norms, {i: old_v[i][masks[i]].tolist() for i in range(N)},
                     {i: ret[i][masks[i]].tolist() for i in range(N)})


def critic_values(rec, b: int) -> list[float]:
    return rec[2][b][rec[3][b].bool()].tolist()


def value_loss_tokens(run: CriticRun, i: int, rec, b: int) -> list[float]:
    """Each token's value loss, by the release's ValueLoss on that token alone."""
    import torch
    fn = wheel10().loss.ValueLoss(0.2)
    return [float(fn(torch.tensor([[v]]), torch.tensor([[o]]), torch.tensor([[r]]), action_mask=torch.ones(1, 1)))
            for v, o, r in zip(critic_values(rec, b), run.old_values[i], run.returns[i])]


# ============================================================================================= SFT at 0.10.2 / 0.10.3
# SFTTrainer.fit and save_logs_and_checkpoints (trainer/sft_trainer.py, compiled from the file's own text) with the
# release's SFTLoss (models/loss.py; at 0.10.3 get_loss_batch_info over the simulated ranks) and Actor.forward
# (models/actor.py, return_logprobs) on the model of proofs_openrlhf_old.py (logits a fixed function of the tokens,
# the positions and the policy's version). Stand-ins as for KTO: DeepSpeed (``Engine``), tqdm (silent), the loader (a
# list of collated micro-batches: input ids, attention mask, loss mask), DistributedSampler.
SFT_STEPS, SFT_WINDOW, SFT_WIDTH, SFT_PROMPT = 6, 2, 10, 2


@functools.lru_cache(maxsize=None)
def sft_methods() -> dict:
    import torch
    W = wheel10()

    class NoSampler:
        pass
    namespace = {"torch": _CpuTorch(torch), "tqdm": _Quiet, "os": __import__("os"), "DistributedSampler": NoSampler}
    if W.loss_utils is not None:
        namespace["get_loss_batch_info"] = W.loss_utils.get_loss_batch_info
    return F._methods_from_source(W.root / "trainer/sft_trainer.py", "SFTTrainer",
                                  ["fit", "save_logs_and_checkpoints"], namespace)


class SFTModel(ActorModel):
    """The release's Actor (forward with return_logprobs) around :class:`Model97`."""

    def __init__(self, version: int, seed: int):
        super().__init__(version)
        self.model = Model97(version, seed)

    def parameters(self):
        import torch
        return iter([torch.zeros(1)])

    def __call__(self, sequences, attention_mask=None, **kw: Any):
        return wheel10().forward(self, sequences, None, attention_mask=attention_mask, **kw)


def sft_key(r: int, s: int, u: int, j: int) -> int:
    return ((r * SFT_STEPS + s) * GAS + u) * MICRO + j


@dataclass
class SFTRun:
    rows: list                      # rank 0's wandb rows
    rows_of: dict                   # key -> (input ids, attention mask, loss mask)
    seed: int
    cache: dict = field(default_factory=dict)


def run_sft10(seed: int = 0) -> SFTRun:
    import torch
    W = wheel10()
    m = sft_methods()
    rows_of = {}
    for r in range(WORLD):
        for s in range(SFT_STEPS):
            for u in range(GAS):
                for j in range(MICRO):
                    k = sft_key(r, s, u, j)
                    n = 1 + (k * 5 + seed * 3 + k // 3) % 7
                    ids = [2 + k % 7] + [3 + (k * 3 + t * 5 + seed) % 36 for t in range(SFT_PROMPT - 1 + n)]
                    ids += [PAD] * (SFT_WIDTH - len(ids))
                    att = [1] * (SFT_PROMPT + n) + [0] * (SFT_WIDTH - SFT_PROMPT - n)
                    loss = [0] * SFT_PROMPT + [1] * n + [0] * (SFT_WIDTH - SFT_PROMPT - n)
                    rows_of[k] = (ids, att, loss)

    def rank_fn(rank: int) -> list:
        model = SFTModel(0, seed)
        engine = Engine(model, offset=3 * seed)
        batches = []
        for s in range(SFT_STEPS):
            for u in range(GAS):
                keys = [sft_key(rank, s, u, j) for j in range(MICRO)]
                batches.append(tuple(torch.tensor([rows_of[k][c] for k in keys])[:, None, :] for c in range(3)))

        class Loader(list):
            sampler = None
        logged: list = []
        args = ns(train=ns(batch_size=MICRO * WORLD * GAS), eval=ns(steps=10 ** 9), ckpt=ns(save_steps=float("inf")),
                  logger=ns(logging_steps=SFT_WINDOW), model=ns(aux_loss_coef=0.0), ds=ns(packing_samples=False))
        strategy = ns(accumulated_gradient=GAS, is_rank_0=lambda: rank == 0, all_reduce=F.strategy_all_reduce,
                      backward=lambda *a, **k: None, optimizer_step=engine.optimizer_step, args=args,
                      ring_attn_group=None, get_grad_norm=lambda model: 1.0)
        t = ns(model=model, epochs=1, train_dataloader=Loader(batches), eval_dataloader=None, args=args,
               strategy=strategy, scheduler=engine.scheduler, optimizer=None, aux_loss=False,
               loss_fn=W.loss.SFTLoss(), _wandb=ns(log=logged.append, finish=lambda: None) if rank == 0 else None,
               _tensorboard=None, disable_ds_ckpt=True, save_hf_ckpt=False, tokenizer=None, packing_samples=False)
        t.save_logs_and_checkpoints = types.MethodType(m["save_logs_and_checkpoints"], t)
        m["fit"](t, args, 0, SFT_STEPS)
        return logged

    return SFTRun(F.run_ranks(rank_fn, WORLD)[0], rows_of, seed)


def sft_nll_tokens(run: SFTRun, k: int, version: int) -> list[float]:
    """Sequence k's per-token negative log-likelihood on its loss-masked tokens, by the release's Actor.forward on the
    sequence alone under the policy of ``version``."""
    import torch
    if (k, version) not in run.cache:
        ids, att, loss = (torch.tensor([x]) for x in run.rows_of[k])
        lp, _ = SFTModel(version, run.seed)(ids, attention_mask=att, return_output=True, return_logprobs=True)
        run.cache[(k, version)] = (-lp[0][loss[0, :-1].bool()]).tolist()
    return run.cache[(k, version)]


# ============================================================================================= KTO at 0.9.5
# KTOTrainer.fit (trainer/kto_trainer.py, compiled from the file's own text with compute_model_logps_with_KL,
# compute_model_logps, _get_batch_logps and save_logs_and_checkpoints; the module imports DeepSpeed through
# openrlhf.models) with the release's KTOLoss (models/loss.py, its torch.distributed all_reduce of the KL estimate the
# simulated ranks' collective) and log_probs_from_logits. Stand-ins: the policy and reference models (logits a fixed
# function of the tokens, the positions and the policy's version; the label token gets a bonus, larger for the policy,
# so the KL estimate is positive and not clamped), DeepSpeed (``Engine``: a real optimizer step of the policy's
# version and of a torch LR scheduler every GAS-th micro-batch), tqdm (silent), the data loader (a list of the
# collated micro-batches: input_ids, attention_mask, labels, prompt lengths), DistributedSampler (never the loader's).
RELEASE_KTO = "0.9.5"
KTO_MICRO, KTO_STEPS, KTO_WINDOW, KTO_BETA = 6, 6, 2, 0.1     # items per micro-batch (half matched, half for KL)
KTO_WIDTH, KTO_PROMPT = 9, 2


class _Dist(F.SimDist):
    """torch.distributed in loss.py: the simulated ranks' all_reduce inside run_ranks; outside (a loss computed on
    one item, world_size 1), a no-op."""

    def all_reduce(self, t, op="sum", group=None) -> None:
        if getattr(F._current, "group", None) is not None:
            super().all_reduce(t, op, group)


class _Quiet:
    def __init__(self, it: Any = None, *a: Any, **k: Any):
        self.it = it

    def __iter__(self):
        return iter(self.it)

    def set_postfix(self, *a: Any, **k: Any) -> None:
        pass

    def update(self, *a: Any, **k: Any) -> None:
        pass


@functools.lru_cache(maxsize=None)
def wheel_kto() -> types.SimpleNamespace:
    import torch

    assert F.release("openrlhf") == RELEASE_KTO, F.release("openrlhf")
    root = F._package_dir("openrlhf", "openrlhf")
    for pkg, sub in [("openrlhf", ""), ("openrlhf.models", "models"), ("openrlhf.utils", "utils"),
                     ("openrlhf.trainer", "trainer")]:
        F._skeleton(pkg, root / sub)
    no_deepspeed = types.ModuleType("deepspeed")            # only set_z3_leaf_modules uses it
    utils = F._load_file("openrlhf.models.utils", root / "models/utils.py", {"deepspeed": no_deepspeed})
    loss = F._load_file("openrlhf.models.loss", root / "models/loss.py")
    loss.dist = _Dist()

    class NoSampler:
        pass
    names = ["fit", "save_logs_and_checkpoints", "compute_model_logps_with_KL", "compute_model_logps",
             "_get_batch_logps"]
    methods = F._methods_from_source(root / "trainer/kto_trainer.py", "KTOTrainer", names,
                                     {"torch": _CpuTorch(torch), "tqdm": _Quiet, "os": __import__("os"),
                                      "DistributedSampler": NoSampler,
                                      "log_probs_from_logits": utils.log_probs_from_logits})
    return ns(utils=utils, loss=loss, methods=methods, root=root)


class KTOModel:
    """The policy or reference model under KTOTrainer: logits a fixed function of (token, position, version) plus a
    bonus on the next (label) token."""

    def __init__(self, version: int, bonus: float, seed: int):
        self.model = ns(version=version)
        self.bonus, self.seed = bonus, seed

    def train(self) -> None:
        pass

    def eval(self) -> None:
        pass

    def __call__(self, input_ids, attention_mask=None, return_output=True, **kw: Any):
        import torch
        v = self.model.version
        voc = torch.arange(VOCAB, dtype=torch.float32)
        pos = torch.arange(input_ids.shape[1], dtype=torch.float32)[None, :, None]
        tok = input_ids.float()[..., None]
        logits = torch.sin(tok * 0.37 + voc * 0.91 + pos * 0.13 + self.seed) * (1.0 + 0.35 * (v % 3))
        nxt = torch.roll(input_ids, -1, dims=1)
        logits = logits + torch.nn.functional.one_hot(nxt, VOCAB).float() * (self.bonus + 0.4 * math.sin(v + 1))
        return _Out(logits=logits)


@dataclass
class KTORun:
    rows: list                      # rank 0's wandb rows
    items: dict                     # (rank, step, micro) -> [(key, label), ...] the matched half, then the KL half
    rows_of: dict                   # key -> (input_ids row, attention_mask row)
    policy_versions: list           # [rank][micro-batch] -> the policy's version when it ran
    lr_after: list                  # rank 0: the LR after each optimizer step's scheduler step
    seed: int
    logps: dict = field(default_factory=dict)


def kto_size(r: int, s: int, u: int) -> int:
    """The items of rank r's micro-batch u of optimizer step s: matched halves of uneven sizes."""
    return (KTO_MICRO - 2, KTO_MICRO, KTO_MICRO + 2)[(u + r + s) % 3]


def kto_desirable(r: int, s: int, u: int) -> int:
    """How many of the matched half of rank r's micro-batch u of step s are desirable (the first ones; the rest are
    undesirable): 1 or more, fewer than the half, uneven over the micro-batches, the ranks and the steps."""
    return 1 + u % (kto_size(r, s, u) // 2 - 1)


def kto_key(r: int, s: int, u: int, j: int) -> int:
    return ((r * KTO_STEPS + s) * GAS + u) * (KTO_MICRO + 2) + j


def run_kto(seed: int = 0) -> KTORun:
    import torch
    W = wheel_kto()
    rows_of, items = {}, {}
    for r in range(WORLD):
        for s in range(KTO_STEPS):
            for u in range(GAS):
                lst = []
                for j in range(kto_size(r, s, u)):
                    k = kto_key(r, s, u, j)
                    n = 1 + (k * 7 + seed * 3) % 6
                    ids = [2 + k % 5] + [3 + (k * 3 + t * 5 + seed) % 36 for t in range(KTO_PROMPT - 1 + n)]
                    ids += [PAD] * (KTO_WIDTH - len(ids))
                    mask = [1] * (KTO_PROMPT + n) + [0] * (KTO_WIDTH - KTO_PROMPT - n)
                    rows_of[k] = (ids, mask)
                    label = int(j < kto_desirable(r, s, u))
                    lst.append((k, label))
                items[(r, s, u)] = lst
    versions: list[list] = [[] for _ in range(WORLD)]
    lr_after: list[list] = [[] for _ in range(WORLD)]

    def rank_fn(rank: int) -> list:
        policy, ref = KTOModel(0, 2.0, seed), KTOModel(-2, 0.5, seed)
        engine = Engine(policy, offset=3 * seed)
        batches = []
        for s in range(KTO_STEPS):
            for u in range(GAS):
                lst = items[(rank, s, u)]
                ids = torch.tensor([rows_of[k][0] for k, _ in lst])[:, None, :]
                mask = torch.tensor([rows_of[k][1] for k, _ in lst])[:, None, :]
                batches.append((ids, mask, torch.tensor([lab for _, lab in lst]), [KTO_PROMPT] * len(lst)))

        class Loader(list):
            sampler = None

        logged: list = []

        def opt_step(*a: Any, **k: Any) -> None:
            versions[rank].append(policy.model.version)
            engine.optimizer_step()
            if engine.micro % GAS == 0:
                lr_after[rank].append(engine.scheduler.get_last_lr()[0])
        args = ns(eval_steps=10 ** 9, save_steps=float("inf"), train_batch_size=KTO_MICRO * WORLD * GAS,
                  logging_steps=KTO_WINDOW, aux_loss_coef=0.0, desirable_loss_weight=1.0,
                  undesirable_loss_weight=1.0)
        strategy = ns(accumulated_gradient=GAS, is_rank_0=lambda: rank == 0, all_reduce=F.strategy_all_reduce,
                      backward=lambda *a, **k: None, optimizer_step=opt_step, args=args, world_size=WORLD)
        t = ns(model=policy, ref_model=ref, epochs=1, train_dataloader=Loader(batches), eval_dataloader=None,
               args=args, strategy=strategy, scheduler=engine.scheduler, optimizer=None, aux_loss=False,
               loss_fn=W.loss.KTOLoss(KTO_BETA, 1.0, 1.0, WORLD, "cpu"), beta=KTO_BETA,
               _wandb=ns(log=logged.append, finish=lambda: None) if rank == 0 else None, _tensorboard=None,
               disable_ds_ckpt=True, save_hf_ckpt=False, tokenizer=None)
        for name, fn in W.methods.items():
            if name != "fit":
                setattr(t, name, types.MethodType(fn, t))
        W.methods["fit"](t, args, 0, KTO_STEPS)
        return logged

    _SHUFFLE["seed"] = seed
    logs = F.run_ranks(rank_fn, WORLD)[0]
    return KTORun(logs, items, rows_of, versions, lr_after[0], seed)


def kto_terms(run: KTORun, r: int, s: int, u: int, k: int, label: int) -> tuple[float, float]:
    """The release's KTOLoss on matched item k of micro-batch (r, s, u) alone, with the micro-batch's KL estimate:
    KTOLoss run on the simulated ranks, each with the KL half of its own micro-batch u of step s (the estimate is
    all-reduced inside KTOLoss): (item k's loss, its reward)."""
    import torch
    W = wheel_kto()
    if ("terms", k) in run.logps:
        return run.logps[("terms", k)]
    p, q = torch.tensor([kto_logp(run, k, s, False)]), torch.tensor([kto_logp(run, k, s, True)])
    empty = torch.tensor([])

    def rank_fn(rr: int):
        lst = run.items[(rr, s, u)]
        kl_items = [kk for kk, _ in lst[len(lst) // 2:]]
        pk = torch.tensor([kto_logp(run, kk, s, False) for kk in kl_items])
        rk = torch.tensor([kto_logp(run, kk, s, True) for kk in kl_items])
        fn = W.loss.KTOLoss(KTO_BETA, 1.0, 1.0, WORLD, "cpu")
        if label:
            loss, chosen, _, _ = fn(p, empty, pk, q, empty, rk)
            return float(loss), float(chosen[0])
        loss, _, rejected, _ = fn(empty, p, pk, empty, q, rk)
        return float(loss), float(rejected[0])
    run.logps[("terms", k)] = F.run_ranks(rank_fn, WORLD)[0]
    return run.logps[("terms", k)]


def kto_logp(run: KTORun, k: int, version: int, ref: bool) -> float:
    """The release's _get_batch_logps of item k alone (the sum over its response tokens) under the model (cached on
    the run)."""
    key = (k, -2 if ref else version, ref)
    if key not in run.logps:
        run.logps[key] = _kto_logp_now(run, k, version, ref)
    return run.logps[key]


def _kto_logp_now(run: KTORun, k: int, version: int, ref: bool) -> float:
    import torch
    W = wheel_kto()
    ids, mask = (torch.tensor([x]) for x in run.rows_of[k])
    model = KTOModel(-2, 0.5, run.seed) if ref else KTOModel(version, 2.0, run.seed)
    t = ns()
    return float(W.methods["_get_batch_logps"](t, model(ids, attention_mask=mask)["logits"], ids, attention_mask=mask,
                                               average_log_prob=False, prompt_id_lens=[KTO_PROMPT])[0])


_NOT_LISTED = ("its releases (v0.0.1 - v0.5.5.post2) are not in tests/releases.txt: the proofs of this module run "
               "0.9.5 and the 0.10 line only")
ENTRY_WHY: dict[tuple[str, str, str | None], str] = {
    ("openrlhf", "kto_loss", "kto"): (
        "the --aux_loss_coef > 0 entry (v0.1.9 - v0.9.5): the logged value adds aux_loss_coef x the MoE router's "
        "load-balancing loss (output.aux_loss of a Mixtral-style model), which the stand-in model of "
        "test_proof_openrlhf_old2.py::test_openrlhf_095_kto_fit has no router for; the plain entry is fingerprinted "
        "at 0.9.5"),
    ("openrlhf", "eval_loss", "kto"): (
        "KTOTrainer.evaluate (v0.1.9 - v0.9.5) is not run by the 0.9.5 proof, which runs fit without an eval "
        "loader"),
    ("openrlhf", "eval_loss", "dpo"): (
        "v0.0.1 - v0.11.1: DPOTrainer.evaluate is not run at an older release (test_proof_openrlhf_old2.py runs the "
        "PPO actor and critic, KTO's and SFT's fit loops)"),
    ("openrlhf", "eval_loss", "rm"): (
        "v0.0.1 - v0.11.1: RewardModelTrainer.evaluate is not run at an older release (test_proof_openrlhf_old2.py "
        "runs the PPO actor and critic, KTO's and SFT's fit loops)"),
    **{("openrlhf", key, trainer): _NOT_LISTED for key, trainer in (
        ("loss_mean", "dpo"), ("acc_mean", "dpo"), ("train_loss", "dpo"), ("preference_loss", "dpo"),
        ("loss_mean", "rm"), ("acc_mean", "rm"), ("train_loss", "rm"), ("preference_loss", "rm"),
        ("train_loss", "sft"), ("eval loss", "sft"))},
}
