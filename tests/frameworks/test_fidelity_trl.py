"""TRL fidelity claims corrected in issue 11 (items 4, 5, 7, 9, 10), each checked against the source named in the
entry: what is exact, what is approximate and why, and where the run config decides."""
from __future__ import annotations

import pytest

from trackbridge.detect import detect
from trackbridge.pipeline import Translator
from trackbridge.schema.loader import load_registry

from _support.unproven import agrees


@pytest.fixture(scope="module")
def reg():
    return load_registry()


def _canon(reg, spec, row, config=None):
    return Translator(spec, "canonical", registry=reg, config=config).translate(row)


# ------------------------------------------------------------------------------- item 4: legacy time/ppo/total
@pytest.mark.parametrize("release", ["0.2.0", "0.7.0", "0.11.4"])
def test_legacy_total_time_times_step_only(reg, release):
    """ppo_trainer.py@v0.11.4 step(): t0 = time.time() at its start, timing["time/ppo/total"] = time.time() - t0;
    generate() and the reward model run in the user's loop before step()."""
    res = _canon(reg, f"trl/ppo_legacy@{release}", {"time/ppo/total": 2.0})
    assert res.metrics == {"time/step": 2.0}
    assert "step()" in res.approximate["time/step"] and "generation" in res.approximate["time/step"]
    to_verl = Translator(f"trl/ppo_legacy@{release}", "verl@0.4.1", registry=reg).translate({"time/ppo/total": 2.0})
    assert to_verl.metrics == {"timing_s/step": 2.0} and "timing_s/step" in to_verl.approximate


# ------------------------------------------------------------------------------- item 5: DPO rewards before v0.14.0
DPO_KEYS = ["rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies", "logps/chosen",
            "logps/rejected"]


ONE_STEP = {"logging_steps": 1, "gradient_accumulation_steps": 1}     # one micro-batch per step, one step per row


@pytest.mark.parametrize("release, exact", [("0.5.0", False), ("0.11.4", False), ("0.13.0", False),
                                            ("0.14.0", True), ("0.28.0", True), ("1.16.0", True)])
def test_dpo_rewards_gathered_only_from_0_14(reg, release, exact):
    """dpo_trainer.py@v0.13.0 get_batch_loss_metrics: chosen_rewards.mean().cpu() (the logging process's batch);
    @v0.14.0: self.accelerator.gather_for_metrics(chosen_rewards).mean().item(). One step per row, one
    micro-batch per step: only the process reduction is left to differ."""
    res = _canon(reg, f"trl/dpo@{release}", {k: 0.5 for k in DPO_KEYS}, ONE_STEP)
    approx = {k for k in res.approximate if k.startswith("preference/")}
    if exact:
        assert not approx, res.approximate
    else:
        assert approx == {res.renamed[k] for k in DPO_KEYS}, res.approximate
        assert all("rank 0" in res.approximate[a] and "[processes]" in res.approximate[a] for a in approx)


def test_dpo_range_spanning_the_gather_is_approximate(reg):
    res = _canon(reg, "trl/dpo@0.12.0..0.14.0", {"rewards/chosen": 0.1}, ONE_STEP)
    assert "release matters" in res.approximate["preference/reward/chosen"], res.approximate


def test_dpo_rewards_of_the_default_window_are_approximate(reg):
    """TRL's default logging_steps (10 from v0.19.0) averages 10 steps in every row."""
    res = _canon(reg, "trl/dpo@1.16.0", {"rewards/chosen": 0.1})
    assert "logging_steps = 10 (the default)" in res.approximate["preference/reward/chosen"], res.approximate


# ------------------------------------------------------------------------------- item 9: RLOO frac_reward_zero_std
@pytest.mark.parametrize("config, exact", [
    (None, False),                                                     # default beta 0.05
    ({"beta": 0.05, "reward_clip_range": None}, False),
    ({"beta": 0.0, "reward_clip_range": None}, True),
    ({"beta": 0.0, "reward_clip_range": [-1.0, 1.0]}, False),        # clamped rewards
    ({"beta": 0.0}, False),                                            # the config does not say: the default
])
def test_rloo_zero_std_fraction_of_penalised_rewards(reg, config, exact):
    """rloo_trainer.py@v1.16.0: rewards = rewards - self.beta * kl (beta != 0) and clamp(reward_clip_range)
    before std_rewards; is_std_zero = isclose(std_rewards, 0) is what frac_reward_zero_std averages."""
    for release in ("0.22.0", "1.16.0"):
        res = _canon(reg, f"trl/rloo@{release}", {"frac_reward_zero_std": 0.25}, {**(config or {}), **ONE_STEP})
        assert agrees(res.approximate.get("reward/group_zero_std_frac")) == exact, (release, config, res.approximate)
    res = _canon(reg, "trl/grpo@1.16.0", {"frac_reward_zero_std": 0.25}, ONE_STEP)
    assert "reward/group_zero_std_frac" not in res.approximate      # GRPO's: proven (test_proof_trl_grpo.py)


def test_rloo_zero_std_exact_over_a_range_when_the_config_says_so(reg):
    res = _canon(reg, "trl/rloo@0.26.0..1.16.0", {"frac_reward_zero_std": 0.25},
                 {"beta": 0.0, "reward_clip_range": None, **ONE_STEP})
    assert agrees(res.approximate.get("reward/group_zero_std_frac")), res.approximate


# ------------------------------------------------------------------------------- item 10
@pytest.mark.parametrize("spec", ["trl/grpo@1.16.0", "trl/rloo@1.16.0", "trl/grpo@0.26.0",
                                  "trl/distillation@1.16.0"])
def test_step_time_excludes_the_optimizer_step(reg, spec):
    """grpo_trainer.py@v1.16.0 training_step: times super().training_step() (generation when due, forward,
    backward); the Trainer loop calls optimizer.step() after it."""
    res = _canon(reg, spec, {"step_time": 1.5})
    assert "optimizer.step()" in res.approximate["time/step"], res.approximate


@pytest.mark.parametrize("release, config, exact", [
    ("0.4.2", None, True), ("0.5.0", None, True),                     # no score scaling before v0.6.0
    ("0.11.4", None, False),
    ("0.11.4", {"use_score_scaling": False, "score_clip": None}, True),
    ("0.11.4", {"use_score_scaling": True, "score_clip": None}, False),
    ("0.7.0", {"use_score_scaling": False, "score_clip": 3.0}, False),
])
def test_legacy_mean_scores_is_config_not_population(reg, release, config, exact):
    """ppo_trainer.py@v0.11.4 step(): scores scaled (use_score_scaling, use_score_norm) and clipped (score_clip)
    before record_step_stats; gather_stats averages per-process means of equal-sized batches (the global mean)."""
    res = _canon(reg, f"trl/ppo_legacy@{release}", {"ppo/mean_scores": 0.3}, config)
    assert res.metrics == {"reward/score/mean": 0.3}
    if exact:
        assert agrees(res.approximate.get("reward/score/mean")), res.approximate
    else:
        why = res.approximate["reward/score/mean"]
        assert "use_score_scaling" in why and "[deviation]" in why and "[processes]" not in why, why


@pytest.mark.parametrize("order", [("ppo/mean_scores", "env/reward_mean"), ("env/reward_mean", "ppo/mean_scores")])
def test_equal_values_keep_the_exact_keys_fidelity(reg, order):
    """Two keys naming one quantity with the same value are kept once; when one of them is exact, so is the value
    (the approximate key no longer hands its flag to the exact one); when the key stated equal is not proven, the
    value says that, not the other key's difference."""
    res = _canon(reg, "trl/ppo_legacy@0.11.4", {k: 0.3 for k in order})
    assert res.metrics == {"reward/score/mean": 0.3}
    assert agrees(res.approximate.get("reward/score/mean")), res.approximate
    res = _canon(reg, "trl/ppo_legacy@0.11.4", {order[0]: 0.3, order[1]: 0.4})      # different values: a conflict
    assert res.conflicts


def test_ddpo_keys_have_their_release_range(reg):
    fw = reg.frameworks["trl"]
    for key in ("approx_kl", "clipfrac"):
        (entry,) = [e for e in fw.entries if e.key == key]
        assert fw.release_name(entry.since) == "v0.6.0" and fw.release_name(int(entry.until)) == "v0.23.1"
    det = detect(["approx_kl", "clipfrac", "reward_mean", "reward_std", "loss"], reg,
                 within=Translator("trl@1.16.0", registry=reg).source_spec)
    assert det.spec is None or det.spec.trainer != "ddpo", det.source


@pytest.mark.parametrize("within", [None, "trl", "trl@1.16.0", "trl@0.11.4"])
def test_runners_up_exist_in_the_releases_they_name(reg, within):
    """Every candidate a detection lists names a trainer in releases where that trainer exists."""
    fw = reg.frameworks["trl"]
    spec = Translator(within, registry=reg).source_spec if within else None
    for keys in (["rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies"],
                 ["objective/kl", "objective/entropy", "objective/scores", "loss/policy_avg"],
                 ["loss", "grad_norm", "learning_rate", "epoch"], ["kl", "reward", "reward_std", "entropy"]):
        det = detect(keys, reg, within=spec)
        for cand in [det.source, *det.candidates]:
            if not cand.startswith("trl/"):
                continue
            trainer, rng = cand[4:].split("@")
            lo, _, hi = rng.partition("..")
            a, b = fw.trainer_span(trainer)
            assert a <= fw.release_index(lo) and fw.release_index(hi or lo) <= b, (keys, cand)


@pytest.mark.parametrize("keys", [
    ["rewards/chosen", "rewards/rejected", "rewards/margins"],
    ["rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies"],
    ["rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies", "loss"],
    ["rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies", "logps/chosen",
     "logps/rejected", "loss"],
])
def test_minimal_dpo_dict_is_dpo(reg, keys):
    """Not GRPO (whose rewards/{reward_fn} template also matches; and before GRPO existed), not a trainer that
    declares no always-logged keys: DPO, the first declared preference trainer."""
    det = detect(keys, reg)
    assert det.source.startswith("trl/dpo@v0.5.0"), det.source


# ------------------------------------------------------------------------------- item 7: gradient accumulation
GA_CASES = [("trl/grpo@1.16.0", "entropy", "policy/entropy"), ("trl/grpo@1.16.0", "kl", "kl/ref/k3"),
            ("trl/grpo@1.16.0", "clip_ratio/region_mean", "policy/clip_frac"),
            ("trl/rloo@1.9.0", "entropy", "policy/entropy"), ("trl/dpo@1.16.0", "entropy", "policy/entropy"),
            ("trl/dpo@1.16.0", "mean_token_accuracy", "policy/token_accuracy"),
            ("trl/sft@1.16.0", "mean_token_accuracy", "policy/token_accuracy"),
            ("trl/sft@1.16.0", "entropy", "policy/entropy"), ("trl/kto@1.16.0", "logits/chosen",
                                                              "preference/logits/chosen")]


@pytest.mark.parametrize("spec, key, canon", GA_CASES)
@pytest.mark.parametrize("config, exact", [({"logging_steps": 1}, True),
                                           ({"logging_steps": 1, "gradient_accumulation_steps": 1}, True),
                                           ({"logging_steps": 1, "gradient_accumulation_steps": 4}, False),
                                           ({"logging_steps": "1", "gradient_accumulation_steps": "2"}, False)])
def test_token_means_under_gradient_accumulation(reg, spec, key, canon, config, exact):
    """grpo_trainer.py@v1.16.0: every _compute_loss call appends a (globally reduced) token mean; log() averages
    the list, sum(val) / len(val): with gradient_accumulation_steps > 1, an unweighted mean of micro-batch means,
    not the step's token mean (as for veRL). gradient_accumulation_steps left out is read as its default (1);
    config values given as text (as trackers store them) count."""
    res = _canon(reg, spec, {key: 0.5}, config)
    assert res.metrics == {canon: 0.5}
    if exact:
        assert agrees(res.approximate.get(canon)), res.approximate
    else:
        assert "micro_batches = gradient_accumulation_steps" in res.approximate[canon], res.approximate


@pytest.mark.parametrize("spec, key, canon", GA_CASES)
def test_token_means_under_the_default_logging_window(reg, spec, key, canon):
    """No config: logging_steps is read as TRL's default (10 from v0.19.0, 500 before), and a row averages that many
    steps."""
    res = _canon(reg, spec, {key: 0.5})
    assert "logging_steps" in res.approximate[canon] and "[window]" in res.approximate[canon], res.approximate


def test_dpo_logits_before_v1_are_each_process_token_mean_averaged(reg):
    """DPO's logits/* up to v0.28.0: each process's token mean, gathered and averaged unweighted
    (dpo_trainer.py@v0.25.1:1798-1803, run by tests/frameworks/test_proof_trl_old2.py), so never the canonical token
    mean over the whole batch while the process count is unknown (no TRL config key holds it), whatever the window
    and gradient accumulation."""
    for config in ({"logging_steps": 1}, {"logging_steps": 1, "gradient_accumulation_steps": 1}):
        res = _canon(reg, "trl/dpo@0.20.0", {"logits/chosen": 0.5}, config)
        why = res.approximate["preference/logits/chosen"]
        assert "[processes]" in why and "averages its processes' values unweighted" in why, why


def test_gradient_accumulation_follows_to_verl(reg):
    cfg = {"gradient_accumulation_steps": 2, "logging_steps": 1}
    res = Translator("trl/grpo@1.16.0", "verl@0.4.1", registry=reg, config=cfg).translate({"entropy": 1.0})
    assert res.metrics == {"actor/entropy": 1.0}
    assert "gradient_accumulation_steps" in res.approximate["actor/entropy"]
    res = Translator("trl/grpo@1.16.0", "trl/grpo@1.16.0", registry=reg, config=cfg).translate({"entropy": 1.0})
    assert not res.approximate                       # the same entry there and back


def test_when_comparisons_are_checked(tmp_path, reg):
    from trackbridge.schema.loader import build_registry, shipped_files
    from trackbridge.schema.yamlfile import MappingError, MappingErrors
    bad = tmp_path / "bad.yaml"
    bad.write_text("format: trackbridge.mapping/1\nframework: trl\nentries:\n"
                   "  - {key: my_key, canonical: policy/entropy, when: {config: {gradient_accumulation_steps: "
                   "{more: 1}}}, source: x.py@v1}\n")
    with pytest.raises((MappingError, MappingErrors), match="ne\\|gt\\|ge\\|lt\\|le"):
        build_registry(list(shipped_files()), [str(bad)])


@pytest.mark.integration
def test_real_sft_logs_the_unweighted_mean_of_micro_batch_means(tmp_path):
    """Run TRL 1.16.0's SFTTrainer with gradient_accumulation_steps=2 on sentences of different lengths: each
    logged mean_token_accuracy / entropy is the plain mean of what the micro-batches appended."""
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("trl")
    datasets = pytest.importorskip("datasets")
    from trl import SFTConfig, SFTTrainer

    from _support.tiny_trl import build_tiny_model, sentences

    appended: list[dict] = []

    class Probe(SFTTrainer):
        def compute_loss(self, model, inputs, *a, **kw):
            out = super().compute_loss(model, inputs, *a, **kw)
            if self.model.training:
                appended.append({k: self._metrics["train"][k][-1] for k in ("mean_token_accuracy", "entropy")})
            return out

    logs = []

    class Recorder(transformers.TrainerCallback):
        def on_log(self, args, state, control, logs_=None, **kwargs):
            logs.append(dict(kwargs.get("logs") or logs_ or {}))

    ds = datasets.Dataset.from_dict({"text": [s * (1 + i % 3) for i, s in enumerate(sentences(16, 5))]})
    args = SFTConfig(output_dir=str(tmp_path / "out"), logging_steps=1, per_device_train_batch_size=2,
                     gradient_accumulation_steps=2, max_steps=3, report_to="none", use_cpu=True, save_strategy="no",
                     seed=0, disable_tqdm=True, dataloader_num_workers=0, max_length=32)
    Probe(model=build_tiny_model(tmp_path / "m"), args=args, train_dataset=ds, callbacks=[Recorder()]).train()
    rows = [r for r in logs if "mean_token_accuracy" in r]
    assert len(rows) == 3 and len(appended) == 6
    for i, row in enumerate(rows):
        window = appended[2 * i:2 * i + 2]
        for k in ("mean_token_accuracy", "entropy"):
            assert row[k] == pytest.approx(sum(w[k] for w in window) / 2, rel=1e-6), (k, row, window)
    res = Translator("trl/sft@1.16.0", "canonical", config=args.to_dict()).translate(rows[0])
    assert "micro_batches = gradient_accumulation_steps = 2" in res.approximate["policy/token_accuracy"]


# ------------------------------------------------------------------------------- item 8: throughput per split
def test_throughput_per_split_from_its_own_counters(reg):
    """TRL 1.16.0 GRPO writes num_tokens = [self.state.num_input_tokens_seen] in train and eval mode alike
    (grpo_trainer.py _generate_and_score_completions: the counter grows in train mode only), so eval rows repeat
    the training counter: nothing is derived from it on eval rows, and a training rate() does not span an eval."""
    rows = [({"loss": 1.0, "num_tokens": 100}, 1, 10.0), ({"loss": 1.0, "num_tokens": 200}, 2, 20.0),
            ({"eval_loss": 1.0, "eval_num_tokens": 200}, 2, 21.0),     # evaluation takes 100 s
            ({"loss": 1.0, "num_tokens": 300}, 3, 130.0), ({"loss": 1.0, "num_tokens": 400}, 4, 140.0),
            ({"eval_loss": 1.0, "eval_num_tokens": 400}, 4, 141.0),
            ({"eval_loss": 1.0, "eval_num_tokens": 600}, 6, 241.0)]
    tr = Translator("trl/grpo@1.16.0", "canonical", registry=reg, derive=True)
    derived = []
    for row, step, t in rows:
        res = tr.translate(row, step=step, wall_time=t)
        derived.append({k: res.metrics[k] for k in res.derived})
    assert derived[1] == {"perf/tokens_per_step": 100.0, "perf/tokens_per_s": 10.0}
    assert derived[3] == {"perf/tokens_per_step": 100.0}                    # 100 tokens over 110 s: not a rate
    assert derived[4] == {"perf/tokens_per_step": 100.0, "perf/tokens_per_s": 10.0}
    assert derived[2] == derived[5] == derived[6] == {}                     # eval rows: no counter of their own
    assert any("across an evaluation" in n for n in tr.notes)


def test_one_record_with_both_splits(reg):
    """A record holding a training row and the evaluation logged after it at the same step (a merged export):
    the training rate of that record stands, the next one restarts after the evaluation."""
    tr = Translator("trl/grpo@1.16.0", "canonical", registry=reg, derive=True)
    tr.translate({"num_tokens": 100}, step=1, wall_time=10.0)
    res = tr.translate({"num_tokens": 200, "eval_num_tokens": 200, "eval_loss": 0.5}, step=2, wall_time=20.0)
    assert res.metrics["perf/tokens_per_s"] == 10.0 and "eval/perf/tokens_per_s" not in res.metrics
    res = tr.translate({"num_tokens": 300}, step=3, wall_time=130.0)
    assert "perf/tokens_per_s" not in res.metrics and res.metrics["perf/tokens_per_step"] == 100.0
