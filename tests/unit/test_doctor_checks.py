"""The checks files (``trackbridge.checks/1``): the shipped one, and users' files that add or override checks.

Same schema layer as the mapping files and the derived rules: one YAML loader (line numbers, duplicate keys), the
JSON Schema mappings/schemas/checks.schema.json, errors as ``file:line: check 'ID': message``, and the derived
rules' override rule (a user check reusing a shipped id must say ``override: true``).
"""
from __future__ import annotations

import textwrap
import warnings

import pytest

from trackbridge import cli
from trackbridge.doctor import CheckError, Doctor, load_checks
from trackbridge.doctor.conditions import COMPOSITES, PRIMITIVES
from trackbridge.record import Record
from trackbridge.schema.loader import load_registry
from trackbridge.schema.paths import mappings_dir
from trackbridge.schema.yamlfile import MappingError

GOOD = """\
format: trackbridge.checks/1
checks:
  - id: my-lr-zero
    title: Learning rate is zero
    severity: warning
    reads: {lr: [optim/lr]}
    when: {below: {of: lr, value: 1.0e-12, for: 3}}
    means: The optimizer does not move the weights.
    check_first: The scheduler.
    cites: [{title: "our runbook", path: "docs/runbook.md@v1"}]
"""


def write(tmp_path, text: str, name: str = "mine.yaml"):
    p = tmp_path / name
    p.write_text(textwrap.dedent(text), encoding="utf-8")
    return p


def problem(tmp_path, text: str) -> str:
    p = write(tmp_path, text)
    with pytest.raises(MappingError) as err:
        load_checks(paths=[str(p)])
    return str(err.value)


# ---------------------------------------------------------------------------------------------------- shipped
def test_the_shipped_checks_load_and_each_cites_what_it_follows():
    checks = load_checks()
    assert len(checks) >= 20
    assert len({c.id for c in checks}) == len(checks)
    canon = load_registry().canonical
    kinds = set()
    for c in checks:
        assert c.cites and all(x.url or x.path for x in c.cites), c.id
        assert c.means and c.check_first, c.id
        for names in c.reads.values():
            for n in names:
                assert canon.find(canon.splits.strip(n)) is not None or "{" in n, (c.id, n)
        stack = [c.when]
        while stack:
            s = stack.pop()
            kinds.add(s.kind)
            stack.extend(s.parts)
    # every kind of condition the engine has is used by a shipped check (none is dead code)
    assert kinds == set(PRIMITIVES) | set(COMPOSITES), sorted(set(PRIMITIVES) | set(COMPOSITES) - kinds)


def test_the_shipped_file_is_checked_by_mappings_lint(capsys):
    assert cli.main(["mappings", "lint"]) == 0
    assert "33 checks" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------------------- errors
@pytest.mark.parametrize("edit, line, words", [
    (("means:", "mens:"), 8, "unknown field 'mens' (did you mean 'means'?)"),
    (("severity: warning", "severity: bad"), 5, "severity: 'bad' is not one of 'critical', 'warning', 'info'"),
    (("[optim/lr]", "[optim/learning_rate]"), 6, "'optim/learning_rate' is not a canonical metric name"),
    (("{of: lr,", "{of: rate,"), 7, "'rate' is not a role of `reads`"),
    (("below: {of: lr, value: 1.0e-12, for: 3}", "below: {of: lr, value: 1, for: 3}, spike: {of: lr, factor: 3}"),
     7, "exactly one kind"),
    (("below: {of: lr, value: 1.0e-12, for: 3}", "below: {of: lr, for: 3}"), 7, "exactly one of `value` and `config`"),
    (("below: {of: lr, value: 1.0e-12, for: 3}", "below: {of: lr, config: no_such_setting}"), 7,
     "'no_such_setting' is not a canonical config name"),
    (("below: {of: lr, value: 1.0e-12, for: 3}", "spkie: {of: lr, factor: 3}"), 7,
     "unknown field 'spkie' (did you mean 'spike'?)"),
    (("below: {of: lr, value: 1.0e-12, for: 3}", "no_gain: {of: lr}"), 7, "has no direction"),
    (('[{title: "our runbook", path: "docs/runbook.md@v1"}]', "[no-such-source]"), 10,
     "unknown source 'no-such-source'"),
    (('[{title: "our runbook", path: "docs/runbook.md@v1"}]', '[{title: "a blog"}]'), 10, "needs a url or a path"),
    (("id: my-lr-zero", "id: My_LR"), 3, "id: 'My_LR' must be lower-case words joined by '-'"),
])
def test_a_bad_check_is_named_by_file_line_and_check(tmp_path, edit, line, words):
    old, new = edit
    assert old in GOOD
    msg = problem(tmp_path, GOOD.replace(old, new))
    assert f"mine.yaml:{line}:" in msg and words in msg, msg


def test_then_needs_within_and_any_takes_none(tmp_path):
    two = ("when:\n      then:\n        - below: {of: lr, value: 1.0e-12}\n        - below: {of: lr, value: 1.0e-13}"
           "\n    means:")
    msg = problem(tmp_path, GOOD.replace("when: {below: {of: lr, value: 1.0e-12, for: 3}}\n    means:", two))
    assert "mine.yaml:8:" in msg and "then: needs `within`" in msg, msg


def test_an_older_canonical_name_is_read_as_todays_with_a_warning(tmp_path):
    p = write(tmp_path, GOOD.replace("reads: {lr: [optim/lr]}", "reads: {lr: [kl/ref]}"))
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        checks = load_checks(paths=[str(p)])
    assert checks.get("my-lr-zero").reads["lr"] == ("kl/ref/k3",)
    assert any(issubclass(x.category, FutureWarning) and "kl/ref/k3" in str(x.message) for x in w)


# ---------------------------------------------------------------------------------------------------- override
def test_a_user_check_reusing_a_shipped_id_needs_override(tmp_path):
    mine = GOOD.replace("id: my-lr-zero", "id: clip-fraction-high")
    msg = problem(tmp_path, mine)
    shipped = mappings_dir() / "checks.yaml"
    assert "mine.yaml:3: check 'clip-fraction-high': a shipped check already has this id" in msg
    assert f"{shipped}:" in msg and "override: true" in msg


def test_override_replaces_the_shipped_check_in_its_place(tmp_path):
    mine = write(tmp_path, """\
        format: trackbridge.checks/1
        checks:
          - id: clip-fraction-high
            title: Clip fraction above 5%
            severity: critical
            reads: {clip: [policy/clip_frac]}
            when: {above: {of: clip, value: 0.05, for: 2}}
            means: Our runs never clip that much.
            check_first: The learning rate.
            cites: [glossary]
            override: true
    """)
    shipped = load_checks()
    checks = load_checks(paths=[str(mine)])
    assert [c.id for c in checks] == [c.id for c in shipped]           # same place in the order
    assert checks.get("clip-fraction-high").severity == "critical"
    doc = Doctor(checks)
    for t, v in enumerate([0.01, 0.02, 0.08, 0.09, 0.01]):
        doc.feed(Record(t, None, {"policy/clip_frac": v}))
    (f,) = doc.finish()
    assert (f.id, f.severity, f.first_step, f.last_step) == ("clip-fraction-high", "critical", 2, 3)


def test_two_user_files_with_one_id_are_an_error(tmp_path):
    a = write(tmp_path, GOOD, "a.yaml")
    b = write(tmp_path, GOOD, "b.yaml")
    with pytest.raises(CheckError, match=r"b.yaml:3: check 'my-lr-zero': id 'my-lr-zero' is also used by .*a.yaml:3"):
        load_checks(paths=[str(a), str(b)])


def test_a_user_check_is_linted_and_used_through_mappings(tmp_path, capsys):
    mine = write(tmp_path, GOOD)
    assert cli.main(["mappings", "lint", str(mine)]) == 0
    assert "34 checks" in capsys.readouterr().out
    bad = write(tmp_path, GOOD.replace("means:", "mens:"), "bad.yaml")
    assert cli.main(["mappings", "lint", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "bad.yaml:8: check 'my-lr-zero': unknown field 'mens'" in err


# ---------------------------------------------------------------------------------------------------- the docs
def test_docs_list_every_shipped_check_and_their_example_file_loads(tmp_path):
    from _support import ROOT
    doc = (ROOT / "docs" / "diagnostics.md").read_text(encoding="utf-8")
    for c in load_checks():
        assert f"| `{c.id}` | {c.severity}" in doc, c.id
    blocks = [b for b in doc.split("```yaml\n")[1:] if "format: trackbridge.checks/1" in b]
    assert len(blocks) == 1
    mine = write(tmp_path, blocks[0].split("```")[0], "example.yaml")
    checks = load_checks(paths=[str(mine)])
    assert checks.get("reward-flat-after-warmup") is not None
    assert checks.get("clip-fraction-high").when.params["value"] == 0.1          # the override took its place


# ---------------------------------------------------------------------------------------------------- issue 32
@pytest.mark.parametrize("edit, line, words", [
    (("below: {of: lr, value: 1.0e-12, for: 3}", "flat: {of: lr, window: 5}"), 7, "flat: optim/lr has no direction"),
    (("below: {of: lr, value: 1.0e-12, for: 3}", "drop: {of: lr, by: 0.5, after_rise: true}"), 7,
     "drop: `after_rise` is measured in the series' noise: give `noise`"),
    (("below: {of: lr, value: 1.0e-12, for: 3}", "spike: {of: lr, factor: 3, baseline: max, over_usual: 2}"), 7,
     "spike: `over_usual` compares with the window's usual points"),
    (("below: {of: lr, value: 1.0e-12, for: 3}", "collapse: {of: lr, to: 0.5, within: 5}"), 7,
     "collapse: `within` is the span of `reference: peak`"),
    (("below: {of: lr, value: 1.0e-12, for: 3}", "collapse: {of: lr, to: 0.2, reference: top}"), 7,
     "reference: 'top' is not one of 'early', 'peak'"),
    (("    cites:", "    explains: {checks: [my-lr-zero]}\n    cites:"), 10,
     "explains: a check does not explain itself"),
    (("    cites:", "    explains: {checks: [no-such-check]}\n    cites:"), 3,
     "explains: unknown check id(s) no-such-check"),
    (("    cites:", "    explains: {check: [kl-spike]}\n    cites:"), 10, "unknown field 'check'"),
])
def test_the_new_condition_fields_and_explains_are_checked(tmp_path, edit, line, words):
    old, new = edit
    assert old in GOOD
    msg = problem(tmp_path, GOOD.replace(old, new))
    assert f"mine.yaml:{line}:" in msg and words in msg, msg


def _finding_set(checks, rows):
    doc = Doctor(checks)
    for t, m in enumerate(rows):
        doc.feed(Record(t, None, m))
    return doc.finish()


def test_a_user_file_s_cause_is_listed_before_what_it_explains_and_a_cycle_is_no_loop(tmp_path):
    mine = write(tmp_path, """\
        format: trackbridge.checks/1
        checks:
          - id: lr-zero
            title: Learning rate is zero
            severity: info
            reads: {lr: [optim/lr]}
            when: {below: {of: lr, value: 1.0e-12, for: 2}}
            means: The optimizer does not move the weights.
            check_first: The scheduler.
            explains: {checks: [clip-high], within: 1}
            cites: [{title: "our runbook", path: "docs/runbook.md@v1"}]
          - id: clip-high
            title: Clip fraction high
            severity: critical
            reads: {clip: [policy/clip_frac]}
            when: {above: {of: clip, value: 0.5, for: 2}}
            means: Too far.
            check_first: The learning rate.
            explains: {checks: [lr-zero], within: 1}
            cites: [{title: "our runbook", path: "docs/runbook.md@v1"}]
    """)
    checks = load_checks(paths=[str(mine)], shipped=False)
    rows = [{"optim/lr": 0.0 if t >= 5 else 1e-6, "policy/clip_frac": 0.9 if t >= 6 else 0.1} for t in range(12)]
    found = _finding_set(checks, rows)
    # clip-high (critical) would come first; lr-zero began first and explains it: it leads (the cycle back from
    # clip-high to lr-zero is not followed)
    assert [(f.id, f.first_step) for f in found] == [("lr-zero", 5), ("clip-high", 6)]
    assert found[1].notes == ["likely caused by learning rate is zero [lr-zero], steps 5-11, listed before it: "
                              "look at that first"]
    assert found[0].notes == []
    # stretches apart by more than `within`: no cause
    rows = [{"optim/lr": 0.0 if t < 3 else 1e-6, "policy/clip_frac": 0.9 if t >= 8 else 0.1} for t in range(12)]
    assert [(f.id, f.notes) for f in _finding_set(checks, rows)] == [("clip-high", []), ("lr-zero", [])]
