"""Fingerprint proofs of mappings/trl.yaml's sampling/* keys (the vLLM importance-sampling correction) for TRL's
GRPOTrainer and its variants (GMPOTrainer at 1.16.0), and of the generation keys of GMPO on 2 ranks.

TRL 1.16.0's own ``_generate_and_score_completions`` runs on 2 simulated ranks (tests/_support/proofs_trl_grpo.py
``scorer_like``) with ``use_vllm`` and ``vllm_importance_sampling_correction`` on: the completions and the sampler's
log-probs come from a ``rollout_func`` (the path a custom rollout takes; vLLM itself is not installed on CPU and its
weight sync is a no-op), the policy's log-probs at scoring time from the replaced forward. The ranks' generation
batches hold 4, 2, 6 and 2, 4, 4 completions of uneven lengths; one generation per optimizer step, rows of 3 and 2
steps: the mean over processes (each rank's mean averaged) is told from the gathered (weighted) mean, and the window
from the last generation.
"""
from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from pathlib import Path

import pytest

pytest.importorskip("trl")

from _support import proofs_trl_grpo as G  # noqa: E402
from _support.proofs_trl import masked, per_seq  # noqa: E402
from _support.proven import proof  # noqa: E402

RELEASE = "1.16.0"
WINDOWS = ("mean", "last", "sum", "none")
TOKENS = ("token_mean", "seq_mean_token_mean", "per_seq")
ROWS = (3, 2)
SEQS = ((4, 2, 6), (2, 4, 4))

_WORK = Path(tempfile.mkdtemp(prefix="trl-grpo-sampling-"))
atexit.register(shutil.rmtree, _WORK, True)


@functools.lru_cache(maxsize=None)
def _scores(trainer: str, mode: str) -> G.RankRun:
    from trl import GRPOConfig, GRPOTrainer
    from trl.experimental.gmpo import GMPOConfig, GMPOTrainer
    cls, cfg = {"grpo": (GRPOTrainer, GRPOConfig), "grpo_variants": (GMPOTrainer, GMPOConfig)}[trainer]
    args = cfg(output_dir=str(_WORK / "out"), report_to="none", use_cpu=True, beta=0.0, gradient_accumulation_steps=1,
               logging_steps=ROWS[0], per_device_train_batch_size=4, num_generations=2,
               vllm_importance_sampling_mode=mode)
    steps = G.make_steps(51, sum(ROWS), 1, seqs=SEQS)
    with G.simulated_gather():
        return G.run_loss_on_ranks(lambda: G.scorer_like(cls, args, use_vllm=True), G.call_score, steps, ROWS)


def _logp_diff(loc):
    """|policy log-prob at scoring - sampler log-prob| per model token (TRL's delta before it is flattened)."""
    d = (loc["old_per_token_logps"] - loc["sampling_per_token_logps"]).abs()
    m = loc["completion_mask"].bool()
    return [[float(v) for v in d[i][m[i]]] for i in range(d.shape[0])]


def _sampling_proof(trainer: str, mode: str):
    config = {"gradient_accumulation_steps": 1, "logging_steps": ROWS[0], "use_vllm": True,
              "vllm_importance_sampling_correction": True, "vllm_importance_sampling_mode": mode}

    def fn(p):
        run = _scores(trainer, mode)
        p.check(run.rows[0] == run.rows[1], "every rank logs the same values")
        ratio = masked("vllm_importance_sampling_ratio", "mask")
        calls = [c for c in run.calls[0] if "sampling/importance_sampling_ratio/mean" in c.appended]
        p.check(calls and type(calls[0].locals["self"]).__name__ == {"grpo": "GRPOTrainer",
                                                                     "grpo_variants": "GMPOTrainer"}[trainer],
                "the trainer's own scoring ran")
        shape = calls[0].locals["vllm_importance_sampling_ratio"].shape
        p.check((shape[1] == 1) == mode.startswith("sequence"), f"{mode}: ratios of shape {tuple(shape)}")
        for key, values, stat in (("sampling/sampling_logp_difference/mean", _logp_diff, "mean"),
                                  ("sampling/sampling_logp_difference/max", _logp_diff, "max"),
                                  ("sampling/importance_sampling_ratio/min", ratio, "min"),
                                  ("sampling/importance_sampling_ratio/mean", ratio, "mean"),
                                  ("sampling/importance_sampling_ratio/max", ratio, "max")):
            obs = run.obs(key, values)
            p.check(all(v > 0 for v, _ in obs), f"{key}: positive (a difference's magnitude, a ratio)")
            p.assert_stated(key, obs, tokens=TOKENS, stats=(stat,), micro=("none",), mini=("none",),
                            window=WINDOWS, levels=("processes", "window"))
    fn.__name__ = fn.__qualname__ = f"test_{trainer}_sampling_keys_{mode}_on_two_ranks"
    fn.__doc__ = (f"sampling/* ({trainer}, vllm_importance_sampling_mode {mode}): each rank's mean / max / min over "
                  "its generation batch's model tokens (or sequences, for sequence-level ratios), gathered and "
                  "averaged / maxed / nanmin'ed over the processes, then averaged over the row's generations.")
    return proof("trl", trainer=trainer, release=RELEASE, config=config)(fn)


test_grpo_sampling_keys_sequence_mask_on_two_ranks = _sampling_proof("grpo", "sequence_mask")
test_grpo_sampling_keys_token_truncate_on_two_ranks = _sampling_proof("grpo", "token_truncate")
test_grpo_variants_sampling_keys_sequence_mask_on_two_ranks = _sampling_proof("grpo_variants", "sequence_mask")
test_grpo_variants_sampling_keys_token_truncate_on_two_ranks = _sampling_proof("grpo_variants", "token_truncate")


@proof("trl", trainer="grpo_variants", release=RELEASE,
       config={"gradient_accumulation_steps": 1, "logging_steps": ROWS[0]})
def test_gmpo_completion_mean_length_gathers_the_ranks(p):
    """completions/mean_length: over the completion lengths gathered from every process (each rank's own
    ``completion_lengths``, ranks of 4 and 2 completions: not the mean of the ranks' means), then averaged over the
    row's generations (the min and max, extremes of lengths capped at 7 here, are proven on the trained run of
    test_proof_trl_grpo_variants.py)."""
    run = _scores("grpo_variants", "sequence_mask")
    p.assert_stated("completions/mean_length", run.obs("completions/mean_length", per_seq("completion_lengths")),
                    tokens=("per_seq",), micro=("none",), mini=("none",), window=WINDOWS,
                    levels=("processes", "window"))
