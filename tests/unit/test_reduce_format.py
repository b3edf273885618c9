"""The reduction format (issue 20, docs/reductions.md and docs/mapping-format.md): an entry's `reduce:` (literals and
config switches), the file's `reductions:` profiles and `levels:`, config `default:`s, canonical metrics' reference
`reduce:`, and what the loader and `trackbridge mappings lint` say about them (file:line), including the
"reduction unstated" warning and the switch that turns it into an error."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from trackbridge.schema import reductions as R
from trackbridge.schema.loader import build_registry, load_registry, shipped_files
from trackbridge.schema.model import COMPUTED, EXACT
from trackbridge.schema.paths import mappings_dir
from trackbridge.schema.reductions import CountError, Switch, parse_count
from trackbridge.schema.yamlfile import MappingError, MappingErrors

CANON = textwrap.dedent("""\
    format: trackbridge.canonical/1
    schema_version: 1.1.0
    versions: {1.1.0: {}}
    config:
      kl_coef: {description: beta, unit: "1"}
    metrics:
      kl/ref/k3:
        description: k3 KL
        unit: nats/token
        estimator: k3
        reduce: {tokens: token_mean, snapshot: update}
      policy/entropy: {description: entropy, unit: nats/token,
                       reduce: {tokens: token_mean, snapshot: update, padding: excluded}}
      optim/lr: {description: lr, unit: "1", reduce: {stat: value, snapshot: after_scheduler_step}}
    """)

FW = textwrap.dedent("""\
    format: trackbridge.mapping/1
    framework: toy
    releases: [v0.1, v0.2, v0.3]
    trainers: {ppo: {kind: rl}, sft: {kind: sft}}
    config:
      - {key: algo.kl, canonical: kl_coef, source: toy.py@v0.1}
      - {key: data.batch, default: 1024}
      - {key: actor.mini, default: 256, source: toy.yaml@v0.1}
      - {key: actor.epochs, default: 1}
      - {key: actor.agg, default: token-mean}
      - {key: world, default: 8, trainers: [ppo]}
      - {key: world, default: 1, trainers: [sft]}
    levels:
      mini_batches: "data.batch / actor.mini * actor.epochs"
      processes: null
      window:
        - {count: "1", since: v0.3}
        - {count: null, trainers: [ppo]}
    reductions:
      worker: {tokens: token_mean, micro_batches: token_weighted, processes: all_reduce_mean, snapshot: update}
      worker_mean: {like: worker, mini_batches: mean}
      worker_max: {like: worker_mean, stat: max, micro_batches: max, counts: {mini_batches: "actor.epochs"}}
    entries:
      - key: kl
        canonical: kl/ref/k3
        reduce:
          like: worker_mean
          estimator: k3
          tokens: {config: actor.agg, map: {token-mean: token_mean, seq-mean-token-mean: seq_mean_token_mean},
                   other: seq_mean_token_sum}
        source: toy.py@v0.1
      - key: ent_max
        canonical: policy/entropy
        reduce: {like: worker_max}
        source: toy.py@v0.1
      - {key: lr, canonical: optim/lr, reduce: {stat: value, snapshot: after_scheduler_step}, source: toy.py@v0.1}
      - {key: legacy, canonical: policy/entropy, fidelity: exact, source: toy.py@v0.2, since: v0.2, reverse: false}
    """)


def _write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def _load(tmp_path, fw_text=FW, canon_text=CANON, **kw):
    return build_registry([_write(tmp_path, "canonical.yaml", canon_text), _write(tmp_path, "toy.yaml", fw_text)],
                          [], **kw)


def _errors(tmp_path, fw_text, canon_text=CANON) -> list[MappingError]:
    with pytest.raises(MappingError) as ei:
        _load(tmp_path, fw_text, canon_text)
    return ei.value.errors if isinstance(ei.value, MappingErrors) else [ei.value]


def _line(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


# ------------------------------------------------------------------------------------------------ what loads
def test_reduce_profiles_levels_and_defaults_compile(tmp_path):
    reg = _load(tmp_path)
    fw = reg.frameworks["toy"]
    kl = next(e for e in fw.entries if e.key == "kl")
    assert kl.fidelity == COMPUTED and not kl.exact and kl.reduce is not None
    assert kl.reduce.like == "worker_mean"
    # the profile's fields, then the entry's own (in the vocabulary's order)
    assert [k for k, _ in kl.reduce.fields] == ["tokens", "micro_batches", "mini_batches", "processes", "snapshot",
                                                "estimator"]
    assert kl.reduce.get("mini_batches") == "mean" and kl.reduce.get("estimator") == "k3"
    sw = kl.reduce.get("tokens")
    assert isinstance(sw, Switch) and sw.key == "actor.agg" and sw.default is R.NO_DEFAULT
    assert sw.pick("seq-mean-token-mean") == "seq_mean_token_mean" and sw.pick("weird") == "seq_mean_token_sum"
    assert kl.reduce.get("window") == "step" and kl.reduce.get("padding") == "excluded"   # defaults of left-out fields
    # a profile like a profile like a profile: the chain's fields and counts are inherited
    mx = next(e for e in fw.entries if e.key == "ent_max")
    assert mx.reduce.get("stat") == "max" and mx.reduce.get("micro_batches") == "max"
    assert mx.reduce.get("mini_batches") == "mean" and mx.reduce.get("processes") == "all_reduce_mean"
    assert mx.reduce.count_expr("mini_batches") == (True, "actor.epochs")
    # a legacy entry keeps its hand-written fidelity and is a warning (not an error) now, with file and line
    legacy = next(e for e in fw.entries if e.key == "legacy")
    assert legacy.fidelity == EXACT and legacy.reduce is None
    assert [(w.entry, w.line) for w in reg.warnings] == [("legacy", _line(FW, "key: legacy"))]
    assert "reduction unstated" in str(reg.warnings[0]) and str(reg.warnings[0]).startswith(str(tmp_path))
    # config defaults, per trainer
    assert fw.config_default("data.batch", None, 0, 2) == (True, 1024)
    assert fw.config_default("world", "sft", 0, 2) == (True, 1)
    assert fw.config_default("world", "ppo", 0, 2) == (True, 8)
    assert fw.config_default("algo.kl", None, 0, 2) == (False, None)
    assert [c.canonical for c in fw.config if c.key == "data.batch"] == [""]     # a default-only config entry
    # levels: an expression, null (unknown), and a list whose first applicable item counts
    assert fw.level_count("mini_batches", "ppo", 0, 2)[:2] == (True, "data.batch / actor.mini * actor.epochs")
    assert fw.level_count("processes", "ppo", 0, 2)[:2] == (True, None)
    assert fw.level_count("window", "ppo", 2, 2)[:2] == (True, "1")
    assert fw.level_count("window", "ppo", 0, 1)[:2] == (True, None)
    assert fw.level_count("window", "sft", 0, 1)[:2] == (False, None)
    assert fw.level_count("micro_batches", "ppo", 0, 2)[:2] == (False, None)
    # the canonical reference: literals, with the metric's estimator added
    canon = reg.canonical.metrics["kl/ref/k3"].reduce
    assert canon is not None and canon.get("estimator") == "k3" and canon.get("tokens") == "token_mean"


def test_the_registry_keeps_warnings_through_the_compiled_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACKBRIDGE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("TRACKBRIDGE_NO_CACHE", raising=False)
    user = _write(tmp_path, "user.yaml", FW.replace("framework: toy", "framework: toy2"))
    from trackbridge.schema import loader
    loader._load_cached.cache_clear()
    first = load_registry([user])
    loader._load_cached.cache_clear()
    again = load_registry([user])          # read back from the pickle
    mine = [(w.file, w.line, w.entry) for w in again.warnings if w.file == str(user)]
    assert mine == [(w.file, w.line, w.entry) for w in first.warnings if w.file == str(user)]
    assert mine and mine[0][2] == "legacy"
    loader._load_cached.cache_clear()


def test_require_reduction_turns_the_warning_into_an_error(tmp_path, monkeypatch):
    with pytest.raises(MappingError) as ei:
        _load(tmp_path, require_reduction=True)
    errs = ei.value.errors if isinstance(ei.value, MappingErrors) else [ei.value]
    assert [(e.entry, e.line) for e in errs] == [("legacy", _line(FW, "key: legacy"))]
    # the module switch the lead flips at the final merge does the same for every load (shipped and user files)
    monkeypatch.setattr(R, "REQUIRE_REDUCTION", True)
    with pytest.raises(MappingError, match="reduction unstated"):
        _load(tmp_path)


# ------------------------------------------------------------------------------------------------ what is refused
BAD = [
    ("reduce: {tokens: token_means}", "'token_means' is not a tokens value"),
    ("reduce: {tokenz: token_mean}", "unknown field 'tokenz' (did you mean 'tokens'?)"),
    ("reduce: {like: nosuch}", "like: 'nosuch' is not a profile"),
    ("reduce: {stat: std}", "needs `std: sample`"),
    ("reduce: {std: sample}", "goes with `stat: std`"),
    ("reduce: {tokens: {config: actor.agg}}", "needs `map:"),
    ("reduce: {tokens: {config: actor.agg, map: {token-mean: tokenmean}}}", "'tokenmean' is not a tokens value"),
    ("reduce: {tokens: {config: no.such.key, map: {a: token_mean}}}", "config switch on 'no.such.key': no default"),
    ("reduce: {counts: {mini_batches: 'actor.mini *'}}", "counts.mini_batches"),
    ("reduce: {counts: {epochs: '2'}}", "'epochs' is not a level"),
    ("reduce: {counts: {mini_batches: 'no_default_key'}}", "config key 'no_default_key' has no default"),
    ("reduce: {tokens: token_mean}\n    fidelity: exact", "fidelity: an entry that states `reduce:`"),
    ("reduce: {tokens: token_mean}\n    reason: because", "reason: an entry that states `reduce:`"),
]


@pytest.mark.parametrize("snippet, words", BAD, ids=[b[1][:40] for b in BAD])
def test_bad_reduce_is_an_error_naming_file_and_line(tmp_path, snippet, words):
    text = FW + (f"  - key: bad\n    canonical: policy/entropy\n    reverse: false\n    {snippet}\n"
                 "    source: toy.py@v0.1\n")
    errs = _errors(tmp_path, text)
    hits = [e for e in errs if words in str(e)]
    assert hits, [str(e) for e in errs]
    lines = text.splitlines()
    # the line of the legacy field when that is the problem, else the line of `reduce:`
    first = snippet.split("\n")[-1].strip().split(":")[0] + ":" if "\n" in snippet else "reduce:"
    want = max(i for i, ln in enumerate(lines, 1) if ln.strip().startswith(first))
    assert hits[0].file.endswith("toy.yaml") and hits[0].line == want, str(hits[0])
    assert hits[0].entry == "bad"


@pytest.mark.parametrize("levels, words", [
    ("levels: {epochs: '2'}", "'epochs' is not a level"),
    ("levels: {mini_batches: 'data.batch /'}", "expected a number"),
    ("levels: {mini_batches: 'undeclared.key * 2'}", "config key 'undeclared.key' has no default"),
    ("levels: {mini_batches: [{count: '2', since: v9}]}", "release 'v9' is not in"),
    ("levels: {mini_batches: [{count: '2', trainers: [nosuch]}]}", "unknown trainer 'nosuch'"),
])
def test_bad_levels_name_file_and_line(tmp_path, levels, words):
    text = FW.replace("levels:\n", f"{levels}\nold_levels:\n", 1)
    text = text.replace("old_levels:\n  mini_batches: \"data.batch / actor.mini * actor.epochs\"\n  processes: null\n"
                        "  window:\n    - {count: \"1\", since: v0.3}\n    - {count: null, trainers: [ppo]}\n", "")
    assert "old_levels" not in text
    errs = _errors(tmp_path, text)
    hits = [e for e in errs if words in str(e)]
    assert hits, [str(e) for e in errs]
    assert hits[0].file.endswith("toy.yaml") and hits[0].line == _line(text, "levels:"), str(hits[0])


def test_profile_cycles_and_canonical_switches_are_refused(tmp_path):
    text = FW.replace("  worker: {tokens: token_mean,",
                      "  a: {like: b}\n  b: {like: a}\n  worker: {tokens: token_mean,")
    errs = _errors(tmp_path, text)
    assert any("in a cycle" in str(e) and e.line == _line(text, "  a: {like: b}") for e in errs), errs
    canon = CANON.replace("reduce: {stat: value, snapshot: after_scheduler_step}",
                          "reduce: {stat: {config: x, map: {a: value}}}")
    errs = _errors(tmp_path, FW, canon)
    assert any("a canonical reference states a literal" in str(e) and e.file.endswith("canonical.yaml")
               and e.line == _line(canon, "optim/lr") for e in errs), errs
    canon = CANON.replace("reduce: {tokens: token_mean, snapshot: update}\n",
                          "reduce: {tokens: token_mean, snapshot: update, estimator: k1}\n")
    errs = _errors(tmp_path, FW, canon)
    assert any("disagrees with the metric's estimator 'k3'" in str(e) for e in errs), errs


def test_a_config_entry_needs_canonical_or_default(tmp_path):
    text = FW.replace("  - {key: actor.epochs, default: 1}\n", "  - {key: actor.epochs}\n")
    errs = _errors(tmp_path, text)
    assert any(e.line == _line(text, "{key: actor.epochs}") for e in errs), [str(e) for e in errs]


def test_a_default_may_be_another_config_keys_value(tmp_path):
    """GRPO's steps_per_generation defaults to gradient_accumulation_steps (``default_key:``): the run config's value
    of that key, else its own default; a count reading it follows it."""
    from trackbridge.translate.fidelity import resolve
    text = FW.replace("  - {key: actor.epochs, default: 1}\n",
                      "  - {key: actor.epochs, default_key: actor.passes}\n  - {key: actor.passes, default: 1}\n")
    reg = _load(tmp_path, text)
    fw = reg.frameworks["toy"]
    assert fw.config_default("actor.epochs", None, 0, 2) == (True, 1)
    assert fw.config_default("actor.epochs", None, 0, 2, {"actor.passes": 3}) == (True, 3)
    kl = next(e for e in fw.entries if e.key == "kl")
    r = resolve(kl, fw, None, 2, 2, {"actor.passes": 2})
    assert r.counts["mini_batches"].n == 8.0 and dict(r.defaults)["actor.epochs"] == 2, r.counts
    assert resolve(kl, fw, None, 2, 2, {"actor.passes": 2, "actor.epochs": 1}).counts["mini_batches"].n == 4.0
    # refused: both, a loop, a key whose chain ends without a default
    for bad, words in (("{key: actor.epochs, default: 1, default_key: actor.passes}", "not both"),
                       ("{key: actor.epochs, default_key: actor.epochs}", "another run config key"),
                       ("{key: actor.epochs, default_key: nowhere}", "has no default of its own")):
        errs = _errors(tmp_path, FW.replace("{key: actor.epochs, default: 1}", bad))
        assert any(words in str(e) and e.line == _line(FW, "{key: actor.epochs, default: 1}") for e in errs), \
            [str(e) for e in errs]
    loop = FW.replace("  - {key: actor.epochs, default: 1}\n",
                      "  - {key: actor.epochs, default_key: a.b}\n  - {key: a.b, default_key: actor.epochs}\n")
    assert any("default_key loops (actor.epochs -> a.b -> actor.epochs)" in str(e) for e in _errors(tmp_path, loop))


# ------------------------------------------------------------------------------------------------ counts
@pytest.mark.parametrize("text, config, want", [
    ("data.batch / actor.mini * actor.epochs", {"data.batch": 1024, "actor.mini": 256, "actor.epochs": 2}, 8.0),
    ("max(1, a // b)", {"a": 7, "b": 2}, 3.0),
    ("ceil(a / b) + floor(0.5)", {"a": 7, "b": 2}, 4.0),
    ("-(a - 3) * 2", {"a": 1}, 4.0),
    ("a / b", {"a": 1, "b": 0}, None),              # no count, never a crash
    ("a * 2", {}, None),                            # a key without a value: unknown
    ("my-key.x * 2", {"my-key.x": 3}, 6.0),         # '-' inside a key belongs to it
])
def test_count_expressions(text, config, want):
    assert parse_count(text).evaluate(lambda k: config.get(k)) == want


@pytest.mark.parametrize("text", ["a +", "(a", "a b", "__import__", "f(a)", "max()", "ceil(1, 2)", "a ** 2", "1 %"])
def test_bad_count_expressions(text):
    with pytest.raises(CountError):
        parse_count(text)


def test_config_values_from_trackers_compare_as_the_mapped_type():
    sw = Switch("k", ((True, "included"), (1, "excluded"), (None, "none"), ("x", "included")))
    assert sw.pick("True") == "included" and sw.pick("1") == "excluded" and sw.pick(1.0) == "excluded"
    assert sw.pick("null") == "none" and sw.pick(None) == "none" and sw.pick("x") == "included"
    assert sw.pick("y") is None and sw.pick(True) == "included" and sw.pick([1]) is None


# ------------------------------------------------------------------------------------------------ the schemas
def test_the_json_schemas_spell_the_vocabulary_of_the_loader():
    for name in ("framework", "canonical"):
        schema = json.loads((mappings_dir() / "schemas" / f"{name}.schema.json").read_text())
        for field, values in R.FIELDS.items():
            d = schema["$defs"][f"reduce_{field}"]
            enum = d["enum"] if "enum" in d else d["anyOf"][0]["enum"]
            assert enum == list(values), (name, field)
        assert set(schema["$defs"]["reduce"]["properties"]) - {"like", "counts"} == set(R.FIELDS)
    fw = json.loads((mappings_dir() / "schemas" / "framework.schema.json").read_text())
    assert list(fw["properties"]["levels"]["properties"]) == list(R.LEVELS)


def test_jsonschema_agrees_on_reduce(tmp_path):
    jsonschema = pytest.importorskip("jsonschema")
    from trackbridge.schema.jsonschema import load_schema, validate
    from trackbridge.schema.yamlfile import load_yaml
    schema = load_schema("framework")
    good = load_yaml(_write(tmp_path, "toy.yaml", FW))
    assert validate(good, schema, file="toy.yaml") == []
    assert list(jsonschema.Draft202012Validator(schema).iter_errors(good)) == []
    bad = load_yaml(_write(tmp_path, "bad.yaml", FW.replace("{stat: value,", "{stat: values,")))
    assert validate(bad, schema, file="bad.yaml") and list(jsonschema.Draft202012Validator(schema).iter_errors(bad))


# ------------------------------------------------------------------------------------------------ the lint
def test_lint_reports_unstated_entries_per_file_and_each_and_fails_when_required(tmp_path):
    user = _write(tmp_path, "user.yaml", FW.replace("framework: toy", "framework: toyuser"))
    run = [sys.executable, "-m", "trackbridge", "mappings", "lint", str(user)]
    out = subprocess.run(run, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert f"warning: {user}: 1 reduction unstated (lines {_line(FW, 'key: legacy')})" in out.stderr
    out = subprocess.run([*run, "--unstated"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and f"{user}:{_line(FW, 'key: legacy')}: legacy: reduction unstated" in out.stderr
    out = subprocess.run([*run, "--require-reduction"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and f"{user}:{_line(FW, 'key: legacy')}: legacy: reduction unstated" in out.stderr
    assert "Traceback" not in out.stderr


def test_lint_of_a_shipped_file_named_on_the_command_line_checks_that_file(tmp_path):
    """``mappings lint --require-reduction mappings/openrlhf.yaml``: the shipped file, loaded once (it overlapped
    itself entry by entry before), and the requirement applies to the files named (is my file done?); a copy of it
    elsewhere is another file, which does overlap the shipped one."""
    from trackbridge.schema.loader import user_files
    shipped = [str(p) for p in shipped_files()]
    openrlhf = str(mappings_dir() / "openrlhf.yaml")
    other_spelling = str(mappings_dir() / ".." / mappings_dir().name / "openrlhf.yaml")
    assert user_files([openrlhf, other_spelling], shipped) == []
    assert user_files([str(tmp_path / "a.yaml"), str(tmp_path / "a.yaml")], shipped) == [str(tmp_path / "a.yaml")]
    run = [sys.executable, "-m", "trackbridge", "mappings", "lint", "--require-reduction", openrlhf]
    out = subprocess.run(run, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "overlap" not in out.stderr and "openrlhf.yaml" not in out.stderr, out.stderr[-2000:]
    # a file of the same framework at another path is a user file: its entries collide with the shipped ones
    copy = _write(tmp_path, "openrlhf-copy.yaml", Path(openrlhf).read_text())
    out = subprocess.run([*run[:-1], str(copy)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and str(copy) in out.stderr
    # the requirement is the named files': another file's unstated entries stay warnings
    user = _write(tmp_path, "user.yaml", FW.replace("framework: toy", "framework: toyuser").replace(
        "  - {key: legacy, canonical: policy/entropy, fidelity: exact, source: toy.py@v0.2, since: v0.2, "
        "reverse: false}\n", ""))
    out = subprocess.run([*run[:-1], str(user)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]


def test_shipped_files_load_with_the_new_format():
    reg = build_registry(shipped_files(), [])
    assert reg.canonical.metrics and all(fw.entries for fw in reg.frameworks.values())
