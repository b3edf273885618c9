"""The printed console forms of NeMo-RL and slime translate: NeMo-RL's bullet blocks (read by the console reader as
'SECTION/Label' keys) are entries of mappings/nemo_rl.yaml, approximate [rounding] against the logged keys they print
and never written back; slime's printed `step N: {...}` dicts carry the logged names, with train/step (the x axis),
every parameter group's train/lr-pg_{n} and the TIS diagnostics placed.

Each fact was read from the framework's source at the tag (cited file@tag:line) and is restated here, not read from
the mapping, so a mapping that drifts from the source fails. The real logs are tests/data/real/nemo_rl and
tests/data/real/slime (provenance in their SOURCES.yaml); the synthetic blocks below are written exactly as the cited
print calls format them."""
from __future__ import annotations

import pytest

from trackbridge.pipeline import Translator
from trackbridge.read.inputs import open_runs
from trackbridge.schema.loader import load_registry

from _support import DATA

REAL = DATA / "real"
NEMO_TAGS = ["v0.1.0", "v0.1.1", "v0.2.0", "v0.2.1", "v0.3.0", "v0.3.1", "v0.4.0", "v0.5.0", "v0.6.0", "v0.7.0"]
SLIME_TAGS = ["v0.1.0", "v0.2.0", "v0.2.0.post1", "v0.2.1", "v0.2.2", "v0.2.3", "v0.2.4", "v0.3.0", "v0.3.1"]


@pytest.fixture(scope="module")
def reg():
    return load_registry()


def read(path, reg, source="auto", config=None):
    """Every record of ``path`` as the CLI reads it (open_runs with rows), translated to canonical by one Translator
    per run: [(raw metrics, Translation)]."""
    out = []
    for run in open_runs(str(path), rows=True):
        tr = Translator(source, "canonical", registry=reg, config=config)
        for rec in run.records():
            raw = {k: v for k, v in rec.metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
            out.append((raw, tr.translate(dict(raw))))
    assert out, f"{path}: no records read"
    return out


def detected_range(reg, res, framework):
    """(lo, hi) release indices of the translation's resolved source 'FRAMEWORK/TRAINER@LO..HI'."""
    fw = reg.frameworks[framework]
    assert res.source.startswith(f"{framework}/"), res.source
    rel = res.source.split("@", 1)[1].split(" ", 1)[0]
    lo, _, hi = rel.partition("..")
    return fw.release_index(lo), fw.release_index(hi or lo)


# -- NeMo-RL: the real async-GRPO paste -----------------------------------------------------------------------------
# tests/data/real/nemo_rl/01_pr1052_async_grpo_console.log: async_grpo_train's print sequence
# (nemo_rl/algorithms/grpo.py@v0.4.0:2195-2209): '  • Loss: {:.4f}' (:2196, metrics['loss'], logged as train/loss),
# '  • Avg Reward: {:.4f}' (:2197, np.mean(rewards), train/reward), Buffer Size (:2198) and Avg Trajectory Age
# (:2199, both passed through), '  • Total step time: {:.2f}s' (:2203, timing/train/total_step_time) and every other
# timer '  • {k}: {v:.2f}s ({pct:.1f}%)' (:2209, timing/train/{k}).
NEMO_01_CANONICAL = {
    "Training Results/Loss": "loss/total",
    "Training Results/Avg Reward": "reward/score/mean",
    "Timing/Total step time": "time/step",
    "Timing/exposed_generation": "time/exposed_generation",
    "Timing/policy_training": "time/policy_training",
    "Timing/policy_and_reference_logprobs": "time/policy_and_reference_logprobs",
    "Timing/buffer_sampling": "time/buffer_sampling",
    "Timing/logprob_inference_prep": "time/logprob_inference_prep",
    "Timing/training_prep": "time/training_prep",
    "Timing/data_processing": "time/data_processing",
    "Timing/weight_sync": "time/weight_sync",
}
NEMO_01_PASSTHROUGH = ["Training Results/Buffer Size", "Training Results/Avg Trajectory Age"]


def test_nemo_async_paste_is_detected_and_every_printed_label_placed(reg):
    [(raw, res)] = read(REAL / "nemo_rl" / "01_pr1052_async_grpo_console.log", reg)
    assert set(raw) == set(NEMO_01_CANONICAL) | set(NEMO_01_PASSTHROUGH)
    assert res.source.startswith("nemo_rl/grpo@"), res.source
    for key, canonical in NEMO_01_CANONICAL.items():
        assert res.renamed.get(key) == canonical, (key, res.renamed.get(key))
    fw = reg.frameworks["nemo_rl"]
    for key in NEMO_01_PASSTHROUGH:
        assert key in res.unmapped and fw.logs_unmapped(key), key
    assert res.metrics["loss/total"] == 0.1032 and res.metrics["time/step"] == 66.55


def test_nemo_printed_values_are_approximate_for_their_rounding(reg):
    """':.4f' (grpo.py@v0.4.0:2196-2197) and ':.2f' (:2203, :2209): a printed value is the logged one rounded."""
    [(_, res)] = read(REAL / "nemo_rl" / "01_pr1052_async_grpo_console.log", reg, source="nemo_rl@v0.4.0")
    assert "rounded to 4 decimals" in res.approximate["loss/total"]
    assert "rounded to 4 decimals" in res.approximate["reward/score/mean"]
    assert "rounded to 2 decimals" in res.approximate["time/step"]
    assert "rounded to 2 decimals" in res.approximate["time/policy_training"]


def test_nemo_printed_labels_are_never_written_back(reg):
    """canonical -> nemo_rl writes the logged keys (grpo.py@v0.4.0:2222-2224: prefixes train, timing/train), not the
    console labels."""
    res = Translator("canonical", "nemo_rl@v0.4.0", registry=reg).translate(
        {"loss/total": 0.1, "reward/score/mean": 0.3, "time/step": 60.0, "time/policy_training": 20.0})
    assert set(res.metrics) == {"train/loss", "train/reward", "timing/train/total_step_time",
                                "timing/train/policy_training"}


def test_nemo_headerless_timing_bullets_are_not_read_as_metrics(reg):
    """03_pr1076 is three timing bullets without their '⏱️  Timing:' header (the PR author abridged the output):
    without a section the reader cannot name them, so nothing is translated from it (the lead's corpus test expects
    Timing/prepare_for_generation/transfer_and_update_weights; see the report)."""
    runs = open_runs(str(REAL / "nemo_rl" / "03_pr1076_refit_timing_abridged.log"), rows=True)
    keys = {k for run in runs for rec in run.records() for k in rec.metrics}
    assert not any(k.startswith("Timing/") for k in keys)


# -- NeMo-RL: every printed label, as the print calls write them -----------------------------------------------------
# grpo_train at v0.1.0 (nemo_reinforcer/algorithms/grpo.py@v0.1.0): the banner f"\n{'=' * 25} Step {step + 1}/{...}
# {'=' * 25}" (:450); validate() prints '📊 Validation Results:' (:757), '    • Accuracy: {:.4f}' (:758,
# validation/accuracy), '    • Average response length: {:.1f} tokens' (:759, validation/avg_length),
# '    • Samples processed: {}' (:760, never logged), '  ⏱️  Validation Timing:' (:763) and '    • Total validation
# time: {:.2f}s' (:765); the step prints '📊 Training Results:' (:625), Loss (:636), Avg Reward (:637), '  • Mean
# Generation Length: {:.4f}' (:639, gen_metrics['mean_generation_length'], train/mean_generation_length) and the
# Timing block (:642-653).
NEMO_V010_BLOCK = """\
========================= Step 1/20 =========================
▶ Preparing batch...

📊 Validation Results:
    • Accuracy: 0.2500
    • Average response length: 512.3 tokens
    • Samples processed: 256

  ⏱️  Validation Timing:
    • Total validation time: 41.20s

📊 Training Results:
  • Loss: 0.0123
  • Avg Reward: 0.4000
  • Mean Generation Length: 812.1250

⏱️  Timing:
  • Total step time: 100.00s
  • generation: 60.00s (60.0%)
  • policy_training: 30.00s (30.0%)
  • prepare_for_generation: 5.00s (5.0%)
"""
NEMO_V010_CANONICAL = {
    "Validation Results/Accuracy": "val/score",
    "Validation Results/Average response length": "val/response_length/mean",
    "Training Results/Loss": "loss/total",
    "Training Results/Avg Reward": "reward/score/mean",
    "Training Results/Mean Generation Length": "response/length/mean",
    "Timing/Total step time": "time/step",
    "Timing/generation": "time/generation",
    "Timing/policy_training": "time/policy_training",
    "Timing/prepare_for_generation": "time/prepare_for_generation",
}


def test_nemo_v010_blocks_translate(reg, tmp_path):
    path = tmp_path / "nemo_v010.log"
    path.write_text(NEMO_V010_BLOCK)
    [(raw, res)] = read(path, reg)
    for key, canonical in NEMO_V010_CANONICAL.items():
        assert res.renamed.get(key) == canonical, (key, res.renamed.get(key))
    fw = reg.frameworks["nemo_rl"]
    for key in ("Validation Results/Samples processed", "Validation Timing/Total validation time"):
        assert key in raw and key in res.unmapped and fw.logs_unmapped(key), key
    lo, hi = detected_range(reg, res, "nemo_rl")
    assert lo <= NEMO_TAGS.index("v0.1.0") <= hi, res.source
    assert "rounded to 1 decimal" in res.approximate["val/response_length/mean"]


# grpo_train from v0.5.0 (nemo_rl/algorithms/grpo.py@v0.5.0:1608-1645; @v0.7.0:3044-3083): '  • Generation KL Error:
# {:.4f}' (v0.5.0:1611, metrics['gen_kl_error'], train/gen_kl_error; printed from v0.5.0); with
# grpo.use_dynamic_sampling 'Avg Filtered Reward' (:1613, the kept groups' mean: train/filtered_reward, passed
# through) and 'Avg Total Reward' (:1615, np.mean(repeated_batch['total_reward']), logged as train/reward,
# grpo.py@v0.4.0:1195); v0.6.0+ '  • Draft Loss: {:.4f}' when a draft model trains (grpo.py@v0.6.0:2122).
NEMO_V050_BLOCK = """\
========================= Step 3/20 =========================

📊 Training Results:
  • Loss: 0.0123
  • Draft Loss: 1.2000
  • Generation KL Error: 0.0011
  • Avg Filtered Reward: 0.5000
  • Avg Total Reward: 0.4000
  • Mean Generation Length: 812.1250

⏱️  Timing:
  • Total step time: 100.00s
  • generation: 60.00s (60.0%)
  • prepare_for_generation/total: 5.00s (5.0%)
"""


def test_nemo_v050_block_translates_from_its_release(reg, tmp_path):
    path = tmp_path / "nemo_v050.log"
    path.write_text(NEMO_V050_BLOCK)
    [(raw, res)] = read(path, reg)
    assert res.renamed["Training Results/Generation KL Error"] == "kl/rollout/k3"
    assert res.renamed["Training Results/Avg Total Reward"] == "reward/score/mean"
    assert res.renamed["Timing/prepare_for_generation/total"] == "time/prepare_for_generation/total"
    fw = reg.frameworks["nemo_rl"]
    for key in ("Training Results/Avg Filtered Reward", "Training Results/Draft Loss"):
        assert key in res.unmapped and fw.logs_unmapped(key), key
    lo, _ = detected_range(reg, res, "nemo_rl")
    assert lo >= NEMO_TAGS.index("v0.5.0"), res.source        # the KL error is printed from v0.5.0 on


def test_nemo_printed_generation_kl_follows_the_kl_type(reg, tmp_path):
    """gen_kl_error uses loss_fn.reference_policy_kl_type (calculate_kl, nemo_rl/algorithms/utils.py@v0.7.0): k1 is
    kl/rollout/k1, printed or logged."""
    path = tmp_path / "nemo_v050.log"
    path.write_text(NEMO_V050_BLOCK)
    [(_, res)] = read(path, reg, source="nemo_rl@v0.7.0", config={"loss_fn": {"reference_policy_kl_type": "k1"}})
    assert res.renamed["Training Results/Generation KL Error"] == "kl/rollout/k1"


# -- slime: the printed train dicts ---------------------------------------------------------------------------------
# slime/backends/megatron_utils/model.py@v0.3.1:873-890 builds the train dict: every loss_dict key as train/<key>,
# train/grad_norm (:880), train/lr-pg_{param_group_id} for every optimizer param group (:884-885), then
# log_dict["train/step"] = accumulated_step_id (:889, rollout_id * num_steps_per_rollout + step_id, :873) and
# logging_utils.log(..., step_key="train/step") (:890); v0.1.0 printed the dict after setting train/step
# (model.py@v0.1.0:467,476). The TIS keys are every key of vanilla_tis_function's result (loss.py@v0.3.1:847-849,
# logged by the loop at :1098-1100).
SLIME_01 = REAL / "slime" / "01_prorl_issue40_step.log"       # v0.3.0..v0.3.1 (SOURCES.yaml)
SLIME_05 = REAL / "slime" / "05_issue1136_step_oom.log"       # v0.2.1 (SOURCES.yaml)


def test_slime_train_step_is_the_step_axis(reg):
    for raw, res in read(SLIME_01, reg):
        assert res.renamed["train/step"] == "progress/step"
        assert res.metrics["progress/step"] == raw["train/step"]
        assert res.renamed["train/lr-pg_0"] == "optim/lr"
        assert "progress/step" not in res.approximate or "stated, not proven" in res.approximate["progress/step"]
        lo, hi = detected_range(reg, res, "slime")
        assert lo <= SLIME_TAGS.index("v0.3.0") <= hi


@pytest.mark.parametrize("path,groups", [(SLIME_01, 2), (SLIME_05, 3)], ids=["issue40", "issue1136"])
def test_slime_every_parameter_groups_lr_is_placed(reg, path, groups):
    """One train/lr-pg_{n} per param group (model.py@v0.3.1:884-885; @v0.2.1:633-634): group 0 is optim/lr, the
    others pass through as slime's own keys (one canonical learning rate per step)."""
    fw = reg.frameworks["slime"]
    for raw, res in read(path, reg):
        assert {f"train/lr-pg_{n}" for n in range(groups)} <= set(raw)
        for n in range(1, groups):
            key = f"train/lr-pg_{n}"
            assert key in res.unmapped and fw.logs_unmapped(key) and not fw.lookup(key), key


def test_slime_tis_keys_are_slimes_own(reg):
    fw = reg.frameworks["slime"]
    for raw, res in read(SLIME_01, reg):
        for key in ("train/tis", "train/tis_clipfrac", "train/tis_abs", "train/ois"):
            assert key in raw and key in res.unmapped and fw.logs_unmapped(key), key


# loss.py at each tag: v0.1.0 reported_loss["tis"], ["tis_clipfrac"] (loss.py@v0.1.0:325,327, with --use-tis); from
# v0.2.0 every key of the TIS function's result, "tis", "tis_clipfrac", "tis_abs" (loss.py@v0.2.0:450-452,531-533;
# @v0.2.1:378-380,588-590; @v0.2.2:408-410,648-650; @v0.2.3 and @v0.2.4:579-581,819-821; @v0.3.0:766-768,1016-1018;
# @v0.3.1:847-849,1098-1100)
TIS_LOGGED = {"train/tis": SLIME_TAGS, "train/tis_clipfrac": SLIME_TAGS, "train/tis_abs": SLIME_TAGS[1:]}


def test_slime_inventory_has_the_tis_keys_at_every_release_that_logs_them():
    rows = {}
    for ln in (DATA / "frameworks" / "slime-keys.tsv").read_text().splitlines():
        if ln and not ln.startswith("#") and not ln.startswith("key\t"):
            cells = ln.split("\t")
            rows[cells[0]] = cells
    for key, tags in TIS_LOGGED.items():
        present = [m for m in rows[key][3].split() if m != "."]
        assert present == tags, (key, present)
        assert rows[key][5].startswith("passthrough:"), key


# rollout/step and eval/step: compute_rollout_step(args, rollout_id) (slime/utils/metric_utils.py@v0.3.1:120-123), set
# into the rollout and eval dicts (slime/ray/rollout.py@v0.3.1:1288,1308) and logged with them; they count rollouts.
def test_slime_rollout_and_eval_step_count_rollouts(reg):
    rollout = Translator("slime@v0.3.1", "canonical", registry=reg).translate(
        {"rollout/raw_reward": 0.5, "rollout/step": 3})
    assert rollout.renamed["rollout/step"] == "progress/step"
    assert "counts rollouts" in rollout.approximate["progress/step"]
    ev = Translator("slime@v0.3.1", "canonical", registry=reg).translate({"eval/aime": 0.4, "eval/step": 3})
    assert ev.renamed["eval/step"] == "progress/step"          # not a dataset 'step' of eval/{data_source}
    assert ev.renamed["eval/aime"] == "val/aime/score"
    assert "val/step/score" not in ev.metrics


def test_slime_progress_step_is_written_as_train_step(reg):
    res = Translator("canonical", "slime@v0.3.1", registry=reg).translate({"progress/step": 7, "loss/total": 0.1})
    assert res.metrics == {"train/step": 7, "train/loss": 0.1}


# print_performance_metrics (nemo_rl/algorithms/utils.py@v0.4.0:391-562; @v0.7.0:561-871), called after the Timing
# block: '🔍 Performance Metrics:', '  • Throughputs (per GPU):' (v0.7.0:824) with '    - E2E (Tokens/sec/gpu):
# {:.2f}' (:826, performance/tokens_per_sec_per_gpu), '  • Throughputs (per Group):' (:840) with '    - E2E
# (Samples/sec): {:.2f}' (:842, performance/samples_per_sec) and '    - E2E (Tokens/sec): {:.2f}' (:845,
# performance/tokens_per_sec), then '  • Training FLOPS: {:.2f} TFLOPS (...)' (:864) and '  • Training Model Floating
# Point Utilization: {100 * total_tflops / theoretical_tflops:.2f}%' (:871, performance/train_fp_utilization, a
# fraction).
NEMO_PERF_BLOCK = """\
========================= Step 2/20 =========================

📊 Training Results:
  • Loss: 0.0123
  • Generation KL Error: 0.0011
  • Avg Reward: 0.4000

⏱️  Timing:
  • Total step time: 100.00s

🔍 Performance Metrics:
  • Throughputs (per GPU):
    - E2E (Samples/sec/gpu): 1.25
    - E2E (Tokens/sec/gpu): 2164.81
    - Policy Training (Tokens/sec/gpu): 2572.71
  • Throughputs (per Group):
    - E2E (Samples/sec): 2.50
    - E2E (Tokens/sec): 4329.63
  • Training FLOPS: 123.45 TFLOPS (61.72 TFLOPS per rank)
  • Training Model Floating Point Utilization: 12.34%
"""


def test_nemo_performance_block_translates(reg, tmp_path):
    path = tmp_path / "nemo_perf.log"
    path.write_text(NEMO_PERF_BLOCK)
    [(_, res)] = read(path, reg)
    assert res.metrics["perf/throughput"] == 2164.81
    assert res.metrics["perf/samples_per_s"] == 2.5
    assert res.metrics["perf/tokens_per_s"] == 4329.63
    assert res.metrics["perf/mfu/policy_update"] == pytest.approx(0.1234)      # printed as a percentage
    fw = reg.frameworks["nemo_rl"]
    for key in ("Throughputs (per GPU)/E2E (Samples/sec/gpu)", "Throughputs (per GPU)/Policy Training (Tokens/sec/gpu)",
                "Throughputs (per Group)/Training FLOPS"):
        assert key in res.unmapped and fw.logs_unmapped(key), key
    lo, _ = detected_range(reg, res, "nemo_rl")
    assert lo >= NEMO_TAGS.index("v0.4.0"), res.source


# -- NeMo-RL: the keys of the committed CI metrics.json files the GRPO mapping had not listed -------------------------
# The Ray GPU monitor (nemo_rl/utils/logger.py@v0.7.0:591-601 node.N.gpu.I.util|mem_gb, node.N.mem_gb|mem_total_gb,
# metric_prefix 'ray' and step metric 'ray/ray_step' at :993-994; TensorBoard prefixes the step metric too:
# ray/ray/ray_step), worker setup timing logged once with prefix timing/setup (grpo.py@v0.7.0:1228) and vLLM's
# speculative-decoding deltas (models/generation/vllm/utils.py@v0.6.0:126-172, logged with prefix train): NeMo-RL's
# own keys without a canonical name.
@pytest.mark.parametrize("file,prefixes", [
    ("05_ci_functional_grpo_frozen_env_metrics.json", ("ray/node.", "ray/ray/ray_step")),
    ("06_ci_functional_audio_grpo_megatron_metrics.json", ("timing/setup/", "train/vllm/spec_"))], ids=["05", "06"])
def test_nemo_ci_metrics_monitor_setup_and_vllm_keys_are_nemo_rls(reg, file, prefixes):
    fw = reg.frameworks["nemo_rl"]
    seen = {p: 0 for p in prefixes}
    for raw, res in read(REAL / "nemo_rl" / file, reg):
        assert res.source.startswith("nemo_rl/grpo@"), res.source
        for key in raw:
            for p in prefixes:
                if key.startswith(p):
                    assert fw.logs_unmapped(key) and not fw.lookup(key) and key in res.unmapped, key
                    seen[p] += 1
    assert all(seen.values()), seen
