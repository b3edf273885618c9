"""The migration ledger's claim and the stream's header, the two things that keep a retried migration task from
opening a run twice (issue 24).

* A second claim on one run waits while the first is held and says who holds it when it gives up
  (:class:`~trackbridge.migrate.ledger.ClaimBusy`); a holder killed with SIGKILL lets go at once (the kernel
  releases the ``flock``); the next holder re-reads the ledger its predecessor left.
* Plan counters: a run finished by an earlier attempt of the same plan is reported with what that attempt wrote.
* The canonical stream's header is written whole or not at all: a file holding only part of a header (a crash in
  the middle of it) is started afresh on resume, with one header; a new file never exists without its header.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from trackbridge import stream
from trackbridge.migrate.ledger import ClaimBusy, Ledger
from trackbridge.record import Record, RunInfo

from _support import ROOT

_HOLD = r"""
import sys, time
from trackbridge.migrate.ledger import Ledger
led = Ledger(sys.argv[1], sys.argv[2])
with led.claim():
    led.save(records_written=7, complete=False)
    print("held", flush=True)
    time.sleep(120)
"""


def _holder(key: str, root) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen([sys.executable, "-c", _HOLD, key, str(root)], stdout=subprocess.PIPE, text=True,
                            env=env)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_claim_waits_and_names_the_holder(tmp_path):
    proc = _holder("k1", tmp_path)
    try:
        t0 = time.monotonic()
        with pytest.raises(ClaimBusy) as err:
            Ledger("k1", tmp_path).claim(wait=0.5)
        assert time.monotonic() - t0 >= 0.45
        assert f"process {proc.pid}" in str(err.value) and "in progress" in str(err.value)
    finally:
        proc.kill()
        proc.wait()


def test_a_killed_holder_lets_go_and_its_ledger_is_read(tmp_path):
    proc = _holder("k2", tmp_path)
    led = Ledger("k2", tmp_path)
    assert led.written == 7            # read before the claim: what the holder saved
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    t0 = time.monotonic()
    with led.claim(wait=10):
        assert time.monotonic() - t0 < 5
        assert led.written == 7
        who = json.loads(led.path.with_suffix(".lock").read_text())
        assert who["pid"] == os.getpid()
    assert led.path.with_suffix(".lock").read_text() == ""       # let go: no holder named


def test_claims_exclude_threads_of_one_process(tmp_path):
    import threading
    order: list[str] = []
    first = Ledger("k3", tmp_path).claim()
    t = threading.Thread(target=lambda: (Ledger("k3", tmp_path).claim(wait=10).release(), order.append("second")))
    t.start()
    time.sleep(0.3)
    order.append("first done")
    first.release()
    t.join(10)
    assert order == ["first done", "second"]


def test_plan_counters_report_an_earlier_attempts_work(tmp_path, monkeypatch):
    """A run that an earlier attempt of the same plan finished comes back with that attempt's counts."""
    from trackbridge.migrate.migration import Progress, _migrate_run
    from trackbridge.read.inputs import open_runs
    src = tmp_path / "src"
    w = stream.StreamWriter(src / "r.jsonl")
    w.open(RunInfo(name="r", run_id="r"))
    w.write([Record(step=i, wall_time=1.0 + i, metrics={"a": float(i), "b": 1.0}) for i in range(12)])
    w.close()
    run = open_runs(f"jsonl:{src}")[0]
    kw = dict(throttle=None, state_root=tmp_path / "state")
    first = _migrate_run(0, run, f"jsonl:{src}", f"jsonl:{tmp_path / 'dst'}", "auto", "canonical", False, None,
                         Progress(1, enabled=False), False, plan="p1", **kw)
    assert (first.records, first.points, first.finished_earlier) == (12, 24, False)
    run = open_runs(f"jsonl:{src}")[0]
    again = _migrate_run(0, run, f"jsonl:{src}", f"jsonl:{tmp_path / 'dst'}", "auto", "canonical", False, None,
                         Progress(1, enabled=False), True, plan="p1", **kw)
    assert (again.records, again.points, again.finished_earlier, again.already_done) == (12, 24, True, False)
    assert again.stats.unmapped == first.stats.unmapped == ["a", "b"]
    later = _migrate_run(0, open_runs(f"jsonl:{src}")[0], f"jsonl:{src}", f"jsonl:{tmp_path / 'dst'}", "auto",
                         "canonical", False, None, Progress(1, enabled=False), False, plan="p2", **kw)
    assert later.already_done and later.points == 0


def test_a_torn_header_is_written_again_once(tmp_path):
    path = tmp_path / "run.jsonl"
    whole = json.dumps({"type": "run", "format": "trackbridge.stream/1", "run_id": "x", "name": "x"})
    path.write_text(whole[: len(whole) // 2])          # the writer died in the middle of the header
    w = stream.StreamWriter(path)
    w.open(RunInfo(name="x", run_id="x"), resume=True)
    w.write([Record(step=0, wall_time=1.0, metrics={"a": 1.0})])
    w.close()
    lines = path.read_text().splitlines()
    assert len(lines) == 2 and json.loads(lines[0])["type"] == "run" and json.loads(lines[1])["step"] == 0
    problems: list[str] = []
    assert [r.step for _, r in stream.read_stream(path, problems=problems)] == [0] and problems == []
    assert not list(tmp_path.glob(".*.tmp"))


def test_a_new_stream_appears_with_its_header(tmp_path, monkeypatch):
    """The header goes to a temporary file that is linked into place: killed before the link (simulated by the
    link failing), the stream does not exist at all; the next open creates it with one header."""
    path = tmp_path / "run.jsonl"
    real_link = os.link

    def dies(*_a, **_k):
        raise KeyboardInterrupt("killed")
    monkeypatch.setattr(os, "link", dies)
    with pytest.raises(KeyboardInterrupt):
        stream.StreamWriter(path).open(RunInfo(name="x", run_id="x"), resume=True)
    assert not path.exists() and not list(tmp_path.iterdir())
    monkeypatch.setattr(os, "link", real_link)
    w = stream.StreamWriter(path)
    w.open(RunInfo(name="x", run_id="x"), resume=True)
    w.close()
    assert [json.loads(x)["type"] for x in path.read_text().splitlines()] == ["run"]
    with pytest.raises(FileExistsError):
        stream.StreamWriter(path).open(RunInfo(name="x", run_id="x"))
