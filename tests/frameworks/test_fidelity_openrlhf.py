"""OpenRLHF fidelity claims corrected in issue 11 (items 1 and 2), each shown by running OpenRLHF's own code from
the installed wheel (loaded by file, tests/_support/framework_code.py: its package __init__ files need DeepSpeed, peft
and vLLM) on a small batch, and each checked against mappings/openrlhf.yaml's stated reductions through trackbridge's
loader and fidelity engine (tests/_support/openrlhf_marks.py: the mark computed for a release and config).

1. DPO / RM ``acc``, ``chosen_reward``, ``reject_reward``: ``fit`` builds ``logs_dict`` from the micro-batch just
   trained, averages it over the data-parallel ranks (``strategy.all_reduce``) and hands it to the trackers only
   when ``step % accumulated_gradient == 0``: the last micro-batch of the window, not the window's mean
   (dpo_trainer.py / rm_trainer.py at v0.11.2; one micro-batch per window in every release since v0.0.1). KTO
   (v0.1.9 - v0.9.5, no longer in the wheel) does the same and writes 0 on a rank with no desirable (undesirable)
   example: source-only, kto_trainer.py@v0.9.5.
2. PPO ``entropy_loss`` and ``kl`` (with ``algo.kl.use_loss``): ``aggregate_loss(..., **loss_batch_info)`` divides
   the micro-batch's masked sum by a global token count (v0.10.3: the micro-batch's tokens over the DP ranks;
   v0.10.4+: the optimizer step's tokens / accumulation), times the DP size, and ``ppo_train`` then weights that
   by the micro-batch's local tokens: micro-batches of 1 and 3 tokens with values 1 and 2 log 2.375 where the
   token mean is 1.750. Up to v0.10.2 the value was ``masked_mean`` per micro-batch: the token mean.
"""
from __future__ import annotations

import os
import types
from pathlib import Path

import pytest

from trackbridge.pipeline import Translator  # noqa: E402
from trackbridge.schema.loader import load_registry  # noqa: E402

from _support import framework_code as F  # noqa: E402
from _support.openrlhf_marks import judged, tags  # noqa: E402

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def reg():
    return load_registry()


@pytest.fixture(scope="module")
def o():
    try:
        return F.openrlhf()
    except ImportError as e:            # pragma: no cover - make test installs openrlhf --no-deps
        pytest.skip(f"openrlhf not loadable: {e}")


def _canon(reg, spec, row, config=None):
    return Translator(spec, "canonical", registry=reg, config=config).translate(row)


def close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-6 * max(1.0, abs(a), abs(b))


# =============================================================================================== item 2: PPO actor
def _ppo_run(o, per_rank: list[list[tuple[int, float, float]]], gas: int, *, use_kl_loss: bool = False) -> dict:
    """OpenRLHF's ``ActorPPOTrainer.ppo_train`` + ``training_step`` (the wheel's source) on ``len(per_rank)``
    simulated ranks. ``per_rank[r]`` lists rank r's micro-batches, one sequence each: (response tokens, entropy of
    every token, log-prob of every token under the current policy; the reference's is 0 and the old policy's is the
    current one). The actor's forward returns those; DeepSpeed's backward/step are no-ops; its ``all_reduce`` (mean
    over ranks) is simulated. Returns rank 0's ``status_mean``: what ppo_trainer logs."""
    width = max(n for rank in per_rank for n, _, _ in rank)

    def experience(n: int, ent: float, logp: float):
        mask = torch.zeros(1, width, dtype=torch.bool)
        mask[0, :n] = True
        e = o.Experience(sequences=torch.full((1, 2 + width), 5), attention_mask=torch.ones(1, 2 + width),
                         action_mask=mask, action_log_probs=torch.full((1, width), logp) * mask,
                         base_action_log_probs=torch.zeros(1, width), advantages=torch.ones(1, width) * mask,
                         response_length=torch.tensor([float(n)]), truncated=torch.tensor([0.0]),
                         info={"reward": [1.0]})
        e._entropy = torch.full((1, width), ent) * mask
        e._logp = torch.full((1, width), logp) * mask
        return e

    def rank(r: int) -> dict:
        exps = [experience(*mb) for mb in per_rank[r]]
        by_id = {id(e.sequences): e for e in exps}

        class Actor:
            def train(self):
                pass

            def __call__(self, sequences, action_mask, **kw):
                e = by_id[id(sequences)]
                return e._logp.clone(), types.SimpleNamespace(entropy=e._entropy.clone())

        strategy = F.openrlhf_strategy(r, gas)
        args = types.SimpleNamespace(
            train=types.SimpleNamespace(dynamic_batch_enable=False), ds=types.SimpleNamespace(tensor_parallel_size=1),
            actor=types.SimpleNamespace(entropy_coef=0.0, aux_loss_coef=0.0, loss_agg_mode="token-mean"),
            algo=types.SimpleNamespace(kl=types.SimpleNamespace(use_loss=use_kl_loss, init_coef=0.04,
                                                                 estimator="k1", unbiased_gradient=False)))
        trainer = types.SimpleNamespace(
            args=args, strategy=strategy, replay_buffer=F.openrlhf_buffer(exps), dataloader_pin_memory=False,
            max_epochs=1,
            actor=Actor(), actor_loss_fn=o.PolicyLoss(clip_eps_low=0.2, clip_eps_high=0.2), aux_loss=False,
            ema_model=None, actor_optim=None, actor_scheduler=types.SimpleNamespace(get_last_lr=lambda: [1e-6]))
        trainer.training_step = types.MethodType(o.training_step, trainer)
        real = torch.cuda.current_device
        torch.cuda.current_device = lambda: "cpu"          # ppo_train moves experiences to the GPU
        try:
            torch.manual_seed(0)                           # the DataLoader may shuffle (order does not matter here)
            return o.ppo_train(trainer, kl_ctl=0.04)
        finally:
            torch.cuda.current_device = real

    return F.run_ranks(rank, world=len(per_rank))[0]


def _token_mean(per_rank, col: int) -> float:
    """The token mean over every rank and micro-batch (col 1: entropy, col 2: log-prob, whose k1 KL against a
    reference log-prob of 0 is the log-prob itself)."""
    mbs = [mb for rank in per_rank for mb in rank]
    return sum(mb[0] * mb[col] for mb in mbs) / sum(mb[0] for mb in mbs)


# micro-batches of 1 and 3 response tokens; entropy 1 then 2 (the example), log-prob 0.5 then 0.25
SHORT, LONG = (1, 1.0, 0.5), (3, 2.0, 0.25)


def test_window_normaliser_reweighted_by_local_tokens(o):
    """v0.10.4 - v0.11.2: one rank, gradient accumulation 2, micro-batches of 1 and 3 tokens. aggregate_loss gives
    1 / (4 / 2) = 0.5 and 6 / (4 / 2) = 3.0; ppo_train weights them by 1 and 3 tokens: (0.5 + 9) / 4 = 2.375, where
    the token mean is 7 / 4 = 1.750. Same for the KL loss term (k1, use_loss)."""
    per_rank = [[SHORT, LONG]]
    logged = _ppo_run(o, per_rank, gas=2, use_kl_loss=True)
    assert close(_token_mean(per_rank, 1), 1.75)
    assert close(logged["entropy_loss"], 2.375), logged
    kl_mean = _token_mean(per_rank, 2)                                     # (0.5 + 0.75) / 4 = 0.3125
    assert not close(logged["kl"], kl_mean)
    assert close(logged["kl"], (1 * (0.5 / 2) + 3 * (0.75 / 2)) / 4), logged     # the same re-weighting: 0.34375
    # what the loss really optimises: the micro-batch terms, scaled 1/gas by DeepSpeed, add up to the token mean
    info = {"dp_size": 1, "batch_num_tokens": torch.tensor(4.0 / 2), "global_batch_size": torch.tensor(2.0 / 2)}
    terms = [o.aggregate_loss(torch.full((1, n), v), torch.ones(1, n, dtype=torch.bool), **info).item()
             for n, v, _ in per_rank[0]]
    assert close(terms[0], 0.5) and close(terms[1], 3.0) and close(sum(terms) / 2, 1.75)


def test_window_normaliser_is_what_iter_grad_accum_global_norm_hands_out(o):
    """The normaliser of each micro-batch: the window's response tokens / gas (and sequences / gas)."""
    masks = [torch.tensor([[1, 0, 0]], dtype=torch.bool), torch.tensor([[1, 1, 1]], dtype=torch.bool)]
    strategy = types.SimpleNamespace()
    lu = o.loss_utils
    saved = lu.dist
    lu.dist = types.SimpleNamespace(is_available=lambda: True, is_initialized=lambda: False)   # one process
    try:
        out = list(lu.iter_grad_accum_global_norm(iter(masks), strategy, 2, lambda m: m))
    finally:
        lu.dist = saved
    assert [float(info["batch_num_tokens"]) for _, info in out] == [2.0, 2.0]
    assert [info["dp_size"] for _, info in out] == [1, 1]


def test_equal_micro_batches_log_the_token_mean(o):
    """The reason's condition: with the same token count in every micro-batch the logged value is the token mean."""
    per_rank = [[(2, 1.0, 0.5), (2, 2.0, 0.25)]]
    logged = _ppo_run(o, per_rank, gas=2, use_kl_loss=True)
    assert close(logged["entropy_loss"], _token_mean(per_rank, 1))
    assert close(logged["kl"], _token_mean(per_rank, 2))


def test_v0_10_3_normaliser_over_ranks(o):
    """v0.10.3 called get_loss_batch_info per micro-batch: the micro-batch's tokens summed over the DP ranks. With
    gradient accumulation 1 the wheel's iter_grad_accum_global_norm computes exactly that, so ppo_train at gas=1 is
    v0.10.3's arithmetic (ppo_actor.py's merge is unchanged v0.10.3 - v0.11.2). Two ranks of 1 and 3 tokens:
    2.375 again; one rank (one GPU): the token mean."""
    two_ranks = [[SHORT], [LONG]]
    logged = _ppo_run(o, two_ranks, gas=1, use_kl_loss=True)
    assert close(logged["entropy_loss"], 2.375) and not close(logged["kl"], _token_mean(two_ranks, 2))
    one_gpu = [[SHORT, LONG]]
    logged = _ppo_run(o, one_gpu, gas=1, use_kl_loss=True)
    assert close(logged["entropy_loss"], 1.75) and close(logged["kl"], _token_mean(one_gpu, 2))

    def normaliser(r: int) -> float:          # the wheel's get_loss_batch_info under the simulated DP group
        n = two_ranks[r][0][0]
        mask = torch.zeros(1, 3, dtype=torch.bool)
        mask[0, :n] = True
        return float(o.loss_utils.get_loss_batch_info(types.SimpleNamespace(), mask)["batch_num_tokens"])
    assert F.run_ranks(normaliser) == [4.0, 4.0]


USE_LOSS = {"algo.kl.use_loss": True}
# one optimizer step of one micro-batch per rank, one rank: every level holds one item (what remains is the arithmetic)
ONE_GPU = {"train.batch_size": 8, "train.micro_batch_size": 8, "actor.num_gpus_per_node": 1, "rollout.batch_size": 8,
           "rollout.n_samples_per_prompt": 1, "train.max_epochs": 1}


def _flag(release: str) -> dict:
    return USE_LOSS if tuple(map(int, release.split("."))) >= (0, 10, 2) else {"use_kl_loss": True}


@pytest.mark.parametrize("release, exact", [("0.9.8", True), ("0.10.2", True), ("0.10.3", False),
                                            ("0.10.4", False), ("0.11.0", False), ("0.11.2", False)])
def test_ppo_entropy_and_kl_loss_mapping(reg, release, exact):
    """Up to v0.10.2 the token mean merged by tokens (exact); from v0.10.3 aggregate_loss's globally normalised token
    sums (v0.10.3: over the micro-batch's tokens per rank, token_sum_dp_norm; v0.10.4+: over the optimizer step's per
    rank and micro-batch, token_sum_step_norm) merged by tokens: not a token mean, and every level that merges them
    says so; with one micro-batch on one GPU, the token mean (exact)."""
    for key in ("entropy_loss", "kl"):
        entry, res, why, name = judged(reg, key, _flag(release), trainer="ppo", release=release)
        assert name == ("policy/entropy" if key == "entropy_loss" else "kl/ref/k1"), name   # the loss term, k1
        if exact:
            assert why is None, why
        else:
            norm = "token_sum_dp_norm" if release == "0.10.3" else "token_sum_step_norm"
            assert res.fields["tokens"] == norm and res.stated["deviation"] == "none", res.fields
            assert tags(why) == {"tokens", "micro_batches", "mini_batches", "processes"}, why
            assert "is each micro-batch's token sum over " in why, why
        _, res, why, _ = judged(reg, key, {**_flag(release), **ONE_GPU}, trainer="ppo", release=release)
        assert why is None and res.fields["tokens"] == "token_mean", (release, why)


def test_ppo_entry_sources_cite_the_releases(reg):
    """Every entry whose reduction is aggregate_loss's with a global normaliser (the profiles ppo_dp_norm, v0.10.3,
    and ppo_step_norm, v0.10.4+) cites the three files at a release."""
    fw = reg.frameworks["openrlhf"]
    cited = [e for e in fw.entries if e.reduce is not None and e.reduce.like in ("ppo_dp_norm", "ppo_step_norm")]
    assert {e.key for e in cited} == {"entropy_loss", "kl", "policy_loss"} and len(cited) == 10
    for e in cited:
        assert "ppo_actor.py@" in e.source and "loss_utils.py@" in e.source and "models/loss.py@" in e.source, e.line


def test_ppo_translation_to_verl_is_approximate(reg):
    res = Translator("openrlhf/ppo@0.11.2", "verl", registry=reg).translate({"entropy_loss": 1.0})
    (out,) = res.metrics
    assert out in res.approximate
    # the OpenRLHF side alone already differs from the token mean over the step, whatever veRL states
    _, _, why, _ = judged(reg, "entropy_loss", {}, trainer="ppo", release="0.11.2")
    assert "token sum over the optimizer step's tokens per rank and micro-batch (not a token mean)" in why, why


# =============================================================================================== item 1: DPO / RM
# per (rank, micro-batch): chosen and rejected rewards of two pairs
REWARDS = {
    (0, 0): ([1.0, 0.2], [0.5, 0.6]), (0, 1): ([0.9, 0.8], [0.1, 0.2]),
    (1, 0): ([0.0, 0.1], [0.3, 0.4]), (1, 1): ([0.7, -0.2], [0.2, 0.1]),
}
BETA = 0.1


def _trainer_fit(o, kind: str, gas: int, world: int = 2) -> list[dict]:
    """``fit`` and ``save_logs_and_checkpoints`` of the wheel's dpo_trainer.py (DPOTrainer) or rm_trainer.py
    (RewardModelTrainer), compiled from the file's own text, run on ``world`` simulated ranks with ``gas``
    micro-batches per rank and window; the real DPOLoss / PairWiseLoss. The model forward
    (``concatenated_forward``) returns the rewards above: DPO as policy log-probs (reference 0, so beta * logp is
    the implicit reward), RM as the scores. Returns what rank 0 hands to wandb."""
    root = Path(o.loss.__file__).resolve().parents[1]     # the wheel's openrlhf/ (loaded by file)
    cls, path = {"dpo": ("DPOTrainer", "trainer/dpo_trainer.py"),
                 "rm": ("RewardModelTrainer", "trainer/rm_trainer.py")}[kind]

    class NoSampler:
        pass

    def quiet(*a, **k):
        from tqdm import tqdm
        return tqdm(*a, **{**k, "disable": True})
    ns = {"torch": torch, "tqdm": quiet, "os": os, "DistributedSampler": NoSampler}
    m = F._methods_from_source(root / path, cls, ["fit", "save_logs_and_checkpoints"], ns)

    def rank(r: int) -> list[dict]:
        logged: list[dict] = []
        items = []
        for i in range(gas):
            ids = torch.full((2, 1, 4), float(i))              # the micro-batch index travels in the ids
            mask = torch.ones(2, 1, 4)
            extra = [2, 2] if kind == "dpo" else [0.0, 0.0]
            items.append((ids, mask, ids.clone(), mask, extra))
        policy, ref = torch.nn.Linear(1, 1), torch.nn.Linear(1, 1)

        def forward(model, chosen_ids, c_mask, reject_ids, r_mask, *rest):
            c, j = REWARDS[(r, int(chosen_ids[0, 0].item()))]
            c, j = torch.tensor(c), torch.tensor(j)
            if kind == "rm":
                return c, j, 0.0
            if model is ref:
                return torch.zeros(2), torch.zeros(2), 0.0, 0.0
            return c / BETA, j / BETA, 0.0, 0.0

        class Loader(list):
            sampler = None

        args = types.SimpleNamespace(
            train=types.SimpleNamespace(batch_size=2 * world * gas), eval=types.SimpleNamespace(steps=10 ** 6),
            ckpt=types.SimpleNamespace(save_steps=-1), logger=types.SimpleNamespace(logging_steps=1),
            model=types.SimpleNamespace(aux_loss_coef=0.0, nll_loss_coef=0.0))
        t = types.SimpleNamespace(
            model=policy, ref_model=ref, epochs=1, train_dataloader=Loader(items), eval_dataloader=None,
            concatenated_forward=forward, args=args, aux_loss=False, nll_loss=False, margin_loss=False,
            compute_fp32_loss=False, loss_fn=o.DPOLoss(BETA) if kind == "dpo" else o.loss.PairWiseLoss(),
            optimizer=None, scheduler=types.SimpleNamespace(get_last_lr=lambda: [1e-6]),
            strategy=F.openrlhf_strategy(r, gas),
            _wandb=types.SimpleNamespace(log=logged.append, finish=lambda: None) if r == 0 else None, _tensorboard=None,
            disable_ds_ckpt=True, save_hf_ckpt=False)
        t.save_logs_and_checkpoints = types.MethodType(m["save_logs_and_checkpoints"], t)
        m["fit"](t, args)
        return logged

    return F.run_ranks(rank, world=world)[0]


def _window(world: int, gas: int):
    """acc, mean chosen, mean rejected over every pair of the window; and over the last micro-batch of each rank."""
    def stats(cells):
        c = [x for cell in cells for x in REWARDS[cell][0]]
        j = [x for cell in cells for x in REWARDS[cell][1]]
        return sum(a > b for a, b in zip(c, j)) / len(c), sum(c) / len(c), sum(j) / len(j)
    window = stats([(r, i) for r in range(world) for i in range(gas)])
    last = [stats([(r, gas - 1)]) for r in range(world)]
    last_mean = tuple(sum(s[k] for s in last) / world for k in range(3))
    return window, last_mean


@pytest.mark.parametrize("kind", ["dpo", "rm"])
def test_dpo_rm_log_the_last_micro_batch(o, kind):
    """Two ranks, accumulation 2: train/acc, chosen_reward, reject_reward are rank-averaged values of the last
    micro-batch (acc 0.75, chosen 0.55), not the window's (acc 0.5, chosen 0.4375)."""
    (logged,) = _trainer_fit(o, kind, gas=2)
    window, last = _window(2, 2)
    got = (logged["train/acc"], logged["train/chosen_reward"], logged["train/reject_reward"])
    assert all(close(g, x) for g, x in zip(got, last)), (got, last)
    assert all(not close(g, w) for g, w in zip(got, window)), (got, window)
    assert close(window[0], 0.5) and close(last[0], 0.75) and close(window[1], 0.4375) and close(last[1], 0.55)
    # (outside items 1-2, for the record: acc_mean, the window mean, is rank 0's own: added after all_reduce)
    rank0 = [REWARDS[(0, i)] for i in range(2)]
    rank0_acc = sum(sum(a > b for a, b in zip(c, j)) / 2 for c, j in rank0) / 2
    assert close(logged["train/acc_mean"], rank0_acc) and not close(rank0_acc, window[0])


@pytest.mark.parametrize("kind", ["dpo", "rm"])
def test_dpo_rm_without_accumulation_log_the_window_mean(o, kind):
    """The reason's condition: one micro-batch per rank and window (equal-size micro-batches), the value is the
    window mean."""
    (logged,) = _trainer_fit(o, kind, gas=1)
    window, _ = _window(2, 1)
    got = (logged["train/acc"], logged["train/chosen_reward"], logged["train/reject_reward"])
    assert all(close(g, w) for g, w in zip(got, window)), (got, window)


PREF_ROW = {"acc": 0.5, "chosen_reward": 0.1, "reject_reward": -0.1}


@pytest.mark.parametrize("spec, keys", [
    ("openrlhf/dpo@0.0.1", ["chosen_reward", "reject_reward"]),
    ("openrlhf/dpo@0.3.7", ["acc", "chosen_reward", "reject_reward"]),
    ("openrlhf/dpo@0.5.6", ["acc", "chosen_reward", "reject_reward"]),
    ("openrlhf/dpo@0.11.1", ["acc", "chosen_reward", "reject_reward"]),
    ("openrlhf/dpo@0.11.2", ["acc", "chosen_reward", "reject_reward"]),
    ("openrlhf/rm@0.0.1", ["chosen_reward", "reject_reward"]),
    ("openrlhf/rm@0.5.6", ["acc", "chosen_reward", "reject_reward"]),
    ("openrlhf/rm@0.11.2", ["acc", "chosen_reward", "reject_reward"]),
])
def test_dpo_rm_mapping_says_last_micro_batch(reg, spec, keys):
    res = _canon(reg, spec, {k: PREF_ROW[k] for k in keys})
    assert len(res.metrics) == len(keys) and not res.unmapped
    trainer, release = spec.split("/")[1].split("@")
    for key in keys:
        entry, red, why, _ = judged(reg, key, {}, trainer=trainer, release=release)
        assert red.stated["micro_batches"] == "last" and "micro_batches" in tags(why), why
        assert "keeps the last of its micro-batches (how many is unknown from the config)" in why, why


@pytest.mark.parametrize("release", ["0.1.9", "0.4.0", "0.5.6", "0.9.5"])
def test_kto_mapping_says_last_micro_batch_and_zero(reg, release):
    """kto_trainer.py@v0.9.5 (source-only: KTO left the wheel at v0.9.6): logs_dict["chosen_reward"] =
    chosen_rewards.mean().item() if len(chosen_rewards) != 0 else 0, all_reduce (mean), logged when
    step % accumulated_gradient == 0; the same from v0.1.9."""
    res = _canon(reg, f"openrlhf/kto@{release}", {"chosen_reward": 0.1, "reject_reward": -0.1})
    assert set(res.metrics) == {"preference/reward/chosen", "preference/reward/rejected"}
    for key in ("chosen_reward", "reject_reward"):
        _, _, why, _ = judged(reg, key, {}, trainer="kto", release=release)
        assert {"micro_batches", "deviation"} <= tags(why) and "contributes 0" in why, why


def test_preference_translation_to_trl_is_approximate(reg):
    res = Translator("openrlhf/dpo@0.11.2", "trl/dpo@1.16.0", registry=reg).translate(PREF_ROW)
    assert res.metrics and set(res.metrics) == set(res.approximate)


# =============================================================================================== follow-up claims
# policy_loss goes through the same aggregate_loss + local-token re-weighting as entropy_loss (v0.10.3 on); the
# critic's critic_loss does not (its ppo_train takes a plain mean, which with the window normaliser is the token
# mean); DPO/RM/SFT/KTO loss_mean and acc_mean are rank 0's own window means (added after all_reduce); OpenRLHF KTO's
# kl is the last micro-batch of the window (kto_trainer.py@v0.9.5, source-only: KTO left the wheel at v0.9.6).

def test_policy_loss_reweighted_like_entropy(o):
    """Advantage 1 and the old policy equal to the current one: every token's surrogate loss is -1, so the token
    mean is -1.000; micro-batches of 1 and 3 tokens log (1 * -0.5 + 3 * -1.5) / 4 = -1.250 (v0.10.4 - v0.11.2),
    and two ranks of 1 and 3 tokens at gas=1 (v0.10.3's per-micro-batch normaliser) the same."""
    logged = _ppo_run(o, [[SHORT, LONG]], gas=2)
    assert close(logged["policy_loss"], -1.25), logged
    logged = _ppo_run(o, [[SHORT], [LONG]], gas=1)
    assert close(logged["policy_loss"], -1.25), logged
    logged = _ppo_run(o, [[(2, 1.0, 0.5), (2, 2.0, 0.25)]], gas=2)        # equal micro-batches: the token mean
    assert close(logged["policy_loss"], -1.0), logged


def _critic_run(o, per_rank: list[list[tuple[int, float, float]]], gas: int) -> dict:
    """The wheel's CriticPPOTrainer.ppo_train + training_step on ``len(per_rank)`` simulated ranks; ``per_rank[r]``
    lists rank r's micro-batches, one sequence each: (response tokens, predicted value, return) for every token;
    old values = the predictions (so value clipping does nothing). Returns rank 0's status_mean."""
    c = F.openrlhf_critic()
    width = max(n for rank in per_rank for n, _, _ in rank)

    def experience(n: int, value: float, ret: float):
        mask = torch.zeros(1, width, dtype=torch.bool)
        mask[0, :n] = True
        e = o.Experience(sequences=torch.full((1, 2 + width), 5), attention_mask=torch.ones(1, 2 + width),
                         action_mask=mask, values=torch.full((1, width), value) * mask,
                         returns=torch.full((1, width), ret) * mask)
        e._values = torch.full((1, width), value) * mask
        return e

    def rank(r: int) -> dict:
        exps = [experience(*mb) for mb in per_rank[r]]
        by_id = {id(e.sequences): e for e in exps}

        class Critic:
            def train(self):
                pass

            def __call__(self, sequences, action_mask=None, **kw):
                return by_id[id(sequences)]._values.clone(), types.SimpleNamespace(aux_loss=0.0)

        strategy = F.openrlhf_strategy(r, gas)
        args = types.SimpleNamespace(train=types.SimpleNamespace(dynamic_batch_enable=False),
                                     ds=types.SimpleNamespace(tensor_parallel_size=1),
                                     actor=types.SimpleNamespace(aux_loss_coef=0.0))
        trainer = types.SimpleNamespace(
            args=args, strategy=strategy, replay_buffer=F.openrlhf_buffer(exps), dataloader_pin_memory=False,
            max_epochs=1,
            critic=Critic(), critic_loss_fn=c.ValueLoss(0.2), aux_loss=False, critic_optim=None,
            critic_scheduler=types.SimpleNamespace(get_last_lr=lambda: [1e-6]))
        trainer.training_step = types.MethodType(c.training_step, trainer)
        real = torch.cuda.current_device
        torch.cuda.current_device = lambda: "cpu"
        try:
            torch.manual_seed(0)
            return c.ppo_train(trainer)
        finally:
            torch.cuda.current_device = real

    return F.run_ranks(rank, world=len(per_rank))[0]


def test_critic_loss_is_the_token_mean(o):
    """v0.10.4 - v0.11.2: squared errors 1 (1 token) and 4 (3 tokens): 0.5 * 13 / 4 = 1.625, the token mean, on one
    rank with gas=2 and on two ranks with gas=2 (uneven); not the 1.25 an unweighted mean of micro-batch means
    gives, and not re-weighted like policy_loss. v0.10.3's per-micro-batch normaliser is gas=1 on one rank: the
    unweighted mean over micro-batches (approximate [weighting] up to v0.10.3)."""
    short, long_ = (1, 1.0, 0.0), (3, 2.0, 0.0)
    assert close(_critic_run(o, [[short, long_]], gas=2)["critic_loss"], 1.625)
    two = _critic_run(o, [[short, long_], [long_, (2, 1.0, 0.0)]], gas=2)
    assert close(two["critic_loss"], 0.5 * (1 + 12 + 12 + 2) / 9), two
    assert close(_critic_run(o, [[short, long_]], gas=1)["critic_loss"], 1.25)


NORMED = {"tokens", "micro_batches", "mini_batches", "processes"}


@pytest.mark.parametrize("release, fields", [("0.9.8", set()), ("0.10.2", set()), ("0.10.3", NORMED),
                                             ("0.10.4", NORMED), ("0.11.2", NORMED),
                                             ("0.9.7", {"micro_batches", "mini_batches", "processes"})])
def test_policy_loss_mapping(reg, release, fields):
    """Defaults: up to v0.9.7 unweighted means over micro-batches, optimizer steps and ranks; v0.9.8 - v0.10.2 the
    token mean; from v0.10.3 the aggregate_loss arithmetic."""
    res = _canon(reg, f"openrlhf/ppo@{release}", {"policy_loss": -0.1})
    assert set(res.metrics) == {"loss/policy"}
    _, _, why, _ = judged(reg, "policy_loss", {}, trainer="ppo", release=release)
    assert tags(why) == fields, why


@pytest.mark.parametrize("release, default, one_gpu", [
    ("0.10.1", {"micro_batches", "mini_batches", "processes"}, set()),
    ("0.10.2", {"micro_batches", "mini_batches", "processes"}, set()),
    ("0.10.3", {"micro_batches", "mini_batches"}, set()),
    ("0.10.4", {"mini_batches"}, set()), ("0.11.2", {"mini_batches"}, set())])
def test_critic_loss_mapping(reg, release, default, one_gpu):
    """The critic averages its micro-batches unweighted at every release: per-rank token means up to v0.10.2 (ranks
    unweighted too), the micro-batch's token mean over the ranks at v0.10.3, and from v0.10.4 each micro-batch's sum
    over the optimizer step's tokens, so the plain mean over a step's micro-batches and ranks is the step's token
    mean; the optimizer steps are averaged unweighted (8 by default). One GPU, one optimizer step: exact."""
    cfg = {"critic.num_gpus_per_node": 1, **ONE_GPU} if release >= "0.10.2" else {
        "train_batch_size": 8, "micro_train_batch_size": 8, "critic_num_gpus_per_node": 1, "rollout_batch_size": 8,
        "n_samples_per_prompt": 1, "max_epochs": 1}
    for config, fields in (({}, default), (cfg, one_gpu)):
        _, _, why, name = judged(reg, "critic_loss", config, trainer="ppo", release=release)
        assert name == "loss/value" and tags(why) == fields, (config, why)


def _window_loss(kind: str, r: int, gas: int) -> float:
    """The wheel's DPOLoss / PairWiseLoss on rank r's micro-batches of the window, averaged over them."""
    o = F.openrlhf()
    vals = []
    for i in range(gas):
        c, j = (torch.tensor(x) for x in REWARDS[(r, i)])
        if kind == "dpo":
            loss, _, _ = o.DPOLoss(BETA)(c / BETA, j / BETA, torch.zeros(2), torch.zeros(2))
        else:
            loss = o.loss.PairWiseLoss()(c, j)
        vals.append(loss.item())
    return sum(vals) / gas


@pytest.mark.parametrize("kind", ["dpo", "rm"])
def test_loss_mean_and_acc_mean_are_rank_0s(o, kind):
    """Two ranks, accumulation 2: loss_mean and acc_mean are rank 0's window means; rank 1's micro-batches do not
    count (added to logs_dict after strategy.all_reduce)."""
    (logged,) = _trainer_fit(o, kind, gas=2)
    rank0 = _window_loss(kind, 0, 2)
    both = (rank0 + _window_loss(kind, 1, 2)) / 2
    assert close(logged["train/loss_mean"], rank0) and not close(rank0, both), (logged, rank0, both)
    acc = {r: sum(sum(a > b for a, b in zip(*REWARDS[(r, i)])) / 2 for i in range(2)) / 2 for r in range(2)}
    assert close(logged["train/acc_mean"], acc[0]) and not close(acc[0], (acc[0] + acc[1]) / 2)


@pytest.mark.parametrize("spec, keys", [
    ("openrlhf/dpo@0.5.6", ["loss_mean", "acc_mean"]), ("openrlhf/dpo@0.11.2", ["loss_mean", "acc_mean"]),
    ("openrlhf/rm@0.5.6", ["loss_mean", "acc_mean"]), ("openrlhf/rm@0.11.2", ["loss_mean", "acc_mean"]),
    ("openrlhf/sft@0.11.2", ["loss_mean"]), ("openrlhf/kto@0.9.5", ["loss_mean"]),
])
def test_loss_mean_acc_mean_mapping_says_rank_0(reg, spec, keys):
    res = _canon(reg, spec, {k: 0.5 for k in keys})
    assert len(res.metrics) == len(keys)
    trainer, release = spec.split("/")[1].split("@")
    for key in keys:
        _, red, why, _ = judged(reg, key, {}, trainer=trainer, release=release)
        assert red.stated["processes"] == "rank0" and "keeps rank 0's value" in why and "[processes]" in why, why


@pytest.mark.parametrize("spec", ["openrlhf/dpo@0.5.5", "openrlhf/rm@0.1.0"])
def test_loss_mean_before_v0_5_6_stays_the_moving_average(reg, spec):
    trainer, release = spec.split("/")[1].split("@")
    _, _, why, _ = judged(reg, "loss_mean", {}, trainer=trainer, release=release)
    assert "[deviation]" in why and "exponential moving average" in why, why


@pytest.mark.parametrize("release", ["0.1.9", "0.5.0", "0.9.5"])
def test_kto_kl_mapping_says_last_micro_batch(reg, release):
    """kto_trainer.py@v0.9.5: logs_dict["kl"] = KL.item() of the micro-batch just trained, logged when
    step % accumulated_gradient == 0 (source-only: KTO is not in the 0.11 wheel)."""
    res = _canon(reg, f"openrlhf/kto@{release}", {"kl": 0.1})
    assert set(res.metrics) == {"preference/kto_kl"}
    _, _, why, _ = judged(reg, "kl", {}, trainer="kto", release=release)
    assert "keeps the last of its micro-batches" in why and "[micro_batches]" in why, why
