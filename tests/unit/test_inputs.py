"""One way to read a run for every command (trackbridge/read/inputs.py; issue 18, items 4 and 6): the run config, the
source resolution and the time axis are the same whether ``translate``, ``detect``, ``migrate`` or ``compare`` reads
the run. Plain files only here (JSON lines, ``trainer_state.json``, console logs); the trackers' copies and real
TensorBoard folders are in tests/trackers/test_time_axis.py and tests/frameworks/test_same_source_everywhere.py.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from trackbridge.derive.engine import MIN_RATE_INTERVAL
from trackbridge.pipeline import Translator
from trackbridge.read.inputs import InputError, open_runs
from trackbridge.tracking.source import TIME_AXIS

from _support import DATA, ROOT

SETS = json.loads((DATA / "frameworks" / "trl-rl-detection-sets.json").read_text())["sets"]
EXAMPLES = ROOT / "examples"


def _lines(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# ------------------------------------------------------------------------------------------------ time axis
@pytest.mark.parametrize("rows_mode", [False, True])
def test_json_lines_without_wall_times_have_no_time_axis(tmp_path, rows_mode):
    plain = _lines(tmp_path / "run.jsonl", [{"step": s, "loss": 1.0 / s} for s in range(1, 4)])
    (run,) = open_runs(str(plain), rows=rows_mode)
    assert run.reader.has_wall_time is True                  # the reader cannot know ...
    assert run.has_wall_time is False                         # ... its first record says so
    assert run.info.extra[TIME_AXIS] == "missing"
    recs = list(run.records())
    assert [r.step for r in recs] == [1, 2, 3] and all(r.wall_time is None for r in recs)


@pytest.mark.parametrize("rows_mode", [False, True])
def test_json_lines_with_wall_times_keep_them(tmp_path, rows_mode):
    stream = _lines(tmp_path / "run.jsonl", [{"step": s, "wall_time": 1e9 + s, "metrics": {"loss": 1.0}}
                                             for s in range(1, 4)])
    (run,) = open_runs(str(stream), rows=rows_mode)
    assert run.has_wall_time is True and TIME_AXIS not in run.info.extra
    assert [r.wall_time for r in run.records()] == [1e9 + 1, 1e9 + 2, 1e9 + 3]


@pytest.mark.parametrize("rows_mode", [False, True])
def test_a_marked_stream_drops_the_stamps_it_holds(tmp_path, rows_mode):
    """A copy written by a tracker had to hold times; its header says they are not the run's."""
    header = {"type": "run", "format": "trackbridge.stream/1", "name": "copy", "names": "canonical",
              "config": {"lr": 0.1}, "extra": {TIME_AXIS: "missing"}}
    stream = _lines(tmp_path / "copy.jsonl", [header, *({"step": s, "wall_time": 1e9 + 1e-5 * s,
                                                         "metrics": {"loss/total": 1.0}} for s in range(3))])
    (run,) = open_runs(str(stream), rows=rows_mode)
    assert run.has_wall_time is False and run.info.config == {"lr": 0.1} and run.info.name == "copy"
    assert all(r.wall_time is None for r in run.records())
    assert run.pipeline().source == "canonical"          # the header says its names are canonical


@pytest.mark.parametrize("path", ["trl_grpo_trainer_state.json", "verl_console.log"])
def test_files_without_times_are_marked(path):
    (run,) = open_runs(str(EXAMPLES / path))
    assert run.has_wall_time is False and run.info.extra[TIME_AXIS] == "missing"


def test_records_can_be_read_again_after_the_peek(tmp_path):
    plain = _lines(tmp_path / "run.jsonl", [{"step": s, "loss": 1.0} for s in range(1, 6)])
    (run,) = open_runs(str(plain))
    assert run.has_wall_time is False
    assert len(list(run.records())) == 5 and len(list(run.records())) == 5


def test_missing_file_is_an_input_error(tmp_path):
    with pytest.raises(InputError, match="cannot open"):
        open_runs(str(tmp_path / "nope.jsonl"), rows=True)


def test_from_option_names_the_source_and_is_not_passed_to_the_reader():
    (run,) = open_runs(f"console:{EXAMPLES / 'verl_console.log'}?from=verl@v0.3.0.post1")
    assert run.source == "verl@v0.3.0.post1" and "from" not in run.locator
    pipe = run.resolve()
    assert pipe.stats.source.startswith("verl/ppo@"), pipe.stats.source


# ------------------------------------------------------------------------------------------------ config
def test_config_given_is_added_over_the_runs_own(tmp_path):
    header = {"type": "run", "format": "trackbridge.stream/1", "name": "r", "config": {"a": 1, "b": 2}}
    stream = _lines(tmp_path / "r.jsonl", [header, {"step": 1, "metrics": {"loss": 1.0}}])
    (run,) = open_runs(str(stream), rows=True, config={"b": 3, "c": 4})
    assert run.info.config == {"a": 1, "b": 3, "c": 4}


def test_the_run_config_names_the_trainer_for_detect_and_translate_alike(tmp_path):
    """RLOO 0.11.4 logs exactly PPOv2's names: a stream whose header holds RLOOConfig's fields under ``args`` (the
    shape of a transformers TensorBoard folder) is RLOO for detect and for translate, from the same inputs."""
    s = SETS["rloo@v0.11.4"]
    header = {"type": "run", "format": "trackbridge.stream/1", "name": "rloo",
              "config": {"args": {f: 0.05 for f in s["config_fields"]}}}
    stream = _lines(tmp_path / "rloo.jsonl", [header, *({"step": i, "metrics": {k: 0.5 for k in s["keys"]}}
                                                        for i in range(1, 4))])
    for rows_mode in (False, True):
        (run,) = open_runs(str(stream), rows=rows_mode)
        pipe = run.resolve()
        assert pipe.translator.detection.spec.trainer == "rloo", pipe.translator.detection.reason
        assert pipe.stats.source.startswith("trl/rloo@")
    py = [sys.executable, "-m", "trackbridge"]
    det = subprocess.run([*py, "detect", "--json", str(stream)], capture_output=True, text=True, timeout=120)
    rep = tmp_path / "rep.json"
    tr = subprocess.run([*py, "translate", "--report-json", str(rep), str(stream)], capture_output=True, text=True,
                        timeout=120)
    assert det.returncode == 0 and tr.returncode == 0, det.stderr + tr.stderr
    assert json.loads(det.stdout)["source"] == json.loads(rep.read_text())["source"].split(" (")[0]
    assert json.loads(det.stdout)["source"].startswith("trl/rloo@")


def test_when_conditions_see_a_config_nested_under_args():
    """A transformers TensorBoard folder's config is ``{"args": {...}}``: ``gradient_accumulation_steps > 1`` makes
    GRPO's token means approximate [micro_batches] whether the setting is at the top or under ``args``, and one
    micro-batch with one step per logged row makes them exact."""
    row = {"entropy": 1.0}
    flat = Translator("trl/grpo@1.16.0", "canonical", config={"gradient_accumulation_steps": 4}).translate(row)
    nested = Translator("trl/grpo@1.16.0", "canonical",
                        config={"args": {"gradient_accumulation_steps": 4}}).translate(row)
    single = Translator("trl/grpo@1.16.0", "canonical",
                        config={"args": {"gradient_accumulation_steps": 1, "logging_steps": 1}}).translate(row)
    assert "gradient_accumulation_steps = 4" in flat.approximate.get("policy/entropy", ""), flat.approximate
    assert nested.approximate == flat.approximate
    assert "policy/entropy" not in single.approximate, single.approximate


# ------------------------------------------------------------------------------------------------ rates
def _rates(walls: list[float | None]) -> tuple[list[float], list[str]]:
    tr = Translator("canonical", "canonical", derive=True)
    out = []
    for i, w in enumerate(walls):
        res = tr.translate({"progress/tokens": 1000.0 * (i + 1)}, step=i + 1, wall_time=w)
        if "perf/tokens_per_s" in res.metrics:
            out.append(res.metrics["perf/tokens_per_s"])
    return out, list(tr.notes)


def test_rate_needs_real_wall_times():
    rates, _ = _rates([100.0, 102.0, 104.0])
    assert rates == [500.0, 500.0]
    rates, notes = _rates([None, None, None])
    assert rates == [] and any("rate() needs wall times" in n for n in notes), notes
    close = MIN_RATE_INTERVAL / 10
    rates, notes = _rates([100.0, 100.0 + close, 100.0 + 2 * close])
    assert rates == [] and any("times that close" in n for n in notes), notes
