"""Issue 31: a run config beyond what trackbridge takes (trackbridge/limits.py: at most 10,000 keys, 1 MB a
value, 10 MB in all) is refused at ``init`` in a fraction of a second with one line naming the key or the count and
the limit, before any tracker is opened: nothing written, nothing pending, the run id free. A config of a million keys
once left every tracker pending after a 48 s ``init``; a 50 MB string kept SwanLab from opening. ``migrate`` refuses
such a run alone, in one line. Within the limits, MLflow's shorter param limit is a cut said once per key."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

import trackbridge
from trackbridge.errors import ConfigTooLarge
from trackbridge.limits import MAX_CONFIG_BYTES, MAX_KEYS, MAX_VALUE_BYTES
from trackbridge.logger import LoggerWarning
from trackbridge.record import Record, RunInfo, dumps

from _support import ROOT
from _support.readback import mlflow_run, tensorboard_points
from _support.tracker_files import swanlab_points


def _sinks(d: Path, mlflow_template: Path | None = None) -> list[str]:
    out = [f"tensorboard:{d / 'tb'}", f"wandb:{d / 'wb'}", f"swanlab:{d / 'sw'}"]
    if mlflow_template is not None:
        db = d / "ml.db"
        db.write_bytes(mlflow_template.read_bytes())
        out.append(f"mlflow:sqlite:///{db}")
    return out


def _refused(d: Path, config: dict) -> tuple[str, float]:
    t0 = time.monotonic()
    with pytest.raises(ConfigTooLarge) as exc:
        trackbridge.init(project="limits", run_id="big", sinks=_sinks(d), config=config, spool=str(d / "spool"))
    took = time.monotonic() - t0
    message = str(exc.value)
    assert "\n" not in message and isinstance(exc.value, ValueError)
    # nothing was claimed, opened or written: no spool, no lock, no note, no tracker folder
    assert not (d / "spool").exists() and not any((d / n).exists() for n in ("tb", "wb", "sw")), \
        sorted(p.name for p in d.iterdir())
    return message, took


def _run_after(d: Path) -> None:
    """The same run id logs at once afterwards: every tracker opened, closed, nothing pending."""
    run = trackbridge.init(project="limits", run_id="big", sinks=_sinks(d), config={"lr": 1e-5},
                           spool=str(d / "spool"), options=trackbridge.LoggerOptions(writer="thread"))
    for s in range(3):
        run.log({"loss/total": float(s)}, step=s)
    st = run.finish()
    assert [s["state"] for s in st["sinks"]] == ["closed"] * 4, run.summary()
    assert not (d / "spool" / "big.jsonl.pending.json").exists()
    points, config, _raw = swanlab_points(d / "sw")
    assert sorted((k, s) for k, s, _t, _v in points) == [("loss/total", s) for s in range(3)]
    assert config["lr"] == 1e-5


@pytest.mark.parametrize("shape", ["flat", "nested"])
def test_a_million_keys_are_refused_at_once_naming_the_count_and_the_limit(tmp_path, wandb_env, shape):
    config = ({f"k{i}": i for i in range(1_000_000)} if shape == "flat" else
              {f"layer_{i}": {f"w{j}": j for j in range(1000)} for i in range(1000)})
    message, took = _refused(tmp_path, config)
    assert "the config has 1,000,000 keys" in message and f"more than the {MAX_KEYS:,}" in message, message
    assert took < 5.0, took            # the check walks the dict once; it was 48 s of init before
    _run_after(tmp_path)


def test_a_50_mb_string_is_refused_naming_the_key(tmp_path, wandb_env):
    config = {"lr": 1e-5, "data": {"prompt_bank": "x" * 50_000_000}}
    message, took = _refused(tmp_path, config)
    assert "config key 'data.prompt_bank' is 50 MB (a str of 50,000,000 characters)" in message, message
    assert f"more than the {MAX_VALUE_BYTES // 1_000_000} MB a config value may be" in message, message
    assert took < 2.0, took
    _run_after(tmp_path)


def test_a_config_too_big_in_all_is_refused(tmp_path, wandb_env):
    per = 600_000                                       # each within the 1 MB of a value, 17 of them over 10 MB
    config = {f"table_{i:02d}": "y" * per for i in range(40)}
    message, _took = _refused(tmp_path, config)
    over = MAX_CONFIG_BYTES // (per + len("table_00") + 2) + 1
    assert (f"the config is more than 10 MB in all (its first {over:,} of 40 keys, up to 'table_{over - 1:02d}')"
            in message), message


def test_the_limits_themselves_are_taken_whole(tmp_path, wandb_env):
    """10,000 keys and a value just under 1 MB are taken: every tracker keeps them (read back with its own tools)."""
    config = {f"k{i:05d}": i for i in range(MAX_KEYS - 1)}
    config["blob"] = "z" * (MAX_VALUE_BYTES - 100)
    run = trackbridge.init(project="limits", run_id="edge", sinks=[f"tensorboard:{tmp_path / 'tb'}",
                                                                   f"swanlab:{tmp_path / 'sw'}"],
                           config=config, spool=str(tmp_path / "spool"), source="canonical")
    run.log({"loss/total": 1.0}, step=0)
    st = run.finish()
    assert [s["state"] for s in st["sinks"]] == ["closed"] * 3, run.summary()
    header = json.loads((tmp_path / "spool" / "edge.jsonl").read_text().splitlines()[0])
    assert {k: header["config"][k] for k in config} == config
    _points, sw_config, _raw = swanlab_points(tmp_path / "sw")
    assert sw_config["blob"] == config["blob"] and sw_config["k09998"] == 9998
    assert tensorboard_points(tmp_path / "tb") == {"loss/total": Counter({0: 1})}


def test_mlflow_keeps_a_long_value_cut_and_says_so_once(tmp_path, mlflow_template, wandb_env):
    text = "p" * 7000
    db = tmp_path / "ml.db"
    db.write_bytes(mlflow_template.read_bytes())
    with pytest.warns(LoggerWarning) as rec:
        run = trackbridge.init(project="limits", run_id="cut", sinks=[f"mlflow:sqlite:///{db}",
                                                                      f"tensorboard:{tmp_path / 'tb'}"],
                               config={"prompt": text}, spool=str(tmp_path / "spool"), source="canonical")
        run.log({"loss/total": 1.0}, step=0)
        st = run.finish()
    assert [s["state"] for s in st["sinks"]] == ["closed"] * 3, run.summary()
    said = [str(w.message) for w in rec if "keeps its first" in str(w.message)]
    assert said == ["trackbridge: config key 'prompt' is 7,000 characters: mlflow keeps its first 6,000 (the other "
                    "trackers and the spool keep it whole)"], said
    _client, mrun = mlflow_run(f"sqlite:///{db}", "cut")
    assert mrun.data.params["prompt"] == text[:6000]
    header = json.loads((tmp_path / "spool" / "cut.jsonl").read_text().splitlines()[0])
    assert header["config"]["prompt"] == text


def test_migrate_refuses_a_run_whose_config_is_too_big_alone(tmp_path):
    """Two runs in a folder of streams, one with a config of 20,000 keys (written by hand: init refuses it): that
    run fails in one line naming the count and the limit; the other is migrated."""
    src = tmp_path / "src"
    src.mkdir()
    for run_id, config in (("small", {"lr": 1e-5}), ("huge", {f"k{i}": i for i in range(20_000)})):
        info = RunInfo(name=run_id, project="p", run_id=run_id, config=config, names="canonical")
        recs = [Record(step=s, wall_time=1000.0 + s, metrics={"loss/total": float(s)}) for s in range(4)]
        (src / f"{run_id}.jsonl").write_text("".join(dumps(x) + "\n" for x in [info.to_json(),
                                                                              *(r.to_json() for r in recs)]))
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    p = subprocess.run([sys.executable, "-m", "trackbridge", "migrate", f"jsonl:{src}",
                        f"tensorboard:{tmp_path / 'tb'}", "--from", "canonical"],
                       capture_output=True, text=True, env=env, timeout=300, cwd=str(ROOT))
    assert "Traceback" not in p.stderr, p.stderr[-3000:]
    assert p.returncode == 1, (p.returncode, p.stdout[-2000:], p.stderr[-2000:])
    said = [ln for ln in (p.stdout + p.stderr).splitlines() if "20,000 keys" in ln]
    assert len(said) == 1 and "run 'huge'" in said[0] and "more than the 10,000 trackbridge takes" in said[0], \
        p.stdout + p.stderr
    folders = sorted(x.name for x in (tmp_path / "tb").iterdir() if x.is_dir())
    assert folders == ["small"], folders
    assert tensorboard_points(tmp_path / "tb" / "small") == {"loss/total": Counter(range(4))}
