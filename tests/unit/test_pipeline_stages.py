"""The pipeline's stages (trackbridge/pipeline/stages.py), each ``(record, report) -> record`` with hand
expectations: Translate, Step, Derive, Select, Rename, and a Pipeline that is their composition. The logger runs the
same stage classes (logger/dispatch.py); tests/trackers/test_one_pipeline.py checks every path gives the same
records. Facts used (shipped mappings): TRL DPO ``rewards/chosen`` / ``rewards/rejected`` are
``preference/reward/chosen`` / ``rejected``, and mappings/derived.yaml derives ``preference/reward/margin`` as their
difference."""
from __future__ import annotations

import pytest

from trackbridge.pipeline import Pipeline, Translation, Translator, names_translator
from trackbridge.pipeline.stages import Derive, Rename, Select, Step, Translate
from trackbridge.record import Record

DPO = {"rewards/chosen": 0.75, "rewards/rejected": 0.25, "mystery": 7}


@pytest.fixture()
def tr():
    return Translator("trl/dpo", "canonical", config={"logging_steps": 1})


def test_translate_gives_canonical_names_and_passes_an_unknown_key_through(tr):
    rep = Translation()
    out = Translate(tr)(Record(5, 1.5, dict(DPO), ["rewards/chosen"]), rep)
    assert out.metrics == {"preference/reward/chosen": 0.75, "preference/reward/rejected": 0.25, "mystery": 7}
    assert (out.step, out.wall_time, out.axis) == (5, 1.5, None)
    assert out.derived == ["preference/reward/chosen"]          # a derived mark follows its value's new name
    assert rep.unmapped == ["mystery"] and rep.mapped == 2
    assert rep.renamed == {"rewards/chosen": "preference/reward/chosen",
                           "rewards/rejected": "preference/reward/rejected"}
    assert rep.source == "trl/dpo" and rep.metrics is out.metrics


def test_step_numbers_records_logged_without_one():
    said = []
    step = Step(3, lambda key, text: said.append((key, text)))
    rep = Translation()
    assert step(Record(None, 0.0, {"a": 1}), rep).step == 3
    assert step(Record(None, 0.0, {"a": 1}), rep).step == 4
    assert step(Record(10, 0.0, {"a": 1}), rep).step == 10 and step.next == 11     # an explicit step moves it on
    assert step(Record(None, 0.0, {"progress/step": 40.0}), rep).step == 40 and step.next == 41
    assert step(Record(None, 0.0, {"progress/step": True}), rep).step == 41        # a bool is no step
    assert step(Record(None, 0.0, {"progress/step": float("nan")}), rep).step == 42
    assert said == []
    assert step(Record(None, 0.0, {"progress/step": 2.0 ** 60}), rep).step == 43
    assert [k for k, _ in said] == ["step-axis"] and "outside 0 .. 2**53 - 1" in said[0][1]
    # a record on an x axis of its own keeps its step and leaves the run's counter alone
    assert step(Record(1000, 0.0, {"rollout/x": 1}, axis="rollout/step"), rep).step == 1000 and step.next == 44
    rec = Record(44, 0.0, {"a": 1})
    assert step(rec, rep) is rec                                                    # nothing to do: the same record


@pytest.mark.parametrize("canonical", [True, False])
def test_derive_adds_the_margin_marked_and_never_over_a_logged_value(tr, canonical):
    """With ``canonical`` the Translate stage keeps the values by canonical name for Derive (the pipeline's way);
    without, Derive reads them back from the record's names: the same values either way."""
    rep = Translation()
    rec = Translate(tr, canonical=canonical)(Record(1, 0.0, dict(DPO)), rep)
    assert (rep.canonical is not None) is canonical
    if canonical:
        assert rep.canonical == {"preference/reward/chosen": 0.75, "preference/reward/rejected": 0.25, "mystery": 7}
    mine = Record(rec.step, rec.wall_time, dict(rec.metrics), rec.derived)     # a dict that is not the report's
    out = Derive(tr)(mine, rep)
    assert out.metrics["preference/reward/margin"] == pytest.approx(0.75 - 0.25)
    assert out.derived == ["preference/reward/margin"] and rep.derived == ["preference/reward/margin"]
    assert "preference/reward/margin" not in mine.metrics          # a caller's dict is left as it was
    rep = Translation()
    rec = Translate(tr, canonical=canonical)(Record(2, 0.0, {**DPO, "rewards/margins": 0.9}), rep)
    out = Derive(tr)(rec, rep)
    assert out.metrics["preference/reward/margin"] == 0.9 and out.derived == []    # the logged value wins


def test_select_keeps_the_names_matching_the_patterns_with_their_marks():
    sel = Select(["preference/*"])
    rec = Record(1, 0.0, {"preference/reward/margin": 0.5, "mystery": 7}, ["preference/reward/margin"])
    out = sel(rec, Translation())
    assert out.metrics == {"preference/reward/margin": 0.5} and out.derived == ["preference/reward/margin"]
    assert sel.chosen == {"preference/reward/margin": True, "mystery": False}
    only = Record(2, 0.0, {"preference/reward/chosen": 1.0})
    assert sel(only, Translation()) is only


def test_rename_gives_the_targets_names_and_its_own_bookkeeping():
    ren = Rename("trl/dpo", origin=lambda: "trl/dpo")
    assert ren.pipeline() is None                                  # built on the first record
    out = ren(Record(1, 0.0, {"preference/reward/chosen": 0.75, "preference/reward/margin": 0.5},
                     ["preference/reward/margin"]))
    assert out.metrics == {"rewards/chosen": 0.75, "rewards/margins": 0.5}
    assert out.derived == ["rewards/margins"]
    assert ren.pipeline().stats.records == 1
    assert isinstance(names_translator("trl/dpo"), Rename) and names_translator("canonical") is None


def test_a_pipeline_is_its_stages_composed():
    pipe = Pipeline("trl/dpo", "canonical", config={"logging_steps": 1}, select=["preference/*"])
    out = pipe.one(Record(1, 0.0, dict(DPO)))
    assert [type(s).__name__ for s in pipe.stages] == ["Translate", "Derive", "Select"]
    tr = Translator("trl/dpo", "canonical", config={"logging_steps": 1})
    rep = Translation()
    by_hand = Record(1, 0.0, dict(DPO))
    for stage in (Translate(tr, canonical=True), Derive(tr), Select(["preference/*"])):
        by_hand = stage(by_hand, rep)
    assert out == by_hand
    assert out.metrics == {"preference/reward/chosen": 0.75, "preference/reward/rejected": 0.25,
                           "preference/reward/margin": pytest.approx(0.5)}
    assert (pipe.stats.records, pipe.stats.points, pipe.stats.mapped) == (1, 3, 2)
    assert pipe.stats.unmapped == ["mystery"] and pipe.stats.derived == ["preference/reward/margin"]
    kept = Pipeline("keep", "canonical")
    rec = Record(1, 0.0, dict(DPO))
    assert kept.one(rec) == rec and kept.stages == [] and kept.stats.source == "kept as stored"
    assert Pipeline("trl/dpo", "canonical", derive=False).one(Record(1, 0.0, dict(DPO))).derived == []


def test_the_logger_pipeline_is_translate_step_derive_and_names_its_stages(tr):
    said = []
    pipe = Pipeline.live(tr, next_step=7, problem=lambda key, text: said.append(key))
    assert [type(s).__name__ for s in pipe.stages] == ["Translate", "Step", "Derive"]
    assert pipe.stage(Step).next == 7 and pipe.stage(Select) is None and pipe.stage(Translate).canonical
    out = pipe.one(Record(None, 0.0, dict(DPO)))
    assert out.step == 7 and out.derived == ["preference/reward/margin"]
    assert out.metrics["preference/reward/margin"] == pytest.approx(0.5)
    assert [type(s).__name__ for s in Pipeline.live(tr.fresh(), derive=False).stages] == ["Translate", "Step"]
    assert said == []


def test_translate_is_a_one_shot_pipeline_with_nothing_carried_to_the_next_call():
    """trackbridge.translate() gives what a new Pipeline gives for the one record (derived values included), and
    two calls with the same settings share no run state: the second has the first's notes, not twice them."""
    from trackbridge import translate

    res = translate(dict(DPO), source="trl/dpo", config={"logging_steps": 1}, derive=True)
    pipe = Pipeline("trl/dpo", "canonical", config={"logging_steps": 1})
    out = pipe.one(Record(None, None, dict(DPO)))
    assert res.metrics == out.metrics == {"preference/reward/chosen": 0.75, "preference/reward/rejected": 0.25,
                                          "mystery": 7, "preference/reward/margin": pytest.approx(0.5)}
    assert res.derived == pipe.stats.derived == ["preference/reward/margin"]
    assert res.unmapped == ["mystery"] and res.source == "trl/dpo"
    again = translate(dict(DPO), source="trl/dpo", config={"logging_steps": 1}, derive=True)
    assert again.notes == res.notes and again.metrics == res.metrics
    plain = translate(dict(DPO), source="trl/dpo", config={"logging_steps": 1})
    assert plain.derived == [] and "preference/reward/margin" not in plain.metrics
    with pytest.raises(TypeError, match="takes a dict of metric name -> value, not list"):
        translate([("rewards/chosen", 1.0)])
