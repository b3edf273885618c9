"""Read each tracker back with its own tools and count points per key and step (the fault tests' ground truth):

* TensorBoard: ``EventFileLoader`` over the raw event files (no de-duplication, so a doubled point shows);
* MLflow: ``MlflowClient`` (``search_runs`` by trackbridge's run-id tag, ``get_metric_history``, the run's status);
* Trackio: sqlite3 on its database;
* wandb: the offline ``.wandb`` transaction log (wandb 0.31 ships no reader of it) framed as wandb writes it
  (LevelDB-log chunks after a 7-byte header; parsed here, independently of trackbridge's reader) and decoded with
  wandb's own protobuf classes (``wandb.proto.wandb_internal_pb2.Record``): history rows, config, exit code;
* the spool: its JSON lines, with ``json`` only.

Each ``*_points`` returns ``{key: Counter({step: points})}``.
"""
from __future__ import annotations

import collections
import json
import sqlite3
import struct
from pathlib import Path
from typing import Any, Iterator

Points = dict[str, collections.Counter]


def tensorboard_points(folder: Path) -> Points:
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    out: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for path in sorted(Path(folder).rglob("*tfevents*")):
        for event in EventFileLoader(str(path)).Load():
            for v in event.summary.value:
                if not v.tag.startswith("trackbridge/") and not v.tag.startswith("_hparams_"):
                    out[v.tag][event.step] += 1
    return dict(out)


def mlflow_run(uri: str, run_id: str) -> Any:
    from mlflow.tracking import MlflowClient
    client = MlflowClient(tracking_uri=uri)
    exps = client.search_experiments()
    found = client.search_runs([e.experiment_id for e in exps],
                               filter_string=f"tags.`trackbridge.run_id` = '{run_id}'")
    assert len(found) == 1, f"{len(found)} MLflow runs for {run_id}"
    return client, found[0]


def mlflow_points(uri: str, run_id: str) -> Points:
    client, mrun = mlflow_run(uri, run_id)
    return {key: collections.Counter(m.step for m in client.get_metric_history(mrun.info.run_id, key))
            for key in mrun.data.metrics}


def mlflow_status(uri: str, run_id: str) -> str:
    return mlflow_run(uri, run_id)[1].info.status


def trackio_points(db: Path, run_id: str) -> Points:
    out: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    with sqlite3.connect(db) as conn:
        for step, blob in conn.execute("SELECT step, metrics FROM metrics WHERE run_id = ?", (run_id,)):
            for key in json.loads(blob):
                out[key][step] += 1
    return dict(out)


def spool_points(path: Path) -> tuple[Points, list[str]]:
    """Points of a spool file, and its lines that are not complete JSON objects (torn, garbage)."""
    out: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    bad = []
    for n, raw in enumerate(Path(path).read_bytes().split(b"\n"), 1):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except ValueError:
            bad.append(f"line {n}: {raw[:60]!r}")
            continue
        if obj.get("type") == "run":
            continue
        for key in obj.get("metrics") or {}:
            out[key][obj["step"]] += 1
    return dict(out), bad


# -- wandb's offline transaction log ------------------------------------------------------------------------------
_BLOCK = 32768


def _payloads(path: Path) -> Iterator[bytes]:
    data = Path(path).read_bytes()
    assert data[:4] == b":W&B", f"{path}: not a wandb transaction log"
    pos, buf = 7, b""
    while pos + 7 <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < 7:
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind == 0 and length == 0:
            continue
        if kind == 1:
            yield chunk
        elif kind == 2:
            buf = chunk
        elif kind == 3:
            buf += chunk
        elif kind == 4:
            yield buf + chunk
            buf = b""


def wandb_records(folder: Path, run_id: str | None = None, torn: list[int] | None = None) -> Iterator[Any]:
    """wandb ``Record`` protobufs of every offline run file under ``folder`` (of ``run_id`` only, if given), in the
    order wandb made the run folders. ``torn``: a record that does not parse is counted there (``torn[0]``) and
    skipped instead of raising (``wandb sync`` skips it too)."""
    from google.protobuf.message import DecodeError
    from wandb.proto import wandb_internal_pb2 as pb
    files = sorted(Path(folder).rglob("*.wandb"), key=lambda p: p.parent.name)
    for f in files:
        if run_id is not None and f.name != f"run-{run_id}.wandb":
            continue
        for data in _payloads(f):
            rec = pb.Record()
            try:
                rec.ParseFromString(data)
            except DecodeError:
                if torn is None:
                    raise
                torn[0] += 1
                continue
            yield rec


def wandb_points(folder: Path, run_id: str | None = None, torn: list[int] | None = None) -> Points:
    """key -> Counter(true step) of the history rows (the true step is the row's ``trackbridge/step``)."""
    out: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for rec in wandb_records(folder, run_id, torn):
        if rec.WhichOneof("record_type") != "history":
            continue
        row = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in rec.history.item}
        step = row.get("trackbridge/step")
        for key in row:
            if not key.startswith("_") and not key.startswith("trackbridge/"):
                out[key][step] += 1
    return dict(out)


def wandb_exit_codes(folder: Path, run_id: str | None = None) -> list[int]:
    return [rec.exit.exit_code for rec in wandb_records(folder, run_id) if rec.WhichOneof("record_type") == "exit"]


def wandb_config(folder: Path, run_id: str | None = None) -> dict[str, Any]:
    """The run's config as its config records left it (later records update earlier ones)."""
    config: dict[str, Any] = {}
    for rec in wandb_records(folder, run_id):
        kind = rec.WhichOneof("record_type")
        items = rec.config.update if kind == "config" else (rec.run.config.update if kind == "run" else [])
        for item in items:
            key = item.key or "/".join(item.nested_key)
            value = json.loads(item.value_json)
            config[key] = value.get("value", value) if isinstance(value, dict) and "value" in value else value
    return config


# -- counting -----------------------------------------------------------------------------------------------------
def total(points: Points) -> int:
    return sum(sum(c.values()) for c in points.values())


def exact(points: Points, keys: list[str], steps: Any) -> str | None:
    """None when every key holds every step exactly once and nothing else; else what is wrong (for the assert)."""
    want = set(steps)
    for key in keys:
        got = points.get(key, collections.Counter())
        doubled = sorted(s for s, n in got.items() if n > 1)
        missing = sorted(want - set(got))
        extra = sorted(set(got) - want)
        if doubled or missing or extra:
            return (f"{key}: doubled {doubled[:5]} ({len(doubled)}), missing {missing[:5]} ({len(missing)}), "
                    f"extra {extra[:5]} ({len(extra)})")
    return None
