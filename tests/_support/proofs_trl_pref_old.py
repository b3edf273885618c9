"""TRL's offline preference trainers at 0.11.4 and 0.13.0 (with the transformers, accelerate, datasets of their time:
tests/releases.txt), run for the fingerprint proofs of mappings/trl.yaml's DPO, CPO and ORPO entries that end at
v0.13.0 or v0.11.4, and of IterativeSFT's loss and learning_rate (tests/frameworks/test_proof_trl_pref_old.py; each
proof runs in a child process with the release first on sys.path: tests/_support/releases.py).

At these releases ``get_batch_loss_metrics`` returns a dict of the micro-batch's metrics (each a mean over the
process's pairs: no gather before v0.14.0), ``compute_loss`` files it with ``store_metrics`` (one list entry per
micro-batch) and ``log()`` logs ``torch.tensor(list).mean()`` of each list. :func:`run_pref` trains the release's
own ``DPOTrainer`` / ``CPOTrainer`` / ``ORPOTrainer`` on the tiny model of tests/_support/tiny_trl.py and copies,
with tests/_support/proofs_trl_pref.py's ReturnRecorder (``sys.setprofile``; no TRL method is replaced), the locals
of ``get_batch_logps``, ``concatenated_forward`` and ``get_batch_loss_metrics`` as each returns. Each
``get_batch_loss_metrics`` call is one micro-batch; the policy's forward is the first ``concatenated_forward`` (and
``get_batch_logps``) since the previous one (the reference's follows it).

:func:`run_iterative_sft` drives the release's IterativeSFTTrainer through its ``step()`` API (its own loop), recording
each micro-batch's loss and the rate around each ``lr_scheduler.step()`` with pass-through wrappers.

No stand-in: these releases import as they are with their companions.

At the end, :data:`ENTRY_WHY`: the entries of these releases no proof here fingerprints, each with why.
"""
from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

from .proofs_trl import COMMON, Call, TRLRun
from .tiny_trl import build_tiny_model, log_recorder, sentences

RECORDED = ("get_batch_logps", "concatenated_forward", "get_batch_loss_metrics")


def run_pref(kind: str, workdir: Path, *, n_pairs: int, **config: Any) -> TRLRun:
    """Train the installed release's ``kind`` trainer ("dpo", "cpo", "orpo") on ``n_pairs`` generated pairs; the
    run's calls are its ``get_batch_loss_metrics`` calls (one per micro-batch), each with ``_logps`` (the policy's
    ``get_batch_logps`` locals, where the release has that function) and ``_forward`` (the policy's
    ``concatenated_forward`` locals) among its locals."""
    import random

    import datasets
    import numpy as np
    import torch
    import trl
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .proofs_trl_pref import train_recording

    Config, Trainer = {"dpo": (trl.DPOConfig, trl.DPOTrainer), "cpo": (trl.CPOConfig, trl.CPOTrainer),
                       "orpo": (trl.ORPOConfig, trl.ORPOTrainer)}[kind]
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    model_path = build_tiny_model(workdir / "model")
    args = {**COMMON, "output_dir": str(workdir / "out"), "max_length": 24, "max_prompt_length": 12, **config}
    ds = datasets.Dataset.from_dict({"prompt": sentences(n_pairs, 2), "chosen": sentences(n_pairs, 3),
                                     "rejected": sentences(n_pairs, 4)})
    tok = AutoTokenizer.from_pretrained(model_path)
    params = inspect.signature(Trainer.__init__).parameters
    tok_kw = {"processing_class" if "processing_class" in params else "tokenizer": tok}
    model = AutoModelForCausalLM.from_pretrained(model_path)
    extra = {"ref_model": AutoModelForCausalLM.from_pretrained(model_path)} if kind == "dpo" else {}
    rec = log_recorder()
    trainer = Trainer(model=model, args=Config(**args), train_dataset=ds, callbacks=[rec], **tok_kw, **extra)
    run = train_recording(trainer, rec, RECORDED)
    calls: list[Call] = []
    logps: list[Call] = []
    fwd: list[Call] = []
    for c in run.calls:
        if c.name == "get_batch_logps":
            logps.append(c)
        elif c.name == "concatenated_forward":
            fwd.append(c)
        else:
            c.locals["_logps"] = logps[0].locals if logps else {}
            c.locals["_forward"] = fwd[0].locals if fwd else {}
            logps, fwd = [], []
            calls.append(c)
    run.calls = calls
    return run


def run_iterative_sft(workdir: Path, *, calls: int, n_texts: int, **config: Any) -> TRLRun:
    """Drive the installed release's IterativeSFTTrainer: ``calls`` calls of its ``step(texts=...)`` on ``n_texts``
    generated texts each (its own loop: one optimizer step and one ``lr_scheduler.step()`` per micro-batch, a row every
    ``logging_steps`` steps). Recorded by pass-through wrappers: each micro-batch's loss as ``compute_loss`` returned
    it (``run.calls``, one :class:`Call` per optimizer step with ``loss``), and the rate before and after each
    ``lr_scheduler.step()`` (``run.optimizer.lr_before`` / ``lr_after``)."""
    import random
    import types

    import numpy as np
    import torch
    import trl
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainingArguments

    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    model_path = build_tiny_model(workdir / "model")
    tok = AutoTokenizer.from_pretrained(model_path)
    rec = log_recorder()
    args = TrainingArguments(**{**COMMON, "output_dir": str(workdir / "out"), **config})
    trainer = trl.IterativeSFTTrainer(model=AutoModelForCausalLM.from_pretrained(model_path), args=args,
                                      processing_class=tok, max_length=24)
    trainer.add_callback(rec)
    losses: list[Call] = []
    lr = types.SimpleNamespace(lr_before=[], lr_after=[])
    compute_loss = trainer.compute_loss

    def recording_loss(*a: Any, **kw: Any) -> Any:
        out = compute_loss(*a, **kw)
        losses.append(Call("compute_loss", trainer.state.global_step + 1, {"loss": out.detach().clone()}))
        return out
    trainer.compute_loss = recording_loss
    sched_step = trainer.lr_scheduler.step

    def recording_step(*a: Any, **kw: Any) -> Any:
        lr.lr_before.append(trainer.lr_scheduler.get_last_lr()[0])
        out = sched_step(*a, **kw)
        lr.lr_after.append(trainer.lr_scheduler.get_last_lr()[0])
        return out
    trainer.lr_scheduler.step = recording_step
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for i in range(calls):
            trainer.step(texts=sentences(n_texts, 30 + i))
    finally:
        torch.set_num_threads(threads)
    run = TRLRun(config=args.to_dict(), rows=list(rec.stepped), calls=losses, optimizer=lr)   # type: ignore[arg-type]
    last = 0
    for step, _row in run.train_rows():
        run.windows.append((last + 1, step))
        last = step
    return run


_BCO_LOGITS = ("not logged: at v0.11.4 BCOTrainer.get_batch_loss_metrics (trl/trainer/bco_trainer.py@v0.11.4:"
               "1155-1230) stores delta, rewards/*_sum, logps/*_sum and count/* only, no logits/* key, so no train "
               "row holds it; prediction_step reads metrics['logits/chosen'] (bco_trainer.py@v0.11.4:1343-1345), "
               "a KeyError unless prediction_loss_only: the key the entry describes is never written at 0.11.4, "
               "nothing to fingerprint")

ENTRY_WHY: dict[tuple[str, str, str], str] = {
    ("trl", "logits/chosen", "bco"): _BCO_LOGITS,
    ("trl", "logits/rejected", "bco"): _BCO_LOGITS,
    ("trl", "rewards/margins", "bco"):
        "log() computes it as rewards/chosen minus rewards/rejected of the row (trl/trainer/bco_trainer.py@v0.11.4:"
        "1433-1434, the same at v0.25.1 and v1.12.0): a difference of two pooled means over different examples, "
        "which no candidate reduction of one population computes",
}
