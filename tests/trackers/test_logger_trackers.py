"""The logger writing to all five real trackers at once, read back point for point with the trackers' own readers
(TensorBoard's EventAccumulator, MlflowClient, Trackio's SQLite store) and trackbridge's readers (wandb offline
files); one sink broken mid-run and restored by replay; and MLflow through a real ``mlflow server``."""
import sqlite3
import time

import pytest

import trackbridge
from trackbridge.sync.replay import iter_spool, replay
from trackbridge.trackers import open_source

from _support.expect import logger_warnings

# wandb offline, hubs offline, scratch cache dirs: tests/conftest.py (pytest_configure), set before any
# test module imports a tracker

N = 30


def _metrics(i):
    return {"actor/pg_loss": 0.5 - i / 100, "reward/score/mean": i / 7, "val-core/gsm8k/acc/mean@1": i / N,
            "policy/entropy": 1.0 + i}


def _read(spec):
    runs = list(open_source(spec).runs())
    assert len(runs) == 1, f"{spec}: {len(runs)} runs"
    recs = list(runs[0].records())
    return runs[0], recs


def _by_step(recs, name):
    return {r.step: r.metrics[name] for r in recs if name in r.metrics}


def test_all_five_trackers_point_for_point(tmp_path):
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    db = tmp_path / "mlflow.db"
    sinks = [f"tensorboard:{tmp_path}/tb", f"mlflow:sqlite:///{db}?experiment=grpo", f"wandb:{tmp_path}/wb",
             f"trackio:{tmp_path}/trackio?project=grpo", f"jsonl:{tmp_path}/copy"]
    run = trackbridge.init(project="grpo", name="try3", sinks=sinks, source="canonical", spool=str(tmp_path / "spool"),
                           run_id="allfive", config={"learning_rate": 1e-6, "kl_coef": 0.05})
    for i in range(N):
        run.log(_metrics(i), step=i)
    st = run.finish()
    assert [s["state"] for s in st["sinks"]] == ["closed"] * 6, run.summary()
    assert [s["written"] for s in st["sinks"]] == [N] * 6
    spool = [r for _s, r in iter_spool(run.spool_path)]
    want = {name: {r.step: r.metrics[name] for r in spool} for name in _metrics(0)}
    wall = {r.step: r.wall_time for r in spool}

    # TensorBoard's own loader
    folder = next(p for p in (tmp_path / "tb").iterdir() if p.is_dir())
    ea = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    ea.Reload()
    for name in want:
        ev = ea.Scalars(name)
        assert {e.step: e.value for e in ev} == pytest.approx(want[name], rel=1e-6)
        assert all(abs(e.wall_time - wall[e.step]) < 1e-3 for e in ev)

    # MLflow's own client: the '@' name is stored sanitized, every point with its step and ms timestamp
    client = MlflowClient(tracking_uri=f"sqlite:///{db}")
    exp = client.get_experiment_by_name("grpo")
    (mrun,) = client.search_runs([exp.experiment_id])
    hist = client.get_metric_history(mrun.info.run_id, "reward/score/mean")
    assert {m.step: m.value for m in hist} == pytest.approx(want["reward/score/mean"])
    assert all(abs(m.timestamp / 1000 - wall[m.step]) < 1e-3 for m in hist)
    odd = [k for k in mrun.data.metrics if k.startswith("val-core/gsm8k/acc/mean")]
    assert len(odd) == 1 and "@" not in odd[0]
    assert len(client.get_metric_history(mrun.info.run_id, odd[0])) == N
    # ... and trackbridge's reader restores the original name
    _, mrecs = _read(f"mlflow:sqlite:///{db}?experiment=grpo")
    assert _by_step(mrecs, "val-core/gsm8k/acc/mean@1") == pytest.approx(want["val-core/gsm8k/acc/mean@1"])

    # Trackio's own SQLite store
    (tdb,) = list((tmp_path / "trackio").glob("*.db"))
    with sqlite3.connect(tdb) as con:
        rows = con.execute("SELECT step, metrics FROM metrics ORDER BY step").fetchall()
    import json
    assert [s for s, _m in rows] == list(range(N))
    assert {s: json.loads(m)["policy/entropy"] for s, m in rows} == pytest.approx(want["policy/entropy"])

    # wandb offline files, read with trackbridge's parser of the .wandb transaction log
    reader, wrecs = _read(f"wandb:{tmp_path}/wb")
    info = reader.info
    assert info.config.get("learning_rate") == 1e-6 and info.name == "try3"
    for name in want:
        assert _by_step(wrecs, name) == pytest.approx(want[name])

    # the extra jsonl sink equals the spool
    _, jrecs = _read(f"jsonl:{tmp_path}/copy")
    assert [r.metrics for r in jrecs] == [r.metrics for r in spool]


def test_broken_tracker_mid_run_others_complete_replay_restores_it(tmp_path):
    """A TensorBoard folder that becomes unwritable mid-run: the other trackers complete; replay fills the gap."""
    tb_root = tmp_path / "tb"
    db = tmp_path / "mlflow.db"
    run = trackbridge.init(project="grpo", name="broken", sinks=[f"tensorboard:{tb_root}",
                           f"mlflow:sqlite:///{db}"], source="canonical", spool=str(tmp_path / "spool"),
                           run_id="broken",
                           options=trackbridge.LoggerOptions(retries=1, backoff=0.01, retry_interval=3600,
                                                             writer="thread"))
    tb_worker = run._workers[1]
    with logger_warnings("sink tensorboard:", "sink tensorboard:.*failed", "still failing at finish"):
        for i in range(N):
            if i == 10:
                # the TensorBoard mount vanishes: the open file dies and the folder is replaced by a file, so
                # neither writing nor reopening works until the run is over
                while tb_worker.written < 10:
                    time.sleep(0.01)
                tb_worker.sink._fh.close()
                tb_root.rename(tmp_path / "tb-away")
                tb_root.write_text("not a folder any more")
            run.log(_metrics(i), step=i)
            time.sleep(0.002)
        st = run.finish()
    s = {x["sink"].split(":")[0]: x for x in st["sinks"]}
    assert s["tensorboard"]["state"] == "failed" and s["tensorboard"]["written"] == 10
    assert s["mlflow"]["state"] == "closed" and s["mlflow"]["written"] == N
    tb_root.unlink()
    (tmp_path / "tb-away").rename(tb_root)          # the mount comes back
    _, mrecs = _read(f"mlflow:sqlite:///{db}")
    assert sorted(_by_step(mrecs, "actor/pg_loss")) == list(range(N))
    _, tb_before = _read(f"tensorboard:{tb_root}")
    assert sorted(_by_step(tb_before, "actor/pg_loss")) == list(range(10))

    res = replay(run.spool_path, f"tensorboard:{tb_root}")
    assert (res.written, res.skipped, res.last_step_before) == (N - 10, 10, 9)
    _, tb_after = _read(f"tensorboard:{tb_root}")
    got = _by_step(tb_after, "actor/pg_loss")
    assert sorted(got) == list(range(N))
    assert [r.step for r in tb_after if "actor/pg_loss" in r.metrics].count(5) == 1, "no duplicates"
    spool = [r for _s, r in iter_spool(run.spool_path)]
    assert got == pytest.approx({r.step: r.metrics["actor/pg_loss"] for r in spool}, rel=1e-6)


def test_mlflow_tracking_server(tmp_path, mlflow_server):
    from mlflow.tracking import MlflowClient

    url = mlflow_server.url
    run = trackbridge.init(project="srv", name="via-server", sinks=[f"mlflow:{url}?experiment=srv"],
                           source="canonical", spool=str(tmp_path / "spool"), run_id="srv1",
                           config={"kl_coef": 0.1})
    for i in range(N):
        run.log(_metrics(i), step=i)
    st = run.finish()
    assert [s["state"] for s in st["sinks"]] == ["closed", "closed"], run.summary()
    client = MlflowClient(tracking_uri=url)
    exp = client.get_experiment_by_name("srv")
    (mrun,) = client.search_runs([exp.experiment_id])
    hist = client.get_metric_history(mrun.info.run_id, "actor/pg_loss")
    assert sorted(m.step for m in hist) == list(range(N))
    assert mrun.data.params.get("kl_coef") == "0.1"
    # replaying the spool into the server adds nothing: the run already holds every step
    # (the MLflow run is named by MLflow's own id through the locator's run= option)
    res = replay(run.spool_path, f"mlflow:{url}?experiment=srv&run={mrun.info.run_id}")
    assert res.written == 0 and res.skipped == N
    assert len(client.get_metric_history(mrun.info.run_id, "actor/pg_loss")) == N
