"""Fingerprint proofs of OpenRLHF 0.11.2's PPO metrics against mappings/openrlhf.yaml (issue 20).

OpenRLHF's own code from the installed wheel (tests/_support/proofs_openrlhf.py) runs PPO from raw vLLM-shaped
responses through the samples generator, the experience maker (old-policy and reference log-probs, the reward-side
KL, group baselines, returns), the launcher's dispatch to 2 simulated ranks, their replay buffers (shuffled
micro-batches) and ``ppo_train`` over 2 epochs x 2 optimizer steps x 2 micro-batches of 2 sequences, with a policy
that moves at every optimizer step (so rollout-time and update-time values differ). Each proof reads the logged value
back and asserts, through :class:`_support.proven.Proving`, that it is the reduction the shipped mapping entry states
for the proof's config (resolved by trackbridge's loader), and no other on these batches.

The losses that OpenRLHF >= 0.10.4 normalises by the optimizer step's tokens (policy_loss, entropy_loss, kl as a
loss) are ``tokens: token_sum_step_norm`` merged by tokens, as their entries state; with ``--actor.loss_agg_mode
seq-mean-token-mean`` the policy loss is a mean of per-sequence token means merged by tokens over the ranks too
(``processes: token_weighted``).
"""
from __future__ import annotations

import functools
import math

import pytest

from trackbridge.schema.loader import load_registry

from _support import fingerprint as FP
from _support.openrlhf_marks import judged
from _support.proven import proof

torch = pytest.importorskip("torch")
P = pytest.importorskip("_support.proofs_openrlhf")

REL = 2e-5           # float32 sums of O(1) terms (a loss near 0 is a difference of such); candidates differ by far more
LEVELS = ("micro_batches", "mini_batches", "processes")
# the run config the proofs' code ran with (proofs_openrlhf.ppo_args: 2 ranks x 2 micro-batches of 2, 16 samples)
RUN = {"train.batch_size": P.WORLD * P.GAS * P.MICRO, "train.micro_batch_size": P.MICRO, "train.max_epochs": 2,
       "actor.num_nodes": 1, "actor.num_gpus_per_node": P.WORLD, "rollout.batch_size": 16 // P.GROUP,
       "rollout.n_samples_per_prompt": P.GROUP, "ds.ring_attn_size": 1, "ds.tensor_parallel_size": 1,
       "logger.logging_steps": 1, "actor.entropy_coef": 0.0, "algo.kl.estimator": "k1", "algo.kl.use_loss": False,
       "actor.loss_agg_mode": "token-mean"}
KL_LOSS = {**RUN, "algo.kl.use_loss": True, "algo.kl.estimator": "k3"}
SEQ_MODE = {**RUN, "actor.loss_agg_mode": "seq-mean-token-mean"}


@functools.lru_cache(maxsize=None)
def default_runs() -> tuple:
    """Three PPO steps (three rollouts) in the default config: use_kl_loss off, kl estimator k1; entropy logged
    (entropy_coef 0: log only)."""
    return tuple(P.run_ppo(P.make_rollout(seed), P.ppo_args()) for seed in range(3))


@functools.lru_cache(maxsize=None)
def kl_loss_runs() -> tuple:
    """Two PPO steps with --algo.kl.use_loss and the k3 estimator."""
    return tuple(P.run_ppo(P.make_rollout(seed), P.ppo_args(use_kl_loss=True, estimator="k3")) for seed in (3, 4))


@functools.lru_cache(maxsize=None)
def seq_mode_runs() -> tuple:
    return tuple(P.run_ppo(P.make_rollout(seed), P.ppo_args(loss_agg_mode="seq-mean-token-mean")) for seed in (5, 6))


def obs(runs, key: str, per_seq) -> list:
    """[(logged value, fingerprint batch), ...]: ``per_seq(run, sample, optimizer step)`` gives a sequence's values."""
    return [(run.status[key], P.steps_of(run, lambda i, s, run=run: per_seq(run, i, s))) for run in runs]


def tokens_of(run, i: int, v: float) -> list[float]:
    """A per-sequence value carried on each of the sequence's response tokens (per_seq reads the first; the token
    count weights it)."""
    return [v] * run.rollout.resp_len[i]


def version(run, s: int) -> int:
    return run.policy_steps[s]


def policy(run, i: int, s: int, col: int) -> list[float]:
    """PolicyLoss's per-token (loss, clip indicator, ppo_kl) under the policy after the step's optimizer steps."""
    return P.policy_terms(run.rollout, i, version(run, s), run.experiences[i].advantages)[col]


def check_batch_shape(p, run) -> None:
    """2 epochs x 2 optimizer steps, 2 ranks x 2 micro-batches of 2 sequences, the policy one optimizer step further
    at each, micro-batches of different token counts on every level."""
    p.check(len(run.micro) == 4 and run.policy_steps == [0, 1, 2, 3], run.policy_steps)
    p.check(all(len(step) == P.WORLD and all(len(rank) == P.GAS and all(len(mb) == P.MICRO for mb in rank)
                                               for rank in step) for step in run.micro), "batch shape")
    seen = sorted(i for step in run.micro[:2] for rank in step for mb in rank for i in mb)
    p.check(seen == list(range(run.rollout.n)), "each epoch visits every sample once")
    FP.check_uneven(P.steps_of(run, lambda i, s: run.rollout.old[i]), LEVELS)


def stated(key: str, config: dict) -> dict:
    """The reduction the shipped entry states for ``key`` (trainer ppo, release 0.11.2, ``config``), resolved."""
    _, res, _, _ = judged(load_registry(), key, config, trainer="ppo", release="0.11.2")
    return dict(res.stated)


def assert_step_norm(p, key: str, observations) -> None:
    """The step-normalised losses: the entry states ``token_sum_step_norm`` merged by tokens, the fingerprint finds
    it, and it is not the token mean pooled over the step."""
    _, res = p.entry(key)
    p.check(res.stated["tokens"] == "token_sum_step_norm" and res.stated["deviation"] == "none", res.stated)
    found = p.assert_stated(key, observations, rel=REL, levels=LEVELS)
    p.check(found.tokens == "token_sum_step_norm", found)
    logged, batch = observations[0]
    pooled = FP.value_of(batch, FP.Reduction("token_mean", "mean", "none", "none", "all_reduce_weighted", "step"))
    p.check(not math.isclose(logged, pooled, rel_tol=1e-3), (logged, pooled))


# ============================================================================================ default config
@proof("openrlhf", trainer="ppo", release="0.11.2", config=RUN)
def test_ppo_clip_ratio_and_ppo_kl_are_token_means_at_update_time(p):
    """PolicyLoss's masked_mean per micro-batch under the policy being updated, merged by tokens over micro-batches,
    ranks, optimizer steps and epochs: the token mean over the whole PPO step."""
    runs = default_runs()
    check_batch_shape(p, runs[0])
    p.assert_stated("ppo_clip_ratio", obs(runs, "ppo_clip_ratio", lambda run, i, s: policy(run, i, s, 1)), rel=REL,
                    levels=LEVELS)
    p.assert_stated("ppo_kl", obs(runs, "ppo_kl", lambda run, i, s: policy(run, i, s, 2)), rel=REL, levels=LEVELS)
    _, res = p.entry("ppo_kl")
    p.check(res.fields["snapshot"] == "update" and res.fields["estimator"] == "k1", res.fields)


@proof("openrlhf", trainer="ppo", release="0.11.2", config=RUN)
def test_ppo_default_kl_is_the_rollout_time_k1_per_sequence(p):
    """use_kl_loss off (the default): kl is the experience maker's per-sequence masked mean of k1(old policy,
    reference), computed once at rollout time and merged by samples: the mean over samples of per-sequence token
    means. Neither k2/k3 nor the update-time policy's KL gives the logged value."""
    runs = default_runs()

    def rollout_kl(estimator):
        return lambda run, i, s: P.approx_kl(run.rollout.old[i], run.rollout.ref[i], estimator)
    p.assert_stated("kl", obs(runs, "kl", rollout_kl("k1")), rel=REL, levels=LEVELS)
    entry, res = p.entry("kl")
    p.check(entry.canonical == "kl/old_ref/k1" and res.fields["snapshot"] == "rollout", (entry.canonical, res.fields))
    for estimator in ("k2", "k3"):
        other = obs(runs, "kl", rollout_kl(estimator))
        p.check(not any(math.isclose(v, other[0][0], rel_tol=1e-6) for v, _ in FP.candidates(other[0][1])), estimator)
    update = obs(runs, "kl", lambda run, i, s: P.approx_kl(run.rollout.logp(i, version(run, s)), run.rollout.ref[i],
                                                           "k1"))
    p.check(not any(math.isclose(v, update[0][0], rel_tol=1e-6) for v, _ in FP.candidates(update[0][1])), "update")


@proof("openrlhf", trainer="ppo", release="0.11.2", config=RUN)
def test_ppo_default_logprobs_diff_is_the_k1_kl(p):
    """Without use_loss, logprobs_diff is the per-sequence mean of old - reference log-probs: the k1 kl itself."""
    runs = default_runs()
    p.assert_stated("logprobs_diff", obs(runs, "logprobs_diff", lambda run, i, s: [
        a - b for a, b in zip(run.rollout.old[i], run.rollout.ref[i])]), rel=REL, levels=LEVELS)
    p.check(all(math.isclose(r.status["logprobs_diff"], r.status["kl"], rel_tol=1e-6) for r in runs), "kl")
    _, res = p.entry("logprobs_diff")
    p.check(res.fields["snapshot"] == "rollout", res.fields)


SAMPLE_KEYS = ("reward", "score", "response_length", "total_length", "truncated", "group_reward_std")


@proof("openrlhf", trainer="ppo", release="0.11.2", config=RUN)
def test_ppo_sample_fields_are_sample_means(p):
    """Per-sample info and episode fields (samples generator / experience maker), merged by samples over
    micro-batches, ranks, optimizer steps and epochs: the mean over the rollout's samples."""
    runs = default_runs()
    for key in SAMPLE_KEYS:
        def value(run, i, s, key=key):
            r = run.rollout
            v = {"reward": r.reward[i], "score": r.reward[i], "response_length": r.resp_len[i],
                 "total_length": r.resp_len[i] + r.prompt_len[i], "truncated": float(r.truncated[i]),
                 "group_reward_std": run.experiences[i].info["group_reward_std"]}[key]
            return tokens_of(run, i, v)
        # group_reward_std is one value per prompt group, so a micro-batch's sequences often share it: its max, min
        # and mean then coincide, and (the ranks' shuffles vary from run to run) at times its last and mean; the
        # selections are fingerprinted on the other keys
        kw = {"micro": ("seq_weighted", "token_weighted", "mean", "none")} if key == "group_reward_std" else {}
        p.assert_stated(key, obs(runs, key, value), rel=REL, levels=LEVELS, tokens=("per_seq",), **kw)


@proof("openrlhf", trainer="ppo", release="0.11.2", config=RUN)
def test_ppo_return_is_the_mean_of_per_sequence_reward_sums(p):
    """return: the sum over the response of the shaped per-token reward (compute_reward: the group-normalised
    reward on the last token, minus kl_coef x the k1 KL on every token), averaged over samples. The per-token
    rewards are read back from the experience maker's own advantages (group_norm, gamma 1: the advantage at t is
    the sum of the rewards from t on)."""
    runs = default_runs()

    def shaped(run, i, s):
        adv = run.experiences[i].advantages
        return [a - b for a, b in zip(adv, adv[1:] + [0.0])]
    p.check(all(math.isclose(sum(shaped(r, i, 0)), r.experiences[i].info["return"], rel_tol=1e-5, abs_tol=1e-6)
                for r in runs for i in range(r.rollout.n)), "advantages sum to the return")
    p.assert_stated("return", obs(runs, "return", shaped), rel=REL, levels=LEVELS)


@proof("openrlhf", trainer="ppo", release="0.11.2", config=RUN)
def test_ppo_losses_are_step_normalised_sums_merged_by_tokens(p):
    """policy_loss / entropy_loss: aggregate_loss divides a micro-batch's masked sum by the optimizer step's tokens
    per (rank, micro-batch) (iter_grad_accum_global_norm) and ppo_train merges those by tokens: not a token mean."""
    runs = default_runs()
    assert_step_norm(p, "policy_loss", obs(runs, "policy_loss", lambda run, i, s: policy(run, i, s, 0)))
    assert_step_norm(p, "entropy_loss", obs(runs, "entropy_loss", lambda run, i, s: run.rollout.entropy(
        i, version(run, s))))
    _, res = p.entry("entropy_loss")
    p.check(res.fields["estimator"] == "exact" and res.fields["snapshot"] == "update", res.fields)
    # 2 micro-batches on 2 ranks merged by tokens: not the token mean, computed so
    p.check(res.fields["tokens"] == "token_sum_step_norm", res.fields)


# ---- plain tests of the shipped statements against the wheel's values: the gradient norm and the LR of every
# optimizer step follow one schedule in every run, so the last one is also the largest: a fingerprint cannot tell
# `last` from `max` on them

def test_ppo_actor_grad_norm_and_lr_are_the_last_optimizer_steps():
    """actor_grad_norm and actor_lr are taken from the last micro-batch of the PPO step (ppo_train: vals[-1]): the
    last optimizer step's gradient norm, and the LR after the scheduler stepped there; not a mean over the step's
    optimizer steps, and not the LR the last step used."""
    for key, snapshot in (("actor_grad_norm", "update"), ("actor_lr", "after_scheduler_step")):
        red = stated(key, RUN)
        assert (red["stat"], red["mini_batches"], red["micro_batches"], red["processes"], red["snapshot"]) == \
            ("value", "last", "none", "none", snapshot), red
    for run in default_runs():
        norms = [P.grad_norm_of_step(k) for k in range(len(run.micro))]
        assert math.isclose(run.status["actor_grad_norm"], norms[-1]), (run.status["actor_grad_norm"], norms)
        assert not any(math.isclose(run.status["actor_grad_norm"], x) for x in norms[:-1] + [sum(norms) / len(norms)])
        used = P.BASE_LR * P.lr_factor(len(run.micro) - 1)
        assert math.isclose(run.status["actor_lr"], run.lr_after[-1]), "the LR after the last scheduler step"
        assert not math.isclose(run.status["actor_lr"], used), "not the LR the last step used"


@proof("openrlhf", trainer="ppo", release="0.11.2", config=RUN)
def test_ppo_actor_grad_norm_and_lr_fingerprint_as_the_last_optimizer_step(p):
    """The same facts as a fingerprint (issue 33): over the PPO step's optimizer steps (one mini-batch each, as
    DeepSpeed's engine steps at the accumulation boundary), actor_grad_norm and actor_lr are the last one's, neither
    their mean, sum, maximum nor minimum; three rollouts. The norm of the all-reduced gradient and the LR are the
    same on every rank, so the batch is one rank's optimizer steps. The simulated engine's norms and LR factors
    start at another step in each run (step_offset), so the last step's is not always the largest."""
    offsets = (0, 2, 5)
    runs = [P.run_ppo(P.make_rollout(seed), P.ppo_args(), step_offset=off) for seed, off in enumerate(offsets)]
    p.check(all(len(run.micro) >= 3 for run in runs), [len(run.micro) for run in runs])
    norms = [(run.status["actor_grad_norm"], [[[[[[P.grad_norm_of_step(k + off)]]]] for k in range(len(run.micro))]])
             for run, off in zip(runs, offsets)]
    p.assert_stated("actor_grad_norm", norms, tokens=("none",), levels=())
    lrs = [(run.status["actor_lr"], [[[[[[lr]]]] for lr in run.lr_after]]) for run in runs]
    p.check(all(len(run.lr_after) == len(run.micro) for run in runs), "one LR after each optimizer step")
    p.assert_stated("actor_lr", lrs, tokens=("none",), levels=())
    used = [P.BASE_LR * P.lr_factor(len(run.micro) - 1 + off) for run, off in zip(runs, offsets)]
    p.check(not any(math.isclose(run.status["actor_lr"], u) for run, u in zip(runs, used)),
            "not the LR the last step used: the LR after its scheduler step")


@proof("openrlhf", trainer="ppo", release="0.11.2", config={**RUN, "logger.logging_steps": 2})
def test_ppo_logging_steps_log_the_step_not_the_window(p):
    """BasePPOTrainer.save_logs_and_checkpoints with logging_steps 2: rows at steps 2 and 4 carry that step's
    status (window 'last'), the steps in between are not logged."""
    runs = default_runs()
    w = P.wheel()
    rows: list[dict] = []
    logger = P.ns(handle=P.ns(log=rows.append, Table=None), samples_table=None)
    logger.log_train = lambda step, logs: w.logging_utils.WandbLogger.log_train(logger, step, logs)
    trainer = P.ns(args=P.ppo_args(logging_steps=2), wandb_logger=logger, tensorboard_logger=None)
    order = [runs[0], runs[1], runs[2], runs[1]]      # rollouts of unequal token counts
    for step, run in enumerate(order, start=1):
        w.trainer["save_logs_and_checkpoints"](trainer, step, dict(run.status))
    p.check([r["train/global_step"] for r in rows] == [2, 4], [r["train/global_step"] for r in rows])
    observations = []
    for row, pair in ((rows[0], order[:2]), (rows[1], order[2:])):
        steps = [P.steps_of(run, lambda i, s, run=run: tokens_of(run, i, run.rollout.reward[i]))[0] for run in pair]
        observations.append((row["train/reward"], steps))
    p.assert_stated("reward", observations, rel=REL, levels=("window",), tokens=("per_seq",),
                    micro=("seq_weighted",), mini=("seq_weighted",), processes=("all_reduce_weighted",))
    _, res = p.entry("reward")
    # the row's own step's value: the identity (the steps between rows are not logged)
    p.check(res.counts["window"].n == 2 and res.stated["window"] == "last" and res.fields["window"] == "step",
            res.counts)


# ============================================================================================ non-default configs
@proof("openrlhf", trainer="ppo", release="0.11.2", config=KL_LOSS)
def test_ppo_kl_as_a_loss_is_the_update_time_loss_term(p):
    """--algo.kl.use_loss, k3: kl is training_step's aggregate_loss of k3(policy being updated, reference) (the same
    step normalisation and token merge as policy_loss), translated as kl/ref/k3; logprobs_diff the token mean of
    current - reference log-probs at update time."""
    runs = kl_loss_runs()
    entry, res = p.entry("kl")
    p.check(entry.canonical == "kl/ref/k3" and res.fields["estimator"] == "k3" and res.fields["snapshot"] == "update",
            (entry.canonical, res.fields))
    assert_step_norm(p, "kl", obs(runs, "kl", lambda run, i, s: P.approx_kl(run.rollout.logp(i, version(run, s)),
                                                                            run.rollout.ref[i], "k3")))
    p.assert_stated("logprobs_diff", obs(runs, "logprobs_diff", lambda run, i, s: [
        a - b for a, b in zip(run.rollout.logp(i, version(run, s)), run.rollout.ref[i])]), rel=REL, levels=LEVELS)
    _, res = p.entry("logprobs_diff")
    p.check(res.fields["snapshot"] == "update" and res.switched["snapshot"][:2] == ("algo.kl.use_loss", True),
            res.switched)


@proof("openrlhf", trainer="ppo", release="0.11.2", config=SEQ_MODE)
def test_ppo_seq_mean_token_mean_policy_loss_is_merged_by_tokens(p):
    """--actor.loss_agg_mode seq-mean-token-mean (v0.11.2): aggregate_loss sums per-sequence token means over the
    step's sequences per (rank, micro-batch), the micro-batch's own mean of per-sequence token means (every
    micro-batch holds micro_train_batch_size sequences); ppo_train still merges it by tokens, over the ranks too
    (``processes: token_weighted``, not by sequences)."""
    runs = seq_mode_runs()
    _, res = p.entry("policy_loss")
    p.check(res.stated["tokens"] == "seq_mean_token_mean" and res.stated["processes"] == "token_weighted", res.stated)
    found = p.assert_stated("policy_loss", obs(runs, "policy_loss", lambda run, i, s: policy(run, i, s, 0)), rel=REL,
                            levels=LEVELS)
    p.check(found.processes == "token_weighted" and found.micro_batches == "token_weighted", found)
