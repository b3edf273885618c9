"""How a stated reduction is normalised before two are compared (trackbridge/translate/fidelity.py, docs/reductions.md
"Fidelity, computed"): OpenRLHF-style globally normalised token sums (``token_sum_step_norm``, ``token_sum_dp_norm``)
that are a token mean under some levels and counts only; ``processes: token_weighted / seq_weighted``; the nesting
of the levels (a level pools only items that were pooled themselves, the processes innermost); ``window: last`` and
``window: pooled``; a canonical reference that leaves ``tokens`` to each framework (``any``); an evaluation's values
(a key under the eval split). The framework is made up (tests/data/reductions/delta.yaml)."""
from __future__ import annotations

import pytest

from trackbridge.schema.loader import load_registry
from trackbridge.translate.fidelity import judge, reference, resolve

from _support import DATA

FILES = [str(DATA / "reductions" / n) for n in ("canonical-extra.yaml", "delta.yaml")]


@pytest.fixture(scope="module")
def reg():
    return load_registry(FILES)


def res(reg, key, config=None, split=None):
    fw = reg.frameworks["delta"]
    entry = next(e for e in fw.entries if e.key == key)
    return resolve(entry, fw, None, 0, 0, config or {}, split=split)


def ref(reg, name, split=None):
    return reference(reg.canonical.metrics[name], split)


def tags(why):
    return {t.split("]")[0] for t in why.split("[")[1:]} if why else set()


ONE = {"ga": 1, "gpus": 1}


# ------------------------------------------------------------------------------------------ step-normalised sums
def test_step_normalised_sums_merged_by_tokens_are_a_token_mean_only_with_one_micro_batch_and_one_rank(reg):
    r = res(reg, "actor_loss", ONE)
    assert r.fields["tokens"] == "token_mean" and r.fields["micro_batches"] == r.fields["processes"] == "none"
    assert judge(r, ref(reg, "toy/tok")) is None
    for cfg in ({"ga": 2, "gpus": 1}, {"ga": 1, "gpus": 2}, {}):
        r = res(reg, "actor_loss", cfg)
        assert r.fields["tokens"] == "token_sum_step_norm", cfg
        why = judge(r, ref(reg, "toy/tok"))
        assert "tokens" in tags(why), (cfg, why)
        assert "is each micro-batch's token sum over the optimizer step's tokens per rank and micro-batch (not a " \
               "token mean)" in why


def test_step_normalised_sums_averaged_unweighted_are_the_steps_token_mean_at_any_count(reg):
    for cfg in (ONE, {"ga": 8, "gpus": 16}, {}):
        r = res(reg, "critic_loss", cfg)
        assert (r.fields["tokens"], r.fields["micro_batches"], r.fields["processes"]) == ("token_mean", "none", "none")
        assert judge(r, ref(reg, "toy/tok")) is None, cfg


def test_the_last_step_normalised_micro_batch_is_a_token_mean_only_without_accumulation(reg):
    r = res(reg, "sft_loss", {"ga": 1, "gpus": 8})
    assert judge(r, ref(reg, "toy/tok")) is None
    r = res(reg, "sft_loss", {"ga": 4, "gpus": 8})
    assert r.fields["tokens"] == "token_sum_step_norm" and r.fields["micro_batches"] == "last"
    assert tags(judge(r, ref(reg, "toy/tok"))) == {"tokens", "micro_batches"}


def test_rank_normalised_sums_are_each_micro_batchs_token_mean_averaged_over_the_ranks(reg):
    # merged by tokens: a token mean on one rank only (then the micro-batches pool)
    assert judge(res(reg, "dp_loss", {"ga": 4, "gpus": 1}), ref(reg, "toy/tok")) is None
    r = res(reg, "dp_loss", {"ga": 4, "gpus": 2})
    assert r.fields["tokens"] == "token_sum_dp_norm"
    assert "is each micro-batch's token sum over that micro-batch's tokens per rank" in judge(r, ref(reg, "toy/tok"))
    # averaged unweighted over the ranks: micro-batch u's token mean over the ranks; the micro-batches as stated
    r = res(reg, "dp_critic_loss", {"ga": 4, "gpus": 8})
    assert (r.fields["tokens"], r.fields["processes"], r.fields["micro_batches"]) == ("token_mean", "none", "mean")
    assert tags(judge(r, ref(reg, "toy/tok"))) == {"micro_batches"}
    assert judge(res(reg, "dp_critic_loss", {"ga": 1, "gpus": 8}), ref(reg, "toy/tok")) is None


# ------------------------------------------------------------------------------------------ processes weights
def test_processes_weighted_by_tokens_or_sequences(reg):
    # per-sequence means merged by tokens over the ranks: not pooled (the sequences are weighted by their length)
    r = res(reg, "seq_loss", {"ga": 1, "gpus": 2})
    assert r.fields["processes"] == "token_weighted"
    why = judge(r, res(reg, "seq_loss_by_seqs", {"ga": 1, "gpus": 2}))
    assert tags(why) == {"processes"} and "weights its 2 processes by tokens (processes = gpus = 2)" in why, why
    # merged by sequences: pooled, the identity
    r = res(reg, "seq_loss_by_seqs", {"ga": 2, "gpus": 2})
    assert r.fields["processes"] == r.fields["micro_batches"] == "none"
    # one rank: either weight is the identity
    assert res(reg, "seq_loss", {"ga": 1, "gpus": 1}).fields["processes"] == "none"


def test_a_level_pools_only_items_pooled_themselves(reg):
    # each micro-batch's value is an unweighted mean of the ranks' token means: weighting those by tokens does not
    # pool the micro-batches (it did before the nesting was modelled)
    r = res(reg, "monitor", {"ga": 2, "gpus": 2})
    assert r.fields["processes"] == "all_reduce_mean" and r.fields["micro_batches"] == "token_weighted"
    assert tags(judge(r, ref(reg, "toy/tok"))) == {"micro_batches", "processes"}
    # on one rank the micro-batches' token-weighted merge is the pooled token mean
    r = res(reg, "monitor", {"ga": 2, "gpus": 1})
    assert r.fields["micro_batches"] == r.fields["processes"] == "none"
    assert judge(r, ref(reg, "toy/tok")) is None


# ------------------------------------------------------------------------------------------ the logging window
def test_window_pooled_is_never_one_steps_value_and_last_is(reg):
    r = res(reg, "score")
    assert r.fields["window"] == "pooled"
    why = judge(r, ref(reg, "toy/score"))
    assert tags(why) == {"window"}
    assert "delta 'score' pools what the 5 steps since the last log computed (weighted by their items) (window = " \
           "logging_steps = 5 (the default))" in why
    # one step per row: the identity
    assert judge(res(reg, "score", {"logging_steps": 1}), ref(reg, "toy/score")) is None
    last = res(reg, "score_step", {"ga": 1})
    assert last.fields["window"] == "step" and judge(last, ref(reg, "toy/score")) is None


# ------------------------------------------------------------------------------------------ a reference's `any`
def test_a_reference_that_leaves_tokens_to_the_framework(reg):
    pair, lm = res(reg, "pair_loss"), res(reg, "lm_loss")
    assert ref(reg, "toy/loss").fields["tokens"] == "any"
    assert judge(pair, ref(reg, "toy/loss")) is None and judge(lm, ref(reg, "toy/loss")) is None
    # framework to framework the populations still differ
    assert judge(pair, lm) == ("delta 'pair_loss' is over per-sequence values; delta 'lm_loss' is the token mean "
                               "[tokens]")
    # the other fields are the reference's
    from dataclasses import replace
    fw = reg.frameworks["delta"]
    e = next(e for e in fw.entries if e.key == "pair_loss")
    rolled = resolve(replace(e, reduce=e.reduce.with_fields(snapshot="rollout")), fw, None, 0, 0, {})
    assert tags(judge(rolled, ref(reg, "toy/loss"))) == {"snapshot"}


def test_any_is_for_canonical_references_only(tmp_path):
    from trackbridge.schema.reductions import parse_reduce
    red, problems = parse_reduce({"tokens": "any"}, {}, literal_only=True)
    assert not problems and red.get("tokens") == "any"
    red, problems = parse_reduce({"tokens": "any"}, {})
    assert problems and "'any' is not a tokens value" in problems[0]
    red, problems = parse_reduce({"stat": "any"}, {}, literal_only=True)
    assert problems


# ------------------------------------------------------------------------------------------ evaluation values
def test_an_evaluations_values_are_taken_at_evaluation_time_once_per_evaluation(reg):
    train = res(reg, "score_step", {"ga": 1})
    assert train.fields["snapshot"] == "rollout"
    ev = res(reg, "score_step", {"ga": 1}, split="eval")
    assert ev.fields["snapshot"] == "eval" and ev.fields["window"] == "step"
    assert ref(reg, "toy/score", "eval").fields["snapshot"] == "eval"
    assert ref(reg, "toy/score", "eval").who == "canonical 'eval/toy/score'"
    # the training run's gradient accumulation does not count an evaluation's batches: the unweighted mean of its
    # batches stays (exact in training rows at ga 1)
    assert judge(train, ref(reg, "toy/score")) is None
    why = judge(ev, ref(reg, "toy/score", "eval"))
    assert tags(why) == {"micro_batches"}, why
    assert "averages its micro-batches unweighted (an evaluation's batches are not counted by the run config)" in why
    assert "ga" not in dict(ev.defaults)
    # a value computed over the whole evaluation is exact against the evaluation's reference
    assert judge(res(reg, "score", split="eval"), ref(reg, "toy/score", "eval")) is None


# ------------------------------------------------------------------------------------------ `when` and defaults
EPS = """\
format: trackbridge.mapping/1
framework: eps
releases: [v1.0]
trainers:
  grpo: {kind: rl}
config:
  - {key: kl_type, default: k1}
entries:
  - {key: kl, canonical: kl/ref/k3, trainers: [grpo], reduce: {tokens: token_mean, snapshot: update, estimator: k3},
     source: eps/loss.py@v1.0}
  - {key: kl, canonical: kl/ref/k1, trainers: [grpo], when: {config: {kl_type: k1}},
     reduce: {tokens: token_mean, snapshot: update, estimator: k1}, source: eps/loss.py@v1.0}
  - {key: kl, canonical: kl/ref/k2, trainers: [grpo], when: {config: {kl_type: k2}},
     reduce: {tokens: token_mean, snapshot: update, estimator: k2}, source: eps/loss.py@v1.0}
"""


def test_a_when_key_the_run_config_lacks_holds_the_frameworks_default(tmp_path):
    """A run that does not set kl_type ran with the framework's default (k1): its kl is the k1 entry's, and the
    translation says which default it assumed (before, the unconditional k3 entry was read, with a note that the
    config might change it)."""
    from trackbridge.pipeline import Translator
    f = tmp_path / "eps.yaml"
    f.write_text(EPS)
    reg = load_registry([str(f)])
    res = Translator("eps/grpo@1.0", "canonical", registry=reg).translate({"kl": 0.1})
    assert res.metrics == {"kl/ref/k1": 0.1}, res.metrics
    tr = Translator("eps/grpo@1.0", "canonical", registry=reg)
    tr.translate({"kl": 0.1})
    assert any("kl_type=k1 (eps's default, assumed)" in n for n in tr.notes), tr.notes
    assert not any("mean another quantity" in n for n in tr.notes), tr.notes
    for kl_type, want in (("k2", "kl/ref/k2"), ("k3", "kl/ref/k3"), ("k1", "kl/ref/k1")):
        res = Translator("eps/grpo@1.0", "canonical", registry=reg, config={"kl_type": kl_type}).translate({"kl": 0.1})
        assert res.metrics == {want: 0.1}, (kl_type, res.metrics)


ZETA = """\
format: trackbridge.mapping/1
framework: zeta
releases: [v1.0]
trainers:
  dpo: {kind: preference}
prefixes:
  - {prefix: "eval_", split: eval}
  - {prefix: "train/", split: train}
config:
  - {key: ga, default: 2}
levels:
  micro_batches: ga
entries:
  - {key: reward, canonical: reward/score/mean, trainers: [dpo],
     reduce: {tokens: per_seq, micro_batches: mean, processes: gather, snapshot: rollout}, source: zeta/dpo.py@v1.0}
"""


def test_an_eval_key_renamed_back_through_the_canonical_stream_is_the_direct_path(tmp_path):
    """The logger's path (source -> canonical spool -> the source's names again, the stream remembering its origin)
    judges an eval key as the direct path does: the same entry there and back is exact (the origin's key was
    compared without its split prefix, so the stored reason never matched and the eval keys came out approximate)."""
    from trackbridge.pipeline import Translator
    f = tmp_path / "zeta.yaml"
    f.write_text(ZETA)
    reg = load_registry([str(f)])
    row = {"reward": 0.5, "eval_reward": 0.4}
    to_canon = Translator("zeta/dpo@1.0", "canonical", registry=reg).translate(row)
    assert set(to_canon.metrics) == {"reward/score/mean", "eval/reward/score/mean"}
    why = to_canon.approximate["eval/reward/score/mean"]
    assert "zeta 'eval_reward' averages its micro-batches unweighted (an evaluation's batches are not counted by the " \
           "run config)" in why, why
    assert "canonical 'eval/reward/score/mean'" in why and "[micro_batches]" in why
    direct = Translator("zeta/dpo@1.0", "zeta/dpo@1.0", registry=reg).translate(row)
    assert direct.approximate == {} and direct.metrics == row
    back = Translator("canonical", "zeta/dpo@1.0", registry=reg, origin="zeta/dpo@1.0",
                      fidelity=to_canon.approximate).translate(to_canon.metrics)
    assert back.metrics == row and back.approximate == direct.approximate, back.approximate
    # a train key logged with a tracker's prefix (wandb's train/...) is named as the framework names it in the
    # reasons, on every path, so that a stored reason is recognised when the stream is renamed back
    prefixed = Translator("zeta/dpo@1.0", "canonical", registry=reg).translate({"train/reward": 0.5})
    assert "zeta 'reward' averages its 2 micro-batches unweighted" in prefixed.approximate["reward/score/mean"]
    back = Translator("canonical", "zeta/dpo@1.0", registry=reg, origin="zeta/dpo@1.0",
                      fidelity=prefixed.approximate).translate(prefixed.metrics)
    assert back.metrics == {"reward": 0.5} and back.approximate == {}, back.approximate


def test_judge_against_a_missing_reference_is_never_exact(reg):
    r = res(reg, "score")
    assert judge(r, None) == "delta 'score': the canonical name states no reference reduction to compare with"
