"""Comet (comet_ml 3.58.x, offline): the sink's archive read back with comet_ml's own schemas (every message and
experiment.json validated as ``comet upload`` validates them); an archive made by comet_ml's ``OfflineExperiment``
read by trackbridge; a run killed before its archive was zipped, read and resumed."""
from __future__ import annotations

import json
import math
import zipfile

import pytest

from trackbridge.record import Histogram, Record, RunInfo
from trackbridge.trackers import guess_locator, make_sink, open_source
from trackbridge.tracking.source import SourceError

from _support.tracker_files import comet_points

T0 = 1763700000.1234


def _sink(d, run_id="r1", resume=False):
    sink = make_sink(f"comet:{d}?project=proj&workspace=ws")
    sink.open(RunInfo(name="run one", project="p", run_id=run_id, config={"lr": 0.001, "model": {"layers": 2}}),
              resume=resume)
    return sink


def test_comet_archive_read_back_with_comets_own_schemas(tmp_path):
    sink = _sink(tmp_path)
    sink.write([Record(0, T0, {"train/loss": 0.5, "n": 3}), Record(0, T0 + 0.25, {"eval/loss": 0.75}),
                Record(1, T0 + 1, {"train/loss": float("nan"), "w": Histogram.from_values([1.0, 3.0]), "t": "x"}),
                Record(1, T0 + 2, {"train/loss": -math.inf})])
    rejected = sink.take_rejected()
    sink.close()
    points, params, others = comet_points(tmp_path)
    ms = lambda t: round(t * 1000) / 1000  # noqa: E731
    assert [(k, s, t) for k, s, t, _v in points] == [
        ("train/loss", 0, ms(T0)), ("n", 0, ms(T0)), ("eval/loss", 0, ms(T0 + 0.25)), ("train/loss", 1, ms(T0 + 1)),
        ("w/count", 1, ms(T0 + 1)), ("w/mean", 1, ms(T0 + 1)), ("w/std", 1, ms(T0 + 1)), ("w/min", 1, ms(T0 + 1)),
        ("w/max", 1, ms(T0 + 1)), ("train/loss", 1, ms(T0 + 2))]
    values = [v for *_x, v in points]
    assert values[:3] == [0.5, 3.0, 0.75] and math.isnan(values[3]) and values[4:9] == [2.0, 2.0, 1.0, 1.0, 3.0]
    assert values[9] == -math.inf
    assert params == {"lr": 0.001, "model|layers": 2}
    assert others["Name"] == "run one" and json.loads(others["trackbridge"])["run_id"] == "r1"
    assert [(k, s) for k, s, _w in rejected] == [("t", 1)]
    (zipped,) = tmp_path.glob("*.zip")
    assert not list(tmp_path.glob("*.partial")) and guess_locator(str(tmp_path)) == f"comet:{tmp_path}"
    (reader,) = list(open_source(f"comet:{zipped}").runs())
    assert reader.info.config == {"lr": 0.001, "model": {"layers": 2}} and reader.info.name == "run one"
    assert [r.step for r in reader.records()] == [0, 0, 1, 1] and not reader.problems


def test_an_archive_made_by_comets_sdk_is_read(tmp_path):
    import comet_ml
    exp = comet_ml.OfflineExperiment(project_name="p1", workspace="ws", offline_directory=str(tmp_path),
                                     log_code=False, log_graph=False, auto_param_logging=False,
                                     auto_metric_logging=False, parse_args=False, auto_output_logging=False,
                                     log_env_details=False, log_git_metadata=False, log_git_patch=False,
                                     log_env_gpu=False, log_env_host=False, log_env_cpu=False, display_summary_level=0)
    exp.set_name("sdk")
    exp.log_parameters({"lr": 0.1, "nested": {"a": 1}})
    for s in range(4):
        exp.log_metric("train/loss", 1.0 / (s + 1), step=s)
    exp.log_metric("train/loss", float("nan"), step=4)
    exp.end()
    points, _params, _others = comet_points(tmp_path)
    (reader,) = list(open_source(f"comet:{tmp_path}").runs())
    got = [(k, r.step, r.wall_time, v) for r in reader.records() for k, v in r.metrics.items()]
    key = lambda p: (p[0], p[1], p[2], "nan" if p[3] != p[3] else p[3])  # noqa: E731
    assert [key(p) for p in got] == [key(p) for p in points]
    assert [s for k, s, _t, _v in got if k == "train/loss"] == [0, 1, 2, 3, 4]
    assert reader.info.name == "sdk" and reader.info.config == {"lr": 0.1, "nested": {"a": 1}}


def test_a_run_killed_before_its_archive_was_zipped(tmp_path):
    sink = _sink(tmp_path)
    sink.write([Record(s, T0 + s, {"a": float(s)}) for s in range(3)])
    with open(sink.work / "messages.json", "a", encoding="utf-8") as fh:
        fh.write('{"payload": {"local_times')                  # a line cut by the kill; close() never runs
    (reader,) = list(open_source(f"comet:{tmp_path}").runs())
    assert [r.step for r in reader.records()] == [0, 1, 2] and reader.info.extra["comet"]["finished"] is False
    assert "cut short" in reader.problems[0].what
    sink2 = _sink(tmp_path, resume=True)
    assert sink2.held().last_step() == 2
    sink2.write([Record(s, T0 + s, {"a": float(s)}) for s in range(3, 5)])
    sink2.close()
    points, _p, _o = comet_points(tmp_path)
    assert [(k, s) for k, s, _t, _v in points] == [("a", s) for s in range(5)]
    ids = [json.loads(line)["payload"].get("message_id") for line in
           zipfile.ZipFile(next(tmp_path.glob("*.zip"))).read("messages.json").decode().splitlines()]
    assert ids == sorted(set(ids))                               # message ids continue, none repeated


def test_an_archive_without_comets_required_fields_is_refused(tmp_path):
    with zipfile.ZipFile(tmp_path / "abc.zip", "w") as z:
        z.writestr("experiment.json", json.dumps({"offline_id": "abc"}))
        z.writestr("messages.json", "")
    with pytest.raises(SourceError, match="lacks project_name, start_time, stop_time, tags, workspace"):
        list(open_source(f"comet:{tmp_path}").runs())


def test_blank_lines_cost_no_python_step_and_line_numbers_hold(tmp_path, monkeypatch):
    """A zip whose messages.json is megabytes of bare newlines around real messages (issue 31: 16 MB of newlines in
    a 16 KB zip took 263 s of CPU) reads the messages with their true line numbers; the lines are found per chunk,
    a line longer than a chunk included, and a .partial folder's cut last line is said to be cut."""
    import io

    from trackbridge.trackers.comet import archive as A
    sink = _sink(tmp_path)
    sink.write([Record(0, T0, {"train/loss": 0.5}), Record(1, T0 + 1, {"train/loss": 0.25})])
    sink.close()
    (zpath,) = tmp_path.glob("*.zip")
    with zipfile.ZipFile(zpath) as z:
        members = {n: z.read(n) for n in z.namelist()}
    lines = members[A.MESSAGES].split(b"\n")
    assert len(lines) >= 3
    blank = b"\n" * (4 * 1024 * 1024)
    members[A.MESSAGES] = lines[0] + b"\n" + blank + b"\n".join(lines[1:])
    with zipfile.ZipFile(zpath, "w", compression=zipfile.ZIP_DEFLATED) as z:
        for n, data in members.items():
            z.writestr(n, data)
    assert zpath.stat().st_size < 200_000
    (run,) = list(open_source(f"comet:{zpath}").runs())
    got = [(r.step, r.metrics.get("train/loss")) for r in run.records()]
    assert got == [(0, 0.5), (1, 0.25)]
    found = list(A.Archive(zpath).lines())
    assert found[0][0] == 1 and found[1][0] == 2 + len(blank) and all(c for _, _, c in found)
    monkeypatch.setattr(A, "_CHUNK", 4)           # lines longer than a chunk, newlines at chunk edges
    text = b"first line\n\n \nsecond, a longer line\n" + b"x" * 37
    assert list(A._content_lines(io.BytesIO(text), last_complete=False)) == [
        (1, "first line\n", True), (4, "second, a longer line\n", True), (5, "x" * 37, False)]


def test_names_with_a_line_break_are_escaped_said_and_given_back(tmp_path):
    """comet_ml's schemas hold names and tags to ``^(.*)$``: a line break in a metric name, a config key or a tag
    would make ``comet upload`` refuse the message. The sink escapes it, says so once per name, and the reader
    gives the names back; every message still passes comet_ml's own validators."""
    from pathlib import Path

    import comet_ml
    import jsonschema
    schemas = Path(comet_ml.__file__).parent / "schemas"
    metric = jsonschema.Draft7Validator(json.loads((schemas / "offline-metric-msg.schema.json").read_text()))
    bad = {"local_timestamp": 1, "metric": {"metricName": "reward\nmean", "metricValue": 1, "step": 0}}
    assert not metric.is_valid(bad)                 # what the sink must never write
    sink = make_sink(f"comet:{tmp_path}")
    sink.open(RunInfo(name="n", project="p", run_id="lb", config={"opt\nlr": 0.1}, tags={"a\nb": ""}))
    sink.write([Record(s, T0 + s, {"reward\nmean": float(s), "kl\u2028value": 2.0 * s, "plain": 1.0,
                                   "h\rist": Histogram.from_values([1.0, 2.0])}) for s in range(3)])
    renamed = sink.take_renamed()
    sink.close()
    said = {k: stored for k, stored, _why in renamed}
    assert said == {"reward\nmean": "reward_x0A_mean", "kl\u2028value": "kl_x2028_value", "opt\nlr": "opt_x0A_lr",
                    "h\rist": "h_x0D_ist"}
    points, params, _others = comet_points(tmp_path)        # every message validated by comet_ml's schemas
    names = {k for k, *_x in points}
    assert {"reward_x0A_mean", "kl_x2028_value", "plain", "h_x0D_ist/mean"} <= names
    assert not any(ch in n for n in names | set(params) for ch in "\n\r\u2028\u2029")
    (zipped,) = tmp_path.glob("*.zip")
    with zipfile.ZipFile(zipped) as z:
        assert json.loads(z.read("experiment.json"))["tags"] == ["a_x0A_b"]
    (reader,) = list(open_source(f"comet:{zipped}").runs())
    back = [(r.step, sorted(r.metrics)) for r in reader.records()]
    assert back == [(s, sorted(["reward\nmean", "kl\u2028value", "plain", "h\rist/count", "h\rist/max", "h\rist/mean",
                                "h\rist/min", "h\rist/std"])) for s in range(3)]
    assert reader.info.config == {"opt\nlr": 0.1} and not reader.problems


def test_the_logger_says_once_which_name_comet_stores_otherwise(tmp_path):
    import warnings

    import trackbridge
    from trackbridge.logger import LoggerWarning
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run = trackbridge.init(project="p", run_id="lb", sinks=[f"comet:{tmp_path / 'c'}"], source="canonical",
                               spool=str(tmp_path / "spool"), options=trackbridge.LoggerOptions(writer="thread"))
        for s in range(5):
            run.log({"reward\nmean": float(s), "plain": 1.0}, step=s)
        st = run.finish()
    said = [str(w.message) for w in caught if issubclass(w.category, LoggerWarning) and "stores" in str(w.message)]
    assert len(said) == 1 and "'reward\\nmean' as 'reward_x0A_mean'" in said[0], said
    assert any("reward_x0A_mean" in p for p in st["problems"])
    (reader,) = list(open_source(f"comet:{tmp_path / 'c'}").runs())
    assert [sorted(r.metrics) for r in reader.records()] == [["plain", "reward\nmean"]] * 5
