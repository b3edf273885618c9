"""ClearML (clearml 2.1.x, offline session): the sink's session read back as ClearML's own offline files (task.json,
metrics.jsonl: what ``Task.import_offline_session`` replays); the title/series rule; a session made by ClearML's SDK
read by trackbridge; a cut line resumed; the zip."""
from __future__ import annotations

import json
import shutil
import zipfile

import pytest

from trackbridge.record import Histogram, Record, RunInfo
from trackbridge.trackers import guess_locator, make_sink, open_source
from trackbridge.tracking.source import SourceError

from _support import ROOT
from _support.tracker_files import clearml_points

T0 = 1763700000.1234
SDK_SESSION = ROOT / "tests" / "data" / "trackers" / "clearml-2.1.12-session"


def _write(d, records, resume=False, run_id="r1"):
    sink = make_sink(f"clearml:{d}?project=proj")
    sink.open(RunInfo(name="run one", project="p", run_id=run_id, config={"lr": 0.001, "model": {"layers": 2}},
                      tags={"group": "g"}), resume=resume)
    sink.write(records)
    rejected = sink.take_rejected()
    sink.close()
    return rejected


def test_clearml_session_read_back_as_clearmls_files(tmp_path):
    rejected = _write(tmp_path, [
        Record(0, T0, {"train/loss": 0.5, "loss": 2.0, "actor/kl/mean": 0.01}),
        Record(0, T0 + 0.25, {"eval/loss": 0.75}),
        Record(1, T0 + 1, {"train/loss": float("nan"), "w": Histogram.from_values([1.0, 2.0, 3.0]), "note": "x"}),
        Record(1, T0 + 2, {"train/loss": 0.25})])
    points, general, task = clearml_points(tmp_path)
    scalars = [(k, s, t, v) for k, s, t, v in points if not isinstance(v, dict)]
    assert scalars == [("train/loss", 0, round(T0 * 1000) / 1000, 0.5), ("loss", 0, round(T0 * 1000) / 1000, 2.0),
                       ("actor/kl/mean", 0, round(T0 * 1000) / 1000, 0.01),
                       ("eval/loss", 0, round((T0 + 0.25) * 1000) / 1000, 0.75),
                       ("train/loss", 1, round((T0 + 2) * 1000) / 1000, 0.25)]
    events = [ev for line in (tmp_path / task["id"] / "metrics.jsonl").read_text().splitlines()
              for ev in json.loads(line)]
    assert [(e["metric"], e["variant"]) for e in events if e["type"] == "training_stats_scalar"][:3] == [
        ("train", "loss"), ("loss", "loss"), ("actor", "kl/mean")]       # split on the first '/'; 'loss' alone
    ((hist_key, step, _t, chart),) = [p for p in points if isinstance(p[3], dict)]
    assert hist_key == "w" and step == 1 and chart["data"][0]["type"] == "bar" and sum(chart["data"][0]["y"]) == 3
    assert general == {"lr": "0.001", "model/layers": "2"}
    assert task["name"] == "run one" and task["project_name"] == "proj" and task["tags"] == ["group=g"]
    assert sorted((k, s) for k, s, _w in rejected) == [("note", 1), ("train/loss", 1)]
    with zipfile.ZipFile(tmp_path / f"{task['id']}.zip") as z:               # the zip ClearML prints for import
        assert sorted(z.namelist()) == ["metrics.jsonl", "task.json"]
        assert z.read("metrics.jsonl").decode() == (tmp_path / task["id"] / "metrics.jsonl").read_text()
    (reader,) = list(open_source(f"clearml:{tmp_path}").runs())
    recs = list(reader.records())
    assert reader.info.config == {"lr": 0.001, "model": {"layers": 2}} and not reader.problems
    assert [sorted(r.metrics) for r in recs] == [["actor/kl/mean", "loss", "train/loss"], ["eval/loss"],
                                                ["train/loss", "w"]]
    assert isinstance(recs[2].metrics["w"], Histogram) and recs[2].metrics["w"].num == 3
    assert guess_locator(str(tmp_path)) == f"clearml:{tmp_path}"
    assert guess_locator(str(tmp_path / f"{task['id']}.zip")) == f"clearml:{tmp_path / (task['id'] + '.zip')}"


def test_a_session_made_by_clearmls_sdk_is_read(tmp_path):
    """tests/data/trackers/clearml-2.1.12-session: made by clearml 2.1.12's ``Task.set_offline(True)`` with the script
    beside it (report_scalar at iterations 0, 1, 2, again 1, a NaN it reported as 0.0, a histogram, a text)."""
    shutil.copytree(SDK_SESSION, tmp_path / json.loads((SDK_SESSION / "task.json").read_text())["id"])
    (reader,) = list(open_source(f"clearml:{tmp_path}").runs())
    got = [(k, r.step, r.wall_time, v) for r in reader.records() for k, v in r.metrics.items()]
    events = [ev for line in (SDK_SESSION / "metrics.jsonl").read_text().splitlines() for ev in json.loads(line)]
    want = [(e["metric"] if e["metric"] == e["variant"] else f"{e['metric']}/{e['variant']}", e["iter"],
             e["timestamp"] / 1000, e["value"]) for e in events if e["type"] == "training_stats_scalar"]
    assert got == want and len(want) == 5
    assert reader.info.name == "t1" and reader.info.project == "p1"
    assert reader.info.config == {"lr": 0.1, "nested": {"a": 1}}
    assert ["plot events are not read" in p.what for p in reader.problems] == [True]


def test_a_cut_line_is_reported_then_cut_back_on_resume(tmp_path):
    _write(tmp_path, [Record(s, T0 + s, {"a": float(s)}) for s in range(3)])
    (folder,) = [p for p in tmp_path.glob("offline-*") if p.is_dir()]
    with open(folder / "metrics.jsonl", "a") as fh:
        fh.write('[{"timestamp": 1, "type": "training_stats_scal')
    (reader,) = list(open_source(f"clearml:{folder}").runs())
    assert [r.step for r in reader.records()] == [0, 1, 2]
    assert "cut short" in reader.problems[0].what and reader.problems[0].where.endswith("metrics.jsonl:2")
    _write(tmp_path, [Record(s, T0 + s, {"a": float(s)}) for s in range(3, 5)], resume=True)
    points, _g, _t = clearml_points(tmp_path)
    assert [(k, s) for k, s, _t, _v in points] == [("a", s) for s in range(5)]


def test_a_folder_without_a_task_id_is_refused(tmp_path):
    folder = tmp_path / "offline-x"
    folder.mkdir()
    (folder / "task.json").write_text(json.dumps({"name": "no id"}))
    with pytest.raises(SourceError, match="task.json has no task id"):
        list(open_source(f"clearml:{folder}").runs())


def test_keys_clearml_would_file_under_one_title_and_series(tmp_path):
    rejected = _write(tmp_path, [Record(0, T0, {"loss": 1.0, "loss/loss": 2.0, "/lead": 3.0})])
    assert [(k, s) for k, s, _w in rejected] == [("loss/loss", 0)]
    (reader,) = list(open_source(f"clearml:{tmp_path}").runs())
    assert [r.metrics for r in reader.records()] == [{"loss": 1.0, "/lead": 3.0}]


def test_a_zipped_session_with_a_line_separator_inside_a_name_reads_whole(tmp_path):
    """The sink escapes U+2028, U+2029 and U+0085 in metrics.jsonl now; a session written before holds them raw
    inside a JSON string. The folder was read line by line as a file reads it, the zip with ``str.splitlines``,
    which cut such a line in two: both read it whole now."""
    name = "odd\u2028key/x\u0085y"
    _write(tmp_path, [Record(0, T0, {name: 1.5, "loss": 2.0}), Record(1, T0 + 1, {name: 2.5})])
    (task_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    metrics = task_dir / "metrics.jsonl"
    raw = metrics.read_text(encoding="utf-8").replace("\\u2028", "\u2028").replace("\\u0085", "\u0085")
    assert raw.count("\n") == 1 and len(raw.splitlines()) == 5    # as an older sink wrote it: one line (one write)
    metrics.write_text(raw, encoding="utf-8")
    with zipfile.ZipFile(tmp_path / f"{task_dir.name}.zip", "w") as z:
        z.writestr("metrics.jsonl", raw)
        z.write(task_dir / "task.json", "task.json")
    for where in (task_dir, tmp_path / f"{task_dir.name}.zip"):
        (reader,) = list(open_source(f"clearml:{where}").runs())
        recs = list(reader.records())
        assert not reader.problems, (where, reader.problems)
        assert [(r.step, r.metrics) for r in recs] == [(0, {name: 1.5, "loss": 2.0}), (1, {name: 2.5})], where
