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

__all__ = ["RewardModelConfig", "ON_ERROR", "REWARD_LOOP_MICRO_BATCH", "resolve_reward_loop_micro_batch"]

ON_ERROR = ("raise", "zero", "mask_sample", "drop_group", "retry")  # what a failed scoring call does

# responses per reward-model forward on each worker when verl's command turns on its reward loop
# (use_reward_loop=true, whose server batches by itself) and sets no micro batch
REWARD_LOOP_MICRO_BATCH = 8

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


def resolve_reward_loop_micro_batch(reward_model) -> str | None:
    """Sets ``reward_model.micro_batch_size_per_gpu`` (the merged section, before its rules run) where
    verl needs none: ``enable=true use_reward_loop=true`` with neither micro batch key set and no
    ``use_dynamic_bsz`` (verl's ``validate_config`` skips the micro-batch rule for its reward loop,
    whose vLLM server batches the scoring requests itself). This build scores with the reward-model
    worker, :data:`REWARD_LOOP_MICRO_BATCH` responses per forward (each response is scored alone,
    so the scores do not depend on it). Returns the start-up note, or None when nothing was set."""
    if not (reward_model.enable and reward_model.use_reward_loop) or reward_model.use_dynamic_bsz:
        return None
    if reward_model.micro_batch_size is not None or reward_model.micro_batch_size_per_gpu is not None:
        return None
    reward_model.micro_batch_size_per_gpu = REWARD_LOOP_MICRO_BATCH
    return (
        f"reward_model.use_reward_loop=true without a micro batch: verl's reward-loop server batches the "
        f"scoring itself; here the reward-model worker scores {REWARD_LOOP_MICRO_BATCH} responses per forward "
        "(same scores; reward_model.micro_batch_size_per_gpu sets it)"
    )
