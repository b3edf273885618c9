"""Fingerprint proofs of mappings/trl.yaml's tools/* keys for TRL's GRPOTrainer and its variants (GMPOTrainer at
1.16.0): TRL 1.16.0's own ``_generate`` on 2 simulated ranks (tests/_support/proofs_trl_grpo.py) with tools given;
the tool execution loop is a stand-in reporting each rank's tool calls and failures (``tool_counts``: 0, 1 or 2 calls
per completion, some failing), and ``_generate`` reduces them over the processes: tools/call_frequency is the
gathered calls over the gathered completions, tools/failure_frequency the gathered failures over the gathered calls.
Ranks of 4, 2, 6 and 2, 4, 4 completions (rank sizes differ: the gathered ratio is not the mean of the ranks'
ratios), rows of 3 and 2 generations.
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
from _support.proven import proof  # noqa: E402

RELEASE = "1.16.0"
WINDOWS = ("mean", "last", "sum", "none")
ROWS = (3, 2)
SEQS = ((4, 2, 6), (2, 4, 4))

_WORK = Path(tempfile.mkdtemp(prefix="trl-grpo-tools-"))
atexit.register(shutil.rmtree, _WORK, True)


@functools.lru_cache(maxsize=None)
def _tools(trainer: str) -> tuple[G.RankRun, list]:
    from trl import GRPOConfig, GRPOTrainer
    from trl.experimental.gmpo import GMPOConfig, GMPOTrainer
    cls, cfg = {"grpo": (GRPOTrainer, GRPOConfig), "grpo_variants": (GMPOTrainer, GMPOConfig)}[trainer]
    args = cfg(output_dir=str(_WORK / "out"), report_to="none", use_cpu=True, beta=0.0, gradient_accumulation_steps=1,
               logging_steps=ROWS[0], per_device_train_batch_size=4, num_generations=2)
    steps = G.make_steps(61, sum(ROWS), 1, seqs=SEQS)
    run = G.run_loss_on_ranks(lambda: G.scorer_like(cls, args, use_vllm=False), G.call_generate_with_tools, steps,
                              ROWS)
    return run, steps


def _batch(run: G.RankRun, steps: list, row: int, per_call: bool) -> list:
    """The row's batch of what the tool loop reported: per completion its call count, or per call 0/1 failed."""
    first, last = run.windows[row]
    out = []
    for s in range(first, last + 1):
        ranks = []
        for r in range(G.WORLD):
            calls, fails = G.tool_counts(steps[s - 1][r][0])
            seqs = ([[1.0]] * sum(fails) + [[0.0]] * (sum(calls) - sum(fails))) if per_call else [[float(c)]
                                                                                                  for c in calls]
            ranks.append([seqs])
        out.append([ranks])
    return out


def _tools_proof(trainer: str):
    def fn(p):
        run, steps = _tools(trainer)
        p.check(run.rows[0] == run.rows[1], "every rank logs the same values")
        gens = [c for c in run.calls[0] if "tools/call_frequency" in c.appended]
        p.check(len(gens) == sum(ROWS) and type(gens[0].locals["self"]).__name__ ==
                {"grpo": "GRPOTrainer", "grpo_variants": "GMPOTrainer"}[trainer], "the trainer's own _generate ran")
        for key, per_call in (("tools/call_frequency", False), ("tools/failure_frequency", True)):
            obs = [(row[key], _batch(run, steps, i, per_call)) for i, row in enumerate(run.rows[0])]
            p.check(all(0 < v for v, _ in obs), f"{key}: {[v for v, _ in obs]}")
            p.assert_stated(key, obs, tokens=("per_seq",), micro=("none",), mini=("none",), window=WINDOWS,
                            levels=("processes", "window"))
    fn.__name__ = fn.__qualname__ = f"test_{trainer}_tool_frequencies_gather_the_ranks"
    fn.__doc__ = ("tools/call_frequency (calls per completion) and tools/failure_frequency (failed calls per call): "
                  "the counts summed over every process and divided by the gathered count, per generation, then "
                  "averaged over the row's generations.")
    return proof("trl", trainer=trainer, release=RELEASE,
                 config={"gradient_accumulation_steps": 1, "logging_steps": ROWS[0]})(fn)


test_grpo_tool_frequencies_gather_the_ranks = _tools_proof("grpo")
test_grpo_variants_tool_frequencies_gather_the_ranks = _tools_proof("grpo_variants")
