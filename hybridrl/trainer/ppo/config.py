"""The whole ``ppo_trainer`` config, typed: :class:`PPOConfig` nests the section dataclasses each
component owns (``data``, ``actor_rollout_ref``, ``critic``, ``reward_model``, ``algorithm``, ...)
with the ``trainer`` section and the small top-level ones defined here.

:func:`ppo_config` builds it once at start-up from the composed YAML: a key without a field, or a
value of the wrong type, stops the run with one line naming the key. The run then reads the typed
fields of :func:`typed_ppo_config` -- every key present, typed, defaults equal to
the packaged YAML (tests/config/test_ppo_config.py keeps them equal, key for key). Rules across
sections and against the registries are :func:`hybridrl.trainer.ppo.config_check.validate_ppo_config`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Dict, Optional

from hybridrl.agents.config import RetrieverConfig
from hybridrl.algorithms.config import AlgoConfig
from hybridrl.config.rules import at_least, one_of, two_spellings
from hybridrl.config.typed import ignored, to_dataclass, to_structured
from hybridrl.data.config import DataConfig
from hybridrl.errors import ConfigError
from hybridrl.rewards.config import CustomRewardFunctionConfig, RewardConfig
from hybridrl.workers.config import ActorRolloutRefConfig, CriticConfig, RewardModelConfig
from hybridrl.workers.config.distillation import DistillationConfig
from hybridrl.workers.config.profiler import GlobalProfilerConfig
from hybridrl.workers.config.reward_model import resolve_reward_loop_micro_batch
from hybridrl.workers.config.rollout import resolve_rollout_mode

logger = logging.getLogger(__name__)

__all__ = ["PPOConfig", "PPOTrainerConfig", "ppo_config", "typed_ppo_config", "TRAINER_MODES"]

TRAINER_MODES = ("sync", "colocate_async", "separate_async")


@dataclass
class SamplerConfig:
    """``trainer.v1.sampler``: the oldest age (policy versions behind + 1) a trained group may have,
    and what to do with an older one (``drop`` | ``wait``)."""

    max_off_policy_threshold: int = 8
    max_off_policy_strategy: str = "drop"

    def validate(self) -> None:
        """The rules of a fully asynchronous run (the sampler means nothing in ``sync`` mode).

        Raises:
            ConfigError: a threshold below 1 or a strategy other than ``drop`` / ``wait``.
        """
        key = "trainer.v1.sampler"
        if self.max_off_policy_threshold < 1:
            raise ConfigError(
                f"{key}.max_off_policy_threshold={self.max_off_policy_threshold!r} must be an integer >= 1: the "
                "oldest age (policy versions behind, plus 1) a trained prompt group may have; 1 trains only groups "
                "started by the current weights"
            )
        if self.max_off_policy_strategy not in ("drop", "wait"):
            raise ConfigError(f"{key}.max_off_policy_strategy={self.max_off_policy_strategy!r} must be drop or wait")


@dataclass
class ColocateAsyncConfig:
    num_warmup_batches: int = 1


@dataclass
class SeparateAsyncConfig:
    num_warmup_batches: int = 1
    parameter_sync_step: Optional[int] = None


@dataclass
class V1Config:
    """``trainer.v1``: ``trainer_mode`` ``sync`` | ``colocate_async`` | ``separate_async`` (docs/async.md)."""

    trainer_mode: str = "sync"
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    colocate_async: ColocateAsyncConfig = field(default_factory=ColocateAsyncConfig)
    separate_async: SeparateAsyncConfig = field(default_factory=SeparateAsyncConfig)

    def __post_init__(self):
        mode = self.trainer_mode
        if mode not in TRAINER_MODES:
            raise ConfigError(f"trainer.v1.trainer_mode={mode!r} must be one of {', '.join(TRAINER_MODES)}")

    def validate(self) -> None:
        """The rules of the asynchronous ``trainer_mode``: the sampler's and ``num_warmup_batches``.

        Raises:
            ConfigError: as :meth:`SamplerConfig.validate`; a negative ``num_warmup_batches``.
        """
        SamplerConfig.validate(self.sampler)
        mode = self.trainer_mode
        warmup = getattr(self, mode).num_warmup_batches
        if warmup < 0:
            raise ConfigError(
                f"trainer.v1.{mode}.num_warmup_batches={warmup!r} must be an integer >= 0: dataloader "
                "batches kept in flight beyond the step's"
            )


@dataclass
class PPOTrainerConfig:
    """``trainer``: the run's length, where it runs (``nnodes`` x ``n_gpus_per_node`` workers),
    validation, logging and checkpoints. Frequencies count steps (-1: never); ``dist_timeout_s`` in
    seconds."""

    device: str = "auto"
    backend: str = "auto"
    balance_batch: bool = ignored(True, "one worker has nothing to balance", "single")
    total_epochs: int = 30
    total_training_steps: Optional[int] = None
    profile_steps: Any = ignored(None, "no profiler integration")
    project_name: str = "hybridrl"
    experiment_name: str = "gsm8k"
    logger: Any = field(default_factory=lambda: ["console", "file"])
    log_val_generations: int = 0
    rollout_data_dir: Optional[str] = None
    validation_data_dir: Optional[str] = None
    nnodes: int = 1
    n_gpus_per_node: int = 1
    cpu_threads_per_worker: int = 1
    cpu_malloc_reuse: bool = True
    dist_timeout_s: float = 600
    save_freq: int = -1
    esi_redundant_time: float = ignored(0, "no elastic-instance deadline")
    resume_mode: str = "auto"
    resume_from_path: Optional[str] = None
    val_before_train: bool = True
    val_only: bool = False
    test_freq: int = -1
    critic_warmup: int = 0
    one_step_off_policy: bool = False
    default_hdfs_dir: Optional[str] = ignored(None, "checkpoints are written to trainer.default_local_dir only")
    del_local_ckpt_after_load: bool = ignored(False, "the loaded checkpoint is kept")
    default_local_dir: str = "checkpoints/${trainer.project_name}/${trainer.experiment_name}"
    max_actor_ckpt_to_keep: Optional[int] = None
    max_critic_ckpt_to_keep: Optional[int] = ignored(
        None, "actor and critic share one step folder; trainer.max_actor_ckpt_to_keep governs both"
    )
    use_v1: bool = ignored(True, "hybridrl has one trainer; its loop is verl's v1 trainer_mode=sync")
    v1: V1Config = field(default_factory=V1Config)
    ray_wait_register_center_timeout: float = ignored(
        300, "workers are ready when their constructor returns (no register center)"
    )

    def __post_init__(self):
        one_of("trainer.device", self.device, ("cpu", "cuda", "auto"))
        one_of("trainer.backend", self.backend, ("local", "ray", "auto"))
        one_of("trainer.resume_mode", self.resume_mode, ("auto", "disable", "resume_path"))
        at_least("trainer.critic_warmup", self.critic_warmup, 0)
        # how long the run trains: a typo fails now, and a run that would train nothing
        # (total_epochs=0, total_training_steps=-1) does not exit 0 having done nothing
        at_least("trainer.total_epochs", self.total_epochs, 1)
        if self.total_training_steps is not None:
            at_least(
                "trainer.total_training_steps",
                self.total_training_steps,
                1,
                hint="or null (total_epochs x batches per epoch)",
            )
        if self.resume_mode == "resume_path" and not self.resume_from_path:
            raise ConfigError(
                "trainer.resume_mode=resume_path needs trainer.resume_from_path; "
                "set it to a global_step_* folder or use trainer.resume_mode=auto"
            )


@dataclass
class RayInitConfig:
    """``ray_init`` (verl 0.4): ``num_cpus`` for ``ray.init`` (null: all)."""

    num_cpus: Optional[int] = None
    timeline_json_file: Optional[str] = ignored(None, "no Ray timeline dump")


@dataclass
class RayKwargsConfig:
    """``ray_kwargs`` (verl 0.5): ``ray_init`` is passed to ``ray.init`` as it is."""

    ray_init: Dict[str, Any] = field(default_factory=lambda: {"num_cpus": None, "runtime_env": {"py_executable": None}})
    timeline_json_file: Optional[str] = None


@dataclass
class TransferQueueConfig:
    enable: bool = ignored(False, "batches move between the driver and the workers directly")


@dataclass
class PPOConfig:
    """The whole ``ppo_trainer`` config (``hybridrl/config/ppo_trainer.yaml``)."""

    data: DataConfig = field(default_factory=DataConfig)
    actor_rollout_ref: ActorRolloutRefConfig = field(default_factory=ActorRolloutRefConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    reward_model: RewardModelConfig = field(default_factory=RewardModelConfig)
    custom_reward_function: CustomRewardFunctionConfig = field(default_factory=CustomRewardFunctionConfig)
    algorithm: AlgoConfig = field(default_factory=AlgoConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    trainer: PPOTrainerConfig = field(default_factory=PPOTrainerConfig)
    retriever: RetrieverConfig = field(default_factory=RetrieverConfig)
    ray_init: RayInitConfig = field(default_factory=RayInitConfig)
    ray_kwargs: RayKwargsConfig = field(default_factory=RayKwargsConfig)
    distillation: DistillationConfig = field(default_factory=DistillationConfig)
    transfer_queue: TransferQueueConfig = field(default_factory=TransferQueueConfig)
    global_profiler: GlobalProfilerConfig = field(default_factory=GlobalProfilerConfig)


def ppo_config(config) -> PPOConfig:
    """The composed ``ppo_trainer`` config (interpolations resolved) as a :class:`PPOConfig`.

    Raises:
        ConfigError: a key without a field, or a value of the wrong type (one line naming the key).
        AlgorithmConfigError, UnknownAlgorithmError: a rule of the ``algorithm`` section.
    """
    return to_dataclass(PPOConfig, config, "", prepare=prepare_ppo_config)


def prepare_ppo_config(config) -> None:
    """What typing does to the merged config before the section rules run: verl's two spellings made
    one (:func:`merge_verl_spellings`), and ``actor_rollout_ref.rollout.mode`` chosen where verl's
    command leaves it to a default (:func:`~hybridrl.workers.config.rollout.resolve_rollout_mode`;
    the choice is noted once in the log), and the reward model's micro batch under verl's reward loop
    (:func:`~hybridrl.workers.config.reward_model.resolve_reward_loop_micro_batch`)."""
    merge_verl_spellings(config)
    trainer = config.trainer
    world_size = int(trainer.nnodes) * int(trainer.n_gpus_per_node)
    for note in (
        resolve_rollout_mode(config.actor_rollout_ref.rollout, world_size),
        resolve_reward_loop_micro_batch(config.reward_model),
    ):
        if note is not None:
            logger.warning("%s", note)


def merge_verl_spellings(config) -> None:
    """verl's second spelling of a role key (``optim.clip_grad`` of ``grad_clip``, ``fsdp_config.*``
    of the role's ``entropy_checkpointing`` / ``ulysses_sequence_parallel_size``, the rollout's
    ``checkpoint_engine.update_weights_bucket_megabytes``): the one set wins.

    Raises:
        ConfigError: both spellings set to different values.
    """
    policy, critic, sp = config.actor_rollout_ref, config.critic, "ulysses_sequence_parallel_size"
    for key, role in (("actor_rollout_ref.actor", policy.actor), ("critic", critic)):
        role.grad_clip = two_spellings(
            f"{key}.grad_clip", role.grad_clip, 1.0, f"{key}.optim.clip_grad", role.optim.clip_grad, 1.0
        )
    rollout, key = policy.rollout, "actor_rollout_ref.rollout"
    bucket = two_spellings(
        f"{key}.update_weights_bucket_megabytes",
        rollout.update_weights_bucket_megabytes,
        None,
        f"{key}.checkpoint_engine.update_weights_bucket_megabytes",
        rollout.checkpoint_engine.update_weights_bucket_megabytes,
        2048,
    )
    if bucket is not None:
        rollout.checkpoint_engine.update_weights_bucket_megabytes = bucket
    before = getattr(policy.actor, sp)
    for key, role in (("actor_rollout_ref.actor", policy.actor), ("actor_rollout_ref.ref", policy.ref)):
        for name, default in (("entropy_checkpointing", False), (sp, 1)):
            value = two_spellings(
                f"{key}.{name}",
                getattr(role, name),
                default,
                f"{key}.fsdp_config.{name}",
                getattr(role.fsdp_config, name),
                default,
            )
            setattr(role, name, value)
    if getattr(policy.actor, sp) != before and getattr(policy.ref, sp) == before:
        setattr(policy.ref, sp, getattr(policy.actor, sp))  # the reference follows the actor, as its default does
    critic.ulysses_sequence_parallel_size = two_spellings(
        f"critic.{sp}",
        critic.ulysses_sequence_parallel_size,
        1,
        f"critic.model.fsdp_config.{sp}",
        critic.model.fsdp_config.ulysses_sequence_parallel_size,
        1,
    )


def typed_ppo_config(config):
    """``config`` as the run reads it: a structured DictConfig of :class:`PPOConfig` (every key
    present and typed; assigning a value of the wrong type or a new key raises). Raises as
    :func:`ppo_config`."""
    from omegaconf import OmegaConf

    if OmegaConf.is_config(config) and OmegaConf.get_type(config) is PPOConfig:
        return config  # typed already (the run types once, then checks)
    return to_structured(PPOConfig, config, "", prepare=prepare_ppo_config)
