"""A Ray cluster that ``migrate --engine ray`` starts itself listens on the loopback interface only (issue 31).

Given ``_node_ip_address="127.0.0.1"`` alone, Ray bound its GCS server, raylet, workers and the driver to every
interface (``::``) and its runtime-env agent to the machine's address; trackbridge now starts it in Ray's
single-machine mode (:func:`trackbridge.migrate.bulk.loopback_only`). A child process migrates a few runs on a
cluster it starts, while a thread lists, with psutil, every listening socket of that process and of every process
below it (the cluster's); every one must be on 127.0.0.1, and the migration must still be whole.
"""
from __future__ import annotations

import json
import subprocess
import textwrap

import pytest

from test_migrate_support import PY, child_env

pytest.importorskip("ray")
pytest.importorskip("psutil")

SCRIPT = textwrap.dedent('''
    import json, sys, threading, time
    import psutil
    from trackbridge.migrate import migrate
    from trackbridge.record import Record, RunInfo
    from trackbridge.trackers import make_sink
    src, dst = sys.argv[1], sys.argv[2]
    for i in range(4):
        s = make_sink(src)
        s.open(RunInfo(name=f"run-{i}", run_id=f"run-{i}", project="p"))
        s.write([Record(step=k, wall_time=1.7e9 + k, metrics={"custom/a": i + k / 10}) for k in range(30)])
        s.close()
    seen, stop = set(), threading.Event()

    def watch():
        me = psutil.Process()
        while not stop.is_set():
            for p in [me] + me.children(recursive=True):
                try:
                    for c in p.net_connections(kind="inet"):
                        if c.status == psutil.CONN_LISTEN:
                            seen.add((p.name(), c.laddr.ip, c.laddr.port))
                except psutil.Error:
                    pass
            time.sleep(0.1)
    t = threading.Thread(target=watch, daemon=True)
    t.start()
    res = migrate(src, dst, names="keep", engine="ray", jobs=2, progress=False)
    stop.set()
    t.join()
    print(json.dumps({"listening": sorted(seen), "ok": res.ok, "records": sum(r.records for r in res.runs),
                      "runs": len(res.runs)}))
''')


def test_a_cluster_trackbridge_starts_listens_on_loopback_only(tmp_path):
    (tmp_path / "go.py").write_text(SCRIPT)
    env = child_env()
    env.pop("RAY_ADDRESS", None)
    env["RAY_AUTH_MODE"] = "disabled"
    env["TRACKBRIDGE_STATE_DIR"] = str(tmp_path / "state")
    env["RAY_TMPDIR"] = "/tmp"
    p = subprocess.run([PY, str(tmp_path / "go.py"), f"jsonl:{tmp_path / 'src'}", f"jsonl:{tmp_path / 'dst'}"],
                       capture_output=True, text=True, env=env, timeout=240, cwd=str(tmp_path))
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["ok"] and out["runs"] == 4 and out["records"] == 120, out
    listening = [tuple(x) for x in out["listening"]]
    names = {n for n, _ip, _port in listening}
    assert any("gcs_server" in n for n in names) and any("raylet" in n for n in names), listening
    wide = [x for x in listening if x[1] not in ("127.0.0.1", "::ffff:127.0.0.1", "::1")]
    assert not wide, f"listening beyond loopback: {wide}"
