"""Findings in the user's own names (issue 32, item 4): each finding names the run's own key beside the canonical
one (from the run's translation), in the text, in ``--json`` and in the live text; ``--names FRAMEWORK`` names the
series in that framework's names, through the pipeline translate and migrate rename with."""
from __future__ import annotations

import json

from trackbridge import cli
from trackbridge.exitcodes import PROBLEMS, USAGE

from _support import doctor_runs as R

TRL = "trl/grpo@1.16.0"


def truncated_run(tmp_path):
    s = R.healthy(TRL)
    for t in range(30, 60):
        s["response/clip_ratio"][t] = 0.6
    return R.write(tmp_path / "grpo.jsonl", TRL, s)


def doctor(capsys, *argv):
    try:
        rc = cli.main([str(a) for a in argv])
    except SystemExit as exc:
        rc = int(exc.code or 0)
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_text_names_the_users_key(tmp_path, capsys):
    rc, out, _ = doctor(capsys, "doctor", truncated_run(tmp_path))
    assert rc == PROBLEMS
    ours = R.RAW[TRL]["response/clip_ratio"]                       # completions/clipped_ratio
    assert f"response/clip_ratio (your {ours})" in out
    evidence = [ln for ln in out.splitlines() if ln.strip().startswith("steps 30-")]
    assert evidence and f"response/clip_ratio (your {ours}) above" in evidence[0]


def test_json_names(tmp_path, capsys):
    rc, out, _ = doctor(capsys, "doctor", truncated_run(tmp_path), "--json")
    doc = json.loads(out)
    assert doc["names_from"] == "your"
    f = next(f for f in doc["findings"] if f["check"] == "responses-truncated")
    for canon in f["series"].values():
        if canon in R.RAW[TRL] and R.RAW[TRL][canon] != canon:
            assert f["names"][canon] == R.RAW[TRL][canon]
    assert f["names"]["response/clip_ratio"] == "completions/clipped_ratio"


def test_names_framework(tmp_path, capsys):
    run = truncated_run(tmp_path)
    rc, out, _ = doctor(capsys, "doctor", run, "--names", "verl", "--json")
    doc = json.loads(out)
    assert doc["names_from"] == "verl"
    f = next(f for f in doc["findings"] if f["check"] == "responses-truncated")
    assert f["names"]["response/clip_ratio"] == R.RAW["verl/ppo@0.7.0"]["response/clip_ratio"]
    # the same name as translating the canonical key to veRL does
    from trackbridge.pipeline import translate
    assert translate({"response/clip_ratio": 0.5}, "canonical", "verl").renamed["response/clip_ratio"] == \
        f["names"]["response/clip_ratio"]
    rc, text, _ = doctor(capsys, "doctor", run, "--names", "verl")
    assert "response/clip_ratio (verl: response_length/clip_ratio)" in text
    rc, text, _ = doctor(capsys, "doctor", run, "--names", "canonical")
    assert "(your " not in text and "response/clip_ratio above" in text


def test_names_unknown_framework(tmp_path, capsys):
    rc, _, err = doctor(capsys, "doctor", truncated_run(tmp_path), "--names", "nosuch")
    assert rc == USAGE and "nosuch" in err and len(err.strip().splitlines()) == 1


def test_with_names_replaces_whole_names_only():
    from trackbridge.doctor import Finding, load_checks
    from trackbridge.doctor.report import with_names
    check = next(iter(load_checks()))
    f = Finding(check=check, run="r", severity="info", series={}, names={"kl/ref": "kl", "kl/ref/k3": "kl_k3"})
    text = "kl/ref/k3 = 2 and kl/ref = 3; kl/ref/k3 again; kl/reference untouched."
    assert with_names(text, f) == ("kl/ref/k3 (your kl_k3) = 2 and kl/ref (your kl) = 3; kl/ref/k3 again; "
                                   "kl/reference untouched.")
    assert with_names("at the end kl/ref.", f) == "at the end kl/ref (your kl)."
    assert with_names(text, f, "verl").startswith("kl/ref/k3 (verl: kl_k3) = 2")


def test_live_alert_reads_back_the_live_text():
    from trackbridge.doctor.report import live_alert
    text = "critical: Gradient norm explodes [grad-norm-explosion] at step 70: optim/grad_norm = 5."
    assert live_alert("doctor/grad-norm-explosion", text) == (
        "grad-norm-explosion", "critical", "trackbridge doctor: Gradient norm explodes", text)
    assert live_alert("doctor/other-id", text) is None            # the key names another check
    assert live_alert("doctor/grad-norm-explosion", 5.0) is None
    assert live_alert("loss", text) is None
