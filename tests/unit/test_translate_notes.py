"""Noise and small lies (issue 18 item 8, issue 20 "False notes"): a run's notes are said once (the keys outside the
releases in use: one note with the final count); a conflict (two keys, one name, two values) is not an unmapped key
(`--strict` does not fail on it); "changed meaning within releases, give the release to choose" only where choosing
the release settles it; a release trackbridge does not list is a usage error or a note, never silently accepted."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from trackbridge.pipeline import Translator
from trackbridge.schema.loader import load_registry
from trackbridge.schema.spec import SpecError, parse_spec


@pytest.fixture(scope="module")
def reg():
    return load_registry()


def _cli(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "trackbridge", *args], capture_output=True, text=True,
                          timeout=timeout)


def test_keys_outside_the_releases_are_one_note_with_the_final_count(reg):
    tr = Translator("verl@v0.2", "canonical", registry=reg)
    tr.translate({"actor/pg_clipfrac_lower": 1.0, "actor/entropy": 1.0})
    tr.translate({"critic/score/mean": 1.0, "perf/mfu/actor": 1.0})
    tr.translate({"actor/pg_clipfrac_lower": 2.0})
    outside = [n for n in tr.notes if "are not logged by" in n]
    assert outside == ["3 key(s) are not logged by verl/ppo@v0.2 according to the mappings and were translated "
                       "with the nearest release's entry: actor/pg_clipfrac_lower, actor/entropy, perf/mfu/actor"]


def test_a_translated_file_reports_each_note_once(tmp_path):
    rows = [{"step": i, "actor/pg_clipfrac_lower": 1.0, "actor/entropy": float(i), "perf/mfu/actor": 0.5}
            for i in range(30)]
    f = tmp_path / "old.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = _cli("translate", str(f), "--from", "verl@v0.2")
    assert out.returncode == 0, out.stderr
    notes = [line for line in out.stderr.splitlines() if line.startswith("trackbridge: note:")]
    assert len([n for n in notes if "are not logged by" in n]) == 1
    assert any("3 key(s) are not logged by" in n for n in notes)
    assert len(notes) == len(set(notes))


def test_conflicts_are_not_unmapped_and_strict_does_not_fail_on_them(tmp_path):
    # veRL logs one value under perf/time_per_step and timing_s/step; two different values clash
    f = tmp_path / "clash.jsonl"
    f.write_text(json.dumps({"step": 1, "perf/time_per_step": 1.0, "timing_s/step": 2.0,
                             "critic/score/mean": 0.5}) + "\n")
    report = tmp_path / "report.json"
    out = _cli("translate", str(f), "--from", "verl@0.7.0", "--strict", "--report-json", str(report))
    assert out.returncode == 0, out.stderr
    rep = json.loads(report.read_text())
    assert rep["unmapped"] == [] and rep["conflicts"] == {"perf/time_per_step": "time/step"}
    assert rep["mapped"] == 2 and "0 unmapped, 1 kept as is" in out.stderr
    line = json.loads(out.stdout)
    assert line["time/step"] == 2.0 and line["perf/time_per_step"] == 1.0
    # a key that is really unmapped still fails --strict
    f.write_text(json.dumps({"step": 1, "critic/score/mean": 0.5, "my/own": 1.0}) + "\n")
    out = _cli("translate", str(f), "--from", "verl@0.7.0", "--strict")
    assert out.returncode == 1 and "--strict: unmapped keys: my/own" in out.stderr


def test_a_meaning_change_by_release_is_said_and_one_by_config_is_not_called_a_release_change(reg):
    tr = Translator("trl/grpo", "canonical", registry=reg)
    tr.translate({"reward_std": 0.1, "kl": 0.01})
    assert any("'reward_std' changed meaning within" in n and "give the release to choose" in n for n in tr.notes)
    # veRL's actor/kl_loss is another KL name under another kl_loss_type: a config, not a release, decides
    tr = Translator("verl/ppo", "canonical", registry=reg)
    res = tr.translate({"actor/kl_loss": 0.1, "timing_s/step": 1.0, "timing_s/gen": 0.5})
    assert not [n for n in tr.notes if "changed meaning" in n], tr.notes
    assert res.metrics["kl/ref/k3"] == 0.1 and res.metrics["time/step"] == 1.0
    # the run config does not set kl_loss_type: veRL's default held, and the note says it was assumed
    assert not [n for n in tr.notes if "under config settings the run config does not give" in n], tr.notes
    assumed = [n for n in tr.notes if "actor_rollout_ref.actor.kl_loss_type=" in n and "(verl's default, assumed)" in n]
    assert len(assumed) == 1, tr.notes
    # given the config, there is nothing to say
    tr = Translator("verl/ppo", "canonical", registry=reg,
                    config={"actor_rollout_ref": {"actor": {"kl_loss_type": "kl", "loss_agg_mode": "token-mean"}}})
    res = tr.translate({"actor/kl_loss": 0.1})
    assert res.metrics == {"kl/ref/k1": 0.1}
    assert not [n for n in tr.notes if "does not give" in n or "changed meaning" in n], tr.notes


@pytest.mark.parametrize("spec, words", [
    ("verl@9.9.9", "9.9.9 is a newer major version than any verl release trackbridge knows (trackbridge knows verl "
                   "v0.1rc..v0.9.1)"),
    ("trl@2.0", "trackbridge knows trl v0.2.0..v1.16.0"),
    ("verl@0.0.1", "older than the first verl release trackbridge knows"),
    ("verl@0.9.1..0.4.1", "the range runs backwards"),
])
def test_an_unknown_release_is_a_usage_error_naming_the_known_range(reg, spec, words):
    with pytest.raises(SpecError) as ei:
        parse_spec(spec, reg)
    assert words in str(ei.value)


@pytest.mark.parametrize("spec, read_as, words", [
    ("verl@0.9.5", "v0.9.1", "verl 0.9.5 is newer than the newest release trackbridge knows (v0.9.1): read with "
                             "v0.9.1's names"),
    ("verl@0.4.2", "v0.4.1", "verl 0.4.2 is not a release trackbridge knows (trackbridge knows verl v0.1rc..v0.9.1): "
                             "read as v0.4.1, the release before it"),
])
def test_an_unlisted_release_in_the_known_major_version_is_read_with_a_note(reg, spec, read_as, words):
    sp = parse_spec(spec, reg)
    assert sp.note is not None and sp.note.startswith(words)
    fw = reg.frameworks["verl"]
    assert fw.release_name(int(sp.lo)) == read_as
    tr = Translator(spec, "canonical", registry=reg)
    tr.translate({"critic/score/mean": 1.0})
    assert [n for n in tr.notes if n.startswith(words)]
    assert parse_spec("verl@0.9.1", reg).note is None


def test_the_cli_refuses_an_unknown_release_with_one_line(tmp_path):
    f = tmp_path / "x.jsonl"
    f.write_text(json.dumps({"critic/score/mean": 1.0}) + "\n")
    out = _cli("translate", str(f), "--from", "verl@9.9.9")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "trackbridge knows verl v0.1rc..v0.9.1" in out.stderr and len(out.stderr.strip().splitlines()) == 1
    out = _cli("translate", str(f), "--from", "verl@0.9.5")
    assert out.returncode == 0 and "is newer than the newest release trackbridge knows (v0.9.1)" in out.stderr
