"""Fingerprints of slime v0.3.1's logged metrics (issue 33 item 1), run by slime's own files vendored from the tag
(tests/data/frameworks/slime/, loaded by tests/_support/proofs_slime.py, which names every stand-in and why).

One rollout of uneven samples (prompt and response lengths, loss masks with masked tool tokens, rewards, truncation)
goes through slime's rollout manager (``_convert_samples_to_train_data``, ``_split_train_data_by_dp`` with
``build_dp_schedule``'s dynamic micro-batches: uneven sample counts per micro-batch and per rank) to two simulated
data-parallel ranks, each of which runs what ``MegatronTrainRayActor.train_actor`` runs
(slime/backends/megatron_utils/actor.py@v0.3.1:419-520): ``compute_advantages_and_returns`` (loss.py),
``log_rollout_data`` (data.py: the rollout/<field> metrics, gathered to rank 0), and ``train`` (model.py: two
optimizer steps per rollout, each ``train_one_step`` running ``get_batch`` and ``loss_function`` per micro-batch
and ``reduce_train_step_metrics``, then the row model.py@v0.3.1:870-890 logs). The rollout manager's own metrics
(``_log_rollout_data``, ``_log_eval_rollout_data``, rollout.py) and the perf timers (``log_perf_data`` ->
``train_metric_utils.log_perf_data_raw``) run on what they are given.

What the logged values are compared with is what slime's code was GIVEN: the samples, the per-token log-probs of
the old policy and the reference, the logits' per-token log-probs and entropies (the model is a table of logits:
log_softmax of its row, the quantity slime's ``calculate_log_probs_and_entropy`` computes per token), the advantages
``compute_advantages_and_returns`` stored for the loss, the timers' seconds, the optimizer's grad norms and the
scheduler's lr; each logged value is fingerprinted against every candidate reduction of those per-token values, on
a layout where the candidates differ, and must be the reduction mappings/slime.yaml states and no other."""
from __future__ import annotations

import math
import random

import pytest

pytest.importorskip("torch")
pytest.importorskip("numpy")
pytest.importorskip("tqdm", reason="slime's model.py imports tqdm (its micro-batch progress bar)")

import torch  # noqa: E402

from _support import fingerprint as FP  # noqa: E402
from _support import proofs_slime as S  # noqa: E402
from _support.proven import close, proof  # noqa: E402

REL = S.RELEASE
ROLLOUT_ID = 3
V = 7                                         # vocabulary of the bigram model
N_PER_PROMPT, PROMPTS, STEPS = 2, 6, 2        # 12 samples, 2 optimizer steps of 6 rollouts each
TRAIN_LEVELS = ("micro_batches", "processes")  # a train/* row is one optimizer step of micro-batches on 2 ranks

# (prompt length, response length, masked response positions (tool tokens), reward, truncated)
# (prompt length, response length, masked response positions (tool tokens), reward, truncated). With
# --max-tokens-per-gpu 24, build_dp_schedule's first-fit packs the first step's six samples (total lengths 6, 7, 8,
# 20, 20, 20) into bins of 3, 1, 1, 1 samples and the second's (20, 20, 10, 10, 10, 10) into 1, 1, 2, 2; the bins go
# to the ranks round-robin, so the micro-batches differ in samples within a rank, across the ranks and across the
# micro-batch index (weighted and unweighted combinations differ at both levels)
SHAPES = [(2, 4, (), 1.0, False), (2, 5, (3, 4), 0.0, False), (5, 3, (), 1.0, False), (3, 17, (5, 6, 7), 1.0, True),
          (5, 15, (1,), 0.0, False), (8, 12, (), 1.0, True), (4, 16, (2,), 1.0, False),
          (6, 14, (10, 11, 12), 0.0, False), (3, 7, (), 0.0, True), (2, 8, (), 0.0, False), (4, 6, (0, 1), 1.0, False),
          (5, 5, (), 1.0, False)]


def cli(per_token: bool, *extra: str) -> list[str]:
    return ["--rollout-batch-size", str(PROMPTS), "--n-samples-per-prompt", str(N_PER_PROMPT),
            "--num-steps-per-rollout", str(STEPS), "--use-dynamic-batch-size", "--max-tokens-per-gpu", "24",
            "--use-wandb", "--entropy-coef", "0.01", "--use-kl-loss", "--kl-loss-coef", "0.1",
            *(["--calculate-per-token-loss"] if per_token else []), *extra]


def samples(seed: int = 0) -> list:
    rng = random.Random(seed)
    Sample = S.slime().Sample
    out = []
    for i, (plen, rlen, masked, reward, truncated) in enumerate(SHAPES):
        out.append(Sample(
            group_index=i // N_PER_PROMPT, index=i, prompt="p", response="r" * rlen,
            tokens=[rng.randrange(1, V) for _ in range(plen + rlen)], response_length=rlen, reward=reward,
            loss_mask=[0 if j in masked else 1 for j in range(rlen)],
            status=Sample.Status.TRUNCATED if truncated else Sample.Status.COMPLETED))
    return out


TABLE = torch.Generator().manual_seed(7)
LOGITS = torch.randn(V, V, generator=TABLE) * 1.5             # the model: logits row per input token


def model_log_probs(tokens: torch.Tensor, rlen: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The model's per-token log-prob of each response token and the entropy at its position (the logits of the
    token before it)."""
    prev = tokens[len(tokens) - rlen - 1: len(tokens) - 1]
    logp = torch.log_softmax(LOGITS[prev].double(), dim=-1)
    return logp.gather(-1, tokens[len(tokens) - rlen:].long().unsqueeze(-1)).squeeze(-1), -(logp.exp() * logp).sum(-1)


def forward(seed: int, critic: bool = False):
    """The fields the actor's forward passes store per sample (actor.py@v0.3.1 compute_log_prob): the old policy's
    log-probs (the model's own, shifted per token so the ratio crosses the clip range), the reference's; a critic's
    values."""
    def fields(rank: int, rollout_data: dict) -> dict:
        rng = random.Random(seed * 10 + rank)
        out: dict = {"log_probs": [], "ref_log_probs": []}
        if critic:
            out["values"] = []
        for tokens, rlen in zip(rollout_data["tokens"], rollout_data["response_lengths"], strict=True):
            logp, _ = model_log_probs(tokens, rlen)
            out["log_probs"].append((logp + torch.tensor([rng.uniform(-0.45, 0.45) for _ in range(rlen)],
                                                         dtype=torch.double)).float())
            out["ref_log_probs"].append((logp + torch.tensor([rng.uniform(-0.8, 0.3) for _ in range(rlen)],
                                                             dtype=torch.double)).float())
            if critic:
                out["values"].append(torch.tensor([rng.uniform(-1.0, 1.0) for _ in range(rlen)]))
        return out
    return fields


def lr_of(samples_seen: int) -> float:
    return 1e-6 * (1.0 + samples_seen / 7.0)


GRAD_NORMS = [1.75, 0.625]


def run(per_token: bool, *extra: str, seed: int = 0, critic: bool = False) -> tuple:
    args = S.default_args(cli(per_token, *extra))
    r = S.run_rollout_and_train(args, samples(seed), ROLLOUT_ID, LOGITS, forward(seed, critic), GRAD_NORMS, lr_of)
    return args, r


# ------------------------------------------------------------------------------------------- per-token values
def per_token(args, rd: dict) -> list[dict[str, list[float]]]:
    """Every sample of one rank's data: its valid (loss-masked) tokens' values of each quantity the loss function
    reduces, from what it was given (old/ref log-probs, advantages) and the model's per-token log-probs."""
    e, eh = args.eps_clip, args.eps_clip_high
    out = []
    for i, (tokens, rlen) in enumerate(zip(rd["tokens"], rd["response_lengths"], strict=True)):
        logp, ent = model_log_probs(tokens, rlen)
        old, ref = rd["log_probs"][i].double(), rd["ref_log_probs"][i].double()
        adv = rd["advantages"][i].double()
        ratio = (logp - old).exp()
        l1, l2 = -ratio * adv, -ratio.clamp(1 - e, 1 + eh) * adv
        kl_ref = {"k1": logp - ref, "k2": (logp - ref) ** 2 / 2.0,
                  "k3": (ref - logp).exp() - 1 - (ref - logp)}[args.kl_loss_type]
        pg = torch.maximum(l1, l2)
        mask = rd["loss_masks"][i].bool()
        q = {"pg_loss": pg, "pg_clipfrac": (l2 > l1).double(), "ppo_kl": old - logp, "entropy_loss": ent,
             "kl_loss": kl_ref, "loss": pg - args.entropy_coef * ent + args.kl_loss_coef * kl_ref,
             "advantages": adv, "returns": rd["returns"][i].double(), "log_probs": old}
        if "values" in rd:
            q["values"] = rd["values"][i].double()
        out.append({k: [float(x) for x in v[mask]] for k, v in q.items()})
    return out


def train_steps(args, r, key: str, step: int) -> list:
    """The optimizer step's batch, fingerprint-nested: [[rank][micro-batch] = sequences of valid tokens]."""
    ranks = []
    for rd in r.rank_data:
        toks = per_token(args, rd)
        start = sum(rd["num_microbatches"][:step])
        micros = rd["micro_batch_indices"][start:start + rd["num_microbatches"][step]]
        ranks.append([[toks[i][key] for i in mb] for mb in micros])
    return [[ranks]]


def signed(p, key: str, observed: list, levels: tuple[str, ...]) -> None:
    """assert_stated on the observations, then: each logged value is the stated reduction's value with its sign
    (not its negation: a transform that flips the sign could hide behind a symmetric batch)."""
    found = p.assert_stated(key, observed, levels=levels)
    for logged, steps in observed:
        value = FP.value_of(steps, found)
        p.check(close(logged, value, 1e-5) and (abs(value) < 1e-6 or not close(logged, -value, 1e-3)),
                f"{key}: {logged} is the stated reduction's {value}, sign included")


def train_rows(r) -> list[dict]:
    return [row for row in r.rows if "train/step" in row]


def rollout_row(r) -> dict:
    (row,) = [row for row in r.rows if "rollout/raw_reward" in row]
    return row


TRAIN_KEYS = ("loss", "pg_loss", "entropy_loss", "pg_clipfrac", "ppo_kl", "kl_loss")


def _train_proof(p, per_token_loss: bool, kl: str) -> None:
    args, r = run(per_token_loss, "--kl-loss-type", kl)
    rows = train_rows(r)
    p.check(len(rows) == STEPS, f"one train row per optimizer step: {len(rows)}")
    for rd in r.rank_data:                                # the layout tells the reductions apart
        p.check(len({len(mb) for mb in rd["micro_batch_indices"]}) > 1, "uneven samples per micro-batch")
    p.check(len(r.rank_data[0]["tokens"]) != len(r.rank_data[1]["tokens"]), "uneven samples per rank")
    mbs = [rd["micro_batch_indices"] for rd in r.rank_data]
    p.check(len({len(mbs[0][u]) + len(mbs[1][u]) for u in range(2)}) > 1, "uneven samples per micro-batch index")
    for key in TRAIN_KEYS:                              # both optimizer steps' rows, fingerprinted together
        observed = [(row[f"train/{key}"], train_steps(args, r, key, step)) for step, row in enumerate(rows)]
        signed(p, f"train/{key}", observed, TRAIN_LEVELS)
    for step, row in enumerate(rows):
        p.check(row["train/entropy_loss"] > 0, "train/entropy_loss is the entropy itself, positive")
        p.check(row["train/grad_norm"] == GRAD_NORMS[step], "the optimizer's grad norm, as it returned it")
        p.assert_stated("train/grad_norm", row["train/grad_norm"], [[[[[[GRAD_NORMS[step]]]]]]], levels=())
        seen = sum(r.schedulers[0].increments[:step + 1])
        p.check(r.schedulers[0].increments[step] == args.global_batch_size, "scheduler stepped by the batch")
        p.assert_stated("train/lr-pg_0", row["train/lr-pg_0"], [[[[[[lr_of(seen)]]]]]], levels=())
        p.check(not close(row["train/lr-pg_0"], lr_of(seen - args.global_batch_size), 1e-9),
                "lr read after the scheduler's step, not before")
        p.assert_stated("train/step", row["train/step"], [[[[[[float(ROLLOUT_ID * STEPS + step)]]]]]], levels=())


@proof("slime", trainer="rl", release=REL,
       config={"calculate_per_token_loss": False, "kl_loss_type": "k1", "use_kl_loss": True, "entropy_coef": 0.01,
               "kl_loss_coef": 0.1, "n_samples_per_prompt": N_PER_PROMPT, "rollout_batch_size": PROMPTS})
def test_slime_train_step_per_rollout_mean(p):
    """The default (per-rollout mean): train/* are each rollout's masked token mean, summed over micro-batches and
    ranks and divided by the step's rollouts (seq_mean_token_mean, pooled)."""
    _train_proof(p, False, "k1")


@proof("slime", trainer="rl", release=REL,
       config={"calculate_per_token_loss": True, "kl_loss_type": "k3", "use_kl_loss": True, "entropy_coef": 0.01,
               "kl_loss_coef": 0.1, "n_samples_per_prompt": N_PER_PROMPT, "rollout_batch_size": PROMPTS})
def test_slime_train_step_per_token(p):
    """--calculate-per-token-loss: train/* are the masked token sums over micro-batches and ranks divided by the
    step's loss-mask tokens (token_mean, pooled); the k3 estimator's kl_loss."""
    _train_proof(p, True, "k3")


# ------------------------------------------------------------------------------------------- rollout/<field>
PER_SAMPLE = ("response_lengths", "total_lengths", "truncated")
PER_ROLLOUT = ("advantages", "returns", "values")


def rank_samples(r, key: str) -> list[list[list[float]]]:
    """Each rank's share of a per-sample field, as [rank][one micro-batch][one-element sequences]. raw_reward is
    handed to every rank whole (rollout.py@v0.3.1:882-886 copies it whole; data.py's process_rollout_data splits
    only total_lengths): each rank's share is the samples of its partition (sample_indices)."""
    out = []
    for rd in r.rank_data:
        if key == "raw_reward":
            values = [r.train_data["raw_reward"][i] for i in rd["sample_indices"]]
        else:
            values = rd[key]
        out.append([[[float(v)] for v in values]])
    return out


@proof("slime", trainer="rl", release=REL,
       config={"calculate_per_token_loss": False, "advantage_estimator": "ppo", "n_samples_per_prompt": N_PER_PROMPT,
               "rollout_batch_size": PROMPTS})
def test_slime_rollout_batch_fields(p):
    """rollout/<field> of the training batch (data.py log_rollout_data -> gather_log_data): per-sample fields as
    (sum, count) per rank, Σsum / Σcount on rank 0 (pooled over the ranks' uneven shares); advantages, returns and
    a critic's values as each rollout's masked token mean, summed and divided by the rollout's rollouts (PPO with
    GAE and a KL penalty, so they vary along a response)."""
    args, r = run(False, "--advantage-estimator", "ppo", "--kl-coef", "0.05", seed=1, critic=True)
    row = rollout_row(r)
    shares = [len(rd["response_lengths"]) for rd in r.rank_data]
    p.check(shares[0] != shares[1], f"uneven shares per rank: {shares}")
    p.check(all(rd["raw_reward"] == r.train_data["raw_reward"] for rd in r.rank_data), "raw_reward reaches every "
            "rank whole")
    for key in ("raw_reward", *PER_SAMPLE):
        steps = [[rank_samples(r, key)]]
        p.assert_stated(f"rollout/{key}", row[f"rollout/{key}"], steps, levels=("processes",))
    p.check(close(row["rollout/response_lengths"], sum(s[1] for s in SHAPES) / len(SHAPES)),
            "rollout/response_lengths counts every response token, tool tokens included")
    for key in PER_ROLLOUT:
        ranks = [[[toks[key] for toks in per_token(args, rd)]] for rd in r.rank_data]
        for seqs in ranks:
            p.check(any(len({round(v, 9) for v in seq}) > 1 for seq in seqs[0]), f"{key} varies along a response")
        signed(p, f"rollout/{key}", [(row[f"rollout/{key}"], [[ranks]])], ("processes",))
    p.assert_stated("rollout/step", row["rollout/step"], [[[[[[float(ROLLOUT_ID)]]]]]], levels=())


# ------------------------------------------------------------------------------------------- the rollout manager
def _eval_samples():
    """Evaluation samples of one dataset: 3 prompts x 4 samples (3, 1 and 0 correct), uneven effective lengths."""
    Sample = S.slime().Sample
    rng = random.Random(5)
    out = []
    for i in range(12):
        rlen = 2 + (i * 5) % 9
        masked = rng.randrange(0, 3)
        out.append(Sample(group_index=i // 4, index=i, response="r" * rlen, response_length=rlen,
                          reward=float(i in (0, 1, 3, 5)), loss_mask=[1] * (rlen - masked) + [0] * masked,
                          status=Sample.Status.TRUNCATED if i % 5 == 0 else Sample.Status.COMPLETED))
    return out


def one_population(values) -> list:
    return [[[[[[float(v)] for v in values]]]]]


@proof("slime", trainer="rl", release=REL, config={"n_samples_per_prompt": N_PER_PROMPT,
                                                   "rollout_batch_size": PROMPTS})
def test_slime_rollout_manager_metrics(p):
    """rollout/response_len/mean and rollout/truncated_ratio (compute_metrics_from_samples) and perf/rollout_time
    (compute_perf_metrics_from_samples), as _log_rollout_data logs them for the samples RolloutManager.generate
    hands it (rollout.py@v0.3.1:560-562): over those samples at once; the rollout's seconds as given."""
    s = S.slime()
    args = S.default_args(cli(False))
    smp = samples(2)
    s.wandb.rows.clear()
    with S.running():
        s.rollout["_log_rollout_data"](ROLLOUT_ID, args, smp, {}, 12.5)
    (row,) = s.wandb.rows[-1]
    eff = [sum(x.loss_mask) for x in smp]
    p.check(eff != [x.response_length for x in smp], "tool tokens masked in some responses")
    p.assert_stated("rollout/response_len/mean", row["rollout/response_len/mean"], one_population(eff), levels=())
    p.check(not close(row["rollout/response_len/mean"], sum(x.response_length for x in smp) / len(smp)),
            "effective (loss-masked) lengths, not response_length")
    trunc = [int(x.status == x.Status.TRUNCATED) for x in smp]
    p.assert_stated("rollout/truncated_ratio", row["rollout/truncated_ratio"], one_population(trunc), levels=())
    p.assert_stated("perf/rollout_time", row["perf/rollout_time"], [[[[[[12.5]]]]]], levels=())
    p.check(row["perf/rollout_time"] == 12.5, "the rollout's seconds, unchanged")


@proof("slime", trainer="rl", release=REL, config={"n_samples_per_prompt": N_PER_PROMPT,
                                                   "rollout_batch_size": PROMPTS})
def test_slime_eval_metrics(p):
    """eval/{data_source}, -truncated_ratio, /response_len/mean, -pass@k (_log_eval_rollout_data, --log-passrate,
    4 samples per prompt): over one dataset's evaluation samples; pass@k the mean over prompts of the unbiased
    estimate 1 - C(n-c, k)/C(n, k)."""
    s = S.slime()
    args = S.default_args(cli(False, "--log-passrate", "--n-samples-per-eval-prompt", "4"))
    smp = _eval_samples()
    rewards = [x.reward for x in smp]
    trunc = [int(x.status == x.Status.TRUNCATED) for x in smp]
    data = {"gsm8k": {"rewards": rewards, "truncated": trunc, "samples": smp}}
    s.wandb.rows.clear()
    with S.running():
        s.rollout["_log_eval_rollout_data"](ROLLOUT_ID, args, data)
    (row,) = s.wandb.rows[-1]
    p.assert_stated("eval/gsm8k", row["eval/gsm8k"], one_population(rewards), levels=())
    p.assert_stated("eval/gsm8k-truncated_ratio", row["eval/gsm8k-truncated_ratio"], one_population(trunc),
                    levels=())
    p.assert_stated("eval/gsm8k/response_len/mean", row["eval/gsm8k/response_len/mean"],
                    one_population([sum(x.loss_mask) for x in smp]), levels=())
    n = 4
    for k in (1, 2, 4):
        per_prompt = []
        for g in range(len(smp) // n):
            c = sum(1 for x in rewards[g * n:(g + 1) * n] if x == 1)
            per_prompt.append(1.0 - math.comb(n - c, k) / math.comb(n, k))
        p.check(len(set(per_prompt)) > 1, "prompts of different pass rates")
        p.assert_stated(f"eval/gsm8k-pass@{k}", row[f"eval/gsm8k-pass@{k}"], one_population(per_prompt), levels=())
    p.assert_stated("eval/step", row["eval/step"], [[[[[[float(ROLLOUT_ID)]]]]]], levels=())


# ------------------------------------------------------------------------------------------- perf timers
TIMERS = {"train_wait": 3.5, "train": 10.25, "actor_train": 6.0, "log_probs": 1.5, "ref_log_probs": 1.25,
          "update_weights": 0.75, "data_preprocess": 0.125}


@proof("slime", trainer="rl", release=REL, config={"n_samples_per_prompt": N_PER_PROMPT,
                                                   "rollout_batch_size": PROMPTS})
def test_slime_perf_timers(p):
    """perf/{stage}_time: the Timer's seconds of the rollout step (timer.py's Timer.add, what ``with timer(...)``
    adds when a section ends), and perf/step_time = train_wait + train (train_metric_utils.log_perf_data_raw,
    which data.py's log_perf_data calls on the primary rank; its FLOPs callback is left out: the TFLOPS keys pass
    through)."""
    s = S.slime()
    args = S.default_args(cli(False))
    timer = s.Timer()
    timer.reset()
    for name, secs in TIMERS.items():
        timer.add(name, secs)
    s.wandb.rows.clear()
    with S.running():
        s.train_metric_utils.log_perf_data_raw(rollout_id=ROLLOUT_ID, args=args, is_primary_rank=True,
                                               compute_total_fwd_flops=None)
    (row,) = s.wandb.rows[-1]
    for name, secs in TIMERS.items():
        p.assert_stated(f"perf/{name}_time", row[f"perf/{name}_time"], [[[[[[secs]]]]]], levels=())
        p.check(row[f"perf/{name}_time"] == secs, f"perf/{name}_time: seconds, unchanged")
    total = TIMERS["train_wait"] + TIMERS["train"]
    p.assert_stated("perf/step_time", row["perf/step_time"], [[[[[[total]]]]]], levels=())
    p.check(not close(row["perf/step_time"], TIMERS["train"]) and row["perf/step_time"] == total,
            "perf/step_time is train_wait + train")
    p.check(timer.log_dict() == {}, "the timers are reset after each log")


@proof("slime", trainer="rl", release=REL,
       config={"calculate_per_token_loss": False, "kl_loss_type": "k2", "use_kl_loss": True, "entropy_coef": 0.01,
               "kl_loss_coef": 0.1, "n_samples_per_prompt": N_PER_PROMPT, "rollout_batch_size": PROMPTS})
def test_slime_train_step_k2(p):
    """--kl-loss-type k2: train/kl_loss is the k2 estimate (log-ratio squared over 2), reduced like every train/*
    value (and the other keys again, with the k2 term in train/loss)."""
    _train_proof(p, False, "k2")
