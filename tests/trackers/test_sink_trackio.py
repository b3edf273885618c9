"""TrackioSink against trackio 0.43.0's real storage, read back by trackio itself (in a child process, because
trackio fixes TRACKIO_DIR at import) and by plain SQL."""
from __future__ import annotations

import json
import math
import os
import sqlite3
import subprocess
import sys

import pytest

from trackbridge.record import Histogram, Record, RunInfo
from trackbridge.trackers import make_sink
from trackbridge.trackers.trackio.sink import TrackioSink
from trackbridge.tracking.sink import SinkError

ODD = "val-core/openai/gsm8k/acc/mean@1"
T0 = 1763700000.125


def trackio_child(directory, code: str) -> object:
    """Run ``code`` with trackio pointed at ``directory``; it prints one JSON document, returned parsed."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRACKIO_", "SPACE_"))}
    env.update(TRACKIO_DIR=str(directory), HF_HUB_OFFLINE="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def records(n=3):
    return [Record(step=i * 5, wall_time=T0 + i * 0.5, metrics={
        ODD: 0.5 + i, "loss": float("nan") if i == 1 else 1.0 / (i + 1), "big": -math.inf,
        "step": i,                                   # a trackio-reserved key
        "h": Histogram.from_values([1.0, 2.0, 3.0, float(i)]), "sample": f"text {i}"}) for i in range(n)]


def info():
    return RunInfo(name="r1", project="grpo", config={"optim": {"lr": 1e-5}, "model": "q@7b"}, tags={"team": "rl"})


def test_round_trip_read_by_trackio(tmp_path):
    sink = make_sink(f"trackio:{tmp_path}?project=grpo")
    assert isinstance(sink, TrackioSink)
    sink.open(info())
    sink.write(records())
    sink.close()
    assert (tmp_path / "grpo.db").exists()
    got = trackio_child(tmp_path, """
import json
from trackio.sqlite_storage import SQLiteStorage
import trackio
runs = [(r.name, r.id, r.config) for r in trackio.Api().runs("grpo")]
logs = SQLiteStorage.get_logs("grpo", "r1")
print(json.dumps({"runs": runs, "logs": logs, "last": SQLiteStorage.get_last_step("grpo", "r1")}, default=str))
""")
    (name, run_id, config), = got["runs"]
    assert name == "r1" and run_id == sink.run_id
    assert config["optim"] == {"lr": 1e-5} and config["model"] == "q@7b"
    assert "_Created" in config and config["_trackbridge"]["tags"] == {"team": "rl"}
    logs = got["logs"]
    assert [row["step"] for row in logs] == [0, 5, 10]
    assert got["last"] == 10
    assert logs[0][ODD] == 0.5 and logs[2][ODD] == 2.5                 # names kept verbatim
    assert logs[0]["__step"] == 0                                        # trackio's own rename of reserved keys
    assert logs[1]["loss"] == "NaN" or math.isnan(float(logs[1]["loss"]))  # JSON output of NaN
    assert logs[0]["h"]["_type"] == "trackio.histogram" and sum(logs[0]["h"]["values"]) == 4
    assert logs[0]["sample"] == "text 0"
    # the original wall time, not trackio's flush time
    from datetime import datetime
    assert [datetime.fromisoformat(row["timestamp"]).timestamp() for row in logs] == [T0, T0 + 0.5, T0 + 1.0]


def test_sql_schema_and_idempotent_replay(tmp_path):
    sink = make_sink(f"trackio:{tmp_path}?project=my.proj")       # canonical name drops the dot, as trackio does
    sink.open(info())
    recs = records()
    sink.write(recs)
    sink.write(recs)                  # same log ids -> INSERT OR IGNORE
    sink.write(recs[:1])
    assert sink.last_step() == 10
    sink.close()
    db = tmp_path / "myproj.db"
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 2
        rows = conn.execute("SELECT step, metrics, log_id FROM metrics ORDER BY id").fetchall()
        assert len(rows) == 3 and all(r[2] for r in rows)
        m = json.loads(rows[1][1])
        assert m["loss"] == "NaN" and m["big"] == "-Infinity"
        assert m["h"]["trackbridge"]["sum"] == 7.0
        (cfg,), = conn.execute("SELECT config FROM configs").fetchall()
        assert json.loads(cfg)["_trackbridge"]["sanitized"] == {"__step": "step"}


def test_resume_continues_the_run(tmp_path):
    first = make_sink(f"trackio:{tmp_path}?project=p")
    first.open(info())
    first.write(records(2))
    first.close()
    i2 = info()
    i2.run_id = first.run_id
    again = make_sink(f"trackio:{tmp_path}?project=p")
    again.open(i2, resume=True)
    assert again.run_id == first.run_id and again.last_step() == 5
    again.write([Record(step=None, wall_time=T0 + 9, metrics={"x": 1.0})])
    again.close()
    with sqlite3.connect(tmp_path / "p.db") as conn:
        steps = [r[0] for r in conn.execute("SELECT step FROM metrics WHERE run_id = ? ORDER BY id", (first.run_id,))]
        assert steps == [0, 5, 6]
        assert conn.execute("SELECT COUNT(*) FROM configs").fetchone()[0] == 1


def test_a_sink_closed_and_opened_again_writes_its_config_again(tmp_path):
    """The logger's recovery closes a failed sink and opens the same object again: its final close writes the run's
    config again (it once did nothing: the second close thought it had closed already)."""
    sink = make_sink(f"trackio:{tmp_path}?project=p")
    run = info()
    sink.open(run)
    sink.write(records(1))
    sink.close()
    sink.open(run, resume=True)
    run.config["optim"]["lr"] = 2e-5
    sink.close()
    with sqlite3.connect(tmp_path / "p.db") as conn:
        (cfg,) = conn.execute("SELECT config FROM configs WHERE run_id = ?", (sink.run_id,)).fetchone()
    assert json.loads(cfg)["optim"] == {"lr": 2e-5}


def test_resume_missing_run_by_option(tmp_path):
    sink = make_sink(f"trackio:{tmp_path}?project=p&run=nope")
    with pytest.raises(SinkError, match="no run 'nope'"):
        sink.open(info())


def test_two_directories_in_one_process(tmp_path):
    a, b = make_sink(f"trackio:{tmp_path / 'a'}?project=x"), make_sink(f"trackio:{tmp_path / 'b'}?project=x")
    a.open(info())
    b.open(info())
    a.write(records(1))
    b.write(records(2))
    a.close()
    b.close()
    assert a.last_step() == 0 and b.last_step() == 5
