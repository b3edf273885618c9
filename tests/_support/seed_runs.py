"""Five seeds of one setting in TRL and in veRL, for `trackbridge compare --group` (issue 34;
tests/trackers/test_compare_five_seeds.py).

TRL: five REAL GRPOTrainer runs (TRL 1.16.0, CPU), committed under tests/data/seeds/trl_grpo_s{0..4}/ and made by
hand, never by ``make test``:

    nice .venv/bin/python tests/_support/seed_runs.py trl            # all five (about 2 minutes on 2 cores)
    nice .venv/bin/python tests/_support/seed_runs.py trl 3          # one seed

Every seed has doctor_corpus.py's "grpo_healthy_drgrpo" config (its warm-started tiny Llama, reward_target, batch 32
= 8 prompts x 4 generations, 16 completion tokens, beta 0.1, lr 1e-3, scale_rewards "none") for :data:`TRL_STEPS`
steps on the same prompts; only ``seed`` (GRPOConfig.seed: sampling, shuffling, dropout) differs. Each writes the
Trainer's own ``trainer_state.json`` (doctor_corpus.write_state) and a ``config.json`` saying what made it.

veRL: :func:`write_verl_seed` runs in the test itself (fast): per step a seeded batch of :data:`VERL_BATCH`
responses, scored by a reward that gets likelier with the step, whose metrics are computed by veRL 0.9.1's own code
as its V1 trainer computes them (``core_algos.compute_grpo_outcome_advantage`` for the advantages,
``torch_functional.entropy_from_logits`` and ``core_algos.agg_loss`` for ``actor/entropy`` as
``_compute_old_log_prob`` does, ``metric_utils.compute_data_metrics`` / ``compute_timing_metrics`` as
``_compute_metrics`` does) and logged through veRL's own ``verl.utils.tracking.Tracking(default_backend=["file"])``
(its FileLogger, at ``VERL_FILE_LOGGER_PATH``) with ``logger.log(data=metrics, step=global_steps)``, as the trainer
logs: the file is veRL's own output.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

if __name__ == "__main__":      # run as a script: put tests/ on sys.path so `_support` imports
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _support import DATA  # noqa: E402

SEEDS_DIR = DATA / "seeds"
SEEDS = (0, 1, 2, 3, 4)
TRL_STEPS = 60
TRL_ARGS: dict[str, Any] = {"scale_rewards": "none"}    # doctor_corpus's grpo_healthy_drgrpo over its BASE_ARGS
TRL_REWARD = "reward_target"
PROMPT_SEED = 100                                        # the same prompts for every seed

VERL_STEPS = 40
VERL_PROMPTS, VERL_N = 4, 4                              # 4 prompts x rollout.n 4 responses a step
VERL_BATCH = VERL_PROMPTS * VERL_N
VERL_MAX_PROMPT, VERL_MAX_RESPONSE, VERL_VOCAB = 8, 16, 32


def trl_dir(seed: int) -> Path:
    return SEEDS_DIR / f"trl_grpo_s{seed}"


# ------------------------------------------------------------------------------------------------ TRL (by hand)
def train_trl(seed: int) -> dict[str, Any]:
    """One real GRPO run of TRL 1.16.0 on CPU; writes trl_grpo_s{seed}/trainer_state.json and config.json."""
    import shutil

    import datasets
    import torch
    import transformers
    import trl
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from _support import doctor_corpus as dc

    torch.set_num_threads(1)
    transformers.set_seed(seed)
    out = trl_dir(seed)
    out.mkdir(parents=True, exist_ok=True)
    base = dc.base_model()
    args = {**dc.BASE_ARGS["grpo"], **TRL_ARGS}
    common = {"output_dir": str(out / "work"), "max_steps": TRL_STEPS, "report_to": "none", "use_cpu": True,
              "save_strategy": "no", "seed": seed, "disable_tqdm": True, "dataloader_num_workers": 0}
    t0 = time.time()
    model = AutoModelForCausalLM.from_pretrained(base)
    tok = AutoTokenizer.from_pretrained(base)
    conf = trl.GRPOConfig(**common, **args)
    ds = datasets.Dataset.from_dict({"prompt": dc.prompts(2048, PROMPT_SEED)})
    trainer = trl.GRPOTrainer(model=model, processing_class=tok, reward_funcs=[dc.REWARDS[TRL_REWARD]], args=conf,
                              train_dataset=ds)
    trainer.train()
    wall = time.time() - t0
    dc.write_state(trainer.state, out / "trainer_state.json")
    conf_out = {"trainer": "grpo", "trainer_class": "trl.GRPOTrainer", "steps": TRL_STEPS, "seed": seed,
                "args": args, "reward": TRL_REWARD, "prompts": f"doctor_corpus.prompts(2048, {PROMPT_SEED})",
                "model": "doctor_corpus.base_model() (tiny_trl's 2-layer Llama, warm-started)",
                "trl": trl.__version__, "transformers": transformers.__version__, "torch": torch.__version__,
                "wall_s": round(wall, 1)}
    (out / "config.json").write_text(json.dumps(conf_out, indent=1, default=str) + "\n")
    shutil.rmtree(out / "work", ignore_errors=True)        # no checkpoints or weights: the state only
    return conf_out


# ------------------------------------------------------------------------------------------------ veRL (in the test)
def _verl_step(seed: int, step: int):
    """One step's batch (a DataProto, padded as the V1 trainer's ``_compute_metrics`` pads it) and the per-token
    entropies of its responses, both seeded by (seed, step). The policy is a table of logits that sharpens with the
    step (its entropy falls), its answers get shorter and its reward likelier: a run that learns."""
    import numpy as np
    import torch
    from tensordict import TensorDict
    from verl import DataProto
    from verl.trainer.ppo import core_algos

    g = torch.Generator().manual_seed(1000 * seed + step)
    n, P, W = VERL_BATCH, VERL_MAX_PROMPT, VERL_MAX_RESPONSE
    progress = step / VERL_STEPS
    skill = 0.6 * (seed - 2) / 4                      # each seed its own pace
    prompt_len = torch.randint(2, P + 1, (n,), generator=g)
    resp_len = torch.clamp((torch.rand(n, generator=g) * (W - 4) * (1.0 - 0.5 * progress)).long() + 2, 1, W)
    p_good = torch.sigmoid(torch.tensor(-1.5 + 3.5 * progress + skill))
    scores = (torch.rand(n, generator=g) < p_good).float()
    attn = torch.zeros(n, P + W, dtype=torch.long)
    resp_mask = torch.zeros(n, W, dtype=torch.long)
    token_scores = torch.zeros(n, W)
    for i in range(n):
        p, k = int(prompt_len[i]), int(resp_len[i])
        attn[i, P - p:P] = 1                          # prompts left-padded, responses right-padded
        attn[i, P:P + k] = 1
        resp_mask[i, :k] = 1
        token_scores[i, k - 1] = scores[i]            # the outcome reward on the last response token
    index = np.repeat(np.arange(VERL_PROMPTS), VERL_N)    # uid: the responses of one prompt
    adv, returns = core_algos.compute_grpo_outcome_advantage(token_level_rewards=token_scores,
                                                             response_mask=resp_mask, index=index)
    logits = torch.randn(n, W, VERL_VOCAB, generator=g) * (1.0 + 3.0 * progress + 0.5 * skill)
    td = TensorDict({"prompts": torch.full((n, P), 5), "responses": torch.full((n, W), 7), "attention_mask": attn,
                     "response_mask": resp_mask, "token_level_scores": token_scores,
                     "token_level_rewards": token_scores, "advantages": adv, "returns": returns,
                     "prompt_length": prompt_len.float(), "response_length": resp_len.float()}, batch_size=[n])
    tokens = (prompt_len + resp_len).tolist()
    return DataProto(batch=td, meta_info={"global_token_num": tokens}), logits


def verl_step_metrics(seed: int, step: int) -> dict[str, Any]:
    """The metrics veRL's V1 trainer logs for the step (the keys of ``_compute_old_log_prob`` and
    ``_compute_metrics`` that need no GPU, model or Ray), each computed by veRL's own function."""
    import torch
    from verl.trainer.ppo import core_algos, metric_utils
    from verl.utils import torch_functional as verl_F

    batch, logits = _verl_step(seed, step)
    entropy = verl_F.entropy_from_logits(logits)               # (n, W): the exact per-token entropy
    metrics: dict[str, Any] = {"actor/entropy": core_algos.agg_loss(
        loss_mat=entropy, loss_mask=batch.batch["response_mask"], loss_agg_mode="token-mean").detach().item()}
    g = torch.Generator().manual_seed(7 + 1000 * seed + step)
    gen, old, update = (float(x) for x in 1.0 + torch.rand(3, generator=g))
    timing_raw = {"gen": gen, "old_log_prob": old, "update_actor": update, "step": gen + old + update + 0.1}
    metrics.update({"training/global_step": step, "training/epoch": 0})
    metrics.update(metric_utils.compute_data_metrics(batch=batch, use_critic=False))
    metrics.update(metric_utils.compute_timing_metrics(batch=batch, timing_raw=timing_raw))
    metrics.update(metric_utils.compute_throughout_metrics(batch=batch, timing_raw=timing_raw, n_gpus=1))
    return metrics


def write_verl_seed(path: Path, seed: int, steps: int = VERL_STEPS) -> list[dict[str, Any]]:
    """veRL's own FileLogger output for one seed at ``path`` (JSON lines ``{"step": N, "data": {...}}``), logged
    through ``verl.utils.tracking.Tracking`` as the trainer logs; returns the metrics of each step, as logged."""
    from verl.utils.tracking import Tracking

    config = {"trainer": {"project_name": "trackbridge-seeds", "experiment_name": f"verl_grpo_s{seed}",
                          "logger": ["file"], "seed": seed},
              "algorithm": {"adv_estimator": "grpo"}, "actor_rollout_ref": {"rollout": {"n": VERL_N},
                                                                             "actor": {"loss_agg_mode": "token-mean"}}}
    saved = os.environ.get("VERL_FILE_LOGGER_PATH")
    os.environ["VERL_FILE_LOGGER_PATH"] = str(path)
    try:
        logger = Tracking(project_name="trackbridge-seeds", experiment_name=f"verl_grpo_s{seed}",
                          default_backend=["file"], config=config)
        logged = []
        for step in range(1, steps + 1):
            metrics = verl_step_metrics(seed, step)
            logger.log(data=metrics, step=step)
            logged.append(metrics)
        logger.finish()
    finally:
        if saved is None:
            os.environ.pop("VERL_FILE_LOGGER_PATH", None)
        else:
            os.environ["VERL_FILE_LOGGER_PATH"] = saved
    return logged


def main(argv: list[str]) -> int:
    if not argv or argv[0] != "trl":
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    seeds = [int(a) for a in argv[1:]] or list(SEEDS)
    t0 = time.time()
    for s in seeds:
        conf = train_trl(s)
        print(f"trl_grpo_s{s}: {conf['wall_s']} s", flush=True)
    print(f"total: {time.time() - t0:.1f} s", flush=True)
    return 0


if __name__ == "__main__":      # pragma: no cover - a maintainer's command
    sys.exit(main(sys.argv[1:]))
