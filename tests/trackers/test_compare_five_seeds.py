"""Issue 34's "Done when": a five-seed TRL GRPO group and a five-seed veRL group compare with intervals that match
rliable's on the same data.

* TRL: five real GRPOTrainer runs of TRL 1.16.0 (one config, seeds 0..4), their ``trainer_state.json`` committed
  under tests/data/seeds/ (made by tests/_support/seed_runs.py, by hand; tests/data/seeds/README.md);
* veRL: five seeds whose step metrics veRL 0.9.1's own code computes (``compute_data_metrics``,
  ``compute_timing_metrics``, ``agg_loss`` on ``entropy_from_logits``, GRPO advantages) and whose file veRL's own
  ``Tracking(default_backend=["file"])`` writes, here, as its trainer logs (seed_runs.write_verl_seed).

``trackbridge compare --group TRL=... --group veRL=...`` over the canonical names both log; every group's final
performance and area under the curve, their mean and IQM and the intervals of both, are checked against rliable's
own functions on the same per-run numbers (tests/_support/rliable_ref.py), and by hand from the values in the files;
the fidelity caveats of each group's runs are carried to its aggregates."""
from __future__ import annotations

import csv
import json
import math

import pytest

from trackbridge.cli import main
from trackbridge.compare import groups as G

from _support import seed_runs as S
from _support.rliable_ref import interval

np = pytest.importorskip("numpy")
pytest.importorskip("matplotlib")
pytest.importorskip("verl")
torch = pytest.importorskip("torch")

LAST = 10
# canonical name -> (TRL GRPO's key, veRL's key): what both frameworks log
METRICS = {"reward/score/mean": ("reward", "critic/score/mean"),
           "response/length/mean": ("completions/mean_length", "response_length/mean"),
           "policy/entropy": ("entropy", "actor/entropy")}


def _trl_curves(seed: int) -> dict[str, tuple[list[float], list[float]]]:
    """canonical name -> (steps, values) of one committed TRL run, read from the Trainer's log_history."""
    rows = [r for r in json.loads((S.trl_dir(seed) / "trainer_state.json").read_text())["log_history"]
            if "reward" in r]                             # the training rows (not the closing train_runtime row)
    return {m: ([float(r["step"]) for r in rows], [float(r[k]) for r in rows]) for m, (k, _) in METRICS.items()}


def _verl_curves(path) -> dict[str, tuple[list[float], list[float]]]:
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    return {m: ([float(d["step"]) for d in lines], [float(d["data"][k]) for d in lines])
            for m, (_, k) in METRICS.items()}


@pytest.fixture(scope="module")
def verl_files(tmp_path_factory):
    root = tmp_path_factory.mktemp("verl-seeds")
    logged = {s: S.write_verl_seed(root / f"verl_grpo_s{s}.jsonl", s) for s in S.SEEDS}
    return root, logged


def test_the_committed_trl_seeds_are_five_real_grpo_runs_of_one_config():
    configs = [json.loads((S.trl_dir(s) / "config.json").read_text()) for s in S.SEEDS]
    assert len(configs) == 5
    assert {c["trl"] for c in configs} == {"1.16.0"} and {c["trainer_class"] for c in configs} == {"trl.GRPOTrainer"}
    assert [c["seed"] for c in configs] == [0, 1, 2, 3, 4]
    same = [{k: v for k, v in c.items() if k not in ("seed", "wall_s")} for c in configs]
    assert all(c == same[0] for c in same)                # one setting: only the seed differs
    curves = [_trl_curves(s) for s in S.SEEDS]
    for c in curves:
        steps, rewards = c["reward/score/mean"]
        assert steps == [float(i) for i in range(1, S.TRL_STEPS + 1)] and len(rewards) == S.TRL_STEPS
    assert len({tuple(c["reward/score/mean"][1]) for c in curves}) == 5     # five different runs


def test_the_verl_files_are_verls_own_file_logger_output(verl_files):
    root, logged = verl_files
    assert sorted(p.name for p in root.iterdir()) == [f"verl_grpo_s{s}.jsonl" for s in S.SEEDS]
    for s in S.SEEDS:
        lines = [json.loads(line) for line in (root / f"verl_grpo_s{s}.jsonl").read_text().splitlines()]
        assert len(lines) == S.VERL_STEPS == len(logged[s])
        assert [set(d) for d in lines] == [{"step", "data"}] * S.VERL_STEPS
        assert [d["step"] for d in lines] == list(range(1, S.VERL_STEPS + 1))
        assert [d["data"] for d in lines] == logged[s]
    # one step by hand: veRL's functions computed what the batch holds
    batch, logits = S._verl_step(3, 7)
    m = logged[3][6]
    scores = batch.batch["token_level_scores"].sum(-1)
    assert m["critic/score/mean"] == pytest.approx(float(scores.mean()), abs=1e-7)
    assert m["response_length/mean"] == pytest.approx(float(batch.batch["response_mask"].sum(-1).float().mean()))
    p = torch.softmax(logits.double(), -1)
    ent = -(p * torch.log(p)).sum(-1)
    mask = batch.batch["response_mask"].double()
    assert m["actor/entropy"] == pytest.approx(float((ent * mask).sum() / mask.sum()), rel=1e-5)
    assert m["training/global_step"] == 7 and "timing_s/step" in m and "perf/throughput" in m


def _rows(path):
    with open(path, newline="", encoding="utf-8") as fh:
        return {(r["group"], r["metric"]): r for r in csv.DictReader(fh)}


def _iqm(values):
    """The interquartile mean of five values by hand: rliable's 25% trimmed mean drops one at each end."""
    mid = sorted(values)[1:-1]
    return sum(mid) / 3


def test_five_trl_grpo_seeds_vs_five_verl_seeds_match_rliable(verl_files, tmp_path, capsys):
    root, _ = verl_files
    trl = [f"t{s}={S.trl_dir(s) / 'trainer_state.json'}" for s in S.SEEDS]
    verl = [f"v{s}={root / f'verl_grpo_s{s}.jsonl'}" for s in S.SEEDS]      # plain paths: veRL's file, as written
    out = tmp_path / "report"
    rc = main(["compare", *trl, *verl, "--group", "TRL=t0,t1,t2,t3,t4", "--group", "veRL=v0,v1,v2,v3,v4",
               "--metrics", ",".join(METRICS), "--last", str(LAST), "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 0, err
    assert "group TRL: 5 runs (t0, t1, t2, t3, t4)" in err and "group veRL: 5 runs (v0, v1, v2, v3, v4)" in err
    assert err.count("translated from trl/grpo@") == 5 and err.count("translated from verl/ppo@") == 5
    assert "groups: 6 aggregates:" in err
    rows = _rows(out / "groups.csv")
    assert set(rows) == {(g, m) for g in ("TRL", "veRL") for m in METRICS}

    given = {"TRL": [_trl_curves(s) for s in S.SEEDS],
             "veRL": [_verl_curves(root / f"verl_grpo_s{s}.jsonl") for s in S.SEEDS]}
    assert G.REPS == 2000 and G.SEED == 0          # the report's resamples and seed (README: "2,000 ... seed 0")
    checked = []
    for (group, metric), row in sorted(rows.items()):
        runs = given[group]
        assert len(runs) == 5 and row["runs"] == "5" and row["band"] == "ci" and row["runs_per_point"] == "5"
        finals = [sum(r[metric][1][-LAST:]) / LAST for r in runs]
        areas = [sum((x1 - x0) * (y0 + y1) / 2 for x0, x1, y0, y1 in zip(xs, xs[1:], ys, ys[1:]))
                 for xs, ys in (r[metric] for r in runs)]
        assert len(finals) == len(areas) == 5 and all(map(math.isfinite, finals + areas))
        # by hand: the means and the IQMs of the five runs' numbers
        assert float(row["final_mean"]) == pytest.approx(sum(finals) / 5, rel=1e-9)
        assert float(row["auc_mean"]) == pytest.approx(sum(areas) / 5, rel=1e-9)
        assert float(row["final_iqm"]) == pytest.approx(_iqm(finals), rel=1e-9)
        assert float(row["auc_iqm"]) == pytest.approx(_iqm(areas), rel=1e-9)
        # rliable's own point estimates and stratified bootstrap intervals on the same per-run numbers
        for col, value_col, values, which in (("final", "final_mean", finals, "mean"),
                                              ("final_iqm", "final_iqm", finals, "iqm"),
                                              ("auc", "auc_mean", areas, "mean"),
                                              ("auc_iqm", "auc_iqm", areas, "iqm")):
            point, (lo, hi) = interval(np.array(values)[:, None], which, reps=G.REPS, seed=G.SEED)
            got = (float(row[value_col]), float(row[f"{col}_lo"]), float(row[f"{col}_hi"]))
            assert got == pytest.approx((point, lo, hi), rel=1e-9), (group, metric, col)
            assert lo < hi                                  # a real interval: the five seeds differ
            checked.append((group, metric, col))
    assert len(checked) == 6 * 4

    # the caveats of each group's runs, carried to its aggregate, run by run
    fid = {k: r["fidelity"] for k, r in rows.items()}
    for s in S.SEEDS:
        assert f"in t{s} (completions/mean_length)" in fid[("TRL", "response/length/mean")]
        assert f"in v{s} (actor/entropy)" in fid[("veRL", "policy/entropy")]
    # TRL's reward is the canonical reward score in every seed (its entries proven at each release range,
    # tests/frameworks/test_proof_trl_grpo*.py): no caveat on its aggregate, and none invented for it
    assert fid[("TRL", "reward/score/mean")] == "", fid[("TRL", "reward/score/mean")]
    assert "[tool_tokens]" in fid[("TRL", "response/length/mean")]
    assert "taken before the update" in fid[("veRL", "policy/entropy")] and "[snapshot]" in fid[("veRL",
                                                                                                 "policy/entropy")]
    assert "[processes]" in fid[("TRL", "policy/entropy")]
    assert "Not the same quantity" not in fid[("veRL", "reward/score/mean")]
    md = (out / "summary.md").read_text()
    assert "## Groups" in md and "TRL" in md and "veRL" in md
    assert sorted(p.name for p in (out / "charts").glob("groups_*.png")) == [
        "groups_001_reward_score_mean.png", "groups_002_response_length_mean.png", "groups_003_policy_entropy.png"]
