"""Fingerprint proofs of mappings/trl.yaml's entries that end before the pinned TRL 1.16.0, run at older releases
(tests/releases.txt; each proof runs in a child process whose sys.path starts with the release:
tests/_support/releases.py). The release's own trainer trains a tiny model on CPU; every row it logs is matched
against every candidate reduction of the values TRL itself computed (tests/_support/proofs_trl_old.py,
tests/_support/proofs_trl.py), and the candidate that fits must be the one the entry of that release states.

* GRPO at 0.25.1 (the window run of tests/frameworks/test_proof_trl_grpo.py: gradient_accumulation_steps 2,
  logging_steps 3, num_iterations 2, beta 0.1): the token means (kl, entropy, clip_ratio/*: each process's token
  mean per micro-batch, averaged), the clip extremes, the completion lengths, reward, reward_std and loss.
* PPO at 1.12.0 (trl.experimental.ppo): per_device_train_batch_size 2, gradient_accumulation_steps 3,
  num_mini_batches 1, num_ppo_epochs 2 (each epoch one optimizer step of 3 micro-batches of uneven token counts),
  one row per update: the rollout keys (objective/*: per-sequence values of the rollout batch), the update
  statistics (each micro-batch's value in TRL's ``*_stats[epoch, mini-batch, micro-batch]``, their mean), the EOS
  count, the learning rate and the episode counter.
"""
from __future__ import annotations

import pytest

pytest.importorskip("trl")
pytest.importorskip("datasets")

from _support import fingerprint as FP  # noqa: E402
from _support.fingerprint import fingerprint  # noqa: E402
from _support.proofs_trl import masked, per_seq  # noqa: E402
from _support.proven import proof  # noqa: E402

WINDOWS = ("mean", "last", "sum", "none")
#: the candidates of a variance of the update statistics' values (val/ratio_var): every combination of the micro- and
#: mini-batches, the variance among them, and the ranks gathered into one list (the driver) among the processes
VAR_OFFERED = {"micro": (*FP.COMBINE, *FP.COMBINE_EXTRA), "mini": ("none", "mean", "sum", "last", "max", "var"),
               "processes": ("none", "all_reduce_mean", "driver")}
TOKEN_CANDIDATES = ("token_mean", "seq_mean_token_mean")
LOSS, GEN, SCORE = "_compute_loss", "_generate", "_generate_and_score_completions"

GRPO_WINDOW = dict(gradient_accumulation_steps=2, logging_steps=3, max_steps=12, num_iterations=2, beta=0.1,
                   epsilon=1e-3, epsilon_high=1e-3, per_device_train_batch_size=2, num_generations=2,
                   lr_scheduler_type="cosine_with_restarts", lr_scheduler_kwargs={"num_cycles": 5})
GRPO_CONFIG = {k: GRPO_WINDOW[k] for k in ("gradient_accumulation_steps", "logging_steps", "num_iterations", "beta")}


def _obs(run, key: str, fn: str, values) -> list:
    out = [(row[key], run.steps(i, fn, values)) for i, (_s, row) in enumerate(run.train_rows()) if key in row]
    assert out, f"no train row logged {key!r}"
    return out


@proof("trl", trainer="grpo", release="0.25.1", config=GRPO_CONFIG)
def test_grpo_0_25_keys_of_the_window_run(p, tmp_path):
    """TRL 0.25.1's GRPOTrainer (gradient_accumulation_steps 2, logging_steps 3, num_iterations 2): kl, entropy and
    clip_ratio/*_mean are each micro-batch's token mean over its completion tokens (completion_mask: 0.25.1 has no
    tool mask), gathered per process and averaged, then log() averages the row's 6 micro-batches unweighted; the
    clip extremes are the min (max) over processes of that token mean; the completion lengths and rewards are
    statistics of each generation batch, averaged over the row's generations; loss is HF's window mean of the
    steps' token means (loss_type dapo)."""
    from _support.proofs_trl_old import fix_optional_imports
    fix_optional_imports()
    from _support.proofs_trl import run_grpo
    run = run_grpo(tmp_path, **GRPO_WINDOW)
    rows = run.train_rows()
    p.check(run.windows == [(1, 3), (4, 6), (7, 9), (10, 12)], f"four rows of three steps: {run.windows}")
    for key, tensor in (("kl", "per_token_kl"), ("entropy", "entropies"),
                        ("clip_ratio/region_mean", "is_region_clipped"), ("clip_ratio/low_mean", "is_low_clipped"),
                        ("clip_ratio/high_mean", "is_high_clipped")):
        p.assert_stated(key, _obs(run, key, LOSS, masked(tensor, "completion_mask")), tokens=TOKEN_CANDIDATES,
                        mini=("none",), window=WINDOWS, levels=("micro_batches", "window"))
    p.check(any(r["clip_ratio/region_mean"] > 0 for _s, r in rows), "nothing was clipped: the proof would be weak")
    for key, tensor in (("clip_ratio/high_max", "is_high_clipped"), ("clip_ratio/low_min", "is_low_clipped")):
        obs = _obs(run, key, LOSS, masked(tensor, "completion_mask"))
        p.check(len({round(v, 9) for v, _ in obs} | {0.0}) > 1, f"{key}: every row logs 0: weak")
        p.assert_stated(key, obs, tokens=TOKEN_CANDIDATES, mini=("none",), window=WINDOWS,
                        levels=("micro_batches", "window"))
    p.assert_stated("loss", _obs(run, "loss", LOSS, masked("per_token_loss", "completion_mask")),
                    tokens=TOKEN_CANDIDATES, mini=("none",), window=WINDOWS, levels=("micro_batches", "window"),
                    rel=1e-5)
    gens = [c.step for c in run.calls if c.name == GEN]
    p.check(gens == [1, 3, 5, 7, 9, 11], f"a generation every num_iterations optimizer steps: {gens}")
    for stat in ("mean", "min", "max"):
        p.assert_stated(f"completions/{stat}_length",
                        _obs(run, f"completions/{stat}_length", GEN, per_seq("agg_completion_lengths")),
                        tokens=("per_seq",), stats=(stat,), mini=("none",), window=WINDOWS, levels=())
        term = per_seq("agg_completion_lengths", "agg_is_truncated", invert=True)
        p.assert_stated(f"completions/{stat}_terminated_length",
                        _obs(run, f"completions/{stat}_terminated_length", GEN, term),
                        tokens=("per_seq",), stats=(stat,), mini=("none",), window=WINDOWS, levels=())
    p.assert_stated("completions/clipped_ratio",
                    _obs(run, "completions/clipped_ratio", GEN, per_seq("agg_is_truncated")),
                    tokens=("per_seq",), mini=("none",), window=WINDOWS, levels=())
    p.assert_stated("reward", _obs(run, "reward", SCORE, per_seq("rewards")), tokens=("per_seq",), mini=("none",),
                    window=WINDOWS, levels=())
    # reward_std (scale_rewards 'group'): each completion's group std (TRL's std_rewards), their mean
    p.assert_stated("reward_std", _obs(run, "reward_std", SCORE, per_seq("std_rewards")), tokens=("per_seq",),
                    mini=("none",), window=WINDOWS, levels=())


RLOO = dict(gradient_accumulation_steps=2, logging_steps=3, max_steps=6, num_iterations=2, beta=0.05,
            per_device_train_batch_size=2, num_generations=2, epsilon=1e-3, epsilon_high=1e-3)
RLOO_CONFIG = {k: RLOO[k] for k in ("gradient_accumulation_steps", "logging_steps", "num_iterations", "beta")}


@proof("trl", trainer="rloo", release="0.25.1", config=RLOO_CONFIG)
def test_rloo_0_25_kl_rewards_and_entropy(p, tmp_path):
    """TRL 0.25.1's RLOOTrainer (GRPO's generation code, v0.22.0+): kl is each generation batch's k1 token mean of
    the sampling-time policy against the reference (per process, gathered and averaged), averaged over the row's
    generations; reward the mean of the KL-penalised rewards, reward_std the mean of the groups' stds; entropy the
    micro-batch token mean, averaged over micro-batches and steps."""
    from _support.proofs_trl_old import fix_optional_imports
    fix_optional_imports()
    from _support.proofs_trl import run_rloo
    run = run_rloo(tmp_path, **RLOO)
    gens = [c.step for c in run.calls if c.name == SCORE]
    p.check(gens == [1, 3, 5], f"a generation every num_iterations steps: {gens}")
    p.assert_stated("kl", _obs(run, "kl", SCORE, masked("per_token_kl", "completion_mask")),
                    tokens=TOKEN_CANDIDATES, mini=("none",), window=WINDOWS, levels=())
    p.assert_stated("entropy", _obs(run, "entropy", LOSS, masked("entropies", "completion_mask")),
                    tokens=TOKEN_CANDIDATES, mini=("none",), window=WINDOWS, levels=("micro_batches", "window"))
    p.assert_stated("reward", _obs(run, "reward", SCORE, per_seq("rewards")), tokens=("per_seq",), mini=("none",),
                    window=WINDOWS, levels=())
    p.assert_stated("reward_std", _obs(run, "reward_std", SCORE, per_seq("std_rewards")), tokens=("per_seq",),
                    mini=("none",), window=WINDOWS, levels=())
    p.check(any(c.locals["kl"].abs().sum() > 0 for c in run.calls if c.name == SCORE), "no KL penalty: weak")


# ------------------------------------------------------------------------------------------- PPO at 1.12.0
PPO = dict(per_device_train_batch_size=2, gradient_accumulation_steps=3, num_mini_batches=1, num_ppo_epochs=2,
           total_episodes=36, response_length=10, stop_token="eos", local_rollout_forward_batch_size=6,
           missing_eos_penalty=1.0, logging_steps=1, lr_scheduler_type="linear", learning_rate=5e-2)
PPO_CONFIG = {k: PPO[k] for k in ("gradient_accumulation_steps", "num_mini_batches", "num_ppo_epochs",
                                  "logging_steps")}


@proof("trl", trainer="ppo", release="1.12.0", config=PPO_CONFIG)
def test_ppo_1_12_rollout_and_update_statistics(p, tmp_path):
    """TRL 1.12.0's PPOTrainer, 4 updates of 6 prompts: the objective/* keys are the rollout batch's per-sequence
    means (the KL and its penalty summed over each response's tokens, the entropy term the sampled tokens' -log p
    summed, padding masked); the update statistics are each micro-batch's value, averaged over the 3 micro-batches of
    each of the 2 epochs: token means over the response tokens (the losses and clip fractions; the value terms one
    position further, padding_mask_p1), or over every response position, padding included (the approximate KL, the
    entropy and the ratio); val/num_eos_tokens sums the responses' EOS tokens; lr is the rate before the scheduler
    steps; episode counts prompts; eps is the episodes so far over the seconds since train() began."""
    _assert_ppo(p, tmp_path, padding_in_entropy=False)


@proof("trl", trainer="ppo", release="0.25.1", config=PPO_CONFIG)
def test_ppo_0_25_rollout_and_update_statistics(p, tmp_path):
    """TRL 0.25.1's PPOTrainer (trl/trainer/ppo_trainer.py), as at 1.12.0 but for objective/entropy: the sampled
    tokens' -log p summed over every response position, the padding's INVALID_LOGPROB (1.0) included (each padding
    position subtracts 1; v1.10.0 masked it)."""
    _assert_ppo(p, tmp_path, padding_in_entropy=True)


def _without_empty(ups: list) -> list:
    """The updates whose responses all hold a valid token (TRL's sequence_lengths >= 0)."""
    return [u for u in ups if bool((u.rollout["sequence_lengths"] >= 0).all())]


def _assert_ppo(p, tmp_path, *, padding_in_entropy: bool) -> None:
    from _support.proofs_trl_old import rows_of, run_ppo
    run = run_ppo(tmp_path, **PPO)
    ups = run.updates
    p.check(len(ups) == 6 and all(len(u.micros) == 6 for u in ups), [len(u.micros) for u in ups])
    lengths = {int(v) for u in ups for v in u.rollout["sequence_lengths"]}
    # a response whose first token is the pad token has no valid token (sequence_length -1): TRL counts it (0 KL,
    # 0 entropy) in its means over sequences, which the fingerprint's batches (sequences of >= 1 value) cannot hold;
    # the token-level keys are fingerprinted on the updates without one (sampling picks which: at least 3 of 6)
    full = _without_empty(ups)
    p.check(len(full) >= 3, f"{len(full)} of {len(ups)} updates without an empty response")
    p.check(len(lengths) > 2, f"the responses have even lengths: {lengths}")

    def valid(name: str, sign: float = 1.0):
        return lambda r: rows_of(sign * r[name], ~r["padding_mask"])

    def obs_rollout(key, values):
        return [(u.row[key], run.rollout_steps(u, values)) for u in full]

    for key, values in (("objective/kl", valid("kl")), ("objective/non_score_reward", valid("non_score_reward"))):
        p.assert_stated(key, obs_rollout(key, values), levels=())
    every = obs_rollout("objective/entropy", lambda r: rows_of(-r["logprobs"]))
    masked_pad = obs_rollout("objective/entropy", valid("logprobs", -1.0))
    p.assert_stated("objective/entropy", every if padding_in_entropy else masked_pad, levels=())
    with pytest.raises(AssertionError, match="no candidate"):          # the other treatment of the padding
        fingerprint(masked_pad if padding_in_entropy else every, tokens=("seq_mean_token_sum",))
    p.check(True, "the other padding treatment fits no reduction")
    p.check(any(bool(u.rollout["padding_mask"].any()) for u in full), "no padding: the entropy proof would be weak")
    def obs_all(key, values):
        return [(u.row[key], run.rollout_steps(u, values)) for u in ups]

    p.assert_stated("objective/scores", obs_all("objective/scores", lambda r: rows_of(r["scores"][:, None])),
                    tokens=("per_seq", "token_mean"), levels=())
    # the shaped reward of each sequence: TRL's rewards tensor (the KL penalty per token, the score at the end)
    p.assert_stated("objective/rlhf_reward",
                    obs_all("objective/rlhf_reward", lambda r: rows_of(r["rewards"].sum(1)[:, None])),
                    tokens=("per_seq", "token_mean"), levels=())

    def micro(name: str, mask: str | None, fn=None):
        def values(m, r):
            x = m[name] if fn is None else fn(m)
            return rows_of(x, None if mask is None else ~r[mask][m["micro_batch_inds"]])
        return values

    def obs_update(key, values):
        return [(u.row[key], run.micro_steps(u, values)) for u in full]

    for key, values, levels in (
            ("loss/policy_avg", micro("pg_loss_max", "padding_mask"), ("micro_batches",)),
            ("policy/clipfrac_avg", micro("pg", "padding_mask", lambda m: m["pg_losses2"] > m["pg_losses"]),
             ("micro_batches",)),
            ("loss/value_avg", micro("vf", "padding_mask_p1", lambda m: 0.5 * m["vf_loss_max"]),
             ("micro_batches",)),
            ("val/clipfrac_avg", micro("vf", "padding_mask_p1", lambda m: m["vf_losses2"] > m["vf_losses1"]),
             ("micro_batches",)),
            # every response position, padding included: the micro-batches hold equal token counts
            ("policy/approxkl_avg", micro("kl", None, lambda m: 0.5 * m["logprobs_diff"] ** 2), ()),
            ("policy/entropy_avg", micro("entropy", None), ()),
            ("val/ratio", micro("ratio", None), ())):
        p.assert_stated(key, obs_update(key, values), levels=levels, mini=("mean", "sum", "last", "max"), rel=1e-5)
    p.check(any(u.row["policy/clipfrac_avg"] > 0 for u in ups), "nothing was clipped: weak")
    p.check(any(u.row["val/clipfrac_avg"] > 0 for u in ups), "no value was clipped: weak")
    # padding included for the ratio: its valid tokens alone fit no reduction
    only_valid = [(u.row["val/ratio"], run.micro_steps(u, micro("ratio", "padding_mask"))) for u in full]
    with pytest.raises(AssertionError, match="no candidate"):
        fingerprint(only_valid, mini=("mean", "sum", "last", "max"))
    p.check(True, "the ratio over the valid tokens only fits no reduction")
    # val/ratio_var: the unbiased variance of the 6 micro-batch mean ratios (2 epochs x 3), gathered into one list;
    # not a variance per epoch combined, nor a variance of the tokens
    ratios = obs_update("val/ratio_var", micro("ratio", None))
    p.assert_stated("val/ratio_var", ratios, levels=(), **VAR_OFFERED)
    p.check(all(u.row["val/ratio_var"] > 0 for u in full), "every ratio_var is positive")
    with pytest.raises(AssertionError, match="no candidate"):       # the population variance (n) is not it
        fingerprint([(v * 5 / 6, b) for v, b in ratios], **VAR_OFFERED)
    p.check(True, "the population variance of the micro-batch means fits no reduction")

    eos = run.eos_token_id
    # HF generate stops a response at its EOS: a max over sequences is 0 or 1, told from the sum only by an update
    # with 2 EOS or more (sampling decides)
    two = any(int((u.rollout["responses"] == eos).sum()) > 1 for u in ups)
    eos_stats = ("sum", "mean", "max") if two else ("sum", "mean")
    p.assert_stated("val/num_eos_tokens",
                    obs_all("val/num_eos_tokens", lambda r: rows_of((r["responses"] == eos).sum(1)[:, None])),
                    tokens=("per_seq",), stats=eos_stats, levels=())
    p.check(len({u.row["val/num_eos_tokens"] for u in ups}) > 1, "every update logs the same EOS count: weak")

    before = [run.lr_initial, *run.lr_after[:-1]]
    lr = [(u.row["lr"], [[[[[[before[i]]]]]]]) for i, u in enumerate(ups)]
    p.assert_stated("lr", lr, tokens=("none", "per_seq"), levels=())
    after = [(u.row["lr"], [[[[[[run.lr_after[i]]]]]]]) for i, u in enumerate(ups)]
    with pytest.raises(AssertionError, match="no candidate"):
        fingerprint(after, tokens=("none", "per_seq"))
    p.check(True, "the rate after the scheduler step fits no reduction")

    p.check(all(u.row["episode"] != u.global_step for u in ups), "episode is not the global step")
    p.assert_stated("episode", [(u.row["episode"], [[[[[[u.episode]]]]]]) for u in ups], tokens=("none",),
                    levels=())

    # eps: the episodes so far over the seconds since train() began (ppo_trainer.py's clock: its start, then one
    # reading per logged update, each step longer), truncated to an integer; not this update's own rate
    clock = run.clock
    p.check(len(clock) == 1 + len(ups), (len(clock), len(ups)))
    eps = [(u.row["eps"], [[[[[[float(int(u.episode / (clock[k] - clock[0])))]]]]]])
           for k, u in enumerate(ups, 1)]
    p.assert_stated("eps", eps, tokens=("none",), levels=())
    batch = ups[0].episode
    own = [int(batch / (clock[k] - clock[k - 1])) for k in range(1, len(clock))]
    p.check([u.row["eps"] for u in ups] != own and len({u.row["eps"] for u in ups}) > 1, (eps, own))


PPO_SPLIT = {**PPO, "gradient_accumulation_steps": 4, "num_mini_batches": 2, "total_episodes": 32, "response_length": 8}
PPO_SPLIT_CONFIG = {k: PPO_SPLIT[k] for k in PPO_CONFIG}


@proof("trl", trainer="ppo", release="1.12.0", config=PPO_SPLIT_CONFIG)
def test_ppo_1_12_update_statistics_with_two_mini_batches_are_diluted(p, tmp_path):
    """num_mini_batches 2, gradient_accumulation_steps 4: each mini-batch runs 2 micro-batches, but TRL's stats
    tensors hold gradient_accumulation_steps (4) slots per mini-batch (ppo_trainer.py@v1.12.0:631,809): the 2 slots
    never written stay 0 and .mean() averages them in. With those zero slots as micro-batches of TRL's stats (one
    value 0 each) the logged values are the stated mean over micro-batches and mini-batches; without them no
    reduction fits; the entries say so (a deviation under num_mini_batches > 1)."""
    from _support.proofs_trl_old import rows_of, run_ppo
    run = run_ppo(tmp_path, **PPO_SPLIT)
    ups = run.updates
    p.check(len(ups) == 4 and all(len(u.micros) == 8 for u in ups), [len(u.micros) for u in ups])
    full = _without_empty(ups)
    p.check(len(full) >= 2, f"{len(full)} of {len(ups)} updates without an empty response")
    empty = [[0.0]]                                     # a slot of TRL's stats tensor no micro-batch wrote

    def micro(name, mask):
        return lambda m, r: rows_of(m[name], None if mask is None else ~r[mask][m["micro_batch_inds"]])

    for key, values, levels in (("loss/policy_avg", micro("pg_loss_max", "padding_mask"), ("micro_batches",)),
                                ("val/ratio", micro("ratio", None), ())):
        written = [(u.row[key], run.micro_steps(u, values)) for u in full]
        slots = [(v, [[[[*rank, empty, empty] for rank in mini] for mini in step] for step in batch])
                 for v, batch in written]
        p.assert_stated(key, slots, levels=levels, mini=("mean", "sum", "last", "max"), rel=1e-5)
        with pytest.raises(AssertionError, match="no candidate"):
            fingerprint(written, mini=("mean", "sum", "last", "max"))
        p.check(True, f"{key}: the written micro-batches alone fit no reduction")
        _entry, res = p.entry(key)
        p.check(str(res.fields.get("deviation", "")).startswith("diluted"), res.fields)
    # val/ratio_var: the variance of every slot of ratio_stats, the 2 unwritten zeros per mini-batch among them
    written = [(u.row["val/ratio_var"], run.micro_steps(u, micro("ratio", None))) for u in full]
    slots = [(v, [[[[*rank, empty, empty] for rank in mini] for mini in step] for step in batch])
             for v, batch in written]
    p.assert_stated("val/ratio_var", slots, levels=(), **VAR_OFFERED)
    p.check(all(u.row["val/ratio_var"] > 0.1 for u in full), "the zero slots dominate the variance")
    with pytest.raises(AssertionError, match="no candidate"):
        fingerprint(written, **VAR_OFFERED)
    p.check(True, "val/ratio_var: the written micro-batches alone fit no reduction")
    _entry, res = p.entry("val/ratio_var")
    p.check(str(res.fields.get("deviation", "")).startswith("diluted"), res.fields)
