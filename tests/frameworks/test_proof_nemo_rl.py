"""Fingerprint proofs of NeMo-RL v0.7.0's GRPO metrics (issue 33 item 1), run by the tag's own vendored files
(tests/_support/proofs_nemo_rl.py says what is loaded, what is compiled from a file's text, and every stand-in).

The training step (:func:`train_step`) is NeMo-RL's own composition, end to end:

* ``Policy.train`` (lm_policy.py:702-805, from the file's text): ``_shard_for_train`` -> the real
  ``BatchedDataDict.shard_by_batch_size`` over 2 data-parallel ranks, one worker per rank (threads), then the merge of
  every worker's ``all_mb_metrics`` lists (:785-790) and ``loss``/``grad_norm`` from rank 0's result (:756-759);
* each worker's ``DTensorPolicyWorkerV2Impl.train`` (dtensor_policy_worker_v2.py:389-572, from the file's text): per
  global batch the real ``process_global_batch`` (automodel/data.py:324-374: the valid sequences and tokens of the
  global batch, all-reduced over the ranks), ``get_microbatch_iterator``, ``automodel_forward_backward``
  (automodel/train.py:430-546: ``forward_with_post_processing_fn`` -> ``model_forward`` -> ``LossPostProcessor`` ->
  ``prepare_loss_input`` (loss/utils.py) -> ``get_next_token_logprobs_from_logits`` (model_utils.py) -> the real
  ``ClippedPGLossFn``; then every metric but *_min/*_max divided by num_global_batches, :520-531), ``lr`` and the
  global counts added per micro-batch (:509-521), one optimizer step per global batch, the scheduler step after all
  of them (:545-548), ``aggregate_training_statistics`` (train.py:1083-1122);
* grpo_train's own statements (grpo.py:2793-2860, from the file's text): the step's metrics dict
  (``train_results['loss']`` overwritten by the micro-batch list), and the loop that ``np.sum``s every list but lr,
  wd, reward, global_valid_* and mean_prompt_length (``np.mean``) and takes the probs_ratio extrema.

The model is the test's: a learnable table of next-token logits per token id (:class:`TableLM`, its gradients
averaged over the ranks at every backward as FSDP does), so every sequence's log-probs are the real code's
``log_softmax`` of its own logits, and change after each global batch's optimizer step. The proofs record what
``ClippedPGLossFn`` was given per micro-batch (``Recorded``: the current log-probs the code computed, the batch's
prev/generation/reference log-probs, advantages, masks) and fingerprint the logged value against every candidate
reduction of the per-token quantity over that batch (16 sequences of uneven prompt and response lengths, one with
sample_mask 0; 2 global batches of different token counts; 2 micro-batches per rank; 2 ranks).

The rest runs the same way: ``run_multi_turn_rollout`` and ``run_async_multi_turn_rollout`` (rollouts.py) with the
test's inference engine and environment (:class:`Generation`, :class:`Env`: planned response, observation and
turn counts), NeMo-RL's ``Timer`` on the test's clock with grpo_train's own end-of-step statements and
``print_performance_metrics`` (timings, throughputs, MFU and the console blocks, read back by trackbridge's console
reader), and grpo.py's ``validate`` over uneven validation batches. Driver-side values (computed once over the whole
batch) are fingerprinted against several layouts of the same per-sample values (:func:`seq_observations`).
"""
from __future__ import annotations

import math
import random
import types

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("pydantic")
pytest.importorskip("numpy")

import numpy as np  # noqa: E402

from _support import fingerprint as FP  # noqa: E402
from _support import proofs_nemo_rl as P  # noqa: E402
from _support.framework_code import current_rank  # noqa: E402
from _support.proven import close, proof  # noqa: E402

RELEASE = "0.7.0"
PROMPTS, GENERATIONS, GBS, MBS, WORLD = 4, 4, 8, 2, 2          # 16 sequences: 2 global batches, 2 micro-batches
KL_COEF = 0.05
BASE = {"grpo.num_prompts_per_step": PROMPTS, "grpo.num_generations_per_prompt": GENERATIONS,
        "policy.train_global_batch_size": GBS, "policy.train_micro_batch_size": MBS,
        "loss_fn.reference_policy_kl_penalty": KL_COEF, "loss_fn.reference_policy_kl_type": "k3",
        "loss_fn.token_level_loss": True, "grpo.max_rollout_turns": 1, "cluster.num_nodes": 1,
        "cluster.gpus_per_node": WORLD}
SEQ_LEVEL = {**BASE, "loss_fn.token_level_loss": False}
GRAD_SEEDS = (0, 1, 2, 3)
LOSS_LEVELS = ("micro_batches", "mini_batches", "processes")


# ------------------------------------------------------------------------------------------------ the step
class TableLM(torch.nn.Module):
    """The test's model: next-token logits looked up per input token id (every position of every sequence has its
    own id, so its own row); what ``model_forward`` calls with input_ids, attention_mask, position_ids."""

    def __init__(self, vocab: int, seed: int):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.table = torch.nn.Parameter(torch.randn(vocab, vocab, generator=g) * 0.6)
        # FSDP averages every backward's gradients over the data-parallel ranks (the worker multiplies the loss by
        # dp_size to make that a sum, automodel/train.py:536-541): the same all-reduce here, at the barrier
        self.table.register_hook(self._all_reduce_mean)

    @staticmethod
    def _all_reduce_mean(grad):
        out = grad.clone()
        P.nemo().torch.distributed.all_reduce(out)
        return out / WORLD

    def forward(self, input_ids, attention_mask=None, position_ids=None, use_cache=False):
        return self.table[input_ids]


class CountingSGD(torch.optim.SGD):
    """torch's SGD, counting its steps (which global batch a micro-batch belongs to)."""

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.steps = 0

    def step(self, closure=None):
        out = super().step(closure)
        self.steps += 1
        return out


def recorded_loss_fn(cfg: dict, workers: list):
    """The real ClippedPGLossFn (its config class with the run's loss_fn settings), recording what each call was
    given: the rank, the global batch (its worker's optimizer steps so far), the micro-batch's tensors."""
    N = P.nemo()

    class Recorded(N.losses.ClippedPGLossFn):
        calls: list = []

        def __call__(self, next_token_logprobs, data, global_valid_seqs, global_valid_toks):
            rank = current_rank()[1]
            out = super().__call__(next_token_logprobs, data, global_valid_seqs, global_valid_toks)
            self.calls.append({"rank": rank, "gb": workers[rank].optimizer.steps,
                               "curr": next_token_logprobs.detach().clone(),
                               **{k: data[k].detach().clone() for k in (
                                   "token_mask", "sample_mask", "advantages", "prev_logprobs",
                                   "generation_logprobs", "reference_policy_logprobs", "input_ids")},
                               "metrics": dict(out[1])})
            return out

    Recorded.calls = []
    return Recorded(N.losses.ClippedPGLossConfig(**cfg))


def make_batch(seed: int, n: int, sample_mask_off: tuple[int, ...] = (5,)):
    """The step's training batch as grpo_train builds train_data (grpo.py:2545-2575): input_ids, input_lengths,
    token_mask (the response tokens), sample_mask, advantages, prev/generation/reference log-probs; uneven prompt and
    response lengths, padded."""
    rng = random.Random(seed)
    prompts = [rng.randint(2, 5) for _ in range(n)]
    responses = [rng.choice([2, 3, 4, 5, 6, 7]) for _ in range(n)]
    width = max(p + r for p, r in zip(prompts, responses)) + 1
    ids = torch.arange(n * width).view(n, width)
    token_mask = torch.zeros(n, width)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        token_mask[i, p:p + r] = 1.0

    def table(lo, hi):
        return torch.tensor([[rng.uniform(lo, hi) for _ in range(width)] for _ in range(n)])

    prev = -math.log(n * width) + table(-0.5, 0.5)
    # a group advantage per sequence, plus a per-token part (as a token-level estimator gives): every candidate of a
    # token statistic (pooled, per sequence, per group, max of means ...) differs
    adv = (torch.tensor([[rng.choice([-1.3, -0.4, 0.6, 1.1])] for _ in range(n)]) + table(-0.3, 0.3)) * token_mask
    sample_mask = torch.tensor([0.0 if i in sample_mask_off else 1.0 for i in range(n)])
    return {
        "input_ids": ids, "input_lengths": torch.tensor([p + r for p, r in zip(prompts, responses)]),
        "token_mask": token_mask, "sample_mask": sample_mask, "advantages": adv,
        "prev_logprobs": prev * token_mask, "generation_logprobs": (prev + table(-0.4, 0.4)) * token_mask,
        "reference_policy_logprobs": (prev + table(-0.6, 0.6)) * token_mask,
        "_prompts": prompts, "_responses": responses,
    }, n * width


FLOPS_PER_TOKEN = 3.0e12


def train_step(config: dict, seed: int = 0, steps: int = 1):
    """``steps`` GRPO training steps of NeMo-RL's code (module docstring) on one batch; returns the logged metrics of
    the last step, the recorded loss-function calls of that step, the workers and the batch."""
    N = P.nemo()
    n = config["grpo.num_prompts_per_step"] * config["grpo.num_generations_per_prompt"]
    gbs, mbs = config["policy.train_global_batch_size"], config["policy.train_micro_batch_size"]
    raw, vocab = make_batch(seed, n)
    cfg = {"train_global_batch_size": gbs, "train_micro_batch_size": mbs, "dynamic_batching": {"enabled": False},
           "sequence_packing": {"enabled": False}, "dtensor_cfg": {}}
    Worker = P.worker_class()
    workers = []
    for r in range(WORLD):
        w = Worker()
        w.model = TableLM(vocab, seed=100 + seed)                   # the same initial weights on every rank
        w.optimizer = CountingSGD(w.model.parameters(), lr=0.3)
        # a scheduler whose rate changes at every step: which rate the step logs is visible
        w.scheduler = torch.optim.lr_scheduler.LambdaLR(w.optimizer, lambda s: 1.0 / (1 + s))
        w.__dict__.update(cfg=cfg, dp_size=WORLD, cp_size=1, dp_mesh=types.SimpleNamespace(get_group=lambda: None),
                          cp_mesh=None, tp_mesh=None, device_mesh=None, moe_mesh=None, enable_seq_packing=False,
                          sampling_params=None, dtype=torch.float32, autocast_enabled=False, tokenizer=None,
                          _is_reward_model=False, allow_flash_attn_args=True, max_grad_norm=1.0,
                          _update_moe_gate_bias_if_supported=lambda: None)
        workers.append(w)
    policy = P.policy_class()()
    policy.__dict__.update(cfg=cfg, data_parallel_size=WORLD, use_dynamic_batches=False, use_sequence_packing=False,
                           flops_tracker=P.FlopsTracker(FLOPS_PER_TOKEN), worker_group=P.Workers(workers))
    loss_cfg = {k.removeprefix("loss_fn."): v for k, v in config.items() if k.startswith("loss_fn.")}
    data = N.BatchedDataDict({k: v for k, v in raw.items() if not k.startswith("_")})
    lrs = []
    P.GRAD_NORMS.clear()
    for _ in range(steps):
        P.GRAD_NORMS.clear()
        loss_fn = recorded_loss_fn(loss_cfg, workers)
        lrs.append([w.optimizer.param_groups[0]["lr"] for w in workers])
        train_results = policy.train(data, loss_fn)
    lrs.append([w.optimizer.param_groups[0]["lr"] for w in workers])
    rewards = torch.tensor([round(random.Random(seed + 7 * i).uniform(-1.0, 2.0), 3) for i in range(n)])
    ns = P.grpo_statements("flat_advantages = train_data", "for k, v in metrics.items()")({
        "np": np, "torch": torch, "metrics": {}, "train_results": train_results,
        "train_data": {"advantages": raw["advantages"]}, "flat_messages": {"token_loss_mask": raw["token_mask"]},
        "memory_tracker": types.SimpleNamespace(snapshot_start_of_stage=lambda *a: None),
        "rewards": rewards, "repeated_batch": {"length": torch.tensor(raw["_prompts"]), "total_reward": rewards},
        "input_lengths": raw["input_lengths"], "ds_metrics": {}, "gen_step_metrics": {}, "penalty_metrics": {},
        "master_config": types.SimpleNamespace(grpo={"use_dynamic_sampling": False}),
    })
    return types.SimpleNamespace(metrics=ns["metrics"], calls=loss_fn.calls, workers=workers, raw=raw,
                                 grad_norms=list(P.GRAD_NORMS),
                                 train_results=train_results, lrs=lrs, n_gb=n // gbs, rewards=rewards)


_RUNS: dict = {}


def run(config: dict, seed: int = 0, steps: int = 1):
    key = (tuple(sorted(config.items())), seed, steps)
    if key not in _RUNS:
        _RUNS[key] = train_step(config, seed, steps)
    return _RUNS[key]


# ------------------------------------------------------------------------------------------------ per-token values
def token_steps(r, fn) -> list:
    """fingerprint's nesting [step][global batch][rank][micro-batch] -> sequences of fn(call) over each call's valid
    tokens (token_mask[:, 1:] * sample_mask, ClippedPGLossFn's mask; sequences with sample_mask 0 hold none and are
    left out)."""
    minis = []
    for gb in range(r.n_gb):
        ranks = []
        for rank in range(WORLD):
            micro = []
            for c in [c for c in r.calls if c["rank"] == rank and c["gb"] == gb]:
                mask = (c["token_mask"][:, 1:] * c["sample_mask"].unsqueeze(-1)).bool()
                vals = fn(c)
                micro.append([[float(v) for v in vals[i][mask[i]]] for i in range(mask.shape[0]) if mask[i].any()])
            ranks.append(micro)
        minis.append(ranks)
    return [minis]


def shifted(c, k):
    return c[k][:, 1:]


def ref_kl(c):
    """The per-token KL(pi || pi_ref) the loss computes (calculate_kl, k3, with the loss's clamps), by NeMo-RL's own
    per-token function on what the call was given."""
    return P.nemo().utils.calculate_kl(c["curr"], shifted(c, "reference_policy_logprobs"), kl_type="k3",
                                       input_clamp_value=20.0, output_clamp_value=10.0)


def clip_loss(c, eps=0.2):
    ratio = torch.exp(c["curr"] - shifted(c, "prev_logprobs"))
    adv = shifted(c, "advantages")
    return torch.max(-adv * ratio, -adv * ratio.clamp(1 - eps, 1 + eps))


def flat(steps) -> list[float]:
    return [v for mini in steps[0] for rank in mini for micro in rank for seq in micro for v in seq]


def pooled(steps) -> float:
    vals = [v for mini in steps[0] for rank in mini for micro in rank for seq in micro for v in seq]
    return sum(vals) / len(vals)


# ------------------------------------------------------------------------------------------------ the proofs
def test_the_step_ran_as_configured():
    """The layout the proofs rely on: 2 global batches, 2 micro-batches per rank in each, both ranks, uneven tokens."""
    r = run(BASE)
    assert r.n_gb == 2 and len(r.calls) == r.n_gb * WORLD * (GBS // WORLD // MBS)
    assert {(c["rank"], c["gb"]) for c in r.calls} == {(a, b) for a in range(WORLD) for b in range(r.n_gb)}
    counts = [sum(len(s) for rank in mini for micro in rank for s in micro)
              for mini in token_steps(r, lambda c: c["curr"])[0]]
    assert len(set(counts)) == len(counts), counts
    # the policy moved between the global batches (the second's current log-probs are not the initial ones)
    assert not torch.allclose(r.workers[0].model.table, TableLM(r.workers[0].model.table.shape[0], 100).table)


@proof("nemo_rl", trainer="grpo", release=RELEASE, config=BASE)
def test_loss_kl_entropy_gen_kl_are_global_token_means(p):
    """train/loss, train/kl_penalty, train/approx_entropy, train/gen_kl_error: ClippedPGLossFn divides each
    micro-batch's masked sum by the global batch's valid tokens (all ranks), the automodel loop divides by
    num_global_batches, grpo_train np.sums the list: the token mean of each global batch pooled over its
    micro-batches and ranks, averaged over the global batches unweighted."""
    r = run(BASE)
    m = r.metrics
    kl = token_steps(r, ref_kl)
    loss = token_steps(r, lambda c: clip_loss(c) + KL_COEF * ref_kl(c))
    ent = token_steps(r, lambda c: -torch.exp(c["curr"] - shifted(c, "generation_logprobs")) * c["curr"])
    gen = token_steps(r, lambda c: P.nemo().utils.calculate_kl(
        shifted(c, "generation_logprobs"), shifted(c, "prev_logprobs"), kl_type="k3", input_clamp_value=None,
        output_clamp_value=None))
    for key, steps in (("train/loss", loss), ("train/kl_penalty", kl), ("train/approx_entropy", ent),
                       ("train/gen_kl_error", gen)):
        p.assert_stated(key, m[key.removeprefix("train/")], steps, levels=LOSS_LEVELS)
        p.check(not close(m[key.removeprefix("train/")], pooled(steps)), f"{key}: the pooled mean coincides")
    # sign and scale: the KL is divided back by the coefficient, and is the k3 estimator (positive), as is the
    # entropy estimate; the loss carries the coefficient-weighted KL, not the bare one
    p.check(m["kl_penalty"] > 0 and m["approx_entropy"] > 0 and m["gen_kl_error"] > 0, m)
    k3 = token_steps(r, lambda c: torch.exp(shifted(c, "reference_policy_logprobs") - c["curr"])
                     - (shifted(c, "reference_policy_logprobs") - c["curr"]) - 1)
    p.check(all(close(a, b, 1e-5) for a, b in zip(flat(kl), flat(k3))) and len(flat(kl)) == len(flat(k3)) > 0,
            "calculate_kl k3 is exp(ref - pi) - (ref - pi) - 1 on these log-probs")
    p.check(not close(m["kl_penalty"], KL_COEF * pooled(kl)), "kl_penalty is divided back by the coefficient")
    bare = token_steps(r, lambda c: clip_loss(c) + ref_kl(c))
    p.check(not close(m["loss"], pooled(bare)), "loss with the bare KL")
    # the loss logged is the micro-batch list's sum, the same number as the workers' summed losses per global batch
    p.check(close(m["loss"], float(r.train_results["loss"].sum()) / r.n_gb, 1e-5),
            (m["loss"], r.train_results["loss"]))


@proof("nemo_rl", trainer="grpo", release=RELEASE, config=SEQ_LEVEL)
def test_sequence_level_loss_and_kl_are_global_sequence_means(p):
    """loss_fn.token_level_loss false: loss and kl_penalty are the mean over the global batch's valid sequences of
    each sequence's token mean (divided by global_valid_seqs), pooled over micro-batches and ranks, averaged over
    global batches; gen_kl_error and approx_entropy stay token means."""
    r = run(SEQ_LEVEL)
    m = r.metrics
    kl = token_steps(r, ref_kl)
    loss = token_steps(r, lambda c: clip_loss(c) + KL_COEF * ref_kl(c))
    p.assert_stated("train/loss", m["loss"], loss, levels=LOSS_LEVELS)
    p.assert_stated("train/kl_penalty", m["kl_penalty"], kl, levels=LOSS_LEVELS)
    ent = token_steps(r, lambda c: -torch.exp(c["curr"] - shifted(c, "generation_logprobs")) * c["curr"])
    p.assert_stated("train/approx_entropy", m["approx_entropy"], ent, levels=LOSS_LEVELS)
    p.check(m["kl_penalty"] > 0, m["kl_penalty"])


def one_value(v: float) -> list:
    return [[[[[[float(v)]]]]]]


@proof("nemo_rl", trainer="grpo", release=RELEASE, config=BASE)
def test_grad_norm_is_the_last_global_batchs(p):
    """train/grad_norm: the worker overwrites grad_norm at every global batch's optimizer step and returns the last
    (dtensor_policy_worker_v2.py:523-541, aggregate_training_statistics), Policy.train takes rank 0's (lm_policy.py:
    758), grpo_train np.sums the 0-d array: the last optimizer step's norm, as it is."""
    observed, norms = [], []
    for seed in GRAD_SEEDS:
        r = run(BASE, seed=seed)
        by_rank = {rank: [g for k, g in r.grad_norms if k == rank] for rank in range(WORLD)}
        p.check(all(len(v) == r.n_gb for v in by_rank.values()), r.grad_norms)
        p.check(all(close(a, b, 1e-5) for a, b in zip(by_rank[0], by_rank[1])), "the ranks' norms differ")
        p.check(r.metrics["grad_norm"] > 0 and not close(r.metrics["grad_norm"], sum(by_rank[0])), r.metrics)
        observed.append((r.metrics["grad_norm"], [[[[[[g]]]] for g in by_rank[0]]]))   # [step][gb][rank 0][1]
        norms.append(by_rank[0])
    # the last norm is the larger in some runs and the smaller in others (last is neither max nor min)
    p.check({n[0] < n[-1] for n in norms} == {True, False}, norms)
    p.assert_stated("train/grad_norm", observed, levels=())


@proof("nemo_rl", trainer="grpo", release=RELEASE, config=BASE)
def test_lr_is_the_rate_the_steps_optimizer_steps_used(p):
    """train/lr: optimizer.param_groups[0]['lr'] read with every micro-batch's metrics and np.mean'ed; the scheduler
    steps once after all global batches (dtensor_policy_worker_v2.py:545-548), so the value is the rate this step
    trained with (second step of a 1/(1+s) schedule: 0.3 / 2), not the rate after the scheduler's step."""
    r = run(BASE, steps=2)
    used, after = r.lrs[-2][0], r.lrs[-1][0]
    p.check(not close(used, after) and all(close(x, used) for x in r.lrs[-2]), r.lrs)
    p.assert_stated("train/lr", r.metrics["lr"], one_value(used), levels=())
    p.check(close(r.metrics["lr"], used) and not close(r.metrics["lr"], r.lrs[0][0]), (r.metrics["lr"], r.lrs))
    _, res = p.entry("train/lr")
    p.check(res.fields["snapshot"] == "before_scheduler_step", res.fields)


@proof("nemo_rl", trainer="grpo", release=RELEASE, config=BASE)
def test_global_valid_toks_is_the_mean_over_global_batches_of_their_token_counts(p):
    """train/global_valid_toks: process_global_batch's all-reduced count of the global batch's loss-masked tokens
    (automodel/data.py:355-364), repeated with every micro-batch and np.mean'ed by grpo_train: with two global
    batches of different sizes, the mean of their counts (not the step's total)."""
    r = run(BASE)
    counts = [sum(len(s) for rank in mini for micro in rank for s in micro)
              for mini in token_steps(r, lambda c: c["curr"])[0]]
    p.check(len(set(counts)) == len(counts), counts)
    p.assert_stated("train/global_valid_toks", r.metrics["global_valid_toks"],
                    [[[[[[float(n)]]]] for n in counts]], levels=())
    p.check(not close(r.metrics["global_valid_toks"], sum(counts)), "global_valid_toks is the step's total")


# ------------------------------------------------------------------------------------------------ driver metrics
DRIVER = ("micro_batches", "processes")      # the levels a metric over the whole batch could have been split in
SHARES_16 = ((3, 1, 3), (2, 4, 1, 2))
SHARES_ENDS = ((6, 1, 1), (1, 1, 6))


def layout(values: list, shares: tuple) -> list:
    """Values cut into uneven groups [rank][group][item]: a driver metric is computed once over the whole batch,
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


def seq_observations(logged: float, seqs: list[list[float]]) -> list:
    """The one logged value against several layouts of the same sequences (as given, reversed, sorted up and down,
    cut into different uneven groups, each sequence's tokens reversed): the whole batch's reduction is the same in
    every layout, a selection or an unweighted mean of groups is not."""
    up, down = sorted(seqs), sorted(seqs, reverse=True)
    backwards = [list(reversed(s)) for s in seqs]     # each sequence's tokens in the other order (its first differs)
    return [(logged, [[layout(order, cut)]]) for order, cut in (
        (list(seqs), SHARES_16), (list(reversed(seqs)), SHARES_16), (up, SHARES_16), (down, SHARES_16),
        (up, SHARES_ENDS), (down, SHARES_ENDS), (backwards, SHARES_16), (sorted(backwards), SHARES_ENDS))]


@proof("nemo_rl", trainer="grpo", release=RELEASE, config=BASE)
def test_reward_and_prompt_length_are_means_over_the_steps_samples(p):
    """train/reward and train/mean_prompt_length: grpo_train np.means the step's per-sample total_reward and
    repeated_batch['length'] (grpo.py:2806-2807, 2846-2856); train/total_num_tokens np.sums input_lengths
    (:2808, :2857-2858): the step's total of prompt + response tokens, as it is."""
    r = run(BASE)
    m = r.metrics
    rewards = [[float(v)] for v in r.rewards]
    p.check(len({v[0] for v in rewards}) > 8, rewards)
    p.assert_stated("train/reward", seq_observations(m["reward"], rewards), levels=DRIVER)
    prompts = [[float(v)] for v in r.raw["_prompts"]]
    p.assert_stated("train/mean_prompt_length", seq_observations(m["mean_prompt_length"], prompts), levels=DRIVER)
    total = float(r.raw["input_lengths"].sum())
    p.check(total == sum(a + b for a, b in zip(r.raw["_prompts"], r.raw["_responses"])), total)
    p.assert_stated("train/total_num_tokens", m["total_num_tokens"], one_value(total), levels=())
    p.check(not close(m["total_num_tokens"], total / len(prompts)), "total_num_tokens is a mean")


@proof("nemo_rl", trainer="grpo", release=RELEASE, config=BASE)
def test_advantage_stats_are_over_every_response_token(p):
    """train/advantages/mean, max, min: torch.mean/max/min of the advantages at token_loss_mask's tokens
    (torch.masked_select, grpo.py:2793-2818) over the whole step's batch, every sample (sample_mask is not applied),
    not per sequence; grpo_train leaves the floats as they are (the aggregation loop skips them)."""
    r = run(BASE)
    mask = r.raw["token_mask"].bool()
    seqs = [[float(v) for v in row[mrow]] for row, mrow in zip(r.raw["advantages"], mask)]
    p.check(len({len(s) for s in seqs}) > 3 and len({v for s in seqs for v in s}) > 30, seqs)
    for stat in ("mean", "max", "min"):
        key = f"advantages/{stat}"
        p.assert_stated(f"train/{key}", seq_observations(r.metrics[key], seqs), levels=DRIVER,
                        stats=(stat,))
    seq_mean = sum(sum(s) / len(s) for s in seqs) / len(seqs)
    p.check(not close(r.metrics["advantages/mean"], seq_mean), "advantages/mean is a mean of sequence means")


# ------------------------------------------------------------------------------------------------ rollout metrics
MULTI = {**BASE, "grpo.max_rollout_turns": 3, "policy.max_total_sequence_length": 64}


class Tokenizer:
    """The tokenizer run_multi_turn_rollout calls: one token per word of an environment observation, one word per
    generated token when decoding."""

    pad_token_id = 0

    def __call__(self, text, return_tensors="pt", add_special_tokens=False):
        return types.SimpleNamespace(input_ids=torch.tensor([[7] * len(text.split())], dtype=torch.int64))

    def batch_decode(self, ids, skip_special_tokens=True):
        return [" ".join(["tok"] * len(x)) for x in ids]


class Generation:
    """The inference engine's generate (vLLM's output spec: output_ids, generation_lengths,
    unpadded_sequence_lengths, logprobs, truncated): each sample (its prompt's first token is 100 + its index) gets
    the planned number of tokens at each of its turns; records what it generated."""

    def __init__(self, plan):
        self.plan, self.made = plan, {}

    def generate(self, data, greedy=False):
        ids, lens = data["input_ids"], data["input_lengths"]
        made = []
        for row, n in zip(ids, lens):
            i = int(row[0]) - 100
            k = len(self.made.setdefault(i, []))
            made.append(self.plan["gen"][i][k])
            self.made[i].append(made[-1])
        width = int(lens.max()) + max(made)
        out = torch.zeros(len(made), width, dtype=torch.int64)
        for b, (row, n, g) in enumerate(zip(ids, lens, made)):
            out[b, :n] = row[:n]
            out[b, n:n + g] = 5
        return {"output_ids": out, "generation_lengths": torch.tensor(made),
                "unpadded_sequence_lengths": lens + torch.tensor(made), "logprobs": torch.zeros(out.shape),
                "truncated": torch.tensor([bool(self.plan["cut"][int(r[0]) - 100]) and g > 0
                                           for r, g in zip(ids, made)])}


class Resolved:
    """A Ray future that is already resolved (``ray.get`` returns its value); hashable, as rollouts.py keys by it."""

    def __init__(self, value):
        self.value = value


class Env:
    """The environment actor (EnvironmentInterface.step through ``.remote``): an observation of the planned number of
    words, reward 1 per turn for odd samples (or the plan's rewards), done after the sample's planned turns; records
    what it returned."""

    def __init__(self, plan):
        self.plan, self.obs, self.step = plan, {}, self          # self.step.remote(...) is the call

    def remote(self, messages, env_info):
        out, done, rewards = [], [], []
        for log in messages:
            i = int(log[0]["content"].split()[-1])
            k = len(self.obs.setdefault(i, []))
            self.obs[i].append(self.plan["env"][i][k])
            out.append({"role": "environment", "content": " ".join(["obs"] * self.plan["env"][i][k])})
            done.append(k + 1 >= self.plan["turns"][i])
            rewards.append(self.plan["reward"][i][k] if "reward" in self.plan else float(i % 2))
        return Resolved((out, [None] * len(out), None, torch.tensor(rewards), torch.tensor(done), None))


def rollout(seed: int = 0, n: int = PROMPTS * GENERATIONS):
    """run_multi_turn_rollout of NeMo-RL's code on n prompts with the planned turns, generated and observation
    lengths; (its metrics, the batch it returned, what the engine generated, what the environment returned)."""
    N = P.nemo()
    rng = random.Random(50 + seed)
    # one sample runs into the turn limit (planned 4, stopped at 3): the maximum is one sample's, not a tie
    plan = {"turns": [4 if i == 9 else rng.choice([1, 2]) for i in range(n)],
            "gen": [[rng.randint(1, 9) for _ in range(4)] for _ in range(n)],
            "env": [[rng.randint(0, 4) for _ in range(4)] for _ in range(n)],
            "cut": [rng.random() < 0.3 for _ in range(n)], "prompt": [rng.randint(2, 6) for _ in range(n)]}
    logs = [[{"role": "user", "content": f"sample {i}",
              "token_ids": torch.tensor([100 + i] + [3] * (plan["prompt"][i] - 1))}] for i in range(n)]
    batch = N.BatchedDataDict({"message_log": logs, "task_name": ["math"] * n, "extra_env_info": [None] * n})
    gen, env = Generation(plan), Env(plan)
    out, metrics = N.rollouts.run_multi_turn_rollout(gen, batch, Tokenizer(), {"math": env},
                                                     max_seq_len=MULTI["policy.max_total_sequence_length"],
                                                     max_rollout_turns=MULTI["grpo.max_rollout_turns"])
    return metrics, out, gen.made, env.obs, plan


@proof("nemo_rl", trainer="grpo", release=RELEASE, config=MULTI)
def test_rollout_lengths_turns_and_truncation_are_means_over_samples(p):
    """run_multi_turn_rollout (rollouts.py:574-829), logged as it returns them (grpo.py:2389-2411):
    mean/max_gen_tokens_per_sample are each sample's generated tokens summed over its turns (mean, max over
    samples); mean_total_tokens_per_sample adds the environment observation tokens and NOT the prompt;
    avg/max_turns_per_sample the turns each sample ran; truncation_rate the share of samples whose generation was
    cut (the engine's ``truncated``) or whose observation overflowed the sequence limit."""
    m, out, made, obs, plan = rollout()
    n = len(plan["turns"])
    gen = [[float(sum(made[i]))] for i in range(n)]
    env = [float(sum(obs.get(i, []))) for i in range(n)]
    turns = [[float(len(obs[i]))] for i in range(n)]
    p.check(len({t[0] for t in turns}) == 3 and max(t[0] for t in turns) == MULTI["grpo.max_rollout_turns"], turns)
    p.check(sum(env) > 0, "no observation tokens")
    p.assert_stated("train/mean_gen_tokens_per_sample", seq_observations(m["mean_gen_tokens_per_sample"], gen),
                    levels=DRIVER)
    p.assert_stated("train/max_gen_tokens_per_sample", seq_observations(m["max_gen_tokens_per_sample"], gen),
                    levels=DRIVER, stats=("max",))
    total = [[g[0] + e] for g, e in zip(gen, env)]
    p.assert_stated("train/mean_total_tokens_per_sample", seq_observations(m["mean_total_tokens_per_sample"], total),
                    levels=DRIVER)
    with_prompt = sum(t[0] + plan["prompt"][i] for i, t in enumerate(total)) / n
    p.check(not close(m["mean_total_tokens_per_sample"], with_prompt), "the prompt tokens are counted")
    p.assert_stated("train/avg_turns_per_sample", seq_observations(m["avg_turns_per_sample"], turns), levels=DRIVER)
    p.assert_stated("train/max_turns_per_sample", seq_observations(m["max_turns_per_sample"], turns), levels=DRIVER,
                    stats=("max",))
    cut = [[float(bool(v))] for v in out["truncated"]]
    p.check(0 < sum(c[0] for c in cut) < n, cut)
    p.assert_stated("train/truncation_rate", seq_observations(m["truncation_rate"], cut), levels=DRIVER)
    p.check(0 <= m["truncation_rate"] <= 1, m["truncation_rate"])


# ------------------------------------------------------------------------------------------------ KL estimators
K1 = {**BASE, "loss_fn.reference_policy_kl_type": "k1"}
K2 = {**BASE, "loss_fn.reference_policy_kl_type": "k2"}
ON_POLICY_KL = {**BASE, "loss_fn.use_on_policy_kl_approximation": True}
EXPLICIT = {   # Schulman's estimators of KL(pi || ref) from logr = log ref - log pi, written out (sign and scale)
    "k1": lambda logr: -logr, "k2": lambda logr: logr ** 2 / 2, "k3": lambda logr: torch.exp(logr) - 1 - logr}


def prove_kl_type(p, config: dict) -> None:
    """kl_penalty and gen_kl_error with the run's estimator (calculate_kl's kl_type): the per-token values are NeMo-RL's
    calculate_kl of what the call was given (pi vs the reference, with the loss's clamps; the generation policy vs
    the trainer's pre-update log-probs, unclamped), checked against the estimator written out."""
    kind = config["loss_fn.reference_policy_kl_type"]
    r = run(config)
    U = P.nemo().utils
    kl = token_steps(r, lambda c: U.calculate_kl(c["curr"], shifted(c, "reference_policy_logprobs"), kl_type=kind,
                                                 input_clamp_value=20.0, output_clamp_value=10.0))
    gen = token_steps(r, lambda c: U.calculate_kl(shifted(c, "generation_logprobs"), shifted(c, "prev_logprobs"),
                                                  kl_type=kind, input_clamp_value=None, output_clamp_value=None))
    written = token_steps(r, lambda c: EXPLICIT[kind](shifted(c, "reference_policy_logprobs") - c["curr"]))
    p.check(all(close(a, b, 1e-5) for a, b in zip(flat(kl), flat(written))), f"calculate_kl {kind}")
    p.assert_stated("train/kl_penalty", r.metrics["kl_penalty"], kl, levels=LOSS_LEVELS)
    p.assert_stated("train/gen_kl_error", r.metrics["gen_kl_error"], gen, levels=LOSS_LEVELS)
    for key in ("train/kl_penalty", "train/gen_kl_error"):     # the entry names the estimator the run used
        entry, res = p.entry(key)
        p.check(res.fields.get("estimator") == kind, (key, entry.canonical, res.fields))
    loss = token_steps(r, lambda c: clip_loss(c) + KL_COEF * U.calculate_kl(
        c["curr"], shifted(c, "reference_policy_logprobs"), kl_type=kind, input_clamp_value=20.0,
        output_clamp_value=10.0))
    p.assert_stated("train/loss", r.metrics["loss"], loss, levels=LOSS_LEVELS)


@proof("nemo_rl", trainer="grpo", release=RELEASE, config=K1)
def test_k1_kl_penalty_and_gen_kl_error(p):
    prove_kl_type(p, K1)
    p.check(not close(run(K1).metrics["kl_penalty"], run(BASE).metrics["kl_penalty"]), "k1 is k3")


@proof("nemo_rl", trainer="grpo", release=RELEASE, config=K2)
def test_k2_kl_penalty(p):
    prove_kl_type(p, K2)
    p.check(run(K2).metrics["kl_penalty"] > 0, run(K2).metrics["kl_penalty"])


@proof("nemo_rl", trainer="grpo", release=RELEASE, config=ON_POLICY_KL)
def test_on_policy_kl_approximation_weights_the_kl_by_pi_over_pi_generation(p):
    """loss_fn.use_on_policy_kl_approximation: the per-token k3 is multiplied by exp(log pi - log pi_gen) before the
    clamp (loss_functions.py:413-418, calculate_kl's importance_sampling_weights), then reduced as without it."""
    r = run(ON_POLICY_KL)
    U = P.nemo().utils
    weighted = token_steps(r, lambda c: U.calculate_kl(
        c["curr"], shifted(c, "reference_policy_logprobs"), kl_type="k3", input_clamp_value=20.0,
        output_clamp_value=10.0, importance_sampling_weights=torch.exp(c["curr"] - shifted(c, "generation_logprobs"))))
    p.assert_stated("train/kl_penalty", r.metrics["kl_penalty"], weighted, levels=LOSS_LEVELS)
    plain = token_steps(r, ref_kl)
    p.check(not close(r.metrics["kl_penalty"], pooled(plain)) and not close(r.metrics["kl_penalty"],
                                                                             run(BASE).metrics["kl_penalty"]),
            "the importance weights changed nothing")
    entry, _ = p.entry("train/kl_penalty")
    p.check(entry.reverse is False and "importance" in str(entry.reduce), (entry.reverse, entry.reduce))


# ------------------------------------------------------------------------------------------------ timing, throughput
# the timers grpo_train opens in one step (grpo.py:2258-2730, in this order; data_processing twice: :2261, :2524)
# and the seconds each block lasts on the test's clock; GAP: seconds inside total_step_time outside every block
STAGES = (("data_processing", 1.25), ("prepare_for_generation/total", 3.5), ("generation", 11.0),
          ("reward_calculation", 0.6), ("data_processing", 0.45), ("logprob_inference_prep", 0.2),
          ("policy_and_reference_logprobs", 4.2), ("advantage_calculation", 0.15), ("training_prep", 0.3),
          ("policy_training", 9.5))
GAP = 0.35
PERF = {**BASE, "cluster.num_nodes": 1, "cluster.gpus_per_node": WORLD}


class Clock:
    """time.perf_counter for nemo_rl/utils/timer.py: the test moves it on."""

    def __init__(self):
        self.now = 1000.0

    def perf_counter(self) -> float:
        return self.now

    def time(self) -> float:
        return self.now


def timed_step(tmp_path, seed: int = 0, config: dict = None, dynamic_sampling: bool = False):
    """One step's timers on the test's clock (NeMo-RL's Timer, as grpo_train opens them), then grpo_train's own
    statements: timer.get_timing_metrics(reduction_op='sum') (grpo.py:2997-2999) and the step's end (:3044-3090:
    the Training Results and Timing prints, valid_tokens_per_sec_per_gpu, print_performance_metrics), on the
    metrics of :func:`train_step`; the console output is read back by trackbridge's console reader."""
    import contextlib
    import io
    N = P.nemo()
    r = run(config or PERF, seed=seed)
    clock, saved = Clock(), N.timer.time
    N.timer.time = clock                                 # the module's `time` (perf_counter), for this block only
    try:
        timer = N.timer.Timer()
        with timer.time("total_step_time"):
            clock.now += GAP
            for label, secs in STAGES:
                with timer.time(label):
                    clock.now += secs
        ns = P.grpo_statements("timing_metrics: dict[str, float] = timer.get_timing_metrics",
                               "timing_metrics: dict[str, float] = timer.get_timing_metrics")({"timer": timer})
    finally:
        N.timer.time = saved
    m, rolled = dict(r.metrics), rollout()
    # with dynamic sampling, `rewards` are the kept groups' and repeated_batch['total_reward'] the whole batch's
    # (grpo.py:2472-2495): the first 12 samples kept here
    kept, whole = (r.rewards[:12], r.rewards + 0.25 * torch.arange(len(r.rewards))) if dynamic_sampling else (
        r.rewards, r.rewards)
    roll = rolled[0]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        print(f"\n{'=' * 25} Step 1/10 {'=' * 25}")        # grpo_train's banner (grpo.py:2243-2246)
        end = P.grpo_statements('print("\\n📊 Training Results:")', "performance_metrics = print_performance_metrics")({
            "np": np, "metrics": m, "timing_metrics": ns["timing_metrics"], "train_results": r.train_results,
            "rewards": kept, "repeated_batch": {"total_reward": whole},
            "metrics_logging_data": {"mean_gen_tokens_per_sample": roll["mean_gen_tokens_per_sample"]},
            "print_performance_metrics": N.utils.print_performance_metrics,
            "master_config": types.SimpleNamespace(
                grpo={"use_dynamic_sampling": dynamic_sampling, "num_prompts_per_step": PROMPTS,
                      "num_generations_per_prompt": GENERATIONS},
                cluster={"num_nodes": PERF["cluster.num_nodes"], "gpus_per_node": PERF["cluster.gpus_per_node"]},
                policy={"generation": {"colocated": {"enabled": True}}})})
    path = tmp_path / f"nemo_rl_console_{seed}_{dynamic_sampling}_{len(config or PERF)}.log"
    path.write_text(out.getvalue())
    from trackbridge.read.inputs import open_runs
    printed = {}
    for console in open_runs(str(path), rows=True):
        for rec in console.records():
            printed.update({k: v for k, v in rec.metrics.items() if isinstance(v, (int, float))})
    return types.SimpleNamespace(timing=end["timing_metrics"], perf=end["performance_metrics"], metrics=m,
                                 kept=kept, whole=whole,
                                 train=r.train_results, printed=printed, text=out.getvalue(), roll=roll, run=r,
                                 rolled=rolled)


@proof("nemo_rl", trainer="grpo", release=RELEASE, config=PERF)
def test_timings_are_the_timers_seconds_summed_over_their_calls(p, tmp_path):
    """timing/train/total_step_time, generation and every other stage: Timer.get_timing_metrics('sum') of the
    blocks' perf_counter differences, as they are (seconds; a stage timed twice is the sum of its two blocks);
    timing/train/valid_tokens_per_sec_per_gpu: grpo.py:3085-3087, the step's global_valid_toks (the mean over global
    batches) per second of total_step_time per GPU."""
    t = timed_step(tmp_path)
    total = GAP + sum(s for _, s in STAGES)
    p.assert_stated("timing/train/total_step_time", t.timing["total_step_time"], one_value(total), levels=())
    p.check(close(t.timing["total_step_time"], total, 1e-9), t.timing)
    p.assert_stated("timing/train/generation", t.timing["generation"], one_value(11.0), levels=())
    calls = {label: [s for lab, s in STAGES if lab == label] for label, _ in STAGES}
    p.check(len(calls["data_processing"]) == 2, calls)
    for label, secs in calls.items():
        key = f"timing/train/{label}"
        p.assert_stated(key, t.timing[label], one_value(sum(secs)), levels=())
        p.check(not close(t.timing[label], sum(secs) * 1000), f"{key} is not in seconds")
    p.check(not close(t.timing["data_processing"], calls["data_processing"][-1])
            and not close(t.timing["data_processing"], sum(calls["data_processing"]) / 2), "not the sum of calls")
    gpus = PERF["cluster.num_nodes"] * PERF["cluster.gpus_per_node"]
    vt = t.metrics["global_valid_toks"] / total / gpus
    p.assert_stated("timing/train/valid_tokens_per_sec_per_gpu", t.timing["valid_tokens_per_sec_per_gpu"],
                    one_value(vt), levels=())
    p.check(not close(t.timing["valid_tokens_per_sec_per_gpu"], t.metrics["global_valid_toks"] / total), "per GPU")


@proof("nemo_rl", trainer="grpo", release=RELEASE, config=PERF)
def test_throughputs_and_mfu_are_the_steps_tokens_over_its_seconds(p, tmp_path):
    """performance/tokens_per_sec_per_gpu, tokens_per_sec, samples_per_sec (print_performance_metrics,
    utils.py:787-797,885-895): the step's total_num_tokens (prompt + response of every sample) or its
    num_prompts_per_step * num_generations_per_prompt samples over total_step_time, per GPU or for all;
    train_fp_utilization (:861-874): the FLOPs tracker's total over policy_training seconds over the GPUs'
    theoretical TFLOPS (Policy.train, lm_policy.py:761-775: gpus per worker x the sum over workers)."""
    t = timed_step(tmp_path)
    total = GAP + sum(s for _, s in STAGES)
    gpus = PERF["cluster.num_nodes"] * PERF["cluster.gpus_per_node"]
    tokens = float(t.run.raw["input_lengths"].sum())
    p.check(close(t.metrics["total_num_tokens"], tokens), (t.metrics["total_num_tokens"], tokens))
    p.assert_stated("performance/tokens_per_sec_per_gpu", t.perf["tokens_per_sec_per_gpu"],
                    one_value(tokens / total / gpus), levels=())
    p.assert_stated("performance/tokens_per_sec", t.perf["tokens_per_sec"], one_value(tokens / total), levels=())
    samples = PROMPTS * GENERATIONS
    p.assert_stated("performance/samples_per_sec", t.perf["samples_per_sec"], one_value(samples / total), levels=())
    p.check(not close(t.perf["tokens_per_sec"], t.perf["tokens_per_sec_per_gpu"]), "gpus == 1")
    flops = FLOPS_PER_TOKEN * tokens
    p.check(close(t.train["total_flops"], flops), (t.train["total_flops"], flops))
    theoretical = WORLD / WORLD * WORLD * P.THEORETICAL_TFLOPS      # gpus per worker x sum over the workers
    mfu = flops / 9.5 / 1e12 / theoretical
    p.assert_stated("performance/train_fp_utilization", t.perf["train_fp_utilization"], one_value(mfu), levels=())
    p.check(0 < t.perf["train_fp_utilization"] < 1 and not close(t.perf["train_fp_utilization"], 100 * mfu), mfu)


def rounding(observations: list, decimals: int) -> float:
    """The fingerprint's ``rel`` for values printed with ``decimals``: its absolute tolerance is rel x the batch's
    largest term (fingerprint.magnitude), so this makes it half the last printed digit."""
    from _support.fingerprint import magnitude
    return 0.5 * 10 ** -decimals / min(magnitude(batch) for _, batch in observations) * 1.01


@proof("nemo_rl", trainer="grpo", release=RELEASE, config=PERF)
def test_console_prints_are_the_logged_values_rounded(p, tmp_path):
    """The '📊 Training Results:', '⏱️  Timing:' and '🔍 Performance Metrics:' blocks grpo_train and
    print_performance_metrics print (grpo.py:3044-3083, utils.py:826-851,871), read back by trackbridge's console
    reader: each the logged key's value rounded to the printed decimals (fingerprinted at that tolerance), with the
    entry's transform (the MFU percentage scaled back to a fraction)."""
    t = timed_step(tmp_path)
    got = t.printed
    p.check("Training Results/Loss" in got and "Timing/Total step time" in got, sorted(got))

    def printed(key, value, decimals, steps, **kw):
        entry, _ = p.entry(key)
        shown = entry.to_canonical(got[key]) if hasattr(entry, "to_canonical") else got[key]
        # a percentage printed to `decimals` is a fraction to decimals + 2
        p.check(abs(shown - value) <= 0.5 * 10 ** -decimals * (0.01 if "Utilization" in key else 1) + 1e-12,
                (key, got[key], value))
        p.assert_stated(key, shown, steps, rel=10 ** -decimals, **kw)
        p.check(not close(shown, 100 * value, 1e-3), f"{key}: a percentage, not scaled back")

    # the token means printed to 4 decimals: fingerprinted over several steps' prints (one rounded value alone fits
    # other reductions within the rounding)
    loss_obs, kl_obs = [], []
    for seed in GRAD_SEEDS:
        ts = t if seed == 0 else timed_step(tmp_path, seed)
        r = ts.run
        for key, logged, obs, fn in (
                ("Training Results/Loss", ts.metrics["loss"], loss_obs,
                 lambda c: clip_loss(c) + KL_COEF * ref_kl(c)),
                ("Training Results/Generation KL Error", ts.metrics["gen_kl_error"], kl_obs,
                 lambda c: P.nemo().utils.calculate_kl(shifted(c, "generation_logprobs"), shifted(c, "prev_logprobs"),
                                                       kl_type="k3", input_clamp_value=None,
                                                       output_clamp_value=None))):
            p.check(abs(ts.printed[key] - logged) <= 0.5e-4 + 1e-12 and abs(logged) > 0.01, (key, logged))
            obs.append((ts.printed[key], token_steps(r, fn)))
    for key, obs in (("Training Results/Loss", loss_obs), ("Training Results/Generation KL Error", kl_obs)):
        p.assert_stated(key, obs, levels=LOSS_LEVELS, rel=rounding(obs, 4))
    r = t.run
    rewards = [[float(v)] for v in r.rewards]
    p.check(close(got["Training Results/Avg Reward"], round(t.metrics["reward"], 4), 1e-9), got)
    p.assert_stated("Training Results/Avg Reward", seq_observations(got["Training Results/Avg Reward"], rewards),
                    levels=DRIVER, rel=1e-4)
    _, _, made, _, plan = t.rolled
    gen = [[float(sum(made[i]))] for i in range(len(plan["turns"]))]
    p.check(close(got["Training Results/Mean Generation Length"], round(t.roll["mean_gen_tokens_per_sample"], 4),
                  1e-9), (got, t.roll))
    p.assert_stated("Training Results/Mean Generation Length",
                    seq_observations(got["Training Results/Mean Generation Length"], gen), levels=DRIVER, rel=1e-4)
    total = GAP + sum(s for _, s in STAGES)
    printed("Timing/Total step time", t.timing["total_step_time"], 2, one_value(total), levels=())
    printed("Timing/policy_training", t.timing["policy_training"], 2, one_value(9.5), levels=())
    gpus = PERF["cluster.num_nodes"] * PERF["cluster.gpus_per_node"]
    tokens = float(r.raw["input_lengths"].sum())
    printed("Throughputs (per GPU)/E2E (Tokens/sec/gpu)", t.perf["tokens_per_sec_per_gpu"], 2,
            one_value(tokens / total / gpus), levels=())
    printed("Throughputs (per Group)/E2E (Tokens/sec)", t.perf["tokens_per_sec"], 2, one_value(tokens / total),
            levels=())
    printed("Throughputs (per Group)/E2E (Samples/sec)", t.perf["samples_per_sec"], 2,
            one_value(PROMPTS * GENERATIONS / total), levels=())
    mfu = FLOPS_PER_TOKEN * tokens / 9.5 / 1e12 / (WORLD * P.THEORETICAL_TFLOPS)
    printed("Throughputs (per Group)/Training Model Floating Point Utilization", t.perf["train_fp_utilization"], 2,
            one_value(mfu), levels=())


# ------------------------------------------------------------------------------------------------ validation
VAL = {**BASE, "grpo.max_val_samples": 18, "grpo.val_batch_size": 6, "grpo.max_rollout_turns": 1,
       "policy.max_total_sequence_length": 64}
VAL_BATCHES = (6, 6, 4, 5)        # what the dataloader yields: its last batch short, one batch past max_val_samples


def validation(tmp_path):
    """grpo.py's validate (from its text) over a dataloader of VAL_BATCHES single-turn batches (the rollout's own
    code, :func:`rollout`'s engine and environment), printing its Validation Results block (read back by
    trackbridge's console reader)."""
    import contextlib
    import io
    N = P.nemo()
    rng = random.Random(77)
    n = sum(VAL_BATCHES)
    plan = {"turns": [1] * n, "gen": [[rng.randint(1, 12)] for _ in range(n)], "env": [[0] for _ in range(n)],
            "cut": [False] * n, "prompt": [rng.randint(2, 6) for _ in range(n)]}
    gen, env = Generation(plan), Env(plan)
    loader, i = [], 0
    for size in VAL_BATCHES:
        logs = [[{"role": "user", "content": f"sample {k}",
                  "token_ids": torch.tensor([100 + k] + [3] * (plan["prompt"][k] - 1))}] for k in range(i, i + size)]
        loader.append(N.BatchedDataDict({"message_log": logs, "task_name": ["math"] * size,
                                         "extra_env_info": [None] * size}))
        i += size
    cfg = types.SimpleNamespace(
        grpo={"max_val_samples": VAL["grpo.max_val_samples"], "val_batch_size": VAL["grpo.val_batch_size"],
              "max_rollout_turns": VAL["grpo.max_rollout_turns"], "val_period": 1},
        policy={"generation": {"backend": "vllm", "vllm_cfg": {"async_engine": False}},
                "max_total_sequence_length": VAL["policy.max_total_sequence_length"]},
        env={"should_use_nemo_gym": False}, logger={"num_val_samples_to_print": 0})
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        print(f"\n{'=' * 25} Step 1/10 {'=' * 25}")        # grpo_train's banner (grpo.py:2243-2246)
        val_metrics, _ = P.validate()(gen, loader, Tokenizer(), {"math": env}, step=1, master_config=cfg)
    path = tmp_path / "nemo_rl_validation.log"
    path.write_text(out.getvalue())
    from trackbridge.read.inputs import open_runs
    printed = {}
    for console in open_runs(str(path), rows=True):
        for rec in console.records():
            printed.update({k: v for k, v in rec.metrics.items() if isinstance(v, (int, float))})
    used = VAL["grpo.max_val_samples"] // VAL["grpo.val_batch_size"]
    batches, i = [], 0
    for size in VAL_BATCHES[:used]:
        batches.append(list(range(i, i + size)))
        i += size
    return val_metrics, printed, batches, gen.made, env


@proof("nemo_rl", trainer="grpo", release=RELEASE, config=VAL)
def test_validation_accuracy_pools_samples_and_avg_length_averages_batches(p, tmp_path):
    """validation/accuracy: the mean reward over every validation sample of the first max_val_samples //
    val_batch_size batches, pooled (grpo.py:3215-3226); validation/avg_length: each batch's
    mean_gen_tokens_per_sample averaged over the batches unweighted (:3216, :3228-3230: the driver's batches, the
    fingerprint's micro-batches under processes none); the console's Validation
    Results block prints both rounded (:3265-3266)."""
    val, printed, batches, made, env = validation(tmp_path)
    p.check(len(batches) == 3 and len({len(b) for b in batches}) == 2, batches)
    p.check(sum(len(v) for v in made.values()) == sum(len(b) for b in batches), "the batch past max_val_samples ran")
    rewards = [[float(k % 2)] for b in batches for k in b]
    p.check(len(rewards) == 16, rewards)
    p.assert_stated("validation/accuracy", seq_observations(val["accuracy"], rewards), levels=DRIVER)
    p.check(close(printed["Validation Results/Accuracy"], round(val["accuracy"], 4), 1e-9), printed)
    p.assert_stated("Validation Results/Accuracy", seq_observations(printed["Validation Results/Accuracy"], rewards),
                    levels=DRIVER, rel=1e-4)
    # avg_length: the mean over validation batches (the driver's micro-batches, uneven) of each batch's mean
    # generated tokens per sample; every sample its generated length on each of its generated tokens, so that a
    # token mean (a sample weighted by its length) is another candidate
    lengths = [[[[[[float(made[k][0])] * made[k][0] for k in b] for b in batches]]]]
    found = p.assert_stated("validation/avg_length", val["avg_length"], lengths, levels=("micro_batches",),
                            tokens=("per_seq", "token_mean"), mini=("none",))
    p.check(found.tokens == "per_seq" and found.micro_batches == "mean", found)
    pooled = [float(made[k][0]) for b in batches for k in b]
    p.check(not close(val["avg_length"], sum(pooled) / len(pooled)), "avg_length pools the samples")
    p.check(close(printed["Validation Results/Average response length"], round(val["avg_length"], 1), 1e-9),
            printed)
    scale = FP.magnitude(lengths)               # the print's rounding (0.05) against the lengths' scale
    p.assert_stated("Validation Results/Average response length", printed["Validation Results/Average response length"],
                    lengths, levels=("micro_batches",), tokens=("per_seq", "token_mean"), mini=("none",),
                    rel=0.06 / scale)


# ------------------------------------------------------------------------------------------------ async rollouts
class AsyncGeneration(Generation):
    """The async engine (vLLM with async_engine): generate_async yields (index, one sample's output)."""

    cfg = {"backend": "vllm", "vllm_cfg": {"async_engine": True}}

    async def generate_async(self, data, greedy=False):
        out = self.generate(data, greedy)
        N = P.nemo()
        for b in range(out["output_ids"].shape[0]):
            yield b, N.BatchedDataDict({k: v[b:b + 1] for k, v in out.items()})


@proof("nemo_rl", trainer="grpo", release=RELEASE, config=MULTI)
def test_async_rollout_rewards_are_over_samples_summed_over_turns(p):
    """run_async_multi_turn_rollout (rollouts.py:1104-1297, each sample its own run_sample_multi_turn_rollout,
    :904-1101): a sample's total_reward is its turns' rewards summed; mean_total_reward, max_total_reward and
    min_total_reward are the mean, max and min over the samples."""
    N = P.nemo()
    n = PROMPTS * GENERATIONS
    rng = random.Random(91)
    plan = {"turns": [4 if i == 3 else rng.choice([1, 2]) for i in range(n)],
            "gen": [[rng.randint(1, 9) for _ in range(4)] for _ in range(n)],
            "env": [[rng.randint(0, 4) for _ in range(4)] for _ in range(n)], "cut": [False] * n,
            "reward": [[round(rng.uniform(-1.0, 1.5), 2) for _ in range(4)] for _ in range(n)]}
    logs = [[{"role": "user", "content": f"sample {i}", "token_ids": torch.tensor([100 + i, 3, 3])}] for i in range(n)]
    batch = N.BatchedDataDict({"message_log": logs, "task_name": ["math"] * n, "extra_env_info": [None] * n})
    env = Env(plan)
    out, m = N.rollouts.run_async_multi_turn_rollout(AsyncGeneration(plan), batch, Tokenizer(), {"math": env},
                                                     max_seq_len=MULTI["policy.max_total_sequence_length"],
                                                     max_rollout_turns=MULTI["grpo.max_rollout_turns"])
    totals = [[float(sum(plan["reward"][i][:len(env.obs[i])]))] for i in range(n)]
    p.check(any(len(env.obs[i]) > 1 for i in range(n)) and len({t[0] for t in totals}) > 10, totals)
    p.check(all(close(float(a), b[0], 1e-5) for a, b in zip(out["total_reward"], totals)), "total_reward")
    p.assert_stated("train/mean_total_reward", seq_observations(m["mean_total_reward"], totals), levels=DRIVER)
    p.assert_stated("train/max_total_reward", seq_observations(m["max_total_reward"], totals), levels=DRIVER,
                    stats=("max",))
    p.assert_stated("train/min_total_reward", seq_observations(m["min_total_reward"], totals), levels=DRIVER,
                    stats=("min",))
    last_turn = [[float(plan["reward"][i][len(env.obs[i]) - 1])] for i in range(n)]
    p.check(not close(m["mean_total_reward"], sum(v[0] for v in last_turn) / n), "the last turn's reward only")
    # the same code's length metrics: generated + observation tokens, not the prompt (as run_multi_turn_rollout)
    gen = [float(sum(env_gen)) for env_gen in (plan["gen"][i][:len(env.obs[i])] for i in range(n))]
    obs = [float(sum(env.obs[i])) for i in range(n)]
    p.assert_stated("train/mean_total_tokens_per_sample",
                    seq_observations(m["mean_total_tokens_per_sample"], [[g + o] for g, o in zip(gen, obs)]),
                    levels=DRIVER)
    p.assert_stated("train/mean_gen_tokens_per_sample", seq_observations(m["mean_gen_tokens_per_sample"],
                                                                         [[g] for g in gen]), levels=DRIVER)


DYNAMIC = {**PERF, "grpo.use_dynamic_sampling": True}


@proof("nemo_rl", trainer="grpo", release=RELEASE, config=DYNAMIC)
def test_console_with_dynamic_sampling_prints_the_whole_batchs_mean_reward(p, tmp_path):
    """grpo.use_dynamic_sampling: the Training Results block prints 'Avg Filtered Reward' (the kept groups' rewards)
    and 'Avg Total Reward', np.mean of the whole generated batch's total_reward (grpo.py:3050-3054), rounded to 4."""
    t = timed_step(tmp_path, dynamic_sampling=True)
    got = t.printed
    whole = [[float(v)] for v in t.whole]
    p.check(close(got["Training Results/Avg Total Reward"], round(float(t.whole.mean()), 4), 1e-9), got)
    p.check(not close(got["Training Results/Avg Total Reward"], float(t.kept.mean()), 1e-4), "the kept groups' mean")
    p.assert_stated("Training Results/Avg Total Reward",
                    seq_observations(got["Training Results/Avg Total Reward"], whole), levels=DRIVER, rel=1e-4)
    p.check("Training Results/Avg Reward" not in got, sorted(got))


@proof("nemo_rl", trainer="grpo", release=RELEASE, config=K1)
def test_console_generation_kl_error_with_k1(p, tmp_path):
    """loss_fn.reference_policy_kl_type k1: the printed Generation KL Error is train/gen_kl_error with the k1
    estimator (calculate_kl: log pi_gen - log pi_old per token), rounded to 4 decimals."""
    U = P.nemo().utils
    obs = []
    for seed in GRAD_SEEDS:              # a value printed to 4 decimals: several steps tell the reductions apart
        t = timed_step(tmp_path, seed=seed, config=K1)
        gen = token_steps(t.run, lambda c: U.calculate_kl(
            shifted(c, "generation_logprobs"), shifted(c, "prev_logprobs"), kl_type="k1", input_clamp_value=None,
            output_clamp_value=None))
        shown = t.printed["Training Results/Generation KL Error"]
        p.check(abs(shown - t.metrics["gen_kl_error"]) <= 0.5e-4 + 1e-12, (shown, t.metrics["gen_kl_error"]))
        obs.append((shown, gen))
    p.assert_stated("Training Results/Generation KL Error", obs, levels=LOSS_LEVELS, rel=rounding(obs, 4))
    entry, res = p.entry("Training Results/Generation KL Error")
    p.check(res.fields.get("estimator") == "k1", (entry.canonical, res.fields))
