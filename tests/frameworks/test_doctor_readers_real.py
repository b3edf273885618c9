"""``trackbridge doctor`` reads real files as they are written (issue 32, reader bugs), each made by the real code:

* a legacy-PPO TensorBoard folder written through Accelerate's TensorBoard tracker (``Accelerator(log_with=
  "tensorboard")``, what TRL 0.11's ``PPOTrainer`` uses): ``init_trackers`` calls ``SummaryWriter.add_hparams``,
  which writes the config to a sub-folder of its own (named by ``time.time()``) that sorts before nothing and holds
  no metric. That sub-run is the run's config, not a run: doctor reads the real run (it exited 2 on the empty one);
* a ``trainer_state.json`` saved by a real TRL 1.16 ``GRPOTrainer`` with ``logging_steps=2``: every caveat says the
  file's ``logging_steps=2``, none TRL's default 10;
* a ``trainer_state.json`` of a real TRL 1.16 ``RLOOTrainer``: its keys are GRPO's, but its ``kl`` is k1 and goes
  negative, which GRPO's k3 never does: doctor reads it as RLOO (``kl-negative`` runs) and says why; on a real GRPO
  file, where nothing tells them apart, doctor says which checks the guess decides.
"""
from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.integration

from trackbridge import cli  # noqa: E402
from trackbridge.exitcodes import OK, PROBLEMS  # noqa: E402


def doctor(capsys, *argv):
    capsys.readouterr()                 # what training printed (TRL prints each logged row)
    try:
        rc = cli.main(["doctor", *[str(a) for a in argv]])
    except SystemExit as exc:
        rc = int(exc.code or 0)
    out = capsys.readouterr()
    return rc, out.out, out.err


# ------------------------------------------------------------------------------- Accelerate's TensorBoard folder
PPO_KEYS = ["objective/kl", "objective/kl_dist", "objective/logprobs", "objective/ref_logprobs", "objective/kl_coef",
            "objective/entropy", "ppo/mean_non_score_reward", "ppo/mean_scores", "ppo/std_scores",
            "tokens/queries_len_mean", "tokens/responses_len_mean", "ppo/loss/policy", "ppo/loss/value",
            "ppo/loss/total", "ppo/policy/entropy", "ppo/policy/approxkl", "ppo/policy/policykl",
            "ppo/policy/clipfrac", "ppo/policy/advantages_mean", "ppo/returns/mean", "ppo/val/mean",
            "ppo/val/clipfrac", "ppo/learning_rate", "time/ppo/total", "env/reward_mean", "env/reward_std"]


def test_accelerate_tensorboard_hparams_subrun_is_the_runs_config(tmp_path, capsys):
    pytest.importorskip("accelerate")
    pytest.importorskip("tensorboard")
    from accelerate import Accelerator

    acc = Accelerator(log_with="tensorboard", project_dir=str(tmp_path / "logs"), cpu=True)
    acc.init_trackers("ppo", config={"learning_rate": 1.41e-5, "batch_size": 8, "init_kl_coef": 0.2,
                                     "adap_kl_ctrl": True, "ppo_epochs": 4})
    for step in range(40):
        row = {k: 0.1 + 0.001 * step for k in PPO_KEYS}
        row["ppo/val/clipfrac"] = 0.9 if step >= 20 else 0.05      # the value function clipped (a warning)
        acc.log(row, step=step)
    acc.end_training()
    folders = sorted(p.parent.relative_to(tmp_path / "logs") for p in (tmp_path / "logs").rglob("*tfevents*"))
    assert len(folders) == 2 and folders[0].as_posix() == "ppo"        # the run, and add_hparams' own sub-folder

    rc, out, err = doctor(capsys, tmp_path / "logs", "--json")
    assert rc in (OK, PROBLEMS), err
    doc = json.loads(out)
    assert isinstance(doc, dict), "one run, not two"                   # the sub-folder is not a run
    assert doc["run"] == "ppo" and doc["records"] == 40
    assert doc["source"].startswith("trl/ppo_legacy"), doc["source"]
    from trackbridge.read.inputs import open_runs
    (run,) = open_runs(str(tmp_path / "logs"), rows=True)
    assert run.info.config["learning_rate"] == pytest.approx(1.41e-5) and run.info.config["ppo_epochs"] == 4


def test_a_tensorboard_subfolder_with_metrics_is_still_a_run(tmp_path, capsys):
    """Only a folder of nothing but hparams is folded into the run above it: a nested run with scalars stays."""
    pytest.importorskip("tensorboard")
    torch = pytest.importorskip("torch")  # noqa: F841
    from torch.utils.tensorboard import SummaryWriter

    for sub in ("outer", "outer/inner"):
        w = SummaryWriter(str(tmp_path / "tb" / sub))
        for step in range(5):
            w.add_scalar("loss", 1.0 / (step + 1), step)
        w.close()
    from trackbridge.read.inputs import open_runs
    assert len(open_runs(str(tmp_path / "tb"), rows=True)) == 2


# ------------------------------------------------------------------------------- real TRL trainer_state.json files
@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    pytest.importorskip("trl")
    from _support.tiny_trl import build_tiny_model
    return build_tiny_model(tmp_path_factory.mktemp("tiny-llama-readers"))


def _state(tmp_path, tiny_model, trainer, logging_steps=1, steps=12):
    datasets = pytest.importorskip("datasets")
    import trl

    from _support.tiny_trl import sentences

    Config, Trainer = ((trl.GRPOConfig, trl.GRPOTrainer) if trainer == "grpo" else (trl.RLOOConfig, trl.RLOOTrainer))

    def reward(completions, **kwargs):
        return [len(c) / 10 for c in completions]

    args = Config(output_dir=str(tmp_path / trainer), max_steps=steps, logging_steps=logging_steps,
                  per_device_train_batch_size=2, num_generations=2, max_completion_length=8, beta=0.04,
                  report_to="none", use_cpu=True, save_strategy="no", seed=0, learning_rate=1e-3, disable_tqdm=True,
                  dataloader_num_workers=0)
    t = Trainer(model=tiny_model, reward_funcs=[reward], args=args,
                train_dataset=datasets.Dataset.from_dict({"prompt": sentences(64, 7)}))
    t.train()
    path = tmp_path / f"{trainer}_trainer_state.json"
    t.state.save_to_json(str(path))
    return path


def test_caveats_use_the_files_logging_steps(tmp_path, tiny_model, capsys):
    path = _state(tmp_path, tiny_model, "grpo", logging_steps=2, steps=16)
    assert json.loads(path.read_text())["logging_steps"] == 2
    rc, out, err = doctor(capsys, path, "--json")
    doc = json.loads(out)
    caveats = [c for f in doc["findings"] for c in f["caveats"]]
    windows = [c for c in caveats if "logging_steps" in c]
    assert windows, caveats                                     # a TRL row averages the 2 steps since the last log
    assert all("logging_steps=2" in c and "logging_steps=10" not in c for c in windows), windows


def test_an_rloo_file_is_read_as_rloo_by_its_values(tmp_path, tiny_model, capsys):
    path = _state(tmp_path, tiny_model, "rloo")
    kl = [r["kl"] for r in json.loads(path.read_text())["log_history"] if "kl" in r]
    assert min(kl) < 0, kl                                      # RLOO's k1: what GRPO's k3 never is
    rc, out, err = doctor(capsys, path, "--json")
    doc = json.loads(out)
    assert doc["source"].startswith("trl/rloo"), doc["source"]
    assert "kl-negative" in doc["checks_run"]
    (note,) = doc["notes"]
    assert "read as rloo" in note and "kl/ref/k3" in note and "never negative" in note
    # told it is GRPO, doctor reads it so, and says what the values say
    rc, out, err = doctor(capsys, path, "--from", "trl/grpo", "--json")
    doc = json.loads(out)
    assert doc["source"].startswith("trl/grpo") and "kl-negative" not in doc["checks_run"]
    (note,) = doc["notes"]
    assert note.startswith("kl/ref/k3 is -") and "never negative" in note


def test_a_grpo_file_says_what_the_guess_decides(tmp_path, tiny_model, capsys):
    path = _state(tmp_path, tiny_model, "grpo")
    kl = [r["kl"] for r in json.loads(path.read_text())["log_history"] if "kl" in r]
    assert min(kl) >= 0, kl
    rc, out, err = doctor(capsys, path)
    assert "translated from trl/grpo" in out
    notes = [ln for ln in out.splitlines() if ln.strip().startswith("note: the keys fit trl trainers grpo, rloo")]
    assert len(notes) == 1 and "kl-negative would run" in notes[0], out
    # named, the trainer is not guessed: no note
    rc, out, err = doctor(capsys, path, "--from", "trl/grpo")
    assert "the keys fit" not in out
