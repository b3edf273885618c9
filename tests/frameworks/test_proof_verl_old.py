"""Fingerprints of the veRL entries whose range ends before 0.9.1, by running the older releases' own code
(tests/releases.txt; each proof runs in a child process with its release first on sys.path, tests/_support/
releases.py): the legacy FSDP workers' update_policy / update_critic (dp_actor.py, dp_critic.py) over 2 simulated
ranks, 2 mini-batches x 2 PPO epochs, micro-batches of 2 sequences of uneven lengths, the outputs collected with the
release's DataProto.concat and reduced with its reduce_metrics as ray_trainer.py's fit() does; the driver's
compute_data_metrics (metric_utils.py). What the logged values are compared with is captured while veRL runs (the
per-token matrices handed to agg_loss / masked_mean, tests/_support/proofs_verl_old.py)."""
from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("tensordict")
pytest.importorskip("verl", reason="make test installs verl --no-deps")

from _support import proofs_verl_old as O  # noqa: E402
from _support.proven import close, proof, to_fingerprint  # noqa: E402

LEVELS = ("micro_batches", "mini_batches", "processes")
LOSS_TOKENS = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum")
MEAN_TOKENS = ("token_mean", "seq_mean_token_mean")
MEMORY = ("perf/max_memory_allocated_gb", "perf/max_memory_reserved_gb", "perf/cpu_memory_used_gb")
CLIP_C = 1.1                      # the dual-clip bound close to 1: the lower clip fires on this small batch
BASE = O.base_config()
V050 = dict(BASE, **{"actor_rollout_ref.actor.clip_ratio_c": CLIP_C})
V071 = V050


SEEDS = (7, 8, 9, 10)             # several batches of one shape: a selection (rank 0's, the max) rarely fits them all


def _legacy_updates(p, **actor) -> tuple[list[O.Update], list[O.Update]]:
    actors = [O.run_update("actor", seed=s, clip_ratio_c=CLIP_C, **actor) for s in SEEDS]
    critics = [O.run_update("critic", seed=s) for s in SEEDS]
    for u in actors + critics:
        p.check(u.cap.n_opt == {r: 2 * O.EPOCHS for r in range(O.WORLD)}, f"optimizer steps {u.cap.n_opt}")
        p.check(all(len(m) == 2 * O.EPOCHS * O.MINI // O.MICRO for m in u.cap.micro.values()), "micro-batches")
    return actors, critics


def obs(updates: list[O.Update], key: str, kind: str, index: int, scale: float = 1.0) -> list:
    """(logged value, captured batch) of every run."""
    return [(u.metrics[key], u.cap.batch(kind, index, scale)) for u in updates]


def _critic_keys(p, critics: list[O.Update]) -> None:
    # compute_value_loss: vf_loss = 0.5 * agg_loss(clipped squared errors): the captured matrix times veRL's 0.5
    p.assert_stated("critic/vf_loss", obs(critics, "critic/vf_loss", "agg", 0, 0.5), levels=LEVELS,
                    tokens=LOSS_TOKENS)
    p.assert_stated("critic/vf_clipfrac", obs(critics, "critic/vf_clipfrac", "mm", 0), levels=LEVELS,
                    tokens=MEAN_TOKENS)
    p.assert_stated("critic/vpred_mean", obs(critics, "critic/vpred_mean", "mm", 1), levels=LEVELS,
                    tokens=MEAN_TOKENS)
    p.check(all(0 < u.metrics["critic/vf_clipfrac"] < 1 for u in critics), "the value clip fires, not always")


def _actor_keys(p, actors: list[O.Update]) -> None:
    """compute_policy_loss: masked_mean(ppo_kl), masked_mean(clipfrac), masked_mean(clipfrac_lower)."""
    p.assert_stated("actor/ppo_kl", obs(actors, "actor/ppo_kl", "mm", 0), levels=LEVELS, tokens=MEAN_TOKENS)
    p.assert_stated("actor/pg_clipfrac", obs(actors, "actor/pg_clipfrac", "mm", 1), levels=LEVELS,
                    tokens=MEAN_TOKENS)
    p.assert_stated("actor/pg_clipfrac_lower", obs(actors, "actor/pg_clipfrac_lower", "mm", 2), levels=LEVELS,
                    tokens=MEAN_TOKENS)
    p.check(all(0 < u.metrics["actor/pg_clipfrac_lower"] < u.metrics["actor/pg_clipfrac"] < 1 for u in actors),
            "both clips fire, not always")


def one_value(x: float) -> list:
    """A scalar as the fingerprint's batch: one logged step, one optimizer step, one rank, one value."""
    return [[[[[[float(x)]]]]]]


def _per_rank(run: O.WorkerSteps, key: str) -> list:
    """(logged value, the ranks' own values) of every training step: ``steps[0][0][rank] = [[value]]``."""
    return [(m[key], [[[[[[ranks[r][key]]]] for r in range(O.WORLD)]]]) for m, ranks in zip(run.metrics, run.per_rank)]


def _worker_keys(p, memory: tuple[str, ...]) -> None:
    """Through fsdp_workers.py update_actor / update_critic on each rank, collected and reduced by the driver:
    actor/lr, critic/lr (get_last_lr() read, then the scheduler's step): the rate this step's optimizer steps used,
    one step behind the scheduler's after the step; perf/mfu/* and the memory readings (made-up per-rank numbers,
    rank 0's the smaller in one step and the larger in the other): the reduction over the ranks."""
    for role in ("actor", "critic"):
        run = O.run_worker(role)
        for logged, used, after in zip(run.logged, run.used, run.after):
            p.check(len(set(used)) == 1 and close(logged, used[0]) and not close(logged, after),
                    (role, logged, used, after))
        p.assert_stated(f"{role}/lr", run.logged[-1], one_value(run.logged[-1]), levels=())
        _, res = p.entry(f"{role}/lr")
        p.check(res.fields["snapshot"] == "before_scheduler_step", (role, res.fields))
        for key in (f"perf/mfu/{role}",) + (memory if role == "actor" else ()):
            p.assert_stated(key, _per_rank(run, key), levels=(), tokens=("none",))


def _old_log_prob_entropy(p, **actor) -> None:
    """actor/entropy from the trainer's old-log-prob pass (ray_trainer.py fit(): agg_loss of the entropies veRL's
    compute_log_prob returned, over the whole batch with loss_agg_mode): one number over every valid token, not a
    mean of groups (three layouts of the same sequences: as given, shortest first, longest first)."""
    run = O.run_old_log_prob(**actor)
    seqs = run.entropys
    orders = (seqs, sorted(seqs, key=len), sorted(seqs, key=len, reverse=True))
    p.assert_stated("actor/entropy", [(run.metrics["actor/entropy"], [[layout(list(o))]]) for o in orders],
                    levels=("micro_batches", "processes"), tokens=LOSS_TOKENS)


@proof("verl", trainer="ppo", release="0.5.0", config=V050)
def test_v050_legacy_workers_log_rank_zeros_micro_batch_mean(p):
    """verl 0.5.0 (entries of v0.1rc..v0.5.0, v0.4.0..v0.5.0, v0.5.0): dp_actor.update_policy appends each
    micro-batch's pg_loss (agg_loss over the micro-batch), clip fractions and ppo_kl (masked_mean) and kl_loss;
    DataProto.concat keeps the first worker's meta_info, so the driver's np.mean is over rank 0's micro-batches of
    every mini-batch and epoch, the other ranks dropped. The same for dp_critic.update_critic."""
    actors, critics = _legacy_updates(p)
    # agg_loss calls: compute_policy_loss's pg_loss, then dp_actor's kl loss (agg_loss(kld))
    p.assert_stated("actor/pg_loss", obs(actors, "actor/pg_loss", "agg", 0), levels=LEVELS, tokens=LOSS_TOKENS)
    p.assert_stated("actor/kl_loss", obs(actors, "actor/kl_loss", "agg", 1), levels=LEVELS, tokens=LOSS_TOKENS)
    _actor_keys(p, actors)
    _critic_keys(p, critics)
    _worker_keys(p, MEMORY)
    _old_log_prob_entropy(p)


@proof("verl", trainer="ppo", release="0.7.1", config=V071)
def test_v071_legacy_workers_sum_losses_over_optimizer_steps(p):
    """verl 0.7.1 (entries of v0.7.0..v0.7.1 and v0.6.0..): dp_actor.update_policy adds pg_loss * loss_scale_factor
    (1 / gradient-accumulation steps) of every micro-batch of every mini-batch and epoch into one number (kl_loss
    too), appends the clip fractions and ppo_kl per micro-batch; DataProto.concat gathers every worker's metrics and
    the driver's np.mean averages them. vf_loss as pg_loss. The lrs through fsdp_workers' update_actor /
    update_critic, actor/entropy from the trainer's old-log-prob pass."""
    actors, critics = _legacy_updates(p)
    # agg_loss calls: compute_policy_loss_vanilla's pg_loss, dp_actor's agg_loss(kld)
    p.assert_stated("actor/pg_loss", obs(actors, "actor/pg_loss", "agg", 0), levels=LEVELS, tokens=LOSS_TOKENS)
    p.assert_stated("actor/kl_loss", obs(actors, "actor/kl_loss", "agg", 1), levels=LEVELS, tokens=LOSS_TOKENS)
    p.check(all("actor/entropy" not in u.metrics for u in actors), "the update logs no entropy by default")
    _actor_keys(p, actors)
    _critic_keys(p, critics)
    _worker_keys(p, MEMORY)
    _old_log_prob_entropy(p)
    _generation_timing(p)


def _generation_timing(p) -> None:
    """timing_s/generation_timing/max, min (v0.6.0..v0.7.1): fsdp_workers.py generate_sequences hands each rank's
    generate_sequences seconds to topk_reduce_ratio_min_max (utils/profiler/performance.py), which all-gathers them:
    the max and min over the ranks, the same on every rank (so the driver's merged meta_info["timing"] holds them)."""
    seconds = [3.0, 7.5, 1.25, 4.0]
    runs = [(order, O.run_generation_timing(order)) for order in (seconds, seconds[::-1])]
    for name, index in (("max", 2), ("min", 1)):
        observed = [(got[0][index], [[[[[[v]]] for v in order]]]) for order, got in runs]
        p.check(all(len({g[index] for g in got}) == 1 for _, got in runs), "every rank holds the same value")
        p.assert_stated(f"timing_s/generation_timing/{name}", observed, levels=(), tokens=("none",))


@proof("verl", trainer="ppo", release="0.7.1", config=dict(V050, **{"actor_rollout_ref.actor.calculate_entropy": True,
                                                                     "actor_rollout_ref.actor.kl_loss_type": "mse"}))
def test_v071_calculate_entropy_logs_the_update_time_entropy(p):
    """verl 0.7.1 with actor.calculate_entropy (entropy_coeff 0): dp_actor.update_policy appends agg_loss(entropy)
    of the policy being updated per micro-batch, and the driver's np.mean of it replaces the old-log-prob value (fit()
    updates the metrics with the actor's output after the old-log-prob ones): a mean of micro-batch values over
    micro-batches, optimizer steps and ranks; pg_loss has no entropy bonus then. kl_loss_type mse (k2): the kl loss
    summed over the optimizer steps as with the default estimator."""
    actors = [O.run_update("actor", seed=s, clip_ratio_c=CLIP_C, calculate_entropy=True, kl_loss_type="mse")
              for s in SEEDS]
    p.assert_stated("actor/entropy", obs(actors, "actor/entropy", "agg", 1), levels=LEVELS, tokens=LOSS_TOKENS)
    p.assert_stated("actor/pg_loss", obs(actors, "actor/pg_loss", "agg", 0), levels=LEVELS, tokens=LOSS_TOKENS)
    p.assert_stated("actor/kl_loss", obs(actors, "actor/kl_loss", "agg", 2), levels=LEVELS, tokens=LOSS_TOKENS)
    p.check(all(v >= 0 for u in actors for mini in u.cap.batch("agg", 2)[0] for r in mini for m in r for s in m
                for v in s), "k2 is a square")


ENTROPY_COEFF = 0.01
V071_BONUS = dict(V050, **{"actor_rollout_ref.actor.entropy_coeff": ENTROPY_COEFF,
                           "actor_rollout_ref.actor.kl_loss_type": "kl"})


def _combined(a: list, b: list, coeff: float) -> list:
    """Token by token a - coeff * b of two captured batches of one layout (the same masks)."""
    return [[[[[[x - coeff * y for x, y in zip(sa, sb)] for sa, sb in zip(ua, ub)] for ua, ub in zip(ra, rb)]
              for ra, rb in zip(ma, mb)] for ma, mb in zip(wa, wb)] for wa, wb in zip(a, b)]


@proof("verl", trainer="ppo", release="0.7.1", config=V071_BONUS)
def test_v071_entropy_bonus_is_in_the_logged_pg_loss(p):
    """verl 0.7.1 with entropy_coeff != 0: the update-time entropy replaces the old-log-prob one (a mean of
    micro-batch values), and the logged pg_loss carries the entropy bonus: dp_actor.py@v0.7.1:640-645 aliases
    policy_loss to pg_loss and subtracts entropy_coeff * entropy in place before pg_loss is logged (line 669). The
    batch fingerprinted for pg_loss is veRL's captured pg_losses and entropies combined as that line does."""
    actors = [O.run_update("actor", seed=s, clip_ratio_c=CLIP_C, entropy_coeff=ENTROPY_COEFF, kl_loss_type="kl")
              for s in SEEDS]
    p.assert_stated("actor/entropy", obs(actors, "actor/entropy", "agg", 1), levels=LEVELS, tokens=LOSS_TOKENS)
    # kl_loss_type kl (k1): the kl loss summed over the optimizer steps as with the default estimator
    p.assert_stated("actor/kl_loss", obs(actors, "actor/kl_loss", "agg", 2), levels=LEVELS, tokens=LOSS_TOKENS)
    bonus = [(u.metrics["actor/pg_loss"], _combined(u.cap.batch("agg", 0), u.cap.batch("agg", 1), ENTROPY_COEFF))
             for u in actors]
    p.assert_stated("actor/pg_loss", bonus, levels=LEVELS, tokens=LOSS_TOKENS)
    from _support import fingerprint as FP
    _, res = p.entry("actor/pg_loss")
    plain = FP.value_of(actors[0].cap.batch("agg", 0), to_fingerprint(res.stated))
    p.check(not close(actors[0].metrics["actor/pg_loss"], plain, 1e-4), "the logged pg_loss has no entropy bonus")


# ------------------------------------------------------------------------------------------------ driver (0.8.0)
MAX_PROMPT, MAX_RESPONSE = 6, 9
PROMPTS = [3, 6, 2, 6, 3, 5, 4, 2, 5, 3, 6, 4, 3, 6, 2, 4]       # 5 at the configured maximum
RESPONSES = [2, 9, 3, 9, 0, 4, 6, 9, 3, 7, 0, 5, 9, 1, 6, 3]     # 5 at the maximum (truncated), 2 aborted (0)
V080 = dict(BASE, **{"data.max_prompt_length": MAX_PROMPT, "data.max_response_length": MAX_RESPONSE,
                     "actor_rollout_ref.rollout.multi_turn.tool_config_path": None,
                     "algorithm.adv_estimator": "gdpo"})


def layout(values: list, shares=((3, 1, 3), (2, 4, 1, 2))) -> list:
    """Per-sequence values cut into uneven groups ([rank][group][sequence]): a driver metric is computed once over
    the whole batch, so any such layout is one it could have been averaged over instead."""
    out, i = [], 0
    for rank in shares:
        groups = []
        for size in rank:
            groups.append(values[i:i + size])
            i += size
        out.append(groups)
    assert i == len(values), (i, len(values))
    return out


def per_seq(logged: float, flags: list[float]) -> list:
    """The logged value against three layouts of the same per-sequence values (as given, sorted up and down)."""
    seqs = [[float(v)] for v in flags]
    n = len(seqs)
    shares = ((3, 1, 2), (2, n - 11, 1, 2))
    return [(logged, [[layout(order, shares)]]) for order in (seqs, sorted(seqs), sorted(seqs, reverse=True))]


def data_metrics(prompts: list[int], responses: list[int]) -> dict[str, float]:
    """compute_data_metrics (metric_utils.py@0.8.0) on the batch as ray_trainer.py holds it: prompts left-padded
    to data.max_prompt_length, responses right-padded to data.max_response_length (the padded width)."""
    import torch
    from tensordict import TensorDict
    from verl import DataProto
    from verl.trainer.ppo import metric_utils
    n, P, W = len(prompts), MAX_PROMPT, MAX_RESPONSE
    attn = torch.zeros(n, P + W, dtype=torch.long)
    for i, (p_, k) in enumerate(zip(prompts, responses)):
        attn[i, P - p_:P] = 1
        attn[i, P:P + k] = 1
    resp = attn[:, P:].clone()
    scores = torch.zeros(n, W)
    for i, k in enumerate(responses):
        if k:
            scores[i, k - 1] = 0.1 * i
    td = TensorDict({"prompts": torch.full((n, P), 5), "responses": torch.full((n, W), 5), "attention_mask": attn,
                     "response_mask": resp, "token_level_scores": scores, "token_level_rewards": scores,
                     "advantages": scores, "returns": scores}, batch_size=[n])
    out = metric_utils.compute_data_metrics(DataProto(batch=td), use_critic=False)
    return {k: float(v) for k, v in out.items() if isinstance(v, (int, float)) or hasattr(v, "item")}


@proof("verl", trainer="ppo", release="0.8.0", config=V080)
def test_v080_clip_ratios_are_fractions_at_the_configured_maximum(p):
    """response_length/clip_ratio, prompt_length/clip_ratio, response_length_non_aborted/clip_ratio (v0.2..v0.8.0,
    v0.6.0..v0.8.0; metric_utils.py@0.8.0 compute_data_metrics): the fraction of sequences whose length equals the
    padded width, which ray_trainer.py's batch has at the configured maximum, once over the whole batch (the
    non-aborted one over the sequences of non-zero length). A batch with nothing at the maximum logs 0: not the
    batch's longest."""
    m = data_metrics(PROMPTS, RESPONSES)
    at_max = [float(k == MAX_RESPONSE) for k in RESPONSES]
    p.assert_stated("response_length/clip_ratio", per_seq(m["response_length/clip_ratio"], at_max),
                    levels=("micro_batches", "processes"), tokens=("per_seq",))
    p.assert_stated("prompt_length/clip_ratio", per_seq(m["prompt_length/clip_ratio"],
                                                        [float(k == MAX_PROMPT) for k in PROMPTS]),
                    levels=("micro_batches", "processes"), tokens=("per_seq",))
    live = [float(k == MAX_RESPONSE) for k in RESPONSES if k]
    p.assert_stated("response_length_non_aborted/clip_ratio",
                    per_seq(m["response_length_non_aborted/clip_ratio"], live),
                    levels=("micro_batches", "processes"), tokens=("per_seq",))
    p.check(not close(m["response_length_non_aborted/clip_ratio"], m["response_length/clip_ratio"]),
            "the aborted sequences do not change the ratio")
    short = data_metrics([k - 1 if k == MAX_PROMPT else k for k in PROMPTS],
                         [k - 1 if k == MAX_RESPONSE else k for k in RESPONSES])
    p.check(short["response_length/clip_ratio"] == 0.0 and short["prompt_length/clip_ratio"] == 0.0
            and short["response_length_non_aborted/clip_ratio"] == 0.0, short)
    for key in ("response_length/clip_ratio", "prompt_length/clip_ratio", "response_length_non_aborted/clip_ratio"):
        _, res = p.entry(key)
        p.check(res.fields["clip_length"] == "max_length" and res.fields["stat"] == "fraction", (key, res.fields))
    _gdpo(p)


def _gdpo(p) -> None:
    """gdpo/{reward_fn}/mean, std, max, min (v0.7.1..v0.8.0): RayPPOTrainer.fit's GDPO block of the release's
    ray_trainer.py, compiled from its own text (framework_code._verl_gdpo_block, run by fidelity_proofs.
    run_verl_driver), over the batch's per-sequence scores of the reward function, the std the population's."""
    import statistics

    from _support import fidelity_proofs as FPR
    b = FPR.make_batch()
    logged = FPR.run_verl_driver(b)
    steps = [[[[[[s] for s in b.scores]]]]]            # the driver: one population of the batch's sequences
    p.check(len(set(b.scores)) > 2, b.scores)
    for stat in ("mean", "max", "min"):
        p.assert_stated(f"gdpo/score/{stat}", logged[f"gdpo/score/{stat}"], steps, tokens=("per_seq",),
                        stats=(stat,), levels=())
    p.assert_stated("gdpo/score/std", logged["gdpo/score/std"], steps, tokens=("per_seq",), stats=("std",),
                    levels=())
    p.check(not close(logged["gdpo/score/std"], statistics.stdev(b.scores)), "not the sample std")
