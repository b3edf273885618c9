"""``trackbridge replay`` ends a run the way the run ended (issue 31): a tracker that had not taken the run when the
training process ended (here an MLflow server that was down) is left to the pending note, and the replay that
completes it later writes the outcome the run had -- failed after ``sys.exit(1)`` (MLflow FAILED, wandb exit code
1), killed after the training process was SIGKILLed while its writer process finished (MLflow KILLED, wandb exit
code 137) -- not FINISHED / 0. Read back with MLflow's own client and wandb's own protobuf records.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from trackbridge.sync.replay import pending_file

from _support import ROOT

pytest.importorskip("mlflow")
pytest.importorskip("wandb")

STEPS = 20

TRAIN = textwrap.dedent('''
    import os, signal, sys
    import trackbridge
    url, spool, how, writer = sys.argv[1:5]
    run = trackbridge.init(project="outcome", name="r", run_id=f"r-{how}-{writer}",
                           sinks=[f"mlflow:{url}?experiment=outcome"], spool=spool, source="canonical",
                           options=trackbridge.LoggerOptions(retries=0, retry_interval=3600, stall_timeout=2,
                                                             finish_timeout=15, writer=writer))
    for s in range(%d):
        run.log({"custom/a": float(s), "custom/b": -float(s)}, step=s)
    if how == "exit1":
        sys.exit(1)                      # finished at interpreter exit, as failed
    import time; time.sleep(2.5)         # the spool has every record (flush_interval 1 s) ...
    os.kill(os.getpid(), signal.SIGKILL)   # ... and the training process dies
''' % STEPS)


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "WANDB_SERVICE"}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _mlflow_run(url: str, run_id: str):
    from mlflow.tracking import MlflowClient
    client = MlflowClient(tracking_uri=url)
    exp = client.get_experiment_by_name("outcome")
    runs = client.search_runs([exp.experiment_id], filter_string=f"tags.`trackbridge.run_id` = '{run_id}'")
    assert len(runs) == 1, [r.info.run_id for r in runs]
    r = runs[0]
    steps = {k: sorted(m.step for m in client.get_metric_history(r.info.run_id, k)) for k in ("custom/a", "custom/b")}
    return r.info.status, steps


def _wandb_exit_codes(folder: Path) -> list[int]:
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


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trackbridge", *args], capture_output=True, text=True, env=_env(),
                          timeout=300, cwd=str(ROOT))


@pytest.mark.parametrize("how, writer, status, code", [
    ("exit1", "process", "FAILED", 1),
    ("exit1", "thread", "FAILED", 1),
    ("kill", "process", "KILLED", 137),
])
def test_replay_writes_the_outcome_the_run_had(tmp_path, mlflow_server, wandb_env, how, writer, status, code):
    srv = mlflow_server
    srv.kill()                                   # MLflow cannot take the run while it is logged
    spool = tmp_path / "spool"
    (tmp_path / "train.py").write_text(TRAIN)
    p = subprocess.run([sys.executable, str(tmp_path / "train.py"), srv.url, str(spool), how, writer],
                       capture_output=True, text=True, env=_env(), timeout=240)
    assert p.returncode == (1 if how == "exit1" else -signal.SIGKILL), p.stderr[-3000:]
    spool_file = spool / f"r-{how}-{writer}.jsonl"
    note = pending_file(spool_file)
    end = time.monotonic() + 90          # killed: the writer process left behind writes the note, then lets go
    while not (note.is_file() and not spool_file.with_name(spool_file.name + ".lock").exists()):
        assert time.monotonic() < end, "no pending note"
        time.sleep(0.2)
    entries = json.loads(note.read_text())["sinks"]
    assert [e["outcome"] for e in entries] == [("failed" if how == "exit1" else "killed")]
    srv.start()

    # a tracker added afterwards gets the outcome too (the note still lists MLflow, so it is kept)
    wb = tmp_path / "wb"
    r = _cli("replay", str(spool_file), "--to", f"wandb:{wb}")
    assert r.returncode == 0, r.stderr[-3000:]
    assert _wandb_exit_codes(wb) == [code]

    # the tracker the note lists: completed, and ended as the run ended
    r = _cli("replay", str(spool_file))
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"wrote {STEPS} records" in r.stderr
    got_status, steps = _mlflow_run(srv.url, f"r-{how}-{writer}")
    assert got_status == status
    assert steps == {"custom/a": list(range(STEPS)), "custom/b": list(range(STEPS))}
    assert not note.exists()
