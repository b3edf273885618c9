"""Fingerprints of veRL 0.9.1's driver-side metrics (issue 33 item 1): the data, timing and throughput metrics of one
V1 training step (trainer/ppo/v1/trainer_base.py ``_compute_metrics`` -> metric_utils' ``compute_data_metrics``,
``compute_timing_metrics``, ``compute_throughout_metrics``), the load-balance metrics of ``seqlen_balancing``, and the
validation metrics (``_val_metrics_update`` -> ``process_validation_metrics``), all run by the installed wheel's code
(tests/_support/proofs_verl.py). What the proofs compare the logged values with is what veRL's functions were
*given* (the padded DataProto of the step, the timings, the validation samples; bootstrap results captured as veRL
returns them), never a value this file computes the metric from: each logged value is fingerprinted against every
candidate reduction of that population, on layouts where the candidates give different numbers, and must be the
reduction mappings/verl.yaml states and no other."""
from __future__ import annotations

import dataclasses
import random
import statistics

import pytest

pytest.importorskip("torch")
pytest.importorskip("tensordict")
pytest.importorskip("verl", reason="make test installs verl --no-deps")

from _support import proofs_verl as V  # noqa: E402
from _support.proven import close, proof  # noqa: E402

WORLD, MICRO, MINI, EPOCHS = V.WORLD, 2, 8, 2
ROLLOUT = V.UNEVEN                                     # the shared uneven batch (proofs_verl.py)
BASE = V.base_config(ROLLOUT)
DRIVER = ("micro_batches", "processes")        # the levels a driver metric over the whole batch could be split in

_RUNS: dict = {}


def step() -> tuple[V.StepRun, V.DriverInputs]:
    """One V1 training step (with a critic) of veRL's code on ROLLOUT, and what its metric functions were given."""
    if "run" not in _RUNS:
        _RUNS["run"] = V.run_step_driver(ROLLOUT, mini_batch_size=MINI, micro_size=MICRO, epochs=EPOCHS, critic=True)
    return _RUNS["run"]


# ------------------------------------------------------------------------------------------------ layouts
def layout(values: list, shares: tuple) -> list:
    """Values cut into uneven groups ([rank][group][item]): a driver metric is computed once over the whole batch,
    so any layout is one it could have been averaged over instead; uneven groups make those alternatives differ."""
    out, i = [], 0
    for rank in shares:
        groups = []
        for size in rank:
            groups.append(values[i:i + size])
            i += size
        out.append(groups)
    assert i == len(values), (i, len(values))
    return out


SHARES_16 = ((3, 1, 3), (2, 4, 1, 2))
SHARES_ENDS = ((6, 1, 1), (1, 1, 6))      # the sorted extremes all in one group: first or last of its rank


def per_seq_observations(logged: float, values: list[float], shares: tuple = SHARES_16,
                         ends: tuple = SHARES_ENDS) -> list:
    """The one logged value against five layouts of the same per-sequence values (as given, sorted up, sorted
    down, cut into ``shares``; sorted up and down, cut into ``ends``): a value computed over the whole batch is the
    pooled one in every layout, while a selection (a group's max, the last group, rank 0's) or an unweighted mean of
    groups changes with the layout, even when many sequences tie on the extreme value."""
    seqs = [[float(v)] for v in values]
    up, down = sorted(seqs), sorted(seqs, reverse=True)
    return [(logged, [[layout(order, cut)]]) for order, cut in ((list(seqs), shares), (up, shares), (down, shares),
                                                                (up, ends), (down, ends))]


def token_observations(logged: float, seqs: list[list[float]], shares: tuple = SHARES_16) -> list:
    """The same for per-token values (ragged sequences): the sequences as given, reversed, and sorted by their
    longest-first order, each cut into uneven groups of sequences."""
    orders = (list(seqs), list(reversed(seqs)), sorted(seqs, key=lambda s: (-len(s), s)))
    return [(logged, [[layout(order, shares)]]) for order in orders]


def ragged(values, mask) -> list[list[float]]:
    """Each sequence's values where ``mask`` is set (veRL's own padded tensors, padding and tool tokens left out)."""
    mask = mask.tolist() if hasattr(mask, "tolist") else mask
    return [[float(v) for v, m in zip(row, mrow) if m] for row, mrow in zip(values.tolist(), mask)]


# ------------------------------------------------------------------------------------------------ data metrics
@proof("verl", trainer="ppo", release="0.9.1", config=BASE)
def test_data_metrics_token_stats_are_over_the_whole_batchs_valid_tokens(p):
    """critic/advantages, returns and values (mean, max, min): compute_data_metrics masks the padded batch with
    response_mask (tool-output tokens out) and reduces all the batch's valid tokens at once (torch.masked_select),
    not per sequence nor per group; the values are the rollout-time ones the batch holds."""
    run, got = step()
    m, d = run.metrics, got.data.batch
    p.check(got.use_critic is True, "compute_data_metrics was not asked for the critic metrics")
    mask = d["response_mask"].bool()
    p.check(int(mask.sum()) < int(d["response_length"].sum()), "the batch has no tool-output tokens to leave out")
    for name in ("advantages", "returns", "values"):
        seqs = ragged(d[name], mask)
        p.check(len({len(s) for s in seqs}) > 3, f"{name}: the sequences are not ragged")
        for stat in ("mean", "max", "min"):
            key = f"critic/{name}/{stat}"
            p.assert_stated(key, token_observations(m[key], seqs), levels=DRIVER,
                            tokens=("token_mean", "seq_mean_token_mean", "seq_mean_token_sum"), stats=(stat,))
        flat = [v for s in seqs for v in s]
        seq_means = [statistics.fmean(s) for s in seqs]
        p.check(not close(m[f"critic/{name}/mean"], statistics.fmean(seq_means)),
                f"critic/{name}/mean equals the mean of sequence means: the batch does not tell them apart")
        p.check(close(m[f"critic/{name}/max"], max(flat)) and close(m[f"critic/{name}/min"], min(flat)),
                f"critic/{name}: max/min are not the batch's extreme valid tokens")


@proof("verl", trainer="ppo", release="0.9.1", config=BASE)
def test_data_metrics_sequence_stats_are_over_the_batchs_sequences(p):
    """critic/score and critic/rewards (mean, max, min: each sequence's summed token-level scores / rewards) and
    prompt_length (mean, max, min): one value per sequence, reduced over the whole batch at once; the clip ratios:
    the fraction of sequences as long as the padded width, which the V1 trainer pads to the batch's longest."""
    run, got = step()
    m, d = run.metrics, got.data.batch
    scores = [float(x) for x in d["token_level_scores"].sum(-1).tolist()]
    rewards = [float(x) for x in d["token_level_rewards"].sum(-1).tolist()]
    p.check(all(x > 0 for x in d["response_length"].tolist()), "an aborted sequence: score/rewards leave it out")
    for name, values in (("score", scores), ("rewards", rewards)):
        for stat in ("mean", "max", "min"):
            key = f"critic/{name}/{stat}"
            p.assert_stated(key, per_seq_observations(m[key], values), levels=DRIVER, tokens=("per_seq",),
                            stats=(stat,))
    prompts = [float(x) for x in d["prompt_length"].tolist()]
    p.check(prompts == [float(n) for n in ROLLOUT.prompt_lens], (prompts, ROLLOUT.prompt_lens))
    for stat in ("mean", "max", "min"):
        key = f"prompt_length/{stat}"
        p.assert_stated(key, per_seq_observations(m[key], prompts), levels=DRIVER, tokens=("per_seq",), stats=(stat,))
    # clip ratios: per sequence, 1 when its length is the padded width (the batch's longest in the V1 trainer)
    for key, lengths, width in (("prompt_length/clip_ratio", prompts, d["prompts"].shape[-1]),
                                ("response_length/clip_ratio", [float(x) for x in d["response_length"].tolist()],
                                 d["responses"].shape[-1])):
        p.check(width == max(lengths) and width < max(BASE["data.max_prompt_length"],
                                                       BASE["data.max_response_length"]),
                f"{key}: the padded width {width} is not the batch's longest {max(lengths)}")
        clipped = [1.0 if n == width else 0.0 for n in lengths]
        p.check(0 < sum(clipped) < len(clipped) / 2, f"{key}: {sum(clipped)} of {len(clipped)} clipped")
        p.assert_stated(key, per_seq_observations(m[key], clipped), levels=DRIVER, tokens=("per_seq",))
        _, res = p.entry(key)
        p.check(res.fields["clip_length"] == "batch_longest", (key, res.fields))


def test_vf_explained_var_is_one_number_over_the_valid_tokens():
    """critic/vf_explained_var: 1 - Var(returns - values) / (Var(returns) + 1e-5) over all the batch's valid tokens
    at once (response_mask: tool-output tokens out), not the mean of per-sequence explained variances nor over every
    response position. Not a registered proof: the fingerprint candidates are means, extrema, sums and standard
    deviations, which an explained variance is none of; checked here against its alternatives instead."""
    run, got = step()
    d = got.data.batch
    mask = d["response_mask"].bool()
    valid = d["response_length"].long()
    positions = [[1 if j < int(n) else 0 for j in range(mask.shape[-1])] for n in valid.tolist()]

    def explained(ret, val):
        diff = [r - v for r, v in zip(ret, val)]
        return 1 - statistics.variance(diff) / (statistics.variance(ret) + 1e-5)

    def pooled(m):
        return ([v for s in ragged(d["returns"], m) for v in s], [v for s in ragged(d["values"], m) for v in s])

    logged = run.metrics["critic/vf_explained_var"]
    assert close(logged, explained(*pooled(mask)), 1e-5), (logged, explained(*pooled(mask)))
    assert not close(logged, explained(*pooled(positions)), 1e-3), "tool tokens do not change it: a weak batch"
    per_seq = [explained(r, v) for r, v in zip(ragged(d["returns"], mask), ragged(d["values"], mask)) if len(r) > 1]
    assert not close(logged, statistics.fmean(per_seq), 1e-3)


# ------------------------------------------------------------------------------------------------ timing, throughput
@proof("verl", trainer="ppo", release="0.9.1", config=BASE)
def test_timings_and_throughput_are_the_steps_own_numbers(p):
    """timing_s/{stage} (step, gen, update_actor) and perf/time_per_step are the seconds the trainer timed, as they
    are (no unit change, no sign); timing_per_token_ms/{stage} is the stage's seconds x 1000 per token (response
    tokens for gen, prompt + response tokens for the others); perf/total_num_tokens the step's prompt + response
    tokens (global_token_num) and perf/throughput those tokens per second per GPU. One number each: fingerprinted
    as the one value it is (sign and scale), with the alternatives (another unit, another token count) checked
    to give other numbers."""
    run, got = step()
    m, t = run.metrics, got.timing
    p.check(set(t) >= {"step", "gen", "update_actor"} and len(set(t.values())) == len(t), t)
    for stage, secs in t.items():
        p.assert_stated(f"timing_s/{stage}", m[f"timing_s/{stage}"], [[[[[[float(secs)]]]]]], levels=())
        p.check(m[f"timing_s/{stage}"] == secs and not close(m[f"timing_s/{stage}"], secs * 1000), stage)
    p.assert_stated("perf/time_per_step", m["perf/time_per_step"], [[[[[[float(t["step"])]]]]]], levels=())
    d = got.timing_batch.batch
    resp = float(d["response_length"].sum())
    total = resp + float(d["prompt_length"].sum())
    p.check(resp < total and total == sum(got.global_token_num), (resp, total, got.global_token_num))
    for stage, tokens, other in (("gen", resp, total), ("update_actor", total, resp)):
        per_token = t[stage] * 1000 / tokens
        key = f"timing_per_token_ms/{stage}"
        p.assert_stated(key, m[key], [[[[[[per_token]]]]]], levels=())
        p.check(not close(m[key], t[stage] * 1000 / other) and not close(m[key], t[stage] / tokens), key)
    # total tokens: the per-sequence counts summed over the whole batch (not a mean, not one rank's)
    p.check(len(got.global_token_num) == ROLLOUT.n, got.global_token_num)
    p.assert_stated("perf/total_num_tokens", m["perf/total_num_tokens"], [[[[[[total]]]]]], levels=())
    p.check(not close(m["perf/total_num_tokens"], total / WORLD), "perf/total_num_tokens is per rank")
    p.check(got.n_gpus == WORLD, got.n_gpus)
    tput = total / (t["step"] * WORLD)
    p.assert_stated("perf/throughput", m["perf/throughput"], [[[[[[tput]]]]]], levels=())
    p.check(not close(m["perf/throughput"], total / t["step"]), "perf/throughput is not per GPU")


@proof("verl", trainer="ppo", release="0.9.1", config=BASE)
def test_step_counters_are_the_step_and_epoch_passed(p):
    """training/global_step and training/epoch: the counters _compute_metrics is called with (global_steps=1,
    epoch=0 in tests/_support/proofs_verl.py run_step), logged as they are."""
    run, _ = step()
    p.assert_stated("training/global_step", run.metrics["training/global_step"], [[[[[[1.0]]]]]], levels=())
    p.assert_stated("training/epoch", run.metrics["training/epoch"], [[[[[[0.0]]]]]], levels=())
    p.check(run.metrics["training/global_step"] == 1.0 and run.metrics["training/epoch"] == 0.0, run.metrics)


# ------------------------------------------------------------------------------------------------ load balance
@proof("verl", trainer="ppo", release="0.9.1", config=BASE)
def test_global_seqlen_is_per_partition_token_sums(p):
    """global_seqlen/* (seqlen_balancing.log_seqlen_unbalance, as the trainer calls it with the balanced
    partitions): sums of sequence lengths per data-parallel partition; min/max over the contiguous shares before
    balancing and balanced_min/balanced_max over the partitions after, mean the total over the partitions,
    minmax_diff max - min. Each logged as the one number it is."""
    c = V.code()
    from verl.utils import seqlen_balancing as SB
    seqlens = [p_ + r for p_, r in zip(ROLLOUT.prompt_lens, ROLLOUT.resp_lens)]
    k = 4
    partitions = SB.get_seqlen_balanced_partitions(seqlens, k_partitions=k, equal_size=True)
    out = {key: float(v) for key, v in SB.log_seqlen_unbalance(seqlens, partitions, prefix="global_seqlen").items()}
    size = len(seqlens) // k
    shares = [sum(seqlens[i:i + size]) for i in range(0, len(seqlens), size)]
    balanced = [sum(seqlens[i] for i in part) for part in partitions]
    p.check(len(set(shares)) > 1 and max(balanced) - min(balanced) < max(shares) - min(shares),
            (shares, balanced))
    for key, value in (("global_seqlen/min", min(shares)), ("global_seqlen/max", max(shares)),
                       ("global_seqlen/minmax_diff", max(shares) - min(shares)),
                       ("global_seqlen/balanced_min", min(balanced)), ("global_seqlen/balanced_max", max(balanced)),
                       ("global_seqlen/mean", sum(seqlens) / k)):
        p.assert_stated(key, out[key], [[[[[[float(value)]]]]]], levels=())
    p.check(not close(out["global_seqlen/mean"], statistics.fmean(seqlens)), "mean is per sequence")
    p.check(c.release == "0.9.1", c.release)


# ------------------------------------------------------------------------------------------------ validation
DS = "openai/gsm8k"            # a data source with '/' in it, as the entries' {data_source:path} allows
N_PROMPTS, N_SAMPLES = 16, 4


def validation_samples(seed: int = 5):
    """16 prompts x 4 samples of one data source: a continuous reward (the core variable: no acc), a second
    continuous variable (val-aux), and a prediction to vote on (maj@)."""
    rng = random.Random(seed)
    ds, uids, reward, fmt, pred = [], [], [], [], []
    for q in range(N_PROMPTS):
        spread = rng.uniform(0.05, 1.5)          # prompts of uneven spread: per-prompt stds differ
        centre = rng.uniform(-1, 1)
        for _ in range(N_SAMPLES):
            ds.append(DS)
            uids.append(f"q{q}")
            reward.append(round(centre + rng.uniform(-spread, spread), 6))
            fmt.append(round(rng.uniform(0, 1), 6))
            pred.append(rng.choice("ABC"))
    return ds, uids, {"reward": reward, "format": fmt, "pred": pred}


def per_prompt(values: list, uids: list) -> list[list[float]]:
    out: dict = {}
    for v, u in zip(values, uids):
        out.setdefault(u, []).append(float(v))
    return list(out.values())


@proof("verl", trainer="ppo", release="0.9.1", config=BASE)
def test_validation_metrics_average_per_prompt_values_over_prompts(p):
    """val-core/{data_source}/{var}/mean@{n}, std@{n}, best@{n}/mean|std, worst@{n}/mean|std, maj@{n}/mean|std
    (the V1 trainer's _val_metrics_update -> process_validation_metrics): each prompt's n samples give the prompt's
    value (their mean; their population std; veRL's bootstrap of best/worst/majority of n, captured as
    bootstrap_metric returned it), and the logged value is the unweighted mean of the prompts' values over the
    data source (np.mean over uids): fingerprinted against the prompts' values cut into uneven groups. val-core
    holds mean/best/maj at the largest n of the core variable; the rest goes to val-aux."""
    ds, uids, infos = validation_samples()
    logged, calls = V.run_validation(ds, uids, infos)
    prompts = {var: per_prompt(infos[var], uids) for var in ("reward", "format")}
    p.check(all(len(s) == N_SAMPLES for s in prompts["reward"]) and len(prompts["reward"]) == N_PROMPTS, prompts)
    # the prompts' own values: what veRL reduced per prompt (mean / population std of the n samples), and what its
    # bootstrap returned per prompt
    boot: dict = {}
    for size, data, out in calls:
        if isinstance(data[0], dict):
            boot[("maj", size, tuple(d["val"] for d in data))] = out[0]
        else:
            boot[("best", size, tuple(data))] = out[0]
            boot[("worst", size, tuple(data))] = out[1]
    pref = {"reward": "val-core", "format": "val-aux"}
    checked = 0
    for var, groups in prompts.items():
        sec = pref[var]
        for name, values in ((f"mean@{N_SAMPLES}", [statistics.fmean(g) for g in groups]),
                             (f"std@{N_SAMPLES}", [statistics.pstdev(g) for g in groups])):
            key = f"{'val-aux' if name.startswith('std') else sec}/{DS}/{var}/{name}"
            p.assert_stated(key, per_seq_observations(logged[key], values), levels=DRIVER, tokens=("per_seq",))
            checked += 1
        for kind in ("best", "worst", "maj"):
            for n in (2, N_SAMPLES):
                pairs = [boot[(kind, n, tuple(g))] for g in groups]
                core = sec == "val-core" and kind != "worst" and n == N_SAMPLES
                for i, stat in enumerate(("mean", "std")):
                    key = f"{'val-core' if core else 'val-aux'}/{DS}/{var}/{kind}@{n}/{stat}"
                    p.assert_stated(key, per_seq_observations(logged[key], [pr[i] for pr in pairs]),
                                    levels=DRIVER, tokens=("per_seq",))
                    checked += 1
    p.check(checked == 2 * (2 + 3 * 2 * 2), checked)
    # population std, not the sample std; the mean over prompts, not over the pooled samples (equal here: every
    # prompt has n samples) nor the sample std of the pooled samples
    key = f"val-aux/{DS}/reward/std@{N_SAMPLES}"
    p.check(not close(logged[key], statistics.fmean(statistics.stdev(g) for g in prompts["reward"])), key)
    p.check(not close(logged[key], statistics.pstdev([v for g in prompts["reward"] for v in g])), key)


def test_validation_layouts_tell_the_prompt_reductions_apart():
    """The prompts' values in the validation proof's layouts make the mean differ from a mean of group means, the
    last group's and a group max: else the per_seq fingerprint of an unweighted prompt mean proves nothing."""
    ds, uids, infos = validation_samples()
    values = [statistics.fmean(g) for g in per_prompt(infos["reward"], uids)]
    for _, batch in per_seq_observations(0.0, values):
        groups = [[s[0] for s in g] for rank in batch[0][0] for g in rank]
        mean = statistics.fmean(values)
        assert not close(mean, statistics.fmean(statistics.fmean(g) for g in groups))
        assert not close(mean, statistics.fmean(groups[-1]))


def test_rollouts_of_another_seed_give_other_data_metrics():
    """The data-metrics proofs read the batch veRL was given: another seed (the same shapes) changes the logged
    advantages, so the fingerprints follow the data rather than a fixed layout."""
    run, _ = step()
    other, got = V.run_step_driver(dataclasses.replace(ROLLOUT, seed=11), mini_batch_size=MINI, micro_size=MICRO,
                                   epochs=1, critic=False)
    assert not close(run.metrics["critic/advantages/mean"], other.metrics["critic/advantages/mean"])
    assert got.use_critic is False and "critic/values/mean" not in other.metrics


# ------------------------------------------------------------------------------------------------ rollout vs trainer
def debug_batch(seed: int = 7):
    """A padded batch as _compute_old_log_prob hands calculate_debug_metrics (rollout.calculate_log_probs): the
    trainer's old log-probs beside the inference engine's, ragged responses (response_mask), tool tokens out."""
    c = V.code()
    torch = c.torch
    g = torch.Generator().manual_seed(seed)
    lens = ROLLOUT.resp_lens
    n, width = len(lens), max(lens)
    mask = torch.zeros(n, width, dtype=torch.long)
    for i, k in enumerate(lens):
        mask[i, :k] = 1
        for j, t in enumerate(ROLLOUT.tool[i][:k]):
            mask[i, j] = 0 if t else 1
    old = -torch.rand(n, width, generator=g) * 2 - 0.05
    rollout = old + (torch.rand(n, width, generator=g) - 0.5) * 0.6
    td = c.TensorDict({"old_log_probs": old, "rollout_log_probs": rollout, "response_mask": mask,
                       "responses": torch.full((n, width), 5)}, batch_size=[n])
    return c.DataProto(batch=td), old, rollout, mask


@proof("verl", trainer="ppo", release="0.9.1", config=BASE)
def test_rollout_probs_diffs_are_statistics_of_the_batchs_valid_tokens(p):
    """training/rollout_probs_diff_{mean,max,std,valid} (utils/debug/metrics.py calculate_debug_metrics): |p_old -
    p_rollout| of every valid response token of the batch at once (masked_select, tool tokens out): _mean its mean
    (not a mean of sequence means), _max its largest, _std its sample std (Bessel-corrected, not the population
    std), _valid 1 when any token is valid and 0 when none is (a flag, not the number of tokens). Three batches."""
    from verl.utils.debug.metrics import calculate_debug_metrics
    runs = []
    for seed in (7, 8, 9):
        data, old, rollout, mask = debug_batch(seed)
        logged = {k: float(v) for k, v in calculate_debug_metrics(data).items()}
        runs.append((logged, ragged((old.exp() - rollout.exp()).abs(), mask.bool())))
    for stat, stats, kw in (("mean", ("mean",), {}), ("max", ("max", "min", "mean"), {}),
                            ("std", ("std", "mean"), {})):
        key = f"training/rollout_probs_diff_{stat}"
        observed = [o for logged, diffs in runs for o in token_observations(logged[key], diffs)]
        found = p.assert_stated(key, observed, tokens=("token_mean", "seq_mean_token_mean"), stats=stats, levels=(),
                                **kw)
        p.check(found.tokens == "token_mean" and found.stat == stat, (key, found))
    for logged, diffs in runs:
        pooled = [v for d in diffs for v in d]
        p.check(not close(logged["training/rollout_probs_diff_mean"], statistics.fmean(statistics.fmean(d)
                                                                                      for d in diffs)), "per seq")
        p.check(not close(logged["training/rollout_probs_diff_std"], statistics.pstdev(pooled)), "population std")
        p.check(logged["training/rollout_probs_diff_valid"] == 1.0 and len(pooled) > 1, logged)
    p.assert_stated("training/rollout_probs_diff_valid", runs[0][0]["training/rollout_probs_diff_valid"],
                    [[[[[[1.0]]]]]], levels=())
    # no valid token: the flag is 0 and the statistics NaN (not a count of tokens, not left out)
    data, *_ = debug_batch(7)
    data.batch["response_mask"].zero_()
    empty = {k: float(v) for k, v in calculate_debug_metrics(data).items()}
    p.check(empty["training/rollout_probs_diff_valid"] == 0.0
            and all(v != v for k, v in empty.items() if k.endswith(("_max", "_mean", "_std"))), empty)


# ------------------------------------------------------------------------------------------------ KL in the reward
def kl_batch(seed: int = 9):
    """The padded batch _compute_advantage builds (response_mask, rm_scores as token_level_scores, the old and
    reference log-probs) for ROLLOUT's ragged responses, tool tokens out of the mask."""
    c = V.code()
    torch = c.torch
    data, old, _, mask = debug_batch(seed)
    g = torch.Generator().manual_seed(seed + 1)
    ref = old + (torch.rand(old.shape, generator=g) - 0.5) * 0.8
    td = c.TensorDict({"old_log_probs": old, "ref_log_prob": ref, "response_mask": mask,
                       "token_level_scores": torch.zeros(old.shape), "responses": torch.full(old.shape, 5)},
                      batch_size=[old.shape[0]])
    return c.DataProto(batch=td), mask


KL_IN_REWARD = dict(BASE, **{"algorithm.use_kl_in_reward": True, "algorithm.kl_penalty": "kl",
                             "algorithm.kl_ctrl.kl_coef": 0.05, "algorithm.kl_ctrl.type": "adaptive"})


@proof("verl", trainer="ppo", release="0.9.1", config=KL_IN_REWARD)
def test_reward_kl_penalty_is_the_mean_of_sequence_token_means(p):
    """actor/reward_kl_penalty (apply_kl_penalty under algorithm.use_kl_in_reward, kl_penalty kl = k1): the k1 KL
    core_algos.kl_penalty returns, masked with response_mask, averaged per sequence and then over sequences (not the
    batch's token mean); actor/reward_kl_penalty_coeff: the controller's beta the rewards were penalised with,
    read before the adaptive controller's update."""
    c = V.code()
    data, mask = kl_batch()
    old, ref = data.batch["old_log_probs"].clone(), data.batch["ref_log_prob"].clone()
    ctrl = c.core_algos.AdaptiveKLController(init_kl_coef=0.05, target_kl=0.01, horizon=100)
    data, logged, seen = V.run_kl_penalty(data, ctrl, "kl")
    p.check(len(seen) == 1, seen)
    kld = ragged(seen[0], mask.bool())
    p.check(all(close(v, o - r) for v, o, r in zip([x for s in kld for x in s],
                                                    [x for s in ragged(old, mask.bool()) for x in s],
                                                    [x for s in ragged(ref, mask.bool()) for x in s])),
            "the KL veRL computed is not k1 = old - ref")
    p.assert_stated("actor/reward_kl_penalty", token_observations(logged["actor/reward_kl_penalty"], kld),
                    levels=DRIVER, tokens=("token_mean", "seq_mean_token_mean", "seq_mean_token_sum"))
    p.check(not close(logged["actor/reward_kl_penalty"], statistics.fmean(v for s in kld for v in s)),
            "the mean of sequence means equals the token mean: the batch does not tell them apart")
    p.assert_stated("actor/reward_kl_penalty_coeff", logged["actor/reward_kl_penalty_coeff"], [[[[[[0.05]]]]]],
                    levels=())
    p.check(logged["actor/reward_kl_penalty_coeff"] == 0.05 and not close(ctrl.value, 0.05),
            (logged["actor/reward_kl_penalty_coeff"], ctrl.value))


def _prove_reward_kl_estimator(p, penalty: str, estimator, stated: str) -> None:
    """actor/reward_kl_penalty under algorithm.kl_penalty ``penalty``: the estimator core_algos.kl_penalty returns
    (checked against ``estimator(old, ref)`` token by token, and the entry trackbridge picks for the config states
    it: ``stated``), averaged per sequence and then over sequences."""
    import math
    c = V.code()
    data, mask = kl_batch()
    old, ref = data.batch["old_log_probs"].clone(), data.batch["ref_log_prob"].clone()
    ctrl = c.core_algos.AdaptiveKLController(init_kl_coef=0.05, target_kl=0.01, horizon=100)
    data, logged, seen = V.run_kl_penalty(data, ctrl, penalty)
    p.check(len(seen) == 1, seen)
    kld = ragged(seen[0], mask.bool())
    pairs = zip([x for s in kld for x in s], [x for s in ragged(old, mask.bool()) for x in s],
                [x for s in ragged(ref, mask.bool()) for x in s])
    p.check(all(math.isclose(v, estimator(o, r), rel_tol=1e-4, abs_tol=1e-6) for v, o, r in pairs),
            f"the KL veRL computed under kl_penalty {penalty} is not the estimator")
    p.assert_stated("actor/reward_kl_penalty", token_observations(logged["actor/reward_kl_penalty"], kld),
                    levels=DRIVER, tokens=("token_mean", "seq_mean_token_mean", "seq_mean_token_sum"))
    _entry, res = p.entry("actor/reward_kl_penalty")
    p.check(res.fields["estimator"] == stated, (penalty, res.fields))


def _k3(o: float, r: float) -> float:
    import math
    return math.exp(r - o) - (r - o) - 1


@proof("verl", trainer="ppo", release="0.9.1", config={**KL_IN_REWARD, "algorithm.kl_penalty": "low_var_kl"})
def test_reward_kl_penalty_low_var_kl_is_k3_sequence_means(p):
    _prove_reward_kl_estimator(p, "low_var_kl", _k3, "k3")


@proof("verl", trainer="ppo", release="0.9.1", config={**KL_IN_REWARD, "algorithm.kl_penalty": "k3"})
def test_reward_kl_penalty_k3_is_k3_sequence_means(p):
    _prove_reward_kl_estimator(p, "k3", _k3, "k3")


@proof("verl", trainer="ppo", release="0.9.1", config={**KL_IN_REWARD, "algorithm.kl_penalty": "mse"})
def test_reward_kl_penalty_mse_is_k2_sequence_means(p):
    _prove_reward_kl_estimator(p, "mse", lambda o, r: 0.5 * (o - r) ** 2, "k2")


@proof("verl", trainer="ppo", release="0.9.1", config={**KL_IN_REWARD, "algorithm.kl_penalty": "k2"})
def test_reward_kl_penalty_k2_is_k2_sequence_means(p):
    _prove_reward_kl_estimator(p, "k2", lambda o, r: 0.5 * (o - r) ** 2, "k2")


@proof("verl", trainer="ppo", release="0.9.1", config={**KL_IN_REWARD, "algorithm.kl_penalty": "abs"})
def test_reward_kl_penalty_abs_is_the_absolute_log_ratios_sequence_means(p):
    _prove_reward_kl_estimator(p, "abs", lambda o, r: abs(o - r), "abs")


# ------------------------------------------------------------------------------------------------ turns, aborted
@proof("verl", trainer="ppo", release="0.9.1", config=BASE)
def test_num_turns_are_per_sequence_over_the_batch(p):
    """num_turns/{mean,max,min} (compute_data_metrics on the __num_turns__ the V1 trainer exposes from the rollout's
    num_turns): one value per sequence, over the whole batch."""
    run, got = step()
    turns = [float(x) for x in got.data.non_tensor_batch["__num_turns__"].tolist()]
    p.check(len(set(turns)) > 1, turns)
    seqs = [[v] for v in turns]
    for stat in ("mean", "max", "min"):
        key = f"num_turns/{stat}"
        # most sequences tie on the extremes (1 or 2 turns): layouts that put all of one extreme in one group, first
        # or last of its rank, so that a group's or a rank's selection misses it
        n, lo, hi = len(turns), turns.count(min(turns)), turns.count(max(turns))
        up, down = sorted(seqs), sorted(seqs, reverse=True)
        extra = [(run.metrics[key], [[layout(order, cut)]]) for order, cut in
                 ((up, ((lo, 1), (1, 1, n - lo - 3))), (up, ((1, 1, n - hi - 3), (1, hi))),
                  (down, ((hi, 1), (1, 1, n - hi - 3))), (down, ((1, 1, n - lo - 3), (1, lo))))]
        p.assert_stated(key, per_seq_observations(run.metrics[key], turns) + extra, levels=DRIVER,
                        tokens=("per_seq",), stats=(stat,))


def aborted_batch():
    """The V1 trainer's metrics batch (_compute_metrics: prompt_length / response_length beside the padded
    tensors) of 16 sequences, 3 of them aborted (response length 0), the rest ragged and none truncated."""
    c = V.code()
    torch = c.torch
    resp = [2, 0, 3, 9, 1, 4, 0, 2, 3, 7, 2, 5, 9, 0, 6, 3]
    prompt = ROLLOUT.prompt_lens
    n, width, pw = len(resp), max(resp), max(prompt)
    mask = torch.zeros(n, width, dtype=torch.long)
    for i, k in enumerate(resp):
        mask[i, :k] = 1
    g = torch.Generator().manual_seed(13)
    scores = torch.zeros(n, width)
    for i, k in enumerate(resp):
        if k:
            scores[i, k - 1] = float(ROLLOUT.scores[i])
    adv = torch.randn(n, width, generator=g) * mask
    td = c.TensorDict({"prompts": torch.full((n, pw), 5), "responses": torch.full((n, width), 5),
                       "response_mask": mask, "token_level_scores": scores, "token_level_rewards": scores,
                       "advantages": adv, "returns": adv, "prompt_length": torch.tensor(prompt).float(),
                       "response_length": torch.tensor(resp).float()}, batch_size=[n])
    return c.DataProto(batch=td), resp


@proof("verl", trainer="ppo", release="0.9.1", config=BASE)
def test_aborted_sequences_are_left_out_of_the_non_aborted_stats(p):
    """response/aborted_ratio: the fraction of sequences with an empty response; response_length_non_aborted/*:
    the lengths (mean, max, min, clip ratio against the padded width, the batch's longest in the V1 trainer) over
    the non-aborted sequences only; response_length/mean counts the aborted ones as 0 (metric_utils.py
    compute_data_metrics on the batch the V1 trainer builds)."""
    c = V.code()
    data, resp = aborted_batch()
    m = {k: float(v) for k, v in c.metric_utils.compute_data_metrics(data, use_critic=False).items()}
    aborted = [1.0 if k == 0 else 0.0 for k in resp]
    p.check(0 < sum(aborted) < len(resp) / 4, aborted)
    p.assert_stated("response/aborted_ratio", per_seq_observations(m["response/aborted_ratio"], aborted),
                    levels=DRIVER, tokens=("per_seq",))
    kept = [float(k) for k in resp if k]
    shares = ((3, 1, 2), (2, 3, 1, 1))          # 13 sequences left
    for stat in ("mean", "max", "min"):
        key = f"response_length_non_aborted/{stat}"
        p.assert_stated(key, per_seq_observations(m[key], kept, shares, ((5, 1, 1), (1, 1, 4))), levels=DRIVER,
                        tokens=("per_seq",), stats=(stat,))
    p.check(not close(m["response_length_non_aborted/mean"], m["response_length/mean"]),
            "the aborted sequences do not change the mean")
    width = data.batch["responses"].shape[-1]
    clipped = [1.0 if k == width else 0.0 for k in kept]
    p.check(0 < sum(clipped) and width == max(resp), (clipped, width))
    p.assert_stated("response_length_non_aborted/clip_ratio",
                    per_seq_observations(m["response_length_non_aborted/clip_ratio"], clipped, shares,
                                         ((5, 1, 1), (1, 1, 4))), levels=DRIVER, tokens=("per_seq",))
    p.check(not close(m["response_length_non_aborted/clip_ratio"], m["response_length/clip_ratio"]),
            "the clip ratios over all and over the non-aborted sequences coincide")


# ------------------------------------------------------------------------------------------------ GDPO (issue 33)
GDPO = {"trainer.use_v1": False, "algorithm.adv_estimator": "gdpo"}


@proof("verl", trainer="ppo", release="0.9.1", config=GDPO)
def test_gdpo_reward_function_statistics_are_over_the_batchs_sequences(p):
    """gdpo/{reward_fn}/mean, std, max, min (RayPPOTrainer.fit's GDPO block, compiled from ray_trainer.py's own text:
    tests/_support/fidelity_proofs.py run_verl_driver): the statistics of the reward function's per-sequence scores
    over the whole batch on the driver, the std the population's (numpy)."""
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
