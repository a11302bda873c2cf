"""Advantage estimators and their registry.

The driver calls every estimator the same way, with keyword arguments::

    fn = get_adv_estimator_fn(config.algorithm.adv_estimator)
    advantages, returns = fn(token_level_rewards=..., response_mask=..., values=..., index=...,
                             reward_baselines=..., gamma=..., lam=...,
                             norm_adv_by_std_in_grpo=..., gdpo_reward_keys=...,
                             gdpo_reward_weights=..., config=...)

Each estimator takes the arguments it needs and swallows the rest through ``**kwargs``, so a
new estimator only has to be registered with :func:`register_adv_est`. All of them return
``(advantages, returns)`` of shape ``(bs, response_length)``, zero on masked positions, computed
under ``torch.no_grad``. The built-in estimators take plain values (the driver reads them from
the typed ``algorithm`` section); ``config`` is that section, an
:class:`~hybridrl.algorithms.config.AlgoConfig`, passed for estimators written for verl, which
read their knobs from it by attribute.

The registry and the shared checks are in :mod:`.base`; the estimators register themselves in
:mod:`.token_level` (GAE, REINFORCE++, ReMax), :mod:`.group` (GRPO, RLOO, OPO, GPG, Pass@k,
REINFORCE++-baseline), :mod:`.gdpo` and :mod:`.token_baseline`, each imported here.
"""

from . import gdpo, group, token_baseline, token_level  # noqa: F401  (each registers its estimators)
from .base import (
    ADV_ESTIMATOR_NEEDS_GROUP,
    ADV_ESTIMATOR_REGISTRY,
    ADV_ESTIMATORS,
    estimator_needs,
    get_adv_estimator_fn,
    register_adv_est,
)
from .gdpo import compute_gdpo_outcome_advantage
from .group import (
    GroupStats,
    compute_gpg_outcome_advantage,
    compute_group_stats,
    compute_grpo_outcome_advantage,
    compute_grpo_passk_outcome_advantage,
    compute_grpo_vectorized_outcome_advantage,
    compute_opo_outcome_advantage,
    compute_reinforce_plus_plus_baseline_outcome_advantage,
    compute_rloo_outcome_advantage,
    compute_rloo_vectorized_outcome_advantage,
)
from .token_baseline import compute_optimal_token_baseline_advantage
from .token_level import (
    compute_gae_advantage_return,
    compute_reinforce_plus_plus_outcome_advantage,
    compute_remax_outcome_advantage,
)

__all__ = [
    "ADV_ESTIMATORS",
    "ADV_ESTIMATOR_REGISTRY",
    "ADV_ESTIMATOR_NEEDS_GROUP",
    "register_adv_est",
    "estimator_needs",
    "get_adv_estimator_fn",
    "GroupStats",
    "compute_group_stats",
    "compute_gae_advantage_return",
    "compute_reinforce_plus_plus_outcome_advantage",
    "compute_remax_outcome_advantage",
    "compute_grpo_outcome_advantage",
    "compute_grpo_vectorized_outcome_advantage",
    "compute_grpo_passk_outcome_advantage",
    "compute_rloo_outcome_advantage",
    "compute_rloo_vectorized_outcome_advantage",
    "compute_opo_outcome_advantage",
    "compute_gpg_outcome_advantage",
    "compute_reinforce_plus_plus_baseline_outcome_advantage",
    "compute_gdpo_outcome_advantage",
    "compute_optimal_token_baseline_advantage",
]
