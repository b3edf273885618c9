"""Fingerprint proofs of mappings/trl.yaml for TRL's experimental AsyncGRPOTrainer (issue 33): the installed TRL
(1.16.0)'s AsyncGRPOTrainer.compute_loss runs on 2 simulated ranks (accelerator.reduce and gather meet across
threads) for 2 optimizer steps of 2 micro-batches per rank (packed rows of 1-3 sequences of uneven lengths), then
its own log() reduces what compute_loss appended (_reduce_metric) and hands the row to the Trainer's log
(tests/_support/proofs_trl_distill.py: run_async_grpo_loss). The trainer is built without __init__ (no vLLM server,
no rollout worker); the model is a stand-in returning per-position log-probs and entropies, from which TRL's code
computes every per-token value the proofs read back (its locals: coef_1, log_ratio, entropy, the clip masks). The
rollout side: the collator's _log_metrics and the rollout loop's _push_rollout_metrics, then log(). The experimental
AsyncDistillationTrainer (trainer ``distillation``) likewise: its _compute_loss with the tiny model as student and
teacher top-k log-probs as a teacher server gives them, on 2 simulated ranks, then its log()
(run_async_distillation_loss).
"""
from __future__ import annotations

import math

import pytest

pytest.importorskip("trl")

from _support.fingerprint import fingerprint  # noqa: E402
from _support.proofs_trl_distill import ASYNC_LENGTHS, run_async_grpo_loss  # noqa: E402
from _support.proven import close, proof  # noqa: E402

RELEASE = "1.16.0"
CONFIG = {"logging_steps": len(ASYNC_LENGTHS)}
SEEDS = (0, 1, 2)


def _seqs(loc: dict, values) -> list[list[float]]:
    """The sequences of one compute_loss call (its segment_id over the selected tokens), each the list of its
    per-token ``values`` (a (tokens,) tensor of that call)."""
    seg = loc["segment_id"].tolist()
    out: dict[int, list[float]] = {}
    for s, v in zip(seg, values.float().tolist()):
        out.setdefault(s, []).append(v)
    return [out[k] for k in sorted(out)]


PER_TOKEN = {
    "ratio": lambda loc: loc["coef_1"],
    "kl": lambda loc: (loc["coef_1"] - 1) - loc["log_ratio"],       # TRL's k3 terms, as its local_kl_sum adds them
    "entropy": lambda loc: loc["entropy"],
    "clip_ratio/low_mean": lambda loc: loc["is_low_clipped"],
    "clip_ratio/high_mean": lambda loc: loc["is_high_clipped"],
    "clip_ratio/region_mean": lambda loc: loc["is_region_clipped"],
}


def _observations(key: str, seed: int, falling: bool = False):
    """(rank 0's logged value of ``key``, the batch: [optimizer step][1][rank][micro-batch] = the sequences'
    per-token values TRL computed), and the per-call observations of every rank's micro-batches."""
    ranks = run_async_grpo_loss(seed=seed, falling=falling)
    logged = ranks[0][0]
    assert logged == ranks[1][0], "every rank logs the same row"
    steps = []
    for step in range(len(ASYNC_LENGTHS)):
        steps.append([[[_seqs(c.locals, PER_TOKEN[key](c.locals) if key in PER_TOKEN else c.locals[key])
                        for c in calls if c.step == step + 1] for _row, calls in ranks]])
    return logged, steps, ranks


@proof("trl", trainer="async_grpo", release=RELEASE, config=CONFIG)
def test_async_grpo_token_means_are_global_per_micro_batch_averaged_over_the_window(p):
    """ratio, kl, entropy and the clip fractions: each micro-batch's token sums and token count all-reduced (SUM)
    over the ranks, appended per micro-batch; log() averages the window's micro-batches unweighted (_reduce_metric's
    gauge). Each rank's micro-batch u meets the other rank's micro-batch u (of another token count) in the
    all-reduce."""
    for key in PER_TOKEN:
        obs = []
        for seed in SEEDS:
            logged, steps, _ranks = _observations(key, seed)
            obs.append((logged[key], steps))
        if key.startswith("clip_ratio"):
            p.check(any(v > 0 for v, _ in obs), f"{key}: nothing clipped")
        p.assert_stated(key, obs, tokens=("token_mean", "seq_mean_token_mean"), mini=("none",),
                        window=("mean", "last", "sum", "none"), levels=("micro_batches", "processes", "window"),
                        rel=1e-5)
    logged, steps, _ranks = _observations("kl", 0)
    flat = [v for st in steps for mini in st for rank in mini for micro in rank for seq in micro for v in seq]
    p.check(logged["kl"] > 0 and not close(logged["kl"], -sum(flat) / len(flat)), "k3 is positive, not negated")


@proof("trl", trainer="async_grpo", release=RELEASE, config=CONFIG)
def test_async_grpo_clip_extremes_per_micro_batch(p):
    """clip_ratio/low_min and high_max: per micro-batch, each sequence's clipped-token fraction, the rank's nanmin
    (nanmax), gathered and nanmin (nanmax) over the ranks: TRL's appended value of each micro-batch is the min
    (max) over every rank's sequences of their fractions (many observations, one micro-batch each). The window then
    reduces the micro-batches by their min (max), not their mean (_reduce_metric: a 'min' or 'max' word in the key):
    checked against the logged rows here; the entry says so (a window min/max is no window reduction the format
    states)."""
    for key, tensor, stat in (("clip_ratio/low_min", "is_low_clipped", "min"),
                              ("clip_ratio/high_max", "is_high_clipped", "max")):
        per_micro, rows = [], []
        for seed in SEEDS:
            # low_min: every advantage negative (else a sequence with a positive one, never clipped low, is the min)
            logged, steps, ranks = _observations(tensor, seed, falling=stat == "min")
            rows.append((logged[key], steps))
            calls = ranks[0][1]
            for step in range(len(ASYNC_LENGTHS)):
                mine = [c for c in calls if c.step == step + 1]
                for u, c in enumerate(mine):
                    # micro-batch u of every rank that has one: the ranks' u-th calls met in the gather
                    theirs = [[cc for cc in rc if cc.step == step + 1] for _r, rc in ranks]
                    seqs = [s for rc in theirs if u < len(rc) for s in _seqs(rc[u].locals, rc[u].locals[tensor])]
                    per_micro.append((c.appended[key], [[[[seqs]]]]))
        p.check(any(v > 0 for v, _ in per_micro) and len({round(v, 6) for v, _ in per_micro}) > 2,
                f"{key}: too few distinct micro-batch values")
        p.assert_stated(key, per_micro, tokens=("seq_mean_token_mean", "token_mean"), stats=(stat, "mean"), levels=())
        # the row: the extreme of the micro-batch values (all of them pooled over the window)
        found = fingerprint(rows, tokens=("seq_mean_token_mean",), stats=(stat,), micro=(stat, "mean"),
                            mini=("none",), processes=(stat,), window=(stat, "mean", "last", "none"))
        p.check(found.window in (stat, "none") and found.micro_batches == stat, found)
        _entry, res = p.entry(key)
        p.check(f"window's {stat}" in res.fields["deviation"], res.fields)
    p.check(not math.isnan(rows[0][0]), rows[0])


@proof("trl", trainer="async_grpo", release=RELEASE, config=CONFIG)
def test_async_grpo_aux_loss_is_the_ranks_mean_averaged_over_the_window(p):
    """aux_loss (an MoE router's load-balancing loss, aux_loss_enabled): each rank's micro-batch value (what the
    forward returned) all-reduced (SUM) and divided by the world size, appended per micro-batch; log() averages the
    window's micro-batches."""
    obs = []
    for seed in SEEDS:
        ranks = run_async_grpo_loss(seed=seed, aux=True)
        steps = [[[[[[float(c.locals["outputs"].aux_loss)]] for c in calls if c.step == step + 1]
                   for _row, calls in ranks]] for step in range(len(ASYNC_LENGTHS))]
        obs.append((ranks[0][0]["aux_loss"], steps))
    p.assert_stated("aux_loss", obs, tokens=("none",), mini=("none",), window=("mean", "last", "sum", "none"),
                    levels=())


# ------------------------------------------------------------------------------------------- the rollout side
def _samples(seed: int) -> list[list[dict]]:
    """Micro-batches of rollout samples (uneven sizes) as the rollout queue yields them to rank 0's collator: each
    sample's metrics are the rollout worker's (reward, its group's reward_std, rewards/<func>, None -> nan)."""
    import random

    import torch
    rng = random.Random(seed)
    out = []
    for size in (3, 1, 4, 2):
        micro = []
        for _ in range(size):
            n = rng.randint(2, 7)
            fn_a, fn_b = rng.uniform(-1, 1), (float("nan") if rng.random() < 0.25 else rng.uniform(0, 2))
            micro.append({"input_ids": list(range(n + 2)), "completion_mask": torch.tensor([0, 0] + [1] * n),
                          "metrics": {"reward": fn_a + (0.0 if math.isnan(fn_b) else fn_b),
                                      "reward_std": rng.uniform(0.1, 1.0),
                                      "rewards/fn_a": fn_a, "rewards/fn_b": fn_b}})
        out.append(micro)
    return out


@proof("trl", trainer="async_grpo", release=RELEASE, config=CONFIG)
def test_async_grpo_rewards_are_micro_batch_means_averaged(p):
    """reward, reward_std and rewards/<func>: rank 0's collator appends, per micro-batch it packs, the nan-aware
    mean of its samples' values (the rollout worker stamped them per sample; reward_std is the sample's group's std);
    log() averages the micro-batches since the last log, unweighted: micro-batches of 3, 1, 4 and 2 samples (two
    optimizer steps of two)."""
    from _support.proofs_trl_distill import async_log, collate_metrics

    for key in ("reward", "reward_std", "rewards/fn_a", "rewards/fn_b"):
        obs = []
        for seed in SEEDS:
            micros = _samples(seed)
            logged = async_log(lambda sink, _w: collate_metrics(sink, micros))
            # two optimizer steps of two micro-batches each (gradient_accumulation_steps 2)
            batch = [[[[[[e["metrics"][key]] for e in m if not math.isnan(e["metrics"][key])]
                         for m in micros[i:i + 2]]]] for i in (0, 2)]
            obs.append((logged[key], batch))
        p.assert_stated(key, obs, tokens=("per_seq",), mini=("none",), processes=("rank0", "none"),
                        window=("mean", "last", "sum", "none"), levels=("micro_batches", "window"))


@proof("trl", trainer="async_grpo", release=RELEASE, config=CONFIG)
def test_async_grpo_completion_mean_length_is_pooled_over_the_rollouts(p):
    """completions/mean_length: the rollout worker pushes, per rollout, its completion's token count as a rate pair
    (tokens, 1); log() drains the queue and _reduce_metric sums the pairs: the mean over every completion since the
    last log (each push one completion: the window's mean of pushes is that pooled mean)."""
    import random

    from _support.proofs_trl_distill import async_log, rollout_worker_pushes

    obs = []
    for seed in SEEDS:
        rng = random.Random(seed)
        comps = [[5] * rng.randint(1, 8) + ([3] if rng.random() < 0.7 else []) for _ in range(5)]
        logged = async_log(lambda _s, worker: rollout_worker_pushes(worker, comps))
        obs.append((logged["completions/mean_length"], [[[[[[float(len(c))]]]]] for c in comps]))
    p.check(len({round(v, 9) for v, _ in obs}) > 1, obs)
    p.assert_stated("completions/mean_length", obs, tokens=("per_seq",), mini=("none",), processes=("rank0", "none"),
                    window=("mean", "last", "sum", "none"), levels=())


# ------------------------------------------------------------------------------------------- AsyncDistillationTrainer
def _distill_obs(seed: int, value, teacher: int | None = None):
    """(rank 0's logged row, the batch [optimizer step][1][rank][micro-batch] of the sequences' per-token
    ``value(stats, teacher_of_token)``, optionally only the tokens scored by ``teacher``)."""
    from _support.proofs_trl_distill import DISTILL_ROWS, run_async_distillation_loss

    ranks = run_async_distillation_loss(seed=seed)
    assert ranks[0][0] == ranks[1][0], "every rank logs the same row"

    def seqs(loc, stats):
        comp, seg, tea = loc["completion_mask"], loc["segment"], loc["teacher"]
        valid = [j for j in range(len(comp) - 1) if comp[j + 1]]         # position j predicts token j + 1
        assert len(valid) == len(stats), (len(valid), len(stats))
        out: dict[int, list[float]] = {}
        for j, st in zip(valid, stats):
            if teacher is None or tea[j + 1] == teacher:
                out.setdefault(seg[j + 1], []).append(value(st, tea[j + 1]))
        return [out[k] for k in sorted(out)]
    steps = [[[[seqs(loc, st) for s, loc, st in calls if s == step + 1] for _row, calls in ranks]]
             for step in range(len(DISTILL_ROWS))]
    return ranks[0][0], steps


@proof("trl", trainer="distillation", release=RELEASE, config=CONFIG)
def test_async_distillation_token_means_are_global_per_micro_batch_averaged(p):
    """jsd, teacher_entropy (AsyncDistillationTrainer) and, per teacher, teacher_jsd/<id> and teacher_entropy/<id>:
    each micro-batch's token sums (TRL's per-token values: _jsd_loss_chunk run one position at a time) and token
    count all-reduced (SUM) over the ranks, appended per micro-batch; log() averages the window's micro-batches."""
    from _support.proofs_trl_distill import TEACHERS

    cases = [("jsd", 0, None), ("teacher_entropy", 2, None)]
    cases += [(f"teacher_jsd/{name}", 0, i) for i, name in enumerate(TEACHERS)]
    cases += [(f"teacher_entropy/{name}", 2, i) for i, name in enumerate(TEACHERS)]
    for key, col, teacher in cases:
        obs = []
        for seed in SEEDS:
            logged, steps = _distill_obs(seed, lambda st, _t, col=col: st[col], teacher)
            obs.append((logged[key], steps))
        p.check(all(v > 0 and math.isfinite(v) for v, _ in obs), (key, [v for v, _ in obs]))
        p.assert_stated(key, obs, tokens=("token_mean", "seq_mean_token_mean"), mini=("none",),
                        window=("mean", "last", "sum", "none"), levels=("micro_batches", "processes", "window"),
                        rel=1e-5)


@proof("trl", trainer="distillation", release=RELEASE, config=CONFIG)
def test_async_distillation_teacher_token_share_is_pooled_over_the_window(p):
    """teacher_token_frac/<id>: per micro-batch the (tokens the teacher scored, tokens) pair all-reduced over the
    ranks, appended as a rate; log()'s _reduce_metric sums the pairs: the teacher's share of every token of the
    window, not a mean of micro-batch shares."""
    from _support.proofs_trl_distill import TEACHERS

    for i, name in enumerate(TEACHERS):
        obs = []
        for seed in SEEDS:
            logged, steps = _distill_obs(seed, lambda _st, t, i=i: float(t == i))
            obs.append((logged[f"teacher_token_frac/{name}"], steps))
        p.check(all(0 < v < 1 for v, _ in obs), [v for v, _ in obs])
        p.assert_stated(f"teacher_token_frac/{name}", obs, tokens=("token_mean", "seq_mean_token_mean"),
                        mini=("none",), window=("mean", "last", "sum", "none"),
                        levels=("micro_batches", "processes", "window"))
