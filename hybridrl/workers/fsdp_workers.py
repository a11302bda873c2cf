"""The workers the driver talks to: their ``@register`` methods are the whole driver API.

``ActorRolloutRefWorker`` holds the policy (trained), its rollout engine and, when asked, the
frozen reference policy. ``CriticWorker`` holds the value model. Both run unchanged in the
local backend (world size 1) and are written against ``self.rank`` / ``self.world_size``.
``RewardModelWorker`` lives in :mod:`hybridrl.workers.reward_model` and is importable from here,
where verl users look for it.
"""

from __future__ import annotations

import functools
import logging
import time

import numpy as np

from hybridrl.agents.manager import AgentLoopManager
from hybridrl.config.batch_sizes import WorkerBatchSizes
from hybridrl.controller.decorator import Dispatch, register
from hybridrl.controller.worker import Worker
from hybridrl.models import load_causal_lm, load_tokenizer, load_value_model, resolve_model_path
from hybridrl.models.external import import_external_lib
from hybridrl.models.lora import AdapterDisabled, apply_lora, fill_saved_adapter, load_lora_adapter, lora_settings
from hybridrl.protocol import DataProto
from hybridrl.workers.actor import PPOActor
from hybridrl.workers.checkpoint_io import load_worker_state, save_worker_state
from hybridrl.workers.config.distillation import distillation_loss_config
from hybridrl.workers.critic import PPOCritic
from hybridrl.workers.engine_lock import EngineLock
from hybridrl.workers.memory import memory_metrics, release_cached_memory
from hybridrl.workers.optim import build_lr_scheduler, build_optimizer
from hybridrl.workers.pass_specs import critic_specs, policy_specs
from hybridrl.workers.perf_metrics import mfu_metrics
from hybridrl.workers.profiler import ProfiledWorker, role_profiler
from hybridrl.workers.reward_model import RewardModelWorker  # its home in verl: verl.workers.fsdp_workers
from hybridrl.workers.rollout.base import BaseRollout, get_rollout_cls, policy_weights
from hybridrl.workers.rollout.tp_group import RolloutTPGroup, TPFollowerRollout, check_tp_size
from hybridrl.workers.sharding import load_options, optimizer_on_device, sharder
from hybridrl.workers.stream_methods import StreamingMethods
from hybridrl.workers.teacher_worker import Teachers, teacher_pool_spec

logger = logging.getLogger(__name__)

__all__ = ["ActorRolloutRefWorker", "CriticWorker", "RewardModelWorker"]


class ActorRolloutRefWorker(StreamingMethods, ProfiledWorker, Worker):
    """Policy worker. ``role`` is ``actor_rollout``, ``actor_rollout_ref`` or ``ref``; ``actor`` and
    ``actor_ref`` leave the engine out (it runs in a rollout pool of its own, :mod:`.rollout_worker`).

    Args:
        config: the ``actor_rollout_ref`` section.
        batch_sizes: the actor's per-worker batch sizes, computed once by the driver
            (``hybridrl.config.worker_batch_sizes(config.actor, rollout.n, world_size)``); with
            the section they make the passes' specs (``self.specs``, built in ``init_model``).
        role: which of actor / rollout / reference this worker hosts.
        device: ``trainer.device`` (cpu | cuda | auto).
        distillation: the ``distillation`` section when ``distillation.enabled`` (the worker then
            hosts the teachers, :mod:`.teacher`, and the actor trains on the distillation loss).
        total_training_steps: the run's optimizer steps, the length of the actor's LR schedule
            (warmup ratio, cosine decay); computed by the driver.
    """

    def __init__(
        self,
        config,
        batch_sizes: WorkerBatchSizes,
        role: str = "actor_rollout_ref",
        device: str = "auto",
        total_training_steps: int = 1,
        distillation=None,
    ) -> None:
        if role not in ("actor_rollout", "actor_rollout_ref", "ref", "actor", "actor_ref"):
            raise ValueError(f"ActorRolloutRefWorker: unknown role {role!r}")
        super().__init__(config, device)
        self.batch_sizes = batch_sizes
        self.total_training_steps = total_training_steps
        self.role = role
        self.distillation = distillation
        self.teachers: Teachers | None = None  # the distillation teachers when they live here (init_model)
        self._is_actor = role != "ref"
        self._is_ref = role in ("ref", "actor_rollout_ref", "actor_ref")
        self._is_rollout = role.startswith("actor_rollout")
        hosted = ((self._is_actor, config.actor), (self._is_ref, config.ref), (self._is_rollout, config.rollout))
        self.profiler = role_profiler(role, [cfg.profiler for hosts, cfg in hosted if hosts], self.rank)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        """Builds this worker's roles, each sharded from its first byte: no rank ever holds a whole
        copy of the actor or the reference (:func:`hybridrl.models.load_causal_lm` with a ``shard``);
        the engine's own copy is filled from the actor one tensor at a time."""
        model_cfg = self.config.model
        import_external_lib(model_cfg.external_lib)
        self.model_path = resolve_model_path(model_cfg.path, config_key="actor_rollout_ref.model.path")
        self.tokenizer = load_tokenizer(
            self.model_path, trust_remote_code=model_cfg.trust_remote_code, chat_template=model_cfg.custom_chat_template
        )
        self.specs = policy_specs(self.config, self.batch_sizes, self.world_size)
        lora = lora_settings(model_cfg) if self._is_actor else None
        module = self._load_actor(lora) if self._is_actor else None
        if self._is_ref:
            # a LoRA actor's reference is the same weights with the adapter switched off: no second copy
            ref_module = AdapterDisabled(module) if lora else self._load_reference()
            self.ref_policy = PPOActor(self.config.ref, ref_module)
        if not self._is_actor:
            return
        optim = self.config.actor.optim
        self.actor_optimizer = build_optimizer(module, optim)
        self.actor_lr_scheduler = build_lr_scheduler(self.actor_optimizer, optim, self.total_training_steps)
        ref_module = self.ref_policy.actor_module if self._is_ref else None
        loss = distillation_loss_config(self.distillation.distillation_loss) if self.distillation else None
        self.actor = PPOActor(self.config.actor, module, self.actor_optimizer, ref_module=ref_module, distillation=loss)
        if self.distillation:
            self._load_teachers(module)
        self._start_engine_bookkeeping()
        if not self._is_rollout:
            return
        self._start_engine(module)
        self.agent_loop_manager = None  # multi-turn agent loops (hybridrl.agents)
        if self.config.rollout.multi_turn.enable:
            self._agent_loops(force=True)  # at start-up, so a bad tool/interaction file fails early

    def _start_engine(self, module) -> None:
        """The rollout engine: this worker's own, or with ``rollout.tensor_model_parallel_size`` T > 1
        one per T workers, held by the first of them (:mod:`~hybridrl.workers.rollout.tp_group`)."""
        rollout = self.config.rollout
        tp_size = int(rollout.tensor_model_parallel_size) if rollout.name == "vllm" else 1
        self.tp_group = RolloutTPGroup(tp_size, self.rank, self.world_size)
        base = module.get_base_model() if hasattr(module, "get_base_model") else module  # LoRA
        check_tp_size(tp_size, self.world_size, getattr(base.config, "num_attention_heads", None))
        self.rollout: BaseRollout
        if not self.tp_group.is_leader:
            self.rollout = TPFollowerRollout(module, rollout, self.tp_group)
            return
        rollout_cls = get_rollout_cls(rollout.name, rollout.mode, in_process_group=self.world_size > 1)
        group = {"tp_group": self.tp_group.group} if tp_size > 1 else {}  # the engine spans the group's GPUs
        generation_config = getattr(module, "generation_config", None)
        with self.tp_group.engine_devices():
            self.rollout = rollout_cls(module, rollout, self.tokenizer, generation_config, **group)

    def _model_options(self, fsdp_config, reduce_dtype: str = "fp32") -> dict:
        """``load_causal_lm`` options shared by the actor and the reference (:func:`load_options`)."""
        return load_options(self.config.model, self.device, self.world_size, fsdp_config, reduce_dtype)

    def _load_actor(self, lora: dict | None):
        """The trained policy: fp32 master weights (``fsdp_config.model_dtype``), LoRA adapters
        when ``lora_rank > 0`` (drawn from seed 0 on every rank), sharded when there are workers to
        shard over."""
        fsdp_config = self.config.actor.fsdp_config
        wrap = None
        if lora:
            adapter = load_lora_adapter if "adapter_path" in lora else apply_lora
            wrap = functools.partial(adapter, **lora, config_key="actor_rollout_ref.model")
        module = load_causal_lm(
            self.model_path,
            dtype=fsdp_config.model_dtype,
            wrap=wrap,
            enable_gradient_checkpointing=self.config.model.enable_gradient_checkpointing,
            **self._model_options(fsdp_config, fsdp_config.mixed_precision.reduce_dtype),
        )
        if lora and "adapter_path" in lora:  # the saved adapter's weights, once the model's exist
            fill_saved_adapter(module, lora["adapter_path"], "actor_rollout_ref.model")
        return module

    def _load_reference(self):
        """The frozen initial policy, in the dtype it computes in (``ref.fsdp_config.mixed_precision.
        param_dtype``: bf16 where the precision rule picks bf16, as verl keeps it), sharded like the actor."""
        fsdp_config = self.config.ref.fsdp_config
        module = load_causal_lm(
            self.model_path, dtype=fsdp_config.mixed_precision.param_dtype, **self._model_options(fsdp_config)
        )
        return module.requires_grad_(False)

    def _load_teachers(self, student) -> None:
        """The distillation teachers in this worker (:class:`~hybridrl.workers.teacher_worker.Teachers`),
        unless they run on a pool of their own (``distillation.nnodes`` > 0)."""
        if teacher_pool_spec(self.distillation):
            return
        vocab = int(student.config.vocab_size)
        self.teachers = Teachers(
            self.distillation, self.config, self.tokenizer, vocab, self.specs.ref_log_prob, self.device, self.world_size
        )

    def _start_engine_bookkeeping(self) -> None:
        """The engine lock and the policy versions (verl's ``param_version``): ``param_version``
        counts the actor updates applied to the actor's weights, ``rollout_param_version`` those
        in the engine's weights (they differ between an update and the next weight sync)."""
        self.engine_lock = EngineLock(float(self.config.rollout.engine_timeout_s))
        self.param_version = 0
        self.rollout_param_version = 0
        self.stream = None  # fully async training: the RolloutStream, made by the first stream_submit

    def _sync_engine(self) -> None:
        """Pushes the actor's weights into the engine, never during a generation (:class:`EngineLock`)."""
        with self.engine_lock.hold("a weight sync"):
            release_cached_memory(self.device)  # the trainer's cached blocks, for the engine that wakes
            self.rollout.sync_weights(self.actor.actor_module)
            self.rollout_param_version = self.param_version

    def _agent_loops(self, prompts: DataProto | None = None, force: bool = False):
        """The AgentLoopManager when multi_turn.enable is set or the rows have an agent_name; else None."""
        if self.agent_loop_manager is None and (force or "agent_name" in prompts.non_tensor_batch):
            self.agent_loop_manager = AgentLoopManager(self.rollout, self.tokenizer, self.config.rollout)
        return self.agent_loop_manager

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """Responses in the :class:`~hybridrl.workers.rollout.base.BaseRollout` layout, plus the
        non-tensor column ``param_version`` (int per row): the actor updates in the weights
        that generated the row. Waits for a weight sync in progress (:class:`EngineLock`).

        Raises:
            RolloutEngineError: the engine failed, or stayed busy past ``rollout.engine_timeout_s``.
        """
        prompts = prompts.to(self.device)
        with self.engine_lock.hold("a generation"):
            release_cached_memory(self.device)  # the trainer's cached blocks, for the engine that wakes
            version = self.rollout_param_version
            output = self.tp_group.run_on_leader(prompts, self._generate).to("cpu")
        output.non_tensor_batch["param_version"] = np.full(len(output), version, dtype=object)
        return output

    def _generate(self, prompts: DataProto) -> DataProto:
        return (self._agent_loops(prompts) or self.rollout).generate_sequences(prompts)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def sync_rollout_weights(self) -> int:
        """Brings the engine up to the actor's weights (nothing to do when it has them) and
        returns their ``param_version``. A collective for an FSDP-sharded actor. Waits for an
        in-flight generation to finish first (:class:`EngineLock`).

        Raises:
            RolloutEngineError: a generation held the engine past ``rollout.engine_timeout_s``.
        """
        if self.rollout_param_version != self.param_version:
            if self.stream is not None:  # partial rollouts: in-flight samples continue on the new weights
                self.stream.pause()
            self._sync_engine()
        if self.stream is not None and self.stream.paused:
            self.stream.resume(self.rollout_param_version)
        return self.param_version

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def engine_weights(self) -> tuple[dict | None, int]:
        """``(weights, param_version)`` for a rollout pool of its own: the weights an engine needs
        (``policy_weights``: gathered one at a time, a collective when sharded) on rank 0, None on
        the others. Rank 0 holds them all on the CPU: they cross to the pool in one Ray call."""
        weights = policy_weights(self.actor.actor_module)
        if self.rank != 0:
            for _ in weights:  # the other ranks take part in each gather
                pass
            return None, self.param_version
        return {name: tensor.cpu() for name, tensor in weights}, self.param_version

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_log_prob(self, data: DataProto) -> DataProto:
        """``old_log_probs`` and ``entropys`` ``(bs, response_length)``; with
        ``actor.calculate_sum_pi_squared`` also ``sum_pi_squared`` (the optimal token baseline's)."""
        data = data.to(self.device)
        log_probs, entropys, sum_pi_squared = self.actor.compute_log_prob(data, self.specs.log_prob)
        tensors = {"old_log_probs": log_probs, "entropys": entropys}
        if sum_pi_squared is not None:
            tensors["sum_pi_squared"] = sum_pi_squared
        return DataProto.from_dict(tensors=tensors).to("cpu")

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_ref_log_prob(self, data: DataProto, full_kl: bool = False) -> DataProto:
        """``ref_log_prob`` ``(bs, response_length)`` under the frozen initial policy.

        With ``full_kl`` (``algorithm.kl_penalty=full`` in the reward) also ``full_kl``, the exact
        per-token KL(actor || ref) over the vocabulary.
        """
        data = data.to(self.device)
        log_probs, _, _ = self.ref_policy.compute_log_prob(data, self.specs.ref_log_prob)
        tensors = {"ref_log_prob": log_probs}
        if full_kl:
            if not self._is_actor:
                raise RuntimeError("full_kl needs the actor and the reference in one worker (role actor_rollout_ref)")
            tensors["full_kl"] = self.actor.compute_full_kl(data, self.ref_policy.actor_module, self.specs.ref_log_prob)
        return DataProto.from_dict(tensors=tensors).to("cpu")

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_teacher_log_prob(self, data: DataProto) -> DataProto:
        """The teachers' scores of the responses (:meth:`~hybridrl.workers.teacher_worker.Teachers.score`):
        ``teacher_log_prob`` ``(bs, response_length)`` and, for a top-k loss, ``teacher_topk_log_probs``
        / ``teacher_topk_ids`` ``(bs, response_length, topk)``.

        Raises:
            ConfigError: a row whose ``distillation.teacher_key`` value is no teacher's key.
            RuntimeError: the teachers run on a pool of their own (ask that pool).
        """
        if self.teachers is None:
            raise RuntimeError("the distillation teachers run on a pool of their own (distillation.nnodes > 0)")
        return self.teachers.score(data.to(self.device))

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def update_actor(self, data: DataProto, on_policy: bool = False, sync_rollout_weights: bool = True) -> DataProto:
        """One PPO update on the batch.

        Args:
            data: the batch, with ``old_log_probs`` unless ``on_policy``.
            on_policy: the old-log-prob pass was skipped (the step plan's ``old_log_probs="update"``):
                the update's own detached log-probs are the old ones.
            sync_rollout_weights: the rollout engine gets the new weights after the update; False
                when the driver syncs them itself (one-step-off and fully asynchronous training).

        Returns the metrics in ``meta_info``; ``on_policy``: also ``old_log_probs``
        ``(bs, response_length)``, the update's own. The metrics include this process's memory
        (``perf/max_memory_allocated_gb`` ..., GiB: :func:`~hybridrl.workers.memory.memory_metrics`)
        and, where the device has a promised peak, ``perf/mfu/actor`` (:func:`mfu_metrics`)."""
        data = data.to(self.device)
        offload = self.config.actor.fsdp_config.optimizer_offload
        with optimizer_on_device(self.actor_optimizer, self.device, offload):
            start = time.perf_counter()
            policy_metrics, own_log_probs = self.actor.update_policy(data, self.specs.update, on_policy=on_policy)
            mfu = mfu_metrics(
                "actor", self.actor.actor_module, data.batch, start, self.device, self.specs.update.ppo_epochs
            )
        metrics: dict[str, list[float] | float] = dict(policy_metrics)  # + the memory's floats
        metrics.update(mfu)  # verl's perf/mfu/actor, where the device has a promised peak
        metrics["actor/lr"] = [self.actor_lr_scheduler.get_last_lr()[0]]
        self.actor_lr_scheduler.step()
        self.param_version += 1
        if self._is_rollout and sync_rollout_weights:
            self._sync_engine()
        metrics.update(memory_metrics(self.device))  # after the sync: verl's perf/max_memory_*_gb (driver: max)
        tensors = {"old_log_probs": own_log_probs.cpu()} if own_log_probs is not None else None
        return DataProto.from_dict(tensors=tensors, meta_info={"metrics": metrics})

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, local_path: str, global_step: int) -> None:
        save_worker_state(
            local_path,
            self.actor.actor_module,
            self.actor_optimizer,
            self.actor_lr_scheduler,
            self.rank,
            self.world_size,
            tokenizer=self.tokenizer,
            worker_state={"param_version": self.param_version},
        )

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, local_path: str) -> None:
        state = load_worker_state(
            local_path,
            self.actor.actor_module,
            self.actor_optimizer,
            self.actor_lr_scheduler,
            self.rank,
            self.world_size,
        )
        self.param_version = int(state.get("param_version", self.param_version))
        if self._is_rollout:
            self._sync_engine()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def get_memory_metrics(self) -> dict[str, float]:
        """This process's memory in GiB (:func:`~hybridrl.workers.memory.memory_metrics`), for a step
        without an actor update (``trainer.critic_warmup``)."""
        return memory_metrics(self.device)


class CriticWorker(ProfiledWorker, Worker):
    """Value-model worker. ``config`` is the ``critic`` section; ``batch_sizes`` its per-worker
    batch sizes, computed once by the driver (``hybridrl.config.worker_batch_sizes``), which with
    the section make the passes' specs (``self.specs``, built in ``init_model``);
    ``total_training_steps`` the length of its LR schedule (the run's optimizer steps)."""

    def __init__(
        self, config, batch_sizes: WorkerBatchSizes, device: str = "auto", total_training_steps: int = 1
    ) -> None:
        super().__init__(config, device)
        self.batch_sizes = batch_sizes
        self.total_training_steps = total_training_steps
        self.profiler = role_profiler("critic", [config.profiler], self.rank)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        model_cfg = self.config.model
        import_external_lib(model_cfg.external_lib)
        path = resolve_model_path(model_cfg.path, config_key="critic.model.path")
        fsdp_config = model_cfg.fsdp_config
        lora = lora_settings(model_cfg)
        wrap = None
        if lora:  # adapters on the backbone; the value head is trained whole (peft's TOKEN_CLS)
            wrap = functools.partial(apply_lora, **lora, task_type="TOKEN_CLS", config_key="critic.model")
        shard = sharder(self.world_size, self.device, fsdp_config, fsdp_config.mixed_precision.reduce_dtype)
        module = load_value_model(
            path,
            dtype=fsdp_config.model_dtype,
            trust_remote_code=model_cfg.trust_remote_code,
            override_config=model_cfg.override_config,
            device=self.device,
            wrap=wrap,
            shard=shard,
            enable_gradient_checkpointing=model_cfg.enable_gradient_checkpointing,
        )
        self.specs = critic_specs(self.config, self.batch_sizes)
        self.critic_optimizer = build_optimizer(module, self.config.optim)
        self.critic_lr_scheduler = build_lr_scheduler(
            self.critic_optimizer, self.config.optim, self.total_training_steps
        )
        self.critic = PPOCritic(self.config, module, self.critic_optimizer)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_values(self, data: DataProto) -> DataProto:
        """``values`` ``(bs, response_length)`` fp32, zero outside ``response_mask``."""
        values = self.critic.compute_values(data.to(self.device), self.specs.values)
        return DataProto.from_dict(tensors={"values": values}).to("cpu")

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def update_critic(self, data: DataProto) -> DataProto:
        offload = self.config.model.fsdp_config.optimizer_offload
        data = data.to(self.device)
        with optimizer_on_device(self.critic_optimizer, self.device, offload):
            start = time.perf_counter()
            metrics = self.critic.update_critic(data, self.specs.update)
            module, epochs = self.critic.critic_module, self.specs.update.ppo_epochs
            metrics.update(mfu_metrics("critic", module, data.batch, start, self.device, epochs, lm_head=False))
        metrics["critic/lr"] = [self.critic_lr_scheduler.get_last_lr()[0]]
        metrics.update(memory_metrics(self.device))  # verl's perf/max_memory_*_gb (driver: max)
        self.critic_lr_scheduler.step()
        return DataProto(meta_info={"metrics": metrics})

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, local_path: str, global_step: int) -> None:
        save_worker_state(
            local_path,
            self.critic.critic_module,
            self.critic_optimizer,
            self.critic_lr_scheduler,
            self.rank,
            self.world_size,
        )

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, local_path: str) -> None:
        load_worker_state(
            local_path,
            self.critic.critic_module,
            self.critic_optimizer,
            self.critic_lr_scheduler,
            self.rank,
            self.world_size,
        )
