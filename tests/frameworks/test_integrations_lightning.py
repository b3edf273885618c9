"""``TrackBridgeLogger`` in a real Lightning ``Trainer.fit`` on CPU (a tiny regression module): every
``log_metrics`` Lightning makes -- the same calls Lightning's own ``CSVLogger`` writes, beside it, as the ground truth
-- reaches the spool, TensorBoard (``EventFileLoader``) and MLflow (``MlflowClient``) once, at its step, with its
value; ``save_hyperparameters()`` is the run's config; ``finalize`` records the outcome (FINISHED, FAILED when fit
raised); only rank zero writes. Marked ``integration``.
"""
from __future__ import annotations

import collections
import csv
import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

torch = pytest.importorskip("torch")
L = pytest.importorskip("lightning.pytorch")

from trackbridge.integrations.lightning import TrackBridgeLogger  # noqa: E402

from _support import readback  # noqa: E402


class Regression(L.LightningModule):
    def __init__(self, lr: float = 0.05, hidden: int = 4, fail_at: int = -1) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Sequential(torch.nn.Linear(2, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, 1))

    def training_step(self, batch, batch_idx):
        if self.global_step == self.hparams.fail_at:
            raise RuntimeError("training blew up")
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss, on_step=True, on_epoch=True)
        self.log("lr", self.hparams.lr, on_step=True, on_epoch=False)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.net(x), y), on_epoch=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


def _data(n=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 2, generator=g)
    y = (x[:, :1] * 0.5 - x[:, 1:] * 0.25)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=4)


def _trainer(tmp_path, loggers, **kw):
    return L.Trainer(accelerator="cpu", devices=1, max_epochs=2, limit_train_batches=4, limit_val_batches=2,
                     log_every_n_steps=1, enable_checkpointing=False, enable_progress_bar=False,
                     enable_model_summary=False, default_root_dir=str(tmp_path), logger=loggers, **kw)


def _logger(tmp_path, run_id, **kw):
    return TrackBridgeLogger(project="lit", name="regression", run_id=run_id, source="canonical",
                             sinks=[f"tensorboard:{tmp_path}/tb", f"mlflow:sqlite:///{tmp_path}/mlflow.db"],
                             spool=str(tmp_path / "spool"), **kw)


def _csv_points(csv_logger):
    """{key: Counter(step)} and {key: {step: value}} of Lightning's own CSVLogger (one row per log_metrics call)."""
    path = Path(csv_logger.log_dir) / "metrics.csv"
    points: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    values: dict[str, dict[int, float]] = collections.defaultdict(dict)
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            step = int(row.pop("step"))
            for k, v in row.items():
                if v != "":
                    points[k][step] += 1
                    values[k][step] = float(v)
    return dict(points), dict(values)


def _check(tmp_path, run_id, csv_logger, status):
    want, want_values = _csv_points(csv_logger)
    assert want, "Lightning logged nothing"
    spool, bad = readback.spool_points(tmp_path / "spool" / f"{run_id}.jsonl")
    assert not bad and spool == want, (spool, want)
    tb = readback.tensorboard_points(tmp_path / "tb")
    assert tb == want, (tb, want)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client, mrun = readback.mlflow_run(uri, run_id)
    assert mrun.info.status == status
    assert client.get_experiment(mrun.info.experiment_id).name == "lit" and mrun.info.run_name == "regression"
    assert set(mrun.data.metrics) == set(want)
    for key, steps in want.items():
        hist = client.get_metric_history(mrun.info.run_id, key)
        got = collections.Counter(m.step for m in hist)
        # MLflow's store keeps one row per (key, step, timestamp, value): equal values logged in the same
        # millisecond (Lightning's epoch, in several calls of one step) are one row
        assert set(got) == set(steps) and all(got[s] <= steps[s] for s in got), (key, got, steps)
        assert {m.step: m.value for m in hist} == pytest.approx(want_values[key], rel=1e-6), key
    return mrun


def test_fit_every_step_in_every_tracker(tmp_path):
    from lightning.pytorch.loggers import CSVLogger
    logger = _logger(tmp_path, "lit-fit")
    assert (logger.name, logger.version, logger.save_dir) == ("regression", "lit-fit", None)
    csv_logger = CSVLogger(str(tmp_path / "csv"), name="truth")
    model = Regression(lr=0.05, hidden=4)
    trainer = _trainer(tmp_path, [csv_logger, logger])
    trainer.fit(model, _data(), _data(8, 1))
    run = logger.experiment
    assert run.run_id == "lit-fit" and run.status["finished"] and logger.outcome == "finished"
    want, _ = _csv_points(csv_logger)
    assert want["train_loss_step"] == collections.Counter({s: 1 for s in range(8)})
    assert sum(want["val_loss"].values()) == 2 and "epoch" in want
    mrun = _check(tmp_path, "lit-fit", csv_logger, "FINISHED")
    assert mrun.data.params["lr"] == "0.05" and mrun.data.params["hidden"] == "4"
    header = json.loads((tmp_path / "spool" / "lit-fit.jsonl").read_text().splitlines()[0])
    assert header["type"] == "run" and header["config"]["lr"] == 0.05 and header["config"]["hidden"] == 4


def test_fit_that_raises_is_failed(tmp_path):
    from lightning.pytorch.loggers import CSVLogger
    logger = _logger(tmp_path, "lit-fail")
    csv_logger = CSVLogger(str(tmp_path / "csv"), name="truth")
    trainer = _trainer(tmp_path, [csv_logger, logger])
    with pytest.raises(RuntimeError, match="training blew up"):
        trainer.fit(Regression(fail_at=5), _data(), _data(8, 1))
    assert logger.outcome == "failed" and logger.experiment.status["finished"]
    csv_logger.save()        # Lightning saves it in finalize too; make sure what it holds is on disk
    want, _ = _csv_points(csv_logger)
    assert want["train_loss_step"] == collections.Counter({s: 1 for s in range(5)})   # steps 0..4, then the raise
    _check(tmp_path, "lit-fail", csv_logger, "FAILED")


def test_validate_after_fit_continues_the_run(tmp_path):
    logger = _logger(tmp_path, "lit-more")
    model = Regression()
    trainer = _trainer(tmp_path, [logger])
    trainer.fit(model, _data(), _data(8, 1))
    trainer.validate(model, _data(8, 2), verbose=False)
    assert logger.experiment.run_id == "lit-more" and logger.experiment.status["finished"]
    client, mrun = readback.mlflow_run(f"sqlite:///{tmp_path}/mlflow.db", "lit-more")   # one run, not two
    val = collections.Counter(m.step for m in client.get_metric_history(mrun.info.run_id, "val_loss"))
    assert sum(val.values()) == 3 and mrun.info.status == "FINISHED", val       # 2 epochs + the validate()
    spool, bad = readback.spool_points(tmp_path / "spool" / "lit-more.jsonl")
    assert not bad and spool["val_loss"] == val


def test_only_rank_zero_writes(tmp_path):
    from lightning.pytorch.loggers.logger import DummyLogger
    from lightning.pytorch.utilities.rank_zero import rank_zero_only
    logger = _logger(tmp_path, "lit-rank1")
    saved = rank_zero_only.rank
    rank_zero_only.rank = 1
    try:
        logger.log_hyperparams({"lr": 1.0})
        logger.log_metrics({"loss": 1.0}, step=0)
        assert type(logger.experiment) is type(DummyLogger().experiment)      # Lightning's stand-in
        logger.finalize("success")
    finally:
        rank_zero_only.rank = saved
    assert not logger._tee.opened and logger.outcome is None
    assert not (tmp_path / "spool").exists() and not (tmp_path / "tb").exists()
