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

The PPO actor (:func:`areal_actor`, tests/frameworks/test_proof_areal_actor.py) runs from the same wheel:

* ``areal/trainer/ppo/actor.py``: ``PPOActor.__init__``, ``_log_configuration``, ``_compute_logp``,
  ``_compute_advantages`` and every top-level function and constant (``grpo_loss_fn``, ``_resolve_proximal_logp``,
  ``compute_prox_logp_approximations``, ``_log_proximal_approximation_stats``, ...), compiled from the file's text
  against one process's stats_tracker (:func:`rank_stats_tracker`). Its imports that these do not use are not
  loaded: ``areal.api.TrainEngine`` (an annotation, given as ``Any``), ``GatewayTrainController``,
  ``TrainController``, ``serialize_value`` (the controller classes), ``trace_perf`` (decorates the public methods,
  not compiled), ``Normalization`` (adv_norm/reward_norm, None by default), ``batched_call`` and
  ``split_padded_tensor_dict_into_mb_list`` (``ppo_update``'s per-trajectory concat and mini-batch split, done by
  the test module as ``_ppo_update`` does);
* ``areal/utils/functional/functional.py``: the whole file (``ppo_actor_loss_fn``, ``apply_rejection_sampling``);
  its two imports are modules holding the real classes compiled from their files' text (``areal.api.cli_args``:
  RejectionSamplingConfig; ``areal.utils.data``: KLEstimator), since cli_args.py imports hydra, the engines and
  numba, and data.py einops, torchdata and numba;
* ``areal/api/cli_args.py``: ``PPOActorConfig`` (defaults, ``__post_init__``, ``should_compute_prox_logp``),
  ``NormConfig``, ``RejectionSamplingConfig``, from the file's text. The one stand-in: PPOActorConfig's base
  ``TrainEngineConfig`` is compiled with only the field the actor reads (``temperature``, :data:`ENGINE_FIELDS`,
  its default from the file) and a ``__post_init__`` that does nothing (the real one validates the optimizer,
  backend and scheduling settings, none of which the code under test reads);
* ``areal/utils/constants.py`` and ``areal/trainer/ppo/stats.py`` (``infer_token_denominator``): whole files.
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
    seqpack.flat2d = _methods_from_source(root / "utils/seqpack.py", None, ["flat2d"],
                                          {"Any": Any, "itertools": itertools})["flat2d"]
    st = _load_file("areal.utils.stats_tracker", root / "utils/stats_tracker.py", {"areal.utils.seqpack": seqpack})
    st.dist = AReaLDist()                                            # the simulated data-parallel group
    controller = _methods_from_source(root / "infra/controller/rollout_controller.py", "RolloutController",
                                      ["export_stats"], {"defaultdict": defaultdict})
    return types.SimpleNamespace(
        stats_tracker=st, Tracker=st.DistributedStatsTracker, ReduceType=st.ReduceType,
        rollout_export_stats=controller["export_stats"], release=release("areal"),
        files={"tracker": "areal/utils/stats_tracker.py", "actor": "areal/trainer/ppo/actor.py",
               "controller": "areal/infra/controller/rollout_controller.py"})


# ------------------------------------------------------------------ the PPO actor's loss and statistics (issue 33)
#: the fields of TrainEngineConfig (PPOActorConfig's base) that PPOActor reads: actor.py@v1.0.4:64
ENGINE_FIELDS = ("temperature",)


def _defs_from_source(path: Path, namespace: dict[str, Any], *, classes: tuple[str, ...] = (),
                      functions: bool = False) -> dict[str, Any]:
    """The named top-level classes (decorators included) and, with ``functions``, every top-level function of the
    file at ``path``, compiled from its own text into ``namespace``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    nodes = [n for n in tree.body if (isinstance(n, ast.ClassDef) and n.name in classes)
             or (functions and isinstance(n, ast.FunctionDef))]
    missing = set(classes) - {n.name for n in nodes}
    if missing:
        raise ImportError(f"{path}: no {sorted(missing)}")
    exec(compile(ast.fix_missing_locations(ast.Module(body=nodes, type_ignores=[])), str(path), "exec"),
         namespace)                                                  # noqa: S102 - the wheel's own code
    return namespace


def rank_stats_tracker() -> types.ModuleType:
    """One process's ``areal.utils.stats_tracker``: the loaded module with its own DEFAULT_TRACKER and the module
    functions bound to it, as stats_tracker.py lines 294-303 make them in every process (the proofs run each
    simulated rank in a thread, so each needs its own)."""
    st = areal().stats_tracker
    mod = types.ModuleType("areal.utils.stats_tracker")
    mod.__dict__.update(st.__dict__)
    tracker = st.DistributedStatsTracker()
    mod.DEFAULT_TRACKER, mod.TRACKERS = tracker, {"": tracker}
    for name in ("stat", "denominator", "export", "scope", "scalar", "record_timing", "scope_func_wrapper"):
        setattr(mod, name, getattr(tracker, name))
    return mod


@functools.lru_cache(maxsize=None)
def _actor_support() -> types.SimpleNamespace:
    """The modules and classes the actor's code imports, loaded from the wheel once (see ``areal_actor``)."""
    import dataclasses
    import warnings

    import torch

    A = areal()
    root = Path(A.stats_tracker.__file__).parents[1]        # the wheel's areal/ (find_spec fails once loaded)
    for pkg, sub in [("areal.api", "api"), ("areal.trainer", "trainer"), ("areal.trainer.ppo", "trainer/ppo"),
                     ("areal.utils.functional", "utils/functional")]:
        _skeleton(pkg, root / sub)
    logging_mod = __import__("sys").modules["areal.utils.logging"]
    constants = _load_file("areal.utils.constants", root / "utils/constants.py")
    stats = _load_file("areal.trainer.ppo.stats", root / "trainer/ppo/stats.py")
    # cli_args.py imports hydra, the engines' attention code and seqpack (numba): its config classes are compiled
    # from its text. PPOActorConfig's base TrainEngineConfig is compiled with only the fields the actor reads
    # (ENGINE_FIELDS; its defaults from the file) and without its __post_init__, which validates the engine's
    # settings (optimizer, FSDP/Megatron/Archon backends, mb_spec, scheduling) that the code under test never reads
    tree = ast.parse((root / "api/cli_args.py").read_text(encoding="utf-8"))
    (base,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "TrainEngineConfig"]
    base.body = [n for n in base.body if isinstance(n, ast.AnnAssign) and n.target.id in ENGINE_FIELDS]
    assert {n.target.id for n in base.body} == set(ENGINE_FIELDS), "TrainEngineConfig lost a field the actor reads"
    base.body.append(ast.parse("def __post_init__(self):\n    pass").body[0])
    engine_ns = {"dataclass": dataclasses.dataclass, "field": dataclasses.field}
    exec(compile(ast.fix_missing_locations(ast.Module(body=[base], type_ignores=[])), str(root / "api/cli_args.py"),
                 "exec"), engine_ns)                               # noqa: S102 - the wheel's own code
    TrainEngineConfig = engine_ns["TrainEngineConfig"]

    cli = {"dataclass": dataclasses.dataclass, "field": dataclasses.field, "Any": Any, "warnings": warnings,
           "logger": logging_mod.getLogger("CLI args"), "TrainEngineConfig": TrainEngineConfig,
           **{k: getattr(constants, k) for k in dir(constants) if k.startswith("PROX_")}}
    _defs_from_source(root / "api/cli_args.py", cli, classes=("NormConfig", "RejectionSamplingConfig",
                                                               "PPOActorConfig"))
    cli_mod = types.ModuleType("areal.api.cli_args")
    cli_mod.__dict__.update({k: cli[k] for k in ("NormConfig", "RejectionSamplingConfig", "PPOActorConfig")})
    # data.py imports einops, torchdata and seqpack (numba): KLEstimator is compiled from its text
    data = _defs_from_source(root / "utils/data.py", {"torch": torch}, classes=("KLEstimator",))
    data_mod = types.ModuleType("areal.utils.data")
    data_mod.KLEstimator = data["KLEstimator"]
    functional = _load_file("areal.utils.functional.functional", root / "utils/functional/functional.py",
                            {"areal.api.cli_args": cli_mod, "areal.utils.data": data_mod})
    return types.SimpleNamespace(constants=constants, stats=stats, cli=cli_mod, data=data_mod,
                                 functional=functional, logging=logging_mod, root=root)


ACTOR_METHODS = ("__init__", "_log_configuration", "_compute_logp", "_compute_advantages")


@functools.lru_cache(maxsize=None)
def _actor_code() -> tuple[Any, ...]:
    """actor.py's top-level functions and constants and PPOActor's ACTOR_METHODS, compiled from the wheel's text
    once (parsing in the ranks' threads trips CPython 3.11's AST recursion check)."""
    path = _actor_support().root / "trainer/ppo/actor.py"
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    # every top-level function and constant (_EPSILON); not the imports (see areal_actor) nor `logger = ...`
    functions = [n for n in tree.body if isinstance(n, ast.FunctionDef) or (
        isinstance(n, ast.Assign) and all(isinstance(t, ast.Name) and t.id != "logger" for t in n.targets))]
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "PPOActor"]
    methods = [n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name in ACTOR_METHODS]
    assert {n.name for n in methods} == set(ACTOR_METHODS), f"{path}: PPOActor lost one of {ACTOR_METHODS}"
    return tuple(compile(ast.Module(body=body, type_ignores=[]), str(path), "exec") for body in (functions, methods))


def areal_actor(stats_tracker: types.ModuleType) -> types.SimpleNamespace:
    """AReaL 1.0.4's PPO actor (areal/trainer/ppo/actor.py) compiled from the wheel's text against one process's
    ``stats_tracker`` (:func:`rank_stats_tracker`): ``PPOActor`` (``__init__``, ``_log_configuration``,
    ``_compute_logp``, ``_compute_advantages``), every top-level function of the file (``grpo_loss_fn`` and its
    helpers) and ``PPOActorConfig``; which of the file's imports are left out, and why: the module docstring."""
    import torch

    S = _actor_support()
    c = S.constants
    ns: dict[str, Any] = {
        "torch": torch, "Any": Any, "functools": functools, "stats_tracker": stats_tracker,
        "logger": S.logging.getLogger("PPOActor"), "infer_token_denominator": S.stats.infer_token_denominator,
        "KLEstimator": S.data.KLEstimator, "RejectionSamplingConfig": S.cli.RejectionSamplingConfig,
        "PPOActorConfig": S.cli.PPOActorConfig, "TrainEngine": Any,
        "ppo_actor_loss_fn": S.functional.ppo_actor_loss_fn, "sapo_loss_fn": S.functional.sapo_loss_fn,
        "reward_overlong_penalty": S.functional.reward_overlong_penalty, "ProxLogpMethod": c.ProxLogpMethod,
        **{k: getattr(c, k) for k in dir(c) if k.startswith("PROX_")},
    }
    for code in _actor_code():
        exec(code, ns)                                            # noqa: S102 - the wheel's own code
    methods = {n: ns[n] for n in ACTOR_METHODS}
    ns["PPOActor"] = type("PPOActor", (), methods)
    return types.SimpleNamespace(**ns)
