"""The plain-file readers (console logs, trainer_state.json, W&B CSV exports) on the shipped examples and on the real
public logs: values must equal the source rows exactly, problems must be reported with file and line, never a crash,
never an invented wall time."""
from __future__ import annotations

import json
import math
import pprint
from pathlib import Path

import pytest

from trackbridge.files import trainer_state as ts_mod
from trackbridge.files.printed import parse_number, parse_printed_dict
from trackbridge.trackers import open_source
from trackbridge.tracking.source import SourceError

from _support import DATA, ROOT

EXAMPLES = ROOT / "examples"
PUBLIC = DATA / "public-logs"
SUMMARY_KEYS = {"train_runtime", "train_samples_per_second", "train_steps_per_second", "train_loss", "total_flos"}

def needs_public(f):          # the public logs ship in tests/data: always there
    return f


def rows(name: str) -> list[dict]:
    return json.loads((PUBLIC / name).read_text())["rows"]


def one_run(locator: str):
    runs = list(open_source(locator).runs())
    assert len(runs) == 1
    run = runs[0]
    return run, list(run.records())


def same(a, b) -> bool:
    """Equal, with NaN equal to NaN and the type family (int vs float) ignored like ==."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def assert_metrics(got: dict, want: dict) -> None:
    assert list(got) == list(want), set(got) ^ set(want)
    for k in want:
        assert same(got[k], want[k]), (k, got[k], want[k])


# ---------------------------------------------------------------------------------------------------- helpers
def test_parse_number_forms():
    assert parse_number("3") == 3 and isinstance(parse_number("3"), int)
    assert parse_number("-0.000") == 0.0 and math.copysign(1, parse_number("-0.000")) == -1
    assert parse_number("1e-06") == 1e-06
    assert math.isnan(parse_number("nan")) and math.isnan(parse_number("NaN"))
    assert parse_number("-inf") == -math.inf and parse_number("Infinity") == math.inf
    assert parse_number("np.float64(0.5)") == 0.5
    assert parse_number("np.int64(7)") == 7
    assert parse_number("tensor(0.25, device='cuda:0')") == 0.25
    assert parse_number("True") == 1
    assert parse_number("abc") is None and parse_number("") is None and parse_number("1.2.3") is None


def test_parse_printed_dict_is_safe_and_unwraps():
    values, dropped, quoted = parse_printed_dict("{'loss': tensor(0.5, device='cuda:0', grad_fn=<MeanBackward0>)}")
    assert values == {"loss": 0.5} and not quoted
    values, dropped, quoted = parse_printed_dict(
        "{'loss': tensor(0.5, device='cuda:0'), 'kl': np.float64(0.25), 'x': nan, 'y': -inf, 'lr': '1e-05',"
        " 'name': 'gsm8k', 'hist': [1, 2], 'ok': True}")
    assert values["loss"] == 0.5 and values["kl"] == 0.25 and math.isnan(values["x"]) and values["y"] == -math.inf
    assert values["lr"] == 1e-05 and quoted
    assert values["name"] == "gsm8k" and values["ok"] == 1
    assert dropped == ["hist"]
    with pytest.raises(ValueError):
        parse_printed_dict("{'a': 1")
    values, dropped, _ = parse_printed_dict("{'a': __import__('os').getcwd()}")
    assert values == {} and dropped == ["a"]          # never evaluated


# ---------------------------------------------------------------------------------------------------- console: veRL
@needs_public
def test_verl_console_example_equals_public_rows():
    run, recs = one_run(f"console:{EXAMPLES / 'verl_console.log'}")
    src = rows("01_verl.json")
    assert len(recs) == len(src) == 200
    for rec, row in zip(recs, src):
        assert rec.step == row["step"]
        assert rec.wall_time is None
        assert_metrics(rec.metrics, {k: v for k, v in row.items() if k != "step"})
    assert run.has_wall_time is False
    assert run.info.extra["format"] == "verl" and run.info.extra["step_source"] == "logged"
    assert run.info.names == "raw"
    # the only problem is the summary of non-metric lines (tqdm, Ray chatter), with line numbers
    assert len(run.problems) == 1 and "lines without metrics" in run.problems[0].what
    assert "lines 1, 2, 4" in run.problems[0].what


@needs_public
def test_verl_console_pprint_format_recent_verl(tmp_path):
    """Recent veRL prints pprint.pformat(v): full precision, ints, nan/inf and numpy reprs."""
    src = rows("10_verl.json")
    lines = []
    for r in src:
        items = [f"step:{r['step']}"] + [f"{k}:{pprint.pformat(v)}" for k, v in r.items() if k != "step"]
        lines.append(" - ".join(items))
    # numpy 2 reprs, non-finite values, keys with ':' and '@'
    lines.append("step:3 - actor/pg_loss:np.float64(0.5) - val-core/gsm8k/acc/mean@4:np.float32(0.25)"
                 " - weird:key/x:nan - perf/throughput:inf - timing_s/neg:-inf")
    p = tmp_path / "verl.log"
    p.write_text("\n".join(lines) + "\n")
    run, recs = one_run(f"console:{p}")
    assert [r.step for r in recs] == [1, 2, 3]
    for rec, row in zip(recs, src):
        assert_metrics(rec.metrics, {k: v for k, v in row.items() if k != "step"})
        assert isinstance(rec.metrics["rollout/total_num_samples"], int)
    last = recs[2].metrics
    assert last["actor/pg_loss"] == 0.5 and last["val-core/gsm8k/acc/mean@4"] == 0.25
    assert math.isnan(last["weird:key/x"]) and last["perf/throughput"] == math.inf and last["timing_s/neg"] == -math.inf
    assert run.problems == []


def test_console_garbage_and_truncation_reported_with_lines(tmp_path):
    p = tmp_path / "mixed.log"
    content = (
        "Training Progress:   0%|          | 0/10 [00:00<?, ?it/s]\n"                     # 1 noise
        "\x1b[36m(TaskRunner pid=1)\x1b[0m step:1 - a/b:0.100 - c@1:2.000\n"               # 2 ok
        "step:2 - a/b:0.2 - c@1:oops\n"                                                   # 3 malformed value
        "\x00\xff\xfe binary junk\n"                                                      # 4 noise
        "step:3\n"                                                                        # 5 no metrics
        "{'loss': 0.5, 'grad_norm':\n"                                                    # 6 truncated dict
        "  5%|5         | 1/20 [00:01<00:19,  1.00s/it]\r{'loss': 0.25, 'epoch': 0.1}\n"  # 7 tqdm + dict
        "step:4 - a/b:0.4 - c@1:4.0"                                                      # 8 cut off (no newline)
    )
    p.write_bytes(content.encode("latin-1"))           # \xff\xfe: not UTF-8, replaced on reading
    run, recs = one_run(f"console:{p}")
    assert [(r.step, r.metrics) for r in recs] == [(1, {"a/b": 0.1, "c@1": 2.0}), (1, {"loss": 0.25, "epoch": 0.1})]
    where = {pr.where.rsplit(":", 1)[-1]: pr.what for pr in run.problems if pr.where != str(p)}
    assert set(where) == {"3", "5", "6", "8"}, run.problems
    assert "oops" in where["3"] and "cut off" in where["8"] and "cannot be read" in where["6"]
    summary = [pr.what for pr in run.problems if pr.where == str(p)]
    assert summary == ["skipped 2 lines without metrics (lines 1, 4)"]


# ---------------------------------------------------------------------------------------------------- console: dicts
@needs_public
def test_trl_ppo_console_example_equals_public_rows():
    run, recs = one_run(f"console:{EXAMPLES / 'trl_ppo_console.log'}")
    src = rows("12_trl_ppo.json")
    assert [r.step for r in recs] == list(range(1, 9))
    assert run.info.extra["step_source"] == "ordinal" and run.info.extra["format"] == "dict"
    for rec, row in zip(recs, src):
        assert_metrics(rec.metrics, row)
        assert rec.wall_time is None
    assert run.problems == []
    run, recs = one_run(f"console:{EXAMPLES / 'trl_ppo_console.log'}?step=episode")
    assert [r.step for r in recs] == [r["episode"] for r in src]
    assert all("episode" in r.metrics for r in recs)


def test_console_folder_and_missing(tmp_path):
    (tmp_path / "a.log").write_text("step:1 - x:1\n")
    (tmp_path / "b.txt").write_text("{'x': 2, 'step': 5}\n")
    (tmp_path / "c.bin").write_text("step:9 - x:9\n")
    runs = list(open_source(f"console:{tmp_path}").runs())
    assert [r.info.name for r in runs] == ["a", "b"]
    assert [[(x.step, x.metrics) for x in r.records()] for r in runs] == [[(1, {"x": 1})], [(5, {"x": 2})]]
    with pytest.raises(SourceError, match="no such file"):
        list(open_source(f"console:{tmp_path / 'nope.log'}").runs())


# ---------------------------------------------------------------------------------------------------- trainer_state
@needs_public
def test_trainer_state_example_equals_public_rows():
    run, recs = one_run(f"trainer-state:{EXAMPLES / 'trl_grpo_trainer_state.json'}")
    src = rows("05_trl_grpo.json")
    assert [r.step for r in recs] == [r["step"] for r in src]
    for rec, row in zip(recs, src):
        assert rec.wall_time is None
        assert_metrics(rec.metrics, {k: v for k, v in row.items() if k != "step"})
        assert "epoch" in rec.metrics
    assert run.has_wall_time is False
    info = run.info
    assert info.config == {"logging_steps": 1, "eval_steps": 500, "save_steps": 50, "train_batch_size": 4,
                           "num_train_epochs": 3, "max_steps": 200}
    assert info.extra["global_step"] == 100 and info.extra["log_history_entries"] == 100
    assert info.name == "trl_grpo_trainer_state"
    assert run.problems == []


@needs_public
def test_trainer_state_small_chunks_cross_boundaries(monkeypatch):
    """Entries and numbers split across read chunks are still read exactly (the reader streams)."""
    monkeypatch.setattr(ts_mod, "_CHUNK", 7)
    run, recs = one_run(f"trainer-state:{EXAMPLES / 'trl_grpo_trainer_state.json'}")
    src = rows("05_trl_grpo.json")
    assert len(recs) == 100
    for rec, row in zip(recs, src):
        assert_metrics(rec.metrics, {k: v for k, v in row.items() if k != "step"})
    assert run.info.config["max_steps"] == 200


def _write_state(path: Path, history: list, **fields) -> Path:
    state = {"best_metric": None, "epoch": 1.0, "eval_steps": 500, "global_step": 0, "log_history": history,
             "logging_steps": 1, "max_steps": 0, "num_train_epochs": 1, "save_steps": 500,
             "train_batch_size": 8, "trial_name": None, "trial_params": None}
    state.update(fields)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(state, indent=2, sort_keys=True) + "\n")
    return path


@needs_public
@pytest.mark.parametrize("name", ["04_trl_grpo.json", "16_trl_grpo.json", "07_trl_dpo.json", "14_trl_grpo.json"])
def test_trainer_state_public_logs(tmp_path, name):
    src = rows(name)
    _write_state(tmp_path / "out" / "trainer_state.json", src, global_step=src[-1]["step"])
    run, recs = one_run(f"trainer-state:{tmp_path / 'out'}")
    assert run.info.name == "out"
    assert len(recs) == len(src)
    for rec, row in zip(recs, src):
        assert rec.step == row["step"] and rec.wall_time is None
        assert_metrics(rec.metrics, {k: row[k] for k in sorted(row) if k != "step"})   # HF writes keys sorted
    if SUMMARY_KEYS & set(src[-1]):
        assert SUMMARY_KEYS <= set(recs[-1].metrics)          # the final summary dict is a record too
    assert run.problems == []


@needs_public
def test_trainer_state_bare_list_and_other_key(tmp_path):
    src = rows("14_trl_grpo.json")
    p = tmp_path / "step_logs.json"
    p.write_text(json.dumps(src, indent=2))
    run, recs = one_run(f"trainer-state:{p}")
    assert [r.step for r in recs] == [r["step"] for r in src] and run.info.config == {}
    src = rows("07_trl_dpo.json")
    q = tmp_path / "dpo_history.json"
    q.write_text(json.dumps({"run": "dpo-full", "raw_log_history": src}))
    run, recs = one_run(f"trainer-state:{q}?key=raw_log_history")
    assert len(recs) == 91 and recs[-1].metrics["train_runtime"] == 1073.1138


def test_trainer_state_folder_picks_latest_checkpoint_and_trial_params(tmp_path):
    out = tmp_path / "grpo-run"
    _write_state(out / "checkpoint-5" / "trainer_state.json", [{"loss": 1.0, "step": 5}])
    _write_state(out / "checkpoint-10" / "trainer_state.json",
                 [{"loss": 1.0, "step": 5}, {"loss": 0.5, "step": 10}],
                 trial_params={"learning_rate": 1e-5, "beta": 0.1}, trial_name="trial-3")
    run, recs = one_run(f"trainer-state:{out}")
    assert [r.step for r in recs] == [5, 10]
    assert run.info.config["learning_rate"] == 1e-5 and run.info.config["beta"] == 0.1
    assert run.info.config["train_batch_size"] == 8
    assert run.info.name == "trial-3"
    assert run.info.extra["other_state_files"] == [str(out / "checkpoint-5" / "trainer_state.json")]
    # a root trainer_state.json wins over checkpoints
    _write_state(out / "trainer_state.json", [{"loss": 0.1, "step": 20}])
    run, recs = one_run(f"trainer-state:{out}")
    assert [r.step for r in recs] == [20] and run.info.name == "grpo-run"
    with pytest.raises(SourceError, match="no trainer_state.json"):
        list(open_source(f"trainer-state:{tmp_path / 'grpo-run' / 'checkpoint-5' / '..' / '..'}").runs())


@needs_public
def test_trainer_state_truncated_and_bad_entries(tmp_path):
    text = (EXAMPLES / "trl_grpo_trainer_state.json").read_text()
    src = rows("05_trl_grpo.json")
    cut = text.index('"step": 42')                       # cut inside the 42nd entry
    p = tmp_path / "trainer_state.json"
    p.write_text(text[:cut])
    run, recs = one_run(f"trainer-state:{p}")
    assert [r.step for r in recs] == list(range(1, 42))  # every complete entry, never the partial 42nd
    for rec, row in zip(recs, src):
        assert_metrics(rec.metrics, {k: v for k, v in row.items() if k != "step"})
    [prob] = run.problems
    line = int(prob.where.rsplit(":", 1)[1])
    assert "truncated" in prob.what
    assert text[:cut].count("\n") - 30 < line <= text[:cut].count("\n") + 1
    # entries without a step, non-scalar values and NaN
    _write_state(p, [{"loss": 1.0}, {"loss": float("nan"), "step": 2, "hist": [1, 2]}, "garbage", {"x": 1, "step": 3}])
    run, recs = one_run(f"trainer-state:{p}")
    assert [r.step for r in recs] == [2, 3]
    assert math.isnan(recs[0].metrics["loss"]) and "hist" not in recs[0].metrics
    whats = [pr.what for pr in run.problems]
    assert any("no integer 'step'" in w for w in whats) and any("hist" in w for w in whats)
    assert any("not an object" in w for w in whats)
    assert all(pr.where.startswith(str(p) + ":") for pr in run.problems)
    # not JSON at all: reported, no crash
    p.write_text("this is not json\n")
    run, recs = one_run(f"trainer-state:{p}")
    assert recs == [] and run.problems


# ---------------------------------------------------------------------------------------------------- csv
@needs_public
def test_csv_wandb_history_example_equals_public_rows():
    run, recs = one_run(f"csv:{EXAMPLES / 'trl_dpo_wandb_export.csv'}")
    src = rows("07_trl_dpo.json")
    assert len(recs) == len(src) == 91
    assert run.has_wall_time is False and all(r.wall_time is None for r in recs)
    assert run.info.extra["step_source"] == "train/global_step"
    assert run.info.extra["left_out_columns"] == ["_step"]
    for rec, row in zip(recs, src):
        assert rec.step == row["step"]
        want = {f"train/{k}": v for k, v in row.items() if k != "step" and k not in SUMMARY_KEYS}
        assert rec.metrics == want                       # missing cells are absent, not NaN
    assert recs[-1].metrics == {"train/epoch": 2.0}
    assert run.problems == []


def test_csv_timestamps_panel_export_and_garbage(tmp_path):
    p = tmp_path / "hist.csv"
    p.write_text("_runtime,_step,_timestamp,loss,media,note\n"
                 "1.5,0,1763700000.5,0.9,,warmup\n"
                 "2.5,1,1763700001.5,,{\"_type\": \"table-file\"},\n"
                 "3.5,2,1763700002.5,NaN,,\n"
                 "4.5,3,17637")                     # cut off
    run, recs = one_run(f"csv:{p}")
    assert run.has_wall_time is True
    assert [(r.step, r.wall_time) for r in recs] == [(0, 1763700000.5), (2, 1763700002.5)]
    assert recs[0].metrics == {"loss": 0.9, "note": "warmup"}
    assert math.isnan(recs[1].metrics["loss"])       # an explicit NaN stays NaN; the empty cell was skipped
    whats = {pr.where: pr.what for pr in run.problems}
    assert "cells" in whats[f"{p}:5"]
    assert any("non-scalar" in w and "media" in w and "lines 3" in w for w in whats.values())

    panel = tmp_path / "panel.csv"
    panel.write_text("Step,grpo-a - train/reward,grpo-a - train/reward__MIN,grpo-a - train/reward__MAX,"
                     "ppo-b - train/reward\n"
                     "1,0.5,0.4,0.6,\n"
                     "2,0.7,0.6,0.8,0.1\n"
                     "3,,,,0.2\n")
    runs = list(open_source(f"csv:{panel}").runs())
    assert [r.info.name for r in runs] == ["grpo-a", "ppo-b"]
    a, b = ([(x.step, x.metrics) for x in r.records()] for r in runs)
    assert a == [(1, {"train/reward": 0.5}), (2, {"train/reward": 0.7})]
    assert b == [(2, {"train/reward": 0.1}), (3, {"train/reward": 0.2})]
    assert runs[0].info.extra["left_out_columns"] == ["grpo-a - train/reward__MIN", "grpo-a - train/reward__MAX"]
    assert runs[0].has_wall_time is False

    plain = tmp_path / "plain.csv"
    plain.write_text("loss,acc\n1.0,0.1\n0.5,0.2\n")
    run, recs = one_run(f"csv:{plain}")
    assert [r.step for r in recs] == [1, 2] and run.info.extra["step_source"] == "ordinal"
    run, recs = one_run(f"csv:{plain}?step=acc")
    assert recs == [] and "rows with no integer 'acc'" in run.problems[0].what
    with pytest.raises(SourceError, match="no column"):
        list(open_source(f"csv:{plain}?step=nope").runs())
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    with pytest.raises(SourceError, match="empty"):
        list(open_source(f"csv:{empty}").runs())
