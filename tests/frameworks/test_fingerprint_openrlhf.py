"""Fingerprint proofs for OpenRLHF 0.11.2 (issue 20): run OpenRLHF's own code from the installed wheel
(tests/_support/proofs_openrlhf.py) on batches where every candidate reduction gives a different number, and assert
that the logged value is the one reduction stated for its key (tests/_support/fingerprint.py: ``assert_stated``).

PPO runs from raw vLLM-shaped responses through the samples generator, the experience maker (old-policy and
reference log-probs, the reward-side KL, group baselines, returns), the launcher's dispatch to 2 simulated ranks,
their replay buffers (shuffled micro-batches) and ``ppo_train`` over 2 epochs x 2 optimizer steps x 2 micro-batches
of 2 sequences, with a policy that moves at every optimizer step (so rollout-time and update-time values differ).
DPO / RM / SFT run their ``fit`` loops: 2 ranks x 3 micro-batches per optimizer step, 6 steps, ``logging_steps`` 2.

``STATED`` is what mappings/openrlhf.yaml states for each key at v0.11.2 (docs/reductions.md fields); the last test
checks the shipped file says the same through trackbridge's loader.
"""
from __future__ import annotations

import math

import pytest

from _support import fingerprint as FP

torch = pytest.importorskip("torch")
P = pytest.importorskip("_support.proofs_openrlhf")

# the reductions at v0.11.2 (default config unless the key says otherwise); sources in mappings/openrlhf.yaml
STEP_NORM = {"tokens": "token_sum_step_norm", "micro_batches": "token_weighted", "processes": "all_reduce_weighted",
             "mini_batches": "token_weighted"}                 # aggregate_loss(window normaliser) + ppo_train merge
TOKEN_MEAN = {"tokens": "token_mean", "micro_batches": "token_weighted", "processes": "all_reduce_weighted",
              "mini_batches": "token_weighted"}                # masked_mean per micro-batch, merged by tokens
SEQ_TOKEN_MEAN = {"tokens": "seq_mean_token_mean", "micro_batches": "seq_weighted",
                  "processes": "all_reduce_weighted", "mini_batches": "seq_weighted"}   # per-sample info, by samples
PER_SEQ = {"tokens": "per_seq", "micro_batches": "seq_weighted", "processes": "all_reduce_weighted",
           "mini_batches": "seq_weighted"}
LAST_MICRO = {"tokens": "per_seq", "micro_batches": "last", "processes": "all_reduce_mean", "window": "last"}
RANK0_WINDOW = {"tokens": "per_seq", "micro_batches": "mean", "processes": "rank0", "window": "last"}
STATED = {
    ("ppo", "policy_loss", "token-mean"): STEP_NORM,
    ("ppo", "policy_loss", "seq-mean-token-mean"): {**STEP_NORM, "tokens": "seq_mean_token_mean",
                                                    "processes": "token_weighted"},
    ("ppo", "entropy_loss", None): STEP_NORM,
    ("ppo", "kl", "use_loss"): STEP_NORM,
    ("ppo", "ppo_kl", None): TOKEN_MEAN,
    ("ppo", "ppo_clip_ratio", None): TOKEN_MEAN,
    ("ppo", "logprobs_diff", "use_loss"): TOKEN_MEAN,
    ("ppo", "kl", "reward"): SEQ_TOKEN_MEAN,
    ("ppo", "logprobs_diff", "reward"): SEQ_TOKEN_MEAN,
    **{("ppo", k, None): PER_SEQ for k in ("reward", "score", "return", "response_length", "total_length",
                                            "truncated", "group_reward_std")},
    **{(t, k, None): LAST_MICRO for t in ("dpo", "rm") for k in ("loss", "acc", "chosen_reward", "reject_reward")},
    ("dpo", "nll_loss", None): {**LAST_MICRO, "tokens": "seq_mean_token_mean"},
    **{(t, k, None): RANK0_WINDOW for t in ("dpo", "rm") for k in ("loss_mean", "acc_mean")},
    ("sft", "gpt_loss", None): {**LAST_MICRO, "tokens": "token_sum_step_norm"},
    ("sft", "loss_mean", None): {**RANK0_WINDOW, "tokens": "token_sum_step_norm"},
}
REL = 2e-5           # float32 sums of O(1) terms (a loss near 0 is a difference of such); candidates differ by far more
PPO_LEVELS = ("micro_batches", "mini_batches", "processes")
FIT_LEVELS = ("micro_batches", "processes", "window")


def assert_stated(*a, **kw):
    return FP.assert_stated(*a, rel=REL, **kw)


def stated(trainer: str, key: str, variant: str | None = None) -> dict:
    return STATED[(trainer, key, variant)]


# ============================================================================================ PPO
@pytest.fixture(scope="module")
def ppo_default():
    """Three PPO steps (three rollouts) in the default config: use_kl_loss off, kl estimator k1; entropy logged
    (entropy_coef 0: log only)."""
    return [P.run_ppo(P.make_rollout(seed), P.ppo_args()) for seed in range(3)]


@pytest.fixture(scope="module")
def ppo_kl_loss():
    """Two PPO steps with --algo.kl.use_loss and the k3 estimator."""
    return [P.run_ppo(P.make_rollout(seed), P.ppo_args(use_kl_loss=True, estimator="k3")) for seed in (3, 4)]


def obs(runs, key: str, per_seq) -> list:
    return [(run.status[key], P.steps_of(run, lambda i, s, run=run: per_seq(run, i, s))) for run in runs]


def tokens_of(run, i: int, v: float) -> list[float]:
    """A per-sequence value carried on each of the sequence's response tokens (per_seq reads the first; the token
    count weights it)."""
    return [v] * run.rollout.resp_len[i]


def version(run, s: int) -> int:
    return run.policy_steps[s]


def test_ppo_run_shape(ppo_default):
    """The batch the PPO proofs read: 2 epochs x 2 optimizer steps, 2 ranks x 2 micro-batches of 2 sequences, the
    policy one optimizer step further at each, micro-batches of different token counts on every level."""
    run = ppo_default[0]
    assert len(run.micro) == 4 and run.policy_steps == [0, 1, 2, 3]
    assert all(len(step) == P.WORLD and all(len(rank) == P.GAS and all(len(mb) == P.MICRO for mb in rank)
                                              for rank in step) for step in run.micro)
    seen = sorted(i for step in run.micro[:2] for rank in step for mb in rank for i in mb)
    assert seen == list(range(run.rollout.n))                # each epoch visits every sample once
    FP.check_uneven(P.steps_of(run, lambda i, s: run.rollout.old[i]), PPO_LEVELS)


@pytest.mark.parametrize("key", ["policy_loss", "entropy_loss"])
def test_ppo_losses_are_step_normalised_sums_merged_by_tokens(ppo_default, key):
    """aggregate_loss divides a micro-batch's masked sum by the optimizer step's tokens per (rank, micro-batch)
    (iter_grad_accum_global_norm) and ppo_train merges those by tokens: not a token mean."""
    def per_token(run, i, s):
        if key == "entropy_loss":
            return run.rollout.entropy(i, version(run, s))
        return P.policy_terms(run.rollout, i, version(run, s), run.experiences[i].advantages)[0]
    found = assert_stated(obs(ppo_default, key, per_token), None, stated("ppo", key, "token-mean"
                                                                              if key == "policy_loss" else None),
                             levels=PPO_LEVELS)
    assert found.tokens == "token_sum_step_norm"


@pytest.mark.parametrize("key, col", [("ppo_kl", 2), ("ppo_clip_ratio", 1)])
def test_ppo_kl_and_clip_ratio_are_token_means_at_update_time(ppo_default, key, col):
    """PolicyLoss's masked_mean per micro-batch under the policy being updated, merged by tokens over micro-batches,
    ranks, optimizer steps and epochs: the token mean over the whole PPO step."""
    def per_token(run, i, s):
        return P.policy_terms(run.rollout, i, version(run, s), run.experiences[i].advantages)[col]
    assert_stated(obs(ppo_default, key, per_token), None, stated("ppo", key), levels=PPO_LEVELS)


def test_ppo_kl_default_is_reward_side_k1_per_sequence(ppo_default):
    """use_kl_loss off (the default): kl is the experience maker's per-sequence masked mean of k1(old policy,
    reference), computed once at rollout time and merged by samples: the mean over samples of per-sequence token
    means. The update-time policy's KL does not give it."""
    def rollout_k1(run, i, s):
        return P.approx_kl(run.rollout.old[i], run.rollout.ref[i], "k1")
    assert_stated(obs(ppo_default, "kl", rollout_k1), None, stated("ppo", "kl", "reward"), levels=PPO_LEVELS)
    for estimator in ("k2", "k3"):
        other = obs(ppo_default, "kl", lambda run, i, s: P.approx_kl(run.rollout.old[i], run.rollout.ref[i],
                                                                        estimator))
        assert not any(math.isclose(v, other[0][0], rel_tol=1e-6) for v, _ in FP.candidates(other[0][1]))
    update = obs(ppo_default, "kl", lambda run, i, s: P.approx_kl(run.rollout.logp(i, version(run, s)),
                                                                   run.rollout.ref[i], "k1"))
    assert not any(math.isclose(v, update[0][0], rel_tol=1e-6) for v, _ in FP.candidates(update[0][1]))


def test_ppo_logprobs_diff_default_equals_k1_kl(ppo_default):
    """Without use_loss, logprobs_diff is the per-sequence mean of old - reference log-probs: the k1 kl itself."""
    def diff(run, i, s):
        return [a - b for a, b in zip(run.rollout.old[i], run.rollout.ref[i])]
    assert_stated(obs(ppo_default, "logprobs_diff", diff), None, stated("ppo", "logprobs_diff", "reward"),
                     levels=PPO_LEVELS)
    assert all(math.isclose(r.status["logprobs_diff"], r.status["kl"], rel_tol=1e-6) for r in ppo_default)


def test_ppo_kl_with_use_loss_is_the_update_time_loss_term(ppo_kl_loss):
    """--algo.kl.use_loss, k3: kl is training_step's aggregate_loss of k3(current policy, reference) (the same
    step normalisation and token merge as policy_loss), logprobs_diff the token mean of current - reference."""
    def k3(run, i, s):
        return P.approx_kl(run.rollout.logp(i, version(run, s)), run.rollout.ref[i], "k3")
    assert_stated(obs(ppo_kl_loss, "kl", k3), None, stated("ppo", "kl", "use_loss"), levels=PPO_LEVELS)

    def diff(run, i, s):
        return [a - b for a, b in zip(run.rollout.logp(i, version(run, s)), run.rollout.ref[i])]
    assert_stated(obs(ppo_kl_loss, "logprobs_diff", diff), None, stated("ppo", "logprobs_diff", "use_loss"),
                     levels=PPO_LEVELS)


@pytest.mark.parametrize("key", ["reward", "score", "return", "response_length", "total_length", "truncated",
                                 "group_reward_std"])
def test_ppo_sample_fields_are_sample_means(ppo_default, key):
    """Per-sample info and episode fields (samples generator / experience maker), merged by samples over
    micro-batches, ranks, optimizer steps and epochs: the mean over the rollout's samples."""
    def value(run, i):
        r = run.rollout
        return {"reward": r.reward[i], "score": r.reward[i], "response_length": r.resp_len[i],
                "total_length": r.resp_len[i] + r.prompt_len[i], "truncated": float(r.truncated[i]),
                "return": run.experiences[i].info["return"],
                "group_reward_std": run.experiences[i].info["group_reward_std"]}[key]
    # group_reward_std is one value per prompt group, so a micro-batch's sequences often share it: its max, min and
    # mean then coincide; the selections are fingerprinted on the other keys
    kw = {"micro": ("seq_weighted", "token_weighted", "mean", "last", "none")} if key == "group_reward_std" else {}
    assert_stated(obs(ppo_default, key, lambda run, i, s: tokens_of(run, i, value(run, i))), None,
                  stated("ppo", key), levels=PPO_LEVELS, tokens=("per_seq",), **kw)


def test_ppo_seq_mean_token_mean_policy_loss():
    """--actor.loss_agg_mode seq-mean-token-mean (v0.11.2): aggregate_loss sums per-sequence token means over the
    step's sequences per (rank, micro-batch); ppo_train still merges by tokens."""
    runs = [P.run_ppo(P.make_rollout(seed), P.ppo_args(loss_agg_mode="seq-mean-token-mean")) for seed in (5, 6)]

    def per_token(run, i, s):
        return P.policy_terms(run.rollout, i, version(run, s), run.experiences[i].advantages)[0]
    assert_stated(obs(runs, "policy_loss", per_token), None, stated("ppo", "policy_loss", "seq-mean-token-mean"),
                     levels=PPO_LEVELS, processes=FP.PROCESSES + ("token_weighted", "seq_weighted"))


def test_ppo_grad_norm_and_lr_are_the_last_optimizer_steps(ppo_default):
    """actor_grad_norm and actor_lr are taken from the last micro-batch of the PPO step (ppo_train: vals[-1]): the
    last optimizer step's gradient norm, and the LR after the scheduler stepped there; not a mean over the step's
    optimizer steps, and not the LR the last step used."""
    for run in ppo_default:
        norms = [P.grad_norm_of_step(k) for k in range(len(run.micro))]
        assert math.isclose(run.status["actor_grad_norm"], norms[-1])
        assert not any(math.isclose(run.status["actor_grad_norm"], x) for x in norms[:-1] + [sum(norms) / len(norms)])
        used = P.BASE_LR * P.lr_factor(len(run.micro) - 1)
        assert math.isclose(run.status["actor_lr"], run.lr_after[-1]) and not math.isclose(run.status["actor_lr"], used)


def test_ppo_logging_steps_log_the_step_not_the_window(ppo_default):
    """BasePPOTrainer.save_logs_and_checkpoints with logging_steps 2: rows at steps 2 and 4 carry that step's
    status (window 'last'), the steps in between are not logged."""
    w = P.wheel()
    rows: list[dict] = []
    logger = P.ns(handle=P.ns(log=rows.append, Table=None), samples_table=None)
    logger.log_train = lambda step, logs: w.logging_utils.WandbLogger.log_train(logger, step, logs)
    trainer = P.ns(args=P.ppo_args(logging_steps=2), wandb_logger=logger, tensorboard_logger=None)
    order = [ppo_default[0], ppo_default[1], ppo_default[2], ppo_default[1]]      # rollouts of unequal token counts
    for step, run in enumerate(order, start=1):
        w.trainer["save_logs_and_checkpoints"](trainer, step, dict(run.status))
    assert [r["train/global_step"] for r in rows] == [2, 4]
    for row, runs in ((rows[0], order[:2]), (rows[1], order[2:])):
        steps = [P.steps_of(run, lambda i, s, run=run: tokens_of(run, i, run.rollout.reward[i]))[0] for run in runs]
        assert_stated(row["train/reward"], steps, {**stated("ppo", "reward"), "window": "last"},
                         levels=("window",), tokens=("per_seq",), micro=("seq_weighted",), mini=("seq_weighted",),
                         processes=("all_reduce_weighted",))


# ============================================================================================ DPO / RM / SFT
DATA = P.PrefData(world=2, steps=10, gas=3, micro=2)
WINDOW = 2                                   # logging_steps


@pytest.fixture(scope="module")
def fits():
    return {kind: P.run_fit(kind, DATA, logging_steps=WINDOW, nll=kind == "dpo") for kind in ("dpo", "rm", "sft")}


def fit_obs(rows, key: str, value) -> list:
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


@pytest.mark.parametrize("kind, key", [(k, key) for k in ("dpo", "rm")
                                       for key in ("loss", "chosen_reward", "reject_reward", "loss_mean")])
def test_dpo_rm_last_micro_batch_and_rank0_window(fits, kind, key):
    """loss / chosen_reward / reject_reward: the last micro-batch of the optimizer step, averaged over ranks
    (strategy.all_reduce), the last step of the logging window (DPOTrainer.fit logs 0.534-like values where the
    window mean differs). loss_mean: rank 0's own micro-batches averaged (added after all_reduce)."""
    assert_stated(fit_obs(fits[kind], key, pair_value(kind, key)), None, stated(kind, key), levels=FIT_LEVELS,
                     mini=("none",), tokens=("per_seq",))


@pytest.mark.parametrize("kind", ["dpo", "rm"])
def test_dpo_rm_accuracy_last_micro_batch(fits, kind):
    """acc / acc_mean take values in steps of 1/2 here: several windows, and the selection levels fixed to the
    candidates the coarse values cannot tell apart otherwise (tokens per pair, one mini-batch)."""
    for key in ("acc", "acc_mean"):
        got = FP.fingerprint(fit_obs(fits[kind], key, pair_value(kind, key)), rel=REL, tokens=("per_seq",),
                             mini=("none",), window=("last", "mean"))
        want = FP.stated(stated(kind, key), fit_obs(fits[kind], key, pair_value(kind, key))[0][1])
        assert (got.micro_batches, got.processes, got.window) == (want.micro_batches, want.processes, want.window)


def test_dpo_nll_loss_is_last_micro_batch_seq_token_mean(fits):
    def nll(k: int, v: int) -> list[float]:
        return [-x for x in DATA.logp(k, 0, v)]
    assert_stated(fit_obs(fits["dpo"], "nll_loss", nll), None, stated("dpo", "nll_loss"), levels=FIT_LEVELS,
                     mini=("none",))


@pytest.mark.parametrize("key", ["gpt_loss", "loss_mean"])
def test_sft_loss_is_step_normalised(fits, key):
    """SFTTrainer (v0.10.4+): SFTLoss with the window normaliser, so gpt_loss is the last micro-batch's token sum
    over all ranks / (the window's tokens / accumulation), and loss_mean rank 0's window of those."""
    def nll(k: int, v: int) -> list[float]:
        return [-x for x in DATA.logp(k, 0, v)]
    assert_stated(fit_obs(fits["sft"], key, nll), None, stated("sft", key), levels=FIT_LEVELS, mini=("none",))


@pytest.mark.parametrize("kind", ["dpo", "rm", "sft"])
def test_fit_lr_and_grad_norm_are_the_logged_steps(fits, kind):
    """lr / grad_norm: read at the accumulation boundary, after the scheduler stepped: that optimizer step's norm
    and the LR the next step will use; rows every logging_steps carry the last step's."""
    for n, row in enumerate(fits[kind], start=1):
        step = n * WINDOW
        assert math.isclose(row["train/grad_norm"], P.grad_norm_of_step(step - 1))
        assert math.isclose(row["train/lr"], P.BASE_LR * P.lr_factor(step))
        assert not math.isclose(row["train/lr"], P.BASE_LR * P.lr_factor(step - 1))
        window_norms = [P.grad_norm_of_step(k) for k in range(step - WINDOW, step)]
        assert not math.isclose(row["train/grad_norm"], sum(window_norms) / WINDOW)
