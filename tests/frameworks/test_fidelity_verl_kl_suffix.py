"""veRL's '+' KL estimators (``kl_loss_type: k1+``, ``algorithm.kl_penalty: k3+`` ...): the value logged is the base
estimator's, only the gradient is k2's (a straight-through trick). Checked by running the installed veRL's own
``kl_penalty`` on one batch, then through trackbridge's mappings: a run configured with ``X+`` lands on X's name.
Before, the mappings knew only the plain spellings, so ``k1+`` fell through to the default entry (k3) and was
mislabelled."""
from __future__ import annotations

import pytest

from trackbridge.pipeline import Translator
from trackbridge.schema.loader import load_registry

from _support import framework_code as F

torch = pytest.importorskip("torch")
pytest.importorskip("verl")

# kl_loss_type / kl_penalty spelling -> the canonical estimator it logs
ESTIMATORS = {"kl": "k1", "k1": "k1", "mse": "k2", "k2": "k2", "low_var_kl": "k3", "k3": "k3"}


@pytest.fixture(scope="module")
def batch():
    g = torch.Generator().manual_seed(7)
    logp = -torch.rand(4, 9, generator=g) * 3
    ref = logp + torch.randn(4, 9, generator=g) * 0.4
    return logp.requires_grad_(), ref


@pytest.mark.parametrize("spelling", sorted(ESTIMATORS))
def test_the_plus_spelling_logs_the_base_estimators_value(batch, spelling):
    kl_penalty = F.verl().core_algos.kl_penalty
    logp, ref = batch
    plain, plus = kl_penalty(logp, ref, spelling), kl_penalty(logp, ref, spelling + "+")
    assert torch.equal(plus.detach(), plain.detach())
    # the gradient is k2's: d/dlogp 0.5 (logp - ref)^2 = logp - ref (the only difference)
    (g_plus,) = torch.autograd.grad(plus.sum(), logp)
    if ESTIMATORS[spelling] != "k2":
        assert torch.allclose(g_plus, (logp - ref).detach())


@pytest.mark.parametrize("spelling", sorted(ESTIMATORS))
def test_a_plus_configured_run_lands_on_the_base_estimators_name(spelling):
    reg = load_registry()
    want = ESTIMATORS[spelling]
    loss_cfg = {"actor_rollout_ref": {"actor": {"kl_loss_type": spelling + "+"}}}
    got = Translator("verl@0.9.1", "canonical", registry=reg, config=loss_cfg).translate({"actor/kl_loss": 0.02})
    assert got.metrics == {f"kl/ref/{want}": 0.02}
    plain = {"actor_rollout_ref": {"actor": {"kl_loss_type": spelling}}}
    assert Translator("verl@0.9.1", "canonical", registry=reg, config=plain).translate(
        {"actor/kl_loss": 0.02}).approximate == got.approximate
    reward_cfg = {"algorithm": {"kl_penalty": spelling + "+"}}
    got = Translator("verl@0.9.1", "canonical", registry=reg, config=reward_cfg).translate(
        {"actor/reward_kl_penalty": 0.03})
    assert got.metrics == {f"kl/old_ref/{want}": 0.03}
