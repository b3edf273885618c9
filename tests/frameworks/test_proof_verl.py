"""Fingerprints of veRL 0.9.1 entries no proof had reached (issue 33 item 1): the V1 trainer's driver metrics of the
step's batch (``PPOTrainer._compute_metrics``: turns, off-policy staleness, speculative decoding), the data
metrics of a batch carrying tool-call counts (metric_utils ``compute_data_metrics``), the agent loop's timing
statistics (``AgentLoopManager._performance_metrics`` -> ``compute_timing_metrics``), validation turns
(``_val_metrics_update``), the rollout-correction KLs (rollout_corr_helper) and the SFT trainer's step
(``SFTTrainer.fit``'s metrics of ``TrainingWorker.train_batch`` with the real ``sft_loss`` on simulated ranks),
all run by the installed wheel's code (tests/_support/proofs_verl.py). What each logged value is compared with is
what veRL's code was *given* (the rows and tags in the transfer queue, the agent loop workers' per-sample metrics,
the per-token log-probabilities the tiny policy handed the loss), cut into uneven layouts so that a pooled value,
a mean of groups, a selection of one group or rank all give different numbers; it must be the reduction
mappings/verl.yaml states and no other. The entries of the list no proof here reaches: proofs_verl.ENTRY_WHY."""
from __future__ import annotations

import contextlib
import io
import statistics
import types
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("tensordict")
pytest.importorskip("verl", reason="make test installs verl --no-deps")

from _support import proofs_verl as V  # noqa: E402
from _support.fingerprint import Reduction, equivalent, fingerprint  # noqa: E402
from _support.proven import close, proof  # noqa: E402

ROLLOUT = V.UNEVEN
BASE = V.base_config(ROLLOUT)
LEGACY = dict(BASE, **{"trainer.use_v1": False})
DRIVER = ("micro_batches", "processes")        # a driver value over the whole batch could be split in these

_RUNS: dict = {}


# ------------------------------------------------------------------------------------------------ layouts
def layout(values: list, shares: tuple) -> list:
    """Values cut into uneven groups ([rank][group][item])."""
    out, i = [], 0
    for rank in shares:
        groups = []
        for size in rank:
            groups.append(values[i:i + size])
            i += size
        out.append(groups)
    assert i == len(values), (i, len(values))
    return out


def cuts(n: int) -> list[tuple]:
    """Uneven cuts of n items over two ranks (3 groups and 4 groups; the extremes alone at either end)."""
    a = n // 2 - 1                  # ranks of different sizes
    return [((a - 2, 1, 1), (1, n - a - 3, 2)), ((1, 1, a - 2), (2, 1, n - a - 3)),
            ((a - 1, 1), (1, 1, n - a - 2))]


def per_seq_observations(logged: float, values: list[float]) -> list:
    """The one logged value against layouts of the same per-sample values (as given, sorted up, sorted down; each
    cut several uneven ways): a value over the whole batch is the pooled one in every layout, while a selection
    (a group's extreme, the last group, rank 0's) or an unweighted mean of groups moves with the layout."""
    seqs = [[float(v)] for v in values]
    orders = (list(seqs), sorted(seqs), sorted(seqs, reverse=True))
    out = [(logged, [[layout(order, cut)]]) for order in orders for cut in cuts(len(seqs))]
    # many samples tie on an extreme (counts): every tie in one group, first of rank 0 or last of rank 1, so that
    # a group's, a rank's or the last group's selection misses it
    n = len(seqs)
    for order, ties in ((sorted(seqs), values.count(min(values))), (sorted(seqs, reverse=True),
                                                                      values.count(max(values)))):
        if 1 < ties < n - 4:
            out += [(logged, [[layout(order, ((ties, 1), (1, 1, n - ties - 3)))]]),
                    (logged, [[layout(order[::-1], ((1, 1, n - ties - 3), (1, ties)))]])]
    return out


def prove_per_sample_stats(p, prefix: str, logged: dict, values: list[float], *, mean_key: str | None = None,
                           stats=("mean", "max", "min")) -> None:
    """``{prefix}/{stat}`` over the samples: each of mean / max / min fingerprinted over the layouts; the mean
    asserted as the entry's stated reduction (``mean_key``: its key, when the entry is a ``{stat}`` template whose
    reduce: states the pooling, the segment naming the statistic), max and min checked to be the same population's
    extreme (pooled over every sample, no group, rank or selection)."""
    p.check(len(set(values)) > 2, f"{prefix}: the samples' values do not vary: {values}")
    for stat in stats:
        key = f"{prefix}/{stat}"
        obs = per_seq_observations(logged[key], values)
        if mean_key is None or stat == "mean":
            p.assert_stated(key, obs, levels=DRIVER, tokens=("per_seq",), stats=(stat,))
        else:
            found = fingerprint(obs, tokens=("per_seq",), stats=(stat,))
            pooled = Reduction("per_seq", stat, "none", "none", "none", "step")
            p.check(all(equivalent(found, pooled, batch) for _, batch in obs), (key, found))
        want = {"mean": statistics.fmean, "max": max, "min": min}[stat](values)
        p.check(close(logged[key], want), (key, logged[key], want))


# ------------------------------------------------------------------------------------------------ V1 driver step
class SpecStore(V.Store):
    """The transfer queue (proofs_verl.Store) with each row's ``extra_fields`` dict (the rollout's per-request
    speculative-decoding stats), returned as TransferQueue returns a non-tensor field: a list of the rows'
    objects behind ``.tolist()``."""

    def kv_batch_get(self, keys, partition_id=None, select_fields=None, **kw):
        if list(select_fields or []) == ["extra_fields"]:
            import numpy as np
            arr = np.empty(len(keys), dtype=object)
            arr[:] = [self.rows[k]["extra_fields"] for k in keys]
            return {"extra_fields": arr}
        return super().kv_batch_get(keys, partition_id=partition_id,
                                    select_fields=[f for f in select_fields if f != "extra_fields"], **kw)


# 16 rows; rows 5 and 12 are padding (the sync trainer's placeholders): extreme turns, versions and spec stats that
# would show if they were counted
PADDING = (5, 12)
TURNS = [1, 3, 2, 5, 1, 9, 4, 2, 1, 3, 6, 2, 0, 1, 2, 3]
MIN_VERSION = [3, 1, 4, 2, 4, 0, 3, 1, 2, 4, 4, 3, 0, 2, 1, 4]
MAX_VERSION = [4, 3, 4, 2, 4, 0, 4, 3, 2, 4, 4, 4, 0, 3, 1, 4]
GLOBAL_STEPS = 6
DRAFTS = [8, 12, 0, 6, 10, 40, 4, 9, 7, 11, 3, 5, 40, 6, 0, 8]
ACCEPTS = [5, 3, 0, 6, 2, 40, 1, 7, 2, 9, 3, 1, 40, 2, 0, 5]
VERIFIES = [3, 6, 0, 2, 5, 1, 4, 2, 5, 3, 1, 4, 1, 4, 0, 3]
MTP = {"actor_rollout_ref.model.mtp.enable": True, "actor_rollout_ref.model.mtp.enable_rollout": True}


def driver_step() -> dict[str, float]:
    """The V1 trainer's ``_compute_metrics`` (trainer_base.py, compiled from the wheel's text) on the 16 rows of
    ROLLOUT in the transfer queue, with TURNS as the rows' num_turns, the tags' generation versions, two padding
    rows and the rollout's speculative-decoding stats; the metrics it logged."""
    if "driver" in _RUNS:
        return _RUNS["driver"]
    from omegaconf import OmegaConf
    c = V.code()
    torch = c.torch
    r = ROLLOUT
    fields, _ = V._rollout_fields(r)
    fields["num_turns"] = [torch.tensor(t) for t in TURNS]
    fields["extra_fields"] = [{"spec_num_draft_tokens": d, "spec_num_accepted_tokens": a, "spec_num_verify_steps": v}
                              for d, a, v in zip(DRAFTS, ACCEPTS, VERIFIES)]
    store = SpecStore()
    keys = [f"k{i}" for i in range(r.n)]
    store.put_rows(keys, fields)
    config = V._config(V.actor_config(), r)
    config.actor_rollout_ref.model = OmegaConf.create({"mtp": {"enable": True, "enable_rollout": True}})
    trainer = types.SimpleNamespace(config=config, use_critic=False, _rollout_moe_lb_metrics_accumulator=None,
                                    _get_n_gpus_for_throughput=lambda: V.WORLD)
    tags = [{"min_global_steps": lo, "max_global_steps": hi, **({"is_padding": True} if i in PADDING else {})}
            for i, (lo, hi) in enumerate(zip(MIN_VERSION, MAX_VERSION))]
    meta = V.Meta(keys=keys, tags=tags)
    metrics: dict = {}
    with V._patched_ns(c.v1_ns, tq=store):
        c.v1["_compute_metrics"](trainer, meta, metrics, {"step": 1.0, "gen": 0.5}, global_steps=GLOBAL_STEPS,
                                 epoch=0)
    _RUNS["driver"] = {k: float(v) for k, v in metrics.items() if V._is_number(v)}
    return _RUNS["driver"]


def kept(values: list) -> list[float]:
    return [float(v) for i, v in enumerate(values) if i not in PADDING]


@proof("verl", trainer="ppo", release="0.9.1", config=BASE)
def test_training_num_turns_are_over_the_non_padding_samples(p):
    """training/num_turns/{mean,max,min} (trainer_base.py@v0.9.1:1952-1959): the rows' num_turns, the padding rows
    left out, reduced over the whole batch at once."""
    m = driver_step()
    turns = kept(TURNS)
    for stat in ("mean", "max", "min"):
        key = f"training/num_turns/{stat}"
        p.assert_stated(key, per_seq_observations(m[key], turns), levels=DRIVER, tokens=("per_seq",),
                        stats=(stat,))
    p.check(not close(m["training/num_turns/mean"], statistics.fmean(TURNS)), "the padding rows are counted")
    p.check(m["training/num_turns/max"] == 6 and m["training/num_turns/min"] == 1, m)


@proof("verl", trainer="ppo", release="0.9.1", config=BASE)
def test_off_policy_staleness_is_per_trajectory_over_the_batch(p):
    """training/off_policy/{trajectory_spans,trajectory_staleness,trajectory_staleness_worst}/{mean,max,min}
    (trainer_base.py@v0.9.1:1966-1993): per trajectory, from the versions its tags say it was generated across
    (max - min + 1; (global_steps - 1) - max; (global_steps - 1) - min), padding rows left out, over the batch."""
    m = driver_step()
    lo, hi = kept(MIN_VERSION), kept(MAX_VERSION)
    per = {"trajectory_spans": [b - a + 1 for a, b in zip(lo, hi)],
           "trajectory_staleness": [GLOBAL_STEPS - 1 - b for b in hi],
           "trajectory_staleness_worst": [GLOBAL_STEPS - 1 - a for a in lo]}
    for name, values in per.items():
        prove_per_sample_stats(p, f"training/off_policy/{name}", m, values, mean_key="mean")
    p.check(not close(m["training/off_policy/trajectory_staleness/mean"],
                      statistics.fmean(GLOBAL_STEPS - 1 - b for b in MAX_VERSION)), "the padding rows are counted")
    p.check(m["training/off_policy/trajectory_staleness/min"] >= 0, "a staleness below 0: the version units moved")


@proof("verl", trainer="ppo", release="0.9.1", config=dict(BASE, **MTP))
def test_spec_decode_rates_are_per_request_means(p):
    """rollout/spec_accept_rate and rollout/spec_accept_length (trainer_base.py@v0.9.1:1900-1964 ->
    ray_trainer.py@v0.9.1 compute_spec_decode_metrics): per request accepted / drafted tokens and 1 + accepted /
    verify steps (0 for a request with none), padding rows left out, the mean over requests: not the ratio of the
    batch's totals."""
    m = driver_step()
    d, a, v = kept(DRAFTS), kept(ACCEPTS), kept(VERIFIES)
    p.check(0 in d and 0 in v, "no request without drafts: the zero case is not exercised")
    rate = [x / y if y > 0 else 0.0 for x, y in zip(a, d)]
    length = [1.0 + x / y if y > 0 else 0.0 for x, y in zip(a, v)]
    p.assert_stated("rollout/spec_accept_rate", per_seq_observations(m["rollout/spec_accept_rate"], rate),
                    levels=DRIVER, tokens=("per_seq",))
    p.assert_stated("rollout/spec_accept_length", per_seq_observations(m["rollout/spec_accept_length"], length),
                    levels=DRIVER, tokens=("per_seq",))
    p.check(not close(m["rollout/spec_accept_rate"], sum(a) / sum(d)), "the ratio of totals")
    p.check(not close(m["rollout/spec_accept_length"], 1 + sum(a) / sum(v)), "the ratio of totals")


# ------------------------------------------------------------------------------------------------ tool calls
def tool_call_batch():
    """A padded batch as compute_data_metrics gets it (the legacy trainer's, legacy_data_metrics' layout) with the
    rollout's per-sample ``tool_call_counts`` in the non-tensor batch (as the deepeyes recipe's agent loop puts it)."""
    import numpy as np
    c = V.code()
    torch = c.torch
    r = ROLLOUT
    fields, _ = V._rollout_fields(r)
    n, P, W = r.n, V.MAX_PROMPT, V.MAX_RESPONSE
    attn = torch.zeros(n, P + W, dtype=torch.long)
    resp_mask = torch.zeros(n, W, dtype=torch.long)
    scores = torch.zeros(n, W)
    for i in range(n):
        p_, k = r.prompt_lens[i], r.resp_lens[i]
        attn[i, P - p_:P] = 1
        attn[i, P:P + k] = 1
        resp_mask[i, :k] = fields["response_mask"][i]
        scores[i, :k] = fields["rm_scores"][i]
    td = c.TensorDict({"prompts": torch.full((n, P), 5), "responses": torch.full((n, W), 5), "attention_mask": attn,
                       "response_mask": resp_mask, "token_level_scores": scores, "token_level_rewards": scores,
                       "advantages": scores, "returns": scores}, batch_size=[n])
    calls = [0, 2, 1, 4, 0, 1, 3, 0, 0, 2, 0, 1, 3, 0, 7, 0]
    data = c.DataProto(batch=td, non_tensor_batch={"tool_call_counts": np.array(calls)})
    return data, calls


@proof("verl", trainer="ppo", release="0.9.1", config=LEGACY)
def test_tool_call_counts_are_per_sample_over_the_batch(p):
    """tool_call_counts/{mean,max,min} (metric_utils.py@v0.9.1:602-606 compute_data_metrics): the per-sample counts
    the rollout put in the batch, reduced over the whole batch at once."""
    c = V.code()
    data, calls = tool_call_batch()
    m = {k: float(v) for k, v in c.metric_utils.compute_data_metrics(data, use_critic=False).items()
         if V._is_number(v)}
    for stat in ("mean", "max", "min"):
        key = f"tool_call_counts/{stat}"
        p.assert_stated(key, per_seq_observations(m[key], calls), levels=DRIVER, tokens=("per_seq",), stats=(stat,))
    p.check(m["tool_call_counts/max"] == 7 and m["tool_call_counts/min"] == 0, m)


# ------------------------------------------------------------------------------------------------ agent loop timing
# per sample (16, two agent loop workers of 8): generate, tool-call and scoring seconds and preemptions; the slowest
# sample by their sum (row 9) is neither the longest generation (row 3) nor the longest tool call (row 14)
T_GEN = [1.2, 0.8, 2.1, 4.0, 0.5, 1.7, 2.6, 0.9, 1.1, 3.1, 0.7, 1.9, 2.2, 0.6, 1.0, 1.4]
T_TOOL = [0.0, 0.4, 0.0, 0.1, 0.0, 0.3, 0.0, 0.0, 0.0, 1.6, 0.0, 0.0, 0.5, 0.0, 2.9, 0.0]
T_SCORE = [0.05, 0.02, 0.08, 0.01, 0.03, 0.04, 0.07, 0.02, 0.05, 0.6, 0.03, 0.02, 0.06, 0.01, 0.09, 0.04]
PREEMPTED = [0, 1, 0, 2, 0, 0, 3, 0, 1, 4, 0, 0, 2, 0, 0, 1]
SLOWEST = 9


def agent_loop_metrics() -> tuple[dict[str, float], list]:
    """``AgentLoopManager._performance_metrics`` (experimental/agent_loop/agent_loop.py, the wheel's own method) on
    the two workers' per-sample metrics and the concatenated output batch, then ``compute_timing_metrics`` on the
    timings the legacy trainer merges into timing_raw (ray_trainer.py@v0.9.1:1518); the logged metrics and the
    per-worker samples it was given."""
    import os
    os.environ.setdefault("VERL_USE_EXTERNAL_PLUGINS", "none")
    from verl.experimental.agent_loop.agent_loop import AgentLoopManager
    c = V.code()
    data, _ = tool_call_batch()
    rows = [{"generate_sequences": g, "tool_calls": t, "compute_score": s, "num_preempted": k}
            for g, t, s, k in zip(T_GEN, T_TOOL, T_SCORE, PREEMPTED)]
    chunks = [rows[:8], rows[8:]]
    timing = AgentLoopManager._performance_metrics(None, chunks, data)
    timing_raw = {"gen": 5.0, **timing}
    out = c.metric_utils.compute_timing_metrics(batch=data, timing_raw=timing_raw)
    return {k: float(v) for k, v in out.items()}, chunks


@proof("verl", trainer="ppo", release="0.9.1", config=LEGACY)
def test_agent_loop_timing_stats_are_over_the_batchs_samples(p):
    """timing_s/agent_loop/{generate_sequences,tool_calls,compute_score,num_preempted}/{mean,max,min}: the agent
    loop workers' per-sample metrics concatenated (agent_loop.py@v0.9.1:1263-1280), each statistic over all the
    batch's samples at once, not per worker; seconds as timed (no unit change), preemptions as counted."""
    m, chunks = agent_loop_metrics()
    for name, values in (("generate_sequences", T_GEN), ("tool_calls", T_TOOL), ("compute_score", T_SCORE),
                         ("num_preempted", PREEMPTED)):
        prove_per_sample_stats(p, f"timing_s/agent_loop/{name}", m, [float(v) for v in values], mean_key="mean")
        p.check(not close(m[f"timing_s/agent_loop/{name}/mean"], statistics.fmean(values) * 1000), name)
    p.check([len(ch) for ch in chunks] == [8, 8], "the workers' chunks")


@proof("verl", trainer="ppo", release="0.9.1", config=LEGACY)
def test_agent_loop_slowest_sample_is_the_longest_total(p):
    """timing_s/agent_loop/slowest/*: the values of the one sample whose generate + tool-call + scoring seconds are
    the largest (agent_loop.py@v0.9.1:1282-1293): its own seconds, preemptions and (from the output's attention
    mask) prompt and response token counts, not each quantity's own maximum."""
    m, _ = agent_loop_metrics()
    totals = [g + t + s for g, t, s in zip(T_GEN, T_TOOL, T_SCORE)]
    p.check(totals.index(max(totals)) == SLOWEST, totals)
    r = ROLLOUT
    given = {"generate_sequences": T_GEN, "tool_calls": T_TOOL, "compute_score": T_SCORE,
             "num_preempted": PREEMPTED, "prompt_length": r.prompt_lens, "response_length": r.resp_lens}
    for name, values in given.items():
        key = f"timing_s/agent_loop/slowest/{name}"
        p.assert_stated(key, m[key], [[[[[[float(values[SLOWEST])]]]]]], levels=())
        p.check(close(m[key], float(values[SLOWEST])), (key, m[key]))
    p.check(not close(m["timing_s/agent_loop/slowest/generate_sequences"], max(T_GEN)), "the largest generation")
    p.check(not close(m["timing_s/agent_loop/slowest/tool_calls"], max(T_TOOL)), "the largest tool call")
    p.check(not close(m["timing_s/agent_loop/slowest/response_length"], max(r.resp_lens)), "the longest response")
    p.check(not close(m["timing_s/agent_loop/slowest/prompt_length"], V.MAX_PROMPT), "the padded prompt width")


# ------------------------------------------------------------------------------------------------ validation
def validation(turns: list[int]) -> dict[str, float]:
    """``_val_metrics_update`` (trainer_base.py@v0.9.1, proofs_verl.val_metrics_update) on 8 prompts x 2 samples
    of one data source and the samples' turns."""
    uids = [f"q{i // 2}" for i in range(len(turns))]
    ds = ["openai/gsm8k"] * len(turns)
    infos = {"reward": [float((i * 7) % 5) / 4 for i in range(len(turns))]}
    out = V.val_metrics_update()(types.SimpleNamespace(), ds, uids, infos, list(turns))
    return {k: float(v) for k, v in out.items()}


VAL_TURNS = [1, 3, 2, 2, 5, 1, 1, 4, 2, 1, 6, 3, 1, 2, 1, 2]


@proof("verl", trainer="ppo", release="0.9.1", config=BASE)
def test_validation_turns_are_per_sample_over_the_validation_set(p):
    """val-aux/num_turns/{mean,max,min} (trainer_base.py@v0.9.1:1373-1377): the validation samples' turns, each
    statistic over all samples at once (not per prompt first)."""
    m = validation(VAL_TURNS)
    prove_per_sample_stats(p, "val-aux/num_turns", m, [float(t) for t in VAL_TURNS], mean_key="mean")
    per_prompt = [statistics.fmean(VAL_TURNS[i:i + 3]) for i in range(0, len(VAL_TURNS), 3)]
    p.check(not close(m["val-aux/num_turns/mean"], statistics.fmean(per_prompt)), "a mean of groups")


def test_validation_std_and_worst_never_go_to_val_core():
    """val-core/{ds}/{var}/std@{n} and worst@{n}/{mean,std}: _val_metrics_update (trainer_base.py@v0.9.1:1362-1369)
    puts only mean@, maj@ and best@ of the core variable at the largest n in val-core; std@ and worst@ always go to
    val-aux, so veRL 0.9.1 never logs these val-core keys (proofs_verl.ENTRY_WHY)."""
    m = validation(VAL_TURNS)
    assert any(k.startswith("val-aux/openai/gsm8k/reward/std@") for k in m), sorted(m)
    assert any(k.startswith("val-aux/openai/gsm8k/reward/worst@") for k in m), sorted(m)
    assert not [k for k in m if k.startswith("val-core/") and ("/std@" in k or "/worst@" in k)], sorted(m)
    assert any(k.startswith("val-core/openai/gsm8k/reward/mean@") for k in m), sorted(m)


# ------------------------------------------------------------------------------------------------ SFT trainer
class SFTPolicy:
    """The tiny policy of proofs_verl.TinyPolicy for SFT data: per token of each sequence (``seq_id``) the
    log-probability ``base + w * feature + b`` (two trainable scalars, so the optimizer step moves it); it records
    every output it hands the loss (per call: the sequences' ids, log-probs and loss masks)."""

    def __init__(self, base, feature):
        torch = V.code().torch
        self.base, self.feature = base, feature
        self.module = torch.nn.Linear(1, 1)
        with torch.no_grad():
            self.module.weight.fill_(0.3)
            self.module.bias.fill_(-0.1)
        self.calls: list[dict] = []

    def __call__(self, micro_batch, calculate_entropy: bool):
        torch = V.code().torch
        w, b = self.module.weight[0, 0], self.module.bias[0]
        lens = micro_batch["input_ids"].offsets().diff().tolist()
        ids = micro_batch["seq_id"].tolist()
        lps = [self.base[i, :n] + w * self.feature[i, :n] + b for i, n in zip(ids, lens)]
        masks = [m.tolist() for m in micro_batch["loss_mask"].unbind()]
        self.calls.append({"ids": ids, "log_probs": [lp.detach().tolist() for lp in lps], "loss_mask": masks})
        return {"log_probs": torch.nested.as_nested_tensor(lps, layout=torch.jagged)}


class Tracking:
    """veRL's Tracking as the SFT trainer calls it (rank 0): every ``log(data, step)`` kept."""

    logged: list = []

    def __init__(self, **kw):
        Tracking.logged = []

    def log(self, data, step):
        Tracking.logged.append((step, {k: float(v) for k, v in data.items()}))


# 2 training steps of 8 sequences (4 per rank, micro-batches of 2) and 2 validation batches of 8, all ragged; every
# sequence's first token is prompt (loss_mask 0), so veRL's one-token roll of the flattened mask stays inside it
SFT_LENS = [[5, 9, 3, 7, 4, 11, 6, 2], [8, 3, 10, 5, 2, 6, 9, 6]]
SFT_PROMPTS = [[2, 3, 1, 4, 2, 5, 3, 1], [3, 1, 4, 2, 1, 3, 2, 2]]
VAL_LENS = [[6, 2, 9, 4, 3, 8, 5, 7], [4, 10, 3, 6, 7, 2, 5, 9]]
VAL_PROMPTS = [[2, 1, 3, 2, 1, 4, 2, 3], [1, 4, 2, 3, 2, 1, 2, 4]]
SFT_MICRO, SFT_LR, SFT_CLIP = 2, 0.5, 0.05
SFT_CONFIG = {"data.train_batch_size": 8, "data.micro_batch_size_per_gpu": SFT_MICRO, "trainer.n_gpus_per_node": 2,
              "trainer.nnodes": 1, "data.use_dynamic_bsz": False, "trainer.total_epochs": 1}


@dataclass
class SFTRun:
    logged: list                        # (step, metrics) as the SFT trainer logged them (rank 0)
    policies: list                      # per rank: SFTPolicy (its calls: what the loss was given)
    grad_norms: dict                    # per rank: the pre-clip norms clip_grad_norm_ returned
    lrs_used: dict                      # per rank: the learning rate each optimizer step used
    lr_after: float                     # the scheduler's learning rate after the run
    seqlens: list                       # per training step: the sequence lengths of the global batch
    readings: "Readings | None" = None  # the workers' readings (sft_run(table))


def _sft_batches(lens: list, prompts: list, offset: int, rank: int):
    """Rank ``rank``'s share (contiguous halves, as DistributedSampler without shuffle) of each global batch as the
    collator hands it to fit (a dict: nested input_ids, position_ids, loss_mask) plus each sequence's id."""
    c = V.code()
    torch = c.torch
    out = []
    for b, (ls, ps) in enumerate(zip(lens, prompts)):
        half = len(ls) // 2
        idx = range(rank * half, (rank + 1) * half)
        ids = [offset + b * len(ls) + i for i in idx]
        input_ids = [torch.arange(ls[i]) % 13 + 3 for i in idx]
        masks = [torch.tensor([0] * ps[i] + [1] * (ls[i] - ps[i])) for i in idx]
        nested = lambda xs: torch.nested.as_nested_tensor(xs, layout=torch.jagged)  # noqa: E731
        out.append({"input_ids": nested(input_ids), "position_ids": nested([torch.arange(ls[i]) for i in idx]),
                    "loss_mask": nested(masks), "seq_id": torch.tensor(ids)})
    return out


@contextlib.contextmanager
def _sft_dist():
    """proofs_verl.simulated_dist plus the two collectives the SFT trainer adds: ``all_gather_into_tensor`` (its
    _get_batch_seqlens) and ``barrier`` (after validation)."""
    import torch.distributed as dist

    from _support import framework_code as F

    def all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op=False):
        g, r = F.current_rank()
        parts = g.exchange(r, input_tensor.detach().clone())
        output_tensor.copy_(V.code().torch.cat(parts))

    def barrier(group=None, **kw):
        g, r = F.current_rank()
        g.exchange(r, None)

    with V.simulated_dist(), V._patched(dist, all_gather_into_tensor=all_gather_into_tensor, barrier=barrier):
        yield


def sft_run(table: list | None = None) -> SFTRun:
    """``SFTTrainer.fit`` and ``_get_batch_seqlens`` (trainer/sft_trainer.py, compiled from the wheel's text) on
    2 simulated ranks for 2 steps and a validation at the last, each rank's trainer driving a real TrainingWorker
    (engine_workers.py: train_batch / infer_batch / _postprocess_output) with veRL's own sft_loss
    (``partial(sft_loss, config=None)``, as SFTTrainer._build_engine) over proofs_verl's FSDP engine methods; what
    rank 0 logged, and what veRL computed on the way. ``table``: the workers' device, host and flops readings
    answered by :class:`Readings` with it (recorded in ``SFTRun.readings``)."""
    key = ("sft", None if table is None else str(table))
    if key in _RUNS:
        return _RUNS[key]
    rd = Readings(table) if table is not None else None
    from functools import partial

    import verl
    from omegaconf import OmegaConf
    from tensordict.tensorclass import NonTensorData
    c = V.code()
    torch = c.torch
    root = Path(verl.__file__).resolve().parent
    ns = {"torch": torch, "tu": c.tu, "NonTensorData": NonTensorData, "Tracking": Tracking, "OmegaConf": OmegaConf,
          "tqdm": lambda it, **kw: it, "log_with_rank": lambda *a, **kw: None,
          "aggressive_empty_cache": lambda **kw: None, "log_gpu_memory_usage": lambda *a, **kw: None,
          "logger": None}
    fns = V._compile(root / "trainer/sft_trainer.py", ["fit", "_get_batch_seqlens"], ns, cls="SFTTrainer")
    n_seq = sum(len(x) for x in SFT_LENS + VAL_LENS)
    g = torch.Generator().manual_seed(21)
    width = max(max(x) for x in SFT_LENS + VAL_LENS)
    base = -torch.rand(n_seq, width, generator=g) * 2 - 0.1
    feature = torch.randn(n_seq, width, generator=g) + 0.5
    policies = [SFTPolicy(base, feature) for _ in range(V.WORLD)]
    ocfg = c.FSDPOptimizerConfig(lr=SFT_LR, lr_scheduler_type="cosine", total_training_steps=len(SFT_LENS),
                                 clip_grad=SFT_CLIP)
    cap = V.Capture()
    engines: list = [None] * V.WORLD
    config = OmegaConf.create({
        "trainer": {"project_name": "p", "experiment_name": "e", "logger": ["console"], "total_epochs": 1},
        "model": {"use_remove_padding": True},
        "data": {"use_dynamic_bsz": False, "max_token_len_per_gpu": 4096, "micro_batch_size_per_gpu": SFT_MICRO,
                 "pad_mode": "no_padding"}})
    train_worker = V._method(c.engine_workers.TrainingWorker, "train_batch")
    infer_worker = V._method(c.engine_workers.TrainingWorker, "infer_batch")
    real_clip = torch.nn.utils.clip_grad_norm_

    def clip(params, max_norm, *a, **kw):
        from _support import framework_code as F
        norm = real_clip(params, max_norm, *a, **kw)
        cap.grad_norms[F.current_rank()[1]].append(float(norm))
        return norm

    def body(rank: int):
        engine = V.Engine(policies[rank], rank, ocfg, cap, SFT_MICRO)
        engines[rank] = engine
        w = V.worker(engine, partial(c.losses.sft_loss, config=None), SFT_MICRO)
        if rd is not None:
            w.flops_counter = rd.flops()
        client = types.SimpleNamespace(train_batch=lambda data: train_worker(w, data),
                                       infer_batch=lambda data: infer_worker(w, data),
                                       step_profile=lambda: None, start_profile=lambda: None,
                                       stop_profile=lambda: None)
        train = _sft_batches(SFT_LENS, SFT_PROMPTS, 0, rank)
        val = _sft_batches(VAL_LENS, VAL_PROMPTS, sum(len(x) for x in SFT_LENS), rank)
        trainer = types.SimpleNamespace(
            engine=engine, config=config, resume_global_step=0, steps_per_epoch=len(train),
            total_training_steps=len(train), train_sampler=types.SimpleNamespace(set_epoch=lambda epoch: None),
            train_dataloader=train, val_dataloader=val, test_freq=len(train), save_freq=100,
            ckpt_handler=types.SimpleNamespace(save_checkpoint=lambda step: None), start_profile_step=None,
            end_profile_step=None, training_client=client, global_batch_size=len(SFT_LENS[0]),
            model_config=types.SimpleNamespace(tokenizer=types.SimpleNamespace(pad_token_id=0)),
            device_name="cpu", rank=rank)
        trainer._get_batch_seqlens = types.MethodType(fns["_get_batch_seqlens"], trainer)
        fns["fit"](trainer)

    from _support import framework_code as F
    hw = {} if rd is None else {"psutil": rd.psutil()}
    with _sft_dist(), V._patched(c.engine_workers, get_torch_device=rd.device if rd else lambda: V._Device(), **hw), \
            V._patched(torch.nn.utils, clip_grad_norm_=clip), contextlib.redirect_stdout(io.StringIO()):
        F.run_ranks(body, V.WORLD)
    _RUNS[key] = SFTRun(readings=rd, logged=list(Tracking.logged), policies=policies, grad_norms=dict(cap.grad_norms),
                          lrs_used=dict(cap.lrs_used), lr_after=float(engines[0].lr_scheduler.get_last_lr()[0]),
                          seqlens=[list(x) for x in SFT_LENS])
    return _RUNS[key]


def nll_tokens(call: dict) -> list[list[float]]:
    """Per sequence of one loss call, the values veRL's sft_loss sums: -log p at the positions whose (one token
    left-rolled) loss mask is 1."""
    out = []
    for lp, mask in zip(call["log_probs"], call["loss_mask"]):
        assert mask[0] == 0, "a sequence whose first token is trained: the roll would cross sequences"
        rolled = mask[1:] + [0]
        out.append([-v for v, m in zip(lp, rolled) if m])
    return out


def sft_batch(run: SFTRun, calls: slice) -> list:
    """``[mini-batch][rank][micro-batch]`` of the per-token NLL of the loss calls ``calls`` (per rank, in order),
    grouped by the batch each belongs to (2 micro-batches per rank and batch)."""
    per_rank = [[nll_tokens(call) for call in pol.calls[calls]] for pol in run.policies]
    n = len(per_rank[0]) // 2
    return [[per_rank[r][2 * b:2 * b + 2] for r in range(V.WORLD)] for b in range(n)]


@proof("verl", trainer="sft_engine", release="0.9.1", config=SFT_CONFIG)
def test_sft_loss_is_the_global_batchs_token_mean(p):
    """train/loss (sft_trainer.py@v0.9.1:396-401 <- engine_workers.py@v0.9.1:195-199 <- losses.py@v0.9.1:49): each
    micro-batch's NLL token sum over the global batch's token count times dp_size, summed over the rank's
    micro-batches and averaged over ranks: the token mean of the step's whole batch, a positive NLL."""
    run = sft_run()
    steps = [s for s, m in run.logged if "train/loss" in m]
    p.check(steps == [1, 2], run.logged)
    obs = []
    for i, (step, m) in enumerate([(s, m) for s, m in run.logged if "train/loss" in m]):
        batch = sft_batch(run, slice(2 * i, 2 * i + 2))
        p.check(len(batch) == 1, "one optimizer step per SFT step")
        obs.append((m["train/loss"], [batch]))
        flat = [v for r in batch[0] for u in r for s in u for v in s]
        p.check(m["train/loss"] > 0 and not close(m["train/loss"], -statistics.fmean(flat)), "the NLL's sign")
    p.assert_stated("train/loss", obs, levels=("micro_batches", "processes"),
                    tokens=("token_mean", "seq_mean_token_mean", "seq_mean_token_sum"))


@proof("verl", trainer="sft_engine", release="0.9.1", config=SFT_CONFIG)
def test_sft_val_loss_averages_the_validation_batches(p):
    """val/loss (sft_trainer.py@v0.9.1:410-437): per validation batch the worker's loss (infer_batch -> sft_loss:
    the batch's token mean over ranks), the unweighted mean over batches (torch.mean of val_losses), then averaged
    over the data-parallel group."""
    run = sft_run()
    val = [(s, m) for s, m in run.logged if "val/loss" in m]
    p.check([s for s, _ in val] == [2], run.logged)
    n_train = 2 * len(SFT_LENS)                     # the loss calls of training, per rank (2 micro-batches a step)
    batch = sft_batch(run, slice(n_train, None))
    p.check(len(batch) == len(VAL_LENS), "the validation batches")
    p.assert_stated("val/loss", val[0][1]["val/loss"], [batch], levels=("micro_batches", "mini_batches", "processes"),
                    tokens=("token_mean", "seq_mean_token_mean", "seq_mean_token_sum"))
    p.check(val[0][1]["val/loss"] > 0, "the NLL's sign")


@proof("verl", trainer="sft_engine", release="0.9.1", config=SFT_CONFIG)
def test_sft_grad_norm_and_lr_are_the_steps_own(p):
    """train/grad_norm: the pre-clip norm the step's one optimizer step got back from clip_grad_norm_ (the same on
    every rank after the gradient averaging); train/lr: the scheduler's rate after its step (worker
    lr_scheduler_step(), engine_workers.py@v0.9.1:373-384), not the rate the optimizer stepped with."""
    run = sft_run()
    rows = [m for _, m in run.logged if "train/loss" in m]
    for i, m in enumerate(rows):
        norms = [run.grad_norms[r][i] for r in range(V.WORLD)]
        p.check(all(close(x, norms[0]) for x in norms), norms)
        p.assert_stated("train/grad_norm", m["train/grad_norm"], [[[[[[norms[0]]]]]]], levels=())
        p.check(norms[0] > SFT_CLIP and not close(m["train/grad_norm"], SFT_CLIP),
                "the norm is not above clip_grad: pre- and post-clip norms coincide")
        p.check(not close(norms[0], 1.0), "a unit norm: the bias gradient alone")
    p.check(not close(rows[0]["train/grad_norm"], rows[1]["train/grad_norm"]), "the steps' norms coincide")
    used = run.lrs_used[0]
    p.check(len(used) == 2 and close(used[0], SFT_LR), used)
    # the rate after step 1 is the rate step 2 used; after step 2, the scheduler's last
    after = [used[1], run.lr_after]
    for m, lr, lr_used in zip(rows, after, used):
        p.assert_stated("train/lr", m["train/lr"], [[[[[[lr]]]]]], levels=())
        p.check(not close(m["train/lr"], lr_used), ("train/lr is the rate the step used", m["train/lr"], lr_used))


@proof("verl", trainer="sft_engine", release="0.9.1", config=SFT_CONFIG)
def test_sft_token_counts_are_the_global_batchs(p):
    """train/global_tokens: the global batch's sequence lengths (gathered over ranks by _get_batch_seqlens) summed;
    train/total_tokens(B): their running sum over the steps, in billions (the entry's scale 1e9)."""
    run = sft_run()
    rows = [m for _, m in run.logged if "train/loss" in m]
    total = 0
    for m, lens in zip(rows, run.seqlens):
        total += sum(lens)
        p.assert_stated("train/global_tokens", m["train/global_tokens"], [[[[[[float(sum(lens))]]]]]], levels=())
        p.check(not close(m["train/global_tokens"], sum(lens) / V.WORLD), "one rank's tokens")
        p.assert_stated("train/total_tokens(B)", m["train/total_tokens(B)"], [[[[[[total / 1e9]]]]]], levels=())
        entry, _ = p.entry("train/total_tokens(B)")
        p.check(entry.scale == 1e9 and close(m["train/total_tokens(B)"] * entry.scale, total), (entry.scale, total))
    p.check(not close(rows[1]["train/total_tokens(B)"] * 1e9, rows[1]["train/global_tokens"]), "not a running sum")


# ------------------------------------------------------------------------------------------------ worker readings
# per rank, per reading (the old-log-prob pass, the critic's 4 optimizer steps, the actor's 4), in GiB
READINGS = [[0.4, 2.9, 1.1, 3.6, 0.2, 1.3, 3.1, 0.6, 2.2], [1.5, 0.8, 3.9, 2.4, 1.7, 2.7, 0.9, 3.4, 1.2]]


class Readings:
    """The device, host and flops readings the engine worker's ``_postprocess_output`` takes once per call
    (engine_workers.py@v0.9.1:219-233), answered with a different number on every rank and call and recorded in
    the order taken: torch's peak allocated / reserved bytes, psutil's used memory, and the flops counter's
    (estimated, promised) flops (each rank's own: the counter divides by the rank's own timer of the step).
    The readings themselves are the device's and the wall clock's; what runs is veRL's code that carries them to
    the logged keys (rank 0's metrics, reduce_metrics over the mini-batches)."""

    def __init__(self, table: list):
        self.table = table
        self.taken: dict[tuple[str, int], list[float]] = {}

    def value(self, what: str) -> float:
        from _support import framework_code as F
        rank = F.current_rank()[1]
        seen = self.taken.setdefault((what, rank), [])
        k = len(seen)
        # rank 0's extreme is neither the last nor over the ranks
        v = self.table[rank][k % len(self.table[rank])] + {"allocated": 0.0, "reserved": 0.35, "cpu": 7.0,
                                                           "flops": 11.0}[what]
        seen.append(v)
        return v

    def device(self):
        readings = self

        class Device:
            def max_memory_allocated(self):
                return readings.value("allocated") * 1024 ** 3

            def max_memory_reserved(self):
                return readings.value("reserved") * 1024 ** 3
        return Device()

    def psutil(self):
        readings = self
        return types.SimpleNamespace(
            virtual_memory=lambda: types.SimpleNamespace(used=readings.value("cpu") * 1024 ** 3))

    def flops(self):
        readings = self

        class Flops:
            def estimate_flops(self, tokens, delta_time, images_seqlens=None):
                return readings.value("flops") * 1e12, 1e14
        return Flops()


def readings_step(swap: bool = False):
    """One V1 training step with a critic (proofs_verl.run_step: old-log-prob pass, critic update, actor update),
    the workers' readings answered by :class:`Readings` (``swap``: the ranks' tables swapped, so that rank 0's
    reading is the larger in one run and the smaller in the other); the logged metrics, the readings."""
    if ("readings", swap) in _RUNS:
        return _RUNS[("readings", swap)]
    c = V.code()
    rd = Readings(READINGS[::-1] if swap else READINGS)
    real_worker = V.worker

    def worker(engine, loss_fn, micro_size):
        w = real_worker(engine, loss_fn, micro_size)
        w.flops_counter = rd.flops()
        return w

    def same(a: dict, b: dict) -> bool:     # the run's check that the ranks agree, less the ranks' own MFU readings
        return set(a) == set(b) and all(str(a[k]) == str(b[k]) for k in a if "memory" not in k and "mfu" not in k)

    with V._patched(V, _Device=rd.device, worker=worker, _same=same), \
            V._patched(c.engine_workers, psutil=rd.psutil()):
        run = V.run_step(ROLLOUT, mini_batch_size=V.MINI, micro_size=V.MICRO, epochs=V.EPOCHS, critic=True)
    _RUNS[("readings", swap)] = (run, rd)
    return run, rd


def per_step_rank(values_by_rank: list[list[float]]) -> list:
    """``steps[0][optimizer step][rank] = [[[value]]]``: one reading per optimizer step and rank."""
    return [[[[[[v]]] for v in step] for step in zip(*values_by_rank)]]


@proof("verl", trainer="ppo", release="0.9.1", config=BASE)
def test_worker_memory_readings_are_rank_zeros_over_the_mini_batches(p):
    """actor/ and critic/perf/max_memory_allocated_gb, max_memory_reserved_gb and cpu_memory_used_gb: each optimizer
    step's reading (in GiB) taken after the metrics' all-gather, so only rank 0's reaches the driver (the single
    controller keeps the first rank's batch-less metrics), then reduce_metrics over the step's mini-batches x
    epochs: the max for the keys containing 'max', the mean for cpu_memory_used_gb (engine_workers.py@v0.9.1:
    218-221, 322-335; trainer_base.py@v0.9.1 _update_actor / _update_critic; metric/utils.py reduce_metrics)."""
    runs = [readings_step(False), readings_step(True)]
    n = runs[0][0].n_opt_steps
    # per rank the readings in order: the old-log-prob pass (1), the critic's optimizer steps (n), the actor's (n);
    # two runs, the ranks' readings swapped: with two ranks rank 0's is the larger of the two in one of them
    for what, name in (("allocated", "max_memory_allocated_gb"), ("reserved", "max_memory_reserved_gb"),
                       ("cpu", "cpu_memory_used_gb")):
        for role, part in (("critic", slice(1, 1 + n)), ("actor", slice(1 + n, 1 + 2 * n))):
            key = f"{role}/perf/{name}"
            obs = []
            for run, rd in runs:
                taken = [rd.taken[(what, r)] for r in range(V.WORLD)]
                p.check(all(len(t) == 1 + 2 * n for t in taken), (what, [len(t) for t in taken]))
                values = [t[part] for t in taken]
                obs.append((run.metrics[key], per_step_rank(values)))
                p.check(not close(run.metrics[key], values[0][-1]), (key, "the last reading"))
                p.check(not close(run.metrics[key], max(max(v) for v in values)) or
                        close(max(values[0]), max(max(v) for v in values)), (key, "the largest over the ranks"))
            p.check(not close(obs[0][0], obs[1][0]), (key, "the swapped runs log the same"))
            p.assert_stated(key, obs, levels=(), processes=("rank0", "max", "min", "all_reduce_mean", "sum"))


@proof("verl", trainer="ppo", release="0.9.1", config=BASE)
def test_worker_mfu_is_rank_zeros_mean_over_the_optimizer_steps(p):
    """perf/mfu/actor and perf/mfu/critic: each optimizer step's MFU on each rank (its flops counter's estimate /
    promised flops / world size, engine_workers.py@v0.9.1:228-233, the estimate over the rank's own timer of the
    step), rank 0's only reaching the driver (the single controller keeps the first rank's batch-less metrics, as
    for the memory readings), averaged over the step's mini-batches x epochs by reduce_metrics after the trainer
    renames actor/mfu and critic/mfu (trainer_base.py@v0.9.1:1821, 1862): two runs with the ranks' readings
    swapped. The counter's numbers are the device's and the wall clock's: what is proven is how veRL carries
    them to the logged key."""
    runs = [readings_step(False), readings_step(True)]
    n = runs[0][0].n_opt_steps
    for role, part in (("critic", slice(0, n)), ("actor", slice(n, 2 * n))):
        key = f"perf/mfu/{role}"
        obs = []
        for run, rd in runs:
            taken = [rd.taken[("flops", r)] for r in range(V.WORLD)]
            # the old-log-prob pass counts no flops (its data carries no global_token_num): critic's steps, actor's
            p.check(all(len(t) == 2 * n for t in taken), [len(t) for t in taken])
            per_step = [[v * 1e12 / 1e14 / V.WORLD for v in t[part]] for t in taken]
            p.check(per_step[0] != per_step[1], "the ranks' readings coincide")
            obs.append((run.metrics[key], per_step_rank(per_step)))
            p.check(not close(run.metrics[key], statistics.fmean(per_step[0]) * V.WORLD), (key, "not per GPU"))
        p.assert_stated(key, obs, levels=(), processes=("rank0", "max", "min", "all_reduce_mean", "sum"))


@proof("verl", trainer="sft_engine", release="0.9.1", config=SFT_CONFIG)
def test_sft_memory_readings_are_rank_zeros(p):
    """perf/max_memory_allocated_gb, perf/max_memory_reserved_gb, perf/cpu_memory_used_gb (sft_engine): the
    engine worker's reading of the step's one train_batch (engine_workers.py@v0.9.1:218-221, in GiB) on the rank
    that logs, rank 0 (sft_trainer.py@v0.9.1:393-409), passed through unprefixed: two runs with the ranks'
    readings swapped, so that rank 0's is the larger in one and the smaller in the other."""
    obs: dict = {}
    for table in (READINGS, READINGS[::-1]):
        run = sft_run(table)
        rows = [m for _, m in run.logged if "train/loss" in m]
        p.check(len(rows) == 2, run.logged)
        for what, name in (("allocated", "max_memory_allocated_gb"), ("reserved", "max_memory_reserved_gb"),
                           ("cpu", "cpu_memory_used_gb")):
            taken = [run.readings.taken[(what, r)] for r in range(V.WORLD)]
            # per rank: the 2 training steps' readings, then the 2 validation batches' (not logged)
            p.check(all(len(t) == 4 for t in taken), (what, [len(t) for t in taken]))
            for i, m in enumerate(rows):
                key = f"perf/{name}"
                obs.setdefault(key, []).append((m[key], [[[[[[t[i]]]] for t in taken]]]))
    for key, o in obs.items():
        p.check(len({round(v, 9) for v, _ in o}) == len(o), (key, "the rows do not tell the readings apart"))
        p.assert_stated(key, o, levels=(), processes=("rank0", "max", "min", "all_reduce_mean", "sum"))


@proof("verl", trainer="sft_engine", release="0.9.1", config=SFT_CONFIG)
def test_sft_mfu_is_rank_zeros_reading_of_the_step(p):
    """train/mfu (sft_trainer.py@v0.9.1:393-409 <- engine_workers.py@v0.9.1:228-233): the flops counter's estimate
    / promised flops / world size of the step's one train_batch on the rank that logs, rank 0 (each rank's
    estimate is over its own timer of the step), renamed train/mfu: two runs with the ranks' readings swapped.
    The counter's numbers are the device's and the wall clock's; what is proven is which rank's step value veRL
    logs (not averaged over ranks or steps, not per GPU x world)."""
    obs = []
    for table in (READINGS, READINGS[::-1]):
        run = sft_run(table)
        rows = [m for _, m in run.logged if "train/loss" in m]
        taken = [run.readings.taken[("flops", r)] for r in range(V.WORLD)]
        p.check(all(len(t) == 2 for t in taken) and taken[0] != taken[1], taken)      # no flops for validation
        for i, m in enumerate(rows):
            mfu = [t[i] * 1e12 / 1e14 / V.WORLD for t in taken]
            obs.append((m["train/mfu"], [[[[[[v]]] for v in mfu]]]))
            p.check(not close(m["train/mfu"], mfu[0] * V.WORLD), "train/mfu is not per GPU")
    p.check(len({round(v, 9) for v, _ in obs}) == len(obs), "the rows do not tell the readings apart")
    p.assert_stated("train/mfu", obs, levels=(), processes=("rank0", "max", "min", "all_reduce_mean", "sum"))


# ------------------------------------------------------------------------------------------------ rollout correction
def corr_batch(seed: int = 17):
    """The padded batch the V1 trainer's _compute_advantage hands compute_rollout_correction_and_add_to_batch
    (trainer_base.py@v0.9.1:1762-1772, decoupled mode): the trainer's old log-probs beside the inference engine's,
    ROLLOUT's ragged responses with the tool-output tokens out of response_mask."""
    c = V.code()
    torch = c.torch
    g = torch.Generator().manual_seed(seed)
    lens = ROLLOUT.resp_lens
    n, width = len(lens), max(lens)
    mask = torch.zeros(n, width, dtype=torch.long)
    for i, k in enumerate(lens):
        mask[i, :k] = 1
        for j, t in enumerate(ROLLOUT.tool[i][:k]):
            mask[i, j] = 0 if t else 1
    old = -torch.rand(n, width, generator=g) * 2 - 0.05
    rollout = old + (torch.rand(n, width, generator=g) - 0.3) * 0.9
    td = c.TensorDict({"old_log_probs": old, "rollout_log_probs": rollout, "response_mask": mask,
                       "responses": torch.full((n, width), 5)}, batch_size=[n])
    return c.DataProto(batch=td), old, rollout, mask


def ragged_rows(values, mask) -> list[list[float]]:
    """Each row's values where ``mask`` is set (the padded tensors veRL was given)."""
    return [[float(v) for v, k in zip(row, mrow) if k] for row, mrow in zip(values.tolist(), mask.tolist())]


def token_observations(logged: float, seqs: list[list[float]]) -> list:
    """Per-token values (ragged sequences) as given, reversed and longest first, each cut into uneven groups."""
    shares = ((3, 1, 3), (2, 4, 1, 2))
    orders = (list(seqs), list(reversed(seqs)), sorted(seqs, key=lambda s: (-len(s), s)))
    return [(logged, [[layout(order, shares)]]) for order in orders]


CORR = dict(BASE, **{"algorithm.rollout_correction.bypass_mode": False})


@proof("verl", trainer="ppo", release="0.9.1", config=CORR)
def test_rollout_corr_kls_are_the_batchs_token_means(p):
    """rollout_corr/kl (k1: rollout - old log-prob) and rollout_corr/k3_kl (exp(r) - r - 1 of r = old - rollout),
    rollout_corr_helper.py@v0.9.1:959-966 via compute_rollout_correction_and_add_to_batch on the driver: the
    token mean over every valid response token of the batch at once (tool tokens out), with the sign of the
    rollout-minus-trainer log ratio for k1."""
    import math

    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_add_to_batch
    data, old, rollout, mask = corr_batch()
    _, metrics = compute_rollout_correction_and_add_to_batch(data, {"rollout_is": None, "rollout_rs": None})
    m = {k: float(v) for k, v in metrics.items()}
    o, r = ragged_rows(old, mask), ragged_rows(rollout, mask)
    k1 = [[b - a for a, b in zip(os_, rs)] for os_, rs in zip(o, r)]
    k3 = [[math.exp(a - b) - (a - b) - 1 for a, b in zip(os_, rs)] for os_, rs in zip(o, r)]
    for key, seqs in (("rollout_corr/kl", k1), ("rollout_corr/k3_kl", k3)):
        p.assert_stated(key, token_observations(m[key], seqs), levels=DRIVER,
                        tokens=("token_mean", "seq_mean_token_mean", "seq_mean_token_sum"))
        p.check(not close(m[key], statistics.fmean(statistics.fmean(s) for s in seqs)), (key, "a sequence mean"))
        _, res = p.entry(key)
        p.check(res.fields["estimator"] == ("k1" if key.endswith("/kl") else "k3"), (key, res.fields))
    flat = [v for s in k1 for v in s]
    p.check(m["rollout_corr/kl"] > 0 and close(m["rollout_corr/kl"], statistics.fmean(flat), 1e-5)
            and not close(m["rollout_corr/kl"], -statistics.fmean(flat)), "k1's sign: rollout - old")


# ------------------------------------------------------------------------------------------------ variance proxy
VARIANCE = dict(LEGACY, **{"actor_rollout_ref.actor.calculate_sum_pi_squared": True})


@proof("verl", trainer="ppo", release="0.9.1", config=VARIANCE)
def test_variance_proxy_components_are_per_trajectory_means(p):
    """variance_proxy/{name} (metric_utils.py@v0.9.1:691-800 compute_variance_proxy_metrics, as the legacy trainer
    calls it with the step's batch and actor/grad_norm, ray_trainer.py@v0.9.1:1789): expected_a_squared, the
    mean over trajectories of the square of each one's token-mean advantage; expected_w, the mean over
    trajectories of W = the masked sum over its tokens of 1 - 2 pi_t + sum pi^2; proxy2_total_power, the mean of
    A^2 x W; proxy1_signal_strength the grad norm squared; proxy3_pure_noise (proxy2 - proxy1) / (N - 1). Each
    one number over the whole batch (padding and tool tokens out)."""
    import math
    c = V.code()
    torch = c.torch
    data, old, _, mask = corr_batch(seed=23)
    g = torch.Generator().manual_seed(29)
    pi = old.exp()
    spsq = pi ** 2 + torch.rand(old.shape, generator=g) * 0.3 * (1 - pi) ** 2
    adv = torch.randn(old.shape, generator=g) + 0.3
    data.batch["sum_pi_squared"], data.batch["advantages"] = spsq, adv
    grad_norm = 0.37
    m = {k: float(v) for k, v in c.metric_utils.compute_variance_proxy_metrics(data, gradient_norm=grad_norm).items()}
    w_tok = ragged_rows(1 - 2 * pi + spsq, mask)
    a = [statistics.fmean(s) for s in ragged_rows(adv, mask)]
    w = [math.fsum(s) for s in w_tok]
    per = {"expected_a_squared": [x * x for x in a], "expected_w": w,
           "proxy2_total_power": [x * x * max(y, 0.0) for x, y in zip(a, w)]}
    for name, values in per.items():
        key = f"variance_proxy/{name}"
        p.assert_stated(key, per_seq_observations(m[key], values), levels=DRIVER, tokens=("per_seq",), rel=1e-5)
    # expected_w is no token mean of w (the per-token values' mean)
    flat = [v for s in w_tok for v in s]
    p.check(not close(m["variance_proxy/expected_w"], statistics.fmean(flat), 1e-4), "a token mean")
    p.assert_stated("variance_proxy/proxy1_signal_strength", m["variance_proxy/proxy1_signal_strength"],
                    [[[[[[grad_norm ** 2]]]]]], levels=())
    n = len(a)
    noise = max(0.0, (m["variance_proxy/proxy2_total_power"] - grad_norm ** 2) / (n - 1))
    p.check(close(m["variance_proxy/proxy3_pure_noise"], noise, 1e-5) and noise > 0, (m, noise))


# ------------------------------------------------------------------------------------------------ legacy log-prob MFU
class LegacyPolicy:
    """The tiny policy's forward over the legacy no-padding batch (left_right_2_no_padding: nested input_ids of
    prompt + response): per token of each sequence (``seq_id``) a log-probability and an entropy."""

    def __init__(self, width: int):
        torch = V.code().torch
        g = torch.Generator().manual_seed(31)
        self.base = -torch.rand(64, width, generator=g) - 0.1
        self.module = torch.nn.Linear(1, 1)

    def __call__(self, micro_batch, calculate_entropy: bool):
        torch = V.code().torch
        lens = micro_batch["input_ids"].offsets().diff().tolist()
        lps = [self.base[i, :n] for i, n in zip(micro_batch["seq_id"].tolist(), lens)]
        out = {"log_probs": torch.nested.as_nested_tensor(lps, layout=torch.jagged)}
        if calculate_entropy:
            out["entropy"] = torch.nested.as_nested_tensor([-x for x in lps], layout=torch.jagged)
        return out


def legacy_old_log_prob(table: list):
    """The legacy trainer's ``RayPPOTrainer._compute_old_log_prob`` (ray_trainer.py@v0.9.1:1290-1325, compiled from
    the wheel's text) on ROLLOUT's left/right-padded batch with global_token_num (ray_trainer.py@v0.9.1:1553), its
    worker group's compute_log_prob dispatched as the single controller does (tu.chunk_tensordict over the ranks,
    the real TrainingWorker.infer_batch per rank, the first rank's batch-less metrics kept by concat_tensordict),
    the flops counter's readings answered by :class:`Readings`; (the MFU returned, the readings)."""
    import verl
    from omegaconf import OmegaConf
    from verl.workers.utils.padding import left_right_2_no_padding, no_padding_2_padding

    from _support import framework_code as F
    c = V.code()
    torch = c.torch
    r = ROLLOUT
    n, P, W = r.n, V.MAX_PROMPT, V.MAX_RESPONSE
    ids = torch.zeros(n, P + W, dtype=torch.long)
    attn = torch.zeros(n, P + W, dtype=torch.long)
    resp_mask = torch.zeros(n, W, dtype=torch.long)
    for i in range(n):
        p_, k = r.prompt_lens[i], r.resp_lens[i]
        attn[i, P - p_:P + k] = 1
        ids[i, P - p_:P + k] = torch.arange(p_ + k) % 11 + 1
        resp_mask[i, :k] = 1
    pos = torch.clamp(torch.cumsum(attn, -1) - 1, min=0)
    td = c.TensorDict({"input_ids": ids, "attention_mask": attn, "response_mask": resp_mask, "position_ids": pos,
                       "responses": ids[:, P:], "prompts": ids[:, :P], "seq_id": torch.arange(n)}, batch_size=[n])
    batch = c.DataProto(batch=td, meta_info={"global_token_num": attn.sum(-1).tolist()})
    root = Path(verl.__file__).resolve().parent
    ns = {"tu": c.tu, "left_right_2_no_padding": left_right_2_no_padding,
          "no_padding_2_padding": no_padding_2_padding, "DataProto": c.DataProto}
    fn = V._compile(root / "trainer/ppo/ray_trainer.py", ["_compute_old_log_prob"], ns,
                    cls="RayPPOTrainer")["_compute_old_log_prob"]
    rd = Readings(table)
    ocfg = c.FSDPOptimizerConfig(lr=0.1, lr_scheduler_type="constant", total_training_steps=1, clip_grad=1.0)
    policies = [LegacyPolicy(P + W) for _ in range(V.WORLD)]
    infer = V._method(c.engine_workers.TrainingWorker, "infer_batch")

    class WorkerGroup:
        def compute_log_prob(self, data):
            shares = c.tu.chunk_tensordict(data, V.WORLD)

            def body(rank: int):
                engine = V.Engine(policies[rank], rank, ocfg, V.Capture(), V.MICRO)
                w = V.worker(engine, None, V.MICRO)
                w.flops_counter = rd.flops()
                return infer(w, shares[rank])
            with V.simulated_dist(), V._patched(c.engine_workers, get_torch_device=rd.device, psutil=rd.psutil()):
                outs = F.run_ranks(body, V.WORLD)
            return c.tu.concat_tensordict(outs)

    trainer = types.SimpleNamespace(
        config=OmegaConf.create({"actor_rollout_ref": {"actor": {"calculate_sum_pi_squared": False}}}),
        actor_rollout_wg=WorkerGroup())
    _, mfu = fn(trainer, batch)
    return float(mfu), rd


@proof("verl", trainer="ppo", release="0.9.1", config=LEGACY)
def test_legacy_old_log_prob_mfu_is_the_passs_forward_reading(p):
    """perf/mfu/actor_infer (legacy trainer, ray_trainer.py@v0.9.1:1311 and 1598): the old-log-prob pass's MFU, the
    flops counter's estimate / promised flops / world size / 3 (forward only, engine_workers.py@v0.9.1:228-235):
    one number per step. The ranks' readings are the same here: when they differ, the single controller's
    concat_tensordict turns the ranks' metrics into a per-sample list and line 1311 fails (next test)."""
    same = [READINGS[0], READINGS[0]]
    mfu, rd = legacy_old_log_prob(same)
    taken = [rd.taken[("flops", r)] for r in range(V.WORLD)]
    p.check(all(len(t) == 1 for t in taken) and taken[0] == taken[1], taken)
    value = taken[0][0] * 1e12 / 1e14 / V.WORLD / 3.0
    p.assert_stated("perf/mfu/actor_infer", mfu, [[[[[[value]]]]]], levels=())
    p.check(not close(mfu, value * 3.0) and not close(mfu, value * V.WORLD), "not / 3 per GPU")
    other, _ = legacy_old_log_prob([READINGS[1], READINGS[1]])
    p.check(not close(mfu, other), "the readings do not reach the logged value")


def test_legacy_old_log_prob_fails_when_the_ranks_metrics_differ():
    """What veRL 0.9.1's legacy _compute_old_log_prob does with ranks whose worker metrics differ (their memory
    readings, their timers): concat_tensordict stacks the batch-carrying outputs' metrics per sample, and
    ``tu.get(output, "metrics")["mfu"]`` (ray_trainer.py@v0.9.1:1311) indexes a list: TypeError."""
    with pytest.raises(TypeError):
        legacy_old_log_prob(READINGS)
