"""Fingerprint proofs of prime-rl's printed step lines of v0.2..v0.5.0 (the console entries the real logs hit), run on
the v0.5.0 tag's own code (tests/_support/proofs_prime_rl_old.py says what runs and what stands in).

* the SFT trainer's line (sft/train.py@v0.5.0:424): Time, Loss, Grad. Norm, LR, Throughput, MFU, three steps of its
  loop on three simulated ranks with uneven loss-masked token counts, against the per-token cross-entropy, the
  gradients, the lr and the clock readings the loop used;
* the orchestrator's line (orchestrator.py@v0.5.0:844): Reward and Seq. Length over the step's rollouts in problem
  groups of rollouts_per_example rollouts each (as the scheduler delivers them), and its Time from the clock
  readings; with the step dict's reward/all/mean, seq_len/all/mean and progress counts;
* the RL trainer's line (rl/train.py@v0.5.0:505-510): Time, Entropy, Mismatch KL, Grad. Norm, LR, Throughput, MFU,
  Peak Mem. (and the logged entropy/mean, mismatch_kl/mean, perf/*), three steps of its loop on three simulated
  ranks with ragged samples and uneven micro-batches. Its Loss (and loss/mean) has no candidate reduction yet:
  proofs_prime_rl_old.ENTRY_WHY says why.
"""
from __future__ import annotations

import math
import re

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("pandas")

from _support import proofs_prime_rl_old as OLD  # noqa: E402
from _support.proven import close, proof  # noqa: E402

RELEASE = OLD.RELEASE
#: [rank] the loss-masked token counts of its packed micro-batches (16 tokens each), three a step for three steps
SFT_SAMPLES = [[5, 11, 3, 7, 14, 2, 9, 4, 6], [8, 2, 13, 4, 6, 10, 3, 12, 5], [12, 6, 1, 3, 9, 15, 7, 2, 10]]
SFT_CONFIG = {"optim.max_norm": 0.05}


def step_line(line: str) -> dict[str, float]:
    """The colon form of v0.2..v0.5.0: ``Label: number[unit]`` items between `` | ``."""
    out = {}
    for item in line.split(" | ")[1:]:
        m = re.fullmatch(r"(.+?): (-?[0-9.]+(?:e[-+][0-9]+)?)(?:s|%|/.*| .*)?", item.strip())
        assert m, item
        out[m.group(1)] = float(m.group(2))
    return out


def one(v: float) -> list:
    return [[[[[[v]]]]]]


def sft_tokens(run: OLD.SftRun, s: int) -> list:
    """Step ``s``'s batch: [rank][micro-batch] the per-token cross-entropy at the micro-batch's loss-masked tokens."""
    ranks = []
    for r in range(run.world):
        ranks.append([[[v for v, keep in zip(loss.tolist(), mask.tolist()) if keep]]
                      for loss, mask in zip(run.token_losses[s - 1][r], run.masks[s - 1][r])])
    return [[ranks]]


@proof("prime_rl", trainer="sft", release=RELEASE, config=SFT_CONFIG)
def test_sft_step_line_v050(p):
    """The SFT step line (sft/train.py@v0.5.0:424). Loss: the micro-batches' loss-masked token sums summed and
    all-reduced over the ranks, over the all-reduced token count (:337-386): the step's token mean over every rank.
    Grad. Norm: clip_grad_norm_'s total norm before clipping (:392). LR: param_groups[0]['lr'] read BEFORE
    scheduler.step() (:404-405), the rate the step used. Throughput: PerfCounter's rolling rate (perf.py@v0.5.0:46-49),
    the tokens of the window's steps after its first over the seconds since it, each step batch_size x seq_len
    tokens (padding included, :413), 0 at the first step; MFU its get_mfu (perf.py:51-55) in percent. Time: the
    seconds between the loop's readings at :321 and :423."""
    run = OLD.run_sft(SFT_SAMPLES)
    p.check(len(run.lines) == 3 and all(len(run.token_losses[s][r]) == 3 for s in range(3) for r in range(3)),
            run.lines)
    lines = [step_line(line) for line in run.lines]
    obs = [(lines[s - 1]["Loss"], sft_tokens(run, s)) for s in (1, 2, 3)]
    p.assert_stated("Loss", obs, levels=("micro_batches", "processes"), rel=1e-4)
    logged = [(run.logged(s)["loss/mean"], sft_tokens(run, s)) for s in (1, 2, 3)]
    p.assert_stated("loss/mean", logged, levels=("micro_batches", "processes"))
    seq_len, batch = run.config.data.seq_len, run.config.data.batch_size
    times = [v for line, v in run.perf_clocks[0].readings if line == 41]
    p.check(len(times) == 3, run.perf_clocks[0].readings)
    c = run.counters[0]
    p.check(lines[0]["Throughput"] == 0 and lines[0]["MFU"] == 0, "step 1 has a rate")
    clock = run.clocks[0]
    for s in (1, 2, 3):
        m, line = run.logged(s), lines[s - 1]
        used = run.lr_before[s - 1][0]
        p.assert_stated("LR", line["LR"], one(used), levels=(), rel=5e-3)
        p.assert_stated("optim/lr", m["optim/lr"], one(used), levels=())
        if s < 3:
            p.check(not math.isclose(line["LR"], run.lr_before[s][0], rel_tol=1e-2), "LR is the next step's rate")
        norm = float(torch.sqrt(sum((g.double() ** 2).sum() for g in run.grads[s - 1])))
        p.check(norm > 0.05, f"step {s}: the gradients are not clipped")
        p.assert_stated("Grad. Norm", line["Grad. Norm"], one(norm), levels=(), rel=1e-3)
        p.assert_stated("optim/grad_norm", m["optim/grad_norm"], one(norm), levels=())
        secs = clock.at(423, s - 1) - clock.at(321, s - 1)
        p.check(secs > 1, secs)
        p.assert_stated("Time", line["Time"], one(secs), levels=(), rel=5e-3)
        p.assert_stated("time/step", m["time/step"], one(secs), levels=())
        if s == 1:
            continue
        rate = seq_len * batch * (s - 1) / (times[s - 1] - times[0])
        p.assert_stated("Throughput", line["Throughput"], one(rate), levels=(), rel=1e-6)
        p.assert_stated("perf/throughput", m["perf/throughput"], one(rate), levels=())
        masked = sum(SFT_SAMPLES[r][u] for r in range(3) for u in range(3, 3 * s))
        p.check(not close(m["perf/throughput"], masked / (times[s - 1] - times[0])), "throughput counts masked")
        mfu = 100 * c.num_flop_per_token * rate / c.gpu_peak_flops / run.world
        p.check(1 < mfu < 100, f"MFU {mfu} is not a percentage")
        p.assert_stated("MFU", line["MFU"], one(mfu), levels=(), rel=2e-2)
        p.assert_stated("perf/mfu", m["perf/mfu"], one(mfu), levels=())
    last_only = seq_len * batch / (times[2] - times[1])
    p.check(not close(run.logged(3)["perf/throughput"], last_only), "the rate is the last step's alone")


#: the step's rollouts, by problem, (reward, prompt tokens, completion tokens): every problem with
#: rollouts_per_example (4) rollouts, as v0.5.0's scheduler delivers them (a group enters the batch only complete,
#: scheduler.py@v0.5.0:440-455, and batch_size % rollouts_per_example == 0 is validated,
#: configs/orchestrator.py@v0.5.0:949-950)
GROUPS = {7: [(1.0, 12, 30), (0.0, 12, 95), (1.0, 12, 41), (1.0, 12, 18)],
          3: [(0.0, 40, 120), (0.0, 40, 77), (0.25, 40, 3), (0.0, 40, 51)],
          9: [(1.0, 5, 9), (0.5, 5, 16), (0.0, 5, 64), (0.75, 5, 2)]}


@proof("prime_rl", trainer="rl", release=RELEASE, config={})
def test_orchestrator_step_line_v050(p):
    """The orchestrator's step line (orchestrator.py@v0.5.0:844): Reward by_example.reward.mean().mean() (:839) and
    Seq. Length by_example.seq_len.mean().mean() (get_seq_len: the last trajectory step's prompt + completion
    tokens): each problem's mean over its rollouts, then the mean over the problems, which with every problem's
    rollouts_per_example rollouts is the mean over the step's rollouts (the entries' pooled statement, told
    from the max, min, sum and the other candidates); Time: the seconds from the step's start reading (:453) to :654.
    The logged step dict (:706-775): reward/all/mean and seq_len/all/mean as printed; progress/tokens every rollout's
    prompt + completion tokens (:690); progress/total_tokens and progress/total_samples the totals with the step's
    own added before the log (:691-692: at the first step, the step's own); progress/samples the count of the step's
    rollouts (:552)."""
    rollouts = [OLD.rollout(ex, reward=r, prompt=a, completion=b) for ex, rs in GROUPS.items() for r, a, b in rs]
    run = OLD.run_orchestrator_step(rollouts)
    line = step_line(run.line)
    # the step's rollouts, one population (levels=(): the orchestrator computes once over them, on one process)
    rewards = [[[[[[r] for rs in GROUPS.values() for r, _, _ in rs]]]]]
    lens = [[[[[[a + b] for rs in GROUPS.values() for _, a, b in rs]]]]]
    p.check(len(GROUPS) == 3 and {len(rs) for rs in GROUPS.values()} == {4}, GROUPS)
    p.assert_stated("Reward", line["Reward"], rewards, levels=(),
                    tokens=("per_seq",), rel=1e-4)
    p.assert_stated("Seq. Length", line["Seq. Length"], lens, levels=(),
                    tokens=("per_seq",), rel=1e-3)
    secs = run.clock.at(654) - run.step_start
    p.assert_stated("Time", line["Time"], one(secs), levels=(), rel=5e-3)
    m = run.logged
    p.assert_stated("time/step", m["time/step"], one(secs), levels=())
    p.assert_stated("reward/all/mean", m["reward/all/mean"], rewards, levels=(), tokens=("per_seq",))
    p.assert_stated("seq_len/all/mean", m["seq_len/all/mean"], lens, levels=(), tokens=("per_seq",))
    tokens = float(sum(a + b for rs in GROUPS.values() for _, a, b in rs))
    p.assert_stated("progress/tokens", m["progress/tokens"], one(tokens), levels=())
    p.check(m["progress/tokens"] != sum(b for rs in GROUPS.values() for _, _, b in rs), "completion tokens only")
    p.assert_stated("progress/total_tokens", m["progress/total_tokens"], one(tokens), levels=())
    p.assert_stated("progress/total_samples", m["progress/total_samples"], one(12.0), levels=())
    # every rollout one item, its reward on each of its completion tokens: the count of the rollouts is neither
    # their tokens' count nor their rewards' sum
    items = [[[[[[r] * b for rs in GROUPS.values() for r, _, b in rs]]]]]
    found = p.assert_stated("progress/samples", m["progress/samples"], items, levels=(),
                            tokens=("per_seq", "token_mean"), stats=("mean", "sum", "count"))
    p.check(found.stat == "count" and found.tokens == "per_seq", found)


MB = OLD.PR.MicroBatch
#: [step][rank] the packed micro-batches (22 tokens each: samples' lengths, their prompt tokens; uneven per rank)
RL_LAYOUT = [[[MB([5, 7, 10], [2, 3, 1]), MB([9, 13], [6, 2])], [MB([12, 10], [5, 2]), MB([3, 8, 11], [1, 4, 5])],
              [MB([20, 2], [3, 1]), MB([6, 16], [2, 9])]],
             [[MB([14, 8], [5, 1]), MB([6, 6, 10], [2, 2, 3])], [MB([22], [9]), MB([4, 9, 9], [1, 3, 2])],
              [MB([8, 8, 6], [1, 6, 2]), MB([17, 5], [4, 1])]],
             [[MB([11, 11], [4, 4]), MB([2, 15, 5], [1, 6, 2])], [MB([7, 15], [2, 5]), MB([18, 4], [8, 1])],
              [MB([3, 19], [1, 2]), MB([10, 12], [7, 3])]]]
RL_CONFIG = {"optim.max_norm": 0.05}


def rl_tokens(run: OLD.RlRun, s: int, key: str) -> list:
    """Step ``s``'s batch: [rank][micro-batch][sample] the per-token ``key`` the loop appended to its Tensors
    (``out[key][loss_mask]``, rl/train.py@v0.5.0:439-441), split at the samples' loss-masked token counts."""
    ranks = []
    for r in range(run.world):
        micros = []
        for u, mb in enumerate(RL_LAYOUT[s - 1][r]):
            vals, at, seqs = run.tensors[s - 1][r][key][u].tolist(), 0, []
            for n, prompt in zip(mb.lengths, mb.prompt):
                seqs.append(vals[at:at + n - prompt])
                at += n - prompt
            assert at == len(vals), (at, len(vals))
            micros.append(seqs)
        ranks.append(micros)
    return [[ranks]]


def k3_tokens(run: OLD.RlRun, s: int) -> list:
    """Step ``s``'s batch of per-token mismatch KL: loss.py@v0.5.0's own default_loss_fn (:107-163) run on each
    loss-masked token as a one-token sequence (its ``mismatch_kl`` metric, a mean over that one token, is the
    token's value), from the trainer and inference probabilities the loop appended to its Tensors (:439-440)."""
    loss = OLD.rl_code()
    fn = loss.loss.setup_loss_fn(loss.configs.DefaultLossConfig())
    trainer, inference = rl_tokens(run, s, "trainer_probs"), rl_tokens(run, s, "inference_probs")

    def k3(t: float, i: float) -> float:
        one_token = loss.loss.LossInputs(
            trainer_logprobs=torch.log(torch.tensor([t])), inference_logprobs=torch.log(torch.tensor([i])),
            teacher_logprobs=None, advantages=torch.zeros(1), loss_mask=torch.ones(1, dtype=torch.bool))
        return float(fn(one_token).metrics["mismatch_kl"])
    return [[[[[[k3(t, i) for t, i in zip(ts, is_)] for ts, is_ in zip(tm, im)] for tm, im in zip(tr, ir)]
              for tr, ir in zip(trainer[0][0], inference[0][0])]]]


@proof("prime_rl", trainer="rl", release=RELEASE, config=RL_CONFIG)
def test_rl_trainer_step_line_v050(p):
    """The RL trainer's step line (rl/train.py@v0.5.0:505-510), three steps on three simulated ranks. Throughput:
    PerfCounter's rolling rate (perf.py@v0.5.0:46-49) of the steps' tokens, dp x seq_len x micro-batches (:493-494,
    padding included), after the window's first step over the seconds since it, 0 at the first step; MFU its
    get_mfu in percent; Grad. Norm clip_grad_norm_'s total norm before clipping (:465); LR param_groups[0]['lr'] read
    AFTER scheduler.step() (:477-480); Time the seconds between the loop's readings at :283 and :504; Entropy (and
    entropy/mean) the per-token entropy at every loss-masked token of every micro-batch, all-gathered over the ranks
    and averaged once (Tensors.compute_stats, utils.py@v0.5.0:324-357); Peak Mem. (and perf/peak_memory) rank 0's
    peak in GiB (the ranks read 6.5, 3.0 and 9.5); Mismatch KL (and mismatch_kl/mean) each sample's token mean of
    k3 (loss.py@v0.5.0:152, one value per sample), all-gathered over the ranks and averaged once: the mean of the
    samples' token means over every rank; perf/throughput, perf/throughput_per_gpu and perf/mfu as printed."""
    run = OLD.run_rl(RL_LAYOUT)
    p.check(len(run.lines) == 3 and run.world == 3, run.lines)
    lines = [step_line(line) for line in run.lines]
    times = [v for line, v in run.perf_clocks[0].readings if line == 41]
    p.check(len(times) == 3, run.perf_clocks[0].readings)
    p.check(lines[0]["Throughput"] == 0 and lines[0]["MFU"] == 0, "step 1 has a rate")
    tokens = run.world * run.seq_len * run.micro_batches
    c = run.counters[0]
    for s in (1, 2, 3):
        m, line = run.logged(s), lines[s - 1]
        p.assert_stated("LR", line["LR"], one(run.lr_after[s - 1]), levels=(), rel=5e-3)
        p.check(not math.isclose(line["LR"], run.lr_before[s - 1], rel_tol=1e-2), "LR is the rate the step used")
        norm = float(torch.sqrt(sum((g.double() ** 2).sum() for g in run.grads[s - 1])))
        p.check(norm > 0.05, f"step {s}: the gradients are not clipped")
        p.assert_stated("Grad. Norm", line["Grad. Norm"], one(norm), levels=(), rel=1e-3)
        secs = run.clocks[0].at(504, s - 1) - run.clocks[0].at(283, s - 1)
        p.check(secs > 1, secs)
        p.assert_stated("Time", line["Time"], one(secs), levels=(), rel=5e-3)
        if s == 1:
            continue
        rate = tokens * (s - 1) / (times[s - 1] - times[0])
        p.assert_stated("Throughput", line["Throughput"], one(rate), levels=(), rel=1e-6)
        fb = run.clocks[0].at(483, s - 1) - run.clocks[0].at(304, s - 1)
        p.check(not close(line["Throughput"], tokens / fb), "Throughput is the step's tokens over its seconds")
        mfu = 100 * c.num_flop_per_token * rate / c.gpu_peak_flops / run.world
        p.check(1 < mfu < 100, f"MFU {mfu} is not a percentage")
        p.assert_stated("MFU", line["MFU"], one(mfu), levels=(), rel=2e-2)
        p.assert_stated("perf/throughput", m["perf/throughput"], one(rate), levels=())
        p.assert_stated("perf/throughput_per_gpu", m["perf/throughput_per_gpu"], one(rate / run.world), levels=())
        p.assert_stated("perf/mfu", m["perf/mfu"], one(mfu), levels=())
    ent = [rl_tokens(run, s, "entropy") for s in (1, 2, 3)]
    p.check(len({len(q) for b in ent for u in b[0][0] for mb in u for q in mb}) > 4, "the samples are not ragged")
    p.assert_stated("entropy/mean", [(run.logged(s)["entropy/mean"], ent[s - 1]) for s in (1, 2, 3)],
                    levels=("micro_batches", "processes"))
    p.assert_stated("Entropy", [(lines[s - 1]["Entropy"], ent[s - 1]) for s in (1, 2, 3)],
                    levels=("micro_batches", "processes"), rel=5e-5)
    kl = [k3_tokens(run, s) for s in (1, 2, 3)]
    p.assert_stated("mismatch_kl/mean", [(run.logged(s)["mismatch_kl/mean"], kl[s - 1]) for s in (1, 2, 3)],
                    levels=("micro_batches", "processes"), rel=1e-5)
    p.assert_stated("Mismatch KL", [(lines[s - 1]["Mismatch KL"], kl[s - 1]) for s in (1, 2, 3)],
                    levels=("micro_batches", "processes"), rel=5e-5)
    gib = [[[[[b / 1024**3]]] for b in run.peak_bytes]]
    p.check(len({b for b in run.peak_bytes}) == run.world, run.peak_bytes)
    p.assert_stated("Peak Mem.", lines[0]["Peak Mem."], [gib], levels=())
    p.assert_stated("perf/peak_memory", run.logged(1)["perf/peak_memory"], [gib], levels=())
    last_only = tokens / (times[2] - times[1])
    p.check(not close(run.logged(3)["perf/throughput"], last_only), "the rate is the last step's alone")
