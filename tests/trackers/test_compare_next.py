"""compare puts a NeMo-RL, an AReaL and a veRL GRPO run on one report (issue 21), each detected from its keys with
trainer and release left out, each translated with its own stated reductions under its own run config, and each
chart and table says where a run's value is not the canonical quantity, and why (the reasons computed from the
mappings' reduce: statements, not written by hand).

The runs are canonical-stream files whose header holds the run config (as trackbridge's readers give every tracker's
stored config), with the keys each framework logs (tests/data/frameworks/*-keys.tsv; mappings/verl.yaml).
"""
from __future__ import annotations

import pytest

from trackbridge.compare import compare_runs
from trackbridge.pipeline import Translator
from trackbridge.record import RunInfo, dumps

STEPS = 4

NEMO = {"train/loss": 0.02, "train/kl_penalty": 0.003, "train/reward": 0.4, "train/grad_norm": 1.5, "train/lr": 1e-6,
        "train/approx_entropy": 0.52, "train/gen_kl_error": 0.0011, "train/mean_gen_tokens_per_sample": 310.0,
        "train/token_mult_prob_error": 1.01, "train/probs_ratio": 1.0, "timing/train/total_step_time": 41.0}
# two global batches per step: 32 prompts x 16 generations / 256 (grpo_math_1B.yaml's default is 512: one)
NEMO_CONFIG = {"grpo": {"num_prompts_per_step": 32, "num_generations_per_prompt": 16},
               "policy": {"train_global_batch_size": 256}, "loss_fn": {"token_level_loss": True}}

AREAL = {"ppo_actor/update/actor_loss/avg": -0.01, "ppo_actor/update/entropy/avg": 0.61,
         "ppo_actor/update/approx_kl/avg": -0.0007, "ppo_actor/update/clip_ratio/avg": 0.02,
         "ppo_actor/task_reward/avg": 0.45, "ppo_actor/update/grad_norm": 0.9, "ppo_actor/update/lr": 1e-6,
         "ppo_actor/no_eos_ratios/avg": 0.12, "ppo_actor/seq_len/avg": 720.0, "timeperf/train_step": 30.0,
         "ppo_actor/update/importance_weight/avg": 1.0}
AREAL_CONFIG = {"actor": {"ppo_n_minibatches": 4}}

VERL = {"actor/pg_loss": -0.008, "actor/kl_loss": 0.0025, "actor/entropy": 0.58, "actor/ppo_kl": 0.0006,
        "actor/pg_clipfrac": 0.015, "actor/grad_norm": 1.1, "actor/lr": 1e-6, "critic/score/mean": 0.42,
        "response_length/mean": 305.0, "timing_s/step": 38.0}
VERL_CONFIG = {"algorithm": {"adv_estimator": "grpo"},
               "actor_rollout_ref": {"actor": {"use_kl_loss": True, "kl_loss_type": "low_var_kl"}, "rollout": {"n": 8}}}


def _run(path, name, metrics, config):
    lines = [dumps(RunInfo(name=name, run_id=name, config=config).to_json())]
    for s in range(STEPS):
        lines.append(dumps({"step": s, "wall_time": 1767225600.0 + 60 * s,
                            "metrics": {k: v * (1 + 0.1 * s) for k, v in metrics.items()}}))
    path.write_text("\n".join(lines) + "\n")
    return f"{name}=jsonl:{path}"


@pytest.fixture
def result(tmp_path):
    locs = [_run(tmp_path / "nemo.jsonl", "nemo", NEMO, NEMO_CONFIG),
            _run(tmp_path / "areal.jsonl", "areal", AREAL, AREAL_CONFIG),
            _run(tmp_path / "verl.jsonl", "verl", VERL, VERL_CONFIG)]
    return compare_runs(locs, out=tmp_path / "report")


def test_three_frameworks_on_one_report(result):
    sources = {r.label: r.source for r in result.runs}
    assert sources["nemo"].startswith("nemo_rl/grpo") and sources["areal"].startswith("areal/ppo") \
        and sources["verl"].startswith("verl/ppo"), sources
    for name, runs in (("reward/score/mean", {"nemo", "areal", "verl"}), ("policy/entropy", {"nemo", "areal", "verl"}),
                       ("optim/lr", {"nemo", "areal", "verl"}), ("optim/grad_norm", {"nemo", "areal", "verl"}),
                       ("kl/ref/k3", {"nemo", "verl"}), ("kl/old_policy/k1", {"areal", "verl"}),
                       ("loss/policy", {"areal", "verl"})):
        mr = result.metric(name)
        assert mr is not None and set(mr.runs) == runs, (name, mr and mr.runs)
    assert result.html is not None and result.html.exists() and result.summary_md is not None
    # AReaL's approx_kl is log pi - log pi_old: on the canonical k1 of KL(old || pi) it is negated
    (kl,) = [s for s in result.metric("kl/old_policy/k1").stats if s.run == "areal"]
    assert kl.first == pytest.approx(-AREAL["ppo_actor/update/approx_kl/avg"])


def test_the_fidelity_warnings_come_from_each_runs_reductions(result):
    def why(metric, run):
        return result.metric(metric).approximate.get(run)

    # NeMo-RL: two global batches averaged unweighted; the lr before the scheduler step; the sampled entropy
    assert "averages its 2 mini-batches" in why("kl/ref/k3", "nemo")
    assert "keeps the last of its 2 mini-batches" in why("optim/grad_norm", "nemo")
    assert "before the scheduler" in why("optim/lr", "nemo")
    assert "sampled estimator" in why("policy/entropy", "nemo")
    assert why("reward/score/mean", "nemo") is None      # the reference as stated, proven (NeMo-RL v0.7.0's own code)
    # AReaL: token statistics pooled over every level (exact); the optimizer scalars averaged over 4 mini-batches;
    # the truncation share measured against the padded batch
    assert why("policy/entropy", "areal") is None and why("loss/policy", "areal") is None
    assert why("reward/score/mean", "areal") is None
    # approx_kl's pi_old is the inference engine's log-prob under AReaL's defaults (cli_args.py@v1.0.4:1479-1489)
    assert "[deviation]" in why("kl/old_policy/k1", "areal") and "inference engine" in why("kl/old_policy/k1", "areal")
    assert "averages its 4 mini-batches" in why("optim/grad_norm", "areal")
    assert "before the scheduler" in why("optim/lr", "areal")
    assert "longest" in why("response/clip_ratio", "areal")
    # veRL: whatever mappings/verl.yaml says for its keys under this config, and nothing else
    tr = Translator("auto", "canonical", config=VERL_CONFIG)
    direct = tr.translate(VERL).approximate
    for mr in result.metrics:
        if "verl" in mr.runs:
            assert mr.approximate.get("verl") == direct.get(mr.name), mr.name
    # the report says it next to each metric
    md = result.summary_md.read_text()
    assert "sampled estimator" in md and "averages its 4 mini-batches" in md and "keeps the last of its 2" in md
    html = result.html.read_text()
    assert "Not the same quantity in every run" in html
