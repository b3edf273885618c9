"""How a run ends is what the trackers say: an exception inside `with trackbridge.init(...)` (or an uncaught one at
interpreter exit) closes the MLflow run as FAILED and wandb with exit code 1; a normal end as FINISHED / 0. A
missing tracker package fails at init, naming the extra to install."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import trackbridge
from trackbridge.trackers import open_source

from _support import ROOT


def _mlflow_status(db):
    from mlflow.tracking import MlflowClient
    client = MlflowClient(tracking_uri=f"sqlite:///{db}")
    (exp,) = [e for e in client.search_experiments() if e.name != "Default"] or client.search_experiments()
    runs = client.search_runs([exp.experiment_id])
    return [r.info.status for r in runs]


def _wandb_exit_code(folder):
    """The exit codes in the offline run's transaction log, read with wandb's own protobuf records."""
    from wandb.proto import wandb_internal_pb2 as pb

    from trackbridge.trackers.wandb.records import read_payloads
    (f,) = list(Path(folder).rglob("*.wandb"))
    codes = []
    for _, data in read_payloads(f, None):
        rec = pb.Record()
        rec.ParseFromString(data)
        if rec.WhichOneof("record_type") == "exit":
            codes.append(rec.exit.exit_code)
    return codes


@pytest.mark.parametrize("raises", [False, True])
def test_with_block_outcome_reaches_the_trackers(tmp_path, raises):
    pytest.importorskip("mlflow")
    pytest.importorskip("wandb")
    db = tmp_path / "m.db"
    sinks = [f"mlflow:sqlite:///{db}?experiment=e", f"wandb:{tmp_path / 'wb'}", f"tensorboard:{tmp_path / 'tb'}"]
    with pytest.raises(RuntimeError) if raises else _nothing():
        with trackbridge.init(project="p", name="r", run_id="r1", spool=str(tmp_path / "spool"), sinks=sinks) as run:
            for s in range(5):
                run.log({"loss": float(s)}, step=s)
            if raises:
                raise RuntimeError("training blew up")
    assert _mlflow_status(db) == (["FAILED"] if raises else ["FINISHED"])
    assert _wandb_exit_code(tmp_path / "wb") == [1 if raises else 0]
    (tb,) = list(open_source(f"tensorboard:{tmp_path / 'tb'}").runs())
    assert tb.info.extra.get("outcome") == ("failed" if raises else "finished")
    assert len(list(tb.records())) == 5          # every point logged before the crash is there


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def test_uncaught_exception_at_exit_marks_the_run_failed(tmp_path):
    pytest.importorskip("mlflow")
    db = tmp_path / "m.db"
    code = textwrap.dedent(f"""
        import trackbridge
        run = trackbridge.init(project="p", name="r", run_id="r1", spool={str(tmp_path / 'spool')!r},
                               sinks=["mlflow:sqlite:///{db}?experiment=e"])
        for s in range(3):
            run.log({{"loss": float(s)}}, step=s)
        raise SystemExit(1) if False else ValueError("no finish(): the process dies from this")
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 1 and "ValueError" in r.stderr
    assert _mlflow_status(db) == ["FAILED"]


def test_missing_tracker_package_fails_at_init(tmp_path):
    code = textwrap.dedent(f"""
        import sys
        sys.modules["wandb"] = None          # as if wandb were not installed
        import trackbridge
        try:
            trackbridge.init(project="p", run_id="r1", spool={str(tmp_path / 'spool')!r},
                             sinks=["wandb:{tmp_path / 'wb'}"])
        except ValueError as exc:
            print("ERROR", exc)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert "ERROR" in r.stdout and "trackbridge[wandb]" in r.stdout, (r.stdout, r.stderr)
    assert not (tmp_path / "wb").exists()


def test_unusable_mapping_file_is_an_error_at_init_naming_file_and_line(tmp_path):
    bad = tmp_path / "mine.yaml"
    bad.write_text("framework: mine\n  keys: [\n")
    with pytest.raises(ValueError, match=r"mine\.yaml:2: YAML syntax error"):
        trackbridge.init(sinks=[], spool=str(tmp_path / "spool"), mappings=[str(bad)])
    with pytest.raises(ValueError, match=r"missing\.yaml: cannot read"):
        trackbridge.init(sinks=[], spool=str(tmp_path / "spool"), mappings=[str(tmp_path / "missing.yaml")])
    assert not list(tmp_path.glob("spool/*.jsonl")), "no run was started"


def test_script_importing_the_tracker_right_after_init_does_not_break_the_sink(tmp_path):
    """The sink's thread and the script importing MLflow at once used to leave one of them with a half-initialised
    package (a circular-import error, the sink failed for the run). init imports it first, in the caller's thread."""
    pytest.importorskip("mlflow")
    db = tmp_path / "m.db"
    code = textwrap.dedent(f"""
        import trackbridge
        run = trackbridge.init(project="p", name="r", run_id="r1", spool={str(tmp_path / 'spool')!r},
                               sinks=["mlflow:sqlite:///{db}?experiment=e"])
        run.log({{"loss": 0.0}}, step=0)       # the sink's thread starts opening MLflow now
        import mlflow                           # ... while the script imports it
        for s in range(1, 5):
            run.log({{"loss": float(s)}}, step=s)
        st = run.finish()
        print("STATES", [s["state"] for s in st["sinks"]])
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(ROOT), "MLFLOW_DISABLE_TELEMETRY": "true"})
    assert "STATES ['closed', 'closed']" in r.stdout, (r.stdout, r.stderr[-2000:])
    assert "circular import" not in r.stderr
    assert _mlflow_status(db) == ["FINISHED"]
