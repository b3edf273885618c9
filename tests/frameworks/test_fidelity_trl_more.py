"""TRL fidelity claims checked in the follow-up to issue 11: online DPO / XPO / Nash-MD ``rewards/*`` (gathered at
every release; Nash-MD's are other quantities under DPO's names), CPO / ORPO ``nll_loss`` and ``logits/*`` (token
means of each process, averaged unweighted over processes and micro-batches; logits over every position), and GKD
(which logs no token means: its compute_loss replaces SFTTrainer's). Each verdict is checked in mappings/trl.yaml
through trackbridge's loader; where the installed TRL (1.16.0) still has the code, the code is run or read."""
from __future__ import annotations

import inspect
import types

import pytest

from trackbridge.pipeline import Translator
from trackbridge.schema.loader import load_registry

from _support.unproven import agrees

trl = pytest.importorskip("trl")
torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def reg():
    return load_registry()


def _canon(reg, spec, row, config=None):
    return Translator(spec, "canonical", registry=reg, config=config).translate(row)


PREF = {"rewards/chosen": 0.2, "rewards/rejected": -0.1, "rewards/margins": 0.3, "rewards/accuracies": 0.75}


@pytest.mark.parametrize("spec", ["trl/online_dpo@0.10", "trl/online_dpo@1.16.0", "trl/xpo@0.11.0", "trl/xpo@1.13.0"])
def test_online_dpo_and_xpo_rewards_stay_exact(reg, spec):
    """Gathered over processes at every release: exact at one step per row and one micro-batch per step."""
    res = _canon(reg, spec, PREF, {"logging_steps": 1, "gradient_accumulation_steps": 1})
    assert set(res.metrics) == {"preference/reward/chosen", "preference/reward/rejected", "preference/reward/margin",
                                "preference/accuracy"}
    assert all(agrees(res.approximate.get(k)) for k in res.metrics), res.approximate


@pytest.mark.parametrize("spec", ["trl/nash_md@0.11.0", "trl/nash_md@0.12.0", "trl/nash_md@1.13.0"])
def test_nash_md_rewards_are_other_quantities(reg, spec):
    """nash_md_trainer.py@v1.13.0 _log_statistics: rewards/chosen = gather_mean(model_scores) (reward-model scores of
    the policy's completions), rewards/rejected = the mixture's, rewards/margins = policy minus reference log-prob
    sum (from v0.12.0), rewards/accuracies = margins > 0."""
    res = _canon(reg, spec, PREF, {"logging_steps": 1, "gradient_accumulation_steps": 1})
    assert len(res.metrics) == 4
    for name in res.metrics:
        assert "[deviation]" in res.approximate[name], res.approximate


def test_online_dpo_gathers_the_rewards_in_the_installed_release():
    """The installed online DPO trainer computes rewards/* from gathered per-sample rewards."""
    from trl.experimental.online_dpo import online_dpo_trainer as m
    src = inspect.getsource(m)
    assert "gathered_chosen_rewards = self.accelerator.gather_for_metrics(chosen_rewards)" in src
    assert 'self.stats["rewards/chosen"].append(gathered_chosen_rewards.mean().item())' in src
    assert "margin = gathered_chosen_rewards - gathered_rejected_rewards" in src


def _cpo_log(stored: dict[str, list[float]]) -> dict:
    """CPOTrainer.log (installed TRL) on a trainer built without __init__: the stored per-compute_loss metrics are
    averaged as log() does; what Trainer.log hands to the callbacks is returned."""
    from collections import defaultdict

    from transformers.trainer_callback import TrainerControl, TrainerState
    from trl.experimental.cpo import CPOTrainer
    t = CPOTrainer.__new__(CPOTrainer)
    logged: list[dict] = []
    t.__dict__.update(
        _stored_metrics=defaultdict(lambda: defaultdict(list)), state=TrainerState(), control=TrainerControl(),
        args=types.SimpleNamespace(include_num_input_tokens_seen="no"),
        callback_handler=types.SimpleNamespace(on_log=lambda a, s, c, out: (logged.append(dict(out)), c)[1]))
    for k, vals in stored.items():
        for v in vals:
            CPOTrainer.store_metrics(t, {k: v}, train_eval="train")
    CPOTrainer.log(t, {"loss": 0.0})
    return logged[-1]


def test_cpo_nll_loss_is_a_mean_of_micro_batch_means():
    """Gradient accumulation 2: micro-batches whose chosen completions have 1 and 3 tokens with per-token NLL 0.5
    and 2.0; each compute_loss stores its micro-batch token mean, log() averages them: 1.25, where the token mean
    over the step is (0.5 + 6) / 4 = 1.625."""
    out = _cpo_log({"nll_loss": [0.5, 2.0]})
    assert abs(out["nll_loss"] - 1.25) < 1e-6 and abs(1.25 - 1.625) > 0.1


@pytest.mark.parametrize("release, rank0", [("0.8.2", True), ("0.13.0", True), ("0.14.0", False), ("1.16.0", False)])
@pytest.mark.parametrize("trainer", ["cpo", "orpo"])
def test_cpo_orpo_nll_and_logits_mapping(reg, trainer, release, rank0):
    """Before v0.14.0 the logging process's own batch; from v0.14.0 each process's token mean averaged over processes
    (never the global token mean, whatever the world size); with gradient accumulation also averaged over
    micro-batches; logits over every position (prompt and padding)."""
    one = {"logging_steps": 1, "gradient_accumulation_steps": 1}
    res = _canon(reg, f"trl/{trainer}@{release}", {"nll_loss": 1.0, "logits/chosen": -1.0, "logits/rejected": -2.0},
                 one)
    assert set(res.metrics) == {"loss/nll", "preference/logits/chosen", "preference/logits/rejected"}
    why = res.approximate["loss/nll"]
    assert "[processes]" in why and ("rank 0" in why) == rank0, why
    for side in ("chosen", "rejected"):
        assert "prompt included" in res.approximate[f"preference/logits/{side}"], res.approximate
    ga = _canon(reg, f"trl/{trainer}@{release}", {"nll_loss": 1.0}, {**one, "gradient_accumulation_steps": 2})
    assert "[micro_batches]" in ga.approximate["loss/nll"], ga.approximate


def test_cpo_logits_span_every_position():
    """The installed CPO/ORPO take the logits of whole chosen sequences (prompt and padding included)."""
    from trl.experimental.cpo import cpo_trainer
    from trl.experimental.orpo import orpo_trainer
    assert "chosen_logits = all_logits[:len_chosen]" in inspect.getsource(cpo_trainer.CPOTrainer.concatenated_forward)
    assert "chosen_logits = all_logits[:len_chosen, :-1, :]" in inspect.getsource(
        orpo_trainer.ORPOTrainer.concatenated_forward)


def test_gkd_logs_no_token_means():
    """GKDTrainer.compute_loss (installed) replaces SFTTrainer.compute_loss, which is where entropy and
    mean_token_accuracy are appended: GKD has no per-micro-batch token means to average (the SFT/GRPO pattern does
    not apply)."""
    from trl import SFTTrainer
    from trl.experimental.gkd import GKDTrainer
    src = inspect.getsource(GKDTrainer.compute_loss)
    assert GKDTrainer.compute_loss is not SFTTrainer.compute_loss
    assert "super().compute_loss" not in src and "_metrics" not in src
    assert '"mean_token_accuracy"' in inspect.getsource(SFTTrainer.compute_loss)
