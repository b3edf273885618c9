"""Fingerprints of veRL 0.9.1's optimizer-side actor and critic metrics (issue 33 item 1): the dual-clip fraction,
the total actor loss, the gradient norms, the learning rates and the KL-loss coefficient of one V1 training step run
by the wheel's own code (tests/_support/proofs_verl.py: the engine worker's train_mini_batch / train_batch,
FSDPEngine's optimizer and scheduler steps, ppo_loss / value_loss) over 2 simulated ranks, 2 mini-batches x 2 PPO
epochs. What the logged values are compared with is captured while veRL runs: the per-token matrices its loss
function hands to agg_loss / masked_mean, the pre-clip norms clip_grad_norm_ returns on every optimizer step, the
learning rates the optimizers stepped with and the schedulers' rates after the step."""
from __future__ import annotations

import dataclasses
import statistics

import pytest

pytest.importorskip("torch")
pytest.importorskip("tensordict")
pytest.importorskip("verl", reason="make test installs verl --no-deps")

from _support import proofs_verl as V  # noqa: E402
from _support.proven import close, proof  # noqa: E402

WORLD, MICRO, MINI, EPOCHS = V.WORLD, 2, 8, 2
LEVELS = ("micro_batches", "mini_batches", "processes")
FRACTION_TOKENS = ("token_mean", "seq_mean_token_mean")
TOKENS = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum")
CLIP_C = 1.1                 # dual-clip bound close to 1: the lower clip fires on this small batch
ROLLOUT = V.UNEVEN                                     # the shared uneven batch (proofs_verl.py)
BASE = V.base_config(ROLLOUT)
DUAL = dict(BASE, **{"actor_rollout_ref.actor.clip_ratio_c": CLIP_C})

_RUNS: dict = {}


def step(seed: int = ROLLOUT.seed, critic: bool = True, **actor) -> V.StepRun:
    key = (seed, critic, tuple(sorted(actor.items())))
    if key not in _RUNS:
        _RUNS[key] = V.run_step(dataclasses.replace(ROLLOUT, seed=seed), mini_batch_size=MINI, micro_size=MICRO,
                                epochs=EPOCHS, actor_overrides=actor, critic=critic)
    return _RUNS[key]


def one_value(x: float) -> list:
    """A scalar as the fingerprint's batch: one logged step, one optimizer step, one rank, one value."""
    return [[[[[[float(x)]]]]]]


def per_optimizer_step(values: list[float]) -> list:
    """One value per optimizer step (``steps[0][optimizer step][rank][micro][seq]``), once: the proof checks that
    every rank holds the same values, so the ranks are one item (their reductions all give it)."""
    return [[[[[[v]]]] for v in values]]


def flat(steps) -> list[float]:
    return [v for mini in steps[0] for rank in mini for micro in rank for seq in micro for v in seq]


@proof("verl", trainer="ppo", release="0.9.1", config=DUAL)
def test_dual_clip_fraction_is_an_unweighted_mean_of_micro_batch_token_means(p):
    """actor/pg_clipfrac_lower (compute_policy_loss_vanilla's masked_mean of the dual-clip indicator, Metric MEAN):
    each micro-batch's token mean, averaged unweighted over micro-batches, ranks and the optimizer steps. A
    fraction of 0/1 values: three runs of one shape (other values) so that no other reduction fits them all."""
    runs = [step(seed, critic=False, clip_ratio_c=CLIP_C) for seed in (3, 11, 12)]
    obs = [(r.metrics["actor/pg_clipfrac_lower"], r.cap.batch("pg_clipfrac_lower", r.n_opt_steps)) for r in runs]
    p.check(all(0 < sum(flat(b)) for _, b in obs), "the dual clip never fired: the batch proves nothing")
    p.assert_stated("actor/pg_clipfrac_lower", obs, levels=LEVELS, tokens=FRACTION_TOKENS)
    for logged, b in obs:
        toks = flat(b)
        p.check(not close(logged, sum(toks) / len(toks)), "equals the step's token mean: no mini-batch averaging shows")


@proof("verl", trainer="ppo", release="0.9.1", config=BASE)
def test_actor_total_loss_is_each_optimizer_steps_pooled_token_mean(p):
    """actor/loss: the loss ppo_loss returns per micro-batch (pg_loss + kl_loss_coef * kl_loss, entropy_coeff 0),
    globally normalised and summed over micro-batches, averaged over ranks: each optimizer step's pooled token mean
    of the per-token total loss, averaged unweighted over the step's mini-batches x epochs (like actor/pg_loss)."""
    run = step()
    acfg = V.actor_config()
    p.check(acfg.entropy_coeff == 0 and acfg.kl_loss_coef > 0, (acfg.entropy_coeff, acfg.kl_loss_coef))
    pg, kl = run.cap.batch("pg_loss", run.n_opt_steps), run.cap.batch("kl", run.n_opt_steps)
    total = [[[[[[a + acfg.kl_loss_coef * b for a, b in zip(sp, sk)] for sp, sk in zip(up, uk)]
                for up, uk in zip(rp, rk)] for rp, rk in zip(mp, mk)] for mp, mk in zip(pg[0], kl[0])]]
    p.assert_stated("actor/loss", run.metrics["actor/loss"], total, levels=LEVELS, tokens=TOKENS)
    p.check(not close(run.metrics["actor/loss"], run.metrics["actor/pg_loss"]), "the KL term does not show")
    p.assert_stated("actor/kl_coef", run.metrics["actor/kl_coef"], one_value(acfg.kl_loss_coef), levels=())
    p.check(run.metrics["actor/kl_coef"] == acfg.kl_loss_coef, run.metrics["actor/kl_coef"])


@proof("verl", trainer="ppo", release="0.9.1", config=BASE)
def test_grad_norms_average_the_optimizer_steps(p):
    """actor/grad_norm and critic/grad_norm: the pre-clip norm each optimizer step's clip_grad_norm_ returned (the
    same on every rank), averaged unweighted over the step's mini-batches x epochs: not the last, the largest, the
    sum, nor a token-weighted mean. (The norm itself is torch's clip_grad_norm_ on the tiny policy's gradients, not
    FSDP's sharded norm: what is proven is the reduction over optimizer steps.)"""
    run = step()
    for key, cap in (("actor/grad_norm", run.cap), ("critic/grad_norm", run.cap_critic)):
        norms = cap.grad_norms[0]
        p.check(len(norms) == run.n_opt_steps and cap.grad_norms[1] == norms and len(set(norms)) == len(norms),
                (key, cap.grad_norms))
        p.assert_stated(key, run.metrics[key], per_optimizer_step(norms), levels=())
        name = "pg_loss" if key.startswith("actor") else "vf_loss_x2"
        toks = [len(flat([[mini]])) for mini in cap.batch(name, run.n_opt_steps)[0]]
        weighted = sum(n * t for n, t in zip(norms, toks)) / sum(toks)
        p.check(not close(run.metrics[key], weighted), f"{key}: the token-weighted mean coincides")


@proof("verl", trainer="ppo", release="0.9.1", config=BASE)
def test_learning_rates_are_the_schedulers_after_the_step(p):
    """actor/lr and critic/lr: the scheduler's rate after its step at the step's last mini-batch (the rate the next
    step uses), not the rate this step's optimizer steps used."""
    run = step()
    for key, after, cap in (("actor/lr", run.lr_after, run.cap), ("critic/lr", run.critic_lr_after, run.cap_critic)):
        used = cap.lrs_used[0]
        p.check(after is not None and len(set(used)) == 1 and not close(after, used[0]), (key, after, used))
        p.assert_stated(key, run.metrics[key], one_value(after), levels=())
        _, res = p.entry(key)
        p.check(res.fields["snapshot"] == "after_scheduler_step", (key, res.fields))


def test_dual_clip_batches_differ():
    """The three dual-clip runs are three batches (other values, one shape), not one batch three times."""
    runs = [step(seed, critic=False, clip_ratio_c=CLIP_C) for seed in (3, 11, 12)]
    values = [r.metrics["actor/pg_clipfrac_lower"] for r in runs]
    assert len(set(values)) == 3, values
    assert statistics.pstdev(values) > 0


def by_rank(values: list, micro: int = MICRO) -> list:
    """Per-sequence (or per-token) values of the whole batch in the worker layout [rank][micro-batch][sequence]."""
    per = len(values) // WORLD
    return [[values[r * per + u:r * per + u + micro] for u in range(0, per, micro)] for r in range(WORLD)]


KL_TYPES = {"kl": "k1", "mse": "k2", "abs": "abs"}


def kl_config(kind: str) -> dict:
    return dict(BASE, **{"actor_rollout_ref.actor.kl_loss_type": kind})


def _kl_loss_proof(kind: str):
    def proof_fn(p):
        run = step(critic=False, kl_loss_type=kind)
        base = step(critic=False)                           # the default low_var_kl run: the same first policy
        steps = run.cap.batch("kl", run.n_opt_steps)
        p.assert_stated("actor/kl_loss", run.metrics["actor/kl_loss"], steps, levels=LEVELS, tokens=TOKENS)
        _, res = p.entry("actor/kl_loss")
        p.check(res.fields["estimator"] == KL_TYPES[kind], (kind, res.fields))
        # the first optimizer step sees the policy before any update in both runs: the per-token values are this
        # estimator of the same log-ratio whose k3 the default run logged (k3 = exp(-d) - 1 + d, d = log p - log ref)
        first = flat([steps[0][:1]])
        k3 = flat([base.cap.batch("kl", base.n_opt_steps)[0][:1]])
        p.check(len(first) == len(k3) and len(first) > 10, (len(first), len(k3)))
        if kind == "kl":
            p.check(any(v < 0 for v in first) and any(v > 0 for v in first), "k1 of a moved policy has both signs")
        else:
            p.check(all(v >= 0 for v in first), f"{kind}: a negative value")
        p.check(not all(close(a, b) for a, b in zip(first, k3)), f"{kind}: the same values as low_var_kl")
    proof_fn.__name__ = f"test_kl_loss_type_{kind}_keeps_the_engine_loss_reduction"
    proof_fn.__doc__ = (f"actor/kl_loss with actor.kl_loss_type={kind} ({KL_TYPES[kind]}): the entry of that "
                        "estimator, reduced like the default's (each optimizer step's pooled token mean, averaged "
                        "over the optimizer steps); the per-token values are that estimator's, not low_var_kl's.")
    # named before registering: the registry keys a proof by its function's name
    return proof("verl", trainer="ppo", release="0.9.1", config=kl_config(kind))(proof_fn)


test_kl_loss_type_kl_keeps_the_engine_loss_reduction = _kl_loss_proof("kl")
test_kl_loss_type_mse_keeps_the_engine_loss_reduction = _kl_loss_proof("mse")
test_kl_loss_type_abs_keeps_the_engine_loss_reduction = _kl_loss_proof("abs")


@proof("verl", trainer="ppo", release="0.9.1", config=dict(BASE, **{
    "actor_rollout_ref.actor.loss_agg_mode": "seq-mean-token-sum"}))
def test_entropy_with_seq_mean_token_sum(p):
    """actor/entropy with actor.loss_agg_mode=seq-mean-token-sum: the old-log-prob pass's entropy aggregated on
    the driver with that mode (the mean over sequences of each sequence's entropy sum), its own entry."""
    run = step(critic=False, loss_agg_mode="seq-mean-token-sum")
    ent = run.cap.driver[0]
    p.check(ent["mode"] == "seq-mean-token-sum", ent["mode"])
    p.assert_stated("actor/entropy", run.metrics["actor/entropy"], [[by_rank(ent["values"])]],
                    levels=("micro_batches", "processes"), tokens=TOKENS)
    _, res = p.entry("actor/entropy")
    p.check(res.fields["tokens"] == "seq_mean_token_sum", res.fields)
