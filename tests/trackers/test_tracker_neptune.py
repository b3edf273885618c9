"""neptune-exporter's Parquet layout (neptune-ai/neptune-exporter@8d3f44a6, ``model.py`` SCHEMA; pyarrow): the
sink's run read back with pandas and pyarrow (the exporter's columns and types, one row per point, steps as
decimals, wall times in ms, typed config attributes); a run laid out as the exporter writes one (attribute after
attribute, Neptune 2 ids, a decimal step) read by trackbridge; a file of another layout refused."""
from __future__ import annotations

import math
from decimal import Decimal

import pytest

from trackbridge.record import Histogram, Record, RunInfo
from trackbridge.trackers import guess_locator, make_sink, open_source
from trackbridge.trackers.neptune.format import sanitize_path_part, schema
from trackbridge.tracking.source import SourceError

from _support.tracker_files import neptune_points

T0 = 1763700000.1234


def test_the_run_read_back_with_pandas(tmp_path):
    sink = make_sink(f"neptune:{tmp_path}?project=ws/proj")
    sink.open(RunInfo(name="run one", project="p", run_id="r1", config={"lr": 0.001, "model": {"layers": 2},
                                                                        "on": True, "name": "x"}, tags={"g": "1"}))
    sink.write([Record(0, T0, {"train/loss": 0.5, "note": "hello"}), Record(0, T0 + 0.25, {"eval/loss": 0.75}),
                Record(1, T0 + 1, {"train/loss": math.nan, "w": Histogram.from_values([1.0, 2.0, 3.0])}),
                Record(1, T0 + 2, {"train/loss": 0.25}), Record(10 ** 13, T0 + 3, {"train/loss": 1.0})])
    rejected = sink.take_rejected()
    sink.close()
    points, single, df = neptune_points(tmp_path)
    assert (tmp_path / sanitize_path_part("ws/proj") / f"{sanitize_path_part('r1')}_part_0.parquet").is_file()
    assert set(df["project_id"]) == {"ws/proj"} and set(df["run_id"]) == {"r1"}
    ms = lambda t: round(t * 1000) / 1000  # noqa: E731
    assert [(k, s, t) for k, s, t, _v in points] == [("train/loss", 0, ms(T0)), ("note", 0, ms(T0)),
                                                     ("eval/loss", 0, ms(T0 + 0.25)), ("train/loss", 1, ms(T0 + 1)),
                                                     ("w", 1, ms(T0 + 1)), ("train/loss", 1, ms(T0 + 2))]
    assert points[0][3] == 0.5 and points[1][3] == "hello" and math.isnan(points[3][3]) and points[5][3] == 0.25
    hist = points[4][3]
    assert hist["type"] == "COUNTING" and len(hist["edges"]) == len(hist["values"]) + 1 and sum(hist["values"]) == 3
    assert list(df.loc[df["attribute_type"] == "float_series", "step"]) == [Decimal(0), Decimal(0), Decimal(1),
                                                                          Decimal(1)]
    assert single["config/lr"] == 0.001 and single["config/model/layers"] == 2 and single["config/on"] is True
    assert single["sys/name"] == "run one" and single["sys/custom_run_id"] == "r1" and list(single["sys/tags"]) == \
        ["g=1"]
    assert [(k, s) for k, s, _w in rejected] == [("step", 10 ** 13)]       # beyond decimal(18, 6)
    (reader,) = list(open_source(f"neptune:{tmp_path}").runs())
    assert reader.info.config == {"lr": 0.001, "model": {"layers": 2}, "on": True, "name": "x"}
    assert [sorted(r.metrics) for r in reader.records()] == [["note", "train/loss"], ["eval/loss"],
                                                            ["train/loss", "w"], ["train/loss"]]
    assert guess_locator(str(tmp_path)) == f"neptune:{tmp_path}"


def test_a_run_laid_out_as_the_exporter_writes_it(tmp_path):
    """What neptune-exporter writes for a Neptune 2 run: ids like SAN-1, parameters under their own paths, one
    attribute's points after another, decimal steps (read with ``?step_multiplier=``, as its loaders do)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    rows = {c: [] for c in schema().names}

    def row(path, typ, step=None, ms=None, **value):
        for c in schema().names:
            rows[c].append({"project_id": "ws/proj", "run_id": "SAN-1", "attribute_path": path, "attribute_type": typ,
                            "step": None if step is None else Decimal(str(step)), "timestamp": ms}.get(c, value.get(c)))
    row("sys/name", "string", string_value="exported")
    row("parameters/lr", "float", float_value=0.01)
    row("parameters/batch", "int", int_value=32)
    for i in range(3):
        row("train/loss", "float_series", i * 0.5, 1_700_000_000_000 + i * 1000, float_value=1.0 / (i + 1))
    for i in range(3):
        row("train/acc", "float_series", i * 0.5, 1_700_000_000_000 + i * 1000, float_value=0.1 * i)
    table = pa.Table.from_pydict(rows, schema=schema())
    folder = tmp_path / sanitize_path_part("ws/proj")
    folder.mkdir()
    pq.write_table(table, folder / f"{sanitize_path_part('SAN-1')}_part_0.parquet")
    (reader,) = list(open_source(f"neptune:{tmp_path}").runs())
    assert reader.info.name == "exported" and reader.info.run_id == "SAN-1"
    assert reader.info.config == {"parameters": {"lr": 0.01, "batch": 32}}
    assert [r.step for r in reader.records()] == [0, 1]          # step 0.5 is no whole number: skipped, said
    assert [p.what.split(";")[0] for p in reader.problems] == [
        f"'{k}': step 0.500000 is not a whole number (times ?step_multiplier=1)" for k in ("train/loss", "train/acc")]
    (reader,) = list(open_source(f"neptune:{tmp_path}?step_multiplier=2").runs())
    recs = list(reader.records())                 # in time order: the two attributes of one step are one row again
    assert [(r.step, r.wall_time, r.metrics) for r in recs] == [
        (i, 1_700_000_000 + i, {"train/loss": 1.0 / (i + 1), "train/acc": 0.1 * i}) for i in range(3)]


def test_a_file_of_another_layout_is_refused(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    folder = tmp_path / "proj"
    folder.mkdir()
    bad = pa.table({c: pa.array([], type=f.type) for c, f in zip(schema().names, schema())}).set_column(
        4, "step", pa.array([], type=pa.float64()))
    pq.write_table(bad, folder / "run_part_0.parquet")
    with pytest.raises(SourceError, match=r"an unknown version of neptune-exporter's Parquet layout \(step is double, "
                                          r"expected decimal128\(18, 6\)\)"):
        list(list(open_source(f"neptune:{tmp_path}").runs())[0].records())


def test_parts_roll_over_and_a_resumed_run_continues_in_a_new_part(tmp_path, monkeypatch):
    from trackbridge.trackers.neptune import sink as neptune_sink
    monkeypatch.setattr(neptune_sink, "PART_ROWS", 25)
    for resume, steps in ((False, range(0, 30)), (True, range(30, 40))):
        sink = make_sink(f"neptune:{tmp_path}")
        sink.open(RunInfo(name="r", run_id="r1", config={"lr": 0.1}), resume=resume)
        for s in steps:                                       # one record per write, as the logger's small batches
            sink.write([Record(s, T0 + s, {"a": float(s), "b": -float(s)})])
        assert sink.held().last_step() == steps[-1]
        sink.close()
    parts = sorted(p.name for p in tmp_path.glob("*/*.parquet"))
    assert len(parts) >= 4 and not list(tmp_path.glob("*/*.tmp"))
    points, single, _df = neptune_points(tmp_path)
    assert [(k, s) for k, s, _t, _v in points] == [(k, s) for s in range(40) for k in ("a", "b")]
    assert single["config/lr"] == 0.1
    (reader,) = list(open_source(f"neptune:{tmp_path}").runs())
    assert [r.step for r in reader.records()] == list(range(40))
