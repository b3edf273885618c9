"""A ``trainer_state.json``'s settings are the run config in every command (issue 29): ``translate``, ``detect``
and ``doctor`` take its ``logging_steps`` (the window of every TRL row: transformers' ``Trainer.log`` averages the steps
since the last log) as ``migrate`` and ``compare`` do, instead of assuming TRL's default (10 from v0.19.0,
mappings/trl.yaml ``config:``)."""
from __future__ import annotations

import json

import pytest

from trackbridge import cli
from trackbridge.read.inputs import open_runs


def write_state(folder, logging_steps: int):
    """A trainer_state.json as transformers' TrainerState.save_to_json writes it (the fields the reader keeps)."""
    rows = [{"loss": 0.1 * i, "grad_norm": 1.0, "learning_rate": 1e-5, "reward": 0.2 * i, "reward_std": 0.1,
             "kl": 0.01, "completions/mean_length": 50.0, "frac_reward_zero_std": 0.1, "epoch": 0.1 * i,
             "step": logging_steps * i} for i in range(1, 6)]
    path = folder / "trainer_state.json"
    path.write_text(json.dumps({"log_history": rows, "logging_steps": logging_steps, "global_step": 5 * logging_steps,
                                "max_steps": 5 * logging_steps, "train_batch_size": 8}, indent=2))
    return path


@pytest.mark.parametrize("steps", [1, 4])
def test_the_rows_path_reads_the_state_settings(tmp_path, steps):
    (run,) = open_runs(str(write_state(tmp_path, steps)), rows=True)
    assert run.info.config.get("logging_steps") == steps
    assert [r.step for r in run.records()] == [steps * i for i in range(1, 6)]


def test_translate_judges_the_window_with_the_files_logging_steps(tmp_path):
    path = write_state(tmp_path, 4)
    report = tmp_path / "r.json"
    assert cli.main(["translate", str(path), "--to", "verl", "--report-json", str(report)]) == 0
    approx = json.loads(report.read_text())["approximate"]
    reasons = " ".join(approx.values())
    assert "logging_steps=4" in reasons and "logging_steps=10" not in reasons, reasons


def test_translate_with_logging_steps_1_has_no_window_difference(tmp_path):
    path = write_state(tmp_path, 1)
    report = tmp_path / "r.json"
    assert cli.main(["translate", str(path), "--to", "verl", "--report-json", str(report)]) == 0
    reasons = " ".join(json.loads(report.read_text())["approximate"].values())
    assert "[window]" not in reasons, reasons


def test_detect_says_the_config_it_used(tmp_path, capsys):
    path = write_state(tmp_path, 4)
    assert cli.main(["detect", "--json", str(path)]) == 0
    out = capsys.readouterr().out
    assert '"logging_steps": 4' in out or "logging_steps" in out, out
