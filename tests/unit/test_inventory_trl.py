"""mappings/trl.yaml against the TRL metric inventory (reference/frameworks/trl-metric-spans.csv, trl-metrics.md).

Self-contained on purpose (PyYAML + a small local template matcher), so it runs before the schema engine exists:
- every key at its first and last release tag has an entry covering that release, for its trainer (except keys
  listed under `internal:`); keys added in v1.10.0-v1.16.0 (read from the released wheels) likewise;
- every canonical target exists in canonical.yaml with the same placeholders; config targets exist too;
- no two reverse entries give one canonical name for the same trainer and release; no key claimed twice;
- the rename pairs of section 0b of trl-metrics.md: same canonical name where it says "yes", different where "no";
- the keys of the public TRL logs (reference/public-logs) all map.
"""
from __future__ import annotations

import csv
import json
import re
from functools import lru_cache

import pytest
import yaml

from _support import DATA, ROOT

REF = DATA
SPANS = REF / "frameworks" / "trl-metric-spans.csv"
LOGS = REF / "public-logs"

ALLOWED_ENTRY_FIELDS = {"key", "canonical", "since", "until", "trainers", "reduce", "transform", "when", "reverse",
                        "source", "note", "renamed_from"}
ALLOWED_TOP = {"format", "framework", "description", "repository", "releases", "aliases", "trainers", "prefixes",
               "config", "levels", "reductions", "internal", "entries", "passthrough"}
_PH = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)(?::(path))?\}")


# ----------------------------------------------------------------------------------------------- loading helpers
@lru_cache(maxsize=None)
def trl():
    return yaml.safe_load((ROOT / "mappings" / "trl.yaml").read_text())


@lru_cache(maxsize=None)
def canonical():
    return yaml.safe_load((ROOT / "mappings" / "canonical.yaml").read_text())


@lru_cache(maxsize=None)
def order():
    return {r: i for i, r in enumerate(trl()["releases"])}


def placeholders(text):
    return {m.group(1) for m in _PH.finditer(text)}


@lru_cache(maxsize=None)
def template_regex(text):
    out, pos = [], 0
    for m in _PH.finditer(text):
        out.append(re.escape(text[pos:m.start()]))
        out.append(".+?" if m.group(2) == "path" else "[^/]+?")
        pos = m.end()
    out.append(re.escape(text[pos:]))
    return re.compile("^" + "".join(out) + "$")


def key_matches(pattern, key):
    return pattern == key if "{" not in pattern else bool(template_regex(pattern).match(key))


def covers(entry, trainer, release):
    o = order()
    if trainer is not None and entry.get("trainers") and trainer not in entry["trainers"]:
        return False
    if trainer is None and entry.get("trainers"):
        return False            # a key every trainer can log needs an unrestricted entry
    lo = o[entry["since"]] if entry.get("since") else 0
    hi = o[entry["until"]] if entry.get("until") else len(o) - 1
    return lo <= o[release] <= hi


def entries_for(key, trainer, release):
    """Entries that translate `key`; exact keys win over templates (as the engine is expected to do)."""
    found = [e for e in trl()["entries"] if key_matches(e["key"], key) and covers(e, trainer, release)]
    exact = [e for e in found if e["key"] == key]
    return exact or found


def strip_split_prefix(key):
    for p in trl().get("prefixes", []):
        if key.startswith(p["prefix"]):
            return key[len(p["prefix"]):], p["split"]
    return key, "train"


def is_internal(key):
    return any(key_matches(p, key) or p == key for p in trl().get("internal", []))


def canonical_of(key, trainer, release):
    key, _ = strip_split_prefix(key)
    found = entries_for(key, trainer, release)
    found = [e for e in found if not e.get("when")] or found      # the default configuration's meaning
    rev = [e for e in found if e.get("reverse", True)]
    return {e["canonical"] for e in (rev or found)}


# ----------------------------------------------------------------------------------------------- the spans file
FILE_TO_TRAINER = {
    "ppo_trainer(legacy)": "ppo_legacy", "ppov2_trainer": "ppo", "ppo_trainer": "ppo", "rloo_trainer": "rloo",
    "grpo_trainer": "grpo", "dpo_trainer": "dpo", "kto_trainer": "kto", "reward_trainer": "reward",
    "sft_trainer": "sft", "iterative_sft_trainer": "iterative_sft", "online_dpo_trainer": "online_dpo",
    "xpo_trainer": "xpo", "nash_md_trainer": "nash_md", "orpo_trainer": "orpo", "cpo_trainer": "cpo",
    "bco_trainer": "bco", "gfpo_trainer": "grpo_variants", "grpo_with_replay_buffer_trainer": "grpo_variants",
    "papo_trainer": "grpo_variants", "gmpo_trainer": "grpo_variants", "dppo_trainer": "grpo_variants",
    "async_grpo_trainer": "async_grpo", "async_rollout_worker": "async_grpo",
    "distillation_trainer": "distillation", "gold_trainer": "distillation", "iw_opd_trainer": "distillation",
    "sdft": "self_distillation", "sdft_trainer": "self_distillation", "sdpo_trainer": "self_distillation",
    "self_distillation_mixin": "self_distillation", "online_rollout_mixin": "self_distillation",
    "tpo_trainer": "tpo", "a2po_trainer": "a2po", "ssd_trainer": "ssd", "ssd_eval": "ssd",
    "ddpo_trainer": "ddpo", "alignprop_trainer": "ddpo",
    "callbacks": None, "winrate_callback": None, "profiling": None,
}

# Keys built at run time from a nested dict (legacy PPO `ppo/{k}`) or a stored-metrics loop (`{key}`).
LEGACY_PPO_STATS = [
    "loss/policy", "loss/value", "loss/total", "policy/entropy", "policy/approxkl", "policy/policykl",
    "policy/clipfrac", "policy/advantages", "policy/advantages_mean", "policy/ratio", "returns/mean",
    "returns/var", "val/vpred", "val/error", "val/clipfrac", "val/mean", "val/var", "val/var_explained",
    "mean_non_score_reward", "learning_rate"]
DYNAMIC = {
    ("ppo_trainer(legacy)", "ppo/{k}"): ["ppo/" + k for k in LEGACY_PPO_STATS],
    ("kto_trainer", "{key}"): ["kl"],
    ("bco_trainer", "{key}"): ["delta"],
}
SAMPLE_VALUES = {"reward_func_name": "accuracy_reward", "reward_name": "format_reward",
                 "metric_prefix": "self_distillation", "metric_name": "policy_loss",
                 "trainer.__class__.__name__": "GRPOTrainer", "name": "compute_loss"}
# Literals in the code that never reach a tracker in part of their span (trl-metrics.md sections 2.6, 2.7).
EFFECTIVE_FIRST = {
    ("kto_trainer", "logits/chosen"): "v0.12.0",     # v0.8.2-v0.11.4: prediction_step's eval_logits/* only
    ("kto_trainer", "logits/rejected"): "v0.12.0",
}


def tag(text):
    if text.startswith("current"):
        return "v1.9.0"          # the inventory's main (2026-07-24) is v1.9.0 as far as releases go
    if text == "main":
        return "v1.10.0"         # async_grpo `rollouts`: first released in v1.10.0 (wheel)
    return text


def expand(trainer_file, key, container):
    """The names a span row's key reaches a tracker under (split prefixes removed)."""
    if (trainer_file, key.replace("{prefix}", "").replace("{train_eval}/", "")) in DYNAMIC:
        return DYNAMIC[(trainer_file, key.replace("{prefix}", "").replace("{train_eval}/", ""))]
    if trainer_file == "ppo_trainer(legacy)" and container == "train_stats":
        key = "ppo/" + key                       # record_step_stats re-prefixes train_stats with ppo/
    if key.startswith("{prefix}"):
        key = key[len("{prefix}"):]              # "" or "eval_"
    if key.startswith("{train_eval}/"):
        key = "train/" + key[len("{train_eval}/"):]   # KTO v0.8.2-v0.8.6 wrote train/... and eval/...
    key = key.replace("completions/{prefix}_", "completions/on_policy_")
    keys = [key]
    if "{metric}" in key:
        keys = [k.replace("{metric}", m) for k in keys for m in ("rewards", "logps", "logits")]
    if "{split}" in key:
        keys = [k.replace("{split}", s) for k in keys for s in ("chosen", "rejected")]
    out = []
    for k in keys:
        for name, value in SAMPLE_VALUES.items():
            k = k.replace("{" + name + "}", value)
        out.append(strip_split_prefix(k)[0])
    return out


def span_rows():
    with SPANS.open() as f:
        return list(csv.DictReader(f))


def span_cases():
    cases = []
    for row in span_rows():
        tf, raw = row["trainer_file"], row["name"]
        if is_internal(raw):
            continue
        first = EFFECTIVE_FIRST.get((tf, raw), tag(row["first"]))
        last = max(first, tag(row["last"]), key=lambda r: order()[r])
        for rel in sorted({first, last}, key=lambda r: order()[r]):
            for k in expand(tf, raw, row["container"]):
                if not is_internal(k):
                    cases.append((tf, raw, k, rel))
    return cases


def test_spans_file_is_there():
    assert SPANS.exists()
    assert len(span_rows()) > 400


@pytest.mark.parametrize("trainer_file,raw,key,release", span_cases(),
                         ids=lambda v: v if isinstance(v, str) else None)
def test_span_key_has_entry(trainer_file, raw, key, release):
    assert trainer_file in FILE_TO_TRAINER, f"unknown trainer file {trainer_file}"
    trainer = FILE_TO_TRAINER[trainer_file]
    assert entries_for(key, trainer, release), \
        f"{trainer_file}: {raw!r} (as {key!r}) at {release} has no entry for trainer {trainer}"
    # and the real engine translates it at that release, with an entry valid there (no out-of-range fallback)
    tr = _engine(trainer, release)
    before = len(tr.notes)
    res = tr.translate({key: 1.0})
    assert not res.unmapped and not res.conflicts, f"engine leaves {key!r} unmapped for trl/{trainer}@{release}"
    # no out-of-range fallback (a key shared by every trainer leaves the trainer undetermined, and says so)
    assert not [n for n in tr.notes[before:] if "are not logged by" in n], tr.notes[before:]


_ENGINES: dict = {}


def _engine(trainer, release):
    from trackbridge.pipeline import Translator
    spec = f"trl/{trainer}@{release}" if trainer else f"trl@{release}"
    if spec not in _ENGINES:
        _ENGINES[spec] = Translator(spec, "canonical")
    if not trainer:
        _ENGINES[spec] = _ENGINES[spec].fresh()      # a key of every trainer: the trainer is detected per key here
    return _ENGINES[spec]


# ----------------------------------------------------------------------------------------------- v1.10.0 - v1.16.0
# Read from the released wheels (pip download trl==X --no-deps), diffed against v1.9.0: (trainer, key, first, last).
NEW_SINCE_1_9 = [
    ("async_grpo", "iteration_time_s", "v1.10.0", "v1.10.0"),
    ("async_grpo", "step_time", "v1.10.0", "v1.10.0"),
    ("async_grpo", "rollouts", "v1.10.0", "v1.16.0"),
    ("async_grpo", "batch/row_fill_frac", "v1.11.0", "v1.16.0"),
    ("async_grpo", "batch/packing_ratio", "v1.16.0", "v1.16.0"),
    ("async_grpo", "perf/mfu_wall_clock", "v1.11.0", "v1.16.0"),
    ("async_grpo", "perf/weight_sync_s", "v1.11.0", "v1.16.0"),
    ("async_grpo", "sample/staleness_mean", "v1.11.0", "v1.16.0"),
    ("async_grpo", "kl", "v1.11.0", "v1.16.0"),
    ("async_grpo", "ratio", "v1.11.0", "v1.16.0"),
    ("distillation", "tools/call_frequency", "v1.11.0", "v1.16.0"),
    ("distillation", "tools/failure_frequency", "v1.11.0", "v1.16.0"),
    ("distillation", "step_time", "v1.10.0", "v1.16.0"),
    ("distillation", "entropy", "v1.10.0", "v1.16.0"),
    ("distillation", "num_tokens", "v1.10.0", "v1.16.0"),
    ("distillation", "completions/mean_terminated_length", "v1.10.0", "v1.16.0"),
    ("distillation", "jsd", "v1.11.0", "v1.16.0"),
    ("distillation", "teacher_entropy/teacher0", "v1.11.0", "v1.16.0"),
    ("distillation", "teacher_token_frac/teacher0", "v1.13.0", "v1.16.0"),
    ("distillation", "batch/pad_frac", "v1.11.0", "v1.16.0"),
    ("ppo", "objective/kl", "v1.12.0", "v1.12.0"),          # experimental/ppo removed in v1.13.0
    ("grpo", "clip_ratio", "v1.13.0", "v1.13.0"),           # Liger-path key removed in v1.14.0
    ("xpo", "loss/xpo", "v1.13.0", "v1.13.0"),               # xpo, nash_md, bco removed in v1.14.0
    ("nash_md", "mixture_coef", "v1.13.0", "v1.13.0"),
    ("bco", "delta", "v1.13.0", "v1.13.0"),
    ("ssd", "ssd/active_sample_ratio", "v1.15.0", "v1.15.0"),  # ssd removed in v1.16.0
    ("grpo", "reward_std", "v1.16.0", "v1.16.0"),
    ("grpo", "entropy_coef", "v1.16.0", "v1.16.0"),
    ("rloo", "kl", "v1.16.0", "v1.16.0"),
    ("kto", "kl", "v1.16.0", "v1.16.0"),
    ("sft", "mean_token_accuracy", "v1.16.0", "v1.16.0"),
]
GONE = [  # trainer, key, first release where it is no longer logged
    ("ppo", "objective/kl", "v1.13.0"), ("grpo", "clip_ratio", "v1.14.0"), ("xpo", "loss/xpo", "v1.14.0"),
    ("bco", "delta", "v1.14.0"), ("ssd", "ssd/active_sample_ratio", "v1.16.0"),
    ("async_grpo", "forward_time_s", "v1.11.0"), ("async_grpo", "iteration_time_s", "v1.11.0"),
]


@pytest.mark.parametrize("trainer,key,first,last", NEW_SINCE_1_9)
def test_new_keys_since_1_9(trainer, key, first, last):
    for rel in (first, last):
        assert entries_for(key, trainer, rel), f"{trainer}: {key} at {rel}"


@pytest.mark.parametrize("trainer,key,gone", GONE)
def test_removed_keys_end(trainer, key, gone):
    assert not entries_for(key, trainer, gone), f"{trainer}: {key} should end before {gone}"


def test_releases_cover_pypi_1_16():
    rel = trl()["releases"]
    assert rel[0] == "v0.2.0" and rel[-1] == "v1.16.0"
    for r in ("v1.9.0", "v1.10.0", "v1.11.0", "v1.12.0", "v1.13.0", "v1.14.0", "v1.15.0", "v1.16.0", "v0.10"):
        assert r in rel
    assert len(rel) == len(set(rel))
    tags = [ln.split()[0] for ln in (REF / "frameworks" / "trl-tag-dates.txt").read_text().splitlines()
            if ln.startswith("v")]
    assert [r for r in rel if r in tags] == tags, "tag order must follow trl-tag-dates.txt"


# ----------------------------------------------------------------------------------------------- structure
def test_top_level_and_fields():
    d = trl()
    assert set(d) <= ALLOWED_TOP
    assert d["format"] == "trackbridge.mapping/1" and d["framework"] == "trl"
    assert d["aliases"]["trl-legacy"] == {"trainer": "ppo_legacy", "until": "v0.11.4"}
    assert d["aliases"]["trl"] == {}
    for e in d["entries"]:
        assert set(e) <= ALLOWED_ENTRY_FIELDS, e
        assert isinstance(e.get("reduce"), dict) and e["reduce"], e      # fidelity is computed from it (issue 20)
        assert "@" in e["source"] or "transformers" in e["source"], e
        for t in e.get("trainers", []):
            assert t in d["trainers"], (t, e["key"])
        for f in ("since", "until"):
            if e.get(f):
                assert e[f] in order(), (f, e)
        if e.get("since") and e.get("until"):
            assert order()[e["since"]] <= order()[e["until"]], e
        if "transform" in e:
            assert e["transform"].get("scale", 1.0) != 0


def canonical_exists(name):
    metrics = canonical()["metrics"]
    if name in metrics:
        return True
    return False


def test_canonical_targets_exist():
    missing = sorted({e["canonical"] for e in trl()["entries"] if not canonical_exists(e["canonical"])})
    assert not missing, f"not in canonical.yaml: {missing}"


def test_placeholders_match():
    for e in trl()["entries"]:
        assert placeholders(e["key"]) == placeholders(e["canonical"]), e


def test_histograms_are_histograms():
    m = canonical()["metrics"]
    for key in ("env/reward_dist", "objective/logprobs", "ppo/policy/advantages", "objective/kl_dist",
                "tokens/queries_dist", "ppo/policy/ratio"):
        (name,) = canonical_of(key, "ppo_legacy", "v0.11.4")
        assert m[name]["kind"] == "histogram", key


def test_config_targets_exist():
    cfg = canonical()["config"]
    for c in trl()["config"]:
        assert "canonical" in c or "default" in c, c
        if "canonical" not in c:
            continue        # a default only: read by level counts and config switches
        assert c["canonical"] in cfg, c
        for t in c.get("trainers", []):
            assert t in trl()["trainers"], c
    beta = {tuple(c["trainers"]): c["canonical"] for c in trl()["config"] if c["key"] == "beta"}
    assert any("grpo" in t and v == "kl_coef" for t, v in beta.items())
    assert any("dpo" in t and v == "dpo_beta" for t, v in beta.items())


def _overlap(a, b):
    o, n = order(), len(order()) - 1
    lo = max(o.get(a.get("since"), 0), o.get(b.get("since"), 0))
    hi = min(o[a["until"]] if a.get("until") else n, o[b["until"]] if b.get("until") else n)
    ta, tb = set(a.get("trainers") or trl()["trainers"]), set(b.get("trainers") or trl()["trainers"])
    return lo <= hi and bool(ta & tb) and a.get("when") == b.get("when")


def test_one_reverse_entry_per_canonical_trainer_release():
    rev = [e for e in trl()["entries"] if e.get("reverse", True)]
    bad = [(a["key"], b["key"], a["canonical"]) for i, a in enumerate(rev) for b in rev[i + 1:]
           if a["canonical"] == b["canonical"] and _overlap(a, b)]
    assert not bad, bad


def test_no_key_claimed_twice():
    es = trl()["entries"]
    bad = [(a["key"], a.get("trainers"), b.get("trainers")) for i, a in enumerate(es) for b in es[i + 1:]
           if a["key"] == b["key"] and _overlap(a, b)]
    assert not bad, bad


# ----------------------------------------------------------------------------------------------- semantics
@pytest.mark.parametrize("key,trainer,release,expected", [
    ("kl", "grpo", "v1.16.0", "kl/ref/k3"),
    ("kl", "rloo", "v1.16.0", "kl/old_ref/k1"),
    ("kl", "kto", "v1.16.0", "preference/kto_kl"),
    ("objective/kl", "ppo_legacy", "v0.11.4", "kl/old_ref/k1_seq_sum"),
    ("objective/kl", "ppo", "v0.12.0", "kl/old_ref/k1_seq_sum"),
    ("objective/entropy", "ppo", "v0.12.0", "policy/entropy_seq_sum"),
    ("policy/entropy_avg", "ppo", "v0.12.0", "policy/entropy"),
    ("entropy", "grpo", "v1.16.0", "policy/entropy"),
    ("completion_length", "grpo", "v0.15.0", "response/length/mean"),
    ("completions/mean_length", "grpo", "v1.16.0", "response/length/mean"),
    ("rewards/acc/mean", "grpo", "v1.16.0", "reward/fn/{reward_fn}/mean"),
    ("rewards/acc", "grpo", "v0.15.0", "reward/fn/{reward_fn}/mean"),
    ("reward_std", "grpo", "v0.20.0", "reward/group_std/mean"),
    ("reward_std", "grpo", "v0.27.0", "reward/score/std"),
    ("reward", "grpo", "v1.16.0", "reward/score/mean"),
    ("reward", "rloo", "v0.23.0", "reward/shaped/mean"),
    ("reward", "rloo", "v1.0.0", "reward/score/mean"),
    ("ppo/mean_non_score_reward", "ppo_legacy", "v0.11.4", "reward/kl_penalty/token_mean"),
    ("objective/non_score_reward", "ppo", "v0.12.0", "reward/kl_penalty/mean"),
    ("time/ppo/forward_pass", "ppo_legacy", "v0.11.4", "time/{stage}"),
    ("eval_rewards/margins", "dpo", "v0.20.0", "preference/reward/margin"),
    ("train/rewards/chosen", "kto", "v0.8.4", "preference/reward/chosen"),
    ("eval_loss", "sft", "v1.16.0", "loss/total"),
])
def test_meaning(key, trainer, release, expected):
    assert canonical_of(key, trainer, release) == {expected}


def test_time_is_seconds():
    m = canonical()["metrics"]
    for key in ("time/ppo/total", "time/ppo/forward_pass"):
        for name in canonical_of(key, "ppo_legacy", "v0.11.4"):
            assert m[name]["unit"] == "s", key


# Section 0b of trl-metrics.md: (old key, trainer, release), (new key, trainer, release), same canonical name?
RENAMES = [
    (("completion_length", "grpo", "v0.16.1"), ("completions/mean_length", "grpo", "v0.17.0"), True),
    (("rewards/f", "grpo", "v0.16.1"), ("rewards/f/mean", "grpo", "v0.17.0"), True),
    (("reward_std", "grpo", "v0.26.2"), ("reward_std", "grpo", "v0.27.0"), False),
    (("objective/rlhf_reward", "rloo", "v0.21.0"), ("reward", "rloo", "v0.22.0"), True),
    (("objective/scores", "rloo", "v0.21.0"), ("reward", "rloo", "v0.27.0"), True),
    (("objective/kl", "rloo", "v0.21.0"), ("kl", "rloo", "v0.22.0"), False),
    (("lr", "ppo", "v0.12.0"), ("learning_rate", "grpo", "v0.12.0"), True),
    (("lr", "rloo", "v0.21.0"), ("learning_rate", "rloo", "v0.22.0"), True),
    (("ppo/mean_non_score_reward", "ppo_legacy", "v0.11.4"), ("objective/non_score_reward", "ppo", "v0.12.0"), False),
    (("env/reward_mean", "ppo_legacy", "v0.11.4"), ("objective/scores", "ppo", "v0.12.0"), True),
    (("ppo/mean_scores", "ppo_legacy", "v0.11.4"), ("objective/scores", "ppo", "v0.12.0"), True),
    (("objective/kl", "ppo_legacy", "v0.11.4"), ("objective/kl", "ppo", "v0.12.0"), True),
    (("ppo/policy/clipfrac", "ppo_legacy", "v0.11.4"), ("policy/clipfrac_avg", "ppo", "v0.12.0"), True),
    (("ppo/val/clipfrac", "ppo_legacy", "v0.11.4"), ("val/clipfrac_avg", "ppo", "v0.12.0"), True),
    (("ppo/loss/policy", "ppo_legacy", "v0.11.4"), ("loss/policy_avg", "ppo", "v0.12.0"), True),
    (("ppo/loss/value", "ppo_legacy", "v0.11.4"), ("loss/value_avg", "ppo", "v0.12.0"), True),
    (("ppo/policy/entropy", "ppo_legacy", "v0.11.4"), ("policy/entropy_avg", "ppo", "v0.12.0"), True),
    (("train/rewards/chosen", "kto", "v0.8.2"), ("rewards/chosen", "kto", "v0.9.3"), True),
]


@pytest.mark.parametrize("old,new,same", RENAMES, ids=lambda v: v[0] if isinstance(v, tuple) else str(v))
def test_rename_map(old, new, same):
    a, b = canonical_of(*old), canonical_of(*new)
    assert a and b, (old, a, new, b)
    assert (a == b) is same, (old, a, new, b)


# ----------------------------------------------------------------------------------------------- public logs
PUBLIC = [("04_trl_grpo.json", "grpo", "v0.29.1"), ("16_trl_grpo.json", "grpo", "v1.9.0"),
          ("05_trl_grpo.json", "grpo", "v0.26.0"), ("14_trl_grpo.json", "grpo", "v0.26.0"),
          ("07_trl_dpo.json", "dpo", "v1.0.0"), ("12_trl_ppo.json", "ppo", "v0.12.0")]


@pytest.mark.parametrize("name,trainer,release", PUBLIC)
def test_public_log_keys_map(name, trainer, release):
    keys = json.loads((LOGS / name).read_text())["keys"]
    missing = [k for k in keys if k != "step" and not canonical_of(k, trainer, release)]
    assert not missing, missing
