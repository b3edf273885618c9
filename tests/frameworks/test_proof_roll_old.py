"""Fingerprints of ROLL's RLVR actor metrics of v0.1.0..v0.1.3 (actor/pg_loss, total_loss, kl_loss, approxkl,
policykl, clipfrac), by ROLL v0.1.3's own code vendored from the tag (tests/_support/proofs_roll_old.py says what
is loaded, what is compiled from the files' text and what stands in).

What the code does at v0.1.3 (the entries' ``actor_mean`` profile): loss_func (actor_worker.py@v0.1.3:11-196)
computes each metric with ``agg_loss`` over the micro-batch it was given alone (functionals.py@v0.1.3:212 agg_loss: the
loss_agg_mode mean of that micro-batch, no global token or sample count); DeepSpeedTrainStrategy.train_step
(deepspeed_strategy.py@v0.1.3:401-461) appends one value per micro-batch; ActorWorker.train_step
(base_worker.py@v0.1.3:73-118) appends each backward batch's lists; the pipeline joins the ranks' lists
(DataProto.concat) and ``add_reduced_metrics`` -> ``reduce_metrics`` takes np.mean of them all
(rlvr_pipeline.py@v0.1.3:714-717, functionals.py@v0.1.3:352 reduce_metrics): an unweighted mean of micro-batch means
over the micro-batches, optimizer steps and ranks (every rank has as many micro-batches, so the mean of all is the
mean over the ranks of each rank's mean).

The per-token values each logged value is compared with come from what ROLL's code was given or computed in that
run (the micro-batches loss_func received, the log-probs op_compute_log_probs returned for them), as
tests/frameworks/test_proof_roll.py does for v0.3.0.
"""
from __future__ import annotations

import math

import pytest

pytest.importorskip("torch")
pytest.importorskip("tensordict")

import torch  # noqa: E402

from _support import proofs_roll_old as R  # noqa: E402
from _support.framework_code import run_ranks  # noqa: E402
from _support.proven import proof  # noqa: E402

RELEASE = R.RELEASE
WORLD, PER_DEVICE, GA, VOCAB = 2, 2, 2, 11
PROMPT_W, RESP_W = 4, 7
ACTOR = ("micro_batches", "mini_batches", "processes")
#: response lengths of the 16 samples: uneven within and across micro-batches, optimizer steps and ranks
RESP_LENS = [1, 7, 3, 6, 2, 5, 7, 1, 4, 6, 2, 3, 7, 5, 1, 4]
PROMPT_LENS = [4, 2, 3, 1, 4, 3, 2, 4, 1, 3, 4, 2, 3, 1, 2, 4]


def rollout(seed: int = 0):
    """A rollout batch as the pipeline hands it to actor_train (left-padded prompts, right-padded responses,
    ``response_mask`` over the full width, old / reference log-probs and advantages per token, ``scores``), with
    ``final_response_mask`` from v0.1.3's get_sample_level_mask (rlvr_pipeline.py@v0.1.3:625-626)."""
    r = R.roll()
    n = len(RESP_LENS)
    g = torch.Generator().manual_seed(seed)
    width = PROMPT_W + RESP_W
    input_ids = torch.zeros(n, width, dtype=torch.long)
    attention = torch.zeros(n, width, dtype=torch.long)
    response_mask = torch.zeros(n, width, dtype=torch.long)
    prompt_mask = torch.zeros(n, width, dtype=torch.long)
    responses = torch.zeros(n, RESP_W, dtype=torch.long)
    for i, (pl, rl) in enumerate(zip(PROMPT_LENS, RESP_LENS)):
        toks = torch.randint(1, VOCAB, (pl + rl,), generator=g)
        input_ids[i, PROMPT_W - pl:PROMPT_W + rl] = toks
        attention[i, PROMPT_W - pl:PROMPT_W + rl] = 1
        prompt_mask[i, PROMPT_W - pl:PROMPT_W] = 1
        response_mask[i, PROMPT_W:PROMPT_W + rl] = 1
        responses[i, :rl] = toks[pl:]
    position_ids = (attention.cumsum(-1) - 1).clamp(min=0)
    base = -math.log(VOCAB)
    valid = attention[:, 1:]
    old = (base + 0.4 * (torch.rand(n, width - 1, generator=g) - 0.5)) * valid
    ref = (base + 0.6 * (torch.rand(n, width - 1, generator=g) - 0.5)) * valid
    adv = torch.randn(n, width - 1, generator=g) * response_mask[:, 1:]
    scores = torch.tensor([float(x) for x in torch.randint(0, 2, (n,), generator=g)])
    td = {"input_ids": input_ids, "attention_mask": attention, "position_ids": position_ids,
          "response_mask": response_mask, "prompt_mask": prompt_mask, "responses": responses,
          "old_log_probs": old, "ref_log_probs": ref, "advantages": adv, "scores": scores}
    return r.DataProto.from_dict(tensors=td, meta_info={"global_step": 0, "is_offload_states": False})


def run_actor(cfg, seed: int = 0):
    """One training step of actor_train on WORLD ranks: (logged metrics, the ranks)."""
    r = R.roll()
    batch = rollout(seed)
    batch, _ = r.F.get_sample_level_mask(batch, cfg)
    chunks = batch.chunk(chunks=WORLD)
    wcfg = R.worker_config(PER_DEVICE, GA)
    ranks = [R.ActorRank(i, WORLD, cfg, wcfg, VOCAB) for i in range(WORLD)]
    outputs = run_ranks(lambda i: ranks[i].train_step(chunks[i]), world=WORLD)
    return R.pipeline_reduce(outputs), ranks


def micro_layout(ranks, micros_per_step: int) -> list:
    """The recorded loss_func calls as [optimizer step][rank][micro-batch]."""
    n = {len(rk.calls) for rk in ranks}
    assert len(n) == 1 and n.pop() % micros_per_step == 0, [len(rk.calls) for rk in ranks]
    steps = len(ranks[0].calls) // micros_per_step
    return [[rk.calls[m * micros_per_step:(m + 1) * micros_per_step] for rk in ranks] for m in range(steps)]


def token_steps(layout, per_token, mask_key: str) -> list:
    """[[ [rank][micro][seq] = the valid tokens' values ]] of ``per_token(call)``, read where ``mask_key`` is set."""
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
    d = call["log_probs"] - call["data"].batch["ref_log_probs"]
    return (-d).exp() + d - 1


def clip_binds(call, clip: float = 0.2):
    a = call["data"].batch["advantages"]
    ratio = log_ratio(call).exp()
    return (ratio.clamp(1 - clip, 1 + clip) * a < ratio * a).float()


def check_actor(p, m, ranks, cfg):
    layout = micro_layout(ranks, GA)
    p.check(len(layout) >= 2 and all(len(mini) == WORLD for mini in layout), "fewer than 2 optimizer steps or ranks")
    kw = {"levels": ACTOR}
    p.assert_stated("actor/pg_loss", m["actor/pg_loss"], token_steps(layout, ppo_loss, "final_response_mask"), **kw)
    p.assert_stated("actor/kl_loss", m["actor/kl_loss"], token_steps(layout, k3, "final_response_mask"), **kw)
    p.check(m["actor/kl_loss"] > 0, "k3 is non-negative")
    coef = cfg.kl_loss_coef if cfg.use_kl_loss else 0.0
    total = token_steps(layout, lambda c: ppo_loss(c) + coef * k3(c), "final_response_mask")
    p.assert_stated("actor/total_loss", m["actor/total_loss"], total, **kw)
    approx = token_steps(layout, lambda c: 0.5 * log_ratio(c) ** 2, "response_mask")
    p.assert_stated("actor/approxkl", m["actor/approxkl"], approx, **kw)
    p.assert_stated("actor/policykl", m["actor/policykl"], token_steps(layout, log_ratio, "response_mask"), **kw)
    p.assert_stated("actor/clipfrac", m["actor/clipfrac"], token_steps(layout, clip_binds, "response_mask"), **kw)
    p.check(0 < m["actor/clipfrac"] < 1, f"clipfrac {m['actor/clipfrac']}: the batch clips all or none")


CFG_DEFAULT = {"loss_agg_mode": "seq-mean-token-mean", "use_kl_loss": True, "kl_loss_coef": 0.1, "ppo_epochs": 1}
CFG_TOKEN_MEAN = {**CFG_DEFAULT, "loss_agg_mode": "token-mean"}


@proof("roll", trainer="rlvr", release=RELEASE, config=CFG_DEFAULT)
def test_actor_losses_v013_default_mode_are_micro_batch_sequence_means_averaged(p):
    """seq-mean-token-mean (the default, base_config.py@v0.1.3:394-395): each micro-batch's mean of its sequences'
    token means, np.mean'ed over every micro-batch of every optimizer step and rank."""
    cfg = R.pipeline_config(**CFG_DEFAULT)
    m, ranks = run_actor(cfg)
    check_actor(p, m, ranks, cfg)


@proof("roll", trainer="rlvr", release=RELEASE, config=CFG_TOKEN_MEAN)
def test_actor_losses_v013_token_mean_are_micro_batch_token_means_averaged(p):
    """token-mean: each micro-batch's token mean, np.mean'ed over every micro-batch of every optimizer step and
    rank (unweighted: a micro-batch of few tokens counts as much as one of many)."""
    cfg = R.pipeline_config(**CFG_TOKEN_MEAN)
    m, ranks = run_actor(cfg)
    check_actor(p, m, ranks, cfg)
