"""A tracking server that cannot be reached: a warning naming the sink at init, training and the other sinks carry on,
finish() does not hang, and the warning says how to replay the run later (options included)."""
from __future__ import annotations

import socket
import time
import warnings

import trackbridge
from trackbridge.logger import LoggerWarning


def _dead_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()                       # nothing listens there any more
    return port


def test_unreachable_server_warns_and_finish_is_bounded(tmp_path):
    url = f"mlflow:http://127.0.0.1:{_dead_port()}?experiment=faults"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run = trackbridge.init(project="p", run_id="dead", sinks=[url, f"tensorboard:{tmp_path / 'tb'}"],
                               source="canonical", spool=str(tmp_path / "spool"),
                               options=trackbridge.LoggerOptions(retries=1, backoff=0.05, stall_timeout=10))
        t0 = time.monotonic()
        for i in range(20):
            run.log({"loss/total": float(i)}, step=i)
        assert time.monotonic() - t0 < 1.0              # training never waits for the dead server
        st = run.finish()
        took = time.monotonic() - t0
    msgs = [str(w.message) for w in caught if issubclass(w.category, LoggerWarning)]
    assert any("is not reachable now" in m and url in m for m in msgs), msgs
    assert any(f"trackbridge replay {tmp_path / 'spool' / 'dead.jsonl'} --to {url}" in m for m in msgs), msgs
    assert took < 90, f"finish() took {took:.0f} s"
    states = {s["sink"].split(" ")[0]: s["state"] for s in st["sinks"]}
    assert any(k.startswith("mlflow:") and v == "failed" for k, v in states.items()), states
    from trackbridge.trackers import open_source
    (reader,) = list(open_source(f"tensorboard:{tmp_path / 'tb'}").runs())
    assert [r.step for r in reader.records() if "loss/total" in r.metrics] == list(range(20))
