"""``trackbridge.unwrap`` takes what ``wrap`` returned, the wrapped object, or a wrapped callable set as a class
attribute (then what the instance hands out is a method bound to the wrapper)."""
from __future__ import annotations

import json

import pytest

import trackbridge


class Tracking:
    def log(self, data, step=None):
        return ("logged", step)


def _spooled(spool):
    out = []
    for f in spool.glob("*.jsonl"):
        out += [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
    return [r for r in out if r.get("type") != "run"]


def test_unwrap_a_bound_wrapped_method_gives_back_the_original(tmp_path, monkeypatch):
    original = Tracking.log
    monkeypatch.setattr(Tracking, "log", trackbridge.wrap(Tracking.log, source="canonical",
                                                               spool=str(tmp_path / "spool")))
    t = Tracking()
    assert t.log({"loss/total": 0.5}, 3) == ("logged", 3)            # the original's result, unchanged
    back = trackbridge.unwrap(t.log)                               # a method bound to the LogWrapper
    assert back is original
    records = _spooled(tmp_path / "spool")
    assert [r["step"] for r in records] == [3]
    assert records[0]["metrics"] == {"loss/total": 0.5}


def test_unwrap_a_handle_or_the_wrapped_callable(tmp_path):
    def log(data, step=None):
        return step

    handle = trackbridge.wrap(log, spool=str(tmp_path / "spool"))
    assert handle({"loss": 1.0}, step=1) == 1
    assert trackbridge.unwrap(handle) is log
    with pytest.raises(ValueError, match="is not wrapped"):
        trackbridge.unwrap(object())
