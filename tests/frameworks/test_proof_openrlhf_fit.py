"""Fingerprint proofs of OpenRLHF 0.11.2's DPO / RM / SFT metrics against mappings/openrlhf.yaml (issue 20).

The wheel's DPOTrainer / RewardModelTrainer / SFTTrainer ``fit`` loops (with their own save_logs_and_checkpoints,
concatenated_forward, _get_batch_logps and losses; tests/_support/proofs_openrlhf.py) run on 2 simulated ranks x 3
micro-batches of 2 items per optimizer step, 10 optimizer steps, ``logging_steps`` 2, with a model whose outputs move
at every optimizer step. Each logged row is fingerprinted against the reduction the shipped mapping entry states for
the proof's config (resolved by trackbridge's loader): several rows (windows) per key, so that a selection (the last
micro-batch, rank 0's) cannot coincide with another.

SFT's gpt_loss / loss_mean (>= 0.10.4) are step-normalised token sums (``tokens: token_sum_step_norm``, as their
entries state).
"""
from __future__ import annotations

import functools
import math

import pytest

from _support.proven import proof

torch = pytest.importorskip("torch")
P = pytest.importorskip("_support.proofs_openrlhf")

DATA = P.PrefData(world=2, steps=10, gas=3, micro=2)
WINDOW = 2                                   # logging_steps
REL = 2e-5
LEVELS = ("micro_batches", "processes", "window")
RUN = {"train.batch_size": DATA.micro * DATA.world * DATA.gas, "train.micro_batch_size": DATA.micro,
       "logger.logging_steps": WINDOW}


@functools.lru_cache(maxsize=None)
def fit_rows(kind: str) -> tuple:
    return tuple(P.run_fit(kind, DATA, logging_steps=WINDOW, nll=kind == "dpo"))


def fit_obs(kind: str, key: str, value) -> list:
    rows = fit_rows(kind)
    wins = P.pref_windows(DATA, value, WINDOW)
    assert len(rows) == len(wins) == DATA.steps // WINDOW
    return [(row["train/" + key], win) for row, win in zip(rows, wins)]


def pair_tokens(k: int) -> int:
    return DATA.length(k, 0) + DATA.length(k, 1)


def dpo_pair(k: int, v: int) -> tuple[float, float, float]:
    """The wheel's DPOLoss on pair k alone, under the policy after v optimizer steps: (loss, chosen, rejected)."""
    o = P.F.openrlhf()
    t = [torch.tensor([sum(DATA.logp(k, side, v, model))]) for model in ("policy", "ref") for side in (0, 1)]
    loss, c, r = o.DPOLoss(0.1)(t[0], t[1], t[2], t[3])
    return float(loss), float(c), float(r)


def rm_pair(k: int, v: int) -> tuple[float, float, float]:
    o = P.F.openrlhf()
    c, r = DATA.score(k, 0, v), DATA.score(k, 1, v)
    return float(o.loss.PairWiseLoss()(torch.tensor([c]), torch.tensor([r]))), c, r


def pair_value(kind: str, key: str):
    pair = dpo_pair if kind == "dpo" else rm_pair

    def value(k: int, v: int) -> list[float]:
        loss, c, r = pair(k, v)
        x = {"loss": loss, "loss_mean": loss, "chosen_reward": c, "reject_reward": r, "acc": float(c > r),
             "acc_mean": float(c > r)}[key]
        return [x] * pair_tokens(k)
    return value


def nll(k: int, v: int) -> list[float]:
    return [-x for x in DATA.logp(k, 0, v)]


def pair_proof(p, kind: str) -> None:
    """loss / chosen_reward / reject_reward: the last micro-batch of the optimizer step, averaged over ranks
    (strategy.all_reduce), the last step of the logging window. loss_mean: rank 0's own micro-batches averaged
    (added after all_reduce)."""
    for key in ("loss", "chosen_reward", "reject_reward", "loss_mean"):
        p.assert_stated(key, fit_obs(kind, key, pair_value(kind, key)), rel=REL, levels=LEVELS, mini=("none",),
                        tokens=("per_seq",))
    # acc / acc_mean take values in steps of 1/2: the windows are fingerprinted with the levels the coarse values
    # cannot tell apart otherwise fixed (tokens per pair, one optimizer step per row, no extremes over the ranks:
    # the largest of 0/1 means coincides with a mean too often)
    for key in ("acc", "acc_mean"):
        p.assert_stated(key, fit_obs(kind, key, pair_value(kind, key)), rel=REL, levels=LEVELS, tokens=("per_seq",),
                        mini=("none",), window=("last", "mean"),
                        processes=("all_reduce_weighted", "all_reduce_mean", "token_weighted", "seq_weighted", "rank0"))
    for key in ("lr", "grad_norm"):
        _, res = p.entry(key)
        p.check((res.stated["stat"], res.stated["micro_batches"], res.stated["processes"], res.stated["window"]) ==
                ("value", "none", "none", "last"), res.stated)
    scalar_rows(p, kind)


def scalar_rows(p, kind: str) -> None:
    """lr / grad_norm: read at the accumulation boundary, after the scheduler stepped: that optimizer step's norm
    and the LR the next step will use; rows every logging_steps carry the last step's."""
    check = p.check if p is not None else _assert
    for n, row in enumerate(fit_rows(kind), start=1):
        step = n * WINDOW
        check(math.isclose(row["train/grad_norm"], P.grad_norm_of_step(step - 1)), (kind, n))
        check(math.isclose(row["train/lr"], P.BASE_LR * P.lr_factor(step)), (kind, n))
        check(not math.isclose(row["train/lr"], P.BASE_LR * P.lr_factor(step - 1)), (kind, n))
        window_norms = [P.grad_norm_of_step(k) for k in range(step - WINDOW, step)]
        check(not math.isclose(row["train/grad_norm"], sum(window_norms) / WINDOW), (kind, n))


def _assert(condition, message) -> None:
    assert condition, message


@proof("openrlhf", trainer="dpo", release="0.11.2", config={**RUN, "model.nll_loss_coef": 0.5})
def test_dpo_logs_the_last_micro_batch_and_rank_0s_window(p):
    pair_proof(p, "dpo")
    # nll_loss: the mean over the chosen responses of their per-token NLL, of the last micro-batch
    p.assert_stated("nll_loss", fit_obs("dpo", "nll_loss", nll), rel=REL, levels=LEVELS, mini=("none",))


@proof("openrlhf", trainer="rm", release="0.11.2", config=RUN)
def test_rm_logs_the_last_micro_batch_and_rank_0s_window(p):
    pair_proof(p, "rm")


@proof("openrlhf", trainer="sft", release="0.11.2", config=RUN)
def test_sft_losses_are_step_normalised(p):
    """SFTTrainer (v0.10.4+): SFTLoss with the window normaliser, so gpt_loss is the last micro-batch's token sum
    over all ranks / (the window's tokens / accumulation), and loss_mean rank 0's window of those."""
    for key, shape in (("gpt_loss", {"micro_batches": "last", "processes": "all_reduce_mean"}),
                       ("loss_mean", {"micro_batches": "mean", "processes": "rank0"})):
        _, res = p.entry(key)
        p.check({k: res.stated[k] for k in shape} == shape and res.stated["tokens"] == "token_sum_step_norm"
                and res.stated["deviation"] == "none", res.stated)
        p.assert_stated(key, fit_obs("sft", key, nll), rel=REL, levels=LEVELS, mini=("none",))
    scalar_rows(p, "sft")
