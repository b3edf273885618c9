"""AReaL's own metric code for the fingerprint proofs (tests/frameworks/test_proof_areal.py), on a CPU machine.

``areal`` 1.0.4 is installed from its wheel with ``--no-deps`` (make test; its dependencies are the GPU training
stack). Its package ``__init__`` starts importing the controllers, launchers and schedulers, so the files that hold
the metric code are loaded by file from the installed wheel, under empty package modules (``_skeleton``):

* ``areal/utils/stats_tracker.py`` -- the whole reduction machinery (denominator masks, ``stat``/``scalar``/
  ``export`` with the all-reduce of sums and counts), with the real ``areal/utils/logging.py`` (needs ``colorlog``)
  and ``areal/infra/platforms`` (``current_platform``); ``areal/utils/seqpack.py`` imports numba, so its one helper
  the tracker uses, ``flat2d``, is compiled from that file's own text;
* ``RolloutController.export_stats`` (``areal/infra/controller/rollout_controller.py``), compiled from the file's
  own text: how the rollout workers' scalars are merged by their ``__count``.

``torch.distributed`` as the tracker calls it (``all_reduce`` with SUM/MIN/MAX, ``all_gather_object``,
``get_world_size``) is the simulated data-parallel group of :mod:`_support.framework_code`: every rank runs in its
own thread with its own ``DistributedStatsTracker`` and the collectives meet at a barrier. Nothing here computes a
metric itself: the proofs call the tracker the way ``areal/trainer/ppo/actor.py`` does (cited per call).
"""
from __future__ import annotations

import ast
import functools
import itertools
import types
from pathlib import Path
from typing import Any

from _support.framework_code import (
    SimDist,
    _load_file,
    _methods_from_source,
    _package_dir,
    _skeleton,
    current_rank,
    release,
)


class AReaLDist(SimDist):
    """SimDist with what stats_tracker also calls: MIN, all_gather_object."""

    class ReduceOp:
        SUM, MAX, MIN = "sum", "max", "min"

    def all_reduce(self, t, op="sum", group=None) -> None:
        if op == "min":
            g, r = current_rank()
            parts = g.exchange(r, t.detach().clone())
            t.copy_(functools.reduce(lambda a, b: a.minimum(b), parts))
            return
        super().all_reduce(t, op=op, group=group)

    def all_gather_object(self, out: list, obj: Any, group=None) -> None:
        g, r = current_rank()
        out[:] = g.exchange(r, obj)


def _function_from_source(path: Path, name: str, namespace: dict[str, Any]) -> Any:
    """The top-level function ``name`` of the file at ``path``, compiled from its own text into ``namespace``."""
    tree = ast.parse(path.read_text())
    (node,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name]
    code = compile(ast.Module(body=[node], type_ignores=[]), str(path), "exec")
    exec(code, namespace)
    return namespace[name]


@functools.lru_cache(maxsize=None)
def areal() -> types.SimpleNamespace:
    import importlib
    from collections import defaultdict

    root = _package_dir("areal", "areal")
    for pkg, sub in [("areal", ""), ("areal.utils", "utils"), ("areal.infra", "infra"),
                     ("areal.infra.controller", "infra/controller")]:
        _skeleton(pkg, root / sub)
    _load_file("areal.utils.logging", root / "utils/logging.py")
    importlib.import_module("areal.infra.platforms")                 # the real package (current_platform)
    seqpack = types.ModuleType("areal.utils.seqpack")
    seqpack.flat2d = _function_from_source(root / "utils/seqpack.py", "flat2d", {"Any": Any, "itertools": itertools})
    st = _load_file("areal.utils.stats_tracker", root / "utils/stats_tracker.py", {"areal.utils.seqpack": seqpack})
    st.dist = AReaLDist()                                            # the simulated data-parallel group
    controller = _methods_from_source(root / "infra/controller/rollout_controller.py", "RolloutController",
                                      ["export_stats"], {"defaultdict": defaultdict})
    return types.SimpleNamespace(
        stats_tracker=st, Tracker=st.DistributedStatsTracker, ReduceType=st.ReduceType,
        rollout_export_stats=controller["export_stats"], release=release("areal"),
        files={"tracker": "areal/utils/stats_tracker.py", "actor": "areal/trainer/ppo/actor.py",
               "controller": "areal/infra/controller/rollout_controller.py"})
