"""A run given as a plain path (``runs/trainer_state.json``, ``verl=train.log``) is read by the reader that
recognises it, in ``compare``, ``migrate`` and ``open_source`` as in ``translate`` and ``detect``; a path that does
not exist, or that no reader recognises, is a usage error naming the path (exit 2)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from trackbridge.compare.load import load_runs
from trackbridge.migrate import migrate
from trackbridge.stream import read_stream
from trackbridge.trackers import open_source, source_locator
from trackbridge.tracking.locators import LocatorError

from _support import ROOT

STATE = {"global_step": 2, "log_history": [{"step": 1, "loss": 0.5, "kl": 0.01, "reward": 0.2},
                                           {"step": 2, "loss": 0.4, "kl": 0.02, "reward": 0.3}]}
CONSOLE = "".join(f"step:{s} - actor/pg_loss:{0.1 * s:.3f} - actor/entropy:{1.0 - 0.1 * s:.3f} - "
                  f"critic/score/mean:{0.2 * s:.3f}\n" for s in range(1, 4))


@pytest.fixture
def files(tmp_path):
    state = tmp_path / "grpo_state.json"                 # a renamed trainer_state.json: found by its content
    state.write_text(json.dumps(STATE))
    log = tmp_path / "verl.log"
    log.write_text(CONSOLE)
    return state, log


def test_a_plain_path_gets_the_kind_that_recognises_it(files):
    state, log = files
    assert source_locator(str(state)) == f"trainer-state:{state}"
    assert source_locator(f"grpo={state}") == f"grpo=trainer-state:{state}"
    assert source_locator(f"console:{log}") == f"console:{log}"            # a locator is kept as given
    assert source_locator(str(log)) == f"console:{log}"
    (run,) = list(open_source(str(state)).runs())
    assert [r.step for r in run.records()] == [1, 2]


def test_compare_and_migrate_take_plain_paths(files, tmp_path):
    state, log = files
    runs = load_runs([f"grpo={state}", str(log)], derive=False)
    assert [r.label for r in runs] == ["grpo", "verl.log"]
    assert {"kl/ref/k3", "loss/total"} <= set(runs[0].scalar_names())
    assert {"loss/policy", "policy/entropy"} <= set(runs[1].scalar_names())
    res = migrate(str(log), f"jsonl:{tmp_path / 'out'}", progress=False)
    assert res.ok and res.runs[0].records == 3
    (out,) = (tmp_path / "out").glob("*.jsonl")
    assert [r.step for _, r in read_stream(out)] == [1, 2, 3]


def test_a_missing_or_unknown_path_is_a_usage_error(files, tmp_path):
    with pytest.raises(LocatorError, match="no such file or folder"):
        source_locator(str(tmp_path / "nope.json"))
    junk = tmp_path / "notes.bin"
    junk.write_text("nothing a reader knows\n")
    with pytest.raises(LocatorError, match="no reader recognises this path; name its kind"):
        source_locator(str(junk))
    p = subprocess.run([sys.executable, "-m", "trackbridge", "compare", str(tmp_path / "nope.json")],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert p.returncode == 2 and "nope.json" in p.stderr and "no such file" in p.stderr
