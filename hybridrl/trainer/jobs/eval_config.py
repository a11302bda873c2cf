"""The ``evaluation`` config of ``hybridrl eval``, typed.

Built once at start-up from the composed ``hybridrl/config/evaluation.yaml`` with
:func:`eval_config` (``hybridrl.config.typed.to_dataclass``: a key without a field, or a value of
the wrong type, is one line). Defaults equal the YAML (a test keeps them equal, key for key);
rules on one section live in its ``__post_init__``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Optional

from hybridrl.config.typed import to_dataclass
from hybridrl.errors import ConfigError
from hybridrl.rewards.config import CustomRewardFunctionConfig

__all__ = ["EvalConfig", "EvalDataConfig", "EvalMetricsConfig", "eval_config"]


@dataclass
class EvalDataConfig:
    """``data``: the parquet written by ``hybridrl generate`` and the columns to read."""

    path: Any = "~/data/generation/responses.parquet"
    prompt_key: str = "prompt"  # unused: kept so verl command lines run
    response_key: str = "responses"
    data_source_key: str = "data_source"
    reward_model_key: str = "reward_model"


@dataclass
class EvalMetricsConfig:
    """``metrics``: pass@k's ``k`` values (null: 1, 2, 4, ..., N), what counts as correct, and the
    bootstrap of the confidence intervals."""

    pass_k: Optional[List[int]] = None
    pass_threshold: float = 1.0
    bootstrap_samples: int = 1000
    confidence: float = 0.95
    seed: int = 0

    def __post_init__(self):
        if self.pass_k is not None and not all(k >= 1 for k in self.pass_k):
            raise ConfigError(
                f"metrics.pass_k={self.pass_k!r} must be null or a list of whole numbers >= 1, e.g. '[1,8]'"
            )
        if self.bootstrap_samples < 1:
            raise ConfigError("metrics.bootstrap_samples must be >= 1")
        if not 0.0 < self.confidence < 1.0:
            raise ConfigError(f"metrics.confidence={self.confidence} must be between 0 and 1, e.g. 0.95")


@dataclass
class EvalConfig:
    """The whole ``evaluation`` config (``hybridrl/config/evaluation.yaml``)."""

    data: EvalDataConfig = field(default_factory=EvalDataConfig)
    custom_reward_function: CustomRewardFunctionConfig = field(default_factory=CustomRewardFunctionConfig)
    metrics: EvalMetricsConfig = field(default_factory=EvalMetricsConfig)
    output_path: Optional[str] = None


def eval_config(config) -> EvalConfig:
    """The composed ``evaluation`` config, typed.

    Raises:
        ConfigError: a key without a field, a value of the wrong type, or a broken rule (one line
            naming the key, the value and what to change).
    """
    return to_dataclass(EvalConfig, config, "")
