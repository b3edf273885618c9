"""Fingerprint proofs of mappings/trl.yaml for TRL's GRPOTrainer (issue 20): the installed TRL (1.16.0) trains a tiny
model on CPU, every row it logs is read through a callback's on_log, and each logged value is matched against every
candidate reduction of the values TRL itself computed (the locals of its metric code, recorded as it ran:
tests/_support/proofs_trl.py). The candidate that fits must be the reduction the shipped entry states for the run's
config (resolved by trackbridge's loader: _support.proven), and no other.

Runs (each a few seconds on CPU):

* ``window``: gradient_accumulation_steps 2, logging_steps 3, 6 optimizer steps, num_iterations 2 (so the policy
  moves between the passes over a generation batch and clips), beta 0.1 (the KL term is logged). Each row averages
  3 steps x 2 micro-batches of uneven token counts; the per-generation keys average the generations of the row (2,
  then 1). The micro-batch and the window levels are both told apart here.
* ``step``: gradient_accumulation_steps 1, logging_steps 1, loss_type "grpo", scale_rewards "batch": every level holds
  one item, so the per-token reduction is what is told apart (token mean vs mean of sequence means), and the
  config-dependent entries (the GRPO loss by loss_type, frac_reward_zero_std under batch scaling) are checked.
* ``bonus``: an entropy bonus (entropy_coef 0.01) at gradient_accumulation_steps 1, logging_steps 2: policy_loss
  (the loss before the bonus) is logged, and at one micro-batch per step it is a token mean.
* ``tools``: environment tokens in the completions (a rollout_func returning ``env_mask``, which GRPO handles as its
  ``tool_mask``: trl/trainer/grpo_trainer.py@v1.16.0 _generate), the path tool results take.
"""
from __future__ import annotations

import atexit
import functools
import math
import shutil
import tempfile
from pathlib import Path

import pytest

import trackbridge

pytest.importorskip("trl")
pytest.importorskip("datasets")

from _support.fingerprint import fingerprint  # noqa: E402
from _support.proofs_trl import TRLRun, counter_obs, masked, per_seq, run_grpo  # noqa: E402
from _support.proven import proof  # noqa: E402

RELEASE = "1.16.0"
WINDOWS = ("mean", "last", "sum", "none")     # rows of 1 step keep the window candidates (rows of 3 steps need them)

WINDOW = dict(gradient_accumulation_steps=2, logging_steps=3, max_steps=12, num_iterations=2, beta=0.1,
              epsilon=1e-3, epsilon_high=1e-3, per_device_train_batch_size=2, num_generations=2,
              lr_scheduler_type="cosine_with_restarts", lr_scheduler_kwargs={"num_cycles": 5})
STEP = dict(gradient_accumulation_steps=1, logging_steps=1, max_steps=3, beta=0.1, per_device_train_batch_size=4,
            num_generations=2, loss_type="grpo", scale_rewards="batch")
BONUS = dict(gradient_accumulation_steps=1, logging_steps=2, max_steps=6, beta=0.1, per_device_train_batch_size=4,
             num_generations=2, entropy_coef=0.01)
TOOLS = dict(gradient_accumulation_steps=2, logging_steps=1, max_steps=2, beta=0.0, per_device_train_batch_size=2,
             num_generations=2, entropy_coef=0.01)


def _config(kw: dict) -> dict:
    """The run config trackbridge resolves the entries with (the GRPOConfig fields the proofs set)."""
    keys = ("gradient_accumulation_steps", "logging_steps", "num_iterations", "beta", "loss_type", "scale_rewards",
            "entropy_coef")
    return {k: kw[k] for k in keys if k in kw}


_WORK = Path(tempfile.mkdtemp(prefix="trl-proofs-"))
atexit.register(shutil.rmtree, _WORK, True)


@functools.lru_cache(maxsize=None)
def _run(name: str) -> TRLRun:
    kw = {"window": WINDOW, "step": STEP, "tools": TOOLS, "bonus": BONUS}[name]
    extra = {"rollout_func": _env_rollout} if name == "tools" else {}
    return run_grpo(_WORK / name, **kw, **extra)


def _obs(run: TRLRun, key: str, fn: str, values) -> list:
    """(logged value, batch) of every train row that logged ``key``."""
    out = [(row[key], run.steps(i, fn, values)) for i, (_s, row) in enumerate(run.train_rows()) if key in row]
    assert out, f"no train row logged {key!r}"
    return out


LOSS = "_compute_loss"
GEN = "_generate"
SCORE = "_generate_and_score_completions"
TOKEN_CANDIDATES = ("token_mean", "seq_mean_token_mean")


# ------------------------------------------------------------------------------------------- the window run
@proof("trl", trainer="grpo", release=RELEASE, config=_config(WINDOW))
def test_grpo_token_means_average_micro_batches_and_logged_steps(p):
    """entropy, kl and the clip fractions: each micro-batch's token mean over every process (accelerator.reduce of
    sums and counts), then log() averages the 2 micro-batches x 3 steps of the row unweighted: neither the token
    mean of the step nor of the row."""
    run = _run("window")
    rows = run.train_rows()
    p.check(run.windows == [(1, 3), (4, 6), (7, 9), (10, 12)], f"four rows of three steps: {run.windows}")
    for key, tensor in (("entropy", "entropies"), ("kl", "per_token_kl"),
                        ("clip_ratio/region_mean", "is_region_clipped"), ("clip_ratio/low_mean", "is_low_clipped"),
                        ("clip_ratio/high_mean", "is_high_clipped")):
        p.assert_stated(key, _obs(run, key, LOSS, masked(tensor)), tokens=TOKEN_CANDIDATES, mini=("none",),
                        window=WINDOWS, levels=("micro_batches", "window"))
    p.check(any(r["clip_ratio/region_mean"] > 0 for _s, r in rows), "nothing was clipped: the proof would be weak")


@proof("trl", trainer="grpo", release=RELEASE, config=_config(WINDOW))
def test_grpo_clip_extremes_are_means_of_micro_batch_extremes(p):
    """clip_ratio/low_min and high_max: the min (max) over the micro-batch's sequences (gathered from every process)
    of each sequence's clipped-token fraction, then averaged over micro-batches and steps. Two stages: the value TRL
    appends for each micro-batch fixes the per-sequence statistic (many observations; a row's few 0/1-heavy values
    alone let a max of sequences pass for a sum of sequence means), the logged rows then fix the levels."""
    run = _run("window")
    for key, tensor, stat in (("clip_ratio/high_max", "is_high_clipped", "max"),
                              ("clip_ratio/low_min", "is_low_clipped", "min")):
        per_micro = run.per_call(key, LOSS, masked(tensor))
        p.check(len(per_micro) == 2 * WINDOW["max_steps"] and any(v > 0 for v, _ in per_micro),
                f"{key}: every micro-batch logs 0: nothing to tell statistics apart with")
        found = p.assert_stated(key, per_micro, tokens=("seq_mean_token_mean", "token_mean"),
                                stats=(stat, "mean"), levels=())
        rows = _obs(run, key, LOSS, masked(tensor))
        p.check(len({round(v, 9) for v, _ in rows} | {0.0}) > 1, f"{key}: every row logs 0: the proof would be weak")
        p.assert_stated(key, rows, tokens=(found.tokens,), stats=(found.stat,), mini=("none",), window=WINDOWS,
                        levels=("micro_batches", "window"))


@proof("trl", trainer="grpo", release=RELEASE, config=_config(WINDOW))
def test_grpo_loss_is_the_step_token_mean_averaged_over_logged_steps(p):
    """HF's 'loss' with the default loss_type dapo: each micro-batch's token sum over the generation batch's token
    count, summed over the step's micro-batches (the step's token mean of the per-token loss, KL term included), then
    the mean over the row's steps."""
    run = _run("window")
    p.assert_stated("loss", _obs(run, "loss", LOSS, masked("per_token_loss")), tokens=TOKEN_CANDIDATES,
                    mini=("none",), window=WINDOWS, levels=("micro_batches", "window"), rel=1e-5)


@proof("trl", trainer="grpo", release=RELEASE, config=_config(WINDOW))
def test_grpo_generation_keys_average_the_generations_of_a_row(p):
    """completions/* and the reward keys: computed once over each generation batch (gathered from every process),
    then averaged over the generations since the last log (num_iterations 2: two in the first row, one in the
    second)."""
    run = _run("window")
    gens = [c.step for c in run.calls if c.name == GEN]
    p.check(gens == [1, 3, 5, 7, 9, 11], f"a generation every num_iterations optimizer steps: {gens}")
    for stat in ("mean", "min", "max"):
        p.assert_stated(f"completions/{stat}_length", _obs(run, f"completions/{stat}_length", GEN,
                                                           per_seq("agg_completion_lengths")),
                        tokens=("per_seq",), stats=(stat,), mini=("none",), window=WINDOWS, levels=())
        term = per_seq("agg_completion_lengths", "agg_is_truncated", invert=True)
        p.assert_stated(f"completions/{stat}_terminated_length",
                        _obs(run, f"completions/{stat}_terminated_length", GEN, term),
                        tokens=("per_seq",), stats=(stat,), mini=("none",), window=WINDOWS, levels=())
    p.assert_stated("completions/clipped_ratio", _obs(run, "completions/clipped_ratio", GEN,
                                                      per_seq("agg_is_truncated")),
                    tokens=("per_seq",), mini=("none",), window=WINDOWS, levels=())
    p.assert_stated("reward", _obs(run, "reward", SCORE, per_seq("rewards")), tokens=("per_seq",), window=WINDOWS,
                    levels=())
    p.assert_stated("reward_std", _obs(run, "reward_std", SCORE, per_seq("rewards")), tokens=("per_seq",),
                    stats=("std",), mini=("none",), window=WINDOWS, levels=())
    for col, name in enumerate(("length_reward", "has_cat")):
        def fn_rewards(loc, col=col):
            return [[float(v)] for v in loc["rewards_per_func"][:, col] if not math.isnan(float(v))]
        p.assert_stated(f"rewards/{name}/mean", _obs(run, f"rewards/{name}/mean", SCORE, fn_rewards),
                        tokens=("per_seq",), mini=("none",), window=WINDOWS, levels=())
        p.assert_stated(f"rewards/{name}/std", _obs(run, f"rewards/{name}/std", SCORE, fn_rewards),
                        tokens=("per_seq",), stats=("std",), mini=("none",), window=WINDOWS, levels=())
    p.assert_stated("frac_reward_zero_std", _obs(run, "frac_reward_zero_std", SCORE, per_seq("is_std_zero")),
                    tokens=("per_seq",), mini=("none",), window=WINDOWS, levels=())


@proof("trl", trainer="grpo", release=RELEASE, config=_config(WINDOW))
def test_grpo_lr_and_grad_norm_are_the_last_steps(p):
    """learning_rate: the rate the row's last optimizer step used (read after optimizer.step(), before
    lr_scheduler.step()); grad_norm: the last step's norm before clipping. Warm-up then decay makes the last step
    neither the first, the largest nor the smallest of a row."""
    run = _run("window")
    opt = run.optimizer
    rows = run.train_rows()
    lr_obs = [(row["learning_rate"], run.per_step(opt.lr_before, i)) for i, (_s, row) in enumerate(rows)]
    p.assert_stated("learning_rate", lr_obs, tokens=("per_seq",), mini=("none",), window=WINDOWS, levels=())
    after = [(row["learning_rate"], run.per_step(opt.lr_after, i)) for i, (_s, row) in enumerate(rows)]
    with pytest.raises(AssertionError, match="no candidate"):
        fingerprint(after, tokens=("per_seq",), mini=("none",), window=WINDOWS)
    p.check(True, "the rate after the scheduler step fits no reduction")
    gn_obs = [(row["grad_norm"], run.per_step(opt.grad_norm, i)) for i, (_s, row) in enumerate(rows)]
    p.assert_stated("grad_norm", gn_obs, tokens=("per_seq",), mini=("none",), window=WINDOWS, levels=(), rel=1e-5)


@proof("trl", trainer="grpo", release=RELEASE, config=_config(WINDOW))
def test_grpo_num_tokens_is_the_running_total_at_the_last_generation(p):
    """num_tokens (progress/tokens): the running total of prompt + completion tokens over every process, as it stood
    at the row's last generation (TRL replaces the list: self._metrics[mode]["num_tokens"] = [total]), summed here
    from the token counts TRL's own _generate calls held; a counter, not reduced over the row's steps."""
    run = _run("window")
    total = 0.0
    at: dict[int, float] = {}
    for c in run.calls:
        if c.name == GEN:
            total += float(c.locals["total_prompt_tokens"]) + float(c.locals["agg_completion_lengths"].sum())
            at[c.step] = total
    per_step = [at[max(s for s in at if s <= step)] for step in range(1, WINDOW["max_steps"] + 1)]
    rows = run.train_rows()
    p.check(len(rows) == len(run.windows) == 4, run.windows)
    p.check(any(row["num_tokens"] != per_step[first - 1] for (first, _l), (_s, row) in zip(run.windows, rows)),
            "the row's first step's total is another number")
    p.assert_stated("num_tokens", counter_obs(run, "num_tokens", per_step), levels=())


@proof("trl", trainer="grpo", release=RELEASE, config=_config(WINDOW))
def test_grpo_step_time_averages_the_rows_steps(p):
    """step_time: training_step's wall time summed over the step's gradient_accumulation_steps calls, appended once
    per optimizer step by the call that ends it (each value is TRL's own timer reading), then averaged over the row's
    steps by log() (not the last step's, not their sum)."""
    run = _run("window")
    obs = []
    for i, (_s, row) in enumerate(run.train_rows()):
        first, last = run.windows[i]
        steps = [[[[[[c.appended["step_time"]]]]]] for s in range(first, last + 1)
                 for c in run.calls_of("training_step", s, s) if "step_time" in c.appended]
        p.check(len(steps) == last - first + 1, f"one step_time per optimizer step: {len(steps)}")
        obs.append((row["step_time"], steps))
    p.check(len({round(v, 9) for v, _ in obs}) > 1, "every row logs the same step_time: weak")
    p.assert_stated("step_time", obs, tokens=("none",), mini=("none",), window=WINDOWS, levels=())


# ------------------------------------------------------------------------------------------- the step run
@proof("trl", trainer="grpo", release=RELEASE, config=_config(STEP))
def test_grpo_one_step_rows_tell_the_token_reduction(p):
    """At one micro-batch per step and one step per row every level is the identity: the logged values are the token
    mean over the batch's completion tokens (not the mean of sequence means); with loss_type 'grpo' HF's loss is
    the mean of sequence token means."""
    run = _run("step")
    rows = run.train_rows()
    p.check(len(rows) == STEP["max_steps"], rows)
    for key, tensor in (("entropy", "entropies"), ("kl", "per_token_kl")):
        p.assert_stated(key, _obs(run, key, LOSS, masked(tensor)), tokens=TOKEN_CANDIDATES, mini=("none",),
                        window=WINDOWS, levels=())
    # the first step's loss is 0 in exact arithmetic (the policy is the old one: the advantages cancel) and logs as
    # float32 rounding noise (7.45e-09 seen, 2**-27): equal to 0 within 1e-5 of the O(0.1) terms' scale
    p.assert_stated("loss", _obs(run, "loss", LOSS, masked("per_token_loss")), tokens=TOKEN_CANDIDATES,
                    mini=("none",), window=WINDOWS, levels=(), rel=1e-5)


@proof("trl", trainer="grpo", release=RELEASE, config=_config(STEP))
def test_grpo_zero_std_fraction_under_batch_scaling(p):
    """scale_rewards='batch': the std tested is the whole batch's, so frac_reward_zero_std is 0 or 1 (the value
    itself is still the mean of TRL's per-completion flags); the entry says it is not a fraction of groups then."""
    run = _run("step")
    p.assert_stated("frac_reward_zero_std", _obs(run, "frac_reward_zero_std", SCORE, per_seq("is_std_zero")),
                    tokens=("per_seq",), mini=("none",), window=WINDOWS, levels=())
    p.check(all(r["frac_reward_zero_std"] in (0.0, 1.0) for _s, r in run.train_rows()), run.train_rows())
    _entry, res = p.entry("frac_reward_zero_std")
    p.check("scale_rewards='batch'" in res.fields["deviation"], res.fields)


# ------------------------------------------------------------------------------------------- tool tokens
ENV_TOKENS = 3      # environment tokens spliced into each completion (after its first model token)


def _env_rollout(prompts, trainer):
    """Generate with the trainer's own model and tokenizer, then splice ENV_TOKENS environment tokens into every
    completion after its first token, marked 0 in ``env_mask``: what a multi-turn environment or a tool result adds."""
    import torch
    from trl.trainer.grpo_trainer import GRPOTrainer

    prompt_ids, _images, _fields = GRPOTrainer._tokenize_prompts(trainer, prompts)
    completion_ids, _logprobs = GRPOTrainer._generate_single_turn(trainer, prompt_ids, None, {}, 1)
    tok = trainer.processing_class
    env = tok.convert_tokens_to_ids(["the", "mat", "is"])[:ENV_TOKENS]
    out_ids, masks = [], []
    for ids in completion_ids:
        ids = list(ids.tolist() if isinstance(ids, torch.Tensor) else ids)
        out_ids.append(ids[:1] + env + ids[1:])
        masks.append([1] + [0] * len(env) + [1] * (len(ids) - 1))
    return {"prompt_ids": prompt_ids, "completion_ids": out_ids, "logprobs": None, "env_mask": masks}


@proof("trl", trainer="grpo", release=RELEASE, config=_config(TOOLS))
def test_grpo_leaves_tool_tokens_out_of_lengths_and_token_means(p):
    """Completions holding environment (tool-result) tokens: completions/*_length count the model's tokens only, and
    the token means (entropy) leave the tool tokens out (mask = completion_mask * tool_mask)."""
    run = _run("tools")
    gens = [c for c in run.calls if c.name == GEN]
    p.check(gens, "no generation recorded")
    for c in gens:
        ids, lengths = c.locals["completion_ids"], c.locals["agg_completion_lengths"]
        p.check([len(x) - ENV_TOKENS for x in ids] == [int(v) for v in lengths],
                (lengths, [len(x) for x in ids]))
    for stat in ("mean", "max"):
        p.assert_stated(f"completions/{stat}_length", _obs(run, f"completions/{stat}_length", GEN,
                                                           per_seq("agg_completion_lengths")),
                        tokens=("per_seq",), stats=(stat,), mini=("none",), window=WINDOWS, levels=())
    losses = [c for c in run.calls if c.name == LOSS]
    p.check(all(bool((c.locals["mask"] < c.locals["completion_mask"]).any()) for c in losses),
            "tool tokens are in the completion mask but out of the loss mask")
    p.assert_stated("entropy", _obs(run, "entropy", LOSS, masked("entropies")), tokens=TOKEN_CANDIDATES,
                    mini=("none",), window=WINDOWS, levels=("micro_batches",))
    _entry, res = p.entry("completions/mean_length")
    p.check(res.fields["tool_tokens"] == "excluded", res.fields)


@proof("trl", trainer="grpo", release=RELEASE, config=_config(BONUS))
def test_grpo_policy_loss_at_one_micro_batch_per_step_is_the_steps_token_mean(p):
    """policy_loss (logged with an entropy bonus; loss_type dapo, gradient_accumulation_steps 1): the policy term
    before the bonus (beta * KL included), the token sum over the generation batch's tokens: the step's token mean,
    gathered from every process and averaged; log() averages the row's 2 steps (of different token counts)."""
    run = _run("bonus")
    rows = run.train_rows()
    p.check(len(rows) == BONUS["max_steps"] // BONUS["logging_steps"] and all("policy_loss" in r for _s, r in rows),
            rows)
    p.assert_stated("policy_loss", _obs(run, "policy_loss", LOSS, masked("per_token_loss")), tokens=TOKEN_CANDIDATES,
                    mini=("none",), window=WINDOWS, levels=("window",), rel=1e-5)


def test_grpo_policy_loss_is_divided_by_gradient_accumulation():
    """policy_loss (logged with an entropy bonus), default loss_type dapo, gradient_accumulation_steps 2: each
    micro-batch appends its token sum over the whole step's token count and log() averages them, so the row holds
    the step's token mean of the policy term halved. The entry says so (a deviation at GA > 1, none at GA 1)."""
    from trackbridge.pipeline import Translator

    run = _run("tools")
    rows = run.train_rows()
    assert len(rows) == TOOLS["max_steps"]
    for i, (_s, row) in enumerate(rows):
        flat = [v for step in run.steps(i, LOSS, masked("per_token_loss")) for mini in step for rank in mini
                for micro in rank for seq in micro for v in seq]
        assert math.isclose(row["policy_loss"], sum(flat) / len(flat) / TOOLS["gradient_accumulation_steps"],
                            rel_tol=1e-5), (row["policy_loss"], sum(flat) / len(flat))
    one = {"logging_steps": 1}
    why = Translator("trl/grpo@1.16.0", "canonical", config={**one, "gradient_accumulation_steps": 2}).translate(
        {"policy_loss": 0.1}).approximate["loss/policy"]
    assert "divided by gradient_accumulation_steps" in why, why
    why = Translator("trl/grpo@1.16.0", "canonical", config=one).translate({"policy_loss": 0.1}).approximate
    assert "divided by" not in why["loss/policy"], why         # still the loss before the entropy bonus


# ------------------------------------------------------------------------------------------- marks of a real log
MARKED = ("kl", "entropy", "loss", "grad_norm", "reward", "completions/mean_length", "learning_rate",
          "frac_reward_zero_std")


def _marks(run: TRLRun, config: dict, spec: str = "trl") -> dict[str, str | None]:
    """Translate the run's train rows to canonical names with the trainer (and, with spec "trl", the release) left
    out: for each of MARKED, the reason it is approximate (the rows' reasons joined), or None when exact."""
    from trackbridge.pipeline import Translator

    tr = Translator(spec, "canonical", config=config)
    reasons: dict[str, list[str]] = {}
    for _s, row in run.train_rows():
        res = tr.translate(row)
        assert res.source.startswith("trl/grpo@"), res.source
        for key in MARKED:
            if key in row:
                reasons.setdefault(key, [])
                why = res.approximate.get(res.renamed[key])
                if why:
                    reasons[key].append(why)
    assert set(reasons) == set(MARKED), sorted(set(MARKED) - set(reasons))
    return {k: " | ".join(v) or None for k, v in reasons.items()}


def test_a_real_grpo_log_carries_the_marks_of_its_config():
    """TRL 1.16 GRPO rows, translated with trainer and release left out, under the run's own config and under the
    defaults. The keys do not tell TRL 1.9+ from older releases (detection gives v0.26.0..v1.16.0), so the token
    means, whose process reduction changed in v1.9.0, are approximate for that reason alone at one step per row and
    one micro-batch per step; the reward and the gradient norm are exact there; the completion lengths leave tool
    tokens out, the learning rate is read before the scheduler steps, and scale_rewards='batch' makes
    frac_reward_zero_std 0 or 1, at any window. Read with the default logging_steps (10), or with GA 2, or from the
    run with logging_steps 3 and GA 2, the reasons name the window and the micro-batches. Given the release
    (trl@1.16.0), the one-step token means are exact."""
    step = _run("step")
    own = _marks(step, step.config)
    # the reward: equal as stated over the whole range and proven in each of its entries (1.16 here, 0.25.1 in
    # tests/frameworks/test_proof_trl_old.py, v0.27.0..v0.29.1 at 0.29.1 in test_proof_trl_grpo_old.py): exact
    assert own["reward"] is None and own["grad_norm"] is None, own
    assert "release matters" in own["kl"] and "logging_steps" not in own["kl"] and "micro" not in own["kl"], own
    assert "tool" in own["completions/mean_length"] and "scheduler" in own["learning_rate"], own
    assert "scale_rewards" in own["frac_reward_zero_std"], own
    # canonical loss/total leaves tokens to the framework (a DPO loss is over pairs, an LM loss over tokens): the
    # loss_type 'grpo' token reduction is said framework to framework (below), against canonical the processes
    assert "processes" in own["loss"] and "per-sequence token means" not in own["loss"], own
    to_verl = trackbridge.translate({"loss": 0.1}, source="trl/grpo@1.16.0", target="verl", config=step.config)
    assert "per-sequence token means" in to_verl.approximate["actor/loss"], to_verl.approximate
    released = _marks(step, step.config, "trl@1.16.0")
    assert released["kl"] is None and released["entropy"] is None and released["reward"] is None, released

    defaults = _marks(step, {})                                                  # logging_steps 10, GA 1
    for key in ("kl", "entropy", "reward", "loss"):
        assert "logging_steps" in (defaults[key] or ""), (key, defaults[key])
    # the Trainer logs the last step's grad_norm (window: last): a row holds its own step's value, whatever the window
    assert defaults["grad_norm"] is None, defaults["grad_norm"]
    ga2 = _marks(step, {"logging_steps": 1, "gradient_accumulation_steps": 2}, "trl@1.16.0")
    for key in ("kl", "entropy"):
        assert "gradient_accumulation_steps" in (ga2[key] or ""), (key, ga2[key])
    assert ga2["reward"] is None and ga2["grad_norm"] is None, ga2          # per generation; one step

    window = _run("window")
    marks = _marks(window, window.config, "trl@1.16.0")
    for key in ("kl", "entropy"):
        assert "gradient_accumulation_steps" in marks[key] and "logging_steps" in marks[key], (key, marks[key])
    assert "logging_steps" in marks["reward"] and "num_iterations" in marks["reward"], marks["reward"]
