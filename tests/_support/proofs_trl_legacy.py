"""TRL 0.11.4 (the last release of the step()-based PPOTrainer, and its RLOOTrainer), 0.5.0 (the legacy PPOTrainer
before compute_rewards returned the KL and before score scaling) and 0.2.1 (one sequence per optimizer step, no
masks: :func:`run_ppo_021`, with 0.5.0's companions) run for the fingerprint proofs of
tests/frameworks/test_proof_trl_legacy.py; each proof runs in a child process with the release and its companions
first on sys.path (tests/_support/releases.py): transformers 4.44.2, accelerate 0.34.2, datasets 3.0.1 ... for 0.11.4;
for 0.5.0 transformers 4.38.2 (trl/core.py@v0.5.0 imports ``top_k_top_p_filtering``, which transformers removed in
4.39), accelerate 0.27.2, tokenizers 0.15.2, datasets 3.0.1 with huggingface_hub 0.25.2, and setuptools 75.8.0
(trl/import_utils.py@v0.5.0 imports ``pkg_resources``, which setuptools 81 dropped).

* The legacy ``PPOTrainer`` (:func:`run_ppo_legacy`): ``PPOTrainer.step`` is called with queries and responses of
  uneven lengths (token ids drawn from a seeded generator) and scores of our choosing, as a user's loop would after
  generating and scoring; ``log_stats`` is called after each step with the same scores. Nothing of TRL is replaced;
  pass-through recorders copy what TRL computed and reduced:

  - ``masked_mean`` and ``masked_var`` as ``trl/trainer/ppo_trainer.py`` calls them (the module's globals, wrapped):
    every population TRL reduces in ``PPOTrainer.loss`` (the per-token losses, clip indicators, ratios, entropies,
    returns and values of one micro-batch, with its response mask) and in ``record_step_stats`` (the KL penalty of
    the rollout batch), in call order, with what the call returned;
  - ``PPOTrainer.loss`` (wrapped): which of those calls belong to one micro-batch, and the statistics it returned;
  - ``PPOTrainer.record_step_stats`` (wrapped): the rollout tensors it was given (the KL per token, the masks, the
    log-probs, the non-score reward, the scores, queries and responses, the KL coefficient) and what it returned;
  - ``Accelerator.log`` (wrapped, on the trainer's accelerator): each row ``log_stats`` logs (``log_with`` None: no
    tracker, the row is what a tracker would have received);
  - the learning rate before and after each ``step`` (``optimizer.param_groups[0]["lr"]``).

* ``RLOOTrainer`` at 0.11.4 (:func:`run_rloo_legacy`): ``RLOOTrainer.train`` trains the tiny model with a tiny
  sequence-classification reward model (a Llama with a random score head, built in code as
  tests/_support/tiny_trl.py builds the policy). Its metrics are computed inside ``train``, one long function: as
  for PPO at 1.12.0 (tests/_support/proofs_trl_old.py), its locals are copied when each micro-batch's
  ``with accelerator.accumulate(model):`` block ends (a pass-through wrapper of ``Accelerator.accumulate``) and when a
  row is logged (an ``on_log`` callback).

No stand-ins: the releases import and run as they are with their companions. Not runnable: ``use_score_scaling`` at
0.11.4 (``step`` calls ``self.running.std.to(...)``, ppo_trainer.py@v0.11.4:688, on a float: RunningMoments.update
stores ``.item()``, trl/trainer/utils.py@v0.11.4:703; AttributeError on the first step), so the scaled-scores entry
of ppo/mean_scores is proven with ``score_clip`` alone.

At the end, :data:`ENTRY_WHY`: the entries of these trainers no proof here fingerprints, each with why.
"""
from __future__ import annotations

import contextlib
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .tiny_trl import build_tiny_model, sentences


@contextlib.contextmanager
def one_thread_quiet() -> Any:
    """The trainer's code on one torch thread (the batches are tiny), its prints sent to stderr."""
    import torch
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        torch.set_num_threads(threads)


def _clone(v: Any) -> Any:
    import torch
    if isinstance(v, torch.Tensor):
        return v.detach().clone()
    if isinstance(v, list):
        return [_clone(x) for x in v]
    if isinstance(v, dict):
        return {k: _clone(x) for k, x in v.items()}
    return v


def rows_of(tensor: Any, mask: Any = None) -> list[list[float]]:
    """Each row of a (B, T) tensor at the positions ``mask`` keeps (every position without one)."""
    if mask is None:
        return [[float(v) for v in row] for row in tensor.float()]
    return [[float(v) for v in row[keep]] for row, keep in zip(tensor.float(), mask.bool())]


def seq_values(values: Any) -> list[list[float]]:
    """One value per sequence (a per-sequence quantity: the fingerprint's ``per_seq`` population)."""
    return [[float(v)] for v in values]


# ------------------------------------------------------------------------------------------- legacy PPOTrainer
#: the masked_mean calls of PPOTrainer.loss (trl/trainer/ppo_trainer.py@v0.11.4:1229-1277), in call order
LOSS_MEANS = ("vf_loss", "vf_clipfrac", "pg_loss", "pg_clipfrac", "avg_ratio", "entropy", "approxkl", "policykl",
              "return_mean", "value_mean", "advantages_mean", "vpred", "error")
#: its masked_var calls, in order
LOSS_VARS = ("return_var", "value_var")


@dataclass
class Reduced:
    """One masked_mean (masked_var) call: the values, the mask and what TRL computed of them."""
    values: Any
    mask: Any
    out: Any


@dataclass
class Micro:
    """One PPOTrainer.loss call (one micro-batch of mini_batch_size sequences): its masked means and variances by
    name (:data:`LOSS_MEANS`, :data:`LOSS_VARS`) and the statistics it returned."""
    means: dict[str, Reduced]
    vars: dict[str, Reduced]
    stats: dict[str, Any]


@dataclass
class LegacyStep:
    """One PPOTrainer.step: its micro-batches in order, the rollout data record_step_stats was given, the stats it
    returned, the row log_stats logged, the scores given, and the learning rate before and after the step."""
    micros: list[Micro] = field(default_factory=list)
    rollout: dict[str, Any] = field(default_factory=dict)
    record_means: list[Reduced] = field(default_factory=list)
    recorded: dict[str, Any] = field(default_factory=dict)
    returned: dict[str, Any] = field(default_factory=dict)
    row: dict[str, Any] = field(default_factory=dict)
    scores: list[float] = field(default_factory=list)
    lr_before: float = 0.0
    lr_after: float = 0.0
    kl_coef_after: float = 0.0


@dataclass
class LegacyRun:
    config: dict[str, Any]
    steps: list[LegacyStep]

    def micro_steps(self, step: LegacyStep, values: Any) -> list:
        """One step's update statistics as the fingerprint's batch: one logged step, its optimizer steps (each
        backward batch of each PPO epoch: gradient_accumulation_steps micro-batches), one rank, each micro-batch's
        ``values(micro)``: its sequences' values."""
        gas = self.config["gradient_accumulation_steps"]
        minis = [step.micros[i:i + gas] for i in range(0, len(step.micros), gas)]
        return [[[[values(m) for m in mini]] for mini in minis]]

    @staticmethod
    def rollout_steps(step: LegacyStep, values: Any) -> list:
        """The rollout batch of one step: one step, one optimizer step, one rank, one micro-batch of its sequences."""
        return [[[[values(step)]]]]


def _rollout_batch(rng: random.Random, n: int, vocab: int, lo: int, hi: int) -> list[list[int]]:
    return [[rng.randrange(4, vocab) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


def run_ppo_legacy(workdir: Path, *, n_steps: int = 3, scores: list[list[float]] | None = None,
                   ref_noise: float = 0.05, **config: Any) -> LegacyRun:
    """Run trl.PPOTrainer.step (the legacy trainer) ``n_steps`` times on the tiny model with ``config`` (PPOConfig
    fields), each step's queries (3..8 tokens) and responses (2..9 tokens) drawn from a seeded generator; the
    reference model is the tiny model with seeded noise added to its weights (a KL to the reference from the first
    step). A linear LR scheduler is given, so the learning rate changes from step to step."""
    import numpy as np
    import torch
    import trl.trainer.ppo_trainer as pt
    from transformers import AutoTokenizer
    from trl import AutoModelForCausalLMWithValueHead, PPOConfig, PPOTrainer

    path = build_tiny_model(workdir / "model")
    tok = AutoTokenizer.from_pretrained(path)
    torch.manual_seed(1)
    np.random.seed(1)                   # step() draws each epoch's mini-batch order with np.random.permutation
    policy = AutoModelForCausalLMWithValueHead.from_pretrained(path)
    ref = AutoModelForCausalLMWithValueHead.from_pretrained(path)
    with torch.no_grad():
        gen = torch.Generator().manual_seed(2)
        for prm in ref.parameters():
            prm.add_(ref_noise * torch.randn(prm.shape, generator=gen))
    cfg = PPOConfig(**config)
    optimizer = torch.optim.Adam(policy.parameters(), lr=cfg.learning_rate)
    sched = torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=1.0, end_factor=0.25, total_iters=n_steps)
    trainer = PPOTrainer(cfg, policy, ref, tok, optimizer=optimizer, lr_scheduler=sched)

    steps: list[LegacyStep] = []
    state: dict[str, Any] = {"in": None}          # where a masked_mean call belongs: "loss", "record" or None
    orig_mean, orig_var = pt.masked_mean, pt.masked_var
    calls: list[tuple[str, Reduced]] = []

    def rec_mean(values: Any, mask: Any, *a: Any, **kw: Any) -> Any:
        out = orig_mean(values, mask, *a, **kw)
        if state["in"] is not None:
            calls.append(("mean", Reduced(_clone(values), _clone(mask), _clone(out))))
        return out

    def rec_var(values: Any, mask: Any, *a: Any, **kw: Any) -> Any:
        out = orig_var(values, mask, *a, **kw)
        if state["in"] is not None:
            calls.append(("var", Reduced(_clone(values), _clone(mask), _clone(out))))
        return out

    loss, record = trainer.loss, trainer.record_step_stats

    def rec_loss(*a: Any, **kw: Any) -> Any:
        state["in"] = "loss"
        calls.clear()
        try:
            out = loss(*a, **kw)
        finally:
            state["in"] = None
        means = [r for k, r in calls if k == "mean"]
        variances = [r for k, r in calls if k == "var"]
        assert len(means) == len(LOSS_MEANS) and len(variances) == len(LOSS_VARS), (len(means), len(variances))
        steps[-1].micros.append(Micro(dict(zip(LOSS_MEANS, means)), dict(zip(LOSS_VARS, variances)),
                                      _clone(out[2])))
        return out

    def rec_record(kl_coef: float, **data: Any) -> Any:
        steps[-1].rollout = {"kl_coef": kl_coef, **{k: _clone(v) for k, v in data.items() if k != "train_stats"}}
        state["in"] = "record"
        calls.clear()
        try:
            out = record(kl_coef=kl_coef, **data)
        finally:
            state["in"] = None
        steps[-1].record_means = [r for _k, r in calls]
        steps[-1].recorded = _clone(dict(out))
        return out

    log = trainer.accelerator.log

    def rec_log(values: dict, *a: Any, **kw: Any) -> Any:
        steps[-1].row = dict(values)
        return log(values, *a, **kw)

    pt.masked_mean, pt.masked_var = rec_mean, rec_var
    trainer.loss, trainer.record_step_stats = rec_loss, rec_record
    trainer.accelerator.log = rec_log
    rng = random.Random(3)
    vocab = len(tok)
    bs = cfg.batch_size
    try:
        with one_thread_quiet():
            for i in range(n_steps):
                queries = [torch.tensor(q) for q in _rollout_batch(rng, bs, vocab, 3, 8)]
                responses = [torch.tensor(r) for r in _rollout_batch(rng, bs, vocab, 2, 9)]
                given = scores[i] if scores else [round(rng.uniform(-2.0, 3.0), 3) for _ in range(bs)]
                st = LegacyStep(scores=list(given), lr_before=optimizer.param_groups[0]["lr"])
                steps.append(st)
                out = trainer.step(queries, responses, [torch.tensor(s) for s in given])
                st.returned = dict(out)
                st.lr_after = optimizer.param_groups[0]["lr"]
                st.kl_coef_after = float(trainer.kl_ctl.value)
                trainer.log_stats(out, {"query": [""] * bs, "response": [""] * bs},
                                  [torch.tensor(s) for s in given])
    finally:
        pt.masked_mean, pt.masked_var = orig_mean, orig_var
    conf = {k: getattr(cfg, k) for k in ("batch_size", "mini_batch_size", "gradient_accumulation_steps",
                                         "ppo_epochs", "vf_coef", "kl_penalty", "backward_batch_size")}
    return LegacyRun(conf, steps)


# ------------------------------------------------------------------------------------------- legacy PPO at 0.2.1
#: the locals of PPOTrainer.loss at 0.2.1 copied when it returns (one sequence per call: no masks)
LOSS_LOCALS_021 = ("old_logprobs", "logprob", "values", "vpred", "returns", "advantages", "ratio", "pg_losses",
                   "pg_losses2", "vf_losses1", "vf_losses2")


def _locals_at_return(fn: Any, names: tuple[str, ...]) -> tuple[Any, dict[str, Any]]:
    """A pass-through wrapper of the bound method ``fn`` that copies ``names`` of its frame's locals when it
    returns (a profile hook on that one code object, set for the call only): (wrapper, {"calls": [...]})."""
    code = fn.__func__.__code__
    box: dict[str, Any] = {"calls": []}

    def wrapper(*a: Any, **kw: Any) -> Any:
        seen: dict[str, Any] = {}

        def hook(frame: Any, event: str, arg: Any) -> None:
            if event == "return" and frame.f_code is code:
                seen.update({n: _clone(frame.f_locals.get(n)) for n in names})
        previous = sys.getprofile()
        sys.setprofile(hook)
        try:
            out = fn(*a, **kw)
        finally:
            sys.setprofile(previous)
        box["calls"].append((seen, _clone(out[2])))
        return out
    return wrapper, box


@dataclass
class Step021:
    """One PPOTrainer.step at 0.2.1: each loss call's locals and returned statistics (one sequence each), the rollout
    data record_step_stats was given, the logged row, the scores given."""
    micros: list[tuple[dict[str, Any], dict[str, Any]]] = field(default_factory=list)
    rollout: dict[str, Any] = field(default_factory=dict)
    row: dict[str, Any] = field(default_factory=dict)
    scores: list[float] = field(default_factory=list)


def run_ppo_021(workdir: Path, *, n_steps: int = 3, ref_noise: float = 0.05, **config: Any) -> list[Step021]:
    """trl 0.2.1's PPOTrainer.step ``n_steps`` times (queries of 3..8, responses of 2..9 tokens, seeded), each step
    logged with log_stats. 0.2.1 trains one sequence per optimizer step (``train_minibatch`` per sequence, in a
    shuffled order per epoch: ``random.shuffle``, seeded here) and its ``from_pretrained`` reads
    ``pytorch_model.bin`` from a path: the wrapper is built from a loaded model instead."""
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import AutoModelForCausalLMWithValueHead, PPOConfig, PPOTrainer

    path = build_tiny_model(workdir / "model")
    tok = AutoTokenizer.from_pretrained(path)
    torch.manual_seed(1)
    np.random.seed(1)
    random.seed(1)                        # step() shuffles each epoch's sequence order with random.shuffle
    policy = AutoModelForCausalLMWithValueHead.from_pretrained(AutoModelForCausalLM.from_pretrained(path))
    ref = AutoModelForCausalLMWithValueHead.from_pretrained(AutoModelForCausalLM.from_pretrained(path))
    with torch.no_grad():
        gen = torch.Generator().manual_seed(2)
        for prm in ref.parameters():
            prm.add_(ref_noise * torch.randn(prm.shape, generator=gen))
    cfg = PPOConfig(**config)
    trainer = PPOTrainer(cfg, policy, ref, tok)
    steps: list[Step021] = []
    loss, box = _locals_at_return(trainer.loss, LOSS_LOCALS_021)
    trainer.loss = loss
    record, log = trainer.record_step_stats, trainer.accelerator.log

    def rec_record(kl_coef: float, **data: Any) -> Any:
        steps[-1].rollout = {"kl_coef": kl_coef, **{k: _clone(v) for k, v in data.items() if k != "train_stats"}}
        return record(kl_coef=kl_coef, **data)

    def rec_log(values: dict, *a: Any, **kw: Any) -> Any:
        steps[-1].row = dict(values)
        return log(values, *a, **kw)
    trainer.record_step_stats, trainer.accelerator.log = rec_record, rec_log
    rng = random.Random(3)
    vocab, bs = len(tok), cfg.batch_size
    with one_thread_quiet():
        for i in range(n_steps):
            queries = [torch.tensor(q) for q in _rollout_batch(rng, bs, vocab, 3, 8)]
            responses = [torch.tensor(r) for r in _rollout_batch(rng, bs, vocab, 2, 9)]
            given = [round(rng.uniform(-2.0, 3.0), 3) for _ in range(bs)]
            steps.append(Step021(scores=given))
            box["calls"].clear()
            out = trainer.step(queries, responses, [torch.tensor(s) for s in given])
            steps[-1].micros = list(box["calls"])
            trainer.log_stats(out, {"query": [""] * bs, "response": [""] * bs}, [torch.tensor(s) for s in given])
    return steps


# ------------------------------------------------------------------------------------------- RLOOTrainer at 0.11.4
#: the micro-batch locals of RLOOTrainer.train copied when its accumulate() block ends
RLOO_MICRO = ("ppo_epoch_idx", "minibatch_idx", "gradient_accumulation_idx", "micro_batch_inds", "new_ratio",
              "logprobs_diff", "ratio", "pg_losses", "pg_losses2", "pg_loss_max", "pg_loss", "pg_clipfrac", "entropy",
              "approxkl", "mb_advantage")
#: the rollout locals of RLOOTrainer.train copied when a row is logged
RLOO_ROLLOUT = ("kl", "logprobs", "ref_logprobs", "padding_mask", "non_score_reward", "scores", "rlhf_reward",
                "advantages", "responses", "postprocessed_responses", "sequence_lengths", "contain_eos_token",
                "approxkl_stats", "pg_clipfrac_stats", "pg_loss_stats", "vf_loss_stats", "vf_clipfrac_stats",
                "entropy_stats", "ratio_stats")


def _train_frame() -> Any:
    """RLOOTrainer.train's frame, on the stack above the caller."""
    f = sys._getframe(1)
    while f is not None and not (f.f_code.co_name == "train" and "approxkl_stats" in f.f_locals):
        f = f.f_back
    assert f is not None, "RLOOTrainer.train is not on the stack"
    return f


@dataclass
class Update:
    """One update (one logged row): the micro-batches' locals in order, the rollout's locals, the row, the trainer's
    episode counter when it logged, and the learning rate the scheduler held then."""
    micros: list[dict[str, Any]] = field(default_factory=list)
    rollout: dict[str, Any] = field(default_factory=dict)
    row: dict[str, Any] = field(default_factory=dict)
    episode: int = 0
    global_step: int = 0
    lr: float = 0.0


@dataclass
class RLOORun:
    config: dict[str, Any]
    updates: list[Update]
    lr_after: list[float]
    lr_initial: float
    eos_token_id: int

    @staticmethod
    def micro_steps(upd: Update, values: Any) -> list:
        """One update's statistics as the fingerprint's batch: one logged step, its (epoch, mini-batch) pairs as the
        optimizer steps, one rank, each mini-batch's micro-batches, each ``values(micro locals, rollout locals)``."""
        minis: dict[tuple[int, int], list] = {}
        for m in upd.micros:
            minis.setdefault((m["ppo_epoch_idx"], m["minibatch_idx"]), []).append(values(m, upd.rollout))
        return [[[micros] for _k, micros in sorted(minis.items())]]

    @staticmethod
    def rollout_steps(upd: Update, values: Any) -> list:
        """The rollout batch of one update: one step, one optimizer step, one rank, one micro-batch."""
        return [[[[values(upd.rollout)]]]]


def _copy_locals(frame_locals: dict[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    return {n: _clone(frame_locals.get(n)) for n in names}


def build_reward_model(path: Path) -> str:
    """A tiny Llama sequence-classification model (1 label, a random score head) saved to ``path``, sharing the
    policy's tokenizer (built as tests/_support/tiny_trl.py builds the policy)."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForSequenceClassification

    tok = AutoTokenizer.from_pretrained(str(path.parent / "model"))
    torch.manual_seed(5)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64, num_labels=1,
                         pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    model = LlamaForSequenceClassification(config)
    with torch.no_grad():
        model.score.weight.mul_(20.0)             # scores of O(1): sequences told apart
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


def run_rloo_legacy(workdir: Path, *, n_prompts: int = 32, ref_noise: float = 0.05, **config: Any) -> RLOORun:
    """Train trl.RLOOTrainer (0.11.4) with ``config`` (RLOOConfig fields over small defaults), recording every update
    (the accumulate() blocks' and the logged rows' locals of ``train``). The reference model is the tiny model with
    seeded noise added to its weights (a KL to the reference from the first update)."""
    import datasets
    import numpy as np
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer
    from trl import RLOOConfig, RLOOTrainer

    path = build_tiny_model(workdir / "model")
    rpath = build_reward_model(workdir / "reward")
    tok = AutoTokenizer.from_pretrained(path)
    torch.manual_seed(1)
    policy = AutoModelForCausalLM.from_pretrained(path)
    ref = AutoModelForCausalLM.from_pretrained(path)
    with torch.no_grad():
        gen = torch.Generator().manual_seed(2)
        for prm in ref.parameters():
            prm.add_(ref_noise * torch.randn(prm.shape, generator=gen))
    reward = AutoModelForSequenceClassification.from_pretrained(rpath, num_labels=1)
    ids = [tok(s)["input_ids"] for s in sentences(n_prompts, 11)]
    ds = datasets.Dataset.from_dict({"input_ids": ids})
    args = dict(output_dir=str(workdir / "out"), report_to="none", use_cpu=True, save_strategy="no", seed=0,
                disable_tqdm=True, dataloader_num_workers=0, num_sample_generations=0, learning_rate=5e-2,
                temperature=1.0, **config)
    cfg = RLOOConfig(**args)
    trainer = RLOOTrainer(config=cfg, tokenizer=tok, policy=policy, ref_policy=ref, reward_model=reward,
                          train_dataset=ds)
    updates = [Update()]
    lr_after: list[float] = []
    lr_initial = trainer.lr_scheduler.get_last_lr()[0]
    accumulate = trainer.accelerator.accumulate

    @contextlib.contextmanager
    def recording_accumulate(*models: Any) -> Any:
        frame = _train_frame()
        with accumulate(*models) as ctx:
            yield ctx
        updates[-1].micros.append(_copy_locals(frame.f_locals, RLOO_MICRO))
        del frame
    trainer.accelerator.accumulate = recording_accumulate

    class Rows(transformers.TrainerCallback):
        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
            frame = _train_frame()
            upd = updates[-1]
            upd.rollout = _copy_locals(frame.f_locals, RLOO_ROLLOUT)
            upd.row, upd.episode, upd.global_step = dict(logs or {}), state.episode, state.global_step
            upd.lr = trainer.lr_scheduler.get_last_lr()[0]
            del frame
            updates.append(Update())

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            lr_after.append(trainer.lr_scheduler.get_last_lr()[0])
    trainer.add_callback(Rows())
    np.random.seed(1)              # train() draws each epoch's mini-batch order with np.random.permutation
    with one_thread_quiet():
        trainer.train()
    conf = {k: getattr(cfg, k) for k in ("per_device_train_batch_size", "gradient_accumulation_steps",
                                         "num_mini_batches", "num_ppo_epochs", "rloo_k", "kl_coef", "local_batch_size")}
    return RLOORun(conf, [u for u in updates if u.row], lr_after, lr_initial, tok.eos_token_id)


_HIST = ("a histogram: record_step_stats logs the whole tensor ({what}), an array, not a scalar; the fingerprint's "
         "candidates (tests/_support/fingerprint.py) reduce a batch to one number, and no proof here fingerprints an "
         "array")

#: (framework, key, trainer) -> why no proof here fingerprints that entry (tests/_support/proofs_corpus.py reads it)
ENTRY_WHY: dict[tuple[str, str, str | None], str] = {
    ("trl", "objective/kl_dist", "ppo_legacy"):
        _HIST.format(what="kl_list: each sequence's masked KL sum, trl/trainer/ppo_trainer.py@v0.11.4:1301,1321"),
    ("trl", "objective/logprobs", "ppo_legacy"):
        _HIST.format(what="data['logprobs'], [batch, query+response-1], trl/trainer/ppo_trainer.py@v0.11.4:1322; "
                          "at v0.2.1 the list of each response's log-probs, trl/trainer/ppo_trainer.py@v0.2.1:774"),
    ("trl", "objective/ref_logprobs", "ppo_legacy"):
        _HIST.format(what="data['ref_logprobs'], trl/trainer/ppo_trainer.py@v0.11.4:1323; at v0.2.1 a list, "
                          "trl/trainer/ppo_trainer.py@v0.2.1:775"),
    ("trl", "ppo/policy/advantages", "ppo_legacy"):
        _HIST.format(what="every micro-batch's whitened advantages flattened, NaN -> -1, "
                          "trl/trainer/ppo_trainer.py@v0.11.4:857-858"),
    ("trl", "ppo/policy/ratio", "ppo_legacy"):
        _HIST.format(what="every micro-batch's ratios flattened, trl/trainer/ppo_trainer.py@v0.11.4:859"),
    ("trl", "env/reward_dist", "ppo_legacy"):
        _HIST.format(what="the gathered rewards, trl/trainer/ppo_trainer.py@v0.11.4:1409"),
    ("trl", "tokens/queries_dist", "ppo_legacy"):
        _HIST.format(what="the query lengths, trl/trainer/ppo_trainer.py@v0.11.4:1337"),
    ("trl", "tokens/responses_dist", "ppo_legacy"):
        _HIST.format(what="the response lengths, trl/trainer/ppo_trainer.py@v0.11.4:1340"),
    ("trl", "ppo/val/var_explained", "ppo_legacy"):
        "1 - ppo/val/error / ppo/returns/var of the two logged (micro-batch-averaged) values "
        "(trl/trainer/ppo_trainer.py@v0.11.4:1344): a ratio of two reductions, which no candidate of "
        "tests/_support/fingerprint.py computes; tests/frameworks/test_proof_trl_legacy.py fingerprints both terms "
        "and checks the identity on the logged row",
    ("trl", "time/ppo/total", "ppo_legacy"):
        "time.time() around step() (trl/trainer/ppo_trainer.py@v0.11.4:711,887): a raw timer, no batch quantity to "
        "fingerprint",
    ("trl", "time/ppo/{stage}", "ppo_legacy"):
        "time.time() around each stage of step() (trl/trainer/ppo_trainer.py@v0.11.4:765-877): a raw timer, no "
        "batch quantity to fingerprint",
    ("trl", "ppo/time/ppo/{stage}", "ppo_legacy"):
        "time.time() around each optimizer.step() (trl/trainer/ppo_trainer.py@v0.2.1:618-620,782), averaged with the "
        "update statistics: a raw timer, no batch quantity to fingerprint",
    # RLOOTrainer (v0.9.3..v0.21.0)
    ("trl", "loss/value_avg", "rloo"):
        "always 0: RLOO has no critic, vf_loss_stats is allocated and never written "
        "(trl/trainer/rloo_trainer.py@v0.11.4:252,456): every candidate reduction of zeros is 0, no batch tells them "
        "apart; tests/frameworks/test_proof_trl_legacy.py checks the logged 0",
    ("trl", "val/clipfrac_avg", "rloo"):
        "always 0: vf_clipfrac_stats is allocated and never written (trl/trainer/rloo_trainer.py@v0.11.4:253,457): "
        "every candidate reduction of zeros is 0; tests/frameworks/test_proof_trl_legacy.py checks the logged 0",
    ("trl", "eps", "rloo"):
        "int(episode / seconds since train() began) (trl/trainer/rloo_trainer.py@v0.11.4:445): a raw timer, no batch "
        "quantity to fingerprint",
}
