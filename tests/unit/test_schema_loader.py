"""The loader rejects malformed mapping files with file, line and entry named; the CLI lint exits 2."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from trackbridge.schema.loader import build_registry, load_registry, shipped_files
from trackbridge.schema.yamlfile import MappingError, MappingErrors

CANON = textwrap.dedent("""\
    format: trackbridge.canonical/1
    schema_version: 1.1.0
    versions:
      1.1.0:
        rename_metrics: {policy/ent: policy/entropy}
      1.0.0: {}
    config:
      kl_coef: {description: beta, unit: "1"}
    metrics:
      policy/entropy: {description: entropy, unit: nats/token}
      time/{stage}: {description: seconds per stage, unit: s}
      time/step: {description: step seconds, unit: s}
      val/{data_source:path}/{var}/mean@{n}: {description: val, unit: "1"}
    """)

FW = textwrap.dedent("""\
    format: trackbridge.mapping/1
    framework: toy
    releases: [v0.1, v0.2, v0.3]
    trainers: {a: {}, b: {}}
    prefixes: [{prefix: "eval/", split: eval}]
    config: [{key: algo.kl, canonical: kl_coef, source: toy.py@v0.1}]
    entries:
      - {key: ent, canonical: policy/entropy, source: toy.py@v0.1}
      - {key: "t/{stage}", canonical: "time/{stage}", transform: {scale: 0.001}, source: toy.py@v0.1}
      - {key: step_ms, canonical: time/step, transform: {scale: 0.001}, source: toy.py@v0.2, since: v0.2}
    """)


def _write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def _load(tmp_path, fw_text, canon_text=CANON):
    return build_registry([_write(tmp_path, "canonical.yaml", canon_text), _write(tmp_path, "toy.yaml", fw_text)], [])


def _errors(exc: MappingError) -> list[MappingError]:
    return exc.errors if isinstance(exc, MappingErrors) else [exc]


def test_valid_files_load(tmp_path):
    reg = _load(tmp_path, FW)
    assert reg.canonical.version == "1.1.0"
    assert reg.canonical.upgrade("policy/ent") == "policy/entropy"
    assert reg.canonical.downgrade("policy/entropy", "1.0.0") == "policy/ent"
    assert [e.key for e in reg.frameworks["toy"].entries] == ["ent", "t/{stage}", "step_ms"]


@pytest.mark.parametrize("bad, line, needle", [
    (FW.replace("source: toy.py@v0.1}\n  - {key: \"t", "source: toy.py@v0.1, colour: red}\n  - {key: \"t", 1),
     8, "unknown field 'colour'"),
    (FW.replace("canonical: policy/entropy", "canonical: policy/nope"), 8, "does not exist in canonical.yaml"),
    (FW + "  - {key: ent, canonical: policy/entropy, source: toy.py@v0.3, since: v0.3}\n", 8,
     "two entries claim 'ent'"),
    (FW.replace("transform: {scale: 0.001}, source: toy.py@v0.2", "transform: {scale: 0}, source: toy.py@v0.2"), 10,
     "not invertible"),
    (FW.replace("{key: ent, canonical: policy/entropy,",
                "{key: ent, canonical: policy/entropy, fidelity: approximate,"),
     8, "needs a `reason`"),
    (FW.replace("since: v0.2}", "since: v9.9}"), 10, "not in the framework's `releases`"),
    (FW.replace('canonical: "time/{stage}"', "canonical: time/step"), 9, "placeholders"),
    (FW + "  - {key: ent2, canonical: policy/entropy, source: x@v0.1}\n", 8, "ambiguous"),
    (FW.replace("since: v0.2}", "since: v0.2, when: {config: {m: {in: []}}}}"), 10, "'in' takes a list"),
    (FW.replace("since: v0.2}", "since: v0.2, when: {config: {m: {in: k1}}}}"), 10, "'in' takes a list"),
])
def test_bad_entries_are_named_with_file_and_line(tmp_path, bad, line, needle):
    with pytest.raises(MappingError) as info:
        _load(tmp_path, bad)
    errs = _errors(info.value)
    hit = [e for e in errs if needle in str(e)]
    assert hit, [str(e) for e in errs]
    assert hit[0].file.endswith("toy.yaml")
    assert hit[0].line == line, str(hit[0])


def test_yaml_syntax_error_names_line(tmp_path):
    with pytest.raises(MappingError) as info:
        _load(tmp_path, FW.replace("releases: [v0.1, v0.2, v0.3]", "releases: [v0.1, v0.2"))
    assert "toy.yaml" in str(info.value) and "YAML syntax error" in str(info.value)
    assert info.value.line is not None


def test_mapping_file_that_is_not_utf8_names_file_line_and_byte(tmp_path):
    from trackbridge.schema.yamlfile import load_yaml
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes(b"format: trackbridge.mapping/1\nframework: x\n# caf\xe9\n")
    with pytest.raises(MappingError) as info:
        load_yaml(bad)
    assert info.value.line == 3 and "not UTF-8" in str(info.value) and "byte 48" in str(info.value)
    assert str(info.value).startswith(f"{bad}:3: ")


@pytest.mark.parametrize("text", [
    "a: 1\nb: [1, 2\nc: 3\n",                 # unclosed flow sequence
    "a: 1\n\tb: 2\n",                         # tab indentation
    "a: 1\n- b\n",                            # mapping then sequence
    "a: &x 1\nb: *y\n",                        # undefined alias
    "a: \"open\nb: 1\n",                        # unterminated string
    "a: 1\nb:\n  x: 1\n  x: 2\n",               # duplicate key (our own check)
    "a: !!python/object:os.system x\n",         # unsafe tag
])
def test_yaml_errors_read_the_same_with_libyaml(tmp_path, monkeypatch, text):
    """libyaml parses the files, but a broken file is reported exactly as the pure-Python parser words it."""
    from trackbridge.schema import yamlfile
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    messages = []
    for loader in (yamlfile._Loader, yamlfile._PyLoader):
        monkeypatch.setattr(yamlfile, "_Loader", loader)
        with pytest.raises(MappingError) as info:
            yamlfile.load_yaml(f)
        messages.append((str(info.value), info.value.line, type(info.value)))
    assert messages[0] == messages[1]
    assert messages[0][0].startswith(f"{f}:{messages[0][1]}: ")


def test_duplicate_yaml_key_rejected(tmp_path):
    with pytest.raises(MappingError) as info:
        _load(tmp_path, FW + "framework: toy2\n")
    assert "duplicate key 'framework'" in str(info.value) and info.value.line == 11


def test_unknown_format_rejected(tmp_path):
    with pytest.raises(MappingError) as info:
        _load(tmp_path, FW.replace("trackbridge.mapping/1", "trackbridge.mapping/9"))
    assert "unknown format 'trackbridge.mapping/9'" in str(info.value)
    assert "newer trackbridge" in str(info.value)


def test_unsafe_yaml_is_not_constructed(tmp_path):
    evil = FW.replace("framework: toy", "framework: !!python/object/apply:os.system ['echo pwned']")
    with pytest.raises(MappingError) as info:
        _load(tmp_path, evil)
    assert "YAML" in str(info.value)


def test_canonical_rename_target_must_exist(tmp_path):
    with pytest.raises(MappingError) as info:
        _load(tmp_path, FW, CANON.replace("{policy/ent: policy/entropy}", "{policy/ent: policy/gone}"))
    assert "rename target 'policy/gone'" in str(info.value)


def test_shipped_mappings_are_valid():
    reg = load_registry()
    assert {"trl", "verl", "openrlhf"} <= set(reg.frameworks)
    assert reg.resolve_alias("trl-legacy")[0] == "trl"


def test_lint_cli_exit_codes(tmp_path):
    bad = _write(tmp_path, "user.yaml", textwrap.dedent("""\
        format: trackbridge.mapping/1
        framework: verl
        entries:
          - {key: reward_extra_info/acc, canonical: no/such/name, source: mine.py@v1}
        """))
    r = subprocess.run([sys.executable, "-m", "trackbridge", "mappings", "lint", str(bad)], capture_output=True,
                       text=True)
    assert r.returncode == 2
    assert f"{bad}:4: reward_extra_info/acc: canonical target 'no/such/name' does not exist" in r.stderr
    r = subprocess.run([sys.executable, "-m", "trackbridge", "mappings", "lint"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("ok:")


def test_shipped_files_exist():
    names = {p.name for p in shipped_files()}
    assert {"canonical.yaml", "trl.yaml", "verl.yaml", "openrlhf.yaml"} <= names


# -- the compiled registry cache ---------------------------------------------------------------------------------
def _fresh_load(monkeypatch, cache_dir, extra=()):
    from trackbridge.schema import loader
    monkeypatch.setenv("TRACKBRIDGE_CACHE_DIR", str(cache_dir))
    loader._load_cached.cache_clear()
    try:
        return loader.load_registry(list(extra))
    finally:
        loader._load_cached.cache_clear()


def _summary(reg):
    return ({n: [(e.key, e.canonical, e.since, e.until, e.trainers, e.fidelity) for e in fw.entries]
             for n, fw in reg.frameworks.items()}, sorted(reg.canonical.metrics))


def test_compiled_cache_gives_the_same_registry(monkeypatch, tmp_path):
    monkeypatch.delenv("TRACKBRIDGE_NO_CACHE", raising=False)
    first = _fresh_load(monkeypatch, tmp_path)
    assert len(list(tmp_path.glob("registry-*.pickle"))) == 1
    second = _fresh_load(monkeypatch, tmp_path)           # read from the cache
    assert second is not first and _summary(second) == _summary(first)
    # renames survive the round trip (they are linked by identity in memory)
    fw = second.frameworks["trl"]
    old = next(e for e in fw.entries if e.key == "completion_length")
    new = next(e for e in fw.entries if e.key == "completions/mean_length" and "grpo" in (e.trainers or ()))
    assert fw.same_quantity(old, new)
    from trackbridge import Translator
    res = Translator("trl/grpo@0.16.0", "trl/grpo@1.16.0", registry=second).translate({"completion_length": 5.0})
    assert res.metrics == {"completions/mean_length": 5.0} and not res.approximate


def test_compiled_cache_follows_the_files(monkeypatch, tmp_path):
    monkeypatch.delenv("TRACKBRIDGE_NO_CACHE", raising=False)
    user = tmp_path / "mine.yaml"
    user.write_text("format: trackbridge.mapping/1\nframework: verl\nentries:\n"
                    "  - {key: my/a, canonical: reward/score/mean, reverse: false, source: my.py@v1}\n")
    cache = tmp_path / "cache"
    reg = _fresh_load(monkeypatch, cache, [user])
    assert any(e.key == "my/a" for e in reg.frameworks["verl"].entries)
    user.write_text(user.read_text().replace("my/a", "my/b"))     # an edited file is compiled again
    reg = _fresh_load(monkeypatch, cache, [user])
    keys = {e.key for e in reg.frameworks["verl"].entries}
    assert "my/b" in keys and "my/a" not in keys


def test_broken_or_disabled_cache_falls_back(monkeypatch, tmp_path):
    monkeypatch.delenv("TRACKBRIDGE_NO_CACHE", raising=False)
    _fresh_load(monkeypatch, tmp_path)
    (f,) = tmp_path.glob("registry-*.pickle")
    f.write_bytes(b"\x80\x04not a pickle")                  # a partial or foreign file
    reg = _fresh_load(monkeypatch, tmp_path)
    assert "trl" in reg.frameworks
    monkeypatch.setenv("TRACKBRIDGE_NO_CACHE", "1")
    other = tmp_path / "off"
    reg = _fresh_load(monkeypatch, other)
    assert "trl" in reg.frameworks and not other.exists()


def test_compiled_cache_keeps_only_the_most_recently_used(monkeypatch, tmp_path):
    """Each edited user file or new release compiles a new registry; the folder does not grow without bound."""
    import os

    from trackbridge.schema.cache import KEEP
    monkeypatch.delenv("TRACKBRIDGE_NO_CACHE", raising=False)
    _fresh_load(monkeypatch, tmp_path)
    (mine,) = tmp_path.glob("registry-*.pickle")
    stale = []
    for i in range(KEEP + 5):                                # older entries, oldest first
        f = tmp_path / f"registry-{i:032d}.pickle"
        f.write_bytes(b"old")
        os.utime(f, (1_000_000 + i, 1_000_000 + i))
        stale.append(f)
    os.utime(mine, (0, 0))                                   # least recent of all, until it is read again
    other = tmp_path / "notes.txt"
    other.write_text("not a registry")
    _fresh_load(monkeypatch, tmp_path)                       # a read marks the file used
    user = tmp_path / "mine.yaml"
    user.write_text("format: trackbridge.mapping/1\nframework: verl\nentries:\n"
                    "  - {key: my/a, canonical: reward/score/mean, reverse: false, source: my.py@v1}\n")
    _fresh_load(monkeypatch, tmp_path, [user])               # a new file written: the folder is pruned
    left = set(tmp_path.glob("registry-*.pickle"))
    assert len(left) == KEEP and mine in left and other.exists()
    assert left - {mine} - set(stale) != set()              # the one just written
    assert set(stale[-(KEEP - 2):]) <= left and not set(stale[:-(KEEP - 2)]) & left


def test_when_in_matches_any_of_its_values(tmp_path):
    """``when: {config: {KEY: {in: [a, b]}}}``: the entry applies when the config value is one of the list."""
    from trackbridge.pipeline import Translator
    fw = FW.replace("  - {key: ent, canonical: policy/entropy, source: toy.py@v0.1}\n",
                    "  - {key: ent, canonical: policy/entropy, source: toy.py@v0.1,"
                    " when: {config: {m: {in: [a, a+]}}}}\n"
                    "  - {key: ent, canonical: time/step, source: toy.py@v0.1, reverse: false}\n")
    reg = _load(tmp_path, fw)
    (cond,) = [e for e in reg.frameworks["toy"].entries if e.when]
    assert cond.condition_holds({"m": "a+"}) is True and cond.condition_holds({"m": "b"}) is False
    assert cond.condition_holds({}) is None
    for m, want in (("a", "policy/entropy"), ("a+", "policy/entropy"), ("b", "time/step")):
        out = Translator("toy@v0.3", "canonical", registry=reg, config={"m": m}).translate({"ent": 1.0}).metrics
        assert out == {want: 1.0}, (m, out)
