"""A file ``mappings lint`` rejects is rejected by every command that takes it with ``--mappings`` (issue 31 item 4:
``translate --mappings`` used to accept a rules or checks file that lint refused), and a YAML nested thousands of
levels deep is one line naming the file, not "maximum recursion depth exceeded"."""
from __future__ import annotations

import subprocess
import sys

import pytest

RULES = ("format: trackbridge.derived/1\nrules:\n  - name: m/a\n    formla: \"m/b\"\n    description: t\n"
         "    citation: t.py@v1\n")
CHECKS = """format: trackbridge.checks/1
checks:
  - id: my-lr-zero
    title: Learning rate is zero
    severity: warning
    reads: {lr: [optim/lr]}
    when: {below: {of: lr, value: 1.0e-12, for: 3}}
    mens: The optimizer does not move the weights.
    check_first: The scheduler.
    cites: [{title: "our runbook", path: "docs/runbook.md@v1"}]
"""


def _cli(*args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trackbridge", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=300)


@pytest.mark.parametrize("name, text, said", [
    ("rules.yaml", RULES, "rules.yaml:4: rule 'm/a': unknown field 'formla' (did you mean 'formula'?)"),
    ("checks.yaml", CHECKS, "checks.yaml:8: check 'my-lr-zero': unknown field 'mens' (did you mean 'means'?)"),
    ("deep.yaml", "a: " + "[" * 50_000 + "]" * 50_000 + "\n", "deep.yaml:1: YAML syntax error: exceeded maximum "
                                                                "nesting depth"),
    ("deep2.yaml", "a: " + "[" * 900 + "]" * 900 + "\n", "deep2.yaml: YAML nested too deeply to read"),
])
def test_what_lint_rejects_every_command_rejects(tmp_path, name, text, said):
    (tmp_path / name).write_text(text, encoding="utf-8")
    (tmp_path / "in.jsonl").write_text('{"step": 1, "loss": 1.0}\n', encoding="utf-8")
    lint = _cli("mappings", "lint", name, cwd=tmp_path)
    assert lint.returncode == 2 and said in lint.stderr, lint.stderr
    for command in (["translate", "in.jsonl"], ["doctor", "in.jsonl"],
                    ["compare", "in.jsonl", "--out", "rep"], ["migrate", "in.jsonl", "jsonl:out"]):
        r = _cli(*command, "--mappings", name, cwd=tmp_path)
        assert r.returncode == 2 and said in r.stderr, (command, r.stderr)
        assert "Traceback" not in r.stderr and "recursion" not in r.stderr
        assert r.stdout == ""
    assert not (tmp_path / "rep").exists() and not (tmp_path / "out").exists()
