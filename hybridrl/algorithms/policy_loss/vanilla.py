"""PPO's clipped surrogate loss, ``vanilla`` (with clip-higher and dual-clip)."""

from typing import Optional

import torch

from ..functional import Number, agg_loss, masked_mean
from .base import (
    LossOutput,
    apply_rollout_is_weights,
    clipped_surrogate,
    loss_config,
    pg_metrics,
    register_policy_loss,
    token_log_ratio,
)
from .config import PolicyLossParams


@register_policy_loss("vanilla")
def compute_policy_loss_vanilla(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Optional[PolicyLossParams] = None,
    rollout_is_weights: Optional[torch.Tensor] = None,
    dp_size: int = 1,
    batch_num_tokens: Optional[Number] = None,
    global_batch_size: Optional[Number] = None,
    loss_scale_factor: Optional[Number] = None,
) -> LossOutput:
    """PPO clipped surrogate loss with clip-higher and dual-clip (``policy_loss.loss_mode=vanilla``).

    Sources: PPO, "Proximal Policy Optimization Algorithms", arXiv 1707.06347; asymmetric
    clip-higher from DAPO, arXiv 2503.14476; dual-clip from "Mastering Complex Control in MOBA
    Games with Deep Reinforcement Learning", arXiv 1912.09729.

    With ``r = exp(clamp(log_prob - old_log_prob, -20, 20))`` and advantage ``A``::

        L_clip = max(-A * r, -A * clamp(r, 1 - clip_ratio_low, 1 + clip_ratio_high))
        L      = min(L_clip, -A * clip_ratio_c)   if A < 0   (dual clip bounds the loss)
               = L_clip                          otherwise

    then aggregated with :func:`agg_loss`. The default choice for PPO, GRPO, DAPO.

    Args:
        old_log_prob, log_prob, advantages, response_mask: ``(bs, response_length)``;
            log-probs in nats, ``log_prob`` carries the gradient.
        loss_agg_mode, dp_size, batch_num_tokens, global_batch_size, loss_scale_factor: see :func:`agg_loss`.
        config: clip ratios; ``None`` uses ``PolicyLossParams()``.
        rollout_is_weights: ``(bs, response_length)`` rollout-correction weights, or None.

    Returns:
        ``(pg_loss, metrics)``: scalar loss; ``actor/pg_clipfrac`` (fraction of valid tokens
        where the ratio clip is active), ``actor/pg_clipfrac_lower`` (where the dual clip is
        active), ``actor/ppo_kl`` (masked mean of the clamped ``old_log_prob - log_prob``).
    """
    cfg = loss_config(config)
    log_ratio = token_log_ratio(log_prob, old_log_prob)
    clip_losses, clipped = clipped_surrogate(torch.exp(log_ratio), advantages, cfg)
    clipfrac = masked_mean(clipped.float(), response_mask)

    losses_dual = -advantages * cfg.clip_ratio_c
    negative = advantages < 0
    clipfrac_lower = masked_mean((torch.gt(clip_losses, losses_dual) & negative).float(), response_mask)
    pg_losses = torch.where(negative, torch.minimum(clip_losses, losses_dual), clip_losses)

    pg_losses = apply_rollout_is_weights(pg_losses, rollout_is_weights)
    pg_loss = agg_loss(
        pg_losses, response_mask, loss_agg_mode, dp_size, batch_num_tokens, global_batch_size, loss_scale_factor
    )
    return pg_loss, pg_metrics(clipfrac, clipfrac_lower, masked_mean(-log_ratio, response_mask))
