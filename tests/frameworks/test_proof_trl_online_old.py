"""Fingerprint proofs of mappings/trl.yaml's XPO and Nash-MD entries (v0.11.0..v1.13.0), run at trl 1.12.0
(tests/releases.txt; trl.experimental.xpo and trl.experimental.nash_md; each proof runs in a child process whose
sys.path starts with the release: tests/_support/releases.py; tests/_support/proofs_trl_online_old.py trains the
release's own trainer). 0.25.1 is in the range too but its OnlineDPOTrainer._maybe_log_save_evaluate calls
``self._nested_gather``, which transformers 5 removed (AttributeError at the first log); 1.12.0's
``_log_statistics`` is 0.25.1's (the scores are logged unconditionally: 1.12.0 requires a reward model).

7 prompts as an iterable dataset, per_device_train_batch_size 2, gradient_accumulation_steps 2 (micro-batches of 2
and 1 prompts; one policy and one reference / mixture completion each, of uneven lengths), logging_steps 3,
9 steps: three rows of 6 micro-batches. ``_log_statistics`` appends one value per micro-batch and key
(``gather_for_metrics(x).mean()``), ``_maybe_log_save_evaluate`` logs the lists' unweighted means. beta, alpha and
mixture_coef are given another value before each micro-batch (proofs_trl_online_old.py's Schedule), so their means
tell the reductions apart. Online DPO at 0.13.0 (its entries' beta and the v0.10..v0.18.2 learning_rate, the rate
after the scheduler stepped with transformers < 4.51) runs the same way with a cosine-with-restarts rate.

Not proven here: XPO's logps/* (a sum of two means: tests/_support/proofs_trl_online_old.py's ENTRY_WHY).
"""
from __future__ import annotations

import pytest

pytest.importorskip("trl")
pytest.importorskip("datasets")

from _support.proven import proof  # noqa: E402

RELEASE = "1.12.0"
WINDOWS = ("mean", "last", "sum", "none")
RUN = dict(per_device_train_batch_size=2, gradient_accumulation_steps=2, logging_steps=3, max_steps=9, beta=0.1,
           accelerator_config={"dispatch_batches": False})
CONFIG = {k: RUN[k] for k in ("gradient_accumulation_steps", "logging_steps")}
BETAS = [0.1, 0.3, 0.2, 0.05, 0.25]
TOKENS = ("seq_mean_token_sum", "token_mean", "seq_mean_token_mean", "token_sum")


def _obs(run, key: str, values) -> list:
    out = [(row[key], run.steps(i, "_log_statistics", values)) for i, (_s, row) in enumerate(run.train_rows())
           if key in row]
    assert out, f"no train row logged {key!r}"
    return out


def _per_seq(name: str, where: str | None = None):
    """One value per pair of a (B,) tensor of _log_statistics's locals (of ``_losses``: _compute_losses's)."""
    def values(loc):
        x = (loc[where] if where else loc)[name]
        return [[float(v)] for v in x.detach().float().flatten()]
    return values


def _gathered(index: int):
    """The per-pair tensor the ``index``-th gather_for_metrics call of _log_statistics returned (what TRL averaged)."""
    def values(loc):
        return [[float(v)] for v in loc["_gathered"][index].float().flatten()]
    return values


def _appended(key: str):
    def values(loc):
        return [[loc["_appended"][key]]]
    return values


def _tokens(parts, sign: float = 1.0):
    """Each completion's per-token values of (B, T) tensors at its completion tokens: ``parts`` is a list of
    (tensor name, data name: whose completion mask, ``model_data`` / ``ref_data`` / ``mixture_data``, where: None for
    _log_statistics's locals, ``_losses`` for _compute_losses's); the completions of each part in turn."""
    def values(loc):
        out = []
        for name, data, where in parts:
            x = (loc[where] if where else loc)[name].detach().float()
            ctx = int(loc["context_length"])
            m = loc[data]["attention_mask"][:, ctx:].bool()
            out += [[sign * float(v) for v in x[i][m[i]]] for i in range(x.shape[0])]
        return out
    return values


def _shape_checks(p, run) -> None:
    sizes = [int(c.locals["model_data"]["input_ids"].shape[0]) for c in run.calls]
    p.check(set(sizes) == {1, 2} and len(sizes) == 18, f"18 micro-batches of 2 and 1 prompts: {sizes}")
    p.check(run.windows == [(1, 3), (4, 6), (7, 9)], run.windows)


XPO_SCHEDULE = {"_beta": BETAS, "_alpha": [1e-3, 5e-3, 2e-3, 4e-3, 3e-3, 6e-3, 1.5e-3]}
#: the order of XPO _log_statistics's gather_for_metrics calls (trl/experimental/xpo/xpo_trainer.py@v1.12.0)
XPO_GATHERS = ("loss/dpo", "loss/xpo", "objective/model_scores", "objective/ref_scores", "objective/scores_margin")


@proof("trl", trainer="xpo", release=RELEASE, config=CONFIG)
def test_xpo_1_12_stats_average_the_rows_micro_batches(p, tmp_path):
    """XPOTrainer at 1.12.0: loss/*, the scores, rewards/* (beta x the chosen / rejected log-ratio, their margin and
    its sign) and the EOS shares are the micro-batch's mean over its pairs (gathered); objective/kl and
    objective/entropy the mean over the micro-batch's 2B completions (policy's and reference's) of each completion's
    token sum (k1, -log pi); alpha and beta the micro-batch's value; each appended once per micro-batch and averaged
    over the row."""
    from _support.proofs_trl_online_old import run_online
    run = run_online("xpo", tmp_path, n_prompts=7, schedule=XPO_SCHEDULE, **RUN)
    _shape_checks(p, run)
    p.check(all(len(c.locals["_gathered"]) == 15 for c in run.calls), "15 gathers per micro-batch")
    p.check(all(c.locals["_gathered"][4].shape == c.locals["model_scores"].shape for c in run.calls), "gather 4")
    per_pair = [("loss/dpo", _per_seq("dpo_losses")), ("loss/xpo", _per_seq("xpo_losses")),
                ("objective/model_scores", _per_seq("model_scores")),
                ("objective/ref_scores", _per_seq("ref_scores")),
                ("objective/scores_margin", _gathered(XPO_GATHERS.index("objective/scores_margin"))),
                ("rewards/chosen", _per_seq("chosen_rewards")), ("rewards/rejected", _per_seq("rejected_rewards")),
                ("rewards/margins", _per_seq("margin")), ("rewards/accuracies", _per_seq("accuracy")),
                ("val/model_contain_eos_token", _per_seq("model_eos")),
                ("val/ref_contain_eos_token", _per_seq("ref_eos"))]
    for key, values in per_pair:
        p.assert_stated(key, _obs(run, key, values), tokens=("per_seq",), mini=("none",), window=WINDOWS,
                        levels=("micro_batches", "window"), rel=1e-5)
    rows = [r for _s, r in run.train_rows()]
    p.check(any(0 < r["rewards/accuracies"] < 1 for r in rows), "accuracy 0 or 1 everywhere: weak")
    p.check(any(0 < r["val/model_contain_eos_token"] < 1 for r in rows), "EOS share 0 or 1 everywhere: weak")
    kl = _tokens([("kl_model_data", "model_data", None), ("kl_ref_data", "ref_data", None)])
    p.assert_stated("objective/kl", _obs(run, "objective/kl", kl), tokens=TOKENS, mini=("none",), window=WINDOWS,
                    levels=("micro_batches", "window"), rel=1e-5)
    entropy = _tokens([("model_logprobs_model_data", "model_data", None),
                       ("model_logprobs_ref_data", "ref_data", None)], sign=-1.0)
    p.assert_stated("objective/entropy", _obs(run, "objective/entropy", entropy), tokens=TOKENS, mini=("none",),
                    window=WINDOWS, levels=("micro_batches", "window"), rel=1e-5)
    for key in ("alpha", "beta"):
        obs = _obs(run, key, _appended(key))
        p.check(len({round(v, 12) for v, _b in obs}) > 1, f"{key}: the same in every row: weak")
        p.assert_stated(key, obs, tokens=("none",), mini=("none",), window=WINDOWS, levels=(), rel=1e-6)


def _micro_batches_told_apart(obs: list) -> bool:
    """Whether the batches can tell a mean of micro-batch means from the pooled mean: some rank's micro-batches of
    one optimizer step differ both in size and in mean (``batch[step][mini][rank][micro][seq][token]``)."""
    for _v, batch in obs:
        for step in batch:
            for mini in step:
                for micros in mini:
                    sizes = [len(m) for m in micros]
                    means = [sum(t for seq in m for t in seq) / max(1, sum(len(seq) for seq in m)) for m in micros]
                    if len(set(sizes)) > 1 and len({round(x, 12) for x in means}) > 1:
                        return True
    return False


NASH_SCHEDULE = {"_beta": BETAS, "_mixture_coef": [0.5, 0.2, 0.7, 0.35, 0.9, 0.1, 0.6]}


@proof("trl", trainer="nash_md", release=RELEASE, config=CONFIG)
def test_nash_md_1_12_stats_average_the_rows_micro_batches(p, tmp_path):
    """NashMDTrainer at 1.12.0: loss/score (the REINFORCE score per completion), rewards/chosen and rejected (the
    reward model's scores of the policy's and the mixture's completions), rewards/probabilities, rewards/margins
    and accuracies (the policy's minus the reference's log-prob sum, its sign) and the EOS shares are the
    micro-batch's mean over its pairs (gathered); loss/kl (log pi - log pi_ref), logps/* (the policy's and the
    reference's log-probs of the policy's completion) and objective/entropy (-log pi) the mean over the
    micro-batch's completions of each completion's token sum; beta and mixture_coef the micro-batch's value; each
    appended once per micro-batch and averaged over the row."""
    from _support.proofs_trl_online_old import run_online
    run = run_online("nash_md", tmp_path, n_prompts=7, schedule=NASH_SCHEDULE, **RUN)
    _shape_checks(p, run)
    p.check(all(c.locals["_losses"] for c in run.calls), "each micro-batch's _compute_losses recorded")
    per_pair = [("loss/score", _per_seq("score")), ("rewards/chosen", _per_seq("model_scores")),
                ("rewards/rejected", _per_seq("mixture_scores")),
                ("rewards/probabilities", _per_seq("probability")), ("rewards/margins", _per_seq("margin")),
                ("rewards/accuracies", _per_seq("accuracy")),
                ("val/model_contain_eos_token", _per_seq("model_eos")),
                ("val/ref_contain_eos_token", _per_seq("mixture_eos"))]
    # the 0/1 shares (accuracies, the EOS flags) come from the same per-pair means appended per micro-batch as the
    # margins and scores; a micro-batch of all-equal flags cannot tell a micro-batch mean from the pooled one, so
    # on batches whose flags happen to be that even (the sampling follows the CPU's rounding) they are
    # fingerprinted over the window only, their micro-batch combination the one the real-valued keys fix
    flags = {"rewards/accuracies", "val/model_contain_eos_token", "val/ref_contain_eos_token"}
    for key, values in per_pair:
        obs = _obs(run, key, values)
        levels = ("micro_batches", "window")
        if key in flags and not _micro_batches_told_apart(obs):
            levels = ("window",)
        p.assert_stated(key, obs, tokens=("per_seq",), mini=("none",), window=WINDOWS, levels=levels, rel=1e-5,
                        **({"micro": ("mean",)} if levels == ("window",) else {}))
    rows = [r for _s, r in run.train_rows()]
    p.check(any(0 < r["rewards/accuracies"] < 1 for r in rows), "accuracy 0 or 1 everywhere: weak")
    per_token = [("loss/kl", _tokens([("log_ratio", "model_data", "_losses")])),
                 ("logps/chosen", _tokens([("model_logprobs_model_data", "model_data", None)])),
                 ("logps/rejected", _tokens([("ref_logprobs_model_data", "model_data", None)])),
                 ("objective/entropy", _tokens([("model_logprobs_model_data", "model_data", None)], sign=-1.0))]
    for key, values in per_token:
        p.assert_stated(key, _obs(run, key, values), tokens=TOKENS, mini=("none",), window=WINDOWS,
                        levels=("micro_batches", "window"), rel=1e-5)
    for key in ("beta", "mixture_coef"):
        obs = _obs(run, key, _appended(key))
        p.check(len({round(v, 12) for v, _b in obs}) > 1, f"{key}: the same in every row: weak")
        p.assert_stated(key, obs, tokens=("none",), mini=("none",), window=WINDOWS, levels=(), rel=1e-6)


ODPO_SCHEDULE = {"_beta": BETAS}
#: a rate that rises and falls within a row: its last, first, min and max steps differ
ODPO = {**RUN, "lr_scheduler_type": "cosine_with_restarts", "lr_scheduler_kwargs": {"num_cycles": 5}}


@proof("trl", trainer="online_dpo", release="0.13.0", config=CONFIG)
def test_online_dpo_0_13_beta_and_the_rate_after_the_scheduler_stepped(p, tmp_path):
    """OnlineDPOTrainer at 0.13.0 (transformers 4.46.3; a reward model): beta is the micro-batch's value, appended by
    training_step once per micro-batch and averaged over the row; learning_rate (transformers < 4.51:
    _maybe_log_save_evaluate reads the rate after lr_scheduler.step()) the rate after the row's last step, i.e. the
    next step's, not the rate that step used."""
    from _support.proofs_trl_online_old import run_online
    from _support.proven import close
    run = run_online("online_dpo", tmp_path, n_prompts=7, schedule=ODPO_SCHEDULE, **ODPO)
    sizes = [int(c.locals["batch_size"]) for c in run.calls]
    p.check(set(sizes) == {1, 2} and len(sizes) == 18, f"18 micro-batches of 2 and 1 prompts: {sizes}")
    p.check(run.windows == [(1, 3), (4, 6), (7, 9)], run.windows)
    obs = [(row["beta"], run.steps(i, "training_step", _appended("beta"))) for i, (_s, row) in
           enumerate(run.train_rows())]
    p.check(len({round(v, 12) for v, _b in obs}) > 1, "beta: the same in every row: weak")
    p.assert_stated("beta", obs, tokens=("none",), mini=("none",), window=WINDOWS, levels=(), rel=1e-6)
    opt = run.optimizer
    lr_obs = [(row["learning_rate"], run.per_step(opt.lr_after, i)) for i, (_s, row) in enumerate(run.train_rows())]
    p.assert_stated("learning_rate", lr_obs, tokens=("per_seq",), mini=("none",), window=WINDOWS, levels=())
    for i, (_s, row) in enumerate(run.train_rows()):
        last = run.windows[i][1]
        p.check(not close(row["learning_rate"], opt.lr_before[last - 1]), "the rate the last step used was logged")
