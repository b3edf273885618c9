"""Generate the labelled corpus of `trackbridge doctor` (tests/data/doctor/, issue 32): REAL TRL trainers on CPU.

Run by hand, never by ``make test`` (the scoring test, tests/trackers/test_doctor_corpus.py, reads the committed
outputs):

    nice .venv/bin/python tests/_support/doctor_corpus.py --list
    nice .venv/bin/python tests/_support/doctor_corpus.py grpo_healthy_s0 grpo_lr_high ...   # named runs
    nice .venv/bin/python tests/_support/doctor_corpus.py --batch grpo                         # every grpo_* run
    nice .venv/bin/python tests/_support/doctor_corpus.py --summary grpo_lr_high               # the curves, as text

The model is tests/_support/tiny_trl.py's 2-layer Llama (hidden 32) and WordLevel tokenizer, built in code, then
warm-started here for a few hundred plain next-token steps on generated "sentence sentence </s>" texts, so that it
ends its answers (a random model almost never samples EOS: every run would be truncated) and starts from a
realistic entropy (about 2.2 nats/token instead of the uniform ln 35). Rewards are synthetic functions of the
completion's words (:data:`REWARDS`). Each run is configured so that one pathology of the seeds (TRL's Training
FAQ, TRL's logging doc, the metrics glossary: mappings/checks.yaml ``sources``) really happens, or so that nothing
goes wrong (the healthy runs, other seeds and configs): see :data:`RUNS` and tests/data/doctor/labels.yaml.

Each run writes what a user's run writes: ``runs/<name>/trainer_state.json``, the Trainer's own ``TrainerState``
(``log_history`` as the Trainer logged it; ``save_to_json``, as a checkpoint holds it; no checkpoint or weights are
kept), and ``runs/<name>/config.json``: the config that produced it (the trainer, the arguments given, the reward,
the TRL release, the wall time), for the corpus README.

PPO: TRL 1.16.0 (the pinned release) has no PPO trainer any more (``trl.experimental.ppo`` was removed in v1.13.0),
so the ``ppo_*`` runs need TRL 1.12.0 on the path, installed beside the venv's, never over it:

    .venv/bin/pip download --no-deps -d /tmp/trl112dl trl==1.12.0
    .venv/bin/pip install --no-deps --target /tmp/trl112 /tmp/trl112dl/trl-1.12.0-py3-none-any.whl
    PYTHONPATH=/tmp/trl112 nice .venv/bin/python tests/_support/doctor_corpus.py --batch ppo
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

if __name__ == "__main__":      # run as a script: put tests/ on sys.path so `_support` imports
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _support import DATA  # noqa: E402
from _support.tiny_trl import WORDS, build_tiny_model, sentences  # noqa: E402

OUT = DATA / "doctor" / "runs"
CACHE = Path(os.environ.get("DOCTOR_CORPUS_CACHE", "/tmp/trackbridge-doctor-corpus"))

# ------------------------------------------------------------------------------------------------ rewards
TARGET = ("good", "yes")


def _words(c: Any) -> list[str]:
    if isinstance(c, list):                           # conversational completions: [{"role", "content"}]
        c = " ".join(m.get("content", "") for m in c)
    return str(c).split()


def reward_target(completions, **kwargs):
    """Up to 3 of the words 'good'/'yes' in an answer of at most 10 words, in [0, 1] (0 for a longer answer): a
    task the warm-started model learns by putting those words in (it rarely does at first); length does not pay."""
    out = []
    for ws in map(_words, completions):
        out.append(min(sum(w in TARGET for w in ws), 3) / 3 if len(ws) <= 10 else 0.0)
    return out


def reward_target_noisy(completions, **kwargs):
    """reward_target plus seeded noise (a noisy judge), in [0, 1]."""
    rng = random.Random(len(completions) * 7919 + sum(len(_words(c)) for c in completions))
    return [min(1.0, max(0.0, r + rng.gauss(0.0, 0.1))) for r in reward_target(completions)]


def reward_yes_fraction(completions, **kwargs):
    """The fraction of the answer's words that are 'yes': pays a degenerate 'yes yes yes' (entropy collapse)."""
    return [sum(w == "yes" for w in ws) / max(1, len(ws)) for ws in map(_words, completions)]


def reward_length(completions, **kwargs):
    """The answer's length in words over 16: pays length and nothing else (length hacking)."""
    return [len(_words(c)) / 16 for c in completions]


def reward_constant(completions, **kwargs):
    """0.5 for every answer: no group ever has a reward spread (no learning signal)."""
    return [0.5 for _ in completions]


def reward_impossible(completions, **kwargs):
    """1 only for the exact answer 'two plus two is four', which the model never writes: all zero (a task too
    hard for the model)."""
    return [1.0 if " ".join(_words(c)) == "two plus two is four" else 0.0 for c in completions]


def reward_target_fraction(completions, **kwargs):
    """The fraction of the answer's words that are 'good'/'yes': pays the shortest answer ('good')."""
    return [sum(w in TARGET for w in ws) / max(1, len(ws)) for ws in map(_words, completions)]


REWARDS: dict[str, Callable[..., list[float]]] = {f.__name__: f for f in (
    reward_target, reward_target_noisy, reward_yes_fraction, reward_length, reward_constant, reward_impossible,
    reward_target_fraction)}


# ------------------------------------------------------------------------------------------------ the runs
@dataclass
class Run:
    name: str
    trainer: str                         # grpo, rloo, dpo, kto, ppo
    steps: int
    args: dict[str, Any] = field(default_factory=dict)     # the trainer config's arguments (over BASE_ARGS)
    reward: str | None = None            # a REWARDS name (grpo, rloo)
    seed: int = 0
    lr_jump: tuple[int, float] | None = None   # (step, factor): the learning rate is multiplied by factor from there
    data: str = "default"                # dpo/kto: "default" (a learnable preference), "tiny" (8 pairs: overfit)
    note: str = ""                       # what the config is for
    tensorboard: bool = False            # also report_to="tensorboard" (kept as runs/<name>/tensorboard/)

    def config(self) -> dict[str, Any]:
        return {"trainer": self.trainer, "steps": self.steps, "seed": self.seed, "args": self.args,
                "tensorboard": self.tensorboard,
                "reward": self.reward, "lr_jump": list(self.lr_jump) if self.lr_jump else None, "data": self.data,
                "note": self.note}


BASE_ARGS: dict[str, dict[str, Any]] = {
    "grpo": {"per_device_train_batch_size": 32, "num_generations": 4, "max_completion_length": 16, "beta": 0.1,
             "learning_rate": 1e-3, "logging_steps": 1},
    "rloo": {"per_device_train_batch_size": 32, "num_generations": 4, "max_completion_length": 16, "beta": 0.05,
             "learning_rate": 1e-3, "logging_steps": 1},
    "dpo": {"per_device_train_batch_size": 16, "max_length": 24, "beta": 0.1, "learning_rate": 1e-3,
            "logging_steps": 1, "eval_strategy": "steps", "eval_steps": 10, "per_device_eval_batch_size": 16},
    "kto": {"per_device_train_batch_size": 16, "max_length": 24, "beta": 0.1, "learning_rate": 1e-3,
            "logging_steps": 1, "eval_strategy": "steps", "eval_steps": 10, "per_device_eval_batch_size": 16},
    "ppo": {"per_device_train_batch_size": 8, "mini_batch_size": 8, "num_ppo_epochs": 2, "response_length": 16,
            "kl_coef": 0.05, "learning_rate": 1e-3, "logging_steps": 1, "missing_eos_penalty": None,
            "stop_token": "eos", "num_mini_batches": 1, "local_rollout_forward_batch_size": 8,
            "num_sample_generations": 0},
}

RUNS: list[Run] = [
    # ---------------------------------------------------------------- GRPO (TRL 1.16.0)
    Run("grpo_healthy_s0", "grpo", 150, reward="reward_target", seed=0, note="a learnable reward, lr 1e-3, beta 0.1"),
    Run("grpo_healthy_s1", "grpo", 150, reward="reward_target", seed=1, note="as s0, another seed"),
    Run("grpo_healthy_noisy", "grpo", 150, reward="reward_target_noisy", seed=2, note="a noisy judge"),
    Run("grpo_healthy_beta0", "grpo", 150, reward="reward_target", seed=3, args={"beta": 0.0},
        note="TRL's default beta 0 (no KL term, none logged)"),
    Run("grpo_healthy_g8", "grpo", 120, reward="reward_target", seed=4,
        args={"num_generations": 8, "learning_rate": 7e-4}, note="8 completions per prompt, lr 7e-4"),
    Run("grpo_healthy_drgrpo_s0", "grpo", 150, reward="reward_target", seed=5, args={"scale_rewards": "none"},
        note="advantages not divided by the group's reward std (Dr. GRPO's scale_rewards='none')"),
    Run("grpo_healthy_drgrpo_s1", "grpo", 150, reward="reward_target", seed=6, args={"scale_rewards": "none"},
        note="as drgrpo_s0, another seed"),
    Run("grpo_healthy_drgrpo_s2", "grpo", 150, reward="reward_target_noisy", seed=7,
        args={"scale_rewards": "none", "learning_rate": 1.5e-3}, note="as drgrpo_s0, a noisy judge, lr 1.5e-3"),
    Run("grpo_healthy_drgrpo_s3", "grpo", 150, reward="reward_target", seed=8, args={"scale_rewards": "none"},
        note="as drgrpo_s0, another seed"),
    Run("grpo_healthy_b64", "grpo", 120, reward="reward_target", seed=9, args={"per_device_train_batch_size": 64},
        note="16 prompts a step"),
    Run("grpo_healthy_drgrpo_s4", "grpo", 150, reward="reward_target", seed=10,
        args={"scale_rewards": "none", "learning_rate": 7e-4}, note="as drgrpo_s0, another seed, lr 7e-4"),
    Run("grpo_healthy_b64_lr5", "grpo", 120, reward="reward_target", seed=11,
        args={"per_device_train_batch_size": 64, "learning_rate": 5e-4}, note="16 prompts a step, lr 5e-4"),
    Run("grpo_healthy_drgrpo_s5", "grpo", 150, reward="reward_target", seed=12,
        args={"scale_rewards": "none", "learning_rate": 5e-4}, note="as drgrpo_s0, another seed, lr 5e-4"),
    Run("grpo_healthy_drgrpo_s6", "grpo", 150, reward="reward_target_noisy", seed=13,
        args={"scale_rewards": "none", "learning_rate": 5e-4}, note="as drgrpo_s0, a noisy judge, lr 5e-4"),
    Run("grpo_grad_spike_b16", "grpo", 150, reward="reward_target", seed=0, args={"per_device_train_batch_size": 16},
        note="as grpo_healthy_s0 with 4 prompts a step: a group with a small reward spread (GRPO divides by it)"),
    Run("grpo_lr_high", "grpo", 120, reward="reward_target", seed=0, args={"learning_rate": 0.1},
        note="learning rate 100x too high"),
    Run("grpo_lr_high_sgd", "grpo", 60, reward="reward_target", seed=0,
        args={"optim": "sgd", "learning_rate": 2.0, "lr_scheduler_type": "constant", "max_grad_norm": 0.0},
        note="plain SGD at lr 2 with gradient clipping off"),
    Run("grpo_lr_jump", "grpo", 120, reward="reward_target", seed=0, lr_jump=(60, 100.0),
        args={"lr_scheduler_type": "constant"}, note="lr 1e-3, multiplied by 100 at step 60 (a bad schedule)"),
    Run("grpo_lr_jump_tb", "grpo", 120, reward="reward_target", seed=0, lr_jump=(60, 100.0),
        args={"lr_scheduler_type": "constant"}, tensorboard=True,
        note="grpo_lr_jump again, also written to TensorBoard (report_to='tensorboard')"),
    Run("grpo_beta_weak", "grpo", 150, reward="reward_yes_fraction", seed=0,
        args={"beta": 0.001, "learning_rate": 3e-3}, note="KL coefficient 0.001, lr 3e-3, a reward that pays 'yes'"),
    Run("grpo_beta_strong", "grpo", 150, reward="reward_target", seed=0, args={"beta": 20.0},
        note="KL coefficient 20: the policy is held at the reference"),
    Run("grpo_length_reward", "grpo", 120, reward="reward_length", seed=0,
        note="a reward that pays length (16 words max)"),
    Run("grpo_entropy_collapse", "grpo", 150, reward="reward_yes_fraction", seed=0,
        args={"beta": 0.0, "learning_rate": 5e-3}, note="a reward that pays repeating 'yes', lr 5e-3, beta 0"),
    Run("grpo_constant_reward", "grpo", 60, reward="reward_constant", seed=0,
        note="every completion gets 0.5: no group has a reward spread"),
    Run("grpo_impossible_reward", "grpo", 60, reward="reward_impossible", seed=1, args={"beta": 0.0},
        note="a reward the model never earns (all 0), beta 0"),
    Run("grpo_lr_zero", "grpo", 80, reward="reward_target", seed=0, args={"learning_rate": 0.0},
        note="learning rate 0 (beta 0.1)"),
    Run("grpo_length_collapse", "grpo", 150, reward="reward_target_fraction", seed=0,
        args={"learning_rate": 3e-3}, note="a reward that pays the fraction of 'good'/'yes' words: short answers win"),
    # ---------------------------------------------------------------- RLOO (TRL 1.16.0; its kl is k1, in the reward)
    Run("rloo_healthy_s0", "rloo", 150, reward="reward_target", seed=0, note="a learnable reward, lr 1e-3, beta 0.05"),
    Run("rloo_healthy_s1", "rloo", 150, reward="reward_target", seed=1, note="as s0, another seed"),
    Run("rloo_healthy_s2", "rloo", 150, reward="reward_target_noisy", seed=2, args={"learning_rate": 7e-4},
        note="a noisy judge, lr 7e-4"),
    Run("rloo_healthy_b64", "rloo", 120, reward="reward_target", seed=3, args={"per_device_train_batch_size": 64},
        note="16 prompts a step"),
    Run("rloo_healthy_s4", "rloo", 150, reward="reward_target", seed=4, args={"learning_rate": 5e-4},
        note="lr 5e-4"),
    Run("rloo_healthy_s5", "rloo", 150, reward="reward_target", seed=5, args={"learning_rate": 5e-4},
        note="lr 5e-4"),
    Run("rloo_healthy_noisy_s6", "rloo", 150, reward="reward_target_noisy", seed=6, args={"learning_rate": 5e-4},
        note="a noisy judge, lr 5e-4"),
    Run("rloo_top_k", "rloo", 150, reward="reward_target", seed=0, args={"top_k": 2, "beta": 0.5},
        note="top_k=2 sampling, beta 0.5 (meant to drive the KL negative, TRL's FAQ; here the two likeliest words "
             "never include 'good'/'yes': reward 0 everywhere)"),
    Run("rloo_lr_high", "rloo", 120, reward="reward_target", seed=0, args={"learning_rate": 0.1},
        note="learning rate 100x too high"),
    Run("rloo_lr_high_sgd", "rloo", 60, reward="reward_target", seed=1,
        args={"optim": "sgd", "learning_rate": 2.0, "lr_scheduler_type": "constant", "max_grad_norm": 0.0},
        note="plain SGD at lr 2 with gradient clipping off"),
    Run("rloo_beta_weak", "rloo", 150, reward="reward_yes_fraction", seed=0,
        args={"beta": 0.001, "learning_rate": 3e-3}, note="KL coefficient 0.001, lr 3e-3, a reward that pays 'yes'"),
    # ---------------------------------------------------------------- DPO / KTO (TRL 1.16.0)
    Run("dpo_healthy_s0", "dpo", 120, seed=0, note="chosen answers end in 'good', rejected in 'bad'; lr 1e-3"),
    Run("dpo_healthy_s1", "dpo", 120, seed=1, args={"learning_rate": 5e-4}, note="as s0, another seed, lr 5e-4"),
    Run("dpo_healthy_b32", "dpo", 100, seed=2, args={"per_device_train_batch_size": 32}, note="32 pairs a step"),
    Run("dpo_healthy_s3", "dpo", 120, seed=3, args={"learning_rate": 5e-4}, note="lr 5e-4"),
    Run("dpo_healthy_s4", "dpo", 100, seed=4, args={"learning_rate": 3e-4, "per_device_train_batch_size": 32},
        note="32 pairs a step, lr 3e-4"),
    Run("dpo_healthy_s5", "dpo", 100, seed=5, args={"learning_rate": 3e-4, "per_device_train_batch_size": 16},
        note="16 pairs a step, lr 3e-4"),
    Run("dpo_healthy_s6", "dpo", 100, seed=6, args={"learning_rate": 5e-4, "per_device_train_batch_size": 32},
        note="32 pairs a step, lr 5e-4"),
    Run("dpo_healthy_s7", "dpo", 100, seed=7, args={"learning_rate": 3e-4, "per_device_train_batch_size": 32},
        note="32 pairs a step, lr 3e-4"),
    Run("dpo_healthy_s8", "dpo", 100, seed=8, args={"learning_rate": 2e-4, "per_device_train_batch_size": 16},
        note="16 pairs a step, lr 2e-4"),
    Run("dpo_healthy_s9", "dpo", 100, seed=9, args={"learning_rate": 2e-4, "per_device_train_batch_size": 32},
        note="32 pairs a step, lr 2e-4"),
    Run("dpo_healthy_s10", "dpo", 100, seed=10, args={"learning_rate": 3e-4, "per_device_train_batch_size": 32},
        note="32 pairs a step, lr 3e-4"),
    Run("dpo_healthy_s11", "dpo", 100, seed=11, args={"learning_rate": 2e-4, "per_device_train_batch_size": 32},
        note="32 pairs a step, lr 2e-4"),
    Run("dpo_healthy_s12", "dpo", 100, seed=12, args={"learning_rate": 3e-4, "per_device_train_batch_size": 16},
        note="16 pairs a step, lr 3e-4"),
    Run("dpo_overfit", "dpo", 150, seed=0, data="tiny", args={"learning_rate": 3e-3},
        note="8 random training pairs (nothing to generalise), 150 steps, lr 3e-3"),
    Run("dpo_overfit_tb", "dpo", 150, seed=0, data="tiny", args={"learning_rate": 3e-3}, tensorboard=True,
        note="dpo_overfit again, also written to TensorBoard (report_to='tensorboard')"),
    Run("dpo_lr_high", "dpo", 100, seed=0, args={"learning_rate": 0.2}, note="learning rate 200x too high"),
    Run("dpo_lr_zero", "dpo", 60, seed=0, args={"learning_rate": 0.0}, note="learning rate 0"),
    Run("kto_healthy_s0", "kto", 120, seed=0, note="the DPO pairs, unpaired; lr 1e-3"),
    Run("kto_healthy_s1", "kto", 120, seed=1, args={"learning_rate": 5e-4}, note="as s0, another seed, lr 5e-4"),
    Run("kto_healthy_b32", "kto", 100, seed=2, args={"per_device_train_batch_size": 32}, note="32 examples a step"),
    Run("kto_healthy_s3", "kto", 120, seed=3, args={"learning_rate": 5e-4}, note="lr 5e-4"),
    Run("kto_healthy_s4", "kto", 100, seed=4, args={"learning_rate": 3e-4, "per_device_train_batch_size": 32},
        note="32 examples a step, lr 3e-4"),
    Run("kto_healthy_s5", "kto", 100, seed=5, args={"learning_rate": 3e-4, "per_device_train_batch_size": 16},
        note="16 examples a step, lr 3e-4"),
    Run("kto_healthy_s6", "kto", 100, seed=6, args={"learning_rate": 5e-4, "per_device_train_batch_size": 32},
        note="32 examples a step, lr 5e-4"),
    Run("kto_healthy_s7", "kto", 100, seed=7, args={"learning_rate": 3e-4, "per_device_train_batch_size": 32},
        note="32 examples a step, lr 3e-4"),
    Run("kto_healthy_s8", "kto", 100, seed=8, args={"learning_rate": 2e-4, "per_device_train_batch_size": 16},
        note="16 examples a step, lr 2e-4"),
    Run("kto_healthy_s9", "kto", 100, seed=9, args={"learning_rate": 2e-4, "per_device_train_batch_size": 32},
        note="32 examples a step, lr 2e-4"),
    Run("kto_healthy_s10", "kto", 100, seed=10, args={"learning_rate": 3e-4, "per_device_train_batch_size": 32},
        note="32 examples a step, lr 3e-4"),
    Run("kto_healthy_s11", "kto", 100, seed=11, args={"learning_rate": 2e-4, "per_device_train_batch_size": 32},
        note="32 examples a step, lr 2e-4"),
    Run("kto_healthy_s12", "kto", 100, seed=12, args={"learning_rate": 3e-4, "per_device_train_batch_size": 16},
        note="16 examples a step, lr 3e-4"),
    Run("kto_overfit", "kto", 150, seed=0, data="tiny", args={"learning_rate": 3e-3},
        note="8 random training pairs, unpaired, 150 steps, lr 3e-3"),
    Run("kto_lr_high", "kto", 100, seed=0, args={"learning_rate": 0.2}, note="learning rate 200x too high"),
    # ---------------------------------------------------------------- PPO (trl.experimental.ppo, TRL 1.12.0)
    Run("ppo_healthy_s0", "ppo", 60, seed=0, args={"learning_rate": 3e-4},
        note="a fixed random reward model, kl_coef 0.05, lr 3e-4"),
    Run("ppo_healthy_s1", "ppo", 60, seed=1, args={"learning_rate": 3e-4},
        note="as s0, another seed (another reward model)"),
    Run("ppo_kl_weak", "ppo", 60, seed=0, args={"kl_coef": 0.0, "learning_rate": 5e-3},
        note="KL coefficient 0, lr 5e-3"),
    Run("ppo_lr_high", "ppo", 60, seed=0, args={"learning_rate": 0.1, "num_ppo_epochs": 4},
        note="learning rate 100x too high, 4 PPO epochs"),
]
BY_NAME = {r.name: r for r in RUNS}


# ------------------------------------------------------------------------------------------------ the base model
def base_model() -> str:
    """tiny_trl's model, warm-started on "s1 s2 </s>" texts (saved under CACHE/base; built once)."""
    path = CACHE / "base"
    if (path / "done").exists():
        return str(path)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    raw = CACHE / "raw"
    build_tiny_model(raw)
    tok = AutoTokenizer.from_pretrained(raw)
    model = AutoModelForCausalLM.from_pretrained(raw)
    rng = random.Random(0)
    texts = [f"{a} {b}" for a, b in zip(sentences(4000, 11), sentences(4000, 12))]
    texts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 6))) + " " + t for t in texts]
    torch.manual_seed(0)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for step in range(300):
        batch = [texts[(step * 32 + i) % len(texts)] + tok.eos_token for i in range(32)]
        enc = tok(batch, return_tensors="pt", padding=True)
        labels = enc["input_ids"].clone()
        labels[enc["attention_mask"] == 0] = -100
        loss = model(**enc, labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
    model.save_pretrained(path)
    tok.save_pretrained(path)
    (path / "done").write_text(f"{loss.item():.4f}\n")
    return str(path)


def prompts(n: int, seed: int) -> list[str]:
    return sentences(n, seed)


# ------------------------------------------------------------------------------------------------ trainers
def _common(run: Run, out: Path) -> dict[str, Any]:
    return {"output_dir": str(out / "work"), "max_steps": run.steps, "report_to": "none", "use_cpu": True,
            "save_strategy": "no", "seed": run.seed, "disable_tqdm": True, "dataloader_num_workers": 0}


def _optimizers(run: Run, model, lr: float):
    """(optimizer, scheduler) for a learning-rate jump: AdamW as the Trainer makes it, and a constant rate times
    ``factor`` from ``step`` on; (None, None) otherwise (the Trainer's own)."""
    if run.lr_jump is None:
        return (None, None)
    import torch
    at, factor = run.lr_jump
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: factor if s >= at else 1.0)
    return (opt, sched)


def _preference_data(kind: str, n: int, seed: int) -> tuple[dict[str, list], dict[str, list]]:
    """Pairs whose chosen answer has 'good' where the rejected one has 'bad' (a preference the model can learn);
    ``tiny``: 8 training pairs whose chosen and rejected answers are random sentences (nothing to generalise:
    the model can only memorise them), and an eval set of other random pairs."""
    rng = random.Random(seed)

    def pair(i: int, learnable: bool) -> tuple[str, str, str]:
        p = " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 4)))
        body = [rng.choice(WORDS) for _ in range(rng.randint(2, 4))]
        if learnable:
            return p, " ".join(body + ["good"]), " ".join(body + ["bad"])
        other = [rng.choice(WORDS) for _ in range(rng.randint(2, 4))]
        return p, " ".join(body), " ".join(other)

    learnable = kind != "tiny"
    ntrain = 8 if kind == "tiny" else n
    train = [pair(i, learnable) for i in range(ntrain)]
    ev = [pair(i, learnable) for i in range(32)]
    as_cols = lambda rows: {"prompt": [r[0] for r in rows], "chosen": [r[1] for r in rows],  # noqa: E731
                            "rejected": [r[2] for r in rows]}
    return as_cols(train), as_cols(ev)


def _kto_rows(cols: dict[str, list]) -> dict[str, list]:
    out: dict[str, list] = {"prompt": [], "completion": [], "label": []}
    for p, c, r in zip(cols["prompt"], cols["chosen"], cols["rejected"]):
        out["prompt"] += [p, p]
        out["completion"] += [c, r]
        out["label"] += [True, False]
    return out


def train(run: Run) -> dict[str, Any]:
    import datasets
    import torch
    import transformers
    import trl
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(1)
    transformers.set_seed(run.seed)
    out = OUT / run.name
    out.mkdir(parents=True, exist_ok=True)
    base = base_model()
    args = {**BASE_ARGS[run.trainer], **run.args}
    common = _common(run, out)
    if run.tensorboard:             # transformers' TensorBoardCallback, into a folder of the run's own
        common["report_to"] = ["tensorboard"]
        os.environ["TENSORBOARD_LOGGING_DIR"] = str(out / "tensorboard")
    t0 = time.time()
    model = AutoModelForCausalLM.from_pretrained(base)
    tok = AutoTokenizer.from_pretrained(base)
    if run.trainer in ("grpo", "rloo"):
        cfg_cls, tr_cls = ((trl.GRPOConfig, trl.GRPOTrainer) if run.trainer == "grpo"
                           else (trl.RLOOConfig, trl.RLOOTrainer))
        conf = cfg_cls(**common, **args)
        ds = datasets.Dataset.from_dict({"prompt": prompts(2048, 100 + run.seed)})
        assert run.reward is not None
        trainer = tr_cls(model=model, processing_class=tok, reward_funcs=[REWARDS[run.reward]], args=conf,
                         train_dataset=ds, optimizers=_optimizers(run, model, conf.learning_rate))
    elif run.trainer in ("dpo", "kto"):
        tr_cols, ev_cols = _preference_data(run.data, 512, 200 + run.seed)
        if run.trainer == "kto":
            tr_cols, ev_cols = _kto_rows(tr_cols), _kto_rows(ev_cols)
        cfg_cls, tr_cls = ((trl.DPOConfig, trl.DPOTrainer) if run.trainer == "dpo"
                           else (trl.KTOConfig, trl.KTOTrainer))
        conf = cfg_cls(**common, **args)
        trainer = tr_cls(model=model, processing_class=tok, args=conf,
                         train_dataset=datasets.Dataset.from_dict(tr_cols),
                         eval_dataset=datasets.Dataset.from_dict(ev_cols),
                         optimizers=_optimizers(run, model, conf.learning_rate))
    elif run.trainer == "ppo":
        trainer = _ppo_trainer(run, model, tok, base, common, args)
    else:
        raise SystemExit(f"{run.name}: unknown trainer {run.trainer}")
    try:
        trainer.train()
    finally:
        os.environ.pop("TENSORBOARD_LOGGING_DIR", None)
    wall = time.time() - t0
    write_state(trainer.state, out / "trainer_state.json")
    conf_out = {**run.config(), "args": {**args, **run.args}, "trl": trl.__version__,
                "transformers": transformers.__version__, "torch": torch.__version__, "wall_s": round(wall, 1)}
    (out / "config.json").write_text(json.dumps(conf_out, indent=1, default=str) + "\n")
    import shutil
    shutil.rmtree(out / "work", ignore_errors=True)        # no checkpoints, weights or logs beyond the state
    return conf_out


def write_state(state, path: Path) -> None:
    """The Trainer's ``TrainerState`` as ``save_to_json`` writes it (``dataclasses.asdict``, keys sorted), with one
    ``log_history`` row per line instead of 2-space indents (the same JSON, a third of the size)."""
    import dataclasses
    doc = dataclasses.asdict(state)
    rows = doc.pop("log_history")
    head = json.dumps(doc, sort_keys=True)
    body = ",\n".join(json.dumps(r, sort_keys=True) for r in rows)
    path.write_text(head[:-1] + ', "log_history": [\n' + body + "\n]}\n")
    assert json.loads(path.read_text())["log_history"] == rows


def _ppo_trainer(run: Run, model, tok, base: str, common: dict[str, Any], args: dict[str, Any]):
    """TRL's Trainer-based PPO (``trl.experimental.ppo``, TRL <= 1.12.0): the policy and its reference from the base
    model; a reward model and a value model of the same tiny Llama (a sequence-classification head), the reward
    model's head set so that it scores the 'good'/'yes' tokens of the answer (a learnable, fixed judge)."""
    import datasets
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    try:
        from trl.experimental.ppo import PPOConfig, PPOTrainer
    except ImportError as exc:      # TRL >= 1.13.0
        raise SystemExit(f"{run.name}: PPO needs TRL <= 1.12.0 on PYTHONPATH (see this file's docstring): {exc}")
    tok.padding_side = "left"                # generation pads on the left (TRL's PPO examples do the same)
    ref = AutoModelForCausalLM.from_pretrained(base)
    rm = AutoModelForSequenceClassification.from_pretrained(base, num_labels=1)
    vm = AutoModelForSequenceClassification.from_pretrained(base, num_labels=1)
    with torch.no_grad():            # the judge: the score head reads the last token's hidden state; a fixed
        rm.score.weight.normal_(0.0, 1.0, generator=torch.Generator().manual_seed(run.seed))   # random head
    conf = PPOConfig(**{k: v for k, v in common.items() if k != "max_steps"},
                     total_episodes=run.steps * args["per_device_train_batch_size"], **args)
    ds = datasets.Dataset.from_dict({"prompt": prompts(2048, 100 + run.seed)})
    ds = ds.map(lambda x: {"input_ids": tok(x["prompt"])["input_ids"]}, remove_columns=["prompt"])
    return PPOTrainer(args=conf, processing_class=tok, model=model, ref_model=ref, reward_model=rm,
                      value_model=vm, train_dataset=ds, eval_dataset=ds.select(range(16)))


# ------------------------------------------------------------------------------------------------ looking at runs
SUMMARY_KEYS = ["loss", "grad_norm", "learning_rate", "reward", "reward_std", "frac_reward_zero_std", "kl", "entropy",
                "completions/mean_length", "completions/clipped_ratio", "clip_ratio/region_mean",
                "rewards/accuracies", "rewards/margins", "eval_loss", "eval_rewards/accuracies", "eval_rewards/margins",
                "objective/kl", "objective/scores", "objective/entropy", "policy/approxkl_avg", "policy/clipfrac_avg",
                "val/ratio", "loss/value_avg", "objective/non_score_reward", "lr", "eps"]


def summary(name: str, every: int = 1) -> str:
    """The run's curves as a text table (one row per logged step, the keys it has), to label it by eye."""
    state = json.loads((OUT / name / "trainer_state.json").read_text())
    rows = [r for r in state["log_history"] if "train_runtime" not in r]
    keys = [k for k in SUMMARY_KEYS if any(k in r for r in rows)]
    short = {k: k.split("/")[-1][:9] if "/" in k else k[:9] for k in keys}
    lines = ["step " + " ".join(f"{short[k]:>9}" for k in keys)]
    for i, r in enumerate(rows):
        if i % every and "eval_loss" not in r:
            continue
        cells = []
        for k in keys:
            v = r.get(k)
            cells.append(f"{v:>9.4g}" if isinstance(v, (int, float)) and not isinstance(v, bool) else f"{'':>9}")
        lines.append(f"{r.get('step', '?'):>4} " + " ".join(cells))
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("names", nargs="*")
    ap.add_argument("--batch", help="every run whose name starts with this")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--summary", metavar="NAME")
    ap.add_argument("--every", type=int, default=1)
    ap.add_argument("--missing", action="store_true", help="only runs with no trainer_state.json yet")
    a = ap.parse_args(argv)
    if a.list:
        for r in RUNS:
            print(f"{r.name:32} {r.trainer:5} {r.steps:4} {r.note}")
        return 0
    if a.summary:
        print(summary(a.summary, a.every))
        return 0
    todo = [BY_NAME[n] for n in a.names] + [r for r in RUNS if a.batch and r.name.startswith(a.batch)]
    if a.missing:
        todo = [r for r in todo if not (OUT / r.name / "trainer_state.json").exists()]
    for r in todo:
        conf = train(r)
        print(f"{r.name}: {conf['wall_s']} s", flush=True)
    return 0


if __name__ == "__main__":      # pragma: no cover - a maintainer's command
    sys.exit(main(sys.argv[1:]))
