"""Fingerprint proofs of mappings/trl.yaml's entries of TRL's step()-based PPOTrainer (trainer ``ppo_legacy``,
v0.2.0..v0.11.4) and of the RLOOTrainer of its time, run at trl 0.11.4 and (legacy PPO) 0.5.0 and 0.2.1
(tests/releases.txt: each with the transformers and the other companions of its date; each proof runs in a child
process whose sys.path starts with the release: tests/_support/releases.py). The release's own code runs on a tiny
model on CPU; every logged value is matched against every candidate reduction of the values TRL itself computed and
reduced (tests/_support/proofs_trl_legacy.py records them), and the candidate that fits must be the one the entry
states.

* legacy PPO: batch_size 8, mini_batch_size 2 (the micro-batch: one ``train_minibatch`` call),
  gradient_accumulation_steps 2 (an optimizer step every backward batch of 4), ppo_epochs 2: 8 micro-batches of
  uneven response-token counts per step, 3 steps (3 observations of each key). The rollout keys (objective/*,
  ppo/mean_*, tokens/*, env/*) are statistics of the step's batch; the update keys (ppo/loss/*, ppo/policy/*,
  ppo/returns/*, ppo/val/*) each micro-batch's token mean over its response tokens, averaged over the micro-batches
  of every epoch. At 0.11.4 also with kl_penalty mse and score_clip (the k2 KL entry, the clipped scores' entry); at
  0.5.0 the same run (objective/kl: logprobs - ref_logprobs; ppo/mean_scores of the raw scores); at 0.2.1 (one
  sequence per optimizer step, no masks) the v0.2.x entries: the per-sequence sum of the KL penalty, policykl's sign.
* RLOO at 0.11.4: per_device_train_batch_size 2, gradient_accumulation_steps 2, num_mini_batches 2, num_ppo_epochs 2,
  rloo_k 2, one row per update: the rollout keys, the update statistics (each micro-batch's value in TRL's
  ``*_stats[epoch, mini-batch, micro-batch]``, their mean), the EOS count, the learning rate and the episode counter.

Every proof runs on one process: its processes candidates are one computation (:func:`_stated`).
"""
from __future__ import annotations

import pytest

pytest.importorskip("trl")

from _support import fingerprint as FP  # noqa: E402
from _support.fingerprint import fingerprint  # noqa: E402
from _support.proven import close, proof  # noqa: E402

MINI = ("mean", "sum", "last", "max", "none")

# ------------------------------------------------------------------------------------------- legacy PPO at 0.11.4
PPO_LEGACY = dict(batch_size=8, mini_batch_size=2, gradient_accumulation_steps=2, ppo_epochs=2, learning_rate=1e-2,
                  log_with=None, kl_penalty="kl", use_score_scaling=False, score_clip=None, adap_kl_ctrl=True)
PPO_LEGACY_CONFIG = {k: PPO_LEGACY[k] for k in ("batch_size", "mini_batch_size", "gradient_accumulation_steps",
                                                "ppo_epochs", "kl_penalty", "use_score_scaling", "score_clip",
                                                "adap_kl_ctrl")}


def _stated(p, key, observed, **kw):
    """p.assert_stated on one process: its processes candidates (all, on one rank, the same computation) reduced to
    the pooled one besides the stated one (proven.Proving.assert_stated adds it), which keeps the fingerprint quick."""
    kw.setdefault("processes", ("none",))
    return p.assert_stated(key, observed, **kw)


def _scalar(v: float) -> list:
    return [[[[[[float(v)]]]]]]


def _assert_rollout(p, run, *, scaled: bool) -> None:
    """The rollout keys of every step: record_step_stats' statistics of the step's batch, log_stats' rewards."""
    from _support.proofs_trl_legacy import rows_of, seq_values

    def obs(key, values):
        return [(st.row[key], run.rollout_steps(st, values)) for st in run.steps]

    def masked(name, sign=1.0):
        return lambda st: rows_of(sign * st.rollout[name], st.rollout["masks"])

    def kl(st):       # the KL record_step_stats sums: compute_rewards' kls (v0.7.9+), logprobs - ref_logprobs before
        k = st.rollout
        return k["kls"] if "kls" in k else k["logprobs"] - k["ref_logprobs"]

    _stated(p, "objective/kl", obs("objective/kl", lambda st: rows_of(kl(st), st.rollout["masks"])), levels=())
    _stated(p, "objective/entropy", obs("objective/entropy", masked("logprobs", -1.0)), levels=())
    _stated(p, "ppo/mean_non_score_reward", obs("ppo/mean_non_score_reward", masked("non_score_reward")),
                    levels=())
    # the KL and its penalty over the response tokens only: every position of the window fits no reduction
    every = [(st.row["objective/kl"], run.rollout_steps(st, lambda s: rows_of(kl(s)))) for st in run.steps]
    with pytest.raises(AssertionError, match="no candidate"):
        fingerprint(every)
    p.check(True, "objective/kl over every position (padding and query included) fits no reduction")
    # the scores TRL holds (after use_score_scaling / score_clip when set) and the raw rewards log_stats is given
    _stated(p, "ppo/mean_scores", obs("ppo/mean_scores", lambda st: seq_values(st.rollout["scores"])),
                    tokens=("per_seq",), levels=())
    _stated(p, "ppo/std_scores", obs("ppo/std_scores", lambda st: seq_values(st.rollout["scores"])),
                    tokens=("per_seq",), stats=("std", "mean"), levels=())
    _stated(p, "env/reward_mean", obs("env/reward_mean", lambda st: seq_values(st.scores)), tokens=("per_seq",),
                    levels=())
    _stated(p, "env/reward_std", obs("env/reward_std", lambda st: seq_values(st.scores)), tokens=("per_seq",),
                    stats=("std", "mean"), levels=())
    raw = [float(s) for st in run.steps for s in st.scores]
    held = [float(s) for st in run.steps for s in st.rollout["scores"]]
    p.check(scaled != all(close(a, b, 1e-6) for a, b in zip(raw, held)),
            f"the scores TRL holds are {'not ' if not scaled else ''}the raw scores scaled: {raw[:3]} {held[:3]}")
    for what in ("queries", "responses"):
        def lengths(st, what=what):
            return seq_values([len(x) for x in st.rollout[what]])
        _stated(p, f"tokens/{what}_len_mean", obs(f"tokens/{what}_len_mean", lengths), tokens=("per_seq",),
                        levels=())
        _stated(p, f"tokens/{what}_len_std", obs(f"tokens/{what}_len_std", lengths), tokens=("per_seq",),
                        stats=("std", "mean"), levels=())
    # the KL coefficient the step's rewards were computed with (the adaptive controller updates it after)
    _stated(p, "objective/kl_coef", [(st.row["objective/kl_coef"], _scalar(st.rollout["kl_coef"]))
                                          for st in run.steps], tokens=("none",), levels=())
    with pytest.raises(AssertionError, match="no candidate"):
        fingerprint([(st.row["objective/kl_coef"], _scalar(st.kl_coef_after)) for st in run.steps], tokens=("none",))
    p.check(True, "the coefficient after the controller's update fits no reduction")


def _assert_updates(p, run) -> None:
    """The update keys of every step: each micro-batch's masked mean (PPOTrainer.loss), averaged over the step's
    micro-batches (record_step_stats: torch.mean over the stacked per-micro-batch values)."""
    from _support.proofs_trl_legacy import rows_of

    vf_coef = run.config["vf_coef"]
    # the recorders' order of loss()'s masked means is the one TRL returned its statistics in
    for st in run.steps:
        for m in st.micros:
            for stat, name, scale in (("loss/policy", "pg_loss", 1.0), ("loss/value", "vf_loss", 0.5),
                                      ("policy/entropy", "entropy", 1.0), ("policy/approxkl", "approxkl", 0.5),
                                      ("policy/policykl", "policykl", 1.0), ("policy/clipfrac", "pg_clipfrac", 1.0),
                                      ("returns/mean", "return_mean", 1.0), ("val/vpred", "vpred", 1.0),
                                      ("val/error", "error", 1.0), ("val/clipfrac", "vf_clipfrac", 1.0),
                                      ("val/mean", "value_mean", 1.0), ("policy/advantages_mean", "advantages_mean",
                                                                         1.0)):
                assert close(float(m.stats[stat]), scale * float(m.means[name].out), 1e-6), (stat, name)
            assert close(float(m.stats["returns/var"]), float(m.vars["return_var"].out), 1e-6)
            assert close(float(m.stats["val/var"]), float(m.vars["value_var"].out), 1e-6)
    p.check(True, "each micro-batch's statistics are the masked means recorded, in loss()'s order")
    p.check(all(len(st.micros) == 8 for st in run.steps), [len(st.micros) for st in run.steps])

    def token(name, scale=1.0):
        return lambda m: rows_of(scale * m.means[name].values, m.means[name].mask)

    def total(m):
        pg, vf = m.means["pg_loss"], m.means["vf_loss"]
        assert bool((pg.mask == vf.mask).all())
        return rows_of(pg.values + vf_coef * 0.5 * vf.values, pg.mask)

    def obs(key, values):
        return [(st.row[key], run.micro_steps(st, values)) for st in run.steps]

    for key, values in (("ppo/loss/policy", token("pg_loss")), ("ppo/loss/value", token("vf_loss", 0.5)),
                        ("ppo/loss/total", total), ("ppo/policy/entropy", token("entropy")),
                        ("ppo/policy/approxkl", token("approxkl", 0.5)), ("ppo/policy/policykl", token("policykl")),
                        ("ppo/policy/clipfrac", token("pg_clipfrac")),
                        ("ppo/policy/advantages_mean", token("advantages_mean")),
                        ("ppo/returns/mean", token("return_mean")), ("ppo/val/vpred", token("vpred")),
                        ("ppo/val/error", token("error")), ("ppo/val/clipfrac", token("vf_clipfrac")),
                        ("ppo/val/mean", token("value_mean"))):
        _stated(p, key, obs(key, values), levels=("micro_batches", "mini_batches"), mini=MINI, rel=1e-5)
    p.check(all(st.row["ppo/policy/clipfrac"] > 0 and st.row["ppo/val/clipfrac"] > 0 for st in run.steps),
            "nothing was clipped: weak")
    # the variances: each micro-batch's masked_var (unbiased, over its response tokens), one value per micro-batch
    for key, name in (("ppo/returns/var", "return_var"), ("ppo/val/var", "value_var")):
        def one(m, name=name):
            return [[float(m.vars[name].out)]]
        ob = obs(key, one)
        # (a pair of sequences drawn again in the second epoch has its variance again: the rollout's returns)
        p.check(all(len({round(float(m.vars[name].out), 6) for m in st.micros}) > 4 for st in run.steps),
                f"{key}: the micro-batches' variances are too even: weak")
        _stated(p, key, ob, tokens=("none", "per_seq"), levels=(), mini=MINI, rel=1e-5)
    for st in run.steps:
        r = st.row
        p.check(close(r["ppo/val/var_explained"], 1 - r["ppo/val/error"] / r["ppo/returns/var"], 1e-5),
                "ppo/val/var_explained is 1 - ppo/val/error / ppo/returns/var of the logged values")


def _assert_step(p, run) -> None:
    p.check(len(run.steps) == 3 and all(st.row for st in run.steps), "three steps, each logged")
    _assert_rollout(p, run, scaled=False)
    _assert_updates(p, run)
    _stated(p, "ppo/learning_rate", [(st.row["ppo/learning_rate"], _scalar(st.lr_before)) for st in run.steps],
                    tokens=("none",), levels=())
    with pytest.raises(AssertionError, match="no candidate"):
        fingerprint([(st.row["ppo/learning_rate"], _scalar(st.lr_after)) for st in run.steps], tokens=("none",))
    p.check(True, "the rate after the scheduler step fits no reduction")


@proof("trl", trainer="ppo_legacy", release="0.11.4", config=PPO_LEGACY_CONFIG)
def test_ppo_legacy_0_11_step_statistics(p, tmp_path):
    """TRL 0.11.4's PPOTrainer.step, 3 steps of 8 sequences (queries of 3-8 and responses of 2-9 tokens): the
    rollout KL and the sampled entropy are summed over each response's tokens and averaged over the sequences, the KL
    penalty is the token mean over the batch's response tokens, the scores' and the lengths' means and sample stds
    are over the sequences, the KL coefficient is the one the rewards were computed with, the learning rate the one
    before the scheduler steps; each update statistic is a micro-batch's token mean over its response tokens (the
    variances one masked_var per micro-batch), averaged over the 8 micro-batches of the 2 epochs."""
    from _support.proofs_trl_legacy import run_ppo_legacy
    run = run_ppo_legacy(tmp_path, **PPO_LEGACY)
    for st in run.steps:
        k = st.rollout
        p.check(bool(((k["logprobs"] - k["ref_logprobs"]) == k["kls"]).all()), "kl_penalty kl: kls = logp - ref")
    p.check(any(float(st.rollout["kls"].abs().sum()) > 0 for st in run.steps), "no KL to the reference: weak")
    _assert_step(p, run)


# use_score_scaling does not run at 0.11.4: step() calls self.running.std.to(...) (ppo_trainer.py@v0.11.4:688) on
# RunningMoments.std, a float since update() (trl/trainer/utils.py@v0.11.4:703, .item()): AttributeError. score_clip
# alone selects the scaled-or-clipped entry of ppo/mean_scores
PPO_LEGACY_MSE = {**PPO_LEGACY, "kl_penalty": "mse", "score_clip": 1.0}
PPO_LEGACY_MSE_CONFIG = {**PPO_LEGACY_CONFIG, "kl_penalty": "mse", "score_clip": 1.0}


@proof("trl", trainer="ppo_legacy", release="0.11.4", config=PPO_LEGACY_MSE_CONFIG)
def test_ppo_legacy_0_11_mse_kl_and_scaled_scores(p, tmp_path):
    """kl_penalty mse, score_clip 1.0: objective/kl is the k2 estimate (0.5 (logp - ref)^2) summed per response,
    averaged over the sequences; ppo/mean_scores and ppo/std_scores are the mean and sample std of the scores after
    the clip, env/reward_* of the raw scores given to log_stats."""
    from _support.proofs_trl_legacy import run_ppo_legacy
    run = run_ppo_legacy(tmp_path, **PPO_LEGACY_MSE)
    for st in run.steps:
        k = st.rollout
        p.check(bool(torch_close(0.5 * (k["logprobs"] - k["ref_logprobs"]) ** 2, k["kls"])), "kls are k2")
    p.check(any(abs(float(s)) == 1.0 for st in run.steps for s in st.rollout["scores"]), "no score clipped: weak")
    _assert_rollout(p, run, scaled=True)


def torch_close(a, b) -> bool:
    import torch
    return bool(torch.allclose(a, b, rtol=1e-6, atol=1e-9))


# ------------------------------------------------------------------------------------------- RLOO at 0.11.4
RLOO_LEGACY = dict(per_device_train_batch_size=2, gradient_accumulation_steps=2, num_mini_batches=2, num_ppo_epochs=2,
                   rloo_k=2, total_episodes=32, response_length=8, stop_token="eos",
                   local_rollout_forward_batch_size=8, lr_scheduler_type="linear", kl_coef=0.1,
                   missing_eos_penalty=1.0)
RLOO_LEGACY_CONFIG = {k: RLOO_LEGACY[k] for k in ("gradient_accumulation_steps", "num_mini_batches", "num_ppo_epochs",
                                                  "rloo_k", "kl_coef")}


@proof("trl", trainer="rloo", release="0.11.4", config=RLOO_LEGACY_CONFIG)
def test_rloo_0_11_rollout_and_update_statistics(p, tmp_path):
    """TRL 0.11.4's RLOOTrainer, 4 updates of 4 prompts x rloo_k 2 (8 responses: 2 epochs x 2 mini-batches x 2
    micro-batches of 2), one row per update: objective/kl and objective/non_score_reward are the KL (its penalty)
    summed over each response's tokens, averaged over the responses; objective/entropy the sampled tokens' -log p
    summed over every response position, the padding's INVALID_LOGPROB (1.0) included; the scores and the shaped
    rewards per-sequence means; the update statistics each micro-batch's value (a mean over its sequences of the
    sequence-level ratio's loss, clip indicator and k2; a mean over every response position of the entropy and of the
    per-token ratio), averaged over the 8 micro-batches; val/num_eos_tokens sums the responses' EOS tokens; lr is the
    rate before the scheduler steps; episode counts responses."""
    from _support.proofs_trl_legacy import rows_of, run_rloo_legacy, seq_values
    run = run_rloo_legacy(tmp_path, **RLOO_LEGACY)
    ups = run.updates
    p.check(len(ups) == 4 and all(len(u.micros) == 8 for u in ups), [len(u.micros) for u in ups])
    # a response whose first token is the pad token has no valid token (sequence_length -1): TRL counts it in its
    # means over sequences, which the fingerprint's batches (sequences of >= 1 value) cannot hold
    full = [u for u in ups if bool((u.rollout["sequence_lengths"] >= 0).all())]
    p.check(len(full) >= 3, f"{len(full)} of {len(ups)} updates without an empty response")
    lengths = {int(v) for u in ups for v in u.rollout["sequence_lengths"]}
    p.check(len(lengths) > 2, f"the responses have even lengths: {lengths}")
    p.check(any(bool(u.rollout["padding_mask"].any()) for u in full), "no padding: the entropy proof would be weak")
    kl_coef = run.config["kl_coef"]

    def obs_rollout(key, values, ups=full):
        return [(u.row[key], run.rollout_steps(u, values)) for u in ups]

    def valid(name, scale=1.0):
        return lambda r: rows_of(scale * r[name], ~r["padding_mask"])

    _stated(p, "objective/kl", obs_rollout("objective/kl", valid("kl")), levels=())
    _stated(p, "objective/non_score_reward",
                    obs_rollout("objective/non_score_reward", valid("kl", -kl_coef)), levels=())
    every = obs_rollout("objective/entropy", lambda r: rows_of(-r["logprobs"]))
    _stated(p, "objective/entropy", every, levels=())
    with pytest.raises(AssertionError, match="no candidate"):
        fingerprint(obs_rollout("objective/entropy", valid("logprobs", -1.0)), tokens=("seq_mean_token_sum",))
    p.check(True, "objective/entropy over the valid tokens only fits no reduction")
    _stated(p, "objective/scores", obs_rollout("objective/scores", lambda r: seq_values(r["scores"]), ups),
                    tokens=("per_seq",), levels=())
    _stated(p, "objective/rlhf_reward",
                    obs_rollout("objective/rlhf_reward", lambda r: seq_values(r["rlhf_reward"].flatten()), ups),
                    tokens=("per_seq",), levels=())

    def micro(fn, mask=None):
        def values(m, r):
            x = fn(m)
            if x.dim() == 1:                         # one value per sequence
                return seq_values(x)
            return rows_of(x, None if mask is None else ~r[mask][m["micro_batch_inds"]])
        return values

    def obs_update(key, values):
        return [(u.row[key], run.micro_steps(u, values)) for u in full]

    for key, values in (
            ("loss/policy_avg", micro(lambda m: m["pg_loss_max"])),
            ("policy/clipfrac_avg", micro(lambda m: (m["pg_losses2"] > m["pg_losses"]).float())),
            ("policy/approxkl_avg", micro(lambda m: 0.5 * m["logprobs_diff"] ** 2)),
            # every response position, padding included: the micro-batches hold equal token counts
            ("policy/entropy_avg", micro(lambda m: m["entropy"])),
            ("val/ratio", micro(lambda m: m["new_ratio"]))):
        _stated(p, key, obs_update(key, values), levels=(), mini=MINI, rel=1e-5)
    p.check(any(u.row["policy/clipfrac_avg"] > 0 for u in ups), "nothing was clipped: weak")
    # val/ratio is the per-token ratio's mean, not the sequence-level ratio's (the one the loss clips)
    with pytest.raises(AssertionError, match="no candidate"):
        fingerprint(obs_update("val/ratio", micro(lambda m: m["ratio"])), mini=MINI)
    p.check(True, "val/ratio of the sequence-level ratio fits no reduction")
    # val/ratio_var: the unbiased variance of the 8 micro-batch mean ratios (2 epochs x 2 mini-batches x 2), gathered
    # into one list; not a variance per optimizer step combined
    var_kw = {"micro": (*FP.COMBINE, *FP.COMBINE_EXTRA), "mini": (*MINI, "var"), "processes": ("none", "driver")}
    ratios = obs_update("val/ratio_var", micro(lambda m: m["new_ratio"]))
    _stated(p, "val/ratio_var", ratios, levels=(), **var_kw)
    p.check(all(u.row["val/ratio_var"] > 0 for u in full), "every ratio_var is positive")
    with pytest.raises(AssertionError, match="no candidate"):       # the sequence-level ratio's variance is not it
        fingerprint(obs_update("val/ratio_var", micro(lambda m: m["ratio"])), **var_kw)
    p.check(True, "val/ratio_var of the sequence-level ratio fits no reduction")
    # RLOO has no critic: the value statistics' tensors are never written
    p.check(all(u.row["loss/value_avg"] == 0.0 and u.row["val/clipfrac_avg"] == 0.0 for u in ups),
            "loss/value_avg and val/clipfrac_avg are 0")

    eos = run.eos_token_id
    two = any(int((u.rollout["responses"] == eos).sum(1).max()) > 1 for u in ups)
    eos_stats = ("sum", "mean", "max") if two else ("sum", "mean")
    _stated(p, "val/num_eos_tokens",
                    obs_rollout("val/num_eos_tokens", lambda r: seq_values((r["responses"] == eos).sum(1)), ups),
                    tokens=("per_seq",), stats=eos_stats, levels=())
    p.check(len({u.row["val/num_eos_tokens"] for u in ups}) > 1, "every update logs the same EOS count: weak")

    before = [run.lr_initial, *run.lr_after[:-1]]
    _stated(p, "lr", [(u.row["lr"], _scalar(before[i])) for i, u in enumerate(ups)], tokens=("none",),
                    levels=())
    with pytest.raises(AssertionError, match="no candidate"):
        fingerprint([(u.row["lr"], _scalar(run.lr_after[i])) for i, u in enumerate(ups)], tokens=("none",))
    p.check(True, "the rate after the scheduler step fits no reduction")
    p.check(all(u.row["episode"] != u.global_step for u in ups), "episode is not the global step")
    _stated(p, "episode", [(u.row["episode"], _scalar(u.episode)) for u in ups], tokens=("none",), levels=())


# ------------------------------------------------------------------------------------------- legacy PPO at 0.5.0
PPO_LEGACY_05 = {k: v for k, v in PPO_LEGACY.items() if k not in ("use_score_scaling", "score_clip")}
PPO_LEGACY_05_CONFIG = {k: v for k, v in PPO_LEGACY_CONFIG.items() if k not in ("use_score_scaling", "score_clip")}


@proof("trl", trainer="ppo_legacy", release="0.5.0", config=PPO_LEGACY_05_CONFIG)
def test_ppo_legacy_0_5_step_statistics(p, tmp_path):
    """TRL 0.5.0's PPOTrainer.step (no score scaling yet; compute_rewards returns no KL: record_step_stats sums
    logprobs - ref_logprobs over each response, whatever kl_penalty is), the run of the 0.11.4 proof: the same
    reductions, and ppo/mean_scores the mean of the raw scores."""
    from _support.proofs_trl_legacy import run_ppo_legacy
    run = run_ppo_legacy(tmp_path, **PPO_LEGACY_05)
    p.check(all("kls" not in st.rollout for st in run.steps), "0.5.0's record_step_stats is given no kls")
    _assert_step(p, run)


# ------------------------------------------------------------------------------------------- legacy PPO at 0.2.1
PPO_021 = dict(batch_size=8, forward_batch_size=1, ppo_epochs=2, learning_rate=1e-2)
PPO_021_CONFIG = {k: PPO_021[k] for k in ("batch_size", "ppo_epochs")}


@proof("trl", trainer="ppo_legacy", release="0.2.1", config=PPO_021_CONFIG)
def test_ppo_legacy_0_2_step_statistics(p, tmp_path):
    """TRL 0.2.1's PPOTrainer.step, 3 steps of 8 sequences: one sequence per optimizer step (train_minibatch per
    sequence, 2 epochs: 16 per step), no masks (each sequence's response tokens are its whole population). The KL,
    the sampled entropy and the KL penalty (ppo/mean_non_score_reward: summed per sequence in v0.2.x) are per-sequence
    sums averaged over the sequences; policykl is the mean of logprob - old_logprob (the sign the later releases
    flip) over each sequence's tokens, averaged over the 16 optimizer steps, as the other update statistics."""
    from _support.proofs_trl_legacy import rows_of, run_ppo_021, seq_values
    steps = run_ppo_021(tmp_path, **PPO_021)
    p.check(len(steps) == 3 and all(len(st.micros) == 16 and st.row for st in steps), "3 steps of 16 updates, logged")

    def obs(key, values):
        return [(st.row[key], [[[[values(st.rollout)]]]]) for st in steps]

    def per_seq_tokens(fn):
        return lambda r: [[float(v) for v in fn(r, i)] for i in range(len(r["logprobs"]))]

    kl = per_seq_tokens(lambda r, i: r["logprobs"][i] - r["ref_logprobs"][i])
    _stated(p, "objective/kl", obs("objective/kl", kl), levels=())
    _stated(p, "objective/entropy", obs("objective/entropy", per_seq_tokens(lambda r, i: -r["logprobs"][i])),
            levels=())
    _stated(p, "ppo/mean_non_score_reward",
            obs("ppo/mean_non_score_reward", per_seq_tokens(lambda r, i: r["non_score_reward"][i])), levels=())
    _stated(p, "objective/kl_coef", [(st.row["objective/kl_coef"], _scalar(st.rollout["kl_coef"])) for st in steps],
            tokens=("none",), levels=())
    for key, stat in (("env/reward_mean", ("mean",)), ("env/reward_std", ("std", "mean"))):
        _stated(p, key, [(st.row[key], [[[[seq_values(st.scores)]]]]) for st in steps], tokens=("per_seq",),
                stats=stat, levels=())

    # each loss() call is one sequence and one optimizer step: the batch's optimizer-step level holds them
    def updates(values):
        return [(None, [[[[values(loc, stats)]] for loc, stats in st.micros]]) for st in steps]

    def one(fn):
        return lambda loc, stats: rows_of(fn(loc))

    for key, fn in (("ppo/policy/policykl", lambda m: m["logprob"] - m["old_logprobs"]),
                    ("ppo/loss/policy", lambda m: torch_max(m["pg_losses"], m["pg_losses2"])),
                    ("ppo/loss/value", lambda m: 0.5 * torch_max(m["vf_losses1"], m["vf_losses2"])),
                    ("ppo/policy/approxkl", lambda m: 0.5 * (m["logprob"] - m["old_logprobs"]) ** 2),
                    ("ppo/policy/clipfrac", lambda m: (m["pg_losses2"] > m["pg_losses"]).float()),
                    ("ppo/returns/mean", lambda m: m["returns"]), ("ppo/val/vpred", lambda m: m["vpred"]),
                    ("ppo/val/error", lambda m: (m["vpred"] - m["returns"]) ** 2),
                    ("ppo/val/clipfrac", lambda m: (m["vf_losses2"] > m["vf_losses1"]).float()),
                    ("ppo/val/mean", lambda m: m["values"])):
        batches = updates(one(fn))
        _stated(p, key, [(st.row[key], b) for st, (_n, b) in zip(steps, batches)], levels=("mini_batches",),
                mini=MINI, rel=1e-5)
    # the per-sequence variances (torch.var, unbiased): loss()'s own statistics, one value per optimizer step
    for key, name in (("ppo/returns/var", "returns/var"), ("ppo/val/var", "val/var")):
        batches = updates(lambda loc, stats, name=name: [[float(stats[name])]])
        _stated(p, key, [(st.row[key], b) for st, (_n, b) in zip(steps, batches)], tokens=("none", "per_seq"),
                levels=(), mini=MINI, rel=1e-5)
    p.check(all(st.row["ppo/policy/clipfrac"] > 0 and st.row["ppo/val/clipfrac"] > 0 for st in steps),
            "nothing was clipped: weak")


def torch_max(a, b):
    import torch
    return torch.max(a, b)


# ------------------------------------------------------------------------------------------- PPO (v2) at 1.12.0, k3
PPO_K3 = dict(per_device_train_batch_size=2, gradient_accumulation_steps=3, num_mini_batches=1, num_ppo_epochs=2,
              total_episodes=24, response_length=10, stop_token="eos", local_rollout_forward_batch_size=6,
              missing_eos_penalty=1.0, logging_steps=1, lr_scheduler_type="linear", learning_rate=5e-2,
              kl_estimator="k3")
PPO_K3_CONFIG = {k: PPO_K3[k] for k in ("gradient_accumulation_steps", "num_mini_batches", "num_ppo_epochs",
                                        "logging_steps", "kl_estimator")}


@proof("trl", trainer="ppo", release="1.12.0", config=PPO_K3_CONFIG)
def test_ppo_1_12_k3_kl(p, tmp_path):
    """TRL 1.12.0's PPOTrainer (trl.experimental.ppo) with kl_estimator k3 (tests/_support/proofs_trl_old.py's run):
    objective/kl is the k3 estimate ((exp(logr) - 1) - logr, logr = ref_logprobs - logprobs) summed over each
    response's tokens, averaged over the rollout's sequences."""
    import torch

    from _support.proofs_trl_old import rows_of, run_ppo
    run = run_ppo(tmp_path, **PPO_K3)
    # the first update's policy is the reference (its KL is float noise); and a response with no valid token
    # (sequence_length -1) counts in TRL's means over sequences, which the fingerprint's batches cannot hold
    ups = [u for u in run.updates[1:] if bool((u.rollout["sequence_lengths"] >= 0).all())]
    p.check(len(ups) >= 2, f"{len(ups)} of {len(run.updates)} updates without an empty response")
    for u in ups:
        r = u.rollout
        logr = (r["ref_logprobs"] - r["logprobs"])
        p.check(bool(torch.allclose(r["kl"], (logr.exp() - 1) - logr, rtol=1e-6, atol=1e-8)), "kl is k3")
    p.check(any(bool(u.rollout["padding_mask"].any()) for u in ups), "no padding: weak")
    obs = [(u.row["objective/kl"], run.rollout_steps(u, lambda r: rows_of(r["kl"], ~r["padding_mask"]))) for u in ups]
    _stated(p, "objective/kl", obs, levels=())
