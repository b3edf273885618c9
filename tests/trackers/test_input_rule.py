"""One rule for inputs (issue 31), through the real CLI: a source that is not a regular file, is empty, is not what
its name says, or yields nothing readable is an error naming the file -- rc 2, one line, no traceback -- and no
destination run is created, with or without ``--strict``; ``compare`` writes no report for it.

Each case used to give rc 0 and an empty run in the destination: an event file that is a symlink to ``/dev/zero``
or a FIFO, a ClearML ``metrics.jsonl`` linked to ``/dev/zero``, an SQLite file named ``trainer_state.json``, text
named ``.parquet``, a PNG named ``.wandb``, an empty file; ``compare`` on an empty or binary input wrote an empty
report.
"""
from __future__ import annotations

import os
import shutil
import sqlite3
from pathlib import Path

import pytest

from _support import ROOT
from test_migrate_support import run_cli

PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x01\x00\x00\x00\x01\x08\x02\x00\x00\x00\x90wS\xde"


def _tensorboard_link_to_zero(root: Path) -> tuple[str, Path]:
    (root / "tb" / "run").mkdir(parents=True)
    bad = root / "tb" / "run" / "events.out.tfevents.1763700000.host.1.0"
    os.symlink("/dev/zero", bad)
    return f"tensorboard:{root / 'tb'}", bad


def _tensorboard_fifo(root: Path) -> tuple[str, Path]:
    (root / "tb" / "run").mkdir(parents=True)
    bad = root / "tb" / "run" / "events.out.tfevents.1763700000.host.1.0"
    os.mkfifo(bad)
    return f"tensorboard:{root / 'tb'}", bad


def _clearml_metrics_to_zero(root: Path) -> tuple[str, Path]:
    session = root / "offline-session"
    shutil.copytree(ROOT / "tests" / "data" / "trackers" / "clearml-2.1.12-session", session)
    bad = session / "metrics.jsonl"
    bad.unlink()
    os.symlink("/dev/zero", bad)
    return f"clearml:{session}", bad


def _sqlite_named_trainer_state(root: Path) -> tuple[str, Path]:
    bad = root / "out" / "trainer_state.json"
    bad.parent.mkdir(parents=True)
    con = sqlite3.connect(bad)
    con.execute("CREATE TABLE log_history (step INTEGER, loss REAL)")
    con.execute("INSERT INTO log_history VALUES (1, 0.5)")
    con.commit()
    con.close()
    return str(bad), bad


def _text_named_parquet(root: Path) -> tuple[str, Path]:
    bad = root / "proj" / "run-1_part_0.parquet"
    bad.parent.mkdir(parents=True)
    bad.write_text("step,loss\n1,0.5\n2,0.4\n")
    return f"neptune:{bad}", bad


def _png_named_wandb(root: Path) -> tuple[str, Path]:
    bad = root / "wandb" / "offline-run-20251120_000000-abc123" / "run-abc123.wandb"
    bad.parent.mkdir(parents=True)
    bad.write_bytes(PNG * 40)
    return f"wandb:{bad}", bad


def _empty_file(root: Path) -> tuple[str, Path]:
    bad = root / "metrics.jsonl"
    root.mkdir(parents=True)
    bad.write_bytes(b"")
    return str(bad), bad


CASES = {"event file linked to /dev/zero": _tensorboard_link_to_zero, "event file that is a FIFO": _tensorboard_fifo,
         "clearml metrics.jsonl linked to /dev/zero": _clearml_metrics_to_zero,
         "sqlite named trainer_state.json": _sqlite_named_trainer_state, "text named .parquet": _text_named_parquet,
         "png named .wandb": _png_named_wandb, "empty file": _empty_file}


def _one_error_line(p, bad: Path) -> str:
    assert p.returncode == 2, (p.returncode, p.stderr[-2000:])
    assert "Traceback" not in p.stderr, p.stderr[-3000:]
    lines = [ln for ln in p.stderr.splitlines() if ln.strip() and "proofs.yaml" not in ln]
    assert len(lines) == 1, p.stderr[-2000:]
    assert str(bad) in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("strict", [False, True])
def test_bad_input_is_an_error_naming_the_file_and_creates_no_run(tmp_path, env, case, strict):
    src, bad = CASES[case](tmp_path / "src")
    for dst_kind in ("jsonl", "mlflow"):
        dst = tmp_path / f"dst-{dst_kind}"
        loc = f"jsonl:{dst}" if dst_kind == "jsonl" else f"mlflow:sqlite:///{dst / 'mlflow.db'}"
        p = run_cli("migrate", src, loc, "--quiet", *(["--strict"] if strict else []), timeout=120)
        line = _one_error_line(p, bad)
        assert not dst.exists(), f"{case}: a destination was made: {sorted(dst.rglob('*'))}"
        if dst_kind == "jsonl":
            assert any(w in line for w in ("not a regular file", "an empty file", "not a", "an SQLite database")), line
        if strict:
            break                       # --strict changes nothing here; one destination is enough


@pytest.mark.parametrize("case", ["event file that is a FIFO", "png named .wandb", "empty file"])
def test_translate_refuses_the_same_inputs(tmp_path, case):
    src, bad = CASES[case](tmp_path / "src")
    p = run_cli("translate", src, timeout=120)
    _one_error_line(p, bad)
    assert p.stdout == ""


@pytest.mark.parametrize("what", ["empty", "binary"])
def test_compare_on_an_empty_or_binary_input_writes_no_report(tmp_path, what):
    src = tmp_path / "run.jsonl"
    src.write_bytes(b"" if what == "empty" else bytes(range(256)) * 64)
    out = tmp_path / "report"
    p = run_cli("compare", str(src), "--out", str(out), timeout=120)
    line = [ln for ln in p.stderr.splitlines() if str(src) in ln]
    assert p.returncode == 2, p.stderr[-2000:]
    assert "Traceback" not in p.stderr and len(line) == 1, p.stderr[-2000:]
    assert ("empty file" if what == "empty" else "nothing readable") in line[0], line[0]
    assert not out.exists() or not any(out.iterdir()), sorted(out.rglob("*"))


def test_a_good_run_beside_them_still_migrates(tmp_path, env):
    """The rule refuses what is bad, not the readable: a TensorBoard folder whose event file is fine migrates."""
    from trackbridge.record import Record, RunInfo

    from test_migrate_support import write_run
    write_run(f"tensorboard:{tmp_path / 'tb' / 'good'}", RunInfo(name="good", run_id="good"),
              [Record(step=s, wall_time=1.7e9 + s, metrics={"custom/a": float(s)}) for s in range(5)])
    p = run_cli("migrate", f"tensorboard:{tmp_path / 'tb'}", f"jsonl:{tmp_path / 'out'}", "--quiet", "--names",
                "keep", timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "Migrated: 1 run(s), 5 records" in p.stderr
