"""Bad input files and files that are not ours (issue 12, "bad input" and "never delete a user's file").

Tried as a user would: ``python -m trackbridge migrate SRC DST`` and ``python -m trackbridge translate FILE`` in a
child process, checking the messages and exit codes, and reading each destination back with trackbridge's readers
or the tracker's own tools (sqlite3 on the MLflow store, ``MlflowClient``). Binary input is made with a seeded
``random.Random`` (the same bytes every run); TensorBoard files with TensorBoard's own ``EventFileWriter``.
"""
from __future__ import annotations

import hashlib
import json
import random
import sqlite3
import subprocess
from pathlib import Path

import pytest

from trackbridge.record import Record, RunInfo

from _support import ROOT
from test_migrate_support import location, read_runs, run_cli, write_run

MB = 1_000_000


def _junk(n: int, seed: int = 12) -> bytes:
    return random.Random(seed).randbytes(n)


def _lines(stderr: str, needle: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if needle in ln]


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _plain_rows(n: int) -> bytes:
    return b"".join(json.dumps({"step": i, "loss": 1.0 / (i + 1), "reward": i / 4}).encode() + b"\n"
                    for i in range(n))


# -- 1. binary junk read as JSON lines ---------------------------------------------------------------------------
def test_binary_file_as_jsonl_is_refused_once_and_creates_no_run(env):
    src = env / "junk.jsonl"
    src.write_bytes(_junk(MB))
    dst = env / "out"
    p = run_cli("migrate", f"jsonl:{src}", f"jsonl:{dst}", "--names", "keep", "--quiet")
    assert p.returncode == 2, p.stderr           # nothing readable at all: an input error (issue 31), even without
    assert "Traceback" not in p.stderr           # --strict
    about = _lines(p.stderr, str(src))
    assert len(about) == 1, p.stderr             # reported once (it used to be ~4,000 lines)
    assert "not a text file" in about[0] and "at byte 0" in about[0] and "1,000,000 bytes" in about[0]
    assert "nothing was written" in p.stderr
    assert len(p.stderr.splitlines()) < 15
    assert not dst.exists(), "no empty run in the destination"

    q = run_cli("migrate", f"jsonl:{src}", f"jsonl:{dst}", "--names", "keep", "--quiet", "--strict")
    assert q.returncode == 2 and not dst.exists()

    t = run_cli("translate", f"jsonl:{src}")
    assert t.returncode == 2, t.stderr
    assert len(_lines(t.stderr, str(src))) == 1, t.stderr
    assert t.stdout == ""


def test_jsonl_with_binary_tail_keeps_the_lines_before_it(env):
    good = _plain_rows(40)
    src = env / "run.jsonl"
    src.write_bytes(good + _junk(MB, seed=3))
    dst = env / "out"
    p = run_cli("migrate", f"jsonl:{src}", f"jsonl:{dst}", "--names", "keep", "--quiet")
    assert p.returncode == 0, p.stderr
    about = _lines(p.stderr, str(src))
    assert len(about) == 1, p.stderr
    assert f"{src}:line 41 (offset {len(good)})" in about[0], about[0]
    assert "binary data" in about[0] and "was not read" in about[0]
    (info, recs, _), = read_runs(f"jsonl:{dst}")
    assert [r.step for r in recs] == list(range(40))
    assert recs[7].metrics == {"loss": 1.0 / 8, "reward": 7 / 4}

    q = run_cli("migrate", f"jsonl:{src}", f"jsonl:{env / 'out-strict'}", "--names", "keep", "--quiet", "--strict")
    assert q.returncode == 1, q.stderr


def test_jsonl_damage_is_still_reported_line_by_line(env):
    """One bad line between good ones is damage, not junk: reported with its line, the rest is read."""
    rows = _plain_rows(10).splitlines(keepends=True)
    rows[4] = b'{"step": 4, "loss": 0.2\n'                         # cut off
    rows[7] = b'\xff\xfe binary garbage\n'                         # one binary line alone
    src = env / "run.jsonl"
    src.write_bytes(b"".join(rows))
    dst = env / "out"
    p = run_cli("migrate", f"jsonl:{src}", f"jsonl:{dst}", "--names", "keep", "--quiet")
    assert p.returncode == 0, p.stderr
    assert f"{src}:line 5 " in p.stderr and f"{src}:line 8 " in p.stderr, p.stderr
    assert "binary data" not in p.stderr
    (info, recs, _), = read_runs(f"jsonl:{dst}")
    assert [r.step for r in recs] == [0, 1, 2, 3, 5, 6, 8, 9]


def test_text_that_is_not_jsonl_stops_after_twenty_lines(env):
    src = env / "notes.jsonl"
    src.write_text("".join(f"this is line {i} of a text file, not JSON\n" for i in range(5000)))
    p = run_cli("migrate", f"jsonl:{src}", f"jsonl:{env / 'out'}", "--quiet")
    assert p.returncode == 2, p.stderr           # nothing readable: an input error (issue 31)
    about = _lines(p.stderr, str(src))
    assert len(about) == 1 and "first 20 non-empty lines" in about[0], p.stderr
    assert not (env / "out").exists()


# -- 1. CSV: unterminated quote, binary -------------------------------------------------------------------------
def _csv_rows(n: int) -> list[str]:
    return ["_step,train/loss,note"] + [f"{i},{i / 100},row {i}" for i in range(1, n + 1)]


def test_csv_unterminated_quote_names_its_line_and_loses_one_row(env):
    lines = _csv_rows(100)           # line 1 is the header, line k the row of step k - 1
    lines[50] = '50,0.5,"an open quote that never closes'                  # line 51
    src = env / "export.csv"
    src.write_text("\n".join(lines) + "\n")
    dst = env / "out"
    p = run_cli("migrate", f"csv:{src}", f"jsonl:{dst}", "--names", "keep", "--quiet")
    assert p.returncode == 0, p.stderr
    about = _lines(p.stderr, str(src))
    assert len(about) == 1, p.stderr
    assert f"{src}:51:" in about[0] and "not closed" in about[0] and "1 row lost" in about[0], about[0]
    assert f"{src}:101" not in p.stderr
    (info, recs, _), = read_runs(f"jsonl:{dst}")
    steps = [r.step for r in recs]
    assert steps == [s for s in range(1, 101) if s != 50]         # rows 52-101 are not swallowed
    assert recs[-1].metrics == {"train/loss": 1.0, "note": "row 100"}
    assert all("\n" not in str(v) for r in recs for v in r.metrics.values())

    q = run_cli("migrate", f"csv:{src}", f"jsonl:{env / 'out-strict'}", "--names", "keep", "--quiet", "--strict")
    assert q.returncode == 1

    t = run_cli("translate", str(src))
    assert t.returncode == 1, t.stderr
    assert len(_lines(t.stderr, f"{src}:51:")) == 1, t.stderr
    assert len(t.stdout.splitlines()) == 99


def test_csv_quote_closed_much_later_is_not_one_giant_row(env):
    lines = _csv_rows(30)
    lines[10] = '10,0.1,"opens here'           # line 11; the next quote is on line 21
    lines[20] = '20,0.2,closes here"'
    src = env / "export.csv"
    src.write_text("\n".join(lines) + "\n")
    dst = env / "out"
    p = run_cli("migrate", f"csv:{src}", f"jsonl:{dst}", "--names", "keep", "--quiet")
    assert f"{src}:11:" in p.stderr and "1 row lost" in p.stderr, p.stderr
    (info, recs, _), = read_runs(f"jsonl:{dst}")
    steps = [r.step for r in recs]
    assert 10 not in steps and all(s in steps for s in range(11, 20)) and 30 in steps, steps


def test_binary_file_as_csv(env):
    src = env / "export.csv"
    src.write_bytes(_junk(MB, seed=5))
    dst = env / "out"
    p = run_cli("migrate", f"csv:{src}", f"jsonl:{dst}", "--quiet")
    assert p.returncode == 2, p.stderr           # nothing readable: an input error (issue 31)
    about = _lines(p.stderr, str(src))
    assert len(about) == 1 and "not a text file" in about[0], p.stderr
    assert not dst.exists()
    t = run_cli("translate", str(src))
    assert t.returncode != 0 and len(_lines(t.stderr, str(src))) == 1, t.stderr


def test_csv_with_binary_tail(env):
    src = env / "export.csv"
    good = ("\n".join(_csv_rows(20)) + "\n").encode()
    src.write_bytes(good + _junk(200_000, seed=9))
    p = run_cli("migrate", f"csv:{src}", f"jsonl:{env / 'out'}", "--names", "keep", "--quiet")
    assert p.returncode == 0, p.stderr
    about = _lines(p.stderr, str(src))
    assert any("binary data" in a for a in about), p.stderr
    assert len(about) <= 3, p.stderr                   # not one message per line of junk
    (info, recs, _), = read_runs(f"jsonl:{env / 'out'}")
    assert [r.step for r in recs][:20] == list(range(1, 21))


# -- 1. empty TensorBoard event files ------------------------------------------------------------------------------
def _version_only(folder: Path) -> Path:
    from tensorboard.summary.writer.event_file_writer import EventFileWriter
    folder.mkdir(parents=True, exist_ok=True)
    w = EventFileWriter(str(folder))
    w.close()
    (path,) = folder.glob("events.out.tfevents.*")
    return path


@pytest.mark.parametrize("kind", ["zero_bytes", "file_version_only"])
def test_empty_event_file_is_reported(env, kind):
    pytest.importorskip("tensorboard")
    run = env / "tb" / "run"
    if kind == "zero_bytes":
        run.mkdir(parents=True)
        path = run / "events.out.tfevents.1763700000.host.1.0"
        path.write_bytes(b"")
    else:
        path = _version_only(run)
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
        ea = EventAccumulator(str(run))
        ea.Reload()
        assert ea.Tags()["scalars"] == []            # TensorBoard's own reader: a file without values
    dst = env / "out"
    p = run_cli("migrate", f"tensorboard:{env / 'tb'}", f"jsonl:{dst}", "--quiet")
    assert p.returncode == 2, p.stderr           # nothing readable: an input error (issue 31)
    about = _lines(p.stderr, str(path))
    assert len(about) == 1, p.stderr
    assert ("0 bytes" if kind == "zero_bytes" else "file_version") in about[0]
    assert not dst.exists()
    t = run_cli("translate", f"tensorboard:{run}")
    assert t.returncode == 2 and len(_lines(t.stderr, str(path))) == 1, t.stderr


def test_empty_event_file_beside_a_good_one(env):
    pytest.importorskip("tensorboard")
    recs = [Record(step=i, wall_time=1763700000.0 + i, metrics={"loss": i / 2}) for i in range(5)]
    write_run(f"tensorboard:{env / 'tb'}", RunInfo(name="run", run_id="r"), recs)
    empty = env / "tb" / "run" / "events.out.tfevents.1999999999.host.2.0"     # sorts after the real one
    empty.write_bytes(b"")
    dst = env / "out"
    p = run_cli("migrate", f"tensorboard:{env / 'tb'}", f"jsonl:{dst}", "--names", "keep", "--quiet")
    assert p.returncode == 0, p.stderr
    assert len(_lines(p.stderr, str(empty))) == 1, p.stderr
    (info, got, _), = read_runs(f"jsonl:{dst}")
    assert [r.metrics for r in got] == [r.metrics for r in recs]
    q = run_cli("migrate", f"tensorboard:{env / 'tb'}", f"jsonl:{env / 'o2'}", "--names", "keep", "--quiet",
                "--strict")
    assert q.returncode == 1


# -- 2. an SQLite file that is not an MLflow store -----------------------------------------------------------------
def _app_db(path: Path) -> Path:
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
    con.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, user INTEGER, total REAL)")
    con.executemany("INSERT INTO users (name) VALUES (?)", [("ada",), ("grace",)])
    con.commit()
    con.close()
    return path


def _tables(path: Path) -> set[str]:
    con = sqlite3.connect(path)
    try:
        return {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    finally:
        con.close()


def test_migrate_refuses_an_sqlite_file_that_is_not_mlflow(env):
    src = env / "run.jsonl"
    src.write_bytes(_plain_rows(5))
    db = _app_db(env / "app.db")
    before = _sha(db)
    for dst in (f"mlflow:sqlite:///{db}", f"mlflow:{db}", f"mlflow:sqlite:///{db}?experiment=x"):
        p = run_cli("migrate", f"jsonl:{src}", dst, "--quiet")
        assert p.returncode == 2, (dst, p.stderr)
        assert "Traceback" not in p.stderr
        assert str(db) in p.stderr and "not an MLflow store" in p.stderr and "users" in p.stderr, p.stderr
    assert _sha(db) == before
    assert _tables(db) == {"users", "orders"}


def test_migrate_refuses_a_file_that_is_not_sqlite(env):
    src = env / "run.jsonl"
    src.write_bytes(_plain_rows(5))
    db = env / "notes.db"
    db.write_text("my notes, not a database\n")
    p = run_cli("migrate", f"jsonl:{src}", f"mlflow:sqlite:///{db}", "--quiet")
    assert p.returncode == 2 and "not an SQLite database" in p.stderr and str(db) in p.stderr, p.stderr
    assert db.read_text() == "my notes, not a database\n"


@pytest.mark.parametrize("start", ["missing", "zero_bytes", "no_tables", "mlflow_store"])
def test_migrate_into_new_empty_or_mlflow_sqlite(env, start):
    from trackbridge.trackers.mlflow.client import make_client

    src = env / "run.jsonl"
    src.write_bytes(_plain_rows(6))
    if start == "mlflow_store":
        loc = location("mlflow", env / "ml")
        db = Path(loc.split("sqlite:///", 1)[1])
    else:
        db = env / "new.db"
        if start == "zero_bytes":
            db.write_bytes(b"")
        elif start == "no_tables":
            con = sqlite3.connect(db)
            con.execute("PRAGMA user_version = 7")         # a valid SQLite file with no table
            con.commit()
            con.close()
            assert db.stat().st_size > 0
    p = run_cli("migrate", f"jsonl:{src}", f"mlflow:sqlite:///{db}?experiment=bad-inputs", "--names", "keep",
                "--quiet")
    assert p.returncode == 0, p.stderr
    client = make_client(f"sqlite:///{db}")
    exp = client.get_experiment_by_name("bad-inputs")
    (run,) = client.search_runs([exp.experiment_id])
    hist = client.get_metric_history(run.info.run_id, "loss")
    assert sorted(m.step for m in hist) == list(range(6))


def test_mlflow_sink_open_refuses_before_mlflow_touches_the_file(env):
    from trackbridge.trackers import make_sink
    from trackbridge.tracking.sink import SinkError

    db = _app_db(env / "app.db")
    before = _sha(db)
    sink = make_sink(f"mlflow:sqlite:///{db}")
    with pytest.raises(SinkError, match="not an MLflow store"):
        sink.open(RunInfo(name="r", run_id="r"))
    assert _sha(db) == before and _tables(db) == {"users", "orders"}
    assert not (env / "mlartifacts").exists()


def test_check_sqlite_store_rules(tmp_path):
    from trackbridge.trackers.mlflow.store import check_sqlite_store, sqlite_path
    from trackbridge.tracking.sink import SinkError

    assert sqlite_path("sqlite:////abs/x.db") == Path("/abs/x.db")
    assert sqlite_path("sqlite:///rel/x.db?experiment=e") == Path("rel/x.db")
    assert sqlite_path("x.db") == Path("x.db")
    assert sqlite_path("http://127.0.0.1:5000") is None and sqlite_path("mlruns") is None
    check_sqlite_store(f"sqlite:///{tmp_path / 'missing.db'}")           # nothing there: fine
    assert not (tmp_path / "missing.db").exists()                          # and the check creates nothing
    trackio_like = tmp_path / "proj.db"
    con = sqlite3.connect(trackio_like)
    con.execute("CREATE TABLE metrics (id INTEGER, run_name TEXT, step INTEGER, metrics TEXT)")
    con.execute("CREATE TABLE configs (id INTEGER, run_name TEXT, config TEXT)")
    con.commit()
    con.close()
    with pytest.raises(SinkError, match="configs, metrics"):
        check_sqlite_store(str(trackio_like))


# -- 3. derived rules: depth and size bounds, override ------------------------------------------------------------
def _rules_file(path: Path, *rules: tuple[str, str, str]) -> Path:
    body = "".join(f"  - name: {name}\n    formula: \"{formula}\"\n    description: test rule\n"
                   f"    citation: test/file.py@v1\n{extra}" for name, formula, extra in rules)
    path.write_text("format: trackbridge.derived/1\nrules:\n" + body, encoding="utf-8")
    return path


@pytest.mark.parametrize("shape, message", [
    ("parens_20000", "formula too long"),
    ("parens_1000", "nested too deep"),
    ("chain_400", "nested too deep"),
    ("signs_3000", "nested too deep"),
    ("calls_100", "nested too deep"),
])
def test_deep_or_huge_formula_is_an_error_with_file_line_and_rule(tmp_path, shape, message):
    from trackbridge.derive import RuleError, load_rules

    kind, n = shape.rsplit("_", 1)
    n = int(n)
    formula = {"parens": "(" * n + "kl/coef" + ")" * n,
               "chain": " + ".join(["kl/coef"] * n),
               "signs": "-" * n + "kl/coef",
               "calls": "abs(" * n + "kl/coef" + ")" * n}[kind]
    path = _rules_file(tmp_path / "mine.yaml", ("policy/entropy", "kl/coef * 2", ""),
                       ("kl/old_ref/k3_seq_sum", formula, ""))
    with pytest.raises(RuleError) as err:
        load_rules([str(path)])
    text = str(err.value)
    assert text.startswith(f"{path}:8: rule 'kl/old_ref/k3_seq_sum': formula: "), text[:200]     # the formula's line
    assert message in text and "recursion" not in text

    p = run_cli("mappings", "lint", str(path))
    assert p.returncode == 2, p.stderr
    assert f"{path}:8: rule 'kl/old_ref/k3_seq_sum'" in p.stderr and message in p.stderr
    assert "Traceback" not in p.stderr and "recursion" not in p.stderr


def test_formula_at_the_depth_bound_still_works(tmp_path):
    from trackbridge.derive import Deriver, load_rules
    from trackbridge.derive.expr import MAX_DEPTH, parse

    chain = " + ".join(["kl/coef"] * MAX_DEPTH)          # 63 operators: depth 64
    parse(chain)
    parens = "(" * (MAX_DEPTH - 2) + "kl/coef * 2" + ")" * (MAX_DEPTH - 2)
    parse(parens)
    path = _rules_file(tmp_path / "mine.yaml", ("kl/old_ref/k3_seq_sum", chain, ""))
    rs = load_rules([str(path)])
    m = {"kl/coef": 0.5}
    assert "kl/old_ref/k3_seq_sum" in Deriver(rs).apply(m, step=1)
    assert m["kl/old_ref/k3_seq_sum"] == pytest.approx(0.5 * MAX_DEPTH)


def test_user_rule_with_a_shipped_name_needs_override(tmp_path):
    from trackbridge.derive import Deriver, RuleError, load_rules
    from trackbridge.derive.rules import mappings_dir

    mine = _rules_file(tmp_path / "mine.yaml", ("preference/reward/margin", "preference/reward/chosen * 0", ""))
    with pytest.raises(RuleError) as err:
        load_rules([str(mine)])
    text = str(err.value)
    assert text.startswith(f"{mine}:3: rule 'preference/reward/margin'"), text
    assert str(mappings_dir() / "derived.yaml") in text and "override: true" in text

    _rules_file(mine, ("preference/reward/margin", "preference/reward/chosen * 0", "    override: true\n"))
    rs = load_rules([str(mine)])
    margin_rules = [r for r in rs if r.name == "preference/reward/margin"]
    assert [r.file for r in margin_rules] == [str(mine)]          # the shipped one is replaced, not a fallback
    m = {"preference/reward/chosen": 2.0, "preference/reward/rejected": 1.0}
    assert Deriver(rs).apply(m) == ["preference/reward/margin"] and m["preference/reward/margin"] == 0.0
    m = {"preference/reward/chosen": 2.0, "preference/reward/rejected": 1.0}
    assert Deriver(load_rules()).apply(m) == ["preference/reward/margin"] and m["preference/reward/margin"] == 1.0

    _rules_file(mine, ("preference/reward/margin", "preference/reward/chosen * 0", "    override: yes please\n"))
    with pytest.raises(RuleError, match="'override' must be true or false"):
        load_rules([str(mine)])


def test_override_through_the_cli(env):
    rows = env / "dpo.jsonl"
    rows.write_text('{"step": 1, "rewards/chosen": 2.0, "rewards/rejected": 0.5}\n')
    mine = _rules_file(env / "mine.yaml", ("preference/reward/margin", "preference/reward/chosen * 0", ""))
    p = run_cli("translate", "--derive", "--from", "trl/dpo", "--mappings", str(mine), str(rows))
    assert p.returncode == 2, p.stderr
    assert f"{mine}:3" in p.stderr and "derived.yaml" in p.stderr and "override: true" in p.stderr
    assert p.stdout == ""
    _rules_file(mine, ("preference/reward/margin", "preference/reward/chosen * 0", "    override: true\n"))
    p = run_cli("translate", "--derive", "--from", "trl/dpo", "--mappings", str(mine), str(rows))
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["preference/reward/margin"] == 0.0
    p = run_cli("translate", "--derive", "--from", "trl/dpo", str(rows))
    assert json.loads(p.stdout)["preference/reward/margin"] == 1.5


# -- 4. commands delete only what they wrote ---------------------------------------------------------------------
EXAMPLES = ROOT / "examples"
MANIFEST = ".trackbridge-manifest.json"


def _compare(out: Path, *metrics: str) -> "subprocess.CompletedProcess":
    args = ["compare", f"grpo=trainer-state:{EXAMPLES / 'trl_grpo_trainer_state.json'}", "--out", str(out)]
    if metrics:
        args += ["--metrics", ",".join(metrics)]
    return run_cli(*args)


def test_compare_rerun_deletes_only_its_own_charts(env):
    pytest.importorskip("matplotlib")
    out = env / "cmp"
    p = _compare(out)
    assert p.returncode == 0, p.stderr
    first = sorted(c.name for c in (out / "charts").glob("*.png"))
    assert len(first) > 3
    listed = json.loads((out / MANIFEST).read_text())
    assert listed["command"] == "compare" and listed["complete"] is True
    assert {f"charts/{c}" for c in first} | {"report.html", "summary.csv", "summary.md"} == set(listed["files"])

    (out / "charts" / "my_own.png").write_bytes(b"\x89PNG mine")
    (out / "notes.txt").write_text("my notes")
    p = _compare(out, "kl/ref/k3")                                  # a smaller report in the same folder
    assert p.returncode == 0, p.stderr
    now = sorted(c.name for c in (out / "charts").glob("*.png"))
    # the smaller report's charts (kl/ref/k3, and any chart a diagnostic finding of the run points to), stale charts
    # gone, the user's one kept
    second = sorted(f.split("/", 1)[1] for f in json.loads((out / MANIFEST).read_text())["files"]
                    if f.startswith("charts/"))
    assert "001_kl_ref_k3.png" in second and len(second) < len(first), second
    assert now == sorted([*second, "my_own.png"]), now
    assert (out / "charts" / "my_own.png").read_bytes() == b"\x89PNG mine"
    assert (out / "notes.txt").read_text() == "my notes"
    assert "my_own.png" not in (out / MANIFEST).read_text()


def test_compare_refuses_a_folder_with_files_it_did_not_write(env):
    pytest.importorskip("matplotlib")
    out = env / "cmp"
    (out / "charts").mkdir(parents=True)
    (out / "charts" / "figure1.png").write_bytes(b"\x89PNG paper figure")
    p = _compare(out)
    assert p.returncode == 2, p.stderr
    assert str(out) in p.stderr and MANIFEST in p.stderr and "charts/figure1.png" in p.stderr
    assert (out / "charts" / "figure1.png").read_bytes() == b"\x89PNG paper figure"
    assert sorted(f.name for f in out.rglob("*")) == ["charts", "figure1.png"]


def test_compare_overwrites_an_old_report_without_manifest(env):
    """A folder holding only files this report writes (an earlier report, before manifests) is used."""
    pytest.importorskip("matplotlib")
    out = env / "cmp"
    assert _compare(out, "kl/ref/k3").returncode == 0
    (out / MANIFEST).unlink()
    p = _compare(out, "kl/ref/k3")
    assert p.returncode == 0, p.stderr
    files = json.loads((out / MANIFEST).read_text())["files"]
    assert [f for f in files if not f.startswith("charts/")] == ["report.html", "summary.csv", "summary.md"]
    assert files[0] == "charts/001_kl_ref_k3.png"
    html = (out / "report.html").read_text()
    # the other charts are those of the diagnostic findings (issue 23), each linked from the report
    assert all(f in html for f in files if f.startswith("charts/")), files


def test_demo_rerun_keeps_the_users_files(env):
    pytest.importorskip("matplotlib")
    out = env / "demo"
    p = run_cli("demo", "--out", str(out))
    assert p.returncode == 0, p.stderr
    listed = json.loads((out / MANIFEST).read_text())
    assert listed["command"] == "demo" and listed["complete"] is True
    assert "canonical/trl-grpo.jsonl" in listed["files"]
    assert not any(f.startswith("report/") for f in listed["files"])      # compare keeps its own list there
    (out / "notes.txt").write_text("mine")
    (out / "canonical" / "README.md").write_text("mine too")
    (out / "report" / "charts" / "mine.png").write_bytes(b"png")
    import importlib.util
    have = {k: importlib.util.find_spec(k) is not None for k in ("mlflow", "wandb", "tensorboard")}
    db = out / "trackers" / "mlflow.db"
    old_db = db.stat().st_mtime_ns if have["mlflow"] else None
    tb_loc = f"tensorboard:{out / 'trackers' / 'tensorboard'}"
    tb_before = {i.name: len(recs) for i, recs, _ in read_runs(tb_loc)} if have["tensorboard"] else {}

    p = run_cli("demo", "--out", str(out))
    assert p.returncode == 0, p.stderr
    assert (out / "notes.txt").read_text() == "mine"
    assert (out / "canonical" / "README.md").read_text() == "mine too"
    assert (out / "report" / "charts" / "mine.png").read_bytes() == b"png"
    assert (out / "report" / "report.html").is_file() and (out / "canonical" / "verl-ppo.jsonl").is_file()
    if have["mlflow"]:                                        # the tracker store was made again, not appended to
        assert db.stat().st_mtime_ns != old_db
        from trackbridge.trackers.mlflow.client import make_client
        client = make_client(f"sqlite:///{db}")
        exp = client.get_experiment_by_name("trackbridge-demo")
        assert len(client.search_runs([exp.experiment_id])) == 2
    if have["wandb"]:                                         # the earlier demo's wandb runs are gone
        assert len(list((out / "trackers" / "wandb").rglob("run-*.wandb"))) == 2
    if have["tensorboard"]:
        runs = read_runs(tb_loc)
        assert sorted(i.name for i, _, _ in runs) == ["trl_grpo_trainer_state", "verl_console"]
        assert {i.name: len(recs) for i, recs, _ in runs} == tb_before      # written once, not appended

def test_demo_refuses_a_folder_it_did_not_make(env):
    out = env / "mine"
    out.mkdir()
    (out / "thesis.tex").write_text("months of work")
    p = run_cli("demo", "--out", str(out))
    assert p.returncode == 2, p.stderr
    assert str(out) in p.stderr and "thesis.tex" in p.stderr and MANIFEST in p.stderr
    assert sorted(f.name for f in out.iterdir()) == ["thesis.tex"]
    assert (out / "thesis.tex").read_text() == "months of work"
    # a folder of an older demo (its marker, no list of files) is refused too, not wiped
    (out / ".trackbridge-demo").write_text("output of `trackbridge demo`")
    p = run_cli("demo", "--out", str(out))
    assert p.returncode == 2 and (out / "thesis.tex").is_file(), p.stderr


def test_manifest_never_deletes_outside_its_folder(tmp_path):
    from trackbridge.compare.manifest import OutputManifest

    outside = tmp_path / "precious.txt"
    outside.write_text("keep")
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / "ours.txt").write_text("x")
    (folder / MANIFEST).write_text(json.dumps({"command": "compare", "complete": True,
                                               "files": ["ours.txt", "../precious.txt", str(outside)],
                                               "dirs": [".."]}))
    OutputManifest.prepare(folder, "compare")
    assert outside.read_text() == "keep" and not (folder / "ours.txt").exists()
    with pytest.raises(ValueError, match="trackbridge compare"):
        OutputManifest.prepare(folder, "demo")


# -- 5. config keys that flatten to the same name -------------------------------------------------------------------
def test_config_keys_that_flatten_alike_are_reported_once_naming_both(tmp_path):
    from trackbridge.record.values import sanitize_config
    from trackbridge.trackers import sink_class

    cfg = {"a": {"b": 1}, "a.b": 2, "opt": {"beta": 0.9}, "opt/beta": 0.95, "plain": {"x": 1}}
    # each tracker that flattens the config says how (its capabilities); the others flatten nothing to clash
    flat = {kind: sink_class(kind).capabilities.flat_config for kind in ("mlflow", "tensorboard", "wandb", "jsonl")}
    assert flat == {"mlflow": (".", "MLflow's params"), "tensorboard": ("/", "TensorBoard's hparams"),
                    "wandb": None, "jsonl": None}
    assert sanitize_config(cfg, [flat["mlflow"]])[1] and sanitize_config(cfg, [])[1] == []
    clean, notes = sanitize_config(cfg, [flat["mlflow"], flat["tensorboard"]])
    assert clean == cfg                                   # the nested config itself keeps both keys
    texts = [t for _, t in notes]
    assert len(texts) == 2, texts
    (mlflow_note,) = [t for t in texts if "MLflow" in t]
    assert "'a > b'" in mlflow_note and "'a.b'" in mlflow_note and "only the last one is kept" in mlflow_note
    (tb_note,) = [t for t in texts if "TensorBoard" in t]
    assert "'opt > beta'" in tb_note and "'opt/beta'" in tb_note
    assert sanitize_config({"a": {"b": 1}, "c": 2}, [flat["mlflow"], flat["tensorboard"]])[1] == []

    # what the note says is what MLflow holds: read back from a real store
    from trackbridge.trackers import make_sink
    from trackbridge.trackers.mlflow.client import make_client
    db = tmp_path / "mlflow.db"
    sink = make_sink(f"mlflow:sqlite:///{db}")
    sink.open(RunInfo(name="r", run_id="r", config=clean))
    sink.write([Record(step=0, wall_time=1763700000.0, metrics={"m": 1.0})])
    sink.close()
    client = make_client(f"sqlite:///{db}")
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert run.data.params["a.b"] == "2"
