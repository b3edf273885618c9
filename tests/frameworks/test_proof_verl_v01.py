"""Fingerprints of the veRL entries of its first release, verl 0.1 (tests/releases.txt; the proofs in a child process
with the release first on sys.path, tests/_support/releases.py): the learning rates the workers log times 1e4
(``actor/lr(1e-4)``, ``critic/lr(1e-4)``, renamed actor/lr and critic/lr in v0.2), fit()'s stage timers
(``timing/gen`` and ``timing/{stage}``, renamed timing_s/ in v0.2) and the actor's gradient norm. What runs is 0.1's
own code (tests/_support/proofs_verl_v01.py): the workers' update_actor / update_critic around its
DataParallelPPOActor / Critic on 2 simulated ranks, and RayPPOTrainer.fit itself over three training steps whose
stages take known seconds on a stand-in clock."""
from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("tensordict")
pytest.importorskip("verl", reason="make test installs verl --no-deps")

from _support import proofs_verl_old as O  # noqa: E402
from _support import proofs_verl_old2 as O2  # noqa: E402
from _support import proofs_verl_v01 as V  # noqa: E402
from _support.proven import close, proof  # noqa: E402

# verl 0.1's own config names (ppo_micro_batch_size, not yet _per_gpu), the sizes the harness runs
V01 = {"data.train_batch_size": O.N_PER_RANK * O.WORLD, "actor_rollout_ref.rollout.n": 1,
       "actor_rollout_ref.actor.ppo_mini_batch_size": O.MINI * O.WORLD, "actor_rollout_ref.actor.ppo_epochs": O.EPOCHS,
       "actor_rollout_ref.actor.ppo_micro_batch_size": O.MICRO, "critic.ppo_mini_batch_size": O.MINI * O.WORLD,
       "critic.ppo_epochs": O.EPOCHS, "critic.ppo_micro_batch_size": O.MICRO, "trainer.n_gpus_per_node": O.WORLD,
       "trainer.nnodes": 1}
# each training step's seconds per stage: every stage and step a different number, none a sum of others'
SECONDS = [{"gen": 12.5, "ref": 0.75, "values": 0.5, "adv": 0.125, "update_critic": 1.75, "update_actor": 1.5,
            "testing": 11.0},
           {"gen": 9.0, "ref": 0.625, "values": 0.375, "adv": 0.0625, "update_critic": 2.25, "update_actor": 1.25,
            "testing": 10.5},
           {"gen": 14.0, "ref": 0.875, "values": 0.3125, "adv": 0.1875, "update_critic": 1.625, "update_actor": 2.5,
            "testing": 12.25}]


@proof("verl", trainer="ppo", release="0.1", config=V01)
def test_v01_lrs_are_the_next_steps_rate_times_1e4(p):
    """actor/lr(1e-4), critic/lr(1e-4): fsdp_workers.py@v0.1:325-327,606-608 step the scheduler after the update and
    log ``get_last_lr()[0] * 1e4``: the rate the next step will use (not the one this step's optimizer steps used;
    the constant-with-warmup schedule moves it every step), scaled by 1e4, which the entries' transform (scale
    1e-4) undoes. One value a step, the same on every rank."""
    with V.cpu_only():
        runs = {role: V.run_worker(role, steps=3) for role in ("actor", "critic")}
    for role, run in runs.items():
        key = f"{role}/lr(1e-4)"
        entry, res = p.entry(key)
        p.check(entry.scale == 1e-4 and res.fields["snapshot"] == "after_scheduler_step", (key, entry.scale,
                                                                                          res.fields))
        for logged, used, after, metrics in zip(run.logged, run.used, run.after, run.metrics):
            p.check(len(set(used)) == 1 and close(logged * entry.scale, after) and not close(logged * entry.scale,
                                                                                               used[0]),
                    (role, logged, used, after))
            p.check(not close(logged, after) and metrics[key] == logged, (role, logged, metrics[key]))
        p.assert_stated(key, [(m, O2.one_value(m)) for m in run.logged], levels=())


@proof("verl", trainer="ppo", release="0.1", config=V01)
def test_v01_grad_norm_is_the_mean_over_mini_batches_and_epochs(p):
    """actor/grad_norm up to v0.2.0.post2, at v0.1: update_policy appends each optimizer step's pre-clip norm
    (dp_actor.py@v0.1:163-165) over the mini-batch iterator, which at v0.1 runs ppo_epochs passes
    (DataProto.make_iterator(epochs=...), protocol.py@v0.1:336) and reduce_metrics averages them, DataProto.concat
    keeping rank 0's list: the mean over rank 0's mini-batches x epochs (4 here), not the last, the sum or an
    extreme. Three training steps of different batches."""
    with V.cpu_only():
        run = V.run_worker("actor", steps=3)
    steps = [(m["actor/grad_norm"], O2.norm_steps(norms[0])) for m, norms in zip(run.metrics, run.norms)]
    p.check(all(len(norms[0]) == 2 * O.EPOCHS for norms in run.norms), run.norms)
    p.check(len({n for norms in run.norms for n in norms[0]}) > 2 * O.EPOCHS, run.norms)
    p.assert_stated("actor/grad_norm", steps, levels=(), mini=("mean", "last", "sum", "max", "min"), rel=1e-6)
    m, norms = run.metrics[-1], run.norms[-1]
    p.check(not close(m["actor/grad_norm"], norms[0][-1]) and norms[0] != norms[1], (m, norms))


@proof("verl", trainer="ppo", release="0.1", config=V01)
def test_v01_stage_timers_are_each_steps_own_seconds(p):
    """timing/gen and timing/{stage} (ref, values, adv, update_critic, update_actor, testing): fit()'s
    ``with Timer(name=..., logger=None) as timer`` blocks (ray_trainer.py@v0.1:434-503), ``timer.last`` logged in the
    step's row: the seconds that stage took in that step, as they are (seconds, no sign), not a running total over
    the steps, nor their mean so far, nor the whole step's time; the initial and final validations, outside every
    block, never counted. Read from the rows fit() handed its logger over three steps."""
    fit = V.run_fit(SECONDS)
    p.check([s for s, _ in fit.rows] == list(range(len(SECONDS))), [s for s, _ in fit.rows])
    for stage in V.STAGES:
        key = f"timing/{stage}"
        logged = [row[key] for _, row in fit.rows]
        want = [s[stage] for s in SECONDS]
        p.check(logged == want, (key, logged, want))
        running = [sum(want[:i + 1]) for i in range(len(want))]
        means = [r / (i + 1) for i, r in enumerate(running)]
        whole = [sum(s.values()) for s in SECONDS]
        p.check(all(not close(a, b) for a, b in zip(logged[1:], running[1:])), (key, "running total"))
        p.check(all(not close(a, b) for a, b in zip(logged[1:], means[1:])), (key, "mean so far"))
        p.check(all(not close(a, b) for a, b in zip(logged, whole)), (key, "the whole step"))
        p.assert_stated(key, [(v, O2.one_value(v)) for v in logged], levels=())
    # and fit()'s own metrics beside them: the rows are the trainer's (its data metrics, its KL penalty)
    p.check(all("critic/score/mean" in row and "critic/kl" in row for _, row in fit.rows), fit.rows[0][1])
