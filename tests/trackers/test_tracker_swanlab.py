"""SwanLab (swanlab 0.10.3, offline): the sink's run read back with swanlab's own DataStoreReader and protobuf
classes; a run made by swanlab's SDK read by trackbridge; the version guards; a torn run file resumed; the re-logged
step SwanLab would drop silently, said."""
from __future__ import annotations

import math
import struct

import pytest

import trackbridge
from trackbridge.record import Histogram, Record, RunInfo
from trackbridge.trackers import guess_locator, make_sink, open_source
from trackbridge.tracking.sink import SinkError
from trackbridge.tracking.source import SourceError

from _support.tracker_files import swanlab_points

T0 = 1763700000.123456789
CONFIG = {"lr": 0.001, "model": {"name": "tiny", "layers": 2}}


def _write(d, records, run_id="r1", resume=False):
    sink = make_sink(f"swanlab:{d}")
    sink.open(RunInfo(name="run one", project="p", run_id=run_id, config=dict(CONFIG), tags={"group": "g"}),
              resume=resume)
    sink.write(records)
    rejected = sink.take_rejected()
    sink.close()
    return rejected


def test_swanlab_run_read_back_with_swanlabs_own_reader(tmp_path):
    rejected = _write(tmp_path, [
        Record(0, T0, {"train/loss": 0.5, "lr": 1e-3}),
        Record(0, T0 + 0.25, {"eval/loss": 0.75}),
        Record(1, T0 + 1, {"train/loss": float("nan"), "w": Histogram.from_values([1.0, 2.0, 3.0]), "note": "hi"}),
        Record(1, T0 + 2, {"train/loss": 0.25}),                  # a second value at step 1: SwanLab keeps one
        Record(2, T0 + 3, {"train/loss": float("inf"), ".weird/": 1.0})])
    points, config, raw = swanlab_points(tmp_path)
    assert [(k, s, v) for k, s, _t, v in points if k != "train/loss"] == [
        ("lr", 0, 1e-3), ("eval/loss", 0, 0.75), ("w/count", 1, 3.0), ("w/mean", 1, 2.0),
        ("w/std", 1, pytest.approx(math.sqrt(2 / 3), rel=1e-12)), ("w/min", 1, 1.0), ("w/max", 1, 3.0),
        ("_x2E_weird_x2F_", 2, 1.0)]
    loss = [(s, t, v) for k, s, t, v in points if k == "train/loss"]
    assert [s for s, _t, _v in loss] == [0, 1, 2] and loss[0][2] == 0.5 and math.isnan(loss[1][2]) and \
        loss[2][2] == math.inf
    for (s, t, _v), want in zip(loss, (T0, T0 + 1, T0 + 3)):     # wall times to the nanosecond
        assert abs(t - want) < 1e-6
    assert {k: config[k] for k in CONFIG} == CONFIG and config["_trackbridge"]["name"] == "run one"
    kinds = [r.WhichOneof("record_type") for r in raw]
    assert kinds[0] == "start" and kinds[-1] == "finish" and raw[-1].finish.state == 1      # RUN_STATE_FINISHED
    assert raw[0].start.id == "r1" and raw[0].start.name == "run one" and raw[0].start.group == "g"
    columns = [r.column.column_key for r in raw if r.WhichOneof("record_type") == "column"]
    assert columns == list(dict.fromkeys(k for k, *_ in points))      # one column record per key, before its points
    assert [r.column.section_name for r in raw if r.WhichOneof("record_type") == "column"][:2] == ["train", ""]
    assert sorted((k, s) for k, s, _w in rejected) == [("note", 1), ("train/loss", 1)]
    assert "SwanLab keeps one value per key and step" in dict(((k, s), w) for k, s, w in rejected)[("train/loss", 1)]
    (reader,) = list(open_source(f"swanlab:{tmp_path}").runs())      # trackbridge's reader restores the names
    recs = list(reader.records())
    assert reader.info.config == CONFIG and reader.info.name == "run one"
    assert {k for r in recs for k in r.metrics} >= {".weird/", "train/loss", "w/count"}
    assert guess_locator(str(tmp_path)) == f"swanlab:{tmp_path}"


def test_a_run_made_by_swanlabs_sdk_is_read(tmp_path):
    import swanlab
    run = swanlab.init(project="p", experiment_name="sdk", config={"lr": 0.1, "nested": {"a": 1}}, mode="offline",
                       logdir=str(tmp_path))
    for s in range(5):
        swanlab.log({"train/loss": 1.0 / (s + 1), "eval/acc": 0.5 + s}, step=s)
    swanlab.log({"train/loss": 9.0}, step=2)                                 # dropped by SwanLab itself
    run.finish()
    points, config, _raw = swanlab_points(tmp_path)
    (reader,) = list(open_source(f"swanlab:{tmp_path}").runs())
    got = [(k, r.step, r.wall_time, v) for r in reader.records() for k, v in r.metrics.items()]
    assert sorted((k, s, v) for k, s, _t, v in got) == sorted((k, s, v) for k, s, _t, v in points)
    assert len(points) == 10 and not reader.problems
    assert sorted(t for *_x, t, _v in got) == pytest.approx(sorted(t for *_x, t, _v in points), abs=1e-6)
    assert reader.info.config == {"lr": 0.1, "nested": {"a": 1}} and reader.info.name == "sdk"


def test_a_config_tagged_for_pythons_unsafe_loader_is_read_as_plain_values_and_said(tmp_path):
    # issue 31: a config.yaml holding a `!!python/...` tag (what yaml.dump writes for a tuple or an object) lost the
    # whole config, trackbridge's run info with it, in silence
    import swanlab
    run = swanlab.init(project="p", experiment_name="tagged", config={"lr": 0.1, "betas": [0.9, 0.99]},
                       mode="offline", logdir=str(tmp_path))
    swanlab.log({"train/loss": 1.0}, step=0)
    run.finish()
    (cfg,) = list(tmp_path.rglob("files/config.yaml"))
    text = cfg.read_text(encoding="utf-8")
    assert "betas" in text and "lr" in text
    cfg.write_text(text + "shape:\n  desc: null\n  sort: 9\n  value: !!python/tuple [2, 3]\n"
                   "obj: !!python/object:argparse.Namespace {a: 1}\n", encoding="utf-8")
    (reader,) = list(open_source(f"swanlab:{tmp_path}").runs())
    config = reader.info.config
    assert config["lr"] == 0.1 and config["betas"] == [0.9, 0.99]                 # the rest of the config kept
    assert config["shape"] == [2, 3] and config["obj"] == {"a": 1}               # nothing of Python's built
    (problem,) = reader.problems
    assert problem.where == str(cfg) and "2 config value(s) tagged for Python's unsafe loader" in problem.what
    assert [r.metrics for r in reader.records()] == [{"train/loss": 1.0}]
    cfg.write_text("lr: [unclosed\n", encoding="utf-8")                          # not YAML: said, not dropped
    (reader,) = list(open_source(f"swanlab:{tmp_path}").runs())
    assert reader.info.config == {} and "the run config is not YAML" in reader.problems[0].what


def test_a_run_file_of_another_store_version_is_refused(tmp_path):
    _write(tmp_path, [Record(0, T0, {"a": 1.0})])
    (path,) = tmp_path.glob("run-*/run-*.swanlab")
    data = bytearray(path.read_bytes())
    data[6] = 3                                                     # the header's store version
    path.write_bytes(bytes(data))
    with pytest.raises(SourceError, match=r"SwanLab store version 3; trackbridge reads version 2 \(swanlab 0.10.x\)"):
        list(open_source(f"swanlab:{tmp_path}").runs())


def test_the_sink_refuses_a_swanlab_release_whose_format_it_does_not_know(tmp_path, monkeypatch):
    import swanlab
    monkeypatch.setattr(swanlab, "__version__", "0.11.0")
    sink = make_sink(f"swanlab:{tmp_path}")
    with pytest.raises(SinkError, match=r"swanlab 0.11.0 .*offline format of swanlab 0.10.x .*install swanlab 0.10.3"):
        sink.open(RunInfo(run_id="x"))
    assert not list(tmp_path.iterdir())


def test_a_torn_run_file_is_cut_back_and_continued(tmp_path):
    _write(tmp_path, [Record(s, T0 + s, {"a": float(s)}) for s in range(3)])
    (path,) = tmp_path.glob("run-*/run-*.swanlab")
    with open(path, "ab") as fh:                                   # a record cut off by a killed writer
        fh.write(struct.pack("<IHB", 123, 500, 1) + b"x" * 20)
    (reader,) = list(open_source(f"swanlab:{tmp_path}").runs())
    assert [r.step for r in reader.records()] == [0, 1, 2]
    assert "torn record" in str(reader.problems[0]) and f"{path}:" in str(reader.problems[0])
    _write(tmp_path, [Record(s, T0 + s, {"a": float(s)}) for s in range(2, 5)], resume=True)
    points, _c, _r = swanlab_points(tmp_path)                       # swanlab's own reader reads it all
    assert [(k, s) for k, s, _t, _v in points] == [("a", s) for s in range(5)]


def test_the_logger_says_what_swanlab_would_drop(tmp_path):
    from trackbridge.logger import LoggerWarning
    with pytest.warns(LoggerWarning, match="SwanLab keeps one value per key and step"):
        run = trackbridge.init(sinks=[f"swanlab:{tmp_path}/sw"], spool=str(tmp_path / "spool"), source="canonical",
                               run_id="again", options=trackbridge.LoggerOptions(writer="thread"))
        run.log({"custom/a": 1.0}, step=3)
        run.log({"custom/a": 2.0}, step=3)
        run.log({"custom/a": 3.0}, step=4)
        run.finish()
    points, _c, _r = swanlab_points(tmp_path / "sw")
    assert [(s, v) for k, s, _t, v in points if k == "custom/a"] == [(3, 1.0), (4, 3.0)]
