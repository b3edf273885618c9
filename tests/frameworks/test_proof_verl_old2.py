"""Fingerprints of the veRL entries of releases test_proof_verl_old.py does not run (tests/releases.txt; each proof in a
child process with its release first on sys.path, tests/_support/releases.py): verl 0.6.1 (v0.6.0..v0.6.1: the losses
multiplied by loss_scale_factor), 0.6.0 (the mismatch/ KLs), 0.4.1 (v0.2..v0.4.1: kl_loss and critic/lr), 0.4.0
(actor/entropy_loss), 0.3.0.post1 (v0.1rc..v0.3.0.post1: entropy_loss, the reward KL and its coefficient, actor/lr,
val/test_score), 0.2.0.post2 (mfu/*, actor/grad_norm) and the FSDP SFT trainer at 0.5.0 (v0.1rc..v0.7.0). The legacy
FSDP workers' update_policy / update_critic (dp_actor.py, dp_critic.py) run over 2 simulated ranks, 2 mini-batches x 2
PPO epochs, micro-batches of 2 sequences of uneven lengths, the outputs collected with the release's DataProto.concat
and reduced with its reduce_metrics as ray_trainer.py's fit() does (tests/_support/proofs_verl_old.py's harness); the
trainer's driver-side functions (apply_kl_penalty, _validate, the rollout-importance method, the SFT trainer's
training_step) are the release's own text, compiled (tests/_support/proofs_verl_old2.py). What the logged values are
compared with is captured while veRL runs (the per-token matrices handed to agg_loss / masked_mean / the cross-entropy,
the scores the reward function returned). Last, at the pinned 0.9.1 (in process), critic/vf_explained_var with the
explained_var candidate (``stat: explained_var``)."""
from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("tensordict")
pytest.importorskip("verl", reason="make test installs verl --no-deps")

from _support import proofs_verl_old as O  # noqa: E402
from _support import proofs_verl_old2 as O2  # noqa: E402
from _support.proven import close, proof  # noqa: E402

LEVELS = ("micro_batches", "mini_batches", "processes")
LOSS_TOKENS = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum")
MEAN_TOKENS = ("token_mean", "seq_mean_token_mean")
CLIP_C = 1.1                      # the dual-clip bound close to 1: the lower clip fires on this small batch
BASE = O.base_config()
SEEDS = (7, 8, 9, 10)             # several batches of one shape: a selection (rank 0's, the max) rarely fits them all
V061 = dict(BASE, **{"actor_rollout_ref.actor.clip_ratio_c": CLIP_C})


def _actors(p, **actor) -> list[O.Update]:
    runs = [O.run_update("actor", seed=s, clip_ratio_c=CLIP_C, **actor) for s in SEEDS]
    for u in runs:
        p.check(u.cap.n_opt == {r: 2 * O.EPOCHS for r in range(O.WORLD)}, f"optimizer steps {u.cap.n_opt}")
        p.check(all(len(m) == 2 * O.EPOCHS * O.MINI // O.MICRO for m in u.cap.micro.values()), "micro-batches")
    return runs


def _scaled_kl_loss(p, actors: list[O.Update], index: int = 1) -> None:
    """actor/kl_loss of v0.6.x: dp_actor.py@v0.6.1:506-509 appends agg_loss(kld) * loss_scale_factor per micro-batch
    (the entry's deviation); fingerprinted on veRL's captured kld matrices times that factor, and not the unscaled
    mean."""
    scale = 1 / O2.GRAD_ACCUM
    p.assert_stated("actor/kl_loss", O2.obs(actors, "actor/kl_loss", "agg", index, scale), levels=LEVELS,
                    tokens=LOSS_TOKENS)
    _, res = p.entry("actor/kl_loss")
    p.check("loss_scale_factor" in res.fields["deviation"], res.fields)
    from _support import fingerprint as FP
    from _support.proven import to_fingerprint
    plain = FP.value_of(actors[0].cap.batch("agg", index), to_fingerprint(res.stated))
    p.check(not close(actors[0].metrics["actor/kl_loss"], plain, 1e-3), "the logged kl_loss is scaled")


@proof("verl", trainer="ppo", release="0.6.1", config=V061)
def test_v061_legacy_workers_scale_each_micro_batch_loss(p):
    """verl 0.6.1 (entries of v0.6.0..v0.6.1): dp_actor.update_policy appends pg_loss * loss_scale_factor (1 /
    gradient-accumulation steps, dp_actor.py@v0.6.1:436,522) and kl_loss * loss_scale_factor (:509) per micro-batch,
    the clip fractions and ppo_kl unscaled; DataProto.concat gathers every worker's metrics (protocol.py@v0.6.1
    concat) and the driver's np.mean averages them: a mean of scaled micro-batch values over micro-batches, optimizer
    steps and ranks. dp_critic.update_critic the same for vf_loss (0.5 * agg_loss, times loss_scale_factor,
    dp_critic.py@v0.6.1:240,263). Each scaled loss is fingerprinted on veRL's captured matrices times the factor the
    entry's deviation names."""
    actors = _actors(p)
    critics = [O.run_update("critic", seed=s) for s in SEEDS]
    scale = 1 / O2.GRAD_ACCUM
    p.assert_stated("actor/pg_loss", O2.obs(actors, "actor/pg_loss", "agg", 0, scale), levels=LEVELS,
                    tokens=LOSS_TOKENS)
    _scaled_kl_loss(p, actors)
    p.assert_stated("critic/vf_loss", O2.obs(critics, "critic/vf_loss", "agg", 0, 0.5 * scale), levels=LEVELS,
                    tokens=LOSS_TOKENS)
    for key in ("actor/pg_loss", "critic/vf_loss"):
        _, res = p.entry(key)
        p.check("loss_scale_factor" in res.fields["deviation"], (key, res.fields))
    # the monitors are not scaled: the same unweighted mean of micro-batch token means (entries since v0.6.0)
    p.assert_stated("actor/ppo_kl", O2.obs(actors, "actor/ppo_kl", "mm", 0), levels=LEVELS, tokens=MEAN_TOKENS)
    p.assert_stated("actor/pg_clipfrac", O2.obs(actors, "actor/pg_clipfrac", "mm", 1), levels=LEVELS,
                    tokens=MEAN_TOKENS)
    p.assert_stated("critic/vf_clipfrac", O2.obs(critics, "critic/vf_clipfrac", "mm", 0), levels=LEVELS,
                    tokens=MEAN_TOKENS)
    p.check(all(0 < u.metrics["actor/pg_clipfrac"] < 1 for u in actors), "the clip fires, not always")


@proof("verl", trainer="ppo", release="0.6.1", config=dict(V061, **{"actor_rollout_ref.actor.kl_loss_type": "kl"}))
def test_v061_kl_loss_k1_is_scaled_as_the_default(p):
    """actor.kl_loss_type kl (k1) at 0.6.1: kl_penalty computes another per-token value, reduced as the default's."""
    _scaled_kl_loss(p, _actors(p, kl_loss_type="kl"))


@proof("verl", trainer="ppo", release="0.6.1", config=dict(V061, **{"actor_rollout_ref.actor.kl_loss_type": "mse"}))
def test_v061_kl_loss_k2_is_scaled_as_the_default(p):
    """actor.kl_loss_type mse (k2) at 0.6.1; every per-token value a square."""
    actors = _actors(p, kl_loss_type="mse")
    _scaled_kl_loss(p, actors)
    p.check(all(v >= 0 for u in actors for mini in u.cap.batch("agg", 1)[0] for r in mini for m in r for s in m
                for v in s), "k2 is a square")


@proof("verl", trainer="ppo", release="0.6.1", config=dict(V061, **{"actor_rollout_ref.actor.kl_loss_type": "abs"}))
def test_v061_kl_loss_abs_is_scaled_as_the_default(p):
    """actor.kl_loss_type abs at 0.6.1: |log pi - log pi_ref| per token."""
    actors = _actors(p, kl_loss_type="abs")
    _scaled_kl_loss(p, actors)
    p.check(all(v >= 0 for u in actors for mini in u.cap.batch("agg", 1)[0] for r in mini for m in r for s in m
                for v in s), "abs is not negative")


@proof("verl", trainer="ppo", release="0.6.0", config=BASE)
def test_v060_mismatch_kls_are_token_means_over_the_whole_batch(p):
    """mismatch/mismatch_kl, mismatch/mismatch_k3_kl (v0.6.0 only; renamed rollout_corr/ in v0.6.1): the trainer's
    compute_rollout_importance_weights_and_add_to_batch (ray_trainer.py@v0.6.0:922-962, once per step on the driver)
    -> mismatch_helper.compute_mismatch_metrics: masked_mean of rollout_log_prob - old_log_prob and of the k3 matrix
    over the whole batch's valid tokens at once (mismatch_helper.py@v0.6.0:440,446), fingerprinted against the
    matrices veRL averaged, in three layouts of the same sequences."""
    for seed in (7, 8):
        run = O2.run_mismatch(seed)
        p.check(len(run.calls) == 2, f"compute_mismatch_metrics' whole-batch masked_means: {len(run.calls)}")
        kl, k3 = run.calls
        p.assert_stated("mismatch/mismatch_kl", O2.layouts(run.metrics["mismatch/mismatch_kl"], kl),
                        levels=("micro_batches", "processes"), tokens=MEAN_TOKENS)
        p.assert_stated("mismatch/mismatch_k3_kl", O2.layouts(run.metrics["mismatch/mismatch_k3_kl"], k3),
                        levels=("micro_batches", "processes"), tokens=MEAN_TOKENS)
        p.check(all(v >= 0 for s in k3 for v in s), "k3 is not negative")


# ------------------------------------------------------------------------------------------------ 0.4.1
V041 = V061


def _last_kl_loss(p, actors: list[O.Update], index: int = 1) -> None:
    """actor/kl_loss up to v0.4.1: dp_actor.py@v0.4.1:504 assigns agg_loss(kld) of each micro-batch to the metric
    (no append), so the last micro-batch of the last mini-batch and epoch is what update_policy returns, and
    DataProto.concat keeps the first worker's meta_info: rank 0's. Fingerprinted on veRL's captured kld matrices."""
    p.check(all(isinstance(u.per_rank[0]["actor/kl_loss"], float) for u in actors), "one number, not a list")
    p.assert_stated("actor/kl_loss", O2.obs(actors, "actor/kl_loss", "agg", index), levels=LEVELS,
                    tokens=LOSS_TOKENS)


@proof("verl", trainer="ppo", release="0.4.1", config=V041)
def test_v041_kl_loss_is_rank_zeros_last_micro_batch_and_critic_lr_the_next_steps(p):
    """verl 0.4.1 (entries of v0.2..v0.4.1): actor/kl_loss the last micro-batch's agg_loss of rank 0 (default
    low_var_kl); critic/lr through fsdp_workers.py@v0.4.1 CriticWorker.update_critic, which steps the scheduler and
    then reads get_last_lr() (:1126-1128): the rate the next step uses, one scheduler step ahead of the one the
    step's optimizer steps used (the actor's, read before its scheduler step from v0.4.0, checked the other way)."""
    _last_kl_loss(p, _actors(p))
    run = O.run_worker("critic")
    for logged, used, after in zip(run.logged, run.used, run.after):
        p.check(len(set(used)) == 1 and close(logged, after) and not close(logged, used[0]), (logged, used, after))
    p.assert_stated("critic/lr", run.logged[-1], O2.one_value(run.logged[-1]), levels=())
    _, res = p.entry("critic/lr")
    p.check(res.fields["snapshot"] == "after_scheduler_step", res.fields)
    actor = O.run_worker("actor")
    for logged, used, after in zip(actor.logged, actor.used, actor.after):
        p.check(len(set(used)) == 1 and close(logged, used[0]) and not close(logged, after), (logged, used, after))
    p.assert_stated("actor/lr", actor.logged[-1], O2.one_value(actor.logged[-1]), levels=())
    _, res = p.entry("actor/lr")
    p.check(res.fields["snapshot"] == "before_scheduler_step", res.fields)


@proof("verl", trainer="ppo", release="0.4.1", config=dict(V041, **{"actor_rollout_ref.actor.kl_loss_type": "kl"}))
def test_v041_kl_loss_k1_is_the_last_micro_batch(p):
    """actor.kl_loss_type kl (k1) at 0.4.1: another per-token value, the same assignment."""
    _last_kl_loss(p, _actors(p, kl_loss_type="kl"))


@proof("verl", trainer="ppo", release="0.4.1", config=dict(V041, **{"actor_rollout_ref.actor.kl_loss_type": "mse"}))
def test_v041_kl_loss_k2_is_the_last_micro_batch(p):
    """actor.kl_loss_type mse (k2) at 0.4.1."""
    _last_kl_loss(p, _actors(p, kl_loss_type="mse"))


@proof("verl", trainer="ppo", release="0.4.1", config=dict(V041, **{"actor_rollout_ref.actor.kl_loss_type": "abs"}))
def test_v041_kl_loss_abs_is_the_last_micro_batch(p):
    """actor.kl_loss_type abs at 0.4.1."""
    _last_kl_loss(p, _actors(p, kl_loss_type="abs"))


# ------------------------------------------------------------------------------------------------ 0.3.0.post1
V030 = V061


@proof("verl", trainer="ppo", release="0.3.0.post1", config=V030)
def test_v030_update_logs_rank_zeros_micro_batch_entropy_and_the_next_lr(p):
    """verl 0.3.0.post1 (entries of v0.1rc..v0.3.0.post1, v0.2..v0.3.0.post1): dp_actor.update_policy appends each
    micro-batch's masked_mean(entropy) as actor/entropy_loss (dp_actor.py@v0.3.0.post1:294,319) and DataProto.concat
    keeps the first worker's meta_info: the mean over rank 0's micro-batches of every mini-batch and epoch; the
    kl_loss assigned per micro-batch (:311, the last one's); fsdp_workers.py@v0.3.0.post1 update_actor steps the
    scheduler before get_last_lr() (:463-465): actor/lr is the rate of the next step. flash_attn and the cuda
    device queries are stand-ins (proofs_verl_old2.flash_attn_stand_in: the remove-padding forward never runs)."""
    with O2.flash_attn_stand_in():
        actors = _actors(p)
        # masked_mean calls of a micro-batch: compute_policy_loss's ppo_kl, pg_loss, pg_clipfrac (core_algos.py@
        # v0.3.0.post1:296-302), then dp_actor's entropy and kl_loss
        p.check(all(len(rec["mm"]) == 5 and not rec["agg"] for u in actors for m in u.cap.micro.values()
                    for rec in m), "five masked_means per micro-batch, no agg_loss")
        p.assert_stated("actor/entropy_loss", O2.obs(actors, "actor/entropy_loss", "mm", 3), levels=LEVELS,
                        tokens=MEAN_TOKENS)
        p.assert_stated("actor/kl_loss", O2.obs(actors, "actor/kl_loss", "mm", 4), levels=LEVELS, tokens=MEAN_TOKENS)
        p.assert_stated("actor/pg_loss", O2.obs(actors, "actor/pg_loss", "mm", 1), levels=LEVELS, tokens=LOSS_TOKENS)
        p.assert_stated("actor/ppo_kl", O2.obs(actors, "actor/ppo_kl", "mm", 0), levels=LEVELS, tokens=MEAN_TOKENS)
        run = O.run_worker("actor")
    for logged, used, after in zip(run.logged, run.used, run.after):
        p.check(len(set(used)) == 1 and close(logged, after) and not close(logged, used[0]), (logged, used, after))
    p.assert_stated("actor/lr", run.logged[-1], O2.one_value(run.logged[-1]), levels=())
    _, res = p.entry("actor/lr")
    p.check(res.fields["snapshot"] == "after_scheduler_step", res.fields)


def _reward_kl(p, kl_penalty: str) -> None:
    """critic/kl, critic/kl_coeff up to v0.3.0.post1: ray_trainer.py@v0.3.0.post1:136-166 apply_kl_penalty, on the
    driver's whole batch: masked_mean(kld, mask, axis=-1) per sequence, then torch.mean over the sequences (a mean
    of per-sequence token means); the coefficient is kl_ctrl.value read before kl_ctrl.update. Fingerprinted on the
    per-token kld veRL averaged, in three layouts of the same sequences."""
    runs = [O2.run_apply_kl_penalty(kl_penalty, seed=s) for s in (7, 8)]
    for run in runs:
        p.assert_stated("critic/kl", O2.layouts(run.metrics["critic/kl"], run.kld),
                        levels=("micro_batches", "processes"), tokens=MEAN_TOKENS)
    coef = runs[0].metrics["critic/kl_coeff"]
    p.check(not close(coef, runs[0].coef_after), "the adaptive controller moved the coefficient after the read")
    p.assert_stated("critic/kl_coeff", coef, O2.one_value(coef), levels=())
    _, res = p.entry("critic/kl_coeff")
    p.check(res.fields["snapshot"] == "rollout", res.fields)


@proof("verl", trainer="ppo", release="0.3.0.post1", config=V030)
def test_v030_reward_kl_is_a_mean_of_sequence_means(p):
    """algorithm.kl_penalty kl (k1, the default) at 0.3.0.post1."""
    _reward_kl(p, "kl")


@proof("verl", trainer="ppo", release="0.3.0.post1", config=dict(V030, **{"algorithm.kl_penalty": "low_var_kl"}))
def test_v030_reward_kl_k3_is_a_mean_of_sequence_means(p):
    """algorithm.kl_penalty low_var_kl (k3) at 0.3.0.post1."""
    _reward_kl(p, "low_var_kl")


@proof("verl", trainer="ppo", release="0.3.0.post1", config=dict(V030, **{"algorithm.kl_penalty": "mse"}))
def test_v030_reward_kl_k2_is_a_mean_of_sequence_means(p):
    """algorithm.kl_penalty mse (k2) at 0.3.0.post1."""
    _reward_kl(p, "mse")


@proof("verl", trainer="ppo", release="0.3.0.post1", config=dict(V030, **{"algorithm.kl_penalty": "abs"}))
def test_v030_reward_kl_abs_is_a_mean_of_sequence_means(p):
    """algorithm.kl_penalty abs at 0.3.0.post1."""
    _reward_kl(p, "abs")


def _seqs(values: list[float]) -> list:
    return [[float(v)] for v in values]


@proof("verl", trainer="ppo", release="0.3.0.post1", config=V030)
def test_v030_test_score_pools_the_validation_samples_of_a_source(p):
    """val/test_score/{data_source} (up to v0.3.0.post1): RayPPOTrainer._validate (ray_trainer.py@v0.3.0.post1:
    486-573) concatenates the reward tensors of every validation batch, sums each sample's row and takes np.mean
    of the source's samples (:561-571): one mean over every sample of the source, whatever batch it was in, not a
    mean of the batches' means. Fingerprinted on the scores the reward function returned, grouped by the validation
    batches (as one rank's micro-batches, and split over two ranks) and sorted into uneven groups."""
    for seed in (7, 8):
        run = O2.run_validate(seed)
        p.check(set(run.metrics) == {"val/test_score/a", "val/test_score/b"}, run.metrics)
        for src, batches in run.scores.items():
            logged = run.metrics[f"val/test_score/{src}"]
            flat = sorted(v for b in batches for v in b)
            cut = ([flat[:1], flat[1:4]], [flat[4:6], flat[6:]])                 # two ranks, uneven groups
            # [step][mini][rank][batch]; the first (uneven at both levels) is the shape the levels are checked on
            observed = [(logged, [[[[_seqs(c) for c in rank] for rank in cut]]]),
                        (logged, [[[[_seqs(b) for b in batches]]]]),
                        (logged, [[[[_seqs(batches[0])], [_seqs(b) for b in batches[1:]]]]])]
            p.assert_stated(f"val/test_score/{src}", observed, levels=("micro_batches", "processes"),
                            tokens=("per_seq",))


# ------------------------------------------------------------------------------------------------ actor/grad_norm
ONE_EPOCH = dict(V030, **{"actor_rollout_ref.actor.ppo_epochs": 1})


@proof("verl", trainer="ppo", release="0.3.0.post1", config=ONE_EPOCH)
def test_v030_grad_norm_is_each_epochs_last_mini_batch(p):
    """actor/grad_norm at v0.3.0.rc0-v0.3.0.post1: update_policy appends the optimizer step's pre-clip norm after the
    mini-batch loop (dp_actor.py@v0.3.0.post1:326-328), so each PPO epoch contributes its last mini-batch's norm:
    with ppo_epochs 1 the last of the step's mini-batches (fingerprinted: not their mean); with 2 epochs the mean of
    each epoch's last (the entry's deviation; checked as arithmetic on the norms veRL's own steps returned)."""
    with O2.flash_attn_stand_in():
        ones = [O.run_update("actor", seed=s, ppo_epochs=1) for s in SEEDS]
        two = O.run_update("actor", seed=7)
    one, norms = ones[0], ones[0].cap.norms[0]
    p.check(all(len(u.cap.norms[0]) == 2 and len(set(u.cap.norms[0])) == 2 for u in ones), [u.cap.norms for u in ones])
    p.assert_stated("actor/grad_norm", [(u.metrics["actor/grad_norm"], O2.norm_steps(u.cap.norms[0])) for u in ones],
                    levels=(), mini=("mean", "last", "sum", "max", "min"), rel=1e-6)
    p.check(not close(one.metrics["actor/grad_norm"], sum(norms) / 2), "not the mini-batches' mean")
    four = two.cap.norms[0]
    p.check(len(four) == 2 * O.EPOCHS, four)
    p.check(close(two.metrics["actor/grad_norm"], (four[1] + four[3]) / 2)
            and not close(two.metrics["actor/grad_norm"], sum(four) / 4), (two.metrics["actor/grad_norm"], four))


@proof("verl", trainer="ppo", release="0.5.0", config=V030)
def test_v050_grad_norm_is_the_mean_over_every_optimizer_step(p):
    """actor/grad_norm from v0.4.0 (legacy workers): appended at every mini-batch's optimizer step
    (dp_actor.py@v0.4.0:436-438, the same at 0.5.0) and averaged by reduce_metrics over mini-batches x epochs."""
    two = O.run_update("actor", seed=7)
    four = two.cap.norms[0]
    p.check(len(four) == 2 * O.EPOCHS and len(set(four)) == 4, four)
    p.assert_stated("actor/grad_norm", two.metrics["actor/grad_norm"], O2.norm_steps(four), levels=(),
                    mini=("mean", "last", "sum", "max", "min"), rel=1e-6)


# ------------------------------------------------------------------------------------------------ 0.9.1 (in process)
@proof("verl", trainer="ppo", release="0.9.1", config={})
def test_vf_explained_var_is_one_explained_variance_of_the_valid_tokens(p):
    """critic/vf_explained_var (v0.2..now) with veRL 0.9.1's own compute_data_metrics (metric_utils.py@v0.9.1, the
    driver's whole batch): fingerprinted (``stat: explained_var``, tests/_support/fingerprint.py) on the
    (return, value) pairs of the valid tokens veRL was given, in three layouts of the same sequences: one explained
    variance over every valid token at once, not a mean of groups' explained variances nor one over each
    sequence's first token."""
    import torch
    from verl import DataProto
    from verl.trainer.ppo import metric_utils

    from _support import framework_code as F
    p.check(F.release("verl") == "0.9.1", F.release("verl"))     # the pinned release, in this process
    full = DataProto.concat([O.batch(r, 7) for r in range(O.WORLD)])
    d = full.batch
    d["prompts"] = d["input_ids"][:, :O.PROMPT_W]
    d["token_level_scores"] = d["advantages"].clone()
    d["token_level_rewards"] = d["advantages"].clone()
    logged = float(metric_utils.compute_data_metrics(full, use_critic=True)["critic/vf_explained_var"])
    mask = d["response_mask"]
    pairs = [list(zip(r, v)) for r, v in zip(O._ragged(d["returns"], mask), O._ragged(d["values"], mask))]
    observed = O2.layouts(logged, [[tuple(t) for t in s] for s in pairs])
    found = p.assert_stated("critic/vf_explained_var", observed, levels=("micro_batches", "processes"),
                            tokens=("token_mean", "per_seq"),
                            stats=("explained_var",), rel=1e-5)
    p.check((found.tokens, found.stat, found.micro_batches, found.processes) == ("token_mean", "explained_var",
                                                                                  "none", "none"), found)
    p.check(bool(torch.isfinite(torch.tensor(logged))) and 0 < logged < 1, logged)


# ------------------------------------------------------------------------------------------------ 0.2.0.post2
@proof("verl", trainer="ppo", release="0.2.0.post2", config=V030)
def test_v020_mfu_is_rank_zeros_and_the_lrs_the_next_steps(p):
    """verl 0.2.0.post2 (entries of v0.2..v0.2.0.post2, v0.2..v0.3.0.post1, v0.2..v0.4.1): fsdp_workers.py@
    v0.2.0.post2 update_actor / update_critic put each rank's mfu/actor, mfu/critic (estimated flops over the rank's
    own timer of the update, :432,819) in the worker's meta_info, and DataProto.concat keeps the first worker's
    (protocol.py@v0.2.0.post2:545): rank 0's value, not one every rank holds (made-up per-rank flops, rank 0's the
    smaller in one step and the larger in the other); actor/lr, critic/lr read after the scheduler's step
    (:434-435,821-822). flash_attn, the cuda device queries and the batch's moves to cuda are stand-ins
    (proofs_verl_old2.flash_attn_stand_in, cuda_moves_stay_on_cpu)."""
    with O2.flash_attn_stand_in(), O2.cuda_moves_stay_on_cpu():
        runs = {role: O.run_worker(role) for role in ("actor", "critic")}
    for role, run in runs.items():
        for logged, used, after in zip(run.logged, run.used, run.after):
            p.check(len(set(used)) == 1 and close(logged, after) and not close(logged, used[0]),
                    (role, logged, used, after))
        p.assert_stated(f"{role}/lr", run.logged[-1], O2.one_value(run.logged[-1]), levels=())
        _, res = p.entry(f"{role}/lr")
        p.check(res.fields["snapshot"] == "after_scheduler_step", (role, res.fields))
        p.assert_stated(f"mfu/{role}", O2.per_rank(run, f"mfu/{role}"), levels=(), tokens=("none",))


@proof("verl", trainer="ppo", release="0.2.0.post2", config=ONE_EPOCH)
def test_v020_grad_norm_is_the_mean_over_the_mini_batches(p):
    """actor/grad_norm up to v0.2.0.post2: update_policy appends each mini-batch's pre-clip norm at its optimizer
    step (dp_actor.py@v0.2.0.post2:285-287; its mini-batch iterator has no PPO-epoch loop: ppo_epochs is not read)
    and reduce_metrics averages them, DataProto.concat keeping rank 0's list: the mean over rank 0's mini-batches,
    not the last (v0.3.0's), their sum or an extreme. Four batches, so no single selection fits them all."""
    with O2.flash_attn_stand_in(), O2.cuda_moves_stay_on_cpu():
        runs = [O.run_update("actor", seed=s, ppo_epochs=1) for s in SEEDS]
    p.check(all(len(u.cap.norms[0]) == O.N_PER_RANK // O.MINI and len(set(u.cap.norms[0])) == 2 for u in runs),
            [u.cap.norms for u in runs])
    p.assert_stated("actor/grad_norm", [(u.metrics["actor/grad_norm"], O2.norm_steps(u.cap.norms[0])) for u in runs],
                    levels=(), mini=("mean", "last", "sum", "max", "min"), rel=1e-6)
    u = runs[0]
    p.check(not close(u.metrics["actor/grad_norm"], u.cap.norms[0][-1]), "not the last mini-batch's (v0.3.0's)")
    p.check(u.cap.norms[0] != u.cap.norms[1], "the ranks' norms differ (rank 0's are the logged ones)")


# ------------------------------------------------------------------------------------------------ SFT (0.5.0)
SFT = {"data.balance_dp_token": False, "trainer.n_gpus_per_node": O.WORLD, "trainer.nnodes": 1}


@proof("verl", trainer="sft", release="0.5.0", config=SFT)
def test_v050_sft_loss_is_the_ranks_mean_of_micro_batch_token_means(p):
    """verl 0.5.0's FSDP SFT trainer (entries of v0.1rc..v0.7.0; fsdp_sft_trainer.py@v0.5.0): training_step adds
    each micro-batch's token mean (_compute_loss_and_backward: sum over the loss-masked tokens / their count, :442)
    divided by the micro-batch count (:461-462) and all-reduces it with ReduceOp.AVG (:490-491): the unweighted
    mean over micro-batches and ranks of micro-batch token means; train/lr(1e-3) is the scheduler's rate times 1e3
    read after its step (:482-485, 495); val/loss the mean over validation batches of each batch's token mean
    all-reduced (AVG) over the ranks (validation_step :497-506 and fit()'s lines :743-752). Fingerprinted on the
    per-token losses torch's CrossEntropyLoss returned inside veRL's code (proofs_verl_old2.run_sft: two simulated
    ranks, 3 uneven micro-batches each)."""
    runs = [O2.run_sft(seed) for seed in (7, 8)]
    observed = [(logged["train/loss"], [[toks]]) for run in runs for logged, toks in zip(run.logged, run.tokens)]
    for run in runs:
        p.check(all(len({r["train/loss"] for r in ranks}) == 1 for ranks in run.per_rank), "one value on every rank")
    p.assert_stated("train/loss", observed, levels=("micro_batches", "processes"), tokens=LOSS_TOKENS)
    run = runs[0]
    for logged, used, after in zip(run.logged, run.lr_used, run.lr_after):
        p.check(close(logged["train/lr(1e-3)"], after * 1e3) and not close(logged["train/lr(1e-3)"], used * 1e3),
                (logged, used, after))
    lr = run.logged[-1]["train/lr(1e-3)"]
    p.assert_stated("train/lr(1e-3)", lr, O2.one_value(lr), levels=())
    entry, res = p.entry("train/lr(1e-3)")
    p.check(res.fields["snapshot"] == "after_scheduler_step" and entry.scale == 0.001,
            (res.fields, entry.scale))
    # val/loss: [step][validation batch][rank][one micro-batch]
    val = [(r.val_loss, [[[[r.val_tokens[rank][v]] for rank in range(O.WORLD)] for v in range(2)]]) for r in runs]
    p.assert_stated("val/loss", val, levels=("mini_batches", "processes"), tokens=LOSS_TOKENS)


# ------------------------------------------------------------------------------------------------ 0.4.0
@proof("verl", trainer="ppo", release="0.4.0", config=V061)
def test_v040_entropy_loss_is_the_old_log_prob_passs_agg_loss_over_the_batch(p):
    """actor/entropy_loss (v0.4.0 only; renamed actor/entropy in v0.4.1): ray_trainer.py@v0.4.0:1064-1069, on the
    driver, agg_loss of the entropies the old-log-prob pass returned over the whole batch with actor.loss_agg_mode
    (each rank's DataParallelPPOActor.compute_log_prob, concatenated; fit()'s own lines run as is,
    proofs_verl_old.run_old_log_prob): one number over every valid token, in three layouts of the sequences."""
    run = O.run_old_log_prob()
    p.check(set(run.metrics) == {"actor/entropy_loss"}, run.metrics)
    p.assert_stated("actor/entropy_loss", O2.layouts(run.metrics["actor/entropy_loss"], run.entropys),
                    levels=("micro_batches", "processes"), tokens=LOSS_TOKENS)
