"""The ``actor_rollout_ref`` section of the PPO config, typed (verl's ``ActorConfig``,
``RefConfig``, ``PolicyLossConfig``). Defaults are the packaged ``ppo_trainer.yaml``'s; what each
key does is documented there and in docs/algorithms.md.

The policy loss's keys are the algorithms' classes (their fields and rules defined once, there):
the ``actor.policy_loss`` section is :class:`hybridrl.algorithms.policy_loss.PolicyLossConfig`,
re-exported here, and :class:`ActorConfig` extends
:class:`~hybridrl.algorithms.policy_loss.ActorLossKnobs` (``clip_ratio*``, ``tau_pos`` / ``tau_neg``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from hybridrl.algorithms.policy_loss.config import ActorLossKnobs, PolicyLossConfig
from hybridrl.config.rules import at_least, number_above, one_of
from hybridrl.config.typed import ignored, same_as
from hybridrl.errors import ConfigError

from .fsdp import CheckpointConfig, OptimConfig, RefFSDPConfig, TrainingFSDPConfig
from .model import PolicyModelConfig
from .profiler import ProfilerConfig, check_profiler
from .rollout import RolloutConfig

FSDP_EITHER = "fsdp and fsdp2 both mean FSDP2 (fully_shard) here"
IN_ORDER = "mini batches are taken in batch order"

__all__ = ["PolicyLossConfig", "ActorConfig", "RefConfig", "ActorRolloutRefConfig"]

ACTOR = "${actor_rollout_ref.actor."  # the reference follows these actor keys
STRATEGIES = ("fsdp", "fsdp2")


def check_optim_lr(prefix: str, lr) -> None:
    """``<prefix>.optim.lr`` is a number > 0.

    Raises:
        ConfigError: one line naming the key.
    """
    if not number_above(lr, 0):
        raise ConfigError(f"{prefix}.optim.lr={lr!r} must be a number > 0 (1e-6 is usual for full fine-tuning)")


def check_sequence_parallel_size(value, key: str) -> None:
    """``ulysses_sequence_parallel_size`` is a whole number >= 1 (an interpolation not yet
    resolved is left to the typed config).

    Raises:
        ConfigError: one line naming ``key``.
    """
    if isinstance(value, int) and value < 1:
        raise ConfigError(
            f"{key}={value} must be >= 1 (1: no sequence parallelism; S > 1: each packed "
            "sequence is split over S workers, docs/distributed.md)"
        )


@dataclass
class ActorConfig(ActorLossKnobs):
    """``actor_rollout_ref.actor``: the PPO update of the policy.

    Batch sizes count prompts (``ppo_mini_batch_size``) or responses on one worker (micro batches);
    token budgets count valid tokens on one worker. The loss keys ``clip_ratio``,
    ``clip_ratio_low`` / ``clip_ratio_high``, ``clip_ratio_c`` and ``tau_pos`` / ``tau_neg``, with
    their rules, come from :class:`~hybridrl.algorithms.policy_loss.ActorLossKnobs`.

    Raises:
        ConfigError: a rule of this section (one line naming the key).
        AlgorithmConfigError: a rule of the loss keys (:class:`ActorLossKnobs`).
    """

    strategy: str = ignored("fsdp", FSDP_EITHER)
    ppo_mini_batch_size: int = 256
    ppo_micro_batch_size: Optional[int] = None
    ppo_micro_batch_size_per_gpu: Optional[int] = None
    use_dynamic_bsz: bool = False
    ppo_max_token_len_per_gpu: int = 16384
    grad_clip: float = 1.0
    policy_loss: PolicyLossConfig = field(default_factory=PolicyLossConfig)
    calculate_sum_pi_squared: bool = False
    loss_agg_mode: str = "token-mean"
    loss_scale_factor: Optional[float] = None
    entropy_coeff: float = 0
    use_kl_loss: bool = False
    use_torch_compile: bool = True  # log-prob/entropy kernels compiled on CUDA (logit_stat_fns); eager on CPU
    kl_loss_coef: float = 0.001
    kl_loss_type: str = "low_var_kl"
    ppo_epochs: int = 1
    skip_on_policy_old_log_prob: bool = True
    shuffle: bool = ignored(False, IN_ORDER)
    ulysses_sequence_parallel_size: int = 1
    entropy_from_logits_with_chunking: bool = False
    entropy_checkpointing: bool = False
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    fsdp_config: TrainingFSDPConfig = field(default_factory=TrainingFSDPConfig)
    profiler: ProfilerConfig = field(default_factory=ProfilerConfig)

    def __post_init__(self):
        key = "actor_rollout_ref.actor"
        check_profiler(f"{key}.profiler", self.profiler)
        check_sequence_parallel_size(self.ulysses_sequence_parallel_size, f"{key}.ulysses_sequence_parallel_size")
        one_of(f"{key}.strategy", self.strategy, STRATEGIES)
        at_least(f"{key}.ppo_epochs", self.ppo_epochs, 1)
        at_least(f"{key}.ppo_mini_batch_size", self.ppo_mini_batch_size, 1)
        super().__post_init__()  # the loss keys' rules
        check_optim_lr(key, self.optim.lr)


@dataclass
class RefConfig:
    """``actor_rollout_ref.ref``: the reference policy's log-prob passes (the actor's settings by default)."""

    strategy: str = ignored(ACTOR + "strategy}", FSDP_EITHER)
    fsdp_config: RefFSDPConfig = field(default_factory=RefFSDPConfig)
    use_torch_compile: bool = same_as(ACTOR + "use_torch_compile}")
    log_prob_micro_batch_size: Optional[int] = None
    log_prob_micro_batch_size_per_gpu: Optional[int] = None
    log_prob_use_dynamic_bsz: bool = same_as(ACTOR + "use_dynamic_bsz}")
    log_prob_max_token_len_per_gpu: int = same_as(ACTOR + "ppo_max_token_len_per_gpu}")
    ulysses_sequence_parallel_size: int = same_as(ACTOR + "ulysses_sequence_parallel_size}")
    entropy_from_logits_with_chunking: bool = False
    entropy_checkpointing: bool = False
    profiler: ProfilerConfig = field(default_factory=ProfilerConfig)

    def __post_init__(self):
        check_sequence_parallel_size(
            self.ulysses_sequence_parallel_size, "actor_rollout_ref.ref.ulysses_sequence_parallel_size"
        )
        check_profiler("actor_rollout_ref.ref.profiler", self.profiler)


@dataclass
class ActorRolloutRefConfig:
    """``actor_rollout_ref``: the policy model and its three uses (update, generation, reference)."""

    hybrid_engine: bool = ignored(True, "actor and rollout always share one worker here")
    nccl_timeout: float = 600  # the workers' process-group timeout, seconds (:func:`process_group_timeout`)
    model: PolicyModelConfig = field(default_factory=PolicyModelConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    ref: RefConfig = field(default_factory=RefConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
