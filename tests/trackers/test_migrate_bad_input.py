"""Damaged and missing input, through the CLI (``python -m trackbridge migrate``): everything valid is migrated,
what was skipped is reported with file and offset or line, the exit code is non-zero only with ``--strict`` (or
when there is nothing to read at all), and no partial point reaches the target.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from trackbridge.record import Record, RunInfo

from test_migrate_support import location, read_runs, run_cli, same_value, write_run


def _records(n: int, keys=("loss", "reward", "kl")) -> list[Record]:
    return [Record(step=i, wall_time=1763700000.0 + i, metrics={k: float(i) + j / 4 for j, k in enumerate(keys)})
            for i in range(n)]


def _by_step(loc: str) -> dict[int, dict]:
    (info, recs, _), = read_runs(loc)
    out = {}
    for r in recs:
        assert r.step not in out
        out[r.step] = r.metrics
    return out


def _check_whole(got: dict[int, dict], original: list[Record]) -> None:
    """Every migrated record is an original record in full (never a partial point)."""
    orig = {r.step: r.metrics for r in original}
    for step, metrics in got.items():
        assert set(metrics) == set(orig[step]), f"step {step}: partial record {sorted(metrics)}"
        for k, v in metrics.items():
            assert same_value(v, orig[step][k])


def _ok_then_strict(src: str, tmp: Path, *extra: str) -> tuple[str, str]:
    """Migrate without and with --strict (into two targets); returns (destination of the first, its stderr)."""
    dst = f"jsonl:{tmp / 'out'}"
    p = run_cli("migrate", src, dst, "--names", "keep", "--quiet", *extra)
    assert p.returncode == 0, p.stderr
    assert "Traceback" not in p.stderr
    q = run_cli("migrate", src, f"jsonl:{tmp / 'out-strict'}", "--names", "keep", "--quiet", "--strict", *extra)
    assert q.returncode == 1, q.stderr
    assert "Traceback" not in q.stderr
    return dst, p.stderr


# -- TensorBoard ----------------------------------------------------------------------------------------------
def _tb_offsets(path: Path) -> list[int]:
    from trackbridge.trackers.tensorboard.events import read_event_records
    return [off for off, _ in read_event_records(path, None)]


def test_tensorboard_bad_crcs_and_cut_off_record(env):
    recs = _records(12)
    write_run(f"tensorboard:{env / 'tb'}", RunInfo(name="run", run_id="r"), recs)
    (path,) = list((env / "tb" / "run").glob("*tfevents*"))
    offs = _tb_offsets(path)           # [file_version, run info, record 0, ..., record 11]
    assert len(offs) == 14
    data = bytearray(path.read_bytes())
    bad_data = offs[2 + 3]             # record of step 3: one byte of its Event changed -> bad data CRC
    data[bad_data + 12 + 5] ^= 0xFF
    bad_len = offs[2 + 6]              # record of step 6: its length field changed -> bad length CRC
    data[bad_len] ^= 0x01
    cut = offs[2 + 11]                 # record of step 11 cut off in the middle
    data = data[:cut + 20]
    path.write_bytes(bytes(data))

    dst, err = _ok_then_strict(f"tensorboard:{env / 'tb'}", env)
    assert f"{path}:{bad_data}" in err and "bad data CRC" in err
    assert f"{path}:{bad_len}" in err and "bad length CRC" in err
    assert f"{path}:{cut}" in err and "truncated" in err
    got = _by_step(dst)
    assert sorted(got) == [0, 1, 2, 4, 5, 7, 8, 9, 10]
    _check_whole(got, recs)


# -- wandb ----------------------------------------------------------------------------------------------------
def test_wandb_file_cut_off_mid_write(env):
    recs = _records(300, keys=tuple(f"metric_{i}" for i in range(20)))
    write_run(f"wandb:{env / 'wb'}", RunInfo(name="run", run_id="wbcut01"), recs)
    (path,) = list((env / "wb").rglob("run-wbcut01.wandb"))
    size = path.stat().st_size
    with open(path, "r+b") as fh:       # cut in the middle of a block, as a crash would leave it
        fh.truncate(size * 2 // 3 + 13)

    dst, err = _ok_then_strict(f"wandb:{env / 'wb'}", env)
    m = re.search(re.escape(str(path)) + r":(\d+)", err)
    assert m, err
    got = _by_step(dst)
    assert 50 < len(got) < 300
    assert sorted(got) == list(range(len(got))), "a prefix of the run is kept"
    _check_whole(got, recs)


# -- CSV ------------------------------------------------------------------------------------------------------
def test_csv_missing_cells_and_ragged_rows(env):
    f = env / "export.csv"
    f.write_text("_step,train/loss,train/reward\n"
                 "0,0.5,1.0\n"
                 "1,,1.5\n"               # missing cell: not logged in that row (not NaN)
                 "2,0.25,\n"
                 "3,0.125\n"              # a row with a cell too few: skipped, reported with its line
                 "4,0.0625,2.5,9\n"       # a cell too many
                 "5,0.03125,3.0\n"
                 "6,0.0")                 # cut off while writing
    dst, err = _ok_then_strict(f"csv:{f}", env)
    assert f"{f}:5" in err and f"{f}:6" in err and f"{f}:8" in err, err
    got = _by_step(dst)
    assert got == {0: {"train/loss": 0.5, "train/reward": 1.0}, 1: {"train/reward": 1.5}, 2: {"train/loss": 0.25},
                   5: {"train/loss": 0.03125, "train/reward": 3.0}}


# -- console --------------------------------------------------------------------------------------------------
def test_console_log_with_garbage_lines(env):
    f = env / "train.log"
    f.write_text("Training Progress:   0%|          | 0/10\n"
                 "step:1 - actor/pg_loss:0.5 - critic/score/mean:0.25\n"
                 "\x00\x01\x02 binary garbage \xff\n"
                 "step:2 - actor/pg_loss:0.375 - critic/score/mean:oops\n"      # unreadable value: line skipped
                 "WARNING something happened\n"
                 "step:3 - actor/pg_loss:0.125 - critic/score/mean:0.75\n"
                 "step:4 - actor/pg_loss:0.0625 - critic/sc")                       # cut off: skipped whole
    dst, err = _ok_then_strict(f"console:{f}", env)
    assert f"{f}:4" in err and f"{f}:7" in err, err
    got = _by_step(dst)
    assert got == {1: {"actor/pg_loss": 0.5, "critic/score/mean": 0.25},
                   3: {"actor/pg_loss": 0.125, "critic/score/mean": 0.75}}


# -- missing and unreadable sources ---------------------------------------------------------------------------
def test_missing_mlflow_run_and_experiment(env):
    loc = location("mlflow", env / "ml", experiment="proj")
    write_run(loc, RunInfo(name="run", project="proj", run_id="r"), _records(3))
    db = loc.split("?")[0]
    for src, what in [(f"{db}?run=0123456789abcdef0123456789abcdef", "0123456789abcdef0123456789abcdef"),
                      (f"{db}?experiment=nope", "nope"),
                      (f"{db}?experiment=proj&name=nobody", "nobody")]:
        p = run_cli("migrate", src, f"jsonl:{env / 'out'}", "--quiet")
        assert p.returncode != 0, (src, p.stderr)
        assert "Traceback" not in p.stderr, p.stderr
        assert what in p.stderr, p.stderr
    assert not (env / "out").exists() or not any((env / "out").iterdir())


@pytest.mark.parametrize("kind", ["tensorboard", "wandb", "mlflow", "trackio", "jsonl", "csv", "trainer-state",
                                  "console"])
def test_nonexistent_path(env, kind):
    missing = env / "no" / "such" / ("file.db" if kind == "mlflow" else "place")
    p = run_cli("migrate", f"{kind}:{missing}", f"jsonl:{env / 'out'}", "--quiet")
    assert p.returncode != 0, p.stderr
    assert "Traceback" not in p.stderr, p.stderr
    assert str(missing) in p.stderr or "no run" in p.stderr, p.stderr
    if kind == "mlflow":
        assert not missing.exists(), "reading a missing MLflow store must not create it"


def test_directory_where_a_file_is_expected(env):
    (env / "dir").mkdir()
    p = run_cli("migrate", f"trainer-state:{env / 'dir'}", f"jsonl:{env / 'out'}", "--quiet")
    assert p.returncode != 0 and "Traceback" not in p.stderr, p.stderr


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root reads files whatever their mode")
def test_unreadable_file_in_a_multi_run_source(env):
    recs = _records(4)
    for name in ("a", "b"):
        write_run(f"jsonl:{env / 'runs'}", RunInfo(name=name, run_id=name), recs)
    (env / "runs" / "b.jsonl").chmod(0)
    try:
        p = run_cli("migrate", f"jsonl:{env / 'runs'}", f"jsonl:{env / 'out'}", "--quiet")
    finally:
        (env / "runs" / "b.jsonl").chmod(0o644)
    assert "Traceback" not in p.stderr
    assert "b.jsonl" in p.stderr
    assert len(read_runs(f"jsonl:{env / 'out'}")) >= 1
