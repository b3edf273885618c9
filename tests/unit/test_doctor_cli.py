"""``trackbridge doctor RUN...``: exit codes (docs/cli.md, trackbridge/exitcodes.py), the text and ``--json``
outputs, the order of findings, their fidelity caveats and config relations; and the comparison report, which opens
with the findings per run, each linked to the charts it read."""
from __future__ import annotations

import json
import re

import pytest

from trackbridge import cli
from trackbridge.compare import compare_runs, slug
from trackbridge.exitcodes import OK, PROBLEMS, USAGE

from _support import ROOT
from _support import doctor_runs as R

N = R.N


def code(*argv) -> int:
    try:
        return cli.main([str(a) for a in argv])
    except SystemExit as exc:          # argparse
        return int(exc.code or 0)


def run_file(tmp_path, spec, edit=None, name="run.jsonl"):
    s = R.healthy(spec)
    if edit is not None:
        edit(s)
    return R.write(tmp_path / name, spec, s)


def grad_explosion(s):
    s["optim/grad_norm"][70] = 5.0


def low_mfu(s):
    s["perf/mfu/policy_update"] = [0.15] * N


def several(s):
    """critical (grad norm at step 120), warning (clip fraction from 30), info (low MFU from 0)."""
    s["optim/grad_norm"][120] = 6.0
    for t in range(30, 60):
        s["policy/clip_frac"][t] = 0.4
    s["perf/mfu/policy_update"] = [0.15] * N


# ---------------------------------------------------------------------------------------------------- exit codes
def test_exit_codes(tmp_path, capsys):
    healthy = run_file(tmp_path, "verl/ppo@0.7.0", name="healthy.jsonl")
    sick = run_file(tmp_path, "verl/ppo@0.7.0", grad_explosion, "sick.jsonl")
    info = run_file(tmp_path, "verl/ppo@0.7.0", low_mfu, "info.jsonl")
    assert code("doctor", healthy) == OK                                  # nothing found
    assert code("doctor", sick) == PROBLEMS                               # a critical finding
    assert code("doctor", sick, "--fail-on", "critical") == PROBLEMS
    assert code("doctor", info) == OK                                     # info only: below --fail-on warning
    assert code("doctor", info, "--fail-on", "info") == PROBLEMS
    assert code("doctor", info, "--fail-on", "critical") == OK
    assert code("doctor", healthy, sick) == PROBLEMS                      # any run
    # bad usage or input: 2, nothing diagnosed
    assert code("doctor") == USAGE
    assert code("doctor", tmp_path / "missing.jsonl") == USAGE
    assert code("doctor", sick, "--fail-on", "sometimes") == USAGE
    assert code("doctor", sick, "--checks", "no-such-check") == USAGE
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert code("doctor", empty) == USAGE
    bad = tmp_path / "bad_checks.yaml"
    bad.write_text("format: trackbridge.checks/1\nchecks:\n  - id: x\n")
    assert code("doctor", sick, "--mappings", bad) == USAGE
    err = capsys.readouterr().err
    # an empty file is refused before it is read (the one input rule), naming it
    assert "bad_checks.yaml:3" in err and "empty.jsonl: an empty file" in err and "no-such-check" in err


def test_checks_can_be_chosen(tmp_path, capsys):
    sick = run_file(tmp_path, "verl/ppo@0.7.0", grad_explosion)
    assert code("doctor", sick, "--checks", "mfu-low,entropy-collapse", "--json") == OK
    out = json.loads(capsys.readouterr().out)
    assert out["findings"] == [] and sorted(out["checks_run"]) == ["entropy-collapse", "mfu-low"]


# ---------------------------------------------------------------------------------------------------- outputs
def test_text_output_orders_findings_by_what_to_look_at_first(tmp_path, capsys):
    path = run_file(tmp_path, "verl/ppo@0.7.0", several)
    assert code("doctor", f"mine={path}") == PROBLEMS
    out = capsys.readouterr().out
    heads = re.findall(r"^\d+\. (\w+)  .*\[([a-z0-9-]+)\]$", out, re.M)
    # severity first (critical, warning, info), though the critical one is the last to happen (step 120)
    assert heads == [("CRITICAL", "grad-norm-explosion"), ("WARNING", "clip-fraction-high"), ("INFO", "mfu-low")]
    assert out.startswith("run mine (")
    for part in ("step 120: optim/grad_norm (your actor/grad_norm) = 6 at step 120",   # the run's own name beside
                 "steps 30-59: policy/clip_frac (your actor/pg_clipfrac) above 0.2 for 30 points",
                 "check first: ", "then check: ", "means: ", "source: "):
        assert part in out, part


def test_json_output(tmp_path, capsys):
    a = run_file(tmp_path, "verl/ppo@0.7.0", several, "a.jsonl")
    b = run_file(tmp_path, "openrlhf/ppo@0.11.2", grad_explosion, "b.jsonl")
    assert code("doctor", f"A={a}", f"B={b}", "--json") == PROBLEMS
    out = json.loads(capsys.readouterr().out)
    assert [r["run"] for r in out] == ["A", "B"]
    assert [f["check"] for f in out[0]["findings"]] == ["grad-norm-explosion", "clip-fraction-high", "mfu-low"]
    f = out[1]["findings"][0]
    assert (f["check"], f["severity"], f["first_step"], f["last_step"], f["count"]) == \
        ("grad-norm-explosion", "critical", 70, 70, 1)
    assert f["series"] == {"grad": "optim/grad_norm"} and out[1]["source"].startswith("openrlhf")
    st = f["stretches"][0]
    assert st["values"]["value"] == 5 and st["values"]["baseline_kind"] == "median" and "evidence" in st
    assert f["check_first"] and f["means"] and f["cites"][0]["title"] and f["defined_at"].startswith(
        str(ROOT / "mappings" / "checks.yaml"))
    # OpenRLHF's actor_grad_norm is the last optimizer step's norm (issue 20's computed fidelity): the caveat says so
    want = "optim/grad_norm is approximate in this run: openrlhf 'actor_grad_norm' keeps the last"
    assert len(f["caveats"]) == 1 and f["caveats"][0].startswith(want), f["caveats"]
    assert "checks_not_run" in out[0] and out[0]["checks_not_run"]["preference-overfit"].startswith("the run logs none")


def test_caveat_names_the_approximation_of_the_series_read(tmp_path, capsys):
    # veRL v0.7.0 actor/kl_loss sums the mini-batches' KL (approximate): a KL finding says so
    def spike(s):
        for t in (80, 81, 82):
            s["kl/ref/k3"][t] = 0.5
    path = run_file(tmp_path, "verl/ppo@0.7.0", spike)
    assert code("doctor", path, "--json", "--from", "verl@0.7.0") == PROBLEMS
    out = json.loads(capsys.readouterr().out)
    (f,) = [x for x in out["findings"] if x["check"] == "kl-spike"]
    assert any(c.startswith("kl/ref/k3 is approximate in this run: verl 'actor/kl_loss'") for c in f["caveats"])
    # and the text says it under the finding
    assert code("doctor", path, "--from", "verl@0.7.0") == PROBLEMS
    assert "   caveat: kl/ref/k3 is approximate in this run: verl 'actor/kl_loss'" in capsys.readouterr().out


def test_a_bound_from_the_run_config(tmp_path, capsys):
    """responses-truncated without a logged clip ratio: the mean length reaches 95% of max_response_length, read
    from the run config (TRL's max_completion_length), and the finding says where the bound came from."""
    spec = "trl/grpo@1.16.0"
    s = R.healthy(spec)
    del s["response/clip_ratio"]
    for t in range(40, N):
        s["response/length/mean"][t] = 250.0
    path = R.write(tmp_path / "run.jsonl", spec, s)
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"max_completion_length": 256}))
    assert code("doctor", path, "--config", config, "--json", "--from", spec) == PROBLEMS
    out = json.loads(capsys.readouterr().out)
    (f,) = out["findings"]
    assert (f["check"], f["first_step"], f["last_step"]) == ("responses-truncated", 40, N - 1)
    assert "the bound of response/length/mean is 0.95 x the run config's max_response_length = 256" in f["caveats"]
    # without the config the check cannot judge the length, and says nothing
    assert code("doctor", path, "--json", "--from", spec) == OK
    assert json.loads(capsys.readouterr().out)["findings"] == []


def test_public_log_rows_and_locators_are_read(capsys):
    assert code("doctor", ROOT / "tests" / "data" / "public-logs" / "04_trl_grpo.json") == PROBLEMS
    assert "Many responses cut at the maximum length" in capsys.readouterr().out
    assert code("doctor", f"console:{ROOT / 'examples' / 'verl_console.log'}", "--verbose") == OK   # info only
    out = capsys.readouterr().out
    assert "INFO  Model FLOPs utilisation under 30%  [mfu-low]" in out and "checks that could not run:" in out


# ---------------------------------------------------------------------------------------------------- compare report
def test_the_comparison_report_opens_with_the_findings_linked_to_their_charts(tmp_path):
    a = run_file(tmp_path, "verl/ppo@0.7.0", several, "a.jsonl")
    b = run_file(tmp_path, "trl/grpo@1.16.0", None, "b.jsonl")
    # --metrics asks for the reward only: the charts the findings concern are added so that the links work
    res = compare_runs([f"verl={a}", f"trl={b}"], metrics="reward/score/mean", out=tmp_path / "report")
    assert [(f.run, f.id) for f in res.findings] == [("verl", "grad-norm-explosion"), ("verl", "clip-fraction-high"),
                                                      ("verl", "mfu-low")]
    charted = {m.name for m in res.metrics}
    assert {"reward/score/mean", "optim/grad_norm", "policy/clip_frac", "perf/mfu/policy_update"} <= charted
    text = res.html.read_text(encoding="utf-8")
    start, key = text.index('<section id="findings">'), text.index('id="key"')
    assert start < key
    section = text[start:text.index("</section>", start)]
    for name in ("optim/grad_norm", "policy/clip_frac", "perf/mfu/policy_update"):
        anchor = f"m-{slug(name)}"
        assert f'href="#{anchor}"' in section and f'id="{anchor}"' in text
    assert "<h3>trl</h3><p class=\"note\">No findings.</p>" in section
    assert section.index("grad-norm-explosion") < section.index("clip-fraction-high") < section.index("mfu-low")
    md = res.summary_md.read_text()
    assert "## Findings" in md and "verl: critical: Gradient norm explodes (`grad-norm-explosion`), step 120" in md


def test_compare_without_doctor(tmp_path):
    a = run_file(tmp_path, "verl/ppo@0.7.0", several, "a.jsonl")
    res = compare_runs([f"verl={a}"], out=tmp_path / "report", doctor=False)
    assert res.findings == [] and 'id="findings"' not in res.html.read_text()


@pytest.mark.parametrize("argv", [["doctor", "--help"]])
def test_help_is_quick(argv, capsys):
    assert code(*argv) == OK
    assert "--fail-on" in capsys.readouterr().out


def test_mapping_files_among_mappings_are_not_read_as_checks(tmp_path, capsys):
    """--mappings takes mapping, derived-rule and checks files alike; each is used for what its format says."""
    mapping = tmp_path / "my_mappings.yaml"
    mapping.write_text("format: trackbridge.mapping/1\nframework: verl\nentries:\n"
                       "  - {key: my/grad, canonical: optim/grad_norm, reverse: false, source: mine.py@v1}\n")
    checks = tmp_path / "my_checks.yaml"
    checks.write_text("format: trackbridge.checks/1\nchecks:\n  - id: grad-high\n    title: Gradient norm above 2\n"
                      "    severity: warning\n    reads: {grad: [optim/grad_norm]}\n"
                      "    when: {above: {of: grad, value: 2, for: 2}}\n    means: Too high for us.\n"
                      "    check_first: The learning rate.\n    cites: [glossary]\n")
    run = tmp_path / "run.jsonl"
    run.write_text("".join(json.dumps({"step": t, "my/grad": 6.0 if t >= 10 else 0.5}) + "\n" for t in range(20)))
    assert code("doctor", run, "--from", "verl@0.7.0", "--mappings", mapping, "--mappings", checks, "--json") == \
        PROBLEMS
    out = json.loads(capsys.readouterr().out)
    found = {f["check"]: f for f in out["findings"]}
    assert set(found) == {"grad-norm-explosion", "grad-high"}         # the shipped check, and the user's
    f = found["grad-high"]
    assert (f["first_step"], f["last_step"], f["series"]) == (10, 19, {"grad": "optim/grad_norm"})
    assert out["source"] == "verl/ppo@0.7.0"
