"""Hostile inputs and output-folder safety (issue 19, items 12 and 13; issue 18, item 9).

Every command here runs in a child process with its address space limited to 2 GB (``RLIMIT_AS``) and a timeout, so
an input that makes it read forever or expand without bound fails the test instead of the machine. Each bad input
must give one line naming the file (and line or offset), never a traceback, and the exit code the README promises.
"""
from __future__ import annotations

import csv
import json
import os
import resource
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

import trackbridge
from trackbridge.errors import UsageError
from trackbridge.logger import LoggerWarning
from trackbridge.record import Record, RunInfo, dumps

from _support import ROOT
from _support.readback import exact, tensorboard_points

WRITERS = ["process", "thread"]
LIMIT = 2 * 2 ** 30


def _limit() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (LIMIT, LIMIT))


def cli(*args: object, timeout: float = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), TRACKBRIDGE_NO_CACHE="1")
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "trackbridge", *map(str, args)], capture_output=True, text=True,
                       env=env, timeout=timeout, preexec_fn=_limit, cwd=str(ROOT))
    p.took = time.monotonic() - t0          # type: ignore[attr-defined]
    return p


def one_line(p: subprocess.CompletedProcess) -> str:
    """The one line saying what is wrong (after the command's own heading, such as "invalid mappings:")."""
    lines = [ln for ln in p.stderr.splitlines() if ln.strip() and not ln.rstrip().endswith("invalid mappings:")]
    assert "Traceback" not in p.stderr and len(lines) == 1, p.stderr[-3000:]
    return lines[0]


LAUGHS = "".join(f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]\n" for i in range(1, 10))


def _laughs(path: Path, head: str) -> Path:
    path.write_text(head + "l0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + LAUGHS)
    assert path.stat().st_size < 2048
    return path


@pytest.fixture
def rows(tmp_path):
    p = tmp_path / "rows.jsonl"
    p.write_text('{"step": 1, "actor/pg_loss": 0.5}\n')
    return p


# -- item 12: billion laughs, devices, FIFOs, huge files -------------------------------------------------------------
def test_billion_laughs_mapping_and_rules_files_are_refused_at_once(tmp_path, rows):
    mapping = _laughs(tmp_path / "laughs.yaml", "format: trackbridge.mapping/1\nframework: verl\n")
    rules = _laughs(tmp_path / "rules.yaml", "format: trackbridge.derived/1\n")
    for args in (("mappings", "lint", mapping), ("translate", "--mappings", mapping, rows),
                 ("translate", "--derive", "--mappings", rules, rows)):
        p = cli(*args)
        assert p.returncode == 2, (args, p.stderr[-2000:])
        line = one_line(p)
        assert str(args[-2] if args[0] == "translate" else args[-1]) in line and "billion laughs" in line, line
        assert p.took < 60, f"{args}: {p.took:.0f} s"
    with pytest.raises(UsageError, match=r"laughs\.yaml:\d+: .*billion laughs"):
        trackbridge.init(sinks=[], spool=str(tmp_path / "spool"), mappings=[str(mapping)])


def test_recursive_yaml_alias_is_refused(tmp_path, rows):
    bad = tmp_path / "loop.yaml"
    bad.write_text("format: trackbridge.mapping/1\nframework: verl\nentries: &e\n  - *e\n")
    p = cli("translate", "--mappings", bad, rows)
    assert p.returncode == 2 and "loop.yaml" in one_line(p), p.stderr


@pytest.mark.parametrize("kind", ["/dev/zero", "/dev/urandom", "fifo", "folder", "huge"])
def test_mapping_paths_that_are_not_small_regular_files_are_refused_unread(tmp_path, rows, kind):
    if kind == "fifo":
        path = tmp_path / "pipe.yaml"
        os.mkfifo(path)
    elif kind == "folder":
        path = tmp_path / "dir.yaml"
        path.mkdir()
    elif kind == "huge":
        path = tmp_path / "huge.yaml"
        with open(path, "wb") as fh:          # 300 MB, sparse: refused by its size, never read
            fh.truncate(300 * 2 ** 20)
    else:
        if not Path(kind).exists():
            pytest.skip(f"no {kind} here")
        path = Path(kind)
    for args in (("translate", "--mappings", path, rows), ("mappings", "lint", path)):
        p = cli(*args, timeout=60)
        assert p.returncode == 2, (args, p.stderr[-2000:])
        line = one_line(p)
        assert str(path) in line and ("not a regular file" in line or "bytes" in line), line
        assert p.took < 30
    with pytest.raises(UsageError, match="not a regular file|bytes"):
        trackbridge.init(sinks=[], spool=str(tmp_path / "spool"), mappings=[str(path)])


def test_replay_never_takes_file_paths_from_the_spool(tmp_path):
    """A shared spool whose header names ``mappings: ["/dev/zero"]``: replay does not read it (paths come from the
    user), says so, and replays the run."""
    spool = tmp_path / "shared.jsonl"
    info = RunInfo(name="s", project="p", run_id="s", names="canonical",
                   extra={"names": "verl@0.4.1", "mappings": ["/dev/zero"]})
    recs = [Record(step=i, wall_time=1000.0 + i, metrics={"reward/score/mean": float(i)}) for i in range(5)]
    spool.write_text("".join(dumps(x) + "\n" for x in [info.to_json(), *(r.to_json() for r in recs)]))
    p = cli("replay", spool, "--to", f"jsonl:{tmp_path / 'out'}", timeout=60)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "/dev/zero" in p.stderr and "not read from the spool" in p.stderr
    out = [json.loads(ln) for ln in (tmp_path / "out" / "s.jsonl").read_text().splitlines()]
    assert [o["metrics"] for o in out if o.get("type") != "run"] == [{"critic/score/mean": float(i)} for i in range(5)]


def test_replay_of_a_damaged_spool_exits_1_and_of_a_killed_one_0(tmp_path):
    info = RunInfo(name="d", project="p", run_id="d", names="canonical")
    lines = [dumps(info.to_json())] + [dumps(Record(i, 1000.0 + i, {"loss/total": float(i)}).to_json())
                                       for i in range(4)]
    damaged = tmp_path / "damaged.jsonl"
    damaged.write_text("\n".join(lines[:3] + ["}{ not json at all", *lines[3:]]) + "\n")
    p = cli("replay", damaged, "--to", f"jsonl:{tmp_path / 'o1'}")
    assert p.returncode == 1 and "damaged.jsonl:4" in p.stderr, p.stderr
    killed = tmp_path / "killed.jsonl"
    killed.write_text("\n".join(lines) + '\n{"step": 4, "wall_ti')       # the partial last line of a SIGKILL
    p = cli("replay", killed, "--to", f"jsonl:{tmp_path / 'o2'}")
    assert p.returncode == 0 and "partial last line" in p.stderr, p.stderr


@pytest.mark.parametrize("writer", WRITERS)
def test_config_int_beyond_a_float_does_not_empty_tensorboard(tmp_path, writer):
    with pytest.warns(LoggerWarning, match="beyond what a float holds"):
        run = trackbridge.init(project="p", name="big", run_id="big", config={"n": 10 ** 400, "lr": 0.1},
                               sinks=[f"tensorboard:{tmp_path / 'tb'}"], spool=str(tmp_path / "spool"),
                               source="canonical", options=trackbridge.LoggerOptions(writer=writer))
        for i in range(5):
            run.log({"loss/total": float(i)}, step=i)
        st = run.finish()
    assert st["sinks"][1]["state"] == "closed" and st["sinks"][1]["failures"] == 0, st
    assert exact(tensorboard_points(tmp_path / "tb"), ["loss/total"], range(5)) is None
    assert sorted(p.name for p in (tmp_path / "tb").iterdir()) == ["big"]
    info = json.loads((tmp_path / "tb" / "big" / "trackbridge-run.json").read_text())
    assert info["config"]["n"] == str(10 ** 400)


def test_event_file_with_a_crafted_length_is_reported_at_file_and_offset(tmp_path):
    """A record whose length field (with a valid CRC) says 2**40 bytes: reported at file:offset, nothing allocated."""
    import struct

    from tensorboard.compat.proto import event_pb2

    from trackbridge.trackers.tensorboard.events import frame, masked_crc32c
    run = tmp_path / "tb" / "run"
    run.mkdir(parents=True)
    ev = event_pb2.Event(wall_time=1.0, step=0, file_version="brain.Event:2").SerializeToString()
    good = event_pb2.Event(wall_time=2.0, step=1)
    good.summary.value.add(tag="loss", simple_value=0.5)
    head = struct.pack("<Q", 2 ** 40)
    path = run / "events.out.tfevents.1.crafted"
    start = len(frame(ev)) + len(frame(good.SerializeToString()))
    path.write_bytes(frame(ev) + frame(good.SerializeToString()) + head + struct.pack("<I", masked_crc32c(head))
                     + b"\0" * 64)
    p = cli("migrate", f"tensorboard:{tmp_path / 'tb'}", f"jsonl:{tmp_path / 'out'}", "--quiet")
    assert p.returncode == 0 or p.returncode == 1, p.stderr[-2000:]
    assert f"{path}:{start}: truncated record (needs {2 ** 40} bytes" in p.stderr + p.stdout, p.stderr[-2000:]
    assert "Traceback" not in p.stderr and "MemoryError" not in p.stderr


def _corrupt_store(tmp_path: Path) -> Path:
    from trackbridge.trackers.mlflow.store import create_sqlite_store
    db = tmp_path / "good.db"
    create_sqlite_store(db)
    data = bytearray(db.read_bytes())
    for off in range(4096, len(data), 4096):      # every page after the first: garbage
        data[off + 8:off + 200] = bytes(range(192))
    bad = tmp_path / "bad.db"
    bad.write_bytes(bytes(data))
    return bad


def test_corrupt_mlflow_store_gives_one_clean_line(tmp_path):
    bad = _corrupt_store(tmp_path)
    for args in (("migrate", f"mlflow:sqlite:///{bad}", f"jsonl:{tmp_path / 'out'}"),
                 ("translate", f"mlflow:sqlite:///{bad}")):
        p = cli(*args)
        assert p.returncode == 2, p.stderr
        line = one_line(p)
        assert str(bad) in line and "sqlalche" not in line and "SQL:" not in p.stderr, line
    with pytest.raises(UsageError, match="not a usable SQLite database"):
        trackbridge.init(sinks=[f"mlflow:sqlite:///{bad}"], spool=str(tmp_path / "spool"))


# -- issue 18, item 9: init judges a location as migrate does, before training ---------------------------------------
@pytest.mark.parametrize("writer", WRITERS)
def test_init_refuses_a_sqlite_file_that_is_not_an_mlflow_store_like_migrate(tmp_path, writer):
    foreign = tmp_path / "foreign.db"
    with sqlite3.connect(foreign) as conn:
        conn.execute("CREATE TABLE mine (x INTEGER)")
        conn.execute("INSERT INTO mine VALUES (1)")
    before = foreign.read_bytes()
    p = cli("migrate", "examples/verl_console.log", f"mlflow:sqlite:///{foreign}")
    assert p.returncode == 2 and "not an MLflow store" in p.stderr, p.stderr
    with pytest.raises(UsageError, match="not an MLflow store") as err:
        trackbridge.init(sinks=[f"mlflow:sqlite:///{foreign}"], spool=str(tmp_path / "spool"),
                         options=trackbridge.LoggerOptions(writer=writer))
    assert str(foreign) in str(err.value)
    assert foreign.read_bytes() == before
    assert not list(tmp_path.glob("spool/*")), "nothing left in the spool folder"


# -- item 13: output folders ------------------------------------------------------------------------------------------
EXAMPLE = ROOT / "examples" / "trl_grpo_trainer_state.json"


def test_compare_never_deletes_through_a_symlinked_folder(tmp_path):
    pytest.importorskip("matplotlib")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim.txt").write_text("mine")
    out = tmp_path / "H"
    out.mkdir()
    (out / "link").symlink_to(outside, target_is_directory=True)
    (out / ".trackbridge-manifest.json").write_text(json.dumps(
        {"command": "compare", "complete": True, "files": ["link/victim.txt", "report.html"], "dirs": ["link"]}))
    p = cli("compare", f"grpo=trainer-state:{EXAMPLE}", "--out", out, "--metrics", "kl/ref/k3")
    assert p.returncode == 0, p.stderr[-2000:]
    assert (outside / "victim.txt").read_text() == "mine"
    assert (out / "link").is_symlink() and (out / "report.html").is_file()


def test_summary_csv_neutralises_formulas(tmp_path):
    """Run names and metric names that start like spreadsheet formulas reach summary.csv as text."""
    pytest.importorskip("matplotlib")
    runs = []
    for name in ('=HYPERLINK("http://example.invalid")', "+1+1"):
        src = tmp_path / f"{name.replace('/', '_')}.jsonl"         # the run's label in the report
        info = RunInfo(name=name, project="p", run_id=f"r{len(runs)}", names="canonical")
        recs = [Record(i, 1000.0 + i, {"@SUM(A1:A9)": float(i), "-2+3": 1.0, "loss/total": 0.5}) for i in range(3)]
        src.write_text("".join(dumps(x) + "\n" for x in [info.to_json(), *(r.to_json() for r in recs)]))
        runs.append(f"jsonl:{src}")
    out = tmp_path / "cmp"
    p = cli("compare", *runs, "--out", out, "--metrics", "@SUM(A1:A9),-2+3,loss/total")
    assert p.returncode in (0, 1), p.stderr[-2000:]
    with open(out / "summary.csv", newline="", encoding="utf-8") as fh:
        cells = [c for row in list(csv.reader(fh))[1:] for c in (row[0], row[1], row[-1])]
    texts = [c for c in cells if c]
    assert texts and not [c for c in texts if c[0] in "=+-@\t\r"], texts
    assert "'@SUM(A1:A9)" in cells and "'-2+3" in cells, cells
    assert any(c.startswith("'=HYPERLINK") for c in cells) and any(c.startswith("'+1+1") for c in cells), cells


def test_csv_text_rule():
    from trackbridge.compare.cells import csv_text
    for bad in ("=1+1", "+1", "-2", "@SUM(1)", "\tx", "\rx", '=HYPERLINK("http://x")'):
        assert csv_text(bad) == "'" + bad
    for ok in ("loss/total", "grpo", "", "1e-3", "a=b"):
        assert csv_text(ok) == ok

