"""Migrate real runs (examples/ and the public logs in tests/data) into every tracker with canonical names, and read
back.

Checked for each (log, tracker): the canonical names the pipeline gives are the names stored; every value equals the
source's (float32 in TensorBoard); the steps are the source's; the source has no wall times and none are invented
(the summary says the time axis is missing, the run is marked, and reading the tracker's run back through
``migrate`` into JSONL gives no wall times); keys that have no canonical name are reported as unmapped.
"""
from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from trackbridge.migrate import migrate, summary
from trackbridge.pipeline import Pipeline
from trackbridge.trackers import open_source
from trackbridge.tracking.source import TIME_AXIS

from test_migrate_support import KINDS, ROOT, f32, location, read_runs, same_value

EXAMPLES = {
    "verl_console": f"console:{ROOT / 'examples' / 'verl_console.log'}",
    "trl_grpo_trainer_state": f"trainer-state:{ROOT / 'examples' / 'trl_grpo_trainer_state.json'}",
    "trl_dpo_wandb_export": f"csv:{ROOT / 'examples' / 'trl_dpo_wandb_export.csv'}",
    "trl_ppo_console": f"console:{ROOT / 'examples' / 'trl_ppo_console.log'}",
}


def expected(src: str):
    """The source's records translated to canonical names (what the migration must store), and the stats."""
    (reader,) = list(open_source(src).runs())
    pipe = Pipeline("auto", "canonical", config=reader.info.config, derive=False)
    recs = list(pipe.process(reader.records()))
    return recs, pipe.stats


def check_migrated(src: str, dst_kind: str, dst: str, tmp: Path) -> None:
    want, stats = expected(src)
    assert all(r.wall_time is None for r in want), "the example has no wall times"
    res = migrate(src, dst, names="canonical", progress=False)
    assert res.ok, summary(res)
    text = summary(res)
    assert "time axis missing" in text, text
    if stats.unmapped:
        assert "unmapped (kept as is): %d: " % len(stats.unmapped) in text, text
        for k in stats.unmapped:
            assert k in text
    assert stats.renamed, "nothing was renamed: not a useful example"

    runs = read_runs(dst)
    assert len(runs) == 1
    info, got, problems = runs[0]
    assert problems == []
    assert info.extra.get(TIME_AXIS) == "missing"
    assert [r.step for r in got] == [r.step for r in want]
    for g, w in zip(got, want):
        names = {k for k, v in w.metrics.items() if v is not None}
        assert set(g.metrics) == names, f"step {w.step}: {set(g.metrics) ^ names}"
        for k in names:
            wv = w.metrics[k]
            if dst_kind == "tensorboard" and not isinstance(wv, str):
                wv = f32(float(wv))
            assert same_value(g.metrics[k], wv), f"step {w.step} {k}: got {g.metrics[k]!r}, want {wv!r}"
    for canon in stats.renamed.values():
        assert any(canon in r.metrics for r in got), f"{canon} is not in the migrated run"
    if dst_kind == "jsonl":
        assert all(r.wall_time is None for r in got)
    else:
        # the tracker had to store some time; a second migration must not take it for the run's time axis
        again = migrate(dst, f"jsonl:{tmp / 'again'}", names="keep", progress=False)
        assert again.ok and "time axis missing" in summary(again)
        (_, recs2, _), = read_runs(f"jsonl:{tmp / 'again'}")
        assert recs2 and all(r.wall_time is None for r in recs2)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("example", list(EXAMPLES))
def test_examples_into_each_tracker(example, kind, env):
    dst = location(kind, env / "dst")
    check_migrated(EXAMPLES[example], kind, dst, env)


# -- the public logs (tests/data), rebuilt as the files their users have --------------------------------------------
def _public_log_file(path: Path, out: Path) -> str:
    """A console log (veRL, printed dicts) or a trainer_state.json holding the public log's rows verbatim."""
    data = json.loads(path.read_text())
    rows = data["rows"]
    fw = data["framework"]
    if fw == "verl":
        f = out / f"{path.stem}.log"
        f.write_text("".join("step:%d - " % r["step"] + " - ".join(f"{k}:{v!r}" for k, v in r.items() if k != "step")
                             + "\n" for r in rows))
        return f"console:{f}"
    if not all("step" in r for r in rows):      # pasted console output: printed dicts, in log order
        f = out / f"{path.stem}.log"
        f.write_text("".join(repr(r) + "\n" for r in rows))
        return f"console:{f}"
    f = out / f"{path.stem}_trainer_state.json"
    f.write_text(json.dumps({"global_step": max(r["step"] for r in rows), "log_history": rows}))
    return f"trainer-state:{f}"


def _public_logs():
    from _support import DATA as SHARED
    d = Path(SHARED) / "public-logs"
    return sorted(d.glob("[0-9]*.json")) if d.is_dir() else []


@pytest.mark.parametrize("kind", ["jsonl", "mlflow", "tensorboard", "trackio", "wandb"])
@pytest.mark.parametrize("log", _public_logs(), ids=lambda p: p.stem)
def test_public_logs_into_each_tracker(log, kind, env):
    src = _public_log_file(log, env)
    (reader,) = list(open_source(src).runs())
    rows = json.loads(log.read_text())["rows"]
    n = sum(len([k for k in r if k != "step"]) for r in rows)
    assert sum(len(r.metrics) for r in reader.records()) == n, f"{src}: the rebuilt file does not read back whole"
    check_migrated(src, kind, location(kind, env / "dst"), env)


def test_dry_run_on_an_example_lists_every_key(env, capsys):
    buf = io.StringIO()
    res = migrate(EXAMPLES["verl_console"], f"jsonl:{env / 'never'}", dry_run=True, out=buf, progress=False)
    text = buf.getvalue()
    assert not (env / "never").exists()
    assert res.runs[0].points > 0
    assert "actor/pg_loss" in text and "renamed" in text and "approximate" in text
    assert "time axis missing" in summary(res, dry_run=True)
