"""
WorkerDispatch: Manages all actor groups with automatic offload/onload.

Automatically handles GPU placement:
- Tracks which model is currently on GPU
- If colocation is enabled, offloads other models when one is requested

The trainer interacts with the worker dispatch if all models are always on GPU.
"""

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

import ray
from loguru import logger
from ray import ObjectRef

from skyrl.backends.skyrl_train.distributed.dispatch import (
    MeshDispatch,
    WorkerOutput,
)
from skyrl.backends.skyrl_train.training_batch import (
    TrainingInputBatch,
)
from skyrl.backends.skyrl_train.workers.worker import PPORayActorGroup
from skyrl.train.config import SkyRLTrainConfig

if TYPE_CHECKING:
    from skyrl.backends.skyrl_train.inference_servers.remote_inference_client import (
        RemoteInferenceClient,
    )


@dataclass
class GPUState:
    """Tracks what's on GPU for a model."""

    model_on_gpu: bool = False
    optimizer_on_gpu: bool = False


class WorkerDispatch:
    """
    Unified dispatch layer that manages all actor groups (policy, critic, ref).

    Handles automatic offload/onload when colocate_all=True.
    """

    def __init__(
        self,
        cfg: SkyRLTrainConfig,
        policy_actor_group: PPORayActorGroup,
        critic_actor_group: Optional[PPORayActorGroup] = None,
        ref_actor_group: Optional[PPORayActorGroup] = None,
        inference_engine_client: "Optional[RemoteInferenceClient]" = None,
    ):
        self.cfg = cfg
        self.colocate_all = cfg.trainer.placement.colocate_all
        self.colocate_policy_ref = cfg.trainer.placement.colocate_policy_ref

        # Inference engine client for weight sync (optional)
        self._inference_engine_client = inference_engine_client

        # Actor groups by name.
        # TODO: Remove these role-specific identifiers. We will move to using model IDs and add support for generic models beyond these.
        self._actor_groups: Dict[str, PPORayActorGroup] = {"policy": policy_actor_group}
        if critic_actor_group is not None:
            self._actor_groups["critic"] = critic_actor_group
        if ref_actor_group is not None:
            self._actor_groups["ref"] = ref_actor_group

        # GPU state tracking (only matters when colocated)
        self._gpu_state: Dict[str, GPUState] = {name: GPUState() for name in self._actor_groups.keys()}

    def register_actor_group(self, model: str, actor_group: PPORayActorGroup) -> None:
        self._actor_groups[model] = actor_group
        self._gpu_state[model] = GPUState()

    # ------------------------------------------------------------------
    # Multi-LoRA: per-model adapter swap orchestration.
    # ------------------------------------------------------------------

    def ensure_active_adapter(self, role: str, model_id: Optional[str]) -> None:
        """Make ``model_id`` the live LoRA adapter for ``role`` workers.

        No-op when ``model_id is None`` (single-tenant / FFT path) or when
        the workers don't have an AdapterStore (non-LoRA strategies).

        Must be called *after* ``_ensure_on_gpu(role, ...)`` so the model
        and optimizer storages are live before we tensor.copy_() into them.
        """
        if model_id is None or role not in self._actor_groups:
            return
        ray.get(self._actor_groups[role].async_run_ray_method("pass_through", "swap_to_adapter", model_id))

    def register_adapter(self, role: str, model_id: str) -> None:
        """Register a new adapter slot on every worker (subsequent
        create_model). Pristine must already exist.
        """
        if role not in self._actor_groups:
            return
        ray.get(self._actor_groups[role].async_run_ray_method("pass_through", "register_adapter", model_id))

    def delete_adapter(self, role: str, model_id: str) -> None:
        if role not in self._actor_groups:
            return
        ray.get(self._actor_groups[role].async_run_ray_method("pass_through", "delete_adapter", model_id))

    def get_lcm_dp_size(self) -> int:
        """Get LCM of all models' dp_size."""
        import math

        dp_size = self._actor_groups["policy"].actor_infos[0].rank.dp_size
        if "critic" in self._actor_groups:
            dp_size = math.lcm(dp_size, self._actor_groups["critic"].actor_infos[0].rank.dp_size)
        if "ref" in self._actor_groups:
            dp_size = math.lcm(dp_size, self._actor_groups["ref"].actor_infos[0].rank.dp_size)
        return dp_size

    def dp_size(self, model: str) -> int:
        """Return the data-parallel size for ``model`` (e.g. "policy")."""
        return self._actor_groups[model].actor_infos[0].rank.dp_size

    def _should_manage_offload(self, model: str) -> bool:
        """Check if we need to manage offload for this model."""
        if self.colocate_all:
            return True
        if self.colocate_policy_ref and model in ("policy", "ref"):
            return True
        return False

    def _get_colocation_group(self, model: str) -> List[str]:
        """Get which models share GPU with the given model."""
        if self.colocate_all:
            return list(self._actor_groups.keys())
        elif self.colocate_policy_ref and model in ("policy", "ref"):
            return [m for m in ["policy", "ref"] if m in self._actor_groups]
        return [model]

    def _ensure_on_gpu(self, model: str, need_optimizer: bool = True, need_model: bool = True) -> None:
        """Ensure model is on GPU, offloading others in same colocation group if needed."""
        if not self._should_manage_offload(model):
            return

        if model not in self._actor_groups:
            return

        group = self._get_colocation_group(model)

        # Offload others in the same colocation group
        for other in group:
            if other != model and other in self._actor_groups:
                state = self._gpu_state[other]
                if state.model_on_gpu or state.optimizer_on_gpu:
                    self._actor_groups[other].offload_to_cpu()
                    self._gpu_state[other] = GPUState()

        # Backload requested model
        state = self._gpu_state[model]
        needs_backload = (need_model and not state.model_on_gpu) or (need_optimizer and not state.optimizer_on_gpu)

        if needs_backload:
            self._actor_groups[model].backload_to_gpu(
                backload_optimizer=need_optimizer,
                backload_model=need_model,
            )
            if need_model:
                self._gpu_state[model].model_on_gpu = True
            if need_optimizer:
                self._gpu_state[model].optimizer_on_gpu = True

    def _offload(self, model: str, offload_optimizer: bool = True, offload_model: bool = True) -> None:
        """Offload model to CPU."""
        if not self._should_manage_offload(model):
            return

        if model not in self._actor_groups:
            return

        self._actor_groups[model].offload_to_cpu(
            offload_optimizer=offload_optimizer,
            offload_model=offload_model,
        )

        if offload_model:
            self._gpu_state[model].model_on_gpu = False
        if offload_optimizer:
            self._gpu_state[model].optimizer_on_gpu = False

    def mark_all_offloaded(self) -> None:
        """Mark all models as offloaded (call after build_models when colocate_all)."""
        for model in self._actor_groups:
            self.mark_as_offloaded(model)

    def mark_as_offloaded(self, model: str) -> None:
        """Mark a specific model as offloaded without changing others."""
        if model not in self._actor_groups:
            return
        self._gpu_state[model] = GPUState()

    def forward(
        self,
        model: str,
        data: TrainingInputBatch,
        loss_fn: Optional[str] = None,
        loss_fn_config: Optional[Dict[str, Any]] = None,
        model_id: Optional[str] = None,
    ) -> WorkerOutput:
        """Run forward pass. Only loads model (not optimizer).

        Returns a :class:`WorkerOutput` aggregated across DP ranks:

        - When ``loss_fn`` is None (RL/inference path): ``loss_fn_outputs`` is a
          per-sample list of dicts (one entry per batch item) keyed by
          ``logprobs`` (policy/ref) or ``values`` (critic); ``metrics`` is empty.
        - When ``loss_fn`` is set (e.g., ``"cross_entropy"``): ``loss_fn_outputs``
          carries per-sample arrays (e.g. ``logprobs`` / ``elementwise_loss``)
          and ``metrics`` contains scalar metrics like ``"loss"``.

        Args:
            model: Model identifier ("policy", "critic", or "ref")
            data: Training batch data
            loss_fn: Optional resolved loss function name (e.g., "cross_entropy"). When set,
                     the worker computes loss + per-sample outputs without backward (no_grad).
            loss_fn_config: Optional config overrides for the loss function.
            model_id: Optional Tinker model_id; when set, the corresponding LoRA adapter
                     is swapped in before the forward.
        """
        self._ensure_on_gpu(model, need_optimizer=False, need_model=True)
        self.ensure_active_adapter(model, model_id)

        kwargs = {}
        if loss_fn is not None:
            kwargs["loss_fn"] = loss_fn
        if loss_fn_config is not None:
            kwargs["loss_fn_config"] = loss_fn_config

        refs = self._actor_groups[model].async_run_ray_method("mesh", "forward", data=data, **kwargs)
        results = ray.get(refs)

        return WorkerOutput.cat(self._actor_groups[model].actor_infos, results)

    def forward_from_staged(
        self,
        model: str,
        chunk_refs: List[ObjectRef],
        loss_fn: Optional[str] = None,
        loss_fn_config: Optional[Dict[str, Any]] = None,
        model_id: Optional[str] = None,
    ) -> WorkerOutput:
        """Run a forward pass using pre-staged per-DP chunks.

        Consumes per-DP chunks already placed in the object store by :meth:`stage_data`, so
        serialization of the per-mini-batch chunks is amortized off the dispatch critical path
        across mini-batches (see :meth:`forward_backward_from_staged`). The chunks are produced
        exactly as in :meth:`stage_data`, so the per-rank partition (and thus the microbatch packing)
        matches what ``forward_backward`` sees for the same mini-batch.

        Args:
            model: Model identifier ("policy", "critic", or "ref")
            chunk_refs: Pre-staged ObjectRefs, one per DP rank (from ``stage_data``)
            loss_fn: Optional resolved loss function name. When set, the worker computes
                     loss + per-sample outputs without backward (no_grad).
            loss_fn_config: Optional config overrides for the loss function.
            model_id: Optional Tinker model_id; selects the LoRA adapter before the forward.

        Returns:
            :class:`WorkerOutput` aggregated across DP ranks.
        """
        self._ensure_on_gpu(model, need_optimizer=False, need_model=True)
        self.ensure_active_adapter(model, model_id)

        kwargs = {}
        if loss_fn is not None:
            kwargs["loss_fn"] = loss_fn
        if loss_fn_config is not None:
            kwargs["loss_fn_config"] = loss_fn_config

        refs = MeshDispatch.dispatch_from_staged(
            self._actor_groups[model].actor_infos,
            "forward",
            chunk_refs=chunk_refs,
            **kwargs,
        )
        results = ray.get(refs)
        return WorkerOutput.cat(self._actor_groups[model].actor_infos, results)

    def stage_data(
        self,
        model: str,
        data: TrainingInputBatch,
        mini_batch_boundaries: List[Tuple[int, int]],
    ) -> List[List[ObjectRef]]:
        """Pre-stage mini-batch chunks in the Ray object store.

        Call this once before the training loop so that all serialization is
        done upfront and GPUs stay saturated during training.

        Args:
            model: Model name (used to look up DP size).
            data: Full training batch.
            mini_batch_boundaries: List of ``(start, end)`` index pairs.
                The i-th mini-batch is data[mini_batch_boundaries[i][0]:mini_batch_boundaries[i][1]].

        Returns:
            ``result[i][dp_rank]`` - ObjectRef for mini-batch *i*, DP rank *dp_rank*.
        """
        dp_size = self._actor_groups[model].actor_infos[0].rank.dp_size
        return MeshDispatch.stage_chunks(dp_size, data, mini_batch_boundaries)

    def forward_backward(
        self,
        model: str,
        data: TrainingInputBatch,
        loss_fn: Optional[str] = None,
        loss_fn_config: Optional[Dict[str, Any]] = None,
        model_id: Optional[str] = None,
    ) -> WorkerOutput:
        """Run forward/backward pass. Needs model + optimizer.

        Args:
            model: Model identifier ("policy", "critic", or "ref")
            data: Training batch data
            loss_fn: Optional resolved train loss name (for example, "cross_entropy"
                     or "regular"). Public Tinker aliases like "ppo" should be
                     normalized before dispatch.
            loss_fn_config: Optional config overrides for the loss function
                           (e.g., {"eps_clip_low": 0.1} for the regular PPO loss)
            model_id: Optional Tinker model_id; when set, the corresponding
                     LoRA adapter is swapped in before the forward/backward.

        Returns:
            :class:`WorkerOutput` with per-sample ``loss_fn_outputs`` aggregated
            across DP ranks plus scalar ``metrics`` (already all-reduced).
        """
        self._ensure_on_gpu(model, need_optimizer=True, need_model=True)
        self.ensure_active_adapter(model, model_id)

        # Only pass kwargs that are not None (critic worker doesn't accept loss_fn)
        kwargs = {}
        if loss_fn is not None:
            kwargs["loss_fn"] = loss_fn
        if loss_fn_config is not None:
            kwargs["loss_fn_config"] = loss_fn_config

        refs = self._actor_groups[model].async_run_ray_method("mesh", "forward_backward", data, **kwargs)
        statuses = ray.get(refs)

        self._save_memory_snapshot(model, "forward_backward")

        return WorkerOutput.cat(self._actor_groups[model].actor_infos, statuses)

    def forward_backward_from_staged(
        self,
        model: str,
        chunk_refs: List[ObjectRef],
        loss_fn: Optional[str] = None,
        loss_fn_config: Optional[Dict[str, Any]] = None,
        model_id: Optional[str] = None,
    ) -> WorkerOutput:
        """
        Run forward/backward pass using pre-staged per-DP chunks.

        Each worker receives only its own DP chunk from the object store,
        avoiding unncecessary deserialization overhead.

        Args:
            model: Model name ("policy" or "critic")
            chunk_refs: Pre-staged ObjectRefs, one per DP rank (from ``stage_data``)

        Returns:
            :class:`WorkerOutput` with per-sample ``loss_fn_outputs`` aggregated
            across DP ranks plus scalar ``metrics`` (already all-reduced).
        """
        self._ensure_on_gpu(model, need_optimizer=True, need_model=True)
        self.ensure_active_adapter(model, model_id)

        # Only pass kwargs that are not None (critic worker doesn't accept loss_fn)
        kwargs = {}
        if loss_fn is not None:
            kwargs["loss_fn"] = loss_fn
        if loss_fn_config is not None:
            kwargs["loss_fn_config"] = loss_fn_config

        refs = MeshDispatch.dispatch_from_staged(
            self._actor_groups[model].actor_infos,
            "forward_backward",
            chunk_refs=chunk_refs,
            **kwargs,
        )
        statuses = ray.get(refs)

        self._save_memory_snapshot(model, "forward_backward")
        return WorkerOutput.cat(self._actor_groups[model].actor_infos, statuses)

    def optim_step(self, model: str, model_id: Optional[str] = None) -> Optional[float]:
        """Run optimizer step. For single-tenant training, the model should already be on GPU from forward_backward.

        For multi-tenant LoRA training, ``model_id`` is used to ensure the correct adapter is used.
        """
        self.ensure_active_adapter(model, model_id)
        refs = self._actor_groups[model].async_run_ray_method("pass_through", "optim_step")
        grad_norms = ray.get(refs)

        self._save_memory_snapshot(model, "optim_step")
        return grad_norms[0]

    def set_lr(self, model: str, learning_rate: float, model_id: Optional[str] = None) -> None:
        """Set learning rate for model's optimizer.

        This directly updates the optimizer's param_groups on all workers,
        bypassing the scheduler. Useful for external learning rate schedules.
        """
        self._ensure_on_gpu(model, need_optimizer=True, need_model=False)
        self.ensure_active_adapter(model, model_id)
        ray.get(self._actor_groups[model].async_run_ray_method("pass_through", "set_lr", learning_rate=learning_rate))

    def set_algorithm_config(self, model: str, **kwargs) -> None:
        """Update algorithm config fields on all workers for a model."""
        self._ensure_on_gpu(model, need_optimizer=False, need_model=False)
        ray.get(self._actor_groups[model].async_run_ray_method("pass_through", "set_algorithm_config", **kwargs))

    # ------------------------------------------------------------------
    # torch.profiler control. Avoid _ensure_on_gpu so profiling does not perturb
    # the colocation offload state.
    # ------------------------------------------------------------------

    def start_profile(self, model: str) -> None:
        """Start profiling on ``model`` workers."""
        if model not in self._actor_groups:
            return
        try:
            ray.get(self._actor_groups[model].async_run_ray_method("pass_through", "start_profile"))
        except Exception as e:
            logger.warning(f"[profiler] start_profile dispatch for {model} failed: {e}")

    def profile_step(self, model: str) -> None:
        """Advance profiling by one global step."""
        if model not in self._actor_groups:
            return
        try:
            ray.get(self._actor_groups[model].async_run_ray_method("pass_through", "profile_step"))
        except Exception as e:
            logger.warning(f"[profiler] profile_step dispatch for {model} failed: {e}")

    def stop_profile(self, model: str) -> None:
        """Stop profiling on ``model`` workers."""
        if model not in self._actor_groups:
            return
        try:
            ray.get(self._actor_groups[model].async_run_ray_method("pass_through", "stop_profile"))
        except Exception as e:
            logger.warning(f"[profiler] stop_profile dispatch for {model} failed: {e}")

    def dump_profiler_summary(self, model: str) -> Optional[List]:
        """Collect per-rank last-window kernel summaries for ``model``."""
        if model not in self._actor_groups:
            return None
        try:
            return ray.get(self._actor_groups[model].async_run_ray_method("pass_through", "dump_profiler_summary"))
        except Exception as e:
            logger.warning(f"[profiler] dump_profiler_summary dispatch for {model} failed: {e}")
            return None

    def _save_memory_snapshot(self, model: str, tag: str) -> None:
        """Save memory snapshot on workers."""
        ray.get(
            self._actor_groups[model].async_run_ray_method("pass_through", "save_memory_snapshot", tag=f"{model}_{tag}")
        )

    def save_checkpoint(self, model: str, ckpt_dir: str, tokenizer=None, model_id: Optional[str] = None) -> None:
        """Save checkpoint for model."""
        self._ensure_on_gpu(model, need_optimizer=True, need_model=True)
        self.ensure_active_adapter(model, model_id)

        ray.get(
            self._actor_groups[model].async_run_ray_method(
                "pass_through", "save_checkpoint", ckpt_dir=ckpt_dir, tokenizer=tokenizer
            )
        )

    def load_checkpoint(
        self,
        model: str,
        ckpt_dir: str,
        load_optimizer_states: bool = True,
        load_lr_scheduler_states: bool = True,
        model_id: Optional[str] = None,
    ) -> None:
        """Load checkpoint for model."""
        self._ensure_on_gpu(model, need_optimizer=load_optimizer_states, need_model=True)
        self.ensure_active_adapter(model, model_id)

        ray.get(
            self._actor_groups[model].async_run_ray_method(
                "pass_through",
                "load_checkpoint",
                ckpt_dir=ckpt_dir,
                load_optimizer_states=load_optimizer_states,
                load_lr_scheduler_states=load_lr_scheduler_states,
            )
        )

    def save_hf_model(self, model: str, export_dir: str, tokenizer) -> None:
        """Save model in HuggingFace format."""
        self._ensure_on_gpu(model, need_optimizer=False, need_model=True)

        ray.get(self._actor_groups[model].async_run_ray_method("pass_through", "save_hf_model", export_dir, tokenizer))

    def init_model(self, model: str, model_path: str, num_training_steps: Optional[int] = None) -> None:
        """Initialize model from path. Offloads others in colocation group first."""
        # Offload others in colocation group before init
        if self._should_manage_offload(model):
            group = self._get_colocation_group(model)
            for other in group:
                if other != model and other in self._actor_groups:
                    state = self._gpu_state[other]
                    if state.model_on_gpu or state.optimizer_on_gpu:
                        self._actor_groups[other].offload_to_cpu()
                        self._gpu_state[other] = GPUState()

        kwargs = {"model_path": model_path}
        if num_training_steps is not None:
            kwargs["num_training_steps"] = num_training_steps

        ray.get(self._actor_groups[model].async_init_model(**kwargs))

        # After init, model is on GPU
        self._gpu_state[model].model_on_gpu = True
        self._gpu_state[model].optimizer_on_gpu = model != "ref"  # ref has no optimizer

    def set_inference_engine_client(self, inference_engine_client: "RemoteInferenceClient") -> None:
        """Set the inference engine client for weight sync.

        This can be called after construction if the client isn't available at init time.
        """
        self._inference_engine_client = inference_engine_client

    def empty_cache(self, model: Optional[str] = None) -> None:
        """Empty GPU cache for model(s)."""
        if model is not None:
            ray.get(self._actor_groups[model].async_run_ray_method("pass_through", "empty_cache"))
        else:
            refs = []
            for group in self._actor_groups.values():
                refs.extend(group.async_run_ray_method("pass_through", "empty_cache"))
            ray.get(refs)

    def get_node_ids(self) -> List[str]:
        """Get unique node IDs from all actor groups."""
        all_node_ids = []
        for group in self._actor_groups.values():
            node_ids = ray.get(group.async_run_ray_method("pass_through", "get_ray_node_id"))
            all_node_ids.extend(node_ids)
        return list(set(all_node_ids))

    # ----------------------------------
    # Weight sync methods
    # ----------------------------------

    def init_weight_sync_state(self, inference_engine_client) -> None:
        """Initialize weight sync state for policy model."""
        ray.get(
            self._actor_groups["policy"].async_run_ray_method(
                "pass_through",
                "init_weight_sync_state",
                inference_engine_client,
                self.cfg.generator.inference_engine,
            )
        )

    def _broadcast_to_inference_engines(self, inference_engine_client, model_id: Optional[str] = None) -> None:
        """Broadcast policy weights to inference engines. Helper for save_weights_for_sampler.

        ``model_id`` is forwarded to the worker so that, on the LoRA path, the
        adapter is saved into a per-tenant subdir of ``lora_sync_path`` and
        registered on vLLM under that name. None preserves single-tenant
        behavior (the legacy ``SKYRL_LORA_ADAPTER_NAME`` path).
        """
        ray.get(
            self._actor_groups["policy"].async_run_ray_method(
                "pass_through",
                "broadcast_to_inference_engines",
                inference_engine_client,
                self.cfg.generator.inference_engine,
                model_id=model_id,
            )
        )

    def _prepare_for_weight_sync(self) -> None:
        """Prepare for weight sync: ensure policy model is on GPU, offload optimizer. Helper for save_weights_for_sampler."""
        if not self.colocate_all:
            return
        # Ensure policy model is on GPU (will offload others in colocation group)
        self._ensure_on_gpu("policy", need_optimizer=False, need_model=True)
        # Offload optimizer if it's on GPU
        if self._gpu_state["policy"].optimizer_on_gpu:
            self._offload("policy", offload_optimizer=True, offload_model=False)

    def _finish_weight_sync(self) -> None:
        """Finish weight sync: offload model weights and optimizer state. Helper for save_weights_for_sampler."""
        if not self.colocate_all:
            return
        self._offload("policy", offload_optimizer=True, offload_model=True)

    async def save_weights_for_sampler(self, model_id: Optional[str] = None) -> None:
        """
        Tinker API method to prepare updated parameters for sampling.

        Syncs weights to inference engine for sampling. When ``model_id`` is
        provided we ensure the corresponding LoRA adapter is the live one
        before broadcasting, and tell the worker to register the adapter on
        vLLM under ``model_id``.
        """
        if self._inference_engine_client is None:
            raise RuntimeError(
                "Cannot save_weights_for_sampler: no inference_engine_client configured. "
                "Pass inference_engine_client to WorkerDispatch constructor or call set_inference_engine_client()."
            )

        # Sync weights to inference engine
        self._prepare_for_weight_sync()
        # Make the requested adapter live on every worker before broadcasting
        # — otherwise we'd export some other tenant's LoRA weights to vLLM.
        self.ensure_active_adapter("policy", model_id)
        if self.colocate_all:
            await self._inference_engine_client.wake_up(tags=["weights"])
            self._broadcast_to_inference_engines(self._inference_engine_client, model_id=model_id)
            self._finish_weight_sync()
            await self._inference_engine_client.wake_up(tags=["kv_cache"])
        else:
            strategy = self.cfg.trainer.strategy
            is_lora = self.cfg.trainer.policy.model.lora.rank > 0
            if is_lora and not (
                strategy == "megatron" and self.cfg.trainer.policy.megatron_config.lora_config.merge_lora
            ):
                # in-place lora case (mostly for multi-tenant training) - no need to pause - can just rely on load_lora_adapter to swap adapter in place
                self._broadcast_to_inference_engines(self._inference_engine_client, model_id=model_id)
                self._finish_weight_sync()
            else:
                # Non-colocated single tenant: pause generation to prevent in-flight requests from
                # reading partially-updated weights during the NCCL broadcast.
                await self._inference_engine_client.pause_generation()
                try:
                    self._broadcast_to_inference_engines(self._inference_engine_client, model_id=model_id)
                    self._finish_weight_sync()
                finally:
                    await self._inference_engine_client.resume_generation()

        # Advance the policy version so prefix-cache salting isolates blocks from the previous weights
        # (see `GeneratorConfig.use_cache_salt`).
        self._inference_engine_client.increment_weight_version()
