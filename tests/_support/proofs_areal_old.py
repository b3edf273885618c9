"""AReaL v0.4.0's own PPO actor code for the fingerprint proofs of the ``grpo_actor/`` entries (v0.3.1 .. v0.4.0,
tests/frameworks/test_proof_areal_old.py), from the tag's files vendored under tests/data/frameworks/areal/v0.4.0/
(tests/_support/vendored.py; no areal wheel before 1.0.4 reached the index). The installed areal 1.0.4 is not touched:
the tag's modules are kept apart from it (vendored.load with ``tag``).

What runs, from the tag's files:

* ``areal/utils/stats_tracker.py`` whole (``vendored.load``): the reduction machinery (denominators, ``stat``,
  ``scalar``, ``export`` with the all-reduce of sums and counts, MIN, MAX), one ``DistributedStatsTracker`` per
  simulated rank (:func:`rank_stats_tracker`, as stats_tracker.py:280-288 binds its module functions in every
  process); ``torch.distributed`` as it calls it is the simulated data-parallel group (proofs_areal.AReaLDist, two
  ranks in threads); ``areal/utils/logging.py`` whole.
* ``areal/engine/ppo/actor.py``: ``PPOActor`` (every method: ``compute_advantages`` and ``ppo_update`` included) and
  every top-level function (``grpo_loss_fn``, ``get_m2po_loss_mask``), compiled from the file's text; not its two
  engine subclasses (FSDPPPOActor, MegatronPPOActor: they only forward to PPOActor).
* ``areal/utils/functional.py``: every top-level function (``gather_logprobs_entropy``, ``ppo_actor_loss_fn``,
  ``dynamic_sampling``, ``reward_overlong_penalty`` ...), compiled from the file's text.
* ``areal/api/cli_args.py``: ``NormConfig``, ``MicroBatchSpec`` and ``PPOActorConfig`` (its defaults), compiled from
  the file's text; ``areal/utils/data.py``: ``KLEstimator`` and ``Normalization``, compiled from the file's text.

The legacy realhf system (trainer ``realhf``, v0.3.0 .. v0.5.1; its files at the same tag, beside areal/):

* ``realhf/base/stats_tracker.py`` whole (with ``realhf/base/logging.py``), per simulated rank
  (:func:`realhf_rank_stats_tracker`), the simulated group as its dist (:class:`RealhfDist`);
* ``realhf/impl/model/interface/ppo_interface.py``: ``PPOActorInterface`` (the dataclass: ``__post_init__``,
  ``train_step``) and every top-level function (``_ppo_actor_loss_from_model_outputs``, ``calc_entropy``),
  compiled from the file's text;
* ``realhf/impl/model/utils/ppo_functional.py`` whole (the KL controllers, ``actor_loss_fn``,
  ``get_packed_rewards``, ``get_packed_advantages_and_returns``); ``realhf/impl/model/utils/functional.py``:
  ``build_leave_one_indices``, ``gather_logprobs``, ``gather_packed_shifted_log_probs``, ``masked_normalization``,
  compiled from the file's text (the file's other functions are ``torch.jit.script``-ed attention helpers);
  ``realhf/api/core/data_api.py``: the constant ``RL_TASKS``, compiled from the file's text.

Stand-ins for realhf (each for an import the code under test does not compute a metric with):

* ``realhf.base.constants`` (:data:`REALHF_CONSTANTS`): the data-, tensor- and pipeline-parallel group names and
  the tensor-parallel size (1); stats_tracker's ``export`` imports it when called (stats_tracker.py@v0.4.0:135-139),
  so the proof runs inside ``vendored.active`` with it;
* ``realhf.base.datapack`` imports numba: ``flat2d`` compiled from datapack.py's text; ``realhf.base.pkg_version``:
  ``is_available`` False (cugae, the CUDA GAE kernel, is not installed: ppo_functional's Python GAE runs);
* ``model_api.ModelInterface`` (the base class: an interface with no code run here),
  ``model_api.GenerationHyperparameters`` (``__post_init__`` reads ``temperature`` and sets ``n``), ``ReaLModel``,
  the math parser and ``concat_prompt_to_generation_output`` (``generate``'s, not ``train_step``'s);
  ``SequenceSample``/``SequenceSplitSpec`` and the model's ``train_batch``: the test module's (it says what they do).

Stand-ins, each for an import the code under test does not use (or uses only to ask "is it there"):

* ``areal.platforms.current_platform`` (stats_tracker.py:11): only ``is_initialized()`` is read (:190), for the
  device of the scalars' sums; False: the CPU, as on a machine without an accelerator;
* ``areal.utils.datapack`` (stats_tracker.py:13) imports numba (not in the test environment): the one helper the
  tracker uses, ``flat2d``, is compiled from datapack.py's own text;
* functional.py's megatron and Ulysses imports (``mpu``, ``tensor_parallel``, ``_VocabParallelEntropy``,
  ``get_ulysses_sequence_parallel_*``): asked only whether tensor or sequence parallelism is on
  (``mpu.is_initialized()`` False, Ulysses world size 1: one device holds the whole vocabulary and sequence);
* PPOActorConfig's base ``TrainEngineConfig`` (cli_args.py:332) is compiled with no fields: PPOActor reads none of
  them (its engine settings: attention, optimizer, FSDP/Megatron backends), and cli_args.py imports hydra and the
  engines;
* ``split_padded_tensor_dict_into_mb_list`` (data.py:407, ppo_update's mini-batch split) uses datapack's numba
  allocation: :func:`split_mini_batches` hands ppo_update the rank's sequences in fixed groups of uneven sizes
  (:data:`MINI`) instead, with the same result type (``.mbs``);
* ``areal.api.engine_api.TrainEngine`` (an annotation) and the engine the actor is given: the proof's CPU engine
  (test module's ``Engine``, standing for FSDPEngine.train_batch: it packs each micro-batch's sequences, calls the
  loss function with logits, back-propagates and returns the optimizer step's grad_norm and lr).
"""
from __future__ import annotations

import ast
import dataclasses
import functools
import itertools
import types
import warnings
from pathlib import Path
from typing import Any

from _support import vendored
from _support.framework_code import _methods_from_source
from _support.proofs_areal import AReaLDist, _defs_from_source

FW = "areal"
TAG = "v0.4.0"
RELEASE = vendored.release(FW, TAG)

#: entries of the v0.3.1 .. v0.4.0 and realhf (v0.3.0 .. v0.5.1) ranges that no proof here fingerprints, and why
#: (none of those the real logs hit: test_proof_areal_old.py proves the grpo_actor/ and realhf ppo_actor/ ones)
ENTRY_WHY: dict[tuple[str, str, str | None], str] = {}


def _path(repo_path: str) -> Path:
    return vendored.provenance(FW, TAG).path(repo_path)


@functools.lru_cache(maxsize=None)
def tracker_module() -> types.ModuleType:
    """The tag's stats_tracker module (logging.py first, so its ``from areal.utils import logging`` binds the tag's)."""
    vendored.load(FW, "areal/utils/logging.py", tag=TAG)
    datapack = vendored.stand_in("areal.utils.datapack")
    datapack.flat2d = _methods_from_source(_path("areal/utils/datapack.py"), None, ["flat2d"],
                                           {"Any": Any, "itertools": itertools})["flat2d"]
    platform = types.SimpleNamespace(is_initialized=lambda: False, device_type="cpu")
    st = vendored.load(FW, "areal/utils/stats_tracker.py", tag=TAG,
                       stand_ins={"areal.platforms": vendored.stand_in("areal.platforms", current_platform=platform),
                                  "areal.utils.datapack": datapack})
    st.dist = AReaLDist()                                    # the simulated data-parallel group
    return st


def rank_stats_tracker() -> types.ModuleType:
    """One process's stats_tracker: the tag's module with its own DEFAULT_TRACKER and the module functions bound to
    it, as stats_tracker.py:280-288 makes them (each simulated rank runs in a thread, so each needs its own)."""
    st = tracker_module()
    mod = types.ModuleType("areal.utils.stats_tracker")
    mod.__dict__.update(st.__dict__)
    tracker = st.DistributedStatsTracker()
    mod.DEFAULT_TRACKER, mod.TRACKERS = tracker, {"": tracker}
    for name in ("stat", "denominator", "export", "scope", "scalar", "record_timing"):
        setattr(mod, name, getattr(tracker, name))
    return mod


@functools.lru_cache(maxsize=None)
def _support() -> types.SimpleNamespace:
    """functional.py's functions, cli_args.py's config classes and data.py's KLEstimator and Normalization, compiled
    from the tag's text once (see the module docstring for what stands in)."""
    import numpy as np
    import torch

    logging_mod = vendored.load(FW, "areal/utils/logging.py", tag=TAG)
    mpu = types.SimpleNamespace(is_initialized=lambda: False)
    functional = _defs_from_source(_path("areal/utils/functional.py"), {
        "functools": functools, "warnings": warnings, "Any": Any, "np": np, "torch": torch,
        "mpu": mpu, "get_ulysses_sequence_parallel_world_size": lambda: 1}, functions=True)
    cli_path = _path("areal/api/cli_args.py")
    tree = ast.parse(cli_path.read_text(encoding="utf-8"))
    (base,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "TrainEngineConfig"]
    base.body = [ast.Pass()]                                  # no field PPOActor reads (the module docstring)
    cli: dict[str, Any] = {"dataclass": dataclasses.dataclass, "field": dataclasses.field, "Any": Any}
    exec(compile(ast.fix_missing_locations(ast.Module(body=[base], type_ignores=[])), str(cli_path), "exec"),
         cli)                                                 # noqa: S102 - the tag's own code
    _defs_from_source(cli_path, cli, classes=("NormConfig", "MicroBatchSpec", "PPOActorConfig"))
    data = _defs_from_source(_path("areal/utils/data.py"), {"torch": torch, "np": np, "Any": Any,
                                                            "NormConfig": cli["NormConfig"]},
                             classes=("KLEstimator", "Normalization"))
    return types.SimpleNamespace(functional=functional, cli=cli, data=data, logging=logging_mod)


@functools.lru_cache(maxsize=None)
def _actor_code() -> Any:
    """actor.py's PPOActor class and top-level functions, compiled from the tag's text once."""
    path = _path("areal/engine/ppo/actor.py")
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    body = [n for n in tree.body if isinstance(n, ast.FunctionDef)
            or (isinstance(n, ast.ClassDef) and n.name == "PPOActor")]
    assert {"PPOActor", "grpo_loss_fn"} <= {n.name for n in body}, path
    return compile(ast.Module(body=body, type_ignores=[]), str(path), "exec")


def areal_actor(stats_tracker: types.ModuleType, split_mini_batches: Any) -> types.SimpleNamespace:
    """The tag's PPOActor, grpo_loss_fn and PPOActorConfig against one process's ``stats_tracker``;
    ``split_mini_batches`` stands for split_padded_tensor_dict_into_mb_list (the module docstring)."""
    import torch

    S = _support()
    f = S.functional
    ns: dict[str, Any] = {
        "torch": torch, "functools": functools, "Any": Any, "TrainEngine": Any, "stats_tracker": stats_tracker,
        "logger": S.logging.getLogger("PPOActor"), "MicroBatchSpec": S.cli["MicroBatchSpec"],
        "PPOActorConfig": S.cli["PPOActorConfig"], "KLEstimator": S.data["KLEstimator"],
        "Normalization": S.data["Normalization"], "split_padded_tensor_dict_into_mb_list": split_mini_batches,
        **{k: f[k] for k in ("dynamic_sampling", "gather_logprobs", "gather_logprobs_entropy", "ppo_actor_loss_fn",
                             "reward_overlong_penalty")},
    }
    exec(_actor_code(), ns)                                   # noqa: S102 - the tag's own code
    return types.SimpleNamespace(**ns)


# ------------------------------------------------------------------ realhf (the legacy system, trainer realhf)
class RealhfDist(AReaLDist):
    """The simulated data-parallel group for realhf's code, which also names the tensor-parallel group
    (``constants.tensor_parallel_group()``: one rank, so its all-reduce leaves the tensor as it is)."""

    def all_reduce(self, t, op="sum", group=None) -> None:
        if group == "tp":
            return
        super().all_reduce(t, op=op, group=group)


#: realhf.base.constants as the code under test asks it: the group names and sizes of one data-parallel rank per
#: simulated rank, no tensor or pipeline parallelism (the test's dist tells the groups apart by these names)
REALHF_CONSTANTS = dict(data_parallel_group=lambda: "dp", tensor_parallel_group=lambda: "tp",
                        tensor_parallel_world_size=lambda: 1, pipe_parallel_group=lambda: "pp",
                        is_last_pipe_stage=lambda: True)


@functools.lru_cache(maxsize=None)
def realhf_tracker_module() -> types.ModuleType:
    """realhf/base/stats_tracker.py of the tag (with realhf/base/logging.py), the simulated group as its dist."""
    vendored.load(FW, "realhf/base/logging.py", tag=TAG)
    datapack = vendored.stand_in("realhf.base.datapack")
    datapack.flat2d = _methods_from_source(_path("realhf/base/datapack.py"), None, ["flat2d"],
                                           {"Any": Any, "List": list, "itertools": itertools})["flat2d"]
    st = vendored.load(FW, "realhf/base/stats_tracker.py", tag=TAG, stand_ins={"realhf.base.datapack": datapack})
    st.dist = RealhfDist()
    return st


def realhf_rank_stats_tracker() -> types.ModuleType:
    """One process's realhf stats_tracker (its module functions bound to its own DEFAULT_TRACKER)."""
    st = realhf_tracker_module()
    mod = types.ModuleType("realhf.base.stats_tracker")
    mod.__dict__.update(st.__dict__)
    tracker = st.DistributedStatsTracker()
    mod.DEFAULT_TRACKER, mod.TRACKERS = tracker, {"": tracker}
    for name in ("stat", "denominator", "export", "scope", "scalar", "record_timing"):
        setattr(mod, name, getattr(tracker, name))
    return mod


def realhf_call_time_modules() -> dict[str, types.ModuleType]:
    """What realhf's stats_tracker imports when called (``export``: ``from realhf.base.constants import
    data_parallel_group``, stats_tracker.py@v0.4.0:135-139, and ``_amend_moe_losses``'s names): open with
    ``vendored.active(FW, TAG, extra=...)`` around the run."""
    return {"realhf.base.constants": vendored.stand_in("realhf.base.constants", **REALHF_CONSTANTS)}


@functools.lru_cache(maxsize=None)
def _realhf_code() -> tuple[Any, dict[str, Any]]:
    """ppo_interface.py's top-level functions and PPOActorInterface, compiled from the tag's text once, and the
    names they use: ppo_functional.py (whole, loaded by file), functional.py's packed log-prob helpers and
    masked_normalization and data_api.py's RL_TASKS (compiled from their text)."""
    import numpy as np
    import torch

    pkg_version = vendored.stand_in("realhf.base.pkg_version", is_available=lambda name: False)   # no cugae
    ppo_functional = vendored.load(FW, "realhf/impl/model/utils/ppo_functional.py", tag=TAG,
                                   stand_ins={"realhf.base.pkg_version": pkg_version})
    constants = types.SimpleNamespace(**REALHF_CONSTANTS)
    functional = _methods_from_source(_path("realhf/impl/model/utils/functional.py"), None,
                                      ["build_leave_one_indices", "gather_logprobs",
                                       "gather_packed_shifted_log_probs", "masked_normalization"],
                                      {"torch": torch, "np": np, "dist": RealhfDist(), "constants": constants,
                                       "Optional": Any, "Tuple": tuple})
    tree = ast.parse(_path("realhf/api/core/data_api.py").read_text(encoding="utf-8"))
    (tasks,) = [n for n in tree.body if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "RL_TASKS"]
    data_api: dict[str, Any] = {}
    exec(compile(ast.Module(body=[tasks], type_ignores=[]), "data_api.py", "exec"), data_api)   # noqa: S102
    path = _path("realhf/impl/model/interface/ppo_interface.py")
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    body = [n for n in tree.body if isinstance(n, ast.FunctionDef)
            or (isinstance(n, ast.ClassDef) and n.name == "PPOActorInterface")]
    names = {"ppo_functional": ppo_functional, "constants": constants, "RL_TASKS": data_api["RL_TASKS"],
             **{k: functional[k] for k in ("build_leave_one_indices", "gather_packed_shifted_log_probs",
                                           "masked_normalization")}}
    return compile(ast.Module(body=body, type_ignores=[]), str(path), "exec"), names


def realhf_actor(stats_tracker: types.ModuleType, sequence_sample: Any, split_spec: Any,
                 generation_hyperparameters: Any) -> types.SimpleNamespace:
    """The tag's PPOActorInterface and _ppo_actor_loss_from_model_outputs against one process's realhf
    ``stats_tracker``; ``sequence_sample`` and ``split_spec`` stand for data_api's SequenceSample and
    SequenceSplitSpec, ``generation_hyperparameters`` for model_api.GenerationHyperparameters (the test module says
    what they do)."""
    import dataclasses as dc

    import torch

    code, names = _realhf_code()
    ns: dict[str, Any] = {
        "dataclasses": dc, "torch": torch, "dist": RealhfDist(), "Dict": dict, "List": list, "Literal": Any,
        "Optional": Any, "stats_tracker": stats_tracker, "logger": _support().logging.getLogger("PPOInterface"),
        "flat2d": realhf_tracker_module().flat2d, "SequenceSample": sequence_sample, "SequenceSplitSpec": split_spec,
        "MicroBatchSpec": Any, "model_api": types.SimpleNamespace(
            ModelInterface=object, Model=Any, GenerationHyperparameters=generation_hyperparameters),
        **names,
    }
    exec(code, ns)                                            # noqa: S102 - the tag's own code
    return types.SimpleNamespace(**ns)


__all__ = ["ENTRY_WHY", "FW", "RELEASE", "TAG", "areal_actor", "rank_stats_tracker", "realhf_actor",
           "realhf_call_time_modules", "realhf_rank_stats_tracker", "realhf_tracker_module", "tracker_module"]
