"""Fingerprints of SkyRL 0.3.0's logged metrics (issue 33 item 1), run by the release tag's own files vendored under
tests/data/frameworks/skyrl/ (tests/_support/proofs_skyrl.py says what is loaded, what is compiled from a file's
text and which stand-ins it uses, and why).

The policy metrics come from one training step of SkyRL's code: ``RayPPOTrainer.train_critic_and_policy`` ->
``_execute_training_step`` (trainer.py@skyrl-v0.3.0:1481-1526: ``_normalize_advantages`` pre-scales the advantages
per mini-batch, then one ``forward_backward`` + ``optim_step`` per mini-batch, ``reduce_metrics(...,
sum_loss_metrics=False)`` over the mini-batches) -> ``WorkerDispatch`` (worker_dispatch.py:288-406: the mini-batch
staged in dp chunks, ``WorkerOutput.cat`` keeps rank 0's metrics, ``optim_step`` rank 0's norm) ->
``PolicyWorkerBase.forward_backward`` (worker.py:758-819: ``reduce_metrics(sum_loss_metrics=True)`` over the
micro-batches, ``all_reduce_metrics`` over the ranks) -> ``_forward_backward_micro`` (worker.py:821-1029: the real
``ppo_policy_loss``, ``compute_approx_kl``, ``masked_mean``) on 2 simulated ranks, 2 mini-batches of 2 prompts x 4
samples, micro-batches of 3 and 1 sequences per rank, ragged response lengths. What the logged values are compared
with is what SkyRL's code was given (the advantages, the log-probs and entropies the policy returned, the rewards
and responses), or what SkyRL's own per-token function made of them (``compute_approx_kl``), in the nesting the
framework's micro-batches had (recorded by the policy as it was called), never a value this file computes the metric
from: each logged value is fingerprinted against every candidate reduction and must be the reduction
mappings/skyrl.yaml states, and no other.
"""
from __future__ import annotations

import dataclasses
import math
import random
import types

import pytest

pytest.importorskip("torch")
pytest.importorskip("omegaconf")

import torch  # noqa: E402

from _support import fingerprint as FP  # noqa: E402
from _support import proofs_skyrl as P  # noqa: E402
from _support.proven import close, proof  # noqa: E402

REL = P.release()
if REL == "not vendored":
    pytest.skip("skyrl is not vendored (tests/data/frameworks/skyrl)", allow_module_level=True)

N_PROMPTS, N_SAMPLES, MINI_PROMPTS, MICRO, RESP, PROMPT = 4, 4, 2, 3, 7, 2
LEVELS = ("micro_batches", "mini_batches", "processes")
DRIVER = ("micro_batches", "processes")
BASE = {"trainer.train_batch_size": N_PROMPTS, "trainer.policy_mini_batch_size": MINI_PROMPTS,
        "trainer.micro_train_batch_size_per_gpu": MICRO, "generator.n_samples_per_prompt": N_SAMPLES,
        "trainer.update_epochs_per_batch": 1}


# ------------------------------------------------------------------------------------------------ the batch
@dataclasses.dataclass
class Batch:
    data: object                 # the TrainingInputBatch handed to train_critic_and_policy
    logp: torch.Tensor           # [V] the policy's log-prob of each token id (what the model returns)
    entropy: torch.Tensor        # [V] its entropy at each token id
    resp: torch.Tensor           # [B, RESP] response token ids
    mask: torch.Tensor           # [B, RESP] loss mask
    adv: torch.Tensor            # [B, RESP] the advantages given (before SkyRL's pre-scaling)
    clipped: torch.Tensor        # [B, RESP] the tokens whose ratio was set outside the clip range (0/1)
    base: torch.Tensor           # [B, RESP] the reference log-probs given


def make_batch(seed: int = 7, *, clip: bool = False, eps: float = 0.2) -> Batch:
    """16 sequences (4 prompts x 4 samples) of ragged response lengths 1..RESP, token ids unique per position (the
    first token of each row is its index + 1, which the policy records). With ``clip``, about a third of the valid
    tokens get an old log-prob 1 nat off the policy's, on the side where PPO's clip binds (ratio e for a positive
    advantage, 1/e for a negative one: outside [1 - eps, 1 + eps]); the others ratio 1."""
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    B = N_PROMPTS * N_SAMPLES
    lens = [rng.randint(1, RESP) for _ in range(B)]
    ids = torch.zeros(B, PROMPT + RESP, dtype=torch.long)
    for i in range(B):
        ids[i, 0] = i + 1
        for t in range(1, PROMPT + RESP):
            ids[i, t] = 1 + B + i * (PROMPT + RESP) + t
    V = int(ids.max()) + 1
    logp_table = -(0.05 + 2 * torch.rand(V, generator=g, dtype=torch.float64))
    ent_table = 0.1 + torch.rand(V, generator=g, dtype=torch.float64)
    resp = ids[:, -RESP:]
    mask = torch.zeros(B, RESP, dtype=torch.long)
    for i, n in enumerate(lens):
        mask[i, :n] = 1
    adv = torch.tensor([[rng.choice((-1, 1)) * rng.uniform(0.2, 2.0) for _ in range(RESP)] for _ in range(B)],
                       dtype=torch.float64) * mask
    logp = logp_table[resp].clone()
    base = logp - torch.tensor([[rng.uniform(-0.6, 0.6) for _ in range(RESP)] for _ in range(B)],
                               dtype=torch.float64)
    clipped = torch.zeros(B, RESP)
    if clip:
        clipped = torch.tensor([[float(rng.random() < 0.35) for _ in range(RESP)] for _ in range(B)]) * mask
        assert 1.0 / 2.718281828459045 < 1.0 - eps and 2.718281828459045 > 1.0 + eps, eps
    old = logp - clipped.double() * torch.sign(adv)          # log r = +1 for A > 0, -1 for A < 0 where clipped
    uids = [f"p{i // N_SAMPLES}" for i in range(B)]
    S = P.skyrl()
    data = S.training_batch.TrainingInputBatch({
        "sequences": ids, "attention_mask": torch.ones(B, PROMPT + RESP, dtype=torch.long),
        "action_log_probs": old, "base_action_log_probs": base, "advantages": adv.clone(),
        "loss_mask": mask, "response_mask": mask.clone()})
    data.metadata = {
        "uids": uids, "response_length": RESP,
        "policy_mini_batch_boundaries": S.preprocess.compute_prompt_mini_batch_boundaries(
            uids, MINI_PROMPTS, N_PROMPTS, False, N_SAMPLES),
        "policy_prompt_boundaries": S.preprocess.compute_prompt_boundaries(uids)}
    return Batch(data, logp_table, ent_table, resp, mask, adv, clipped, base)


_RUNS: dict = {}


def run(config: dict | None = None, *, clip: bool = False, seed: int = 7) -> tuple[P.PolicyRun, Batch]:
    """One policy step of SkyRL's code on make_batch(seed, clip=clip), the AlgorithmConfig's defaults overridden
    by ``config`` (trainer.algorithm.* keys)."""
    key = (tuple(sorted((config or {}).items())), clip, seed)
    if key not in _RUNS:
        S = P.skyrl()
        alg = S.config.AlgorithmConfig(**{k.rsplit(".", 1)[1]: v for k, v in (config or {}).items()})
        cfg = P.trainer_config(alg, train_batch_size=N_PROMPTS, policy_mini_batch_size=MINI_PROMPTS, micro=MICRO,
                               n_samples=N_SAMPLES)
        b = make_batch(seed, clip=clip, eps=alg.eps_clip_high)
        _RUNS[key] = (P.run_policy_step(b.data, cfg, b.logp, b.entropy), b)
    return _RUNS[key]


def nest(r: P.PolicyRun, per_row) -> list:
    """``steps[0][mini-batch][rank][micro-batch]`` = the sequences each micro-batch held, as SkyRL's iterator cut
    them (recorded by the policy), each ``per_row(row)``."""
    p_check_rows(r)
    return [[[[[per_row(row) for row in micro] for micro in rank] for rank in mini] for mini in r.micro_rows]]


def p_check_rows(r: P.PolicyRun) -> None:
    rows = sorted(row for mini in r.micro_rows for rank in mini for micro in rank for row in micro)
    assert rows == list(range(N_PROMPTS * N_SAMPLES)), rows          # every sequence once, per mini-batch


def valid(b: Batch, row: int, values: torch.Tensor) -> list[float]:
    """The row's values at its valid (loss-masked) response tokens."""
    return [float(v) for v, m in zip(values[row].tolist(), b.mask[row].tolist()) if m]


def config(**alg) -> dict:
    return dict(BASE, **{f"trainer.algorithm.{k}": v for k, v in alg.items()})


def sign_and_scale(p, logged: float, steps, found: FP.Reduction, key: str, norm_len: int = 0) -> None:
    v = FP.value_of(steps, found, norm_len)
    p.check(abs(v) > 1e-3 and not close(logged, -v, 1e-4) and not close(logged, v * P.WORLD, 1e-4)
            and not close(logged, v / P.WORLD, 1e-4), f"{key}: {logged} vs {v}: a sign or a rank factor hides")


def shape_checks(p, r: P.PolicyRun) -> None:
    micro_sizes = {len(m) for mini in r.micro_rows for rank in mini for m in rank}
    p.check(len(r.micro_rows) == N_PROMPTS // MINI_PROMPTS and all(len(mini) == P.WORLD for mini in r.micro_rows)
            and micro_sizes == {MICRO, N_PROMPTS * N_SAMPLES // (N_PROMPTS // MINI_PROMPTS) // P.WORLD - MICRO},
            f"not 2 mini-batches x 2 ranks x uneven micro-batches: {r.micro_rows}")


# ------------------------------------------------------------------------------------------------ policy losses
@proof("skyrl", trainer="ppo", release=REL, config=config(loss_reduction="token_mean"))
def test_policy_loss_token_mean_is_the_pooled_mini_batch_token_mean(p):
    """policy/policy_loss with loss_reduction token_mean: the advantages are pre-scaled by the mini-batch's valid
    token count (apply_loss_reduction_to_advantages_minibatch), each micro-batch's loss is a token SUM
    (reduce_loss), summed over micro-batches and ranks (sum_loss_metrics=True): the mini-batch's pooled token mean,
    then the unweighted mean over mini-batches. The policy returns the old log-probs exactly (ratio 1), so each
    token's PPO loss is -advantage (ppo_utils.py:565-569): the steps are the given advantages, negated."""
    r, b = run({"trainer.algorithm.loss_reduction": "token_mean"})
    shape_checks(p, r)
    steps = nest(r, lambda row: [-v for v in valid(b, row, b.adv)])
    key = "policy/policy_loss"
    found = p.assert_stated(key, r.metrics[key], steps, levels=LEVELS, rel=1e-5)
    sign_and_scale(p, r.metrics[key], steps, found, key)


@proof("skyrl", trainer="ppo", release=REL, config=config(loss_reduction="sequence_mean"))
def test_policy_loss_sequence_mean_weighs_sequences(p):
    """policy/policy_loss with loss_reduction sequence_mean: each sequence's token mean, averaged over the
    mini-batch's sequences (pre-scaled by batch_size x the sequence's tokens), so the micro-batches and ranks are
    weighted by their sequence counts; mean over mini-batches."""
    r, b = run({"trainer.algorithm.loss_reduction": "sequence_mean"})
    steps = nest(r, lambda row: [-v for v in valid(b, row, b.adv)])
    key = "policy/policy_loss"
    found = p.assert_stated(key, r.metrics[key], steps, levels=LEVELS, rel=1e-5)
    sign_and_scale(p, r.metrics[key], steps, found, key)


@proof("skyrl", trainer="ppo", release=REL,
       config=config(loss_reduction="seq_mean_token_sum_norm", max_seq_len=RESP + 3))
def test_policy_loss_seq_mean_token_sum_norm_divides_by_the_constant(p):
    """policy/policy_loss with loss_reduction seq_mean_token_sum_norm (Dr. GRPO): the mini-batch's token sum over
    (sequences x max_seq_len), a constant, summed over micro-batches and ranks; mean over mini-batches."""
    norm = RESP + 3
    r, b = run({"trainer.algorithm.loss_reduction": "seq_mean_token_sum_norm",
                "trainer.algorithm.max_seq_len": norm})
    steps = nest(r, lambda row: [-v for v in valid(b, row, b.adv)])
    key = "policy/policy_loss"
    found = p.assert_stated(key, r.metrics[key], steps, levels=LEVELS, rel=1e-5, norm_len=norm)
    sign_and_scale(p, r.metrics[key], steps, found, key, norm)


@proof("skyrl", trainer="ppo", release=REL, config=config(use_kl_loss=False))
def test_final_loss_without_kl_is_the_policy_loss(p):
    """policy/final_loss with use_kl_loss false (and the entropy loss off, the default): policy_loss x dp_size /
    dp_size per micro-batch (worker.py:988-990), reduced as the policy loss: the pooled mini-batch token mean,
    mean over mini-batches."""
    r, b = run({"trainer.algorithm.use_kl_loss": False})
    steps = nest(r, lambda row: [-v for v in valid(b, row, b.adv)])
    p.check("policy/policy_kl" not in r.metrics, "policy_kl logged without use_kl_loss")
    key = "policy/final_loss"
    found = p.assert_stated(key, r.metrics[key], steps, levels=LEVELS, rel=1e-5)
    sign_and_scale(p, r.metrics[key], steps, found, key)
    p.check(close(r.metrics[key], r.metrics["policy/policy_loss"], 1e-6), "final_loss differs from policy_loss")


# ------------------------------------------------------------------------------------------------ KL, entropy
def kl_tokens(b: Batch, estimator: str) -> torch.Tensor:
    """The per-token KL SkyRL's own compute_approx_kl makes of the log-probs the policy returned and the reference
    log-probs given (ppo_utils.py:88)."""
    S = P.skyrl()
    return S.ppo_utils.compute_approx_kl(b.logp[b.resp], b.base, loss_mask=b.mask, kl_estimator_type=estimator)


KL_COEF = 0.5              # large enough that final_loss's KL term stands out of float32 rounding


@proof("skyrl", trainer="ppo", release=REL, config=config(kl_estimator_type="k3", use_kl_loss=True,
                                                          kl_loss_coef=KL_COEF))
def test_policy_kl_is_a_mean_of_micro_batch_means_of_sequence_means(p):
    """policy/policy_kl (k3, the default): masked_mean per sequence, then the mean over the micro-batch's
    sequences (worker.py:970-977), then unweighted means over micro-batches, ranks and mini-batches."""
    r, b = run({"trainer.algorithm.kl_loss_coef": KL_COEF})
    kl = kl_tokens(b, "k3")
    steps = nest(r, lambda row: valid(b, row, kl))
    key = "policy/policy_kl"
    found = p.assert_stated(key, r.metrics[key], steps, levels=LEVELS, rel=1e-5)
    sign_and_scale(p, r.metrics[key], steps, found, key)
    p.check(all(v >= 0 for seq in steps[0][0][0][0] for v in seq), "k3 is non-negative")
    # policy/final_loss with use_kl_loss (its entry's stated deviation): policy_loss + kl_loss_coef x the KL term,
    # where each micro-batch's term is weighted by its share of the rank's sequences and divided by dp_size
    # (worker.py:988-990), summed: the mini-batch's mean of sequence means, averaged over mini-batches
    seq_mean = FP.value_of(steps, FP.Reduction("seq_mean_token_mean", "mean", "seq_weighted", "mean",
                                                "seq_weighted", "step"))
    term = r.metrics["policy/final_loss"] - r.metrics["policy/policy_loss"]
    p.check(math.isclose(term, KL_COEF * seq_mean, rel_tol=1e-4) and abs(term) > 1e-3
            and not math.isclose(seq_mean, r.metrics[key], rel_tol=1e-3),
            "final_loss's KL term is not kl_loss_coef x the sequence-weighted KL")


def other_estimator(p, estimator: str) -> None:
    r, b = run({"trainer.algorithm.kl_estimator_type": estimator})
    kl = kl_tokens(b, estimator)
    steps = nest(r, lambda row: valid(b, row, kl))
    found = p.assert_stated("policy/policy_kl", r.metrics["policy/policy_kl"], steps, levels=LEVELS, rel=1e-5)
    sign_and_scale(p, r.metrics["policy/policy_kl"], steps, found, "policy/policy_kl")
    entry, res = p.entry("policy/policy_kl")
    p.check(entry.canonical == f"kl/ref/{estimator}", (entry.canonical, res.fields))


@proof("skyrl", trainer="ppo", release=REL, config=config(kl_estimator_type="k1"))
def test_policy_kl_k1(p):
    """policy/policy_kl with kl_estimator_type k1 (log p - log p_ref, signed): the same reduction of k1 tokens."""
    other_estimator(p, "k1")


@proof("skyrl", trainer="ppo", release=REL, config=config(kl_estimator_type="k2"))
def test_policy_kl_k2(p):
    """policy/policy_kl with kl_estimator_type k2 (half the squared log-ratio): the same reduction of k2 tokens."""
    other_estimator(p, "k2")


@proof("skyrl", trainer="ppo", release=REL, config=BASE)
def test_policy_entropy_is_a_mean_of_micro_batch_token_means(p):
    """policy/policy_entropy: masked_mean of the policy's per-token entropy over each micro-batch's loss mask
    (worker.py:958-962), then unweighted means over micro-batches, ranks and mini-batches (NovaSky-AI/SkyRL#1822)."""
    r, b = run()
    ent = b.entropy[b.resp]
    steps = nest(r, lambda row: valid(b, row, ent))
    key = "policy/policy_entropy"
    found = p.assert_stated(key, r.metrics[key], steps, levels=LEVELS, rel=1e-5)
    sign_and_scale(p, r.metrics[key], steps, found, key)


@proof("skyrl", trainer="ppo", release=REL, config=BASE)
def test_clip_ratio_is_a_mean_of_micro_batch_token_fractions(p):
    """policy/loss_metrics/clip_ratio: masked_mean((-surr2 > -surr1)) per micro-batch (ppo_utils.py:570), averaged
    unweighted over micro-batches, ranks and mini-batches. The batch sets each token's ratio: 1 (not clipped), or
    e / 1/e on the binding side of the clip range (clipped): the steps are those given 0/1 marks."""
    obs = []
    for seed in (7, 8, 9):                # 0/1 marks on small micro-batches: fractions can tie on one batch
        r, b = run(clip=True, seed=seed)
        p.check(0 < float(b.clipped.sum()) < float(b.mask.sum()) / 2, "no or too many clipped tokens")
        obs.append((r.metrics["policy/loss_metrics/clip_ratio"], nest(r, lambda row, b=b: valid(b, row, b.clipped))))
    key = "policy/loss_metrics/clip_ratio"
    found = p.assert_stated(key, obs, levels=LEVELS, rel=1e-5, tokens=("token_mean", "seq_mean_token_mean"))
    for logged, steps in obs:
        sign_and_scale(p, logged, steps, found, key)


# ------------------------------------------------------------------------------------------------ optimizer
def per_optimizer_step(values: list[float]) -> list:
    return [[[[[[float(v)]]]] for v in values]]


@proof("skyrl", trainer="ppo", release=REL, config=BASE)
def test_grad_norm_averages_the_optimizer_steps(p):
    """policy/grad_norm: the pre-clip norm FSDPStrategy.optimizer_step's clip_grad_norm_ returned at each
    mini-batch's optimizer step (rank 0's, WorkerDispatch.optim_step; the same on every rank after the
    data-parallel gradient mean), averaged unweighted over mini-batches by reduce_metrics (trainer.py:1521-1524)."""
    r, _ = run()
    norms = r.grad_norms[0]
    p.check(len(norms) == N_PROMPTS // MINI_PROMPTS and len(set(norms)) == len(norms)
            and all(close(a, c) for a, c in zip(norms, r.grad_norms[1])), r.grad_norms)
    p.assert_stated("policy/grad_norm", r.metrics["policy/grad_norm"], per_optimizer_step(norms), levels=())
    p.check(not close(r.metrics["policy/grad_norm"], min(1.0, norms[-1])), "the clipped or last norm")


@proof("skyrl", trainer="ppo", release=REL, config=BASE)
def test_lr_is_the_rate_before_each_step_averaged(p):
    """policy/policy_lr: scheduler.get_last_lr() in each micro-batch of forward_backward, before that mini-batch's
    optimizer and scheduler step (worker.py:1018), averaged over micro-batches, ranks and mini-batches: the mean of
    the rates the steps used, not the rate after the last step."""
    r, _ = run()
    p.check(len(r.lrs) == N_PROMPTS // MINI_PROMPTS and len(set(r.lrs)) == len(r.lrs), r.lrs)
    p.assert_stated("policy/policy_lr", r.metrics["policy/policy_lr"], per_optimizer_step(r.lrs), levels=(),
                    rel=1e-5)
    p.check(not close(r.metrics["policy/policy_lr"], r.lrs[-1] * 0.5, 1e-4), "the rate after the last step")
    _, res = p.entry("policy/policy_lr")
    p.check(res.fields["snapshot"] == "before_scheduler_step", res.fields)


# ------------------------------------------------------------------------------------------------ trainer batch
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


SHARES = ((3, 1, 3), (2, 4, 1, 2))
ENDS = ((6, 1, 1), (1, 1, 6))


SHARES_STD = ((3, 2, 4), (2, 3, 2))      # groups of two or more: a standard deviation of one value is undefined
ENDS_STD = ((5, 2, 2), (2, 5))


def per_seq_observations(logged: float, values: list[float], shares: tuple = SHARES, ends: tuple = ENDS) -> list:
    """One value computed over the whole batch, against five layouts of its per-sequence values (as given, sorted
    up and down, cut into uneven groups): the pooled value is the same in every layout, a selection or an unweighted
    mean of groups is not."""
    seqs = [[float(v)] for v in values]
    up, down = sorted(seqs), sorted(seqs, reverse=True)
    return [(logged, [[layout(order, cut)]]) for order, cut in ((list(seqs), shares), (up, shares),
                                                                (down, shares), (up, ends), (down, ends))]


def token_observations(logged: float, seqs: list[list[float]]) -> list:
    orders = (list(seqs), list(reversed(seqs)), sorted(seqs, key=lambda s: (-len(s), s)))
    return [(logged, [[layout(order, SHARES)]]) for order in orders]


def generator_output(seed: int = 11) -> tuple[dict, list[str]]:
    rng = random.Random(seed)
    n = N_PROMPTS * N_SAMPLES
    responses = [[rng.randint(5, 90) for _ in range(rng.randint(1, 12))] for _ in range(n)]
    rewards = [round(rng.choice((0.0, 0.0, 1.0, rng.uniform(-0.5, 1.5))), 3) for _ in range(n)]
    return ({"response_ids": responses, "rewards": rewards,
             "loss_masks": [[1] * len(r) for r in responses]}, [f"p{i // N_SAMPLES}" for i in range(n)])


def trainer(cfg_alg: dict | None = None) -> types.SimpleNamespace:
    S = P.skyrl()
    alg = S.config.AlgorithmConfig(**(cfg_alg or {}))
    t = types.SimpleNamespace(cfg=P.trainer_config(alg, train_batch_size=N_PROMPTS, policy_mini_batch_size=MINI_PROMPTS,
                                                   micro=MICRO, n_samples=N_SAMPLES),
                              all_metrics={}, all_timings={}, global_step=3, reward_kl_controller=None)
    for name in ("postprocess_generator_output", "apply_reward_kl_penalty"):
        setattr(t, name, types.MethodType(S.trainer[name], t))
    return t


@proof("skyrl", trainer="ppo", release=REL, config=BASE)
def test_raw_reward_is_the_mean_over_the_steps_trajectories(p):
    """reward/avg_raw_reward: postprocess_generator_output -> get_metrics_from_generator_output: np.mean of every
    trajectory's reward over the step's whole generator output (generators/utils.py:217), computed once."""
    go, uids = generator_output()
    rewards = list(go["rewards"])
    t = trainer()
    t.postprocess_generator_output(go, uids)
    m = t.all_metrics["reward/avg_raw_reward"]
    p.check(len(set(rewards)) > 3 and any(x < 0 for x in rewards), rewards)
    p.assert_stated("reward/avg_raw_reward", per_seq_observations(m, rewards), levels=DRIVER, tokens=("per_seq",))
    p.check(not close(m, -sum(rewards) / len(rewards)) and not close(m, sum(rewards)), m)


@proof("skyrl", trainer="ppo", release=REL, config=BASE)
def test_response_lengths_are_over_the_steps_trajectories(p):
    """generate/avg_num_tokens, max, min, std: get_rollout_metrics over every trajectory's len(response) at once
    (generators/utils.py:399-427), std np.std (population)."""
    go, _ = generator_output()
    S = P.skyrl()
    m = S.gen["get_rollout_metrics"](go["response_ids"], go["rewards"])
    lengths = [float(len(r)) for r in go["response_ids"]]
    for key, stat in (("generate/avg_num_tokens", "mean"), ("generate/max_num_tokens", "max"),
                      ("generate/min_num_tokens", "min"), ("generate/std_num_tokens", "std")):
        cuts = (SHARES_STD, ENDS_STD) if stat == "std" else (SHARES, ENDS)
        p.assert_stated(key, per_seq_observations(m[key], lengths, *cuts), levels=DRIVER, tokens=("per_seq",),
                        stats=(stat,))
    _, res = p.entry("generate/std_num_tokens")
    p.check(res.fields.get("std") == "population", res.fields)


def reward_kl(p, estimator: str) -> None:
    b = make_batch(5)
    S = P.skyrl()
    t = trainer({"use_kl_in_reward": True, "use_kl_loss": False, "kl_loss_coef": 0.05,
                 "kl_estimator_type": estimator})
    t.reward_kl_controller = S.ppo_utils.get_kl_controller(t.cfg.trainer.algorithm)     # trainer.py:309
    data = b.data
    data["action_log_probs"] = b.logp[b.resp].clone()
    data["rewards"] = torch.zeros_like(b.adv)
    t.apply_reward_kl_penalty(data)
    kl = kl_tokens(b, estimator)
    seqs = [valid(b, row, kl) for row in range(len(b.resp))]
    p.check(len({len(s) for s in seqs}) > 3, "the sequences are not ragged")
    m = t.all_metrics
    found = p.assert_stated("loss/avg_kl", token_observations(m["loss/avg_kl"], seqs), levels=DRIVER,
                            tokens=("token_mean", "seq_mean_token_mean", "seq_mean_token_sum"))
    sign_and_scale(p, m["loss/avg_kl"], [[layout(seqs, SHARES)]], found, "loss/avg_kl")
    entry, _ = p.entry("loss/avg_kl")
    p.check(entry.canonical == f"kl/old_ref/{estimator}", entry.canonical)
    p.assert_stated("loss/kl_loss_coef", m["loss/kl_loss_coef"], [[[[[[0.05]]]]]], levels=())


@proof("skyrl", trainer="ppo", release=REL, config=config(use_kl_in_reward=True, use_kl_loss=False,
                                                          kl_estimator_type="k3"))
def test_reward_kl_is_a_mean_of_sequence_means(p):
    """loss/avg_kl and loss/kl_loss_coef (use_kl_in_reward): apply_reward_kl_penalty's compute_approx_kl over the
    whole batch, masked_mean per sequence, .mean() over the batch (trainer.py:1392-1411); the coefficient the fixed
    controller holds (get_kl_controller: kl_loss_coef)."""
    reward_kl(p, "k3")


@proof("skyrl", trainer="ppo", release=REL, config=config(use_kl_in_reward=True, use_kl_loss=False,
                                                          kl_estimator_type="k1"))
def test_reward_kl_k1_is_a_mean_of_sequence_means(p):
    """loss/avg_kl with kl_estimator_type k1: the same reduction of the signed k1 tokens."""
    reward_kl(p, "k1")


# ------------------------------------------------------------------------------------------------ timings, counters
class Clock:
    """time as Timer reads it (time.time()): the instant the test sets."""

    def __init__(self, now: float):
        self.now = now

    def time(self) -> float:
        return self.now


@proof("skyrl", trainer="ppo", release=REL, config=BASE)
def test_timings_throughput_and_counters_are_the_steps_own_numbers(p):
    """timing/{stage} (step, generate, train_critic_and_policy): Timer's seconds (utils.py:32-45, exit minus
    enter, summed per name into all_timings), put under timing/ by train()'s log_payload (trainer.py:523-526); trainer/
    tokens_per_second_per_gpu: the batch's attention-mask tokens over train_critic_and_policy's seconds x the
    training GPUs (trainer.py:497-502); trainer/global_step and trainer/epoch as given (trainer.py:504). One number
    each, fingerprinted as the one value it is, with another unit / token count checked to differ."""
    S = P.skyrl()
    blocks = P.train_blocks()
    secs = {"step": 12.5, "generate": 7.25, "train_critic_and_policy": 3.5}
    t = types.SimpleNamespace(all_metrics={}, all_timings={}, global_step=3, _num_training_gpus=P.WORLD)
    saved = S.timer_ns["time"]
    clock = S.timer_ns["time"] = Clock(100.0)
    try:
        with S.Timer("step", t.all_timings):
            clock.now = 101.0
            with S.Timer("generate", t.all_timings):
                clock.now += secs["generate"]
            clock.now = 110.0
            with S.Timer("train_critic_and_policy", t.all_timings):
                clock.now += secs["train_critic_and_policy"]
            clock.now = 100.0 + secs["step"]
    finally:
        S.timer_ns["time"] = saved
    b = make_batch(3)
    tokens = float(b.data["attention_mask"].sum())
    ns = {"self": t, "training_input": b.data, "epoch": 1, "vllm_metrics": {}}
    exec(blocks.throughput, ns)           # noqa: S102 - trainer.py's own statements
    exec(blocks.epoch, ns)                # noqa: S102
    exec(blocks.payload, ns)              # noqa: S102
    payload = ns["log_payload"]
    for stage in ("step", "generate"):
        key = f"timing/{stage}"
        p.assert_stated(key, payload[key], [[[[[[secs[stage]]]]]]], levels=())
        p.check(close(payload[key], secs[stage]) and not close(payload[key], secs[stage] * 1000), key)
    p.assert_stated("timing/train_critic_and_policy", payload["timing/train_critic_and_policy"],
                    [[[[[[secs["train_critic_and_policy"]]]]]]], levels=())
    tput = tokens / (secs["train_critic_and_policy"] * P.WORLD)
    key = "trainer/tokens_per_second_per_gpu"
    p.assert_stated(key, payload[key], [[[[[[tput]]]]]], levels=())
    p.check(not close(payload[key], tokens / secs["step"] / P.WORLD) and not close(payload[key], tput * P.WORLD),
            "throughput: over the whole step or not per GPU")
    p.assert_stated("trainer/global_step", payload["trainer/global_step"], [[[[[[3.0]]]]]], levels=())
    p.check(payload["trainer/epoch"] == 1, payload)


# ------------------------------------------------------------------------------------------------ evaluation
EVAL_N = 2                 # generator.eval_n_samples_per_prompt
PROMPT_SHARES = ((3, 1, 1), (2, 2))        # 9 prompts in uneven groups
PROMPT_ENDS = ((5, 1), (1, 2))
ALL_SHARES = ((3, 1, 4), (2, 5, 1, 2))     # the 18 trajectories
ALL_ENDS = ((7, 1, 1), (1, 1, 7))
SOURCE_SHARES = ((3, 1, 2), (1, 3))        # 10 trajectories of one data source
SOURCE_ENDS = ((5, 1), (1, 3))


def eval_run(seed: int = 13) -> tuple[dict, dict, list[str], list[str]]:
    """evaluate()'s metric statements on a generator output of 9 prompts x 2 samples from two data sources (a/b:
    4 prompts, c: 5), rewards in [-0.5, 1.5] and 0."""
    rng = random.Random(seed)
    uids = [f"q{i // EVAL_N}" for i in range(9 * EVAL_N)]
    sources = ["a/b" if i < 4 * EVAL_N else "c" for i in range(len(uids))]
    rewards = [round(rng.choice((0.0, 0.0, 1.0, rng.uniform(-0.5, 1.5))), 3) for _ in uids]
    rewards[1], rewards[-2], rewards[-1] = -0.25, 0.0, -0.4   # a negative reward in each data source, and a
    #                                                           prompt of c with no rewarded sample
    go = {"response_ids": [[1] * rng.randint(1, 9) for _ in uids], "rewards": rewards,
          "rollout_metrics": {}}
    S = P.skyrl()
    cfg = types.SimpleNamespace(generator=types.SimpleNamespace(eval_n_samples_per_prompt=EVAL_N))
    ns = {"calculate_per_dataset_metrics": S.trainer_utils["calculate_per_dataset_metrics"],
          "get_metrics_from_generator_output": S.gen["get_metrics_from_generator_output"],
          "concat_generator_outputs": go, "concat_uids": uids, "concat_data_sources": sources, "cfg": cfg}
    exec(P.eval_block(), ns)                  # noqa: S102 - evaluate.py's own statements
    return ns["eval_metrics"], go, uids, sources


@proof("skyrl", trainer="ppo", release=REL, config=dict(BASE, **{"generator.eval_n_samples_per_prompt": EVAL_N}))
def test_eval_scores_are_means_over_the_eval_trajectories(p):
    """eval/all/avg_score: get_metrics_from_generator_output over every evaluation trajectory pooled (evaluate.py:133);
    eval/{data_source}/avg_score: the same over one data source's trajectories (trainer_utils.py:226-262), its
    name with '/' made '_'. Computed once over the trajectories: the pooled mean in every layout."""
    m, go, uids, sources = eval_run()
    rewards = go["rewards"]
    p.check(len(set(rewards)) > 3 and any(r < 0 for r in rewards), rewards)
    p.assert_stated("eval/all/avg_score", per_seq_observations(m["eval/all/avg_score"], rewards, ALL_SHARES, ALL_ENDS),
                    levels=DRIVER, tokens=("per_seq",))
    sub = [r for r, s in zip(rewards, sources) if s == "c"]
    p.check("eval/a_b/avg_score" in m and "eval/c/avg_score" in m, sorted(m))
    p.assert_stated("eval/c/avg_score", per_seq_observations(m["eval/c/avg_score"], sub, SOURCE_SHARES,
                                                             SOURCE_ENDS), levels=DRIVER, tokens=("per_seq",))
    p.check(not close(m["eval/c/avg_score"], m["eval/all/avg_score"]), "one data source's score is the pooled one")
    sub_a = [r for r, s in zip(rewards, sources) if s == "a/b"]
    p.assert_stated("eval/a_b/avg_score", per_seq_observations(m["eval/a_b/avg_score"], sub_a, ((3, 2), (1, 2)),
                                                               ((5, 1), (1, 1))), levels=DRIVER, tokens=("per_seq",))


@proof("skyrl", trainer="ppo", release=REL, config=dict(BASE, **{"generator.eval_n_samples_per_prompt": EVAL_N}))
def test_eval_pass_at_n_is_the_share_of_prompts_with_a_rewarded_sample(p):
    """eval/{data_source}/pass_at_{n} (eval/all/pass_at_{n} included): per prompt (uid) 1 if any of its samples is
    rewarded > 0, averaged over the prompts (generators/utils.py:219-226): the steps are the prompts' marks (whether
    the rewards given to a prompt hold one > 0), the pooled mean over prompts in every layout."""
    m, go, uids, _ = eval_run()
    by_prompt: dict = {}
    for u, r in zip(uids, go["rewards"]):
        by_prompt.setdefault(u, []).append(r)
    marks = [float(any(r > 0 for r in rs)) for rs in by_prompt.values()]
    p.check(0 < sum(marks) < len(marks) and len(marks) == 9, marks)
    key = f"eval/all/pass_at_{EVAL_N}"
    p.assert_stated(key, per_seq_observations(m[key], marks, PROMPT_SHARES, PROMPT_ENDS),
                    levels=DRIVER, tokens=("per_seq",))
    c_marks = [mk for mk, u in zip(marks, by_prompt) if uids.index(u) >= 4 * EVAL_N]
    p.check(len(c_marks) == 5 and 0 < sum(c_marks) < 5, c_marks)
    p.assert_stated(f"eval/c/pass_at_{EVAL_N}", per_seq_observations(m[f"eval/c/pass_at_{EVAL_N}"], c_marks,
                                                                      ((2, 1), (1, 1)), ((3, 1), (1,))),
                    levels=DRIVER, tokens=("per_seq",))
    best = [max(rs) for rs in by_prompt.values()]
    p.check(not close(m[key], sum(best) / len(best)), "pass@n equals the mean best reward on this batch")
