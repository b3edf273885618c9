"""The frameworks' own metric code, loaded for the fidelity proofs (tests/frameworks/test_fidelity_proofs.py) on a CPU
machine.

* TRL is imported from its wheel (``trl.GRPOTrainer``); its metric code runs as methods of a GRPOTrainer built
  without ``__init__`` (no model, no data set): the pieces it needs are set by the proofs.
* veRL is imported from its wheel (``pip install --no-deps verl``; ``import verl`` needs ray, tensordict and
  omegaconf, which install on CPU).
* OpenRLHF's package ``__init__`` files import DeepSpeed, peft, ray and vLLM, which a CPU machine lacks (DeepSpeed
  builds CUDA ops from source). The files that hold the metric code are loaded by file from the installed wheel:
  ``models/utils.py`` (with an empty stand-in for ``deepspeed``, used only by ``set_z3_leaf_modules``),
  ``models/loss.py``, ``utils/loss_utils.py``, ``utils/utils.py``, ``trainer/ppo_utils/experience.py``; and the two
  methods of ``trainer/ray/ppo_actor.py`` that compute and aggregate the actor's metrics (``ppo_train``,
  ``training_step``) are compiled from that file's own source text, with its module-level names bound to the
  loaded pieces.

Data parallelism is simulated: every rank runs in its own thread, and the collectives the frameworks call
(``accelerator.gather/reduce``, ``torch.distributed.all_reduce``, DeepSpeed's ``strategy.all_reduce``) meet at a
barrier and combine what every rank brought. Nothing here computes a metric itself.
"""
from __future__ import annotations

import ast
import functools
import importlib.machinery
import importlib.metadata
import importlib.util
import sys
import threading
import types
from pathlib import Path
from typing import Any, Callable

WORLD = 2                      # simulated data-parallel ranks


def release(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


# --------------------------------------------------------------------------------------------- simulated ranks
class Group:
    """The ranks of one simulated data-parallel group; ``exchange`` is the one collective everything uses."""

    def __init__(self, world: int = WORLD):
        self.world = world
        self._slots: list[Any] = [None] * world
        self._barrier = threading.Barrier(world)

    def exchange(self, rank: int, value: Any) -> list[Any]:
        self._slots[rank] = value
        self._barrier.wait()
        out = list(self._slots)
        self._barrier.wait()
        return out


_current = threading.local()


def current_rank() -> tuple[Group, int]:
    return _current.group, _current.rank


def run_ranks(fn: Callable[[int], Any], world: int = WORLD) -> list[Any]:
    """``fn(rank)`` on ``world`` threads sharing one Group; the results in rank order (errors re-raised)."""
    group = Group(world)
    results: list[Any] = [None] * world
    errors: list[BaseException] = []

    def body(rank: int) -> None:
        _current.group, _current.rank = group, rank
        try:
            results[rank] = fn(rank)
        except BaseException as e:          # noqa: BLE001 - handed to the caller
            errors.append(e)
            group._barrier.abort()

    threads = [threading.Thread(target=body, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    if errors:
        raise errors[0]
    return results


class SimAccelerator:
    """What TRL's trainers call on ``accelerate.Accelerator`` for metrics: gather (concatenate over ranks in rank
    order) and reduce (sum or mean over ranks)."""

    device = "cpu"

    def __init__(self) -> None:
        self.group, self.process_index = current_rank()
        self.num_processes = self.group.world
        self.is_main_process = self.process_index == 0
        self.sync_gradients = True

    def gather(self, t):
        import torch
        parts = self.group.exchange(self.process_index, t.detach().clone())
        return torch.cat([p.reshape(-1) if p.dim() == 0 else p for p in parts])

    gather_for_metrics = gather

    def reduce(self, t, reduction: str = "sum"):
        parts = self.group.exchange(self.process_index, t.detach().clone())
        total = functools.reduce(lambda a, b: a + b, parts)
        return total / self.num_processes if reduction == "mean" else total


class SimDist(types.SimpleNamespace):
    """``torch.distributed`` as the loaded OpenRLHF files call it: initialised, ``all_reduce`` in place."""

    class ReduceOp:
        SUM, MAX = "sum", "max"

    def is_available(self) -> bool:
        return True

    def is_initialized(self) -> bool:
        return True

    def get_world_size(self, group=None) -> int:
        return current_rank()[0].world

    def all_reduce(self, t, op="sum", group=None) -> None:
        g, r = current_rank()
        parts = g.exchange(r, t.detach().clone())
        if op == "max":
            out = functools.reduce(lambda a, b: a.maximum(b), parts)
        else:
            out = functools.reduce(lambda a, b: a + b, parts)
        t.copy_(out)


# --------------------------------------------------------------------------------------------- TRL
@functools.lru_cache(maxsize=None)
def trl() -> types.SimpleNamespace:
    from trl import GRPOConfig, GRPOTrainer
    from trl.trainer import grpo_trainer
    return types.SimpleNamespace(GRPOTrainer=GRPOTrainer, GRPOConfig=GRPOConfig, module=grpo_trainer,
                                 release=release("trl"))


# --------------------------------------------------------------------------------------------- veRL
@functools.lru_cache(maxsize=None)
def verl() -> types.SimpleNamespace:
    import os
    os.environ.setdefault("VERL_USE_EXTERNAL_PLUGINS", "none")   # for the script run; under pytest conftest sets it
    from verl import DataProto
    from verl.trainer.ppo import core_algos, metric_utils
    from verl.utils import seqlen_balancing
    from verl.utils.metric import AggregationType, Metric
    return types.SimpleNamespace(DataProto=DataProto, core_algos=core_algos, metric_utils=metric_utils,
                                 seqlen_balancing=seqlen_balancing, gdpo_block=lambda: _verl_gdpo_block(),
                                 Metric=Metric, AggregationType=AggregationType, release=release("verl"))


# --------------------------------------------------------------------------------------------- OpenRLHF
def _package_dir(dist: str, top: str) -> Path:
    spec = importlib.util.find_spec(top)        # finds the folder without running its __init__
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"{dist} is not installed (make test installs it)")
    return Path(list(spec.submodule_search_locations)[0])


def _skeleton(name: str, path: Path) -> None:
    """An empty package module for ``name`` (its __init__.py is not run), so relative imports resolve."""
    if name in sys.modules:
        return
    mod = types.ModuleType(name)
    mod.__path__ = [str(path)]
    mod.__package__ = name
    sys.modules[name] = mod


def _load_file(name: str, path: Path, stand_ins: dict[str, types.ModuleType] | None = None) -> types.ModuleType:
    saved = {k: sys.modules.get(k) for k in (stand_ins or {})}
    sys.modules.update(stand_ins or {})
    try:
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
        return mod
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v


class StandInClock:
    """A clock module as a framework's module sees it (set as that module's ``time`` attribute): its reading function
    ``attr`` (``time`` or ``perf_counter``) returns ``now`` after moving it by ``step(k)`` at the k-th reading (0 by
    default: the clock moves only by :meth:`advance`), every reading recorded in ``readings``; anything else is the
    real module's. The proofs' runtimes are then the same numbers in every process."""

    def __init__(self, real: Any, start: float, *, attr: str = "time",
                 step: Callable[[int], float] = lambda k: 0.0) -> None:
        self._real, self._attr, self._step = real, attr, step
        self.now, self.readings = start, []

    def read(self) -> float:
        self.now += self._step(len(self.readings))
        self.readings.append(self.now)
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def __getattr__(self, name: str) -> Any:
        return self.read if name == self._attr else getattr(self._real, name)


def _methods_from_source(path: Path, cls: str | None, names: list[str], namespace: dict[str, Any], *,
                         keep: Callable[[ast.expr], bool] | None = None) -> dict[str, Any]:
    """The functions ``cls.<name>`` (module-level functions when ``cls`` is None) of the file at ``path``, compiled
    from its own text into ``namespace``; ``keep``: which of their decorators stay (all, when None)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    body = tree.body if cls is None else next(n for n in tree.body
                                              if isinstance(n, ast.ClassDef) and n.name == cls).body
    wanted = [n for n in body if isinstance(n, ast.FunctionDef) and n.name in names]
    missing = set(names) - {n.name for n in wanted}
    if missing:
        raise ImportError(f"{path}: {cls or 'the module'} has no {sorted(missing)}")
    if keep is not None:
        for n in wanted:
            n.decorator_list = [d for d in n.decorator_list if keep(d)]
    module = ast.Module(body=wanted, type_ignores=[])
    exec(compile(module, str(path), "exec"), namespace)         # noqa: S102 - the wheel's own code
    return {n: namespace[n] for n in names}


@functools.lru_cache(maxsize=None)
def openrlhf() -> types.SimpleNamespace:
    import torch
    from torch.utils.data import DataLoader
    from tqdm import tqdm

    root = _package_dir("openrlhf", "openrlhf")
    for pkg, sub in [("openrlhf", ""), ("openrlhf.models", "models"), ("openrlhf.utils", "utils"),
                     ("openrlhf.trainer", "trainer"), ("openrlhf.trainer.ppo_utils", "trainer/ppo_utils")]:
        _skeleton(pkg, root / sub)
    no_deepspeed = types.ModuleType("deepspeed")            # only set_z3_leaf_modules uses it
    models_utils = _load_file("openrlhf.models.utils", root / "models/utils.py", {"deepspeed": no_deepspeed})
    loss = _load_file("openrlhf.models.loss", root / "models/loss.py")
    loss_utils = _load_file("openrlhf.utils.loss_utils", root / "utils/loss_utils.py")
    loss_utils.dist = SimDist()                             # the simulated data-parallel group
    _load_file("openrlhf.utils.utils", root / "utils/utils.py")
    experience = _load_file("openrlhf.trainer.ppo_utils.experience", root / "trainer/ppo_utils/experience.py")

    actor_file = root / "trainer/ray/ppo_actor.py"
    namespace: dict[str, Any] = {
        "torch": torch, "DataLoader": DataLoader, "tqdm": tqdm, "Dict": dict, "Optional": Any, "List": list,
        "Union": Any, "fields": __import__("dataclasses").fields, "Experience": experience.Experience,
        "aggregate_loss": loss.aggregate_loss, "compute_approx_kl": models_utils.compute_approx_kl,
        "masked_mean": models_utils.masked_mean, "get_loss_batch_info": loss_utils.get_loss_batch_info,
        "iter_grad_accum_global_norm": loss_utils.iter_grad_accum_global_norm,
        "merge_mm_train_inputs": lambda *a, **k: {}, "PolicyLoss": loss.PolicyLoss,
    }
    methods = _methods_from_source(actor_file, "ActorPPOTrainer", ["ppo_train", "training_step"], namespace)
    return types.SimpleNamespace(
        models_utils=models_utils, loss=loss, loss_utils=loss_utils, Experience=experience.Experience,
        masked_mean=models_utils.masked_mean, compute_approx_kl=models_utils.compute_approx_kl,
        aggregate_loss=loss.aggregate_loss, PolicyLoss=loss.PolicyLoss, DPOLoss=loss.DPOLoss,
        ppo_train=methods["ppo_train"], training_step=methods["training_step"], release=release("openrlhf"),
        files={"actor": "openrlhf/trainer/ray/ppo_actor.py", "loss": "openrlhf/models/loss.py",
               "loss_utils": "openrlhf/utils/loss_utils.py"})


def strategy_all_reduce(data: dict, op: str = "mean") -> dict:
    """DeepSpeed strategy ``all_reduce`` of a dict of numbers (openrlhf/utils/deepspeed/deepspeed.py): every value
    divided by the world size for "mean", then summed over ranks; Python numbers come back as numbers."""
    g, r = current_rank()
    parts = g.exchange(r, dict(data))
    out = {}
    for k in data:
        vals = [float(p[k].item() if hasattr(p[k], "item") else p[k]) for p in parts]
        out[k] = max(vals) if op == "max" else sum(v / g.world if op == "mean" else v for v in vals)
    return out


@functools.lru_cache(maxsize=None)
def openrlhf_critic() -> types.SimpleNamespace:
    """``CriticPPOTrainer.ppo_train`` and ``training_step`` of the wheel's trainer/ray/ppo_critic.py, compiled from
    the file's own text (its module imports ray and DeepSpeed), with its module-level names bound to the loaded
    OpenRLHF pieces (``ValueLoss``, ``aggregate_loss``, ``get_loss_batch_info``, ``iter_grad_accum_global_norm``)."""
    import torch
    from torch.utils.data import DataLoader
    from tqdm import tqdm

    o = openrlhf()
    root = Path(o.loss.__file__).resolve().parents[1]      # the wheel's openrlhf/ (its package is a skeleton)
    namespace: dict[str, Any] = {
        "torch": torch, "DataLoader": DataLoader, "tqdm": tqdm, "Dict": dict, "Optional": Any, "List": list,
        "Experience": o.Experience, "masked_mean": o.masked_mean,
        "get_loss_batch_info": o.loss_utils.get_loss_batch_info,
        "iter_grad_accum_global_norm": o.loss_utils.iter_grad_accum_global_norm,
    }
    methods = _methods_from_source(root / "trainer/ray/ppo_critic.py", "CriticPPOTrainer",
                                   ["ppo_train", "training_step"], namespace)
    return types.SimpleNamespace(ppo_train=methods["ppo_train"], training_step=methods["training_step"],
                                 ValueLoss=o.loss.ValueLoss, file="openrlhf/trainer/ray/ppo_critic.py")


def sim_gather(t):
    """accelerate.utils.gather over the simulated ranks (concatenated in rank order)."""
    import torch
    g, r = current_rank()
    parts = g.exchange(r, t.detach().clone())
    return torch.cat([p.reshape(-1) if p.dim() == 0 else p for p in parts])


def sim_gather_object(obj):
    """accelerate.utils.gather_object over the simulated ranks (lists concatenated in rank order)."""
    g, r = current_rank()
    return [x for part in g.exchange(r, list(obj)) for x in part]


def _verl_gdpo_block() -> Any:
    """The GDPO per-reward-function metric block of veRL's ``RayPPOTrainer.fit`` (ray_trainer.py), which is inline in
    the training loop: the ``gdpo_reward_keys = ...`` statement and the ``if`` that follows it, compiled from the
    installed file's own text."""
    import verl.trainer.ppo as ppo
    path = Path(ppo.__file__).resolve().parent / "ray_trainer.py"
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "RayPPOTrainer")
    fit = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "fit")
    for node in ast.walk(fit):
        for field_name in ("body", "orelse"):
            stmts = getattr(node, field_name, None)
            if not isinstance(stmts, list):
                continue
            for i, st in enumerate(stmts[:-1]):
                if isinstance(st, ast.Assign) and any(isinstance(tg, ast.Name) and tg.id == "gdpo_reward_keys"
                                                      for tg in st.targets) and isinstance(stmts[i + 1], ast.If):
                    block = ast.Module(body=[st, stmts[i + 1]], type_ignores=[])
                    return compile(ast.fix_missing_locations(block), str(path), "exec")
    raise ImportError(f"{path}: no gdpo_reward_keys block in RayPPOTrainer.fit")


def openrlhf_strategy(rank: int, accumulated_gradient: int) -> types.SimpleNamespace:
    """The parts of OpenRLHF's DeepSpeed strategy a trainer's loop touches, on one simulated rank: the real
    ``all_reduce`` arithmetic (``strategy_all_reduce``), no backward pass, no optimizer step."""
    return types.SimpleNamespace(
        ring_attn_group=None, accumulated_gradient=accumulated_gradient, is_rank_0=lambda: rank == 0,
        all_reduce=strategy_all_reduce, backward=lambda *a, **k: None, optimizer_step=lambda *a, **k: None,
        get_grad_norm=lambda model: 0.0)


def openrlhf_buffer(items: list):
    """A replay buffer handing out prepared experiences one at a time, as OpenRLHF's trainers iterate theirs."""
    import torch

    class Buffer(torch.utils.data.Dataset):
        sample_batch_size = 1

        def __len__(self):
            return len(items)

        def __getitem__(self, i):
            return items[i]

        @staticmethod
        def collate_fn(xs):
            return xs[0]

    return Buffer()
