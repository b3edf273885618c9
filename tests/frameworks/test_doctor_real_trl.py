"""The diagnostic checks on real TRL 1.16.0 runs (the tiny local model of tests/_support/tiny_trl.py, on CPU).

A GRPO run whose reward function gives every completion the same reward: every prompt group has zero reward
spread (TRL logs ``frac_reward_zero_std`` = 1.0), so GRPO learns nothing; and the randomly initialised model rarely
samples EOS within the 8 tokens allowed, so most completions are truncated. The live checks of the TrackBridge
callback (``doctor=True``) log each finding once; ``trackbridge doctor`` finds the same two on the run's spool and
on its ``trainer_state.json`` (TRL's own names), and nothing else, though every check that reads TRL's GRPO names
(KL, entropy, clipping, gradient norm) ran on it.
"""
from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.integration

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")

from trackbridge import cli  # noqa: E402
from trackbridge.doctor import diagnose  # noqa: E402
from trackbridge.integrations.transformers import TrackBridgeCallback  # noqa: E402
from trackbridge.read.inputs import open_runs  # noqa: E402
from trackbridge.stream import read_stream  # noqa: E402

from _support.tiny_trl import build_tiny_model, sentences  # noqa: E402

STEPS = 20                 # no-learning-signal needs 20 points


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny-llama-doctor"))


def _grpo(tmp_path, tiny_model, reward):
    from trl import GRPOConfig, GRPOTrainer

    ds = datasets.Dataset.from_dict({"prompt": sentences(64, 7)})
    args = GRPOConfig(output_dir=str(tmp_path / "out"), max_steps=STEPS, logging_steps=1,
                      per_device_train_batch_size=2, num_generations=2, max_completion_length=8, beta=0.04,
                      report_to="none", use_cpu=True, save_strategy="no", seed=0, learning_rate=1e-3,
                      disable_tqdm=True, dataloader_num_workers=0)
    cb = TrackBridgeCallback(spool=str(tmp_path / "spool"), run_id="grpo", doctor=True, writer="thread")
    trainer = GRPOTrainer(model=tiny_model, reward_funcs=[reward], args=args, train_dataset=ds, callbacks=[cb])
    trainer.train()
    state = tmp_path / "trainer_state.json"
    trainer.state.save_to_json(str(state))
    return cb.run, state


def test_a_real_grpo_run(tmp_path, tiny_model):
    def constant(completions, **kwargs):
        return [0.0 for _ in completions]

    run, state = _grpo(tmp_path, tiny_model, constant)
    history = json.loads(state.read_text())["log_history"]
    rows = [r for r in history if "frac_reward_zero_std" in r]
    # what TRL itself logged: every group has zero reward spread, and the random model rarely samples EOS within 8
    # tokens, so most completions are cut at the limit: two real symptoms
    assert len(rows) == STEPS and {r["frac_reward_zero_std"] for r in rows} == {1.0}
    clipped = [r["completions/clipped_ratio"] for r in rows]
    # responses-truncated holds from the first of 5 consecutive points above 0.1 (the check, written out here)
    starts = [i for i in range(1, STEPS - 3) if all(c > 0.1 for c in clipped[i - 1:i + 4])]
    assert starts, clipped                           # the random model: most completions hit the 8 tokens
    first_clipped = starts[0]
    # live: each logged once, at the step where its evidence was complete (20 points; 5 points)
    # ... or at the first point where every completion was cut (one point is enough)
    every = [i + 1 for i, c in enumerate(clipped) if c > 0.99]
    truncated_at = min([first_clipped + 4, *every[:1]])
    # every reward is 0 and so is the gradient (beta's KL term is 0 at the reference): no learning signal from the
    # first row, no update (gradient norm exactly 0 with lr 1e-3) from 3 points, the KL exactly 0 with beta 0.04
    assert all(r["grad_norm"] == 0.0 and r["reward"] == 0.0 and r["kl"] == 0.0 for r in rows)
    texts = [(rec.step, k) for _s, rec in read_stream(run.spool_path) for k in rec.metrics if k.startswith("doctor/")]
    assert sorted(texts) == sorted([(1, "doctor/no-learning-signal"), (3, "doctor/no-update"),
                                    (5, "doctor/kl-exactly-zero"), (truncated_at, "doctor/responses-truncated")])
    found = {f.id: f for f in run.findings}
    assert set(found) == {"no-learning-signal", "no-update", "kl-exactly-zero", "responses-truncated"}
    for cid in ("no-learning-signal", "no-update", "kl-exactly-zero"):
        assert (found[cid].first_step, found[cid].last_step) == (1, STEPS), cid
    assert found["responses-truncated"].first_step == min([first_clipped, *every[:1]])
    # the consequences are listed after their cause, the groups without learning signal
    assert [f.id for f in run.findings][0] == "no-learning-signal"
    want = {f.id: (f.first_step, f.last_step, f.count) for f in run.findings}
    # the same findings from the stored run, through TRL's names (trainer_state.json) and from the spool; every
    # other check that reads TRL's GRPO names ran on it and stayed quiet
    for path in (state, run.spool_path):
        (r,) = open_runs(str(path), rows=True)
        d = diagnose(r)
        # kl-exactly-zero needs the run config's beta, which a file without the config does not carry
        ran = {k: v for k, v in want.items() if k in d.ran}
        assert set(want) - set(ran) <= {"kl-exactly-zero"}, (path, d.not_run)
        assert all("kl_coef" in d.not_run[k] for k in set(want) - set(ran)), d.not_run
        assert {x.id: (x.first_step, x.last_step, x.count) for x in d.findings} == ran, path
        assert {"kl-spike", "entropy-collapse", "clip-fraction-high", "grad-norm-explosion",
                "loss-kl-grad-spike-together"} <= set(d.ran), d.not_run
    assert d.source.startswith("canonical")            # the spool: canonical names, translated from TRL's
    assert cli.main(["doctor", str(state)]) == 1
