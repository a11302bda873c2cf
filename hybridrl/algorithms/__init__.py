"""Pure torch RL algorithms: advantages, policy/value losses, KL penalties, masked statistics.

No I/O and no config objects here: the driver and the workers pass plain values.
"""

from .advantages import (
    ADV_ESTIMATOR_REGISTRY,
    compute_gae_advantage_return,
    compute_grpo_outcome_advantage,
    get_adv_estimator_fn,
    register_adv_est,
)
from .errors import AlgorithmConfigError, AlgorithmInputError, UnknownAlgorithmError
from .functional import (
    clip_by_value,
    entropy_from_logits,
    logprobs_from_logits,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
)
from .kl import (
    KL_PENALTY_REGISTRY,
    AdaptiveKLController,
    FixedKLController,
    apply_kl_penalty,
    get_kl_controller,
    kl_penalty,
    register_kl_penalty,
)
from .policy_loss import (
    LOSS_AGG_MODES,
    POLICY_LOSS_REGISTRY,
    PolicyLossConfig,
    agg_loss,
    compute_policy_loss_vanilla,
    get_policy_loss_fn,
    register_policy_loss,
)
from .value_loss import compute_value_loss

__all__ = [
    "ADV_ESTIMATOR_REGISTRY", "register_adv_est", "get_adv_estimator_fn",
    "compute_gae_advantage_return", "compute_grpo_outcome_advantage",
    "UnknownAlgorithmError", "AlgorithmConfigError", "AlgorithmInputError",
    "masked_sum", "masked_mean", "masked_var", "masked_whiten",
    "logprobs_from_logits", "entropy_from_logits", "clip_by_value",
    "KL_PENALTY_REGISTRY", "register_kl_penalty", "kl_penalty",
    "FixedKLController", "AdaptiveKLController", "get_kl_controller", "apply_kl_penalty",
    "POLICY_LOSS_REGISTRY", "register_policy_loss", "get_policy_loss_fn", "PolicyLossConfig",
    "LOSS_AGG_MODES", "agg_loss", "compute_policy_loss_vanilla",
    "compute_value_loss",
]
