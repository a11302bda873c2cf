"""The reward settings of the PPO config, typed: the scoring parts of ``reward_model`` (sandbox,
DAPO's overlong buffer, the LLM judge), ``custom_reward_function`` and verl >= 0.8's ``reward``
spelling of them. Defaults are those of the packaged ``ppo_trainer.yaml`` (a test keeps them
equal); what each key does is documented there and in docs/rewards.md."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from hybridrl.config.typed import refused
from hybridrl.data.config import ClassRefConfig

__all__ = [
    "SandboxConfig",
    "SandboxFusionConfig",
    "OverlongBufferConfig",
    "JudgeConfig",
    "CustomRewardFunctionConfig",
    "RewardConfig",
]


@dataclass
class SandboxConfig:
    """``reward_model.sandbox``: limits of the local code sandbox (seconds, MiB, processes)."""

    timeout_s: float = 10
    cpu_time_s: Optional[float] = None
    memory_limit_mb: int = 1024
    max_processes: int = 32
    max_file_size_mb: int = 16
    unsafe_no_isolation: bool = False


@dataclass
class SandboxFusionConfig:
    """``reward_model.sandbox_fusion``: a remote Sandbox Fusion ``run_code`` endpoint (null: local)."""

    url: Optional[str] = None
    max_concurrent: int = 64
    memory_limit_mb: int = 1024


@dataclass
class OverlongBufferConfig:
    """``reward_model.overlong_buffer``: DAPO's soft overlong punishment over the last ``len`` tokens
    ("DAPO: An Open-Source LLM Reinforcement Learning System at Scale", arXiv:2503.14476)."""

    enable: bool = False
    len: int = 0
    penalty_factor: float = 1.0
    log: bool = False


@dataclass
class ScoreParserConfig:
    """``reward_model.judge.score_parser``: a parsing function by file ``path`` and ``name``."""

    path: Optional[str] = None
    name: str = "parse_score"


@dataclass
class JudgeConfig:
    """``reward_model.judge``: the prompt an LLM judge sees and how its answer becomes a score.

    ``score_range`` [lo, hi] maps a number x to (x - lo) / (hi - lo); ``timeout_s`` in seconds per
    batched judge call.
    """

    prompt_template: Optional[str] = None
    system_prompt: Optional[str] = None
    apply_chat_template: bool = True
    response_prefix: str = ""
    score_pattern: Optional[str] = None
    score_range: List[float] = field(default_factory=lambda: [0, 10])
    score_parser: ScoreParserConfig = field(default_factory=ScoreParserConfig)
    timeout_s: float = 600


@dataclass
class CustomRewardFunctionConfig:
    """``custom_reward_function``: ``compute_score``-style function ``name`` in the file ``path``,
    called with ``reward_kwargs`` as extra keyword arguments."""

    path: Optional[str] = None
    name: str = "compute_score"
    reward_kwargs: Dict[str, Any] = field(default_factory=dict)


# ---------------------------------------------------------------- verl >= 0.8's `reward` section
# Every key defaults to null ("not given"): hybridrl.config.reward_spelling copies each set one to
# the key hybridrl reads.


@dataclass
class SpelledRewardFunctionConfig:
    path: Optional[str] = None
    name: Optional[str] = None
    reward_kwargs: Dict[str, Any] = field(default_factory=dict)


@dataclass
class SpelledRewardManagerConfig:
    source: str = "register"
    name: Optional[str] = None
    module: ClassRefConfig = refused(
        factory=ClassRefConfig,
        subkeys={
            "path": (
                "a reward manager class loaded from a file (register yours with @register_reward_manager in a module "
                "named by actor_rollout_ref.model.external_lib)"
            )
        },
    )


@dataclass
class SpelledJudgeRolloutConfig:
    name: Optional[str] = None
    dtype: Optional[str] = None
    prompt_length: Optional[int] = None
    response_length: Optional[int] = None
    do_sample: Optional[bool] = None
    temperature: Optional[float] = None
    top_k: Optional[int] = None
    top_p: Optional[float] = None
    tensor_model_parallel_size: Optional[int] = None
    gpu_memory_utilization: Optional[float] = None


@dataclass
class SpelledRewardModelConfig:
    enable: Optional[bool] = None
    model_path: Optional[str] = None
    rollout: SpelledJudgeRolloutConfig = field(default_factory=SpelledJudgeRolloutConfig)


@dataclass
class SpelledSandboxFusionConfig:
    url: Optional[str] = None
    max_concurrent: Optional[int] = None
    memory_limit_mb: Optional[int] = None


@dataclass
class RewardConfig:
    """``reward``: verl >= 0.8's spelling of the reward settings (hybridrl/config/reward_spelling.py)."""

    num_workers: Optional[int] = None
    custom_reward_function: SpelledRewardFunctionConfig = field(default_factory=SpelledRewardFunctionConfig)
    reward_manager: SpelledRewardManagerConfig = field(default_factory=SpelledRewardManagerConfig)
    reward_kwargs: Dict[str, Any] = field(default_factory=dict)
    reward_model: SpelledRewardModelConfig = field(default_factory=SpelledRewardModelConfig)
    sandbox_fusion: SpelledSandboxFusionConfig = field(default_factory=SpelledSandboxFusionConfig)
