"""TRL 0.25.1's preference and SFT trainers run for the fingerprint proofs of mappings/trl.yaml's entries that end
before the pinned 1.16.0 (tests/frameworks/test_proof_trl_old2.py; each proof runs in a child process with the
release first on sys.path: tests/_support/releases.py; the import fixes of tests/_support/proofs_trl_old.py's
:func:`~_support.proofs_trl_old.fix_optional_imports`).

* DPO at 0.25.1 (``trl.DPOTrainer``): its metrics are computed in ``get_batch_loss_metrics`` from the output of
  ``concatenated_forward`` (the per-token log-probs, the logits and the loss mask are that function's locals) and
  stored with ``store_metrics`` into ``_stored_metrics``, which ``log()`` averages. :class:`StoredRecorder` records,
  without replacing any TRL code: ``concatenated_forward``'s frame (found on the stack by a forward hook on the policy
  model, the hook only keeps the frame; its locals are read once the function returned) and each call of
  ``store_metrics`` (``_stored_metrics``'s lists replaced by lists whose ``append`` also notes the values and the
  optimizer step, as tests/_support/proofs_trl.py's MetricsRecorder does for ``_metrics``). Each stored call is one
  micro-batch: the policy's last ``concatenated_forward`` before it.

No stand-in beyond proofs_trl_old.py's (optional-package flags, ``warnings_issued``).

At the end, :data:`ENTRY_WHY`: the entries of 0.25.1 and 1.12.0 no proof fingerprints, each with why.
"""
from __future__ import annotations

import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .proofs_trl import COMMON
from .proofs_trl_old import fix_optional_imports, one_thread_quiet
from .tiny_trl import build_tiny_model, log_recorder, sentences


@dataclass
class Stored:
    """One ``store_metrics`` call (one micro-batch): the optimizer step it ran in (1-based), what it stored, and the
    locals of the policy's ``concatenated_forward`` that produced them."""
    step: int
    stored: dict[str, float] = field(default_factory=dict)
    forward: dict[str, Any] = field(default_factory=dict)
    gathered: list[Any] = field(default_factory=list)   # what gather_for_metrics returned during the call, in order


class StoredRecorder:
    """Records each ``store_metrics`` call of a trainer keeping ``_stored_metrics`` (``{mode: defaultdict(list)}``)
    and the locals of the policy's ``concatenated_forward`` before it (module docstring)."""

    def __init__(self, trainer: Any, model: Any, frame_name: str = "concatenated_forward") -> None:
        self.trainer = trainer
        self.calls: list[Stored] = []
        self._forward: Any = None           # the policy's last concatenated_forward frame
        self._frame: Any = None             # the store_metrics frame of the current call
        recorder = self

        class RecordingList(list):
            key = ""

            def append(self, value: Any) -> None:
                recorder._seen(sys._getframe(1), self.key, value)
                super().append(value)

        class Metrics(defaultdict):
            def __missing__(self, key: str) -> RecordingList:
                lst = self[key] = RecordingList()
                lst.key = key
                return lst

        trainer._stored_metrics = defaultdict(Metrics)
        self._gathered: list[Any] = []
        gather = trainer.accelerator.gather_for_metrics

        def recording_gather(*args: Any, **kw: Any) -> Any:
            out = gather(*args, **kw)
            recorder._gathered.append(out.detach().clone() if hasattr(out, "detach") else out)
            return out
        trainer.accelerator.gather_for_metrics = recording_gather

        def hook(_module: Any, _args: Any, _out: Any) -> None:
            f = sys._getframe(1)
            while f is not None and not (f.f_code.co_name == frame_name and "/trl/" in f.f_code.co_filename):
                f = f.f_back
            if f is not None and not f.f_locals.get("is_ref_model", False):
                recorder._forward = f
        self.handle = model.register_forward_hook(hook)

    def _seen(self, frame: Any, key: str, value: Any) -> None:
        if frame is not self._frame:
            self._frame = frame
            fwd = self._forward
            self.calls.append(Stored(self.trainer.state.global_step + 1,
                                     forward=_detached(fwd.f_locals) if fwd is not None else {},
                                     gathered=self._gathered))
            self._forward, self._gathered = None, []
        self.calls[-1].stored[key] = float(value)

    def close(self) -> None:
        self.handle.remove()
        self._frame = self._forward = None


def _detached(loc: dict[str, Any]) -> dict[str, Any]:
    """The tensors, numbers and batch dicts (``batch``: its tensors and lists) of a frame's locals, detached."""
    import torch

    def copy(v: Any) -> Any:
        return v.detach().clone() if isinstance(v, torch.Tensor) else v
    out = {k: copy(v) for k, v in loc.items() if isinstance(v, (torch.Tensor, int, float, bool))}
    out |= {k: {n: copy(x) for n, x in v.items()} for k, v in loc.items() if k == "batch" and isinstance(v, dict)}
    return out


@dataclass
class StoredRun:
    rows: list[tuple[int, dict[str, Any]]]
    calls: list[Stored]
    windows: list[tuple[int, int]] = field(default_factory=list)

    def train_rows(self) -> list[tuple[int, dict[str, Any]]]:
        return [(s, r) for s, r in self.rows if "loss" in r and "train_runtime" not in r]

    def obs(self, key: str, values: Any, stored: str | None = None) -> list:
        """(logged value, batch) of every train row logging ``key``: its optimizer steps, one rank, each step's
        ``store_metrics`` calls (micro-batches) that stored ``stored`` (``key`` by default) as
        ``values(forward locals)``."""
        stored = stored or key
        out = []
        for i, (_s, row) in enumerate(self.train_rows()):
            if key not in row:
                continue
            first, last = self.windows[i]
            steps = []
            for step in range(first, last + 1):
                micro = [values({**c.forward, "_gathered": c.gathered}) for c in self.calls
                         if c.step == step and stored in c.stored]
                if micro:
                    steps.append([[micro]])
            out.append((row[key], steps))
        assert out, f"no train row logged {key!r}"
        return out


def train_stored(trainer: Any, rec: Any, model: Any, frame_name: str = "concatenated_forward") -> StoredRun:
    calls = StoredRecorder(trainer, model, frame_name)
    try:
        with one_thread_quiet():
            trainer.train()
    finally:
        calls.close()
    run = StoredRun(rows=list(rec.stepped), calls=calls.calls)
    last = 0
    for step, _row in run.train_rows():
        run.windows.append((last + 1, step))
        last = step
    return run


def run_dpo(workdir: Path, *, n_pairs: int, **config: Any) -> StoredRun:
    """Train trl 0.25.1's DPOTrainer on ``n_pairs`` generated pairs (uneven micro-batches at the epoch's end)."""
    import datasets

    fix_optional_imports()
    from trl import DPOConfig, DPOTrainer

    model_path = build_tiny_model(workdir / "model")
    args = {**COMMON, "output_dir": str(workdir / "out"), "max_length": 24, **config}
    ds = datasets.Dataset.from_dict({"prompt": sentences(n_pairs, 2), "chosen": sentences(n_pairs, 3),
                                     "rejected": sentences(n_pairs, 4)})
    rec = log_recorder()
    trainer = DPOTrainer(model=model_path, args=DPOConfig(**args), train_dataset=ds, callbacks=[rec])
    return train_stored(trainer, rec, trainer.model)


#: get_batch_loss_metrics (trl/trainer/dpo_trainer.py@v0.25.1:1786-1797) gathers rewards/chosen, rewards/rejected,
#: rewards/accuracies, rewards/margins, then logps/chosen (index 4): a per-pair tensor, whose length is the pairs the
#: gather kept
LOGPS_GATHER = 4


def completion(name: str, chosen: bool, sign: float = 1.0, vocab_mean: bool = False, kept: bool = False):
    """Each chosen (rejected) sequence's values of ``concatenated_forward``'s (2B, T) tensor ``name`` at its
    completion tokens: TRL's ``loss_mask`` (rolled to the labels' positions). ``per_token_logps`` TRL rolled back one
    position after masking: rolled forward again to sit on the labels; ``logits`` (2B, T, V): each token's mean over
    the vocabulary with ``vocab_mean`` (TRL's ``logits[mask].mean()`` is the token mean of those). ``kept``: only the
    pairs accelerate's per-pair gather kept (on an epoch's last optimizer step the Trainer has fetched the step's
    micro-batches, the dataloader is at its end, and gather_for_metrics truncates a gather to the dataset's
    remainder: the first pairs of the micro-batch)."""
    import torch

    def values(loc: dict[str, Any]) -> list[list[float]]:
        x, mask = loc[name], loc["loss_mask"].bool()
        if name == "per_token_logps":
            x = torch.roll(x, shifts=-1, dims=1)
        if vocab_mean:
            x = x.float().mean(-1)
        n = int(loc["num_examples"])
        k = len(loc["_gathered"][LOGPS_GATHER]) if kept else n
        rows = range(k) if chosen else range(n, n + k)
        return [[sign * float(v) for v in x[i][mask[i]]] for i in rows]
    return values


def _unpaired(workdir: Path, n_examples: int, config: dict[str, Any]) -> tuple[str, dict[str, Any], Any, Any]:
    """What KTO and BCO train on: a tiny local model, the config, ``n_examples`` unpaired examples (desirable and
    undesirable in a fixed uneven pattern) and a log recorder."""
    import datasets
    model_path = build_tiny_model(workdir / "model")
    args = {**COMMON, "output_dir": str(workdir / "out"), "max_length": 24, **config}
    pattern = (1, 1, 1, 1, 0, 0, 1, 1, 0, 0, 1)
    labels = [bool(pattern[i % len(pattern)]) for i in range(n_examples)]
    ds = datasets.Dataset.from_dict({"prompt": sentences(n_examples, 7), "completion": sentences(n_examples, 8),
                                     "label": labels})
    return model_path, args, ds, log_recorder()


def run_kto(workdir: Path, *, n_examples: int, **config: Any) -> StoredRun:
    """Train trl 0.25.1's KTOTrainer on ``n_examples`` unpaired examples (tests/_support/proofs_trl.py's pattern
    of desirable and undesirable ones), recording each ``store_metrics`` call with the locals of the
    ``get_batch_loss_metrics`` call that computed it."""
    from transformers import AutoTokenizer

    fix_optional_imports()
    from trl import KTOConfig, KTOTrainer

    model_path, args, ds, rec = _unpaired(workdir, n_examples, config)
    trainer = KTOTrainer(model=model_path, args=KTOConfig(**args), train_dataset=ds, callbacks=[rec],
                         processing_class=AutoTokenizer.from_pretrained(model_path))
    return train_stored(trainer, rec, trainer.model, "get_batch_loss_metrics")


def run_bco(workdir: Path, *, n_examples: int, **config: Any) -> Any:
    """Train trl 0.25.1's BCOTrainer (trl.experimental.bco; no embedding function: no prompt classifier) on
    ``n_examples`` unpaired examples like :func:`run_kto`, recording (tests/_support/proofs_trl_pref.py's
    ReturnRecorder) the locals of each ``get_batch_logps`` and ``get_batch_loss_metrics`` call as it returns."""
    from transformers import AutoTokenizer

    from .proofs_trl_pref import train_recording

    fix_optional_imports()
    from trl.experimental.bco import BCOConfig, BCOTrainer

    model_path, args, ds, rec = _unpaired(workdir, n_examples, config)
    trainer = BCOTrainer(model=model_path, args=BCOConfig(**args), train_dataset=ds, callbacks=[rec],
                         processing_class=AutoTokenizer.from_pretrained(model_path))
    return train_recording(trainer, rec, ("get_batch_logps", "get_batch_loss_metrics"))


def run_gspo_token(workdir: Path, **config: Any) -> Any:
    """Train trl 0.25.1's GSPO-token trainer (``trl.experimental.gspo_token.GRPOTrainer``, a GRPOTrainer subclass
    with its own ``_compute_loss``: a grpo_variants trainer) as tests/_support/proofs_trl.py's ``run_grpo`` trains
    GRPOTrainer (the same recorders, the same prompts and rewards)."""
    import datasets

    from .proofs_trl import RL, default_rewards, suppress_all_but, train

    fix_optional_imports()
    from trl import GRPOConfig
    from trl.experimental.gspo_token import GRPOTrainer as GSPOTokenTrainer

    model_path = build_tiny_model(workdir / "model")
    args = {**COMMON, **RL, "output_dir": str(workdir / "out"), **config}
    args.setdefault("generation_kwargs", {"suppress_tokens": suppress_all_but(model_path)})
    ds = datasets.Dataset.from_dict({"prompt": sentences(256, 1)})
    rec = log_recorder()
    trainer = GSPOTokenTrainer(model=model_path, reward_funcs=default_rewards(), args=GRPOConfig(**args),
                               train_dataset=ds, callbacks=[rec])
    return train(trainer, rec)


_XPO = ("XPO's logps/chosen and logps/rejected (trl/experimental/xpo/xpo_trainer.py@v1.12.0, _log_statistics): "
        "the policy's and the reference's per-sequence log-prob means added together, a sum of two means that no "
        "candidate reduction computes (a stated deviation); every other XPO and Nash-MD key is fingerprinted by "
        "tests/frameworks/test_proof_trl_online_old.py at 1.12.0")
_XPO_KEYS = {"xpo": ("logps/chosen", "logps/rejected")}
_ASYNC = ("not fingerprinted: AsyncGRPOTrainer (trl/experimental/async_grpo@v1.12.0) takes its samples, rewards and "
          "rollout statistics from the async rollout worker, which generates with a vLLM server (not installable "
          "on this CPU test machine); no proof drives its loss and log at 1.12.0 yet (the 1.16.0 proofs in "
          "tests/frameworks/test_proof_trl_distill_async_grpo.py feed the pinned release's code directly)")
_DISTILL = ("not fingerprinted at 1.12.0: the distillation trainers of that release "
            "(trl/trainer/distillation_trainer.py, trl/experimental/gold, iw_opd) generate on-policy completions "
            "with a teacher model; no proof of them at 1.12.0 is written yet")

ENTRY_WHY: dict[tuple[str, str, str], str] = {
    **{("trl", key, trainer): _XPO for trainer, keys in _XPO_KEYS.items() for key in keys},
    ("trl", "loss", "sft"):
        "the entry (v0.2.0..v0.29.1) states no per-token reduction (deviation: the trainer's own loss), so no "
        "candidate can be asserted as the stated one; and at 0.25.1 SFTTrainer.compute_loss "
        "(trl/trainer/sft_trainer.py@v0.25.1:1085-1105) hands the loss to Trainer.compute_loss, i.e. to the model's "
        "own loss function (transformers' ForCausalLMLoss: the label tokens' cross-entropy summed over "
        "num_items_in_batch), so no per-token loss tensor exists in TRL's or the Trainer's frames to fingerprint "
        "without recomputing the cross-entropy",
    ("trl", "loss", "gkd"):
        "the entry (until v1.15.0) states no per-token reduction (deviation: the trainer's own loss), so no "
        "candidate can be asserted as the stated one; GKDTrainer 0.25.1's generalized_jsd_loss is not run here yet",
    ("trl", "loss", "distillation"):
        "the entry (until v1.15.0) states no per-token reduction (deviation: the trainer's own loss: "
        "DistillationTrainer, GOLD and IW-OPD compute different ones), so no candidate can be asserted as the "
        "stated one",
    ("trl", "loss", "self_distillation"):
        "the entry (until v1.15.0) states no per-token reduction (deviation: the trainer's own loss), so no "
        "candidate can be asserted as the stated one; SDFT/SDPO at 1.12.0 are not run here",
    ("trl", "rewards/margins", "bco"):
        "log() computes it as rewards/chosen minus rewards/rejected of the row (trl/experimental/bco/"
        "bco_trainer.py@v0.25.1:1508-1510, @v1.12.0: the same): a difference of two pooled means over different "
        "examples, which no candidate reduction of one population computes; both terms are fingerprinted "
        "(test_bco_0_25_example_means_are_pooled_over_the_row, test_bco_1_12_...)",
    ("trl", "clip_ratio", "grpo"):
        "logged only on the Liger-kernel loss path (use_liger_kernel: the kernel's own clip fraction, "
        "trl/trainer/grpo_trainer.py@v0.25.1:1710-1749, compute_liger_loss); liger_kernel (Triton, CUDA) is not "
        "installed on this CPU test machine",
    ("trl", "entropy/mean", "grpo"):
        "ms-swift's GRPOTrainer subclass (swift/rlhf_trainers/grpo_trainer.py@ms-swift-4.6.0, log_entropy) logs it, "
        "not TRL: ms-swift is not installed (its trl<1.0 requirement conflicts with the pinned trl 1.16.0)",
    ("trl", "rewards/{reward_fn}", "async_grpo"): _ASYNC,
    ("trl", "reward", "async_grpo"): _ASYNC,
    ("trl", "reward_std", "async_grpo"): _ASYNC,
    ("trl", "clip_ratio/low_min", "async_grpo"): _ASYNC,
    ("trl", "clip_ratio/high_max", "async_grpo"): _ASYNC,
    ("trl", "completions/truncated_fraction", "distillation"): _DISTILL,
    ("trl", "completions/{policy_mode}_mean_length", "distillation"): _DISTILL,
    ("trl", "completions/{policy_mode}_min_length", "distillation"): _DISTILL,
    ("trl", "completions/{policy_mode}_max_length", "distillation"): _DISTILL,
}
