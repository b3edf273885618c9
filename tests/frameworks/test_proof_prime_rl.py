"""Fingerprints of prime-rl v0.8.1.dev67's RL trainer metrics (issue 33 item 1), run by prime-rl's own code from its
vendored files (tests/_support/proofs_prime_rl.py): one step of the training loop of
src/prime_rl/trainer/rl/train.py (the statements of its ``while True:`` body, lines 262-711, compiled from the file's
text) on three simulated data-parallel ranks sharing one tiny model, each with two packed micro-batches of uneven
samples (prompt tokens and padding outside the loss mask). The loop itself composes the pieces: the per-token
log-probs and entropy from the logits (loss.py's ``selective_log_softmax``, ``compute_entropy``; train.py:436-457),
``compute_loss`` with the global token count (:307-323, :461-474), the tensors appended per micro-batch (:483-539),
``Tensors.compute_stats`` (utils.py:245-281, an all-gather over the ranks; train.py:623), the perf, optimizer, tensor
and time dicts handed to ``monitors.log`` (:651-688) and the printed step line (:638-648).

What the proofs compare a logged value with is what prime-rl's code was given or computed per token (the entropy
and log-probs the loop handed its token exporter, the clock's readings, the device counter's readings, the gradients
clip_grad_norm_ was handed), never a value this file computes the metric from; each is fingerprinted against every
candidate reduction and must be the one mappings/prime_rl.yaml states and no other."""
from __future__ import annotations

import functools
import math
import re
import statistics

import pytest

pytest.importorskip("torch")
pytest.importorskip("pydantic")

import torch  # noqa: E402

from _support import fingerprint as FP  # noqa: E402
from _support import proofs_prime_rl as PR  # noqa: E402
from _support.proven import close, proof  # noqa: E402

M = PR.MicroBatch
#: [rank][micro-batch]: every micro-batch packed to 16 tokens (prime-rl's seq_len); samples of uneven lengths and
#: prompts, padding as a sample of its own outside the loss mask; the ranks hold uneven token counts
LAYOUT = [[M([5, 7, 4], [2, 3, 1]), M([9, 3, 4], [4, 1, 0], pad=1)],
          [M([3, 13], [1, 2]), M([6, 6, 2, 2], [2, 1, 0, 1], pad=1)],
          [M([11, 5], [3, 2]), M([4, 4, 4, 4], [1, 1, 1, 1])]]
RELEASE = PR.RELEASE
CONFIG = {"optim.max_norm": 1.0}
POOLED = ("micro_batches", "processes")


@functools.lru_cache(maxsize=None)
def step(max_norm: float = 1.0) -> PR.StepRun:
    return PR.run_step(LAYOUT, max_norm=max_norm)


def step_line(run: PR.StepRun) -> dict[str, float]:
    """rank 0's printed step line (train.py:638-648), each ``Label value [unit]`` item as its label and number."""
    assert len(run.step_lines) == 1, run.step_lines
    out = {}
    for item in run.step_lines[0].split(" | ")[2:]:
        m = re.fullmatch(r"(.+?) (-?[0-9.]+(?:e[-+][0-9]+)?)(?:%| .*)?", item.strip())
        assert m, item
        out[m.group(1)] = float(m.group(2))
    return out


def per_token(run: PR.StepRun, values: str) -> list:
    """The batch (fingerprint's nesting, one logged step, one optimizer step): [rank][micro-batch][sample] the
    per-token ``values`` (what the loop handed its token exporter) at the sample's loss-masked tokens."""
    ranks = []
    for r, rank in enumerate(run.exported):
        micros = []
        for u, got in enumerate(rank):
            mb = run.inputs[r][u]
            vals = got[values].reshape(-1).tolist()
            mask = mb["loss_mask"].reshape(-1).tolist()
            seqs, at = [], 0
            for n in got["sequence_lengths"]:
                seq = [v for v, keep in zip(vals[at:at + n], mask[at:at + n]) if keep]
                if seq:
                    seqs.append(seq)
                at += n
            micros.append(seqs)
        ranks.append(micros)
    return [[ranks]]


def mismatch_kl(run: PR.StepRun) -> list:
    """The per-token k3 of loss.py's compute_importance_ratio_and_mismatch_kl on the loop's own log-probs and the
    inference log-probs it was given, in the same nesting (train.py:508-512)."""
    P = PR.prime()
    for r, rank in enumerate(run.exported):
        for u, got in enumerate(rank):
            inf = run.inputs[r][u]["inference_logprobs"].as_subclass(torch.Tensor)
            log_r, ratio, k3 = P.loss.compute_importance_ratio_and_mismatch_kl(got["logprobs"], inf)
            got["k3"], got["k1"] = k3, log_r
    return per_token(run, "k3")


def pooled(steps: list) -> list[float]:
    return [v for mini in steps[0] for rank in mini for micro in rank for seq in micro for v in seq]


# ------------------------------------------------------------------------------------------------ entropy, KL
@proof("prime_rl", trainer="rl", release=RELEASE, config=CONFIG)
def test_entropy_is_pooled_over_every_masked_token_of_every_rank(p):
    """entropy/all/mean and the step line's Entropy: the per-token entropy of the temperature-scaled logits
    (compute_entropy) at every loss-masked token of every micro-batch, all-gathered over the ranks and averaged once
    (Tensors.compute_stats): the pooled token mean, not a mean of micro-batch, sample or rank means."""
    run = step()
    steps = per_token(run, "entropy")
    p.check(len({len(s) for m in steps[0][0] for u in m for s in u}) > 3, "the samples are not ragged")
    logged = run.logged["entropy/all/mean"]
    p.assert_stated("entropy/all/mean", logged, steps, levels=POOLED)
    vocab = run.model.config.vocab_size
    values = pooled(steps)
    p.check(all(0 < v <= math.log(vocab) + 1e-6 for v in values), "an entropy outside (0, log V]")
    p.check(not close(logged, -statistics.fmean(values)), "entropy/all/mean has its sign flipped")
    p.check(close(run.logged["entropy/all/max"], max(values)), "entropy/all/max is not the pooled maximum")
    printed = step_line(run)["Entropy"]
    # rounded to 4 decimals (5e-5): rel is relative to the batch's largest term too (fingerprint.magnitude)
    p.assert_stated("Entropy", printed, steps, levels=POOLED, rel=5e-5)
    p.check(f"{logged:.4f}" == f"{printed:.4f}", (logged, printed))


@proof("prime_rl", trainer="rl", release=RELEASE, config=CONFIG)
def test_mismatch_kl_is_k3_pooled_over_every_masked_token(p):
    """mismatch_kl/all/mean and the step line's Mismatch KL: r - log r - 1 with r = exp(trainer - inference
    log-prob) at every loss-masked token (no rl/ref-kl weights: the mismatch mask is the loss mask, train.py:499-501),
    all-gathered and averaged once: the pooled token mean of k3, not of k1 and not of per-sample means."""
    run = step()
    steps = mismatch_kl(run)
    logged = run.logged["mismatch_kl/all/mean"]
    p.assert_stated("mismatch_kl/all/mean", logged, steps, levels=POOLED)
    values = pooled(steps)
    p.check(all(v >= 0 for v in values) and logged > 0, "k3 is never negative")
    k1 = pooled(per_token(run, "k1"))
    p.check(not close(logged, statistics.fmean(k1)) and not close(logged, -statistics.fmean(k1)),
            "mismatch_kl/all/mean is the k1 estimator's mean")
    p.check(all(close(k3, math.exp(d) - d - 1, 1e-5) for k3, d in zip(values, k1)), "the per-token KL is not k3")
    printed = step_line(run)["Mismatch KL"]
    p.assert_stated("Mismatch KL", printed, steps, levels=POOLED, rel=1e-5)     # 4 decimals; terms up to O(5)
    p.check(f"{logged:.4f}" == f"{printed:.4f}", (logged, printed))


#: further seeds of the same layout (other advantages, log-probs and model weights): the printed Loss has 4 decimals,
#: a rounding of up to 5e-5 on a value of O(0.03) (the token mean over 6 micro-batches); on the first seed's batch the
#: nearest other candidate (micro-batches token_weighted, ranks seq_weighted) is 5.1e-5 away, barely outside that
#: rounding, and the candidates that fit every seed's line are told apart with a margin
LOSS_SEEDS = (8, 9, 10)


def loss_batch(run: PR.StepRun) -> list:
    """The batch (fingerprint's nesting, one logged step, one optimizer step): [rank][micro-batch] each sample's loss
    sum as loss.py's compute_loss gives it for that sample alone, spread evenly over its loss-masked tokens."""
    P = PR.prime()
    rl_fn = P.loss.setup_rl_loss_fn(run.config.loss)
    return [[[[seq_losses(P, rl_fn, got, run.inputs[r][u]) for u, got in enumerate(rank)]
              for r, rank in enumerate(run.exported)]]]


@proof("prime_rl", trainer="rl", release=RELEASE, config=CONFIG)
def test_loss_mean_is_the_token_mean_over_the_number_of_micro_batches(p):
    """loss/mean and the step line's Loss: each micro-batch's loss is its loss-masked token sum over the step's
    GLOBAL loss-masked token count, all-reduced over the ranks (train.py:307-323, loss.py compute_loss:394), and
    Tensors.compute_stats averages those values over the micro-batches of all ranks (utils.py:272): the step's token
    mean divided by the number of micro-batches on all ranks (``tokens: token_sum_global_norm``, micro-batches
    ``mean``, processes ``all_reduce_mean``), not the token mean. The batch is what loss.py's compute_loss makes of
    each sample alone (its loss sum, spread over its loss-masked tokens): the fingerprint's token sums are
    prime-rl's."""
    runs = [step()] + [PR.run_step(LAYOUT, seed=s) for s in LOSS_SEEDS]
    P = PR.prime()
    rl_fn = P.loss.setup_rl_loss_fn(runs[0].config.loss)
    for run in runs:
        total_tokens = sum(int(mb["loss_mask"].sum()) for rank in run.inputs for mb in rank)
        p.check(all(n["rl_scale"] == total_tokens for n in run.namespaces), "rl_scale is not the global token count")
        # compute_stats puts the all-gathered values back: one per micro-batch of every rank, each compute_loss's
        # sum over the micro-batch divided by the global count
        gathered = run.namespaces[0]["tensors"]["loss"][0]
        micro = []
        for r, rank in enumerate(run.exported):
            for u, got in enumerate(rank):
                mb, split = run.inputs[r][u], got["sequence_lengths"]

                def parts(t):
                    return t.as_subclass(torch.Tensor).reshape(-1).split(split)
                loss_sum, _ = P.loss.compute_loss(parts(got["logprobs"]), parts(mb["inference_logprobs"]), None,
                                                  parts(mb["advantages"]), parts(mb["loss_mask"]), None, None, None,
                                                  rl_fn, 1, 1, 1)
                micro.append(float(loss_sum) / total_tokens)
        p.check(len(gathered) == len(micro) and all(close(a, b, 1e-5) for a, b in zip(gathered, micro)),
                (gathered, micro))
        p.check(f"{run.logged['loss/mean']:.4f}" == f"{step_line(run)['Loss']:.4f}", "Loss is not loss/mean")
    batches = [loss_batch(run) for run in runs]
    logged = [(run.logged["loss/mean"], b) for run, b in zip(runs, batches)]
    p.assert_stated("loss/mean", logged[0][0], batches[0], levels=POOLED)
    p.assert_stated("loss/mean", logged, levels=POOLED)
    token_mean = FP.value_of(batches[0], FP.Reduction("token_mean", "mean", "none", "none", "none", "step"))
    p.check(not close(logged[0][0], token_mean, 1e-3), "loss/mean is the global token mean")
    # 4 decimals: 5e-5 at most, against the batch's largest term (fingerprint.magnitude), on every seed's line
    rel = 5e-5 / min(FP.magnitude(b) for b in batches)
    p.assert_stated("Loss", [(step_line(run)["Loss"], b) for run, b in zip(runs, batches)], levels=POOLED, rel=rel)


def seq_losses(P, rl_fn, got: dict, mb: dict) -> list[list[float]]:
    """A micro-batch's sequences, each its loss sum (loss.py compute_loss on that sequence alone) spread evenly over
    its loss-masked tokens."""
    split = got["sequence_lengths"]

    def parts(t):
        return t.as_subclass(torch.Tensor).reshape(-1).split(split)
    lp, ilp, adv, mask = parts(got["logprobs"]), parts(mb["inference_logprobs"]), parts(mb["advantages"]), \
        parts(mb["loss_mask"])
    out = []
    for i in range(len(split)):
        n = int(mask[i].sum())
        if n:
            loss_sum, _ = P.loss.compute_loss([lp[i]], [ilp[i]], None, [adv[i]], [mask[i]], None, None, None, rl_fn,
                                              1, 1, 1)
            out.append([float(loss_sum) / n] * n)
    return out


# ------------------------------------------------------------------------------------------------ optimizer
@proof("prime_rl", trainer="rl", release=RELEASE, config={"optim.max_norm": 0.05})
def test_grad_norm_is_the_total_norm_before_clipping(p):
    """optim/grad_norm and the step line's Grad. Norm: what clip_grad_norm_ returns (the total 2-norm of the step's
    gradients, every rank's micro-batches accumulated, before clipping), logged once (rank 0's monitors) as it is.
    With optim.max_norm 0.05 below the norm, clipping changes the gradients: the logged value is the norm before."""
    run = step(0.05)
    grads = run.grads[0]
    norm = math.sqrt(sum(float((g.double() ** 2).sum()) for g in grads))
    p.check(all(len(g) == len(grads) and all(torch.equal(a, b) for a, b in zip(g, grads)) for g in run.grads),
            "the ranks' clip calls saw other gradients (the shared model's, every rank's backward accumulated)")
    logged = run.logged["optim/grad_norm"]
    p.assert_stated("optim/grad_norm", logged, [[[[[[norm]]]]]], levels=())
    p.check(norm > 0.05 and not close(logged, 0.05), "the batch's gradients are not clipped: before = after")
    printed = step_line(run)["Grad. Norm"]
    p.assert_stated("Grad. Norm", printed, [[[[[[norm]]]]]], levels=(), rel=1e-3)


@proof("prime_rl", trainer="rl", release=RELEASE, config=CONFIG)
def test_lr_is_read_after_the_scheduler_step(p):
    """optim/lr and the step line's LR: optimizer.param_groups[0]['lr'] read after scheduler.step()
    (train.py:570-572) under a linear warm-up (setup_linear_scheduler): the next step's rate, not the one the
    optimizer step used."""
    run = step()
    after, before = run.lr_after[0], run.lr_before[0]
    p.check(not math.isclose(after, before, rel_tol=1e-3), "the warm-up does not change the rate in one step")
    logged = run.logged["optim/lr"]
    p.assert_stated("optim/lr", logged, [[[[[[after]]]]]], levels=())
    p.check(not math.isclose(logged, before, rel_tol=1e-3), "optim/lr is the rate before the scheduler step")
    p.assert_stated("LR", step_line(run)["LR"], [[[[[[after]]]]]], levels=(), rel=5e-3)


# ------------------------------------------------------------------------------------------------ perf, memory
@proof("prime_rl", trainer="rl", release=RELEASE, config=CONFIG)
def test_throughput_and_mfu_are_the_steps_tokens_over_the_forward_backward_seconds(p):
    """perf/throughput (and Throughput): the step's tokens on all ranks, padding included (dp x seq_len x
    micro-batches, train.py:626-627), over the forward-backward seconds (:298 -> :573); perf/throughput_per_gpu the
    same over the world size; perf/mfu (and MFU) PerfCounter.get_step_mfu of them, in percent (hence the entries'
    scale 0.01). One number each, from the clock's readings."""
    run = step()
    clock = run.clocks[0]
    fwd_bwd = clock.at(573) - clock.at(298)
    seq_len = sum(LAYOUT[0][0].lengths)
    tokens = run.world * seq_len * len(LAYOUT[0])
    masked = sum(int(mb["loss_mask"].sum()) for mb in run.inputs[0])
    m = run.logged
    tput = tokens / fwd_bwd
    p.assert_stated("perf/throughput", m["perf/throughput"], [[[[[[tput]]]]]], levels=())
    p.check(not close(m["perf/throughput"], masked / fwd_bwd) and not close(m["perf/throughput"], tput / run.world),
            "perf/throughput is not all ranks' padded tokens per second")
    p.assert_stated("perf/throughput_per_gpu", m["perf/throughput_per_gpu"], [[[[[[tput / run.world]]]]]],
                    levels=())
    c = run.perf_counter
    mfu = 100 * c.num_flop_per_token * tput / c.gpu_peak_flops / run.world
    p.assert_stated("perf/mfu", m["perf/mfu"], [[[[[[mfu]]]]]], levels=())
    p.check(1 < m["perf/mfu"] < 100 and not close(m["perf/mfu"], mfu / 100), "perf/mfu is not in percent")
    line = step_line(run)
    p.assert_stated("Throughput", line["Throughput"], [[[[[[tput]]]]]], levels=(), rel=1e-6)
    p.assert_stated("MFU", line["MFU"], [[[[[[mfu]]]]]], levels=(), rel=1e-2)


@proof("prime_rl", trainer="rl", release=RELEASE, config=CONFIG)
def test_peak_memory_is_rank_zeros_counter_in_gib(p):
    """perf/peak_memory (and Peak Mem.): torch.cuda.max_memory_reserved() / 1024**3 (train.py:633) of rank 0, the
    only rank whose monitors log: the three ranks' counters read 5.5, 3.0 and 9.0 GiB, and the logged value is rank
    0's, not their mean, maximum, minimum or sum."""
    run = step()
    gib = [[[[[b / 1024**3]]] for b in run.peak_bytes]]
    p.check(len(set(run.peak_bytes)) == run.world == 3, run.peak_bytes)
    p.assert_stated("perf/peak_memory", run.logged["perf/peak_memory"], [gib], levels=())
    p.check(not close(run.logged["perf/peak_memory"], run.peak_bytes[0] / 1e9), "perf/peak_memory is not in GiB")
    p.assert_stated("Peak Mem.", step_line(run)["Peak Mem."], [gib], levels=(), rel=1e-2)


# ------------------------------------------------------------------------------------------------ timings
STAGES = {"time/step": (269, 637), "time/wait_for_batch": (281, 283), "time/load_data": (288, 290),
          "time/forward_backward": (298, 573), "time/broadcast_weights": (588, 594), "time/save_ckpt": (610, 612)}


@proof("prime_rl", trainer="rl", release=RELEASE, config=CONFIG)
def test_timings_are_the_seconds_between_the_loops_clock_readings(p):
    """time/step and time/{stage} (wait_for_batch, load_data, forward_backward, broadcast_weights, save_ckpt): each
    the seconds between the two time.perf_counter() readings around its stage (train.py's lines in STAGES), in
    seconds, rank 0's. One number each, from the clock's readings (a weight broadcast and a checkpoint every step
    so that their timers run)."""
    run = step()
    clock = run.clocks[0]
    p.check(len(clock.readings) == 12, clock.readings)
    for key, (start, end) in STAGES.items():
        secs = clock.at(end) - clock.at(start)
        p.assert_stated(key, run.logged[key], [[[[[[secs]]]]]], levels=())
        p.check(not close(run.logged[key], secs * 1000) and run.logged[key] > 0, key)
    other = run.clocks[1]
    p.check(not close(run.logged["time/step"], other.at(637) - other.at(269)), "time/step is not rank 0's")


# ------------------------------------------------------------------------------------------------ orchestrator
REWARDS = (0.0, 1.0, 0.5, 0.25, 1.0, 0.0, 0.75)
OUTPUT = (5, 40, 12, 90, 7, 33, 61, 2)
ADV = (0.5, -0.5, 0.0, 0.3)


def arrivals(offset: int, n: int) -> tuple:
    """One step's arrived episodes (one trace each, groups of two): episode 3 errored, episode 5 not admitted,
    episode 6 cancelled (a stale drop), so the effective cohort is 5 of 8 (4 of 7)."""
    eps = []
    for i in range(n):
        t = PR.make_trace(offset + i, reward=REWARDS[i % 7], n_in=10 + 3 * i, n_out=OUTPUT[i % 8],
                          advantage=ADV[i % 4], error=i == 3)
        eps.append(PR.make_episode(offset + i, t, group=f"g{(offset + i) // 2}", start=i % 2))
    ids = {e.id for e in eps}
    return eps, {e.traces[0].id for e in eps}, ids - {f"e{offset + 5}"}, {f"e{offset + 6}"}


@functools.lru_cache(maxsize=None)
def orchestrated() -> tuple:
    batches = [arrivals(0, 8), arrivals(100, 7)]
    return PR.run_orchestrator(batches), batches


def effective(batch: tuple) -> list:
    """The traces metrics.py's TrainEpisodes.effective keeps: admitted, sampled, not cancelled, no error,
    trainable agent."""
    eps, sampled, admitted, cancelled = batch
    return [t for e in eps for t in e.traces if e.id in admitted and t.id in sampled and e.id not in cancelled
            and not t.has_error and t.agent.trainable]


def layout(values: list, shares: tuple) -> list:
    out, i = [], 0
    for rank in shares:
        groups = []
        for size in rank:
            groups.append(values[i:i + size])
            i += size
        out.append(groups)
    assert i == len(values), (i, len(values))
    return out


def per_seq_observations(logged: float, values: list[float]) -> list:
    """A value an orchestrator computes once over a step's rollouts, against the rollouts' own values in several
    uneven layouts (as given, sorted up and down; cut into groups of uneven sizes): a selection or an unweighted mean
    of groups changes with the layout, the pooled value does not."""
    seqs = [[float(v)] for v in values]
    n = len(seqs)
    assert n >= 4, values
    cuts = [((n - 3, 1), (2,)) if n != 4 else ((2, 1), (1,)), ((1,), (n - 2, 1))]
    out = []
    for order in (list(seqs), sorted(seqs), sorted(seqs, reverse=True)):
        for cut in cuts:
            out.append((logged, [[layout(order, cut)]]))
    return out


DRIVER = ("micro_batches", "processes")


@proof("prime_rl", trainer="rl", release=RELEASE, config={})
def test_response_lengths_are_over_the_steps_rollouts(p):
    """train/agg/effective/num_output_tokens/{mean,max}: over the rollouts shipped to the trainer (effective:
    admitted, sampled, not cancelled, no error), train/agg/all/num_output_tokens/mean over every rollout that
    arrived (EpisodeMetrics.to_wandb, metrics.py:324-336; one trace per episode, so the per-episode sums are the
    rollouts' own counts), each computed once over the step's rollouts."""
    run, batches = orchestrated()
    m = run.step_metrics(1)
    eff = [t.num_output_tokens for t in effective(batches[0])]
    every = [t.num_output_tokens for e in batches[0][0] for t in e.traces]
    p.check(len(eff) == 5 and len(every) == 8 and statistics.fmean(eff) != statistics.fmean(every), (eff, every))
    p.assert_stated("train/agg/effective/num_output_tokens/mean", per_seq_observations(
        m["train/agg/effective/num_output_tokens/mean"], eff), levels=DRIVER, tokens=("per_seq",))
    p.assert_stated("train/agg/effective/num_output_tokens/max", per_seq_observations(
        m["train/agg/effective/num_output_tokens/max"], eff), levels=DRIVER, tokens=("per_seq",), stats=("max",))
    p.check(m["train/agg/effective/num_output_tokens/max"] < max(every), "the max is over every rollout")
    p.assert_stated("train/agg/all/num_output_tokens/mean", per_seq_observations(
        m["train/agg/all/num_output_tokens/mean"], every), levels=DRIVER, tokens=("per_seq",))
    p.check(not close(m["train/agg/all/num_output_tokens/mean"], statistics.fmean(eff)), "all = effective")


@proof("prime_rl", trainer="rl", release=RELEASE, config={})
def test_printed_reward_is_the_mean_over_the_effective_rollouts(p):
    """The orchestrator's step line's Reward (log_train_batch, orchestrator.py:880): the mean reward of the rollouts
    shipped to the trainer (batch.cohort.effective), rounded to 4 decimals; not over every rollout that arrived."""
    run, batches = orchestrated()
    p.check(len(run.lines) == len(batches) == 2, run.lines)
    for step_no, (line, batch) in enumerate(zip(run.lines, batches), start=1):
        printed = float(re.search(r"\| Reward (-?[0-9.]+) \|", line).group(1))
        eff = [t.reward for t in effective(batch)]
        every = [t.reward for e in batch[0] for t in e.traces]
        p.check(round(statistics.fmean(every), 4) != printed, f"step {step_no}: every rollout gives the same mean")
        p.assert_stated("Reward", per_seq_observations(printed, eff), levels=DRIVER, tokens=("per_seq",), rel=1e-4)


@proof("prime_rl", trainer="rl", release=RELEASE, config={})
def test_progress_counts_are_the_steps_sums(p):
    """progress/tokens: every arrived rollout's input + output tokens (batch.episodes.num_total_tokens,
    orchestrator.py:708), errored and filtered ones too; progress/output_tokens: the effective rollouts' output
    tokens (:710); progress/total_tokens and progress/total_rollouts: the totals through the PREVIOUS step (logged at
    :719-720, added at :753-754), so step 2 logs step 1's; progress/rollouts: the count of the arrived rollouts
    (:711 batch.episodes.num_traces; errored, unadmitted and cancelled ones included). One number each, from the
    rollouts given."""
    run, batches = orchestrated()
    m1, m2 = run.step_metrics(1), run.step_metrics(2)
    tokens1 = sum(t.num_total_tokens for e in batches[0][0] for t in e.traces)
    eff_tokens = sum(t.num_total_tokens for t in effective(batches[0]))
    p.assert_stated("progress/tokens", m1["progress/tokens"], [[[[[[float(tokens1)]]]]]], levels=())
    p.check(m1["progress/tokens"] != eff_tokens, "progress/tokens is over the effective rollouts")
    out1 = sum(t.num_output_tokens for t in effective(batches[0]))
    p.assert_stated("progress/output_tokens", m1["progress/output_tokens"], [[[[[[float(out1)]]]]]], levels=())
    p.check(m1["progress/output_tokens"] != sum(t.num_output_tokens for e in batches[0][0] for t in e.traces),
            "progress/output_tokens is over every rollout")
    p.check(m1["progress/total_tokens"] == 0 and m1["progress/total_rollouts"] == 0, "step 1 holds its own")
    p.assert_stated("progress/total_tokens", m2["progress/total_tokens"], [[[[[[float(tokens1)]]]]]], levels=())
    tokens2 = sum(t.num_total_tokens for e in batches[1][0] for t in e.traces)
    p.check(m2["progress/total_tokens"] != tokens1 + tokens2, "progress/total_tokens includes its own step")
    p.assert_stated("progress/total_rollouts", m2["progress/total_rollouts"], [[[[[[8.0]]]]]], levels=())
    p.check(m1["progress/rollouts"] == len(batches[0][0]) == 8 and m2["progress/rollouts"] == 7,
            (m1["progress/rollouts"], m2["progress/rollouts"]))
    # every arrived rollout one item, its reward on each of its output tokens: the count of the rollouts is neither
    # their tokens' count nor their rewards' sum
    arrived = [[[[[[[t.reward] * t.num_output_tokens for e in batch[0] for t in e.traces]]]]] for batch in batches]
    found = p.assert_stated("progress/rollouts", [(run.step_metrics(s + 1)["progress/rollouts"], arrived[s])
                                                  for s in range(2)], levels=(), tokens=("per_seq", "token_mean"),
                            stats=("mean", "sum", "count"))
    p.check(found.stat == "count" and found.tokens == "per_seq", found)
    p.check(m1["progress/rollouts"] != len(effective(batches[0])), "progress/rollouts counts the effective ones")


@proof("prime_rl", trainer="rl", release=RELEASE, config={})
def test_orchestrator_timings_are_the_seconds_between_its_clock_readings(p):
    """The orchestrator's time/step (the seconds between two batches' finalize_train_batch, orchestrator.py:630-632;
    0 at the first) and time/pack (:686-688): one number each, from the clock's readings."""
    run, _ = orchestrated()
    starts = [v for line, v in run.clock.readings if line == 630]
    packs = [(a, b) for (la, a), (lb, b) in zip(run.clock.readings, run.clock.readings[1:]) if la == 686 and lb == 688]
    p.check(len(starts) == 2 and len(packs) == 2, run.clock.readings)
    m1, m2 = run.step_metrics(1), run.step_metrics(2)
    p.check(m1["time/step"] == 0.0, m1["time/step"])
    p.assert_stated("time/step", m2["time/step"], [[[[[[starts[1] - starts[0]]]]]]], levels=())
    p.assert_stated("time/pack", m2["time/pack"], [[[[[[packs[1][1] - packs[1][0]]]]]]], levels=())
    p.check(not close(m2["time/pack"], (packs[1][1] - packs[1][0]) * 1000), "time/pack is not in seconds")


# ------------------------------------------------------------------------------------------------ SFT trainer
#: [rank] the loss-masked token counts of its packed micro-batches (16 tokens each), three a step for three steps
SFT_SAMPLES = [[5, 11, 3, 7, 14, 2, 9, 4, 6], [8, 2, 13, 4, 6, 10, 3, 12, 5], [12, 6, 1, 3, 9, 15, 7, 2, 10]]
SFT_CONFIG = {"optim.max_norm": 0.05}


@functools.lru_cache(maxsize=None)
def sft() -> PR.SftRun:
    return PR.run_sft(SFT_SAMPLES, steps=3, max_norm=0.05)


def sft_tokens(run: PR.SftRun, s: int) -> list:
    """Step ``s``'s batch: [rank][micro-batch] the per-token cross-entropy sft/train.py's compute_loss computed
    (CrossEntropyLoss(reduction="none"), :334) at the micro-batch's loss-masked tokens."""
    ranks = []
    for r in range(run.world):
        micros = [[[v for v, keep in zip(loss.tolist(), mask.tolist()) if keep]]
                  for loss, mask in zip(run.token_losses[s - 1][r], run.masks[s - 1][r])]
        ranks.append(micros)
    return [[ranks]]


@proof("prime_rl", trainer="sft", release=RELEASE, config=SFT_CONFIG)
def test_sft_loss_is_the_global_token_mean(p):
    """loss/mean and the step line's Loss (SFT): each micro-batch's cross-entropy summed over its loss-masked tokens,
    summed over the step's micro-batches and all-reduced over the ranks, over the all-reduced token count
    (sft/train.py:497-545): the step's token mean over every rank, whatever the micro-batches' sizes. Three steps,
    each its own row."""
    run = sft()
    obs = [(run.logged(s)["loss/mean"], sft_tokens(run, s)) for s in (1, 2, 3)]
    p.check(all(len(run.token_losses[s][r]) == 3 for s in range(3) for r in range(3)), "not 3 micro-batches")
    p.assert_stated("loss/mean", obs, levels=("micro_batches", "processes"))
    p.check(all(v > 0 and not close(v, -statistics.fmean(pooled(b))) for v, b in obs), "the loss's sign")
    p.check(len(run.lines) == 3, run.lines)
    printed = [float(re.search(r"\| Loss (-?[0-9.]+)", line).group(1)) for line in run.lines]
    p.assert_stated("Loss", [(v, b) for v, (_, b) in zip(printed, obs)], levels=("micro_batches", "processes"),
                    rel=1e-5)


@proof("prime_rl", trainer="sft", release=RELEASE, config=SFT_CONFIG)
def test_sft_lr_is_read_before_the_scheduler_step_and_grad_norm_before_clipping(p):
    """optim/lr (and LR): optimizer.param_groups[0]['lr'] read BEFORE scheduler.step() (sft/train.py:559-560): the
    rate the step's optimizer step used (a linear warm-up: each step's differs); optim/grad_norm (and Grad. Norm):
    clip_grad_norm_'s total norm of rank 0's gradients, before clipping to optim.max_norm 0.05."""
    run = sft()
    lines = [step_line_of(line) for line in run.lines]
    for s in (1, 2, 3):
        m = run.logged(s)
        used = run.lr_before[s - 1][0]
        p.assert_stated("optim/lr", m["optim/lr"], [[[[[[used]]]]]], levels=())
        if s < 3:
            p.check(not math.isclose(m["optim/lr"], run.lr_before[s][0], rel_tol=1e-3), "optim/lr is the next rate")
        p.assert_stated("LR", lines[s - 1]["LR"], [[[[[[used]]]]]], levels=(), rel=5e-3)
        norm = math.sqrt(sum(float((g.double() ** 2).sum()) for g in run.grads[s - 1]))
        p.check(norm > 0.05, f"step {s}: the gradients are not clipped")
        p.assert_stated("optim/grad_norm", m["optim/grad_norm"], [[[[[[norm]]]]]], levels=())
        p.assert_stated("Grad. Norm", lines[s - 1]["Grad. Norm"], [[[[[[norm]]]]]], levels=(), rel=1e-3)


def step_line_of(line: str) -> dict[str, float]:
    out = {}
    for item in line.split(" | ")[2:]:
        m = re.fullmatch(r"(.+?) (-?[0-9.]+(?:e[-+][0-9]+)?)(?:%|/.*| .*)?", item.strip())
        assert m, item
        out[m.group(1)] = float(m.group(2))
    return out


@proof("prime_rl", trainer="sft", release=RELEASE, config=SFT_CONFIG)
def test_sft_throughput_is_a_rolling_rate_over_whole_steps(p):
    """perf/throughput (and Throughput): PerfCounter's rolling rate (perf.py:42-53): the tokens of the steps after
    the window's first over the wall time since it, each step's tokens dp x seq_len x (batch_size // dp) (padding
    included, sft/train.py:593-595), 0 at the first step; perf/throughput_per_gpu over the world size; perf/mfu
    (and MFU) get_mfu of that rate, in percent. One number each, from rank 0's clock readings (perf.py:45)."""
    run = sft()
    times = [v for line, v in run.perf_clocks[0].readings if line == 45]
    p.check(len(times) == 3, run.perf_clocks[0].readings)
    seq_len, batch = run.config.data.seq_len, run.config.data.batch_size
    tokens = seq_len * batch
    masked = sum(SFT_SAMPLES[r][u] for r in range(3) for u in range(3, 6))
    p.check(run.logged(1)["perf/throughput"] == 0 and run.logged(1)["perf/mfu"] == 0, "step 1 has a rate")
    c = run.counters[0]
    for s in (2, 3):
        m = run.logged(s)
        rate = tokens * (s - 1) / (times[s - 1] - times[0])
        p.assert_stated("perf/throughput", m["perf/throughput"], [[[[[[rate]]]]]], levels=())
        p.check(not close(m["perf/throughput"], masked / (times[s - 1] - times[0])), "throughput counts masked")
        p.assert_stated("perf/throughput_per_gpu", m["perf/throughput_per_gpu"], [[[[[[rate / run.world]]]]]],
                        levels=())
        mfu = 100 * c.num_flop_per_token * rate / c.gpu_peak_flops / run.world
        p.assert_stated("perf/mfu", m["perf/mfu"], [[[[[[mfu]]]]]], levels=())
        p.check(1 < m["perf/mfu"] < 100, f"perf/mfu {m['perf/mfu']} is not a percentage")
        line = step_line_of(run.lines[s - 1])
        p.assert_stated("Throughput", line["Throughput"], [[[[[[rate]]]]]], levels=(), rel=1e-6)
        p.assert_stated("MFU", line["MFU"], [[[[[[mfu]]]]]], levels=(), rel=1e-2)
    last_only = tokens / (times[2] - times[1])
    p.check(not close(run.logged(3)["perf/throughput"], last_only), "the rate is the last step's alone")


@proof("prime_rl", trainer="sft", release=RELEASE, config=SFT_CONFIG)
def test_sft_progress_memory_and_timings(p):
    """progress/num_tokens: the packed tokens of every step so far, this one's added before the log (padding
    included); perf/peak_memory rank 0's counter in GiB (the three ranks read 6.5, 2.0 and 12.5); time/step and
    time/{forward_backward, save_ckpt}: the seconds between the loop's clock readings (sft/train.py:452-606)."""
    run = sft()
    seq_len, batch = run.config.data.seq_len, run.config.data.batch_size
    clock = run.clocks[0]
    gib = [[[[[b / 1024**3]]] for b in run.peak_bytes]]
    for s in (1, 2, 3):
        m = run.logged(s)
        p.assert_stated("progress/num_tokens", m["progress/num_tokens"], [[[[[[float(s * seq_len * batch)]]]]]],
                        levels=())
        p.assert_stated("perf/peak_memory", m["perf/peak_memory"], [gib], levels=())
        for key, (start, end) in {"time/step": (452, 606), "time/forward_backward": (453, 526),
                                  "time/save_ckpt": (569, 571)}.items():
            secs = clock.at(end, s - 1) - clock.at(start, s - 1)
            p.assert_stated(key, m[key], [[[[[[secs]]]]]], levels=())
    masked = sum(sum(r[:3]) for r in SFT_SAMPLES)
    p.check(run.logged(1)["progress/num_tokens"] != masked, "progress/num_tokens counts the loss-masked tokens")


def test_multi_trace_episodes_sum_their_traces_output_tokens():
    """Not a registered proof: train/agg/<subset>/num_output_tokens/* are over EPISODES, each the sum of its traces'
    output tokens (EpisodeMetrics._episode_stat, metrics.py:280-284), while the per-agent
    train/agg/<subset>/<agent>/num_output_tokens/* are over traces; with one trace per episode (the proofs above)
    the two are one population. An episode of two traces shows the difference."""
    eps = []
    for i in range(4):
        traces = [PR.make_trace(10 * i + j, reward=0.5, n_in=4, n_out=OUTPUT[(2 * i + j) % 8], advantage=0.5)
                  for j in range(1 + (i == 1))]
        e = PR.make_episode(i, traces[0], group=f"g{i}")
        e.traces = traces
        eps.append(e)
    ids = {e.id for e in eps}
    run = PR.run_orchestrator([(eps, {t.id for e in eps for t in e.traces}, ids, set())])
    m = run.step_metrics(1)
    per_episode = [sum(t.num_output_tokens for t in e.traces) for e in eps]
    per_trace = [t.num_output_tokens for e in eps for t in e.traces]
    assert close(m["train/agg/all/num_output_tokens/mean"], statistics.fmean(per_episode))
    assert close(m["train/agg/all/policy/num_output_tokens/mean"], statistics.fmean(per_trace))
    assert not close(statistics.fmean(per_episode), statistics.fmean(per_trace))
