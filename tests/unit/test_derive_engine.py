"""The rule loader and the Deriver: order, cycles, errors with file/line/rule, logged-wins, bad values, conditions,
stateful functions across steps, missing steps and a save/restore (resumed run)."""
from __future__ import annotations

import json
import math
import textwrap

import pytest

from trackbridge.derive import Deriver, RuleError, load_rules
from trackbridge.derive.rules import may_overlap, shipped_canonical
from trackbridge.record import Record, dumps

NAMES = {"m/a", "m/b", "m/c", "m/d", "m/e", "m/f", "time/{stage}", "ms/{stage}", "m/count", "m/rate", "m/ema",
         "m/sum", "m/delta", "progress/step"}
CONFIG = {"kl_coef", "num_gpus", "kl_target"}


def rules_file(tmp_path, body: str, name: str = "rules.yaml"):
    path = tmp_path / name
    path.write_text("format: trackbridge.derived/1\nrules:\n" + textwrap.dedent(body), encoding="utf-8")
    return str(path)


def load(tmp_path, body: str, **kw):
    return load_rules([rules_file(tmp_path, body)], canonical=NAMES, config_names=CONFIG, shipped=False, **kw)


def rule(name: str, formula: str, extra: str = "") -> str:
    return (f"  - name: {name}\n    formula: \"{formula}\"\n    description: test rule\n"
            f"    citation: test/file.py@v1\n" + extra)


# ------------------------------------------------------------------------------------------------ loading
def test_rules_are_ordered_by_dependencies(tmp_path):
    # written so that each rule needs the next one: only dependency order can derive all three at one step
    rs = load(tmp_path, rule("m/d", "m/c * 2") + rule("m/c", "m/b + 1") + rule("m/b", "m/a * 10"))
    assert [r.name for r in rs] == ["m/b", "m/c", "m/d"]
    metrics = {"m/a": 1.0}
    assert Deriver(rs).apply(metrics, step=1) == ["m/b", "m/c", "m/d"]
    assert metrics == {"m/a": 1.0, "m/b": 10.0, "m/c": 11.0, "m/d": 22.0}


def test_cycle_is_an_error_naming_file_line_and_rule(tmp_path):
    with pytest.raises(RuleError) as exc:
        load(tmp_path, rule("m/a", "m/b + 1") + rule("m/c", "m/d") + rule("m/b", "m/a * 2"))
    err = exc.value
    assert err.file.endswith("rules.yaml")
    assert err.line in (3, 11)
    assert err.rule in ("m/a", "m/b")
    msg = str(err)
    assert "cycle" in msg and "'m/a' (" in msg and "'m/b' (" in msg
    assert "rules.yaml:3" in msg and "rules.yaml:11" in msg


def test_self_reference_is_a_cycle(tmp_path):
    with pytest.raises(RuleError, match=r"rules.yaml:3: rule 'm/a': cycle"):
        load(tmp_path, rule("m/a", "ema(m/a, 0.5)"))


@pytest.mark.parametrize("body, line, message", [
    (rule("m/a", "m/b +"), 4, "unexpected end of formula at column 6"),
    (rule("m/a", "m/b/ m/c"), 4, "put spaces around division"),
    (rule("m/a", "m/zzz + 1"), 4, "unknown canonical name 'm/zzz'"),
    (rule("m/zzz", "m/a + 1"), 3, "output 'm/zzz' is not a canonical metric name"),
    (rule("m/a", "shell(m/b)"), 4, "unknown function 'shell'"),
    (rule("m/a", "config.nope * m/b"), 4, "unknown config name 'nope'"),
    (rule("m/a", "m/b", "    colour: red\n"), 7, "unknown field 'colour'"),
    (rule("m/a", "m/b", "    formula: m/c\n"), 7, "duplicate key 'formula'"),
    ("  - name: m/a\n    formula: m/b\n    citation: x@1\n", 3, "missing or empty 'description'"),
    (rule("ms/{stage}", "m/a * 2"), 3, "output placeholders ['stage'] are not bound"),
    (rule("m/a", "m/b", "    forbid_approximate: [m/c]\n"), 7, "forbid_approximate names 'm/c'"),
    (rule("m/a", "m/b", "    requires: {gpus: 2}\n"), 7, "unknown field requires.gpus"),
    (rule("ms/{stage}", "time/{stage}", "    only: {phase: [x]}\n"), 7, "'phase' is not a placeholder"),
])
def test_bad_rules_are_rejected_with_file_line_rule(tmp_path, body, line, message):
    with pytest.raises(RuleError) as exc:
        load(tmp_path, body)
    assert message in str(exc.value), str(exc.value)
    assert exc.value.line == line, str(exc.value)
    assert f"rules.yaml:{line}" in str(exc.value)


def test_bad_files(tmp_path):
    p = tmp_path / "x.yaml"
    p.write_text("format: trackbridge.derived/2\nrules: []\n")
    with pytest.raises(RuleError, match=r"x.yaml:1: unknown format"):
        load_rules([str(p)], canonical=NAMES, config_names=CONFIG, shipped=False)
    p.write_text("format: trackbridge.derived/1\nrules:\n  - name: m/a\n    formula: [unclosed\n")
    with pytest.raises(RuleError, match=r"x.yaml:\d+: not valid YAML"):
        load_rules([str(p)], canonical=NAMES, config_names=CONFIG, shipped=False)
    with pytest.raises(RuleError, match="cannot read rules file"):
        load_rules([str(tmp_path / "missing.yaml")], canonical=NAMES, shipped=False)


def test_canonical_may_be_a_callable(tmp_path):
    path = rules_file(tmp_path, rule("x/out", "x/in * 2"))
    rs = load_rules([path], canonical=lambda n: n.startswith("x/"), config_names=CONFIG, shipped=False)
    m = {"x/in": 2}
    assert Deriver(rs).apply(m) == ["x/out"] and m["x/out"] == 4.0


def test_shipped_rules_load_against_shipped_canonical_and_are_cited():
    rs = load_rules()
    metrics, config = shipped_canonical()
    assert len(rs) >= 12
    for r in rs:
        assert "@" in r.citation and r.description, r.name
        for c in r.config:
            assert c in config
    assert may_overlap("time/{stage}", "time/gen") and not may_overlap("time/{stage}", "time/per_token_ms/gen")


# ------------------------------------------------------------------------------------------------ the Deriver
def test_logged_value_always_wins(tmp_path):
    rs = load(tmp_path, rule("m/c", "m/a + m/b"))
    m = {"m/a": 1.0, "m/b": 2.0, "m/c": 99.0}
    assert Deriver(rs).apply(m, step=1) == []
    assert m["m/c"] == 99.0
    m = {"m/a": 1.0, "m/b": 2.0, "m/c": None}          # logged as missing: derived
    assert Deriver(rs).apply(m, step=1) == ["m/c"] and m["m/c"] == 3.0


def test_missing_input_gives_nothing_silently(tmp_path):
    d = Deriver(load(tmp_path, rule("m/c", "m/a + m/b")))
    m = {"m/a": 1.0}
    assert d.apply(m) == [] and "m/c" not in m and d.notes == []


@pytest.mark.parametrize("metrics, config, reason", [
    ({"m/a": float("nan"), "m/b": 1.0}, {"num_gpus": 2}, "m/a is NaN"),
    ({"m/a": 1.0, "m/b": 0.0}, {"num_gpus": 2}, "division by zero"),
    ({"m/a": 1.0, "m/b": 1.0}, {}, "config value num_gpus is missing"),
    ({"m/a": 1.0, "m/b": 1.0}, {"num_gpus": "eight"}, "config value num_gpus is not a number"),
    ({"m/a": "text", "m/b": 1.0}, {"num_gpus": 2}, "m/a is not a number"),
])
def test_bad_values_give_no_output_and_one_note(tmp_path, metrics, config, reason):
    d = Deriver(load(tmp_path, rule("m/c", "m/a / (m/b * config.num_gpus)")), config=config)
    for step in (1, 2, 3):
        m = dict(metrics)
        assert d.apply(m, step=step) == []
        assert "m/c" not in m
    assert len(d.notes) == 1, d.notes
    assert reason in d.notes[0] and "m/c not derived" in d.notes[0] and "rules.yaml:3" in d.notes[0]
    m = {"m/a": 6.0, "m/b": 1.0}
    d.config["num_gpus"] = 3
    assert d.apply(m, step=4) == ["m/c"] and m["m/c"] == 2.0


def test_forbid_approximate_and_fidelity(tmp_path):
    rs = load(tmp_path, rule("m/c", "m/a + m/b", "    forbid_approximate: [m/a]\n") + rule("m/d", "m/b * 2"))
    d = Deriver(rs, fidelity={"m/a": "per-token mean, not per-sequence sum", "m/b": "snapshot differs"})
    m = {"m/a": 1.0, "m/b": 2.0}
    assert d.apply(m) == ["m/d"]
    assert "m/c" not in m
    assert any("input m/a is approximate (per-token mean" in n for n in d.notes)
    assert d.approximate["m/d"].startswith("derived from m/b, which is approximate: snapshot differs")
    d2 = Deriver(rs, fidelity={"m/a": "exact"})
    m = {"m/a": 1.0, "m/b": 2.0}
    assert d2.apply(m) == ["m/c", "m/d"] and d2.approximate == {}


def test_source_and_config_conditions(tmp_path):
    rs = load(tmp_path, rule("m/c", "m/a", "    requires: {sources: ['trl/*'], config_absent: [kl_target]}\n"))
    assert Deriver(rs, source="trl/ppo@v0.12.0..v0.25.1").apply({"m/a": 1.0}) == ["m/c"]
    assert Deriver(rs, source="trl").apply({"m/a": 1.0}) == []               # 'trl' alone is not 'trl/*'
    assert Deriver(rs, source="verl/ppo@v0.4.1").apply({"m/a": 1.0}) == []
    assert Deriver(rs, source=None).apply({"m/a": 1.0}) == []
    d = Deriver(rs, source="trl/ppo", config={"kl_target": 6.0})
    assert d.apply({"m/a": 1.0}) == [] and "kl_target is set" in next(iter(d.skipped.values()))


def test_templated_rule_with_only(tmp_path):
    rs = load(tmp_path, rule("ms/{stage}", "time/{stage} * 1000 / m/count", "    only: {stage: [gen, update]}\n"))
    m = {"time/gen": 2.0, "time/update": 1.0, "time/step": 9.0, "m/count": 500.0, "ms/update": 7.0}
    assert Deriver(rs).apply(m, step=1) == ["ms/gen"]
    assert m["ms/gen"] == 4.0 and m["ms/update"] == 7.0 and "ms/step" not in m


def test_step_argument_serves_as_progress_step(tmp_path):
    rs = load(tmp_path, rule("m/rate", "delta(m/count) / delta(progress/step)"))
    d = Deriver(rs)
    out = []
    for step, count in [(5, 100.0), (10, 600.0), (15, 1100.0)]:
        m = {"m/count": count}
        d.apply(m, step=step)
        assert "progress/step" not in m            # not left behind in the caller's dict
        out.append(m.get("m/rate"))
    assert out == [None, 100.0, 100.0]


# ------------------------------------------------------------------------------------------------ stateful rules
STATEFUL = (rule("m/delta", "delta(m/a)") + rule("m/sum", "cumsum(m/a)") + rule("m/ema", "ema(m/a, 0.5)")
            + rule("m/rate", "rate(m/a)"))


def run(d: Deriver, steps):
    out = []
    for step, t, a in steps:
        m = {} if a is None else {"m/a": a}
        d.apply(m, step=step, wall_time=t)
        out.append({k: v for k, v in m.items() if k != "m/a"})
    return out


def test_stateful_functions_across_steps(tmp_path):
    d = Deriver(load(tmp_path, STATEFUL))
    out = run(d, [(1, 100.0, 10.0), (2, 102.0, 14.0), (3, 106.0, 22.0)])
    assert out[0] == {"m/sum": 10.0, "m/ema": 10.0}                     # no delta/rate without an earlier value
    assert out[1] == {"m/delta": 4.0, "m/sum": 24.0, "m/ema": 12.0, "m/rate": 2.0}
    assert out[2] == {"m/delta": 8.0, "m/sum": 46.0, "m/ema": 17.0, "m/rate": 2.0}
    assert d.notes == []


def test_stateful_with_missing_steps(tmp_path):
    d = Deriver(load(tmp_path, STATEFUL))
    out = run(d, [(1, 100.0, 10.0), (2, 102.0, None), (3, 104.0, float("nan")), (4, 110.0, 40.0)])
    assert out[1] == {} and out[2] == {}
    # step 4 is compared with step 1, the last step where the input was present
    assert out[3] == {"m/delta": 30.0, "m/sum": 50.0, "m/ema": 25.0, "m/rate": 3.0}


def test_same_step_applied_twice_does_not_advance_state(tmp_path):
    d = Deriver(load(tmp_path, STATEFUL))
    run(d, [(1, 100.0, 10.0)])
    first = run(d, [(2, 102.0, 14.0)])
    again = run(d, [(2, 102.0, 14.0)])
    assert first == again


def test_stateful_rules_observe_steps_whose_output_was_logged(tmp_path):
    d = Deriver(load(tmp_path, rule("m/delta", "delta(m/a)")))
    m1, m2, m3 = {"m/a": 1.0, "m/delta": 0.5}, {"m/a": 3.0, "m/delta": 2.0}, {"m/a": 10.0}
    d.apply(m1, step=1)
    d.apply(m2, step=2)
    assert m1["m/delta"] == 0.5 and m2["m/delta"] == 2.0     # logged values untouched
    assert d.apply(m3, step=3) == ["m/delta"] and m3["m/delta"] == 7.0   # delta over step 2, not step 1


def test_resume_from_saved_state_matches_an_uninterrupted_run(tmp_path):
    rs = load(tmp_path, STATEFUL)
    steps = [(1, 100.0, 10.0), (2, 102.0, 14.0), (3, 103.0, None), (4, 106.0, 22.0), (5, 110.0, 30.0)]
    straight = run(Deriver(rs), steps)
    first = Deriver(rs)
    run(first, steps[:3])
    saved = json.loads(json.dumps(first.to_state()))      # what a checkpoint would store
    resumed = Deriver(rs).from_state(saved)
    assert run(resumed, steps[3:]) == straight[3:]
    # without the state the resumed run could not know the history
    assert run(Deriver(rs), steps[3:])[0] != straight[3]
    with pytest.raises(ValueError, match="not a derive state"):
        Deriver(rs).from_state({"slots": {}})


def test_derived_names_reach_the_record(tmp_path):
    d = Deriver(load(tmp_path, rule("m/c", "m/a + m/b")))
    m = {"m/a": 1.0, "m/b": 2.0}
    rec = Record(step=3, wall_time=1.0, metrics=m, derived=d.apply(m, step=3, wall_time=1.0))
    line = json.loads(dumps(rec.to_json()))
    assert line["derived"] == ["m/c"] and line["metrics"]["m/c"] == 3.0
    assert Record.from_json(line).derived == ["m/c"]


def test_user_rules_are_tried_before_shipped_ones(tmp_path):
    metrics, config = shipped_canonical()
    path = rules_file(tmp_path, rule("preference/reward/margin", "preference/reward/chosen * 0",
                                     "    override: true\n"))
    rs = load_rules([path], canonical=metrics, config_names=config)
    m = {"preference/reward/chosen": 2.0, "preference/reward/rejected": 1.0}
    assert Deriver(rs).apply(m) == ["preference/reward/margin"] and m["preference/reward/margin"] == 0.0
    m = {"preference/reward/chosen": 2.0, "preference/reward/rejected": 1.0}
    assert Deriver(load_rules()).apply(m) == ["preference/reward/margin"] and m["preference/reward/margin"] == 1.0


def test_shipped_kl_rules(tmp_path):
    rs = load_rules()
    d = Deriver(rs, config={"kl_coef": 0.05})
    m = {"kl/old_ref/k1_seq_sum": 4.0, "reward/score/mean": 1.0}
    names = d.apply(m, step=1)
    assert set(names) == {"reward/kl_penalty/mean", "reward/shaped/mean", "kl/coef"}
    assert m["reward/kl_penalty/mean"] == pytest.approx(-0.2) and m["reward/shaped/mean"] == pytest.approx(0.8)
    # adaptive controller: the config coefficient is only the initial value -> no penalty from it
    d = Deriver(rs, config={"kl_coef": 0.05, "kl_target": 6.0})
    m = {"kl/old_ref/k1_seq_sum": 4.0, "reward/score/mean": 1.0}
    assert d.apply(m, step=1) == []
    # zero KL: no coefficient, one note, no exception
    d = Deriver(rs)
    for step in (1, 2):
        m = {"kl/old_ref/k1_seq_sum": 0.0, "reward/kl_penalty/mean": 0.0}
        assert d.apply(m, step=step) == []
    assert len(d.notes) == 1 and "division by zero" in d.notes[0]
    assert not math.isnan(0.0)


# ------------------------------------------------------------------------------------------------ older names
OLD_NAME_RULE = rule("reward/kl_penalty/token_mean", "-config.kl_coef * kl/ref",
                     "    forbid_approximate: [kl/ref]\n")     # kl/ref: canonical@1.0.0's name of kl/ref/k3


def test_a_rule_written_for_an_older_canonical_version_reads_the_renamed_metric(tmp_path):
    path = rules_file(tmp_path, OLD_NAME_RULE)
    with pytest.warns(FutureWarning) as caught:
        rs = load_rules([path])
    msg = str(caught[0].message)
    assert (caught[0].filename, caught[0].lineno) == (path, 4)          # shown as rules.yaml:4: FutureWarning: ...
    assert "'kl/ref'" in msg and "'kl/ref/k3'" in msg and "reward/kl_penalty/token_mean" in msg
    (mine,) = [r for r in rs if r.file == path]
    assert mine.inputs == ["kl/ref/k3"] and mine.forbid_approximate == ["kl/ref/k3"]
    m = {"kl/ref/k3": 2.0}
    assert Deriver(rs, config={"kl_coef": 0.1}).apply(m) == ["reward/kl_penalty/token_mean"]
    assert m["reward/kl_penalty/token_mean"] == pytest.approx(-0.2)


def test_a_user_rules_file_with_an_older_name_works_through_the_translator(tmp_path):
    from trackbridge.pipeline import Translator
    path = rules_file(tmp_path, OLD_NAME_RULE)
    with pytest.warns(FutureWarning, match="kl/ref/k3"):
        t = Translator("canonical", mappings=[path], derive=True, config={"kl_coef": 0.5})
        out = t.translate({"kl/ref/k3": 0.25}, step=3)
    assert out.metrics["reward/kl_penalty/token_mean"] == pytest.approx(-0.125)
    assert "reward/kl_penalty/token_mean" in out.derived


def test_a_name_that_is_no_older_canonical_name_is_still_an_error(tmp_path):
    with pytest.raises(RuleError, match="unknown canonical name 'kl/reff'"):
        load_rules([rules_file(tmp_path, rule("reward/kl_penalty/token_mean", "kl/reff * 2"))])
