"""`trackbridge compare --group` / `--group-by` (issue 34 item 1) on real files: three "TRL" GRPO seeds logged with
trackbridge.init into TensorBoard and three "veRL" seeds into JSON lines, each with its own noise and length, compared
as two groups under canonical names (TRL's ``entropy`` and veRL's ``actor/entropy`` are both ``policy/entropy``).
The numbers are checked by hand from the values logged and against rliable's own intervals on the same per-run
numbers; bad groups are refused in one line naming the argument."""
from __future__ import annotations

import csv
import random

import pytest

import trackbridge
from trackbridge.cli import main

from _support.rliable_ref import interval

np = pytest.importorskip("numpy")
pytest.importorskip("matplotlib")
pytest.importorskip("tensorboard")

TRL_KEYS = {"entropy": 0.9, "reward": 0.2}                          # -> policy/entropy, reward/score/mean
VERL_KEYS = {"actor/entropy": 0.8, "critic/score/mean": 0.3}
TRL_STEPS = (12, 10, 8)                                             # unequal lengths
VERL_STEPS = (9, 11, 12)
LAST = 3


def _log(name, source, keys, steps, seed, sink, framework):
    """Log one seed; returns {canonical-ish key: [values by step]} as logged."""
    rnd = random.Random(seed)
    run = trackbridge.init(project="p", name=name, run_id=name, spool=str(sink[1] / f"spool-{name}"),
                           sinks=[sink[0]], source=source,
                           config={"seed": seed, "framework": framework, "trainer": {"algorithm": "grpo"}})
    logged: dict[str, list[float]] = {k: [] for k in keys}
    for step in range(1, steps + 1):
        row = {k: round(base - 0.02 * step + rnd.gauss(0, 0.05), 6) for k, base in keys.items()}
        for k, v in row.items():
            logged[k].append(v)
        run.log(row, step=step)
    run.finish()
    return logged


@pytest.fixture(scope="module")
def seeds(tmp_path_factory):
    root = tmp_path_factory.mktemp("seeds")
    tb = root / "tb"
    trl = [_log(f"trl_s{i}", "trl/grpo@v1.16.0", TRL_KEYS, n, i, (f"tensorboard:{tb}/trl_s{i}", root), "trl")
           for i, n in enumerate(TRL_STEPS)]
    verl = [_log(f"verl_s{i}", "verl/ppo@0.9.1", VERL_KEYS, n, 10 + i,
                 (f"jsonl:{root}/verl_s{i}.jsonl", root), "verl") for i, n in enumerate(VERL_STEPS)]
    return root, tb, trl, verl


def _rows(path):
    with open(path, newline="", encoding="utf-8") as fh:
        return {(r["group"], r["metric"]): r for r in csv.DictReader(fh)}


def _verl_given(root):
    return [f"v{i}=jsonl:{root}/verl_s{i}.jsonl" for i in range(3)]


def test_trl_vs_verl_three_seeds_each_by_hand_and_as_rliable(seeds, tmp_path, capsys):
    root, tb, trl, verl = seeds
    out = tmp_path / "report"
    rc = main(["compare", *_verl_given(root), "--group", "veRL=v0,v1,v2", "--group", f"TRL=tensorboard:{tb}",
               "--metrics", "policy/entropy,reward/score/mean", "--last", str(LAST), "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 0
    assert "group veRL: 3 runs (v0, v1, v2)" in err and "group TRL: 3 runs" in err
    rows = _rows(out / "groups.csv")
    assert set(rows) == {(g, m) for g in ("TRL", "veRL") for m in ("policy/entropy", "reward/score/mean")}
    for group, runs, key in (("TRL", trl, "entropy"), ("veRL", verl, "actor/entropy")):
        row = rows[(group, "policy/entropy")]
        assert row["runs"] == "3" and row["band"] == "ci"
        finals = [sum(r[key][-LAST:]) / LAST for r in runs]
        # areas by the trapezoid rule on steps 1..n (one step apart)
        areas = [sum((a + b) / 2 for a, b in zip(r[key], r[key][1:])) for r in runs]
        assert float(row["final_mean"]) == pytest.approx(sum(finals) / 3, rel=1e-6)
        assert float(row["auc_mean"]) == pytest.approx(sum(areas) / 3, rel=1e-6)
        for col, values, which in (("final", finals, "mean"), ("final_iqm", finals, "iqm"),
                                   ("auc", areas, "mean"), ("auc_iqm", areas, "iqm")):
            point, (lo, hi) = interval(np.array(values)[:, None], which, reps=2000, seed=0)
            value_col = {"final": "final_mean", "auc": "auc_mean"}.get(col, col)
            assert float(row[value_col]) == pytest.approx(point, rel=1e-6)
            assert (float(row[f"{col}_lo"]), float(row[f"{col}_hi"])) == pytest.approx((lo, hi), rel=1e-5), col
        # unequal lengths: 1 to 3 runs behind a point, said in the table
        assert row["runs_per_point"] == "1-3" and "runs of unequal length" in row["note"]
    # the caveats of each group's runs carried to its aggregate (veRL's entropy is taken before the update)
    assert "[snapshot]" in rows[("veRL", "policy/entropy")]["fidelity"]
    assert "Not the same quantity" in rows[("veRL", "policy/entropy")]["fidelity"]
    assert "groups: 4 aggregates:" in err
    md = (out / "summary.md").read_text()
    assert "## Groups" in md and "approximate in v0 [snapshot]" in md
    html = (out / "report.html").read_text()
    assert "<section id=\"groups\">" in html and "groups chart of policy/entropy" in html
    assert sorted(p.name for p in (out / "charts").glob("groups_*.png")) == ["groups_001_policy_entropy.png",
                                                                            "groups_002_reward_score_mean.png"]
    from trackbridge.compare.plot import PNG_SIZE
    head = (out / "charts" / "groups_001_policy_entropy.png").read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    assert (int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")) == PNG_SIZE


def test_group_by_a_config_key_and_the_iqr_band(seeds, tmp_path, capsys):
    root, tb, trl, verl = seeds
    out = tmp_path / "by"
    rc = main(["compare", f"trl=tensorboard:{tb}", *_verl_given(root), "--group-by", "framework", "--band", "iqr",
               "--metrics", "policy/entropy", "--last", "1", "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 0 and "group framework=trl: 3 runs" in err and "group framework=verl: 3 runs (v0, v1, v2)" in err
    row = _rows(out / "groups.csv")[("framework=verl", "policy/entropy")]
    finals = sorted(r["actor/entropy"][-1] for r in verl)
    # the IQR of three values by linear interpolation: halfway between the 1st and 2nd, and the 2nd and 3rd
    assert row["band"] == "iqr"
    assert float(row["final_lo"]) == pytest.approx((finals[0] + finals[1]) / 2, rel=1e-6)
    assert float(row["final_hi"]) == pytest.approx((finals[1] + finals[2]) / 2, rel=1e-6)


def test_group_by_a_nested_key_in_the_python_api(seeds):
    root, tb, _trl, _verl = seeds
    res = trackbridge.compare.compare_runs([f"tensorboard:{tb}", *_verl_given(root)], group_by="trainer.algorithm",
                                           metrics="policy/entropy", out=None, doctor=False)
    assert list(res.group_members) == ["trainer.algorithm=grpo"]
    (gm,) = res.groups
    assert len(gm.runs) == 6 and gm.points_range() == (2, 6)         # steps 1-8: all six; 12: one of each
    assert gm.fidelity is not None and gm.fidelity.differs


def test_a_group_of_one_run_says_no_band(seeds, tmp_path, capsys):
    root, *_ = seeds
    rc = main(["compare", *_verl_given(root)[:1], "--group", "solo=v0", "--metrics", "policy/entropy",
               "--out", str(tmp_path / "one")])
    err = capsys.readouterr().err
    assert rc == 0 and "group solo: 1 run (v0); one run: no band" in err
    row = _rows(tmp_path / "one" / "groups.csv")[("solo", "policy/entropy")]
    assert row["final_lo"] == "" and "one run: no band" in row["note"]


@pytest.mark.parametrize("args, says", [
    (["--group", "TRL=v0,nope"], "--group TRL: 'nope' is not the label of a run given, nor a run locator"),
    (["--group", "TRL="], "--group TRL: an empty group"),
    (["--group", "TRL"], "--group TRL: expected LABEL=RUN,RUN,..."),
    (["--group", "A=v0", "--group-by", "seed"], "--group and --group-by: give one of them"),
    (["--group-by", "no.such.key"], "--group-by no.such.key: no run's config has this key"),
    (["--group", "A=v0", "--last", "0"], "--last 0: must be at least 1"),
])
def test_bad_groups_are_one_line_naming_the_argument(seeds, tmp_path, capsys, args, says):
    root, *_ = seeds
    rc = main(["compare", *_verl_given(root)[:1], *args, "--out", str(tmp_path / "bad")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert err[-1].startswith(f"trackbridge compare: {says}"), err
    assert not any("Traceback" in line for line in err)
