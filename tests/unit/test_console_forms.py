"""The printed forms of NeMo-RL, AReaL, slime, SkyRL and prime-rl, read by ``console:`` (issue 29), on the real logs
of tests/data/real (provenance in each folder's SOURCES.yaml): every value below was read off the file by eye."""
from __future__ import annotations

import math

import pytest

from trackbridge.trackers import open_source

from _support import DATA

REAL = DATA / "real"


def read(path):
    (run,) = open_source(f"console:{path}").runs()
    return run, list(run.records())


def by_step(records):
    out = {}
    for r in records:
        assert r.step not in out, f"step {r.step} twice"
        out[r.step] = r.metrics
    return out


def test_slime_step_dicts():
    run, recs = read(REAL / "slime" / "01_prorl_issue40_step.log")
    steps = by_step(recs)
    assert sorted(steps) == [1, 28]
    assert steps[1]["train/loss"] == 0.10215942561626434
    assert steps[28]["train/grad_norm"] == 2217390918.482301
    assert len(steps[1]) == 15 and steps[1]["train/step"] == 1
    assert run.info.extra["format"].startswith("step-dict")


def test_slime_perf_dicts_at_their_rollout_id():
    _, recs = read(REAL / "slime" / "02_issue1837_perf.log")
    steps = by_step(recs)
    assert steps[0]["rollout/response_len/mean"] == 2773.71484375
    assert steps[0]["rollout/zero_std/count_1"] == 14


def test_nemo_rl_bullet_blocks_are_one_record_keyed_by_their_section():
    run, recs = read(REAL / "nemo_rl" / "01_pr1052_async_grpo_console.log")
    assert len(recs) == 1
    m = recs[0].metrics
    assert m["Training Results/Loss"] == 0.1032
    assert m["Training Results/Avg Reward"] == 0.3486
    assert m["Training Results/Buffer Size"] == 64
    assert m["Timing/Total step time"] == 66.55
    assert m["Timing/policy_training"] == 25.05          # "25.05s (37.6%)": the seconds, not the share
    assert m["Timing/weight_sync"] == 0.13
    assert len(m) == 13
    assert run.info.extra["step_source"] == "ordinal"


def test_prime_rl_labelled_lines():
    _, recs = read(REAL / "prime_rl" / "01_pr1318_orchestrator.log")
    steps = by_step(recs)
    assert sorted(steps) == [28, 29, 30, 31]
    assert steps[29] == {"Time": 72.73, "Reward": 0.4018, "Throughput": 2288.1, "Seq. Length": 323.3,
                         "Async Level": 1, "Max. Off-Policy Level": 0}


def test_areal_stats_tables():
    _, recs = read(REAL / "areal" / "01_issue110_realhf_masterworker_table.log")
    merged = {}
    for r in recs:
        merged.update(r.metrics)
    assert merged["ppo_actor/new_logp/min"] == pytest.approx(-18.766)
    assert merged["ppo_actor/vocab_min_logits/min"] == pytest.approx(-59.688)
    assert all(isinstance(v, (int, float)) and math.isfinite(v) for v in merged.values())


def test_a_json_dict_after_step_equals():
    _, recs = read(REAL / "skyrl" / "01_marinskyrl_catcount_healthy.log")
    assert recs[0].step == 0 and recs[0].metrics == {"eval/sampled/train/avg_score": 0.24539757878014334}
    assert recs[1].step == 1 and recs[1].metrics["policy/final_loss"] == 0.32756934594362974


def test_lines_that_only_look_like_forms_are_noise_and_said(tmp_path):
    p = tmp_path / "x.log"
    p.write_text("  • Loss: 0.5\n"                    # a bullet with no header above it
                 "Status | ok\n"                      # one item, no number
                 "Results:\n  • Loss: 0.25\n  • Reward: 1.5\n"
                 "step 3: {'a': 'text'}\n"            # a dict with no numbers
                 "step 4: {'loss': 0.1, 'kl': 0.2}")  # cut off: no newline
    run, recs = read(p)
    assert [r.metrics for r in recs] == [{"Results/Loss": 0.25, "Results/Reward": 1.5}]
    text = " ".join(f"{pr.where} {pr.what}" for pr in run.problems)
    assert "step 3: the dict holds no numbers" in text
    assert "cut off" in text
    assert "lines without metrics" in text


def test_a_verl_line_broken_in_two_and_cut_off_at_its_end_keeps_its_whole_items():
    """The stored issue text breaks the step line inside 'response_length/cl' + 'ip_ratio:0.004' (a 1,000-character
    piece) and ends in 'timing_per_token_ms/ref:' (cut): the two pieces are one line again, and its 45 items before
    the cut name are whole."""
    run, recs = read(REAL / "verl" / "03_issue1208_sglang.log")
    assert len(recs) == 1 and recs[0].step == 2
    m = recs[0].metrics
    assert m["global_seqlen/min"] == 538646.0 and m["response_length/clip_ratio"] == 0.004 and len(m) == 45
    assert m["timing_per_token_ms/adv"] == 0.001 and "timing_per_token_ms/ref" not in m
    assert "response_length/cl" not in m and "ip_ratio" not in m
    assert any("'timing_per_token_ms/ref:', a name with no value (cut off?)" in pr.what for pr in run.problems)
    assert "lines 1-2" in run.info.extra["joined_lines"]


def test_a_verl_line_wrapped_at_the_terminal_width_is_one_line_again():
    """veRL issue 1224's paste: the step line hard-wrapped every 238 characters, inside a number ('actor/ppo_kl:0.0'
    + '00'), a key ('c' + 'ritic/score/max') and at a separator (' - actor/entropy_loss'); the corpus copy ends in
    'critic/returns/' (the piece after it, cut by the store, left out)."""
    run, recs = read(REAL / "verl" / "12_issue1224_gae_wrapped.log")
    assert len(recs) == 1 and recs[0].step == 1049
    m = recs[0].metrics
    assert m["actor/ppo_kl"] == 0.0 and m["actor/pg_clipfrac_lower"] == 0.0 and m["critic/score/max"] == 0.133
    assert m["actor/entropy_loss"] == 0.001 and m["critic/advantages/min"] == -2.815 and len(m) == 32
    assert "lines 1-4" in run.info.extra["joined_lines"]


def test_a_step_line_followed_by_other_text_is_not_joined(tmp_path):
    """What follows a step line is joined only when the joined text reads as more key:number items: prose, a Ray
    line, another step line or a line cut off while the log was written stay lines of their own."""
    p = tmp_path / "run.log"
    p.write_text("(TaskRunner pid=1) step:1 - a/b:0.100 - c:2.000\n"
                 "Saving checkpoint to /tmp/x\n"
                 "step:2 - a/b:0.2 - c:\n"
                 "(WorkerDict pid=2) 3.000 - d:4\n"
                 "step:3 - a/b:0.3 - c:3\n"
                 "00 - d:5")
    run, recs = read(p)
    assert [(r.step, r.metrics) for r in recs] == [(1, {"a/b": 0.1, "c": 2.0}), (2, {"a/b": 0.2}),
                                                   (3, {"a/b": 0.3, "c": 3.0})]
    assert "joined_lines" not in run.info.extra


def test_a_quoted_paste_with_broken_colour_codes_reads_as_its_tables():
    """AReaL issue 110's paste: markdown quotes ('> > > '), colour codes that lost their escape byte ('[36m',
    '\ufffd[0m') and Ray's '(MasterWorker pid=N)' before every row; two tables, each ended by its bottom border."""
    _, recs = read(REAL / "areal" / "01_issue110_realhf_masterworker_table.log")
    assert len(recs) == 2
    assert recs[1].metrics["ppo_actor/n_valid_tokens"] == pytest.approx(1.6115e05)


def test_labels_without_colons(tmp_path):
    """prime-rl from v0.6.0 prints `Step {step} | {format_time(step_time):>7} | Reward {r:.4f} | Trainable {n}/{m}
    ({rate:.1%}) | Turns {t:.1f} | Branches {b:.1f} | Max Off-Policy {k} | Error {e:.1%} | Truncation {x:.1%}`
    (src/prime_rl/orchestrator/orchestrator.py@v0.8.0:822-827): the line below is that f-string filled in."""
    p = tmp_path / "orch.log"
    p.write_text("10:00:01 SUCCESS Step 7 |   12.3s | Reward 0.4123 | Trainable 12/16 (75.0%) | Turns 1.0 | "
                 "Branches 2.0 | Max Off-Policy 1 | Error 0.0% | Truncation 6.2%\n")
    _, recs = read(p)
    assert [(r.step, r.metrics) for r in recs] == [(7, {"Reward": 0.4123, "Turns": 1.0, "Branches": 2.0,
                                                        "Max Off-Policy": 1, "Error": 0.0, "Truncation": 6.2})]


def test_verl_config_printed_over_many_lines_is_the_run_config():
    """veRL prints its Hydra config with pprint at start, each line behind Ray's prefix (tests/data/real/verl/11:
    `(TaskRunner pid=154645) {'actor_rollout_ref': ...`, lines 6-200): it is the run's config, so translation judges
    fidelity with the run's own settings (its lines 36 and 153 print ppo_mini_batch_size 64)."""
    from trackbridge.read.inputs import open_runs
    (run,) = open_runs(str(REAL / "verl" / "11_agentic_rag_gsm8k_ppo.log"), rows=True)
    config = run.info.config
    assert config["actor_rollout_ref"]["actor"]["ppo_mini_batch_size"] == 64
    assert config["data"]["train_batch_size"] == 256
    assert run.info.extra["config_source"].endswith(":6")
    recs = list(run.records())
    assert [r.step for r in recs] == list(range(1, 27))


def test_a_printed_dict_with_a_progress_bar_glued_after_it(tmp_path):
    """tests/data/real/trl/10 (line 125): a TRL row followed on the same line by tqdm's bar (the \\r between them
    not kept): the row is read, as the five before it; a dict followed by other text is not."""
    _, recs = read(REAL / "trl" / "10_chaos_economy_train8ep_grpo.log")
    assert len(recs) == 6 and recs[-1].metrics["epoch"] == 0.375
    p = tmp_path / "x.log"
    p.write_text("{'loss': 0.5, 'reward': 1.0} of type {'loss': Number}\n"
                 "{'loss': 0.25} 12%|#    | 3/25 [00:01<00:09]\n")
    run, recs = read(p)
    assert [r.metrics for r in recs] == [{"loss": 0.25}]
