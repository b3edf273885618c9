"""``trackbridge.integrations.ray.setup`` as a Ray ``worker_process_setup_hook`` on a real one-node Ray cluster on
127.0.0.1 (2 CPUs, no dashboard), in the layout veRL and OpenRLHF use: the training loop runs inside an actor, the
driver only waits for it, and the actor is ended hard once the driver is done (``ray.kill``, as ``ray.shutdown``
does). Every tracker is read back with its own tools (tests/_support/readback.py): TensorBoard's EventFileLoader,
MlflowClient, the spool's JSON lines, wandb's offline transaction log; nothing lost, nothing doubled.

* veRL's own ``verl.utils.tracking.Tracking`` (the installed wheel) with ``backends=["wandb", "tensorboard"]``,
  300 steps, created inside ``fit()`` as veRL's trainer does (finished by its ``__del__`` when ``fit()`` returns);
* OpenRLHF's own ``WandbLogger`` and ``TensorboardLogger`` (openrlhf/utils/logging_utils.py of the installed wheel,
  loaded by file: the package's ``__init__`` imports pylatexenc and deepspeed-era code this environment lacks),
  called as ``PPOTrainer`` calls them (log_train / log_eval for each, then close());
* an actor stopped with SIGTERM mid-run: the trackers hold every step and say ``KILLED``; an actor ended with
  ``ray.kill`` mid-run (no exit hook runs): the spool holds every step, ``trackbridge replay``
  finish the trackers, and the run says killed.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

import pytest

from _support import ROOT
from _support.readback import exact, mlflow_points, mlflow_status, spool_points, tensorboard_points, wandb_points

ray = pytest.importorskip("ray")
pytest.importorskip("verl")
pytest.importorskip("torch")
pytest.importorskip("mlflow")

HOOK = "trackbridge.integrations.ray.setup"
VERL_KEYS = {"actor/pg_loss": "loss/policy", "critic/score/mean": "reward/score/mean",
             "response_length/mean": "response/length/mean"}


@pytest.fixture(scope="module")
def cluster():
    """A one-node cluster whose job runs the setup hook in every worker; tests/ on the workers' path (the actor
    classes live in this file). Each actor gets its sinks, spool and run id through its own env_vars (merged)."""
    tmp = Path(tempfile.mkdtemp(prefix="rr-", dir="/tmp"))       # short: Ray's socket paths must stay < 108 bytes
    env = {k: os.environ[k] for k in ("WANDB_MODE", "WANDB_SILENT", "WANDB_DISABLE_GIT", "WANDB_DISABLE_CODE",
                                      "WANDB_CONSOLE", "MLFLOW_DISABLE_TELEMETRY", "WANDB_CONFIG_DIR",
                                      "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "TRACKBRIDGE_STATE_DIR")
           if k in os.environ}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "tests" / "frameworks"), str(ROOT / "tests"), str(ROOT)])
    env["WANDB_API_KEY"] = "x" * 40           # OpenRLHF's WandbLogger logs in unless a key is set (offline: unused)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RAY_AUTH_MODE", "disabled")      # a cluster on 127.0.0.1 only; no token written to ~/.ray
        ray.init(address="local", num_cpus=2, object_store_memory=80 * 2 ** 20, include_dashboard=False,
                 log_to_driver=False, namespace="trackbridge", _node_ip_address="127.0.0.1", _temp_dir=str(tmp),
                 runtime_env={"worker_process_setup_hook": HOOK, "env_vars": env})
        try:
            yield tmp
        finally:
            ray.shutdown()
            shutil.rmtree(tmp, ignore_errors=True)


def _env(tmp_path: Path, run_id: str, source: str, **more: str) -> dict:
    return {"TRACKBRIDGE_SINKS": f"tensorboard:{tmp_path}/tb,mlflow:sqlite:///{tmp_path}/mlflow.db",
            "TRACKBRIDGE_SPOOL": str(tmp_path / "spool"), "TRACKBRIDGE_SOURCE": source,
            "TRACKBRIDGE_RUN_ID": run_id, **more}


def _uri(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/mlflow.db"


def _dead(pid: int, timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    raise AssertionError(f"worker {pid} still alive after {timeout} s")


def _lock_released(spool: Path, timeout: float = 120.0) -> None:
    """Wait until no process holds the run (a writer process left behind finishes the trackers first)."""
    from trackbridge.logger.runlock import left_unfinished as unfinished
    lock = spool.with_name(spool.name + ".lock")
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if not lock.exists() or unfinished(spool):
            return
        time.sleep(0.2)
    raise AssertionError(f"{lock} still held after {timeout} s")


# -- the actors (run in Ray workers, which import this file from tests/frameworks) -------------------------------------
def verl_row(i: int) -> dict:
    return {"actor/pg_loss": 0.5 - i / 1000, "critic/score/mean": i / 4, "response_length/mean": 10.0 + i % 7}


@ray.remote(num_cpus=0)
class VerlTaskRunner:
    """veRL's TaskRunner layout: the trainer's fit() makes a Tracking, logs every step and returns."""

    def fit(self, steps: int, out: str, backends: list, finish: bool = True) -> int:
        os.environ["TENSORBOARD_DIR"] = f"{out}/verl_tb"       # veRL's own TensorBoard folder
        os.environ["WANDB_DIR"] = f"{out}/verl_wandb"
        os.makedirs(f"{out}/verl_wandb", exist_ok=True)
        from verl.utils.tracking import Tracking
        logger = Tracking(project_name="verl-proj", experiment_name="verl-exp", default_backend=backends,
                          config={"trainer": {"total_epochs": 1},
                                  "actor_rollout_ref": {"actor": {"kl_loss_coef": 0.001}}})
        for step in range(steps):
            logger.log(data=verl_row(step), step=step)
        if not finish:
            self.keep = logger          # the run stays open: the test ends the process
            time.sleep(1.5)             # past the spool's flush bound (flush_interval, 1 s)
        return os.getpid()

    def state(self) -> dict:
        from trackbridge.integrations import ray as tr
        st = tr.state()
        return {"feed": st.feed, "finished": bool(getattr(st.shared.inner, "_finished", False)),
                "spool": str(st.shared.inner.spool_path), "wrapped": sorted(st.handles)}


def _openrlhf_logging_utils():
    """openrlhf/utils/logging_utils.py of the installed wheel, loaded by file (its package __init__ is not run)."""
    import importlib.util
    spec = importlib.util.find_spec("openrlhf")
    path = Path(spec.submodule_search_locations[0]) / "utils" / "logging_utils.py"
    mod_spec = importlib.util.spec_from_file_location("openrlhf_logging_utils", path)
    mod = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(mod)
    return mod


def openrlhf_logs(step: int) -> dict:
    return {"policy_loss": 1.0 / step, "kl": step / 1000, "reward": step / 10, "response_length": 20.0 + step % 5}


@ray.remote(num_cpus=0)
class OpenRLHFTrainer:
    """PPOTrainer's logging: WandbLogger(args) and TensorboardLogger(args) made in __init__, log_train/log_eval on
    both every step, close() on both at the end of fit()."""

    def fit(self, steps: int, out: str) -> int:
        os.environ["WANDB_DIR"] = f"{out}/orlhf_wandb"
        os.makedirs(f"{out}/orlhf_wandb", exist_ok=True)
        lu = _openrlhf_logging_utils()
        ns = types.SimpleNamespace
        args = ns(logger=ns(wandb=ns(key="x" * 40, org=None, project="orlhf-proj", group=None, run_name="orlhf-run"),
                            tensorboard_dir=f"{out}/orlhf_tb"),
                  algo=ns(kl=ns(use_loss=True, estimator="k3")))
        wandb_logger = lu.WandbLogger(args)
        tensorboard_logger = lu.TensorboardLogger(args)
        for global_step in range(1, steps + 1):
            logs = openrlhf_logs(global_step)
            wandb_logger.log_train(global_step, logs)
            tensorboard_logger.log_train(global_step, logs)
            if global_step % 50 == 0:
                wandb_logger.log_eval(global_step, {"eval_reward": global_step / 100})
                tensorboard_logger.log_eval(global_step, {"eval_reward": global_step / 100})
        wandb_logger.close()
        tensorboard_logger.close()
        return os.getpid()


# -- the tests ---------------------------------------------------------------------------------------------------------
def test_verl_tracking_in_a_task_runner_reaches_every_tracker(cluster, tmp_path):
    steps = 300
    runner = VerlTaskRunner.options(runtime_env={"env_vars": _env(tmp_path, "verl-ray", "verl")}).remote()
    pid = ray.get(runner.fit.remote(steps, str(tmp_path), ["wandb", "tensorboard"]), timeout=240)
    st = ray.get(runner.state.remote())
    ray.kill(runner)              # as ray.shutdown() ends it once main_ppo's driver is done: no exit hook runs
    _dead(pid)
    assert st["feed"] == "verl" and st["finished"], st      # finished by Tracking.__del__, before fit() returned
    assert st["wrapped"] == ["torch.utils.tensorboard.writer", "verl.utils.tracking", "wandb"], st

    want = list(VERL_KEYS.values())
    spool, bad = spool_points(Path(st["spool"]))
    assert not bad and exact(spool, want, range(steps)) is None, exact(spool, want, range(steps))
    tb = tensorboard_points(tmp_path / "tb")
    assert exact(tb, want, range(steps)) is None, exact(tb, want, range(steps))
    ml = mlflow_points(_uri(tmp_path), "verl-ray")
    assert exact(ml, want, range(steps)) is None, exact(ml, want, range(steps))
    assert mlflow_status(_uri(tmp_path), "verl-ray") == "FINISHED"
    for points in (spool, tb, ml):           # one name per value: no original name reached a trackbridge tracker
        assert not set(points) & set(VERL_KEYS), sorted(points)
    # veRL's own backends still got the original names, every step once
    own_tb = tensorboard_points(tmp_path / "verl_tb")
    assert exact(own_tb, list(VERL_KEYS), range(steps)) is None
    own_wb = _wandb_steps(tmp_path / "verl_wandb")
    assert exact(own_wb, list(VERL_KEYS), range(steps)) is None, exact(own_wb, list(VERL_KEYS), range(steps))
    # the run config is veRL's (Tracking's config=), canonical names added
    header = json.loads(Path(st["spool"]).read_text().splitlines()[0])
    assert header["config"]["actor_rollout_ref"]["actor"]["kl_loss_coef"] == 0.001, header["config"]
    assert header["project"] == "verl-proj" and header["name"] == "verl-exp"


def _wandb_steps(folder: Path) -> dict:
    """key -> Counter(step) of a wandb offline run's history rows (the row's ``_step``)."""
    import collections

    from _support.readback import wandb_records
    out: dict = collections.defaultdict(collections.Counter)
    for rec in wandb_records(folder):
        if rec.WhichOneof("record_type") != "history":
            continue
        row = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in rec.history.item}
        for key in row:
            if not key.startswith("_"):
                out[key][row.get("_step")] += 1
    return dict(out)


def test_openrlhf_ppo_trainer_loggers_in_an_actor(cluster, tmp_path):
    steps = 200
    cfg = json.dumps({"algo": {"kl": {"use_loss": True, "estimator": "k3"}}})
    trainer = OpenRLHFTrainer.options(runtime_env={"env_vars": _env(tmp_path, "orlhf-ray", "openrlhf",
                                                                    TRACKBRIDGE_CONFIG=cfg)}).remote()
    pid = ray.get(trainer.fit.remote(steps, str(tmp_path)), timeout=240)
    ray.kill(trainer)
    _dead(pid)

    spool_file = tmp_path / "spool" / "orlhf-ray.jsonl"
    train = ["loss/policy", "kl/ref/k3", "reward/score/mean"]
    spool, bad = spool_points(spool_file)
    assert not bad
    tb = tensorboard_points(tmp_path / "tb")
    ml = mlflow_points(_uri(tmp_path), "orlhf-ray")
    for name, points in (("spool", spool), ("tensorboard", tb), ("mlflow", ml)):
        assert exact(points, train, range(1, steps + 1)) is None, (name, exact(points, train, range(1, steps + 1)))
        # the eval rows, at eval/epoch's value: OpenRLHF's log_eval sends global_step as eval/global_step
        eval_keys = [k for k in points if k.startswith("eval/")]
        assert eval_keys, (name, sorted(points))
        # one name per value: kl only as the KL loss of the run config (use_loss, k3), never as the reward-side KL
        assert "kl/old_ref/k1" not in points and "train/kl" not in points, (name, sorted(points))
    assert mlflow_status(_uri(tmp_path), "orlhf-ray") == "FINISHED"
    # OpenRLHF's own wandb and TensorBoard files: the original names, once each
    own_tb = tensorboard_points(tmp_path / "orlhf_tb" / "orlhf-run")
    assert exact(own_tb, ["train/policy_loss", "train/kl"], range(1, steps + 1)) is None
    own_wb = wandb_points(tmp_path / "orlhf_wandb")
    assert {"train/policy_loss", "train/kl"} <= set(own_wb), sorted(own_wb)


def test_actor_stopped_with_sigterm_records_killed(cluster, tmp_path):
    steps = 120
    runner = VerlTaskRunner.options(runtime_env={"env_vars": _env(tmp_path, "verl-term", "verl")}).remote()
    pid = ray.get(runner.fit.remote(steps, str(tmp_path), ["tensorboard"], False), timeout=240)
    os.kill(pid, signal.SIGTERM)           # what the raylet sends a worker it stops
    _dead(pid)
    spool_file = tmp_path / "spool" / "verl-term.jsonl"
    _lock_released(spool_file)
    want = list(VERL_KEYS.values())
    for points in (spool_points(spool_file)[0], tensorboard_points(tmp_path / "tb"),
                   mlflow_points(_uri(tmp_path), "verl-term")):
        assert exact(points, want, range(steps)) is None, exact(points, want, range(steps))
    assert mlflow_status(_uri(tmp_path), "verl-term") == "KILLED"
    assert not (spool_file.with_name(spool_file.name + ".lock")).exists()     # finished, not left behind


@pytest.mark.parametrize("writer", ["thread", "process"])
def test_actor_killed_leaves_a_spool_that_replay_completes(cluster, tmp_path, writer):
    """ray.kill ends the process at once (no exit hook, no signal handler). With writer threads the trackers stop
    where they were and the spool holds every step; with the writer process (the default), Ray ends the worker's
    children too, or the writer left behind finishes the trackers from the spool as killed. Either way `trackbridge
    replay` (the command, and replay()) leave each tracker with every step once, and the run says killed."""
    from trackbridge.logger.runlock import left_unfinished as unfinished
    from trackbridge.sync.replay import replay
    steps = 150
    run_id = f"verl-kill-{writer}"
    runner = VerlTaskRunner.options(runtime_env={"env_vars": _env(tmp_path, run_id, "verl",
                                                                  TRACKBRIDGE_WRITER=writer)}).remote()
    pid = ray.get(runner.fit.remote(steps, str(tmp_path), ["tensorboard"], False), timeout=240)
    ray.kill(runner)
    _dead(pid)
    spool_file = tmp_path / "spool" / f"{run_id}.jsonl"
    want = list(VERL_KEYS.values())
    spool, bad = spool_points(spool_file)
    assert exact(spool, want, range(steps)) is None, exact(spool, want, range(steps))
    _lock_released(spool_file)
    left_unfinished = unfinished(spool_file)       # the run claim was left: nobody finished the run
    if writer == "thread":
        assert left_unfinished
    # `trackbridge replay` (the CLI) completes TensorBoard; replay() MLflow, each recording the outcome
    out = subprocess.run([sys.executable, "-m", "trackbridge", "replay", str(spool_file), "--to",
                          f"tensorboard:{tmp_path}/tb"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    result = replay(spool_file, f"mlflow:sqlite:///{tmp_path}/mlflow.db")
    if left_unfinished:
        assert any("killed" in n for n in result.notes), result.notes
    for points in (tensorboard_points(tmp_path / "tb"), mlflow_points(_uri(tmp_path), run_id)):
        assert exact(points, want, range(steps)) is None, exact(points, want, range(steps))
    assert mlflow_status(_uri(tmp_path), run_id) == "KILLED"
    # a second replay writes nothing
    again = subprocess.run([sys.executable, "-m", "trackbridge", "replay", str(spool_file), "--to",
                            f"tensorboard:{tmp_path}/tb"], capture_output=True, text=True, timeout=120)
    assert again.returncode == 0
    assert exact(tensorboard_points(tmp_path / "tb"), want, range(steps)) is None


def test_a_worker_of_rank_1_opens_no_run(cluster, tmp_path):
    """A worker group's actors carry RANK: only rank 0 opens the run (init's rank support), so one run per run."""
    runner = VerlTaskRunner.options(runtime_env={"env_vars": {**_env(tmp_path, "verl-rank1", "verl"),
                                                               "RANK": "1", "WORLD_SIZE": "2"}}).remote()
    pid = ray.get(runner.fit.remote(20, str(tmp_path), ["tensorboard"]), timeout=240)
    ray.kill(runner)
    _dead(pid)
    assert not (tmp_path / "spool" / "verl-rank1.jsonl").exists()
    assert not (tmp_path / "tb").exists() or not tensorboard_points(tmp_path / "tb")
    assert exact(tensorboard_points(tmp_path / "verl_tb"), list(VERL_KEYS), range(20)) is None   # veRL's own


LAUNCHED = """
import os, sys
import ray


@ray.remote(num_cpus=0)
class Trainer:
    def fit(self, steps, out):
        import wandb
        wandb.init(project="launch-proj", name="launch", dir=out, mode="offline")
        wandb.define_metric("train/global_step")
        wandb.define_metric("train/*", step_metric="train/global_step", step_sync=True)
        for g in range(1, steps + 1):
            wandb.log({"train/policy_loss": 1.0 / g, "train/reward": g / 10, "train/global_step": g})
        wandb.finish()
        return os.getpid()


def train(args):
    if not ray.is_initialized():          # as OpenRLHF's train_ppo_ray and veRL's main_ppo do
        ray.init(runtime_env={"env_vars": {"TOKENIZERS_PARALLELISM": "true"}})
    trainer = Trainer.remote()
    print("pid", ray.get(trainer.fit.remote(int(args[0]), args[1])))


if __name__ == "__main__":
    train(sys.argv[1:])
"""


def test_the_launcher_runs_a_framework_module_with_the_hook(cluster, tmp_path):
    """python -m trackbridge.integrations.ray MODULE ARGS: Ray is initialised with the hook first, so a framework
    that calls ray.init() only when Ray is not initialised (OpenRLHF 0.11) gets it without a change."""
    (tmp_path / "launched_train.py").write_text(LAUNCHED)
    steps = 40
    env = {**os.environ, **_env(tmp_path, "launched", "openrlhf"), "PYTHONPATH": str(tmp_path),
           "RAY_ADDRESS": ray.get_runtime_context().gcs_address, "RAY_AUTH_MODE": "disabled"}
    out = subprocess.run([sys.executable, "-m", "trackbridge.integrations.ray", "launched_train", str(steps),
                          str(tmp_path / "own")], env=env, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    want = ["loss/policy", "reward/score/mean"]
    for points in (spool_points(tmp_path / "spool" / "launched.jsonl")[0], tensorboard_points(tmp_path / "tb"),
                   mlflow_points(_uri(tmp_path), "launched")):
        assert exact(points, want, range(1, steps + 1)) is None, exact(points, want, range(1, steps + 1))
    assert mlflow_status(_uri(tmp_path), "launched") == "FINISHED"
    bad = subprocess.run([sys.executable, "-m", "trackbridge.integrations.ray", "x"], capture_output=True, text=True,
                         env={**env, "TRACKBRIDGE_TEE": "comet"}, timeout=60)
    assert bad.returncode == 2 and "TRACKBRIDGE_TEE" in bad.stderr


def test_importing_the_hook_module_stays_light():
    code = ("import sys, trackbridge.integrations.ray as r\n"
            "bad = [m for m in ('ray', 'wandb', 'torch', 'mlflow', 'tensorboard', 'verl') if m in sys.modules]\n"
            "assert not bad, bad\n"
            "assert callable(r.setup)\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=str(ROOT))


def test_verl_main_ppo_override_reaches_ray_init():
    """The README's Hydra override, composed with veRL 0.9's own ppo_trainer.yaml and merged as main_ppo.run_ppo
    merges it (verl/trainer/main_ppo.py: get_ppo_ray_runtime_env(config) under ray_kwargs.ray_init.runtime_env):
    ray.init gets the hook and the TRACKBRIDGE_* env_vars. (Needs hydra-core, which veRL's --no-deps install lacks.)"""
    pytest.importorskip("hydra")
    import verl
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf
    from verl.trainer.constants_ppo import get_ppo_ray_runtime_env
    sinks = "tensorboard:/abs/runs/tb,mlflow:sqlite:////abs/runs/mlflow.db"
    overrides = [f"+ray_kwargs.ray_init.runtime_env.worker_process_setup_hook={HOOK}",
                 f'+ray_kwargs.ray_init.runtime_env.env_vars.TRACKBRIDGE_SINKS="{sinks}"',
                 "+ray_kwargs.ray_init.runtime_env.env_vars.TRACKBRIDGE_SPOOL=/abs/runs/spool",
                 "+ray_kwargs.ray_init.runtime_env.env_vars.TRACKBRIDGE_SOURCE=verl"]
    with initialize_config_dir(config_dir=str(Path(verl.__file__).parent / "trainer" / "config"), version_base=None):
        config = compose("ppo_trainer", overrides=overrides)
    ray_init_kwargs = config.ray_kwargs.get("ray_init", {})
    runtime_env = OmegaConf.merge(get_ppo_ray_runtime_env(config), ray_init_kwargs.get("runtime_env", {}))
    kwargs = OmegaConf.to_container(OmegaConf.create({**ray_init_kwargs, "runtime_env": runtime_env}))
    assert kwargs["runtime_env"]["worker_process_setup_hook"] == HOOK
    env = kwargs["runtime_env"]["env_vars"]
    assert env["TRACKBRIDGE_SINKS"] == sinks and env["TRACKBRIDGE_SOURCE"] == "verl"
    assert env.get("VLLM_LOGGING_LEVEL", os.environ.get("VLLM_LOGGING_LEVEL")) is not None   # veRL's defaults kept
    from trackbridge.integrations.ray import options_from_env
    assert options_from_env(env)["sinks"] == sinks.split(",")
