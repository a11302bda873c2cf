"""The ``reward_model`` section of the PPO config, typed: the reward model or LLM judge, the
reward manager and how scoring fails (verl's ``RewardModelConfig`` plus hybridrl's scoring keys).
Defaults are the packaged ``ppo_trainer.yaml``'s; docs/rewards.md and docs/rlhf.md explain them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Optional

from hybridrl.config.rules import at_least, one_of
from hybridrl.config.typed import ignored
from hybridrl.errors import ConfigError
from hybridrl.rewards.config import JudgeConfig, OverlongBufferConfig, SandboxConfig, SandboxFusionConfig

from .actor import FSDP_EITHER
from .model import RewardModelModelConfig
from .profiler import ProfilerConfig, check_profiler, reward_model_profiler
from .rollout import EngineConfig

__all__ = ["RewardModelConfig", "ON_ERROR"]

ON_ERROR = ("raise", "zero", "mask_sample", "drop_group", "retry")  # what a failed scoring call does

# verl's reward model has the key too; its forwards score short (prompt, response) pairs once per step
NO_SEQUENCE_PARALLEL = (
    "the reward model scores whole sequences on each worker; sequence parallelism splits "
    "the actor, reference and critic only"
)


@dataclass
class RewardModelConfig:
    """``reward_model``: ``enable`` a trained reward model (``model``, micro batches of responses
    per worker, ``max_length`` tokens), the ``reward_manager`` that scores, its failure policy
    (``on_error``, ``retries``, ``timeout_s`` seconds per scoring call) and the scoring processes
    (``num_workers``)."""

    enable: bool = False
    nccl_timeout: float = 600  # as actor_rollout_ref.nccl_timeout
    strategy: str = ignored("fsdp", FSDP_EITHER)
    model: RewardModelModelConfig = field(default_factory=RewardModelModelConfig)
    micro_batch_size: Optional[int] = None
    micro_batch_size_per_gpu: Optional[int] = None
    max_length: Optional[int] = None
    ulysses_sequence_parallel_size: int = ignored(1, NO_SEQUENCE_PARALLEL)
    use_dynamic_bsz: bool = ignored(
        "${critic.use_dynamic_bsz}",
        "not in this build yet (same results, only slower) for the reward model; its micro batches count rows",
    )
    forward_max_token_len_per_gpu: int = ignored(
        "${critic.forward_max_token_len_per_gpu}",
        "read only with reward_model.use_dynamic_bsz, which is not in this build yet",
    )
    reward_manager: str = "naive"
    overlong_buffer: OverlongBufferConfig = field(default_factory=OverlongBufferConfig)
    launch_reward_fn_async: bool = False
    reward_kwargs: Dict[str, Any] = field(default_factory=dict)
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    sandbox_fusion: SandboxFusionConfig = field(default_factory=SandboxFusionConfig)
    on_error: str = "raise"
    retries: int = 2
    timeout_s: float = 60
    use_reward_loop: bool = ignored(
        False, "the manager named in reward_model.reward_manager scores (judge: a generative reward model)"
    )
    rollout: EngineConfig = field(default_factory=EngineConfig)
    judge: JudgeConfig = field(default_factory=JudgeConfig)
    num_workers: Optional[int] = None
    profiler: ProfilerConfig = field(default_factory=reward_model_profiler)

    def __post_init__(self):
        one_of("reward_model.on_error", self.on_error, ON_ERROR)
        check_profiler("reward_model.profiler", self.profiler)
        if self.enable and self.max_length is not None:
            at_least("reward_model.max_length", self.max_length, 2)
        if self.overlong_buffer.enable and self.reward_manager != "dapo":
            raise ConfigError(
                "reward_model.overlong_buffer.enable=true is DAPO's shaping; set reward_model.reward_manager=dapo"
            )
