"""The ``critic`` section of the PPO config, typed (verl's ``CriticConfig``); used when
``algorithm.adv_estimator=gae``. Defaults are the packaged ``ppo_trainer.yaml``'s: most batch
settings follow the actor's."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from hybridrl.config.rules import at_least, one_of, positive
from hybridrl.config.typed import ignored, same_as

from .actor import FSDP_EITHER, IN_ORDER, STRATEGIES, check_optim_lr, check_sequence_parallel_size
from .fsdp import CheckpointConfig, OptimConfig
from .model import CriticModelConfig
from .profiler import ProfilerConfig, check_profiler

__all__ = ["CriticConfig"]

ACTOR = "${actor_rollout_ref.actor."


@dataclass
class CriticConfig:
    """``critic``: the value model's update. ``cliprange_value`` clips the value change per update
    (PPO's value clipping); batch sizes and token budgets count as the actor's do."""

    rollout_n: int = "${actor_rollout_ref.rollout.n}"
    nccl_timeout: float = 600  # as actor_rollout_ref.nccl_timeout
    strategy: str = ignored("fsdp", FSDP_EITHER)
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-5, min_lr_ratio=None))
    model: CriticModelConfig = field(default_factory=CriticModelConfig)
    ppo_mini_batch_size: int = same_as(ACTOR + "ppo_mini_batch_size}")
    ppo_micro_batch_size: Optional[int] = None
    ppo_micro_batch_size_per_gpu: Optional[int] = None
    forward_micro_batch_size: Optional[int] = "${critic.ppo_micro_batch_size}"
    forward_micro_batch_size_per_gpu: Optional[int] = "${critic.ppo_micro_batch_size_per_gpu}"
    use_dynamic_bsz: bool = same_as(ACTOR + "use_dynamic_bsz}")
    ppo_max_token_len_per_gpu: int = 32768
    forward_max_token_len_per_gpu: int = "${critic.ppo_max_token_len_per_gpu}"
    ulysses_sequence_parallel_size: int = 1
    ppo_epochs: int = same_as(ACTOR + "ppo_epochs}")
    shuffle: bool = ignored(ACTOR + "shuffle}", IN_ORDER)
    grad_clip: float = 1.0
    cliprange_value: float = 0.5
    loss_agg_mode: str = same_as(ACTOR + "loss_agg_mode}")
    loss_scale_factor: Optional[float] = same_as(ACTOR + "loss_scale_factor}")
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    profiler: ProfilerConfig = field(default_factory=ProfilerConfig)

    def __post_init__(self):
        check_sequence_parallel_size(self.ulysses_sequence_parallel_size, "critic.ulysses_sequence_parallel_size")
        check_profiler("critic.profiler", self.profiler)

    def validate(self) -> None:
        """The critic's own rules, checked when it trains (called as ``CriticConfig.validate(section)``
        on the run's typed section, a structured DictConfig) (``algorithm.adv_estimator`` needs values:
        GAE); with another estimator its keys mean nothing. ``loss_agg_mode`` is checked against
        the registered modes by the start-up check.

        Raises:
            ConfigError: ``ppo_epochs`` < 1, ``cliprange_value`` or ``optim.lr`` not > 0, an unknown
                ``strategy``, or a LoRA key out of range (one line naming the key).
        """
        one_of("critic.strategy", self.strategy, STRATEGIES)
        at_least("critic.ppo_epochs", self.ppo_epochs, 1)
        if self.cliprange_value is not None:
            positive("critic.cliprange_value", self.cliprange_value, "0.5 is usual")
        check_optim_lr("critic", self.optim.lr)
        CriticModelConfig.validate(self.model)
