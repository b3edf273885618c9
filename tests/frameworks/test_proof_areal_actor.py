"""Fingerprint proofs of AReaL's PPO actor (issue 33 item 1): AReaL 1.0.4's own actor code from the installed wheel
(tests/_support/proofs_areal.py ``areal_actor``: PPOActorConfig with its defaults, PPOActor._compute_logp and
_compute_advantages, grpo_loss_fn with ppo_actor_loss_fn, filling the real stats_tracker) on a batch where the three
candidate log-probs differ at every token: the inference engine's (the rollout's ``logprobs``), the trainer's
recomputation before the update (``compute_logp``) and the policy being trained (each mini-batch's forward pass).

What runs, per simulated data-parallel rank (two, in threads; the tracker's own all-reduce at export):
* rl_trainer.py@v1.0.4:680-691: when ``config.should_compute_prox_logp()`` (the config's own method), the actor's
  ``_compute_logp`` (the engine's forward: the trainer's log-probs) is stored as ``prox_logp``;
* ``PPOActor._compute_advantages`` (actor.py:145-246): picks which log-probs are "old" and which are proximal;
* actor.py:356-402 (``_ppo_update``'s loop, under the scope ``ppo_actor`` its decorator opens): scope ``update``, one
  ``engine.train_batch(mb, loss_fn=partial(grpo_loss_fn, <the config's settings>))`` per mini-batch and the
  scalars it returns. Not run from the file: ``_ppo_update``'s mini-batch split
  (``split_padded_tensor_dict_into_mb_list``, whose balanced allocation needs seqpack's numba code): the proof splits
  the rank's batch into ``ppo_n_minibatches`` fixed groups of sequences, and ``_ppo_update``'s batch statistics
  (test_proof_areal.py proves those).
* The engine is the test's (:class:`Engine`, standing for FSDPEngine on a CPU): ``forward`` returns the trainer's
  recomputed log-probs, ``train_batch`` splits each mini-batch into micro-batches and calls the loss function with
  the trained policy's log-probs, which move after each mini-batch's optimizer step.

Asserted per configuration (the default; ``recompute_logprob``; ``use_decoupled_loss``; both; decoupled with
``prox_logp_method`` metrics and loglinear): which pair of policies ``approx_kl`` (log pi_theta - log pi_prox), the
importance weight (its avg, min and max: pi_theta / pi_prox), the clip ratio and the policy loss's ratio compare,
which log-prob ``old_logp`` logs, the reduction of approx_kl, clip_ratio and actor_loss (``p.assert_stated`` against
the mappings/areal.yaml entry trackbridge picks for the config), and that the approx_kl and clip_ratio entries
state a deviation exactly when the pair is not the trainer's own (pi_prox recomputed by the trainer). Decoupled PPO
with rejection sampling (behave_* statistics) is checked without a fingerprint: those keys are unmapped.
"""
from __future__ import annotations

import functools
import importlib.metadata
import math
import random

import pytest

try:            # the installed wheel (not find_spec: once loaded, `areal` is a skeleton package without a __spec__)
    importlib.metadata.distribution("areal")
except importlib.metadata.PackageNotFoundError:        # its package __init__ needs the GPU stack: not imported
    pytest.skip("make test installs areal==1.0.4 --no-deps", allow_module_level=True)
pytest.importorskip("colorlog", reason="make test installs colorlog (areal/utils/logging.py imports it)")

import torch  # noqa: E402

from _support.framework_code import run_ranks  # noqa: E402
from _support.proofs_areal import areal_actor, rank_stats_tracker  # noqa: E402
from _support.proven import proof  # noqa: E402

N_MINI = 2
# per rank: response lengths of its sequences (uneven), the mini-batches (sequence indices) and, inside each, the
# engine's micro-batches: uneven at every level so pooled, per-micro-batch, per-mini-batch and per-rank means differ
RESPONSES = [[3, 1, 5, 2, 4], [1, 2, 3, 2, 6, 1]]
PROMPT = 2
MINI = [[[0, 1], [2, 3, 4]], [[0, 1, 2, 3], [4, 5]]]
MICRO = {2: [[0], [1]], 3: [[0, 1], [2]], 4: [[0, 1, 2], [3]]}     # positions inside a mini-batch of n sequences


def _batch(rank: int, seed: int = 0) -> dict:
    """A rank's padded rollout batch as the workflow hands it to the trainer (rlvr.py: input_ids, attention_mask,
    loss_mask over the response tokens, the inference engine's ``logprobs`` at each token's own position, rewards,
    versions) and the two other policies at the shifted positions the trainer's forward returns: ``recomputed``
    (the trainer's log-probs before the update) and ``theta`` per mini-batch (after 0, 1 optimizer steps)."""
    rng = random.Random(33 + rank + 100 * seed)
    lens = RESPONSES[rank]
    width = PROMPT + max(lens) + 1                                   # + 1: every row is padded (no_eos irrelevant)
    bs = len(lens)
    attn = torch.zeros(bs, width, dtype=torch.long)
    loss_mask = torch.zeros(bs, width, dtype=torch.long)
    versions = torch.full((bs, width), -1, dtype=torch.long)
    for i, n in enumerate(lens):
        attn[i, :PROMPT + n] = 1
        loss_mask[i, PROMPT:PROMPT + n] = 1
        versions[i, PROMPT:PROMPT + n] = rng.choice([3, 4])        # generated by weights 3 or 4 steps old (loglinear)
    def table(lo: float, hi: float) -> torch.Tensor:
        return torch.tensor([[rng.uniform(lo, hi) for _ in range(width)] for _ in range(bs)])
    inference = -table(0.5, 2.5)                                    # at token positions (the rollout's logprobs)
    shifted = torch.roll(inference, shifts=-1, dims=-1)             # the same at the trainer's positions
    recomputed = shifted + table(-0.35, 0.35)                       # training vs inference numerics and staleness
    theta = [recomputed + table(-0.3, 0.3) * (k + 1) for k in range(N_MINI)]
    return {
        "input_ids": torch.arange(bs * width).view(bs, width), "attention_mask": attn, "loss_mask": loss_mask,
        "logprobs": inference * loss_mask, "rewards": torch.tensor([rng.choice([-1.0, 1.0]) for _ in lens]),
        "versions": versions, "_inference": shifted, "_recomputed": recomputed, "_theta": theta,
    }


class Engine:
    """The test's CPU stand-in for the train engine the actor is given (FSDPEngine's forward / train_batch): what
    the PPO actor calls on it, with the policies of :func:`_batch` as its model's outputs."""

    version = 5

    def __init__(self, batch: dict):
        self.batch = batch
        self.step = 0
        self.calls: list[dict] = []              # what each loss_fn call was given (the assertions' inputs)

    def eval(self) -> None:
        pass

    def train(self) -> None:
        pass

    def get_version(self) -> int:
        return self.version

    def forward(self, input_: dict, aggregate_fn=None) -> torch.Tensor:
        assert input_ is self.batch
        return self.batch["_recomputed"].clone()

    def train_batch(self, mb: dict, loss_fn, loss_weight_fn) -> dict:
        rows = mb["_rows"]
        for micro in MICRO[len(rows)]:
            sel = [rows[i] for i in micro]
            data = {k: v[sel] for k, v in mb["_full"].items() if torch.is_tensor(v) and v.dim() == 2}
            logprobs = self.batch["_theta"][self.step][sel].clone().requires_grad_()
            entropy = -logprobs.detach() * 0.5
            loss = loss_fn(logprobs, entropy, data)
            loss.backward()                      # the loss is a differentiable scalar of the policy's log-probs
            assert loss_weight_fn(data) == data["loss_mask"].count_nonzero()
            self.calls.append({"rows": sel, "mini": self.step, "theta": logprobs.detach(),
                               "mask": data["loss_mask"].bool(), "adv": data["advantages"]})
        self.step += 1
        return {"grad_norm": 1.5 + self.step, "lr": 1e-6, "update_successful": 1.0}


def run_actor(config: dict, seed: int = 0) -> tuple[list[dict], list[dict], list]:
    """Every rank's export, its batch (after compute_advantages) and engine calls, for the actor config ``config``
    (the proof's config, ``actor.`` keys), on the batches of ``seed``."""
    def rank(r: int):
        st = rank_stats_tracker()
        A = areal_actor(st)
        settings = {k.removeprefix("actor."): v for k, v in config.items()}
        if isinstance(settings.get("rejection_sampling"), dict):           # the nested config, as hydra builds it
            settings["rejection_sampling"] = A.RejectionSamplingConfig(**settings["rejection_sampling"])
        cfg = A.PPOActorConfig(**settings)
        batch = _batch(r, seed)
        engine = Engine(batch)
        actor = A.PPOActor(cfg, engine)
        if cfg.should_compute_prox_logp():                      # rl_trainer.py@v1.0.4:680-691
            batch["prox_logp"] = actor._compute_logp(batch)
        data = actor._compute_advantages(batch)
        with st.scope("ppo_actor"), st.scope("update"):         # ppo_update's decorator; actor.py:375
            current_version = engine.get_version()
            for rows in MINI[r]:                               # the mini-batches (see the module docstring)
                mb = {"_rows": rows, "_full": data}
                train_stat = engine.train_batch(
                    mb, loss_fn=functools.partial(
                        A.grpo_loss_fn, eps_clip=cfg.eps_clip, eps_clip_higher=cfg.eps_clip_higher,
                        c_clip=cfg.c_clip, rejection_sampling=cfg.rejection_sampling,
                        m2_threshold=actor.m2_threshold, importance_sampling_level=cfg.importance_sampling_level,
                        current_version=current_version, prox_logp_method=cfg.prox_logp_method,
                        use_sapo_loss=cfg.use_sapo_loss, sapo_tau_pos=cfg.sapo_tau_pos,
                        sapo_tau_neg=cfg.sapo_tau_neg, use_decoupled_loss=cfg.use_decoupled_loss),
                    loss_weight_fn=lambda x: x["loss_mask"].count_nonzero())
                st.scalar(**train_stat)
        return st.export(reduce_group="dp"), batch, engine.calls

    areal_actor(rank_stats_tracker())                   # load the wheel's files once, before the rank threads
    out = run_ranks(rank)
    return [o[0] for o in out], [o[1] for o in out], [o[2] for o in out]


def policies(batch: dict, call: dict) -> dict[str, torch.Tensor]:
    """The candidate log-probs of one loss_fn call's tokens (trainer positions): theta, recomputed, inference; and
    the log-linear interpolation between inference and theta by the tokens' versions
    (compute_prox_logp_approximations' documented formula, the loglinear candidate, with the versions as the loss
    function receives them: compute_advantages shifts the log-probs, not the versions)."""
    rows = call["rows"]
    inference = batch["_inference"][rows]
    versions = batch["versions"][rows].float()
    v_theta, v_prox = float(Engine.version), float(Engine.version - 1)
    alpha = torch.where(versions >= 0, (v_prox - versions) / (v_theta - versions), 0.0).clamp(0, 1)
    theta = call["theta"]
    return {"theta": theta, "recomputed": batch["_recomputed"][rows], "inference": inference,
            "loglinear": inference + alpha * (theta - inference)}


def token_steps(batches, calls, fn) -> list:
    """fingerprint's nesting [step][mini-batch][rank][micro-batch] -> sequences of token values of fn(policies,
    call) over each call's valid tokens."""
    minis = []
    for m in range(N_MINI):
        ranks = []
        for r, (batch, rank_calls) in enumerate(zip(batches, calls)):
            micro = []
            for call in [c for c in rank_calls if c["mini"] == m]:
                vals = fn(policies(batch, call), call)
                micro.append([[float(v) for v in vals[i][call["mask"][i]]] for i in range(len(call["rows"]))])
            ranks.append(micro)
        minis.append(ranks)
    return [minis]


def pooled(steps, stat=sum) -> float:
    vals = [v for mini in steps[0] for rank in mini for micro in rank for seq in micro for v in seq]
    return stat(vals) / len(vals) if stat is sum else stat(vals)


def clipped(ratio: torch.Tensor, adv: torch.Tensor, eps: float = 0.2) -> torch.Tensor:
    """The PPO clip condition of a ratio (the clipped side binds: A > 0 and r > 1 + eps, A < 0 and r < 1 - eps)."""
    return ((adv > 0) & (ratio > 1 + eps)) | ((adv < 0) & (ratio < 1 - eps))


CANDIDATES = ("recomputed", "inference", "loglinear")


def prove_pair(p, config: dict, prox: str, old: str) -> None:
    """The actor's statistics under ``config`` compare theta with ``prox``; ``old_logp`` logs ``old``."""
    exports, batches, calls = run_actor(config)
    p.check(exports[0] == exports[1], "after the all-reduce every rank exports the same values")
    logged = exports[0]
    others = [c for c in CANDIDATES if c != prox]
    # the batch tells the pairs apart: every candidate's log-ratio differs from the others' at every token
    kl = {c: token_steps(batches, calls, lambda P, _c, c=c: P["theta"] - P[c]) for c in CANDIDATES}
    for c in others:
        p.check(not math.isclose(pooled(kl[c]), pooled(kl[prox]), rel_tol=1e-3),
                f"the candidates {c} and {prox} give different approx_kl on this batch")
    # approx_kl: log pi_theta - log pi_prox, token mean pooled over the step (the entry's stated reduction)
    key = "ppo_actor/update/approx_kl/avg"
    p.check(math.isclose(logged[key], pooled(kl[prox]), rel_tol=1e-5), f"{key} is log pi_theta - log pi_{prox}")
    for c in others:
        p.check(not math.isclose(logged[key], pooled(kl[c]), rel_tol=1e-4), f"{key} is not theta - {c}")
    p.assert_stated(key, logged[key], kl[prox], levels=("micro_batches", "mini_batches", "processes"))
    p.check(math.isclose(logged["ppo_actor/update/approx_kl/max"], pooled(kl[prox], max), rel_tol=1e-5)
            and math.isclose(logged["ppo_actor/update/approx_kl/min"], pooled(kl[prox], min), rel_tol=1e-5),
            "approx_kl/max and /min are the extremes of the same log-ratio over every token of every rank")
    # the sign and the mapping's statement of the pair: approx_kl logs log pi_theta - log pi_prox, the entry's
    # transform scale -1 turns it into the k1 estimate of KL(pi_prox || pi_theta); a deviation exactly when the
    # pair is not the trainer's own (pi_prox recomputed by the trainer)
    entry, res = p.entry(key)
    p.check(entry.scale == -1.0, f"{key}: the entry states scale -1 (the value is log pi_theta - log pi_prox)")
    stated_deviation = res.fields.get("deviation", "none") != "none"
    p.check(stated_deviation == (prox != "recomputed"),
            f"{key} under {config}: pi_prox is the {prox} log-prob; the entry ({entry.file}:{entry.line}) "
            f"{'states' if stated_deviation else 'states no'} deviation")
    # importance weight: pi_theta / pi_prox (avg, min, max; the entries are unmapped: no reduction to fingerprint)
    iw = {c: token_steps(batches, calls, lambda P, _c, c=c: torch.exp(P["theta"] - P[c])) for c in CANDIDATES}
    for suffix, stat in (("avg", sum), ("max", max), ("min", min)):
        k = f"ppo_actor/update/importance_weight/{suffix}"
        p.check(math.isclose(logged[k], pooled(iw[prox], stat), rel_tol=1e-5), f"{k} is pi_theta / pi_{prox}")
    for c in others:
        p.check(not math.isclose(logged["ppo_actor/update/importance_weight/avg"], pooled(iw[c]), rel_tol=1e-4),
                f"importance_weight is not pi_theta / pi_{c}")
    # clip ratio: the fraction of tokens whose ratio pi_theta / pi_prox is clipped (eps_clip 0.2, the default)
    clip = {c: token_steps(batches, calls, lambda P, call, c=c: clipped(torch.exp(P["theta"] - P[c]),
                                                                       call["adv"]).float())
            for c in CANDIDATES}
    key = "ppo_actor/update/clip_ratio/avg"
    p.check(math.isclose(logged[key], pooled(clip[prox]), rel_tol=1e-6), f"{key} clips pi_theta / pi_{prox}")
    for c in others:
        if pooled(clip[c]) != pooled(clip[prox]):
            p.check(logged[key] != pooled(clip[c]), f"{key} is not the clip fraction of pi_theta / pi_{c}")
    p.check(len({pooled(clip[c]) for c in CANDIDATES}) > 1, "the clip fractions of the candidates differ")
    entry, res = p.entry(key)
    stated_deviation = res.fields.get("deviation", "none") != "none"
    p.check(stated_deviation == (prox != "recomputed"),
            f"{key} under {config}: the ratio's pi_prox is the {prox} log-prob; the entry ({entry.file}:{entry.line}) "
            f"{'states' if stated_deviation else 'states no'} deviation")
    # a fraction of 0/1 values: one batch leaves candidate reductions equal, so the fingerprint observes three
    observed = [(logged[key], clip[prox])]
    for seed in (1, 2):
        ex, bs, cs = run_actor(config, seed)
        observed.append((ex[0][key], token_steps(bs, cs, lambda P, call: clipped(torch.exp(P["theta"] - P[prox]),
                                                                                  call["adv"]).float())))
    p.assert_stated(key, observed, levels=("micro_batches", "mini_batches", "processes"))
    # actor_loss: the per-token clipped surrogate max(-A r, -A clip(r, 1 - eps, 1 + eps)) of r = pi_theta / pi_prox
    def surrogate(P, call, c):
        r = torch.exp(P["theta"] - P[c])
        return torch.maximum(-call["adv"] * r, -call["adv"] * r.clamp(0.8, 1.2))
    loss = {c: token_steps(batches, calls, lambda P, call, c=c: surrogate(P, call, c)) for c in CANDIDATES}
    key = "ppo_actor/update/actor_loss/avg"
    p.check(math.isclose(logged[key], pooled(loss[prox]), rel_tol=1e-5), f"{key}: surrogate of pi_theta / pi_{prox}")
    for c in others:
        p.check(not math.isclose(logged[key], pooled(loss[c]), rel_tol=1e-4), f"{key} is not the surrogate of {c}")
    p.assert_stated(key, logged[key], loss[prox], levels=("micro_batches", "mini_batches", "processes"))
    # old_logp: which log-prob the loss's "old" is (pi_behave under the decoupled loss)
    olds = {c: token_steps(batches, calls, lambda P, _c, c=c: P[c]) for c in ("recomputed", "inference")}
    p.check(math.isclose(logged["ppo_actor/update/old_logp/avg"], pooled(olds[old]), rel_tol=1e-5),
            f"old_logp logs the {old} log-prob")
    p.check(math.isclose(logged["ppo_actor/update/new_logp/avg"],
                         pooled(token_steps(batches, calls, lambda P, _c: P["theta"])), rel_tol=1e-5),
            "new_logp logs the trained policy's log-prob")
    p.check("ppo_actor/update/behave_approx_kl/avg" not in logged,
            "no behave_* statistics without rejection_sampling (its default None)")


BASE = {"actor.ppo_n_minibatches": N_MINI}


@proof("areal", trainer="ppo", release="1.0.4", config=BASE)
def test_areal_default_config_compares_the_policy_with_the_inference_engine(p):
    """The defaults (recompute_logprob and use_decoupled_loss false): no recomputation; compute_advantages sets
    prox_logp to the inference engine's log-probs (actor.py@v1.0.4:186-191), so approx_kl, the importance weight
    and the clip ratio compare the trained policy with the inference engine."""
    prove_pair(p, BASE, prox="inference", old="inference")


@proof("areal", trainer="ppo", release="1.0.4", config={**BASE, "actor.recompute_logprob": True})
def test_areal_recompute_logprob_compares_the_policy_with_the_trainers_old_policy(p):
    """recompute_logprob: the trainer's own log-probs (compute_logp) replace the inference engine's as old and
    proximal (actor.py@v1.0.4:177-184)."""
    prove_pair(p, {**BASE, "actor.recompute_logprob": True}, prox="recomputed", old="recomputed")


@proof("areal", trainer="ppo", release="1.0.4", config={**BASE, "actor.use_decoupled_loss": True})
def test_areal_decoupled_loss_compares_the_policy_with_the_recomputed_proximal_policy(p):
    """use_decoupled_loss (recompute_logprob false): should_compute_prox_logp recomputes anyway (cli_args.py@v1.0.4:
    1598-1609); approx_kl and the ratio compare with that proximal policy, old_logp stays the inference engine's."""
    prove_pair(p, {**BASE, "actor.use_decoupled_loss": True}, prox="recomputed", old="inference")


@proof("areal", trainer="ppo", release="1.0.4",
       config={**BASE, "actor.use_decoupled_loss": True, "actor.recompute_logprob": True})
def test_areal_decoupled_loss_with_recompute_logprob(p):
    """Both set: the decoupled loss decides (compute_advantages' branch needs `not use_decoupled_loss`)."""
    prove_pair(p, {**BASE, "actor.use_decoupled_loss": True, "actor.recompute_logprob": True},
               prox="recomputed", old="inference")


def test_recompute_logprob_false_explicitly_is_the_default():
    """recompute_logprob and use_decoupled_loss written false: the same statistics as the defaults."""
    a, _, _ = run_actor(BASE)
    b, _, _ = run_actor({**BASE, "actor.recompute_logprob": False, "actor.use_decoupled_loss": False})
    assert a[0]["ppo_actor/update/approx_kl/avg"] == pytest.approx(b[0]["ppo_actor/update/approx_kl/avg"])
    assert a[0] == b[0]


LOGLINEAR = {**BASE, "actor.use_decoupled_loss": True, "actor.prox_logp_method": "loglinear"}


@proof("areal", trainer="ppo", release="1.0.4", config=LOGLINEAR)
def test_areal_decoupled_loglinear_compares_the_policy_with_an_interpolated_proximal_policy(p):
    """prox_logp_method loglinear: no forward pass (should_compute_prox_logp false); grpo_loss_fn's
    _resolve_proximal_logp interpolates pi_prox between the inference engine's log-prob and pi_theta by the tokens'
    versions (compute_prox_logp_approximations): approx_kl is (1 - alpha) (log pi_theta - log pi_behave), neither
    the trainer's recomputed policy nor the inference engine's."""
    prove_pair(p, LOGLINEAR, prox="loglinear", old="inference")


METRICS = {**BASE, "actor.use_decoupled_loss": True, "actor.prox_logp_method": "metrics"}


@proof("areal", trainer="ppo", release="1.0.4", config=METRICS)
def test_areal_decoupled_metrics_trains_on_the_recomputed_proximal_policy(p):
    """prox_logp_method metrics: recomputes as 'recompute' does and logs the approximations beside; approx_kl and
    the ratio still compare with the recomputed proximal policy."""
    prove_pair(p, METRICS, prox="recomputed", old="inference")


REJECT = {**BASE, "actor.use_decoupled_loss": True,
          "actor.rejection_sampling": {"level": "token", "action": "mask", "metric": "ratio", "upper": 1.15}}


def test_areal_rejection_sampling_behave_statistics_compare_the_proximal_policy_with_the_inference_engine():
    """Decoupled PPO with token-level rejection sampling (mask, ratio pi_prox / pi_behave above 1.15): the behave_*
    statistics compare the recomputed proximal policy with the inference engine's over the tokens kept
    (denominator unclipped_behave_tokens); approx_kl still pools every valid token (grpo_loss_fn's denominator is
    the loss mask before rejection), while the importance weight and the clip mask of a rejected token are 0 and
    still counted in that denominator. Not a fingerprint proof: the behave_* and importance_weight keys are
    unmapped (no reduction stated)."""
    exports, batches, calls = run_actor(REJECT)
    logged = exports[0]
    assert exports[0] == exports[1]
    log_ratio = token_steps(batches, calls, lambda P, _c: P["recomputed"] - P["inference"])
    flat = [v for mini in log_ratio[0] for rank in mini for micro in rank for seq in micro for v in seq]
    kept = [v for v in flat if math.exp(v) <= 1.15]
    assert 0 < len(kept) < len(flat), "the batch has tokens rejection sampling keeps and tokens it rejects"
    assert logged["ppo_actor/update/unclipped_behave_tokens"] == len(kept)
    assert logged["ppo_actor/update/behave_approx_kl/avg"] == pytest.approx(sum(kept) / len(kept), rel=1e-5)
    assert logged["ppo_actor/update/behave_approx_kl/avg"] != pytest.approx(sum(flat) / len(flat), rel=1e-3)
    assert logged["ppo_actor/update/behave_imp_weight/avg"] == pytest.approx(
        sum(math.exp(v) for v in kept) / len(kept), rel=1e-5)
    assert logged["ppo_actor/update/behave_imp_weight/max"] == pytest.approx(math.exp(max(kept)), rel=1e-5)
    # approx_kl: theta - prox over every valid token, the rejected ones included
    kl = token_steps(batches, calls, lambda P, _c: P["theta"] - P["recomputed"])
    assert logged["ppo_actor/update/approx_kl/avg"] == pytest.approx(pooled(kl), rel=1e-5)
    # importance weight: exp(theta - prox) on the kept tokens, 0 on the rejected, over every valid token
    keep = lambda P: torch.exp(P["recomputed"] - P["inference"]) <= 1.15       # noqa: E731
    iw = token_steps(batches, calls, lambda P, _c: torch.where(keep(P), torch.exp(P["theta"] - P["recomputed"]), 0.0))
    iw_kept_only = [v for mini in iw[0] for rank in mini for micro in rank for seq in micro for v in seq if v != 0.0]
    assert logged["ppo_actor/update/importance_weight/avg"] == pytest.approx(pooled(iw), rel=1e-5)
    assert logged["ppo_actor/update/importance_weight/avg"] < sum(iw_kept_only) / len(iw_kept_only)
    assert logged["ppo_actor/update/importance_weight/min"] == 0.0, "a rejected token's ratio is logged as 0"
    clip = token_steps(batches, calls, lambda P, call: (keep(P) & clipped(torch.exp(P["theta"] - P["recomputed"]),
                                                                           call["adv"])).float())
    assert logged["ppo_actor/update/clip_ratio/avg"] == pytest.approx(pooled(clip), rel=1e-6)


DUAL = {**BASE, "actor.c_clip": 1.05}


@proof("areal", trainer="ppo", release="1.0.4", config=DUAL)
def test_areal_dual_clip_ratio_is_the_token_fraction_over_every_rank(p):
    """dual_clip_ratio (actor.c_clip set): the fraction of valid tokens whose loss the dual clip bounds (A < 0 and
    max(-A r, -A clip(r)) above c_clip |A|), a token mean pooled over micro-batches, mini-batches and ranks; three
    batches (a fraction of 0/1 values: one batch leaves candidate reductions equal)."""
    key = "ppo_actor/update/dual_clip_ratio/avg"

    def dual(P, call):
        r = torch.exp(P["theta"] - P["inference"])           # the default config's ratio (pi_prox: inference)
        adv = call["adv"]
        loss = torch.maximum(-adv * r, -adv * r.clamp(0.8, 1.2))
        return ((adv < 0) & (1.05 * adv.abs() < loss)).float()
    observed = []
    for seed in (0, 1, 2):
        exports, batches, calls = run_actor(DUAL, seed)
        p.check(exports[0] == exports[1], "after the all-reduce every rank exports the same values")
        observed.append((exports[0][key], token_steps(batches, calls, dual)))
    p.check(all(0 < v < 1 for v, _ in observed), f"{key}: {[v for v, _ in observed]} (0 or 1 would be weak)")
    p.assert_stated(key, observed, levels=("micro_batches", "mini_batches", "processes"))
