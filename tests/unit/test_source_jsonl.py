"""JSONL reader: folders of streams, damaged lines, veRL's file-backend lines, filters and recorded renames."""
from __future__ import annotations

import json

import pytest

from trackbridge.record import RunInfo, dumps
from trackbridge.sources import open_source
from trackbridge.sources.base import SourceError


def _write(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")


def test_folder_of_runs_and_filter(tmp_path):
    for rid in ("a", "b"):
        _write(tmp_path / f"{rid}.jsonl", [dumps(RunInfo(name=f"name-{rid}", run_id=rid).to_json()),
                                           dumps({"step": 1, "wall_time": 1.0, "metrics": {"x": 1}})])
    (tmp_path / "notes.txt").write_text("ignored")
    runs = list(open_source(f"jsonl:{tmp_path}").runs())
    assert [r.info.run_id for r in runs] == ["a", "b"]
    (only,) = open_source(f"jsonl:{tmp_path}?run=name-b").runs()
    assert only.info.run_id == "b"


def test_bad_line_in_the_middle_is_skipped_with_its_place(tmp_path):
    p = tmp_path / "r.jsonl"
    header = dumps(RunInfo(run_id="r").to_json())
    good1 = dumps({"step": 1, "wall_time": 1.0, "metrics": {"x": 1}})
    _write(p, [header, good1, "{not json", "[1, 2]", '{"step": "x", "metrics": {}}',
               dumps({"step": 2, "wall_time": 2.0, "metrics": {"x": 2}})])
    (reader,) = open_source(f"jsonl:{p}").runs()
    got = list(reader.records())
    assert [r.step for r in got] == [1, 2]
    assert [p_.where.split(":line ")[1].split(" ")[0] for p_ in reader.problems] == ["3", "4", "5"]
    offset = len(header) + 1 + len(good1) + 1
    assert f"(offset {offset})" in reader.problems[0].where


def test_recorded_sanitization_is_undone(tmp_path):
    p = tmp_path / "s.jsonl"
    _write(p, [dumps(RunInfo(run_id="s", sanitized={"val/mean_at_1": "val/mean@1"}).to_json()),
               dumps({"step": 1, "wall_time": 1.0, "metrics": {"val/mean_at_1": 0.5}, "derived": ["val/mean_at_1"]})])
    (reader,) = open_source(f"jsonl:{p}").runs()
    (rec,) = reader.records()
    assert rec.metrics == {"val/mean@1": 0.5} and rec.derived == ["val/mean@1"]


def test_verl_file_backend_lines_and_no_header(tmp_path):
    p = tmp_path / "exp1.jsonl"
    _write(p, [json.dumps({"step": 1, "data": {"actor/pg_loss": 0.25, "critic/score/mean": 1.0}}),
               json.dumps({"step": 2, "data": {"actor/pg_loss": 0.5}})])
    (reader,) = open_source(f"jsonl:{p}").runs()
    assert reader.info.name == "exp1"
    got = list(reader.records())
    assert [(r.step, r.metrics) for r in got] == [(1, {"actor/pg_loss": 0.25, "critic/score/mean": 1.0}),
                                                  (2, {"actor/pg_loss": 0.5})]


def test_missing_and_empty(tmp_path):
    with pytest.raises(SourceError, match="no such file"):
        open_source(f"jsonl:{tmp_path}/nope")
    with pytest.raises(SourceError, match="no \\*.jsonl"):
        list(open_source(f"jsonl:{tmp_path}").runs())


def test_prime_rl_file_monitor_time_is_the_wall_time(tmp_path):
    """prime-rl's `file` monitor writes {"step", "time": time.time(), ...metrics} (src/prime_rl/utils/monitor/file.py
    @v0.8.0): `time` is the record's wall time, not a metric; a `timestamp` column is read the same way. A `time`
    that is not Unix seconds (a step duration) stays a metric, and `wall_time` / `_timestamp` keep precedence."""
    p = tmp_path / "metrics.jsonl"
    _write(p, [json.dumps({"step": 1, "time": 1767225600.25, "loss/mean": 0.5}),
               json.dumps({"step": 2, "timestamp": 1767225660, "loss/mean": 0.25}),
               json.dumps({"step": 3, "time": 12.5, "loss/mean": 0.125}),
               json.dumps({"step": 4, "_timestamp": 1767225700.0, "time": 1767225799.0, "loss/mean": 0.0625}),
               json.dumps({"step": 5, "time": True, "loss/mean": 0.0})])
    (reader,) = open_source(f"jsonl:{p}").runs()
    got = [(r.step, r.wall_time, r.metrics) for r in reader.records()]
    assert got == [(1, 1767225600.25, {"loss/mean": 0.5}),
                   (2, 1767225660, {"loss/mean": 0.25}),
                   (3, None, {"time": 12.5, "loss/mean": 0.125}),
                   (4, 1767225700.0, {"time": 1767225799.0, "loss/mean": 0.0625}),
                   (5, None, {"time": True, "loss/mean": 0.0})]
    assert reader.problems == []
