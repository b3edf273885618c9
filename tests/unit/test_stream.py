"""The canonical stream has one writer and one reader (``trackbridge.stream``), stamped with the canonical schema.

* the header line carries ``schema: canonical@<version>``, the version of the mapping files in use (read through the
  registry); streams without the stamp are read as they are; a stream stamped with an older canonical version is read
  under today's names (the ``versions:`` renames of ``canonical.yaml``), by every reader;
* the last step is the highest step, for the jsonl sink, the spool scan and the stream alike;
* a partial last line is skipped by every reader and ended before a resumed writer appends;
* the tail reader (the writer process) numbers records as the file reader does;
* the logger's spool is written by the stream's writer, not by a tracker; no other module parses stream lines.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import trackbridge
from trackbridge import stream
from trackbridge.errors import UsageError
from trackbridge.record import Record, RunInfo
from trackbridge.schema.loader import load_registry
from trackbridge.sync.replay import iter_spool, scan_spool
from trackbridge.trackers import make_sink, open_source

PKG = Path(trackbridge.__file__).parent


def _current() -> str:
    return load_registry().canonical.version


def _old_version() -> str:
    """The oldest canonical version that a later version renamed names of (1.0.0 today)."""
    canon = load_registry().canonical
    versions = [v for v, _ in canon.renames]
    assert len(versions) >= 2, "canonical.yaml lists no older version"
    return versions[0]


def _write(path: Path, header: dict | None, rows: list[dict], tail: str = "") -> Path:
    lines = ([json.dumps(header)] if header is not None else []) + [json.dumps(r) for r in rows]
    path.write_text("\n".join(lines) + "\n" + tail)
    return path


def _old_stream(path: Path) -> tuple[Path, dict[str, str]]:
    """A stream stamped with the old version, holding names the next version renamed (and a split variant)."""
    canon = load_registry().canonical
    renames = {old: canon.upgrade(old) for _v, ren in canon.renames for old in ren}
    renames = {old: new for old, new in renames.items() if old != new and canon.find(old) is None}
    assert renames, "no rename in versions:"
    old, new = sorted(renames.items())[0]
    header = {"type": "run", "format": "trackbridge.stream/1", "schema": f"canonical@{_old_version()}",
              "name": "old", "run_id": "old", "names": "canonical"}
    rows = [{"step": s, "wall_time": 1.0 + s, "metrics": {old: 0.1 * s, f"eval/{old}": 0.2 * s, "loss/total": 1.0},
             "derived": [old]} for s in range(3)]
    return _write(path, header, rows), {old: new, f"eval/{old}": f"eval/{new}", "loss/total": "loss/total"}


# -- the stamp ----------------------------------------------------------------------------------------------------
def test_header_is_stamped_with_the_registry_version(tmp_path):
    sink = make_sink(f"jsonl:{tmp_path}")
    sink.open(RunInfo(name="r", run_id="r1", names="canonical"))
    sink.write([Record(0, 1.0, {"loss/total": 1.0})])
    sink.close()
    header = json.loads((tmp_path / "r1.jsonl").read_text().splitlines()[0])
    assert header["type"] == "run" and header["schema"] == f"canonical@{_current()}"
    assert stream.schema_stamp() == f"canonical@{_current()}"
    assert scan_spool(tmp_path / "r1.jsonl").schema == f"canonical@{_current()}"


def test_the_stamp_follows_the_mapping_files(tmp_path, monkeypatch):
    """The version comes from canonical.yaml through the registry: another mappings folder, another stamp."""
    import shutil

    from trackbridge.schema import loader
    src = loader.shipped_files()[0].parent
    alt = tmp_path / "mappings"
    shutil.copytree(src, alt)
    text = (alt / "canonical.yaml").read_text()
    version = re.search(r"^schema_version:\s*(\S+)", text, flags=re.M).group(1)
    bumped = version + ".post1"
    text = text.replace(f"schema_version: {version}", f"schema_version: {bumped}", 1)
    text = text.replace("versions:\n", f"versions:\n  {bumped}: {{}}\n", 1)
    (alt / "canonical.yaml").write_text(text)
    monkeypatch.setenv("TRACKBRIDGE_MAPPINGS_DIR", str(alt))
    monkeypatch.setenv("TRACKBRIDGE_NO_CACHE", "1")
    loader._load_cached.cache_clear()
    try:
        assert stream.schema_stamp() == f"canonical@{bumped}"
    finally:
        loader._load_cached.cache_clear()


def test_a_stream_without_the_stamp_is_read_as_it_is(tmp_path):
    header = {"type": "run", "format": "trackbridge.stream/1", "name": "n", "run_id": "n", "names": "canonical"}
    path = _write(tmp_path / "n.jsonl", header, [{"step": 1, "wall_time": 2.0, "metrics": {"kl/ref": 0.5}}])
    assert [r.metrics for _s, r in stream.read_stream(path)] == [{"kl/ref": 0.5}]
    (reader,) = list(open_source(f"jsonl:{path}").runs())
    assert [r.metrics for r in reader.records()] == [{"kl/ref": 0.5}]
    assert scan_spool(path).schema is None and scan_spool(path).records == 1


def test_an_old_stream_is_read_under_todays_names_by_every_reader(tmp_path):
    path, names = _old_stream(tmp_path / "old.jsonl")
    want = [{names[k]: v for k, v in m.items()} for m in
            [json.loads(line)["metrics"] for line in path.read_text().splitlines()[1:]]]
    assert [r.metrics for _s, r in iter_spool(path)] == want                       # replay, resume, catch-up
    assert [r.derived for _s, r in stream.read_stream(path)][0] == [next(iter(names.values()))]
    (reader,) = list(open_source(f"jsonl:{path}").runs())                             # migrate, compare
    assert [r.metrics for r in reader.records()] == want
    cursor = stream.StreamCursor()                                                   # a tracker catching up
    assert [r.metrics for _s, r in stream.read_stream(path, cursor=cursor)] == want
    held = make_sink(f"jsonl:{tmp_path}")                                            # what the jsonl sink holds
    held.open(RunInfo(run_id="old", names="canonical"), resume=True)
    h = held.held()
    held.close()
    assert sorted(h.keys()) == sorted(set(names.values()))


def test_old_names_are_upgraded_only_in_canonical_streams(tmp_path):
    path, names = _old_stream(tmp_path / "old.jsonl")
    text = path.read_text().replace('"names": "canonical"', '"names": "raw"', 1)
    path.write_text(text)
    got = [r.metrics for _s, r in stream.read_stream(path)][0]
    assert set(got) == set(names)                      # stored names kept: they are not canonical names


def test_resuming_an_old_stream_stamps_what_follows(tmp_path):
    path, names = _old_stream(tmp_path / "old.jsonl")
    new = names[next(iter(names))]
    w = stream.StreamWriter(path)
    w.open(RunInfo(name="old", run_id="old", names="canonical"), resume=True)
    w.write([Record(3, 4.0, {new: 0.3})])
    w.close()
    headers = [json.loads(line) for line in path.read_text().splitlines() if '"type": "run"' in line
               or '"type":"run"' in line]
    assert [h["schema"] for h in headers] == [f"canonical@{_old_version()}", f"canonical@{_current()}"]
    recs = [r for _s, r in iter_spool(path)]
    assert len(recs) == 4 and all(set(r.metrics) <= set(names.values()) for r in recs)
    w = stream.StreamWriter(path)                      # resumed again under the same schema: no new header
    w.open(RunInfo(name="old", run_id="old", names="canonical"), resume=True)
    w.close()
    assert path.read_text().count('"type":"run"') == 1


# -- one definition of the last step ------------------------------------------------------------------------------
def test_the_last_step_is_the_highest_step_everywhere(tmp_path):
    sink = make_sink(f"jsonl:{tmp_path}")
    sink.open(RunInfo(run_id="r"))
    sink.write([Record(s, float(s), {"x": 1.0}) for s in (5, 9, 2)])     # steps go back at the end
    assert sink.last_step() == 9
    sink.close()
    path = tmp_path / "r.jsonl"
    assert stream.last_step(path) == 9 and scan_spool(path).last_step == 9 and stream.scan_stream(path).records == 3


# -- damage and numbering -----------------------------------------------------------------------------------------
def test_partial_line_skipped_then_ended_on_resume(tmp_path):
    path = tmp_path / "r.jsonl"
    header = {"type": "run", "format": "trackbridge.stream/1", "run_id": "r", "names": "canonical"}
    _write(path, header, [{"step": s, "wall_time": 1.0, "metrics": {"x": s}} for s in range(3)],
           tail='{"step": 3, "wall_ti')
    problems: list[str] = []
    assert [s for s, _r in stream.read_stream(path, problems=problems)] == [0, 1, 2]
    assert len(problems) == 1 and "partial last line" in problems[0] and f"{path}:5" in problems[0]
    assert not scan_spool(path).ends_with_newline
    w = stream.StreamWriter(path)
    w.open(RunInfo(run_id="r", names="canonical"), resume=True)
    w.write([Record(3, 2.0, {"x": 3})])
    w.close()
    problems = []
    got = [(s, r.step) for s, r in stream.read_stream(path, problems=problems)]
    assert got == [(0, 0), (1, 1), (2, 2), (3, 3)]          # the cut line is skipped, the new one is whole
    assert len(problems) == 1 and "not a JSON object" in problems[0] and f"{path}:5" in problems[0]


def test_reads_from_a_cursor_number_records_as_a_fresh_read(tmp_path):
    """A tracker catching up reads on from where it stopped (a StreamCursor): the same record numbers as a read from
    the file's start, across damage between records and a record completed between two reads."""
    path = tmp_path / "r.jsonl"
    w = stream.StreamWriter(path)
    w.open(RunInfo(run_id="r", names="canonical"))
    w.write([Record(s, 1.0, {"x": float(s)}) for s in range(3)])
    with open(path, "ab") as fh:                       # damage between records, and a record cut mid-write
        fh.write(b"not json\n[1, 2]\n")
    w.write([Record(s, 1.0, {"x": float(s)}) for s in range(3, 5)])
    with open(path, "ab") as fh:
        fh.write(b'{"step": 5, "wall_time": 1.0, "metr')
    cursor = stream.StreamCursor()
    first = list(stream.read_stream(path, start=2, cursor=cursor))
    with open(path, "ab") as fh:
        fh.write(b'ics": {"x": 5.0}}\n')
    second = list(stream.read_stream(path, start=first[-1][0] + 1, cursor=cursor))
    w.close()
    from_file = [(s, r.step) for s, r in stream.read_stream(path)]
    assert from_file == [(0, 0), (1, 1), (2, 2), (3, 3), (4, 4), (5, 5)]
    assert [(s, r.step) for s, r in first + second] == from_file[2:]
    assert [(s, r.step) for s, r in stream.read_stream(path, start=3, stop=5, cursor=cursor)] == from_file[3:5]
    assert [(s, r.step) for s, r in stream.read_stream(path, start=1, stop=2, cursor=cursor)] == from_file[1:2]


WRITE_WHOLE = r"""
import resource, signal, sys
from trackbridge import stream
from trackbridge.record import Record, RunInfo
path, limit = sys.argv[1], int(sys.argv[2])
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)         # a write past the limit fails with EFBIG instead
w = stream.StreamWriter(path)
w.open(RunInfo(run_id="r", names="canonical"))
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
batch, failed = [], 0
for s in range(200):
    batch.append(Record(s, 1.0, {"x": float(s), "pad": "p" * 40}))
    if len(batch) >= 7:
        try:
            w.write(batch)
            batch = []
        except OSError:
            failed += 1
            if failed == 3:                            # the disk has room again: the same batch, retried
                resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
if batch:
    w.write(batch)
w.close()
print(failed)
"""


def test_a_write_cut_short_is_taken_back_whole(tmp_path):
    """A batch the file takes only in part (the file-size limit, as a full disk would) is cut back to where it
    started: retried, every record is in the file exactly once and no line is torn."""
    import subprocess
    import sys

    from _support import ROOT
    script = tmp_path / "w.py"
    script.write_text(WRITE_WHOLE)
    path = tmp_path / "r.jsonl"
    r = subprocess.run([sys.executable, str(script), str(path), "4000"], capture_output=True, text=True,
                       timeout=120, env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr
    assert int(r.stdout) == 3, "the limit was not met"
    problems: list[str] = []
    assert [rec.step for _s, rec in stream.read_stream(path, problems=problems)] == list(range(200))
    assert problems == []


def test_values_that_are_not_json_are_left_out_and_reported(tmp_path):
    rejected = []
    w = stream.StreamWriter(tmp_path / "r.jsonl", reject=lambda k, s, why: rejected.append((k, s)))
    w.open(RunInfo(run_id="r"))
    w.write([Record(1, 1.0, {"ok": 1.0, "bad\ud800": 2.0, "obj": object()})])
    w.close()
    (rec,) = [r for _s, r in stream.read_stream(tmp_path / "r.jsonl")]
    assert rec.metrics == {"ok": 1.0}
    assert sorted(k for k, _s in rejected) == sorted(["bad\\ud800", "obj"])


def test_fsync_forces_every_batch(tmp_path, monkeypatch):
    import os
    calls = []
    monkeypatch.setattr(os, "fsync", lambda fd: calls.append(fd))
    w = stream.StreamWriter(tmp_path / "r.jsonl", fsync=True)
    w.open(RunInfo(run_id="r"))
    w.write([Record(1, 1.0, {"x": 1.0})])
    w.close()
    assert len(calls) >= 2
    calls.clear()
    w = stream.StreamWriter(tmp_path / "s.jsonl")
    w.open(RunInfo(run_id="s"))
    w.write([Record(1, 1.0, {"x": 1.0})])
    w.close()
    assert calls == []


def test_a_new_stream_refuses_an_existing_file(tmp_path):
    w = stream.StreamWriter(tmp_path / "r.jsonl")
    w.open(RunInfo(run_id="r"))
    w.close()
    with pytest.raises(FileExistsError):
        stream.StreamWriter(tmp_path / "r.jsonl").open(RunInfo(run_id="r"))


# -- the spool is the stream's own writer ---------------------------------------------------------------------------
def test_the_spool_is_written_by_the_stream_writer(tmp_path):
    run = trackbridge.init(project="p", run_id="s1", spool=f"{tmp_path / 'spool'}?fsync=1", source="canonical",
                           sinks=[f"jsonl:{tmp_path / 'spool'}"])          # the spool itself: left out
    run.log({"loss/total": 1.0}, step=3)
    run.log({"loss/total": 0.5}, step=1)
    st = run.finish()
    assert [s["sink"] for s in st["sinks"]] == [f"spool:{tmp_path / 'spool' / 's1.jsonl'}"]
    assert st["sinks"][0]["spool"] is True and st["sinks"][0]["state"] == "closed"
    scan = scan_spool(run.spool_path)
    assert scan.schema == f"canonical@{_current()}" and scan.records == 2 and scan.last_step == 3
    from trackbridge.logger.run import Run
    assert run._spool_worker.sink.fsync and isinstance(run, Run)


def test_the_spool_takes_only_fsync(tmp_path):
    with pytest.raises(UsageError, match="unknown option"):
        trackbridge.init(run_id="x", spool=f"{tmp_path}?fsink=1")


# Modules outside trackbridge/stream.py that still tell a header line themselves, each with the reason; the test fails
# for any other (and for an entry here that no longer applies).
KNOWN: dict[str, str] = {}


def test_no_other_module_parses_stream_lines():
    """What a header line is (``"type": "run"``) is known in trackbridge/stream/ only."""
    pattern = re.compile(r"""(["']type["']\)?\s*==\s*["']run["'])|(\.get\(["']type["']\)\s*==)""")
    found: dict[str, list[str]] = {}
    for path in sorted(PKG.rglob("*.py")):
        if (PKG / "stream") in path.parents:
            continue
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if pattern.search(line):
                found.setdefault(str(path.relative_to(PKG)), []).append(f"{n}: {line.strip()}")
    assert {k: v for k, v in found.items() if k not in KNOWN} == {}
    assert sorted(k for k in KNOWN if k not in found) == [], "drop the entries that no longer apply"
