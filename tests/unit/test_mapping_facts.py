"""The facts that moved from Python into the mapping files (issue 13): splits, axes, presets, look-alike pairs and
TRL's trainer classes; the JSON Schemas of canonical.yaml and the framework files, used by the loader."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from trackbridge.schema import facts
from trackbridge.schema.jsonschema import load_schema, validate
from trackbridge.schema.loader import build_registry, load_registry, shipped_files
from trackbridge.schema.model import STEP_AXIS
from trackbridge.schema.yamlfile import MappingError, MappingErrors, load_yaml

from _support import ROOT

MAPPINGS = ROOT / "mappings"
FRAMEWORKS = ("trl", "verl", "openrlhf")


def _errors(exc: MappingError) -> list[MappingError]:
    return exc.errors if isinstance(exc, MappingErrors) else [exc]


@pytest.mark.parametrize("schema, name", [("canonical", "canonical"), *(("framework", f) for f in FRAMEWORKS)])
def test_shipped_files_follow_their_json_schema(schema, name):
    jsonschema = pytest.importorskip("jsonschema")
    doc = load_yaml(MAPPINGS / f"{name}.yaml")
    with open(MAPPINGS / "schemas" / f"{schema}.schema.json", encoding="utf-8") as fh:
        raw = json.load(fh)
    jsonschema.Draft202012Validator.check_schema(raw)
    assert [e.message for e in jsonschema.Draft202012Validator(raw).iter_errors(json.loads(json.dumps(doc)))] == []
    assert validate(doc, load_schema(schema), file=name) == []        # the built-in validator agrees


def test_the_facts_are_the_canonical_schemas():
    canon = load_registry().canonical
    assert facts.SPLITS == canon.splits and facts.SPLIT_PREFIXES == ("eval/", "test/")
    assert canon.splits.default == "train" and canon.splits.of_raw("eval_loss") == "eval"
    assert canon.splits.of_raw("train/loss") == "train" and canon.splits.of_raw("loss") == "train"
    assert canon.splits.split_canonical("test/loss/total") == ("test", "loss/total")
    assert canon.splits.split_canonical("evaluation/x") == (None, "evaluation/x")
    assert STEP_AXIS == canon.step_axis == facts.AXES["step"].metric == "progress/step"
    assert list(facts.AXES) == list(canon.axes) == ["step", "samples", "tokens", "time"]
    assert facts.PRESETS == canon.presets and facts.LOOK_ALIKE == canon.look_alike
    for la in canon.look_alike:
        assert canon.find(la.a) is not None and canon.find(la.b) is not None and la.why


def test_the_code_reads_the_facts():
    from trackbridge.compare import align, presets
    from trackbridge.derive import SPLIT_PREFIXES
    from trackbridge.derive.engine import STEP_NAME
    from trackbridge.logger import STEP_AXIS as LOGGER_STEP
    from trackbridge.tracking.source import split_of
    canon = load_registry().canonical
    assert presets.PRESETS == {n: list(p.metrics) for n, p in canon.presets.items()}
    assert presets.LOOK_ALIKES == [(la.a, la.b, la.why) for la in canon.look_alike]
    assert align.X_KINDS == tuple(canon.axes) and align.COUNTERS == {"samples": "progress/samples",
                                                                     "tokens": "progress/tokens"}
    assert align.PER_STEP == {"tokens": "perf/tokens_per_step"}
    assert SPLIT_PREFIXES == canon.splits.prefixes and STEP_NAME == LOGGER_STEP == canon.step_axis
    assert [split_of(n) for n in ("eval/loss", "eval_loss", "test_x", "train/loss", "loss", "epoch")] == \
        ["eval", "eval", "test", "train", "train", None]


def test_trl_trainer_classes():
    trl = load_registry().framework("trl")
    assert trl.trainer_of_class("GRPOTrainer") == "grpo" and trl.trainer_of_class("UnslothGRPOTrainer") == "grpo"
    assert trl.trainer_of_class("PPOTrainer") == "ppo" and trl.trainer_of_class("PPOv2Trainer") == "ppo"
    assert trl.trainer_of_class("PPOTrainer", callbacks=False) == "ppo_legacy"
    assert trl.trainer_of_class("DDPOTrainer", callbacks=False) == "ddpo" == trl.trainer_of_class("AlignPropTrainer")
    assert trl.trainer_of_class("Trainer") is None
    listed = [c for spec in trl.trainers.values() for c in spec.get("classes") or ()]
    assert len(listed) == 38 and len(set(listed)) == 37          # PPOTrainer twice: ppo_legacy and ppo


def _shipped_with(tmp_path: Path, name: str, edit) -> list[Path]:
    files = []
    for p in shipped_files():
        if p.name == name:
            text = p.read_text(encoding="utf-8")
            new = edit(text)
            assert new != text
            p = tmp_path / p.name
            p.write_text(new, encoding="utf-8")
        files.append(p)
    return files


@pytest.mark.parametrize("name, edit, line_text, needle", [
    ("canonical.yaml", lambda t: t.replace('  eval: {prefix: "eval/",', '  eval: {prefx: "eval/",', 1),
     '  eval: {prefx: "eval/",', "unknown field 'prefx'"),
    ("canonical.yaml", lambda t: t.replace("  time: {label:", "  time: {lable:", 1), "  time: {lable:",
     "unknown field 'lable'"),
    ("canonical.yaml", lambda t: t.replace("  step: {metric: progress/step,", "  step: {metric: progress/epoch,", 1),
     "  step: {metric: progress/epoch,", "the step axis's metric is 'progress/step'"),
    ("canonical.yaml", lambda t: t.replace("      - kl/ref/k3\n", "      - kl/ref/k4\n", 1), "  stability:",
     "'kl/ref/k4' is not a canonical name"),
    ("canonical.yaml", lambda t: t.replace("  - names: [kl/ref/k3, kl/old_policy/k1]",
                                           "  - names: [kl/ref/k3, kl/old_policy/k9]", 1),
     "  - names: [kl/ref/k3, kl/old_policy/k9]", "'kl/old_policy/k9' is not a canonical name"),
    ("canonical.yaml", lambda t: t.replace('  test: {prefix: "test/",', '  test: {default: true, prefix: "test/",', 1),
     "splits:", "exactly one split is the default"),
    ("trl.yaml", lambda t: t.replace("classes: [RLOOTrainer]}", "classes: [RLOOTrainer, GRPOTrainer]}", 1),
     None, "class 'GRPOTrainer' is listed by trainers"),
    ("trl.yaml", lambda t: t.replace("classes: [DPOTrainer]}", "classes: DPOTrainer}", 1), "  dpo: {",
     "must be a list"),
    ("openrlhf.yaml", lambda t: t.replace('  - {prefix: "eval/", split: eval}', '  - {prefix: "eval/", split: dev}', 1),
     '  - {prefix: "eval/", split: dev}', "(the splits of canonical.yaml)"),
])
def test_structural_and_semantic_errors_name_file_and_line(tmp_path, name, edit, line_text, needle):
    files = _shipped_with(tmp_path, name, edit)
    with pytest.raises(MappingError) as info:
        build_registry(files, [])
    hit = [e for e in _errors(info.value) if needle in str(e)]
    assert hit, [str(e) for e in _errors(info.value)]
    assert hit[0].file == str(tmp_path / name)
    if line_text is not None:
        lines = (tmp_path / name).read_text(encoding="utf-8").splitlines()
        assert lines[hit[0].line - 1].startswith(line_text), (hit[0].line, lines[hit[0].line - 1])


def test_main_only_sections_in_an_extension_are_refused(tmp_path):
    ext = tmp_path / "mine.yaml"
    ext.write_text("format: trackbridge.canonical/1\nsplits:\n  dev: {prefix: dev/}\nmetrics:\n"
                   "  my/metric: {description: mine, unit: \"1\"}\n", encoding="utf-8")
    with pytest.raises(MappingError) as info:
        build_registry(shipped_files(), [str(ext)])
    assert any("`splits` is declared by the main canonical file" in str(e) and e.line == 2
               for e in _errors(info.value)), str(info.value)


def test_shipped_files_cite_no_path_outside_the_repository():
    """What ships (the package and the mappings) cites framework files as path@release, never a local path."""
    import re
    outside = re.compile(r"(\.\./)+shared|(?<![\w.])/(work|home|Users|mnt)/|~/(?!\.cache)")
    found = []
    for base in (ROOT / "trackbridge", ROOT / "mappings"):
        for path in sorted(base.rglob("*")):
            if path.suffix not in (".py", ".yaml", ".json", ".md", ".txt") or "__pycache__" in path.parts:
                continue
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if outside.search(line):
                    found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert found == []
