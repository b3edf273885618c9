"""replay(): a spool into a sink that missed (part of) the run, without duplicates; tolerant spool reading."""
import json

import pytest

import trackbridge
from trackbridge.record import Record, RunInfo, dumps
from trackbridge.sync.replay import iter_spool, replay, scan_spool
from trackbridge.trackers.jsonl.sink import JsonlSink


def _spool(tmp_path, n=25):
    run = trackbridge.init(project="p", name="r", sinks=[], source="canonical", spool=str(tmp_path / "spool"),
                           run_id="r1", config={"lr": 0.1})
    for i in range(n):
        run.log({"loss": 1.0 / (i + 1), "hist": [i, i + 1], "note": f"s{i}"})
    run.finish()
    return run.spool_path


def test_replay_into_empty_tensorboard_then_again_without_duplicates(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    spool = _spool(tmp_path)
    res = replay(spool, f"tensorboard:{tmp_path}/tb")
    assert (res.written, res.skipped, res.last_step_before) == (25, 0, None)
    res2 = replay(spool, f"tensorboard:{tmp_path}/tb")
    assert (res2.written, res2.skipped, res2.last_step_before) == (0, 25, 24)
    folder = next(p for p in (tmp_path / "tb").iterdir() if p.is_dir())
    ea = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    ea.Reload()
    steps = [e.step for e in ea.Scalars("loss")]
    assert steps == list(range(25))
    src = [r for _s, r in iter_spool(spool)]
    for e, r in zip(ea.Scalars("loss"), src):
        assert e.value == pytest.approx(r.metrics["loss"], rel=1e-6)
        assert e.wall_time == pytest.approx(r.wall_time, abs=1e-3)


def test_replay_tops_up_a_sink_holding_part_of_the_run(tmp_path):
    spool = _spool(tmp_path)
    info = scan_spool(spool).info
    part = JsonlSink(str(tmp_path / "other"))
    part.open(info)
    part.write([r for s, r in iter_spool(spool) if s < 10])
    part.close()
    res = replay(spool, f"jsonl:{tmp_path}/other")
    assert (res.written, res.skipped, res.last_step_before) == (15, 10, 9)
    got = [r for _s, r in iter_spool(tmp_path / "other" / "r1.jsonl")]
    assert [r.step for r in got] == list(range(25))
    assert got[20].metrics["hist"].values == [20.0, 21.0] and got[20].metrics["note"] == "s20"
    assert "wrote 15 records, skipped 10" in str(res)


def test_crashed_spool_partial_line_is_skipped_and_reported(tmp_path):
    path = tmp_path / "crash.jsonl"
    lines = [dumps(RunInfo(name="c", run_id="crash").to_json())]
    lines += [dumps(Record(step=i, wall_time=1000.0 + i, metrics={"x": i}).to_json()) for i in range(5)]
    path.write_text("\n".join(lines) + "\n" + '{"step": 5, "wall_ti')    # SIGKILL mid-line
    scan = scan_spool(path)
    assert scan.records == 5 and scan.last_step == 4 and not scan.ends_with_newline
    assert "partial last line" in scan.problems[0] and "crash.jsonl:7" in scan.problems[0]
    res = replay(path, f"jsonl:{tmp_path}/out")
    assert res.written == 5 and res.problems
    out = [json.loads(line) for line in (tmp_path / "out" / "crash.jsonl").read_text().splitlines()]
    assert out[0]["type"] == "run" and [o["step"] for o in out[1:]] == [0, 1, 2, 3, 4]


def test_replay_errors_name_the_problem(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        replay(tmp_path / "nope.jsonl", f"jsonl:{tmp_path}/o")
    headerless = tmp_path / "h.jsonl"
    headerless.write_text('{"step": 1, "metrics": {}}\n')
    with pytest.raises(ValueError, match="no run header"):
        replay(headerless, f"jsonl:{tmp_path}/o")
