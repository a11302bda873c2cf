"""Pure torch RL algorithms: advantages, policy/value losses, KL penalties, masked statistics.

No I/O and no config objects here: the driver and the workers pass plain values.
"""

from .advantages import (
    ADV_ESTIMATOR_NEEDS_GROUP,
    ADV_ESTIMATOR_REGISTRY,
   
    GroupStats,
    compute_gae_advantage_return,
    compute_gpg_outcome_advantage,
    compute_group_stats,
    compute_grpo_outcome_advantage,
    compute_grpo_passk_outcome_advantage,
    compute_grpo_vectorized_outcome_advantage,
    compute_opo_outcome_advantage,
    compute_reinforce_plus_plus_baseline_outcome_advantage,
    compute_reinforce_plus_plus_outcome_advantage,
    compute_remax_outcome_advantage,
    compute_rloo_outcome_advantage,
    compute_rloo_vectorized_outcome_advantage,
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
    POLICY_LOSS_KEYS,
    POLICY_LOSS_REGISTRY,
    PolicyLossConfig,
    agg_loss,
    compute_policy_loss_bypass_mode,
    compute_policy_loss_cispo,
    compute_policy_loss_clip_cov,
    compute_policy_loss_dppo_kl,
    compute_policy_loss_dppo_tv,
    compute_policy_loss_dro,
    compute_policy_loss_geo_mean,
    compute_policy_loss_gpg,
    compute_policy_loss_gspo,
    compute_policy_loss_kl_cov,
    compute_policy_loss_reinforce,
    compute_policy_loss_sapo,
    compute_policy_loss_vanilla,
    get_policy_loss_fn,
    register_policy_loss,
)
from .rollout_corr import (
    compute_offpolicy_metrics,
    compute_rollout_correction_and_rejection_mask,
    compute_rollout_correction_weights,
    compute_rollout_rejection_mask,
)
from .value_loss import compute_value_loss

__all__ = [
    "ADV_ESTIMATOR_REGISTRY", "ADV_ESTIMATOR_NEEDS_GROUP",
    "register_adv_est", "get_adv_estimator_fn", "GroupStats", "compute_group_stats",
    "compute_gae_advantage_return", "compute_grpo_outcome_advantage",
    "compute_grpo_passk_outcome_advantage", "compute_rloo_outcome_advantage",
    "compute_reinforce_plus_plus_outcome_advantage",
    "compute_reinforce_plus_plus_baseline_outcome_advantage",
    "compute_remax_outcome_advantage", "compute_opo_outcome_advantage",
    "compute_gpg_outcome_advantage", "compute_grpo_vectorized_outcome_advantage",
    "compute_rloo_vectorized_outcome_advantage",
    "UnknownAlgorithmError", "AlgorithmConfigError", "AlgorithmInputError",
    "masked_sum", "masked_mean", "masked_var", "masked_whiten",
    "logprobs_from_logits", "entropy_from_logits", "clip_by_value",
    "KL_PENALTY_REGISTRY", "register_kl_penalty", "kl_penalty",
    "FixedKLController", "AdaptiveKLController", "get_kl_controller", "apply_kl_penalty",
    "POLICY_LOSS_REGISTRY", "register_policy_loss", "get_policy_loss_fn", "PolicyLossConfig",
    "LOSS_AGG_MODES", "POLICY_LOSS_KEYS", "agg_loss", "compute_policy_loss_vanilla",
    "compute_policy_loss_gspo", "compute_policy_loss_gpg", "compute_policy_loss_clip_cov",
    "compute_policy_loss_kl_cov", "compute_policy_loss_geo_mean", "compute_policy_loss_cispo",
    "compute_policy_loss_sapo", "compute_policy_loss_dppo_tv", "compute_policy_loss_dppo_kl",
    "compute_policy_loss_dro", "compute_policy_loss_bypass_mode", "compute_policy_loss_reinforce",
    "compute_rollout_correction_weights", "compute_rollout_rejection_mask",
    "compute_rollout_correction_and_rejection_mask", "compute_offpolicy_metrics",
    "compute_value_loss",
]
