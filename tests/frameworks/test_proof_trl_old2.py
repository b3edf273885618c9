"""Fingerprint proofs of mappings/trl.yaml's preference and SFT entries that end before the pinned TRL 1.16.0, run at
trl 0.25.1 (tests/releases.txt; each proof runs in a child process whose sys.path starts with the release:
tests/_support/releases.py). The release's own trainer trains the tiny model on CPU; every row it logs is matched
against every candidate reduction of the values TRL itself computed (tests/_support/proofs_trl_old2.py), and the
candidate that fits must be the one the entry of that release states.

* DPO at 0.25.1: 7 pairs, per_device_train_batch_size 2, gradient_accumulation_steps 2 (micro-batches of 2, 2, 2
  and 1 pairs per epoch, completions of uneven lengths), logging_steps 3 (a row's steps cross the epoch's end),
  rpo_alpha 0.5 (nll_loss is logged): the log-prob sums per completion, the mean logits and the chosen NLL, each
  micro-batch's value stored, averaged by ``log()``. On an epoch's last step accelerate's gather_for_metrics keeps
  the dataset's remainder of a per-pair tensor (the Trainer fetched the step's micro-batches first, so the dataloader
  is at its end): there a micro-batch of 2 pairs logs its first pair's log-probs.
"""
from __future__ import annotations

import pytest

pytest.importorskip("trl")
pytest.importorskip("datasets")

from _support.proven import proof  # noqa: E402

WINDOWS = ("mean", "last", "sum", "none")
DPO = dict(per_device_train_batch_size=2, gradient_accumulation_steps=2, logging_steps=3, max_steps=9, beta=0.1,
           rpo_alpha=0.5)
DPO_CONFIG = {k: DPO[k] for k in ("gradient_accumulation_steps", "logging_steps", "beta", "rpo_alpha")}


@proof("trl", trainer="dpo", release="0.25.1", config=DPO_CONFIG)
def test_dpo_0_25_logps_logits_and_nll(p, tmp_path):
    """TRL 0.25.1's DPOTrainer: logps/* each micro-batch's mean over its pairs of the completion's log-prob sum;
    logits/* the micro-batch's token mean (over the completion tokens) of the logits' vocabulary mean; nll_loss the
    micro-batch's token mean of the chosen completions' NLL (cross_entropy over the chosen labels); each stored once
    per micro-batch and averaged over the row's micro-batches (one process: gather_for_metrics keeps the batch)."""
    from _support.proofs_trl_old2 import LOGPS_GATHER, completion, run_dpo
    run = run_dpo(tmp_path, n_pairs=7, **DPO)
    p.check(run.windows == [(1, 3), (4, 6), (7, 9)], f"three rows of three steps: {run.windows}")
    p.check(len(run.calls) == 18 and all(c.forward for c in run.calls), f"{len(run.calls)} stored micro-batches")
    sizes = [int(c.forward["num_examples"]) for c in run.calls]
    p.check(sorted(set(sizes)) == [1, 2], f"uneven micro-batches: {sizes}")
    lengths = {int(n) for c in run.calls for n in c.forward["loss_mask"].sum(-1)}
    p.check(len(lengths) > 2, f"completions of even lengths: {lengths}")
    p.check(all(len(c.gathered) == 9 for c in run.calls), [len(c.gathered) for c in run.calls])
    # an epoch's last step: accelerate truncates the per-pair gathers to the remainder (7 % 2: the first pair)
    cut = [c for c in run.calls if len(c.gathered[LOGPS_GATHER]) < int(c.forward["num_examples"])]
    p.check(cut and all(len(c.gathered[LOGPS_GATHER]) == 1 for c in cut), "no gather truncated at an epoch's end")
    for key, chosen in (("logps/chosen", True), ("logps/rejected", False)):
        p.assert_stated(key, run.obs(key, completion("per_token_logps", chosen, kept=True)), window=WINDOWS,
                        levels=("micro_batches", "window"), rel=1e-5)
    for key, chosen in (("logits/chosen", True), ("logits/rejected", False)):
        p.assert_stated(key, run.obs(key, completion("logits", chosen, vocab_mean=True)), window=WINDOWS,
                        tokens=("token_mean", "seq_mean_token_mean"), levels=("micro_batches", "window"), rel=1e-5)
    # the chosen completions' NLL per token: TRL's own per-token log-probs of the chosen labels, negated
    p.assert_stated("nll_loss", run.obs("nll_loss", completion("per_token_logps", True, sign=-1.0)), window=WINDOWS,
                    tokens=("token_mean", "seq_mean_token_mean", "seq_mean_token_sum"),
                    levels=("micro_batches", "window"), rel=1e-5)


KTO = dict(per_device_train_batch_size=3, gradient_accumulation_steps=2, logging_steps=3, max_steps=9, beta=0.1)
KTO_CONFIG = {k: KTO[k] for k in ("gradient_accumulation_steps", "logging_steps", "beta")}


def _all_logits(name: str, padding: bool = True):
    """Each example's values of get_batch_loss_metrics's (n, T, V) ``policy_{chosen,rejected}_logits``: per
    position the sum over the vocabulary, at every position of the padded prompt + completion (``padding``) or at
    its attended positions only."""
    def values(loc):
        x = loc[name].float().sum(-1)
        if padding:
            return [[float(v) for v in row] for row in x]
        mask = loc["batch"]["completion_attention_mask"]
        idx = loc["batch"]["label"]
        keep = [i for i, lab in enumerate(idx) if bool(lab) == ("chosen" in name)]
        return [[float(v) for v in row[mask[i].bool()]] for row, i in zip(x, keep)]
    return values


@proof("trl", trainer="kto", release="0.25.1", config=KTO_CONFIG)
def test_kto_0_25_logits_are_example_sums_of_every_logit_pooled_over_the_row(p, tmp_path):
    """TRL 0.25.1's KTOTrainer: logits/chosen (rejected) is the sum of EVERY logit of the desirable (undesirable)
    examples (policy_chosen_logits.nansum(): every position of the padded prompt + completion, every vocabulary
    entry), gathered, stored per micro-batch with the example count, and log() divides the row's sums by the row's
    counts: a per-example logit sum, pooled over the row's examples (not a mean logit, not a mean of the steps')."""
    from _support.fingerprint import fingerprint
    from _support.proofs_trl_old2 import run_kto
    run = run_kto(tmp_path, n_examples=11, **KTO)
    p.check(len(run.windows) == 3 and all(c.forward for c in run.calls), run.windows)
    counts = {(int(c.forward["num_chosen"]), int(c.forward["num_rejected"])) for c in run.calls}
    p.check(len(counts) > 2 and any(0 in cnt for cnt in counts), f"uneven desirable/undesirable counts: {counts}")
    for key, name in (("logits/chosen", "policy_chosen_logits"), ("logits/rejected", "policy_rejected_logits")):
        obs = run.obs(key, _all_logits(name), stored=key + "_sum")
        # the undesirable examples: 2 in every step (2 | 1 + 1): the window level is told apart by the desirable ones
        levels = ("micro_batches", "window") if key == "logits/chosen" else ("micro_batches",)
        p.assert_stated(key, obs, window=WINDOWS, levels=levels, rel=1e-4)
        # the attended positions alone (padding left out) fit no reduction
        with pytest.raises(AssertionError, match="no candidate"):
            fingerprint(run.obs(key, _all_logits(name, padding=False), stored=key + "_sum"), window=WINDOWS,
                        rel=1e-4)
        p.check(True, f"{key}: the padding's logits are in the sum")
        padded = {int(c.forward[name].shape[1]) for c in run.calls if key + "_sum" in c.stored}
        p.check(len(padded) > 1, f"{key}: every micro-batch padded to one length: {padded}")


SFT = dict(per_device_train_batch_size=2, gradient_accumulation_steps=2, logging_steps=3, max_steps=9)
SFT_CONFIG = {k: SFT[k] for k in ("gradient_accumulation_steps", "logging_steps")}


@proof("trl", trainer="sft", release="0.25.1", config=SFT_CONFIG)
def test_sft_0_25_entropy_over_every_attended_token(p, tmp_path):
    """TRL 0.25.1's SFTTrainer (7 prompt-completion examples: micro-batches of 2 and 1): entropy is each micro-batch's
    token mean of the per-token entropy over its attention mask (the prompt's tokens included, not the label tokens
    only), gathered per process and averaged, appended once per micro-batch and averaged by log()."""
    from _support.fingerprint import fingerprint
    from _support.proofs_trl import masked, run_sft
    from _support.proofs_trl_old import fix_optional_imports
    fix_optional_imports()
    run = run_sft(tmp_path, n_examples=7, **SFT)
    calls = [c for c in run.calls if c.name == "compute_loss"]
    sizes = [int(c.locals["attention_mask"].shape[0]) for c in calls]
    p.check(set(sizes) == {1, 2}, f"micro-batches of 2 and 1 examples: {sizes}")

    def obs(values):
        return [(row["entropy"], run.steps(i, "compute_loss", values)) for i, (_s, row) in enumerate(run.train_rows())]
    p.assert_stated("entropy", obs(masked("per_token_entropy", "attention_mask")),
                    tokens=("token_mean", "seq_mean_token_mean"), mini=("none",), window=WINDOWS,
                    levels=("micro_batches", "window"), rel=1e-5)

    def labels_only(loc):
        x, lab = loc["per_token_entropy"].float(), loc["labels"]
        return [[float(v) for v in x[i][:-1][lab[i][1:] != -100]] for i in range(x.shape[0])]
    with pytest.raises(AssertionError, match="no candidate"):
        fingerprint(obs(labels_only), tokens=("token_mean", "seq_mean_token_mean"), mini=("none",), window=WINDOWS,
                    rel=1e-5)
    p.check(True, "the label tokens alone fit no reduction")


BCO = KTO
BCO_CONFIG = KTO_CONFIG


def _bco_obs(run, key: str, stored: str, values) -> list:
    """(logged value, batch) of every train row logging ``key``: its steps, each step's ``get_batch_loss_metrics``
    calls that stored ``stored``, each as ``values(its locals, the policy's get_batch_logps locals)`` (the first
    get_batch_logps call since the previous get_batch_loss_metrics: the policy's forward, before the reference's)."""
    pairs, logps = [], []
    for c in run.calls:
        if c.name == "get_batch_logps":
            logps.append(c)
        else:
            pairs.append((c, logps[0] if logps else None))
            logps = []
    out = []
    for i, (_s, row) in enumerate(run.train_rows()):
        if key not in row:
            continue
        first, last = run.windows[i]
        steps = []
        for step in range(first, last + 1):
            micro = [values(c.locals, pol.locals) for c, pol in pairs
                     if c.step == step and stored in c.locals["metrics"]]
            if micro:
                steps.append([[micro]])
        out.append((row[key], steps))
    assert out, f"no train row logged {key!r}"
    return out


def _assert_bco(p, tmp_path) -> None:
    import math

    from _support.proofs_trl_old2 import run_bco
    run = run_bco(tmp_path, n_examples=11, **BCO)
    metrics = [c for c in run.calls if c.name == "get_batch_loss_metrics"]
    p.check(len(run.windows) == 3 and len(metrics) == 18, f"{run.windows}, {len(metrics)} micro-batches")

    def split_rows(loc, chosen):
        return [i for i, lab in enumerate(loc["batch"]["label"]) if bool(lab) == chosen]

    def token_logps(chosen):
        def values(loc, pol):
            x, m = pol["per_token_logps"].float(), pol["loss_mask"].bool()
            return [[float(v) for v in x[i][m[i]]] for i in split_rows(loc, chosen)]
        return values

    for split, chosen in (("chosen", True), ("rejected", False)):
        # the undesirable examples: 2 in every step (2 | 1 + 1): their counts tell neither the window nor the
        # micro-batch level apart (the desirable ones do), their token counts the micro-batches
        levels = ("micro_batches", "window") if chosen else ("micro_batches",)
        p.assert_stated(f"rewards/{split}",
                        _bco_obs(run, f"rewards/{split}", f"rewards/{split}_sum",
                                 lambda loc, pol, s=split: [[float(v)] for v in loc[f"{s}_rewards"]]),
                        tokens=("per_seq",), window=WINDOWS, levels=levels if chosen else (), rel=1e-5)
        obs = _bco_obs(run, f"logps/{split}", f"logps/{split}_sum", token_logps(chosen))
        # the tokens' sums are the completion log-probs BCO reduced (the policy's get_batch_logps paired right)
        sums = [sum(sum(s) for s in micro) for _v, b in obs for step in b for micro in step[0][0]]
        want = [float(c.locals[f"policy_{split}_logps"].sum()) for c in metrics if f"logps/{split}_sum" in
                c.locals["metrics"]]
        p.check(all(math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-4) for a, b in zip(sums, want)), (sums, want))
        p.assert_stated(f"logps/{split}", obs, tokens=("seq_mean_token_sum", "token_mean", "seq_mean_token_mean"),
                        window=WINDOWS, levels=levels, rel=1e-5)
        p.assert_stated(f"logits/{split}",
                        _bco_obs(run, f"logits/{split}", f"logits/{split}_sum",
                                 lambda loc, pol, s=split: [[float(v) for v in row]
                                                            for row in loc[f"policy_{s}_logits"].float().sum(-1)]),
                        window=WINDOWS, levels=levels, rel=1e-4)
    # delta: the running mean of the rewards (BCO's RunningMoments), one value per micro-batch, averaged (2
    # micro-batches in every step: the window level is told from last and sum, not from a pooled mean)
    delta = _bco_obs(run, "delta", "delta", lambda loc, pol: [[float(loc["delta"])]])
    p.check(len({round(v, 9) for v, _b in delta}) > 1, "delta is the same in every row: weak")
    p.assert_stated("delta", delta, tokens=("none",), window=WINDOWS, levels=(), rel=1e-5)


@proof("trl", trainer="bco", release="0.25.1", config=BCO_CONFIG)
def test_bco_0_25_example_means_are_pooled_over_the_row(p, tmp_path):
    """TRL 0.25.1's BCOTrainer (trl.experimental.bco; no embedding function): rewards/*, logps/* (completion
    log-prob sums) and logits/* (every logit of the example summed) are stored per micro-batch as gathered sums with
    the example count, and log() divides the row's sums by its counts: a mean over every example of the row (the
    micro-batches and steps pooled); delta (the rewards' running mean) is averaged over the micro-batches."""
    _assert_bco(p, tmp_path)


@proof("trl", trainer="bco", release="1.12.0", config=BCO_CONFIG)
def test_bco_1_12_example_means_are_pooled_over_the_row(p, tmp_path):
    """TRL 1.12.0's BCOTrainer: the same code as 0.25.1's (sums and counts, pooled by log())."""
    _assert_bco(p, tmp_path)


DPO_IPO = {**DPO, "loss_type": "ipo"}
DPO_IPO_CONFIG = {**DPO_CONFIG, "loss_type": "ipo"}


@proof("trl", trainer="dpo", release="0.25.1", config=DPO_IPO_CONFIG)
def test_dpo_0_25_ipo_logs_length_normalised_logps(p, tmp_path):
    """loss_type ipo at 0.25.1: concatenated_forward divides each completion's log-prob sum by its token count
    (all_logps / loss_mask.sum(-1)) before returning it, so logps/* log the mean over pairs of each completion's token
    mean; the sums fit no reduction."""
    from _support.fingerprint import fingerprint
    from _support.proofs_trl_old2 import completion, run_dpo
    run = run_dpo(tmp_path, n_pairs=7, **DPO_IPO)
    p.check(len(run.windows) == 3 and len(run.calls) == 18, f"{run.windows}, {len(run.calls)} micro-batches")
    toks = ("seq_mean_token_sum", "token_mean", "seq_mean_token_mean")
    for key, chosen in (("logps/chosen", True), ("logps/rejected", False)):
        obs = run.obs(key, completion("per_token_logps", chosen, kept=True))
        p.assert_stated(key, obs, tokens=toks, window=WINDOWS, levels=("micro_batches", "window"), rel=1e-5)
        with pytest.raises(AssertionError, match="no candidate"):
            fingerprint(obs, tokens=("seq_mean_token_sum",), window=WINDOWS, rel=1e-5)
        p.check(True, f"{key}: the completions' sums fit no reduction")


GSPO = dict(gradient_accumulation_steps=2, logging_steps=3, max_steps=12, num_iterations=2, beta=0.1,
            epsilon=1e-3, epsilon_high=1e-3, per_device_train_batch_size=2, num_generations=2,
            importance_sampling_level="sequence_token")
GSPO_CONFIG = {k: GSPO[k] for k in ("gradient_accumulation_steps", "logging_steps", "num_iterations", "beta",
                                    "importance_sampling_level")}
TOKEN_CANDIDATES = ("token_mean", "seq_mean_token_mean")


@proof("trl", trainer="grpo_variants", release="0.25.1", config=GSPO_CONFIG)
def test_gspo_token_0_25_keys_of_the_window_run(p, tmp_path):
    """TRL 0.25.1's GSPO-token trainer (trl.experimental.gspo_token, importance_sampling_level sequence_token; its
    own _compute_loss): kl, entropy and clip_ratio/*_mean are each micro-batch's token mean over the completion
    tokens, gathered per process and averaged, then log() averages the row's micro-batches; the clip extremes the
    min (max) over processes of that mean; reward and reward_std (GRPO's generation code) the means over the row's
    generation batches of the rewards and of each completion's group std."""
    from _support.proofs_trl import masked, per_seq
    from _support.proofs_trl_old2 import run_gspo_token
    run = run_gspo_token(tmp_path, **GSPO)
    rows = run.train_rows()
    p.check(run.windows == [(1, 3), (4, 6), (7, 9), (10, 12)], f"four rows of three steps: {run.windows}")
    p.check(all(c.locals["log_importance_weights"].shape[1] > 1 for c in run.calls if c.name == "_compute_loss"),
            "sequence_token: a (B, T) importance weight")

    def obs(key, fn, values):
        out = [(row[key], run.steps(i, fn, values)) for i, (_s, row) in enumerate(rows) if key in row]
        assert out, key
        return out
    for key, tensor in (("kl", "per_token_kl"), ("entropy", "entropies"),
                        ("clip_ratio/region_mean", "is_region_clipped"), ("clip_ratio/low_mean", "is_low_clipped"),
                        ("clip_ratio/high_mean", "is_high_clipped"), ("clip_ratio/high_max", "is_high_clipped"),
                        ("clip_ratio/low_min", "is_low_clipped")):
        p.assert_stated(key, obs(key, "_compute_loss", masked(tensor, "completion_mask")), tokens=TOKEN_CANDIDATES,
                        mini=("none",), window=WINDOWS, levels=("micro_batches", "window"))
    p.check(any(r["clip_ratio/region_mean"] > 0 for _s, r in rows), "nothing was clipped: the proof would be weak")
    p.check(any(r["clip_ratio/high_max"] > 0 for _s, r in rows) and any(r["clip_ratio/low_min"] > 0 for _s, r in rows),
            "the clip extremes log 0 everywhere: weak")
    score = "_generate_and_score_completions"
    p.assert_stated("reward", obs("reward", score, per_seq("rewards")), tokens=("per_seq",), mini=("none",),
                    window=WINDOWS, levels=())
    p.assert_stated("reward_std", obs("reward_std", score, per_seq("std_rewards")), tokens=("per_seq",),
                    mini=("none",), window=WINDOWS, levels=())


DPO_LD = {**DPO, "loss_type": "ipo", "ld_alpha": 0.5}
DPO_LD_CONFIG = {**DPO_CONFIG, "loss_type": "ipo", "ld_alpha": 0.5}


def _ld_weighted(chosen: bool):
    """Each kept completion's per-token log-probs as concatenated_forward's LD-DPO sums weigh them: TRL's own front_mask
    (weight 1) and rear_mask (weight ld_alpha), at the positions either keeps."""
    from _support.proofs_trl_old2 import LOGPS_GATHER

    def values(loc):
        x, front, rear = loc["per_token_logps"].float(), loc["front_mask"], loc["rear_mask"]
        alpha = DPO_LD["ld_alpha"]
        n = int(loc["num_examples"])
        k = len(loc["_gathered"][LOGPS_GATHER])          # the pairs the gather kept (an epoch's end: the remainder)
        rows = range(k) if chosen else range(n, n + k)
        return [[float(x[i, j] * (front[i, j] + alpha * rear[i, j])) for j in range(x.shape[1])
                 if front[i, j] + rear[i, j] > 0] for i in rows]
    return values


@proof("trl", trainer="dpo", release="0.25.1", config=DPO_LD_CONFIG)
def test_dpo_0_25_ipo_with_ld_alpha_logs_the_ld_sums(p, tmp_path):
    """loss_type ipo with ld_alpha at 0.25.1: concatenated_forward replaces the (ipo-normalised) log-probs with the
    LD-DPO sums (front_logps + ld_alpha * rear_logps) for the policy, so logps/* log the mean over pairs of those
    sums, not length-normalised."""
    from _support.proofs_trl_old2 import run_dpo
    run = run_dpo(tmp_path, n_pairs=7, **DPO_LD)
    p.check(len(run.calls) == 18 and all("front_mask" in c.forward for c in run.calls), len(run.calls))
    p.check(any(bool((c.forward["rear_mask"] * (c.forward["per_token_logps"] != 0)).any()) for c in run.calls),
            "no token weighted by ld_alpha: weak")
    for key, chosen in (("logps/chosen", True), ("logps/rejected", False)):
        p.assert_stated(key, run.obs(key, _ld_weighted(chosen)),
                        tokens=("seq_mean_token_sum", "token_mean", "seq_mean_token_mean"), window=WINDOWS,
                        levels=("micro_batches", "window"), rel=1e-5)
