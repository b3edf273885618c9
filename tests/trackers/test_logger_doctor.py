"""The logger's live checks (``trackbridge.init(..., doctor=True)``): a finding is logged once, as the text metric
``doctor/<check id>`` through the normal path (the spool, every tracker; read back with TensorBoard's own event
loader) and as a ``DoctorWarning``; ``log()`` never waits for the checks; a resumed run does not log a finding
again; checks that fail are switched off and logging goes on. In both writer modes."""
from __future__ import annotations

import time
import warnings

import pytest

import trackbridge
from trackbridge.doctor import Doctor, DoctorWarning
from trackbridge.stream import read_stream

from _support import doctor_runs as R

SPEC = "verl/ppo@0.7.0"


def _sick(n: int = R.N):
    s = R.healthy(SPEC, n=n)
    if n > 70:
        s["optim/grad_norm"][70] = 5.0                  # an explosion at step 70
    return s


def _log(run, series, start: int = 0):
    for row in R.rows(SPEC, series):
        step = row.pop("step")
        if step >= start:
            run.log(row, step=step)


def _doctor_records(run):
    return [(rec.step, k, v) for _seq, rec in read_stream(run.spool_path) for k, v in rec.metrics.items()
            if k.startswith("doctor/")]


def _tensorboard_texts(folder) -> list[tuple[int, str, str]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    (run_dir,) = [p for p in folder.iterdir() if p.is_dir()]
    ea = EventAccumulator(str(run_dir), size_guidance={"tensors": 0})
    ea.Reload()
    out = []
    for tag in ea.Tags()["tensors"]:
        if tag.startswith("doctor/"):
            for e in ea.Tensors(tag):
                out.append((e.step, tag, e.tensor_proto.string_val[0].decode("utf-8")))
    return out


@pytest.mark.parametrize("writer", ["thread", "process"])
def test_a_finding_is_logged_once_to_every_tracker_and_warned(tmp_path, writer):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run = trackbridge.init(sinks=[f"tensorboard:{tmp_path}/tb"], spool=str(tmp_path / "spool"), source=SPEC,
                               doctor=True, options=trackbridge.LoggerOptions(writer=writer))
        _log(run, _sick())
        st = run.finish()
    assert [s["state"] for s in st["sinks"]] == ["closed", "closed"]
    said = [w for w in caught if issubclass(w.category, DoctorWarning)]
    assert len(said) == 1 and "[grad-norm-explosion] at step 70" in str(said[0].message)
    spool = _doctor_records(run)
    assert [(s, k) for s, k, _ in spool] == [(70, "doctor/grad-norm-explosion")]
    assert spool[0][2].startswith("critical: Gradient norm explodes [grad-norm-explosion] at step 70: "
                                  "optim/grad_norm (your actor/grad_norm) = 5 at step 70")
    assert "Check first:" in spool[0][2]
    # TensorBoard's own reader: the same text once, at the same step
    assert _tensorboard_texts(tmp_path / "tb") == [(70, "doctor/grad-norm-explosion", spool[0][2])]
    # every record logged is there too (the text record is one more, after step 70's)
    steps = [rec.step for _seq, rec in read_stream(run.spool_path)]
    assert len(steps) == R.N + 1 and steps[70:72] == [70, 70]
    (f,) = run.findings
    assert (f.id, f.first_step, f.last_step) == ("grad-norm-explosion", 70, 70)


def test_off_by_default(tmp_path):
    run = trackbridge.init(sinks=[], spool=str(tmp_path / "spool"), source=SPEC,
                           options=trackbridge.LoggerOptions(writer="thread"))
    _log(run, _sick())
    run.finish()
    assert _doctor_records(run) == [] and run.findings == []


def test_log_never_waits_for_the_checks(tmp_path, monkeypatch):
    """A check that takes 50 ms per record (far slower than any real one) slows the dispatcher thread, never the
    caller: 100 log() calls would take 5 s if they waited."""
    real = Doctor.feed

    def slow(self, rec, approximate=None):
        time.sleep(0.05)
        return real(self, rec, approximate)

    monkeypatch.setattr(Doctor, "feed", slow)
    run = trackbridge.init(sinks=[], spool=str(tmp_path / "spool"), source=SPEC, doctor=True,
                           options=trackbridge.LoggerOptions(writer="thread"))
    rows = R.rows(SPEC, _sick(n=100))
    t0 = time.perf_counter()
    for row in rows:
        step = row.pop("step")
        run.log(row, step=step)
    spent = time.perf_counter() - t0
    run.finish()
    assert spent < 2.5, spent                           # generous: 2 loaded cores
    assert [k for _s, k, _v in _doctor_records(run)] == ["doctor/grad-norm-explosion"]


def test_failing_checks_are_switched_off_and_logging_goes_on(tmp_path, monkeypatch):
    def broken(self, rec, approximate=None):
        raise RuntimeError("boom")

    monkeypatch.setattr(Doctor, "feed", broken)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run = trackbridge.init(sinks=[], spool=str(tmp_path / "spool"), source=SPEC, doctor=True,
                               options=trackbridge.LoggerOptions(writer="thread"))
        _log(run, _sick(n=20))
        run.finish()
    off = [str(w.message) for w in caught if "diagnostic checks failed" in str(w.message)]
    assert len(off) == 1 and "RuntimeError: boom" in off[0]
    assert len(list(read_stream(run.spool_path))) == 20


def test_a_resumed_run_does_not_log_a_finding_again(tmp_path):
    series = _sick()
    for t in range(110, R.N):
        series["policy/clip_frac"][t] = 0.4             # a second symptom after the restart
    run = trackbridge.init(sinks=[], spool=str(tmp_path / "spool"), source=SPEC, doctor=True,
                           options=trackbridge.LoggerOptions(writer="thread"),
                           run_id="resumed")
    rows = R.rows(SPEC, series)
    for row in rows[:100]:
        step = row.pop("step")
        run.log(row, step=step)
    run.finish()
    assert [k for _s, k, _v in _doctor_records(run)] == ["doctor/grad-norm-explosion"]
    again = trackbridge.init(sinks=[], spool=str(tmp_path / "spool"), source=SPEC, doctor=True,
                             options=trackbridge.LoggerOptions(writer="thread"),
                             run_id="resumed", resume=True)
    for row in rows[100:]:
        step = row.pop("step")
        again.log(row, step=step)
    again.finish()
    assert [(s, k) for s, k, _v in _doctor_records(again)] == [(70, "doctor/grad-norm-explosion"),
                                                              (114, "doctor/clip-fraction-high")]   # 5 points


def test_trackers_named_after_a_framework_get_the_text_under_its_canonical_name(tmp_path):
    run = trackbridge.init(sinks=[f"tensorboard:{tmp_path}/tb"], spool=str(tmp_path / "spool"), source=SPEC,
                           names="verl@0.7.0", doctor=True, options=trackbridge.LoggerOptions(writer="thread"))
    _log(run, _sick())
    run.finish()
    texts = _tensorboard_texts(tmp_path / "tb")
    assert [(s, tag) for s, tag, _ in texts] == [(70, "doctor/grad-norm-explosion")]


def test_warnings_turned_into_errors_do_not_stop_logging(tmp_path):
    """``-W error`` (or ``simplefilter("error")``) must not turn a finding into a crash of the logging thread."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", DoctorWarning)
        run = trackbridge.init(sinks=[], spool=str(tmp_path / "spool"), source=SPEC, doctor=True,
                               options=trackbridge.LoggerOptions(writer="thread"))
        _log(run, _sick())
        run.finish()
    assert [k for _s, k, _v in _doctor_records(run)] == ["doctor/grad-norm-explosion"]
    assert len(list(read_stream(run.spool_path))) == R.N + 1


def test_a_users_checks_file_is_used_live_and_a_bad_one_fails_init(tmp_path):
    mine = tmp_path / "my_checks.yaml"
    mine.write_text(
        "format: trackbridge.checks/1\n"
        "checks:\n"
        "  - id: reward-below-half\n"
        "    title: Reward under 0.5\n"
        "    severity: info\n"
        "    reads: {reward: [reward/score/mean]}\n"
        "    when: {below: {of: reward, value: 0.5, for: 3}}\n"
        "    means: Our tasks reach 0.5.\n"
        "    check_first: The reward function.\n"
        "    cites: [{title: our runbook, path: docs/runbook.md@v1}]\n")
    run = trackbridge.init(sinks=[], spool=str(tmp_path / "spool"), source=SPEC, doctor=True,
                           options=trackbridge.LoggerOptions(writer="thread"),
                           mappings=[str(mine)])
    _log(run, _sick())
    run.finish()
    assert [(s, k) for s, k, _v in _doctor_records(run)] == [(2, "doctor/reward-below-half"),
                                                            (70, "doctor/grad-norm-explosion")]
    bad = tmp_path / "bad_checks.yaml"
    bad.write_text(mine.read_text().replace("means:", "mens:"))
    with pytest.raises(trackbridge.UsageError, match=r"init\(doctor=True\): .*bad_checks.yaml:8: check "
                                                     r"'reward-below-half': unknown field 'mens'"):
        trackbridge.init(sinks=[], spool=str(tmp_path / "spool2"), source=SPEC, doctor=True,
                         options=trackbridge.LoggerOptions(writer="thread"),
                         mappings=[str(bad)])
    assert not (tmp_path / "spool2").exists() or not any((tmp_path / "spool2").iterdir())
