"""Fingerprint proofs of OpenRLHF 0.11.2's PPO critic metrics against mappings/openrlhf.yaml (issue 20).

The wheel's CriticPPOTrainer.ppo_train / training_step (tests/_support/proofs_openrlhf.py ``run_critic``) on 2
simulated ranks x 2 micro-batches of 2 sequences per optimizer step, 2 epochs (4 optimizer steps), the real
ValueLoss, iter_grad_accum_global_norm and strategy.all_reduce, a critic whose predictions move at every optimizer
step. ppo_train takes the plain mean over every micro-batch of the rank-averaged status: for critic_loss (each
micro-batch's masked sum over the optimizer step's tokens / accumulation, times the ranks) that is each optimizer
step's token mean, averaged over the optimizer steps; for values the per-rank token means averaged unweighted; for
critic_lr / critic_grad_norm the values read after every micro-batch, not the last optimizer step's.
"""
from __future__ import annotations

import functools
import math

import pytest

from trackbridge.schema.loader import load_registry

from _support.openrlhf_marks import judged
from _support.proven import proof

torch = pytest.importorskip("torch")
P = pytest.importorskip("_support.proofs_openrlhf")

REL = 2e-5
LEVELS = ("micro_batches", "mini_batches", "processes")
RUN = {"train.batch_size": P.WORLD * P.GAS * P.MICRO, "train.micro_batch_size": P.MICRO,
       "train.max_epochs": P.CRITIC_EPOCHS, "critic.num_nodes": 1, "critic.num_gpus_per_node": P.WORLD,
       "rollout.batch_size": 4, "rollout.n_samples_per_prompt": 4, "ds.ring_attn_size": 1,
       "ds.tensor_parallel_size": 1}


@functools.lru_cache(maxsize=None)
def runs() -> tuple:
    return tuple(P.run_critic(seed) for seed in range(3))


def obs(key: str, per_seq) -> list:
    return [(run.status[key], P.critic_steps(run, lambda j, s, run=run: per_seq(run, j, s))) for run in runs()]


@proof("openrlhf", trainer="ppo", release="0.11.2", config=RUN)
def test_critic_loss_is_each_optimizer_steps_token_mean_averaged(p):
    """critic_loss: the token mean of each optimizer step (pooled over its micro-batches and ranks), the optimizer
    steps averaged unweighted; values: per-rank token means averaged unweighted over ranks, micro-batches and
    optimizer steps."""
    found = p.assert_stated("critic_loss", obs("critic_loss", P.value_loss_terms), rel=REL, levels=LEVELS,
                            tokens=("token_mean", "token_sum_step_norm", "seq_mean_token_mean"))
    p.check(found.mini_batches == "mean", found)
    p.assert_stated("values", obs("values", lambda run, j, s: run.pred(j, s)), rel=REL, levels=LEVELS)


def test_critic_lr_and_grad_norm_are_means_over_every_micro_batch():
    """critic_lr / critic_grad_norm: the mean over every micro-batch of what the engine reports after it: the LR
    after the scheduler steps so far, DeepSpeed's last global norm (the previous optimizer step's between
    boundaries, 0.0 before the first); not the last optimizer step's values like the actor's. (The fingerprint does
    not compute scalars: a plain test of the shipped statements, not a registered proof.)"""
    reg = load_registry()
    for key, snapshot in (("critic_lr", "after_scheduler_step"), ("critic_grad_norm", "update")):
        _, res, _, _ = judged(reg, key, RUN, trainer="ppo", release="0.11.2")
        assert (res.stated["stat"], res.stated["micro_batches"], res.stated["mini_batches"], res.stated["processes"],
                res.stated["snapshot"]) == ("value", "mean", "mean", "none", snapshot), res.stated
        assert res.counts["micro_batches"].n == P.GAS and res.counts["mini_batches"].n == 4, res.counts
    for run in runs():
        assert len(run.lrs) == len(run.norms) == 4 * P.GAS, len(run.lrs)
        assert math.isclose(run.status["critic_lr"], sum(run.lrs) / len(run.lrs), rel_tol=1e-9), run.lrs
        assert not math.isclose(run.status["critic_lr"], run.lrs[-1], rel_tol=1e-6), "not the last LR"
        assert math.isclose(run.status["critic_grad_norm"], sum(run.norms) / len(run.norms)), run.norms
        assert run.norms[0] == 0.0 and not math.isclose(run.status["critic_grad_norm"], run.norms[-1]), run.norms
