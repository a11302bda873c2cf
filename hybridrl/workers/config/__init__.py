"""The PPO roles' config sections as dataclasses (verl's ``verl.workers.config``); the whole
config is :class:`hybridrl.trainer.ppo.config.PPOConfig`."""

from .actor import ActorConfig, ActorRolloutRefConfig, PolicyLossConfig, RefConfig
from .critic import CriticConfig
from .fsdp import CheckpointConfig, FSDPConfig, MixedPrecisionConfig, OptimConfig, TrainingFSDPConfig
from .model import CriticModelConfig, PolicyModelConfig, RewardModelModelConfig
from .reward_model import RewardModelConfig
from .rollout import EngineConfig, RolloutConfig, SamplingConfig

__all__ = [
    "ActorConfig",
    "ActorRolloutRefConfig",
    "PolicyLossConfig",
    "RefConfig",
    "CriticConfig",
    "CheckpointConfig",
    "FSDPConfig",
    "MixedPrecisionConfig",
    "OptimConfig",
    "TrainingFSDPConfig",
    "CriticModelConfig",
    "PolicyModelConfig",
    "RewardModelModelConfig",
    "RewardModelConfig",
    "EngineConfig",
    "RolloutConfig",
    "SamplingConfig",
]
