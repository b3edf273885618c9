"""Fingerprint proofs of the OpenRLHF entries that cover only older releases: openrlhf 0.6.4, 0.7.1.post2 and 0.9.7
(issue 33).

Each proof runs in a child process with ``.venv/releases/openrlhf-<version>/`` first on sys.path
(tests/_support/releases.py) and runs that release's own code (tests/_support/proofs_openrlhf_old.py): at 0.6.4 and
0.7.1.post2 the experience maker on a rollout of 16 samples of uneven response lengths (at 0.9.7 the experiences are
built from the release's Actor.forward, the per-sample fields given), the replay buffer, and ``ppo_train`` on 2
simulated ranks (2 optimizer steps x 2 micro-batches of 2 samples, a policy that moves at every optimizer step). Each
reads back the tracker row (rank 0's ``ppo_train`` return) and the progress-bar record (rank 0's last ``set_postfix``),
and asserts through :class:`_support.proven.Proving` that each is the reduction the shipped entry states for the proof's
config, and no other on these batches.
The entries that cannot be proven say why in ``proofs_openrlhf_old.ENTRY_WHY``.
"""
from __future__ import annotations

import functools

import pytest

from _support import fingerprint as FP
from _support.proven import close, proof

torch = pytest.importorskip("torch")
P = pytest.importorskip("_support.proofs_openrlhf_old")

REL = 2e-5
LEVELS = ("micro_batches", "mini_batches", "processes")
RUN = {"train_batch_size": P.WORLD * P.GAS * P.MICRO, "micro_train_batch_size": P.MICRO, "max_epochs": 1,
       "actor_num_nodes": 1, "actor_num_gpus_per_node": P.WORLD, "rollout_batch_size": P.PROMPTS,
       "n_samples_per_prompt": P.GROUP, "ring_attn_size": 1, "ds_tensor_parallel_size": 1, "logging_steps": 1,
       "kl_estimator": "k1", "use_kl_loss": False}


@functools.lru_cache(maxsize=None)
def runs(use_kl_loss: bool = False, estimator: str = "k1") -> tuple:
    args = P.make_args(use_kl_loss=use_kl_loss, estimator=estimator)
    return tuple(P.run_ppo(args, seed) for seed in range(8))


def on_tokens(run, i: int, v: float) -> list[float]:
    """A per-sample value on each of the sample's response tokens (per_seq reads the first; tokens weigh it)."""
    return [v] * run.rollout.resp_len[i]


def tracker(rs, key: str, per_seq) -> list:
    """[(the tracker row's value, batch), ...]; ``per_seq(run, sample, record, row)``: a sequence's values."""
    return [(run.status[key], P.steps_of(run, lambda i, rec, b, run=run: per_seq(run, i, rec, b))) for run in rs]


def bar(rs, key: str, per_seq) -> list:
    return [(run.postfix[key], P.steps_of(run, lambda i, rec, b, run=run: per_seq(run, i, rec, b))) for run in rs]


def info(field: str):
    return lambda run, i, rec, b: on_tokens(run, i, run.rollout.info[i][field])


def readings(run) -> list:
    """rank 0's LR readings, one per micro-batch: ``[[step0 micro0, step0 micro1], [step1 ...]]``."""
    lrs = run.lrs[0]
    return [lrs[s * P.GAS:(s + 1) * P.GAS] for s in range(len(lrs) // P.GAS)]


@proof("openrlhf", trainer="ppo", release=P.RELEASE, config=RUN)
def test_openrlhf_071_ppo_actor(p):
    """The actor's tracker row and progress bar at 0.7.1.post2, without --use_kl_loss: policy_loss / pg (PolicyLoss's
    token mean per micro-batch, averaged unweighted over the ranks, then over the micro-batches), reward / rm,
    return / ret (the sum of compute_reward's per-token rewards), response_length / glen, total_length / tlen (per
    sample, the ranks' micro-batches of equal size), actor_lr / act_lr (read after every micro-batch). The
    reward-side kl is checked to be NOT the token mean: make_experience divides each sample's KL sum by the padded
    width (masked_mean(kl, None, dim=-1)), a deviation the entry states."""
    rs = runs()
    p.check(all(len(run.batches[r]) == 2 * P.GAS for run in rs for r in range(P.WORLD)), "4 micro-batches a rank")
    p.check(all(len({rec[0] for rec in run.batches[0]}) == 2 for run in rs), "the policy moves between steps")

    def loss(run, i, rec, b):
        return P.policy_loss_tokens(run, i, rec, b)
    found = p.assert_stated("policy_loss", tracker(rs, "policy_loss", loss), rel=REL, levels=LEVELS)
    p.check(found.tokens == "token_mean" and found.micro_batches == "mean", found)
    found = p.assert_stated("pg", bar(rs, "pg", loss), rel=REL, levels=LEVELS)
    p.check(found.micro_batches == "last" and found.processes == "all_reduce_mean", found)
    for tracker_key, bar_key in (("reward", "rm"), ("response_length", "glen"), ("total_length", "tlen")):
        p.assert_stated(tracker_key, tracker(rs, tracker_key, info(tracker_key)), rel=REL, levels=LEVELS,
                        tokens=("per_seq", "token_mean"))
        p.assert_stated(bar_key, bar(rs, bar_key, info(tracker_key)), rel=REL, levels=LEVELS,
                        tokens=("per_seq", "token_mean"))

    def ret(run, i, rec, b):
        return run.rollout.returns[i]
    p.check(all(close(sum(run.rollout.returns[i]), run.rollout.info[i]["return"], 1e-5)
                for run in rs for i in range(P.N)), "compute_reward's per-token rewards sum to info['return']")
    p.assert_stated("return", tracker(rs, "return", ret), rel=REL, levels=LEVELS)
    p.assert_stated("ret", bar(rs, "ret", ret), rel=REL, levels=LEVELS)

    # actor_lr: the LR read after every micro-batch, averaged with the rest (the same on every rank: one rank's)
    p.assert_stated("actor_lr", [(run.status["actor_lr"], [[[[[[v]] for v in micro]] for micro in readings(run)]])
                                 for run in rs], tokens=("none",), levels=())
    # act_lr: the reading after the step's last micro-batch; each reading its own item of the step, in order
    p.assert_stated("act_lr", [(run.postfix["act_lr"], [[[[[[v]]]] for step in readings(run) for v in step]])
                               for run in rs], tokens=("none",), levels=())

    # the reward-side kl (kl/old_ref/k1): not the token mean of the maker's per-token KL, nor any other candidate
    def kl(run, i, rec, b):
        return run.rollout.kl_tokens[i]
    obs = tracker(rs, "kl", kl)
    token_mean = FP.Reduction("token_mean", "mean", "mean", "mean", "all_reduce_weighted", "step", None)
    p.check(all(not close(v, FP.value_of(steps, token_mean), 1e-3) for v, steps in obs),
            "the rollout kl is not the token mean")
    with pytest.raises(AssertionError, match="no candidate"):
        FP.fingerprint(obs, rel=REL)
    p.check(True, "no candidate reduction gives the rollout kl")


def kl_loss_proof(p, estimator: str) -> None:
    rs = runs(True, estimator)
    p.check(all(run.rollout.info[i]["kl"] == 0.0 for run in rs for i in range(P.N)),
            "no reward-side KL with the KL loss")
    obs = tracker(rs, "kl", lambda run, i, rec, b: P.kl_loss_tokens(run, i, rec, b, estimator))
    found = p.assert_stated("kl", obs, rel=REL, levels=LEVELS)
    p.check(found.tokens == "seq_mean_token_mean" and found.processes == "token_weighted", found)
    p.assert_stated("policy_loss", tracker(rs, "policy_loss", P.policy_loss_tokens), rel=REL, levels=LEVELS)


@proof("openrlhf", trainer="ppo", release=P.RELEASE, config={**RUN, "use_kl_loss": True})
def test_openrlhf_071_ppo_kl_loss_k1(p):
    """With --use_kl_loss at 0.7.1.post2: training_step logs kl_loss = masked_mean(kl, action_mask, dim=-1).mean() of
    the policy being updated vs the reference, ppo_train weights the ranks by their mean response length around
    strategy.all_reduce, then averages the micro-batches unweighted; policy_loss keeps its reduction."""
    kl_loss_proof(p, "k1")


@proof("openrlhf", trainer="ppo", release=P.RELEASE, config={**RUN, "use_kl_loss": True, "kl_estimator": "k2"})
def test_openrlhf_071_ppo_kl_loss_k2(p):
    """As the k1 proof, with --kl_estimator k2."""
    kl_loss_proof(p, "k2")


@proof("openrlhf", trainer="ppo", release=P.RELEASE, config={**RUN, "use_kl_loss": True, "kl_estimator": "k3"})
def test_openrlhf_071_ppo_kl_loss_k3(p):
    """As the k1 proof, with --kl_estimator k3."""
    kl_loss_proof(p, "k3")


# ============================================================================================= openrlhf 0.9.7
RUN_97 = {**RUN, "entropy_loss_coef": 0.0, "policy_loss_type": "ppo"}


@functools.lru_cache(maxsize=None)
def runs97(use_kl_loss: bool = False, estimator: str = "k1") -> tuple:
    args = P.args97(use_kl_loss=use_kl_loss, estimator=estimator)
    return tuple(P.run_ppo97(args, seed) for seed in range(8))


def obs97(rs, key: str, per_seq, *, console: bool = False) -> list:
    return [((run.postfix if console else run.status)[key],
             P.steps97(run, lambda i, rec, b, run=run: per_seq(run, i, rec, b))) for run in rs]


def info97(field: str):
    return lambda run, i, rec, b: [run.info[i][field]] * run.resp_len[i]


def per_micro(vals: list) -> list:
    """rank 0's readings, one per micro-batch, as scalar micro-batches of their optimizer steps."""
    return [[[[[[v]] for v in vals[s * P.GAS:(s + 1) * P.GAS]]] for s in range(len(vals) // P.GAS)]]


def last_of(vals: list) -> list:
    """rank 0's readings, each its own item of the step, in order (a console record: the last)."""
    return [[[[[[v]]]] for v in vals]]


@proof("openrlhf", trainer="ppo", release=P.RELEASE_97, config=RUN_97)
def test_openrlhf_097_ppo_actor(p):
    """The actor's tracker row and progress bar at 0.9.7 (--entropy_loss_coef 0, so the entropy is logged):
    policy_loss, entropy_loss, ppo_clip_ratio, ppo_kl (each micro-batch's token mean on its rank, averaged
    unweighted over the ranks by strategy.all_reduce, then over the micro-batches); act_loss and ent_loss (the last
    micro-batch's, averaged unweighted over the ranks); the per-sample fields reward, response_length, total_length
    and their bar records gen_len, tot_len; actor_lr, actor_grad_norm (read after every micro-batch), act_lr."""
    rs = runs97()
    p.check(all(len(run.batches[r]) == 2 * P.GAS for run in rs for r in range(P.WORLD)), "4 micro-batches a rank")
    p.check(all(len({rec[0] for rec in run.batches[0]}) == 2 for run in rs), "the policy moves between steps")

    def part(k):
        return lambda run, i, rec, b: P.loss97_tokens(run, i, rec, b, k)

    def entropy(run, i, rec, b):
        return P.entropy97_tokens(rec, b)
    for key, per_seq in (("policy_loss", part(0)), ("entropy_loss", entropy), ("ppo_kl", part(2))):
        found = p.assert_stated(key, obs97(rs, key, per_seq), rel=REL, levels=LEVELS)
        p.check(found.tokens == "token_mean" and found.processes == "all_reduce_mean", f"{key}: {found}")
    found = p.assert_stated("ppo_clip_ratio", obs97(rs, "ppo_clip_ratio", part(1)), rel=REL, levels=LEVELS)
    p.check(found.processes == "all_reduce_mean", found)
    for key, per_seq in (("act_loss", part(0)), ("ent_loss", entropy)):
        found = p.assert_stated(key, obs97(rs, key, per_seq, console=True), rel=REL, levels=LEVELS)
        p.check(found.micro_batches == "last" and found.processes == "all_reduce_mean", f"{key}: {found}")
    for key, bar_key in (("reward", None), ("response_length", "gen_len"), ("total_length", "tot_len"),
                         ("score", None), ("group_reward_std", None)):
        p.assert_stated(key, obs97(rs, key, info97(key)), rel=REL, levels=LEVELS, tokens=("per_seq", "token_mean"))
        if bar_key:
            p.assert_stated(bar_key, obs97(rs, bar_key, info97(key), console=True), rel=REL, levels=LEVELS,
                            tokens=("per_seq", "token_mean"))
    for key in ("truncated", "response_clip_ratio"):           # 0/1 per sample: the fraction of the samples
        p.assert_stated(key, obs97(rs, key, info97(key)), rel=REL, levels=LEVELS, tokens=("per_seq", "token_mean"))
    p.check(all(len(run.lrs[0]) == len(run.norms[0]) == 2 * P.GAS for run in rs), "one reading per micro-batch")
    p.assert_stated("actor_lr", [(run.status["actor_lr"], per_micro(run.lrs[0])) for run in rs], tokens=("none",),
                    levels=())
    p.assert_stated("actor_grad_norm", [(run.status["actor_grad_norm"], per_micro(run.norms[0])) for run in rs],
                    tokens=("none",), levels=())
    p.assert_stated("act_lr", [(run.postfix["act_lr"], last_of(run.lrs[0])) for run in rs], tokens=("none",),
                    levels=())


def kl_loss_proof97(p, estimator: str) -> None:
    rs = runs97(True, estimator)
    obs = obs97(rs, "kl", lambda run, i, rec, b: P.kl97_tokens(run, i, rec, b, estimator))
    found = p.assert_stated("kl", obs, rel=REL, levels=LEVELS)
    p.check(found.tokens == "token_mean" and found.micro_batches == "mean", found)
    if estimator == "k1":
        diff = obs97(rs, "logprobs_diff", lambda run, i, rec, b: P.kl97_tokens(run, i, rec, b, "k1"))
        p.assert_stated("logprobs_diff", diff, rel=REL, levels=LEVELS)


@proof("openrlhf", trainer="ppo", release=P.RELEASE_97, config={**RUN_97, "use_kl_loss": True})
def test_openrlhf_097_ppo_kl_loss_k1(p):
    """With --use_kl_loss at 0.9.7: training_step logs masked_mean(kl, action_mask) (the micro-batch's token mean) of
    the policy being updated vs the reference and logprobs_diff (the same of log pi - log pi_ref); ppo_train weights
    the ranks by their mean response length around strategy.all_reduce, then averages the micro-batches."""
    kl_loss_proof97(p, "k1")


@proof("openrlhf", trainer="ppo", release=P.RELEASE_97, config={**RUN_97, "use_kl_loss": True, "kl_estimator": "k3"})
def test_openrlhf_097_ppo_kl_loss_k3(p):
    """As the k1 proof, with --kl_estimator k3."""
    kl_loss_proof97(p, "k3")


# ============================================================================================= openrlhf 0.6.4
@functools.lru_cache(maxsize=None)
def runs64(estimator: str = "k1") -> tuple:
    return tuple(P.run_ppo64(seed, estimator) for seed in range(8))


def obs64(rs, key: str, per_seq, *, console: bool = False) -> list:
    return [((run.postfix if console else run.status)[key],
             P.steps64(run, lambda i, rec, b, run=run: per_seq(run, i, rec, b))) for run in rs]


@proof("openrlhf", trainer="ppo", release=P.RELEASE_64, config=RUN)
def test_openrlhf_064_ppo_actor(p):
    """The actor's tracker row and progress bar at 0.6.4, from the release's make_experience on: the reward-side kl
    (compute_approx_kl with the action mask, masked_mean(kl, action_mask, dim=-1) per sample, length-weighted within
    the micro-batch, the ranks weighted by their mean response length: the token mean pooled over the ranks, then
    the plain mean over micro-batches); policy_loss / pg (PolicyLoss's mean of per-sequence token means);
    reward / rm, response_length / glen, total_length / tlen."""
    rs = runs64()
    p.check(all(len(run.batches[r]) == 2 * P.GAS for run in rs for r in range(P.WORLD)), "4 micro-batches a rank")
    p.check(all(len({rec[0] for rec in run.batches[0]}) == 2 for run in rs), "the policy moves between steps")
    found = p.assert_stated("kl", obs64(rs, "kl", lambda run, i, rec, b: run.kl_tokens[i]), rel=REL, levels=LEVELS)
    p.check(found.tokens == "token_mean" and found.processes in ("all_reduce_weighted", "token_weighted"), found)
    p.check(all(len(run.kl_tokens[i]) == run.info[i]["response_length"] for run in rs for i in range(P.N)),
            "the KL is masked to the response")
    found = p.assert_stated("policy_loss", obs64(rs, "policy_loss", P.loss64_tokens), rel=REL, levels=LEVELS)
    p.check(found.tokens == "seq_mean_token_mean", found)
    found = p.assert_stated("pg", obs64(rs, "pg", P.loss64_tokens, console=True), rel=REL, levels=LEVELS)
    p.check(found.micro_batches == "last", found)
    for key, bar_key in (("reward", "rm"), ("response_length", "glen"), ("total_length", "tlen")):
        def value(run, i, rec, b, key=key):
            return [run.info[i][key]] * int(run.info[i]["response_length"])
        p.assert_stated(key, obs64(rs, key, value), rel=REL, levels=LEVELS, tokens=("per_seq", "token_mean"))
        p.assert_stated(bar_key, obs64(rs, bar_key, value, console=True), rel=REL, levels=LEVELS,
                        tokens=("per_seq", "token_mean"))


def rollout_kl_proof64(p, estimator: str) -> None:
    rs = runs64(estimator)
    found = p.assert_stated("kl", obs64(rs, "kl", lambda run, i, rec, b: run.kl_tokens[i]), rel=REL, levels=LEVELS)
    p.check(found.tokens == "token_mean", found)


@proof("openrlhf", trainer="ppo", release=P.RELEASE_64, config={**RUN, "kl_estimator": "k2"})
def test_openrlhf_064_rollout_kl_k2(p):
    """The reward-side kl at 0.6.4 with --kl_estimator k2: the k1 proof's reduction of the k2 per-token values."""
    rollout_kl_proof64(p, "k2")


@proof("openrlhf", trainer="ppo", release=P.RELEASE_64, config={**RUN, "kl_estimator": "k3"})
def test_openrlhf_064_rollout_kl_k3(p):
    """As the k2 proof, with --kl_estimator k3."""
    rollout_kl_proof64(p, "k3")


@proof("openrlhf", trainer="ppo", release=P.RELEASE_97, config={**RUN_97, "use_kl_loss": True, "kl_estimator": "k2"})
def test_openrlhf_097_ppo_kl_loss_k2(p):
    """As the k1 proof, with --kl_estimator k2."""
    kl_loss_proof97(p, "k2")
