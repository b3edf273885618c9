"""``detect``, ``translate``, ``migrate`` and ``compare`` give the same source for the same TensorBoard folder,
config included (issue 18, item 6).

A transformers/TRL TensorBoard folder holds the run's ``TrainingArguments`` (``add_text("args", ...)``:
``args/text_summary``). RLOO logs exactly PPOv2's names up to TRL 0.21 and exactly GRPO's from 0.22, so only that
config tells them apart (tests/frameworks/test_detect_rloo.py). Before, ``detect`` and ``translate`` read the keys
alone (RLOO 1.16 came out as GRPO, RLOO 0.11 as PPO) while ``migrate`` and ``compare`` used the config; now every
command reads a run through :func:`trackbridge.read.inputs.open_runs` and resolves its source one way.

The folders: GRPO and RLOO written by real TRL 1.16.0 trainers (``report_to="tensorboard"``, the tiny model of
tests/_support/tiny_trl.py, 3 steps on CPU), and RLOO / PPOv2 of TRL 0.11.4, which cannot run beside transformers 5,
written event by event the way transformers' ``TensorBoardCallback`` writes (``add_text("args", ...)`` at train
begin, then ``add_scalar("train/" + key, value, global_step)``), with the keys and config fields those trainers
have at v0.11.4 (tests/data/frameworks/trl-rl-detection-sets.json, read from TRL's source at the tag).
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from _support import DATA

pytestmark = pytest.mark.integration

SETS = json.loads((DATA / "frameworks" / "trl-rl-detection-sets.json").read_text())["sets"]


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, "-m", "trackbridge", *map(str, args)], capture_output=True, text=True,
                       cwd=cwd, timeout=600)
    assert "Traceback" not in r.stderr, r.stderr
    return r


def _spec(text: str) -> str:
    """``trl/rloo@v0.26.0..v1.16.0 (detected, confidence 0.95)`` -> ``trl/rloo@v0.26.0..v1.16.0``."""
    return text.split(" (", 1)[0].strip()


def _write_trl_0_11(folder: Path, name: str) -> None:
    """A TensorBoard run as TRL 0.11.4's trainer ``name`` leaves it through transformers' TensorBoardCallback."""
    from torch.utils.tensorboard import SummaryWriter
    s = SETS[name]
    args = {"output_dir": f"out/{name}", "learning_rate": 3e-06, "per_device_train_batch_size": 4,
            "gradient_accumulation_steps": 1, "logging_steps": 1, "report_to": ["tensorboard"], "seed": 42}
    args.update({f: 0.05 if f not in ("exp_name", "reward_model_path", "base_model") else "x"
                 for f in s["config_fields"]})
    w = SummaryWriter(str(folder))
    w.add_text("args", json.dumps(args, indent=2, sort_keys=True), 0, walltime=1_700_000_000.0)
    for step in range(1, 4):
        for i, key in enumerate(s["keys"]):
            tag = key if key.startswith(("train/", "eval/")) else f"train/{key}"
            w.add_scalar(tag, 0.1 * step + 0.01 * i, step, walltime=1_700_000_000.0 + 10 * step + 1e-5 * i)
    w.close()


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    pytest.importorskip("torch")
    pytest.importorskip("tensorboard")
    pytest.importorskip("mlflow")
    pytest.importorskip("trl")
    datasets = pytest.importorskip("datasets")
    from trl import GRPOConfig, GRPOTrainer, RLOOConfig, RLOOTrainer

    from _support.tiny_trl import build_tiny_model, sentences

    tmp = tmp_path_factory.mktemp("trl-tb")

    def length_reward(completions, **kwargs):
        return [float(len(c.split())) for c in completions]

    model = build_tiny_model(tmp / "model")
    ds = datasets.Dataset.from_dict({"prompt": sentences(32, 1)})
    common = dict(logging_steps=1, per_device_train_batch_size=4, report_to="tensorboard", use_cpu=True,
                  save_strategy="no", seed=0, disable_tqdm=True, dataloader_num_workers=0, max_steps=3,
                  num_generations=4, max_completion_length=8)
    out = {}
    for name, cfg_cls, trainer_cls, kw in (("grpo", GRPOConfig, GRPOTrainer, {"beta": 0.04}),
                                          ("rloo", RLOOConfig, RLOOTrainer, {})):
        args = cfg_cls(output_dir=str(tmp / name), **common, **kw)
        trainer_cls(model=model, reward_funcs=[length_reward], args=args, train_dataset=ds).train()
        (run,) = {p.parent for p in (tmp / name).rglob("events.out.tfevents.*")}
        out[f"{name}@v1.16.0"] = (run, name)
    for name in ("rloo@v0.11.4", "ppo@v0.11.4"):
        folder = tmp / name.replace("@", "-") / "runs" / "Nov26_10-00-00_host"
        _write_trl_0_11(folder, name)
        out[name] = (folder, SETS[name]["trainer"])
    return out


@pytest.mark.parametrize("case", ["grpo@v1.16.0", "rloo@v1.16.0", "rloo@v0.11.4", "ppo@v0.11.4"])
def test_the_four_commands_resolve_one_source_from_keys_and_config(folders, case, tmp_path):
    folder, trainer = folders[case]
    env = {}
    # detect: the run config is read and named
    det = _cli("detect", "--json", folder, cwd=tmp_path)
    assert det.returncode == 0, det.stderr
    d = json.loads(det.stdout)
    assert d["config"] == ["args"] or d["config"] == ["args", "model_config"], d
    assert "run config has fields only" in d["reason"] and trainer in d["reason"], d["reason"]
    env["detect"] = d["source"]
    # translate
    rep = tmp_path / "report.json"
    tr = _cli("translate", "--report-json", rep, folder, cwd=tmp_path)
    assert tr.returncode == 0, tr.stderr
    env["translate"] = json.loads(rep.read_text())["source"]
    assert tr.stdout.count("\n") >= 3
    # migrate (into JSON lines: the header is the run as written, config and source included)
    dst = tmp_path / "migrated"
    mig = _cli("migrate", "--quiet", f"tensorboard:{folder}", f"jsonl:{dst}", cwd=tmp_path)
    assert mig.returncode == 0, mig.stderr
    (stream,) = dst.glob("*.jsonl")
    header = json.loads(stream.read_text().splitlines()[0])
    env["migrate"] = header["source"]
    # compare
    cmp_ = _cli("compare", f"run=tensorboard:{folder}", "--out", tmp_path / "report", cwd=tmp_path)
    assert cmp_.returncode == 0, cmp_.stderr
    (line,) = [ln for ln in cmp_.stderr.splitlines() if ln.startswith("run: ")]
    env["compare"] = line.split("translated from ", 1)[1]

    specs = {cmd: _spec(s) for cmd, s in env.items()}
    assert len(set(specs.values())) == 1, specs
    assert specs["detect"].startswith(f"trl/{trainer}@"), specs
    release = case.split("@")[1]
    from trackbridge.schema.loader import load_registry
    from trackbridge.schema.spec import parse_spec
    reg = load_registry()
    sp = parse_spec(specs["detect"], reg)
    rel = reg.frameworks["trl"].release_index(release)
    assert sp.lo <= rel <= sp.hi, (specs, release)
    # config included: what migrate wrote is the folder's own TrainingArguments
    args = header["config"]["args"]
    assert isinstance(args, dict) and args["logging_steps"] == 1 and args["report_to"] == ["tensorboard"], args
    own = set(SETS[case if case in SETS else f"{trainer}@v1.16.0"]["config_fields"])
    assert own & set(args), "the run config lost the fields that name the trainer"
