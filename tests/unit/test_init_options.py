"""``trackbridge.init`` takes what a run is (at most 15 parameters, issue 35); the tuning knobs and overrides come as
``options=LoggerOptions(...)``, and the integrations' flat option dicts are folded into it (``LoggerOptions.fold``)."""
from __future__ import annotations

import inspect

import pytest

import trackbridge
from trackbridge import LoggerOptions
from trackbridge.errors import UsageError


def test_init_takes_at_most_fifteen_parameters_and_no_knob():
    params = inspect.signature(trackbridge.init).parameters
    assert len(params) <= 15, list(params)
    assert "options" in params
    assert not set(params) & set(LoggerOptions.names()), set(params) & set(LoggerOptions.names())
    assert not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def test_a_knob_as_a_keyword_of_init_is_refused():
    with pytest.raises(TypeError, match="writer"):
        trackbridge.init(sinks=[], writer="thread")      # type: ignore[call-arg]


def test_fold_moves_the_knobs_into_options_over_given_ones():
    base = LoggerOptions(retries=7, backoff=0.5)
    out = LoggerOptions.fold({"project": "p", "writer": "thread", "retries": 1, "options": base,
                              "rank_zero_only": False})
    assert set(out) == {"project", "options"} and out["project"] == "p"
    o = out["options"]
    assert (o.writer, o.retries, o.backoff, o.rank_zero_only) == ("thread", 1, 0.5, False)
    plain = {"project": "p", "sinks": []}
    assert LoggerOptions.fold(plain) == plain and LoggerOptions.fold(plain) is not plain


def test_a_bad_knob_is_one_line_naming_it():
    with pytest.raises(UsageError, match="rank_timeout must be >= 0"):
        LoggerOptions(rank_timeout=-1)
    with pytest.raises(UsageError, match="writer must be one of"):
        LoggerOptions.fold({"writer": "threads"})


def test_options_reach_the_run(tmp_path):
    seen = []
    run = trackbridge.init(sinks=[], spool=str(tmp_path), source="canonical", doctor=True,
                           options=LoggerOptions(writer="thread", derive=False, on_finding=seen.append))
    try:
        assert run.options.writer == "thread" and run.options.derive is False
        run.log({"loss/policy": 1.0}, step=0)
    finally:
        run.finish()
    assert run.status["logged"] == 1


def test_on_finding_without_doctor_names_the_option():
    with pytest.raises(UsageError, match=r"LoggerOptions\(on_finding=\.\.\.\) acts on the live checks"):
        trackbridge.init(sinks=[], options=LoggerOptions(on_finding=print))


def test_on_finding_with_the_writer_process(tmp_path):
    """The writer process gets the knobs through its pipe; the callback stays in the caller's process (a lambda
    cannot be pickled), and is called there."""
    seen = []
    run = trackbridge.init(sinks=[f"tensorboard:{tmp_path / 'tb'}"], spool=str(tmp_path / "spool"), source="verl",
                           doctor=True, options=LoggerOptions(writer="process", on_finding=lambda f: seen.append(f)))
    for step in range(100):
        run.log({"actor/grad_norm": 50.0 if step == 70 else 0.5 + 0.01 * (step % 7)}, step=step)
    run.finish()
    assert run.status["writer"] is not None
    assert [f.check.id for f in seen] == ["grad-norm-explosion"], [f.check.id for f in seen]
    assert set(LoggerOptions().for_writer()) == set(LoggerOptions.names()) - {"on_finding"}
