"""Engine settings shared by the PPO roles, typed: FSDP2 sharding, precision, the optimizer and
the checkpoint contents (verl's ``FSDPEngineConfig``, ``OptimizerConfig``, ``CheckpointConfig``).

Each role's section has exactly the keys of its part of the packaged ``ppo_trainer.yaml``: the
reference and the reward model are not trained, so their FSDP configs have no optimizer keys.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

__all__ = ["WrapPolicyConfig", "MixedPrecisionConfig", "TrainingMixedPrecisionConfig", "FSDPConfig",
           "RefFSDPConfig", "RewardModelFSDPConfig", "TrainingFSDPConfig", "OptimConfig", "CheckpointConfig"]


@dataclass
class WrapPolicyConfig:
    """``wrap_policy``: a transformer block is sharded on its own when it has >= ``min_num_params``."""

    min_num_params: int = 0


@dataclass
class MixedPrecisionConfig:
    """``param_dtype``: the forward's compute dtype (autocast): ``auto`` | ``bf16`` | ``fp32``."""

    param_dtype: str = "auto"


@dataclass
class TrainingMixedPrecisionConfig(MixedPrecisionConfig):
    """A trained role's precision: also the dtype gradients are reduced in across workers."""

    reduce_dtype: str = "fp32"
    buffer_dtype: str = "fp32"


@dataclass
class FSDPConfig:
    """``fsdp_config`` of a role: FSDP2 (``fully_shard``) over the workers; one worker keeps the
    whole model. ``model_dtype`` is the dtype of the weights, ``mixed_precision`` the forward's."""

    wrap_policy: WrapPolicyConfig = field(default_factory=WrapPolicyConfig)
    param_offload: bool = False
    reshard_after_forward: bool = True
    forward_prefetch: bool = False
    model_dtype: str = "fp32"
    mixed_precision: MixedPrecisionConfig = field(default_factory=MixedPrecisionConfig)


@dataclass
class RefFSDPConfig(FSDPConfig):
    """The reference policy's: a copy of the actor in the actor's dtypes, so KL compares like with like."""

    model_dtype: str = "${actor_rollout_ref.actor.fsdp_config.model_dtype}"
    mixed_precision: TrainingMixedPrecisionConfig = "${actor_rollout_ref.actor.fsdp_config.mixed_precision}"


@dataclass
class RewardModelFSDPConfig(FSDPConfig):
    """The reward model's: ``fsdp_size`` workers per shard group (-1: all)."""

    fsdp_size: int = -1


@dataclass
class TrainingFSDPConfig(FSDPConfig):
    """A trained role's (actor, critic): also where the optimizer state lives."""

    fsdp_size: int = -1
    optimizer_offload: bool = False
    offload_policy: bool = False
    mixed_precision: TrainingMixedPrecisionConfig = field(default_factory=TrainingMixedPrecisionConfig)


@dataclass
class OptimConfig:
    """``optim``: AdamW with a warmup of ``lr_warmup_steps`` (negative: ``lr_warmup_steps_ratio`` of
    the steps), then ``warmup_style`` ``constant`` or ``cosine`` (``num_cycles``, down to
    ``min_lr_ratio`` x lr). ``total_training_steps`` is filled in by the trainer."""

    lr: float = 1e-6
    lr_warmup_steps: int = -1
    lr_warmup_steps_ratio: float = 0.0
    min_lr_ratio: Optional[float] = 0.0
    num_cycles: float = 0.5
    warmup_style: str = "constant"
    total_training_steps: int = -1
    weight_decay: float = 0.01
    betas: List[float] = field(default_factory=lambda: [0.9, 0.999])


@dataclass
class CheckpointConfig:
    """``checkpoint``: verl's contents lists (model, optimizer and extra state are always saved here)."""

    save_contents: List[str] = field(default_factory=lambda: ["model", "optimizer", "extra"])
    load_contents: List[str] = "${.save_contents}"
