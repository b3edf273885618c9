"""Read the four trackers added by issue 22 back with their own tools, not with trackbridge's readers:

* SwanLab: ``swanlab``'s own ``DataStoreReader`` (``swanlab/sdk/internal/core_python/store``) and its protobuf
  ``Record`` class; the config from ``files/config.yaml`` (SwanLab's ``{desc, sort, value}`` entries);
* ClearML: the offline session's documented files (``task.json``, ``metrics.jsonl``: one JSON array of events per
  line), as ``Task.import_offline_session`` reads them;
* Comet: the offline zip's ``messages.json`` and ``experiment.json``, each message checked against the JSON Schema
  that ``comet upload`` checks it against (``comet_ml/schemas/offline-*.schema.json``);
* neptune-exporter Parquet: ``pandas.read_parquet`` over the part files, the schema checked against the exporter's.

Each returns ``(points, config)``: ``points`` a list of ``(key, step, wall_time, value)`` in stored order.
"""
from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Any

Point = tuple[str, int, float, Any]


def swanlab_points(logdir: Path) -> tuple[list[Point], dict[str, Any], list[Any]]:
    """Points, config and every raw ``Record`` of the one run under ``logdir``."""
    import yaml
    from swanlab.proto.swanlab.record.v1 import record_pb2
    from swanlab.sdk.internal.core_python.store import DataStoreReader

    (path,) = sorted(logdir.glob("run-*/run-*.swanlab"))
    reader = DataStoreReader()
    reader.open(path)
    points, raw = [], []
    for data in reader:
        rec = record_pb2.Record()
        rec.ParseFromString(data)
        raw.append(rec)
        if rec.WhichOneof("record_type") == "scalar":
            s = rec.scalar
            points.append((s.key, s.step, s.timestamp.seconds + s.timestamp.nanos / 1e9, s.value.number))
    reader.close()
    doc = yaml.safe_load((path.parent / "files" / "config.yaml").read_text())
    return points, {k: v["value"] for k, v in doc.items()}, raw


def clearml_points(root: Path) -> tuple[list[Point], dict[str, Any], dict[str, Any]]:
    """Points (scalars; histogram plots as their bar chart dict), the ``General`` hyperparameters and task.json of
    the one session under ``root``."""
    (folder,) = [p for p in sorted(root.glob("offline-*")) if p.is_dir()]
    task = json.loads((folder / "task.json").read_text())
    points = []
    for line in (folder / "metrics.jsonl").read_text().splitlines():
        for ev in json.loads(line):
            assert ev["task"] == task["id"]
            key = ev["metric"] if ev["metric"] == ev["variant"] else f"{ev['metric']}/{ev['variant']}"
            if ev["type"] == "training_stats_scalar":
                points.append((key, ev["iter"], ev["timestamp"] / 1000, ev["value"]))
            elif ev["type"] == "plot":
                points.append((key, ev["iter"], ev["timestamp"] / 1000, json.loads(ev["plot_str"])))
    general = {k: v["value"] for k, v in (task.get("hyperparams") or {}).get("General", {}).items()}
    return points, general, task


def _comet_validators() -> dict[str, Any]:
    import comet_ml
    import jsonschema
    schemas = Path(comet_ml.__file__).parent / "schemas"
    load = lambda name: jsonschema.Draft7Validator(json.loads((schemas / name).read_text()))  # noqa: E731
    return {"metric_msg": load("offline-metric-msg.schema.json"),
            "parameter_msg": load("offline-parameter-msg.schema.json"),
            "log_other": load("offline-log-other-msg.schema.json"),
            "experiment": load("offline-experiment.schema.json")}


def comet_points(root: Path) -> tuple[list[Point], dict[str, Any], dict[str, Any]]:
    """Points, parameters and ``log_other`` values of the one offline zip under ``root``; every message and
    ``experiment.json`` validated against comet_ml's own schemas."""
    val = _comet_validators()
    (path,) = sorted(root.glob("*.zip"))
    with zipfile.ZipFile(path) as z:
        exp = json.loads(z.read("experiment.json"))
        lines = z.read("messages.json").decode().splitlines()
    val["experiment"].validate(exp)
    points, params, others = [], {}, {}
    special = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}
    for line in lines:
        msg = json.loads(line)
        val[msg["type"]].validate(msg["payload"])
        p = msg["payload"]
        if msg["type"] == "metric_msg":
            m = p["metric"]
            v = special.get(m["metricValue"], m["metricValue"]) if isinstance(m["metricValue"], str) else \
                m["metricValue"]
            points.append((m["metricName"], m["step"], p["local_timestamp"] / 1000, v))
        elif msg["type"] == "parameter_msg":
            params[p["param"]["paramName"]] = p["param"]["paramValue"]
        else:
            others[p["key"]] = p["value"]
    return points, params, others


def neptune_points(root: Path) -> tuple[list[Point], dict[str, Any], Any]:
    """Points (series rows) and single-value attributes of the one run under ``root``, with pandas; the frame too."""
    import pandas as pd
    import pyarrow.parquet as pq

    parts = sorted(root.glob("*/*_part_*.parquet"), key=lambda p: int(p.stem.rsplit("_", 1)[1]))
    exporter = ["project_id", "run_id", "attribute_path", "attribute_type", "step", "timestamp", "int_value",
                "float_value", "string_value", "bool_value", "datetime_value", "string_set_value", "file_value",
                "histogram_value"]
    for p in parts:
        assert pq.ParquetFile(p).schema_arrow.names == exporter
    df = pd.concat([pd.read_parquet(p) for p in parts], ignore_index=True)
    points, single = [], {}
    for row in df.itertuples(index=False):
        if row.attribute_type.endswith("_series"):
            value = {"float_series": row.float_value, "string_series": row.string_value,
                     "histogram_series": row.histogram_value}[row.attribute_type]
            points.append((row.attribute_path, int(row.step), row.timestamp.timestamp(), value))
        else:
            col = {"float": "float_value", "int": "int_value", "string": "string_value", "bool": "bool_value",
                   "datetime": "datetime_value", "string_set": "string_set_value"}[row.attribute_type]
            single[row.attribute_path] = getattr(row, col)
    return points, single, df
