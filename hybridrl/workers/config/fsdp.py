"""Engine settings shared by the PPO roles, typed: FSDP2 sharding, precision, the optimizer and
the checkpoint contents (verl's ``FSDPEngineConfig``, ``OptimizerConfig``, ``CheckpointConfig``).

Each role's section has exactly the keys of its part of the packaged ``ppo_trainer.yaml``: the
reference and the reward model are not trained, so their FSDP configs have no optimizer keys.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

from hybridrl.config.rules import one_of
from hybridrl.config.typed import ignored
from hybridrl.errors import ConfigError

_FSDP_SINGLE = "FSDP sharding needs more than one worker; a single worker keeps the whole model"
_OFFLOAD_CPU = "offload moves state from an accelerator to host memory; on the CPU it lives there already"
SCHEDULES = ("constant", "cosine")
_ALWAYS_SAVED = "checkpoints always hold model, optimizer and extra state (no HF-format copy)"

__all__ = [
    "WrapPolicyConfig",
    "MixedPrecisionConfig",
    "TrainingMixedPrecisionConfig",
    "FSDPConfig",
    "RefFSDPConfig",
    "TrainingFSDPConfig",
    "OptimConfig",
    "CheckpointConfig",
]


@dataclass
class WrapPolicyConfig:
    """``wrap_policy``: a transformer block is sharded on its own when it has >= ``min_num_params``."""

    min_num_params: int = ignored(0, "every decoder block (the model's _no_split_modules) is one FSDP unit")


@dataclass
class MixedPrecisionConfig:
    """``param_dtype``: the forward's compute dtype (autocast): ``auto`` | ``bf16`` | ``fp32``."""

    param_dtype: str = "auto"


@dataclass
class TrainingMixedPrecisionConfig(MixedPrecisionConfig):
    """A trained role's precision: also the dtype gradients are reduced in across workers."""

    reduce_dtype: str = ignored("fp32", "one worker has no gradient all-reduce", "single")
    buffer_dtype: str = ignored("fp32", "buffers stay in fsdp_config.model_dtype")


@dataclass
class FSDPConfig:
    """``fsdp_config`` of a role (the reward model's as it is): FSDP2 (``fully_shard``) over the
    workers, ``fsdp_size`` per shard group (-1: all); one worker keeps the whole model.
    ``model_dtype`` is the dtype of the weights, ``mixed_precision`` the forward's."""

    wrap_policy: WrapPolicyConfig = field(default_factory=WrapPolicyConfig)
    fsdp_size: int = ignored(-1, _FSDP_SINGLE, "single")
    param_offload: bool = ignored(False, _OFFLOAD_CPU, "cpu")
    offload_policy: bool = ignored(
        False, _OFFLOAD_CPU, "cpu"
    )  # verl's FSDP2 switch: CPUOffloadPolicy, as param_offload
    use_orig_params: bool = ignored(False, "an FSDP1 key; FSDP2 always keeps the original parameters")
    reshard_after_forward: bool = ignored(True, _FSDP_SINGLE, "single")
    forward_prefetch: bool = ignored(False, "FSDP2 prefetches with its default schedule")
    model_dtype: str = "fp32"
    mixed_precision: MixedPrecisionConfig = field(default_factory=MixedPrecisionConfig)


@dataclass
class RoleEngineKeys:
    """verl's engine config spells two of the role's keys inside ``fsdp_config`` too; the run reads
    the role's (``<role>.entropy_checkpointing``, ``<role>.ulysses_sequence_parallel_size``), and
    :func:`hybridrl.config.rules.two_spellings` makes one value win."""

    entropy_checkpointing: bool = False
    ulysses_sequence_parallel_size: int = 1


@dataclass
class RefFSDPConfig(RoleEngineKeys, FSDPConfig):
    """The reference policy's: the initial actor, frozen, held in the dtype it computes in
    (``mixed_precision.param_dtype``, the actor's: bf16 where the precision rule picks it, as verl)."""

    model_dtype: str = ignored(
        "${actor_rollout_ref.actor.fsdp_config.model_dtype}",
        "the reference is held in its compute dtype, ref.fsdp_config.mixed_precision.param_dtype",
    )
    mixed_precision: TrainingMixedPrecisionConfig = "${actor_rollout_ref.actor.fsdp_config.mixed_precision}"


@dataclass
class TrainingFSDPConfig(RoleEngineKeys, FSDPConfig):
    """A trained role's (actor, critic): also where the optimizer state lives."""

    optimizer_offload: bool = ignored(False, _OFFLOAD_CPU, "cpu")
    mixed_precision: TrainingMixedPrecisionConfig = field(default_factory=TrainingMixedPrecisionConfig)


@dataclass
class OptimConfig:
    """``optim``: AdamW with a warmup of ``lr_warmup_steps`` (negative: ``lr_warmup_steps_ratio`` of
    the steps), then ``warmup_style`` ``constant`` or ``cosine`` (``num_cycles``, down to
    ``min_lr_ratio`` x lr) over the run's steps (the workers get them from the driver)."""

    lr: float = 1e-6
    lr_warmup_steps: int = -1
    lr_warmup_steps_ratio: float = 0.0
    min_lr_ratio: Optional[float] = 0.0
    min_lr: float = 0.0
    num_cycles: float = 0.5
    lr_scheduler_type: str = "constant"
    warmup_style: Optional[str] = None
    lr_decay_steps: Optional[int] = None
    total_training_steps: int = ignored(
        -1, "the schedule runs over the run's steps (trainer.total_training_steps, or total_epochs x batches per epoch)"
    )
    weight_decay: float = 0.01
    betas: List[float] = field(default_factory=lambda: [0.9, 0.999])
    clip_grad: float = 1.0
    zero_indexed_step: bool = True

    def __post_init__(self) -> None:
        one_of("optim.lr_scheduler_type", self.lr_scheduler_type, SCHEDULES)
        if self.warmup_style is not None:
            if self.lr_scheduler_type not in ("constant", self.warmup_style):
                raise ConfigError(
                    f"optim.warmup_style={self.warmup_style} and optim.lr_scheduler_type={self.lr_scheduler_type}: "
                    "verl's two names of the schedule given two values; set only optim.lr_scheduler_type"
                )
        if self.lr_decay_steps is not None and self.lr_decay_steps < 1:
            raise ConfigError(f"optim.lr_decay_steps={self.lr_decay_steps} must be >= 1 (null: the run's steps)")
        if self.min_lr < 0:
            raise ConfigError(f"optim.min_lr={self.min_lr} must be >= 0")
        if self.min_lr and self.min_lr_ratio and abs(self.min_lr_ratio * self.lr - self.min_lr) > 1e-12 * self.lr:
            raise ConfigError(
                f"optim.min_lr={self.min_lr} and optim.min_lr_ratio={self.min_lr_ratio} (lr {self.lr}) ask for two "
                "floors; set one"
            )


@dataclass
class CheckpointConfig:
    """``checkpoint``: verl's contents lists (model, optimizer and extra state are always saved here)."""

    save_contents: List[str] = ignored(reason=_ALWAYS_SAVED, factory=lambda: ["model", "optimizer", "extra"])
    load_contents: List[str] = ignored("${.save_contents}", _ALWAYS_SAVED)


def cpu_offload(fsdp_config) -> bool:
    """FSDP2's CPUOffloadPolicy for a role's ``fsdp_config``: ``param_offload`` or verl's FSDP2 ``offload_policy``."""
    return bool(fsdp_config.param_offload or fsdp_config.offload_policy)


def schedule_name(optim) -> str:
    """The LR schedule of an ``optim`` section: ``warmup_style`` when set (verl's older key), else
    ``lr_scheduler_type``."""
    return optim.warmup_style or optim.lr_scheduler_type


def floor_ratio(optim) -> float:
    """The cosine floor of an ``optim`` section as a share of ``lr``: ``min_lr / lr`` when ``min_lr``
    (Megatron's key) is set, else ``min_lr_ratio`` (null: 0)."""
    return optim.min_lr / optim.lr if optim.min_lr else float(optim.min_lr_ratio or 0.0)
