"""Issue 31: with ``merge_ranks=True``, the steps merged without a rank (``info.extra["ranks"]["incomplete"]``) are
learnt while the run logs; every tracker stores them with the run when it closes. The jsonl sink's and the spool's
headers, written when the run opened, said ``incomplete: []``: both now end with a closing header (the run info as
it stands at the end), which the stream's readers take as the run info. Checked against TensorBoard's run info file
and SwanLab's config of the same run, in both writer modes, with a second rank that dies after step 1 (a real
process, ``os._exit``)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

import trackbridge
from trackbridge.logger import LoggerWarning
from trackbridge.stream import read_stream, scan_stream
from trackbridge.trackers import open_source

from _support import ROOT
from _support.tracker_files import swanlab_points

STEPS = 5
DIES_AFTER = 1          # rank 1 logs steps 0 and 1, then its process ends without finish()

RANK1 = textwrap.dedent("""
    import os, sys, time
    import trackbridge
    run = trackbridge.init(project="ranks", run_id="job", merge_ranks=True,
                           spool=sys.argv[1], source="canonical",
                           options=trackbridge.LoggerOptions(rank=1, world_size=2, flush_interval=0.2))
    for step in range(int(sys.argv[2]) + 1):
        run.log({"reward/score/mean": 1.0 + step}, step=step, weights={"reward/score/mean": 3})
    time.sleep(1.0)          # its rank file is written every flush_interval
    os._exit(0)              # dies: no finish(), no end line
""")


@pytest.mark.parametrize("writer", ["thread", "process"])
def test_the_stream_headers_list_the_steps_merged_without_a_rank(tmp_path, writer):
    spool = tmp_path / "spool"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    p = subprocess.run([sys.executable, "-c", RANK1, str(spool), str(DIES_AFTER)], env=env, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    sinks = [f"jsonl:{tmp_path / 'jl'}", f"tensorboard:{tmp_path / 'tb'}", f"swanlab:{tmp_path / 'sw'}"]
    with pytest.warns(LoggerWarning):
        run = trackbridge.init(project="ranks", run_id="job", sinks=sinks, merge_ranks=True,
                               options=trackbridge.LoggerOptions(rank=0, world_size=2, rank_timeout=2.0, writer=writer),
                               spool=str(spool), source="canonical")
        for step in range(STEPS):
            run.log({"reward/score/mean": 2.0 + step}, step=step, weights={"reward/score/mean": 1})
        st = run.finish()
    assert [s["state"] for s in st["sinks"]] == ["closed"] * 4, run.summary()

    # the other trackers' list, read from their own files
    (tb_file,) = (tmp_path / "tb").rglob("trackbridge-run.json")
    expected = json.loads(tb_file.read_text())["extra"]["ranks"]["incomplete"]
    assert [row["step"] for row in expected] == list(range(DIES_AFTER + 1, STEPS))
    assert all(row["missing"] == [1] for row in expected)
    _points, sw_config, _raw = swanlab_points(tmp_path / "sw")
    assert sw_config["_trackbridge"]["extra"]["ranks"]["incomplete"] == expected

    for path in (spool / "job.jsonl", tmp_path / "jl" / "job.jsonl"):
        lines = [json.loads(x) for x in path.read_text().splitlines()]
        heads = [i for i, x in enumerate(lines) if x.get("type") == "run"]
        # the header at the start (written when nothing was known yet), the closing header at the end
        assert heads == [0, len(lines) - 1], (path, heads)
        assert (lines[0]["extra"].get("ranks") or {}).get("incomplete", []) == []
        assert lines[-1]["extra"]["ranks"]["incomplete"] == expected, path
        # every reader of the stream takes it: the scan (replay, resume) and the jsonl source (migrate, read)
        assert scan_stream(path).info.extra["ranks"]["incomplete"] == expected
        (reader,) = list(open_source(f"jsonl:{path}").runs())
        assert reader.info.extra["ranks"]["incomplete"] == expected
        assert "merged over 1 of 2 ranks" in reader.info.approximate["reward/score/mean"]
        # and the records are as many as before: a header is not a record
        assert [r.step for _s, r in read_stream(path)] == list(range(STEPS))


def test_a_run_that_learnt_nothing_keeps_one_header(tmp_path):
    """Without merged ranks nothing is learnt: one header, as before."""
    run = trackbridge.init(project="p", run_id="plain", sinks=[f"jsonl:{tmp_path / 'jl'}"], spool=str(tmp_path / "s"),
                           source="canonical", options=trackbridge.LoggerOptions(writer="thread"))
    run.log({"loss/total": 1.0}, step=0)
    run.finish()
    for path in (tmp_path / "s" / "plain.jsonl", tmp_path / "jl" / "plain.jsonl"):
        lines = [json.loads(x) for x in path.read_text().splitlines()]
        assert [x.get("type") for x in lines] == ["run", None], path
