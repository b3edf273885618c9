"""Real public logs translate with nothing unmapped but the keys projects added themselves; detection names the right
framework, trainer and releases (also for a release left out of the tables); exact entries round-trip."""
from __future__ import annotations

import json
import math
import random

import pytest
import yaml

from trackbridge.detect import detect
from trackbridge.pipeline import Translator
from trackbridge.schema.loader import build_registry, load_registry, shipped_files
from trackbridge.schema.model import APPROXIMATE

from _support import DATA

LOGS = DATA / "public-logs"

# file -> (expected framework, trainer, keys the project added itself and why they stay unmapped)
EXPECTED = {
    "01_verl.json": ("verl", "ppo", {}),
    "10_verl.json": ("verl", "ppo", {
        "rollout/": "the project's own rollout statistics (not veRL's)",
        "reward_extra_info/": "the project's reward function returns these extra fields (veRL passes them through)",
    }),
    "04_trl_grpo.json": ("trl", "grpo", {}),
    "05_trl_grpo.json": ("trl", "grpo", {}),
    "14_trl_grpo.json": ("trl", "grpo", {}),
    "16_trl_grpo.json": ("trl", "grpo", {
        "completion_length": "Unsloth's own key; in this Unsloth release it holds the max length, so it is reported "
                             "as a conflict with completions/mean_length instead of being merged",
    }),
    "07_trl_dpo.json": ("trl", "dpo", {}),
    "12_trl_ppo.json": ("trl", "ppo", {}),
}


@pytest.fixture(scope="module")
def reg():
    return load_registry()


def _rows(name):
    path = LOGS / name
    data = json.loads(path.read_text())
    return data["keys"], [{k: v for k, v in r.items() if k != "step"} for r in data["rows"]]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_detection_names_framework_and_trainer(reg, name):
    keys, _ = _rows(name)
    fw, trainer, _ = EXPECTED[name]
    det = detect([k for k in keys if k != "step"], reg)
    assert det.spec is not None, det.reason
    assert det.spec.framework == fw and det.spec.trainer == trainer, det.source
    assert det.confidence > 0.5


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_public_logs_translate_with_only_project_keys_unmapped(reg, name):
    _, rows = _rows(name)
    allowed = EXPECTED[name][2]
    tr = Translator("auto", "canonical", registry=reg)
    unmapped: set[str] = set()
    for row in rows:
        res = tr.translate(row)
        unmapped |= set(res.unmapped) | set(res.conflicts)
        for k, v in row.items():          # every value survives: renamed, kept once (same value), or passed through
            if k in res.unmapped or k in res.conflicts:
                assert res.metrics[k] == v or (v != v and res.metrics[k] != res.metrics[k])
            else:
                out = res.renamed.get(k, k)
                assert out in res.metrics
    stray = {k for k in unmapped if not any(k.startswith(p) for p in allowed)}
    assert not stray, f"{name}: unmapped keys that the framework itself logs: {sorted(stray)}"


def test_unsloth_mixed_keys_detected_as_grpo(reg):
    """Unsloth's patched GRPO logs the old `completion_length` next to the v0.17+ names."""
    for name in ("04_trl_grpo.json", "16_trl_grpo.json"):
        keys, rows = _rows(name)
        assert "completion_length" in keys and "completions/mean_length" in keys
        det = detect([k for k in keys if k != "step"], reg)
        assert (det.spec.framework, det.spec.trainer) == ("trl", "grpo")
        res = Translator(det.source, "canonical", registry=reg).translate(rows[0])
        assert res.metrics["response/length/mean"] == rows[0]["completions/mean_length"]


def test_cannot_tell_is_said(reg):
    det = detect(["my/own/metric", "another_one"], reg)
    assert det.spec is None and det.source == "unknown" and "no key is logged by any framework" in det.reason
    res = Translator("auto", "canonical", registry=reg).translate({"my/own/metric": 1.0})
    assert res.unmapped == ["my/own/metric"] and res.metrics == {"my/own/metric": 1.0}
    assert any("names passed through unchanged" in n for n in res.notes)


# ----------------------------------------------------------------------------------------- leave one release out
def _keys_at(fw, trainer, idx):
    """A key set the trainer logs at release idx (templates filled with sample values)."""
    sample = {"reward_fn": "accuracy_reward", "stage": "gen", "data_source": "openai/gsm8k", "var": "acc", "n": "4"}
    out = set()
    for e in fw.entries:
        if e.trainers is not None and trainer not in e.trainers:
            continue
        if not (e.since <= idx <= e.until) or not e.reverse or e.when:
            continue
        if e.key_template is None:
            out.add(e.key)
        elif set(e.key_template.names) <= set(sample):
            out.add(e.key_template.fill(sample))
    return out


def _without_release(tmp_path, framework, release):
    """The shipped mappings with one release of one framework removed, as if the tables had never seen it."""
    files = []
    for p in shipped_files():
        if p.stem != framework:
            files.append(p)
            continue
        doc = yaml.safe_load(p.read_text())
        rel = doc["releases"]
        i = rel.index(release)
        prev, nxt = rel[i - 1], rel[i + 1] if i + 1 < len(rel) else None
        kept = []
        for e in doc["entries"]:
            since, until = e.get("since"), e.get("until")
            if since == release and until == release:
                continue                            # logged only by the left-out release
            if since == release:
                e["since"] = nxt
            if until == release:
                e["until"] = prev
            if e.get("renamed_from"):
                e.pop("renamed_from")
            kept.append(e)
        for c in doc.get("config", []):
            if c.get("since") == release:
                c["since"] = nxt
            if c.get("until") == release:
                c["until"] = prev
        for a in (doc.get("aliases") or {}).values():
            for k in ("since", "until"):
                if a and a.get(k) == release:
                    a[k] = prev if k == "until" else nxt
        doc["entries"] = kept
        doc["releases"] = [r for r in rel if r != release]
        out = tmp_path / p.name
        out.write_text(yaml.safe_dump(doc, sort_keys=False))
        files.append(out)
    return build_registry(files, [])


@pytest.mark.parametrize("framework, trainer, release", [
    ("trl", "grpo", "v0.17.0"), ("trl", "grpo", "v0.20.0"), ("trl", "dpo", "v0.29.0"), ("trl", "sft", "v0.16.0"),
    ("trl", "ppo_legacy", "v0.5.0"), ("trl", "kto", "v0.12.0"), ("verl", "ppo", "v0.4.1"),
    ("verl", "ppo", "v0.6.0"), ("openrlhf", "ppo", "v0.8.3"),
])
def test_detect_a_release_left_out_of_the_tables(reg, tmp_path, framework, trainer, release):
    fw = reg.frameworks[framework]
    idx = fw.releases.index(release)
    keys = _keys_at(fw, trainer, idx)
    assert keys
    reduced = _without_release(tmp_path, framework, release)
    det = detect(keys, reduced)
    assert det.spec is not None and det.spec.framework == framework, det.source
    assert det.spec.trainer in (trainer, None) or trainer in det.reason, det.source
    rfw = reduced.frameworks[framework]
    lo, hi = rfw.release_name(int(det.spec.lo)), rfw.release_name(int(det.spec.hi))
    neighbours = {fw.releases[idx - 1], fw.releases[min(idx + 1, len(fw.releases) - 1)]}
    assert any(rfw.releases.index(lo) <= rfw.releases.index(n) <= rfw.releases.index(hi) for n in neighbours), \
        f"{release} left out: detected {det.source}, neighbours {neighbours}"


# ----------------------------------------------------------------------------------------- round trips
@pytest.mark.parametrize("framework", ["trl", "verl", "openrlhf"])
def test_round_trip_identity_for_exact_entries(reg, framework):
    """framework@v -> canonical -> framework@v is the identity for every reversible entry that is exact (legacy) or
    states its reduction (its fidelity is judged per translation; the name round trip does not depend on it), sampled
    releases and values."""
    fw = reg.frameworks[framework]
    rng = random.Random(7)
    sample = {"reward_fn": "acc_reward", "stage": "gen", "data_source": "openai/gsm8k", "var": "acc", "n": "4",
              "stat": "mean", "name": "x1", "i": "0", "metric": "m", "method": "gkd", "teacher_id": "t0",
              "policy_mode": "on", "func": "f"}
    checked = 0
    trainers = list(fw.trainers) or [None]
    for idx in sorted({0, len(fw.releases) // 3, len(fw.releases) // 2, len(fw.releases) - 1}):
        rel = fw.releases[idx]
        for trainer in trainers:
            keys = {}
            for e in fw.entries:
                # a name's round trip does not depend on its fidelity: hand-written exact entries and entries that
                # state their reduction (fidelity computed per translation) alike
                if e.fidelity == APPROXIMATE or not e.reverse or e.when or not e.applies(trainer, idx, idx):
                    continue
                if e.trainers is None and trainer is not None and any(
                        o.key == e.key and o.trainers and trainer in o.trainers for o in fw.entries):
                    continue
                key = e.key if e.key_template is None else e.key_template.fill(
                    {n: sample.get(n, "v") for n in e.key_template.names})
                keys[key] = rng.uniform(-100, 100)
            if not keys:
                continue
            spec = f"{framework}/{trainer}@{rel}" if trainer else f"{framework}@{rel}"
            canon = Translator(spec, "canonical", registry=reg).translate(keys)
            back = Translator("canonical", spec, registry=reg).translate(canon.metrics)
            for k, v in keys.items():
                if k in canon.conflicts:
                    continue
                assert k in back.metrics, f"{spec}: {k!r} -> {canon.renamed.get(k)} -> not back"
                assert math.isclose(back.metrics[k], v, rel_tol=1e-12, abs_tol=1e-12), (spec, k)
                checked += 1
    assert checked > 50
