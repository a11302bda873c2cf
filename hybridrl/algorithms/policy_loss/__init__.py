"""Policy-gradient losses, selected by ``actor_rollout_ref.actor.policy_loss.loss_mode`` (verl's
names). The registry is in :mod:`.base`, their config in :mod:`.config`: :class:`PolicyLossConfig`
is the ``actor_rollout_ref.actor.policy_loss`` section (verl's class of that name),
:class:`ActorLossKnobs` the loss keys of the actor section itself, and :class:`PolicyLossParams`
both together, what a loss reads as ``config=``. The losses register themselves in
:mod:`.vanilla` (PPO), :mod:`.variants` (``gspo``, ``gpg``, ``clip_cov``, ``kl_cov``,
``geo_mean``, ``cispo``), :mod:`.trust_region` (``sapo``, ``dppo_tv``, ``dppo_kl``, ``dro``) and
:mod:`.bypass` (rollout correction's bypass mode), each imported here.

A policy loss is called as::

    fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean",
       config=PolicyLossParams(...), rollout_is_weights=None, dp_size=1, batch_num_tokens=None,
       global_batch_size=None, loss_scale_factor=None)
    -> (pg_loss, metrics)

``rollout_is_weights`` ``(bs, response_length)`` are rollout correction's importance weights
(:mod:`.rollout_corr`): every loss multiplies its per-token losses by them before aggregating.

``pg_loss`` is a scalar tensor with gradient; ``metrics`` maps ``actor/pg_clipfrac``,
``actor/pg_clipfrac_lower`` and ``actor/ppo_kl`` (plus loss-specific keys) to python floats.
"""

from ..functional import LOSS_AGG_MODES, agg_loss
from . import bypass, trust_region, vanilla, variants  # noqa: F401  (each registers its losses)
from .base import (
    POLICY_LOSS_REGISTRY,
    POLICY_LOSSES,
    apply_rollout_is_weights,
    get_policy_loss_fn,
    register_policy_loss,
)
from .bypass import compute_policy_loss_bypass_mode, compute_policy_loss_reinforce
from .config import POLICY_LOSS_KEYS, ActorLossKnobs, PolicyLossConfig, PolicyLossParams
from .trust_region import (
    compute_policy_loss_dppo_kl,
    compute_policy_loss_dppo_tv,
    compute_policy_loss_dro,
    compute_policy_loss_sapo,
)
from .vanilla import compute_policy_loss_vanilla
from .variants import (
    compute_policy_loss_cispo,
    compute_policy_loss_clip_cov,
    compute_policy_loss_geo_mean,
    compute_policy_loss_gpg,
    compute_policy_loss_gspo,
    compute_policy_loss_kl_cov,
)

__all__ = [
    "POLICY_LOSSES",
    "POLICY_LOSS_REGISTRY",
    "POLICY_LOSS_KEYS",
    "LOSS_AGG_MODES",
    "PolicyLossConfig",
    "ActorLossKnobs",
    "PolicyLossParams",
    "agg_loss",
    "apply_rollout_is_weights",
    "get_policy_loss_fn",
    "register_policy_loss",
    "compute_policy_loss_vanilla",
    "compute_policy_loss_gspo",
    "compute_policy_loss_gpg",
    "compute_policy_loss_clip_cov",
    "compute_policy_loss_kl_cov",
    "compute_policy_loss_geo_mean",
    "compute_policy_loss_cispo",
    "compute_policy_loss_sapo",
    "compute_policy_loss_dppo_tv",
    "compute_policy_loss_dppo_kl",
    "compute_policy_loss_dro",
    "compute_policy_loss_bypass_mode",
    "compute_policy_loss_reinforce",
]
