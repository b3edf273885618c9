"""The live checks stop a real TRL trainer (issue 32, item 5): TRL 1.16's ``SFTTrainer`` on the tiny local model
of tests/_support/tiny_trl.py, on CPU, whose learning rate jumps from 1e-3 to 1e3 after step 25 (a real pathology:
the gradient norm explodes from ~2 to ~10^4). ``TrackBridgeCallback(doctor=True, stop_on="critical")`` stops the
Trainer (``control.should_training_stop``) at the event after the critical finding, far before ``max_steps``; the
finding reaches ``on_finding`` and is warned at the user's line (this file's ``trainer.train()``), in TRL's names.
The same through ``report_to="trackbridge"`` with ``TRACKBRIDGE_STOP_ON=critical``."""
from __future__ import annotations

import warnings

import pytest

pytestmark = pytest.mark.integration

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")

from trackbridge.doctor import DoctorWarning  # noqa: E402
from trackbridge.integrations.transformers import TrackBridgeCallback  # noqa: E402
from trackbridge.stream import read_stream  # noqa: E402

from _support.tiny_trl import build_tiny_model, sentences  # noqa: E402

MAX_STEPS = 60
JUMP_AT = 25


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny-llama-stop"))


class LearningRateJump(transformers.TrainerCallback):
    """After step JUMP_AT the constant schedule's base learning rate becomes 1e3 (a mistyped schedule)."""

    def on_step_end(self, args, state, control, lr_scheduler=None, **kwargs):
        if state.global_step == JUMP_AT:
            lr_scheduler.base_lrs = [1e3 for _ in lr_scheduler.base_lrs]


def _trainer(tmp_path, tiny_model, callbacks, report_to="none"):
    from trl import SFTConfig, SFTTrainer

    args = SFTConfig(output_dir=str(tmp_path / "out"), max_steps=MAX_STEPS, logging_steps=1,
                     per_device_train_batch_size=4, learning_rate=1e-3, lr_scheduler_type="constant",
                     report_to=report_to, use_cpu=True, save_strategy="no", seed=0, disable_tqdm=True,
                     dataloader_num_workers=0)
    ds = datasets.Dataset.from_dict({"text": sentences(256, 3)})
    return SFTTrainer(model=tiny_model, args=args, train_dataset=ds, callbacks=[LearningRateJump(), *callbacks])


def _check_stopped(trainer, cb, got):
    history = trainer.state.log_history
    grads = {h["step"]: h["grad_norm"] for h in history if "grad_norm" in h}
    # what TRL logged: a steady gradient norm, then the explosion after the jump
    assert max(grads[s] for s in range(1, JUMP_AT + 1)) < 10 and max(grads.values()) > 1000
    (f,) = [f for f in got if f.severity == "critical"]
    assert f.id == "grad-norm-explosion" and JUMP_AT < f.first_step and grads[int(f.first_step)] > 1000
    assert f.names == {"optim/grad_norm": "grad_norm"}             # TRL's own name
    # stopped at the event after the finding, far before max_steps
    assert cb.stopped is not None and "grad-norm-explosion" in cb.stopped[1]
    assert f.first_step <= trainer.state.global_step <= f.first_step + 3 < MAX_STEPS
    texts = [(rec.step, k) for _s, rec in read_stream(cb.run.spool_path) for k in rec.metrics
             if k.startswith("doctor/")]
    assert (f.first_step, "doctor/grad-norm-explosion") in texts


def test_stop_on_critical_stops_the_trainer(tmp_path, tiny_model):
    got = []
    cb = TrackBridgeCallback(spool=str(tmp_path / "spool"), run_id="sft", doctor=True, stop_on="critical",
                             on_finding=got.append, writer="thread", env=False)
    trainer = _trainer(tmp_path, tiny_model, [cb])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.train()                                 # the line the finding's warning names
    _check_stopped(trainer, cb, got)
    said = [w for w in caught if issubclass(w.category, DoctorWarning) and "grad-norm-explosion" in str(w.message)]
    assert len(said) == 1 and said[0].filename == __file__
    assert "trainer.train()" in open(__file__, encoding="utf-8").read().splitlines()[said[0].lineno - 1]
    assert "optim/grad_norm (your grad_norm)" in str(said[0].message)


def test_report_to_trackbridge_with_stop_on_from_the_environment(tmp_path, tiny_model, monkeypatch):
    import trackbridge.integrations.transformers  # noqa: F401  (registers report_to="trackbridge")
    monkeypatch.setenv("TRACKBRIDGE_SPOOL", str(tmp_path / "spool"))
    monkeypatch.setenv("TRACKBRIDGE_STOP_ON", "critical")
    monkeypatch.delenv("TRACKBRIDGE_SINKS", raising=False)
    trainer = _trainer(tmp_path, tiny_model, [], report_to="trackbridge")
    (cb,) = [c for c in trainer.callback_handler.callbacks if isinstance(c, TrackBridgeCallback)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.train()
    got = [f for f in cb.run.findings]
    _check_stopped(trainer, cb, got)
