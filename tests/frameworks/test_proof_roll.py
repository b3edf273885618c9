"""Fingerprints of ROLL v0.3.0's RLVR metrics (issue 33 item 1), by ROLL's own code vendored from the v0.3.0 tag
(tests/_support/proofs_roll.py says what is loaded, what is compiled from the files' text and what stands in).

The actor's metrics (actor/pg_loss, kl_loss, total_loss, approxkl, policykl, clipfrac, lr, actor_train/grad_norm)
run through the whole composition a training step makes, on two simulated data-parallel ranks:

* the pipeline's batch carries ``loss_mask_keys`` (rlvr_pipeline.py@v0.3.0:572) and its ``final_response_mask``
  from ``get_sample_level_mask`` (functionals.py:682-739, run), and is cut for the ranks with ``DataProto.chunk``
  (what decorator.py@v0.3.0 ``_split_args_kwargs`` does for Dispatch.DP_MP_DISPATCH_FIRST, line 56);
* each rank runs ``ActorWorker.train_step`` (base_worker.py:63-127): backward batches of
  per_device_train_batch_size x gradient_accumulation_steps from ``DataProto.make_iterator`` (shuffled, seeded),
  ``FSDP2TrainStrategy.train_step`` per backward batch (fsdp2_strategy.py:1565-1682: the batch's token and sample
  counts all-reduced over the ranks, strategy.py:355-431; the micro-batch loop calling ``loss_func``,
  actor_worker.py:11-167, and ``append_to_dict`` of its metrics; the grad norm and the optimizer and scheduler
  steps at the sync boundary), then ``actor/lr`` and the division of every ``@sum`` metric by ``backward_steps``
  (base_worker.py:110-121);
* the pipeline joins the ranks' outputs (``DataProto.concat``), reduces them by tag (``add_reduced_metrics``,
  rlvr_pipeline.py:797) and the tracker strips the tags (tracking.py:15-52).

What each logged value is compared with is what ROLL's code was given or computed per token in that run (the
micro-batches ``loss_func`` received, the log-probs ``op_compute_log_probs`` returned for them, the grad norms
``_clip_grad_norm`` returned, the lr after each scheduler step), nested as the fingerprint's
``steps[logged step][optimizer step][rank][micro-batch]``. The driver metrics (critic/score, rewards, advantages,
returns, token/response_length, prompt_length) run ``MetricsManager.add_all_metrics``' value and token metrics on a
batch, as rlvr_pipeline.py:751 calls them.
"""
from __future__ import annotations

import math

import pytest

pytest.importorskip("torch")
pytest.importorskip("tensordict")

import torch  # noqa: E402

from _support import fingerprint as FP  # noqa: E402
from _support import proofs_roll as R  # noqa: E402
from _support.framework_code import run_ranks  # noqa: E402
from _support.proven import close, proof, to_fingerprint  # noqa: E402

RELEASE = "0.3.0"
WORLD, PER_DEVICE, GA, VOCAB = 2, 2, 2, 11
PROMPT_W, RESP_W = 4, 7
ACTOR = ("micro_batches", "mini_batches", "processes")
#: response lengths of the 16 samples: uneven within and across micro-batches, optimizer steps and ranks
RESP_LENS = [1, 7, 3, 6, 2, 5, 7, 1, 4, 6, 2, 3, 7, 5, 1, 4]
PROMPT_LENS = [4, 2, 3, 1, 4, 3, 2, 4, 1, 3, 4, 2, 3, 1, 2, 4]


# ------------------------------------------------------------------------------------------------ the batch
def rollout(seed: int = 0, n: int = len(RESP_LENS), resp_lens=None, prompt_lens=None):
    """A rollout batch as the pipeline hands it to actor_train: left-padded prompts, right-padded responses,
    ``response_mask`` over the full width (shifted by loss_func), the rollout's old and reference log-probs and the
    advantages per token, ``scores`` per sequence; ``final_response_mask`` by ROLL's get_sample_level_mask."""
    r = R.roll()
    resp_lens = resp_lens or RESP_LENS[:n]
    prompt_lens = prompt_lens or PROMPT_LENS[:n]
    g = torch.Generator().manual_seed(seed)
    width = PROMPT_W + RESP_W
    input_ids = torch.zeros(n, width, dtype=torch.long)
    attention = torch.zeros(n, width, dtype=torch.long)
    response_mask = torch.zeros(n, width, dtype=torch.long)
    prompt_mask = torch.zeros(n, width, dtype=torch.long)
    responses = torch.zeros(n, RESP_W, dtype=torch.long)
    for i, (pl, rl) in enumerate(zip(prompt_lens, resp_lens)):
        toks = torch.randint(1, VOCAB, (pl + rl,), generator=g)
        input_ids[i, PROMPT_W - pl:PROMPT_W + rl] = toks
        attention[i, PROMPT_W - pl:PROMPT_W + rl] = 1
        prompt_mask[i, PROMPT_W - pl:PROMPT_W] = 1
        response_mask[i, PROMPT_W:PROMPT_W + rl] = 1
        responses[i, :rl] = toks[pl:]
    position_ids = (attention.cumsum(-1) - 1).clamp(min=0)
    base = -math.log(VOCAB)
    valid = attention[:, 1:]                       # the log-prob passes return log_probs * attention_mask[:, 1:]
    old = (base + 0.4 * (torch.rand(n, width - 1, generator=g) - 0.5)) * valid
    ref = (base + 0.6 * (torch.rand(n, width - 1, generator=g) - 0.5)) * valid
    adv = torch.randn(n, width - 1, generator=g) * response_mask[:, 1:]
    scores = torch.tensor([float(x) for x in torch.randint(0, 2, (n,), generator=g)])
    td = {"input_ids": input_ids, "attention_mask": attention, "position_ids": position_ids,
          "response_mask": response_mask, "prompt_mask": prompt_mask, "responses": responses,
          "old_log_probs": old, "ref_log_probs": ref, "advantages": adv, "scores": scores,
          "train_infer_is_weight": torch.ones(n, width - 1)}
    return r.DataProto.from_dict(tensors=td, meta_info={"global_step": 0, "is_offload_states": False})


def run_actor(cfg, per_device: int = PER_DEVICE, ga: int = GA, seed: int = 0, batch=None):
    """One training step of actor_train on WORLD ranks: (logged metrics, the ranks, the batch)."""
    r = R.roll()
    batch = batch if batch is not None else rollout(seed)
    batch, _ = r.F.get_sample_level_mask(batch, cfg)
    # compute_advantage is given final_response_mask (rlvr_pipeline.py:721) and masks the advantages with it
    # (functionals.py@v0.3.0:1178): a response max_len_mask leaves out has no advantage
    batch.batch["advantages"] = batch.batch["advantages"] * batch.batch["final_response_mask"]
    batch.meta_info["loss_mask_keys"] = ["response_mask", "final_response_mask"]     # rlvr_pipeline.py:572
    chunks = batch.chunk(chunks=WORLD)
    wcfg = R.worker_config(per_device, ga)
    ranks = [R.ActorRank(i, WORLD, cfg, wcfg, VOCAB) for i in range(WORLD)]
    outputs = run_ranks(lambda i: ranks[i].train_step(chunks[i]), world=WORLD)
    return R.pipeline_reduce(outputs), ranks, batch


def micro_layout(ranks, micros_per_step: int) -> list:
    """The recorded loss_func calls as [optimizer step][rank][micro-batch] (calls run in order on each rank)."""
    n = {len(rk.calls) for rk in ranks}
    assert len(n) == 1 and n.pop() % micros_per_step == 0, [len(rk.calls) for rk in ranks]
    steps = len(ranks[0].calls) // micros_per_step
    return [[rk.calls[m * micros_per_step:(m + 1) * micros_per_step] for rk in ranks] for m in range(steps)]


def token_steps(layout, per_token, mask_key: str) -> list:
    """[[ [rank][micro][seq] = the valid tokens' values ]]: ``per_token(call)`` a [batch, width-1] tensor of the
    micro-batch, read where its ``mask_key`` is set; sequences with no such token are not sequences of it."""
    out = []
    for mini in layout:
        ranks = []
        for calls in mini:
            micros = []
            for call in calls:
                d = call["data"].batch
                mask = (d["response_mask"][:, 1:] if mask_key == "response_mask" else d[mask_key]).bool()
                vals = per_token(call)
                micros.append([[float(v) for v in vals[i][mask[i]]] for i in range(mask.shape[0]) if mask[i].any()])
            ranks.append(micros)
        out.append(ranks)
    return [out]


def log_ratio(call):
    return call["log_probs"] - call["data"].batch["old_log_probs"]


def ppo_loss(call, clip: float = 0.2):
    a = call["data"].batch["advantages"]
    ratio = log_ratio(call).exp()
    return -torch.min(ratio * a, ratio.clamp(1 - clip, 1 + clip) * a)


def k3(call):
    d = call["log_probs"] - call["data"].batch["ref_log_probs"]     # log pi - log pi_ref
    return (-d).exp() + d - 1


def clip_binds(call, clip: float = 0.2):
    a = call["data"].batch["advantages"]
    ratio = log_ratio(call).exp()
    return (ratio.clamp(1 - clip, 1 + clip) * a < ratio * a).float()


def stated_value(p, key: str, steps, norm_len: int = 0) -> float:
    """What the entry's stated reduction makes of ``steps`` (to check a sign or a scale against)."""
    return FP.value_of(steps, to_fingerprint(p.entry(key)[1].stated), norm_len)


def check_actor(p, m, ranks, cfg):
    """The actor's metrics of one run against the micro-batches loss_func was given."""
    layout = micro_layout(ranks, GA)
    p.check(len(layout) >= 2 and all(len(mini) == WORLD for mini in layout), "fewer than 2 optimizer steps or ranks")
    kw = {"levels": ACTOR}
    pg = token_steps(layout, ppo_loss, "final_response_mask")
    p.assert_stated("actor/pg_loss", m["actor/pg_loss"], pg, **kw)
    kl = token_steps(layout, k3, "final_response_mask")
    p.assert_stated("actor/kl_loss", m["actor/kl_loss"], kl, **kw)
    p.check(m["actor/kl_loss"] > 0, "k3 is non-negative: the sign is kept")
    for other, est in ((lambda c: c["data"].batch["ref_log_probs"] - c["log_probs"], "k1"),
                       (lambda c: 0.5 * (c["log_probs"] - c["data"].batch["ref_log_probs"]) ** 2, "k2")):
        alt = stated_value(p, "actor/kl_loss", token_steps(layout, other, "final_response_mask"))
        p.check(not close(m["actor/kl_loss"], alt, 1e-4), f"actor/kl_loss is the {est} estimator's value")
    coef = cfg.kl_loss_coef if cfg.use_kl_loss else 0.0
    total = token_steps(layout, lambda c: ppo_loss(c) + coef * k3(c), "final_response_mask")
    p.assert_stated("actor/total_loss", m["actor/total_loss"], total, **kw)
    p.check(coef == 0 or not close(m["actor/total_loss"], m["actor/pg_loss"]), "total_loss is pg_loss: no KL term")
    approx = token_steps(layout, lambda c: 0.5 * log_ratio(c) ** 2, "response_mask")
    p.assert_stated("actor/approxkl", m["actor/approxkl"], approx, **kw)
    policy = token_steps(layout, log_ratio, "response_mask")
    p.assert_stated("actor/policykl", m["actor/policykl"], policy, **kw)
    # the logged policykl is log pi - log pi_old (the entry's scale -1 makes it k1 of KL(pi_old || pi))
    flipped = token_steps(layout, lambda c: -log_ratio(c), "response_mask")
    p.check(not close(m["actor/policykl"], stated_value(p, "actor/policykl", flipped)),
            "policykl is logged as log pi_old - log pi: the entry's scale -1 would flip the sign wrongly")
    clipped = token_steps(layout, clip_binds, "response_mask")
    p.assert_stated("actor/clipfrac", m["actor/clipfrac"], clipped, **kw)
    p.check(0 < m["actor/clipfrac"] < 1, f"clipfrac {m['actor/clipfrac']}: the batch clips all or none")
    return layout


CFG_DEFAULT = {"loss_agg_mode": "seq-mean-token-mean", "use_kl_loss": True, "kl_loss_coef": 0.1, "ppo_epochs": 1}


@proof("roll", trainer="rlvr", release=RELEASE, config=CFG_DEFAULT)
def test_actor_losses_default_mode_are_pooled_sequence_means_averaged_over_optimizer_steps(p):
    """seq-mean-token-mean (the default): each micro-batch's value is its sequences' token means summed over
    global_valid_samples of the backward batch on all ranks; summed over micro-batches and ranks (@sum) and
    divided by the optimizer steps: the pooled sequence mean of each optimizer step, averaged over the steps."""
    cfg = R.pipeline_config(**CFG_DEFAULT)
    m, ranks, _ = run_actor(cfg)
    check_actor(p, m, ranks, cfg)


CFG_MASKED = {**CFG_DEFAULT, "max_len_mask": True}


@proof("roll", trainer="rlvr", release=RELEASE, config=CFG_MASKED)
def test_actor_losses_weigh_micro_batches_by_their_valid_sequences(p):
    """The default mode with max_len_mask (rlvr_config.py:147): get_sample_level_mask leaves the responses that
    reach the maximum length out of final_response_mask, so the micro-batches hold different numbers of valid
    sequences for the final-mask metrics (pg_loss, kl_loss, total_loss): their shares of global_valid_samples
    weigh each micro-batch by its valid sequences, not equally."""
    cfg = R.pipeline_config(**{k: v for k, v in CFG_MASKED.items()})
    m, ranks, batch = run_actor(cfg)
    final = batch.batch["final_response_mask"]
    dropped = [i for i in range(len(batch)) if not final[i].any()]
    p.check(dropped and all(RESP_LENS[i] == RESP_W for i in dropped), f"max_len_mask dropped {dropped}")
    layout = micro_layout(ranks, GA)
    counts = {sum(bool(c["data"].batch["final_response_mask"][i].any()) for i in range(len(c["data"])))
              for mini in layout for calls in mini for c in calls}
    p.check(len(counts) > 1, f"every micro-batch holds {counts} valid sequences: seq_weighted is mean here")
    for key, per_token in (("actor/pg_loss", ppo_loss), ("actor/kl_loss", k3)):
        found = p.assert_stated(key, m[key], token_steps(layout, per_token, "final_response_mask"), levels=ACTOR)
        p.check(found.micro_batches != "mean", f"{key}: micro-batches averaged unweighted ({found})")


CFG_TOKEN_MEAN = {"loss_agg_mode": "token-mean", "use_kl_loss": True, "kl_loss_coef": 0.1, "ppo_epochs": 2}


@proof("roll", trainer="rlvr", release=RELEASE, config=CFG_TOKEN_MEAN)
def test_actor_losses_token_mean_are_pooled_token_means_averaged_over_optimizer_steps_and_epochs(p):
    """token-mean: each micro-batch's value is its token sum over batch_num_tokens, the valid tokens of the
    backward batch on all ranks (all-reduced, strategy.py:355-389): the pooled token mean of each optimizer step,
    averaged unweighted over the optimizer steps of both ppo_epochs."""
    cfg = R.pipeline_config(**CFG_TOKEN_MEAN)
    m, ranks, _ = run_actor(cfg)
    layout = check_actor(p, m, ranks, cfg)
    p.check(len(layout) == 2 * len(RESP_LENS) // WORLD // (PER_DEVICE * GA), "not two epochs of optimizer steps")
    p.check(m["actor/backward_steps"] == len(layout), (m["actor/backward_steps"], len(layout)))


CFG_SEQ_SUM = {"loss_agg_mode": "seq-mean-token-sum", "use_kl_loss": True, "kl_loss_coef": 0.1, "ppo_epochs": 1}


@proof("roll", trainer="rlvr", release=RELEASE, config=CFG_SEQ_SUM)
def test_actor_losses_seq_mean_token_sum_are_pooled_sequence_sums_averaged_over_optimizer_steps(p):
    """seq-mean-token-sum: each micro-batch's sequences' token sums over global_valid_samples of the backward
    batch on all ranks: the pooled mean of sequence sums of each optimizer step, averaged over the steps."""
    cfg = R.pipeline_config(**CFG_SEQ_SUM)
    m, ranks, _ = run_actor(cfg)
    check_actor(p, m, ranks, cfg)


CFG_SUM_NORM = {"loss_agg_mode": "seq-mean-token-sum-norm", "use_kl_loss": True, "kl_loss_coef": 0.1,
                "ppo_epochs": 1, "max_len_mask": True}


def test_actor_losses_seq_mean_token_sum_norm_are_not_divided_by_the_sequences():
    """seq-mean-token-sum-norm: agg_loss divides each micro-batch's sequence token sums by the padded width
    (loss_mask.shape[-1], functionals.py@v0.3.0:269-274) and not by any count of sequences; the @sum shares add up
    over the micro-batches and ranks and are divided by the optimizer steps. The logged value is therefore the
    optimizer step's valid sequences times the canonical seq_mean_token_sum_norm, which the entry states as its
    deviation for this mode (so it is never "exact"). With max_len_mask the steps hold different numbers of valid
    sequences, so no one factor relates the two. Not a proof (the stated reduction is, rightly, not what is logged:
    no fingerprint is recorded), so a plain test, with the entry read as a proof reads it."""
    from _support.proven import Proof, Proving
    p = Proving(Proof(lambda _p: None, "roll", "rlvr", str(RELEASE).lstrip("v"), tuple(sorted(CFG_SUM_NORM.items())),
                      "deviation"))
    cfg = R.pipeline_config(**CFG_SUM_NORM)
    m, ranks, _ = run_actor(cfg)
    layout = micro_layout(ranks, GA)
    width = PROMPT_W + RESP_W - 1                       # the padded width of every micro-batch's masks
    for key, per_token in (("actor/pg_loss", ppo_loss), ("actor/kl_loss", k3)):
        steps = token_steps(layout, per_token, "final_response_mask")
        _, res = p.entry(key)
        p.check(res.stated.get("deviation") not in (None, "none"), f"{key}: the entry states no deviation")
        stated = stated_value(p, key, steps, norm_len=width)
        p.check(not close(m[key], stated), f"{key}: the logged value is the stated seq_mean_token_sum_norm")
        # what ROLL computes: each optimizer step's token sums over every rank and micro-batch, over the width
        per_step = [sum(sum(seq) for rk in mini for micro in rk for seq in micro) / width for mini in steps[0]]
        p.check(close(m[key], sum(per_step) / len(per_step)), f"{key}: {m[key]} is not the sum over the width")
        n_seq = [sum(len(micro) for rk in mini for micro in rk) for mini in steps[0]]
        p.check(len(set(n_seq)) > 1, f"the optimizer steps hold {n_seq} valid sequences")
    assert p.assertions == 8 and not p.records, (p.assertions, p.records)



# ------------------------------------------------------------------------------------------------ optimizer
@proof("roll", trainer="rlvr", release=RELEASE, config=CFG_DEFAULT)
def test_grad_norm_is_the_mean_over_optimizer_steps_and_lr_the_last_scheduler_steps(p):
    """actor_train/grad_norm: FSDP2TrainStrategy.train_step logs what _clip_grad_norm returned at each sync
    boundary (one optimizer step per backward batch, fsdp2_strategy.py:1658-1663); train_step appends one per step,
    the ranks' lists are joined and reduce_metrics takes np.mean (no tag). actor/lr: scheduler.get_last_lr()[0] once
    after the loop (base_worker.py:110): the lr after the last scheduler step, averaged over the ranks (all equal)."""
    cfg = R.pipeline_config(**CFG_DEFAULT)
    m, ranks, _ = run_actor(cfg)
    norms = [rk.grad_norms for rk in ranks]
    p.check(all(len(n) >= 2 for n in norms) and len({len(n) for n in norms}) == 1, norms)
    p.check(len({round(x, 9) for n in norms for x in n}) == sum(len(n) for n in norms), f"tied grad norms {norms}")
    steps = [[[[[[norms[r][k]]]] for r in range(WORLD)] for k in range(len(norms[0]))]]
    p.assert_stated("actor_train/grad_norm", m["actor_train/grad_norm"], steps, levels=())
    p.check(not close(m["actor_train/grad_norm"], norms[0][-1]), "grad_norm is the last step's")
    lrs = [rk.lrs for rk in ranks]
    p.check(all(len(x) == len(norms[0]) for x in lrs), f"one scheduler step per optimizer step: {lrs}")
    p.check(lrs[0][0] != lrs[0][-1], f"the schedule does not move: {lrs}")
    p.check(len({x[-1] for x in lrs}) == 1, f"the ranks' schedules differ: {lrs}")
    p.assert_stated("actor/lr", m["actor/lr"], [[[[[[lrs[0][-1]]]]]]], levels=())
    p.check(close(m["actor/lr"], lrs[0][-1]) and not close(m["actor/lr"], sum(lrs[0]) / len(lrs[0])),
            f"actor/lr {m['actor/lr']} is not the lr after the last scheduler step {lrs}")


# ------------------------------------------------------------------------------------------------ driver
DRIVER = ("micro_batches", "processes")


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


def shares(n: int) -> tuple:
    """Uneven groups of n items on two ranks (ranks of different sizes, groups of different sizes)."""
    a = n // 2 + 1
    return ((a - 3, 1, 2), (1, n - a - 2, 1))


def ends(n: int) -> tuple:
    """Groups that put the first and the last items alone at the ends (a sorted order's extremes)."""
    a = n // 2 + 1
    return ((1, a - 2, 1), (1, n - a - 2, 1))


def per_seq_observations(logged: float, values: list[float]) -> list:
    """The logged value against five layouts of the same per-sequence values (as given, sorted up and down, cut
    into ``shares``; sorted up and down, cut into ``ends``): the pooled value is the same in every layout, a
    selection or an unweighted mean of groups is not."""
    seqs = [[float(v)] for v in values]
    up, down = sorted(seqs), sorted(seqs, reverse=True)
    cut, edge = shares(len(seqs)), ends(len(seqs))
    return [(logged, [[layout(order, c)]]) for order, c in ((list(seqs), cut), (up, cut), (down, cut), (up, edge),
                                                            (down, edge))]


def token_observations(logged: float, seqs: list[list[float]]) -> list:
    """The same for per-token values (ragged sequences): as given, reversed, and longest first."""
    orders = (list(seqs), list(reversed(seqs)), sorted(seqs, key=lambda s: (-len(s), s)))
    return [(logged, [[layout(order, shares(len(seqs)))]]) for order in orders]


def ragged(values, mask) -> list[list[float]]:
    return [[float(v) for v, k in zip(row, mrow) if k] for row, mrow in zip(values.tolist(), mask.tolist())]


def driver_batch(seed: int = 3):
    """A batch as add_all_metrics receives it (rlvr_pipeline.py:751): the rollout with max_len_mask's
    final_response_mask, and the reward and advantage stages' tensors (token_level_rewards, advantages,
    raw_advantages, returns) on the response tokens."""
    r = R.roll()
    cfg = R.pipeline_config(max_len_mask=True)
    batch, _ = r.F.get_sample_level_mask(rollout(seed), cfg)
    d = batch.batch
    g = torch.Generator().manual_seed(seed + 1)
    resp = d["response_mask"][:, 1:].float()
    n, w = resp.shape
    last = torch.zeros(n, w)
    for i in range(n):
        last[i, int(resp[i].nonzero().max())] = 1.0
    d["scores"] = torch.rand(n, generator=g) * 2 - 1                # a reward model's scores: no ties
    kl = 0.05 * torch.randn(n, w, generator=g) * resp
    d["token_level_rewards"] = d["scores"].unsqueeze(-1) * last - kl
    final = d["final_response_mask"].float()         # compute_advantage's response_mask (rlvr_pipeline.py:721)
    d["advantages"] = torch.randn(n, w, generator=g) * final
    d["raw_advantages"] = torch.randn(n, w, generator=g) * final
    d["returns"] = (torch.rand(n, w, generator=g) * 2 - 0.5) * final
    return batch


@proof("roll", trainer="rlvr", release=RELEASE, config=CFG_DEFAULT)
def test_driver_scores_rewards_and_lengths_are_over_the_batchs_sequences(p):
    """critic/score and critic/rewards (mean, max, min), token/response_length (mean, max), token/prompt_length
    mean: MetricsManager.add_values_metrics / add_token_metrics reduce one value per sequence over the whole batch
    at once (torch.mean/max/min; metrics_manager.py@v0.3.0:88-118, 206-212); rewards are each sequence's
    token_level_rewards summed (178), response lengths response_mask[:, 1:] summed (89-94)."""
    r = R.roll()
    batch = driver_batch()
    mgr = r.MetricsManager()
    mgr.add_all_metrics(0, batch)
    m = r.strip_tags(mgr.get_metrics())
    d = batch.batch
    scores = [float(x) for x in d["scores"].tolist()]
    p.check(len(set(scores)) == len(scores), f"scores {scores}: ties")
    resp = d["response_mask"][:, 1:].bool()
    rewards = [sum(s) for s in ragged(d["token_level_rewards"], resp)]
    for name, values in (("score", scores), ("rewards", rewards)):
        for stat in ("mean", "max", "min"):
            key = f"critic/{name}/{stat}"
            p.assert_stated(key, per_seq_observations(m[key], values), levels=DRIVER, tokens=("per_seq",),
                            stats=(stat,))
    p.check(not close(m["critic/rewards/mean"], m["critic/score/mean"]), "rewards are the scores: no KL term")
    lengths = [float(x) for x in RESP_LENS]
    p.check(lengths == [float(x) for x in resp.sum(-1).tolist()], "response_mask is not the rollout's lengths")
    for stat in ("mean", "max"):
        key = f"token/response_length/{stat}"
        p.assert_stated(key, per_seq_observations(m[key], lengths), levels=DRIVER, tokens=("per_seq",),
                        stats=(stat,))
    p.check(m["token/response_length/max"] == RESP_W, "the longest response is not the padded width")
    prompts = [float(x) for x in PROMPT_LENS]
    p.assert_stated("token/prompt_length/mean", per_seq_observations(m["token/prompt_length/mean"], prompts),
                    levels=DRIVER, tokens=("per_seq",))


@proof("roll", trainer="rlvr", release=RELEASE, config=CFG_DEFAULT)
def test_driver_advantages_and_returns_are_over_the_batchs_final_mask_tokens(p):
    """critic/advantages and critic/returns (mean, max, min): masked_mean and torch.max/min over the tokens of
    final_response_mask of the whole batch at once (metrics_manager.py@v0.3.0:217-220, 287-290): the responses
    max_len_mask left out are not in them."""
    r = R.roll()
    batch = driver_batch()
    mgr = r.MetricsManager()
    mgr.add_all_metrics(0, batch)
    m = r.strip_tags(mgr.get_metrics())
    d = batch.batch
    final = d["final_response_mask"].bool()
    p.check(bool((final != d["response_mask"][:, 1:].bool()).any()), "max_len_mask left no response out")
    for name in ("advantages", "returns"):
        seqs = [s for s in ragged(d[name], final) if s]
        p.check(len({len(s) for s in seqs}) > 3, f"{name}: the sequences are not ragged")
        for stat in ("mean", "max", "min"):
            key = f"critic/{name}/{stat}"
            p.assert_stated(key, token_observations(m[key], seqs), levels=DRIVER,
                            tokens=("token_mean", "seq_mean_token_mean", "seq_mean_token_sum"), stats=(stat,))
        everything = [v for s in ragged(d[name], d["response_mask"][:, 1:].bool()) for v in s]
        p.check(not close(m[f"critic/{name}/mean"], sum(everything) / len(everything)),
                f"critic/{name}/mean includes the masked responses' tokens")
