"""A user's mapping file adds or overrides names without editing the shipped files (issue 18, item 3).

The rule (docs/mapping-format.md, "Your own files"; the derived rules' rule): a user entry colliding with a shipped
one -- the same key, or the same canonical name written back, for releases and trainers both cover -- is an error at
the user's file and line that names the shipped entry and the fix, unless it says ``override: true``; then it wins
where the two overlap and only there. Checked on a toy "shipped" framework (every cut of releases and trainers) and on
the real shipped files through the CLI (exit codes, the one-line messages).
"""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from trackbridge.pipeline import Translator
from trackbridge.schema.loader import build_registry, shipped_files
from trackbridge.schema.yamlfile import MappingError, MappingErrors

CANON = textwrap.dedent("""\
    format: trackbridge.canonical/1
    schema_version: 1.1.0
    versions: {1.1.0: {}, 1.0.0: {}}
    metrics:
      policy/entropy: {description: entropy, unit: nats/token}
      policy/entropy_seq_sum: {description: entropy summed per sequence, unit: nats}
      reward/score/mean: {description: score, unit: "1"}
      reward/fn/{reward_fn}/mean: {description: one reward function, unit: "1"}
    """)

SHIPPED = textwrap.dedent("""\
    format: trackbridge.mapping/1
    framework: toy
    releases: [v0.1, v0.2, v0.3, v0.4]
    trainers: {a: {}, b: {}}
    entries:
      - {key: ent, canonical: policy/entropy, source: toy.py@v0.1}
      - {key: score, canonical: reward/score/mean, trainers: [a], source: toy.py@v0.1}
      - {key: "gdpo/{reward_fn}/mean", canonical: "reward/fn/{reward_fn}/mean", since: v0.3, source: toy.py@v0.3}
    """)


def _registry(tmp_path: Path, user: str, shipped: str = SHIPPED):
    (tmp_path / "canonical.yaml").write_text(CANON)
    (tmp_path / "toy.yaml").write_text(shipped)
    mine = tmp_path / "mine.yaml"
    mine.write_text("format: trackbridge.mapping/1\nframework: toy\nentries:\n" + textwrap.indent(user, "  "))
    return build_registry([tmp_path / "canonical.yaml", tmp_path / "toy.yaml"], [str(mine)]), str(mine)


def _errors(tmp_path: Path, user: str, shipped: str = SHIPPED) -> list[MappingError]:
    with pytest.raises(MappingError) as info:
        _registry(tmp_path, user, shipped)
    exc = info.value
    return exc.errors if isinstance(exc, MappingErrors) else [exc]


def _forward(reg, key: str, version: str, trainer: str = "a") -> tuple[str, bool]:
    """(canonical name, exact) of ``key`` logged by toy/``trainer``@``version``."""
    res = Translator(f"toy/{trainer}@{version}", "canonical", registry=reg).translate({key: 1.0})
    (name,) = res.metrics
    return name, name not in res.approximate


def _backward(reg, name: str, version: str, trainer: str = "a") -> str:
    res = Translator("canonical", f"toy/{trainer}@{version}", registry=reg).translate({name: 1.0})
    (key,) = res.metrics
    return key


# ------------------------------------------------------------------------------------------------ collisions
def test_a_new_key_that_collides_nowhere_just_adds(tmp_path):
    reg, _ = _registry(tmp_path, '- {key: my_ent, canonical: policy/entropy_seq_sum, source: "my.py@v1"}\n')
    assert reg.overrides == []
    assert _forward(reg, "my_ent", "0.2")[0] == "policy/entropy_seq_sum"
    assert _forward(reg, "ent", "0.2")[0] == "policy/entropy"          # the shipped entry untouched


def test_same_key_without_override_is_an_error_at_the_users_line(tmp_path):
    errs = _errors(tmp_path, '- {key: ent, canonical: policy/entropy_seq_sum, source: "my.py@v1"}\n')
    assert len(errs) == 1, [str(e) for e in errs]
    text = str(errs[0])
    assert errs[0].file.endswith("mine.yaml") and errs[0].line == 4, text
    assert text.startswith(f"{errs[0].file}:4: ent: "), text
    assert "toy.yaml:6" in text and "override: true" in text and "since/until/trainers" in text, text
    assert "toy every release, every trainer" in text, text


def test_same_canonical_written_back_without_override_is_an_error(tmp_path):
    errs = _errors(tmp_path, '- {key: "rx/{reward_fn}", canonical: "reward/fn/{reward_fn}/mean", source: "m.py@v1"}\n')
    assert len(errs) == 1, [str(e) for e in errs]
    text = str(errs[0])
    assert errs[0].file.endswith("mine.yaml") and errs[0].line == 4, text
    assert "toy.yaml:8" in text and "'gdpo/{reward_fn}/mean'" in text and "v0.3 onwards" in text, text
    assert "reverse: false" in text and "override: true" in text, text


def test_reverse_false_reads_your_key_and_writes_the_shipped_one(tmp_path):
    reg, _ = _registry(tmp_path, '- {key: "rx/{reward_fn}", canonical: "reward/fn/{reward_fn}/mean", reverse: false, '
                                 'source: "m.py@v1"}\n')
    assert reg.overrides == []
    assert _forward(reg, "rx/acc", "0.4")[0] == "reward/fn/acc/mean"
    assert _backward(reg, "reward/fn/acc/mean", "0.4") == "gdpo/acc/mean"


def test_override_of_a_written_back_name_keeps_reading_the_shipped_key(tmp_path):
    reg, _ = _registry(tmp_path, '- {key: "rx/{reward_fn}", canonical: "reward/fn/{reward_fn}/mean", override: true, '
                                 'source: "m.py@v1"}\n')
    assert len(reg.overrides) == 1 and "mine.yaml:4" in reg.overrides[0] and "still read" in reg.overrides[0]
    assert _backward(reg, "reward/fn/acc/mean", "0.4") == "rx/acc"
    assert _forward(reg, "gdpo/acc/mean", "0.4")[0] == "reward/fn/acc/mean"
    assert _forward(reg, "rx/acc", "0.1")[0] == "reward/fn/acc/mean"


def test_override_of_a_key_wins_only_where_the_releases_overlap(tmp_path):
    reg, _ = _registry(tmp_path, '- {key: ent, canonical: policy/entropy_seq_sum, since: v0.2, until: v0.3, '
                                 'override: true, source: "fork.py@v0.2"}\n')
    assert [_forward(reg, "ent", v)[0] for v in ("0.1", "0.2", "0.3", "0.4")] == [
        "policy/entropy", "policy/entropy_seq_sum", "policy/entropy_seq_sum", "policy/entropy"]
    assert len(reg.overrides) == 1 and "toy v0.2..v0.3, every trainer" in reg.overrides[0], reg.overrides


def test_override_of_a_key_wins_only_for_the_trainers_it_names(tmp_path):
    reg, _ = _registry(tmp_path, '- {key: ent, canonical: policy/entropy_seq_sum, trainers: [b], override: true, '
                                 'source: "fork.py@v0.1"}\n')
    assert _forward(reg, "ent", "0.3", "b")[0] == "policy/entropy_seq_sum"
    assert _forward(reg, "ent", "0.3", "a")[0] == "policy/entropy"
    assert "trainer b" in reg.overrides[0], reg.overrides


def test_entries_for_other_trainers_or_releases_do_not_collide(tmp_path):
    reg, _ = _registry(tmp_path, '- {key: score, canonical: policy/entropy_seq_sum, trainers: [b], source: "m.py@v1"}\n'
                                 '- {key: "rx/{reward_fn}", canonical: "reward/fn/{reward_fn}/mean", until: v0.2, '
                                 'source: "m.py@v1"}\n')
    assert reg.overrides == []
    assert _forward(reg, "score", "0.2", "b")[0] == "policy/entropy_seq_sum"
    assert _forward(reg, "score", "0.2", "a")[0] == "reward/score/mean"
    assert _backward(reg, "reward/fn/acc/mean", "0.2") == "rx/acc"
    assert _backward(reg, "reward/fn/acc/mean", "0.4") == "gdpo/acc/mean"


def test_override_on_an_entry_that_collides_with_nothing_changes_nothing(tmp_path):
    reg, _ = _registry(tmp_path, '- {key: my_ent, canonical: policy/entropy_seq_sum, override: true, '
                                 'source: "my.py@v1"}\n')
    assert reg.overrides == []
    assert _forward(reg, "my_ent", "0.1")[0] == "policy/entropy_seq_sum"
    assert _forward(reg, "ent", "0.1")[0] == "policy/entropy"


def test_override_in_a_shipped_file_is_an_error(tmp_path):
    shipped = SHIPPED.replace("{key: ent, canonical: policy/entropy,", "{key: ent, canonical: policy/entropy, "
                                                                        "override: true,")
    errs = _errors(tmp_path, '- {key: my_ent, canonical: policy/entropy_seq_sum, source: "my.py@v1"}\n', shipped)
    assert len(errs) == 1 and errs[0].file.endswith("toy.yaml") and "user files" in str(errs[0]), errs


def test_two_user_entries_colliding_are_still_an_error_naming_both(tmp_path):
    errs = _errors(tmp_path, '- {key: my_ent, canonical: policy/entropy_seq_sum, source: "my.py@v1"}\n'
                             '- {key: my_ent, canonical: policy/entropy, source: "my.py@v1"}\n')
    assert len(errs) == 1 and "mine.yaml:5" in str(errs[0]) and str(errs[0]).startswith(errs[0].file), errs


# ------------------------------------------------------------------------------------------------ the real files
def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trackbridge", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=120)


def test_real_shipped_files_collision_blames_the_users_file(tmp_path):
    """What the README's example did before: a key of one's own writing back a name veRL's GDPO writes back."""
    mine = tmp_path / "my_mappings.yaml"
    mine.write_text('format: trackbridge.mapping/1\nframework: verl\nentries:\n'
                    '  - {key: "reward_extra_info/{reward_fn}", canonical: "reward/fn/{reward_fn}/mean", '
                    'source: "my_reward.py@v1"}\n')
    shipped_verl = next(str(p) for p in shipped_files() if p.name == "verl.yaml")
    lint = _cli("mappings", "lint", mine.name, cwd=tmp_path)
    assert lint.returncode == 2, lint
    (line,) = [ln for ln in lint.stderr.splitlines() if ln.strip()]
    assert line.startswith("my_mappings.yaml:4: reward_extra_info/{reward_fn}: the shipped verl.yaml:"), line
    assert shipped_verl not in line and "override: true" in line and "reverse: false" in line, line
    run = tmp_path / "run.jsonl"
    run.write_text('{"step": 1, "reward_extra_info/acc": 0.5}\n')
    tr = _cli("translate", "--from", "verl@0.5.0", "--mappings", mine.name, run.name, cwd=tmp_path)
    assert tr.returncode == 2 and "my_mappings.yaml:4:" in tr.stderr and not tr.stdout, tr
    assert "Traceback" not in tr.stderr + lint.stderr
    # with the fix the message proposes, both pass, and lint says what is overridden
    mine.write_text(mine.read_text().replace('source: "my_reward.py@v1"', 'source: "my_reward.py@v1", override: true'))
    lint = _cli("mappings", "lint", mine.name, cwd=tmp_path)
    assert lint.returncode == 0, lint
    assert "note: my_mappings.yaml:4: 'reward_extra_info/{reward_fn}' is written for canonical" in lint.stdout, lint
    tr = _cli("translate", "--from", "verl@0.5.0", "--mappings", mine.name, run.name, cwd=tmp_path)
    assert tr.returncode == 0, tr
    assert tr.stdout.strip() == '{"step": 1, "reward/fn/acc/mean": 0.5}', tr.stdout
