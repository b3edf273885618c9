"""One pipeline, one meaning: the same records give the same names, values, derived values, derived marks and
fidelity on every path a record can take (issue "One pipeline, one meaning").

Paths: `trackbridge translate --derive` (CLI), `init(names=X)` with the trackers read back by trackbridge's readers,
`replay --names X` of that run's spool, `migrate --names X --derive` of the stored run, and `compare` (canonical).
Inputs: the real runs shipped in examples/ (a TRL GRPO trainer_state.json, a TRL DPO wandb CSV export, a TRL PPO
console log, a veRL console log), each given with the trainer left out.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

import trackbridge
from trackbridge.migrate import migrate
from trackbridge.sync.replay import iter_spool, replay
from trackbridge.trackers import open_source

from _support import ROOT

EX = ROOT / "examples"

SOURCES = {   # name: (locator of the stored run, source spec with the trainer left out)
    "grpo": (f"trainer-state:{EX / 'trl_grpo_trainer_state.json'}", "trl@1.16.0"),
    "dpo": (f"csv:{EX / 'trl_dpo_wandb_export.csv'}", "trl"),
    "ppo": (f"console:{EX / 'trl_ppo_console.log'}", "trl@0.12.0"),
    "verl": (f"console:{EX / 'verl_console.log'}", "verl"),
}
TARGETS = ["canonical", "trl@1.16.0", "trl@0.12.0", "verl", "openrlhf"]


def _raw_records(loc):
    return [rec for run in open_source(loc).runs() for rec in run.records()]


def _stored_config(loc):
    """The run config the stored run holds (trainer_state.json's logging_steps ...): what every path that reads the
    stored run (CLI translate, migrate, compare) judges fidelity with."""
    return next((dict(run.info.config) for run in open_source(loc).runs()), {})


def _points(loc):
    """(step, name) -> value, the set of derived (step, name), and the run info, read back with trackbridge."""
    values, derived, info = {}, set(), None
    for run in open_source(loc).runs():
        info = run.info
        for rec in run.records():
            for k, v in rec.metrics.items():
                if k.startswith("trackbridge/"):
                    continue
                values[(rec.step, k)] = v
            derived |= {(rec.step, d) for d in rec.derived}
    return values, derived, info


def _same(a, b, rel=1e-6):
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        if math.isnan(a) and math.isnan(b):
            return True
        return math.isclose(a, b, rel_tol=rel, abs_tol=1e-12)
    return a == b


def _assert_same_points(ref, got, what, rel=1e-6):
    ref_vals, ref_der = ref
    vals, der = got
    assert set(vals) == set(ref_vals), (
        f"{what}: names differ; only in reference: {sorted(set(ref_vals) - set(vals))[:8]}, "
        f"only here: {sorted(set(vals) - set(ref_vals))[:8]}")
    bad = [(k, ref_vals[k], vals[k]) for k in ref_vals if not _same(ref_vals[k], vals[k], rel)]
    assert not bad, f"{what}: values differ: {bad[:5]}"
    assert der == ref_der, f"{what}: derived marks differ: {sorted(der ^ ref_der)[:8]}"


def _cli(tmp_path, loc, source, target):
    report = tmp_path / "report.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-m", "trackbridge", "translate", "--from", source, "--to", target, "--derive",
                        "--report-json", str(report), loc], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    vals = {}
    for line in r.stdout.splitlines():
        obj = json.loads(line)
        if "metrics" in obj:
            step, metrics = obj["step"], obj["metrics"]
        else:
            step = obj.pop("step", None)
            metrics = obj
        for k, v in metrics.items():
            vals[(step, k)] = v
    rep = json.loads(report.read_text())
    return vals, rep


@pytest.fixture(scope="module")
def reference():
    """Every (input, target) through the library's translate path: the expected points, derived marks, fidelity."""
    out = {}
    for name, (loc, source) in SOURCES.items():
        raw = _raw_records(loc)
        for target in TARGETS:
            out[(name, target)] = reference_for(raw, source, target, _stored_config(loc))
    return out


def check_cli(tmp_path, loc, source, target, ref):
    vals, rep = _cli(tmp_path, loc, source, target)
    ref_vals, ref_der, ref_approx, _ = ref
    assert set(vals) == set(ref_vals), sorted(set(vals) ^ set(ref_vals))[:8]
    assert all(_same(ref_vals[k], vals[k]) for k in ref_vals)
    assert set(rep.get("derived", [])) == {d for _s, d in ref_der}
    assert rep["approximate"] == ref_approx


@pytest.mark.parametrize("name", list(SOURCES))
@pytest.mark.parametrize("target", TARGETS)
def test_cli_translate_matches(tmp_path, reference, name, target):
    loc, source = SOURCES[name]
    check_cli(tmp_path, loc, source, target, reference[(name, target)])


def check_logger_replay_migrate(tmp_path, loc, source, target, raw, ref):
    """``raw`` (the stored run's records, as ``loc`` reads) logged with init(names=target), then replayed, then the
    stored run migrated: each read back must equal ``ref`` (translate()'s points, marks and fidelity)."""
    ref_vals, ref_der, ref_approx = ref[:3]
    # 1. the logger: what a trainer logs, with names=target, into a TensorBoard folder and the spool
    tb = tmp_path / "tb"
    run = trackbridge.init(project="p", name=f"run-{target}", run_id="r1", spool=str(tmp_path / "spool"),
                           sinks=[f"tensorboard:{tb}"], source=source, names=target)
    for rec in raw:
        run.log(dict(rec.metrics), step=rec.step)
    run.finish()
    # the logger stamps each record with the time it was logged (the stored run has none): rates derived from wall
    # time exist on this path, so its reference is translate() given the same wall times, read from the spool
    spool = tmp_path / "spool" / "r1.jsonl"
    times = [rec.wall_time for _seq, rec in iter_spool(spool)]
    assert len(times) == len(raw)
    tr = trackbridge.Translator(source, target, derive=True)
    log_vals, log_der, log_approx = {}, set(), {}
    for rec, wt in zip(raw, times):
        res = tr.translate(rec.metrics, step=rec.step, wall_time=wt)
        log_vals.update({(rec.step, k): v for k, v in res.metrics.items()})
        log_der |= {(rec.step, d) for d in res.derived}
        log_approx.update(res.approximate)
    vals, der, info = _points(f"tensorboard:{tb}")
    _assert_same_points((log_vals, log_der), (vals, der), f"init(names={target}) -> tensorboard", rel=1e-6)
    differ = {k: (info.approximate.get(k), log_approx.get(k)) for k in {*info.approximate, *log_approx}
              if info.approximate.get(k) != log_approx.get(k)}
    assert not differ, ("fidelity stored with the tracker differs from translate()'s", differ)
    # 2. replay of the spool into another tracker under the same names
    rdir = tmp_path / "replayed"
    replay(spool, f"jsonl:{rdir}", names=target)
    vals, der, _ = _points(f"jsonl:{rdir}")
    _assert_same_points((log_vals, log_der), (vals, der), f"replay --names {target}")
    # 3. migration of the stored run
    mdir = tmp_path / "migrated"
    migrate(loc, f"jsonl:{mdir}", source=source, names=target, derive=True, progress=False)
    vals, der, minfo = _points(f"jsonl:{mdir}")
    _assert_same_points((ref_vals, ref_der), (vals, der), f"migrate --names {target}")
    assert minfo.approximate == ref_approx


def reference_for(raw, source, target, config=None):
    tr = trackbridge.Translator(source, target, derive=True, config=config)
    vals, der, approx = {}, set(), {}
    for rec in raw:
        res = tr.translate(rec.metrics, step=rec.step, wall_time=rec.wall_time)
        vals.update({(rec.step, k): v for k, v in res.metrics.items()})
        der |= {(rec.step, d) for d in res.derived}
        approx.update(res.approximate)
    return vals, der, approx, tr.source


@pytest.mark.parametrize("name", list(SOURCES))
@pytest.mark.parametrize("target", TARGETS)
def test_logger_replay_migrate_match(tmp_path, reference, name, target):
    loc, source = SOURCES[name]
    check_logger_replay_migrate(tmp_path, loc, source, target, _raw_records(loc), reference[(name, target)])


@pytest.mark.parametrize("name", list(SOURCES))
def test_compare_matches(tmp_path, reference, name):
    loc, source = SOURCES[name]
    check_compare(name, loc, source, reference[(name, "canonical")])


def check_compare(name, loc, source, ref):
    from trackbridge.compare import compare_runs
    ref_vals, ref_der, ref_approx, ref_source = ref
    res = compare_runs([f"{name}={loc}?from={source}"], out=None)
    run = res.runs[0]
    vals = {(r.step, k): v for r in run.records for k, v in r.metrics.items()}
    der = {(r.step, d) for r in run.records for d in r.derived}
    _assert_same_points((ref_vals, ref_der), (vals, der), "compare")
    assert run.approximate == ref_approx
    assert run.source == ref_source.split(" (")[0]


# -- framework -> canonical -> the same framework, trainer left out on both sides ---------------------------------
ROWS = {
    "trl@1.16.0": {"reward": 0.5, "reward_std": 0.2, "kl": 0.01, "completions/mean_length": 50.0,
                   "clip_ratio/low_mean": 0.0, "clip_ratio/high_mean": 0.01, "clip_ratio/region_mean": 0.01,
                   "grad_norm": 1.0, "learning_rate": 1e-6, "loss": 0.1, "entropy": 0.5, "rewards/acc/mean": 0.3,
                   "rewards/acc/std": 0.1, "frac_reward_zero_std": 0.1, "num_tokens": 1000.0},
    "trl@0.8.1": {"rewards/chosen": 1.25, "rewards/rejected": -0.5, "rewards/accuracies": 0.75,
                  "rewards/margins": 1.75, "logps/chosen": -20.0, "logps/rejected": -25.0, "loss": 0.6},
    "trl@0.12.0": {"objective/kl": 6.8, "objective/entropy": 114.4, "objective/non_score_reward": -0.34,
                   "objective/rlhf_reward": 2.02, "objective/scores": 2.36, "policy/approxkl_avg": 0.0027,
                   "policy/clipfrac_avg": 0.0093, "loss/policy_avg": -0.0032, "loss/value_avg": 0.347,
                   "val/clipfrac_avg": 0.0048, "policy/entropy_avg": 1.11, "val/ratio": 0.966},
    "verl@0.4.1": {"actor/pg_loss": 0.12, "actor/ppo_kl": 0.001, "actor/entropy": 0.6, "actor/grad_norm": 0.9,
                   "actor/lr": 1e-6, "actor/pg_clipfrac": 0.01, "critic/score/mean": 0.4, "critic/score/max": 1.0,
                   "critic/rewards/mean": 0.38, "response_length/mean": 210.0, "timing_s/step": 30.5,
                   "timing_s/gen": 12.0, "global_seqlen/min": 1000.0, "global_seqlen/max": 1400.0},
}


@pytest.mark.parametrize("spec", list(ROWS))
def test_round_trip_with_trainer_left_out(spec):
    row = ROWS[spec]
    canon = trackbridge.translate(row, source=spec)
    assert not canon.unmapped, canon.unmapped
    back = trackbridge.translate(canon.metrics, source="canonical", target=spec)
    assert back.metrics == row, {k: v for k, v in back.metrics.items() if row.get(k) != v}
    direct = trackbridge.translate(row, source=spec, target=spec)
    assert direct.metrics == row and not direct.approximate


# -- derived values under the target framework's names ------------------------------------------------------------
DERIVED = [
    ("trl/dpo@0.8.1", {"rewards/chosen": 1.25, "rewards/rejected": -0.5}, "rewards/margins", 1.75),
    ("trl/grpo@1.16.0", {"clip_ratio/low_mean": 0.02, "clip_ratio/high_mean": 0.03, "reward": 1.0},
     "clip_ratio/region_mean", 0.05),
    ("verl@0.4.1", {"global_seqlen/min": 1000.0, "global_seqlen/max": 1400.0, "actor/pg_loss": 0.1},
     "global_seqlen/minmax_diff", 400.0),
    ("trl/ppo@0.12.0", {"objective/scores": 2.0, "objective/non_score_reward": -0.3, "objective/kl": 6.0},
     "objective/rlhf_reward", 1.7),
]


@pytest.mark.parametrize("spec,row,name,value", DERIVED, ids=[d[2] for d in DERIVED])
def test_derived_under_the_targets_names(spec, row, name, value):
    res = trackbridge.translate(row, source=spec, target=spec, derive=True)
    assert name in res.metrics and name in res.derived, (res.metrics, res.notes)
    assert math.isclose(res.metrics[name], value, rel_tol=1e-9)
    for k, v in row.items():
        assert res.metrics[k] == v          # a derived value never replaces a logged one


def test_derived_from_approximate_inputs_is_approximate():
    # veRL's actor/ppo_kl is approximate against canonical kl/old_policy/k1 (first DP worker in old releases); a value
    # derived from an approximate input carries the reason along
    res = trackbridge.translate({"critic/score/mean": 0.4, "critic/rewards/mean": 0.38}, source="verl@0.3.0.post1",
                                derive=True)
    for d in res.derived:
        inputs_approx = any(k in res.approximate for k in ("reward/score/mean", "reward/total/mean"))
        if inputs_approx:
            assert d in res.approximate


def test_bad_trainer_or_release_one_line_exit_2(tmp_path):
    f = tmp_path / "x.jsonl"
    f.write_text('{"loss": 1}\n')
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for spec, known in (("trl/nope@1.0.0", "grpo"), ("trl@0.0.1", "v0.2.0")):
        r = subprocess.run([sys.executable, "-m", "trackbridge", "translate", "--from", spec, str(f)],
                           capture_output=True, text=True, env=env, timeout=120)
        assert r.returncode == 2, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1 and known in r.stderr, r.stderr


def test_every_tracker_gets_the_same_names_values_and_marks(tmp_path):
    """init(names=verl) of the veRL run into every tracker, each read back with trackbridge's readers: the same
    points and derived marks as translate() given the same wall times."""
    pytest.importorskip("mlflow")
    pytest.importorskip("wandb")
    pytest.importorskip("trackio")
    loc, source = SOURCES["verl"]
    target = "verl"
    raw = _raw_records(loc)[:40]
    sinks = {"tensorboard": f"tensorboard:{tmp_path / 'tb'}",
             "mlflow": f"mlflow:sqlite:///{tmp_path / 'mlflow.db'}",
             "wandb": f"wandb:{tmp_path / 'wandb'}",
             "trackio": f"trackio:{tmp_path / 'trackio'}?project=p"}
    run = trackbridge.init(project="p", name="verl-all", run_id="r1", spool=str(tmp_path / "spool"),
                           sinks=list(sinks.values()), source=source, names=target)
    for rec in raw:
        run.log(dict(rec.metrics), step=rec.step)
    run.finish()
    times = [rec.wall_time for _seq, rec in iter_spool(tmp_path / "spool" / "r1.jsonl")]
    tr = trackbridge.Translator(source, target, derive=True)
    ref_vals, ref_der = {}, set()
    for rec, wt in zip(raw, times):
        res = tr.translate(rec.metrics, step=rec.step, wall_time=wt)
        ref_vals.update({(rec.step, k): v for k, v in res.metrics.items()})
        ref_der |= {(rec.step, d) for d in res.derived}
    assert ref_der, "the veRL run has derived values (global_seqlen/minmax_diff ...)"
    for kind, loc_ in sinks.items():
        if kind == "trackio":
            loc_ = f"trackio:{tmp_path / 'trackio'}?project=p"
        vals, der, _info = _points(loc_)
        _assert_same_points((ref_vals, ref_der), (vals, der), f"init(names=verl) -> {kind}", rel=1e-6)


def test_compare_detects_a_tensorboard_run_trackbridge_did_not_write(tmp_path):
    """A veRL run in a plain TensorBoard folder (written by tensorboardX, as trainers write it) is detected and
    compared under canonical names with its fidelity notes, as `trackbridge detect` sees it."""
    tbx = pytest.importorskip("tensorboardX")
    from trackbridge.compare import compare_runs
    raw = _raw_records(SOURCES["verl"][0])[:20]
    w = tbx.SummaryWriter(str(tmp_path / "tb"))
    for rec in raw:
        for k, v in rec.metrics.items():
            if isinstance(v, (int, float)):
                w.add_scalar(k, v, rec.step)
    w.close()
    res = compare_runs([f"verl=tensorboard:{tmp_path / 'tb'}"], out=None)
    run = res.runs[0]
    assert run.source.startswith("verl/ppo@"), run.source
    names = {k for r in run.records for k in r.metrics}
    assert "reward/score/mean" in names and "critic/score/mean" not in names
    assert run.approximate, "veRL's approximate translations are reported"


def test_public_names_survive_submodule_imports():
    """`trackbridge.translate` stays the function after `trackbridge.translate` (the module) has been imported."""
    import importlib
    importlib.import_module("trackbridge.translate")
    importlib.import_module("trackbridge.logger")
    assert callable(trackbridge.translate) and callable(trackbridge.init)
    assert trackbridge.translate({"actor/ppo_kl": 0.1}, source="verl@0.4.1").metrics == {"kl/old_policy/k1": 0.1}
