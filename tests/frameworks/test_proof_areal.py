"""Fingerprint proofs of AReaL's reductions (issue 21): AReaL 1.0.4's own stats_tracker (areal/utils/stats_tracker.py,
loaded from the installed wheel: tests/_support/proofs_areal.py) on batches where every candidate reduction gives a
different number, on two simulated data-parallel ranks whose all-reduces meet in the tracker's own export.

The tracker is called the way areal/trainer/ppo/actor.py@v1.0.4 calls it: in ppo_update (scope ppo_actor) the batch
statistics once per rank before the mini-batches (actor.py lines 278-306), then per mini-batch and per micro-batch
grpo_loss_fn's denominators and token statistics (scope update, lines 515-530) and after each mini-batch's optimizer
step the engine's scalars (line 365); the rollout workers' reward scalar (areal/workflow/rlvr.py line 135) merged by
RolloutController.export_stats. Each key's logged value is fingerprinted against the entry mappings/areal.yaml
states for it (resolved through trackbridge's loader), so a wrong statement fails here.
"""
from __future__ import annotations

import importlib.metadata
import random

import pytest

try:            # the installed wheel (not find_spec: once loaded, `areal` is a skeleton package without a __spec__)
    importlib.metadata.distribution("areal")
except importlib.metadata.PackageNotFoundError:        # its package __init__ needs the GPU stack: not imported
    pytest.skip("make test installs areal==1.0.4 --no-deps", allow_module_level=True)
pytest.importorskip("colorlog", reason="make test installs colorlog (areal/utils/logging.py imports it)")

import torch  # noqa: E402

from _support.framework_code import run_ranks  # noqa: E402
from _support.proofs_areal import areal  # noqa: E402
from _support.proven import proof  # noqa: E402

CONFIG = {"actor.ppo_n_minibatches": 2}

# token values of the update statistics: [mini-batch][rank][micro-batch] -> sequences (valid tokens only); uneven
# sequence counts and lengths at every level, so pooled, per-micro-batch, per-mini-batch and per-rank means differ
def _uneven_values(shape: list) -> list:
    """[mini-batch][rank][micro-batch] -> sequences of token values, from the token counts in ``shape`` (irregular
    values, so that no two candidate reductions meet by accident)."""
    rng = random.Random(20260521)
    return [[[[[round(rng.uniform(0.05, 3.0), 6) for _ in range(n)] for n in micro] for micro in rank]
             for rank in mini] for mini in shape]


UPDATE = _uneven_values([[[[3, 1], [5]], [[1], [2, 3, 2]]],          # tokens per sequence: uneven at every level
                         [[[2, 4], [2, 1]], [[4], [1, 4]]]])
GRAD_NORMS = [3.5, 1.25]                      # one per mini-batch (the optimizer step's norm, the same on every rank)
LR = 2.0e-6
# batch statistics in ppo_update, once per rank: advantages per valid token, task reward per sequence
ADVANTAGES = [[[0.5, -1.0, 0.25], [2.0]], [[-0.5, 1.5], [0.75, -2.0, 3.0, 0.0], [1.25]]]
REWARDS = [[1.0, 0.25], [0.0, 1.0, 1.0, 0.5, 0.0]]


def padded(seqs: list[list[float]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded [n_seq, max_len] values and the boolean mask of the valid tokens (padding holds junk: 99)."""
    width = max(len(s) for s in seqs) + 1
    vals = torch.full((len(seqs), width), 99.0)
    mask = torch.zeros((len(seqs), width), dtype=torch.bool)
    for i, s in enumerate(seqs):
        vals[i, :len(s)] = torch.tensor(s)
        mask[i, :len(s)] = True
    return vals, mask


def run_actor_stats() -> list[dict[str, float]]:
    """Every rank's export (what StatsLogger.commit receives from rank 0; after the all-reduce all ranks agree)."""
    A = areal()

    def rank(r: int) -> dict[str, float]:
        tracker = A.Tracker()
        with tracker.scope("ppo_actor"):
            adv, adv_mask = padded(ADVANTAGES[r])
            reward = torch.tensor(REWARDS[r])
            # actor.py 278-306: the global denominators, token stats over n_valid_tokens, sequence stats over n_seqs
            tracker.denominator(n_seqs=torch.ones_like(reward, dtype=torch.bool),
                                n_valid_tokens=adv_mask)
            tracker.stat(advantages=adv, denominator="n_valid_tokens")
            tracker.stat(task_reward=reward.float(), denominator="n_seqs")
            with tracker.scope("update"):
                for m, mini in enumerate(UPDATE):
                    for micro in mini[r]:
                        vals, mask = padded(micro)
                        # grpo_loss_fn (actor.py 515-530): denominators, then the token statistics
                        tracker.denominator(n_valid_tokens=mask)
                        tracker.stat(entropy=vals, actor_loss=vals * -0.5, approx_kl=vals - 1.0,
                                     denominator="n_valid_tokens")
                    # actor.py 365: the engine's optimizer-step scalars of this mini-batch
                    tracker.scalar(grad_norm=GRAD_NORMS[m], lr=LR, update_successful=1.0)
        return tracker.export(reduce_group="dp")

    return run_ranks(rank)


def run_rollout_reward(per_worker: list[list[float]]) -> dict[str, float]:
    """Each rollout worker's tracker 'rollout' records scalar(reward=...) per sample (rlvr.py 135) and exports with
    reduce_group=None (sglang_remote.py export_stats); the controller merges them (RolloutController.export_stats)."""
    A = areal()
    exports = []
    for rewards in per_worker:
        tracker = A.Tracker("rollout")
        for x in rewards:
            tracker.scalar(reward=x)
        exports.append(tracker.export(reduce_group=None))

    class Controller:
        def _collective_rpc(self, method: str, http_timeout: float) -> list[dict[str, float]]:
            assert method == "export_stats"
            return exports

    return A.rollout_export_stats(Controller())


def _steps_update() -> list:
    return [[[list(m) for m in mini[r]] for r in range(2)] for mini in UPDATE]


@proof("areal", trainer="ppo", release="1.0.4", config=CONFIG)
def test_areal_update_token_statistics_pool_every_level(p):
    out = run_actor_stats()
    p.check(out[0] == out[1], "after the all-reduce every rank exports the same values")
    logged = out[0]
    steps = [_steps_update()]
    for key, scale, shift in (("ppo_actor/update/entropy/avg", 1.0, 0.0),
                              ("ppo_actor/update/actor_loss/avg", -0.5, 0.0),
                              ("ppo_actor/update/approx_kl/avg", 1.0, -1.0)):
        seen = [[[[[v * scale + shift for v in s] for s in micro] for micro in rank] for rank in mini]
                for mini in steps[0]]
        p.assert_stated(key, logged[key], [seen], levels=("micro_batches", "mini_batches", "processes"))
    n_valid = sum(len(s) for mini in UPDATE for rank in mini for micro in rank for s in micro)
    p.check(logged["ppo_actor/update/n_valid_tokens"] == n_valid, "the denominator is exported as its SUM")
    p.check("ppo_actor/update/grad_norm__count" in logged, "scalars carry __count (StatsLogger drops it)")


def test_areal_optimizer_scalars_average_the_mini_batches():
    """Not a fingerprint proof (a stat: value scalar has no candidate reductions over tokens): AReaL's scalar() of
    the optimizer step's grad_norm is averaged over the mini-batches (sum and count all-reduced), as the entry
    states (mini_batches: mean), not the last mini-batch's."""
    from _support.proven import Proof, Proving
    logged = run_actor_stats()[0]
    assert logged["ppo_actor/update/grad_norm"] == pytest.approx(sum(GRAD_NORMS) / 2)
    assert logged["ppo_actor/update/grad_norm"] not in GRAD_NORMS
    assert logged["ppo_actor/update/grad_norm__count"] == 4, "one value per mini-batch and rank"
    p = Proving(Proof(lambda _: None, "areal", "ppo", "1.0.4", tuple(sorted(CONFIG.items())), "scalars"))
    _entry, res = p.entry("ppo_actor/update/grad_norm")
    assert res.fields["mini_batches"] == "mean", res.fields
    assert logged["ppo_actor/update/lr"] == pytest.approx(LR), "the same lr at every mini-batch"


@proof("areal", trainer="ppo", release="1.0.4", config=CONFIG)
def test_areal_batch_statistics_pool_the_ranks(p):
    logged = run_actor_stats()[0]
    adv_steps = [[[[list(map(list, ADVANTAGES[r]))] for r in range(2)]]]
    p.assert_stated("ppo_actor/advantages/avg", logged["ppo_actor/advantages/avg"], adv_steps, levels=("processes",))
    p.assert_stated("ppo_actor/advantages/max", logged["ppo_actor/advantages/max"], adv_steps, levels=("processes",),
                    stats=("max",))
    rew_steps = [[[[[[x] for x in REWARDS[r]]] for r in range(2)]]]
    p.assert_stated("ppo_actor/task_reward/avg", logged["ppo_actor/task_reward/avg"], rew_steps, levels=("processes",))
    p.assert_stated("ppo_actor/task_reward/min", logged["ppo_actor/task_reward/min"], rew_steps, levels=("processes",),
                    stats=("min",))


@proof("areal", trainer="ppo", release="1.0.4", config=CONFIG)
def test_areal_rollout_reward_is_the_mean_over_every_sample(p):
    workers = [[1.0, 0.0, 0.25], [0.0, 1.0, 1.0, 0.75, 0.5]]
    out = run_rollout_reward(workers)
    steps = [[[[[[x] for x in w]] for w in workers]]]
    p.assert_stated("rollout/reward", out["rollout/reward"], steps, levels=("processes",))
    p.check("rollout/reward__count" not in out, "the controller drops the counts")


# ------------------------------------------------------------------ ppo_update's sequence statistics (issue 33)
# per rank: (prompt tokens, response tokens) of each sequence of the rank's padded batch (actor.py@v1.0.4:257-306);
# each rank's batch is as wide as its longest sequence, so that one counts as "no EOS" (seqlens == width)
SEQS = [[(3, 4), (2, 6), (4, 1)], [(6, 2), (1, 3), (2, 2), (3, 5), (4, 4)]]
SEQ_REWARDS = [[0.25, 0.75, 0.0], [1.0, 0.5, 0.0, 0.75, 1.0]]


def _rank_batch(r: int) -> dict[str, torch.Tensor]:
    """The rank's padded batch: attention_mask over prompt + response, loss_mask over the response."""
    width = max(a + b for a, b in SEQS[r])
    attn = torch.zeros(len(SEQS[r]), width, dtype=torch.long)
    loss = torch.zeros(len(SEQS[r]), width, dtype=torch.long)
    for i, (prompt, resp) in enumerate(SEQS[r]):
        attn[i, :prompt + resp] = 1
        loss[i, prompt:prompt + resp] = 1
    return {"attention_mask": attn, "loss_mask": loss, "rewards": torch.tensor(SEQ_REWARDS[r])}


def run_sequence_stats() -> list[dict[str, float]]:
    """Every rank's export of ppo_update's batch statistics, called as actor.py@v1.0.4:257-306 calls the tracker:
    the global denominators (n_tokens from the wheel's own infer_token_denominator), then the sequence statistics
    over n_seqs."""
    from _support.proofs_areal import _actor_support
    A = areal()
    infer_token_denominator = _actor_support().stats.infer_token_denominator

    def rank(r: int) -> dict[str, float]:
        tracker = A.Tracker()
        data = _rank_batch(r)
        with tracker.scope("ppo_actor"):
            attn_mask, loss_mask, reward_score = data["attention_mask"], data["loss_mask"], data["rewards"]
            seqlens = attn_mask.sum(-1)
            tracker.denominator(n_seqs=torch.ones_like(reward_score, dtype=torch.bool),
                                n_tokens=infer_token_denominator(data, loss_mask), n_valid_tokens=loss_mask.bool())
            prompt_lens = data["attention_mask"].sum(-1) - data["loss_mask"].sum(-1)
            tracker.stat(no_eos_ratios=(seqlens == attn_mask.shape[-1]).float(), task_reward=reward_score.float(),
                         prompt_len=prompt_lens.float(), seq_len=seqlens.float(), denominator="n_seqs")
        return tracker.export(reduce_group="dp")

    _actor_support()                       # load the wheel's files once, before the rank threads
    return run_ranks(rank)


def _per_seq_steps(values: list[list[float]]) -> list:
    return [[[[[[x] for x in values[r]]] for r in range(2)]]]


@proof("areal", trainer="ppo", release="1.0.4", config=CONFIG)
def test_areal_sequence_statistics_pool_the_ranks_sequences(p):
    """seq_len, prompt_len, no_eos_ratios and task_reward/max: one value per sequence, pooled over every rank's
    sequences (the all-reduce of sums and counts; max by an all-reduce MAX); n_valid_tokens and n_tokens: the
    denominators' SUM over every rank (n_tokens counts the padding of each rank's batch: infer_token_denominator is
    ones_like(attention_mask))."""
    out = run_sequence_stats()
    p.check(out[0] == out[1], "after the all-reduce every rank exports the same values")
    logged = out[0]
    seq_len = [[float(a + b) for a, b in SEQS[r]] for r in range(2)]
    prompt = [[float(a) for a, _b in SEQS[r]] for r in range(2)]
    no_eos = [[float(a + b == max(x + y for x, y in SEQS[r])) for a, b in SEQS[r]] for r in range(2)]
    p.assert_stated("ppo_actor/seq_len/avg", logged["ppo_actor/seq_len/avg"], _per_seq_steps(seq_len),
                    levels=("processes",))
    p.assert_stated("ppo_actor/prompt_len/avg", logged["ppo_actor/prompt_len/avg"], _per_seq_steps(prompt),
                    levels=("processes",))
    # a fraction of 0/1 values: the pooled mean (4/8) is neither the mean of the ranks' fractions nor rank 0's
    p.assert_stated("ppo_actor/no_eos_ratios/avg", logged["ppo_actor/no_eos_ratios/avg"], _per_seq_steps(no_eos),
                    levels=("processes",))
    p.assert_stated("ppo_actor/task_reward/max", logged["ppo_actor/task_reward/max"], _per_seq_steps(SEQ_REWARDS),
                    levels=("processes",), stats=("max",))
    valid = float(sum(b for rank in SEQS for _a, b in rank))
    padded_tokens = float(sum(len(rank) * max(a + b for a, b in rank) for rank in SEQS))
    p.check(padded_tokens > sum(seq_len[0]) + sum(seq_len[1]), "the padding tells n_tokens from the attended tokens")
    p.assert_stated("ppo_actor/n_valid_tokens", logged["ppo_actor/n_valid_tokens"], [[[[[[valid]]]]]], levels=())
    p.assert_stated("ppo_actor/n_tokens", logged["ppo_actor/n_tokens"], [[[[[[padded_tokens]]]]]], levels=())


@proof("areal", trainer="ppo", release="1.0.4", config=CONFIG)
def test_areal_advantage_minimum_and_grad_norm_over_the_mini_batches(p):
    """advantages/min: the minimum over every rank's valid tokens (all-reduce MIN); update/grad_norm: the engine's
    norm of each mini-batch's optimizer step, scalar() averaged over the mini-batches (sum and count all-reduced),
    not the last mini-batch's."""
    logged = run_actor_stats()[0]
    adv_steps = [[[[list(map(list, ADVANTAGES[r]))] for r in range(2)]]]
    p.assert_stated("ppo_actor/advantages/min", logged["ppo_actor/advantages/min"], adv_steps, levels=("processes",),
                    stats=("min",))
    # the norm of the all-reduced gradient is the same on every rank, so no batch tells the process reductions
    # apart: the batch is one rank's mini-batches ([step][mini-batch][rank][micro-batch][sequence])
    norms = [[[[[[g]]]] for g in GRAD_NORMS]]
    p.check(logged["ppo_actor/update/grad_norm__count"] == 2 * len(GRAD_NORMS), "one value per mini-batch and rank")
    p.assert_stated("ppo_actor/update/grad_norm", logged["ppo_actor/update/grad_norm"], norms, levels=())
