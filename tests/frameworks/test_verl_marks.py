"""A real-shaped veRL 0.9.1 log (every key one training step of the default V1 trainer logs, produced by veRL's own
code in tests/_support/proofs_verl.py) translated with the trainer and release left out (``source="verl"``): the
exact/approximate marks follow the run config (issue 20). With veRL's defaults (train_batch_size 1024 /
ppo_mini_batch_size 256 x ppo_epochs 1 = 4 optimizer steps per step) the actor losses average 4 mini-batches
unweighted, so they are approximate and say so; with ppo_mini_batch_size == train_batch_size and one epoch they are
the step's token mean: exact. What does not depend on the mini-batches keeps its mark in both."""
from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("tensordict")
pytest.importorskip("verl", reason="make test installs verl --no-deps")

import trackbridge  # noqa: E402

from _support import proofs_verl as V  # noqa: E402
from _support.unproven import agrees  # noqa: E402

ROLLOUT = V.Rollout(prompt_lens=[3, 4, 2, 6, 3, 5, 4, 2], resp_lens=[2, 5, 3, 7, 1, 4, 6, 2], tool=[[]] * 8,
                    scores=[1, 0, .5, 1, 0, 0, 1, .25])
ONE_STEP = {"data": {"train_batch_size": 256},
            "actor_rollout_ref": {"actor": {"ppo_mini_batch_size": 256, "ppo_epochs": 1}}}
MINI_DEPENDENT = ("kl/ref/k3", "loss/policy", "loss/total", "optim/grad_norm")
ALWAYS_EXACT = ("reward/score/mean", "response/length/mean", "advantage/mean", "optim/lr", "kl/loss_coef",
                "time/step")


@pytest.fixture(scope="module")
def log() -> dict[str, float]:
    metrics = V.run_step(ROLLOUT, mini_batch_size=4, micro_size=2, epochs=1).metrics
    assert {"actor/kl_loss", "actor/pg_loss", "actor/grad_norm", "training/off_policy/trajectory_spans/mean"} \
        <= set(metrics), sorted(metrics)
    return metrics


def test_default_config_marks_the_mini_batch_averages(log):
    res = trackbridge.translate(log, source="verl")
    assert not res.unmapped, res.unmapped
    for name in MINI_DEPENDENT:
        assert name in res.metrics, name
        reason = res.approximate.get(name, "")
        assert "mini-batches" in reason and "4" in reason and "default" in reason, (name, reason)
    for name in ALWAYS_EXACT:       # the stated reductions agree; exact where a proof saw them
        assert name in res.metrics and agrees(res.approximate.get(name)), (name, res.approximate.get(name))
    assert "reward/score/mean" not in res.approximate        # proven (test_proof_verl_fingerprint.py)
    # the V1 trainer's clip ratio is against the batch's longest sequence: approximate whatever the mini-batches
    assert "longest" in res.approximate["response/clip_ratio"]
    assert "before the update" in res.approximate["policy/entropy"]


def test_one_mini_batch_and_one_epoch_is_exact(log):
    res = trackbridge.translate(log, source="verl", config=ONE_STEP)
    for name in MINI_DEPENDENT + ALWAYS_EXACT:
        assert name in res.metrics and agrees(res.approximate.get(name)), (name, res.approximate.get(name))
    assert "kl/ref/k3" not in res.approximate and "loss/policy" not in res.approximate     # proven
    assert "longest" in res.approximate["response/clip_ratio"]
    # the clip fraction and ppo_kl are means of micro-batch means: still approximate with one mini-batch
    assert "micro-batches" in res.approximate["policy/clip_frac"]


def test_legacy_trainer_config_clips_against_the_maximum(log):
    cfg = {**ONE_STEP, "trainer": {"use_v1": False}}
    res = trackbridge.translate(log, source="verl", config=cfg)
    assert agrees(res.approximate.get("response/clip_ratio")), res.approximate.get("response/clip_ratio")


def test_grpo_reward_function_means_have_no_verl_target_by_default():
    """TRL's per-reward-function means: veRL 0.9.x logs gdpo/<fn>/mean only with the legacy trainer, so without a
    run config saying trainer.use_v1=false the name stays canonical (with a note), never gdpo/<fn>/mean."""
    trl = {"rewards/acc/mean": 0.5, "rewards/acc/std": 0.1}
    res = trackbridge.translate(trl, source="trl/grpo@1.16.0", target="verl@0.9.1")
    assert not any(k.startswith("gdpo/") for k in res.metrics), res.metrics
    assert set(res.metrics) == {"reward/fn/acc/mean", "reward/fn/acc/std"}, res.metrics
    old = trackbridge.translate(trl, source="trl/grpo@1.16.0", target="verl@0.8.0")
    assert set(old.metrics) == {"gdpo/acc/mean", "gdpo/acc/std"}, old.metrics
