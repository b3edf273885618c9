"""TensorBoard reader: files from other writers (tensorboardX, tensorboard.summary.Writer) and damaged files."""
from __future__ import annotations

import shutil

import numpy as np
import pytest

from trackbridge.record import Record, RunInfo
from trackbridge.trackers import open_source
from trackbridge.trackers.tensorboard.events import event_files
from trackbridge.trackers.tensorboard.sink import TensorBoardSink
from trackbridge.trackers.tensorboard.source import TensorBoardSource
from trackbridge.tracking.source import SourceError

pytest.importorskip("tensorboard")


def f32(x):
    return float(np.float32(x))


def test_tensorboardx_files_grouped_by_step(tmp_path):
    tbx = pytest.importorskip("tensorboardX")
    w = tbx.SummaryWriter(str(tmp_path / "exp" / "tbx"))
    for step in range(3):
        w.add_scalar("train/loss", 1.0 / (step + 1), step, walltime=1000.0 + step)
        w.add_scalar("train/reward", 0.5 * step, step, walltime=1000.0 + step + 0.1)
        w.add_histogram("weights", np.array([0.0, 1.0, 1.0, 2.0]) + step, step, walltime=1000.0 + step + 0.2)
    w.add_text("sample", "a completion", 2, walltime=1002.5)
    w.close()
    (reader,) = TensorBoardSource(str(tmp_path)).runs()
    assert reader.info.name == "exp/tbx" and reader.info.run_id == "exp/tbx"
    got = list(reader.records())
    assert [r.step for r in got] == [0, 1, 2]
    assert got[1].wall_time == 1001.0
    assert got[1].metrics["train/loss"] == f32(0.5) and got[2].metrics["train/reward"] == 1.0
    h = got[2].metrics["weights"]
    assert h.min == 2.0 and h.max == 4.0 and h.num == 4 and sum(h.counts) == 4 and h.sum == 12.0
    assert got[2].metrics["sample/text_summary"] == "a completion"   # tensorboardX appends /text_summary
    assert reader.problems == []


def test_tensor_form_scalars_and_histograms(tmp_path):
    from tensorboard.summary import Writer

    w = Writer(str(tmp_path / "tf2"))
    for step in range(3):
        w.add_scalar("loss", 0.25 * step, step=step, wall_time=50.0 + step)
    w.flush()
    w.close()
    (reader,) = TensorBoardSource(str(tmp_path)).runs()
    got = list(reader.records())
    assert [(r.step, r.wall_time, r.metrics) for r in got] == [
        (0, 50.0, {"loss": 0.0}), (1, 51.0, {"loss": 0.25}), (2, 52.0, {"loss": 0.5})]


def test_hparams_from_another_writer_become_config(tmp_path):
    torch_tb = pytest.importorskip("torch.utils.tensorboard")
    w = torch_tb.SummaryWriter(str(tmp_path / "run"))
    w.add_scalar("loss", 1.0, 0)
    from torch.utils.tensorboard.summary import hparams
    for ev in hparams({"lr": 0.01, "opt": "adam"}, {"hp/metric": 1.0}):
        w.file_writer.add_summary(ev)
    w.close()
    (reader,) = TensorBoardSource(str(tmp_path)).runs()
    assert reader.info.config == {"lr": 0.01, "opt": "adam"}
    assert [r.metrics for r in reader.records()] == [{"loss": 1.0}]


def _written(tmp_path, n=20):
    s = TensorBoardSink(str(tmp_path))
    s.open(RunInfo(name="run", run_id="run"))
    s.write([Record(i, 10.0 + i, {"a": float(i), "b": float(-i)}) for i in range(n)])
    s.close()
    (path,) = event_files(tmp_path / "run")
    return path


def _record_offsets(path):
    from trackbridge.trackers.tensorboard.events import read_event_records
    return [off for off, _ in read_event_records(path, None)]


def test_bad_data_crc_skips_one_record(tmp_path):
    path = _written(tmp_path)
    offs = _record_offsets(path)
    target = offs[5]                                   # the 4th metric event (after version + run info)
    data = bytearray(path.read_bytes())
    data[target + 14] ^= 0xFF
    path.write_bytes(bytes(data))
    (reader,) = TensorBoardSource(str(tmp_path)).runs()
    steps = [r.step for r in reader.records()]
    assert steps == [i for i in range(20) if i != 3]
    (problem,) = reader.problems
    assert problem.where == f"{path}:{target}" and "data CRC" in problem.what
    # without verification the damaged record is read as whatever it parses to (or skipped if it cannot parse)
    (fast,) = TensorBoardSource(str(tmp_path), verify="0").runs()
    assert len(list(fast.records())) >= 19


def test_bad_length_resyncs_to_next_record(tmp_path):
    path = _written(tmp_path)
    offs = _record_offsets(path)
    data = bytearray(path.read_bytes())
    data[offs[6] + 1] ^= 0x55                          # break a length field
    path.write_bytes(bytes(data))
    (reader,) = TensorBoardSource(str(tmp_path)).runs()
    steps = [r.step for r in reader.records()]
    assert steps == [i for i in range(20) if i != 4]
    (problem,) = reader.problems
    assert problem.where == f"{path}:{offs[6]}" and f"next valid record at {offs[7]}" in problem.what


def test_truncated_file_keeps_what_is_complete(tmp_path):
    path = _written(tmp_path)
    offs = _record_offsets(path)
    data = path.read_bytes()
    path.write_bytes(data[: offs[-1] + 20])           # cut the last record in half
    (reader,) = TensorBoardSource(str(tmp_path)).runs()
    assert [r.step for r in reader.records()] == list(range(19))
    (problem,) = reader.problems
    assert problem.where == f"{path}:{offs[-1]}" and "truncated" in problem.what
    # and the sink's resume scan copes with it too
    s = TensorBoardSink(str(tmp_path))
    s.open(RunInfo(name="run", run_id="run"), resume=True)
    assert s.last_step() == 18
    s.close()


def test_several_runs_filters_and_errors(tmp_path):
    for name in ("a", "b"):
        s = TensorBoardSink(str(tmp_path / "root"))
        s.open(RunInfo(name=name, run_id=f"id-{name}"))
        s.write([Record(1, 1.0, {"x": 1.0})])
        s.close()
    assert [r.info.name for r in open_source(f"tensorboard:{tmp_path}/root").runs()] == ["a", "b"]
    (b,) = open_source(f"tensorboard:{tmp_path}/root?run=id-b").runs()
    assert b.info.name == "b"
    one = event_files(tmp_path / "root" / "a")[0]
    (single,) = open_source(f"tensorboard:{one}").runs()
    assert single.info.run_id == "id-a"
    shutil.rmtree(tmp_path / "root")
    (tmp_path / "root").mkdir()
    with pytest.raises(SourceError, match="no events"):
        list(TensorBoardSource(str(tmp_path / "root")).runs())
    with pytest.raises(SourceError, match="no such"):
        TensorBoardSource(str(tmp_path / "missing"))
