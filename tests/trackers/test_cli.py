"""The command line as a user runs it: translate, detect, mappings, replay; exit codes and error messages."""
from __future__ import annotations

import json
import subprocess
import sys

from _support import ROOT

PUBLIC = ROOT / "tests" / "data" / "public-logs"


def tb(*args, stdin: str | None = None, cwd=None):
    return subprocess.run([sys.executable, "-m", "trackbridge", *map(str, args)], input=stdin, capture_output=True,
                          text=True, cwd=cwd, timeout=300)


def test_help_on_every_command():
    for cmd in ([], ["translate"], ["detect"], ["mappings"], ["mappings", "lint"], ["mappings", "show"],
                ["mappings", "list"], ["mappings", "docs"], ["migrate"], ["replay"], ["compare"], ["demo"]):
        r = tb(*cmd, "--help")
        assert r.returncode == 0, (cmd, r.stderr)
        assert "usage: trackbridge" in r.stdout


def test_translate_jsonl_with_report(tmp_path):
    src = tmp_path / "verl.jsonl"
    src.write_text("\n".join(json.dumps(d) for d in [
        {"actor/pg_loss": 0.12, "critic/score/mean": 0.4, "val-core/openai/gsm8k/acc/mean@1": 0.5, "my_key": 3},
        {"actor/ppo_kl": 0.001, "timing_s/gen": 12.5},
    ]) + "\n")
    report = tmp_path / "report.json"
    r = tb("translate", "--from", "verl@0.4.1", "--to", "canonical", "--report-json", report, src)
    assert r.returncode == 0, r.stderr
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    assert lines[0]["reward/score/mean"] == 0.4 and lines[0]["val/openai/gsm8k/acc/mean@1"] == 0.5
    assert lines[0]["my_key"] == 3 and lines[1]["kl/old_policy/k1"] == 0.001
    rep = json.loads(report.read_text())
    assert rep["unmapped"] == ["my_key"] and rep["mapped"] == 5 and rep["source"].startswith("verl/ppo@")
    assert "actor/pg_loss" in rep["approximate"] or rep["approximate"] == {} or isinstance(rep["approximate"], dict)
    r = tb("translate", "--from", "verl@0.4.1", "--strict", src)
    assert r.returncode == 1 and "unmapped keys: my_key" in r.stderr


def test_translate_framework_to_framework_via_stdin():
    r = tb("translate", "--from", "trl/grpo@0.14.0", "--to", "trl/grpo@1.16.0", "-",
           stdin=json.dumps({"completion_length": 31.5, "rewards/acc": 0.5, "eval_loss": 0.1}) + "\n")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out == {"completions/mean_length": 31.5, "rewards/acc/mean": 0.5, "eval_loss": 0.1}


def test_translate_trainer_state_and_derive(tmp_path):
    rows = json.loads((PUBLIC / "12_trl_ppo.json").read_text())["rows"]
    for r in rows:
        r.pop("objective/rlhf_reward")
    state = tmp_path / "trainer_state.json"
    state.write_text(json.dumps({"global_step": len(rows), "log_history": rows}))
    report = tmp_path / "r.json"
    r = tb("translate", "--derive", "--report-json", report, state)
    assert r.returncode == 0, r.stderr
    rep = json.loads(report.read_text())
    assert "reward/shaped/mean" in rep["derived"] and rep["source"].startswith("trl/ppo")
    first = json.loads(r.stdout.splitlines()[0])
    assert "reward/shaped/mean" in first


def test_translate_bad_lines_are_named_and_the_rest_kept(tmp_path):
    src = tmp_path / "bad.jsonl"
    src.write_text('{"loss": 1.0}\nnot json at all\n[1, 2]\n{"loss": 2.0}\n')
    r = tb("translate", "--from", "trl/sft@1.16.0", src)
    assert r.returncode == 1
    assert f"{src}:2: not a JSON object" in r.stderr and f"{src}:3: expected a JSON object" in r.stderr
    assert [json.loads(x) for x in r.stdout.splitlines()] == [{"loss/total": 1.0}, {"loss/total": 2.0}]


def test_bad_spec_and_missing_file_exit_2(tmp_path):
    r = tb("translate", "--from", "nosuchframework", "-", stdin="{}\n")
    assert r.returncode == 2 and "unknown framework 'nosuchframework'" in r.stderr
    r = tb("translate", tmp_path / "missing.jsonl")
    assert r.returncode == 2 and "cannot open" in r.stderr


def test_detect_public_log():
    r = tb("detect", "--json", PUBLIC / "01_verl.json")
    assert r.returncode == 0, r.stderr
    det = json.loads(r.stdout)
    assert det["source"].startswith("verl/ppo@") and det["confidence"] > 0.5
    for arg in (ROOT / "examples" / "verl_console.log", f"console:{ROOT / 'examples' / 'verl_console.log'}"):
        r = tb("detect", arg)                    # a plain path is recognised as a console log
        assert r.returncode == 0 and "source:      verl/ppo@v0.4.0" in r.stdout, r.stdout + r.stderr
    r = tb("detect", ROOT / "examples" / "trl_dpo_wandb_export.csv")
    assert r.returncode == 0 and "trl/dpo@" in r.stdout


def test_mappings_show_list_docs(tmp_path):
    r = tb("mappings", "show", "objective/kl")          # a framework key: the canonical quantity behind it
    assert r.returncode == 0 and "'objective/kl' is canonical 'kl/old_ref/k1_seq_sum'" in r.stdout
    r = tb("mappings", "show", "no/such/name")
    assert r.returncode == 2
    r = tb("mappings", "show", "kl/old_policy/k1")
    assert r.returncode == 0 and "actor/ppo_kl" in r.stdout and "ppo_kl" in r.stdout
    r = tb("mappings", "show", "kl/old_policy")            # a 1.0.0 name: shown under its current name
    assert r.returncode == 0 and "kl/old_policy/k1" in r.stdout and "actor/ppo_kl" in r.stdout
    r = tb("mappings", "show", "trl-legacy")
    assert r.returncode == 0 and "ppo/mean_scores" in r.stdout
    r = tb("mappings", "list")
    assert r.returncode == 0 and "trl:" in r.stdout and "alias trl-legacy" in r.stdout
    out = tmp_path / "metrics.md"
    r = tb("mappings", "docs", "--out", out)
    assert r.returncode == 0 and "### `kl/ref/k3`" in out.read_text()


def test_generated_reference_is_up_to_date():
    """docs/metrics.md is generated from the YAML; regenerate it with `make docs` after changing mappings."""
    from trackbridge.cli.mappings import reference
    from trackbridge.schema.loader import load_registry
    page = ROOT / "docs" / "metrics.md"
    assert page.read_text() == reference(load_registry()), "docs/metrics.md is stale: run `make docs`"


def test_user_mappings_add_project_keys(tmp_path):
    user = tmp_path / "mine.yaml"
    user.write_text(
        "format: trackbridge.canonical/1\nmetrics:\n"
        "  reward/fn/{reward_fn}/extra:\n    description: my reward function's extra info\n    unit: '1'\n")
    user2 = tmp_path / "mine_verl.yaml"
    user2.write_text(
        "format: trackbridge.mapping/1\nframework: verl\nentries:\n"
        "  - {key: 'reward_extra_info/{reward_fn}', canonical: 'reward/fn/{reward_fn}/extra', "
        "source: 'my_reward.py@v1'}\n")
    r = tb("translate", "--from", "verl@0.6.0", "--mappings", user, "--mappings", user2, "-",
           stdin=json.dumps({"reward_extra_info/format": 0.5}) + "\n")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"reward/fn/format/extra": 0.5}
    r = tb("mappings", "lint", user, user2)
    assert r.returncode == 0, r.stderr


def test_replay_command(tmp_path):
    import trackbridge
    run = trackbridge.init(project="p", name="r", sinks=[], source="verl", spool=str(tmp_path / "spool"),
                           run_id="replay1")
    for i in range(5):
        run.log({"critic/score/mean": float(i), "actor/ppo_kl": 0.1 * i}, step=i)
    run.finish()
    spool = tmp_path / "spool" / "replay1.jsonl"
    dst = tmp_path / "tb"
    r = tb("replay", spool, "--to", f"tensorboard:{dst}")
    assert r.returncode == 0, r.stderr
    assert "wrote 5 records, skipped 0 already present" in r.stderr
    r = tb("replay", spool, "--to", f"tensorboard:{dst}")
    assert r.returncode == 0 and "wrote 0 records, skipped 5 already present (10 points, checked per key" in r.stderr
    from trackbridge.trackers import open_source
    (reader,) = list(open_source(f"tensorboard:{dst}").runs())
    recs = [r for r in reader.records() if "reward/score/mean" in r.metrics]
    assert [r.step for r in recs] == [0, 1, 2, 3, 4]


def test_lint_names_file_line_and_rule_of_a_bad_derived_rule(tmp_path):
    bad = tmp_path / "rules.yaml"
    bad.write_text("format: trackbridge.derived/1\nrules:\n"
                   "  - name: perf/tokens_per_step\n    formula: \"progress/tokens / \"\n"
                   "    description: broken on purpose\n    citation: none\n")
    r = tb("mappings", "lint", bad)
    assert r.returncode == 2
    assert str(bad) in r.stderr and "perf/tokens_per_step" in r.stderr
    cyc = tmp_path / "cycle.yaml"
    cyc.write_text("format: trackbridge.derived/1\nrules:\n"
                   "  - {name: policy/clip_frac_low, formula: \"policy/clip_frac - policy/clip_frac_high\", "
                   "description: x, citation: y}\n")
    r = tb("mappings", "lint", cyc)
    assert r.returncode == 2 and "cycle" in r.stderr.lower() and str(cyc) in r.stderr
