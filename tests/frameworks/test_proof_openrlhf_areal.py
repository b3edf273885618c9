"""Fingerprint proofs of the AReaL 1.0.4 entries of issue 33's OpenRLHF group (the rest of AReaL's proofs:
tests/frameworks/test_proof_areal*.py).

AReaL's own stats_tracker (areal/utils/stats_tracker.py from the installed wheel, tests/_support/proofs_areal.py) on
two simulated data-parallel ranks, called the way AReaL calls it: the engine's optimizer-step scalars after each
mini-batch (areal/trainer/ppo/actor.py@v1.0.4:365), and the evaluation workflow's reward scalar under the scope
``workflow_context.stat_scope()`` returns in eval mode (areal/infra/workflow_context.py@v1.0.4:55-63, compiled from
the file's text), merged over the rollout workers by RolloutController.export_stats.
"""
from __future__ import annotations

import ast
import importlib.metadata
import types

import pytest

try:
    importlib.metadata.distribution("areal")
except importlib.metadata.PackageNotFoundError:
    pytest.skip("make test installs areal==1.0.4 --no-deps", allow_module_level=True)
pytest.importorskip("colorlog", reason="make test installs colorlog (areal/utils/logging.py imports it)")
pytest.importorskip("torch")

from _support.framework_code import run_ranks  # noqa: E402
from _support.proofs_areal import areal  # noqa: E402
from _support.proven import close, proof  # noqa: E402

CONFIG = {"actor.ppo_n_minibatches": 3}


def stat_scope(is_eval: bool) -> str:
    """workflow_context.stat_scope from the wheel's text, its ``get()`` the context of an eval (or train) rollout."""
    path = areal().stats_tracker.__file__.replace("utils/stats_tracker.py", "infra/workflow_context.py")
    tree = ast.parse(open(path, encoding="utf-8").read(), filename=path)
    fn = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "stat_scope"]
    namespace = {"get": lambda: types.SimpleNamespace(is_eval=is_eval)}
    exec(compile(ast.Module(body=fn, type_ignores=[]), path, "exec"), namespace)     # noqa: S102 - the wheel's
    return namespace["stat_scope"]()


def optimizer_scalars(lrs: list[float]) -> dict:
    """ppo_update's scope ppo_actor/update on 2 ranks, after each mini-batch's optimizer step the engine's scalars
    (actor.py:365: grad_norm, lr, update_successful), exported with the dp all-reduce; rank 0's export."""
    A = areal()

    def rank(r: int) -> dict:
        tracker = A.Tracker()
        with tracker.scope("ppo_actor"), tracker.scope("update"):
            for m, lr in enumerate(lrs):
                tracker.scalar(grad_norm=1.0 + m, lr=lr, update_successful=1.0)
        return tracker.export(reduce_group="dp")
    return run_ranks(rank)[0]


@proof("areal", trainer="ppo", release="1.0.4", config=CONFIG)
def test_areal_update_lr_is_the_mean_of_the_mini_batches_scalars(p):
    """ppo_actor/update/lr: scalar() per mini-batch optimizer step, averaged (sums and counts all-reduced) over the
    mini-batches and ranks. Fingerprinted on LRs that differ per mini-batch (a scheduler stepping inside the
    update), so that the mean is told from the last and the first; with AReaL's schedule (the scheduler steps once
    after ppo_update) every mini-batch reads the same LR and the logged value is that LR."""
    lrs = [3e-6, 1e-6, 2.5e-6]
    logged = optimizer_scalars(lrs)
    p.check(logged["ppo_actor/update/lr__count"] == 2 * len(lrs), "one value per mini-batch and rank")
    p.assert_stated("ppo_actor/update/lr", logged["ppo_actor/update/lr"], [[[[[[lr]]]] for lr in lrs]],
                    tokens=("none",), levels=())
    same = optimizer_scalars([2e-6] * 3)
    p.check(close(same["ppo_actor/update/lr"], 2e-6, 1e-9), same)


def eval_rewards(per_worker: list[list[float]]) -> tuple[str, dict]:
    """Each rollout worker's tracker, named by stat_scope() in eval mode, records scalar(reward=...) per sample
    (rlvr.py:135) and exports with reduce_group=None; the controller merges them by their __count."""
    A = areal()
    scope = stat_scope(True)
    exports = []
    for rewards in per_worker:
        tracker = A.Tracker(scope)
        for x in rewards:
            tracker.scalar(reward=x)
        exports.append(tracker.export(reduce_group=None))

    class Controller:
        def _collective_rpc(self, method: str, http_timeout: float) -> list[dict]:
            assert method == "export_stats"
            return exports
    return scope, A.rollout_export_stats(Controller())


@proof("areal", trainer="ppo", release="1.0.4", config=CONFIG)
def test_areal_eval_rollout_reward_is_the_mean_over_every_eval_sample(p):
    """eval-rollout/reward: the evaluation workflow's per-sample reward scalars of every rollout worker, merged by
    their counts: the mean over every eval sample (not the mean of the workers' means)."""
    workers = [[1.0, 0.0, 0.25], [0.0, 1.0, 1.0, 0.75, 0.5]]
    scope, out = eval_rewards(workers)
    p.check(scope == "eval-rollout" and stat_scope(False) == "rollout", scope)
    steps = [[[[[[x] for x in w]] for w in workers]]]
    p.assert_stated("eval-rollout/reward", out["eval-rollout/reward"], steps, levels=("processes",))
    p.check("eval-rollout/reward__count" not in out, "the controller drops the counts")
