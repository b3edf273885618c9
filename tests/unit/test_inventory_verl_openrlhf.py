"""Inventory tests for mappings/verl.yaml and mappings/openrlhf.yaml.

Parses the two reference inventories (verl-key-spans.tsv, openrlhf-key-matrix.tsv) and checks, with PyYAML and a
small local template matcher (the real schema engine can replace `lookup` later), that every logged key has an
entry at its first and last release, that every canonical target exists in canonical.yaml with the same
placeholders, and the file-level rules of docs/mapping-format.md that can be checked without the engine.
"""
from __future__ import annotations

import re

import pytest
import yaml

from _support import DATA, ROOT

MAPPINGS = ROOT / "mappings"
REFERENCE = DATA / "frameworks"

ENTRY_FIELDS = {"key", "canonical", "since", "until", "trainers", "fidelity", "differs", "reason", "transform",
                "when", "reverse", "source", "note", "renamed_from", "reduce"}
TOP_FIELDS = {"format", "framework", "description", "repository", "releases", "aliases", "trainers", "prefixes",
              "config", "internal", "entries", "levels", "reductions"}
DIFFERS = {"estimator", "reduction", "population", "snapshot", "sign", "unit", "config", "weighting", "definition"}
PLACEHOLDER = re.compile(r"\{([a-z_][a-z0-9_]*)(?::(path))?\}")


def load(name):
    with open(MAPPINGS / name) as fh:
        return yaml.safe_load(fh)


CANONICAL = load("canonical.yaml")
FILES = {"verl": load("verl.yaml"), "openrlhf": load("openrlhf.yaml")}


# ----------------------------------------------------------------------------- a small template matcher
def placeholders(template):
    return sorted((m.group(1), m.group(2) or "") for m in PLACEHOLDER.finditer(template))


def compile_template(template):
    out, pos = [], 0
    for m in PLACEHOLDER.finditer(template):
        out.append(re.escape(template[pos:m.start()]))
        out.append(f"(?P<{m.group(1)}>.+?)" if m.group(2) else f"(?P<{m.group(1)}>[^/]+?)")
        pos = m.end()
    out.append(re.escape(template[pos:]))
    return re.compile("^" + "".join(out) + "$")


def specificity(template):
    """Literal characters outside placeholders: more = more specific; single-segment beats path."""
    literal = len(PLACEHOLDER.sub("", template))
    n_path = sum(1 for m in PLACEHOLDER.finditer(template) if m.group(2))
    return (literal, -n_path)


def rindex(releases, tag):
    return releases.index(tag)


def in_range(fw, entry, release):
    rel = fw["releases"]
    lo = rindex(rel, entry.get("since") or rel[0])
    hi = rindex(rel, entry.get("until") or rel[-1])
    return lo <= rindex(rel, release) <= hi


def get_path(config, dotted):
    cur = config
    for part in dotted.split("."):
        if isinstance(cur, dict) and part in cur:
            cur = cur[part]
        elif isinstance(cur, dict) and dotted in cur:  # flat dotted keys
            return cur[dotted]
        else:
            return None
    return cur


def when_ok(entry, config):
    cond = (entry.get("when") or {}).get("config")
    if not cond:
        return True
    return all(get_path(config or {}, k) == v for k, v in cond.items())


def lookup(framework, key, release, trainer=None, config=None):
    """Return (entry, bindings) for a raw framework key (prefix already stripped) or None."""
    fw = FILES[framework]
    best = None
    for e in fw["entries"]:
        m = compile_template(e["key"]).match(key)
        if not m or not in_range(fw, e, release):
            continue
        if trainer and e.get("trainers") and trainer not in e["trainers"]:
            continue
        if not when_ok(e, config):
            continue
        rank = (specificity(e["key"]), 1 if e.get("when") else 0)
        if best is None or rank > best[0]:
            best = (rank, e, m.groupdict())
    return None if best is None else (best[1], best[2])


PASSTHROUGH: set = set()   # inventory rows deliberately left unmapped (filled while reading the inventories)
# inventory rows only some trainer of a release logs: the run config that selects it, from the release on
# (veRL 0.9.x logs gdpo/* and perf/mfu/actor_infer only with the legacy trainer, trainer.use_v1=false)
ROW_CONFIG = {("verl", "gdpo/{key}"): ("v0.9.0", {"trainer": {"use_v1": False}}),
              ("verl", "perf/mfu/actor_infer"): ("v0.9.0", {"trainer": {"use_v1": False}})}


def canonical_names():
    return set(CANONICAL["metrics"])


# ----------------------------------------------------------------------------- inventories
def verl_inventory():
    """(row label, concrete keys, first release, last release) from verl-key-spans.tsv.

    The TSV gives the first tag (`[first tag: X]`) and, for keys no longer logged, the last (`[last tag: Y]`);
    rows marked `[passthrough: why]` are keys a release logs that are deliberately left unmapped. Other removed
    keys' last releases are corrected below from the source (noted per row). Rows map to one or more concrete keys
    that the trainer really emits."""
    last = FILES["verl"]["releases"][-1]
    rows, lasts = {}, {}
    for line in (REFERENCE / "verl-key-spans.tsv").read_text().splitlines():
        if not line.strip():
            continue
        label, first_col, last_col = (line.split("\t") + ["", ""])[:3]
        m = re.search(r"\[first tag: ([^\]]+)\]", first_col)
        rows[label] = m.group(1) if m else None
        m = re.search(r"\[last tag: ([^\]]+)\]", last_col)
        if m:
            lasts[label] = m.group(1)
        if "[passthrough:" in first_col:
            PASSTHROUGH.add(label)
    keys = {
        "critic/score/mean": ["critic/score/mean", "critic/score/max", "critic/score/min"],
        "critic/rewards/mean": ["critic/rewards/mean", "critic/rewards/max"],
        "critic/advantages/mean": ["critic/advantages/mean", "critic/advantages/min"],
        "critic/returns/mean": ["critic/returns/mean"],
        "critic/values/mean": ["critic/values/mean"],
        "critic/vf_explained_var": ["critic/vf_explained_var"],
        "response_length/mean": ["response_length/mean", "response_length/max"],
        "response_length/clip_ratio": ["response_length/clip_ratio"],
        "prompt_length/mean": ["prompt_length/mean"],
        "prompt_length/clip_ratio": ["prompt_length/clip_ratio"],
        "response_length_non_aborted/mean": ["response_length_non_aborted/mean",
                                             "response_length_non_aborted/clip_ratio"],
        "response/aborted_ratio": ["response/aborted_ratio"],
        "num_turns/mean": ["num_turns/mean", "num_turns/max"],
        "tool_call_counts/mean": ["tool_call_counts/mean"],
        "timing/gen (old)": ["timing/gen", "timing/update_actor"],
        "timing_s/{name}": ["timing_s/gen", "timing_s/update_actor", "timing_s/step"],
        "timing_per_token_ms/{name}": ["timing_per_token_ms/gen", "timing_per_token_ms/update_actor"],
        "perf/total_num_tokens": ["perf/total_num_tokens"],
        "perf/time_per_step": ["perf/time_per_step"],
        "perf/throughput": ["perf/throughput"],
        "perf/mfu/actor": ["perf/mfu/actor"],
        "perf/mfu/critic": ["perf/mfu/critic"],
        "perf/mfu/actor_infer": ["perf/mfu/actor_infer"],
        "perf/max_memory_allocated_gb": ["perf/max_memory_allocated_gb"],
        "perf/max_memory_reserved_gb": ["perf/max_memory_reserved_gb"],
        "perf/cpu_memory_used_gb": ["perf/cpu_memory_used_gb"],
        "training/global_step": ["training/global_step"],
        "training/epoch": ["training/epoch"],
        "training/rollout_probs_diff_mean": ["training/rollout_probs_diff_mean",
                                             "training/rollout_actor_probs_pearson_corr"],
        "global_seqlen prefix": ["global_seqlen/min", "global_seqlen/balanced_max", "global_seqlen/mean"],
        "{prefix}/minmax_diff": ["global_seqlen/minmax_diff"],
        "actor/pg_loss": ["actor/pg_loss"],
        "actor/pg_clipfrac": ["actor/pg_clipfrac"],
        "actor/pg_clipfrac_lower": ["actor/pg_clipfrac_lower"],
        "actor/ppo_kl": ["actor/ppo_kl"],
        "actor/entropy": ["actor/entropy"],
        "actor/entropy_loss": ["actor/entropy_loss"],
        "actor/kl_loss": ["actor/kl_loss"],
        "actor/kl_coef": ["actor/kl_coef"],
        "actor/grad_norm": ["actor/grad_norm"],
        "actor/lr": ["actor/lr"],
        "actor/reward_kl_penalty": ["actor/reward_kl_penalty"],
        "actor/reward_kl_penalty_coeff": ["actor/reward_kl_penalty_coeff"],
        "critic/kl (old)": ["critic/kl"],
        "critic/kl_coeff (old)": ["critic/kl_coeff"],
        "critic/kld (old megatron)": ["critic/kld"],
        "critic/vf_loss": ["critic/vf_loss"],
        "critic/vf_clipfrac": ["critic/vf_clipfrac"],
        "critic/vpred_mean": ["critic/vpred_mean"],
        "critic/grad_norm": ["critic/grad_norm"],
        "critic/lr": ["critic/lr"],
        "val/{key} prefix (old)": ["val/test_score/openai/gsm8k"],
        "test_score/{data_source}": ["val/test_score/lighteval/MATH"],
        "val-core": ["val-core/openai/gsm8k/reward/mean@4", "val-core/openai/gsm8k/acc/best@4/mean",
                     "val-core/openai/gsm8k/acc/maj@4/mean"],
        "val-aux": ["val-aux/openai/gsm8k/reward/std@4", "val-aux/lighteval/MATH/score/worst@2/std",
                    "val-aux/openai/gsm8k/acc/best@2/std"],
        "mean@{n}": ["val-core/gsm8k/acc/mean@16"],
        "best@{n}/mean": ["val-core/gsm8k/acc/best@16/mean"],
        "maj@{n}/mean": ["val-aux/gsm8k/acc/maj@8/mean"],
        "val-aux/num_turns/mean": ["val-aux/num_turns/mean"],
        "val/generations": ["val/generations"],
        "variance_proxy/*": ["variance_proxy/proxy1_signal_strength"],
        "rollout_corr/{key}": ["rollout_corr/rollout_is_mean", "rollout_corr/kl"],
        "mismatch/ (old name)": ["mismatch/mismatch_kl", "mismatch/rollout_is_mean"],
        "generation_timing/max": ["timing_s/generation_timing/max", "timing_s/generation_timing/topk_ratio"],
        "agent_loop/generate_sequences/mean": ["timing_s/agent_loop/generate_sequences/mean",
                                               "timing_s/agent_loop/slowest/response_length"],
        "SFT train/loss": ["train/loss"],
        "SFT train/lr(1e-3)": ["train/lr(1e-3)"],
        "SFT val/loss": ["val/loss"],
        # read from the released wheels 0.7.1 .. 0.9.1 (and tags v0.1, v0.2 for the old names)
        "actor/lr(1e-4) (old)": ["actor/lr(1e-4)"],
        "critic/lr(1e-4) (old)": ["critic/lr(1e-4)"],
        "mfu/actor (old)": ["mfu/actor"],
        "mfu/critic (old)": ["mfu/critic"],
        "actor/entropy_loss (engine)": ["actor/entropy_loss"],
        "timing_s/agent_loop/num_preempted": ["timing_s/agent_loop/num_preempted/mean",
                                              "timing_s/agent_loop/num_preempted/max",
                                              "timing_s/agent_loop/slowest/num_preempted"],
        "gdpo/{key}": ["gdpo/format_reward/mean", "gdpo/acc/std", "gdpo/acc/max", "gdpo/acc/min"],
        "mtp_losses (legacy megatron)": ["mtp_losses/mtp_1_loss"],
        "actor/mtp_losses (engine)": ["actor/mtp_losses/mtp_1_loss"],
        "actor/perf/ memory (engine)": ["actor/perf/max_memory_allocated_gb", "actor/perf/max_memory_reserved_gb",
                                        "actor/perf/cpu_memory_used_gb"],
        "critic/perf/ memory (engine)": ["critic/perf/max_memory_allocated_gb", "critic/perf/max_memory_reserved_gb",
                                         "critic/perf/cpu_memory_used_gb"],
        "SFT engine perf/ memory": ["perf/max_memory_allocated_gb", "perf/cpu_memory_used_gb"],
        "timing_s/agent_loop/compute_score": ["timing_s/agent_loop/compute_score/mean",
                                              "timing_s/agent_loop/slowest/compute_score"],
        "rollout/spec_accept_rate": ["rollout/spec_accept_rate", "rollout/spec_accept_length"],
        "training/num_turns": ["training/num_turns/mean", "training/num_turns/max", "training/num_turns/min"],
        "rollout/moe": ["rollout/moe/max_vio/layer_0", "rollout/moe/avg_vio/max", "rollout/moe/min_vio/avg",
                        "rollout/moe/routed_experts_found", "rollout/moe/routed_expert_assignments"],
        "training/off_policy": ["training/off_policy/trajectory_spans/mean",
                                "training/off_policy/trajectory_staleness/max",
                                "training/off_policy/trajectory_staleness_worst/min",
                                "training/off_policy/evicted_samples",
                                "training/off_policy/evicted_samples_staleness/mean"],
        "training/filter_groups": ["training/filter_groups/evicted_samples",
                                   "training/filter_groups/discarded_surplus_samples"],
        "training/rollout_failure": ["training/rollout_failure/evicted_samples"],
        "validation/ replay-buffer counts": ["validation/off_policy/evicted_samples",
                                             "validation/filter_groups/discarded_surplus_samples"],
        "training/filter_groups/filtered_reward_counts": ["training/filter_groups/filtered_reward_counts"],
        "actor/distillation": ["actor/distillation/loss", "actor/distillation/overlap_ratio"],
        "fully_async": ["fully_async/count/total_generated_samples", "fully_async/rollouter/idle_ratio"],
        "dynamic_resource": ["dynamic_resource/train_resource_utilization", "dynamic_resource/mq_size"],
        "checkpoint_engine": ["checkpoint_engine/changed_ratio", "checkpoint_engine/payload_mbytes"],
        "separate_async": ["separate_async/decision/remaining", "separate_async/switch/idle"],
    }
    engine_sft = {"SFT engine perf/ memory"}
    # (first, last) corrections where the TSV's "first tag containing the first commit" differs from what a tagged
    # release logs, or where the key was removed. Each is from the source at the tags.
    override = {
        "timing/gen (old)": ("v0.1rc", "v0.1"),            # v0.2 itself logs timing_s/
        "timing/{name} fstring": None,                     # untagged main commits only (checked separately)
        "actor/entropy": ("v0.4.1", last),                 # v0.4.0 logs actor/entropy_loss (ray_trainer.py@v0.4.0)
        "actor/entropy_loss": ("v0.1rc", "v0.4.0"),
        "critic/kl (old)": ("v0.1rc", "v0.3.0.post1"),
        "critic/kl_coeff (old)": ("v0.1rc", "v0.3.0.post1"),
        "critic/kld (old megatron)": ("v0.1rc", "v0.1"),
        "val/{key} prefix (old)": ("v0.1rc", "v0.3.0.post1"),
        "test_score/{data_source}": ("v0.1rc", "v0.3.0.post1"),
        "mismatch/ (old name)": ("v0.6.0", "v0.6.0"),
        "variance_proxy/*": ("v0.7.1", last),              # main after v0.7.0; first released in 0.7.1 (wheel)
        "SFT train/loss": ("v0.1rc", "v0.7.0"),          # fsdp_sft_trainer.py removed in v0.7.1
        "SFT val/loss": ("v0.1rc", "v0.7.0"),
    }
    out = []
    for label, first in rows.items():
        if label in override:
            if override[label] is None:
                continue
            first, lst = override[label]
        else:
            lst = lasts.get(label, last)
        assert label in keys, f"verl-key-spans.tsv row {label!r} has no concrete key in this test"
        for k in keys[label]:
            trainer = "sft_engine" if label in engine_sft else "sft" if label.startswith("SFT") else "ppo"
            out.append((label, k, first, lst, trainer))
    return out


def openrlhf_inventory():
    lines = [ln.split("\t") for ln in (REFERENCE / "openrlhf-key-matrix.tsv").read_text().splitlines() if ln.strip()]
    tags = lines[0][1:]
    keys = {
        "policy_loss": ["policy_loss"], "actor_lr": ["actor_lr"], "ptx_loss": ["ptx_loss"],
        "critic_loss": ["critic_loss"], "values": ["values"], "critic_lr": ["critic_lr"], "kl (info)": ["kl"],
        "reward (info)": ["reward"], "return (info)": ["return"], "response_length (info)": ["response_length"],
        "total_length (info)": ["total_length"], "ppo_clip_ratio": ["ppo_clip_ratio"], "ppo_kl": ["ppo_kl"],
        "vllm_kl": ["vllm_kl"], "entropy_loss": ["entropy_loss"], "actor_grad_norm": ["actor_grad_norm"],
        "critic_grad_norm": ["critic_grad_norm"], "logprobs_diff": ["logprobs_diff"],
        "group_reward_std": ["group_reward_std"], "response_clip_ratio": ["response_clip_ratio"],
        "score (info)": ["score"], "dynamic_filtering_pass_rate": ["dynamic_filtering_pass_rate"],
        "generated_samples": ["generated_samples"], "timing/step_total": ["timing/step_total", "timing/ppo_train"],
        "rollout/reward_mean": ["rollout/reward_mean", "rollout/num_samples"],
        "perf/experience_maker/": ["perf/experience_maker/generate_time", "perf/experience_maker/wait_time"],
        "generate_time (perf)": ["generate_time"],
        "eval_{ds}_pass1": ["eval_openai/gsm8k_pass1", "eval_math_pass8"],
        "eval_response_length_mean": ["eval_response_length_mean", "eval_openai/gsm8k_truncated_rate"],
        "is_filter_ratio": ["is_filter_ratio"],
    }
    # console progress-bar names (tqdm set_postfix), read by trackbridge/files/console.py
    for bar in ("pg", "rm", "ret", "glen", "tlen", "cri", "vals", "cri_lr", "ptx", "act_lr", "act_loss", "gen_len",
                "tot_len", "ent_loss", "grad_norm"):
        keys[f"bar: {bar}"] = [bar]
    not_keys = {"train/ prefix", "eval/ prefix", "define_metric train/global_step", "define_metric eval/epoch",
                "class WandbLogger", "tensorboard add_scalar"}
    # perf info field generate_time: the matrix string also matches the perf_stats dict (v0.4.6+); as a logged
    # train/generate_time key it ends at v0.4.5 (experience_maker.py@v0.4.0 info fields).
    override_last = {"generate_time (perf)": "v0.4.5"}
    out = []
    for row in lines[1:]:
        label, marks = row[0], row[1:]
        if label in not_keys:
            continue
        present = [t for t, m in zip(tags, marks) if m.strip() == "Y"]
        assert label in keys, f"openrlhf-key-matrix.tsv row {label!r} has no concrete key in this test"
        first, lst = present[0], override_last.get(label, present[-1])
        for k in keys[label]:
            out.append((label, k, first, lst, "ppo"))
    return out


# ----------------------------------------------------------------------------- tests
@pytest.mark.parametrize("framework", sorted(FILES))
def test_file_shape(framework):
    fw = FILES[framework]
    assert set(fw) <= TOP_FIELDS, set(fw) - TOP_FIELDS
    assert fw["format"] == "trackbridge.mapping/1"
    assert fw["framework"] == framework
    assert len(set(fw["releases"])) == len(fw["releases"])
    trainers = set(fw.get("trainers") or {})
    for e in fw["entries"]:
        where = f"{framework}: {e.get('key')!r}"
        assert set(e) <= ENTRY_FIELDS, (where, set(e) - ENTRY_FIELDS)
        assert e.get("source"), where
        assert "@" in e["source"], where
        for r in ("since", "until"):
            if e.get(r) is not None:
                assert e[r] in fw["releases"], (where, e[r])
        if e.get("since") and e.get("until"):
            assert rindex(fw["releases"], e["since"]) <= rindex(fw["releases"], e["until"]), where
        assert e.get("fidelity", "exact") in ("exact", "approximate"), where
        if e.get("fidelity") == "approximate":
            assert e.get("reason"), where
            assert set(e.get("differs") or []) <= DIFFERS, where
        for t in e.get("trainers") or []:
            assert t in trainers, (where, t)
        if e.get("transform"):
            assert e["transform"].get("scale", 1.0) != 0, where
    for c in fw.get("config") or []:
        assert "canonical" in c or "default" in c, (framework, c)     # a config default may have no name
        assert "canonical" not in c or c["canonical"] in CANONICAL["config"], (framework, c)


def test_canonical_shape():
    assert list(CANONICAL)[-1] == "metrics", "metrics: must stay the last top-level key (others append to it)"
    for name, m in CANONICAL["metrics"].items():
        assert re.fullmatch(r"[a-z0-9_./@{}:-]+", name), name
        for f in ("description", "unit", "kind", "better"):
            assert f in m, (name, f)
        assert m["kind"] in ("scalar", "histogram", "text"), name
        assert m["better"] in ("higher", "lower", "none"), name


@pytest.mark.parametrize("framework", sorted(FILES))
def test_canonical_targets_exist_with_same_placeholders(framework):
    names = canonical_names()
    for e in FILES[framework]["entries"]:
        assert e["canonical"] in names, (framework, e["key"], e["canonical"])
        assert placeholders(e["key"]) == placeholders(e["canonical"]), (framework, e["key"], e["canonical"])


def _overlap(fw, a, b):
    rel = fw["releases"]
    lo = max(rindex(rel, a.get("since") or rel[0]), rindex(rel, b.get("since") or rel[0]))
    hi = min(rindex(rel, a.get("until") or rel[-1]), rindex(rel, b.get("until") or rel[-1]))
    ta, tb = set(a.get("trainers") or fw.get("trainers") or []), set(b.get("trainers") or fw.get("trainers") or [])
    return lo <= hi and bool(ta & tb)


@pytest.mark.parametrize("framework", sorted(FILES))
def test_no_conflicting_entries(framework):
    fw = FILES[framework]
    es = fw["entries"]
    for i, a in enumerate(es):
        for b in es[i + 1:]:
            if a["key"] == b["key"] and a.get("when") == b.get("when"):
                assert not _overlap(fw, a, b), (framework, "same key", a["key"], a.get("since"), b.get("since"))
            if (a["canonical"] == b["canonical"] and a.get("reverse", True) and b.get("reverse", True)
                    and a.get("when") == b.get("when") and a["key"] != b["key"]):
                assert not _overlap(fw, a, b), (framework, "two reverse entries", a["canonical"], a["key"], b["key"])


INVENTORY = [("verl",) + row for row in verl_inventory()] + [("openrlhf",) + row for row in openrlhf_inventory()]


@pytest.mark.parametrize("framework,label,key,first,last,trainer", INVENTORY,
                         ids=[f"{r[0]}:{r[2]}" for r in INVENTORY])
def test_inventory_key_covered(framework, label, key, first, last, trainer):
    assert first in FILES[framework]["releases"], (label, first)
    assert last in FILES[framework]["releases"], (label, last)
    if label in PASSTHROUGH:
        # deliberately unmapped: no entry claims it, and the engine passes it through as unmapped
        for release in (first, last):
            assert lookup(framework, key, release, trainer=trainer) is None, (label, key, release)
            assert _engine(framework, trainer, release).translate({key: 1.0}).unmapped == [key]
        return
    for release in (first, last):
        since, cfg = ROW_CONFIG.get((framework, label), (None, None))
        config = cfg if since and _index(framework, release) >= _index(framework, since) else None
        hit = lookup(framework, key, release, trainer=trainer, config=config)
        assert hit is not None, f"{framework} {key!r} ({label}) has no entry at {release}"
        if config:      # and without that config, no entry claims it there
            assert lookup(framework, key, release, trainer=trainer) is None, (framework, key, release)
        # and the real engine translates it there with an entry of that release (no out-of-range fallback)
        tr = _engine(framework, trainer, release)
        before = len(tr.notes)
        res = tr.translate({key: 1.0})
        assert not res.unmapped, f"engine leaves {key!r} unmapped for {framework}/{trainer}@{release}"
        assert not [n for n in tr.notes[before:] if "are not logged by" in n], tr.notes[before:]


_ENGINES: dict = {}


def _index(framework, release):
    return FILES[framework]["releases"].index(release)


def _engine(framework, trainer, release):
    from trackbridge.pipeline import Translator
    spec = f"{framework}/{trainer}@{release}" if trainer else f"{framework}@{release}"
    if spec not in _ENGINES:
        _ENGINES[spec] = Translator(spec, "canonical")
    return _ENGINES[spec]


def test_special_cases():
    # timing_s/ names that are not seconds get their own canonical names
    assert lookup("verl", "timing_s/agent_loop/slowest/response_length", "v0.7.0")[0]["canonical"] \
        == "response/length/slowest"
    assert lookup("verl", "timing_s/generation_timing/topk_ratio", "v0.6.0")[0]["canonical"] \
        == "perf/generation/topk_ratio"
    assert lookup("verl", "timing_s/update_actor", "v0.5.0")[1] == {"stage": "update_actor"}
    # validation templates: data sources with '/', best@n/mean parsed from the right
    e, b = lookup("verl", "val-core/openai/gsm8k/acc/best@8/mean", "v0.5.0")
    assert e["canonical"] == "val/{data_source:path}/{var}/best@{n}/mean"
    assert b == {"data_source": "openai/gsm8k", "var": "acc", "n": "8"}
    # pg_loss changes its reduction with the workers
    assert lookup("verl", "actor/pg_loss", "v0.5.0")[0]["reduce"] == {"like": "legacy_loss", "processes": "rank0"}
    assert "loss_scale_factor" in lookup("verl", "actor/pg_loss", "v0.6.1")[0]["reduce"]["deviation"]
    assert lookup("verl", "actor/kl_loss", "v0.4.1")[0]["reduce"] == {"like": "legacy_last", "estimator": "k3"}
    # renames
    assert lookup("verl", "critic/kl", "v0.3.0.post1")[0]["canonical"] == "kl/old_ref/k1"
    assert lookup("verl", "critic/kl", "v0.4.0") is None
    assert lookup("verl", "actor/ppo_kl", "v0.7.0")[0]["canonical"] == "kl/old_policy/k1"
    # entropy's token reduction follows loss_agg_mode (a switch of the one entry), seq-mean-token-sum another name
    cfg = {"actor_rollout_ref": {"actor": {"loss_agg_mode": "token-mean"}}}
    e = lookup("verl", "actor/entropy", "v0.6.0", config=cfg)[0]
    assert e is lookup("verl", "actor/entropy", "v0.6.0")[0]
    assert e["reduce"]["tokens"]["config"] == "actor_rollout_ref.actor.loss_agg_mode"
    cfg = {"actor_rollout_ref": {"actor": {"loss_agg_mode": "seq-mean-token-sum"}}}
    assert lookup("verl", "actor/entropy", "v0.6.0", config=cfg)[0]["canonical"] == "policy/entropy_seq_sum"
    # OpenRLHF kl depends on the KL-loss flag
    assert lookup("openrlhf", "kl", "v0.11.0", trainer="ppo")[0]["canonical"] == "kl/old_ref/k1"
    on = {"algo": {"kl": {"use_loss": True}}}
    assert lookup("openrlhf", "kl", "v0.11.0", trainer="ppo", config=on)[0]["canonical"] == "kl/ref/k1"
    assert lookup("openrlhf", "kl", "v0.9.0", trainer="ppo", config={"use_kl_loss": True})[0]["canonical"] \
        == "kl/ref/k1"
    e, b = lookup("openrlhf", "eval_openai/gsm8k_pass8", "v0.11.0", trainer="ppo")
    assert b == {"data_source": "openai/gsm8k", "n": "8"}
    assert lookup("openrlhf", "loss", "v0.5.0", trainer="dpo")[0]["canonical"] == "loss/total"
    assert lookup("openrlhf", "kl", "v0.5.0", trainer="kto")[0]["canonical"] == "preference/kto_kl"


def test_read_through_newest_release():
    """'now' (no `until`) means: still logged at the last release read, the last entry of `releases:`."""
    assert FILES["verl"]["releases"][-5:] == ["v0.7.0", "v0.7.1", "v0.8.0", "v0.9.0", "v0.9.1"]
    assert FILES["openrlhf"]["releases"][-3:] == ["v0.11.0", "v0.11.1", "v0.11.2"]
    header = (REFERENCE / "openrlhf-key-matrix.tsv").read_text().splitlines()[0].split("\t")
    assert header[-1] == FILES["openrlhf"]["releases"][-1]
    verl_rows = (REFERENCE / "verl-key-spans.tsv").read_text()
    assert "verl==0.9.1" in verl_rows


def test_new_release_facts():
    # v0.1 learning rates were logged x 1e4; v0.2 mfu/ before perf/mfu/
    e = lookup("verl", "actor/lr(1e-4)", "v0.1")[0]
    assert e["canonical"] == "optim/lr" and e["transform"] == {"scale": 0.0001}
    assert lookup("verl", "critic/lr(1e-4)", "v0.1rc")[0]["canonical"] == "optim/critic_lr"
    assert lookup("verl", "actor/lr(1e-4)", "v0.2") is None
    assert lookup("verl", "mfu/actor", "v0.2")[0]["canonical"] == "perf/mfu/policy_update"
    assert lookup("verl", "mfu/actor", "v0.3.0.rc0") is None
    from trackbridge.pipeline import Translator
    res = Translator("verl/ppo@0.1", "canonical").translate({"actor/lr(1e-4)": 0.1, "critic/lr(1e-4)": 0.5})
    assert res.metrics == pytest.approx({"optim/lr": 1e-5, "optim/critic_lr": 5e-5})
    # the learning rate: after the scheduler step up to v0.3.0.post1 (critic: v0.4.1), before it in the legacy
    # workers of v0.4.0 (critic: v0.5.0) .. v0.7.1, after it again in the engine workers from v0.8.0
    snap = {(k, r): lookup("verl", k, r)[0]["reduce"]["snapshot"]
            for k in ("actor/lr", "critic/lr") for r in ("v0.3.0.post1", "v0.4.1", "v0.7.1", "v0.8.0", "v0.9.1")}
    after, before = "after_scheduler_step", "before_scheduler_step"
    assert snap == {("actor/lr", "v0.3.0.post1"): after, ("actor/lr", "v0.4.1"): before,
                    ("actor/lr", "v0.7.1"): before, ("actor/lr", "v0.8.0"): after, ("actor/lr", "v0.9.1"): after,
                    ("critic/lr", "v0.3.0.post1"): after, ("critic/lr", "v0.4.1"): after,
                    ("critic/lr", "v0.7.1"): before, ("critic/lr", "v0.8.0"): after, ("critic/lr", "v0.9.1"): after}
    # the policy loss: summed over mini-batches in the legacy actor of v0.7.x, averaged over them from v0.8.0
    assert lookup("verl", "actor/pg_loss", "v0.7.1")[0]["reduce"] == {"like": "legacy_loss", "mini_batches": "sum"}
    assert lookup("verl", "actor/pg_loss", "v0.8.0")[0]["reduce"] == {"like": "engine_loss"}
    assert lookup("verl", "actor/kl_loss", "v0.9.1")[0]["source"].endswith("losses.py@v0.9.1")
    # the critic's value loss: per micro-batch floats in v0.8.0, globally normalised Metric(SUM) from v0.9.0
    assert lookup("verl", "critic/vf_loss", "v0.8.0")[0]["reduce"] == {"like": "legacy_critic_loss"}
    assert lookup("verl", "critic/vf_loss", "v0.9.0")[0]["reduce"] == {"like": "critic_engine_loss"}
    # memory readings move under actor/ and critic/ with the engine workers
    assert lookup("verl", "perf/max_memory_allocated_gb", "v0.8.0", trainer="ppo") is None
    assert lookup("verl", "actor/perf/max_memory_allocated_gb", "v0.8.0")[0]["canonical"] \
        == "perf/memory/max_allocated_gb"
    assert lookup("verl", "timing_s/generation_timing/max", "v0.8.0") is None
    # update-time entropy is not the pre-update entropy
    assert lookup("verl", "actor/entropy", "v0.9.1")[0]["reduce"]["like"] == "batch_token"     # snapshot: rollout
    assert lookup("verl", "actor/entropy_loss", "v0.9.1")[0]["reduce"]["like"] == "engine_loss"  # snapshot: update
    # the V1 trainer (default from v0.9.0) measures clip ratios against the batch's longest sequence
    assert lookup("verl", "response_length/clip_ratio", "v0.8.0")[0]["reduce"]["clip_length"] == "max_length"
    assert lookup("verl", "response_length/clip_ratio", "v0.9.1")[0]["reduce"]["clip_length"]["config"] \
        == "trainer.use_v1"
    assert lookup("verl", "train/lr(1e-3)", "v0.7.1", trainer="sft") is None
    # OpenRLHF v0.11.2
    assert lookup("openrlhf", "is_filter_ratio", "v0.11.1", trainer="ppo") is None
    # token vs seq level is a switch of the one entry's reduction (tests/frameworks/test_marks_openrlhf.py judges it)
    assert lookup("openrlhf", "is_filter_ratio", "v0.11.2", trainer="ppo")[0]["canonical"] \
        == "sampling/is_correction/filter_ratio"


def test_openrlhf_progress_bar_from_console(tmp_path):
    """OpenRLHF's tqdm postfix in a console log is read (one record per distinct postfix) and translated."""
    from trackbridge.pipeline import Translator
    from trackbridge.trackers import open_source
    bar = "Train epoch [1/1]:  {p}%|##        | {n}/4 [00:05<00:15, 5.00s/it, {post}]"
    old = "pg=0.123, rm=0.5, ret=0.45, glen=210, tlen=340, kl=0.00123, act_lr=1e-6, cri=0.0456, vals=0.21"
    new = "pg=-0.0871, rm=0.625, ret=0.6, glen=198, tlen=330, kl=0.00141, act_lr=1e-6, cri=0.0391, vals=0.25"
    text = "\r".join([bar.format(p=25, n=1, post=old), bar.format(p=50, n=2, post=old), bar.format(p=50, n=2, post=new),
                      "Episode [1/2]:   0%|          | 0/4 [00:00<?, ?it/s]"]) + "\n"
    log = tmp_path / "openrlhf.log"
    log.write_text(text)
    (run,) = list(open_source(f"console:{log}").runs())
    recs = list(run.records())
    assert [r.step for r in recs] == [1, 2]
    assert recs[0].metrics["pg"] == 0.123 and recs[1].metrics["glen"] == 198
    assert "micro-batch" in run.info.extra["progress_bar"]
    tr = Translator("openrlhf/ppo@0.7.0", "canonical")
    res = tr.translate(recs[1].metrics)
    assert not res.unmapped
    assert res.metrics["loss/policy"] == -0.0871 and res.metrics["response/length/mean"] == 198
    assert "loss/policy" in res.approximate
    new_bar = "act_loss=0.1, reward=0.5, return=0.4, gen_len=100, tot_len=200, kl=0.001, act_lr=1e-6, grad_norm=0.8"
    recs = dict(zip(*[iter(new_bar.replace(", ", "=").split("="))] * 2))
    res = Translator("openrlhf/ppo@0.11.2", "canonical").translate({k: float(v) for k, v in recs.items()})
    assert not res.unmapped and res.metrics["optim/grad_norm"] == 0.8
