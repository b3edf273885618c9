"""Selection (issue 34 item 3): runs by a regular expression and metrics by glob for ``migrate``, ``doctor`` and
``trackbridge.read``, applied by the one pipeline every command builds; and ``migrate`` asking for ``--names`` before
it writes canonical names into a destination that holds runs under their framework's own names."""
from __future__ import annotations

import subprocess
import sys

import pytest

import trackbridge

pytest.importorskip("tensorboard")

KEYS = ("actor/pg_loss", "actor/entropy", "critic/score/mean", "response_length/mean")


def _cli(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trackbridge", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=300)


def _tb_runs(tmp_path, names: str = "verl/ppo@0.9.1"):
    """Two runs in one TensorBoard root, written as veRL's own names (what a veRL user's dashboards hold)."""
    tb = tmp_path / "tb"
    for run_id, name in (("a1", "grpo-seed1"), ("b2", "ppo-seed2")):
        run = trackbridge.init(project="p", name=name, run_id=run_id, spool=str(tmp_path / f"spool-{run_id}"),
                               sinks=[f"tensorboard:{tb}"], source="verl/ppo@0.9.1", names=names)
        for step in range(1, 11):
            run.log({k: 0.1 * step + i for i, k in enumerate(KEYS)}, step=step)
        run.finish()
    return tb


def test_migrate_only_the_runs_and_metrics_asked_for(tmp_path):
    tb = _tb_runs(tmp_path)
    out = tmp_path / "out"
    r = _cli("migrate", f"tensorboard:{tb}", f"jsonl:{out}", "--runs", "seed1", "--metrics", "policy/*",
             "--metrics", "reward/*", "--quiet")
    assert r.returncode == 0, r.stderr
    df = trackbridge.read(f"jsonl:{out}").to_pandas()
    assert set(df["run"]) == {"grpo-seed1"}
    assert set(df["key"]) == {"policy/entropy", "reward/score/mean"} and len(df) == 2 * 10
    everything = trackbridge.read(f"tensorboard:{tb}").to_pandas()
    assert {"loss/policy", "policy/entropy"} <= set(everything["key"])    # the source held more: left out, not lost
    r = _cli("migrate", f"tensorboard:{tb}", f"jsonl:{tmp_path / 'none'}", "--runs", "nothing-like-this", "--quiet")
    assert r.returncode == 1 and "no runs found" in r.stderr
    r = _cli("migrate", f"tensorboard:{tb}", f"jsonl:{tmp_path / 'bad'}", "--runs", "(", "--quiet")
    assert r.returncode == 2 and "is not a regular expression" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "bad").exists()


def test_migrate_asks_for_names_before_renaming_into_a_destination_of_framework_names(tmp_path):
    tb = _tb_runs(tmp_path)                             # the destination: runs under veRL's own names
    more = tmp_path / "more.jsonl"
    more.write_text("".join(f'{{"step": {s}, "actor/pg_loss": {0.5 / s}, "critic/score/mean": {0.1 * s}}}\n'
                            for s in range(1, 6)))
    r = _cli("migrate", f"jsonl:{more}", f"tensorboard:{tb}", "--from", "verl/ppo@0.9.1", "--quiet")
    assert r.returncode == 2, r.stderr
    line = r.stderr.strip().splitlines()[-1]
    assert "already holds runs under their framework's own names" in line and "--names keep" in line
    assert len(trackbridge.read(f"tensorboard:{tb}").labels()) == 2          # nothing was written
    r = _cli("migrate", f"jsonl:{more}", f"tensorboard:{tb}", "--from", "verl/ppo@0.9.1", "--names", "keep",
             "--quiet")
    assert r.returncode == 0, r.stderr
    # a destination of canonical runs is no clash: the default goes ahead
    canon = _tb_runs(tmp_path / "c", names="canonical")
    r = _cli("migrate", f"jsonl:{more}", f"tensorboard:{canon}", "--from", "verl/ppo@0.9.1", "--quiet")
    assert r.returncode == 0, r.stderr


def test_doctor_and_read_select_runs(tmp_path):
    tb = _tb_runs(tmp_path)
    r = _cli("doctor", f"tensorboard:{tb}", "--runs", "ppo-", "--json")
    assert r.returncode in (0, 1), r.stderr
    import json
    out = json.loads(r.stdout)                      # one run: its diagnosis; several: a list of them
    assert isinstance(out, dict) and out["run"] == "ppo-seed2" and out["records"] == 10
    r = _cli("doctor", f"tensorboard:{tb}", "--runs", "zzz")
    assert r.returncode == 2 and "no runs found matching --runs 'zzz'" in r.stderr
    assert trackbridge.read(f"tensorboard:{tb}", runs="seed2").labels() == ["ppo-seed2"]


def test_compare_selects_runs(tmp_path):
    tb = _tb_runs(tmp_path)
    from trackbridge.compare import compare_runs
    from trackbridge.read.selection import Selection
    every = compare_runs([f"tensorboard:{tb}"], out=None, doctor=False)
    res = compare_runs([f"tensorboard:{tb}"], out=None, selection=Selection.build(runs="seed2"), doctor=False)
    assert len(every.runs) == 2 and len(res.runs) == 1
    r = _cli("compare", f"tensorboard:{tb}", "--runs", "nope", "--out", str(tmp_path / "rep"))
    assert r.returncode == 2 and "no runs found matching --runs 'nope'" in r.stderr
    assert not (tmp_path / "rep" / "report.html").exists()


def test_runs_selected_by_their_trackers_tags(tmp_path):
    out = tmp_path / "jsonl"
    for run_id, team in (("t1", "rl"), ("t2", "sft"), ("t3", "rl")):
        run = trackbridge.init(project="p", name=f"run-{run_id}", run_id=run_id, spool=str(tmp_path / f"s-{run_id}"),
                               sinks=[f"jsonl:{out}"], source="canonical", tags={"team": team})
        run.log({"loss/total": 1.0}, step=1)
        run.finish()
    assert sorted(trackbridge.read(f"jsonl:{out}", tags={"team": "rl"}).labels()) == ["run-t1", "run-t3"]
    assert len(trackbridge.read(f"jsonl:{out}", tags={"team": ""}).labels()) == 3         # the tag exists
    r = _cli("migrate", f"jsonl:{out}", f"jsonl:{tmp_path / 'rl'}", "--tag", "team=sft", "--quiet")
    assert r.returncode == 0, r.stderr
    assert trackbridge.read(f"jsonl:{tmp_path / 'rl'}").labels() == ["run-t2"]
    r = _cli("doctor", f"jsonl:{out}", "--tag", "team=nobody")
    assert r.returncode == 2 and "no runs found" in r.stderr
    r = _cli("migrate", f"jsonl:{out}", f"jsonl:{tmp_path / 'x'}", "--tag", "=x", "--quiet")
    assert r.returncode == 2 and "--tag '=x': expected KEY=VALUE or KEY" in r.stderr and "Traceback" not in r.stderr


def _dated_runs(root):
    """A TensorBoard root of three runs started on known days, written with TensorBoard's own event writer (the
    wall times a run logged months ago), and a trainer_state.json, which has no wall times at all."""
    import datetime as dt

    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter
    tb = root / "tb"
    for name, start in (("jan", "2026-01-15T08:00:00"), ("jun", "2026-06-01T00:00:00"),
                        ("nov", "2026-11-30T23:00:00")):
        t0 = dt.datetime.fromisoformat(start).replace(tzinfo=dt.timezone.utc).timestamp()
        w = EventFileWriter(str(tb / name))
        for step in range(1, 9):
            v = summary_pb2.Summary.Value(tag="actor/entropy", simple_value=1.0 / step)
            w.add_event(event_pb2.Event(wall_time=t0 + 3600 * (step - 1), step=step,   # on past its first day
                                        summary=summary_pb2.Summary(value=[v])))
        w.close()
    state = root / "trainer_state.json"
    state.write_text('{"log_history": [' + ",".join(f'{{"step": {s}, "loss": {1 / s}, "entropy": 0.5}}'
                                                     for s in range(1, 6)) + "]}")
    return tb, state


def test_runs_selected_by_the_day_they_started(tmp_path):
    tb, state = _dated_runs(tmp_path)
    assert trackbridge.read(f"tensorboard:{tb}").labels() == ["jan", "jun", "nov"]
    assert trackbridge.read(f"tensorboard:{tb}", since="2026-06-01").labels() == ["jun", "nov"]   # inclusive
    assert trackbridge.read(f"tensorboard:{tb}", until="2026-11-30").labels() == ["jan", "jun", "nov"]  # whole day
    assert trackbridge.read(f"tensorboard:{tb}", until="2026-11-30T22:59:59Z").labels() == ["jan", "jun"]
    assert trackbridge.read(f"tensorboard:{tb}", since="2026-06-01T01:00:00+01:00",       # an offset is honoured
                            until="2026-06-01").labels() == ["jun"]
    import datetime as dt
    assert trackbridge.read(f"tensorboard:{tb}", since=dt.date(2026, 2, 1),
                            until=dt.datetime(2026, 7, 1)).labels() == ["jun"]
    # the selection reads only a run's first record to date it; what is read of a selected run is all of it
    df = trackbridge.read(f"tensorboard:{tb}", since="2026-11-01").to_pandas()
    assert set(df["run"]) == {"nov"} and len(df) == 8
    # a run that cannot be dated is left out and named, never guessed in
    with pytest.raises(trackbridge.TrackBridgeError, match="no wall times of its own, so it cannot be dated"):
        trackbridge.read(str(state), since="2020-01-01").labels()
    assert len(trackbridge.read(str(state)).labels()) == 1          # without dates asked for it is read


def test_every_command_selects_by_date(tmp_path):
    tb, state = _dated_runs(tmp_path)
    out = tmp_path / "out"
    r = _cli("migrate", f"tensorboard:{tb}", f"jsonl:{out}", "--since", "2026-06-01", "--until", "2026-06-30",
             "--quiet")
    assert r.returncode == 0, r.stderr
    assert trackbridge.read(f"jsonl:{out}").labels() == ["jun"]
    r = _cli("migrate", f"tensorboard:{tb}", f"jsonl:{tmp_path / 'none'}", "--since", "2026-12-01", "--quiet")
    assert r.returncode == 1 and "no runs found" in r.stderr and "started since 2026-12-01T00:00:00Z" in r.stderr
    assert not (tmp_path / "none").exists()
    r = _cli("doctor", f"tensorboard:{tb}", "--until", "2026-02-01", "--json")
    assert r.returncode in (0, 1), r.stderr
    import json
    assert json.loads(r.stdout)["run"] == "jan"
    r = _cli("compare", f"tensorboard:{tb}", "--since", "2026-06-01", "--out", str(tmp_path / "rep"))
    assert r.returncode == 0, r.stderr
    assert "jun" in r.stderr and "nov" in r.stderr and "/jan" not in r.stderr
    # a run with no wall times: said in one line, and nothing else is made of it
    r = _cli("doctor", str(state), "--since", "2026-01-01")
    assert r.returncode == 2 and "left out" in r.stderr and "cannot be dated" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_bad_dates_are_one_line_errors(tmp_path):
    tb, _ = _dated_runs(tmp_path)
    for args, said in ((["--since", "last tuesday"], "--since 'last tuesday': expected a date"),
                       (["--until", "2026-13-01"], "--until '2026-13-01': expected a date"),
                       (["--since", "2026-06-02", "--until", "2026-06-01"], "is before --since")):
        r = _cli("migrate", f"tensorboard:{tb}", f"jsonl:{tmp_path / 'x'}", *args, "--quiet")
        assert r.returncode == 2 and said in r.stderr, (args, r.stderr)
        assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "x").exists()
    with pytest.raises(trackbridge.TrackBridgeError, match="read: since='soon'"):
        trackbridge.read(f"tensorboard:{tb}", since="soon")


def test_a_duration_counts_back_from_now(tmp_path):
    import time

    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter
    tb = tmp_path / "tb"
    w = EventFileWriter(str(tb / "ten-days-ago"))                 # a run started ten days before now
    v = summary_pb2.Summary.Value(tag="actor/entropy", simple_value=0.9)
    w.add_event(event_pb2.Event(wall_time=time.time() - 10 * 86400, step=1, summary=summary_pb2.Summary(value=[v])))
    w.close()
    run = trackbridge.init(project="p", name="today", run_id="today", spool=str(tmp_path / "spool"),
                           sinks=[f"tensorboard:{tb}/today"], source="verl/ppo@0.9.1")
    run.log({"actor/entropy": 0.7}, step=1)
    run.finish()
    assert trackbridge.read(f"tensorboard:{tb}").labels() == ["ten-days-ago", "today"]
    assert trackbridge.read(f"tensorboard:{tb}", since="2d").labels() == ["today"]
    assert trackbridge.read(f"tensorboard:{tb}", since="2w").labels() == ["ten-days-ago", "today"]
    assert trackbridge.read(f"tensorboard:{tb}", until="1d").labels() == ["ten-days-ago"]
