"""Fingerprint proofs of prime-rl's orchestrator and SFT entries of v0.2..v0.4.0, run on the v0.4.0 tag's own code
(tests/_support/proofs_prime_rl_old2.py says what runs and what stands in).

* the orchestrator's logged step dict (orchestrator.py@v0.4.0:555-630): completion_len/mean, seq_len/mean,
  prompt_len/mean (each problem's mean over its rollouts, then the mean over the problems) and reward/mean
  (results_df.reward.mean(), every rollout), over the step's rollouts in problem groups of rollouts_per_example
  rollouts each; its completion_len/max and /min (the max / min of the per-problem means) and the entry
  perf/throughput (the trainer's) are not proven: proofs_prime_rl_old2.ENTRY_WHY says why;
* the SFT trainer's loss/mean and its step line's Loss (sft/train.py@v0.4.0): the unweighted mean of the
  micro-batches' token means, all_reduce AVG over the ranks (v0.5.0 made it token-weighted:
  test_proof_prime_rl_old.py);
* on the v0.6.0 tag's code: progress/total_samples (logged before the step's rollouts are added) and the step
  line's Reward (the pooled mean over the surviving rollouts).
"""
from __future__ import annotations

import re

import pytest

pytest.importorskip("torch")
pytest.importorskip("pandas")

from _support import proofs_prime_rl_old2 as OLD2  # noqa: E402
from _support.proven import proof  # noqa: E402

RELEASE = OLD2.RELEASE

#: the step's rollouts, by problem, (reward, prompt tokens, completion tokens): every problem with
#: rollouts_per_example (4) rollouts, as v0.4.0's scheduler delivers them (a group enters the batch only complete)
GROUPS = {7: [(1.0, 12, 30), (0.0, 12, 95), (1.0, 12, 41), (1.0, 12, 18)],
          3: [(0.0, 40, 120), (0.0, 40, 77), (0.25, 40, 3), (0.0, 40, 51)],
          9: [(1.0, 5, 9), (0.5, 5, 16), (0.0, 5, 64), (0.75, 5, 2)]}


def per_rollout(values: list[float]) -> list:
    """The step's rollouts, one population (levels=(): the orchestrator computes once over them, on one process)."""
    return [[[[[[v] for v in values]]]]]


@proof("prime_rl", trainer="rl", release=RELEASE, config={})
def test_orchestrator_lengths_and_reward_v040(p):
    """orchestrator.py@v0.4.0:492-668. completion_len/mean (:571), seq_len/mean (:565), prompt_len/mean (:568):
    results_df.groupby('example_id').<len>.mean().mean(), each problem's mean over its rollouts then the mean over
    the problems, which with every problem's rollouts_per_example rollouts is the mean over the step's rollouts (the
    entries' pooled statement, told from the max, min, sum and the other candidates); the lengths are vf.py@v0.4.0's
    get_completion_len (:102, the last step's tokens minus the first prompt's), get_seq_len (:91) and get_prompt_len
    (:80). reward/mean (:591): results_df.reward.mean(), over every rollout. The orchestrator's own perf/throughput
    (:543) is the rollouts' tokens over the generation seconds (not the trainer's entry)."""
    rollouts = [OLD2.rollout(ex, reward=r, prompt=a, completion=b) for ex, rs in GROUPS.items() for r, a, b in rs]
    run = OLD2.run_orchestrator_step(rollouts)
    m = run.logged
    p.check(len(GROUPS) == 3 and {len(rs) for rs in GROUPS.values()} == {4}, GROUPS)
    flat = [(r, a, b) for rs in GROUPS.values() for r, a, b in rs]
    p.assert_stated("completion_len/mean", m["completion_len/mean"], per_rollout([b for _, _, b in flat]),
                    levels=(), tokens=("per_seq",))
    p.assert_stated("seq_len/mean", m["seq_len/mean"], per_rollout([a + b for _, a, b in flat]),
                    levels=(), tokens=("per_seq",))
    p.assert_stated("prompt_len/mean", m["prompt_len/mean"], per_rollout([a for _, a, _ in flat]),
                    levels=(), tokens=("per_seq",))
    p.assert_stated("reward/mean", m["reward/mean"], per_rollout([r for r, _, _ in flat]),
                    levels=(), tokens=("per_seq",))
    # the max / min are of the per-problem means (the entries' deviation), not of the rollouts' lengths
    means = [sum(b for _, _, b in rs) / len(rs) for rs in GROUPS.values()]
    p.check(m["completion_len/max"] == pytest.approx(max(means), rel=1e-9)
            and m["completion_len/max"] != max(b for _, _, b in flat), m["completion_len/max"])
    p.check(m["completion_len/min"] == pytest.approx(min(means), rel=1e-9)
            and m["completion_len/min"] != min(b for _, _, b in flat), m["completion_len/min"])
    tokens = sum(a + b for _, a, b in flat)
    p.check(m["perf/throughput"] == pytest.approx(tokens / run.generate_seconds, rel=1e-9), m["perf/throughput"])


#: [rank] the loss-masked token counts of its packed micro-batches (16 tokens each), three a step for three steps
SFT_SAMPLES = [[5, 11, 3, 7, 14, 2, 9, 4, 6], [8, 2, 13, 4, 6, 10, 3, 12, 5], [12, 6, 1, 3, 9, 15, 7, 2, 10]]


def sft_tokens(run: OLD2.SftRun, s: int) -> list:
    """Step ``s``'s batch: [rank][micro-batch] the per-token cross-entropy at the micro-batch's loss-masked tokens."""
    ranks = []
    for r in range(run.world):
        ranks.append([[[v for v, keep in zip(loss.tolist(), mask.tolist()) if keep]]
                      for loss, mask in zip(run.token_losses[s - 1][r], run.masks[s - 1][r])])
    return [[ranks]]


@proof("prime_rl", trainer="sft", release=RELEASE, config={})
def test_sft_loss_v040(p):
    """The SFT loss of v0.2..v0.4.0 (sft/train.py@v0.4.0:262-270, 319, 335, 382): each micro-batch's
    cross-entropy token mean over its loss-masked tokens (loss[loss_mask].mean()), divided by grad_accum_steps and
    summed over the rank's micro-batches (the unweighted mean of its micro-batch means), then all_reduce AVG over
    the ranks: loss/mean, and the step line's Loss (:.4f). Three steps on three simulated ranks with uneven
    loss-masked token counts, so the token-weighted (v0.5.0's) and the unweighted means differ."""
    run = OLD2.run_sft(SFT_SAMPLES)
    p.check(len(run.lines) == 3 and all(len(run.token_losses[s][r]) == 3 for s in range(3) for r in range(3)),
            run.lines)
    logged = [(run.logged(s)["loss/mean"], sft_tokens(run, s)) for s in (1, 2, 3)]
    p.assert_stated("loss/mean", logged, levels=("micro_batches", "processes"))
    printed = []
    for s in (1, 2, 3):
        m = re.search(r"\| Loss: (-?[0-9.]+) \|", run.lines[s - 1])
        p.check(m is not None, run.lines[s - 1])
        printed.append((float(m.group(1)), sft_tokens(run, s)))
    p.assert_stated("Loss", printed, levels=("micro_batches", "processes"), rel=1e-4)


# ------------------------------------------------------------------------------------------------ v0.6.0
RELEASE_060 = OLD2.RELEASE_060
#: two steps of rollouts, (group, reward): uneven groups (the post-batch filters leave any number of a problem's
#: rollouts), so the mean over the rollouts is not the mean of the groups' means
STEPS_060 = [[(1, 1.0), (1, 0.0), (1, 1.0), (1, 1.0), (2, 0.0), (2, 0.25), (3, 1.0), (3, 0.5), (3, 0.0),
              (4, 0.75)],
             [(5, 0.0), (5, 1.0), (6, 1.0), (6, 1.0), (6, 0.5), (7, 0.25)]]


@proof("prime_rl", trainer="rl", release=RELEASE_060, config={})
def test_orchestrator_total_samples_and_reward_v060(p):
    """progress/total_samples (metrics.py@v0.6.0:93): finalize_train_batch builds and logs the step dict
    (orchestrator.py@v0.6.0:616-628) BEFORE it adds the step's rollouts to progress.total_samples (:656): step N
    logs the total through step N-1 (0 at the first step), the entry's deviation. Reward (log_train_batch, :759,
    :765): sum(r.reward for r in batch.rollouts) / n_survivors, the mean over the step's surviving rollouts, pooled
    (not by problem), printed :.4f."""
    steps = [[OLD2.rollout_060(g, reward=r, prompt=5 + g, completion=10 + 3 * g) for g, r in st] for st in STEPS_060]
    run = OLD2.run_orchestrator_060(steps)
    n1, n2 = len(STEPS_060[0]), len(STEPS_060[1])
    p.check(run.totals_after == [n1, n1 + n2], run.totals_after)
    p.check(run.logged[0]["progress/total_samples"] == 0, run.logged[0]["progress/total_samples"])
    p.assert_stated("progress/total_samples", run.logged[1]["progress/total_samples"], per_rollout([float(n1)]),
                    levels=())
    p.check(run.logged[1]["progress/total_samples"] != n1 + n2, "the step's own rollouts are counted")
    for s, st in enumerate(STEPS_060):
        shown = re.search(r"\| Reward (-?[0-9.]+) \|", run.lines[s])
        p.check(shown is not None, run.lines[s])
        p.assert_stated("Reward", float(shown.group(1)), per_rollout([r for _, r in st]), levels=(),
                        tokens=("per_seq",), rel=1e-4)
