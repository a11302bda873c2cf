"""Clipped value (critic) loss for PPO."""

from typing import Optional, Tuple

import torch

from .errors import AlgorithmConfigError
from .functional import Number, agg_loss, clip_by_value, masked_mean


def compute_value_loss(
    vpreds: torch.Tensor,
    returns: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange_value: float,
    loss_agg_mode: str = "token-mean",
    dp_size: int = 1,
    batch_num_tokens: Optional[Number] = None,
    global_batch_size: Optional[Number] = None,
    loss_scale_factor: Optional[Number] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """PPO clipped value loss.

    Source: "Proximal Policy Optimization Algorithms", arXiv 1707.06347 (value clipping as in
    the OpenAI baselines implementation)::

        v_clip = clip(vpreds, values - cliprange_value, values + cliprange_value)
        loss   = 0.5 * agg(max((vpreds - returns)^2, (v_clip - returns)^2))

    Args:
        vpreds: ``(bs, response_length)`` current critic predictions (carry the gradient).
        returns: ``(bs, response_length)`` regression targets (e.g. GAE returns).
        values: ``(bs, response_length)`` critic values at rollout time (the clip centre).
        response_mask: ``(bs, response_length)``.
        cliprange_value: half-width of the clip interval, >= 0.
        loss_agg_mode, dp_size, batch_num_tokens, global_batch_size, loss_scale_factor: see ``agg_loss``.

    Returns:
        ``(vf_loss, vf_clipfrac)``: scalar loss with gradient, and a detached 0-d tensor with
        the fraction of valid tokens where the clipped term is the larger one.

    Raises:
        AlgorithmConfigError: negative ``cliprange_value``.
    """
    if cliprange_value < 0:
        raise AlgorithmConfigError(f"critic.cliprange_value={cliprange_value} is negative; use a value >= 0 (e.g. 0.5)")
    vpred_clipped = clip_by_value(vpreds, values - cliprange_value, values + cliprange_value)
    losses_unclipped = (vpreds - returns) ** 2
    losses_clipped = (vpred_clipped - returns) ** 2
    losses = torch.maximum(losses_unclipped, losses_clipped)
    vf_loss = 0.5 * agg_loss(
        losses, response_mask, loss_agg_mode, dp_size, batch_num_tokens, global_batch_size, loss_scale_factor
    )
    vf_clipfrac = masked_mean(torch.gt(losses_clipped, losses_unclipped).float(), response_mask)
    return vf_loss, vf_clipfrac.detach()
