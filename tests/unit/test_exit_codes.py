"""Every command returns the exit codes of ``trackbridge.exitcodes`` (0 ok, 1 done with problems, 2 bad usage or
input, 130 interrupted), each case reached here with cheap inputs: tiny files, the jsonl tracker, and two trackers
defined in this file (one whose writes fail, one that refuses every place). The same failing tracker gives the same
code from ``migrate``, ``replay`` and ``compare --into``."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import trackbridge
from trackbridge import cli
from trackbridge.cli import commands, demo
from trackbridge.exitcodes import ExitCode
from trackbridge.record import Record, RunInfo
from trackbridge.stream import StreamWriter
from trackbridge.tracking.sink import Sink, SinkError

from _support import ROOT

OK, PROBLEMS, USAGE, INTERRUPTED = ExitCode.OK, ExitCode.PROBLEMS, ExitCode.USAGE, ExitCode.INTERRUPTED


class FailingSink(Sink):
    """A tracker that is down: opening the run fails."""

    kind = "failing"

    def open(self, run: RunInfo, *, resume: bool = False) -> None:
        raise SinkError(f"failing:{self.location}: the tracker is down")

    def write(self, records: list[Record]) -> None:
        raise SinkError("the tracker is down")

    def close(self) -> None:
        pass


class RefusingSink(FailingSink):
    """A tracker that refuses every place before anything is written."""

    kind = "refusing"

    @classmethod
    def check_location(cls, location: str) -> None:
        raise SinkError(f"refusing:{location}: not a place this tracker can write to")


@pytest.fixture(autouse=True)
def trackers(monkeypatch, tmp_path):
    monkeypatch.setenv("TRACKBRIDGE_STATE_DIR", str(tmp_path / "state"))
    trackbridge.register_tracker("failing", sink=FailingSink)
    trackbridge.register_tracker("refusing", sink=RefusingSink)
    yield
    trackbridge.unregister_tracker("failing")
    trackbridge.unregister_tracker("refusing")


def _stream(path: Path, metrics: list[dict], run_id: str = "r1") -> Path:
    w = StreamWriter(path)
    w.open(RunInfo(name=run_id, run_id=run_id, names="canonical"))
    w.write([Record(step, 1000.0 + step, m) for step, m in enumerate(metrics)])
    w.close()
    return path


@pytest.fixture
def spool(tmp_path) -> Path:
    return _stream(tmp_path / "spool" / "r1.jsonl", [{"loss/total": 1.0 / (s + 1)} for s in range(4)])


def code(*argv) -> int:
    try:
        return cli.main([str(a) for a in argv])
    except SystemExit as exc:          # argparse
        return exc.code


# -- bad usage: argparse, every command -------------------------------------------------------------------------
@pytest.mark.parametrize("argv", [[], ["nosuchcommand"], ["translate", "--nosuch"], ["detect"], ["mappings", "show"],
                                  ["mappings"], ["migrate", "jsonl:x"], ["replay"], ["compare"],
                                  ["demo", "--nosuch"], ["compare", "jsonl:x", "--x", "furlongs"], ["doctor"],
                                  ["doctor", "jsonl:x", "--fail-on", "never"]])
def test_bad_usage_is_2(argv, capsys):
    assert code(*argv) == USAGE


@pytest.mark.parametrize("command", ["translate", "detect", "mappings", "migrate", "replay", "compare", "demo",
                                     "doctor"])
def test_interrupted_is_130(command, monkeypatch, tmp_path, capsys):
    def interrupted(*_a, **_k):
        raise KeyboardInterrupt
    if hasattr(commands, f"_{command}"):
        monkeypatch.setattr(commands, f"_{command}", interrupted)
    else:
        monkeypatch.setattr(cli, f"cmd_{command}", interrupted)
    argv = {"translate": ["translate", "-"], "detect": ["detect", "x"], "mappings": ["mappings", "list"],
            "migrate": ["migrate", "jsonl:a", "jsonl:b"], "replay": ["replay", "x"], "compare": ["compare", "x"],
            "demo": ["demo", "--out", tmp_path], "doctor": ["doctor", "x"]}[command]
    assert code(*argv) == INTERRUPTED
    assert "interrupted" in capsys.readouterr().err


# -- translate, detect, mappings ----------------------------------------------------------------------------------
def test_translate(tmp_path, capsys):
    good = tmp_path / "good.jsonl"
    good.write_text(json.dumps({"step": 1, "wall_time": 1.0, "metrics": {"loss/total": 1.0}}) + "\n")
    assert code("translate", "--from", "canonical", good) == OK
    unmapped = tmp_path / "unmapped.jsonl"
    unmapped.write_text(json.dumps({"my_key": 1.0}) + "\n")
    assert code("translate", "--from", "canonical", unmapped) == OK
    assert code("translate", "--from", "canonical", "--strict", unmapped) == PROBLEMS
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"loss/total": 1.0}) + "\nnot json\n")
    assert code("translate", "--from", "canonical", bad) == PROBLEMS                    # a line skipped
    assert code("translate", tmp_path / "missing.jsonl") == USAGE
    assert code("translate", "--from", "nosuchframework", good) == USAGE
    assert code("translate", "--config", tmp_path / "missing.json", good) == USAGE


def test_detect(tmp_path, capsys):
    assert code("detect", ROOT / "examples" / "verl_console.log") == OK
    unknown = tmp_path / "unknown.jsonl"
    unknown.write_text(json.dumps({"zz_not_a_metric_anywhere": 1.0}) + "\n")
    assert code("detect", unknown) == PROBLEMS
    assert code("detect", tmp_path / "missing.jsonl") == USAGE


def test_mappings(tmp_path, capsys):
    assert code("mappings", "list") == OK
    assert code("mappings", "show", "loss/total") == OK
    assert code("mappings", "show", "no/such/name") == USAGE
    assert code("mappings", "docs", "--out", tmp_path / "metrics.md") == OK
    assert code("mappings", "lint") == OK
    bad = tmp_path / "bad.yaml"
    bad.write_text("format: trackbridge.mapping/1\nframework: [not, a, name\n")
    assert code("mappings", "lint", bad) == USAGE
    assert code("mappings", "list", "--mappings", bad) == USAGE                         # invalid mapping files


# -- migrate, replay, compare: the same tracker, the same code ----------------------------------------------------
def test_migrate(spool, tmp_path, capsys):
    src = f"jsonl:{spool}"
    assert code("migrate", src, f"jsonl:{tmp_path / 'out'}", "--quiet") == OK
    assert code("migrate", src, f"failing:{tmp_path / 'f'}", "--quiet") == PROBLEMS        # the tracker failed
    junk = tmp_path / "junk.jsonl"
    junk.write_bytes(b"\x00\x01\x02 binary \xff\xfe\n" * 4)
    # nothing readable: bad input (the one input rule), nothing written
    assert code("migrate", f"jsonl:{junk}", f"jsonl:{tmp_path / 'out2'}", "--quiet") == USAGE
    skipped = _stream(tmp_path / "skipped.jsonl", [{"loss/total": 1.0}])
    with open(skipped, "a") as fh:
        fh.write("not json\n")
    assert code("migrate", f"jsonl:{skipped}", f"jsonl:{tmp_path / 'out3'}", "--quiet") == OK
    assert code("migrate", f"jsonl:{skipped}", f"jsonl:{tmp_path / 'out4'}", "--quiet", "--strict") == PROBLEMS
    assert code("migrate", f"jsonl:{tmp_path / 'missing.jsonl'}", f"jsonl:{tmp_path / 'o'}", "--quiet") == USAGE
    assert code("migrate", src, f"nosuchkind:{tmp_path}", "--quiet") == USAGE
    assert code("migrate", src, f"refusing:{tmp_path / 'r'}", "--quiet") == USAGE        # refused up front
    assert code("migrate", src, f"jsonl:{tmp_path / 'o'}", "--names", "nosuchframework", "--quiet") == USAGE


def test_replay(spool, tmp_path, capsys):
    assert code("replay", spool, "--to", f"jsonl:{tmp_path / 'out'}") == OK
    assert code("replay", spool) == OK                          # no pending note: nothing to do
    assert code("replay", spool, "--to", f"failing:{tmp_path / 'f'}") == PROBLEMS
    assert code("replay", tmp_path / "missing.jsonl", "--to", f"jsonl:{tmp_path / 'out'}") == USAGE
    headless = tmp_path / "headless.jsonl"
    headless.write_text(json.dumps({"step": 1, "metrics": {"x": 1.0}}) + "\n")
    assert code("replay", headless, "--to", f"jsonl:{tmp_path / 'out'}") == USAGE          # not a spool
    assert code("replay", spool, "--to", f"nosuchkind:{tmp_path}") == USAGE
    assert code("replay", spool, "--to", f"refusing:{tmp_path / 'r'}") == USAGE
    assert code("replay", spool, "--to", f"jsonl:{tmp_path / 'out'}", "--names", "nosuchframework") == USAGE
    pending = spool.with_name(spool.name + ".pending.json")
    pending.write_text("{not json")
    assert code("replay", spool) == USAGE
    pending.write_text(json.dumps({"run_id": "r1", "sinks": [{"sink": f"failing:{tmp_path / 'f'}"},
                                                           {"sink": f"jsonl:{tmp_path / 'out2'}"}]}))
    assert code("replay", spool) == PROBLEMS                    # one tracker failed, the other was replayed
    assert [e["sink"] for e in json.loads(pending.read_text())["sinks"]] == [f"failing:{tmp_path / 'f'}"]


def test_compare(spool, tmp_path, capsys):
    other = _stream(tmp_path / "b.jsonl", [{"loss/total": 2.0 / (s + 1)} for s in range(4)], run_id="b")
    runs = [f"a=jsonl:{spool}", f"b=jsonl:{other}"]
    assert code("compare", *runs, "--out", tmp_path / "rep") == OK                          # differences: the report
    text_only = _stream(tmp_path / "t.jsonl", [{"note": "hello"}], run_id="t")
    assert code("compare", f"t=jsonl:{text_only}", "--out", tmp_path / "rep2") == PROBLEMS  # nothing to compare
    assert code("compare", *runs, "--into", f"jsonl:{tmp_path / 'into'}") == OK
    assert code("compare", *runs, "--into", f"failing:{tmp_path / 'f'}", "--out", tmp_path / "rep3") == PROBLEMS
    assert (tmp_path / "rep3" / "report.html").is_file()                                   # the report came first
    assert code("compare", f"jsonl:{tmp_path / 'missing.jsonl'}", "--out", tmp_path / "rep4") == USAGE
    assert code("compare", *runs, "--into", f"refusing:{tmp_path / 'r'}") == USAGE
    assert code("compare", *runs, "--into", f"nosuchkind:{tmp_path}") == USAGE


def test_the_same_failing_tracker_gives_the_same_code_everywhere(spool, tmp_path, capsys):
    for dest, want in ((f"failing:{tmp_path / 'f'}", PROBLEMS), (f"refusing:{tmp_path / 'r'}", USAGE)):
        got = {"migrate": code("migrate", f"jsonl:{spool}", dest, "--quiet"),
               "replay": code("replay", spool, "--to", dest),
               "compare": code("compare", f"jsonl:{spool}", "--into", dest)}
        assert got == dict.fromkeys(got, want), (dest, got)


# -- demo ----------------------------------------------------------------------------------------------------------
def test_demo(tmp_path, monkeypatch, capsys):
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "thesis.tex").write_text("mine")
    assert code("demo", "--out", theirs) == USAGE                 # a folder the demo did not make
    monkeypatch.setattr(demo, "_compare", lambda out, locators: (None, None))
    monkeypatch.setattr(demo, "_write_trackers", lambda out: (["written"], [], []))
    assert code("demo", "--out", tmp_path / "demo") == OK
    assert sorted(p.name for p in (tmp_path / "demo" / "canonical").iterdir()) == ["trl-grpo.jsonl", "verl-ppo.jsonl"]
    monkeypatch.setattr(demo, "_write_trackers", lambda out: ([], ["mlflow: run x not written: down"], []))
    assert code("demo", "--out", tmp_path / "demo") == PROBLEMS
    assert "mlflow: run x not written" in capsys.readouterr().err
    assert demo.main(["--out", str(theirs)]) == USAGE              # python -m trackbridge.cli.demo: the same codes
