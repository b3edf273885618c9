"""TensorBoard sink: event files read back by our reader AND by TensorBoard's own EventAccumulator."""
from __future__ import annotations

import math
import struct

import numpy as np
import pytest

from trackbridge.record import Histogram, Record, RunInfo
from trackbridge.trackers import make_sink
from trackbridge.trackers.tensorboard.events import _crc32c_py, event_files, frame, masked_crc32c
from trackbridge.trackers.tensorboard.sink import TensorBoardSink
from trackbridge.trackers.tensorboard.source import TensorBoardSource
from trackbridge.tracking.sink import SinkError

pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

RUN = RunInfo(name="grpo/seed 1", project="proj", run_id="id-1",
              config={"lr": 1e-5, "opt": {"name": "adam", "betas": [0.9, 0.99]}, "flag": True},
              tags={"team": "rl"}, source="verl@>=v0.4.0")


def _records():
    return [
        Record(10, 1700000000.125, {"loss": 0.1, "count": 3, "flag": True, "nan": float("nan"),
                                    "inf": float("-inf"), "note": "hello \u00e9", "missing": None,
                                    "h": Histogram(limits=[0.5, 1.0, 2.0], counts=[1, 4, 2], min=0.0, max=2.0,
                                                   num=7, sum=8.5, sum_squares=13.25)}),
        Record(12, 1700000001.5, {"loss": 0.05, "hv": Histogram.from_values([1.0, 2.0, 2.0, 3.0, 10.0])}),
        Record(11, 1700000002.75, {"eval/acc": 0.625}),       # non-monotonic step
    ]


def f32(x):
    return float(np.float32(x))


def test_native_and_python_crc32c_agree():
    """The native CRC32C (google-crc32c, in the [tensorboard] extra) and the pure-Python fallback give the same
    checksum on random data of every length class, so files written with one verify with the other."""
    import random

    from trackbridge.trackers.tensorboard.events import CRC_IMPLEMENTATION, crc32c
    if CRC_IMPLEMENTATION == "python":
        pytest.skip("no native CRC32C installed")
    rng = random.Random(0)
    for n in (0, 1, 7, 8, 9, 63, 64, 65, 1000, 4099):
        data = bytes(rng.randrange(256) for _ in range(n))
        assert crc32c(data) == _crc32c_py(data), n


def test_crc32c_known_value_and_framing():
    assert _crc32c_py(b"123456789") == 0xE3069283
    assert _crc32c_py(b"") == 0
    data = b"abc" * 7
    rec = frame(data)
    assert len(rec) == 16 + len(data)
    assert struct.unpack("<Q", rec[:8])[0] == len(data)
    assert struct.unpack("<I", rec[-4:])[0] == masked_crc32c(data)


def _write(tmp_path, records=None, run=RUN):
    sink = make_sink(f"tensorboard:{tmp_path}")
    assert isinstance(sink, TensorBoardSink)
    sink.open(run)
    sink.write(records or _records())
    sink.close()
    sink.close()
    return sink


def test_round_trip_via_our_reader(tmp_path):
    sink = _write(tmp_path)
    assert sink.folder == tmp_path / "grpo_seed 1"
    (reader,) = list(TensorBoardSource(str(tmp_path)).runs())
    assert reader.info == RUN                          # name, id, project, tags, config, source: exact
    got = list(reader.records())
    assert reader.problems == []
    assert [r.step for r in got] == [10, 12, 11]
    assert [r.wall_time for r in got] == [1700000000.125, 1700000001.5, 1700000002.75]
    m = got[0].metrics
    assert m["loss"] == f32(0.1) and m["count"] == 3.0 and m["flag"] == 1.0
    assert math.isnan(m["nan"]) and m["inf"] == float("-inf")
    assert m["note"] == "hello \u00e9" and "missing" not in m
    h = m["h"]
    assert (h.limits, h.counts, h.min, h.max, h.num, h.sum, h.sum_squares) == (
        [0.5, 1.0, 2.0], [1.0, 4.0, 2.0], 0.0, 2.0, 7.0, 8.5, 13.25)
    hv = got[1].metrics["hv"]
    assert sum(hv.counts) == 5 and hv.min == 1.0 and hv.max == 10.0 and hv.sum == 18.0
    assert hv.limits[-1] == 10.0 and len(hv.counts) == 30
    assert got[2].metrics == {"eval/acc": 0.625}


def test_round_trip_via_tensorboard_event_accumulator(tmp_path):
    sink = _write(tmp_path)
    ea = EventAccumulator(str(sink.folder), size_guidance={"scalars": 0, "histograms": 0, "tensors": 0})
    ea.Reload()
    tags = ea.Tags()
    assert set(tags["scalars"]) == {"loss", "count", "flag", "nan", "inf", "eval/acc"}
    assert set(tags["histograms"]) == {"h", "hv"}
    loss = ea.Scalars("loss")
    assert [(e.step, e.wall_time, e.value) for e in loss] == [(10, 1700000000.125, f32(0.1)),
                                                             (12, 1700000001.5, f32(0.05))]
    assert [(e.step, e.value) for e in ea.Scalars("eval/acc")] == [(11, 0.625)]
    assert math.isnan(ea.Scalars("nan")[0].value)
    hist = ea.Histograms("h")[0].histogram_value
    assert list(hist.bucket_limit) == [0.5, 1.0, 2.0] and list(hist.bucket) == [1, 4, 2] and hist.num == 7
    (text,) = ea.Tensors("note")
    assert text.tensor_proto.string_val[0].decode() == "hello \u00e9"
    assert ea.SummaryMetadata("note").plugin_data.plugin_name == "text"
    # the hparams plugin sees the (flattened) config
    from tensorboard.plugins.hparams import plugin_data_pb2
    content = ea.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    data = plugin_data_pb2.HParamsPluginData.FromString(content)
    hp = data.session_start_info.hparams
    assert hp["lr"].number_value == 1e-5 and hp["opt/name"].string_value == "adam"
    assert hp["flag"].bool_value is True and hp["opt/betas"].string_value == "[0.9, 0.99]"


def test_resume_adds_a_file_and_continues(tmp_path):
    run = RunInfo(name="r", run_id="r")
    _write(tmp_path, [Record(i, 100.0 + i, {"a": float(i)}) for i in range(5)], run=run)
    with pytest.raises(SinkError, match="resume=True"):
        TensorBoardSink(str(tmp_path)).open(RunInfo(name="r", run_id="r"))
    s = TensorBoardSink(str(tmp_path))
    s.open(RunInfo(name="r", run_id="r", config={"added": 1}), resume=True)
    assert s.last_step() == 4
    s.write([Record(5, 105.0, {"a": 5.0}), Record(3, 106.0, {"a": 3.5})])
    assert s.last_step() == 5
    s.close()
    assert len(event_files(tmp_path / "r")) == 2
    (reader,) = TensorBoardSource(str(tmp_path)).runs()
    assert reader.info.config == {"added": 1}          # the latest run info wins
    assert [(r.step, r.metrics["a"]) for r in reader.records()] == [
        (0, 0.0), (1, 1.0), (2, 2.0), (3, 3.0), (4, 4.0), (5, 5.0), (3, 3.5)]


def test_same_step_records_stay_separate_and_step_none(tmp_path):
    _write(tmp_path, [Record(1, 1.0, {"train/loss": 1.0}), Record(1, 2.0, {"eval/loss": 2.0}),
                      Record(None, 3.0, {"x": 1.0})], run=RunInfo(name="s"))
    (reader,) = TensorBoardSource(str(tmp_path)).runs()
    got = list(reader.records())
    assert [(r.step, r.wall_time, r.metrics) for r in got] == [
        (1, 1.0, {"train/loss": 1.0}), (1, 2.0, {"eval/loss": 2.0}), (1, 3.0, {"x": 1.0})]


def test_bad_value_and_bad_options(tmp_path):
    with pytest.raises(SinkError, match="bins"):
        TensorBoardSink(str(tmp_path), bins="many")
    s = TensorBoardSink(str(tmp_path))
    with pytest.raises(SinkError, match="before open"):
        s.write([Record(1, 1.0, {"a": 1.0})])
    s.open(RunInfo(name="bad"))
    s.write([Record(1, 1.0, {"obj": object(), "ok": 2.0})])    # only the value it cannot take is left out
    ((key, step, why),) = s.take_rejected()
    assert (key, step) == ("obj", 1) and "cannot write a object" in why
    s.close()


def test_modules_import_no_tracker():
    """The sinks and readers import their tracker only when used (``import trackbridge`` needs only PyYAML)."""
    import subprocess
    import sys

    code = ("import sys\n"
            "import trackbridge.trackers.jsonl.sink, trackbridge.trackers.tensorboard.sink, "
            "trackbridge.trackers.wandb.sink\n"
            "import trackbridge.trackers.jsonl.source, trackbridge.trackers.tensorboard.source, "
            "trackbridge.trackers.wandb.source\n"
            "print(sorted(m for m in ('wandb', 'tensorboard', 'numpy', 'google.protobuf', 'torch') "
            "if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_a_header_left_half_written_by_a_killed_attempt_is_removed_by_the_next(tmp_path):
    """An attempt SIGKILLed while writing its event file's header leaves only a temporary file (never a half
    header); the next attempt at the run, which holds the run's claim, removes it when it writes its own header."""
    import copy
    sink = TensorBoardSink(str(tmp_path))
    sink.open(copy.deepcopy(RUN))
    sink.write([Record(1, 1700000000.0, {"loss": 0.5})])
    sink.close()
    folder = sink.folder
    stale = folder / ".trackbridge-new-999999-1.tmp"
    stale.write_bytes(b"\x00" * 7)              # cut off mid-header
    again = TensorBoardSink(str(tmp_path))
    again.open(copy.deepcopy(RUN), resume=True)
    again.write([Record(2, 1700000001.0, {"loss": 0.25})])
    again.close()
    assert again.folder == folder and not stale.exists()
    assert len(event_files(folder)) == 2
    acc = EventAccumulator(str(folder))
    acc.Reload()
    assert [e.step for e in acc.Scalars("loss")] == [1, 2]


def test_event_files_of_one_second_stay_in_order_past_the_tenth(tmp_path, monkeypatch):
    """TensorBoard reads a folder's event files in name order. Files made in one second by one process differ only by
    their counter; unpadded, the 10th sorted before the 9th and a resumed run's steps came back out of order."""
    import copy
    import itertools

    import trackbridge.trackers.tensorboard.sink as tbsink
    monkeypatch.setattr(tbsink, "_FILE_COUNTER", itertools.count(9))
    monkeypatch.setattr(tbsink.time, "time", lambda: 1700000000.5)     # every file in the same second
    for step in (1, 2, 3):
        sink = TensorBoardSink(str(tmp_path))
        sink.open(copy.deepcopy(RUN), resume=step > 1)
        sink.write([Record(step, 1700000000.0 + step, {"loss": 1.0 / step})])
        sink.close()
    files = event_files(sink.folder)
    assert len(files) == 3 and [f.name for f in files] == sorted(f.name for f in files)
    acc = EventAccumulator(str(sink.folder))
    acc.Reload()
    assert [e.step for e in acc.Scalars("loss")] == [1, 2, 3]
