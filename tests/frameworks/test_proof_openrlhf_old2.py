"""Fingerprint proofs of the OpenRLHF entries that cover only the 0.10 line: openrlhf 0.10.1.post2, 0.10.2 and 0.10.3
(issue 33).

Each proof runs in a child process with ``.venv/releases/openrlhf-<version>/`` first on sys.path
(tests/_support/releases.py) and runs that release's own code (tests/_support/proofs_openrlhf_old2.py): experiences
of 16 samples of uneven response lengths (the old policy's and the reference's log-probs from the release's
Actor.forward), the replay buffer, and ``ppo_train`` on 2 simulated ranks (2 optimizer steps x 2 micro-batches of 2
samples, a policy that moves at every optimizer step). Each reads back the tracker row (rank 0's ``ppo_train``
return) and the progress-bar record (rank 0's last ``set_postfix``), and asserts through
:class:`_support.proven.Proving` that each is the reduction the shipped entry states for the proof's config, and no
other on these batches. At 0.10.1.post2 the reward-side KL comes from the release's experience maker; the critic's
``ppo_train`` runs at each of the three releases. Beyond PPO: openrlhf 0.9.5's ``KTOTrainer.fit`` (2 ranks x 6
optimizer steps x 2 micro-batches of uneven sizes, a row every 2 steps) and the 0.10.2 / 0.10.3 ``SFTTrainer.fit``
(the same shape), each row fingerprinted against its window's batches. The entries that cannot be proven say why in
``proofs_openrlhf_old2.ENTRY_WHY``.
"""
from __future__ import annotations

import functools

import pytest

from _support.proven import proof

torch = pytest.importorskip("torch")
P = pytest.importorskip("_support.proofs_openrlhf_old2")

REL = 2e-5
LEVELS = ("micro_batches", "mini_batches", "processes")
SEEDS = range(6)
# the run config (proofs_openrlhf_old2.make_args): flat at 0.10.1.post2, grouped from 0.10.2 on
RUN_FLAT = {"train_batch_size": P.WORLD * P.GAS * P.MICRO, "micro_train_batch_size": P.MICRO, "max_epochs": 1,
            "actor_num_nodes": 1, "actor_num_gpus_per_node": P.WORLD, "rollout_batch_size": P.N // P.GROUP,
            "n_samples_per_prompt": P.GROUP, "ring_attn_size": 1, "ds_tensor_parallel_size": 1, "logging_steps": 1,
            "kl_estimator": "k1", "use_kl_loss": False, "entropy_loss_coef": 0.0, "policy_loss_type": "ppo"}
RUN_NESTED = {"train.batch_size": P.WORLD * P.GAS * P.MICRO, "train.micro_batch_size": P.MICRO, "train.max_epochs": 1,
              "actor.num_nodes": 1, "actor.num_gpus_per_node": P.WORLD, "rollout.batch_size": P.N // P.GROUP,
              "rollout.n_samples_per_prompt": P.GROUP, "ds.ring_attn_size": 1, "ds.tensor_parallel_size": 1,
              "logger.logging_steps": 1, "algo.kl.estimator": "k1", "algo.kl.use_loss": False,
              "actor.entropy_coef": 0.0, "actor.policy_loss_type": "ppo"}


def run_config(release: str, *, use_kl_loss: bool = False, estimator: str = "k1", loss_type: str = "ppo") -> dict:
    if release == "0.10.1.post2":
        return {**RUN_FLAT, "use_kl_loss": use_kl_loss, "kl_estimator": estimator, "policy_loss_type": loss_type}
    return {**RUN_NESTED, "algo.kl.use_loss": use_kl_loss, "algo.kl.estimator": estimator,
            "actor.policy_loss_type": loss_type}


@functools.lru_cache(maxsize=None)
def runs(use_kl_loss: bool = False, estimator: str = "k1", loss_type: str = "ppo", use_maker: bool = False) -> tuple:
    args = P.make_args(P.wheel10().release, use_kl_loss=use_kl_loss, estimator=estimator, policy_loss_type=loss_type)
    return tuple(P.run_ppo10(args, seed, use_maker=use_maker) for seed in SEEDS)


def obs(rs, key: str, per_seq, *, console: bool = False) -> list:
    return [((run.postfix if console else run.status)[key],
             P.steps10(run, lambda i, rec, b, run=run: per_seq(run, i, rec, b))) for run in rs]


def part(k: int):
    return lambda run, i, rec, b: P.loss_tokens(run, i, rec, b, k)


def entropy(run, i, rec, b):
    return P.entropy_tokens(rec, b)


def check_shape(p, rs) -> None:
    p.check(all(len(run.batches[r]) == 2 * P.GAS for run in rs for r in range(P.WORLD)), "4 micro-batches a rank")
    p.check(all(len({rec[0] for rec in run.batches[0]}) == 2 for run in rs), "the policy moves between steps")


def dp_norm(release: str) -> bool:
    return release == "0.10.3"


def actor_proof(p, release: str) -> None:
    """policy_loss and entropy_loss: each micro-batch's value on its rank (a token mean; at 0.10.3 its token sum over
    the micro-batch's tokens per rank, aggregate_loss with get_loss_batch_info), merged by tokens over the ranks by
    strategy.all_reduce and over the micro-batches and optimizer steps by ppo_train; act_loss / ent_loss the last
    micro-batch's, merged over the ranks alike."""
    assert P.wheel10().release == release
    rs = runs()
    check_shape(p, rs)
    want = "token_sum_dp_norm" if dp_norm(release) else "token_mean"
    for key, per_seq in (("policy_loss", part(0)), ("entropy_loss", entropy)):
        found = p.assert_stated(key, obs(rs, key, per_seq), rel=REL, levels=LEVELS)
        p.check(found.tokens == want and found.micro_batches in ("token_weighted", "none"), f"{key}: {found}")
    for key, per_seq in (("act_loss", part(0)), ("ent_loss", entropy)):
        found = p.assert_stated(key, obs(rs, key, per_seq, console=True), rel=REL, levels=LEVELS)
        p.check(found.micro_batches == "last" and found.tokens == want, f"{key}: {found}")


def kl_loss_proof(p, release: str, estimator: str) -> None:
    """With the KL loss: training_step logs the KL of the policy being updated vs the reference (masked_mean; at
    0.10.3 aggregate_loss), merged by tokens like the losses; logprobs_diff (masked_mean of log pi - log pi_ref)."""
    assert P.wheel10().release == release
    rs = runs(True, estimator)
    check_shape(p, rs)
    found = p.assert_stated("kl", obs(rs, "kl", lambda run, i, rec, b: P.kl_tokens(run, i, rec, b, estimator)),
                            rel=REL, levels=LEVELS)
    p.check(found.tokens == ("token_sum_dp_norm" if dp_norm(release) else "token_mean"), found)
    if estimator == "k1" and release == "0.10.1.post2":
        diff = obs(rs, "logprobs_diff", lambda run, i, rec, b: P.kl_tokens(run, i, rec, b, "k1"))
        found = p.assert_stated("logprobs_diff", diff, rel=REL, levels=LEVELS)
        p.check(found.tokens == "token_mean", found)


def gspo_proof(p, release: str) -> None:
    """--policy_loss_type gspo: PolicyLoss's loss is the mean of per-sequence token means of the micro-batch (the
    sequence-level ratio), merged by tokens over the ranks, the micro-batches and the optimizer steps; act_loss the
    last micro-batch's. The per-sequence value is the release's PolicyLoss on that sequence alone."""
    assert P.wheel10().release == release
    rs = runs(loss_type="gspo")
    check_shape(p, rs)
    toks = ("seq_mean_token_mean", "token_mean", "seq_mean_token_sum", "token_sum_dp_norm")
    found = p.assert_stated("policy_loss", obs(rs, "policy_loss", part(0)), rel=REL, levels=LEVELS, tokens=toks)
    p.check(found.tokens == "seq_mean_token_mean" and found.processes == "token_weighted", found)
    found = p.assert_stated("act_loss", obs(rs, "act_loss", part(0), console=True), rel=REL, levels=LEVELS,
                            tokens=toks)
    p.check(found.micro_batches == "last", found)


# ============================================================================================= 0.10.1.post2
@proof("openrlhf", trainer="ppo", release="0.10.1.post2", config=run_config("0.10.1.post2"))
def test_openrlhf_0101_ppo_actor(p):
    actor_proof(p, "0.10.1.post2")


@proof("openrlhf", trainer="ppo", release="0.10.1.post2", config=run_config("0.10.1.post2", use_kl_loss=True))
def test_openrlhf_0101_ppo_kl_loss_k1(p):
    kl_loss_proof(p, "0.10.1.post2", "k1")


@proof("openrlhf", trainer="ppo", release="0.10.1.post2",
       config=run_config("0.10.1.post2", use_kl_loss=True, estimator="k2"))
def test_openrlhf_0101_ppo_kl_loss_k2(p):
    kl_loss_proof(p, "0.10.1.post2", "k2")


@proof("openrlhf", trainer="ppo", release="0.10.1.post2",
       config=run_config("0.10.1.post2", use_kl_loss=True, estimator="k3"))
def test_openrlhf_0101_ppo_kl_loss_k3(p):
    kl_loss_proof(p, "0.10.1.post2", "k3")


@proof("openrlhf", trainer="ppo", release="0.10.1.post2", config=run_config("0.10.1.post2", loss_type="gspo"))
def test_openrlhf_0101_ppo_gspo(p):
    gspo_proof(p, "0.10.1.post2")


def rollout_kl_proof(p, estimator: str) -> None:
    """Without the KL loss at 0.10.1.post2: the release's make_experience computes the reward-side KL of the old
    policy vs the reference and logs its per-sample token mean (masked_mean(kl, action_mask, dim=-1)) as info kl, and
    logprobs_diff likewise (k1); training_step weighs these per-sample fields by samples, ppo_train merges them by
    samples over the ranks, the micro-batches and the optimizer steps."""
    assert P.wheel10().release == "0.10.1.post2"
    rs = runs(estimator=estimator, use_maker=True)
    check_shape(p, rs)
    found = p.assert_stated("kl", obs(rs, "kl", lambda run, i, rec, b: run.rollout_kl[i]), rel=REL, levels=LEVELS)
    p.check(found.tokens == "seq_mean_token_mean", found)      # micro-batches of equal sizes: by samples = mean

    def diff(run, i, rec, b):
        return P.kl_tokens(run, i, (None, None, torch.tensor([run.old_lp[i]]), torch.ones(1, len(run.old_lp[i]))),
                           0, "k1")
    found = p.assert_stated("logprobs_diff", obs(rs, "logprobs_diff", diff), rel=REL, levels=LEVELS)
    p.check(found.tokens == "seq_mean_token_mean", found)


@proof("openrlhf", trainer="ppo", release="0.10.1.post2", config=run_config("0.10.1.post2"))
def test_openrlhf_0101_ppo_rollout_kl_k1(p):
    rollout_kl_proof(p, "k1")


@proof("openrlhf", trainer="ppo", release="0.10.1.post2", config=run_config("0.10.1.post2", estimator="k2"))
def test_openrlhf_0101_ppo_rollout_kl_k2(p):
    rollout_kl_proof(p, "k2")


@proof("openrlhf", trainer="ppo", release="0.10.1.post2", config=run_config("0.10.1.post2", estimator="k3"))
def test_openrlhf_0101_ppo_rollout_kl_k3(p):
    rollout_kl_proof(p, "k3")


# ============================================================================================= 0.10.2
@proof("openrlhf", trainer="ppo", release="0.10.2", config=run_config("0.10.2"))
def test_openrlhf_0102_ppo_actor(p):
    actor_proof(p, "0.10.2")


@proof("openrlhf", trainer="ppo", release="0.10.2", config=run_config("0.10.2", use_kl_loss=True))
def test_openrlhf_0102_ppo_kl_loss_k1(p):
    kl_loss_proof(p, "0.10.2", "k1")


@proof("openrlhf", trainer="ppo", release="0.10.2", config=run_config("0.10.2", use_kl_loss=True, estimator="k2"))
def test_openrlhf_0102_ppo_kl_loss_k2(p):
    kl_loss_proof(p, "0.10.2", "k2")


@proof("openrlhf", trainer="ppo", release="0.10.2", config=run_config("0.10.2", use_kl_loss=True, estimator="k3"))
def test_openrlhf_0102_ppo_kl_loss_k3(p):
    kl_loss_proof(p, "0.10.2", "k3")


@proof("openrlhf", trainer="ppo", release="0.10.2", config=run_config("0.10.2", loss_type="gspo"))
def test_openrlhf_0102_ppo_gspo(p):
    gspo_proof(p, "0.10.2")


# ============================================================================================= 0.10.3
@proof("openrlhf", trainer="ppo", release="0.10.3", config=run_config("0.10.3"))
def test_openrlhf_0103_ppo_actor(p):
    actor_proof(p, "0.10.3")


@proof("openrlhf", trainer="ppo", release="0.10.3", config=run_config("0.10.3", use_kl_loss=True))
def test_openrlhf_0103_ppo_kl_loss_k1(p):
    kl_loss_proof(p, "0.10.3", "k1")


@proof("openrlhf", trainer="ppo", release="0.10.3", config=run_config("0.10.3", use_kl_loss=True, estimator="k2"))
def test_openrlhf_0103_ppo_kl_loss_k2(p):
    kl_loss_proof(p, "0.10.3", "k2")


@proof("openrlhf", trainer="ppo", release="0.10.3", config=run_config("0.10.3", use_kl_loss=True, estimator="k3"))
def test_openrlhf_0103_ppo_kl_loss_k3(p):
    kl_loss_proof(p, "0.10.3", "k3")


@proof("openrlhf", trainer="ppo", release="0.10.3", config=run_config("0.10.3", loss_type="gspo"))
def test_openrlhf_0103_ppo_gspo(p):
    gspo_proof(p, "0.10.3")


# ============================================================================================= the critic
CRITIC_FLAT = {"train_batch_size": P.WORLD * P.GAS * P.MICRO, "micro_train_batch_size": P.MICRO, "max_epochs": 1,
               "critic_num_nodes": 1, "critic_num_gpus_per_node": P.WORLD, "rollout_batch_size": P.N // P.GROUP,
               "n_samples_per_prompt": P.GROUP, "ring_attn_size": 1, "ds_tensor_parallel_size": 1}
CRITIC_NESTED = {"train.batch_size": P.WORLD * P.GAS * P.MICRO, "train.micro_batch_size": P.MICRO,
                 "train.max_epochs": 1, "critic.num_nodes": 1, "critic.num_gpus_per_node": P.WORLD,
                 "rollout.batch_size": P.N // P.GROUP, "rollout.n_samples_per_prompt": P.GROUP,
                 "ds.ring_attn_size": 1, "ds.tensor_parallel_size": 1}


@functools.lru_cache(maxsize=None)
def critic_runs() -> tuple:
    return tuple(P.run_critic10(seed) for seed in SEEDS)


def critic_obs(rs, key: str, per_seq) -> list:
    return [(run.status[key], P.steps10(run, lambda i, rec, b, run=run: per_seq(run, i, rec, b))) for run in rs]


def per_micro(vals: list) -> list:
    """rank 0's readings, one per micro-batch, as scalar micro-batches of their optimizer steps."""
    return [[[[[[v]] for v in vals[s * P.GAS:(s + 1) * P.GAS]]] for s in range(len(vals) // P.GAS)]]


def critic_proof(p, release: str, scalars: bool) -> None:
    """CriticPPOTrainer.ppo_train: each micro-batch's status all-reduced (a plain mean over the ranks) and the status
    list averaged: critic_loss (ValueLoss's token mean; at 0.10.3 aggregate_loss over the micro-batch's tokens per
    rank) and values (masked_mean of the critic's values), critic_lr / critic_grad_norm (read after every micro-batch)
    the mean over the micro-batches."""
    assert P.wheel10().release == release
    rs = critic_runs()
    p.check(all(len(run.batches[r]) == 2 * P.GAS for run in rs for r in range(P.WORLD)), "4 micro-batches a rank")
    p.check(all(len({rec[0] for rec in run.batches[0]}) == 2 for run in rs), "the critic moves between steps")
    found = p.assert_stated("critic_loss", critic_obs(rs, "critic_loss", P.value_loss_tokens), rel=REL, levels=LEVELS)
    # at 0.10.3 the mean over the ranks of each rank's token sum over the micro-batch's tokens per rank is the
    # micro-batch's token mean over every rank: the fingerprint may name either (assert_stated checked they agree)
    p.check(found.tokens in (("token_sum_dp_norm", "token_mean") if dp_norm(release) else ("token_mean",)), found)
    if scalars:
        found = p.assert_stated("values", critic_obs(rs, "values", lambda run, i, rec, b: P.critic_values(rec, b)),
                                rel=REL, levels=LEVELS)
        p.check(found.tokens == "token_mean" and found.processes == "all_reduce_mean", found)
        p.check(all(len(run.lrs[0]) == len(run.norms[0]) == 2 * P.GAS for run in rs), "one reading per micro-batch")
        for key, vals in (("critic_lr", "lrs"), ("critic_grad_norm", "norms")):
            p.assert_stated(key, [(run.status[key], per_micro(getattr(run, vals)[0])) for run in rs],
                            tokens=("none",), levels=())


@proof("openrlhf", trainer="ppo", release="0.10.1.post2", config=CRITIC_FLAT)
def test_openrlhf_0101_ppo_critic(p):
    critic_proof(p, "0.10.1.post2", True)


@proof("openrlhf", trainer="ppo", release="0.10.2", config=CRITIC_NESTED)
def test_openrlhf_0102_ppo_critic(p):
    critic_proof(p, "0.10.2", False)


@proof("openrlhf", trainer="ppo", release="0.10.3", config=CRITIC_NESTED)
def test_openrlhf_0103_ppo_critic(p):
    critic_proof(p, "0.10.3", False)


# ============================================================================================= KTO at 0.9.5
KTO_RUN = {"train_batch_size": P.KTO_MICRO * P.WORLD * P.GAS, "micro_train_batch_size": P.KTO_MICRO,
           "logging_steps": P.KTO_WINDOW, "aux_loss_coef": 0.0}
KTO_LEVELS = ("micro_batches", "processes", "window")


@functools.lru_cache(maxsize=None)
def kto_runs() -> tuple:
    return tuple(P.run_kto(seed) for seed in range(3))


def kto_obs(rs, key: str, per_item, *, kl_half: bool = False, label: int | None = None) -> list:
    """[(a row's value, its window's batch)]: ``per_item(run, r, s, u, k, label)`` a matched (or, ``kl_half``, a KL)
    item's values; ``label``: only the desirable (1) or undesirable (0) matched items."""
    out = []
    for run in rs:
        for n, row in enumerate(run.rows):
            steps = []
            for s in range(n * P.KTO_WINDOW, (n + 1) * P.KTO_WINDOW):
                ranks = []
                for r in range(P.WORLD):
                    micros = []
                    for u in range(P.GAS):
                        lst = run.items[(r, s, u)]
                        half = len(lst) // 2
                        lst = lst[half:] if kl_half else lst[:half]
                        micros.append([per_item(run, r, s, u, k, lab) for k, lab in lst
                                       if label is None or lab == label])
                    ranks.append(micros)
                steps.append([ranks])
            out.append((row["train/" + key], steps))
    return out


@proof("openrlhf", trainer="kto", release=P.RELEASE_KTO, config=KTO_RUN)
def test_openrlhf_095_kto_fit(p):
    """KTOTrainer.fit at 0.9.5: each micro-batch's kto_loss (KTOLoss's mean over the matched half), chosen_reward /
    reject_reward (the mean over its desirable / undesirable examples) and kl (the KL half's mean log-ratio, all-reduced
    inside KTOLoss) are all-reduced to a plain mean over the ranks; a row every logging_steps optimizer steps holds the
    last micro-batch's; loss_mean is rank 0's mean of the last step's micro-batch losses (added after the all-reduce);
    lr the scheduler's after the window's last optimizer step."""
    rs = kto_runs()
    p.check(all(len(run.rows) == P.KTO_STEPS // P.KTO_WINDOW for run in rs), "a row every logging_steps steps")
    p.check(all(v == [s for s in range(P.KTO_STEPS) for _ in range(P.GAS)] for run in rs for v in run.policy_versions),
            "the policy moves at every optimizer step")
    p.check(all(1 <= sum(lab for _, lab in v[:len(v) // 2]) < len(v) // 2 for run in rs for v in run.items.values()),
            "every matched half holds desirable and undesirable examples")

    def loss(run, r, s, u, k, lab):
        return [P.kto_terms(run, r, s, u, k, lab)[0]]

    def reward(run, r, s, u, k, lab):
        return [P.kto_terms(run, r, s, u, k, lab)[1]]

    def kl(run, r, s, u, k, lab):
        return [P.kto_logp(run, k, s, False) - P.kto_logp(run, k, s, True)]
    found = p.assert_stated("kto_loss", kto_obs(rs, "kto_loss", loss), rel=REL, levels=KTO_LEVELS,
                            tokens=("per_seq",))
    p.check(found.micro_batches == "last" and found.processes == "all_reduce_mean", found)
    for key, label in (("chosen_reward", 1), ("reject_reward", 0)):
        found = p.assert_stated(key, kto_obs(rs, key, reward, label=label), rel=REL, levels=KTO_LEVELS,
                                tokens=("per_seq",))
        p.check(found.micro_batches == "last" and found.processes == "all_reduce_mean", f"{key}: {found}")
    found = p.assert_stated("kl", kto_obs(rs, "kl", kl, kl_half=True), rel=REL, levels=("micro_batches", "window"),
                            tokens=("per_seq",))
    p.check(found.micro_batches == "last", found)
    found = p.assert_stated("loss_mean", kto_obs(rs, "loss_mean", loss), rel=REL, levels=KTO_LEVELS,
                            tokens=("per_seq",))
    p.check(found.processes == "rank0" and found.micro_batches == "mean", found)
    lrs = [(row["train/lr"], [[[[[[lr]]]]] for lr in run.lr_after[n * P.KTO_WINDOW:(n + 1) * P.KTO_WINDOW]])
           for run in rs for n, row in enumerate(run.rows)]
    p.assert_stated("lr", lrs, tokens=("none",), levels=())


# ============================================================================================= SFT at 0.10.2 / 0.10.3
SFT_RUN = {"train.batch_size": P.MICRO * P.WORLD * P.GAS, "train.micro_batch_size": P.MICRO,
           "logger.logging_steps": P.SFT_WINDOW, "model.aux_loss_coef": 0.0}


@functools.lru_cache(maxsize=None)
def sft_runs() -> tuple:
    return tuple(P.run_sft10(seed) for seed in range(3))


def sft_obs(rs, key: str) -> list:
    """[(a row's value, its window's batch)]: each sequence's per-token NLL under the policy of its optimizer step."""
    out = []
    for run in rs:
        for n, row in enumerate(run.rows):
            steps = [[[[[P.sft_nll_tokens(run, P.sft_key(r, s, u, j), s) for j in range(P.MICRO)]
                        for u in range(P.GAS)] for r in range(P.WORLD)]]
                     for s in range(n * P.SFT_WINDOW, (n + 1) * P.SFT_WINDOW)]
            out.append((row["train/" + key], steps))
    return out


def sft_proof(p, release: str) -> None:
    """SFTTrainer.fit: gpt_loss is each micro-batch's SFTLoss (a token mean; at 0.10.3 its token sum over the
    micro-batch's tokens per rank), all-reduced to a mean over the ranks, the row holding the window's last
    micro-batch's; loss_mean rank 0's own mean of the last optimizer step's micro-batch losses (added after the
    all-reduce)."""
    assert P.wheel10().release == release
    rs = sft_runs()
    p.check(all(len(run.rows) == P.SFT_STEPS // P.SFT_WINDOW for run in rs), "a row every logging_steps steps")
    levels = ("micro_batches", "processes", "window")
    found = p.assert_stated("gpt_loss", sft_obs(rs, "gpt_loss"), rel=REL, levels=levels)
    p.check(found.micro_batches == "last", found)
    found = p.assert_stated("loss_mean", sft_obs(rs, "loss_mean"), rel=REL, levels=levels)
    p.check(found.processes == "rank0" and found.micro_batches == "mean", found)


@proof("openrlhf", trainer="sft", release="0.10.2", config=SFT_RUN)
def test_openrlhf_0102_sft_fit(p):
    sft_proof(p, "0.10.2")


@proof("openrlhf", trainer="sft", release="0.10.3", config=SFT_RUN)
def test_openrlhf_0103_sft_fit(p):
    sft_proof(p, "0.10.3")
