"""Fingerprints of veRL 0.9.1's reductions (issue 20): one training step of the default trainer (V1, sync) run by
veRL's own code (tests/_support/proofs_verl.py: the V1 trainer's old-log-prob pass, actor update and data
metrics; the engine worker's train_mini_batch / train_batch with ppo_loss and Metric aggregation; FSDPEngine's
micro-batch loop, optimizer and scheduler steps) over 2 simulated ranks, 2 mini-batches x 2 PPO epochs, 2
micro-batches of uneven token counts per rank and optimizer step, a tiny policy that moves with every optimizer
step (so the update-time policy differs from the pre-update one), and responses with tool-output tokens and no
truncation. Each logged value is fingerprinted against what veRL computed on the way, and must be the reduction
mappings/verl.yaml states for the proof's config (resolved through trackbridge's loader), and no other."""
from __future__ import annotations

import dataclasses
import statistics

import pytest

pytest.importorskip("torch")
pytest.importorskip("tensordict")
pytest.importorskip("verl", reason="make test installs verl --no-deps")

from _support import proofs_verl as V  # noqa: E402
from _support.fingerprint import check_uneven, fingerprint  # noqa: E402
from _support.proven import close, proof  # noqa: E402

TOKENS = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum")
FRACTION_TOKENS = ("token_mean", "seq_mean_token_mean")      # a fraction of 0/1 values is no sequence sum
LEVELS = ("micro_batches", "mini_batches", "processes")
WORLD, MICRO, MINI, EPOCHS = V.WORLD, 2, 8, 2        # sequences: per micro-batch and rank, per mini-batch (global)
MAX_PROMPT, MAX_RESPONSE = 8, 12                      # the configured maxima: nothing below reaches them

# 16 sequences (8 per rank: 2 mini-batches of 4, micro-batches of 2), lengths uneven at every level; tool-output
# tokens (1) inside some responses; the longest response (9 tokens) twice, none truncated (< MAX_RESPONSE)
ROLLOUT = V.UNEVEN                                     # the shared uneven batch (proofs_verl.py)
BASE = V.base_config(ROLLOUT)
SEQ_MEAN = dict(BASE, **{"actor_rollout_ref.actor.loss_agg_mode": "seq-mean-token-mean"})
ONE_MINI = dict(BASE, **{"actor_rollout_ref.actor.ppo_mini_batch_size": ROLLOUT.n,
                         "actor_rollout_ref.actor.ppo_epochs": 1, "critic.ppo_mini_batch_size": ROLLOUT.n,
                         "critic.ppo_epochs": 1})
LEGACY = dict(BASE, **{"trainer.use_v1": False})

_RUNS: dict = {}


def step(mini: int = MINI, epochs: int = EPOCHS, critic: bool = False, seed: int = ROLLOUT.seed,
         **actor) -> V.StepRun:
    """One training step of veRL's code on ROLLOUT (another ``seed``: the same shapes, other values)."""
    key = (mini, epochs, critic, seed, tuple(sorted(actor.items())))
    if key not in _RUNS:
        _RUNS[key] = V.run_step(dataclasses.replace(ROLLOUT, seed=seed), mini_batch_size=mini, micro_size=MICRO,
                                epochs=epochs, actor_overrides=actor, critic=critic)
    return _RUNS[key]


def by_rank(values: list, micro: int = MICRO) -> list:
    """Per-sequence (or per-token) values of the whole batch in the worker layout: [rank][micro-batch][sequence]
    (contiguous rank shares, micro-batches of ``micro`` sequences): the batch the candidates are computed on."""
    per = len(values) // WORLD
    return [[values[r * per + u:r * per + u + micro] for u in range(0, per, micro)] for r in range(WORLD)]


def layout(values: list, shares=((3, 1, 3), (2, 4, 1, 2))) -> list:
    """Per-sequence values of the whole batch cut into uneven groups ([rank][group][sequence]): a driver metric is
    computed once over the whole batch, so any layout is one it could have been averaged over instead; uneven
    groups make those alternatives differ from the pooled value."""
    out, i = [], 0
    for rank in shares:
        groups = []
        for size in rank:
            groups.append(values[i:i + size])
            i += size
        out.append(groups)
    assert i == len(values), (i, len(values))
    return out


def observations(logged: float, values: list) -> list:
    """The one logged value against three layouts of the same batch (as given, sorted up, sorted down; cut by
    :func:`layout`): a value computed over the whole batch is the pooled one in every layout, while a selection (a
    group's max, the last group) or an unweighted mean changes with the layout."""
    return [(logged, [[layout(order)]]) for order in (list(values), sorted(values), sorted(values, reverse=True))]


class _Checks:
    """``p.check`` and ``p.entry`` of a proof (tests/_support/proven.py) for a plain test: the entry trackbridge uses
    for a key under ``config`` and its resolved reduction."""

    def __init__(self, config: dict):
        from _support.proven import Proof, Proving
        self._p = Proving(Proof(lambda _: None, "verl", "ppo", "0.9.1", tuple(sorted(config.items())), "checks"))

    def check(self, condition, message="") -> None:
        assert condition, message

    def entry(self, key: str):
        return self._p.entry(key)


def pooled(steps) -> list[float]:
    return [v for mini in steps[0] for rank in mini for micro in rank for seq in micro for v in seq]


# ------------------------------------------------------------------------------------------------ actor update
@proof("verl", trainer="ppo", release="0.9.1", config=BASE)
def test_actor_losses_average_the_optimizer_steps_unweighted(p):
    """pg_loss, kl_loss, entropy_loss: each optimizer step's pooled token mean (global normalisation, Metric SUM
    over micro-batches, mean over ranks), averaged unweighted over the 2 mini-batches x 2 epochs; clip fraction and
    ppo_kl: unweighted means of micro-batch token means. Not the step's token mean."""
    run = step()
    p.check(run.n_opt_steps == 4, f"{run.n_opt_steps} optimizer steps, want 4")
    for key, name in (("actor/pg_loss", "pg_loss"), ("actor/kl_loss", "kl"), ("actor/entropy_loss", "entropy"),
                      ("actor/pg_clipfrac", "pg_clipfrac"), ("actor/ppo_kl", "ppo_kl")):
        steps = run.cap.batch(name, run.n_opt_steps)
        p.assert_stated(key, run.metrics[key], steps, levels=LEVELS, tokens=TOKENS)
        flat = pooled(steps)
        p.check(not close(run.metrics[key], sum(flat) / len(flat)),
                f"{key}: equals the step's token mean: the batch does not show the mini-batch averaging")
    # the pre-update (old) policy is the first optimizer step's: ppo_kl 0 there, not after the first update
    ppo_kl = run.cap.batch("ppo_kl", run.n_opt_steps)[0]
    first = [v for rank in ppo_kl[0] for micro in rank for seq in micro for v in seq]
    later = [v for rank in ppo_kl[1] for micro in rank for seq in micro for v in seq]
    p.check(all(abs(v) < 1e-6 for v in first) and any(abs(v) > 1e-3 for v in later),
            "the update-time policy must equal the old policy at the first optimizer step only")


@proof("verl", trainer="ppo", release="0.9.1", config=SEQ_MEAN)
def test_loss_agg_mode_switches_the_token_reduction(p):
    """actor.loss_agg_mode seq-mean-token-mean: the losses are mean-over-sequences of sequence token means (the
    entry's tokens switch), the clip fraction stays a token mean; actor/entropy too follows loss_agg_mode."""
    run = step(loss_agg_mode="seq-mean-token-mean")
    for key, name in (("actor/pg_loss", "pg_loss"), ("actor/kl_loss", "kl"), ("actor/entropy_loss", "entropy"),
                      ("actor/pg_clipfrac", "pg_clipfrac")):
        p.assert_stated(key, run.metrics[key], run.cap.batch(name, run.n_opt_steps), levels=LEVELS, tokens=TOKENS)
    ent = run.cap.driver[0]
    p.check(ent["mode"] == "seq-mean-token-mean", ent["mode"])
    p.assert_stated("actor/entropy", run.metrics["actor/entropy"], [[by_rank(ent["values"])]],
                    levels=("micro_batches", "processes"), tokens=TOKENS)


@proof("verl", trainer="ppo", release="0.9.1", config=ONE_MINI)
def test_one_mini_batch_and_one_epoch_is_the_steps_token_mean(p):
    """ppo_mini_batch_size == train_batch_size and ppo_epochs 1: one optimizer step per step, so the losses are
    the step's token mean (the mini_batches level holds one item: the entry resolves to the pooled reduction)."""
    run = step(mini=ROLLOUT.n, epochs=1)
    p.check(run.n_opt_steps == 1, f"{run.n_opt_steps} optimizer steps, want 1")
    for key, name in (("actor/pg_loss", "pg_loss"), ("actor/kl_loss", "kl"), ("actor/entropy_loss", "entropy")):
        steps = run.cap.batch(name, 1)
        p.assert_stated(key, run.metrics[key], steps, levels=("micro_batches", "processes"), tokens=TOKENS)
        flat = pooled(steps)
        p.check(close(run.metrics[key], sum(flat) / len(flat)), f"{key} is not the step's token mean")
        _, res = p.entry(key)
        p.check(res.fields["mini_batches"] == "none", f"{key}: one mini-batch should resolve to none")


@proof("verl", trainer="ppo", release="0.9.1", config=BASE)
def test_entropy_is_the_pre_update_whole_batch_token_mean(p):
    """actor/entropy: computed on the driver from the old-log-prob pass (V1 _compute_old_log_prob): the token
    mean over the whole batch of the policy before the update; actor/entropy_loss is the update-time entropy."""
    run = step()
    ent = run.cap.driver[0]
    p.check(ent["mode"] == "token-mean", ent["mode"])
    steps = [[by_rank(ent["values"])]]
    p.assert_stated("actor/entropy", run.metrics["actor/entropy"], steps, levels=("micro_batches", "processes"),
                    tokens=TOKENS)
    _, res = p.entry("actor/entropy")
    p.check(res.fields["snapshot"] == "rollout" and res.fields["estimator"] == "exact", res.fields)
    p.check(not close(run.metrics["actor/entropy"], run.metrics["actor/entropy_loss"]),
            "the pre-update and update-time entropies coincide: the policy did not move")


def test_grad_norm_and_lr():
    """actor/grad_norm: the mean of the optimizer steps' pre-clip norms (the same on every rank); actor/lr: the
    scheduler's learning rate after its step at the step's last mini-batch (the next step's), not the one the step's
    optimizer steps used. (One value per optimizer step, not a token population: checked against every alternative
    here rather than fingerprinted, so not a registered proof.)"""
    p = _Checks(BASE)
    run = step()
    norms = run.cap.grad_norms[0]
    p.check(len(norms) == run.n_opt_steps and run.cap.grad_norms[1] == norms, run.cap.grad_norms)
    logged = run.metrics["actor/grad_norm"]
    toks = [sum(len(s) for rank in mini for micro in rank for s in micro)
            for mini in run.cap.batch("pg_loss", run.n_opt_steps)[0]]
    weighted = sum(n * t for n, t in zip(norms, toks)) / sum(toks)
    p.check(close(logged, statistics.fmean(norms)), (logged, norms))
    p.check(all(not close(logged, other) for other in (norms[-1], max(norms), min(norms), weighted)),
            "the grad norms do not tell the mean from the last/max/min/weighted")
    _, res = p.entry("actor/grad_norm")
    p.check(res.fields["mini_batches"] == "mean" and res.fields["processes"] == "none", res.fields)
    lr = run.metrics["actor/lr"]
    used = run.cap.lrs_used[0]
    p.check(len(set(used)) == 1 and close(lr, run.lr_after) and not close(lr, used[0]), (lr, used, run.lr_after))
    _, res = p.entry("actor/lr")
    p.check(res.fields["snapshot"] == "after_scheduler_step", res.fields)


def halved(steps) -> list:
    """compute_value_loss returns 0.5 * agg_loss(clipped squared errors) (core_algos.py@v0.9.1): the per-token
    values of the logged value loss are half the matrix agg_loss is given."""
    return [[[[[[0.5 * v for v in seq] for seq in micro] for micro in rank] for rank in mini] for mini in steps[0]]]


@proof("verl", trainer="ppo", release="0.9.1", config=BASE)
def test_critic_losses(p):
    """The critic (V1 _update_critic, the engine worker with value_loss): vf_loss (and critic/loss) are, from
    v0.9.0, each optimizer step's pooled token mean averaged over the optimizer steps, like the actor's losses;
    vf_clipfrac and vpred_mean are unweighted means of micro-batch token means."""
    run = step(critic=True)
    cap = run.cap_critic
    p.check(cap is not None and len(cap.grad_norms[0]) == run.n_opt_steps, "the critic did not step 4 times")
    loss = halved(cap.batch("vf_loss_x2", run.n_opt_steps))
    for key in ("critic/vf_loss", "critic/loss"):
        p.assert_stated(key, run.metrics[key], loss, levels=LEVELS, tokens=TOKENS)
    # a fraction of 0/1 values coincides with other reductions more easily: three runs (other values, one shape)
    runs = [run] + [step(critic=True, seed=seed) for seed in (11, 12)]
    p.assert_stated("critic/vf_clipfrac", [(x.metrics["critic/vf_clipfrac"],
                                            x.cap_critic.batch("vf_clipfrac", x.n_opt_steps)) for x in runs],
                    levels=LEVELS, tokens=FRACTION_TOKENS)
    p.assert_stated("critic/vpred_mean", run.metrics["critic/vpred_mean"], cap.batch("vpred", run.n_opt_steps),
                    levels=LEVELS, tokens=TOKENS)
    p.check(close(run.metrics["critic/grad_norm"], statistics.fmean(cap.grad_norms[0])), "critic/grad_norm")


# ------------------------------------------------------------------------------------------------ driver metrics
@proof("verl", trainer="ppo", release="0.9.1", config=BASE)
def test_data_metrics_count_tool_tokens_and_clip_against_the_longest(p):
    """compute_data_metrics through the V1 trainer's _compute_metrics, on a batch with tool-output tokens and no
    truncation: lengths count the tool tokens (advantages do not: response_mask), scores are per sequence, and the
    clip ratios compare with the batch's longest sequence (2 of 16 responses "clipped", none truncated)."""
    run = step()
    m = run.metrics
    r = ROLLOUT
    with_tools = [[float(n)] for n in r.resp_lens]
    without = [[float(n - sum(t))] for n, t in zip(r.resp_lens, r.tool)]
    p.check(any(a != b for a, b in zip(with_tools, without)), "the batch has no tool tokens")
    for stat in ("mean", "max", "min"):
        p.assert_stated(f"response_length/{stat}", observations(m[f"response_length/{stat}"], with_tools),
                        levels=("micro_batches", "processes"), tokens=("per_seq",), stats=(stat,))
    p.check(not close(m["response_length/mean"], statistics.fmean(v[0] for v in without)),
            "response_length/mean does not count the tool tokens")
    _, res = p.entry("response_length/mean")
    p.check(res.fields["tool_tokens"] == "included", res.fields)
    p.assert_stated("critic/score/mean", m["critic/score/mean"], [[layout([[float(s)] for s in r.scores])]],
                    levels=("micro_batches", "processes"), tokens=("per_seq",))
    fields, _ = V._rollout_fields(r)
    adv = [[float(a) for a, k in zip(fields["advantages"][i].tolist(), fields["response_mask"][i].tolist()) if k]
           for i in range(r.n)]
    p.assert_stated("critic/advantages/mean", m["critic/advantages/mean"], [[by_rank(adv)]],
                    levels=("micro_batches", "processes"), tokens=("token_mean", "seq_mean_token_mean"))
    # clip ratios: the batch's longest, not the configured maximum (nothing is truncated)
    longest, n = max(r.resp_lens), r.n
    p.check(longest < MAX_RESPONSE and max(r.prompt_lens) < MAX_PROMPT, "the batch is truncated")
    p.check(close(m["response_length/clip_ratio"], r.resp_lens.count(longest) / n)
            and m["response_length/clip_ratio"] >= 1 / n, m["response_length/clip_ratio"])
    p.check(close(m["prompt_length/clip_ratio"], r.prompt_lens.count(max(r.prompt_lens)) / n),
            m["prompt_length/clip_ratio"])
    for key in ("response_length/clip_ratio", "prompt_length/clip_ratio"):
        _, res = p.entry(key)
        p.check(res.fields["clip_length"] == "batch_longest" and res.fields["stat"] == "fraction", (key, res.fields))


@proof("verl", trainer="ppo", release="0.9.1", config=LEGACY)
def test_legacy_trainer_clips_against_the_configured_maximum(p):
    """trainer.use_v1=false (ray_trainer.py): the batch is padded to the configured maxima, so the same batch's
    clip ratios are 0 (nothing truncated) and the entry resolves clip_length max_length."""
    m = V.legacy_data_metrics(ROLLOUT, MAX_PROMPT, MAX_RESPONSE)
    p.check(m["response_length/clip_ratio"] == 0.0 and m["prompt_length/clip_ratio"] == 0.0, m)
    lengths = [[float(n)] for n in ROLLOUT.resp_lens]          # the attention mask counts tool tokens here too
    p.assert_stated("response_length/mean", observations(m["response_length/mean"], lengths),
                    levels=("micro_batches", "processes"), tokens=("per_seq",))
    p.check(close(m["response_length/mean"], step().metrics["response_length/mean"]),
            "the legacy and V1 lengths differ")
    for key in ("response_length/clip_ratio", "prompt_length/clip_ratio"):
        _, res = p.entry(key)
        p.check(res.fields["clip_length"] == "max_length", (key, res.fields))


def test_the_batch_tells_the_levels_apart():
    """The proofs' batch has, at every level, items of different token counts (else weighted and unweighted
    reductions coincide and a fingerprint proves nothing)."""
    run = step()
    check_uneven(run.cap.batch("pg_loss", run.n_opt_steps), LEVELS)
    with pytest.raises(AssertionError, match="fit different reductions|no candidate"):
        even = [[[[[[0.5, 0.5]], [[0.5, 0.5]]] for _ in range(WORLD)] for _ in range(2)]]
        fingerprint(0.5, even, tokens=TOKENS)
