"""A migration into a real ``mlflow server`` killed while a batch is in flight, then run again: every point once.

The server path writes a batch as several ``log_batch`` requests (1,000 points each, by key), so a kill leaves some
keys further than others. The ledger marks the batch in flight; the next run asks the server what it holds per key
and step (``Sink.held``) and writes only the rest. Read back with ``MlflowClient.get_metric_history``.
"""
from __future__ import annotations

import signal
import sqlite3
import subprocess
import time

from trackbridge.migrate import target_run_id
from trackbridge.record import Record, RunInfo

from test_logger_outages import assert_exact, mlflow_points, total
from test_migrate_support import PY, child_env, run_cli, write_run

KEYS = [f"custom/m{j:03d}" for j in range(100)]
STEPS = 250             # one batch of 25,000 points: 25 requests, the kill lands inside it (500 steps before, at twice
POINTS = STEPS * len(KEYS)    # the time, most of it the server's SQLite inserts)


def _rows(conn: sqlite3.Connection) -> int:
    try:
        return conn.execute("SELECT COUNT(*) FROM metrics").fetchone()[0]
    except sqlite3.Error:
        return 0


def test_migration_killed_mid_batch_into_a_server_then_rerun_writes_every_point_once(env, fault_cell, mlflow_server):
    src = f"jsonl:{env / 'src'}"
    info = RunInfo(name="big", project="proj", run_id="big")
    write_run(src, info, [Record(step=i, wall_time=1763700000.0 + i, metrics={k: i + j / 1000
                                                                              for j, k in enumerate(KEYS)})
                          for i in range(STEPS)])
    srv = mlflow_server
    dst = f"mlflow:{srv.url}"
    conn = sqlite3.connect(srv.db, timeout=30)
    base = _rows(conn)                      # the module's server may hold other tests' points
    proc = subprocess.Popen([PY, "-m", "trackbridge", "migrate", src, dst, "--quiet"], env=child_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 180
    while _rows(conn) - base < 3000 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    landed = _rows(conn) - base
    conn.close()
    assert 0 < landed < POINTS, f"{landed} points landed before the kill"

    run_id = target_run_id(src, info, 0)
    before = mlflow_points(srv.url, run_id)
    tops = [max(before[k]) if before.get(k) else -1 for k in KEYS]
    assert min(tops) < max(tops), "the kill did not cut a batch between keys"

    r = run_cli("migrate", src, dst, "--quiet")
    assert r.returncode == 0, r.stderr
    after = mlflow_points(srv.url, run_id)
    assert_exact(after, KEYS, range(STEPS))
    assert total(after) == POINTS
    fault_cell("migrate SIGKILLed mid-batch into a server, run again", "mlflow (server)", POINTS, total(after))
    r = run_cli("migrate", src, dst, "--quiet")          # and once more: nothing written twice
    assert r.returncode == 0, r.stderr
    assert total(mlflow_points(srv.url, run_id)) == POINTS
