"""Detection weighs evidence (issue 29): a run's own keys (a fork's, a subclass's, custom rewards) are evidence of
nothing and must not dilute the framework's keys; names several frameworks log weigh little; a run config's
framework keys count for that framework; a tie is said. The key sets are real: the TRL 1.16.0 GRPO run of
tests/data/frameworks/trl-rl-detection-sets.json and the public logs of tests/data/public-logs (provenance in
tests/data/README.md); the added keys stand for a project's own metrics, which no framework logs."""
from __future__ import annotations

import json

import pytest

from trackbridge.detect import MIN_STRONG, detect
from trackbridge.pipeline import Translator
from trackbridge.schema.loader import load_registry

from _support import DATA

SETS = json.loads((DATA / "frameworks" / "trl-rl-detection-sets.json").read_text())["sets"]
PUBLIC = sorted((DATA / "public-logs").glob("*.json"))


@pytest.fixture(scope="module")
def reg():
    return load_registry()


def own_keys(n: int) -> list[str]:
    """Keys of a project's own code: its namespace and plain names no framework logs."""
    return [f"myproj/diag_{i}" for i in range(n // 2)] + [f"custom_metric_{i}" for i in range(n - n // 2)]


@pytest.mark.parametrize("extra", [0, 20, 25, 60])
def test_a_fork_with_its_own_keys_keeps_its_framework(reg, extra):
    keys = SETS["grpo_beta@v1.16.0"]["keys"]
    det = detect(keys + own_keys(extra), reg)
    assert det.spec is not None, det.reason
    assert (det.spec.framework, det.spec.trainer) == ("trl", "grpo"), det.source
    assert det.explained == len(keys)
    base = detect(keys, reg)
    assert det.confidence == pytest.approx(base.confidence), "own keys lowered the confidence"
    assert (det.spec.lo, det.spec.hi) == (base.spec.lo, base.spec.hi)
    if extra:
        assert f"{extra} logged by no framework" in det.reason


def test_the_fork_is_translated_and_its_own_keys_pass_through(reg):
    keys = SETS["grpo_beta@v1.16.0"]["keys"]
    row = {k: 0.5 for k in keys + own_keys(20)}
    res = Translator("auto", "canonical", registry=reg).translate(row)
    assert res.metrics["response/length/mean"] == 0.5          # completions/mean_length, TRL's
    assert res.metrics["myproj/diag_3"] == 0.5 and "myproj/diag_3" in res.unmapped
    assert "kl/ref/k3" in res.metrics


@pytest.mark.parametrize("path", PUBLIC, ids=lambda p: p.name)
def test_every_public_log_keeps_its_detection_beside_twice_as_many_own_keys(reg, path):
    doc = json.loads(path.read_text())
    keys = list(doc["keys"])
    base = detect(keys, reg)
    assert base.spec is not None, (path.name, base.reason)
    det = detect(keys + own_keys(2 * len(keys)), reg)
    assert det.source == base.source, (path.name, det.reason)


def test_generic_names_alone_name_no_framework_when_most_keys_are_unknown(reg):
    """`train/loss`, `train/grad_norm`, `train/lr` are logged under those names by several frameworks: with 30 keys
    nobody logs beside them, they are no evidence of any one (fewer than MIN_STRONG keys only one names)."""
    det = detect(["train/loss", "train/grad_norm", "train/lr"] + own_keys(30), reg)
    assert det.spec is None and det.source == "unknown", det.reason
    assert str(MIN_STRONG) in det.reason


def test_the_readme_logger_snippet_is_verl(reg):
    """README 'Log to several trackers at once': two veRL keys (ROLL logs the same two names) and a veRL config key
    (algorithm.kl_ctrl.kl_coef: verl/trainer/config/ppo_trainer.yaml, mappings/verl.yaml `config:`)."""
    det = detect(["actor/pg_loss", "critic/score/mean"], reg, config={"algorithm": {"kl_ctrl": {"kl_coef": 0.001}}})
    assert det.spec is not None and det.spec.framework == "verl", det.to_json()
    assert "config" in det.reason


def test_a_tie_between_frameworks_is_said(reg):
    det = detect(["actor/pg_loss", "critic/score/mean"], reg)
    assert det.spec is not None and det.spec.framework == "verl", det.to_json()
    assert "tie" in det.reason and "roll" in det.reason
    assert det.confidence < 0.6


def test_absent_always_keys_date_a_log_and_its_meanings(reg):
    """tests/data/real/trl/07_issue3857_grpo.log (TRL 0.18-0.19, trl issue 3857): no `entropy` (logged on every GRPO
    row from v0.20.0) and `num_tokens` present (from v0.16.0): the range ends at v0.19.1, so `reward_std` is the mean
    of the group std (trl/trainer/grpo_trainer.py@v0.21.0), not the batch std it became at v0.27.0."""
    from trackbridge.read.inputs import open_runs
    (run,) = open_runs(str(DATA / "real" / "trl" / "07_issue3857_grpo.log"), rows=True)
    pipe = run.resolve()
    det = pipe.translator.detection
    fw = reg.frameworks["trl"]
    assert det.spec.trainer == "grpo"
    assert fw.release_name(int(det.spec.hi)) == "v0.19.1" and fw.release_name(int(det.spec.lo)) == "v0.18.0"
    rec = next(iter(run.records()))
    out = pipe.translator.translate(dict(rec.metrics))
    assert "reward/group_std/mean" in out.metrics and "reward/score/std" not in out.metrics
